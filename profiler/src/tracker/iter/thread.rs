//! One thread as the iterator tracker's ledger keeps it: where it is in
//! its life (alive, exited, settled from its exit, freed), the checkpoints
//! that split its run time where it moved between packages or cgroups, and
//! how its growth is handed out per package and cgroup. The ledger over
//! all threads, which decides when each reading applies, is
//! [`super::runtime`].

use profiler_common::{COMM_LEN, MAX_SOCKETS};

/// A point in a thread's run time where its time changes hands: what ran
/// before it goes to the package or cgroup it names.
#[derive(Clone, Copy, Debug)]
pub(super) enum Checkpoint {
    /// Time up to here ran on this CPU (the source of a migration).
    Package { cpu: u32 },
    /// Time up to here belongs to the old cgroup; after it, to this one.
    Cgroup { to: u64, cpu: u32 },
}

/// One thread: its identity, what has been handed out of its run time,
/// and where it is in its life.
#[derive(Debug)]
pub(super) struct Thread {
    pub(super) start_ns: u64,
    pub(super) tid: u32,
    pub(super) tgid: u32,
    pub(super) cgroup_id: u64,
    pub(super) comm: [u8; COMM_LEN],
    /// Run time up to which deltas were handed out.
    pub(super) counted_ns: u64,
    /// This interval's time per (cgroup, package).
    pub(super) pending: Vec<(u64, [u64; MAX_SOCKETS])>,
    /// Checkpoints beyond `counted_ns`, in run-time order.
    pub(super) checkpoints: Vec<(u64, Checkpoint)>,
    /// Where it is between its first reading and its last.
    pub(super) life: Life,
    /// Full reads in a row that did not show it.
    pub(super) missing_full_reads: u8,
    /// Monotonic time of the last reading: threads a full read no longer
    /// shows, read before it, are gone.
    pub(super) last_seen_ns: u64,
}

/// A thread's life as the ledger knows it. Each ended state keeps when
/// it ended (`at_ns`, monotonic) and whether that end has been handed out
/// (`reported`, by `RuntimeLedger::finish`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Life {
    /// No exit seen.
    Alive,
    /// Exited; its final run time (the free) is on its way.
    Exited { at_ns: u64, reported: bool },
    /// Exited, and counted as settled from the exit's reading: no free
    /// came in `FREE_GRACE_NS`, or the profile ended. Kept: a late free
    /// still counts the rest, two full reads without it forget it.
    Settled { at_ns: u64, reported: bool },
    /// Freed (its final run time is counted), or gone from two full reads
    /// in a row: nothing more will come, and `finish` forgets it.
    Freed { at_ns: u64, reported: bool },
}

impl Life {
    /// When it exited, if it did.
    pub(super) fn exit_ns(self) -> Option<u64> {
        match self {
            Life::Alive => None,
            Life::Exited { at_ns, .. }
            | Life::Settled { at_ns, .. }
            | Life::Freed { at_ns, .. } => Some(at_ns),
        }
    }

    pub(super) fn reported(self) -> bool {
        match self {
            Life::Alive => false,
            Life::Exited { reported, .. }
            | Life::Settled { reported, .. }
            | Life::Freed { reported, .. } => reported,
        }
    }

    pub(super) fn is_freed(self) -> bool {
        matches!(self, Life::Freed { .. })
    }

    /// Its exit record at `ts_ns` (a second one changes nothing).
    pub(super) fn exit(&mut self, ts_ns: u64) {
        if *self == Life::Alive {
            *self = Life::Exited {
                at_ns: ts_ns,
                reported: false,
            };
        }
    }

    /// Its free record at `ts_ns`: it exited then if no exit was seen.
    pub(super) fn free(&mut self, ts_ns: u64) {
        let at_ns = self.exit_ns().unwrap_or(ts_ns);
        *self = Life::Freed {
            at_ns,
            reported: self.reported(),
        };
    }

    /// Its end has been handed out.
    pub(super) fn mark_reported(&mut self) {
        match self {
            Life::Alive => {}
            Life::Exited { reported, .. }
            | Life::Settled { reported, .. }
            | Life::Freed { reported, .. } => *reported = true,
        }
    }
}

/// Notes a checkpoint at run time `sum_ns` (nothing to split where that
/// time is already counted: a cgroup move then just changes the cgroup).
pub(super) fn add_checkpoint(t: &mut Thread, sum_ns: u64, cp: Checkpoint) {
    if sum_ns <= t.counted_ns {
        // Already counted past it (read after the move): nothing to split.
        if let Checkpoint::Cgroup { to, .. } = cp {
            t.cgroup_id = to;
        }
        return;
    }
    let at = t.checkpoints.partition_point(|(s, _)| *s <= sum_ns);
    t.checkpoints.insert(at, (sum_ns, cp));
}

/// Hands out the thread's growth up to `sum_ns`: checkpoints first, in
/// order, each segment to its CPU's package and the cgroup of the time;
/// the rest to `cpu` and the reading's cgroup.
pub(super) fn advance(
    t: &mut Thread,
    sum_ns: u64,
    cpu: u32,
    cgroup_id: Option<u64>,
    package_of_cpu: &[u32],
    cpu_busy_ns: &mut [u64],
) {
    let mut charge = |t: &mut Thread, upto: u64, cpu: u32| {
        if upto <= t.counted_ns {
            return;
        }
        let ns = upto - t.counted_ns;
        t.counted_ns = upto;
        let package = package_of_cpu.get(cpu as usize).copied().unwrap_or(0) as usize;
        if let Some(busy) = cpu_busy_ns.get_mut(cpu as usize) {
            *busy += ns;
        }
        let cgroup = t.cgroup_id;
        let slot = match t.pending.iter().position(|(c, _)| *c == cgroup) {
            Some(i) => i,
            None => {
                t.pending.push((cgroup, [0; MAX_SOCKETS]));
                t.pending.len() - 1
            }
        };
        t.pending[slot].1[package.min(MAX_SOCKETS - 1)] += ns;
    };
    let due = t.checkpoints.partition_point(|(at, _)| *at <= sum_ns);
    let due: Vec<(u64, Checkpoint)> = t.checkpoints.drain(..due).collect();
    for (at, cp) in due {
        match cp {
            Checkpoint::Package { cpu } => charge(t, at, cpu),
            Checkpoint::Cgroup { to, cpu } => {
                charge(t, at, cpu);
                t.cgroup_id = to;
            }
        }
    }
    if let Some(cg) = cgroup_id {
        t.cgroup_id = cg;
    }
    charge(t, sum_ns, cpu);
}
