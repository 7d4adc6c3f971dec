//! Units, converted in one place: energy counters count microjoules,
//! reports say joules and watts (CO2 is `carbon`'s).

/// Microjoules as joules.
pub(crate) fn joules(uj: u64) -> f64 {
    uj as f64 / 1e6
}

/// Average power of `uj` over `ns` (W); 0 over no time.
pub(crate) fn watts(uj: u64, ns: u64) -> f64 {
    joules_per_s(joules(uj), ns)
}

/// Average power of `j` joules over `ns` (W); 0 over no time.
pub(crate) fn joules_per_s(j: f64, ns: u64) -> f64 {
    if ns == 0 { 0.0 } else { j / (ns as f64 / 1e9) }
}

/// Joules read back from a record as the microjoules they were made from
/// (exact: a record's joules are µJ / 10^6; a damaged file's negative or
/// absurd figure is 0 or saturates).
pub(crate) fn microjoules(j: f64) -> u64 {
    (j * 1e6).round() as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn power_over_no_time_is_zero_and_joules_are_exact_microjoules() {
        assert_eq!(watts(5_000_000, 0), 0.0);
        assert_eq!(watts(5_000_000, 2_000_000_000), 2.5);
        assert_eq!(joules(1_234_567), 1.234567);
        // A record's joules go back to the same microjoules.
        for uj in [0, 1, 999_999, 123_456_789_012, 9_007_199_254] {
            assert_eq!(microjoules(joules(uj)), uj);
        }
        assert_eq!(microjoules(-3.0), 0);
        assert_eq!(microjoules(f64::NAN), 0);
        assert_eq!(microjoules(1e30), u64::MAX);
    }
}
