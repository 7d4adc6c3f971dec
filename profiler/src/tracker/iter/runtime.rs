//! The iterator tracker's bookkeeping: the scheduler's cumulative run time
//! per thread (`se.sum_exec_runtime`), read at each read and at rare
//! events, turned into per-interval deltas per package and cgroup.
//!
//! A thread is its `task_struct`: the address and `start_time` the kernel
//! reports (a tid can move to another task at an exec from a non-leader
//! thread, and an address is reused once its task is freed). The exec case
//! is recognised because the exec'ing thread takes the leader's older
//! `start_time`: a known address reporting an *earlier* start is the same
//! thread, a *later* one a new task.
//!
//! Readings are cumulative, so seeing the same time twice (a read racing an
//! exit) never counts it twice. Checkpoints (a move between packages or
//! cgroups, at a known run time) split a delta where it happened.

use std::collections::HashMap;

use profiler_common::{COMM_LEN, MAX_SOCKETS};

use crate::hash::{IntMap, IntSet};
use crate::tracker::{PackageNs, TaskTime};

use super::thread::{Checkpoint, Life, Thread, add_checkpoint, advance};

/// How long after an exit its free may take before the thread is counted
/// as settled from the exit's reading (the free comes an RCU grace period
/// after the thread is reaped: 15–40 ms measured here; a zombie nobody
/// reaps frees only when it is reaped, and a lost record never). A settled
/// thread is kept until its free comes (which counts the rest) or until
/// two full reads no longer show it.
pub(crate) const FREE_GRACE_NS: u64 = 10_000_000_000;

/// Threads born this long before the start of the last full read that are
/// not known count from zero: a thread being created while the read
/// passed its pid may have been missed by it.
const BASELINE_MARGIN_NS: u64 = 1_000_000_000;

/// How long a thread forgotten without its free (two full reads did not
/// show it) is remembered, so that its late free counts nothing twice.
/// Its free comes an RCU grace period after the thread was reaped, and two
/// full reads take at least two intervals: a minute is far past both.
const FORGOTTEN_KEEP_NS: u64 = 60_000_000_000;

/// At most this many forgotten threads are remembered (the oldest go
/// first); 24 bytes each.
const FORGOTTEN_MAX: usize = 1 << 16;

/// One reading of a thread's run time.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Reading<'a> {
    /// `task_struct` address.
    pub(crate) task_ptr: u64,
    /// `task_struct.start_time` (monotonic ns).
    pub(crate) start_ns: u64,
    /// Thread id.
    pub(crate) tid: u32,
    /// Process id.
    pub(crate) tgid: u32,
    /// cgroup v2 id, where the reading knows it.
    pub(crate) cgroup_id: Option<u64>,
    /// Name, where the reading has it.
    pub(crate) comm: Option<&'a [u8; COMM_LEN]>,
    /// `se.sum_exec_runtime`.
    pub(crate) sum_exec_ns: u64,
    /// CPU it is on or last ran on.
    pub(crate) cpu: u32,
}

/// What a reading is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A read of the task iterator (or the exact figure of a running one).
    Read,
    /// The thread called `do_exit` at this monotonic time.
    Exit {
        /// When.
        ts_ns: u64,
    },
    /// The thread's `task_struct` was freed: its final run time.
    Free {
        /// When.
        ts_ns: u64,
    },
    /// The thread moved from `cpu` to a CPU of another package.
    Migrate,
    /// The thread was moved to the cgroup of the reading.
    CgroupMove,
}

