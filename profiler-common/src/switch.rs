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

    /// The task's new on-CPU time for a charge: at a context switch
    /// (`flush == false`) or at a flush, `wall` ns after the CPU's
    /// previous charge, with the task's `se.sum_exec_runtime` `sum` where
    /// it could be read, and `since_in` its counter when this CPU's last
    /// switch put it on (advanced by what flushes charged since), where
    /// that switch was seen.
    ///
    /// With a baseline, a switch charges the counter's growth; a flush
    /// charges `wall` provisionally, and the next switches settle it: an
    /// excess (wall time holds what a hypervisor stole, the scheduler's
    /// clock does not) stays owed and is taken from later slices.
    /// At first sight (a task older than tracking, or a fresh entry for a
    /// tid that moved to this task): a switch charges the counter's growth
    /// since `since_in` (else `wall`) and sets the baseline; a flush
    /// charges `wall` (the counter is stale by up to a tick there) and the
    /// baseline waits for the next switch. Without a counter (no BTF),
    /// every charge is `wall`.
    #[inline(always)]
    pub fn settle(
        &mut self,
        sum: Option<u64>,
        flush: bool,
        wall: u64,
        since_in: Option<u64>,
    ) -> u64 {
        let Some(sum) = sum else {
            return wall;
        };
        // A counter below the baseline cannot be this task's: first sight.
        if self.flags & TASK_FLAG_BASELINE != 0 && sum >= self.sum_exec_seen {
            if flush {
                self.provisional_ns += wall;
                return wall;
            }
            let exact = sum - self.sum_exec_seen;
            let settled = exact.saturating_sub(self.provisional_ns);
            self.sum_exec_seen = sum;
            self.provisional_ns = self.provisional_ns.saturating_sub(exact);
            return settled;
        }
        self.provisional_ns = 0;
        if flush {
            self.flags &= !TASK_FLAG_BASELINE;
            return wall;
        }
        self.sum_exec_seen = sum;
        self.flags |= TASK_FLAG_BASELINE;
        match since_in {
            Some(from) => {
                // Flushes in this slice charged past the counter: owed.
                self.provisional_ns = from.saturating_sub(sum);
                sum.saturating_sub(from)
            }
            None => wall,
        }
    }
}

/// Whose entry a charge finds under its tid.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Owner {
    /// The charging task's own.
    Own,
    /// Made at fork and not claimed yet: the charging task takes it.
    Claim,
    /// Another task's (the tid moved, or was freed and reused): retire it
    /// with its totals and start the charging task's own.
    Retire,
}

