//! Faults injected into a running wattprof, each against a guarantee in
//! docs/limits.md's "Guarantees": a full disk, an energy counter that vanishes
//! and returns, a GPU lost, wattprof stopped while thousands of processes
//! come and go, the wall clock jumping, SIGKILL then a restart, and two
//! instances at once. Needs root; run with `--test-threads=1` (one test
//! sets the system clock and puts it back).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use wattprof_tests::{
    FakeRapl, domain, f, nvml_stub, read_json, require_ebpf, tempfile_dir, testload_bin, u,
    wait_for_stream_header, wait_for_stream_lines, wattprof_bin,
};

/// Every line of a stream, parsed; fails on a line that does not parse
/// (a partial line included).
fn stream_lines(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).expect("stream");
    assert!(
        text.is_empty() || text.ends_with('\n'),
        "the stream ends inside a line: {:?}",
        &text[text.len().saturating_sub(200)..]
    );
    text.lines()
        .enumerate()
        .map(|(i, l)| {
            serde_json::from_str(l).unwrap_or_else(|e| panic!("line {}: {e}: {l:.200}", i + 1))
        })
        .collect()
}

fn of_type<'a>(lines: &'a [Value], kind: &str) -> Vec<&'a Value> {
    lines.iter().filter(|l| l["type"] == kind).collect()
}

fn monitor(args: &[&str]) -> Command {
    let mut c = Command::new(wattprof_bin());
    c.arg("monitor").args(args).stdout(Stdio::null());
    c
}

fn signal(child: &Child, sig: i32) {
    // SAFETY: kill with a pid we own and a valid signal number.
    unsafe { libc::kill(child.id() as i32, sig) };
}

fn problems(report: &Value) -> String {
    report["energy"]["problems"].to_string()
}

