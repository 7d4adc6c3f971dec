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

/// The pinned `mdbook`: the one on `PATH` or in cargo's bin folder when
/// it is that version, else installed there with `cargo install` (about
/// two minutes). Called before the tests, so a failed install shows first.
pub fn ensure_mdbook() -> Result<PathBuf> {
    let pinned = |bin: &std::path::Path| {
        output_of(Command::new(bin).arg("--version"))
            .is_some_and(|v| v.trim() == format!("mdbook v{MDBOOK_VERSION}"))
    };
    if pinned(std::path::Path::new("mdbook")) {
        return Ok(PathBuf::from("mdbook"));
    }
    let installed = cargo_home().join("bin/mdbook");
    if !pinned(&installed) {
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
pub fn build(mdbook: &std::path::Path) -> Result<()> {
    let out = Command::new(mdbook)
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
