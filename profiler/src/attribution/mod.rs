//! The attribution engine: a pure function from one interval's measured
//! CPU time and measured energy to each consumer's share of that energy.
//!
//! No I/O happens here. The rules, per interval:
//!
//! - **Package, core and DRAM energy of a package** is split into its
//!   static part (the domain's static power × the interval, given by the
//!   caller per domain and package) and the dynamic rest. The *dynamic*
//!   part goes to consumers by their on-CPU time on that package's CPUs
//!   over its busy time: what their running caused. The *static* part,
//!   under [`StaticShare::Capacity`] (the default), goes to each consumer
//!   by its share of the package's capacity (its on-CPU time over all the
//!   time that existed on those CPUs, busy + idle + lost): rent for the
//!   CPU time it held; the idle time's share is *idle* energy. So a
//!   program's energy depends on neither its neighbours nor the machine's
//!   size. [`StaticShare::Busy`] charges all of it by busy time (a machine
//!   rented whole), [`StaticShare::Idle`] none of it (all idle). A domain
//!   with no static figure is all static: divided by CPU time over all CPU
//!   time, as before this rule. A static figure above what was measured
//!   is cut to it (the dynamic part is then 0; the cut is reported). The
//!   share of lost time (threads the kernel map could not hold) and of any
//!   consumer not named is *unattributed*. A task that ran only on
//!   package 1 gets nothing of package 0's energy.
//! - **Busy-only energy** (the TDP model, which has no idle term, and a VM
//!   guest's energy exported by its host, which is its vCPU threads' run
//!   time: energy that exists only because tasks ran) goes to consumers by
//!   their share of busy time. A model with an idle term (vCPU watts) is
//!   divided like a counter.
//! - **Uncore, psys and a wattmeter's wall** energy is machine level:
//!   reported, and counted as unattributed.
//! - **Calibrated wall** energy (`--calibration`: `wall = a × x + b`) goes
//!   to each consumer as `a` times its package + DRAM + GPU energy (or its
//!   busy time, for a calibration against utilization); the static `b`
//!   and `a` times the idle energy are idle.
//! - **GPU energy** goes to the processes that held the GPU in the
//!   interval, by their share of its SM utilization (equally when none
//!   reported any); an interval in which no process held the GPU is idle
//!   energy. A process on the GPU that is not a known consumer is
//!   unattributed.
//!
//! Integer microjoules throughout: shares are rounded down and the
//! rounding goes to unattributed, so for every domain and interval
//! `attributed + idle + unattributed == measured`, exactly.

mod ledger;
pub mod stacks;
pub mod vms;

pub use ledger::{DomainTotals, EnergyBy, EnergyLedger};

use serde::Serialize;

use crate::sources::calibration::{WallModel, WallPer};
use crate::sources::{Domain, DomainEnergy};

/// Who energy is attributed to: an id the caller chooses (a process record).
pub type ConsumerId = u64;

/// One package's CPU time over an interval (summed over its CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PackageTime {
    /// Time charged to tasks.
    pub busy_ns: u64,
    /// Time charged to no task.
    pub idle_ns: u64,
    /// Time tasks ran that could not be recorded per task.
    pub lost_ns: u64,
}

impl PackageTime {
    /// All the CPU time that existed on the package.
    pub fn window_ns(&self) -> u64 {
        self.busy_ns + self.idle_ns + self.lost_ns
    }
}

/// One consumer's on-CPU time over an interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Usage {
    /// Who.
    pub id: ConsumerId,
    /// Nanoseconds on CPU per dense package index.
    pub on_cpu_ns: Vec<u64>,
}

/// One GPU over an interval.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuInterval {
    /// NVML index.
    pub index: u32,
    /// Energy measured (µJ).
    pub energy_uj: u64,
    /// Integrated from power samples rather than read from a counter.
    pub estimated: bool,
    /// The processes that held it: their consumer (`None`: not a known
    /// consumer) and SM utilization (percent).
    pub processes: Vec<(Option<ConsumerId>, u32)>,
}

/// How a domain's static energy is shared (`--static-power`).
#[derive(
    Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize, clap::ValueEnum,
)]
#[serde(rename_all = "snake_case")]
pub enum StaticShare {
    /// By each consumer's share of the package's capacity (its CPU time
    /// over CPUs × interval); the rest is idle.
    #[default]
    Capacity,
    /// All of it by busy time, to whoever ran: the cost of a machine
    /// rented whole.
    Busy,
    /// None of it to consumers: all idle.
    Idle,
}

impl StaticShare {
    /// Its name in reports and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Self::Capacity => "capacity",
            Self::Busy => "busy",
            Self::Idle => "idle",
        }
    }
}

