//! One profile (a `run` or a `monitor`): each interval, the tracker's
//! sample and the readers' energy go through the attribution engine, and
//! the results are summed per process, group, cgroup and window, streamed
//! as JSON lines and kept for the recording.
//!
//! This is the only place the pieces meet: `tracker` measures time,
//! `sources` measure energy, `attribution` divides, `output` renders.

mod held;
pub mod sampling;
pub mod stacks;
pub mod statics;
pub mod windows;

pub use crate::sources::registry::{ReaderConfig, ReaderUse, Readers};

use std::collections::HashMap;

use serde_json::Value;

use crate::attribution::{
    self, ConsumerId, EnergyBy, EnergyLedger, GpuInterval, Interval, PackageTime,
};
use crate::carbon::CarbonIntensity;
use crate::hash::IntMap;
use crate::output::jsonl::{Jsonl, Typed};
use crate::output::prometheus::{Labels, Snapshot};
use crate::output::record::{
    AveragePower, DomainRow, DomainUj, GpuRow, GroupRow, GroupRows, HeaderRecord, IntervalPower,
    IntervalRecord, ProcessRow, joules, watts,
};
use crate::output::{
    CgroupReport, CommandReport, ContainerReport, DomainReport, EnergyJ, EnergyReport, GroupEnergy,
    HostReport, LearnedFit, MachineTimes, MemoryReport, ProcessReport, ProfilerReport,
    RUN_SCHEMA_VERSION, RunReport, StaticPowerReport, WindowDomainReport, WindowReport,
};
use crate::process::cgroup::CgroupNames;
use crate::process::names::ContainerNames;
use crate::process::{IntervalUsage, ProcFs, Process, ProcessTable, Role};
use crate::sources::Domain;
use crate::sources::registry::IntervalEnergy;
use crate::tracker::{CpuSample, CpuSampler, TrackerError};

/// Which processes a profile reports one by one.
#[derive(Clone, Debug)]
pub enum Scope {
    /// `run`: the command's tree and wattprof.
    Tree,
    /// `monitor`: the `top` processes with the most energy in each
    /// interval, limited to `pids` and their descendants when given.
    Machine {
        /// Rows per interval.
        top: usize,
        /// Only these pids and their descendants (empty: all).
        pids: Vec<u32>,
    },
}

/// Which interval records a profile keeps for its final recording (the
/// stream always has them all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeepIntervals {
    /// Every record, with its processes (`run`).
    All,
    /// Machine-level figures only (`monitor --output`).
    MachineOnly,
    /// None (`monitor` without `--output`: nothing would read them).
    Nothing,
}

/// Which processes are reported one by one (`--cgroup`, `--container`);
/// energy is still divided over every process.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// cgroup path, and everything below it.
    pub cgroup: Option<String>,
    /// Container id (or a prefix of 4 or more characters), name, or pod UID.
    pub container: Option<String>,
}

impl Filter {
    /// Whether it lets every process through.
    pub fn is_empty(&self) -> bool {
        self.cgroup.is_none() && self.container.is_none()
    }

    fn matches(&self, path: Option<&str>, names: &ContainerNames) -> bool {
        if self.cgroup.is_none() && self.container.is_none() {
            return true;
        }
        let Some(path) = path else { return false };
        if let Some(prefix) = &self.cgroup {
            let prefix = prefix.trim_end_matches('/');
            let below = path == prefix
                || path
                    .strip_prefix(prefix)
                    .is_some_and(|r| r.starts_with('/'))
                || prefix.is_empty();
            if !below {
                return false;
            }
        }
        if let Some(want) = &self.container {
            let Some(c) = names.recognize(path) else {
                return false;
            };
            let name = names.name(&c);
            let hit = (want.len() >= 4 && c.id.starts_with(want.as_str()))
                || name.as_deref() == Some(want.as_str())
                || c.pod_uid.as_deref() == Some(want.as_str());
            if !hit {
                return false;
            }
        }
        true
    }
}

/// How a profile is set up.
#[derive(Clone, Debug)]
pub struct ProfileConfig {
    /// CO2 per kWh.
    pub carbon: CarbonIntensity,
    /// Which processes are reported one by one.
    pub scope: Scope,
    /// Which interval records are kept for the final recording.
    pub keep: KeepIntervals,
    /// Which processes are reported one by one.
    pub filter: Filter,
    /// Where the container runtimes are asked for names.
    pub runtimes: crate::process::names::RuntimeSockets,
    /// The cgroup2 file system cgroup ids are named from (`None`: this
    /// machine's mount).
    pub cgroupfs: Option<std::path::PathBuf>,
    /// How static power is shared, and the host power model.
    pub statics: statics::StaticsConfig,
}

/// Shortest time between two memory reads of one process.
const MEMORY_EVERY_NS: u64 = 1_000_000_000;

/// Most memory reads a second, all processes together: with a changing
/// top 10 at 100 ms, a read per process per second was still 100
/// `smaps_rollup` walks a second (18% of the monitor's CPU with 1,000
/// busy processes). A row whose process could not be read in time shows
/// its last reading, or none.
const MEMORY_READS_PER_S: u64 = 20;

/// Problems kept for the report.
const MAX_PROBLEMS: usize = 20;

/// A cgroup whose processes have not run for this long is folded into its
/// path's sums (and looked up again if they run again): a host that
/// creates cgroups all day keeps one entry per path, not per cgroup.
const PRUNE_AFTER_NS: u64 = 120_000_000_000;

/// How often cgroups are pruned.
const PRUNE_EVERY_NS: u64 = 10_000_000_000;

/// Paths of pruned cgroups kept one by one (those that ran least recently
/// beyond this are summed together, `[N older cgroups]`).
pub const MAX_PRUNED_PATHS: usize = 10_000;

/// Report order: most energy first, then most on-CPU time.
fn most_energy_first(a: (&EnergyJ, u64), b: (&EnergyJ, u64)) -> std::cmp::Ordering {
    b.0.total_j.total_cmp(&a.0.total_j).then(b.1.cmp(&a.1))
}

/// Host facts for the report header.
pub fn host_report(gpus: Vec<crate::sources::nvml::GpuInfo>) -> HostReport {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    HostReport {
        hostname: crate::topology::hostname(),
        kernel: read("/proc/sys/kernel/osrelease"),
        cpu_model,
        gpus,
    }
}

/// How the profiled command ended.
pub struct CommandEnd {
    /// Its command line.
    pub argv: Vec<String>,
    /// Its pid.
    pub pid: u32,
    /// Exit code, if it exited.
    pub exit_code: Option<i32>,
    /// The signal that killed it, if one did.
    pub signal: Option<i32>,
}

/// Facts about how the profile ended, for the report.
pub struct Ending {
    /// `run` or `monitor`.
    pub mode: &'static str,
    /// The command (`run`).
    pub command: Option<CommandEnd>,
    /// Wall-clock start (ns since the epoch).
    pub start_unix_ns: u64,
    /// The tracker's facts.
    pub profiler: ProfilerReport,
}

/// One cgroup's sums.
#[derive(Clone, Debug, Default)]
pub(crate) struct CgroupSum {
    on_cpu_ns: u64,
    energy: EnergyBy,
    /// Its path, once found.
    name: Option<String>,
    /// When a process of it last ran (monotonic ns).
    last_ns: u64,
    /// Its path was looked at for a container (once named).
    recognized: bool,
    /// The container it is, if it is one.
    container: Option<crate::process::container::Container>,
    /// Its runtime was asked for the container's name.
    name_asked: bool,
    /// That container's name, once its runtime answered.
    container_name: Option<String>,
}

/// Adds `c`'s sums to `into` (its path kept, its last run the later).
fn fold(into: &mut CgroupSum, c: &CgroupSum) {
    into.on_cpu_ns += c.on_cpu_ns;
    into.energy.merge(&c.energy);
    into.last_ns = into.last_ns.max(c.last_ns);
    if into.name.is_none() {
        into.name.clone_from(&c.name);
    }
    into.recognized |= c.recognized;
    into.name_asked |= c.name_asked;
    if into.container.is_none() {
        into.container.clone_from(&c.container);
    }
    if c.container_name.is_some() {
        into.container_name.clone_from(&c.container_name);
    }
}

