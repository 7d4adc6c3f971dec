//! NVIDIA GPUs through NVML (nvml-wrapper, loading `libnvidia-ml.so.1`).
//! Energy comes from each GPU's total-energy counter (millijoules since
//! the driver loaded; Volta and later). Where the counter cannot be read
//! (older GPUs answer `NVML_ERROR_NOT_SUPPORTED`; a container or a driver
//! may answer NO_PERMISSION, FUNCTION_NOT_FOUND or lack the symbol), energy
//! is integrated from power readings (trapezoids between reads), marked
//! estimated and said. Each read also takes utilization, memory and each
//! process's SM share and memory.
//!
//! NVML is read as it behaves, not as documented:
//! - NVML returns of each process only its newest sample, so the samples
//!   are fetched every 100 ms between reads ([`sampler`]) and a process's
//!   share is its SM summed over the driver's sampling periods of the
//!   interval;
//! - per-process samples are sanitised (the pid is in the driver's process
//!   list at this read or the last, SM at most 100, the timestamp after the
//!   last one seen and not in the future), duplicates merged, and the last
//!   timestamp seen never moves into the future;
//! - a count race (INSUFFICIENT_SIZE) is retried;
//! - an interval with no new sample (the driver samples every 1/6 s to
//!   1 s) uses the shares seen within the last 2 s ([`SmBasis::Carried`]),
//!   else the holders share equally ([`SmBasis::Equal`]);
//! - every failure that changes a figure is a problem line when it starts
//!   and when it ends; a failed reading is absent, never 0;
//! - a transient error (Unknown) skips one read, whose energy comes with
//!   the next; a lost GPU (GPU_IS_LOST) is tried again every read;
//! - drivers 535.43–535.86, which write `_v3` process entries NVML's header
//!   does not describe, are asked through `_v2`.
//!
//! - on a MIG-enabled GPU NVML gives no utilization at all: its instances
//!   are listed with their processes, and the GPU's energy goes to them by
//!   each instance's busy SMs from GPM (Hopper and later), else by compute
//!   slices, and equally among an instance's processes ([`mig`]).
//!
//! No driver or no GPU is a status, not an error.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nvml_wrapper::{Nvml, error::NvmlError, structs::device::MigMode};
use serde::Serialize;

mod container;
mod energy;
pub(crate) mod mig;
mod said;
pub(crate) mod sampler;
mod samples;
pub(crate) mod statics;

pub(crate) use container::container_hint;
use energy::{Energy, Miss, read_energy};
use said::Said;

use sampler::{Pending, Sampler};
pub(crate) use samples::{sanitise, v3_quirk};

use super::{
    Domain, DomainEnergy, Source, SourceError, SourceInfo,
    counter::{EnergyCounter, WrappingCounter},
};

/// How a GPU's energy is obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuEnergyMethod {
    /// The GPU's own total-energy counter (exact to 1 mJ).
    EnergyCounter,
    /// Power samples integrated over time (an estimate between samples).
    PowerIntegration,
}

/// One process's use of a GPU over the last interval.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct GpuProcess {
    /// Process id.
    pub pid: u32,
    /// Streaming-multiprocessor utilization, percent, over the
    /// interval: its samples summed over the driver's sampling periods
    /// they cover (0.001 resolution).
    pub sm_util_pct: f64,
    /// GPU memory in use, bytes.
    pub memory_bytes: u64,
}

/// Where an interval's per-process SM shares come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SmBasis {
    /// NVML's samples taken within the interval.
    #[default]
    Sampled,
    /// No new sample: the latest shares seen within the last 2 s.
    Carried,
    /// No sample within 2 s (or none to be had): equal among the holders.
    Equal,
    /// MIG: across instances by each one's busy SMs from GPM, equally
    /// within an instance.
    InstanceActivity,
    /// MIG without GPM (or without a sane GPM figure): across instances by
    /// their compute slices, equally within an instance.
    InstanceSlices,
}

