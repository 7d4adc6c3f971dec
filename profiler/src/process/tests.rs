//! The process table's tests: lineage, lifetimes, cgroups and command
//! lines from synthetic samples.

use super::*;

#[test]
fn a_command_line_is_one_row_and_bounded() {
    let argv = |a: &[&str]| a.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
    assert_eq!(short_args(&[]), None);
    assert_eq!(
        short_args(&argv(&["python3", "-c", "a\nb\tc", "--rank", "3"])).as_deref(),
        Some("python3 -c a b c --rank 3")
    );
    // Cut on a character boundary: 'é' is two bytes.
    let long = short_args(&argv(&[&"é".repeat(150)])).expect("some");
    assert!(long.len() <= ARGS_MAX && long.ends_with("..."), "{long}");
    assert!(long.starts_with("éé"));
}

/// `/proc` as a map: parents and command lines.
struct Args;
impl ProcMeta for Args {
    fn parent_of(&self, _: u32) -> Option<u32> {
        None
    }
    fn args_of(&self, pid: u32) -> Option<String> {
        Some(format!("worker --rank {pid}"))
    }
}

#[test]
fn the_trees_command_lines_are_read_and_others_only_when_asked() {
    let task = |tgid: u32| TaskTime {
        tid: tgid,
        tgid,
        comm: crate::tracker::comm_bytes("w"),
        on_cpu_ns: crate::tracker::PackageNs::from_slice(&[1_000]),
        exit_ns: None,
        cgroup_id: 0,
    };
    let sample = |tasks: Vec<TaskTime>| CpuSample {
        tasks,
        ..CpuSample::default()
    };
    let args = |t: &ProcessTable<Args>, pid: u32| t.get(pid).and_then(|p| p.args.clone());
    // Not asked: nobody's (a command line may hold a secret).
    let mut none = ProcessTable::new(Args, 1, 99);
    none.set_root(10);
    none.apply(&sample(vec![task(10)]));
    assert_eq!(args(&none, 10), None);
    let mut t = ProcessTable::new(Args, 1, 99);
    t.read_args(ArgsOf::Tree);
    t.set_root(10);
    t.apply(&sample(vec![task(10), task(11)]));
    assert_eq!(args(&t, 10).as_deref(), Some("worker --rank 10"));
    assert_eq!(args(&t, 11), None, "not the tree's");
    // A forked child has its parent's line until it execs; at the exec
    // it is read.
    t.apply(&CpuSample {
        events: vec![TaskEvent::Fork {
            ts_ns: 5,
            child: 12,
            parent_tid: 10,
            parent_tgid: 10,
            comm: "w".into(),
        }],
        ..sample(vec![task(12)])
    });
    assert_eq!(args(&t, 12).as_deref(), Some("worker --rank 10"));
    t.apply(&CpuSample {
        events: vec![TaskEvent::Exec {
            ts_ns: 6,
            tid: 12,
            tgid: 12,
            comm: "x".into(),
        }],
        ..sample(vec![task(12)])
    });
    assert_eq!(args(&t, 12).as_deref(), Some("worker --rank 12"));
    let mut all = ProcessTable::new(Args, 1, 99);
    all.read_args(ArgsOf::All);
    all.apply(&sample(vec![task(11)]));
    assert_eq!(args(&all, 11).as_deref(), Some("worker --rank 11"));
}

#[test]
fn smaps_rollup_gives_pss_and_uss() {
    let text = "55d0c0a00000-7ffd1c9d4000 ---p 00000000 00:00 0    [rollup]\n\
                Rss:                5120 kB\n\
                Pss:                2048 kB\n\
                Pss_Anon:           1024 kB\n\
                Shared_Clean:       3072 kB\n\
                Private_Clean:       512 kB\n\
                Private_Dirty:      1024 kB\n\
                Private_Hugetlb:       0 kB\n";
    assert_eq!(
        parse_smaps_rollup(text),
        Some(Memory {
            pss_bytes: 2048 * 1024,
            uss_bytes: 1536 * 1024
        })
    );
    assert_eq!(parse_smaps_rollup(""), None);
    // This test's own process has memory.
    let me = ProcFs::real()
        .memory(std::process::id())
        .expect("own smaps_rollup");
    assert!(me.pss_bytes > 0 && me.uss_bytes > 0 && me.uss_bytes <= me.pss_bytes + 4096);
}

