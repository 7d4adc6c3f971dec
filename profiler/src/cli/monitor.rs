//! `wattprof monitor`: the whole machine, per process and per cgroup,
//! until Ctrl-C.

use std::io::IsTerminal;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Context;

use super::Fatal;
use super::energy::EnergyArgs;
use super::setup::{
    deliver, open_outputs, outputs_complete, parse_duration, parse_interval, start_profile,
    tracker_facts,
};
use crate::profile::sampling::{Hooks, Ticker, sample_until};
use crate::profile::{Ending, Profile, Scope};
use crate::sink::jobs::JobFiles;
use crate::sink::recording::Keep;
use crate::sink::snapshot::{Exporter, Published};
use crate::sink::top::{Shared, TopSink};
use crate::sink::vm_export::VmExportSink;
use crate::tracker::{EbpfTracker, monotonic_ns};

/// Rows per interval when `top` shows them: every process that ran, up
/// to this many.
const TOP_ROWS: usize = 10_000;

/// Arguments of `wattprof monitor`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  sudo wattprof monitor\n  \
        sudo wattprof monitor --interval 5s --jsonl /var/log/wattprof.jsonl\n  \
        sudo wattprof monitor --pid 4242 --duration 10m --output night.json\n\n\
        Nothing is printed until the end (`wattprof top` is the live screen). Ctrl-C, \
        SIGTERM or SIGHUP end it and write the summary.")]
pub(crate) struct MonitorArgs {
    /// How often energy is read and attributed (e.g. 1s, 100ms).
    #[arg(long, default_value = "1s", value_parser = parse_interval)]
    pub(crate) interval: Duration,

    /// Only report these processes and their descendants (repeat, or
    /// separate with commas). Energy is still divided over every process.
    #[arg(long, value_name = "PID", value_delimiter = ',')]
    pub(crate) pid: Vec<u32>,

    /// Processes reported one by one per interval, those with the most
    /// energy: in the summary and the --jsonl stream, and the ones whose
    /// memory (PSS) is read. `wattprof top` shows and streams every
    /// process that ran; there, this is only how many have their memory
    /// read.
    #[arg(long, default_value_t = 15, value_parser = clap::value_parser!(u32).range(1..=10_000))]
    pub(crate) top: u32,

    /// Stop after this long (e.g. 30s, 2h) instead of at Ctrl-C.
    #[arg(long, value_parser = parse_duration)]
    pub(crate) duration: Option<Duration>,

    /// Write the recording as JSON to FILE at the end (docs/recording.md;
    /// per-interval series hold machine-level figures only: per-process
    /// series are in the --jsonl stream).
    #[arg(long, short, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,

    /// Serve Prometheus metrics at http://ADDR/metrics (ADDR: HOST:PORT,
    /// or a bare port for 127.0.0.1:PORT; without a value 127.0.0.1:9101:
    /// loopback unless an address is given).
    #[arg(long, value_name = "ADDR", num_args = 0..=1, default_missing_value = "127.0.0.1:9101", value_parser = crate::exporter::parse_addr)]
    pub(crate) prometheus: Option<std::net::SocketAddr>,

    /// TLS and basic auth for --prometheus, from a Prometheus
    /// exporter-toolkit web config (the file node_exporter reads):
    /// tls_server_config (cert_file, key_file, client_ca_file,
    /// client_auth_type, min_version) and basic_auth_users (bcrypt
    /// hashes). Relative paths are from the file's folder. Needs
    /// --prometheus.
    #[arg(long, value_name = "FILE")]
    pub(crate) web_config: Option<PathBuf>,

    /// Processes exported one by one (by power over the last interval);
    /// the rest are one `pid="other"` series.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(0..=1000))]
    pub(crate) prometheus_top: u32,

    /// Keep exporting a container's or cgroup's series this long after its
    /// processes last ran, then drop them.
    #[arg(long, default_value = "5m", value_parser = parse_duration)]
    pub(crate) prometheus_grace: Duration,

    /// Write each VM's attributed energy as a powercap tree under
    /// DIR/VM/ (RAPL's layout, energy_uj updated every interval), to be
    /// shared into the guest (virtiofs, 9p) and read there with `wattprof
    /// run --powercap-root` or any RAPL reader. VMs: libvirt/machined
    /// scopes under machine.slice, and qemu-system-*, firecracker and
    /// cloud-hypervisor processes with their children.
    #[arg(long, value_name = "DIR")]
    pub(crate) vm_export: Option<PathBuf>,

    /// Write a file per batch job (Slurm) once it has ended on this node:
    /// DIR/SCHEDULER-JOBID.json (slurm-42.json) with its energy per domain, static
    /// and dynamic, and per step, written whole (a temporary name, then a
    /// rename), the job's energy record for a site to keep (docs/slurm.md).
    #[arg(long, value_name = "DIR")]
    pub(crate) jobs_dir: Option<PathBuf>,

