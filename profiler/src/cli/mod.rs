//! Command-line interface: one file per subcommand, wiring only.

pub(crate) mod calibrate;
pub(crate) mod child;
pub(crate) mod energy;

pub(crate) mod monitor;
pub(crate) mod remote;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod setup;
pub(crate) mod sources;
pub(crate) mod stacks;
pub(crate) mod top;

use clap::{Parser, Subcommand};

/// Exit code for bad arguments or files named on the command line (as
/// clap's own usage errors).
pub const EXIT_USAGE: i32 = 2;
/// Exit code when wattprof itself fails (as `env`, `timeout` and `nice` do).
pub const EXIT_PROFILER_FAILED: i32 = 125;
/// Exit code when the command exists but cannot be executed.
pub(crate) const EXIT_CANNOT_EXECUTE: i32 = 126;
/// Exit code when the command is not found.
pub(crate) const EXIT_NOT_FOUND: i32 = 127;

/// A command given as one option value (`--wattmeter-cmd "wattmetre-read
/// --tty=/dev/ttyUSB0"`), split into its argv at whitespace.
pub(crate) fn split_command(cmd: &str) -> Vec<String> {
    cmd.split_whitespace().map(String::from).collect()
}

/// An error with the exit code wattprof should end with.
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct Fatal {
    /// Process exit code.
    pub code: i32,
    /// One line: what happened and what to do.
    pub(crate) message: String,
}

impl Fatal {
    /// A failure of wattprof itself (exit code 125).
    pub(crate) fn profiler(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_PROFILER_FAILED,
            message: message.into(),
        }
    }

    /// Bad input from the user: arguments, files they named (exit code 2).
    pub(crate) fn usage(message: impl Into<String>) -> Self {
        Self {
            code: EXIT_USAGE,
            message: message.into(),
        }
    }
}

/// How on-CPU time is measured: options shared by `run` and `monitor`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct TrackerArgs {
    /// How on-CPU time is measured. `iter` reads the scheduler's own
    /// counters with a task iterator at each interval and at rare events
    /// (exit, migration between packages, cgroup move): nothing runs at
    /// context switches (Linux 5.8+ with BTF). `switch` charges every
    /// context switch (kernels without BTF; it costs every program on the
    /// machine ~0.5 us per switch). `auto` takes `iter` where it loads,
    /// else `switch`, and prints why.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) tracker: crate::tracker::TrackerChoice,

    /// Threads the kernel keeps per-thread state for. With `iter`, threads
    /// beyond it are read at every interval (more work, nothing lost; ~64
    /// bytes of kernel memory each); with `switch`, their time is counted
    /// as lost, never silently dropped (~190 bytes each). 16 to 4,194,304.
    #[arg(long, default_value_t = profiler_common::DEFAULT_MAX_TASKS, value_parser = clap::value_parser!(u32).range(16..=4_194_304))]
    pub(crate) max_tasks: u32,

    /// Read the CPU topology from this copy of /sys (testing).
    #[arg(long, value_name = "DIR", hide = true)]
    pub(crate) topology_sysfs: Option<std::path::PathBuf>,

    /// Iterator tracker: do not attach the program of this event, as if
    /// its records were all lost (testing).
    #[arg(long, value_enum, hide = true)]
    pub(crate) skip_event: Option<crate::tracker::SkipEvent>,

    /// Iterator tracker: how a read that skips idle threads walks them:
    /// `open-coded` (one program call, Linux 6.8+) or `iter-task` (a call
    /// per thread); `auto` takes the first where it loads (testing).
    #[arg(long, value_enum, default_value = "auto", hide = true)]
    pub(crate) task_walk: crate::tracker::TaskWalkChoice,

    /// Bytes of the open-coded walk's ring (a power of two, 4096 or more):
    /// smaller makes reads fill it and walk again (testing).
    #[arg(long, value_name = "BYTES", hide = true, value_parser = ring_bytes)]
    pub(crate) task_walk_ring: Option<u32>,
}

/// A BPF ring buffer's size: a power of two of at least a page.
fn ring_bytes(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n >= 4096 && n.is_power_of_two() => Ok(n),
        _ => Err(format!("`{s}`: a power of two of at least 4096 bytes")),
    }
}

impl TrackerArgs {
    /// The tracker's settings.
    pub(crate) fn config(&self) -> crate::tracker::TrackerConfig {
        crate::tracker::TrackerConfig {
            tracker: self.tracker,
            max_tasks: self.max_tasks,
            skip_event: self.skip_event,
            task_walk: self.task_walk,
            task_walk_ring: self.task_walk_ring,
            sys: self
                .topology_sysfs
                .clone()
                .map_or_else(crate::topology::SysRoot::real, crate::topology::SysRoot::at),
            ..crate::tracker::TrackerConfig::default()
        }
    }
}

/// wattprof: how much CPU time (and energy) each process really used.
#[derive(Parser, Debug)]
#[command(
    name = "wattprof",
    version,
    about = "Exact, eBPF-based energy profiler for Linux",
    long_about = "Exact, eBPF-based energy profiler for Linux.\n\n\
        eBPF programs read the scheduler's own count of the nanoseconds every thread \
        spends on every CPU package, including processes that live a millisecond, \
        without running anything at context switches. Needs root."
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Subcommands.
#[derive(Subcommand, Debug)]
pub(crate) enum Command {
    /// Run a command and report the CPU time and energy of it and every
    /// process it starts.
    Run(run::RunArgs),
    /// Watch the whole machine: energy per process and per cgroup, until Ctrl-C.
    Monitor(monitor::MonitorArgs),
    /// The whole machine live, in the terminal: each process's power and
    /// energy, sorted, as a tree, grouped by container or cgroup, filtered.
    Top(top::TopArgs),
    /// List the energy readers: which work here, and why the others do not.
    Sources(sources::SourcesArgs),
    /// Read a recording or stream back: totals, what it holds, two runs
    /// compared, plots, codecarbon's CSV. Needs no root.
    Report(report::ReportArgs),
    /// Over a load staircase, fit this host's power model (each domain's
    /// static power and watts per busy CPU, with no wattmeter), or the wall
    /// power (a wattmeter) to the counters for `run`/`monitor --calibration`.
    Calibrate(calibrate::CalibrateArgs),
}

/// Runs the parsed command line; returns the exit code.
pub fn main(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Run(args) => {
            // Without the privileges to load eBPF (or asked to), a daemon
            // measures the command.
            let missing = crate::privilege::missing_for_ebpf();
            if args.daemon.is_some() {
                remote::execute(args, None)
            } else if !missing.is_empty() {
                remote::execute(args, Some(crate::privilege::ebpf_message(&missing)))
            } else {
                run::execute(args)
            }
        }
        Command::Monitor(args) => monitor::execute(args),
        Command::Top(args) => top::execute(args),
        Command::Sources(args) => sources::execute(args),
        Command::Report(args) => report::execute(args),
        Command::Calibrate(args) => calibrate::execute(args),
    }
}
