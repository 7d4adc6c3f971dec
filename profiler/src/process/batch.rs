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
//! a root-owned `slurmstepd` is placed by that `slurmstepd`'s title
//! ([`stepd_job_path`]), under a path marked `slurmstepd:` that names no
//! cgroup; the placement itself is in
//! [`crate::sums::cgroups::Cgroups::v1_cgroups`]. Not by the process's
//! environment (`SLURM_JOB_ID`): its owner writes that, and could charge
//! another user's job.

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

/// What a job path from a `slurmstepd`'s title starts with
/// ([`stepd_job_path`]): it names no cgroup.
pub(crate) const STEPD: &str = "slurmstepd:";

/// The job step a `slurmstepd` runs, from its command line as it sets it
/// (`slurmstepd: [JOB.STEP]`, NUL-padded), for a process of that step
/// owned by `uid`: the path it is counted under,
/// `slurmstepd:/slurm/uid_U/job_J/step_S`, which [`from_cgroup_path`]
/// reads as that step and which is no cgroup. The caller checks that the
/// `slurmstepd` is root's: a user can name a process anything.
pub(crate) fn stepd_job_path(stepd_cmdline: &[u8], uid: u32) -> Option<String> {
    let title = stepd_cmdline.split(|b| *b == 0).next()?;
    let title = std::str::from_utf8(title).ok()?.trim_end();
    let inner = title.strip_prefix("slurmstepd: [")?.strip_suffix(']')?;
    let (job, step) = inner.rsplit_once('.')?;
    (plain(job) && plain(step)).then(|| format!("{STEPD}/slurm/uid_{uid}/job_{job}/step_{step}"))
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
    fn a_job_without_cgroups_is_named_by_its_slurmstepd_s_title() {
        // As seen here: slurmd 22.05's steps, NUL-padded.
        let path = stepd_job_path(b"slurmstepd: [812345.batch]\0\0\0", 0).expect("a job");
        assert_eq!(path, "slurmstepd:/slurm/uid_0/job_812345/step_batch");
        assert_eq!(
            from_cgroup_path(&path),
            Some(step("812345", Some("batch"), Some(0)))
        );
        assert_eq!(
            stepd_job_path(b"slurmstepd: [9.0]", 1000).as_deref(),
            Some("slurmstepd:/slurm/uid_1000/job_9/step_0")
        );
        assert!(
            stepd_job_path(b"slurmstepd: [9.extern]", 1)
                .is_some_and(|p| p.ends_with("step_extern"))
        );
        // Not a step's title, or a hostile one.
        for title in [
            &b"slurmstepd"[..],
            b"/usr/sbin/slurmstepd\0",
            b"slurmstepd: [9]",
            b"slurmstepd: [9;rm.0]",
            b"slurmstepd: [9.../x]",
            b"slurmstepd: [.0]",
            b"sh\0-c\0slurmstepd: [9.0]",
            b"slurmstepd: [9.0\xff]",
        ] {
            assert_eq!(
                stepd_job_path(title, 0),
                None,
                "{}",
                String::from_utf8_lossy(title)
            );
        }
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
