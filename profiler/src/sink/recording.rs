//! The recording (`--output`): the run document with the interval records
//! this sink kept as they passed, written at the end to a temporary name
//! beside the destination and renamed into place, so a failed run never
//! leaves half a recording, and an unwritable location fails before the
//! command starts.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::spill::Intervals;
use super::{Sink, Totals};
use crate::model::RunReport;
use crate::model::record::IntervalRecord;

/// A file opened under a temporary name beside its destination, put in
/// place when it is complete.
pub(crate) struct PendingOutput {
    tmp: PathBuf,
    /// Where it goes.
    pub(crate) dest: PathBuf,
    file: std::fs::File,
}

impl PendingOutput {
    /// For `option` (`--output`, `--flamegraph`, ...): fails with one line
    /// naming the option and the folder when the folder is not writable.
    pub(crate) fn create_for(option: &str, dest: &Path) -> Result<Self, String> {
        let dir = folder_of(dest);
        let name = dest
            .file_name()
            .ok_or_else(|| format!("{option} {}: not a file name", dest.display()))?;
        let mut tmp_name = OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = dir.join(tmp_name);
        let file = std::fs::File::create(&tmp).map_err(|e| {
            format!(
                "cannot write {option} {}: {e} (check that {} exists and is writable)",
                dest.display(),
                dir.display()
            )
        })?;
        Ok(Self {
            tmp,
            dest: dest.to_path_buf(),
            file,
        })
    }

    /// Writes `value` as pretty JSON, streamed (a long run's intervals are
    /// read back from their temporary file one at a time), then a newline,
    /// and puts the file in place.
    pub(crate) fn commit_json(mut self, value: &impl Serialize) -> std::io::Result<()> {
        {
            let mut w = std::io::BufWriter::with_capacity(1 << 16, &mut self.file);
            serde_json::to_writer_pretty(&mut w, value).map_err(std::io::Error::other)?;
            w.flush()?;
        }
        self.commit_raw(b"\n")
    }

    /// Writes `bytes` as they are and puts the file in place.
    pub(crate) fn commit_raw(mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.file.write_all(bytes)?;
        self.file.sync_all()?;
        std::fs::rename(&self.tmp, &self.dest)
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
        // After a successful rename this finds nothing to remove.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// The folder a file goes to (`.` for a bare name).
fn folder_of(dest: &Path) -> PathBuf {
    match dest.parent() {
        Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
        _ => PathBuf::from("."),
    }
}

/// Which interval records a recording keeps (the stream always has them
/// all).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Keep {
    /// Every record, with its processes (`run`).
    All,
    /// Machine-level figures only (`monitor --output`: per-process series
    /// are in the stream).
    MachineOnly,
}

/// `--output`.
pub(crate) struct Recording {
    /// `None` once written (or failed).
    file: Option<PendingOutput>,
    keep: Keep,
    intervals: Intervals,
}

/// Writes a run document and its intervals as received (`run` through a
/// daemon: the tree's records, with no machine figures) to `file`, and
/// puts it in place.
pub(crate) fn write_whole(
    file: PendingOutput,
    report: &RunReport,
    intervals: &[serde_json::Value],
) -> std::io::Result<()> {
    #[derive(Serialize)]
    struct Whole<'a> {
        #[serde(flatten)]
        report: &'a RunReport,
        intervals: &'a [serde_json::Value],
    }
    crate::model::unread::writing(report.read(), || {
        file.commit_json(&Whole { report, intervals })
    })
}

/// The document as written: the run document, then its intervals.
#[derive(Serialize)]
struct Document<'a> {
    #[serde(flatten)]
    report: &'a RunReport,
    intervals: &'a Intervals,
}

impl Recording {
    /// Opens `dest` (failing now, with one line, if it cannot be written);
    /// kept records past 16 MiB go to an unlinked file in its folder (a
    /// disk, where `$TMPDIR` is often memory).
    pub(crate) fn create(dest: &Path, keep: Keep) -> Result<Self, String> {
        Self::with_intervals(dest, keep, Intervals::default())
    }

    /// Makes the file readable by its owner only (mode 0600): it will hold
    /// command lines (`--cmdline`), which may carry secrets, and in
    /// `monitor` other users' (whom `hidepid` may hide them from).
    pub(crate) fn make_private(&self) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        match &self.file {
            Some(f) => f
                .file
                .set_permissions(std::fs::Permissions::from_mode(0o600)),
            None => Ok(()),
        }
    }

    /// As [`Recording::create`], keeping records in `intervals`.
    pub(crate) fn with_intervals(
        dest: &Path,
        keep: Keep,
        mut intervals: Intervals,
    ) -> Result<Self, String> {
        let file = PendingOutput::create_for("--output", dest)?;
        intervals.set_dir(folder_of(dest));
        Ok(Self {
            file: Some(file),
            keep,
            intervals,
        })
    }
}

