//! Energy attribution end to end: the real eBPF tracker, a powercap
//! fixture whose counters a test thread advances at a known power, and
//! `wattprof run`. Needs root; run with `--test-threads=1`.

use serde_json::Value;
use wattprof_tests::{
    FakeRapl, PowerLaw, domain, f, process, require_ebpf, testload_bin, two_burners_on_the_stub, u,
    wattprof_bin, wattprof_run,
};

const PACKAGE_W: f64 = 40.0;
const DRAM_W: f64 = 4.0;

fn testload() -> String {
    testload_bin().to_string_lossy().into_owned()
}

/// attributed + idle + unattributed = measured, for every domain, in the
/// totals and in every interval.
fn assert_conserved(report: &Value) {
    let check = |d: &Value| {
        let sum = f(d, "/attributed_j") + f(d, "/idle_j") + f(d, "/unattributed_j");
        assert!(
            (sum - f(d, "/measured_j")).abs() < 1e-5,
            "not conserved: {d}"
        );
    };
    for d in report["energy"]["domains"].as_array().expect("domains") {
        check(d);
    }
    for iv in report["intervals"].as_array().expect("intervals") {
        for d in iv["domains"].as_array().expect("interval domains") {
            check(d);
        }
    }
    // The groups add up to what was attributed.
    let g = &report["energy"]["groups"];
    let groups = f(g, "/tree/package_j") + f(g, "/profiler/package_j") + f(g, "/other/package_j");
    let attributed: f64 = report["energy"]["domains"]
        .as_array()
        .expect("domains")
        .iter()
        .filter(|d| d["domain"] == "package")
        .map(|d| f(d, "/attributed_j"))
        .sum();
    assert!(
        (groups - attributed).abs() < 1e-5,
        "{groups} vs {attributed}"
    );
}

/// Each interval's power per domain and busy time, in words.
fn per_interval(report: &Value) -> Vec<String> {
    let intervals = report["intervals"].as_array().expect("intervals");
    intervals
        .iter()
        .map(|iv| {
            let w: Vec<String> = iv["domains"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|d| format!("{:.2}", d["power_w"].as_f64().unwrap_or(0.0)))
                .collect();
            format!(
                "{:.1} ms: {} W, busy {:.1} ms",
                iv["duration_ns"].as_f64().unwrap_or(0.0) / 1e6,
                w.join("/"),
                iv["busy_ns"].as_f64().unwrap_or(0.0) / 1e6
            )
        })
        .collect()
}

/// The 2:1 burners' CPU time is 2:1 and their package and DRAM energy
/// follow it, within 1% and what the fixture's busy time that was no
/// task's may move.
fn check_ratios(report: &Value, full: &Value, half: &Value, package: PowerLaw, dram: PowerLaw) {
    let time_ratio = u(full, "/on_cpu_ns") as f64 / u(half, "/on_cpu_ns") as f64;
    let energy_ratio = f(full, "/energy/package_j") / f(half, "/energy/package_j");
    let dram_ratio = f(full, "/energy/dram_j") / f(half, "/energy/dram_j");
    eprintln!(
        "burners: CPU time ratio {time_ratio:.4}, package energy ratio {energy_ratio:.4}, \
         DRAM {dram_ratio:.4}"
    );
    // Each interval's power per domain and busy time: where a ratio is
    // off, this says which interval's energy was.
    let per_interval = per_interval(report);
    // A burner's energy may move with the fixture's busy time that was no
    // task's (fixture_shift_j). Fresh-clone run 48: an interval with 37 ms
    // of busy time and no task (1.2% off, against a fixed 1%).
    let share_shift = |law: PowerLaw, name: &str| -> [f64; 2] {
        [full, half].map(|p| wattprof_tests::fixture_shift_j(report, u(p, "/pid"), name, law))
    };
    let allowed = |law: PowerLaw, name: &str, key: &str| {
        let [a, b] = share_shift(law, name);
        0.01 + a / f(full, key) + b / f(half, key)
    };
    let (pkg_allowed, dram_allowed) = (
        allowed(package, "package", "/energy/package_j"),
        allowed(dram, "dram", "/energy/dram_j"),
    );
    eprintln!(
        "allowed: package {:.2}%, DRAM {:.2}% (1% and the fixture's busy time that was no task's)",
        pkg_allowed * 100.0,
        dram_allowed * 100.0
    );
    assert!((time_ratio - 2.0).abs() < 0.02, "time ratio {time_ratio}");
    assert!(
        (energy_ratio / time_ratio - 1.0).abs() < pkg_allowed,
        "package ratio {energy_ratio:.4} for time {time_ratio:.4} (allowed {pkg_allowed:.4}): \
         {per_interval:#?}"
    );
    assert!(
        (dram_ratio / time_ratio - 1.0).abs() < dram_allowed,
        "DRAM ratio {dram_ratio:.4} for time {time_ratio:.4} (allowed {dram_allowed:.4}): \
         {per_interval:#?}"
    );
}

