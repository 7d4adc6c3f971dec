//! `--stacks`: the stack sampler's samples, named and counted per process
//! per interval, and weighted by each process's energy when the interval
//! closes.

use std::collections::HashMap;

use crate::attribution::EnergyBy;
use crate::attribution::stacks::{StackId, StackLedger};
use crate::output::flamegraph::StackReport;
use crate::process::symbols::Symbols;
use crate::tracker::stacks::{Drained, StackSampler, UserFrame};

/// Default bound on (process, stack) entries: about 40 MB at the bound
/// with typical stacks (see README).
pub const DEFAULT_MAX_ENTRIES: usize = 100_000;

/// The raw stacks seen (tgid where a frame is an address, which only means
/// something in its process), and the stack each was named as.
type RawKey = (u32, Vec<u64>, Vec<UserFrame>);

/// Stack sampling in a profile.
pub struct StackProfile {
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
    drained: Drained,
}

/// How many raw stacks are remembered before the cache starts again.
const RAW_CACHE: usize = 20_000;

impl StackProfile {
    /// Around a started sampler, holding at most `max_entries` (process,
    /// stack) entries.
    pub fn new(sampler: StackSampler, max_entries: usize) -> Self {
        Self {
            sampler,
            symbols: Symbols::default(),
            ledger: StackLedger::new(max_entries),
            raw: HashMap::new(),
            tally: HashMap::new(),
            next: HashMap::new(),
            comms: HashMap::new(),
            drained: Drained::default(),
        }
    }

    /// The ledger (for the folded stacks and the flame graph).
    pub fn ledger(&self) -> &StackLedger {
        &self.ledger
    }

    /// Takes what the ring holds: execs index their files, new stacks are
    /// named while their processes live, and samples are counted in the
    /// current interval, or in the next one when taken after `end_ns`.
    pub fn drain(&mut self, end_ns: Option<u64>) {
        self.drained.samples.clear();
        self.drained.execs.clear();
        self.sampler.drain(&mut self.drained);
        for e in &self.drained.execs {
            self.symbols.saw_exec(e.tgid, &e.path);
        }
        for s in std::mem::take(&mut self.drained.samples) {
            let has_addr = s.user.iter().any(|f| matches!(f, UserFrame::Addr(_)));
            let key: RawKey = (if has_addr { s.tgid } else { 0 }, s.kernel, s.user);
            let id = match self.raw.get(&key) {
                Some(id) => *id,
                None => {
                    let frames = self.symbols.frames(s.tgid, &key.2, &key.1);
                    let id = self.ledger.intern(&frames);
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
            self.comms.entry(s.tgid).or_insert(s.comm);
        }
    }

    /// Closes an interval: `consumers` are the processes reported (pid,
    /// name, energy this interval); each one's energy goes to its stacks.
    /// Samples of processes not reported are dropped with the interval
    /// (they are other processes in `run`).
    pub fn close<'a>(&mut self, consumers: impl Iterator<Item = (u32, &'a str, EnergyBy)>) {
        let mut counts: Vec<(StackId, u64)> = Vec::new();
        for (pid, name, energy) in consumers {
            counts.clear();
            if let Some(t) = self.tally.remove(&pid) {
                counts.extend(t);
                counts.sort_unstable();
            }
            let name = if name.is_empty() {
                self.comms.get(&pid).map_or("[unknown]", String::as_str)
            } else {
                name
            };
            self.ledger.add(name, &counts, &energy);
        }
        self.tally = std::mem::take(&mut self.next);
        self.comms.retain(|pid, _| self.tally.contains_key(pid));
    }

    /// The recording's section (without functions: the caller adds them).
    pub fn report(&self) -> StackReport {
        let s = self.sampler.stats();
        StackReport {
            hz: self.sampler.hz(),
            cpus: self.sampler.cpus(),
            samples: s.samples,
            idle_samples: s.idle,
            lost_samples: s.ring_full,
            lost_execs: s.exec_lost,
            merged_samples: self.ledger.merged_samples(),
            stacks: self.ledger.table.len(),
            entries: self.ledger.len(),
            memory_bytes: self.ledger.bytes() as u64,
            functions: Vec::new(),
        }
    }
}
