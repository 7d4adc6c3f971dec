//! The records of the `--jsonl` stream (and of the recording's
//! `intervals`), typed: the stream, the live screen and the exporter read
//! fields, so a renamed field is a compile error, not a silent 0.

use serde::{Deserialize, Serialize};

use crate::attribution::{Basis, DomainUj};
use crate::sources::nvml::GpuProcess;
use crate::sources::static_power::StaticFigure;
use crate::sources::{Domain, DomainKey};
use crate::units::{joules, microjoules as uj, watts};

/// One interval: what was measured and how it was divided.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename = "interval")]
pub(crate) struct IntervalRecord {
    /// End of the interval, ns since the profile started.
    pub(crate) t_ns: u64,
    /// Its length (ns).
    pub(crate) duration_ns: u64,
    /// Busy CPU time over all CPUs (ns).
    pub(crate) busy_ns: u64,
    /// Per energy domain (and package or GPU).
    pub(crate) domains: Vec<DomainRow>,
    /// Per GPU.
    pub(crate) gpus: Vec<GpuRow>,
    /// The three groups every process belongs to.
    pub(crate) groups: GroupRows,
    /// The reported processes (`run`: the tree and wattprof; `monitor`:
    /// the top ones), omitted from a machine-only recording.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) processes: Option<Vec<ProcessRow>>,
}

impl IntervalRecord {
    /// The domains this interval has a reader for.
    pub(crate) fn read(&self) -> super::unread::Read {
        super::unread::Read::of(self.domains.iter().map(|d| d.domain))
    }

    /// The reported processes (none in a machine-only record).
    pub(crate) fn process_rows(&self) -> &[ProcessRow] {
        self.processes.as_deref().unwrap_or_default()
    }

    /// Length in seconds, never 0 (for rates).
    pub(crate) fn duration_s(&self) -> f64 {
        (self.duration_ns as f64 / 1e9).max(1e-9)
    }

    /// The same record with machine-level figures only: no processes, and
    /// no processes per GPU or MIG instance.
    pub(crate) fn machine_only(&self) -> Self {
        Self {
            domains: self.domains.clone(),
            gpus: self
                .gpus
                .iter()
                .map(|g| GpuRow {
                    processes: None,
                    // Each instance's energy is the machine's; who was in
                    // it is the processes'.
                    instances: g
                        .instances
                        .iter()
                        .map(|i| InstanceRow {
                            pids: Vec::new(),
                            ..i.clone()
                        })
                        .collect(),
                    ..g.clone()
                })
                .collect(),
            processes: None,
            ..*self
        }
    }
}

/// One energy domain's figures: over an interval ([`DomainRow`], with
/// its power) or over the whole profile (`model::DomainReport`, with the
/// average power).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct DomainOf<P> {
    /// Which domain.
    #[serde(with = "super::wire::via")]
    pub(crate) domain: Domain,
    /// Kernel package id, GPU index, or none (machine level).
    pub(crate) package: Option<u32>,
    /// Modelled rather than measured (for some interval at least).
    pub(crate) estimated: bool,
    /// How it was divided among processes.
    #[serde(with = "super::wire::via")]
    pub(crate) basis: Basis,
    /// Measured (J).
    pub(crate) measured_j: f64,
    /// Attributed to processes (J).
    pub(crate) attributed_j: f64,
    /// Share of idle CPU time, or GPU time no process held (J).
    pub(crate) idle_j: f64,
    /// Neither: lost time, unknown processes, machine-level domains (J).
    pub(crate) unattributed_j: f64,
    /// The domain's static energy (J): its static power × the time, cut
    /// to what was measured; a calibrated wall's `b` over the time. Absent
    /// when 0 (busy-only energy, GPUs).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) static_j: f64,
    /// The static part of `attributed_j` (J): the rent processes paid for
    /// the CPU time they held. Absent when 0.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub(crate) attributed_static_j: f64,
    /// The static power the domain was divided with (W): the last
    /// interval's, for a whole profile. Absent where none is used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) static_w: Option<f64>,
    /// Where `static_w` came from: `host_model`, `learned`,
    /// `shipped_model` or `lowest_seen` (an upper bound).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::wire::via"
    )]
    pub(crate) static_source: Option<crate::sources::static_power::StaticSource>,
    /// Its power.
    #[serde(flatten)]
    pub(crate) power: P,
}

