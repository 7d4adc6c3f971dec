//! The registry of energy readers: the CPU counters in the order they are
//! tried ([`CpuCounter::ALL`]), and the readers a profile uses: the first CPU
//! counter that works (or a power model), NVML when there are GPUs, and
//! a wattmeter when one is given. `run`, `monitor` and `sources` all open
//! readers through here, and every reader is read through [`Source`].

use std::borrow::Cow;
use std::ffi::OsString;
use std::path::PathBuf;

use super::calibration::{Calibration, Regressor, WallModel, WallPer};
use super::estimate::{self, ModelRequest, PowerModel};
use super::nvml::{GpuEnergyMethod, GpuInfo, GpuReading, NvmlGpus};
use super::wattmeter::Wattmeter;
use super::{
    Domain, DomainEnergy, DomainKey, ReaderKind, Source, SourceError, msr::MsrRoot,
    perf::PerfPower, powercap::Powercap,
};
use crate::topology::SysRoot;

/// A CPU energy counter wattprof can read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CpuCounter {
    /// The kernel's RAPL driver (`/sys/class/powercap`).
    Powercap,
    /// perf's `power` PMU.
    Perf,
    /// The RAPL MSRs themselves (`/dev/cpu/N/msr`).
    Msr,
}

impl CpuCounter {
    /// All of them, in the order they are tried.
    pub(crate) const ALL: [CpuCounter; 3] = [Self::Powercap, Self::Perf, Self::Msr];

    /// Its name, as `sources` and the recordings spell it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Powercap => "powercap",
            Self::Perf => "perf",
            Self::Msr => "msr",
        }
    }

    /// Opens it on `m`, or says why it does not open.
    pub(crate) fn open(self, m: CpuMachine<'_>) -> Opened {
        match self {
            Self::Powercap => {
                Powercap::open(m.sys, m.cpuinfo).map(|p| Box::new(p) as Box<dyn Source>)
            }
            Self::Perf => PerfPower::open(m.sys).map(|p| Box::new(p) as Box<dyn Source>),
            Self::Msr => super::msr::Msr::open(m.sys, m.msr_root, m.cpuinfo)
                .map(|p| Box::new(p) as Box<dyn Source>),
        }
    }
}

/// Where the CPU counters are looked for.
#[derive(Clone, Copy, Debug)]
pub(crate) struct CpuMachine<'a> {
    /// sysfs.
    pub(crate) sys: &'a SysRoot,
    /// `/dev/cpu`, for the MSRs.
    pub(crate) msr_root: &'a MsrRoot,
    /// `/proc/cpuinfo`'s text.
    pub(crate) cpuinfo: &'a str,
}

/// A CPU counter opened, or why it does not open.
pub(crate) type Opened = Result<Box<dyn Source>, SourceError>;

/// Every CPU counter in order, opened or with why it does not open.
pub(crate) fn cpu_counters(m: CpuMachine<'_>) -> Vec<(&'static str, Opened)> {
    CpuCounter::ALL
        .iter()
        .map(|c| (c.name(), c.open(m)))
        .collect()
}

/// Which readers to try, from the command line.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReaderConfig {
    /// sysfs root for the CPU energy readers (`/sys`; a fixture in tests).
    pub(crate) sys: Option<PathBuf>,
    /// The power model to use where no counter works.
    pub(crate) model: ModelRequest,
    /// A powercap tree to read as the CPU counter (a host's export to its
    /// VM guest, `--powercap-root`), instead of looking for counters.
    pub(crate) powercap_root: Option<PathBuf>,
    /// Skip NVML.
    pub(crate) no_gpu: bool,
    /// NVML library to load instead of the driver's.
    pub(crate) nvml_lib: Option<OsString>,
    /// A wattmeter log to follow.
    pub(crate) wattmeter_log: Option<PathBuf>,
    /// A wattmeter program to start (argv).
    pub(crate) wattmeter_cmd: Option<Vec<String>>,
    /// The wattmeter outlet the machine is plugged into.
    pub(crate) wattmeter_outlet: u32,
    /// A wall power law from `wattprof calibrate` (`--calibration`).
    pub(crate) calibration: Option<Calibration>,
}

