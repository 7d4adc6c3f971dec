//! Threads created recently whose end has not been seen.
//!
//! At the end of `run`, wattprof waits briefly for the final run time of
//! the command's last threads. A thread whose exit event was lost and that
//! no read ever showed (it lived between two reads) is known only from its
//! fork event until its free arrives, an RCU grace period after it was
//! reaped, and the frees of different threads come in no fixed order. The
//! settle wait asks this list which of them it must still wait for.

use std::collections::VecDeque;

use crate::hash::IntMap;

/// How long a fork is remembered: the settle wait looks one second back.
pub(crate) const KEEP_NS: u64 = 2_000_000_000;

/// At most this many forks are remembered (a storm beyond it keeps the
/// newest); 16 bytes each in the queue, about twice that in the map.
pub(crate) const MAX_FORKS: usize = 1 << 17;

/// Forks of the last [`KEEP_NS`] whose free has not come.
#[derive(Debug, Default)]
pub(crate) struct RecentForks {
    /// Fork time per child tid, until its free.
    open: IntMap<u32, u64>,
    /// (fork time, tid) in arrival order, for forgetting old ones.
    order: VecDeque<(u64, u32)>,
}

impl RecentForks {
    /// A thread `tid` was created at `ts_ns` (monotonic).
    pub(crate) fn forked(&mut self, tid: u32, ts_ns: u64) {
        self.open.insert(tid, ts_ns);
        self.order.push_back((ts_ns, tid));
        while self.order.len() > MAX_FORKS
            || self
                .order
                .front()
                .is_some_and(|(ts, _)| ts.saturating_add(KEEP_NS) < ts_ns)
        {
            let Some((ts, old)) = self.order.pop_front() else {
                break;
            };
            // Only if the entry is that fork's (the tid may have been
            // reused by a later one).
            if self.open.get(&old) == Some(&ts) {
                self.open.remove(&old);
            }
        }
    }

    /// Thread `tid` was freed (its final run time came; with the switch
    /// tracker, its exit).
    pub(crate) fn ended(&mut self, tid: u32) {
        self.open.remove(&tid);
    }

    /// Threads created at or after `since_ns` whose end has not come and that
    /// `gone(tid)` says no longer exist: their end is on its way.
    pub(crate) fn gone_unended_since(&self, since_ns: u64, gone: impl Fn(u32) -> bool) -> Vec<u32> {
        let mut v: Vec<u32> = self
            .open
            .iter()
            .filter(|(tid, ts)| **ts >= since_ns && gone(**tid))
            .map(|(tid, _)| *tid)
            .collect();
        v.sort_unstable();
        v
    }

    /// How many of `tids` have still not ended.
    pub(crate) fn still_open(&self, tids: &[u32]) -> usize {
        tids.iter().filter(|t| self.open.contains_key(t)).count()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gone_thread_is_waited_for_until_its_end_comes() {
        let mut f = RecentForks::default();
        f.forked(10, 1_000);
        f.forked(11, 2_000);
        f.forked(12, 3_000);
        f.ended(11);
        // 12 still exists; 10 is gone but forked before `since`.
        let wait = f.gone_unended_since(1_500, |tid| tid != 12);
        assert!(wait.is_empty(), "{wait:?}");
        let wait = f.gone_unended_since(500, |tid| tid != 12);
        assert_eq!(wait, vec![10]);
        assert_eq!(f.still_open(&wait), 1);
        f.ended(10);
        assert_eq!(f.still_open(&wait), 0);
    }

    #[test]
    fn old_forks_are_forgotten_and_a_reused_tid_keeps_its_newest_fork() {
        let mut f = RecentForks::default();
        f.forked(7, 0);
        f.forked(7, KEEP_NS);
        // The first fork of 7 ages out; the second stays.
        f.forked(8, KEEP_NS + 1);
        assert_eq!(f.gone_unended_since(0, |_| true), vec![7, 8]);
        f.forked(9, 3 * KEEP_NS + 2);
        assert_eq!(f.gone_unended_since(0, |_| true), vec![9]);
        assert_eq!(f.order.len(), 1);
    }

    #[test]
    fn a_storm_keeps_the_newest_forks() {
        let mut f = RecentForks::default();
        for tid in 0..(MAX_FORKS as u32 + 10) {
            f.forked(tid, 1);
        }
        assert_eq!(f.order.len(), MAX_FORKS);
        assert_eq!(f.open.len(), MAX_FORKS);
        assert_eq!(f.still_open(&[0, 9, 10]), 1);
    }
}
