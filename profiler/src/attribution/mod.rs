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

mod energy;
pub(crate) mod stacks;

pub(crate) use energy::EnergyBy;

use crate::sources::calibration::{WallModel, WallPer};
pub(crate) use crate::sources::nvml::statics::GpuStaticEnergy;
use crate::sources::{Domain, DomainEnergy, DomainKey};

/// Who energy is attributed to: an id the caller chooses (a process record).
pub(crate) type ConsumerId = u64;

/// One package's CPU time over an interval (summed over its CPUs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct PackageTime {
    /// Time charged to tasks.
    pub(crate) busy_ns: u64,
    /// Time charged to no task.
    pub(crate) idle_ns: u64,
    /// Time tasks ran that could not be recorded per task.
    pub(crate) lost_ns: u64,
}

impl PackageTime {
    /// All the CPU time that existed on the package.
    pub(crate) fn window_ns(&self) -> u64 {
        self.busy_ns + self.idle_ns + self.lost_ns
    }
}

/// One consumer's on-CPU time over an interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Usage {
    /// Who.
    pub(crate) id: ConsumerId,
    /// Nanoseconds on CPU per dense package index.
    pub(crate) on_cpu_ns: crate::tracker::PackageNs,
}

/// One GPU over an interval.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GpuInterval {
    /// NVML index.
    pub(crate) index: u32,
    /// Energy measured (µJ).
    pub(crate) energy_uj: u64,
    /// Integrated from power samples rather than read from a counter.
    pub(crate) estimated: bool,
    /// The processes that held it: their consumer (`None`: not a known
    /// consumer) and SM utilization (thousandths of a percent).
    pub(crate) processes: Vec<(Option<ConsumerId>, u32)>,
    /// Work no listed process did (MIG: a busy instance with none listed),
    /// on the processes' scale: its share of the dynamic energy stays
    /// unattributed.
    pub(crate) unheld: u32,
    /// Its static energy over the interval (0 where not known yet).
    pub(crate) statics: GpuStaticEnergy,
    /// No process holds it, and `processes` are the last holders while
    /// its power settles from their work: they get the energy above the
    /// idle figure only, under every `--static-power` rule.
    pub(crate) settling: bool,
}

/// How a domain's static energy is shared (`--static-power`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum StaticShare {
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
    pub(crate) fn name(self) -> &'static str {
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
pub(crate) struct StaticEnergy {
    /// Which domain.
    pub(crate) domain: Domain,
    /// Its package (`None`: a machine-wide model's domain).
    pub(crate) package: Option<u32>,
    /// Static power × the interval (µJ).
    pub(crate) static_uj: u64,
}

/// Everything one interval measured.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Interval<'a> {
    /// CPU time per dense package index.
    pub(crate) packages: &'a [PackageTime],
    /// The kernel's package id of each dense package index.
    pub(crate) package_ids: &'a [u32],
    /// Per-consumer on-CPU time.
    pub(crate) usage: &'a [Usage],
    /// CPU-side energy (RAPL domains, wattmeter).
    pub(crate) energy: &'a [DomainEnergy],
    /// GPUs.
    pub(crate) gpus: &'a [GpuInterval],
    /// How the wall domain is divided, where a calibration models it.
    pub(crate) wall: Option<WallModel>,
    /// Static energy per divided domain (package, core, DRAM); a domain
    /// not listed is all static.
    pub(crate) statics: &'a [StaticEnergy],
    /// How static energy is shared.
    pub(crate) static_share: StaticShare,
}

/// How a domain's energy was divided.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Basis {
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
    pub(crate) fn name(self) -> &'static str {
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
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DomainShare {
    /// Which domain.
    pub(crate) key: DomainKey,
    /// Modelled rather than measured.
    pub(crate) estimated: bool,
    /// How it was divided.
    pub(crate) basis: Basis,
    /// What the reader measured (µJ).
    pub(crate) measured_uj: u64,
    /// The idle share (µJ).
    pub(crate) idle_uj: u64,
    /// Neither attributed nor idle: lost time, unknown consumers, machine
    /// level domains, rounding (µJ).
    pub(crate) unattributed_uj: u64,
    /// Per consumer (µJ), only non-zero shares.
    pub(crate) attributed: Vec<(ConsumerId, u64)>,
    /// The static part of each consumer's share (µJ), only non-zero ones.
    pub(crate) attributed_static: Vec<(ConsumerId, u64)>,
    /// The domain's static energy in this interval, within the measured
    /// (the static figure × the interval, cut to what was measured; a
    /// calibrated wall's `b`; a GPU's idle and held power × the interval;
    /// 0 for busy-only energy).
    pub(crate) static_uj: u64,
    /// How much the static figure exceeded what was measured (µJ): the
    /// dynamic part would have been negative.
    pub(crate) static_cut_uj: u64,
}

