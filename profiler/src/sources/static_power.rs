//! Where each divided domain's static power comes from.
//!
//! A CPU package draws power whether or not tasks run (its static power)
//! and more for each busy CPU. The attribution gives each program the
//! dynamic energy it caused plus rent for the CPU time it held, which
//! needs the static figure of each domain (package, core, DRAM) and
//! package. In order of trust:
//!
//! 1. **The host power model** `wattprof calibrate` writes with no
//!    wattmeter: its load staircase fitted per domain and package as
//!    power = static + k × busy CPUs ([`HostModel`]). It is refused for
//!    another machine, and a fit is used only with the reader it was made
//!    with.
//! 2. **Learned on the fly**: each interval's (busy CPUs, power) point is
//!    added to a running least-squares fit, used once the load has varied
//!    by at least [`LEARN_MIN_SPREAD_CPUS`] over at least
//!    [`LEARN_MIN_POINTS`] intervals and the line explains the power
//!    ([`LEARN_MIN_R2`]).
//! 3. **The shipped model's idle term**: the vCPU model's static part is
//!    vCPUs × its idle watts. (The TDP model has none: all dynamic.)
//! 4. **The lowest power seen** on this host so far: an upper bound (the
//!    load never went to zero, perhaps), reported as such, with the hint to
//!    run `wattprof calibrate`.

use serde::{Deserialize, Serialize};

use super::Domain;
use super::calibration::{Fit, Point, fit};

/// Intervals a learned fit needs before it is used.
pub(crate) const LEARN_MIN_POINTS: u64 = 10;

/// How far the busy CPUs must have varied (max − min) before a learned
/// fit is used. The intercept (static power) is extrapolated from the
/// points to zero busy CPUs: its error is the power's noise times about
/// mean / spread, so a spread under half a CPU lets a watt of noise move
/// it by several. Half a CPU is what a single job starting or stopping
/// gives on any machine.
pub(crate) const LEARN_MIN_SPREAD_CPUS: f64 = 0.5;

/// How much of the power's variance a learned line must explain (R²):
/// below it, the power follows something else than busy CPUs (a GPU, a
/// turbo limit, another domain), and the line would mislead.
pub(crate) const LEARN_MIN_R2: f64 = 0.9;

/// Past this many intervals (a day at 1 s), a learned fit's sums are
/// halved (its means kept): older points weigh half as much, so a fit a
/// daemon keeps for weeks still follows the host (a BIOS or kernel
/// change) within about a day.
pub(crate) const LEARN_MAX_POINTS: u64 = 86_400;

/// The default place of the host power model (`--host-model` overrides
/// it): where `wattprof calibrate` writes it and `run` and `monitor`
/// read it.
pub(crate) const DEFAULT_HOST_MODEL: &str = "/var/lib/wattprof/power-model.json";

/// Where a static figure came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum StaticSource {
    /// The host power model (`wattprof calibrate`).
    HostModel,
    /// Fitted during this profile.
    Learned,
    /// The shipped power model's idle term (vCPU model).
    ShippedModel,
    /// The lowest power seen: an upper bound.
    LowestSeen,
}

impl StaticSource {
    /// Its name in reports.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::HostModel => "host_model",
            Self::Learned => "learned",
            Self::ShippedModel => "shipped_model",
            Self::LowestSeen => "lowest_seen",
        }
    }
}

/// One domain's static power and where it came from.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct StaticFigure {
    /// Which domain.
    pub(crate) domain: Domain,
    /// Its package (`None`: a machine-wide model).
    pub(crate) package: Option<u32>,
    /// Static power (W).
    pub(crate) static_w: f64,
    /// Where it came from.
    pub(crate) source: StaticSource,
    /// The fit's slope (W per busy CPU), for fitted figures.
    pub(crate) per_cpu_w: Option<f64>,
    /// The fit's R², for fitted figures.
    pub(crate) r_squared: Option<f64>,
}

