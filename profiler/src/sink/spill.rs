//! The interval records a recording keeps (`run --output` keeps every
//! interval with its processes): in memory up to a limit, then in an
//! unlinked temporary file, one line each, so a week-long job does not hold
//! a week of records in memory. The recording is written by streaming them
//! back one at a time.

use std::fs::File;
use std::io::{BufRead, BufReader, Read};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use serde::ser::SerializeSeq;
use serde::{Serialize, Serializer};
use serde_json::value::RawValue;

/// Records kept in memory before they go to the temporary file.
pub(crate) const SPILL_AFTER_BYTES: usize = 16 << 20;

/// The kept interval records, in order.
#[derive(Clone, Debug)]
pub(crate) struct Intervals {
    /// In the temporary file: its handle, the bytes in it, the records.
    spilled: Option<(Arc<File>, u64, usize)>,
    /// After those, in memory.
    mem: Vec<Box<RawValue>>,
    mem_bytes: usize,
    limit: usize,
    /// Where the temporary file goes (`None`: `$TMPDIR`).
    dir: Option<std::path::PathBuf>,
    /// Why the file could not be used (records then stay in memory).
    problem: Option<String>,
}

impl Default for Intervals {
    fn default() -> Self {
        Self::with_limit(SPILL_AFTER_BYTES)
    }
}

impl Intervals {
    /// Keeps up to `limit` bytes of records in memory.
    pub(crate) fn with_limit(limit: usize) -> Self {
        Self {
            spilled: None,
            mem: Vec::new(),
            mem_bytes: 0,
            limit,
            dir: None,
            problem: None,
        }
    }

    /// Puts the temporary file in `dir` (the recording's directory: a disk,
    /// where `$TMPDIR` is often memory).
    pub(crate) fn set_dir(&mut self, dir: std::path::PathBuf) {
        self.dir = Some(dir);
    }

    /// Number of records.
    pub(crate) fn len(&self) -> usize {
        self.spilled.as_ref().map_or(0, |s| s.2) + self.mem.len()
    }
    /// Records held in the temporary file.
    #[cfg(test)]
    pub(crate) fn spilled(&self) -> usize {
        self.spilled.as_ref().map_or(0, |s| s.2)
    }

    /// Why the temporary file failed, once it did (one line).
    pub(crate) fn take_problem(&mut self) -> Option<String> {
        self.problem.take()
    }

    /// Adds one record (serialized on one line, as serde_json writes it).
    pub(crate) fn push(&mut self, record: Box<RawValue>) {
        self.mem_bytes += record.get().len();
        self.mem.push(record);
        if self.mem_bytes > self.limit
            && self.problem.is_none()
            && let Err(e) = self.spill()
        {
            // Kept in memory from here on: nothing is lost, and the file is
            // not tried again.
            self.limit = usize::MAX;
            self.problem = Some(format!(
                "the recording's intervals stay in memory: their temporary file failed \
                 ({e}; it goes next to --output, else in $TMPDIR: give that file system room)"
            ));
        }
    }

    /// Moves the records in memory to the end of the temporary file.
    fn spill(&mut self) -> std::io::Result<()> {
        if self.spilled.is_none() {
            let file = match &self.dir {
                Some(dir) => tempfile::tempfile_in(dir)?,
                None => tempfile::tempfile()?,
            };
            self.spilled = Some((Arc::new(file), 0, 0));
        }
        let Some((file, bytes, count)) = self.spilled.as_mut() else {
            return Ok(());
        };
        let mut buf = Vec::with_capacity(self.mem_bytes + self.mem.len());
        for r in &self.mem {
            buf.extend_from_slice(r.get().as_bytes());
            buf.push(b'\n');
        }
        file.write_all_at(&buf, *bytes)?;
        *bytes += buf.len() as u64;
        *count += self.mem.len();
        self.mem.clear();
        self.mem_bytes = 0;
        Ok(())
    }

    /// Every record, in order (those in the file read back one at a time).
    pub(crate) fn iter(&self) -> impl Iterator<Item = std::io::Result<Box<RawValue>>> + '_ {
        let from_file = self.spilled.iter().flat_map(|(file, bytes, _)| {
            BufReader::new(At {
                file,
                at: 0,
                end: *bytes,
            })
            .lines()
            .map(|line| line.and_then(|l| RawValue::from_string(l).map_err(std::io::Error::other)))
        });
        from_file.chain(self.mem.iter().map(|r| Ok(r.clone())))
    }
}

/// Reads `file` from `at` to `end` by offset (clones of the handle share
/// no position).
struct At<'a> {
    file: &'a File,
    at: u64,
    end: u64,
}

impl Read for At<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.end.saturating_sub(self.at);
        let want = buf.len().min(usize::try_from(left).unwrap_or(usize::MAX));
        if want == 0 {
            return Ok(0);
        }
        let n = self.file.read_at(&mut buf[..want], self.at)?;
        self.at += n as u64;
        Ok(n)
    }
}

impl Serialize for Intervals {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        let mut seq = s.serialize_seq(Some(self.len()))?;
        for r in self.iter() {
            let r = r.map_err(|e| {
                serde::ser::Error::custom(format!("reading back kept intervals: {e}"))
            })?;
            seq.serialize_element(&r)?;
        }
        seq.end()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(i: usize) -> Box<RawValue> {
        serde_json::value::to_raw_value(&serde_json::json!({"t_ns": i, "s": "x\ny"})).expect("raw")
    }

    #[test]
    fn records_past_the_limit_go_to_the_file_and_come_back_in_order() {
        let mut iv = Intervals::with_limit(100);
        for i in 0..50 {
            iv.push(raw(i));
        }
        assert_eq!(iv.len(), 50);
        assert!(iv.spilled() >= 45, "{}", iv.spilled());
        assert!(iv.mem_bytes <= 100 + 30, "memory stays bounded");
        let back: Vec<serde_json::Value> =
            serde_json::from_str(&serde_json::to_string(&iv).expect("serialize")).expect("parse");
        assert_eq!(back.len(), 50);
        for (i, v) in back.iter().enumerate() {
            assert_eq!(v["t_ns"], i, "{v}");
            assert_eq!(v["s"], "x\ny");
        }
        // A clone reads the same file.
        assert_eq!(iv.clone().iter().count(), 50);
        // Read back as a recording's reader reads them.
        let again: Vec<Box<RawValue>> =
            serde_json::from_str(&serde_json::to_string(&iv).expect("ser")).expect("deserialize");
        assert_eq!(again.len(), 50);
        assert!(iv.take_problem().is_none());
    }
}
