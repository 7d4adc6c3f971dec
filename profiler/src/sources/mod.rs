//! Energy readers: one file per reader, all behind [`Source`].
//!
//! A reader knows counters, units, domains and sockets; it knows nothing of
//! processes. Every reader reports energy as deltas since its previous
//! read, with counter wraparound handled once, in [`counter`].

pub(crate) mod calibration;
pub(crate) mod counter;
pub mod estimate;
pub mod msr;
pub mod nvml;
pub(crate) mod perf;
pub(crate) mod powercap;
pub(crate) mod probe;
pub(crate) mod registry;
pub mod static_power;
pub mod wattmeter;

/// An energy domain of a CPU package or of the platform.
#[derive(
    Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum Domain {
    /// The whole package (cores, caches, uncore).
    Package,
    /// The cores (RAPL PP0).
    Core,
    /// The uncore or integrated GPU (RAPL PP1).
    Uncore,
    /// Memory attached to the package.
    Dram,
    /// The whole platform (RAPL PSYS), machine level.
    Psys,
    /// The whole machine at the wall socket, from an external wattmeter.
    Wall,
    /// A GPU (`package` is then its NVML index).
    Gpu,
}

impl Domain {
    /// Its label in tables and plots with its package or GPU index:
    /// `package 0`, `gpu 1`, `psys (machine)`.
    pub(crate) fn label(self, package: Option<u32>) -> String {
        match (self, package) {
            (Self::Gpu, Some(i)) => format!("gpu {i}"),
            (d, Some(p)) => format!("{} {p}", d.name()),
            (d, None) => format!("{} (machine)", d.name()),
        }
    }

    /// Name as the kernel's powercap zones and the reports spell it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Package => "package",
            Self::Core => "core",
            Self::Uncore => "uncore",
            Self::Dram => "dram",
            Self::Psys => "psys",
            Self::Wall => "wall",
            Self::Gpu => "gpu",
        }
    }
}

/// Which energy figure: a domain and its package (a kernel package id, a
/// GPU's NVML index, or `None` at machine level). Ordered by domain, then
/// package, as every table lists them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct DomainKey {
    /// Which domain.
    pub(crate) domain: Domain,
    /// Kernel package id, GPU index, or `None` (machine level).
    pub(crate) package: Option<u32>,
}

impl DomainKey {
    /// `domain` of `package`.
    pub(crate) fn new(domain: Domain, package: Option<u32>) -> Self {
        Self { domain, package }
    }
}

/// Energy of one domain over one interval.
#[derive(Clone, Debug, PartialEq)]
pub struct DomainEnergy {
    /// Which domain.
    pub domain: Domain,
    /// The package (the kernel's `physical_package_id`), the GPU index for
    /// [`Domain::Gpu`], or `None` for machine-level domains (psys, wall).
    pub package: Option<u32>,
    /// Microjoules since the previous read.
    pub energy_uj: u64,
    /// Modelled, not measured (a power model, GPU power integration).
    pub estimated: bool,
    /// The energy exists only because tasks ran (a model with no idle
    /// term, or a VM's energy exported by its host, which is its vCPU
    /// threads' run time): divided by busy time, none of it idle.
    pub busy_only: bool,
}

/// Why a reader cannot be used, or a read failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SourceError {
    /// The reader does not exist on this machine, or cannot be used with
    /// these privileges: `fix` says what would make it work.
    #[error("{reason}")]
    NotSupported {
        /// What is missing.
        reason: String,
        /// What the user can do.
        fix: String,
    },
    /// This read failed but a later one may work (a zone vanished, a
    /// transient I/O error).
    #[error("{0}")]
    Retryable(String),
    /// The reader is broken for good (counters went backwards past any
    /// wrap, unexpected format).
    #[error("{0}")]
    Fatal(String),
}

impl SourceError {
    /// A [`SourceError::NotSupported`].
    pub(crate) fn unsupported(reason: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::NotSupported {
            reason: reason.into(),
            fix: fix.into(),
        }
    }

    /// Why a reader is not used, and what would make it work (only a
    /// [`SourceError::NotSupported`] knows a fix).
    pub(crate) fn reason_and_fix(self) -> (String, Option<String>) {
        match self {
            Self::NotSupported { reason, fix } => (reason, Some(fix)),
            other => (other.to_string(), None),
        }
    }
}

/// What a reader found on this machine.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SourceInfo {
    /// Domains per package (`None`: machine level), in reading order.
    pub domains: Vec<(Domain, Option<u32>)>,
    /// Smallest energy step in microjoules, where known.
    pub resolution_uj: Option<f64>,
    /// Where it reads from (for people).
    pub location: String,
}

/// What a reader measures.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReaderKind {
    /// CPU packages (and the platform, RAPL PSYS).
    Cpu,
    /// GPUs.
    Gpu,
    /// The whole machine at the wall.
    Wall,
}

