//! Energy attributed to each VM so far (`monitor --vm-export`), by the
//! rules of `process::vm`: a consumer's cgroup under `machine.slice`, or a
//! VMM process among its ancestors.

use std::collections::BTreeMap;

use crate::attribution::{ConsumerId, EnergyBy};
use crate::hash::IntMap;
use crate::process::vm::{is_vmm, vm_name_from_cmdline, vm_of_cgroup};

/// Energy and CPU time of one VM so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct VmSum {
    /// Energy attributed to its processes.
    pub(crate) energy: EnergyBy,
    /// Their on-CPU time.
    pub(crate) on_cpu_ns: u64,
}

/// The VMs seen, and which consumer runs which.
#[derive(Debug, Default)]
pub(crate) struct VmTracker {
    sums: BTreeMap<String, VmSum>,
    /// Consumers found to run a VM through a VMM process (cgroups are
    /// looked at each time: a process can move).
    by_vmm: IntMap<ConsumerId, String>,
}

/// A process as the tracker needs it: pid and name.
pub(crate) struct ProcView<'a> {
    /// Process id.
    pub(crate) pid: u32,
    /// Name.
    pub(crate) comm: &'a str,
}

impl VmTracker {
    /// Adds one consumer's interval. `cgroup` is its cgroup path, `chain`
    /// walks its ancestors (itself first), `cmdline` reads a pid's argv.
    pub(crate) fn add<'a>(
        &mut self,
        id: ConsumerId,
        cgroup: Option<&str>,
        chain: impl Iterator<Item = ProcView<'a>>,
        cmdline: impl Fn(u32) -> Vec<String>,
        energy: &EnergyBy,
        on_cpu_ns: u64,
    ) {
        let vm = match cgroup.and_then(vm_of_cgroup) {
            Some(vm) => Some(vm),
            None => match self.by_vmm.get(&id) {
                Some(vm) => Some(vm.clone()),
                None => chain.take(64).find(|p| is_vmm(p.comm)).map(|p| {
                    let vm = vm_name_from_cmdline(&cmdline(p.pid), p.comm, p.pid);
                    self.by_vmm.insert(id, vm.clone());
                    vm
                }),
            },
        };
        if let Some(vm) = vm {
            let s = self.sums.entry(vm).or_default();
            s.energy.merge(energy);
            s.on_cpu_ns += on_cpu_ns;
        }
    }

    /// Every VM seen, by name.
    pub(crate) fn sums(&self) -> &BTreeMap<String, VmSum> {
        &self.sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_go_to_the_vm_of_the_cgroup_or_of_a_vmm_ancestor() {
        let mut t = VmTracker::default();
        let e = EnergyBy {
            package_uj: 100,
            dram_uj: 10,
            ..Default::default()
        };
        let none = std::iter::empty;
        t.add(
            1,
            Some("/machine.slice/machine-qemu\\x2d1\\x2da.scope"),
            none(),
            |_| Vec::new(),
            &e,
            5,
        );
        t.add(
            1,
            Some("/machine.slice/machine-qemu\\x2d1\\x2da.scope"),
            none(),
            |_| Vec::new(),
            &e,
            5,
        );
        // A vCPU helper forked by a qemu process outside machine.slice.
        let chain = || {
            [
                ProcView {
                    pid: 20,
                    comm: "vhost-10",
                },
                ProcView {
                    pid: 10,
                    comm: "qemu-system-x86",
                },
            ]
            .into_iter()
        };
        let argv = |pid: u32| {
            assert_eq!(pid, 10);
            vec!["qemu-system-x86_64".into(), "-name".into(), "b".into()]
        };
        t.add(2, Some("/user.slice"), chain(), argv, &e, 7);
        // Known now: the chain is not walked again.
        t.add(2, Some("/user.slice"), none(), |_| panic!("cached"), &e, 7);
        // Not a VM.
        t.add(3, Some("/user.slice"), none(), |_| Vec::new(), &e, 9);
        let sums = t.sums();
        assert_eq!(sums.len(), 2);
        assert_eq!(sums["a"].energy.package_uj, 200);
        assert_eq!(sums["a"].on_cpu_ns, 10);
        assert_eq!(sums["b"].energy.dram_uj, 20);
        assert_eq!(sums["b"].on_cpu_ns, 14);
    }
}
