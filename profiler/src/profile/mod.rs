//! One profile (a `run` or a `monitor`): each interval, the tracker's
//! sample and the readers' energy go through the attribution engine, the
//! results are summed per process, group, cgroup and window, and the
//! interval's record goes to every sink.
//!
//! This is the only place the pieces meet: `tracker` measures time,
//! `sources` measure energy, `attribution` divides, `sums` adds up, and
//! every output is a `sink`.

mod filter;
mod held;
mod interval;
mod record;
mod report;
pub(crate) mod sampling;
pub(crate) mod served;
pub(crate) mod stacks;
pub(crate) mod statics;
pub mod windows;

pub(crate) use filter::Filter;
pub(crate) use report::{CommandEnd, Ending, Finished, host_report};

pub(crate) use crate::sources::registry::{ReaderConfig, Readers};

use crate::attribution::{ConsumerId, EnergyBy};
use crate::carbon::CarbonIntensity;
use crate::hash::IntMap;
use crate::model::record::{HeaderRecord, IntervalRecord};
use crate::model::{HostReport, RUN_SCHEMA_VERSION, WindowReport};
use crate::process::{ProcFs, ProcessTable, Role};
use crate::sink::{Sink, Totals};
use crate::sums::Sums;
use crate::tracker::{CpuSampler, TrackerError};

/// Which processes a profile reports one by one.
#[derive(Clone, Debug)]
pub(crate) enum Scope {
    /// `run`: the command's tree and wattprof.
    Tree,
    /// `monitor`: the `top` processes with the most energy in each
    /// interval, limited to `pids` and their descendants when given.
    Machine {
        /// Rows per interval.
        top: usize,
        /// Only these pids and their descendants (empty: all).
        pids: Vec<u32>,
        /// Rows, those with the most energy, whose memory is read.
        memory_top: usize,
    },
}

/// How a profile is set up.
#[derive(Clone, Debug)]
pub(crate) struct ProfileConfig {
    /// CO2 per kWh.
    pub(crate) carbon: CarbonIntensity,
    /// Which processes are reported one by one.
    pub(crate) scope: Scope,
    /// Which processes are reported one by one.
    pub(crate) filter: Filter,
    /// Where the container runtimes are asked for names.
    pub(crate) runtimes: crate::process::names::RuntimeSockets,
    /// The cgroup2 file system cgroup ids are named from (`None`: this
    /// machine's mount).
    pub(crate) cgroupfs: Option<std::path::PathBuf>,
    /// How static power is shared, and the host power model.
    pub(crate) statics: statics::StaticsConfig,
}

/// Problems kept for the report.
const MAX_PROBLEMS: usize = 20;

/// Per-interval maps, kept to be reused.
#[derive(Default)]
struct Scratch {
    /// Energy per consumer.
    energy: IntMap<ConsumerId, EnergyBy>,
    /// Where each consumer is in the interval's usage.
    index: IntMap<ConsumerId, usize>,
}

/// A GPU holder as the attribution takes it: its consumer (`None`: no
/// process the tracker knows) and its SM weight.
type GpuHolder = (Option<ConsumerId>, u32);

/// One profile in progress.
pub(crate) struct Profile {
    /// Processes seen.
    pub(crate) table: ProcessTable<ProcFs>,
    procfs: ProcFs,
    readers: Readers,
    /// What is added up: per domain, consumer, group, cgroup, VM, CPU.
    sums: Sums,
    windows: windows::Windows,
    /// The daemon's clients' trees and windows (`monitor --serve`).
    served: served::Served,
    last: Option<IntervalRecord>,
    scratch: Scratch,
    /// CPU time of intervals whose energy read failed.
    held: held::HeldReads,
    /// Each divided domain's static power.
    statics: statics::Statics,
    /// `run`: the tree's processes with no exit that `/proc` no longer
    /// listed right after the final read (their exit and free records
    /// had not come).
    unlisted_at_end: crate::hash::IntSet<u32>,
    /// GPU holders (NVML's host pids) that are no process the tracker
    /// knows, each reported once (bounded: see `interval::MAX_UNMAPPED`).
    unmapped_gpu_pids: crate::hash::IntSet<u32>,
    /// Each GPU's last holders (known to the table, with their SM
    /// weights) and when they were last seen: the power settling after
    /// they leave is theirs.
    gpu_tail: std::collections::BTreeMap<u32, (Vec<GpuHolder>, u64)>,
    /// `monitor`: the rows of exited processes that used the most energy,
    /// most first (bounded by `--top`, at least 100).
    departed: Vec<crate::model::ProcessReport>,
    /// The cgroup and role of each process that ran while reads are held.
    held_origin: IntMap<ConsumerId, (u64, Role)>,
    /// Stack sampling (`--stacks`), when asked for.
    stacks: Option<stacks::StackProfile>,
    start_ns: u64,
    last_ns: u64,
    package_ids: Vec<u32>,
    cfg: ProfileConfig,
    /// Every output (the stream, the interval CSV, the recording, ...).
    sinks: Vec<Box<dyn Sink>>,
    /// Wall-clock start, from the header (clock-jump detection).
    start_unix_ns: u64,
    problems: Vec<String>,
    problem_count: u64,
    host: HostReport,
    /// The wall clock's offset from the monotonic clock at the last
    /// check, relative to the start (ns): a change is a clock jump.
    clock_skew_ns: i128,
}

