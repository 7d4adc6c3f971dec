//! `wattprof report`: read a recording or a stream back, compare two runs,
//! plot them, write codecarbon's CSV. Needs no root and loads nothing.

use std::io::Write;
use std::path::{Path, PathBuf};

use super::Fatal;
use crate::report::{self, Loaded};

/// Exit code for a file that cannot be read back.
pub(crate) const EXIT_BAD_FILE: i32 = 1;
pub(crate) use super::EXIT_USAGE;

/// Options of `wattprof report`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    wattprof report run.json                      totals per domain, group, process, window\n  \
    wattprof report run.jsonl                     the same from a --jsonl stream, even one cut short\n  \
    wattprof report --metrics run.json            what the file holds (AIPowerMeter's names too)\n  \
    wattprof report before.json after.json        what changed: energy, time, power, per name\n  \
    wattprof report run.json --html run.html      self-contained page with the plots\n  \
    wattprof report run.json --csv emissions.csv  append a row in codecarbon's layout\n  \
    wattprof report jobs/slurm-1234.json node2/slurm-1234.json\n                                                  a batch job's energy per node and summed\n  \
    wattprof report --comment slurm-1234.json     one line for Slurm's AdminComment\n\n\
    Exit status: 0; 1 when a file cannot be read back or written (one line says why); 2 for\n    options that do not go together.")]
pub(crate) struct ReportArgs {
    /// A recording (`--output`), a `--jsonl` stream, or a stream cut short
    /// (every complete line is read, and where it was cut is printed). Give two to
    /// compare: the first is the baseline. Or any number of the job files
    /// `monitor --jobs-dir` writes (several nodes' files of a job are summed).
    #[arg(value_name = "FILE", required = true, num_args = 1..)]
    pub(crate) files: Vec<PathBuf>,

    /// With job files: print one line for a scheduler's job record, the
    /// job's joules summed over the files (`wattprof:total_j=...,nodes=...`;
    /// deploy/slurm-epilog.sh stores it in Slurm's AdminComment).
    #[arg(long)]
    pub(crate) comment: bool,

    /// Print JSON for scripts (the totals, the metrics or the comparison)
    /// instead of a table.
    #[arg(long)]
    pub(crate) json: bool,

    /// List the figures the file holds, where they are, and AIPowerMeter's
    /// names for them.
    #[arg(long)]
    pub(crate) metrics: bool,

    /// Show each process's command line at the end of its row, where the
    /// profile was made with --cmdline (a stream cut before its summary
    /// line has names only).
    #[arg(long)]
    pub(crate) cmdline: bool,

    /// Processes shown in the table (most energy first; --json has all).
    #[arg(long, default_value_t = 20, value_name = "N")]
    pub(crate) top: usize,

    /// Write the plots as one SVG: power per domain over time, stacked
    /// power of the top processes with windows shaded, energy per window.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,

    /// Write a self-contained HTML page: the totals as tables and the
    /// plots (no script, nothing fetched).
    #[arg(long, value_name = "FILE.html")]
    pub(crate) html: Option<PathBuf>,

    /// Append one row to FILE in codecarbon's emissions.csv layout (a new
    /// file gets the header; a CSV with other columns is refused).
    #[arg(long, value_name = "FILE")]
    pub(crate) csv: Option<PathBuf>,

    /// Write FILE: one CSV row per interval and domain (energy in J and
    /// kWh, power in W, emissions in kg).
    #[arg(long, value_name = "FILE")]
    pub(crate) csv_intervals: Option<PathBuf>,

    /// With job files: also write FILE, one CSV row per job and node
    /// (scheduler, job_id, user, node, first and last UTC, on-CPU s, J per
    /// domain, total, static, dynamic, g CO2; a domain the node did not
    /// read is empty, not 0).
    #[arg(long, value_name = "FILE")]
    pub(crate) jobs_csv: Option<PathBuf>,
}

fn usage(message: String) -> anyhow::Error {
    Fatal {
        code: EXIT_USAGE,
        message,
    }
    .into()
}

/// A file that cannot be read back or written: exit code 1.
fn fail(message: String) -> anyhow::Error {
    Fatal {
        code: EXIT_BAD_FILE,
        message,
    }
    .into()
}

fn bad_file(e: report::ReadError) -> anyhow::Error {
    fail(e.to_string())
}

/// Writes `data` to `path` through a temporary file renamed into place,
/// so a failed write never leaves half a plot.
fn write_whole(path: &Path, data: &[u8], what: &str) -> anyhow::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".wattprof-tmp");
    let tmp = PathBuf::from(tmp);
    let result = std::fs::write(&tmp, data).and_then(|()| std::fs::rename(&tmp, path));
    if let Err(e) = result {
        let _ = std::fs::remove_file(&tmp);
        return Err(fail(format!(
            "cannot write {what} {}: {e} (check that the directory exists and is writable)",
            path.display()
        )));
    }
    Ok(())
}

