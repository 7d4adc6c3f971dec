//! wattprof: an exact, eBPF-based energy profiler for Linux.
//!
//! The library behind the `wattprof` binary. Data flows one way, and no
//! module imports from one further down this list:
//!
//! - [`tracker`] measures on-CPU time per thread in the kernel and hands
//!   out [`tracker::CpuSample`]s (through [`tracker::CpuSampler`], which
//!   tests script);
//! - [`sources`] read energy: one file per reader behind
//!   [`sources::Source`], and [`sources::registry`], the one list of
//!   readers and the order they are tried in;
//! - [`process`] turns samples into processes, command trees, cgroups and
//!   containers;
//! - [`attribution`] divides one interval's energy over consumers (a pure
//!   function) and keeps the totals;
//! - [`output`] holds what is written: the typed stream records
//!   ([`output::record`]), the JSONL writer, the recording, the tables, and
//!   every Prometheus metric's definition;
//! - [`profile`] is where they meet: each interval, the counters and the
//!   tracker are read together, attributed and summed; its
//!   [`profile::sampling`] loop drives `run` and `monitor`;
//! - [`exporter`] serves the last snapshot over HTTP;
//! - [`cli`] parses arguments and wires the above together.
//!
//! [`topology`], [`carbon`] and [`hash`] are leaves every layer may use.

/// Says that the running unit test is skipped, and why: one line,
/// `skipping: <test>: <reason>` (libtest names each test's thread after
/// the test), which `cargo xtask test` counts once, as skipped.
#[cfg(test)]
macro_rules! skip_test {
    ($($arg:tt)*) => {
        eprintln!(
            "skipping: {}: {}",
            std::thread::current().name().unwrap_or("unnamed test"),
            format!($($arg)*)
        )
    };
}

pub mod attribution;
pub mod carbon;
pub mod cli;
pub mod exporter;
pub mod hash;
pub mod output;
pub mod privilege;
pub mod process;
pub mod profile;
pub mod report;
pub mod sources;
#[cfg(test)]
mod testutil;
pub mod topology;
pub mod tracker;

#[cfg(test)]
mod layering {
    /// The layers of the crate map above, lowest first.
    const LAYERS: [&str; 8] = [
        "tracker",
        "sources",
        "process",
        "attribution",
        "output",
        "profile",
        "exporter",
        "cli",
    ];

    fn files(dir: &std::path::Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                files(&p, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p);
            }
        }
    }

    #[test]
    fn no_module_imports_from_a_layer_above_it() {
        let src = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut bad = Vec::new();
        for (rank, layer) in LAYERS.iter().enumerate() {
            let mut paths = Vec::new();
            files(&src.join(layer), &mut paths);
            paths.push(src.join(format!("{layer}.rs")));
            for path in paths {
                let Ok(text) = std::fs::read_to_string(&path) else {
                    continue;
                };
                for above in &LAYERS[rank + 1..] {
                    if text.contains(&format!("crate::{above}::"))
                        || text.contains(&format!("crate::{above};"))
                        || text.contains(&format!("crate::{above}}}"))
                    {
                        bad.push(format!("{} uses {above}", path.display()));
                    }
                }
            }
        }
        assert!(bad.is_empty(), "{bad:#?}");
    }
}
