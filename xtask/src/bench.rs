//! `cargo xtask bench overhead`: what the tracker costs, measured side by
//! side in one run (baseline and tracked runs alternate; medians compared).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};

use crate::{run_cmd, workspace_root};

/// Which benchmark.
#[derive(clap::Subcommand)]
pub enum Which {
    /// Slowdown of context-switch-heavy workloads with no tracker, the
    /// switch tracker and the iterator tracker, in paired rounds (the three
    /// in rotating order each round), and wattprof's own CPU time with
    /// many live threads for each tracker.
    Overhead {
        /// Paired rounds per workload (each round runs all three); 0 skips
        /// them (wattprof's own CPU only).
        #[arg(long, default_value_t = 120)]
        rounds: usize,
        /// Round trips of the ping-pong workloads.
        #[arg(long, default_value_t = 50_000)]
        round_trips: u64,
        /// Seconds each thread-count measurement lasts.
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Another wattprof binary (an earlier build): its switch tracker
        /// joins the paired rounds, so a change to the per-switch program
        /// is measured side by side with the build before it.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// wattprof monitor's own CPU time at 1 s and 100 ms intervals, with
    /// 1,000 processes alive that each run briefly every 50 ms, side by
    /// side with the same monitor on the machine without them.
    Monitor {
        /// Seconds each measurement lasts (after a 2 s settle).
        #[arg(long, default_value_t = 10)]
        seconds: u64,
        /// Processes alive during the loaded measurement.
        #[arg(long, default_value_t = 1000)]
        processes: usize,
        /// Another wattprof binary (an earlier build): in each of four
        /// states (a quiet host, 10,000 idle threads, PROCESSES wakers at
        /// 1 s and at 100 ms) this build and that one take turns, ROUNDS
        /// times each, and the median of the paired ratios (this build's
        /// CPU over that one's) is printed with its range, as a table.
        #[arg(long)]
        baseline: Option<PathBuf>,
        /// Paired rounds with --baseline.
        #[arg(long, default_value_t = 6)]
        rounds: usize,
        /// With --baseline, only these states (comma-separated: quiet,
        /// idle-threads, wakers-1s, wakers-100ms); all four by default.
        #[arg(long, value_delimiter = ',')]
        states: Vec<String>,
    },
    /// `wattprof top`'s own CPU time against `monitor` with no screen, at
    /// 1 s with PROCESSES processes that each run briefly every 50 ms: the
    /// two run side by side, over the same seconds, ROUNDS times (top in
    /// a 160x50 tmux terminal), and the medians of the paired differences
    /// (in % of one core) and of the paired ratios are printed with their
    /// ranges.
    Top {
        /// Paired rounds.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seconds each measurement lasts (after a 2 s settle).
        #[arg(long, default_value_t = 8)]
        seconds: u64,
        /// Processes waking every 50 ms.
        #[arg(long, default_value_t = 1000)]
        processes: usize,
    },
    /// The daemon's (`monitor --serve`) own CPU with TREES followed trees
    /// against the same daemon with none: two daemons at 1 s run side by
    /// side over the same seconds, ROUNDS times, one with TREES client
    /// connections each following a tree (a process waking every 50 ms),
    /// both with PROCESSES wakers on the machine; the median of the paired
    /// ratios is printed with its range.
    Serve {
        /// Paired rounds.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Seconds each measurement lasts (after a 3 s settle).
        #[arg(long, default_value_t = 8)]
        seconds: u64,
        /// Trees followed.
        #[arg(long, default_value_t = 50)]
        trees: usize,
        /// Processes waking every 50 ms beside them.
        #[arg(long, default_value_t = 1000)]
        processes: usize,
    },
    /// The open-coded task iterator (the `bpf_iter_task_*` kfuncs, run
    /// from one call of an `iter/bpf_map` program) against `iter/task`,
    /// for the same per-thread work: nanoseconds per thread per read with
    /// THREADS idle threads, in paired rounds (bench/open-coded-iter).
    OpenCodedIter {
        /// Idle threads.
        #[arg(long, default_value_t = 10_000)]
        threads: usize,
        /// Paired rounds (each reads both, the order alternating).
        #[arg(long, default_value_t = 30)]
        rounds: usize,
    },
    /// Heap allocations per interval of `wattprof monitor` in steady
    /// state while PROCESSES processes wake every 50 ms, counted by the
    /// `alloc-count` preload (so a baseline build is counted the same
    /// way): runs of SHORT and LONG seconds, the difference over the
    /// difference in intervals.
    Allocs {
        /// Processes waking every 50 ms.
        #[arg(long, default_value_t = 1000)]
        processes: usize,
        /// The monitor's interval.
        #[arg(long, default_value = "100ms")]
        interval: String,
        /// Seconds of the short run.
        #[arg(long, default_value_t = 4)]
        short: u64,
        /// Seconds of the long run.
        #[arg(long, default_value_t = 14)]
        long: u64,
        /// Rounds (each runs both lengths of each build).
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        /// Another wattprof binary (an earlier build), counted alike.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// The exporter's CPU per /metrics scrape with PROCESSES processes
    /// running: plain HTTP, HTTPS with basic auth and a new connection per
    /// scrape, and HTTPS over one keep-alive connection (as Prometheus),
    /// in rotating order; medians and ranges.
    Scrape {
        /// Rounds of the three clients.
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// Processes alive while scraping.
        #[arg(long, default_value_t = 1000)]
        processes: usize,
        /// Another wattprof binary (an earlier build) measured the same
        /// way, plain HTTP only, alternating with this one.
        #[arg(long)]
        baseline: Option<PathBuf>,
    },
    /// Whether a program's energy depends on its neighbour: on a RAPL
    /// fixture whose power follows the load, a burner's package energy
    /// per CPU-second alone and beside a second burner, under the CPU-time
    /// rule (before static power) and the capacity rule, alternating, in
    /// one run; medians and ranges. Needs root.
    Isolation {
        /// Rounds (each runs both rules, alone and beside another).
        #[arg(long, default_value_t = 10)]
        rounds: usize,
        /// CPU seconds each burner runs.
        #[arg(long, default_value_t = 2.0)]
        seconds: f64,
        /// The fixture's static power (W).
        #[arg(long, default_value_t = 20.0)]
        static_w: f64,
        /// The fixture's watts per busy CPU.
        #[arg(long, default_value_t = 15.0)]
        per_cpu_w: f64,
    },
    /// Energy flame graphs' cost: a CPU-bound workload on every CPU alone,
    /// under `wattprof run`, and under `wattprof run --stacks` at HZ, in
    /// paired rounds (rotating order); the slowdown --stacks adds, and
    /// wattprof's own CPU time with and without it.
    Stacks {
        /// Paired rounds (each round runs all three).
        #[arg(long, default_value_t = 40)]
        rounds: usize,
        /// Stack samples per second per CPU.
        #[arg(long, default_value_t = 99)]
        hz: u32,
        /// Work per thread (millions of loop iterations; about 1 s at 300).
        #[arg(long, default_value_t = 300)]
        work: u64,
    },
    /// A day of churn in minutes: `monitor --prometheus --jsonl` and a
    /// `run` with windows while ~200 processes a second start and exit,
    /// thread pools grow and shrink, cgroups come and go and /metrics is
    /// scraped 10 times a second; samples wattprof's RSS, fds, threads
    /// and CPU every 10 s, checks every interval of both streams (none
    /// missing, every joule accounted for), and writes target/soak/
    /// (series.csv, soak.svg, summary.txt).
    Soak {
        /// Minutes of churn.
        #[arg(long, default_value_t = 30.0)]
        minutes: f64,
        /// Minutes of warm-up left out of the growth figures.
        #[arg(long, default_value_t = 5.0)]
        warmup: f64,
    },
    /// (helper) CPU-bound work on every CPU; prints its seconds.
    #[command(hide = true)]
    Spin {
        /// Millions of loop iterations per thread.
        work: u64,
    },
    /// (helper) N processes that each wake every 50 ms and spin ~20 us.
    #[command(hide = true)]
    BusyProcs {
        /// Processes.
        n: usize,
        /// Seconds they live.
        seconds: u64,
    },
    /// (helper) N threads of one process that each wake every 50 ms and
    /// spin ~20 us.
    #[command(hide = true)]
    BusyThreads {
        /// Threads.
        n: usize,
        /// Seconds they live.
        seconds: u64,
    },
    /// (helper) Two processes passing a byte back and forth over pipes.
    #[command(hide = true)]
    Pingpong {
        /// Round trips.
        round_trips: u64,
    },
    /// (helper) N threads that start, then sleep.
    #[command(hide = true)]
    IdleThreads {
        /// Threads.
        n: usize,
        /// Seconds to sleep.
        seconds: u64,
    },
}

pub fn run(which: Which) -> Result<()> {
    match which {
        Which::Overhead {
            rounds,
            round_trips,
            seconds,
            baseline,
        } => overhead(rounds, round_trips, seconds, baseline.as_deref()),
        Which::Monitor {
            seconds,
            processes,
            baseline,
            rounds,
            states,
        } => match baseline {
            Some(old) => monitor_against(&old, seconds, processes, rounds, &states),
            None => monitor(seconds, processes),
        },
        Which::Scrape {
            rounds,
            processes,
            baseline,
        } => scrapes(rounds, processes, baseline.as_deref()),
        Which::Allocs {
            processes,
            interval,
            short,
            long,
            rounds,
            baseline,
        } => allocs(
            processes,
            &interval,
            short,
            long,
            rounds,
            baseline.as_deref(),
        ),
        Which::Stacks { rounds, hz, work } => stacks(rounds, hz, work),
        Which::OpenCodedIter { threads, rounds } => crate::open_coded::run(threads, rounds),
        Which::Top {
            rounds,
            seconds,
            processes,
        } => top(rounds, seconds, processes),
        Which::Serve {
            rounds,
            seconds,
            trees,
            processes,
        } => serve(rounds, seconds, trees, processes),
        Which::Isolation {
            rounds,
            seconds,
            static_w,
            per_cpu_w,
        } => {
            let wattprof = wattprof_release()?;
            build_release(&["-p", "wattprof-tests", "--bin", "wattprof-testload"])?;
            crate::isolation::isolation(
                &wattprof,
                &workspace_root().join("target/release/wattprof-testload"),
                rounds,
                seconds,
                static_w,
                per_cpu_w,
            )
        }
        Which::Soak { minutes, warmup } => {
            let wattprof = wattprof_release()?;
            build_release(&["-p", "wattprof-tests", "--bin", "wattprof-testload"])?;
            crate::soak::soak(
                &wattprof,
                &workspace_root().join("target/release/wattprof-testload"),
                minutes,
                warmup,
            )
        }
        Which::Spin { work } => {
            spin(work);
            Ok(())
        }
        Which::BusyProcs { n, seconds } => busy_procs(n, seconds),
        Which::BusyThreads { n, seconds } => busy_threads(n, seconds),
        Which::Pingpong { round_trips } => {
            let secs = pingpong(round_trips)?;
            println!("{secs}");
            Ok(())
        }
        Which::IdleThreads { n, seconds } => idle_threads(n, seconds),
    }
}

/// (helper) `work` million spins on every CPU: the seconds it took.
fn spin(work: u64) {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let start = Instant::now();
    let handles: Vec<_> = (0..threads)
        .map(|t| std::thread::spawn(move || spin_outer(work * 1_000_000, t as u64)))
        .collect();
    let mut sum = 0u64;
    for h in handles {
        sum = sum.wrapping_add(h.join().unwrap_or(0));
    }
    println!("{}", start.elapsed().as_secs_f64());
    eprintln!("checksum {sum}");
}

/// (helper) `n` threads that wake every 50 ms and spin 20 µs, for
/// `seconds`.
fn busy_threads(n: usize, seconds: u64) -> Result<()> {
    let end = Instant::now() + std::time::Duration::from_secs(seconds);
    let handles: Vec<_> = (0..n)
        .map(|_| {
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || {
                    while Instant::now() < end {
                        std::thread::sleep(std::time::Duration::from_millis(50));
                        let t = Instant::now();
                        while t.elapsed() < std::time::Duration::from_micros(20) {
                            std::hint::spin_loop();
                        }
                    }
                })
        })
        .collect::<std::io::Result<_>>()?;
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

/// (helper) `n` threads that start, then sleep `seconds`.
fn idle_threads(n: usize, seconds: u64) -> Result<()> {
    let handles: Vec<_> = (0..n)
        .map(|_| {
            std::thread::Builder::new()
                .stack_size(64 * 1024)
                .spawn(move || std::thread::sleep(std::time::Duration::from_secs(seconds)))
        })
        .collect::<std::io::Result<_>>()?;
    for h in handles {
        let _ = h.join();
    }
    Ok(())
}

/// Round trips of one byte between two processes pinned to CPU 0 (every
/// round trip is two local context switches: the cheapest switch, so the
/// tracker's share of it is largest, and no cross-CPU wake-up noise);
/// returns seconds.
fn pingpong(round_trips: u64) -> Result<f64> {
    // SAFETY: a zeroed cpu_set_t with CPU 0 set, for this process.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        if libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) != 0 {
            bail!("sched_setaffinity: {}", std::io::Error::last_os_error());
        }
    }
    let mut a = [0i32; 2];
    let mut b = [0i32; 2];
    // SAFETY: pipe() fills two fds into each array.
    if unsafe { libc::pipe(a.as_mut_ptr()) } != 0 || unsafe { libc::pipe(b.as_mut_ptr()) } != 0 {
        bail!("pipe: {}", std::io::Error::last_os_error());
    }
    let mut byte = [0u8; 1];
    // SAFETY: single-threaded here; the child only reads and writes pipes.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        bail!("fork: {}", std::io::Error::last_os_error());
    }
    if pid == 0 {
        for _ in 0..round_trips {
            // SAFETY: valid fds and a one-byte buffer.
            unsafe {
                libc::read(a[0], byte.as_mut_ptr().cast(), 1);
                libc::write(b[1], byte.as_ptr().cast(), 1);
            }
        }
        // SAFETY: leaving the forked child without running destructors.
        unsafe { libc::_exit(0) };
    }
    let start = Instant::now();
    for _ in 0..round_trips {
        // SAFETY: valid fds and a one-byte buffer.
        unsafe {
            libc::write(a[1], byte.as_ptr().cast(), 1);
            libc::read(b[0], byte.as_mut_ptr().cast(), 1);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    // SAFETY: reaping our child.
    unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    Ok(secs)
}

/// `cargo build --release --locked` with these arguments, in the workspace.
fn build_release(args: &[&str]) -> Result<()> {
    run_cmd(
        Command::new("cargo")
            .current_dir(workspace_root())
            .args(["build", "--release", "--locked"])
            .args(args),
    )
}

pub fn wattprof_release() -> Result<PathBuf> {
    build_release(&["-p", "profiler", "-p", "xtask"])?;
    Ok(workspace_root().join("target/release/wattprof"))
}

/// How a paired round runs its workload: alone (`None`), or under
/// `WATTPROF run OPTIONS`.
type Variant<'a> = Option<(&'a Path, &'a [&'a str])>;

