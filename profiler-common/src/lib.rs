//! `#[repr(C)]` types shared by wattprof's eBPF programs and its userspace.
//!
//! Every type here crosses the kernel/user boundary byte for byte, so layouts
//! are fixed, padded explicitly, and never contain pointers. The `user`
//! feature adds `aya::Pod` impls for the userspace side.
//!
//! Each of wattprof's time trackers has one name in the three crates: its
//! programs in `profiler-ebpf`, its types in a module of that name here,
//! its reader in `profiler::tracker`. [`switch`] is the switch tracker,
//! [`iter`] the iterator tracker, [`stacks`] the stack sampler. What both
//! trackers send (fork, exec and exit records, the per-CPU state) is at
//! the root.
// Tested on the host, with std (`cargo test -p profiler-common`).
#![cfg_attr(not(test), no_std)]

pub mod iter;
pub mod stacks;
pub mod switch;

/// Most packages (sockets) a task's on-CPU time is split over.
///
/// A power of two so the eBPF program can bound an index with a mask.
/// Machines with more packages than this are refused by userspace.
pub const MAX_SOCKETS: usize = 8;

/// Length of a kernel task name (`TASK_COMM_LEN`), including the NUL.
pub const COMM_LEN: usize = 16;

/// Default number of entries of the `TASKS` map (live threads tracked at once).
pub const DEFAULT_MAX_TASKS: u32 = 65_536;

/// Default size of the `EVENTS` ring buffer in bytes (a power of two).
pub const DEFAULT_RING_BYTES: u32 = 4 << 20;

/// Size of the `ACTIVE` ring buffer in bytes: each record (a tid, 16 bytes
/// with its header) announces a thread that ran in the current read epoch,
/// so userspace reads only those. A record is `[tid, epoch]` as two u64
/// (24 bytes with its header): 43,690 threads per interval fit.
pub const ACTIVE_RING_BYTES: u32 = 1 << 20;

/// Per-CPU accounting state: the single value of the `CPUS` per-CPU array.
///
/// `last_ns - first_ns` is the CPU's accounting window. Task time
/// (`busy_ns`) is the scheduler's own `sum_exec_runtime` where the kernel has
/// BTF, so `busy_ns + idle_task_ns + lost_ns` differs from the window only by
/// where the scheduler draws slice boundaries (userspace reports the rest).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CpuState {
    /// `bpf_ktime_get_ns()` of the first event seen on this CPU; 0 before it.
    pub first_ns: u64,
    /// `bpf_ktime_get_ns()` up to which this CPU's time has been charged.
    pub last_ns: u64,
    /// Time charged to tasks (recorded in `TASKS`).
    pub busy_ns: u64,
    /// Wall time between context switches with the idle task (pid 0) on CPU.
    pub idle_task_ns: u64,
    /// Time a task ran that could not be recorded (`TASKS` full).
    pub lost_ns: u64,
    /// Context switches seen.
    pub switches: u64,
    /// Events that did not fit in the ring buffer.
    pub events_lost: u64,
    /// On-CPU time of exited tasks whose entry had to be recycled before
    /// their final totals could be reported (ring buffer full at exit, then
    /// the tid was reused). Part of it may already have been read.
    pub discarded_ns: u64,
    /// Tasks that could not be announced in the `ACTIVE` ring (full); when
    /// this grows, userspace reads the whole `TASKS` map instead.
    pub active_lost: u64,
    /// Dense package index of this CPU (`0..MAX_SOCKETS`), set by userspace.
    pub socket: u32,
    /// `CPU_FLAG_*` bits, set by userspace.
    pub flags: u32,
    /// Kernel address of the task the last context switch put on this CPU
    /// (0: unknown, or its counter could not be read).
    pub in_task: u64,
    /// That task's `se.sum_exec_runtime` when it came on, plus what
    /// flushes have charged since: a task first seen at the end of its
    /// slice is charged the scheduler's figure for it, not wall time.
    pub in_sum_ns: u64,
    /// 1 when that counter was 0: the task had never run (a fork's child
    /// on its first slice), so it may claim the entry its fork made.
    pub in_fresh: u64,
}

/// `CpuState::flags`: a context switch may open the CPU's window. Set only
/// where userspace cannot open windows with a flush (before Linux 5.10).
pub const CPU_FLAG_SWITCH_OPENS: u32 = 1;
/// `CpuState::flags`: the window is closed (set by the final flush); no
/// more time is charged on this CPU, so userspace reads a still snapshot.
pub const CPU_FLAG_CLOSED: u32 = 2;

/// `TaskEvent::kind`: a task was created (`tid` is the child).
pub const EVENT_FORK: u32 = 1;
/// `TaskEvent::kind`: a task called `execve` (`comm` is the new name).
pub const EVENT_EXEC: u32 = 2;
/// `TaskEvent::kind`: a task exited; `on_cpu_ns` are its totals.
pub const EVENT_EXIT: u32 = 3;
/// `TaskEvent::kind`: a stale entry (exit not reported) was recycled because
/// its tid was reused; `on_cpu_ns` are its final totals.
pub const EVENT_REAPED: u32 = 4;

/// A record of the `EVENTS` ring buffer.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskEvent {
    /// `EVENT_*`.
    pub kind: u32,
    /// The task the event is about (the child, for a fork).
    pub tid: u32,
    /// Its thread group id; for a fork, 0 (not known until the child runs).
    pub tgid: u32,
    /// For a fork: the thread that called fork/clone. Otherwise 0.
    pub parent_tid: u32,
    /// For a fork: the process that called fork/clone. Otherwise 0.
    pub parent_tgid: u32,
    /// CPU the event happened on.
    pub cpu: u32,
    /// `bpf_ktime_get_ns()` of the event.
    pub ts_ns: u64,
    /// For exit/reaped: the entry's `created_ns`. Otherwise 0.
    pub created_ns: u64,
    /// cgroup v2 id of the task (of the parent, for a fork).
    pub cgroup_id: u64,
    /// For exit/reaped: cumulative on-CPU time per package.
    pub on_cpu_ns: [u64; MAX_SOCKETS],
    /// Task name (the parent's, inherited, for a fork).
    pub comm: [u8; COMM_LEN],
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain `#[repr(C)]` integers and byte arrays with explicit
    // padding; every bit pattern is valid.
    unsafe impl aya::Pod for super::CpuState {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::switch::TaskStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::TaskEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::iter::ThreadEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::iter::IterRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::iter::KernelOffsets {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::stacks::StackRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::stacks::StackStats {}
}
