//! `cargo xtask test`: every check the project has, in one command.

use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};

use crate::{docs, ebpf, run_cmd, workspace_root};

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

/// One test binary's part of libtest's stdout, from its `running N tests`
/// line to the next.
#[derive(Default)]
struct Block {
    passed: u64,
    failed: u64,
    /// Its `test result:` line came (a binary that crashed has none).
    finished: bool,
    /// Failed tests: the list under `failures:` and `... FAILED` lines.
    failed_names: Vec<String>,
    /// The last test started with no outcome on its line yet.
    started: Option<String>,
}

impl Block {
    fn failed_name(&mut self, name: &str) {
        if !self.failed_names.iter().any(|n| n == name) {
            self.failed_names.push(name.to_string());
        }
    }
}

/// libtest's stdout cut into its binaries' blocks.
fn stdout_blocks(stdout: &str) -> Vec<Block> {
    let mut blocks: Vec<Block> = Vec::new();
    let mut in_list = false;
    for line in stdout.lines() {
        let trimmed = line.trim();
        if trimmed
            .strip_prefix("running ")
            .and_then(|r| r.strip_suffix(" tests").or_else(|| r.strip_suffix(" test")))
            .is_some_and(|n| n.parse::<u64>().is_ok())
        {
            blocks.push(Block::default());
            in_list = false;
            continue;
        }
        if blocks.is_empty() {
            blocks.push(Block::default());
        }
        let Some(b) = blocks.last_mut() else { continue };
        if let Some(rest) = trimmed.strip_prefix("test result: ") {
            b.finished = true;
            in_list = false;
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(kind), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let n: u64 = n.trim_start_matches("ok.").trim().parse().unwrap_or(0);
                match kind {
                    "passed" => b.passed += n,
                    "failed" => b.failed += n,
                    _ => {}
                }
            }
            continue;
        }
        if trimmed == "failures:" {
            in_list = true;
            continue;
        }
        if in_list {
            // Four spaces and a name (a doc-test's has spaces in it).
            match line.strip_prefix("    ") {
                Some(name) if !name.is_empty() && !name.starts_with(' ') => {
                    b.failed_name(name.trim_end());
                }
                _ if trimmed.is_empty() => {}
                _ => in_list = false,
            }
            continue;
        }
        if let Some((name, outcome)) = trimmed
            .strip_prefix("test ")
            .and_then(|l| l.split_once(" ..."))
        {
            let outcome = outcome.trim();
            if outcome == "FAILED" {
                b.failed_name(name);
            }
            b.started = (!["ok", "FAILED", "ignored"]
                .iter()
                .any(|o| outcome.starts_with(o)))
            .then(|| name.to_string());
        }
    }
    blocks
}

/// A test binary's name from cargo's `Running <what> (<path>)` or
/// `Doc-tests <crate>` line: unit tests are named with their crate
/// (`profiler unittests src/lib.rs`), since several crates have a
/// `src/lib.rs`.
fn binary_label(line: &str) -> Option<String> {
    if let Some(krate) = line.strip_prefix("Doc-tests ") {
        return Some(format!("doc-tests {}", krate.trim()));
    }
    let rest = line.strip_prefix("Running ")?;
    let (what, path) = rest.split_once(" (").unwrap_or((rest, ""));
    if !what.starts_with("unittests") {
        return Some(what.to_string());
    }
    // target/debug/deps/<crate>-<hash>)
    let file = path.trim_end_matches(')').rsplit('/').next().unwrap_or("");
    let krate = file.rsplit_once('-').map_or(file, |(k, _)| k);
    Some(if krate.is_empty() {
        what.to_string()
    } else {
        format!("{krate} {what}")
    })
}

