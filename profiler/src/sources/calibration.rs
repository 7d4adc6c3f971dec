//! Whole-node calibration against a wattmeter: the wall power as a linear
//! function of what the machine's counters measure (package + DRAM + GPU),
//! or of CPU utilization where there is no counter:
//! `wall = a × x + b`, fitted by least squares over a load staircase
//! (`wattprof calibrate`). `b` is the node's static power: what the wall
//! sees that no counter does (fans, disks, power supply losses, idle).

use serde::{Deserialize, Serialize};

/// What the wall power is fitted against.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Regressor {
    /// Watts measured by the counters: package + DRAM + GPU.
    CountersW,
    /// CPUs busy (utilization × CPUs), where no counter works.
    BusyCpus,
}

impl Regressor {
    /// For people.
    pub(crate) fn describe(self) -> &'static str {
        match self {
            Self::CountersW => "(package + DRAM + GPU watts)",
            Self::BusyCpus => "(busy CPUs)",
        }
    }
}

/// A calibration's wall power law over one interval: `wall = a × x + b`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct WallModel {
    /// The slope.
    pub(crate) a: f64,
    /// What `a` multiplies: the counters' energy, or busy CPU time.
    pub(crate) per: WallPer,
    /// `b` over the interval (µJ): the node's static energy.
    pub(crate) static_uj: u64,
}

/// What a calibration's slope multiplies.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum WallPer {
    /// Each consumer's package + DRAM + GPU energy (µJ per µJ).
    CounterEnergy,
    /// Each consumer's on-CPU time (µJ per µs, i.e. watts per busy CPU).
    BusyTime,
}

/// One point of the staircase: a window's mean regressor and wall power.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Point {
    /// The step: CPUs kept busy (`gpu` steps say so).
    pub(crate) step: String,
    /// Mean of the regressor over the window.
    pub(crate) x: f64,
    /// Mean wall power (W).
    pub(crate) wall_w: f64,
}

/// A least-squares line and how well it fits.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct Fit {
    /// Slope.
    pub(crate) a: f64,
    /// Intercept (W): the node's static power.
    pub(crate) b: f64,
    /// Root mean square of the residuals (W).
    pub(crate) rms_residual_w: f64,
    /// `rms_residual_w` over the mean wall power.
    pub(crate) relative_residual: f64,
    /// Coefficient of determination.
    pub(crate) r_squared: f64,
}

/// Why no line can be fitted.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FitError {
    /// Fewer than two points.
    #[error("{0} point(s): a line needs at least 2")]
    TooFew(usize),
    /// All points have the same regressor.
    #[error(
        "the load did not change what is fitted against (every point at the same value): no slope can be found"
    )]
    Flat,
    /// A NaN or infinity.
    #[error("a point is not a finite number")]
    NotFinite,
}

/// Least squares of `wall_w` on `x`.
pub(crate) fn fit(points: &[Point]) -> Result<Fit, FitError> {
    let n = points.len();
    if n < 2 {
        return Err(FitError::TooFew(n));
    }
    if points
        .iter()
        .any(|p| !(p.x.is_finite() && p.wall_w.is_finite()))
    {
        return Err(FitError::NotFinite);
    }
    let nf = n as f64;
    let mx = points.iter().map(|p| p.x).sum::<f64>() / nf;
    let my = points.iter().map(|p| p.wall_w).sum::<f64>() / nf;
    let sxx: f64 = points.iter().map(|p| (p.x - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.x - mx) * (p.wall_w - my)).sum();
    let syy: f64 = points.iter().map(|p| (p.wall_w - my).powi(2)).sum();
    if sxx <= f64::EPSILON * (1.0 + mx * mx) * nf {
        return Err(FitError::Flat);
    }
    let a = sxy / sxx;
    let b = my - a * mx;
    let sse: f64 = points
        .iter()
        .map(|p| (p.wall_w - (a * p.x + b)).powi(2))
        .sum();
    let rms = (sse / nf).sqrt();
    Ok(Fit {
        a,
        b,
        rms_residual_w: rms,
        relative_residual: if my.abs() > 0.0 { rms / my.abs() } else { 0.0 },
        r_squared: if syy > 0.0 { 1.0 - sse / syy } else { 1.0 },
    })
}

/// The calibration file `wattprof calibrate` writes.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Calibration {
    /// Always `wattprof_calibration`.
    #[serde(rename = "type")]
    pub(crate) kind: String,
    /// Format version (1).
    pub(crate) version: u32,
    /// Host it was made on.
    pub(crate) host: String,
    /// Online CPUs.
    pub(crate) cpus: usize,
    /// When (Unix ns).
    pub(crate) created_unix_ns: u64,
    /// What the wall power was fitted against.
    pub(crate) regressor: Regressor,
    /// The line.
    pub(crate) fit: Fit,
    /// The readers it used (counters, wattmeter).
    pub(crate) readers: Vec<String>,
    /// The staircase's points.
    pub(crate) points: Vec<Point>,
}

