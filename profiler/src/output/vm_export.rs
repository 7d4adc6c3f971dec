//! `monitor --vm-export DIR`: each VM's attributed energy written as a
//! powercap tree, to be shared into the guest (virtiofs or 9p) and read
//! there as its RAPL (`wattprof run --powercap-root`, codecarbon, any
//! powercap reader).
//!
//! `DIR/<vm>/` is laid out as `/sys/class/powercap` is:
//!
//! ```text
//! intel-rapl/intel-rapl:0/{name,energy_uj,max_energy_range_uj,enabled}   package-0
//! intel-rapl/intel-rapl:0/intel-rapl:0:0/{...}                           dram (where measured)
//! intel-rapl:0   -> intel-rapl/intel-rapl:0                              (symlinks)
//! intel-rapl:0:0 -> intel-rapl/intel-rapl:0/intel-rapl:0:0
//! wattprof-host-export                                                   what wrote it
//! ```
//!
//! `energy_uj` is rewritten in place each interval (as the kernel's
//! counter changes in place), and wraps at `max_energy_range_uj` + 1 as
//! RAPL's does. The package zone holds the VM's package energy over all
//! host packages: a guest's vCPUs are not tied to a host package.

use std::collections::BTreeMap;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::process::vm::VmSum;
use crate::sources::powercap::HOST_EXPORT_MARKER;

/// The counter's range, the one most Intel packages report.
pub const MAX_ENERGY_RANGE_UJ: u64 = 262_143_328_850;

/// The trees being written.
#[derive(Debug)]
pub struct VmExport {
    dir: PathBuf,
    /// VM name → its directory, once created.
    vms: BTreeMap<String, PathBuf>,
    host: String,
}

/// A directory name for a VM: its name with anything but letters, digits,
/// `.`, `_` and `-` replaced by `_` (never `.` or `..`).
pub fn dir_name(vm: &str) -> String {
    let s: String = vm
        .chars()
        .take(100)
        .map(|c| {
            if c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-') {
                c
            } else {
                '_'
            }
        })
        .collect();
    if s.is_empty() || s.chars().all(|c| c == '.') {
        format!("_{s}")
    } else {
        s
    }
}

fn write_file(path: &Path, text: &str) -> std::io::Result<()> {
    std::fs::write(path, text)
}

/// Rewrites a counter file in place: the new value over the old, then
/// cut to its length (values only grow between wraps, so a reader sees
/// the old or the new value).
fn rewrite_in_place(path: &Path, value: u64) -> std::io::Result<()> {
    let text = format!("{value}\n");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)?;
    f.write_all_at(text.as_bytes(), 0)?;
    f.set_len(text.len() as u64)
}

