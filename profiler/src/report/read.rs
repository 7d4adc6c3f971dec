//! Reading a recording or a `--jsonl` stream back: which one it is, its
//! schema version, and every complete line of a stream cut short.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::output::record::{HeaderRecord, IntervalRecord};
use crate::output::{RUN_SCHEMA_VERSION, RunReport, WindowReport};

/// What can go wrong reading a file back: each is one line for people.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The file cannot be read.
    #[error("cannot read {}: {source}", path.display())]
    Io {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// Nothing in it.
    #[error(
        "{} is empty: not a wattprof recording or stream (written by `wattprof run` or \
         `monitor` with --output FILE or --jsonl FILE)",
        path.display()
    )]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// Not JSON at all.
    #[error(
        "{} is not JSON ({detail}): give a file written by `wattprof run` or `monitor` with \
         --output FILE or --jsonl FILE",
        path.display()
    )]
    NotJson {
        /// The file.
        path: PathBuf,
        /// serde_json's words, with the line and column.
        detail: String,
    },
    /// JSON, but not ours.
    #[error(
        "{} is JSON but not a wattprof recording or stream (it has no schema_version): give a \
         file written by `wattprof run` or `monitor` with --output FILE or --jsonl FILE",
        path.display()
    )]
    NotRecording {
        /// The file.
        path: PathBuf,
    },
    /// A layout this wattprof does not read.
    #[error(
        "{} has schema version {found} (written by wattprof {writer}); this wattprof ({ours}) \
         reads version {RUN_SCHEMA_VERSION}: read it with the wattprof that wrote it",
        path.display(),
        ours = env!("CARGO_PKG_VERSION")
    )]
    Version {
        /// The file.
        path: PathBuf,
        /// Its version.
        found: u64,
        /// Who wrote it.
        writer: String,
    },
    /// A stream cut before its first line ended.
    #[error(
        "{}: the stream was cut before its header line was complete; it holds no interval",
        path.display()
    )]
    NoHeader {
        /// The file.
        path: PathBuf,
    },
    /// A line or the document does not match the schema.
    #[error("{}{}: {detail} (is the file damaged?)", path.display(), line.map(|l| format!(", line {l}")).unwrap_or_default())]
    Bad {
        /// The file.
        path: PathBuf,
        /// The line, in a stream.
        line: Option<usize>,
        /// What is wrong.
        detail: String,
    },
}

/// Just enough of a document or a line to know what it is.
#[derive(Deserialize)]
struct Probe {
    #[serde(rename = "type")]
    kind: Option<String>,
    schema_version: Option<u64>,
    wattprof_version: Option<String>,
}

/// Where a stream was cut.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Cut {
    /// Complete lines read.
    pub complete_lines: usize,
    /// Bytes of the partial last line (0 when the stream only lacks its
    /// summary).
    pub partial_line_bytes: usize,
}

/// A file read back.
#[derive(Debug)]
pub enum File {
    /// A recording (`--output`): the whole document.
    Recording(Box<RunReport>, Vec<IntervalRecord>),
    /// A `--jsonl` stream.
    Stream(Stream),
}

/// The records of a stream.
#[derive(Debug)]
pub struct Stream {
    /// Its first line.
    pub header: Box<HeaderRecord>,
    /// Its interval records.
    pub intervals: Vec<IntervalRecord>,
    /// Its window records.
    pub windows: Vec<WindowReport>,
    /// Its last line, when the profile ended (absent from a cut stream).
    pub summary: Option<Box<RunReport>>,
    /// Where it was cut: no summary, and maybe a partial last line.
    pub cut: Option<Cut>,
    /// Lines of a record type this wattprof does not know (written by a
    /// newer one), skipped.
    pub unknown_lines: usize,
}

fn check_version(path: &Path, probe: &Probe) -> Result<(), ReadError> {
    match probe.schema_version {
        None => Err(ReadError::NotRecording {
            path: path.to_path_buf(),
        }),
        Some(v) if v == u64::from(RUN_SCHEMA_VERSION) => Ok(()),
        Some(found) => Err(ReadError::Version {
            path: path.to_path_buf(),
            found,
            writer: probe
                .wattprof_version
                .clone()
                .unwrap_or_else(|| "unknown".into()),
        }),
    }
}

fn bad(path: &Path, line: Option<usize>, e: impl std::fmt::Display) -> ReadError {
    ReadError::Bad {
        path: path.to_path_buf(),
        line,
        detail: e.to_string(),
    }
}

/// Reads `path`: a recording, a stream, or a stream cut short (every
/// complete line is read, and the cut is said).
pub fn read(path: &Path) -> Result<File, ReadError> {
    let text = std::fs::read_to_string(path).map_err(|source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &text)
}

