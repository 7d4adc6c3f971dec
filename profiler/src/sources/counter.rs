//! Wraparound of hardware energy counters, handled here for every reader.
//!
//! RAPL counters are 32 bits wide and wrap every few minutes under load
//! (at 200 W and 61 µJ per step, after about 22 minutes); powercap exposes
//! them scaled, wrapping at `max_energy_range_uj`. A reader feeds each raw
//! reading to [`WrappingCounter::advance`] and gets the growth since the
//! previous reading, in the counter's own units.

/// A monotonic counter that wraps to zero after `modulus - 1`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct WrappingCounter {
    modulus: u64,
    last: Option<u64>,
    /// A 64-bit counter never wraps in practice: a decrease is a reset
    /// (GPU reset, driver reload) and counting restarts from its value.
    decrease_is_reset: bool,
}

impl WrappingCounter {
    /// A counter whose values are `0..modulus`.
    pub(crate) fn new(modulus: u64) -> Self {
        Self {
            modulus: modulus.max(1),
            last: None,
            decrease_is_reset: false,
        }
    }

    /// A counter of `bits` bits (64: decreases are resets, not wraps).
    pub(crate) fn bits(bits: u32) -> Self {
        if bits >= 64 {
            Self {
                decrease_is_reset: true,
                ..Self::new(u64::MAX)
            }
        } else {
            Self::new(1u64 << bits)
        }
    }

    /// The last reading, within the range.
    pub(crate) fn last(&self) -> Option<u64> {
        self.last
    }

    /// The range: readings are below it.
    pub(crate) fn modulus(&self) -> u64 {
        self.modulus
    }

    /// Forgets the last reading (the counter vanished): the next one is a
    /// new starting point. The range is kept.
    pub(crate) fn reset(&mut self) {
        self.last = None;
    }

    /// The growth since the previous reading (`None` on the first one). A
    /// reading below the previous one is taken as one wrap: reads come far
    /// more often than a counter can wrap twice.
    pub(crate) fn advance(&mut self, now: u64) -> Option<u64> {
        let now = now % self.modulus;
        let delta = self.last.map(|last| {
            if now >= last {
                now - last
            } else if self.decrease_is_reset {
                now
            } else {
                self.modulus - last + now
            }
        });
        self.last = Some(now);
        delta
    }
}

/// A wrapping counter in steps of a known energy, reported in whole
/// microjoules. The sub-microjoule remainder is carried to the next
/// reading, so rounding never accumulates however often it is read.
#[derive(Clone, Debug)]
pub(crate) struct EnergyCounter {
    counter: WrappingCounter,
    joules_per_step: f64,
    carry_uj: f64,
}

impl EnergyCounter {
    /// A counter of `counter`'s range, each step worth `joules_per_step`.
    pub(crate) fn new(counter: WrappingCounter, joules_per_step: f64) -> Self {
        Self {
            counter,
            joules_per_step,
            carry_uj: 0.0,
        }
    }

    /// The energy of one step, in joules.
    pub(crate) fn joules_per_step(&self) -> f64 {
        self.joules_per_step
    }

    /// Microjoules since the previous reading (`None` on the first).
    pub(crate) fn advance(&mut self, raw: u64) -> Option<u64> {
        let steps = self.counter.advance(raw)?;
        let uj = steps as f64 * self.joules_per_step * 1e6 + self.carry_uj;
        let whole = uj.floor();
        self.carry_uj = uj - whole;
        Some(whole as u64)
    }
}

#[cfg(test)]
mod tests {
    use super::{EnergyCounter, WrappingCounter};

    #[test]
    fn energy_counter_carries_rounding() {
        // 61.03515625 µJ per step, read after every step.
        let mut c = EnergyCounter::new(WrappingCounter::bits(32), 1.0 / 16384.0);
        c.advance(0);
        let total: u64 = (1..=1000).filter_map(|i| c.advance(i)).sum();
        assert_eq!(total, 61_035);
    }

    #[test]
    fn grows_and_wraps() {
        let mut c = WrappingCounter::new(1000);
        assert_eq!(c.advance(990), None);
        assert_eq!(c.advance(995), Some(5));
        // 995 -> 999 -> 0 -> 7: 12 steps.
        assert_eq!(c.advance(7), Some(12));
        assert_eq!(c.advance(7), Some(0));
    }

    #[test]
    fn thirty_two_bit_msr_counter() {
        let mut c = WrappingCounter::bits(32);
        c.advance(0xffff_fff0);
        assert_eq!(c.advance(0x10), Some(0x20));
        // Bits above the counter's width are ignored.
        assert_eq!(c.advance(0xdead_0000_0000_0020), Some(0x10));
    }

    #[test]
    fn a_64_bit_counter_that_goes_down_was_reset() {
        let mut c = WrappingCounter::bits(64);
        c.advance(5_000_000);
        assert_eq!(c.advance(5_000_100), Some(100));
        assert_eq!(c.advance(40), Some(40), "GPU reset: counting restarts");
    }

    #[test]
    fn reset_keeps_the_range() {
        let mut c = WrappingCounter::new(1000);
        c.advance(500);
        c.reset();
        assert_eq!(c.advance(990), None);
        assert_eq!(c.advance(10), Some(20));
    }
}
