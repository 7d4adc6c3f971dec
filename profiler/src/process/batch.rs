//! Batch jobs, recognised from their cgroups as containers are: a job's
//! processes are in a cgroup its scheduler made for the job and step.
//!
//! Slurm is the scheduler built. Its `proctrack/cgroup` and `task/cgroup`
//! plugins put a step's processes in:
//!
//! - cgroup v1 (`CgroupPlugin=cgroup/v1`, and every hybrid host):
//!   `/slurm[_NODE]/uid_UID/job_ID/step_STEP[/task_N]`, on the hierarchies
//!   the plugins use (freezer, cpuset, cpuacct, memory, devices), not
//!   necessarily on the one the host's units are named from (a hybrid
//!   host names a process by `name=systemd` or `cpu`, where a job may not
//!   be at all: [`job_path`] looks at every line);
//! - cgroup v2: `…/slurmstepd.scope/job_ID/step_STEP/{user/task_N,slurm}`.
//!
//! `STEP` is a number, `batch`, `extern` or `interactive`. A second
//! scheduler is a second arm of [`from_cgroup_path`] (PBS/OpenPBS names
//! its cgroups `pbs_jobs.service/jobid/ID`, HTCondor `htcondor/condor_…`),
//! and a variant of [`Scheduler`]: the sums, reports and series take
//! any.
//!
//! Where Slurm makes no cgroups (`proctrack/linuxproc`), a process under
//! `slurmstepd` is placed by its environment ([`environ_job_path`]), under
//! a path marked `environ:` that names no cgroup; the placement itself is
//! in [`crate::sums::cgroups::Cgroups::v1_cgroups`].

use std::fmt;

/// Who scheduled a job.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Scheduler {
    Slurm,
}

impl Scheduler {
    /// Its name in reports and labels.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Slurm => "slurm",
        }
    }
}

/// One step of a batch job, as its cgroup path says.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct JobStep {
    pub(crate) scheduler: Scheduler,
    /// The scheduler's job id (`sacct`'s JobID without the step).
    pub(crate) job_id: String,
    /// The step (`batch`, `extern`, `0`…), `None` for the job's own
    /// cgroup (a process there belongs to no step).
    pub(crate) step: Option<String>,
    /// The job's owner, where the path has it (cgroup v1's `uid_UID`).
    pub(crate) uid: Option<u32>,
}

impl fmt::Display for JobStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.step {
            Some(s) => write!(f, "{} {}.{s}", self.scheduler.name(), self.job_id),
            None => write!(f, "{} {}", self.scheduler.name(), self.job_id),
        }
    }
}

/// A job id or step name as Slurm makes them: ASCII letters, digits and
/// `_` (a job array's task is its own job id), never empty.
fn plain(s: &str) -> bool {
    !s.is_empty() && s.len() <= 64 && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
}

/// The batch job step a cgroup path (as in `/proc/PID/cgroup` or under the
/// cgroup2 mount) is, or is under; `None` for any other cgroup.
pub(crate) fn from_cgroup_path(path: &str) -> Option<JobStep> {
    located(path).map(|(job, _)| job)
}

/// [`from_cgroup_path`], and how many of the path's components name the
/// step's cgroup (the job's where it has no step).
fn located(path: &str) -> Option<(JobStep, usize)> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    for (i, part) in parts.iter().enumerate() {
        // v1: slurm or slurm_NODE, then uid_UID, job_ID.
        let v1 = (*part == "slurm" || part.starts_with("slurm_"))
            && parts
                .get(i + 1)
                .and_then(|p| p.strip_prefix("uid_"))
                .is_some_and(|u| u.parse::<u32>().is_ok());
        // v2: slurmstepd.scope (NODE_slurmstepd.scope where Slurm is
        // built for several slurmd per host, as Debian's is), then job_ID.
        let v2 = *part == "slurmstepd.scope" || part.ends_with("_slurmstepd.scope");
        if !(v1 || v2) {
            continue;
        }
        let uid = if v1 {
            parts[i + 1]
                .strip_prefix("uid_")
                .and_then(|u| u.parse().ok())
        } else {
            None
        };
        let job_at = if v1 { i + 2 } else { i + 1 };
        let job_id = parts
            .get(job_at)?
            .strip_prefix("job_")
            .filter(|j| plain(j))?;
        let step = match parts.get(job_at + 1) {
            Some(s) => Some(s.strip_prefix("step_").filter(|s| plain(s))?.to_string()),
            None => None,
        };
        let depth = if step.is_some() {
            job_at + 2
        } else {
            job_at + 1
        };
        let job = JobStep {
            scheduler: Scheduler::Slurm,
            job_id: job_id.to_string(),
            step,
            uid,
        };
        return Some((job, depth));
    }
    None
}

