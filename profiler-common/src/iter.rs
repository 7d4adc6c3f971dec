//! The iterator tracker's shared types: its task iterator's records and
//! its rare-event records (`profiler-ebpf/src/iter.rs`, read by
//! `profiler/src/tracker/iter/`).

use crate::COMM_LEN;
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

/// `IterRecord::flags`, in a walk's trailer: the walk did not finish
/// (`ITER_RING` filled); userspace drains the ring and finishes the read
/// with `iter/task` (the filter skips what went out).
pub const ITER_FLAG_MORE: u32 = 4;

/// Bytes of `ITER_RING`, the open-coded walk's records: 3,640 records of
/// 72 bytes (with the ring's header), far more than threads run in an
/// interval on most hosts; a read whose walk fills it is finished by
/// `iter/task`.
pub const ITER_RING_BYTES: u32 = 256 << 10;

/// The placeholder `imm` of each open-coded task iterator kfunc call in
/// the object (`bpf_iter_task_new`, `_next`, `_destroy`), which the loader
/// replaces with the kfunc's id in the running kernel's BTF.
pub const KFUNC_PLACEHOLDERS: [(u32, &str); 3] = [
    (0x7EAD_0001, "bpf_iter_task_new"),
    (0x7EAD_0002, "bpf_iter_task_next"),
    (0x7EAD_0003, "bpf_iter_task_destroy"),
];

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
