//! `#[repr(C)]` types shared by wattprof's eBPF programs and its userspace.
//!
//! Every type here crosses the kernel/user boundary byte for byte, so layouts
//! are fixed, padded explicitly, and never contain pointers. The `user`
//! feature adds `aya::Pod` impls for the userspace side.
#![no_std]

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

/// `TASK_DEAD` in `task_struct::__state`, stable since Linux 4.14. Passed to
/// the `sched_switch` raw tracepoint as `prev_state` since Linux 5.18.
pub const TASK_DEAD: u64 = 0x80;

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
}

/// `CpuState::flags`: a context switch may open the CPU's window. Set only
/// where userspace cannot open windows with a flush (before Linux 5.10).
pub const CPU_FLAG_SWITCH_OPENS: u32 = 1;
/// `CpuState::flags`: the window is closed (set by the final flush); no
/// more time is charged on this CPU, so userspace reads a still snapshot.
pub const CPU_FLAG_CLOSED: u32 = 2;

/// `TaskStats::flags`: the task has exited; the entry will receive no more
/// time once its final context switch has happened.
pub const TASK_FLAG_DEAD: u32 = 1;
/// `TaskStats::flags`: `sum_exec_seen` holds a reading of the task's
/// `se.sum_exec_runtime` (0 for a task created while tracked).
pub const TASK_FLAG_BASELINE: u32 = 2;

/// Cumulative on-CPU time of one thread: the value of the `TASKS` hash map,
/// keyed by thread id (`u32`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TaskStats {
    /// `bpf_ktime_get_ns()` when this entry was created. Together with the
    /// tid it identifies one thread across pid reuse.
    pub created_ns: u64,
    /// cgroup v2 id the thread ran in at its last context switch.
    pub cgroup_id: u64,
    /// `se.sum_exec_runtime` at the last reading (see `TASK_FLAG_BASELINE`).
    pub sum_exec_seen: u64,
    /// Time charged by flushes since that reading; the next context switch
    /// charges the scheduler's figure minus this.
    pub provisional_ns: u64,
    /// The read epoch in which the thread was last announced in `ACTIVE`.
    pub epoch: u64,
    /// Kernel address of the task owning this entry (0: created at fork,
    /// claimed by the child's first charge). A tid can move to another task
    /// (exec from a non-leader thread swaps tids; a freed tid is reused), so
    /// an entry charged by a different task is retired, not mixed.
    pub task_ptr: u64,
    /// Nanoseconds on CPU, per dense package index.
    pub on_cpu_ns: [u64; MAX_SOCKETS],
    /// Thread group id (the process id).
    pub tgid: u32,
    /// `TASK_FLAG_*` bits.
    pub flags: u32,
    /// Task name, NUL padded.
    pub comm: [u8; COMM_LEN],
}

impl TaskStats {
    /// A new entry with no time yet: the tgid is filled in by the task's
    /// first charge, as `current` tells it.
    pub const fn new(
        created_ns: u64,
        cgroup_id: u64,
        task_ptr: u64,
        flags: u32,
        comm: [u8; COMM_LEN],
    ) -> Self {
        Self {
            created_ns,
            cgroup_id,
            sum_exec_seen: 0,
            provisional_ns: 0,
            epoch: 0,
            task_ptr,
            on_cpu_ns: [0; MAX_SOCKETS],
            tgid: 0,
            flags,
            comm,
        }
    }

    /// Total nanoseconds on CPU over all packages.
    pub fn total_ns(&self) -> u64 {
        self.on_cpu_ns.iter().fold(0u64, |a, b| a.wrapping_add(*b))
    }
}

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

