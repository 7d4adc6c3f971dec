//! Sums of attributed energy over many intervals.

use serde::Serialize;

use super::{Basis, ConsumerId, DomainShare};
use crate::sources::Domain;

/// Energy by kind of domain (µJ), for one consumer or group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EnergyBy {
    /// CPU package energy (cores, caches, uncore), all packages.
    pub package_uj: u64,
    /// Core (PP0) energy: part of `package_uj`, where the CPU reports it.
    pub core_uj: u64,
    /// DRAM energy.
    pub dram_uj: u64,
    /// GPU energy, all GPUs.
    pub gpu_uj: u64,
    /// Wall energy from a calibration (`--calibration`): the same energy
    /// seen at the wall, so never added to the others.
    pub wall_uj: u64,
    /// The static part of `package_uj` (rent for the CPU time held; the
    /// rest is dynamic: what running caused).
    pub package_static_uj: u64,
    /// The static part of `core_uj`.
    pub core_static_uj: u64,
    /// The static part of `dram_uj`.
    pub dram_static_uj: u64,
    /// The static part of `gpu_uj` (0 until GPUs have a static figure).
    pub gpu_static_uj: u64,
}

impl EnergyBy {
    /// Adds `uj` of `domain` (uncore and psys are not kept per consumer
    /// and are ignored; wall is, when a calibration divides it).
    pub(crate) fn add(&mut self, domain: Domain, uj: u64) {
        match domain {
            Domain::Package => self.package_uj += uj,
            Domain::Core => self.core_uj += uj,
            Domain::Dram => self.dram_uj += uj,
            Domain::Gpu => self.gpu_uj += uj,
            Domain::Wall => self.wall_uj += uj,
            Domain::Uncore | Domain::Psys => {}
        }
    }

    /// The energy of `domain` in this sum (0 for domains a sum does not
    /// keep: uncore and psys are inside package).
    pub(crate) fn of(&self, domain: Domain) -> u64 {
        match domain {
            Domain::Package => self.package_uj,
            Domain::Core => self.core_uj,
            Domain::Dram => self.dram_uj,
            Domain::Gpu => self.gpu_uj,
            Domain::Wall => self.wall_uj,
            Domain::Uncore | Domain::Psys => 0,
        }
    }

    /// Marks `uj` of what was added for `domain` as static.
    pub(crate) fn add_static(&mut self, domain: Domain, uj: u64) {
        match domain {
            Domain::Package => self.package_static_uj += uj,
            Domain::Core => self.core_static_uj += uj,
            Domain::Dram => self.dram_static_uj += uj,
            Domain::Gpu => self.gpu_static_uj += uj,
            // A calibrated wall's static power is the node's (idle).
            Domain::Wall | Domain::Uncore | Domain::Psys => {}
        }
    }

    /// The static part of [`EnergyBy::total_uj`].
    pub(crate) fn static_uj(&self) -> u64 {
        self.package_static_uj + self.dram_static_uj + self.gpu_static_uj
    }

    /// The dynamic part of [`EnergyBy::total_uj`].
    pub(crate) fn dynamic_uj(&self) -> u64 {
        self.total_uj().saturating_sub(self.static_uj())
    }

    /// `part / whole` of each domain (rounded down; all of it when
    /// `whole` is 0 or `part` is all of it).
    pub(crate) fn share(&self, part: u64, whole: u64) -> EnergyBy {
        if whole == 0 || part >= whole {
            return *self;
        }
        let f = |uj: u64| (u128::from(uj) * u128::from(part) / u128::from(whole)) as u64;
        EnergyBy {
            package_uj: f(self.package_uj),
            core_uj: f(self.core_uj),
            dram_uj: f(self.dram_uj),
            gpu_uj: f(self.gpu_uj),
            wall_uj: f(self.wall_uj),
            package_static_uj: f(self.package_static_uj),
            core_static_uj: f(self.core_static_uj),
            dram_static_uj: f(self.dram_static_uj),
            gpu_static_uj: f(self.gpu_static_uj),
        }
    }

