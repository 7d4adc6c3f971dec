//! `monitor --prometheus`: the exporter's view of the profile, built at
//! most once a second and published for the exporter's thread to serve,
//! one family group at a time.

use std::sync::{Arc, Mutex};

use super::prometheus::{self as m, Labels, Snapshot};
use super::{Sink, Totals};
use crate::attribution::EnergyBy;
use crate::model::EnergyJ;
use crate::model::record::{HeaderRecord, IntervalRecord, ProcessRow};
use crate::process::Role;
use crate::sources::Domain;
use crate::sources::registry::ReaderUse;
use crate::units::joules;

/// The snapshot the exporter serves: a pointer swapped under a mutex held
/// for nanoseconds.
pub(crate) type Published = Arc<Mutex<Arc<Snapshot>>>;

/// How often the snapshot is rebuilt: scrapes are far apart, and it walks
/// every container and cgroup.
const EVERY_NS: u64 = 1_000_000_000;

/// The exporter's sink.
pub(crate) struct Exporter {
    published: Published,
    /// Processes exported one by one.
    top: usize,
    /// How long a container's or cgroup's series outlive its last run.
    grace_ns: u64,
    /// The readers in use (from the header).
    readers: Vec<ReaderUse>,
    /// When the snapshot was last built (monotonic ns of its interval).
    built_ns: Option<u64>,
}

impl Exporter {
    /// Publishes into `published`, with `top` processes one by one and
    /// series kept `grace_ns` after their last run.
    pub(crate) fn new(published: Published, top: usize, grace_ns: u64) -> Self {
        Self {
            published,
            top,
            grace_ns,
            readers: Vec::new(),
            built_ns: None,
        }
    }

    fn publish(&self, snapshot: Snapshot) {
        *self
            .published
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(snapshot);
    }
}

impl Sink for Exporter {
    fn header(&mut self, header: &HeaderRecord, totals: &Totals<'_>) {
        self.readers.clone_from(&header.readers);
        self.publish(snapshot(totals, None, &self.readers, self.top, 0));
    }

    fn interval(&mut self, record: &IntervalRecord, totals: &Totals<'_>) {
        let now = totals.last_ns;
        if self
            .built_ns
            .is_some_and(|t| now.saturating_sub(t) < EVERY_NS)
        {
            return;
        }
        self.built_ns = Some(now);
        self.publish(snapshot(
            totals,
            Some(record),
            &self.readers,
            self.top,
            self.grace_ns,
        ));
    }
}

/// Series of one family: labels and value.
type Series = Vec<(Labels, f64)>;