/// For `skip_serializing_if`: a figure that is absent when 0.
pub(crate) fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// An interval's power (`power_w`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct IntervalPower {
    /// Measured over the interval (W), or over `covers_ns`.
    pub(crate) power_w: f64,
    /// The time this energy covers when it is longer than the interval
    /// (ns): the read of earlier intervals failed, and this one's covers
    /// them too (its energy is divided over that whole span).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) covers_ns: Option<u64>,
}

/// The whole profile's average power (`avg_power_w`).
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct AveragePower {
    /// Measured over the span (W).
    pub(crate) avg_power_w: f64,
}

/// One energy domain over an interval.
pub(crate) type DomainRow = DomainOf<IntervalPower>;

impl<P> DomainOf<P> {
    /// From µJ over `span_ns`, with the static figure it was divided with
    /// and the power `power` makes of the measured energy's average.
    pub(crate) fn from_uj(
        d: &DomainUj,
        figure: Option<StaticFigure>,
        span_ns: u64,
        power: impl Fn(f64) -> P,
    ) -> Self {
        Self {
            domain: d.key.domain,
            package: d.key.package,
            estimated: d.estimated,
            basis: d.basis,
            measured_j: joules(d.measured_uj),
            attributed_j: joules(d.attributed_uj),
            idle_j: joules(d.idle_uj),
            unattributed_j: joules(d.unattributed_uj),
            static_j: joules(d.static_uj),
            attributed_static_j: joules(d.attributed_static_uj),
            static_w: figure.map(|f| f.static_w),
            static_source: figure.map(|f| f.source),
            power: power(watts(d.measured_uj, span_ns)),
        }
    }

    /// Back to µJ (a recording's rows summed again by `report`).
    pub(crate) fn to_uj(&self) -> DomainUj {
        DomainUj {
            key: self.key(),
            estimated: self.estimated,
            basis: self.basis,
            measured_uj: uj(self.measured_j),
            attributed_uj: uj(self.attributed_j),
            idle_uj: uj(self.idle_j),
            unattributed_uj: uj(self.unattributed_j),
            static_uj: uj(self.static_j),
            attributed_static_uj: uj(self.attributed_static_j),
        }
    }

    /// The static figure it was divided with, if any (a recording keeps
    /// its power and source, not its fit).
    pub(crate) fn figure(&self) -> Option<StaticFigure> {
        Some(StaticFigure {
            domain: self.domain,
            package: self.package,
            static_w: self.static_w?,
            source: self.static_source?,
            per_cpu_w: None,
            r_squared: None,
        })
    }

    /// Which domain.
    pub(crate) fn key(&self) -> DomainKey {
        DomainKey::new(self.domain, self.package)
    }
}

/// One GPU over an interval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct GpuRow {
    /// NVML index.
    pub(crate) index: u32,
    /// Energy (J).
    pub(crate) energy_j: f64,
    /// Power draw at the read (W; absent when the read failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) power_w: Option<f64>,
    /// Utilization (%; absent when NVML gives none, e.g. with MIG on).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) util_pct: Option<u32>,
    /// Memory in use (bytes; absent when the read failed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) memory_used_bytes: Option<u64>,
    /// Where the processes' SM shares come from (absent before schema 3).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::wire::via"
    )]
    pub(crate) sm_basis: Option<crate::sources::nvml::SmBasis>,
    /// Its power with no context open (W), once learned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) idle_w: Option<f64>,
    /// The extra power of contexts held with no work (W), once learned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) held_w: Option<f64>,
    /// Processes using it (omitted from a machine-only recording).
    /// (`default`: a field written through `with` is otherwise required,
    /// where a plain `Option` reads as `None` when absent.)
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "super::wire::via"
    )]
    pub(crate) processes: Option<Vec<GpuProcess>>,
    /// MIG: each instance, its activity and processes, and the energy its
    /// processes were given (absent off MIG; schema 6).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub(crate) instances: Vec<InstanceRow>,
}

