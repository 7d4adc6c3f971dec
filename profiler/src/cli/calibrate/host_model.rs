//! `wattprof calibrate` with no wattmeter: each GPU's idle and held power
//! ([`super::gpu`]), then the load staircase (idle, then 1 to N CPUs busy)
//! against the CPU energy counters, each domain and package fitted as
//! power = static + k × busy CPUs, written as the host power model that
//! `run` and `monitor` read.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::PathBuf;

use super::{CalibrateArgs, measured_only};
use crate::cli::Fatal;
use crate::sources::Domain;
use crate::sources::calibration::Point;
use crate::sources::registry::Readers;
use crate::sources::static_power::{DEFAULT_HOST_MODEL, DomainFit, HostModel, Machine};
use crate::staircase::{Step, StepLoad, climb, idle_s, timed_read};

/// A fit whose line explains less of the staircase's power than this is
/// refused: the power followed something else (another load, a turbo
/// limit), and its static figure would mislead every profile after it...
const MIN_R2: f64 = 0.9;

/// ...unless the power barely moved at all (a DRAM domain under a spin
/// load): its residual is then under this share of its mean, and the
/// line (static ≈ the mean, slope ≈ 0) is right.
const FLAT_RESIDUAL: f64 = 0.02;

/// Each CPU energy domain's points, per package.
type PointsByDomain = BTreeMap<(Domain, Option<u32>), Vec<Point>>;

/// Where the host power model goes: `-o`, else `$WATTPROF_HOST_MODEL`
/// (which `run`, `monitor` and `sources` read), else the default place.
fn output_path(args: &CalibrateArgs) -> PathBuf {
    args.output
        .clone()
        .or_else(|| {
            std::env::var_os("WATTPROF_HOST_MODEL")
                .filter(|v| !v.is_empty() && v != "none")
                .map(PathBuf::from)
        })
        .unwrap_or_else(|| PathBuf::from(DEFAULT_HOST_MODEL))
}

/// Measures the GPUs and runs the staircase, and writes the host power
/// model: the GPUs' figures and the CPU fits (with `--gpu-only`, those the
/// model had), and the model's figures of GPUs not measured now.
pub(super) fn execute(args: &CalibrateArgs) -> anyhow::Result<i32> {
    if args.gpu_load.is_some() {
        return Err(Fatal::usage(
            "--gpu-load needs a wattmeter (--wattmeter-log or --wattmeter-cmd): with none, \
             calibrate measures the CPU energy counters and the GPUs' own",
        )
        .into());
    }
    let output = output_path(args);
    let topology = crate::topology::Topology::read(&crate::topology::SysRoot::real())
        .map_err(|e| Fatal::profiler(format!("cannot read the CPU topology: {e}")))?;
    let machine = Machine::this(topology.packages());
    // The model there now: its CPU fits stay with --gpu-only, and its
    // other GPUs' figures always.
    let before = match HostModel::load(&output, false, &machine) {
        Ok(m) => m,
        Err(e) if args.gpu_only => {
            return Err(Fatal::profiler(format!("{e} (--gpu-only keeps its CPU fits)")).into());
        }
        Err(e) => {
            eprintln!("wattprof: replacing it: {e}");
            None
        }
    };
    let (gpus, notes) = if args.no_gpu {
        (Vec::new(), Vec::new())
    } else {
        match super::gpu::measure(
            args.nvml_lib.as_deref(),
            args.cuda_lib.as_deref(),
            args.step,
        ) {
            Ok(x) => x,
            Err(e) if args.gpu_only => {
                return Err(Fatal::profiler(format!("no GPU to measure: {e}")).into());
            }
            Err(e) => (Vec::new(), vec![format!("GPUs not measured: {e}")]),
        }
    };
    for n in &notes {
        eprintln!("wattprof: {n}");
    }
    let fits = if args.gpu_only {
        before.as_ref().map(|m| m.fits.clone()).unwrap_or_default()
    } else {
        match cpu_fits(args)? {
            Ok(fits) => fits,
            Err(why) if !gpus.is_empty() => {
                eprintln!("wattprof: {why}: the model holds the GPUs' figures only");
                Vec::new()
            }
            Err(why) => return Err(Fatal::profiler(why).into()),
        }
    };
    if gpus.is_empty() && fits.is_empty() {
        return Err(Fatal::profiler(format!(
            "nothing was measured{}",
            notes.first().map(|n| format!(": {n}")).unwrap_or_default()
        ))
        .into());
    }
    let mut model = HostModel {
        fits,
        gpus,
        ..HostModel::empty(machine)
    };
    if let Some(before) = before {
        let kept = before
            .gpus
            .into_iter()
            .filter(|g| !model.gpus.iter().any(|n| n.uuid == g.uuid));
        model.gpus.extend(kept.collect::<Vec<_>>());
    }
    model.save(&output).map_err(|e| {
        Fatal::profiler(format!(
            "{e} (give -o FILE somewhere writable, and --host-model FILE to run and monitor)"
        ))
    })?;
    println!(
        "host power model written to {}{}",
        output.display(),
        if output.as_os_str() == DEFAULT_HOST_MODEL {
            " (run and monitor read it from there)"
        } else {
            " (give it to run and monitor with --host-model, or set WATTPROF_HOST_MODEL)"
        }
    );
    Ok(0)
}