impl Calibration {
    /// Reads and checks a calibration file: one line saying what is wrong.
    pub(crate) fn load(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path)
            .map_err(|e| format!("cannot read --calibration {}: {e}", path.display()))?;
        let c: Self = serde_json::from_str(&text).map_err(|e| {
            format!(
                "--calibration {}: not a wattprof calibration file ({e}); make one with \
                 `wattprof calibrate`",
                path.display()
            )
        })?;
        if c.kind != "wattprof_calibration" || c.version != 1 {
            return Err(format!(
                "--calibration {}: type {:?} version {} is not a calibration this wattprof reads",
                path.display(),
                c.kind,
                c.version
            ));
        }
        if !(c.fit.a.is_finite() && c.fit.b.is_finite() && c.fit.a >= 0.0 && c.fit.b >= 0.0) {
            return Err(format!(
                "--calibration {}: the fit (a = {}, b = {} W) is not a wall power law \
                 (a and b must be finite and not negative); calibrate again",
                path.display(),
                c.fit.a,
                c.fit.b
            ));
        }
        Ok(c)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A deterministic noise in [-1, 1] (no RNG dependency).
    fn noise(i: usize) -> f64 {
        let x = (i as f64 * 12.9898).sin() * 43_758.545_3;
        (x - x.floor()) * 2.0 - 1.0
    }

    #[test]
    fn a_known_law_with_noise_is_recovered_within_one_percent() {
        // wall = 1.35 × RAPL + 48 W, ±2 W of noise, a staircase of 0 to 8
        // CPUs at 15 W each over 12 W idle, 10 points per step.
        let mut points = Vec::new();
        for cpus in 0..=8 {
            for k in 0..10 {
                let i = cpus * 10 + k;
                let rapl = 12.0 + 15.0 * cpus as f64 + 0.5 * noise(i + 1000);
                points.push(Point {
                    step: format!("{cpus} CPUs"),
                    x: rapl,
                    wall_w: 1.35 * rapl + 48.0 + 2.0 * noise(i),
                });
            }
        }
        let f = fit(&points).expect("fit");
        assert!((f.a / 1.35 - 1.0).abs() < 0.01, "{f:?}");
        assert!((f.b / 48.0 - 1.0).abs() < 0.01, "{f:?}");
        assert!(f.rms_residual_w < 2.0 && f.r_squared > 0.99, "{f:?}");
    }

    #[test]
    fn degenerate_staircases_are_refused() {
        let p = |x, w| Point {
            step: String::new(),
            x,
            wall_w: w,
        };
        assert_eq!(fit(&[p(1.0, 2.0)]), Err(FitError::TooFew(1)));
        assert_eq!(fit(&[p(1.0, 2.0), p(1.0, 3.0)]), Err(FitError::Flat));
        assert_eq!(
            fit(&[p(1.0, f64::NAN), p(2.0, 3.0)]),
            Err(FitError::NotFinite)
        );
        // Exact: zero residual.
        let f = fit(&[p(0.0, 50.0), p(10.0, 63.5), p(20.0, 77.0)]).expect("fit");
        assert!(
            (f.a - 1.35).abs() < 1e-12 && (f.b - 50.0).abs() < 1e-9,
            "{f:?}"
        );
        assert!(f.rms_residual_w < 1e-9);
    }

    #[test]
    fn bad_files_are_one_line_errors() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("c.json");
        for (text, want) in [
            ("{", "not a wattprof calibration file"),
            ("{\"type\":\"x\"}", "not a wattprof calibration file"),
        ] {
            std::fs::write(&path, text).expect("write");
            let err = Calibration::load(&path).expect_err("refused");
            assert!(err.contains(want) && !err.contains('\n'), "{err}");
        }
        let good = Calibration {
            kind: "wattprof_calibration".into(),
            version: 1,
            host: "h".into(),
            cpus: 2,
            created_unix_ns: 0,
            regressor: Regressor::CountersW,
            fit: Fit {
                a: -1.0,
                b: 40.0,
                rms_residual_w: 0.0,
                relative_residual: 0.0,
                r_squared: 1.0,
            },
            readers: Vec::new(),
            points: Vec::new(),
        };
        std::fs::write(&path, serde_json::to_string(&good).expect("json")).expect("write");
        let err = Calibration::load(&path).expect_err("negative slope");
        assert!(err.contains("not a wall power law"), "{err}");
        let err = Calibration::load(&dir.path().join("missing.json")).expect_err("missing");
        assert!(err.starts_with("cannot read --calibration"), "{err}");
    }
}