/// `TaskEvent::kind` / `ThreadEvent::kind` of the iterator tracker: a
/// thread called `do_exit` (`sum_exec_ns` may be up to a tick stale).
pub const EVENT_THREAD_EXIT: u32 = 5;
/// A thread's `task_struct` was freed: `sum_exec_ns` is its final run time.
pub const EVENT_THREAD_FREE: u32 = 6;
/// A thread moved between CPUs of different packages (`cpu` is the source,
/// `arg` the destination); `sum_exec_ns` is exact (it was off CPU).
pub const EVENT_THREAD_MIGRATE: u32 = 7;
/// A thread group was moved to another cgroup v2 (`cgroup_id`); `sum_exec_ns`
/// of the moved thread at the move, `arg` 1 for a whole thread group.
pub const EVENT_THREAD_CGROUP: u32 = 8;

/// A record of the `EVENTS` ring about one thread, from the iterator
/// tracker's rare-event programs (exit, free, migration, cgroup move).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ThreadEvent {
    /// `EVENT_THREAD_*`.
    pub kind: u32,
    /// Thread id at the event.
    pub tid: u32,
    /// Thread group id.
    pub tgid: u32,
    /// CPU the thread is on or last ran on (source CPU of a migration).
    pub cpu: u32,
    /// `bpf_ktime_get_ns()` of the event.
    pub ts_ns: u64,
    /// Kernel address of the `task_struct`: with `start_ns`, the thread's
    /// identity (a tid can move to another task, an address be reused).
    pub task_ptr: u64,
    /// `task_struct.start_time` (monotonic ns).
    pub start_ns: u64,
    /// `se.sum_exec_runtime` at the event.
    pub sum_exec_ns: u64,
    /// cgroup v2 id (exit: where it ran; cgroup move: the destination).
    pub cgroup_id: u64,
    /// Migration: destination CPU; cgroup move: 1 if the whole group moved.
    pub arg: u32,
    /// Padding.
    pub pad: u32,
    /// Task name.
    pub comm: [u8; COMM_LEN],
}

/// `IterRecord::flags`: the last record of a read (the iterator's final
/// call); `sum_exec_ns` is the number of threads visited, `cgroup_id` the
/// number the filter map could not hold, `task_ptr` the records written.
pub const ITER_FLAG_TRAILER: u32 = 2;

/// `IterRecord::flags`: the thread was on a CPU at the read; its
/// `sum_exec_ns` is its counter plus the time since the counter was last
/// updated (`se.exec_start`, on its runqueue's task clock), not the counter
/// alone, which is as old as its last tick.
pub const ITER_FLAG_RUNNING: u32 = 1;

/// One record of the task iterator: a thread whose run time grew since the
/// previous read (every thread, on a full read), or that is on a CPU.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IterRecord {
    /// Kernel address of the `task_struct` (see `ThreadEvent::task_ptr`).
    pub task_ptr: u64,
    /// `task_struct.start_time` (monotonic ns).
    pub start_ns: u64,
    /// `se.sum_exec_runtime`: the scheduler's run time of the thread.
    pub sum_exec_ns: u64,
    /// cgroup v2 id.
    pub cgroup_id: u64,
    /// Thread id.
    pub tid: u32,
    /// Thread group id.
    pub tgid: u32,
    /// CPU it is on or last ran on.
    pub cpu: u32,
    /// `ITER_FLAG_*`.
    pub flags: u32,
    /// Task name.
    pub comm: [u8; COMM_LEN],
}

/// Byte offsets into the running kernel's structures, from its BTF, set by
/// userspace before load (`KERNEL_OFFSETS`). 0 means not found.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelOffsets {
    /// `task_struct.se.sum_exec_runtime`.
    pub sum_exec: u32,
    /// `task_struct.pid`.
    pub pid: u32,
    /// `task_struct.tgid`.
    pub tgid: u32,
    /// `task_struct.start_time`.
    pub start_time: u32,
    /// `task_struct.comm`.
    pub comm: u32,
    /// The CPU of a task: `task_struct.cpu` or `task_struct.thread_info.cpu`.
    pub cpu: u32,
    /// `task_struct.cgroups`.
    pub cgroups: u32,
    /// `css_set.dfl_cgrp`.
    pub dfl_cgrp: u32,
    /// `cgroup.kn`.
    pub cgroup_kn: u32,
    /// `kernfs_node.id`.
    pub kn_id: u32,
    /// `task_struct.on_cpu`.
    pub on_cpu: u32,
    /// `task_struct.se.exec_start` (the task clock at the counter's last
    /// update).
    pub exec_start: u32,
    /// `task_struct.se.cfs_rq`.
    pub se_cfs_rq: u32,
    /// `cfs_rq.rq`.
    pub cfs_rq_rq: u32,
    /// `rq.clock`.
    pub rq_clock: u32,
    /// `rq.clock_task`.
    pub rq_clock_task: u32,
    /// `task_struct.sched_info.last_arrival` (`rq_clock` at switch-in): the
    /// reader's calibrates the scheduler clock. 0 when any of the running
    /// thread fields is missing: running threads then report their
    /// counter.
    pub last_arrival: u32,
}

