//! MIG: a GPU split into instances, each with its own processes. On a
//! MIG-enabled GPU NVML gives no utilization, per process or per device;
//! GPM (Hopper and later) gives each GPU instance's SM utilization
//! between two samples. nvml-wrapper 0.11 wraps none of these calls, so
//! they are made through nvml-wrapper-sys's `NvmlLib`: the same library
//! loaded again (`dlopen` hands back the one already loaded, initialised
//! by nvml-wrapper), each symbol looked up on its own, so a driver that
//! lacks one (pre-MIG, pre-GPM) answers FailedToLoadSymbol instead of
//! failing the reader.
//!
//! How a MIG GPU's energy is divided ([`instance_weights`]):
//! - across instances, by each instance's busy SMs: GPM's SM utilization
//!   × the instance's SMs ([`InstanceBasis::Activity`]), where the GPU
//!   supports GPM and both samples of the interval are sane;
//! - otherwise by each instance's compute slices, among the instances
//!   whose processes hold a context ([`InstanceBasis::Slices`], said);
//! - within an instance, equally among its processes: NVML gives no
//!   per-process utilization under MIG, and GPM none per process.

use std::ffi::OsStr;
use std::sync::Arc;

use nvml_wrapper::error::{NvmlError, nvml_sym, nvml_try};
use nvml_wrapper_sys::bindings::{
    NVML_GPM_METRICS_GET_VERSION, NVML_GPM_SUPPORT_VERSION, NvmlLib, nvmlDevice_t,
    nvmlDeviceAttributes_t, nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL, nvmlGpmMetricsGet_t,
    nvmlGpmSample_t, nvmlGpmSupport_t, nvmlReturn_enum_NVML_ERROR_NOT_FOUND,
};
use serde::{Deserialize, Serialize};

use std::collections::HashMap;

use nvml_wrapper::Nvml;

use super::said::Said;
use super::{GpuProcess, MigInstance, SmBasis};

/// The library's MIG and GPM calls.
pub(crate) struct Raw {
    lib: NvmlLib,
}

/// One MIG device (a compute instance of a GPU instance).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct MigDevice {
    /// Its handle (valid while NVML is loaded).
    pub(crate) handle: usize,
    /// Its GPU instance.
    pub(crate) gpu_instance_id: u32,
    /// Its compute instance within that GPU instance.
    pub(crate) compute_instance_id: u32,
    /// `MIG-...`.
    pub(crate) uuid: String,
    /// Its compute slices.
    pub(crate) slices: u32,
    /// Its streaming multiprocessors.
    pub(crate) sms: u32,
}

/// How a MIG GPU's energy went across its instances in an interval.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InstanceBasis {
    /// By each instance's busy SMs, from GPM.
    Activity,
    /// By each instance's compute slices (no GPM, or no sane sample).
    Slices,
}

/// A GPM sample buffer, freed when dropped.
pub(crate) struct GpmSample {
    raw: Arc<Raw>,
    ptr: nvmlGpmSample_t,
}

impl Drop for GpmSample {
    fn drop(&mut self) {
        if let Ok(free) = nvml_sym(self.raw.lib.nvmlGpmSampleFree.as_ref()) {
            // SAFETY: allocated by nvmlGpmSampleAlloc, freed once.
            unsafe { free(self.ptr) };
        }
    }
}

impl Raw {
    /// The library at `lib` (or the driver's), loaded again.
    pub(crate) fn open(lib: Option<&OsStr>) -> Result<Self, String> {
        let path = lib.unwrap_or(OsStr::new("libnvidia-ml.so.1"));
        // SAFETY: NVML's library, already loaded and initialised by
        // nvml-wrapper from the same path; its initialisers ran then.
        let lib = unsafe { NvmlLib::new(path) }.map_err(|e| e.to_string())?;
        Ok(Self { lib })
    }

