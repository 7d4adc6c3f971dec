//! Energy flame graphs end to end: the real stack sampler (perf_event on
//! cpu-clock), a fixture RAPL, and a C workload built here with frame
//! pointers (tests/stacks/energyfns.c). Needs root; `--test-threads=1`.

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::OnceLock;

use serde_json::Value;
use wattprof_tests::{FakeRapl, f, require_ebpf, tempfile_dir, testload_bin, wattprof_bin};

/// The workload, compiled once per test binary with frame pointers.
fn energyfns() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("stacks/energyfns.c");
        let out = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/energyfns");
        let status = Command::new("cc")
            .args([
                "-O1",
                "-g",
                "-fno-omit-frame-pointer",
                "-Wl,--build-id",
                "-o",
            ])
            .arg(&out)
            .arg(&src)
            .status()
            .expect("cc (the C compiler cargo links with) runs");
        assert!(status.success(), "compiling {}", src.display());
        out
    })
}

/// `wattprof run ARGS -- CMD` with the outputs in `dir`.
fn run(dir: &Path, args: &[&str], cmd: &[&str]) -> (Output, Value) {
    let out = Command::new(wattprof_bin())
        .arg("run")
        .args(args)
        .arg("--output")
        .arg(dir.join("run.json"))
        .arg("--stacks-out")
        .arg(dir.join("stacks.folded"))
        .arg("--")
        .args(cmd)
        .output()
        .expect("start wattprof");
    let report = std::fs::read(dir.join("run.json"))
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| {
            panic!(
                "no report; stderr:\n{}",
                String::from_utf8_lossy(&out.stderr)
            )
        });
    (out, report)
}

/// The folded file's lines of one domain: (frames, µJ).
fn folded(dir: &Path, domain: &str) -> Vec<(Vec<String>, u64)> {
    let text = std::fs::read_to_string(dir.join("stacks.folded")).expect("folded stacks");
    text.lines()
        .filter_map(|l| {
            let (stack, uj) = l.rsplit_once(' ')?;
            let mut frames = stack.split(';').map(String::from);
            (frames.next()? == domain).then(|| (frames.collect(), uj.parse().expect("µJ")))
        })
        .collect()
}

/// µJ of the lines whose frames `pick` takes.
fn uj_where(lines: &[(Vec<String>, u64)], pick: impl Fn(&[String]) -> bool) -> u64 {
    lines
        .iter()
        .filter(|(fr, _)| pick(fr))
        .map(|(_, uj)| uj)
        .sum()
}

/// µJ of the lines of process `comm`.
fn uj_of(lines: &[(Vec<String>, u64)], comm: &str) -> u64 {
    uj_where(lines, |fr| fr[0] == comm)
}

fn process_energy_j(report: &Value, comm: &str, field: &str) -> f64 {
    report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["comm"] == comm)
        .map(|p| f(p, &format!("/energy/{field}")))
        .sum()
}