#[test]
fn two_burners_get_energy_in_their_cpu_time_ratio_and_idle_matches_idle_time() {
    require_ebpf!();
    // Power that follows the load, as real RAPL's does (a constant would
    // give every split rule the same ratios).
    let (package, dram) = (
        PowerLaw {
            static_w: 18.4,
            per_cpu_w: 12.7,
        },
        PowerLaw {
            static_w: 2.1,
            per_cpu_w: 0.6,
        },
    );
    let rapl = FakeRapl::following(package, dram);
    // This host's model, as `wattprof calibrate` would fit it (with no
    // model, the lowest power seen is an upper bound of the static power,
    // and the ratio is off: see static_power.rs).
    let dir = wattprof_tests::tempfile_dir();
    let model = wattprof_tests::host_model_file(&dir, package, dram);
    let t = testload();
    let script = format!("{t} cpu 1.2 & {t} cpu 0.6 & wait");
    let not_task_before = wattprof_tests::not_task_total_ns();
    let run = wattprof_run(
        &[
            &rapl.arg(),
            "--host-model",
            model.to_str().expect("utf-8"),
            "--interval",
            "250ms",
        ],
        &["sh", "-c", &script],
    );
    let not_task_ns = wattprof_tests::not_task_total_ns().saturating_sub(not_task_before);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    assert_conserved(report);
    let truths = run.stdout_json();
    assert_eq!(truths.len(), 2, "{truths:?}");
    let (a, b) = (
        process(report, u(&truths[0], "/pid")),
        process(report, u(&truths[1], "/pid")),
    );
    // Which finished first is not fixed: the full-duty one has more time.
    let (full, half) = if u(a, "/on_cpu_ns") > u(b, "/on_cpu_ns") {
        (a, b)
    } else {
        (b, a)
    };
    check_ratios(report, full, half, package, dram);
    // This host's model was used, and each burner's static part is the
    // package's and the DRAM's static power × its CPU time / CPUs.
    let cpus = u(report, "/machine/cpus") as f64;
    assert_eq!(
        domain(report, "package", Some(0))["static_source"],
        "host_model"
    );
    for p in [full, half] {
        let want = (18.4 + 2.1) / cpus * u(p, "/on_cpu_ns") as f64 / 1e9;
        let got = f(p, "/energy/static_j");
        assert!(
            (got / want - 1.0).abs() < 0.01,
            "static {got} vs {want}: {p}"
        );
    }
    // The whole measured energy is the fixture's law over the run: its
    // static power over the wall time and its slope over the busy CPU
    // time. The fixture's busy time is /proc/stat's: the tasks' (the
    // report's), and interrupts, softirqs and steal, which /proc/stat
    // counted around the run (a little more than its span; its all-CPU
    // line, cut to ticks once, is less than a tick short per field).
    // Within 1% of that range (a run here: +1.06% over the tasks' time
    // alone, with the rest on no task).
    let pkg = domain(report, "package", Some(0));
    let wall_s = u(report, "/wall_ns") as f64 / 1e9;
    let busy_s = u(report, "/machine/busy_ns") as f64 / 1e9;
    let not_task_s = (not_task_ns + 3 * wattprof_tests::tick_ns()) as f64 / 1e9;
    let (law_lo, law_hi) = (
        18.4 * wall_s + 12.7 * busy_s,
        18.4 * wall_s + 12.7 * (busy_s + not_task_s),
    );
    let measured = f(pkg, "/measured_j");
    eprintln!(
        "package: measured {measured:.3} J, the law's {law_lo:.3} J over the tasks' time, \
         {law_hi:.3} J with {not_task_s:.3} s on no task; static {:.3} J ({} {} W), idle {:.3} J",
        f(pkg, "/static_j"),
        pkg["static_source"],
        pkg["static_w"],
        f(pkg, "/idle_j")
    );
    assert!(
        measured > law_lo * 0.99 && measured < law_hi * 1.01,
        "measured {measured:.3} J outside the law's {law_lo:.3}..{law_hi:.3} J (1%)"
    );
    // Idle energy is idle time's share of the static energy, whatever
    // figure it was divided with.
    let idle_share = u(report, "/machine/idle_ns") as f64 / u(report, "/machine/window_ns") as f64;
    let idle_energy_share = f(pkg, "/idle_j") / f(pkg, "/static_j");
    eprintln!("idle: {idle_share:.4} of CPU time, {idle_energy_share:.4} of static energy");
    assert!((idle_energy_share - idle_share).abs() < 0.01);
    assert_eq!(report["energy"]["readers"][0]["name"], "powercap");
    assert!(run.stderr().contains("CPU J"), "{}", run.stderr());
}