struct NoProc;
impl ProcMeta for NoProc {
    fn parent_of(&self, pid: u32) -> Option<u32> {
        (pid == 500).then_some(1)
    }
}

fn fork(ts: u64, child: u32, parent: u32, comm: &str) -> TaskEvent {
    TaskEvent::Fork {
        ts_ns: ts,
        child,
        parent_tid: parent,
        parent_tgid: parent,
        comm: comm.into(),
    }
}

fn task(tid: u32, tgid: u32, ns: u64, exit: Option<u64>, comm: &str) -> TaskTime {
    TaskTime {
        tid,
        tgid,
        cgroup_id: 1,
        comm: crate::tracker::comm_bytes(comm),
        on_cpu_ns: crate::tracker::PackageNs::from_slice(&[ns, 0]),
        exit_ns: exit,
    }
}

fn sample(at: u64, events: Vec<TaskEvent>, tasks: Vec<TaskTime>) -> CpuSample {
    CpuSample {
        at_ns: at,
        events,
        tasks,
        ..CpuSample::default()
    }
}

#[test]
fn tree_follows_forks_and_threads_fold_into_their_process() {
    let mut t = ProcessTable::new(NoProc, 2, 99);
    t.set_root(100);
    t.apply(&sample(
        10,
        vec![
            fork(1, 100, 99, "wattprof"),
            TaskEvent::Exec {
                ts_ns: 2,
                tid: 100,
                tgid: 100,
                comm: "sh".into(),
            },
            fork(3, 101, 100, "sh"),
            fork(4, 102, 101, "sh"),
            // A thread of 101.
            fork(5, 103, 101, "sh"),
        ],
        vec![
            task(100, 100, 10, None, "sh"),
            task(101, 101, 20, Some(8), "burn"),
            task(103, 101, 5, Some(7), "burn"),
            task(102, 102, 7, None, "short"),
            task(99, 99, 3, None, "wattprof"),
            task(500, 500, 11, None, "other"),
        ],
    ));
    let tree = t.tree();
    let pids: Vec<u32> = tree.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![100, 101, 102]);
    let p101 = t.get(101).expect("101");
    assert_eq!(
        (p101.total_ns(), p101.ppid, p101.exit_ns),
        (25, Some(100), Some(8))
    );
    assert_eq!(p101.comm, "burn");
    assert_eq!(t.get(102).expect("102").ppid, Some(101));
    assert_eq!(t.get(500).expect("500").ppid, Some(1), "from /proc");
    assert_eq!(
        t.totals(),
        &GroupTotals {
            tree_ns: 42,
            profiler_ns: 3,
            other_ns: 11
        }
    );
}

#[test]
fn pid_reused_within_one_interval_is_two_processes() {
    let mut t = ProcessTable::new(NoProc, 2, 99);
    t.set_root(100);
    t.apply(&sample(
        10,
        vec![fork(1, 100, 99, "sh")],
        vec![task(100, 100, 1, None, "sh")],
    ));
    t.apply(&sample(
        20,
        vec![fork(11, 200, 100, "sh"), fork(15, 200, 100, "sh")],
        vec![
            // First 200 exits at 12 (before the reuse at 15); the second
            // is still running at the end of the interval.
            task(200, 200, 30, Some(12), "first"),
            task(200, 200, 4, None, "second"),
        ],
    ));
    let mut two: Vec<&Process> = t.tree().into_iter().filter(|p| p.pid == 200).collect();
    two.sort_by_key(|p| p.start_ns);
    assert_eq!(two.len(), 2);
    assert_eq!(
        (two[0].comm.as_str(), two[0].total_ns(), two[0].exit_ns),
        ("first", 30, Some(12))
    );
    assert_eq!(
        (two[1].comm.as_str(), two[1].total_ns(), two[1].exit_ns),
        ("second", 4, None)
    );
}

