//! The table `wattprof run` prints when the command ends.

use std::collections::BTreeMap;
use std::fmt::Write;

use super::RunReport;

/// Rows shown one by one; the rest are summed by name.
const TOP_ROWS: usize = 20;

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Renders the end-of-run table. Shares are of all CPU time in the run
/// (every CPU's window: busy + idle + lost).
pub fn render_run_table(r: &RunReport) -> String {
    let mut s = String::new();
    let total = r.machine.window_ns;
    let outcome = match (r.command.exit_code, r.command.signal) {
        (_, Some(sig)) => format!("was killed by signal {sig}"),
        (Some(code), _) => format!("exited with code {code}"),
        _ => "ended".to_string(),
    };
    let _ = writeln!(
        s,
        "\nwattprof: `{}` {outcome} after {:.3} s; {} CPUs, {} package(s)",
        r.command.argv.join(" "),
        secs(r.wall_ns),
        r.machine.cpus,
        r.machine.package_ids.len()
    );
    let _ = writeln!(
        s,
        "\n{:>8} {:>8}  {:<16} {:>10} {:>7} {:>9} {:>9}",
        "PID", "PPID", "COMMAND", "ON-CPU s", "SHARE", "START s", "END s"
    );
    let mut procs: Vec<_> = r.processes.iter().collect();
    procs.sort_by(|a, b| b.on_cpu_ns.cmp(&a.on_cpu_ns).then(a.pid.cmp(&b.pid)));
    let opt = |t: Option<u64>| t.map_or_else(|| "-".to_string(), |t| format!("{:.3}", secs(t)));
    for p in procs.iter().take(TOP_ROWS) {
        let _ = writeln!(
            s,
            "{:>8} {:>8}  {:<16} {:>10.3} {:>6.1}% {:>9} {:>9}",
            p.pid,
            p.ppid.map_or_else(|| "-".to_string(), |v| v.to_string()),
            p.comm,
            secs(p.on_cpu_ns),
            pct(p.on_cpu_ns, total),
            opt(p.start_ns),
            opt(p.exit_ns),
        );
    }
    if procs.len() > TOP_ROWS {
        let mut by_name: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
        for p in &procs[TOP_ROWS..] {
            let e = by_name.entry(p.comm.as_str()).or_default();
            e.0 += 1;
            e.1 += p.on_cpu_ns;
        }
        let mut rest: Vec<_> = by_name.into_iter().collect();
        rest.sort_by_key(|r| std::cmp::Reverse(r.1.1));
        for (name, (n, ns)) in rest.iter().take(5) {
            let _ = writeln!(
                s,
                "{:>8} {:>8}  {:<16} {:>10.3} {:>6.1}%   ({n} more processes)",
                "+",
                "",
                name,
                secs(*ns),
                pct(*ns, total)
            );
        }
        if rest.len() > 5 {
            let (n, ns) = rest[5..]
                .iter()
                .fold((0, 0), |(a, b), (_, (n, ns))| (a + n, b + ns));
            let _ = writeln!(
                s,
                "{:>8} {:>8}  {:<16} {:>10.3} {:>6.1}%   ({n} more processes)",
                "+",
                "",
                "(other names)",
                secs(ns),
                pct(ns, total)
            );
        }
    }
    let rows = [
        (
            format!("command tree ({} processes)", r.command.processes),
            r.groups.tree_ns,
        ),
        ("wattprof itself".to_string(), r.groups.profiler_ns),
        ("rest of the machine".to_string(), r.groups.other_ns),
        ("idle".to_string(), r.machine.idle_ns),
        ("lost (not recorded)".to_string(), r.lost_ns),
    ];
    let _ = writeln!(s);
    for (label, ns) in rows {
        let _ = writeln!(
            s,
            "  {label:<34} {:>10.3} s {:>6.1}%",
            secs(ns),
            pct(ns, total)
        );
    }
    let _ = writeln!(
        s,
        "  {:<34} {:>10.3} s  ({} CPUs x {:.3} s)",
        "all CPU time",
        secs(total),
        r.machine.cpus,
        secs(r.wall_ns)
    );
    if r.lost_ns > 0 || r.profiler.events_lost > 0 || r.profiler.discarded_ns > 0 {
        let _ = writeln!(
            s,
            "  warning: {:.3} s of task time not recorded, {} events lost, {:.3} s discarded \
             (raise --max-tasks; see README, \"Limits\")",
            secs(r.lost_ns),
            r.profiler.events_lost,
            secs(r.profiler.discarded_ns)
        );
    }
    s
}
