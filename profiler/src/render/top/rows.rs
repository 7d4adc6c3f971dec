//! `top`'s rows: each process's figures over the last interval (the
//! record's), with what `top` keeps of it across intervals (energy since
//! `top` began, the last minute of its power, its user), and the groups'
//! rows from their sums so far.

use std::collections::{HashMap, VecDeque};
use std::rc::Rc;

use crate::hash::IntMap;
use crate::model::record::{IntervalRecord, ProcessRow};
use crate::model::unread::Read;
use crate::model::{CgroupReport, ContainerReport, JobReport};
use crate::process::{ProcFs, user_name};
use crate::sources::Domain;

use super::Grouping;

/// Seconds of per-process power kept for its sparkline.
const SPARK_S: f64 = 60.0;
/// Intervals between looks for processes that are gone, among those
/// absent from the records.
const PRUNE_EVERY: u32 = 30;

/// A row's figures: over the last interval, and since `top` began. In the
/// tree, a row's are the sums over it and every row under it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub(crate) struct Figures {
    /// CPU time over the interval (% of one CPU).
    pub(crate) cpu_pct: f64,
    /// Power over the interval (W), `None` where the domain has no reader.
    pub(crate) cpu_w: Option<f64>,
    pub(crate) dram_w: Option<f64>,
    pub(crate) gpu_w: Option<f64>,
    /// SM share over its GPUs, where a GPU is read.
    pub(crate) sm_pct: Option<f64>,
    /// The static part of its package, DRAM and GPU energy over the
    /// interval (J).
    pub(crate) static_j: [f64; 3],
    /// Its energy over the interval (J).
    pub(crate) interval_j: f64,
    /// Energy since `top` began (J).
    pub(crate) energy_j: f64,
}

impl Figures {
    /// package + DRAM + GPU power (W).
    pub(crate) fn power_w(&self) -> f64 {
        self.cpu_w.unwrap_or(0.0) + self.dram_w.unwrap_or(0.0) + self.gpu_w.unwrap_or(0.0)
    }

    /// The static part over the interval (J).
    pub(crate) fn static_total_j(&self) -> f64 {
        self.static_j.iter().sum()
    }

    /// Adds `o`'s figures (a domain no row has stays `None`).
    pub(crate) fn add(&mut self, o: &Self) {
        let sum = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (None, None) => None,
            (a, b) => Some(a.unwrap_or(0.0) + b.unwrap_or(0.0)),
        };
        self.cpu_pct += o.cpu_pct;
        self.cpu_w = sum(self.cpu_w, o.cpu_w);
        self.dram_w = sum(self.dram_w, o.dram_w);
        self.gpu_w = sum(self.gpu_w, o.gpu_w);
        self.sm_pct = sum(self.sm_pct, o.sm_pct);
        for (a, b) in self.static_j.iter_mut().zip(o.static_j) {
            *a += b;
        }
        self.interval_j += o.interval_j;
        self.energy_j += o.energy_j;
    }

    /// No figures, in the same domains as `self` (a row for a process
    /// that did not run).
    pub(crate) fn none_like(&self) -> Self {
        let zero = |x: Option<f64>| x.map(|_| 0.0);
        Self {
            cpu_w: zero(self.cpu_w),
            dram_w: zero(self.dram_w),
            gpu_w: zero(self.gpu_w),
            sm_pct: zero(self.sm_pct),
            ..Self::default()
        }
    }
}

/// One process row as shown. Its texts are shared with what is kept of
/// the process: the view copies a thousand rows per interval.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Row {
    pub(crate) pid: u32,
    /// The profile's id of the process (0 for a parent that did not run).
    pub(crate) id: u64,
    pub(crate) ppid: Option<u32>,
    pub(crate) user: Rc<str>,
    pub(crate) comm: Rc<str>,
    pub(crate) fig: Figures,
    /// It did not run: a parent the tree shows, read from `/proc`.
    pub(crate) asleep: bool,
    /// Depth in the tree view (0 elsewhere).
    pub(crate) depth: usize,
    /// Tree view: `fig` is the sum over it and the rows under it.
    pub(crate) subtree: bool,
}

