//! The sinks that read the profile's sums, without root: a [`Fixture`]
//! holds sums as a profile would, and each sink is handed records and
//! the end as the profile hands them.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::attribution::DomainUj;
use crate::attribution::EnergyBy;
use crate::attribution::stacks::StackLedger;
use crate::model::record::{DomainRow, GroupRows, IntervalPower, ProcessRow};
use crate::process::names::RuntimeSockets;
use crate::sources::DomainKey;
use crate::sources::registry::ReaderUse;
use crate::sums::Sums;

/// Sums as a profile holds them, and what they are reported with.
pub(super) struct Fixture {
    pub(super) sums: Sums,
    carbon: CarbonIntensity,
    pub(super) last_ns: u64,
    pub(super) stacks: Option<StackLedger>,
}

impl Fixture {
    pub(super) fn new() -> Self {
        let none = PathBuf::from("/nonexistent-wattprof");
        Self {
            sums: Sums::new(
                Some(&none),
                &RuntimeSockets {
                    docker: none.join("docker.sock"),
                    podman: none.join("podman.sock"),
                    containerd: none.join("containerd"),
                },
            ),
            carbon: CarbonIntensity {
                g_per_kwh: 100.0,
                source: "test".into(),
            },
            last_ns: 0,
            stacks: None,
        }
    }

