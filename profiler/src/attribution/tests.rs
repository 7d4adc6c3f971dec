//! Unit tests of the attribution engine (pure, no root).
use super::*;

fn e(domain: Domain, package: Option<u32>, uj: u64) -> DomainEnergy {
    DomainEnergy {
        domain,
        package,
        energy_uj: uj,
        estimated: false,
        busy_only: false,
    }
}

fn conserved(shares: &[DomainShare]) {
    for s in shares {
        assert_eq!(
            s.attributed_uj() + s.idle_uj + s.unattributed_uj,
            s.measured_uj,
            "{s:?}"
        );
    }
}

fn get(shares: &[DomainShare], d: Domain, p: Option<u32>) -> &DomainShare {
    shares
        .iter()
        .find(|s| s.key.domain == d && s.key.package == p)
        .expect("domain present")
}

fn of(s: &DomainShare, id: ConsumerId) -> u64 {
    s.attributed
        .iter()
        .find(|(c, _)| *c == id)
        .map_or(0, |(_, e)| *e)
}

/// Two packages (kernel ids 0 and 1), 2 CPUs each, 1 s interval: 2 s of
/// CPU time per package.
fn two_packages() -> Vec<PackageTime> {
    vec![
        PackageTime {
            busy_ns: 1_500_000_000,
            idle_ns: 500_000_000,
            lost_ns: 0,
        },
        PackageTime {
            busy_ns: 600_000_000,
            idle_ns: 1_300_000_000,
            lost_ns: 100_000_000,
        },
    ]
}

#[test]
fn per_package_energy_goes_only_to_tasks_that_ran_there() {
    let packages = two_packages();
    let usage = vec![
        // Ran only on package 0.
        Usage {
            id: 1,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[1_000_000_000, 0]),
        },
        // Ran on both.
        Usage {
            id: 2,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[500_000_000, 600_000_000]),
        },
    ];
    let energy = vec![
        e(Domain::Package, Some(0), 100_000_000),
        e(Domain::Package, Some(1), 40_000_000),
        e(Domain::Dram, Some(1), 8_000_000),
    ];
    let shares = attribute(&Interval {
        packages: &packages,
        package_ids: &[0, 1],
        usage: &usage,
        energy: &energy,
        gpus: &[],
        wall: None,
        ..Default::default()
    });
    conserved(&shares);
    let p0 = get(&shares, Domain::Package, Some(0));
    assert_eq!(of(p0, 1), 50_000_000);
    assert_eq!(of(p0, 2), 25_000_000);
    assert_eq!(p0.idle_uj, 25_000_000);
    assert_eq!(p0.unattributed_uj, 0);
    let p1 = get(&shares, Domain::Package, Some(1));
    assert_eq!(of(p1, 1), 0, "task 1 never ran on package 1");
    assert_eq!(of(p1, 2), 12_000_000);
    assert_eq!(p1.idle_uj, 26_000_000);
    // Lost time's share (0.1 of 2 s) is unattributed, never idle.
    assert_eq!(p1.unattributed_uj, 2_000_000);
    let d1 = get(&shares, Domain::Dram, Some(1));
    assert_eq!(of(d1, 2), 2_400_000);
    assert_eq!(d1.basis, Basis::CpuTime);
}

