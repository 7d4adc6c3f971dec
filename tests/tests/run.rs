//! `wattprof run` against the kernel's own accounting. Needs root; run with
//! `--test-threads=1` (the tests measure CPU time and share the kernel).

use wattprof_tests::{rel_err, require_ebpf, subtree_ns, testload_bin, u, wattprof_run};

fn testload() -> String {
    testload_bin().to_string_lossy().into_owned()
}

/// Per CPU: busy + idle + lost is the CPU's accounting window, the window
/// is the run's wall time within 0.1%, and the idle time (what the scheduler
/// charged to no task) agrees with the kernel's own idle time, counted
/// independently: the idle task's time between context switches (switch
/// tracker) or `/proc/stat`'s idle (iterator tracker, in 10 ms ticks).
///
/// Switch tracker, per CPU: they differ because the scheduler charges a
/// woken task from its wakeup, not from the switch (about 6 us per wakeup
/// in a VM, 0.2% of CPU time in a 2,000-process storm). Measured on the
/// project's VM over repeated runs: up to 0.56% in the 2,000-process storm
/// and 0.59% in the 0.5 s full-map run, so the bound is 1% of the window (a
/// mis-charged slice or a lost window shows up as several percent).
///
/// Iterator tracker, per package: a thread's time since the last read goes
/// to the CPU it was read on (it may have run on another CPU of the
/// package), so only the package's busy time is exact; compared over the
/// package, within 1% of its CPUs' windows (measured: up to 0.1%).
fn assert_cpu_time_closes(report: &serde_json::Value) {
    let wall = u(report, "/wall_ns");
    let per_cpu = report["machine"]["per_cpu"].as_array().expect("per_cpu");
    for cpu in per_cpu {
        let (busy, idle, lost, window) = (
            u(cpu, "/busy_ns"),
            u(cpu, "/idle_ns"),
            u(cpu, "/lost_ns"),
            u(cpu, "/window_ns"),
        );
        // Equal but for the scheduler clock vs CLOCK_MONOTONIC (ppm).
        let closure = rel_err(busy + idle + lost, window);
        assert!(
            closure < 0.001,
            "cpu {cpu}: busy + idle + lost vs window {closure}"
        );
        let err = rel_err(window, wall);
        assert!(
            err < 0.001,
            "cpu {cpu}: window {window} vs wall {wall} ({err:.5})"
        );
    }
    let iter = report["profiler"]["tracker"] == "iter";
    let groups: Vec<Vec<&serde_json::Value>> = if iter {
        let packages = per_cpu.iter().map(|c| u(c, "/socket")).max().unwrap_or(0);
        (0..=packages)
            .map(|p| per_cpu.iter().filter(|c| u(c, "/socket") == p).collect())
            .collect()
    } else {
        per_cpu.iter().map(|c| vec![c]).collect()
    };
    for group in groups {
        let sum = |key: &str| group.iter().map(|c| u(c, key)).sum::<u64>();
        let (idle, idle_task, window) = (sum("/idle_ns"), sum("/idle_task_ns"), sum("/window_ns"));
        let gap = (idle as f64 - idle_task as f64).abs() / window as f64;
        let cpus: Vec<u64> = group.iter().map(|c| u(c, "/cpu")).collect();
        eprintln!(
            "cpus {cpus:?}: idle {idle} ns, kernel idle {idle_task} ns, gap {:.4}% of window",
            gap * 100.0
        );
        assert!(
            gap < 0.01,
            "cpus {cpus:?}: idle vs kernel idle gap {gap:.5}"
        );
    }
}