/// Runs `cmd`, alone or under `wattprof run --tracker T`, and returns the
/// number the workload itself printed (its own timing, so wattprof's
/// start-up is not in it).
fn timed(variant: Variant<'_>, cmd: &[String], parse: fn(&str) -> Option<f64>) -> Result<f64> {
    let mut c = match variant {
        Some((wattprof, options)) => {
            let mut c = Command::new(wattprof);
            c.args(["run", "--as-root"])
                .args(options)
                .arg("--")
                .args(cmd);
            c
        }
        None => {
            let mut c = Command::new(&cmd[0]);
            c.args(&cmd[1..]);
            c
        }
    };
    let out = c.output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    parse(&text).with_context(|| format!("no timing in output of {cmd:?}: {text}"))
}

/// A 95% confidence interval of the median of `v`, by bootstrap (2,000
/// resamples, a fixed seed so a run's figures can be reproduced from its
/// timings).
fn median_ci(v: &[f64]) -> (f64, f64) {
    const RESAMPLES: usize = 2000;
    let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
    let mut sample = vec![0.0; v.len()];
    let mut medians: Vec<f64> = (0..RESAMPLES)
        .map(|_| {
            for x in sample.iter_mut() {
                seed = seed
                    .wrapping_mul(6_364_136_223_846_793_005)
                    .wrapping_add(1_442_695_040_888_963_407);
                *x = v[(seed >> 33) as usize % v.len()];
            }
            sample.sort_by(f64::total_cmp);
            quantile(&sample, 0.5)
        })
        .collect();
    medians.sort_by(f64::total_cmp);
    (quantile(&medians, 0.025), quantile(&medians, 0.975))
}

