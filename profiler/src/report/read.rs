//! Reading a recording or a `--jsonl` stream back: which one it is, its
//! schema version, and every complete line of a stream cut short.

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_json::error::Category;

use crate::model::record::{HeaderRecord, IntervalRecord};
use crate::model::{RUN_SCHEMA_OLDEST, RUN_SCHEMA_VERSION, RunReport, WindowReport};

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
        "{} is JSON but not a wattprof recording or stream (no schema_version number): give a \
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
         reads versions {RUN_SCHEMA_OLDEST} to {RUN_SCHEMA_VERSION}: read it with the wattprof that \
         wrote it",
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
        "{}: the file ends before its first JSON value does (a stream cut before its header \
         line was complete holds no interval; a recording is never left half-written)",
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
pub(crate) struct Cut {
    /// Complete lines read.
    pub(crate) complete_lines: usize,
    /// Bytes of the partial last line (0 when the stream only lacks its
    /// summary).
    pub(crate) partial_line_bytes: usize,
}

/// A file read back.
#[derive(Debug)]
pub(crate) enum File {
    /// A recording (`--output`): the whole document.
    Recording(Box<RunReport>, Vec<IntervalRecord>),
    /// A `--jsonl` stream.
    Stream(Stream),
}

/// The records of a stream.
#[derive(Debug)]
pub(crate) struct Stream {
    /// Its first line.
    pub(crate) header: Box<HeaderRecord>,
    /// Its interval records.
    pub(crate) intervals: Vec<IntervalRecord>,
    /// Its window records.
    pub(crate) windows: Vec<WindowReport>,
    /// Its last line, when the profile ended (absent from a cut stream).
    pub(crate) summary: Option<Box<RunReport>>,
    /// Where it was cut: no summary, and maybe a partial last line.
    pub(crate) cut: Option<Cut>,
    /// Lines of a record type this wattprof does not know (written by a
    /// newer one), skipped.
    pub(crate) unknown_lines: usize,
}