/// Whether `path` starts as a job file does (`"type": "wattprof_job"`
/// near its start): a cheap look, so a large recording is not parsed
/// twice; [`report::jobs::read`] checks it whole.
fn looks_like_job_file(path: &Path) -> bool {
    use std::io::Read;
    let mut head = Vec::with_capacity(512);
    std::fs::File::open(path)
        .and_then(|f| f.take(512).read_to_end(&mut head))
        .is_ok()
        && head.windows(14).any(|w| w == b"\"wattprof_job\"")
}

/// `wattprof report` of job files: a table per job (a row per node and
/// their sum), `--json`, or `--comment`'s line.
fn execute_jobs(args: &ReportArgs) -> anyhow::Result<i32> {
    if let Some(other) = args.files.iter().find(|p| !looks_like_job_file(p)) {
        return Err(usage(format!(
            "{} is not a batch job's file (written by `monitor --jobs-dir`): job files are \
             reported together, and --comment reads only them; give a recording on its own",
            other.display()
        )));
    }
    let not_for_jobs = [
        (args.metrics, "--metrics"),
        (args.cmdline, "--cmdline"),
        (args.plot.is_some(), "--plot"),
        (args.html.is_some(), "--html"),
        (args.csv.is_some(), "--csv"),
        (args.csv_intervals.is_some(), "--csv-intervals"),
        (args.comment && args.json, "--json"),
    ];
    if let Some((_, flag)) = not_for_jobs.iter().find(|(on, _)| *on) {
        return Err(usage(format!(
            "{flag} does not apply to job files (they hold a job's totals, not its intervals \
             or processes): give the node's recording, or leave {flag} out"
        )));
    }
    let files = args
        .files
        .iter()
        .map(|p| report::jobs::read(p).map(|(f, d)| (p.clone(), f, d)))
        .collect::<Result<Vec<_>, _>>()
        .map_err(bad_file)?;
    let jobs = report::jobs::gather(files).map_err(fail)?;
    if let Some(path) = &args.jobs_csv {
        let csv =
            report::jobs::csv(&jobs).map_err(|e| fail(format!("encoding --jobs-csv: {e}")))?;
        write_whole(path, &csv, "--jobs-csv")?;
        eprintln!(
            "wattprof: {} rows written to {}",
            jobs.iter().map(|j| j.nodes.len()).sum::<usize>(),
            path.display()
        );
    }
    let text = if args.comment {
        report::jobs::comment(&jobs).map_err(usage)? + "\n"
    } else if args.json {
        // A domain no node read has no field (no reader is not 0).
        let read = report::jobs::read_by_any(&jobs);
        crate::model::unread::writing(read, || serde_json::to_string_pretty(&jobs))? + "\n"
    } else {
        report::jobs::render(&jobs)
    };
    print_out(&text)?;
    Ok(0)
}

