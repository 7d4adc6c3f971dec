//! Reading profiles back (`wattprof report`): a recording, a stream or a
//! stream cut short becomes one [`Summary`], which the table, `--json`,
//! the comparison of two runs, the plots and the CSV files are made from.

pub(crate) mod compare;
mod cut;
pub(crate) mod jobs;
pub mod metrics;
pub(crate) mod plot;
pub(crate) mod read;
pub mod render;

use serde::Serialize;

use crate::model::record::IntervalRecord;
use crate::model::{
    ContainerReport, DomainReport, GroupEnergy, HostReport, ProcessReport, RunReport, WindowReport,
};
use crate::process::GroupTotals;
use crate::sources::registry::ReaderUse;
pub(crate) use read::{Cut, ReadError};

/// What kind of file a summary was read from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub(crate) enum Format {
    /// A recording (`--output`).
    Recording,
    /// A whole `--jsonl` stream (it has its summary).
    Stream,
    /// A stream cut short: rebuilt from its complete lines.
    CutStream,
}

impl Format {
    /// In words, for tables.
    pub(crate) fn words(self) -> &'static str {
        match self {
            Self::Recording => "recording",
            Self::Stream => "stream",
            Self::CutStream => "stream cut short",
        }
    }
}

/// The command of a `run`.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct CommandSummary {
    /// Its command line.
    pub(crate) argv: Vec<String>,
    /// Its pid (not in a cut stream).
    pub(crate) pid: Option<u32>,
    /// Exit code.
    pub(crate) exit_code: Option<i32>,
    /// The signal that killed it.
    pub(crate) signal: Option<i32>,
    /// Processes in its tree (not in a cut stream).
    pub(crate) processes: Option<usize>,
}

/// CPU time over the whole machine.
#[derive(Clone, Debug, Serialize)]
pub(crate) struct MachineSummary {
    /// Possible CPUs (not in a cut stream).
    pub(crate) cpus: Option<usize>,
    /// CPU time of all tasks (ns).
    pub(crate) busy_ns: u64,
    /// All CPUs' accounting windows (not in a cut stream).
    pub(crate) window_ns: Option<u64>,
}

/// A profile as `report` shows it: totals per domain, group, process,
/// container and window, whichever file they came from.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// The file.
    pub(crate) file: String,
    /// What it is.
    pub(crate) format: Format,
    /// Where a stream was cut.
    pub(crate) cut: Option<Cut>,
    /// What a cut stream cannot tell (only its summary line has it).
    pub(crate) missing: Vec<String>,
    /// Stream lines of a record type this wattprof does not know (written
    /// by a newer one), skipped.
    pub(crate) unknown_lines: usize,
    /// Layout version.
    pub(crate) schema_version: u32,
    /// Who wrote it.
    pub(crate) wattprof_version: String,
    /// `run` or `monitor`.
    pub(crate) mode: String,
    /// Wall-clock start (ns since the Unix epoch).
    pub(crate) start_unix_ns: u64,
    /// Length of the profile (to the cut, in a cut stream).
    pub(crate) wall_ns: u64,
    /// The machine.
    pub(crate) host: HostReport,
    /// The command (`run`).
    pub(crate) command: Option<CommandSummary>,
    /// Interval records in the file.
    pub(crate) intervals: usize,
    /// Readers in use.
    #[serde(with = "crate::model::wire::via")]
    pub(crate) readers: Vec<ReaderUse>,
    /// Per domain and package.
    pub(crate) domains: Vec<DomainReport>,
    /// On-CPU time per group.
    #[serde(with = "crate::model::wire::via")]
    pub(crate) group_times: GroupTotals,
    /// Energy per group.
    pub(crate) group_energy: GroupEnergy,
    /// Whole-machine CPU time.
    pub(crate) machine: MachineSummary,
    /// Processes, most energy first.
    pub(crate) processes: Vec<ProcessReport>,
    /// Containers and systemd units, most energy first (not in a cut
    /// stream).
    pub(crate) containers: Vec<ContainerReport>,
    /// Batch jobs, most energy first (not in a cut stream).
    #[serde(default)]
    pub(crate) jobs: Vec<crate::model::JobReport>,
    /// Windows, in the order they ended.
    pub(crate) windows: Vec<WindowReport>,
    /// gCO2eq per kWh.
    pub(crate) carbon_intensity_g_per_kwh: f64,
    /// Where that comes from.
    pub(crate) carbon_intensity_source: String,
    /// How static power was shared, and the figures (a recording's).
    pub(crate) static_note: Option<String>,
    /// Reader failures.
    pub(crate) problems: Vec<String>,
    /// Each MIG instance's GPU energy.
    pub(crate) mig_instances: Vec<crate::model::MigInstanceReport>,
    /// Energy per function (`--stacks`; not in a cut stream).
    pub(crate) stacks: Option<crate::model::stacks::StackReport>,
}

impl Summary {
    /// The domains this profile has a reader for.
    pub(crate) fn read(&self) -> crate::model::unread::Read {
        crate::model::unread::Read::of(self.domains.iter().map(|d| d.domain))
    }
}

/// A file read back: its summary and its intervals.
#[derive(Debug)]
pub struct Loaded {
    /// Totals.
    pub summary: Summary,
    /// The interval records (machine-level only in a `monitor` recording).
    pub(crate) intervals: Vec<IntervalRecord>,
}

/// Reads `path` (a recording, a stream, or a stream cut short).
pub(crate) fn load(path: &std::path::Path) -> Result<Loaded, ReadError> {
    into_loaded(path, read::read(path)?)
}

/// [`load`] on bytes already in memory (`path` names them).
pub fn load_bytes(path: &std::path::Path, bytes: &[u8]) -> Result<Loaded, ReadError> {
    into_loaded(path, read::parse(path, bytes)?)
}

