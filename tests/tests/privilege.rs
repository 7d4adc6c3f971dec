//! wattprof as an ordinary user with only the capabilities docs/deployment.md's
//! "Least privilege" lists (CAP_BPF, CAP_PERFMON, CAP_DAC_READ_SEARCH),
//! started through `setpriv` as systemd's AmbientCapabilities would, and
//! the one-line error for each one missing. Needs root (to hand out the
//! capabilities); run with `--test-threads=1`.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Output};

use serde_json::Value;
use wattprof_tests::{FakeRapl, free_port, http_get, tempfile_dir, wattprof_bin};

/// The set the systemd unit and the DaemonSet grant.
const SET: &[&str] = &["bpf", "perfmon", "dac_read_search"];

/// `wattprof args` as user `nobody` with exactly `caps` (effective,
/// permitted, inheritable, ambient and bounding), in `dir`.
fn as_nobody(caps: &[&str], dir: &Path, args: &[&str]) -> Output {
    let bin = wattprof_tests::executable_by_others(&wattprof_bin());
    let list = std::iter::once("-all".to_string())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .arg(format!("--inh-caps={list}"))
        .arg(format!("--ambient-caps={list}"))
        .arg(format!("--bounding-set={list}"))
        .arg(&bin.path)
        .args(args)
        .current_dir(dir)
        .output()
        .expect("setpriv")
}

/// Why these tests cannot run here, if they cannot.
fn skip() -> Option<String> {
    if let Some(reason) = wattprof_tests::skip_reason() {
        return Some(reason);
    }
    if !Path::new("/usr/bin/setpriv").exists() {
        return Some("no setpriv (util-linux; cargo xtask test installs it)".into());
    }
    // Kernels before 5.8 have no CAP_BPF (setpriv refuses the name).
    let probe = Command::new("setpriv")
        .args(["--inh-caps=+bpf,+perfmon", "true"])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        return Some("this kernel or setpriv has no CAP_BPF/CAP_PERFMON".into());
    }
    None
}

