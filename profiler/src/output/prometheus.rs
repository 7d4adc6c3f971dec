//! Prometheus metrics: a snapshot of a profile's sums, encoded through the
//! prometheus-client crate in the OpenMetrics text format, or in the
//! classic Prometheus text format (0.0.4) for scrapers that ask for it.
//!
//! Cardinality is bounded by design: per-domain, per-GPU, per-container
//! and per-cgroup series exist only for what ran within the grace period,
//! and per-process series only for the top N processes plus one `other`.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;

/// Labels of one series.
pub type Labels = Vec<(String, String)>;

/// A metric family: name (without `_total` for counters), help, series.
pub type Family = (&'static str, &'static str, Vec<(Labels, f64)>);

/// Everything one scrape shows, built by the sampling loop after each
/// interval (so a scrape never waits for, or slows, sampling).
#[derive(Clone, Debug, Default)]
pub struct Snapshot {
    /// Counters: (name without `_total`, help, series).
    pub counters: Vec<Family>,
    /// Gauges: (name, help, series).
    pub gauges: Vec<Family>,
}

impl Snapshot {
    /// Number of series.
    pub fn series(&self) -> usize {
        self.counters
            .iter()
            .chain(&self.gauges)
            .map(|(_, _, s)| s.len())
            .sum()
    }
}

#[derive(Debug)]
struct SnapshotCollector(Snapshot);

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (name, help, series) in &self.0.counters {
            if series.is_empty() {
                continue;
            }
            let proto = ConstCounter::new(0.0f64);
            let mut family = encoder.encode_descriptor(name, help, None, proto.metric_type())?;
            for (labels, v) in series {
                ConstCounter::new(*v).encode(family.encode_family(labels)?)?;
            }
        }
        for (name, help, series) in &self.0.gauges {
            if series.is_empty() {
                continue;
            }
            let proto = ConstGauge::new(0.0f64);
            let mut family = encoder.encode_descriptor(name, help, None, proto.metric_type())?;
            for (labels, v) in series {
                ConstGauge::new(*v).encode(family.encode_family(labels)?)?;
            }
        }
        Ok(())
    }
}

/// Snapshots in the OpenMetrics text format (ends with `# EOF`).
pub fn openmetrics(snapshots: &[&Snapshot]) -> String {
    let mut registry = Registry::default();
    for s in snapshots {
        registry.register_collector(Box::new(SnapshotCollector((*s).clone())));
    }
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
    out
}

/// OpenMetrics text turned into the classic Prometheus text format: no
/// `# EOF` and no `# UNIT`, and counter families named after their
/// `_total` samples.
pub fn classic_text(openmetrics: &str) -> String {
    let counters: std::collections::HashSet<&str> = openmetrics
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("# TYPE ")?;
            let (name, kind) = rest.split_once(' ')?;
            (kind == "counter").then_some(name)
        })
        .collect();
    let mut out = String::with_capacity(openmetrics.len());
    for line in openmetrics.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = line
            .strip_prefix("# TYPE ")
            .map(|r| ("# TYPE ", r))
            .or_else(|| line.strip_prefix("# HELP ").map(|r| ("# HELP ", r)));
        match meta {
            Some((prefix, rest)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                if counters.contains(name) {
                    out.push_str(&format!("{prefix}{name}_total {tail}\n"));
                } else {
                    out.push_str(line);
                    out.push('\n');
                }
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn l(pairs: &[(&str, &str)]) -> Labels {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
            .collect()
    }

    #[test]
    fn both_text_formats() {
        let snap = Snapshot {
            counters: vec![(
                "wattprof_energy_joules",
                "Measured energy.",
                vec![
                    (l(&[("domain", "package"), ("package", "0")]), 12.5),
                    (l(&[("domain", "dram"), ("package", "0")]), 1.25),
                ],
            )],
            gauges: vec![(
                "wattprof_process_power_watts",
                "Power.",
                vec![(l(&[("pid", "7"), ("comm", "a \"b\"")]), 3.0)],
            )],
        };
        assert_eq!(snap.series(), 3);
        let om = openmetrics(&[&snap]);
        assert!(om.contains("# TYPE wattprof_energy_joules counter"), "{om}");
        assert!(
            om.contains("wattprof_energy_joules_total{domain=\"package\",package=\"0\"} 12.5"),
            "{om}"
        );
        assert!(om.contains("comm=\"a \\\"b\\\"\""), "{om}");
        assert!(om.trim_end().ends_with("# EOF"), "{om}");
        let text = classic_text(&om);
        assert!(
            text.contains("# TYPE wattprof_energy_joules_total counter"),
            "{text}"
        );
        assert!(
            text.contains("# HELP wattprof_energy_joules_total Measured energy."),
            "{text}"
        );
        assert!(
            text.contains("# TYPE wattprof_process_power_watts gauge"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
    }
}
