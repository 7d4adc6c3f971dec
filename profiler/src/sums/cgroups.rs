//! Sums per cgroup and container: filled each interval, named while the
//! cgroups exist, pruned into per-path sums on a host that creates
//! cgroups all day, and reported per cgroup and per container.

use std::collections::HashMap;

use super::most_energy_first;
use crate::attribution::{ConsumerId, EnergyBy};
use crate::carbon::CarbonIntensity;
use crate::hash::IntMap;
use crate::model::{CgroupReport, ContainerReport, EnergyJ, JobReport, JobStepReport};
use crate::process::cgroup::CgroupNames;
use crate::process::container::Container;
use crate::process::names::{ContainerNames, RuntimeSockets};
use crate::process::{IntervalUsage, ProcFs};

/// A cgroup whose processes have not run for this long is folded into its
/// path's sums (and looked up again if they run again): a host that
/// creates cgroups all day keeps one entry per path, not per cgroup.
pub(crate) const PRUNE_AFTER_NS: u64 = 120_000_000_000;

/// How often cgroups are pruned.
pub(crate) const PRUNE_EVERY_NS: u64 = 10_000_000_000;

/// Paths of pruned cgroups kept one by one (those that ran least recently
/// beyond this are summed together, `[N older cgroups]`).
pub(crate) const MAX_PRUNED_PATHS: usize = 10_000;

/// One cgroup's sums.
#[derive(Clone, Debug, Default)]
pub(crate) struct CgroupSum {
    pub(crate) on_cpu_ns: u64,
    pub(crate) energy: EnergyBy,
    /// Its path, once found.
    pub(crate) name: Option<String>,
    /// When a process of it last ran (monotonic ns).
    pub(crate) last_ns: u64,
    /// When a process of it first ran (monotonic ns, 0: not yet).
    pub(crate) first_ns: u64,
    /// Its path was looked at for a container (once named).
    pub(crate) recognized: bool,
    /// The container it is, if it is one.
    pub(crate) container: Option<crate::process::container::Container>,
    /// Its runtime was asked for the container's name.
    pub(crate) name_asked: bool,
    /// That container's name, once its runtime answered.
    pub(crate) container_name: Option<String>,
}

impl CgroupSum {
    /// A process of it ran in the interval that ended at `at_ns`.
    fn ran(&mut self, at_ns: u64) {
        self.last_ns = at_ns;
        if self.first_ns == 0 {
            self.first_ns = at_ns;
        }
    }
}

/// How many intervals a process's v1 path that names no batch job is
/// read again, where a scheduler keeps its jobs on v1.
const V1_READS: u8 = 3;

/// What the process table knows of a process's ancestry, for the jobs no
/// cgroup names ([`Cgroups::v1_cgroups`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Lineage {
    /// Its parent's record.
    pub(crate) parent: Option<ConsumerId>,
    /// The pids of the processes named `slurmstepd` above it, nearest
    /// first (which of them is root's is asked of `/proc`).
    pub(crate) stepds: Vec<u32>,
    /// Look again at a later interval: the process is itself still
    /// named `slurmstepd` (forked, not yet the job's program, nor its
    /// user's), or the walk met a parent the table does not have yet.
    pub(crate) again: bool,
}

/// What a process's `slurmstepd` says of its job.
enum Stepd {
    /// Its job's key (named `slurmstepd:/slurm/...`).
    Job(u64),
    /// It was gone before it could be read.
    Gone,
    /// No job, or not looked for.
    None,
}

/// What was read of a process's v1 cgroups.
#[derive(Clone, Copy, Debug)]
struct V1 {
    /// The key of the cgroup it is counted in (`None`: its v2 one).
    key: Option<u64>,
    /// That cgroup is a batch job's.
    job: bool,
    /// Times read.
    reads: u8,
}

