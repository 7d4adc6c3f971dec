//! `wattprof calibrate`'s GPU step: each GPU's idle power (no context
//! open) and held power (one context of calibrate's own open, no work),
//! from its energy counter, written per GPU UUID into the host power
//! model. A context is opened through the CUDA driver API
//! ([`Cuda`]), so no PyTorch is needed; where none can be opened the idle
//! figure is still kept and the reason reported.
//!
//! A GPU that another process holds or works on while a figure is taken
//! gives no figure (the power would not be what the figure says): reported,
//! with the pid.

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::time::{Duration, Instant};

use crate::sources::nvml::cuda::Cuda;
use crate::sources::nvml::statics::{GpuFit, SETTLE_NS};
use crate::sources::nvml::{GpuInfo, NvmlGpus};
use crate::sources::static_power::FitOrigin;

/// How often the GPUs are read while a figure is taken: often enough to
/// see when the energy counter steps (every 20-100 ms; 100 ms on an
/// H200), so a figure runs from one step to another and is exact to a
/// read's spacing, not to a step (at 80 W a step is 8 J: ±2 W over 4 s).
const READ_EVERY: Duration = Duration::from_millis(20);

/// Held power: creating a context shows as a short SM sample, and NVML
/// carries a sample 2 s: the held figure waits this long after opening.
const HELD_SETTLE: Duration = Duration::from_millis(2_500);

/// A counter's steps over a phase: the first and last seen (when the read
/// that saw each came), and the energy of the steps after the first.
#[derive(Default)]
struct Steps {
    first: Option<Instant>,
    last: Option<Instant>,
    uj: u64,
}

/// One GPU's figure over a phase: (W, seconds), or why there is none.
type PhaseResult = BTreeMap<u32, Result<(f64, f64), String>>;

/// Measures every GPU: its idle power, then its held power where a
/// context can be opened. Each GPU's entry of the model, and lines saying
/// what could not be measured.
pub(super) fn measure(
    nvml_lib: Option<&OsStr>,
    cuda_lib: Option<&OsStr>,
    step: Duration,
) -> Result<(Vec<GpuFit>, Vec<String>), String> {
    let mut gpus = NvmlGpus::open(nvml_lib).map_err(|e| e.to_string())?;
    let infos = gpus.gpus();
    eprintln!(
        "wattprof calibrate: {} GPU(s): idle power ({:.1} s with no context), then held power \
         ({:.1} s with one context of its own open, no work)",
        infos.len(),
        step.as_secs_f64(),
        step.as_secs_f64()
    );
    let indices: Vec<u32> = infos.iter().map(|i| i.index).collect();
    let idle = phase(
        &mut gpus,
        &indices,
        Duration::from_nanos(SETTLE_NS),
        step,
        <[u32]>::is_empty,
    );
    let mut notes = Vec::new();
    let held = match Cuda::open(cuda_lib) {
        Err(e) => {
            notes.push(format!(
                "held power not measured: cannot open a context ({e})"
            ));
            BTreeMap::new()
        }
        Ok(cuda) => held_phase(&mut gpus, &cuda, &infos, &idle, step, &mut notes),
    };
    let mut fits = Vec::new();
    for info in &infos {
        let idle_fig = match idle.get(&info.index) {
            Some(Ok(f)) => Some(*f),
            Some(Err(why)) => {
                notes.push(format!(
                    "GPU {}: idle power not measured: {why}",
                    info.index
                ));
                None
            }
            None => None,
        };
        let held_fig = match held.get(&info.index) {
            Some(Ok((w, s))) => idle_fig.map(|(i, _)| ((w - i).max(0.0), *s)),
            Some(Err(why)) => {
                notes.push(format!(
                    "GPU {}: held power not measured: {why}",
                    info.index
                ));
                None
            }
            None => None,
        };
        let Some((idle_w, idle_s)) = idle_fig else {
            continue;
        };
        println!(
            "GPU {} ({}, {}): {idle_w:.2} W idle{}",
            info.index,
            info.name,
            info.uuid,
            held_fig.map_or(String::new(), |(h, _)| format!(
                ", {h:.2} W more with a context open and no work"
            ))
        );
        fits.push(GpuFit {
            uuid: info.uuid.clone(),
            name: info.name.clone(),
            idle_w: Some(idle_w),
            idle_s,
            held_w: held_fig.map(|h| h.0),
            held_s: held_fig.map_or(0.0, |h| h.1),
            origin: FitOrigin::Calibrate,
        });
    }
    Ok((fits, notes))
}

