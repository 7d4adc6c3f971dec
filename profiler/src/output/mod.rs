//! What a run reports: the JSON document and the table printed at the end.

mod table;

pub use table::render_run_table;

use serde::Serialize;

use crate::process::{GroupTotals, ProcMeta, Process, ProcessTable, Role};
use crate::tracker::{CpuSample, CpuTimes};

/// Version of the run document's layout; bumped on incompatible changes.
pub const RUN_SCHEMA_VERSION: u32 = 1;

/// Per-CPU times accumulated over a run.
#[derive(Clone, Debug, Default)]
pub struct MachineTimes {
    cpus: Vec<CpuTimes>,
    events_lost: u64,
    discarded_ns: u64,
    samples: u64,
}

impl MachineTimes {
    /// Adds one sample's CPU times.
    pub fn add(&mut self, sample: &CpuSample) {
        if self.cpus.len() < sample.cpus.len() {
            self.cpus.resize(sample.cpus.len(), CpuTimes::default());
        }
        for (acc, c) in self.cpus.iter_mut().zip(&sample.cpus) {
            acc.cpu = c.cpu;
            acc.socket = c.socket;
            acc.busy_ns += c.busy_ns;
            acc.idle_ns += c.idle_ns;
            acc.idle_task_ns += c.idle_task_ns;
            acc.lost_ns += c.lost_ns;
            acc.switches += c.switches;
            acc.window_ns += c.window_ns;
        }
        self.events_lost += sample.events_lost;
        self.discarded_ns += sample.discarded_ns;
        self.samples += 1;
    }

    /// Per-CPU totals.
    pub fn cpus(&self) -> &[CpuTimes] {
        &self.cpus
    }

    fn sum(&self, f: impl Fn(&CpuTimes) -> u64) -> u64 {
        self.cpus.iter().map(f).sum()
    }
}

/// One process in the run document. Times are ns since the run started.
#[derive(Clone, Debug, Serialize)]
pub struct ProcessReport {
    /// Process id.
    pub pid: u32,
    /// Parent process id.
    pub ppid: Option<u32>,
    /// Name after its last exec (at most 15 bytes, as the kernel keeps it).
    pub comm: String,
    /// On-CPU ns, all threads.
    pub on_cpu_ns: u64,
    /// On-CPU ns per package (dense index, see `machine.package_ids`).
    pub on_cpu_ns_per_socket: Vec<u64>,
    /// When it was forked, if during the run.
    pub start_ns: Option<u64>,
    /// When it exited; null if still running at the end.
    pub exit_ns: Option<u64>,
}

/// The profiled command.
#[derive(Clone, Debug, Serialize)]
pub struct CommandReport {
    /// The command line.
    pub argv: Vec<String>,
    /// Its process id.
    pub pid: u32,
    /// Exit code, when it exited normally.
    pub exit_code: Option<i32>,
    /// Signal that killed it, if one did.
    pub signal: Option<i32>,
    /// On-CPU ns of the whole tree.
    pub on_cpu_ns: u64,
    /// Processes in the tree.
    pub processes: usize,
}

/// Whole-machine figures.
#[derive(Clone, Debug, Serialize)]
pub struct MachineReport {
    /// Possible CPUs.
    pub cpus: usize,
    /// The kernel's package id of each dense socket index.
    pub package_ids: Vec<u32>,
    /// CPU time of all tasks.
    pub busy_ns: u64,
    /// CPU time charged to no task (window - busy - lost).
    pub idle_ns: u64,
    /// Wall time with the idle task on CPU between context switches.
    pub idle_task_ns: u64,
    /// Sum of every CPU's accounting window (busy + idle + lost).
    pub window_ns: u64,
    /// Per-task time summed over all processes (tree + wattprof + other).
    pub attributed_ns: u64,
    /// Context switches.
    pub switches: u64,
    /// Per CPU.
    pub per_cpu: Vec<CpuTimes>,
}

/// wattprof's own figures.
#[derive(Clone, Debug, Serialize)]
pub struct ProfilerReport {
    /// On-CPU ns of wattprof's threads, as the tracker measured them.
    pub on_cpu_ns: u64,
    /// Kernel memory of the eBPF maps (bytes, as the kernel accounts it).
    pub kernel_memory_bytes: u64,
    /// How exits are detected.
    pub exit_tracking: crate::tracker::ExitTracking,
    /// Which clock task time comes from.
    pub task_clock: crate::tracker::TaskClock,
    /// Whether in-progress slices were closed at each read.
    pub flush_supported: bool,
    /// Capacity of the per-thread map.
    pub max_tasks: u32,
    /// Sampling interval.
    pub interval_ns: u64,
    /// Samples taken.
    pub samples: u64,
    /// Syscalls spent reading the per-thread map.
    pub map_read_syscalls: u64,
    /// Fork/exec/exit records that did not fit in the ring buffer.
    pub events_lost: u64,
    /// Time of exited threads whose final record was overwritten.
    pub discarded_ns: u64,
    /// Fork records whose task never showed up.
    pub unmatched_forks: u64,
}

