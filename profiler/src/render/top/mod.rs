//! `wattprof top`: the live screen's state and what each key does to it.
//! Its figures are the interval records' (so the screen shows what the
//! `--jsonl` stream holds for the same interval); what it adds is kept
//! here: each process's energy since `top` began, the last minute of its
//! power, the machine's power over the last minutes, and the view (sort,
//! tree, grouping, filters, selection, pause).
//!
//! - `rows.rs`: the rows, and what is kept of each process across
//!   intervals;
//! - `tree.rs`: tree order, subtree sums, parents that did not run;
//! - `keys.rs`: what each key and the mouse do;
//! - `draw.rs`: the frame.
//!
//! The view (the rows as shown) is built when an interval arrives or a
//! key changes it, not at every frame. The terminal and its input are the
//! sink's (`sink/top.rs`).

mod draw;
mod keys;
mod rows;
mod tree;

use std::collections::{HashMap, VecDeque};

pub(crate) use draw::{draw, frame_updates};
pub(crate) use keys::{Outcome, keys_help};
pub(crate) use rows::{GroupRow, Row};

use crate::model::record::IntervalRecord;
use crate::model::{CgroupReport, ContainerReport, JobReport};
use crate::process::ProcFs;
use crate::sources::Domain;

/// Seconds of machine power kept for the header's chart.
const CHART_S: f64 = 300.0;

/// The intervals `+` and `-` step through.
pub(crate) const INTERVALS_MS: [u64; 8] = [100, 200, 500, 1_000, 2_000, 5_000, 10_000, 30_000];

/// A column of the process table.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Column {
    Pid,
    User,
    CpuPct,
    CpuW,
    DramW,
    GpuW,
    SmPct,
    Energy,
    /// Total power now (package + DRAM + GPU), with its last minute.
    Power,
    Command,
}

impl Column {
    /// Left to right.
    pub(crate) const ALL: [Column; 10] = [
        Column::Pid,
        Column::User,
        Column::CpuPct,
        Column::CpuW,
        Column::DramW,
        Column::GpuW,
        Column::SmPct,
        Column::Energy,
        Column::Power,
        Column::Command,
    ];

    /// Its heading.
    pub(crate) fn title(self) -> &'static str {
        match self {
            Column::Pid => "PID",
            Column::User => "USER",
            Column::CpuPct => "CPU%",
            Column::CpuW => "CPU W",
            Column::DramW => "DRAM W",
            Column::GpuW => "GPU W",
            Column::SmPct => "SM%",
            Column::Energy => "ENERGY J",
            Column::Power => "POWER 1m",
            Column::Command => "COMMAND",
        }
    }

    /// The domain a power column shows, for the estimated mark.
    fn domain(self) -> Option<Domain> {
        match self {
            Column::CpuW => Some(Domain::Package),
            Column::DramW => Some(Domain::Dram),
            Column::GpuW => Some(Domain::Gpu),
            _ => None,
        }
    }

    /// Text columns sort A to Z first; figures, largest first.
    fn ascending_first(self) -> bool {
        matches!(self, Column::Pid | Column::User | Column::Command)
    }
}

/// What the rows are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Grouping {
    /// Processes, by power over the last interval.
    Process,
    /// Containers and systemd units, by power over the last interval.
    Container,
    /// cgroups, by power over the last interval.
    Cgroup,
    /// Batch jobs (Slurm), by power over the last interval.
    Job,
}

impl Grouping {
    fn next(self) -> Self {
        match self {
            Grouping::Process => Grouping::Container,
            Grouping::Container => Grouping::Cgroup,
            Grouping::Cgroup => Grouping::Job,
            Grouping::Job => Grouping::Process,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Grouping::Process => "processes",
            Grouping::Container => "containers and units",
            Grouping::Cgroup => "cgroups",
            Grouping::Job => "batch jobs",
        }
    }
}

/// Where the keys go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Table,
    Help,
    /// The selected process's details.
    Details(u32),
    /// Typing the text filter (what is typed so far).
    Filter(String),
    /// Typing the user filter.
    User(String),
}

/// One domain in the header.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DomainLine {
    pub(crate) domain: Domain,
    pub(crate) name: String,
    pub(crate) power_w: f64,
    /// Static power now (W), where the domain is divided with one.
    pub(crate) static_w: Option<f64>,
    /// Idle and unattributed over the interval (W).
    pub(crate) idle_w: f64,
    pub(crate) unattributed_w: f64,
    pub(crate) estimated: bool,
}

/// What the selection holds on to when the rows move: a process (its
/// pid, and the profile's id for it: a pid reused by another process is
/// not the one selected), or a group.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Anchor {
    Process { pid: u32, id: u64 },
    Group(String),
}

