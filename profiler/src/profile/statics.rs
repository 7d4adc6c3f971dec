//! Each interval's static energy per divided domain: the figure
//! [`StaticPowers`] gives for it now (host model, learned, the power
//! model's idle term, or the lowest power seen), what the profile reports
//! of it, and the problems it raises.

use std::path::{Path, PathBuf};

use crate::attribution::{DomainShare, PackageTime, StaticEnergy, StaticShare};
use crate::sources::nvml::GpuReading;
use crate::sources::nvml::statics::{GpuFigureSource, GpuState, GpuStaticEnergy, GpuStatics};
use crate::sources::registry::Readers;
use crate::sources::static_power::{
    DEFAULT_HOST_MODEL, HostModel, Machine, StaticFigure, StaticPowers, StaticSource,
};
use crate::sources::{Domain, DomainEnergy};

/// Static power per divided domain (W), for reads that cover more than
/// one interval.
pub(crate) type StaticWatts = Vec<(Domain, Option<u32>, f64)>;

/// How static power is shared, and the host power model in use.
#[derive(Clone, Debug, Default)]
pub(crate) struct StaticsConfig {
    /// `--static-power`.
    pub(crate) share: StaticShare,
    /// The host power model, where there is one for this machine.
    pub(crate) host: Option<HostModel>,
    /// Where it was read from.
    pub(crate) host_path: Option<PathBuf>,
    /// Why the model at the default place was not used (bad, or made on
    /// another machine): reported (on stderr and in the recording's
    /// `problems`), and the profile goes on without it.
    pub(crate) ignored: Option<String>,
    /// Where `monitor` puts what it learns (the model's path; none with
    /// `--host-model none`).
    pub(crate) save_path: Option<PathBuf>,
    /// CPU packages (the machine identity of a model written here).
    pub(crate) packages: usize,
}

impl StaticsConfig {
    /// Reads the host power model at `given` (or the default place, where
    /// a missing file is no error; so too a given one `monitor` will
    /// write, `may_create`): one line saying what is wrong.
    pub(crate) fn load(
        share: StaticShare,
        given: Option<&Path>,
        packages: usize,
        may_create: bool,
    ) -> Result<Self, String> {
        if given == Some(Path::new("none")) {
            return Ok(Self {
                share,
                packages,
                ..Self::default()
            });
        }
        let path = given.unwrap_or(Path::new(DEFAULT_HOST_MODEL));
        match HostModel::load(
            path,
            given.is_some() && !may_create,
            &Machine::this(packages),
        ) {
            Ok(host) => Ok(Self {
                share,
                host_path: host.as_ref().map(|_| path.to_path_buf()),
                host,
                ignored: None,
                save_path: Some(path.to_path_buf()),
                packages,
            }),
            // A given file must be right; the default one is this host's
            // business (a cloned image, a changed VM): reported, not fatal,
            // and left as it is (a monitor writes nothing over it).
            Err(e) if given.is_none() => Ok(Self {
                share,
                ignored: Some(format!(
                    "the host power model was not used: {e} (--host-model none says nothing)"
                )),
                packages,
                ..Self::default()
            }),
            Err(e) => Err(e),
        }
    }
}

/// Intervals shorter than this teach the learned fit and the lowest power
/// nothing (50 ms: a counter's steps and the read's own time are a large
/// part of less).
const MIN_LEARN_NS: u64 = 50_000_000;

/// A static figure beyond the measured energy is reported when it exceeds
/// it by more than this share (counter noise over a short interval is well
/// under it)...
const CUT_SAID_SHARE: f64 = 0.05;
/// ...and by more than this (µJ).
const CUT_SAID_UJ: u64 = 10_000;

/// The static figures of a profile.
#[derive(Clone, Debug)]
pub(crate) struct Statics {
    share: StaticShare,
    powers: StaticPowers,
    /// The figures of the last interval.
    last: Vec<StaticFigure>,
    /// Domains whose cut static figure was reported.
    said_cut: Vec<(Domain, Option<u32>)>,
    /// Problems to report at the first interval.
    pending: Vec<String>,
    /// The host model read, where `monitor` merges what it learns.
    host: Option<HostModel>,
    save_path: Option<PathBuf>,
    packages: usize,
    reader: Option<&'static str>,
    /// Each GPU's static figures, learned from its counter.
    gpus: std::collections::BTreeMap<u32, GpuStatics>,
    /// The GPUs' figures of the last interval.
    gpu_last: Vec<StaticFigure>,
    /// Per GPU, static energy an interval could not hold (its counter had
    /// not stepped yet), owed by the next.
    gpu_debt: std::collections::BTreeMap<u32, GpuStaticEnergy>,
    /// Each GPU's UUID and name, by NVML index: its figures in the host
    /// model are found by UUID.
    gpu_ids: std::collections::BTreeMap<u32, (String, String)>,
}