/// A MIG instance over an interval.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub(crate) struct InstanceRow {
    /// Its GPU instance.
    pub(crate) gpu_instance_id: u32,
    /// Its compute instance.
    pub(crate) compute_instance_id: u32,
    /// `MIG-...`.
    pub(crate) uuid: String,
    /// Compute slices.
    pub(crate) slices: u32,
    /// Streaming multiprocessors.
    pub(crate) sms: u32,
    /// GPM's SM utilization, percent of its SMs (absent without GPM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) sm_util_pct: Option<f64>,
    /// The processes NVML lists in it.
    pub(crate) pids: Vec<u32>,
    /// The GPU energy its processes were given (J): dynamic by the
    /// instance's weight, held power by holder.
    pub(crate) energy_j: f64,
}

/// The three groups of an interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct GroupRows {
    /// The command's process tree (`run`).
    pub(crate) tree: GroupRow,
    /// wattprof itself.
    pub(crate) profiler: GroupRow,
    /// Everything else.
    pub(crate) other: GroupRow,
}

/// One group over an interval.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct GroupRow {
    /// On-CPU time (ns).
    pub(crate) on_cpu_ns: u64,
    /// Energy, all domains (J).
    pub(crate) energy_j: f64,
    /// Package energy (J); absent from streams of wattprof 0.1 before
    /// these were added (read as 0).
    #[serde(default, skip_serializing_if = "super::unread::package")]
    pub(crate) package_j: f64,
    /// Core energy (J, part of package).
    #[serde(default, skip_serializing_if = "super::unread::core")]
    pub(crate) core_j: f64,
    /// DRAM energy (J).
    #[serde(default, skip_serializing_if = "super::unread::dram")]
    pub(crate) dram_j: f64,
    /// GPU energy (J).
    #[serde(default, skip_serializing_if = "super::unread::gpu")]
    pub(crate) gpu_j: f64,
    /// The static part of `energy_j` (J); 0 in streams before schema 3.
    #[serde(default)]
    pub(crate) static_j: f64,
}

/// The first line of a `--jsonl` stream: what the profile is, before any
/// interval.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "type", rename = "header")]
pub(crate) struct HeaderRecord {
    /// Layout version.
    pub(crate) schema_version: u32,
    /// wattprof's version.
    pub(crate) wattprof_version: String,
    /// `run` or `monitor`.
    pub(crate) mode: String,
    /// Which tracker measures on-CPU time.
    #[serde(with = "super::wire::via")]
    pub(crate) tracker: crate::tracker::TrackerKind,
    /// Wall-clock start, ns since the Unix epoch.
    pub(crate) start_unix_ns: u64,
    /// The machine.
    pub(crate) host: super::HostReport,
    /// The kernel's package id of each dense package index.
    pub(crate) package_ids: Vec<u32>,
    /// The readers in use, and the kinds of energy not measured and why.
    #[serde(with = "super::wire::via")]
    pub(crate) readers: Vec<crate::sources::registry::ReaderUse>,
    /// gCO2eq per kWh.
    pub(crate) carbon_intensity_g_per_kwh: f64,
    /// Where that figure comes from.
    pub(crate) carbon_intensity_source: String,
    /// The command (`run`); null in `monitor`.
    pub(crate) argv: Option<Vec<String>>,
    /// wattprof's own pid (its rows are in `run`'s intervals but not in
    /// the recording's processes); absent from older streams.
    #[serde(default)]
    pub(crate) profiler_pid: Option<u32>,
}

