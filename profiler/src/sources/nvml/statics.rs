//! A GPU's static power, learned from its own energy counter, on the same
//! principle as the CPU's: a process's GPU energy should not depend on
//! what else holds the GPU.
//!
//! A GPU draws three kinds of power:
//! - **idle**: with no context open (the idle row's);
//! - **held**: the extra of one or more contexts open with no work (an H100
//!   idles around 60-70 W with a context): shared by the processes holding
//!   one;
//! - **dynamic**: the rest, what the work caused, by SM share.
//!
//! The idle figure is learned from stretches with no context, the held
//! figure from stretches where no holder worked (NVML gave no sample above
//! 0% SM within 2 s, and the GPU's utilization was 0 where it says), less
//! the idle figure. A stretch is consecutive intervals in the same state,
//! less its first interval (it straddles the change of state), the next
//! [`SETTLE_NS`] (the power settles: an H200 took up to a second to fall to
//! its 77.5 W idle after a load) and its last [`TAIL_NS`] (the read that
//! sees work comes after the work began); it teaches once
//! [`MIN_STRETCH_NS`] long. At the default 1 s interval a state must last
//! about 5 s to teach.
//!
//! A stretch grows as long as the state lasts: its figure is its whole
//! mean. The energy counter steps every 20-100 ms (100 ms on an H200), so a
//! stretch's energy is exact to a step: ±5% over 2 s, ±0.5% over 20 s
//! ([`COUNTER_STEP_NS`] / length). Of several stretches the one with the
//! lowest upper bound (mean + that error) is kept: one key, so no chain of
//! stretches drifts upward, and a short stretch wins over a long exact one
//! only when it reads lower by most of its own error (on the H200, cutting
//! an idle GPU into 2 s pieces and keeping the lowest read 75.8 W for
//! 77.5 W), while a stretch still settling from a load (higher) loses to a
//! later one. Both figures are upper bounds (the GPU may never have been
//! at rest), recorded as `lowest_seen`.
//!
//! **The host power model** keeps each GPU's figures by UUID ([`GpuFit`]):
//! `wattprof calibrate` measures them (idle with no context, held with a
//! context of its own open), and `monitor` merges what it learns. A
//! profile starts from them ([`GpuStatics::with_model`]), so a job that
//! opens its context before a stretch could teach anything is charged
//! its held and dynamic energy, not the idle power too. They compete with
//! what the profile learns by the same rule (the lowest upper bound), and
//! the source of each figure in use is recorded ([`GpuStatics::sources`]).

use serde::{Deserialize, Serialize};

use crate::sources::static_power::FitOrigin;

/// A stretch must be at least this long to teach a figure.
pub(crate) const MIN_STRETCH_NS: u64 = 2_000_000_000;

/// The start of a stretch that is left out: the power still settling.
pub(crate) const SETTLE_NS: u64 = 1_000_000_000;

/// The end of a stretch that is held back until the state is seen to go
/// on past it: the read that sees work (a sample above 0% SM) comes up to
/// a sample period or so after the work began.
pub(crate) const TAIL_NS: u64 = 1_000_000_000;

/// Timer slack in the lengths above (a 999.9 ms interval is a second).
const SLACK_NS: u64 = 50_000_000;

/// The longest step of a GPU energy counter (NVML's documentation: 20-100
/// ms; 100 ms measured on an H200).
pub(crate) const COUNTER_STEP_NS: u64 = 100_000_000;

/// What an interval showed of the GPU's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GpuState {
    /// No process held a context.
    Idle,
    /// Processes held contexts and none worked.
    Held,
    /// Anything else (work, or shares not sampled).
    Working,
}

/// One stretch of a state.
#[derive(Clone, Debug, Default)]
struct Stretch {
    /// The first interval (straddling the change) was seen.
    started: bool,
    /// Time in the state after the first interval, before the part that
    /// counts.
    settled_ns: u64,
    /// Intervals held back (the last [`TAIL_NS`]): (µJ, ns).
    tail: std::collections::VecDeque<(u64, u64)>,
    uj: u64,
    ns: u64,
}