/// A container's, unit's or cgroup's row.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct GroupRow {
    pub(crate) name: String,
    /// CPU over the last interval (% of one CPU), and power (W): from
    /// its sums at this interval and the one before, so `None` in the
    /// first interval the group is on screen.
    pub(crate) cpu_pct: Option<f64>,
    pub(crate) power_w: Option<f64>,
    /// Energy since the profile began (J).
    pub(crate) energy_j: f64,
}

/// Each row's user: the effective uid in `/proc/PID/status`, read once
/// per process, and each uid's name, looked up once.
#[derive(Clone, Debug)]
pub(super) struct Users {
    procfs: ProcFs,
    names: IntMap<u32, Rc<str>>,
}

impl Users {
    pub(super) fn new(procfs: ProcFs) -> Self {
        Self {
            procfs,
            names: IntMap::default(),
        }
    }

    /// The login name of `uid` (the number where it has none), `?` where
    /// the process was gone before it was read.
    pub(super) fn name(&mut self, uid: Option<u32>) -> Rc<str> {
        match uid {
            Some(uid) => self
                .names
                .entry(uid)
                .or_insert_with(|| user_name(uid).unwrap_or_else(|| uid.to_string()).into())
                .clone(),
            None => "?".into(),
        }
    }

    /// The effective uid of `pid`, if it is alive.
    pub(super) fn uid_of(&self, pid: u32) -> Option<u32> {
        self.procfs.effective_uid(pid)
    }
}

/// What `top` keeps of one process between intervals.
#[derive(Clone, Debug, Default)]
pub(super) struct Kept {
    /// The profile's id of the process (a reused pid has another).
    id: u64,
    /// When it started, as `/proc` says: a parent that did not run is
    /// known by it (it has no id then).
    start: Option<u64>,
    pub(super) user: Rc<str>,
    /// Its name as shown (`[PID]` where it has none).
    comm: Rc<str>,
    pub(super) energy_j: f64,
    /// Total power per interval, oldest first, over the last minute:
    /// (seconds since the start, W).
    pub(super) power: VecDeque<(f64, f64)>,
    /// Intervals since it was last in the records.
    absent: u32,
}

/// The processes `top` has seen, by pid.
#[derive(Debug)]
pub(super) struct Seen {
    pub(super) kept: IntMap<u32, Kept>,
    pub(super) users: Users,
    intervals: u32,
}

impl Seen {
    pub(super) fn new(procfs: ProcFs) -> Self {
        Self {
            kept: IntMap::default(),
            users: Users::new(procfs),
            intervals: 0,
        }
    }

    /// The record's processes as rows, with what is kept of each.
    pub(super) fn rows(&mut self, record: &IntervalRecord, read: Read) -> Vec<Row> {
        let dur_s = record.duration_s();
        let t_s = record.t_ns as f64 / 1e9;
        let mut sm: IntMap<u32, f64> = IntMap::default();
        for g in &record.gpus {
            for p in g.processes.iter().flatten() {
                *sm.entry(p.pid).or_default() += p.sm_util_pct;
            }
        }
        for k in self.kept.values_mut() {
            k.absent = k.absent.saturating_add(1);
        }
        let processes = record.process_rows();
        let mut rows = Vec::with_capacity(processes.len());
        for p in processes {
            let kept = self.kept.entry(p.pid).or_default();
            if kept.id != p.live.id || kept.power.is_empty() {
                // First seen, or another process with this pid.
                let uid = self.users.uid_of(p.pid);
                *kept = Kept {
                    id: p.live.id,
                    start: self.users.procfs.start_ticks(p.pid),
                    user: self.users.name(uid),
                    ..Kept::default()
                };
            }
            if *kept.comm != *p.comm || kept.comm.is_empty() {
                // Named at first sight, and again after an exec.
                kept.comm = if p.comm.is_empty() {
                    format!("[{}]", p.pid).into()
                } else {
                    p.comm.as_str().into()
                };
            }
            kept.absent = 0;
            kept.energy_j += p.total_j();
            kept.power.push_back((t_s, p.total_j() / dur_s));
            while kept.power.front().is_some_and(|(t, _)| t_s - t > SPARK_S) {
                kept.power.pop_front();
            }
            let fig = figures(p, read, dur_s, sm.get(&p.pid).copied(), kept.energy_j);
            rows.push(Row {
                pid: p.pid,
                id: p.live.id,
                ppid: p.ppid,
                user: kept.user.clone(),
                comm: kept.comm.clone(),
                fig,
                asleep: false,
                depth: 0,
                subtree: false,
            });
        }
        self.prune();
        rows
    }