    /// Serve users on a Unix socket (default /run/wattprof/wattprof.sock):
    /// any user's `wattprof run` without root, and any program's windows
    /// (the Python client), are measured by this session. Clients are
    /// known by the kernel's peer credentials; a user may measure only
    /// their own processes, over whole intervals of at least 1 s, with no
    /// machine figures, at most 20 requests a second (docs/shared.md).
    #[arg(long, value_name = "PATH", num_args = 0..=1, default_missing_value = crate::serve::DEFAULT_PATH)]
    pub(crate) serve: Option<PathBuf>,

    /// Only root and this group's members may connect to --serve (the
    /// socket is made 0660 root:GROUP; otherwise 0666).
    #[arg(long, value_name = "GROUP", requires = "serve")]
    pub(crate) serve_group: Option<String>,

    /// Members of this group may measure any user's processes through
    /// --serve, and get the machine's figures with their windows.
    #[arg(long, value_name = "GROUP", requires = "serve")]
    pub(crate) serve_admin_group: Option<String>,

    #[command(flatten)]
    pub(crate) tracker: super::TrackerArgs,

    #[command(flatten)]
    pub(crate) energy: EnergyArgs,

    #[command(flatten)]
    pub(crate) stacks: super::stacks::StackArgs,
}

/// Runs `wattprof monitor`.
pub(crate) fn execute(args: MonitorArgs) -> anyhow::Result<i32> {
    if std::io::stderr().is_terminal() {
        eprintln!(
            "wattprof: monitoring the machine; Ctrl-C ends it and prints the summary \
             (`wattprof top` shows it live)"
        );
    }
    session(args, None)
}

/// The monitor session: `monitor`'s, or `top`'s with its `screen`.
pub(crate) fn session(args: MonitorArgs, screen: Option<Shared>) -> anyhow::Result<i32> {
    if screen.is_some() && args.serve.is_some() {
        // top's keys change the interval, which --serve fixes.
        return Err(Fatal::usage("--serve is monitor's: run `wattprof monitor --serve`").into());
    }
    check_pids(&args.pid)?;
    let (carbon, streams) = open_outputs(args.output.as_deref(), Keep::MachineOnly, &args.energy)?;
    let stack_outputs = args.stacks.open(args.output.as_deref())?;
    let vm_export = args
        .vm_export
        .as_deref()
        .map(crate::sink::vm_export::VmExport::create)
        .transpose()
        .map_err(Fatal::profiler)?;
    let job_files = args
        .jobs_dir
        .as_deref()
        .map(|dir| JobFiles::new(dir, std::path::Path::new("/sys/fs/cgroup")))
        .transpose()
        .map_err(Fatal::usage)?;
    let web_config = web_config(&args)?;
    let serve = serve_config(&args)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
        // A second signal while the summary is being written (a hung GPU
        // driver, a stalled disk) ends wattprof at once, giving `top`'s
        // terminal back first.
        let again = stop.clone();
        // SAFETY: the action loads an atomic and makes async-signal-safe
        // calls only (`restore_in_signal`, `_exit`).
        unsafe {
            signal_hook::low_level::register(sig, move || {
                if again.load(Ordering::SeqCst) {
                    crate::sink::top::restore_in_signal();
                    signal_hook::low_level::exit(130);
                }
            })
        }
        .context("cannot install signal handlers")?;
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }
    // `top` held them back while it took the terminal.
    crate::sink::top::unblock_ending_signals();
    let cfg = args.tracker.config();
    let (mut tracker, mut profile, start_unix_ns) = start_profile(
        &cfg,
        &args.energy,
        carbon,
        Scope::Machine {
            // The exporter's top processes come from the interval's rows;
            // `top` shows every process that ran.
            top: if screen.is_some() {
                TOP_ROWS
            } else {
                args.top.max(args.prometheus_top) as usize
            },
            pids: args.pid.clone(),
            memory_top: args.top as usize,
        },
        streams,
    )?;
    let start_ns = tracker.start_ns();
    // monitor's outputs beyond the streams it shares with run, each a
    // sink: the flame graph, each VM's counters, the exporter's snapshot,
    // `top`'s screen.
    if let Some(s) = stack_outputs {
        s.start(&mut profile)?;
        profile.add_sink(Box::new(s.sink()));
    }
    if let Some(ex) = vm_export {
        profile.add_sink(Box::new(VmExportSink::new(ex)));
    }
    if let Some(files) = job_files {
        profile.add_sink(Box::new(files));
    }
    // Serves until monitor ends.
    let _exporter = serve_prometheus(&args, web_config, &mut profile)?;
    let server = serve_users(serve, &args, &tracker, &mut profile)?;
    if let Some(screen) = &screen {
        profile.add_sink(Box::new(TopSink(screen.clone())));
    }
    profile.write_header("monitor", tracker.kind(), None, start_unix_ns);
    let interval_ns = args.interval.as_nanos() as u64;
    let mut hooks = MonitorLoop {
        stop: &stop,
        end_ns: args.duration.map(|d| start_ns + d.as_nanos() as u64),
        learned_saved_ns: start_ns,
        learned_save_failed: false,
        screen: screen.clone(),
        server,
    };
    let mut ticker = Ticker::new(start_ns, interval_ns);
    if hooks.server.is_some() {
        ticker = ticker.full_periods();
    }
    sample_until(&mut profile, &mut tracker, &mut ticker, &mut hooks)?;
    if let Some(screen) = &screen {
        // The summary goes to the normal screen.
        screen.borrow_mut().restore();
    }
    profile.tick(&mut tracker, true)?;
    let mut learned = profile.learned_to_save();
    let finished = profile.finish(Ending {
        mode: "monitor",
        command: None,
        start_unix_ns,
        profiler: tracker_facts(&tracker, args.tracker.max_tasks, interval_ns),
    });
    deliver(&finished, args.energy.rows())?;
    // After the recording: a slow state directory delays nothing kept.
    hooks.say_saved(learned.save_learned());
    outputs_complete(&finished.report)?;
    Ok(0)
}