/// Per-interval maps, kept to be reused.
#[derive(Default)]
struct Scratch {
    /// Energy per consumer.
    energy: IntMap<ConsumerId, EnergyBy>,
    /// Where each consumer is in the interval's usage.
    index: IntMap<ConsumerId, usize>,
}

/// One profile in progress.
pub struct Profile {
    /// Processes seen.
    pub table: ProcessTable<ProcFs>,
    procfs: ProcFs,
    machine: MachineTimes,
    readers: Readers,
    ledger: EnergyLedger,
    groups: [EnergyBy; 3],
    cgroups: IntMap<u64, CgroupSum>,
    /// Sums of cgroups pruned from `cgroups`, per path.
    pruned: HashMap<String, CgroupSum>,
    /// Paths pruned from `pruned` past [`MAX_PRUNED_PATHS`]: how many, and
    /// their sums together.
    older: (u64, CgroupSum),
    /// When cgroups were last pruned (monotonic ns).
    pruned_at_ns: u64,
    cgroup_names: CgroupNames,
    cgroup_root: Option<u64>,
    v1_cgroup: IntMap<ConsumerId, Option<u64>>,
    containers: ContainerNames,
    windows: windows::Windows,
    intervals: crate::output::spill::Intervals,
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
    /// The cgroup and role of each process that ran while reads are held.
    held_origin: IntMap<ConsumerId, (u64, Role)>,
    /// VMs and their energy (`monitor --vm-export`), when asked for.
    vms: Option<crate::attribution::vms::VmTracker>,
    /// Stack sampling (`--stacks`), when asked for.
    stacks: Option<stacks::StackProfile>,
    memory: IntMap<ConsumerId, MemoryReport>,
    memory_read_ns: IntMap<ConsumerId, (u64, Option<crate::process::Memory>)>,
    /// Memory reads left in the current second, and when it began.
    memory_budget: (u64, u64),
    start_ns: u64,
    last_ns: u64,
    package_ids: Vec<u32>,
    cfg: ProfileConfig,
    jsonl: Option<Jsonl>,
    interval_csv: Option<crate::output::csv::IntervalCsv>,
    /// Wall-clock start (for the CSV's timestamps), from the header.
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
pub enum WindowAnswer {
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
    pub fn save_learned(&mut self) -> Result<Option<std::path::PathBuf>, String> {
        self.statics.save_learned()
    }

    /// What was learned of the static power, to be written after the
    /// profile has ended (`finish` takes the profile).
    pub fn learned_to_save(&self) -> statics::Statics {
        self.statics.clone()
    }

    /// A profile on a machine with these package ids; it counts from
    /// [`Profile::begin`].
    pub fn new(
        table: ProcessTable<ProcFs>,
        readers: Readers,
        package_ids: Vec<u32>,
        cfg: ProfileConfig,
        jsonl: Option<Jsonl>,
        host: HostReport,
    ) -> Self {
        let statics = statics::Statics::new(&cfg.statics, &readers, online_cpus());
        Self {
            table,
            procfs: ProcFs::real(),
            machine: MachineTimes::default(),
            readers,
            ledger: EnergyLedger::default(),
            groups: Default::default(),
            cgroups: IntMap::default(),
            pruned: HashMap::new(),
            older: (0, CgroupSum::default()),
            pruned_at_ns: 0,
            cgroup_names: cfg.cgroupfs.as_ref().map_or_else(
                || CgroupNames::real(1_000_000_000),
                |root| CgroupNames::new(root, 1_000_000_000),
            ),
            cgroup_root: cfg
                .cgroupfs
                .as_ref()
                .map_or_else(|| CgroupNames::real(0), |root| CgroupNames::new(root, 0))
                .root_id(),
            v1_cgroup: IntMap::default(),
            containers: ContainerNames::new(&cfg.runtimes),
            windows: windows::Windows::default(),
            intervals: Default::default(),
            last: None,
            scratch: Scratch::default(),
            held: held::HeldReads::default(),
            statics,
            unlisted_at_end: Default::default(),
            held_origin: IntMap::default(),
            vms: None,
            stacks: None,
            memory: IntMap::default(),
            memory_read_ns: IntMap::default(),
            memory_budget: (0, 0),
            start_ns: 0,
            last_ns: 0,
            package_ids,
            cfg,
            jsonl,
            interval_csv: None,
            start_unix_ns: 0,
            problems: Vec::new(),
            problem_count: 0,
            host,
            clock_skew_ns: 0,
        }
    }

    /// Keeps the recording's intervals past 16 MiB in a temporary file in
    /// `dir` (the recording's own directory).
    pub fn set_spill_dir(&mut self, dir: std::path::PathBuf) {
        self.intervals.set_dir(dir);
    }

    /// Also writes each interval's rows to this CSV (`--csv-intervals`).
    pub fn set_interval_csv(&mut self, csv: Option<crate::output::csv::IntervalCsv>) {
        self.interval_csv = csv;
    }

    /// Writes the stream's header record (and takes the wall-clock start
    /// the CSV's timestamps count from).
    pub fn write_header(
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
        if let Some(s) = &mut self.jsonl {
            s.write(&header);
        }
    }

    /// The readers in use.
    pub fn readers(&self) -> &Readers {
        &self.readers
    }

    fn problem(&mut self, p: String) {
        self.problem_count += 1;
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(p);
        }
    }

    /// cgroup path of a process record, when known (its v1 path where its
    /// v2 one is the root).
    fn cgroup_path(&self, id: ConsumerId, cgroup_id: u64) -> Option<&str> {
        let key = match self.v1_cgroup.get(&id) {
            Some(Some(v1)) if self.cgroup_root.is_none_or(|r| cgroup_id == r) => *v1,
            _ => cgroup_id,
        };
        self.cgroups.get(&key).and_then(|c| c.name.as_deref())
    }

    /// Whether a process passes `--pid`, `--cgroup` and `--container`.
    fn wanted(&self, id: ConsumerId, cgroup_id: u64) -> bool {
        let pids_ok = match &self.cfg.scope {
            Scope::Machine { pids, .. } if !pids.is_empty() => {
                pids.iter().any(|p| self.table.descends_from(id, *p))
            }
            _ => true,
        };
        pids_ok
            && self
                .cfg
                .filter
                .matches(self.cgroup_path(id, cgroup_id), &self.containers)
    }

    /// Indices in `usage` of the processes reported one by one this
    /// interval.
    fn selected(
        &self,
        usage: &[IntervalUsage],
        energy: &IntMap<ConsumerId, EnergyBy>,
    ) -> Vec<usize> {
        let all = 0..usage.len();
        match &self.cfg.scope {
            Scope::Tree => all
                .filter(|i| matches!(usage[*i].role, Role::Tree | Role::Profiler))
                .filter(|i| {
                    let u = &usage[*i];
                    u.role == Role::Profiler || self.wanted(u.id, u.cgroup_id)
                })
                .collect(),
            Scope::Machine { top, pids } => {
                // Most energy, then most CPU time, then first seen.
                let key = |i: &usize| {
                    let u = &usage[*i];
                    (
                        std::cmp::Reverse((
                            energy.get(&u.id).map_or(0, EnergyBy::total_uj),
                            u.on_cpu_ns.iter().sum::<u64>(),
                        )),
                        *i,
                    )
                };
                let mut v: Vec<usize> = all.collect();
                let filtered = !pids.is_empty() || !self.cfg.filter.is_empty();
                if !filtered && v.len() > *top {
                    // Only the top ones are ordered: O(n), not O(n log n),
                    // with thousands of processes each interval.
                    v.select_nth_unstable_by_key(*top, key);
                    v.truncate(*top);
                }
                v.sort_unstable_by_key(key);
                v.into_iter()
                    .filter(|i| self.wanted(usage[*i].id, usage[*i].cgroup_id))
                    .take(*top)
                    .collect()
            }
        }
    }

