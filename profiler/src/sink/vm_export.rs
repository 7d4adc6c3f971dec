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

use super::{Sink, Totals};
use crate::model::record::IntervalRecord;
use crate::sources::powercap::{HOST_ESTIMATED, HOST_EXPORT_MARKER, wrap_period};
use crate::sums::vms::VmSum;

/// The counter's range, the one most Intel packages report.
pub(crate) const MAX_ENERGY_RANGE_UJ: u64 = 262_143_328_850;

/// One VM's tree: its counter files, held open (a guest that replaces
/// them, or plants a symlink, changes nothing on the host), and the
/// energy an earlier wattprof already exported (so a restart never makes
/// the counter go back).
#[derive(Debug)]
struct Tree {
    package: std::fs::File,
    dram: Option<std::fs::File>,
    offset: (u64, u64),
}

/// The trees being written.
#[derive(Debug)]
pub(crate) struct VmExport {
    dir: PathBuf,
    /// VM name → its tree, once made.
    vms: BTreeMap<String, Tree>,
    host: String,
}

/// A directory name for a VM: its name with anything but letters, digits,
/// `.`, `_` and `-` replaced by `_` (never `.` or `..`, never hidden).
pub(crate) fn dir_name(vm: &str) -> String {
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
    if s.is_empty() || s.starts_with('.') {
        format!("_{s}")
    } else {
        s
    }
}

/// The counter's text: right-aligned in a fixed width, so each rewrite
/// covers the previous one exactly (one `pwrite`, no truncation: a reader
/// sees the old value or the new one, never a mix). Readers trim it, as
/// they do sysfs's newline.
fn counter_text(value: u64) -> String {
    format!("{value:>20}\n")
}

fn open_no_follow(path: &Path, create: bool) -> std::io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(!create)
        .write(create)
        .create_new(create)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
}

/// What a previous wattprof left in a counter file (0 if none).
fn previous(path: &Path) -> u64 {
    let mut text = String::new();
    open_no_follow(path, false)
        .and_then(|mut f| std::io::Read::read_to_string(&mut f, &mut text))
        .ok()
        .and_then(|_| text.trim().parse().ok())
        .unwrap_or(0)
}

impl VmExport {
    /// Exports under `dir`, creating it; refuses a path that cannot be
    /// written.
    pub(crate) fn create(dir: &Path) -> Result<Self, String> {
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
        Ok(Self {
            dir: dir.to_path_buf(),
            vms: BTreeMap::new(),
            host: crate::topology::hostname(),
        })
    }

    /// One zone in a tree being built; returns its open counter file.
    fn zone(root: &Path, rel: &str, name: &str) -> std::io::Result<std::fs::File> {
        let z = root.join("intel-rapl").join(rel);
        std::fs::create_dir_all(&z)?;
        std::fs::write(z.join("name"), format!("{name}\n"))?;
        std::fs::write(z.join("enabled"), "1\n")?;
        std::fs::write(
            z.join("max_energy_range_uj"),
            format!("{MAX_ENERGY_RANGE_UJ}\n"),
        )?;
        let counter = open_no_follow(&z.join("energy_uj"), true)?;
        counter.write_all_at(counter_text(0).as_bytes(), 0)?;
        let link = root.join(Path::new(rel).file_name().unwrap_or_default());
        std::os::unix::fs::symlink(Path::new("intel-rapl").join(rel), link)?;
        Ok(counter)
    }

    /// Makes a VM's tree: built whole in a private directory (the marker
    /// first), then renamed into place, so a guest never sees half a tree.
    /// A tree an earlier wattprof left is replaced, its counts carried on.
    fn make(&self, vm: &str, dram: bool, estimated: bool) -> std::io::Result<Tree> {
        let root = self.dir.join(dir_name(vm));
        let zone0 = root.join("intel-rapl/intel-rapl:0");
        let offset = (
            previous(&zone0.join("energy_uj")),
            previous(&zone0.join("intel-rapl:0:0/energy_uj")),
        );
        let pid = std::process::id();
        let tmp = self.dir.join(format!(".building-{}-{pid}", dir_name(vm)));
        let _ = std::fs::remove_dir_all(&tmp);
        std::fs::create_dir(&tmp)?;
        std::fs::write(
            tmp.join(HOST_EXPORT_MARKER),
            format!(
                "VM {vm} on host {}, energy attributed to its processes by wattprof {} \
                 monitor --vm-export\n{}",
                self.host,
                env!("CARGO_PKG_VERSION"),
                if estimated {
                    format!("{HOST_ESTIMATED}\n")
                } else {
                    String::new()
                }
            ),
        )?;
        let package = Self::zone(&tmp, "intel-rapl:0", "package-0")?;
        let dram = if dram {
            Some(Self::zone(&tmp, "intel-rapl:0/intel-rapl:0:0", "dram")?)
        } else {
            None
        };
        if std::fs::symlink_metadata(&root).is_ok() {
            // remove_dir_all does not follow symlinks a guest may have left.
            let old = self.dir.join(format!(".old-{}-{pid}", dir_name(vm)));
            std::fs::rename(&root, &old)?;
            let _ = std::fs::remove_dir_all(&old);
        }
        std::fs::rename(&tmp, &root)?;
        Ok(Tree {
            package,
            dram,
            offset,
        })
    }