fn check_version(path: &Path, probe: &Probe) -> Result<(), ReadError> {
    match probe.schema_version {
        None => Err(ReadError::NotRecording {
            path: path.to_path_buf(),
        }),
        Some(v) if (u64::from(RUN_SCHEMA_OLDEST)..=u64::from(RUN_SCHEMA_VERSION)).contains(&v) => {
            Ok(())
        }
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

/// serde's words on one line: control characters (a name with a newline)
/// become spaces, and a stream line's "line 1" is dropped (the line number
/// is in the message).
fn one_line(e: impl std::fmt::Display, in_line: bool) -> String {
    let mut text: String = e
        .to_string()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    if in_line {
        text = text.replace(" at line 1 column ", " at column ");
    }
    text
}

fn bad(path: &Path, line: Option<usize>, e: impl std::fmt::Display) -> ReadError {
    ReadError::Bad {
        path: path.to_path_buf(),
        line,
        detail: one_line(e, line.is_some()),
    }
}

/// Reads `path`: a recording, a stream, or a stream cut short (every
/// complete line is read, and where it was cut is reported).
pub(crate) fn read(path: &Path) -> Result<File, ReadError> {
    let bytes = std::fs::read(path).map_err(|source| ReadError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    parse(path, &bytes)
}

/// [`read`] on bytes already in memory (`path` names it in errors). Bytes,
/// not text: a stream cut inside a multi-byte character is still read to
/// its last complete line.
pub(crate) fn parse(path: &Path, bytes: &[u8]) -> Result<File, ReadError> {
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Err(ReadError::Empty {
            path: path.to_path_buf(),
        });
    }
    let first_end = bytes.iter().position(|&b| b == b'\n');
    let first = &bytes[..first_end.unwrap_or(bytes.len())];
    match serde_json::from_slice::<Probe>(first) {
        Ok(p) if p.kind.as_deref() == Some("header") => {
            check_version(path, &p)?;
            return parse_stream(path, bytes).map(File::Stream);
        }
        Err(e) if first_end.is_none() && e.classify() == Category::Eof => {
            return Err(ReadError::NoHeader {
                path: path.to_path_buf(),
            });
        }
        _ => {}
    }
    let not_ours = |e: serde_json::Error| match e.classify() {
        // JSON, but not an object with a numeric schema_version.
        Category::Data => ReadError::NotRecording {
            path: path.to_path_buf(),
        },
        _ => ReadError::NotJson {
            path: path.to_path_buf(),
            detail: one_line(e, false),
        },
    };
    let text = std::str::from_utf8(bytes).map_err(|e| ReadError::NotJson {
        path: path.to_path_buf(),
        detail: format!("not UTF-8 text: {e}"),
    })?;
    // One parse of a large document; only a failed one is parsed again,
    // shallowly, to tell the user what the file is instead.
    let mut report: RunReport = match serde_json::from_str(text) {
        Ok(r) => r,
        Err(e) => {
            let probe: Probe = serde_json::from_str(text).map_err(not_ours)?;
            check_version(path, &probe)?;
            return Err(bad(path, None, e));
        }
    };
    check_version(
        path,
        &Probe {
            kind: None,
            schema_version: Some(report.schema_version.into()),
            wattprof_version: Some(report.wattprof_version.clone()),
        },
    )?;
    report.upgrade_from_schema_2();
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

fn parse_stream(path: &Path, bytes: &[u8]) -> Result<Stream, ReadError> {
    let mut header = None;
    let mut intervals = Vec::new();
    let mut windows = Vec::new();
    let mut summary = None;
    let mut unknown_lines = 0;
    let mut complete_lines = 0;
    let mut partial_line_bytes = 0;
    let ends_whole = bytes.ends_with(b"\n");
    let pieces: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    // After a final newline, split leaves an empty piece: not a line.
    let n = if ends_whole {
        pieces.len() - 1
    } else {
        pieces.len()
    };
    for (i, piece) in pieces[..n].iter().enumerate() {
        let number = i + 1;
        if piece.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        // A killed wattprof leaves at most its last line partial (each
        // line is one write), cut anywhere, even inside a character.
        let unterminated = i + 1 == n && !ends_whole;
        let parsed = std::str::from_utf8(piece)
            .map_err(|e| format!("not UTF-8 text: {e}"))
            .and_then(|line| {
                serde_json::from_str::<Probe>(line)
                    .map(|p| (line, p))
                    .map_err(|e| one_line(e, true))
            });
        let (line, probe) = match parsed {
            Ok(x) => x,
            Err(_) if unterminated => {
                partial_line_bytes = piece.len();
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
                let mut s = serde_json::from_str::<RunReport>(line).map_err(typed)?;
                s.upgrade_from_schema_2();
                summary = Some(Box::new(s))
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

    const HEADER: &str = r#"{"type":"header","schema_version":2,"wattprof_version":"0.1.0","mode":"monitor","tracker":"iter","start_unix_ns":0,"host":{"hostname":"h","kernel":"k","cpu_model":"c","gpus":[]},"package_ids":[0],"readers":[],"carbon_intensity_g_per_kwh":475.0,"carbon_intensity_source":"s","argv":null}"#;

    fn err(text: &str) -> String {
        match parse(Path::new("f.json"), text.as_bytes()) {
            Ok(_) => panic!("{text:?} was read"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn a_schema_2_recording_reads_as_all_dynamic() {
        let text = include_str!("../../../fuzz/corpus/report_reader/seed-recording.json");
        let Ok(File::Recording(r, _)) = parse(Path::new("f.json"), text.as_bytes()) else {
            panic!("the schema 2 seed is a recording");
        };
        assert_eq!(r.schema_version, 2);
        assert!(!r.processes.is_empty());
        for e in r
            .processes
            .iter()
            .map(|p| &p.energy)
            .chain([&r.energy.groups.tree])
        {
            assert_eq!((e.static_j, e.dynamic_j), (0.0, e.total_j), "{e:?}");
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
        for other in [
            "{\"a\": 1}",
            "[1, 2]",
            "null",
            "{\"schema_version\": \"2\"}",
        ] {
            assert!(
                err(other).contains("not a wattprof recording"),
                "{other}: {}",
                err(other)
            );
        }
        let v = err("{\"schema_version\": 9, \"wattprof_version\": \"9.0.0\"}");
        assert!(
            v.contains("schema version 9 (written by wattprof 9.0.0)")
                && v.contains(&format!(
                    "reads versions {RUN_SCHEMA_OLDEST} to {RUN_SCHEMA_VERSION}"
                )),
            "{v}"
        );
        let v = err("{\"type\":\"header\",\"schema_version\":1}\n");
        assert!(v.contains("schema version 1"), "{v}");
        for cut in ["{\"type\":\"header\",\"schema_ver", "{\"type\":\"hea", "{"] {
            assert!(
                err(cut).contains("ends before its first JSON value"),
                "{cut}"
            );
        }
        assert!(!err("{\"schema_version\": 2}").contains('\n'));
        // A control character in a value stays off the error line.
        let v = err(&format!(
            "{HEADER}\n{{\"type\":\"interval\",\"domains\":[{{\"domain\":\"a\\nb\"}}]}}\nx\n"
        ));
        assert!(!v.contains('\n') && v.contains("line 2"), "{v}");
    }

    #[test]
    fn a_stream_cut_inside_a_character_is_read_to_its_last_line() {
        let mut bytes = format!("{HEADER}\n{{\"type\":\"window\",\"name\":\"é").into_bytes();
        bytes.pop(); // half of the é
        let Ok(File::Stream(s)) = parse(Path::new("s.jsonl"), &bytes) else {
            panic!("not read as a cut stream");
        };
        assert_eq!(s.cut.as_ref().map(|c| c.complete_lines), Some(1));
        assert!(s.cut.is_some_and(|c| c.partial_line_bytes > 0));
        assert!(s.summary.is_none() && s.windows.is_empty());
    }
}