impl Stretch {
    /// Adds an interval to the tail, and what has left the tail to the
    /// stretch.
    fn add(&mut self, uj: u64, ns: u64) {
        self.tail.push_back((uj, ns));
        let mut tail_ns: u64 = self.tail.iter().map(|t| t.1).sum();
        while let Some(&(u, n)) = self.tail.front() {
            if tail_ns - n + SLACK_NS < TAIL_NS {
                break;
            }
            self.tail.pop_front();
            tail_ns -= n;
            self.uj += u;
            self.ns += n;
        }
    }

    /// The mean power (W) and how far off it could be, once long enough.
    fn figure(&self) -> Option<Figure> {
        (self.ns + SLACK_NS >= MIN_STRETCH_NS).then(|| {
            // µJ / ns = kW: × 1e3 for watts.
            let w = self.uj as f64 / self.ns as f64 * 1e3;
            Figure {
                w,
                err: COUNTER_STEP_NS as f64 / self.ns as f64,
                from_model: false,
            }
        })
    }
}

/// A stretch's mean power and how far off it could be.
#[derive(Clone, Copy, Debug)]
struct Figure {
    w: f64,
    /// The most the counter's steps can put it off, as a fraction.
    err: f64,
    /// It came from the host power model, not this profile.
    from_model: bool,
}

impl Figure {
    /// A figure of the host model: `w` measured over `secs`; `measured`:
    /// by `calibrate` (a learned entry is an upper bound like any learned
    /// figure, and is reported as one).
    fn of_model(w: f64, secs: f64, measured: bool) -> Option<Self> {
        (w.is_finite() && w >= 0.0).then(|| Self {
            w,
            err: COUNTER_STEP_NS as f64 / (secs.max(0.1) * 1e9),
            from_model: measured,
        })
    }

    /// How long a stretch it stands for (s), from its error.
    fn secs(&self) -> f64 {
        COUNTER_STEP_NS as f64 / 1e9 / self.err.max(1e-9)
    }
}

/// The better of two figures: the one whose true mean can be the higher
/// is worse (the lower upper bound wins). One key, so no chain of
/// stretches drifts upward, and a short stretch replaces a long exact one
/// only when it reads lower by most of its own error.
fn better(a: Option<Figure>, b: Option<Figure>) -> Option<Figure> {
    match (a, b) {
        (Some(a), Some(b)) => Some(if b.upper() < a.upper() { b } else { a }),
        (a, b) => a.or(b),
    }
}

impl Figure {
    fn upper(&self) -> f64 {
        self.w * (1.0 + self.err)
    }
}

/// One GPU's static figures, learned as it is read.
#[derive(Clone, Debug, Default)]
pub(crate) struct GpuStatics {
    /// The state of the last interval seen.
    last: Option<GpuState>,
    /// The stretch under way (of `last`'s state).
    now: Stretch,
    /// The best of the idle and held stretches that have ended.
    idle: Option<Figure>,
    /// Idle + held: the lowest power with contexts open and no work.
    held_total: Option<Figure>,
    /// The host power model's idle figure, and idle + held.
    model_idle: Option<Figure>,
    model_held_total: Option<Figure>,
}

/// A GPU's static figures in the host power model, by UUID: what
/// `wattprof calibrate` measured, or what a `monitor` learned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct GpuFit {
    /// The GPU's UUID (`GPU-...`): the figures are refused for another.
    pub(crate) uuid: String,
    /// Its model name, for people.
    pub(crate) name: String,
    /// Power with no context open (W).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) idle_w: Option<f64>,
    /// Over how long it was measured (s): its error is one counter step
    /// over that.
    #[serde(default)]
    pub(crate) idle_s: f64,
    /// The extra power of one context open with no work (W).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) held_w: Option<f64>,
    /// Over how long it was measured (s).
    #[serde(default)]
    pub(crate) held_s: f64,
    /// Who made it (absent: `calibrate`).
    #[serde(default, skip_serializing_if = "FitOrigin::is_calibrate")]
    pub(crate) origin: FitOrigin,
}