#[test]
fn a_window_is_exact_to_the_counter_not_to_the_interval() {
    require_ebpf!();
    let rapl = FakeRapl::start(PACKAGE_W, DRAM_W);
    // A 5 s interval: the window's boundaries can only come from its
    // messages.
    let run = wattprof_run(
        &[&rapl.arg(), "--interval", "5s"],
        &[&testload(), "window", "train", "0.7"],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    let truth = &run.stdout_json()[0];
    let client_s = (u(truth, "/end_ns") - u(truth, "/begin_ns")) as f64 / 1e9;
    let windows = report["windows"].as_array().expect("windows");
    assert_eq!(windows.len(), 1, "{windows:?}");
    let w = &windows[0];
    assert_eq!(w["name"], "train");
    assert_eq!(w["pid"].as_u64(), Some(u(truth, "/pid")));
    assert_eq!(w["unterminated"], false);
    let machine = w["machine"]
        .as_array()
        .expect("machine")
        .iter()
        .find(|m| m["domain"] == "package")
        .expect("package in window");
    let measured = f(machine, "/measured_j");
    let window_s = (u(w, "/end_ns") - u(w, "/begin_ns")) as f64 / 1e9;
    let expected = PACKAGE_W * window_s;
    eprintln!(
        "window: {measured:.4} J measured, {expected:.4} J = {PACKAGE_W} W x {window_s:.4} s; \
         the client timed {client_s:.4} s"
    );
    assert!((measured / expected - 1.0).abs() < 0.01);
    // The boundaries are the messages' arrival, not interval ticks: the
    // window is the client's own span, but for wake-up latency.
    assert!(
        (window_s / client_s - 1.0).abs() < 0.02,
        "{window_s} vs {client_s}"
    );
    // The tree's share is its on-CPU share of the window's CPU time.
    let len_ns = u(w, "/end_ns") - u(w, "/begin_ns");
    let cpus = u(report, "/machine/cpus") as f64;
    let share = u(w, "/on_cpu_ns") as f64 / (cpus * len_ns as f64);
    let tree = f(w, "/energy/package_j");
    eprintln!("window: tree {tree:.4} J, on-CPU share {share:.4}");
    assert!((tree / (measured * share) - 1.0).abs() < 0.01);
    assert!(run.stderr().contains("WINDOW"), "{}", run.stderr());
}

#[test]
fn short_lived_processes_get_their_energy() {
    require_ebpf!();
    // Power that follows the load, with this host's model.
    let (package, dram) = (
        PowerLaw {
            static_w: 23.1,
            per_cpu_w: 9.8,
        },
        PowerLaw {
            static_w: 1.7,
            per_cpu_w: 0.3,
        },
    );
    let rapl = FakeRapl::following(package, dram);
    let dir = wattprof_tests::tempfile_dir();
    let model = wattprof_tests::host_model_file(&dir, package, dram);
    let run = wattprof_run(
        &[&rapl.arg(), "--host-model", model.to_str().expect("utf-8")],
        &[&testload(), "spawn", "1000"],
    );
    let _ = std::fs::remove_dir_all(&dir);
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    assert_conserved(report);
    let shorts: Vec<&Value> = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["comm"] == "wp-short")
        .collect();
    assert_eq!(shorts.len(), 1000);
    let pkg = domain(report, "package", Some(0));
    let joules: f64 = shorts.iter().map(|p| f(p, "/energy/package_j")).sum();
    let static_j: f64 = shorts.iter().map(|p| f(p, "/energy/static_j")).sum();
    let ns: u64 = shorts.iter().map(|p| u(p, "/on_cpu_ns")).sum();
    // Each got energy; together, their static part is their share of the
    // capacity of the package's and DRAM's static energy, and their
    // package dynamic part is their share of the busy time of its dynamic
    // energy.
    assert!(shorts.iter().all(|p| f(p, "/energy/package_j") > 0.0));
    let capacity_share = ns as f64 / u(report, "/machine/window_ns") as f64;
    let busy_share = ns as f64 / u(report, "/machine/busy_ns") as f64;
    let dram = domain(report, "dram", Some(0));
    let want_static = capacity_share * (f(pkg, "/static_j") + f(dram, "/static_j"));
    let want_j = capacity_share * f(pkg, "/static_j")
        + busy_share * (f(pkg, "/measured_j") - f(pkg, "/static_j"));
    eprintln!(
        "1000 short processes: {joules:.3} J (the rule's {want_j:.3}), static {static_j:.3} J \
         ({want_static:.3}); {capacity_share:.4} of the capacity, {busy_share:.4} of busy time"
    );
    assert!((static_j / want_static - 1.0).abs() < 0.01);
    assert!((joules / want_j - 1.0).abs() < 0.01);
}