impl Statics {
    /// The figures for a profile reading `readers` on `cpus` CPUs.
    pub(crate) fn new(cfg: &StaticsConfig, readers: &Readers, cpus: usize) -> Self {
        // A GPU whose UUID could not be read is matched to no figure and
        // teaches the model nothing (its figures would be no GPU's).
        let gpu_ids: std::collections::BTreeMap<u32, (String, String)> = readers
            .gpus()
            .into_iter()
            .filter(|g| !g.uuid.is_empty())
            .map(|g| (g.index, (g.uuid, g.name)))
            .collect();
        let mut pending: Vec<String> = cfg.ignored.iter().cloned().collect();
        let (gpus, refused) = gpu_priors(cfg.host.as_ref(), &gpu_ids);
        pending.extend(refused);
        Self {
            share: cfg.share,
            powers: StaticPowers::new(
                cfg.host.as_ref(),
                readers.cpu_reader(),
                readers.model_static_w(cpus),
            ),
            last: Vec::new(),
            said_cut: Vec::new(),
            pending,
            host: cfg.host.clone(),
            save_path: cfg.save_path.clone(),
            packages: cfg.packages,
            reader: readers.cpu_reader(),
            gpus,
            gpu_last: Vec::new(),
            gpu_debt: std::collections::BTreeMap::new(),
            gpu_ids,
        }
    }

    /// Merges what was learned into the host power model and writes it
    /// (`monitor`, so a daemon learns its host over hours): the path
    /// written, or `None` when there was nothing to write.
    pub(crate) fn save_learned(&mut self) -> Result<Option<PathBuf>, String> {
        let Some(path) = &self.save_path else {
            return Ok(None);
        };
        let learned_gpus: Vec<_> = self
            .gpus
            .iter()
            .filter_map(|(i, g)| {
                let (uuid, name) = self.gpu_ids.get(i)?;
                g.learned_fit(uuid, name)
            })
            .collect();
        if self.reader.is_none() && learned_gpus.is_empty() {
            return Ok(None);
        }
        // The file as it is now (calibrate may have run since this
        // profile began: its fits are kept); a file that is no longer a
        // model of this machine is left alone.
        let machine = Machine::this(self.packages);
        let on_disk = match HostModel::load(path, false, &machine) {
            Ok(m) => m,
            Err(e) => return Err(format!("{e}; not written over")),
        };
        let mut model = on_disk
            .or_else(|| self.host.clone())
            .unwrap_or_else(|| HostModel::empty(machine));
        let mut changed = self
            .reader
            .is_some_and(|reader| self.powers.merge_into(&mut model, reader));
        for g in learned_gpus {
            changed |= model.merge_gpu(g);
        }
        if !changed {
            return Ok(None);
        }
        model.save(path)?;
        self.host = Some(model);
        Ok(Some(path.clone()))
    }

    /// How static energy is shared.
    pub(crate) fn share(&self) -> StaticShare {
        self.share
    }

    /// The figures in use now: the CPU domains', then the GPUs'.
    pub(crate) fn figures(&self) -> [&[StaticFigure]; 2] {
        [&self.last, &self.gpu_last]
    }

    /// The figure of a domain in the last interval.
    pub(crate) fn figure(&self, domain: Domain, package: Option<u32>) -> Option<&StaticFigure> {
        StaticFigure::find(&self.figures(), domain, package)
    }

