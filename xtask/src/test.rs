//! `cargo xtask test`: every check the project has, in one command.

use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};

use crate::{ebpf, run_cmd, workspace_root};

/// Each test counted once: cargo test's `test result:` lines give passed
/// and failed; a test that said `skipping: <test>: <reason>` (the tests'
/// `say_skip` and `skip_test!`) passed in cargo's count but is moved to
/// skipped, once however often it said so, unless it then failed.
#[derive(Default)]
struct Counts {
    passed: u64,
    failed: u64,
    /// Skipped tests by test binary and name, with the first reason.
    skipped: std::collections::BTreeMap<String, String>,
    /// Failed tests by test binary and name, with their panic message
    /// (where and what), so that the end of the output says why.
    failures: Vec<Failure>,
}

/// A failed test: its binary, its name, and its panic message's lines.
struct Failure {
    binary: String,
    name: String,
    message: Vec<String>,
}

/// At most this many lines of one failed test's panic message are kept.
const FAILURE_LINES: usize = 12;

impl Counts {
    /// One `cargo test` run's output: stdout has libtest's results,
    /// stderr cargo's `Running <binary>` lines, the tests' skip lines and
    /// their panic messages, in order. A run that failed with no failed
    /// test counted (a test binary that crashed: no result line) counts
    /// one failure.
    fn add_run(&mut self, stdout: &str, stderr: &str, success: bool) {
        let failed_before = self.failed;
        for line in stdout.lines() {
            let Some(rest) = line.trim().strip_prefix("test result: ") else {
                continue;
            };
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(kind), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let n: u64 = n.trim_start_matches("ok.").trim().parse().unwrap_or(0);
                match kind {
                    "passed" => self.passed += n,
                    "failed" => self.failed += n,
                    _ => {}
                }
            }
        }
        let failed_names = failed_test_names(stdout);
        let mut binary = String::new();
        let mut skipped = Vec::new();
        // Every panic read, in order, and the one being read.
        let mut panics: Vec<Failure> = Vec::new();
        let mut reading: Option<Failure> = None;
        // What cargo said of a test binary that did not finish.
        let mut cargo_errors = Vec::new();
        for raw in stderr.lines() {
            let line = raw.trim();
            if let Some(mut p) = reading.take() {
                if ends_message(line) || p.message.len() >= FAILURE_LINES {
                    panics.push(p);
                } else {
                    p.message.push(raw.to_string());
                    reading = Some(p);
                    continue;
                }
            }
            // libtest names each test's thread after the test:
            // `thread '<name>' (<tid>) panicked at <file:line:col>:`.
            if let Some(rest) = line.strip_prefix("thread '")
                && let Some((name, after)) = rest.split_once('\'')
                && let Some(at) = after.split_once("panicked at ").map(|(_, at)| at)
            {
                reading = Some(Failure {
                    binary: binary.clone(),
                    name: name.to_string(),
                    message: vec![format!("panicked at {}", at.trim_end_matches(':'))],
                });
                continue;
            }
            if line.starts_with("error: test failed")
                || line.starts_with("process didn't exit successfully")
            {
                cargo_errors.push(line.to_string());
                continue;
            }
            if let Some(rest) = line.strip_prefix("Running ") {
                binary = rest.split(" (").next().unwrap_or(rest).to_string();
            } else if let Some(rest) = line.strip_prefix("skipping: ") {
                let (name, reason) = rest.split_once(": ").unwrap_or(("unnamed test", rest));
                skipped.push((name.trim().to_string(), reason.trim().to_string()));
            } else {
                continue;
            }
            // A skip line belongs to the binary running then.
            if let Some((name, reason)) = skipped.pop() {
                if failed_names.contains(&name) {
                    continue;
                }
                self.skipped
                    .entry(format!("{binary}: {name}"))
                    .or_insert(reason);
            }
        }
        panics.extend(reading);
        // Each failed test with its last panic in each binary (a test may
        // catch a panic on purpose before the one that fails it); one with
        // none (it returned an error, or its output was cut) is listed too.
        for name in &failed_names {
            let mut found: Vec<&Failure> = Vec::new();
            for p in panics.iter().filter(|p| p.name == *name) {
                match found.iter_mut().find(|f| f.binary == p.binary) {
                    Some(f) => *f = p,
                    None => found.push(p),
                }
            }
            if found.is_empty() {
                self.failures.push(Failure {
                    binary: String::new(),
                    name: name.clone(),
                    message: vec![
                        "no panic message found (a test that returned an error, or output cut)"
                            .into(),
                    ],
                });
            }
            for f in found {
                self.failures.push(Failure {
                    binary: f.binary.clone(),
                    name: f.name.clone(),
                    message: f.message.clone(),
                });
            }
        }
        if !success && self.failed == failed_before {
            self.failed += 1;
            self.failures.push(Failure {
                binary: String::new(),
                name: "a test binary that did not finish".into(),
                message: if cargo_errors.is_empty() {
                    vec!["cargo test failed with no result line".into()]
                } else {
                    cargo_errors
                },
            });
        }
    }

    /// Passed, failed, skipped: each test once.
    fn totals(&self) -> (u64, u64, u64) {
        let skipped = self.skipped.len() as u64;
        (self.passed.saturating_sub(skipped), self.failed, skipped)
    }
}

