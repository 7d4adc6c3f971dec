//! `cargo xtask test`: every check the project has, in one command.
//!
//! The tests run on cargo-nextest (`nextest.rs`): the unit tests in
//! parallel, then the root integration tests one at a time, each with a
//! time limit; the counts, skips and failure messages come from nextest's
//! JUnit files (kept in `target/nextest/`).

use std::path::Path;
use std::process::Command;

use anyhow::{Result, bail};

use crate::nextest::{self, Counts, Failure};
use crate::{docs, ebpf, run_cmd, workspace_root};

/// `cargo` in the workspace root.
pub(crate) fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(workspace_root());
    c
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
    let mdbook = prepare()?;
    let mut counts = Counts::default();
    let mut ok = run_suites(&mut counts)?;
    ok &= checks(check_ebpf, mdbook, &mut counts);
    say(&counts);
    if !ok || counts.failed > 0 {
        bail!("tests failed");
    }
    Ok(())
}

/// The lints, the builds the integration tests use, and every
/// prerequisite a fresh machine lacks; the mdbook binary, if it could be
/// installed.
fn prepare() -> Result<Result<std::path::PathBuf>> {
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
    ensure_package(
        "/usr/bin/tmux",
        "tmux",
        "`wattprof top`'s tests (a real terminal, driven by keys)",
    );
    // The Slurm test starts its own one-node cluster (munged, slurmctld,
    // slurmd) from these, and ends it.
    ensure_package("/usr/sbin/munged", "munge", "the Slurm batch-job test");
    ensure_package(
        "/usr/sbin/slurmctld",
        "slurm-wlm",
        "the Slurm batch-job test (a one-node cluster of its own)",
    );
    // The epilog test adds accounting: MariaDB on a data directory of its
    // own, and slurmdbd, so `sacct` shows what the epilog stores.
    ensure_package(
        "/usr/sbin/mariadbd",
        "mariadb-server-core",
        "the Slurm epilog test (slurmdbd's database)",
    );
    ensure_package(
        "/usr/sbin/slurmdbd",
        "slurmdbd",
        "the Slurm epilog test (sacct)",
    );
    // containerd first: dockerd uses a containerd that answers on the
    // default socket, and a socket file left by one that was killed (no
    // daemon behind it) made dockerd fail to start, skipping the Docker
    // tests (seen here after a containerd was stopped).
    ensure_podman_and_containerd();
    ensure_dockerd();
    nextest::ensure()?;
    Ok(mdbook)
}

/// The unit tests (in parallel), then the root integration tests (one at
/// a time: the `root` group in .config/nextest.toml), on nextest.
fn run_suites(counts: &mut Counts) -> Result<bool> {
    let mut ok = nextest::run(
        cargo().args([
            "nextest",
            "run",
            "--profile",
            "default",
            "--locked",
            "--no-fail-fast",
            "-p",
            "profiler",
            "-p",
            "profiler-common",
            "-p",
            "xtask",
        ]),
        "unit",
        counts,
    )?;
    // Root tests share the kernel and measure CPU time: one at a time,
    // and not beside the unit tests.
    // Hermetic: a host power model this machine has (`wattprof calibrate`
    // writes /var/lib/wattprof/power-model.json) would change every
    // fixture's split; the tests that want one give --host-model.
    ok &= nextest::run(
        cargo().env("WATTPROF_HOST_MODEL", "none").args([
            "nextest",
            "run",
            "--profile",
            "default",
            "--locked",
            "--no-fail-fast",
            "-p",
            "wattprof-tests",
        ]),
        "integration",
        counts,
    )?;
    Ok(ok)
}

/// The checks that are not test binaries: the book builds (its chapters'
/// links and the CLI reference's freshness are tests of the
/// wattprof-tests crate), and the eBPF crate's lints and freshness.
fn checks(check_ebpf: bool, mdbook: Result<std::path::PathBuf>, counts: &mut Counts) -> bool {
    let mut ok = true;
    let mut check = |name: &str, r: Result<()>| match r {
        Ok(()) => counts.passed += 1,
        Err(e) => {
            eprintln!("{name}: {e:#}");
            counts.failures.push(Failure {
                binary: String::new(),
                name: name.into(),
                message: vec![format!("{e:#}")],
            });
            counts.failed += 1;
            ok = false;
        }
    };
    check(
        "docs: mdbook build docs",
        mdbook.and_then(|m| docs::build(&m)),
    );
    if check_ebpf {
        check("eBPF clippy", ebpf::clippy());
        check("eBPF freshness", ebpf::check_fresh());
    }
    ok
}

/// The skipped, flaky and failed tests with their reasons, then the
/// closing line: `wattprof: N passed, N failed, N skipped` (and `, N
/// flaky` when a test passed only on a retry).
fn say(counts: &Counts) {
    if !counts.skipped.is_empty() {
        println!("skipped tests, with their reasons:");
        for (name, reason) in &counts.skipped {
            println!("  {name}: {reason}");
        }
    }
    let list = |title: &str, tests: &[Failure]| {
        if tests.is_empty() {
            return;
        }
        println!("{title}");
        for f in tests {
            if f.binary.is_empty() {
                println!("  {}", f.name);
            } else {
                println!("  {}: {}", f.binary, f.name);
            }
            for line in &f.message {
                println!("    {line}");
            }
        }
    };
    list(
        "flaky tests (failed, then passed on a retry), with their first failure:",
        &counts.flaky,
    );
    list("failed tests, with their messages:", &counts.failures);
    let flaky = if counts.flaky.is_empty() {
        String::new()
    } else {
        format!(", {} flaky", counts.flaky.len())
    };
    println!(
        "wattprof: {} passed, {} failed, {} skipped{flaky}",
        counts.passed,
        counts.failed,
        counts.skipped.len()
    );
}
