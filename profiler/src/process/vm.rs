//! Virtual machines on a host, for `monitor --vm-export`: which processes
//! run a VM, and the energy attributed to each VM so far.
//!
//! A process runs a VM when
//! - its cgroup is a libvirt/systemd-machined scope under `machine.slice`
//!   (`/machine.slice/machine-qemu\x2d1\x2ddebian.scope/...`: the VM
//!   `debian`); or
//! - it, or an ancestor, is a virtual machine monitor: `qemu-system-*`,
//!   `firecracker`, `cloud-hypervisor` (named from its command line:
//!   qemu's `-name`, firecracker's `--id`, else the program and pid).

use std::collections::BTreeMap;

use crate::attribution::{ConsumerId, EnergyBy};
use crate::hash::IntMap;

/// The VM a cgroup path belongs to: the machine scope's name under
/// `machine.slice`, unescaped, without systemd-machined's `qemu-N-`.
pub fn vm_of_cgroup(path: &str) -> Option<String> {
    let mut parts = path.split('/').skip_while(|p| *p != "machine.slice");
    parts.next()?;
    let scope = parts.next()?.strip_suffix(".scope")?;
    let name = unescape_unit(scope.strip_prefix("machine-").unwrap_or(scope));
    // libvirt's machine names: qemu-<id>-<domain name>, lxc-<pid>-<name>.
    let name = ["qemu-", "lxc-"]
        .iter()
        .find_map(|p| {
            let rest = name.strip_prefix(p)?;
            let (id, vm) = rest.split_once('-')?;
            id.bytes()
                .all(|b| b.is_ascii_digit())
                .then(|| vm.to_string())
        })
        .unwrap_or(name);
    (!name.is_empty()).then_some(name)
}

/// systemd's unit-name escaping undone (`\x2d` is `-`).
fn unescape_unit(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && b.get(i + 1) == Some(&b'x')
            && let Some(v) = s
                .get(i + 2..i + 4)
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(v);
            i += 4;
            continue;
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Whether a process name is a virtual machine monitor's (comm is cut at
/// 15 bytes: `cloud-hyperviso`).
pub fn is_vmm(comm: &str) -> bool {
    comm.starts_with("qemu-system-")
        || comm == "qemu-kvm"
        || comm == "firecracker"
        || comm.starts_with("cloud-hyperviso")
}

/// A VMM's VM name from its command line: qemu's `-name [guest=]NAME[,...]`,
/// firecracker's `--id ID`, else `PROGRAM-PID`.
pub fn vm_name_from_cmdline(args: &[String], comm: &str, pid: u32) -> String {
    let value_of = |flag: &str| {
        args.iter()
            .position(|a| a == flag)
            .and_then(|i| args.get(i + 1))
    };
    if let Some(v) = value_of("-name") {
        let first = v.split(',').next().unwrap_or_default();
        let name = first.strip_prefix("guest=").unwrap_or(first);
        if !name.is_empty() {
            return name.to_string();
        }
    }
    if let Some(id) = value_of("--id").filter(|v| !v.is_empty()) {
        return id.clone();
    }
    format!("{comm}-{pid}")
}

/// Energy and CPU time of one VM so far.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct VmSum {
    /// Energy attributed to its processes.
    pub energy: EnergyBy,
    /// Their on-CPU time.
    pub on_cpu_ns: u64,
}

/// The VMs seen, and which consumer runs which.
#[derive(Debug, Default)]
pub struct VmTracker {
    sums: BTreeMap<String, VmSum>,
    /// Consumers found to run a VM through a VMM process (cgroups are
    /// looked at each time: a process can move).
    by_vmm: IntMap<ConsumerId, String>,
}

/// A process as the tracker needs it: pid and name.
pub struct ProcView<'a> {
    /// Process id.
    pub pid: u32,
    /// Name.
    pub comm: &'a str,
}

impl VmTracker {
    /// Adds one consumer's interval. `cgroup` is its cgroup path, `chain`
    /// walks its ancestors (itself first), `cmdline` reads a pid's argv.
    pub fn add<'a>(
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
    pub fn sums(&self) -> &BTreeMap<String, VmSum> {
        &self.sums
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libvirt_scopes_name_their_vm() {
        for (path, vm) in [
            (
                "/machine.slice/machine-qemu\\x2d1\\x2ddebian\\x2d12.scope/libvirt/vcpu0",
                Some("debian-12"),
            ),
            (
                "/machine.slice/machine-qemu\\x2d17\\x2dweb.scope",
                Some("web"),
            ),
            ("/machine.slice/machine-myvm.scope/emulator", Some("myvm")),
            ("/machine.slice", None),
            ("/system.slice/docker-abc.scope", None),
            ("/machine.slice/libvirtd.service", None),
        ] {
            assert_eq!(vm_of_cgroup(path).as_deref(), vm, "{path}");
        }
    }

    #[test]
    fn vmm_processes_and_their_names() {
        assert!(is_vmm("qemu-system-x86"));
        assert!(is_vmm("firecracker") && is_vmm("cloud-hyperviso"));
        assert!(!is_vmm("qemu-img") && !is_vmm("bash"));
        let argv = |s: &str| s.split(' ').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            vm_name_from_cmdline(
                &argv("qemu-system-x86_64 -name guest=db,debug-threads=on -m 2G"),
                "qemu-system-x86",
                9
            ),
            "db"
        );
        assert_eq!(
            vm_name_from_cmdline(&argv("qemu-system-x86_64 -name web"), "q", 9),
            "web"
        );
        assert_eq!(
            vm_name_from_cmdline(
                &argv("firecracker --id fc1 --api-sock /s"),
                "firecracker",
                9
            ),
            "fc1"
        );
        assert_eq!(
            vm_name_from_cmdline(
                &argv("cloud-hypervisor --cpus boot=2"),
                "cloud-hyperviso",
                42
            ),
            "cloud-hyperviso-42"
        );
    }

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
