//! `report A B`: what changed between two runs, per domain, group,
//! process name (trees summed by name) and window name, in absolute terms
//! and in percent, as `perf diff` and hyperfine compare.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Format, Summary};
use crate::sources::Domain;

/// One figure in both runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Change {
    /// In A (absent: A has no such row).
    pub(crate) a: Option<f64>,
    /// In B.
    pub(crate) b: Option<f64>,
    /// B - A, where both have it.
    pub(crate) delta: Option<f64>,
    /// (B - A) / A in percent, where both have it and A is not 0.
    pub(crate) delta_pct: Option<f64>,
}

impl Change {
    /// Compares `a` with `b`.
    pub(crate) fn of(a: Option<f64>, b: Option<f64>) -> Self {
        let delta = a.zip(b).map(|(a, b)| b - a);
        Self {
            a,
            b,
            delta,
            delta_pct: a
                .zip(delta)
                .and_then(|(a, d)| (a != 0.0).then_some(100.0 * d / a)),
        }
    }
}

/// One row of a comparison: energy, a time and power.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Row {
    /// What it is (`package 0`, `tree`, a process name, a window name).
    pub(crate) name: String,
    /// Energy (J).
    pub(crate) energy_j: Change,
    /// Time (s): the profile's length for domains, on-CPU time for groups
    /// and processes, summed length for windows.
    pub(crate) time_s: Change,
    /// Average power (W): energy over that time; for processes, energy
    /// over on-CPU time.
    pub(crate) power_w: Change,
    /// How many: processes of that name, windows of that name.
    pub(crate) count: Change,
}

/// Which run a file is, for the heading.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Side {
    /// The file.
    pub(crate) file: String,
    /// What it was read as.
    pub(crate) format: Format,
    /// `run` or `monitor`.
    pub(crate) mode: String,
    /// The command line (`run`).
    pub(crate) argv: Option<Vec<String>>,
}

/// Two runs compared.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct Comparison {
    /// The baseline.
    pub(crate) a: Side,
    /// The run compared with it.
    pub(crate) b: Side,
    /// The profile as a whole: length, and all measured energy.
    pub(crate) total: Row,
    /// Per domain and package: measured energy over the profile.
    pub(crate) domains: Vec<Row>,
    /// The command tree, wattprof, the rest.
    pub(crate) groups: Vec<Row>,
    /// Per process name, largest energy change first.
    pub(crate) processes: Vec<Row>,
    /// Per window name, in A's order then B's.
    pub(crate) windows: Vec<Row>,
    /// Why the two may not be comparable (one line each): a domain
    /// estimated by a model on one side and measured on the other, or two
    /// machines.
    pub(crate) warnings: Vec<String>,
}

fn power(e: Option<f64>, t: Option<f64>) -> Option<f64> {
    e.zip(t).map(|(e, t)| if t > 0.0 { e / t } else { 0.0 })
}

/// A row from (energy J, time s, count) in each run.
fn row(name: String, a: Option<(f64, f64, f64)>, b: Option<(f64, f64, f64)>) -> Row {
    let (ea, ta, na) = (a.map(|x| x.0), a.map(|x| x.1), a.map(|x| x.2));
    let (eb, tb, nb) = (b.map(|x| x.0), b.map(|x| x.1), b.map(|x| x.2));
    Row {
        name,
        energy_j: Change::of(ea, eb),
        time_s: Change::of(ta, tb),
        power_w: Change::of(power(ea, ta), power(eb, tb)),
        count: Change::of(na, nb),
    }
}

/// Rows for keys in either map, A's keys first, in their order.
fn rows_of(a: &[(String, (f64, f64, f64))], b: &[(String, (f64, f64, f64))]) -> Vec<Row> {
    let find = |v: &[(String, (f64, f64, f64))], k: &str| v.iter().find(|x| x.0 == k).map(|x| x.1);
    let mut out: Vec<Row> = a
        .iter()
        .map(|(k, x)| row(k.clone(), Some(*x), find(b, k)))
        .collect();
    out.extend(
        b.iter()
            .filter(|(k, _)| find(a, k).is_none())
            .map(|(k, x)| row(k.clone(), None, Some(*x))),
    );
    out
}

/// Each domain's energy, named by its package only where the domain has
/// several on this side: a machine-wide model's `package` lines up with
/// one package's counter.
fn domains(s: &Summary) -> Vec<(String, (f64, f64, f64))> {
    s.domains
        .iter()
        .map(|d| {
            let several = s.domains.iter().filter(|x| x.domain == d.domain).count() > 1;
            let name = if several {
                d.domain.label(d.package)
            } else {
                d.domain.name().to_string()
            };
            (name, (d.measured_j, s.wall_ns as f64 / 1e9, 1.0))
        })
        .collect()
}

/// Why A and B may not be comparable, one line each.
fn warnings(a: &Summary, b: &Summary) -> Vec<String> {
    let mut out = Vec::new();
    let kind = |s: &Summary, d: crate::sources::Domain| {
        let of: Vec<bool> = s
            .domains
            .iter()
            .filter(|x| x.domain == d)
            .map(|x| x.estimated)
            .collect();
        (!of.is_empty()).then(|| of.iter().any(|e| *e))
    };
    for d in [
        crate::sources::Domain::Package,
        crate::sources::Domain::Dram,
        crate::sources::Domain::Gpu,
    ] {
        if let (Some(ea), Some(eb)) = (kind(a, d), kind(b, d))
            && ea != eb
        {
            let how = |e: bool| {
                if e {
                    "a model's estimate"
                } else {
                    "measured by a counter"
                }
            };
            out.push(format!(
                "{} energy is {} in A and {} in B: their difference is not the programs' alone",
                d.name(),
                how(ea),
                how(eb)
            ));
        }
    }
    if a.host.hostname != b.host.hostname || a.host.cpu_model != b.host.cpu_model {
        out.push(format!(
            "A ran on {} ({}) and B on {} ({}): another machine's power differs",
            a.host.hostname, a.host.cpu_model, b.host.hostname, b.host.cpu_model
        ));
    }
    out
}