/// A reader in use, or why a kind of energy is not measured, for reports.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct ReaderUse {
    /// `cpu`, `gpu` or `wall`.
    pub(crate) kind: Cow<'static, str>,
    /// Reader name (`powercap`, `nvml`, `estimate`), or `none`.
    pub(crate) name: Cow<'static, str>,
    /// What it reads, or why nothing is read.
    pub(crate) detail: String,
    /// Modelled rather than measured.
    pub(crate) estimated: bool,
    /// What would make it work (when `name` is `none`).
    pub(crate) fix: Option<String>,
    /// The power model (`tdp`, `vcpu`) of an `estimate`.
    pub(crate) model: Option<String>,
}

/// The readers of one profile.
pub(crate) struct Readers {
    /// In reading order: GPUs (milliseconds with their process queries)
    /// and the wattmeter first, the CPU counter last, nearest the
    /// tracker's read, which divides its energy.
    sources: Vec<Box<dyn Source>>,
    /// The power model, where no CPU counter works.
    estimate: Option<PowerModel>,
    /// The wall power law, with `--calibration`.
    calibration: Option<Calibration>,
    gpus: Vec<GpuInfo>,
    used: Vec<ReaderUse>,
    problems: Vec<String>,
    /// CPU and wall domains read so far.
    seen: Vec<DomainKey>,
    /// Those whose last read failed.
    missed: Vec<DomainKey>,
    /// Per source, the problems of its last read (reported when they
    /// began), and whether it failed as a whole.
    said: Vec<(Vec<String>, bool)>,
    /// Domains unread at the last rebase: their next read is a new
    /// starting point.
    before_start: Vec<DomainKey>,
}

impl std::fmt::Debug for Readers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Readers")
            .field("used", &self.used)
            .finish_non_exhaustive()
    }
}

/// One interval's energy from every reader.
#[derive(Debug, Default)]
pub(crate) struct IntervalEnergy {
    /// CPU and wall domains.
    pub(crate) energy: Vec<DomainEnergy>,
    /// GPUs.
    pub(crate) gpus: Vec<GpuReading>,
    /// Domains read before whose read failed now: their counters did not
    /// advance, so this interval's energy comes with their next good read.
    pub(crate) missed: Vec<DomainKey>,
    /// Energy of domains whose earlier reads failed: it covers this
    /// interval and those missed ones (not in `energy`).
    pub(crate) caught_up: Vec<DomainEnergy>,
}

fn in_use(source: &dyn Source, detail: String) -> ReaderUse {
    ReaderUse {
        kind: source.kind().name().into(),
        name: source.name().into(),
        detail,
        estimated: false,
        fix: None,
        model: None,
    }
}

fn missing(kind: &'static str, detail: String, fix: Option<String>) -> ReaderUse {
    ReaderUse {
        kind: kind.into(),
        name: "none".into(),
        detail,
        estimated: false,
        fix,
        model: None,
    }
}

/// The CPU counter opened (if any), and why each one tried did not open.
type CpuOpened = (Option<Box<dyn Source>>, Vec<String>);

/// The CPU energy counter: `--powercap-root` (asked for by name: it must
/// work), else the first of [`CpuCounter::ALL`] that opens here; with why
/// each one tried before it did not.
fn open_cpu(
    cfg: &ReaderConfig,
    sys: &SysRoot,
    cpuinfo: &str,
    used: &mut Vec<ReaderUse>,
) -> Result<CpuOpened, SourceError> {
    if let Some(root) = &cfg.powercap_root {
        let p = Powercap::open_dir(root.clone(), cpuinfo).map_err(|e| {
            let (reason, _) = e.reason_and_fix();
            SourceError::Fatal(format!(
                "--powercap-root {}: {reason} (give a directory holding intel-rapl:N zones, \
                 such as one a host's `wattprof monitor --vm-export` writes)",
                root.display()
            ))
        })?;
        used.push(in_use(&p, p.info().location));
        return Ok((Some(Box::new(p)), Vec::new()));
    }
    // A fixture sysfs has no MSR devices: only the real machine is
    // probed for them.
    let msr_root = match &cfg.sys {
        Some(fixture) => MsrRoot::at(fixture.join("no-msr-devices")),
        None => MsrRoot::real(),
    };
    let machine = CpuMachine {
        sys,
        msr_root: &msr_root,
        cpuinfo,
    };
    let mut reasons = Vec::new();
    for counter in CpuCounter::ALL {
        match counter.open(machine) {
            Ok(source) => {
                used.push(in_use(source.as_ref(), source.info().location));
                return Ok((Some(source), reasons));
            }
            Err(e) => reasons.push(format!("{}: {e}", counter.name())),
        }
    }
    Ok((None, reasons))
}