/// [`read`] on text already in memory (`path` names it in errors).
pub fn parse(path: &Path, text: &str) -> Result<File, ReadError> {
    if text.trim().is_empty() {
        return Err(ReadError::Empty {
            path: path.to_path_buf(),
        });
    }
    let first = text.lines().next().unwrap_or_default();
    match serde_json::from_str::<Probe>(first) {
        Ok(p) if p.kind.as_deref() == Some("header") => {
            check_version(path, &p)?;
            return parse_stream(path, text).map(File::Stream);
        }
        Err(_)
            if first.trim_start().starts_with("{\"type\":\"header\"") && !text.contains('\n') =>
        {
            return Err(ReadError::NoHeader {
                path: path.to_path_buf(),
            });
        }
        _ => {}
    }
    let probe: Probe = serde_json::from_str(text).map_err(|e| ReadError::NotJson {
        path: path.to_path_buf(),
        detail: e.to_string(),
    })?;
    check_version(path, &probe)?;
    let mut report: RunReport = serde_json::from_str(text).map_err(|e| bad(path, None, e))?;
    let intervals = std::mem::take(&mut report.intervals)
        .iter()
        .enumerate()
        .map(|(i, raw)| {
            serde_json::from_str::<IntervalRecord>(raw.get())
                .map_err(|e| bad(path, None, format!("intervals[{i}]: {e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok(File::Recording(Box::new(report), intervals))
}

fn parse_stream(path: &Path, text: &str) -> Result<Stream, ReadError> {
    let mut header = None;
    let mut intervals = Vec::new();
    let mut windows = Vec::new();
    let mut summary = None;
    let mut unknown_lines = 0;
    let mut complete_lines = 0;
    let mut partial_line_bytes = 0;
    let ends_whole = text.ends_with('\n');
    let lines: Vec<&str> = text.lines().collect();
    for (i, line) in lines.iter().enumerate() {
        let number = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let last = i + 1 == lines.len();
        let probe = match serde_json::from_str::<Probe>(line) {
            Ok(p) => p,
            // A killed wattprof leaves at most its last line partial: each
            // line is one write.
            Err(_) if last && !ends_whole => {
                partial_line_bytes = line.len();
                break;
            }
            Err(e) => return Err(bad(path, Some(number), e)),
        };
        let typed = |e: serde_json::Error| bad(path, Some(number), e);
        match probe.kind.as_deref() {
            Some("header") if header.is_none() => {
                header = Some(Box::new(
                    serde_json::from_str::<HeaderRecord>(line).map_err(typed)?,
                ));
            }
            Some("header") => return Err(bad(path, Some(number), "a second header line")),
            Some("interval") => {
                intervals.push(serde_json::from_str::<IntervalRecord>(line).map_err(typed)?)
            }
            Some("window") => {
                windows.push(serde_json::from_str::<WindowReport>(line).map_err(typed)?)
            }
            Some("summary") => {
                summary = Some(Box::new(
                    serde_json::from_str::<RunReport>(line).map_err(typed)?,
                ))
            }
            _ => unknown_lines += 1,
        }
        complete_lines += 1;
    }
    let header = header.ok_or_else(|| ReadError::NoHeader {
        path: path.to_path_buf(),
    })?;
    let cut = (summary.is_none() || partial_line_bytes > 0).then_some(Cut {
        complete_lines,
        partial_line_bytes,
    });
    Ok(Stream {
        header,
        intervals,
        windows,
        summary,
        cut,
        unknown_lines,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(text: &str) -> String {
        match parse(Path::new("f.json"), text) {
            Ok(_) => panic!("{text:?} was read"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn bad_files_get_one_line_that_says_what_they_are() {
        assert!(err("").contains("f.json is empty"), "{}", err(""));
        assert!(err("  \n").contains("is empty"));
        assert!(
            err("hello").contains("is not JSON (expected value"),
            "{}",
            err("hello")
        );
        assert!(err("{\"a\": 1}").contains("not a wattprof recording"));
        let v = err("{\"schema_version\": 9, \"wattprof_version\": \"9.0.0\"}");
        assert!(
            v.contains("schema version 9 (written by wattprof 9.0.0)")
                && v.contains("reads version 2"),
            "{v}"
        );
        let v = err("{\"type\":\"header\",\"schema_version\":1}\n");
        assert!(v.contains("schema version 1"), "{v}");
        assert!(err("{\"type\":\"header\",\"schema_ver").contains("cut before its header"));
        assert!(!err("{\"schema_version\": 2}").contains('\n'));
    }
}
