//! What the daemon (`monitor --serve`) adds up for its clients: each
//! client's followed trees (an unprivileged `wattprof run`) and windows,
//! summed from every interval the session closes, as the profile's own
//! windows are.
//!
//! Who may ask for what is decided in `serve` (from the kernel's peer
//! credentials) before anything reaches here: this file only adds up and
//! reports. Everything is keyed by the client's connection, so a client
//! that goes away takes its state with it ([`Profile::serve_drop`]).
//!
//! A client's figures cover whole intervals of the session: a tree is
//! followed from the start of the interval in progress (a tree started
//! for the purpose has used nothing before), and its end is answered
//! after the next interval closes, so the last of its CPU time is in.
//! Nothing here reads the counters between the session's own ticks: no
//! client can make the daemon sample energy faster than its interval.

use std::collections::BTreeMap;

use super::Profile;
use super::windows::{self, Window, Windows};
use crate::attribution::{ConsumerId, DomainShare, EnergyBy};
use crate::hash::IntMap;
use crate::model::record::{GroupRow, GroupRows, IntervalRecord, LiveRow, ProcessRow};
use crate::model::{
    EnergyJ, EnergyReport, GroupEnergy, MachineReport, ProcessReport, ProfilerReport,
    RUN_SCHEMA_VERSION, RunReport, ServedReport, WindowReport,
};
use crate::process::{GroupTotals, IntervalUsage, ProcFs, ProcessTable};

/// A client connection of the daemon.
pub(crate) type ClientId = u64;

use crate::model::SERVED_MAX_ROWS as MAX_ROWS;

/// Processes beyond [`MAX_ROWS`] counted one by one per tree (beyond,
/// the count stops: "at least").
const MAX_LEFT_OUT_COUNTED: usize = 100_000;

/// Rows of one streamed interval record (the first processes of the tree
/// that ran in it; the others are in the record's totals only): a record
/// stays small enough to be read as it comes.
const STREAM_ROWS: usize = 1_000;

/// One process of a followed tree, as the tree's report shows it.
#[derive(Clone, Debug)]
struct Row {
    pid: u32,
    ppid: Option<u32>,
    comm: String,
    start_ns: Option<u64>,
    exit_ns: Option<u64>,
    on_cpu_ns: Vec<u64>,
    energy: EnergyBy,
}

/// A followed tree: a process and its descendants (or the descendants
/// only: `wattprof run` follows its own children).
#[derive(Clone, Debug)]
struct Follow {
    root: u32,
    /// When it was asked for (monotonic ns), and the root's record.
    asked_ns: u64,
    root_id: Root,
    children_only: bool,
    begin_ns: u64,
    intervals: u64,
    on_cpu_ns: u64,
    energy: EnergyBy,
    rows: IntMap<ConsumerId, Row>,
    rows_left_out: crate::hash::IntSet<ConsumerId>,
    /// The client asked for each interval's record of the tree.
    stream: bool,
    /// This interval's rows so far, when streamed (at most
    /// [`MAX_ROWS`]), and the tree's time and energy in it (all rows).
    interval_rows: Vec<ProcessRow>,
    interval_ns: u64,
    interval_energy: EnergyBy,
    /// The last closed interval's record, not yet taken.
    record: Option<IntervalRecord>,
}

/// One client's trees and windows.
#[derive(Debug)]
struct Client {
    follows: Vec<Follow>,
    windows: Windows,
    /// Each pid with open windows: when the first was asked for, and its
    /// record.
    window_roots: IntMap<u32, (u64, Root)>,
}

impl Default for Client {
    fn default() -> Self {
        Self {
            follows: Vec::new(),
            windows: Windows::served(),
            window_roots: IntMap::default(),
        }
    }
}

/// Every client's trees and windows.
#[derive(Debug, Default)]
pub(crate) struct Served {
    clients: BTreeMap<ClientId, Client>,
    /// Which roots each process is in, kept from interval to interval.
    lineage: Lineage,
    /// The tracker's facts, for a tree's report.
    profiler: Option<ProfilerReport>,
}

/// How much a set of clients holds (`status`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Held {
    /// Clients with anything followed or open.
    pub(crate) clients: usize,
    /// Trees followed.
    pub(crate) follows: usize,
    /// Windows open.
    pub(crate) windows: usize,
}

