//! The table `wattprof run` prints when the command ends.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::{
    EnergyView, Measured, TOP_ROWS, pct, render_containers, render_energy, render_functions,
    render_jobs, secs,
};
use crate::model::{EnergyJ, RunReport};
use crate::sources::Domain;

/// Which process rows the final table shows, and how.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Rows {
    /// Every process on its own row (`--all`).
    pub(crate) all: bool,
    /// Each row ends with its command line (`--cmdline`).
    pub(crate) cmdline: bool,
    /// Every detail and note (`--verbose`).
    pub(crate) verbose: bool,
}

/// Renders the end-of-run table. Shares are of all CPU time in the run
/// (every CPU's window: busy + idle + lost).
pub(crate) fn render_run_table(r: &RunReport, rows: Rows) -> String {
    let mut s = String::new();
    let m = match &r.served {
        Some(served) => Measured::of_domains(&served.domains),
        None => Measured::of(&r.energy.domains),
    };
    let tree_procs = run_header(&mut s, r, &m, rows.cmdline);
    run_processes(&mut s, r, &m, rows);
    match &r.served {
        Some(served) => run_served(&mut s, r, &m, tree_procs, served),
        None => run_groups(&mut s, r, &m, tree_procs),
    }
    run_notes(&mut s, r);
    render_containers(&mut s, &r.containers);
    render_jobs(&mut s, &r.jobs);
    render_energy(
        &mut s,
        &EnergyView {
            verbose: rows.verbose,
            ..EnergyView::of(r)
        },
    );
    if let Some(st) = &r.stacks {
        render_functions(&mut s, st, 10);
    }
    s
}

/// The run's first line and the process table's header; the number of
/// processes in the command's tree.
fn run_header(s: &mut String, r: &RunReport, m: &Measured, cmdline: bool) -> usize {
    let (argv, outcome, tree_procs) = match &r.command {
        Some(c) => (
            c.argv.join(" "),
            match (c.exit_code, c.signal) {
                (_, Some(sig)) => format!("was killed by signal {sig}"),
                (Some(code), _) => format!("exited with code {code}"),
                _ => "ended".to_string(),
            },
            c.processes,
        ),
        None => ("the machine".to_string(), "monitored".to_string(), 0),
    };
    let _ = writeln!(
        s,
        "\nwattprof: `{argv}` {outcome} after {:.3} s; {} CPUs, {} package(s); {} tracker",
        secs(r.wall_ns),
        r.machine.cpus,
        r.machine.package_ids.len(),
        match r.profiler.tracker {
            crate::tracker::TrackerKind::Iter => "iterator",
            crate::tracker::TrackerKind::Switch => "switch",
        }
    );
    let _ = writeln!(
        s,
        "\n{:>8} {:>8}  {:<16} {:>10} {:>7}{} {:>9} {:>9}{}",
        "PID",
        "PPID",
        "COMMAND",
        "ON-CPU s",
        "SHARE",
        m.header(),
        "START s",
        "END s",
        if cmdline { "  COMMAND LINE" } else { "" }
    );
    tree_procs
}

/// A process under this share of the CPU time shown, and under
/// [`FOLD_NS`], is folded into its command name's row: a few ms of a shell
/// shim say nothing on a row of their own (its power over its life least
/// of all).
const FOLD_SHARE: f64 = 0.01;
const FOLD_NS: u64 = 50_000_000;

