//! NVIDIA GPUs through NVML (nvml-wrapper, loading `libnvidia-ml.so.1`).
//! Energy comes from each GPU's total-energy counter (millijoules since
//! the driver loaded; Volta and later). Where the counter cannot be read
//! (older GPUs answer `NVML_ERROR_NOT_SUPPORTED`; a container or a driver
//! may answer NO_PERMISSION, FUNCTION_NOT_FOUND or lack the symbol), energy
//! is integrated from power readings (trapezoids between reads), marked
//! estimated and reported. Each read also takes utilization, memory and
//! each process's SM share and memory.
//!
//! NVML is read as it behaves, not as documented:
//! - NVML returns of each process only its newest sample, and (on an
//!   H200) that sample is its SM over about the last 2 s, revised while
//!   newest, published for one process per period under time-slicing; so
//!   every 100 ms a call observes each process's newest sample
//!   ([`sampler`]), and a process's share is the mean of its observations
//!   in the interval;
//! - per-process samples are sanitised (the pid is in the driver's process
//!   list at this read or the last, SM at most 100, the timestamp within
//!   the calls' look-back and not in the future), exact repeats within a
//!   call reported, and the last timestamp seen never moves into the
//!   future;
//! - a count race (INSUFFICIENT_SIZE) is retried;
//! - an interval with no new sample (the driver samples every 1/6 s to
//!   1 s) uses the shares of the samples seen within the last 2 s
//!   ([`SmBasis::Carried`]), else the holders share equally
//!   ([`SmBasis::Equal`]); a holder with no observation in an interval
//!   keeps its last share for up to 2 s;
//! - every failure that changes a figure is a problem line when it starts
//!   and when it ends; a failed reading is absent, never 0;
//! - a transient error (Unknown) skips one read, whose energy comes with
//!   the next; a lost GPU (GPU_IS_LOST) is tried again every read;
//! - drivers 535.43–535.86, which write `_v3` process entries NVML's header
//!   does not describe, are asked through `_v2`.
//!
//! - under MPS the clients are listed apart from the compute list (which
//!   holds the server): both lists are the holders ([`mps`]);
//! - on a MIG-enabled GPU NVML gives no utilization at all: its instances
//!   are listed with their processes, and the GPU's energy goes to them by
//!   each instance's busy SMs from GPM (Hopper and later), else by compute
//!   slices, and equally among an instance's processes ([`mig`]).
//!
//! No driver or no GPU is a status, not an error.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use nvml_wrapper::{Nvml, error::NvmlError, structs::device::MigMode};
use serde::Serialize;

mod container;
pub(crate) mod cuda;
mod energy;
pub(crate) mod mig;
mod mps;
mod read;
mod said;
pub(crate) mod sampler;
mod samples;
pub(crate) mod statics;

pub(crate) use container::container_hint;
use energy::Energy;

use sampler::{Pending, Sampler};
pub(crate) use samples::{sanitise, v3_quirk};

use super::{
    Domain, DomainEnergy, Source, SourceError, SourceInfo,
    counter::{EnergyCounter, WrappingCounter},
};

/// How a GPU's energy is obtained.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GpuEnergyMethod {
    /// The GPU's own total-energy counter (exact to 1 mJ).
    EnergyCounter,
    /// Power samples integrated over time (an estimate between samples).
    PowerIntegration,
}

/// One process's use of a GPU over the last interval.
#[derive(Clone, Debug, PartialEq)]
pub struct GpuProcess {
    /// Process id.
    pub pid: u32,
    /// Streaming-multiprocessor utilization, percent, over the
    /// interval: the mean of its observations (0.001 resolution).
    pub sm_util_pct: f64,
    /// GPU memory in use, bytes.
    pub memory_bytes: u64,
}