/// The value at quantile `q` of sorted `v`.
fn quantile(v: &[f64], q: f64) -> f64 {
    v[((v.len() - 1) as f64 * q).round() as usize]
}

/// The median of sorted `v` (the mean of the two middle values for an
/// even count).
fn median(v: &[f64]) -> f64 {
    let n = v.len();
    if n.is_multiple_of(2) {
        f64::midpoint(v[n / 2 - 1], v[n / 2])
    } else {
        v[n / 2]
    }
}

/// `v`'s median and range, `{median} ({min}-{max})` with `digits`
/// decimals (`v` in any order, not empty).
fn median_range(v: &[f64], digits: usize) -> String {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    format!(
        "{:.digits$} ({:.digits$}-{:.digits$})",
        median(&v),
        v[0],
        v[v.len() - 1]
    )
}

/// A helper load (`xtask bench HELPER N SECONDS`) in its own process
/// group: dropping it kills the whole group (`busy-procs`' N forked
/// children too, which a kill of the helper alone would leave running
/// into the next measurement), on early returns as well.
struct Load {
    child: std::process::Child,
}

impl Load {
    /// Starts `helper` with `n` for `seconds`, and waits `settle_s` for
    /// it to start.
    fn start(xtask: &Path, helper: &str, n: usize, seconds: u64, settle_s: u64) -> Result<Self> {
        use std::os::unix::process::CommandExt;
        let child = Command::new(xtask)
            .args(["bench", helper, &n.to_string(), &seconds.to_string()])
            .process_group(0)
            .spawn()
            .with_context(|| format!("start the {helper} load"))?;
        std::thread::sleep(std::time::Duration::from_secs(settle_s));
        Ok(Self { child })
    }

    /// Fails when the load already ended: its duration was too short for
    /// the measurements, which would then run without it.
    fn check(&mut self) -> Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("the benchmark's load ended early ({status}): the measurements outlasted it");
        }
        Ok(())
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        if let Ok(pgid) = i32::try_from(self.child.id()) {
            // SAFETY: signalling the process group this guard started.
            unsafe { libc::kill(-pgid, libc::SIGKILL) };
        }
        let _ = self.child.wait();
    }
}

/// Runs `cmd` with no tracker, the switch tracker and the iterator tracker
/// (and, with `baseline`, that build's switch tracker) in each of `rounds`
/// rounds (the order rotating, so drift and warm-up fall on all alike),
/// and prints each tracker's median paired ratio to the untracked run of
/// its round, with the interquartile range, and the cost per context
/// switch it implies.
fn paired(
    name: &str,
    wattprof: &Path,
    baseline: Option<&Path>,
    cmd: &[String],
    rounds: usize,
    switches: f64,
    parse: fn(&str) -> Option<f64>,
) -> Result<()> {
    if rounds == 0 {
        return Ok(());
    }
    const SWITCH: &[&str] = &["--tracker", "switch"];
    const ITER: &[&str] = &["--tracker", "iter"];
    let mut variants: Vec<(Variant<'_>, &str)> = vec![
        (None, ""),
        (Some((wattprof, SWITCH)), "--tracker switch"),
        (Some((wattprof, ITER)), "--tracker iter  "),
    ];
    if let Some(old) = baseline {
        variants.push((Some((old, SWITCH)), "--tracker switch, baseline build"));
    }
    let runs: Vec<Variant<'_>> = variants.iter().map(|(v, _)| *v).collect();
    let times = rotate(cmd, rounds, &runs, parse)?;
    let base_median = print_base(name, rounds, &times[0], "untracked");
    for (v, (_, label)) in variants.iter().enumerate().skip(1) {
        let (m, text) = paired_ratio(&times[v], &times[0]);
        println!(
            "  {label}  {text}, {:+.0} ns per context switch",
            (m - 1.0) * base_median * 1e9 / switches,
        );
    }
    if baseline.is_some() {
        let (_, text) = paired_ratio(&times[1], &times[3]);
        println!("  --tracker switch, this build vs the baseline build: {text}");
    }
    Ok(())
}

/// Runs `cmd` under each variant (`None`: alone; else `wattprof run` with
/// those options) in each of `rounds` rounds, the order rotating so drift
/// and warm-up fall on all alike; the timings per variant.
fn rotate(
    cmd: &[String],
    rounds: usize,
    variants: &[Variant<'_>],
    parse: fn(&str) -> Option<f64>,
) -> Result<Vec<Vec<f64>>> {
    let n = variants.len();
    let mut times: Vec<Vec<f64>> = (0..n).map(|_| Vec::with_capacity(rounds)).collect();
    for round in 0..rounds {
        for k in 0..n {
            let v = (round + k) % n;
            times[v].push(timed(variants[v], cmd, parse)?);
        }
    }
    Ok(times)
}

/// Prints the baseline's median and IQR; returns the median.
fn print_base(name: &str, rounds: usize, base: &[f64], what: &str) -> f64 {
    let mut base = base.to_vec();
    base.sort_by(f64::total_cmp);
    let median = quantile(&base, 0.5);
    println!(
        "{name}: {rounds} rounds; {what} median {median:.4} s (IQR {:.4}-{:.4} s)",
        quantile(&base, 0.25),
        quantile(&base, 0.75)
    );
    median
}

/// The median of the round-by-round ratios `times / base`, and a line
/// giving it with its 95% CI and IQR.
fn paired_ratio(times: &[f64], base: &[f64]) -> (f64, String) {
    let mut ratios: Vec<f64> = times.iter().zip(base).map(|(t, b)| t / b).collect();
    ratios.sort_by(f64::total_cmp);
    let m = quantile(&ratios, 0.5);
    let (lo, hi) = median_ci(&ratios);
    (
        m,
        format!(
            "median paired ratio {m:.4} ({:+.2}%, 95% CI {:+.2}% to {:+.2}%), IQR {:.4}-{:.4}",
            (m - 1.0) * 100.0,
            (lo - 1.0) * 100.0,
            (hi - 1.0) * 100.0,
            quantile(&ratios, 0.25),
            quantile(&ratios, 0.75),
        ),
    )
}

/// A call chain of a few frames, so sampled stacks have depth.
#[inline(never)]
fn spin_outer(iterations: u64, seed: u64) -> u64 {
    std::hint::black_box(spin_middle(iterations, seed))
}

#[inline(never)]
fn spin_middle(iterations: u64, seed: u64) -> u64 {
    std::hint::black_box(spin_inner(iterations, seed))
}

#[inline(never)]
fn spin_inner(iterations: u64, seed: u64) -> u64 {
    let mut x = seed | 1;
    for i in 0..iterations {
        x = std::hint::black_box(x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(i));
    }
    x
}

/// `cargo xtask bench stacks`.
fn stacks(rounds: usize, hz: u32, work: u64) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the stacks benchmark loads eBPF: run it as root");
    }
    let wattprof = wattprof_release()?;
    let xtask = workspace_root().join("target/release/xtask");
    print_machine();
    let hz_text = hz.to_string();
    let cmd: Vec<String> = vec![
        xtask.to_string_lossy().into_owned(),
        "bench".into(),
        "spin".into(),
        work.to_string(),
    ];
    let with: [&str; 3] = ["--stacks", "--stack-hz", &hz_text];
    let variants: [Variant<'_>; 3] = [None, Some((&wattprof, &[])), Some((&wattprof, &with))];
    let times = rotate(&cmd, rounds, &variants, |t| t.trim().parse().ok())?;
    print_base(
        &format!("CPU-bound work on every CPU, {work}M iterations per thread"),
        rounds,
        &times[0],
        "alone",
    );
    let (_, text) = paired_ratio(&times[1], &times[0]);
    println!("  wattprof run                 vs alone:        {text}");
    let (_, text) = paired_ratio(&times[2], &times[0]);
    println!("  wattprof run --stacks {hz:>5} Hz vs alone:       {text}");
    let (_, text) = paired_ratio(&times[2], &times[1]);
    println!("  --stacks {hz:>5} Hz vs wattprof run without: {text}");
    // wattprof's own CPU, as it measured itself, with and without stacks.
    let dir = std::env::temp_dir().join(format!("wattprof-bench-stacks-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    for (label, options) in [("without --stacks", &[][..]), ("with --stacks", &with[..])] {
        let mut own: Vec<f64> = Vec::new();
        for _ in 0..5 {
            let out = dir.join("run.json");
            let status = Command::new(&wattprof)
                .args(["run", "--as-root", "--output"])
                .arg(&out)
                .args(options)
                .arg("--")
                .args(&cmd)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()?;
            if !status.success() {
                bail!("wattprof run {options:?} failed: {status}");
            }
            let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&out)?)?;
            let own_ns = r["groups"]["profiler_ns"].as_f64().unwrap_or(0.0);
            let wall_ns = r["wall_ns"].as_f64().unwrap_or(1.0);
            own.push(own_ns / wall_ns * 100.0);
        }
        own.sort_by(f64::total_cmp);
        println!(
            "  wattprof's own CPU {label:<16}: median {:.3}% of one CPU (range {:.3}-{:.3}%, 5 runs)",
            quantile(&own, 0.5),
            own[0],
            own[own.len() - 1]
        );
    }
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

