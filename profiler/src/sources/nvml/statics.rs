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
//! less its first [`SETTLE_NS`] (the first interval straddles the change of
//! state, and an H200 took half a second to fall from 126 W to its 77.5 W
//! idle after a load), and it teaches once it is [`MIN_STRETCH_NS`] long.
//!
//! A stretch grows as long as the state lasts: its figure is its whole
//! mean. The energy counter steps every 20-100 ms (100 ms on an H200), so a
//! stretch's energy is exact to a step: ±5% over 2 s, ±0.5% over 20 s
//! ([`COUNTER_STEP_NS`] / length). Of several stretches, a lower one
//! replaces the one kept only when the two differ by more than that;
//! otherwise the longer is kept. So a short stretch that read a step low
//! does not win over a long exact one (on the H200, cutting an idle GPU
//! into 2 s pieces and keeping the lowest read 75.8 W for 77.5 W), while a
//! stretch still settling from a load (clearly higher) loses to a later
//! one. Both figures are upper bounds (the GPU may never have
//! been at rest), said so as `lowest_seen`.

/// A stretch must be at least this long to teach a figure.
pub const MIN_STRETCH_NS: u64 = 2_000_000_000;

/// The start of a stretch that is left out: the power still settling.
pub const SETTLE_NS: u64 = 1_000_000_000;

/// The longest step of a GPU energy counter (NVML's documentation: 20-100
/// ms; 100 ms measured on an H200).
pub const COUNTER_STEP_NS: u64 = 100_000_000;

/// What an interval showed of the GPU's state.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GpuState {
    /// No process held a context.
    Idle,
    /// Processes held contexts and none worked.
    Held,
    /// Anything else (work, or shares not sampled).
    Working,
}

/// One stretch of a state.
#[derive(Clone, Copy, Debug, Default)]
struct Stretch {
    /// Time in the state before the part that counts.
    settled_ns: u64,
    uj: u64,
    ns: u64,
}