#[test]
fn conservation_holds_with_rounding_for_every_domain() {
    let packages = vec![PackageTime {
        busy_ns: 999_999_999,
        idle_ns: 1_000_000_003,
        lost_ns: 7,
    }];
    let usage: Vec<Usage> = (0..333)
        .map(|i| Usage {
            id: i,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[3_003_003]),
        })
        .collect();
    let energy = vec![
        e(Domain::Package, Some(0), 12_345_677),
        e(Domain::Core, Some(0), 9_999_991),
        e(Domain::Uncore, Some(0), 1_111),
        e(Domain::Dram, Some(0), 3),
        e(Domain::Psys, None, 77_777_777),
        e(Domain::Wall, None, 99_999_999),
    ];
    let gpus = vec![GpuInterval {
        index: 0,
        energy_uj: 1_000_001,
        estimated: false,
        processes: vec![(Some(1), 33), (Some(2), 33), (None, 34)],
        unheld: 0,
        settling: false,
        statics: GpuStaticEnergy::default(),
    }];
    let shares = attribute(&Interval {
        packages: &packages,
        package_ids: &[0],
        usage: &usage,
        energy: &energy,
        gpus: &gpus,
        wall: None,
        ..Default::default()
    });
    assert_eq!(shares.len(), 7);
    conserved(&shares);
    for d in [Domain::Uncore, Domain::Psys, Domain::Wall] {
        let s = shares.iter().find(|s| s.key.domain == d).expect("present");
        assert_eq!(s.basis, Basis::MachineLevel);
        assert_eq!(s.unattributed_uj, s.measured_uj);
    }
    // Rounding loses under one µJ per consumer.
    let p = get(&shares, Domain::Package, Some(0));
    assert!(p.unattributed_uj <= 334, "{}", p.unattributed_uj);
}

#[test]
fn idle_energy_is_the_idle_share_and_a_machine_with_nothing_running_is_all_idle() {
    let packages = vec![PackageTime {
        busy_ns: 0,
        idle_ns: 2_000_000_000,
        lost_ns: 0,
    }];
    let energy = vec![e(Domain::Package, Some(0), 30_000_000)];
    let shares = attribute(&Interval {
        packages: &packages,
        package_ids: &[0],
        usage: &[],
        energy: &energy,
        gpus: &[],
        wall: None,
        ..Default::default()
    });
    assert_eq!(shares[0].idle_uj, 30_000_000);
    assert!(shares[0].attributed.is_empty());
}

#[test]
fn a_task_that_exited_mid_interval_gets_its_share() {
    // The tracker reports an exited thread's final time in the interval
    // of its exit; the engine needs no notion of exit: its time counts.
    let packages = vec![PackageTime {
        busy_ns: 1_000_000_000,
        idle_ns: 1_000_000_000,
        lost_ns: 0,
    }];
    let usage = vec![
        Usage {
            id: 7,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[10_000_000]),
        },
        Usage {
            id: 8,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[990_000_000]),
        },
    ];
    let energy = vec![e(Domain::Package, Some(0), 20_000_000)];
    let shares = attribute(&Interval {
        packages: &packages,
        package_ids: &[0],
        usage: &usage,
        energy: &energy,
        gpus: &[],
        wall: None,
        ..Default::default()
    });
    assert_eq!(of(&shares[0], 7), 100_000);
    assert_eq!(of(&shares[0], 8), 9_900_000);
}

#[test]
fn estimated_energy_is_divided_by_busy_time_with_no_idle_share() {
    let packages = two_packages();
    let usage = vec![
        Usage {
            id: 1,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[1_500_000_000, 0]),
        },
        Usage {
            id: 2,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[0, 600_000_000]),
        },
    ];
    let energy = vec![DomainEnergy {
        domain: Domain::Package,
        package: None,
        // 2.2 s of task time (0.1 s of it lost): 1 µJ per µs.
        energy_uj: 2_200_000,
        estimated: true,
        busy_only: true,
    }];
    let shares = attribute(&Interval {
        packages: &packages,
        package_ids: &[0, 1],
        usage: &usage,
        energy: &energy,
        gpus: &[],
        wall: None,
        ..Default::default()
    });
    conserved(&shares);
    assert_eq!(shares[0].basis, Basis::BusyTime);
    assert_eq!(of(&shares[0], 1), 1_500_000);
    assert_eq!(of(&shares[0], 2), 600_000);
    assert_eq!(shares[0].idle_uj, 0);
    // Lost time's share is unattributed.
    assert_eq!(shares[0].unattributed_uj, 100_000);
    assert!(shares[0].estimated);
    // A model with an idle term is divided like a counter: idle time's
    // share is idle energy.
    let with_idle = [DomainEnergy {
        busy_only: false,
        ..energy[0].clone()
    }];
    let shares = attribute(&Interval {
        packages: &packages,
        package_ids: &[0, 1],
        usage: &usage,
        energy: &with_idle,
        gpus: &[],
        wall: None,
        ..Default::default()
    });
    conserved(&shares);
    assert_eq!(shares[0].basis, Basis::CpuTime);
    assert!(
        shares[0].idle_uj > 0 && shares[0].estimated,
        "{:?}",
        shares[0]
    );
}