/// Whether a scheduler's tree is on one of the v1 hierarchies mounted
/// under `mount` (Slurm's `slurm` or `slurm_NODE` at a hierarchy's top).
/// A cgroup2 mount is no v1 hierarchy: `mount` itself on a unified host
/// (a unit named `slurm_exporter.service` there is not a job tree), or
/// the `unified` one of a hybrid host.
fn batch_tree_on_v1(mount: &std::path::Path) -> bool {
    let v2 = |dir: &std::path::Path| dir.join("cgroup.controllers").exists();
    if v2(mount) {
        return false;
    }
    let Ok(hierarchies) = std::fs::read_dir(mount) else {
        return false;
    };
    hierarchies.flatten().filter(|h| !v2(&h.path())).any(|h| {
        std::fs::read_dir(h.path()).is_ok_and(|mut top| {
            top.any(|e| {
                e.is_ok_and(|e| {
                    let n = e.file_name();
                    let n = n.to_string_lossy();
                    (n == "slurm" || n.starts_with("slurm_")) && e.path().is_dir()
                })
            })
        })
    })
}

/// Adds `c`'s sums to `into` (its path kept, its last run the later).
fn fold(into: &mut CgroupSum, c: &CgroupSum) {
    into.on_cpu_ns += c.on_cpu_ns;
    into.energy.merge(&c.energy);
    into.last_ns = into.last_ns.max(c.last_ns);
    into.first_ns = match (into.first_ns, c.first_ns) {
        (0, f) | (f, 0) => f,
        (a, b) => a.min(b),
    };
    if into.name.is_none() {
        into.name.clone_from(&c.name);
    }
    into.recognized |= c.recognized;
    into.name_asked |= c.name_asked;
    if into.container.is_none() {
        into.container.clone_from(&c.container);
    }
    if c.container_name.is_some() {
        into.container_name.clone_from(&c.container_name);
    }
}

/// Every cgroup's sums, by id while its processes run, by path once
/// pruned; with the names of cgroups and of the containers they are.
pub(crate) struct Cgroups {
    by_id: IntMap<u64, CgroupSum>,
    /// Sums of cgroups pruned from `by_id`, per path.
    pruned: HashMap<String, CgroupSum>,
    /// Paths pruned from `pruned` past [`MAX_PRUNED_PATHS`]: how many, and
    /// their sums together.
    older: (u64, CgroupSum),
    /// When cgroups were last pruned (monotonic ns).
    pruned_at_ns: u64,
    names: CgroupNames,
    /// The cgroup2 root's id (a process there on a hybrid host is named
    /// by its v1 path).
    root: Option<u64>,
    /// Each process's v1 cgroup key, where its v2 cgroup is the root or
    /// it is in a batch job's v1 cgroup.
    v1: IntMap<ConsumerId, V1>,
    /// Processes whose lineage was looked at for a job without cgroups,
    /// and how many times (a look that asked again is retried, up to
    /// [`V1_READS`]).
    stepd_done: IntMap<ConsumerId, u8>,
    /// A scheduler keeps its jobs on the v1 hierarchies here (looked
    /// for at the start and at each prune): every process's v1 path is
    /// then read for a job, not only those at the cgroup2 root.
    batch_v1: bool,
    /// The v1 hierarchies' mount (`/sys/fs/cgroup`), where a scheduler's
    /// tree is looked for; `None`: not looked for (a test's fixture).
    v1_mount: Option<std::path::PathBuf>,
    /// Login names of the uids jobs belong to, looked up once each.
    users: std::sync::Mutex<IntMap<u32, String>>,
    containers: ContainerNames,
}

impl Cgroups {
    /// Named from the cgroup2 file system at `cgroupfs` (`None`: this
    /// machine's mount); containers named by asking `runtimes`.
    pub(crate) fn new(cgroupfs: Option<&std::path::Path>, runtimes: &RuntimeSockets) -> Self {
        let names = |refresh_ns| {
            cgroupfs.map_or_else(
                || CgroupNames::real(refresh_ns),
                |root| CgroupNames::new(root, refresh_ns),
            )
        };
        Self {
            by_id: IntMap::default(),
            pruned: HashMap::new(),
            older: (0, CgroupSum::default()),
            pruned_at_ns: 0,
            names: names(1_000_000_000),
            root: names(0).root_id(),
            v1: IntMap::default(),
            stepd_done: IntMap::default(),
            batch_v1: cgroupfs.is_none()
                && batch_tree_on_v1(std::path::Path::new("/sys/fs/cgroup")),
            v1_mount: cgroupfs
                .is_none()
                .then(|| std::path::PathBuf::from("/sys/fs/cgroup")),
            users: std::sync::Mutex::default(),
            containers: ContainerNames::new(runtimes),
        }
    }