/// CPU time of all threads of `pid` (ns), from the scheduler.
fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(dir) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    dir.flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

/// Lets a started wattprof settle for `settle_s`, measures its CPU per
/// second of wall time over `seconds`, waits for it to end (it must
/// succeed), and returns that rate (ns/s) and its recording (`out`,
/// removed).
fn steady_cpu(
    mut child: std::process::Child,
    settle_s: u64,
    seconds: u64,
    out: &Path,
) -> Result<(f64, serde_json::Value)> {
    std::thread::sleep(std::time::Duration::from_secs(settle_s));
    let (c0, t0) = (process_cpu_ns(child.id()), Instant::now());
    std::thread::sleep(std::time::Duration::from_secs(seconds));
    let (c1, t1) = (process_cpu_ns(child.id()), Instant::now());
    let status = child.wait()?;
    if !status.success() {
        bail!("wattprof failed: {status}");
    }
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(out)?)?;
    let _ = std::fs::remove_file(out);
    Ok(((c1 - c0) as f64 / (t1 - t0).as_secs_f64(), report))
}

/// wattprof's own CPU while a workload of `threads` live threads runs
/// (`idle-threads`: they sleep; `busy-procs`: each wakes every 50 ms):
/// steady state (after they were all created and seen), and over the
/// whole run as wattprof measured itself.
fn tracker_cpu(
    wattprof: &Path,
    xtask: &Path,
    tracker: &str,
    workload: &str,
    threads: usize,
    seconds: u64,
) -> Result<()> {
    const SETTLE_S: u64 = 3;
    let out = std::env::temp_dir().join(format!("wattprof-bench-{tracker}-{threads}.json"));
    let child = Command::new(wattprof)
        .args(["run", "--as-root", "--interval", "1s", "--tracker", tracker])
        .arg("--output")
        .arg(&out)
        .arg("--")
        .arg(xtask)
        .args([
            "bench",
            workload,
            &threads.to_string(),
            &(SETTLE_S + seconds + 1).to_string(),
        ])
        .stderr(std::process::Stdio::null())
        .spawn()?;
    let (steady, report) = steady_cpu(child, SETTLE_S, seconds, &out)
        .with_context(|| format!("wattprof run with {threads} threads"))?;
    let num = |p: &str| {
        report
            .pointer(p)
            .and_then(serde_json::Value::as_u64)
            .unwrap_or(0)
    };
    let (cpu_ns, wall_ns) = (num("/profiler/on_cpu_ns"), num("/wall_ns"));
    let samples = num("/profiler/samples").max(1);
    let what = match workload {
        "idle-threads" => "live idle threads",
        "busy-threads" => "threads waking every 50 ms",
        _ => "processes waking every 50 ms",
    };
    println!(
        "--tracker {tracker}: wattprof CPU with {threads} {what}, 1 s interval: steady state \
         {:.3} ms/s = {:.3}% of one core; whole run incl. creating them {:.3}% ({:.1} read \
         syscalls per sample, {samples} samples, kernel memory {:.1} MiB)",
        steady / 1e6,
        steady / 1e7,
        100.0 * cpu_ns as f64 / wall_ns.max(1) as f64,
        num("/profiler/map_read_syscalls") as f64 / samples as f64,
        num("/profiler/kernel_memory_bytes") as f64 / (1 << 20) as f64
    );
    Ok(())
}

fn overhead(rounds: usize, round_trips: u64, seconds: u64, baseline: Option<&Path>) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the overhead benchmark loads eBPF: run it as root");
    }
    let wattprof = wattprof_release()?;
    let xtask = workspace_root().join("target/release/xtask");
    print_machine();
    if rounds == 0 {
        println!("paired workloads skipped (--rounds 0)");
    }
    let pp = vec![
        xtask.to_string_lossy().into_owned(),
        "bench".into(),
        "pingpong".into(),
        round_trips.to_string(),
    ];
    paired(
        &format!("pipe ping-pong pinned to CPU 0, {round_trips} round trips"),
        &wattprof,
        baseline,
        &pp,
        rounds,
        2.0 * round_trips as f64,
        |t| t.trim().parse().ok(),
    )?;
    if Command::new("perf")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success())
    {
        let parse_perf: fn(&str) -> Option<f64> = |t| {
            t.lines()
                .find_map(|l| l.trim().strip_prefix("Total time:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
        };
        for pinned in [false, true] {
            let mut cmd: Vec<String> = Vec::new();
            if pinned {
                cmd.extend(["taskset", "-c", "0"].map(String::from));
            }
            cmd.extend(["perf", "bench", "sched", "pipe", "-l"].map(String::from));
            cmd.push(round_trips.to_string());
            let name = if pinned {
                "perf bench sched pipe (pinned to CPU 0)"
            } else {
                "perf bench sched pipe (default, tasks on any CPU)"
            };
            paired(
                name,
                &wattprof,
                baseline,
                &cmd,
                rounds,
                2.0 * round_trips as f64,
                parse_perf,
            )?;
        }
    } else {
        println!("perf bench sched pipe: skipped (perf not installed: apt-get install linux-perf)");
    }
    for tracker in ["iter", "switch"] {
        for (workload, threads) in [
            ("idle-threads", 1_000),
            ("idle-threads", 10_000),
            ("busy-threads", 1_000),
            ("busy-procs", 1_000),
        ] {
            tracker_cpu(&wattprof, &xtask, tracker, workload, threads, seconds)?;
        }
    }
    Ok(())
}

/// Prints the CPU model, CPU count and kernel.
fn print_machine() {
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_string())
        })
        .unwrap_or_default();
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    println!(
        "machine: {cpu}, {} CPUs, Linux {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        kernel.trim()
    );
}

/// N children that each wake every 50 ms and spin about 20 us, for
/// `seconds`; the parent waits for them.
fn busy_procs(n: usize, seconds: u64) -> Result<()> {
    let end = Instant::now() + std::time::Duration::from_secs(seconds);
    let mut pids = Vec::with_capacity(n);
    for _ in 0..n {
        // SAFETY: the child only sleeps, spins and exits.
        let pid = unsafe { libc::fork() };
        if pid == 0 {
            while Instant::now() < end {
                std::thread::sleep(std::time::Duration::from_millis(50));
                let t = Instant::now();
                while t.elapsed() < std::time::Duration::from_micros(20) {
                    std::hint::spin_loop();
                }
            }
            // SAFETY: leave without running the parent's destructors.
            unsafe { libc::_exit(0) };
        }
        if pid < 0 {
            bail!("fork failed: {}", std::io::Error::last_os_error());
        }
        pids.push(pid);
    }
    for pid in pids {
        // SAFETY: waiting for our own child.
        unsafe { libc::waitpid(pid, std::ptr::null_mut(), 0) };
    }
    Ok(())
}