/// What a window message did.
#[derive(Debug)]
pub(crate) enum WindowAnswer {
    /// A window began.
    Began,
    /// A window ended: its figures, as the recording holds them.
    Ended(Box<WindowReport>),
    /// The message was refused (why, for its sender and the report).
    Refused(String),
}

impl Profile {
    /// Merges the static power learned so far into the host power model
    /// and writes it (`monitor`): the path written, if anything was.
    pub(crate) fn save_learned(&mut self) -> Result<Option<std::path::PathBuf>, String> {
        self.statics.save_learned()
    }

    /// What was learned of the static power, to be written after the
    /// profile has ended (`finish` takes the profile).
    pub(crate) fn learned_to_save(&self) -> statics::Statics {
        self.statics.clone()
    }

    /// A profile on a machine with these package ids; it counts from
    /// [`Profile::begin`].
    pub(crate) fn new(
        table: ProcessTable<ProcFs>,
        readers: Readers,
        package_ids: Vec<u32>,
        cfg: ProfileConfig,
        sinks: Vec<Box<dyn Sink>>,
        host: HostReport,
    ) -> Self {
        let statics = statics::Statics::new(&cfg.statics, &readers, online_cpus());
        let mut sums = Sums::new(cfg.cgroupfs.as_deref(), &cfg.runtimes);
        if sinks.iter().any(|s| s.needs_vms()) {
            sums.vms = Some(Default::default());
        }
        Self {
            table,
            procfs: ProcFs::real(),
            readers,
            sums,
            windows: windows::Windows::default(),
            served: served::Served::default(),
            last: None,
            scratch: Scratch::default(),
            held: held::HeldReads::default(),
            statics,
            unlisted_at_end: Default::default(),
            unmapped_gpu_pids: Default::default(),
            gpu_tail: Default::default(),
            departed: Vec::new(),
            held_origin: IntMap::default(),
            stacks: None,
            start_ns: 0,
            last_ns: 0,
            package_ids,
            cfg,
            sinks,
            start_unix_ns: 0,
            problems: Vec::new(),
            problem_count: 0,
            host,
            clock_skew_ns: 0,
        }
    }

    /// Writes the stream's header record to every sink (the interval CSV
    /// takes its wall-clock start and carbon intensity from it, so this
    /// comes before the first tick) and keeps the wall-clock start.
    pub(crate) fn write_header(
        &mut self,
        mode: &str,
        tracker: crate::tracker::TrackerKind,
        argv: Option<&[String]>,
        start_unix_ns: u64,
    ) {
        self.start_unix_ns = start_unix_ns;
        let header = HeaderRecord {
            schema_version: RUN_SCHEMA_VERSION,
            wattprof_version: env!("CARGO_PKG_VERSION").to_string(),
            mode: mode.to_string(),
            tracker,
            start_unix_ns,
            host: self.host.clone(),
            package_ids: self.package_ids.clone(),
            readers: self.readers.used().to_vec(),
            carbon_intensity_g_per_kwh: self.cfg.carbon.g_per_kwh,
            carbon_intensity_source: self.cfg.carbon.source.clone(),
            argv: argv.map(<[String]>::to_vec),
            profiler_pid: Some(std::process::id()),
        };
        self.each_sink(|s, totals| s.header(&header, totals));
    }