    /// Samples stacks too (`--stacks`): each interval's energy of each
    /// reported process is divided over its stacks.
    pub fn set_stacks(&mut self, stacks: stacks::StackProfile) {
        self.stacks = Some(stacks);
    }

    /// The stack sampling, if on, its frames named (the outputs' view).
    pub fn stacks(&mut self) -> Option<&stacks::StackProfile> {
        let st = self.stacks.as_mut()?;
        st.resolve();
        Some(st)
    }

    /// The longest the sampling loop may sleep: the stack sampler's ring
    /// is drained on a timer (it never wakes the loop).
    pub fn max_sleep_ms(&self) -> i32 {
        if self.stacks.is_some() { 100 } else { i32::MAX }
    }

    /// Takes the stack samples waiting (the sampling loop calls this on
    /// every pass, so the ring never fills however long the interval).
    pub fn drain_stacks(&mut self) {
        let want = self.stack_filter();
        if let Some(s) = &mut self.stacks {
            s.drain(None, |pid| want(&self.table, pid));
        }
    }

    /// Whose stacks are profiled: the command's tree in `run` (within
    /// `--container`/`--cgroup`), every process in `monitor`.
    fn stack_filter(&self) -> impl Fn(&ProcessTable<ProcFs>, u32) -> stacks::Wanted + use<> {
        let tree_only = matches!(self.cfg.scope, Scope::Tree);
        move |table, pid| match table.get(pid) {
            None if tree_only => stacks::Wanted::NotKnownYet,
            None => stacks::Wanted::Yes,
            Some(p) if !tree_only || p.role == Role::Tree => stacks::Wanted::Yes,
            Some(_) => stacks::Wanted::No,
        }
    }