/// `wattprof monitor` as the benchmarks run it: no RAPL here (a 100 W
/// CPU model), no GPU, its recording to `out`, quiet.
fn monitor_command(wattprof: &Path, interval: &str, duration: &str, out: &Path) -> Command {
    let mut cmd = Command::new(wattprof);
    cmd.args([
        "monitor",
        "--cpu-tdp",
        "100",
        "--no-gpu",
        "--interval",
        interval,
    ])
    .args(["--duration", duration])
    .arg("--output")
    .arg(out)
    .stdout(std::process::Stdio::null())
    .stderr(std::process::Stdio::null());
    cmd
}

/// wattprof monitor's CPU per second of wall time, from its threads'
/// schedstat, over `seconds` after a 2 s settle.
fn monitor_cpu(wattprof: &Path, interval: &str, seconds: u64) -> Result<(f64, u64)> {
    const SETTLE_S: u64 = 2;
    let out = std::env::temp_dir().join("wattprof-bench-monitor.json");
    let child = monitor_command(
        wattprof,
        interval,
        &format!("{}s", SETTLE_S + seconds + 1),
        &out,
    )
    .spawn()?;
    let (rate, report) = steady_cpu(child, SETTLE_S, seconds, &out).context("wattprof monitor")?;
    let seen = report
        .pointer("/intervals")
        .and_then(serde_json::Value::as_array)
        .map_or(0, Vec::len) as u64;
    Ok((rate, seen))
}

/// `wattprof top`'s and `monitor`'s CPU per second of wall time, run at
/// once over the same seconds (the VM's noise falls on both alike):
/// `top` in a 160x50 tmux terminal, `monitor` with no screen, each with
/// the options [`monitor_cpu`] gives `monitor`.
fn top_and_monitor_cpu(wattprof: &Path, seconds: u64) -> Result<(f64, f64)> {
    const SETTLE_S: u64 = 2;
    let dir = std::env::temp_dir();
    let (top_out, monitor_out) = (
        dir.join("wattprof-bench-top.json"),
        dir.join("wattprof-bench-top-monitor.json"),
    );
    let _ = std::fs::remove_file(&top_out);
    let name = format!("wattprof-bench-top-{}", std::process::id());
    let tmux = |args: &[&str]| -> Result<String> {
        let o = Command::new("tmux").args(args).output()?;
        if !o.status.success() {
            bail!(
                "tmux {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&o.stderr)
            );
        }
        Ok(String::from_utf8_lossy(&o.stdout).trim().to_string())
    };
    let duration = format!("{}s", SETTLE_S + seconds + 1);
    // `exec`: the pane's process is wattprof itself.
    let cmd = format!(
        "exec {} top --cpu-tdp 100 --no-gpu --interval 1s --duration {duration} --output {}",
        wattprof.display(),
        top_out.display()
    );
    tmux(&[
        "new-session",
        "-d",
        "-s",
        &name,
        "-x",
        "160",
        "-y",
        "50",
        &cmd,
    ])?;
    let monitor = monitor_command(wattprof, "1s", &duration, &monitor_out).spawn();
    let pid: Result<u32> = tmux(&["display-message", "-p", "-t", &name, "#{pane_pid}"])
        .and_then(|p| p.parse().context("the pane's pid"));
    let (mut monitor, pid) = match (monitor, pid) {
        (Ok(m), Ok(p)) => (m, p),
        (m, p) => {
            let _ = tmux(&["kill-session", "-t", &name]);
            if let Ok(mut m) = m {
                let _ = m.kill();
                let _ = m.wait();
            }
            p?;
            bail!("wattprof monitor did not start");
        }
    };
    std::thread::sleep(std::time::Duration::from_secs(SETTLE_S));
    let (t0, m0, w0) = (
        process_cpu_ns(pid),
        process_cpu_ns(monitor.id()),
        Instant::now(),
    );
    std::thread::sleep(std::time::Duration::from_secs(seconds));
    let (t1, m1, w1) = (
        process_cpu_ns(pid),
        process_cpu_ns(monitor.id()),
        Instant::now(),
    );
    let status = monitor.wait()?;
    let deadline = Instant::now() + std::time::Duration::from_secs(30);
    while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let _ = tmux(&["kill-session", "-t", &name]);
    if !status.success() {
        bail!("wattprof monitor failed: {status}");
    }
    if !top_out.exists() {
        bail!("wattprof top wrote no recording (did it start? run it in a terminal to see)");
    }
    let _ = std::fs::remove_file(&top_out);
    let _ = std::fs::remove_file(&monitor_out);
    let wall = (w1 - w0).as_secs_f64();
    // The threads alive at each read: one that ended between would make
    // a sum fall; that round is refused rather than a wrap taken.
    if t1 < t0 || m1 < m0 {
        bail!("a wattprof thread ended during the measurement: run again");
    }
    Ok(((t1 - t0) as f64 / wall, (m1 - m0) as f64 / wall))
}

/// `top` against `monitor` (no screen), side by side, under `processes`
/// wakers: what the screen costs.
fn top(rounds: usize, seconds: u64, processes: usize) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the top benchmark loads eBPF: run it as root");
    }
    if !Path::new("/usr/bin/tmux").exists() {
        bail!("the top benchmark runs top in tmux: apt-get install tmux");
    }
    let wattprof = wattprof_release()?;
    let xtask = workspace_root().join("target/release/xtask");
    print_machine();
    let span = rounds as u64 * (seconds + 8) + 30;
    let mut load = Load::start(&xtask, "busy-procs", processes, span, 2)?;
    let (mut tops, mut monitors) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (t, m) = top_and_monitor_cpu(&wattprof, seconds)?;
        load.check()?;
        println!(
            "round {}: top {:.3} ms/s, monitor {:.3} ms/s",
            round + 1,
            t / 1e6,
            m / 1e6
        );
        tops.push(t);
        monitors.push(m);
    }
    let diff: Vec<f64> = tops
        .iter()
        .zip(&monitors)
        .map(|(t, m)| (t - m) / 1e7)
        .collect();
    let ratio: Vec<f64> = tops.iter().zip(&monitors).map(|(t, m)| t / m).collect();
    println!(
        "top against monitor at 1 s with {processes} wakers, {rounds} paired rounds of {seconds} s: \
         the screen costs {} % of one core (median, range), paired ratio {}; \
         top {} ms/s, monitor {} ms/s",
        median_range(&diff, 3),
        median_range(&ratio, 3),
        median_range(&tops.iter().map(|t| t / 1e6).collect::<Vec<_>>(), 2),
        median_range(&monitors.iter().map(|m| m / 1e6).collect::<Vec<_>>(), 2),
    );
    Ok(())
}