    /// Folds cgroups whose processes have not run for [`PRUNE_AFTER_NS`]
    /// into their path's sums (every [`PRUNE_EVERY_NS`]); keeps at most
    /// [`MAX_PRUNED_PATHS`] paths, summing the least recently run beyond.
    /// Per-path and per-container figures, and so the exporter's counters,
    /// are unchanged by it.
    pub(crate) fn prune(&mut self, now_ns: u64, live: impl Iterator<Item = u64>) {
        if now_ns.saturating_sub(self.pruned_at_ns) < PRUNE_EVERY_NS {
            return;
        }
        self.pruned_at_ns = now_ns;
        self.batch_v1 = self.v1_mount.as_deref().is_some_and(batch_tree_on_v1);
        let cutoff = now_ns.saturating_sub(PRUNE_AFTER_NS);
        // Cgroups of processes the table still holds (alive, or in the
        // tree) are kept: their reports name them. So are v1 keys of live
        // processes (named only once), and cgroup 0 (energy of processes
        // with no cgroup).
        let kept: crate::hash::IntSet<u64> = self
            .v1
            .values()
            .filter_map(|v| v.key)
            .chain(live)
            .chain(std::iter::once(0))
            .collect();
        let stale: Vec<u64> = self
            .by_id
            .iter()
            .filter(|(id, c)| c.last_ns < cutoff && !kept.contains(id))
            .map(|(id, _)| *id)
            .collect();
        for id in stale {
            let Some(c) = self.by_id.remove(&id) else {
                continue;
            };
            self.names.forget(id);
            match &c.name {
                Some(path) => fold(self.pruned.entry(path.clone()).or_default(), &c),
                None => {
                    self.older.0 += 1;
                    fold(&mut self.older.1, &c);
                }
            }
        }
        if self.pruned.len() > MAX_PRUNED_PATHS {
            let mut by_age: Vec<(u64, String)> = self
                .pruned
                .iter()
                .map(|(p, c)| (c.last_ns, p.clone()))
                .collect();
            by_age.sort_unstable();
            for (_, path) in by_age
                .into_iter()
                .take(self.pruned.len() - MAX_PRUNED_PATHS)
            {
                if let Some(c) = self.pruned.remove(&path) {
                    self.older.0 += 1;
                    fold(&mut self.older.1, &c);
                }
            }
        }
    }

    /// Every cgroup sum: those kept by id, then the pruned ones by path.
    pub(crate) fn sums(&self) -> impl Iterator<Item = &CgroupSum> {
        self.by_id.values().chain(self.pruned.values())
    }