impl GpuFit {
    /// Whether its figures can be a GPU's: a UUID, an idle power of at
    /// least 1 W (no GPU idles at less; 0 would make all its idle power a
    /// holder's for good), a held power of 0 or more, each under 10 kW and
    /// measured over 0.1 s to a day (a huge length would make the figure
    /// seem exact and never replaced).
    pub(crate) fn sane(&self) -> bool {
        let w_ok = |w: Option<f64>, min: f64| {
            w.is_none_or(|w| w.is_finite() && (min..=10_000.0).contains(&w))
        };
        let s_ok = |w: Option<f64>, s: f64| {
            w.is_none() || (s.is_finite() && (0.1..=86_400.0).contains(&s))
        };
        !self.uuid.trim().is_empty()
            && w_ok(self.idle_w, 1.0)
            && w_ok(self.held_w, 0.0)
            && s_ok(self.idle_w, self.idle_s)
            && s_ok(self.held_w, self.held_s)
    }

    /// `learned` merged into this entry of the model: a fit of
    /// `calibrate` is kept as it is; a learned one takes each figure that
    /// is better (the lowest upper bound). Whether it changed.
    pub(crate) fn merge(&mut self, learned: &Self) -> bool {
        if self.origin == FitOrigin::Calibrate {
            return false;
        }
        // The new figure only where it is strictly better: the one kept
        // is carried as it was written (no round trip through its error).
        let pick = |have: (Option<f64>, f64), new: (Option<f64>, f64)| -> (Option<f64>, f64) {
            let fig = |(w, s): (Option<f64>, f64)| w.and_then(|w| Figure::of_model(w, s, true));
            match (fig(have), fig(new)) {
                (Some(h), Some(n)) if n.upper() < h.upper() => new,
                (None, Some(_)) => new,
                _ => have,
            }
        };
        let idle = pick((self.idle_w, self.idle_s), (learned.idle_w, learned.idle_s));
        let held = pick((self.held_w, self.held_s), (learned.held_w, learned.held_s));
        let changed = idle != (self.idle_w, self.idle_s) || held != (self.held_w, self.held_s);
        (self.idle_w, self.idle_s) = idle;
        (self.held_w, self.held_s) = held;
        changed
    }
}

/// Where a GPU's static figure in use came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GpuFigureSource {
    /// The host power model.
    HostModel,
    /// Learned: in this profile (lower than the model's, or no model),
    /// or by a monitor (the model's learned entries): an upper bound.
    Learned,
}

impl GpuFigureSource {
    fn of(f: &Figure) -> Self {
        if f.from_model {
            Self::HostModel
        } else {
            Self::Learned
        }
    }

    /// Its words in the table's note.
    pub(crate) fn words(self) -> &'static str {
        match self {
            Self::HostModel => "host model, measured by calibrate",
            Self::Learned => "learned, the lowest seen: an upper bound",
        }
    }
}

/// A GPU's static energy over one interval (µJ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct GpuStaticEnergy {
    /// Idle power × the interval: the idle row's, whoever holds the GPU.
    pub(crate) idle_uj: u64,
    /// Held power × the interval, when a process holds the GPU: shared by
    /// the holders.
    pub(crate) held_uj: u64,
}

impl GpuStaticEnergy {
    /// What an interval that measured `measured_uj` is charged of this
    /// static energy plus `debt` (what earlier intervals could not hold: a
    /// counter that steps every 20-100 ms reads 0 J over some short
    /// intervals and two steps over the next), at most what it measured,
    /// idle first; what it cannot hold becomes the debt, up to `cap` (more
    /// means the figure is above the power: dropped). Held energy is owed
    /// only while a process holds the GPU (`held`).
    pub(crate) fn charge(self, debt: &mut Self, measured_uj: u64, held: bool, cap: Self) -> Self {
        let want_idle = self.idle_uj + debt.idle_uj;
        let want_held = if held { self.held_uj + debt.held_uj } else { 0 };
        let idle_uj = want_idle.min(measured_uj);
        let held_uj = want_held.min(measured_uj - idle_uj);
        *debt = Self {
            idle_uj: (want_idle - idle_uj).min(cap.idle_uj),
            held_uj: (want_held - held_uj).min(cap.held_uj),
        };
        Self { idle_uj, held_uj }
    }
}