    /// Writes every VM's counters: `sums` from the profile; `dram` when
    /// the host measures DRAM; `estimated` when the host's own CPU energy
    /// is a model's (the guest is then told so). A VM seen for the first
    /// time gets its tree.
    pub(crate) fn write(
        &mut self,
        sums: &BTreeMap<String, VmSum>,
        dram: bool,
        estimated: bool,
    ) -> Result<(), String> {
        let wrap = wrap_period(MAX_ENERGY_RANGE_UJ);
        for (vm, sum) in sums {
            if !self.vms.contains_key(vm) {
                let tree = self.make(vm, dram, estimated).map_err(|e| {
                    format!("--vm-export {}: {e}", self.dir.join(dir_name(vm)).display())
                })?;
                self.vms.insert(vm.clone(), tree);
            }
            let Some(tree) = self.vms.get(vm) else {
                continue;
            };
            let write = |f: &std::fs::File, uj: u64| {
                f.write_all_at(counter_text(uj % wrap).as_bytes(), 0)
                    .map_err(|e| format!("--vm-export {}: {e}", dir_name(vm)))
            };
            write(
                &tree.package,
                tree.offset.0.wrapping_add(sum.energy.package_uj),
            )?;
            if let Some(d) = &tree.dram {
                write(d, tree.offset.1.wrapping_add(sum.energy.dram_uj))?;
            }
        }
        Ok(())
    }
}

/// `monitor --vm-export`: every VM's counters brought up to date after
/// each interval. A failed write is warned about once on stderr, and
/// tried again each interval; monitoring goes on.
pub(crate) struct VmExportSink {
    export: VmExport,
    failed: bool,
}

impl VmExportSink {
    /// Writes through `export`.
    pub(crate) fn new(export: VmExport) -> Self {
        Self {
            export,
            failed: false,
        }
    }
}

impl Sink for VmExportSink {
    fn needs_vms(&self) -> bool {
        true
    }

    fn interval(&mut self, _: &IntervalRecord, totals: &Totals<'_>) {
        let Some(vms) = &totals.sums.vms else {
            return;
        };
        let sums = totals.sums;
        match self
            .export
            .write(vms.sums(), sums.measures_dram(), sums.cpu_estimated())
        {
            Ok(()) if self.failed => {
                eprintln!("wattprof: --vm-export written again");
                self.failed = false;
            }
            Ok(()) => {}
            Err(e) if !self.failed => {
                eprintln!("wattprof: warning: {e}; monitoring goes on, retrying each interval");
                self.failed = true;
            }
            Err(_) => {}
        }
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
        ex.write(&sums, true, false).expect("write");
        let root = dir.path().join("web_1");
        let mut p = Powercap::open_dir(root.clone(), "").expect("a powercap tree");
        assert!(p.host_export().is_some_and(|n| n.contains("VM web/1")));
        // The first read is the counters' starting point.
        p.read().expect("first read");
        sum.energy.package_uj += 2_000_000;
        sum.energy.dram_uj += 100_000;
        sums.insert("web/1".to_string(), sum);
        ex.write(&sums, true, false).expect("write");
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
                    package_uj: MAX_ENERGY_RANGE_UJ + 100,
                    ..Default::default()
                },
                on_cpu_ns: 1,
            },
        );
        ex.write(&sums, true, false).expect("write");
        let text = std::fs::read_to_string(root.join("intel-rapl:0/energy_uj")).expect("read");
        let period = wrap_period(MAX_ENERGY_RANGE_UJ);
        assert_eq!(
            text.trim(),
            (MAX_ENERGY_RANGE_UJ + 100 - period).to_string()
        );
        assert_eq!(text.len(), 21, "fixed width: {text:?}");
        // A restarted wattprof carries the counter on: it never goes back.
        let mut again = VmExport::create(dir.path()).expect("export");
        let mut sums = BTreeMap::new();
        sums.insert("web/1".to_string(), VmSum::default());
        again.write(&sums, true, true).expect("write");
        let after = std::fs::read_to_string(root.join("intel-rapl:0/energy_uj")).expect("read");
        assert_eq!(after.trim(), text.trim());
        // A host whose CPU energy is a model's says so to the guest.
        let p = Powercap::open_dir(root.clone(), "").expect("tree");
        assert!(p.host_estimated());
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