    /// Tasks in the cgroup v2 root on a host whose units and containers
    /// live in cgroup v1 hierarchies: their v1 path, read once per process
    /// while it is alive. Where a scheduler keeps its jobs on the v1
    /// hierarchies (`batch_v1`), every task is read for a job (a systemd
    /// hybrid host leaves a job's processes in slurmd's unit, or an ssh
    /// session's scope, in the unified tree), and an answer that names no
    /// job is read up to [`V1_READS`] times in all, once an interval: a
    /// process read in the few ms between its fork and the scheduler
    /// moving it into the job's cgroups is not left out of the job for
    /// its life. A process found in a job stays counted there.
    ///
    /// Two fallbacks, for what no cgroup says (`lineage`: a process's
    /// parent, and the pid of the nearest `slurmstepd` among its
    /// ancestors):
    /// - a process under a root-owned `slurmstepd` in no job's cgroup (v1
    ///   or v2: Slurm made none, `proctrack/linuxproc`) is placed in the
    ///   step that `slurmstepd`'s title names
    ///   ([`crate::process::batch::stepd_job_path`]), as its own uid's,
    ///   looked at once (where Slurm keeps jobs on v1, once its
    ///   [`V1_READS`] cgroup reads found none);
    /// - a process gone before its cgroups could be read (it ran within
    ///   one interval: a `make`'s compiler, a shell loop's command) is
    ///   counted in its parent's job, where it was forked (a child starts
    ///   in its parent's cgroups, under its parent's `slurmstepd`).
    pub(crate) fn v1_cgroups(
        &mut self,
        usage: &mut [IntervalUsage],
        procfs: &ProcFs,
        lineage: impl Fn(ConsumerId) -> Lineage,
    ) {
        use crate::process::batch::job_path_v1;
        use crate::process::cgroup::{v1_key, v1_path};
        let mut gone: Vec<(usize, ConsumerId)> = Vec::new();
        for (at, u) in usage.iter_mut().enumerate() {
            let at_root = self.root.is_none_or(|r| u.cgroup_id == r);
            let seen = self.v1.get(&u.id).copied();
            let settled = seen.is_some_and(|v| v.job || !self.batch_v1 || v.reads >= V1_READS);
            let mut read_gone = false;
            if (at_root || self.batch_v1) && !settled {
                let text = procfs.cgroup(u.pid);
                read_gone = text.is_empty();
                // Gone before it was read: placed by its parent below.
                if !read_gone {
                    let job = job_path_v1(&text);
                    let is_job = job.is_some();
                    let path = if at_root { v1_path(&text) } else { job };
                    let key = path
                        .filter(|p| p != "/")
                        .map(|p| self.key_named(v1_key(&p), p));
                    let reads = seen.map_or(0, |v| v.reads).saturating_add(1);
                    self.v1.insert(
                        u.id,
                        V1 {
                            key,
                            job: is_job,
                            reads,
                        },
                    );
                }
            }
            let in_job = self.v1.get(&u.id).is_some_and(|v| v.job);
            // Where Slurm keeps jobs on v1, its cgroups get their reads
            // first: a child of slurmstepd read before Slurm moved it is
            // found in the job's cgroup at a later read, under its path.
            let cgroups_first = self.batch_v1
                && !read_gone
                && self.v1.get(&u.id).is_some_and(|v| v.reads < V1_READS);
            let looks = self.stepd_done.get(&u.id).copied().unwrap_or(0);
            if !in_job && !cgroups_first && looks < V1_READS {
                let Lineage {
                    parent,
                    stepds,
                    again,
                } = lineage(u.id);
                // Settled unless the lineage asked to look again.
                let looks = if again { looks + 1 } else { V1_READS };
                self.stepd_done.insert(u.id, looks);
                match self.stepd_job(u.pid, &stepds, procfs) {
                    Stepd::Job(key) => {
                        self.v1.insert(
                            u.id,
                            V1 {
                                key: Some(key),
                                job: true,
                                reads: V1_READS,
                            },
                        );
                    }
                    Stepd::Gone => read_gone = true,
                    Stepd::None => {}
                }
                if read_gone && let Some(parent) = parent {
                    gone.push((at, parent));
                }
            }
            // A job's key always; another v1 key where the process is at
            // the root (off it, its own v2 cgroup is the better name).
            match self.v1.get(&u.id) {
                Some(V1 {
                    key: Some(key),
                    job,
                    ..
                }) if *job || at_root => u.cgroup_id = *key,
                _ => {}
            }
        }
        // After every process of the interval is placed: a parent may
        // come after its child in `usage`.
        for (at, parent) in gone {
            if let Some(v) = self.v1.get(&parent).copied().filter(|v| v.job) {
                self.v1.insert(usage[at].id, v);
                if let Some(key) = v.key {
                    usage[at].cgroup_id = key;
                }
            }
        }
    }

    /// `key` in the sums, named `path`.
    fn key_named(&mut self, key: u64, path: String) -> u64 {
        self.by_id.entry(key).or_default().name = Some(path);
        key
    }

    /// A process's job from the `slurmstepd` above it (`stepd`: its pid),
    /// where no cgroup names a job for it: the step that `slurmstepd`'s
    /// title names, if it is root's (anyone can name a process
    /// `slurmstepd`, and only root can set a root process's title).
    fn stepd_job(&mut self, pid: u32, stepds: &[u32], procfs: &ProcFs) -> Stepd {
        use crate::process::batch::{job_path, stepd_job_path};
        use crate::process::cgroup::v1_key;
        if stepds.is_empty() {
            return Stepd::None;
        }
        let text = procfs.cgroup(pid);
        if text.is_empty() {
            return Stepd::Gone;
        }
        // In a job's cgroup (v2, or v1 not yet taken): the cgroup says.
        if job_path(&text).is_some() {
            return Stepd::None;
        }
        // The nearest root-owned one: a user's process named slurmstepd
        // between it and the job does not take the job's processes out.
        let Some(&stepd) = stepds.iter().find(|s| procfs.real_uid(**s) == Some(0)) else {
            return Stepd::None;
        };
        let path = procfs
            .real_uid(pid)
            .and_then(|uid| stepd_job_path(&procfs.cmdline_bytes(stepd), uid));
        match path {
            Some(path) => Stepd::Job(self.key_named(v1_key(&path), path)),
            None => Stepd::None,
        }
    }