    /// Starts counting: the energy counters' starting point, taken by the
    /// tracker right before its own (nothing that can sleep between).
    /// Returns the monotonic time counting starts.
    pub fn begin(&mut self, sampler: &mut impl CpuSampler) -> Result<u64, TrackerError> {
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
    pub fn tick(&mut self, sampler: &mut impl CpuSampler, last: bool) -> Result<u64, TrackerError> {
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

    /// Says when the wall clock jumped (`date -s`, a VM resumed, NTP
    /// stepping it): intervals are timed on the monotonic clock, which does
    /// not jump, and timestamps are the start's wall-clock time plus
    /// monotonic time, so they do not jump either; the report says it did.
    fn watch_clock(&mut self, at_ns: u64) {
        if self.start_unix_ns == 0 {
            return;
        }
        // Both clocks read back to back: a delay since the sample (a
        // SIGSTOP, a slow read) is not a jump.
        let wall_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let now_ns = crate::tracker::monotonic_ns().max(at_ns);
        let since_ns = i128::from(now_ns.saturating_sub(self.start_ns));
        let skew = wall_ns - i128::from(self.start_unix_ns) - since_ns;
        let jump = skew - self.clock_skew_ns;
        if jump.abs() > 1_000_000_000 {
            self.clock_skew_ns = skew;
            let p = format!(
                "the wall clock jumped {:+.1} s about {:.1} s into the profile (intervals are \
                 timed on the monotonic clock; timestamps are the start's wall-clock time plus \
                 monotonic time, so they do not jump)",
                jump as f64 / 1e9,
                since_ns as f64 / 1e9
            );
            eprintln!("wattprof: {p}");
            self.problem(p);
        }
    }

    /// Folds in one interval: the tracker's sample and the energy read
    /// just before it.
    fn step(&mut self, sample: &CpuSample, mut read: IntervalEnergy) {
        self.watch_clock(sample.at_ns);
        // The eBPF programs' own word on a full map or ring (aya-log):
        // said as it happens, and kept in the recording's problems.
        for m in &sample.kernel_log {
            let p = format!("eBPF: {m}");
            eprintln!("wattprof: {p}");
            self.problem(p);
        }
        let duration_ns = sample.at_ns.saturating_sub(self.last_ns);
        self.last_ns = sample.at_ns;
        let mut packages = vec![PackageTime::default(); self.package_ids.len().max(1)];
        // What the CPUs did by the kernel's own count (all but its idle
        // and iowait time, as `calibrate` fits): what the power followed,
        // and so what static power is learned from. With the iterator
        // tracker it holds what task clocks leave out (interrupts, waking
        // from idle: on the test VM about 2% of a CPU at low load, none
        // when the CPUs are saturated, which put a learned static figure
        // 1.5-6% high under load). Summed per package, then its busy part
        // taken (a CPU's 10 ms ticks can read more idle than its window).
        let mut physical = packages.clone();
        let mut online = 0;
        let (mut window_ns, mut busy_ns) = (0, 0);
        for c in &sample.cpus {
            window_ns += c.window_ns;
            // Lost time is task time too: a model's energy covers it.
            busy_ns += c.busy_ns + c.lost_ns;
            if let Some(s) = packages.get_mut(c.package as usize) {
                // Time carried in from the interval before was divided
                // there, with the threads that claimed it: here it is
                // divided as idle, so no dynamic energy goes unclaimed.
                let carried = c.carried_ns.min(c.busy_ns);
                s.busy_ns += c.busy_ns - carried;
                s.idle_ns += c.idle_ns + carried;
                s.lost_ns += c.lost_ns;
            }
            if let Some(s) = physical.get_mut(c.package as usize) {
                // Window and kernel idle for now; busy = window - idle
                // below.
                s.busy_ns += c.window_ns;
                s.idle_ns += c.idle_task_ns;
            }
            online += usize::from(c.window_ns > 0);
        }
        for s in &mut physical {
            let window = s.busy_ns;
            s.idle_ns = s.idle_ns.min(window);
            s.busy_ns = window - s.idle_ns;
        }
        self.readers
            .add_estimate(&mut read, busy_ns, window_ns, online.max(1));
        let wall = self.readers.add_wall_model(&mut read, busy_ns, duration_ns);
        let (statics, static_w) = self.statics.interval(
            &read.energy,
            &read.caught_up,
            &physical,
            &self.package_ids,
            duration_ns,
            self.readers.model_static_uj(window_ns),
        );
        let mut usage = self.table.apply(sample);
        self.machine.add(sample);
        for p in self.readers.take_problems() {
            self.problem(p);
        }
        let mut gpus: Vec<GpuInterval> = Vec::with_capacity(read.gpus.len());
        for g in &read.gpus {
            gpus.push(GpuInterval {
                index: g.index,
                energy_uj: g.energy_uj,
                estimated: g.method == crate::sources::nvml::GpuEnergyMethod::PowerIntegration,
                processes: g
                    .processes
                    .iter()
                    .map(|p| (self.table.id_of(p.pid), p.sm_util_pct))
                    .collect(),
                statics: self.statics.gpu_interval(g, duration_ns),
            });
        }
        let cpu_usage: Vec<attribution::Usage> = usage
            .iter()
            .map(|u| attribution::Usage {
                id: u.id,
                on_cpu_ns: u.on_cpu_ns.clone(),
            })
            .collect();
        let mut shares = attribution::attribute(&Interval {
            packages: &packages,
            package_ids: &self.package_ids,
            usage: &cpu_usage,
            energy: &read.energy,
            gpus: &gpus,
            wall,
            statics: &statics,
            static_share: self.statics.share(),
        });
        // Domains whose read failed hold this interval's CPU time; a
        // read after failed ones is divided over the whole span.
        let span = held::Span {
            packages: &packages,
            package_ids: &self.package_ids,
            usage: &cpu_usage,
            start_ns: sample.at_ns.saturating_sub(duration_ns),
            end_ns: sample.at_ns,
            static_w: &static_w,
            static_share: self.statics.share(),
        };
        let held_problems = self.held.hold(&read.missed, &span);
        let caught = self.held.catch_up(&read.caught_up, &span);
        for p in held_problems {
            self.problem(p);
        }
        shares.extend(caught.shares);
        for p in self.statics.problems(&shares) {
            eprintln!("wattprof: {p}");
            self.problem(p);
        }
        self.ledger.add(&shares);

        // This interval's energy per consumer, and the groups it goes to
        // (maps reused from interval to interval).
        let mut energy = std::mem::take(&mut self.scratch.energy);
        energy.clear();
        for s in &shares {
            for (id, uj) in &s.attributed {
                energy.entry(*id).or_default().add(s.domain, *uj);
            }
            for (id, uj) in &s.attributed_static {
                energy.entry(*id).or_default().add_static(s.domain, *uj);
            }
        }
        // Processes with energy but no CPU time this interval (a GPU job
        // asleep on its CPU) are reported like the others.
        let mut index = std::mem::take(&mut self.scratch.index);
        index.clear();
        index.extend(usage.iter().enumerate().map(|(i, u)| (u.id, i)));
        for id in energy.keys() {
            if index.contains_key(id) {
                continue;
            }
            if let Some(p) = self.table.by_id(*id) {
                index.insert(*id, usage.len());
                usage.push(IntervalUsage {
                    id: *id,
                    pid: p.pid,
                    role: p.role,
                    cgroup_id: p.cgroup_id,
                    on_cpu_ns: vec![0; self.package_ids.len().max(1)],
                    other_cgroups_ns: Vec::new(),
                });
            }
        }
        self.v1_cgroups(&mut usage);
        if self.stacks.is_some() {
            let tree_only = matches!(self.cfg.scope, Scope::Tree);
            let consumers: Vec<(u32, &str, EnergyBy)> = usage
                .iter()
                .filter(|u| (!tree_only || u.role == Role::Tree) && self.wanted(u.id, u.cgroup_id))
                .map(|u| {
                    (
                        u.pid,
                        self.table.by_id(u.id).map_or("", |p| p.comm.as_str()),
                        energy.get(&u.id).copied().unwrap_or_default(),
                    )
                })
                .collect();
            let want = self.stack_filter();
            if let Some(st) = self.stacks.as_mut() {
                st.drain(Some(sample.at_ns), |pid| want(&self.table, pid));
                st.close(consumers.into_iter());
            }
        }
        let mut interval_groups: [EnergyBy; 3] = Default::default();
        for (id, e) in &energy {
            // A consumer the table no longer knows was an exited process
            // outside the tree.
            let u = index.get(id).map(|i| &usage[*i]);
            // A process forgotten since it ran in an interval whose read
            // failed: its role and cgroup as they were then.
            let origin = self.held_origin.get(id).copied();
            let role = u.map_or_else(|| origin.map_or(Role::Other, |o| o.1), |u| u.role);
            self.groups[role as usize].merge(e);
            interval_groups[role as usize].merge(e);
            // A process that was in several cgroups in this interval: each
            // gets the energy of its share of the process's time.
            let mut rest = *e;
            if let Some(u) = u.filter(|u| !u.other_cgroups_ns.is_empty()) {
                let total: u64 = u.on_cpu_ns.iter().sum();
                for (cgroup, ns) in &u.other_cgroups_ns {
                    let part = e.share(*ns, total);
                    rest = rest.less(&part);
                    self.cgroups.entry(*cgroup).or_default().energy.merge(&part);
                }
            }
            let cgroup = u.map_or_else(|| origin.map_or(0, |o| o.0), |u| u.cgroup_id);
            self.cgroups.entry(cgroup).or_default().energy.merge(&rest);
        }
        // While reads are held, where each process that ran was (its
        // record may be forgotten before the read that covers it comes);
        // at most a minute of processes (HELD_MAX_NS).
        if !self.held.any_live() {
            self.held_origin.clear();
        } else {
            self.held_origin
                .extend(usage.iter().map(|u| (u.id, (u.cgroup_id, u.role))));
        }
        for u in &usage {
            let mut rest: u64 = u.on_cpu_ns.iter().sum();
            for (cgroup, ns) in &u.other_cgroups_ns {
                rest = rest.saturating_sub(*ns);
                let c = self.cgroups.entry(*cgroup).or_default();
                c.on_cpu_ns += ns;
                c.last_ns = sample.at_ns;
            }
            let c = self.cgroups.entry(u.cgroup_id).or_default();
            c.on_cpu_ns += rest;
            c.last_ns = sample.at_ns;
        }
        // Name new cgroups and recognize their containers while they
        // still exist, and ask the runtime for a new container's name now:
        // the recording has it even when no exporter or screen asks, and
        // even if the container is gone by the end.
        for (id, entry) in &mut self.cgroups {
            if entry.name.is_none() {
                entry.name = self
                    .cgroup_names
                    .name(*id, sample.at_ns)
                    .map(str::to_string);
            }
            if !entry.recognized
                && let Some(path) = entry.name.as_deref()
            {
                entry.recognized = true;
                entry.container = self.containers.recognize(path);
            }
            if let Some(c) = &entry.container {
                // Asked once the runtime is there (it may start later).
                if !entry.name_asked && self.containers.available(c.runtime) {
                    entry.name_asked = true;
                    let _ = self.containers.name(c);
                }
                // The answer is kept with the cgroup (the lookup cache is
                // bounded and forgets).
                if entry.container_name.is_none() && entry.name_asked {
                    entry.container_name = self.containers.cached(c);
                }
            }
        }

        if let Some(vms) = &mut self.vms {
            let table = &self.table;
            for u in &usage {
                let e = energy.get(&u.id).copied().unwrap_or_default();
                let cgroup = self
                    .cgroups
                    .get(&u.cgroup_id)
                    .and_then(|c| c.name.as_deref());
                let chain = std::iter::successors(table.by_id(u.id), |p| {
                    p.ppid
                        .filter(|pp| *pp != p.pid)
                        .and_then(|pp| table.get(pp))
                })
                .map(|p| crate::attribution::vms::ProcView {
                    pid: p.pid,
                    comm: &p.comm,
                });
                let cmdline = |pid: u32| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .map(|b| {
                            b.split(|c| *c == 0)
                                .filter(|a| !a.is_empty())
                                .map(|a| String::from_utf8_lossy(a).into_owned())
                                .collect()
                        })
                        .unwrap_or_default()
                };
                vms.add(u.id, cgroup, chain, cmdline, &e, u.on_cpu_ns.iter().sum());
            }
        }

        if self.windows.any_open() {
            let consumers: Vec<(ConsumerId, u64)> = usage
                .iter()
                .map(|u| (u.id, u.on_cpu_ns.iter().sum()))
                .collect();
            let table = &self.table;
            self.windows
                .add_interval(&shares, &consumers, |id, pid| table.descends_from(id, pid));
        }

        // The record, in the previous record's buffers.
        let mut record = self.last.take().unwrap_or_default();
        let mut rows = record.processes.take().unwrap_or_default();
        rows.clear();
        self.process_rows(&usage, &energy, &read, sample.at_ns, &mut rows);
        record.domains.clear();
        record.domains.extend(shares.iter().map(|s| {
            DomainRow::from_uj(
                DomainUj {
                    domain: s.domain,
                    package: s.package,
                    estimated: s.estimated,
                    basis: s.basis,
                    measured: s.measured_uj,
                    attributed: s.attributed_uj(),
                    idle: s.idle_uj,
                    unattributed: s.unattributed_uj,
                    static_uj: s.static_uj,
                    attributed_static: s.attributed_static.iter().map(|(_, uj)| uj).sum(),
                    figure: self.statics.figure(s.domain, s.package).copied(),
                },
                caught
                    .covers_ns
                    .iter()
                    .find(|(k, _)| *k == (s.domain, s.package))
                    .map_or(duration_ns, |(_, ns)| *ns),
                |power_w| IntervalPower {
                    power_w,
                    covers_ns: caught
                        .covers_ns
                        .iter()
                        .find(|(k, _)| *k == (s.domain, s.package))
                        .map(|(_, ns)| *ns),
                },
            )
        }));
        record.gpus.clear();
        let statics = &self.statics;
        record.gpus.extend(read.gpus.iter().map(|g| GpuRow {
            index: g.index,
            energy_j: joules(g.energy_uj),
            power_w: g.power_w,
            util_pct: g.util_pct,
            memory_used_bytes: g.memory_used_bytes,
            sm_basis: Some(g.sm_basis),
            idle_w: statics.gpu_figures(g.index).0,
            held_w: statics.gpu_figures(g.index).1,
            processes: Some(g.processes.clone()),
        }));
        let group = |r: Role| GroupRow {
            on_cpu_ns: usage
                .iter()
                .filter(|u| u.role == r)
                .map(|u| u.on_cpu_ns.iter().sum::<u64>())
                .sum(),
            energy_j: joules(interval_groups[r as usize].total_uj()),
            package_j: joules(interval_groups[r as usize].package_uj),
            core_j: joules(interval_groups[r as usize].core_uj),
            dram_j: joules(interval_groups[r as usize].dram_uj),
            gpu_j: joules(interval_groups[r as usize].gpu_uj),
            static_j: joules(interval_groups[r as usize].static_uj()),
        };
        record.groups = GroupRows {
            tree: group(Role::Tree),
            profiler: group(Role::Profiler),
            other: group(Role::Other),
        };
        record.t_ns = sample.at_ns.saturating_sub(self.start_ns);
        record.duration_ns = duration_ns;
        record.busy_ns = sample.busy_ns();
        record.processes = Some(rows);
        if let Some(s) = &mut self.jsonl {
            s.write(&record);
        }
        if let Some(c) = &mut self.interval_csv {
            c.write(&record, self.start_unix_ns, self.cfg.carbon.g_per_kwh);
        }
        // Kept serialized: a parsed record costs several times its text,
        // and a run can last days.
        let kept = match self.cfg.keep {
            KeepIntervals::All => serde_json::value::to_raw_value(&record).ok(),
            KeepIntervals::MachineOnly => {
                serde_json::value::to_raw_value(&record.machine_only()).ok()
            }
            KeepIntervals::Nothing => None,
        };
        if let Some(kept) = kept {
            self.intervals.push(kept);
        }
        if let Some(p) = self.intervals.take_problem() {
            self.problem(p);
        }
        self.last = Some(record);
        self.scratch.energy = energy;
        self.scratch.index = index;

        // Energy of forgotten processes is in the group and cgroup sums.
        let table = &self.table;
        self.ledger.retain(|id| table.by_id(id).is_some());
        self.memory.retain(|id, _| table.by_id(*id).is_some());
        self.v1_cgroup.retain(|id, _| table.by_id(*id).is_some());
        self.memory_read_ns
            .retain(|id, _| table.by_id(*id).is_some());
        self.prune_cgroups(sample.at_ns);
    }

    /// Folds cgroups whose processes have not run for [`PRUNE_AFTER_NS`]
    /// into their path's sums (every [`PRUNE_EVERY_NS`]); keeps at most
    /// [`MAX_PRUNED_PATHS`] paths, summing the least recently run beyond.
    /// Per-path and per-container figures, and so the exporter's counters,
    /// are unchanged by it.
    fn prune_cgroups(&mut self, now_ns: u64) {
        if now_ns.saturating_sub(self.pruned_at_ns) < PRUNE_EVERY_NS {
            return;
        }
        self.pruned_at_ns = now_ns;
        let cutoff = now_ns.saturating_sub(PRUNE_AFTER_NS);
        // Cgroups of processes the table still holds (alive, or in the
        // tree) are kept: their reports name them. So are v1 keys of live
        // processes (named only once), and cgroup 0 (energy of processes
        // with no cgroup).
        let kept: crate::hash::IntSet<u64> = self
            .v1_cgroup
            .values()
            .flatten()
            .copied()
            .chain(self.table.processes().map(|p| p.cgroup_id))
            .chain(std::iter::once(0))
            .collect();
        let stale: Vec<u64> = self
            .cgroups
            .iter()
            .filter(|(id, c)| c.last_ns < cutoff && !kept.contains(id))
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            let Some(c) = self.cgroups.remove(&id) else {
                continue;
            };
            self.cgroup_names.forget(id);
            match &c.name {
                Some(path) => fold(self.pruned.entry(path.clone()).or_default(), &c),
                None => {
                    self.older.0 += 1;
                    fold(&mut self.older.1, &c);
                }
            }
        }
        if self.pruned.len() > MAX_PRUNED_PATHS {
            let mut by_age: Vec<(u64, String)> = self
                .pruned
                .iter()
                .map(|(p, c)| (c.last_ns, p.clone()))
                .collect();
            by_age.sort_unstable();
            for (_, path) in by_age
                .into_iter()
                .take(self.pruned.len() - MAX_PRUNED_PATHS)
            {
                if let Some(c) = self.pruned.remove(&path) {
                    self.older.0 += 1;
                    fold(&mut self.older.1, &c);
                }
            }
        }
    }