/// Cumulative-to-delta bookkeeping for every thread the iterator tracker
/// has seen.
#[derive(Debug)]
pub(crate) struct RuntimeLedger {
    package_of_cpu: Vec<u32>,
    packages: usize,
    /// Threads first seen that were born before this (monotonic ns) count
    /// from their first reading; later ones from zero. It is the start of
    /// the last read that showed every thread (at first, of tracking): a
    /// thread alive then was seen then, so an unknown older one is one
    /// already settled, whose time must not count again.
    baseline_before_ns: u64,
    /// Threads born from here on (monotonic ns) are the profile's whole:
    /// the start of the first full read.
    tracking_start_ns: u64,
    /// Threads forgotten without their free, by (task pointer, start),
    /// with when, oldest first: their late free counts nothing.
    forgotten: std::collections::VecDeque<(u64, u64, u64)>,
    forgotten_set: IntSet<(u64, u64)>,
    /// The latest forget time of a forgotten thread no longer remembered:
    /// a thread born before it may be one of those, so its late free
    /// counts nothing.
    forgotten_evicted_ns: u64,
    threads: IntMap<u64, Vec<Thread>>,
    /// Addresses read since the last `finish`, and those with a thread
    /// that exited and awaits its free: `finish` looks at these only, not
    /// at every thread on the machine.
    touched: Vec<u64>,
    awaiting: IntSet<u64>,
    cpu_busy_ns: Vec<u64>,
    settled_from_exit: u64,
    vanished: u64,
    forget: Vec<u64>,
}

impl RuntimeLedger {
    /// A ledger for CPUs on these packages (dense index per CPU id);
    /// threads born from `start_ns` on count from zero.
    pub(crate) fn new(package_of_cpu: Vec<u32>, start_ns: u64) -> Self {
        let packages = package_of_cpu
            .iter()
            .map(|p| *p as usize + 1)
            .max()
            .unwrap_or(1)
            .clamp(1, MAX_SOCKETS);
        Self {
            cpu_busy_ns: vec![0; package_of_cpu.len().max(1)],
            package_of_cpu,
            packages,
            baseline_before_ns: start_ns,
            tracking_start_ns: start_ns,
            forgotten: Default::default(),
            forgotten_set: Default::default(),
            forgotten_evicted_ns: 0,
            threads: HashMap::default(),
            touched: Vec::new(),
            awaiting: Default::default(),
            settled_from_exit: 0,
            vanished: 0,
            forget: Vec::new(),
        }
    }

    /// Threads born from `start_ns` on count from zero (the baseline read
    /// is about to start).
    pub(crate) fn set_baseline(&mut self, start_ns: u64) {
        self.baseline_before_ns = start_ns;
        self.tracking_start_ns = start_ns;
    }