/// A directory user `nobody` may write in.
fn open_dir() -> std::path::PathBuf {
    let dir = tempfile_dir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

/// A fake RAPL tree readable by root only, as the real `energy_uj` is.
fn root_only_rapl() -> FakeRapl {
    let rapl = FakeRapl::start(30.0, 3.0);
    let arg = rapl.arg();
    let root = arg.trim_start_matches("--energy-sysfs=");
    std::fs::set_permissions(root, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    rapl
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("recording")).expect("JSON")
}

#[test]
fn run_works_with_the_capability_set_alone_and_the_command_gets_none() {
    if let Some(reason) = skip() {
        wattprof_tests::say_skip(&reason);
        return;
    }
    let dir = open_dir();
    let rapl = root_only_rapl();
    let out = as_nobody(
        SET,
        &dir,
        &[
            "run",
            &rapl.arg(),
            "--output",
            "r.json",
            "--",
            "sh",
            "-c",
            "grep -E '^(CapEff|CapAmb|Uid)' /proc/self/status > caps.txt; \
             i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done",
        ],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let caps = std::fs::read_to_string(dir.join("caps.txt")).expect("caps.txt");
    assert!(caps.contains("CapEff:\t0000000000000000"), "{caps}");
    assert!(caps.contains("CapAmb:\t0000000000000000"), "{caps}");
    assert!(caps.contains("Uid:\t65534"), "{caps}");
    let r = read_json(&dir.join("r.json"));
    let cpu_ns = r
        .pointer("/command/on_cpu_ns")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    assert!(cpu_ns > 1e8, "the loop's CPU time: {cpu_ns} ns\n{r}");
    // Energy came from the root-only counters.
    let measured = r
        .pointer("/energy/domains/0/measured_j")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    assert!(measured > 0.0, "{r}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn monitor_and_sources_work_with_the_capability_set_alone() {
    if let Some(reason) = skip() {
        wattprof_tests::say_skip(&reason);
        return;
    }
    let dir = open_dir();
    let rapl = root_only_rapl();
    let addr = format!("127.0.0.1:{}", free_port());
    let scraper = {
        let addr = addr.clone();
        std::thread::spawn(move || {
            for _ in 0..40 {
                std::thread::sleep(std::time::Duration::from_millis(100));
                if let Some((200, body)) = http_get(&addr, "/metrics") {
                    return body;
                }
            }
            String::new()
        })
    };
    let out = as_nobody(
        SET,
        &dir,
        &[
            "monitor",
            &rapl.arg(),
            "--duration",
            "3s",
            "--prometheus",
            &addr,
            "--output",
            "m.json",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let body = scraper.join().expect("scraper");
    assert!(body.contains("wattprof_cpu_seconds_total"), "{body}");
    let m = read_json(&dir.join("m.json"));
    let intervals = m["intervals"].as_array().map_or(0, Vec::len);
    assert!(intervals >= 2, "{m}");
    // `sources` reads the machine's own readers (it has no fixture option).
    let sources = as_nobody(SET, &dir, &["sources", "--check", "1s"]);
    let text = String::from_utf8_lossy(&sources.stdout);
    assert!(
        sources.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&sources.stderr)
    );
    assert!(
        text.contains("powercap") && text.contains("in use"),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn each_missing_capability_gets_a_line_naming_it() {
    if let Some(reason) = skip() {
        wattprof_tests::say_skip(&reason);
        return;
    }
    let dir = open_dir();
    for (without, needle) in [
        ("bpf", "missing CAP_BPF:"),
        ("perfmon", "missing CAP_PERFMON:"),
        ("dac_read_search", "grant it CAP_DAC_READ_SEARCH"),
    ] {
        let caps: Vec<&str> = SET.iter().copied().filter(|c| *c != without).collect();
        let out = as_nobody(&caps, &dir, &["run", "--cpu-tdp", "10", "--", "true"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(125), "without {without}: {err}");
        let lines: Vec<&str> = err.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "without {without}: {err}");
        assert!(lines[0].contains(needle), "without {without}: {err}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_shipped_unit_and_daemonset_grant_exactly_the_tested_set() {
    let deploy = Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy"));
    let unit = std::fs::read_to_string(deploy.join("wattprof.service")).expect("unit");
    let want: Vec<String> = SET
        .iter()
        .map(|c| format!("CAP_{}", c.to_uppercase()))
        .collect();
    for key in ["AmbientCapabilities=", "CapabilityBoundingSet="] {
        let line = unit
            .lines()
            .find(|l| l.starts_with(key))
            .unwrap_or_else(|| panic!("no {key} in the unit"));
        let got: Vec<&str> = line[key.len()..].split_whitespace().collect();
        assert_eq!(got, want, "{line}");
    }
    assert!(unit.contains("\nDynamicUser=yes\n"), "{unit}");
    let daemonset =
        std::fs::read_to_string(deploy.join("wattprof-daemonset.yaml")).expect("daemonset");
    let add: Vec<String> = SET
        .iter()
        .map(|c| format!("\"{}\"", c.to_uppercase()))
        .collect();
    assert!(
        daemonset.contains(&format!("add: [{}]", add.join(", "))),
        "{daemonset}"
    );
    assert!(daemonset.contains("privileged: false"), "{daemonset}");
    // systemd's own check of the unit, with the binary where it is here.
    if Path::new("/usr/bin/systemd-analyze").exists() {
        let dir = tempfile_dir();
        let copy = dir.join("wattprof.service");
        std::fs::write(
            &copy,
            unit.replace(
                "/usr/local/bin/wattprof",
                wattprof_bin().to_str().expect("utf-8"),
            ),
        )
        .expect("write");
        let out = Command::new("systemd-analyze")
            .arg("verify")
            .arg(&copy)
            .output()
            .expect("systemd-analyze");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && !err.contains("wattprof.service:"),
            "{err}"
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