#[test]
fn a_calibrated_wall_scales_each_consumer_and_keeps_static_power_idle() {
    let packages = two_packages();
    let usage = vec![
        Usage {
            id: 1,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[1_500_000_000, 0]),
        },
        Usage {
            id: 2,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[0, 600_000_000]),
        },
    ];
    // 1 J per package, wall = 1.5 × 2 J + 10 J static.
    let energy = vec![
        e(Domain::Package, Some(0), 1_000_000),
        e(Domain::Package, Some(1), 1_000_000),
        e(Domain::Wall, None, 13_000_000),
    ];
    let model = WallModel {
        a: 1.5,
        per: WallPer::CounterEnergy,
        static_uj: 10_000_000,
    };
    let iv = |wall| Interval {
        packages: &packages,
        package_ids: &[0, 1],
        usage: &usage,
        energy: &energy,
        gpus: &[],
        wall,
        ..Default::default()
    };
    let shares = attribute(&iv(Some(model)));
    conserved(&shares);
    let cpu = |id| {
        of(get(&shares, Domain::Package, Some(0)), id)
            + of(get(&shares, Domain::Package, Some(1)), id)
    };
    let wall = get(&shares, Domain::Wall, None);
    assert_eq!(wall.basis, Basis::Calibrated);
    for id in [1, 2] {
        let want = (1.5 * cpu(id) as f64).floor() as u64;
        assert_eq!(of(wall, id), want, "consumer {id}");
    }
    assert_eq!(wall.static_uj, 10_000_000);
    assert!(wall.idle_uj >= wall.static_uj);
    // Without a model the wall is machine level, all unattributed.
    let shares = attribute(&iv(None));
    let wall = get(&shares, Domain::Wall, None);
    assert_eq!(
        (wall.basis, wall.unattributed_uj),
        (Basis::MachineLevel, 13_000_000)
    );
    // A slope that would give more than was measured never does.
    let greedy = WallModel { a: 100.0, ..model };
    let shares = attribute(&iv(Some(greedy)));
    conserved(&shares);
}

#[test]
fn gpu_energy_is_split_by_sm_share_and_idle_when_nobody_holds_it() {
    let gpus = vec![
        GpuInterval {
            index: 0,
            energy_uj: 300_000_000,
            estimated: false,
            processes: vec![(Some(1), 60), (Some(2), 30)],
            unheld: 0,
            settling: false,
            statics: GpuStaticEnergy::default(),
        },
        GpuInterval {
            index: 1,
            energy_uj: 50_000_000,
            estimated: false,
            processes: vec![],
            unheld: 0,
            settling: false,
            statics: GpuStaticEnergy::default(),
        },
        GpuInterval {
            index: 2,
            energy_uj: 90_000_000,
            estimated: true,
            processes: vec![(Some(3), 0)],
            unheld: 0,
            settling: false,
            statics: GpuStaticEnergy::default(),
        },
    ];
    let shares = attribute(&Interval {
        packages: &[],
        package_ids: &[],
        usage: &[],
        energy: &[],
        gpus: &gpus,
        wall: None,
        ..Default::default()
    });
    conserved(&shares);
    let g0 = get(&shares, Domain::Gpu, Some(0));
    assert_eq!(of(g0, 1), 200_000_000);
    assert_eq!(of(g0, 2), 100_000_000);
    assert_eq!(g0.idle_uj, 0);
    let g1 = get(&shares, Domain::Gpu, Some(1));
    assert_eq!(g1.idle_uj, 50_000_000);
    // The only process on the GPU gets all of it, even with no SM sample.
    let g2 = get(&shares, Domain::Gpu, Some(2));
    assert_eq!(of(g2, 3), 90_000_000);
    assert!(g2.estimated);
}

