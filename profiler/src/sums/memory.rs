//! Each reported process's memory: read from `smaps_rollup` at a rationed
//! pace, and its peaks over the profile.

use crate::attribution::ConsumerId;
use crate::hash::IntMap;
use crate::model::MemoryReport;
use crate::process::ProcFs;

/// Shortest time between two memory reads of one process in `run` (the
/// tree's peaks).
const MEMORY_EVERY_NS: u64 = 1_000_000_000;

/// Shortest time between two memory reads of one process in `monitor`:
/// `smaps_rollup` walks the process's page tables, and at one read a
/// second per top row those walks were two thirds of a quiet host's
/// monitor CPU (`perf`, 2026-11-28: `smaps_account`, `smaps_pte_range`,
/// `show_smaps_rollup`). A top row's memory moves slowly; its row shows
/// the last reading in between.
const MEMORY_EVERY_NS_RATIONED: u64 = 10_000_000_000;

/// Most memory reads a second, all processes together: with a changing
/// top 10 at 100 ms, a read per process per second was still 100
/// `smaps_rollup` walks a second (18% of the monitor's CPU with 1,000
/// busy processes). A row whose process could not be read in time shows
/// its last reading, or none.
const MEMORY_READS_PER_S: u64 = 20;

/// A process whose row an interval reports.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Row {
    /// Who.
    pub(crate) id: ConsumerId,
    /// Its pid.
    pub(crate) pid: u32,
    /// It has exited (its memory is gone).
    pub(crate) exited: bool,
    /// Its GPU memory this interval (bytes).
    pub(crate) gpu_bytes: u64,
}

/// Memory read so far, and the peaks.
#[derive(Debug, Default)]
pub(crate) struct Memory {
    peaks: IntMap<ConsumerId, MemoryReport>,
    /// When each process was last read, and what that read.
    read: IntMap<ConsumerId, (u64, Option<crate::process::Memory>)>,
    /// Reads left in the current second, and when it began.
    budget: (u64, u64),
}

impl Memory {
    /// The memory of each row's process at `at_ns`, in order (`None`:
    /// exited, or never read). A process is read at most once a second
    /// (`smaps_rollup` walks its page tables), showing its last reading
    /// in between; with `rationed` (`monitor`, whose top rows change from
    /// interval to interval) at most every 10 s
    /// ([`MEMORY_EVERY_NS_RATIONED`]), and at most [`MEMORY_READS_PER_S`]
    /// reads in all, those read longest ago (or never) first. The peaks take each
    /// reading and the GPU memory.
    pub(crate) fn read(
        &mut self,
        rows: &[Row],
        procfs: &ProcFs,
        rationed: bool,
        at_ns: u64,
    ) -> Vec<Option<crate::process::Memory>> {
        let every = if rationed {
            MEMORY_EVERY_NS_RATIONED
        } else {
            MEMORY_EVERY_NS
        };
        let due = |read: &IntMap<ConsumerId, (u64, Option<crate::process::Memory>)>,
                   id: ConsumerId| {
            read.get(&id)
                .is_none_or(|(t, _)| at_ns.saturating_sub(*t) >= every)
        };
        let mut may_read: Vec<ConsumerId> = Vec::new();
        if rationed {
            if at_ns.saturating_sub(self.budget.1) >= 1_000_000_000 {
                self.budget = (MEMORY_READS_PER_S, at_ns);
            }
            let mut stale: Vec<(u64, ConsumerId)> = rows
                .iter()
                .filter(|r| !r.exited && due(&self.read, r.id))
                .map(|r| (self.read.get(&r.id).map_or(0, |(t, _)| *t), r.id))
                .collect();
            stale.sort_unstable();
            let n = stale.len().min(self.budget.0 as usize);
            self.budget.0 -= n as u64;
            may_read.extend(stale[..n].iter().map(|(_, id)| *id));
        }
        rows.iter()
            .map(|r| {
                let last = self.read.get(&r.id).and_then(|(_, m)| *m);
                let mem = if r.exited {
                    None
                } else if !due(&self.read, r.id) || (rationed && !may_read.contains(&r.id)) {
                    last
                } else {
                    let m = procfs.memory(r.pid);
                    self.read.insert(r.id, (at_ns, m));
                    m
                };
                let peak = self.peaks.entry(r.id).or_default();
                if let Some(m) = mem {
                    peak.peak_pss_bytes = peak.peak_pss_bytes.max(m.pss_bytes);
                    peak.peak_uss_bytes = peak.peak_uss_bytes.max(m.uss_bytes);
                }
                peak.peak_gpu_bytes = peak.peak_gpu_bytes.max(r.gpu_bytes);
                mem
            })
            .collect()
    }

    /// A process's peaks so far.
    pub(crate) fn peak(&self, id: ConsumerId) -> MemoryReport {
        self.peaks.get(&id).copied().unwrap_or_default()
    }

    /// Forgets processes `keep` rejects.
    pub(crate) fn forget(&mut self, keep: impl Fn(ConsumerId) -> bool) {
        self.peaks.retain(|id, _| keep(*id));
        self.read.retain(|id, _| keep(*id));
    }
}