/// The screen: the last interval's figures, what is kept across
/// intervals, and the view.
#[derive(Debug)]
pub(crate) struct Top {
    /// The last interval's rows, in the record's order.
    rows: Vec<Row>,
    groups: Vec<GroupRow>,
    pub(crate) domains: Vec<DomainLine>,
    /// Which domains are read, and which of them are estimated.
    read: Vec<(Domain, bool)>,
    /// Seconds since the start, and the last interval's length.
    pub(crate) elapsed_s: f64,
    pub(crate) interval_s: f64,
    /// Each process seen: its energy since `top` began, its power's last
    /// minute, its user.
    seen: rows::Seen,
    /// Parents that did not run, for the tree.
    ancestors: tree::Ancestors,
    /// Machine power (W) by seconds since the start.
    machine: VecDeque<(f64, f64)>,
    /// Each group's energy at the previous interval, for its power.
    pub(super) group_before: HashMap<String, (f64, u64)>,
    /// The rows as shown (filtered, sorted, in tree order), rebuilt when
    /// an interval arrives or a key changes the view.
    view: Vec<Row>,
    view_groups: Vec<GroupRow>,
    /// What the user chose.
    pub(crate) sort: Column,
    pub(crate) descending: bool,
    pub(crate) tree: bool,
    pub(crate) grouping: Grouping,
    pub(crate) filter: String,
    pub(crate) user_filter: Option<String>,
    pub(crate) paused: bool,
    pub(crate) mode: Mode,
    /// The interval asked for (ms); the session follows it.
    pub(crate) interval_ms: u64,
    /// Selected row (index into the shown rows), what it is, and the
    /// first row shown.
    pub(crate) selected: usize,
    anchor: Option<Anchor>,
    pub(crate) offset: usize,
    /// Where the table's heading and rows were last drawn, for the mouse:
    /// (heading row, first row's line, rows shown, each column's x range).
    pub(crate) layout: Option<TableLayout>,
    /// Colour, unless `NO_COLOR` is set.
    pub(crate) color: bool,
    /// Where a process's cgroup is read.
    procfs: ProcFs,
}

/// Where the last frame drew the table.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct TableLayout {
    pub(crate) heading_y: u16,
    pub(crate) first_row_y: u16,
    pub(crate) rows: u16,
    pub(crate) columns: Vec<(Column, u16, u16)>,
}

impl Top {
    /// An empty screen, sorted by power, at `interval_ms`, grouped by
    /// `grouping`, reading owners and details from `procfs`.
    pub(crate) fn new(interval_ms: u64, grouping: Grouping, color: bool, procfs: ProcFs) -> Self {
        Self {
            rows: Vec::new(),
            groups: Vec::new(),
            domains: Vec::new(),
            read: Vec::new(),
            elapsed_s: 0.0,
            interval_s: interval_ms as f64 / 1000.0,
            seen: rows::Seen::new(procfs.clone()),
            ancestors: tree::Ancestors::new(procfs.clone()),
            procfs,
            machine: VecDeque::new(),
            group_before: HashMap::new(),
            view: Vec::new(),
            view_groups: Vec::new(),
            sort: Column::Power,
            descending: true,
            tree: false,
            grouping,
            filter: String::new(),
            user_filter: None,
            paused: false,
            mode: Mode::Table,
            interval_ms,
            selected: 0,
            anchor: None,
            offset: 0,
            layout: None,
            color,
        }
    }

    /// Takes in an interval's record, with the containers' and cgroups'
    /// sums so far. While paused, only what is kept across intervals
    /// (energy, histories) moves on; the rows shown stay.
    pub(crate) fn interval(
        &mut self,
        record: &IntervalRecord,
        containers: &[ContainerReport],
        cgroups: &[CgroupReport],
        jobs: &[JobReport],
    ) {
        let dur_s = record.duration_s();
        let t_s = record.t_ns as f64 / 1e9;
        let read = record.read();
        let rows = self.seen.rows(record, read);
        let machine_w: f64 = record
            .domains
            .iter()
            .filter(|d| counted(d.domain))
            .map(|d| d.power.power_w)
            .sum();
        self.machine.push_back((t_s, machine_w));
        while self.machine.front().is_some_and(|(t, _)| t_s - t > CHART_S) {
            self.machine.pop_front();
        }
        let groups = rows::group_rows(
            self.grouping,
            containers,
            cgroups,
            jobs,
            dur_s,
            &mut self.group_before,
        );
        if self.paused {
            return;
        }
        self.rows = rows;
        self.groups = groups;
        self.elapsed_s = t_s;
        self.interval_s = dur_s;
        self.read = [Domain::Package, Domain::Dram, Domain::Gpu]
            .into_iter()
            .filter(|d| read.has(*d))
            .map(|d| {
                let estimated = record.domains.iter().any(|r| r.domain == d && r.estimated);
                (d, estimated)
            })
            .collect();
        self.domains = record
            .domains
            .iter()
            .map(|d| DomainLine {
                domain: d.domain,
                name: match d.package {
                    Some(p) => format!("{} {p}", d.domain.name()),
                    None => d.domain.name().to_string(),
                },
                power_w: d.power.power_w,
                static_w: d.static_w,
                idle_w: d.idle_j / dur_s,
                unattributed_w: d.unattributed_j / dur_s,
                estimated: d.estimated,
            })
            .collect();
        self.refresh();
    }

