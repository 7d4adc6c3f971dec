//! Every output of a running profile is a [`Sink`]: the profile hands
//! each the same records in the same order (the header first, intervals
//! and windows as they happen, the run document at the end), with a view
//! of its sums so far ([`Totals`]), and a sink writes what it is for: the
//! stream, the interval CSV, the recording, codecarbon's emissions row,
//! the exporter's snapshot, `top`'s screen, each VM's powercap tree, the
//! flame graph.

pub(crate) mod csv;
pub(crate) mod flamegraph;
pub(crate) mod jobs;
pub(crate) mod jsonl;
pub(crate) mod prometheus;
pub(crate) mod recording;
pub(crate) mod snapshot;
pub(crate) mod spill;
pub(crate) mod top;
pub(crate) mod vm_export;

use crate::attribution::stacks::StackLedger;
use crate::carbon::CarbonIntensity;
use crate::model::record::{HeaderRecord, IntervalRecord};
use crate::model::{CgroupReport, ContainerReport, JobReport, RunReport, WindowReport};
use crate::sources::Domain;
use crate::sources::static_power::StaticFigure;
use crate::sums::Sums;

/// What a sink may read of the profile as a record passes: its sums so
/// far, and what they are reported with.
pub(crate) struct Totals<'a> {
    /// The sums.
    pub(crate) sums: &'a Sums,
    /// CO2 per kWh.
    pub(crate) carbon: &'a CarbonIntensity,
    /// wattprof's own CPU time so far (ns).
    pub(crate) profiler_ns: u64,
    /// When the profile began, and its last interval ended (monotonic ns).
    pub(crate) start_ns: u64,
    /// See `start_ns`.
    pub(crate) last_ns: u64,
    /// The static figures each domain is divided with now (CPU domains,
    /// then GPUs).
    pub(crate) figures: [&'a [StaticFigure]; 2],
    /// The stack samples' energy (`--stacks`; its frames named at the
    /// end, before [`Sink::finish`]).
    pub(crate) stacks: Option<&'a StackLedger>,
}

impl Totals<'_> {
    /// The domains read so far: a domain with none has no field in JSON
    /// and no Prometheus series (no reader is not 0).
    pub(crate) fn read(&self) -> crate::model::unread::Read {
        crate::model::unread::Read::of(self.sums.ledger.domains().iter().map(|d| d.key.domain))
    }

    /// The profile's length so far (ns).
    pub(crate) fn span_ns(&self) -> u64 {
        self.last_ns.saturating_sub(self.start_ns)
    }

    /// The static figure `domain` of `package` is divided with now.
    pub(crate) fn figure(&self, domain: Domain, package: Option<u32>) -> Option<&StaticFigure> {
        StaticFigure::find(&self.figures, domain, package)
    }

    /// Per cgroup so far, most energy first; with `since_ns`, only those
    /// whose processes ran since.
    pub(crate) fn cgroup_reports(&self, since_ns: Option<u64>) -> Vec<CgroupReport> {
        self.sums
            .cgroups
            .reports(since_ns, self.span_ns(), self.carbon)
    }

    /// Per container and systemd unit so far, most energy first; with
    /// `since_ns`, only those whose processes ran since.
    pub(crate) fn container_reports(&self, since_ns: Option<u64>) -> Vec<ContainerReport> {
        self.sums
            .cgroups
            .container_reports(since_ns, self.span_ns(), self.carbon)
    }

    /// Per batch job so far, most energy first; with `since_ns`, only
    /// those whose processes ran since.
    pub(crate) fn job_reports(&self, since_ns: Option<u64>) -> Vec<JobReport> {
        self.sums
            .cgroups
            .job_reports(since_ns, self.start_ns, self.span_ns(), self.carbon)
    }
}

/// An output of a running profile.
pub(crate) trait Sink {
    /// The stream's first record, before the first interval.
    fn header(&mut self, _header: &HeaderRecord, _totals: &Totals<'_>) {}
    /// One interval's record, as it closes (with the sums it is in).
    fn interval(&mut self, _record: &IntervalRecord, _totals: &Totals<'_>) {}
    /// A window, as it closes (or, unterminated, at the end).
    fn window(&mut self, _window: &WindowReport) {}
    /// The end: the run document (its `intervals` empty: a sink that
    /// wants them keeps them as they pass). Per file written, the line to
    /// print after the run's table (`report written to FILE`), or why it
    /// could not be written. Every sink's end is tried whatever another's
    /// did.
    fn finish(&mut self, _report: &RunReport, _totals: &Totals<'_>) -> Vec<Result<String, String>> {
        Vec::new()
    }
    /// Why it stopped writing early (a full disk), if it did: one line.
    /// The profile goes on; the run ends with exit status 125.
    fn failure(&self) -> Option<&str> {
        None
    }
    /// A problem to keep in the run's report (reported once, as it begins).
    fn take_problem(&mut self) -> Option<String> {
        None
    }
    /// Whether it reads each VM's sums (the profile then keeps them).
    fn needs_vms(&self) -> bool {
        false
    }
}

#[cfg(test)]
mod tests;
