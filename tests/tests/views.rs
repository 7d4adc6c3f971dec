//! Every view tells the same truth: who used the energy is kept by
//! `monitor` (exited processes too) in the final table, the recording,
//! `report` and the HTML page. Needs root.

use std::process::{Command, Stdio};

use wattprof_tests::{
    read_json, require_ebpf, tempfile_dir, testload_bin, u, wait_for_stream_header, wattprof_bin,
};

/// `wattprof report REC --html HTML`: the page.
fn html_page(rec: &std::path::Path, html: &std::path::Path) -> String {
    let r = Command::new(wattprof_bin())
        .arg("report")
        .arg(rec)
        .arg("--html")
        .arg(html)
        .output()
        .expect("report --html");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    std::fs::read_to_string(html).expect("html")
}

#[test]
fn monitor_keeps_a_burner_that_exited_before_the_end_in_every_view() {
    require_ebpf!();
    let dir = tempfile_dir();
    let (rec, stream, html) = (
        dir.join("mon.json"),
        dir.join("mon.jsonl"),
        dir.join("mon.html"),
    );
    let monitor = Command::new(wattprof_bin())
        .args([
            "monitor",
            "--interval",
            "250ms",
            "--host-model",
            "none",
            "--no-gpu",
        ])
        .arg("--output")
        .arg(&rec)
        .arg("--jsonl")
        .arg(&stream)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr")).expect("stderr file"))
        .spawn()
        .expect("monitor");
    wait_for_stream_header(&stream);
    // A burner of 1.5 s that is gone 2 s before the monitor stops (its
    // record is forgotten by the table a few intervals after its exit).
    let out = Command::new(testload_bin())
        .args(["cpu", "1.5"])
        .output()
        .expect("burner");
    let pid = serde_json::from_slice::<serde_json::Value>(&out.stdout).map_or(0, |v| u(&v, "/pid"));
    assert!(pid > 0, "{}", String::from_utf8_lossy(&out.stdout));
    std::thread::sleep(std::time::Duration::from_millis(2000));
    // SAFETY: kill(2) on the monitor this test started.
    unsafe { libc::kill(monitor.id() as libc::pid_t, libc::SIGINT) };
    let out = monitor.wait_with_output().expect("monitor");
    // The final table is on stderr (stdout is for machine output).
    let table = std::fs::read_to_string(dir.join("stderr")).unwrap_or_default();
    assert!(out.status.success(), "{table}");
    // The recording: its row, its energy, its exit.
    let report = read_json(&rec);
    let row = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("the burner {pid} is not in the recording"));
    assert_eq!(row["comm"], "wp-cpu", "{row}");
    assert!(row["exit_ns"].is_u64(), "{row}");
    let j = row["energy"]["total_j"].as_f64().unwrap_or(0.0);
    let cpu_s = u(row, "/on_cpu_ns") as f64 / 1e9;
    assert!(j > 0.0 && cpu_s > 1.3, "{row}");
    // No row anywhere has an empty name: the kernel's threads by theirs,
    // processes first seen through a thread other than their leader by
    // /proc, else [PID].
    for p in report["processes"].as_array().expect("processes") {
        assert!(p["comm"].as_str().is_some_and(|c| !c.is_empty()), "{p}");
    }
    // The final table names it.
    assert!(
        table.contains(&pid.to_string()) && table.contains("wp-cpu"),
        "the final table does not name {pid} ({} bytes):\n{table}",
        table.len()
    );
    // So do `report` of the recording, of the stream, and the HTML page.
    for input in [&rec, &stream] {
        let r = Command::new(wattprof_bin())
            .arg("report")
            .arg(input)
            .output()
            .expect("report");
        let text = String::from_utf8_lossy(&r.stdout);
        assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
        assert!(
            text.contains(&pid.to_string()),
            "{} does not name the burner {pid}:\n{text}",
            input.display()
        );
    }
    let page = html_page(&rec, &html);
    assert!(
        page.contains(&pid.to_string()),
        "the HTML page does not name {pid}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_input_is_one_wattprof_line_and_exit_2_in_every_subcommand() {
    for args in [
        &["frobnicate"][..],
        &["run", "--bogus", "--", "true"],
        &["run", "--country", "XYZ", "--", "true"],
        &["run", "--carbon-intensity", "-5", "--", "true"],
        &["run", "--carbon-intensity", "abc", "--", "true"],
        &["run", "--cgroup", "system.slice", "--", "true"],
        &["monitor", "--country", "XYZ"],
        &["monitor", "--carbon-intensity", "-5"],
        &["monitor", "--pid", "999999999"],
        &["monitor", "--interval", "5x"],
        &["report"],
        &["report", "--bogus", "x.json"],
        &["sources", "--bogus"],
        &["calibrate", "--step", "abc"],
        &[
            "calibrate",
            "--gpu-only",
            "--wattmeter-log",
            "/nonexistent.log",
        ],
        &["calibrate", "--gpu-only", "--no-gpu"],
    ] {
        let out = Command::new(wattprof_bin())
            .args(args)
            .output()
            .expect("wattprof");
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.lines()
                .next()
                .is_some_and(|l| l.starts_with("wattprof: ")),
            "{args:?}: the first line is not `wattprof: ...`: {err}"
        );
        assert!(!err.contains("panicked"), "{args:?}: {err}");
    }
}