/// A followed tree's figures so far (pushed to its client each interval,
/// so a client whose daemon goes away keeps what was measured).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Progress {
    /// The tree's root.
    pub(crate) pid: u32,
    /// Intervals measured.
    pub(crate) intervals: u64,
    /// Since the tree was followed (ns).
    pub(crate) span_ns: u64,
    /// The tree's on-CPU time.
    pub(crate) on_cpu_ns: u64,
    /// The tree's energy.
    pub(crate) energy: EnergyJ,
}

impl Served {
    /// Whether no client holds anything (the interval's work is skipped).
    fn is_empty(&self) -> bool {
        self.clients.is_empty()
    }

    /// What `clients` hold (all clients: `None`).
    pub(crate) fn held(&self, clients: Option<&[ClientId]>) -> Held {
        let mut h = Held::default();
        for (id, c) in &self.clients {
            if clients.is_some_and(|ids| !ids.contains(id)) {
                continue;
            }
            h.clients += 1;
            h.follows += c.follows.len();
            h.windows += c.windows.open_count();
        }
        h
    }

    /// Adds one interval to every client's trees and windows.
    fn add_interval(
        &mut self,
        table: &ProcessTable<ProcFs>,
        usage: &[IntervalUsage],
        energy: &IntMap<ConsumerId, EnergyBy>,
        shares: &[DomainShare],
        span: (u64, u64),
    ) {
        // Every root of a tree or window, each known by its record once
        // seen: a root that ended and whose pid another process took is
        // not that process.
        let mut roots = crate::hash::IntSet::default();
        for c in self.clients.values_mut() {
            for f in &mut c.follows {
                f.intervals += 1;
                f.root_id.resolve(table, f.root, f.asked_ns);
                roots.insert(f.root);
            }
            c.window_roots
                .retain(|pid, _| c.windows.begin_of_pid(*pid).is_some());
            for (pid, (asked, root)) in &mut c.window_roots {
                root.resolve(table, *pid, *asked);
                roots.insert(*pid);
            }
        }
        if roots.is_empty() {
            return;
        }
        let lineage = &mut self.lineage;
        lineage.start_interval(table, &roots);
        for u in usage {
            lineage.trees_of(table, u.id, &roots);
        }
        let consumers: Vec<(ConsumerId, u64)> = usage
            .iter()
            .map(|u| (u.id, u.on_cpu_ns.iter().sum()))
            .collect();
        let lineage = &self.lineage;
        for c in self.clients.values_mut() {
            let ids = &c.window_roots;
            c.windows.add_interval(shares, &consumers, |cid, pid| {
                lineage.is_in(cid, pid, ids.get(&pid).map_or(Root::Gone, |r| r.1))
            });
            // Most processes are in no tree: one lookup each.
            for u in usage {
                if !lineage.in_any(u.id) {
                    continue;
                }
                let Some(p) = table.by_id(u.id) else { continue };
                for f in &mut c.follows {
                    if lineage.is_in(u.id, f.root, f.root_id)
                        && !(f.children_only && p.pid == f.root)
                    {
                        f.add(p, u, energy.get(&u.id));
                    }
                }
            }
            for f in c.follows.iter_mut().filter(|f| f.stream) {
                f.close_record(span);
            }
        }
    }
}

/// A tree's root as the daemon knows it: its process record, once the
/// table has one for the pid. A record that began after the request is
/// another process that took the pid: the tree then has no root, and
/// nothing is in it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Root {
    /// No record yet (nothing can be in its tree: a walk finds only
    /// records the table has, and the root is resolved first).
    Pending,
    /// This record.
    Known(u64),
    /// The pid is another process's now.
    Gone,
}

impl Root {
    /// Takes the table's record for `pid` if it began by `asked_ns`.
    fn resolve<M: crate::process::ProcMeta>(
        &mut self,
        table: &ProcessTable<M>,
        pid: u32,
        asked_ns: u64,
    ) {
        if *self == Self::Pending
            && let Some(p) = table.get(pid)
        {
            *self = if p.start_ns.is_none_or(|s| s <= asked_ns) {
                Self::Known(p.id)
            } else {
                Self::Gone
            };
        }
    }
}

