//! `wattprof run -- CMD ARGS...`

use std::ffi::OsString;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;

use super::{Fatal, child, energy::EnergyArgs};
use crate::output::{self, ProfilerReport};
use crate::process::{ProcFs, ProcessTable};
use crate::profile::sampling::{Hooks, Ticker, sample_until};
use crate::profile::windows::WindowSocket;
use crate::profile::{
    self, CommandEnd, Ending, KeepIntervals, Profile, ProfileConfig, Readers, Scope,
};
use crate::tracker::{EbpfTracker, TrackerConfig, monotonic_ns};

/// Arguments of `wattprof run`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  sudo wattprof run -- python train.py\n  \
        sudo wattprof run --interval 500ms --output run.json -- make -j8\n  \
        sudo wattprof run --country FRA --jsonl live.jsonl -- ./train.sh\n\n\
        Profiling windows: the command finds a Unix datagram socket in $WATTPROF_SOCKET; \
        sending `begin NAME` and `end NAME` to it measures that region of the program \
        (see README).\n\n\
        Exit status: the command's (128+N if signal N killed it); 125 if wattprof \
        failed, 126 if the command cannot be executed, 127 if it is not found.")]
pub struct RunArgs {
    /// How often the tracker is read (e.g. 1s, 250ms). Totals are exact at
    /// any interval; shorter intervals give finer series and cost more.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub interval: Duration,

    /// Write the recording as JSON to FILE (written when the command ends;
    /// layout in docs/recording.md).
    #[arg(long, short, value_name = "FILE")]
    pub output: Option<PathBuf>,

    #[command(flatten)]
    pub energy: EnergyArgs,

    /// Run the command as root even when wattprof was started with sudo
    /// (by default it runs as the user who invoked sudo).
    #[arg(long)]
    pub as_root: bool,

    #[command(flatten)]
    pub tracker: super::TrackerArgs,

    /// Switch tracker: detect exits with the sched_process_exit tracepoint,
    /// as on kernels older than 5.18, even where the final context switch
    /// is available.
    #[arg(long, hide = true)]
    pub legacy_exit_tracking: bool,

    /// Switch tracker: time slices between context switches, as on kernels
    /// without BTF, instead of reading the scheduler's own counter.
    #[arg(long, hide = true)]
    pub switch_timing: bool,

    /// The command and its arguments.
    #[arg(
        required = true,
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "CMD"
    )]
    pub command: Vec<OsString>,
}

/// Parses `1s`, `250ms`, `2.5s`, `1m`, `500us`; between 10 ms and 1 hour.
pub fn parse_interval(text: &str) -> Result<Duration, String> {
    parse_duration_within(
        text,
        Duration::from_millis(10),
        Duration::from_secs(3600),
        "10ms to 1h",
    )
}

/// Parses a duration like [`parse_interval`], between 10 ms and 30 days
/// (with `h` and `d` units too).
pub fn parse_duration(text: &str) -> Result<Duration, String> {
    parse_duration_within(
        text,
        Duration::from_millis(10),
        Duration::from_secs(30 * 86_400),
        "10ms to 30d",
    )
}

fn parse_duration_within(
    text: &str,
    min: Duration,
    max: Duration,
    range: &str,
) -> Result<Duration, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .ok_or_else(|| format!("`{text}` has no unit: use e.g. 1s or 250ms"))?;
    let (num, unit) = t.split_at(split);
    let value: f64 = num
        .parse()
        .map_err(|_| format!("`{text}` is not a duration: use e.g. 1s or 250ms"))?;
    let scale = match unit {
        "us" | "µs" => 1e-6,
        "ms" => 1e-3,
        "s" => 1.0,
        "m" => 60.0,
        "h" => 3600.0,
        "d" => 86_400.0,
        _ => {
            return Err(format!(
                "unknown unit `{unit}` in `{text}`: use us, ms, s, m, h or d"
            ));
        }
    };
    match Duration::try_from_secs_f64(value * scale) {
        Ok(d) if d >= min && d <= max => Ok(d),
        _ => Err(format!("`{text}` out of range: use {range}")),
    }
}

/// The output file is written to a temporary name beside it and renamed at
/// the end, so a failed run never leaves a half-written report, and an
/// unwritable location fails before the command starts.
pub(super) struct PendingOutput {
    tmp: PathBuf,
    pub(super) dest: PathBuf,
    file: std::fs::File,
}