/// Labels from pairs.
fn l(pairs: &[(&str, String)]) -> Labels {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

/// The Prometheus view of the profile so far: counters per domain,
/// container, cgroup; CPU seconds; wattprof's own cost; the power of the
/// `last` interval's `top` processes and of all others together.
/// Containers and cgroups whose processes have not run for `grace_ns` are
/// left out (their series end).
pub(crate) fn snapshot(
    t: &Totals<'_>,
    last: Option<&IntervalRecord>,
    readers: &[ReaderUse],
    top: usize,
    grace_ns: u64,
) -> Snapshot {
    let since = t.last_ns.saturating_sub(grace_ns);
    let [measured, idle, static_energy, static_power, unattributed] = domain_series(t);
    let [c_energy, c_static, c_cpu, c_info] = container_series(t, since);
    let [g_energy, g_static, g_cpu] = cgroup_series(t, since);
    let [j_energy, j_static, j_cpu] = job_series(t, since);
    let (busy, idle_ns, lost) = t.sums.machine.totals();
    let cpu = [("busy", busy), ("idle", idle_ns), ("lost", lost)]
        .into_iter()
        .map(|(state, ns)| (l(&[("state", state.into())]), ns as f64 / 1e9))
        .collect();
    let me = EnergyJ::new(&t.sums.groups[Role::Profiler as usize], 0, t.carbon);
    let self_energy = me
        .by_domain(t.read())
        .map(|(d, v)| (l(&[("domain", d.into())]), v))
        .collect();
    let (power, gpu_power) = power_series(last, top);
    Snapshot {
        families: vec![
            (&m::ENERGY, measured),
            (&m::IDLE_ENERGY, idle),
            (&m::STATIC_ENERGY, static_energy),
            (&m::STATIC_POWER, static_power),
            (&m::UNATTRIBUTED_ENERGY, unattributed),
            (&m::CONTAINER_ENERGY, c_energy),
            (&m::CONTAINER_STATIC_ENERGY, c_static),
            (&m::CONTAINER_CPU, c_cpu),
            (&m::CGROUP_ENERGY, g_energy),
            (&m::CGROUP_STATIC_ENERGY, g_static),
            (&m::CGROUP_CPU, g_cpu),
            (&m::JOB_ENERGY, j_energy),
            (&m::JOB_STATIC_ENERGY, j_static),
            (&m::JOB_CPU, j_cpu),
            (&m::CPU, cpu),
            (&m::SELF_CPU, vec![(Vec::new(), t.profiler_ns as f64 / 1e9)]),
            (&m::SELF_ENERGY, self_energy),
            (&m::PROCESS_POWER, power),
            (&m::GPU_POWER, gpu_power),
            (&m::GPU_INSTANCE_ENERGY, mig_series(t)),
            (&m::CONTAINER_INFO, c_info),
            (&m::ENERGY_READER_INFO, reader_series(readers)),
        ],
    }
}

/// Per domain and package: measured, idle, static energy, static
/// power (with where its figure comes from), unattributed.
fn domain_series(t: &Totals<'_>) -> [Series; 5] {
    let pkg = |p: Option<u32>| p.map_or_else(|| "machine".to_string(), |p| p.to_string());
    let (mut measured, mut idle, mut unattributed) = (Vec::new(), Vec::new(), Vec::new());
    let (mut static_energy, mut static_power) = (Vec::new(), Vec::new());
    for d in t.sums.ledger.domains() {
        let labels = l(&[
            ("domain", d.key.domain.name().to_string()),
            ("package", pkg(d.key.package)),
        ]);
        measured.push((labels.clone(), joules(d.measured_uj)));
        idle.push((labels.clone(), joules(d.idle_uj)));
        if let Some(f) = t.figure(d.key.domain, d.key.package) {
            static_energy.push((labels.clone(), joules(d.static_uj)));
            let mut with_source = labels.clone();
            with_source.push(("source".into(), f.source.name().into()));
            static_power.push((with_source, f.static_w));
        }
        unattributed.push((labels, joules(d.unattributed_uj)));
    }
    [measured, idle, static_energy, static_power, unattributed]
}

/// Per container that ran since `since`: energy per domain, static
/// energy, CPU seconds, and its name on an info series.
fn container_series(t: &Totals<'_>, since: u64) -> [Series; 4] {
    let (mut c_energy, mut c_cpu, mut c_info) = (Vec::new(), Vec::new(), Vec::new());
    let mut c_static = Vec::new();
    let read = t.read();
    for c in t.container_reports(Some(since)) {
        // The name can arrive late or change (docker rename): it is on
        // an info series, never on the counters.
        let base = l(&[
            ("runtime", c.runtime.name().to_string()),
            ("container_id", c.id.clone()),
            ("pod_uid", c.pod_uid.clone().unwrap_or_default()),
            ("qos", c.qos.clone().unwrap_or_default()),
        ]);
        if let Some(name) = &c.name {
            c_info.push((
                l(&[
                    ("runtime", c.runtime.name().to_string()),
                    ("container_id", c.id.clone()),
                    ("container_name", name.clone()),
                ]),
                1.0,
            ));
        }
        c_cpu.push((base.clone(), c.on_cpu_ns as f64 / 1e9));
        c_static.push((base.clone(), c.energy.static_j));
        for (domain, v) in c.energy.by_domain(read) {
            let mut labels = base.clone();
            labels.push(("domain".into(), domain.into()));
            c_energy.push((labels, v));
        }
    }
    [c_energy, c_static, c_cpu, c_info]
}

/// Per batch job step that ran within the grace period: energy per
/// domain, static energy, CPU seconds; labelled `scheduler`, `job_id`,
/// `step` and `user` (the same on every node, so a job's energy over its
/// nodes is a `sum by (job_id)`).
fn job_series(t: &Totals<'_>, since: u64) -> [Series; 3] {
    let (mut energy, mut stat, mut cpu) = (Vec::new(), Vec::new(), Vec::new());
    let read = t.read();
    for j in t.job_reports(Some(since)) {
        for st in &j.steps {
            let base = l(&[
                ("scheduler", j.scheduler.clone()),
                ("job_id", j.job_id.clone()),
                ("step", st.step.clone()),
                ("user", j.user.clone().unwrap_or_default()),
            ]);
            cpu.push((base.clone(), st.on_cpu_ns as f64 / 1e9));
            stat.push((base.clone(), st.energy.static_j));
            for (domain, v) in st.energy.by_domain(read) {
                let mut labels = base.clone();
                labels.push(("domain".into(), domain.into()));
                energy.push((labels, v));
            }
        }
    }
    [energy, stat, cpu]
}

/// Per cgroup path that ran since `since`: energy per domain, static
/// energy, CPU seconds.
fn cgroup_series(t: &Totals<'_>, since: u64) -> [Series; 3] {
    let (mut g_energy, mut g_cpu, mut g_static) = (Vec::new(), Vec::new(), Vec::new());
    let read = t.read();
    // Per path: a restarted service or container gets a new cgroup
    // (a new id) at the same path, and its series must go on rising,
    // so every cgroup that ever had the path counts, for as long as
    // one of them ran within the grace period.
    let mut by_path: std::collections::BTreeMap<&str, (u64, EnergyBy, u64)> =
        std::collections::BTreeMap::new();
    for c in t.sums.cgroups.sums() {
        let Some(path) = c.name.as_deref() else {
            continue;
        };
        let e = by_path.entry(path).or_default();
        e.0 += c.on_cpu_ns;
        e.1.merge(&c.energy);
        e.2 = e.2.max(c.last_ns);
    }
    for (path, (ns, energy, last)) in by_path {
        if last < since {
            continue;
        }
        g_cpu.push((l(&[("cgroup", path.to_string())]), ns as f64 / 1e9));
        let e = EnergyJ::new(&energy, 0, t.carbon);
        g_static.push((l(&[("cgroup", path.to_string())]), e.static_j));
        for (domain, v) in e.by_domain(read) {
            g_energy.push((
                l(&[("cgroup", path.to_string()), ("domain", domain.into())]),
                v,
            ));
        }
    }
    [g_energy, g_static, g_cpu]
}

/// The last interval's power: its `top` processes by name, the rest
/// as one `other` series; and each GPU's power reading.
fn power_series(last: Option<&IntervalRecord>, top: usize) -> (Series, Series) {
    // Power of the last interval's processes: the top ones by name, the
    // rest as one `other` series.
    let mut power = Vec::new();
    let mut gpu_power = Vec::new();
    if let Some(iv) = last {
        let dur_s = iv.duration_s();
        let mut rows: Vec<(f64, &ProcessRow)> = iv
            .process_rows()
            .iter()
            .map(|p| (p.total_j() / dur_s, p))
            .collect();
        rows.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (w, p) in rows.iter().take(top) {
            power.push((
                l(&[("pid", p.pid.to_string()), ("comm", p.comm.clone())]),
                *w,
            ));
        }
        // Everything attributed in the interval that is not in the top.
        // Core energy is part of package energy: not added again.
        let attributed: f64 = iv
            .domains
            .iter()
            .filter(|d| matches!(d.domain, Domain::Package | Domain::Dram | Domain::Gpu))
            .map(|d| d.attributed_j)
            .sum::<f64>()
            / dur_s;
        let shown: f64 = power.iter().map(|(_, w)| w).sum();
        power.push((
            l(&[("pid", "other".into()), ("comm", "other".into())]),
            (attributed - shown).max(0.0),
        ));
        gpu_power = iv
            .gpus
            .iter()
            .filter_map(|g| Some((l(&[("gpu", g.index.to_string())]), g.power_w?)))
            .collect();
    }
    (power, gpu_power)
}

/// Each MIG instance's GPU energy so far.
fn mig_series(t: &Totals<'_>) -> Series {
    t.sums
        .mig
        .reports()
        .into_iter()
        .map(|i| {
            (
                l(&[
                    ("gpu", i.gpu.to_string()),
                    ("gpu_instance", i.gpu_instance_id.to_string()),
                    ("compute_instance", i.compute_instance_id.to_string()),
                    ("uuid", i.uuid),
                ]),
                i.energy_j,
            )
        })
        .collect()
}

/// The energy readers in use, as info series.
fn reader_series(readers: &[ReaderUse]) -> Series {
    readers
        .iter()
        .filter(|u| u.name != "none")
        .map(|u| {
            (
                l(&[
                    ("kind", u.kind.to_string()),
                    ("reader", u.name.to_string()),
                    ("model", u.model.clone().unwrap_or_default()),
                    ("estimated", u.estimated.to_string()),
                ]),
                1.0,
            )
        })
        .collect()
}
