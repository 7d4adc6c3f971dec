//! `cargo xtask bench soak --minutes N`: a day of churn in minutes.
//!
//! Runs `wattprof monitor --prometheus --jsonl` and a `wattprof run` whose
//! command opens and closes profiling windows, while this process churns
//! the machine: about 200 short processes a second, thread pools growing
//! and shrinking, cgroups created and removed every few seconds (and Docker
//! containers where `dockerd` answers), and `/metrics` scraped 10 times a
//! second. Every 10 s it samples both wattprof processes' RSS, open fds,
//! threads and CPU time. At the end it checks both streams: no interval
//! missing, and attributed + idle + unattributed = measured in every
//! interval and domain. It writes the series (CSV), a plot (SVG) and a
//! summary with the growth per hour after the warm-up.

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::Value;

/// One sample of one wattprof process.
#[derive(Clone, Copy, Debug, Default)]
struct Usage {
    rss_kib: u64,
    fds: u64,
    threads: u64,
    cpu_s: f64,
}

fn usage(pid: u32) -> Usage {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .unwrap_or(0)
    };
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
    // utime + stime, fields 14 and 15 of stat, after the comm's ')'.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let ticks: u64 = stat
        .rsplit_once(')')
        .map(|(_, rest)| {
            rest.split_whitespace()
                .skip(11)
                .take(2)
                .filter_map(|v| v.parse::<u64>().ok())
                .sum()
        })
        .unwrap_or(0);
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Usage {
        rss_kib: field("VmRSS:"),
        fds,
        threads: field("Threads:"),
        cpu_s: ticks as f64 / hz,
    }
}

/// Least-squares slope of `y` over `x`.
fn slope(points: &[(f64, f64)]) -> f64 {
    let n = points.len() as f64;
    if n < 2.0 {
        return 0.0;
    }
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    if sxx == 0.0 { 0.0 } else { sxy / sxx }
}

/// What a stream's check found.
#[derive(Debug, Default)]
struct StreamCheck {
    intervals: usize,
    /// Intervals that do not start where the previous one ended.
    gaps: usize,
    /// Interval domains where the parts do not add up to the measured.
    unbalanced: usize,
    /// The largest |attributed + idle + unattributed - measured| (J).
    worst_j: f64,
    /// Domain rows checked.
    rows: usize,
    summary: Option<Value>,
}

fn check_stream(path: &Path) -> Result<StreamCheck> {
    let text = std::fs::read_to_string(path).with_context(|| format!("{}", path.display()))?;
    let mut c = StreamCheck::default();
    let mut last_t: Option<u64> = None;
    for (i, line) in text.lines().enumerate() {
        let v: Value = serde_json::from_str(line)
            .with_context(|| format!("{} line {}", path.display(), i + 1))?;
        match v["type"].as_str() {
            Some("interval") => {
                c.intervals += 1;
                let t = v["t_ns"].as_u64().unwrap_or(0);
                let d = v["duration_ns"].as_u64().unwrap_or(0);
                if last_t.is_some_and(|l| t.saturating_sub(d) != l) {
                    c.gaps += 1;
                }
                last_t = Some(t);
                for d in v["domains"].as_array().into_iter().flatten() {
                    let g = |k: &str| d[k].as_f64().unwrap_or(f64::NAN);
                    let off = (g("attributed_j") + g("idle_j") + g("unattributed_j")
                        - g("measured_j"))
                    .abs();
                    c.rows += 1;
                    // Each figure is whole µJ printed in J: 3 roundings.
                    if off.is_nan() || off > 3e-6 {
                        c.unbalanced += 1;
                    }
                    c.worst_j = c.worst_j.max(off);
                }
            }
            Some("summary") => c.summary = Some(v),
            _ => {}
        }
    }
    Ok(c)
}

fn cgroup2_root() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        if post.split_whitespace().next() != Some("cgroup2") {
            return None;
        }
        pre.split_whitespace().nth(4).map(PathBuf::from)
    })
}

