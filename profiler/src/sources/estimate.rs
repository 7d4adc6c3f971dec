//! An estimate of CPU energy for machines without an energy counter (most
//! VMs and clouds), from the CPU's TDP and its measured utilization.
//!
//! Model: `P = TDP × u`, where `u` is the fraction of all CPUs' time spent
//! running tasks over the interval. This is codecarbon's "CPU load × TDP"
//! mode (its maintainers describe a constant 50%-of-TDP fallback when the
//! load is unknown; PowerAPI's procfs-cpu-simple module uses the same form
//! with a 0.7 factor). It ignores idle power, so it underestimates a lightly
//! loaded machine, and TDP is a thermal rating, not a measurement: every
//! figure from it is marked `estimated` and never mixed with measured
//! energy without saying so.
//!
//! It is a model, not a reader: it reads nothing, and its utilization is
//! the tracker's exact busy time (`Readers::add_estimate`), which no
//! `/proc/stat` reading could match.

use super::{Domain, SourceError, SourceInfo};

/// CPU power from TDP and utilization.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TdpModel {
    /// Thermal design power of all the machine's CPU packages together (W).
    pub tdp_w: f64,
}

impl TdpModel {
    /// The model for CPUs with `tdp_w` watts of TDP together; refuses a
    /// figure that is no TDP in watts.
    pub fn new(tdp_w: f64) -> Result<Self, SourceError> {
        if !(tdp_w.is_finite() && tdp_w > 0.0 && tdp_w < 100_000.0) {
            return Err(SourceError::Fatal(format!(
                "--cpu-tdp {tdp_w}: not a plausible TDP in watts"
            )));
        }
        Ok(Self { tdp_w })
    }

    /// Estimated energy (µJ) of an interval in which tasks ran `busy_ns`
    /// nanoseconds in total on `cpus` CPUs.
    pub fn energy_uj(&self, busy_ns: u64, cpus: usize) -> u64 {
        if cpus == 0 {
            return 0;
        }
        // TDP × (busy / (cpus × interval)) × interval = TDP × busy / cpus.
        (self.tdp_w * busy_ns as f64 / cpus as f64 / 1e3).round() as u64
    }

    /// What it gives, for `wattprof sources`.
    pub fn info(&self) -> SourceInfo {
        SourceInfo {
            domains: vec![(Domain::Package, None)],
            resolution_uj: None,
            location: format!("TDP {} W x CPU utilization", self.tdp_w),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_is_tdp_times_utilization() {
        let m = TdpModel::new(120.0).expect("tdp");
        // 4 CPUs, 1 s interval, 2 CPU-seconds busy: 50% of 120 W for 1 s.
        assert_eq!(m.energy_uj(2_000_000_000, 4), 60_000_000);
        assert_eq!(m.energy_uj(0, 4), 0);
        assert_eq!(m.energy_uj(5, 0), 0);
        assert_eq!(m.info().domains, vec![(Domain::Package, None)]);
    }

    #[test]
    fn implausible_tdp_is_refused() {
        for bad in [0.0, -5.0, f64::NAN, 1e9] {
            assert!(TdpModel::new(bad).is_err(), "{bad}");
        }
    }
}
