//! `report --metrics`: what a file holds, with AIPowerMeter's names for
//! the same figures (the mapping docs/recording.md explains).

use serde::Serialize;

use super::Loaded;
use crate::sources::Domain;

/// One figure the file holds.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Metric {
    /// Where it is in the file (the recording's JSON path).
    pub path: &'static str,
    /// Unit.
    pub unit: &'static str,
    /// What it is.
    pub meaning: &'static str,
    /// AIPowerMeter's name for it, where it has one.
    pub aipowermeter: Option<&'static str>,
    /// How much of it this file has ("812 intervals x 2 packages").
    pub present: String,
}

/// A metric's definition: how to count it in a file (`None`: absent).
type Count = fn(&Loaded) -> Option<String>;

fn domain_series(l: &Loaded, d: Domain) -> Option<String> {
    let packages = l.summary.domains.iter().filter(|x| x.domain == d).count();
    (packages > 0).then(|| {
        format!(
            "{} intervals x {packages} {}",
            l.intervals.len(),
            if d == Domain::Gpu {
                "GPU(s)"
            } else {
                "package(s)"
            }
        )
    })
}

fn process_rows(l: &Loaded, has: fn(&crate::model::record::ProcessRow) -> bool) -> Option<String> {
    let rows: usize = l
        .intervals
        .iter()
        .map(|i| i.process_rows().iter().filter(|p| has(p)).count())
        .sum();
    (rows > 0).then(|| format!("{rows} process rows in {} intervals", l.intervals.len()))
}

const METRICS: &[(&str, &str, &str, Option<&str>, Count)] = &[
    (
        "intervals[].domains[domain=package].power_w",
        "W",
        "CPU package power per interval",
        Some("intel_power"),
        |l| domain_series(l, Domain::Package),
    ),
    (
        "intervals[].domains[domain=core].power_w",
        "W",
        "RAPL PP0 (cores) power",
        Some("total_cpu_power"),
        |l| domain_series(l, Domain::Core),
    ),
    (
        "intervals[].domains[domain=uncore].power_w",
        "W",
        "RAPL PP1 (uncore, integrated GPU) power",
        Some("uncore_power"),
        |l| domain_series(l, Domain::Uncore),
    ),
    (
        "intervals[].domains[domain=psys].power_w",
        "W",
        "RAPL platform (psys) power",
        Some("psys_power"),
        |l| domain_series(l, Domain::Psys),
    ),
    (
        "intervals[].domains[domain=dram].power_w",
        "W",
        "DRAM power",
        None,
        |l| domain_series(l, Domain::Dram),
    ),
    (
        "intervals[].domains[domain=wall].power_w",
        "W",
        "wattmeter (wall) power",
        None,
        |l| domain_series(l, Domain::Wall),
    ),
    (
        "intervals[].gpus[].power_w",
        "W",
        "GPU power draw (sum over GPUs: AIPowerMeter's nvidia_draw_absolute)",
        Some("per_gpu_power_draw"),
        |l| {
            let rows: usize = l.intervals.iter().map(|i| i.gpus.len()).sum();
            (rows > 0).then(|| format!("{rows} GPU rows"))
        },
    ),
    (
        "intervals[].domains[domain=gpu].attributed_j / duration",
        "W",
        "GPU power attributed to processes, per GPU",
        Some("per_gpu_attributable_power"),
        |l| domain_series(l, Domain::Gpu),
    ),
    (
        "intervals[].processes[].package_j / duration",
        "W",
        "CPU package power per process",
        Some("per_process_cpu_power"),
        |l| process_rows(l, |_| true),
    ),
    (
        "intervals[].processes[].dram_j / duration",
        "W",
        "DRAM power per process",
        Some("per_process_dram_power"),
        |l| process_rows(l, |p| p.dram_j > 0.0),
    ),
    (
        "intervals[].processes[].gpu_j / duration",
        "W",
        "GPU power per process (summed over the tree: nvidia_attributable_power)",
        Some("nvidia_attributable_power"),
        |l| process_rows(l, |p| p.gpu_j > 0.0),
    ),
    (
        "intervals[].processes[].pss_bytes",
        "bytes",
        "proportional set size per process",
        Some("per_process_mem_use_abs"),
        |l| process_rows(l, |p| p.pss_bytes.is_some()),
    ),
    (
        "intervals[].processes[].uss_bytes",
        "bytes",
        "unique set size per process",
        Some("per_process_mem_use_uss"),
        |l| process_rows(l, |p| p.uss_bytes.is_some()),
    ),
    (
        "intervals[].groups.{tree,profiler,other}",
        "ns, J",
        "on-CPU time and energy of the command tree, wattprof, the rest",
        None,
        |l| (!l.intervals.is_empty()).then(|| format!("{} intervals", l.intervals.len())),
    ),
    (
        "processes[]",
        "ns, J, bytes",
        "per process over the profile: on-CPU time, energy, peak memory",
        None,
        |l| {
            let n = l.summary.processes.len();
            (n > 0).then(|| format!("{n} processes"))
        },
    ),
    (
        "containers[]",
        "ns, J",
        "per container and systemd unit over the profile",
        None,
        |l| {
            let n = l.summary.containers.len();
            (n > 0).then(|| format!("{n} containers or units"))
        },
    ),
    (
        "jobs[]",
        "ns, J",
        "per batch job (Slurm) and its steps over the profile",
        None,
        |l| {
            let n = l.summary.jobs.len();
            (n > 0).then(|| format!("{n} batch jobs"))
        },
    ),
    (
        "windows[]",
        "ns, J",
        "profiling windows: length, on-CPU time, energy of the tree and the machine",
        None,
        |l| {
            let n = l.summary.windows.len();
            (n > 0).then(|| format!("{n} windows"))
        },
    ),
];

/// What `l` holds, in the order of [`METRICS`]; figures it lacks are left
/// out.
pub fn list(l: &Loaded) -> Vec<Metric> {
    METRICS
        .iter()
        .filter_map(|&(path, unit, meaning, aipowermeter, count)| {
            count(l).map(|present| Metric {
                path,
                unit,
                meaning,
                aipowermeter,
                present,
            })
        })
        .collect()
}
