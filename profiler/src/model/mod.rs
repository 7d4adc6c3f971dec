//! The schema: every record a profile streams and the run document it
//! writes (docs/recording.md), with their units (joules, watts and CO2
//! made in one place, [`EnergyJ`]). The sinks write these types, `report`
//! reads them back, and nothing here knows who fills them. The values
//! of lower layers that a record holds (a domain, a tracker, a GPU found)
//! are written in the forms [`wire`] declares, so a rename down there is
//! a compile error here, not a changed recording.

pub(crate) mod record;
pub(crate) mod stacks;
pub(crate) mod unread;
pub(crate) mod wire;

use serde::{Deserialize, Serialize};

use crate::attribution::EnergyBy;
use crate::carbon::CarbonIntensity;
use crate::process::GroupTotals;
use crate::sources::Domain;
use crate::tracker::CpuTimes;

/// Version of the run document's layout; bumped on incompatible changes.
/// 7: a domain with no reader has no field in energy objects (was 0).
pub(crate) const RUN_SCHEMA_VERSION: u32 = 7;

/// The oldest layout `wattprof report` still reads (2: before the static
/// and dynamic split, whose figures read as 0).
pub(crate) const RUN_SCHEMA_OLDEST: u32 = 2;

/// Energy in joules, with average power and CO2.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct EnergyJ {
    /// CPU package energy (J); includes `core_j`.
    #[serde(default, skip_serializing_if = "unread::package")]
    pub(crate) package_j: f64,
    /// Core (PP0) energy (J), where the CPU reports it.
    #[serde(default, skip_serializing_if = "unread::core")]
    pub(crate) core_j: f64,
    /// DRAM energy (J).
    #[serde(default, skip_serializing_if = "unread::dram")]
    pub(crate) dram_j: f64,
    /// GPU energy (J).
    #[serde(default, skip_serializing_if = "unread::gpu")]
    pub(crate) gpu_j: f64,
    /// package + DRAM + GPU (J).
    pub(crate) total_j: f64,
    /// `total_j` over the time span it was measured over (W).
    pub(crate) avg_power_w: f64,
    /// CO2 equivalent (g) at the run's carbon intensity.
    pub(crate) co2_g: f64,
    /// The same energy seen at the wall, from `--calibration` (J): the
    /// counters' energy scaled by the calibration's slope (absent without
    /// one).
    #[serde(default, skip_serializing_if = "record::is_zero")]
    pub(crate) wall_j: f64,
    /// The static part of `total_j` (J): static power × its share of the
    /// CPUs' time (`--static-power`). 0 in recordings before schema 3.
    #[serde(default)]
    pub(crate) static_j: f64,
    /// The dynamic part of `total_j` (J): what its running caused.
    #[serde(default)]
    pub(crate) dynamic_j: f64,
}

impl EnergyJ {
    /// The domains a sum reports apart (core is inside package) that
    /// have a reader in `read`, with their joules, named as everywhere
    /// ([`Domain::name`]). A domain with no reader has no figure, not 0.
    pub(crate) fn by_domain(
        &self,
        read: unread::Read,
    ) -> impl Iterator<Item = (&'static str, f64)> {
        [
            (Domain::Package, self.package_j),
            (Domain::Dram, self.dram_j),
            (Domain::Gpu, self.gpu_j),
        ]
        .into_iter()
        .filter(move |(d, _)| read.has(*d))
        .map(|(d, j)| (d.name(), j))
    }

    /// From microjoules over `span_ns`, at `g_per_kwh`.
    pub(crate) fn new(e: &EnergyBy, span_ns: u64, carbon: &CarbonIntensity) -> Self {
        let j = crate::units::joules;
        let total = e.total_uj();
        Self {
            package_j: j(e.package_uj),
            core_j: j(e.core_uj),
            dram_j: j(e.dram_uj),
            gpu_j: j(e.gpu_uj),
            total_j: j(total),
            avg_power_w: crate::units::watts(total, span_ns),
            co2_g: carbon.grams(total),
            wall_j: j(e.wall_uj),
            static_j: j(e.static_uj()),
            dynamic_j: j(e.dynamic_uj()),
        }
    }
}

/// Peak memory of a process over the run.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct MemoryReport {
    /// Highest PSS seen (bytes).
    pub(crate) peak_pss_bytes: u64,
    /// Highest USS seen (bytes).
    pub(crate) peak_uss_bytes: u64,
    /// Highest GPU memory seen, all GPUs (bytes).
    pub(crate) peak_gpu_bytes: u64,
}