/// One process over an interval.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub(crate) struct ProcessRow {
    /// Process id.
    pub(crate) pid: u32,
    /// Its parent at fork, where known (absent in older streams).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) ppid: Option<u32>,
    /// Name.
    pub(crate) comm: String,
    /// On-CPU time (ns).
    pub(crate) on_cpu_ns: u64,
    /// Package energy (J).
    #[serde(default, skip_serializing_if = "super::unread::package")]
    pub(crate) package_j: f64,
    /// Core energy (J, part of package).
    #[serde(default, skip_serializing_if = "super::unread::core")]
    pub(crate) core_j: f64,
    /// DRAM energy (J).
    #[serde(default, skip_serializing_if = "super::unread::dram")]
    pub(crate) dram_j: f64,
    /// GPU energy (J).
    #[serde(default, skip_serializing_if = "super::unread::gpu")]
    pub(crate) gpu_j: f64,
    /// The static part of its energy (J); 0 in streams before schema 3.
    #[serde(default)]
    pub(crate) static_j: f64,
    /// Proportional set size at the last read (bytes).
    pub(crate) pss_bytes: Option<u64>,
    /// Unique set size at the last read (bytes).
    pub(crate) uss_bytes: Option<u64>,
    /// GPU memory (bytes).
    pub(crate) gpu_memory_bytes: u64,
    /// What only the live screen uses; never recorded (default when a row
    /// is read back).
    #[serde(skip)]
    pub(crate) live: LiveRow,
}

/// A process row's figures that `top` shows and the stream does not hold.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct LiveRow {
    /// The profile's id of this process: a pid reused by another process
    /// gets a new one (0: not known).
    pub(crate) id: u64,
    /// The static part of its package, DRAM and GPU energy (J).
    pub(crate) static_j: [f64; 3],
}

impl ProcessRow {
    /// package + DRAM + GPU energy (J): core is part of package.
    pub(crate) fn total_j(&self) -> f64 {
        self.package_j + self.dram_j + self.gpu_j
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_interval_serialises_with_its_type_and_a_machine_only_one_without_processes() {
        let rec = IntervalRecord {
            t_ns: 2,
            duration_ns: 1,
            processes: Some(vec![ProcessRow {
                pid: 7,
                ..ProcessRow::default()
            }]),
            gpus: vec![GpuRow {
                index: 0,
                energy_j: 1.0,
                power_w: Some(2.0),
                util_pct: Some(3),
                memory_used_bytes: Some(4),
                sm_basis: Some(crate::sources::nvml::SmBasis::Sampled),
                idle_w: None,
                held_w: None,
                processes: Some(Vec::new()),
                instances: Vec::new(),
            }],
            ..IntervalRecord::default()
        };
        let v = serde_json::to_value(&rec).expect("serialises");
        assert_eq!(v["type"], "interval");
        assert_eq!(v["processes"][0]["pid"], 7);
        assert!(v["processes"][0]["pss_bytes"].is_null());
        assert!(v["gpus"][0]["processes"].is_array());
        let m = serde_json::to_value(rec.machine_only()).expect("serialises");
        assert!(m.get("processes").is_none());
        assert!(m["gpus"][0].get("processes").is_none());
        assert_eq!(m["t_ns"], 2);
        // Both read back (a monitor recording on a GPU host is machine
        // only): no field is required that a machine-only record leaves out.
        for v in [v, m] {
            let back: IntervalRecord = serde_json::from_value(v).expect("reads back");
            assert_eq!(back.gpus[0].energy_j, 1.0);
        }
        assert_eq!(
            serde_json::from_value::<IntervalRecord>(
                serde_json::to_value(rec.machine_only()).expect("json")
            )
            .expect("reads back"),
            rec.machine_only()
        );
    }

    #[test]
    fn power_over_no_time_is_zero() {
        assert_eq!(watts(5_000_000, 0), 0.0);
        assert_eq!(watts(5_000_000, 500_000_000), 10.0);
        assert_eq!(joules(1_500_000), 1.5);
    }
}
