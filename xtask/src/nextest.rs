//! The suite on cargo-nextest (`.config/nextest.toml`), and its results
//! read from the JUnit file nextest writes: each test's outcome, its
//! output and its failure message, per test, with no parsing of the
//! human log.
//!
//! What is counted:
//! - a test whose output has a line `skipping: <test>: <reason>` (the
//!   tests' `say_skip` and `skip_test!`) and that passed is skipped, once,
//!   with its reason;
//! - a test that failed and then passed on a retry is flaky, never a
//!   plain pass, and is listed with its first failure;
//! - a failed test (a panic, a timeout, a crash) is listed with its
//!   message;
//! - a run that failed with no failed test in its file (it did not
//!   build, or a binary could not be listed) is one failure.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};

use crate::workspace_root;

/// The version installed where cargo-nextest is missing.
const VERSION: &str = "0.9.143";

/// At most this many lines of one failed test's message are kept.
const FAILURE_LINES: usize = 12;

/// A failed (or flaky) test: where, which, and its message's lines.
pub(crate) struct Failure {
    /// nextest's binary id (`wattprof-tests::energy`, `profiler`), or
    /// empty for a check that is not a test binary's.
    pub(crate) binary: String,
    pub(crate) name: String,
    pub(crate) message: Vec<String>,
}

/// Each test counted once.
#[derive(Default)]
pub(crate) struct Counts {
    pub(crate) passed: u64,
    pub(crate) failed: u64,
    /// Skipped tests by binary and name, with their reason.
    pub(crate) skipped: BTreeMap<String, String>,
    /// Tests that failed and then passed on a retry, with the first
    /// failure.
    pub(crate) flaky: Vec<Failure>,
    pub(crate) failures: Vec<Failure>,
}

/// Installs cargo-nextest from crates.io when `cargo nextest` is missing.
pub(crate) fn ensure() -> Result<()> {
    // `cargo-nextest 0.9.143 (60fa45f63 2026-08-04)`: at least VERSION
    // (.config/nextest.toml requires it too).
    let has = || {
        let out = crate::test::cargo().args(["nextest", "--version"]).output();
        out.ok()
            .filter(|o| o.status.success())
            .and_then(|o| {
                let text = String::from_utf8_lossy(&o.stdout).into_owned();
                let v = text.split_whitespace().nth(1)?.to_string();
                Some(version(&v) >= version(VERSION))
            })
            .unwrap_or(false)
    };
    if has() {
        return Ok(());
    }
    eprintln!(
        "cargo-nextest is missing or older than {VERSION}: installing {VERSION} from crates.io"
    );
    let status = crate::test::cargo()
        .args(["install", "--locked", "cargo-nextest", "--version", VERSION])
        .status()
        .context("running cargo install cargo-nextest")?;
    if !status.success() || !has() {
        bail!(
            "could not install cargo-nextest {VERSION} (hint: `cargo install --locked \
             cargo-nextest` needs crates.io)"
        );
    }
    Ok(())
}

/// `0.9.143` as numbers, for comparing versions.
fn version(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// The JUnit file the default profile writes.
fn junit_path() -> PathBuf {
    workspace_root().join("target/nextest/default/junit.xml")
}

/// Runs `cargo nextest run` with `args` (its output shown as it comes),
/// keeps its JUnit file as `target/nextest/<name>.xml`, and counts its
/// results. False when anything failed.
pub(crate) fn run(cmd: &mut Command, name: &str, counts: &mut Counts) -> Result<bool> {
    run_reading(cmd, name, counts, &junit_path())
}

/// [`run`], with the results read from `junit`.
fn run_reading(cmd: &mut Command, name: &str, counts: &mut Counts, junit: &Path) -> Result<bool> {
    let junit = junit.to_path_buf();
    // A file left by an earlier run must not be read as this run's.
    let _ = std::fs::remove_file(&junit);
    eprintln!("+ {cmd:?}");
    let status = cmd.status().context("running cargo nextest")?;
    let failed_before = counts.failed;
    // No results, or unreadable ones, are a failure whatever nextest's
    // exit status says: nothing counted must never read as green.
    let read = std::fs::read_to_string(&junit)
        .map_err(anyhow::Error::from)
        .and_then(|xml| counts.add_junit(&xml));
    match read {
        Ok(()) => {
            let kept = junit.with_file_name(format!("../{name}.xml"));
            let _ = std::fs::copy(&junit, &kept);
            eprintln!("JUnit: {}", normal(&kept).display());
        }
        Err(e) => {
            counts.failed += 1;
            counts.failures.push(Failure {
                binary: String::new(),
                name: format!("{name}: no results from nextest"),
                message: vec![format!("{}: {e:#}", junit.display())],
            });
            return Ok(false);
        }
    }
    if !status.success() && counts.failed == failed_before {
        counts.failed += 1;
        counts.failures.push(Failure {
            binary: String::new(),
            name: format!("{name}: cargo nextest failed with no failed test counted"),
            message: vec![format!(
                "{status}: it did not build, or a test binary could not be listed (see above)"
            )],
        });
    }
    Ok(status.success())
}

/// `a/b/../c` as `a/c`, for the path shown.
fn normal(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            c => out.push(c),
        }
    }
    out
}

