//! Energy per stack: each interval, a process's energy (every domain) is
//! divided over the stacks sampled in it, in proportion to their samples.
//!
//! Pure data, no I/O. Shares are exact: the largest remainder goes to the
//! stack with the most samples, so a process's stacks always add up to its
//! energy, to the microjoule. A process with energy and no sample in an
//! interval (it ran less than one sampling period) keeps its energy under
//! one `[no samples]` frame, never loses it. Past a bound on distinct
//! (process, stack) entries, new stacks are merged into one
//! `[other stacks]` frame per process and counted.

use std::collections::HashMap;

use super::EnergyBy;

/// An interned stack.
pub(crate) type StackId = u32;

/// The frame of energy a process had in an interval with no sample.
pub(crate) const NO_SAMPLES: &str = "[no samples]";

/// The frame stacks are merged into once the ledger is full.
pub(crate) const OTHER_STACKS: &str = "[other stacks]";

/// The process name processes are merged into once the ledger holds as
/// many names as entries.
pub(crate) const OTHER_PROCESSES: &str = "[other processes]";

/// Values numbered in the order first seen.
#[derive(Debug)]
struct Interner<K> {
    items: Vec<K>,
    ids: HashMap<K, u32>,
}

impl<K> Default for Interner<K> {
    fn default() -> Self {
        Self {
            items: Vec::new(),
            ids: HashMap::new(),
        }
    }
}

impl<K: std::hash::Hash + Eq + Clone> Interner<K> {
    /// The number of `k`, given it if new.
    fn id(&mut self, k: K) -> u32 {
        if let Some(id) = self.ids.get(&k) {
            return *id;
        }
        let id = self.items.len() as u32;
        self.items.push(k.clone());
        self.ids.insert(k, id);
        id
    }

    fn get<Q: std::hash::Hash + Eq + ?Sized>(&self, k: &Q) -> Option<u32>
    where
        K: std::borrow::Borrow<Q>,
    {
        self.ids.get(k).copied()
    }
}

/// Interned frame names and stacks (each a list of frames, outermost
/// first).
#[derive(Debug, Default)]
pub(crate) struct StackTable {
    names: Interner<Box<str>>,
    stacks: Interner<Box<[u32]>>,
}

impl StackTable {
    /// The id of this stack, outermost frame first.
    pub(crate) fn intern(&mut self, frames: &[String]) -> StackId {
        let ids: Box<[u32]> = frames
            .iter()
            .map(|f| self.names.id(f.as_str().into()))
            .collect();
        self.stacks.id(ids)
    }

    /// The id of this stack if it was interned.
    pub(crate) fn find(&self, frames: &[String]) -> Option<StackId> {
        let ids: Option<Box<[u32]>> = frames.iter().map(|f| self.names.get(f.as_str())).collect();
        self.stacks.get(&ids?)
    }

    /// The frames of a stack, outermost first.
    pub(crate) fn frames(&self, id: StackId) -> impl Iterator<Item = &str> + '_ {
        self.stacks
            .items
            .get(id as usize)
            .into_iter()
            .flat_map(|s| s.iter())
            .filter_map(|n| self.names.items.get(*n as usize).map(|b| &**b))
    }

    /// Distinct stacks.
    pub(crate) fn len(&self) -> usize {
        self.stacks.items.len()
    }

    /// Bytes the table holds, roughly (for the memory figure).
    pub(crate) fn bytes(&self) -> usize {
        self.names
            .items
            .iter()
            .map(|n| 2 * n.len() + 48)
            .sum::<usize>()
            + self
                .stacks
                .items
                .iter()
                .map(|s| 8 * s.len() + 64)
                .sum::<usize>()
    }
}

/// What a stack of a process got.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct StackWeight {
    /// Energy, per domain.
    pub(crate) energy: EnergyBy,
    /// Samples.
    pub(crate) samples: u64,
}

impl StackWeight {
    fn merge(&mut self, o: &StackWeight) {
        self.energy.merge(&o.energy);
        self.samples += o.samples;
    }
}

/// Energy per (process name, stack), summed over intervals.
#[derive(Debug)]
pub(crate) struct StackLedger {
    /// The stacks.
    pub(crate) table: StackTable,
    totals: HashMap<(u32, StackId), StackWeight>,
    processes: Interner<Box<str>>,
    max_entries: usize,
    merged: u64,
    no_samples: StackId,
    other: StackId,
}

