//! What a profile adds up as it runs, and the reports made from the sums:
//! per domain and consumer (the ledger), per group, cgroup and container,
//! per VM, each process's memory, and per-CPU time. `report` sums a
//! stream cut short with the same ledger and group sums.

pub(crate) mod cgroups;
pub(crate) mod ledger;
pub(crate) mod machine;
pub(crate) mod memory;
pub(crate) mod vms;

#[cfg(test)]
mod tests;

use crate::attribution::{ConsumerId, EnergyBy};
use crate::carbon::CarbonIntensity;
use crate::hash::IntMap;
use crate::model::{EnergyJ, GroupEnergy};
use crate::process::{IntervalUsage, Role};
use crate::sources::Domain;

/// Report order: most energy first, then most on-CPU time.
pub(crate) fn most_energy_first(a: (&EnergyJ, u64), b: (&EnergyJ, u64)) -> std::cmp::Ordering {
    b.0.total_j.total_cmp(&a.0.total_j).then(b.1.cmp(&a.1))
}

/// Energy per group: the command's tree, wattprof, everything else
/// (indexed by [`Role`]).
pub(crate) type Groups = [EnergyBy; 3];

/// Each group's energy over `span_ns`.
pub(crate) fn group_energy(groups: &Groups, span_ns: u64, carbon: &CarbonIntensity) -> GroupEnergy {
    let of = |r: Role| EnergyJ::new(&groups[r as usize], span_ns, carbon);
    GroupEnergy {
        tree: of(Role::Tree),
        profiler: of(Role::Profiler),
        other: of(Role::Other),
    }
}

/// A profile's sums.
pub(crate) struct Sums {
    /// Per-CPU time.
    pub(crate) machine: machine::MachineTimes,
    /// Per domain, and per consumer the table still holds.
    pub(crate) ledger: ledger::EnergyLedger,
    /// Per group.
    pub(crate) groups: Groups,
    /// Per cgroup and container.
    pub(crate) cgroups: cgroups::Cgroups,
    /// Per VM (`monitor --vm-export`), when asked for.
    pub(crate) vms: Option<vms::VmTracker>,
    /// Each reported process's memory.
    pub(crate) memory: memory::Memory,
    /// Each MIG instance's GPU energy.
    pub(crate) mig: MigSums,
}

/// Each MIG instance's GPU energy, by (GPU, GPU instance, compute
/// instance, UUID): what its processes were given.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct MigSums(std::collections::BTreeMap<MigKey, (u32, u64)>);

/// A MIG instance: (GPU, GPU instance, compute instance, UUID).
type MigKey = (u32, u32, u32, String);

impl MigSums {
    /// Adds `uj` to instance `gi`.`ci` of GPU `gpu` (`MIG-...` `uuid`, of
    /// `slices` compute slices).
    pub(crate) fn add(&mut self, gpu: u32, gi: u32, ci: u32, uuid: &str, slices: u32, uj: u64) {
        // By UUID too: an instance made anew after MIG is set up again
        // (same ids, another UUID) starts from 0.
        let s = self.0.entry((gpu, gi, ci, uuid.to_string())).or_default();
        s.0 = slices;
        s.1 = s.1.saturating_add(uj);
    }

    /// Each instance's energy so far.
    pub(crate) fn reports(&self) -> Vec<crate::model::MigInstanceReport> {
        self.0
            .iter()
            .map(
                |((gpu, gi, ci, uuid), (slices, uj))| crate::model::MigInstanceReport {
                    gpu: *gpu,
                    gpu_instance_id: *gi,
                    compute_instance_id: *ci,
                    uuid: uuid.clone(),
                    slices: *slices,
                    energy_j: crate::units::joules(*uj),
                },
            )
            .collect()
    }
}

impl Sums {
    /// Empty sums; cgroups named from `cgroupfs` (`None`: this machine's
    /// cgroup2 mount), containers by asking `runtimes`.
    pub(crate) fn new(
        cgroupfs: Option<&std::path::Path>,
        runtimes: &crate::process::names::RuntimeSockets,
    ) -> Self {
        Self {
            machine: machine::MachineTimes::default(),
            ledger: ledger::EnergyLedger::default(),
            groups: Groups::default(),
            cgroups: cgroups::Cgroups::new(cgroupfs, runtimes),
            vms: None,
            memory: memory::Memory::default(),
            mig: MigSums::default(),
        }
    }

    /// Adds this interval's energy per consumer to its group and cgroup,
    /// and each process's CPU time to its cgroups; returns this interval's
    /// energy per group. `index` finds a consumer in `usage`; one that is
    /// not there (it did not run) goes where `origin` says it was when it
    /// ran (a process forgotten since an interval whose read failed), else
    /// to the rest of the machine, in no cgroup.
    pub(crate) fn add_interval(
        &mut self,
        usage: &[IntervalUsage],
        energy: &IntMap<ConsumerId, EnergyBy>,
        index: &IntMap<ConsumerId, usize>,
        origin: impl Fn(ConsumerId) -> Option<(u64, Role)>,
        at_ns: u64,
    ) -> Groups {
        let mut interval = Groups::default();
        for (id, e) in energy {
            let u = index.get(id).map(|i| &usage[*i]);
            let origin = if u.is_none() { origin(*id) } else { None };
            let (cgroup, role) = match (u, origin) {
                (Some(u), _) => (u.cgroup_id, u.role),
                (None, Some(o)) => o,
                (None, None) => (0, Role::Other),
            };
            self.groups[role as usize].merge(e);
            interval[role as usize].merge(e);
            self.cgroups.add_energy(u, cgroup, e);
        }
        self.cgroups.add_time(usage, at_ns);
        interval
    }

    /// Forgets what is kept per process for processes `keep` rejects
    /// (their energy stays in the group and cgroup sums).
    pub(crate) fn forget(&mut self, keep: impl Fn(ConsumerId) -> bool) {
        self.ledger.retain(&keep);
        self.memory.forget(&keep);
        self.cgroups.forget(&keep);
    }

    /// Whether the CPU's energy is a power model's estimate.
    pub(crate) fn cpu_estimated(&self) -> bool {
        self.ledger
            .domains()
            .iter()
            .any(|d| d.key.domain == Domain::Package && d.estimated)
    }

    /// Whether DRAM energy is measured (a DRAM domain has been read).
    pub(crate) fn measures_dram(&self) -> bool {
        self.ledger
            .domains()
            .iter()
            .any(|d| d.key.domain == Domain::Dram)
    }
}
