//! RAPL through the kernel's powercap interface (`/sys/class/powercap`).
//!
//! The `intel_rapl` driver serves Intel CPUs and AMD family 17h and later:
//! top-level zones `intel-rapl:P` are packages (`package-N`) or the
//! platform (`psys`); subzones `intel-rapl:P:S` are `core`, `uncore` and
//! `dram` of that package. `intel-rapl-mmio:*` zones measure the same
//! packages through MMIO and are used only for packages the MSR-backed
//! zones do not cover. `energy_uj` wraps at `max_energy_range_uj`.

use std::path::{Path, PathBuf};

use super::{
    Domain, DomainEnergy, Source, SourceError, SourceInfo, classify_io, counter::WrappingCounter,
};
use crate::topology::SysRoot;

const PERMISSION_FIX: &str = "run wattprof as root, or grant it CAP_DAC_READ_SEARCH (energy_uj \
     is readable by root only since Linux 5.10)";

/// A zone back after this long gets no energy for its absence: RAPL
/// counters can wrap in a few minutes (a 32-bit counter of 15.3 µJ steps
/// at 400 W in under 3), and a reading cannot tell one wrap from two.
pub(crate) const RESTART_AFTER: std::time::Duration = std::time::Duration::from_secs(60);

/// One zone being read.
#[derive(Debug)]
struct Zone {
    dir: PathBuf,
    domain: Domain,
    package: Option<u32>,
    die: u32,
    counter: WrappingCounter,
    /// Since when its reads fail (the zone vanished or cannot be read).
    gone: Option<std::time::Instant>,
}

/// A top-level zone: ((mmio?, zone id), domain, package, die).
type TopZone = ((bool, u32), Domain, Option<u32>, u32);

/// The counter's period: the range plus one step. The step (the RAPL
/// energy unit) is not published; `max_energy_range_uj` is 2^32 - 1 steps.
pub(crate) fn wrap_period(range_uj: u64) -> u64 {
    let step = (range_uj as f64 / 4_294_967_295.0).round() as u64;
    range_uj.saturating_add(step.max(1))
}

/// `package-3` → (3, 0); `package-1-die-2` → (1, 2).
fn parse_package_name(name: &str) -> Option<(u32, u32)> {
    let rest = name.strip_prefix("package-")?;
    match rest.split_once("-die-") {
        Some((p, d)) => Some((p.parse().ok()?, d.parse().ok()?)),
        None => Some((rest.parse().ok()?, 0)),
    }
}

/// A problem with one zone in one read; the other zones were read.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ZoneProblem {
    /// The zone's domain.
    pub(crate) domain: Domain,
    /// Its package.
    pub(crate) package: Option<u32>,
    /// What went wrong.
    pub(crate) error: SourceError,
}

/// The file a host's `--vm-export` writes next to a guest's zones: its
/// presence makes the tree's energy *measured by the host* and busy-only.
pub(crate) const HOST_EXPORT_MARKER: &str = "wattprof-host-export";

/// The marker's line saying the host's own CPU energy is a power model's:
/// the guest then reports the tree's energy as estimated.
pub(crate) const HOST_ESTIMATED: &str = "estimated: true";

/// The powercap reader.
#[derive(Debug)]
pub(crate) struct Powercap {
    root: PathBuf,
    zones: Vec<Zone>,
    problems: Vec<ZoneProblem>,
    /// Changes to tell people (a zone gone, a zone back), once each.
    said: Vec<String>,
    /// The tree is a host's export to its VM guest (its marker's text).
    host_export: bool,
    export_note: Option<String>,
    /// The host's export is itself an estimate.
    host_estimated: bool,
}

fn read_trimmed(path: &Path) -> std::io::Result<String> {
    std::fs::read_to_string(path).map(|s| s.trim().to_string())
}

fn read_u64(path: &Path) -> std::io::Result<u64> {
    read_trimmed(path)?
        .parse()
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
}