fn groups(s: &Summary) -> Vec<(String, (f64, f64, f64))> {
    let (t, e) = (&s.group_times, &s.group_energy);
    let mut v = vec![
        (
            "wattprof itself".to_string(),
            (e.profiler.total_j, t.profiler_ns as f64 / 1e9, 1.0),
        ),
        (
            "rest of the machine".to_string(),
            (e.other.total_j, t.other_ns as f64 / 1e9, 1.0),
        ),
    ];
    if s.mode == "run" {
        v.insert(
            0,
            (
                "command tree".to_string(),
                (e.tree.total_j, t.tree_ns as f64 / 1e9, 1.0),
            ),
        );
    }
    v
}

fn by_name<'a>(items: impl Iterator<Item = (&'a str, f64, f64)>) -> Vec<(String, (f64, f64, f64))> {
    let mut m: BTreeMap<&str, (f64, f64, f64)> = BTreeMap::new();
    for (name, e, t) in items {
        let x = m.entry(name).or_default();
        x.0 += e;
        x.1 += t;
        x.2 += 1.0;
    }
    m.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

fn side(s: &Summary) -> Side {
    Side {
        file: s.file.clone(),
        format: s.format,
        mode: s.mode.clone(),
        argv: s.command.as_ref().map(|c| c.argv.clone()),
    }
}

fn windows(s: &Summary) -> Vec<(String, (f64, f64, f64))> {
    let mut order: Vec<(String, (f64, f64, f64))> = Vec::new();
    for w in &s.windows {
        let len = w.end_ns.saturating_sub(w.begin_ns) as f64 / 1e9;
        match order.iter_mut().find(|x| x.0 == w.name) {
            Some(x) => {
                x.1.0 += w.energy.total_j;
                x.1.1 += len;
                x.1.2 += 1.0;
            }
            None => order.push((w.name.clone(), (w.energy.total_j, len, 1.0))),
        }
    }
    order
}

/// Compares run `b` with baseline `a`.
pub(crate) fn compare(a: &Summary, b: &Summary) -> Comparison {
    let total = |s: &Summary| {
        let j: f64 = [Domain::Package, Domain::Dram, Domain::Gpu]
            .into_iter()
            .map(|d| s.measured_j(d))
            .sum();
        (j, s.wall_ns as f64 / 1e9, 1.0)
    };
    let procs = |s: &Summary| {
        by_name(
            s.processes
                .iter()
                .map(|p| (p.comm.as_str(), p.energy.total_j, p.on_cpu_ns as f64 / 1e9)),
        )
    };
    let mut processes = rows_of(&procs(a), &procs(b));
    let size = |r: &Row| {
        r.energy_j
            .delta
            .unwrap_or_else(|| r.energy_j.a.or(r.energy_j.b).unwrap_or(0.0))
            .abs()
    };
    processes.sort_by(|x, y| size(y).total_cmp(&size(x)).then(x.name.cmp(&y.name)));
    Comparison {
        a: side(a),
        b: side(b),
        total: row(
            if [a, b].iter().any(|s| s.domains.iter().any(|d| d.estimated)) {
                "total, estimated in part".into()
            } else {
                "measured (CPU+DRAM+GPU)".into()
            },
            Some(total(a)),
            Some(total(b)),
        ),
        domains: rows_of(&domains(a), &domains(b)),
        groups: rows_of(&groups(a), &groups(b)),
        processes,
        windows: rows_of(&windows(a), &windows(b)),
        warnings: warnings(a, b),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_has_its_delta_and_percent_only_where_both_runs_have_it() {
        let c = Change::of(Some(10.0), Some(15.0));
        assert_eq!((c.delta, c.delta_pct), (Some(5.0), Some(50.0)));
        let c = Change::of(None, Some(15.0));
        assert_eq!((c.delta, c.delta_pct), (None, None));
        let c = Change::of(Some(0.0), Some(1.0));
        assert_eq!((c.delta, c.delta_pct), (Some(1.0), None));
    }

    #[test]
    fn names_are_summed_and_rows_only_in_one_run_are_kept() {
        let a = by_name([("cc", 1.0, 2.0), ("cc", 3.0, 4.0), ("ld", 1.0, 1.0)].into_iter());
        let b = by_name([("cc", 8.0, 12.0), ("as", 2.0, 2.0)].into_iter());
        let rows = rows_of(&a, &b);
        let names: Vec<&str> = rows.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(names, ["cc", "ld", "as"]);
        assert_eq!(rows[0].energy_j.a, Some(4.0));
        assert_eq!(rows[0].energy_j.delta_pct, Some(100.0));
        assert_eq!(rows[0].count.a, Some(2.0));
        assert_eq!(rows[0].power_w.a, Some(4.0 / 6.0));
        assert_eq!(rows[1].energy_j.b, None);
        assert_eq!(rows[2].energy_j.a, None);
    }
}
