//! Loading wattprof's eBPF object and reading it.

use std::os::fd::{AsFd, AsRawFd, RawFd};

use aya::{
    Ebpf, EbpfLoader, RawTracePointRunOptions, TestRun,
    maps::{Array, HashMap as BpfHashMap, Map, MapData, PerCpuArray, PerCpuValues, RingBuf},
    programs::{Iter, RawTracePoint, TracePoint},
};
use profiler_common::{
    COMM_LEN, CPU_FLAG_SWITCH_OPENS, CpuState, DEFAULT_MAX_TASKS, EVENT_EXEC, EVENT_EXIT,
    EVENT_FORK, EVENT_REAPED, KernelOffsets, TASK_FLAG_DEAD, TaskEvent as RawEvent, TaskStats,
    ThreadEvent,
};

use super::load::{attach_err, load_err, map_err, program, raise_memlock_limit, take_map};
use super::{
    CpuSample, CpuSampler, CpuTimes, TaskEvent, TrackerError, comm_to_string,
    iter::IterState,
    monotonic_ns,
    sys::{self, Batch},
    threads::{Observation, Seen, ThreadLedger},
    tracefs,
};
use crate::topology::{SysRoot, Topology};

static OBJECT: &[u8] = aya::include_bytes_aligned!("../../ebpf/wattprof.bpf.o");

/// Kernel memory the maps take (bytes) for `possible_cpus` CPUs and a
/// `max_tasks` thread map, by the kernel's own accounting (the `memlock`
/// figures of `/proc/<pid>/fdinfo`).
///
/// The switch tracker:
/// - `TASKS`, a preallocated hash map: `max_tasks` elements of 184 bytes
///   (48-byte element header, 8-byte key slot, 128-byte [`TaskStats`]),
///   16 bytes per bucket (`max_tasks` rounded up to a power of two), and
///   one spare element and free-list per CPU (about 640 bytes);
/// - `EVENTS` and `ACTIVE` ring buffers: their size plus their page tables;
/// - `CPUS`: 80 bytes per CPU; `EPOCH`: one page-sized array.
///
/// The iterator tracker keeps `TASKS` and `ACTIVE` at their minimum and
/// instead has `LAST`, a preallocated hash map of `max_tasks` elements of
/// 64 bytes (48-byte header, 8-byte key, 8-byte value) with the same
/// buckets and per-CPU spares, plus three small arrays.
pub fn kernel_memory_estimate(tracker: TrackerKind, possible_cpus: u64, max_tasks: u64) -> u64 {
    let hash = |entries: u64, value: u64| {
        entries * (48 + 8 + value) + entries.next_power_of_two() * 16 + possible_cpus * 640
    };
    let ring = |bytes: u64| bytes + bytes / 4096 * 8 + 4096 * 2 + 4096 * 5;
    let common =
        ring(u64::from(profiler_common::DEFAULT_RING_BYTES)) + possible_cpus * 80 + 320 + 320;
    match tracker {
        TrackerKind::Switch => {
            hash(max_tasks, std::mem::size_of::<TaskStats>() as u64)
                + ring(u64::from(profiler_common::ACTIVE_RING_BYTES))
                + common
        }
        TrackerKind::Iter => {
            hash(1, std::mem::size_of::<TaskStats>() as u64)
                + ring(4096)
                + hash(max_tasks, 8)
                + common
                + 3 * 320
        }
    }
}

/// Which tracker measures on-CPU time.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum TrackerKind {
    /// A task iterator reads the scheduler's counters at each read, and
    /// rare events (exit, free, migration between packages, cgroup move)
    /// complete them: nothing runs at context switches (Linux 5.8+ with
    /// BTF).
    Iter,
    /// A program on every context switch charges the leaving thread: the
    /// fallback without BTF, at a cost to every switch on the machine.
    Switch,
}

/// An iterator-tracker event whose program is left out (tests of what
/// happens when its records are lost).
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum SkipEvent {
    /// `sched_process_exit`: final run times come from the free alone.
    Exit,
    /// `sched_process_free`: threads are settled from their exit reading.
    Free,
}

/// Which tracker to use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TrackerChoice {
    /// The iterator where it loads, else the switch tracker (with the reason
    /// in the report).
    #[default]
    Auto,
    /// The iterator tracker, or an error saying why not.
    Iter,
    /// The switch tracker.
    Switch,
}

/// How exits are detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum ExitTracking {
    /// The iterator tracker: the final run time when the task is freed
    /// (`sched_process_free`), the exit's reading when no free comes.
    FreeEvent,
    /// Linux 5.18+: the final context switch (`prev_state == TASK_DEAD`)
    /// reports exact final totals and frees the entry in the kernel.
    FinalSwitch,
    /// Older kernels: `sched_process_exit` flags the entry; userspace reads
    /// the last slice and frees it one interval later.
    ExitTracepoint,
}

/// Which clock task time comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum TaskClock {
    /// The scheduler's own `se.sum_exec_runtime` (kernel with BTF): the
    /// same nanoseconds as `/proc/<pid>/schedstat` and `getrusage`.
    SumExecRuntime,
    /// Time between context switches (kernel without BTF).
    SwitchTiming,
}

