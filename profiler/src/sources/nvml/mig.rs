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
//!   whose processes hold a context ([`InstanceBasis::Slices`], reported);
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

/// The library's calls nvml-wrapper does not wrap: MIG, GPM and MPS.
pub(crate) struct Raw {
    pub(super) lib: NvmlLib,
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

    /// The MIG devices (compute instances) of the GPU `parent`, in slot
    /// order, and the slots that failed (each skipped, reported); an empty
    /// slot is no device (the driver answers NOT_FOUND for it).
    pub(crate) fn mig_devices(
        &self,
        parent: nvmlDevice_t,
    ) -> Result<(Vec<MigDevice>, Vec<String>), NvmlError> {
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
        let mut skipped = Vec::new();
        // At most 64 slots: a garbage count does not loop for long.
        for index in 0..count.min(64) {
            let mut handle: nvmlDevice_t = std::ptr::null_mut();
            // SAFETY: as above.
            let rc = unsafe { by_index(parent, index, &mut handle) };
            if rc == nvmlReturn_enum_NVML_ERROR_NOT_FOUND {
                continue;
            }
            let (mut gi, mut ci) = (0, 0);
            // SAFETY: zeroed plain data, filled by the call.
            let mut a: nvmlDeviceAttributes_t = unsafe { std::mem::zeroed() };
            // One slot that fails (an instance destroyed while listed) is
            // skipped, the others kept.
            let read = nvml_try(rc)
                // SAFETY: a MIG device handle, valid out-pointers.
                .and_then(|()| nvml_try(unsafe { gi_id(handle, &mut gi) }))
                // SAFETY: as above.
                .and_then(|()| nvml_try(unsafe { ci_id(handle, &mut ci) }))
                // SAFETY: as above.
                .and_then(|()| nvml_try(unsafe { attrs(handle, &mut a) }));
            if let Err(e) = read {
                skipped.push(format!("slot {index}: {e}"));
                continue;
            }
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
        Ok((out, skipped))
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

/// One GPU instance in an interval: its compute instances' SMs and
/// slices together, the processes NVML lists in them, and its SM
/// utilization from GPM when there is a sane one.
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
    /// Every one of its process lists was read.
    pub(crate) listed: bool,
}

/// Each GPU instance's weight in the GPU's dynamic energy, how they were
/// made, and the weight of work no listed process did: busy SMs
/// (utilization × SMs) when every instance with processes has a GPM
/// figure, else compute slices among the instances that have processes.
/// A busy instance with no process listed (its list failed, or NVML does
/// not show its processes) keeps its busy SMs as the unheld weight, whose
/// share of the dynamic energy goes to no one: not to other instances.
/// By slices, an instance whose process list failed keeps its slices as
/// the unheld weight (its work is not known to be none).
pub(crate) fn instance_weights(instances: &[InstanceUse]) -> (Vec<f64>, InstanceBasis, f64) {
    let with_pids = || instances.iter().filter(|i| !i.pids.is_empty());
    if with_pids().all(|i| i.sm_util_pct.is_some()) {
        let busy = |i: &InstanceUse| i.sm_util_pct.unwrap_or(0.0) / 100.0 * f64::from(i.sms);
        let w = instances
            .iter()
            .map(|i| if i.pids.is_empty() { 0.0 } else { busy(i) })
            .collect();
        let unheld = instances
            .iter()
            .filter(|i| i.pids.is_empty())
            .map(busy)
            .sum();
        return (w, InstanceBasis::Activity, unheld);
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
    let unheld = instances
        .iter()
        .filter(|i| i.pids.is_empty() && !i.listed)
        .map(|i| f64::from(i.slices))
        .sum();
    (w, InstanceBasis::Slices, unheld)
}

/// A GPM figure the driver gave: a percentage within 0..=100, else none.
pub(crate) fn sane_util(v: f64) -> Option<f64> {
    (v.is_finite() && (0.0..=100.0).contains(&v)).then_some(v)
}

/// The shortest span GPM gives a figure over: NVML asks for samples at
/// least 100 ms apart.
const GPM_MIN_SPAN: std::time::Duration = std::time::Duration::from_millis(100);

/// A GPU instance's GPM state: its last sample, when it was taken, and
/// the figure it ended.
pub(crate) struct GpmState {
    sample: GpmSample,
    at: std::time::Instant,
    util: Option<f64>,
}

/// A MIG GPU's instances over the interval, one per compute instance:
/// the processes NVML lists in each (with their memory, also returned by
/// pid), and its GPU instance's SM utilization from GPM since the last
/// read (sampled once per GPU instance; the first read gives none).
/// `None` where they cannot be listed (reported): the holders then share
/// equally, as before MIG was understood.
pub(super) fn mig_instances(
    nvml: &Nvml,
    device: &nvml_wrapper::Device<'_>,
    gpm: &mut Option<HashMap<u32, GpmState>>,
    processes_v2: bool,
    raw: Result<&Arc<Raw>, &str>,
    said: &mut Said<'_>,
) -> Option<(Vec<MigInstance>, HashMap<u32, u64>)> {
    let cannot = |e: &dyn std::fmt::Display| {
        format!("MIG instances cannot be listed ({e}): the holders share equally")
    };
    let raw = match raw {
        Ok(r) => r,
        Err(e) => {
            said.set("mig", Some(cannot(&e)));
            return None;
        }
    };
    // SAFETY: the handle of a device NVML gave for this read.
    let parent = unsafe { device.handle() };
    let devices = match raw.mig_devices(parent) {
        Ok((d, skipped)) if !d.is_empty() => {
            said.set(
                "mig slots",
                (!skipped.is_empty()).then(|| {
                    format!(
                        "MIG slots that could not be read are left out ({}): their processes get \
                         no share of its own",
                        skipped.join("; ")
                    )
                }),
            );
            d
        }
        Ok(_) => {
            said.set(
                "mig",
                Some("MIG is on but no instance is set up: the holders share equally".into()),
            );
            return None;
        }
        Err(e) => {
            said.set("mig", Some(cannot(&e)));
            return None;
        }
    };
    said.set("mig", None);
    let mut out = Vec::with_capacity(devices.len());
    let mut memory: HashMap<u32, u64> = HashMap::new();
    let mut list_problem = None;
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
        let listed = list.is_ok();
        let mut pids: Vec<u32> = match list {
            Ok(l) => l
                .into_iter()
                .map(|p| {
                    if let nvml_wrapper::enums::device::UsedGpuMemory::Used(b) = p.used_gpu_memory {
                        memory.insert(p.pid, b);
                    }
                    p.pid
                })
                .collect(),
            Err(e) => {
                list_problem.get_or_insert(format!(
                    "instance {}.{}'s process list failed ({e}): its work goes to no one",
                    d.gpu_instance_id, d.compute_instance_id
                ));
                Vec::new()
            }
        };
        pids.sort_unstable();
        pids.dedup();
        out.push(MigInstance {
            gpu_instance_id: d.gpu_instance_id,
            compute_instance_id: d.compute_instance_id,
            uuid: d.uuid,
            slices: d.slices,
            sms: d.sms,
            sm_util_pct: None,
            pids,
            listed,
        });
    }
    said.set("mig processes", list_problem);
    // GPM is per GPU instance: one sample each per read.
    if let Some(state) = gpm {
        gpm_activity(raw, parent, state, &mut out, said);
    }
    Some((out, memory))
}

/// Each instance's SM utilization from GPM, one sample per GPU instance;
/// a failure reported (the instances are then weighed by compute slices).
fn gpm_activity(
    raw: &Arc<Raw>,
    parent: nvml_wrapper_sys::bindings::nvmlDevice_t,
    state: &mut HashMap<u32, GpmState>,
    out: &mut [MigInstance],
    said: &mut Said<'_>,
) {
    let mut gis: Vec<u32> = out.iter().map(|i| i.gpu_instance_id).collect();
    gis.sort_unstable();
    gis.dedup();
    let mut problem = None;
    for gi in &gis {
        let util = gpm_util(raw, parent, *gi, state).unwrap_or_else(|e| {
            problem.get_or_insert(e);
            None
        });
        for i in out.iter_mut().filter(|i| i.gpu_instance_id == *gi) {
            i.sm_util_pct = util;
        }
    }
    // An instance gone (or remade) starts afresh.
    state.retain(|gi, _| gis.contains(gi));
    said.set(
        "gpm",
        problem.map(|e| format!("GPM: {e}: the instances are weighed by their compute slices")),
    );
}

/// GPU instance `gi`'s SM utilization since its last sample: `Ok(None)`
/// for the first sample, or the first after a failed one; the last figure
/// when the last sample is under 100 ms old (NVML's shortest span, so a
/// short `--interval` weighs by the last figure). A figure outside
/// 0..=100 is an error (the sample, which was taken, is kept).
fn gpm_util(
    raw: &Arc<Raw>,
    parent: nvml_wrapper_sys::bindings::nvmlDevice_t,
    gi: u32,
    state: &mut HashMap<u32, GpmState>,
) -> Result<Option<f64>, String> {
    if let Some(s) = state.get(&gi)
        && s.at.elapsed() < GPM_MIN_SPAN
    {
        return Ok(s.util);
    }
    // Whatever fails, the next figure starts afresh: one over two
    // intervals is not the next interval's.
    let sample = match raw.sample() {
        Ok(s) => s,
        Err(e) => {
            state.remove(&gi);
            return Err(format!("no sample buffer ({e})"));
        }
    };
    if let Err(e) = raw.take(parent, gi, &sample) {
        state.remove(&gi);
        return Err(format!("instance {gi}'s sample failed ({e})"));
    }
    let now = GpmState {
        sample,
        at: std::time::Instant::now(),
        util: None,
    };
    let Some(before) = state.insert(gi, now) else {
        return Ok(None);
    };
    let Some(now) = state.get_mut(&gi) else {
        return Ok(None);
    };
    let v = raw
        .sm_util(&before.sample, &now.sample)
        .map_err(|e| format!("instance {gi}'s metrics failed ({e})"))?;
    let u = sane_util(v)
        .map(|u| (u * 1000.0).round() / 1000.0)
        .ok_or_else(|| format!("instance {gi}'s SM utilization read {v}%, which cannot be"))?;
    now.util = Some(u);
    Ok(Some(u))
}

/// Gives each process its GPU instance's weight divided equally among
/// the instance's processes (all its compute instances'), as a share of
/// the whole GPU's SMs (GPM) or slices; a holder in no instance's list
/// gets none. Returns the basis, and the unheld weight (busy SMs of
/// instances with no listed process) on the same scale.
pub(super) fn mig_shares(
    instances: &[MigInstance],
    processes: &mut [GpuProcess],
) -> (SmBasis, f64) {
    // Per GPU instance: its compute instances together.
    let mut gis: Vec<u32> = instances.iter().map(|i| i.gpu_instance_id).collect();
    gis.sort_unstable();
    gis.dedup();
    let uses: Vec<InstanceUse> = gis
        .iter()
        .map(|gi| {
            let cis = instances.iter().filter(|i| i.gpu_instance_id == *gi);
            let mut pids: Vec<u32> = cis.clone().flat_map(|i| i.pids.iter().copied()).collect();
            pids.sort_unstable();
            pids.dedup();
            InstanceUse {
                sms: cis.clone().map(|i| i.sms).sum(),
                slices: cis.clone().map(|i| i.slices).sum(),
                pids,
                sm_util_pct: cis.clone().find_map(|i| i.sm_util_pct),
                listed: cis.clone().all(|i| i.listed),
            }
        })
        .collect();
    let (weights, basis, unheld) = instance_weights(&uses);
    let whole: f64 = match basis {
        InstanceBasis::Activity => uses.iter().map(|i| f64::from(i.sms)).sum(),
        InstanceBasis::Slices => uses.iter().map(|i| f64::from(i.slices)).sum(),
    };
    let pct = |w: f64| ((100.0 * w / whole.max(1.0)) * 1000.0).round() / 1000.0;
    for p in processes.iter_mut() {
        p.sm_util_pct = uses
            .iter()
            .zip(&weights)
            .find(|(i, _)| i.pids.contains(&p.pid))
            .map_or(0.0, |(i, w)| pct(w / i.pids.len() as f64));
    }
    let basis = match basis {
        InstanceBasis::Activity => SmBasis::InstanceActivity,
        InstanceBasis::Slices => SmBasis::InstanceSlices,
    };
    (basis, pct(unheld))
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
            listed: true,
        }
    }