    /// This sum less `o` (never below zero).
    pub(crate) fn less(&self, o: &EnergyBy) -> EnergyBy {
        EnergyBy {
            package_uj: self.package_uj.saturating_sub(o.package_uj),
            core_uj: self.core_uj.saturating_sub(o.core_uj),
            dram_uj: self.dram_uj.saturating_sub(o.dram_uj),
            gpu_uj: self.gpu_uj.saturating_sub(o.gpu_uj),
            wall_uj: self.wall_uj.saturating_sub(o.wall_uj),
            package_static_uj: self.package_static_uj.saturating_sub(o.package_static_uj),
            core_static_uj: self.core_static_uj.saturating_sub(o.core_static_uj),
            dram_static_uj: self.dram_static_uj.saturating_sub(o.dram_static_uj),
            gpu_static_uj: self.gpu_static_uj.saturating_sub(o.gpu_static_uj),
        }
    }

    /// Adds another sum.
    pub(crate) fn merge(&mut self, o: &EnergyBy) {
        self.package_uj += o.package_uj;
        self.core_uj += o.core_uj;
        self.dram_uj += o.dram_uj;
        self.gpu_uj += o.gpu_uj;
        self.wall_uj += o.wall_uj;
        self.package_static_uj += o.package_static_uj;
        self.core_static_uj += o.core_static_uj;
        self.dram_static_uj += o.dram_static_uj;
        self.gpu_static_uj += o.gpu_static_uj;
    }

    /// Package + DRAM + GPU (core is inside package).
    pub(crate) fn total_uj(&self) -> u64 {
        self.package_uj + self.dram_uj + self.gpu_uj
    }
}

/// One domain's energy summed over intervals.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct DomainTotals {
    /// Which domain.
    pub(crate) domain: Domain,
    /// Kernel package id, GPU index, or `None` (machine level).
    pub(crate) package: Option<u32>,
    /// Some interval's figure was modelled rather than measured.
    pub(crate) estimated: bool,
    /// How it was divided.
    pub(crate) basis: Basis,
    /// Measured (µJ).
    pub(crate) measured_uj: u64,
    /// Attributed to consumers (µJ).
    pub(crate) attributed_uj: u64,
    /// Idle share (µJ).
    pub(crate) idle_uj: u64,
    /// Neither (µJ).
    pub(crate) unattributed_uj: u64,
    /// The domain's static energy (its static figure × time, within
    /// the measured; a calibrated wall's `b`).
    pub(crate) static_uj: u64,
    /// The static part of `attributed_uj`.
    pub(crate) attributed_static_uj: u64,
    /// How much the static figure exceeded the measured energy, summed.
    pub(crate) static_cut_uj: u64,
}

/// Energy attributed so far: per domain, and per consumer.
#[derive(Clone, Debug, Default)]
pub(crate) struct EnergyLedger {
    domains: Vec<DomainTotals>,
    consumers: crate::hash::IntMap<ConsumerId, EnergyBy>,
}