/// One process in the run document. Times are ns since the run started.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ProcessReport {
    /// Process id.
    pub(crate) pid: u32,
    /// Parent process id.
    pub(crate) ppid: Option<u32>,
    /// Name after its last exec (at most 15 bytes, as the kernel keeps it).
    pub(crate) comm: String,
    /// Its command line after its last exec, cut to 200 bytes: read for
    /// `run`'s tree, and in `monitor --cmdline`; absent when it was not
    /// read or the process was gone first.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) cmdline: Option<String>,
    /// On-CPU ns, all threads.
    pub(crate) on_cpu_ns: u64,
    /// On-CPU ns per package (dense index, see `machine.package_ids`).
    #[serde(alias = "on_cpu_ns_per_socket")]
    pub(crate) on_cpu_ns_per_package: Vec<u64>,
    /// When it was forked, if during the run.
    pub(crate) start_ns: Option<u64>,
    /// When it exited; null if still running at the end.
    pub(crate) exit_ns: Option<u64>,
    /// Energy attributed to it (power over its lifetime within the run).
    pub(crate) energy: EnergyJ,
    /// Peak memory.
    pub(crate) memory: MemoryReport,
    /// cgroup v2 path at its last context switch, when known.
    pub(crate) cgroup: Option<String>,
}

/// The profiled command.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct CommandReport {
    /// The command line.
    pub(crate) argv: Vec<String>,
    /// Its process id.
    pub(crate) pid: u32,
    /// Exit code, when it exited normally.
    pub(crate) exit_code: Option<i32>,
    /// Signal that killed it, if one did.
    pub(crate) signal: Option<i32>,
    /// On-CPU ns of the whole tree.
    pub(crate) on_cpu_ns: u64,
    /// Processes in the tree.
    pub(crate) processes: usize,
    /// Energy of the whole tree.
    pub(crate) energy: EnergyJ,
}

/// Whole-machine figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct MachineReport {
    /// Possible CPUs.
    pub(crate) cpus: usize,
    /// The kernel's package id of each dense package index.
    pub(crate) package_ids: Vec<u32>,
    /// CPU time of all tasks.
    pub(crate) busy_ns: u64,
    /// CPU time charged to no task (window - busy - lost).
    pub(crate) idle_ns: u64,
    /// Wall time with the idle task on CPU between context switches.
    pub(crate) idle_task_ns: u64,
    /// Sum of every CPU's accounting window (busy + idle + lost).
    pub(crate) window_ns: u64,
    /// Per-task time summed over all processes (tree + wattprof + other).
    pub(crate) attributed_ns: u64,
    /// Context switches.
    pub(crate) switches: u64,
    /// Iterator tracker: thread time read beyond its package's capacity in
    /// its interval (a read delayed on a loaded machine). It is in its
    /// threads' `on_cpu_ns`, but its interval's energy did not cover it:
    /// it is carried to the next intervals, where its energy is divided as
    /// idle. A process's energy can fall short of its time's by at most
    /// this time's share, and the idle row hold as much more; 0 on a quiet
    /// machine and with the switch tracker.
    #[serde(default)]
    pub(crate) carried_ns: u64,
    /// Per CPU.
    #[serde(with = "wire::via")]
    pub(crate) per_cpu: Vec<CpuTimes>,
}