/// What a job path from a process's environment starts with
/// ([`environ_job_path`]): it names no cgroup.
pub(crate) const ENVIRON: &str = "environ:";

/// A Slurm job step from a process's environment (`/proc/PID/environ`,
/// NUL-separated), for jobs Slurm made no cgroups for
/// (`proctrack/linuxproc`): `SLURM_JOB_ID`, `SLURM_JOB_UID`, and
/// `SLURM_STEP_ID` (a batch script has none; Slurm's special step numbers
/// are named). The path it is counted under is
/// `environ:/slurm/uid_U/job_J/step_S`, which [`from_cgroup_path`] reads
/// as that step and which is no cgroup.
pub(crate) fn environ_job_path(environ: &[u8]) -> Option<String> {
    let (mut job, mut uid, mut step) = (None, None, None);
    for var in environ.split(|b| *b == 0) {
        let Ok(var) = std::str::from_utf8(var) else {
            continue;
        };
        if let Some(v) = var.strip_prefix("SLURM_JOB_ID=") {
            job = Some(v);
        } else if let Some(v) = var.strip_prefix("SLURM_JOB_UID=") {
            uid = Some(v);
        } else if let Some(v) = var.strip_prefix("SLURM_STEP_ID=") {
            step = Some(v);
        }
    }
    let job = job.filter(|j| plain(j))?;
    let uid: u32 = uid?.parse().ok()?;
    // slurm.h: SLURM_BATCH_SCRIPT, SLURM_EXTERN_CONT, SLURM_INTERACTIVE_STEP.
    let step = match step.map(|s| (s, s.parse::<u32>())) {
        None | Some((_, Ok(0xffff_fffb))) => "batch".to_string(),
        Some((_, Ok(0xffff_fffc))) => "extern".to_string(),
        Some((_, Ok(0xffff_fffa))) => "interactive".to_string(),
        Some((_, Ok(n))) => n.to_string(),
        Some((s, Err(_))) => s.to_string(),
    };
    if !plain(&step) {
        return None;
    }
    Some(format!("{ENVIRON}/slurm/uid_{uid}/job_{job}/step_{step}"))
}

/// The path of a batch job's cgroup in a `/proc/PID/cgroup` text, on
/// whichever hierarchy holds it (v1 lines first, then v2's `0::`): the
/// step's cgroup, or the job's where it is in no step.
pub(crate) fn job_path(proc_cgroup: &str) -> Option<String> {
    proc_cgroup.lines().find_map(|line| {
        let path = line.splitn(3, ':').nth(2)?;
        // Down to the step (a task's cgroup is its step's): one path per
        // step, whichever hierarchy it came from.
        let (_, depth) = located(path)?;
        let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
        Some(format!("/{}", parts[..depth].join("/")))
    })
}

