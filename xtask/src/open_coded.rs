//! `cargo xtask bench open-coded-iter`: the open-coded task iterator
//! against `iter/task`, per thread per read, with N idle threads
//! (bench/open-coded-iter/README.md; issue #41). A project of its own,
//! outside the workspace: its eBPF object needs `asm!` on the BPF target.

use std::process::Command;

use anyhow::{Result, bail};

use crate::{run_cmd, workspace_root};

/// Builds the experiment (its eBPF object on nightly, its loader) and
/// runs it: `threads` idle threads, `rounds` paired rounds.
pub fn run(threads: usize, rounds: usize) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the experiment loads eBPF programs: run it as root");
    }
    crate::ebpf::ensure_toolchain()?;
    let dir = workspace_root().join("bench/open-coded-iter");
    run_cmd(
        Command::new("cargo")
            .current_dir(dir.join("ebpf"))
            .args(["+nightly", "build", "--release", "--locked"])
            .args(["--target", "bpfel-unknown-none", "-Z", "build-std=core"])
            .env_remove("RUSTFLAGS")
            .env_remove("RUSTC")
            .env_remove("RUSTC_WRAPPER"),
    )?;
    run_cmd(
        Command::new("cargo")
            .current_dir(&dir)
            .args(["build", "--release", "--locked"]),
    )?;
    run_cmd(
        Command::new(dir.join("target/release/open-coded-iter"))
            .arg(dir.join("ebpf/target/bpfel-unknown-none/release/open-coded-iter"))
            .arg(threads.to_string())
            .arg(rounds.to_string()),
    )
}