/// Settings of the tracker.
#[derive(Clone, Debug)]
pub(crate) struct TrackerConfig {
    /// Which tracker.
    pub(crate) tracker: TrackerChoice,
    /// Capacity of the per-thread map (the switch tracker's entries; the
    /// iterator tracker's filter).
    pub(crate) max_tasks: u32,
    /// Iterator tracker: an event program not to attach (tests).
    pub(crate) skip_event: Option<SkipEvent>,
    /// Force [`ExitTracking::ExitTracepoint`] even where the final switch
    /// is available (tests of the older-kernel path).
    pub(crate) force_exit_tracepoint: bool,
    /// Time slices between context switches even where the kernel's BTF
    /// gives the scheduler's own counter (tests of the no-BTF path).
    pub(crate) force_switch_timing: bool,
    /// sysfs, for the topology.
    pub(crate) sys: SysRoot,
}

impl Default for TrackerConfig {
    fn default() -> Self {
        Self {
            tracker: TrackerChoice::Auto,
            max_tasks: DEFAULT_MAX_TASKS,
            skip_event: None,
            force_exit_tracepoint: false,
            force_switch_timing: false,
            sys: SysRoot::real(),
        }
    }
}

/// What the eBPF programs log through aya-log (`AYA_LOGS`): their own
/// account of a full map or ring, kept until the next sample hands it to
/// the profile (a bounded number per sample; the programs rate-limit
/// themselves too).
#[derive(Clone, Default)]
struct KernelLog(std::sync::Arc<std::sync::Mutex<Vec<String>>>);

/// Kernel-side messages kept between two samples at most.
const MAX_KERNEL_LOG: usize = 64;

impl log::Log for KernelLog {
    fn enabled(&self, _: &log::Metadata<'_>) -> bool {
        true
    }