/// With no CPU counter: the power model `--power-model` chooses (listed in
/// the readers, with why no counter works), or none (listed as missing,
/// with what would give one). A model asked for by name that cannot be
/// used is an error.
fn open_estimate(
    cfg: &ReaderConfig,
    sys: &SysRoot,
    cpuinfo: &str,
    reasons: &[String],
    used: &mut Vec<ReaderUse>,
) -> Result<Option<PowerModel>, SourceError> {
    match estimate::choose_on(cfg.model, sys, cpuinfo) {
        Ok(Some(chosen)) => {
            used.push(ReaderUse {
                kind: "cpu".into(),
                name: "estimate".into(),
                detail: format!(
                    "{} model, {}: {}; source: {} (no energy counter: {})",
                    chosen.model.name(),
                    chosen.model.formula(),
                    chosen.why,
                    chosen.source,
                    reasons.join("; ")
                ),
                estimated: true,
                fix: None,
                model: Some(chosen.model.name().into()),
            });
            Ok(Some(chosen.model))
        }
        Ok(None) => {
            used.push(missing(
                "cpu",
                format!(
                    "CPU energy not measured (no counter, and no power model: calibrate \
                     and --power-model none fit counters only): {}",
                    reasons.join("; ")
                ),
                Some(
                    "on bare metal load intel_rapl_msr (modprobe) or the msr driver; \
                     otherwise leave --power-model at auto for an estimate (see `wattprof sources`)"
                        .into(),
                ),
            ));
            Ok(None)
        }
        Err(SourceError::NotSupported { reason, fix }) => {
            Err(SourceError::Fatal(format!("{reason}: {fix}")))
        }
        Err(e) => Err(e),
    }
}

/// NVIDIA GPUs through NVML, sampled between reads, each listed in the
/// readers with how its energy is read; `None` (listed as missing)
/// without a driver.
fn open_gpus(
    cfg: &ReaderConfig,
    used: &mut Vec<ReaderUse>,
) -> Option<(Box<dyn Source>, Vec<crate::sources::nvml::GpuInfo>)> {
    let mut g = match NvmlGpus::open(cfg.nvml_lib.as_deref()) {
        Ok(g) => g,
        Err(e) => {
            let (reason, _) = e.reason_and_fix();
            used.push(missing("gpu", format!("no GPU energy: {reason}"), None));
            return None;
        }
    };
    // NVML keeps each process's newest sample only: fetched between
    // reads, or a read weighs its interval by one sample per process.
    let sampling = g.sample_between_reads(crate::sources::nvml::sampler::SAMPLE_POLL);
    if let Err(why) = &sampling {
        eprintln!("wattprof: {why}");
    }
    let gpus = g.gpus();
    for info in &gpus {
        let how = match info.method {
            GpuEnergyMethod::EnergyCounter => "total-energy counter",
            GpuEnergyMethod::PowerIntegration => "power samples integrated",
        };
        let also = sampling
            .as_ref()
            .err()
            .map(|why| format!("; {why}"))
            .unwrap_or_default();
        used.push(ReaderUse {
            estimated: info.method == GpuEnergyMethod::PowerIntegration,
            ..in_use(
                &g,
                format!("GPU {} {} ({how}){also}", info.index, info.name),
            )
        });
    }
    Some((Box::new(g), gpus))
}

/// `--calibration`'s wall power law, as a reader in use (estimated).
fn calibration_use(c: &Calibration) -> ReaderUse {
    ReaderUse {
        kind: "wall".into(),
        name: "calibration".into(),
        detail: format!(
            "wall = {:.4} x {} + {:.2} W, calibrated on {} (residual {:.2} W RMS, {:.1}%)",
            c.fit.a,
            c.regressor.describe(),
            c.fit.b,
            c.host,
            c.fit.rms_residual_w,
            c.fit.relative_residual * 100.0
        ),
        estimated: true,
        fix: None,
        model: None,
    }
}