impl DomainShare {
    /// Sum of the attributed shares.
    pub(crate) fn attributed_uj(&self) -> u64 {
        self.attributed.iter().map(|(_, e)| e).sum()
    }

    /// This interval's figures, summed over consumers.
    pub(crate) fn totals(&self) -> DomainUj {
        DomainUj {
            key: self.key,
            estimated: self.estimated,
            basis: self.basis,
            measured_uj: self.measured_uj,
            attributed_uj: self.attributed_uj(),
            idle_uj: self.idle_uj,
            unattributed_uj: self.unattributed_uj,
            static_uj: self.static_uj,
            attributed_static_uj: self.attributed_static.iter().map(|(_, uj)| uj).sum(),
        }
    }
}

/// One domain's figures in µJ: one interval's ([`DomainShare::totals`]) or
/// a sum of them (the ledger's). The one type attribution, the sums and
/// the recording's rows (`model::record::DomainOf::from_uj`) share.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct DomainUj {
    /// Which domain.
    pub(crate) key: DomainKey,
    /// Modelled rather than measured (for some interval at least).
    pub(crate) estimated: bool,
    /// How it was divided.
    pub(crate) basis: Basis,
    /// Measured.
    pub(crate) measured_uj: u64,
    /// Attributed to consumers.
    pub(crate) attributed_uj: u64,
    /// The idle share.
    pub(crate) idle_uj: u64,
    /// Neither attributed nor idle.
    pub(crate) unattributed_uj: u64,
    /// The domain's static energy, within the measured (its static figure
    /// × the time; a calibrated wall's `b`; a GPU's idle and held power).
    pub(crate) static_uj: u64,
    /// The static part of `attributed_uj`.
    pub(crate) attributed_static_uj: u64,
}

impl DomainUj {
    /// No energy yet for `key`, divided by `basis`.
    pub(crate) fn empty(key: DomainKey, basis: Basis) -> Self {
        Self {
            key,
            estimated: false,
            basis,
            measured_uj: 0,
            attributed_uj: 0,
            idle_uj: 0,
            unattributed_uj: 0,
            static_uj: 0,
            attributed_static_uj: 0,
        }
    }