    pub(super) fn totals(&self) -> Totals<'_> {
        Totals {
            sums: &self.sums,
            carbon: &self.carbon,
            profiler_ns: 3_000_000,
            start_ns: 0,
            last_ns: self.last_ns,
            figures: [&[], &[]],
            stacks: self.stacks.as_ref(),
        }
    }
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("wattprof-sink-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

fn header() -> HeaderRecord {
    HeaderRecord {
        schema_version: crate::model::RUN_SCHEMA_VERSION,
        wattprof_version: "0".into(),
        mode: "monitor".into(),
        tracker: crate::tracker::TrackerKind::Iter,
        start_unix_ns: 1,
        host: crate::model::HostReport::default(),
        package_ids: vec![0],
        readers: vec![ReaderUse {
            kind: "cpu".into(),
            name: "powercap".into(),
            detail: String::new(),
            estimated: false,
            fix: None,
            model: None,
        }],
        carbon_intensity_g_per_kwh: 100.0,
        carbon_intensity_source: "test".into(),
        argv: None,
        profiler_pid: None,
    }
}

/// A second of 30 W on package 0, with two processes' rows.
fn record(t_ns: u64) -> IntervalRecord {
    let row = |pid: u32, j: f64| ProcessRow {
        pid,
        comm: format!("p{pid}"),
        on_cpu_ns: 500_000_000,
        package_j: j,
        ..ProcessRow::default()
    };
    IntervalRecord {
        t_ns,
        duration_ns: 1_000_000_000,
        busy_ns: 1_000_000_000,
        domains: vec![DomainRow::from_uj(
            &DomainUj {
                measured_uj: 30_000_000,
                attributed_uj: 30_000_000,
                ..DomainUj::empty(
                    DomainKey::new(Domain::Package, Some(0)),
                    crate::attribution::Basis::CpuTime,
                )
            },
            None,
            1_000_000_000,
            |power_w| IntervalPower {
                power_w,
                covers_ns: None,
            },
        )],
        gpus: Vec::new(),
        groups: GroupRows::default(),
        processes: Some(vec![row(11, 20.0), row(12, 10.0)]),
    }
}

/// A family's series in a snapshot.
fn series(
    snap: &super::prometheus::Snapshot,
    metric: &super::prometheus::Metric,
) -> Vec<(Vec<(String, String)>, f64)> {
    snap.families
        .iter()
        .find(|(m, _)| m.name == metric.name)
        .map(|(_, s)| s.clone())
        .unwrap_or_default()
}

#[test]
fn the_exporter_s_snapshot_is_published_at_the_header_and_at_most_once_a_second() {
    use super::prometheus as m;
    use super::snapshot::{Exporter, Published};
    let published: Published = Arc::default();
    let mut ex = Exporter::new(published.clone(), 1, 0);
    let mut f = Fixture::new();
    let current = || published.lock().expect("lock").clone();
    ex.header(&header(), &f.totals());
    // Before any interval: the readers, and wattprof's own CPU.
    let snap = current();
    assert_eq!(series(&snap, &m::ENERGY_READER_INFO).len(), 1);
    assert_eq!(series(&snap, &m::SELF_CPU)[0].1, 0.003);
    assert!(series(&snap, &m::PROCESS_POWER).is_empty());
    f.last_ns = 1_000_000_000;
    ex.interval(&record(1_000_000_000), &f.totals());
    let snap = current();
    // The top process by power, the rest as `other`.
    let power = series(&snap, &m::PROCESS_POWER);
    assert_eq!(power.len(), 2, "{power:?}");
    assert!(power[0].0.contains(&("pid".into(), "11".into())));
    assert_eq!(power[0].1, 20.0);
    assert!(power[1].0.contains(&("pid".into(), "other".into())));
    assert_eq!(power[1].1, 10.0);
    // Half a second later: not rebuilt.
    f.last_ns = 1_500_000_000;
    ex.interval(&record(1_500_000_000), &f.totals());
    assert!(Arc::ptr_eq(&snap, &current()), "rebuilt within the second");
    f.last_ns = 2_000_000_000;
    ex.interval(&record(2_000_000_000), &f.totals());
    assert!(!Arc::ptr_eq(&snap, &current()), "rebuilt a second on");
}

#[test]
fn the_vm_export_asks_for_vm_sums_and_writes_each_vm_s_counter() {
    let dir = temp_dir("vm");
    let export = vm_export::VmExport::create(&dir).expect("export");
    let mut sink = vm_export::VmExportSink::new(export);
    assert!(sink.needs_vms(), "the profile must keep VM sums for it");
    let mut f = Fixture::new();
    let mut vms = crate::sums::vms::VmTracker::default();
    vms.add(
        1,
        Some("/machine.slice/machine-qemu\\x2d1\\x2dweb.scope"),
        std::iter::empty(),
        |_| Vec::new(),
        &EnergyBy {
            package_uj: 7_000_000,
            ..EnergyBy::default()
        },
        5,
    );
    f.sums.vms = Some(vms);
    sink.interval(&record(1_000_000_000), &f.totals());
    let counter: Vec<PathBuf> = walk(&dir)
        .into_iter()
        .filter(|p| p.ends_with("intel-rapl:0/energy_uj"))
        .collect();
    assert_eq!(counter.len(), 1, "{counter:?}");
    let uj: u64 = std::fs::read_to_string(&counter[0])
        .expect("counter")
        .trim()
        .parse()
        .expect("a number");
    // A tree made now starts from 0 (a tree kept from before goes on
    // from its last count): all of the VM's energy so far.
    assert_eq!(uj, 7_000_000);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Every file under `dir`.
fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            out.extend(walk(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[test]
fn the_flame_graph_writes_both_files_at_the_end_and_says_each() {
    let dir = temp_dir("flame");
    let folded = recording::PendingOutput::create_for("--stacks-out", &dir.join("s.folded"))
        .expect("writable");
    let svg =
        recording::PendingOutput::create_for("--flamegraph", &dir.join("s.svg")).expect("writable");
    let mut sink = flamegraph::FlameGraph::new(Some(folded), Some(svg), None);
    let mut f = Fixture::new();
    let mut ledger = StackLedger::new(100);
    let a = ledger.table.intern(&["main".into(), "burn".into()]);
    ledger.add(
        "burner",
        &[(a, 3)],
        &EnergyBy {
            package_uj: 4_000,
            ..EnergyBy::default()
        },
    );
    f.stacks = Some(ledger);
    let report: RunReport = serde_json::from_str(include_str!(
        "../../../fuzz/corpus/report_reader/seed-recording.json"
    ))
    .expect("the seed recording");
    let done = sink.finish(&report, &f.totals());
    let said: Vec<String> = done.into_iter().map(|d| d.expect("written")).collect();
    assert_eq!(said.len(), 2, "{said:?}");
    assert!(
        said[0].starts_with("folded stacks (1 lines, µJ) written to"),
        "{said:?}"
    );
    assert!(
        said[1].starts_with("package energy flame graph written to"),
        "{said:?}"
    );
    let folded = std::fs::read_to_string(dir.join("s.folded")).expect("folded");
    assert!(folded.contains("burner;main;burn 4000"), "{folded}");
    let svg = std::fs::read_to_string(dir.join("s.svg")).expect("svg");
    // Titled with the command of the run.
    assert!(
        svg.contains("`sleep 0.5`"),
        "{}",
        &svg[..svg.len().min(400)]
    );
    // A second end writes nothing again.
    assert!(sink.finish(&report, &f.totals()).is_empty());
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn the_stream_ends_with_the_summary_and_no_intervals() {
    let dir = temp_dir("jsonl");
    let path = dir.join("s.jsonl");
    let mut s = jsonl::Jsonl::create(&path).expect("stream");
    let f = Fixture::new();
    s.header(&header(), &f.totals());
    s.interval(&record(1_000_000_000), &f.totals());
    let report: RunReport = serde_json::from_str(include_str!(
        "../../../fuzz/corpus/report_reader/seed-recording.json"
    ))
    .expect("the seed recording");
    assert!(!report.intervals.is_empty(), "the seed has intervals");
    assert!(s.finish(&report, &f.totals()).is_empty());
    let text = std::fs::read_to_string(&path).expect("stream");
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    let kinds: Vec<&str> = lines.iter().filter_map(|l| l["type"].as_str()).collect();
    assert_eq!(kinds, ["header", "interval", "summary"]);
    assert!(lines[2].get("intervals").is_none(), "{}", lines[2]);
    assert_eq!(lines[2]["mode"], "run");
    let _ = std::fs::remove_dir_all(&dir);
}