#[test]
fn cpu_bound_child_matches_its_schedstat() {
    require_ebpf!();
    let run = wattprof_run(&[], &[&testload(), "burn", "2", "1.0"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let truth = &run.stdout_json()[0];
    let pid = u(truth, "/pid");
    let schedstat = u(truth, "/schedstat_ns");
    let report = run.report();
    let measured = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .map(|p| u(p, "/on_cpu_ns"))
        .expect("burner in report");
    let err = rel_err(measured, schedstat);
    eprintln!(
        "burner: wattprof {measured} ns, schedstat {schedstat} ns, error {:.4}%",
        err * 100.0
    );
    assert!(err < 0.005, "error {err}");
    assert_eq!(u(report, "/command/exit_code"), 0);
    assert_cpu_time_closes(report);
}

fn three_programs(extra: &[&str]) {
    let run = wattprof_run(extra, &[&testload(), "orchestrate"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    let truths = run.stdout_json();
    assert_eq!(truths.len(), 3, "orchestrator output: {truths:?}");
    for t in &truths {
        let pid = u(t, "/pid");
        let truth = u(t, "/rusage_ns");
        let measured = subtree_ns(report, pid);
        let err = rel_err(measured, truth);
        eprintln!(
            "{}: wattprof {measured} ns, wait4 rusage {truth} ns, error {:.4}%",
            t["name"],
            err * 100.0
        );
        assert!(err < 0.01, "{}: error {err}", t["name"]);
    }
    let shorts = report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .filter(|p| p["comm"] == "wp-short")
        .filter(|p| p["exit_ns"].as_u64().is_some() && p["start_ns"].as_u64().is_some())
        .count();
    assert_eq!(shorts, 2000, "short-lived processes named wp-short");
    assert_eq!(u(report, "/lost_ns"), 0);
    assert_eq!(u(report, "/profiler/events_lost"), 0);
    assert_cpu_time_closes(report);
    // Every task nanosecond the kernel counted is in some process (tree,
    // wattprof, rest of the machine).
    assert_eq!(
        u(report, "/machine/attributed_ns"),
        u(report, "/machine/busy_ns")
    );
}

#[test]
fn three_programs_at_once_match_wait4_rusage_and_every_short_process_is_named() {
    require_ebpf!();
    three_programs(&["--tracker", "iter"]);
}

#[test]
fn three_programs_at_once_with_the_switch_tracker() {
    require_ebpf!();
    three_programs(&["--tracker", "switch"]);
}

#[test]
fn exit_tracepoint_path_older_kernels_is_as_exact() {
    require_ebpf!();
    three_programs(&["--legacy-exit-tracking"]);
}

#[test]
fn full_task_map_reports_lost_time_equal_to_what_was_not_attributed() {
    require_ebpf!();
    let run = wattprof_run(
        &["--tracker", "switch", "--max-tasks", "16"],
        &[&testload(), "threads", "64", "0.5"],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let r = run.report();
    let lost = u(r, "/lost_ns");
    assert!(lost > 0, "a 16-entry map on a live machine must overflow");
    assert_eq!(u(r, "/machine/attributed_ns"), u(r, "/machine/busy_ns"));
    let window = u(r, "/machine/window_ns");
    let unattributed = window - u(r, "/machine/idle_ns") - u(r, "/machine/attributed_ns");
    let err = rel_err(unattributed, lost);
    eprintln!(
        "lost {lost} ns, window - idle - attributed = {unattributed} ns ({:.4}%)",
        err * 100.0
    );
    assert!(err < 0.001, "lost vs unattributed: {err}");
    assert!(
        run.stderr().contains("not recorded"),
        "table warns: {}",
        run.stderr()
    );
    assert_cpu_time_closes(r);
}

/// The iterator tracker with a filter map too small for the machine's
/// threads: those it cannot hold are read at every interval, so nothing is
/// lost, and the report says how many there were.
#[test]
fn full_filter_map_reads_more_and_loses_nothing() {
    require_ebpf!();
    let run = wattprof_run(
        &["--tracker", "iter", "--max-tasks", "16"],
        &[&testload(), "threads", "64", "0.5"],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let r = run.report();
    assert_eq!(r["profiler"]["tracker"], "iter");
    let overflow = u(r, "/profiler/filter_overflow");
    eprintln!("filter overflow: {overflow} threads");
    assert!(
        overflow > 0,
        "a 16-entry filter on a live machine must overflow"
    );
    assert_eq!(u(r, "/lost_ns"), 0);
    assert_eq!(u(r, "/machine/attributed_ns"), u(r, "/machine/busy_ns"));
    assert!(
        run.stderr().contains("read at every interval"),
        "table says so: {}",
        run.stderr()
    );
    assert_cpu_time_closes(r);
}

#[test]
fn kernel_memory_matches_the_documented_formula() {
    require_ebpf!();
    use wattprof::tracker::TrackerKind;
    for (tracker, kind) in [("iter", TrackerKind::Iter), ("switch", TrackerKind::Switch)] {
        for max_tasks in ["65536", "4096"] {
            let run = wattprof_run(&["--tracker", tracker, "--max-tasks", max_tasks], &["true"]);
            assert!(run.output.status.success(), "{}", run.stderr());
            let measured = u(run.report(), "/profiler/kernel_memory_bytes");
            let cpus = u(run.report(), "/machine/cpus");
            let estimate = wattprof::tracker::kernel_memory_estimate(
                kind,
                cpus,
                max_tasks.parse().expect("n"),
            );
            let err = rel_err(estimate, measured);
            eprintln!(
                "{tracker}, max-tasks {max_tasks}: kernel {measured} B, formula {estimate} B ({:.3}%)",
                err * 100.0
            );
            assert!(err < 0.01, "formula off by {err}");
        }
    }
}

/// execve from a non-leader thread: the kernel gives that thread the
/// leader's tid and the dying leader the thread's. Each thread's time must
/// still be its own, counted once.
fn exec_from_thread(extra: &[&str]) {
    let run = wattprof_run(extra, &[&testload(), "thread-exec"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let truth = &run.stdout_json()[0];
    let (pid, ns) = (u(truth, "/pid"), u(truth, "/rusage_ns"));
    let measured = subtree_ns(run.report(), pid);
    let err = rel_err(measured, ns);
    eprintln!(
        "exec from a thread: wattprof {measured} ns, wait4 rusage {ns} ns, error {:.4}%",
        err * 100.0
    );
    assert!(err < 0.01, "error {err}");
    assert_eq!(
        u(run.report(), "/machine/attributed_ns"),
        u(run.report(), "/machine/busy_ns")
    );
}

#[test]
fn exec_from_a_non_leader_thread_keeps_each_threads_time() {
    require_ebpf!();
    exec_from_thread(&[]);
}

#[test]
fn exec_from_a_non_leader_thread_on_the_exit_tracepoint_path() {
    require_ebpf!();
    exec_from_thread(&["--legacy-exit-tracking"]);
}

/// Kernels without BTF: slices are timed between context switches. Task
/// time, the idle task and lost time then tile every CPU's window exactly.
#[test]
fn switch_timing_path_for_kernels_without_btf() {
    require_ebpf!();
    let run = wattprof_run(&["--switch-timing"], &[&testload(), "burn", "2", "1.0"]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    assert_eq!(report["profiler"]["task_clock"], "switch_timing");
    let truth = &run.stdout_json()[0];
    let pid = u(truth, "/pid");
    let measured = subtree_ns(report, pid);
    let err = rel_err(measured, u(truth, "/schedstat_ns"));
    eprintln!("switch timing: burner error {:.4}%", err * 100.0);
    assert!(err < 0.005, "error {err}");
    for cpu in report["machine"]["per_cpu"].as_array().expect("per_cpu") {
        let tiled = u(cpu, "/busy_ns") + u(cpu, "/idle_task_ns") + u(cpu, "/lost_ns");
        assert_eq!(tiled, u(cpu, "/window_ns"), "cpu {cpu}");
    }
    assert_eq!(
        u(report, "/machine/attributed_ns"),
        u(report, "/machine/busy_ns")
    );
}
