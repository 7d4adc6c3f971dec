//! RAPL through model-specific registers (`/dev/cpu/N/msr`), one CPU per
//! package.
//!
//! Intel: unit register `0x606` (energy status unit in bits 12:8, one step
//! is 1/2^ESU J); package `0x611`, PP0/core `0x639`, PP1/uncore `0x641`,
//! DRAM `0x619`, platform `0x64D`. Haswell to Ice Lake server parts count
//! DRAM in a fixed 15.3 µJ step whatever the unit register says, and
//! Sapphire Rapids and later count platform (PSYS) energy in 1 J steps (as
//! Linux's `drivers/powercap/intel_rapl_common.c` server defaults do).
//! AMD and Hygon family 17h and later: unit `0xC0010299`, package
//! `0xC001029B`. (Their core counter `0xC001029A` is per core, not per
//! package, and is not read yet.) All counters are 32 bits and wrap.

use std::fs::File;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use super::{
    Domain, DomainEnergy, Source, SourceError, SourceInfo, classify_io,
    counter::{EnergyCounter, WrappingCounter},
};
use crate::topology::{SysRoot, Topology};

/// Where the MSR devices are; injectable so tests can use sparse files.
#[derive(Clone, Debug)]
pub(crate) struct MsrRoot(PathBuf);

impl MsrRoot {
    /// The real `/dev/cpu`.
    pub(crate) fn real() -> Self {
        Self(PathBuf::from("/dev/cpu"))
    }

    /// A directory holding `N/msr` files.
    pub(crate) fn at(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    /// The device of CPU `cpu`.
    pub(crate) fn device(&self, cpu: u32) -> PathBuf {
        self.0.join(cpu.to_string()).join("msr")
    }

    fn is_real(&self) -> bool {
        self.0 == Path::new("/dev/cpu")
    }
}

/// The CPU's RAPL register set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Vendor {
    /// Intel, with the unit quirks of some server parts.
    Intel {
        /// DRAM counts 2^-16 J per step regardless of the unit register.
        fixed_dram_unit: bool,
        /// PSYS counts 1 J per step.
        joule_psys_unit: bool,
    },
    /// AMD or Hygon, family 17h or later.
    Amd,
}

/// Intel models (family 6) whose DRAM energy unit is fixed at 2^-16 J:
/// Haswell-X, Broadwell-X/D, Skylake-X (and Cascade/Cooper Lake),
/// Ice Lake-X/D, Xeon Phi KNL/KNM. (Sapphire Rapids dropped the quirk.)
const FIXED_DRAM_UNIT_MODELS: &[u32] = &[0x3F, 0x4F, 0x56, 0x55, 0x6A, 0x6C, 0x57, 0x85];

/// Intel models whose PSYS counter counts whole joules: Sapphire Rapids-X,
/// Emerald Rapids-X, Granite Rapids-X/D, Sierra Forest-X.
const JOULE_PSYS_UNIT_MODELS: &[u32] = &[0x8F, 0xCF, 0xAD, 0xAE, 0xAF];

/// Which RAPL registers this CPU has, from `/proc/cpuinfo` text.
pub fn detect_vendor(cpuinfo: &str) -> Option<Vendor> {
    let field = |name: &str| {
        cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == name).then(|| v.trim().to_string())
        })
    };
    let vendor = field("vendor_id")?;
    let family: u32 = field("cpu family")?.parse().ok()?;
    let model: u32 = field("model")?.parse().ok()?;
    match vendor.as_str() {
        "GenuineIntel" if family == 6 => Some(Vendor::Intel {
            fixed_dram_unit: FIXED_DRAM_UNIT_MODELS.contains(&model),
            joule_psys_unit: JOULE_PSYS_UNIT_MODELS.contains(&model),
        }),
        "AuthenticAMD" | "HygonGenuine" if family >= 0x17 => Some(Vendor::Amd),
        _ => None,
    }
}

