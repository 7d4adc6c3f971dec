//! `wattprof calibrate` end to end: a RAPL fixture whose package power
//! follows the machine's real load (10 W idle + 15 W per busy CPU, from
//! /proc/stat), and a wattmeter log written alongside it by a known law,
//! wall = 1.35 × (package + DRAM) + 48 W, plus noise. Needs root (the
//! fixture's writer runs at real-time priority); `--test-threads=1`.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::Value;
use wattprof_tests::{
    FakeRapl, busy_jiffies, domain, f, memory_dir, require_ebpf, tempfile_dir, testload_bin,
    wattprof_bin, wattprof_run,
};

const A: f64 = 1.35;
const B: f64 = 48.0;

/// A powercap fixture following the load, and the wattmeter log of the
/// same power by the law; both stop when dropped.
struct Rig {
    sys: PathBuf,
    log: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Rig {
    fn start(noise_w: f64) -> Self {
        let sys = memory_dir().join("sys");
        let zones = [("intel-rapl:0", "package-0"), ("intel-rapl:0:0", "dram")];
        for (dir, name) in zones {
            let d = sys.join("class/powercap").join(dir);
            std::fs::create_dir_all(&d).expect("fixture");
            std::fs::write(d.join("name"), format!("{name}\n")).expect("name");
            std::fs::write(d.join("max_energy_range_uj"), "262143328850\n").expect("range");
            std::fs::write(d.join("energy_uj"), "0\n").expect("energy");
        }
        let log = sys.parent().expect("dir").join("wattmeter.log");
        let mut out = std::fs::File::create(&log).expect("log");
        writeln!(
            out,
            "#timestamp,#frame_is_ok,#U1,#U2,#U3,#current1,#activepow1"
        )
        .expect("hdr");
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, root) = (stop.clone(), sys.clone());
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let thread = std::thread::spawn(move || {
            let param = libc::sched_param { sched_priority: 10 };
            // SAFETY: this thread (0), a valid sched_param.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
            let (mut pkg_uj, mut dram_uj) = (0.0f64, 0.0f64);
            let mut last = std::time::Instant::now();
            let mut jiffies = busy_jiffies();
            let mut busy_cpus = 0.0;
            let mut frame = 0u64;
            let mut tick = 0u64;
            while !flag.load(Ordering::Relaxed) {
                // The counters advance every millisecond, as RAPL's do; the
                // load is sampled and a wattmeter frame written every 10.
                std::thread::sleep(std::time::Duration::from_millis(1));
                tick += 1;
                let now = std::time::Instant::now();
                let dt = now.duration_since(last).as_secs_f64();
                last = now;
                if tick.is_multiple_of(10) {
                    let j = busy_jiffies();
                    if j.1 > jiffies.1 {
                        busy_cpus = (j.0 - jiffies.0) as f64 / (j.1 - jiffies.1) as f64 * cpus;
                        jiffies = j;
                    }
                }
                let (pkg_w, dram_w) = (10.0 + 15.0 * busy_cpus, 2.0 + 0.5 * busy_cpus);
                pkg_uj += pkg_w * dt * 1e6;
                dram_uj += dram_w * dt * 1e6;
                for (dir, uj) in [("intel-rapl:0", pkg_uj), ("intel-rapl:0:0", dram_uj)] {
                    let d = root.join("class/powercap").join(dir);
                    let tmp = d.join(".tmp");
                    if std::fs::write(&tmp, format!("{}\n", uj as u64)).is_ok() {
                        let _ = std::fs::rename(&tmp, d.join("energy_uj"));
                    }
                }
                if !tick.is_multiple_of(10) {
                    continue;
                }
                // Deterministic noise in [-1, 1].
                frame += 1;
                let x = (frame as f64 * 12.9898).sin() * 43_758.545_3;
                let noise = ((x - x.floor()) * 2.0 - 1.0) * noise_w;
                let wall = A * (pkg_w + dram_w) + B + noise;
                let ts = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .expect("time")
                    .as_secs_f64();
                let _ = writeln!(out, "{ts:.6},true,230.0,0.0,0.0,0.5,{wall:.3}");
            }
        });
        Self {
            sys,
            log,
            stop,
            thread: Some(thread),
        }
    }
}

