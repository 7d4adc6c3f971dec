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
use prometheus_client::registry::{Registry, Unit as PromUnit};

/// Labels of one series.
pub(crate) type Labels = Vec<(String, String)>;

/// Counter or gauge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Only rises (exposed with `_total`).
    Counter,
    /// Goes up and down.
    Gauge,
}

/// The unit a metric's name ends in (`# UNIT` in OpenMetrics).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Unit {
    /// J.
    Joules,
    /// s.
    Seconds,
    /// W.
    Watts,
}

/// One metric: its name, kind, unit and help, declared together.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Metric {
    /// Name without its unit and without `_total`.
    pub(crate) name: &'static str,
    /// Counter or gauge.
    pub(crate) kind: Kind,
    /// Unit, if it has one.
    pub(crate) unit: Option<Unit>,
    /// One line for people.
    pub(crate) help: &'static str,
}

impl Metric {
    /// The name series carry (without a counter's `_total`).
    #[cfg(test)]
    pub(crate) fn full_name(&self) -> String {
        match self.unit {
            Some(u) => format!("{}_{}", self.name, unit_name(u)),
            None => self.name.to_string(),
        }
    }
}

fn unit_name(u: Unit) -> &'static str {
    match u {
        Unit::Joules => "joules",
        Unit::Seconds => "seconds",
        Unit::Watts => "watts",
    }
}

const fn counter(name: &'static str, unit: Unit, help: &'static str) -> Metric {
    Metric {
        name,
        kind: Kind::Counter,
        unit: Some(unit),
        help,
    }
}

const fn gauge(name: &'static str, unit: Option<Unit>, help: &'static str) -> Metric {
    Metric {
        name,
        kind: Kind::Gauge,
        unit,
        help,
    }
}