/// wattprof's own figures.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ProfilerReport {
    /// Which tracker measured on-CPU time.
    #[serde(with = "wire::via")]
    pub(crate) tracker: crate::tracker::TrackerKind,
    /// Why the switch tracker ran where `auto` wanted the iterator.
    pub(crate) tracker_fallback: Option<String>,
    /// Iterator tracker: how its reads that skip idle threads walked them
    /// (`open_coded` on Linux 6.8+, else `iter_task`); `None` for the
    /// switch tracker, and in older recordings.
    #[serde(default, with = "wire::via")]
    pub(crate) task_walk: Option<crate::tracker::TaskWalk>,
    /// Iterator tracker: why its reads used `iter_task` (the open-coded
    /// walk did not load); absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) task_walk_fallback: Option<String>,
    /// Reads whose open-coded walk filled its ring before it was over,
    /// finished by `iter/task` (nothing is lost; it costs a second walk).
    /// 0 in older recordings.
    #[serde(default)]
    pub(crate) task_walk_ring_full: u64,
    /// Iterator tracker: threads its filter map could not hold (read at
    /// every interval instead; nothing is lost).
    pub(crate) filter_overflow: u64,
    /// Iterator tracker: exited threads whose final run time (the free
    /// event) never came, settled from their exit's reading (up to a tick
    /// short).
    pub(crate) settled_from_exit: u64,
    /// Iterator tracker: threads gone with neither exit nor free seen (their
    /// records were lost); time after their last reading is not known.
    pub(crate) vanished_threads: u64,
    /// On-CPU ns of wattprof's threads, as the tracker measured them.
    pub(crate) on_cpu_ns: u64,
    /// Kernel memory of the eBPF maps (bytes, as the kernel accounts it).
    pub(crate) kernel_memory_bytes: u64,
    /// How exits are detected.
    #[serde(with = "wire::via")]
    pub(crate) exit_tracking: crate::tracker::ExitTracking,
    /// Which clock task time comes from.
    #[serde(with = "wire::via")]
    pub(crate) task_clock: crate::tracker::TaskClock,
    /// Whether in-progress slices were closed at each read.
    pub(crate) flush_supported: bool,
    /// Capacity of the per-thread map.
    pub(crate) max_tasks: u32,
    /// Sampling interval.
    pub(crate) interval_ns: u64,
    /// Samples taken.
    pub(crate) samples: u64,
    /// Syscalls spent reading the per-thread map.
    pub(crate) map_read_syscalls: u64,
    /// Fork/exec/exit records that did not fit in the ring buffer.
    pub(crate) events_lost: u64,
    /// Time of exited threads whose final record was overwritten.
    pub(crate) discarded_ns: u64,
    /// Fork records whose task never showed up.
    pub(crate) unmatched_forks: u64,
    /// `run`: processes of the tree that `/proc` no longer lists but whose
    /// end no record reported (their exit and free records were both
    /// lost): named from their fork and exec, with the time of their last
    /// reading (0 when no read saw them). Absent in older recordings.
    #[serde(default)]
    pub(crate) ended_unseen: u64,
    /// Outputs that stopped early (`--jsonl`, `--csv-intervals` on a full
    /// disk): one line each. wattprof then exits non-zero.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) output_errors: Vec<String>,
}

/// One energy domain over the whole profile (J).
pub(crate) type DomainReport = record::DomainOf<record::AveragePower>;

/// Energy per group.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct GroupEnergy {
    /// The command tree (always zero in `monitor`).
    pub(crate) tree: EnergyJ,
    /// wattprof itself.
    pub(crate) profiler: EnergyJ,
    /// Everything else.
    pub(crate) other: EnergyJ,
}

/// Energy: what was read, how it was divided.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct EnergyReport {
    /// The readers in use, and the kinds of energy not measured and why.
    #[serde(with = "wire::via")]
    pub(crate) readers: Vec<crate::sources::registry::ReaderUse>,
    /// Per domain, over the whole profile.
    pub(crate) domains: Vec<DomainReport>,
    /// Per group.
    pub(crate) groups: GroupEnergy,
    /// gCO2eq per kWh used for `co2_g`.
    pub(crate) carbon_intensity_g_per_kwh: f64,
    /// Where that figure comes from.
    pub(crate) carbon_intensity_source: String,
    /// Read failures (first few), for people.
    pub(crate) problems: Vec<String>,
    /// How static power was shared (`capacity`, `busy`, `idle`) and each
    /// divided domain's figure; absent before schema 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) static_power: Option<StaticPowerReport>,
    /// MIG: each instance's GPU energy over the profile (absent off MIG;
    /// schema 6).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) mig_instances: Vec<MigInstanceReport>,
}

/// A MIG instance's GPU energy over the profile: what its processes were
/// given.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct MigInstanceReport {
    /// The GPU (NVML index).
    pub(crate) gpu: u32,
    /// Its GPU instance.
    pub(crate) gpu_instance_id: u32,
    /// Its compute instance.
    pub(crate) compute_instance_id: u32,
    /// `MIG-...`.
    pub(crate) uuid: String,
    /// Compute slices.
    pub(crate) slices: u32,
    /// Energy (J).
    pub(crate) energy_j: f64,
}