impl Stretch {
    /// The mean power (W) and its upper bound, once long enough.
    fn figure(&self) -> Option<Figure> {
        (self.ns >= MIN_STRETCH_NS).then(|| {
            // µJ / ns = kW: × 1e3 for watts.
            let w = self.uj as f64 / self.ns as f64 * 1e3;
            Figure {
                w,
                err: COUNTER_STEP_NS as f64 / self.ns as f64,
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
}

/// The better of two figures: the lower where they differ by more than
/// their errors, else the more exact (the longer stretch).
fn better(a: Option<Figure>, b: Option<Figure>) -> Option<Figure> {
    match (a, b) {
        (Some(a), Some(b)) => {
            let apart = |x: Figure, y: Figure| x.w * (1.0 + x.err) < y.w * (1.0 - y.err);
            Some(if apart(b, a) || (!apart(a, b) && b.err < a.err) {
                b
            } else {
                a
            })
        }
        (a, b) => a.or(b),
    }
}

/// One GPU's static figures, learned as it is read.
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuStatics {
    /// The state of the last interval seen.
    last: Option<GpuState>,
    /// The stretch under way (of `last`'s state).
    now: Stretch,
    /// The best of the idle and held stretches that have ended.
    idle: Option<Figure>,
    /// Idle + held: the lowest power with contexts open and no work.
    held_total: Option<Figure>,
}

/// A GPU's static energy over one interval (µJ).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GpuStaticEnergy {
    /// Idle power × the interval: the idle row's, whoever holds the GPU.
    pub idle_uj: u64,
    /// Held power × the interval, when a process holds the GPU: shared by
    /// the holders.
    pub held_uj: u64,
}

impl GpuStaticEnergy {
    /// What an interval that measured `measured_uj` is charged of this
    /// static energy plus `debt` (what earlier intervals could not hold: a
    /// counter that steps every 20-100 ms reads 0 J over some short
    /// intervals and two steps over the next), at most what it measured,
    /// idle first; what it cannot hold becomes the debt, up to `cap` (more
    /// means the figure is above the power: dropped). Held energy is owed
    /// only while a process holds the GPU (`held`).
    pub fn charge(self, debt: &mut Self, measured_uj: u64, held: bool, cap: Self) -> Self {
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
    /// Learns from an interval of `uj` over `ns` in `state`.
    pub fn observe(&mut self, state: GpuState, uj: u64, ns: u64) {
        if self.last != Some(state) {
            self.end_stretch();
            self.last = Some(state);
            self.now = Stretch::default();
        }
        if !matches!(state, GpuState::Idle | GpuState::Held) {
            return;
        }
        // The first interval always straddles the change; then the power
        // settles.
        if self.now.settled_ns < SETTLE_NS {
            self.now.settled_ns += ns.max(1);
            return;
        }
        self.now.uj += uj;
        self.now.ns += ns;
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

    /// The best figure of a state: the stretches ended and the one under
    /// way.
    fn best(&self, state: GpuState, ended: Option<Figure>) -> Option<f64> {
        let now = (self.last == Some(state))
            .then(|| self.now.figure())
            .flatten();
        better(ended, now).map(|f| f.w)
    }

    /// The power with no context open (W), once seen.
    pub fn idle_w(&self) -> Option<f64> {
        self.best(GpuState::Idle, self.idle)
    }

    /// The extra power of holding contexts with no work (W), once seen.
    /// Until an idle stretch is seen too, it is all the power with
    /// contexts open and no work (the idle power charged as held).
    pub fn held_w(&self) -> Option<f64> {
        self.best(GpuState::Held, self.held_total)
            .map(|h| (h - self.idle_w().unwrap_or(0.0)).max(0.0))
    }

    /// The static energy of an interval of `ns`, `held` when a process
    /// held the GPU.
    pub fn energy(&self, ns: u64, held: bool) -> GpuStaticEnergy {
        let uj = |w: f64| (w * ns as f64 / 1e3).round().max(0.0) as u64;
        GpuStaticEnergy {
            idle_uj: self.idle_w().map_or(0, uj),
            held_uj: if held { self.held_w().map_or(0, uj) } else { 0 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{GpuState, GpuStatics, MIN_STRETCH_NS, SETTLE_NS};

    const S: u64 = 1_000_000_000;

    #[test]
    fn idle_and_held_are_learned_from_long_settled_stretches_of_their_state() {
        let mut g = GpuStatics::default();
        // 31.7 W idle in 500 ms intervals: the first second settles (the
        // first interval at 90 W, still falling from a load), then 2 s.
        g.observe(GpuState::Idle, 45_000_000, S / 2);
        g.observe(GpuState::Idle, 15_850_000, S / 2);
        for i in 0..4 {
            assert_eq!(g.idle_w(), None, "{i}");
            g.observe(GpuState::Idle, 15_850_000, S / 2);
        }
        assert!((g.idle_w().expect("idle") - 31.7).abs() < 1e-9);
        // Work breaks a stretch: 1.5 s held, then work, teaches nothing.
        g.observe(GpuState::Held, 1, S / 2);
        g.observe(GpuState::Held, 1, S / 2);
        g.observe(GpuState::Held, 80_000_000, 3 * S / 2);
        g.observe(GpuState::Working, 400_000_000, S);
        assert_eq!(g.held_w(), None);
        // 53.9 W with contexts open and no work: 22.2 W held.
        g.observe(GpuState::Held, 1, S);
        g.observe(GpuState::Held, 53_900_000 * 2, 2 * S);
        assert!((g.held_w().expect("held") - 22.2).abs() < 1e-9);
        // A higher stretch later does not replace it.
        g.observe(GpuState::Working, 400_000_000, S);
        g.observe(GpuState::Held, 1, S);
        g.observe(GpuState::Held, 60_000_000 * 3, 3 * S);
        assert!((g.held_w().expect("held") - 22.2).abs() < 1e-9);
        let e = g.energy(S / 4, true);
        assert_eq!((e.idle_uj, e.held_uj), (7_925_000, 5_550_000));
        assert_eq!(g.energy(S / 4, false).held_uj, 0);
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
        // A short stretch that read a step low does not replace it.
        let mut g = GpuStatics::default();
        for (uj, ns) in stepped(77.5, 80, 0) {
            g.observe(GpuState::Idle, uj, ns);
        }
        g.observe(GpuState::Working, 1, S);
        // 2 s at 77.5 W less one 7.75 J step: 73.6 W.
        let mut short = vec![(1, S / 4); 4];
        short.extend(vec![(19_375_000, S / 4); 8]);
        short[11].0 -= 7_750_000;
        for (uj, ns) in short {
            g.observe(GpuState::Idle, uj, ns);
        }
        g.observe(GpuState::Working, 1, S);
        let w = g.idle_w().expect("idle");
        assert!((w / 77.5 - 1.0).abs() < 0.006, "{w}");
        // But a stretch clearly lower (the first was still settling from
        // a load) does.
        let mut g = GpuStatics::default();
        for _ in 0..16 {
            g.observe(GpuState::Idle, 25_000_000, S / 4);
        }
        g.observe(GpuState::Working, 1, S);
        for (uj, ns) in stepped(77.5, 40, 0) {
            g.observe(GpuState::Idle, uj, ns);
        }
        let w = g.idle_w().expect("idle");
        assert!((w / 77.5 - 1.0).abs() < 0.012, "{w}");
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
    fn held_before_any_idle_stretch_is_all_of_the_resting_power() {
        let mut g = GpuStatics::default();
        g.observe(GpuState::Held, 1, SETTLE_NS);
        g.observe(GpuState::Held, 70_000_000 * 2, MIN_STRETCH_NS);
        assert_eq!(g.idle_w(), None);
        assert!((g.held_w().expect("held") - 70.0).abs() < 1e-9);
        assert_eq!(g.energy(S, true).idle_uj, 0);
    }
}
