//! Energy of intervals whose counter read failed. A failed read advances
//! no counter (an MSR read refused, a powercap zone gone for a while), so
//! the next good read covers the failed intervals too. Their CPU time is
//! held here until then, and that read's energy is divided over the whole
//! span by CPU time: each process gets its share of the span, not the
//! processes that happen to run in the interval of the good read.

use crate::attribution::{
    self, ConsumerId, DomainShare, Interval, PackageTime, StaticEnergy, Usage,
};
use crate::hash::IntMap;
use crate::sources::DomainEnergy;
use crate::sources::DomainKey;

/// Longest span held: a domain unread for longer than this has its held
/// time dropped (memory stays bounded), and its first read back counts 0:
/// a RAPL counter can wrap in a few minutes, and one reading cannot tell
/// one wrap from two (the powercap reader applies the same limit).
pub(crate) const HELD_MAX_NS: u64 = 60_000_000_000;

/// CPU time of the intervals one domain missed.
#[derive(Debug, Default)]
struct Held {
    packages: Vec<PackageTime>,
    usage: IntMap<ConsumerId, Vec<u64>>,
    /// Start of the first interval missed (monotonic ns).
    since_ns: u64,
    /// Held longer than [`HELD_MAX_NS`]: its time was dropped.
    expired: bool,
}

impl Held {
    fn add(&mut self, packages: &[PackageTime], usage: &[Usage]) {
        if self.packages.len() < packages.len() {
            self.packages.resize(packages.len(), PackageTime::default());
        }
        for (h, p) in self.packages.iter_mut().zip(packages) {
            h.busy_ns += p.busy_ns;
            h.idle_ns += p.idle_ns;
            h.lost_ns += p.lost_ns;
        }
        for u in usage {
            let ns = self
                .usage
                .entry(u.id)
                .or_insert_with(|| vec![0; u.on_cpu_ns.len()]);
            if ns.len() < u.on_cpu_ns.len() {
                ns.resize(u.on_cpu_ns.len(), 0);
            }
            for (h, n) in ns.iter_mut().zip(u.on_cpu_ns.iter()) {
                *h += n;
            }
        }
    }
}

/// One interval's CPU time, as attribution reads it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Span<'a> {
    /// CPU time per dense package index.
    pub(crate) packages: &'a [PackageTime],
    /// The kernel's package id of each dense package index.
    pub(crate) package_ids: &'a [u32],
    /// Per-consumer on-CPU time.
    pub(crate) usage: &'a [Usage],
    /// The interval's start and end (monotonic ns).
    pub(crate) start_ns: u64,
    /// Its end.
    pub(crate) end_ns: u64,
    /// Static power per divided domain (W).
    pub(crate) static_w: &'a [(crate::sources::Domain, Option<u32>, f64)],
    /// How static energy is shared.
    pub(crate) static_share: attribution::StaticShare,
}

/// The held time of every domain whose read failed.
#[derive(Debug, Default)]
pub(crate) struct HeldReads {
    held: Vec<(DomainKey, Held)>,
}

/// Energy read after failed reads, divided over its whole span.
#[derive(Debug, Default)]
pub(crate) struct CaughtUp {
    /// The shares, one per domain.
    pub(crate) shares: Vec<DomainShare>,
    /// The span each domain's energy covers (ns), longer than the interval.
    pub(crate) covers_ns: Vec<(DomainKey, u64)>,
}

