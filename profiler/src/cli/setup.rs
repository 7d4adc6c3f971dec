//! What `run` and `monitor` share: argument parsers, opening the outputs,
//! saying what they wrote, and starting a profile (readers, tracker, and their common
//! starting point).

use std::io::Write;

use std::path::Path;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::{Fatal, energy::EnergyArgs};
use crate::model::ProfilerReport;
use crate::process::{ProcFs, ProcessTable};
use crate::profile::{self, Finished, Profile, ProfileConfig, Readers, Scope};
use crate::sink::recording::{Keep, Recording};
use crate::tracker::{EbpfTracker, TrackerConfig};

/// Parses `1s`, `250ms`, `2.5s`, `1m`, `500us`; between 10 ms and 1 hour.
pub(crate) fn parse_interval(text: &str) -> Result<Duration, String> {
    parse_duration_within(
        text,
        Duration::from_millis(10),
        Duration::from_secs(3600),
        "10ms to 1h",
    )
}

/// Parses a duration like [`parse_interval`], between 10 ms and 30 days
/// (with `h` and `d` units too).
pub(crate) fn parse_duration(text: &str) -> Result<Duration, String> {
    parse_duration_within(
        text,
        Duration::from_millis(10),
        Duration::from_secs(30 * 86_400),
        "10ms to 30d",
    )
}

/// humantime's grammar (`1m30s`, `2.5s`, `500 msec`, `µs`), today's
/// messages and bounds. A single number and unit humantime refuses (a
/// fraction it cannot make exact, as `0.001h`; a leading dot, `.5s`) is
/// read as before: the number as a float, the unit's length humantime's.
fn parse_duration_within(
    text: &str,
    min: Duration,
    max: Duration,
    range: &str,
) -> Result<Duration, String> {
    use humantime::DurationError as E;
    let t = text.trim();
    let parsed = humantime::parse_duration(t).or_else(|e| decimal(t).ok_or(e));
    match parsed {
        Ok(d) if d >= min && d <= max => Ok(d),
        Ok(_) | Err(E::NumberOverflow) => Err(format!("`{text}` out of range: use {range}")),
        Err(E::UnknownUnit { unit, .. }) if unit.is_empty() => {
            Err(format!("`{text}` has no unit: use e.g. 1s or 250ms"))
        }
        Err(E::UnknownUnit { unit, .. }) => Err(format!(
            "unknown unit `{unit}` in `{text}`: use us, ms, s, m, h or d"
        )),
        Err(_) => Err(format!("`{text}` is not a duration: use e.g. 1s or 250ms")),
    }
}

/// `<decimal><unit>`, the number as a float and the unit's length as
/// humantime reads `1<unit>`.
fn decimal(t: &str) -> Option<Duration> {
    let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.'))?;
    let (num, unit) = t.split_at(split);
    let value: f64 = num.parse().ok()?;
    let unit = humantime::parse_duration(&format!("1{}", unit.trim())).ok()?;
    Duration::try_from_secs_f64(value * unit.as_secs_f64()).ok()
}

/// What a profile writes, opened before anything slow starts, so a bad
/// path or figure fails first: the recording (keeping `keep` of each
/// interval), the carbon intensity and the streams.
pub(super) fn open_outputs(
    output: Option<&Path>,
    keep: Keep,
    energy: &EnergyArgs,
) -> anyhow::Result<(crate::carbon::CarbonIntensity, super::energy::Streams)> {
    let recording = output
        .map(|dest| Recording::create(dest, keep))
        .transpose()
        .map_err(Fatal::profiler)?;
    let (carbon, mut streams) = energy.validate()?;
    if energy.cmdline {
        // Command lines may carry secrets: the files that hold them are
        // their owner's alone.
        let private = |what: &str, r: std::io::Result<()>| {
            r.map_err(|e| Fatal::profiler(format!("cannot make {what} private (mode 0600): {e}")))
        };
        if let Some(r) = &recording {
            private("--output", r.make_private())?;
        }
        if let Some(j) = &streams.jsonl {
            private("--jsonl", j.make_private())?;
        }
    }
    streams.recording = recording;
    Ok((carbon, streams))
}