    /// Every cgroup sum: those kept by id, then the pruned ones by path.
    fn cgroup_sums(&self) -> impl Iterator<Item = &CgroupSum> {
        self.cgroups.values().chain(self.pruned.values())
    }

    /// Outputs that stopped early (a failed write), one line each.
    pub fn output_errors(&self) -> Vec<String> {
        let jsonl = self.jsonl.as_ref().and_then(|s| s.failure());
        let csv = self.interval_csv.as_ref().and_then(|c| c.failure());
        jsonl.into_iter().chain(csv).map(str::to_string).collect()
    }

    /// Tasks in the cgroup v2 root on a host whose units and containers
    /// live in cgroup v1 hierarchies: their v1 path, read once per process
    /// while it is alive.
    fn v1_cgroups(&mut self, usage: &mut [IntervalUsage]) {
        for u in usage {
            if self.cgroup_root.is_some_and(|r| u.cgroup_id != r) {
                continue;
            }
            let cgroups = &mut self.cgroups;
            let key = *self.v1_cgroup.entry(u.id).or_insert_with(|| {
                let text =
                    std::fs::read_to_string(format!("/proc/{}/cgroup", u.pid)).unwrap_or_default();
                crate::process::cgroup::v1_path(&text)
                    .filter(|p| p != "/")
                    .map(|p| {
                        let key = crate::process::cgroup::v1_key(&p);
                        cgroups.entry(key).or_default().name = Some(p);
                        key
                    })
            });
            if let Some(key) = key {
                u.cgroup_id = key;
            }
        }
    }