/// `intel-rapl:0:2` → (mmio?, [0, 2]).
fn parse_zone_id(name: &str) -> Option<(bool, Vec<u32>)> {
    let (mmio, rest) = if let Some(r) = name.strip_prefix("intel-rapl-mmio:") {
        (true, r)
    } else {
        (false, name.strip_prefix("intel-rapl:")?)
    };
    let ids: Option<Vec<u32>> = rest.split(':').map(|p| p.parse().ok()).collect();
    ids.filter(|v| !v.is_empty() && v.len() <= 2)
        .map(|v| (mmio, v))
}

/// What a zone measures, by its name: a package or the platform (a top
/// zone), or a package's core, uncore or DRAM (a subzone of one in
/// `tops`); `None` for zones wattprof does not read (AMD's core zone, which
/// its package includes, and unknown names).
fn zone_domain(
    name: &str,
    ids: &[u32],
    mmio: bool,
    amd: bool,
    tops: &[TopZone],
) -> Option<(Domain, Option<u32>, u32)> {
    if ids.len() == 1 {
        if name == "psys" {
            return Some((Domain::Psys, None, 0));
        }
        let (p, d) = parse_package_name(name)?;
        return Some((Domain::Package, Some(p), d));
    }
    let &(_, _, package, die) = tops.iter().find(|t| t.0 == (mmio, ids[0]))?;
    let domain = match name {
        "core" if amd => return None,
        "core" => Domain::Core,
        "uncore" => Domain::Uncore,
        "dram" => Domain::Dram,
        _ => return None,
    };
    Some((domain, package, die))
}

impl Powercap {
    /// Finds every zone under `sys`. Zones whose counter cannot be read are
    /// left out (`registry` reports why when none is left);
    /// no readable zone at all is [`SourceError::NotSupported`]. `cpuinfo`
    /// (the text of `/proc/cpuinfo`) tells AMD, whose `core` zone is left
    /// out.
    pub(crate) fn open(sys: &SysRoot, cpuinfo: &str) -> Result<Self, SourceError> {
        Self::open_dir(sys.join("class/powercap"), cpuinfo)
    }

    /// Finds every zone in `root`, a directory holding `intel-rapl:*`
    /// zones as `/sys/class/powercap` does (`--powercap-root`). A tree a
    /// host exported to its VM guest ([`HOST_EXPORT_MARKER`]) is read as
    /// energy measured by the host.
    pub(crate) fn open_dir(root: PathBuf, cpuinfo: &str) -> Result<Self, SourceError> {
        let amd = super::msr::detect_vendor(cpuinfo) == Some(super::msr::Vendor::Amd);
        let marker = std::fs::read_to_string(root.join(HOST_EXPORT_MARKER)).ok();
        let host_estimated = marker
            .as_deref()
            .is_some_and(|t| t.lines().any(|l| l.trim() == HOST_ESTIMATED));
        let export_note = marker.map(|t| t.lines().next().unwrap_or_default().trim().to_string());
        let entries = std::fs::read_dir(&root).map_err(|_| {
            SourceError::unsupported(
                format!(
                    "no {} (no RAPL on this machine, or a VM that hides it)",
                    root.display()
                ),
                "on bare metal: modprobe intel_rapl_msr (Intel, AMD family 17h+)",
            )
        })?;
        let mut found: Vec<(bool, Vec<u32>, PathBuf)> = entries
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                parse_zone_id(&name).map(|(mmio, ids)| (mmio, ids, e.path()))
            })
            .collect();
        // MSR-backed zones first, packages before their subzones.
        found.sort_by(|a, b| (a.0, &a.1).cmp(&(b.0, &b.1)));

        let mut zones: Vec<Zone> = Vec::new();
        let mut problems = Vec::new();
        // Top-level zones, by (mmio?, zone id), for their subzones.
        let mut tops: Vec<TopZone> = Vec::new();
        for (mmio, ids, dir) in found {
            let name = read_trimmed(&dir.join("name")).unwrap_or_default();
            let Some((domain, package, die)) = zone_domain(&name, &ids, mmio, amd, &tops) else {
                continue;
            };
            if ids.len() == 1 {
                tops.push(((mmio, ids[0]), domain, package, die));
            }
            if zones
                .iter()
                .any(|z| z.domain == domain && z.package == package && z.die == die)
            {
                // The same package through MMIO: already read via MSR.
                continue;
            }
            let energy = read_u64(&dir.join("energy_uj"));
            let range = read_u64(&dir.join("max_energy_range_uj"));
            match (energy, range) {
                (Ok(_), Ok(range)) => zones.push(Zone {
                    dir,
                    domain,
                    package,
                    die,
                    counter: WrappingCounter::new(wrap_period(range)),
                    gone: None,
                }),
                (Err(e), _) | (_, Err(e)) => problems.push(ZoneProblem {
                    domain,
                    package,
                    error: classify_io(&format!("{}/energy_uj", dir.display()), &e, PERMISSION_FIX),
                }),
            }
        }
        if zones.is_empty() {
            return Err(match problems.first() {
                Some(p) => p.error.clone(),
                None => SourceError::unsupported(
                    format!("no RAPL zones in {}", root.display()),
                    "on bare metal: modprobe intel_rapl_msr (Intel, AMD family 17h+)",
                ),
            });
        }
        if export_note.is_some() {
            // A guest's vCPUs are tied to no host package: its energy is
            // the whole guest's.
            for z in &mut zones {
                z.package = None;
            }
        }
        Ok(Self {
            root,
            zones,
            problems,
            said: Vec::new(),
            host_export: export_note.is_some(),
            export_note,
            host_estimated,
        })
    }

    /// Whether the host's exported energy is itself a model's estimate.
    #[cfg(test)]
    pub(crate) fn host_estimated(&self) -> bool {
        self.host_estimated
    }

    /// What the host said of the tree, where it is a host's export.
    #[cfg(test)]
    pub(crate) fn host_export(&self) -> Option<&str> {
        self.export_note.as_deref()
    }

    /// Zones that could not be read at the last open or read.
    #[cfg(test)]
    pub(crate) fn problems(&self) -> &[ZoneProblem] {
        &self.problems
    }
}