/// The processes with the most CPU time, then the rest folded by name
/// (`all`: every process, on its own row).
fn run_processes(s: &mut String, r: &RunReport, m: &Measured, show: Rows) {
    // A daemon keeps the machine's time to itself: shares are of the tree.
    let total = if r.served.is_some() {
        r.groups.tree_ns
    } else {
        r.machine.window_ns
    };
    let mut procs: Vec<_> = r.processes.iter().collect();
    procs.sort_by(|a, b| b.on_cpu_ns.cmp(&a.on_cpu_ns).then(a.pid.cmp(&b.pid)));
    let shown_ns: u64 = procs.iter().map(|p| p.on_cpu_ns).sum();
    let small = |ns: u64| ns < FOLD_NS && (ns as f64) < FOLD_SHARE * shown_ns as f64;
    let rows = if show.all {
        procs.len()
    } else {
        procs
            .iter()
            .take(TOP_ROWS)
            .take_while(|p| !small(p.on_cpu_ns))
            .count()
    };
    let opt = |t: Option<u64>| t.map_or_else(|| "-".to_string(), |t| format!("{:.3}", secs(t)));
    for p in procs.iter().take(rows) {
        let _ = writeln!(
            s,
            "{:>8} {:>8}  {:<16} {:>10.3} {:>6.1}%{} {:>9} {:>9}{}",
            p.pid,
            p.ppid.map_or_else(|| "-".to_string(), |v| v.to_string()),
            p.comm,
            secs(p.on_cpu_ns),
            pct(p.on_cpu_ns, total),
            m.cells(&p.energy),
            opt(p.start_ns),
            opt(p.exit_ns),
            args_cell(show.cmdline, p.cmdline.as_deref()),
        );
    }
    if procs.len() > rows {
        // Folded by name: how many, their CPU time and energy together.
        let mut by_name: BTreeMap<&str, (usize, u64, f64)> = BTreeMap::new();
        for p in &procs[rows..] {
            let e = by_name.entry(p.comm.as_str()).or_default();
            e.0 += 1;
            e.1 += p.on_cpu_ns;
            e.2 += p.energy.total_j;
        }
        let mut rest: Vec<_> = by_name.into_iter().collect();
        rest.sort_by_key(|r| std::cmp::Reverse(r.1.1));
        let line = |s: &mut String, name: &str, n: usize, ns: u64, j: f64| {
            let _ = writeln!(
                s,
                "{:>8} {:>8}  {:<16} {:>10.3} {:>6.1}%   ({n} {}, {j:.3} J together)",
                "+",
                "",
                name,
                secs(ns),
                pct(ns, total),
                if n == 1 { "process" } else { "processes" }
            );
        };
        for (name, (n, ns, j)) in rest.iter().take(5) {
            line(s, name, *n, *ns, *j);
        }
        if rest.len() > 5 {
            let (n, ns, j) = rest[5..]
                .iter()
                .fold((0, 0, 0.0), |(a, b, c), (_, (n, ns, j))| {
                    (a + n, b + ns, c + j)
                });
            line(s, "(other names)", n, ns, j);
        }
        let _ = writeln!(s, "{:>8}   (--all shows every process)", "");
    }
}

/// The command line at a row's end (`--cmdline`): `-` where it was not
/// read (gone before it, or outside `run`'s tree without `--cmdline`).
pub(crate) fn args_cell(shown: bool, args: Option<&str>) -> String {
    if shown {
        format!("  {}", args.unwrap_or("-"))
    } else {
        String::new()
    }
}

/// The groups every process is in, idle and unattributed energy, and all
/// CPU time.
fn run_groups(s: &mut String, r: &RunReport, m: &Measured, tree_procs: usize) {
    let total = r.machine.window_ns;
    let sum = |d: Domain, f: fn(&crate::model::DomainReport) -> f64| -> f64 {
        r.energy
            .domains
            .iter()
            .filter(|x| x.domain == d)
            .map(f)
            .sum()
    };
    let idle = EnergyJ {
        package_j: sum(Domain::Package, |x| x.idle_j),
        dram_j: sum(Domain::Dram, |x| x.idle_j),
        gpu_j: sum(Domain::Gpu, |x| x.idle_j),
        ..EnergyJ::default()
    };
    let lost = EnergyJ {
        package_j: sum(Domain::Package, |x| x.unattributed_j),
        dram_j: sum(Domain::Dram, |x| x.unattributed_j),
        gpu_j: sum(Domain::Gpu, |x| x.unattributed_j),
        ..EnergyJ::default()
    };
    let g = &r.energy.groups;
    let mut rows = vec![
        (
            "wattprof itself".to_string(),
            r.groups.profiler_ns,
            g.profiler,
        ),
        (
            "rest of the machine".to_string(),
            r.groups.other_ns,
            g.other,
        ),
        ("idle".to_string(), r.machine.idle_ns, idle),
        // Its time is the CPU time the tracker lost (not known whose).
        ("unattributed".to_string(), r.lost_ns, lost),
    ];
    if r.command.is_some() {
        rows.insert(
            0,
            (
                format!("command tree ({})", super::processes(tree_procs)),
                r.groups.tree_ns,
                g.tree,
            ),
        );
    }
    let _ = writeln!(s);
    for (label, ns, e) in rows {
        // Idle and unattributed rows have no power or CO2 of their own.
        let cells = if label == "idle" || label == "unattributed" {
            m.energy_cells(&e)
        } else {
            m.cells(&e)
        };
        let _ = writeln!(
            s,
            "  {label:<34} {:>10.3} s {:>6.1}%{cells}",
            secs(ns),
            pct(ns, total)
        );
    }
    // The rows above share all the CPUs' time; the busy part is the
    // same line as `report`'s.
    let _ = writeln!(
        s,
        "{}",
        super::cpu_time_line(r.machine.busy_ns, total, r.machine.cpus, r.wall_ns)
    );
}