    #[test]
    fn instances_weigh_by_busy_sms_with_gpm_else_by_slices_of_those_with_processes() {
        // 3 slices at 20% against 1 at 90%: busy SMs 12 and 14.4.
        let (w, b, unheld) = instance_weights(&[
            inst(60, 3, &[1], Some(20.0)),
            inst(16, 1, &[2, 3], Some(90.0)),
            inst(20, 1, &[], Some(0.0)),
        ]);
        assert_eq!(b, InstanceBasis::Activity);
        assert_eq!(w, vec![12.0, 14.4, 0.0]);
        assert_eq!(unheld, 0.0);
        // A busy instance with no process listed: its busy SMs are
        // unheld, not handed to the others.
        let (w, _, unheld) =
            instance_weights(&[inst(60, 3, &[1], Some(20.0)), inst(20, 1, &[], Some(50.0))]);
        assert_eq!((w, unheld), (vec![12.0, 0.0], 10.0));
        // One instance with processes and no GPM figure: slices, for all.
        let (w, b, unheld) = instance_weights(&[
            inst(60, 3, &[1], Some(20.0)),
            inst(16, 1, &[2], None),
            inst(20, 1, &[], None),
        ]);
        assert_eq!(b, InstanceBasis::Slices);
        assert_eq!((w, unheld), (vec![3.0, 1.0, 0.0], 0.0));
        // By slices, an instance whose list failed is not known to be
        // idle: its slices are unheld.
        let mut failed = inst(20, 2, &[], None);
        failed.listed = false;
        let (w, _, unheld) = instance_weights(&[inst(60, 3, &[1], None), failed]);
        assert_eq!((w, unheld), (vec![3.0, 0.0], 2.0));
    }

    #[test]
    fn a_gpm_figure_outside_0_to_100_is_no_figure() {
        assert_eq!(sane_util(42.5), Some(42.5));
        assert_eq!(sane_util(250.0), None);
        assert_eq!(sane_util(-1.0), None);
        assert_eq!(sane_util(f64::NAN), None);
    }
}