/// A local image for the soak's containers, or why there is none
/// (`scripts/busybox-image.sh`).
fn docker_image() -> Result<String, String> {
    const IMAGE: &str = "wattprof-soak-busybox:latest";
    let script = crate::workspace_root().join("scripts/busybox-image.sh");
    let out = Command::new("sh")
        .arg(&script)
        .arg(IMAGE)
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if out.status.success() {
        Ok(IMAGE.into())
    } else {
        Err(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// A churn thread.
type Worker = std::thread::JoinHandle<()>;

/// Starts `f` on a thread that runs until `stop`.
fn churn(
    name: &str,
    stop: &Arc<AtomicBool>,
    f: impl FnOnce(Arc<AtomicBool>) + Send + 'static,
) -> Result<Worker> {
    let stop = stop.clone();
    Ok(std::thread::Builder::new()
        .name(name.into())
        .spawn(move || f(stop))?)
}

fn scrape(addr: &str) -> bool {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return false;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    if write!(s, "GET /metrics HTTP/1.0\r\nHost: soak\r\n\r\n").is_err() {
        return false;
    }
    let mut body = Vec::new();
    // The exporter answers in the request's version: HTTP/1.0 here (the
    // check read `HTTP/1.1` only, and counted every scrape as failed).
    s.read_to_end(&mut body).is_ok() && body.starts_with(b"HTTP/1.0 200")
}

/// One sample: seconds since the start, the monitor's usage, the run's.
type Row = (f64, Usage, Usage);

/// A line of a chart: its label, colour, and value of a row.
type Line = (&'static str, plotters::style::RGBColor, fn(&Row) -> f64);

/// One chart of `lines` over time, in `area`.
fn chart(
    area: &plotters::drawing::DrawingArea<
        plotters::prelude::SVGBackend<'_>,
        plotters::coord::Shift,
    >,
    caption: &str,
    rows: &[Row],
    lines: &[Line],
) -> Result<()> {
    use plotters::prelude::*;
    let t_max = rows.last().map_or(1.0, |r| r.0 / 60.0).max(1.0);
    let y_max = rows
        .iter()
        .flat_map(|r| lines.iter().map(move |l| (l.2)(r)))
        .fold(1.0, f64::max)
        * 1.25;
    let mut chart = ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 18))
        .margin(10)
        .x_label_area_size(30)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..t_max, 0.0..y_max)?;
    chart.configure_mesh().x_desc("minutes").draw()?;
    for &(label, color, value) in lines {
        chart
            .draw_series(LineSeries::new(
                rows.iter().map(|r| (r.0 / 60.0, value(r))),
                color.stroke_width(2),
            ))?
            .label(label)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
    }
    chart.configure_series_labels().border_style(BLACK).draw()?;
    Ok(())
}

fn plot(path: &Path, rows: &[Row]) -> Result<()> {
    use plotters::prelude::*;
    let root = SVGBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE)?;
    let (top, bottom) = root.split_vertically(300);
    chart(
        &top,
        "wattprof RSS under churn (MiB)",
        rows,
        &[
            ("monitor", BLUE, |r| r.1.rss_kib as f64 / 1024.0),
            ("run", RED, |r| r.2.rss_kib as f64 / 1024.0),
        ],
    )?;
    chart(
        &bottom,
        "open fds and threads",
        rows,
        &[
            ("monitor fds", BLUE, |r| r.1.fds as f64),
            ("monitor threads", GREEN, |r| r.1.threads as f64),
            ("run fds", RED, |r| r.2.fds as f64),
        ],
    )?;
    root.present()?;
    Ok(())
}

/// Counters the churn threads add to.
#[derive(Default)]
struct Counters {
    spawned: AtomicU64,
    scrapes: AtomicU64,
    failed_scrapes: AtomicU64,
    cgroups_made: AtomicU64,
    containers_made: AtomicU64,
}

impl Counters {
    fn get(c: &AtomicU64) -> u64 {
        c.load(Ordering::Relaxed)
    }
}

/// The two wattprof instances under the soak, and the file that stops the
/// run's command.
struct Instances {
    monitor: Child,
    run: Child,
    stop_file: PathBuf,
}