/// A domain's static energy over one interval (µJ): its static power ×
/// the interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StaticEnergy {
    /// Which domain.
    pub domain: Domain,
    /// Its package (`None`: a machine-wide model's domain).
    pub package: Option<u32>,
    /// Static power × the interval (µJ).
    pub static_uj: u64,
}

/// Everything one interval measured.
#[derive(Clone, Copy, Debug, Default)]
pub struct Interval<'a> {
    /// CPU time per dense package index.
    pub packages: &'a [PackageTime],
    /// The kernel's package id of each dense package index.
    pub package_ids: &'a [u32],
    /// Per-consumer on-CPU time.
    pub usage: &'a [Usage],
    /// CPU-side energy (RAPL domains, wattmeter).
    pub energy: &'a [DomainEnergy],
    /// GPUs.
    pub gpus: &'a [GpuInterval],
    /// How the wall domain is divided, where a calibration models it.
    pub wall: Option<WallModel>,
    /// Static energy per divided domain (package, core, DRAM); a domain
    /// not listed is all static.
    pub statics: &'a [StaticEnergy],
    /// How static energy is shared.
    pub static_share: StaticShare,
}

/// How a domain's energy was divided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Basis {
    /// By on-CPU time over all CPU time of the package(s); idle time's share
    /// is idle energy.
    CpuTime,
    /// By share of busy time (energy that exists only because tasks ran:
    /// a model with no idle term, a host's export to its VM guest).
    BusyTime,
    /// By share of SM utilization among the GPU's processes.
    GpuSm,
    /// Not divided: machine level (uncore, psys, a wattmeter's wall).
    MachineLevel,
    /// A calibration's wall energy: the slope times each consumer's
    /// counter energy (or busy time); the static power and the slope
    /// times idle energy are idle.
    Calibrated,
}

impl Basis {
    /// Its name in the recording.
    pub fn name(self) -> &'static str {
        match self {
            Self::CpuTime => "cpu_time",
            Self::BusyTime => "busy_time",
            Self::GpuSm => "gpu_sm",
            Self::MachineLevel => "machine_level",
            Self::Calibrated => "calibrated",
        }
    }
}

/// One domain's energy over one interval, divided.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DomainShare {
    /// Which domain.
    pub domain: Domain,
    /// Kernel package id, GPU index, or `None` (machine level).
    pub package: Option<u32>,
    /// Modelled rather than measured.
    pub estimated: bool,
    /// How it was divided.
    pub basis: Basis,
    /// What the reader measured (µJ).
    pub measured_uj: u64,
    /// The idle share (µJ).
    pub idle_uj: u64,
    /// Neither attributed nor idle: lost time, unknown consumers, machine
    /// level domains, rounding (µJ).
    pub unattributed_uj: u64,
    /// Per consumer (µJ), only non-zero shares.
    pub attributed: Vec<(ConsumerId, u64)>,
    /// The static part of each consumer's share (µJ), only non-zero ones.
    pub attributed_static: Vec<(ConsumerId, u64)>,
    /// The domain's static energy in this interval, within the measured
    /// (the static figure × the interval, cut to what was measured; a
    /// calibrated wall's `b`; 0 for busy-only and GPU energy).
    pub static_uj: u64,
    /// How much the static figure exceeded what was measured (µJ): the
    /// dynamic part would have been negative.
    pub static_cut_uj: u64,
}

impl DomainShare {
    /// Sum of the attributed shares.
    pub fn attributed_uj(&self) -> u64 {
        self.attributed.iter().map(|(_, e)| e).sum()
    }
}

/// `e × part / whole`, rounded down, without overflow.
fn share(e: u64, part: u64, whole: u64) -> u64 {
    if whole == 0 {
        return 0;
    }
    (u128::from(e) * u128::from(part) / u128::from(whole)) as u64
}

/// Builds a share from per-consumer weights and an idle weight out of a
/// total weight; whatever is left is unattributed.
fn divide(
    mut base: DomainShare,
    weights: impl Iterator<Item = (ConsumerId, u64)>,
    idle_weight: u64,
    total_weight: u64,
) -> DomainShare {
    let e = base.measured_uj;
    base.attributed = weights
        .map(|(id, w)| (id, share(e, w, total_weight)))
        .filter(|(_, uj)| *uj > 0)
        .collect();
    base.idle_uj = share(e, idle_weight, total_weight);
    base.unattributed_uj = e - base.attributed_uj() - base.idle_uj;
    base
}