/// Two `monitor --serve` daemons side by side, one following `trees`
/// trees for as many clients: each one's CPU per second of wall time.
fn serve_pair(wattprof: &Path, seconds: u64, trees: usize) -> Result<(f64, f64)> {
    use std::io::Write;
    const SETTLE_S: u64 = 3;
    let dir = std::env::temp_dir().join(format!("wattprof-bench-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let duration = format!("{}s", SETTLE_S + seconds + 2);
    let daemon = |name: &str| {
        monitor_command(wattprof, "1s", &duration, &dir.join(format!("{name}.json")))
            .arg("--serve")
            .arg(dir.join(format!("{name}.sock")))
            .spawn()
    };
    let mut with = daemon("with")?;
    let mut without = daemon("without")?;
    let sock = dir.join("with.sock");
    let until = Instant::now() + std::time::Duration::from_secs(30);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        if Instant::now() > until {
            bail!("the daemon did not listen at {}", sock.display());
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    // The trees, and a client following each (kept open: the progress
    // lines a second each fit the socket's buffer for the run).
    let mut shells = Vec::new();
    let mut clients = Vec::new();
    for _ in 0..trees {
        // A process waking every 50 ms, forking nothing (a training
        // job's main process, not a shell loop of `sleep`s).
        let sh = Command::new("perl")
            .args(["-e", "select(undef, undef, undef, 0.05) while 1"])
            .spawn()
            .context("perl (the trees' waker)")?;
        let mut c = std::os::unix::net::UnixStream::connect(&sock)?;
        c.write_all(format!("follow pid={}\n", sh.id()).as_bytes())?;
        shells.push(sh);
        clients.push(c);
    }
    std::thread::sleep(std::time::Duration::from_secs(SETTLE_S));
    let (a0, b0, t0) = (
        process_cpu_ns(with.id()),
        process_cpu_ns(without.id()),
        Instant::now(),
    );
    std::thread::sleep(std::time::Duration::from_secs(seconds));
    let (a1, b1, t1) = (
        process_cpu_ns(with.id()),
        process_cpu_ns(without.id()),
        Instant::now(),
    );
    for mut sh in shells {
        let _ = sh.kill();
        let _ = sh.wait();
    }
    drop(clients);
    let (sa, sb) = (with.wait()?, without.wait()?);
    let _ = std::fs::remove_dir_all(&dir);
    if !sa.success() || !sb.success() {
        bail!("a daemon failed: {sa}, {sb}");
    }
    if a1 < a0 || b1 < b0 {
        bail!("a wattprof thread ended during the measurement: run again");
    }
    let wall = (t1 - t0).as_secs_f64();
    Ok(((a1 - a0) as f64 / wall, (b1 - b0) as f64 / wall))
}

/// The daemon with `trees` followed trees against none, side by side.
fn serve(rounds: usize, seconds: u64, trees: usize, processes: usize) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the serve benchmark loads eBPF: run it as root");
    }
    let wattprof = wattprof_release()?;
    let xtask = workspace_root().join("target/release/xtask");
    print_machine();
    let span = rounds as u64 * (seconds + 10) + 30;
    let mut load = Load::start(&xtask, "busy-procs", processes, span, 2)?;
    let (mut with, mut without) = (Vec::new(), Vec::new());
    for round in 0..rounds {
        let (a, b) = serve_pair(&wattprof, seconds, trees)?;
        load.check()?;
        println!(
            "round {}: {trees} trees {:.3} ms/s, none {:.3} ms/s",
            round + 1,
            a / 1e6,
            b / 1e6
        );
        with.push(a);
        without.push(b);
    }
    let ratio: Vec<f64> = with.iter().zip(&without).map(|(a, b)| a / b).collect();
    let diff: Vec<f64> = with
        .iter()
        .zip(&without)
        .map(|(a, b)| (a - b) / 1e7)
        .collect();
    println!(
        "monitor --serve at 1 s with {processes} wakers, {rounds} paired rounds of {seconds} s: \
         {trees} followed trees against none, paired ratio {}, difference {} % of one core; \
         with {} ms/s, none {} ms/s",
        median_range(&ratio, 3),
        median_range(&diff, 3),
        median_range(&with.iter().map(|t| t / 1e6).collect::<Vec<_>>(), 2),
        median_range(&without.iter().map(|m| m / 1e6).collect::<Vec<_>>(), 2),
    );
    Ok(())
}

fn monitor(seconds: u64, processes: usize) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the monitor benchmark loads eBPF: run it as root");
    }
    let wattprof = wattprof_release()?;
    let xtask = workspace_root().join("target/release/xtask");
    println!(
        "machine: {} CPUs, Linux {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    let m = scrape_cpu(&wattprof, &xtask, processes, ScrapeClient::Plain, 300)?;
    println!(
        "/metrics scrape with {processes} processes running: {:.3} ms of wattprof CPU per scrape \
         (exporter counter; {:.3} ms in all threads but sampling's)",
        m.counter_ms, m.threads_ms
    );
    for interval in ["1s", "100ms"] {
        let (idle, _) = monitor_cpu(&wattprof, interval, seconds)?;
        let mut load = Command::new(&xtask)
            .args(["bench", "busy-procs", &processes.to_string()])
            .arg((seconds + 6).to_string())
            .spawn()?;
        // Let them all start.
        std::thread::sleep(std::time::Duration::from_secs(1));
        let (busy, intervals) = monitor_cpu(&wattprof, interval, seconds)?;
        let _ = load.wait();
        println!(
            "monitor --interval {interval}: {:.3} ms/s ({:.3}% of one core) with {processes} processes waking every 50 ms; {:.3} ms/s ({:.3}%) without them; ratio {:.2} ({intervals} intervals)",
            busy / 1e6,
            busy / 1e7,
            idle / 1e6,
            idle / 1e7,
            busy / idle.max(1.0)
        );
    }
    Ok(())
}

/// A state of the machine the monitor is measured in: its interval, and
/// the helper load (`xtask bench HELPER N SECONDS`) running meanwhile.
struct MonitorState {
    /// Its name for `--states`.
    name: &'static str,
    label: String,
    interval: &'static str,
    load: Option<(&'static str, usize)>,
}

/// The four states of issue #41's table: a quiet host, 10,000 idle
/// threads, and `processes` wakers at 1 s and at 100 ms.
fn monitor_states(processes: usize) -> Vec<MonitorState> {
    vec![
        MonitorState {
            name: "quiet",
            label: "quiet host".into(),
            interval: "1s",
            load: None,
        },
        MonitorState {
            name: "idle-threads",
            label: "10,000 idle threads".into(),
            interval: "1s",
            load: Some(("idle-threads", 10_000)),
        },
        MonitorState {
            name: "wakers-1s",
            label: format!("{processes} wakers"),
            interval: "1s",
            load: Some(("busy-procs", processes)),
        },
        MonitorState {
            name: "wakers-100ms",
            label: format!("{processes} wakers"),
            interval: "100ms",
            load: Some(("busy-procs", processes)),
        },
    ]
}

/// One state's paired rounds: each build's CPU (ms/s) and their ratios.
struct Paired {
    news: Vec<f64>,
    olds: Vec<f64>,
    ratios: Vec<f64>,
}

/// `bench monitor --baseline OLD`: this build's monitor and OLD's take
/// turns in each state of [`monitor_states`], `rounds` times (the order
/// alternating, so drift and warm-up fall on both alike); prints each
/// round's CPU, and per state the medians with their ranges and the
/// median of the paired ratios with its range, as a table.
fn monitor_against(
    old: &Path,
    seconds: u64,
    processes: usize,
    rounds: usize,
    only: &[String],
) -> Result<()> {
    let all = monitor_states(processes);
    if let Some(bad) = only
        .iter()
        .find(|o| !all.iter().any(|s| s.name == o.as_str()))
    {
        bail!(
            "--states: no state `{bad}`; the states are quiet, idle-threads, wakers-1s, wakers-100ms"
        );
    }
    let states: Vec<MonitorState> = all
        .into_iter()
        .filter(|s| only.is_empty() || only.iter().any(|o| o == s.name))
        .collect();
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the monitor benchmark loads eBPF: run it as root");
    }
    if !old.is_file() {
        bail!("--baseline {}: no such binary", old.display());
    }
    let rounds = rounds.max(1);
    let new = wattprof_release()?;
    let xtask = workspace_root().join("target/release/xtask");
    println!(
        "machine: {} CPUs, Linux {}; this build {} against {}",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim(),
        new.display(),
        old.display()
    );
    let mut rows = Vec::new();
    for state in states {
        let paired = monitor_state(&state, &new, old, &xtask, seconds, rounds)?;
        rows.push((state, paired));
    }
    println!(
        "\n| state | interval | this build, ms/s, median (range) | baseline, ms/s, median \
         (range) | paired ratio, median (range) |\n| --- | --- | --- | --- | --- |"
    );
    for (state, p) in rows {
        println!(
            "| {} | {} | {} | {} | {} |",
            state.label,
            state.interval,
            median_range(&p.news, 3),
            median_range(&p.olds, 3),
            median_range(&p.ratios, 3)
        );
    }
    Ok(())
}

