//! `wattprof run` without root: a daemon (`monitor --serve`) follows the
//! command's tree and answers with its figures; this side starts the
//! command, relays its windows, and writes the table and `--output`.
//!
//! The daemon follows this process's children from the interval in
//! progress before the command is started, so nothing the command does is
//! missed; its answer after the command ended comes once the next
//! interval closed. Each interval the daemon sends the tree's figures so
//! far: if it goes away mid-run, the report says from when the figures
//! are missing and holds what was measured until then, and wattprof exits
//! 125.

use std::io::{BufRead, BufReader, Write};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;

use super::run::RunArgs;
use super::{Fatal, child};
use crate::model::{RunReport, WindowReport};
use crate::profile::served::Progress;
use crate::profile::windows::{self, ReplyTo, WindowSocket};

/// The environment variable naming the daemon's socket.
pub(crate) const DAEMON_ENV: &str = "WATTPROF_DAEMON";

/// Window messages relayed and not answered yet.
const MAX_WAITING: usize = 64;

/// How long the daemon has to answer a request that needs no interval.
const ANSWER_WITHIN: Duration = Duration::from_secs(10);

/// The daemon's socket `run` uses: `--daemon`, then `$WATTPROF_DAEMON`,
/// then the default path.
pub(crate) fn daemon_path(arg: Option<&Path>) -> PathBuf {
    arg.map(Path::to_path_buf)
        .or_else(|| std::env::var_os(DAEMON_ENV).map(PathBuf::from))
        .unwrap_or_else(|| PathBuf::from(crate::serve::DEFAULT_PATH))
}

/// Options that need the tracker in this process: refused through the
/// daemon, with one line.
fn refuse_local_only(args: &RunArgs) -> Result<(), Fatal> {
    let e = &args.energy;
    let local = [
        ("--csv-intervals", e.csv_intervals.is_some()),
        ("--stacks", args.stacks.stacks),
        ("--flamegraph", args.stacks.flamegraph.is_some()),
        ("--powercap-root", e.powercap_root.is_some()),
        ("--energy-sysfs", e.energy_sysfs.is_some()),
        ("--calibration", e.calibration.is_some()),
        ("--wattmeter-log", e.wattmeter_log.is_some()),
        ("--wattmeter-cmd", e.wattmeter_cmd.is_some()),
    ];
    match local.iter().find(|(_, given)| *given) {
        Some((opt, _)) => Err(Fatal::usage(format!(
            "{opt} needs wattprof's own tracker (root or CAP_BPF and CAP_PERFMON); through the \
             daemon, `run` gives the table, --output, --jsonl, --csv and windows (the machine's \
             per-domain figures, as --csv-intervals has them, are the daemon's: docs/shared.md)"
        ))),
        None => Ok(()),
    }
}

/// A line to the daemon, and the answer with that id (progress lines
/// that come meanwhile are kept).
struct Daemon {
    stream: UnixStream,
    lines: BufReader<UnixStream>,
    /// A line read in part (the socket is non-blocking in the loop).
    partial: Vec<u8>,
    next_id: u64,
    nonblocking: bool,
}

impl Daemon {
    fn connect(path: &Path) -> std::io::Result<Self> {
        let stream = UnixStream::connect(path)?;
        let lines = BufReader::new(stream.try_clone()?);
        Ok(Self {
            stream,
            lines,
            partial: Vec::new(),
            next_id: 1,
            nonblocking: false,
        })
    }

    /// Sends a request; its id.
    fn send(&mut self, request: &str) -> std::io::Result<u64> {
        let id = self.next_id;
        self.next_id += 1;
        // Whole, even where the socket is non-blocking for reads: a line
        // written in part would run into the next.
        let nonblocking = self.nonblocking;
        if nonblocking {
            self.stream.set_nonblocking(false)?;
        }
        let written = self
            .stream
            .write_all(format!("{request} id={id}\n").as_bytes());
        if nonblocking {
            self.stream.set_nonblocking(true)?;
        }
        written?;
        Ok(id)
    }

    /// Reads without waiting from now on.
    fn set_nonblocking(&mut self) -> std::io::Result<()> {
        self.nonblocking = true;
        self.stream.set_nonblocking(true)
    }

