//! `monitor --jobs-dir DIR`: a file per batch job once it has ended on
//! this node, `DIR/<scheduler>-<job_id>.json`, written whole (a temporary
//! name, then a rename), so a scheduler's epilog can pick it up.
//!
//! A job has ended here when its processes did not run in the last
//! interval and its cgroup (the job's, above its steps), once seen in a
//! cgroup hierarchy, is gone from all of them: the scheduler removes it
//! once the job's last process on the node is gone (and its epilog has
//! run). A job whose cgroup was never seen (a cgroup namespace, a mount
//! elsewhere) is not taken as ended. A file that could not be written is
//! tried again each interval; a job that runs again after its file (a
//! requeued job) has it written again at its next end.

use std::collections::{HashMap, HashSet};
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
    /// Jobs whose file is written (scheduler, id), and when they had
    /// last run then (ns since the profile began).
    written: HashMap<(String, String), u64>,
    /// Jobs whose cgroup has been seen in a hierarchy.
    seen_alive: HashSet<(String, String)>,
    /// Jobs whose file failed to be written (said once each on stderr).
    failed: HashSet<(String, String)>,
    /// Why a file could not be written, for the run's problems, once.
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
            written: HashMap::new(),
            seen_alive: HashSet::new(),
            failed: HashSet::new(),
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

    /// Writes `job`'s file; whether it was. `read`: the domains with a
    /// reader on this node (one without has no field, as in a recording).
    fn write(&mut self, mut job: JobReport, read: crate::model::unread::Read) -> bool {
        // Its average power over its own time here, not the profile's.
        let span_s = job.last_ns.saturating_sub(job.first_ns) as f64 / 1e9;
        if span_s > 0.0 {
            job.energy.avg_power_w = job.energy.total_j / span_s;
        }
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
            crate::model::unread::writing(read, || p.commit_json(&file))
                .map_err(|e| format!("{}: {e}", dest.display()))
        });
        match written {
            Ok(()) => true,
            Err(e) => {
                let key = (file.job.scheduler.clone(), file.job.job_id.clone());
                if self.failed.insert(key) {
                    eprintln!(
                        "wattprof: warning: batch job {} {}: its file was not written (tried again each interval): {e}",
                        file.job.scheduler, file.job.job_id
                    );
                }
                if self.problem.is_none() && !self.said {
                    self.problem = Some(format!("a batch job's file was not written: {e}"));
                }
                false
            }
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
        for job in totals.job_reports(None) {
            let key = (job.scheduler.clone(), job.job_id.clone());
            // Written, and not run since.
            if self
                .written
                .get(&key)
                .is_some_and(|last| job.last_ns <= *last)
            {
                continue;
            }
            if self.alive(&job) {
                self.seen_alive.insert(key);
                continue;
            }
            // Ended: it ran in none of the last interval, and its cgroup,
            // once seen, is gone.
            if job.last_ns < now && self.seen_alive.contains(&key) {
                let last = job.last_ns;
                if self.write(job, totals.read()) {
                    self.failed.remove(&key);
                    self.written.insert(key, last);
                }
            }
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