/// The paired rounds of one state, its load running throughout.
fn monitor_state(
    state: &MonitorState,
    new: &Path,
    old: &Path,
    xtask: &Path,
    seconds: u64,
    rounds: usize,
) -> Result<Paired> {
    // Each measurement: 2 s settle, `seconds`, 1 s to end.
    let per_run = seconds + 3;
    // Long enough for every round and its start-up; killed with its
    // children when this state is done.
    let mut load = match state.load {
        Some((helper, n)) => Some(Load::start(
            xtask,
            helper,
            n,
            per_run * 2 * rounds as u64 + 4 * rounds as u64 + 10,
            if n > 5_000 { 4 } else { 1 },
        )?),
        None => None,
    };
    let mut p = Paired {
        news: Vec::new(),
        olds: Vec::new(),
        ratios: Vec::new(),
    };
    for r in 0..rounds {
        let order: [&Path; 2] = if r % 2 == 0 { [new, old] } else { [old, new] };
        let mut got = [0.0; 2];
        for (i, bin) in order.iter().enumerate() {
            got[i] = monitor_cpu(bin, state.interval, seconds)?.0;
        }
        let (n, o) = if r % 2 == 0 {
            (got[0], got[1])
        } else {
            (got[1], got[0])
        };
        println!(
            "  {} at {} round {}: this build {:.3} ms/s, baseline {:.3} ms/s, ratio {:.3}",
            state.label,
            state.interval,
            r + 1,
            n / 1e6,
            o / 1e6,
            n / o.max(1.0)
        );
        p.news.push(n / 1e6);
        p.olds.push(o / 1e6);
        p.ratios.push(n / o.max(1.0));
    }
    if let Some(l) = load.as_mut() {
        l.check()?;
    }
    drop(load);
    Ok(p)
}

/// `bench allocs`: heap allocations per interval of `wattprof monitor`
/// in steady state, counted by the `alloc-count` preload (any binary, a
/// baseline build too): each binary runs for `short` and `long` seconds
/// while `processes` wakers run, and the difference in allocations over
/// the difference in intervals takes start-up out. `rounds` of each,
/// alternating; medians and ranges.
fn allocs(
    processes: usize,
    interval: &str,
    short: u64,
    long: u64,
    rounds: usize,
    baseline: Option<&Path>,
) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the allocation benchmark loads eBPF: run it as root");
    }
    if long <= short {
        bail!("--long must be longer than --short");
    }
    let new = wattprof_release()?;
    build_release(&["-p", "alloc-count"])?;
    let preload = workspace_root().join("target/release/liballoc_count.so");
    let xtask = workspace_root().join("target/release/xtask");
    let mut builds: Vec<(&str, &Path)> = vec![("this build", &new)];
    if let Some(old) = baseline {
        if !old.is_file() {
            bail!("--baseline {}: no such binary", old.display());
        }
        builds.push(("baseline", old));
    }
    let rounds = rounds.max(1);
    let mut load = Load::start(
        &xtask,
        "busy-procs",
        processes,
        (short + long + 4) * rounds as u64 * builds.len() as u64 + 10,
        1,
    )?;
    let mut per: Vec<Vec<f64>> = vec![Vec::new(); builds.len()];
    for r in 0..rounds {
        for k in 0..builds.len() {
            let i = if r % 2 == 0 { k } else { builds.len() - 1 - k };
            let (name, bin) = builds[i];
            let (a0, n0) = counted_run(bin, &preload, interval, short)?;
            let (a1, n1) = counted_run(bin, &preload, interval, long)?;
            if n1 <= n0 {
                bail!("{name}: the {long} s run recorded {n1} intervals, the {short} s run {n0}");
            }
            let rate = (a1 as f64 - a0 as f64) / (n1 - n0) as f64;
            println!(
                "  round {}: {name}: {a0} allocations over {n0} intervals, {a1} over {n1}: \
                 {rate:.1} per interval",
                r + 1
            );
            per[i].push(rate);
        }
    }
    load.check()?;
    drop(load);
    for (i, (name, _)) in builds.iter().enumerate() {
        println!(
            "{name}: monitor --interval {interval} with {processes} wakers: {} allocations per \
             interval in steady state, median (range) of {rounds}",
            median_range(&per[i], 1)
        );
    }
    Ok(())
}

/// `wattprof monitor` for `seconds` under the counting preload: its
/// allocations and the intervals it recorded.
fn counted_run(
    wattprof: &Path,
    preload: &Path,
    interval: &str,
    seconds: u64,
) -> Result<(u64, u64)> {
    // A directory of this run's own (the bench runs as root; fixed names
    // in /tmp could be links), removed at the end.
    let dir = std::env::temp_dir().join(format!("wattprof-bench-allocs-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).with_context(|| format!("create {}", dir.display()))?;
    let got = counted_run_in(&dir, wattprof, preload, interval, seconds);
    let _ = std::fs::remove_dir_all(&dir);
    got
}

/// [`counted_run`] with its files in `dir`.
fn counted_run_in(
    dir: &Path,
    wattprof: &Path,
    preload: &Path,
    interval: &str,
    seconds: u64,
) -> Result<(u64, u64)> {
    let out = dir.join("recording.json");
    let count = dir.join("count");
    let mut child = monitor_command(wattprof, interval, &format!("{seconds}s"), &out)
        .env("LD_PRELOAD", preload)
        .env("ALLOC_COUNT_FILE", &count)
        .spawn()?;
    // Each process writes `count.PID` (wattprof's children, `modprobe`,
    // inherit the preload): this one's is wattprof's.
    let count = dir.join(format!("count.{}", child.id()));
    let status = child.wait()?;
    if !status.success() {
        bail!("wattprof monitor failed: {status}");
    }
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&out)?)?;
    let intervals = report
        .pointer("/intervals")
        .and_then(serde_json::Value::as_array)
        .map_or(0, Vec::len) as u64;
    let text = std::fs::read_to_string(&count)
        .with_context(|| format!("{}: the preload wrote no count", count.display()))?;
    let allocations = text
        .lines()
        .find_map(|l| l.strip_prefix("allocations "))
        .and_then(|n| n.trim().parse().ok())
        .context("no allocation count")?;
    Ok((allocations, intervals))
}

/// How the scrape benchmark's client connects.
#[derive(Clone, Copy, Debug, PartialEq)]
enum ScrapeClient {
    /// Plain HTTP, a new connection per scrape.
    Plain,
    /// Plain HTTP through one curl (`--rate`): one keep-alive connection
    /// where the server keeps it, as Prometheus scrapes.
    PlainKeepAlive,
    /// HTTPS with basic auth (deploy/web-config.yml), a new connection
    /// and TLS handshake per scrape (curl run each time).
    TlsNewConnection,
    /// HTTPS with basic auth over one keep-alive connection, as
    /// Prometheus scrapes (one curl, `--rate`).
    TlsKeepAlive,
}

/// A CA-signed certificate for 127.0.0.1 and deploy/web-config.yml
/// beside it (user `prometheus`, password `change-me`), in `dir`.
fn bench_web_config(dir: &Path) -> Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let run = |args: String| -> Result<()> {
        let ok = Command::new("openssl")
            .current_dir(dir)
            .args(args.split_whitespace())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            bail!("openssl {args} failed (apt install openssl)");
        }
        Ok(())
    };
    let ec = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    std::fs::write(dir.join("san.ext"), "subjectAltName=IP:127.0.0.1\n")?;
    run(format!(
        "req -x509 {ec} -days 2 -subj /CN=bench-ca -keyout ca.key -out ca.crt"
    ))?;
    run(format!(
        "req {ec} -subj /CN=localhost -keyout server.key -out server.csr"
    ))?;
    run(
        "x509 -req -in server.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 2 \
         -extfile san.ext -out server.crt"
            .into(),
    )?;
    let web = dir.join("web.yml");
    std::fs::copy(workspace_root().join("deploy/web-config.yml"), &web)?;
    Ok(web)
}