    /// The next line (`None`: the daemon closed the connection).
    fn read(&mut self) -> std::io::Result<Option<serde_json::Value>> {
        // What was read before a WouldBlock stays in `partial`.
        let n = self.lines.read_until(b'\n', &mut self.partial)?;
        if n == 0 && self.partial.last() != Some(&b'\n') {
            return Ok(None);
        }
        let line = std::mem::take(&mut self.partial);
        serde_json::from_slice(&line)
            .map(Some)
            .map_err(|e| std::io::Error::other(format!("a bad answer from the daemon: {e}")))
    }
}

/// Runs `wattprof run` through the daemon; `why` is why wattprof cannot
/// measure by itself. Returns the command's exit code.
pub(crate) fn execute(args: RunArgs, why: Option<String>) -> anyhow::Result<i32> {
    refuse_local_only(&args)?;
    let (program, rest) = args
        .command
        .split_first()
        .ok_or_else(|| Fatal::profiler("no command given: wattprof run -- CMD ARGS..."))?;
    let resolved = child::resolve_program(program, std::env::var_os("PATH").as_deref())?;
    let output = args
        .output
        .as_deref()
        .map(|dest| crate::sink::recording::PendingOutput::create_for("--output", dest))
        .transpose()
        .map_err(Fatal::profiler)?;
    // --jsonl opened and --csv checked now: a bad path fails before the
    // command starts. The CO2 figures are the daemon's intensity.
    let (_, streams) = args.energy.validate()?;
    let path = daemon_path(args.daemon.as_deref());
    let intervals = output.is_some() || streams.jsonl.is_some();
    let (mut daemon, skeleton) = follow(&path, why.as_deref(), intervals)?;
    daemon.set_nonblocking().context("the daemon's socket")?;
    let argv: Vec<String> = args
        .command
        .iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    let mut jsonl = streams.jsonl;
    if let Some(j) = &mut jsonl {
        j.write(&header_of(&skeleton, &argv));
    }
    let signal_target = Arc::new(child::SignalTarget::default());
    child::forward_signals(signal_target.clone()).context("cannot install signal handlers")?;
    let socket = WindowSocket::bind(&std::env::temp_dir(), None).map_err(|e| {
        Fatal::profiler(format!(
            "cannot create the profiling-window socket in {}: {e} (set TMPDIR to a writable \
             directory)",
            std::env::temp_dir().display()
        ))
    })?;
    let started = Instant::now();
    let mut proc = child::spawn(
        &resolved,
        rest,
        None,
        &[("WATTPROF_SOCKET", socket.path().as_os_str())],
    )?;
    let pid = proc.id();
    signal_target.started(pid);
    let pidfd = child::pidfd(pid);
    let mut relay = Relay {
        daemon,
        socket: &socket,
        waiting: Vec::new(),
        windows: Vec::new(),
        window_errors: Vec::new(),
        progress: None,
        lost: None,
        started,
        skeleton,
        run: None,
        finish_id: None,
        jsonl,
        intervals: Vec::new(),
    };
    let status = loop {
        relay.wait(pidfd.as_ref().map(AsRawFd::as_raw_fd));
        if let Some(status) = proc.try_wait().context("waiting for the command")? {
            break status;
        }
    };
    signal_target.ended();
    // Windows sent just before the command ended, then the tree's figures.
    relay.relay_windows();
    let run = relay.finish(std::process::id());
    let mut report = relay.report(run, &path)?;
    report.command = Some(crate::model::CommandReport {
        argv,
        pid,
        exit_code: status.code(),
        signal: std::os::unix::process::ExitStatusExt::signal(&status),
        on_cpu_ns: report.groups.tree_ns,
        processes: report.processes.len(),
        energy: report.energy.groups.tree,
    });
    deliver(
        &report,
        args.energy.rows(),
        (output, streams.emissions.as_deref()),
        &mut relay,
        child::exit_code(status),
    )
}

/// Prints the table, writes the outputs, and returns the exit code: the
/// command's, or 125 when an output failed or the figures are incomplete
/// (and the command succeeded).
fn deliver(
    report: &RunReport,
    rows: crate::render::Rows,
    (output, emissions): (Option<crate::sink::recording::PendingOutput>, Option<&Path>),
    relay: &mut Relay<'_>,
    code: i32,
) -> anyhow::Result<i32> {
    let mut stderr = std::io::stderr().lock();
    let _ = stderr.write_all(crate::render::render_run_table(report, rows).as_bytes());
    let failed = write_outputs(report, output, relay, emissions);
    for line in &failed.0 {
        let _ = writeln!(stderr, "  {line}");
    }
    if !failed.1.is_empty() {
        return Err(Fatal::profiler(failed.1.join("; ")).into());
    }
    if code == 0
        && report
            .served
            .as_ref()
            .is_some_and(|s| !s.missing.is_empty())
    {
        return Err(Fatal::profiler(format!(
            "the figures are incomplete: {}",
            report
                .served
                .as_ref()
                .map_or(String::new(), |s| s.missing.join("; "))
        ))
        .into());
    }
    Ok(code)
}

