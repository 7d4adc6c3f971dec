//! wattprof: an exact, eBPF-based energy profiler for Linux.
//!
//! The library behind the `wattprof` binary. Data flows one way, and no
//! module imports from one further down this list (`layering.rs` holds
//! this on the parsed sources):
//!
//! - [`tracker`] measures on-CPU time per thread in the kernel and hands
//!   out `tracker::CpuSample`s (through `tracker::CpuSampler`, which
//!   tests script);
//! - [`sources`] read energy: one file per reader behind
//!   `sources::Source`, `sources::registry`, the one list of readers and
//!   the order they are tried in, and `sources::probe`, what `wattprof
//!   sources` finds;
//! - [`staircase`] is `calibrate`'s load staircase: the load, its steps
//!   and the readings of each window;
//! - [`process`] turns samples into processes, command trees, cgroups,
//!   containers and batch jobs (named from the cgroups a scheduler makes);
//! - [`attribution`] divides one interval's energy over consumers (a pure
//!   function);
//! - [`model`] is the schema: the stream's records and the run document,
//!   which every output writes and `report` reads. It owns every name a
//!   recording holds: a lower layer's value in it (a domain, a tracker, a
//!   CPU's times) is written through its form in `model::wire`, never
//!   through that type's own derive;
//! - [`sums`] adds up what a profile measures: per domain and consumer,
//!   group, cgroup, container and batch job, VM, memory, CPU; `report` sums a cut
//!   stream with it too;
//! - [`render`] draws for people: the run's table, `top`'s live screen
//!   (its state and keys too, with no I/O), `wattprof sources`;
//! - [`sink`] is every output of a running profile behind one trait: the
//!   stream, the interval CSV, the recording, codecarbon's row, the
//!   exporter's snapshot, `top`'s terminal, the VM export, the flame graph;
//! - [`report`] reads recordings back, and draws its summaries and
//!   comparisons with `render`'s pieces;
//! - [`profile`] is the session (begin, tick, finish): each interval the
//!   counters and the tracker are read together, attributed, summed and
//!   handed to the sinks; its `profile::sampling` loop drives `run` and
//!   `monitor`;
//! - [`exporter`] serves the last snapshot over HTTP;
//! - [`serve`] is the daemon's socket (`monitor --serve`): clients known
//!   by the kernel's peer credentials ask the session to follow their
//!   process trees and windows (`profile::served` adds them up);
//! - [`cli`] parses arguments and wires the above together.
//!
//! `topology`, `carbon`, `units`, `hash` and `privilege` are leaves every
//! layer may use.
//!
//! `run` and `monitor` share one session and one sampling loop, and
//! differ in their scope (the command's tree, or the machine's top
//! processes), in what the recording keeps of each interval (all of it,
//! or its machine figures), in the sinks only `monitor` adds (the
//! exporter's snapshot, `top`'s screen, the VM export) and in their loop
//! hooks (`run`: the window socket and the command's end; `monitor`: a
//! deadline, signals, saving what it learned, and for `top` the keys and
//! the interval they set). `top` is `monitor` with its screen.
//!
//! The unit tests in `layering.rs` hold the order on the parsed sources
//! (every `use` and every path in code, `crate::`, `super::` and `self::`
//! resolved): no module imports from a layer after its own, every module
//! declared here has a layer, and no two files of one module import each
//! other. Items are `pub(crate)`: only what `main.rs`, the tests crate and
//! the fuzz targets use is `pub`, so rustc names dead code. The tests
//! crate checks recordings against `docs/recording.schema.json`;
//! `model::wire`'s tests check that every enum name written is the one
//! that schema pins, and, on the parsed sources, that each field of a
//! recorded type is model's own, standard, or written through its form.

/// Prints that the running unit test is skipped, and why: one line,
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
pub mod model;
pub mod privilege;
pub mod process;
pub mod profile;
pub mod render;
pub mod report;
pub(crate) mod serve;
pub mod sink;
pub mod sources;
pub mod staircase;
pub mod sums;
#[cfg(test)]
mod testutil;
pub mod topology;
pub mod tracker;
pub(crate) mod units;

#[cfg(test)]
mod layering;