/// Opens the energy readers and starts the tracker, then builds the
/// profile: readers first (NVML takes a while to load); the counters' and
/// the tracker's starting points are taken last, together. Returns the
/// wall-clock start.
pub(super) fn start_profile(
    tracker_cfg: &TrackerConfig,
    energy: &EnergyArgs,
    carbon: crate::carbon::CarbonIntensity,
    scope: Scope,
    streams: super::energy::Streams,
) -> anyhow::Result<(EbpfTracker, Profile, u64)> {
    let readers = Readers::open(&energy.readers()?).map_err(|e| {
        // A model the user named that cannot apply to this CPU (`tdp` on
        // one not in the table) is a bad value, as clap's are.
        // (The registry says so as Fatal: nothing else it opens by name is
        // in play without --powercap-root or a wattmeter.)
        let asked = energy.model.power_model == crate::sources::estimate::ModelChoice::Tdp
            && energy.powercap_root.is_none()
            && energy.wattmeter_log.is_none()
            && energy.wattmeter_cmd.is_none();
        match e {
            crate::sources::SourceError::Fatal(_) if asked => {
                Fatal::usage(format!("--power-model tdp: {e}"))
            }
            e => Fatal::profiler(format!("energy reader: {e}")),
        }
    })?;
    let mut tracker =
        EbpfTracker::start(tracker_cfg).map_err(|e| Fatal::profiler(e.to_string()))?;
    let mut table = ProcessTable::new(
        ProcFs::real(),
        tracker.topology().packages(),
        std::process::id(),
    );
    if energy.cmdline {
        // `run` reports its tree only: nobody else's line is read.
        table.read_args(match scope {
            Scope::Machine { .. } => crate::process::ArgsOf::All,
            _ => crate::process::ArgsOf::Tree,
        });
    }
    let host = profile::host_report(readers.gpus());
    // `monitor` writes what it learns there: a given file may not exist yet.
    let may_create = matches!(scope, Scope::Machine { .. });
    let mut statics = crate::profile::statics::StaticsConfig::load(
        energy.static_power,
        energy.host_model.as_deref(),
        tracker.topology().packages(),
        may_create,
    )
    .map_err(Fatal::usage)?;
    // Energy from a copy of /sys (testing) teaches nothing about this
    // host: kept only in a model file given for it.
    if energy.energy_sysfs.is_some() && energy.host_model.is_none() {
        statics.save_path = None;
    }
    let mut profile = Profile::new(
        table,
        readers,
        tracker.topology().package_ids.clone(),
        ProfileConfig {
            carbon,
            filter: energy.filter(),
            runtimes: crate::process::names::RuntimeSockets {
                docker: energy.docker_socket.clone(),
                podman: energy.podman_socket.clone(),
                containerd: energy.containerd_state.clone(),
            },
            cgroupfs: None,
            scope,
            statics,
        },
        streams.sinks(),
        host,
    );
    // Last, so nothing runs between the two starting points.
    profile
        .begin(&mut tracker)
        .map_err(|e| Fatal::profiler(e.to_string()))?;
    let start_unix_ns = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64);
    Ok((tracker, profile, start_unix_ns))
}