    /// Test fixtures: as if a scheduler's tree were on v1.
    #[cfg(test)]
    pub(crate) fn set_batch_v1(&mut self, on: bool) {
        self.batch_v1 = on;
    }

    /// Per cgroup so far, most energy first; with `since_ns`, only cgroups
    /// whose processes ran since then.
    pub(crate) fn reports(
        &self,
        since_ns: Option<u64>,
        span: u64,
        carbon: &CarbonIntensity,
    ) -> Vec<CgroupReport> {
        let recent = |c: &CgroupSum| since_ns.is_none_or(|t| c.last_ns >= t);
        // One row per path: a pruned cgroup's sums go to the row of the
        // cgroup now at its path (a restarted unit), or stand alone.
        let mut rows: Vec<(String, u64, CgroupSum)> = self
            .by_id
            .iter()
            .map(|(id, c)| {
                let path = c.name.clone().unwrap_or_else(|| format!("id:{id}"));
                (path, *id, c.clone())
            })
            .collect();
        let mut at: HashMap<String, usize> = HashMap::new();
        for (i, (path, _, _)) in rows.iter().enumerate() {
            at.entry(path.clone()).or_insert(i);
        }
        for (path, c) in &self.pruned {
            match at.get(path) {
                Some(i) => fold(&mut rows[*i].2, c),
                None => rows.push((path.clone(), 0, c.clone())),
            }
        }
        if self.older.0 > 0 {
            rows.push((
                format!("[{} older cgroups]", self.older.0),
                0,
                self.older.1.clone(),
            ));
        }
        let mut cgroups: Vec<CgroupReport> = rows
            .into_iter()
            .filter(|(_, _, c)| recent(c))
            .map(|(path, id, c)| CgroupReport {
                path,
                id,
                on_cpu_ns: c.on_cpu_ns,
                energy: EnergyJ::new(&c.energy, span, carbon),
            })
            .collect();
        cgroups
            .sort_by(|a, b| most_energy_first((&a.energy, a.on_cpu_ns), (&b.energy, b.on_cpu_ns)));
        cgroups
    }

    /// The container a cgroup's sums are for: the one recognized while
    /// it ran, else what its path says.
    fn container_of(cg: &CgroupSum) -> Option<Container> {
        cg.container.clone().or_else(|| {
            cg.name
                .as_deref()
                .and_then(crate::process::container::from_cgroup_path)
        })
    }

    /// Asks the runtimes for the name of every container again: those
    /// not named yet, and the others' current names (renamed since).
    pub(crate) fn ask_container_names(&self) {
        self.containers.expire();
        for cg in self.sums() {
            if let Some(c) = Self::container_of(cg) {
                let _ = self.containers.name(&c);
            }
        }
    }

    /// Per container and systemd unit so far (from the cgroups), most
    /// energy first; with `since_ns`, only those whose processes ran since.
    pub(crate) fn container_reports(
        &self,
        since_ns: Option<u64>,
        span: u64,
        carbon: &CarbonIntensity,
    ) -> Vec<ContainerReport> {
        type Sums = (u64, EnergyBy, Vec<String>, Option<String>);
        let mut by: HashMap<Container, Sums> = HashMap::new();
        let mut last: HashMap<Container, u64> = HashMap::new();
        for cg in self.sums() {
            let (ns, e) = (&cg.on_cpu_ns, &cg.energy);
            let Some(path) = &cg.name else { continue };
            let Some(c) = Self::container_of(cg) else {
                continue;
            };
            let l = last.entry(c.clone()).or_default();
            *l = (*l).max(cg.last_ns);
            let entry = by.entry(c).or_default();
            entry.0 += ns;
            entry.1.merge(e);
            entry.2.push(path.clone());
            if entry.3.is_none() {
                entry.3.clone_from(&cg.container_name);
            }
        }
        let mut v: Vec<ContainerReport> = by
            .into_iter()
            .filter(|(c, _)| since_ns.is_none_or(|t| last.get(c).is_some_and(|l| *l >= t)))
            .map(|(c, (ns, e, mut cgroups, kept_name))| {
                cgroups.sort();
                // The runtime's latest answer (a `docker rename`), else
                // the one kept, else asked for now.
                let name = self
                    .containers
                    .cached(&c)
                    .or(kept_name)
                    .or_else(|| self.containers.name(&c));
                ContainerReport {
                    name,
                    runtime: c.runtime,
                    id: c.id,
                    pod_uid: c.pod_uid,
                    qos: c.qos,
                    cgroups,
                    on_cpu_ns: ns,
                    energy: EnergyJ::new(&e, span, carbon),
                }
            })
            .collect();
        v.sort_by(|a, b| {
            most_energy_first((&a.energy, a.on_cpu_ns), (&b.energy, b.on_cpu_ns))
                .then(a.id.cmp(&b.id))
        });
        v
    }