/// CPU time (ns) of every thread of `pid` but its main one (sampling):
/// the process's total from /proc/PID/stat (which keeps that of threads
/// that have ended, such as the old exporter's per-connection threads)
/// less the main thread's, in clock ticks.
fn non_main_cpu_ns(pid: u32) -> u64 {
    let ticks = |path: String| -> u64 {
        std::fs::read_to_string(path)
            .ok()
            .and_then(|t| {
                let rest = t.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
                Some(rest.get(11)?.parse::<u64>().ok()? + rest.get(12)?.parse::<u64>().ok()?)
            })
            .unwrap_or(0)
    };
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let all = ticks(format!("/proc/{pid}/stat"));
    let main = ticks(format!("/proc/{pid}/task/{pid}/stat"));
    all.saturating_sub(main) * 1_000_000_000 / hz
}

/// What one scrape measurement found.
struct ScrapeCpu {
    /// The exporter's own counter per scrape (ms); NaN for a baseline
    /// without TLS support given a TLS client.
    counter_ms: f64,
    /// Every thread but sampling's, per scrape (ms), in clock ticks.
    threads_ms: f64,
}

/// How the bench reaches the exporter: plain HTTP by hand, or curl over
/// TLS with basic auth.
struct Scraper {
    tls: bool,
    addr: String,
    url: String,
    ca: PathBuf,
}

impl Scraper {
    /// curl with `extra` arguments: its stdout.
    fn curl(&self, extra: &[String]) -> Result<String> {
        let mut cmd = Command::new("curl");
        cmd.args(["-s", "--fail"]);
        if self.tls {
            cmd.args(["-u", "prometheus:change-me", "--cacert"])
                .arg(&self.ca);
        }
        let out = cmd
            .args(extra)
            .output()
            .context("curl (apt install curl)")?;
        if !out.status.success() {
            bail!("curl {extra:?} failed: {}", out.status);
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// One scrape's body.
    fn scrape(&self) -> Result<String> {
        use std::io::{Read, Write};
        if self.tls {
            return self.curl(std::slice::from_ref(&self.url));
        }
        let mut s = std::net::TcpStream::connect(&self.addr)?;
        s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(body)
    }

    /// The exporter's scrapes so far and its CPU seconds, from one scrape.
    fn exporter_counters(&self) -> Result<(f64, f64)> {
        let body = self.scrape()?;
        let value = |name: &str| -> f64 {
            body.lines()
                .find(|l| l.starts_with(name))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
                .unwrap_or(0.0)
        };
        Ok((
            value("wattprof_exporter_scrapes_total"),
            value("wattprof_exporter_cpu_seconds_total"),
        ))
    }

    /// `scrapes` scrapes 20 ms apart: over one kept-alive connection
    /// (curl --rate) or a new connection each.
    fn scrape_many(&self, client: ScrapeClient, scrapes: u32) -> Result<()> {
        match client {
            ScrapeClient::TlsKeepAlive | ScrapeClient::PlainKeepAlive => {
                let mut args = vec![
                    "--rate".to_string(),
                    "50/s".into(),
                    "-o".into(),
                    "/dev/null".into(),
                ];
                args.extend((0..scrapes).map(|_| self.url.clone()));
                self.curl(&args)?;
            }
            _ => {
                let t = Instant::now();
                for i in 0..scrapes {
                    self.scrape()?;
                    let next = std::time::Duration::from_millis(20) * (i + 1);
                    std::thread::sleep(next.saturating_sub(t.elapsed()));
                }
            }
        }
        Ok(())
    }
}

/// CPU wattprof spends per `/metrics` scrape with `processes` processes
/// alive and running, over `scrapes` scrapes 20 ms apart: from the
/// exporter's own counter (the CPU clock of its one thread, which
/// accepts, shakes hands, parses and answers, plus its bcrypt checks), and
/// from the CPU of every thread but the sampling one.
fn scrape_cpu(
    wattprof: &Path,
    xtask: &Path,
    processes: usize,
    client: ScrapeClient,
    scrapes: u32,
) -> Result<ScrapeCpu> {
    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = format!("127.0.0.1:{port}");
    let tls = matches!(
        client,
        ScrapeClient::TlsNewConnection | ScrapeClient::TlsKeepAlive
    );
    let tls_dir = workspace_root().join("target/bench-tls");
    let web = if tls {
        Some(bench_web_config(&tls_dir)?)
    } else {
        None
    };
    let seconds = u64::from(scrapes) / 50 + 10;
    let mut load = Command::new(xtask)
        .args(["bench", "busy-procs", &processes.to_string()])
        .arg((seconds + 2).to_string())
        .spawn()?;
    std::thread::sleep(std::time::Duration::from_secs(1));
    let mut monitor = Command::new(wattprof);
    monitor
        .args(["monitor", "--cpu-tdp", "100", "--no-gpu", "--duration"])
        .arg(format!("{seconds}s"))
        .args(["--prometheus", &addr]);
    if let Some(web) = &web {
        monitor.arg("--web-config").arg(web);
    }
    let mut child = monitor
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()?;
    std::thread::sleep(std::time::Duration::from_secs(4));
    let scraper = Scraper {
        tls,
        url: format!("{}://{addr}/metrics", if tls { "https" } else { "http" }),
        addr,
        ca: tls_dir.join("ca.crt"),
    };
    // With basic auth the first answer pays bcrypt once, and each answer
    // shows the cost up to the one before: two scrapes before counting.
    scraper.scrape()?;
    let (n0, cpu0_s) = scraper.exporter_counters()?;
    let t0 = non_main_cpu_ns(child.id());
    scraper.scrape_many(client, scrapes)?;
    let threads = non_main_cpu_ns(child.id()).saturating_sub(t0);
    let (n1, cpu1_s) = scraper.exporter_counters()?;
    let (n, cpu_s) = (n1 - n0 - 1.0, cpu1_s - cpu0_s);
    let _ = child.wait();
    let _ = load.wait();
    Ok(ScrapeCpu {
        counter_ms: if n > 0.0 { cpu_s * 1e3 / n } else { f64::NAN },
        threads_ms: threads as f64 / 1e6 / f64::from(scrapes),
    })
}

/// `rounds` of each scrape client, in rotating order, against this
/// wattprof and, with `baseline`, against another build (plain HTTP only,
/// as the exporter before TLS had); medians and ranges.
fn scrapes(rounds: usize, processes: usize, baseline: Option<&Path>) -> Result<()> {
    const SCRAPES: u32 = 300;
    let wattprof = wattprof_release()?;
    let xtask = workspace_root().join("target/release/xtask");
    let mut runs: Vec<(String, &Path, ScrapeClient)> = [
        ScrapeClient::Plain,
        ScrapeClient::PlainKeepAlive,
        ScrapeClient::TlsNewConnection,
        ScrapeClient::TlsKeepAlive,
    ]
    .into_iter()
    .map(|c| (format!("this build, {c:?}"), wattprof.as_path(), c))
    .collect();
    if let Some(old) = baseline {
        for c in [ScrapeClient::Plain, ScrapeClient::PlainKeepAlive] {
            runs.push((format!("baseline, {c:?}"), old, c));
        }
    }
    let mut found: Vec<Vec<ScrapeCpu>> = runs.iter().map(|_| Vec::new()).collect();
    for round in 0..rounds {
        for k in 0..runs.len() {
            let i = (round + k) % runs.len();
            let (label, bin, client) = &runs[i];
            let m = scrape_cpu(bin, &xtask, processes, *client, SCRAPES)?;
            println!(
                "round {round}: {label}: exporter counter {:.3} ms, threads {:.3} ms per scrape",
                m.counter_ms, m.threads_ms
            );
            found[i].push(m);
        }
    }
    let stats = |mut v: Vec<f64>| -> String {
        v.sort_by(f64::total_cmp);
        format!(
            "{:.3} ms ({:.3}-{:.3})",
            v[v.len() / 2],
            v[0],
            v[v.len() - 1]
        )
    };
    println!(
        "{processes} processes running, {SCRAPES} scrapes 20 ms apart per round, {rounds} rounds; \
         median (range) of wattprof CPU per scrape:"
    );
    for ((label, _, _), ms) in runs.iter().zip(found) {
        println!(
            "  {label:<32} exporter counter {}; all threads but sampling's {}",
            stats(ms.iter().map(|m| m.counter_ms).collect()),
            stats(ms.iter().map(|m| m.threads_ms).collect())
        );
    }
    Ok(())
}