impl ReaderKind {
    /// As reports spell it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Cpu => "cpu",
            Self::Gpu => "gpu",
            Self::Wall => "wall",
        }
    }
}

/// An energy reader.
pub trait Source {
    /// Short name (`powercap`, `msr`).
    fn name(&self) -> &'static str;
    /// What it measures.
    fn kind(&self) -> ReaderKind;
    /// What it measures here.
    fn info(&self) -> SourceInfo;
    /// Energy per domain since the previous call. The first call returns
    /// no energy (it only establishes the counters' starting points).
    fn read(&mut self) -> Result<Vec<DomainEnergy>, SourceError>;
    /// The last read of a profile. A reader fed by a stream also counts
    /// what is still buffered (a last line without its newline); by
    /// default, a plain read.
    fn read_last(&mut self) -> Result<Vec<DomainEnergy>, SourceError> {
        self.read()
    }
    /// What failed in the last read while the rest was read (one GPU of
    /// several, a wattmeter's stream at the end): a line each.
    fn take_problems(&mut self) -> Vec<String> {
        Vec::new()
    }
    /// Per-device detail of the last read for readers of devices that
    /// processes use (GPUs: power, utilization and each process's share).
    fn take_gpu_readings(&mut self) -> Vec<nvml::GpuReading> {
        Vec::new()
    }
}

/// Maps an I/O error on a counter file to the right kind of failure.
pub(crate) fn classify_io(what: &str, err: &std::io::Error, fix_permission: &str) -> SourceError {
    match err.kind() {
        std::io::ErrorKind::PermissionDenied => {
            SourceError::unsupported(format!("{what}: permission denied"), fix_permission)
        }
        std::io::ErrorKind::NotFound => SourceError::Retryable(format!("{what}: vanished")),
        _ => SourceError::Retryable(format!("{what}: {err}")),
    }
}

/// Two readers that measured the same domain of the same package over the
/// same interval and disagree.
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub(crate) struct Disagreement {
    /// The domain.
    pub(crate) domain: Domain,
    /// The package (`None`: machine level).
    pub(crate) package: Option<u32>,
    /// First reader and its microjoules.
    pub(crate) a: (String, u64),
    /// Second reader and its microjoules.
    pub(crate) b: (String, u64),
    /// |a - b| / max(a, b).
    pub(crate) relative: f64,
}

/// Readers disagreeing by more than this are reported.
pub(crate) const DISAGREEMENT_THRESHOLD: f64 = 0.05;

/// Compares readers' energy over one interval, domain by domain. Pairs where
/// both saw less than `floor_uj` are too small to compare and are skipped;
/// estimated figures are not measurements and are never compared.
pub(crate) fn cross_check(
    readings: &[(String, Vec<DomainEnergy>)],
    floor_uj: u64,
) -> Vec<Disagreement> {
    let mut out = Vec::new();
    for (i, (name_a, a)) in readings.iter().enumerate() {
        for (name_b, b) in &readings[i + 1..] {
            for ea in a.iter().filter(|e| !e.estimated) {
                let Some(eb) = b
                    .iter()
                    .filter(|e| !e.estimated)
                    .find(|eb| eb.domain == ea.domain && eb.package == ea.package)
                else {
                    continue;
                };
                let hi = ea.energy_uj.max(eb.energy_uj);
                if hi < floor_uj {
                    continue;
                }
                let relative = ea.energy_uj.abs_diff(eb.energy_uj) as f64 / hi as f64;
                if relative > DISAGREEMENT_THRESHOLD {
                    out.push(Disagreement {
                        domain: ea.domain,
                        package: ea.package,
                        a: (name_a.clone(), ea.energy_uj),
                        b: (name_b.clone(), eb.energy_uj),
                        relative,
                    });
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn e(domain: Domain, package: Option<u32>, energy_uj: u64) -> DomainEnergy {
        DomainEnergy {
            domain,
            package,
            energy_uj,
            estimated: false,
            busy_only: false,
        }
    }

    #[test]
    fn reports_only_matching_domains_that_disagree_beyond_five_percent() {
        let readings = vec![
            (
                "powercap".to_string(),
                vec![
                    e(Domain::Package, Some(0), 100_000_000),
                    e(Domain::Package, Some(1), 100_000_000),
                    e(Domain::Dram, Some(0), 10),
                ],
            ),
            (
                "msr".to_string(),
                vec![
                    e(Domain::Package, Some(0), 104_000_000),
                    e(Domain::Package, Some(1), 80_000_000),
                    e(Domain::Dram, Some(0), 30),
                    e(Domain::Core, Some(0), 5),
                ],
            ),
        ];
        let d = cross_check(&readings, 1_000);
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!((d[0].domain, d[0].package), (Domain::Package, Some(1)));
        assert_eq!(d[0].a, ("powercap".to_string(), 100_000_000));
        assert!((d[0].relative - 0.2).abs() < 1e-12);
    }
}