/// A GPU at 31.7 W idle, 22.3 W held, over 1 s: 160 J measured, one
/// process at 60% SM, one holding a context at 0%, one holder wattprof
/// does not know at 20%.
fn gpu_with_statics(rule: StaticShare) -> DomainShare {
    let gpus = vec![GpuInterval {
        index: 0,
        energy_uj: 160_000_000,
        estimated: false,
        processes: vec![(Some(1), 60), (Some(2), 0), (None, 20)],
        unheld: 0,
        settling: false,
        statics: GpuStaticEnergy {
            idle_uj: 31_700_000,
            held_uj: 22_300_000,
        },
    }];
    let shares = attribute(&Interval {
        gpus: &gpus,
        static_share: rule,
        ..Default::default()
    });
    conserved(&shares);
    get(&shares, Domain::Gpu, Some(0)).clone()
}

#[test]
fn a_gpu_s_idle_power_is_idle_its_held_power_shared_by_holders_and_the_rest_by_sm() {
    let g = gpu_with_statics(StaticShare::Capacity);
    let dynamic = 160_000_000 - 31_700_000 - 22_300_000;
    let held = 22_300_000 / 3;
    // The busy process: its third of held power and 60/80 of the dynamic.
    assert_eq!(of(&g, 1), held + dynamic * 60 / 80);
    // The idle holder: only its third of held power.
    assert_eq!(of(&g, 2), held);
    let st = |id| {
        g.attributed_static
            .iter()
            .find(|(c, _)| *c == id)
            .map_or(0, |(_, uj)| *uj)
    };
    assert_eq!((st(1), st(2)), (held, held));
    assert_eq!(g.idle_uj, 31_700_000);
    assert_eq!(g.static_uj, 54_000_000);
    // The unknown holder's shares are unattributed, not dropped.
    assert_eq!(
        g.unattributed_uj,
        160_000_000 - of(&g, 1) - of(&g, 2) - g.idle_uj
    );
    assert!(g.unattributed_uj >= held + dynamic * 20 / 80);
    // busy: the idle part goes to the holders too; idle: none of the
    // static part does.
    let b = gpu_with_statics(StaticShare::Busy);
    assert_eq!(of(&b, 2), 54_000_000 / 3);
    assert_eq!(b.idle_uj, 0);
    let i = gpu_with_statics(StaticShare::Idle);
    assert_eq!(of(&i, 2), 0);
    assert_eq!(i.idle_uj, 54_000_000);
    assert_eq!(of(&i, 1), dynamic * 60 / 80);
}

#[test]
fn a_gpu_static_figure_above_what_was_measured_is_cut_and_no_context_is_all_idle() {
    let mut gpus = vec![GpuInterval {
        index: 0,
        energy_uj: 40_000_000,
        estimated: false,
        processes: vec![(Some(1), 50)],
        unheld: 0,
        settling: false,
        statics: GpuStaticEnergy {
            idle_uj: 31_700_000,
            held_uj: 22_300_000,
        },
    }];
    let shares = attribute(&Interval {
        gpus: &gpus,
        ..Default::default()
    });
    conserved(&shares);
    let g = get(&shares, Domain::Gpu, Some(0));
    assert_eq!((g.idle_uj, of(g, 1)), (31_700_000, 8_300_000));
    assert_eq!((g.static_uj, g.static_cut_uj), (40_000_000, 14_000_000));
    gpus[0].processes.clear();
    let shares = attribute(&Interval {
        gpus: &gpus,
        ..Default::default()
    });
    let g = get(&shares, Domain::Gpu, Some(0));
    assert_eq!(
        (g.idle_uj, g.attributed_uj(), g.unattributed_uj),
        (40_000_000, 0, 0)
    );
}

#[test]
fn energy_of_a_package_the_tracker_does_not_know_is_unattributed() {
    let packages = vec![PackageTime {
        busy_ns: 1,
        idle_ns: 1,
        lost_ns: 0,
    }];
    let usage = vec![Usage {
        id: 1,
        on_cpu_ns: crate::tracker::PackageNs::from_slice(&[1]),
    }];
    let energy = vec![e(Domain::Package, Some(5), 1_000)];
    let shares = attribute(&Interval {
        packages: &packages,
        package_ids: &[0],
        usage: &usage,
        energy: &energy,
        gpus: &[],
        wall: None,
        ..Default::default()
    });
    assert_eq!(shares[0].unattributed_uj, 1_000);
}