#[derive(Debug)]
struct Register {
    domain: Domain,
    package: Option<u32>,
    file: usize,
    address: u64,
    counter: EnergyCounter,
}

/// The MSR reader.
#[derive(Debug)]
pub(crate) struct Msr {
    root: MsrRoot,
    files: Vec<File>,
    registers: Vec<Register>,
}

fn read_msr(file: &File, address: u64) -> std::io::Result<u64> {
    let mut buf = [0u8; 8];
    file.read_exact_at(&mut buf, address)?;
    Ok(u64::from_le_bytes(buf))
}

const PERMISSION_FIX: &str = "run wattprof as root, or grant it CAP_SYS_RAWIO and \
     CAP_DAC_READ_SEARCH (the msr devices are root-only, and the driver checks CAP_SYS_RAWIO)";

/// Opens a CPU's MSR device: missing (the module not loaded, or modprobe
/// failed) and not permitted each reported with its fix.
fn open_device(path: &std::path::Path, modprobe_failed: bool) -> Result<File, SourceError> {
    File::open(path).map_err(|e| match e.kind() {
        std::io::ErrorKind::NotFound if modprobe_failed => SourceError::unsupported(
            format!("no {}, and `modprobe msr` failed", path.display()),
            "load the msr driver (needs modprobe from kmod and a kernel with CONFIG_X86_MSR), or use powercap",
        ),
        std::io::ErrorKind::NotFound => SourceError::unsupported(
            format!("no {} (the msr module is not loaded)", path.display()),
            "modprobe msr (as root)",
        ),
        _ => classify_io(&path.display().to_string(), &e, PERMISSION_FIX),
    })
}

/// The RAPL unit register and the energy registers of a vendor's CPUs.
fn rapl_registers(vendor: Vendor) -> (u64, &'static [(Domain, u64)]) {
    match vendor {
        Vendor::Intel { .. } => (
            0x606,
            &[
                (Domain::Package, 0x611),
                (Domain::Core, 0x639),
                (Domain::Uncore, 0x641),
                (Domain::Dram, 0x619),
                (Domain::Psys, 0x64D),
            ],
        ),
        Vendor::Amd => (0xC001_0299, &[(Domain::Package, 0xC001_029B)]),
    }
}

/// Joules per counter step of `domain`: the unit register's, but for
/// Intel's fixed DRAM unit and joule-unit platform counter.
fn joules_per_step(vendor: Vendor, domain: Domain, step: f64) -> f64 {
    match (vendor, domain) {
        (
            Vendor::Intel {
                fixed_dram_unit: true,
                ..
            },
            Domain::Dram,
        ) => 1.0 / 65536.0,
        (
            Vendor::Intel {
                joule_psys_unit: true,
                ..
            },
            Domain::Psys,
        ) => 1.0,
        _ => step,
    }
}

