//! A stream cut short, summed from its intervals with the profile's own
//! sums: domains in a [`EnergyLedger`], groups and processes as
//! [`EnergyBy`], so each figure is made as the recording would have made
//! it ([`EnergyLedger::reports`], [`EnergyJ::new`]), not by a second
//! engine. A record's joules are its µJ over 10^6, so they go back to
//! µJ exactly.

use std::collections::BTreeMap;

use crate::attribution::EnergyBy;
use crate::carbon::CarbonIntensity;
use crate::model::record::{GroupRow, HeaderRecord, IntervalRecord, ProcessRow};
use crate::model::{DomainReport, EnergyJ, GroupEnergy, MemoryReport, ProcessReport};
use crate::process::GroupTotals;
use crate::sources::DomainKey;
use crate::sources::static_power::StaticFigure;
use crate::sums::ledger::EnergyLedger;
use crate::sums::{Groups, MigSums, group_energy, most_energy_first};
use crate::units::microjoules as uj;

/// A row's joules as the sums keep them. Records hold the static part as
/// one figure: it is kept as the package's, which only its total reads.
fn energy_of(package_j: f64, core_j: f64, dram_j: f64, gpu_j: f64, static_j: f64) -> EnergyBy {
    EnergyBy {
        package_uj: uj(package_j),
        core_uj: uj(core_j),
        dram_uj: uj(dram_j),
        gpu_uj: uj(gpu_j),
        package_static_uj: uj(static_j),
        ..EnergyBy::default()
    }
}

/// What a cut stream's intervals add up to.
pub(super) struct CutSums {
    /// Per domain and package.
    pub(super) domains: Vec<DomainReport>,
    /// Each group's CPU time.
    pub(super) group_times: GroupTotals,
    /// Each group's energy.
    pub(super) group_energy: GroupEnergy,
    /// All CPUs' busy time.
    pub(super) busy_ns: u64,
    /// Each process's rows summed (all but `own`), most energy first.
    pub(super) processes: Vec<ProcessReport>,
    /// Each MIG instance's GPU energy.
    pub(super) mig_instances: Vec<crate::model::MigInstanceReport>,
}

/// Sums `intervals` over `span_ns`; `own` is wattprof's pid in `run`,
/// whose rows the recording's processes leave out.
pub(super) fn sum(
    intervals: &[IntervalRecord],
    span_ns: u64,
    own: Option<u32>,
    carbon: &CarbonIntensity,
) -> CutSums {
    let (domains, figures) = domains(intervals);
    let (group_times, groups, unsplit, busy_ns) = groups(intervals);
    let mut group_energy = group_energy(&groups, span_ns, carbon);
    // Streams from before the per-domain group fields have only each
    // group's total.
    for (e, total_uj) in [
        &mut group_energy.tree,
        &mut group_energy.profiler,
        &mut group_energy.other,
    ]
    .into_iter()
    .zip(unsplit)
    {
        if total_uj > 0 && e.total_j == 0.0 {
            let whole = EnergyJ::new(
                &EnergyBy {
                    package_uj: total_uj,
                    ..EnergyBy::default()
                },
                span_ns,
                carbon,
            );
            e.total_j = whole.total_j;
            e.avg_power_w = whole.avg_power_w;
            e.co2_g = whole.co2_g;
        }
    }
    CutSums {
        domains: domains.reports(span_ns, |k| figures.get(&k).copied()),
        group_times,
        group_energy,
        busy_ns,
        processes: processes(intervals, own, carbon),
        mig_instances: mig(intervals).reports(),
    }
}

/// Each MIG instance's rows summed.
fn mig(intervals: &[IntervalRecord]) -> MigSums {
    let mut sums = MigSums::default();
    for g in intervals.iter().flat_map(|iv| &iv.gpus) {
        for i in &g.instances {
            sums.add(
                g.index,
                i.gpu_instance_id,
                i.compute_instance_id,
                &i.uuid,
                i.slices,
                uj(i.energy_j),
            );
        }
    }
    sums
}