impl Source for Powercap {
    fn name(&self) -> &'static str {
        "powercap"
    }

    /// A zone that vanished, came back, or came back restarted: reported
    /// once when it happens, not at every read.
    fn take_problems(&mut self) -> Vec<String> {
        std::mem::take(&mut self.said)
    }

    fn kind(&self) -> super::ReaderKind {
        super::ReaderKind::Cpu
    }

    fn info(&self) -> SourceInfo {
        SourceInfo {
            domains: {
                let mut d: Vec<_> = self.zones.iter().map(|z| (z.domain, z.package)).collect();
                d.dedup();
                d
            },
            // powercap reports whole microjoules of a counter whose own
            // step is ~15-61 µJ; the step is not exposed.
            resolution_uj: Some(1.0),
            location: match &self.export_note {
                Some(note) if self.host_estimated => format!(
                    "{} (estimated by the host, which has no energy counter: {note})",
                    self.root.display()
                ),
                Some(note) => format!("{} (measured by the host: {note})", self.root.display()),
                None => self.root.display().to_string(),
            },
        }
    }

    fn read(&mut self) -> Result<Vec<DomainEnergy>, SourceError> {
        self.problems.clear();
        let mut out = Vec::with_capacity(self.zones.len());
        for z in &mut self.zones {
            match read_u64(&z.dir.join("energy_uj")) {
                Ok(raw) => {
                    // The hardware counter runs on while the zone is gone
                    // (a driver reload, a read refused for a while): its
                    // first reading back covers the time it was missed. A
                    // lower reading is a wrap when the gap was shorter than
                    // a wrap can take (RESTART_AFTER); after a longer gap
                    // the counter may have wrapped more than once, so that
                    // time's energy is not known, and 0 is reported for it
                    // rather than a guess.
                    let gone_for = z.gone.take().map(|since| since.elapsed());
                    let lower = z
                        .counter
                        .last()
                        .is_some_and(|last| raw % z.counter.modulus() < last);
                    let unknown =
                        gone_for.is_some_and(|d| d >= RESTART_AFTER) && z.counter.last().is_some();
                    let energy = if unknown {
                        z.counter.reset();
                        z.counter.advance(raw);
                        let error = SourceError::Retryable(format!(
                            "{}/energy_uj is back after {:.0} s, longer than its counter can be \
                             trusted not to wrap more than once{}: its energy while it was gone \
                             is not known (counted as 0)",
                            z.dir.display(),
                            gone_for.map_or(0.0, |d| d.as_secs_f64()),
                            if lower { " (and lower)" } else { "" }
                        ));
                        self.said.push(format!("powercap {error}"));
                        self.problems.push(ZoneProblem {
                            domain: z.domain,
                            package: z.package,
                            error,
                        });
                        Some(0)
                    } else {
                        if let Some(d) = gone_for.filter(|_| z.counter.last().is_some()) {
                            self.said.push(format!(
                                "powercap {}/energy_uj is back after {:.1} s: its energy while \
                                 it was gone comes with this read",
                                z.dir.display(),
                                d.as_secs_f64()
                            ));
                        }
                        z.counter.advance(raw)
                    };
                    if let Some(energy_uj) = energy {
                        // Dies of one package add up to the package.
                        match out.iter_mut().find(|e: &&mut DomainEnergy| {
                            e.domain == z.domain && e.package == z.package
                        }) {
                            Some(e) => e.energy_uj += energy_uj,
                            None => out.push(DomainEnergy {
                                domain: z.domain,
                                package: z.package,
                                energy_uj,
                                estimated: self.host_estimated,
                                busy_only: self.host_export,
                            }),
                        }
                    }
                }
                Err(e) => {
                    // The zone is gone or unreadable for now: its counter
                    // keeps its last reading for when it comes back.
                    let error = classify_io(
                        &format!("{}/energy_uj", z.dir.display()),
                        &e,
                        PERMISSION_FIX,
                    );
                    if z.gone.is_none() {
                        self.said.push(format!("powercap {error}"));
                        z.gone = Some(std::time::Instant::now());
                    }
                    self.problems.push(ZoneProblem {
                        domain: z.domain,
                        package: z.package,
                        error,
                    });
                }
            }
        }
        if out.is_empty() && !self.problems.is_empty() && self.zones.len() == self.problems.len() {
            return Err(self.problems[0].error.clone());
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const INTEL: &str = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n";
    const AMD: &str = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n";

    /// Copies a committed fixture tree into a temporary directory the test
    /// can change.
    fn fixture(name: &str) -> tempfile::TempDir {
        let src = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("testdata")
            .join(name);
        let dir = tempfile::tempdir().expect("tempdir");
        copy_dir(&src, dir.path());
        dir
    }

    fn copy_dir(src: &Path, dst: &Path) {
        std::fs::create_dir_all(dst).expect("mkdir");
        for e in std::fs::read_dir(src).expect("fixture exists").flatten() {
            let to = dst.join(e.file_name());
            if e.path().is_dir() {
                copy_dir(&e.path(), &to);
            } else {
                std::fs::copy(e.path(), to).expect("copy");
            }
        }
    }

    fn set(root: &Path, zone: &str, uj: u64) {
        let p = root.join("sys/class/powercap").join(zone).join("energy_uj");
        std::fs::write(p, format!("{uj}\n")).expect("write");
    }

    fn energy(r: &[DomainEnergy], d: Domain, pkg: Option<u32>) -> Option<u64> {
        r.iter()
            .find(|e| e.domain == d && e.package == pkg)
            .map(|e| e.energy_uj)
    }

    #[test]
    fn two_intel_packages_with_subzones_psys_and_an_mmio_duplicate() {
        let dir = fixture("intel-2s");
        let mut pc = Powercap::open(&SysRoot::at(dir.path().join("sys")), INTEL).expect("open");
        let mut domains = pc.info().domains;
        domains.sort();
        assert_eq!(
            domains,
            vec![
                (Domain::Package, Some(0)),
                (Domain::Package, Some(1)),
                (Domain::Core, Some(0)),
                (Domain::Core, Some(1)),
                (Domain::Uncore, Some(0)),
                (Domain::Uncore, Some(1)),
                (Domain::Dram, Some(0)),
                (Domain::Dram, Some(1)),
                (Domain::Psys, None),
            ],
            "the mmio package-0 is the same package, read once"
        );
        assert!(
            pc.read().expect("first").is_empty(),
            "first read only sets baselines"
        );
        set(dir.path(), "intel-rapl:0", 1_000_000 + 45_000_000);
        set(dir.path(), "intel-rapl:1:2", 4_000_000 + 3_000_000);
        let r = pc.read().expect("second");
        assert_eq!(energy(&r, Domain::Package, Some(0)), Some(45_000_000));
        assert_eq!(energy(&r, Domain::Dram, Some(1)), Some(3_000_000));
        assert_eq!(energy(&r, Domain::Core, Some(0)), Some(0));
    }

    #[test]
    fn counter_wrapping_mid_run() {
        let dir = fixture("intel-2s");
        let mut pc = Powercap::open(&SysRoot::at(dir.path().join("sys")), INTEL).expect("open");
        // max_energy_range_uj of package-1 is 262143328850.
        set(dir.path(), "intel-rapl:1", 262_143_328_000);
        pc.read().expect("baseline");
        set(dir.path(), "intel-rapl:1", 1_150);
        let r = pc.read().expect("wrapped");
        // 850 µJ up to the maximum, one 61 µJ counter step to 0, then 1,150.
        assert_eq!(energy(&r, Domain::Package, Some(1)), Some(850 + 61 + 1_150));
    }

    #[test]
    fn amd_layout_core_zone_of_one_core_is_left_out() {
        let dir = fixture("amd-1s");
        let pc = Powercap::open(&SysRoot::at(dir.path().join("sys")), AMD).expect("open");
        assert_eq!(pc.info().domains, vec![(Domain::Package, Some(0))]);
    }

    #[test]
    fn an_mmio_zone_fills_in_for_a_package_the_msr_zones_lack() {
        let dir = fixture("intel-2s");
        let pcap = dir.path().join("sys/class/powercap");
        for z in [
            "intel-rapl:1",
            "intel-rapl:1:0",
            "intel-rapl:1:1",
            "intel-rapl:1:2",
        ] {
            std::fs::remove_dir_all(pcap.join(z)).expect("rm");
        }
        std::fs::write(pcap.join("intel-rapl-mmio:0/name"), "package-1\n").expect("w");
        let mut pc = Powercap::open(&SysRoot::at(dir.path().join("sys")), INTEL).expect("open");
        assert!(pc.info().domains.contains(&(Domain::Package, Some(1))));
        pc.read().expect("baseline");
        set(dir.path(), "intel-rapl-mmio:0", 1_000_500 + 7);
        assert_eq!(
            energy(&pc.read().expect("read"), Domain::Package, Some(1)),
            Some(7)
        );
    }

    #[test]
    fn dies_of_one_package_are_summed() {
        let dir = fixture("intel-2s");
        let pcap = dir.path().join("sys/class/powercap");
        std::fs::write(pcap.join("intel-rapl:1/name"), "package-0-die-1\n").expect("w");
        std::fs::remove_dir_all(pcap.join("intel-rapl-mmio:0")).expect("rm");
        let mut pc = Powercap::open(&SysRoot::at(dir.path().join("sys")), INTEL).expect("open");
        assert!(!pc.info().domains.contains(&(Domain::Package, Some(1))));
        pc.read().expect("baseline");
        set(dir.path(), "intel-rapl:0", 1_000_000 + 30);
        set(dir.path(), "intel-rapl:1", 1_100_000 + 12);
        assert_eq!(
            energy(&pc.read().expect("read"), Domain::Package, Some(0)),
            Some(42)
        );
    }

    #[test]
    fn a_zone_that_vanishes_is_a_problem_not_a_failure_and_restarts_cleanly() {
        let dir = fixture("intel-2s");
        let mut pc = Powercap::open(&SysRoot::at(dir.path().join("sys")), INTEL).expect("open");
        pc.read().expect("baseline");
        let dram = dir.path().join("sys/class/powercap/intel-rapl:0:2");
        let saved = tempfile::tempdir().expect("tempdir");
        copy_dir(&dram, saved.path());
        std::fs::remove_dir_all(&dram).expect("remove");
        let r = pc.read().expect("other zones still read");
        assert_eq!(energy(&r, Domain::Dram, Some(0)), None);
        assert_eq!(r.len(), 8);
        assert!(matches!(pc.problems()[0].error, SourceError::Retryable(_)));
        assert_eq!(pc.take_problems().len(), 1, "said when it vanished");
        pc.read().expect("still gone");
        assert!(pc.take_problems().is_empty(), "said once");
        // It comes back soon with a lower counter: a wrap (the fixture's
        // range is 0..=max_energy_range_uj).
        copy_dir(saved.path(), &dram);
        let period = pc
            .zones
            .iter()
            .find(|z| z.domain == Domain::Dram)
            .map(|z| z.counter.modulus())
            .expect("the DRAM zone");
        let before = read_u64(&dram.join("energy_uj")).expect("saved reading");
        set(dir.path(), "intel-rapl:0:2", 10);
        let r = pc.read().expect("back");
        assert_eq!(
            energy(&r, Domain::Dram, Some(0)),
            Some(period - before + 10),
            "a wrap"
        );
        assert!(
            pc.take_problems().iter().any(|p| p.contains("is back")),
            "said when back"
        );
        set(dir.path(), "intel-rapl:0:2", 25);
        assert_eq!(
            energy(&pc.read().expect("read"), Domain::Dram, Some(0)),
            Some(15)
        );
        // Gone again, and back higher: the growth covers the time it was
        // gone.
        std::fs::remove_dir_all(&dram).expect("remove");
        pc.read().expect("other zones");
        copy_dir(saved.path(), &dram);
        set(dir.path(), "intel-rapl:0:2", 125);
        assert_eq!(
            energy(&pc.read().expect("back"), Domain::Dram, Some(0)),
            Some(100)
        );
        // Gone for longer than a wrap may take: 0, and reported.
        std::fs::remove_dir_all(&dram).expect("remove");
        pc.read().expect("other zones");
        for z in &mut pc.zones {
            if let Some(since) = z.gone.as_mut() {
                *since -= RESTART_AFTER;
            }
        }
        copy_dir(saved.path(), &dram);
        set(dir.path(), "intel-rapl:0:2", 500);
        assert_eq!(
            energy(&pc.read().expect("back"), Domain::Dram, Some(0)),
            Some(0)
        );
        assert!(
            pc.take_problems().iter().any(|p| p.contains("not known")),
            "said"
        );
        set(dir.path(), "intel-rapl:0:2", 520);
        assert_eq!(
            energy(&pc.read().expect("read"), Domain::Dram, Some(0)),
            Some(20)
        );
    }

    #[test]
    fn unreadable_energy_is_not_supported_with_the_fix() {
        let dir = fixture("intel-2s");
        for zone in std::fs::read_dir(dir.path().join("sys/class/powercap"))
            .expect("dir")
            .flatten()
        {
            let f = zone.path().join("energy_uj");
            if f.exists() {
                std::fs::set_permissions(&f, std::os::unix::fs::PermissionsExt::from_mode(0o400))
                    .expect("chmod");
            }
        }
        let sys = SysRoot::at(dir.path().join("sys"));
        // Read as another user, as an unprivileged wattprof would. fsuid is
        // per thread, so only this thread loses root's file access.
        let err = std::thread::spawn(move || {
            // SAFETY: setfsuid only changes this thread's filesystem uid.
            unsafe { libc::setfsuid(65534) };
            Powercap::open(&sys, INTEL).expect_err("unreadable")
        })
        .join()
        .expect("thread");
        match err {
            SourceError::NotSupported { reason, fix } => {
                assert!(reason.contains("permission denied"), "{reason}");
                assert!(fix.contains("root"), "{fix}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn no_powercap_at_all() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Powercap::open(&SysRoot::at(dir.path()), INTEL).expect_err("none");
        assert!(matches!(err, SourceError::NotSupported { .. }), "{err:?}");
    }
}