/// How static power was shared and where each figure came from.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct StaticPowerReport {
    /// `--static-power`.
    #[serde(with = "wire::via")]
    pub(crate) rule: crate::attribution::StaticShare,
    /// One line for people: the rule and each figure.
    pub(crate) note: String,
    /// Fits learned during the profile (a daemon's host model is made of
    /// these).
    #[serde(default)]
    pub(crate) learned: Vec<LearnedFit>,
}

/// A static power fit learned during the profile.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct LearnedFit {
    /// Which domain.
    #[serde(with = "wire::via")]
    pub(crate) domain: crate::sources::Domain,
    /// Its package.
    pub(crate) package: Option<u32>,
    /// Static power (W).
    pub(crate) static_w: f64,
    /// Watts per busy CPU.
    pub(crate) per_cpu_w: f64,
    /// R².
    pub(crate) r_squared: f64,
    /// Intervals fitted.
    pub(crate) intervals: u64,
}

/// One container's (or systemd unit's) use over the profile: the sum of
/// its cgroups, processes that exited included.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct ContainerReport {
    /// Who made it.
    #[serde(with = "wire::via")]
    pub(crate) runtime: crate::process::container::Runtime,
    /// Container id, or unit name.
    pub(crate) id: String,
    /// Docker name, when the Docker daemon answered.
    pub(crate) name: Option<String>,
    /// Kubernetes pod UID.
    pub(crate) pod_uid: Option<String>,
    /// Kubernetes QoS class.
    pub(crate) qos: Option<String>,
    /// Its cgroup paths seen.
    pub(crate) cgroups: Vec<String>,
    /// On-CPU ns of its processes.
    pub(crate) on_cpu_ns: u64,
    /// Energy attributed to its processes.
    pub(crate) energy: EnergyJ,
}

/// One batch job's use over the profile: the sum of its steps' cgroups,
/// processes that exited included.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct JobReport {
    /// Who scheduled it (`slurm`).
    pub(crate) scheduler: String,
    /// The scheduler's job id (`sacct`'s JobID).
    pub(crate) job_id: String,
    /// Its owner, where its cgroup says (Slurm on cgroup v1).
    pub(crate) uid: Option<u32>,
    /// The owner's login name (the number where it has none).
    pub(crate) user: Option<String>,
    /// When its processes first and last ran: the ends of those
    /// intervals, ns since the profile began.
    pub(crate) first_ns: u64,
    /// See `first_ns`.
    pub(crate) last_ns: u64,
    /// On-CPU ns of its processes.
    pub(crate) on_cpu_ns: u64,
    /// Energy attributed to its processes.
    pub(crate) energy: EnergyJ,
    /// Per step (`batch`, `extern`, `0`…; empty for processes in the
    /// job's cgroup and no step's), most energy first.
    pub(crate) steps: Vec<JobStepReport>,
}

/// The file `monitor --jobs-dir` writes for a job once its cgroups are
/// gone from this node (docs/slurm.md): this node's share of the job.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct JobFile {
    /// `wattprof_job`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// wattprof's version.
    pub(crate) wattprof_version: String,
    /// The node (its host name).
    pub(crate) node: String,
    /// When the job's processes first ran here and last ran (the ends of
    /// those intervals), ns since the Unix epoch.
    pub(crate) first_unix_ns: u64,
    /// See `first_unix_ns`.
    pub(crate) last_unix_ns: u64,
    /// The job's figures on this node (its total first, then its steps).
    #[serde(flatten)]
    pub(crate) job: JobReport,
}

/// One step of a batch job.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct JobStepReport {
    /// The step's name (empty: the job's own cgroup).
    pub(crate) step: String,
    /// Its cgroup paths seen.
    pub(crate) cgroups: Vec<String>,
    /// On-CPU ns of its processes.
    pub(crate) on_cpu_ns: u64,
    /// Energy attributed to its processes.
    pub(crate) energy: EnergyJ,
}

/// One cgroup's use over the profile.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct CgroupReport {
    /// cgroup v2 path (`/system.slice/docker-<id>.scope`), or `id:N` when
    /// the cgroup was gone before its path was read.
    pub(crate) path: String,
    /// cgroup v2 id.
    pub(crate) id: u64,
    /// On-CPU ns of its processes.
    pub(crate) on_cpu_ns: u64,
    /// Energy attributed to its processes.
    pub(crate) energy: EnergyJ,
}

