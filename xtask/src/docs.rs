//! The book: `docs/` built with mdBook, installed from crates.io when
//! missing, so a broken chapter (a SUMMARY entry with no file, a bad
//! include) fails the suite.

use std::path::PathBuf;
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::ebpf::{cargo_home, output_of};
use crate::{run_cmd, workspace_root};

/// The mdBook the book is built with.
const MDBOOK_VERSION: &str = "0.5.4";

/// `mdbook`, installed with `cargo install` when neither `PATH` nor cargo's
/// bin folder has it (about two minutes).
fn mdbook() -> Result<PathBuf> {
    if output_of(Command::new("mdbook").arg("--version")).is_some() {
        return Ok(PathBuf::from("mdbook"));
    }
    let installed = cargo_home().join("bin/mdbook");
    if !installed.exists() {
        eprintln!("installing mdbook {MDBOOK_VERSION} (about two minutes)");
        run_cmd(Command::new("cargo").args([
            "install",
            "mdbook",
            "--locked",
            "--version",
            MDBOOK_VERSION,
            "--no-default-features",
            "--features",
            "search",
        ]))
        .context("installing mdbook failed; install it with `cargo install mdbook`")?;
    }
    Ok(installed)
}

/// Builds the book into `target/book`; fails on a warning too (an
/// unclosed HTML tag in a chapter renders wrong).
pub fn build() -> Result<()> {
    let out = Command::new(mdbook()?)
        .args(["build", "docs"])
        .current_dir(workspace_root())
        .output()
        .context("running mdbook")?;
    let said = String::from_utf8_lossy(&out.stderr);
    eprint!("{said}");
    if !out.status.success() {
        bail!("mdbook build docs failed");
    }
    if said
        .lines()
        .any(|l| l.contains("WARN") || l.contains("ERROR"))
    {
        bail!("mdbook build docs warned (see above)");
    }
    Ok(())
}