/// Connects to the daemon at `path` and has it follow this process's
/// children (the command, once started): the connection, and the tree's
/// document as it began (what is reported if the daemon goes away). `why`:
/// why wattprof cannot measure by itself, for the error when no daemon
/// answers.
fn follow(path: &Path, why: Option<&str>, intervals: bool) -> anyhow::Result<(Daemon, RunReport)> {
    let mut daemon = Daemon::connect(path).map_err(|e| {
        Fatal::profiler(match why {
            Some(why) => format!(
                "{why}; and no wattprof daemon answers at {} ({e}): ask the machine's \
                 administrator to run `wattprof monitor --serve`, or give --daemon PATH \
                 (docs/shared.md)",
                path.display()
            ),
            None => format!("--daemon {}: {e}", path.display()),
        })
    })?;
    let follow_id = daemon
        .send(if intervals {
            "follow children intervals"
        } else {
            "follow children"
        })
        .context("asking the daemon to follow the command")?;
    daemon
        .stream
        .set_read_timeout(Some(ANSWER_WITHIN))
        .context("the daemon's socket")?;
    let answer = loop {
        match daemon.read() {
            Ok(Some(v)) if v.get("id").and_then(serde_json::Value::as_u64) == Some(follow_id) => {
                break v;
            }
            Ok(Some(_)) => {}
            Ok(None) => {
                return Err(Fatal::profiler(format!(
                    "the daemon at {} closed the connection (not in its --serve-group?)",
                    path.display()
                ))
                .into());
            }
            Err(e) => {
                return Err(Fatal::profiler(format!(
                    "the daemon at {} did not answer: {e}",
                    path.display()
                ))
                .into());
            }
        }
    };
    if let Some(e) = answer.get("error").and_then(serde_json::Value::as_str) {
        return Err(Fatal::profiler(format!("the daemon at {}: {e}", path.display())).into());
    }
    // The tree's document as it began: what is reported if the daemon
    // goes away.
    let skeleton: RunReport = answer
        .get("run")
        .cloned()
        .map(serde_json::from_value)
        .transpose()
        .map_err(|e| Fatal::profiler(format!("a bad answer from the daemon: {e}")))?
        .ok_or_else(|| Fatal::profiler("the daemon's answer to `follow` has no document"))?;
    Ok((daemon, skeleton))
}

/// The stream's first record, from the tree's document as it began.
fn header_of(r: &RunReport, argv: &[String]) -> crate::model::record::HeaderRecord {
    crate::model::record::HeaderRecord {
        schema_version: r.schema_version,
        wattprof_version: r.wattprof_version.clone(),
        mode: "run".to_string(),
        tracker: r.profiler.tracker,
        start_unix_ns: r.start_unix_ns,
        host: r.host.clone(),
        package_ids: r.machine.package_ids.clone(),
        readers: r.energy.readers.clone(),
        carbon_intensity_g_per_kwh: r.energy.carbon_intensity_g_per_kwh,
        carbon_intensity_source: r.energy.carbon_intensity_source.clone(),
        argv: Some(argv.to_vec()),
        profiler_pid: Some(std::process::id()),
    }
}

/// The stream's summary, `--output` and the `--csv` row: what was written
/// (one line each), and what failed.
fn write_outputs(
    report: &RunReport,
    output: Option<crate::sink::recording::PendingOutput>,
    relay: &mut Relay<'_>,
    emissions: Option<&Path>,
) -> (Vec<String>, Vec<String>) {
    let (mut said, mut failed) = (Vec::new(), Vec::new());
    if let Some(j) = &mut relay.jsonl {
        crate::model::unread::writing(report.read(), || {
            j.write(&crate::sink::jsonl::Typed {
                kind: "summary",
                record: report,
            });
        });
        if let Some(e) = j.failure() {
            failed.push(e.to_string());
        }
    }
    if let Some(file) = output {
        let dest = file.dest.clone();
        match crate::sink::recording::write_whole(file, report, &relay.intervals) {
            Ok(()) => said.push(format!("report written to {}", dest.display())),
            Err(e) => failed.push(format!("writing {}: {e}", dest.display())),
        }
    }
    if let Some(path) = emissions {
        match crate::sink::csv::append_emissions(path, report) {
            Ok(line) => said.push(line),
            Err(e) => failed.push(e),
        }
    }
    (said, failed)
}

