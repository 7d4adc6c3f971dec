//! `wattprof calibrate`: a load staircase against a wattmeter, and the
//! wall power fitted as a linear function of the counters (or of CPU
//! utilization where there is none); with no wattmeter, the host power
//! model (`host_model`). The staircase itself (the load, its steps and
//! windows) is [`crate::staircase`]; this parses, checks and fits.

mod gpu;
mod host_model;

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::Duration;

use super::Fatal;
use super::setup::parse_interval;
use crate::profile::ReaderConfig;
use crate::sources::Source;
use crate::sources::calibration::{Calibration, Point, Regressor, fit};
use crate::sources::estimate::{ModelChoice, ModelRequest};
use crate::sources::registry::Readers;
use crate::sources::wattmeter::{Line, Wattmeter, default_power_column, parse_line};
use crate::staircase::{Step, StepLoad, climb, measure};

/// Arguments of `wattprof calibrate`.
#[derive(clap::Args, Debug)]
#[command(after_help = "Examples:\n  \
    sudo wattprof calibrate --wattmeter-cmd \"wattmetre-read --tty=/dev/ttyUSB0 --nb=6\"\n  \
    sudo wattprof calibrate --wattmeter-log /var/log/wattmeter.log --step 20s -o node.json\n  \
    sudo wattprof calibrate\n\n\
    With no wattmeter, it fits each CPU energy domain's power as static + k x busy CPUs, \
    measures each NVIDIA GPU's idle power (no context open) and held power (one context of \
    its own open, through the CUDA driver; no PyTorch needed), and writes the host power \
    model (-o, else $WATTPROF_HOST_MODEL, else /var/lib/wattprof/power-model.json), where \
    `run` and `monitor` find it: each program then gets the dynamic energy it caused plus \
    its share of the static power, whatever runs beside it and however soon it opens its \
    GPU context. `--gpu-only` measures the GPUs and keeps the model's CPU fits.\n\n\
    Keep the machine otherwise quiet while it runs: every watt is fitted. With a wattmeter, \
    `wattprof run --calibration node.json -- CMD` reports wall energy per process.")]
pub(crate) struct CalibrateArgs {
    /// Follow this OmegaWatt wattmetre-read log being written (without a
    /// wattmeter, the host power model is made instead).
    #[arg(long, value_name = "FILE")]
    pub(crate) wattmeter_log: Option<PathBuf>,

    /// Start this wattmeter program and read its output.
    #[arg(long, value_name = "CMD", conflicts_with = "wattmeter_log")]
    pub(crate) wattmeter_cmd: Option<String>,

    /// The wattmeter outlet the machine is plugged into (1-based).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) wattmeter_outlet: u32,

    /// How long each step of the staircase lasts (idle, then 1 to N CPUs
    /// busy, then the GPU load if given). The first quarter of a step
    /// (at most 2 s) settles and is not fitted.
    #[arg(long, default_value = "10s", value_parser = parse_interval)]
    pub(crate) step: Duration,

    /// A command that keeps the GPUs busy, run alone as the last step
    /// (e.g. a short training script); without it no GPU step is made.
    #[arg(long, value_name = "CMD")]
    pub(crate) gpu_load: Option<String>,

    /// Where to write the calibration [default: wattprof-calibration.json;
    /// with no wattmeter, the host power model at
    /// /var/lib/wattprof/power-model.json].
    #[arg(long, short, value_name = "FILE")]
    pub(crate) output: Option<PathBuf>,

    /// Do not read NVIDIA GPUs.
    #[arg(long, conflicts_with = "gpu_only")]
    pub(crate) no_gpu: bool,

    /// With no wattmeter: measure the GPUs' idle and held power only, and
    /// keep the CPU fits the host power model already has.
    #[arg(long)]
    pub(crate) gpu_only: bool,

    /// Load NVML from this path instead of the driver's
    /// libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    pub(crate) nvml_lib: Option<std::ffi::OsString>,

    /// Load the CUDA driver API from this path instead of libcuda.so.1
    /// (the held power's context).
    #[arg(long, value_name = "PATH")]
    pub(crate) cuda_lib: Option<std::ffi::OsString>,

    /// Read CPU energy counters from this copy of /sys (testing).
    #[arg(long, value_name = "DIR", hide = true)]
    pub(crate) energy_sysfs: Option<PathBuf>,
}

/// Now, in ns since the Unix epoch (a file's creation time).
fn unix_now_ns() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos() as u64)
}