/// Deepest kernel stack a stack sample keeps (`PERF_MAX_STACK_DEPTH`).
pub const STACK_MAX_KERNEL_FRAMES: usize = 127;

/// Deepest user stack a stack sample keeps (`PERF_MAX_STACK_DEPTH`).
pub const STACK_MAX_USER_FRAMES: usize = 127;

/// Bytes of one user frame: the kernel's `struct bpf_stack_build_id`
/// (`status: i32`, `build_id: [u8; 20]`, then the file offset, or the
/// address where no build id was found).
pub const STACK_USER_FRAME_BYTES: usize = 32;

/// `StackRecord::kind` of a stack sample.
pub const STACK_RECORD_SAMPLE: u32 = 1;

/// `StackRecord::kind` of an exec (the file that was executed follows).
pub const STACK_RECORD_EXEC: u32 = 2;

/// Longest exec file name the stack sampler reports (with the NUL).
pub const STACK_EXEC_PATH_LEN: usize = 256;

/// Size of the stack sampler's ring buffer by default (a power of two).
pub const STACK_RING_BYTES: u32 = 8 << 20;

/// The fixed head of every record of the stack sampler's ring buffer.
///
/// A sample is followed by `kernel_bytes` of kernel frames (addresses,
/// `u64` each) and then `user_bytes` of user frames
/// (`STACK_USER_FRAME_BYTES` each). An exec is followed by a
/// NUL-terminated path of `STACK_EXEC_PATH_LEN` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackRecord {
    /// `STACK_RECORD_*`.
    pub kind: u32,
    /// Process (thread group) id.
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// `bpf_ktime_get_ns()` when it was taken.
    pub ts_ns: u64,
    /// Bytes of kernel frames that follow; negative: the helper's error.
    pub kernel_bytes: i32,
    /// Bytes of user frames that follow the kernel frames; negative: the
    /// helper's error.
    pub user_bytes: i32,
    /// The thread's name.
    pub comm: [u8; COMM_LEN],
}

/// Size of the stack sampler's per-CPU scratch buffer: a record with the
/// deepest stacks.
pub const STACK_SCRATCH_BYTES: usize = core::mem::size_of::<StackRecord>()
    + STACK_MAX_KERNEL_FRAMES * 8
    + STACK_MAX_USER_FRAMES * STACK_USER_FRAME_BYTES;

/// The stack sampler's counters, one per CPU: nothing is dropped uncounted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackStats {
    /// Samples of a task (not the idle task) taken.
    pub samples: u64,
    /// Samples of the idle task (not reported).
    pub idle: u64,
    /// Samples lost because the ring buffer was full.
    pub ring_full: u64,
    /// Exec records lost because the ring buffer was full.
    pub exec_lost: u64,
}

#[cfg(feature = "user")]
mod user {
    // SAFETY: plain `#[repr(C)]` integers and byte arrays with explicit
    // padding; every bit pattern is valid.
    unsafe impl aya::Pod for super::CpuState {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::TaskStats {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::TaskEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::ThreadEvent {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::IterRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::KernelOffsets {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::StackRecord {}
    // SAFETY: as above.
    unsafe impl aya::Pod for super::StackStats {}
}