/// The loop's state: window messages relayed to the daemon and answered.
struct Relay<'a> {
    daemon: Daemon,
    socket: &'a WindowSocket,
    /// Window ends sent (request id), and where the program waits.
    waiting: Vec<(u64, Option<ReplyTo>)>,
    windows: Vec<WindowReport>,
    window_errors: Vec<String>,
    /// The tree's last figures from the daemon.
    progress: Option<Progress>,
    /// When the daemon went away.
    lost: Option<Duration>,
    started: Instant,
    /// The tree's document as it began.
    skeleton: RunReport,
    /// The answer to `finish`, once it came (its document, or a refusal).
    run: Option<serde_json::Value>,
    finish_id: Option<u64>,
    /// `--jsonl`: each interval and window as it comes.
    jsonl: Option<crate::sink::jsonl::Jsonl>,
    /// The tree's interval records, for `--output`.
    intervals: Vec<serde_json::Value>,
}

impl Relay<'_> {
    /// Waits for the command, a window message or the daemon (at most
    /// 200 ms), and handles what came.
    fn wait(&mut self, pidfd: Option<std::os::fd::RawFd>) {
        let mut fds: Vec<libc::pollfd> = [
            Some(self.socket.fd()),
            self.lost.is_none().then(|| self.daemon.stream.as_raw_fd()),
            pidfd,
        ]
        .into_iter()
        .flatten()
        .map(|fd| libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        })
        .collect();
        // SAFETY: a valid array of pollfd.
        unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 200) };
        self.relay_windows();
        self.read_daemon();
    }

    /// Relays the command's window messages.
    fn relay_windows(&mut self) {
        for m in self.socket.receive() {
            let cmd = match windows::parse(&m.text, m.pid) {
                Ok(cmd) => cmd,
                Err(e) => {
                    let e = format!("`{}` from pid {}: {e}", m.text.escape_debug(), m.pid);
                    self.refused(m.reply_to, e);
                    continue;
                }
            };
            if self.lost.is_some() {
                self.refused(m.reply_to, "the wattprof daemon went away".to_string());
                continue;
            }
            // The daemon answers at most a line per request: requests
            // beyond these unanswered are refused here, so a program that
            // floods windows never blocks this side writing to a daemon
            // that has stopped reading it.
            if self.waiting.len() >= MAX_WAITING {
                self.refused(
                    m.reply_to,
                    format!("{MAX_WAITING} window messages wait for the daemon's answer"),
                );
                continue;
            }
            let verb = if cmd.begin { "begin" } else { "end" };
            let sent = self
                .daemon
                .send(&format!("{verb} {} pid={}", cmd.name, cmd.pid));
            match sent {
                Ok(id) => self.waiting.push((id, m.reply_to.filter(|_| !cmd.begin))),
                Err(_) => self.daemon_lost(),
            }
        }
    }

    /// A refused message: kept for the report, and told to the program.
    fn refused(&mut self, to: Option<ReplyTo>, e: String) {
        if let Some(to) = to {
            let _ = self.socket.reply(
                &to,
                &serde_json::to_vec(&serde_json::json!({ "error": e })).unwrap_or_default(),
            );
        }
        if self.window_errors.len() < 20 {
            self.window_errors.push(e);
        }
    }

    /// Handles every line the daemon sent (the answer to `finish` is kept).
    fn read_daemon(&mut self) {
        while self.lost.is_none() {
            let v = match self.daemon.read() {
                Ok(Some(v)) => v,
                Ok(None) => {
                    self.daemon_lost();
                    break;
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => {
                    self.daemon_lost();
                    break;
                }
            };
            if let Some(p) = v
                .get("progress")
                .and_then(|p| p.as_array())
                .and_then(|a| a.first())
            {
                self.progress = serde_json::from_value(p.clone()).ok();
                continue;
            }
            let id = v.get("id").and_then(serde_json::Value::as_u64);
            if v.get("run").is_some() || (id.is_some() && id == self.finish_id) {
                self.run = Some(v);
                continue;
            }
            if let Some(record) = v.get("interval") {
                if let Some(j) = &mut self.jsonl {
                    j.write(record);
                }
                self.intervals.push(record.clone());
                continue;
            }
            let Some(at) = self.waiting.iter().position(|(i, _)| Some(*i) == id) else {
                continue;
            };
            let (_, to) = self.waiting.remove(at);
            if let Some(e) = v.get("error").and_then(serde_json::Value::as_str) {
                self.refused(to, e.to_string());
                continue;
            }
            if let Some(w) = v.get("window") {
                if let Some(j) = &mut self.jsonl {
                    j.write(&crate::sink::jsonl::Typed {
                        kind: "window",
                        record: w,
                    });
                }
                if let Some(to) = to {
                    let _ = self
                        .socket
                        .reply(&to, &serde_json::to_vec(w).unwrap_or_default());
                }
                if let Ok(w) = serde_json::from_value::<WindowReport>(w.clone()) {
                    self.windows.push(w);
                }
            }
        }
    }

    /// The daemon went away: what it had sent of the tree (its totals up
    /// to its last interval, no process rows), and what is missing.
    fn partial_report(&self, path: &Path) -> RunReport {
        let lost = self.lost.unwrap_or_else(|| self.started.elapsed());
        let ran = self.started.elapsed();
        let mut r = self.skeleton.clone();
        let (measured, intervals) = match &self.progress {
            Some(p) => {
                r.wall_ns = p.span_ns;
                r.groups.tree_ns = p.on_cpu_ns;
                r.machine.attributed_ns = p.on_cpu_ns;
                r.energy.groups.tree = p.energy;
                (p.span_ns as f64 / 1e9, p.intervals)
            }
            None => (0.0, 0),
        };
        if let Some(s) = &mut r.served {
            s.intervals = intervals;
            s.missing.push(format!(
                "the wattprof daemon at {} went away {:.1} s into the run (restarted?): the \
                 figures are its first {intervals} interval(s), {measured:.1} s of the \
                 command's {:.1} s; the rest, and the rows of each process, are missing",
                path.display(),
                lost.as_secs_f64(),
                ran.as_secs_f64()
            ));
        }
        r
    }

    fn daemon_lost(&mut self) {
        if self.lost.is_none() {
            self.lost = Some(self.started.elapsed());
        }
    }

    /// Asks for the tree's figures and waits for them (the next interval
    /// closes first): the `run` answer, or `None` if the daemon went away.
    fn finish(&mut self, me: u32) -> Option<serde_json::Value> {
        if self.lost.is_some() {
            return None;
        }
        let id = match self.daemon.send(&format!("finish pid={me}")) {
            Ok(id) => id,
            Err(_) => {
                self.daemon_lost();
                return None;
            }
        };
        self.finish_id = Some(id);
        // An interval is at most an hour; the windows' ends come first.
        let until = Instant::now() + Duration::from_secs(3700);
        while Instant::now() < until && self.lost.is_none() {
            self.wait(None);
            if let Some(run) = self
                .run
                .take_if(|v| v.get("id").and_then(serde_json::Value::as_u64) == Some(id))
            {
                return Some(run);
            }
        }
        None
    }

    /// The run document: the daemon's, with this side's windows; or, if
    /// the daemon went away, what it had sent, saying what is missing.
    fn report(&mut self, run: Option<serde_json::Value>, path: &Path) -> anyhow::Result<RunReport> {
        if let Some(e) = run
            .as_ref()
            .and_then(|v| v.get("error"))
            .and_then(serde_json::Value::as_str)
        {
            return Err(Fatal::profiler(format!(
                "the daemon at {} refused the command's figures: {e}",
                path.display()
            ))
            .into());
        }
        let mut report: RunReport = match run.as_ref().and_then(|v| v.get("run")) {
            Some(r) => serde_json::from_value(r.clone())
                .map_err(|e| Fatal::profiler(format!("a bad report from the daemon: {e}")))?,
            None => self.partial_report(path),
        };
        report.windows = std::mem::take(&mut self.windows);
        report.window_errors = std::mem::take(&mut self.window_errors);
        Ok(report)
    }
}
