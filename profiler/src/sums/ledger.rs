//! Attributed energy over many intervals: per domain and per consumer.

use serde::Serialize;

use crate::attribution::{Basis, ConsumerId, DomainShare, EnergyBy};
use crate::model::DomainReport;
use crate::model::record::{AveragePower, DomainUj};
use crate::sources::Domain;
use crate::sources::static_power::StaticFigure;

/// One domain's energy summed over intervals.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
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

impl DomainTotals {
    /// One interval's share of a domain, as a sum.
    fn of_share(s: &DomainShare) -> Self {
        Self {
            domain: s.domain,
            package: s.package,
            estimated: s.estimated,
            basis: s.basis,
            measured_uj: s.measured_uj,
            attributed_uj: s.attributed_uj(),
            idle_uj: s.idle_uj,
            unattributed_uj: s.unattributed_uj,
            static_uj: s.static_uj,
            attributed_static_uj: s.attributed_static.iter().map(|(_, uj)| uj).sum(),
            static_cut_uj: s.static_cut_uj,
        }
    }

    /// Adds `o`'s figures (estimated if either is).
    fn merge(&mut self, o: &Self) {
        // Saturating: a damaged file read back must not overflow a sum.
        self.estimated |= o.estimated;
        self.measured_uj = self.measured_uj.saturating_add(o.measured_uj);
        self.attributed_uj = self.attributed_uj.saturating_add(o.attributed_uj);
        self.idle_uj = self.idle_uj.saturating_add(o.idle_uj);
        self.unattributed_uj = self.unattributed_uj.saturating_add(o.unattributed_uj);
        self.static_uj = self.static_uj.saturating_add(o.static_uj);
        self.attributed_static_uj = self
            .attributed_static_uj
            .saturating_add(o.attributed_static_uj);
        self.static_cut_uj = self.static_cut_uj.saturating_add(o.static_cut_uj);
    }
}

impl EnergyLedger {
    /// Adds one interval's shares: per domain, and per consumer.
    pub(crate) fn add(&mut self, shares: &[DomainShare]) {
        for s in shares {
            self.add_domain(&DomainTotals::of_share(s));
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

    /// Adds one interval's figures of a domain (`report` adds a cut
    /// stream's domain rows here, as the profile adds its shares).
    pub(crate) fn add_domain(&mut self, d: &DomainTotals) {
        let at = |v: &[DomainTotals]| {
            v.iter()
                .position(|t| t.domain == d.domain && t.package == d.package)
        };
        let i = match at(&self.domains) {
            Some(i) => i,
            None => {
                self.domains.push(DomainTotals {
                    estimated: false,
                    measured_uj: 0,
                    attributed_uj: 0,
                    idle_uj: 0,
                    unattributed_uj: 0,
                    static_uj: 0,
                    attributed_static_uj: 0,
                    static_cut_uj: 0,
                    ..*d
                });
                self.domains.sort_by_key(|t| (t.domain, t.package));
                at(&self.domains).unwrap_or(0)
            }
        };
        self.domains[i].merge(d);
    }

    /// Per-domain totals, ordered by domain then package.
    pub(crate) fn domains(&self) -> &[DomainTotals] {
        &self.domains
    }

    /// Adds energy to a consumer's sum (`report` sums a cut stream's
    /// process rows here, by pid).
    pub(crate) fn add_consumer(&mut self, id: ConsumerId, e: &EnergyBy) {
        self.consumers.entry(id).or_default().merge(e);
    }

    /// Each domain's figures over `span_ns`, with the static figure
    /// `figure` gives it (the one in use at the end).
    pub(crate) fn reports(
        &self,
        span_ns: u64,
        figure: impl Fn(Domain, Option<u32>) -> Option<StaticFigure>,
    ) -> Vec<DomainReport> {
        self.domains
            .iter()
            .map(|t| {
                DomainReport::from_uj(
                    DomainUj {
                        domain: t.domain,
                        package: t.package,
                        estimated: t.estimated,
                        basis: t.basis,
                        measured: t.measured_uj,
                        attributed: t.attributed_uj,
                        idle: t.idle_uj,
                        unattributed: t.unattributed_uj,
                        static_uj: t.static_uj,
                        attributed_static: t.attributed_static_uj,
                        figure: figure(t.domain, t.package),
                    },
                    span_ns,
                    |avg_power_w| AveragePower { avg_power_w },
                )
            })
            .collect()
    }

    /// A consumer's energy so far.
    pub(crate) fn consumer(&self, id: ConsumerId) -> EnergyBy {
        self.consumers.get(&id).copied().unwrap_or_default()
    }

    /// Forgets consumers `keep` rejects (their energy stays in the domain
    /// totals; callers fold it into their groups first).
    pub(crate) fn retain(&mut self, keep: impl Fn(ConsumerId) -> bool) {
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