    fn log(&self, record: &log::Record<'_>) {
        let mut v = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if v.len() < MAX_KERNEL_LOG {
            v.push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

impl KernelLog {
    fn take(&self) -> Vec<String> {
        std::mem::take(
            &mut *self
                .0
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        )
    }
}

/// The loaded and attached eBPF tracker.
pub(crate) struct EbpfTracker {
    ebpf: Ebpf,
    /// The programs' aya-log ring, read at each sample.
    kernel_log: Option<(aya_log::EbpfLogger<KernelLog>, KernelLog)>,
    cpus: Map,
    tasks: Map,
    events: RingBuf<MapData>,
    epoch_map: Map,
    active: RingBuf<MapData>,
    /// Threads announced in `ACTIVE` since the last read.
    announced: Vec<u32>,
    /// Threads announced for the epoch after the one being read (they ran
    /// between the epoch bump and the drain): read now and next time too.
    carried: Vec<u32>,
    epoch: u64,
    samples: u64,
    topology: Topology,
    prev: Vec<CpuState>,
    ledger: ThreadLedger,
    pending: Vec<TaskEvent>,
    /// Threads forked lately whose end is unseen (for `run`'s settle wait).
    forks: super::forks::RecentForks,
    exit_tracking: ExitTracking,
    task_clock: TaskClock,
    flush_supported: bool,
    batch_supported: bool,
    read_syscalls: u64,
    ring_records: u64,
    start_ns: u64,
    /// Per CPU: task time settled beyond an interval's window (a slice
    /// charged at a flush, then settled with the scheduler's figure), taken
    /// from the next intervals' idle time so totals conserve exactly.
    idle_debt: Vec<u64>,
    closing: bool,
    /// The iterator tracker's state; `None` for the switch tracker (whose
    /// state is the fields above).
    iter: Option<IterState>,
    /// Why the switch tracker runs where the iterator was wanted.
    fallback: Option<String>,
}

impl EbpfTracker {
    /// Loads and attaches the programs of the tracker `cfg` asks for
    /// (with `auto`, the iterator where it loads, else the switch tracker)
    /// and takes the starting point of every thread.
    pub(crate) fn start(cfg: &TrackerConfig) -> Result<Self, TrackerError> {
        let missing = crate::privilege::missing_for_ebpf();
        if !missing.is_empty() {
            return Err(TrackerError::Privilege(crate::privilege::ebpf_message(
                &missing,
            )));
        }
        raise_memlock_limit();
        let topology = Topology::read(&cfg.sys)?;
        let tracefs = tracefs::ensure_mounted()?;
        let child_pid_offset =
            tracefs::field_offset(&tracefs, "sched", "sched_process_fork", "child_pid")?;
        // The switch path's test switches mean the switch tracker.
        let choice = if cfg.force_exit_tracepoint || cfg.force_switch_timing {
            TrackerChoice::Switch
        } else {
            cfg.tracker
        };
        if choice == TrackerChoice::Switch {
            return Self::start_switch(cfg, topology, child_pid_offset, None);
        }
        let why_not = match super::btf::running_kernel() {
            _ if in_child_pid_namespace() => {
                "wattprof runs in a child PID namespace, where the task \
                 iterator sees only that namespace's threads (run it in the host's: hostPID)"
                    .to_string()
            }
            None => "this kernel has no BTF (/sys/kernel/btf/vmlinux)".to_string(),
            Some(btf) => match btf.kernel_offsets() {
                Err(missing) => format!("this kernel's BTF has no {missing}"),
                Ok(offsets) => {
                    match Self::start_iter(cfg, topology.clone(), child_pid_offset, offsets) {
                        Ok(tracker) => return Ok(tracker),
                        Err(e @ TrackerError::Privilege(_)) => return Err(e),
                        Err(e) => e.to_string(),
                    }
                }
            },
        };
        if choice == TrackerChoice::Iter {
            return Err(TrackerError::Load(format!(
                "the iterator tracker cannot run here: {why_not} (use --tracker switch)"
            )));
        }
        Self::start_switch(cfg, topology, child_pid_offset, Some(why_not))
    }

    fn load(loader: &mut EbpfLoader<'_>) -> Result<Ebpf, TrackerError> {
        loader.load(OBJECT).map_err(|e| load_err("", e))
    }

    /// The fields both trackers fill alike.
    fn assemble(
        mut ebpf: Ebpf,
        topology: Topology,
        exit_tracking: ExitTracking,
        task_clock: TaskClock,
    ) -> Result<Self, TrackerError> {
        let mut cpus = take_map(&mut ebpf, "CPUS")?;
        init_cpus(&mut cpus, &topology, 0)?;
        let tasks = take_map(&mut ebpf, "TASKS")?;
        let events =
            RingBuf::try_from(take_map(&mut ebpf, "EVENTS")?).map_err(map_err("EVENTS"))?;
        let mut epoch_map = take_map(&mut ebpf, "EPOCH")?;
        write_epoch(&mut epoch_map, 1)?;
        let active =
            RingBuf::try_from(take_map(&mut ebpf, "ACTIVE")?).map_err(map_err("ACTIVE"))?;
        let sockets = topology.packages();
        let log = KernelLog::default();
        let kernel_log = aya_log::EbpfLogger::init_with_logger(&mut ebpf, log.clone())
            .ok()
            .map(|l| (l, log));
        Ok(Self {
            ebpf,
            kernel_log,
            cpus,
            tasks,
            events,
            epoch_map,
            active,
            announced: Vec::new(),
            carried: Vec::new(),
            epoch: 1,
            samples: 0,
            prev: vec![CpuState::default(); topology.possible_cpus()],
            topology,
            ledger: ThreadLedger::new(sockets),
            pending: Vec::new(),
            exit_tracking,
            task_clock,
            flush_supported: true,
            batch_supported: true,
            read_syscalls: 0,
            ring_records: 0,
            start_ns: 0,
            idle_debt: Vec::new(),
            forks: super::forks::RecentForks::default(),
            closing: false,
            iter: None,
            fallback: None,
        })
    }

    /// The iterator tracker: no program on context switches.
    fn start_iter(
        cfg: &TrackerConfig,
        topology: Topology,
        child_pid_offset: u32,
        offsets: KernelOffsets,
    ) -> Result<Self, TrackerError> {
        let possible = topology.possible_cpus().max(1) as u32;
        let mut ebpf = Self::load(
            EbpfLoader::new()
                .override_global("FORK_CHILD_PID_OFFSET", &child_pid_offset, true)
                .override_global("SUM_EXEC_OFFSET", &offsets.sum_exec, true)
                .override_global("KERNEL_OFFSETS", &offsets, true)
                .override_global("ITER_MODE", &1u32, true)
                .map_max_entries("TASKS", 1)
                .map_max_entries("ACTIVE", 4096)
                .map_max_entries("LAST", cfg.max_tasks.max(1))
                .map_max_entries("CPU_PACKAGE", possible),
        )?;
        let mut package = take_map(&mut ebpf, "CPU_PACKAGE")?;
        {
            let mut view = Array::<&mut MapData, u32>::try_from(&mut package)
                .map_err(map_err("CPU_PACKAGE"))?;
            for (cpu, socket) in topology.package_of_cpu.iter().enumerate() {
                view.set(cpu as u32, *socket, 0)
                    .map_err(map_err("CPU_PACKAGE"))?;
            }
        }
        let last = take_map(&mut ebpf, "LAST")?;
        let control = take_map(&mut ebpf, "ITER_CONTROL")?;
        let read_state = take_map(&mut ebpf, "ITER_READ")?;

        let btf = aya::Btf::from_sys_fs().map_err(|e| TrackerError::Load(e.to_string()))?;
        let prog = "wattprof_iter_task";
        let iter: &mut Iter = program(&mut ebpf, prog)?;
        iter.load("task", &btf).map_err(attach_err(prog))?;
        let prog_fd = iter.fd().map_err(attach_err(prog))?;
        let link = sys::iter_link_create(prog_fd.as_fd()).map_err(|e| TrackerError::Attach {
            program: prog.into(),
            reason: e.to_string(),
        })?;
        if cfg.skip_event != Some(SkipEvent::Exit) {
            attach_raw(&mut ebpf, "wattprof_thread_exit", "sched_process_exit")?;
        }
        if cfg.skip_event != Some(SkipEvent::Free) {
            attach_raw(&mut ebpf, "wattprof_thread_free", "sched_process_free")?;
        }
        // A move between packages is a checkpoint; on one package there
        // is nothing to split.
        if topology.packages() > 1 {
            attach_raw(&mut ebpf, "wattprof_thread_migrate", "sched_migrate_task")?;
        }
        attach_raw(&mut ebpf, "wattprof_cgroup_attach", "cgroup_attach_task")?;
        for (prog, name) in [
            ("wattprof_sched_process_fork", "sched_process_fork"),
            ("wattprof_sched_process_exec", "sched_process_exec"),
        ] {
            attach_tracepoint(&mut ebpf, prog, name)?;
        }

        let mut tracker = Self::assemble(
            ebpf,
            topology,
            ExitTracking::FreeEvent,
            TaskClock::SumExecRuntime,
        )?;
        tracker.prev = tracker.read_cpus()?;
        let state = IterState::new(
            link,
            last,
            control,
            package,
            read_state,
            &tracker.topology,
            monotonic_ns(),
        );
        tracker.iter = Some(state);
        Ok(tracker)
    }

    /// The iterator tracker's starting point: a full read, applied but not
    /// closed, so time after it belongs to the first interval.
    fn begin_iter(&mut self, at_read: &mut dyn FnMut()) -> Result<u64, TrackerError> {
        let Some(state) = self.iter.as_mut() else {
            return Err(TrackerError::Load("no iterator".into()));
        };
        // Threads born from here on count from zero.
        state.set_baseline(monotonic_ns());
        let began = state.read(true, at_read)?;
        // As in every sample: the walk's start, right after the counters
        // were read, is the interval boundary.
        let at_ns = state.walk_at();
        self.drain_events();
        if let Some(state) = self.iter.as_mut() {
            state.apply(began, at_ns);
            state.start_window(at_ns);
        }
        Ok(at_ns)
    }

    /// The switch tracker. Accounting starts on each CPU at its first
    /// event; a flush right after attaching opens every online CPU.
    fn start_switch(
        cfg: &TrackerConfig,
        topology: Topology,
        child_pid_offset: u32,
        fallback: Option<String>,
    ) -> Result<Self, TrackerError> {
        let sum_exec_offset = if cfg.force_switch_timing {
            0
        } else {
            super::btf::sum_exec_runtime_offset().unwrap_or(0)
        };
        let task_clock = if sum_exec_offset == 0 {
            TaskClock::SwitchTiming
        } else {
            TaskClock::SumExecRuntime
        };
        let mut ebpf = Self::load(
            EbpfLoader::new()
                .override_global("FORK_CHILD_PID_OFFSET", &child_pid_offset, true)
                .override_global("SUM_EXEC_OFFSET", &sum_exec_offset, true)
                .map_max_entries("TASKS", cfg.max_tasks.max(1))
                .map_max_entries("LAST", 1),
        )?;
        let exit_tracking = attach_switch(&mut ebpf, cfg.force_exit_tracepoint)?;
        for (prog, name) in [
            ("wattprof_sched_process_fork", "sched_process_fork"),
            ("wattprof_sched_process_exec", "sched_process_exec"),
        ] {
            attach_tracepoint(&mut ebpf, prog, name)?;
        }
        let flush: &mut RawTracePoint = program(&mut ebpf, "wattprof_flush")?;
        flush.load().map_err(attach_err("wattprof_flush"))?;

        let mut tracker = Self::assemble(ebpf, topology, exit_tracking, task_clock)?;
        tracker.fallback = fallback;
        Ok(tracker)
    }

    /// The switch tracker's starting point: a flush opens every online
    /// CPU's window.
    fn begin_switch(&mut self, at_read: &mut dyn FnMut()) -> Result<u64, TrackerError> {
        at_read();
        self.flush_cpus();
        if !self.flush_supported {
            // Before Linux 5.10: nothing is open yet; let switches open.
            init_cpus(&mut self.cpus, &self.topology, CPU_FLAG_SWITCH_OPENS)?;
        }
        // Every counter starts at zero when its window opens, so the first
        // sample counts from the opening flush for CPUs and tasks alike.
        self.prev = self
            .read_cpus()?
            .into_iter()
            .map(|c| CpuState {
                first_ns: c.first_ns,
                last_ns: c.first_ns,
                socket: c.socket,
                flags: c.flags,
                ..CpuState::default()
            })
            .collect();
        Ok(self
            .prev
            .iter()
            .map(|c| c.first_ns)
            .filter(|t| *t > 0)
            .min()
            .unwrap_or_else(monotonic_ns))
    }

    /// Which tracker runs.
    pub(crate) fn kind(&self) -> TrackerKind {
        if self.iter.is_some() {
            TrackerKind::Iter
        } else {
            TrackerKind::Switch
        }
    }

    /// Why the switch tracker runs although `auto` asked for the iterator.
    pub(crate) fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// Iterator tracker: threads its filter map could not hold at the
    /// busiest read (read every time instead); 0 for the switch tracker.
    pub(crate) fn filter_overflow(&self) -> u64 {
        self.iter.as_ref().map_or(0, |i| i.filter_overflow)
    }

    /// Iterator tracker: threads settled from their exit reading because
    /// their free never came, and threads gone with neither (events lost).
    pub(crate) fn exits_without_free(&self) -> (u64, u64) {
        self.iter.as_ref().map_or((0, 0), |i| {
            (i.ledger().settled_from_exit(), i.ledger().vanished())
        })
    }

    /// The CPU topology in use.
    pub(crate) fn topology(&self) -> &Topology {
        &self.topology
    }

    /// How exits are detected on this kernel.
    pub(crate) fn exit_tracking(&self) -> ExitTracking {
        self.exit_tracking
    }

    /// Which clock task time comes from.
    pub(crate) fn task_clock(&self) -> TaskClock {
        self.task_clock
    }

    /// Whether in-progress slices are closed before each read (Linux 5.10+).
    /// Without it, a slice still running at a read is counted at its end.
    pub(crate) fn flush_supported(&self) -> bool {
        self.flush_supported
    }

    /// Syscalls spent reading the per-thread map (or the iterator) so far.
    pub(crate) fn read_syscalls(&self) -> u64 {
        self.iter
            .as_ref()
            .map_or(self.read_syscalls, |i| i.read_syscalls)
    }

    /// File descriptor that becomes readable when events are waiting.
    pub(crate) fn events_fd(&self) -> RawFd {
        self.events.as_raw_fd()
    }

    /// Bytes of kernel memory the maps use, as the kernel accounts them
    /// (see [`kernel_memory_estimate`] for the formula).
    pub(crate) fn kernel_memory_bytes(&self) -> u64 {
        let fds = [
            map_fd(&self.cpus),
            map_fd(&self.tasks),
            map_fd(&self.epoch_map),
            Some(self.events.as_fd()),
            Some(self.active.as_fd()),
        ];
        let iter_fds = self
            .iter
            .as_ref()
            .map(|i| i.maps().map(map_fd))
            .into_iter()
            .flatten();
        fds.into_iter()
            .chain(iter_fds)
            .flatten()
            .filter_map(sys::map_memlock_bytes)
            .sum()
    }

    /// Start of accounting (monotonic ns): the flush that opened the CPUs'
    /// windows when the tracker started. Samples count from there.
    pub(crate) fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Threads of `tgid` seen alive that have not reported their exit.
    pub(crate) fn live_threads_of(&self, tgid: u32) -> usize {
        match &self.iter {
            Some(i) => i.ledger().live_threads_of(tgid),
            None => self.ledger.live_threads_of(tgid),
        }
    }

    /// Threads that exited between `since_ns` and `until_ns` (monotonic)
    /// and whose final run time has not come yet (the iterator tracker's free events,
    /// an RCU grace period after the thread is reaped).
    pub(crate) fn awaiting_final_since(&self, since_ns: u64, until_ns: u64) -> usize {
        self.iter
            .as_ref()
            .map_or(0, |i| i.ledger().awaiting_free_since(since_ns, until_ns))
    }

    /// Iterator tracker: threads read since `since_ns` that /proc no
    /// longer lists but that reported no exit (the event was lost): their
    /// free brings the final time. One look at /proc per such thread.
    pub(crate) fn lost_exits_since(&self, since_ns: u64) -> Vec<(u64, u64)> {
        let gone = |tgid: u32, tid: u32| {
            !std::path::Path::new(&format!("/proc/{tgid}/task/{tid}")).exists()
        };
        self.iter.as_ref().map_or_else(Vec::new, |i| {
            i.ledger().gone_unreported_since(since_ns, gone)
        })
    }

    /// How many of these threads (from [`EbpfTracker::lost_exits_since`])
    /// are still waiting for their free.
    pub(crate) fn not_freed(&self, threads: &[(u64, u64)]) -> usize {
        self.iter
            .as_ref()
            .map_or(0, |i| i.ledger().not_freed(threads))
    }

    /// Threads forked since `since_ns` (monotonic) whose free has not come
    /// and that `/proc` no longer lists: their free, with the final run
    /// time, is on its way. They include threads no
    /// read ever showed, which [`EbpfTracker::lost_exits_since`] cannot
    /// know.
    pub(crate) fn unended_forks_since(&self, since_ns: u64) -> Vec<u32> {
        // The switch tracker has no free events, and its exits come only
        // for threads it holds: nothing to wait for that could come.
        if self.iter.is_none() {
            return Vec::new();
        }
        self.forks.gone_unended_since(since_ns, |tid| {
            !std::path::Path::new(&format!("/proc/{tid}")).exists()
        })
    }

    /// How many of these threads (from
    /// [`EbpfTracker::unended_forks_since`]) have still not ended.
    pub(crate) fn still_unended(&self, tids: &[u32]) -> usize {
        self.forks.still_open(tids)
    }

    /// Whether thread `tid` has reported its exit.
    pub(crate) fn has_exited(&self, tid: u32) -> bool {
        match &self.iter {
            Some(i) => i.ledger().has_exited(tid),
            None => self.ledger.has_exited(tid),
        }
    }

    /// Consumes waiting ring-buffer records. Call it whenever the events fd
    /// is readable, so the ring never fills while waiting for a sample.
    pub(crate) fn drain_events(&mut self) {
        while let Some(item) = self.active.next() {
            let word = |i: usize| -> Option<u64> {
                Some(u64::from_ne_bytes(
                    item.get(i * 8..i * 8 + 8)?.try_into().ok()?,
                ))
            };
            if let (Some(tid), Some(epoch)) = (word(0), word(1)) {
                let tid = tid as u32;
                self.announced.push(tid);
                if epoch >= self.epoch {
                    // Ran in the epoch now open: it will not announce again
                    // in it, so the next read must look it up as well.
                    self.carried.push(tid);
                }
            }
        }
        while let Some(item) = self.events.next() {
            let kind = item
                .get(..4)
                .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
            if kind >= profiler_common::EVENT_THREAD_EXIT {
                if item.len() >= std::mem::size_of::<ThreadEvent>()
                    && let Some(iter) = self.iter.as_mut()
                {
                    // SAFETY: a `ThreadEvent` written by our program.
                    let ev: ThreadEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                    self.ring_records += 1;
                    // Its free carries the final run time: only that
                    // ends the settle wait's interest in it.
                    if ev.kind == profiler_common::EVENT_THREAD_FREE {
                        self.forks.ended(ev.tid);
                    }
                    iter.event(&ev);
                }
                continue;
            }
            if item.len() < std::mem::size_of::<RawEvent>() {
                continue;
            }
            // SAFETY: the record is a `RawEvent` written by our program;
            // read_unaligned copes with the ring's 8-byte alignment.
            let ev: RawEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            self.ring_records += 1;
            match ev.kind {
                EVENT_FORK => {
                    self.forks.forked(ev.tid, ev.ts_ns);
                    self.pending.push(TaskEvent::Fork {
                        ts_ns: ev.ts_ns,
                        child: ev.tid,
                        parent_tid: ev.parent_tid,
                        parent_tgid: ev.parent_tgid,
                        comm: comm_to_string(&ev.comm),
                    });
                }
                EVENT_EXEC => self.pending.push(TaskEvent::Exec {
                    ts_ns: ev.ts_ns,
                    tid: ev.tid,
                    tgid: ev.tgid,
                    comm: comm_to_string(&ev.comm),
                }),
                EVENT_EXIT | EVENT_REAPED => {
                    self.forks.ended(ev.tid);
                    self.ledger.observe(
                        Observation {
                            tid: ev.tid,
                            created_ns: ev.created_ns,
                            tgid: ev.tgid,
                            cgroup_id: ev.cgroup_id,
                            comm: &ev.comm,
                            on_cpu_ns: &ev.on_cpu_ns,
                        },
                        Seen::Exit { ts_ns: ev.ts_ns },
                    );
                }
                _ => {}
            }
        }
    }

    /// Closes the slice in progress on every online CPU by running the
    /// flush program there.
    fn flush_cpus(&mut self) {
        if !self.flush_supported {
            return;
        }
        let Some(prog) = self.ebpf.program("wattprof_flush") else {
            self.flush_supported = false;
            return;
        };
        let Ok(prog) = <&RawTracePoint>::try_from(prog) else {
            self.flush_supported = false;
            return;
        };
        let mut any_ok = false;
        for &cpu in &self.topology.online {
            let mut args = [0; 12];
            args[0] = u64::from(self.closing);
            let opts = RawTracePointRunOptions {
                args,
                cpu: Some(cpu),
            };
            // ENXIO: the CPU went offline since the topology was read.
            any_ok |= prog.test_run(opts).is_ok();
        }
        self.flush_supported = any_ok;
    }

    fn read_cpus(&self) -> Result<Vec<CpuState>, TrackerError> {
        let view =
            PerCpuArray::<&MapData, CpuState>::try_from(&self.cpus).map_err(map_err("CPUS"))?;
        let values = view.get(&0, 0).map_err(map_err("CPUS"))?;
        Ok(values.to_vec())
    }

    /// Looks up the announced threads and those awaiting a free, one
    /// syscall each.
    fn read_announced(&mut self) -> Result<Vec<(u32, TaskStats)>, TrackerError> {
        let mut tids = std::mem::take(&mut self.announced);
        tids.extend(self.ledger.awaiting_free());
        tids.sort_unstable();
        tids.dedup();
        let view = BpfHashMap::<&MapData, u32, TaskStats>::try_from(&self.tasks)
            .map_err(map_err("TASKS"))?;
        let mut out = Vec::with_capacity(tids.len());
        for tid in tids {
            self.read_syscalls += 1;
            match view.get(&tid, 0) {
                Ok(stats) => out.push((tid, stats)),
                // Exited (its exit record carries the totals).
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err("TASKS")(e)),
            }
        }
        Ok(out)
    }

    fn read_tasks(&mut self) -> Result<Vec<(u32, TaskStats)>, TrackerError> {
        let zero = TaskStats::new(0, 0, 0, 0, [0; COMM_LEN]);
        if self.batch_supported
            && let Some(fd) = map_fd(&self.tasks)
        {
            match sys::lookup_batch::<u32, TaskStats>(fd, 4096, zero) {
                Ok(Batch::Read { entries, calls }) => {
                    self.read_syscalls += u64::from(calls);
                    return Ok(entries);
                }
                Ok(Batch::Unsupported) => self.batch_supported = false,
                Err(e) => {
                    return Err(TrackerError::Map {
                        map: "TASKS",
                        reason: e.to_string(),
                    });
                }
            }
        }
        let view = BpfHashMap::<&MapData, u32, TaskStats>::try_from(&self.tasks)
            .map_err(map_err("TASKS"))?;
        let mut out = Vec::new();
        for entry in view.iter() {
            self.read_syscalls += 2;
            match entry {
                Ok(kv) => out.push(kv),
                // Deleted between get_next_key and lookup: its exit record
                // carries the totals.
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err("TASKS")(e)),
            }
        }
        Ok(out)
    }
}

impl EbpfTracker {
    /// A sample of the iterator tracker: read, drain the ring (exits,
    /// frees and checkpoints up to now), apply the read, close.
    fn sample_iter(&mut self, at_read: &mut dyn FnMut()) -> Result<CpuSample, TrackerError> {
        let began = match self.iter.as_mut() {
            Some(i) => i.read(self.closing, at_read)?,
            None => return Err(TrackerError::Load("no iterator".into())),
        };
        // The others close where the walk began, right after the energy
        // read: every thread is read at or after it, and time a running
        // thread ran past it is carried into the next interval. The final
        // window closes after the ring is drained: a free drained here
        // carries its thread's final time, which may run past the read,
        // and the last interval must span every time it hands out (closed
        // at the read's end before the drain, a loaded machine left its
        // CPUs busier than their window: run.rs:39).
        let at_ns = if self.closing {
            self.drain_events();
            monotonic_ns()
        } else {
            self.drain_events();
            self.iter
                .as_ref()
                .map_or_else(monotonic_ns, |s| s.walk_at())
        };
        let now = self.read_cpus()?;
        let Some(state) = self.iter.as_mut() else {
            return Err(TrackerError::Load("no iterator".into()));
        };
        state.apply(began, at_ns);
        let (tasks, cpus) = state.close(at_ns, &self.topology, self.closing)?;
        self.samples += 1;
        Ok(self.sample_of(at_ns, now, cpus, tasks, 0))
    }