fn cpu_share(iv: &Interval<'_>, d: &DomainEnergy) -> DomainShare {
    let base = DomainShare {
        domain: d.domain,
        package: d.package,
        estimated: d.estimated,
        basis: Basis::CpuTime,
        measured_uj: d.energy_uj,
        idle_uj: 0,
        unattributed_uj: d.energy_uj,
        attributed: Vec::new(),
        attributed_static: Vec::new(),
        static_uj: 0,
        static_cut_uj: 0,
    };
    // The packages this energy was spent on: one package, or all of them.
    let packages: Vec<usize> = match d.package {
        Some(p) => match iv.package_ids.iter().position(|id| *id == p) {
            Some(s) => vec![s],
            // A package the tracker does not know: nothing to divide by.
            None => return base,
        },
        None => (0..iv.packages.len()).collect(),
    };
    let on = |u: &Usage| -> u64 {
        packages
            .iter()
            .map(|s| u.on_cpu_ns.get(*s).copied().unwrap_or(0))
            .sum()
    };
    let times: Vec<PackageTime> = packages
        .iter()
        .filter_map(|s| iv.packages.get(*s).copied())
        .collect();
    let consumed: u64 = iv.usage.iter().map(on).sum();
    if d.busy_only {
        // Lost time's share (tasks the map could not hold) is unattributed.
        let busy = times
            .iter()
            .map(|t| t.busy_ns + t.lost_ns)
            .sum::<u64>()
            .max(consumed);
        return divide(
            DomainShare {
                basis: Basis::BusyTime,
                ..base
            },
            iv.usage.iter().map(|u| (u.id, on(u))),
            0,
            busy,
        );
    }
    let idle: u64 = times.iter().map(|t| t.idle_ns).sum();
    let lost: u64 = times.iter().map(|t| t.lost_ns).sum();
    let window: u64 = times.iter().map(PackageTime::window_ns).sum();
    // Consumers' time cannot exceed the busy time; if a caller passes more,
    // divide by the larger totals so shares never exceed what was measured.
    let capacity = window.max(consumed + idle + lost);
    let busy = times
        .iter()
        .map(|t| t.busy_ns + t.lost_ns)
        .sum::<u64>()
        .max(consumed);
    let e = d.energy_uj;
    let figure = iv
        .statics
        .iter()
        .find(|s| s.domain == d.domain && s.package == d.package)
        .map(|s| s.static_uj);
    // No static figure: all of it is static (the CPU-time rule).
    let static_uj = figure.unwrap_or(e).min(e);
    let static_cut_uj = figure.map_or(0, |f| f.saturating_sub(e));
    let dynamic_uj = e - static_uj;
    // Static: by capacity (idle's share is idle), by busy time, or idle.
    // With no figure the whole is divided by CPU time over all CPU time,
    // as before static power, whatever the policy.
    let rule = if figure.is_some() {
        iv.static_share
    } else {
        StaticShare::Capacity
    };
    let (static_total, static_idle_w) = match rule {
        StaticShare::Capacity => (capacity, idle),
        StaticShare::Busy => (busy, 0),
        StaticShare::Idle => (0, 0),
    };
    let mut attributed_static: Vec<(ConsumerId, u64)> = Vec::new();
    let mut attributed: Vec<(ConsumerId, u64)> = Vec::new();
    let mut idle_uj = 0;
    if static_total > 0 {
        attributed_static = iv
            .usage
            .iter()
            .map(|u| (u.id, share(static_uj, on(u), static_total)))
            .filter(|(_, uj)| *uj > 0)
            .collect();
        idle_uj += share(static_uj, static_idle_w, static_total);
    } else {
        // Idle policy, or a package that had no time at all.
        idle_uj += static_uj;
    }
    if busy > 0 {
        attributed = iv
            .usage
            .iter()
            .map(|u| (u.id, share(dynamic_uj, on(u), busy)))
            .filter(|(_, uj)| *uj > 0)
            .collect();
    } else {
        // Nothing ran: what the static figure left is idle.
        idle_uj += dynamic_uj;
    }
    for (id, uj) in &attributed_static {
        match attributed.iter_mut().find(|(a, _)| a == id) {
            Some(a) => a.1 += uj,
            None => attributed.push((*id, *uj)),
        }
    }
    let mut out = DomainShare {
        attributed,
        attributed_static,
        idle_uj,
        static_uj,
        static_cut_uj,
        ..base
    };
    out.unattributed_uj = e - out.attributed_uj() - out.idle_uj;
    out
}