impl VmExport {
    /// Exports under `dir`, creating it; refuses a path that cannot be
    /// written.
    pub fn create(dir: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir)
            .and_then(|()| {
                let probe = dir.join(".wattprof-write-test");
                std::fs::File::create(&probe)?.write_all(b"")?;
                std::fs::remove_file(probe)
            })
            .map_err(|e| {
                format!(
                    "cannot write --vm-export {}: {e} (give a writable directory, e.g. one \
                     shared into the guests with virtiofs)",
                    dir.display()
                )
            })?;
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
            .map(|h| h.trim().to_string())
            .unwrap_or_else(|_| "unknown".into());
        Ok(Self {
            dir: dir.to_path_buf(),
            vms: BTreeMap::new(),
            host,
        })
    }

    fn zone(&self, root: &Path, rel: &str, name: &str) -> std::io::Result<()> {
        let z = root.join("intel-rapl").join(rel);
        std::fs::create_dir_all(&z)?;
        write_file(&z.join("name"), &format!("{name}\n"))?;
        write_file(&z.join("enabled"), "1\n")?;
        write_file(
            &z.join("max_energy_range_uj"),
            &format!("{MAX_ENERGY_RANGE_UJ}\n"),
        )?;
        rewrite_in_place(&z.join("energy_uj"), 0)?;
        let link = root.join(Path::new(rel).file_name().unwrap_or_default());
        if std::fs::symlink_metadata(&link).is_err() {
            std::os::unix::fs::symlink(Path::new("intel-rapl").join(rel), link)?;
        }
        Ok(())
    }

    fn make(&self, vm: &str, root: &Path, dram: bool) -> std::io::Result<()> {
        self.zone(root, "intel-rapl:0", "package-0")?;
        if dram {
            self.zone(root, "intel-rapl:0/intel-rapl:0:0", "dram")?;
        }
        write_file(
            &root.join(HOST_EXPORT_MARKER),
            &format!(
                "VM {vm} on host {}, energy attributed to its processes by wattprof {} \
                 monitor --vm-export\n",
                self.host,
                env!("CARGO_PKG_VERSION")
            ),
        )
    }

    /// Writes every VM's counters: `sums` from the profile; `dram` when
    /// the host measures DRAM. A VM seen for the first time gets its tree.
    pub fn write(&mut self, sums: &BTreeMap<String, VmSum>, dram: bool) -> Result<(), String> {
        for (vm, sum) in sums {
            let root = match self.vms.get(vm) {
                Some(r) => r.clone(),
                None => {
                    let root = self.dir.join(dir_name(vm));
                    self.make(vm, &root, dram)
                        .map_err(|e| format!("--vm-export {}: {e}", root.display()))?;
                    self.vms.insert(vm.clone(), root.clone());
                    root
                }
            };
            let wrap = MAX_ENERGY_RANGE_UJ + 1;
            let zones = [
                ("intel-rapl:0", sum.energy.package_uj),
                ("intel-rapl:0/intel-rapl:0:0", sum.energy.dram_uj),
            ];
            for (rel, uj) in zones {
                let z = root.join("intel-rapl").join(rel);
                if rel.ends_with(":0:0") && !z.is_dir() {
                    continue;
                }
                rewrite_in_place(&z.join("energy_uj"), uj % wrap)
                    .map_err(|e| format!("--vm-export {}: {e}", z.display()))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::EnergyBy;
    use crate::sources::{Domain, Source, powercap::Powercap};

    #[test]
    fn names_are_safe_directory_names() {
        assert_eq!(dir_name("debian-12"), "debian-12");
        assert_eq!(dir_name("a/b c"), "a_b_c");
        assert_eq!(dir_name(".."), "_..");
        assert_eq!(dir_name(""), "_");
    }

    #[test]
    fn the_tree_reads_back_through_the_powercap_reader_as_host_measured() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut ex = VmExport::create(dir.path()).expect("export");
        let mut sums = BTreeMap::new();
        let mut sum = VmSum {
            energy: EnergyBy {
                package_uj: 5_000_000,
                dram_uj: 500_000,
                ..Default::default()
            },
            on_cpu_ns: 1,
        };
        sums.insert("web/1".to_string(), sum.clone());
        ex.write(&sums, true).expect("write");
        let root = dir.path().join("web_1");
        let mut p = Powercap::open_dir(root.clone(), "").expect("a powercap tree");
        assert!(p.host_export().is_some_and(|n| n.contains("VM web/1")));
        // The first read is the counters' starting point.
        p.read().expect("first read");
        sum.energy.package_uj += 2_000_000;
        sum.energy.dram_uj += 100_000;
        sums.insert("web/1".to_string(), sum);
        ex.write(&sums, true).expect("write");
        let read = p.read().expect("read");
        let pkg = read
            .iter()
            .find(|d| d.domain == Domain::Package)
            .expect("package");
        let dram = read
            .iter()
            .find(|d| d.domain == Domain::Dram)
            .expect("dram");
        assert_eq!((pkg.energy_uj, dram.energy_uj), (2_000_000, 100_000));
        // Busy-only, and not tied to a package of the guest's.
        assert!(pkg.busy_only && !pkg.estimated && pkg.package.is_none());
        // Laid out as sysfs: the control type directory and the links.
        assert!(
            root.join("intel-rapl/intel-rapl:0/intel-rapl:0:0/name")
                .exists()
        );
        assert!(
            std::fs::symlink_metadata(root.join("intel-rapl:0:0")).is_ok_and(|m| m.is_symlink())
        );
        // The counter wraps as RAPL's does.
        sums.insert(
            "web/1".into(),
            VmSum {
                energy: EnergyBy {
                    package_uj: MAX_ENERGY_RANGE_UJ + 10,
                    ..Default::default()
                },
                on_cpu_ns: 1,
            },
        );
        ex.write(&sums, true).expect("write");
        let text = std::fs::read_to_string(root.join("intel-rapl:0/energy_uj")).expect("read");
        assert_eq!(text, "9\n");
    }

    #[test]
    fn an_unwritable_directory_is_one_clear_error() {
        let err = VmExport::create(Path::new("/proc/wattprof-vms")).expect_err("refused");
        assert!(
            err.contains("cannot write --vm-export /proc/wattprof-vms"),
            "{err}"
        );
    }
}
