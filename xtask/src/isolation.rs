//! `cargo xtask bench isolation`: does a program's energy depend on its
//! neighbour? On a RAPL fixture whose power follows the load (static
//! watts + watts per busy CPU, as real RAPL's does), a burner's package
//! energy per CPU-second alone and beside a second burner, under the CPU
//! time rule wattprof used before static power (all of the energy divided
//! by CPU time over all CPU time) and under the capacity rule (dynamic by
//! busy time, static by capacity), in alternating rounds in one run.
//!
//! The CPU-time rule is the capacity rule with every joule static: a host
//! model whose static power (10 kW) exceeds any interval's energy makes
//! wattprof cut it to the measured energy each interval, which is exactly
//! the old division.

use std::path::Path;
use std::process::Command;

use anyhow::{Context, Result, bail};
use wattprof_tests::{FakeRapl, PowerLaw, host_model_file};

/// One rule's figures over the rounds.
#[derive(Default)]
struct Figures {
    alone: Vec<f64>,
    beside: Vec<f64>,
}

/// Package J per CPU-second of each burner `wattprof run` reported.
fn burners(
    wattprof: &Path,
    testload: &Path,
    rapl: &FakeRapl,
    model: &Path,
    cmd: &str,
    dir: &Path,
) -> Result<Vec<f64>> {
    let out = dir.join("run.json");
    let run = Command::new(wattprof)
        .args(["run", "--interval", "250ms", "--host-model"])
        .arg(model)
        .arg(rapl.arg())
        .arg("--output")
        .arg(&out)
        .args(["--", "sh", "-c", cmd])
        .env("T", testload)
        .output()
        .context("wattprof run")?;
    if !run.status.success() {
        bail!("wattprof run: {}", String::from_utf8_lossy(&run.stderr));
    }
    let report: serde_json::Value = serde_json::from_slice(&std::fs::read(&out)?)?;
    let figures = report["processes"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["comm"] == "wp-cpu")
        .map(|p| {
            let s = p["on_cpu_ns"].as_f64().unwrap_or(0.0) / 1e9;
            p["energy"]["package_j"].as_f64().unwrap_or(0.0) / s.max(1e-9)
        })
        .collect::<Vec<_>>();
    if figures.is_empty() {
        bail!("no burner (wp-cpu) in {}", out.display());
    }
    Ok(figures)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n.is_multiple_of(2) {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    } else {
        v[n / 2]
    }
}

/// Runs the benchmark: `rounds` rounds, each burner `seconds` of CPU, on a
/// fixture of `static_w` + `per_cpu_w` per busy CPU.
pub fn isolation(
    wattprof: &Path,
    testload: &Path,
    rounds: usize,
    seconds: f64,
    static_w: f64,
    per_cpu_w: f64,
) -> Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!(
            "the isolation benchmark loads eBPF and runs its fixture at real-time priority: run it as root"
        );
    }
    let package = PowerLaw {
        static_w,
        per_cpu_w,
    };
    let dram = PowerLaw {
        static_w: 1.5,
        per_cpu_w: 0.5,
    };
    let rapl = FakeRapl::following(package, dram);
    let dir = wattprof_tests::tempfile_dir();
    let capacity_dir = dir.join("capacity");
    let cpu_time_dir = dir.join("cpu-time");
    std::fs::create_dir_all(&capacity_dir)?;
    std::fs::create_dir_all(&cpu_time_dir)?;
    let capacity = host_model_file(&capacity_dir, package, dram);
    let huge = PowerLaw {
        static_w: 10_000.0,
        per_cpu_w: 0.0,
    };
    let cpu_time = host_model_file(&cpu_time_dir, huge, huge);
    let alone = format!("\"$T\" cpu {seconds}");
    let pair = format!("\"$T\" cpu {seconds} & \"$T\" cpu {seconds} & wait");
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    eprintln!(
        "isolation: {rounds} rounds on a fixture of {static_w} W + {per_cpu_w} W per busy CPU \
         ({cpus} CPUs; what a burner causes plus its rent: {:.2} J per CPU-second)",
        per_cpu_w + static_w / cpus
    );
    let (mut old, mut new) = (Figures::default(), Figures::default());
    for round in 0..rounds {
        // Alternate which rule goes first.
        let order: [(&Path, bool); 2] = if round % 2 == 0 {
            [(&cpu_time, false), (&capacity, true)]
        } else {
            [(&capacity, true), (&cpu_time, false)]
        };
        for (model, is_new) in order {
            let a = burners(wattprof, testload, &rapl, model, &alone, &dir)?;
            let b = burners(wattprof, testload, &rapl, model, &pair, &dir)?;
            let f = if is_new { &mut new } else { &mut old };
            f.alone.extend(a);
            f.beside.extend(b);
        }
        eprintln!("  round {} of {rounds} done", round + 1);
    }
    let _ = std::fs::remove_dir_all(&dir);
    println!("| rule | alone J/CPU-s (median, range) | beside another J/CPU-s | beside / alone |");
    println!("| --- | --- | --- | --- |");
    for (name, f) in [
        ("CPU time (before)", &mut old),
        ("capacity (now)", &mut new),
    ] {
        let range = |v: &[f64]| {
            let (lo, hi) = v
                .iter()
                .fold((f64::MAX, f64::MIN), |(l, h), x| (l.min(*x), h.max(*x)));
            format!("{lo:.2}–{hi:.2}")
        };
        let (ra, rb) = (range(&f.alone), range(&f.beside));
        let (ma, mb) = (median(&mut f.alone), median(&mut f.beside));
        println!(
            "| {name} | {ma:.2} ({ra}) | {mb:.2} ({rb}) | {:+.1}% |",
            (mb / ma - 1.0) * 100.0
        );
    }
    Ok(())
}
