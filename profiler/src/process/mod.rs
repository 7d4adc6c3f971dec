//! Processes built from tracker samples: names, lineage, lifetimes, and the
//! command tree a run follows.
//!
//! Lineage comes from the kernel's fork records, so a process that lived a
//! millisecond still has its parent. Processes that predate wattprof get
//! their parent from `/proc` when first seen.

pub(crate) mod batch;
pub(crate) mod cgroup;
pub(crate) mod container;
pub(crate) mod containerd;
pub(crate) mod docker;
pub(crate) mod names;
pub(crate) mod symbols;
pub(crate) mod vm;

use crate::hash::IntMap;
use std::path::PathBuf;

use crate::tracker::{CpuSample, PackageNs, TaskEvent, TaskTime, comm_is, comm_to_string};

/// Parent lookup for processes that started before wattprof.
pub(crate) trait ProcMeta {
    /// The parent process id of `pid`, if it is still alive.
    fn parent_of(&self, pid: u32) -> Option<u32>;

    /// The name of `pid` (`/proc/PID/comm`), if it is still alive.
    fn comm_of(&self, _pid: u32) -> Option<String> {
        None
    }

    /// The command line of `pid` for people ([`short_args`]), if it is
    /// still alive and has one.
    fn args_of(&self, _pid: u32) -> Option<String> {
        None
    }
}

/// The longest command line kept for a process (bytes): enough to tell
/// workers apart (`python3 train.py --rank 3`), bounded for a long
/// `monitor`.
pub(crate) const ARGS_MAX: usize = 200;

/// `argv` joined by spaces, control characters (an argument's newlines)
/// made spaces so it stays on one row, and cut to [`ARGS_MAX`] bytes (on a
/// character boundary, with `...`); `None` when it is empty (a kernel
/// thread).
pub(crate) fn short_args(argv: &[String]) -> Option<String> {
    let mut s: String = argv
        .join(" ")
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if s.is_empty() {
        return None;
    }
    if s.len() > ARGS_MAX {
        let mut cut = ARGS_MAX - 3;
        while !s.is_char_boundary(cut) {
            cut -= 1;
        }
        s.truncate(cut);
        s.push_str("...");
    }
    Some(s)
}

/// `uid`'s login name, from the password database (`getpwuid_r`).
pub(crate) fn user_name(uid: u32) -> Option<String> {
    let mut buf = vec![0 as libc::c_char; 4096];
    // SAFETY: a zeroed passwd is a valid out-parameter.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut out: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: valid pointers, and the buffer's true length.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut out) };
    if rc != 0 || out.is_null() || pwd.pw_name.is_null() {
        return None;
    }
    // SAFETY: getpwuid_r wrote a NUL-terminated name into `buf`, alive here.
    let name = unsafe { std::ffi::CStr::from_ptr(pwd.pw_name) };
    Some(name.to_string_lossy().into_owned())
}

/// [`ProcMeta`] over a procfs mount.
#[derive(Clone, Debug)]
pub(crate) struct ProcFs {
    root: PathBuf,
}

impl ProcFs {
    /// The real `/proc`.
    pub(crate) fn real() -> Self {
        Self {
            root: PathBuf::from("/proc"),
        }
    }

    /// A copy of `/proc` at `root` (tests).
    #[cfg(test)]
    pub(crate) fn at(root: PathBuf) -> Self {
        Self { root }
    }
}

/// A process's resident memory, from `/proc/PID/smaps_rollup`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Memory {
    /// Proportional set size: private pages plus its share of shared ones.
    pub(crate) pss_bytes: u64,
    /// Unique set size: pages only this process maps (private clean +
    /// private dirty + private huge pages).
    pub(crate) uss_bytes: u64,
}

/// Parses `smaps_rollup` (kB fields).
pub(crate) fn parse_smaps_rollup(text: &str) -> Option<Memory> {
    let mut m = Memory::default();
    let mut seen = false;
    for line in text.lines() {
        let Some((key, rest)) = line.split_once(':') else {
            continue;
        };
        let kb = || -> u64 {
            rest.split_whitespace()
                .next()
                .and_then(|v| v.parse().ok())
                .unwrap_or(0)
        };
        match key {
            "Pss" => {
                m.pss_bytes = kb() * 1024;
                seen = true;
            }
            "Private_Clean" | "Private_Dirty" | "Private_Hugetlb" => m.uss_bytes += kb() * 1024,
            _ => {}
        }
    }
    seen.then_some(m)
}