/// The readers of a calibration: only what is measured is fitted (no
/// power model), and the wattmeter is read by calibrate itself, for its
/// frames' times.
fn measured_only(args: &CalibrateArgs, no_gpu: bool) -> ReaderConfig {
    ReaderConfig {
        sys: args.energy_sysfs.clone(),
        model: ModelRequest {
            choice: ModelChoice::None,
            ..Default::default()
        },
        powercap_root: None,
        no_gpu,
        nvml_lib: args.nvml_lib.clone(),
        wattmeter_log: None,
        wattmeter_cmd: None,
        wattmeter_outlet: args.wattmeter_outlet,
        calibration: None,
    }
}

/// Runs `wattprof calibrate`.
pub(crate) fn execute(args: CalibrateArgs) -> anyhow::Result<i32> {
    if args.wattmeter_log.is_none() && args.wattmeter_cmd.is_none() {
        return host_model::execute(&args);
    }
    if args.gpu_only {
        return Err(Fatal::usage(
            "--gpu-only measures the GPUs for the host power model, with no wattmeter: leave out \
             --wattmeter-log/--wattmeter-cmd, or --gpu-only",
        )
        .into());
    }
    let output = args
        .output
        .clone()
        .unwrap_or_else(|| PathBuf::from("wattprof-calibration.json"));
    let cfg = measured_only(&args, args.no_gpu);
    check_output_dir(&output)?;
    if let Some(log) = &args.wattmeter_log {
        check_log_header(log, args.wattmeter_outlet)?;
    }
    let mut readers = Readers::open(&cfg).map_err(|e| Fatal::profiler(e.to_string()))?;
    let mut meter = match (&args.wattmeter_log, &args.wattmeter_cmd) {
        (Some(log), _) => Wattmeter::open_file(log, args.wattmeter_outlet),
        (None, Some(cmd)) => Wattmeter::spawn(&super::split_command(cmd), args.wattmeter_outlet),
        (None, None) => unreachable!("clap requires one"),
    }
    .map_err(|e| Fatal::profiler(e.to_string()))?;
    let regressor = if readers.has_cpu() {
        Regressor::CountersW
    } else {
        Regressor::BusyCpus
    };
    let mut used: Vec<String> = readers
        .used()
        .iter()
        .filter(|u| u.name != "none")
        .map(|u| format!("{} {}: {}", u.kind, u.name, u.detail))
        .collect();
    used.push(format!("wall wattmeter: {}", meter.info().location));
    check_gpu_load(&args, &readers, regressor)?;
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let (points, problems) =
        climb_against_the_wall(&args, &mut readers, &mut meter, regressor, cpus)?;
    fit_and_write(&output, points, &problems, regressor, used, cpus)
}

/// The directory `--output` goes in must exist.
fn check_output_dir(output: &std::path::Path) -> Result<(), Fatal> {
    let out_dir = output
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(std::path::Path::new("."));
    if !out_dir.is_dir() {
        return Err(Fatal::profiler(format!(
            "cannot write --output {}: {} is not a directory",
            output.display(),
            out_dir.display()
        )));
    }
    Ok(())
}

/// A `--wattmeter-log` must be readable and have the outlet's column.
fn check_log_header(log: &std::path::Path, outlet: u32) -> Result<(), Fatal> {
    let text = std::fs::read(log).map_err(|e| {
        Fatal::profiler(format!(
            "cannot read --wattmeter-log {}: {e} (start the wattmeter's logging first)",
            log.display()
        ))
    })?;
    let first = String::from_utf8_lossy(&text[..text.len().min(4096)])
        .lines()
        .next()
        .unwrap_or_default()
        .to_string();
    if let Line::Header { power_column: None } =
        parse_line(&first, outlet, default_power_column(outlet))
    {
        return Err(Fatal::profiler(format!(
            "--wattmeter-log {}: its header has no #activepow{outlet} column (give the \
                 --wattmeter-outlet the machine is plugged into)",
            log.display()
        )));
    }
    Ok(())
}

/// A `--gpu-load` step needs the GPUs read and a CPU counter to fit
/// against.
fn check_gpu_load(
    args: &CalibrateArgs,
    readers: &Readers,
    regressor: Regressor,
) -> Result<(), Fatal> {
    if args.gpu_load.is_some() && (args.no_gpu || readers.gpus().is_empty()) {
        return Err(Fatal::profiler(
            "--gpu-load needs the GPUs read (NVML found none, or --no-gpu): a GPU step whose \
             power no counter sees would bend the fit",
        ));
    }
    if args.gpu_load.is_some() && regressor == Regressor::BusyCpus {
        return Err(Fatal::profiler(
            "--gpu-load needs a CPU energy counter: against busy CPUs, a GPU step's power \
             is not explained and would bend the fit",
        ));
    }
    Ok(())
}

