//! `wattprof top`: the live screen's state and what each key does to it.
//! Its figures are the interval records' (so the screen shows what the
//! `--jsonl` stream holds for the same interval); what it adds is kept
//! here: each process's energy since `top` began, the last minute of its
//! power, the machine's power over the last minutes, and the view (sort,
//! tree, grouping, filters, selection, pause). Drawing is `draw.rs`; the
//! terminal and its input are the sink's (`sink/top.rs`).

mod draw;
mod keys;

use std::collections::{HashMap, VecDeque};

pub(crate) use draw::draw;
pub(crate) use keys::{Outcome, keys_help};

use crate::model::record::IntervalRecord;
use crate::model::{CgroupReport, ContainerReport};
use crate::process::{ProcFs, ProcMeta, user_name};
use crate::sources::Domain;

/// Seconds of per-process power kept for its sparkline.
const SPARK_S: f64 = 60.0;
/// Seconds of machine power kept for the header's chart.
const CHART_S: f64 = 300.0;
/// Intervals a process may be absent from the records before its history
/// is dropped (it exited, or its pid was reused).
const FORGET_AFTER: u32 = 120;

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
}

impl Grouping {
    fn next(self) -> Self {
        match self {
            Grouping::Process => Grouping::Container,
            Grouping::Container => Grouping::Cgroup,
            Grouping::Cgroup => Grouping::Process,
        }
    }

    pub(crate) fn name(self) -> &'static str {
        match self {
            Grouping::Process => "processes",
            Grouping::Container => "containers and units",
            Grouping::Cgroup => "cgroups",
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

/// One process row as shown.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct Row {
    pub(crate) pid: u32,
    pub(crate) ppid: Option<u32>,
    pub(crate) user: String,
    pub(crate) comm: String,
    pub(crate) cpu_pct: f64,
    /// Power over the interval (W), `None` where the domain has no reader.
    pub(crate) cpu_w: Option<f64>,
    pub(crate) dram_w: Option<f64>,
    pub(crate) gpu_w: Option<f64>,
    /// SM share over its GPUs, where a GPU is read.
    pub(crate) sm_pct: Option<f64>,
    /// The static part of its energy over the interval (J).
    pub(crate) static_j: f64,
    /// Its energy over the interval (J).
    pub(crate) interval_j: f64,
    /// Energy since `top` began (J).
    pub(crate) energy_j: f64,
    /// Depth in the tree view (0 elsewhere).
    pub(crate) depth: usize,
    /// Tree view: the sums over it and what is under it (its figures
    /// above are these sums there).
    pub(crate) subtree: Option<Subtotal>,
}

impl Row {
    /// package + DRAM + GPU power (W).
    pub(crate) fn power_w(&self) -> f64 {
        self.cpu_w.unwrap_or(0.0) + self.dram_w.unwrap_or(0.0) + self.gpu_w.unwrap_or(0.0)
    }
}

/// A tree row's figures summed with those of every row under it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Subtotal {
    pub(crate) cpu_pct: f64,
    pub(crate) cpu_w: Option<f64>,
    pub(crate) dram_w: Option<f64>,
    pub(crate) gpu_w: Option<f64>,
    pub(crate) sm_pct: Option<f64>,
    pub(crate) static_j: f64,
    pub(crate) interval_j: f64,
    pub(crate) power_w: f64,
    pub(crate) energy_j: f64,
}

impl Subtotal {
    fn of(r: &Row) -> Self {
        Self {
            cpu_pct: r.cpu_pct,
            cpu_w: r.cpu_w,
            dram_w: r.dram_w,
            gpu_w: r.gpu_w,
            sm_pct: r.sm_pct,
            static_j: r.static_j,
            interval_j: r.interval_j,
            power_w: r.power_w(),
            energy_j: r.energy_j,
        }
    }

    fn add(&mut self, o: &Self) {
        let sum = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
        self.cpu_pct += o.cpu_pct;
        self.cpu_w = sum(self.cpu_w, o.cpu_w);
        self.dram_w = sum(self.dram_w, o.dram_w);
        self.gpu_w = sum(self.gpu_w, o.gpu_w);
        self.sm_pct = sum(self.sm_pct, o.sm_pct);
        self.static_j += o.static_j;
        self.interval_j += o.interval_j;
        self.power_w += o.power_w;
        self.energy_j += o.energy_j;
    }

    /// The row shows these sums.
    fn apply(&self, r: &mut Row) {
        r.cpu_pct = self.cpu_pct;
        r.cpu_w = self.cpu_w;
        r.dram_w = self.dram_w;
        r.gpu_w = self.gpu_w;
        r.sm_pct = self.sm_pct;
        r.static_j = self.static_j;
        r.interval_j = self.interval_j;
        r.energy_j = self.energy_j;
        r.subtree = Some(*self);
    }
}