#[test]
fn children_of_a_parent_not_seen_yet_stay_in_the_tree() {
    let mut t = ProcessTable::new(NoProc, 2, 99);
    t.set_root(100);
    t.apply(&sample(
        10,
        vec![fork(1, 100, 99, "sh")],
        vec![task(100, 100, 1, None, "sh")],
    ));
    // `n=$(grep x f | wc -l)`: subshell 201 neither execs nor exits in
    // the interval; its children exec and exit before it is seen.
    t.apply(&sample(
        20,
        vec![
            fork(11, 201, 100, "sh"),
            fork(12, 202, 201, "sh"),
            TaskEvent::Exec {
                ts_ns: 13,
                tid: 202,
                tgid: 202,
                comm: "grep".into(),
            },
            fork(14, 203, 201, "sh"),
        ],
        vec![
            task(202, 202, 5, Some(15), "grep"),
            task(203, 203, 6, Some(16), "wc"),
            task(201, 201, 2, None, "sh"),
        ],
    ));
    let pids: Vec<u32> = t.tree().iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![100, 201, 202, 203]);
    assert_eq!(t.totals().tree_ns, 14);
    assert_eq!(t.totals().other_ns, 0);
}

#[test]
fn exited_processes_outside_the_tree_are_folded_and_forgotten() {
    let mut t = ProcessTable::new(NoProc, 2, 99);
    t.set_root(100);
    t.apply(&sample(
        10,
        vec![fork(1, 300, 1, "cron")],
        vec![task(300, 300, 9, Some(5), "cron")],
    ));
    // A thread of it that reports after the exit (a non-leader thread,
    // or the final slice on kernels before 5.18) still lands on it.
    t.apply(&sample(20, vec![], vec![task(301, 300, 4, None, "cron")]));
    let id = t.id_of(300).expect("kept for the late slice");
    assert_eq!(t.by_id(id).map(Process::total_ns), Some(13));
    t.apply(&sample(30, vec![], vec![]));
    t.apply(&sample(40, vec![], vec![]));
    assert!(t.get(300).is_none(), "forgotten a few samples later");
    assert_eq!(t.totals().other_ns, 13);
}

#[test]
fn unmatched_forks_expire() {
    let mut t = ProcessTable::new(NoProc, 1, 99);
    t.apply(&sample(10, vec![fork(1, 700, 1, "x")], vec![]));
    assert_eq!(t.unmatched_forks(), 0);
    t.apply(&sample(PENDING_FORK_TTL_NS + 10, vec![], vec![]));
    assert_eq!(t.unmatched_forks(), 1);
}

#[test]
fn time_in_two_cgroups_in_one_interval_is_kept_per_cgroup() {
    let mut t = ProcessTable::new(NoProc, 2, 99);
    let moved = |cgroup, ns| TaskTime {
        cgroup_id: cgroup,
        ..task(400, 400, ns, None, "svc")
    };
    // The tracker splits a thread's time at a cgroup move: 30 ns in
    // cgroup 7 before it, 12 in cgroup 9 after.
    let usage = t.apply(&sample(10, vec![], vec![moved(7, 30), moved(9, 12)]));
    let u = usage.iter().find(|u| u.pid == 400).expect("usage");
    assert_eq!(u.cgroup_id, 9);
    assert_eq!(u.on_cpu_ns, vec![42, 0]);
    assert_eq!(u.other_cgroups_ns, vec![(7, 30)]);
    // The next interval, in one cgroup: nothing else.
    let usage = t.apply(&sample(20, vec![], vec![moved(9, 5)]));
    assert!(usage[0].other_cgroups_ns.is_empty());
}

#[test]
fn the_user_is_the_effective_uid_in_status() {
    let status = "Name:\tsudo\nUmask:\t0022\nUid:\t1000\t0\t0\t0\nGid:\t1000\t1000\t1000\t1000\n";
    assert_eq!(parse_effective_uid(status), Some(0), "effective, not real");
    assert_eq!(parse_effective_uid("Name:\tx\n"), None);
    assert_eq!(parse_effective_uid("Uid:\t1000\n"), None, "cut short");
    // A live one: this test's own.
    // SAFETY: geteuid has no preconditions.
    let me = unsafe { libc::geteuid() };
    assert_eq!(
        ProcFs::at("/proc".into()).effective_uid(std::process::id()),
        Some(me)
    );
}