impl Instances {
    /// Starts `wattprof monitor` (scraped on `addr`) and a `wattprof run`
    /// whose command opens a window of ~50 ms of CPU every second, named
    /// after a counter, until the stop file appears.
    fn start(wattprof: &Path, testload: &Path, out: &Path, addr: &str) -> Result<Self> {
        // Both logs first: an error after the first spawn would leave it
        // running.
        let monitor_log = std::fs::File::create(out.join("monitor.stderr"))?;
        let run_log = std::fs::File::create(out.join("run.stderr"))?;
        let mut monitor = Command::new(wattprof)
            .args(["monitor", "--interval", "1s", "--prometheus", addr])
            .arg("--jsonl")
            .arg(out.join("monitor.jsonl"))
            .stdout(Stdio::null())
            .stderr(monitor_log)
            .spawn()
            .context("starting wattprof monitor")?;
        let stop_file = out.join("stop");
        let script = format!(
            "i=0; while [ ! -e '{stop}' ]; do i=$((i+1)); '{tl}' window w$((i % 50)) 0.05 \
             >/dev/null; sleep 1; done",
            stop = stop_file.display(),
            tl = testload.display()
        );
        let run = Command::new(wattprof)
            .args(["run", "--interval", "1s"])
            .arg("--jsonl")
            .arg(out.join("run.jsonl"))
            .arg("--output")
            .arg(out.join("run.json"))
            .args(["--", "sh", "-c", &script])
            .stdout(Stdio::null())
            .stderr(run_log)
            .spawn();
        let run = match run {
            Ok(run) => run,
            Err(e) => {
                let _ = monitor.kill();
                return Err(e).context("starting wattprof run");
            }
        };
        let mut both = Instances {
            monitor,
            run,
            stop_file,
        };
        std::thread::sleep(Duration::from_secs(3));
        if let Some(why) = both.ended("ended at once")? {
            both.kill()?;
            bail!("{why}: see target/soak/*.stderr");
        }
        Ok(both)
    }

    /// Which instance has ended, if one has.
    fn ended(&mut self, when: &str) -> Result<Option<String>> {
        for (name, child) in [("monitor", &mut self.monitor), ("run", &mut self.run)] {
            if let Some(status) = child.try_wait()? {
                return Ok(Some(format!("wattprof {name} {when} ({status})")));
            }
        }
        Ok(None)
    }

    /// Both stopped at once (the run's loop told to stop first).
    fn kill(&mut self) -> Result<()> {
        let _ = self.monitor.kill();
        let _ = self.run.kill();
        std::fs::write(&self.stop_file, "")?;
        Ok(())
    }

    /// Both stopped as a user would: the run's command ends, the monitor
    /// gets SIGINT. Their exit statuses.
    fn stop(&mut self) -> Result<(std::process::ExitStatus, String)> {
        std::fs::write(&self.stop_file, "")?;
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.monitor.id() as i32, libc::SIGINT) };
        let m_status = self.monitor.wait()?;
        let r_status = wait_timeout(&mut self.run, Duration::from_secs(30))?;
        Ok((m_status, r_status))
    }
}

/// ~200 short processes a second.
fn churn_processes(counters: &Arc<Counters>, stop: &Arc<AtomicBool>) -> Result<Worker> {
    let counters = counters.clone();
    churn("procs", stop, move |stop| {
        let start = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let due = (start.elapsed().as_secs_f64() * 200.0) as u64;
            if Counters::get(&counters.spawned) >= due {
                std::thread::sleep(Duration::from_millis(2));
                continue;
            }
            if let Ok(mut c) = Command::new("/bin/true").spawn() {
                let _ = c.wait();
                counters.spawned.fetch_add(1, Ordering::Relaxed);
            }
        }
    })
}

/// Thread pools growing and shrinking: 1 to 64 threads, each living
/// 0.2-2 s with a little work.
fn churn_thread_pools(stop: &Arc<AtomicBool>) -> Result<Worker> {
    churn("pools", stop, move |stop| {
        let mut seed = 12345u64;
        let mut next = || {
            seed = seed
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            seed >> 33
        };
        while !stop.load(Ordering::Relaxed) {
            let n = 1 + next() % 64;
            let pool: Vec<_> = (0..n)
                .map(|_| {
                    let life = Duration::from_millis(200 + next() % 1800);
                    std::thread::spawn(move || {
                        let end = Instant::now() + life;
                        while Instant::now() < end {
                            let t = Instant::now();
                            while t.elapsed() < Duration::from_micros(100) {
                                std::hint::spin_loop();
                            }
                            std::thread::sleep(Duration::from_millis(20));
                        }
                    })
                })
                .collect();
            for t in pool {
                let _ = t.join();
            }
        }
    })
}