/// [`job_path`] from the v1 lines only (not `0::`, the unified tree's):
/// where the v2 cgroup already names the process, a job there is found
/// by its v2 path.
pub(crate) fn job_path_v1(proc_cgroup: &str) -> Option<String> {
    let v1: String = proc_cgroup
        .lines()
        .filter(|l| !l.starts_with("0::"))
        .flat_map(|l| [l, "\n"])
        .collect();
    job_path(&v1)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(job: &str, step: Option<&str>, uid: Option<u32>) -> JobStep {
        JobStep {
            scheduler: Scheduler::Slurm,
            job_id: job.into(),
            step: step.map(Into::into),
            uid,
        }
    }

    #[test]
    fn slurm_paths_on_v1_and_v2_name_the_job_and_step() {
        for (path, want) in [
            // Seen on this VM: slurm-wlm 22.05, cgroup/v1, node "vm".
            (
                "/slurm_vm/uid_0/job_1/step_batch",
                Some(step("1", Some("batch"), Some(0))),
            ),
            (
                "/slurm/uid_1000/job_42/step_0/task_3",
                Some(step("42", Some("0"), Some(1000))),
            ),
            ("/slurm/uid_1000/job_42", Some(step("42", None, Some(1000)))),
            (
                "/system.slice/slurmstepd.scope/job_7/step_extern/user/task_special",
                Some(step("7", Some("extern"), None)),
            ),
            (
                "/system.slice/slurmstepd.scope/job_7/step_0/slurm",
                Some(step("7", Some("0"), None)),
            ),
            // Slurm's own cgroups, and everything else, are no job.
            // Debian's build: the node's name on the scope.
            (
                "/system.slice/gx10-ac12.lab_slurmstepd.scope/job_8/step_batch",
                Some(step("8", Some("batch"), None)),
            ),
            (
                "/slurm_node-3.cluster/uid_7/job_5/step_0",
                Some(step("5", Some("0"), Some(7))),
            ),
            ("/system.slice/slurmstepd.scope/system", None),
            ("/slurm_vm/system", None),
            ("/slurm_vm/uid_0", None),
            ("/system.slice/slurmd.service", None),
            ("/user.slice/slurm/uid_x/job_1", None),
            ("/docker/0123456789abcdef", None),
            ("/", None),
            // Hostile names: not a job id.
            ("/slurm/uid_0/job_1;rm/step_0", None),
            ("/slurm/uid_0/job_/step_0", None),
            ("/slurm/uid_0/job_1/step_\u{1b}]52", None),
        ] {
            assert_eq!(from_cgroup_path(path), want, "{path}");
        }
    }

    #[test]
    fn a_job_without_cgroups_is_found_in_its_environment() {
        let env = |vars: &[&str]| vars.join("\0").into_bytes();
        // As seen here: a batch script (no SLURM_STEP_ID) and its srun step.
        let batch = env(&[
            "PATH=/bin",
            "SLURM_JOB_ID=812345",
            "SLURM_JOB_UID=0",
            "SLURM_JOBID=812345",
        ]);
        let path = environ_job_path(&batch).expect("a job");
        assert_eq!(path, "environ:/slurm/uid_0/job_812345/step_batch");
        assert_eq!(
            from_cgroup_path(&path),
            Some(step("812345", Some("batch"), Some(0)))
        );
        let srun = env(&["SLURM_STEP_ID=0", "SLURM_JOB_UID=1000", "SLURM_JOB_ID=9"]);
        assert_eq!(
            environ_job_path(&srun).as_deref(),
            Some("environ:/slurm/uid_1000/job_9/step_0")
        );
        let ext = env(&[
            "SLURM_STEP_ID=4294967292",
            "SLURM_JOB_UID=1",
            "SLURM_JOB_ID=9",
        ]);
        assert!(environ_job_path(&ext).is_some_and(|p| p.ends_with("step_extern")));
        // Not a job: none, no uid, a hostile id or step.
        for vars in [
            &["PATH=/bin"][..],
            &["SLURM_JOB_ID=9"],
            &["SLURM_JOB_ID=9;rm", "SLURM_JOB_UID=0"],
            &["SLURM_JOB_ID=9", "SLURM_JOB_UID=x"],
            &["SLURM_JOB_ID=9", "SLURM_JOB_UID=0", "SLURM_STEP_ID=../x"],
        ] {
            assert_eq!(environ_job_path(&env(vars)), None, "{vars:?}");
        }
        // Not UTF-8 around it: skipped, not a failure.
        let mut bytes = b"X=\xff\xfe\0".to_vec();
        bytes.extend(env(&["SLURM_JOB_ID=3", "SLURM_JOB_UID=2"]));
        assert!(environ_job_path(&bytes).is_some());
    }

    #[test]
    fn a_job_is_found_on_whichever_hierarchy_holds_it() {
        // This VM's batch job: on freezer and cpuset only; name=systemd
        // and v2 elsewhere.
        let text = "12:cpu,cpuacct:/\n6:freezer:/slurm_vm/uid_0/job_1/step_batch\n\
                    3:cpuset:/slurm_vm/uid_0/job_1/step_batch\n1:name=systemd:/user.slice\n0::/\n";
        assert_eq!(
            job_path(text).as_deref(),
            Some("/slurm_vm/uid_0/job_1/step_batch")
        );
        // A task's cgroup is its step's.
        let text = "4:memory:/slurm/uid_5/job_9/step_0/task_1\n0::/\n";
        assert_eq!(job_path(text).as_deref(), Some("/slurm/uid_5/job_9/step_0"));
        let v2 = "0::/system.slice/slurmstepd.scope/job_3/step_batch/user/task_0\n";
        assert_eq!(
            job_path(v2).as_deref(),
            Some("/system.slice/slurmstepd.scope/job_3/step_batch")
        );
        // A node named like a job: the path is cut by components.
        let text = "3:cpuset:/slurm_gpujob_12/uid_0/job_12\n";
        assert_eq!(
            job_path(text).as_deref(),
            Some("/slurm_gpujob_12/uid_0/job_12")
        );
        assert_eq!(job_path("0::/user.slice/user-0.slice\n"), None);
        assert_eq!(job_path(""), None);
    }
}