/// Energy measured, per domain and package.
pub(crate) const ENERGY: Metric = counter(
    "wattprof_energy",
    Unit::Joules,
    "Energy measured, per domain and package (or GPU index).",
);
/// Idle share of the measured energy.
pub(crate) const IDLE_ENERGY: Metric = counter(
    "wattprof_idle_energy",
    Unit::Joules,
    "Share of the measured energy that went to idle CPU time (or a GPU nobody held).",
);
/// The static part of the measured energy.
pub(crate) const STATIC_ENERGY: Metric = counter(
    "wattprof_static_energy",
    Unit::Joules,
    "Static part of the measured energy (static power x time), per divided domain and package.",
);
/// The static power in use.
pub(crate) const STATIC_POWER: Metric = gauge(
    "wattprof_static_power",
    Some(Unit::Watts),
    "Static power a divided domain is split with, and where it came from (host_model, learned, shipped_model, lowest_seen: an upper bound).",
);
/// Per container, the static part.
pub(crate) const CONTAINER_STATIC_ENERGY: Metric = counter(
    "wattprof_container_static_energy",
    Unit::Joules,
    "Static part of a container's energy: static power x its share of the CPUs' time (--static-power).",
);
/// Per cgroup, the static part.
pub(crate) const CGROUP_STATIC_ENERGY: Metric = counter(
    "wattprof_cgroup_static_energy",
    Unit::Joules,
    "Static part of a cgroup's energy: static power x its share of the CPUs' time (--static-power).",
);
/// Neither attributed nor idle.
pub(crate) const UNATTRIBUTED_ENERGY: Metric = counter(
    "wattprof_unattributed_energy",
    Unit::Joules,
    "Measured energy neither attributed nor idle (lost time, unknown processes, machine-level domains).",
);
/// Per container.
pub(crate) const CONTAINER_ENERGY: Metric = counter(
    "wattprof_container_energy",
    Unit::Joules,
    "Energy attributed to a container's (or systemd unit's) processes.",
);
/// Per batch job step.
pub(crate) const JOB_ENERGY: Metric = counter(
    "wattprof_job_energy",
    Unit::Joules,
    "Energy attributed to a batch job step's processes (sum by job_id over the nodes for a job's).",
);
/// Per batch job step, the static part.
pub(crate) const JOB_STATIC_ENERGY: Metric = counter(
    "wattprof_job_static_energy",
    Unit::Joules,
    "Static part of a batch job step's energy: static power x its share of the CPUs' time.",
);
/// Per batch job step.
pub(crate) const JOB_CPU: Metric = counter(
    "wattprof_job_cpu",
    Unit::Seconds,
    "On-CPU time of a batch job step's processes.",
);
/// Per container.
pub(crate) const CONTAINER_CPU: Metric = counter(
    "wattprof_container_cpu",
    Unit::Seconds,
    "On-CPU time of a container's (or systemd unit's) processes.",
);
/// Per cgroup.
pub(crate) const CGROUP_ENERGY: Metric = counter(
    "wattprof_cgroup_energy",
    Unit::Joules,
    "Energy attributed to a cgroup's processes.",
);
/// Per cgroup.
pub(crate) const CGROUP_CPU: Metric = counter(
    "wattprof_cgroup_cpu",
    Unit::Seconds,
    "On-CPU time of a cgroup's processes.",
);
/// Per CPU state.
pub(crate) const CPU: Metric = counter(
    "wattprof_cpu",
    Unit::Seconds,
    "CPU time of all CPUs: busy (tasks), idle, lost (not recorded per task).",
);
/// wattprof's own time.
pub(crate) const SELF_CPU: Metric = counter(
    "wattprof_self_cpu",
    Unit::Seconds,
    "wattprof's own on-CPU time.",
);
/// wattprof's own energy.
pub(crate) const SELF_ENERGY: Metric = counter(
    "wattprof_self_energy",
    Unit::Joules,
    "Energy attributed to wattprof itself.",
);
/// The exporter's answers.
pub(crate) const EXPORTER_SCRAPES: Metric = Metric {
    name: "wattprof_exporter_scrapes",
    kind: Kind::Counter,
    unit: None,
    help: "Answers to /metrics served.",
};
/// The exporter's own CPU.
pub(crate) const EXPORTER_CPU: Metric = counter(
    "wattprof_exporter_cpu",
    Unit::Seconds,
    "CPU time of the exporter: its thread (connections, TLS, requests, answers) and its password checks.",
);
/// Top processes' power.
pub(crate) const PROCESS_POWER: Metric = gauge(
    "wattprof_process_power",
    Some(Unit::Watts),
    "Power of the top processes over the last interval (package + DRAM + GPU), and of all others as pid=\"other\".",
);
/// Each MIG instance's GPU energy.
pub(crate) const GPU_INSTANCE_ENERGY: Metric = counter(
    "wattprof_gpu_instance_energy",
    Unit::Joules,
    "GPU energy given to the processes of each MIG instance (by the instance's busy SMs from GPM, else its compute slices; equally within it).",
);
/// GPU power.
pub(crate) const GPU_POWER: Metric = gauge(
    "wattprof_gpu_power",
    Some(Unit::Watts),
    "GPU power draw as NVML reports it.",
);
/// Container names.
pub(crate) const CONTAINER_INFO: Metric = gauge(
    "wattprof_container_info",
    None,
    "A container's name (Docker), 1 while its series are exported.",
);
/// The energy readers in use.
pub(crate) const ENERGY_READER_INFO: Metric = gauge(
    "wattprof_energy_reader_info",
    None,
    "An energy reader in use, 1: its kind (cpu, gpu, wall), name, power model (tdp, vcpu) and whether its energy is estimated.",
);

/// Every metric wattprof exports, in exposition order.
#[cfg(test)]
pub(crate) const ALL: [&Metric; 20] = [
    &ENERGY,
    &IDLE_ENERGY,
    &UNATTRIBUTED_ENERGY,
    &CONTAINER_ENERGY,
    &CONTAINER_CPU,
    &CGROUP_ENERGY,
    &CGROUP_CPU,
    &JOB_ENERGY,
    &JOB_STATIC_ENERGY,
    &JOB_CPU,
    &CPU,
    &SELF_CPU,
    &SELF_ENERGY,
    &EXPORTER_SCRAPES,
    &EXPORTER_CPU,
    &PROCESS_POWER,
    &GPU_POWER,
    &GPU_INSTANCE_ENERGY,
    &CONTAINER_INFO,
    &ENERGY_READER_INFO,
];

