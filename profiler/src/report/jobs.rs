//! `wattprof report` of the files `monitor --jobs-dir` writes (one per
//! batch job and node, docs/slurm.md): one table per job, a row per
//! node and their sum. A job over several nodes has one file on each;
//! its energy is their sum, as the PromQL sum over the nodes' series is.
//!
//! A domain a node has no reader for has no field in its file; the sum
//! shows a domain where any node read it, and says which nodes did not.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::ReadError;
use crate::model::{EnergyJ, JobFile};
use crate::render::secs;

/// The `type` of a job file.
const KIND: &str = "wattprof_job";

/// The domains a job file can carry, as the file names them.
const DOMAINS: [(&str, &str); 3] = [
    ("package_j", "package"),
    ("dram_j", "dram"),
    ("gpu_j", "gpu"),
];

/// One node's share of a job: its file.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct NodeShare {
    /// The node (its host name).
    pub(crate) node: String,
    /// The file it was read from.
    pub(crate) file: String,
    /// When the job's processes first and last ran there (ns since the
    /// Unix epoch).
    pub(crate) first_unix_ns: u64,
    /// See `first_unix_ns`.
    pub(crate) last_unix_ns: u64,
    /// On-CPU ns of its processes there.
    pub(crate) on_cpu_ns: u64,
    /// Their energy there.
    pub(crate) energy: EnergyJ,
    /// The domains it read (`package`, `dram`, `gpu`).
    pub(crate) domains: Vec<&'static str>,
}

/// A job summed over the nodes whose files were given.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct JobAcross {
    /// Who scheduled it (`slurm`).
    pub(crate) scheduler: String,
    /// The scheduler's job id.
    pub(crate) job_id: String,
    /// Its owner, where a file says.
    pub(crate) user: Option<String>,
    /// The first start and the last end over its nodes (ns since the Unix
    /// epoch).
    pub(crate) first_unix_ns: u64,
    /// See `first_unix_ns`.
    pub(crate) last_unix_ns: u64,
    /// On-CPU ns over its nodes.
    pub(crate) on_cpu_ns: u64,
    /// The sum of its nodes' energy; `avg_power_w` over the job's span
    /// (`first_unix_ns` to `last_unix_ns`).
    pub(crate) energy: EnergyJ,
    /// The domains any node read.
    pub(crate) domains: Vec<&'static str>,
    /// Its nodes, by name.
    pub(crate) nodes: Vec<NodeShare>,
}

/// Reads a job file; `bytes` are its contents.
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<(JobFile, Vec<&'static str>), ReadError> {
    let bad = |detail: String| ReadError::Bad {
        path: path.to_path_buf(),
        line: None,
        detail,
    };
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| ReadError::NotJson {
            path: path.to_path_buf(),
            detail: e.to_string(),
        })?;
    let domains = DOMAINS
        .iter()
        .filter(|(field, _)| value.pointer(&format!("/energy/{field}")).is_some())
        .map(|&(_, name)| name)
        .collect();
    let file: JobFile = serde_json::from_value(value).map_err(|e| bad(e.to_string()))?;
    if file.kind != KIND {
        return Err(bad(format!("its type is {:?}, not {KIND:?}", file.kind)));
    }
    let e = &file.job.energy;
    let figures = [
        e.package_j,
        e.dram_j,
        e.gpu_j,
        e.total_j,
        e.static_j,
        e.dynamic_j,
    ];
    // Not below -1 µJ: rounding is allowed, a negative total is not.
    if figures.iter().any(|j| !j.is_finite()) || e.total_j < -1e-6 {
        return Err(bad(
            "its energy has a negative total or a non-finite figure".into(),
        ));
    }
    if file.last_unix_ns < file.first_unix_ns {
        return Err(bad("its last_unix_ns is before its first_unix_ns".into()));
    }
    Ok((file, domains))
}

/// Reads `path` as a job file.
pub(crate) fn read(path: &Path) -> Result<(JobFile, Vec<&'static str>), ReadError> {
    let bytes = std::fs::read(path).map_err(|source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &bytes)
}