/// A cgroup every 3 s under `base`: a process burns 0.1 s in it, then it
/// is removed.
fn churn_cgroups(
    base: PathBuf,
    testload: &Path,
    counters: &Arc<Counters>,
    stop: &Arc<AtomicBool>,
) -> Result<Worker> {
    std::fs::create_dir_all(&base).context("creating the soak's cgroup")?;
    let counters = counters.clone();
    let tl = testload.to_path_buf();
    churn("cgroups", stop, move |stop| {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let dir = base.join(format!("c{n}"));
            if std::fs::create_dir(&dir).is_ok() {
                let script = format!(
                    "echo $$ > '{}/cgroup.procs' && exec '{}' cpu 0.1",
                    dir.display(),
                    tl.display()
                );
                if let Ok(mut c) = Command::new("sh")
                    .args(["-c", &script])
                    .stdout(Stdio::null())
                    .spawn()
                {
                    let _ = c.wait();
                }
                // The burner has exited: the cgroup is empty.
                for _ in 0..50 {
                    if std::fs::remove_dir(&dir).is_ok() {
                        break;
                    }
                    std::thread::sleep(Duration::from_millis(20));
                }
                counters.cgroups_made.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_secs(3));
        }
        let _ = std::fs::remove_dir(&base);
    })
}

/// A Docker container of `image` every 5 s: each burns a little CPU in its
/// own cgroup, then is removed (--rm).
fn churn_containers(
    image: String,
    counters: &Arc<Counters>,
    stop: &Arc<AtomicBool>,
) -> Result<Worker> {
    let counters = counters.clone();
    churn("containers", stop, move |stop| {
        let mut n = 0u64;
        while !stop.load(Ordering::Relaxed) {
            n += 1;
            let ok = Command::new("docker")
                .args([
                    "run",
                    "--rm",
                    "--name",
                    &format!("wp-soak-{}-{n}", std::process::id()),
                ])
                .arg(&image)
                .args([
                    "sh",
                    "-c",
                    "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done",
                ])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                counters.containers_made.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_secs(5));
        }
    })
}

