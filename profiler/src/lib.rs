//! wattprof: an exact, eBPF-based energy profiler for Linux.
//!
//! The library behind the `wattprof` binary. Data flows one way:
//! [`tracker`] measures on-CPU time per thread in the kernel and hands out
//! [`tracker::CpuSample`]s; [`process`] turns them into processes and
//! command trees; [`output`] renders reports; [`cli`] wires it together.

pub mod attribution;
pub mod carbon;
pub mod cli;
pub mod exporter;
pub mod hash;
pub mod output;
pub mod process;
pub mod profile;
pub mod sources;
#[cfg(test)]
mod testutil;
pub mod topology;
pub mod tracker;
