//! Developer chores for wattprof: `cargo xtask build-ebpf | test | bench`.

mod bench;
mod docs;
mod ebpf;
mod isolation;
mod nextest;
mod open_coded;
mod soak;
mod test;

use anyhow::Result;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "cargo xtask", about = "wattprof developer tasks")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Rebuild the committed eBPF objects (profiler/ebpf/wattprof.bpf.o and
    /// wattprof-stacks.bpf.o) with nightly Rust, installing rust-src, LLVM
    /// and bpf-linker when missing.
    BuildEbpf {
        /// Write the objects into this directory instead of profiler/ebpf.
        #[arg(long)]
        out: Option<std::path::PathBuf>,
    },
    /// Run every check: formatting, clippy, unit tests, the root integration
    /// tests against the real eBPF object, and eBPF object freshness.
    Test {
        /// Skip the eBPF freshness check (it needs nightly and bpf-linker).
        #[arg(long)]
        no_ebpf_check: bool,
    },
    /// Build the container image (deploy/Dockerfile, FROM scratch: the
    /// release binary and the libraries it links) with the local Docker
    /// daemon; nothing is pulled.
    Image {
        /// The image's name and tag.
        #[arg(long, default_value = concat!("wattprof:", env!("CARGO_PKG_VERSION")))]
        tag: String,
    },
    /// The GPU check (scripts/gpu-check.py) with the release binary, one
    /// call under 8 minutes: calibrate, a training job, time-slicing, a
    /// context at 1 s, what a sample means, holder physics, short jobs, a
    /// PID namespace, MPS, then NVML's raw behaviour, the counter against
    /// instant power, 2:1 turns, idle and held power, overhead. Needs
    /// root, an NVIDIA GPU and PyTorch; `--stub` runs it against the NVML
    /// stub instead (as CI does). On a machine with no Rust, copy
    /// target/release/wattprof and scripts/gpu-check.py and run the script.
    GpuCheck {
        /// Against tests/nvml-stub, with stand-in loads: no GPU needed.
        #[arg(long)]
        stub: bool,
        /// Short steps instead of the full durations (30 s of load...).
        #[arg(long)]
        quick: bool,
        /// Where the summary (gpu-check.json, gpu-check.txt) goes.
        #[arg(long, default_value = "target/gpu-check")]
        out: std::path::PathBuf,
    },
    /// Benchmarks; results go to stdout, to be recorded in BENCHMARKS.md.
    Bench {
        #[command(subcommand)]
        which: bench::Which,
    },
}

/// One line for a failure (no backtrace: CI shows the end of the output,
/// and the failed tests' messages printed just before must stay in it).
fn main() -> std::process::ExitCode {
    match run(Cli::parse().command) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("xtask: {e:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run(command: Command) -> Result<()> {
    match command {
        Command::BuildEbpf { out } => {
            let out = out.unwrap_or_else(ebpf::committed_dir);
            ebpf::build(&out)?;
            println!("eBPF objects written to {}", out.display());
            Ok(())
        }
        Command::Test { no_ebpf_check } => test::run(!no_ebpf_check),
        Command::Bench { which } => bench::run(which),
        Command::GpuCheck { stub, quick, out } => {
            let wattprof = bench::wattprof_release()?;
            let mut cmd = std::process::Command::new("python3");
            cmd.arg(workspace_root().join("scripts/gpu-check.py"))
                .arg("--wattprof")
                .arg(&wattprof)
                .arg("--out")
                .arg(workspace_root().join(out));
            if stub {
                run_cmd(
                    std::process::Command::new("cargo")
                        .current_dir(workspace_root())
                        .args(["build", "--release", "--locked", "-p", "nvml-stub"]),
                )?;
                cmd.arg("--stub")
                    .arg(workspace_root().join("target/release/libnvml_stub.so"));
            }
            if quick {
                cmd.arg("--quick");
            }
            run_cmd(&mut cmd)
        }
        Command::Image { tag } => {
            let wattprof = bench::wattprof_release()?;
            let out = std::process::Command::new("sh")
                .arg(workspace_root().join("scripts/image.sh"))
                .arg(&wattprof)
                .arg(&tag)
                .output()?;
            if !out.status.success() {
                anyhow::bail!(
                    "scripts/image.sh: {}",
                    String::from_utf8_lossy(&out.stdout).trim()
                );
            }
            println!("built image {tag} from {}", wattprof.display());
            Ok(())
        }
    }
}

/// The workspace root (the parent of xtask's manifest directory).
pub fn workspace_root() -> std::path::PathBuf {
    let manifest = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    manifest.parent().unwrap_or(manifest).to_path_buf()
}

/// Runs a command, failing with its name when it cannot start or exits non-zero.
pub fn run_cmd(cmd: &mut std::process::Command) -> Result<()> {
    let shown = format!("{cmd:?}");
    let status = cmd
        .status()
        .map_err(|e| anyhow::anyhow!("cannot start {shown}: {e}"))?;
    if !status.success() {
        anyhow::bail!("{shown} failed: {status}");
    }
    Ok(())
}