/// One function's energy: where it was the innermost frame (`self_w`),
/// and where it was anywhere on the stack (`total`, each stack counted
/// once however often it recurses).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct FunctionWeight {
    /// The frame's name.
    pub(crate) function: String,
    /// As the innermost frame.
    pub(crate) self_w: StackWeight,
    /// Anywhere on the stack.
    pub(crate) total: StackWeight,
}

impl StackLedger {
    /// A ledger of at most `max_entries` (process, stack) entries.
    pub(crate) fn new(max_entries: usize) -> Self {
        let mut table = StackTable::default();
        let no_samples = table.intern(&[NO_SAMPLES.to_string()]);
        let other = table.intern(&[OTHER_STACKS.to_string()]);
        Self {
            table,
            totals: HashMap::new(),
            processes: Interner::default(),
            max_entries: max_entries.max(1),
            merged: 0,
            no_samples,
            other,
        }
    }

    /// Samples merged into `[other stacks]` because the ledger was full.
    pub(crate) fn merged_samples(&self) -> u64 {
        self.merged
    }

    /// Entries held.
    pub(crate) fn len(&self) -> usize {
        self.totals.len()
    }

    /// Bytes held, roughly: the documented memory bound is this at
    /// `max_entries`.
    pub(crate) fn bytes(&self) -> usize {
        self.table.bytes() + self.totals.len() * 96
    }

    fn process(&mut self, name: &str) -> u32 {
        if let Some(id) = self.processes.get(name) {
            return id;
        }
        // Names are bounded like stacks: past the bound, one more.
        let name = if self.processes.items.len() >= self.max_entries {
            OTHER_PROCESSES
        } else {
            name
        };
        self.processes.id(name.into())
    }

    /// The id of a stack (outermost frame first); once the ledger holds
    /// `max_entries` stacks, a new one is `[other stacks]`.
    pub(crate) fn intern(&mut self, frames: &[String]) -> StackId {
        // The two frames every ledger has do not count.
        if self.table.len() >= self.max_entries + 2 {
            return self.table.find(frames).unwrap_or(self.other);
        }
        self.table.intern(frames)
    }

    fn put(&mut self, process: u32, stack: StackId, w: StackWeight) {
        let full = self.totals.len() >= self.max_entries;
        // `[no samples]` stays itself: one entry per process name at most.
        let key =
            if full && stack != self.no_samples && !self.totals.contains_key(&(process, stack)) {
                (process, self.other)
            } else {
                (process, stack)
            };
        if key.1 == self.other {
            self.merged += w.samples;
        }
        self.totals.entry(key).or_default().merge(&w);
    }

    /// One interval of one process: its energy, divided over the stacks
    /// sampled (stack, samples).
    pub(crate) fn add(&mut self, process: &str, counts: &[(StackId, u64)], energy: &EnergyBy) {
        let p = self.process(process);
        let total: u64 = counts.iter().map(|(_, c)| c).sum();
        if total == 0 {
            if *energy != EnergyBy::default() {
                let w = StackWeight {
                    energy: *energy,
                    samples: 0,
                };
                self.put(p, self.no_samples, w);
            }
            return;
        }
        let shares = divide(energy, counts, total);
        for ((stack, samples), energy) in counts.iter().zip(shares) {
            self.put(
                p,
                *stack,
                StackWeight {
                    energy,
                    samples: *samples,
                },
            );
        }
    }

    /// Renames every frame through `rename` (one frame may become several,
    /// e.g. a code address its function and the functions inlined there)
    /// and merges the stacks that become the same, with their weights.
    /// Returns each old stack id's new id.
    pub(crate) fn rename(&mut self, mut rename: impl FnMut(&str) -> Vec<String>) -> Vec<StackId> {
        let mut table = StackTable::default();
        let remap: Vec<StackId> = (0..self.table.len() as StackId)
            .map(|id| {
                let frames: Vec<String> = self.table.frames(id).flat_map(&mut rename).collect();
                table.intern(&frames)
            })
            .collect();
        let old = std::mem::take(&mut self.totals);
        for ((p, s), w) in old {
            let s = remap.get(s as usize).copied().unwrap_or(s);
            self.totals.entry((p, s)).or_default().merge(&w);
        }
        self.no_samples = remap[self.no_samples as usize];
        self.other = remap[self.other as usize];
        self.table = table;
        remap
    }