/// Whose the entry of a task at `entry_task_ptr` (0: made at fork) is,
/// for a charge by the task at `task_ptr`. `fresh`: whether the charging
/// task had never run when this CPU's last switch put it on, where that
/// switch was seen. Only a task that had never run claims a fork's entry:
/// after an execve from a non-leader thread the dying leader takes that
/// thread's tid, and its lifetime counter in the thread's fresh entry
/// would be counted a second time.
#[inline(always)]
pub fn owner(entry_task_ptr: u64, task_ptr: u64, fresh: Option<bool>) -> Owner {
    if entry_task_ptr == task_ptr {
        Owner::Own
    } else if entry_task_ptr == 0 && fresh != Some(false) {
        Owner::Claim
    } else {
        Owner::Retire
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn task(flags: u32) -> TaskStats {
        TaskStats::new(1, 1, 0, flags, [0; COMM_LEN])
    }

    #[test]
    fn a_switch_charges_the_counter_s_growth() {
        let mut t = task(TASK_FLAG_BASELINE);
        assert_eq!(t.settle(Some(100), false, 999, None), 100);
        assert_eq!(t.settle(Some(130), false, 999, None), 30);
    }

    #[test]
    fn a_flush_is_provisional_and_the_next_switch_settles_it() {
        let mut t = task(TASK_FLAG_BASELINE);
        assert_eq!(t.settle(Some(0), true, 40, None), 40);
        // The scheduler says 100 for the whole slice: 60 more.
        assert_eq!(t.settle(Some(100), false, 999, None), 60);
        assert_eq!(t.provisional_ns, 0);
    }

    #[test]
    fn a_flush_excess_is_repaid_from_later_slices_and_totals_never_fall() {
        let mut t = task(TASK_FLAG_BASELINE);
        // 50 of wall at the flush (steal in it); the counter grew 30.
        let mut total = t.settle(Some(0), true, 50, None);
        total += t.settle(Some(30), false, 999, None);
        assert_eq!(total, 50, "nothing is taken back from what was charged");
        assert_eq!(t.provisional_ns, 20, "the excess is owed");
        total += t.settle(Some(45), false, 999, None);
        assert_eq!((total, t.provisional_ns), (50, 5));
        total += t.settle(Some(100), false, 999, None);
        assert_eq!(total, 100, "repaid: the scheduler's figure again");
        assert_eq!(t.provisional_ns, 0);
    }

    #[test]
    fn first_sight_at_a_switch_is_the_counter_since_the_switch_in() {
        let mut t = task(0);
        // Came on at 1,000; leaves at 1,250, 400 of wall later (steal).
        assert_eq!(t.settle(Some(1_250), false, 400, Some(1_000)), 250);
        assert_ne!(t.flags & TASK_FLAG_BASELINE, 0);
        assert_eq!(t.settle(Some(1_300), false, 999, None), 50);
    }

    #[test]
    fn first_sight_without_the_switch_in_is_timed() {
        let mut t = task(0);
        assert_eq!(t.settle(Some(5_000), false, 70, None), 70);
        assert_eq!(t.settle(Some(5_010), false, 999, None), 10);
    }

    #[test]
    fn first_sight_at_a_flush_is_timed_and_the_switch_charges_the_rest() {
        let mut t = task(0);
        // On at 1,000 (since_in then advanced by the flush's 60).
        assert_eq!(t.settle(Some(1_040), true, 60, Some(1_000)), 60);
        assert_eq!(
            t.flags & TASK_FLAG_BASELINE,
            0,
            "stale counter: no baseline"
        );
        assert_eq!(t.settle(Some(1_100), false, 45, Some(1_060)), 40);
        // The slice was 100 by the scheduler: 60 + 40.
    }

    #[test]
    fn first_sight_after_flushes_that_ran_past_the_counter_owes_the_excess() {
        let mut t = task(0);
        assert_eq!(t.settle(Some(1_000), true, 80, Some(1_000)), 80);
        // The counter grew 50 in all: nothing more, 30 owed.
        assert_eq!(t.settle(Some(1_050), false, 10, Some(1_080)), 0);
        assert_eq!(t.provisional_ns, 30);
        assert_eq!(t.settle(Some(1_100), false, 999, None), 20);
    }

    #[test]
    fn a_counter_below_the_baseline_is_another_task_s() {
        let mut t = task(TASK_FLAG_BASELINE);
        t.settle(Some(500), false, 0, None);
        assert_eq!(t.settle(Some(100), false, 33, None), 33);
    }

    #[test]
    fn without_a_counter_every_charge_is_wall_time() {
        let mut t = task(TASK_FLAG_BASELINE);
        assert_eq!(t.settle(None, false, 12, Some(0)), 12);
        assert_eq!(t.settle(None, true, 7, None), 7);
    }

    #[test]
    fn only_a_task_that_never_ran_claims_a_fork_s_entry() {
        assert_eq!(owner(0xa0, 0xa0, None), Owner::Own);
        assert_eq!(owner(0, 0xa0, Some(true)), Owner::Claim);
        assert_eq!(owner(0, 0xa0, None), Owner::Claim, "switch-in not seen");
        assert_eq!(owner(0, 0xa0, Some(false)), Owner::Retire, "a dying leader");
        assert_eq!(owner(0xb0, 0xa0, Some(true)), Owner::Retire);
    }
}
