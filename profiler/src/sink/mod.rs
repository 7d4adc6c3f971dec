//! Every output of a running profile is a [`Sink`]: the profile hands
//! each the same records in the same order (the header first, intervals
//! and windows as they happen, the run document at the end), and a sink
//! writes what it is for: the stream, the interval CSV, the recording,
//! codecarbon's emissions row.

pub(crate) mod csv;
pub(crate) mod flamegraph;
pub(crate) mod jsonl;
pub(crate) mod prometheus;
pub(crate) mod recording;
pub(crate) mod spill;
pub(crate) mod vm_export;

use crate::model::record::{HeaderRecord, IntervalRecord};
use crate::model::{RunReport, WindowReport};
use jsonl::{Jsonl, Typed};

/// An output of a running profile.
pub(crate) trait Sink {
    /// The stream's first record.
    fn header(&mut self, _header: &HeaderRecord) {}
    /// One interval's record, as it closes.
    fn interval(&mut self, _record: &IntervalRecord) {}
    /// A window, as it closes (or, unterminated, at the end).
    fn window(&mut self, _window: &WindowReport) {}
    /// The end: the run document (its `intervals` empty: a sink that
    /// wants them keeps them as they pass). What was written, to be said
    /// after the run's table (`report written to FILE`), or why it could
    /// not be (one line; every sink's end is tried whatever another's
    /// did).
    fn finish(&mut self, _report: &RunReport) -> Result<Option<String>, String> {
        Ok(None)
    }
    /// Why it stopped streaming early (a failed write), if it did: one
    /// line.
    fn failure(&self) -> Option<&str> {
        None
    }
    /// A problem to keep in the run's report (said once, as it begins).
    fn take_problem(&mut self) -> Option<String> {
        None
    }
}

/// `--jsonl`: every record, one JSON object a line.
impl Sink for Jsonl {
    fn header(&mut self, header: &HeaderRecord) {
        self.write(header);
    }

    fn interval(&mut self, record: &IntervalRecord) {
        self.write(record);
    }

    fn window(&mut self, window: &WindowReport) {
        self.write(&Typed {
            kind: "window",
            record: window,
        });
    }

    fn finish(&mut self, report: &RunReport) -> Result<Option<String>, String> {
        // The stream's last record: the summary (the intervals it has
        // already streamed are not part of the document's serialisation).
        self.write(&Typed {
            kind: "summary",
            record: report,
        });
        Ok(None)
    }

    fn failure(&self) -> Option<&str> {
        Jsonl::failure(self)
    }
}

/// `--csv-intervals`: each interval's rows, timed from the header's
/// wall-clock start, with the header's carbon intensity.
pub(crate) struct IntervalCsvSink {
    csv: csv::IntervalCsv,
    start_unix_ns: u64,
    g_per_kwh: f64,
}

impl IntervalCsvSink {
    /// Rows into `csv`.
    pub(crate) fn new(csv: csv::IntervalCsv) -> Self {
        Self {
            csv,
            start_unix_ns: 0,
            g_per_kwh: 0.0,
        }
    }
}

impl Sink for IntervalCsvSink {
    fn header(&mut self, header: &HeaderRecord) {
        self.start_unix_ns = header.start_unix_ns;
        self.g_per_kwh = header.carbon_intensity_g_per_kwh;
    }

    fn interval(&mut self, record: &IntervalRecord) {
        debug_assert!(self.start_unix_ns > 0, "the header comes first");
        self.csv.write(record, self.start_unix_ns, self.g_per_kwh);
    }

    fn failure(&self) -> Option<&str> {
        self.csv.failure()
    }
}