#[test]
fn the_tdp_estimate_is_marked_and_divided_by_busy_time() {
    require_ebpf!();
    if std::path::Path::new("/sys/class/powercap/intel-rapl:0").exists() {
        wattprof_tests::say_skip("this machine has RAPL, so the estimate is not used");
        return;
    }
    let run = wattprof_run(
        &["--cpu-tdp", "100", "--energy-sysfs=/nonexistent"],
        &[&testload(), "burn", "1", "1.0"],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    let pkg = domain(report, "package", None);
    assert_eq!(pkg["estimated"], true);
    assert_eq!(pkg["basis"], "busy_time");
    assert_eq!(f(pkg, "/idle_j"), 0.0);
    // TDP x busy / CPUs.
    let expected =
        100.0 * u(report, "/machine/busy_ns") as f64 / 1e9 / u(report, "/machine/cpus") as f64;
    assert!((f(pkg, "/measured_j") / expected - 1.0).abs() < 0.001);
    assert!(run.stderr().contains("[ESTIMATED]"), "{}", run.stderr());
}

#[test]
fn the_vcpu_model_has_an_idle_term_and_is_divided_like_a_counter() {
    require_ebpf!();
    // No counter (a sysfs with none), figures given: vCPUs × 0.5 W idle,
    // 2.5 W busy.
    let run = wattprof_run(
        &[
            "--energy-sysfs=/nonexistent",
            "--vcpu-watts",
            "0.5,2.5",
            "--interval",
            "250ms",
        ],
        &[&testload(), "burn", "1", "1.0"],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    assert_conserved(report);
    let pkg = domain(report, "package", None);
    assert_eq!(pkg["estimated"], true);
    assert_eq!(pkg["basis"], "cpu_time");
    // min × all CPU time + (max − min) × task time.
    let task_ns = u(report, "/machine/window_ns") - u(report, "/machine/idle_ns");
    let expected = 0.5 * u(report, "/machine/window_ns") as f64 / 1e9 + 2.0 * task_ns as f64 / 1e9;
    let measured = f(pkg, "/measured_j");
    assert!(
        (measured / expected - 1.0).abs() < 0.001,
        "{measured} J vs {expected} J"
    );
    // The model's static part is its idle watts × vCPUs, so under the
    // capacity rule idle energy is 0.5 W × the idle CPU time, and each
    // process gets the full 2.5 W × its CPU time (0.5 W of rent + 2 W it
    // caused), whatever ran beside it. Exact but for µJ rounding (3 µJ an
    // interval: the model's energy, the static figure, each share), and
    // for one thing a loaded machine does: a read delayed past the
    // interval's close finds a package busier than its window. That time
    // (`machine.carried_ns`) is in the burner's on-CPU time, but its
    // interval's energy covered the window only; the next intervals divide
    // its energy as idle. So the burner may fall short, and the idle row
    // hold more, by at most 2.5 W × that time (0.5 W of it static).
    // Fresh-clone runs 16 and 20 under load: 2.9 ms and 70 µs carried.
    assert_eq!(pkg["static_source"], "shipped_model", "{pkg}");
    let intervals = report["intervals"].as_array().expect("intervals").len() as f64;
    let rounding = 3e-6 * (intervals + 1.0);
    let carried_s = u(report, "/machine/carried_ns") as f64 / 1e9;
    let idle_s = u(report, "/machine/idle_ns") as f64 / 1e9;
    let idle_j = f(pkg, "/idle_j");
    assert!(
        idle_j >= 0.5 * idle_s - rounding && idle_j <= 0.5 * idle_s + 2.5 * carried_s + rounding,
        "idle {idle_j} J over {idle_s} s idle (0.5 W each), {carried_s} s carried: {pkg}"
    );
    let burner = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["comm"] == "wp-burn")
        .expect("the burner");
    let on_cpu_s = u(burner, "/on_cpu_ns") as f64 / 1e9;
    let within = |got: f64, watts: f64| {
        got <= watts * on_cpu_s + rounding && got >= watts * (on_cpu_s - carried_s) - rounding
    };
    assert!(
        within(f(burner, "/energy/package_j"), 2.5),
        "the burner over {on_cpu_s} s on CPU (2.5 W each), {carried_s} s carried: {burner}"
    );
    assert!(
        within(f(burner, "/energy/static_j"), 0.5),
        "the burner's static part over {on_cpu_s} s on CPU (0.5 W each), {carried_s} s carried: {burner}"
    );
    // On a quiet machine nothing is carried, and the bounds are exact; a
    // read delayed by more than a few scheduler slices is a fault.
    assert!(
        carried_s < 0.05 * on_cpu_s,
        "{carried_s} s carried of {on_cpu_s} s on CPU"
    );
    let cpu = report["energy"]["readers"]
        .as_array()
        .expect("readers")
        .iter()
        .find(|r| r["kind"] == "cpu")
        .expect("a cpu reader");
    assert_eq!(cpu["model"], "vcpu", "{cpu}");
    assert!(
        cpu["detail"]
            .as_str()
            .expect("detail")
            .contains("--vcpu-watts 0.5,2.5 given"),
        "{cpu}"
    );
    assert!(run.stderr().contains("[ESTIMATED]"), "{}", run.stderr());
}

#[test]
fn with_no_counter_and_no_option_energy_is_estimated_and_sources_says_why() {
    require_ebpf!();
    let sources = std::process::Command::new(wattprof_bin())
        .args(["sources", "--json"])
        .output()
        .expect("sources");
    let chosen: Value = serde_json::from_slice(&sources.stdout).expect("sources JSON");
    if chosen["cpu_energy_reader"] != "estimate" {
        wattprof_tests::say_skip("this machine has a CPU energy counter, so no model stands in");
        return;
    }
    // The README's first command, as a new user on a VM types it.
    let sample = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../examples/sample-workload.sh"
    );
    let run = wattprof_run(&[], &[sample]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    let pkg = domain(report, "package", None);
    assert_eq!(pkg["estimated"], true);
    assert!(f(pkg, "/measured_j") > 0.0 && f(report, "/energy/groups/tree/package_j") > 0.0);
    let cpu = report["energy"]["readers"]
        .as_array()
        .expect("readers")
        .iter()
        .find(|r| r["kind"] == "cpu")
        .expect("a cpu reader");
    assert_eq!(cpu["name"], "estimate");
    assert!(cpu["model"] == "vcpu" || cpu["model"] == "tdp", "{cpu}");
    let detail = cpu["detail"].as_str().expect("detail");
    assert!(detail.contains("source: "), "{detail}");
    let table = run.stderr();
    assert!(
        table.contains("[ESTIMATED]") && table.contains(" model"),
        "{table}"
    );
    assert!(table.contains("estimated"), "{table}");
    let sources = std::process::Command::new(wattprof_bin())
        .arg("sources")
        .output()
        .expect("sources");
    let text = String::from_utf8_lossy(&sources.stdout);
    assert!(
        text.contains("estimate  in use") && text.contains("why:"),
        "{text}"
    );
    assert!(
        text.contains("CPU energy is ESTIMATED with a power model"),
        "{text}"
    );
}

#[test]
fn a_killed_wattprof_leaves_a_jsonl_stream_that_parses_to_its_last_line() {
    require_ebpf!();
    let rapl = FakeRapl::start(PACKAGE_W, DRAM_W);
    let dir = wattprof_tests::tempfile_dir();
    let stream = dir.join("live.jsonl");
    let mut child = std::process::Command::new(wattprof_bin())
        .args(["run", &rapl.arg(), "--interval", "50ms", "--jsonl"])
        .arg(&stream)
        .args(["--", &testload(), "burn", "1.5", "0.3"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start wattprof");
    // Records reach the file as they happen: kill it mid-stream, once ten
    // intervals are there (about 0.5 s in; a loaded machine takes longer).
    wattprof_tests::wait_for_stream_lines(&stream, "interval", 10);
    child.kill().expect("SIGKILL wattprof");
    let _ = child.wait();
    let text = std::fs::read_to_string(&stream).expect("stream exists");
    let complete = text.rfind('\n').map_or("", |i| &text[..i]);
    let records: Vec<Value> = complete
        .lines()
        .map(|l| serde_json::from_str(l).expect("every complete line parses"))
        .collect();
    let intervals = records.iter().filter(|r| r["type"] == "interval").count();
    eprintln!(
        "killed mid-stream: {} records, {intervals} intervals",
        records.len()
    );
    assert_eq!(records[0]["type"], "header");
    assert!(intervals >= 10, "{intervals} intervals");
    // The burner outlives wattprof; let it finish before the next test.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let burner_alive = || {
        std::fs::read_dir("/proc").is_ok_and(|d| {
            d.flatten().any(|e| {
                std::fs::read_to_string(e.path().join("comm")).is_ok_and(|c| c.trim() == "wp-burn")
            })
        })
    };
    while burner_alive() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_recording_and_every_stream_line_match_the_documented_schema() {
    require_ebpf!();
    let rapl = FakeRapl::start(PACKAGE_W, DRAM_W);
    let dir = wattprof_tests::tempfile_dir();
    let stream = dir.join("s.jsonl");
    let stream_arg = stream.to_string_lossy().into_owned();
    let run = wattprof_run(
        &[
            &rapl.arg(),
            "--interval",
            "200ms",
            "--country",
            "FRA",
            "--jsonl",
            &stream_arg,
        ],
        &[&testload(), "window", "step", "0.3"],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    wattprof_tests::schema::assert_valid("recording", report);
    assert!(f(report, "/energy/carbon_intensity_g_per_kwh") > 50.0);
    let text = std::fs::read_to_string(&stream).expect("stream");
    let mut kinds = Vec::new();
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("line parses");
        let kind = v["type"].as_str().expect("type").to_string();
        let def = match kind.as_str() {
            "summary" => "recording",
            k => k,
        };
        wattprof_tests::schema::assert_valid(def, &v);
        kinds.push(kind);
    }
    assert_eq!(kinds.first().map(String::as_str), Some("header"));
    assert_eq!(kinds.last().map(String::as_str), Some("summary"));
    assert!(kinds.iter().any(|k| k == "window"), "{kinds:?}");
    assert!(kinds.iter().filter(|k| *k == "interval").count() >= 2);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn gpu_energy_goes_to_the_command_by_its_sm_share() {
    require_ebpf!();
    // Two processes on one GPU at 200 W: the command (70% SM) and an
    // outsider (30%); a second GPU nobody uses is idle.
    let lib = wattprof_tests::nvml_stub(
        "gpu name=Stub-A uuid=GPU-A power_mw=200000 energy=counter util=100 \
         memory_total=85899345920 memory_used=2147483648 procs=child:70:1073741824,999999:30:1024\n\
         gpu name=Stub-B uuid=GPU-B power_mw=50000 energy=counter util=0 \
         memory_total=85899345920 memory_used=0\n",
    );
    let lib_arg = format!("--nvml-lib={}", lib.display());
    let run = wattprof_run(
        &[
            &lib_arg,
            "--energy-sysfs=/nonexistent",
            "--interval",
            "250ms",
        ],
        &[&testload(), "burn", "1.5", "0.2"],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    wattprof_tests::schema::assert_valid("recording", report);
    let g0 = domain(report, "gpu", Some(0));
    let g1 = domain(report, "gpu", Some(1));
    let pid = u(report, "/command/pid");
    let cmd = process(report, pid);
    let gpu_j = f(cmd, "/energy/gpu_j");
    eprintln!(
        "GPU 0: measured {:.3} J, command {gpu_j:.3} J, unattributed {:.3} J; GPU 1 idle {:.3} J",
        f(g0, "/measured_j"),
        f(g0, "/unattributed_j"),
        f(g1, "/idle_j")
    );
    // The command's share, except the first interval (before it started).
    assert!((gpu_j / f(g0, "/measured_j") - 0.7).abs() < 0.05, "{gpu_j}");
    // The outsider is no process wattprof saw: unattributed, not dropped.
    assert!((f(g0, "/unattributed_j") / f(g0, "/measured_j") - 0.3).abs() < 0.05);
    assert!((f(g1, "/idle_j") - f(g1, "/measured_j")).abs() < 1e-6);
    assert_eq!(
        cmd["memory"]["peak_gpu_bytes"].as_u64(),
        Some(1_073_741_824)
    );
    assert!(cmd["memory"]["peak_pss_bytes"].as_u64().unwrap_or(0) > 0);
}

/// The two processes' GPU joules over the intervals divided by samples,
/// the seconds split equally (before the first sample), and each
/// interval's split as a line, printed when the ratio is off: which reads
/// gave the extra joules (a flake seen under a busy loop in CI: 1.666:1 at
/// 1 s, 2.108:1 at 100 ms).
fn split_by_samples(intervals: &[serde_json::Value], pids: &[u64]) -> (f64, f64, f64, Vec<String>) {
    let (mut sa, mut sb, mut equal_s) = (0.0, 0.0, 0.0);
    let mut split = Vec::new();
    for i in intervals {
        let g = &i["gpus"][0];
        if g["processes"].as_array().is_none_or(|p| p.is_empty()) {
            continue;
        }
        let j = |pid: u64| {
            i["processes"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["pid"].as_u64() == Some(pid)))
                .map_or(0.0, |p| f(p, "/gpu_j"))
        };
        split.push(format!(
            "t={:.1}s {} {:.3}:{:.3} J shares {}",
            u(i, "/t_ns") as f64 / 1e9,
            g["sm_basis"],
            j(pids[0]),
            j(pids[1]),
            g["processes"]
        ));
        if g["sm_basis"] == "equal" {
            equal_s += u(i, "/duration_ns") as f64 / 1e9;
            continue;
        }
        sa += j(pids[0]);
        sb += j(pids[1]);
    }
    (sa, sb, equal_s, split)
}

#[test]
fn two_processes_at_2_to_1_sm_get_gpu_energy_2_to_1_at_1_s_and_at_100_ms() {
    require_ebpf!();
    // The driver samples every 500 ms: at 100 ms most intervals have no
    // new sample and carry the last shares (sm_basis "carried"), never an
    // equal split once the first sample came. Both hold the GPU from 1.5 s to 4.5 s of the stub's
    // clock (from NVML's init, a little before the profile's start),
    // whenever the shell started them: on a loaded machine the second
    // child can start hundreds of ms after the first, and a split of the
    // time one ran alone is no test of 2:1. The burners last 5.5 s, and
    // every read that finds one holding the GPU must find both.
    let lib = wattprof_tests::nvml_stub(
        "gpu name=Stub-A uuid=GPU-A power_mw=150000 energy=counter util=90 sample_ms=500 \
         memory_total=85899345920 memory_used=2147483648 \
         procs=child/1:60:1073741824@1500-4500,child/2:30:536870912@1500-4500\n",
    );
    let lib_arg = format!("--nvml-lib={}", lib.display());
    for interval in ["1s", "100ms"] {
        let (report, pids) = two_burners_on_the_stub(&lib_arg, interval, "5.5", "0.2");
        let report = &report;
        for i in report["intervals"].as_array().expect("intervals") {
            let holders: Vec<u64> = i["gpus"][0]["processes"]
                .as_array()
                .map(|p| p.iter().map(|p| u(p, "/pid")).collect())
                .unwrap_or_default();
            assert!(
                holders.is_empty() || pids.iter().all(|p| holders.contains(p)),
                "{interval}: a read found only {holders:?} of {pids:?} holding the GPU (a \
                 burner started after the stub's 1.5 s or ended before its 4.5 s)"
            );
        }
        let gpu = |pid| f(process(report, pid), "/energy/gpu_j");
        let (a, b) = (gpu(pids[0]), gpu(pids[1]));
        let g0 = domain(report, "gpu", Some(0));
        let intervals = report["intervals"].as_array().expect("intervals");
        // Divided by their samples: every interval but those before the
        // driver's first sample of them. A sample is its process's mean
        // over the driver's period, so the first comes up to 500 ms after
        // they start working; until then the holders share equally.
        let (sa, sb, equal_s, split) = split_by_samples(intervals, &pids);
        if (sa / sb / 2.0 - 1.0).abs() >= 0.02 {
            eprintln!(
                "{interval}: per interval (pids {pids:?}):\n{}",
                split.join("\n")
            );
        }
        eprintln!(
            "{interval}: GPU measured {:.3} J, first {a:.3} J, second {b:.3} J ({:.4}:1); \
             by samples {sa:.3} J : {sb:.3} J ({:.4}:1), {equal_s:.2} s split equally",
            f(g0, "/measured_j"),
            a / b,
            sa / sb
        );
        assert!(
            (sa / sb / 2.0 - 1.0).abs() < 0.02,
            "{interval}: {sa} vs {sb}"
        );
        // The equal split: before the first sample only (one driver
        // period, and the interval that held its start).
        let iv = if interval == "1s" { 1.0 } else { 0.1 };
        assert!(
            equal_s <= 0.5 + iv + 0.05,
            "{interval}: {equal_s} s split equally"
        );
        // Between them, all of the GPU's energy in the intervals whose
        // read found them holding it (no static power is learned in 5 s,
        // so none goes to idle), to the µJ of each interval's rounding.
        let held: f64 = intervals
            .iter()
            .filter(|i| {
                i["gpus"][0]["processes"]
                    .as_array()
                    .is_some_and(|p| !p.is_empty())
            })
            .map(|i| f(&i["gpus"][0], "/energy_j"))
            .sum();
        assert!(
            (a + b - held).abs() < 1e-5 * intervals.len() as f64 + 1e-6 * held,
            "{interval}: {a} + {b} J against {held} J in the intervals they held the GPU"
        );
        // How the intervals they held it were divided: once sampled, never
        // equally (carried between the driver's samples).
        let bases: Vec<&str> = intervals
            .iter()
            .filter(|i| {
                i["gpus"][0]["processes"]
                    .as_array()
                    .is_some_and(|p| !p.is_empty())
            })
            .filter_map(|i| i["gpus"][0]["sm_basis"].as_str())
            .skip_while(|b| *b == "equal")
            .collect();
        assert!(!bases.contains(&"equal"), "{interval}: {bases:?}");
        if interval == "100ms" {
            let carried = bases.iter().filter(|b| **b == "carried").count();
            assert!(
                carried * 2 > bases.len(),
                "mostly carried at 100 ms: {bases:?}"
            );
        }
    }
}

#[test]
fn an_idle_holder_beside_a_busy_process_gets_only_its_share_of_held_power() {
    require_ebpf!();
    // A GPU whose power follows its load: 31.7 W with no context, +22.3 W
    // with contexts open, +1.5 W per SM percent. No context for 6 s (idle
    // learned: the first interval and a second to settle left out, then
    // 2 s of stretch and the second held back after it), then both
    // processes hold one at 0% SM for 5 s (held learned), then the first
    // works at 60% SM while the second only holds its context.
    let lib = wattprof_tests::nvml_stub(
        "gpu name=Stub-A uuid=GPU-A energy=counter load=31700:22300:1500 \
         memory_total=85899345920 memory_used=2147483648 \
         procs=child/1:0:1024@6000-11000,child/1:60:1024@11000-60000,child/2:0:2048@6000-60000\n",
    );
    let lib_arg = format!("--nvml-lib={}", lib.display());
    let (report, pids) = two_burners_on_the_stub(&lib_arg, "250ms", "15", "0.1");
    let report = &report;
    let (busy, holder) = (pids[0], pids[1]);
    let intervals = report["intervals"].as_array().expect("intervals");
    // The figures learned, against the fixture's: each state's settled
    // stretch, exact to the read's timing.
    let last = intervals
        .iter()
        .rev()
        .find(|i| i["gpus"][0]["held_w"].is_number())
        .expect("held power learned");
    let (idle_w, held_w) = (f(last, "/gpus/0/idle_w"), f(last, "/gpus/0/held_w"));
    eprintln!("learned: idle {idle_w:.3} W, held {held_w:.3} W (fixture 31.7, 22.3)");
    assert!((idle_w / 31.7 - 1.0).abs() < 0.02, "idle {idle_w}");
    assert!((held_w / 22.3 - 1.0).abs() < 0.03, "held {held_w}");
    // While the first works and the second holds: the holder gets half
    // of the held power and nothing else; the worker the other half and
    // all of the dynamic power (1.5 W x 60).
    let (mut secs, mut holder_j, mut busy_j) = (0.0, 0.0, 0.0);
    for i in intervals {
        let g = &i["gpus"][0];
        let procs = g["processes"].as_array().cloned().unwrap_or_default();
        let sm = |pid: u64| {
            procs
                .iter()
                .find(|p| p["pid"].as_u64() == Some(pid))
                .and_then(|p| p["sm_util_pct"].as_f64())
        };
        // Whole intervals of that phase, with both figures known.
        if sm(busy) != Some(60.0) || sm(holder) != Some(0.0) || !g["held_w"].is_number() {
            continue;
        }
        let gpu_j = |pid: u64| {
            i["processes"]
                .as_array()
                .and_then(|ps| ps.iter().find(|p| p["pid"].as_u64() == Some(pid)))
                .map_or(0.0, |p| f(p, "/gpu_j"))
        };
        secs += u(i, "/duration_ns") as f64 / 1e9;
        holder_j += gpu_j(holder);
        busy_j += gpu_j(busy);
    }
    eprintln!("{secs:.3} s working: holder {holder_j:.3} J, worker {busy_j:.3} J");
    assert!(secs > 2.0, "too little of the working phase seen: {secs} s");
    let want_holder = 22.3 / 2.0 * secs;
    let want_busy = (22.3 / 2.0 + 90.0) * secs;
    assert!(
        (holder_j / want_holder - 1.0).abs() < 0.05,
        "holder {holder_j} vs {want_holder}"
    );
    assert!(
        (busy_j / want_busy - 1.0).abs() < 0.05,
        "worker {busy_j} vs {want_busy}"
    );
    // The GPU's idle power is the idle row's, whoever held it.
    let g0 = domain(report, "gpu", Some(0));
    let wall_s = u(report, "/wall_ns") as f64 / 1e9;
    assert!(
        (f(g0, "/idle_j") / (31.7 * wall_s) - 1.0).abs() < 0.05,
        "{g0}"
    );
    assert_eq!(g0["static_source"], "lowest_seen", "{g0}");
    // The holder's energy is all static: no work, no dynamic energy
    // once held power is known (before, it shared the resting power
    // equally, as the same figure).
    let h = process(report, holder);
    assert!(
        f(h, "/energy/static_j") > 0.5 * f(h, "/energy/gpu_j"),
        "{h}"
    );
}

#[test]
fn the_csv_is_codecarbon_s_emissions_csv_in_its_units() {
    require_ebpf!();
    let rapl = FakeRapl::start(PACKAGE_W, DRAM_W);
    let dir = wattprof_tests::tempfile_dir();
    let csv = dir.join("emissions.csv");
    let csv_arg = format!("--csv={}", csv.display());
    let mut reports = Vec::new();
    for seconds in ["0.3", "0.6"] {
        let run = wattprof_run(&[&rapl.arg(), &csv_arg], &[&testload(), "cpu", seconds]);
        assert!(run.output.status.success(), "{}", run.stderr());
        assert!(
            run.stderr().contains("emissions row appended"),
            "{}",
            run.stderr()
        );
        reports.push(run.report().clone());
    }
    // Read as codecarbon's users do: Python's csv module, by column name.
    let parse = "import csv, json, sys\n\
                 rows = list(csv.DictReader(open(sys.argv[1])))\n\
                 print(json.dumps(rows))";
    let out = std::process::Command::new("python3")
        .args(["-c", parse])
        .arg(&csv)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows: Vec<Value> = serde_json::from_slice(&out.stdout).expect("rows");
    assert_eq!(rows.len(), 2, "one row per run, one header: {rows:?}");
    let num = |row: &Value, col: &str| -> f64 {
        row[col]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{col} is not a number in {row}"))
    };
    for (row, report) in rows.iter().zip(&reports) {
        let tree = &report["energy"]["groups"]["tree"];
        let kwh = |j: f64| j / 3.6e6;
        let close = |a: f64, b: f64| (a - b).abs() <= 1e-9 * b.abs().max(1e-12);
        assert!(
            close(num(row, "cpu_energy"), kwh(f(tree, "/package_j"))),
            "{row}"
        );
        assert!(
            close(num(row, "ram_energy"), kwh(f(tree, "/dram_j"))),
            "{row}"
        );
        assert!(
            close(num(row, "energy_consumed"), kwh(f(tree, "/total_j"))),
            "{row}"
        );
        // kg CO2eq = kWh x g/kWh / 1000, which the JSON gives in g.
        assert!(
            close(num(row, "emissions"), f(tree, "/co2_g") / 1000.0),
            "{row}"
        );
        let duration = num(row, "duration");
        assert!(close(duration, u(report, "/wall_ns") as f64 / 1e9), "{row}");
        assert!(
            close(num(row, "cpu_power"), f(tree, "/package_j") / duration),
            "{row}"
        );
        assert_eq!(row["tracking_mode"], "process");
        assert_eq!(row["project_name"], "wattprof-testload");
        assert_eq!(
            row["cpu_count"].as_str(),
            Some(u(report, "/machine/cpus").to_string().as_str())
        );
        assert!(
            row["timestamp"]
                .as_str()
                .is_some_and(|t| t.ends_with("+00:00")),
            "{row}"
        );
    }
    assert_ne!(rows[0]["run_id"], rows[1]["run_id"]);
    // Twice the CPU time, about twice the energy.
    let ratio = num(&rows[1], "cpu_energy") / num(&rows[0], "cpu_energy");
    assert!((1.6..2.4).contains(&ratio), "{ratio}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_csv_that_is_not_codecarbon_s_is_refused_before_anything_runs() {
    let dir = wattprof_tests::tempfile_dir();
    let csv = dir.join("mine.csv");
    std::fs::write(&csv, "a,b\n1,2\n").expect("w");
    let out = std::process::Command::new(wattprof_bin())
        .args(["run", &format!("--csv={}", csv.display()), "--", "true"])
        .output()
        .expect("wattprof");
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("codecarbon") && err.lines().count() == 1,
        "{err}"
    );
    assert_eq!(std::fs::read_to_string(&csv).expect("r"), "a,b\n1,2\n");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn mig_instances_with_different_gpm_activity_get_energy_in_that_ratio() {
    require_ebpf!();
    // A GPU in MIG mode with GPM (Hopper): two instances of 28 SMs, the
    // shell's first child working at 60% of its instance, the second at
    // 20%. NVML gives no per-process utilization here: only GPM's
    // per-instance activity can tell them apart.
    let lib = wattprof_tests::nvml_stub(
        "gpu name=Stub-H100 uuid=GPU-M power_mw=150000 energy=counter mig=1 gpm=1 \
         memory_total=85899345920 memory_used=2147483648 instances=1:2:28,2:2:28 \
         procs=child/1:60:1073741824#1,child/2:20:536870912#2\n",
    );
    let lib_arg = format!("--nvml-lib={}", lib.display());
    let (report, pids) = two_burners_on_the_stub(&lib_arg, "250ms", "3", "0.2");
    let report = &report;
    // Intervals weighed by GPM with both instances' processes listed: the
    // first after both started has no earlier GPM sample (compute slices).
    let (mut a, mut b, mut n) = (0.0, 0.0, 0);
    let mut per_interval = Vec::new();
    let mut whole = [0.0f64; 2];
    for iv in report["intervals"].as_array().expect("intervals") {
        let g = &iv["gpus"][0];
        let inst = g["instances"]
            .as_array()
            .expect("MIG instances in every interval");
        assert_eq!(inst.len(), 2, "{g}");
        for (k, i) in inst.iter().enumerate() {
            whole[k] += f(i, "/energy_j");
        }
        let both = inst.iter().all(|i| {
            i["pids"]
                .as_array()
                .is_some_and(|p| p.len() == 1 && pids.contains(&u(&p[0], "")))
        });
        if g["sm_basis"] == "instance_activity" && both {
            a += f(&inst[0], "/energy_j");
            b += f(&inst[1], "/energy_j");
            n += 1;
            per_interval.push(format!(
                "{:.3} / {:.3} J ({}% / {}%)",
                f(&inst[0], "/energy_j"),
                f(&inst[1], "/energy_j"),
                inst[0]["sm_util_pct"],
                inst[1]["sm_util_pct"]
            ));
        }
    }
    eprintln!("MIG instances: {a:.3} / {b:.3} J over {n} intervals: {per_interval:?}");
    assert!(n >= 5, "{n} intervals weighed by GPM with both running");
    // 60% and 20% of equal instances: 3:1, within 2%.
    assert!(
        (a / b / 3.0 - 1.0).abs() < 0.02,
        "instance energy {a:.3} : {b:.3} for GPM activity 3:1: {per_interval:#?}"
    );
    // The run's report has each instance's total, as its intervals sum.
    let totals = report["energy"]["mig_instances"]
        .as_array()
        .expect("mig_instances");
    let got: Vec<(u64, String, f64)> = totals
        .iter()
        .map(|t| {
            (
                u(t, "/gpu_instance_id"),
                t["uuid"].as_str().unwrap_or("").to_string(),
                f(t, "/energy_j"),
            )
        })
        .collect();
    assert_eq!(got.len(), 2, "{got:?}");
    assert_eq!(
        (got[0].0, got[0].1.as_str(), got[1].0, got[1].1.as_str()),
        (
            1,
            "MIG-00000001-0001-0000-0000-000000000000",
            2,
            "MIG-00000001-0002-0000-0000-000000000000"
        )
    );
    for (k, (_, _, j)) in got.iter().enumerate() {
        assert!((j - whole[k]).abs() < 1e-5, "{got:?} vs {whole:?}");
    }
    // What the instances were given is what the two processes were given.
    let procs: f64 = pids
        .iter()
        .map(|p| f(process(report, *p), "/energy/gpu_j"))
        .sum();
    assert!(
        (procs - whole.iter().sum::<f64>()).abs() < 1e-5,
        "processes {procs} vs instances {whole:?}"
    );
}