fn gpu_share(g: &GpuInterval) -> DomainShare {
    let base = DomainShare {
        domain: Domain::Gpu,
        package: Some(g.index),
        estimated: g.estimated,
        basis: Basis::GpuSm,
        measured_uj: g.energy_uj,
        idle_uj: 0,
        unattributed_uj: g.energy_uj,
        attributed: Vec::new(),
        attributed_static: Vec::new(),
        static_uj: 0,
        static_cut_uj: 0,
    };
    if g.processes.is_empty() {
        return DomainShare {
            idle_uj: g.energy_uj,
            unattributed_uj: 0,
            ..base
        };
    }
    let sm_total: u64 = g.processes.iter().map(|(_, sm)| u64::from(*sm)).sum();
    // No process reported SM activity (NVML's per-process samples can be
    // empty over a short interval): they held the GPU together, equally.
    let weight = |sm: u32| if sm_total == 0 { 1 } else { u64::from(sm) };
    let total: u64 = g.processes.iter().map(|(_, sm)| weight(*sm)).sum();
    let mut merged: Vec<(ConsumerId, u64)> = Vec::new();
    for (id, sm) in &g.processes {
        let Some(id) = id else { continue };
        match merged.iter_mut().find(|(m, _)| m == id) {
            Some(m) => m.1 += weight(*sm),
            None => merged.push((*id, weight(*sm))),
        }
    }
    divide(base, merged.into_iter(), 0, total)
}

/// Divides one interval's energy among consumers, domain by domain.
pub fn attribute(iv: &Interval<'_>) -> Vec<DomainShare> {
    let mut out: Vec<DomainShare> = iv
        .energy
        .iter()
        .map(|d| match d.domain {
            Domain::Package | Domain::Core | Domain::Dram => cpu_share(iv, d),
            Domain::Uncore | Domain::Psys | Domain::Wall | Domain::Gpu => DomainShare {
                domain: d.domain,
                package: d.package,
                estimated: d.estimated,
                basis: Basis::MachineLevel,
                measured_uj: d.energy_uj,
                idle_uj: 0,
                unattributed_uj: d.energy_uj,
                attributed: Vec::new(),
                attributed_static: Vec::new(),
                static_uj: 0,
                static_cut_uj: 0,
            },
        })
        .collect();
    out.extend(iv.gpus.iter().map(gpu_share));
    // The calibrated wall is divided after the domains it scales.
    if let Some(model) = iv.wall
        && let Some(i) = out.iter().position(|s| s.domain == Domain::Wall)
    {
        out[i] = wall_share(iv, &model, out[i].clone(), &out);
    }
    out
}