    /// The rows of the processes reported one by one, with the memory of
    /// those that ran (one that did not run cannot have changed its own
    /// memory).
    fn process_rows(
        &mut self,
        usage: &[IntervalUsage],
        energy: &IntMap<ConsumerId, EnergyBy>,
        read: &IntervalEnergy,
        at_ns: u64,
        rows: &mut Vec<ProcessRow>,
    ) {
        let selected: Vec<usize> = self.selected(usage, energy);
        let gpu_bytes_of = |id: ConsumerId| -> u64 {
            read.gpus
                .iter()
                .flat_map(|g| &g.processes)
                .filter(|p| self.table.id_of(p.pid) == Some(id))
                .map(|p| p.memory_bytes)
                .sum()
        };
        let exited = |id: ConsumerId| self.table.by_id(id).is_none_or(|p| p.exit_ns.is_some());
        let due = |reads: &IntMap<ConsumerId, (u64, Option<crate::process::Memory>)>,
                   id: ConsumerId| {
            reads
                .get(&id)
                .is_none_or(|(t, _)| at_ns.saturating_sub(*t) >= MEMORY_EVERY_NS)
        };
        // smaps_rollup walks the page tables: at most once a second per
        // process, however short the interval. In `monitor`, whose top
        // rows change from interval to interval, also at most
        // MEMORY_READS_PER_S in all, those read longest ago (or never)
        // first; `run` reads every process of its tree.
        let rationed = matches!(self.cfg.scope, Scope::Machine { .. });
        let mut may_read: Vec<ConsumerId> = Vec::new();
        if rationed {
            if at_ns.saturating_sub(self.memory_budget.1) >= 1_000_000_000 {
                self.memory_budget = (MEMORY_READS_PER_S, at_ns);
            }
            let mut stale: Vec<(u64, ConsumerId)> = selected
                .iter()
                .map(|i| usage[*i].id)
                .filter(|id| !exited(*id) && due(&self.memory_read_ns, *id))
                .map(|id| (self.memory_read_ns.get(&id).map_or(0, |(t, _)| *t), id))
                .collect();
            stale.sort_unstable();
            let n = stale.len().min(self.memory_budget.0 as usize);
            self.memory_budget.0 -= n as u64;
            may_read.extend(stale[..n].iter().map(|(_, id)| *id));
        }
        for i in selected {
            let u = &usage[i];
            let gpu_bytes = if read.gpus.is_empty() {
                0
            } else {
                gpu_bytes_of(u.id)
            };
            let last = self.memory_read_ns.get(&u.id).and_then(|(_, m)| *m);
            let mem = if exited(u.id) {
                None
            } else if !due(&self.memory_read_ns, u.id) || (rationed && !may_read.contains(&u.id)) {
                last
            } else {
                let m = self.procfs.memory(u.pid);
                self.memory_read_ns.insert(u.id, (at_ns, m));
                m
            };
            let peak = self.memory.entry(u.id).or_default();
            if let Some(m) = mem {
                peak.peak_pss_bytes = peak.peak_pss_bytes.max(m.pss_bytes);
                peak.peak_uss_bytes = peak.peak_uss_bytes.max(m.uss_bytes);
            }
            peak.peak_gpu_bytes = peak.peak_gpu_bytes.max(gpu_bytes);
            let e = energy.get(&u.id).copied().unwrap_or_default();
            rows.push(ProcessRow {
                pid: u.pid,
                comm: self
                    .table
                    .by_id(u.id)
                    .map_or_else(String::new, |p| p.comm.clone()),
                on_cpu_ns: u.on_cpu_ns.iter().sum(),
                package_j: joules(e.package_uj),
                core_j: joules(e.core_uj),
                dram_j: joules(e.dram_uj),
                gpu_j: joules(e.gpu_uj),
                static_j: joules(e.static_uj()),
                pss_bytes: mem.map(|m| m.pss_bytes),
                uss_bytes: mem.map(|m| m.uss_bytes),
                gpu_memory_bytes: gpu_bytes,
            });
        }
    }

