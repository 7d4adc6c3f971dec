//! `--stacks`: the stack sampler's samples, named and counted per process
//! per interval, and weighted by each process's energy when the interval
//! closes.

use std::collections::HashMap;

use crate::attribution::EnergyBy;
use crate::attribution::stacks::{StackId, StackLedger};
use crate::model::stacks::StackReport;
use crate::process::symbols::Symbols;
use crate::tracker::stacks::{Drained, StackSampler, UserFrame};

/// Default bound on (process, stack) entries: about 30 MB at the bound
/// with typical stacks (see docs/flamegraphs.md).
pub(crate) const DEFAULT_MAX_ENTRIES: usize = 100_000;

/// The raw stacks seen (tgid where a frame is an address, which only means
/// something in its process), and the stack each was named as.
type RawKey = (u32, Vec<u64>, Vec<UserFrame>);

/// Stack sampling in a profile.
pub(crate) struct StackProfile {
    sampler: StackSampler,
    symbols: Symbols,
    ledger: StackLedger,
    raw: HashMap<RawKey, StackId>,
    /// Samples per process in the interval being sampled, and in the one
    /// after it (samples taken after the interval's end but drained with
    /// it).
    tally: HashMap<u32, HashMap<StackId, u64>>,
    next: HashMap<u32, HashMap<StackId, u64>>,
    /// Thread names seen per process (for processes the table does not
    /// know).
    comms: HashMap<u32, String>,
    /// Counts of the interval before, not yet matched with energy.
    carried: HashMap<u32, HashMap<StackId, u64>>,
    /// Samples of processes not known yet (bounded).
    pending: Vec<crate::tracker::stacks::StackSample>,
    unknown_dropped: u64,
    /// Samples counted for profiled processes.
    profiled: u64,
    drained: Drained,
    /// Stacks were added whose frames are still keys.
    unresolved: bool,
    /// Name the frames once the ledger holds this many stacks (keys of
    /// the same function at other offsets then merge).
    resolve_at: usize,
    max_entries: usize,
}

/// How many raw stacks are remembered before the cache starts again.
const RAW_CACHE: usize = 20_000;

/// Most samples held for processes the table does not know yet.
const PENDING_LIMIT: usize = 100_000;

/// Whether a process's samples are profiled.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wanted {
    /// Yes (the command's tree in `run`, any process in `monitor`).
    Yes,
    /// No (another process in `run`).
    No,
    /// Not known yet (started since the last read).
    NotKnownYet,
}

impl StackProfile {
    /// Around a started sampler, holding at most `max_entries` (process,
    /// stack) entries.
    pub(crate) fn new(sampler: StackSampler, max_entries: usize) -> Self {
        Self {
            sampler,
            symbols: Symbols::default(),
            ledger: StackLedger::new(max_entries),
            raw: HashMap::new(),
            tally: HashMap::new(),
            next: HashMap::new(),
            comms: HashMap::new(),
            carried: HashMap::new(),
            pending: Vec::new(),
            unknown_dropped: 0,
            profiled: 0,
            drained: Drained::default(),
            unresolved: false,
            resolve_at: (max_entries / 2).max(1),
            max_entries,
        }
    }

    /// Names every frame still a key, merging stacks that name the same
    /// functions. Done when the ledger is half full and before anything
    /// is written, never while a `run`'s command is sampled otherwise:
    /// the first naming reads kallsyms and debug info (100 ms of CPU on
    /// this project's VM), which would compete with the program measured.
    pub(crate) fn resolve(&mut self) {
        if !self.unresolved {
            return;
        }
        let symbols = &mut self.symbols;
        let remap = self.ledger.rename(|f| {
            if Symbols::is_key(f) {
                symbols.resolve(f)
            } else {
                vec![f.to_string()]
            }
        });
        for tally in [&mut self.tally, &mut self.next, &mut self.carried] {
            for counts in tally.values_mut() {
                let old = std::mem::take(counts);
                for (id, n) in old {
                    let id = remap.get(id as usize).copied().unwrap_or(id);
                    *counts.entry(id).or_default() += n;
                }
            }
        }
        self.raw.clear();
        self.unresolved = false;
        // If naming did not shrink it much, wait for another quarter.
        self.resolve_at = (self.ledger.table.len() + self.max_entries / 4)
            .max(self.max_entries / 2)
            .max(1);
    }

    /// The ledger (for the folded stacks and the flame graph): its frames
    /// are names once [`StackProfile::resolve`] ran.
    pub(crate) fn ledger(&self) -> &StackLedger {
        &self.ledger
    }

