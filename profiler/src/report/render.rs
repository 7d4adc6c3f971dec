//! How `wattprof report` shows what it read: a recording's totals, what a
//! file holds, and two recordings side by side. Drawn with the run
//! table's pieces (`render`), so a report reads like the run it is of.

use std::fmt::Write as _;

use super::compare::{Change, Comparison, Row, Side};
use super::metrics::Metric;
use super::{Format, Summary};
use crate::model::{DomainReport, EnergyJ};
use crate::render::{
    EnergyView, Measured, left_cut, render_containers, render_energy, render_functions,
    render_jobs, secs,
};
use crate::sources::Domain;

/// `wattprof report FILE`: the totals of a recording or stream, in the
/// style of `run`'s table; the `top` processes with the most energy.
pub fn render_summary(r: &Summary, top: usize, cmdline: bool) -> String {
    let mut s = String::new();
    let m = Measured::of(&r.domains);
    summary_header(&mut s, r);
    summary_processes(&mut s, r, &m, top, cmdline);
    summary_groups(&mut s, r, &m);
    render_containers(&mut s, &r.containers);
    render_jobs(&mut s, &r.jobs);
    render_energy(
        &mut s,
        &EnergyView {
            readers: &r.readers,
            domains: &r.domains,
            g_per_kwh: r.carbon_intensity_g_per_kwh,
            carbon_source: &r.carbon_intensity_source,
            problems: &r.problems,
            windows: &r.windows,
            window_errors: &[],
            static_note: r.static_note.as_deref(),
            mig: &r.mig_instances,
            verbose: false,
        },
    );
    if let Some(st) = &r.stacks {
        render_functions(&mut s, st, top.max(10));
    }
    s
}

/// What the file is: the command and how it ended, its length, where
/// a stream was cut, and what a cut stream cannot tell.
fn summary_header(s: &mut String, r: &Summary) {
    let what = match &r.command {
        Some(c) => format!(
            "`{}` {}",
            c.argv.join(" "),
            match (c.exit_code, c.signal) {
                (_, Some(sig)) => format!("was killed by signal {sig}"),
                (Some(code), _) => format!("exited with code {code}"),
                _ if r.format == Format::CutStream =>
                    "ran (exit unknown: the stream was cut)".into(),
                _ => "ended".to_string(),
            }
        ),
        None => "the machine (monitor)".to_string(),
    };
    let _ = writeln!(
        s,
        "\nwattprof report: {what}, {:.3} s, {} intervals\n  {} {} (wattprof {}, started {})",
        secs(r.wall_ns),
        r.intervals,
        r.format.words(),
        r.file,
        r.wattprof_version,
        crate::sink::csv::iso8601_utc(r.start_unix_ns),
    );
    if let Some(cut) = &r.cut {
        let _ = writeln!(
            s,
            "  note: the stream was cut after {} complete line(s){}; the figures below are the \
             sums of its {} interval(s)",
            cut.complete_lines,
            if cut.partial_line_bytes > 0 {
                format!(
                    " and a partial line of {} bytes (dropped)",
                    cut.partial_line_bytes
                )
            } else {
                " (no summary line)".to_string()
            },
            r.intervals
        );
        let _ = writeln!(s, "  not in a cut stream: {}", r.missing.join("; "));
    }
    if r.unknown_lines > 0 {
        let _ = writeln!(
            s,
            "  note: {} line(s) of a record type this wattprof does not know were skipped \
             (written by a newer wattprof?)",
            r.unknown_lines
        );
    }
}

/// The processes with the most energy (`top` of them).
fn summary_processes(s: &mut String, r: &Summary, m: &Measured, top: usize, cmdline: bool) {
    if r.processes.is_empty() {
        let _ = writeln!(s, "\n  (no process rows in the file)");
    }
    if !r.processes.is_empty() {
        let _ = writeln!(
            s,
            "\n{:>8}  {:<16} {:>10}{}{}",
            "PID",
            "COMMAND",
            "ON-CPU s",
            m.header(),
            if cmdline { "  COMMAND LINE" } else { "" }
        );
    }
    for p in r.processes.iter().take(top) {
        let _ = writeln!(
            s,
            "{:>8}  {:<16} {:>10.3}{}{}",
            p.pid,
            p.comm,
            secs(p.on_cpu_ns),
            m.cells(&p.energy),
            crate::render::args_cell(cmdline, p.cmdline.as_deref())
        );
    }
    if r.processes.len() > top {
        let _ = writeln!(
            s,
            "{:>8}  ({} more processes: --top N shows more, --json all)",
            "+",
            r.processes.len() - top
        );
    }
}