    /// The sample both trackers hand out: their per-CPU and per-thread
    /// times, the events since the last one, and the ring records lost
    /// since (`now` becomes the CPUs' previous state).
    fn sample_of(
        &mut self,
        at_ns: u64,
        now: Vec<CpuState>,
        cpus: Vec<CpuTimes>,
        tasks: Vec<super::TaskTime>,
        discarded_ns: u64,
    ) -> CpuSample {
        let events_lost = now
            .iter()
            .zip(&self.prev)
            .map(|(n, p)| n.events_lost.saturating_sub(p.events_lost))
            .sum();
        self.prev = now;
        let kernel_log = match &mut self.kernel_log {
            Some((ring, log)) => {
                ring.flush();
                log.take()
            }
            None => Vec::new(),
        };
        CpuSample {
            at_ns,
            cpus,
            tasks,
            events: std::mem::take(&mut self.pending),
            events_lost,
            discarded_ns,
            kernel_log,
        }
    }
}

impl super::EventRing for EbpfTracker {
    fn ring_fd(&self) -> Option<RawFd> {
        Some(self.events_fd())
    }

    fn drain(&mut self) {
        self.drain_events();
    }
}

impl CpuSampler for EbpfTracker {
    fn begin(&mut self, at_read: &mut dyn FnMut()) -> Result<u64, TrackerError> {
        self.start_ns = if self.iter.is_some() {
            self.begin_iter(at_read)?
        } else {
            self.begin_switch(at_read)?
        };
        Ok(self.start_ns)
    }