impl ProcFs {
    /// Whether `/proc` lists `pid` (alive, or a zombie not yet reaped).
    pub(crate) fn lists(&self, pid: u32) -> bool {
        self.root.join(pid.to_string()).exists()
    }

    /// The command line of `pid`, its arguments (empty when it is gone or
    /// has none, as kernel threads).
    pub(crate) fn cmdline(&self, pid: u32) -> Vec<String> {
        std::fs::read(self.root.join(pid.to_string()).join("cmdline"))
            .map(|b| {
                b.split(|c| *c == 0)
                    .filter(|a| !a.is_empty())
                    .map(|a| String::from_utf8_lossy(a).into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// The effective uid of `pid` (`Uid:` in `/proc/PID/status`, as `ps`
    /// shows it), if it is alive. Not `/proc/PID`'s owner: that is root
    /// for a process that made itself undumpable.
    pub(crate) fn effective_uid(&self, pid: u32) -> Option<u32> {
        let text = std::fs::read_to_string(self.root.join(pid.to_string()).join("status")).ok()?;
        parse_effective_uid(&text)
    }

    /// When `pid` started (clock ticks since boot, `/proc/PID/stat`'s 22nd
    /// field): with the pid, it names one process, where a pid alone may
    /// be another's by now.
    pub(crate) fn start_ticks(&self, pid: u32) -> Option<u64> {
        let stat = std::fs::read_to_string(self.root.join(pid.to_string()).join("stat")).ok()?;
        // After the name (in parentheses, anything in it): state is the
        // 3rd field, so the 22nd is the 20th after it.
        stat[stat.rfind(')')? + 1..]
            .split_whitespace()
            .nth(19)?
            .parse()
            .ok()
    }

    /// The bytes of `/proc/PID/cmdline` as they are (empty when gone).
    pub(crate) fn cmdline_bytes(&self, pid: u32) -> Vec<u8> {
        std::fs::read(self.root.join(pid.to_string()).join("cmdline")).unwrap_or_default()
    }

    /// The real uid of `pid` (`/proc/PID/status`), if it is alive.
    pub(crate) fn real_uid(&self, pid: u32) -> Option<u32> {
        let status =
            std::fs::read_to_string(self.root.join(pid.to_string()).join("status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()
    }

    /// The text of `/proc/PID/cgroup` (empty when it cannot be read).
    pub(crate) fn cgroup(&self, pid: u32) -> String {
        std::fs::read_to_string(self.root.join(pid.to_string()).join("cgroup")).unwrap_or_default()
    }

    /// Memory of `pid`, if it is alive and readable (kernel threads have
    /// none).
    pub(crate) fn memory(&self, pid: u32) -> Option<Memory> {
        let text =
            std::fs::read_to_string(self.root.join(pid.to_string()).join("smaps_rollup")).ok()?;
        parse_smaps_rollup(&text)
    }
}

/// The effective uid in a `/proc/PID/status` text (`Uid:` real,
/// effective, saved, filesystem).
fn parse_effective_uid(status: &str) -> Option<u32> {
    let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

impl Process {
    /// Its name for people: `comm`, or `[PID]` where none could be had (a
    /// process gone before it was named), never empty.
    pub(crate) fn name(&self) -> String {
        let mut name = String::new();
        self.write_name(&mut name);
        name
    }

    /// Writes [`Self::name`] at the end of `out` (which keeps its
    /// allocation: the rows of every interval are written over).
    pub(crate) fn write_name(&self, out: &mut String) {
        if self.comm.is_empty() {
            unnamed(self.pid, out);
        } else {
            out.push_str(&self.comm);
        }
    }
}

/// The name of a process that has none: `[PID]`, written at the end of
/// `out`.
pub(crate) fn unnamed(pid: u32, out: &mut String) {
    use std::fmt::Write as _;
    let _ = write!(out, "[{pid}]");
}

impl ProcMeta for ProcFs {
    fn parent_of(&self, pid: u32) -> Option<u32> {
        let stat = std::fs::read_to_string(self.root.join(pid.to_string()).join("stat")).ok()?;
        // The name is in parentheses and may contain anything: skip to the
        // last ')'. Then: state, ppid.
        let rest = &stat[stat.rfind(')')? + 1..];
        rest.split_whitespace().nth(1)?.parse().ok()
    }

    fn comm_of(&self, pid: u32) -> Option<String> {
        let c = std::fs::read_to_string(self.root.join(pid.to_string()).join("comm")).ok()?;
        let c = c.trim_end_matches('\n');
        (!c.is_empty()).then(|| c.to_string())
    }

    fn args_of(&self, pid: u32) -> Option<String> {
        short_args(&self.cmdline(pid))
    }
}

/// Which group a process belongs to in a run.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Role {
    /// The profiled command or one of its descendants.
    Tree,
    /// wattprof itself.
    Profiler,
    /// Anything else on the machine.
    Other,
}

/// One process (one generation of a pid).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Process {
    /// This record's id in its table (unique for the table's life; a
    /// reused pid gets a new one).
    pub(crate) id: u64,
    /// Process id.
    pub(crate) pid: u32,
    /// Parent process id (at fork time), when known.
    pub(crate) ppid: Option<u32>,
    /// Name (after its last exec).
    pub(crate) comm: String,
    /// Its command line after its last exec ([`short_args`]), as
    /// [`ProcessTable::read_args`] asks; `None` when it was gone first.
    pub(crate) args: Option<String>,
    /// Monotonic ns of its fork, if it was forked while tracked.
    pub(crate) start_ns: Option<u64>,
    /// Monotonic ns of its exit.
    pub(crate) exit_ns: Option<u64>,
    /// On-CPU ns per dense package index, all threads.
    pub(crate) on_cpu_ns: Vec<u64>,
    /// Its group.
    pub(crate) role: Role,
    /// cgroup v2 id of its threads at their last context switch.
    pub(crate) cgroup_id: u64,
}

impl Process {
    /// On-CPU nanoseconds over all packages.
    pub(crate) fn total_ns(&self) -> u64 {
        self.on_cpu_ns.iter().sum()
    }
}

#[derive(Clone, Debug)]
struct PendingFork {
    ts_ns: u64,
    parent_tgid: u32,
    comm: String,
}

/// On-CPU time per group, accumulated.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct GroupTotals {
    /// The command tree.
    pub(crate) tree_ns: u64,
    /// wattprof itself.
    pub(crate) profiler_ns: u64,
    /// Everything else.
    pub(crate) other_ns: u64,
}

/// The processes seen so far, with the command tree marked.
pub(crate) struct ProcessTable<M: ProcMeta> {
    meta: M,
    packages: usize,
    root: Option<u32>,
    profiler_pid: u32,
    next_id: u64,
    records: IntMap<u64, Process>,
    index: IntMap<u32, u64>,
    pending: IntMap<u32, PendingFork>,
    totals: GroupTotals,
    unmatched_forks: u64,
    interval: IntMap<u64, PackageNs>,
    /// This interval's time per process and cgroup, where a process had
    /// time in more than one.
    interval_cgroups: IntMap<u64, CgroupSplit>,
    samples: u64,
    exited_at: IntMap<u64, u64>,
    /// Exited processes forgotten since the last [`ProcessTable::take_forgotten`]:
    /// a `monitor` keeps the ones that used the most energy.
    forgotten: Vec<Process>,
    /// Whose command lines are read.
    args: ArgsOf,
}

/// Whose command lines a [`ProcessTable`] reads (`--cmdline`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ArgsOf {
    /// Nobody's: a command line may hold a secret, and is recorded only
    /// when asked for.
    Nobody,
    /// The command's tree (`run --cmdline`).
    Tree,
    /// Every process (`monitor --cmdline`).
    All,
}

/// Samples an exited process outside the tree is kept for after its exit.
const EXITED_KEEP_SAMPLES: u64 = 3;

/// One process's on-CPU time over one interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct IntervalUsage {
    /// The process record ([`Process::id`]).
    pub(crate) id: u64,
    /// Process id.
    pub(crate) pid: u32,
    /// Its group.
    pub(crate) role: Role,
    /// cgroup v2 id.
    pub(crate) cgroup_id: u64,
    /// Nanoseconds per dense package index.
    pub(crate) on_cpu_ns: PackageNs,
    /// Time of this interval spent in other cgroups than `cgroup_id`
    /// (cgroup v2 id, ns): cgroups the process was moved out of during the
    /// interval, or of threads in other cgroups. Usually empty.
    pub(crate) other_cgroups_ns: Vec<(u64, u64)>,
}

/// A process's time per cgroup over an interval (cgroup v2 id, ns): one
/// cgroup held inline, as nearly always, so the interval allocates
/// nothing for it; more after a move, or with threads in several.
#[derive(Debug, Default)]
struct CgroupSplit {
    first: Option<(u64, u64)>,
    more: Vec<(u64, u64)>,
}

impl CgroupSplit {
    /// `ns` more in `cgroup`.
    fn add(&mut self, cgroup: u64, ns: u64) {
        match &mut self.first {
            None => self.first = Some((cgroup, ns)),
            Some((c, n)) if *c == cgroup => *n += ns,
            Some(_) => match self.more.iter_mut().find(|(c, _)| *c == cgroup) {
                Some(entry) => entry.1 += ns,
                None => self.more.push((cgroup, ns)),
            },
        }
    }

    fn iter(&self) -> impl Iterator<Item = (u64, u64)> + '_ {
        self.first.into_iter().chain(self.more.iter().copied())
    }
}

/// Forks whose task never showed up are dropped after this long.
const PENDING_FORK_TTL_NS: u64 = 30_000_000_000;

impl<M: ProcMeta> ProcessTable<M> {
    /// A table for a machine with `packages` packages.
    pub(crate) fn new(meta: M, packages: usize, profiler_pid: u32) -> Self {
        Self {
            meta,
            packages: packages.max(1),
            root: None,
            profiler_pid,
            next_id: 0,
            records: IntMap::default(),
            index: IntMap::default(),
            pending: IntMap::default(),
            totals: GroupTotals::default(),
            unmatched_forks: 0,
            interval: IntMap::default(),
            interval_cgroups: IntMap::default(),
            samples: 0,
            exited_at: IntMap::default(),
            forgotten: Vec::new(),
            args: ArgsOf::Nobody,
        }
    }

