//! Where a profile's records go as it runs: every streamed output is a
//! [`Sink`], and the profile hands each the same records in the same
//! order (header, intervals and windows as they happen, the summary at
//! the end; the header always first). The recording and the outputs made
//! from it at the end (CSV, flame graph, plot) are made from the run
//! document `finish` returns.

use serde_json::Value;

use super::jsonl::{Jsonl, Typed};
use super::record::{HeaderRecord, IntervalRecord};
use super::{RunReport, WindowReport};

/// A streamed output.
pub(crate) trait Sink {
    /// The stream's first record.
    fn header(&mut self, _header: &HeaderRecord) {}
    /// One interval's record, as it closes.
    fn interval(&mut self, _record: &IntervalRecord) {}
    /// A window, as it closes (or, unterminated, at the end).
    fn window(&mut self, _window: &WindowReport) {}
    /// The end: the run document, without its intervals.
    fn summary(&mut self, _report: &RunReport) {}
    /// Why it stopped early (a failed write), if it did: one line.
    fn failure(&self) -> Option<&str> {
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

    fn summary(&mut self, report: &RunReport) {
        let mut summary = serde_json::to_value(report).unwrap_or(Value::Null);
        if let Some(o) = summary.as_object_mut() {
            o.remove("intervals");
            o.insert("type".into(), "summary".into());
        }
        self.write(&summary);
    }

    fn failure(&self) -> Option<&str> {
        Jsonl::failure(self)
    }
}

/// `--csv-intervals`: each interval's rows, timed from the header's
/// wall-clock start, with the header's carbon intensity.
pub(crate) struct IntervalCsvSink {
    csv: super::csv::IntervalCsv,
    start_unix_ns: u64,
    g_per_kwh: f64,
}

impl IntervalCsvSink {
    /// Rows into `csv`.
    pub(crate) fn new(csv: super::csv::IntervalCsv) -> Self {
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