/// One package of 4 CPUs over 1 s (4 s of CPU time): static S =
/// 23.7 W, k = 11.3 W per busy CPU. Consumer 1 ran 1.5 s, consumer 2
/// 0.5 s, 0.2 s was lost, 1.8 s idle: 2.2 busy CPUs.
fn static_interval(
    share: StaticShare,
    static_uj: Option<u64>,
    measured_uj: u64,
    f: impl FnOnce(&[DomainShare]),
) {
    let packages = [PackageTime {
        busy_ns: 2_000_000_000,
        idle_ns: 1_800_000_000,
        lost_ns: 200_000_000,
    }];
    let usage = [
        Usage {
            id: 1,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[1_500_000_000]),
        },
        Usage {
            id: 2,
            on_cpu_ns: crate::tracker::PackageNs::from_slice(&[500_000_000]),
        },
    ];
    let statics: Vec<StaticEnergy> = static_uj
        .map(|uj| StaticEnergy {
            domain: Domain::Package,
            package: Some(0),
            static_uj: uj,
        })
        .into_iter()
        .collect();
    let shares = attribute(&Interval {
        packages: &packages,
        package_ids: &[0],
        usage: &usage,
        energy: &[e(Domain::Package, Some(0), measured_uj)],
        statics: &statics,
        static_share: share,
        ..Default::default()
    });
    conserved(&shares);
    f(&shares);
}

const S_UJ: u64 = 23_700_000;
/// S + k × 2.2 busy CPUs over 1 s.
const MEASURED_UJ: u64 = 23_700_000 + 11_300_000 * 22 / 10;

fn static_of(s: &DomainShare, id: ConsumerId) -> u64 {
    s.attributed_static
        .iter()
        .find(|(c, _)| *c == id)
        .map_or(0, |(_, e)| *e)
}

#[test]
fn each_gets_what_it_caused_plus_rent_for_the_capacity_it_held() {
    static_interval(StaticShare::Capacity, Some(S_UJ), MEASURED_UJ, |shares| {
        let s = get(shares, Domain::Package, Some(0));
        assert_eq!(s.static_uj, S_UJ);
        // k × its busy time + S × its CPU time / (4 CPUs × 1 s), to
        // the µJ (each part rounded down).
        assert_eq!(of(s, 1), 11_300_000 * 15 / 10 + S_UJ * 15 / 40);
        assert_eq!(of(s, 2), 11_300_000 * 5 / 10 + S_UJ * 5 / 40);
        assert_eq!(static_of(s, 1), S_UJ * 15 / 40);
        assert_eq!(static_of(s, 2), S_UJ * 5 / 40);
        // Idle: S × the idle share; lost time's dynamic and static
        // shares are unattributed.
        assert_eq!(s.idle_uj, S_UJ * 18 / 40);
        assert_eq!(
            s.unattributed_uj,
            11_300_000 * 2 / 10 + S_UJ * 2 / 40,
            "lost time's share (no rounding left: every share is whole)"
        );
        assert_eq!(s.static_cut_uj, 0);
    });
}

#[test]
fn a_consumers_energy_does_not_depend_on_its_neighbour() {
    // Consumer 1 alone (1.5 s busy, 2.5 s idle) and beside consumer 2
    // (as above): the same energy, because the power followed the
    // load.
    let alone = [PackageTime {
        busy_ns: 1_500_000_000,
        idle_ns: 2_500_000_000,
        lost_ns: 0,
    }];
    let usage = [Usage {
        id: 1,
        on_cpu_ns: crate::tracker::PackageNs::from_slice(&[1_500_000_000]),
    }];
    let statics = [StaticEnergy {
        domain: Domain::Package,
        package: Some(0),
        static_uj: S_UJ,
    }];
    let shares = attribute(&Interval {
        packages: &alone,
        package_ids: &[0],
        usage: &usage,
        energy: &[e(Domain::Package, Some(0), S_UJ + 11_300_000 * 15 / 10)],
        statics: &statics,
        ..Default::default()
    });
    let alone_j = of(get(&shares, Domain::Package, Some(0)), 1);
    static_interval(StaticShare::Capacity, Some(S_UJ), MEASURED_UJ, |shares| {
        assert_eq!(of(get(shares, Domain::Package, Some(0)), 1), alone_j);
    });
}