impl Readers {
    /// Opens the readers. Missing hardware is not an error (it is reported
    /// in [`Readers::used`]); a wattmeter that was asked for and cannot be
    /// opened, or an implausible TDP, is.
    pub(crate) fn open(cfg: &ReaderConfig) -> Result<Self, SourceError> {
        let sys = cfg.sys.clone().map_or_else(SysRoot::real, SysRoot::at);
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let mut used = Vec::new();
        let (cpu, reasons) = open_cpu(cfg, &sys, &cpuinfo, &mut used)?;
        let estimate = if cpu.is_none() {
            open_estimate(cfg, &sys, &cpuinfo, &reasons, &mut used)?
        } else {
            None
        };
        let mut sources: Vec<Box<dyn Source>> = Vec::new();
        let mut gpus = Vec::new();
        if !cfg.no_gpu
            && let Some((g, infos)) = open_gpus(cfg, &mut used)
        {
            gpus = infos;
            sources.push(g);
        }
        let wall = match (&cfg.wattmeter_log, &cfg.wattmeter_cmd) {
            (Some(log), _) => Some(Wattmeter::open_file(log, cfg.wattmeter_outlet)?),
            (None, Some(argv)) => Some(Wattmeter::spawn(argv, cfg.wattmeter_outlet)?),
            (None, None) => None,
        };
        if let Some(w) = wall {
            used.push(in_use(&w, w.info().location));
            sources.push(Box::new(w));
        }
        sources.extend(cpu);
        if let Some(c) = &cfg.calibration {
            used.push(calibration_use(c));
        }
        let mut readers = Self {
            sources,
            estimate,
            calibration: cfg.calibration.clone(),
            gpus,
            used,
            problems: Vec::new(),
            seen: Vec::new(),
            missed: Vec::new(),
            said: Vec::new(),
            before_start: Vec::new(),
        };
        // A first read of every reader now, so the one at the profile's
        // start (Profile::begin) is a steady-state read.
        readers.rebase();
        Ok(readers)
    }

    /// Sets every counter's starting point to now (energy since the last
    /// read is dropped): call right before the tracker takes its own.
    pub(crate) fn rebase(&mut self) {
        let _ = self.read_counters(false);
        self.problems.clear();
        // Problems still there are reported again in the profile.
        self.said.clear();
        // A domain that cannot be read now has no starting point: its
        // first good read reaches back before it, and is dropped.
        self.before_start = std::mem::take(&mut self.missed);
        for k in &self.before_start {
            self.problems.push(format!(
                "{}{} cannot be read as the profile begins: its energy counts from its first \
                 read after that",
                k.domain.name(),
                k.package
                    .map(|p| format!(" of package {p}"))
                    .unwrap_or_default()
            ));
        }
    }

    /// The GPUs read.
    pub(crate) fn gpus(&self) -> Vec<GpuInfo> {
        self.gpus.clone()
    }

    /// The readers in use and the kinds of energy not measured.
    pub(crate) fn used(&self) -> &[ReaderUse] {
        &self.used
    }

