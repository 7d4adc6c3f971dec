//! Any text as /proc/cpuinfo (the power model's CPU identification and the
//! RAPL vendor check) and as a sysfs CPU list (`0-3,8`): no panic, and a
//! CPU list that parses is bounded.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wattprof::sources::estimate::CpuId;
use wattprof::sources::msr::detect_vendor;
use wattprof::topology::parse_cpu_list;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let _ = CpuId::parse(&text);
    let _ = detect_vendor(&text);
    if let Some(cpus) = parse_cpu_list(&text) {
        assert!(cpus.len() <= 1 << 16, "{} CPUs", cpus.len());
    }
});