/// The JSON document `wattprof run --output` writes.
#[derive(Clone, Debug, Serialize)]
pub struct RunReport {
    /// Layout version.
    pub schema_version: u32,
    /// wattprof's version.
    pub wattprof_version: String,
    /// Wall-clock start, ns since the Unix epoch.
    pub start_unix_ns: u64,
    /// Length of the run (monotonic).
    pub wall_ns: u64,
    /// The command.
    pub command: CommandReport,
    /// Every process of the command's tree.
    pub processes: Vec<ProcessReport>,
    /// On-CPU time per group.
    pub groups: GroupTotals,
    /// Machine figures.
    pub machine: MachineReport,
    /// Task time that could not be recorded per task (map full).
    pub lost_ns: u64,
    /// wattprof's own cost and health.
    pub profiler: ProfilerReport,
}

/// Everything needed to build a [`RunReport`] besides the process table.
pub struct RunFacts {
    /// The command line.
    pub argv: Vec<String>,
    /// Its pid.
    pub pid: u32,
    /// Exit code.
    pub exit_code: Option<i32>,
    /// Killing signal.
    pub signal: Option<i32>,
    /// Monotonic start of accounting.
    pub start_ns: u64,
    /// Monotonic end.
    pub end_ns: u64,
    /// Wall-clock start.
    pub start_unix_ns: u64,
    /// Package ids.
    pub package_ids: Vec<u32>,
    /// Tracker facts.
    pub profiler: ProfilerReport,
}

fn process_report(p: &Process, start_ns: u64) -> ProcessReport {
    ProcessReport {
        pid: p.pid,
        ppid: p.ppid,
        comm: p.comm.clone(),
        on_cpu_ns: p.total_ns(),
        on_cpu_ns_per_socket: p.on_cpu_ns.clone(),
        start_ns: p.start_ns.map(|t| t.saturating_sub(start_ns)),
        exit_ns: p.exit_ns.map(|t| t.saturating_sub(start_ns)),
    }
}

/// Builds the run document.
pub fn run_report<M: ProcMeta>(
    facts: RunFacts,
    table: &ProcessTable<M>,
    machine: &MachineTimes,
) -> RunReport {
    let processes: Vec<ProcessReport> = table
        .tree()
        .into_iter()
        .map(|p| process_report(p, facts.start_ns))
        .collect();
    let groups = table.totals().clone();
    let mut profiler = facts.profiler;
    profiler.on_cpu_ns = table
        .processes()
        .filter(|p| p.role == Role::Profiler)
        .map(Process::total_ns)
        .sum();
    profiler.events_lost = machine.events_lost;
    profiler.discarded_ns = machine.discarded_ns;
    profiler.samples = machine.samples;
    profiler.unmatched_forks = table.unmatched_forks();
    RunReport {
        schema_version: RUN_SCHEMA_VERSION,
        wattprof_version: env!("CARGO_PKG_VERSION").to_string(),
        start_unix_ns: facts.start_unix_ns,
        wall_ns: facts.end_ns.saturating_sub(facts.start_ns),
        command: CommandReport {
            argv: facts.argv,
            pid: facts.pid,
            exit_code: facts.exit_code,
            signal: facts.signal,
            on_cpu_ns: groups.tree_ns,
            processes: processes.len(),
        },
        processes,
        machine: MachineReport {
            cpus: machine.cpus.len(),
            package_ids: facts.package_ids,
            busy_ns: machine.sum(|c| c.busy_ns),
            idle_ns: machine.sum(|c| c.idle_ns),
            idle_task_ns: machine.sum(|c| c.idle_task_ns),
            window_ns: machine.sum(|c| c.window_ns),
            attributed_ns: groups.tree_ns + groups.profiler_ns + groups.other_ns,
            switches: machine.sum(|c| c.switches),
            per_cpu: machine.cpus.clone(),
        },
        groups,
        lost_ns: machine.sum(|c| c.lost_ns),
        profiler,
    }
}