impl StaticFigure {
    /// The figure of `domain` on `package` among `lists`, the first found.
    pub(crate) fn find<'a>(
        lists: &[&'a [StaticFigure]],
        domain: Domain,
        package: Option<u32>,
    ) -> Option<&'a StaticFigure> {
        lists
            .iter()
            .flat_map(|l| l.iter())
            .find(|f| f.domain == domain && f.package == package)
    }

    /// One line: `package 0: 21.34 W static (host model, R² 0.9990)`.
    pub(crate) fn describe(&self) -> String {
        let what = match self.source {
            StaticSource::HostModel => "host model",
            StaticSource::Learned => "learned from the load (this profile, or a monitor's)",
            StaticSource::ShippedModel => "the power model's idle term",
            StaticSource::LowestSeen => "lowest power seen, an upper bound",
        };
        let fit = match (self.per_cpu_w, self.r_squared) {
            (Some(k), Some(r2)) => format!(", {k:.2} W per busy CPU, R² {r2:.4}"),
            _ => String::new(),
        };
        format!(
            "{}{}: {:.2} W static ({what}{fit})",
            self.domain.name(),
            match (self.domain, self.package) {
                (Domain::Gpu, Some(p)) => format!(" {p}"),
                (_, Some(p)) => format!(" of package {p}"),
                (_, None) => String::new(),
            },
            self.static_w
        )
    }
}

/// Who made a fit of the host power model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum FitOrigin {
    /// `wattprof calibrate`'s staircase.
    #[default]
    Calibrate,
    /// `wattprof monitor`, from the load it saw (with its running sums, so
    /// the next monitor learns on from them).
    Learned,
}

impl FitOrigin {
    pub(crate) fn is_calibrate(&self) -> bool {
        *self == Self::Calibrate
    }
}

/// A learned fit's running sums (see `Learner`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct LearnerState {
    /// Intervals.
    pub(crate) n: u64,
    /// Mean busy CPUs.
    pub(crate) mean_x: f64,
    /// Mean power (W).
    pub(crate) mean_y: f64,
    /// Σ (x − mean_x)².
    pub(crate) sxx: f64,
    /// Σ (x − mean_x)(y − mean_y).
    pub(crate) sxy: f64,
    /// Σ (y − mean_y)².
    pub(crate) syy: f64,
    /// Fewest busy CPUs seen.
    pub(crate) min_x: f64,
    /// Most busy CPUs seen.
    pub(crate) max_x: f64,
}

/// One domain's fit in the host power model.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct DomainFit {
    /// Which domain (`package`, `core`, `dram`).
    pub(crate) domain: Domain,
    /// Its package (the kernel's id; `null`: machine wide).
    pub(crate) package: Option<u32>,
    /// The reader whose energy was fitted (`powercap`, `msr`).
    pub(crate) reader: String,
    /// Static power (W): the intercept.
    pub(crate) static_w: f64,
    /// Watts per busy CPU: the slope.
    pub(crate) per_cpu_w: f64,
    /// The line's R².
    pub(crate) r_squared: f64,
    /// Root mean square of the residuals (W).
    pub(crate) rms_residual_w: f64,
    /// The staircase's points (x: busy CPUs, `wall_w`: the domain's W).
    pub(crate) points: Vec<Point>,
    /// Who made it (absent: `calibrate`, so calibrate's files stay as
    /// they were).
    #[serde(default, skip_serializing_if = "FitOrigin::is_calibrate")]
    pub(crate) origin: FitOrigin,
    /// A learned fit's running sums.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) learned: Option<LearnerState>,
}

/// What a host power model was made on: it is refused elsewhere.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Machine {
    /// `/proc/cpuinfo`'s model name.
    pub(crate) cpu_model: String,
    /// CPU packages.
    pub(crate) packages: usize,
    /// CPUs configured.
    pub(crate) cpus: usize,
}

impl Machine {
    /// This machine.
    pub fn this(packages: usize) -> Self {
        let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
        let cpu_model = cpuinfo
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                (k.trim() == "model name").then(|| v.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_CONF) };
        Self {
            cpu_model,
            packages,
            cpus: usize::try_from(cpus).unwrap_or(1).max(1),
        }
    }
}

/// The host power model file (`wattprof calibrate` with no wattmeter).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct HostModel {
    /// Always `wattprof_power_model`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// Format version (1).
    pub(crate) version: u32,
    /// Host name it was made on.
    pub(crate) host: String,
    /// The machine it was made on.
    pub(crate) machine: Machine,
    /// When (Unix ns).
    pub(crate) created_unix_ns: u64,
    /// One fit per domain and package (none: a model of the GPUs only).
    #[serde(default)]
    pub(crate) fits: Vec<DomainFit>,
    /// Each GPU's idle and held power, by UUID.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) gpus: Vec<crate::sources::nvml::statics::GpuFit>,
}

