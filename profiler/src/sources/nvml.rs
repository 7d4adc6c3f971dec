//! NVIDIA GPUs through NVML (nvml-wrapper, loading `libnvidia-ml.so.1`).
//!
//! Energy comes from each GPU's total-energy counter (millijoules since
//! the driver loaded; Volta and later). Older GPUs answer
//! `NVML_ERROR_NOT_SUPPORTED`: their energy is integrated from power
//! samples (trapezoids between reads), and marked so. Each read also
//! collects utilization, memory, and per-process SM utilization and GPU
//! memory for attribution. MIG devices are listed; their instances are not
//! attributed separately yet. A GPU that stops answering is reported as
//! lost while the others keep reading; no driver or no GPU is a status,
//! not an error.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::time::Instant;

use nvml_wrapper::{Nvml, error::NvmlError, structs::device::MigMode};
use serde::Serialize;

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
    /// Streaming-multiprocessor utilization, percent.
    pub sm_util_pct: u32,
    /// GPU memory in use, bytes.
    pub memory_bytes: u64,
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
    /// Power draw now (W).
    pub power_w: f64,
    /// GPU utilization, percent.
    pub util_pct: u32,
    /// Memory in use, bytes.
    pub memory_used_bytes: u64,
    /// Processes using it.
    pub processes: Vec<GpuProcess>,
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
    /// MIG mode is enabled (instances are not attributed separately yet).
    pub mig: bool,
}

#[derive(Debug)]
enum Energy {
    Counter(EnergyCounter),
    Integrate {
        last: Option<(Instant, f64)>,
        carry_uj: f64,
    },
}

struct Gpu {
    info: GpuInfo,
    energy: Energy,
    lost: bool,
    last_sample_ts: u64,
}

/// The NVML reader.
pub struct NvmlGpus {
    nvml: Nvml,
    gpus: Vec<Gpu>,
    problems: Vec<(u32, String)>,
    /// The last [`Source::read`]'s detail, until taken.
    last: Vec<GpuReading>,
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
                SourceError::unsupported(
                    "no NVIDIA driver found",
                    "install the NVIDIA driver (it provides libnvidia-ml.so.1) if this machine has an NVIDIA GPU",
                )
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
        let mut gpus = Vec::new();
        let mut problems = Vec::new();
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
                Err(NvmlError::NotSupported) => (
                    Energy::Integrate {
                        last: device
                            .power_usage()
                            .ok()
                            .map(|mw| (Instant::now(), f64::from(mw) / 1e3)),
                        carry_uj: 0.0,
                    },
                    GpuEnergyMethod::PowerIntegration,
                ),
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
                lost: false,
                last_sample_ts: 0,
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
        Ok(Self {
            nvml,
            gpus,
            problems,
            last: Vec::new(),
        })
    }

    /// The GPUs found.
    pub fn gpus(&self) -> Vec<GpuInfo> {
        self.gpus.iter().map(|g| g.info.clone()).collect()
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
            if g.lost {
                self.problems.push((g.info.index, "lost".into()));
                continue;
            }
            let device = match self.nvml.device_by_index(g.info.index) {
                Ok(d) => d,
                Err(e) => {
                    g.lost = true;
                    self.problems.push((g.info.index, nvml_err("lost", &e)));
                    continue;
                }
            };
            let power = device.power_usage();
            let power_w = power.as_ref().ok().map(|mw| f64::from(*mw) / 1e3);
            let energy_uj = match &mut g.energy {
                Energy::Counter(c) => device
                    .total_energy_consumption()
                    .map(|mj| c.advance(mj).unwrap_or(0)),
                Energy::Integrate { last, carry_uj } => power.map(|mw| {
                    let (now, w) = (Instant::now(), f64::from(mw) / 1e3);
                    let uj = last.map_or(0.0, |(t, w0)| {
                        (now - t).as_secs_f64() * (w0 + w) / 2.0 * 1e6
                    }) + *carry_uj;
                    *last = Some((now, w));
                    *carry_uj = uj - uj.floor();
                    uj.floor() as u64
                }),
            };
            let energy_uj = match energy_uj {
                Ok(e) => e,
                Err(e) => {
                    if matches!(e, NvmlError::GpuLost | NvmlError::Unknown) {
                        g.lost = true;
                    }
                    self.problems.push((g.info.index, nvml_err("energy", &e)));
                    continue;
                }
            };
            let mut memory: HashMap<u32, u64> = device
                .running_compute_processes()
                .unwrap_or_default()
                .into_iter()
                .map(|p| {
                    let bytes = match p.used_gpu_memory {
                        nvml_wrapper::enums::device::UsedGpuMemory::Used(b) => b,
                        nvml_wrapper::enums::device::UsedGpuMemory::Unavailable => 0,
                    };
                    (p.pid, bytes)
                })
                .collect();
            let samples = device
                .process_utilization_stats(g.last_sample_ts)
                .unwrap_or_default();
            g.last_sample_ts = samples
                .iter()
                .map(|s| s.timestamp)
                .max()
                .unwrap_or(g.last_sample_ts);
            let mut processes: Vec<GpuProcess> = samples
                .iter()
                .map(|s| GpuProcess {
                    pid: s.pid,
                    sm_util_pct: s.sm_util,
                    memory_bytes: memory.remove(&s.pid).unwrap_or(0),
                })
                .collect();
            processes.extend(memory.into_iter().map(|(pid, memory_bytes)| GpuProcess {
                pid,
                sm_util_pct: 0,
                memory_bytes,
            }));
            processes.sort_by_key(|p| p.pid);
            out.push(GpuReading {
                index: g.info.index,
                energy_uj,
                method: g.info.method,
                power_w: power_w.unwrap_or(0.0),
                util_pct: device.utilization_rates().map_or(0, |u| u.gpu),
                memory_used_bytes: device.memory_info().map_or(0, |m| m.used),
                processes,
            });
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
        if readings.is_empty() && !self.problems.is_empty() {
            // Each GPU's problem stays for `take_problems`, a line each.
            let all: Vec<String> = self
                .problems
                .iter()
                .map(|(i, what)| format!("GPU {i}: {what}"))
                .collect();
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
