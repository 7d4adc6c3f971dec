//! The sums without root: cgroup fixtures are plain directories (a
//! cgroup's id is its directory's inode), `/proc` a folder of
//! `smaps_rollup` files.

use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;

use super::*;
use crate::process::ProcFs;
use crate::process::names::RuntimeSockets;

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wattprof-sums-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn runtimes(dir: &std::path::Path) -> RuntimeSockets {
    RuntimeSockets {
        docker: dir.join("no-docker.sock"),
        podman: dir.join("no-podman.sock"),
        containerd: dir.join("no-containerd"),
    }
}

fn carbon() -> CarbonIntensity {
    CarbonIntensity {
        g_per_kwh: 100.0,
        source: "test".into(),
    }
}

fn package(uj: u64) -> EnergyBy {
    EnergyBy {
        package_uj: uj,
        ..EnergyBy::default()
    }
}

fn usage(id: ConsumerId, role: Role, cgroup_id: u64, ns: u64) -> IntervalUsage {
    IntervalUsage {
        id,
        pid: id as u32,
        role,
        cgroup_id,
        on_cpu_ns: crate::tracker::PackageNs::from_slice(&[ns]),
        other_cgroups_ns: Vec::new(),
    }
}

/// A cgroup directory under `root`: its id.
fn cgroup(root: &std::path::Path, path: &str) -> u64 {
    let d = root.join(path);
    std::fs::create_dir_all(&d).expect("cgroup dir");
    std::fs::metadata(&d).expect("cgroup").ino()
}