impl Msr {
    /// Opens one MSR device per package and finds its RAPL registers.
    /// Loads the `msr` module first when the devices are missing.
    pub(crate) fn open(sys: &SysRoot, root: &MsrRoot, cpuinfo: &str) -> Result<Self, SourceError> {
        let vendor = detect_vendor(cpuinfo).ok_or_else(|| {
            SourceError::unsupported(
                "this CPU has no RAPL registers wattprof knows (Intel family 6, AMD/Hygon 17h+)",
                "use another reader, or an external wattmeter",
            )
        })?;
        let topology = Topology::read(sys).map_err(|e| SourceError::Fatal(e.to_string()))?;
        let mut cpus: Vec<(u32, u32)> = Vec::new(); // (package id, cpu)
        for &cpu in &topology.online {
            let package = topology.package_id_of(cpu);
            if !cpus.iter().any(|(p, _)| *p == package) {
                cpus.push((package, cpu));
            }
        }
        let mut modprobe_failed = false;
        if root.is_real() && cpus.first().is_some_and(|(_, c)| !root.device(*c).exists()) {
            modprobe_failed = !std::process::Command::new("modprobe")
                .arg("msr")
                .stderr(std::process::Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
        }
        let mut files = Vec::new();
        let mut registers = Vec::new();
        for (i, &(package, cpu)) in cpus.iter().enumerate() {
            let path = root.device(cpu);
            let file = open_device(&path, modprobe_failed)?;
            let (unit_reg, regs) = rapl_registers(vendor);
            let units = read_msr(&file, unit_reg).map_err(|e| {
                SourceError::unsupported(
                    format!(
                        "{}: cannot read the RAPL unit register {unit_reg:#x}: {e}",
                        path.display()
                    ),
                    "this CPU or hypervisor does not expose RAPL MSRs",
                )
            })?;
            let step = 1.0 / f64::from(1u32 << ((units >> 8) & 0x1f));
            for &(domain, address) in regs {
                // Platform energy is one counter for the machine.
                if domain == Domain::Psys && i > 0 {
                    continue;
                }
                // A register the CPU lacks fails to read (EIO): skip it.
                let Ok(raw) = read_msr(&file, address) else {
                    continue;
                };
                let joules_per_step = joules_per_step(vendor, domain, step);
                let mut counter = EnergyCounter::new(WrappingCounter::bits(32), joules_per_step);
                counter.advance(raw);
                registers.push(Register {
                    domain,
                    package: (domain != Domain::Psys).then_some(package),
                    file: files.len(),
                    address,
                    counter,
                });
            }
            files.push(file);
        }
        if registers.is_empty() {
            return Err(SourceError::unsupported(
                "no RAPL energy register could be read",
                "this CPU or hypervisor does not expose RAPL MSRs",
            ));
        }
        Ok(Self {
            root: root.clone(),
            files,
            registers,
        })
    }
}

impl Source for Msr {
    fn name(&self) -> &'static str {
        "msr"
    }

    fn kind(&self) -> super::ReaderKind {
        super::ReaderKind::Cpu
    }

    fn info(&self) -> SourceInfo {
        SourceInfo {
            domains: self
                .registers
                .iter()
                .map(|r| (r.domain, r.package))
                .collect(),
            resolution_uj: self
                .registers
                .iter()
                .map(|r| r.counter.joules_per_step() * 1e6)
                .reduce(f64::min),
            location: self.root.0.display().to_string(),
        }
    }