    /// Builds the rows as shown: filtered, sorted, and in tree order with
    /// subtree sums when the tree is on; the selection stays on the
    /// process (or group) it was on, where that is still shown.
    pub(crate) fn refresh(&mut self) {
        match self.grouping {
            Grouping::Process => {
                let needle = self.filter.to_lowercase();
                let passing = self.rows.iter().filter(|r| self.passes(r, &needle));
                if !self.tree {
                    self.view = self.sorted(passing);
                } else {
                    let mut rows: Vec<Row> = passing.cloned().collect();
                    // With the parents that did not run, unless a filter
                    // is on (which shows only what matches).
                    if self.filter.is_empty() && self.user_filter.is_none() {
                        let ghosts = self.ancestors.rows(&self.rows, &mut self.seen);
                        rows.extend(ghosts);
                    }
                    self.view = tree::tree_order(rows, |a, b| self.compare(a, b));
                }
                self.view_groups.clear();
            }
            _ => {
                let needle = self.filter.to_lowercase();
                let mut rows: Vec<GroupRow> = self
                    .groups
                    .iter()
                    .filter(|g| needle.is_empty() || g.name.to_lowercase().contains(&needle))
                    .cloned()
                    .collect();
                let w = |g: &GroupRow| g.power_w.unwrap_or(-1.0);
                rows.sort_by(|a, b| {
                    w(b).total_cmp(&w(a))
                        .then(b.energy_j.total_cmp(&a.energy_j))
                        .then(a.name.cmp(&b.name))
                });
                self.view_groups = rows;
                self.view.clear();
            }
        }
        let found = match &self.anchor {
            Some(Anchor::Process { pid, id }) => {
                self.view.iter().position(|r| r.pid == *pid && r.id == *id)
            }
            Some(Anchor::Group(name)) => self.view_groups.iter().position(|g| g.name == *name),
            None => None,
        };
        self.select(found.unwrap_or(self.selected));
    }

    /// Selects the `at`th row shown (the last where there are fewer).
    pub(crate) fn select(&mut self, at: usize) {
        let n = self.row_count();
        self.selected = at.min(n.saturating_sub(1));
        self.anchor = match self.grouping {
            Grouping::Process => self.view.get(self.selected).map(|r| Anchor::Process {
                pid: r.pid,
                id: r.id,
            }),
            _ => self
                .view_groups
                .get(self.selected)
                .map(|g| Anchor::Group(g.name.clone())),
        };
    }

    /// The process rows as shown.
    pub(crate) fn shown(&self) -> &[Row] {
        &self.view
    }

    /// The group rows as shown: filtered by text, most power first
    /// (energy breaks ties).
    pub(crate) fn shown_groups(&self) -> &[GroupRow] {
        &self.view_groups
    }

    /// Whether a row passes the filters (`needle`: the text filter in
    /// lower case).
    fn passes(&self, r: &Row, needle: &str) -> bool {
        (needle.is_empty() || r.comm.to_lowercase().contains(needle) || r.pid.to_string() == needle)
            && self.user_filter.as_ref().is_none_or(|u| *r.user == **u)
    }