/// A tree a daemon measured: its row, where the figures came from, and
/// what is missing.
fn run_served(
    s: &mut String,
    r: &RunReport,
    m: &Measured,
    tree_procs: usize,
    served: &crate::model::ServedReport,
) {
    let _ = writeln!(s);
    let _ = writeln!(
        s,
        "  {:<34} {:>10.3} s {:>6.1}%{}",
        format!("command tree ({})", super::processes(tree_procs)),
        secs(r.groups.tree_ns),
        100.0,
        m.cells(&r.energy.groups.tree)
    );
    let _ = writeln!(
        s,
        "  measured by the wattprof daemon at {} over {} interval(s); the machine's own \
         figures (idle, other users, per domain) stay with the daemon (docs/shared.md)",
        served.daemon, served.intervals
    );
    if served.processes_left_out > 0 {
        let _ = writeln!(
            s,
            "  note: {} processes of the tree are in its totals but not on rows of their own \
             (the daemon keeps {} rows per tree)",
            served.processes_left_out,
            crate::model::SERVED_MAX_ROWS
        );
    }
    for m in &served.missing {
        let _ = writeln!(s, "  warning: {m}");
    }
}

/// What was lost or approximated, and why the switch tracker ran.
fn run_notes(s: &mut String, r: &RunReport) {
    if r.lost_ns > 0 || r.profiler.events_lost > 0 || r.profiler.discarded_ns > 0 {
        let _ = writeln!(
            s,
            "  warning: {:.3} s of task time not recorded, {} events lost, {:.3} s discarded \
             (raise --max-tasks; see docs/limits.md)",
            secs(r.lost_ns),
            r.profiler.events_lost,
            secs(r.profiler.discarded_ns)
        );
    }
    let p = &r.profiler;
    if p.filter_overflow > 0 {
        let _ = writeln!(
            s,
            "  note: {} threads did not fit the tracker's filter and were read at every \
             interval (nothing lost; raise --max-tasks to read less)",
            p.filter_overflow
        );
    }
    // A thread whose free record never came is counted to its exit (at
    // most a scheduler tick short): noted, as the loss it stands for.
    if p.settled_from_exit > 0 || p.vanished_threads > 0 {
        let _ = writeln!(
            s,
            "  note: {} threads ended during a read: their time is counted to their exit (at \
             most one scheduler tick short); {} threads were gone before they were seen (events \
             lost); see docs/limits.md",
            p.settled_from_exit, p.vanished_threads
        );
    }
    if p.ended_unseen > 0 {
        let _ = writeln!(
            s,
            "  note: {} process(es) ended with neither exit nor free record (both lost): named \
             from their fork, time up to their last reading; see docs/limits.md",
            p.ended_unseen
        );
    }
    if let Some(why) = &p.tracker_fallback {
        let _ = writeln!(
            s,
            "  note: the switch tracker ran (it costs every context switch) because {why}"
        );
    }
}