    /// The MIG devices of the GPU `parent`, in slot order; an empty slot
    /// is skipped (the driver answers NOT_FOUND for it).
    pub(crate) fn mig_devices(&self, parent: nvmlDevice_t) -> Result<Vec<MigDevice>, NvmlError> {
        let max = nvml_sym(self.lib.nvmlDeviceGetMaxMigDeviceCount.as_ref())?;
        let by_index = nvml_sym(self.lib.nvmlDeviceGetMigDeviceHandleByIndex.as_ref())?;
        let gi_id = nvml_sym(self.lib.nvmlDeviceGetGpuInstanceId.as_ref())?;
        let ci_id = nvml_sym(self.lib.nvmlDeviceGetComputeInstanceId.as_ref())?;
        let attrs = nvml_sym(self.lib.nvmlDeviceGetAttributes_v2.as_ref())?;
        let uuid = nvml_sym(self.lib.nvmlDeviceGetUUID.as_ref())?;
        let mut count = 0;
        // SAFETY: a device handle from NVML, a valid out-pointer.
        nvml_try(unsafe { max(parent, &mut count) })?;
        let mut out = Vec::new();
        // At most 64 slots: a garbage count does not loop for long.
        for index in 0..count.min(64) {
            let mut handle: nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: as above.
            let rc = unsafe { by_index(parent, index, &mut handle) };
            if rc == nvmlReturn_enum_NVML_ERROR_NOT_FOUND {
                continue;
            }
            nvml_try(rc)?;
            let (mut gi, mut ci) = (0, 0);
            // SAFETY: a MIG device handle, valid out-pointers.
            nvml_try(unsafe { gi_id(handle, &mut gi) })?;
            // SAFETY: as above.
            nvml_try(unsafe { ci_id(handle, &mut ci) })?;
            // SAFETY: zeroed plain data, filled by the call.
            let mut a: nvmlDeviceAttributes_t = unsafe { std::mem::zeroed() };
            // SAFETY: a MIG device handle, a valid out-pointer.
            nvml_try(unsafe { attrs(handle, &mut a) })?;
            let mut buf = [0 as std::ffi::c_char; 96];
            // SAFETY: a buffer of the length given.
            let rc = unsafe { uuid(handle, buf.as_mut_ptr(), buf.len() as u32) };
            let id = if rc == 0 && buf.contains(&0) {
                // SAFETY: NUL-terminated within the buffer (checked).
                unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
                    .to_string_lossy()
                    .into_owned()
            } else {
                String::new()
            };
            out.push(MigDevice {
                handle: handle as usize,
                gpu_instance_id: gi,
                compute_instance_id: ci,
                uuid: id,
                slices: a.computeInstanceSliceCount,
                sms: a.multiprocessorCount,
            });
        }
        Ok(out)
    }

    /// Whether the GPU `parent` gives GPM metrics (Hopper and later).
    pub(crate) fn gpm_supported(&self, parent: nvmlDevice_t) -> bool {
        let Ok(query) = nvml_sym(self.lib.nvmlGpmQueryDeviceSupport.as_ref()) else {
            return false;
        };
        let mut s = nvmlGpmSupport_t {
            version: NVML_GPM_SUPPORT_VERSION,
            isSupportedDevice: 0,
        };
        // SAFETY: a device handle, a valid struct with its version set.
        unsafe { query(parent, &mut s) == 0 && s.isSupportedDevice != 0 }
    }

    /// A fresh GPM sample buffer.
    pub(crate) fn sample(self: &Arc<Self>) -> Result<GpmSample, NvmlError> {
        let alloc = nvml_sym(self.lib.nvmlGpmSampleAlloc.as_ref())?;
        let mut ptr: nvmlGpmSample_t = std::ptr::null_mut();
        // SAFETY: a valid out-pointer.
        nvml_try(unsafe { alloc(&mut ptr) })?;
        Ok(GpmSample {
            raw: Arc::clone(self),
            ptr,
        })
    }

    /// Takes GPU instance `gi`'s counters into `into`.
    pub(crate) fn take(
        &self,
        parent: nvmlDevice_t,
        gi: u32,
        into: &GpmSample,
    ) -> Result<(), NvmlError> {
        let get = nvml_sym(self.lib.nvmlGpmMigSampleGet.as_ref())?;
        // SAFETY: a device handle and a sample buffer from the library.
        nvml_try(unsafe { get(parent, gi, into.ptr) })
    }

    /// The SM utilization (%) between two samples of one instance, as
    /// the driver says it (not checked here).
    pub(crate) fn sm_util(&self, from: &GpmSample, to: &GpmSample) -> Result<f64, NvmlError> {
        let get = nvml_sym(self.lib.nvmlGpmMetricsGet.as_ref())?;
        // SAFETY: zeroed plain data (null pointers, zero numbers).
        let mut m: nvmlGpmMetricsGet_t = unsafe { std::mem::zeroed() };
        m.version = NVML_GPM_METRICS_GET_VERSION;
        m.numMetrics = 1;
        m.sample1 = from.ptr;
        m.sample2 = to.ptr;
        m.metrics[0].metricId = nvmlGpmMetricId_t_NVML_GPM_METRIC_SM_UTIL;
        // SAFETY: the struct as the header defines it, its samples live.
        nvml_try(unsafe { get(&mut m) })?;
        nvml_try(m.metrics[0].nvmlReturn)?;
        Ok(m.metrics[0].value)
    }
}

/// One instance in an interval: its SMs and slices, the processes NVML
/// lists in it, and its SM utilization from GPM when there is a sane one.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct InstanceUse {
    /// Its streaming multiprocessors.
    pub(crate) sms: u32,
    /// Its compute slices.
    pub(crate) slices: u32,
    /// Its processes.
    pub(crate) pids: Vec<u32>,
    /// GPM's SM utilization over the interval (%).
    pub(crate) sm_util_pct: Option<f64>,
}