/// A metric and its series.
pub(crate) type Family = (&'static Metric, Vec<(Labels, f64)>);

/// Everything one scrape shows, built by the sampling loop after each
/// interval (so a scrape never waits for, or slows, sampling).
#[derive(Clone, Debug, Default)]
pub(crate) struct Snapshot {
    /// Families, in exposition order.
    pub(crate) families: Vec<Family>,
}

impl Snapshot {
    /// Number of series.
    #[cfg(test)]
    pub(crate) fn series(&self) -> usize {
        self.families.iter().map(|(_, s)| s.len()).sum()
    }
}

#[derive(Debug)]
struct SnapshotCollector(Snapshot);

impl Collector for SnapshotCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for (metric, series) in &self.0.families {
            if series.is_empty() {
                continue;
            }
            let unit = metric.unit.map(|u| match u {
                Unit::Joules => PromUnit::Joules,
                Unit::Seconds => PromUnit::Seconds,
                Unit::Watts => PromUnit::Other(unit_name(u).to_string()),
            });
            let kind = match metric.kind {
                Kind::Counter => ConstCounter::new(0.0f64).metric_type(),
                Kind::Gauge => ConstGauge::new(0.0f64).metric_type(),
            };
            let mut family =
                encoder.encode_descriptor(metric.name, metric.help, unit.as_ref(), kind)?;
            for (labels, v) in series {
                let out = family.encode_family(labels)?;
                match metric.kind {
                    Kind::Counter => ConstCounter::new(*v).encode(out)?,
                    Kind::Gauge => ConstGauge::new(*v).encode(out)?,
                }
            }
        }
        Ok(())
    }
}

/// Snapshots in the OpenMetrics text format (ends with `# EOF`).
pub(crate) fn openmetrics(snapshots: &[&Snapshot]) -> String {
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
pub(crate) fn classic_text(openmetrics: &str) -> String {
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
            families: vec![
                (
                    &ENERGY,
                    vec![
                        (l(&[("domain", "package"), ("package", "0")]), 12.5),
                        (l(&[("domain", "dram"), ("package", "0")]), 1.25),
                    ],
                ),
                (
                    &PROCESS_POWER,
                    vec![(l(&[("pid", "7"), ("comm", "a \"b\"")]), 3.0)],
                ),
            ],
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
            text.contains("# HELP wattprof_energy_joules_total Energy measured"),
            "{text}"
        );
        assert!(
            text.contains("# TYPE wattprof_process_power_watts gauge"),
            "{text}"
        );
        assert!(!text.contains("# EOF"));
        assert!(!text.contains("# UNIT"));
        assert!(
            om.contains("# UNIT wattprof_process_power_watts watts"),
            "{om}"
        );
    }

    #[test]
    fn the_exposed_names_are_the_documented_ones() {
        // What dashboards and alerts query (README, deploy/): renaming a
        // constant must fail here.
        let counters = [
            "wattprof_energy_joules_total",
            "wattprof_idle_energy_joules_total",
            "wattprof_unattributed_energy_joules_total",
            "wattprof_container_energy_joules_total",
            "wattprof_container_cpu_seconds_total",
            "wattprof_cgroup_energy_joules_total",
            "wattprof_cgroup_cpu_seconds_total",
            "wattprof_job_energy_joules_total",
            "wattprof_job_static_energy_joules_total",
            "wattprof_job_cpu_seconds_total",
            "wattprof_cpu_seconds_total",
            "wattprof_self_cpu_seconds_total",
            "wattprof_self_energy_joules_total",
            "wattprof_exporter_scrapes_total",
            "wattprof_exporter_cpu_seconds_total",
            "wattprof_gpu_instance_energy_joules_total",
        ];
        let gauges = [
            "wattprof_process_power_watts",
            "wattprof_gpu_power_watts",
            "wattprof_container_info",
            "wattprof_energy_reader_info",
        ];
        let snap = Snapshot {
            families: ALL
                .iter()
                .map(|m| (*m, vec![(l(&[("k", "v")]), 1.0)]))
                .collect(),
        };
        let text = classic_text(&openmetrics(&[&snap]));
        let mut exposed: Vec<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split('{').next())
            .collect();
        exposed.sort_unstable();
        let mut want: Vec<&str> = counters.iter().chain(&gauges).copied().collect();
        want.sort_unstable();
        assert_eq!(exposed, want, "{text}");
    }

    #[test]
    fn every_metric_name_is_unique_and_ends_in_its_unit() {
        let names: std::collections::HashSet<String> = ALL.iter().map(|m| m.full_name()).collect();
        assert_eq!(names.len(), ALL.len());
        for m in ALL {
            assert!(m.full_name().starts_with("wattprof_"), "{m:?}");
            if let Some(u) = m.unit {
                assert!(m.full_name().ends_with(unit_name(u)), "{m:?}");
            }
            assert!(!m.help.is_empty(), "{m:?}");
        }
    }
}
