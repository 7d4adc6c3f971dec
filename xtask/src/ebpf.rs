//! Building the eBPF object reproducibly, and installing what that needs.

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{Context, Result, bail};

use crate::{run_cmd, workspace_root};

/// The nightly the committed object was built with. Another nightly may
/// produce different bytes; the build warns instead of failing.
pub const PINNED_NIGHTLY: &str = "rustc 1.97.0-nightly (e50aa6fba 2026-05-19)";
const BPF_LINKER_VERSION: &str = "0.13.0";
const LLVM_PACKAGES: &[&str] = &[
    "llvm-22-dev",
    "libpolly-22-dev",
    "zlib1g-dev",
    "libzstd-dev",
];

/// The objects the eBPF crate builds: its binary names, each committed as
/// `profiler/ebpf/NAME.bpf.o`.
pub const OBJECTS: [&str; 2] = ["wattprof", "wattprof-stacks"];

/// Where the committed objects live.
pub fn committed_dir() -> PathBuf {
    workspace_root().join("profiler/ebpf")
}

pub fn output_of(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub fn cargo_home() -> PathBuf {
    std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .unwrap_or_else(|| PathBuf::from("/root/.cargo"))
}

fn bpf_linker_present() -> bool {
    output_of(Command::new("bpf-linker").arg("--version")).is_some()
        || cargo_home().join("bin/bpf-linker").exists()
}

/// Installs nightly's rust-src, Debian's LLVM 22 and bpf-linker when missing.
pub fn ensure_toolchain() -> Result<()> {
    let version = output_of(Command::new("rustc").args(["+nightly", "-V"])).context(
        "no nightly Rust toolchain: install it with `rustup toolchain install nightly` \
         (the committed object was built with the pinned nightly in xtask/src/ebpf.rs)",
    )?;
    if version != PINNED_NIGHTLY {
        eprintln!(
            "warning: nightly is `{version}`, the committed object was built with \
             `{PINNED_NIGHTLY}`; the object may differ byte for byte"
        );
    }
    let components = output_of(Command::new("rustup").args([
        "component",
        "list",
        "--installed",
        "--toolchain",
        "nightly",
    ]))
    .unwrap_or_default();
    if !components.lines().any(|c| c.starts_with("rust-src")) {
        eprintln!("installing rust-src for nightly");
        run_cmd(Command::new("rustup").args([
            "component",
            "add",
            "rust-src",
            "--toolchain",
            "nightly",
        ]))?;
    }
    if !bpf_linker_present() {
        if !Path::new("/usr/lib/llvm-22/bin/llvm-config").exists() {
            eprintln!("installing LLVM 22 development files (apt-get)");
            run_cmd(Command::new("apt-get").args(["update", "-qq"]))?;
            run_cmd(
                Command::new("apt-get")
                    .args(["install", "-y", "-qq"])
                    .args(LLVM_PACKAGES)
                    .env("DEBIAN_FRONTEND", "noninteractive"),
            )
            .context("installing LLVM 22 failed; as root run: apt-get install -y llvm-22-dev libpolly-22-dev zlib1g-dev libzstd-dev")?;
        }
        eprintln!("installing bpf-linker {BPF_LINKER_VERSION} (about a minute)");
        run_cmd(
            Command::new("cargo")
                .args([
                    "install",
                    "bpf-linker",
                    "--locked",
                    "--version",
                    BPF_LINKER_VERSION,
                    "--no-default-features",
                    "--features",
                    "llvm-22",
                ])
                .env("LLVM_PREFIX", "/usr/lib/llvm-22"),
        )?;
    }
    Ok(())
}

/// Builds the eBPF objects into the directory `out`.
///
/// Reproducible from any checkout: the workspace, cargo home and sysroot
/// paths are remapped, so the debug info (from which BTF is made) names
/// the same paths everywhere.
pub fn build(out: &Path) -> Result<()> {
    ensure_toolchain()?;
    let root = workspace_root();
    let sysroot = output_of(Command::new("rustc").args(["+nightly", "--print", "sysroot"]))
        .context("cannot find nightly's sysroot")?;
    let flags = [
        "-Cdebuginfo=2".to_string(),
        "-Clink-arg=--btf".to_string(),
        format!("--remap-path-prefix={}=/wattprof", root.display()),
        format!("--remap-path-prefix={}=/cargo", cargo_home().display()),
        format!("--remap-path-prefix={sysroot}=/rust"),
    ];
    let target_dir = root.join("target/ebpf");
    let mut path = std::env::var_os("PATH").unwrap_or_default();
    let bin = cargo_home().join("bin");
    path = std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&path)))?;
    run_cmd(
        nightly_bpf("build", &target_dir)
            .env("CARGO_ENCODED_RUSTFLAGS", flags.join("\x1f"))
            .env("PATH", path),
    )?;
    std::fs::create_dir_all(out)?;
    for name in OBJECTS {
        let built = target_dir.join("bpfel-unknown-none/release").join(name);
        let to = out.join(format!("{name}.bpf.o"));
        std::fs::copy(&built, &to)
            .with_context(|| format!("copying {} to {}", built.display(), to.display()))?;
    }
    Ok(())
}

/// Runs clippy (the workspace lints, warnings denied) on the eBPF crate,
/// which the workspace's own clippy run leaves out: it only builds for
/// the BPF target, on nightly.
pub fn clippy() -> Result<()> {
    ensure_toolchain()?;
    run_cmd(
        nightly_bpf("clippy", &workspace_root().join("target/ebpf-clippy"))
            .args(["--", "-D", "warnings"]),
    )
}

/// `cargo +nightly SUBCOMMAND` on the eBPF crate for the BPF target, with
/// no flags or compiler from the environment.
fn nightly_bpf(subcommand: &str, target_dir: &Path) -> Command {
    let mut c = Command::new("cargo");
    c.current_dir(workspace_root())
        .args([
            "+nightly",
            subcommand,
            "--package",
            "profiler-ebpf",
            "--release",
            "--target",
            "bpfel-unknown-none",
            "-Z",
            "build-std=core",
            "--locked",
        ])
        .arg("--target-dir")
        .arg(target_dir)
        .env_remove("RUSTFLAGS")
        .env_remove("RUSTC")
        .env_remove("RUSTC_WRAPPER");
    c
}

/// Rebuilds the objects and fails when one differs from the committed one.
pub fn check_fresh() -> Result<()> {
    let fresh = workspace_root().join("target/ebpf/fresh");
    build(&fresh)?;
    for name in OBJECTS {
        let file = format!("{name}.bpf.o");
        let committed = std::fs::read(committed_dir().join(&file))
            .with_context(|| format!("reading the committed eBPF object {file}"))?;
        let rebuilt = std::fs::read(fresh.join(&file))?;
        if committed != rebuilt {
            bail!(
                "profiler/ebpf/{file} does not match its sources ({} vs {} bytes): \
                 run `cargo xtask build-ebpf` and commit the objects",
                committed.len(),
                rebuilt.len()
            );
        }
        println!("eBPF object {file} is fresh ({} bytes)", committed.len());
    }
    Ok(())
}
