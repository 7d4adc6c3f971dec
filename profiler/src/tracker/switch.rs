//! Turning the kernel's cumulative per-thread counters into interval deltas.
//!
//! A thread is identified by `(tid, created_ns)`, so a reused tid starts a
//! new ledger line instead of inheriting the old one's totals. Its totals
//! come from map reads and from exit/reaped records; both are cumulative, so
//! seeing the same time twice (a read racing an exit) never counts it twice.

use crate::hash::IntMap;
use std::collections::HashMap;

use profiler_common::{COMM_LEN, MAX_SOCKETS};

use super::{PackageNs, TaskTime};

/// Where an observation came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Seen {
    /// A read of the `TASKS` map; `dead` is the entry's dead flag.
    Map {
        /// The entry is flagged dead (exit seen, entry not yet freed).
        dead: bool,
    },
    /// An exit or reaped record, at this monotonic time.
    Exit {
        /// When.
        ts_ns: u64,
    },
}

/// One cumulative reading of a thread.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Observation<'a> {
    /// Thread id.
    pub(crate) tid: u32,
    /// Entry creation time (the thread's generation).
    pub(crate) created_ns: u64,
    /// Process id.
    pub(crate) tgid: u32,
    /// cgroup v2 id.
    pub(crate) cgroup_id: u64,
    /// Name.
    pub(crate) comm: &'a [u8],
    /// Cumulative on-CPU ns per package.
    pub(crate) on_cpu_ns: &'a [u64; MAX_SOCKETS],
}

#[derive(Debug)]
struct Thread {
    tgid: u32,
    cgroup_id: u64,
    comm: [u8; COMM_LEN],
    counted: [u64; MAX_SOCKETS],
    pending: [u64; MAX_SOCKETS],
    exit_ns: Option<u64>,
    exit_reported: bool,
    dead_reads: u32,
    in_map: bool,
    missing_rounds: u32,
    /// Userspace freed its kernel entry: nothing more will come.
    freed: bool,
    /// `finish` calls since its exit was known.
    exit_rounds: u8,
}

/// Cumulative-to-delta bookkeeping for every thread the tracker has seen.
#[derive(Debug)]
pub(crate) struct ThreadLedger {
    packages: usize,
    threads: IntMap<(u32, u64), Thread>,
}

impl ThreadLedger {
    /// A ledger splitting time over `packages` packages.
    pub(crate) fn new(packages: usize) -> Self {
        Self {
            packages: packages.clamp(1, MAX_SOCKETS),
            threads: HashMap::default(),
        }
    }

