//! Virtual machines on a host, for `monitor --vm-export`: which processes
//! run a VM (their sums are `sums::vms`).
//!
//! A process runs a VM when
//! - its cgroup is a libvirt/systemd-machined scope under `machine.slice`
//!   (`/machine.slice/machine-qemu\x2d1\x2ddebian.scope/...`: the VM
//!   `debian`; containers registered with machined, nspawn or libvirt-lxc,
//!   are exported the same way); or
//! - it, or an ancestor, is a virtual machine monitor: `qemu-system-*`,
//!   `firecracker`, `cloud-hypervisor` (named from its command line:
//!   qemu's `-name`, firecracker's `--id`, else the program and pid).

/// The VM a cgroup path belongs to: the machine scope's name under
/// `machine.slice`, unescaped, without systemd-machined's `qemu-N-`.
pub(crate) fn vm_of_cgroup(path: &str) -> Option<String> {
    let mut parts = path.split('/').skip_while(|p| *p != "machine.slice");
    parts.next()?;
    // systemd-machined's scopes are `machine-<name>.scope`; anything else
    // under machine.slice (podman's libpod-*.scope) is no VM.
    let scope = parts
        .next()?
        .strip_suffix(".scope")?
        .strip_prefix("machine-")?;
    let name = unescape_unit(scope);
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
pub(crate) fn is_vmm(comm: &str) -> bool {
    comm.starts_with("qemu-system-")
        || comm == "qemu-kvm"
        || comm == "firecracker"
        || comm.starts_with("cloud-hyperviso")
}

/// A VMM's VM name from its command line: qemu's `-name [guest=]NAME[,...]`,
/// firecracker's `--id ID`, else `PROGRAM-PID`.
pub(crate) fn vm_name_from_cmdline(args: &[String], comm: &str, pid: u32) -> String {
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
            ("/machine.slice/libpod-0123abcd.scope/container", None),
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
}
