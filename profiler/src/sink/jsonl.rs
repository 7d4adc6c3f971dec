//! The `--jsonl` stream: one complete JSON record per line, written as it
//! happens, so a killed wattprof leaves a stream that parses to its last
//! line.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Serialize;

use super::Totals;
use crate::model::record::{HeaderRecord, IntervalRecord};
use crate::model::{RunReport, WindowReport};

/// A JSON-lines stream, one complete line per write.
#[derive(Debug)]
pub(crate) struct Jsonl {
    file: std::fs::File,
    path: PathBuf,
    line: Vec<u8>,
    /// Bytes of complete lines written.
    len: u64,
    /// Why the stream stopped, once it did.
    failed: Option<String>,
    /// The domains read up to the last interval (a window's energy leaves
    /// the others out, as the intervals do).
    read: crate::model::unread::Read,
}

impl Jsonl {
    /// Makes the stream readable by its owner only (mode 0600): its
    /// summary line holds command lines (`--cmdline`).
    pub(crate) fn make_private(&self) -> std::io::Result<()> {
        use std::os::unix::fs::PermissionsExt;
        self.file
            .set_permissions(std::fs::Permissions::from_mode(0o600))
    }

    /// Creates (truncates) `path`.
    pub(crate) fn create(path: &Path) -> std::io::Result<Self> {
        Ok(Self {
            file: std::fs::File::create(path)?,
            path: path.to_path_buf(),
            line: Vec::new(),
            len: 0,
            failed: None,
            read: crate::model::unread::Read::NONE,
        })
    }

    /// Why the stream stopped early (a failed write), if it did.
    pub(crate) fn failure(&self) -> Option<&str> {
        self.failed.as_deref()
    }

    /// Writes one record as a single `write` of a whole line, so a killed
    /// wattprof leaves complete lines only (but for, at worst, the last).
    /// A failed write (a full disk) stops the stream, with one warning on
    /// stderr: a line written in part is cut off, so the file still ends
    /// with its last complete record, and the final report is still
    /// written.
    pub(crate) fn write(&mut self, record: &impl Serialize) {
        if self.failed.is_some() {
            return;
        }
        self.line.clear();
        if let Err(e) = serde_json::to_writer(&mut self.line, record) {
            eprintln!("wattprof: a --jsonl record could not be written: {e}");
            return;
        }
        self.line.push(b'\n');
        match self.file.write_all(&self.line) {
            Ok(()) => self.len += self.line.len() as u64,
            Err(e) => {
                let cut = self.file.set_len(self.len).is_ok();
                let why = format!(
                    "writing --jsonl {}: {e}; the stream stops after its {} complete bytes{}",
                    self.path.display(),
                    self.len,
                    if cut {
                        ""
                    } else {
                        " (a partial last line could not be cut off)"
                    }
                );
                eprintln!(
                    "wattprof: {why}; sampling goes on and the final report is still written"
                );
                self.failed = Some(why);
            }
        }
    }
}

/// A record with its `type` added: `{"type": kind, ...record}`.
#[derive(Serialize)]
pub(crate) struct Typed<'a, T: Serialize> {
    /// `header`, `window`, `summary`.
    #[serde(rename = "type")]
    pub(crate) kind: &'static str,
    /// The record's own fields.
    #[serde(flatten)]
    pub(crate) record: &'a T,
}

/// `--jsonl`: every record, one JSON object a line.
impl super::Sink for Jsonl {
    fn header(&mut self, header: &HeaderRecord, _: &Totals<'_>) {
        self.write(header);
    }

    fn interval(&mut self, record: &IntervalRecord, totals: &Totals<'_>) {
        self.read = totals.read();
        let read = self.read;
        crate::model::unread::writing(read, || self.write(record));
    }

    fn window(&mut self, window: &WindowReport) {
        // A window ends between intervals: the domains read so far, and
        // those measured in it.
        let read = crate::model::unread::Read::of_window(self.read, window);
        crate::model::unread::writing(read, || {
            self.write(&Typed {
                kind: "window",
                record: window,
            });
        });
    }

    fn finish(&mut self, report: &RunReport, _: &Totals<'_>) -> Vec<Result<String, String>> {
        // The stream's last record: the summary (the intervals it has
        // already streamed are not part of the document's serialisation).
        crate::model::unread::writing(report.read(), || {
            self.write(&Typed {
                kind: "summary",
                record: report,
            });
        });
        Vec::new()
    }

    fn failure(&self) -> Option<&str> {
        Jsonl::failure(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_record_is_one_line_with_its_type() {
        let dir = std::env::temp_dir().join(format!("wattprof-jsonl-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let path = dir.join("s.jsonl");
        let mut s = Jsonl::create(&path).expect("create");
        #[derive(Serialize)]
        struct W {
            name: &'static str,
        }
        s.write(&Typed {
            kind: "window",
            record: &W { name: "a\nb" },
        });
        s.write(&serde_json::json!({"type": "header"}));
        let text = std::fs::read_to_string(&path).expect("read");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let v: serde_json::Value = serde_json::from_str(lines[0]).expect("parses");
        assert_eq!(v["type"], "window");
        assert_eq!(v["name"], "a\nb");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