/// `/metrics` on `addr` 10 times a second.
fn churn_scrapes(addr: String, counters: &Arc<Counters>, stop: &Arc<AtomicBool>) -> Result<Worker> {
    let counters = counters.clone();
    churn("scrape", stop, move |stop| {
        while !stop.load(Ordering::Relaxed) {
            if scrape(&addr) {
                counters.scrapes.fetch_add(1, Ordering::Relaxed);
            } else {
                counters.failed_scrapes.fetch_add(1, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    })
}

/// Starts every churn thread into `threads` (those started stay there on
/// an error, to be stopped); what was started, in words.
fn start_churn(
    testload: &Path,
    addr: &str,
    counters: &Arc<Counters>,
    stop: &Arc<AtomicBool>,
    threads: &mut Vec<Worker>,
) -> Result<String> {
    threads.push(churn_processes(counters, stop)?);
    threads.push(churn_thread_pools(stop)?);
    threads.push(churn_scrapes(addr.to_string(), counters, stop)?);
    let cgroup_note = match cgroup2_root() {
        Some(root) => {
            let base = root.join(format!("wattprof-soak-{}", std::process::id()));
            let note = format!("cgroups under {}", base.display());
            threads.push(churn_cgroups(base, testload, counters, stop)?);
            note
        }
        None => "no cgroup2 mount: no cgroups created".into(),
    };
    let docker_note = match docker_image() {
        Ok(image) => {
            threads.push(churn_containers(image, counters, stop)?);
            "a Docker container every 5 s".to_string()
        }
        Err(why) => format!("no containers ({why})"),
    };
    Ok(format!("{cgroup_note}; {docker_note}"))
}

/// Stops the churn threads and waits for them.
fn stop_churn(stop: &AtomicBool, threads: Vec<Worker>) {
    stop.store(true, Ordering::Relaxed);
    for t in threads {
        let _ = t.join();
    }
}

/// Samples both instances every 10 s for `minutes` into `csv` and the
/// rows; an error (everything stopped) when one ends on its own.
fn sample(
    both: &mut Instances,
    counters: &Counters,
    minutes: f64,
    csv: &mut std::fs::File,
) -> Result<Vec<Row>> {
    let start = Instant::now();
    let mut rows: Vec<Row> = Vec::new();
    writeln!(
        csv,
        "t_s,monitor_rss_kib,monitor_fds,monitor_threads,monitor_cpu_s,run_rss_kib,run_fds,\
         run_threads,run_cpu_s,processes_spawned,scrapes"
    )?;
    let end = Duration::from_secs_f64(minutes * 60.0);
    while start.elapsed() < end {
        std::thread::sleep(Duration::from_secs(10).min(end.saturating_sub(start.elapsed())));
        let t = start.elapsed().as_secs_f64();
        let (m, r) = (usage(both.monitor.id()), usage(both.run.id()));
        writeln!(
            csv,
            "{t:.1},{},{},{},{:.2},{},{},{},{:.2},{},{}",
            m.rss_kib,
            m.fds,
            m.threads,
            m.cpu_s,
            r.rss_kib,
            r.fds,
            r.threads,
            r.cpu_s,
            Counters::get(&counters.spawned),
            Counters::get(&counters.scrapes)
        )?;
        rows.push((t, m, r));
        if let Some(why) = both.ended("ended during the soak")? {
            bail!("{why}");
        }
    }
    Ok(rows)
}

/// One instance's verdict: its series judged, its stream checked, its
/// exit status.
type Verdict<'a> = (&'a str, Judged, &'a StreamCheck, String);

/// The soak's summary: what churned, then each instance's figures.
fn summary(counters: &Counters, elapsed: f64, warmup_minutes: f64, verdicts: &[Verdict]) -> String {
    use std::fmt::Write as _;
    let mut summary = String::new();
    let spawned = Counters::get(&counters.spawned);
    let _ = writeln!(
        summary,
        "soak: {:.1} min; {spawned} processes spawned ({:.0}/s), {} cgroups made and removed, \
         {} containers run and removed, {} scrapes ({} failed)",
        elapsed / 60.0,
        spawned as f64 / elapsed,
        Counters::get(&counters.cgroups_made),
        Counters::get(&counters.containers_made),
        Counters::get(&counters.scrapes),
        Counters::get(&counters.failed_scrapes),
    );
    for (name, j, check, status) in verdicts {
        let _ = writeln!(
            summary,
            "  {name}: RSS {:.1}-{:.1} MiB after {warmup_minutes} min, growth {:+.0} KiB/h; fds \
             growth {:+.1}/h; threads {:.0}-{:.0}; CPU {:.2}% of one CPU; {} intervals, {} \
             missing, {} of {} domain rows unbalanced (worst {:.1e} J); exit {status}",
            j.rss_kib.0 / 1024.0,
            j.rss_kib.1 / 1024.0,
            j.rss_growth,
            j.fds_growth,
            j.threads.0,
            j.threads.1,
            j.cpu_pct,
            check.intervals,
            check.gaps,
            check.unbalanced,
            check.rows,
            check.worst_j,
        );
        if let Some(s) = &check.summary {
            let (docker, named) = soak_containers(s);
            let _ = writeln!(
                summary,
                "    events lost {}, lost CPU time {} ns, filter overflow {}, kernel memory {} KiB, \
                 {} cgroup rows, {docker} Docker containers ({named} named), problems {}",
                s["profiler"]["events_lost"],
                s["lost_ns"],
                s["profiler"]["filter_overflow"],
                s["profiler"]["kernel_memory_bytes"].as_u64().unwrap_or(0) / 1024,
                s["cgroups"].as_array().map_or(0, Vec::len),
                s["energy"]["problems"]
            );
        }
    }
    summary
}

/// Fails the soak where a stream has a gap or does not add up, the
/// containers went unnamed, an instance did not exit cleanly, or one grew
/// after the warm-up.
fn judge_all(verdicts: &[Verdict], containers: u64, monitor_ok: bool) -> Result<()> {
    let (m_check, r_check) = (verdicts[0].2, verdicts[1].2);
    if m_check.gaps + r_check.gaps + m_check.unbalanced + r_check.unbalanced > 0 {
        bail!("an interval is missing or does not add up (see above)");
    }
    let named = m_check.summary.as_ref().map_or(0, |s| soak_containers(s).1);
    if containers > 0 && named == 0 {
        bail!("{containers} containers ran, and the monitor's recording names none");
    }
    if m_check.rows == 0 || r_check.rows == 0 {
        bail!("a stream has no energy rows to check");
    }
    if !monitor_ok || !verdicts[1].3.starts_with("exit status: 0") {
        bail!("wattprof did not exit cleanly (see above)");
    }
    // Flat after warm-up: RSS within 4 MiB/h, fds within 10/h.
    for (name, j, _, _) in verdicts {
        if j.rss_growth > 4096.0 || j.fds_growth > 10.0 {
            bail!(
                "{name} grows after warm-up: {:+.0} KiB/h, {:+.1} fds/h",
                j.rss_growth,
                j.fds_growth
            );
        }
    }
    Ok(())
}

/// Runs the soak for `minutes`, judging growth after `warmup_minutes`.
pub fn soak(wattprof: &Path, testload: &Path, minutes: f64, warmup_minutes: f64) -> Result<()> {
    let out = crate::workspace_root().join("target/soak");
    let _ = std::fs::remove_dir_all(&out);
    std::fs::create_dir_all(&out)?;
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let addr = format!("127.0.0.1:{port}");
    let mut csv = std::fs::File::create(out.join("series.csv"))?;
    let mut both = Instances::start(wattprof, testload, &out, &addr)?;
    let stop = Arc::new(AtomicBool::new(false));
    let counters = Arc::new(Counters::default());
    let mut threads = Vec::new();
    let what = match start_churn(testload, &addr, &counters, &stop, &mut threads) {
        Ok(what) => what,
        Err(e) => {
            stop_churn(&stop, threads);
            both.kill()?;
            return Err(e);
        }
    };
    eprintln!(
        "soak: {minutes} min of churn ({what}); samples every 10 s to target/soak/series.csv"
    );
    let start = Instant::now();
    let rows = sample(&mut both, &counters, minutes, &mut csv);
    // Everything stops before a verdict: churn, then both instances.
    stop_churn(&stop, threads);
    let rows = match rows {
        Ok(rows) => rows,
        Err(e) => {
            both.kill()?;
            return Err(e);
        }
    };
    let elapsed = start.elapsed().as_secs_f64();
    let (m_status, r_status) = both.stop()?;
    plot(&out.join("soak.svg"), &rows)?;
    let (m_check, r_check) = (
        check_stream(&out.join("monitor.jsonl"))?,
        check_stream(&out.join("run.jsonl"))?,
    );
    let warmup_s = warmup_minutes * 60.0;
    let verdicts = [
        (
            "monitor",
            judge(&rows, |r| r.1, warmup_s),
            &m_check,
            m_status.to_string(),
        ),
        ("run", judge(&rows, |r| r.2, warmup_s), &r_check, r_status),
    ];
    let summary = summary(&counters, elapsed, warmup_minutes, &verdicts);
    print!("{summary}");
    std::fs::write(out.join("summary.txt"), &summary)?;
    eprintln!("series: target/soak/series.csv, plot: target/soak/soak.svg");
    judge_all(
        &verdicts,
        Counters::get(&counters.containers_made),
        m_status.success(),
    )
}

/// One wattprof instance's series, judged after the warm-up.
struct Judged {
    /// Lowest and highest RSS (KiB).
    rss_kib: (f64, f64),
    /// Least-squares growth (KiB/h).
    rss_growth: f64,
    /// Least-squares growth of open fds (per hour).
    fds_growth: f64,
    /// Fewest and most threads.
    threads: (f64, f64),
    /// CPU over the whole soak (% of one CPU).
    cpu_pct: f64,
}

fn judge(rows: &[Row], pick: fn(&Row) -> Usage, warmup_s: f64) -> Judged {
    let after = |value: fn(&Usage) -> f64| -> Vec<(f64, f64)> {
        rows.iter()
            .filter(|r| r.0 >= warmup_s)
            .map(|r| (r.0 / 3600.0, value(&pick(r))))
            .collect()
    };
    let range = |value: fn(&Usage) -> f64| {
        after(value)
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), p| {
                (lo.min(p.1), hi.max(p.1))
            })
    };
    let (first, last) = (rows.first(), rows.last());
    let span = last.map_or(1.0, |r| r.0) - first.map_or(0.0, |r| r.0);
    let cpu = |r: Option<&Row>| r.map_or(0.0, |r| pick(r).cpu_s);
    Judged {
        rss_kib: range(|u| u.rss_kib as f64),
        rss_growth: slope(&after(|u| u.rss_kib as f64)),
        fds_growth: slope(&after(|u| u.fds as f64)),
        threads: range(|u| u.threads as f64),
        cpu_pct: 100.0 * (cpu(last) - cpu(first)) / span.max(1.0),
    }
}

/// Docker containers in a stream's summary, and how many carry the name
/// the soak gave them.
fn soak_containers(summary: &Value) -> (usize, usize) {
    let docker: Vec<&Value> = summary["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["runtime"] == "docker")
        .collect();
    let named = docker
        .iter()
        .filter(|c| {
            c["name"]
                .as_str()
                .is_some_and(|n| n.starts_with("wp-soak-"))
        })
        .count();
    (docker.len(), named)
}

fn wait_timeout(child: &mut Child, limit: Duration) -> Result<String> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait()? {
            return Ok(s.to_string());
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            return Ok("killed after 30 s".into());
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}