/// Each instance's weight in the GPU's dynamic energy, and how they were
/// made: busy SMs (utilization × SMs) when every instance with processes
/// has a GPM figure, else compute slices among the instances that have
/// processes. An instance with no process weighs nothing: its share of
/// the dynamic energy cannot go to anyone, and the GPU's idle power
/// already went to the idle row.
pub(crate) fn instance_weights(instances: &[InstanceUse]) -> (Vec<f64>, InstanceBasis) {
    let with_pids = || instances.iter().filter(|i| !i.pids.is_empty());
    if with_pids().all(|i| i.sm_util_pct.is_some()) {
        let w = instances
            .iter()
            .map(|i| match (&i.pids[..], i.sm_util_pct) {
                ([], _) | (_, None) => 0.0,
                (_, Some(u)) => u / 100.0 * f64::from(i.sms),
            })
            .collect();
        return (w, InstanceBasis::Activity);
    }
    let w = instances
        .iter()
        .map(|i| {
            if i.pids.is_empty() {
                0.0
            } else {
                f64::from(i.slices)
            }
        })
        .collect();
    (w, InstanceBasis::Slices)
}

/// A GPM figure the driver gave: a percentage within 0..=100, else none.
pub(crate) fn sane_util(v: f64) -> Option<f64> {
    (v.is_finite() && (0.0..=100.0).contains(&v)).then_some(v)
}

/// A MIG GPU's instances over the interval: each with the processes NVML
/// lists in it and GPM's SM utilization since the last read (a first
/// sample gives none). `None` where they cannot be listed (said): the
/// holders then share equally, as before MIG was understood.
pub(super) fn mig_instances(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
    gpm: &mut Option<HashMap<u32, GpmSample>>,
    processes_v2: bool,
    raw: Result<&Arc<Raw>, &str>,
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
    raw: &Arc<Raw>,
    parent: nvml_wrapper_sys::bindings::nvmlDevice_t,
    gi: u32,
    samples: &mut HashMap<u32, GpmSample>,
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
    sane_util(v)
        .map(|u| Some((u * 1000.0).round() / 1000.0))
        .ok_or_else(|| format!("instance {gi}'s SM utilization read {v}%, which cannot be"))
}

/// Gives each process its instance's weight divided equally among the
/// instance's processes, as a share of the whole GPU's SMs (GPM) or
/// slices; a holder in no instance's list gets none. Returns the basis.
pub(super) fn mig_shares(instances: &[MigInstance], processes: &mut [GpuProcess]) -> SmBasis {
    let uses: Vec<InstanceUse> = instances
        .iter()
        .map(|i| InstanceUse {
            sms: i.sms,
            slices: i.slices,
            pids: i.pids.clone(),
            sm_util_pct: i.sm_util_pct,
        })
        .collect();
    let (weights, basis) = instance_weights(&uses);
    let whole: f64 = match basis {
        InstanceBasis::Activity => instances.iter().map(|i| f64::from(i.sms)).sum(),
        InstanceBasis::Slices => instances.iter().map(|i| f64::from(i.slices)).sum(),
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
        InstanceBasis::Activity => SmBasis::InstanceActivity,
        InstanceBasis::Slices => SmBasis::InstanceSlices,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(sms: u32, slices: u32, pids: &[u32], util: Option<f64>) -> InstanceUse {
        InstanceUse {
            sms,
            slices,
            pids: pids.to_vec(),
            sm_util_pct: util,
        }
    }

    #[test]
    fn instances_weigh_by_busy_sms_with_gpm_else_by_slices_of_those_with_processes() {
        // 3 slices at 20% against 1 at 90%: busy SMs 12 and 14.4.
        let (w, b) = instance_weights(&[
            inst(60, 3, &[1], Some(20.0)),
            inst(16, 1, &[2, 3], Some(90.0)),
            inst(20, 1, &[], Some(0.0)),
        ]);
        assert_eq!(b, InstanceBasis::Activity);
        assert_eq!(w, vec![12.0, 14.4, 0.0]);
        // One instance with processes and no GPM figure: slices, for all.
        let (w, b) = instance_weights(&[
            inst(60, 3, &[1], Some(20.0)),
            inst(16, 1, &[2], None),
            inst(20, 1, &[], None),
        ]);
        assert_eq!(b, InstanceBasis::Slices);
        assert_eq!(w, vec![3.0, 1.0, 0.0]);
    }

    #[test]
    fn a_gpm_figure_outside_0_to_100_is_no_figure() {
        assert_eq!(sane_util(42.5), Some(42.5));
        assert_eq!(sane_util(250.0), None);
        assert_eq!(sane_util(-1.0), None);
        assert_eq!(sane_util(f64::NAN), None);
    }
}