impl PendingOutput {
    pub(super) fn create(dest: &Path) -> Result<Self, Fatal> {
        let dir = match dest.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = dest.file_name().ok_or_else(|| {
            Fatal::profiler(format!("--output {}: not a file name", dest.display()))
        })?;
        let mut tmp_name = OsString::from(".");
        tmp_name.push(name);
        tmp_name.push(format!(".{}.tmp", std::process::id()));
        let tmp = dir.join(tmp_name);
        let file = std::fs::File::create(&tmp).map_err(|e| {
            Fatal::profiler(format!(
                "cannot write --output {}: {e} (check that {} exists and is writable)",
                dest.display(),
                dir.display()
            ))
        })?;
        Ok(Self {
            tmp,
            dest: dest.to_path_buf(),
            file,
        })
    }

    pub(super) fn commit(mut self, json: &[u8]) -> std::io::Result<()> {
        self.file.write_all(json)?;
        self.file.write_all(b"\n")?;
        self.file.sync_all()?;
        std::fs::rename(&self.tmp, &self.dest)
    }
}

impl Drop for PendingOutput {
    fn drop(&mut self) {
        // After a successful rename this finds nothing to remove.
        let _ = std::fs::remove_file(&self.tmp);
    }
}

/// Runs `wattprof run`; returns the command's exit code.
pub fn execute(args: RunArgs) -> anyhow::Result<i32> {
    // Cheap checks first: nothing is loaded or started if these fail.
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Fatal::profiler("no command given: wattprof run -- CMD ARGS..."))?;
    let resolved = child::resolve_program(program, std::env::var_os("PATH").as_deref())?;
    let run_as = if args.as_root {
        None
    } else {
        child::sudo_user(|k| std::env::var_os(k))?
    };
    let pending_output = args
        .output
        .as_deref()
        .map(PendingOutput::create)
        .transpose()?;
    let (carbon, jsonl) = args.energy.validate()?;
    // Before anything slow starts (NVML, `modprobe msr`, loading eBPF): a
    // signal that comes meanwhile is held and given to the command once it
    // runs, never lost or fatal to wattprof.
    let signal_target = Arc::new(child::SignalTarget::default());
    child::forward_signals(signal_target.clone()).context("cannot install signal handlers")?;

    let cfg = TrackerConfig {
        force_exit_tracepoint: args.legacy_exit_tracking,
        force_switch_timing: args.switch_timing,
        ..args.tracker.config()
    };
    let argv: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let (mut tracker, mut profile, start_unix_ns) = start_profile(
        &cfg,
        &args.energy,
        carbon,
        Scope::Tree,
        KeepIntervals::All,
        jsonl,
    )?;
    profile.write_header("run", tracker.kind(), Some(&argv), start_unix_ns);

    let socket = WindowSocket::bind(
        &std::env::temp_dir(),
        run_as.as_ref().map(|u| (u.uid, u.gid)),
    )
    .map_err(|e| {
        Fatal::profiler(format!(
            "cannot create the profiling-window socket in {}: {e} (set TMPDIR to a writable \
             directory)",
            std::env::temp_dir().display()
        ))
    })?;

    let mut proc = child::spawn(
        &resolved,
        rest,
        run_as.as_ref(),
        &[("WATTPROF_SOCKET", socket.path().as_os_str())],
    )?;
    let pid = proc.id();
    signal_target.started(pid);
    profile.table.set_root(pid);
    let pidfd = child::pidfd(pid);

    let interval_ns = args.interval.as_nanos() as u64;
    let mut ticker = Ticker::new(monotonic_ns(), interval_ns);
    let mut hooks = RunLoop {
        socket: &socket,
        proc: &mut proc,
        pidfd: pidfd.as_ref().map(AsRawFd::as_raw_fd),
        status: None,
    };
    sample_until(&mut profile, &mut tracker, &mut ticker, &mut hooks)?;
    let Some(status) = hooks.status else {
        return Err(Fatal::profiler("the sampling loop ended before the command").into());
    };
    signal_target.ended();

    // The command was reaped, but its threads may still be finishing their
    // last context switch, and their final run time comes when they are
    // freed (an RCU grace period later): wait (briefly) for all of them,
    // and for threads of its descendants that ended in its last second.
    let ended_ns = monotonic_ns();
    let settle_until = ended_ns + 250_000_000;
    while (!tracker.has_exited(pid)
        || tracker.live_threads_of(pid) > 0
        || tracker.awaiting_final_since(ended_ns.saturating_sub(1_000_000_000), ended_ns) > 0)
        && monotonic_ns() < settle_until
    {
        std::thread::sleep(Duration::from_millis(1));
        tracker.drain_events();
    }
    // Window messages sent just before the command exited.
    window_boundary(&socket, &mut tracker, &mut profile)?;
    profile.tick(&mut tracker, true)?;

    let report = profile.finish(Ending {
        mode: "run",
        command: Some(CommandEnd {
            argv,
            pid,
            exit_code: status.code(),
            signal: std::os::unix::process::ExitStatusExt::signal(&status),
        }),
        start_unix_ns,
        profiler: tracker_facts(&tracker, args.tracker.max_tasks, interval_ns),
    });
    deliver(&report, pending_output)?;
    Ok(child::exit_code(status))
}