    fn sample(&mut self, last: bool, at_read: &mut dyn FnMut()) -> Result<CpuSample, TrackerError> {
        // The final read: every thread, and windows closed for good.
        self.closing |= last;
        if self.iter.is_some() {
            return self.sample_iter(at_read);
        }
        at_read();
        // Threads charged from here on announce themselves for the next read.
        self.epoch += 1;
        write_epoch(&mut self.epoch_map, self.epoch)?;
        self.flush_cpus();
        let at_ns = monotonic_ns();
        let now = self.read_cpus()?;
        self.drain_events();
        let announce_overflow = now
            .iter()
            .zip(&self.prev)
            .any(|(n, p)| n.active_lost > p.active_lost);
        // Read only the threads that ran, unless that is most of them, the
        // announcements overflowed, or this is the first or final read.
        let full_scan = self.closing
            || self.samples == 0
            || announce_overflow
            || self.announced.len() * 4 > self.ledger.len();
        let entries = if full_scan {
            self.announced.clear();
            self.read_tasks()?
        } else {
            self.read_announced()?
        };
        self.announced = std::mem::take(&mut self.carried);
        self.samples += 1;
        let mut to_free = Vec::new();
        // tgid 0: created at fork, not run yet; nothing to count.
        for (tid, stats) in entries.iter().filter(|(_, s)| s.tgid != 0) {
            let free = self.ledger.observe(
                Observation {
                    tid: *tid,
                    created_ns: stats.created_ns,
                    tgid: stats.tgid,
                    cgroup_id: stats.cgroup_id,
                    comm: &stats.comm,
                    on_cpu_ns: &stats.on_cpu_ns,
                },
                Seen::Map {
                    dead: stats.flags & TASK_FLAG_DEAD != 0,
                },
            );
            if free {
                to_free.push((*tid, stats.created_ns));
            }
        }
        if !to_free.is_empty() {
            let mut view = BpfHashMap::<&mut MapData, u32, TaskStats>::try_from(&mut self.tasks)
                .map_err(map_err("TASKS"))?;
            for (tid, created) in to_free {
                // Free only the generation that was read: a reused tid's
                // fresh entry stays. (Already gone is fine: the kernel
                // retired it and reported it.)
                if view.get(&tid, 0).is_ok_and(|s| s.created_ns == created) {
                    let _ = view.remove(&tid);
                }
                self.ledger.freed(tid, created, at_ns);
            }
        }
        self.drain_events();
        let tasks = self.ledger.finish(full_scan);

        let mut discarded_ns = 0;
        self.idle_debt.resize(now.len(), 0);
        let cpus = now
            .iter()
            .zip(&self.prev)
            .zip(self.idle_debt.iter_mut())
            .enumerate()
            .map(|(cpu, ((n, p), debt))| {
                discarded_ns += n.discarded_ns.saturating_sub(p.discarded_ns);
                let window = |s: &CpuState| s.last_ns.saturating_sub(s.first_ns);
                let window_ns = window(n).saturating_sub(window(p));
                let busy_ns = n.busy_ns.saturating_sub(p.busy_ns);
                let lost_ns = n.lost_ns.saturating_sub(p.lost_ns);
                let idle_ns = super::idle_after_debt(window_ns, busy_ns + lost_ns, debt);
                CpuTimes {
                    cpu: cpu as u32,
                    package: n.socket,
                    busy_ns,
                    idle_ns,
                    idle_task_ns: n.idle_task_ns.saturating_sub(p.idle_task_ns),
                    lost_ns,
                    switches: n.switches.saturating_sub(p.switches),
                    window_ns,
                    carried_ns: 0,
                    over_ns: 0,
                }
            })
            .collect();
        Ok(self.sample_of(at_ns, now, cpus, tasks, discarded_ns))
    }
}

fn map_fd(map: &Map) -> Option<std::os::fd::BorrowedFd<'_>> {
    match map {
        Map::HashMap(data) | Map::PerCpuArray(data) | Map::RingBuf(data) | Map::Array(data) => {
            Some(data.fd().as_fd())
        }
        _ => None,
    }
}

