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
