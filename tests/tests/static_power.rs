//! Static and dynamic power end to end, with real eBPF, on a RAPL fixture
//! whose power follows the machine's load (`FakeRapl::following`): the
//! host model `wattprof calibrate` fits with no wattmeter, a program's
//! energy that does not depend on its neighbour, the 2:1 split, the
//! on-the-fly fit and the fallback. Each test has its own static power and
//! slope (not round numbers). Needs root; `--test-threads=1`.

use std::process::Command;

use serde_json::Value;
use wattprof_tests::{
    FakeRapl, PowerLaw, domain, f, read_json, require_ebpf, tempfile_dir, testload_bin, u,
    wattprof_bin, wattprof_run,
};

fn testload() -> String {
    testload_bin().to_string_lossy().into_owned()
}

/// The fixture's DRAM law (static W, W per busy CPU).
const DRAM: (f64, f64) = (1.37, 0.41);

fn rapl(package: (f64, f64)) -> FakeRapl {
    FakeRapl::following(
        PowerLaw {
            static_w: package.0,
            per_cpu_w: package.1,
        },
        PowerLaw {
            static_w: DRAM.0,
            per_cpu_w: DRAM.1,
        },
    )
}

/// A host power model for this machine with the fixture's laws.
fn host_model(dir: &std::path::Path, static_w: f64, per_cpu_w: f64) -> std::path::PathBuf {
    wattprof_tests::host_model_file(
        dir,
        PowerLaw {
            static_w,
            per_cpu_w,
        },
        PowerLaw {
            static_w: DRAM.0,
            per_cpu_w: DRAM.1,
        },
    )
}

/// Package energy per CPU-second of the process that ran `pid`'s burner.
fn j_per_cpu_s(report: &Value, pid: u64) -> f64 {
    let p = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| u(p, "/pid") == pid)
        .expect("the burner");
    f(p, "/energy/package_j") / (u(p, "/on_cpu_ns") as f64 / 1e9)
}