/// One GPU over one interval.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct GpuReading {
    /// NVML index.
    pub index: u32,
    /// Energy since the previous read (µJ).
    pub energy_uj: u64,
    /// How it was obtained.
    pub method: GpuEnergyMethod,
    /// Power draw now (W; on Ampere and later, the driver's mean over the
    /// last second). `None`: the read failed (said).
    pub power_w: Option<f64>,
    /// GPU utilization, percent (`None`: not available, e.g. MIG).
    pub util_pct: Option<u32>,
    /// Memory in use, bytes (`None`: the read failed).
    pub memory_used_bytes: Option<u64>,
    /// Processes using it.
    pub processes: Vec<GpuProcess>,
    /// Where the processes' SM shares come from.
    pub sm_basis: SmBasis,
    /// Processes hold it and none worked: NVML's samples (which it gives
    /// only for processes that used the SM) show none above 0% within
    /// the last 2 s, and the GPU's utilization, where known, is 0.
    pub at_rest: bool,
    /// The energy covers this interval only (not a catch-up after failed
    /// reads, nor a counter started afresh): it may teach static power.
    pub whole: bool,
    /// MIG: each instance, its processes and activity (empty off MIG).
    pub instances: Vec<MigInstance>,
}

/// A MIG instance over one interval.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct MigInstance {
    /// Its GPU instance.
    pub gpu_instance_id: u32,
    /// Its compute instance.
    pub compute_instance_id: u32,
    /// `MIG-...`.
    pub uuid: String,
    /// Compute slices.
    pub slices: u32,
    /// Streaming multiprocessors.
    pub sms: u32,
    /// GPM's SM utilization over the interval, percent of its SMs (`None`:
    /// no GPM, or no sane figure this interval).
    pub sm_util_pct: Option<f64>,
    /// The processes NVML lists in it.
    pub pids: Vec<u32>,
}

/// A GPU found.
#[derive(Clone, Debug, PartialEq, Serialize, serde::Deserialize)]
pub struct GpuInfo {
    /// NVML index.
    pub index: u32,
    /// Model name.
    pub name: String,
    /// UUID.
    pub uuid: String,
    /// How its energy is obtained.
    pub method: GpuEnergyMethod,
    /// Total memory, bytes.
    pub memory_total_bytes: u64,
    /// MIG mode is enabled (its energy is divided by instance).
    pub mig: bool,
}

/// How long shares seen are carried into intervals with no new sample:
/// the driver's slowest sampling period (1 s) twice over, as nvitop reads
/// 2 s back.
pub(crate) const CARRY_SHARES: Duration = Duration::from_secs(2);

/// Past this long lost, a GPU's counter is started afresh when it answers
/// again (its energy meanwhile is not divided: said); within it, the
/// next read's energy covers the time it was lost.
const LOST_CATCH_UP: Duration = Duration::from_secs(60);

struct Gpu {
    info: GpuInfo,
    energy: Energy,
    /// Since when it answers GPU_IS_LOST.
    lost: Option<Instant>,
    /// The samples fetched since the last read (by the read, and by the
    /// [`Sampler`] between reads), and the next `lastSeenTimeStamp`.
    pending: Arc<Mutex<Pending>>,
    /// The last seen timestamp when the last read took its samples.
    read_floor: u64,
    /// The process list at the last read: a process that ended since
    /// keeps its samples of this interval.
    listed_before: Vec<u32>,
    /// The latest sampled shares (pid → SM %), and when.
    shares: Option<(Instant, HashMap<u32, f64>)>,
    /// Failures going on, by what failed: said when they begin and end.
    failing: BTreeMap<&'static str, String>,
    /// MIG: whether GPM answers, and each GPU instance's last sample.
    gpm: Option<HashMap<u32, mig::GpmSample>>,
}

/// The NVML reader.
pub struct NvmlGpus {
    nvml: Arc<Nvml>,
    /// Fetches the samples between reads, once started.
    sampler: Option<Sampler>,
    gpus: Vec<Gpu>,
    problems: Vec<(u32, String)>,
    /// The last [`Source::read`]'s detail, until taken.
    last: Vec<GpuReading>,
    /// The driver's version, when it says.
    driver_version: Option<String>,
    /// Process lists through `_v2` (drivers with the `_v3` quirk).
    processes_v2: bool,
    /// The MIG and GPM calls (loaded when a GPU has MIG on), or why not.
    raw: Result<Arc<mig::Raw>, String>,
}