fn into_loaded(path: &std::path::Path, read: read::File) -> Result<Loaded, ReadError> {
    let file = path.display().to_string();
    Ok(match read {
        read::File::Recording(r, intervals) => Loaded {
            summary: Summary::of_report(&r, file, Format::Recording, intervals.len()),
            intervals,
        },
        read::File::Stream(s) => match (&s.summary, &s.cut) {
            (Some(r), None) => Loaded {
                summary: Summary {
                    unknown_lines: s.unknown_lines,
                    ..Summary::of_report(r, file, Format::Stream, s.intervals.len())
                },
                intervals: s.intervals,
            },
            _ => Loaded {
                summary: Summary::of_cut_stream(&s, file),
                intervals: s.intervals,
            },
        },
    })
}

impl Summary {
    /// From a whole document (a recording, or a stream's summary).
    pub(crate) fn of_report(r: &RunReport, file: String, format: Format, intervals: usize) -> Self {
        let mut processes = r.processes.clone();
        processes.sort_by(|a, b| {
            b.energy
                .total_j
                .total_cmp(&a.energy.total_j)
                .then(b.on_cpu_ns.cmp(&a.on_cpu_ns))
                .then(a.pid.cmp(&b.pid))
        });
        Self {
            file,
            format,
            cut: None,
            missing: Vec::new(),
            unknown_lines: 0,
            schema_version: r.schema_version,
            wattprof_version: r.wattprof_version.clone(),
            mode: r.mode.clone(),
            start_unix_ns: r.start_unix_ns,
            wall_ns: r.wall_ns,
            host: r.host.clone(),
            command: r.command.as_ref().map(|c| CommandSummary {
                argv: c.argv.clone(),
                pid: Some(c.pid),
                exit_code: c.exit_code,
                signal: c.signal,
                processes: Some(c.processes),
            }),
            intervals,
            readers: r.energy.readers.clone(),
            domains: r.energy.domains.clone(),
            group_times: r.groups.clone(),
            group_energy: r.energy.groups.clone(),
            machine: MachineSummary {
                cpus: Some(r.machine.cpus),
                busy_ns: r.machine.busy_ns,
                window_ns: Some(r.machine.window_ns),
            },
            processes,
            containers: r.containers.clone(),
            jobs: r.jobs.clone(),
            windows: r.windows.clone(),
            carbon_intensity_g_per_kwh: r.energy.carbon_intensity_g_per_kwh,
            carbon_intensity_source: r.energy.carbon_intensity_source.clone(),
            static_note: r.energy.static_power.as_ref().map(|p| p.note.clone()),
            mig_instances: r.energy.mig_instances.clone(),
            problems: r.energy.problems.clone(),
            stacks: r.stacks.clone(),
        }
    }

    /// From a stream cut short (no summary line): the sums of its
    /// intervals, each figure as the recording would have it, and what a
    /// cut stream cannot say.
    pub(crate) fn of_cut_stream(s: &read::Stream, file: String) -> Self {
        let h = &s.header;
        let g = h.carbon_intensity_g_per_kwh;
        let carbon = crate::carbon::CarbonIntensity {
            g_per_kwh: g,
            source: h.carbon_intensity_source.clone(),
        };
        let span_ns = s.intervals.last().map_or(0, |i| i.t_ns);
        // In `run`, the rows include wattprof itself, which the
        // recording's processes do not (its energy is in its group).
        let own = h.profiler_pid.filter(|_| h.mode == "run");
        let sums = cut::sum(&s.intervals, span_ns, own, &carbon);
        let missing = cut::missing(h);
        Self {
            file,
            format: Format::CutStream,
            cut: s.cut.clone(),
            missing,
            unknown_lines: s.unknown_lines,
            schema_version: h.schema_version,
            wattprof_version: h.wattprof_version.clone(),
            mode: h.mode.clone(),
            start_unix_ns: h.start_unix_ns,
            wall_ns: span_ns,
            host: h.host.clone(),
            command: h.argv.as_ref().map(|argv| CommandSummary {
                argv: argv.clone(),
                pid: None,
                exit_code: None,
                signal: None,
                processes: None,
            }),
            intervals: s.intervals.len(),
            readers: h.readers.clone(),
            domains: sums.domains,
            group_times: sums.group_times,
            group_energy: sums.group_energy,
            machine: MachineSummary {
                cpus: None,
                busy_ns: sums.busy_ns,
                window_ns: None,
            },
            processes: sums.processes,
            containers: Vec::new(),
            jobs: Vec::new(),
            windows: s.windows.clone(),
            carbon_intensity_g_per_kwh: g,
            carbon_intensity_source: h.carbon_intensity_source.clone(),
            static_note: None,
            mig_instances: sums.mig_instances,
            problems: Vec::new(),
            stacks: None,
        }
    }

    /// The figures of a codecarbon emissions row.
    pub(crate) fn emissions(&self) -> crate::sink::csv::Emissions<'_> {
        crate::sink::csv::Emissions {
            mode: &self.mode,
            start_unix_ns: self.start_unix_ns,
            wall_ns: self.wall_ns,
            argv: self.command.as_ref().map(|c| c.argv.as_slice()),
            tree: &self.group_energy.tree,
            domains: &self.domains,
            g_per_kwh: self.carbon_intensity_g_per_kwh,
            cpus: self.machine.cpus,
            busy_ns: self.machine.busy_ns,
            window_ns: self.machine.window_ns,
            host: &self.host,
        }
    }

    /// Measured energy of a domain, all packages (J).
    pub(crate) fn measured_j(&self, domain: crate::sources::Domain) -> f64 {
        self.domains
            .iter()
            .filter(|d| d.domain == domain)
            .map(|d| d.measured_j)
            .sum()
    }
}