    /// Counters were read when opened, so even the first read reports the
    /// energy since then.
    fn read(&mut self) -> Result<Vec<DomainEnergy>, SourceError> {
        // All registers first: if one fails, no counter has advanced, and
        // the next read still covers this interval.
        let raws = self
            .registers
            .iter()
            .map(|r| {
                read_msr(&self.files[r.file], r.address)
                    .map_err(|e| classify_io(&format!("MSR {:#x}", r.address), &e, PERMISSION_FIX))
            })
            .collect::<Result<Vec<u64>, SourceError>>()?;
        let mut out = Vec::with_capacity(self.registers.len());
        for (r, raw) in self.registers.iter_mut().zip(raws) {
            out.push(DomainEnergy {
                domain: r.domain,
                package: r.package,
                energy_uj: r.counter.advance(raw).unwrap_or(0),
                estimated: false,
                busy_only: false,
            });
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::topology;

    const INTEL_SKX: &str = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 85\n";
    const INTEL_SPR: &str = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n";
    const INTEL_CLIENT: &str = "vendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 151\n";
    const AMD_ZEN3: &str = "vendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 1\n";

    /// A sparse file standing in for `/dev/cpu/N/msr`: pread at a register's
    /// address returns what was written there.
    fn device(root: &Path, cpu: u32, regs: &[(u64, u64)]) {
        let dir = root.join(cpu.to_string());
        std::fs::create_dir_all(&dir).expect("mkdir");
        let f = File::create(dir.join("msr")).expect("create");
        f.set_len(0xC001_1000).expect("sparse length");
        for &(addr, v) in regs {
            f.write_all_at(&v.to_le_bytes(), addr).expect("pwrite");
        }
    }

    fn write_reg(root: &Path, cpu: u32, addr: u64, v: u64) {
        let f = std::fs::OpenOptions::new()
            .write(true)
            .open(root.join(cpu.to_string()).join("msr"))
            .expect("open");
        f.write_all_at(&v.to_le_bytes(), addr).expect("pwrite");
    }

    fn get(r: &[DomainEnergy], d: Domain, p: Option<u32>) -> u64 {
        r.iter()
            .find(|e| e.domain == d && e.package == p)
            .map(|e| e.energy_uj)
            .expect("domain present")
    }

    #[test]
    fn vendors() {
        assert_eq!(
            detect_vendor(INTEL_SKX),
            Some(Vendor::Intel {
                fixed_dram_unit: true,
                joule_psys_unit: false
            })
        );
        assert_eq!(
            detect_vendor(INTEL_CLIENT),
            Some(Vendor::Intel {
                fixed_dram_unit: false,
                joule_psys_unit: false
            })
        );
        assert_eq!(
            detect_vendor(INTEL_SPR),
            Some(Vendor::Intel {
                fixed_dram_unit: false,
                joule_psys_unit: true
            })
        );
        assert_eq!(detect_vendor(AMD_ZEN3), Some(Vendor::Amd));
        assert_eq!(
            detect_vendor("vendor_id: AuthenticAMD\ncpu family: 21\nmodel: 2\n"),
            None
        );
    }

    #[test]
    fn intel_server_two_packages_units_dram_unit_and_wrap() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sys, dev) = (dir.path().join("sys"), dir.path().join("dev"));
        topology(&sys, 4, 2);
        // ESU 14: 61.035 µJ per step. Package 1 is CPU 2.
        let unit = 14 << 8;
        for cpu in [0, 2] {
            device(
                &dev,
                cpu,
                &[
                    (0x606, unit),
                    (0x611, 0xffff_ff00),
                    (0x639, 10),
                    (0x619, 100),
                ],
            );
        }
        // No PP1/PSYS on this part: those registers read as EIO on real
        // hardware; a sparse file reads zeros, which count nothing.
        let mut msr = Msr::open(&SysRoot::at(&sys), &MsrRoot::at(&dev), INTEL_SKX).expect("open");
        let domains: Vec<_> = msr.info().domains;
        assert!(domains.contains(&(Domain::Package, Some(1))), "{domains:?}");
        assert_eq!(
            msr.info().resolution_uj.map(|r| (r * 1000.0).round()),
            Some(15259.0)
        );
        // Package 0 wraps: 0xffffff00 -> 0x100 is 0x200 steps.
        write_reg(&dev, 0, 0x611, 0x100);
        // DRAM: 65,536 steps at the fixed 2^-16 J unit = exactly 1 J.
        write_reg(&dev, 2, 0x619, 100 + 65_536);
        let r = msr.read().expect("read");
        assert_eq!(
            get(&r, Domain::Package, Some(0)),
            (512.0 * 1e6 / 16384.0) as u64
        );
        assert_eq!(get(&r, Domain::Dram, Some(1)), 1_000_000);
        assert_eq!(get(&r, Domain::Package, Some(1)), 0);
    }

