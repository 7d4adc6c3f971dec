//! `monitor` in a terminal: the screen redrawn after every interval.

use std::io::Write;

use super::{Sink, Totals};
use crate::model::record::IntervalRecord;
use crate::render::{By, render_monitor_frame};

/// The live screen.
pub(crate) struct Screen<W: Write> {
    out: W,
    /// Rows shown.
    top: usize,
    /// What the rows are.
    by: By,
}

impl<W: Write> Screen<W> {
    /// Draws on `out` (a terminal), `top` rows of `by`.
    pub(crate) fn new(out: W, top: usize, by: By) -> Self {
        Self { out, top, by }
    }
}

impl<W: Write> Sink for Screen<W> {
    fn interval(&mut self, record: &IntervalRecord, totals: &Totals<'_>) {
        let (containers, cgroups) = match self.by {
            By::Process => (Vec::new(), Vec::new()),
            By::Container => (totals.container_reports(None), Vec::new()),
            By::Cgroup => (Vec::new(), totals.cgroup_reports(None)),
        };
        let frame = render_monitor_frame(
            Some(record),
            &containers,
            &cgroups,
            totals.span_ns(),
            self.top,
            self.by,
        );
        // Home, clear, draw: one write so the screen never flickers
        // half-drawn. A closed terminal costs nothing kept.
        let _ = self
            .out
            .write_all(format!("\x1b[H\x1b[2J{frame}").as_bytes());
        let _ = self.out.flush();
    }
}