impl GpuStatics {
    /// Figures that start from the host power model's for this GPU.
    pub(crate) fn with_model(fit: &GpuFit) -> Self {
        let measured = fit.origin == FitOrigin::Calibrate;
        let idle = fit
            .idle_w
            .and_then(|w| Figure::of_model(w, fit.idle_s, measured));
        let held_total = fit.held_w.and_then(|h| {
            // Idle + held: the resting power with a context, as learned.
            let total = h + fit.idle_w.unwrap_or(0.0);
            Figure::of_model(total, fit.held_s, measured)
        });
        Self {
            model_idle: idle,
            model_held_total: held_total.filter(|_| idle.is_some()),
            ..Self::default()
        }
    }

    /// What this profile learned, as an entry of the host power model
    /// (the model's own figures left out); `None` when it learned nothing.
    pub(crate) fn learned_fit(&self, uuid: &str, name: &str) -> Option<GpuFit> {
        let ended = |state, f| {
            let now = (self.last == Some(state))
                .then(|| self.now.figure())
                .flatten();
            better(f, now)
        };
        let idle = ended(GpuState::Idle, self.idle);
        let held_total = ended(GpuState::Held, self.held_total);
        // Held is learned against an idle figure: this profile's, else the
        // model's (without either, the resting power is not split).
        let base = better(idle, self.model_idle);
        // The held figure is a difference: its error is the total's, over
        // the smaller figure (45 W of 125 W: 2.8 times the total's share).
        let held = held_total.zip(base).map(|(h, i)| {
            let held_w = (h.w - i.w).max(0.0);
            let secs = if h.w > 0.0 {
                h.secs() * held_w / h.w
            } else {
                0.0
            };
            (held_w, secs.max(0.1))
        });
        if idle.is_none() && held.is_none() {
            return None;
        }
        Some(GpuFit {
            uuid: uuid.to_string(),
            name: name.to_string(),
            idle_w: idle.map(|f| f.w),
            idle_s: idle.map_or(0.0, |f| f.secs()),
            held_w: held.map(|h| h.0),
            held_s: held.map_or(0.0, |h| h.1),
            origin: FitOrigin::Learned,
        })
    }

    /// Where the idle and held figures in use come from (`None`: not
    /// known).
    pub(crate) fn sources(&self) -> (Option<GpuFigureSource>, Option<GpuFigureSource>) {
        (
            self.idle_figure().as_ref().map(GpuFigureSource::of),
            self.held_total_figure().as_ref().map(GpuFigureSource::of),
        )
    }

    fn idle_figure(&self) -> Option<Figure> {
        self.best_figure(GpuState::Idle, better(self.idle, self.model_idle))
    }

    fn held_total_figure(&self) -> Option<Figure> {
        self.best_figure(
            GpuState::Held,
            better(self.held_total, self.model_held_total),
        )
    }

    /// Learns from an interval of `uj` over `ns` in `state`.
    pub(crate) fn observe(&mut self, state: GpuState, uj: u64, ns: u64) {
        if self.last != Some(state) {
            self.end_stretch();
            self.last = Some(state);
            self.now = Stretch::default();
        }
        if !matches!(state, GpuState::Idle | GpuState::Held) {
            return;
        }
        // The first interval straddles the change; then the power settles.
        if !self.now.started {
            self.now.started = true;
            return;
        }
        if self.now.settled_ns + SLACK_NS < SETTLE_NS {
            self.now.settled_ns += ns;
            return;
        }
        self.now.add(uj, ns);
    }

    /// Keeps the stretch that ended if it is the better one.
    fn end_stretch(&mut self) {
        let done = self.now.figure();
        match self.last {
            Some(GpuState::Idle) => self.idle = better(self.idle, done),
            Some(GpuState::Held) => self.held_total = better(self.held_total, done),
            _ => {}
        }
    }