    fn problem(&mut self, p: String) {
        self.problem_count += 1;
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        }
    }

    /// Samples stacks too (`--stacks`): each interval's energy of each
    /// reported process is divided over its stacks.
    pub(crate) fn set_stacks(&mut self, stacks: stacks::StackProfile) {
        self.stacks = Some(stacks);
    }

    /// The longest the sampling loop may sleep: the stack sampler's ring
    /// is drained on a timer (it never wakes the loop).
    pub(crate) fn max_sleep_ms(&self) -> i32 {
        if self.stacks.is_some() { 100 } else { i32::MAX }
    }

    /// Takes the stack samples waiting (the sampling loop calls this on
    /// every pass, so the ring never fills however long the interval).
    pub(crate) fn drain_stacks(&mut self) {
        let want = self.stack_filter();
        if let Some(s) = &mut self.stacks {
            s.drain(None, |pid| want(&self.table, pid));
        }
    }

    /// Starts counting: the energy counters' starting point, taken by the
    /// tracker right before its own (nothing that can sleep between).
    /// Returns the monotonic time counting starts.
    pub(crate) fn begin(&mut self, sampler: &mut impl CpuSampler) -> Result<u64, TrackerError> {
        let readers = &mut self.readers;
        let start_ns = sampler.begin(&mut || readers.rebase())?;
        self.start_ns = start_ns;
        self.last_ns = start_ns;
        Ok(start_ns)
    }

    /// Closes one interval: the energy counters, read by the tracker right
    /// before its own read (as at [`Profile::begin`], so both measure the
    /// same span), then the attribution. `last` closes the final one (the
    /// wattmeter program is stopped). Returns the interval's end
    /// (monotonic ns).
    pub(crate) fn tick(
        &mut self,
        sampler: &mut impl CpuSampler,
        last: bool,
    ) -> Result<u64, TrackerError> {
        let readers = &mut self.readers;
        let mut energy = None;
        let sample = sampler.sample(last, &mut || energy = Some(readers.read_counters(last)))?;
        // A sampler that failed before reading has returned its error; one
        // that never called back (none does) reads after.
        let energy = energy.unwrap_or_else(|| self.readers.read_counters(last));
        self.step(&sample, energy);
        if last && matches!(self.cfg.scope, Scope::Tree) {
            // Looked at right after the final read: one gone by then with
            // no exit had no record in it; one that exits later (a
            // background child outliving the command) is still listed.
            self.unlisted_at_end = self
                .table
                .tree()
                .into_iter()
                .filter(|p| p.exit_ns.is_none() && !self.procfs.lists(p.pid))
                .map(|p| p.pid)
                .collect();
        }
        Ok(sample.at_ns)
    }

    /// Applies window messages (text, sender pid) that arrived by
    /// `at_ns`, a sample taken at that instant first. Returns, per message,
    /// what it did: a closed window's figures are what the recording will
    /// hold for it, so the sender can be told them.
    pub(crate) fn window_messages<'m>(
        &mut self,
        messages: impl IntoIterator<Item = (&'m str, u32)>,
        at_ns: u64,
    ) -> Vec<WindowAnswer> {
        let mut answers = Vec::new();
        for (text, sender) in messages {
            let answer = match windows::parse(text, sender) {
                Ok(cmd) => match self.windows.apply(cmd, at_ns) {
                    Ok(Some(w)) => {
                        let report = self.window_report(&w);
                        for s in &mut self.sinks {
                            s.window(&report);
                        }
                        WindowAnswer::Ended(Box::new(report))
                    }
                    Ok(None) => WindowAnswer::Began,
                    Err(e) => WindowAnswer::Refused(e),
                },
                Err(e) => {
                    let e = format!("`{}` from pid {sender}: {e}", text.escape_debug());
                    self.windows.error(e.clone());
                    WindowAnswer::Refused(e)
                }
            };
            answers.push(answer);
        }
        answers
    }

    /// Adds an output after the profile was made (the exporter, the
    /// screen, the VM export, the flame graph: the ones a command adds to
    /// the common streams). Before [`Profile::write_header`].
    pub(crate) fn add_sink(&mut self, sink: Box<dyn Sink>) {
        if sink.needs_vms() {
            self.sums.vms.get_or_insert_with(Default::default);
        }
        self.sinks.push(sink);
    }

    /// The domains read so far (a window's answer leaves the others out).
    pub(crate) fn read(&self) -> crate::model::unread::Read {
        crate::model::unread::Read::of(self.sums.ledger.domains().iter().map(|d| d.key.domain))
    }

    /// What the sinks may read: the sums so far.
    pub(crate) fn totals(&self) -> Totals<'_> {
        Totals {
            sums: &self.sums,
            carbon: &self.cfg.carbon,
            profiler_ns: self.table.totals().profiler_ns,
            start_ns: self.start_ns,
            last_ns: self.last_ns,
            figures: self.statics.figures(),
            stacks: self.stacks.as_ref().map(stacks::StackProfile::ledger),
        }
    }

    /// Hands every sink what `f` gives it, with the sums so far.
    fn each_sink(&mut self, mut f: impl FnMut(&mut dyn Sink, &Totals<'_>)) {
        let mut sinks = std::mem::take(&mut self.sinks);
        let totals = self.totals();
        for s in &mut sinks {
            f(s.as_mut(), &totals);
        }
        self.sinks = sinks;
    }
}

#[cfg(test)]
mod tests;

/// Outputs that stopped early (a failed write), one line each.
fn output_errors(sinks: &[Box<dyn Sink>]) -> Vec<String> {
    sinks
        .iter()
        .filter_map(|s| s.failure())
        .map(str::to_string)
        .collect()
}

/// CPUs online now (the power model's vCPUs).
fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}