/// Per domain and package; and the last static figure each was divided
/// with, as a recording reports it.
fn domains(intervals: &[IntervalRecord]) -> (EnergyLedger, BTreeMap<DomainKey, StaticFigure>) {
    let mut ledger = EnergyLedger::default();
    let mut figures = BTreeMap::new();
    for d in intervals.iter().flat_map(|iv| &iv.domains) {
        ledger.add_domain(&d.to_uj());
        if let Some(figure) = d.figure() {
            figures.insert(d.key(), figure);
        }
    }
    (ledger, figures)
}

/// Each group's CPU time and energy; each group's total where a row has
/// no per-domain figures (older streams); all CPUs' busy time.
fn groups(intervals: &[IntervalRecord]) -> (GroupTotals, Groups, [u64; 3], u64) {
    let mut times = GroupTotals::default();
    let mut groups = Groups::default();
    let mut unsplit = [0u64; 3];
    let mut busy_ns = 0u64;
    for iv in intervals {
        // Saturating: a damaged file must not overflow the sums.
        busy_ns = busy_ns.saturating_add(iv.busy_ns);
        let gr = &iv.groups;
        for (i, (row, ns)) in [
            (&gr.tree, &mut times.tree_ns),
            (&gr.profiler, &mut times.profiler_ns),
            (&gr.other, &mut times.other_ns),
        ]
        .into_iter()
        .enumerate()
        {
            *ns = ns.saturating_add(row.on_cpu_ns);
            let GroupRow {
                package_j,
                core_j,
                dram_j,
                gpu_j,
                static_j,
                energy_j,
                ..
            } = *row;
            groups[i].merge(&energy_of(package_j, core_j, dram_j, gpu_j, static_j));
            unsplit[i] = unsplit[i].saturating_add(uj(energy_j));
        }
    }
    (times, groups, unsplit, busy_ns)
}

/// Each process's rows summed (all but `own`), its power over the
/// intervals it was seen in; most energy first.
fn processes(
    intervals: &[IntervalRecord],
    own: Option<u32>,
    carbon: &CarbonIntensity,
) -> Vec<ProcessReport> {
    /// Per pid: its last name, CPU time, memory peaks, and the span it
    /// was seen over.
    struct Seen {
        comm: String,
        on_cpu_ns: u64,
        memory: MemoryReport,
        first_ns: u64,
        last_ns: u64,
    }
    let mut energy = EnergyLedger::default();
    let mut seen: BTreeMap<u32, Seen> = BTreeMap::new();
    for iv in intervals {
        let begin = iv.t_ns.saturating_sub(iv.duration_ns);
        for p in iv.process_rows().iter().filter(|p| Some(p.pid) != own) {
            let ProcessRow {
                package_j,
                core_j,
                dram_j,
                gpu_j,
                static_j,
                ..
            } = *p;
            energy.add_consumer(
                u64::from(p.pid),
                &energy_of(package_j, core_j, dram_j, gpu_j, static_j),
            );
            let s = seen.entry(p.pid).or_insert_with(|| Seen {
                comm: String::new(),
                on_cpu_ns: 0,
                memory: MemoryReport::default(),
                first_ns: begin,
                last_ns: iv.t_ns,
            });
            s.comm.clone_from(&p.comm);
            s.on_cpu_ns = s.on_cpu_ns.saturating_add(p.on_cpu_ns);
            let m = &mut s.memory;
            m.peak_pss_bytes = m.peak_pss_bytes.max(p.pss_bytes.unwrap_or(0));
            m.peak_uss_bytes = m.peak_uss_bytes.max(p.uss_bytes.unwrap_or(0));
            m.peak_gpu_bytes = m.peak_gpu_bytes.max(p.gpu_memory_bytes);
            s.last_ns = iv.t_ns;
        }
    }
    let mut processes: Vec<ProcessReport> = seen
        .into_iter()
        .map(|(pid, s)| ProcessReport {
            pid,
            ppid: None,
            comm: s.comm,
            // A stream's rows carry names only.
            cmdline: None,
            on_cpu_ns: s.on_cpu_ns,
            on_cpu_ns_per_package: Vec::new(),
            start_ns: None,
            exit_ns: None,
            energy: EnergyJ::new(
                &energy.consumer(u64::from(pid)),
                s.last_ns.saturating_sub(s.first_ns),
                carbon,
            ),
            memory: s.memory,
            cgroup: None,
        })
        .collect();
    processes
        .sort_by(|a, b| most_energy_first((&a.energy, 0), (&b.energy, 0)).then(a.pid.cmp(&b.pid)));
    processes
}