/// A job file read: where from, what it holds, the domains it read.
pub(crate) type Read = (PathBuf, JobFile, Vec<&'static str>);

/// The jobs in `files` (each read by [`read`]), summed over their nodes;
/// `Err`: one line, when one node's file for a job is given twice (its
/// energy would count twice).
pub(crate) fn gather(files: Vec<Read>) -> Result<Vec<JobAcross>, String> {
    let mut jobs: BTreeMap<(String, String), Vec<Read>> = BTreeMap::new();
    for f in files {
        jobs.entry((f.1.job.scheduler.clone(), f.1.job.job_id.clone()))
            .or_default()
            .push(f);
    }
    let mut out = Vec::new();
    for ((scheduler, job_id), mut nodes) in jobs {
        nodes.sort_by(|a, b| a.1.node.cmp(&b.1.node).then(a.0.cmp(&b.0)));
        if let Some(w) = nodes.windows(2).find(|w| w[0].1.node == w[1].1.node) {
            return Err(format!(
                "{scheduler} job {job_id}: node {:?} is in both {} and {} (each node's file counts \
                 once: give one of them)",
                w[0].1.node,
                w[0].0.display(),
                w[1].0.display()
            ));
        }
        // A job's owner is the same on every node; the first that says.
        let user = nodes.iter().find_map(|n| n.1.job.user.clone());
        let shares: Vec<NodeShare> = nodes
            .into_iter()
            .map(|(path, f, domains)| NodeShare {
                node: f.node,
                file: path.display().to_string(),
                first_unix_ns: f.first_unix_ns,
                last_unix_ns: f.last_unix_ns,
                on_cpu_ns: f.job.on_cpu_ns,
                energy: f.job.energy,
                domains,
            })
            .collect();
        out.push(sum(scheduler, job_id, user, shares));
    }
    Ok(out)
}

/// The job over its `nodes`.
fn sum(
    scheduler: String,
    job_id: String,
    user: Option<String>,
    nodes: Vec<NodeShare>,
) -> JobAcross {
    let mut e = EnergyJ::default();
    for n in &nodes {
        let x = &n.energy;
        e.package_j += x.package_j;
        e.core_j += x.core_j;
        e.dram_j += x.dram_j;
        e.gpu_j += x.gpu_j;
        e.total_j += x.total_j;
        e.co2_g += x.co2_g;
        e.wall_j += x.wall_j;
        e.static_j += x.static_j;
        e.dynamic_j += x.dynamic_j;
    }
    let first_unix_ns = nodes.iter().map(|n| n.first_unix_ns).min().unwrap_or(0);
    let last_unix_ns = nodes.iter().map(|n| n.last_unix_ns).max().unwrap_or(0);
    let span_s = last_unix_ns.saturating_sub(first_unix_ns) as f64 / 1e9;
    if span_s > 0.0 {
        e.avg_power_w = e.total_j / span_s;
    }
    let domains = DOMAINS
        .iter()
        .map(|&(_, name)| name)
        .filter(|d| nodes.iter().any(|n| n.domains.contains(d)))
        .collect();
    JobAcross {
        scheduler,
        job_id,
        user,
        first_unix_ns,
        last_unix_ns,
        on_cpu_ns: nodes.iter().map(|n| n.on_cpu_ns).sum(),
        energy: e,
        domains,
        nodes,
    }
}

/// The domains any node of any of `jobs` read, for their JSON.
pub(crate) fn read_by_any(jobs: &[JobAcross]) -> crate::model::unread::Read {
    use crate::sources::Domain;
    let domains = jobs.iter().flat_map(|j| &j.domains).map(|d| match *d {
        "package" => Domain::Package,
        "dram" => Domain::Dram,
        _ => Domain::Gpu,
    });
    crate::model::unread::Read::of(domains)
}

/// A domain's joules in `e`, by its name in [`DOMAINS`].
fn joules(e: &EnergyJ, domain: &str) -> f64 {
    match domain {
        "package" => e.package_j,
        "dram" => e.dram_j,
        _ => e.gpu_j,
    }
}

/// The tables: per job, a row per node and the sum (where it has more
/// than one node).
pub(crate) fn render(jobs: &[JobAcross]) -> String {
    let mut s = String::new();
    for j in jobs {
        let user = j
            .user
            .as_ref()
            .map(|u| format!(" ({u})"))
            .unwrap_or_default();
        let _ = writeln!(
            s,
            "{} job {}{user}: {} node{}, {} to {} ({:.1} s)",
            j.scheduler,
            j.job_id,
            j.nodes.len(),
            if j.nodes.len() == 1 { "" } else { "s" },
            crate::sink::csv::iso8601_utc(j.first_unix_ns),
            crate::sink::csv::iso8601_utc(j.last_unix_ns),
            j.last_unix_ns.saturating_sub(j.first_unix_ns) as f64 / 1e9,
        );
        let mut head = format!("  {:<24} {:>10}", "NODE", "ON-CPU s");
        for d in &j.domains {
            let _ = write!(head, " {:>12}", format!("{} J", d.to_uppercase()));
        }
        let _ = writeln!(
            s,
            "{head} {:>12} {:>12} {:>12} {:>9}",
            "TOTAL J", "STATIC J", "DYNAMIC J", "CO2 g"
        );
        let row = |s: &mut String, name: &str, ns: u64, e: &EnergyJ, read: &[&str]| {
            let mut line = format!(
                "  {:<24} {:>10.3}",
                crate::render::left_cut(&crate::render::printable_text(name), 24),
                secs(ns)
            );
            for d in &j.domains {
                if read.contains(d) {
                    let _ = write!(line, " {:>12.3}", joules(e, d));
                } else {
                    let _ = write!(line, " {:>12}", "-");
                }
            }
            let _ = writeln!(
                s,
                "{line} {:>12.3} {:>12.3} {:>12.3} {:>9.4}",
                e.total_j, e.static_j, e.dynamic_j, e.co2_g
            );
        };
        for n in &j.nodes {
            row(&mut s, &n.node, n.on_cpu_ns, &n.energy, &n.domains);
        }
        if j.nodes.len() > 1 {
            row(&mut s, "sum", j.on_cpu_ns, &j.energy, &j.domains);
        }
        let unread: Vec<String> = j
            .domains
            .iter()
            .flat_map(|d| {
                j.nodes
                    .iter()
                    .filter(|n| !n.domains.contains(d))
                    .map(move |n| format!("{d} on {}", n.node))
            })
            .collect();
        if !unread.is_empty() {
            let _ = writeln!(
                s,
                "  not read (\"-\", not in the sum): {}",
                unread.join(", ")
            );
        }
        s.push('\n');
    }
    s
}

/// `--jobs-csv`: a header, then one row per job and node. A domain the
/// node did not read is an empty cell, not 0.
pub(crate) fn csv(jobs: &[JobAcross]) -> Result<Vec<u8>, String> {
    let mut w = csv::WriterBuilder::new().from_writer(Vec::new());
    let mut header = vec![
        "scheduler",
        "job_id",
        "user",
        "node",
        "first_utc",
        "last_utc",
        "on_cpu_s",
    ];
    header.extend(DOMAINS.iter().map(|(field, _)| *field));
    header.extend(["total_j", "static_j", "dynamic_j", "co2_g"]);
    w.write_record(&header).map_err(|e| e.to_string())?;
    for j in jobs {
        for n in &j.nodes {
            let text = crate::sink::csv::text_cell;
            let mut row = vec![
                text(&j.scheduler),
                text(&j.job_id),
                text(j.user.as_deref().unwrap_or_default()),
                text(&n.node),
                crate::sink::csv::iso8601_utc(n.first_unix_ns),
                crate::sink::csv::iso8601_utc(n.last_unix_ns),
                format!("{:.6}", secs(n.on_cpu_ns)),
            ];
            for (_, d) in DOMAINS {
                row.push(if n.domains.contains(&d) {
                    format!("{:.6}", joules(&n.energy, d))
                } else {
                    String::new()
                });
            }
            let e = &n.energy;
            for x in [e.total_j, e.static_j, e.dynamic_j, e.co2_g] {
                row.push(format!("{x:.6}"));
            }
            w.write_record(&row).map_err(|e| e.to_string())?;
        }
    }
    w.into_inner().map_err(|e| e.to_string())
}

/// One line for a scheduler's job record (Slurm's `AdminComment`, set
/// by `deploy/slurm-epilog.sh`): the job's joules over the files' nodes,
/// `wattprof:total_j=…,package_j=…,…,nodes=a+b`; no spaces, so it reads
/// as one field in `sacct -P`. `Err` when the files hold other than one
/// job.
pub(crate) fn comment(jobs: &[JobAcross]) -> Result<String, String> {
    let [j] = jobs else {
        return Err(format!(
            "--comment sums one job's files, and these hold {} jobs ({}): give one job's",
            jobs.len(),
            jobs.iter()
                .map(|j| j.job_id.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ));
    };
    let mut line = format!("wattprof:total_j={:.3}", j.energy.total_j);
    for d in &j.domains {
        let _ = write!(line, ",{d}_j={:.3}", joules(&j.energy, d));
    }
    let nodes: Vec<String> = j
        .nodes
        .iter()
        .map(|n| {
            n.node
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || "-_.".contains(*c))
                .collect()
        })
        .collect();
    let _ = write!(
        line,
        ",static_j={:.3},dynamic_j={:.3},nodes={}",
        j.energy.static_j,
        j.energy.dynamic_j,
        nodes.join("+")
    );
    Ok(line)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A node's file as `monitor --jobs-dir` writes it; `gpu`: whether
    /// the node read a GPU.
    fn file(
        node: &str,
        job: &str,
        first_s: u64,
        last_s: u64,
        package: f64,
        gpu: Option<f64>,
    ) -> String {
        let gpu_field = gpu.map(|g| format!("\"gpu_j\": {g},")).unwrap_or_default();
        let total = package + gpu.unwrap_or(0.0);
        format!(
            r#"{{"type": "wattprof_job", "wattprof_version": "0.1.0", "node": "{node}",
               "first_unix_ns": {}, "last_unix_ns": {}, "scheduler": "slurm", "job_id": "{job}",
               "uid": 1000, "user": "ana", "first_ns": 1, "last_ns": 2, "on_cpu_ns": 2000000000,
               "energy": {{"package_j": {package}, {gpu_field} "total_j": {total}, "avg_power_w": 1.0,
                          "co2_g": 0.5, "static_j": 1.0, "dynamic_j": {}}},
               "steps": []}}"#,
            first_s * 1_000_000_000,
            last_s * 1_000_000_000,
            total - 1.0
        )
    }

    fn parsed(name: &str, text: &str) -> (PathBuf, JobFile, Vec<&'static str>) {
        let path = PathBuf::from(name);
        let (f, d) = parse(&path, text.as_bytes()).expect("a job file");
        (path, f, d)
    }

    #[test]
    fn a_node_named_like_a_formula_is_text_in_the_csv() {
        let jobs = gather(vec![parsed(
            "slurm-9.json",
            &file("=HYPERLINK(\\\"x\\\")", "9", 100, 101, 5.0, None),
        )])
        .expect("one job");
        let out = String::from_utf8(csv(&jobs).expect("csv")).expect("utf-8");
        let row = out.lines().nth(1).expect("a row");
        assert!(
            row.starts_with("slurm,9,ana,\"'=HYPERLINK(\"\"x\"\")\","),
            "{row}"
        );
    }

    #[test]
    fn a_job_over_two_nodes_is_their_sum_with_a_row_each() {
        let jobs = gather(vec![
            parsed("b/slurm-7.json", &file("node2", "7", 110, 200, 30.0, None)),
            parsed(
                "a/slurm-7.json",
                &file("node1", "7", 100, 190, 50.0, Some(20.0)),
            ),
            parsed(
                "a/slurm-8.json",
                &file("node1", "8", 100, 101, 5.0, Some(0.0)),
            ),
        ])
        .expect("gathered");
        assert_eq!(jobs.len(), 2);
        let j = &jobs[0];
        assert_eq!((j.job_id.as_str(), j.user.as_deref()), ("7", Some("ana")));
        assert_eq!(
            j.nodes.iter().map(|n| n.node.as_str()).collect::<Vec<_>>(),
            ["node1", "node2"]
        );
        assert_eq!(j.energy.total_j, 100.0);
        assert_eq!(j.energy.package_j, 80.0);
        assert_eq!(j.energy.gpu_j, 20.0);
        assert_eq!(j.on_cpu_ns, 4_000_000_000);
        assert_eq!(
            (j.first_unix_ns, j.last_unix_ns),
            (100_000_000_000, 200_000_000_000)
        );
        assert!(
            (j.energy.avg_power_w - 1.0).abs() < 1e-12,
            "100 J over 100 s"
        );
        assert_eq!(j.domains, ["package", "gpu"]);
        let table = render(&jobs);
        assert!(table.contains("slurm job 7 (ana): 2 nodes"), "{table}");
        let sum = table
            .lines()
            .find(|l| l.trim_start().starts_with("sum"))
            .expect(&table);
        assert!(
            sum.contains("80.000") && sum.contains("20.000") && sum.contains("100.000"),
            "{sum}"
        );
        let node2 = table.lines().find(|l| l.contains("node2")).expect(&table);
        assert!(node2.contains(" -"), "node2 read no GPU: {node2}");
        assert!(
            table.contains("not read (\"-\", not in the sum): gpu on node2"),
            "{table}"
        );
        // One node: no sum row.
        assert_eq!(render(&jobs[1..]).matches("  sum").count(), 0);
    }

    #[test]
    fn one_node_s_file_given_twice_is_refused_not_counted_twice() {
        let text = file("node1", "7", 100, 190, 50.0, None);
        let e = gather(vec![
            parsed("a/slurm-7.json", &text),
            parsed("copy.json", &text),
        ])
        .expect_err("refused");
        assert!(
            e.contains("node \"node1\" is in both") && e.contains("copy.json"),
            "{e}"
        );
    }

    #[test]
    fn the_comment_is_one_field_of_one_job() {
        let jobs = gather(vec![
            parsed("a.json", &file("node1", "7", 100, 190, 50.0, Some(20.0))),
            parsed("b.json", &file("node;2", "7", 110, 200, 30.0, None)),
        ])
        .expect("gathered");
        assert_eq!(
            comment(&jobs).expect("one job"),
            "wattprof:total_j=100.000,package_j=80.000,gpu_j=20.000,static_j=2.000,\
             dynamic_j=98.000,nodes=node1+node2"
        );
        let two = gather(vec![
            parsed("a.json", &file("node1", "7", 100, 190, 50.0, None)),
            parsed("c.json", &file("node1", "8", 100, 190, 50.0, None)),
        ])
        .expect("gathered");
        assert!(
            comment(&two)
                .expect_err("two jobs")
                .contains("hold 2 jobs (7, 8)")
        );
    }

    #[test]
    fn a_damaged_or_foreign_job_file_is_one_line_not_a_panic() {
        let path = Path::new("x.json");
        let cases = [
            ("{", "is not JSON"),
            (r#"{"type": "wattprof_job"}"#, "missing field"),
            (
                &*file("n", "7", 100, 190, -5.0, None),
                "negative total or a non-finite",
            ),
            (
                &*file("n", "7", 190, 100, 5.0, None),
                "before its first_unix_ns",
            ),
            (
                &*file("n", "7", 1, 2, 5.0, None).replace("wattprof_job", "wattprof_jab"),
                "not \"wattprof_job\"",
            ),
        ];
        for (text, says) in cases {
            let e = parse(path, text.as_bytes())
                .expect_err("refused")
                .to_string();
            assert!(e.contains(says), "{text}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
    }
}