impl Counts {
    /// One `cargo test` run's output: stdout has libtest's results, a
    /// block per test binary; stderr has cargo's `Running <binary>` (and
    /// `Doc-tests`) lines, the tests' skip lines and their panic messages,
    /// in order. The k-th block is the k-th binary's. A binary with no
    /// result line (it crashed) counts one failure, and a failed run
    /// with nothing else counted (it did not build) counts one.
    fn add_run(&mut self, stdout: &str, stderr: &str, success: bool) {
        let failed_before = self.failed;
        let blocks = stdout_blocks(stdout);
        let mut binaries: Vec<String> = Vec::new();
        // (binary index, test name, reason), in order.
        let mut skips: Vec<(usize, String, String)> = Vec::new();
        // Every panic read, in order, and the one being read.
        let mut panics: Vec<(usize, Failure)> = Vec::new();
        let mut reading: Option<(usize, Failure)> = None;
        // What cargo said of a test binary that did not finish, or of a
        // run that did not build.
        let mut cargo_errors = Vec::new();
        for raw in stderr.lines() {
            let line = raw.trim();
            let at = binaries.len().saturating_sub(1);
            if let Some((k, mut p)) = reading.take() {
                if ends_message(line) || p.message.len() >= FAILURE_LINES {
                    panics.push((k, p));
                } else {
                    p.message.push(raw.to_string());
                    reading = Some((k, p));
                    continue;
                }
            }
            // libtest names each test's thread after the test:
            // `thread '<name>' (<tid>) panicked at <file:line:col>:`.
            if let Some(rest) = line.strip_prefix("thread '")
                && let Some((name, after)) = rest.split_once('\'')
                && let Some(loc) = after.split_once("panicked at ").map(|(_, l)| l)
            {
                let binary = binaries.last().cloned().unwrap_or_default();
                let message = vec![format!("panicked at {}", loc.trim_end_matches(':'))];
                let name = name.to_string();
                reading = Some((
                    at,
                    Failure {
                        binary,
                        name,
                        message,
                    },
                ));
            } else if line.starts_with("error: ")
                || line.starts_with("process didn't exit successfully")
            {
                cargo_errors.push(line.to_string());
            } else if let Some(label) = binary_label(line) {
                binaries.push(label);
            } else if let Some(rest) = line.strip_prefix("skipping: ") {
                let (name, reason) = rest.split_once(": ").unwrap_or(("unnamed test", rest));
                skips.push((at, name.trim().to_string(), reason.trim().to_string()));
            }
        }
        panics.extend(reading);
        // Block k is binary k's; if they cannot be paired (a test wrote a
        // `running N tests` line of its own), every block's failed names
        // are taken as every binary's.
        let paired = blocks.len() == binaries.len();
        let all_failed: Vec<String> = blocks.iter().flat_map(|b| b.failed_names.clone()).collect();
        let failed_in = |k: usize| -> &[String] {
            if paired {
                blocks.get(k).map_or(&[], |b| b.failed_names.as_slice())
            } else {
                &all_failed
            }
        };
        let finished = |k: usize| !paired || blocks.get(k).is_some_and(|b| b.finished);
        for b in &blocks {
            self.passed += b.passed;
            self.failed += b.failed;
        }
        // A skip line belongs to the binary running then; a test that said
        // it skipped and then failed is a failure; a binary that did not
        // finish counted no passes to move its skips from.
        for (k, name, reason) in skips {
            let label = binaries.get(k).cloned().unwrap_or_default();
            if finished(k) && !failed_in(k).contains(&name) {
                self.skipped
                    .entry(format!("{label}: {name}"))
                    .or_insert(reason);
            }
        }
        // Each failed test with its last panic (a test may catch a panic
        // on purpose before the one that fails it); one with none (it
        // returned an error, or its output was cut) is listed too.
        let groups: Vec<(Option<usize>, &[String])> = if paired {
            blocks
                .iter()
                .enumerate()
                .map(|(k, b)| (Some(k), b.failed_names.as_slice()))
                .collect()
        } else {
            vec![(None, all_failed.as_slice())]
        };
        for (k, names) in groups {
            for name in names {
                let last = panics
                    .iter()
                    .rev()
                    .find(|(pk, p)| p.name == *name && k.is_none_or(|k| *pk == k))
                    .map(|(_, p)| p);
                self.failures.push(match last {
                    Some(p) => Failure {
                        binary: p.binary.clone(),
                        name: p.name.clone(),
                        message: p.message.clone(),
                    },
                    None => Failure {
                        binary: k.map(|k| binaries[k].clone()).unwrap_or_default(),
                        name: name.clone(),
                        message: vec![
                            "no panic message found (a test that returned an error, or output cut)"
                                .into(),
                        ],
                    },
                });
            }
        }
        // Binaries that started and gave no result: each one failure.
        if paired {
            for (k, b) in blocks.iter().enumerate().filter(|(_, b)| !b.finished) {
                self.failed += 1;
                let mut message = vec![match &b.started {
                    Some(t) => format!("no result line; the last test started was {t}"),
                    None => "no result line".to_string(),
                }];
                message.extend(cargo_errors.iter().cloned());
                self.failures.push(Failure {
                    binary: binaries[k].clone(),
                    name: "did not finish".into(),
                    message,
                });
            }
        }
        if !success && self.failed == failed_before {
            self.failed += 1;
            self.failures.push(Failure {
                binary: String::new(),
                name: "cargo test failed with no failed test counted".into(),
                message: if cargo_errors.is_empty() {
                    vec!["no result line".into()]
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
    // Installed on its own: on a fresh machine docker.io (which brings it)
    // comes later, and a containerd that only dockerd starts answers on
    // dockerd's socket, not /run/containerd's, so the containerd tests
    // were skipped (seen on a fresh machine).
    ensure_package("/usr/bin/containerd", "containerd", "the containerd tests");
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
    let mdbook = docs::ensure_mdbook();
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
    // The book builds (its chapters' links and the CLI reference's
    // freshness are tests of the wattprof-tests crate).
    match mdbook.and_then(|m| docs::build(&m)) {
        Ok(()) => counts.passed += 1,
        Err(e) => {
            eprintln!("docs: {e:#}");
            counts.failures.push(Failure {
                binary: String::new(),
                name: "docs: mdbook build docs".into(),
                message: vec![format!("{e:#}")],
            });
            counts.failed += 1;
            ok = false;
        }
    }
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
        // Three binaries: two crates' src/lib.rs unit tests (a and b, each
        // with a skipping test a::b) and tests/x.rs, where c::d said it
        // skipped and then failed, and another a::b skipped.
        c.add_run(
            "running 12 tests\n\
             test result: ok. 12 passed; 0 failed; 0 ignored; 0 measured; 0 filtered out\n\
             \n\
             running 2 tests\n\
             test result: ok. 2 passed; 0 failed; 0 ignored\n\
             \n\
             running 4 tests\n\
             test c::d ... FAILED\n\
             \n\
             failures:\n\
             \x20   c::d\n\
             \n\
             test result: FAILED. 3 passed; 1 failed; 0 ignored\n",
            "     Running unittests src/lib.rs (target/debug/deps/a-1)\n\
             skipping: a::b: needs root\n\
             skipping: a::b: needs root\n\
             \x20    Running unittests src/lib.rs (target/debug/deps/b_crate-9)\n\
             skipping: a::b: needs root\n\
             \x20    Running tests/x.rs (target/debug/deps/x-2)\n\
             skipping: a::b: no prometheus binary\n\
             skipping: c::d: no curl\n",
            false,
        );
        // 17 passed in cargo's count: a::b skipped in three binaries (once
        // each however often it said so); c::d said it skipped and then
        // failed, so it is a failure only.
        assert_eq!(c.totals(), (14, 1, 3));
        assert_eq!(c.skipped["a unittests src/lib.rs: a::b"], "needs root");
        assert_eq!(
            c.skipped["b_crate unittests src/lib.rs: a::b"],
            "needs root"
        );
        assert_eq!(c.skipped["tests/x.rs: a::b"], "no prometheus binary");
    }

    #[test]
    fn a_name_failing_in_one_binary_is_not_a_failure_in_another() {
        let mut c = Counts::default();
        c.add_run(
            "running 1 test\n\
             test t::x ... ok\n\
             test result: ok. 1 passed; 0 failed\n\
             running 1 test\n\
             test t::x ... FAILED\n\
             failures:\n\
             \x20   t::x\n\
             test result: FAILED. 0 passed; 1 failed\n",
            "     Running tests/a.rs (target/debug/deps/a-1)\n\
             skipping: t::x: no docker\n\
             thread 't::x' (4) panicked at tests/a.rs:1:1:\n\
             a panic caught on purpose\n\
             \x20    Running tests/b.rs (target/debug/deps/b-2)\n\
             thread 't::x' (5) panicked at tests/b.rs:2:2:\n\
             the failure\n",
            false,
        );
        assert_eq!(c.totals(), (0, 1, 1));
        assert_eq!(c.skipped["tests/a.rs: t::x"], "no docker");
        assert_eq!(c.failures.len(), 1);
        assert_eq!(c.failures[0].binary, "tests/b.rs");
        assert_eq!(c.failures[0].message[1], "the failure");
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
    fn a_crashed_test_binary_is_a_failure_beside_other_failures() {
        let mut c = Counts::default();
        // y fails a test; z crashes in its second test (no result line),
        // and its skip line moves no pass, since none was counted.
        c.add_run(
            "running 2 tests\n\
             test y::a ... FAILED\n\
             failures:\n\
             \x20   y::a\n\
             test result: FAILED. 1 passed; 1 failed\n\
             running 3 tests\n\
             test z::a ... ok\n\
             test z::b ... ",
            "     Running tests/y.rs (target/debug/deps/y-3)\n\
             thread 'y::a' (9) panicked at tests/y.rs:1:1:\n\
             y failed\n\
             \x20    Running tests/z.rs (target/debug/deps/z-4)\n\
             skipping: z::a: no curl\n\
             error: test failed, to rerun pass `--test z`\n\
             \n\
             Caused by:\n\
             \x20 process didn't exit successfully: `z-4` (signal: 6, SIGABRT)\n",
            false,
        );
        assert_eq!(c.totals(), (1, 2, 0));
        let names: Vec<(&str, &str)> = c
            .failures
            .iter()
            .map(|f| (f.binary.as_str(), f.name.as_str()))
            .collect();
        assert_eq!(
            names,
            [("tests/y.rs", "y::a"), ("tests/z.rs", "did not finish")]
        );
        assert_eq!(
            c.failures[1].message,
            [
                "no result line; the last test started was z::b",
                "error: test failed, to rerun pass `--test z`",
                "process didn't exit successfully: `z-4` (signal: 6, SIGABRT)"
            ]
        );
    }

    #[test]
    fn a_run_that_did_not_build_is_one_failure() {
        let mut c = Counts::default();
        c.add_run("", "error: could not compile `profiler`\n", false);
        assert_eq!(c.totals(), (0, 1, 0));
        assert_eq!(
            c.failures[0].message,
            ["error: could not compile `profiler`"]
        );
    }
}
