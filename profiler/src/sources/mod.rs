//! Energy readers: one file per reader, all behind [`Source`].
//!
//! A reader knows counters, units, domains and sockets; it knows nothing of
//! processes. Every reader reports energy as deltas since its previous
//! read, with counter wraparound handled once, in [`counter`].

pub mod counter;
pub mod msr;
pub mod perf;
pub mod powercap;
pub mod wattmeter;

use serde::Serialize;

/// An energy domain of a CPU package or of the platform.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
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
}

impl Domain {
    /// Name as the kernel's powercap zones and the reports spell it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Package => "package",
            Self::Core => "core",
            Self::Uncore => "uncore",
            Self::Dram => "dram",
            Self::Psys => "psys",
            Self::Wall => "wall",
        }
    }
}

/// Energy of one domain over one interval.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct DomainEnergy {
    /// Which domain.
    pub domain: Domain,
    /// The package (the kernel's `physical_package_id`), or `None` for
    /// machine-level domains (psys).
    pub package: Option<u32>,
    /// Microjoules since the previous read.
    pub energy_uj: u64,
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
    pub fn unsupported(reason: impl Into<String>, fix: impl Into<String>) -> Self {
        Self::NotSupported {
            reason: reason.into(),
            fix: fix.into(),
        }
    }
}

/// What a reader found on this machine.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SourceInfo {
    /// Domains per package (`None`: machine level), in reading order.
    pub domains: Vec<(Domain, Option<u32>)>,
    /// Smallest energy step in microjoules, where known.
    pub resolution_uj: Option<f64>,
    /// Where it reads from (for people).
    pub location: String,
}

/// An energy reader.
pub trait Source {
    /// Short name (`powercap`, `msr`).
    fn name(&self) -> &'static str;
    /// What it measures here.
    fn info(&self) -> SourceInfo;
    /// Energy per domain since the previous call. The first call returns
    /// no energy (it only establishes the counters' starting points).
    fn read(&mut self) -> Result<Vec<DomainEnergy>, SourceError>;
}

/// Maps an I/O error on a counter file to the right kind of failure.
pub fn classify_io(what: &str, err: &std::io::Error, fix_permission: &str) -> SourceError {
    match err.kind() {
        std::io::ErrorKind::PermissionDenied => {
            SourceError::unsupported(format!("{what}: permission denied"), fix_permission)
        }
        std::io::ErrorKind::NotFound => SourceError::Retryable(format!("{what}: vanished")),
        _ => SourceError::Retryable(format!("{what}: {err}")),
    }
}