/// Where a panic message read from stderr ends: a blank line, the
/// backtrace or the panic hook's note, or a line of something else (the
/// next panic, the next test binary, a skip line, cargo's error). std
/// prints the note only after a process's first panic, and never a blank
/// line, so the next line is often the only end there is.
fn ends_message(line: &str) -> bool {
    line.is_empty()
        || [
            "stack backtrace:",
            "note: ",
            "thread '",
            "Running ",
            "Doc-tests ",
            "skipping: ",
            "error: ",
        ]
        .iter()
        .any(|p| line.starts_with(p))
}

/// The failed tests' names in libtest's stdout: the list under the last
/// `failures:` heading of each binary (four spaces, then the name), and any
/// `test <name> ... FAILED` line (a test that printed to stdout while it
/// ran splits that line, so the list is what counts).
fn failed_test_names(stdout: &str) -> Vec<String> {
    let mut names: Vec<String> = Vec::new();
    let mut push = |n: &str| {
        if !names.iter().any(|x| x == n) {
            names.push(n.to_string());
        }
    };
    let mut in_list = false;
    for line in stdout.lines() {
        if let Some(name) = line
            .trim()
            .strip_prefix("test ")
            .and_then(|l| l.strip_suffix(" ... FAILED"))
        {
            push(name);
        }
        if line.trim_end() == "failures:" {
            in_list = true;
            continue;
        }
        if in_list {
            match line.strip_prefix("    ") {
                Some(name) if !name.is_empty() && !name.contains(char::is_whitespace) => push(name),
                _ if line.trim().is_empty() => {}
                _ => in_list = false,
            }
        }
    }
    names
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
}

/// Runs a test command, echoing its output, and counts its results.
fn run_tests(cmd: &mut Command, counts: &mut Counts) -> Result<bool> {
    eprintln!("+ {cmd:?}");
    let out = cmd.output()?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    print!("{stdout}");
    eprint!("{stderr}");
    counts.add_run(&stdout, &stderr, out.status.success());
    Ok(out.status.success())
}

/// Installs Debian's `package` (as root) when `binary` is missing, for
/// the integration tests that use it (`why`). Without it those tests say
/// `skipping:` and are counted as skipped.
fn ensure_package(binary: &str, package: &str, why: &str) {
    // SAFETY: geteuid has no preconditions.
    if Path::new(binary).exists() || unsafe { libc::geteuid() } != 0 {
        return;
    }
    eprintln!("installing {package} (apt-get) for {why}");
    let install = || {
        Command::new("apt-get")
            .args(["install", "-y", "-qq", "--no-install-recommends", package])
            .env("DEBIAN_FRONTEND", "noninteractive")
            .status()
            .is_ok_and(|s| s.success())
    };
    if !install() {
        let _ = Command::new("apt-get").args(["update", "-qq"]).status();
        if !install() {
            eprintln!("warning: could not install {package}; {why} will be skipped");
        }
    }
}