    /// Per batch job so far (from the cgroups of its steps), most energy
    /// first, each with its steps; with `since_ns`, only those whose
    /// processes ran since. Times are since `start_ns`, the profile's
    /// start.
    pub(crate) fn job_reports(
        &self,
        since_ns: Option<u64>,
        start_ns: u64,
        span: u64,
        carbon: &CarbonIntensity,
    ) -> Vec<JobReport> {
        use crate::process::batch::{Scheduler, from_cgroup_path};
        type Step = (u64, EnergyBy, Vec<String>);
        #[derive(Default)]
        struct Job {
            uid: Option<u32>,
            first_ns: u64,
            last_ns: u64,
            steps: HashMap<String, Step>,
        }
        let mut by: HashMap<(Scheduler, String), Job> = HashMap::new();
        for cg in self.sums() {
            let Some(path) = &cg.name else { continue };
            let Some(js) = from_cgroup_path(path) else {
                continue;
            };
            let job = by.entry((js.scheduler, js.job_id)).or_default();
            job.uid = job.uid.or(js.uid);
            job.last_ns = job.last_ns.max(cg.last_ns);
            if cg.first_ns != 0 && (job.first_ns == 0 || cg.first_ns < job.first_ns) {
                job.first_ns = cg.first_ns;
            }
            let step = job.steps.entry(js.step.unwrap_or_default()).or_default();
            step.0 += cg.on_cpu_ns;
            step.1.merge(&cg.energy);
            if !step.2.contains(path) {
                step.2.push(path.clone());
            }
        }
        let mut jobs: Vec<JobReport> = by
            .into_iter()
            .filter(|(_, j)| since_ns.is_none_or(|t| j.last_ns >= t))
            .map(|((scheduler, job_id), j)| {
                let mut total = EnergyBy::default();
                let mut steps: Vec<JobStepReport> = j
                    .steps
                    .into_iter()
                    .map(|(step, (ns, e, mut cgroups))| {
                        total.merge(&e);
                        cgroups.sort();
                        JobStepReport {
                            step,
                            cgroups,
                            on_cpu_ns: ns,
                            energy: EnergyJ::new(&e, span, carbon),
                        }
                    })
                    .collect();
                steps.sort_by(|a, b| {
                    most_energy_first((&a.energy, a.on_cpu_ns), (&b.energy, b.on_cpu_ns))
                        .then(a.step.cmp(&b.step))
                });
                JobReport {
                    scheduler: scheduler.name().to_string(),
                    job_id,
                    uid: j.uid,
                    user: j.uid.map(|u| self.user(u)),
                    first_ns: j.first_ns.saturating_sub(start_ns),
                    last_ns: j.last_ns.saturating_sub(start_ns),
                    on_cpu_ns: steps.iter().map(|s| s.on_cpu_ns).sum(),
                    energy: EnergyJ::new(&total, span, carbon),
                    steps,
                }
            })
            .collect();
        jobs.sort_by(|a, b| {
            most_energy_first((&a.energy, a.on_cpu_ns), (&b.energy, b.on_cpu_ns))
                .then(a.job_id.cmp(&b.job_id))
        });
        jobs
    }

    /// The login name of `uid` (the number where it has none), looked up
    /// once: the exporter asks every interval, and a lookup through NSS
    /// (LDAP) can take long, or fail now and then and change the label.
    fn user(&self, uid: u32) -> String {
        let mut users = self
            .users
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        users
            .entry(uid)
            .or_insert_with(|| crate::process::user_name(uid).unwrap_or_else(|| uid.to_string()))
            .clone()
    }