/// Which roots each process descends from, for every tree and window
/// together. A record's answer is kept while the roots stay the same (its
/// parents do not change), so a long chain is walked once, and a process
/// that runs every interval costs a lookup; an answer cut short by a
/// parent the table does not have yet is kept for one interval only.
#[derive(Debug, Default)]
struct Lineage {
    /// Per record: the roots (pid, record) it is in, itself included, and
    /// whether its whole lineage was known.
    trees: IntMap<ConsumerId, (Vec<(u32, u64)>, bool)>,
    /// The roots the answers are for.
    roots: crate::hash::IntSet<u32>,
}

impl Lineage {
    /// Before an interval's walks: answers for other roots, and those cut
    /// short, are dropped; those of forgotten records too, now and then.
    fn start_interval<M: crate::process::ProcMeta>(
        &mut self,
        table: &ProcessTable<M>,
        roots: &crate::hash::IntSet<u32>,
    ) {
        if &self.roots != roots {
            self.trees.clear();
            self.roots.clone_from(roots);
        }
        self.trees.retain(|_, (_, whole)| *whole);
        if self.trees.len() > 2 * table.len() + 1024 {
            self.trees.retain(|id, _| table.by_id(*id).is_some());
        }
    }

    /// Works out the roots `id` is in. A parent is stepped to only if it
    /// is older than the child: a pid the parent had and another process
    /// took since (an orphan's parent pid) is not its parent.
    fn trees_of<M: crate::process::ProcMeta>(
        &mut self,
        table: &ProcessTable<M>,
        id: ConsumerId,
        roots: &crate::hash::IntSet<u32>,
    ) {
        if self.trees.contains_key(&id) {
            return;
        }
        let mut path = Vec::new();
        let mut cur = table.by_id(id);
        let mut base: Vec<(u32, u64)> = Vec::new();
        let mut whole = true;
        while let Some(p) = cur {
            if let Some((known, known_whole)) = self.trees.get(&p.id) {
                base.clone_from(known);
                whole = *known_whole;
                break;
            }
            path.push(p);
            if path.len() > table.len() {
                whole = false;
                break;
            }
            let parent = p.ppid.map(|pp| table.get(pp));
            // A parent the table has no record of (yet), or no parent
            // known (yet): the answer holds for this interval only.
            if matches!(parent, Some(None)) || (parent.is_none() && p.pid > 2) {
                whole = false;
            }
            cur = parent.flatten().filter(|parent| {
                parent.id != p.id
                    && match (parent.start_ns, p.start_ns) {
                        (Some(ps), Some(cs)) => ps <= cs,
                        // Forked while watched, the child from before: a
                        // newer process with the old parent's pid.
                        (Some(_), None) => false,
                        _ => true,
                    }
            });
        }
        for p in path.into_iter().rev() {
            if roots.contains(&p.pid) {
                base.push((p.pid, p.id));
            }
            self.trees.insert(p.id, (base.clone(), whole));
        }
    }

    /// Whether record `id` is in any tree.
    fn in_any(&self, id: ConsumerId) -> bool {
        self.trees.get(&id).is_some_and(|(t, _)| !t.is_empty())
    }

    /// Whether record `id` is in the tree of `root` (that record, when
    /// known).
    fn is_in(&self, id: ConsumerId, root: u32, root_id: Root) -> bool {
        let Root::Known(root_id) = root_id else {
            return false;
        };
        self.trees
            .get(&id)
            .is_some_and(|(t, _)| t.iter().any(|(pid, rid)| *pid == root && *rid == root_id))
    }
}

impl Follow {
    /// The interval's record of the tree (`at_ns`, `duration_ns`): its
    /// rows and its total; no machine figures.
    fn close_record(&mut self, (at_ns, duration_ns): (u64, u64)) {
        let rows = std::mem::take(&mut self.interval_rows);
        let e = std::mem::take(&mut self.interval_energy);
        let j = crate::units::joules;
        let tree = GroupRow {
            on_cpu_ns: std::mem::take(&mut self.interval_ns),
            energy_j: j(e.total_uj()),
            package_j: j(e.package_uj),
            core_j: j(e.core_uj),
            dram_j: j(e.dram_uj),
            gpu_j: j(e.gpu_uj),
            static_j: j(e.static_uj()),
        };
        self.record = Some(IntervalRecord {
            t_ns: at_ns.saturating_sub(self.begin_ns),
            duration_ns,
            busy_ns: tree.on_cpu_ns,
            domains: Vec::new(),
            gpus: Vec::new(),
            groups: GroupRows {
                tree,
                ..GroupRows::default()
            },
            processes: Some(rows),
        });
    }