#[test]
fn calibrate_writes_the_host_model_where_wattprof_host_model_says() {
    let lib = wattprof_tests::nvml_stub(
        "gpu name=Stub uuid=GPU-6a3c0f0e-1b2d-4c5e-8f90-0123456789ab energy=counter \
         energy_step_ms=100 load=60000:30000:1000 memory_total=1000 memory_used=0\n",
    );
    let model = tempfile_dir().join("from-env.json");
    let out = Command::new(wattprof_bin())
        .args(["calibrate", "--gpu-only", "--step", "1s", "--nvml-lib"])
        .arg(&lib)
        .arg("--cuda-lib")
        .arg(&lib)
        .env("WATTPROF_HOST_MODEL", &model)
        .output()
        .expect("calibrate");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m = read_json(&model);
    let idle = m["gpus"][0]["idle_w"].as_f64().unwrap_or(0.0);
    assert!((idle / 60.0 - 1.0).abs() < 0.05, "{m}");
    assert!(said.contains(&model.display().to_string()), "{said}");
}

#[test]
fn report_of_an_estimate_against_a_counter_warns_and_lines_up_the_domains() {
    require_ebpf!();
    let dir = tempfile_dir();
    let (est, rapl) = (dir.join("est.json"), dir.join("rapl.json"));
    let t = testload_bin();
    let t = t.to_str().expect("utf-8");
    // A: the vCPU model's estimate (no counter); B: a RAPL counter.
    let run = |extra: &str, out: &std::path::Path| {
        let o = Command::new(wattprof_bin())
            .args(["run", extra, "--no-gpu", "--host-model", "none", "--output"])
            .arg(out)
            .args(["--", t, "cpu", "0.3"])
            .output()
            .expect("run");
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    };
    run("--energy-sysfs=/nonexistent", &est);
    let fixture = wattprof_tests::FakeRapl::start(40.0, 4.0);
    run(&fixture.arg(), &rapl);
    drop(fixture);
    let out = Command::new(wattprof_bin())
        .arg("report")
        .arg(&est)
        .arg(&rapl)
        .output()
        .expect("report");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(
            "warning: package energy is a model's estimate in A and measured by a counter in B"
        ),
        "{text}"
    );
    // One `package` row with both sides, not `package (machine)` against
    // `package 0`.
    let row = text
        .lines()
        .find(|l| l.trim_start().starts_with("package "))
        .unwrap_or_else(|| panic!("no package row: {text}"));
    assert!(
        !text.contains("package (machine)") && !text.contains("package 0"),
        "{text}"
    );
    assert!(!row.contains(" - "), "one side missing: {row}");
    assert!(text.contains("total, estimated in part"), "{text}");
    assert!(
        text.contains("A J/CPU-s"),
        "per CPU-second is said so: {text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sources_takes_the_options_run_takes_and_advises_what_fits_a_vm() {
    let json = |args: &[&str]| {
        let out = Command::new(wattprof_bin())
            .arg("sources")
            .args(args)
            .arg("--json")
            .output()
            .expect("sources");
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("JSON")
    };
    let r = json(&["--no-gpu"]);
    assert_eq!(r["gpu"]["status"], "disabled", "{r}");
    // A host's exported share, as a VM reads it.
    let fixture = wattprof_tests::FakeRapl::start(40.0, 4.0);
    let root = fixture.sys.join("class/powercap");
    let r = json(&["--no-gpu", "--powercap-root", root.to_str().expect("utf-8")]);
    assert_eq!(r["cpu_energy_reader"], "powercap", "{r}");
    assert!(r["advice"].is_null(), "measured: no advice needed: {r}");
    drop(fixture);
    // In a VM with no counter, the way to measured figures is said.
    let guest = std::fs::read_to_string("/proc/cpuinfo").is_ok_and(|c| c.contains(" hypervisor"));
    let r = json(&["--no-gpu"]);
    if guest && r["cpu_energy_reader"] == "estimate" {
        let advice = r["advice"].to_string();
        assert!(
            advice.contains("--vm-export") && advice.contains("--powercap-root"),
            "{r}"
        );
    }
    // Text: no sentence cut short.
    let out = Command::new(wattprof_bin())
        .args(["sources", "--no-gpu"])
        .output()
        .expect("sources");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("fits this host's\n"), "{text}");
}