    /// Every entry: process name, stack, what it got.
    pub(crate) fn entries(&self) -> impl Iterator<Item = (&str, StackId, &StackWeight)> + '_ {
        self.totals.iter().filter_map(|((p, s), w)| {
            self.processes
                .items
                .get(*p as usize)
                .map(|name| (&**name, *s, w))
        })
    }

    /// Per function, most `key` of their own (as the innermost frame)
    /// first, then most in all (at most `top`).
    pub(crate) fn functions(
        &self,
        top: usize,
        key: impl Fn(&StackWeight) -> u64,
    ) -> Vec<FunctionWeight> {
        let mut by: HashMap<&str, FunctionWeight> = HashMap::new();
        for (_, stack, w) in self.entries() {
            let frames: Vec<&str> = self.table.frames(stack).collect();
            if let Some(leaf) = frames.last() {
                let f = by.entry(leaf).or_default();
                f.self_w.merge(w);
            }
            let mut seen: Vec<&str> = Vec::with_capacity(frames.len());
            for f in frames {
                if !seen.contains(&f) {
                    seen.push(f);
                    by.entry(f).or_default().total.merge(w);
                }
            }
        }
        let mut v: Vec<FunctionWeight> = by
            .into_iter()
            .map(|(name, mut f)| {
                f.function = name.to_string();
                f
            })
            .collect();
        v.sort_by(|a, b| {
            key(&b.self_w)
                .cmp(&key(&a.self_w))
                .then_with(|| key(&b.total).cmp(&key(&a.total)))
                .then_with(|| a.function.cmp(&b.function))
        });
        v.truncate(top);
        v
    }
}