    fn add(&mut self, p: &crate::process::Process, u: &IntervalUsage, e: Option<&EnergyBy>) {
        let ns: u64 = u.on_cpu_ns.iter().sum();
        self.on_cpu_ns += ns;
        if let Some(e) = e {
            self.energy.merge(e);
        }
        if self.stream {
            self.interval_ns += ns;
            if let Some(e) = e {
                self.interval_energy.merge(e);
            }
        }
        if self.stream && self.interval_rows.len() < STREAM_ROWS {
            let j = crate::units::joules;
            let e = e.copied().unwrap_or_default();
            let mut comm = String::new();
            p.write_name(&mut comm);
            self.interval_rows.push(ProcessRow {
                pid: p.pid,
                ppid: p.ppid,
                comm,
                on_cpu_ns: ns,
                package_j: j(e.package_uj),
                core_j: j(e.core_uj),
                dram_j: j(e.dram_uj),
                gpu_j: j(e.gpu_uj),
                static_j: j(e.static_uj()),
                pss_bytes: None,
                uss_bytes: None,
                gpu_memory_bytes: 0,
                live: LiveRow::default(),
            });
        }
        if self.rows.len() >= MAX_ROWS && !self.rows.contains_key(&u.id) {
            // Counted up to a bound: a tree that forks for ever must not
            // grow the daemon.
            if self.rows_left_out.len() < MAX_LEFT_OUT_COUNTED {
                self.rows_left_out.insert(u.id);
            }
            return;
        }
        let row = self.rows.entry(u.id).or_insert_with(|| Row {
            pid: p.pid,
            ppid: p.ppid,
            comm: String::new(),
            start_ns: p.start_ns,
            exit_ns: None,
            on_cpu_ns: Vec::new(),
            energy: EnergyBy::default(),
        });
        row.comm.clear();
        p.write_name(&mut row.comm);
        row.exit_ns = p.exit_ns;
        if row.on_cpu_ns.len() < u.on_cpu_ns.len() {
            row.on_cpu_ns.resize(u.on_cpu_ns.len(), 0);
        }
        for (a, b) in row.on_cpu_ns.iter_mut().zip(u.on_cpu_ns.iter()) {
            *a += b;
        }
        if let Some(e) = e {
            row.energy.merge(e);
        }
    }
}

impl Profile {
    /// The tracker's facts, for the reports of followed trees.
    pub(crate) fn serve_profiler_facts(&mut self, facts: ProfilerReport) {
        self.served.profiler = Some(facts);
    }

    /// Follows the tree of `root` for `client` from the interval in
    /// progress (`children_only`: its descendants, not itself).
    pub(crate) fn serve_follow(
        &mut self,
        client: ClientId,
        root: u32,
        (children_only, stream): (bool, bool),
        asked_ns: u64,
    ) -> Result<(), String> {
        let c = self.served.clients.entry(client).or_default();
        if c.follows.iter().any(|f| f.root == root) {
            return Err(format!("pid {root} is already followed on this connection"));
        }
        let mut root_id = Root::Pending;
        root_id.resolve(&self.table, root, asked_ns);
        c.follows.push(Follow {
            root,
            asked_ns,
            root_id,
            children_only,
            begin_ns: self.last_ns,
            intervals: 0,
            on_cpu_ns: 0,
            energy: EnergyBy::default(),
            rows: IntMap::default(),
            rows_left_out: Default::default(),
            stream,
            interval_rows: Vec::new(),
            interval_ns: 0,
            interval_energy: EnergyBy::default(),
            record: None,
        });
        Ok(())
    }

    /// The records of `client`'s streamed trees for the interval that
    /// just closed (root, record), taken.
    pub(crate) fn serve_records(&mut self, client: ClientId) -> Vec<(u32, IntervalRecord)> {
        let Some(c) = self.served.clients.get_mut(&client) else {
            return Vec::new();
        };
        c.follows
            .iter_mut()
            .filter_map(|f| f.record.take().map(|r| (f.root, r)))
            .collect()
    }

