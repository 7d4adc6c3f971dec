//! The switch tracker's shared types: a thread's entry in `TASKS`,
//! written at every context switch (`profiler-ebpf/src/switch.rs`) and
//! read by `profiler/src/tracker/switch.rs`.

use crate::{COMM_LEN, MAX_SOCKETS};
/// `TASK_DEAD` in `task_struct::__state`, stable since Linux 4.14. Passed to
/// the `sched_switch` raw tracepoint as `prev_state` since Linux 5.18.
pub const TASK_DEAD: u64 = 0x80;

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
    /// Time charged by flushes beyond the scheduler's figure so far: the
    /// next context switch charges the scheduler's figure minus this, and
    /// what that figure does not cover stays owed to later switches.
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