/// Runs `wattprof report`; returns the exit code.
pub(crate) fn execute(args: ReportArgs) -> anyhow::Result<i32> {
    if args.comment || args.files.iter().any(|p| looks_like_job_file(p)) {
        return execute_jobs(&args);
    }
    if args.jobs_csv.is_some() {
        return Err(usage(
            "--jobs-csv reads the job files `monitor --jobs-dir` writes, not a recording".into(),
        ));
    }
    if args.files.len() > 2 {
        return Err(usage(format!(
            "{} files given: report reads one file, or two to compare (the first is the \
             baseline); only job files (`monitor --jobs-dir`) are read several at once",
            args.files.len()
        )));
    }
    if args.files.len() == 2 {
        let only_one = [
            (args.metrics, "--metrics"),
            (args.plot.is_some(), "--plot"),
            (args.html.is_some(), "--html"),
            (args.csv.is_some(), "--csv"),
            (args.csv_intervals.is_some(), "--csv-intervals"),
        ];
        if let Some((_, flag)) = only_one.iter().find(|(on, _)| *on) {
            return Err(usage(format!(
                "{flag} reads one file; `wattprof report A B` compares two (as a table or \
                 --json): run `wattprof report FILE {flag} ...` for each"
            )));
        }
        let a = report::load(&args.files[0]).map_err(bad_file)?;
        let b = report::load(&args.files[1]).map_err(bad_file)?;
        let c = report::compare::compare(&a.summary, &b.summary);
        let text = if args.json {
            serde_json::to_string_pretty(&c)? + "\n"
        } else {
            report::render::render_comparison(&c)
        };
        print_out(&text)?;
        return Ok(0);
    }
    if let Some(csv) = &args.csv {
        // Before reading: a foreign CSV is refused without work.
        crate::sink::csv::check(csv).map_err(fail)?;
    }
    let loaded = report::load(&args.files[0]).map_err(bad_file)?;
    let text = match (args.metrics, args.json) {
        (true, true) => serde_json::to_string_pretty(&report::metrics::list(&loaded))? + "\n",
        (true, false) => {
            report::render::render_metrics(&loaded.summary.file, &report::metrics::list(&loaded))
        }
        (false, true) => {
            crate::model::unread::writing(loaded.summary.read(), || {
                serde_json::to_string_pretty(&loaded.summary)
            })? + "\n"
        }
        (false, false) => report::render::render_summary(&loaded.summary, args.top, args.cmdline),
    };
    print_out(&text)?;
    write_files(&args, &loaded)?;
    Ok(0)
}

/// Prints to stdout; a closed pipe (`| head`) is not an error, a full disk
/// is.
fn print_out(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(fail(format!("writing to stdout: {e}")))
        }
        _ => Ok(()),
    }
}

fn write_files(args: &ReportArgs, l: &Loaded) -> anyhow::Result<()> {
    let plot_err = |e: report::plot::PlotError| fail(e.to_string());
    // What was written is printed even when a later output fails.
    struct Said(Vec<String>);
    impl Drop for Said {
        fn drop(&mut self) {
            for line in &self.0 {
                eprintln!("wattprof: {line}");
            }
        }
    }
    let mut said = Said(Vec::new());
    if let Some(path) = &args.csv_intervals {
        let s = &l.summary;
        let encode = || -> Result<Vec<u8>, String> {
            let mut w = csv::WriterBuilder::new().from_writer(Vec::new());
            w.write_record(crate::sink::csv::INTERVAL_COLUMNS)
                .map_err(|e| e.to_string())?;
            for iv in &l.intervals {
                for row in crate::sink::csv::interval_rows(
                    iv,
                    s.start_unix_ns,
                    s.carbon_intensity_g_per_kwh,
                ) {
                    w.write_record(&row).map_err(|e| e.to_string())?;
                }
            }
            w.into_inner().map_err(|e| e.to_string())
        };
        let out = encode().map_err(|e| fail(format!("encoding --csv-intervals: {e}")))?;
        write_whole(path, &out, "--csv-intervals")?;
        said.0.push(format!(
            "{} intervals written to {}",
            l.intervals.len(),
            path.display()
        ));
    }
    if let Some(path) = &args.csv {
        let row = crate::sink::csv::emissions_row(
            l.summary.emissions(),
            crate::sink::csv::ram_total_gb(),
            &crate::sink::csv::uuid4(),
        );
        crate::sink::csv::append(path, &row).map_err(fail)?;
        said.0
            .push(format!("emissions row appended to {}", path.display()));
    }
    if let Some(path) = &args.plot {
        let svg = report::plot::svg(l).map_err(plot_err)?;
        write_whole(path, svg.as_bytes(), "--plot")?;
        said.0.push(format!("plots written to {}", path.display()));
    }
    if let Some(path) = &args.html {
        let html = report::plot::html(l).map_err(plot_err)?;
        write_whole(path, html.as_bytes(), "--html")?;
        said.0.push(format!("page written to {}", path.display()));
    }
    drop(said);
    Ok(())
}