    /// Whether `client` follows `root`.
    pub(crate) fn serve_follows(&self, client: ClientId, root: u32) -> bool {
        self.served
            .clients
            .get(&client)
            .is_some_and(|c| c.follows.iter().any(|f| f.root == root))
    }

    /// Stops following `root` for `client` and reports its tree as `run`
    /// would, without the machine's figures (the daemon keeps none per
    /// tree); the client adds its command line and exit.
    pub(crate) fn serve_finish(
        &mut self,
        client: ClientId,
        root: u32,
        daemon: &str,
    ) -> Option<RunReport> {
        let c = self.served.clients.get_mut(&client)?;
        let i = c.follows.iter().position(|f| f.root == root)?;
        let f = c.follows.remove(i);
        if c.follows.is_empty() && !c.windows.any_open() {
            self.served.clients.remove(&client);
        }
        Some(self.tree_report(&f, daemon))
    }

    /// The document of `client`'s tree of `root` so far (at `follow`: the
    /// one a client keeps in case the daemon goes away).
    pub(crate) fn serve_skeleton(
        &self,
        client: ClientId,
        root: u32,
        daemon: &str,
    ) -> Option<RunReport> {
        let c = self.served.clients.get(&client)?;
        let f = c.follows.iter().find(|f| f.root == root)?;
        Some(self.tree_report(f, daemon))
    }

    /// Each tree `client` follows, so far.
    pub(crate) fn serve_progress(&self, client: ClientId) -> Vec<Progress> {
        let Some(c) = self.served.clients.get(&client) else {
            return Vec::new();
        };
        c.follows
            .iter()
            .map(|f| {
                let span = self.last_ns.saturating_sub(f.begin_ns);
                Progress {
                    pid: f.root,
                    intervals: f.intervals,
                    span_ns: span,
                    on_cpu_ns: f.on_cpu_ns,
                    energy: EnergyJ::new(&f.energy, span, &self.cfg.carbon),
                }
            })
            .collect()
    }

    /// Applies a client's window message (`begin NAME` at once, `end NAME`
    /// as the caller has it, after an interval closed), `sender` its
    /// process. The window's figures, the machine's left out when
    /// `withhold_machine`.
    pub(crate) fn serve_window(
        &mut self,
        client: ClientId,
        cmd: windows::Command,
        withhold_machine: bool,
        asked_ns: u64,
    ) -> Result<Option<WindowReport>, String> {
        let at = self.last_ns;
        let c = self.served.clients.entry(client).or_default();
        let pid = cmd.pid;
        let begin = cmd.begin;
        let closed = c.windows.apply(cmd, at);
        if begin && closed.is_ok() {
            // The pid's process as of this request, for as long as it has
            // windows open.
            let table = &self.table;
            c.window_roots.entry(pid).or_insert_with(|| {
                let mut root = Root::Pending;
                root.resolve(table, pid, asked_ns);
                (asked_ns, root)
            });
        }
        if c.follows.is_empty() && !c.windows.any_open() {
            self.served.clients.remove(&client);
        }
        Ok(closed?.map(|w: Window| {
            let mut r = self.window_report(&w);
            if withhold_machine {
                r.machine.clear();
            }
            r
        }))
    }

    /// When `client`'s open window `name` of `pid`'s tree began
    /// (monotonic ns), if there is one.
    pub(crate) fn serve_window_begin(&self, client: ClientId, name: &str, pid: u32) -> Option<u64> {
        self.served
            .clients
            .get(&client)
            .and_then(|c| c.windows.begin_of(name, pid))
    }

    /// Forgets everything `client` had (its connection closed).
    pub(crate) fn serve_drop(&mut self, client: ClientId) {
        self.served.clients.remove(&client);
    }

    /// What `clients` hold (`None`: every client).
    pub(crate) fn serve_held(&self, clients: Option<&[ClientId]>) -> Held {
        self.served.held(clients)
    }

    /// The session's last interval end (monotonic ns).
    pub(crate) fn last_tick_ns(&self) -> u64 {
        self.last_ns
    }