/// The groups (the tree, wattprof, the rest), idle and unattributed
/// energy, and the busy CPU time.
fn summary_groups(s: &mut String, r: &Summary, m: &Measured) {
    let sum = |f: fn(&DomainReport) -> f64| -> EnergyJ {
        let of = |d: Domain| r.domains.iter().filter(|x| x.domain == d).map(f).sum();
        EnergyJ {
            package_j: of(Domain::Package),
            dram_j: of(Domain::Dram),
            gpu_j: of(Domain::Gpu),
            ..EnergyJ::default()
        }
    };
    let (t, g) = (&r.group_times, &r.group_energy);
    let mut rows = vec![
        (
            "wattprof itself".to_string(),
            Some(t.profiler_ns),
            g.profiler,
        ),
        ("rest of the machine".to_string(), Some(t.other_ns), g.other),
        ("idle".to_string(), None, sum(|x| x.idle_j)),
        ("unattributed".to_string(), None, sum(|x| x.unattributed_j)),
    ];
    if let Some(c) = &r.command {
        let label = match c.processes {
            Some(n) => format!("command tree ({})", crate::render::processes(n)),
            None => "command tree".to_string(),
        };
        rows.insert(0, (label, Some(t.tree_ns), g.tree));
    }
    let _ = writeln!(s);
    for (label, ns, e) in rows {
        let (time, cells) = match ns {
            Some(ns) => (format!("{:>10.3} s", secs(ns)), m.cells(&e)),
            // Idle and unattributed energy have no time, power or CO2 here.
            None => (format!("{:>12}", ""), m.energy_cells(&e)),
        };
        let _ = writeln!(s, "  {label:<34} {time}{cells}");
    }
    if let (Some(cpus), Some(window)) = (r.machine.cpus, r.machine.window_ns) {
        let _ = writeln!(
            s,
            "{}",
            crate::render::cpu_time_line(r.machine.busy_ns, window, cpus, r.wall_ns)
        );
    }
}

/// `report --metrics`: what the file holds.
pub fn render_metrics(file: &str, metrics: &[Metric]) -> String {
    let mut s = format!("\n{file} holds:\n\n");
    let _ = writeln!(
        s,
        "  {:<56} {:<13} {:<28} HOW MUCH",
        "WHERE", "UNIT", "AIPOWERMETER"
    );
    for m in metrics {
        let _ = writeln!(
            s,
            "  {:<56} {:<13} {:<28} {}\n      {}",
            m.path,
            m.unit,
            m.aipowermeter.unwrap_or("-"),
            m.present,
            m.meaning
        );
    }
    if metrics.is_empty() {
        let _ = writeln!(
            s,
            "  (no figures: the profile ended before its first interval)"
        );
    }
    s
}

/// `report A B`: B against the baseline A.
pub(crate) fn render_comparison(c: &Comparison) -> String {
    let mut s = String::new();
    let name = |side: &Side| match &side.argv {
        Some(a) => format!("{} (`{}`)", side.file, a.join(" ")),
        None => format!("{} ({})", side.file, side.mode),
    };
    let _ = writeln!(
        s,
        "\nwattprof report: B against the baseline A\n  A: {}\n  B: {}",
        name(&c.a),
        name(&c.b)
    );
    for w in &c.warnings {
        let _ = writeln!(s, "  warning: {w}");
    }
    let num = |v: Option<f64>, w: usize, p: usize| match v {
        Some(v) => format!("{v:>w$.p$}"),
        None => format!("{:>w$}", "-"),
    };
    let pct = |c: &Change| match c.delta_pct {
        Some(d) => format!("{d:>+7.1}%"),
        None => format!("{:>8}", "-"),
    };
    let section = |s: &mut String, title: &str, time: &str, rows: &[Row], limit: usize| {
        if rows.is_empty() {
            return;
        }
        let _ = writeln!(
            s,
            "\n  {:<24} {:>11} {:>11} {:>11} {:>8} {:>9} {:>9} {:>8} {:>9} {:>9} {:>8}",
            title,
            "A J",
            "B J",
            "DELTA J",
            "DELTA",
            format!("A {time}"),
            format!("B {time}"),
            "DELTA",
            // Energy over the time beside it: power over wall time, but J
            // per CPU-second over on-CPU time (one word, one meaning).
            if time.contains("cpu") {
                "A J/CPU-s"
            } else {
                "A W"
            },
            if time.contains("cpu") {
                "B J/CPU-s"
            } else {
                "B W"
            },
            "DELTA"
        );
        for r in rows.iter().take(limit) {
            let e: &Change = &r.energy_j;
            let _ = writeln!(
                s,
                "  {:<24} {} {} {} {} {} {} {} {} {} {}",
                left_cut(&r.name, 24),
                num(e.a, 11, 3),
                num(e.b, 11, 3),
                match e.delta {
                    Some(d) => format!("{d:>+11.3}"),
                    None => format!("{:>11}", "-"),
                },
                pct(e),
                num(r.time_s.a, 9, 3),
                num(r.time_s.b, 9, 3),
                pct(&r.time_s),
                num(r.power_w.a, 9, 2),
                num(r.power_w.b, 9, 2),
                pct(&r.power_w),
            );
        }
        if rows.len() > limit {
            let _ = writeln!(s, "  ... {} more (all are in --json)", rows.len() - limit);
        }
    };
    section(&mut s, "TOTAL", "s", std::slice::from_ref(&c.total), 1);
    section(&mut s, "DOMAIN", "s", &c.domains, 50);
    section(&mut s, "GROUP", "cpu s", &c.groups, 10);
    section(&mut s, "PROCESS NAME", "cpu s", &c.processes, 20);
    section(&mut s, "WINDOW NAME", "s", &c.windows, 40);
    let p = &c.total.power_w;
    let _ = writeln!(
        s,
        "\n  average power: A {} W, B {} W ({})",
        num(p.a, 0, 2),
        num(p.b, 0, 2),
        match p.delta_pct {
            Some(d) => format!("{d:+.1}%"),
            None => "-".to_string(),
        }
    );
    s
}