/// The staircase against the wattmeter: its points, and the problems
/// reading met.
fn climb_against_the_wall(
    args: &CalibrateArgs,
    readers: &mut Readers,
    meter: &mut Wattmeter,
    regressor: Regressor,
    cpus: usize,
) -> Result<(Vec<Point>, Vec<String>), Fatal> {
    let mut steps: Vec<Step> = (0..=cpus)
        .map(|n| Step {
            name: format!("{n} CPUs busy"),
            load: StepLoad::Cpus(n),
        })
        .collect();
    if let Some(cmd) = &args.gpu_load {
        steps.push(Step {
            name: format!("GPU load: {cmd}"),
            load: StepLoad::Command(cmd.clone()),
        });
    }
    eprintln!(
        "wattprof calibrate: {} steps of {:.1} s ({}), fitting wall power against {}",
        steps.len(),
        args.step.as_secs_f64(),
        steps
            .iter()
            .map(|s| s.name.as_str())
            .collect::<Vec<_>>()
            .join(", "),
        regressor.describe()
    );
    let points: RefCell<Vec<Point>> = RefCell::default();
    let mut problems = Vec::new();
    climb(
        &steps,
        args.step,
        |name, window| {
            let w = measure(readers, meter, window, cpus as f64);
            problems.extend(w.problems);
            // A window with no good frame span is no point.
            let Some(wall_w) = w.wall_w else {
                return false;
            };
            points.borrow_mut().push(Point {
                step: name.to_string(),
                x: match regressor {
                    Regressor::CountersW => w.counters_uj as f64 / 1e6 / w.counter_s,
                    Regressor::BusyCpus => w.busy,
                },
                wall_w,
            });
            true
        },
        |name, got| {
            let points = points.borrow();
            let mean = |f: fn(&Point) -> f64| {
                points.iter().rev().take(got).map(f).sum::<f64>() / got.max(1) as f64
            };
            if got == 0 {
                eprintln!("  {name:<16} no wattmeter energy");
            } else {
                eprintln!(
                    "  {name:<16} {got} windows: x {:.2}, wall {:.2} W",
                    mean(|p| p.x),
                    mean(|p| p.wall_w)
                );
            }
        },
    )
    .map_err(Fatal::profiler)?;
    Ok((points.into_inner(), problems))
}

/// The wall power law fitted, checked and written to `output`.
fn fit_and_write(
    output: &std::path::Path,
    points: Vec<Point>,
    problems: &[String],
    regressor: Regressor,
    used: Vec<String>,
    cpus: usize,
) -> anyhow::Result<i32> {
    if points.is_empty() {
        return Err(Fatal::profiler(format!(
            "the wattmeter gave no energy during the staircase{} (is its log being written, and \
             is --wattmeter-outlet right? `wattprof sources --wattmeter-log FILE` checks a log)",
            problems
                .first()
                .map(|p| format!(": {p}"))
                .unwrap_or_default()
        ))
        .into());
    }
    let f = fit(&points).map_err(|e| Fatal::profiler(format!("cannot fit the wall power: {e}")))?;
    if !(f.a >= 0.0 && f.b >= 0.0) {
        return Err(Fatal::profiler(format!(
            "the fit wall = {:.4} x {} + {:.2} W is no power law (a and b must not be negative; \
             residual {:.2} W): keep the machine quiet and the wattmeter on this machine's \
             outlet, and calibrate again with a longer --step",
            f.a,
            regressor.describe(),
            f.b,
            f.rms_residual_w
        ))
        .into());
    }
    let calibration = Calibration {
        kind: "wattprof_calibration".into(),
        version: 1,
        host: crate::topology::hostname(),
        cpus,
        created_unix_ns: unix_now_ns(),
        regressor,
        fit: f.clone(),
        readers: used,
        points,
    };
    let tmp = output.with_extension("json.tmp");
    std::fs::write(
        &tmp,
        serde_json::to_string_pretty(&calibration).unwrap_or_default() + "\n",
    )
    .and_then(|()| std::fs::rename(&tmp, output))
    .map_err(|e| Fatal::profiler(format!("cannot write --output {}: {e}", output.display())))?;
    println!(
        "wall = {:.4} x {} + {:.2} W; residual {:.2} W RMS ({:.2}% of the mean), R^2 {:.4}",
        f.a,
        regressor.describe(),
        f.b,
        f.rms_residual_w,
        f.relative_residual * 100.0,
        f.r_squared
    );
    println!("calibration written to {}", output.display());
    Ok(0)
}