impl EnergyLedger {
    /// Adds one interval's shares.
    pub(crate) fn add(&mut self, shares: &[DomainShare]) {
        for s in shares {
            let t = match self
                .domains
                .iter_mut()
                .position(|t| t.domain == s.domain && t.package == s.package)
            {
                Some(i) => &mut self.domains[i],
                None => {
                    self.domains.push(DomainTotals {
                        domain: s.domain,
                        package: s.package,
                        estimated: false,
                        basis: s.basis,
                        measured_uj: 0,
                        attributed_uj: 0,
                        idle_uj: 0,
                        unattributed_uj: 0,
                        static_uj: 0,
                        attributed_static_uj: 0,
                        static_cut_uj: 0,
                    });
                    self.domains.sort_by_key(|t| (t.domain, t.package));
                    let i = self
                        .domains
                        .iter()
                        .position(|t| t.domain == s.domain && t.package == s.package)
                        .unwrap_or(0);
                    &mut self.domains[i]
                }
            };
            t.estimated |= s.estimated;
            t.measured_uj += s.measured_uj;
            t.static_uj += s.static_uj;
            t.static_cut_uj += s.static_cut_uj;
            t.attributed_static_uj += s.attributed_static.iter().map(|(_, uj)| uj).sum::<u64>();
            t.attributed_uj += s.attributed_uj();
            t.idle_uj += s.idle_uj;
            t.unattributed_uj += s.unattributed_uj;
            for (id, uj) in &s.attributed {
                self.consumers.entry(*id).or_default().add(s.domain, *uj);
            }
            for (id, uj) in &s.attributed_static {
                self.consumers
                    .entry(*id)
                    .or_default()
                    .add_static(s.domain, *uj);
            }
        }
    }

    /// Per-domain totals, ordered by domain then package.
    pub(crate) fn domains(&self) -> &[DomainTotals] {
        &self.domains
    }

    /// A consumer's energy so far.
    pub(crate) fn consumer(&self, id: ConsumerId) -> EnergyBy {
        self.consumers.get(&id).copied().unwrap_or_default()
    }

    /// Forgets consumers `keep` rejects (their energy stays in the domain
    /// totals; callers fold it into their groups first).
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(ConsumerId) -> bool) {
        self.consumers.retain(|id, _| keep(*id));
    }

    /// Sum over domains of one kind: (measured, attributed, idle,
    /// unattributed) µJ.
    #[cfg(test)]
    pub(crate) fn sum_of(&self, domain: Domain) -> (u64, u64, u64, u64) {
        self.domains
            .iter()
            .filter(|t| t.domain == domain)
            .fold((0, 0, 0, 0), |a, t| {
                (
                    a.0 + t.measured_uj,
                    a.1 + t.attributed_uj,
                    a.2 + t.idle_uj,
                    a.3 + t.unattributed_uj,
                )
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn share(domain: Domain, package: Option<u32>, attributed: Vec<(u64, u64)>) -> DomainShare {
        let a: u64 = attributed.iter().map(|x| x.1).sum();
        DomainShare {
            domain,
            package,
            estimated: false,
            basis: Basis::CpuTime,
            measured_uj: a + 10,
            idle_uj: 6,
            unattributed_uj: 4,
            attributed,
            attributed_static: Vec::new(),
            static_uj: 0,
            static_cut_uj: 0,
        }
    }

    #[test]
    fn sums_domains_and_consumers_over_intervals() {
        let mut l = EnergyLedger::default();
        l.add(&[
            share(Domain::Package, Some(1), vec![(1, 100)]),
            share(Domain::Package, Some(0), vec![(1, 50), (2, 5)]),
        ]);
        l.add(&[
            share(Domain::Package, Some(0), vec![(2, 20)]),
            share(Domain::Dram, Some(0), vec![(2, 7)]),
        ]);
        let d: Vec<_> = l.domains().iter().map(|t| (t.domain, t.package)).collect();
        assert_eq!(
            d,
            vec![
                (Domain::Package, Some(0)),
                (Domain::Package, Some(1)),
                (Domain::Dram, Some(0))
            ]
        );
        assert_eq!(l.domains()[0].measured_uj, 55 + 10 + 20 + 10);
        assert_eq!(l.domains()[0].idle_uj, 12);
        assert_eq!(l.consumer(1).package_uj, 150);
        assert_eq!(l.consumer(2).package_uj, 25);
        assert_eq!(l.consumer(2).total_uj(), 32);
        assert_eq!(l.sum_of(Domain::Package).0, 95 + 110);
        l.retain(|id| id != 1);
        assert_eq!(l.consumer(1), EnergyBy::default());
    }
}