/// A calibrated wall domain divided: each consumer gets the slope times
/// its counter energy (or busy time), idle gets the static energy plus
/// the slope times the counters' idle energy, the rest is unattributed.
fn wall_share(
    iv: &Interval<'_>,
    m: &WallModel,
    base: DomainShare,
    shares: &[DomainShare],
) -> DomainShare {
    let e = base.measured_uj;
    let scale = |uj: u64| (m.a * uj as f64).floor().max(0.0) as u64;
    let counted =
        |s: &&DomainShare| matches!(s.domain, Domain::Package | Domain::Dram | Domain::Gpu);
    let mut per: Vec<(ConsumerId, u64)> = Vec::new();
    let mut idle_counters = 0u64;
    let add = |v: &mut Vec<(ConsumerId, u64)>, id: ConsumerId, uj: u64| match v
        .iter_mut()
        .find(|(c, _)| *c == id)
    {
        Some(p) => p.1 += uj,
        None => v.push((id, uj)),
    };
    match m.per {
        WallPer::CounterEnergy => {
            for s in shares.iter().filter(counted) {
                idle_counters += s.idle_uj;
                for (id, uj) in &s.attributed {
                    add(&mut per, *id, *uj);
                }
            }
        }
        WallPer::BusyTime => {
            // ns / 1e3 = µs: W per busy CPU × µs = µJ.
            per = iv
                .usage
                .iter()
                .map(|u| (u.id, u.on_cpu_ns.iter().sum::<u64>() / 1000))
                .collect();
        }
    }
    let mut left = e;
    let attributed: Vec<(ConsumerId, u64)> = per
        .into_iter()
        .map(|(id, w)| {
            let uj = scale(w).min(left);
            left -= uj;
            (id, uj)
        })
        .filter(|(_, uj)| *uj > 0)
        .collect();
    let idle = m.static_uj.saturating_add(scale(idle_counters)).min(left);
    // The wall's static energy is the node's `b`, inside idle: what each
    // consumer gets is the slope times its counter energy (whose static
    // part the counters' domains report), none of it the wall's static.
    DomainShare {
        basis: Basis::Calibrated,
        static_uj: m.static_uj.min(idle),
        idle_uj: idle,
        unattributed_uj: left - idle,
        attributed,
        ..base
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(domain: Domain, package: Option<u32>, uj: u64) -> DomainEnergy {
        DomainEnergy {
            domain,
            package,
            energy_uj: uj,
            estimated: false,
            busy_only: false,
        }
    }

    fn conserved(shares: &[DomainShare]) {
        for s in shares {
            assert_eq!(
                s.attributed_uj() + s.idle_uj + s.unattributed_uj,
                s.measured_uj,
                "{s:?}"
            );
        }
    }

    fn get(shares: &[DomainShare], d: Domain, p: Option<u32>) -> &DomainShare {
        shares
            .iter()
            .find(|s| s.domain == d && s.package == p)
            .expect("domain present")
    }

    fn of(s: &DomainShare, id: ConsumerId) -> u64 {
        s.attributed
            .iter()
            .find(|(c, _)| *c == id)
            .map_or(0, |(_, e)| *e)
    }

    /// Two packages (kernel ids 0 and 1), 2 CPUs each, 1 s interval: 2 s of
    /// CPU time per package.
    fn two_packages() -> Vec<PackageTime> {
        vec![
            PackageTime {
                busy_ns: 1_500_000_000,
                idle_ns: 500_000_000,
                lost_ns: 0,
            },
            PackageTime {
                busy_ns: 600_000_000,
                idle_ns: 1_300_000_000,
                lost_ns: 100_000_000,
            },
        ]
    }

    #[test]
    fn per_package_energy_goes_only_to_tasks_that_ran_there() {
        let packages = two_packages();
        let usage = vec![
            // Ran only on package 0.
            Usage {
                id: 1,
                on_cpu_ns: vec![1_000_000_000, 0],
            },
            // Ran on both.
            Usage {
                id: 2,
                on_cpu_ns: vec![500_000_000, 600_000_000],
            },
        ];
        let energy = vec![
            e(Domain::Package, Some(0), 100_000_000),
            e(Domain::Package, Some(1), 40_000_000),
            e(Domain::Dram, Some(1), 8_000_000),
        ];
        let shares = attribute(&Interval {
            packages: &packages,
            package_ids: &[0, 1],
            usage: &usage,
            energy: &energy,
            gpus: &[],
            wall: None,
            ..Default::default()
        });
        conserved(&shares);
        let p0 = get(&shares, Domain::Package, Some(0));
        assert_eq!(of(p0, 1), 50_000_000);
        assert_eq!(of(p0, 2), 25_000_000);
        assert_eq!(p0.idle_uj, 25_000_000);
        assert_eq!(p0.unattributed_uj, 0);
        let p1 = get(&shares, Domain::Package, Some(1));
        assert_eq!(of(p1, 1), 0, "task 1 never ran on package 1");
        assert_eq!(of(p1, 2), 12_000_000);
        assert_eq!(p1.idle_uj, 26_000_000);
        // Lost time's share (0.1 of 2 s) is unattributed, never idle.
        assert_eq!(p1.unattributed_uj, 2_000_000);
        let d1 = get(&shares, Domain::Dram, Some(1));
        assert_eq!(of(d1, 2), 2_400_000);
        assert_eq!(d1.basis, Basis::CpuTime);
    }

    #[test]
    fn conservation_holds_with_rounding_for_every_domain() {
        let packages = vec![PackageTime {
            busy_ns: 999_999_999,
            idle_ns: 1_000_000_003,
            lost_ns: 7,
        }];
        let usage: Vec<Usage> = (0..333)
            .map(|i| Usage {
                id: i,
                on_cpu_ns: vec![3_003_003],
            })
            .collect();
        let energy = vec![
            e(Domain::Package, Some(0), 12_345_677),
            e(Domain::Core, Some(0), 9_999_991),
            e(Domain::Uncore, Some(0), 1_111),
            e(Domain::Dram, Some(0), 3),
            e(Domain::Psys, None, 77_777_777),
            e(Domain::Wall, None, 99_999_999),
        ];
        let gpus = vec![GpuInterval {
            index: 0,
            energy_uj: 1_000_001,
            estimated: false,
            processes: vec![(Some(1), 33), (Some(2), 33), (None, 34)],
        }];
        let shares = attribute(&Interval {
            packages: &packages,
            package_ids: &[0],
            usage: &usage,
            energy: &energy,
            gpus: &gpus,
            wall: None,
            ..Default::default()
        });
        assert_eq!(shares.len(), 7);
        conserved(&shares);
        for d in [Domain::Uncore, Domain::Psys, Domain::Wall] {
            let s = shares.iter().find(|s| s.domain == d).expect("present");
            assert_eq!(s.basis, Basis::MachineLevel);
            assert_eq!(s.unattributed_uj, s.measured_uj);
        }
        // Rounding loses under one µJ per consumer.
        let p = get(&shares, Domain::Package, Some(0));
        assert!(p.unattributed_uj <= 334, "{}", p.unattributed_uj);
    }

    #[test]
    fn idle_energy_is_the_idle_share_and_a_machine_with_nothing_running_is_all_idle() {
        let packages = vec![PackageTime {
            busy_ns: 0,
            idle_ns: 2_000_000_000,
            lost_ns: 0,
        }];
        let energy = vec![e(Domain::Package, Some(0), 30_000_000)];
        let shares = attribute(&Interval {
            packages: &packages,
            package_ids: &[0],
            usage: &[],
            energy: &energy,
            gpus: &[],
            wall: None,
            ..Default::default()
        });
        assert_eq!(shares[0].idle_uj, 30_000_000);
        assert!(shares[0].attributed.is_empty());
    }

    #[test]
    fn a_task_that_exited_mid_interval_gets_its_share() {
        // The tracker reports an exited thread's final time in the interval
        // of its exit; the engine needs no notion of exit: its time counts.
        let packages = vec![PackageTime {
            busy_ns: 1_000_000_000,
            idle_ns: 1_000_000_000,
            lost_ns: 0,
        }];
        let usage = vec![
            Usage {
                id: 7,
                on_cpu_ns: vec![10_000_000],
            },
            Usage {
                id: 8,
                on_cpu_ns: vec![990_000_000],
            },
        ];
        let energy = vec![e(Domain::Package, Some(0), 20_000_000)];
        let shares = attribute(&Interval {
            packages: &packages,
            package_ids: &[0],
            usage: &usage,
            energy: &energy,
            gpus: &[],
            wall: None,
            ..Default::default()
        });
        assert_eq!(of(&shares[0], 7), 100_000);
        assert_eq!(of(&shares[0], 8), 9_900_000);
    }

    #[test]
    fn estimated_energy_is_divided_by_busy_time_with_no_idle_share() {
        let packages = two_packages();
        let usage = vec![
            Usage {
                id: 1,
                on_cpu_ns: vec![1_500_000_000, 0],
            },
            Usage {
                id: 2,
                on_cpu_ns: vec![0, 600_000_000],
            },
        ];
        let energy = vec![DomainEnergy {
            domain: Domain::Package,
            package: None,
            // 2.2 s of task time (0.1 s of it lost): 1 µJ per µs.
            energy_uj: 2_200_000,
            estimated: true,
            busy_only: true,
        }];
        let shares = attribute(&Interval {
            packages: &packages,
            package_ids: &[0, 1],
            usage: &usage,
            energy: &energy,
            gpus: &[],
            wall: None,
            ..Default::default()
        });
        conserved(&shares);
        assert_eq!(shares[0].basis, Basis::BusyTime);
        assert_eq!(of(&shares[0], 1), 1_500_000);
        assert_eq!(of(&shares[0], 2), 600_000);
        assert_eq!(shares[0].idle_uj, 0);
        // Lost time's share is unattributed.
        assert_eq!(shares[0].unattributed_uj, 100_000);
        assert!(shares[0].estimated);
        // A model with an idle term is divided like a counter: idle time's
        // share is idle energy.
        let with_idle = [DomainEnergy {
            busy_only: false,
            ..energy[0].clone()
        }];
        let shares = attribute(&Interval {
            packages: &packages,
            package_ids: &[0, 1],
            usage: &usage,
            energy: &with_idle,
            gpus: &[],
            wall: None,
            ..Default::default()
        });
        conserved(&shares);
        assert_eq!(shares[0].basis, Basis::CpuTime);
        assert!(
            shares[0].idle_uj > 0 && shares[0].estimated,
            "{:?}",
            shares[0]
        );
    }

    #[test]
    fn a_calibrated_wall_scales_each_consumer_and_keeps_static_power_idle() {
        let packages = two_packages();
        let usage = vec![
            Usage {
                id: 1,
                on_cpu_ns: vec![1_500_000_000, 0],
            },
            Usage {
                id: 2,
                on_cpu_ns: vec![0, 600_000_000],
            },
        ];
        // 1 J per package, wall = 1.5 × 2 J + 10 J static.
        let energy = vec![
            e(Domain::Package, Some(0), 1_000_000),
            e(Domain::Package, Some(1), 1_000_000),
            e(Domain::Wall, None, 13_000_000),
        ];
        let model = WallModel {
            a: 1.5,
            per: WallPer::CounterEnergy,
            static_uj: 10_000_000,
        };
        let iv = |wall| Interval {
            packages: &packages,
            package_ids: &[0, 1],
            usage: &usage,
            energy: &energy,
            gpus: &[],
            wall,
            ..Default::default()
        };
        let shares = attribute(&iv(Some(model)));
        conserved(&shares);
        let cpu = |id| {
            of(get(&shares, Domain::Package, Some(0)), id)
                + of(get(&shares, Domain::Package, Some(1)), id)
        };
        let wall = get(&shares, Domain::Wall, None);
        assert_eq!(wall.basis, Basis::Calibrated);
        for id in [1, 2] {
            let want = (1.5 * cpu(id) as f64).floor() as u64;
            assert_eq!(of(wall, id), want, "consumer {id}");
        }
        assert_eq!(wall.static_uj, 10_000_000);
        assert!(wall.idle_uj >= wall.static_uj);
        // Without a model the wall is machine level, all unattributed.
        let shares = attribute(&iv(None));
        let wall = get(&shares, Domain::Wall, None);
        assert_eq!(
            (wall.basis, wall.unattributed_uj),
            (Basis::MachineLevel, 13_000_000)
        );
        // A slope that would give more than was measured never does.
        let greedy = WallModel { a: 100.0, ..model };
        let shares = attribute(&iv(Some(greedy)));
        conserved(&shares);
    }

    #[test]
    fn gpu_energy_is_split_by_sm_share_and_idle_when_nobody_holds_it() {
        let gpus = vec![
            GpuInterval {
                index: 0,
                energy_uj: 300_000_000,
                estimated: false,
                processes: vec![(Some(1), 60), (Some(2), 30)],
            },
            GpuInterval {
                index: 1,
                energy_uj: 50_000_000,
                estimated: false,
                processes: vec![],
            },
            GpuInterval {
                index: 2,
                energy_uj: 90_000_000,
                estimated: true,
                processes: vec![(Some(3), 0)],
            },
        ];
        let shares = attribute(&Interval {
            packages: &[],
            package_ids: &[],
            usage: &[],
            energy: &[],
            gpus: &gpus,
            wall: None,
            ..Default::default()
        });
        conserved(&shares);
        let g0 = get(&shares, Domain::Gpu, Some(0));
        assert_eq!(of(g0, 1), 200_000_000);
        assert_eq!(of(g0, 2), 100_000_000);
        assert_eq!(g0.idle_uj, 0);
        let g1 = get(&shares, Domain::Gpu, Some(1));
        assert_eq!(g1.idle_uj, 50_000_000);
        // The only process on the GPU gets all of it, even with no SM sample.
        let g2 = get(&shares, Domain::Gpu, Some(2));
        assert_eq!(of(g2, 3), 90_000_000);
        assert!(g2.estimated);
    }

    #[test]
    fn energy_of_a_package_the_tracker_does_not_know_is_unattributed() {
        let packages = vec![PackageTime {
            busy_ns: 1,
            idle_ns: 1,
            lost_ns: 0,
        }];
        let usage = vec![Usage {
            id: 1,
            on_cpu_ns: vec![1],
        }];
        let energy = vec![e(Domain::Package, Some(5), 1_000)];
        let shares = attribute(&Interval {
            packages: &packages,
            package_ids: &[0],
            usage: &usage,
            energy: &energy,
            gpus: &[],
            wall: None,
            ..Default::default()
        });
        assert_eq!(shares[0].unattributed_uj, 1_000);
    }

    /// One package of 4 CPUs over 1 s (4 s of CPU time): static S =
    /// 23.7 W, k = 11.3 W per busy CPU. Consumer 1 ran 1.5 s, consumer 2
    /// 0.5 s, 0.2 s was lost, 1.8 s idle: 2.2 busy CPUs.
    fn static_interval(
        share: StaticShare,
        static_uj: Option<u64>,
        measured_uj: u64,
        f: impl FnOnce(&[DomainShare]),
    ) {
        let packages = [PackageTime {
            busy_ns: 2_000_000_000,
            idle_ns: 1_800_000_000,
            lost_ns: 200_000_000,
        }];
        let usage = [
            Usage {
                id: 1,
                on_cpu_ns: vec![1_500_000_000],
            },
            Usage {
                id: 2,
                on_cpu_ns: vec![500_000_000],
            },
        ];
        let statics: Vec<StaticEnergy> = static_uj
            .map(|uj| StaticEnergy {
                domain: Domain::Package,
                package: Some(0),
                static_uj: uj,
            })
            .into_iter()
            .collect();
        let shares = attribute(&Interval {
            packages: &packages,
            package_ids: &[0],
            usage: &usage,
            energy: &[e(Domain::Package, Some(0), measured_uj)],
            statics: &statics,
            static_share: share,
            ..Default::default()
        });
        conserved(&shares);
        f(&shares);
    }

    const S_UJ: u64 = 23_700_000;
    /// S + k × 2.2 busy CPUs over 1 s.
    const MEASURED_UJ: u64 = 23_700_000 + 11_300_000 * 22 / 10;

    fn static_of(s: &DomainShare, id: ConsumerId) -> u64 {
        s.attributed_static
            .iter()
            .find(|(c, _)| *c == id)
            .map_or(0, |(_, e)| *e)
    }

    #[test]
    fn each_gets_what_it_caused_plus_rent_for_the_capacity_it_held() {
        static_interval(StaticShare::Capacity, Some(S_UJ), MEASURED_UJ, |shares| {
            let s = get(shares, Domain::Package, Some(0));
            assert_eq!(s.static_uj, S_UJ);
            // k × its busy time + S × its CPU time / (4 CPUs × 1 s), to
            // the µJ (each part rounded down).
            assert_eq!(of(s, 1), 11_300_000 * 15 / 10 + S_UJ * 15 / 40);
            assert_eq!(of(s, 2), 11_300_000 * 5 / 10 + S_UJ * 5 / 40);
            assert_eq!(static_of(s, 1), S_UJ * 15 / 40);
            assert_eq!(static_of(s, 2), S_UJ * 5 / 40);
            // Idle: S × the idle share; lost time's dynamic and static
            // shares are unattributed.
            assert_eq!(s.idle_uj, S_UJ * 18 / 40);
            assert_eq!(
                s.unattributed_uj,
                11_300_000 * 2 / 10 + S_UJ * 2 / 40,
                "lost time's share (no rounding left: every share is whole)"
            );
            assert_eq!(s.static_cut_uj, 0);
        });
    }

    #[test]
    fn a_consumers_energy_does_not_depend_on_its_neighbour() {
        // Consumer 1 alone (1.5 s busy, 2.5 s idle) and beside consumer 2
        // (as above): the same energy, because the power followed the
        // load.
        let alone = [PackageTime {
            busy_ns: 1_500_000_000,
            idle_ns: 2_500_000_000,
            lost_ns: 0,
        }];
        let usage = [Usage {
            id: 1,
            on_cpu_ns: vec![1_500_000_000],
        }];
        let statics = [StaticEnergy {
            domain: Domain::Package,
            package: Some(0),
            static_uj: S_UJ,
        }];
        let shares = attribute(&Interval {
            packages: &alone,
            package_ids: &[0],
            usage: &usage,
            energy: &[e(Domain::Package, Some(0), S_UJ + 11_300_000 * 15 / 10)],
            statics: &statics,
            ..Default::default()
        });
        let alone_j = of(get(&shares, Domain::Package, Some(0)), 1);
        static_interval(StaticShare::Capacity, Some(S_UJ), MEASURED_UJ, |shares| {
            assert_eq!(of(get(shares, Domain::Package, Some(0)), 1), alone_j);
        });
    }

    #[test]
    fn busy_charges_all_static_to_who_ran_and_idle_none() {
        static_interval(StaticShare::Busy, Some(S_UJ), MEASURED_UJ, |shares| {
            let s = get(shares, Domain::Package, Some(0));
            // By busy time (2.2 s with lost): 1.5/2.2 of everything.
            assert_eq!(of(s, 1), 11_300_000 * 15 / 10 + S_UJ * 15 / 22);
            assert_eq!(static_of(s, 1), S_UJ * 15 / 22);
            assert_eq!(s.idle_uj, 0);
        });
        static_interval(StaticShare::Idle, Some(S_UJ), MEASURED_UJ, |shares| {
            let s = get(shares, Domain::Package, Some(0));
            assert_eq!(of(s, 1), 11_300_000 * 15 / 10);
            assert_eq!(static_of(s, 1), 0);
            assert_eq!(s.idle_uj, S_UJ);
        });
    }

    #[test]
    fn a_static_figure_above_the_measured_is_cut_and_said() {
        // 30 J static, 25 J measured: all of it static, 5 J cut.
        static_interval(
            StaticShare::Capacity,
            Some(30_000_000),
            25_000_000,
            |shares| {
                let s = get(shares, Domain::Package, Some(0));
                assert_eq!((s.static_uj, s.static_cut_uj), (25_000_000, 5_000_000));
                assert_eq!(of(s, 1), 25_000_000 * 15 / 40, "no dynamic part");
                assert_eq!(s.idle_uj, 25_000_000 * 18 / 40);
            },
        );
    }

    #[test]
    fn no_static_figure_divides_by_cpu_time_as_before_whatever_the_rule() {
        for rule in [StaticShare::Capacity, StaticShare::Busy, StaticShare::Idle] {
            static_interval(rule, None, 40_000_000, |shares| {
                let s = get(shares, Domain::Package, Some(0));
                assert_eq!(of(s, 1), 40_000_000 * 15 / 40, "{rule:?}");
                assert_eq!(of(s, 2), 40_000_000 * 5 / 40, "{rule:?}");
                assert_eq!(s.idle_uj, 40_000_000 * 18 / 40, "{rule:?}");
                assert_eq!(s.static_uj, 40_000_000);
            });
        }
    }
}