    /// Reads the command lines of `whose` processes: from `/proc` at each
    /// exec, and at first sight of one that was there before wattprof; a
    /// forked child starts with its parent's. One file read per exec.
    pub(crate) fn read_args(&mut self, whose: ArgsOf) {
        self.args = whose;
    }

    /// Whether a process of `role` has its command line read.
    fn wants_args(&self, role: Role) -> bool {
        match self.args {
            ArgsOf::Nobody => false,
            ArgsOf::Tree => role == Role::Tree,
            ArgsOf::All => true,
        }
    }

    /// The exited processes forgotten since the last call (their energy is
    /// still in the ledger until the profile forgets them too).
    pub(crate) fn take_forgotten(&mut self) -> Vec<Process> {
        std::mem::take(&mut self.forgotten)
    }

    /// Follows `pid` and every process it forks from now on.
    pub(crate) fn set_root(&mut self, pid: u32) {
        self.root = Some(pid);
        if let Some(rec) = self.index.get(&pid).and_then(|id| self.records.get_mut(id)) {
            rec.role = Role::Tree;
        }
    }

    /// Group totals so far.
    pub(crate) fn totals(&self) -> &GroupTotals {
        &self.totals
    }

    /// Fork records whose task never appeared (lost events elsewhere).
    pub(crate) fn unmatched_forks(&self) -> u64 {
        self.unmatched_forks
    }

