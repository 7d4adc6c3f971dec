//! Processes built from tracker samples: names, lineage, lifetimes, and the
//! command tree a run follows.
//!
//! Lineage comes from the kernel's fork records, so a process that lived a
//! millisecond still has its parent. Processes that predate wattprof get
//! their parent from `/proc` when first seen.

pub(crate) mod cgroup;
pub(crate) mod container;
pub(crate) mod containerd;
pub(crate) mod docker;
pub(crate) mod names;
pub(crate) mod symbols;
pub(crate) mod vm;

use crate::hash::IntMap;
use std::path::PathBuf;

use crate::tracker::{CpuSample, TaskEvent, TaskTime};

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

impl Process {
    /// Its name for people: `comm`, or `[PID]` where none could be had (a
    /// process gone before it was named), never empty.
    pub(crate) fn name(&self) -> String {
        if self.comm.is_empty() {
            format!("[{}]", self.pid)
        } else {
            self.comm.clone()
        }
    }
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
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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
    interval: IntMap<u64, Vec<u64>>,
    /// This interval's time per process and cgroup, where a process had
    /// time in more than one.
    interval_cgroups: IntMap<u64, Vec<(u64, u64)>>,
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
    pub(crate) on_cpu_ns: Vec<u64>,
    /// Time of this interval spent in other cgroups than `cgroup_id`
    /// (cgroup v2 id, ns): cgroups the process was moved out of during the
    /// interval, or of threads in other cgroups. Usually empty.
    pub(crate) other_cgroups_ns: Vec<(u64, u64)>,
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
                    .remove(&id)
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|(cgroup, ns)| *cgroup != p.cgroup_id && *ns > 0)
                    .collect();
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
        for (acc, ns) in rec.on_cpu_ns.iter_mut().zip(&t.on_cpu_ns) {
            *acc += ns;
        }
        rec.cgroup_id = t.cgroup_id;
        let iv = self
            .interval
            .entry(id)
            .or_insert_with(|| vec![0; t.on_cpu_ns.len()]);
        for (acc, ns) in iv.iter_mut().zip(&t.on_cpu_ns) {
            *acc += ns;
        }
        let total = t.total_ns();
        // A second cgroup in one interval (a move, or threads in different
        // cgroups): keep the time per cgroup.
        let split = self.interval_cgroups.entry(id).or_default();
        match split.iter_mut().find(|(c, _)| *c == t.cgroup_id) {
            Some(entry) => entry.1 += total,
            None => split.push((t.cgroup_id, total)),
        }
        match rec.role {
            Role::Tree => self.totals.tree_ns += total,
            Role::Profiler => self.totals.profiler_ns += total,
            Role::Other => self.totals.other_ns += total,
        }
        if t.tid == t.tgid {
            if !t.comm.is_empty() && rec.comm != t.comm {
                rec.comm.clone_from(&t.comm);
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
mod tests {
    use super::*;

    #[test]
    fn a_command_line_is_one_row_and_bounded() {
        let argv = |a: &[&str]| a.iter().map(|s| (*s).to_string()).collect::<Vec<_>>();
        assert_eq!(short_args(&[]), None);
        assert_eq!(
            short_args(&argv(&["python3", "-c", "a\nb\tc", "--rank", "3"])).as_deref(),
            Some("python3 -c a b c --rank 3")
        );
        // Cut on a character boundary: 'é' is two bytes.
        let long = short_args(&argv(&[&"é".repeat(150)])).expect("some");
        assert!(long.len() <= ARGS_MAX && long.ends_with("..."), "{long}");
        assert!(long.starts_with("éé"));
    }

    /// `/proc` as a map: parents and command lines.
    struct Args;
    impl ProcMeta for Args {
        fn parent_of(&self, _: u32) -> Option<u32> {
            None
        }
        fn args_of(&self, pid: u32) -> Option<String> {
            Some(format!("worker --rank {pid}"))
        }
    }

    #[test]
    fn the_trees_command_lines_are_read_and_others_only_when_asked() {
        let task = |tgid: u32| TaskTime {
            tid: tgid,
            tgid,
            comm: "w".into(),
            on_cpu_ns: vec![1_000],
            exit_ns: None,
            cgroup_id: 0,
        };
        let sample = |tasks: Vec<TaskTime>| CpuSample {
            tasks,
            ..CpuSample::default()
        };
        let args = |t: &ProcessTable<Args>, pid: u32| t.get(pid).and_then(|p| p.args.clone());
        // Not asked: nobody's (a command line may hold a secret).
        let mut none = ProcessTable::new(Args, 1, 99);
        none.set_root(10);
        none.apply(&sample(vec![task(10)]));
        assert_eq!(args(&none, 10), None);
        let mut t = ProcessTable::new(Args, 1, 99);
        t.read_args(ArgsOf::Tree);
        t.set_root(10);
        t.apply(&sample(vec![task(10), task(11)]));
        assert_eq!(args(&t, 10).as_deref(), Some("worker --rank 10"));
        assert_eq!(args(&t, 11), None, "not the tree's");
        // A forked child has its parent's line until it execs; at the exec
        // it is read.
        t.apply(&CpuSample {
            events: vec![TaskEvent::Fork {
                ts_ns: 5,
                child: 12,
                parent_tid: 10,
                parent_tgid: 10,
                comm: "w".into(),
            }],
            ..sample(vec![task(12)])
        });
        assert_eq!(args(&t, 12).as_deref(), Some("worker --rank 10"));
        t.apply(&CpuSample {
            events: vec![TaskEvent::Exec {
                ts_ns: 6,
                tid: 12,
                tgid: 12,
                comm: "x".into(),
            }],
            ..sample(vec![task(12)])
        });
        assert_eq!(args(&t, 12).as_deref(), Some("worker --rank 12"));
        let mut all = ProcessTable::new(Args, 1, 99);
        all.read_args(ArgsOf::All);
        all.apply(&sample(vec![task(11)]));
        assert_eq!(args(&all, 11).as_deref(), Some("worker --rank 11"));
    }

    #[test]
    fn smaps_rollup_gives_pss_and_uss() {
        let text = "55d0c0a00000-7ffd1c9d4000 ---p 00000000 00:00 0    [rollup]\n\
                    Rss:                5120 kB\n\
                    Pss:                2048 kB\n\
                    Pss_Anon:           1024 kB\n\
                    Shared_Clean:       3072 kB\n\
                    Private_Clean:       512 kB\n\
                    Private_Dirty:      1024 kB\n\
                    Private_Hugetlb:       0 kB\n";
        assert_eq!(
            parse_smaps_rollup(text),
            Some(Memory {
                pss_bytes: 2048 * 1024,
                uss_bytes: 1536 * 1024
            })
        );
        assert_eq!(parse_smaps_rollup(""), None);
        // This test's own process has memory.
        let me = ProcFs::real()
            .memory(std::process::id())
            .expect("own smaps_rollup");
        assert!(me.pss_bytes > 0 && me.uss_bytes > 0 && me.uss_bytes <= me.pss_bytes + 4096);
    }

    struct NoProc;
    impl ProcMeta for NoProc {
        fn parent_of(&self, pid: u32) -> Option<u32> {
            (pid == 500).then_some(1)
        }
    }

    fn fork(ts: u64, child: u32, parent: u32, comm: &str) -> TaskEvent {
        TaskEvent::Fork {
            ts_ns: ts,
            child,
            parent_tid: parent,
            parent_tgid: parent,
            comm: comm.into(),
        }
    }

    fn task(tid: u32, tgid: u32, ns: u64, exit: Option<u64>, comm: &str) -> TaskTime {
        TaskTime {
            tid,
            tgid,
            cgroup_id: 1,
            comm: comm.into(),
            on_cpu_ns: vec![ns, 0],
            exit_ns: exit,
        }
    }

    fn sample(at: u64, events: Vec<TaskEvent>, tasks: Vec<TaskTime>) -> CpuSample {
        CpuSample {
            at_ns: at,
            events,
            tasks,
            ..CpuSample::default()
        }
    }

    #[test]
    fn tree_follows_forks_and_threads_fold_into_their_process() {
        let mut t = ProcessTable::new(NoProc, 2, 99);
        t.set_root(100);
        t.apply(&sample(
            10,
            vec![
                fork(1, 100, 99, "wattprof"),
                TaskEvent::Exec {
                    ts_ns: 2,
                    tid: 100,
                    tgid: 100,
                    comm: "sh".into(),
                },
                fork(3, 101, 100, "sh"),
                fork(4, 102, 101, "sh"),
                // A thread of 101.
                fork(5, 103, 101, "sh"),
            ],
            vec![
                task(100, 100, 10, None, "sh"),
                task(101, 101, 20, Some(8), "burn"),
                task(103, 101, 5, Some(7), "burn"),
                task(102, 102, 7, None, "short"),
                task(99, 99, 3, None, "wattprof"),
                task(500, 500, 11, None, "other"),
            ],
        ));
        let tree = t.tree();
        let pids: Vec<u32> = tree.iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![100, 101, 102]);
        let p101 = t.get(101).expect("101");
        assert_eq!(
            (p101.total_ns(), p101.ppid, p101.exit_ns),
            (25, Some(100), Some(8))
        );
        assert_eq!(p101.comm, "burn");
        assert_eq!(t.get(102).expect("102").ppid, Some(101));
        assert_eq!(t.get(500).expect("500").ppid, Some(1), "from /proc");
        assert_eq!(
            t.totals(),
            &GroupTotals {
                tree_ns: 42,
                profiler_ns: 3,
                other_ns: 11
            }
        );
    }

    #[test]
    fn pid_reused_within_one_interval_is_two_processes() {
        let mut t = ProcessTable::new(NoProc, 2, 99);
        t.set_root(100);
        t.apply(&sample(
            10,
            vec![fork(1, 100, 99, "sh")],
            vec![task(100, 100, 1, None, "sh")],
        ));
        t.apply(&sample(
            20,
            vec![fork(11, 200, 100, "sh"), fork(15, 200, 100, "sh")],
            vec![
                // First 200 exits at 12 (before the reuse at 15); the second
                // is still running at the end of the interval.
                task(200, 200, 30, Some(12), "first"),
                task(200, 200, 4, None, "second"),
            ],
        ));
        let mut two: Vec<&Process> = t.tree().into_iter().filter(|p| p.pid == 200).collect();
        two.sort_by_key(|p| p.start_ns);
        assert_eq!(two.len(), 2);
        assert_eq!(
            (two[0].comm.as_str(), two[0].total_ns(), two[0].exit_ns),
            ("first", 30, Some(12))
        );
        assert_eq!(
            (two[1].comm.as_str(), two[1].total_ns(), two[1].exit_ns),
            ("second", 4, None)
        );
    }

    #[test]
    fn children_of_a_parent_not_seen_yet_stay_in_the_tree() {
        let mut t = ProcessTable::new(NoProc, 2, 99);
        t.set_root(100);
        t.apply(&sample(
            10,
            vec![fork(1, 100, 99, "sh")],
            vec![task(100, 100, 1, None, "sh")],
        ));
        // `n=$(grep x f | wc -l)`: subshell 201 neither execs nor exits in
        // the interval; its children exec and exit before it is seen.
        t.apply(&sample(
            20,
            vec![
                fork(11, 201, 100, "sh"),
                fork(12, 202, 201, "sh"),
                TaskEvent::Exec {
                    ts_ns: 13,
                    tid: 202,
                    tgid: 202,
                    comm: "grep".into(),
                },
                fork(14, 203, 201, "sh"),
            ],
            vec![
                task(202, 202, 5, Some(15), "grep"),
                task(203, 203, 6, Some(16), "wc"),
                task(201, 201, 2, None, "sh"),
            ],
        ));
        let pids: Vec<u32> = t.tree().iter().map(|p| p.pid).collect();
        assert_eq!(pids, vec![100, 201, 202, 203]);
        assert_eq!(t.totals().tree_ns, 14);
        assert_eq!(t.totals().other_ns, 0);
    }

    #[test]
    fn exited_processes_outside_the_tree_are_folded_and_forgotten() {
        let mut t = ProcessTable::new(NoProc, 2, 99);
        t.set_root(100);
        t.apply(&sample(
            10,
            vec![fork(1, 300, 1, "cron")],
            vec![task(300, 300, 9, Some(5), "cron")],
        ));
        // A thread of it that reports after the exit (a non-leader thread,
        // or the final slice on kernels before 5.18) still lands on it.
        t.apply(&sample(20, vec![], vec![task(301, 300, 4, None, "cron")]));
        let id = t.id_of(300).expect("kept for the late slice");
        assert_eq!(t.by_id(id).map(Process::total_ns), Some(13));
        t.apply(&sample(30, vec![], vec![]));
        t.apply(&sample(40, vec![], vec![]));
        assert!(t.get(300).is_none(), "forgotten a few samples later");
        assert_eq!(t.totals().other_ns, 13);
    }

    #[test]
    fn unmatched_forks_expire() {
        let mut t = ProcessTable::new(NoProc, 1, 99);
        t.apply(&sample(10, vec![fork(1, 700, 1, "x")], vec![]));
        assert_eq!(t.unmatched_forks(), 0);
        t.apply(&sample(PENDING_FORK_TTL_NS + 10, vec![], vec![]));
        assert_eq!(t.unmatched_forks(), 1);
    }

    #[test]
    fn time_in_two_cgroups_in_one_interval_is_kept_per_cgroup() {
        let mut t = ProcessTable::new(NoProc, 2, 99);
        let moved = |cgroup, ns| TaskTime {
            cgroup_id: cgroup,
            ..task(400, 400, ns, None, "svc")
        };
        // The tracker splits a thread's time at a cgroup move: 30 ns in
        // cgroup 7 before it, 12 in cgroup 9 after.
        let usage = t.apply(&sample(10, vec![], vec![moved(7, 30), moved(9, 12)]));
        let u = usage.iter().find(|u| u.pid == 400).expect("usage");
        assert_eq!(u.cgroup_id, 9);
        assert_eq!(u.on_cpu_ns, vec![42, 0]);
        assert_eq!(u.other_cgroups_ns, vec![(7, 30)]);
        // The next interval, in one cgroup: nothing else.
        let usage = t.apply(&sample(20, vec![], vec![moved(9, 5)]));
        assert!(usage[0].other_cgroups_ns.is_empty());
    }
}
