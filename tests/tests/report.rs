//! `wattprof report` on real recordings and streams: the totals it reads
//! back equal the recording's own, a stream cut mid-line gives the sums of
//! its complete lines, two runs of different sizes compare as expected,
//! the CSV files are what Python's csv module reads in codecarbon's units,
//! and the HTML page loads in headless Chromium with no console message.
//! Needs root (the runs load eBPF); run with `--test-threads=1`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;
use wattprof_tests::{FakeRapl, f, require_ebpf, testload_bin, wattprof_bin};

fn testload() -> String {
    testload_bin().to_string_lossy().into_owned()
}

fn report(args: &[&Path]) -> Output {
    Command::new(wattprof_bin())
        .arg("report")
        .args(args)
        .output()
        .expect("start wattprof report")
}

/// `wattprof report ARGS`, which must succeed.
fn report_ok(args: &[&Path]) -> Output {
    let out = report(args);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn report_json(args: &[&Path]) -> Value {
    let mut all: Vec<&Path> = vec![Path::new("--json")];
    all.extend_from_slice(args);
    serde_json::from_slice(&report_ok(&all).stdout).expect("report --json is JSON")
}

/// A `wattprof run` with `--output` and `--jsonl` (and `extra`) in `dir`.
fn record(dir: &Path, name: &str, extra: &[&str], cmd: &[&str]) -> (PathBuf, PathBuf, Value) {
    let rec = dir.join(format!("{name}.json"));
    let stream = dir.join(format!("{name}.jsonl"));
    let out = Command::new(wattprof_bin())
        .arg("run")
        .args(extra)
        .arg("--output")
        .arg(&rec)
        .arg("--jsonl")
        .arg(&stream)
        .arg("--")
        .args(cmd)
        .output()
        .expect("start wattprof run");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v = serde_json::from_slice(&std::fs::read(&rec).expect("recording")).expect("JSON");
    (rec, stream, v)
}

/// A `report --json` summary `s` of `recording` has its command's exit
/// code 0, and as many processes and intervals.
fn same_counts(s: &Value, recording: &Value) {
    assert_eq!(s["command"]["exit_code"], 0);
    assert_eq!(
        s["processes"].as_array().map(Vec::len),
        recording["processes"].as_array().map(Vec::len)
    );
    assert_eq!(
        s["intervals"].as_u64(),
        recording["intervals"].as_array().map(|v| v.len() as u64)
    );
}

fn close(a: f64, b: f64, what: &str) {
    assert!(
        (a - b).abs() <= 1e-6 + 1e-9 * b.abs(),
        "{what}: {a} read back, {b} expected"
    );
}

/// Measured, attributed, idle and unattributed J per "domain package".
type DomainSums = Vec<(String, [f64; 4])>;

/// Sums of the interval lines among `lines` (per domain, per group) and
/// their windows, as the rebuilt totals must be.
fn interval_sums(lines: &[&str]) -> (DomainSums, [f64; 3], Vec<Value>) {
    let mut domains: Vec<(String, [f64; 4])> = Vec::new();
    let mut groups = [0.0; 3];
    let mut windows = Vec::new();
    for l in lines {
        let v: Value = serde_json::from_str(l).expect("complete line");
        match v["type"].as_str() {
            Some("interval") => {
                for d in v["domains"].as_array().expect("domains") {
                    let key = format!("{} {}", d["domain"], d["package"]);
                    let x = [
                        f(d, "/measured_j"),
                        f(d, "/attributed_j"),
                        f(d, "/idle_j"),
                        f(d, "/unattributed_j"),
                    ];
                    match domains.iter_mut().find(|e| e.0 == key) {
                        Some(e) => e.1.iter_mut().zip(x).for_each(|(a, b)| *a += b),
                        None => domains.push((key, x)),
                    }
                }
                for (g, name) in groups.iter_mut().zip(["tree", "profiler", "other"]) {
                    *g += f(&v["groups"][name], "/energy_j");
                }
            }
            Some("window") => {
                let mut w = v.clone();
                w.as_object_mut().expect("object").remove("type");
                windows.push(w);
            }
            _ => {}
        }
    }
    (domains, groups, windows)
}

#[test]
fn report_reads_a_recording_a_stream_and_a_cut_stream_to_their_own_totals() {
    require_ebpf!();
    let rapl = FakeRapl::start(40.0, 4.0);
    let dir = wattprof_tests::tempfile_dir();
    let (rec, stream, recording) = record(
        &dir,
        "w",
        &[&rapl.arg(), "--interval", "100ms"],
        &[&testload(), "window", "step", "0.5"],
    );
    // A recording and a whole stream: exactly the recording's figures.
    for file in [&rec, &stream] {
        let s = report_json(&[file]);
        let e = &recording["energy"];
        assert_eq!(s["domains"], e["domains"], "{}", file.display());
        assert_eq!(s["group_energy"], e["groups"]);
        assert_eq!(s["group_times"], recording["groups"]);
        assert_eq!(s["windows"], recording["windows"]);
        same_counts(&s, &recording);
        assert!(s["cut"].is_null());
    }
    assert_eq!(report_json(&[&rec])["format"], "recording");
    assert_eq!(report_json(&[&stream])["format"], "stream");

    // Cut in the middle of the last interval line, as a SIGKILL leaves it.
    let text = std::fs::read_to_string(&stream).expect("stream");
    let lines: Vec<&str> = text.lines().collect();
    let last_interval = lines
        .iter()
        .rposition(|l| l.contains("\"type\":\"interval\""))
        .expect("intervals");
    let start: usize = lines[..last_interval].iter().map(|l| l.len() + 1).sum();
    let cut_at = start + lines[last_interval].len() / 2;
    let cut = dir.join("cut.jsonl");
    std::fs::write(&cut, &text[..cut_at]).expect("write cut");
    let s = report_json(&[&cut]);
    assert_eq!(s["format"], "cut_stream");
    assert_eq!(
        s["cut"]["complete_lines"].as_u64(),
        Some(last_interval as u64)
    );
    assert_eq!(
        s["cut"]["partial_line_bytes"].as_u64(),
        Some((cut_at - start) as u64)
    );
    let (domains, groups, windows) = interval_sums(&lines[..last_interval]);
    let got = s["domains"].as_array().expect("domains");
    assert_eq!(got.len(), domains.len());
    // The report lists domains in the recording's order (by domain, then
    // package), not as the intervals first showed them.
    for d in got {
        let key = format!("{} {}", d["domain"], d["package"]);
        let (key, x) = domains
            .iter()
            .find(|(k, _)| *k == key)
            .unwrap_or_else(|| panic!("{key} not in the intervals"));
        for (i, name) in ["measured_j", "attributed_j", "idle_j", "unattributed_j"]
            .iter()
            .enumerate()
        {
            close(f(d, &format!("/{name}")), x[i], &format!("{key} {name}"));
        }
    }
    for (name, want) in ["tree", "profiler", "other"].iter().zip(groups) {
        close(f(&s["group_energy"][name], "/total_j"), want, name);
    }
    assert_eq!(s["windows"].as_array().expect("windows"), &windows);
    let table = report(&[&cut]);
    assert!(table.status.success());
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(table.contains("the stream was cut after"), "{table}");
    eprintln!("{table}");

    // Cut after a whole line: no partial line, but no summary either.
    let whole = dir.join("whole-lines.jsonl");
    std::fs::write(&whole, &text[..start]).expect("write");
    let s = report_json(&[&whole]);
    assert_eq!(s["format"], "cut_stream");
    assert_eq!(s["cut"]["partial_line_bytes"], 0);

    // What the file holds, with AIPowerMeter's names.
    let m = report_json(&[Path::new("--metrics"), &rec]);
    let names: Vec<&str> = m
        .as_array()
        .expect("metrics")
        .iter()
        .filter_map(|x| x["aipowermeter"].as_str())
        .collect();
    for want in [
        "intel_power",
        "per_process_cpu_power",
        "per_process_mem_use_abs",
    ] {
        assert!(names.contains(&want), "{want} not in {m}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// Recordings that wattprof wrote before schema 7 (`tests/fixtures`: a
/// 1 s burner and a GPU on the NVML stub, recorded by the builds of
/// 5187f8f^ and 87783c1^). Every domain read then wrote its fields, a
/// domain with no reader wrote 0.
fn old_recording(schema: u32) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fixtures")
        .join(format!("recording-schema-{schema}.json"))
}

/// An energy object of an old recording read back: every figure as it
/// was, except that a domain no reader measured (core and DRAM here, 0
/// before schema 7) has no field now.
fn read_back(got: &Value, recorded: &Value, schema: u32) {
    let recorded = recorded.as_object().expect("an energy object");
    for (field, value) in recorded {
        match got.get(field) {
            Some(v) => assert_eq!(v, value, "schema {schema}: {field}"),
            None => assert!(
                ["core_j", "dram_j"].contains(&field.as_str()) && value.as_f64() == Some(0.0),
                "schema {schema}: {field} = {value} was dropped"
            ),
        }
    }
    let extra: Vec<&String> = got
        .as_object()
        .expect("an energy object")
        .keys()
        .filter(|k| !recorded.contains_key(*k))
        .collect();
    assert!(extra.is_empty(), "schema {schema}: {extra:?}");
}

#[test]
fn recordings_of_schema_5_and_6_read_to_their_own_totals() {
    for schema in [5, 6] {
        let file = old_recording(schema);
        let recording: Value =
            serde_json::from_str(&std::fs::read_to_string(&file).expect("fixture")).expect("JSON");
        assert_eq!(recording["schema_version"], schema);
        let s = report_json(&[&file]);
        let e = &recording["energy"];
        assert_eq!(s["schema_version"], schema, "{s}");
        assert_eq!(s["format"], "recording");
        assert_eq!(s["domains"], e["domains"], "schema {schema}");
        for group in ["tree", "profiler", "other"] {
            read_back(&s["group_energy"][group], &e["groups"][group], schema);
        }
        assert_eq!(s["group_times"], recording["groups"], "schema {schema}");
        assert_eq!(s["readers"], e["readers"], "schema {schema}");
        assert_eq!(s["host"]["gpus"], recording["host"]["gpus"]);
        assert_eq!(s["host"]["gpus"][0]["method"], "energy_counter");
        same_counts(&s, &recording);
        // The people's table reads them too, GPU included.
        let text = String::from_utf8_lossy(&report_ok(&[&file]).stdout).into_owned();
        assert!(text.contains("gpu 0"), "schema {schema}:\n{text}");
    }
    // And they compare with each other.
    let out = report_ok(&[&old_recording(5), &old_recording(6)]);
    assert!(!out.stdout.is_empty());
}

#[test]
fn report_a_b_shows_twice_the_work_as_twice_the_energy() {
    require_ebpf!();
    let rapl = FakeRapl::start(40.0, 4.0);
    let dir = wattprof_tests::tempfile_dir();
    let (a, _, _) = record(&dir, "a", &[&rapl.arg()], &[&testload(), "cpu", "0.3"]);
    let (b, _, _) = record(&dir, "b", &[&rapl.arg()], &[&testload(), "cpu", "0.6"]);
    let c = report_json(&[&a, &b]);
    let row = c["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|r| r["name"] == "wp-cpu")
        .unwrap_or_else(|| panic!("no wp-cpu row in {c}"))
        .clone();
    let energy_pct = f(&row, "/energy_j/delta_pct");
    let time_pct = f(&row, "/time_s/delta_pct");
    eprintln!("wp-cpu: energy {energy_pct:+.1}%, CPU time {time_pct:+.1}%");
    assert!((75.0..125.0).contains(&time_pct), "{row}");
    assert!((75.0..125.0).contains(&energy_pct), "{row}");
    close(
        f(&row, "/energy_j/delta"),
        f(&row, "/energy_j/b") - f(&row, "/energy_j/a"),
        "delta",
    );
    let tree = c["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .find(|r| r["name"] == "command tree")
        .expect("tree row");
    assert!(f(tree, "/energy_j/delta") > 0.0, "{tree}");
    assert!(c["domains"].as_array().is_some_and(|d| !d.is_empty()));
    let table = report(&[&a, &b]);
    assert!(table.status.success());
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("wp-cpu") && table.contains("B against the baseline A"),
        "{table}"
    );
    eprintln!("{table}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_csv_files_are_read_by_python_in_codecarbon_s_units_and_live_equals_read_back() {
    require_ebpf!();
    let rapl = FakeRapl::start(40.0, 4.0);
    let dir = wattprof_tests::tempfile_dir();
    let live = dir.join("live-intervals.csv");
    let live_arg = format!("--csv-intervals={}", live.display());
    let (rec, _, recording) = record(
        &dir,
        "c",
        &[&rapl.arg(), "--interval", "100ms", &live_arg],
        &[&testload(), "cpu", "0.4"],
    );
    let emissions = dir.join("emissions.csv");
    let intervals = dir.join("intervals.csv");
    report_ok(&[
        &rec,
        Path::new("--csv"),
        &emissions,
        Path::new("--csv-intervals"),
        &intervals,
    ]);
    // Written live as each interval ended, or read back from the
    // recording: the same bytes.
    assert_eq!(
        std::fs::read_to_string(&live).expect("live"),
        std::fs::read_to_string(&intervals).expect("read back")
    );
    let parse = "import csv, json, sys\n\
                 print(json.dumps([list(csv.DictReader(open(p))) for p in sys.argv[1:]]))";
    let out = Command::new("python3")
        .args(["-c", parse])
        .arg(&emissions)
        .arg(&intervals)
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let files: Vec<Vec<Value>> = serde_json::from_slice(&out.stdout).expect("rows");
    let num = |row: &Value, col: &str| -> f64 {
        row[col]
            .as_str()
            .and_then(|s| s.parse().ok())
            .unwrap_or_else(|| panic!("{col} is not a number in {row}"))
    };
    let tree = &recording["energy"]["groups"]["tree"];
    assert_eq!(files[0].len(), 1);
    close(
        num(&files[0][0], "energy_consumed") * 3.6e6,
        f(tree, "/total_j"),
        "energy_consumed (kWh)",
    );
    close(
        num(&files[0][0], "emissions") * 1000.0,
        f(tree, "/co2_g"),
        "emissions (kg)",
    );
    assert_eq!(files[0][0]["tracking_mode"], "process");
    // Per interval and domain: the sums are the recording's totals.
    let rows = &files[1];
    let n_intervals = recording["intervals"].as_array().expect("intervals").len();
    for d in recording["energy"]["domains"].as_array().expect("domains") {
        let name = d["domain"].as_str().expect("name");
        let package = d["package"]
            .as_u64()
            .map(|p| p.to_string())
            .unwrap_or_default();
        let mine: Vec<&Value> = rows
            .iter()
            .filter(|r| r["domain"] == name && r["package"] == package.as_str())
            .collect();
        assert_eq!(mine.len(), n_intervals, "{name} {package}");
        for col in ["measured_j", "attributed_j", "idle_j", "unattributed_j"] {
            let sum: f64 = mine.iter().map(|r| num(r, col)).sum();
            close(sum, f(d, &format!("/{col}")), &format!("{name} {col}"));
        }
        for r in &mine {
            close(num(r, "energy_kwh") * 3.6e6, num(r, "measured_j"), "kWh");
            close(
                num(r, "power_w") * num(r, "duration_s"),
                num(r, "measured_j"),
                "power",
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser", "google-chrome"]
        .into_iter()
        .find(|c| {
            Command::new(c)
                .arg("--version")
                .output()
                .is_ok_and(|o| o.status.success())
        })
}

/// Opens `page` in headless Chromium: its console messages, and the
/// rendered DOM; `screenshot` is written when given.
fn open_in_chromium(
    browser: &str,
    page: &Path,
    screenshot: Option<&Path>,
) -> (Vec<String>, String) {
    let mut cmd = Command::new(browser);
    cmd.args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--enable-logging=stderr",
        "--window-size=1200,1900",
    ]);
    match screenshot {
        Some(png) => cmd.arg(format!("--screenshot={}", png.display())),
        None => cmd.arg("--dump-dom"),
    };
    let out = cmd
        .arg(format!("file://{}", page.display()))
        .output()
        .expect("run chromium");
    let console = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| l.contains(":CONSOLE"))
        .map(str::to_string)
        .collect();
    (console, String::from_utf8_lossy(&out.stdout).into_owned())
}

#[test]
fn the_html_report_loads_in_chromium_with_no_console_message_and_fetches_nothing() {
    require_ebpf!();
    let Some(browser) = chromium() else {
        wattprof_tests::say_skip("chromium is not installed (cargo xtask test installs it)");
        return;
    };
    let rapl = FakeRapl::start(40.0, 4.0);
    let dir = wattprof_tests::tempfile_dir();
    let (rec, _, _) = record(
        &dir,
        "h",
        &[&rapl.arg(), "--interval", "100ms"],
        &[&testload(), "window", "a<b>&'\"", "0.4"],
    );
    let html = dir.join("report.html");
    let svg = dir.join("report.svg");
    report_ok(&[&rec, Path::new("--html"), &html, Path::new("--plot"), &svg]);
    let page = std::fs::read_to_string(&html).expect("html");
    // Self-contained: nothing to fetch, nothing to run.
    for banned in ["<script", "src=", "href=", "@import", "url("] {
        assert!(!page.contains(banned), "the page has {banned}");
    }
    assert!(
        page.contains("<svg") && page.contains("a&lt;b&gt;&amp;"),
        "names are escaped"
    );
    assert!(
        std::fs::read_to_string(&svg)
            .expect("svg")
            .starts_with("<svg")
    );

    // The check can fail: a page with a script error is caught.
    let broken = dir.join("broken.html");
    std::fs::write(
        &broken,
        "<html><body><script>nosuchfn()</script></body></html>",
    )
    .expect("write");
    let (console, _) = open_in_chromium(browser, &broken, None);
    assert!(
        !console.is_empty(),
        "a script error must show on the console"
    );

    let (console, dom) = open_in_chromium(browser, &html, None);
    assert!(console.is_empty(), "console: {console:?}");
    assert!(
        dom.contains("Energy per domain") && dom.contains("<svg"),
        "{dom}"
    );
    // A screenshot a person can look at (the closing note describes it).
    let png = std::env::temp_dir().join("wattprof-report-screenshot.png");
    let (console, _) = open_in_chromium(browser, &html, Some(&png));
    assert!(console.is_empty(), "console: {console:?}");
    let image = std::fs::read(&png).expect("screenshot");
    assert_eq!(&image[1..4], b"PNG");
    let width = u32::from_be_bytes([image[16], image[17], image[18], image[19]]);
    assert_eq!(width, 1200);
    eprintln!("screenshot: {} ({} bytes)", png.display(), image.len());
    // A run on a power model: the rendered page says estimated, in the
    // domain table and the plot's title, and never measured.
    let (est, _, _) = record(
        &dir,
        "est",
        &[
            "--energy-sysfs=/nonexistent",
            "--no-gpu",
            "--host-model=none",
        ],
        &[&testload(), "cpu", "0.3"],
    );
    let est_html = dir.join("est.html");
    report_ok(&[&est, Path::new("--html"), &est_html]);
    let (console, dom) = open_in_chromium(browser, &est_html, None);
    assert!(console.is_empty(), "console: {console:?}");
    assert!(
        dom.contains("(estimated)") && dom.contains("Estimated power"),
        "the estimated mark is not on the rendered page"
    );
    assert!(!dom.contains("Measured"), "an estimate called measured");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_files_and_options_get_one_line_and_a_non_zero_exit() {
    let dir = wattprof_tests::tempfile_dir();
    let write = |name: &str, text: &str| {
        let p = dir.join(name);
        std::fs::write(&p, text).expect("write");
        p
    };
    let cases = [
        (write("empty.json", ""), "is empty", 1),
        (write("text.json", "hello\n"), "is not JSON", 1),
        (
            write("other.json", "{\"a\": 1}"),
            "not a wattprof recording",
            1,
        ),
        (
            write(
                "future.json",
                "{\"schema_version\": 99, \"wattprof_version\": \"9.9\"}",
            ),
            "schema version 99",
            1,
        ),
        (
            write(
                "future.jsonl",
                "{\"type\":\"header\",\"schema_version\":99}\n",
            ),
            "schema version 99",
            1,
        ),
        (dir.join("missing.json"), "cannot read", 1),
        (dir.clone(), "cannot read", 1),
    ];
    for (path, want, code) in &cases {
        let out = report(&[path]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(*code), "{}: {err}", path.display());
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.contains(want), "{}: {err}", path.display());
        assert!(out.stdout.is_empty());
    }
    // Two files cannot be plotted at once: usage, exit 2.
    let a = &cases[0].0;
    let out = report(&[a, a, Path::new("--plot"), Path::new("x.svg")]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--plot reads one file"));
    // An unwritable output: one line, exit 1.
    let header = "{\"type\":\"header\",\"schema_version\":2,\"wattprof_version\":\"0.1.0\",\
        \"mode\":\"monitor\",\"tracker\":\"iter\",\"start_unix_ns\":0,\"host\":{\"hostname\":\
        \"h\",\"kernel\":\"k\",\"cpu_model\":\"c\",\"gpus\":[]},\"package_ids\":[0],\
        \"readers\":[],\"carbon_intensity_g_per_kwh\":475.0,\"carbon_intensity_source\":\"s\",\
        \"argv\":null}\n";
    let only_header = write("only-header.jsonl", header);
    let out = report(&[
        &only_header,
        Path::new("--plot"),
        &dir.join("no/such/dir.svg"),
    ]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("no interval records"), "{err}");
    // A damaged line in the middle is not a cut: its number is said.
    let damaged = write(
        "damaged.jsonl",
        &format!("{header}{{\"type\":\"interval\",\"t_ns\":\n{header}"),
    );
    let out = report(&[&damaged]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("line 2"), "{err}");
    // A header alone is a stream cut before its first interval: read.
    let out = report(&[&only_header]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_window_on_a_gpu_shows_its_gpu_energy_read_back() {
    require_ebpf!();
    // The command holds all of one GPU's SM at 200 W (an NVML stand-in:
    // CI has no GPU): each window's GPU energy is 200 W x its length.
    let lib = wattprof_tests::nvml_stub(
        "gpu name=Stub-A uuid=GPU-A power_mw=200000 energy=counter util=100 \
         memory_total=85899345920 memory_used=2147483648 procs=child:100:1073741824\n",
    );
    let lib_arg = format!("--nvml-lib={}", lib.display());
    let dir = wattprof_tests::tempfile_dir();
    let (rec, _, recording) = record(
        &dir,
        "gpu",
        &[
            &lib_arg,
            "--energy-sysfs=/nonexistent",
            "--interval",
            "100ms",
        ],
        &[&testload(), "window", "epoch", "2.0"],
    );
    let s = report_json(&[&rec]);
    assert_eq!(s["windows"], recording["windows"]);
    let w = &s["windows"][0];
    let length_s =
        (w["end_ns"].as_u64().unwrap_or(0) - w["begin_ns"].as_u64().unwrap_or(0)) as f64 / 1e9;
    let gpu_j = f(w, "/energy/gpu_j");
    eprintln!("window epoch: {gpu_j:.3} J of GPU over {length_s:.3} s");
    // A boundary reads the counter just before it takes the time: on a
    // loaded machine the read can be preempted for tens of ms, so 50 ms at
    // each end of the 2 s window, 2.5%.
    assert!((gpu_j / (200.0 * length_s) - 1.0).abs() < 0.025, "{w}");
    let table = report(&[&rec]);
    let table = String::from_utf8_lossy(&table.stdout);
    assert!(
        table.contains("GPU J") && table.contains("epoch"),
        "{table}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// A job file as `monitor --jobs-dir` writes it (node, job, package J,
/// GPU J where the node read a GPU).
fn job_file(dir: &Path, node: &str, job: &str, package: f64, gpu: Option<f64>) -> PathBuf {
    let gpu_field = gpu.map(|g| format!("\"gpu_j\": {g},")).unwrap_or_default();
    let total = package + gpu.unwrap_or(0.0);
    let text = format!(
        r#"{{
  "type": "wattprof_job", "wattprof_version": "0.1.0", "node": "{node}",
  "first_unix_ns": 1764000000000000000, "last_unix_ns": 1764000010000000000,
  "scheduler": "slurm", "job_id": "{job}", "uid": 1000, "user": "ana",
  "first_ns": 1000000000, "last_ns": 11000000000, "on_cpu_ns": 5000000000,
  "energy": {{"package_j": {package}, {gpu_field} "total_j": {total}, "avg_power_w": 1.0,
             "co2_g": 0.1, "static_j": 2.0, "dynamic_j": {}}},
  "steps": [{{"step": "batch", "cgroups": ["/slurm_{node}/uid_1000/job_{job}/step_batch"],
             "on_cpu_ns": 5000000000, "energy": {{"total_j": {total}, "avg_power_w": 1.0,
             "co2_g": 0.1}}}}]
}}
"#,
        total - 2.0
    );
    let path = dir.join(format!("{node}-slurm-{job}.json"));
    std::fs::write(&path, text).expect("job file");
    path
}

#[test]
fn report_sums_a_job_over_its_nodes_files_and_refuses_what_does_not_go_together() {
    let dir = wattprof_tests::tempfile_dir().join("report-jobs");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("dir");
    let a = job_file(&dir, "node1", "42", 60.0, Some(40.0));
    let b = job_file(&dir, "node2", "42", 50.0, None);
    let out = report_ok(&[&a, &b]);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("slurm job 42 (ana): 2 nodes"), "{table}");
    let sum = table
        .lines()
        .find(|l| l.trim_start().starts_with("sum"))
        .expect(&table);
    assert!(
        sum.contains("110.000") && sum.contains("40.000") && sum.contains("150.000"),
        "{sum}"
    );
    let json = report_json(&[&a, &b]);
    assert_eq!(json[0]["energy"]["total_j"], 150.0, "{json}");
    // No node read DRAM: no field, not 0.
    assert!(json[0]["energy"].get("dram_j").is_none(), "{json}");
    assert_eq!(json[0]["energy"]["gpu_j"], 40.0, "{json}");
    assert_eq!(json[0]["nodes"].as_array().map(Vec::len), Some(2), "{json}");
    let comment = report_ok(&[Path::new("--comment"), &a, &b]);
    assert_eq!(
        String::from_utf8_lossy(&comment.stdout).trim(),
        "wattprof:total_j=150.000,package_j=110.000,gpu_j=40.000,static_j=4.000,dynamic_j=146.000,nodes=node1+node2"
    );
    // One CSV row per job and node; node2 read no GPU: an empty cell.
    let csv_path = dir.join("jobs.csv");
    report_ok(&[Path::new("--jobs-csv"), &csv_path, &a, &b]);
    let csv = std::fs::read_to_string(&csv_path).expect("jobs.csv");
    let lines: Vec<&str> = csv.lines().collect();
    assert_eq!(
        lines[0],
        "scheduler,job_id,user,node,first_utc,last_utc,on_cpu_s,package_j,dram_j,gpu_j,total_j,static_j,dynamic_j,co2_g"
    );
    assert_eq!(lines.len(), 3, "{csv}");
    assert!(
        lines[1].starts_with("slurm,42,ana,node1,")
            && lines[1].contains(",5.000000,60.000000,,40.000000,100.000000,"),
        "{csv}"
    );
    assert!(
        lines[2].contains(",node2,") && lines[2].contains(",50.000000,,,50.000000,"),
        "{csv}"
    );
    // Each refusal is one line and its exit code: 2 for what does not go
    // together, 1 for a file that cannot be read back.
    let other = job_file(&dir, "node1", "43", 5.0, None);
    let damaged = dir.join("damaged.json");
    std::fs::write(&damaged, "{\"type\": \"wattprof_job\", \"node\": 1}").expect("write");
    let not_json = dir.join("plain.json");
    std::fs::write(&not_json, "{}").expect("write");
    for (args, code, says) in [
        (vec![&*a, &*a], 1, "is in both"),
        (vec![Path::new("--comment"), &*a, &*other], 2, "hold 2 jobs"),
        (vec![&*a, &*not_json], 2, "is not a batch job's file"),
        (
            vec![Path::new("--comment"), &*not_json],
            2,
            "is not a batch job's file",
        ),
        (
            vec![Path::new("--plot"), Path::new("x.svg"), &*a],
            2,
            "--plot does not apply",
        ),
        (vec![&*damaged], 1, "is the file damaged?"),
        (vec![&*not_json, &*not_json, &*not_json], 2, "3 files given"),
        (
            vec![Path::new("--jobs-csv"), Path::new("x.csv"), &*not_json],
            2,
            "--jobs-csv reads",
        ),
    ] {
        let out = report(&args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {err}");
        assert!(
            err.contains(says) && err.trim().lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}