#[test]
fn a_full_disk_stops_the_stream_at_a_complete_line_and_sampling_goes_on() {
    require_ebpf!();
    let dir = tempfile_dir();
    let small = dir.join("small");
    std::fs::create_dir_all(&small).expect("dir");
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=48k", "wattprof-full"])
        .arg(&small)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        wattprof_tests::say_skip("cannot mount a tmpfs");
        return;
    }
    let rapl = FakeRapl::start(40.0, 4.0);
    let stream = small.join("s.jsonl");
    let csv = small.join("i.csv");
    let out = dir.join("m.json");
    let run = monitor(&[
        &rapl.arg(),
        "--interval",
        "100ms",
        "--duration",
        "4s",
        "--top",
        "60",
    ])
    .arg("--jsonl")
    .arg(&stream)
    .arg("--csv-intervals")
    .arg(&csv)
    .arg("--output")
    .arg(&out)
    .output()
    .expect("monitor");
    let lines = stream_lines(&stream);
    let csv_text = std::fs::read_to_string(&csv).expect("csv");
    let _ = Command::new("umount").arg(&small).status();
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(125), "{stderr}");
    assert_eq!(
        stderr.matches("wattprof: writing --jsonl").count(),
        1,
        "said once: {stderr}"
    );
    assert!(stderr.contains("an output stopped early"), "{stderr}");
    // What was written is whole: every line parses, the CSV ends with a
    // whole row.
    assert!(of_type(&lines, "interval").len() >= 2, "{}", lines.len());
    assert!(csv_text.ends_with('\n'), "{csv_text:.200}");
    let columns = |l: &str| l.matches(',').count();
    let header = csv_text.lines().next().map_or(0, columns);
    assert!(
        csv_text.lines().all(|l| columns(l) == header),
        "a row cut short: {csv_text:.300}"
    );
    // Sampling went on: the recording (on another disk) has every interval.
    let report: Value = read_json(&out);
    let samples = u(&report, "/profiler/samples");
    assert!(samples >= 35, "samples {samples}");
    assert!(
        samples as usize > of_type(&lines, "interval").len(),
        "the stream stopped before the end"
    );
    let errors = report["profiler"]["output_errors"]
        .as_array()
        .expect("errors");
    assert!(
        errors
            .iter()
            .any(|e| e.as_str().is_some_and(|e| e.contains("--jsonl"))),
        "{errors:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_rapl_zone_that_vanishes_and_returns_keeps_its_energy_and_every_interval() {
    require_ebpf!();
    let rapl = FakeRapl::start(40.0, 4.0);
    let dir = tempfile_dir();
    let stream = dir.join("s.jsonl");
    let mut child = Command::new(wattprof_bin())
        .args(["run", &rapl.arg(), "--interval", "200ms"])
        .arg("--jsonl")
        .arg(&stream)
        .arg("--output")
        .arg(dir.join("r.json"))
        .arg("--")
        .arg(testload_bin())
        .args(["cpu", "3"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    wait_for_stream_lines(&stream, "interval", 3);
    // The package zone (a directory of the fixture's sysfs) goes away for
    // a second, as when the driver is reloaded; its counter runs on.
    let zone = rapl.sys.join("class/powercap/intel-rapl:0");
    let away = rapl.sys.join("class/powercap/away");
    std::fs::rename(&zone, &away).expect("hide the zone");
    std::thread::sleep(Duration::from_millis(1000));
    std::fs::rename(&away, &zone).expect("bring it back");
    let status = child.wait().expect("run");
    assert!(status.success());
    let report = read_json(&dir.join("r.json"));
    let lines = stream_lines(&stream);
    let intervals = of_type(&lines, "interval");
    // No interval is missing: each starts where the last one ended.
    let mut t = 0;
    for iv in &intervals {
        assert_eq!(u(iv, "/t_ns") - u(iv, "/duration_ns"), t, "{iv}");
        t = u(iv, "/t_ns");
    }
    // The intervals the zone was gone have no package row; the first one
    // back covers them (covers_ns) with their energy.
    let package = |iv: &Value| -> Option<Value> {
        iv["domains"]
            .as_array()?
            .iter()
            .find(|d| d["domain"] == "package")
            .cloned()
    };
    let missing = intervals.iter().filter(|iv| package(iv).is_none()).count();
    assert!(missing >= 3, "{missing} intervals without the package");
    let back = intervals
        .iter()
        .filter_map(|iv| package(iv))
        .find(|d| d.get("covers_ns").is_some())
        .expect("an interval covering the missed ones");
    assert!(u(&back, "/covers_ns") >= 800_000_000, "{back}");
    // Every joule of the fixture's 40 W is measured over the run.
    let measured = f(domain(&report, "package", Some(0)), "/measured_j");
    let expected = 40.0 * u(&report, "/wall_ns") as f64 / 1e9;
    assert!(
        (measured - expected).abs() / expected < 0.03,
        "{measured} J measured, {expected} J at 40 W"
    );
    assert!(
        problems(&report).contains("vanished"),
        "{}",
        problems(&report)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_gpu_lost_mid_run_is_reported_and_sampling_goes_on() {
    require_ebpf!();
    let lib = nvml_stub(
        "gpu name=A uuid=GPU-0 power_mw=60000 energy=counter\n\
         gpu name=B uuid=GPU-1 power_mw=90000 energy=counter lost_after=15\n",
    );
    let dir = tempfile_dir();
    let out = dir.join("r.json");
    let run = Command::new(wattprof_bin())
        .args(["run", "--interval", "100ms"])
        .arg(format!("--nvml-lib={}", lib.display()))
        .arg("--output")
        .arg(&out)
        .arg("--")
        .arg(testload_bin())
        .args(["cpu", "1.5"])
        .stdout(Stdio::null())
        .output()
        .expect("run");
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report = read_json(&out);
    assert!(problems(&report).contains("lost"), "{}", problems(&report));
    let gpu = |i: u64| {
        report["energy"]["domains"]
            .as_array()
            .and_then(|d| {
                d.iter()
                    .find(|d| d["domain"] == "gpu" && d["package"] == i)
                    .cloned()
            })
            .unwrap_or_else(|| panic!("GPU {i} in {}", report["energy"]["domains"]))
    };
    // GPU 0 is read to the end; GPU 1 until it was lost. Each is its
    // power over the intervals that read it: the counters are read just
    // before the tracker's walk and each interval's end is taken after
    // it, and those offsets cancel but for the first and last: on a
    // loaded machine a walk can be preempted for ~10 ms, 2% of the 0.5 s
    // GPU 1 lives, so 5%.
    let intervals = report["intervals"].as_array().expect("intervals");
    let read = |i: u64| -> (f64, f64, usize) {
        let (mut j, mut s, mut n) = (0.0, 0.0, 0);
        for iv in intervals {
            let d = iv["domains"].as_array().expect("domains");
            if let Some(g) = d.iter().find(|d| d["domain"] == "gpu" && d["package"] == i) {
                j += f(g, "/measured_j");
                s += u(iv, "/duration_ns") as f64 / 1e9;
                n += 1;
            }
        }
        (j, s, n)
    };
    for (i, watts) in [(0, 60.0), (1, 90.0)] {
        let total = f(&gpu(i), "/measured_j");
        let (j, s, n) = read(i);
        eprintln!("GPU {i}: {total} J in total, {j} J over {n} intervals of {s:.4} s");
        // The total is the intervals' sum (µJ rounding each).
        assert!((total - j).abs() <= 1e-6 * (n as f64 + 1.0), "GPU {i}");
        let err = (total / (watts * s) - 1.0).abs();
        assert!(
            err < 0.05,
            "GPU {i}: {total} J over {s} s at {watts} W ({err})"
        );
    }
    let wall = u(&report, "/wall_ns") as f64 / 1e9;
    let (_, lived, _) = read(1);
    assert!(
        lived > 0.0 && lived < 0.7 * wall,
        "GPU 1 read for {lived} s of {wall}"
    );
    assert!(u(&report, "/profiler/samples") >= 12);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn stopped_for_ten_seconds_while_5000_processes_come_and_go_nothing_is_lost_silently() {
    require_ebpf!();
    let dir = tempfile_dir();
    let out = dir.join("r.json");
    let go = dir.join("go");
    // The command waits for `go`, then runs 5,000 short processes.
    let script = format!(
        "while [ ! -e {go} ]; do sleep 0.01; done; i=0; \
         while [ $i -lt 5000 ]; do /bin/true; i=$((i+1)); done",
        go = go.display()
    );
    let child = Command::new(wattprof_bin())
        .args(["run", "--interval", "100ms"])
        .arg("--output")
        .arg(&out)
        .args(["--", "sh", "-c", &script])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run");
    std::thread::sleep(Duration::from_millis(1500));
    signal(&child, libc::SIGSTOP);
    std::fs::write(&go, "").expect("go");
    std::thread::sleep(Duration::from_secs(10));
    signal(&child, libc::SIGCONT);
    let run = wait_output(child);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    let report = read_json(&out);
    let trues = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["comm"] == "true")
        .count();
    let lost = u(&report, "/profiler/events_lost");
    eprintln!(
        "{trues} `true` processes counted of {}, {lost} events lost",
        u(&report, "/command/processes")
    );
    // A `true` whose exec record the kernel did not run the program for
    // (see docs/limits.md, "Guarantees") keeps its fork's name, `sh`: counted all
    // the same. The script's own shell is the other `sh`.
    let shells = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["comm"] == "sh")
        .count();
    if trues != 5000 {
        for p in report["processes"].as_array().into_iter().flatten() {
            if p["comm"] != "true" && p["comm"] != "sleep" {
                eprintln!("not a `true`: {p}");
            }
        }
    }
    // Every one of the 5,000 `true`s, or the loss is counted.
    assert!(
        trues + shells.saturating_sub(1) == 5000 || lost > 0,
        "{trues} `true` processes, {shells} `sh`, and no loss reported"
    );
    assert!(
        trues >= 4990 || lost > 0,
        "{trues} `true` processes named: more than a few exec records missed"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

fn wait_output(child: Child) -> Output {
    child.wait_with_output().expect("wait")
}

/// Moves the system clock by `by_s` and back when dropped (by the
/// monotonic time elapsed, so the clock ends where it would have been).
struct ClockJump {
    by_ns: i128,
}

fn realtime_ns() -> i128 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid timespec to write to.
    unsafe { libc::clock_gettime(libc::CLOCK_REALTIME, &mut ts) };
    i128::from(ts.tv_sec) * 1_000_000_000 + i128::from(ts.tv_nsec)
}

fn set_realtime_ns(ns: i128) -> bool {
    let ts = libc::timespec {
        tv_sec: (ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (ns % 1_000_000_000) as libc::c_long,
    };
    // SAFETY: a valid timespec; needs CAP_SYS_TIME.
    unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) == 0 }
}

impl ClockJump {
    fn by(by_s: i64) -> Option<Self> {
        let by_ns = i128::from(by_s) * 1_000_000_000;
        set_realtime_ns(realtime_ns() + by_ns).then_some(Self { by_ns })
    }
}

impl Drop for ClockJump {
    fn drop(&mut self) {
        let _ = set_realtime_ns(realtime_ns() - self.by_ns);
    }
}

#[test]
fn a_wall_clock_jump_does_not_stretch_intervals_and_is_reported() {
    require_ebpf!();
    let dir = tempfile_dir();
    let stream = dir.join("s.jsonl");
    let out = dir.join("m.json");
    let started = Instant::now();
    let mut child = monitor(&["--interval", "200ms", "--duration", "3s"])
        .arg("--jsonl")
        .arg(&stream)
        .arg("--output")
        .arg(&out)
        .stderr(Stdio::piped())
        .spawn()
        .expect("monitor");
    wait_for_stream_lines(&stream, "interval", 3);
    let Some(jump) = ClockJump::by(3600) else {
        signal(&child, libc::SIGINT);
        let _ = child.wait();
        wattprof_tests::say_skip("cannot set the clock (CAP_SYS_TIME)");
        return;
    };
    std::thread::sleep(Duration::from_millis(600));
    drop(jump);
    let status = child.wait().expect("monitor");
    let took = started.elapsed();
    assert!(status.success());
    // --duration is monotonic: neither cut short nor stretched.
    assert!(took < Duration::from_secs(8), "{took:?}");
    let lines = stream_lines(&stream);
    let intervals = of_type(&lines, "interval");
    assert!(intervals.len() >= 13, "{}", intervals.len());
    for iv in &intervals {
        let d = u(iv, "/duration_ns");
        assert!(d < 1_000_000_000, "an interval of {d} ns: {iv:.300}");
    }
    let report = read_json(&out);
    let said = problems(&report);
    // Forward, then back.
    assert!(said.contains("jumped +3600"), "{said}");
    assert!(said.contains("jumped -3600"), "{said}");
    assert!(u(&report, "/wall_ns") < 4_000_000_000);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn after_sigkill_the_stream_is_valid_and_a_restart_works() {
    require_ebpf!();
    let dir = tempfile_dir();
    let stream = dir.join("s.jsonl");
    let start = |stream: &PathBuf| {
        monitor(&["--interval", "100ms"])
            .arg("--jsonl")
            .arg(stream)
            .stderr(Stdio::piped())
            .spawn()
            .expect("monitor")
    };
    let mut first = start(&stream);
    wait_for_stream_lines(&stream, "interval", 5);
    signal(&first, libc::SIGKILL);
    let _ = first.wait();
    let lines = stream_lines(&stream);
    assert_eq!(lines[0]["type"], "header");
    assert!(of_type(&lines, "interval").len() >= 5);
    // `wattprof report` reads it as a cut stream.
    let report = Command::new(wattprof_bin())
        .arg("report")
        .arg(&stream)
        .output()
        .expect("report");
    assert!(
        report.status.success(),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    assert!(
        String::from_utf8_lossy(&report.stdout).contains("cut")
            || String::from_utf8_lossy(&report.stderr).contains("cut"),
        "{}",
        String::from_utf8_lossy(&report.stderr)
    );
    // Nothing the killed one left behind stops a new one (on the same
    // path: the old stream is moved aside to wait for the new one's lines).
    std::fs::rename(&stream, dir.join("killed.jsonl")).expect("move aside");
    let second = start(&stream);
    wait_for_stream_lines(&stream, "interval", 3);
    signal(&second, libc::SIGINT);
    let out = wait_output(second);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = stream_lines(&stream);
    assert_eq!(
        lines.last().map(|l| l["type"].clone()),
        Some("summary".into())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn two_instances_at_once_both_count_every_cpu_second() {
    require_ebpf!();
    let dir = tempfile_dir();
    let rapl = FakeRapl::start(40.0, 4.0);
    let stream = dir.join("m.jsonl");
    let out_m = dir.join("m.json");
    let mon = monitor(&[&rapl.arg(), "--interval", "200ms"])
        .arg("--jsonl")
        .arg(&stream)
        .arg("--output")
        .arg(&out_m)
        .stderr(Stdio::piped())
        .spawn()
        .expect("monitor");
    wait_for_stream_header(&stream);
    let out_r = dir.join("r.json");
    let run = Command::new(wattprof_bin())
        .args(["run", &rapl.arg(), "--interval", "200ms"])
        .arg("--output")
        .arg(&out_r)
        .arg("--")
        .arg(testload_bin())
        .args(["cpu", "1"])
        .stdout(Stdio::null())
        .output()
        .expect("run");
    signal(&mon, libc::SIGINT);
    let mon_out = wait_output(mon);
    assert!(
        run.status.success(),
        "{}",
        String::from_utf8_lossy(&run.stderr)
    );
    assert!(
        mon_out.status.success(),
        "{}",
        String::from_utf8_lossy(&mon_out.stderr)
    );
    let r = read_json(&out_r);
    let m = read_json(&out_m);
    // The run saw its command's second of CPU.
    let tree = u(&r, "/command/on_cpu_ns");
    assert!((950_000_000..1_200_000_000).contains(&tree), "{tree}");
    // The monitor, running at the same time, counted that second too:
    // each instance's tracker counts every CPU's busy time in full.
    let busy = u(&m, "/machine/busy_ns");
    assert!(busy >= 950_000_000, "monitor busy {busy}");
    let _ = std::fs::remove_dir_all(&dir);
}