    /// Adds the interval to the clients' trees and windows.
    pub(super) fn add_to_served(
        &mut self,
        usage: &[IntervalUsage],
        energy: &IntMap<ConsumerId, EnergyBy>,
        shares: &[DomainShare],
        duration_ns: u64,
    ) {
        if !self.served.is_empty() {
            let span = (self.last_ns, duration_ns);
            self.served
                .add_interval(&self.table, usage, energy, shares, span);
        }
    }

    /// A followed tree as `run`'s document: its processes, its energy and
    /// CPU time.
    fn tree_report(&self, f: &Follow, daemon: &str) -> RunReport {
        let span = self.last_ns.saturating_sub(f.begin_ns);
        let carbon = &self.cfg.carbon;
        let since = |t: u64| t.saturating_sub(f.begin_ns);
        let mut processes: Vec<ProcessReport> = f
            .rows
            .values()
            .map(|r| {
                let from = r.start_ns.unwrap_or(f.begin_ns).max(f.begin_ns);
                let to = r.exit_ns.unwrap_or(self.last_ns);
                ProcessReport {
                    pid: r.pid,
                    ppid: r.ppid,
                    comm: r.comm.clone(),
                    cmdline: None,
                    on_cpu_ns: r.on_cpu_ns.iter().sum(),
                    on_cpu_ns_per_package: r.on_cpu_ns.clone(),
                    start_ns: r.start_ns.map(since),
                    exit_ns: r.exit_ns.map(since),
                    energy: EnergyJ::new(&r.energy, to.saturating_sub(from), carbon),
                    memory: crate::model::MemoryReport::default(),
                    cgroup: None,
                }
            })
            .collect();
        processes.sort_by_key(|p| (p.start_ns.unwrap_or(0), p.pid));
        let tree = EnergyJ::new(&f.energy, span, carbon);
        let mut profiler = self
            .served
            .profiler
            .clone()
            .unwrap_or_else(|| unknown_profiler(span));
        profiler.samples = f.intervals;
        RunReport {
            schema_version: RUN_SCHEMA_VERSION,
            wattprof_version: env!("CARGO_PKG_VERSION").to_string(),
            mode: "run".to_string(),
            start_unix_ns: self.start_unix_ns + since_start(f.begin_ns, self.start_ns),
            wall_ns: span,
            host: self.host.clone(),
            command: None,
            processes,
            groups: GroupTotals {
                tree_ns: f.on_cpu_ns,
                profiler_ns: 0,
                other_ns: 0,
            },
            energy: EnergyReport {
                readers: self.readers.used().to_vec(),
                // The machine's domains are not kept per tree (the
                // daemon's own recording has them).
                domains: Vec::new(),
                groups: GroupEnergy {
                    tree,
                    ..GroupEnergy::default()
                },
                carbon_intensity_g_per_kwh: carbon.g_per_kwh,
                carbon_intensity_source: carbon.source.clone(),
                problems: Vec::new(),
                static_power: None,
                mig_instances: Vec::new(),
            },
            cgroups: Vec::new(),
            containers: Vec::new(),
            jobs: Vec::new(),
            windows: Vec::new(),
            window_errors: Vec::new(),
            machine: MachineReport {
                cpus: super::online_cpus(),
                package_ids: self.package_ids.clone(),
                busy_ns: 0,
                idle_ns: 0,
                idle_task_ns: 0,
                window_ns: 0,
                attributed_ns: f.on_cpu_ns,
                switches: 0,
                carried_ns: 0,
                per_cpu: Vec::new(),
            },
            lost_ns: 0,
            profiler,
            stacks: None,
            served: Some(ServedReport {
                daemon: daemon.to_string(),
                machine_withheld: true,
                domains: self
                    .sums
                    .ledger
                    .domains()
                    .iter()
                    .map(|d| d.key.domain)
                    .collect(),
                intervals: f.intervals,
                processes_left_out: f.rows_left_out.len() as u64,
                missing: Vec::new(),
            }),
            intervals: Default::default(),
        }
    }
}

fn since_start(t: u64, start: u64) -> u64 {
    t.saturating_sub(start)
}