/// A --pid that names no process would report nothing, silently: refused.
fn check_pids(pids: &[u32]) -> anyhow::Result<()> {
    if let Some(pid) = pids
        .iter()
        .find(|p| !std::path::Path::new(&format!("/proc/{p}")).exists())
    {
        return Err(Fatal::usage(format!(
            "--pid {pid}: no such process (give the pid of a running process; `wattprof run -- \
             CMD` follows a command from its start)"
        ))
        .into());
    }
    Ok(())
}

/// The users' socket (`--serve`), bound, with the tracker's facts for
/// the reports of the trees it follows.
fn serve_users(
    cfg: Option<crate::serve::ServeConfig>,
    args: &MonitorArgs,
    tracker: &EbpfTracker,
    profile: &mut Profile,
) -> anyhow::Result<Option<crate::serve::Server>> {
    let Some(cfg) = cfg else { return Ok(None) };
    let s =
        crate::serve::Server::bind(cfg).map_err(|e| Fatal::profiler(format!("--serve: {e}")))?;
    profile.serve_profiler_facts(tracker_facts(
        tracker,
        args.tracker.max_tasks,
        args.interval.as_nanos() as u64,
    ));
    eprintln!("wattprof: serving users at {}", s.path().display());
    Ok(Some(s))
}

/// `--serve`'s settings, the groups looked up now (a bad name fails
/// before anything starts).
fn serve_config(args: &MonitorArgs) -> anyhow::Result<Option<crate::serve::ServeConfig>> {
    let Some(path) = &args.serve else {
        return Ok(None);
    };
    // Every boundary a client's figures can have is one of the session's
    // ticks: a second apart at least, or two overlapping windows would
    // give a user the energy of a shorter span (the RAPL side channel).
    if args.interval < Duration::from_secs(1) {
        return Err(Fatal::usage(format!(
            "--serve needs --interval 1s or more (not {}): users' figures are over whole \
             intervals, and shorter ones would reopen the RAPL side channel (docs/shared.md)",
            humantime::format_duration(args.interval)
        ))
        .into());
    }
    let gid = |opt: &str, name: &Option<String>| {
        name.as_deref()
            .map(crate::serve::group_id)
            .transpose()
            .map_err(|e| Fatal::usage(format!("{opt}: {e}")))
    };
    Ok(Some(crate::serve::ServeConfig {
        path: path.clone(),
        group: gid("--serve-group", &args.serve_group)?,
        admin_group: gid("--serve-admin-group", &args.serve_admin_group)?,
        proc: PathBuf::from("/proc"),
    }))
}

/// `--web-config`, read now (a bad file fails before anything starts);
/// it needs `--prometheus`.
fn web_config(args: &MonitorArgs) -> anyhow::Result<Option<crate::exporter::WebConfig>> {
    Ok(match &args.web_config {
        Some(path) if args.prometheus.is_some() => {
            Some(crate::exporter::WebConfig::load(path).map_err(|e| Fatal::usage(e.to_string()))?)
        }
        Some(_) => {
            return Err(Fatal::usage(
                "--web-config sets up the exporter's TLS and users: give --prometheus too",
            )
            .into());
        }
        None => None,
    })
}