/// Opens a context on each GPU whose idle power was measured (matched by
/// UUID), and measures the power with it open.
fn held_phase(
    gpus: &mut NvmlGpus,
    cuda: &Cuda,
    infos: &[GpuInfo],
    idle: &PhaseResult,
    step: Duration,
    notes: &mut Vec<String>,
) -> PhaseResult {
    let devices = match cuda.devices() {
        Ok(d) => d,
        Err(e) => {
            notes.push(format!("held power not measured: {e}"));
            return BTreeMap::new();
        }
    };
    let mut contexts = Vec::new();
    let mut out = PhaseResult::new();
    for info in infos
        .iter()
        .filter(|i| matches!(idle.get(&i.index), Some(Ok(_))))
    {
        let Some((dev, _)) = devices.iter().find(|(_, u)| *u == info.uuid) else {
            out.insert(
                info.index,
                Err(format!(
                    "CUDA lists no device with its UUID {} (CUDA_VISIBLE_DEVICES?)",
                    info.uuid
                )),
            );
            continue;
        };
        match cuda.context(*dev) {
            Ok(c) => contexts.push((info.index, c)),
            Err(e) => {
                out.insert(info.index, Err(format!("cannot open a context ({e})")));
            }
        }
    }
    if contexts.is_empty() {
        return out;
    }
    // Only calibrate's own context holds it: the GPU had no holder in the
    // idle phase, so one holder now is this process (NVML gives its host
    // pid, which in a container is not `std::process::id()`).
    let with_context: Vec<u32> = contexts.iter().map(|(i, _)| *i).collect();
    let held = phase(gpus, &with_context, HELD_SETTLE, step, |pids| {
        pids.len() == 1
    });
    drop(contexts);
    out.extend(held);
    out
}

/// Reads every GPU for `settle` (left out: the power settling) and then
/// `measure`: each GPU's mean power over the measured part, where every
/// read found its holders to be what `want` accepts.
fn phase(
    gpus: &mut NvmlGpus,
    indices: &[u32],
    settle: Duration,
    measure: Duration,
    want: impl Fn(&[u32]) -> bool,
) -> PhaseResult {
    // Per GPU: the energy since the first counter step counted, and the
    // time from that step to the last one seen (or why there is none);
    // every GPU asked for has an entry, so one that never answers is
    // reported.
    let mut state: BTreeMap<u32, Result<Steps, String>> = indices
        .iter()
        .map(|i| (*i, Err("it gave no reading".to_string())))
        .collect();
    let mut answered: std::collections::BTreeSet<u32> = std::collections::BTreeSet::new();
    let start = Instant::now();
    // The first read starts every counter from here.
    let _ = gpus.read_gpus();
    loop {
        std::thread::sleep(READ_EVERY);
        let readings = gpus.read_gpus();
        let now = Instant::now();
        let counting = now.duration_since(start) > settle;
        for r in readings {
            let mut pids: Vec<u32> = r.processes.iter().map(|p| p.pid).collect();
            pids.sort_unstable();
            let Some(entry) = state.get_mut(&r.index) else {
                continue;
            };
            if answered.insert(r.index) {
                *entry = Ok(Steps::default());
            }
            let Ok(steps) = entry else { continue };
            if !want(&pids) {
                *entry = Err(format!(
                    "other processes held it meanwhile (pids {pids:?}): run calibrate when the \
                     GPU is free"
                ));
            } else if !r.whole {
                *entry = Err("a read failed meanwhile (see the problems above)".into());
            } else if counting && r.energy_uj > 0 {
                // The counter stepped between the last read and this one.
                match steps.first {
                    None => steps.first = Some(now),
                    Some(_) => steps.uj += r.energy_uj,
                }
                steps.last = Some(now);
            }
        }
        if now.duration_since(start) >= settle + measure {
            break;
        }
    }
    for (i, problem) in gpus.problems() {
        eprintln!("wattprof: GPU {i}: {problem}");
    }
    state
        .into_iter()
        .map(|(i, r)| {
            (
                i,
                r.and_then(|steps| {
                    let s = match (steps.first, steps.last) {
                        (Some(a), Some(b)) => b.duration_since(a).as_secs_f64(),
                        _ => 0.0,
                    };
                    if s <= 0.0 {
                        Err("its energy counter did not step twice".into())
                    } else {
                        Ok((steps.uj as f64 / 1e6 / s, s))
                    }
                }),
            )
        })
        .collect()
}