impl HostModel {
    /// Reads and checks a host power model against this machine: `Ok(None)`
    /// when the default path has none, one line saying what is wrong
    /// otherwise.
    pub(crate) fn load(
        path: &std::path::Path,
        given: bool,
        machine: &Machine,
    ) -> Result<Option<Self>, String> {
        let text = match std::fs::read_to_string(path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && !given => return Ok(None),
            Err(e) => {
                return Err(format!(
                    "cannot read the host power model {}: {e} (make one with `wattprof \
                     calibrate`)",
                    path.display()
                ));
            }
        };
        let m: Self = serde_json::from_str(&text).map_err(|e| {
            format!(
                "{}: not a wattprof power model ({e}); make it again with `wattprof calibrate`",
                path.display()
            )
        })?;
        if m.kind != "wattprof_power_model" || !(1..=2).contains(&m.version) {
            return Err(format!(
                "{}: not a version 1 or 2 wattprof power model; make it again with `wattprof \
                 calibrate`",
                path.display()
            ));
        }
        if &m.machine != machine {
            return Err(format!(
                "{}: made on another machine ({}, {} package(s), {} CPUs; this is {}, {} \
                 package(s), {} CPUs): run `wattprof calibrate` here, or give --host-model \
                 another file",
                path.display(),
                m.machine.cpu_model,
                m.machine.packages,
                m.machine.cpus,
                machine.cpu_model,
                machine.packages,
                machine.cpus
            ));
        }
        if let Some(f) = m
            .fits
            .iter()
            .find(|f| !(f.static_w.is_finite() && f.static_w >= 0.0 && f.per_cpu_w.is_finite()))
        {
            return Err(format!(
                "{}: the {} fit's static power {} W is no power: make it again with `wattprof \
                 calibrate`",
                path.display(),
                f.domain.name(),
                f.static_w
            ));
        }
        if let Some(g) = m.gpus.iter().find(|g| !g.sane()) {
            let w = |x: Option<f64>| x.map_or_else(|| "none".to_string(), |w| format!("{w:.2} W"));
            return Err(format!(
                "{}: GPU {:?}'s figures (idle {}, held {}, over {:.1} s and {:.1} s) are no \
                 power: make it again with `wattprof calibrate`",
                path.display(),
                g.uuid,
                w(g.idle_w),
                w(g.held_w),
                g.idle_s,
                g.held_s
            ));
        }
        Ok(Some(m))
    }

    /// An empty model of this machine, made now.
    pub(crate) fn empty(machine: Machine) -> Self {
        Self {
            kind: "wattprof_power_model".into(),
            version: 1,
            host: crate::topology::hostname(),
            machine,
            created_unix_ns: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as u64),
            fits: Vec::new(),
            gpus: Vec::new(),
        }
    }

    /// Puts a GPU's figures learned by a profile into the model: a GPU
    /// new to it is added, and a learned entry takes what is better (never
    /// one of `calibrate`'s). Whether anything changed.
    pub(crate) fn merge_gpu(&mut self, learned: crate::sources::nvml::statics::GpuFit) -> bool {
        match self.gpus.iter_mut().find(|g| g.uuid == learned.uuid) {
            Some(g) => g.merge(&learned),
            None => {
                self.gpus.push(learned);
                true
            }
        }
    }

    /// Writes it to `path` atomically (a temporary file renamed),
    /// creating the directory. A model with GPU figures is version 2 (an
    /// older wattprof refuses it in one line rather than misread it); one
    /// without stays version 1.
    pub(crate) fn save(&self, path: &std::path::Path) -> Result<(), String> {
        let versioned;
        let this = if self.gpus.is_empty() == (self.version == 1) {
            self
        } else {
            versioned = Self {
                version: if self.gpus.is_empty() { 1 } else { 2 },
                ..self.clone()
            };
            &versioned
        };
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir)
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        // Per process: calibrate and a monitor may write at once.
        let tmp = path.with_extension(format!("json.{}.tmp", std::process::id()));
        std::fs::write(
            &tmp,
            serde_json::to_string_pretty(this).unwrap_or_default() + "\n",
        )
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(|e| format!("cannot write {}: {e}", path.display()))
    }

    /// Fits one domain's staircase: power = static + k × busy CPUs.
    pub(crate) fn fit_domain(
        domain: Domain,
        package: Option<u32>,
        reader: &str,
        points: Vec<Point>,
    ) -> Result<DomainFit, String> {
        let Fit {
            a,
            b,
            rms_residual_w,
            r_squared,
            ..
        } = fit(&points).map_err(|e| e.to_string())?;
        Ok(DomainFit {
            domain,
            package,
            reader: reader.to_string(),
            static_w: b,
            per_cpu_w: a,
            r_squared,
            rms_residual_w,
            points,
            origin: FitOrigin::Calibrate,
            learned: None,
        })
    }
}