#[test]
fn calibrate_with_no_wattmeter_fits_each_domain_s_static_power_and_slope() {
    require_ebpf!();
    if wattprof_tests::saturated() {
        return;
    }
    let (s, k) = (17.3, 8.7);
    let fixture = rapl((s, k));
    let dir = tempfile_dir();
    let out = dir.join("model.json");
    // 4 s steps: each read in 0.75 s windows (/proc/stat's 10 ms ticks
    // are then 1.3% of a CPU per window, not the 2.7% of 2 s steps'
    // 0.375 s windows). With a CPU kept busy beside it the staircase
    // spans only 1.1 to 2 busy CPUs and the static figure is extrapolated
    // twice as far: at 2 s steps fresh-clone run 34 read 17.67 W for the
    // fixture's 17.3 (2.1%).
    let run = Command::new(wattprof_bin())
        .args(["calibrate", "--step", "4s", "-o"])
        .arg(&out)
        .arg(fixture.arg())
        .output()
        .expect("calibrate");
    let stdout = String::from_utf8_lossy(&run.stdout);
    eprintln!("{}{stdout}", String::from_utf8_lossy(&run.stderr));
    assert!(
        run.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let model = read_json(&out);
    assert_eq!(model["type"], "wattprof_power_model");
    let fit = |d: &str| {
        model["fits"]
            .as_array()
            .expect("fits")
            .iter()
            .find(|x| x["domain"] == d)
            .cloned()
            .unwrap_or_else(|| panic!("no {d} fit: {model}"))
    };
    // The busy CPUs the staircase spanned ("N windows: X busy CPUs", on
    // stderr).
    let said = format!("{}{stdout}", String::from_utf8_lossy(&run.stderr));
    let (lo, hi) = wattprof_tests::staircase_span(&said, "windows: ", " busy CPUs");
    for (d, s, k) in [("package", s, k), ("dram", DRAM.0, DRAM.1)] {
        let x = fit(d);
        let (fs, fk) = (f(&x, "/static_w"), f(&x, "/per_cpu_w"));
        // The fixture draws for /proc/stat's busy time over its own
        // windows and calibrate measures it over its 0.75 s ones: a step's
        // figure differed between them by up to 0.11 W, 1.3% of a CPU at
        // 8.7 W per CPU (fresh-clone run 59: 27.24 W at 1.13 CPUs for the
        // law's 27.13). Over a span of `hi - lo` CPUs that moves the slope
        // by up to 2 x 1.3% / span, and the static figure, extrapolated
        // `lo` CPUs down, by k x (1.3% + that x lo). 2% at least (a quiet
        // machine spans 0 to 2 CPUs); with a CPU kept busy beside it the
        // span is 1.1 to 2, and the bounds widen to about 2.4% and 3%.
        let tick = 0.0133;
        let slope_tol = (2.0 * tick / (hi - lo)).max(0.02);
        let static_tol = (k * (tick + slope_tol * lo) / s).max(0.02);
        eprintln!(
            "{d}: fitted {fs:.3} W + {fk:.3} W per busy CPU (fixture {s} + {k}); busy CPUs \
             {lo:.2} to {hi:.2}: allowed {:.2}% and {:.2}%",
            static_tol * 100.0,
            slope_tol * 100.0
        );
        assert!((fs / s - 1.0).abs() < static_tol, "{d} static {fs} vs {s}");
        assert!((fk / k - 1.0).abs() < slope_tol, "{d} slope {fk} vs {k}");
        assert_eq!(x["reader"], "powercap");
    }
    assert!(stdout.contains("host power model written to"), "{stdout}");
    // run reads it (given), and says so.
    let r = wattprof_run(
        &[
            &fixture.arg(),
            "--host-model",
            out.to_str().expect("utf-8"),
            "--interval",
            "250ms",
        ],
        &[&testload(), "burn", "1", "0.5"],
    );
    assert!(r.output.status.success(), "{}", r.stderr());
    let pkg = domain(r.report(), "package", Some(0));
    assert_eq!(pkg["static_source"], "host_model", "{pkg}");
    assert!(r.stderr().contains("static (host model"), "{}", r.stderr());
    // A model from another machine is one line and exit 2.
    let mut other = model.clone();
    other["machine"]["cpus"] = serde_json::json!(4096);
    let bad = dir.join("other.json");
    std::fs::write(&bad, other.to_string()).expect("write");
    let r = Command::new(wattprof_bin())
        .args(["run", "--host-model"])
        .arg(&bad)
        .args(["--", "true"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&r.stderr);
    assert_eq!(r.status.code(), Some(2), "{err}");
    assert!(
        err.contains("made on another machine") && err.trim().lines().count() == 1,
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_burner_s_energy_per_cpu_second_is_the_same_alone_and_beside_another() {
    require_ebpf!();
    let (s, k) = (21.6, 13.9);
    let fixture = rapl((s, k));
    let dir = tempfile_dir();
    let model = host_model(&dir, s, k);
    let args = [
        fixture.arg(),
        "--host-model".into(),
        model.to_string_lossy().into_owned(),
        "--interval".into(),
        "250ms".into(),
    ];
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let t = testload();
    let alone = wattprof_run(&args, &[&t, "cpu", "2.0"]);
    assert!(alone.output.status.success(), "{}", alone.stderr());
    let pair = wattprof_run(
        &args,
        &["sh", "-c", &format!("{t} cpu 2.0 & {t} cpu 2.0 & wait")],
    );
    assert!(pair.output.status.success(), "{}", pair.stderr());
    // Each interval's power against the law over the tracker's busy time:
    // where a figure is off, this says which interval was.
    for (name, r) in [("alone", alone.report()), ("pair", pair.report())] {
        for iv in r["intervals"].as_array().into_iter().flatten() {
            let d = &iv["domains"][0];
            let (dur, busy) = (
                u(iv, "/duration_ns") as f64 / 1e9,
                u(iv, "/busy_ns") as f64 / 1e9,
            );
            eprintln!(
                "{name}: {dur:.3} s, {busy:.3} s busy: {:.3} J measured, the law's {:.3} J",
                f(d, "/measured_j"),
                s * dur + k * busy
            );
        }
    }
    let a = j_per_cpu_s(alone.report(), u(&alone.stdout_json()[0], "/pid"));
    let truths = pair.stdout_json();
    let p1 = j_per_cpu_s(pair.report(), u(&truths[0], "/pid"));
    let p2 = j_per_cpu_s(pair.report(), u(&truths[1], "/pid"));
    // What it caused (k) plus rent for its CPU time (S / CPUs).
    let cpus = u(alone.report(), "/machine/cpus") as f64;
    let expected = k + s / cpus;
    eprintln!(
        "J per CPU-second: alone {a:.3}, beside another {p1:.3} and {p2:.3}; the law's \
         {expected:.3} (k + S / {cpus} CPUs)"
    );
    // 2%, and what the fixture's busy time that was no task's may move in
    // each burner's package energy (fixture_shift_j).
    let law = PowerLaw {
        static_w: s,
        per_cpu_w: k,
    };
    let part = |r: &Value, v: &Value| {
        let pid = u(v, "/pid");
        let p = wattprof_tests::process(r, pid);
        wattprof_tests::fixture_shift_j(r, pid, "package", law) / f(p, "/energy/package_j")
    };
    let alone_part = part(alone.report(), &alone.stdout_json()[0]);
    for (x, truth) in [(p1, &truths[0]), (p2, &truths[1])] {
        let allowed = 0.02 + alone_part + part(pair.report(), truth);
        assert!(
            (x / a - 1.0).abs() < allowed,
            "alone {a}, beside another {x} (allowed {allowed:.4})"
        );
    }
    // The fixture's busy CPUs come from /proc/stat's idle time: within 3%
    // of the law. On a saturated machine the CPU-time rule gives the same
    // figure alone and beside another; what each part is tells them apart:
    // the static part is exactly S × its CPU time / CPUs, the dynamic k ×
    // its CPU time.
    assert!((a / expected - 1.0).abs() < 0.03, "{a} vs {expected}");
    for r in [alone.report(), pair.report()] {
        for p in r["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .filter(|p| p["comm"] == "wp-cpu")
        {
            let t = u(p, "/on_cpu_ns") as f64 / 1e9;
            let st = f(p, "/energy/static_j");
            let want = (s + DRAM.0) / cpus * t;
            assert!((st / want - 1.0).abs() < 0.01, "static {st} vs {want}: {p}");
            let dynamic = f(p, "/energy/dynamic_j") - DRAM.1 * t;
            // 3%, and what the fixture's busy time that was no task's may
            // move (a busy neighbour's irq and softirq time; CI run of
            // 1ea12ba: 3.8% off against a fixed 3%).
            let pid = u(p, "/pid");
            let law = |static_w, per_cpu_w| PowerLaw {
                static_w,
                per_cpu_w,
            };
            let shift = wattprof_tests::fixture_shift_j(r, pid, "package", law(s, k))
                + wattprof_tests::fixture_shift_j(r, pid, "dram", law(DRAM.0, DRAM.1));
            let allowed = 0.03 + shift / (k * t);
            assert!(
                (dynamic / (k * t) - 1.0).abs() < allowed,
                "package dynamic {dynamic} vs {} (allowed {allowed:.4}): {p}",
                k * t
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_burners_2_to_1_in_cpu_time_get_package_energy_2_to_1() {
    require_ebpf!();
    let (s, k) = (26.2, 9.4);
    let fixture = rapl((s, k));
    let dir = tempfile_dir();
    let model = host_model(&dir, s, k);
    let t = testload();
    let run = wattprof_run(
        &[
            &fixture.arg(),
            "--host-model",
            model.to_str().expect("utf-8"),
            "--interval",
            "250ms",
        ],
        &["sh", "-c", &format!("{t} cpu 1.2 & {t} cpu 0.6 & wait")],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    let truths = run.stdout_json();
    let p: Vec<&Value> = truths
        .iter()
        .map(|t| {
            report["processes"]
                .as_array()
                .expect("processes")
                .iter()
                .find(|p| u(p, "/pid") == u(t, "/pid"))
                .expect("a burner")
        })
        .collect();
    let (full, half) = if u(p[0], "/on_cpu_ns") > u(p[1], "/on_cpu_ns") {
        (p[0], p[1])
    } else {
        (p[1], p[0])
    };
    let time_ratio = u(full, "/on_cpu_ns") as f64 / u(half, "/on_cpu_ns") as f64;
    let energy_ratio = f(full, "/energy/package_j") / f(half, "/energy/package_j");
    eprintln!("CPU time {time_ratio:.4}:1, package energy {energy_ratio:.4}:1");
    assert!((time_ratio - 2.0).abs() < 0.05, "time ratio {time_ratio}");
    // Both parts go by CPU time: the ratios agree to rounding.
    assert!(
        (energy_ratio / time_ratio - 1.0).abs() < 0.01,
        "{energy_ratio} vs {time_ratio}"
    );
    // Each process's static part is the package's and the DRAM's static
    // power × its CPU time / CPUs.
    let cpus = u(report, "/machine/cpus") as f64;
    for x in [full, half] {
        let want = (s + DRAM.0) / cpus * u(x, "/on_cpu_ns") as f64 / 1e9;
        let got = f(x, "/energy/static_j");
        assert!((got / want - 1.0).abs() < 0.01, "static {got} vs {want}");
        let total = f(x, "/energy/total_j");
        assert!(
            (f(x, "/energy/dynamic_j") + got - total).abs() < 1e-5,
            "{x}"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn with_no_model_a_varying_load_is_learned_and_said() {
    require_ebpf!();
    if wattprof_tests::saturated() {
        return;
    }
    let (s, k) = (14.8, 11.6);
    let fixture = rapl((s, k));
    let t = testload();
    // Busy CPUs go 0 → 2 → 1 → 0 → 2 (and whatever else runs beside the
    // test), 2 s each: with a CPU kept busy beside, the busy CPUs span
    // only 1 to 2 and the intercept is extrapolated twice as far, so the
    // fit needs the points (at 1 s each it read 1.5-6% high under load).
    let script = format!(
        "sleep 2; {t} cpu 2.0 & {t} cpu 2.0 & wait; {t} cpu 2.0; sleep 2; {t} cpu 2.0 & \
         {t} cpu 2.0 & wait"
    );
    let run = wattprof_run(
        &[
            &fixture.arg(),
            "--host-model",
            "none",
            "--interval",
            "250ms",
        ],
        &["sh", "-c", &script],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    let pkg = domain(report, "package", Some(0));
    assert_eq!(pkg["static_source"], "learned", "{pkg}");
    let learned = f(pkg, "/static_w");
    eprintln!("learned {learned:.3} W static (fixture {s} W)");
    assert!((learned / s - 1.0).abs() < 0.05, "{learned} vs {s}");
    let fit = report["energy"]["static_power"]["learned"]
        .as_array()
        .expect("learned fits")
        .iter()
        .find(|x| x["domain"] == "package")
        .cloned()
        .expect("the package's fit");
    assert!((f(&fit, "/per_cpu_w") / k - 1.0).abs() < 0.05, "{fit}");
    assert!(
        run.stderr().contains("learned from the load"),
        "{}",
        run.stderr()
    );
}

#[test]
fn with_no_model_and_a_steady_load_the_lowest_power_is_used_and_said() {
    require_ebpf!();
    // Constant power: nothing to fit; the lowest power seen is all of it.
    let fixture = FakeRapl::start(31.7, 2.3);
    let run = wattprof_run(
        &[
            &fixture.arg(),
            "--host-model",
            "none",
            "--interval",
            "250ms",
        ],
        &[&testload(), "cpu", "0.5"],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let pkg = domain(run.report(), "package", Some(0));
    assert_eq!(pkg["static_source"], "lowest_seen", "{pkg}");
    assert!((f(pkg, "/static_w") / 31.7 - 1.0).abs() < 0.02, "{pkg}");
    let err = run.stderr();
    assert!(
        err.contains("lowest power seen, an upper bound") && err.contains("wattprof calibrate"),
        "{err}"
    );
}

#[test]
fn with_no_option_on_a_vm_two_burners_2_to_1_get_energy_2_to_1() {
    require_ebpf!();
    let t = testload();
    let run = wattprof_run(
        &["--interval", "250ms"],
        &["sh", "-c", &format!("{t} cpu 1.2 & {t} cpu 0.6 & wait")],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    let cpu = report["energy"]["readers"]
        .as_array()
        .expect("readers")
        .iter()
        .find(|r| r["kind"] == "cpu")
        .cloned()
        .unwrap_or_default();
    if cpu["model"] != "vcpu" {
        wattprof_tests::say_skip("this machine has a CPU energy counter: no vCPU model stands in");
        return;
    }
    let pkg = domain(report, "package", None);
    assert_eq!(pkg["static_source"], "shipped_model", "{pkg}");
    let truths = run.stdout_json();
    let ns_j = |pid: u64| {
        let p = report["processes"]
            .as_array()
            .expect("processes")
            .iter()
            .find(|p| u(p, "/pid") == pid)
            .expect("a burner");
        (u(p, "/on_cpu_ns") as f64, f(p, "/energy/package_j"))
    };
    let (a, b) = (ns_j(u(&truths[0], "/pid")), ns_j(u(&truths[1], "/pid")));
    let ((ta, ea), (tb, eb)) = if a.0 > b.0 { (a, b) } else { (b, a) };
    eprintln!(
        "vCPU model, no option: CPU time {:.4}:1, energy {:.4}:1",
        ta / tb,
        ea / eb
    );
    assert!((ta / tb - 2.0).abs() < 0.05, "time ratio {}", ta / tb);
    assert!(
        ((ea / eb) / (ta / tb) - 1.0).abs() < 0.01,
        "{} vs {}",
        ea / eb,
        ta / tb
    );
}

#[test]
fn monitor_keeps_what_it_learns_in_the_host_model() {
    require_ebpf!();
    if wattprof_tests::saturated() {
        return;
    }
    let (s, k) = (12.9, 10.3);
    let fixture = rapl((s, k));
    let dir = tempfile_dir();
    let model = dir.join("power-model.json");
    let stream = dir.join("stream.jsonl");
    let monitor = Command::new(wattprof_bin())
        .args(["monitor", "--interval", "250ms", "--host-model"])
        .arg(&model)
        .arg(fixture.arg())
        .arg("--jsonl")
        .arg(&stream)
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("monitor");
    // A load that varies, once the monitor counts: idle, two burners, one,
    // idle, two; then the monitor is stopped as a daemon is.
    wattprof_tests::wait_for_stream_header(&stream);
    let t = testload();
    std::thread::sleep(std::time::Duration::from_millis(1000));
    let burn = |n: usize| {
        let kids: Vec<std::process::Child> = (0..n)
            .map(|_| {
                Command::new(&t)
                    .args(["cpu", "2.0"])
                    .stdout(std::process::Stdio::null())
                    .spawn()
                    .expect("burner")
            })
            .collect();
        for mut k in kids {
            let _ = k.wait();
        }
    };
    // 2 s each: the points a fit needs when a CPU is kept busy beside
    // (the busy CPUs then span 1 to 2 only).
    burn(2);
    burn(1);
    std::thread::sleep(std::time::Duration::from_millis(1600));
    burn(2);
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: kill(2) on the monitor this test started.
    unsafe { libc::kill(monitor.id() as libc::pid_t, libc::SIGINT) };
    let out = monitor.wait_with_output().expect("monitor");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let written = read_json(&model);
    let fit = written["fits"]
        .as_array()
        .expect("fits")
        .iter()
        .find(|x| x["domain"] == "package")
        .cloned()
        .unwrap_or_else(|| panic!("no package fit: {written}\n{err}"));
    assert_eq!(fit["origin"], "learned", "{fit}");
    let learned = f(&fit, "/static_w");
    eprintln!("monitor learned {learned:.3} W static (fixture {s} W): {fit}");
    assert!((learned / s - 1.0).abs() < 0.05, "{learned} vs {s}");
    // The next profile starts from it.
    let r = wattprof_run(
        &[
            &fixture.arg(),
            "--host-model",
            model.to_str().expect("utf-8"),
            "--interval",
            "250ms",
        ],
        &["true"],
    );
    assert!(r.output.status.success(), "{}", r.stderr());
    assert_eq!(
        domain(r.report(), "package", Some(0))["static_source"],
        "learned"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