    /// Applies window messages (text, sender pid) that arrived by
    /// `at_ns`, a sample taken at that instant first. Returns, per message,
    /// what it did: a closed window's figures are what the recording will
    /// hold for it, so the sender can be told them.
    pub fn window_messages<'m>(
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
                        if let Some(s) = &mut self.jsonl {
                            s.write(&Typed {
                                kind: "window",
                                record: &report,
                            });
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

    fn window_report(&self, w: &windows::Window) -> WindowReport {
        let span = w.end_ns.saturating_sub(w.begin_ns);
        WindowReport {
            name: w.name.clone(),
            pid: w.pid,
            depth: w.depth,
            begin_ns: w.begin_ns.saturating_sub(self.start_ns),
            end_ns: w.end_ns.saturating_sub(self.start_ns),
            unterminated: w.unterminated,
            on_cpu_ns: w.on_cpu_ns,
            energy: EnergyJ::new(&w.energy, span, &self.cfg.carbon),
            machine: w
                .machine
                .iter()
                .map(|m| WindowDomainReport {
                    domain: m.domain,
                    package: m.package,
                    measured_j: joules(m.measured_uj),
                    avg_power_w: watts(m.measured_uj, span),
                    estimated: m.estimated,
                })
                .collect(),
        }
    }

    /// Energy of one process so far.
    pub fn process_energy(&self, p: &Process) -> EnergyBy {
        self.ledger.consumer(p.id)
    }

    /// The last interval's record (as streamed).
    pub fn last_interval(&self) -> Option<&IntervalRecord> {
        self.last.as_ref()
    }

    /// Per cgroup so far, most energy first; with `since_ns`, only cgroups
    /// whose processes ran since then.
    pub fn cgroup_reports(&self, since_ns: Option<u64>) -> Vec<CgroupReport> {
        let span = self.last_ns.saturating_sub(self.start_ns);
        let recent = |c: &CgroupSum| since_ns.is_none_or(|t| c.last_ns >= t);
        // One row per path: a pruned cgroup's sums go to the row of the
        // cgroup now at its path (a restarted unit), or stand alone.
        let mut rows: Vec<(String, u64, CgroupSum)> = self
            .cgroups
            .iter()
            .map(|(id, c)| {
                let path = c.name.clone().unwrap_or_else(|| format!("id:{id}"));
                (path, *id, c.clone())
            })
            .collect();
        let mut at: HashMap<String, usize> = HashMap::new();
        for (i, (path, _, _)) in rows.iter().enumerate() {
            at.entry(path.clone()).or_insert(i);
        }
        for (path, c) in &self.pruned {
            match at.get(path) {
                Some(i) => fold(&mut rows[*i].2, c),
                None => rows.push((path.clone(), 0, c.clone())),
            }
        }
        if self.older.0 > 0 {
            rows.push((
                format!("[{} older cgroups]", self.older.0),
                0,
                self.older.1.clone(),
            ));
        }
        let mut cgroups: Vec<CgroupReport> = rows
            .into_iter()
            .filter(|(_, _, c)| recent(c))
            .map(|(path, id, c)| CgroupReport {
                path,
                id,
                on_cpu_ns: c.on_cpu_ns,
                energy: EnergyJ::new(&c.energy, span, &self.cfg.carbon),
            })
            .collect();
        cgroups
            .sort_by(|a, b| most_energy_first((&a.energy, a.on_cpu_ns), (&b.energy, b.on_cpu_ns)));
        cgroups
    }

    /// Keeps each VM's energy from now on (`monitor --vm-export`).
    pub fn track_vms(&mut self) {
        self.vms.get_or_insert_with(Default::default);
    }

    /// Each VM's energy so far, when tracked.
    pub fn vm_sums(
        &self,
    ) -> Option<&std::collections::BTreeMap<String, crate::attribution::vms::VmSum>> {
        self.vms.as_ref().map(|v| v.sums())
    }

    /// Whether the CPU's energy is a power model's estimate.
    pub fn cpu_estimated(&self) -> bool {
        self.ledger
            .domains()
            .iter()
            .any(|d| d.domain == Domain::Package && d.estimated)
    }

    /// Whether DRAM energy is measured (a DRAM domain has been read).
    pub fn measures_dram(&self) -> bool {
        self.ledger
            .domains()
            .iter()
            .any(|d| d.domain == Domain::Dram)
    }

    /// The container a cgroup's sums are for: the one recognized while
    /// it ran, else what its path says.
    fn container_of(cg: &CgroupSum) -> Option<crate::process::container::Container> {
        cg.container.clone().or_else(|| {
            cg.name
                .as_deref()
                .and_then(crate::process::container::from_cgroup_path)
        })
    }

    /// Asks the runtimes for the name of every container again: those
    /// not named yet, and the others' current names (renamed since).
    fn ask_container_names(&self) {
        self.containers.expire();
        for cg in self.cgroup_sums() {
            if let Some(c) = Self::container_of(cg) {
                let _ = self.containers.name(&c);
            }
        }
    }

    /// Per container and systemd unit so far (from the cgroups), most
    /// energy first; with `since_ns`, only those whose processes ran since.
    pub fn container_reports(&self, since_ns: Option<u64>) -> Vec<ContainerReport> {
        type Sums = (u64, EnergyBy, Vec<String>, Option<String>);
        let mut by: HashMap<crate::process::container::Container, Sums> = HashMap::new();
        let mut last: HashMap<crate::process::container::Container, u64> = HashMap::new();
        for cg in self.cgroup_sums() {
            let (ns, e) = (&cg.on_cpu_ns, &cg.energy);
            let Some(path) = &cg.name else { continue };
            let Some(c) = Self::container_of(cg) else {
                continue;
            };
            let l = last.entry(c.clone()).or_default();
            *l = (*l).max(cg.last_ns);
            let entry = by.entry(c).or_default();
            entry.0 += ns;
            entry.1.merge(e);
            entry.2.push(path.clone());
            if entry.3.is_none() {
                entry.3.clone_from(&cg.container_name);
            }
        }
        let span = self.last_ns.saturating_sub(self.start_ns);
        let mut v: Vec<ContainerReport> = by
            .into_iter()
            .filter(|(c, _)| since_ns.is_none_or(|t| last.get(c).is_some_and(|l| *l >= t)))
            .map(|(c, (ns, e, mut cgroups, kept_name))| {
                cgroups.sort();
                // The runtime's latest answer (a `docker rename`), else
                // the one kept, else asked for now.
                let name = self
                    .containers
                    .cached(&c)
                    .or(kept_name)
                    .or_else(|| self.containers.name(&c));
                ContainerReport {
                    name,
                    runtime: c.runtime,
                    id: c.id,
                    pod_uid: c.pod_uid,
                    qos: c.qos,
                    cgroups,
                    on_cpu_ns: ns,
                    energy: EnergyJ::new(&e, span, &self.cfg.carbon),
                }
            })
            .collect();
        v.sort_by(|a, b| {
            most_energy_first((&a.energy, a.on_cpu_ns), (&b.energy, b.on_cpu_ns))
                .then(a.id.cmp(&b.id))
        });
        v
    }

    /// The Prometheus view of the profile so far: counters per domain,
    /// container, cgroup; CPU seconds; wattprof's own cost; the power of
    /// the last interval's `top` processes and of all others together.
    /// Containers and cgroups whose processes have not run for `grace_ns`
    /// are left out (their series end).
    pub fn snapshot(&self, top: usize, grace_ns: u64) -> Snapshot {
        let since = self.last_ns.saturating_sub(grace_ns);
        let l = |pairs: &[(&str, String)]| -> Labels {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_string(), v.clone()))
                .collect()
        };
        let pkg = |p: Option<u32>| p.map_or_else(|| "machine".to_string(), |p| p.to_string());
        let kinds = |e: &EnergyJ| {
            [
                ("package", e.package_j),
                ("dram", e.dram_j),
                ("gpu", e.gpu_j),
            ]
        };
        let (mut measured, mut idle, mut unattributed) = (Vec::new(), Vec::new(), Vec::new());
        let (mut static_energy, mut static_power) = (Vec::new(), Vec::new());
        for t in self.ledger.domains() {
            let labels = l(&[
                ("domain", t.domain.name().to_string()),
                ("package", pkg(t.package)),
            ]);
            measured.push((labels.clone(), joules(t.measured_uj)));
            idle.push((labels.clone(), joules(t.idle_uj)));
            if let Some(f) = self.statics.figure(t.domain, t.package) {
                static_energy.push((labels.clone(), joules(t.static_uj)));
                let mut with_source = labels.clone();
                with_source.push(("source".into(), f.source.name().into()));
                static_power.push((with_source, f.static_w));
            }
            unattributed.push((labels, joules(t.unattributed_uj)));
        }
        let (mut c_energy, mut c_cpu, mut c_info) = (Vec::new(), Vec::new(), Vec::new());
        let mut c_static = Vec::new();
        for c in self.container_reports(Some(since)) {
            // The name can arrive late or change (docker rename): it is on
            // an info series, never on the counters.
            let base = l(&[
                ("runtime", c.runtime.name().to_string()),
                ("container_id", c.id.clone()),
                ("pod_uid", c.pod_uid.clone().unwrap_or_default()),
                ("qos", c.qos.clone().unwrap_or_default()),
            ]);
            if let Some(name) = &c.name {
                c_info.push((
                    l(&[
                        ("runtime", c.runtime.name().to_string()),
                        ("container_id", c.id.clone()),
                        ("container_name", name.clone()),
                    ]),
                    1.0,
                ));
            }
            c_cpu.push((base.clone(), c.on_cpu_ns as f64 / 1e9));
            c_static.push((base.clone(), c.energy.static_j));
            for (domain, v) in kinds(&c.energy) {
                let mut labels = base.clone();
                labels.push(("domain".into(), domain.into()));
                c_energy.push((labels, v));
            }
        }
        let (mut g_energy, mut g_cpu, mut g_static) = (Vec::new(), Vec::new(), Vec::new());
        // Per path: a restarted service or container gets a new cgroup
        // (a new id) at the same path, and its series must go on rising,
        // so every cgroup that ever had the path counts, for as long as
        // one of them ran within the grace period.
        let mut by_path: std::collections::BTreeMap<&str, (u64, EnergyBy, u64)> =
            std::collections::BTreeMap::new();
        for c in self.cgroup_sums() {
            let Some(path) = c.name.as_deref() else {
                continue;
            };
            let e = by_path.entry(path).or_default();
            e.0 += c.on_cpu_ns;
            e.1.merge(&c.energy);
            e.2 = e.2.max(c.last_ns);
        }
        for (path, (ns, energy, last)) in by_path {
            if last < since {
                continue;
            }
            g_cpu.push((l(&[("cgroup", path.to_string())]), ns as f64 / 1e9));
            let e = EnergyJ::new(&energy, 0, &self.cfg.carbon);
            g_static.push((l(&[("cgroup", path.to_string())]), e.static_j));
            for (domain, v) in kinds(&e) {
                g_energy.push((
                    l(&[("cgroup", path.to_string()), ("domain", domain.into())]),
                    v,
                ));
            }
        }
        let (busy, idle_ns, lost) = self.machine.totals();
        let cpu = [("busy", busy), ("idle", idle_ns), ("lost", lost)]
            .into_iter()
            .map(|(state, ns)| (l(&[("state", state.into())]), ns as f64 / 1e9))
            .collect();
        let me = EnergyJ::new(&self.groups[Role::Profiler as usize], 0, &self.cfg.carbon);
        let self_energy = kinds(&me)
            .into_iter()
            .map(|(d, v)| (l(&[("domain", d.into())]), v))
            .collect();
        // Power of the last interval's processes: the top ones by name, the
        // rest as one `other` series.
        let mut power = Vec::new();
        let mut gpu_power = Vec::new();
        if let Some(iv) = &self.last {
            let dur_s = iv.duration_s();
            let mut rows: Vec<(f64, &ProcessRow)> = iv
                .process_rows()
                .iter()
                .map(|p| (p.total_j() / dur_s, p))
                .collect();
            rows.sort_by(|a, b| b.0.total_cmp(&a.0));
            for (w, p) in rows.iter().take(top) {
                power.push((
                    l(&[("pid", p.pid.to_string()), ("comm", p.comm.clone())]),
                    *w,
                ));
            }
            // Everything attributed in the interval that is not in the top.
            // Core energy is part of package energy: not added again.
            let attributed: f64 = iv
                .domains
                .iter()
                .filter(|d| matches!(d.domain, Domain::Package | Domain::Dram | Domain::Gpu))
                .map(|d| d.attributed_j)
                .sum::<f64>()
                / dur_s;
            let shown: f64 = power.iter().map(|(_, w)| w).sum();
            power.push((
                l(&[("pid", "other".into()), ("comm", "other".into())]),
                (attributed - shown).max(0.0),
            ));
            gpu_power = iv
                .gpus
                .iter()
                .filter_map(|g| Some((l(&[("gpu", g.index.to_string())]), g.power_w?)))
                .collect();
        }
        use crate::output::prometheus as m;
        Snapshot {
            families: vec![
                (&m::ENERGY, measured),
                (&m::IDLE_ENERGY, idle),
                (&m::STATIC_ENERGY, static_energy),
                (&m::STATIC_POWER, static_power),
                (&m::UNATTRIBUTED_ENERGY, unattributed),
                (&m::CONTAINER_ENERGY, c_energy),
                (&m::CONTAINER_STATIC_ENERGY, c_static),
                (&m::CONTAINER_CPU, c_cpu),
                (&m::CGROUP_ENERGY, g_energy),
                (&m::CGROUP_STATIC_ENERGY, g_static),
                (&m::CGROUP_CPU, g_cpu),
                (&m::CPU, cpu),
                (
                    &m::SELF_CPU,
                    vec![(Vec::new(), self.table.totals().profiler_ns as f64 / 1e9)],
                ),
                (&m::SELF_ENERGY, self_energy),
                (&m::PROCESS_POWER, power),
                (&m::GPU_POWER, gpu_power),
                (&m::CONTAINER_INFO, c_info),
                (
                    &m::ENERGY_READER_INFO,
                    self.readers
                        .used()
                        .iter()
                        .filter(|u| u.name != "none")
                        .map(|u| {
                            (
                                l(&[
                                    ("kind", u.kind.to_string()),
                                    ("reader", u.name.to_string()),
                                    ("model", u.model.clone().unwrap_or_default()),
                                    ("estimated", u.estimated.to_string()),
                                ]),
                                1.0,
                            )
                        })
                        .collect(),
                ),
            ],
        }
    }

    fn process_report(&self, p: &Process, end_ns: u64) -> ProcessReport {
        let from = p.start_ns.unwrap_or(self.start_ns).max(self.start_ns);
        let to = p.exit_ns.unwrap_or(end_ns);
        ProcessReport {
            pid: p.pid,
            ppid: p.ppid,
            comm: p.comm.clone(),
            on_cpu_ns: p.total_ns(),
            on_cpu_ns_per_socket: p.on_cpu_ns.clone(),
            start_ns: p.start_ns.map(|t| t.saturating_sub(self.start_ns)),
            exit_ns: p.exit_ns.map(|t| t.saturating_sub(self.start_ns)),
            energy: EnergyJ::new(
                &self.ledger.consumer(p.id),
                to.saturating_sub(from),
                &self.cfg.carbon,
            ),
            memory: self.memory.get(&p.id).copied().unwrap_or_default(),
            cgroup: self.cgroup_path(p.id, p.cgroup_id).map(str::to_string),
        }
    }

    /// Ends the profile: closes open windows and builds the report. Call
    /// after the final [`Profile::step`].
    pub fn finish(mut self, ending: Ending) -> RunReport {
        let end_ns = self.last_ns;
        let span = end_ns.saturating_sub(self.start_ns);
        let (windows, window_errors) = self.windows.finish(end_ns);
        let windows: Vec<WindowReport> = windows.iter().map(|w| self.window_report(w)).collect();
        if let Some(s) = &mut self.jsonl {
            for w in windows.iter().filter(|w| w.unterminated) {
                s.write(&Typed {
                    kind: "window",
                    record: w,
                });
            }
        }
        let carbon = &self.cfg.carbon;
        let mut processes: Vec<ProcessReport> = match &self.cfg.scope {
            Scope::Tree => self
                .table
                .tree()
                .into_iter()
                .filter(|p| self.wanted(p.id, p.cgroup_id))
                .map(|p| self.process_report(p, end_ns))
                .collect(),
            Scope::Machine { top, .. } => {
                let mut v: Vec<ProcessReport> = self
                    .table
                    .processes()
                    .filter(|p| p.exit_ns.is_none() && self.wanted(p.id, p.cgroup_id))
                    .map(|p| self.process_report(p, end_ns))
                    .collect();
                v.sort_by(|a, b| {
                    most_energy_first((&a.energy, a.on_cpu_ns), (&b.energy, b.on_cpu_ns))
                });
                v.truncate((*top).max(100));
                v
            }
        };
        if matches!(self.cfg.scope, Scope::Tree) {
            processes.sort_by_key(|p| (p.start_ns.unwrap_or(0), p.pid));
        }
        let groups = self.table.totals().clone();
        let group_energy = GroupEnergy {
            tree: EnergyJ::new(&self.groups[Role::Tree as usize], span, carbon),
            profiler: EnergyJ::new(&self.groups[Role::Profiler as usize], span, carbon),
            other: EnergyJ::new(&self.groups[Role::Other as usize], span, carbon),
        };
        let domains = self
            .ledger
            .domains()
            .iter()
            .map(|t| {
                DomainReport::from_uj(
                    DomainUj {
                        domain: t.domain,
                        package: t.package,
                        estimated: t.estimated,
                        basis: t.basis,
                        measured: t.measured_uj,
                        attributed: t.attributed_uj,
                        idle: t.idle_uj,
                        unattributed: t.unattributed_uj,
                        static_uj: t.static_uj,
                        attributed_static: t.attributed_static_uj,
                        figure: self.statics.figure(t.domain, t.package).copied(),
                    },
                    span,
                    |avg_power_w| AveragePower { avg_power_w },
                )
            })
            .collect();
        let cgroups = self.cgroup_reports(None);
        // Every container's name asked for (those first seen while the
        // daemon was not there yet too), and the answers waited for (each
        // lookup takes at most 0.5 s).
        self.ask_container_names();
        self.containers
            .settle(std::time::Duration::from_millis(600));
        let containers = self.container_reports(None);
        let mut problems = self.problems.clone();
        if self.problem_count > problems.len() as u64 {
            problems.push(format!(
                "... and {} more",
                self.problem_count - problems.len() as u64
            ));
        }
        let mut profiler = ending.profiler;
        profiler.on_cpu_ns = groups.profiler_ns;
        (
            profiler.events_lost,
            profiler.discarded_ns,
            profiler.samples,
        ) = self.machine.health();
        profiler.unmatched_forks = self.table.unmatched_forks();
        profiler.ended_unseen = processes
            .iter()
            .filter(|p| p.exit_ns.is_none() && self.unlisted_at_end.contains(&p.pid))
            .count() as u64;
        let command = ending.command.map(|c| CommandReport {
            argv: c.argv,
            pid: c.pid,
            exit_code: c.exit_code,
            signal: c.signal,
            on_cpu_ns: groups.tree_ns,
            processes: processes.len(),
            energy: group_energy.tree,
        });
        let attributed_ns = groups.tree_ns + groups.profiler_ns + groups.other_ns;
        let report = RunReport {
            schema_version: RUN_SCHEMA_VERSION,
            wattprof_version: env!("CARGO_PKG_VERSION").to_string(),
            mode: ending.mode.to_string(),
            start_unix_ns: ending.start_unix_ns,
            wall_ns: span,
            host: self.host.clone(),
            command,
            processes,
            energy: EnergyReport {
                readers: self.readers.used().to_vec(),
                domains,
                groups: group_energy,
                carbon_intensity_g_per_kwh: carbon.g_per_kwh,
                carbon_intensity_source: carbon.source.clone(),
                problems,
                static_power: self.statics.note().map(|note| StaticPowerReport {
                    rule: self.statics.share(),
                    note,
                    learned: self
                        .statics
                        .learned()
                        .into_iter()
                        .map(
                            |(domain, package, static_w, per_cpu_w, r_squared, intervals)| {
                                LearnedFit {
                                    domain,
                                    package,
                                    static_w,
                                    per_cpu_w,
                                    r_squared,
                                    intervals,
                                }
                            },
                        )
                        .collect(),
                }),
            },
            groups,
            cgroups,
            containers,
            windows,
            window_errors,
            machine: self.machine.report(self.package_ids.clone(), attributed_ns),
            lost_ns: self.machine.lost_ns(),
            profiler,
            stacks: self
                .stacks
                .as_ref()
                .map(|st| crate::output::flamegraph::StackReport {
                    functions: crate::output::flamegraph::functions(st.ledger(), 20, span, carbon),
                    ..st.report()
                }),
            intervals: Default::default(),
        };
        let mut report = report;
        report.profiler.output_errors = self.output_errors();
        if let Some(s) = &mut self.jsonl {
            let mut summary = serde_json::to_value(&report).unwrap_or(Value::Null);
            if let Some(o) = summary.as_object_mut() {
                o.remove("intervals");
                o.insert("type".into(), "summary".into());
            }
            s.write(&summary);
        }
        let mut report = RunReport {
            intervals: std::mem::take(&mut self.intervals),
            ..report
        };
        report.profiler.output_errors = self.output_errors();
        report
    }
}

#[cfg(test)]
mod tests;

/// CPUs online now (the power model's vCPUs).
fn online_cpus() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    usize::try_from(n).unwrap_or(1).max(1)
}