impl Sink for Recording {
    fn interval(&mut self, record: &IntervalRecord, totals: &Totals<'_>) {
        // Kept serialized: a parsed record costs several times its text,
        // and a run can last days.
        let kept = crate::model::unread::writing(totals.read(), || match self.keep {
            Keep::All => serde_json::value::to_raw_value(record),
            Keep::MachineOnly => serde_json::value::to_raw_value(&record.machine_only()),
        });
        if let Ok(kept) = kept {
            self.intervals.push(kept);
        }
    }

    fn finish(&mut self, report: &RunReport, _: &Totals<'_>) -> Vec<Result<String, String>> {
        let Some(file) = self.file.take() else {
            return Vec::new();
        };
        let dest = file.dest.clone();
        vec![
            crate::model::unread::writing(report.read(), || {
                file.commit_json(&Document {
                    report,
                    intervals: &self.intervals,
                })
            })
            .map(|()| format!("report written to {}", dest.display()))
            .map_err(|e| format!("writing {}: {e}", dest.display())),
        ]
    }

    fn take_problem(&mut self) -> Option<String> {
        self.intervals.take_problem()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::record::{GroupRows, ProcessRow};

    fn record(t_ns: u64) -> IntervalRecord {
        IntervalRecord {
            t_ns,
            duration_ns: 1_000,
            busy_ns: 500,
            domains: Vec::new(),
            gpus: Vec::new(),
            groups: GroupRows::default(),
            processes: Some(vec![ProcessRow {
                pid: 7,
                comm: "x".into(),
                ..ProcessRow::default()
            }]),
        }
    }

    /// A run document (the fuzz targets' seed recording), its intervals
    /// left out.
    fn report() -> RunReport {
        let mut r: RunReport = serde_json::from_str(include_str!(
            "../../../fuzz/corpus/report_reader/seed-recording.json"
        ))
        .expect("the seed recording");
        r.intervals.clear();
        r
    }

    #[test]
    fn the_keep_policy_decides_what_the_recording_holds_and_it_reads_back() {
        let dir = std::env::temp_dir().join(format!("wattprof-recording-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        for (keep, with_processes) in [(Keep::All, true), (Keep::MachineOnly, false)] {
            let dest = dir.join(format!("{keep:?}.json"));
            // A 1-byte limit: the second record goes to the spill file and
            // comes back in order.
            let mut r =
                Recording::with_intervals(&dest, keep, Intervals::with_limit(1)).expect("writable");
            let f = crate::sink::tests::Fixture::new();
            r.interval(&record(1_000), &f.totals());
            r.interval(&record(2_000), &f.totals());
            assert!(!dest.exists(), "written only at the end");
            let said = r.finish(&report(), &f.totals());
            assert_eq!(
                said,
                vec![Ok(format!("report written to {}", dest.display()))]
            );
            let text = std::fs::read_to_string(&dest).expect("read");
            let back: RunReport = serde_json::from_str(&text).expect("a run document");
            assert_eq!(back.intervals.len(), 2, "{keep:?}");
            let second: serde_json::Value =
                serde_json::from_str(back.intervals[1].get()).expect("record");
            assert_eq!(second["type"], "interval");
            assert_eq!(second["t_ns"], 2_000);
            assert_eq!(
                second.get("processes").is_some(),
                with_processes,
                "{keep:?}"
            );
            // No temporary file is left beside it.
            let left: Vec<_> = std::fs::read_dir(&dir)
                .expect("dir")
                .filter_map(Result::ok)
                .filter(|e| e.file_name().to_string_lossy().ends_with(".tmp"))
                .collect();
            assert!(left.is_empty(), "{left:?}");
        }
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn an_unwritable_folder_fails_at_once_with_the_option_and_the_folder() {
        let e = Recording::create(Path::new("/nonexistent-wattprof/r.json"), Keep::All)
            .err()
            .expect("refused");
        assert!(
            e.starts_with("cannot write --output /nonexistent-wattprof/r.json"),
            "{e}"
        );
        assert!(e.contains("check that /nonexistent-wattprof exists"), "{e}");
    }
}