/// `energy` over `counts` (summing to `total`), exactly: each domain's
/// remainder goes to the first stack with the most samples.
fn divide(energy: &EnergyBy, counts: &[(StackId, u64)], total: u64) -> Vec<EnergyBy> {
    let biggest = counts
        .iter()
        .enumerate()
        .max_by(|a, b| a.1.1.cmp(&b.1.1).then(b.0.cmp(&a.0)))
        .map_or(0, |(i, _)| i);
    let mut out: Vec<EnergyBy> = counts
        .iter()
        .map(|(_, c)| energy.share(*c, total))
        .collect();
    let mut sum = EnergyBy::default();
    for e in &out {
        sum.merge(e);
    }
    if let Some(b) = out.get_mut(biggest) {
        b.merge(&energy.less(&sum));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(package_uj: u64, dram_uj: u64) -> EnergyBy {
        EnergyBy {
            package_uj,
            dram_uj,
            ..EnergyBy::default()
        }
    }

    fn of(l: &StackLedger, process: &str, stack: StackId) -> StackWeight {
        l.entries()
            .find(|(p, s, _)| *p == process && *s == stack)
            .map(|(_, _, w)| *w)
            .unwrap_or_default()
    }

    #[test]
    fn energy_is_divided_by_samples_and_adds_up_to_the_microjoule() {
        let mut l = StackLedger::new(100);
        let a = l.table.intern(&["main".into(), "a".into()]);
        let b = l.table.intern(&["main".into(), "b".into()]);
        let c = l.table.intern(&["main".into(), "c".into()]);
        // 1,000,001 µJ over 2:1:0... samples 2, 1 and 0 of 3; then 7 µJ
        // over three equal stacks.
        l.add("burner", &[(a, 2), (b, 1)], &e(1_000_001, 10));
        l.add("burner", &[(a, 1), (b, 1), (c, 1)], &e(7, 0));
        let (wa, wb, wc) = (
            of(&l, "burner", a),
            of(&l, "burner", b),
            of(&l, "burner", c),
        );
        assert_eq!(wa.energy.package_uj, 666_668 + 3);
        assert_eq!(wb.energy.package_uj, 333_333 + 2);
        assert_eq!(wc.energy.package_uj, 2);
        assert_eq!(
            wa.energy.package_uj + wb.energy.package_uj + wc.energy.package_uj,
            1_000_008
        );
        assert_eq!(wa.energy.dram_uj + wb.energy.dram_uj, 10);
        assert_eq!((wa.samples, wb.samples, wc.samples), (3, 2, 1));
    }

    #[test]
    fn energy_without_samples_is_kept_under_its_own_frame() {
        let mut l = StackLedger::new(100);
        l.add("short", &[], &e(500, 0));
        l.add("idle", &[], &EnergyBy::default());
        let w = of(&l, "short", l.no_samples);
        assert_eq!(w.energy.package_uj, 500);
        assert_eq!(l.len(), 1);
        assert_eq!(
            l.table.frames(l.no_samples).collect::<Vec<_>>(),
            [NO_SAMPLES]
        );
    }

    #[test]
    fn a_full_ledger_merges_new_stacks_and_counts_their_samples() {
        let mut l = StackLedger::new(3);
        let a = l.intern(&["a".into()]);
        let b = l.intern(&["b".into()]);
        let c = l.intern(&["c".into()]);
        l.max_entries = 2;
        l.add("p", &[(a, 1), (b, 1)], &e(10, 0));
        l.add("p", &[(a, 1), (c, 4)], &e(10, 0));
        assert_eq!(of(&l, "p", a).energy.package_uj, 5 + 2);
        assert_eq!(of(&l, "p", l.other).energy.package_uj, 8);
        assert_eq!(of(&l, "p", c), StackWeight::default());
        assert_eq!(l.merged_samples(), 4);
        let sum: u64 = l.entries().map(|(_, _, w)| w.energy.package_uj).sum();
        assert_eq!(sum, 20);
        // The table is bounded too: past two stacks of its own, a new one
        // is [other stacks], a known one is itself.
        assert_eq!(l.intern(&["d".into()]), l.other);
        assert_eq!(l.intern(&["a".into()]), a);
        assert_eq!(l.table.len(), 5);
    }

    #[test]
    fn renaming_merges_stacks_that_become_the_same_and_keeps_every_joule() {
        let mut l = StackLedger::new(100);
        let a1 = l.intern(&["main".into(), "@a+1".into()]);
        let a2 = l.intern(&["main".into(), "@a+2".into()]);
        let b = l.intern(&["main".into(), "@b+1".into()]);
        l.add("p", &[(a1, 1), (a2, 1), (b, 2)], &e(400, 4));
        l.add("q", &[], &e(7, 0));
        let remap = l.rename(|f| match f.strip_prefix('@') {
            Some(k) if k.starts_with('a') => vec!["a".into()],
            Some(_) => vec!["b_outer".into(), "b_inlined".into()],
            None => vec![f.to_string()],
        });
        assert_eq!(remap[a1 as usize], remap[a2 as usize]);
        let a = remap[a1 as usize];
        assert_eq!(l.table.frames(a).collect::<Vec<_>>(), ["main", "a"]);
        assert_eq!(
            l.table.frames(remap[b as usize]).collect::<Vec<_>>(),
            ["main", "b_outer", "b_inlined"]
        );
        assert_eq!(of(&l, "p", a).energy.package_uj, 200);
        assert_eq!(of(&l, "p", a).samples, 2);
        assert_eq!(of(&l, "q", l.no_samples).energy.package_uj, 7);
        let sum: u64 = l.entries().map(|(_, _, w)| w.energy.package_uj).sum();
        assert_eq!(sum, 407);
        assert_eq!(l.len(), 3);
    }

    #[test]
    fn functions_have_self_and_total_energy_with_recursion_counted_once() {
        let mut l = StackLedger::new(100);
        let r = l.table.intern(&["main".into(), "f".into(), "f".into()]);
        let g = l.table.intern(&["main".into(), "g".into()]);
        l.add("p", &[(r, 3), (g, 1)], &e(400, 0));
        let f = l.functions(10, |w| w.energy.package_uj);
        assert_eq!(f[0].function, "f");
        assert_eq!(f[0].total.energy.package_uj, 300);
        assert_eq!(f[0].self_w.energy.package_uj, 300);
        assert_eq!(f[1].function, "g");
        assert_eq!(f[1].total.samples, 1);
        assert_eq!(f[2].function, "main");
        assert_eq!(f[2].total.energy.package_uj, 400);
        assert_eq!(f[2].self_w.energy.package_uj, 0);
        assert_eq!(l.functions(1, |w| w.samples).len(), 1);
    }
}