/// A container's, unit's or cgroup's row.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GroupRow {
    pub(crate) name: String,
    /// CPU over the last interval (% of one CPU).
    pub(crate) cpu_pct: f64,
    /// Power over the last interval (W).
    pub(crate) power_w: f64,
    /// Energy since the profile began (J).
    pub(crate) energy_j: f64,
}

/// One domain in the header.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct DomainLine {
    pub(crate) name: String,
    pub(crate) power_w: f64,
    /// Static power now (W), where the domain is divided with one.
    pub(crate) static_w: Option<f64>,
    /// Idle and unattributed over the interval (W).
    pub(crate) idle_w: f64,
    pub(crate) unattributed_w: f64,
    pub(crate) estimated: bool,
}

/// Each row's user: its pid's owner, read once per pid, and each uid's
/// name, looked up once.
#[derive(Clone, Debug)]
struct Users {
    procfs: ProcFs,
    names: HashMap<u32, String>,
    owner: HashMap<u32, Option<u32>>,
}

impl Users {
    /// The login name of the owner of `pid` (its uid where it has none,
    /// `?` where the process is gone).
    fn of(&mut self, pid: u32) -> String {
        let procfs = &self.procfs;
        let uid = *self.owner.entry(pid).or_insert_with(|| procfs.owner(pid));
        match uid {
            Some(uid) => self
                .names
                .entry(uid)
                .or_insert_with(|| user_name(uid).unwrap_or_else(|| uid.to_string()))
                .clone(),
            None => "?".into(),
        }
    }

    fn forget(&mut self, pid: u32) {
        self.owner.remove(&pid);
    }
}

/// What `top` keeps of one process between intervals.
#[derive(Clone, Debug, Default)]
struct Kept {
    comm: String,
    energy_j: f64,
    /// Total power per interval, oldest first, over the last minute.
    power: VecDeque<(f64, f64)>,
    absent: u32,
}

