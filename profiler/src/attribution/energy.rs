//! Energy by kind of domain, in µJ: what the engine gives each consumer.

use serde::Serialize;

use crate::sources::Domain;

/// Energy by kind of domain (µJ), for one consumer or group.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
pub struct EnergyBy {
    /// CPU package energy (cores, caches, uncore), all packages.
    pub package_uj: u64,
    /// Core (PP0) energy: part of `package_uj`, where the CPU reports it.
    pub core_uj: u64,
    /// DRAM energy.
    pub dram_uj: u64,
    /// GPU energy, all GPUs.
    pub gpu_uj: u64,
    /// Wall energy from a calibration (`--calibration`): the same energy
    /// seen at the wall, so never added to the others.
    pub wall_uj: u64,
    /// The static part of `package_uj` (rent for the CPU time held; the
    /// rest is dynamic: what running caused).
    pub package_static_uj: u64,
    /// The static part of `core_uj`.
    pub core_static_uj: u64,
    /// The static part of `dram_uj`.
    pub dram_static_uj: u64,
    /// The static part of `gpu_uj` (0 until GPUs have a static figure).
    pub gpu_static_uj: u64,
}

impl EnergyBy {
    /// Adds `uj` of `domain` (uncore and psys are not kept per consumer
    /// and are ignored; wall is, when a calibration divides it).
    pub(crate) fn add(&mut self, domain: Domain, uj: u64) {
        match domain {
            Domain::Package => self.package_uj += uj,
            Domain::Core => self.core_uj += uj,
            Domain::Dram => self.dram_uj += uj,
            Domain::Gpu => self.gpu_uj += uj,
            Domain::Wall => self.wall_uj += uj,
            Domain::Uncore | Domain::Psys => {}
        }
    }

    /// The energy of `domain` in this sum (0 for domains a sum does not
    /// keep: uncore and psys are inside package).
    pub(crate) fn of(&self, domain: Domain) -> u64 {
        match domain {
            Domain::Package => self.package_uj,
            Domain::Core => self.core_uj,
            Domain::Dram => self.dram_uj,
            Domain::Gpu => self.gpu_uj,
            Domain::Wall => self.wall_uj,
            Domain::Uncore | Domain::Psys => 0,
        }
    }

    /// Marks `uj` of what was added for `domain` as static.
    pub(crate) fn add_static(&mut self, domain: Domain, uj: u64) {
        match domain {
            Domain::Package => self.package_static_uj += uj,
            Domain::Core => self.core_static_uj += uj,
            Domain::Dram => self.dram_static_uj += uj,
            Domain::Gpu => self.gpu_static_uj += uj,
            // A calibrated wall's static power is the node's (idle).
            Domain::Wall | Domain::Uncore | Domain::Psys => {}
        }
    }

    /// The static part of [`EnergyBy::total_uj`].
    pub(crate) fn static_uj(&self) -> u64 {
        self.package_static_uj + self.dram_static_uj + self.gpu_static_uj
    }

    /// The dynamic part of [`EnergyBy::total_uj`].
    pub(crate) fn dynamic_uj(&self) -> u64 {
        self.total_uj().saturating_sub(self.static_uj())
    }

    /// `part / whole` of each domain (rounded down; all of it when
    /// `whole` is 0 or `part` is all of it).
    pub(crate) fn share(&self, part: u64, whole: u64) -> EnergyBy {
        if whole == 0 || part >= whole {
            return *self;
        }
        let f = |uj: u64| (u128::from(uj) * u128::from(part) / u128::from(whole)) as u64;
        EnergyBy {
            package_uj: f(self.package_uj),
            core_uj: f(self.core_uj),
            dram_uj: f(self.dram_uj),
            gpu_uj: f(self.gpu_uj),
            wall_uj: f(self.wall_uj),
            package_static_uj: f(self.package_static_uj),
            core_static_uj: f(self.core_static_uj),
            dram_static_uj: f(self.dram_static_uj),
            gpu_static_uj: f(self.gpu_static_uj),
        }
    }

    /// This sum less `o` (never below zero).
    pub(crate) fn less(&self, o: &EnergyBy) -> EnergyBy {
        EnergyBy {
            package_uj: self.package_uj.saturating_sub(o.package_uj),
            core_uj: self.core_uj.saturating_sub(o.core_uj),
            dram_uj: self.dram_uj.saturating_sub(o.dram_uj),
            gpu_uj: self.gpu_uj.saturating_sub(o.gpu_uj),
            wall_uj: self.wall_uj.saturating_sub(o.wall_uj),
            package_static_uj: self.package_static_uj.saturating_sub(o.package_static_uj),
            core_static_uj: self.core_static_uj.saturating_sub(o.core_static_uj),
            dram_static_uj: self.dram_static_uj.saturating_sub(o.dram_static_uj),
            gpu_static_uj: self.gpu_static_uj.saturating_sub(o.gpu_static_uj),
        }
    }

    /// Adds another sum.
    pub(crate) fn merge(&mut self, o: &EnergyBy) {
        self.package_uj += o.package_uj;
        self.core_uj += o.core_uj;
        self.dram_uj += o.dram_uj;
        self.gpu_uj += o.gpu_uj;
        self.wall_uj += o.wall_uj;
        self.package_static_uj += o.package_static_uj;
        self.core_static_uj += o.core_static_uj;
        self.dram_static_uj += o.dram_static_uj;
        self.gpu_static_uj += o.gpu_static_uj;
    }

    /// Package + DRAM + GPU (core is inside package).
    pub(crate) fn total_uj(&self) -> u64 {
        self.package_uj + self.dram_uj + self.gpu_uj
    }
}