    /// Takes what the ring holds: execs index their files, and the
    /// samples of processes `wanted` says are profiled are counted in the
    /// current interval, or in the next one when taken after `end_ns`.
    /// Samples of processes not known yet wait (bounded) for the next
    /// call; those `wanted` refuses are dropped (other processes in `run`).
    pub(crate) fn drain(&mut self, end_ns: Option<u64>, wanted: impl Fn(u32) -> Wanted) {
        self.drained.samples.clear();
        self.drained.execs.clear();
        self.sampler.drain(&mut self.drained);
        for e in &self.drained.execs {
            self.symbols.saw_exec(e.tgid, &e.path);
        }
        let mut samples = std::mem::take(&mut self.pending);
        samples.append(&mut self.drained.samples);
        for s in samples {
            match wanted(s.tgid) {
                Wanted::No => continue,
                Wanted::NotKnownYet if end_ns.is_none() => {
                    if self.pending.len() < PENDING_LIMIT {
                        self.pending.push(s);
                    } else {
                        self.unknown_dropped += 1;
                    }
                    continue;
                }
                // Still unknown when an interval closes: a process that came
                // and went between two reads without the tracker seeing it.
                Wanted::NotKnownYet => {
                    self.unknown_dropped += 1;
                    continue;
                }
                Wanted::Yes => {}
            }
            let has_addr = s.user.iter().any(|f| matches!(f, UserFrame::Addr(_)));
            let key: RawKey = (if has_addr { s.tgid } else { 0 }, s.kernel, s.user);
            let id = match self.raw.get(&key) {
                Some(id) => *id,
                None => {
                    let frames = self.symbols.frames(s.tgid, &key.2, &key.1);
                    let id = self.ledger.intern(&frames);
                    self.unresolved = true;
                    if self.raw.len() >= RAW_CACHE {
                        self.raw.clear();
                    }
                    self.raw.insert(key, id);
                    id
                }
            };
            let bucket = if end_ns.is_some_and(|end| s.ts_ns > end) {
                &mut self.next
            } else {
                &mut self.tally
            };
            *bucket.entry(s.tgid).or_default().entry(id).or_default() += 1;
            self.profiled += 1;
            self.comms.entry(s.tgid).or_insert(s.comm);
        }
        if self.ledger.table.len() >= self.resolve_at {
            self.resolve();
            self.symbols.trim();
        }
    }

    /// Closes an interval: `consumers` are the processes reported (pid,
    /// name, energy this interval); each one's energy goes to its stacks.
    /// Counts of a process with no energy this interval are carried to the
    /// next one once (its last run time can come with its exit, an
    /// interval later), then dropped.
    pub(crate) fn close<'a>(&mut self, consumers: impl Iterator<Item = (u32, &'a str, EnergyBy)>) {
        let mut counts: HashMap<StackId, u64> = HashMap::new();
        let mut carried = std::mem::take(&mut self.carried);
        for (pid, name, energy) in consumers {
            counts.clear();
            for t in [self.tally.remove(&pid), carried.remove(&pid)]
                .into_iter()
                .flatten()
            {
                for (id, n) in t {
                    *counts.entry(id).or_default() += n;
                }
            }
            let mut v: Vec<(StackId, u64)> = counts.iter().map(|(k, v)| (*k, *v)).collect();
            v.sort_unstable();
            let name = if name.is_empty() {
                self.comms.get(&pid).map_or("[unknown]", String::as_str)
            } else {
                name
            };
            self.ledger.add(name, &v, &energy);
        }
        self.carried = std::mem::take(&mut self.tally);
        self.tally = std::mem::take(&mut self.next);
        let (tally, carried) = (&self.tally, &self.carried);
        self.comms
            .retain(|pid, _| tally.contains_key(pid) || carried.contains_key(pid));
    }

    /// The recording's section (without functions: the caller adds them).
    pub(crate) fn report(&self) -> StackReport {
        let s = self.sampler.stats();
        StackReport {
            hz: self.sampler.hz(),
            cpus: self.sampler.cpus(),
            samples: s.samples,
            profiled_samples: self.profiled,
            unknown_samples: self.unknown_dropped,
            idle_samples: s.idle,
            lost_samples: s.ring_full,
            lost_execs: s.exec_lost,
            merged_samples: self.ledger.merged_samples(),
            stacks: self.ledger.table.len(),
            entries: self.ledger.len(),
            memory_bytes: (self.ledger.bytes()
                + self.symbols.bytes()
                + self.raw.len() * 600
                + self.pending.len() * 600) as u64,
            functions: Vec::new(),
        }
    }
}