/// What a cut stream cannot say, for the report's note.
pub(super) fn missing(h: &HeaderRecord) -> Vec<String> {
    let mut missing = vec![
        "the exit status, the per-process start and exit times and parents".to_string(),
        "containers, cgroups and batch jobs".to_string(),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::DomainUj;
    use crate::attribution::{Basis, DomainShare};
    use crate::model::record::{DomainRow, GroupRow, GroupRows, IntervalPower};
    use crate::sources::Domain;
    use crate::units::joules;

    /// An interval's share of a domain, with µJ that are no round number
    /// of joules.
    fn share(domain: Domain, k: u64) -> DomainShare {
        DomainShare {
            key: DomainKey::new(domain, Some(0)),
            estimated: false,
            basis: Basis::CpuTime,
            measured_uj: 1_234_567 + 7 * k + 38,
            idle_uj: 10 + k,
            unattributed_uj: 3,
            attributed: vec![(1, 1_000_003 + k), (2, 234_539 + 6 * k)],
            attributed_static: vec![(1, 500_001)],
            static_uj: 700_009,
            static_cut_uj: 0,
        }
    }

    #[test]
    fn a_cut_stream_sums_to_the_figures_the_profile_s_own_sums_report() {
        let carbon = CarbonIntensity {
            g_per_kwh: 100.0,
            source: "test".into(),
        };
        // The profile's side: its ledger, fed the shares.
        let mut ledger = EnergyLedger::default();
        // The stream's side: the interval records made from them.
        let mut intervals = Vec::new();
        for k in 0..5 {
            let shares = [share(Domain::Dram, k), share(Domain::Package, k)];
            ledger.add(&shares);
            let domains = shares
                .iter()
                .map(|s| {
                    DomainRow::from_uj(&s.totals(), None, 1_000_000_000, |power_w| IntervalPower {
                        power_w,
                        covers_ns: None,
                    })
                })
                .collect();
            let row = |pid: u32, uj: u64| ProcessRow {
                pid,
                comm: format!("p{pid}"),
                on_cpu_ns: 10,
                package_j: joules(uj),
                static_j: joules(uj / 3),
                ..ProcessRow::default()
            };
            intervals.push(IntervalRecord {
                t_ns: (k + 1) * 1_000_000_000,
                duration_ns: 1_000_000_000,
                busy_ns: 20,
                domains,
                gpus: Vec::new(),
                groups: GroupRows::default(),
                processes: Some(vec![
                    row(1, ledger.consumer(1).package_uj / (k + 1)),
                    row(2, 234_539 + 6 * k),
                ]),
            });
        }
        let span = 5_000_000_000;
        let cut = sum(&intervals, span, None, &carbon);
        // Exactly the ledger's reports: the joules go back to µJ exactly.
        assert_eq!(cut.domains, ledger.reports(span, |_| None));
        let pid2: u64 = (0..5).map(|k| 234_539 + 6 * k).sum();
        let p2 = cut.processes.iter().find(|p| p.pid == 2).expect("pid 2");
        let mut want = EnergyBy::default();
        for k in 0..5 {
            want.merge(&energy_of(
                joules(234_539 + 6 * k),
                0.0,
                0.0,
                0.0,
                joules((234_539 + 6 * k) / 3),
            ));
        }
        assert_eq!(want.package_uj, pid2);
        assert_eq!(
            p2.energy,
            EnergyJ::new(&want, 4_000_000_000 + 1_000_000_000, &carbon)
        );
        assert_eq!(p2.on_cpu_ns, 50);
        assert_eq!(cut.busy_ns, 100);
        // Pid 1's rows, summed as µJ: the most energy, first.
        let p1 = &cut.processes[0];
        assert_eq!((p1.pid, p1.on_cpu_ns), (1, 50));
        let want: u64 = intervals
            .iter()
            .map(|iv| uj(iv.process_rows()[0].package_j))
            .sum();
        assert_eq!(p1.energy.package_j, joules(want));
    }

    #[test]
    fn groups_static_figures_packages_and_total_only_groups_sum_as_the_profile_would() {
        let carbon = CarbonIntensity {
            g_per_kwh: 100.0,
            source: "test".into(),
        };
        let row = |package: u32, measured: u64, static_w: Option<f64>| {
            let mut d = DomainRow::from_uj(
                &DomainUj {
                    measured_uj: measured,
                    attributed_uj: measured / 2,
                    idle_uj: measured / 2,
                    static_uj: measured / 4,
                    attributed_static_uj: measured / 8,
                    ..DomainUj::empty(
                        DomainKey::new(Domain::Package, Some(package)),
                        Basis::CpuTime,
                    )
                },
                None,
                1_000_000_000,
                |power_w| IntervalPower {
                    power_w,
                    covers_ns: None,
                },
            );
            d.static_w = static_w;
            d.static_source = static_w.map(|_| crate::sources::static_power::StaticSource::Learned);
            d
        };
        let group = |package_uj: u64, static_uj: u64| GroupRow {
            on_cpu_ns: 7,
            energy_j: joules(package_uj),
            package_j: joules(package_uj),
            core_j: 0.0,
            dram_j: 0.0,
            gpu_j: 0.0,
            static_j: joules(static_uj),
        };
        let iv = |k: u64, groups: GroupRows| IntervalRecord {
            t_ns: (k + 1) * 1_000_000_000,
            duration_ns: 1_000_000_000,
            busy_ns: 3,
            // Package 1 before package 0, as a reader may list them.
            domains: vec![
                row(1, 2_000_001 + k, Some(9.5 + k as f64)),
                row(0, 1_000_003, None),
            ],
            gpus: Vec::new(),
            groups,
            processes: Some(Vec::new()),
        };
        let mut intervals: Vec<IntervalRecord> = (0..3)
            .map(|k| {
                iv(
                    k,
                    GroupRows {
                        tree: group(500_001, 100_003),
                        profiler: group(7, 0),
                        other: group(1_234_567, 1),
                    },
                )
            })
            .collect();
        // An older stream's groups: the total only.
        let mut old = iv(3, GroupRows::default());
        old.groups.other.energy_j = 0.25;
        let span = 4_000_000_000;
        // With the older interval, `other` has per-domain figures: its
        // total is theirs, not the older one's alone.
        intervals.push(old.clone());
        let cut = sum(&intervals, span, None, &carbon);
        // Reported in the ledger's order (by domain, then package), the
        // last static figure of each, as a recording reports them.
        let keys: Vec<(Option<u32>, Option<f64>)> = cut
            .domains
            .iter()
            .map(|d| (d.package, d.static_w))
            .collect();
        assert_eq!(keys, vec![(Some(0), None), (Some(1), Some(12.5))]);
        assert_eq!(
            cut.domains[1].measured_j,
            joules(3 * 2_000_001 + 3 + 2_000_001 + 3)
        );
        assert_eq!(cut.domains[1].static_j, joules(4 * 500_000 + 1));
        // Groups: µJ summed, then made into joules, power and CO2 once.
        let mut tree = EnergyBy::default();
        for _ in 0..3 {
            tree.merge(&energy_of(joules(500_001), 0.0, 0.0, 0.0, joules(100_003)));
        }
        assert_eq!(cut.group_energy.tree, EnergyJ::new(&tree, span, &carbon));
        assert_eq!(cut.group_times.tree_ns, 21);
        assert!((cut.group_energy.other.total_j - joules(3 * 1_234_567)).abs() < 1e-12);
        // A stream whose groups all have the total only keeps that total.
        let cut = sum(&[old], span, None, &carbon);
        assert_eq!(cut.group_energy.other.total_j, 0.25);
        assert_eq!(cut.group_energy.other.package_j, 0.0);
        assert_eq!(
            cut.group_energy.other.co2_g,
            EnergyJ::new(
                &EnergyBy {
                    package_uj: 250_000,
                    ..EnergyBy::default()
                },
                span,
                &carbon
            )
            .co2_g
        );
    }
}