impl Drop for Rig {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(dir) = self.sys.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn calibrate(extra: &[&str], log: &Path, sys: Option<&Path>, out: &Path) -> std::process::Output {
    let mut cmd = Command::new(wattprof_bin());
    cmd.args(["calibrate", "--no-gpu", "--wattmeter-log"])
        .arg(log)
        .arg("--output")
        .arg(out)
        .args(extra);
    if let Some(sys) = sys {
        cmd.arg(format!("--energy-sysfs={}", sys.display()));
    }
    cmd.output().expect("calibrate")
}

#[test]
fn a_known_wall_law_is_recovered_from_a_load_staircase() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        wattprof_tests::say_skip("the fixture's writer needs root (real-time priority)");
        return;
    }
    if wattprof_tests::saturated() {
        return;
    }
    let rig = Rig::start(1.0);
    let out = tempfile_dir().join("cal.json");
    let run = calibrate(&["--step", "4s"], &rig.log, Some(&rig.sys), &out);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert!(run.status.success(), "{stderr}");
    eprintln!("{stderr}{}", String::from_utf8_lossy(&run.stdout));
    let cal: Value =
        serde_json::from_slice(&std::fs::read(&out).expect("calibration")).expect("JSON");
    assert_eq!(cal["type"], "wattprof_calibration");
    assert_eq!(cal["regressor"], "counters_w");
    let (a, b) = (f(&cal, "/fit/a"), f(&cal, "/fit/b"));
    // The counters' watts the staircase spanned ("windows: x X, wall").
    let (lo, hi) = wattprof_tests::staircase_span(&stderr, "windows: x ", ",");
    // The rig's load figure and calibrate's differ by up to 1.3% of a CPU
    // per window (as in static_power.rs): 0.21 W of counters at 15.5 W per
    // CPU. Over the span of counter watts the steps reached, that moves a
    // by up to 2 x 0.21 W / span, and b, extrapolated `lo` W down, by
    // that x A x lo + A x 0.21 W. 1% at least; with a CPU kept busy beside
    // it the steps span 29 to 44 W, and the bounds widen to about 2.9%.
    let dx = 0.0133 * 15.5;
    let a_tol = (2.0 * dx / (hi - lo)).max(0.01);
    let b_tol = ((a_tol * A * lo + A * dx) / B).max(0.01);
    eprintln!(
        "fitted a = {a:.4} (law {A}), b = {b:.3} W (law {B}); counters {lo:.2} to {hi:.2} W: \
         allowed {:.2}% and {:.2}%",
        a_tol * 100.0,
        b_tol * 100.0
    );
    assert!((a / A - 1.0).abs() < a_tol, "a = {a}");
    assert!((b / B - 1.0).abs() < b_tol, "b = {b}");
    assert!(f(&cal, "/fit/rms_residual_w") < 2.0, "{}", cal["fit"]);
    // Every step is there: idle, then 1 .. N CPUs busy.
    let points = cal["points"].as_array().expect("points");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    for n in 0..=cpus {
        let step = format!("{n} CPUs busy");
        assert!(points.iter().any(|p| p["step"] == step.as_str()), "{step}");
    }
    let _ = std::fs::remove_dir_all(out.parent().expect("dir"));
}