/// A running least-squares line of power on busy CPUs, kept centred
/// (Welford's updates: sums of squares about the running means, so hours
/// of points near one value lose nothing to cancellation).
#[derive(Clone, Copy, Debug, Default)]
struct Learner {
    n: u64,
    mean_x: f64,
    mean_y: f64,
    /// Σ (x − mean_x)², Σ (x − mean_x)(y − mean_y), Σ (y − mean_y)².
    sxx: f64,
    sxy: f64,
    syy: f64,
    min_x: f64,
    max_x: f64,
}

impl From<LearnerState> for Learner {
    fn from(s: LearnerState) -> Self {
        Self {
            n: s.n,
            mean_x: s.mean_x,
            mean_y: s.mean_y,
            sxx: s.sxx,
            sxy: s.sxy,
            syy: s.syy,
            min_x: s.min_x,
            max_x: s.max_x,
        }
    }
}

impl From<Learner> for LearnerState {
    fn from(l: Learner) -> Self {
        Self {
            n: l.n,
            mean_x: l.mean_x,
            mean_y: l.mean_y,
            sxx: l.sxx,
            sxy: l.sxy,
            syy: l.syy,
            min_x: l.min_x,
            max_x: l.max_x,
        }
    }
}

impl Learner {
    fn add(&mut self, x: f64, y: f64) {
        if self.n == 0 {
            self.min_x = x;
            self.max_x = x;
        }
        self.n += 1;
        let n = self.n as f64;
        let dx = x - self.mean_x;
        let dy = y - self.mean_y;
        self.mean_x += dx / n;
        self.mean_y += dy / n;
        self.sxx += dx * (x - self.mean_x);
        self.sxy += dx * (y - self.mean_y);
        self.syy += dy * (y - self.mean_y);
        self.min_x = self.min_x.min(x);
        self.max_x = self.max_x.max(x);
        if self.n > LEARN_MAX_POINTS {
            self.n /= 2;
            self.sxx /= 2.0;
            self.sxy /= 2.0;
            self.syy /= 2.0;
        }
    }

    /// (static W, W per busy CPU, R²) once the load has varied enough:
    /// over [`LEARN_MIN_SPREAD_CPUS`] from lowest to highest, and with a
    /// standard deviation of at least a quarter of that (one odd interval
    /// is no spread), and the power has varied at all.
    fn fit(&self) -> Option<(f64, f64, f64)> {
        if self.n < LEARN_MIN_POINTS || self.max_x - self.min_x < LEARN_MIN_SPREAD_CPUS {
            return None;
        }
        let n = self.n as f64;
        if (self.sxx / n).sqrt() < LEARN_MIN_SPREAD_CPUS / 4.0
            || self.syy <= 1e-9 * n * (1.0 + self.mean_y * self.mean_y)
        {
            return None;
        }
        let k = self.sxy / self.sxx;
        let s = self.mean_y - k * self.mean_x;
        let r2 = self.sxy * self.sxy / (self.sxx * self.syy);
        (s >= 0.0 && k >= 0.0 && r2 >= LEARN_MIN_R2).then_some((s, k, r2))
    }
}

type Key = (Domain, Option<u32>);

/// Each divided domain's static power over a profile: the host model's,
/// learned, the shipped model's, or the lowest seen.
#[derive(Clone, Debug, Default)]
pub(crate) struct StaticPowers {
    /// The host model's fits for this profile's CPU reader.
    host: Vec<DomainFit>,
    /// The vCPU model's static power (W), for its machine-wide package
    /// domain.
    shipped_w: Option<f64>,
    learners: Vec<(Key, Learner)>,
    lowest: Vec<(Key, f64)>,
}