    /// Processes kept in detail: the tree, wattprof, and others still alive
    /// (exited others are folded into the totals and forgotten).
    pub(crate) fn processes(&self) -> impl Iterator<Item = &Process> {
        self.records.values()
    }

    /// Processes of the command tree, in order of start.
    pub(crate) fn tree(&self) -> Vec<&Process> {
        let mut v: Vec<&Process> = self
            .records
            .values()
            .filter(|p| p.role == Role::Tree)
            .collect();
        v.sort_by_key(|p| (p.start_ns.unwrap_or(0), p.pid));
        v
    }

    /// The current process with this pid.
    pub(crate) fn get(&self, pid: u32) -> Option<&Process> {
        self.index.get(&pid).and_then(|id| self.records.get(id))
    }

    /// Folds one sample in and returns each process's time in it (what
    /// energy is divided by). Events and exits are applied in time order,
    /// so a pid that exits and is reused within one interval stays two
    /// processes; time of threads still running is applied last.
    pub(crate) fn apply(&mut self, sample: &CpuSample) -> Vec<IntervalUsage> {
        enum Item<'a> {
            Event(&'a TaskEvent),
            Task(&'a TaskTime),
        }
        let mut timed: Vec<(u64, Item<'_>)> = sample
            .events
            .iter()
            .map(|e| {
                let ts = match e {
                    TaskEvent::Fork { ts_ns, .. } | TaskEvent::Exec { ts_ns, .. } => *ts_ns,
                };
                (ts, Item::Event(e))
            })
            .chain(
                sample
                    .tasks
                    .iter()
                    .filter_map(|t| t.exit_ns.map(|ts| (ts, Item::Task(t)))),
            )
            .collect();
        timed.sort_by_key(|(ts, _)| *ts);
        for (_, item) in timed {
            match item {
                Item::Event(e) => self.event(e),
                Item::Task(t) => self.task(t),
            }
        }
        for t in sample.tasks.iter().filter(|t| t.exit_ns.is_none()) {
            self.task(t);
        }
        self.pending.retain(|_, f| {
            let keep = sample.at_ns.saturating_sub(f.ts_ns) < PENDING_FORK_TTL_NS;
            if !keep {
                self.unmatched_forks += 1;
            }
            keep
        });
        let mut usage: Vec<IntervalUsage> = self
            .interval
            .drain()
            .filter_map(|(id, on_cpu_ns)| {
                let p = self.records.get(&id)?;
                let other_cgroups_ns = self
                    .interval_cgroups
                    .get(&id)
                    .map(|split| {
                        split
                            .iter()
                            .filter(|(cgroup, ns)| *cgroup != p.cgroup_id && *ns > 0)
                            .collect()
                    })
                    .unwrap_or_default();
                Some(IntervalUsage {
                    id,
                    pid: p.pid,
                    role: p.role,
                    cgroup_id: p.cgroup_id,
                    on_cpu_ns,
                    other_cgroups_ns,
                })
            })
            .collect();
        self.interval_cgroups.clear();
        usage.sort_unstable_by_key(|u| u.id);
        // Exited processes outside the tree carry nothing more to report,
        // once their threads' last slices are in: a thread can report after
        // its process's exit (a non-leader thread ending later; kernels
        // before 5.18 report the final slice a read later). Forgetting them
        // sooner would make those slices a new, never-exited process.
        self.samples += 1;
        let samples = self.samples;
        let profiler_pid = self.profiler_pid;
        let index = &mut self.index;
        let exited_at = &mut self.exited_at;
        let forgotten = &mut self.forgotten;
        self.records.retain(|id, p| {
            if p.role != Role::Other || p.exit_ns.is_none() || p.pid == profiler_pid {
                return true;
            }
            let since = *exited_at.entry(*id).or_insert(samples);
            let keep = samples - since < EXITED_KEEP_SAMPLES;
            if !keep {
                exited_at.remove(id);
                if index.get(&p.pid) == Some(id) {
                    index.remove(&p.pid);
                }
                forgotten.push(p.clone());
            }
            keep
        });
        usage
    }

    /// Whether process record `id` is `ancestor_pid`'s process or one of
    /// its descendants (by fork lineage, as far as the table knows it).
    pub(crate) fn descends_from(&self, id: u64, ancestor_pid: u32) -> bool {
        let mut cur = self.records.get(&id);
        // Lineage cannot be deeper than the number of records.
        for _ in 0..=self.records.len() {
            let Some(p) = cur else { return false };
            if p.pid == ancestor_pid {
                return true;
            }
            cur = p
                .ppid
                .and_then(|pp| self.index.get(&pp))
                .and_then(|i| self.records.get(i));
        }
        false
    }

    /// The record of the current process with this pid.
    pub(crate) fn id_of(&self, pid: u32) -> Option<u64> {
        self.index.get(&pid).copied()
    }

    /// Records kept (live and exited not yet forgotten).
    pub(crate) fn len(&self) -> usize {
        self.records.len()
    }

    /// A process record by id (exited processes outside the tree are
    /// forgotten once their last interval was applied).
    pub(crate) fn by_id(&self, id: u64) -> Option<&Process> {
        self.records.get(&id)
    }

    fn event(&mut self, e: &TaskEvent) {
        match e {
            TaskEvent::Fork {
                ts_ns,
                child,
                parent_tgid,
                comm,
                ..
            } => {
                // A pid is only reused once its previous owner was reaped.
                if let Some(id) = self.index.remove(child)
                    && let Some(old) = self.records.get_mut(&id)
                {
                    old.exit_ns.get_or_insert(*ts_ns);
                }
                self.pending.insert(
                    *child,
                    PendingFork {
                        ts_ns: *ts_ns,
                        parent_tgid: *parent_tgid,
                        comm: comm.clone(),
                    },
                );
            }
            TaskEvent::Exec {
                tid, tgid, comm, ..
            } => {
                let id = self.ensure(*tgid, *tid);
                let wants = self
                    .records
                    .get(&id)
                    .is_some_and(|rec| self.wants_args(rec.role));
                // Gone already: the line before the exec is not it.
                let args = wants.then(|| self.meta.args_of(*tgid)).flatten();
                if let Some(rec) = self.records.get_mut(&id) {
                    rec.comm = comm.clone();
                    if wants {
                        rec.args = args;
                    }
                }
            }
        }
    }

    fn task(&mut self, t: &TaskTime) {
        let id = self.ensure(t.tgid, t.tid);
        let Some(rec) = self.records.get_mut(&id) else {
            return;
        };
        for (acc, ns) in rec.on_cpu_ns.iter_mut().zip(t.on_cpu_ns.iter()) {
            *acc += ns;
        }
        rec.cgroup_id = t.cgroup_id;
        let iv = self
            .interval
            .entry(id)
            .or_insert_with(|| PackageNs::zeros(t.on_cpu_ns.len()));
        for (acc, ns) in iv.iter_mut().zip(t.on_cpu_ns.iter()) {
            *acc += ns;
        }
        let total = t.total_ns();
        // A second cgroup in one interval (a move, or threads in different
        // cgroups): keep the time per cgroup.
        self.interval_cgroups
            .entry(id)
            .or_default()
            .add(t.cgroup_id, total);
        match rec.role {
            Role::Tree => self.totals.tree_ns += total,
            Role::Profiler => self.totals.profiler_ns += total,
            Role::Other => self.totals.other_ns += total,
        }
        if t.tid == t.tgid {
            // Named again only when the name changed (an exec seen first
            // here): this runs for every task every interval.
            if t.comm[0] != 0 && !comm_is(&rec.comm, &t.comm) {
                rec.comm = comm_to_string(&t.comm);
            }
            if let Some(exit) = t.exit_ns {
                rec.exit_ns = Some(exit);
            }
        }
    }

    /// The record of process `tgid`, created on first sight.
    fn ensure(&mut self, tgid: u32, tid: u32) -> u64 {
        if tid != tgid {
            // A thread: its fork record is not a process's.
            self.pending.remove(&tid);
        }
        if let Some(id) = self.index.get(&tgid) {
            return *id;
        }
        let fork = self.pending.remove(&tgid);
        // A parent forked in this interval that has not shown up yet (a
        // subshell that neither exec'd nor exited) gets its record first,
        // so its children inherit its place in the tree. Parents precede
        // children in time, so this chain ends.
        if let Some(f) = &fork
            && !self.index.contains_key(&f.parent_tgid)
            && self.pending.contains_key(&f.parent_tgid)
        {
            self.ensure(f.parent_tgid, f.parent_tgid);
        }
        // A process seen before it ran under wattprof, or first through a
        // thread other than its leader (containerd's and dockerd's leaders
        // sleep while their other threads work): named from /proc now, as
        // its leader's own slices would name it only if it ran.
        let (ppid, start_ns, comm) = match fork {
            Some(f) => (Some(f.parent_tgid), Some(f.ts_ns), f.comm),
            None => (
                self.meta.parent_of(tgid),
                None,
                self.meta.comm_of(tgid).unwrap_or_default(),
            ),
        };
        let parent_in_tree = ppid
            .and_then(|pp| self.index.get(&pp))
            .and_then(|id| self.records.get(id))
            .is_some_and(|p| p.role == Role::Tree);
        let role = if Some(tgid) == self.root || (start_ns.is_some() && parent_in_tree) {
            Role::Tree
        } else if tgid == self.profiler_pid {
            Role::Profiler
        } else {
            Role::Other
        };
        // A forked child runs its parent's program until it execs (read
        // then); one that predates wattprof is read now.
        let args = if !self.wants_args(role) {
            None
        } else if start_ns.is_some() {
            ppid.and_then(|pp| self.index.get(&pp))
                .and_then(|id| self.records.get(id))
                .and_then(|p| p.args.clone())
        } else {
            self.meta.args_of(tgid)
        };
        let id = self.next_id;
        self.next_id += 1;
        self.records.insert(
            id,
            Process {
                id,
                pid: tgid,
                ppid,
                comm,
                args,
                start_ns,
                exit_ns: None,
                on_cpu_ns: vec![0; self.packages],
                role,
                cgroup_id: 0,
            },
        );
        self.index.insert(tgid, id);
        id
    }
}

#[cfg(test)]
mod tests;