/// Where an interval's per-process SM shares come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum SmBasis {
    /// A new sample of NVML's came in the interval.
    #[default]
    Sampled,
    /// No sample new to this read: the shares of what it observed (a
    /// sample an earlier read saw, returned again by the look-back) or,
    /// for a holder with no observation, its last share within 2 s.
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
#[derive(Clone, Debug, PartialEq)]
pub struct GpuReading {
    /// NVML index.
    pub index: u32,
    /// Energy since the previous read (µJ).
    pub energy_uj: u64,
    /// How it was obtained.
    pub method: GpuEnergyMethod,
    /// Power draw now (W; on Ampere and later, the driver's mean over the
    /// last second). `None`: the read failed (reported).
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
    /// MIG: the busy SMs of GPU instances with no process listed, on the
    /// processes' scale (`sm_util_pct`): their share of the dynamic
    /// energy goes to no one.
    pub unheld_sm_pct: f64,
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
    /// GPM's SM utilization of its GPU instance over the interval,
    /// percent of that GPU instance's SMs (`None`: no GPM, or no sane
    /// figure this interval).
    pub sm_util_pct: Option<f64>,
    /// The processes NVML lists in it.
    pub pids: Vec<u32>,
    /// Its process list was read (`false`: it failed, reported).
    pub listed: bool,
}

/// A GPU found.
#[derive(Clone, Debug, PartialEq, Serialize)]
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

/// How long a holder's share is carried into intervals with no new
/// sample of it: the driver's slowest sampling period (1 s) twice over,
/// as nvitop reads 2 s back, and the window an H200's sample covers
/// (under time-slicing it publishes one process per period, so with many
/// holders one can go an interval without a sample).
pub(crate) const CARRY_SHARES: Duration = Duration::from_secs(2);

/// Past this long lost, a GPU's counter is started afresh when it answers
/// again (its energy meanwhile is not divided: reported); within it, the
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
    /// The MPS clients at the last read: one that left since is given
    /// its part of the server's samples of the interval.
    mps_before: Vec<u32>,
    /// Each process's latest sampled share (pid → when, SM %).
    shares: HashMap<u32, (Instant, f64)>,
    /// Failures going on, by what failed: reported when they begin and end.
    failing: BTreeMap<&'static str, String>,
    /// MIG: whether GPM answers, and each GPU instance's last sample.
    gpm: Option<HashMap<u32, mig::GpmState>>,
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
    /// The MIG, GPM and MPS calls, or why they cannot be made.
    raw: Result<Arc<mig::Raw>, String>,
}

impl Drop for NvmlGpus {
    fn drop(&mut self) {
        // GPM's sample buffers are freed while NVML is still loaded (the
        // fields drop in order, `nvml` first).
        for g in &mut self.gpus {
            g.gpm = None;
        }
    }
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

/// NVML's init failure in one line with its fix: no driver (in a
/// container, the toolkit's option first), no permission, or NVML's own.
fn init_error(e: NvmlError) -> SourceError {
    match e {
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
    }
}

/// One GPU by index: its energy counter, or power integrated where the
/// counter cannot be read (reported); `None` (reported) when it has no
/// handle or gives neither.
fn open_gpu(nvml: &Nvml, index: u32, problems: &mut Vec<(u32, String)>) -> Option<Gpu> {
    let device = match nvml.device_by_index(index) {
        Ok(d) => d,
        Err(e) => {
            problems.push((index, nvml_err("handle", &e)));
            return None;
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
            return None;
        }
    };
    Some(Gpu {
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
        mps_before: Vec::new(),
        shares: HashMap::new(),
        failing: BTreeMap::new(),
        gpm: None,
    })
}

impl NvmlGpus {
    /// Loads NVML (from `lib`, or the driver's `libnvidia-ml.so.1`) and
    /// finds every GPU.
    pub fn open(lib: Option<&OsStr>) -> Result<Self, SourceError> {
        let mut builder = Nvml::builder();
        if let Some(lib) = lib {
            builder.lib_path(lib);
        }
        let nvml = builder.init().map_err(init_error)?;
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
            gpus.extend(open_gpu(&nvml, index, &mut problems));
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
        // The calls nvml-wrapper does not wrap (MIG, GPM, MPS), through the
        // same library.
        let raw = mig::Raw::open(lib).map(Arc::new);
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
        let s = Sampler::start(Arc::clone(&self.nvml), gpus, every, self.processes_v2).map_err(
            |e| {
                format!(
                    "the thread that fetches NVML's samples between reads could not start ({e}): \
                 each read weighs its interval by one sample per process"
                )
            },
        )?;
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
            if let Some(r) =
                read::read_gpu(&self.nvml, g, self.processes_v2, raw, &mut self.problems)
            {
                out.push(r);
            }
        }
        out
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
            // lines were reported already (each stays for `take_problems`).
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