impl std::fmt::Debug for NvmlGpus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvmlGpus")
            .field(
                "gpus",
                &self.gpus.iter().map(|g| &g.info).collect::<Vec<_>>(),
            )
            .finish_non_exhaustive()
    }
}

fn nvml_err(what: &str, e: &NvmlError) -> String {
    format!("{what}: {e}")
}

/// An energy probe failure that power integration can stand in for.
fn integrate_instead(e: &NvmlError) -> bool {
    matches!(
        e,
        NvmlError::NotSupported
            | NvmlError::NoPermission
            | NvmlError::FunctionNotFound
            | NvmlError::FailedToLoadSymbol(_)
    )
}

/// Microseconds since the epoch: NVML's sample timestamps.
fn now_epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

impl NvmlGpus {
    /// Loads NVML (from `lib`, or the driver's `libnvidia-ml.so.1`) and
    /// finds every GPU.
    pub fn open(lib: Option<&OsStr>) -> Result<Self, SourceError> {
        let mut builder = Nvml::builder();
        if let Some(lib) = lib {
            builder.lib_path(lib);
        }
        let nvml = builder.init().map_err(|e| match e {
            NvmlError::LibloadingError(_) | NvmlError::DriverNotLoaded | NvmlError::LibraryNotFound => {
                // A container marker (an image built with Docker leaves one
                // on a VM too): the toolkit's option first, then the driver.
                match container_hint(std::path::Path::new("/")) {
                    Some(hint) => SourceError::unsupported(
                        "no NVIDIA driver found",
                        format!(
                            "in a container, {hint}; otherwise install the NVIDIA driver (it provides libnvidia-ml.so.1)"
                        ),
                    ),
                    None => SourceError::unsupported(
                        "no NVIDIA driver found",
                        "install the NVIDIA driver (it provides libnvidia-ml.so.1) if this machine has an NVIDIA GPU",
                    ),
                }
            }
            NvmlError::NoPermission => SourceError::unsupported(
                "NVML: no permission",
                "run wattprof as root or as a user allowed to use the GPU",
            ),
            other => SourceError::unsupported(nvml_err("NVML init", &other), "check nvidia-smi"),
        })?;
        let count = nvml
            .device_count()
            .map_err(|e| SourceError::Retryable(nvml_err("NVML device count", &e)))?;
        if count == 0 {
            return Err(SourceError::unsupported(
                "NVIDIA driver loaded, but it sees no GPU",
                "check nvidia-smi",
            ));
        }
        let driver_version = nvml.sys_driver_version().ok();
        let processes_v2 = driver_version.as_deref().is_some_and(v3_quirk);
        let mut gpus = Vec::new();
        let mut problems = Vec::new();
        if processes_v2 {
            problems.push((
                0,
                format!(
                    "driver {} writes process entries of another size than NVML's header: process lists are read through the _v2 call",
                    driver_version.as_deref().unwrap_or("?")
                ),
            ));
        }
        for index in 0..count {
            let device = match nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    problems.push((index, nvml_err("handle", &e)));
                    continue;
                }
            };
            let (energy, method) = match device.total_energy_consumption() {
                Ok(mj) => {
                    let mut c = EnergyCounter::new(WrappingCounter::bits(64), 1e-3);
                    c.advance(mj);
                    (Energy::Counter(c), GpuEnergyMethod::EnergyCounter)
                }
                Err(e) if integrate_instead(&e) => {
                    if !matches!(e, NvmlError::NotSupported) {
                        problems.push((
                            index,
                            format!("energy counter unreadable ({e}): energy integrated from power readings, estimated"),
                        ));
                    }
                    (
                        Energy::Integrate {
                            last: device
                                .power_usage()
                                .ok()
                                .map(|mw| (Instant::now(), f64::from(mw) / 1e3)),
                            carry_uj: 0.0,
                        },
                        GpuEnergyMethod::PowerIntegration,
                    )
                }
                Err(e) => {
                    problems.push((index, nvml_err("energy", &e)));
                    continue;
                }
            };
            gpus.push(Gpu {
                info: GpuInfo {
                    index,
                    name: device.name().unwrap_or_default(),
                    uuid: device.uuid().unwrap_or_default(),
                    method,
                    memory_total_bytes: device.memory_info().map_or(0, |m| m.total),
                    mig: device.mig_mode().is_ok_and(|m: MigMode| m.current == 1),
                },
                energy,
                lost: None,
                pending: Arc::default(),
                read_floor: 0,
                listed_before: Vec::new(),
                shares: None,
                failing: BTreeMap::new(),
                gpm: None,
            });
        }
        if gpus.is_empty() {
            return Err(SourceError::unsupported(
                format!(
                    "no usable NVIDIA GPU ({})",
                    problems.first().map_or("none found", |p| p.1.as_str())
                ),
                "check nvidia-smi",
            ));
        }
        // MIG's calls, through the same library: only when a GPU needs them.
        let raw = if gpus.iter().any(|g| g.info.mig) {
            mig::Raw::open(lib).map(Arc::new)
        } else {
            Err("no GPU has MIG on".into())
        };
        if let Ok(raw) = &raw {
            for g in gpus.iter_mut().filter(|g| g.info.mig) {
                if let Ok(d) = nvml.device_by_index(g.info.index)
                    // SAFETY: the handle of a device NVML just gave.
                    && raw.gpm_supported(unsafe { d.handle() })
                {
                    g.gpm = Some(HashMap::new());
                }
            }
        }
        Ok(Self {
            nvml: Arc::new(nvml),
            sampler: None,
            gpus,
            problems,
            last: Vec::new(),
            driver_version,
            processes_v2,
            raw,
        })
    }

    /// Fetches the per-process samples every `every` between reads (a
    /// thread; see [`sampler`]), for every GPU that gives them (not MIG).
    /// Without it each read weighs its interval by the samples of the
    /// driver's last period only.
    /// A thread that cannot start is no failure: each read then takes one
    /// sample per process, and the error says so (for the reader's line).
    pub fn sample_between_reads(&mut self, every: Duration) -> Result<(), String> {
        let gpus: Vec<_> = self
            .gpus
            .iter()
            .filter(|g| !g.info.mig)
            .map(|g| (g.info.index, Arc::clone(&g.pending)))
            .collect();
        if gpus.is_empty() {
            return Ok(());
        }
        let s = Sampler::start(Arc::clone(&self.nvml), gpus, every).map_err(|e| {
            format!(
                "the thread that fetches NVML's samples between reads could not start ({e}): \
                 each read weighs its interval by one sample per process"
            )
        })?;
        self.sampler = Some(s);
        Ok(())
    }

    /// The GPUs found.
    pub fn gpus(&self) -> Vec<GpuInfo> {
        self.gpus.iter().map(|g| g.info.clone()).collect()
    }

    /// The driver's version, when NVML says.
    pub fn driver_version(&self) -> Option<&str> {
        self.driver_version.as_deref()
    }

    /// GPUs that failed at the last open or read: (index, what happened).
    pub fn problems(&self) -> &[(u32, String)] {
        &self.problems
    }

    /// Reads every GPU that still answers.
    pub fn read_gpus(&mut self) -> Vec<GpuReading> {
        self.problems.clear();
        let mut out = Vec::new();
        for g in &mut self.gpus {
            let raw = self.raw.as_ref().map_err(String::as_str);
            if let Some(r) = read_gpu(&self.nvml, g, self.processes_v2, raw, &mut self.problems) {
                out.push(r);
            }
        }
        out
    }
}