/// A profiling window, with its energy as `E` and the machine's per
/// domain as `M`: the profile keeps one in µJ and monotonic time
/// (`profile::windows::Window`), the report shows one in J and time since
/// the start ([`WindowReport`]).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowOf<E, M> {
    /// Name.
    pub name: String,
    /// The process whose tree it covers.
    pub pid: u32,
    /// Windows of any name open around it when it began.
    pub depth: usize,
    /// Begin (ns).
    pub begin_ns: u64,
    /// End (ns); the run's end if it was never ended.
    pub end_ns: u64,
    /// Still open when the run ended (closed there).
    pub unterminated: bool,
    /// On-CPU ns of the tree in the window.
    pub on_cpu_ns: u64,
    /// Energy attributed to the tree in the window.
    pub energy: E,
    /// The whole machine's measured energy in the window, per domain.
    pub machine: Vec<M>,
}

/// A profiling window in the report: J, and ns since the run started.
pub(crate) type WindowReport = WindowOf<EnergyJ, WindowDomainReport>;

/// A domain's measured energy in a window.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct WindowDomainReport {
    /// Domain.
    #[serde(with = "wire::via")]
    pub(crate) domain: Domain,
    /// Package or GPU index.
    pub(crate) package: Option<u32>,
    /// Measured (J).
    pub(crate) measured_j: f64,
    /// Average power (W).
    pub(crate) avg_power_w: f64,
    /// Modelled.
    pub(crate) estimated: bool,
}

/// The machine the profile ran on.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub(crate) struct HostReport {
    /// Host name.
    pub(crate) hostname: String,
    /// Kernel release.
    pub(crate) kernel: String,
    /// CPU model name.
    pub(crate) cpu_model: String,
    /// GPUs found.
    #[serde(with = "wire::via")]
    pub(crate) gpus: Vec<crate::sources::nvml::GpuInfo>,
}

/// The JSON document `wattprof run --output` and `monitor --output` write
/// (documented in docs/recording.md).
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct RunReport {
    /// Layout version.
    pub(crate) schema_version: u32,
    /// wattprof's version.
    pub(crate) wattprof_version: String,
    /// `run` or `monitor`.
    pub(crate) mode: String,
    /// Wall-clock start, ns since the Unix epoch.
    pub(crate) start_unix_ns: u64,
    /// Length of the profile (monotonic).
    pub(crate) wall_ns: u64,
    /// The machine.
    pub(crate) host: HostReport,
    /// The command (`run`); null in `monitor`.
    pub(crate) command: Option<CommandReport>,
    /// Every process of the command's tree (`run`), or the processes with
    /// the most energy (`monitor`).
    pub(crate) processes: Vec<ProcessReport>,
    /// On-CPU time per group.
    #[serde(with = "wire::via")]
    pub(crate) groups: GroupTotals,
    /// Energy.
    pub(crate) energy: EnergyReport,
    /// Per cgroup, most energy first.
    pub(crate) cgroups: Vec<CgroupReport>,
    /// Per container and systemd unit, most energy first.
    pub(crate) containers: Vec<ContainerReport>,
    /// Per batch job (Slurm), most energy first (absent in recordings
    /// made before jobs were recognised: read as none).
    #[serde(default)]
    pub(crate) jobs: Vec<JobReport>,
    /// Profiling windows, in the order they ended.
    pub(crate) windows: Vec<WindowReport>,
    /// Bad window messages (first few).
    pub(crate) window_errors: Vec<String>,
    /// Machine figures.
    pub(crate) machine: MachineReport,
    /// Task time that could not be recorded per task (map full).
    pub(crate) lost_ns: u64,
    /// wattprof's own cost and health.
    pub(crate) profiler: ProfilerReport,
    /// Energy per stack and function (`--stacks`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) stacks: Option<stacks::StackReport>,
    /// `run` without root: the figures came from a daemon (`monitor
    /// --serve`), which measured the command's tree; absent otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) served: Option<ServedReport>,
    /// Per-interval series (see docs/recording.md), as read back, each
    /// record unparsed. Written by the recording's sink, which keeps them
    /// as the profile runs (never by serialising this field: the
    /// stream's summary has none).
    #[serde(default, skip_serializing)]
    pub(crate) intervals: Vec<Box<serde_json::value::RawValue>>,
}

/// Process rows a daemon keeps per followed tree (a fork bomb's tree
/// stays bounded): processes beyond are in the tree's totals only.
pub(crate) const SERVED_MAX_ROWS: usize = 10_000;

