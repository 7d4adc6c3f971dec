//! CO2 estimates: energy × the carbon intensity of the electricity.
//!
//! Per-country intensities come from a table shipped in the binary
//! (`data/carbon-intensity.tsv`, generated from codecarbon 3.3.2's
//! `global_energy_mix.json`, which compiles Our World in Data's electricity
//! data; each row carries its data year). The default, when neither a
//! country nor an intensity is given, is the world average codecarbon also
//! uses: 475 gCO2eq/kWh (IEA, Global Energy & CO2 Status Report 2019).

use serde::Serialize;

const TABLE: &str = include_str!("../data/carbon-intensity.tsv");

/// The world average used when nothing else is given (gCO2eq/kWh).
pub(crate) const WORLD_AVERAGE_G_PER_KWH: f64 = 475.0;

/// Joules in a kWh.
pub(crate) const J_PER_KWH: f64 = 3.6e6;

/// Grams of CO2eq for `joules` at `g_per_kwh`: the one conversion every
/// figure (recording, report, CSV) is made with.
pub(crate) fn grams(joules: f64, g_per_kwh: f64) -> f64 {
    joules / J_PER_KWH * g_per_kwh
}

/// A carbon intensity and where it comes from.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct CarbonIntensity {
    /// Grams of CO2 equivalent per kWh of electricity.
    pub(crate) g_per_kwh: f64,
    /// Where the figure comes from (for people).
    pub(crate) source: String,
}

/// A bad `--country` or `--carbon-intensity`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CarbonError {
    /// Not in the table.
    #[error(
        "--country {0}: not in wattprof's table (use an ISO 3166-1 alpha-3 code such as FRA, \
         USA, DEU; or give --carbon-intensity G_PER_KWH)"
    )]
    UnknownCountry(String),
    /// Out of range.
    #[error("--carbon-intensity {0}: not a plausible gCO2eq/kWh (use 0 to 2000)")]
    Implausible(String),
}

impl CarbonIntensity {
    /// The world average, with its source.
    pub(crate) fn world_average() -> Self {
        Self {
            g_per_kwh: WORLD_AVERAGE_G_PER_KWH,
            source: "default: world average (IEA Global Energy & CO2 Status Report 2019, as used \
                     by codecarbon); set --country or --carbon-intensity"
                .into(),
        }
    }

    /// A figure the user gave.
    pub(crate) fn given(g_per_kwh: f64) -> Result<Self, CarbonError> {
        if !(g_per_kwh.is_finite() && (0.0..=2000.0).contains(&g_per_kwh)) {
            return Err(CarbonError::Implausible(g_per_kwh.to_string()));
        }
        Ok(Self {
            g_per_kwh,
            source: "--carbon-intensity".into(),
        })
    }

    /// A country's figure from the shipped table (ISO 3166-1 alpha-3,
    /// any case).
    pub(crate) fn country(iso3: &str) -> Result<Self, CarbonError> {
        let code = iso3.trim().to_ascii_uppercase();
        TABLE
            .lines()
            .filter(|l| !l.starts_with('#'))
            .find_map(|l| {
                let mut f = l.split('\t');
                if f.next()? != code {
                    return None;
                }
                let g: f64 = f.next()?.parse().ok()?;
                let year = f.next()?;
                let name = f.next()?;
                Some(Self {
                    g_per_kwh: g,
                    source: format!(
                        "{name} ({code}), {year} electricity mix (Our World in Data via codecarbon)"
                    ),
                })
            })
            .ok_or(CarbonError::UnknownCountry(iso3.to_string()))
    }

    /// Chooses from the command line: an explicit intensity, a country,
    /// or the world average.
    pub(crate) fn choose(given: Option<f64>, country: Option<&str>) -> Result<Self, CarbonError> {
        match (given, country) {
            (Some(g), _) => Self::given(g),
            (None, Some(c)) => Self::country(c),
            (None, None) => Ok(Self::world_average()),
        }
    }

    /// Grams of CO2eq for `energy_uj` microjoules.
    pub(crate) fn grams(&self, energy_uj: u64) -> f64 {
        grams(energy_uj as f64 / 1e6, self.g_per_kwh)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn country_table_and_conversion() {
        let fr = CarbonIntensity::country("fra").expect("France is in the table");
        assert!((fr.g_per_kwh - 56.039).abs() < 1e-9, "{fr:?}");
        assert!(fr.source.contains("France"), "{}", fr.source);
        // 3.6 MJ = 1 kWh.
        assert!((fr.grams(3_600_000_000_000) - 56.039).abs() < 1e-9);
        assert_eq!(
            CarbonIntensity::country("XYZ"),
            Err(CarbonError::UnknownCountry("XYZ".into()))
        );
        assert!(CarbonIntensity::given(-1.0).is_err());
        assert!(CarbonIntensity::given(f64::NAN).is_err());
        let d = CarbonIntensity::choose(None, None).expect("default");
        assert_eq!(d.g_per_kwh, 475.0);
        assert!(d.source.starts_with("default"));
        assert_eq!(
            CarbonIntensity::choose(Some(100.0), Some("FRA"))
                .expect("given")
                .g_per_kwh,
            100.0
        );
        // Every row of the table parses.
        let rows = TABLE.lines().filter(|l| !l.starts_with('#')).count();
        let ok = TABLE
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter(|l| CarbonIntensity::country(&l[..3]).is_ok())
            .count();
        assert_eq!(rows, ok);
        assert!(rows > 200);
    }
}