    /// The measuring CPU reader's name (`powercap`, `msr`), if one is read.
    pub(crate) fn cpu_reader(&self) -> Option<&'static str> {
        self.sources
            .iter()
            .find(|s| s.kind() == ReaderKind::Cpu)
            .map(|s| s.name())
    }

    /// The power model's static power on `cpus` CPUs (W): the vCPU model's
    /// idle watts per vCPU × vCPUs; `None` for the TDP model (all dynamic)
    /// or no model.
    pub(crate) fn model_static_w(&self, cpus: usize) -> Option<f64> {
        match &self.estimate {
            Some(PowerModel::Vcpu(m)) if m.min_w > 0.0 => Some(m.min_w * cpus as f64),
            _ => None,
        }
    }

    /// The power model's static energy over CPU windows of `window_ns` in
    /// all (µJ): the vCPU model's idle watts × the CPUs' time, as its
    /// energy counts it.
    pub(crate) fn model_static_uj(&self, window_ns: u64) -> Option<u64> {
        match &self.estimate {
            Some(PowerModel::Vcpu(m)) if m.min_w > 0.0 => {
                Some((m.min_w * window_ns as f64 / 1e3).round() as u64)
            }
            _ => None,
        }
    }

    /// Whether any CPU energy (measured or estimated) is read.
    pub(crate) fn has_cpu(&self) -> bool {
        self.estimate.is_some() || self.sources.iter().any(|s| s.kind() == ReaderKind::Cpu)
    }

    /// Read failures since the last call (each a line for people).
    pub(crate) fn take_problems(&mut self) -> Vec<String> {
        std::mem::take(&mut self.problems)
    }

    /// Reads every reader: call right before the tracker's read, so both
    /// close the interval at the same instant. The `last` read also counts
    /// what stream readers still hold. The TDP estimate, which needs the
    /// tracker's busy time, comes from [`Readers::add_estimate`].
    pub(crate) fn read_counters(&mut self, last: bool) -> IntervalEnergy {
        let mut out = IntervalEnergy::default();
        let said = &mut self.said;
        said.resize_with(self.sources.len(), Default::default);
        for (i, s) in self.sources.iter_mut().enumerate() {
            let read = if last { s.read_last() } else { s.read() };
            let failed = read.is_err();
            // What went wrong in this read, a line each: the reader's own
            // lines (each GPU, each zone), else the whole read's error.
            let mut lines = s.take_problems();
            match read {
                // GPUs' energy comes with their detail, below.
                Ok(e) => out
                    .energy
                    .extend(e.into_iter().filter(|d| d.domain != Domain::Gpu)),
                // A failed read advances no counter: the next one catches
                // up.
                Err(e) if lines.is_empty() => lines.push(format!("{}: {e}", s.name())),
                Err(_) => {}
            }
            out.gpus.extend(s.take_gpu_readings());
            lines.extend(s.take_problems());
            // Each line is reported when it starts, not at every read while
            // it lasts; a reader whose failure ends reports that it reads
            // again.
            let (before, failed_before) = std::mem::take(&mut said[i]);
            for line in &lines {
                if !before.contains(line) {
                    self.problems.push(line.clone());
                }
            }
            if failed_before && !failed {
                self.problems.push(format!("{}: reading again", s.name()));
            }
            said[i] = (lines, failed);
        }
        // CPU domains first in the list, the wall after them.
        out.energy.sort_by_key(|d| d.domain == Domain::Wall);
        self.catch_up(&mut out);
        out
    }

    /// Sorts out domains whose read failed: one read before that is
    /// missing now was missed (its counter did not advance), and the first
    /// good read after a miss covers the missed intervals too.
    fn catch_up(&mut self, out: &mut IntervalEnergy) {
        let key = |d: &DomainEnergy| DomainKey::new(d.domain, d.package);
        // Read, but not counted (see below): not missed either.
        let mut dropped = Vec::new();
        if !self.before_start.is_empty() {
            out.energy.retain(|d| {
                let drop = self.before_start.contains(&key(d));
                if drop {
                    dropped.push(key(d));
                }
                !drop
            });
            for &k in &dropped {
                self.before_start.retain(|b| *b != k);
            }
        }
        let (caught, fresh): (Vec<DomainEnergy>, Vec<DomainEnergy>) =
            std::mem::take(&mut out.energy)
                .into_iter()
                .partition(|d| self.missed.contains(&key(d)));
        out.energy = fresh;
        out.caught_up = caught;
        for d in out.energy.iter().chain(&out.caught_up) {
            if !self.seen.contains(&key(d)) {
                self.seen.push(key(d));
            }
        }
        let present = |k: &DomainKey| {
            dropped.contains(k)
                || out
                    .energy
                    .iter()
                    .chain(&out.caught_up)
                    .any(|d| key(d) == *k)
        };
        // A domain unread since before the start has no time to hold: its
        // first read back is dropped above.
        self.missed = self
            .seen
            .iter()
            .copied()
            .filter(|k| !present(k) && !self.before_start.contains(k))
            .collect();
        out.missed.clone_from(&self.missed);
    }

    /// Adds the calibration's wall energy of an interval of `duration_ns`
    /// with `busy_ns` of task time, from the energy already in `energy`
    /// (counters and model); returns how attribution divides it.
    pub(crate) fn add_wall_model(
        &self,
        energy: &mut IntervalEnergy,
        busy_ns: u64,
        duration_ns: u64,
    ) -> Option<WallModel> {
        let c = self.calibration.as_ref()?;
        let static_uj = (c.fit.b * duration_ns as f64 / 1e3).round() as u64;
        let (per, x) = match c.regressor {
            Regressor::CountersW => (
                WallPer::CounterEnergy,
                energy
                    .energy
                    .iter()
                    .filter(|d| matches!(d.domain, Domain::Package | Domain::Dram))
                    .map(|d| d.energy_uj)
                    .sum::<u64>()
                    + energy.gpus.iter().map(|g| g.energy_uj).sum::<u64>(),
            ),
            // W per busy CPU × µs of task time = µJ.
            Regressor::BusyCpus => (WallPer::BusyTime, busy_ns / 1000),
        };
        energy.energy.push(DomainEnergy {
            domain: Domain::Wall,
            package: None,
            energy_uj: static_uj.saturating_add((c.fit.a * x as f64).round() as u64),
            estimated: true,
            busy_only: false,
        });
        Some(WallModel {
            a: c.fit.a,
            per,
            static_uj,
        })
    }

    /// Adds the power model's estimate of an interval with `busy_ns` of
    /// the tracker's exact busy time out of `window_ns` of CPU time on
    /// `cpus` online CPUs, where the CPU's energy is estimated.
    pub(crate) fn add_estimate(
        &self,
        energy: &mut IntervalEnergy,
        busy_ns: u64,
        window_ns: u64,
        cpus: usize,
    ) {
        if let Some(model) = &self.estimate {
            // First, where a CPU counter's domains would be.
            energy.energy.insert(
                0,
                DomainEnergy {
                    domain: Domain::Package,
                    package: None,
                    energy_uj: model.energy_uj(busy_ns, window_ns, cpus),
                    estimated: true,
                    busy_only: !model.has_idle_term(),
                },
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sources::SourceInfo;

    /// A CPU counter that fails on the reads it is told to, advancing no
    /// counter then, as the MSR reader does.
    struct Flaky {
        /// The counter's total, and whether reads fail now (set by the test).
        now: std::rc::Rc<std::cell::Cell<(u64, bool)>>,
        last_uj: u64,
    }

    impl Source for Flaky {
        fn name(&self) -> &'static str {
            "msr"
        }
        fn kind(&self) -> ReaderKind {
            ReaderKind::Cpu
        }
        fn info(&self) -> SourceInfo {
            SourceInfo {
                domains: vec![(Domain::Package, Some(0))],
                resolution_uj: None,
                location: "test".into(),
            }
        }
        fn read(&mut self) -> Result<Vec<DomainEnergy>, SourceError> {
            let (total_uj, fail) = self.now.get();
            if fail {
                return Err(SourceError::Retryable("MSR 0x611: read refused".into()));
            }
            let e = total_uj - self.last_uj;
            self.last_uj = total_uj;
            Ok(vec![DomainEnergy {
                domain: Domain::Package,
                package: Some(0),
                energy_uj: e,
                estimated: false,
                busy_only: false,
            }])
        }
    }

    #[test]
    fn a_read_after_failed_ones_is_caught_up_energy() {
        let now = std::rc::Rc::new(std::cell::Cell::new((0, false)));
        let mut readers = Readers {
            sources: vec![Box::new(Flaky {
                now: now.clone(),
                last_uj: 0,
            })],
            estimate: None,
            calibration: None,
            gpus: Vec::new(),
            used: Vec::new(),
            problems: Vec::new(),
            seen: Vec::new(),
            missed: Vec::new(),
            said: Vec::new(),
            before_start: Vec::new(),
        };
        let flaky = |_: &mut Readers, total_uj: u64, fail: bool| now.set((total_uj, fail));
        readers.rebase();
        flaky(&mut readers, 10, false);
        let r = readers.read_counters(false);
        assert_eq!(r.energy[0].energy_uj, 10);
        assert!(r.missed.is_empty() && r.caught_up.is_empty());
        // Two failed reads: missed, no energy.
        for total in [30, 60] {
            flaky(&mut readers, total, true);
            let r = readers.read_counters(false);
            assert!(r.energy.is_empty());
            assert_eq!(r.missed, vec![DomainKey::new(Domain::Package, Some(0))]);
        }
        assert_eq!(readers.take_problems().len(), 1, "an outage is said once");
        // The good read covers all three intervals: caught up, not fresh.
        flaky(&mut readers, 100, false);
        let r = readers.read_counters(false);
        assert!(r.energy.is_empty() && r.missed.is_empty());
        assert_eq!(r.caught_up.len(), 1);
        assert_eq!(r.caught_up[0].energy_uj, 90);
        assert_eq!(readers.take_problems(), ["msr: reading again"]);
        // And then fresh again.
        flaky(&mut readers, 105, false);
        let r = readers.read_counters(false);
        assert_eq!(r.energy[0].energy_uj, 5);
        assert!(r.caught_up.is_empty());
        // Unreadable when a profile begins: its first read back reaches
        // before the start, and is dropped (reported); then fresh.
        flaky(&mut readers, 200, true);
        readers.rebase();
        assert!(readers.take_problems().iter().any(|p| p.contains("begins")));
        // Still failing: not missed (no time is held for it), reported once.
        let r = readers.read_counters(false);
        assert!(r.missed.is_empty(), "{r:?}");
        assert_eq!(readers.take_problems().len(), 1);
        flaky(&mut readers, 300, false);
        let r = readers.read_counters(false);
        assert!(
            r.energy.is_empty() && r.caught_up.is_empty() && r.missed.is_empty(),
            "{r:?}"
        );
        flaky(&mut readers, 310, false);
        assert_eq!(readers.read_counters(false).energy[0].energy_uj, 10);
    }
}