    /// Adds `o`'s figures (estimated if either is). Saturating: a damaged
    /// file read back must not overflow a sum.
    pub(crate) fn merge(&mut self, o: &Self) {
        self.estimated |= o.estimated;
        self.measured_uj = self.measured_uj.saturating_add(o.measured_uj);
        self.attributed_uj = self.attributed_uj.saturating_add(o.attributed_uj);
        self.idle_uj = self.idle_uj.saturating_add(o.idle_uj);
        self.unattributed_uj = self.unattributed_uj.saturating_add(o.unattributed_uj);
        self.static_uj = self.static_uj.saturating_add(o.static_uj);
        self.attributed_static_uj = self
            .attributed_static_uj
            .saturating_add(o.attributed_static_uj);
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
        key: DomainKey::new(d.domain, d.package),
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
    static_and_dynamic(iv, d, base, &times, consumed, on)
}

/// A CPU domain's energy split into its static part (by the figure, shared
/// by `--static-power`'s rule: capacity, busy time, or left idle; with no
/// figure all of it is static, shared by capacity) and its dynamic part
/// (by busy time); `on` is a consumer's time on the domain's
/// packages, `consumed` all of theirs.
fn static_and_dynamic(
    iv: &Interval<'_>,
    d: &DomainEnergy,
    base: DomainShare,
    times: &[PackageTime],
    consumed: u64,
    on: impl Fn(&Usage) -> u64,
) -> DomainShare {
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

/// A GPU's energy divided: its idle power × the interval to the idle row,
/// its held power × the interval among the processes holding it (equally:
/// NVML says who holds a context, not since when), and the rest, the
/// dynamic part, by SM share (equally when none was sampled). With no
/// static figures yet, all of it is dynamic. `--static-power busy` gives
/// the idle part to the holders too, `idle` gives them neither.
fn gpu_share(g: &GpuInterval, rule: StaticShare) -> DomainShare {
    let e = g.energy_uj;
    let base = DomainShare {
        key: DomainKey::new(Domain::Gpu, Some(g.index)),
        estimated: g.estimated,
        basis: Basis::GpuSm,
        measured_uj: e,
        idle_uj: 0,
        unattributed_uj: e,
        attributed: Vec::new(),
        attributed_static: Vec::new(),
        static_uj: 0,
        static_cut_uj: 0,
    };
    if g.processes.is_empty() {
        // No context: all idle, its static part what the figure says.
        return DomainShare {
            idle_uj: e,
            unattributed_uj: 0,
            static_uj: g.statics.idle_uj.min(e),
            static_cut_uj: g.statics.idle_uj.saturating_sub(e),
            ..base
        };
    }
    let idle_part = g.statics.idle_uj.min(e);
    let held_part = g.statics.held_uj.min(e - idle_part);
    let static_uj = idle_part + held_part;
    let static_cut_uj = (g.statics.idle_uj + g.statics.held_uj).saturating_sub(e);
    let dynamic_uj = e - static_uj;
    let (to_holders, to_idle) = match rule {
        _ if g.settling => (held_part, idle_part),
        StaticShare::Capacity => (held_part, idle_part),
        StaticShare::Busy => (static_uj, 0),
        StaticShare::Idle => (0, static_uj),
    };
    let sm_total: u64 = g
        .processes
        .iter()
        .map(|(_, sm)| u64::from(*sm))
        .sum::<u64>()
        + u64::from(g.unheld);
    // No process reported SM activity (NVML's per-process samples can be
    // empty over a short interval): they held the GPU together, equally.
    let weight = |sm: u32| if sm_total == 0 { 1 } else { u64::from(sm) };
    // Work no listed process did weighs too, and its share goes to no one.
    let total: u64 = g.processes.iter().map(|(_, sm)| weight(*sm)).sum::<u64>()
        + if sm_total == 0 {
            0
        } else {
            u64::from(g.unheld)
        };
    let holders = g.processes.len() as u64;
    let mut attributed: Vec<(ConsumerId, u64)> = Vec::new();
    let mut attributed_static: Vec<(ConsumerId, u64)> = Vec::new();
    let add = |v: &mut Vec<(ConsumerId, u64)>, id: ConsumerId, uj: u64| match v
        .iter_mut()
        .find(|(c, _)| *c == id)
    {
        Some(p) => p.1 += uj,
        None => v.push((id, uj)),
    };
    for (id, sm) in &g.processes {
        // A holder wattprof does not know: its shares stay unattributed.
        let Some(id) = id else { continue };
        let held = share(to_holders, 1, holders);
        add(&mut attributed_static, *id, held);
        add(
            &mut attributed,
            *id,
            held + share(dynamic_uj, weight(*sm), total),
        );
    }
    attributed.retain(|(_, uj)| *uj > 0);
    attributed_static.retain(|(_, uj)| *uj > 0);
    let mut out = DomainShare {
        attributed,
        attributed_static,
        idle_uj: to_idle,
        static_uj,
        static_cut_uj,
        ..base
    };
    out.unattributed_uj = e - out.attributed_uj() - out.idle_uj;
    out
}

/// Divides one interval's energy among consumers, domain by domain.
pub(crate) fn attribute(iv: &Interval<'_>) -> Vec<DomainShare> {
    let mut out: Vec<DomainShare> = iv
        .energy
        .iter()
        .map(|d| match d.domain {
            Domain::Package | Domain::Core | Domain::Dram => cpu_share(iv, d),
            Domain::Uncore | Domain::Psys | Domain::Wall | Domain::Gpu => DomainShare {
                key: DomainKey::new(d.domain, d.package),
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
    out.extend(iv.gpus.iter().map(|g| gpu_share(g, iv.static_share)));
    // The calibrated wall is divided after the domains it scales.
    if let Some(model) = iv.wall
        && let Some(i) = out.iter().position(|s| s.key.domain == Domain::Wall)
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
        |s: &&DomainShare| matches!(s.key.domain, Domain::Package | Domain::Dram | Domain::Gpu);
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
mod tests;