#[test]
fn two_functions_at_2_to_1_cpu_get_2_to_1_energy_and_stacks_add_up_to_the_process() {
    require_ebpf!();
    let rapl = FakeRapl::start(40.0, 4.0);
    let dir = tempfile_dir();
    let svg = dir.join("flame.svg");
    let bin = energyfns().display().to_string();
    // Another program burns CPU meanwhile: `run` profiles only its command.
    let mut other = Command::new(testload_bin())
        .args(["cpu", "6"])
        .stdout(Stdio::null())
        .spawn()
        .expect("burner");
    let (out, report) = run(
        &dir,
        &[
            &rapl.arg(),
            "--stack-hz",
            "999",
            "--interval",
            "500ms",
            "--flamegraph",
            &svg.display().to_string(),
        ],
        &[&bin, "alternate", "4"],
    );
    let _ = other.kill();
    let _ = other.wait();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let all = folded(&dir, "package");
    assert!(all.iter().all(|(fr, _)| fr[0] == "energyfns"), "{all:?}");
    assert!(f(&report, "/stacks/profiled_samples") < f(&report, "/stacks/samples"));
    for (domain, field) in [("package", "package_j"), ("dram", "dram_j")] {
        let lines: Vec<(Vec<String>, u64)> = folded(&dir, domain)
            .into_iter()
            .filter(|(frames, _)| frames[0] == "energyfns")
            .collect();
        let on = |name: &str| uj_where(&lines, |fr| fr.iter().any(|f| f == name));
        let (a, b) = (on("energy_fn_a") as f64, on("energy_fn_b") as f64);
        let ratio = a / b;
        assert!(
            (ratio / 2.0 - 1.0).abs() < 0.05,
            "{domain}: a/b = {ratio} ({a} / {b} µJ)"
        );
        let sum: u64 = lines.iter().map(|(_, uj)| uj).sum();
        let process_uj = process_energy_j(&report, "energyfns", field) * 1e6;
        assert!(
            (sum as f64 / process_uj - 1.0).abs() < 0.001,
            "{domain}: stacks {sum} µJ vs process {process_uj} µJ"
        );
        // The stacks are whole: main calls each function.
        assert!(
            lines.iter().any(|(fr, _)| fr
                .windows(2)
                .any(|w| w[0] == "main" && w[1] == "energy_fn_a")),
            "{lines:?}"
        );
    }
    // The recording's functions (valid against the schema), and the table's.
    wattprof_tests::schema::assert_valid("recording", &report);
    let functions = report["stacks"]["functions"].as_array().expect("functions");
    assert!(functions.iter().any(|f| f["function"] == "energy_fn_a"));
    assert!(f(&report, "/stacks/samples") > 0.0);
    assert_eq!(f(&report, "/stacks/hz"), 999.0);
    assert!(stderr.contains("top functions by energy"), "{stderr}");
    assert!(stderr.contains("energy_fn_a"), "{stderr}");
    // `report` shows them from the recording.
    let shown = Command::new(wattprof_bin())
        .arg("report")
        .arg(dir.join("run.json"))
        .output()
        .expect("report");
    let table = String::from_utf8_lossy(&shown.stdout);
    assert!(shown.status.success(), "{table}");
    assert!(table.contains("top functions by energy"), "{table}");
    assert!(table.contains("energy_fn_b"), "{table}");
    // The SVG, titled with its domain and energy.
    let text = std::fs::read_to_string(&svg).expect("svg");
    assert!(text.contains("Energy flame graph: package,"), "{text}");
    assert!(text.contains("energy_fn_b"));
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_process_that_lives_20_ms_is_named_after_it_is_gone() {
    require_ebpf!();
    let rapl = FakeRapl::start(40.0, 4.0);
    let dir = tempfile_dir();
    let script = format!(
        "for i in 1 2 3 4 5; do {} short; done",
        energyfns().display()
    );
    let (out, report) = run(
        &dir,
        &[&rapl.arg(), "--stack-hz", "999"],
        &["sh", "-c", &script],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let shorts: Vec<&Value> = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["comm"] == "energyfns")
        .collect();
    assert_eq!(shorts.len(), 5);
    for p in &shorts {
        let s = f(p, "/on_cpu_ns") / 1e9;
        assert!((0.015..0.2).contains(&s), "lived {s} s of CPU");
    }
    let lines = folded(&dir, "package");
    let named = uj_where(&lines, |fr| {
        fr[0] == "energyfns" && fr.iter().any(|f| f == "short_lived_named_fn")
    });
    let all = uj_of(&lines, "energyfns");
    assert!(named > 0, "{lines:?}");
    // Most of their energy is in the named function.
    assert!(
        named as f64 > 0.5 * all as f64,
        "{named} of {all} µJ: {lines:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_kernel_heavy_workload_shows_kernel_frames() {
    require_ebpf!();
    let rapl = FakeRapl::start(40.0, 4.0);
    let dir = tempfile_dir();
    let bin = energyfns().display().to_string();
    let (out, _) = run(&dir, &[&rapl.arg()], &[&bin, "pipe", "2"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = folded(&dir, "package");
    let kernel = uj_where(&lines, |fr| {
        fr.iter()
            .any(|f| f.ends_with("_[k]") && (f.contains("pipe_") || f.contains("vfs_")))
    });
    let all = uj_of(&lines, "energyfns");
    assert!(
        kernel as f64 > 0.3 * all as f64,
        "{kernel} of {all} µJ: {lines:?}"
    );
    // User frames lead into them: the program's `main`, then libc's
    // syscall wrapper, then the kernel. (Not `pipe_ping`: the wrapper
    // keeps no frame pointer, so a frame-pointer walk from inside it goes
    // from the wrapper to pipe_ping's caller. pipe_ping shows only in the
    // few samples taken in its own user code, and a run under load had
    // none.)
    assert!(
        lines.iter().any(|(fr, _)| {
            let main = fr.iter().position(|f| f == "main");
            let kernel = fr.iter().position(|f| f.ends_with("_[k]"));
            matches!((main, kernel), (Some(m), Some(k)) if m < k)
        }),
        "no line from main into the kernel: {lines:?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_full_ledger_merges_stacks_and_says_so() {
    require_ebpf!();
    let rapl = FakeRapl::start(40.0, 4.0);
    let dir = tempfile_dir();
    let bin = energyfns().display().to_string();
    let (out, report) = run(
        &dir,
        &[&rapl.arg(), "--stack-hz", "999", "--stacks-max", "2"],
        &[&bin, "pipe", "1"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(f(&report, "/stacks/merged_samples") > 0.0);
    assert!(stderr.contains("merged into [other stacks]"), "{stderr}");
    let lines = folded(&dir, "package");
    assert!(
        lines
            .iter()
            .any(|(fr, _)| fr.iter().any(|f| f == "[other stacks]"))
    );
    // Merged, not lost: the stacks still add up to the process.
    let sum = uj_of(&lines, "energyfns");
    let process_uj = process_energy_j(&report, "energyfns", "package_j") * 1e6;
    assert!(
        (sum as f64 / process_uj - 1.0).abs() < 0.001,
        "{sum} vs {process_uj}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn bad_stack_options_get_one_line_and_nothing_runs() {
    // Refused before anything loads: no root needed.
    let dir = tempfile_dir();
    let marker = dir.join("ran");
    let touch = format!("touch {}", marker.display());
    for (args, code, says) in [
        (vec!["--stack-hz", "0"], 2, "out of range"),
        (vec!["--stack-hz", "10001"], 2, "1 to 10000"),
        (
            vec!["--flamegraph", "/nonexistent/dir/f.svg"],
            125,
            "cannot write --flamegraph /nonexistent/dir/f.svg",
        ),
        (
            vec!["--stacks-out", "/nonexistent/dir/s.folded"],
            125,
            "cannot write --stacks-out",
        ),
        (
            vec!["--stacks-out", "/tmp/same.out", "--output", "/tmp/same.out"],
            125,
            "name the same file",
        ),
    ] {
        let out = Command::new(wattprof_bin())
            .arg("run")
            .args(&args)
            .args(["--", "sh", "-c", &touch])
            .output()
            .expect("start wattprof");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "{args:?}: {stderr}");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        if code == 125 {
            assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
        }
        assert!(!marker.exists(), "{args:?} ran the command");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn monitor_samples_stacks_of_every_process() {
    require_ebpf!();
    let rapl = FakeRapl::start(40.0, 4.0);
    let dir = tempfile_dir();
    let mut burner = Command::new(testload_bin())
        .args(["cpu", "3"])
        .stdout(Stdio::null())
        .spawn()
        .expect("burner");
    let out = Command::new(wattprof_bin())
        .args(["monitor", "--duration", "2s", &rapl.arg(), "--output"])
        .arg(dir.join("m.json"))
        .arg("--stacks-out")
        .arg(dir.join("stacks.folded"))
        .output()
        .expect("monitor");
    let _ = burner.kill();
    let _ = burner.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines = folded(&dir, "package");
    assert!(
        lines.iter().any(|(fr, uj)| fr[0] == "wp-cpu" && *uj > 0),
        "{lines:?}"
    );
    let report: Value =
        serde_json::from_slice(&std::fs::read(dir.join("m.json")).expect("recording"))
            .expect("json");
    assert!(f(&report, "/stacks/memory_bytes") > 0.0);
    wattprof_tests::schema::assert_valid("recording", &report);
    let _ = std::fs::remove_dir_all(&dir);
}
