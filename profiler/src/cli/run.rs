//! `wattprof run -- CMD ARGS...`

use std::ffi::OsString;
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::setup::{
    deliver, open_outputs, outputs_complete, parse_interval, start_profile, tracker_facts,
};
use super::{Fatal, child, energy::EnergyArgs};
use crate::profile::sampling::{Hooks, Ticker, sample_until};
use crate::profile::windows::WindowSocket;
use crate::profile::{CommandEnd, Ending, Profile, Scope, WindowAnswer};
use crate::sink::recording::Keep;
use crate::tracker::{EbpfTracker, TrackerConfig, monotonic_ns};

/// Arguments of `wattprof run`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  sudo wattprof run -- python train.py\n  \
        sudo wattprof run --interval 500ms --output run.json -- make -j8\n  \
        sudo wattprof run --country FRA --jsonl live.jsonl -- ./train.sh\n\n\
        Profiling windows: the command finds a Unix datagram socket in $WATTPROF_SOCKET; \
        sending `begin NAME` and `end NAME` to it measures that region of the program \
        (see docs/windows.md).\n\n\
        Exit status: the command's (128+N if signal N killed it); 2 for a bad command line; \
        125 if wattprof failed (also when --jsonl or --csv-intervals stopped early on a full \
        disk; the rest is still written); 126 if the command cannot be executed, 127 if it is \
        not found.")]
pub(crate) struct RunArgs {
    /// How often the tracker is read: 250ms, 2.5s, 1m, 1m30s (humantime's
    /// forms; 10 ms to 1 h). Totals are exact at any interval; shorter
    /// intervals give finer series and cost more.
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub(crate) interval: Duration,

    /// Write the recording as JSON to FILE (layout in docs/recording.md):
    /// written to a temporary file beside FILE when the command ends and
    /// renamed when complete; an unwritable place fails before the command
    /// starts.
    #[arg(long, short, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) energy: EnergyArgs,

    #[command(flatten)]
    pub(crate) stacks: super::stacks::StackArgs,

    /// Run the command as root even when wattprof was started with sudo.
    /// By default it runs as the user who invoked sudo (SUDO_UID,
    /// SUDO_GID, that user's supplementary groups, HOME, USER, LOGNAME);
    /// wattprof itself keeps root.
    #[arg(long)]
    pub(crate) as_root: bool,

    /// Have this wattprof daemon measure the command (its socket; default
    /// $WATTPROF_DAEMON, else /run/wattprof/wattprof.sock). Without root,
    /// `run` uses the daemon by itself when one answers; with it, only
    /// when this is given. See docs/shared.md.
    #[arg(long, value_name = "PATH")]
    pub(crate) daemon: Option<PathBuf>,

    #[command(flatten)]
    pub(crate) tracker: super::TrackerArgs,

    /// Switch tracker: detect exits with the sched_process_exit tracepoint,
    /// as on kernels older than 5.18, even where the final context switch
    /// is available.
    #[arg(long, hide = true)]
    pub(crate) legacy_exit_tracking: bool,

    /// Switch tracker: time slices between context switches, as on kernels
    /// without BTF, instead of reading the scheduler's own counter.
    #[arg(long, hide = true)]
    pub(crate) switch_timing: bool,

    /// The command and its arguments.
    #[arg(required = true, trailing_var_arg = true, value_name = "CMD")]
    pub(crate) command: Vec<OsString>,
}

/// Runs `wattprof run`; returns the command's exit code.
pub(crate) fn execute(args: RunArgs) -> anyhow::Result<i32> {
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
    let (carbon, streams) = open_outputs(args.output.as_deref(), Keep::All, &args.energy)?;
    let stack_outputs = args.stacks.open(args.output.as_deref())?;
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
    let (mut tracker, mut profile, start_unix_ns) =
        start_profile(&cfg, &args.energy, carbon, Scope::Tree, streams)?;
    // run's output beyond the streams it shares with monitor: the flame
    // graph.
    if let Some(s) = stack_outputs {
        s.start(&mut profile)?;
        profile.add_sink(Box::new(s.sink()));
    }
    profile.write_header("run", tracker.kind(), Some(&argv), start_unix_ns);

    let socket = window_socket(run_as.as_ref())?;

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

    settle(&mut tracker, pid);
    // Window messages sent just before the command exited.
    window_boundary(&socket, &mut tracker, &mut profile)?;
    profile.tick(&mut tracker, true)?;

    let finished = profile.finish(Ending {
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
    deliver(&finished, args.energy.rows())?;
    // The command's failure is its own exit status; a command that
    // succeeded exits 125 when an output of wattprof's stopped early.
    let code = child::exit_code(status);
    if code == 0 {
        outputs_complete(&finished.report)?;
    }
    Ok(code)
}

/// Waits (at most 250 ms) for the last run time of the command's threads,
/// and of its descendants' threads that ended in its last second.
fn settle(tracker: &mut EbpfTracker, pid: u32) {
    // The command was reaped, but its threads may still be finishing their
    // last context switch, and their final run time comes when they are
    // freed (an RCU grace period later): wait (briefly) for all of them,
    // and for threads of its descendants that ended in its last second.
    // Threads whose exit event was lost are waited for too, once /proc no
    // longer lists them (looked up once, here): those a read showed, and
    // those known only from their fork (their frees come in no fixed
    // order, so the command's own free is no sign theirs came).
    let ended_ns = monotonic_ns();
    let settle_until = ended_ns + 250_000_000;
    let last_second = ended_ns.saturating_sub(1_000_000_000);
    tracker.drain_events();
    let lost_exits = tracker.lost_exits_since(last_second);
    let unended = tracker.unended_forks_since(last_second);
    while (!tracker.has_exited(pid)
        || tracker.live_threads_of(pid) > 0
        || tracker.awaiting_final_since(last_second, ended_ns) > 0
        || tracker.not_freed(&lost_exits) > 0
        || tracker.still_unended(&unended) > 0)
        && monotonic_ns() < settle_until
    {
        std::thread::sleep(Duration::from_millis(1));
        tracker.drain_events();
    }
}

/// The profiling-window socket the command finds in `WATTPROF_SOCKET`,
/// owned by the user the command runs as.
fn window_socket(run_as: Option<&child::RunAs>) -> anyhow::Result<WindowSocket> {
    Ok(
        WindowSocket::bind(&std::env::temp_dir(), run_as.map(|u| (u.uid, u.gid))).map_err(|e| {
            Fatal::profiler(format!(
                "cannot create the profiling-window socket in {}: {e} (set TMPDIR to a writable \
             directory)",
                std::env::temp_dir().display()
            ))
        })?,
    )
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
        let answers =
            profile.window_messages(messages.iter().map(|m| (m.text.as_str(), m.pid)), at_ns);
        // A sender whose socket has an address is told how its `end` went:
        // the window's figures as the recording holds them, or why not.
        for (m, answer) in messages.iter().zip(answers) {
            let Some(to) = m.reply_to.as_ref().filter(|_| m.is_end()) else {
                continue;
            };
            let payload = match answer {
                WindowAnswer::Ended(report) => {
                    let read = crate::model::unread::Read::of_window(profile.read(), &report);
                    crate::model::unread::writing(read, || serde_json::to_vec(&report))
                }
                WindowAnswer::Refused(error) => serde_json::to_vec(&serde_json::json!({
                    "error": error
                })),
                WindowAnswer::Began => continue,
            };
            if let Ok(payload) = payload {
                socket.reply(to, &payload);
            }
        }
    }
    Ok(())
}