/// Where a `run`'s figures came from when a daemon measured them.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ServedReport {
    /// The daemon's socket.
    pub(crate) daemon: String,
    /// Whether the machine's figures (per domain, idle, the rest of the
    /// machine) were left out: an unprivileged client gets only its own
    /// processes' (docs/shared.md, "The RAPL side channel").
    pub(crate) machine_withheld: bool,
    /// The domains the daemon reads (the report's own list of domains,
    /// which holds machine figures, is empty).
    #[serde(with = "wire::via")]
    pub(crate) domains: Vec<crate::sources::Domain>,
    /// Intervals the daemon measured for the tree.
    pub(crate) intervals: u64,
    /// Processes of the tree beyond what the daemon keeps per tree: in the
    /// totals, not on rows of their own.
    pub(crate) processes_left_out: u64,
    /// What is missing and why (the daemon went away mid-run): empty when
    /// the figures are whole.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) missing: Vec<String>,
}

impl RunReport {
    /// The domains this profile has a reader for.
    pub(crate) fn read(&self) -> unread::Read {
        match &self.served {
            // A daemon's report for a tree has no machine figures: the
            // domains it reads are listed apart.
            Some(s) if self.energy.domains.is_empty() => {
                unread::Read::of(s.domains.iter().copied())
            }
            _ => unread::Read::of(self.energy.domains.iter().map(|d| d.domain)),
        }
    }

    /// A recording of schema 2 (before the static and dynamic split) read
    /// as schema 3: its energy totals, which have no static part, are all
    /// dynamic (their `static_j` and `dynamic_j` read as 0 otherwise).
    pub(crate) fn upgrade_from_schema_2(&mut self) {
        if self.schema_version >= 3 {
            return;
        }
        let whole = |e: &mut EnergyJ| {
            if e.static_j == 0.0 && e.dynamic_j == 0.0 {
                e.dynamic_j = e.total_j;
            }
        };
        if let Some(c) = &mut self.command {
            whole(&mut c.energy);
        }
        self.processes.iter_mut().for_each(|p| whole(&mut p.energy));
        let g = &mut self.energy.groups;
        [&mut g.tree, &mut g.profiler, &mut g.other]
            .into_iter()
            .for_each(whole);
        self.cgroups.iter_mut().for_each(|c| whole(&mut c.energy));
        self.containers
            .iter_mut()
            .for_each(|c| whole(&mut c.energy));
        for j in &mut self.jobs {
            whole(&mut j.energy);
            j.steps.iter_mut().for_each(|s| whole(&mut s.energy));
        }
        self.windows.iter_mut().for_each(|w| whole(&mut w.energy));
        if let Some(st) = &mut self.stacks {
            for f in &mut st.functions {
                whole(&mut f.energy);
                whole(&mut f.self_energy);
            }
        }
    }
}

#[cfg(test)]
mod schema_names {
    use super::wire::{CpuTimesForm, Wire};
    use super::{CpuTimes, ProcessReport};

    #[test]
    fn recordings_before_schema_4_are_read_with_their_socket_names() {
        let form: CpuTimesForm = serde_json::from_str(
            r#"{"cpu": 3, "socket": 1, "busy_ns": 5, "idle_ns": 5, "idle_task_ns": 5,
                "lost_ns": 0, "switches": 0, "window_ns": 10}"#,
        )
        .expect("a schema-3 per_cpu entry");
        let cpu = CpuTimes::from_wire(form).expect("maps");
        assert_eq!((cpu.cpu, cpu.package), (3, 1));
        let p: ProcessReport = serde_json::from_str(
            r#"{"pid": 7, "ppid": 1, "comm": "x", "on_cpu_ns": 30,
                "on_cpu_ns_per_socket": [10, 20], "start_ns": 0, "exit_ns": null,
                "energy": {"package_j": 0, "core_j": 0, "dram_j": 0, "gpu_j": 0,
                           "total_j": 0, "avg_power_w": 0, "co2_g": 0},
                "memory": {"peak_pss_bytes": 0, "peak_uss_bytes": 0, "peak_gpu_bytes": 0},
                "cgroup": null}"#,
        )
        .expect("a schema-3 process");
        assert_eq!(p.on_cpu_ns_per_package, vec![10, 20]);
        // Written with the new names.
        let text = serde_json::to_string(&cpu.to_wire()).expect("JSON");
        assert!(
            text.contains("\"package\":1") && !text.contains("socket"),
            "{text}"
        );
    }
}