/// Reads one GPU; `None` when it gave no reading this time (said).
fn read_gpu(
    nvml: &Nvml,
    g: &mut Gpu,
    processes_v2: bool,
    mig_raw: Result<&Arc<mig::Raw>, &str>,
    problems: &mut Vec<(u32, String)>,
) -> Option<GpuReading> {
    let index = g.info.index;
    // Power integration's first reading has nothing to integrate from.
    let from_nothing = matches!(g.energy, Energy::Integrate { last: None, .. });
    let read = nvml
        .device_by_index(index)
        .map_err(Miss::from)
        .and_then(|d| {
            let power = d.power_usage();
            let uj = read_energy(&d, &mut g.energy, &power)?;
            Ok((d, power, uj))
        });
    let mut said = Said {
        index,
        failing: &mut g.failing,
        out: problems,
    };
    // Lost, transient, or answering (again).
    let (device, power, energy_uj) = match read {
        Err(Miss::Lost) => {
            g.lost.get_or_insert_with(Instant::now);
            // The same line every read: said once while it lasts.
            said.out.push((
                index,
                "lost (GPU_IS_LOST): tried again every read".to_string(),
            ));
            return None;
        }
        Err(Miss::Transient(e)) => {
            said.set(
                "energy",
                Some(format!("energy read failed ({e}): this interval's GPU energy comes with the next good read")),
            );
            return None;
        }
        Ok(x) => x,
    };
    // A read after failed ones covers their intervals too.
    let mut whole = !said.failing.contains_key("energy") && !from_nothing;
    said.set("energy", None);
    let mut energy_uj = energy_uj;
    if let Some(since) = g.lost.take() {
        whole = false;
        let lost_for = since.elapsed();
        if lost_for > LOST_CATCH_UP {
            said.out.push((
                index,
                format!(
                    "answers again after {:.0} s lost: its energy meanwhile ({:.1} J) is not divided",
                    lost_for.as_secs_f64(),
                    energy_uj as f64 / 1e6
                ),
            ));
            energy_uj = 0;
        } else {
            said.out.push((
                index,
                format!(
                    "answers again after {:.1} s lost: this read's energy covers that time",
                    lost_for.as_secs_f64()
                ),
            ));
        }
    }
    let power_w = match &power {
        Ok(mw) => {
            said.set("power", None);
            Some(f64::from(*mw) / 1e3)
        }
        Err(e) => {
            said.set("power", Some(nvml_err("power read failed", e)));
            None
        }
    };
    let util_pct = match device.utilization_rates() {
        Ok(u) => {
            said.set("utilization", None);
            Some(u.gpu)
        }
        Err(NvmlError::NotSupported) if g.info.mig => None,
        Err(e) => {
            said.set("utilization", Some(nvml_err("utilization read failed", &e)));
            None
        }
    };
    let memory_used_bytes = match device.memory_info() {
        Ok(m) => {
            said.set("memory", None);
            Some(m.used)
        }
        Err(e) => {
            said.set("memory", Some(nvml_err("memory read failed", &e)));
            None
        }
    };
    // The per-process samples since the last read: those the sampler
    // fetched meanwhile, and the newest now (a count race retried); before
    // the process list, so a process that starts in between is listed.
    let (fetched, raw, trimmed, last_seen) = {
        let mut p = g.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let fetched = sampler::fetch(&device, &mut p);
        (
            fetched,
            std::mem::take(&mut p.raw),
            std::mem::take(&mut p.trimmed),
            p.last_seen,
        )
    };
    let now_us = now_epoch_us();
    let samples_ok = fetched.is_ok();
    // The driver's process list: who holds a context, and their memory.
    let list = if processes_v2 {
        device.running_compute_processes_v2()
    } else {
        device.running_compute_processes()
    };
    let listed: Option<HashMap<u32, u64>> = match list {
        Ok(l) => {
            said.set("process list", None);
            Some(
                l.into_iter()
                    .map(|p| {
                        let bytes = match p.used_gpu_memory {
                            nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => b,
                            nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0,
                        };
                        (p.pid, bytes)
                    })
                    .collect(),
            )
        }
        Err(e) => {
            said.set(
                "process list",
                Some(format!(
                    "process list failed ({e}): only processes with samples are known, and its energy goes to them"
                )),
            );
            None
        }
    };
    // NVML lists host pids: ones this PID namespace cannot see (wattprof in
    // a container without the host's PIDs) are no process wattprof knows.
    if let Some(l) = &listed {
        let unseen = l
            .keys()
            .filter(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
            .count();
        said.set(
            "pid namespace",
            (unseen > 0).then(|| {
                format!(
                    "{unseen} process(es) holding it are not in this PID namespace (another container, \
                     or wattprof without --pid=host / hostPID: true): their GPU energy is unattributed"
                )
            }),
        );
    }
    // MIG: each instance with its processes and GPM's activity.
    let instances = if g.info.mig {
        mig_instances(nvml, &device, &mut g.gpm, processes_v2, mig_raw, &mut said)
    } else {
        None
    };
    match fetched {
        Ok(()) => said.set("samples", None),
        Err(NvmlError::NotSupported) if g.info.mig => {
            said.set(
                "samples",
                Some(match (&instances, g.gpm.is_some()) {
                    (Some(_), true) => "MIG is on: NVML gives no per-process utilization, so the energy goes to each instance by its busy SMs from GPM, and equally among an instance's processes".into(),
                    (Some(_), false) => "MIG is on and this GPU has no GPM: the energy goes to each instance by its compute slices, and equally among an instance's processes".into(),
                    (None, _) => "MIG is on: NVML gives no per-process utilization, so the processes holding the GPU share its energy equally".into(),
                }),
            );
        }
        Err(e) => {
            said.set(
                "samples",
                Some(format!(
                    "per-process samples failed ({e}): shares carried up to 2 s, then equal"
                )),
            );
        }
    }
    // Who may have samples: the holders now, and those at the last read
    // (a process that ended since used the GPU in this interval).
    let pids: Option<Vec<u32>> = listed.as_ref().map(|l| {
        let mut p: Vec<u32> = l.keys().copied().collect();
        p.extend(g.listed_before.iter().filter(|b| !l.contains_key(b)));
        p
    });
    // Each call asked a second back (late samples), so the floor is too.
    let floor = g.read_floor.saturating_sub(sampler::LOOK_BACK_US);
    let clean = sanitise(&raw, pids.as_deref(), floor, now_us);
    // Judged only on reads that returned samples (NOT_FOUND says nothing).
    if !raw.is_empty() {
        said.set("sample sanity", clean.discarded());
    }
    if trimmed > 0 {
        // Each time: a count of what one interval lost, not a state.
        said.out.push((
            index,
            format!(
                "more NVML samples in one interval than are kept: the oldest {trimmed} left out"
            ),
        ));
    }
    g.read_floor = last_seen;
    let now = Instant::now();
    let (shares, sm_basis) = if !clean.shares.is_empty() {
        g.shares = Some((now, clean.shares.clone()));
        (clean.shares, SmBasis::Sampled)
    } else {
        match &g.shares {
            Some((at, s)) if now.duration_since(*at) <= CARRY_SHARES => {
                (s.clone(), SmBasis::Carried)
            }
            _ => (HashMap::new(), SmBasis::Equal),
        }
    };
    // Holders: the process list (and those that ended since the last read
    // with samples of this interval), else those with shares.
    let mut processes: Vec<GpuProcess> = match &listed {
        Some(l) => l
            .iter()
            .map(|(&pid, &memory_bytes)| GpuProcess {
                pid,
                sm_util_pct: shares.get(&pid).copied().unwrap_or(0.0),
                memory_bytes,
            })
            .chain(
                g.listed_before
                    .iter()
                    .filter(|pid| !l.contains_key(pid) && sm_basis == SmBasis::Sampled)
                    .filter_map(|pid| {
                        shares.get(pid).map(|&sm| GpuProcess {
                            pid: *pid,
                            sm_util_pct: sm,
                            memory_bytes: 0,
                        })
                    }),
            )
            .collect(),
        None => shares
            .iter()
            .map(|(&pid, &sm)| GpuProcess {
                pid,
                sm_util_pct: sm,
                memory_bytes: 0,
            })
            .collect(),
    };
    processes.sort_by_key(|p| p.pid);
    if let Some(l) = &listed {
        g.listed_before = l.keys().copied().collect();
    }
    // Carried shares of processes that have all left are no shares.
    let sm_basis = if sm_basis == SmBasis::Carried && processes.iter().all(|p| p.sm_util_pct == 0.0)
    {
        SmBasis::Equal
    } else {
        sm_basis
    };
    // NVML samples only processes that used the SM: holders with no
    // sample within 2 s, and a GPU whose utilization is 0 where known,
    // did no work.
    let mut at_rest = !processes.is_empty()
        && samples_ok
        && processes.iter().all(|p| p.sm_util_pct == 0.0)
        && util_pct.is_none_or(|u| u == 0);
    // MIG: the instances' weights make the processes' shares.
    let (sm_basis, instances) = match instances {
        Some(list) => {
            let basis = mig_shares(&list, &mut processes);
            // At rest: every instance's GPM activity says 0.
            at_rest = !processes.is_empty()
                && basis == SmBasis::InstanceActivity
                && list.iter().all(|i| i.sm_util_pct == Some(0.0));
            (basis, list)
        }
        None => (sm_basis, Vec::new()),
    };
    Some(GpuReading {
        index,
        energy_uj,
        method: g.info.method,
        power_w,
        util_pct,
        memory_used_bytes,
        processes,
        sm_basis,
        at_rest,
        whole,
        instances,
    })
}

/// A MIG GPU's instances over the interval: each with the processes NVML
/// lists in it and GPM's SM utilization since the last read (a first
/// sample gives none). `None` where they cannot be listed (said): the
/// holders then share equally, as before MIG was understood.
fn mig_instances(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
    gpm: &mut Option<HashMap<u32, mig::GpmSample>>,
    processes_v2: bool,
    raw: Result<&Arc<mig::Raw>, &str>,
    said: &mut Said<'_>,
) -> Option<Vec<MigInstance>> {
    let raw = match raw {
        Ok(r) => r,
        Err(e) => {
            said.set(
                "mig",
                Some(format!(
                    "MIG instances cannot be listed ({e}): the holders share equally"
                )),
            );
            return None;
        }
    };
    // SAFETY: the handle of a device NVML gave for this read.
    let parent = unsafe { device.handle() };
    let devices = match raw.mig_devices(parent) {
        Ok(d) if !d.is_empty() => d,
        Ok(_) => {
            said.set(
                "mig",
                Some("MIG is on but no instance is set up: the holders share equally".into()),
            );
            return None;
        }
        Err(e) => {
            said.set(
                "mig",
                Some(format!(
                    "MIG instances cannot be listed ({e}): the holders share equally"
                )),
            );
            return None;
        }
    };
    said.set("mig", None);
    let mut out = Vec::with_capacity(devices.len());
    let mut gpm_problem = None;
    for d in devices {
        // SAFETY: a MIG device handle from the same library, valid while
        // NVML is loaded.
        let md = unsafe {
            nvml_wrapper::Device::new(d.handle as nvml_wrapper_sys::bindings::nvmlDevice_t, nvml)
        };
        let list = if processes_v2 {
            md.running_compute_processes_v2()
        } else {
            md.running_compute_processes()
        };
        let mut pids: Vec<u32> = match list {
            Ok(l) => l.into_iter().map(|p| p.pid).collect(),
            Err(e) => {
                said.set(
                    "mig processes",
                    Some(format!(
                        "instance {}'s process list failed ({e}): its processes get none of its share",
                        d.gpu_instance_id
                    )),
                );
                Vec::new()
            }
        };
        pids.sort_unstable();
        pids.dedup();
        let sm_util_pct = match gpm {
            Some(samples) => match gpm_util(raw, parent, d.gpu_instance_id, samples) {
                Ok(u) => u,
                Err(e) => {
                    gpm_problem.get_or_insert(e);
                    None
                }
            },
            None => None,
        };
        out.push(MigInstance {
            gpu_instance_id: d.gpu_instance_id,
            compute_instance_id: d.compute_instance_id,
            uuid: d.uuid,
            slices: d.slices,
            sms: d.sms,
            sm_util_pct,
            pids,
        });
    }
    said.set(
        "gpm",
        gpm_problem.map(|e| format!("GPM: {e}: the instances are weighed by their compute slices")),
    );
    Some(out)
}

/// Instance `gi`'s SM utilization since its last sample (`Ok(None)`: the
/// first sample, or the first after a failed one); a figure outside
/// 0..=100 is an error (the sample, which was taken, is kept).
fn gpm_util(
    raw: &Arc<mig::Raw>,
    parent: nvml_wrapper_sys::bindings::nvmlDevice_t,
    gi: u32,
    samples: &mut HashMap<u32, mig::GpmSample>,
) -> Result<Option<f64>, String> {
    let now = raw
        .sample()
        .map_err(|e| format!("no sample buffer ({e})"))?;
    if let Err(e) = raw.take(parent, gi, &now) {
        // The next figure starts afresh: one over two intervals is not
        // the next interval's.
        samples.remove(&gi);
        return Err(format!("instance {gi}'s sample failed ({e})"));
    }
    let before = samples.insert(gi, now);
    let Some(before) = before else {
        return Ok(None);
    };
    let now = &samples[&gi];
    let v = raw
        .sm_util(&before, now)
        .map_err(|e| format!("instance {gi}'s metrics failed ({e})"))?;
    mig::sane_util(v)
        .map(|u| Some((u * 1000.0).round() / 1000.0))
        .ok_or_else(|| format!("instance {gi}'s SM utilization read {v}%, which cannot be"))
}

/// Gives each process its instance's weight divided equally among the
/// instance's processes, as a share of the whole GPU's SMs (GPM) or
/// slices; a holder in no instance's list gets none. Returns the basis.
fn mig_shares(instances: &[MigInstance], processes: &mut [GpuProcess]) -> SmBasis {
    let uses: Vec<mig::InstanceUse> = instances
        .iter()
        .map(|i| mig::InstanceUse {
            sms: i.sms,
            slices: i.slices,
            pids: i.pids.clone(),
            sm_util_pct: i.sm_util_pct,
        })
        .collect();
    let (weights, basis) = mig::instance_weights(&uses);
    let whole: f64 = match basis {
        mig::InstanceBasis::Activity => instances.iter().map(|i| f64::from(i.sms)).sum(),
        mig::InstanceBasis::Slices => instances.iter().map(|i| f64::from(i.slices)).sum(),
    };
    for p in processes.iter_mut() {
        p.sm_util_pct = instances
            .iter()
            .zip(&weights)
            .find(|(i, _)| i.pids.contains(&p.pid))
            .map_or(0.0, |(i, w)| {
                let pct = 100.0 * w / whole.max(1.0) / i.pids.len() as f64;
                (pct * 1000.0).round() / 1000.0
            });
    }
    match basis {
        mig::InstanceBasis::Activity => SmBasis::InstanceActivity,
        mig::InstanceBasis::Slices => SmBasis::InstanceSlices,
    }
}

impl Source for NvmlGpus {
    fn name(&self) -> &'static str {
        "nvml"
    }

    fn kind(&self) -> super::ReaderKind {
        super::ReaderKind::Gpu
    }

    fn info(&self) -> SourceInfo {
        SourceInfo {
            domains: self
                .gpus
                .iter()
                .map(|g| (Domain::Gpu, Some(g.info.index)))
                .collect(),
            resolution_uj: Some(1000.0),
            location: "libnvidia-ml".into(),
        }
    }

    /// Every GPU's energy; the detail (power, utilization, processes) is
    /// kept for [`Source::take_gpu_readings`]. When no GPU answers, the
    /// read fails with every GPU's problem.
    fn read(&mut self) -> Result<Vec<DomainEnergy>, SourceError> {
        let readings = self.read_gpus();
        if readings.is_empty() {
            // No GPU gave a reading: the read failed, whether or not its
            // lines were said already (each stays for `take_problems`).
            let mut all: Vec<String> = self
                .problems
                .iter()
                .map(|(i, what)| format!("GPU {i}: {what}"))
                .collect();
            for g in &self.gpus {
                all.extend(
                    g.failing
                        .values()
                        .map(|w| format!("GPU {}: {w}", g.info.index)),
                );
            }
            all.dedup();
            if all.is_empty() {
                all.push("no GPU answered".into());
            }
            return Err(SourceError::Retryable(all.join("; ")));
        }
        let energy = readings
            .iter()
            .map(|r| DomainEnergy {
                domain: Domain::Gpu,
                package: Some(r.index),
                energy_uj: r.energy_uj,
                estimated: r.method == GpuEnergyMethod::PowerIntegration,
                busy_only: false,
            })
            .collect();
        self.last = readings;
        Ok(energy)
    }

    fn take_problems(&mut self) -> Vec<String> {
        self.problems
            .drain(..)
            .map(|(i, what)| format!("GPU {i}: {what}"))
            .collect()
    }

    fn take_gpu_readings(&mut self) -> Vec<GpuReading> {
        std::mem::take(&mut self.last)
    }
}

#[cfg(test)]
mod tests;