#[test]
fn busy_charges_all_static_to_who_ran_and_idle_none() {
    static_interval(StaticShare::Busy, Some(S_UJ), MEASURED_UJ, |shares| {
        let s = get(shares, Domain::Package, Some(0));
        // By busy time (2.2 s with lost): 1.5/2.2 of everything.
        assert_eq!(of(s, 1), 11_300_000 * 15 / 10 + S_UJ * 15 / 22);
        assert_eq!(static_of(s, 1), S_UJ * 15 / 22);
        assert_eq!(s.idle_uj, 0);
    });
    static_interval(StaticShare::Idle, Some(S_UJ), MEASURED_UJ, |shares| {
        let s = get(shares, Domain::Package, Some(0));
        assert_eq!(of(s, 1), 11_300_000 * 15 / 10);
        assert_eq!(static_of(s, 1), 0);
        assert_eq!(s.idle_uj, S_UJ);
    });
}

#[test]
fn a_static_figure_above_the_measured_is_cut_and_said() {
    // 30 J static, 25 J measured: all of it static, 5 J cut.
    static_interval(
        StaticShare::Capacity,
        Some(30_000_000),
        25_000_000,
        |shares| {
            let s = get(shares, Domain::Package, Some(0));
            assert_eq!((s.static_uj, s.static_cut_uj), (25_000_000, 5_000_000));
            assert_eq!(of(s, 1), 25_000_000 * 15 / 40, "no dynamic part");
            assert_eq!(s.idle_uj, 25_000_000 * 18 / 40);
        },
    );
}

#[test]
fn no_static_figure_divides_by_cpu_time_as_before_whatever_the_rule() {
    for rule in [StaticShare::Capacity, StaticShare::Busy, StaticShare::Idle] {
        static_interval(rule, None, 40_000_000, |shares| {
            let s = get(shares, Domain::Package, Some(0));
            assert_eq!(of(s, 1), 40_000_000 * 15 / 40, "{rule:?}");
            assert_eq!(of(s, 2), 40_000_000 * 5 / 40, "{rule:?}");
            assert_eq!(s.idle_uj, 40_000_000 * 18 / 40, "{rule:?}");
            assert_eq!(s.static_uj, 40_000_000);
        });
    }
}

#[test]
fn a_busy_mig_instance_with_no_listed_process_keeps_its_share_unattributed() {
    // 1 at weight 30 and 2 at weight 10; 60 of busy SMs no one holds.
    let gpus = vec![GpuInterval {
        index: 0,
        energy_uj: 1_000_000,
        estimated: false,
        processes: vec![(Some(1), 30), (Some(2), 10)],
        unheld: 60,
        settling: false,
        statics: GpuStaticEnergy::default(),
    }];
    let shares = attribute(&Interval {
        gpus: &gpus,
        ..Default::default()
    });
    conserved(&shares);
    let g = get(&shares, Domain::Gpu, Some(0));
    let of = |id| {
        g.attributed
            .iter()
            .find(|(c, _)| *c == id)
            .map_or(0, |x| x.1)
    };
    assert_eq!((of(1), of(2)), (300_000, 100_000));
    assert_eq!(g.unattributed_uj, 600_000);
    // With no weight at all (nothing sampled, nothing unheld), the holders
    // share equally, as before.
    let gpus = vec![GpuInterval {
        processes: vec![(Some(1), 0), (Some(2), 0)],
        unheld: 0,
        ..gpus[0].clone()
    }];
    let shares = attribute(&Interval {
        gpus: &gpus,
        ..Default::default()
    });
    let g = get(&shares, Domain::Gpu, Some(0));
    assert_eq!(g.attributed, vec![(1, 500_000), (2, 500_000)]);
}