/// The screen: the last interval's figures, what is kept across
/// intervals, and the view.
#[derive(Debug)]
pub(crate) struct Top {
    /// The last interval's rows, in the record's order.
    rows: Vec<Row>,
    groups: Vec<GroupRow>,
    domains: Vec<DomainLine>,
    /// Which domains are read, and which of them are estimated.
    read: Vec<(Domain, bool)>,
    /// Seconds since the start, and the last interval's length.
    elapsed_s: f64,
    interval_s: f64,
    kept: HashMap<u32, Kept>,
    users: Users,
    /// Machine power (W) by seconds since the start.
    machine: VecDeque<(f64, f64)>,
    /// Each group's energy at the previous interval, for its power.
    group_before: HashMap<String, (f64, u64)>,
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
    /// Selected row (index into the shown rows), and the first row shown.
    pub(crate) selected: usize,
    pub(crate) offset: usize,
    /// Where the table's heading and rows were last drawn, for the mouse:
    /// (heading row, first row's line, rows shown, each column's x range).
    pub(crate) layout: Option<TableLayout>,
    /// Colour, unless `NO_COLOR` is set.
    pub(crate) color: bool,
    /// Where a process's owner, cgroup and parents are read.
    procfs: ProcFs,
    /// Parents that had no row (asleep): (their parent, name), read once
    /// from `/proc`, so the tree reaches every row's real parent.
    ancestors: HashMap<u32, Option<(Option<u32>, String)>>,
    /// This interval's rows for those parents: no figures of their own.
    ghosts: Vec<Row>,
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
            kept: HashMap::new(),
            users: Users {
                procfs: procfs.clone(),
                names: HashMap::new(),
                owner: HashMap::new(),
            },
            procfs,
            ancestors: HashMap::new(),
            ghosts: Vec::new(),
            machine: VecDeque::new(),
            group_before: HashMap::new(),
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
    ) {
        let dur_s = record.duration_s();
        let t_s = record.t_ns as f64 / 1e9;
        let read = record.read();
        let rows = self.process_rows(record, read, dur_s, t_s);
        let machine_w: f64 = record
            .domains
            .iter()
            .filter(|d| matches!(d.domain, Domain::Package | Domain::Dram | Domain::Gpu))
            .map(|d| d.power.power_w)
            .sum();
        self.machine.push_back((t_s, machine_w));
        while self.machine.front().is_some_and(|(t, _)| t_s - t > CHART_S) {
            self.machine.pop_front();
        }
        let groups = self.group_rows(containers, cgroups, dur_s);
        if self.paused {
            return;
        }
        self.ghosts = self.ghost_rows(&rows);
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
    }

    /// The record's processes as rows, with what is kept of each.
    fn process_rows(
        &mut self,
        record: &IntervalRecord,
        read: crate::model::unread::Read,
        dur_s: f64,
        t_s: f64,
    ) -> Vec<Row> {
        let mut sm: HashMap<u32, f64> = HashMap::new();
        for g in &record.gpus {
            for p in g.processes.iter().flatten() {
                *sm.entry(p.pid).or_default() += p.sm_util_pct;
            }
        }
        let gpu_read = read.has(Domain::Gpu);
        for k in self.kept.values_mut() {
            k.absent += 1;
        }
        let mut rows = Vec::with_capacity(record.process_rows().len());
        for p in record.process_rows() {
            let watts = |d: Domain, j: f64| read.has(d).then_some(j / dur_s);
            let kept = self.kept.entry(p.pid).or_default();
            if kept.comm != p.comm && !kept.comm.is_empty() && kept.absent > 1 {
                // Another process with this pid: start again.
                *kept = Kept::default();
                self.users.forget(p.pid);
            }
            kept.absent = 0;
            kept.comm.clone_from(&p.comm);
            kept.energy_j += p.total_j();
            let power_w = p.total_j() / dur_s;
            kept.power.push_back((t_s, power_w));
            while kept.power.front().is_some_and(|(t, _)| t_s - t > SPARK_S) {
                kept.power.pop_front();
            }
            let energy_j = kept.energy_j;
            rows.push(Row {
                pid: p.pid,
                ppid: p.ppid,
                user: self.users.of(p.pid),
                comm: if p.comm.is_empty() {
                    format!("[{}]", p.pid)
                } else {
                    p.comm.clone()
                },
                cpu_pct: 100.0 * p.on_cpu_ns as f64 / 1e9 / dur_s,
                cpu_w: watts(Domain::Package, p.package_j),
                dram_w: watts(Domain::Dram, p.dram_j),
                gpu_w: watts(Domain::Gpu, p.gpu_j),
                sm_pct: gpu_read.then(|| sm.get(&p.pid).copied().unwrap_or(0.0)),
                static_j: p.static_j,
                interval_j: p.total_j(),
                energy_j,
                depth: 0,
                subtree: None,
            });
        }
        let users = &mut self.users;
        self.kept.retain(|pid, k| {
            let keep = k.absent <= FORGET_AFTER;
            if !keep {
                users.forget(*pid);
            }
            keep
        });
        rows
    }

    /// Rows for the parents that have none (they did not run), up to
    /// pid 1, so that the tree shows each row under its real parent.
    fn ghost_rows(&mut self, rows: &[Row]) -> Vec<Row> {
        let have: std::collections::HashSet<u32> = rows.iter().map(|r| r.pid).collect();
        let mut added = std::collections::HashSet::new();
        let mut ghosts = Vec::new();
        for r in rows {
            let mut at = r.ppid;
            // A chain is a few levels; the bound stops a loop in /proc.
            for _ in 0..64 {
                let Some(pid) = at.filter(|p| *p != 0 && !have.contains(p)) else {
                    break;
                };
                if !added.insert(pid) {
                    break;
                }
                let procfs = &self.procfs;
                let known = self
                    .ancestors
                    .entry(pid)
                    .or_insert_with(|| {
                        procfs
                            .comm_of(pid)
                            .map(|comm| (procfs.parent_of(pid), comm))
                    })
                    .clone();
                let Some((ppid, comm)) = known else {
                    break;
                };
                ghosts.push(Row {
                    pid,
                    ppid,
                    user: self.users.of(pid),
                    comm,
                    cpu_pct: 0.0,
                    cpu_w: r.cpu_w.map(|_| 0.0),
                    dram_w: r.dram_w.map(|_| 0.0),
                    gpu_w: r.gpu_w.map(|_| 0.0),
                    sm_pct: r.sm_pct.map(|_| 0.0),
                    static_j: 0.0,
                    interval_j: 0.0,
                    energy_j: self.kept.get(&pid).map_or(0.0, |k| k.energy_j),
                    depth: 0,
                    subtree: None,
                });
                at = ppid;
            }
        }
        // Forgotten with the processes: a pid reused later is read again.
        let kept = &self.kept;
        self.ancestors
            .retain(|pid, _| added.contains(pid) || kept.contains_key(pid));
        ghosts
    }

    /// Containers and units, or cgroups, with their power over the
    /// interval (from their energy so far).
    fn group_rows(
        &mut self,
        containers: &[ContainerReport],
        cgroups: &[CgroupReport],
        dur_s: f64,
    ) -> Vec<GroupRow> {
        let named: Vec<(String, u64, f64)> = match self.grouping {
            Grouping::Process => return Vec::new(),
            Grouping::Container => containers
                .iter()
                .map(|c| (super::container_label(c), c.on_cpu_ns, c.energy.total_j))
                .collect(),
            Grouping::Cgroup => cgroups
                .iter()
                .map(|c| (c.path.clone(), c.on_cpu_ns, c.energy.total_j))
                .collect(),
        };
        let mut before = HashMap::with_capacity(named.len());
        let rows = named
            .into_iter()
            .map(|(name, ns, j)| {
                let (j0, ns0) = self.group_before.get(&name).copied().unwrap_or((j, ns));
                before.insert(name.clone(), (j, ns));
                GroupRow {
                    name,
                    cpu_pct: 100.0 * ns.saturating_sub(ns0) as f64 / 1e9 / dur_s,
                    power_w: (j - j0).max(0.0) / dur_s,
                    energy_j: j,
                }
            })
            .collect();
        self.group_before = before;
        rows
    }

    /// The process rows as shown: filtered, sorted, and in tree order
    /// with subtotals when the tree is on.
    pub(crate) fn shown(&self) -> Vec<Row> {
        let mut rows: Vec<Row> = self
            .rows
            .iter()
            .filter(|r| self.passes(r))
            .cloned()
            .collect();
        if self.tree {
            // With the parents that did not run, unless a filter is on
            // (which shows only what matches).
            if self.filter.is_empty() && self.user_filter.is_none() {
                rows.extend(self.ghosts.iter().cloned());
            }
            rows = tree_order(rows, |a, b| self.compare(a, b));
        } else {
            rows.sort_by(|a, b| self.compare(a, b));
        }
        rows
    }

    /// The group rows as shown: filtered by text, most power first
    /// (energy breaks ties).
    pub(crate) fn shown_groups(&self) -> Vec<GroupRow> {
        let needle = self.filter.to_lowercase();
        let mut rows: Vec<GroupRow> = self
            .groups
            .iter()
            .filter(|g| needle.is_empty() || g.name.to_lowercase().contains(&needle))
            .cloned()
            .collect();
        rows.sort_by(|a, b| {
            b.power_w
                .total_cmp(&a.power_w)
                .then(b.energy_j.total_cmp(&a.energy_j))
                .then(a.name.cmp(&b.name))
        });
        rows
    }

    fn passes(&self, r: &Row) -> bool {
        let needle = self.filter.to_lowercase();
        (needle.is_empty()
            || r.comm.to_lowercase().contains(&needle)
            || r.pid.to_string() == needle)
            && self.user_filter.as_ref().is_none_or(|u| r.user == *u)
    }

    /// The order of two rows under the chosen column; pid breaks ties.
    fn compare(&self, a: &Row, b: &Row) -> std::cmp::Ordering {
        let f = |x: Option<f64>| x.unwrap_or(-1.0);
        let by = match self.sort {
            Column::Pid => a.pid.cmp(&b.pid),
            Column::User => a.user.cmp(&b.user),
            Column::Command => a.comm.cmp(&b.comm),
            Column::CpuPct => a.cpu_pct.total_cmp(&b.cpu_pct),
            Column::CpuW => f(a.cpu_w).total_cmp(&f(b.cpu_w)),
            Column::DramW => f(a.dram_w).total_cmp(&f(b.dram_w)),
            Column::GpuW => f(a.gpu_w).total_cmp(&f(b.gpu_w)),
            Column::SmPct => f(a.sm_pct).total_cmp(&f(b.sm_pct)),
            Column::Energy => a.energy_j.total_cmp(&b.energy_j),
            Column::Power => a.power_w().total_cmp(&b.power_w()),
        };
        let by = if self.descending { by.reverse() } else { by };
        by.then(a.pid.cmp(&b.pid))
    }

    /// The last minute of `pid`'s total power, oldest first.
    pub(crate) fn history(&self, pid: u32) -> Vec<f64> {
        self.kept
            .get(&pid)
            .map(|k| k.power.iter().map(|(_, w)| *w).collect())
            .unwrap_or_default()
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
            Grouping::Process => self.shown().len(),
            _ => self.shown_groups().len(),
        }
    }

    /// The selected process, in the process view.
    pub(crate) fn selected_pid(&self) -> Option<u32> {
        if self.grouping != Grouping::Process {
            return None;
        }
        self.shown().get(self.selected).map(|r| r.pid)
    }

    /// The last interval's row of `pid`.
    pub(crate) fn row(&self, pid: u32) -> Option<&Row> {
        self.rows.iter().find(|r| r.pid == pid)
    }

    /// `pid` and its parents, as far as the rows know them.
    pub(crate) fn lineage(&self, pid: u32) -> String {
        let mut chain = Vec::new();
        let mut at = Some(pid);
        while let Some(p) = at {
            if chain.len() == 12 || chain.iter().any(|(q, _)| *q == p) {
                break;
            }
            let row = self.row(p);
            chain.push((p, row.map(|r| r.comm.clone())));
            at = row.and_then(|r| r.ppid).filter(|pp| *pp != 0);
        }
        chain
            .iter()
            .map(|(p, comm)| match comm {
                Some(c) => format!("{c} ({p})"),
                None => p.to_string(),
            })
            .collect::<Vec<_>>()
            .join(" <- ")
    }

    /// `pid`'s cgroup (the v2 path, else the first hierarchy's).
    pub(crate) fn cgroup_of(&self, pid: u32) -> String {
        let text = self.procfs.cgroup(pid);
        let path = |l: &str| l.splitn(3, ':').nth(2).map(str::to_string);
        text.lines()
            .find(|l| l.starts_with("0::"))
            .and_then(path)
            .or_else(|| text.lines().next().and_then(path))
            .unwrap_or_else(|| "(gone)".into())
    }

    /// Machine power over the last minutes: (seconds since start, W).
    pub(crate) fn machine_power(&self) -> Vec<(f64, f64)> {
        self.machine.iter().copied().collect()
    }
}

