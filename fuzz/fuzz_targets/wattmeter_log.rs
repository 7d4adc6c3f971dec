//! Any bytes fed to the wattmeter log parser and integrator, line by line:
//! no panic, and the energy stays finite and non-negative.
#![no_main]

use libfuzzer_sys::fuzz_target;
use wattprof::sources::wattmeter::Integrator;

fuzz_target!(|data: &[u8]| {
    let Some((&socket, log)) = data.split_first() else {
        return;
    };
    let mut integrator = Integrator::new(u32::from(socket % 8) + 1);
    for line in log.split(|b| *b == b'\n') {
        integrator.line(&String::from_utf8_lossy(line));
    }
    let e = integrator.energy_j();
    assert!(e.is_finite() && e >= 0.0, "energy {e}");
    let s = integrator.stats();
    assert!(s.mean_power_w.is_finite() && s.mean_power_w >= 0.0);
});
