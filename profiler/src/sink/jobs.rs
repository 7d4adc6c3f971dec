//! `monitor --jobs-dir DIR`: a file per batch job once it has ended on
//! this node, `DIR/<scheduler>-<job_id>.json`, written whole (a temporary
//! name, then a rename), so a scheduler's epilog can pick it up.
//!
//! A job has ended here when its processes did not run in the last
//! interval and its cgroup (the job's, above its steps) is gone from
//! every cgroup hierarchy: the scheduler removes it once the job's last
//! process on the node is gone. A job's file is written once.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::recording::PendingOutput;
use super::{Sink, Totals};
use crate::model::record::{HeaderRecord, IntervalRecord};
use crate::model::{JobFile, JobReport};

/// The sink.
pub(crate) struct JobFiles {
    dir: PathBuf,
    /// Where cgroup hierarchies are mounted: a job's cgroup is looked for
    /// under each.
    roots: Vec<PathBuf>,
    node: String,
    start_unix_ns: u64,
    /// Jobs whose file is written (scheduler, id).
    written: HashSet<(String, String)>,
    /// Why a file could not be written, once.
    problem: Option<String>,
    said: bool,
}

impl JobFiles {
    /// For `--jobs-dir DIR`: fails with one line when `DIR` cannot be
    /// written. `cgroupfs`: where cgroups are mounted (`/sys/fs/cgroup`).
    pub(crate) fn new(dir: &Path, cgroupfs: &Path) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| {
            format!(
                "cannot create --jobs-dir {}: {e} (give a writable folder)",
                dir.display()
            )
        })?;
        // Tried now, not at a job's end.
        PendingOutput::create_for("--jobs-dir", &dir.join(".wattprof-probe"))?;
        let mut roots = vec![cgroupfs.to_path_buf()];
        if let Ok(entries) = std::fs::read_dir(cgroupfs) {
            roots.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
        }
        Ok(Self {
            dir: dir.to_path_buf(),
            roots,
            node: String::new(),
            start_unix_ns: 0,
            written: HashSet::new(),
            problem: None,
            said: false,
        })
    }

    /// Whether the job's cgroup (above its steps) is still in a
    /// hierarchy.
    fn alive(&self, job: &JobReport) -> bool {
        job.steps
            .iter()
            .flat_map(|s| &s.cgroups)
            .filter_map(|path| job_dir(path, &job.job_id))
            .any(|dir| {
                self.roots
                    .iter()
                    .any(|r| r.join(dir.trim_start_matches('/')).is_dir())
            })
    }

    /// Writes `job`'s file; an error is kept to say once.
    fn write(&mut self, job: JobReport) {
        let file = JobFile {
            kind: "wattprof_job".into(),
            wattprof_version: env!("CARGO_PKG_VERSION").into(),
            node: self.node.clone(),
            first_unix_ns: self.start_unix_ns + job.first_ns,
            last_unix_ns: self.start_unix_ns + job.last_ns,
            job,
        };
        let name = format!("{}-{}.json", file.job.scheduler, file.job.job_id);
        let dest = self.dir.join(name);
        let written = PendingOutput::create_for("--jobs-dir", &dest).and_then(|p| {
            p.commit_json(&file)
                .map_err(|e| format!("{}: {e}", dest.display()))
        });
        if let Err(e) = written
            && self.problem.is_none()
        {
            self.problem = Some(format!("a batch job's file was not written: {e}"));
        }
    }
}

/// The job's own cgroup in a step's path: the path up to `job_ID`.
fn job_dir<'a>(path: &'a str, job_id: &str) -> Option<&'a str> {
    let component = format!("/job_{job_id}");
    let at = path.match_indices(&component).find_map(|(at, _)| {
        let end = at + component.len();
        (path.len() == end || path[end..].starts_with('/')).then_some(end)
    })?;
    Some(&path[..at])
}

impl Sink for JobFiles {
    fn header(&mut self, header: &HeaderRecord, _: &Totals<'_>) {
        self.node.clone_from(&header.host.hostname);
        self.start_unix_ns = header.start_unix_ns;
    }

    fn interval(&mut self, _: &IntervalRecord, totals: &Totals<'_>) {
        let now = totals.last_ns.saturating_sub(totals.start_ns);
        let ended: Vec<JobReport> = totals
            .job_reports(None)
            .into_iter()
            .filter(|j| {
                !self
                    .written
                    .contains(&(j.scheduler.clone(), j.job_id.clone()))
            })
            // Not in this interval: it ran in none that ended after its last.
            .filter(|j| j.last_ns < now)
            .filter(|j| !self.alive(j))
            .collect();
        for job in ended {
            self.written
                .insert((job.scheduler.clone(), job.job_id.clone()));
            self.write(job);
        }
    }

    fn take_problem(&mut self) -> Option<String> {
        if self.said {
            return None;
        }
        let p = self.problem.take();
        self.said = p.is_some();
        p
    }
}

#[cfg(test)]
mod tests {
    use super::job_dir;

    #[test]
    fn a_job_s_cgroup_is_the_path_to_its_job_component() {
        assert_eq!(
            job_dir("/slurm_vm/uid_0/job_12/step_batch", "12"),
            Some("/slurm_vm/uid_0/job_12")
        );
        assert_eq!(
            job_dir(
                "/system.slice/slurmstepd.scope/job_1/step_0/user/task_0",
                "1"
            ),
            Some("/system.slice/slurmstepd.scope/job_1")
        );
        // job_1 is not job_12's prefix.
        assert_eq!(job_dir("/slurm/uid_0/job_12/step_0", "1"), None);
        assert_eq!(
            job_dir("/slurm/uid_0/job_1", "1"),
            Some("/slurm/uid_0/job_1")
        );
    }
}