    /// Threads tracked.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.threads.values().map(Vec::len).sum()
    }
    /// Whether no thread is tracked.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// Threads settled from their exit reading because no free came.
    pub(crate) fn settled_from_exit(&self) -> u64 {
        self.settled_from_exit
    }

    /// Threads that disappeared with neither exit nor free seen (their
    /// events were lost): their time after the last reading is not known.
    pub(crate) fn vanished(&self) -> u64 {
        self.vanished
    }

    /// Addresses of threads gone without a free (two full reads did not
    /// show them): their filter entries in the kernel should go.
    pub(crate) fn take_forgotten(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.forget)
    }

    /// Threads of `tgid` that have not exited.
    pub(crate) fn live_threads_of(&self, tgid: u32) -> usize {
        self.all()
            .filter(|t| t.tgid == tgid && t.life == Life::Alive)
            .count()
    }

    /// Threads that exited between `since_ns` and `until_ns` (monotonic)
    /// and whose final run time (the free) has not come yet, as of the
    /// last `finish`.
    pub(crate) fn awaiting_free_since(&self, since_ns: u64, until_ns: u64) -> usize {
        self.awaiting
            .iter()
            .filter_map(|ptr| self.threads.get(ptr))
            .flatten()
            .filter(|t| {
                matches!(t.life, Life::Exited { at_ns, .. } if (since_ns..=until_ns).contains(&at_ns))
            })
            .count()
    }

    /// Threads read since `since_ns` that reported neither exit nor free
    /// and that `gone(tgid, tid)` says are gone (their exit event was
    /// lost; their free, with the final run time, is on its way), by
    /// task pointer and start.
    pub(crate) fn gone_unreported_since(
        &self,
        since_ns: u64,
        gone: impl Fn(u32, u32) -> bool,
    ) -> Vec<(u64, u64)> {
        self.threads
            .iter()
            .flat_map(|(ptr, list)| list.iter().map(move |t| (*ptr, t)))
            .filter(|(_, t)| {
                t.life == Life::Alive && t.last_seen_ns >= since_ns && gone(t.tgid, t.tid)
            })
            .map(|(ptr, t)| (ptr, t.start_ns))
            .collect()
    }

    /// How many of these threads (task pointer, start) have not been
    /// freed yet.
    pub(crate) fn not_freed(&self, threads: &[(u64, u64)]) -> usize {
        threads
            .iter()
            .filter(|(ptr, start)| {
                self.threads
                    .get(ptr)
                    .is_some_and(|l| l.iter().any(|t| t.start_ns == *start && !t.life.is_freed()))
            })
            .count()
    }

    /// Whether thread `tid` has exited.
    pub(crate) fn has_exited(&self, tid: u32) -> bool {
        self.all()
            .any(|t| t.tid == tid && t.life.exit_ns().is_some())
    }

    fn all(&self) -> impl Iterator<Item = &Thread> {
        self.threads.values().flatten()
    }

    /// Takes one reading (a record, an exit, a free, a checkpoint) at
    /// monotonic time `now_ns`.
    pub(crate) fn observe(&mut self, r: Reading<'_>, kind: Kind, now_ns: u64) {
        // Threads older than the last full read count from here.
        let old = r.start_ns < self.baseline_before_ns;
        let counted_ns = if old { r.sum_exec_ns } else { 0 };
        let known = self
            .threads
            .get(&r.task_ptr)
            .is_some_and(|list| list.iter().any(|t| t.start_ns >= r.start_ns));
        let mut counted_ns = counted_ns;
        if old && !known && matches!(kind, Kind::Free { .. }) {
            // A full read shows every thread that is in the task list, but
            // a thread reaped before it began is not, and its free comes
            // an RCU grace period later (seconds on a loaded machine). So
            // an unknown old thread's free is either one forgotten without
            // its free (two full reads did not show it: counted, nothing
            // left to count) or one no read ever saw, born and reaped
            // between two reads: born while tracking, all its time is the
            // profile's; born before, none of it can be told apart.
            // A thread forgotten was born before it was forgotten: one
            // born after the last forget no longer remembered is not one
            // of those.
            let forgotten = self.forgotten_set.contains(&(r.task_ptr, r.start_ns))
                || r.start_ns <= self.forgotten_evicted_ns;
            if forgotten || r.start_ns < self.tracking_start_ns {
                return;
            }
            counted_ns = 0;
        }
        self.touched.push(r.task_ptr);
        let list = self.threads.entry(r.task_ptr).or_default();
        let idx = slot(list, &r, counted_ns, now_ns);
        let t = &mut list[idx];
        t.tid = r.tid;
        t.tgid = r.tgid;
        // Only what the iterator shows, or the thread's end, says it is
        // still there (events come for threads it may not see).
        if matches!(kind, Kind::Read | Kind::Exit { .. } | Kind::Free { .. }) {
            t.last_seen_ns = now_ns;
            t.missing_full_reads = 0;
        }
        if let Some(comm) = r.comm.filter(|c| c[0] != 0) {
            t.comm = *comm;
        }
        let map = &self.package_of_cpu;
        let busy = &mut self.cpu_busy_ns;
        match kind {
            Kind::Migrate => {
                add_checkpoint(t, r.sum_exec_ns, Checkpoint::Package { cpu: r.cpu });
            }
            Kind::CgroupMove => {
                if let Some(to) = r.cgroup_id {
                    add_checkpoint(t, r.sum_exec_ns, Checkpoint::Cgroup { to, cpu: r.cpu });
                }
            }
            Kind::Read | Kind::Exit { .. } | Kind::Free { .. } => {
                advance(t, r.sum_exec_ns, r.cpu, r.cgroup_id, map, busy);
                match kind {
                    Kind::Exit { ts_ns } => t.life.exit(ts_ns),
                    Kind::Free { ts_ns } => t.life.free(ts_ns),
                    _ => {}
                }
            }
        }
    }

    /// After a read that showed every thread (zombies too): threads read
    /// before `read_start_ns` that two such reads in a row did not show are
    /// gone (one miss can be a thread whose tid moved behind the scan at an
    /// exec). Exited ones are settled; those that reported no exit are gone
    /// without a trace (their events were lost).
    pub(crate) fn full_read_done(&mut self, read_start_ns: u64) {
        for (ptr, list) in &mut self.threads {
            for t in list.iter_mut().filter(|t| !t.life.is_freed()) {
                if t.last_seen_ns >= read_start_ns {
                    continue;
                }
                t.missing_full_reads = t.missing_full_reads.saturating_add(1);
                if t.missing_full_reads < 2 {
                    continue;
                }
                t.life = match t.life {
                    Life::Alive => {
                        self.vanished += 1;
                        Life::Freed {
                            at_ns: t.last_seen_ns,
                            reported: false,
                        }
                    }
                    Life::Exited { at_ns, reported } => {
                        self.settled_from_exit += 1;
                        Life::Freed { at_ns, reported }
                    }
                    Life::Settled { at_ns, reported } | Life::Freed { at_ns, reported } => {
                        Life::Freed { at_ns, reported }
                    }
                };
                self.forget.push(*ptr);
                self.touched.push(*ptr);
                if self.forgotten_set.insert((*ptr, t.start_ns)) {
                    self.forgotten.push_back((*ptr, t.start_ns, read_start_ns));
                }
            }
        }
        while self.forgotten.len() > FORGOTTEN_MAX
            || self
                .forgotten
                .front()
                .is_some_and(|(_, _, at)| at.saturating_add(FORGOTTEN_KEEP_NS) < read_start_ns)
        {
            if let Some((ptr, start, at)) = self.forgotten.pop_front() {
                self.forgotten_set.remove(&(ptr, start));
                self.forgotten_evicted_ns = self.forgotten_evicted_ns.max(at);
            }
        }
        self.baseline_before_ns = self
            .baseline_before_ns
            .max(read_start_ns.saturating_sub(BASELINE_MARGIN_NS));
    }

    /// Closes the interval at monotonic time `now_ns`: each thread's time
    /// since the last call, per cgroup it ran in, and its exit if it
    /// happened now. Threads freed, or exited longer than
    /// [`FREE_GRACE_NS`] ago without a free, are forgotten.
    pub(crate) fn finish(&mut self, now_ns: u64, final_read: bool) -> Vec<TaskTime> {
        let packages = self.packages;
        let mut out = Vec::new();
        let mut candidates = std::mem::take(&mut self.touched);
        if final_read {
            // Every exited thread is settled now.
            candidates.extend(self.threads.keys().copied());
        } else {
            candidates.extend(self.awaiting.iter().copied());
        }
        candidates.sort_unstable();
        candidates.dedup();
        for ptr in candidates {
            let Some(list) = self.threads.get_mut(&ptr) else {
                self.awaiting.remove(&ptr);
                continue;
            };
            list.retain_mut(|t| {
                let mut exit_ns = t.life.exit_ns().filter(|_| !t.life.reported());
                for (cgroup_id, ns) in t.pending.drain(..) {
                    out.push(TaskTime {
                        tid: t.tid,
                        tgid: t.tgid,
                        cgroup_id,
                        comm: t.comm,
                        on_cpu_ns: PackageNs::from_slice(&ns[..packages]),
                        exit_ns: exit_ns.take(),
                    });
                }
                if let Some(exit) = exit_ns {
                    out.push(TaskTime {
                        tid: t.tid,
                        tgid: t.tgid,
                        cgroup_id: t.cgroup_id,
                        comm: t.comm,
                        on_cpu_ns: PackageNs::zeros(packages),
                        exit_ns: Some(exit),
                    });
                }
                t.life.mark_reported();
                if let Life::Exited { at_ns, reported } = t.life
                    && (final_read || now_ns.saturating_sub(at_ns) >= FREE_GRACE_NS)
                {
                    // Kept: a late free counts the rest; two full reads
                    // without it forget it.
                    t.life = Life::Settled { at_ns, reported };
                    self.settled_from_exit += 1;
                }
                match t.life {
                    Life::Freed { .. } => false,
                    Life::Settled { .. } => !final_read,
                    Life::Alive | Life::Exited { .. } => true,
                }
            });
            if list.iter().any(|t| matches!(t.life, Life::Exited { .. })) {
                self.awaiting.insert(ptr);
            } else {
                self.awaiting.remove(&ptr);
            }
            if list.is_empty() {
                self.threads.remove(&ptr);
            }
        }
        out
    }

    /// Each CPU's share of the time handed out since the last call (a
    /// thread's delta goes to the CPU it was read on, or a migration's
    /// source CPU), and resets it.
    pub(crate) fn take_cpu_busy(&mut self) -> Vec<u64> {
        let n = self.cpu_busy_ns.len();
        std::mem::replace(&mut self.cpu_busy_ns, vec![0; n])
    }
}