    /// The best figure of a state: the stretches ended (and the model's)
    /// and the one under way.
    fn best_figure(&self, state: GpuState, ended: Option<Figure>) -> Option<Figure> {
        let now = (self.last == Some(state))
            .then(|| self.now.figure())
            .flatten();
        better(ended, now)
    }

    /// The power with no context open (W), once seen or from the model.
    pub(crate) fn idle_w(&self) -> Option<f64> {
        self.idle_figure().map(|f| f.w)
    }

    /// The extra power of holding contexts with no work (W), once seen or
    /// from the model. Until an idle figure is known too, it is all the
    /// power with contexts open and no work (the idle power charged as
    /// held).
    pub(crate) fn held_w(&self) -> Option<f64> {
        self.held_total_figure()
            .map(|h| (h.w - self.idle_w().unwrap_or(0.0)).max(0.0))
    }

    /// The static energy of an interval of `ns`, `held` when a process
    /// held the GPU.
    pub(crate) fn energy(&self, ns: u64, held: bool) -> GpuStaticEnergy {
        let uj = |w: f64| (w * ns as f64 / 1e3).round().max(0.0) as u64;
        GpuStaticEnergy {
            idle_uj: self.idle_w().map_or(0, uj),
            held_uj: if held { self.held_w().map_or(0, uj) } else { 0 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{GpuState, GpuStatics, MIN_STRETCH_NS, SETTLE_NS, TAIL_NS};

    const S: u64 = 1_000_000_000;

    #[test]
    fn idle_and_held_are_learned_from_long_settled_stretches_of_their_state() {
        let mut g = GpuStatics::default();
        // 31.7 W idle in 500 ms intervals: the first interval (at 90 W,
        // still falling from a load) and the next second are left out,
        // then 2 s counts once a further second has followed it.
        g.observe(GpuState::Idle, 45_000_000, S / 2);
        g.observe(GpuState::Idle, 20_000_000, S / 2);
        g.observe(GpuState::Idle, 16_000_000, S / 2);
        for i in 0..6 {
            assert_eq!(g.idle_w(), None, "{i}");
            g.observe(GpuState::Idle, 15_850_000, S / 2);
        }
        assert!((g.idle_w().expect("idle") - 31.7).abs() < 1e-9);
        // Work breaks a stretch: 3 s held, then work, teaches nothing.
        for _ in 0..6 {
            g.observe(GpuState::Held, 27_000_000, S / 2);
        }
        g.observe(GpuState::Working, 400_000_000, S);
        assert_eq!(g.held_w(), None);
        // 53.9 W with contexts open and no work: 22.2 W held; the last
        // second before work began (at 80 W: the work already under way
        // when the read saw it) is left out.
        g.observe(GpuState::Held, 1, S);
        g.observe(GpuState::Held, 1, S);
        for _ in 0..2 {
            g.observe(GpuState::Held, 53_900_000, S);
        }
        g.observe(GpuState::Held, 80_000_000, S);
        g.observe(GpuState::Working, 400_000_000, S);
        assert!((g.held_w().expect("held") - 22.2).abs() < 1e-9);
        // A higher stretch later does not replace it.
        g.observe(GpuState::Held, 1, S);
        g.observe(GpuState::Held, 1, S);
        for _ in 0..4 {
            g.observe(GpuState::Held, 60_000_000, S);
        }
        assert!((g.held_w().expect("held") - 22.2).abs() < 1e-9);
        let e = g.energy(S / 4, true);
        assert_eq!((e.idle_uj, e.held_uj), (7_925_000, 5_550_000));
        assert_eq!(g.energy(S / 4, false).held_uj, 0);
    }

    #[test]
    fn a_state_that_flips_every_interval_teaches_nothing() {
        let mut g = GpuStatics::default();
        for i in 0..100 {
            let state = if i % 2 == 0 {
                GpuState::Idle
            } else {
                GpuState::Held
            };
            g.observe(state, 20_000_000, S / 4);
        }
        assert_eq!((g.idle_w(), g.held_w()), (None, None));
    }

    /// Energy read about every 250 ms (a sampler's jitter, ±45 ms) from a
    /// counter that steps every 100 ms at `w` watts, as an H200's does:
    /// each read's growth (µJ) and its interval (ns).
    fn stepped(w: f64, reads: u64, phase_ms: u64) -> Vec<(u64, u64)> {
        let t = |i: u64| {
            if i == 0 {
                0
            } else {
                i * 250 + (i * 37) % 91 - 45
            }
        };
        let at = |t_ms: u64| ((t_ms + phase_ms) / 100 * 100) as f64 * w * 1e3;
        (0..reads)
            .map(|i| {
                (
                    (at(t(i + 1)) - at(t(i))) as u64,
                    (t(i + 1) - t(i)) * 1_000_000,
                )
            })
            .collect()
    }

    #[test]
    fn a_counter_that_steps_is_not_read_low_by_keeping_the_lowest_piece() {
        // 77.5 W idle for 20 s: each read holds 2 or 3 steps (15.5 or
        // 23.25 J). Kept as 2 s pieces, the lowest read 75.8 W on an H200;
        // the whole stretch is exact to a step.
        for phase in [0, 30, 60, 90] {
            let mut g = GpuStatics::default();
            for (uj, ns) in stepped(77.5, 80, phase) {
                g.observe(GpuState::Idle, uj, ns);
            }
            let w = g.idle_w().expect("idle");
            assert!((w / 77.5 - 1.0).abs() < 0.006, "phase {phase}: {w}");
        }
        // A short stretch that read 3% low does not replace it.
        let mut g = GpuStatics::default();
        for (uj, ns) in stepped(77.5, 80, 0) {
            g.observe(GpuState::Idle, uj, ns);
        }
        g.observe(GpuState::Working, 1, S);
        let mut short = vec![(1, S / 4); 5];
        short.extend(vec![(18_794_000, S / 4); 12]);
        for (uj, ns) in short {
            g.observe(GpuState::Idle, uj, ns);
        }
        g.observe(GpuState::Working, 1, S);
        let w = g.idle_w().expect("idle");
        assert!((w / 77.5 - 1.0).abs() < 0.006, "{w}");
        // But a shorter stretch clearly lower does: the first, 10 s at
        // 100 W, was still settling from a load.
        let mut g = GpuStatics::default();
        for _ in 0..45 {
            g.observe(GpuState::Idle, 25_000_000, S / 4);
        }
        g.observe(GpuState::Working, 1, S);
        for (uj, ns) in stepped(77.5, 25, 0) {
            g.observe(GpuState::Idle, uj, ns);
        }
        let w = g.idle_w().expect("idle");
        assert!((w / 77.5 - 1.0).abs() < 0.05, "{w}");
        // No chain of longer, higher stretches drifts upward.
        let mut g = GpuStatics::default();
        for (secs, w) in [(3u64, 77.0), (5, 80.0), (10, 83.0)] {
            g.observe(GpuState::Working, 1, S);
            for _ in 0..(secs + 3) {
                g.observe(GpuState::Idle, (w * 1e6) as u64, S);
            }
        }
        g.observe(GpuState::Working, 1, S);
        let w = g.idle_w().expect("idle");
        assert!((w - 77.0).abs() < 1e-9, "{w}");
    }

    #[test]
    fn static_energy_an_interval_could_not_hold_is_charged_to_the_next() {
        use super::GpuStaticEnergy as E;
        // 10 J idle + 5 J held an interval; the counter stepped 0 J, then
        // 40 J, then 20 J.
        let figure = E {
            idle_uj: 10,
            held_uj: 5,
        };
        let cap = E {
            idle_uj: 40,
            held_uj: 20,
        };
        let mut debt = E::default();
        assert_eq!(figure.charge(&mut debt, 0, true, cap), E::default());
        assert_eq!(debt, figure);
        assert_eq!(
            figure.charge(&mut debt, 40, true, cap),
            E {
                idle_uj: 20,
                held_uj: 10
            }
        );
        assert_eq!(debt, E::default());
        // Over the three: 30 J idle and 15 J held, as three intervals owe.
        assert_eq!(figure.charge(&mut debt, 20, true, cap), figure);
        // With no holder, held energy is neither charged nor owed.
        let mut debt = E::default();
        let got = figure.charge(&mut debt, 12, false, cap);
        assert_eq!((got.held_uj, debt.held_uj), (0, 0));
        // A figure far above the power: the debt stops at the cap.
        let mut debt = E::default();
        for _ in 0..10 {
            figure.charge(&mut debt, 0, true, cap);
        }
        assert_eq!(debt, cap);
    }

    #[test]
    fn the_host_model_s_figures_are_used_until_a_better_one_is_learned() {
        use super::{GpuFigureSource as Src, GpuFit};
        use crate::sources::static_power::FitOrigin;
        let fit = GpuFit {
            uuid: "GPU-1".into(),
            name: "H200".into(),
            idle_w: Some(81.0),
            idle_s: 10.0,
            held_w: Some(45.0),
            held_s: 10.0,
            origin: FitOrigin::Calibrate,
        };
        // From the first interval: idle and held known, from the model.
        let mut g = GpuStatics::with_model(&fit);
        assert_eq!(g.idle_w(), Some(81.0));
        assert!((g.held_w().expect("held") - 45.0).abs() < 1e-9);
        assert_eq!(g.sources(), (Some(Src::HostModel), Some(Src::HostModel)));
        let e = g.energy(S, true);
        assert_eq!((e.idle_uj, e.held_uj), (81_000_000, 45_000_000));
        // A run that sees 10 s idle at 80 W: a lower upper bound, learned.
        g.observe(GpuState::Idle, 1, S);
        for _ in 0..12 {
            g.observe(GpuState::Idle, 80_000_000, S);
        }
        assert!((g.idle_w().expect("idle") - 80.0).abs() < 1e-9);
        assert_eq!(g.sources().0, Some(Src::Learned));
        // Held stays the model's: 81 + 45 less the learned 80.
        assert!((g.held_w().expect("held") - 46.0).abs() < 1e-9);
        // What it learned, for monitor to merge: idle only.
        let learned = g.learned_fit("GPU-1", "H200").expect("learned");
        assert_eq!((learned.idle_w, learned.held_w), (Some(80.0), None));
        assert_eq!(learned.origin, FitOrigin::Learned);
        // calibrate's entry is never replaced; a learned one takes what is
        // better, and keeps what is not.
        let mut cal = fit.clone();
        assert!(!cal.merge(&learned));
        assert_eq!(cal, fit);
        let mut had = GpuFit {
            origin: FitOrigin::Learned,
            ..fit.clone()
        };
        assert!(had.merge(&learned));
        assert_eq!((had.idle_w, had.held_w), (Some(80.0), Some(45.0)));
        let worse = GpuFit {
            idle_w: Some(90.0),
            ..learned
        };
        assert!(!had.merge(&worse));
        // A short stretch that reads higher does not replace the model's.
        let mut g = GpuStatics::with_model(&fit);
        for _ in 0..5 {
            g.observe(GpuState::Idle, 82_000_000, S);
        }
        assert_eq!(g.idle_w(), Some(81.0));
        // Garbage in a model file is no power.
        assert!(
            !GpuFit {
                idle_w: Some(f64::NAN),
                ..fit
            }
            .sane()
        );
    }

    #[test]
    fn held_before_any_idle_stretch_is_all_of_the_resting_power() {
        let mut g = GpuStatics::default();
        g.observe(GpuState::Held, 1, S);
        g.observe(GpuState::Held, 1, SETTLE_NS);
        g.observe(GpuState::Held, 70_000_000 * 2, MIN_STRETCH_NS);
        g.observe(GpuState::Held, 70_000_000, TAIL_NS);
        assert_eq!(g.idle_w(), None);
        assert!((g.held_w().expect("held") - 70.0).abs() < 1e-9);
        assert_eq!(g.energy(S, true).idle_uj, 0);
    }
}