/// Installs Debian's `docker.io` (and `busybox-static`, the tests' image)
/// when missing, and starts `dockerd` when nothing answers on its socket
/// (as root, on a machine without systemd running it). Where it cannot
/// start, the container tests say `skipping:` with the reason.
fn ensure_dockerd() {
    ensure_package(
        "/usr/sbin/dockerd",
        "docker.io",
        "the Docker container tests",
    );
    ensure_package(
        "/bin/busybox",
        "busybox-static",
        "the Docker tests' image (a busybox rootfs)",
    );
    ensure_daemon(
        "/usr/sbin/dockerd",
        &["docker", "info"],
        "dockerd.log",
        "the Docker tests",
    );
}

/// Installs Debian's podman when missing (its tests start podman's API
/// service themselves), and starts containerd on its default socket when
/// nothing answers there (docker.io brings containerd and `ctr`).
fn ensure_podman_and_containerd() {
    ensure_package("/usr/bin/podman", "podman", "the Podman container tests");
    ensure_daemon(
        "/usr/bin/containerd",
        &["ctr", "version"],
        "containerd.log",
        "the containerd tests",
    );
}

/// Starts `daemon` (as root, in its own process group so that it outlives
/// the tests as a system daemon would; log in `target/<log>`) unless
/// `probe` already succeeds, and waits up to 30 s for `probe` to.
fn ensure_daemon(daemon: &str, probe: &[&str], log: &str, tests: &str) {
    let answers = || {
        Command::new(probe[0])
            .args(&probe[1..])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    // SAFETY: geteuid has no preconditions.
    if answers() || !Path::new(daemon).exists() || unsafe { libc::geteuid() } != 0 {
        return;
    }
    let log_path = workspace_root().join("target").join(log);
    let Ok(log) = std::fs::File::create(&log_path) else {
        return;
    };
    eprintln!(
        "starting {daemon} for {tests} (log: {})",
        log_path.display()
    );
    let err = log.try_clone();
    let mut cmd = Command::new(daemon);
    cmd.stdin(std::process::Stdio::null()).stdout(log);
    if let Ok(err) = err {
        cmd.stderr(err);
    }
    use std::os::unix::process::CommandExt;
    cmd.process_group(0);
    if let Err(e) = cmd.spawn() {
        eprintln!("warning: cannot start {daemon}: {e}; {tests} will be skipped");
        return;
    }
    for _ in 0..60 {
        if answers() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    eprintln!(
        "warning: {daemon} did not answer within 30 s (see {}); {tests} will be skipped",
        log_path.display()
    );
}

/// codecarbon, pinned, in `target/codecarbon-venv`: the VM export's test
/// checks that codecarbon's own RAPL reader reads the exported tree.
/// Without it that part says `skipping:`.
fn ensure_codecarbon() {
    const PIN: &str = "codecarbon==3.3.2";
    let venv = workspace_root().join("target/codecarbon-venv");
    let python = venv.join("bin/python");
    let has = || {
        Command::new(&python)
            .args(["-c", "import codecarbon.core.cpu"])
            .output()
            .is_ok_and(|o| o.status.success())
    };
    if has() {
        return;
    }
    eprintln!("installing {PIN} (pip, in target/codecarbon-venv) for the VM export's test");
    let make_venv = || {
        Command::new("python3")
            .args(["-m", "venv"])
            .arg(&venv)
            .status()
            .is_ok_and(|s| s.success())
    };
    if !make_venv() {
        // Debian splits venv out of python3.
        ensure_package(
            "/usr/share/doc/python3-venv",
            "python3-venv",
            "codecarbon's venv",
        );
        let _ = std::fs::remove_dir_all(&venv);
        if !make_venv() {
            eprintln!("warning: cannot make a Python venv; codecarbon's check will be skipped");
            return;
        }
    }
    let pip = Command::new(venv.join("bin/pip"))
        .args(["install", "--quiet", "--disable-pip-version-check", PIN])
        .status()
        .is_ok_and(|s| s.success());
    if !pip || !has() {
        eprintln!("warning: could not install {PIN}; codecarbon's check will be skipped");
    }
}

/// Runs everything; fails if anything fails.
pub fn run(check_ebpf: bool) -> Result<()> {
    run_cmd(cargo().args(["fmt", "--all", "--", "--check"]))?;
    run_cmd(cargo().args([
        "clippy",
        "--all-targets",
        "--locked",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The integration tests run the real binary and load the NVML stub
    // (a library only: `--bins` would skip it, so it builds on its own).
    run_cmd(cargo().args(["build", "--locked", "-p", "profiler", "--bins"]))?;
    run_cmd(cargo().args(["build", "--locked", "-p", "nvml-stub"]))?;
    // Every prerequisite before any test: the unit tests need openssl too.
    ensure_package(
        "/usr/bin/prometheus",
        "prometheus",
        "the exporter's test (a real Prometheus scrapes it)",
    );
    ensure_package(
        "/usr/bin/chromium",
        "chromium",
        "the HTML report's test (headless Chromium opens it)",
    );
    ensure_codecarbon();
    ensure_package("/usr/bin/openssl", "openssl", "the exporter's TLS tests");
    ensure_package(
        "/usr/bin/curl",
        "curl",
        "the exporter's TLS tests (an HTTPS client)",
    );
    ensure_package(
        "/usr/bin/setpriv",
        "util-linux",
        "the capabilities-only tests",
    );
    // containerd first: dockerd uses a containerd that answers on the
    // default socket, and a socket file left by one that was killed (no
    // daemon behind it) made dockerd fail to start, skipping the Docker
    // tests (seen here after a containerd was stopped).
    ensure_podman_and_containerd();
    ensure_dockerd();
    let mut counts = Counts::default();
    let mut ok = run_tests(
        cargo().args([
            "test",
            "--locked",
            "--no-fail-fast",
            "-p",
            "profiler",
            "-p",
            "profiler-common",
            "-p",
            "xtask",
            "--",
            // Skip lines are test output: captured, they would not show.
            "--nocapture",
        ]),
        &mut counts,
    )?;
    // Root tests share the kernel and measure CPU time: one at a time.
    // Hermetic: a host power model this machine has (`wattprof calibrate`
    // writes /var/lib/wattprof/power-model.json) would change every
    // fixture's split; the tests that want one give --host-model.
    ok &= run_tests(
        cargo().env("WATTPROF_HOST_MODEL", "none").args([
            "test",
            "--locked",
            "--no-fail-fast",
            "-p",
            "wattprof-tests",
            "--",
            "--test-threads=1",
            "--nocapture",
        ]),
        &mut counts,
    )?;
    if check_ebpf {
        match ebpf::clippy() {
            Ok(()) => counts.passed += 1,
            Err(e) => {
                eprintln!("eBPF clippy: {e:#}");
                counts.failed += 1;
                ok = false;
            }
        }
        match ebpf::check_fresh() {
            Ok(()) => counts.passed += 1,
            Err(e) => {
                eprintln!("eBPF freshness: {e:#}");
                counts.failed += 1;
                ok = false;
            }
        }
    }
    let (passed, failed, skipped) = counts.totals();
    if skipped > 0 {
        println!("skipped tests, with their reasons:");
        for (name, reason) in &counts.skipped {
            println!("  {name}: {reason}");
        }
    }
    if !counts.failures.is_empty() {
        println!("failed tests, with their messages:");
        for f in &counts.failures {
            if f.binary.is_empty() {
                println!("  {}", f.name);
            } else {
                println!("  {}: {}", f.binary, f.name);
            }
            for line in &f.message {
                println!("    {line}");
            }
        }
    }
    println!("wattprof: {passed} passed, {failed} failed, {skipped} skipped");
    if !ok || failed > 0 {
        bail!("tests failed");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Counts;

    #[test]
    fn counts_each_test_once() {
        let mut c = Counts::default();
        c.add_run(
            "test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n\
             test result: FAILED. 3 passed; 1 failed; 0 ignored\n\
             test c::d ... FAILED\n",
            "     Running unittests src/lib.rs (target/debug/deps/a-1)\n\
             skipping: a::b: needs root\n\
             skipping: a::b: needs root\n\
             \x20    Running tests/x.rs (target/debug/deps/x-2)\n\
             skipping: a::b: no prometheus binary\n\
             skipping: c::d: no curl\n",
            false,
        );
        // 15 passed in cargo's count: a::b skipped in two binaries (once
        // each however often it said so); c::d said it skipped and then
        // failed, so it is a failure only.
        assert_eq!(c.totals(), (13, 1, 2));
        assert_eq!(c.skipped["unittests src/lib.rs: a::b"], "needs root");
        assert_eq!(c.skipped["tests/x.rs: a::b"], "no prometheus binary");
    }

    #[test]
    fn a_failed_test_s_last_panic_message_is_kept_and_others_are_not() {
        let mut c = Counts::default();
        // As libtest and std print them: b wrote to stdout while it ran
        // (its FAILED is on a line of its own), std's note follows only a
        // process's first panic, and nothing ends b's message but the
        // skip line after it.
        c.add_run(
            "running 3 tests\n\
             test run::a ... ok\n\
             test run::b ... some output of b\n\
             FAILED\n\
             test run::c ... ok\n\
             \n\
             failures:\n\
             \n\
             failures:\n\
             \x20   run::b\n\
             \n\
             test result: FAILED. 2 passed; 1 failed; 0 ignored\n",
            "     Running tests/run.rs (target/debug/deps/run-1)\n\
             thread 'run::a' (12) panicked at tests/run.rs:3:5:\n\
             a worker's panic that the test caught\n\
             note: run with `RUST_BACKTRACE=1` environment variable to display a backtrace\n\
             thread 'run::b' (13) panicked at tests/run.rs:5:5:\n\
             a panic b caught on purpose\n\
             thread 'run::b' (13) panicked at tests/run.rs:9:9:\n\
             spawner: error 0.002\n\
             \x20 second line\n\
             skipping: run::c: no prometheus binary\n\
             error: test failed, to rerun pass `--test run`\n",
            false,
        );
        assert_eq!(c.totals(), (1, 1, 1));
        assert_eq!(c.skipped["tests/run.rs: run::c"], "no prometheus binary");
        assert_eq!(c.failures.len(), 1);
        let f = &c.failures[0];
        assert_eq!(
            (f.binary.as_str(), f.name.as_str()),
            ("tests/run.rs", "run::b")
        );
        assert_eq!(
            f.message,
            [
                "panicked at tests/run.rs:9:9",
                "spawner: error 0.002",
                "  second line"
            ]
        );
    }

    #[test]
    fn failures_with_no_panic_or_no_end_are_listed_too() {
        let mut c = Counts::default();
        // x's panic is the last thing on stderr; y returned an error (no
        // panic); a backtrace ends nothing early, and is not kept.
        c.add_run(
            "failures:\n\
             \x20   m::x\n\
             \x20   m::y\n\
             \n\
             test result: FAILED. 0 passed; 2 failed\n",
            "     Running unittests src/lib.rs (target/debug/deps/m-1)\n\
             thread 'm::x' (7) panicked at src/lib.rs:1:1:\n\
             x: 3 != 4\n\
             stack backtrace:\n\
             \x20  0: rust_begin_unwind\n\
             thread 'm::x' (7) panicked at src/lib.rs:2:2:\n\
             the last one",
            false,
        );
        let names: Vec<&str> = c.failures.iter().map(|f| f.name.as_str()).collect();
        assert_eq!(names, ["m::x", "m::y"]);
        assert!(c.failures[1].message[0].starts_with("no panic message found"));
        assert_eq!(
            c.failures[0].message,
            ["panicked at src/lib.rs:2:2", "the last one"]
        );
    }

    #[test]
    fn a_crashed_test_binary_is_a_failure() {
        let mut c = Counts::default();
        c.add_run(
            "test result: ok. 4 passed; 0 failed\n",
            "     Running tests/y.rs (target/debug/deps/y-3)\n\
             error: test failed, to rerun pass `--test y`\n\
             Caused by: process didn't exit successfully (signal: 6, SIGABRT)\n",
            false,
        );
        assert_eq!(c.totals(), (4, 1, 0));
        assert_eq!(c.failures.len(), 1);
        assert_eq!(
            c.failures[0].message,
            ["error: test failed, to rerun pass `--test y`"]
        );
    }
}