/// Where `r`'s thread is in `list` (its task's threads, by start time),
/// added if it is not there yet with `counted_ns` already counted.
fn slot(list: &mut Vec<Thread>, r: &Reading<'_>, counted_ns: u64, now_ns: u64) -> usize {
    if let Some(i) = list.iter().position(|t| t.start_ns == r.start_ns) {
        return i;
    }
    // The exec'ing thread of a non-leader exec takes the leader's
    // (earlier) start time: the same task.
    if let Some(i) = list
        .iter()
        .position(|t| t.start_ns > r.start_ns && t.life == Life::Alive)
    {
        list[i].start_ns = r.start_ns;
        return i;
    }
    list.push(Thread {
        start_ns: r.start_ns,
        tid: r.tid,
        tgid: r.tgid,
        cgroup_id: r.cgroup_id.unwrap_or(0),
        comm: [0; COMM_LEN],
        counted_ns,
        pending: Vec::new(),
        checkpoints: Vec::new(),
        life: Life::Alive,
        missing_full_reads: 0,
        last_seen_ns: now_ns,
    });
    list.len() - 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const PTR: u64 = 0xffff_8880_0000_1000;

    fn reading(start: u64, sum: u64, cpu: u32, cgroup: u64) -> Reading<'static> {
        Reading {
            task_ptr: PTR,
            start_ns: start,
            tid: 42,
            tgid: 42,
            cgroup_id: Some(cgroup),
            comm: Some(b"worker\0\0\0\0\0\0\0\0\0\0"),
            sum_exec_ns: sum,
            cpu,
        }
    }

    fn ledger() -> RuntimeLedger {
        // CPUs 0, 1 on package 0; 2, 3 on package 1; tracking from t=1000.
        RuntimeLedger::new(vec![0, 0, 1, 1], 1000)
    }

    #[test]
    fn thread_older_than_tracking_counts_from_its_first_reading() {
        let mut l = ledger();
        l.observe(reading(10, 5_000, 0, 7), Kind::Read, 1100);
        assert!(l.finish(1100, false).is_empty(), "baseline only");
        l.observe(reading(10, 5_600, 1, 7), Kind::Read, 2000);
        let out = l.finish(2000, false);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].on_cpu_ns, vec![600, 0]);
        assert_eq!(crate::tracker::comm_to_string(&out[0].comm), "worker");
        assert_eq!(l.take_cpu_busy(), vec![0, 600, 0, 0]);
    }

    #[test]
    fn thread_born_after_start_counts_from_zero_and_a_reread_is_not_recounted() {
        let mut l = ledger();
        l.observe(reading(1500, 300, 2, 7), Kind::Read, 2000);
        l.observe(reading(1500, 300, 2, 7), Kind::Read, 2001);
        let out = l.finish(2001, false);
        assert_eq!(out[0].on_cpu_ns, vec![0, 300]);
    }

    #[test]
    fn migration_checkpoints_split_time_between_packages() {
        let mut l = ledger();
        l.observe(reading(1500, 100, 0, 7), Kind::Read, 2000);
        l.finish(2000, false);
        // Moved from CPU 0 (package 0) to package 1 at 250, then back at
        // 400 from CPU 3; read at 500 on CPU 1.
        l.observe(reading(1500, 250, 0, 7), Kind::Migrate, 2100);
        l.observe(reading(1500, 400, 3, 7), Kind::Migrate, 2200);
        // A checkpoint beyond the read waits for a later read.
        l.observe(reading(1500, 700, 1, 7), Kind::Migrate, 2300);
        l.observe(reading(1500, 500, 1, 7), Kind::Read, 2300);
        let out = l.finish(2300, false);
        assert_eq!(out[0].on_cpu_ns, vec![150 + 100, 150]);
        l.observe(reading(1500, 900, 2, 7), Kind::Read, 3000);
        let out = l.finish(3000, false);
        assert_eq!(out[0].on_cpu_ns, vec![200, 200]);
    }

    #[test]
    fn cgroup_move_splits_the_delta_at_the_move() {
        let mut l = ledger();
        l.observe(reading(1500, 100, 0, 7), Kind::Read, 2000);
        l.finish(2000, false);
        l.observe(reading(1500, 160, 0, 9), Kind::CgroupMove, 2100);
        l.observe(reading(1500, 200, 0, 9), Kind::Read, 2200);
        let mut out = l.finish(2200, false);
        out.sort_by_key(|t| t.cgroup_id);
        assert_eq!((out[0].cgroup_id, out[0].total_ns()), (7, 60));
        assert_eq!((out[1].cgroup_id, out[1].total_ns()), (9, 40));
        assert_eq!(out.iter().filter(|t| t.exit_ns.is_some()).count(), 0);
    }

    #[test]
    fn exit_then_free_counts_the_final_slice_once() {
        let mut l = ledger();
        l.observe(reading(1500, 100, 0, 7), Kind::Read, 2000);
        l.finish(2000, false);
        l.observe(reading(1500, 180, 0, 7), Kind::Exit { ts_ns: 2500 }, 2500);
        let out = l.finish(2600, false);
        assert_eq!((out[0].total_ns(), out[0].exit_ns), (80, Some(2500)));
        assert_eq!(l.awaiting_free_since(2500, 3000), 1);
        assert_eq!(l.awaiting_free_since(2501, 3000), 0);
        // A racing read and the free with the exact final figure.
        l.observe(reading(1500, 180, 0, 7), Kind::Read, 2700);
        l.observe(reading(1500, 195, 0, 7), Kind::Free { ts_ns: 2800 }, 2800);
        let out = l.finish(2800, false);
        assert_eq!((out[0].total_ns(), out[0].exit_ns), (15, None));
        assert!(l.is_empty());
        assert_eq!(l.settled_from_exit(), 0);
    }

    #[test]
    fn a_missed_free_settles_from_the_exit_reading_once() {
        let mut l = ledger();
        l.observe(reading(1500, 180, 0, 7), Kind::Exit { ts_ns: 2500 }, 2500);
        let out = l.finish(2500, false);
        assert_eq!((out[0].total_ns(), out[0].exit_ns), (180, Some(2500)));
        assert!(l.finish(2500 + FREE_GRACE_NS - 1, false).is_empty());
        assert_eq!(l.settled_from_exit(), 0);
        assert!(l.finish(2500 + FREE_GRACE_NS, false).is_empty());
        assert_eq!(l.settled_from_exit(), 1);
        assert_eq!(
            l.awaiting_free_since(0, u64::MAX),
            0,
            "settled: nothing to wait for"
        );
        // A zombie reaped late: the iterator still shows it, then its free
        // comes; only the rest counts, and its exit is not reported again.
        let late = 2600 + FREE_GRACE_NS;
        l.observe(reading(1500, 185, 0, 7), Kind::Read, late);
        l.observe(reading(1500, 190, 0, 7), Kind::Free { ts_ns: late }, late);
        let out = l.finish(late, false);
        assert_eq!((out[0].total_ns(), out[0].exit_ns), (10, None));
        assert_eq!(l.settled_from_exit(), 1);
        assert!(l.is_empty());
        assert!(
            l.take_forgotten().is_empty(),
            "its free removed the filter entry"
        );
    }

    #[test]
    fn a_settled_thread_two_full_reads_do_not_show_is_forgotten() {
        let mut l = ledger();
        l.observe(reading(1500, 180, 0, 7), Kind::Exit { ts_ns: 2500 }, 2500);
        l.finish(2500, false);
        l.finish(2500 + FREE_GRACE_NS, false);
        let t = 3000 + FREE_GRACE_NS;
        l.full_read_done(t);
        assert_eq!(l.len(), 1, "one miss is not enough");
        l.full_read_done(t + 1);
        assert!(l.finish(t + 2, false).is_empty(), "no second exit");
        assert!(l.is_empty());
        assert_eq!(l.take_forgotten(), vec![PTR]);
        assert_eq!((l.settled_from_exit(), l.vanished()), (1, 0));
        // Its free, much later: a thread older than the full reads counts
        // nothing.
        let later = t + 2 * BASELINE_MARGIN_NS;
        l.full_read_done(later);
        l.observe(reading(1500, 190, 0, 7), Kind::Free { ts_ns: later }, later);
        assert!(l.finish(later, false).is_empty(), "no second exit");
    }

    #[test]
    fn exec_from_a_thread_keeps_its_count_under_the_leaders_start() {
        let mut l = ledger();
        // The thread (start 1600) had 500 ns; after its exec it reports
        // the leader's start time (1500) and more time.
        l.observe(reading(1600, 500, 0, 7), Kind::Read, 2000);
        l.finish(2000, false);
        l.observe(reading(1500, 520, 0, 7), Kind::Read, 2100);
        assert_eq!(l.finish(2100, false)[0].total_ns(), 20);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn a_thread_no_read_saw_counts_whole_from_a_free_that_comes_after_a_full_read() {
        // Born at 1500 (while tracking), reaped before the full read at
        // 1500 + 2 s (so that read could not show it), its exit lost; its
        // free comes after that read, as an RCU grace period on a loaded
        // machine allows.
        let mut l = ledger();
        let read = 1500 + 2 * BASELINE_MARGIN_NS;
        l.full_read_done(read);
        l.observe(
            reading(1500, 700, 0, 7),
            Kind::Free { ts_ns: read + 5 },
            read + 5,
        );
        let out = l.finish(read + 5, false);
        assert_eq!(out.iter().map(TaskTime::total_ns).sum::<u64>(), 700);
        assert_eq!(out.iter().filter(|t| t.exit_ns.is_some()).count(), 1);
        assert_eq!(
            crate::tracker::comm_to_string(&out[0].comm),
            "worker",
            "named from its free"
        );
        // Born before tracking and never seen: none of it is the profile's.
        let mut l = ledger();
        l.full_read_done(read);
        l.observe(
            reading(900, 700, 0, 7),
            Kind::Free { ts_ns: read + 5 },
            read + 5,
        );
        assert!(l.finish(read + 5, false).is_empty());
    }

    #[test]
    fn a_reused_address_is_a_new_thread() {
        let mut l = ledger();
        l.observe(reading(1500, 500, 0, 7), Kind::Read, 2000);
        l.finish(2000, false);
        // The old task's free is still in the ring when its address is
        // reused by a task born later.
        l.observe(reading(3000, 30, 0, 7), Kind::Read, 3100);
        l.observe(reading(1500, 510, 0, 7), Kind::Free { ts_ns: 2900 }, 3100);
        let mut out = l.finish(3100, false);
        out.sort_by_key(|t| t.total_ns());
        assert_eq!(out[0].total_ns(), 10);
        assert_eq!(out[1].total_ns(), 30);
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn threads_missing_from_two_full_reads_are_gone() {
        let mut l = ledger();
        l.observe(reading(1500, 500, 0, 7), Kind::Read, 2000);
        l.finish(2000, false);
        l.full_read_done(1900);
        assert_eq!(l.vanished(), 0, "read after the full read began");
        l.full_read_done(2500);
        assert_eq!(l.vanished(), 0, "one miss");
        l.full_read_done(2600);
        assert_eq!(l.vanished(), 1);
        assert_eq!(l.finish(2700, false)[0].exit_ns, Some(2000));
        assert!(l.is_empty());
    }
}