#[test]
fn forty_shim_children_are_one_folded_row_and_all_shows_them() {
    require_ebpf!();
    let t = testload_bin();
    let script = format!(
        "for i in $(seq 40); do /bin/true; done; {} cpu 0.5",
        t.display()
    );
    let table = |extra: &[&str]| {
        let out = Command::new(wattprof_bin())
            .args(["run", "--no-gpu", "--host-model", "none"])
            .args(extra)
            .args(["--", "sh", "-c", &script])
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&out.stderr).into_owned();
        assert!(out.status.success(), "{err}");
        err
    };
    let folded = table(&[]);
    let rows = |t: &str| {
        t.lines()
            .filter(|l| l.split_whitespace().nth(2) == Some("true"))
            .count()
    };
    assert_eq!(rows(&folded), 0, "a row per shim: {folded}");
    assert!(
        folded
            .lines()
            .any(|l| l.contains(" true ") && l.contains("(40 processes,")),
        "no folded row: {folded}"
    );
    assert!(folded.contains("wp-cpu"), "{folded}");
    let all = table(&["--all"]);
    assert_eq!(rows(&all), 40, "{all}");
}

#[test]
fn the_html_page_says_what_the_text_says_and_draws_no_empty_plot() {
    require_ebpf!();
    let dir = tempfile_dir();
    let (rec, html) = (dir.join("run.json"), dir.join("run.html"));
    let t = testload_bin();
    let out = Command::new(wattprof_bin())
        .args([
            "run",
            "--no-gpu",
            "--host-model",
            "none",
            "--energy-sysfs=/nonexistent",
            "--output",
        ])
        .arg(&rec)
        .arg("--")
        .arg(&t)
        .args(["cpu", "0.5"])
        .output()
        .expect("run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = html_page(&rec, &html);
    for needle in [
        "command tree",
        "rest of the machine",
        "unattributed",
        "gCO2eq/kWh",
        "Energy readers",
        "(estimated)",
        "Estimated power per domain",
    ] {
        assert!(page.contains(needle), "the page lacks {needle:?}");
    }
    // No windows: no window plot, and nothing headed measured.
    assert!(!page.contains("Energy per window"), "an empty window plot");
    assert!(
        !page.contains("Measured power"),
        "an estimate headed measured"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every object in `v` that holds a process's, group's or window's
/// energy (it has `package_j`): none names a domain with no reader.
fn no_unread_field(v: &serde_json::Value, what: &str) -> usize {
    let mut seen = 0;
    match v {
        serde_json::Value::Object(m) => {
            if m.contains_key("package_j") {
                seen += 1;
                for k in ["dram_j", "gpu_j", "core_j"] {
                    assert!(
                        !m.contains_key(k),
                        "{what}: {k} written with no reader: {v}"
                    );
                }
            }
            seen += m.values().map(|x| no_unread_field(x, what)).sum::<usize>();
        }
        serde_json::Value::Array(a) => {
            seen += a.iter().map(|x| no_unread_field(x, what)).sum::<usize>();
        }
        _ => {}
    }
    seen
}

#[test]
fn workers_are_told_apart_by_command_line_and_no_reader_is_one_way_everywhere() {
    require_ebpf!();
    let dir = tempfile_dir();
    let (rec, stream, html) = (
        dir.join("run.json"),
        dir.join("run.jsonl"),
        dir.join("run.html"),
    );
    let t = testload_bin();
    // Two workers of one program, one name (`wp-cpu`), told apart by their
    // arguments. They live over an interval, so their exec is read while
    // they run.
    let script = format!("{t} cpu 1.3 & {t} cpu 1.45; wait", t = t.display());
    let out = Command::new(wattprof_bin())
        .args(["run", "--no-gpu", "--host-model", "none", "--cmdline"])
        .args(["--energy-sysfs=/nonexistent", "--interval", "250ms"])
        .arg("--output")
        .arg(&rec)
        .arg("--jsonl")
        .arg(&stream)
        .args(["--", "sh", "-c", &script])
        .output()
        .expect("run");
    let table = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{table}");
    // The table: a COMMAND LINE column, each worker on its row with its
    // arguments.
    assert!(table.contains("COMMAND LINE"), "{table}");
    for arg in ["cpu 1.3", "cpu 1.45"] {
        assert!(
            table
                .lines()
                .any(|l| l.contains(" wp-cpu ") && l.ends_with(arg)),
            "no wp-cpu row ends with `{arg}`:\n{table}"
        );
    }
    // One vocabulary: the same group words as `report`'s.
    assert!(
        table.contains("  unattributed ") && table.contains("  busy CPU time "),
        "{table}"
    );
    assert!(
        !table.contains("lost / unattributed") && !table.contains("all CPU time"),
        "{table}"
    );
    // The recording keeps each command line, and is its owner's alone.
    use std::os::unix::fs::PermissionsExt;
    for f in [&rec, &stream] {
        let mode = std::fs::metadata(f).expect("stat").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "{}", f.display());
    }
    let report = read_json(&rec);
    let lines: Vec<&str> = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["comm"] == "wp-cpu")
        .filter_map(|p| p["cmdline"].as_str())
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert!(lines.iter().any(|l| l.ends_with("cpu 1.3")), "{lines:?}");
    // No reader (DRAM and GPU here): no field in the recording, in the
    // stream, or in `report --json`; `-` in the HTML's process table.
    assert!(no_unread_field(&report, "the recording") > 10);
    let text = std::fs::read_to_string(&stream).expect("stream");
    let mut rows = 0;
    for line in text.lines() {
        let v: serde_json::Value = serde_json::from_str(line).expect("a JSON line");
        rows += no_unread_field(&v, "the stream");
    }
    assert!(rows > 10, "{rows} energy objects in the stream");
    let r = Command::new(wattprof_bin())
        .arg("report")
        .arg(&rec)
        .arg("--json")
        .output()
        .expect("report --json");
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    let json: serde_json::Value = serde_json::from_slice(&r.stdout).expect("report --json");
    assert!(no_unread_field(&json, "report --json") > 2);
    let page = html_page(&rec, &html);
    let row = page
        .lines()
        .find(|l| l.starts_with("<tr><td>wp-cpu</td>"))
        .unwrap_or_else(|| panic!("no wp-cpu row in the HTML"));
    assert_eq!(row.matches("<td>-</td>").count(), 2, "DRAM and GPU: {row}");
    // `report` says the same words, and shows the command lines.
    let r = Command::new(wattprof_bin())
        .arg("report")
        .arg(&rec)
        .arg("--cmdline")
        .output()
        .expect("report");
    let said = String::from_utf8_lossy(&r.stdout);
    assert!(r.status.success(), "{}", String::from_utf8_lossy(&r.stderr));
    for words in [
        "  unattributed ",
        "  busy CPU time ",
        "COMMAND LINE",
        "cpu 1.45",
    ] {
        assert!(said.contains(words), "report lacks `{words}`:\n{said}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn no_view_calls_an_estimate_measured_the_live_screen_flame_graph_and_prometheus_included() {
    require_ebpf!();
    let dir = tempfile_dir();
    // The live screen (`top`) needs a terminal: tmux gives it one.
    if !std::path::Path::new("/usr/bin/tmux").exists() {
        wattprof_tests::say_skip("tmux is not installed (apt-get install tmux)");
        return;
    }
    let (seen, ended, metrics) = top_on_the_vcpu_model();
    let metrics = metrics.unwrap_or_else(|| panic!("no /metrics with energy; screen:\n{seen}"));
    // Prometheus: the reader says estimated; no series for a domain with
    // no reader.
    assert!(
        metrics.contains("wattprof_energy_reader_info{") && metrics.contains("estimated=\"true\""),
        "{metrics}"
    );
    for l in metrics.lines().filter(|l| !l.starts_with('#')) {
        assert!(
            !l.contains("domain=\"dram\"") && !l.contains("domain=\"gpu\""),
            "a series for a domain with no reader: {l}"
        );
    }
    // The live screen: the domain's line says estimated, its column is
    // marked `~`; no reader is `-`.
    assert!(
        seen.lines().nth(1).is_some_and(|l| l.contains("estimated")),
        "no live screen, or its header does not say estimated:\n{seen}\n{ended}"
    );
    assert!(seen.contains("CPU W~"), "{seen}");
    // Every process row (a pid first): PID USER CPU% CPU-W DRAM-W GPU-W ...
    let rows: Vec<&str> = seen
        .lines()
        .filter(|l| {
            let w: Vec<&str> = l.split_whitespace().collect();
            w.len() >= 10 && w[0].parse::<u32>().is_ok()
        })
        .collect();
    assert!(!rows.is_empty(), "no process row on the screen:\n{seen}");
    for row in rows {
        let w: Vec<&str> = row.split_whitespace().collect();
        assert_eq!((w[4], w[5]), ("-", "-"), "DRAM W and GPU W: {row}");
    }
    // The flame graph's title.
    let (svg, rec) = (dir.join("flame.svg"), dir.join("stacks.json"));
    let out = Command::new(wattprof_bin())
        .args(["run", "--no-gpu", "--host-model", "none", "--stacks"])
        .arg("--energy-sysfs=/nonexistent")
        .arg("--flamegraph")
        .arg(&svg)
        .arg("--output")
        .arg(&rec)
        .args(["--"])
        .arg(testload_bin())
        .args(["cpu", "0.5"])
        .output()
        .expect("run --stacks");
    let table = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{table}");
    let graph = std::fs::read_to_string(&svg).expect("flame graph");
    assert!(graph.contains("estimated, "), "the flame graph's title");
    // The HTML page has the text's top functions.
    let page = html_page(&rec, &dir.join("stacks.html"));
    let functions = page
        .split("<h2>Top functions by energy</h2>")
        .nth(1)
        .unwrap_or_else(|| panic!("no top functions on the HTML page"));
    let first = functions
        .lines()
        .find(|l| l.starts_with("<tr><td class=\"text\">"))
        .unwrap_or_else(|| panic!("no function row: {functions}"));
    assert!(first.matches("<td>").count() >= 3, "{first}");
    // Everything a person reads: no "measured" said of an estimate.
    for (view, text) in [
        ("screen", &seen),
        ("summary", &ended),
        ("table", &table),
        ("flame graph", &graph),
    ] {
        assert!(
            !text.to_lowercase().contains("measured"),
            "the {view} says measured on the vCPU model"
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// `wattprof top` on the vCPU model (no RAPL) with its exporter, in a
/// tmux terminal for 4 s: its last full screen, what it printed after, and
/// a scrape with energy in it (if one came).
fn top_on_the_vcpu_model() -> (String, String, Option<String>) {
    let port = wattprof_tests::free_port();
    let addr = format!("127.0.0.1:{port}");
    let top = format!(
        "{} top --duration 4s --interval 500ms --host-model none --no-gpu \
         --energy-sysfs=/nonexistent --prometheus {addr}; echo EXIT=$?; sleep 600",
        wattprof_bin().display()
    );
    let session = format!("wattprof-views-{}", std::process::id());
    let tmux = |args: &[&str]| {
        Command::new("tmux")
            .args(args)
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
            .unwrap_or_default()
    };
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &session,
        "-x",
        "120",
        "-y",
        "30",
        &top,
    ]);
    // Scraped and read while it runs, however slow a loaded machine makes
    // its start.
    let (mut metrics, mut seen) = (None, String::new());
    let t0 = std::time::Instant::now();
    let ended = loop {
        let pane = tmux(&["capture-pane", "-p", "-t", &session]);
        if pane.contains("EXIT=") {
            break pane;
        }
        if pane.contains("COMMAND") && pane.lines().count() > 5 {
            seen.clone_from(&pane);
        }
        if metrics.is_none()
            && let Some((200, body)) = wattprof_tests::http_get(&addr, "/metrics")
            && body.contains("wattprof_energy_joules_total{")
        {
            metrics = Some(body);
        }
        assert!(t0.elapsed().as_secs() < 60, "top did not end:\n{pane}");
        std::thread::sleep(std::time::Duration::from_millis(100));
    };
    tmux(&["kill-session", "-t", &session]);
    assert!(ended.contains("EXIT=0"), "{ended}");
    (seen, ended, metrics)
}
