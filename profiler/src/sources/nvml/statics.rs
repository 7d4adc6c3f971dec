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
//! The idle figure is the lowest mean power seen over stretches with no
//! context, the held figure the lowest over stretches where no holder
//! worked (NVML gave no sample above 0% SM within 2 s, and the GPU's
//! utilization was 0 where it says), less the idle figure. A stretch is consecutive
//! intervals in the same state (less the first, which straddles the change
//! of state), at least [`MIN_STRETCH_NS`] long: a
//! counter that steps every 20-100 ms is exact to a step at each end of
//! it, so 2 s bounds that error to 10% at worst and usually 1-2%, and the
//! lowest of the stretches is kept. Both are upper bounds (the GPU may
//! never have been at rest), said so as `lowest_seen`.

/// A stretch must be at least this long to teach a figure.
pub const MIN_STRETCH_NS: u64 = 2_000_000_000;

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

#[derive(Clone, Copy, Debug, Default)]
struct Stretch {
    uj: u64,
    ns: u64,
}

impl Stretch {
    /// Adds an interval; the mean power (W) once the stretch is long
    /// enough, after which it starts again.
    fn add(&mut self, uj: u64, ns: u64) -> Option<f64> {
        self.uj += uj;
        self.ns += ns;
        if self.ns < MIN_STRETCH_NS {
            return None;
        }
        // µJ / ns = kW: × 1e3 for watts.
        let w = self.uj as f64 / self.ns as f64 * 1e3;
        *self = Self::default();
        Some(w)
    }
}

/// One GPU's static figures, learned as it is read.
#[derive(Clone, Copy, Debug, Default)]
pub struct GpuStatics {
    /// The state of the last interval seen.
    last: Option<GpuState>,
    idle: Stretch,
    held: Stretch,
    idle_w: Option<f64>,
    /// Idle + held: the lowest power with contexts open and no work.
    held_total_w: Option<f64>,
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
        // The first interval in a state straddles the change: part of it
        // was still the state before (the state is what the read saw).
        let first = self.last != Some(state);
        self.last = Some(state);
        if first {
            self.idle = Stretch::default();
            self.held = Stretch::default();
            return;
        }
        match state {
            GpuState::Idle => {
                self.held = Stretch::default();
                if let Some(w) = self.idle.add(uj, ns) {
                    self.idle_w = Some(self.idle_w.map_or(w, |x| x.min(w)));
                }
            }
            GpuState::Held => {
                self.idle = Stretch::default();
                if let Some(w) = self.held.add(uj, ns) {
                    self.held_total_w = Some(self.held_total_w.map_or(w, |x| x.min(w)));
                }
            }
            GpuState::Working => {
                self.idle = Stretch::default();
                self.held = Stretch::default();
            }
        }
    }

    /// The power with no context open (W), once seen.
    pub fn idle_w(&self) -> Option<f64> {
        self.idle_w
    }

    /// The extra power of holding contexts with no work (W), once seen.
    /// Until an idle stretch is seen too, it is all the power with
    /// contexts open and no work (the idle power charged as held).
    pub fn held_w(&self) -> Option<f64> {
        self.held_total_w
            .map(|h| (h - self.idle_w.unwrap_or(0.0)).max(0.0))
    }

    /// The static energy of an interval of `ns`, `held` when a process
    /// held the GPU.
    pub fn energy(&self, ns: u64, held: bool) -> GpuStaticEnergy {
        let uj = |w: f64| (w * ns as f64 / 1e3).round().max(0.0) as u64;
        GpuStaticEnergy {
            idle_uj: self.idle_w.map_or(0, uj),
            held_uj: if held { self.held_w().map_or(0, uj) } else { 0 },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::{GpuState, GpuStatics, MIN_STRETCH_NS};

    const S: u64 = 1_000_000_000;

    #[test]
    fn idle_and_held_are_the_lowest_long_stretches_of_their_state() {
        let mut g = GpuStatics::default();
        // 31.7 W idle in 500 ms intervals: known after 2 s, not before,
        // the first interval (straddling the change) left out.
        g.observe(GpuState::Idle, 1, S / 2);
        for i in 0..4 {
            assert_eq!(g.idle_w(), None, "{i}");
            g.observe(GpuState::Idle, 15_850_000, S / 2);
        }
        assert!((g.idle_w().expect("idle") - 31.7).abs() < 1e-9);
        // Work breaks a stretch: 1.5 s held, then work, teaches nothing.
        g.observe(GpuState::Held, 1, S / 2);
        g.observe(GpuState::Held, 80_000_000, 3 * S / 2);
        g.observe(GpuState::Working, 400_000_000, S);
        g.observe(GpuState::Held, 1, S / 2);
        assert_eq!(g.held_w(), None);
        // 53.9 W with contexts open and no work: 22.2 W held.
        g.observe(GpuState::Held, 53_900_000 * 2, 2 * S);
        assert!((g.held_w().expect("held") - 22.2).abs() < 1e-9);
        // A higher stretch later keeps the lowest.
        g.observe(GpuState::Held, 60_000_000 * 3, 3 * S);
        assert!((g.held_w().expect("held") - 22.2).abs() < 1e-9);
        let e = g.energy(S / 4, true);
        assert_eq!((e.idle_uj, e.held_uj), (7_925_000, 5_550_000));
        assert_eq!(g.energy(S / 4, false).held_uj, 0);
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
        g.observe(GpuState::Held, 1, 1);
        g.observe(GpuState::Held, 70_000_000 * 2, MIN_STRETCH_NS);
        assert_eq!(g.idle_w(), None);
        assert!((g.held_w().expect("held") - 70.0).abs() < 1e-9);
        assert_eq!(g.energy(S, true).idle_uj, 0);
    }
}