    /// A GPU's static energy over an interval of `duration_ns`, after
    /// learning from it (see [`GpuStatics`]): its idle and held power, the
    /// latter only when a process held it. Also its figures in reports:
    /// idle + held power (held only with a holder), `lowest_seen`.
    pub(crate) fn gpu_interval(&mut self, g: &GpuReading, duration_ns: u64) -> GpuStaticEnergy {
        let state = if g.processes.is_empty() {
            GpuState::Idle
        } else if g.at_rest {
            GpuState::Held
        } else {
            GpuState::Working
        };
        let learner = self.gpus.entry(g.index).or_default();
        if g.whole {
            learner.observe(state, g.energy_uj, duration_ns);
        } else {
            // Energy over more or less than the interval teaches nothing,
            // and ends the stretch it falls in.
            learner.observe(GpuState::Working, 0, duration_ns);
        }
        let held = state != GpuState::Idle;
        let figure = learner.energy(duration_ns, held);
        // A counter that steps every 20-100 ms reads 0 J over some short
        // intervals and two steps over the next: static energy an interval
        // could not hold is taken from the next ones (up to a second's
        // worth; more means the figure is above the power: dropped), so
        // the idle row and the holders get all of theirs over a run.
        let cap = learner.energy(1_000_000_000, true);
        let debt = self.gpu_debt.entry(g.index).or_default();
        let energy = figure.charge(debt, g.energy_uj, held, cap);
        let watts = learner.idle_w().unwrap_or(0.0)
            + if held {
                learner.held_w().unwrap_or(0.0)
            } else {
                0.0
            };
        let known = learner.idle_w().is_some() || (held && learner.held_w().is_some());
        // The host model's only where every figure in use is the model's.
        let (idle_from, held_from) = learner.sources();
        let from_model = idle_from.is_none_or(|s| s == GpuFigureSource::HostModel)
            && (!held || held_from.is_none_or(|s| s == GpuFigureSource::HostModel))
            && (idle_from.is_some() || held_from.is_some());
        self.gpu_last.retain(|f| f.package != Some(g.index));
        if known {
            self.gpu_last.push(StaticFigure {
                domain: Domain::Gpu,
                package: Some(g.index),
                static_w: watts,
                source: if from_model {
                    StaticSource::HostModel
                } else {
                    StaticSource::LowestSeen
                },
                per_cpu_w: None,
                r_squared: None,
            });
        }
        energy
    }

    /// One line per GPU with a figure: each part and where it came from.
    fn gpu_note(&self) -> Vec<String> {
        self.gpus
            .iter()
            .filter_map(|(i, g)| {
                let (idle_from, held_from) = g.sources();
                let part = |w: Option<f64>, from: Option<GpuFigureSource>, what: &str| {
                    w.zip(from)
                        .map(|(w, f)| format!("{w:.2} W {what} ({})", f.words()))
                };
                let parts: Vec<String> = [
                    part(g.idle_w(), idle_from, "idle"),
                    part(g.held_w(), held_from, "held with a context"),
                ]
                .into_iter()
                .flatten()
                .collect();
                (!parts.is_empty()).then(|| format!("gpu {i}: {}", parts.join(" + ")))
            })
            .collect()
    }

    /// A GPU's idle and held power (W), where learned.
    pub(crate) fn gpu_figures(&self, index: u32) -> (Option<f64>, Option<f64>) {
        self.gpus
            .get(&index)
            .map_or((None, None), |g| (g.idle_w(), g.held_w()))
    }

    /// What was learned during the profile.
    pub(crate) fn learned(&self) -> Vec<(Domain, Option<u32>, f64, f64, f64, u64)> {
        self.powers.learned()
    }

    /// Takes one interval's divided domains (measured ones teach the
    /// figures; `caught_up`, energy covering earlier failed reads too,
    /// teaches nothing but is divided with its domain's figure) and gives
    /// each its static energy over `duration_ns`, and the static power (W)
    /// per domain for reads that cover more. `model_static_uj` is the
    /// power model's static energy over the interval, from the same CPU
    /// windows as its energy (the vCPU model: idle watts × the CPUs'
    /// time).
    pub(crate) fn interval(
        &mut self,
        energy: &[DomainEnergy],
        caught_up: &[DomainEnergy],
        packages: &[PackageTime],
        package_ids: &[u32],
        duration_ns: u64,
        model_static_uj: Option<u64>,
    ) -> (Vec<StaticEnergy>, StaticWatts) {
        let busy_cpus = |package: Option<u32>| -> f64 {
            let busy: u64 = match package {
                Some(p) => package_ids
                    .iter()
                    .position(|id| *id == p)
                    .and_then(|i| packages.get(i))
                    .map_or(0, |t| t.busy_ns + t.lost_ns),
                None => packages.iter().map(|t| t.busy_ns + t.lost_ns).sum(),
            };
            busy as f64 / duration_ns.max(1) as f64
        };
        let divided = |d: &&DomainEnergy| {
            matches!(d.domain, Domain::Package | Domain::Core | Domain::Dram) && !d.busy_only
        };
        // A sliver of an interval (run's last, a window boundary right
        // after a tick) says little about power: it teaches nothing.
        if duration_ns >= MIN_LEARN_NS {
            for d in energy.iter().filter(divided).filter(|d| !d.estimated) {
                self.powers.observe(
                    d.domain,
                    d.package,
                    d.energy_uj,
                    duration_ns,
                    busy_cpus(d.package),
                );
            }
        }
        let now: Vec<StaticFigure> = energy
            .iter()
            .chain(caught_up)
            .filter(divided)
            .filter_map(|d| self.powers.figure(d.domain, d.package))
            .collect();
        // The last figure of each domain is kept (a domain whose read
        // fails keeps its figure in reports and metrics).
        for f in &now {
            match self
                .last
                .iter_mut()
                .find(|l| l.domain == f.domain && l.package == f.package)
            {
                Some(l) => *l = *f,
                None => self.last.push(*f),
            }
        }
        let statics = now
            .iter()
            .map(|f| StaticEnergy {
                domain: f.domain,
                package: f.package,
                static_uj: match (f.source, model_static_uj) {
                    (StaticSource::ShippedModel, Some(uj)) => uj,
                    _ => (f.static_w * duration_ns as f64 / 1e3).round() as u64,
                },
            })
            .collect();
        let watts = now
            .iter()
            .map(|f| (f.domain, f.package, f.static_w))
            .collect();
        (statics, watts)
    }