/// The CPU staircase's fits; the inner error: no CPU energy counter to
/// fit (one line why).
fn cpu_fits(args: &CalibrateArgs) -> anyhow::Result<Result<Vec<DomainFit>, String>> {
    let cfg = measured_only(args, true);
    let mut readers = Readers::open(&cfg).map_err(|e| Fatal::profiler(e.to_string()))?;
    let Some(reader) = readers.cpu_reader() else {
        let why = readers
            .used()
            .iter()
            .find(|u| u.kind == "cpu")
            .map(|u| format!(": {}", u.detail))
            .unwrap_or_default();
        return Ok(Err(format!(
            "no CPU energy counter to fit{why} (with no wattmeter, calibrate fits the CPU's \
             RAPL counters; give --wattmeter-log or --wattmeter-cmd to fit the wall instead)"
        )));
    };
    // Threads to start: the CPUs this process may use (affinity, cpuset).
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    // Busy CPUs are counted over every online CPU, as /proc/stat's idle
    // time is summed.
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as f64;
    eprintln!(
        "wattprof calibrate: {} steps of {:.1} s (0 to {cpus} CPUs busy), fitting each CPU \
         energy domain ({reader}) as static + k x busy CPUs",
        cpus + 1,
        args.step.as_secs_f64()
    );
    let steps: Vec<Step> = (0..=cpus)
        .map(|n| Step {
            name: format!("{n} CPUs busy"),
            load: StepLoad::Cpus(n),
        })
        .collect();
    let points: RefCell<PointsByDomain> = RefCell::default();
    let mut problems = Vec::new();
    climb(
        &steps,
        args.step,
        |name, window| {
            let i0 = idle_s();
            let (_, t0) = timed_read(&mut readers);
            let _ = readers.take_problems();
            std::thread::sleep(window);
            let (e, t1) = timed_read(&mut readers);
            let i1 = idle_s();
            problems.extend(readers.take_problems());
            let secs = t1.duration_since(t0).as_secs_f64();
            let busy = match (i0, i1) {
                (Some(a), Some(b)) if secs > 0.0 => (online - (b - a) / secs).max(0.0),
                _ => return false,
            };
            if !e.missed.is_empty() || secs <= 0.0 {
                return false;
            }
            let mut points = points.borrow_mut();
            for d in e
                .energy
                .iter()
                .filter(|d| matches!(d.domain, Domain::Package | Domain::Core | Domain::Dram))
            {
                points
                    .entry((d.domain, d.package))
                    .or_default()
                    .push(Point {
                        step: name.to_string(),
                        x: busy,
                        wall_w: d.energy_uj as f64 / 1e6 / secs,
                    });
            }
            true
        },
        |name, got| {
            let points = points.borrow();
            let mean = |f: fn(&Point) -> f64| {
                let v: Vec<f64> = points
                    .values()
                    .next()
                    .map(|p| p.iter().rev().take(got).map(f).collect())
                    .unwrap_or_default();
                v.iter().sum::<f64>() / v.len().max(1) as f64
            };
            eprintln!(
                "  {name:<16} {got} windows: {:.2} busy CPUs, first domain {:.2} W",
                mean(|p| p.x),
                mean(|p| p.wall_w)
            );
        },
    )
    .map_err(Fatal::profiler)?;
    fit_points(points.into_inner(), reader, &problems).map(Ok)
}

/// Each domain's staircase fitted as static + k x busy CPUs, printed;
/// a fit that is no power law (a negative term, a poor R^2 on a varying
/// domain) is refused and reported on stderr. No points (the first of
/// the readers' `problems` says why) or none fitted is an error.
fn fit_points(
    points: PointsByDomain,
    reader: &str,
    problems: &[String],
) -> anyhow::Result<Vec<DomainFit>> {
    if points.is_empty() {
        return Err(Fatal::profiler(format!(
            "the counters gave no energy during the staircase{}",
            problems
                .first()
                .map(|p| format!(": {p}"))
                .unwrap_or_default()
        ))
        .into());
    }
    let mut fits = Vec::new();
    let mut refused = Vec::new();
    for ((domain, package), pts) in points {
        let mean = pts.iter().map(|p| p.wall_w).sum::<f64>() / pts.len().max(1) as f64;
        let f = match HostModel::fit_domain(domain, package, reader, pts) {
            Ok(f) => f,
            Err(e) => {
                refused.push(format!("{}: {e}", domain.label(package)));
                continue;
            }
        };
        let flat = mean > 0.0 && f.rms_residual_w / mean <= FLAT_RESIDUAL;
        if !(f.static_w >= 0.0 && f.per_cpu_w >= 0.0 && (f.r_squared >= MIN_R2 || flat)) {
            refused.push(format!(
                "{}: {:.2} W static + {:.3} W per busy CPU, R^2 {:.3}, residual {:.2} W is no \
                 power law (static and slope must not be negative, R^2 at least {MIN_R2} or \
                 the residual under {:.0}% of the mean)",
                domain.label(package),
                f.static_w,
                f.per_cpu_w,
                f.r_squared,
                f.rms_residual_w,
                FLAT_RESIDUAL * 100.0
            ));
            continue;
        }
        println!(
            "{}: {:.2} W static + {:.3} W per busy CPU; residual {:.2} W RMS, R^2 {:.4}",
            domain.label(package),
            f.static_w,
            f.per_cpu_w,
            f.rms_residual_w,
            f.r_squared
        );
        fits.push(f);
    }
    for r in &refused {
        eprintln!("wattprof: not fitted, {r}");
    }
    if fits.is_empty() {
        return Err(Fatal::profiler(format!(
            "no domain could be fitted ({}): keep the machine quiet and calibrate again with a \
             longer --step",
            refused.join("; ")
        ))
        .into());
    }
    Ok(fits)
}
