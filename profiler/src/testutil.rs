//! Fixture writers shared by the unit tests.

use std::path::Path;

/// Writes `text` to `root/rel`, creating directories.
pub(crate) fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
    std::fs::write(p, text).expect("write");
}

/// A sysfs CPU topology of `n` CPUs spread evenly over `packages`.
pub(crate) fn topology(root: &Path, n: u32, packages: u32) {
    write(
        root,
        "devices/system/cpu/possible",
        &format!("0-{}\n", n - 1),
    );
    write(root, "devices/system/cpu/online", &format!("0-{}\n", n - 1));
    for c in 0..n {
        write(
            root,
            &format!("devices/system/cpu/cpu{c}/topology/physical_package_id"),
            &format!("{}\n", c / (n / packages)),
        );
    }
}

/// One CPU on package 0, and a `power` PMU whose `energy-pkg` is really
/// the kernel's software `cpu-clock` event (type 1, config 0) scaled by
/// 1e-9: a real perf counter that counts one "joule" per second.
pub(crate) fn software_backed_power_pmu(root: &Path) {
    topology(root, 1, 1);
    let pmu = "bus/event_source/devices/power";
    write(root, &format!("{pmu}/type"), "1\n");
    write(root, &format!("{pmu}/cpumask"), "0\n");
    write(root, &format!("{pmu}/format/event"), "config:0-7\n");
    write(root, &format!("{pmu}/events/energy-pkg"), "event=0x00\n");
    write(root, &format!("{pmu}/events/energy-pkg.scale"), "1e-9\n");
    write(root, &format!("{pmu}/events/energy-pkg.unit"), "Joules\n");
}

/// A self-signed certificate for localhost (`c.pem`) and its key
/// (`k.pem`) in `dir`, made by the openssl command; false where there is
/// none (the caller skips).
pub(crate) fn self_signed(dir: &Path) -> bool {
    std::process::Command::new("openssl")
        .args(["req", "-x509", "-newkey", "ec", "-pkeyopt"])
        .args(["ec_paramgen_curve:prime256v1", "-nodes", "-days", "1"])
        .args(["-subj", "/CN=localhost", "-keyout"])
        .arg(dir.join("k.pem"))
        .arg("-out")
        .arg(dir.join("c.pem"))
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}