/// The exporter at `--prometheus` (serving until it is dropped), with its
/// snapshot as a sink.
fn serve_prometheus(
    args: &MonitorArgs,
    web_config: Option<crate::exporter::WebConfig>,
    profile: &mut Profile,
) -> anyhow::Result<Option<crate::exporter::Exporter>> {
    Ok(match args.prometheus {
        Some(addr) => {
            let published: Published = Arc::new(std::sync::Mutex::new(Arc::default()));
            let ex = crate::exporter::serve(addr, published.clone(), web_config).map_err(|e| {
                Fatal::profiler(format!(
                    "cannot serve --prometheus {addr}: {e} (is another exporter on that port? \
                         choose another with --prometheus HOST:PORT)"
                ))
            })?;
            eprintln!("wattprof: Prometheus metrics at {}", ex.url());
            profile.add_sink(Box::new(Exporter::new(
                published,
                args.prometheus_top as usize,
                args.prometheus_grace.as_nanos() as u64,
            )));
            Some(ex)
        }
        None => None,
    })
}

/// The `monitor` loop's part: what it learns kept every ten minutes, and
/// the end (a signal, or `--duration`).
struct MonitorLoop<'a> {
    stop: &'a AtomicBool,
    end_ns: Option<u64>,
    /// `top`'s screen: its keys end the loop or change the interval.
    screen: Option<Shared>,
    /// The users' socket (`--serve`).
    server: Option<crate::serve::Server>,
    /// When what was learned of the static power was last written to the
    /// host power model (monotonic ns), and whether that write failed.
    learned_saved_ns: u64,
    learned_save_failed: bool,
}

/// How often `monitor` writes what it learned into the host power model.
const SAVE_LEARNED_EVERY_NS: u64 = 600_000_000_000;

impl MonitorLoop<'_> {
    /// Writes what was learned of the static power into the host power
    /// model (warned about once on stderr if it fails; monitoring goes on).
    fn save_learned(&mut self, profile: &mut Profile) {
        self.say_saved(profile.save_learned());
    }

    /// Prints how writing the host power model went (a failure once).
    fn say_saved(&mut self, saved: Result<Option<std::path::PathBuf>, String>) {
        match saved {
            Ok(Some(path)) if self.learned_save_failed => {
                eprintln!(
                    "wattprof: the host power model {} written again",
                    path.display()
                );
                self.learned_save_failed = false;
            }
            Ok(_) => {}
            Err(e) if !self.learned_save_failed => {
                eprintln!(
                    "wattprof: warning: what was learned of the static power was not kept: {e} \
                     (give --host-model FILE somewhere writable, or none)"
                );
                self.learned_save_failed = true;
            }
            Err(_) => {}
        }
    }
}

impl Hooks<EbpfTracker> for MonitorLoop<'_> {
    fn fds(&self) -> Vec<std::os::fd::RawFd> {
        // `top` wakes on a key; the server on a client.
        let mut fds = self
            .screen
            .as_ref()
            .map_or_else(Vec::new, |_| vec![libc::STDIN_FILENO]);
        if let Some(s) = &self.server {
            fds.extend(s.fds());
        }
        fds
    }

    fn interval_ns(&self) -> Option<u64> {
        self.screen
            .as_ref()
            .map(|s| s.borrow().interval_ms() * 1_000_000)
    }

    fn max_sleep_ms(&self, now_ns: u64) -> i32 {
        let to_end = self
            .end_ns
            .map_or(u64::MAX, |e| e.saturating_sub(now_ns) / 1_000_000);
        to_end.min(200) as i32
    }

    fn after_interval(&mut self, profile: &mut Profile, now: u64) -> anyhow::Result<()> {
        if let Some(s) = &mut self.server {
            s.after_interval(profile);
        }
        if now.saturating_sub(self.learned_saved_ns) >= SAVE_LEARNED_EVERY_NS {
            self.learned_saved_ns = now;
            self.save_learned(profile);
        }
        Ok(())
    }

    fn done(&mut self, now_ns: u64) -> bool {
        // Checked before a tick: at the end of `--duration` the final
        // interval closes at the deadline, not a millisecond after it.
        self.stop.load(Ordering::Relaxed) || self.end_ns.is_some_and(|e| now_ns >= e)
    }

    fn woke(
        &mut self,
        ready: &[bool],
        profile: &mut Profile,
        _: &mut EbpfTracker,
    ) -> anyhow::Result<bool> {
        let screen_fds = usize::from(self.screen.is_some());
        if let Some(s) = &mut self.server {
            s.woke(
                ready.get(screen_fds..).unwrap_or(&[]),
                profile,
                monotonic_ns(),
            );
        }
        // Every wake-up: a resize interrupts the sleep without input.
        if let Some(screen) = &self.screen
            && screen
                .borrow_mut()
                .input(ready.first().copied().unwrap_or(false))
        {
            return Ok(true);
        }
        Ok(self.done(monotonic_ns()))
    }
}