/// The `run` loop's part: the window socket, and the command's end.
struct RunLoop<'a> {
    socket: &'a WindowSocket,
    proc: &'a mut std::process::Child,
    /// The command's pidfd (Linux 5.3+): readable when it exits.
    pidfd: Option<std::os::fd::RawFd>,
    status: Option<std::process::ExitStatus>,
}

impl Hooks<EbpfTracker> for RunLoop<'_> {
    fn fds(&self) -> Vec<std::os::fd::RawFd> {
        std::iter::once(self.socket.fd())
            .chain(self.pidfd)
            .collect()
    }

    fn max_sleep_ms(&self, _now_ns: u64) -> i32 {
        // With no pidfd (pre-5.3 kernels), look at the child every 50 ms.
        if self.pidfd.is_some() { 1000 } else { 50 }
    }

    fn after_interval(&mut self, _: &mut Profile, _: u64) -> anyhow::Result<()> {
        Ok(())
    }

    fn woke(
        &mut self,
        ready: &[bool],
        profile: &mut Profile,
        tracker: &mut EbpfTracker,
    ) -> anyhow::Result<bool> {
        if ready.first() == Some(&true) {
            window_boundary(self.socket, tracker, profile)?;
        }
        self.status = self.proc.try_wait().context("waiting for the command")?;
        Ok(self.status.is_some())
    }
}

/// Handles waiting window messages: a window boundary reads the counters
/// and the tracker at once, so a window is exact to the counters'
/// resolution, not rounded to the interval.
fn window_boundary(
    socket: &WindowSocket,
    tracker: &mut EbpfTracker,
    profile: &mut Profile,
) -> anyhow::Result<()> {
    let messages = socket.receive();
    if !messages.is_empty() {
        let at_ns = profile.tick(tracker, false)?;
        profile.window_messages(messages, at_ns);
    }
    Ok(())
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
    keep: KeepIntervals,
    jsonl: Option<crate::output::jsonl::Jsonl>,
) -> anyhow::Result<(EbpfTracker, Profile, u64)> {
    let readers = Readers::open(&energy.readers())
        .map_err(|e| Fatal::profiler(format!("energy reader: {e}")))?;
    let mut tracker =
        EbpfTracker::start(tracker_cfg).map_err(|e| Fatal::profiler(e.to_string()))?;
    let table = ProcessTable::new(
        ProcFs::real(),
        tracker.topology().sockets(),
        std::process::id(),
    );
    let host = profile::host_report(readers.gpus());
    let mut profile = Profile::new(
        table,
        readers,
        tracker.topology().package_ids.clone(),
        ProfileConfig {
            carbon,
            filter: energy.filter(),
            docker_socket: energy.docker_socket.clone(),
            cgroupfs: None,
            scope,
            keep,
        },
        jsonl,
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
    }
}

/// Writes the recording (first: a closed or broken stderr must not cost
/// it), then prints the table to stderr.
pub(super) fn deliver(
    report: &output::RunReport,
    pending_output: Option<PendingOutput>,
) -> anyhow::Result<()> {
    let written = match pending_output {
        Some(out) => {
            let json = serde_json::to_vec_pretty(report).context("encoding the report")?;
            let dest = out.dest.clone();
            out.commit(&json)
                .with_context(|| format!("writing {}", dest.display()))?;
            Some(dest)
        }
        None => None,
    };
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(output::render_run_table(report).as_bytes());
    if let Some(dest) = written {
        let _ = writeln!(stderr, "  report written to {}", dest.display());
    }
    Ok(())
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
    }
}
