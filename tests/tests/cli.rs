//! `wattprof run` as a user meets it: exit codes, errors with hints, signals,
//! dropping root to the sudo user. Tests that load eBPF need root.

use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use wattprof_tests::{nvml_stub, require_ebpf, tempfile_dir, u, wattprof_bin, wattprof_run};

fn wattprof(args: &[&str]) -> std::process::Output {
    Command::new(wattprof_bin())
        .args(args)
        .output()
        .expect("start wattprof")
}

/// One line on stderr, starting with `wattprof:`, and no panic.
fn assert_one_line_error(out: &std::process::Output, code: i32, needle: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "stderr: {err}");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line expected: {err}");
    assert!(lines[0].starts_with("wattprof: "), "{err}");
    assert!(lines[0].contains(needle), "`{needle}` not in: {err}");
}

#[test]
fn command_not_found_is_127_with_a_hint() {
    let out = wattprof(&["run", "--", "no-such-command-wattprof"]);
    assert_one_line_error(&out, 127, "command not found: no-such-command-wattprof");
    let out = wattprof(&["run", "--", "/nonexistent/tool"]);
    assert_one_line_error(&out, 127, "no such file");
}

#[test]
fn command_not_executable_is_126() {
    let dir = tempfile_dir();
    let script = dir.join("script.sh");
    std::fs::write(&script, "#!/bin/sh\necho hi\n").expect("write");
    let out = wattprof(&["run", "--", script.to_str().expect("utf-8")]);
    assert_one_line_error(&out, 126, "not an executable file");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn unwritable_output_fails_before_the_command_runs() {
    let dir = tempfile_dir();
    let marker = dir.join("ran");
    let out = wattprof(&[
        "run",
        "--output",
        "/nonexistent-dir/run.json",
        "--",
        "touch",
        marker.to_str().expect("utf-8"),
    ]);
    assert_one_line_error(&out, 125, "cannot write --output /nonexistent-dir/run.json");
    assert!(!marker.exists(), "the command must not have run");
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn bad_arguments_are_usage_errors() {
    for args in [
        &["run", "--interval", "5", "--", "true"][..],
        &["run", "--interval", "1ms", "--", "true"],
        &["run"],
        &["run", "--max-tasks", "0", "--", "true"],
        &["frobnicate"],
    ] {
        let out = wattprof(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(!err.contains("panicked"), "{err}");
    }
    // An unknown option before `--` is an unknown option, with the usage,
    // not a command to run (it once answered "command not found", 127);
    // after `--`, or after the command, options are the command's.
    let out = wattprof(&["run", "--bogus", "--", "true"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("unexpected argument '--bogus'"), "{err}");
    assert!(err.contains("Usage: wattprof run"), "{err}");
    let help = wattprof(&["run", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "--interval",
        "--output",
        "--as-root",
        "--max-tasks",
        "Exit status",
        "--stacks",
        "--flamegraph",
    ] {
        assert!(text.contains(needle), "help lacks {needle}: {text}");
    }
}

#[test]
fn a_bad_web_config_fails_before_anything_starts() {
    let dir = wattprof_tests::tempfile_dir();
    let bad = dir.join("web.yml");
    std::fs::write(&bad, "basic_auth_users:\n  prom: hunter2\n").expect("write");
    let bad = bad.to_str().expect("utf-8");
    let out = wattprof(&["monitor", "--prometheus", "0", "--web-config", bad]);
    assert_one_line_error(&out, 2, "not a bcrypt hash");
    let out = wattprof(&[
        "monitor",
        "--prometheus",
        "0",
        "--web-config",
        "/nonexistent.yml",
    ]);
    assert_one_line_error(&out, 2, "/nonexistent.yml: cannot read");
    let out = wattprof(&["monitor", "--web-config", bad]);
    assert_one_line_error(&out, 2, "give --prometheus");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn not_root_is_a_clear_error() {
    let bin = wattprof_tests::executable_by_others(&wattprof_bin());
    let out = Command::new(&bin.path)
        .args(["run", "--", "true"])
        .uid(65534)
        .gid(65534)
        .output()
        .expect("start wattprof as nobody");
    assert_one_line_error(&out, 125, "missing CAP_BPF and CAP_PERFMON");
}

#[test]
fn exit_code_and_killing_signal_are_passed_through() {
    require_ebpf!();
    let run = wattprof_run(&[], &["sh", "-c", "exit 7"]);
    assert_eq!(run.output.status.code(), Some(7));
    assert_eq!(u(run.report(), "/command/exit_code"), 7);
    let run = wattprof_run(&[], &["sh", "-c", "kill -9 $$"]);
    assert_eq!(run.output.status.code(), Some(137));
    assert_eq!(u(run.report(), "/command/signal"), 9);
}

#[test]
fn sigterm_to_wattprof_reaches_the_command_and_the_report_is_written() {
    require_ebpf!();
    let dir = tempfile_dir();
    let out = dir.join("run.json");
    let mut wp = Command::new(wattprof_bin())
        .args([
            "run",
            "--output",
            out.to_str().expect("utf-8"),
            "--",
            "sleep",
            "30",
        ])
        .stderr(Stdio::piped())
        .spawn()
        .expect("start wattprof");
    // Wait until the command is running under wattprof.
    let children = format!("/proc/{}/task/{}/children", wp.id(), wp.id());
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::fs::read_to_string(&children)
        .unwrap_or_default()
        .trim()
        .is_empty()
    {
        assert!(Instant::now() < deadline, "command never started");
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: signalling a child we started.
    unsafe { libc::kill(wp.id() as i32, libc::SIGTERM) };
    let status = wp.wait().expect("wait");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out).expect("report written")).expect("json");
    assert_eq!(u(&report, "/command/signal"), libc::SIGTERM as u64);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn under_sudo_the_command_runs_as_the_invoking_user() {
    require_ebpf!();
    let run_with = |extra: &[&str]| {
        Command::new(wattprof_bin())
            .arg("run")
            .args(extra)
            .args(["--", "sh", "-c", "id -u; id -g; echo $HOME"])
            .env("SUDO_UID", "65534")
            .env("SUDO_GID", "65534")
            .output()
            .expect("start wattprof")
    };
    let out = run_with(&[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(&lines[..2], &["65534", "65534"], "{text}");
    let out = run_with(&["--as-root"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(text.lines().next(), Some("0"), "{text}");
}

#[test]
fn tracefs_is_mounted_when_missing() {
    require_ebpf!();
    // In a private mount namespace, so the machine's mounts are untouched.
    let script = format!(
        "umount /sys/kernel/tracing 2>/dev/null; umount /sys/kernel/debug/tracing 2>/dev/null; \
         umount /sys/kernel/debug 2>/dev/null; \
         test -d /sys/kernel/tracing/events && exit 99; '{}' run -- true",
        wattprof_bin().display()
    );
    let out = Command::new("unshare")
        .args(["--mount", "--propagation", "private", "sh", "-c", &script])
        .output()
        .expect("unshare");
    let err = String::from_utf8_lossy(&out.stderr);
    if out.status.code() == Some(99) {
        wattprof_tests::say_skip("tracefs could not be unmounted here");
        return;
    }
    assert!(out.status.success(), "{err}");
    assert!(err.contains("command tree"), "{err}");
}

#[test]
fn sources_lists_every_reader_with_findings_or_a_reason() {
    for json in [true, false] {
        let args: &[&str] = if json {
            &["sources", "--json"]
        } else {
            &["sources"]
        };
        let out = wattprof(args);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        if !json {
            assert!(
                text.starts_with("CPU energy readers, in order of preference:"),
                "{text}"
            );
            continue;
        }
        let report: serde_json::Value = serde_json::from_str(&text).expect("json");
        let readers = report["readers"].as_array().expect("readers");
        let names: Vec<&str> = readers.iter().filter_map(|r| r["name"].as_str()).collect();
        assert_eq!(names, ["powercap", "perf", "msr", "estimate"]);
        for r in readers {
            match r["status"].as_str() {
                Some("in_use" | "available") => assert!(r["info"].is_object(), "{r}"),
                Some("missing") => assert!(r["reason"].is_string(), "{r}"),
                other => panic!("status {other:?}"),
            }
        }
        let in_use = readers.iter().find(|r| r["status"] == "in_use");
        assert_eq!(
            in_use.map(|r| &r["name"]),
            report.get("cpu_energy_reader").filter(|v| !v.is_null())
        );
    }
}

#[test]
fn sources_estimates_from_tdp_only_where_nothing_measures() {
    let out = wattprof(&["sources", "--json", "--cpu-tdp", "100"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let readers = report["readers"].as_array().expect("readers");
    let measured = readers[..3].iter().any(|r| r["status"] != "missing");
    let expected = if measured {
        report["readers"][0]["name"].clone()
    } else {
        "estimate".into()
    };
    let chosen = &report["cpu_energy_reader"];
    if measured {
        assert_ne!(chosen, "estimate", "a measured reader must win");
    } else {
        assert_eq!(chosen, &expected);
        let text = String::from_utf8_lossy(&wattprof(&["sources", "--cpu-tdp", "100"]).stdout)
            .into_owned();
        assert!(text.contains("CPU energy is ESTIMATED"), "{text}");
    }
    let out = wattprof(&["sources", "--cpu-tdp", "0"]);
    assert_eq!(out.status.code(), Some(2));
}

#[test]
fn sources_reads_a_wattmeter_log_and_rejects_a_wrong_outlet() {
    let dir = tempfile_dir();
    let log = dir.join("wm.log");
    let mut text = String::from(
        "#timestamp,#frame_is_ok,#U1,#U2,#U3,#current1,#activepow1,#current2,#activepow2\n",
    );
    // 2 s at 150 W on outlet 2, 100 frames/s, with bad frames mixed in.
    for k in 0..=200 {
        let ts = 1_671_527_189.0 + f64::from(k) * 0.01;
        text.push_str(&format!("{ts:.6},true,231.0,0.0,0.0,0.2,40.0,0.7,150.0\n"));
        if k % 50 == 0 {
            text.push_str(&format!("{:.6},false,,,,,,,\n", ts + 0.005));
            text.push_str("\u{fffd}garbage,,\n");
        }
    }
    std::fs::write(&log, text).expect("write log");
    let path = log.to_str().expect("utf-8");
    let out = wattprof(&[
        "sources",
        "--json",
        "--wattmeter-log",
        path,
        "--wattmeter-socket",
        "2",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let w = &report["wattmeter"];
    assert!(
        (w["energy_j"].as_f64().expect("energy") - 300.0).abs() < 1e-3,
        "{w}"
    );
    assert_eq!(u(w, "/stats/frames_ok"), 201);
    assert_eq!(u(w, "/stats/frames_not_ok"), 5);
    assert_eq!(u(w, "/stats/malformed_lines"), 5);
    let out = wattprof(&[
        "sources",
        "--wattmeter-log",
        path,
        "--wattmeter-socket",
        "3",
    ]);
    assert_one_line_error(&out, 125, "no good frame for outlet 3");
    // The same frames from a command wattprof starts, reads and stops.
    let script = dir.join("wattmetre-read");
    std::fs::write(&script, format!("#!/bin/sh\ncat '{path}'\nexec sleep 30\n")).expect("script");
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    let cmd = format!("{} --tty=/dev/ttyUSB0 --nb=2", script.display());
    let out = wattprof(&[
        "sources",
        "--json",
        "--wattmeter-cmd",
        &cmd,
        "--wattmeter-socket",
        "2",
        "--check",
        "500ms",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert!((report["wattmeter"]["energy_j"].as_f64().expect("energy") - 300.0).abs() < 1e-3);
    let out = wattprof(&["sources", "--wattmeter-log", "/nonexistent.log"]);
    assert_one_line_error(&out, 125, "cannot open wattmeter log /nonexistent.log");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        err.matches("/nonexistent.log").count(),
        1,
        "path said once: {err}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn sources_lists_gpus_through_nvml() {
    let lib = nvml_stub(
        "gpu name=NVIDIA-H100 uuid=GPU-aaaa power_mw=250000 energy=counter memory_total=85899345920\n\
         gpu name=Tesla-P100 uuid=GPU-bbbb power_mw=50000 energy=unsupported mig=1\n",
    );
    let out = wattprof(&[
        "sources",
        "--json",
        "--nvml-lib",
        lib.to_str().expect("utf-8"),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["gpu"]["status"], "in_use");
    let gpus = report["gpu"]["gpus"].as_array().expect("gpus");
    assert_eq!(gpus[0]["method"], "energy_counter");
    assert_eq!(gpus[1]["method"], "power_integration");
    assert_eq!(gpus[1]["mig"], true);
    // Without a driver it is a status, and wattprof still succeeds.
    let out = wattprof(&[
        "sources",
        "--json",
        "--nvml-lib",
        "/nonexistent/libnvidia-ml.so.1",
    ]);
    assert!(out.status.success());
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(report["gpu"]["status"], "missing");
    assert_eq!(report["gpu"]["reason"], "no NVIDIA driver found");
}

#[test]
fn bad_energy_options_fail_before_anything_starts() {
    let dir = tempfile_dir();
    let marker = dir.join("ran");
    let m = marker.to_str().expect("utf-8");
    for (args, needle, code) in [
        (
            &["run", "--country", "XYZ", "--", "touch", m][..],
            "--country XYZ",
            2,
        ),
        (
            &["run", "--carbon-intensity", "-5", "--", "touch", m],
            "--carbon-intensity -5",
            2,
        ),
        (
            &[
                "run",
                "--power-model",
                "none",
                "--cpu-tdp",
                "100",
                "--",
                "touch",
                m,
            ],
            "--power-model none asks for none",
            2,
        ),
        (
            &[
                "run",
                "--power-model",
                "tdp",
                "--vcpu-watts",
                "1,3",
                "--",
                "touch",
                m,
            ],
            "not --power-model tdp",
            2,
        ),
        (
            &[
                "run",
                "--jsonl",
                "/nonexistent-dir/x.jsonl",
                "--",
                "touch",
                m,
            ],
            "cannot write --jsonl /nonexistent-dir/x.jsonl",
            125,
        ),
        (
            &["monitor", "--jsonl", "/nonexistent-dir/x.jsonl"],
            "cannot write --jsonl",
            125,
        ),
        (
            &[
                "run",
                "--wattmeter-log",
                "/nonexistent-dir/wm.log",
                "--",
                "touch",
                m,
            ],
            "/nonexistent-dir/wm.log",
            125,
        ),
    ] {
        let out = wattprof(args);
        assert_one_line_error(&out, code, needle);
        assert!(!marker.exists(), "{args:?}: the command must not have run");
    }
    let out = wattprof(&["monitor", "--duration", "5x"]);
    assert_eq!(out.status.code(), Some(2));
    // Values no model takes are usage errors, before anything starts.
    for args in [
        &["run", "--cpu-tdp", "0", "--", "touch", m][..],
        &["run", "--vcpu-watts", "3,1", "--", "touch", m],
        &["run", "--power-model", "magic", "--", "touch", m],
    ] {
        let out = wattprof(args);
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(!marker.exists(), "{args:?}: the command must not have run");
    }
    let help = wattprof(&["monitor", "--help"]);
    let text = String::from_utf8_lossy(&help.stdout);
    for needle in [
        "--interval",
        "--pid",
        "--top",
        "--jsonl",
        "--country",
        "Ctrl-C",
    ] {
        assert!(text.contains(needle), "help lacks {needle}: {text}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn under_sudo_the_command_can_send_window_messages() {
    require_ebpf!();
    // The command runs as nobody: the socket must be theirs to write.
    let load = wattprof_tests::executable_by_others(&wattprof_tests::testload_bin());
    let load = &load.path;
    let out = Command::new(wattprof_bin())
        .args([
            "run",
            "--",
            load.to_str().expect("utf-8"),
            "window",
            "w",
            "0.2",
        ])
        .env("SUDO_UID", "65534")
        .env("SUDO_GID", "65534")
        .output()
        .expect("start wattprof");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("WINDOW"), "{err}");
}

#[test]
fn monitor_reports_a_burner_per_process_and_per_cgroup_until_its_duration() {
    require_ebpf!();
    let rapl = wattprof_tests::FakeRapl::start(30.0, 3.0);
    let dir = tempfile_dir();
    let out_file = dir.join("m.json");
    let mut burner = Command::new(wattprof_tests::testload_bin())
        .args(["burn", "3", "0.5"])
        .stdout(Stdio::null())
        .spawn()
        .expect("burner");
    let started = Instant::now();
    let out = Command::new(wattprof_bin())
        .args([
            "monitor",
            &rapl.arg(),
            "--duration",
            "1500ms",
            "--interval",
            "250ms",
        ])
        .arg("--output")
        .arg(&out_file)
        .output()
        .expect("monitor");
    let took = started.elapsed();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let report: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&out_file).expect("recording")).expect("JSON");
    wattprof_tests::schema::assert_valid("recording", &report);
    assert_eq!(report["mode"], "monitor");
    // It stops at its duration: the span it measured is 1.5 s (plus
    // whatever the tick running at the deadline took: one took 0.5 s in a
    // full test run here), closed by at most six 250 ms intervals (not a
    // seventh of a few ms after the deadline; a late tick skips the ones
    // it missed). The wall time around it adds the debug build's start-up
    // (~0.7 s here, more on a loaded machine): only a loose bound.
    let wall_ns = u(&report, "/wall_ns");
    let spans: Vec<(u64, u64)> = report["intervals"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|iv| {
            (
                u(iv, "/t_ns") / 1_000_000,
                u(iv, "/duration_ns") / 1_000_000,
            )
        })
        .collect();
    assert!(
        (1_500_000_000..2_500_000_000).contains(&wall_ns),
        "{wall_ns} ns; intervals (end, length in ms): {spans:?}"
    );
    let samples = u(&report, "/profiler/samples");
    assert!((4..=6).contains(&samples), "{}", report["profiler"]);
    // Only that it does not hang: on this VM a whole run has taken 2 to
    // 11 s of wall time around the same 1.5 s span.
    assert!(took < Duration::from_secs(60), "{took:?}");
    assert!(report["command"].is_null());
    let pid = u64::from(burner.id());
    let p = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("burner not in {}", report["processes"]));
    let pkg = p["energy"]["package_j"].as_f64().expect("package_j");
    // About half a CPU of two for 1.5 s at 30 W: ~11 J.
    eprintln!("monitor: burner {pkg:.3} J");
    assert!(pkg > 5.0 && pkg < 17.0, "{pkg}");
    let cgroups = report["cgroups"].as_array().expect("cgroups");
    assert!(!cgroups.is_empty());
    let cg_total: f64 = cgroups
        .iter()
        .map(|c| c["energy"]["package_j"].as_f64().unwrap_or(0.0))
        .sum();
    let attributed = wattprof_tests::f(
        wattprof_tests::domain(&report, "package", Some(0)),
        "/attributed_j",
    );
    assert!(
        (cg_total - attributed).abs() < 1e-3,
        "{cg_total} vs {attributed}"
    );
    assert_eq!(u(&report, "/profiler/max_tasks"), 65536);
    let _ = burner.kill();
    let _ = burner.wait();
    let _ = std::fs::remove_dir_all(dir);
}