/// The tracker's part of a report (the profile fills in the counts).
pub(super) fn tracker_facts(
    tracker: &EbpfTracker,
    max_tasks: u32,
    interval_ns: u64,
) -> ProfilerReport {
    let (settled_from_exit, vanished_threads) = tracker.exits_without_free();
    ProfilerReport {
        tracker: tracker.kind(),
        tracker_fallback: tracker.fallback_reason().map(str::to_string),
        task_walk: tracker.task_walk(),
        task_walk_fallback: tracker.walk_fallback_reason().map(str::to_string),
        task_walk_ring_full: tracker.walk_ring_full(),
        filter_overflow: tracker.filter_overflow(),
        settled_from_exit,
        vanished_threads,
        on_cpu_ns: 0,
        kernel_memory_bytes: tracker.kernel_memory_bytes(),
        exit_tracking: tracker.exit_tracking(),
        task_clock: tracker.task_clock(),
        flush_supported: tracker.flush_supported(),
        max_tasks,
        interval_ns,
        samples: 0,
        map_read_syscalls: tracker.read_syscalls(),
        events_lost: 0,
        discarded_ns: 0,
        unmatched_forks: 0,
        ended_unseen: 0,
        output_errors: Vec::new(),
    }
}

/// An error (exit status 125) when an output stopped early, a full disk
/// under `--jsonl` or `--csv-intervals`: what was written before stays
/// valid, and the failure was warned about on stderr when it happened.
pub(super) fn outputs_complete(report: &crate::model::RunReport) -> anyhow::Result<()> {
    match report.profiler.output_errors.as_slice() {
        [] => Ok(()),
        errors => Err(Fatal::profiler(format!(
            "an output stopped early: {} (the rest of the profile was recorded; free space and \
             run again for a complete stream)",
            errors.join("; ")
        ))
        .into()),
    }
}

/// Prints the run's table to stderr, then what each output wrote; fails
/// (exit status 125) if an output could not be written. The outputs were
/// written first: a closed or broken stderr must not cost them.
pub(super) fn deliver(finished: &Finished, rows: crate::render::Rows) -> anyhow::Result<()> {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(crate::render::render_run_table(&finished.report, rows).as_bytes());
    for line in &finished.said {
        let _ = writeln!(stderr, "  {line}");
    }
    match finished.failed.as_slice() {
        [] => Ok(()),
        failed => Err(Fatal::profiler(failed.join("; ")).into()),
    }
}

#[cfg(test)]
mod tests {
    use super::parse_interval;
    use std::time::Duration;

    #[test]
    fn intervals() {
        assert_eq!(parse_interval("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_interval("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_interval("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_interval("2m"), Ok(Duration::from_secs(120)));
        assert!(parse_interval("5").is_err());
        assert!(parse_interval("1ms").is_err());
        assert!(parse_interval("2h").is_err());
        assert!(parse_interval("fast").is_err());
        assert_eq!(super::parse_duration("2h"), Ok(Duration::from_secs(7200)));
        assert!(parse_interval("1h").is_ok() && parse_interval("2h").is_err());
        assert!(super::parse_duration("100000000000000000000000d").is_err());
        // humantime's forms too.
        assert_eq!(parse_interval("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse_interval("500 msec"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_interval("20µs").map_err(|_| ()), Err(()));
        assert_eq!(parse_interval("10000us"), Ok(Duration::from_millis(10)));
        // What the parser before humantime took, humantime alone not.
        assert_eq!(parse_interval("0.001h"), Ok(Duration::from_millis(3600)));
        assert_eq!(parse_interval(".5s"), Ok(Duration::from_millis(500)));
        assert_eq!(
            parse_interval("0.0123456789s").map(|d| d.as_nanos()),
            Ok(12_345_679)
        );
    }

    #[test]
    fn duration_errors_say_what_is_wrong_with_a_hint() {
        let err = |t: &str| parse_interval(t).expect_err(t);
        assert_eq!(err("5"), "`5` has no unit: use e.g. 1s or 250ms");
        assert_eq!(
            err("5 parsecs"),
            "unknown unit `parsecs` in `5 parsecs`: use us, ms, s, m, h or d"
        );
        assert_eq!(
            err("fast"),
            "`fast` is not a duration: use e.g. 1s or 250ms"
        );
        assert_eq!(err("5ms"), "`5ms` out of range: use 10ms to 1h");
        assert_eq!(
            super::parse_duration("100000000000000000000000d").expect_err("huge"),
            "`100000000000000000000000d` out of range: use 10ms to 30d"
        );
    }
}