/// Rows in tree order: each under its parent (its `ppid`, where that is
/// a row too) with its depth, and its figures the sums over it and every
/// row under it (kept in `subtree` too); siblings in `cmp` order of those
/// sums, so the costliest subtree comes first.
fn tree_order(mut rows: Vec<Row>, cmp: impl Fn(&Row, &Row) -> std::cmp::Ordering) -> Vec<Row> {
    let index: HashMap<u32, usize> = rows.iter().enumerate().map(|(i, r)| (r.pid, i)).collect();
    let mut children: HashMap<usize, Vec<usize>> = HashMap::new();
    let mut roots = Vec::new();
    for (i, r) in rows.iter().enumerate() {
        match r.ppid.and_then(|p| index.get(&p)).filter(|p| **p != i) {
            Some(parent) => children.entry(*parent).or_default().push(i),
            None => roots.push(i),
        }
    }
    // Rows in a parent loop (no root above them) are roots too.
    let reached = preorder(&roots, &children, rows.len());
    let mut seen = vec![false; rows.len()];
    for (i, _) in &reached {
        seen[*i] = true;
    }
    for (i, seen) in seen.iter().enumerate() {
        if !seen {
            roots.push(i);
            children.values_mut().for_each(|l| l.retain(|c| *c != i));
        }
    }
    // Sums, children before parents (the reverse of a preorder).
    let order = preorder(&roots, &children, rows.len());
    let mut sub: Vec<Subtotal> = rows.iter().map(Subtotal::of).collect();
    for (i, _) in order.iter().rev() {
        if let Some(list) = children.get(i) {
            for c in list {
                let s = sub[*c];
                sub[*i].add(&s);
            }
        }
    }
    for (r, s) in rows.iter_mut().zip(&sub) {
        s.apply(r);
    }
    let by = |a: &usize, b: &usize| cmp(&rows[*a], &rows[*b]);
    roots.sort_by(by);
    for list in children.values_mut() {
        list.sort_by(by);
    }
    let order = preorder(&roots, &children, rows.len());
    let mut rows: Vec<Option<Row>> = rows.into_iter().map(Some).collect();
    order
        .into_iter()
        .filter_map(|(i, depth)| {
            let mut r = rows[i].take()?;
            r.depth = depth;
            Some(r)
        })
        .collect()
}

/// Each row reached from `roots`, with its depth, parents first
/// (iteratively: trees can be deep).
fn preorder(
    roots: &[usize],
    children: &HashMap<usize, Vec<usize>>,
    n: usize,
) -> Vec<(usize, usize)> {
    let mut seen = vec![false; n];
    let mut order = Vec::with_capacity(n);
    let mut stack: Vec<(usize, usize)> = roots.iter().rev().map(|r| (*r, 0)).collect();
    while let Some((i, depth)) = stack.pop() {
        if std::mem::replace(&mut seen[i], true) {
            continue;
        }
        order.push((i, depth));
        if let Some(list) = children.get(&i) {
            stack.extend(list.iter().rev().map(|c| (*c, depth + 1)));
        }
    }
    order
}

#[cfg(test)]
mod tests;