/// The first lines of a failure's text, up to its backtrace.
fn message_of(node: roxmltree::Node) -> Vec<String> {
    let text = node.text().unwrap_or("");
    let mut lines: Vec<String> = text
        .lines()
        .take_while(|l| !l.starts_with("stack backtrace:"))
        .filter(|l| !l.trim().is_empty())
        .take(FAILURE_LINES)
        .map(str::to_string)
        .collect();
    if lines.is_empty() {
        // A timeout or a crash has only its kind (and perhaps a message).
        let what = [node.attribute("message"), node.attribute("type")];
        lines.push(what.into_iter().flatten().collect::<Vec<_>>().join(": "));
    }
    lines
}

/// The reason in a `skipping: <test>: <reason>` line of a test's own
/// output, if it has one.
fn skip_reason(case: roxmltree::Node, name: &str) -> Option<String> {
    let outputs = case
        .children()
        .filter(|c| c.has_tag_name("system-out") || c.has_tag_name("system-err"));
    for out in outputs {
        for line in out.text().unwrap_or("").lines() {
            if let Some(rest) = line.trim().strip_prefix("skipping: ") {
                let reason = rest
                    .strip_prefix(name)
                    .and_then(|r| r.strip_prefix(": "))
                    .unwrap_or(rest);
                return Some(reason.trim().to_string());
            }
        }
    }
    None
}

