//! "No reader" is one way in every JSON this crate writes: a domain that
//! nothing measures or estimates (DRAM without RAPL, a GPU without NVML)
//! has no field at all in a process's, group's or window's energy, never
//! `0.0`, which would claim a reading of zero (docs/glossary.md).
//!
//! The energy types ([`super::EnergyJ`], [`super::record::ProcessRow`],
//! [`super::record::GroupRow`]) keep plain `f64`s, 0 where nothing was
//! read, so their arithmetic stays simple. Which domains have a reader is
//! known to the profile (the domains its ledger has read so far: a
//! document's `domains`), not to each value,
//! so a writer serialises inside [`writing`], which tells the fields'
//! `skip_serializing_if` which domains to leave out. Outside it nothing
//! is left out. Reading back, an absent field is 0 (`serde(default)`),
//! and the document's `domains` says it was not read.

use std::cell::Cell;

use crate::sources::Domain;

/// The domains a document has a reader for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Read {
    package: bool,
    core: bool,
    dram: bool,
    gpu: bool,
}

impl Read {
    /// Every domain: nothing is left out.
    pub(crate) const ALL: Self = Self {
        package: true,
        core: true,
        dram: true,
        gpu: true,
    };

    /// No domain (before anything was read).
    pub(crate) const NONE: Self = Self {
        package: false,
        core: false,
        dram: false,
        gpu: false,
    };

    /// The domains among `domains` (a document's domain rows).
    pub(crate) fn of(domains: impl IntoIterator<Item = Domain>) -> Self {
        let mut r = Self::NONE;
        for d in domains {
            match d {
                Domain::Package => r.package = true,
                Domain::Core => r.core = true,
                Domain::Dram => r.dram = true,
                Domain::Gpu => r.gpu = true,
                _ => {}
            }
        }
        r
    }

    /// The domains of either.
    pub(crate) fn or(self, other: Self) -> Self {
        Self {
            package: self.package || other.package,
            core: self.core || other.core,
            dram: self.dram || other.dram,
            gpu: self.gpu || other.gpu,
        }
    }

    /// What a window's energy leaves out: the domains `so_far` read
    /// (the profile's, up to now) and those measured in the window.
    pub(crate) fn of_window(so_far: Self, w: &super::WindowReport) -> Self {
        so_far.or(Self::of(w.machine.iter().map(|m| m.domain)))
    }

    /// Whether `d` has a reader.
    pub(crate) fn has(&self, d: Domain) -> bool {
        match d {
            Domain::Package => self.package,
            Domain::Core => self.core,
            Domain::Dram => self.dram,
            Domain::Gpu => self.gpu,
            _ => true,
        }
    }
}

thread_local! {
    static READ: Cell<Read> = const { Cell::new(Read::ALL) };
}

/// Runs `f` (a serialisation) with the domains outside `read` left out
/// of every energy value it writes; restores the outer setting after,
/// also when `f` panics.
pub(crate) fn writing<T>(read: Read, f: impl FnOnce() -> T) -> T {
    struct Restore(Read);
    impl Drop for Restore {
        fn drop(&mut self) {
            READ.with(|c| c.set(self.0));
        }
    }
    let _restore = Restore(READ.with(|c| c.replace(read)));
    f()
}

fn unread(d: Domain) -> bool {
    !READ.with(|c| c.get().has(d))
}

/// `skip_serializing_if` of a package figure.
pub(crate) fn package(_: &f64) -> bool {
    unread(Domain::Package)
}

/// `skip_serializing_if` of a core figure.
pub(crate) fn core(_: &f64) -> bool {
    unread(Domain::Core)
}

/// `skip_serializing_if` of a DRAM figure.
pub(crate) fn dram(_: &f64) -> bool {
    unread(Domain::Dram)
}

/// `skip_serializing_if` of a GPU figure.
pub(crate) fn gpu(_: &f64) -> bool {
    unread(Domain::Gpu)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::EnergyJ;

    #[test]
    fn a_domain_without_a_reader_is_absent_only_inside_writing() {
        let e = EnergyJ {
            package_j: 1.5,
            ..EnergyJ::default()
        };
        let everything = serde_json::to_value(e).expect("json");
        for k in ["package_j", "core_j", "dram_j", "gpu_j"] {
            assert!(everything.get(k).is_some(), "{k} outside writing");
        }
        let read = Read::of([Domain::Package]);
        let v = writing(read, || serde_json::to_value(e).expect("json"));
        assert_eq!(v["package_j"], 1.5);
        for k in ["core_j", "dram_j", "gpu_j"] {
            assert!(v.get(k).is_none(), "{k} written without a reader: {v}");
        }
        // Restored after.
        assert!(
            serde_json::to_value(e)
                .expect("json")
                .get("dram_j")
                .is_some()
        );
        // And read back as 0.
        let back: EnergyJ = serde_json::from_value(v).expect("read back");
        assert_eq!(back.dram_j, 0.0);
        assert_eq!(back.package_j, 1.5);
    }
}