    /// Adds a consumer's energy of this interval to its cgroup (`u`: its
    /// usage this interval, if it ran; `cgroup`: where it was): a process
    /// that was in several cgroups gives each the energy of its share of
    /// the process's time.
    pub(crate) fn add_energy(&mut self, u: Option<&IntervalUsage>, cgroup: u64, e: &EnergyBy) {
        let mut rest = *e;
        if let Some(u) = u.filter(|u| !u.other_cgroups_ns.is_empty()) {
            let total: u64 = u.on_cpu_ns.iter().sum();
            for (other, ns) in &u.other_cgroups_ns {
                let part = e.share(*ns, total);
                rest = rest.less(&part);
                self.by_id.entry(*other).or_default().energy.merge(&part);
            }
        }
        self.by_id.entry(cgroup).or_default().energy.merge(&rest);
    }

    /// Adds this interval's CPU time to each cgroup its processes ran in,
    /// and marks them as having run at `at_ns`.
    pub(crate) fn add_time(&mut self, usage: &[IntervalUsage], at_ns: u64) {
        for u in usage {
            let mut rest: u64 = u.on_cpu_ns.iter().sum();
            for (cgroup, ns) in &u.other_cgroups_ns {
                rest = rest.saturating_sub(*ns);
                let c = self.by_id.entry(*cgroup).or_default();
                c.on_cpu_ns += ns;
                c.ran(at_ns);
            }
            let c = self.by_id.entry(u.cgroup_id).or_default();
            c.on_cpu_ns += rest;
            c.ran(at_ns);
        }
    }

    /// A cgroup's path, once found.
    pub(crate) fn path(&self, cgroup_id: u64) -> Option<&str> {
        self.by_id.get(&cgroup_id).and_then(|c| c.name.as_deref())
    }

    /// The cgroup path of a process (its v1 path where its v2 one is the
    /// root), when known.
    pub(crate) fn path_of(&self, id: ConsumerId, cgroup_id: u64) -> Option<&str> {
        let key = match self.v1.get(&id) {
            Some(V1 {
                key: Some(v1), job, ..
            }) if *job || self.root.is_none_or(|r| cgroup_id == r) => *v1,
            _ => cgroup_id,
        };
        self.path(key)
    }

    /// The container runtimes' names.
    pub(crate) fn containers(&self) -> &ContainerNames {
        &self.containers
    }

    /// Waits up to `wait` for the runtimes' answers to names asked for.
    pub(crate) fn settle(&self, wait: std::time::Duration) {
        self.containers.settle(wait);
    }

    /// Whether cgroup `id` has sums of its own (not pruned).
    #[cfg(test)]
    pub(crate) fn holds(&self, id: &u64) -> bool {
        self.by_id.contains_key(id)
    }

    /// The paths of pruned cgroups' sums.
    #[cfg(test)]
    pub(crate) fn pruned_paths(&self) -> impl Iterator<Item = &String> {
        self.pruned.keys()
    }

    /// Forgets the v1 keys of processes `keep` rejects.
    pub(crate) fn forget(&mut self, keep: impl Fn(ConsumerId) -> bool) {
        self.v1.retain(|id, _| keep(*id));
        self.stepd_done.retain(|id, _| keep(*id));
    }

    /// Names new cgroups and recognizes their containers while they
    /// still exist, and asks the runtime for a new container's name now:
    /// the recording has it even when no exporter or screen asks, and
    /// even if the container is gone by the end.
    pub(crate) fn name(&mut self, at_ns: u64) {
        for (id, entry) in &mut self.by_id {
            if entry.name.is_none() {
                entry.name = self.names.name(*id, at_ns).map(str::to_string);
            }
            if !entry.recognized
                && let Some(path) = entry.name.as_deref()
            {
                entry.recognized = true;
                entry.container = self.containers.recognize(path);
            }
            if let Some(c) = &entry.container {
                // Asked once the runtime is there (it may start later).
                if !entry.name_asked && self.containers.available(c.runtime) {
                    entry.name_asked = true;
                    let _ = self.containers.name(c);
                }
                // The answer is kept with the cgroup (the lookup cache is
                // bounded and forgets).
                if entry.container_name.is_none() && entry.name_asked {
                    entry.container_name = self.containers.cached(c);
                }
            }
        }
    }
}