impl Counts {
    /// One nextest run's JUnit file: every `testcase`, once.
    pub(crate) fn add_junit(&mut self, xml: &str) -> Result<()> {
        let doc = roxmltree::Document::parse(xml)?;
        for case in doc.descendants().filter(|n| n.has_tag_name("testcase")) {
            let name = case.attribute("name").unwrap_or("unnamed test").to_string();
            let binary = case.attribute("classname").unwrap_or("").to_string();
            let child = |tag: &str| case.children().find(|c| c.has_tag_name(tag));
            if let Some(f) = child("failure").or_else(|| child("error")) {
                self.failed += 1;
                self.failures.push(Failure {
                    binary,
                    name,
                    message: message_of(f),
                });
            } else if let Some(f) = child("flakyFailure").or_else(|| child("flakyError")) {
                self.flaky.push(Failure {
                    binary,
                    name,
                    message: message_of(f),
                });
            } else if child("skipped").is_some() {
                self.skipped
                    .insert(format!("{binary}: {name}"), "ignored".into());
            } else if let Some(reason) = skip_reason(case, &name) {
                self.skipped.insert(format!("{binary}: {name}"), reason);
            } else {
                self.passed += 1;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::Counts;

    /// nextest 0.9.143's JUnit for: a pass, a skip, a failure, a flaky
    /// test, a timeout and an ignored test (trimmed backtraces).
    const JUNIT: &str = r#"<?xml version="1.0" encoding="UTF-8"?>
<testsuites name="nextest-run" tests="5" skipped="1" failures="2" errors="0">
    <testsuite name="nx" tests="5" skipped="1" errors="0" failures="2">
        <testcase name="t::bad" classname="nx" time="0.105">
            <failure message="thread &apos;t::bad&apos; (11598) panicked at src/lib.rs:4:45" type="test failure with exit code 101">thread &apos;t::bad&apos; (11598) panicked at src/lib.rs:4:45:
assertion `left == right` failed: why &lt;&amp;&gt; it failed
  left: 1
 right: 2
stack backtrace:
   0: __rustc::rust_begin_unwind</failure>
            <system-out>
running 1 test
test t::bad ... FAILED
</system-out>
            <system-err>skipping: t::bad: said, then failed
</system-err>
        </testcase>
        <testcase name="t::ok" classname="nx" time="0.007">
            <system-out>
running 1 test
out
test t::ok ... ok
</system-out>
            <system-err></system-err>
        </testcase>
        <testcase name="t::skip" classname="wattprof-tests::energy" time="0.007">
            <system-out>skipping: t::skip: needs root
</system-out>
            <system-err>skipping: t::skip: needs root
</system-err>
        </testcase>
        <testcase name="t::flaky" classname="nx" time="0.007">
            <flakyFailure time="0.106" message="m" type="test failure with exit code 101">thread &apos;t::flaky&apos; (11599) panicked at src/lib.rs:6:121:
first time
stack backtrace:
   0: __rustc::rust_begin_unwind
                <system-out>
running 1 test
</system-out>
            </flakyFailure>
            <system-out>
test t::flaky ... ok
</system-out>
        </testcase>
        <testcase name="t::slow" classname="nx" time="4.004">
            <failure type="test timeout"/>
            <system-out>
running 1 test
</system-out>
        </testcase>
        <testcase name="t::ignored" classname="nx">
            <skipped/>
        </testcase>
    </testsuite>
</testsuites>"#;

    #[test]
    fn each_outcome_is_counted_once_with_its_message() {
        let mut c = Counts::default();
        c.add_junit(JUNIT).expect("parses");
        assert_eq!((c.passed, c.failed), (1, 2));
        // Printed twice (stdout and stderr), counted once, name stripped.
        assert_eq!(c.skipped["wattprof-tests::energy: t::skip"], "needs root");
        assert_eq!(c.skipped["nx: t::ignored"], "ignored");
        assert_eq!(c.skipped.len(), 2);
        // A test that said it skipped and then failed is a failure only.
        let bad = &c.failures[0];
        assert_eq!((bad.binary.as_str(), bad.name.as_str()), ("nx", "t::bad"));
        assert_eq!(
            bad.message,
            [
                "thread 't::bad' (11598) panicked at src/lib.rs:4:45:",
                "assertion `left == right` failed: why <&> it failed",
                "  left: 1",
                " right: 2"
            ]
        );
        // A timeout has no text: its kind is the message.
        assert_eq!(c.failures[1].message, ["test timeout"]);
        // Flaky: not a pass, listed with its first failure.
        assert_eq!(c.flaky.len(), 1);
        assert_eq!(c.flaky[0].name, "t::flaky");
        assert_eq!(c.flaky[0].message[1], "first time");
    }

    #[test]
    fn a_run_with_no_results_or_bad_ones_is_a_failure_even_when_it_exits_0() {
        let dir = std::env::temp_dir().join(format!("xtask-junit-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("default")).expect("dir");
        let junit = dir.join("default/junit.xml");
        let mut c = Counts::default();
        let ok = super::run_reading(
            &mut std::process::Command::new("true"),
            "none",
            &mut c,
            &junit,
        )
        .expect("runs");
        assert!(!ok);
        assert_eq!(c.failed, 1);
        assert_eq!(c.failures[0].name, "none: no results from nextest");
        // A file the command writes, unreadable.
        let mut write = std::process::Command::new("sh");
        write
            .arg("-c")
            .arg(format!("echo '<testsuites>' > {}", junit.display()));
        let ok = super::run_reading(&mut write, "bad", &mut c, &junit).expect("runs");
        assert!(!ok);
        assert_eq!(c.failed, 2);
        assert_eq!(c.failures[1].name, "bad: no results from nextest");
        // A good one is kept beside the profile's directory.
        let mut good = std::process::Command::new("sh");
        good.arg("-c")
            .arg(format!("echo '{JUNIT}' > {}", junit.display()));
        assert!(super::run_reading(&mut good, "good", &mut c, &junit).expect("runs"));
        assert!(dir.join("good.xml").exists());
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_long_message_is_cut_and_bad_xml_is_an_error() {
        let body: String = (0..40).map(|k| format!("line {k}\n")).collect();
        let xml = format!(
            "<testsuites><testsuite><testcase name=\"a\" classname=\"b\">\
             <failure type=\"t\">{body}</failure></testcase></testsuite></testsuites>"
        );
        let mut c = Counts::default();
        c.add_junit(&xml).expect("parses");
        assert_eq!(c.failures[0].message.len(), super::FAILURE_LINES);
        assert!(
            Counts::default()
                .add_junit("<testsuites><testcase>")
                .is_err()
        );
    }
}