    /// Number of threads tracked.
    pub(crate) fn len(&self) -> usize {
        self.threads.len()
    }
    /// Whether no thread is tracked.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.threads.is_empty()
    }

    /// Threads of `tgid` that have not reported an exit.
    pub(crate) fn live_threads_of(&self, tgid: u32) -> usize {
        self.threads
            .values()
            .filter(|t| t.tgid == tgid && t.exit_ns.is_none())
            .count()
    }

    /// Records a cumulative reading. Returns true when the kernel entry
    /// should now be freed by userspace (flagged dead on two reads, so its
    /// final slice has landed).
    pub(crate) fn observe(&mut self, obs: Observation<'_>, seen: Seen) -> bool {
        let thread = self
            .threads
            .entry((obs.tid, obs.created_ns))
            .or_insert_with(|| Thread {
                tgid: obs.tgid,
                cgroup_id: obs.cgroup_id,
                comm: [0; COMM_LEN],
                counted: [0; MAX_SOCKETS],
                pending: [0; MAX_SOCKETS],
                exit_ns: None,
                exit_reported: false,
                dead_reads: 0,
                in_map: false,
                missing_rounds: 0,
                freed: false,
                exit_rounds: 0,
            });
        thread.tgid = obs.tgid;
        thread.cgroup_id = obs.cgroup_id;
        // Names stay raw bytes until reported: this runs for every live
        // thread on every read.
        if obs.comm.first().is_some_and(|b| *b != 0) {
            let n = obs.comm.len().min(COMM_LEN);
            thread.comm = [0; COMM_LEN];
            thread.comm[..n].copy_from_slice(&obs.comm[..n]);
        }
        for s in 0..MAX_SOCKETS {
            let grown = obs.on_cpu_ns[s].saturating_sub(thread.counted[s]);
            thread.pending[s] += grown;
            thread.counted[s] += grown;
        }
        match seen {
            Seen::Map { dead } => {
                thread.in_map = true;
                if dead {
                    thread.dead_reads += 1;
                }
                thread.dead_reads >= 2
            }
            Seen::Exit { ts_ns } => {
                thread.exit_ns.get_or_insert(ts_ns);
                false
            }
        }
    }

    /// Marks that the kernel entry of a thread was freed by userspace at
    /// monotonic time `at_ns` (its exit time, if no exit record came).
    pub(crate) fn freed(&mut self, tid: u32, created_ns: u64, at_ns: u64) {
        if let Some(t) = self.threads.get_mut(&(tid, created_ns)) {
            t.in_map = false;
            t.freed = true;
            t.exit_ns.get_or_insert(at_ns);
        }
    }

    /// Whether thread `tid` has reported its exit (any generation).
    pub(crate) fn has_exited(&self, tid: u32) -> bool {
        self.threads
            .iter()
            .any(|((t, _), th)| *t == tid && th.exit_ns.is_some())
    }

    /// Exited or dead-flagged threads whose kernel entry was still there at
    /// the last read (userspace frees those a read later): a partial read
    /// must look these up too, as they announce nothing.
    pub(crate) fn awaiting_free(&self) -> impl Iterator<Item = u32> + '_ {
        self.threads
            .iter()
            .filter(|(_, t)| t.exit_ns.is_some() || t.dead_reads > 0)
            .map(|((tid, _), _)| *tid)
    }

    /// Closes the interval: the time each thread gained since the last
    /// call, and its exit if it happened now. Forgets threads that are gone
    /// for good: exited and freed by userspace, exited and absent from a
    /// read made after the exit was known, or missing from two full reads
    /// (entry recycled in the kernel, already reported). After a partial
    /// read (`full_scan == false`, only announced threads looked up) a
    /// thread not looked up is simply idle.
    ///
    /// An exit drained after this interval's read (the sample's second
    /// drain) says nothing about the map: on the exit-tracepoint path
    /// (kernels before 5.18) the entry stays, flagged dead, until
    /// userspace frees it, so its line is kept one more interval, when
    /// `awaiting_free` has the read look it up. Forgotten at once, the
    /// entry read again would start a new line from zero and count the
    /// time before the exit twice.
    pub(crate) fn finish(&mut self, full_scan: bool) -> Vec<TaskTime> {
        let packages = self.packages;
        let mut out = Vec::new();
        self.threads.retain(|&(tid, _), t| {
            let gained = t.pending.iter().any(|p| *p > 0);
            let newly_exited = t.exit_ns.is_some() && !t.exit_reported;
            if gained || newly_exited {
                out.push(TaskTime {
                    tid,
                    tgid: t.tgid,
                    cgroup_id: t.cgroup_id,
                    comm: t.comm,
                    on_cpu_ns: PackageNs::from_slice(&t.pending[..packages]),
                    exit_ns: if newly_exited { t.exit_ns } else { None },
                });
                // Time on packages beyond `packages` cannot happen: the
                // kernel only indexes packages userspace gave it.
                t.pending = [0; MAX_SOCKETS];
                t.exit_reported |= newly_exited;
            }
            if t.in_map {
                t.missing_rounds = 0;
            } else if full_scan {
                t.missing_rounds += 1;
            }
            let keep = if t.exit_ns.is_some() {
                t.exit_rounds = t.exit_rounds.saturating_add(1);
                t.in_map || (!t.freed && t.exit_rounds < 2)
            } else {
                t.missing_rounds < 2
            };
            t.in_map = false;
            keep
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obs(tid: u32, created: u64, ns: u64) -> ([u64; MAX_SOCKETS], u32, u64) {
        let mut a = [0; MAX_SOCKETS];
        a[0] = ns;
        (a, tid, created)
    }

    fn see(
        l: &mut ThreadLedger,
        tid: u32,
        created: u64,
        ns: [u64; MAX_SOCKETS],
        seen: Seen,
    ) -> bool {
        l.observe(
            Observation {
                tid,
                created_ns: created,
                tgid: tid,
                cgroup_id: 1,
                comm: b"x\0",
                on_cpu_ns: &ns,
            },
            seen,
        )
    }

    #[test]
    fn deltas_from_cumulative_readings() {
        let mut l = ThreadLedger::new(2);
        let (a, tid, c) = obs(10, 5, 100);
        see(&mut l, tid, c, a, Seen::Map { dead: false });
        let out = l.finish(true);
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].on_cpu_ns, vec![100, 0]);
        let (a, ..) = obs(10, 5, 250);
        see(&mut l, tid, c, a, Seen::Map { dead: false });
        assert_eq!(l.finish(true)[0].on_cpu_ns, vec![150, 0]);
        // No change: nothing reported, thread kept.
        see(&mut l, tid, c, a, Seen::Map { dead: false });
        assert!(l.finish(true).is_empty());
        assert_eq!(l.len(), 1);
    }

    #[test]
    fn exit_record_and_racing_read_do_not_double_count() {
        let mut l = ThreadLedger::new(1);
        let (a, tid, c) = obs(7, 1, 40);
        see(&mut l, tid, c, a, Seen::Map { dead: false });
        l.finish(true);
        // The map read already saw 90, then the exit record says 90 too.
        let (b, ..) = obs(7, 1, 90);
        see(&mut l, tid, c, b, Seen::Map { dead: false });
        see(&mut l, tid, c, b, Seen::Exit { ts_ns: 1234 });
        let out = l.finish(true);
        assert_eq!(out[0].on_cpu_ns, vec![50]);
        assert_eq!(out[0].exit_ns, Some(1234));
        // Exited and absent from the next read: forgotten.
        assert!(l.finish(true).is_empty());
        assert!(l.is_empty());
    }

    #[test]
    fn an_exit_drained_after_the_read_keeps_the_line_until_the_entry_is_read_again() {
        // Exit-tracepoint path: the exit record comes in the sample's
        // second drain, after a read that did not look the thread up; the
        // kernel entry stays, flagged dead.
        let mut l = ThreadLedger::new(1);
        let (a, tid, c) = obs(5, 1, 100);
        see(&mut l, tid, c, a, Seen::Exit { ts_ns: 40 });
        let out = l.finish(false);
        assert_eq!(
            (out[0].on_cpu_ns.to_vec(), out[0].exit_ns),
            (vec![100], Some(40))
        );
        assert_eq!(
            l.awaiting_free().collect::<Vec<_>>(),
            vec![5],
            "looked up next"
        );
        // The next read finds the entry with its final slice: only that.
        let (b, ..) = obs(5, 1, 130);
        see(&mut l, tid, c, b, Seen::Map { dead: true });
        let out = l.finish(false);
        assert_eq!(
            (out[0].on_cpu_ns.to_vec(), out[0].exit_ns),
            (vec![30], None)
        );
        assert!(
            see(&mut l, tid, c, b, Seen::Map { dead: true }),
            "free it now"
        );
        l.freed(tid, c, 99);
        assert!(l.finish(false).is_empty());
        assert!(l.is_empty());
    }

    #[test]
    fn an_exit_whose_entry_is_gone_is_forgotten_a_read_later() {
        // Kernels with prev_state: the final switch sends the exit and
        // frees the entry; the next read does not find it.
        let mut l = ThreadLedger::new(1);
        let (a, tid, c) = obs(6, 1, 80);
        see(&mut l, tid, c, a, Seen::Exit { ts_ns: 10 });
        assert_eq!(l.finish(false)[0].on_cpu_ns, vec![80]);
        assert_eq!(l.len(), 1);
        assert!(l.finish(false).is_empty());
        assert!(l.is_empty());
    }

    #[test]
    fn reused_tid_is_a_new_thread() {
        let mut l = ThreadLedger::new(1);
        let (a, tid, _) = obs(9, 1, 500);
        see(&mut l, tid, 1, a, Seen::Exit { ts_ns: 10 });
        let (b, ..) = obs(9, 2, 30);
        see(&mut l, tid, 2, b, Seen::Map { dead: false });
        let mut out = l.finish(true);
        out.sort_by_key(|t| t.total_ns());
        assert_eq!(out[0].on_cpu_ns, vec![30]);
        assert_eq!(out[1].on_cpu_ns, vec![500]);
    }

    #[test]
    fn threads_skipped_by_partial_reads_are_kept_not_recounted() {
        let mut l = ThreadLedger::new(1);
        let (a, tid, c) = obs(4, 1, 70);
        see(&mut l, tid, c, a, Seen::Map { dead: false });
        assert_eq!(l.finish(true)[0].on_cpu_ns, vec![70]);
        for _ in 0..5 {
            assert!(l.finish(false).is_empty());
        }
        assert_eq!(l.len(), 1, "idle thread kept across partial reads");
        let (b, ..) = obs(4, 1, 75);
        see(&mut l, tid, c, b, Seen::Map { dead: false });
        assert_eq!(l.finish(false)[0].on_cpu_ns, vec![5], "only the growth");
        // Two full reads without it: gone.
        l.finish(true);
        l.finish(true);
        assert!(l.is_empty());
    }

    #[test]
    fn legacy_dead_entry_freed_after_second_dead_read_with_its_last_slice() {
        let mut l = ThreadLedger::new(1);
        let (a, tid, c) = obs(3, 1, 100);
        see(&mut l, tid, c, a, Seen::Exit { ts_ns: 50 });
        assert!(!see(&mut l, tid, c, a, Seen::Map { dead: true }));
        assert_eq!(l.finish(true)[0].on_cpu_ns, vec![100]);
        // The final slice landed after the exit record.
        let (b, ..) = obs(3, 1, 120);
        assert!(see(&mut l, tid, c, b, Seen::Map { dead: true }));
        l.freed(tid, c, 99);
        let out = l.finish(true);
        assert_eq!(out[0].on_cpu_ns, vec![20]);
        assert_eq!(out[0].exit_ns, None, "exit reported once");
        assert!(l.is_empty());
    }
}