fn write_epoch(map: &mut Map, epoch: u64) -> Result<(), TrackerError> {
    let mut view = Array::<&mut MapData, u64>::try_from(map).map_err(map_err("EPOCH"))?;
    view.set(0, epoch, 0).map_err(map_err("EPOCH"))
}

fn init_cpus(cpus: &mut Map, topology: &Topology, flags: u32) -> Result<(), TrackerError> {
    let mut view =
        PerCpuArray::<&mut MapData, CpuState>::try_from(cpus).map_err(map_err("CPUS"))?;
    let values: Vec<CpuState> = topology
        .package_of_cpu
        .iter()
        .map(|s| CpuState {
            socket: *s,
            flags,
            ..CpuState::default()
        })
        .collect();
    let values = PerCpuValues::try_from(values).map_err(|e| TrackerError::Map {
        map: "CPUS",
        reason: e.to_string(),
    })?;
    view.set(0, values, 0).map_err(map_err("CPUS"))
}

fn attach_switch(ebpf: &mut Ebpf, force_legacy: bool) -> Result<ExitTracking, TrackerError> {
    if !force_legacy {
        let prog = "wattprof_sched_switch";
        let p: &mut RawTracePoint = program(ebpf, prog)?;
        p.load().map_err(attach_err(prog))?;
        // Before 5.18 sched_switch has three arguments and the kernel
        // refuses a program reading the fourth: fall back.
        if p.attach("sched_switch").is_ok() {
            return Ok(ExitTracking::FinalSwitch);
        }
    }
    attach_raw(ebpf, "wattprof_sched_switch_legacy", "sched_switch")?;
    attach_tracepoint(ebpf, "wattprof_sched_process_exit", "sched_process_exit")?;
    Ok(ExitTracking::ExitTracepoint)
}

fn attach_raw(ebpf: &mut Ebpf, prog: &str, tracepoint: &str) -> Result<(), TrackerError> {
    let p: &mut RawTracePoint = program(ebpf, prog)?;
    p.load().map_err(attach_err(prog))?;
    p.attach(tracepoint).map_err(attach_err(prog))?;
    Ok(())
}

fn attach_tracepoint(ebpf: &mut Ebpf, prog: &str, name: &str) -> Result<(), TrackerError> {
    let p: &mut TracePoint = program(ebpf, prog)?;
    p.load().map_err(attach_err(prog))?;
    p.attach("sched", name).map_err(attach_err(prog))?;
    Ok(())
}

/// Whether this process is in a PID namespace below the host's (its
/// `NSpid` lists more than one pid): the task iterator walks only the
/// reader's namespace, while the tracepoints see every thread.
fn in_child_pid_namespace() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .is_some_and(|v| v.split_whitespace().count() > 1)
    })
}