    /// Forgets, now and then, the processes absent from the records that
    /// `/proc` no longer lists (they exited). One that only sleeps keeps
    /// its energy since `top` began, however long it sleeps.
    fn prune(&mut self) {
        self.intervals = self.intervals.wrapping_add(1);
        if !self.intervals.is_multiple_of(PRUNE_EVERY) {
            return;
        }
        let procfs = &self.users.procfs;
        self.kept
            .retain(|pid, k| k.absent < PRUNE_EVERY || procfs.lists(*pid));
    }

    /// What is kept of `pid` if it is the process that started at
    /// `start` (a parent that did not run this interval).
    pub(super) fn kept_of(&self, pid: u32, start: Option<u64>) -> Option<&Kept> {
        self.kept
            .get(&pid)
            .filter(|k| start.is_some() && k.start == start)
    }

    /// The user of a process that has no row (it did not run), read
    /// from `/proc`.
    pub(super) fn user_from_proc(&mut self, pid: u32) -> Rc<str> {
        let uid = self.users.uid_of(pid);
        self.users.name(uid)
    }
}

/// A process row's figures over the interval.
fn figures(p: &ProcessRow, read: Read, dur_s: f64, sm: Option<f64>, energy_j: f64) -> Figures {
    let watts = |d: Domain, j: f64| read.has(d).then_some(j / dur_s);
    Figures {
        cpu_pct: 100.0 * p.on_cpu_ns as f64 / 1e9 / dur_s,
        cpu_w: watts(Domain::Package, p.package_j),
        dram_w: watts(Domain::Dram, p.dram_j),
        gpu_w: watts(Domain::Gpu, p.gpu_j),
        sm_pct: read.has(Domain::Gpu).then(|| sm.unwrap_or(0.0)),
        static_j: p.live.static_j,
        interval_j: p.total_j(),
        energy_j,
    }
}

/// Containers and units, cgroups, or batch jobs, with their power over the interval
/// (from their energy so far against `before`, which this updates; the
/// caller empties it when the grouping changes, since the sums it holds
/// are then from another time).
pub(super) fn group_rows(
    grouping: Grouping,
    containers: &[ContainerReport],
    cgroups: &[CgroupReport],
    jobs: &[JobReport],
    dur_s: f64,
    before: &mut HashMap<String, (f64, u64)>,
) -> Vec<GroupRow> {
    let named: Vec<(String, u64, f64)> = match grouping {
        Grouping::Process => return Vec::new(),
        Grouping::Container => containers
            .iter()
            .map(|c| {
                (
                    super::super::container_label(c),
                    c.on_cpu_ns,
                    c.energy.total_j,
                )
            })
            .collect(),
        Grouping::Cgroup => cgroups
            .iter()
            .map(|c| (c.path.clone(), c.on_cpu_ns, c.energy.total_j))
            .collect(),
        // Named by job, not step: the name is the key its power is
        // found by, and a job's steps come and go.
        Grouping::Job => jobs
            .iter()
            .map(|j| (super::super::job_name(j), j.on_cpu_ns, j.energy.total_j))
            .collect(),
    };
    let mut now = HashMap::with_capacity(named.len());
    let rows = named
        .into_iter()
        .map(|(name, ns, j)| {
            let was = before.get(&name).copied();
            now.insert(name.clone(), (j, ns));
            GroupRow {
                name,
                cpu_pct: was.map(|(_, ns0)| 100.0 * ns.saturating_sub(ns0) as f64 / 1e9 / dur_s),
                power_w: was.map(|(j0, _)| (j - j0).max(0.0) / dur_s),
                energy_j: j,
            }
        })
        .collect();
    *before = now;
    rows
}