impl HeldReads {
    /// Whether nothing is held.
    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Whether time is being held for some domain (not only expired
    /// entries, whose time is dropped).
    pub(crate) fn any_live(&self) -> bool {
        self.held.iter().any(|(_, h)| !h.expired)
    }

    /// Holds this interval's time for each domain whose read failed;
    /// returns what to tell people (a span held too long).
    pub(crate) fn hold(&mut self, missed: &[DomainKey], span: &Span<'_>) -> Vec<String> {
        let mut problems = Vec::new();
        for key in missed {
            let i = match self.held.iter().position(|(k, _)| k == key) {
                Some(i) => i,
                None => {
                    self.held.push((
                        *key,
                        Held {
                            since_ns: span.start_ns,
                            ..Held::default()
                        },
                    ));
                    self.held.len() - 1
                }
            };
            let h = &mut self.held[i].1;
            if h.expired {
                continue;
            }
            if span.end_ns.saturating_sub(h.since_ns) > HELD_MAX_NS {
                *h = Held {
                    since_ns: h.since_ns,
                    expired: true,
                    ..Held::default()
                };
                problems.push(format!(
                    "{} energy{} unread for over {} s: its energy for that time is not known \
                     (a counter may wrap more than once), and is counted as 0",
                    key.domain.name(),
                    key.package
                        .map(|p| format!(" of package {p}"))
                        .unwrap_or_default(),
                    HELD_MAX_NS / 1_000_000_000
                ));
            } else {
                h.add(span.packages, span.usage);
            }
        }
        problems
    }

    /// Divides the energy of domains read again after failed reads over
    /// the held time and this interval's.
    pub(crate) fn catch_up(&mut self, energy: &[DomainEnergy], span: &Span<'_>) -> CaughtUp {
        let mut out = CaughtUp::default();
        for d in energy {
            let key = DomainKey::new(d.domain, d.package);
            let held = self
                .held
                .iter()
                .position(|(k, _)| *k == key)
                .map(|i| self.held.swap_remove(i).1);
            let since_ns = held.as_ref().map_or(span.start_ns, |h| h.since_ns);
            out.covers_ns
                .push((key, span.end_ns.saturating_sub(since_ns)));
            // Expired: the counter's figure cannot be trusted (0 J, no
            // time to divide by). Otherwise the held time and this
            // interval's (only this interval's when nothing was held).
            let expired = held.as_ref().is_some_and(|h| h.expired);
            let mut h = held.filter(|h| !h.expired).unwrap_or_default();
            let energy_uj = if expired {
                h.packages = vec![PackageTime::default(); span.packages.len()];
                0
            } else {
                h.add(span.packages, span.usage);
                d.energy_uj
            };
            let mut usage: Vec<Usage> = h
                .usage
                .into_iter()
                .map(|(id, on_cpu_ns)| Usage {
                    id,
                    on_cpu_ns: crate::tracker::PackageNs::from_slice(&on_cpu_ns),
                })
                .collect();
            usage.sort_unstable_by_key(|u| u.id);
            // The static figure over the whole span the read covers.
            let covers_ns = span.end_ns.saturating_sub(since_ns);
            // An expired span's energy is not known (0 J): no static in it.
            let statics: Vec<StaticEnergy> = span
                .static_w
                .iter()
                .filter(|_| !expired)
                .filter(|(domain, package, _)| *domain == d.domain && *package == d.package)
                .map(|(domain, package, w)| StaticEnergy {
                    domain: *domain,
                    package: *package,
                    static_uj: (w * covers_ns as f64 / 1e3).round() as u64,
                })
                .collect();
            let shares = attribution::attribute(&Interval {
                packages: &h.packages,
                package_ids: span.package_ids,
                usage: &usage,
                energy: &[DomainEnergy {
                    energy_uj,
                    ..d.clone()
                }],
                gpus: &[],
                wall: None,
                statics: &statics,
                static_share: span.static_share,
            });
            out.shares.extend(shares);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::Domain;

    fn span<'a>(
        packages: &'a [PackageTime],
        usage: &'a [Usage],
        start_ns: u64,
        end_ns: u64,
    ) -> Span<'a> {
        Span {
            packages,
            package_ids: &[0],
            usage,
            start_ns,
            end_ns,
            static_w: &[],
            static_share: attribution::StaticShare::Capacity,
        }
    }

    fn pkg(uj: u64) -> DomainEnergy {
        DomainEnergy {
            domain: Domain::Package,
            package: Some(0),
            energy_uj: uj,
            estimated: false,
            busy_only: false,
        }
    }

    fn usage(id: ConsumerId, ns: u64) -> Usage {
        Usage {
            id,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[ns]),
        }
    }

    #[test]
    fn a_failed_read_is_divided_over_both_intervals_by_cpu_time() {
        let mut held = HeldReads::default();
        // Interval 1 (read failed): process 1 ran 300 ms of 1 s.
        let p1 = [PackageTime {
            busy_ns: 300_000_000,
            idle_ns: 700_000_000,
            lost_ns: 0,
        }];
        let u1 = [usage(1, 300_000_000)];
        assert!(
            held.hold(
                &[DomainKey::new(Domain::Package, Some(0))],
                &span(&p1, &u1, 0, 1_000_000_000)
            )
            .is_empty()
        );
        // Interval 2 (read good, covers both): process 2 ran 100 ms.
        let p2 = [PackageTime {
            busy_ns: 100_000_000,
            idle_ns: 900_000_000,
            lost_ns: 0,
        }];
        let u2 = [usage(2, 100_000_000)];
        let c = held.catch_up(
            &[pkg(20_000_000)],
            &span(&p2, &u2, 1_000_000_000, 2_000_000_000),
        );
        assert!(held.is_empty());
        assert_eq!(
            c.covers_ns,
            vec![(DomainKey::new(Domain::Package, Some(0)), 2_000_000_000)]
        );
        let s = &c.shares[0];
        let of = |id| s.attributed.iter().find(|(i, _)| *i == id).map(|(_, e)| *e);
        // 20 J over 2 s of CPU time: 300 ms is 3 J, 100 ms is 1 J.
        assert_eq!(of(1), Some(3_000_000), "{s:?}");
        assert_eq!(of(2), Some(1_000_000), "{s:?}");
        assert_eq!(s.idle_uj, 16_000_000);
        assert_eq!(
            s.attributed_uj() + s.idle_uj + s.unattributed_uj,
            s.measured_uj
        );
    }

    #[test]
    fn a_domain_unread_too_long_comes_back_as_0() {
        let mut held = HeldReads::default();
        let p = [PackageTime {
            busy_ns: 1_000_000_000,
            idle_ns: 0,
            lost_ns: 0,
        }];
        let u = [usage(1, 1_000_000_000)];
        let key = [DomainKey::new(Domain::Package, Some(0))];
        assert!(held.hold(&key, &span(&p, &u, 0, 1_000_000_000)).is_empty());
        let late = HELD_MAX_NS + 2_000_000_000;
        let said = held.hold(&key, &span(&p, &u, late - 1_000_000_000, late));
        assert_eq!(said.len(), 1, "{said:?}");
        assert!(
            held.hold(&key, &span(&p, &u, late, late + 1)).is_empty(),
            "said once"
        );
        let c = held.catch_up(&[pkg(5_000)], &span(&p, &u, late + 1, late + 2));
        assert_eq!(c.shares[0].measured_uj, 0);
        assert!(c.shares[0].attributed.is_empty());
    }
}