#[test]
fn energy_goes_to_each_group_and_cgroup_and_a_moved_process_splits_by_its_time() {
    let dir = temp_dir("add");
    let root = dir.join("cgroup");
    let (a, b) = (cgroup(&root, "a.slice"), cgroup(&root, "b.slice"));
    let mut sums = Sums::new(Some(&root), &runtimes(&dir));
    // 1 ran 1,000 ns, 250 of them in b (moved during the interval); 2 is
    // wattprof; 3 did not run (its energy is a held read's): it goes
    // where it was; 4 did not run and nothing says where it was.
    let mut moved = usage(1, Role::Tree, a, 1_000);
    moved.other_cgroups_ns = vec![(b, 250)];
    let usage = vec![moved, usage(2, Role::Profiler, b, 100)];
    let index: IntMap<ConsumerId, usize> = [(1, 0), (2, 1)].into_iter().collect();
    let energy: IntMap<ConsumerId, EnergyBy> = [
        (1, package(1_000)),
        (2, package(40)),
        (3, package(300)),
        (4, package(7)),
    ]
    .into_iter()
    .collect();
    let origin = |id: ConsumerId| (id == 3).then_some((b, Role::Other));
    let interval = sums.add_interval(&usage, &energy, &index, origin, 5_000);
    sums.cgroups.name(5_000);
    assert_eq!(interval[Role::Tree as usize].package_uj, 1_000);
    assert_eq!(interval[Role::Profiler as usize].package_uj, 40);
    assert_eq!(interval[Role::Other as usize].package_uj, 300 + 7);
    assert_eq!(sums.groups, interval, "the first interval's sums are it");
    let by_path = |path: &str| {
        sums.cgroups
            .reports(None, 1_000_000_000, &carbon())
            .into_iter()
            .find(|c| c.path == path)
            .unwrap_or_else(|| panic!("no cgroup {path}"))
    };
    let (ra, rb) = (by_path("/a.slice"), by_path("/b.slice"));
    assert_eq!(ra.on_cpu_ns, 750);
    assert_eq!(rb.on_cpu_ns, 250 + 100);
    assert_eq!(ra.energy.package_j, 750e-6);
    assert_eq!(rb.energy.package_j, 590e-6);
    // With no cgroup known, energy is in cgroup 0, which has no path.
    assert_eq!(by_path("id:0").energy.package_j, 7e-6);
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn cgroups_not_run_for_two_minutes_fold_into_their_path_and_their_sums_stay() {
    let dir = temp_dir("prune");
    let root = dir.join("cgroup");
    let (old, live, idle) = (
        cgroup(&root, "old.scope"),
        cgroup(&root, "live.scope"),
        cgroup(&root, "idle.service"),
    );
    let mut c = cgroups::Cgroups::new(Some(&root), &runtimes(&dir));
    for (id, cgroup_id) in [(1, old), (2, live), (3, idle)] {
        c.add_energy(None, cgroup_id, &package(100 * id));
        c.add_time(&[usage(id, Role::Other, cgroup_id, 10)], 1_000);
    }
    c.name(1_000);
    let before = c.reports(None, 1, &carbon());
    // Three minutes on: `idle` has a live process (kept); `old` has none.
    c.prune(181_000_000_000, [idle].into_iter());
    assert!(!c.holds(&old) && !c.holds(&live), "pruned");
    assert!(c.holds(&idle), "a live process's cgroup is kept");
    let paths: Vec<&String> = c.pruned_paths().collect();
    assert_eq!(paths.len(), 2, "{paths:?}");
    // Per-path figures are unchanged by it.
    let after = c.reports(None, 1, &carbon());
    let key = |r: &crate::model::CgroupReport| (r.path.clone(), r.on_cpu_ns, r.energy.total_j);
    let (mut b, mut a): (Vec<_>, Vec<_>) = (
        before.iter().map(key).collect(),
        after.iter().map(key).collect(),
    );
    b.sort_by(|x, y| x.0.cmp(&y.0));
    a.sort_by(|x, y| x.0.cmp(&y.0));
    assert_eq!(a, b);
    // Only cgroups that ran since a time are reported for it.
    assert!(c.reports(Some(2_000), 1, &carbon()).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn memory_is_read_at_most_once_a_second_and_monitor_reads_each_every_10_s_at_most_20_a_second() {
    let dir = temp_dir("memory");
    let smaps = |pid: u32, pss_kb: u64| {
        let d = dir.join(pid.to_string());
        std::fs::create_dir_all(&d).expect("proc dir");
        std::fs::write(
            d.join("smaps_rollup"),
            format!("Pss: {pss_kb} kB\nPrivate_Clean: 1 kB\nPrivate_Dirty: 2 kB\n"),
        )
        .expect("smaps_rollup");
    };
    let procfs = ProcFs::at(dir.clone());
    let rows: Vec<memory::Row> = (1..=30)
        .map(|pid| {
            smaps(pid, 100);
            memory::Row {
                id: u64::from(pid),
                pid,
                exited: pid == 30,
                gpu_bytes: u64::from(pid),
            }
        })
        .collect();
    let mut m = memory::Memory::default();
    // `run`: every process read, but an exited one has no memory.
    let first: Vec<memory::Row> = rows[..3].iter().chain(&rows[29..]).copied().collect();
    let got = m.read(&first, &procfs, false, 1_000);
    assert!(
        got[..3]
            .iter()
            .all(|g| g.map(|g| g.pss_bytes) == Some(100 * 1024))
    );
    assert_eq!(got[3], None, "exited");
    smaps(1, 500);
    // Within the second: the last reading, not a new one.
    let got = m.read(&rows[..1], &procfs, false, 500_000_000);
    assert_eq!(got[0].map(|g| g.pss_bytes), Some(100 * 1024));
    // A second on: read again, and the peak follows.
    let got = m.read(&rows[..1], &procfs, false, 1_000_001_000);
    assert_eq!(
        got[0].map(|g| (g.pss_bytes, g.uss_bytes)),
        Some((500 * 1024, 3 * 1024))
    );
    assert_eq!(m.peak(1).peak_pss_bytes, 500 * 1024);
    assert_eq!(m.peak(2).peak_gpu_bytes, 2);
    // `monitor`: of 29 live rows, 20 are read (those never read first),
    // the rest show their last reading or none.
    let mut m = memory::Memory::default();
    let got = m.read(&rows, &procfs, true, 5_000_000_000);
    assert_eq!(got.iter().filter(|g| g.is_some()).count(), 20);
    assert!(got[29].is_none(), "exited");
    // The next second reads the 9 it could not, before any read again.
    let got = m.read(&rows, &procfs, true, 6_000_000_000);
    assert_eq!(got.iter().filter(|g| g.is_some()).count(), 29);
    // Each is read again only 10 s after its last read: until then its
    // last reading, though the file changed.
    smaps(2, 700);
    let pss = |got: &[Option<crate::process::Memory>]| got[1].map(|g| g.pss_bytes);
    let got = m.read(&rows, &procfs, true, 14_999_000_000);
    assert_eq!(pss(&got), Some(100 * 1024));
    let got = m.read(&rows, &procfs, true, 15_000_000_000);
    assert_eq!(pss(&got), Some(700 * 1024));
    assert_eq!(m.peak(2).peak_pss_bytes, 700 * 1024);
    m.forget(|id| id != 1);
    assert_eq!(m.peak(1), crate::model::MemoryReport::default());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn slurm_jobs_on_v1_hierarchies_are_summed_per_job_and_step() {
    // This VM's hybrid host: the jobs' processes are at the cgroup2 root,
    // and their steps on the freezer and cpuset hierarchies only.
    let dir = temp_dir("jobs");
    let root = dir.join("cgroup");
    std::fs::create_dir_all(&root).expect("cgroup root");
    let root_id = std::fs::metadata(&root).expect("root").ino();
    let proc_cgroup = |pid: u32, text: &str| {
        let d = dir.join("proc").join(pid.to_string());
        std::fs::create_dir_all(&d).expect("proc dir");
        std::fs::write(d.join("cgroup"), text).expect("cgroup file");
    };
    let step = |job: u32, step: &str| {
        format!(
            "12:cpu,cpuacct:/\n6:freezer:/slurm_vm/uid_0/job_{job}/step_{step}\n\
             3:cpuset:/slurm_vm/uid_0/job_{job}/step_{step}\n1:name=systemd:/user.slice\n0::/\n"
        )
    };
    proc_cgroup(1, &step(1, "batch"));
    proc_cgroup(2, &step(2, "batch"));
    proc_cgroup(3, &step(2, "0").replace("step_0\n", "step_0/task_0\n"));
    proc_cgroup(4, "1:name=systemd:/user.slice\n0::/\n");
    let procfs = ProcFs::at(dir.join("proc"));
    let mut c = cgroups::Cgroups::new(Some(&root), &runtimes(&dir));
    let start_ns = 5_000_000_000;
    for (at_ns, mul) in [(6_000_000_000, 1), (7_000_000_000, 2)] {
        let mut usage: Vec<IntervalUsage> = (1..=4)
            .map(|id| usage(id, Role::Other, root_id, 100 * id))
            .collect();
        c.v1_cgroups(&mut usage, &procfs, |_| cgroups::Lineage::default());
        for u in &usage {
            c.add_energy(Some(u), u.cgroup_id, &package(1_000_000 * u.id * mul));
        }
        c.add_time(&usage, at_ns);
    }
    let jobs = c.job_reports(None, start_ns, 2_000_000_000, &carbon());
    /// Job id, uid, CPU ns, package J, and each step's name and J.
    type Job = (String, Option<u32>, u64, f64, Vec<(String, f64)>);
    let got: Vec<Job> = jobs
        .iter()
        .map(|j| {
            (
                j.job_id.clone(),
                j.uid,
                j.on_cpu_ns,
                j.energy.package_j,
                j.steps
                    .iter()
                    .map(|s| (s.step.clone(), s.energy.package_j))
                    .collect(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (
                "2".to_string(),
                Some(0),
                1000,
                15.0,
                vec![("0".to_string(), 9.0), ("batch".to_string(), 6.0)]
            ),
            (
                "1".to_string(),
                Some(0),
                200,
                3.0,
                vec![("batch".to_string(), 3.0)]
            ),
        ],
        "most energy first, steps too; a task's cgroup is its step's"
    );
    let j = &jobs[1];
    assert_eq!(
        (j.scheduler.as_str(), j.first_ns, j.last_ns),
        ("slurm", 1_000_000_000, 2_000_000_000)
    );
    assert_eq!(
        j.steps[0].cgroups,
        vec!["/slurm_vm/uid_0/job_1/step_batch".to_string()]
    );
    assert_eq!(j.user.as_deref(), crate::process::user_name(0).as_deref());
    // Not a job: the user slice's process.
    assert_eq!(jobs.len(), 2);
    // Only jobs that ran since a time are reported for it.
    assert!(
        c.job_reports(Some(7_000_000_001), start_ns, 1, &carbon())
            .is_empty()
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn where_slurm_is_on_v1_a_job_s_processes_are_found_off_the_root_and_after_a_late_move() {
    // A systemd hybrid host: a job's processes stay in slurmd's unit in the
    // unified tree; one is read before Slurm moved it into the job.
    let dir = temp_dir("jobs-off-root");
    let root = dir.join("cgroup");
    let (unit, docker) = (
        cgroup(&root, "system.slice/slurmd.service"),
        cgroup(&root, "system.slice/docker-0123456789ab.scope"),
    );
    let procs = dir.join("proc");
    let write = |pid: u32, text: &str| {
        let d = procs.join(pid.to_string());
        std::fs::create_dir_all(&d).expect("proc dir");
        std::fs::write(d.join("cgroup"), text).expect("cgroup file");
    };
    let job = "4:freezer:/slurm/uid_5/job_9/step_0\n0::/system.slice/slurmd.service\n";
    write(5, job);
    write(
        6,
        "4:freezer:/slurm/system\n0::/system.slice/slurmd.service\n",
    );
    write(
        7,
        "4:freezer:/\n0::/system.slice/docker-0123456789ab.scope\n",
    );
    for (pid, uid, cmdline) in [
        (2u32, 0u32, &b"slurmstepd: [9.0]\0"[..]),
        (6, 5, b"a.out\0"),
    ] {
        let d = procs.join(pid.to_string());
        std::fs::create_dir_all(&d).expect("proc dir");
        std::fs::write(
            d.join("status"),
            format!("Uid:\t{uid}\t{uid}\t{uid}\t{uid}\n"),
        )
        .expect("status");
        std::fs::write(d.join("cmdline"), cmdline).expect("cmdline");
    }
    let procfs = ProcFs::at(procs.clone());
    let mut c = cgroups::Cgroups::new(Some(&root), &runtimes(&dir));
    c.set_batch_v1(true);
    for (at_ns, moved) in [(1_000_000_000, false), (2_000_000_000, true)] {
        if moved {
            write(6, job);
        }
        let mut usage = vec![
            usage(5, Role::Other, unit, 10),
            usage(6, Role::Other, unit, 10),
            usage(7, Role::Other, docker, 10),
        ];
        // 6 is under a root slurmstepd of the same step: its cgroups
        // still get the first reads (it is found at its late move, under
        // its cgroup's path), not its slurmstepd's title.
        c.v1_cgroups(&mut usage, &procfs, |id| cgroups::Lineage {
            parent: (id == 6).then_some(2),
            stepds: if id == 6 { vec![2] } else { vec![] },
            again: false,
        });
        for u in &usage {
            c.add_energy(Some(u), u.cgroup_id, &package(1_000_000));
        }
        c.add_time(&usage, at_ns);
    }
    c.name(2_000_000_000);
    let jobs = c.job_reports(None, 0, 2_000_000_000, &carbon());
    assert_eq!(jobs.len(), 1, "{jobs:?}");
    // 5 both intervals; 6 once it was moved.
    assert_eq!(
        (jobs[0].job_id.as_str(), jobs[0].energy.package_j),
        ("9", 3.0)
    );
    // The container process keeps its own cgroup.
    let reports = c.reports(None, 1, &carbon());
    let docker_j = reports
        .iter()
        .find(|r| r.path.contains("docker-"))
        .map(|r| r.energy.package_j);
    assert_eq!(docker_j, Some(2.0), "{reports:?}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// The ancestry of the processes of
/// [`jobs_without_cgroups_are_named_by_their_slurmstepd_and_a_child_gone_at_once_by_its_parent`]:
/// its parent and the `slurmstepd`s above it.
fn stepd_fixture_lineage(id: u64) -> cgroups::Lineage {
    let (parent, stepds) = match id {
        5 => (2, vec![2]),
        10 => (5, vec![2]),
        6 => (3, vec![3]),
        7 => (1, vec![3]),
        8 => (4, vec![4]),
        11 => (8, vec![4]),
        // Under the user's "slurmstepd" inside job 9's batch step: the
        // root one above it names the job.
        12 => (4, vec![4, 2]),
        _ => (1, vec![]),
    };
    cgroups::Lineage {
        parent: Some(parent),
        stepds,
        again: false,
    }
}

#[test]
fn jobs_without_cgroups_are_named_by_their_slurmstepd_and_a_child_gone_at_once_by_its_parent() {
    // Slurm with proctrack/linuxproc: the jobs' processes stay in
    // slurmd's unit; only the slurmstepd above them names the job.
    let dir = temp_dir("jobs-stepd");
    let root = dir.join("cgroup");
    let unit = cgroup(&root, "system.slice/slurmd.service");
    let v2_step = cgroup(&root, "system.slice/slurmstepd.scope/job_4/step_0");
    let procs = dir.join("proc");
    let write = |pid: u32, cgroup: &str, uid: u32, cmdline: &[u8]| {
        let d = procs.join(pid.to_string());
        std::fs::create_dir_all(&d).expect("proc dir");
        std::fs::write(d.join("cgroup"), cgroup).expect("cgroup file");
        let status = format!("Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\n");
        std::fs::write(d.join("status"), status).expect("status file");
        std::fs::write(d.join("cmdline"), cmdline).expect("cmdline file");
    };
    let in_unit = "0::/system.slice/slurmd.service\n";
    // Root's slurmstepds of job 9's batch step and step 0; a user's
    // process named slurmstepd, titled as job 9's batch step.
    write(2, in_unit, 0, b"slurmstepd: [9.batch]\0\0");
    write(3, in_unit, 0, b"slurmstepd: [9.0]\0");
    write(4, in_unit, 1000, b"slurmstepd: [9.batch]\0");
    write(5, in_unit, 5, b"/bin/sh\0job.sh\0");
    write(6, in_unit, 5, b"./a.out\0");
    // In a v2 job's cgroup: the cgroup says.
    write(
        7,
        "0::/system.slice/slurmstepd.scope/job_4/step_0\n",
        5,
        b"x\0",
    );
    // Under the user's fake slurmstepd: no job.
    write(8, in_unit, 1000, b"burn\0");
    write(12, in_unit, 5, b"b.out\0");
    // 10 and 11 are gone before they were read (no /proc entry): 10's
    // parent is 5 (in job 9), 11's is 8 (in none).
    let procfs = ProcFs::at(procs.clone());
    let mut c = cgroups::Cgroups::new(Some(&root), &runtimes(&dir));
    let lineage = stepd_fixture_lineage;
    let looked = std::cell::Cell::new(0);
    for at_ns in [1_000_000_000, 2_000_000_000] {
        let mut usage = vec![
            usage(10, Role::Other, unit, 10),
            usage(5, Role::Other, unit, 10),
            usage(6, Role::Other, unit, 10),
            usage(7, Role::Other, v2_step, 10),
            usage(8, Role::Other, unit, 10),
            usage(11, Role::Other, unit, 10),
            usage(12, Role::Other, unit, 10),
        ];
        // 10 and 11 ran in the first interval only.
        if at_ns > 1_000_000_000 {
            usage.retain(|u| u.id != 10 && u.id != 11);
        }
        c.v1_cgroups(&mut usage, &procfs, |id| {
            looked.set(looked.get() + 1);
            lineage(id)
        });
        for u in &usage {
            c.add_energy(Some(u), u.cgroup_id, &package(1_000_000));
        }
        c.add_time(&usage, at_ns);
    }
    // Each process's lineage looked at once, not each interval.
    assert_eq!(looked.get(), 7);
    c.name(2_000_000_000);
    let jobs = c.job_reports(None, 0, 2_000_000_000, &carbon());
    /// Job id, package J, and each step's name and J.
    type Job = (String, f64, Vec<(String, f64)>);
    let got: Vec<Job> = jobs
        .iter()
        .map(|j| {
            let steps = j.steps.iter().map(|s| (s.step.clone(), s.energy.package_j));
            (j.job_id.clone(), j.energy.package_j, steps.collect())
        })
        .collect();
    // Job 9: 5, 6 and 12 twice, and 10 (gone, its parent's) once; job 4
    // by its cgroup; 8 and 11 (under a user's "slurmstepd" only) in none.
    assert_eq!(
        got,
        vec![
            (
                "9".to_string(),
                7.0,
                vec![("batch".to_string(), 5.0), ("0".to_string(), 2.0)]
            ),
            ("4".to_string(), 2.0, vec![("0".to_string(), 2.0)]),
        ]
    );
    assert_eq!(jobs[0].uid, Some(5));
    assert_eq!(
        jobs[0].steps[0].cgroups,
        vec!["slurmstepd:/slurm/uid_5/job_9/step_batch".to_string()]
    );
    assert_eq!(
        jobs[1].steps[0].cgroups,
        vec!["/system.slice/slurmstepd.scope/job_4/step_0".to_string()]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
