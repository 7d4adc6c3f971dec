//! Attributed energy over many intervals: per domain and per consumer.

use crate::attribution::{ConsumerId, DomainShare, DomainUj, EnergyBy};
use crate::model::DomainReport;
use crate::model::record::AveragePower;
use crate::sources::DomainKey;
use crate::sources::static_power::StaticFigure;

/// Energy attributed so far: per domain, and per consumer.
#[derive(Clone, Debug, Default)]
pub(crate) struct EnergyLedger {
    domains: Vec<DomainUj>,
    consumers: crate::hash::IntMap<ConsumerId, EnergyBy>,
}

impl EnergyLedger {
    /// Adds one interval's shares: per domain, and per consumer.
    pub(crate) fn add(&mut self, shares: &[DomainShare]) {
        for s in shares {
            self.add_domain(&s.totals());
            for (id, uj) in &s.attributed {
                self.consumers
                    .entry(*id)
                    .or_default()
                    .add(s.key.domain, *uj);
            }
            for (id, uj) in &s.attributed_static {
                self.consumers
                    .entry(*id)
                    .or_default()
                    .add_static(s.key.domain, *uj);
            }
        }
    }

    /// Adds one interval's figures of a domain (`report` adds a cut
    /// stream's domain rows here, as the profile adds its shares).
    pub(crate) fn add_domain(&mut self, d: &DomainUj) {
        let i = match self.domains.binary_search_by_key(&d.key, |t| t.key) {
            Ok(i) => i,
            Err(i) => {
                self.domains.insert(i, DomainUj::empty(d.key, d.basis));
                i
            }
        };
        self.domains[i].merge(d);
    }

    /// Per-domain totals, ordered by domain then package.
    pub(crate) fn domains(&self) -> &[DomainUj] {
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
        figure: impl Fn(DomainKey) -> Option<StaticFigure>,
    ) -> Vec<DomainReport> {
        self.domains
            .iter()
            .map(|t| {
                DomainReport::from_uj(t, figure(t.key), span_ns, |avg_power_w| AveragePower {
                    avg_power_w,
                })
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
    pub(crate) fn sum_of(&self, domain: crate::sources::Domain) -> (u64, u64, u64, u64) {
        self.domains
            .iter()
            .filter(|t| t.key.domain == domain)
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
    use crate::attribution::Basis;
    use crate::sources::Domain;

    fn share(domain: Domain, package: Option<u32>, attributed: Vec<(u64, u64)>) -> DomainShare {
        let a: u64 = attributed.iter().map(|x| x.1).sum();
        DomainShare {
            key: DomainKey::new(domain, package),
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
        let d: Vec<_> = l
            .domains()
            .iter()
            .map(|t| (t.key.domain, t.key.package))
            .collect();
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
