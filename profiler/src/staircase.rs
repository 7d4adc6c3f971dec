//! The load staircase `calibrate` measures power along: idle, then 1 to
//! N CPUs busy (and a GPU command, with a wattmeter), each step settling
//! before it is read in windows. What each window reads and what is
//! fitted is the caller's (`cli::calibrate`); the load, its timing and
//! the readings the kernel and the counters give are here.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::sources::Domain;
use crate::sources::Source;
use crate::sources::registry::Readers;
use crate::sources::wattmeter::Wattmeter;

/// What a step runs.
#[derive(Clone, Debug)]
pub(crate) enum StepLoad {
    /// This many CPUs kept busy.
    Cpus(usize),
    /// A command (a GPU load), run alone.
    Command(String),
}

/// One step of the staircase.
#[derive(Clone, Debug)]
pub(crate) struct Step {
    /// As printed, and as each point names its step.
    pub(crate) name: String,
    /// What runs.
    pub(crate) load: StepLoad,
}

/// A step's settling time and window length: the first quarter of the
/// step (at most 2 s) settles and is not read; the rest is read in
/// windows of a quarter of it (at most 1 s).
pub(crate) fn timing(step: Duration) -> (Duration, Duration) {
    let settle = (step / 4).min(Duration::from_secs(2));
    let window = ((step - settle) / 4).min(Duration::from_secs(1));
    (settle, window)
}

/// Climbs the staircase: each step's load started, left to settle, then
/// `window(step, length)` called while a whole window fits in the step
/// (it measures one, and says whether it made a point); `done(step,
/// points)` after each step. A load that cannot start ends the climb.
pub(crate) fn climb(
    steps: &[Step],
    step: Duration,
    mut window: impl FnMut(&str, Duration) -> bool,
    mut done: impl FnMut(&str, usize),
) -> Result<(), String> {
    let (settle, length) = timing(step);
    for s in steps {
        let _load = match &s.load {
            StepLoad::Cpus(n) => Load::cpus(*n),
            StepLoad::Command(cmd) => Load::command(cmd)?,
        };
        let end = Instant::now() + step;
        std::thread::sleep(settle);
        let mut got = 0;
        while Instant::now() + length <= end {
            got += usize::from(window(&s.name, length));
        }
        done(&s.name, got);
    }
    Ok(())
}

/// Keeps `n` CPUs busy until dropped.
pub(crate) struct Load {
    stop: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<()>>,
    child: Option<std::process::Child>,
}

impl Load {
    /// `n` threads spinning.
    pub(crate) fn cpus(n: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let threads = (0..n)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let mut x = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005) + 1);
                    }
                })
            })
            .collect();
        Self {
            stop,
            threads,
            child: None,
        }
    }

    /// A command (split at white space), killed when dropped.
    pub(crate) fn command(cmd: &str) -> Result<Self, String> {
        let argv: Vec<&str> = cmd.split_whitespace().collect();
        let (program, rest) = argv
            .split_first()
            .ok_or_else(|| "--gpu-load: empty command".to_string())?;
        let child = std::process::Command::new(program)
            .args(rest)
            .stdout(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("--gpu-load {cmd}: cannot start: {e}"))?;
        Ok(Self {
            stop: Arc::new(AtomicBool::new(false)),
            threads: Vec::new(),
            child: Some(child),
        })
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        if let Some(c) = &mut self.child {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// `/proc/stat`'s busy and total jiffies over all CPUs.
fn cpu_jiffies() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    // idle + iowait are not busy.
    let idle = v.get(3).copied().unwrap_or(0) + v.get(4).copied().unwrap_or(0);
    Some((total - idle, total))
}

/// All CPUs' idle time so far (s): `/proc/stat`'s idle + iowait, which the
/// kernel counts exactly (no-tick idle time), in clock ticks of 1/CLK_TCK.
/// Busy CPUs over a window are then the CPUs less the idle time over the
/// window's wall time: more exact than the ratio of tick-sampled busy to
/// total ticks.
pub(crate) fn idle_s() -> Option<f64> {
    let text = std::fs::read_to_string("/proc/stat").ok()?;
    let line = text.lines().find(|l| l.starts_with("cpu "))?;
    let v: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((v.get(3)? + v.get(4).copied().unwrap_or(0)) as f64 / hz)
}

/// Reads the counters, timed by the middle of the read: a read that is
/// preempted on a loaded machine then skews nothing.
pub(crate) fn timed_read(
    readers: &mut Readers,
) -> (crate::sources::registry::IntervalEnergy, Instant) {
    let before = Instant::now();
    let e = readers.read_counters(false);
    (e, before + before.elapsed() / 2)
}

/// One window's reading: counters' energy (µJ) over the seconds that
/// really passed between their two reads (a loaded machine oversleeps),
/// the wall's mean power over the span of the frames integrated in the
/// window (exact whatever the frames' arrival), busy CPUs, and problems.
pub(crate) struct Window {
    /// Package and DRAM energy, and the GPUs' (µJ).
    pub(crate) counters_uj: u64,
    /// Seconds between the counters' two reads.
    pub(crate) counter_s: f64,
    /// The wall's mean power (W), when frames spanned the window.
    pub(crate) wall_w: Option<f64>,
    /// Busy CPUs (by `/proc/stat`'s ticks).
    pub(crate) busy: f64,
    /// What went wrong reading.
    pub(crate) problems: Vec<String>,
}

/// One window against a wattmeter: the counters and the wall over
/// `window`, and the busy CPUs of `cpus`.
pub(crate) fn measure(
    readers: &mut Readers,
    meter: &mut Wattmeter,
    window: Duration,
    cpus: f64,
) -> Window {
    // Each counter read is timed by the middle of the read: a read that
    // is preempted on a loaded machine then skews nothing.
    let j0 = cpu_jiffies();
    let _ = meter.read();
    let f0 = meter.last_frame_s();
    let (_, t0) = timed_read(readers);
    let _ = readers.take_problems();
    std::thread::sleep(window);
    let (e, t1) = timed_read(readers);
    let counter_s = t1.duration_since(t0).as_secs_f64();
    let mut problems = readers.take_problems();
    let read = meter.read();
    if let Err(err) = &read {
        problems.push(format!("wattmeter: {err}"));
    }
    let wall_uj = read.map_or(0, |d| d.iter().map(|x| x.energy_uj).sum::<u64>());
    let f1 = meter.last_frame_s();
    let j1 = cpu_jiffies();
    let counters_uj: u64 = e
        .energy
        .iter()
        .filter(|d| matches!(d.domain, Domain::Package | Domain::Dram))
        .map(|d| d.energy_uj)
        .sum::<u64>()
        + e.gpus.iter().map(|g| g.energy_uj).sum::<u64>();
    let wall_w = match (f0, f1) {
        (Some(a), Some(b)) if b > a && wall_uj > 0 => Some(wall_uj as f64 / 1e6 / (b - a)),
        _ => None,
    };
    let busy = match (j0, j1) {
        (Some((b0, t0)), Some((b1, t1))) if t1 > t0 => (b1 - b0) as f64 / (t1 - t0) as f64 * cpus,
        _ => 0.0,
    };
    Window {
        counters_uj,
        counter_s,
        wall_w,
        busy,
        problems,
    }
}