impl StaticPowers {
    /// Figures from `host` (only its fits made with `reader`: those of
    /// `calibrate` as they are; those a monitor learned go on learning from
    /// their sums) and the shipped model's static watts.
    pub(crate) fn new(
        host: Option<&HostModel>,
        reader: Option<&str>,
        shipped_w: Option<f64>,
    ) -> Self {
        let fits: Vec<&DomainFit> = host
            .map(|m| {
                m.fits
                    .iter()
                    .filter(|f| Some(f.reader.as_str()) == reader)
                    .collect()
            })
            .unwrap_or_default();
        Self {
            host: fits
                .iter()
                .filter(|f| f.origin == FitOrigin::Calibrate)
                .map(|f| (*f).clone())
                .collect(),
            learners: fits
                .iter()
                .filter(|f| f.origin == FitOrigin::Learned)
                .filter_map(|f| Some(((f.domain, f.package), Learner::from(f.learned?))))
                .collect(),
            shipped_w,
            ..Self::default()
        }
    }

    /// Puts what was learned into `model` for `reader`: a domain's learned
    /// fit replaces an earlier learned one, never a fit of `calibrate`.
    /// Whether anything was put.
    pub(crate) fn merge_into(&self, model: &mut HostModel, reader: &str) -> bool {
        let mut changed = false;
        for ((domain, package), l) in &self.learners {
            let Some((s, k, r2)) = l.fit() else {
                continue;
            };
            let at = model
                .fits
                .iter()
                .position(|f| f.domain == *domain && f.package == *package && f.reader == reader);
            if at.is_some_and(|i| model.fits[i].origin == FitOrigin::Calibrate) {
                continue;
            }
            let fit = DomainFit {
                domain: *domain,
                package: *package,
                reader: reader.to_string(),
                static_w: s,
                per_cpu_w: k,
                r_squared: r2,
                rms_residual_w: (l.syy * (1.0 - r2) / l.n.max(1) as f64).max(0.0).sqrt(),
                points: Vec::new(),
                origin: FitOrigin::Learned,
                learned: Some((*l).into()),
            };
            match at {
                Some(i) => model.fits[i] = fit,
                None => model.fits.push(fit),
            }
            changed = true;
        }
        changed
    }

    /// Adds one interval of a measured divided domain: its energy over
    /// `duration_ns` with `busy_cpus` CPUs busy on average (on its package).
    pub(crate) fn observe(
        &mut self,
        domain: Domain,
        package: Option<u32>,
        energy_uj: u64,
        duration_ns: u64,
        busy_cpus: f64,
    ) {
        if duration_ns == 0 {
            return;
        }
        let w = energy_uj as f64 / duration_ns as f64 * 1e3;
        let key = (domain, package);
        match self.lowest.iter_mut().find(|(k, _)| *k == key) {
            Some((_, low)) => *low = low.min(w),
            None => self.lowest.push((key, w)),
        }
        match self.learners.iter_mut().find(|(k, _)| *k == key) {
            Some((_, l)) => l.add(busy_cpus, w),
            None => {
                let mut l = Learner::default();
                l.add(busy_cpus, w);
                self.learners.push((key, l));
            }
        }
    }

    /// The figure for a domain now, if any.
    pub(crate) fn figure(&self, domain: Domain, package: Option<u32>) -> Option<StaticFigure> {
        let key = (domain, package);
        let mk = |static_w, source, per_cpu_w, r_squared| StaticFigure {
            domain,
            package,
            static_w,
            source,
            per_cpu_w,
            r_squared,
        };
        if let Some(f) = self
            .host
            .iter()
            .find(|f| f.domain == domain && f.package == package)
        {
            return Some(mk(
                f.static_w,
                StaticSource::HostModel,
                Some(f.per_cpu_w),
                Some(f.r_squared),
            ));
        }
        if let Some((s, k, r2)) = self
            .learners
            .iter()
            .find(|(k, _)| *k == key)
            .and_then(|(_, l)| l.fit())
        {
            return Some(mk(s, StaticSource::Learned, Some(k), Some(r2)));
        }
        if domain == Domain::Package
            && package.is_none()
            && let Some(w) = self.shipped_w
        {
            return Some(mk(w, StaticSource::ShippedModel, None, None));
        }
        self.lowest
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, w)| mk(*w, StaticSource::LowestSeen, None, None))
    }

    /// What was learned, per domain: (domain, package, static W, W per
    /// busy CPU, R², intervals).
    pub(crate) fn learned(&self) -> Vec<(Domain, Option<u32>, f64, f64, f64, u64)> {
        self.learners
            .iter()
            .filter_map(|((d, p), l)| l.fit().map(|(s, k, r2)| (*d, *p, s, k, r2, l.n)))
            .collect()
    }
}

#[cfg(test)]
#[path = "static_power_tests.rs"]
mod tests;
