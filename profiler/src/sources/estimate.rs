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

use super::{Domain, DomainEnergy, Source, SourceError, SourceInfo};

/// CPU power from TDP and utilization.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TdpModel {
    /// Thermal design power of all the machine's CPU packages together (W).
    pub tdp_w: f64,
}

impl TdpModel {
    /// Estimated energy (µJ) of an interval in which tasks ran `busy_ns`
    /// nanoseconds in total on `cpus` CPUs.
    pub fn energy_uj(&self, busy_ns: u64, cpus: usize) -> u64 {
        if cpus == 0 {
            return 0;
        }
        // TDP × (busy / (cpus × interval)) × interval = TDP × busy / cpus.
        (self.tdp_w * busy_ns as f64 / cpus as f64 / 1e3).round() as u64
    }
}

/// Utilization from `/proc/stat`'s aggregate `cpu` line (ticks).
fn busy_and_total(stat: &str) -> Option<(u64, u64)> {
    let line = stat.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // user nice system idle iowait irq softirq steal [guest guest_nice]
    // (guest time is already inside user and nice).
    let total: u64 = v.iter().take(8).sum();
    let idle = v.get(3)? + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// The TDP model as a reader, with utilization from `/proc/stat` (for
/// `wattprof sources`; profiles use the tracker's exact busy time).
#[derive(Debug)]
pub struct TdpEstimate {
    model: TdpModel,
    stat_path: std::path::PathBuf,
    last: Option<(u64, u64, std::time::Instant)>,
}

impl TdpEstimate {
    /// An estimate for a machine whose CPUs together have `tdp_w` watts of
    /// TDP, reading utilization from `stat_path` (normally `/proc/stat`).
    pub fn new(tdp_w: f64, stat_path: impl Into<std::path::PathBuf>) -> Result<Self, SourceError> {
        if !(tdp_w.is_finite() && tdp_w > 0.0 && tdp_w < 100_000.0) {
            return Err(SourceError::Fatal(format!(
                "--cpu-tdp {tdp_w}: not a plausible TDP in watts"
            )));
        }
        Ok(Self {
            model: TdpModel { tdp_w },
            stat_path: stat_path.into(),
            last: None,
        })
    }

    /// The model.
    pub fn model(&self) -> TdpModel {
        self.model
    }
}

impl Source for TdpEstimate {
    fn name(&self) -> &'static str {
        "estimate"
    }

    fn info(&self) -> SourceInfo {
        SourceInfo {
            domains: vec![(Domain::Package, None)],
            resolution_uj: None,
            location: format!("TDP {} W x CPU utilization", self.model.tdp_w),
        }
    }

    fn read(&mut self) -> Result<Vec<DomainEnergy>, SourceError> {
        let stat = std::fs::read_to_string(&self.stat_path)
            .map_err(|e| SourceError::Retryable(format!("{}: {e}", self.stat_path.display())))?;
        let (busy, total) = busy_and_total(&stat).ok_or_else(|| {
            SourceError::Fatal(format!("{}: no cpu line", self.stat_path.display()))
        })?;
        let now = std::time::Instant::now();
        let energy = self.last.map(|(b0, t0, at)| {
            let util = (busy.saturating_sub(b0)) as f64 / (total.saturating_sub(t0)).max(1) as f64;
            (self.model.tdp_w * util * (now - at).as_secs_f64() * 1e6).round() as u64
        });
        self.last = Some((busy, total, now));
        Ok(energy
            .map(|energy_uj| DomainEnergy {
                domain: Domain::Package,
                package: None,
                energy_uj,
                estimated: true,
            })
            .into_iter()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_is_tdp_times_utilization() {
        let m = TdpModel { tdp_w: 120.0 };
        // 4 CPUs, 1 s interval, 2 CPU-seconds busy: 50% of 120 W for 1 s.
        assert_eq!(m.energy_uj(2_000_000_000, 4), 60_000_000);
        assert_eq!(m.energy_uj(0, 4), 0);
        assert_eq!(m.energy_uj(5, 0), 0);
    }

    #[test]
    fn proc_stat_utilization_and_marked_estimated() {
        let dir = tempfile::tempdir().expect("tempdir");
        let stat = dir.path().join("stat");
        std::fs::write(&stat, "cpu  100 0 100 700 100 0 0 0 0 0\ncpu0 1 2 3\n").expect("w");
        let mut est = TdpEstimate::new(100.0, &stat).expect("new");
        assert!(est.read().expect("first").is_empty());
        // +200 busy of +400 ticks: 50% utilization.
        std::fs::write(&stat, "cpu  200 0 200 800 200 0 0 0 0 0\n").expect("w");
        std::thread::sleep(std::time::Duration::from_millis(100));
        let r = est.read().expect("read");
        assert!(r[0].estimated);
        // 50 W for ~0.1 s.
        assert!(
            (4_500_000..7_000_000).contains(&r[0].energy_uj),
            "{}",
            r[0].energy_uj
        );
        assert_eq!(
            busy_and_total("cpu  1 2 3 4 5 6 7 8 9 10\n"),
            Some((27, 36))
        );
    }

    #[test]
    fn implausible_tdp_is_refused() {
        for bad in [0.0, -5.0, f64::NAN, 1e9] {
            assert!(TdpEstimate::new(bad, "/proc/stat").is_err(), "{bad}");
        }
    }
}
