//! What the time tracker is asked for and what it reports it did: which
//! tracker, how exits are tracked, which clock, and the kernel memory its
//! maps take.

use profiler_common::DEFAULT_MAX_TASKS;
use profiler_common::switch::TaskStats;

use crate::topology::SysRoot;

/// Kernel memory the maps take (bytes) for `possible_cpus` CPUs and a
/// `max_tasks` thread map, by the kernel's own accounting (the `memlock`
/// figures of `/proc/<pid>/fdinfo`).
///
/// The switch tracker:
/// - `TASKS`, a preallocated hash map: `max_tasks` elements of 192 bytes
///   (48-byte element header, 8-byte key slot, 136-byte [`TaskStats`]),
///   16 bytes per bucket (`max_tasks` rounded up to a power of two), and
///   one spare element and free-list per CPU (about 640 bytes);
/// - `EVENTS` and `ACTIVE` ring buffers: their size plus their page tables;
/// - `CPUS`: one [`profiler_common::CpuState`] (104 bytes) per CPU; `EPOCH`:
///   one page-sized array.
///
/// The iterator tracker keeps `TASKS` and `ACTIVE` at their minimum and
/// instead has `LAST`, a preallocated hash map of `max_tasks` elements of
/// 64 bytes (48-byte header, 8-byte key, 8-byte value) with the same
/// buckets and per-CPU spares, plus three small arrays. Where its reads
/// use the open-coded walk (Linux 6.8+), its ring adds
/// [`walk_ring_memory`].
pub fn kernel_memory_estimate(tracker: TrackerKind, possible_cpus: u64, max_tasks: u64) -> u64 {
    let hash = |entries: u64, value: u64| {
        entries * (48 + 8 + value) + entries.next_power_of_two() * 16 + possible_cpus * 640
    };
    let common = ring(u64::from(profiler_common::DEFAULT_RING_BYTES))
        + possible_cpus * std::mem::size_of::<profiler_common::CpuState>() as u64
        + 320
        + 320;
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

/// A ring buffer's kernel memory, as the kernel counts it
/// (`ringbuf_map_mem_usage`): its data pages and three metadata pages (the
/// header and the consumer and producer positions), a page pointer per
/// metadata page and two per data page (the data is mapped twice), and the
/// map's struct (304 bytes on 6.18).
fn ring(bytes: u64) -> u64 {
    let pages = bytes / 4096;
    bytes + 4096 * 3 + (3 + 2 * pages) * 8 + 304
}

/// Kernel memory of the open-coded walk's ring (`ITER_RING`, 256 KiB),
/// which the iterator tracker holds only where the walk loaded (the
/// report's `task_walk` is `open_coded`).
pub fn walk_ring_memory() -> u64 {
    ring(u64::from(profiler_common::iter::ITER_RING_BYTES))
}

/// Which tracker measures on-CPU time.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
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

/// How the iterator tracker walks the threads at a read that skips idle
/// ones (full reads always use `iter/task`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum TaskWalkChoice {
    /// The open-coded walk where the kernel has its kfuncs (6.8 on) and
    /// the verifier takes it, else `iter/task`.
    #[default]
    Auto,
    /// The open-coded walk, or an error saying why not (testing).
    OpenCoded,
    /// `iter/task` at every read (testing, and the benchmark's baseline).
    IterTask,
}

/// The walk the iterator tracker's reads use.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TaskWalk {
    /// One program call walks every thread with the task iterator kfuncs
    /// (`bpf_iter_task_new/next/destroy`), records through a ring.
    OpenCoded,
    /// `iter/task`: the kernel calls the program once per thread.
    IterTask,
}

/// How exits are detected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
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
    /// Iterator tracker: which walk its reads use.
    pub(crate) task_walk: TaskWalkChoice,
    /// Bytes of the open-coded walk's ring, where not
    /// `profiler_common::iter::ITER_RING_BYTES` (tests of a full ring).
    pub(crate) task_walk_ring: Option<u32>,
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
            task_walk: TaskWalkChoice::Auto,
            task_walk_ring: None,
            force_exit_tracepoint: false,
            force_switch_timing: false,
            sys: SysRoot::real(),
        }
    }
}