#[test]
fn bad_wattmeter_logs_are_one_clear_line() {
    let dir = tempfile_dir();
    let out = dir.join("cal.json");
    // Missing file.
    let run = calibrate(&["--step", "400ms"], &dir.join("none.log"), None, &out);
    let err = String::from_utf8_lossy(&run.stderr);
    assert_ne!(run.status.code(), Some(0), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("none.log"), "{err}");
    // A log whose frames are all bad: no energy, and what to check.
    let log = dir.join("bad.log");
    let mut text = String::from("#timestamp,#frame_is_ok,#U1,#U2,#U3,#current1,#activepow1\n");
    for i in 0..50 {
        text.push_str(&format!("{}.0,false,,,,,\n", 1_700_000_000 + i));
    }
    std::fs::write(&log, text).expect("log");
    let run = calibrate(&["--step", "400ms"], &log, None, &out);
    let err = String::from_utf8_lossy(&run.stderr);
    let last = err.trim().lines().last().unwrap_or_default().to_string();
    assert_ne!(run.status.code(), Some(0), "{err}");
    assert!(last.contains("no energy during the staircase"), "{err}");
    assert!(last.contains("--wattmeter-outlet"), "{err}");
    assert!(!out.exists(), "nothing written on failure");
    // A wrong outlet: good frames, but the header has no #activepow3.
    let mut text = String::from("#timestamp,#frame_is_ok,#U1,#U2,#U3,#current1,#activepow1\n");
    for i in 0..50 {
        text.push_str(&format!("{}.0,true,230,0,0,0.5,100\n", 1_700_000_000 + i));
    }
    std::fs::write(&log, text).expect("log");
    let run = calibrate(
        &["--step", "400ms", "--wattmeter-outlet", "3"],
        &log,
        None,
        &out,
    );
    let err = String::from_utf8_lossy(&run.stderr);
    assert_ne!(run.status.code(), Some(0), "{err}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("no #activepow3 column"), "{err}");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn with_a_calibration_every_process_has_wall_energy_and_the_static_power_its_own_row() {
    require_ebpf!();
    let rapl = FakeRapl::start(40.0, 4.0);
    let dir = tempfile_dir();
    let cal = dir.join("node.json");
    std::fs::write(
        &cal,
        serde_json::json!({
            "type": "wattprof_calibration", "version": 1, "host": "test", "cpus": 2,
            "created_unix_ns": 0, "regressor": "counters_w",
            "fit": {"a": A, "b": B, "rms_residual_w": 0.5, "relative_residual": 0.005,
                    "r_squared": 0.999},
            "readers": [], "points": []
        })
        .to_string(),
    )
    .expect("calibration");
    let run = wattprof_run(
        &[
            &rapl.arg(),
            "--interval",
            "250ms",
            "--calibration",
            &cal.to_string_lossy(),
        ],
        &[&testload_bin().to_string_lossy(), "burn", "1", "1.0"],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    let wall = domain(report, "wall", None);
    assert_eq!(wall["basis"], "calibrated");
    assert_eq!(wall["estimated"], true);
    // wall = a × (package + DRAM) + b × time.
    let counters = f(domain(report, "package", Some(0)), "/measured_j")
        + f(domain(report, "dram", Some(0)), "/measured_j");
    let secs = f(report, "/wall_ns") / 1e9;
    let want = A * counters + B * secs;
    assert!(
        (f(wall, "/measured_j") / want - 1.0).abs() < 0.002,
        "{wall} vs {want}"
    );
    let sum = f(wall, "/attributed_j") + f(wall, "/idle_j") + f(wall, "/unattributed_j");
    assert!(
        (sum - f(wall, "/measured_j")).abs() < 1e-5,
        "not conserved: {wall}"
    );
    // The static power, its own figure, inside idle.
    assert!(
        (f(wall, "/static_j") / (B * secs) - 1.0).abs() < 0.002,
        "{wall}"
    );
    assert!(f(wall, "/idle_j") >= f(wall, "/static_j"));
    // Per process and group: a × its counter energy.
    let tree = &report["energy"]["groups"]["tree"];
    let (t_wall, t_total) = (f(tree, "/wall_j"), f(tree, "/total_j"));
    assert!(
        t_total > 0.0 && (t_wall / (A * t_total) - 1.0).abs() < 0.001,
        "{tree}"
    );
    for p in report["processes"].as_array().expect("processes") {
        let e = &p["energy"];
        let total = f(e, "/total_j");
        if total > 0.01 {
            assert!((f(e, "/wall_j") / (A * total) - 1.0).abs() < 0.001, "{p}");
        }
    }
    let table = run.stderr();
    assert!(
        table.contains("node static") && table.contains("calibration"),
        "{table}"
    );
    // A file that is not a calibration: one line, before anything runs.
    std::fs::write(&cal, "{}").expect("bad");
    let run = wattprof_run(&["--calibration", &cal.to_string_lossy()], &["true"]);
    assert_eq!(run.output.status.code(), Some(125), "{}", run.stderr());
    assert!(
        run.stderr().contains("not a wattprof calibration file"),
        "{}",
        run.stderr()
    );
    assert_eq!(run.stderr().trim().lines().count(), 1, "{}", run.stderr());
    let _ = std::fs::remove_dir_all(dir);
}