/// The tracker's facts when the daemon was given none (tests).
fn unknown_profiler(interval_ns: u64) -> ProfilerReport {
    ProfilerReport {
        tracker: crate::tracker::TrackerKind::Iter,
        tracker_fallback: None,
        task_walk: None,
        task_walk_fallback: None,
        task_walk_ring_full: 0,
        filter_overflow: 0,
        settled_from_exit: 0,
        vanished_threads: 0,
        on_cpu_ns: 0,
        kernel_memory_bytes: 0,
        exit_tracking: crate::tracker::ExitTracking::FreeEvent,
        task_clock: crate::tracker::TaskClock::SumExecRuntime,
        flush_supported: false,
        max_tasks: 0,
        interval_ns,
        samples: 0,
        map_read_syscalls: 0,
        events_lost: 0,
        discarded_ns: 0,
        unmatched_forks: 0,
        ended_unseen: 0,
        output_errors: Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracker::{CpuSample, PackageNs, TaskEvent, TaskTime};

    /// `/proc`: process 30, from before the daemon, names 40 its parent.
    struct Parents;
    impl crate::process::ProcMeta for Parents {
        fn parent_of(&self, pid: u32) -> Option<u32> {
            (pid == 30).then_some(40)
        }
    }

    fn task(pid: u32) -> TaskTime {
        TaskTime {
            tid: pid,
            tgid: pid,
            cgroup_id: 1,
            comm: crate::tracker::comm_bytes("x"),
            on_cpu_ns: PackageNs::from_slice(&[1]),
            exit_ns: None,
        }
    }

    fn fork(ts_ns: u64, child: u32, parent: u32) -> TaskEvent {
        TaskEvent::Fork {
            ts_ns,
            child,
            parent_tid: parent,
            parent_tgid: parent,
            comm: "x".into(),
        }
    }

    fn rec(t: &ProcessTable<Parents>, pid: u32) -> u64 {
        t.get(pid).expect("a record").id
    }

    #[test]
    fn a_tree_takes_no_orphan_through_a_reused_parent_pid_and_roots_are_records() {
        let mut t = ProcessTable::new(Parents, 1, 99);
        // 10 and 30 ran before; 20 is 10's child; then 10's new child
        // takes pid 40, which the orphan 30 still names its parent.
        t.apply(&CpuSample {
            at_ns: 100,
            events: vec![fork(5, 20, 10), fork(50, 40, 10)],
            tasks: vec![task(10), task(20), task(30), task(40)],
            ..CpuSample::default()
        });
        let roots: crate::hash::IntSet<u32> = [10].into_iter().collect();
        let mut l = Lineage::default();
        l.start_interval(&t, &roots);
        for pid in [10, 20, 30, 40] {
            l.trees_of(&t, rec(&t, pid), &roots);
        }
        let root = Root::Known(rec(&t, 10));
        assert!(l.is_in(rec(&t, 20), 10, root) && l.is_in(rec(&t, 40), 10, root));
        assert!(l.is_in(rec(&t, 10), 10, root), "the root itself");
        assert!(!l.is_in(rec(&t, 30), 10, root), "an orphan of an older 40");
        // The next interval: answers kept, a new child of 20 found.
        t.apply(&CpuSample {
            at_ns: 200,
            events: vec![fork(150, 50, 20)],
            tasks: vec![task(50)],
            ..CpuSample::default()
        });
        l.start_interval(&t, &roots);
        l.trees_of(&t, rec(&t, 50), &roots);
        assert!(l.is_in(rec(&t, 50), 10, root) && l.is_in(rec(&t, 20), 10, root));
        assert!(!l.in_any(rec(&t, 30)));
        // Another record of pid 10 (the pid reused): not this tree's root.
        assert!(!l.is_in(rec(&t, 20), 10, Root::Known(rec(&t, 10) + 1000)));
        assert!(!l.is_in(rec(&t, 20), 10, Root::Pending));
        // A root's record is taken only if it began by the request.
        let mut gone = Root::Pending;
        gone.resolve(&t, 40, 49);
        assert_eq!(gone, Root::Gone, "40 began at 50, after a request at 49");
        let mut known = Root::Pending;
        known.resolve(&t, 40, 60);
        assert_eq!(known, Root::Known(rec(&t, 40)));
        let mut waiting = Root::Pending;
        waiting.resolve(&t, 77, 60);
        assert_eq!(waiting, Root::Pending, "no record yet");
    }
}
