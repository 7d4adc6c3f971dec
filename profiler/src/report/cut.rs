//! A stream cut short, summed from its intervals: the figures a
//! recording's summary holds, as far as interval records carry them.

use std::collections::BTreeMap;

use crate::model::record::{AveragePower, DomainOf, HeaderRecord, IntervalRecord, joules_per_s};
use crate::model::{EnergyJ, MemoryReport, ProcessReport};
use crate::process::GroupTotals;

/// Per domain and package, in the order they first appear.
pub(super) fn domains(intervals: &[IntervalRecord], span_ns: u64) -> Vec<DomainOf<AveragePower>> {
    let mut domains: Vec<DomainOf<AveragePower>> = Vec::new();
    for iv in intervals {
        for d in &iv.domains {
            let at = match domains
                .iter()
                .position(|x| x.domain == d.domain && x.package == d.package)
            {
                Some(at) => at,
                None => {
                    domains.push(DomainOf {
                        domain: d.domain,
                        package: d.package,
                        estimated: false,
                        basis: d.basis,
                        measured_j: 0.0,
                        attributed_j: 0.0,
                        idle_j: 0.0,
                        unattributed_j: 0.0,
                        static_j: 0.0,
                        attributed_static_j: 0.0,
                        static_w: None,
                        static_source: None,
                        power: AveragePower { avg_power_w: 0.0 },
                    });
                    domains.len() - 1
                }
            };
            let x = &mut domains[at];
            x.estimated |= d.estimated;
            x.measured_j += d.measured_j;
            x.attributed_j += d.attributed_j;
            x.idle_j += d.idle_j;
            x.unattributed_j += d.unattributed_j;
            x.static_j += d.static_j;
            x.attributed_static_j += d.attributed_static_j;
            // The last interval's figure, as a recording reports it.
            if d.static_w.is_some() {
                x.static_w = d.static_w;
                x.static_source = d.static_source;
            }
        }
    }
    for d in &mut domains {
        d.power.avg_power_w = joules_per_s(d.measured_j, span_ns);
    }
    domains
}

/// Each group's CPU time; its package, core, DRAM, GPU, total and static
/// joules; and all CPUs' busy time.
pub(super) fn groups(intervals: &[IntervalRecord]) -> (GroupTotals, [[f64; 6]; 3], u64) {
    let mut group_times = GroupTotals::default();
    // package, core, DRAM, GPU, total, static (J) per group.
    let mut sums = [[0.0f64; 6]; 3];
    let mut busy_ns = 0;
    for iv in intervals {
        // Saturating: a damaged file must not overflow the sums.
        busy_ns = iv.busy_ns.saturating_add(busy_ns);
        let gr = &iv.groups;
        let t = &mut group_times;
        t.tree_ns = t.tree_ns.saturating_add(gr.tree.on_cpu_ns);
        t.profiler_ns = t.profiler_ns.saturating_add(gr.profiler.on_cpu_ns);
        t.other_ns = t.other_ns.saturating_add(gr.other.on_cpu_ns);
        for (acc, row) in sums.iter_mut().zip([gr.tree, gr.profiler, gr.other]) {
            for (a, v) in acc.iter_mut().zip([
                row.package_j,
                row.core_j,
                row.dram_j,
                row.gpu_j,
                row.energy_j,
                row.static_j,
            ]) {
                *a += v;
            }
        }
    }
    (group_times, sums, busy_ns)
}

/// A group's figures from its sums (`groups`).
pub(super) fn group_energy(x: [f64; 6], span_ns: u64, g: f64) -> EnergyJ {
    let mut e = EnergyJ::of_joules(x[0], x[1], x[2], x[3], x[5], span_ns, g);
    // Streams from before the per-domain group fields have only the
    // total.
    if x[4] > 0.0 && e.total_j == 0.0 {
        e.total_j = x[4];
        e.avg_power_w = joules_per_s(x[4], span_ns);
        e.co2_g = crate::carbon::grams(x[4], g);
    }
    e
}

/// Each process's rows summed (all but `own`, wattprof itself in `run`),
/// its power over the intervals it was seen in; most energy first.
pub(super) fn processes(
    intervals: &[IntervalRecord],
    own: Option<u32>,
    g: f64,
) -> Vec<ProcessReport> {
    // Per pid: the row summed, and the first and last ns it was seen.
    let mut by_pid: BTreeMap<u32, (ProcessReport, u64, u64)> = BTreeMap::new();
    for iv in intervals {
        let begin = iv.t_ns.saturating_sub(iv.duration_ns);
        for p in iv.process_rows().iter().filter(|p| Some(p.pid) != own) {
            let e = by_pid.entry(p.pid).or_insert_with(|| {
                (
                    ProcessReport {
                        pid: p.pid,
                        ppid: None,
                        comm: p.comm.clone(),
                        on_cpu_ns: 0,
                        on_cpu_ns_per_package: Vec::new(),
                        start_ns: None,
                        exit_ns: None,
                        energy: EnergyJ::default(),
                        memory: MemoryReport::default(),
                        cgroup: None,
                    },
                    begin,
                    iv.t_ns,
                )
            });
            let r = &mut e.0;
            r.comm.clone_from(&p.comm);
            r.on_cpu_ns = r.on_cpu_ns.saturating_add(p.on_cpu_ns);
            r.energy.package_j += p.package_j;
            r.energy.core_j += p.core_j;
            r.energy.dram_j += p.dram_j;
            r.energy.gpu_j += p.gpu_j;
            r.energy.static_j += p.static_j;
            let m = &mut r.memory;
            m.peak_pss_bytes = m.peak_pss_bytes.max(p.pss_bytes.unwrap_or(0));
            m.peak_uss_bytes = m.peak_uss_bytes.max(p.uss_bytes.unwrap_or(0));
            m.peak_gpu_bytes = m.peak_gpu_bytes.max(p.gpu_memory_bytes);
            e.2 = iv.t_ns;
        }
    }
    let mut processes: Vec<ProcessReport> = by_pid
        .into_values()
        .map(|(mut r, first, last)| {
            let e = r.energy;
            let span = last.saturating_sub(first);
            r.energy = EnergyJ::of_joules(
                e.package_j,
                e.core_j,
                e.dram_j,
                e.gpu_j,
                e.static_j,
                span,
                g,
            );
            r
        })
        .collect();
    processes.sort_by(|a, b| {
        b.energy
            .total_j
            .total_cmp(&a.energy.total_j)
            .then(a.pid.cmp(&b.pid))
    });
    processes
}

/// What a cut stream cannot say, for the report's note.
pub(super) fn missing(h: &HeaderRecord) -> Vec<String> {
    let mut missing = vec![
        "the exit status, the per-process start and exit times and parents".to_string(),
        "containers and cgroups".to_string(),
        "windows still open at the cut".to_string(),
    ];
    missing.push(
        "process lifetimes (a process's average power is over the intervals it ran in)".to_string(),
    );
    if h.mode == "run" && h.profiler_pid.is_none() {
        missing.push(
            "which process is wattprof itself (this stream's header does not say)".to_string(),
        );
    } else if h.mode != "run" {
        missing.push(
            "processes outside each interval's --top rows (their energy is in the groups)"
                .to_string(),
        );
    }
    missing
}