    #[test]
    fn sapphire_rapids_dram_follows_the_unit_register_and_psys_counts_joules() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sys, dev) = (dir.path().join("sys"), dir.path().join("dev"));
        topology(&sys, 2, 1);
        device(&dev, 0, &[(0x606, 14 << 8), (0x619, 0), (0x64D, 1000)]);
        let mut msr = Msr::open(&SysRoot::at(&sys), &MsrRoot::at(&dev), INTEL_SPR).expect("open");
        write_reg(&dev, 0, 0x619, 16_384);
        write_reg(&dev, 0, 0x64D, 1_250);
        let r = msr.read().expect("read");
        assert_eq!(
            get(&r, Domain::Dram, Some(0)),
            1_000_000,
            "16,384 steps of 61 µJ"
        );
        assert_eq!(get(&r, Domain::Psys, None), 250_000_000, "250 steps of 1 J");
    }

    #[test]
    fn a_failed_read_loses_no_energy() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sys, dev) = (dir.path().join("sys"), dir.path().join("dev"));
        topology(&sys, 2, 2);
        for cpu in [0, 1] {
            device(&dev, cpu, &[(0x606, 14 << 8), (0x611, 0)]);
        }
        let mut msr =
            Msr::open(&SysRoot::at(&sys), &MsrRoot::at(&dev), INTEL_CLIENT).expect("open");
        write_reg(&dev, 0, 0x611, 16_384);
        // Package 1's device breaks (CPU offline): the read fails whole.
        std::fs::rename(dev.join("1/msr"), dev.join("1/msr.saved")).expect("set aside");
        std::fs::create_dir(dev.join("1/msr")).expect("dir in its place");
        msr.files[1] = File::open(dev.join("1/msr")).expect("open dir");
        assert!(msr.read().is_err());
        std::fs::remove_dir(dev.join("1/msr")).expect("rmdir");
        std::fs::rename(dev.join("1/msr.saved"), dev.join("1/msr")).expect("restore");
        msr.files[1] = File::open(dev.join("1/msr")).expect("reopen");
        // Package 0's energy of both intervals is still there.
        assert_eq!(
            get(&msr.read().expect("read"), Domain::Package, Some(0)),
            1_000_000
        );
    }

    #[test]
    fn rounding_carries_instead_of_drifting() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sys, dev) = (dir.path().join("sys"), dir.path().join("dev"));
        topology(&sys, 1, 1);
        device(&dev, 0, &[(0x606, 14 << 8), (0x611, 0)]);
        let mut msr =
            Msr::open(&SysRoot::at(&sys), &MsrRoot::at(&dev), INTEL_CLIENT).expect("open");
        let mut total = 0;
        for i in 1..=1000u64 {
            write_reg(&dev, 0, 0x611, i);
            total += get(&msr.read().expect("read"), Domain::Package, Some(0));
        }
        // 1000 steps of 61.03515625 µJ = 61035.15625 µJ.
        assert_eq!(total, 61_035);
    }

    #[test]
    fn amd_package_counter() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sys, dev) = (dir.path().join("sys"), dir.path().join("dev"));
        topology(&sys, 2, 1);
        // AMD's default ESU is 16: 15.26 µJ per step.
        device(&dev, 0, &[(0xC001_0299, 0x000A_1003), (0xC001_029B, 5)]);
        let mut msr = Msr::open(&SysRoot::at(&sys), &MsrRoot::at(&dev), AMD_ZEN3).expect("open");
        assert_eq!(msr.info().domains, vec![(Domain::Package, Some(0))]);
        write_reg(&dev, 0, 0xC001_029B, 5 + 65_536 * 3);
        assert_eq!(
            get(&msr.read().expect("read"), Domain::Package, Some(0)),
            3_000_000
        );
    }

    #[test]
    fn missing_device_says_modprobe() {
        let dir = tempfile::tempdir().expect("tempdir");
        let sys = dir.path().join("sys");
        topology(&sys, 1, 1);
        let err = Msr::open(
            &SysRoot::at(&sys),
            &MsrRoot::at(dir.path().join("dev")),
            INTEL_CLIENT,
        )
        .expect_err("no device");
        match err {
            SourceError::NotSupported { fix, .. } => assert!(fix.contains("modprobe msr"), "{fix}"),
            other => panic!("{other:?}"),
        }
    }
}