    /// Problems the interval's shares raise: a static figure well above
    /// what was measured (reported once per domain).
    pub(crate) fn problems(&mut self, shares: &[DomainShare]) -> Vec<String> {
        let mut out = std::mem::take(&mut self.pending);
        // A GPU's counter steps every 20-100 ms: an interval under a step
        // can read 0 J. Its static figure is the lowest seen, not a model.
        for s in shares.iter().filter(|s| s.key.domain != Domain::Gpu) {
            let key = (s.key.domain, s.key.package);
            let beyond = s.static_cut_uj > CUT_SAID_UJ
                && s.static_cut_uj as f64 > CUT_SAID_SHARE * s.measured_uj as f64;
            if !beyond || self.said_cut.contains(&key) {
                continue;
            }
            self.said_cut.push(key);
            let figure = self
                .figure(s.key.domain, s.key.package)
                .map(StaticFigure::describe)
                .unwrap_or_else(|| s.key.domain.name().to_string());
            out.push(format!(
                "{figure} is above the {:.3} J measured in an interval (by {:.3} J): its \
                 dynamic energy counted as 0 (a host power model made under other conditions? \
                 run `wattprof calibrate` again)",
                s.measured_uj as f64 / 1e6,
                s.static_cut_uj as f64 / 1e6
            ));
        }
        out
    }

    /// One note for the table: the rule, and each figure.
    pub(crate) fn note(&self) -> Option<String> {
        if self.last.is_empty() && self.gpu_last.is_empty() {
            return None;
        }
        let rule = match self.share {
            StaticShare::Capacity => "each process pays its share of the CPUs' time",
            StaticShare::Busy => "charged by CPU time to whoever ran",
            StaticShare::Idle => "left idle, none to processes",
        };
        let mut figures: Vec<String> = self.last.iter().map(StaticFigure::describe).collect();
        figures.extend(self.gpu_note());
        let hint = if self
            .last
            .iter()
            .any(|f| f.source == StaticSource::LowestSeen)
        {
            "; run `wattprof calibrate` for this host's static power"
        } else {
            ""
        };
        Some(format!(
            "static power: {} ({rule}; --static-power {}){hint}",
            figures.join(", "),
            self.share.name()
        ))
    }
}

/// Each GPU's figures from the host model, by NVML index, and one line
/// per GPU of the model that is not on this machine (its figures are
/// refused: another GPU's idle power is no figure for this one).
fn gpu_priors(
    host: Option<&HostModel>,
    gpu_ids: &std::collections::BTreeMap<u32, (String, String)>,
) -> (std::collections::BTreeMap<u32, GpuStatics>, Vec<String>) {
    let Some(host) = host else {
        return Default::default();
    };
    let mut priors = std::collections::BTreeMap::new();
    for (index, (uuid, _)) in gpu_ids {
        if let Some(fit) = host.gpus.iter().find(|f| &f.uuid == uuid) {
            priors.insert(*index, GpuStatics::with_model(fit));
        }
    }
    let refused = host
        .gpus
        .iter()
        .filter(|f| !gpu_ids.values().any(|(uuid, _)| *uuid == f.uuid))
        .map(|f| {
            format!(
                "the host power model's figures for GPU {} ({}) are not used: no such GPU here \
                 (run `wattprof calibrate` on this machine's GPUs)",
                f.uuid, f.name
            )
        })
        .collect();
    (priors, refused)
}