    /// `rows` in the chosen order. A figure column's key is taken once per
    /// row, not per comparison (a thousand rows each interval); the pid
    /// breaks ties, so an unstable sort is as good.
    fn sorted<'a>(&self, rows: impl Iterator<Item = &'a Row>) -> Vec<Row> {
        let mut keyed: Vec<(Option<f64>, &Row)> = rows.map(|r| (self.sort_key(r), r)).collect();
        keyed.sort_unstable_by(|(ka, a), (kb, b)| self.order(*ka, a, *kb, b));
        keyed.into_iter().map(|(_, r)| r.clone()).collect()
    }

    /// The chosen column's figure in `r`, `None` for a text column (PID
    /// too: it sorts as a number of its own). A domain with no reader
    /// sorts below 0.
    fn sort_key(&self, r: &Row) -> Option<f64> {
        let f = |x: Option<f64>| x.unwrap_or(-1.0);
        let x = &r.fig;
        Some(match self.sort {
            Column::Pid | Column::User | Column::Command => return None,
            Column::CpuPct => x.cpu_pct,
            Column::CpuW => f(x.cpu_w),
            Column::DramW => f(x.dram_w),
            Column::GpuW => f(x.gpu_w),
            Column::SmPct => f(x.sm_pct),
            Column::Energy => x.energy_j,
            Column::Power => x.power_w(),
        })
    }

    /// The order of two rows under the chosen column, given their keys
    /// ([`Top::sort_key`]); pid breaks ties.
    fn order(&self, ka: Option<f64>, a: &Row, kb: Option<f64>, b: &Row) -> std::cmp::Ordering {
        let by = match (ka, kb) {
            (Some(x), Some(y)) => x.total_cmp(&y),
            _ => match self.sort {
                Column::User => a.user.cmp(&b.user),
                Column::Command => a.comm.cmp(&b.comm),
                _ => a.pid.cmp(&b.pid),
            },
        };
        let by = if self.descending { by.reverse() } else { by };
        by.then(a.pid.cmp(&b.pid))
    }

    /// The order of two rows under the chosen column; pid breaks ties.
    fn compare(&self, a: &Row, b: &Row) -> std::cmp::Ordering {
        self.order(self.sort_key(a), a, self.sort_key(b), b)
    }

    /// The last minute of `pid`'s total power, oldest first.
    pub(crate) fn history(&self, pid: u32) -> impl Iterator<Item = f64> + '_ {
        self.seen
            .kept
            .get(&pid)
            .into_iter()
            .flat_map(|k| k.power.iter().map(|(_, w)| *w))
    }

    /// Whether `column`'s domain is read, and estimated.
    pub(crate) fn column_read(&self, column: Column) -> (bool, bool) {
        match column.domain() {
            Some(d) => self
                .read
                .iter()
                .find(|(x, _)| *x == d)
                .map_or((false, false), |(_, e)| (true, *e)),
            None => (true, false),
        }
    }

    /// Sorts by `column`: again on the same column turns the order round.
    pub(crate) fn sort_by(&mut self, column: Column) {
        if self.sort == column {
            self.descending = !self.descending;
        } else {
            self.sort = column;
            self.descending = !column.ascending_first();
        }
    }

    /// The rows the selection moves over.
    pub(crate) fn row_count(&self) -> usize {
        match self.grouping {
            Grouping::Process => self.view.len(),
            _ => self.view_groups.len(),
        }
    }

    /// The selected process, in the process view.
    pub(crate) fn selected_pid(&self) -> Option<u32> {
        match (&self.anchor, self.grouping) {
            (Some(Anchor::Process { pid, .. }), Grouping::Process) => Some(*pid),
            _ => None,
        }
    }

    /// `pid`'s row as shown (a parent that did not run has one in the
    /// tree), else its row in the last interval.
    pub(crate) fn row(&self, pid: u32) -> Option<&Row> {
        self.view.iter().chain(&self.rows).find(|r| r.pid == pid)
    }

    /// `pid` and its parents, from the rows and `/proc`.
    pub(crate) fn lineage(&mut self, pid: u32) -> String {
        let rows: Vec<Row> = self.view.iter().chain(&self.rows).cloned().collect();
        self.ancestors.lineage(pid, &rows)
    }

    /// Whether `/proc` still lists `pid`.
    pub(crate) fn alive(&self, pid: u32) -> bool {
        self.procfs.lists(pid)
    }

    /// `pid`'s cgroup (the v2 path, else the first hierarchy's), and the
    /// container or unit that path names.
    pub(crate) fn cgroup_of(&self, pid: u32) -> (String, Option<String>) {
        let text = self.procfs.cgroup(pid);
        let path = |l: &str| l.splitn(3, ':').nth(2).map(str::to_string);
        let Some(cgroup) = text
            .lines()
            .find(|l| l.starts_with("0::"))
            .and_then(path)
            .or_else(|| text.lines().next().and_then(path))
        else {
            return ("(gone)".into(), None);
        };
        let container = crate::process::container::from_cgroup_path(&cgroup).map(|c| {
            let id: String = if c.runtime == crate::process::container::Runtime::Systemd {
                c.id.clone()
            } else {
                c.id.chars().take(12).collect()
            };
            format!("{} {id}", c.runtime.name())
        });
        (cgroup, container)
    }

    /// Machine power over the last minutes: (seconds since start, W).
    pub(crate) fn machine_power(&self) -> Vec<(f64, f64)> {
        self.machine.iter().copied().collect()
    }
}

/// The domains whose sum is the machine's power: package, DRAM and GPU
/// (core is part of package).
pub(crate) fn counted(d: Domain) -> bool {
    matches!(d, Domain::Package | Domain::Dram | Domain::Gpu)
}

#[cfg(test)]
mod tests;
