//! A stand-in for NVIDIA's `libnvidia-ml.so`, implementing the NVML calls
//! wattprof makes, driven by the scenario file `scenario.txt` next to the
//! library itself (so each test copies the library into its own directory
//! and gets its own instance, with its own state):
//!
//! ```text
//! # one GPU per line, key=value, no spaces inside values
//! gpu name=NVIDIA-H100 uuid=GPU-0 power_mw=250000 energy=counter util=60 \
//!     memory_total=85899345920 memory_used=4294967296 mig=0 lost_after=0 \
//!     procs=4242:70:1073741824,4243:20:536870912
//! driver=absent        # nvmlInit fails as with no driver loaded
//! ```
//!
//! `energy=counter` reports a total-energy counter that grows at `power_mw`
//! in real time from `nvmlInit`; `energy=unsupported` returns
//! NVML_ERROR_NOT_SUPPORTED (pre-Volta GPUs). `lost_after=N` makes every
//! call on the GPU return NVML_ERROR_GPU_IS_LOST after N energy or power
//! calls (0: never). `mig=1` reports MIG mode enabled. In `procs`, the pid
//! `child` stands for the loading process's first child (the command that
//! `wattprof run` started), found in /proc when NVML is asked.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_ulonglong, c_void};
use std::sync::Mutex;
use std::time::Instant;

const SUCCESS: c_uint = 0;
const ERROR_INVALID_ARGUMENT: c_uint = 2;
const ERROR_NOT_SUPPORTED: c_uint = 3;
const ERROR_INSUFFICIENT_SIZE: c_uint = 7;
const ERROR_DRIVER_NOT_LOADED: c_uint = 9;
const ERROR_GPU_IS_LOST: c_uint = 15;
const ERROR_UNINITIALIZED: c_uint = 1;

#[derive(Clone, Debug, Default)]
struct Gpu {
    name: String,
    uuid: String,
    power_mw: u32,
    energy_counter: bool,
    util: u32,
    memory_total: u64,
    memory_used: u64,
    mig: bool,
    lost_after: u32,
    calls: u32,
    procs: Vec<(u32, u32, u64)>,
}

struct State {
    gpus: Vec<Gpu>,
    start: Instant,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// A scenario pid: 0 is the loading process's first child, if any.
fn resolve(pid: u32) -> u32 {
    if pid != 0 {
        return pid;
    }
    let Ok(tasks) = std::fs::read_dir("/proc/self/task") else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .find_map(|c| c.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn parse(text: &str) -> Result<Vec<Gpu>, ()> {
    let mut gpus = Vec::new();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        if line == "driver=absent" {
            return Err(());
        }
        let mut g = Gpu::default();
        for kv in line.split_whitespace().skip(1) {
            let Some((k, v)) = kv.split_once('=') else {
                continue;
            };
            match k {
                "name" => g.name = v.to_string(),
                "uuid" => g.uuid = v.to_string(),
                "power_mw" => g.power_mw = v.parse().unwrap_or(0),
                "energy" => g.energy_counter = v == "counter",
                "util" => g.util = v.parse().unwrap_or(0),
                "memory_total" => g.memory_total = v.parse().unwrap_or(0),
                "memory_used" => g.memory_used = v.parse().unwrap_or(0),
                "mig" => g.mig = v == "1",
                "lost_after" => g.lost_after = v.parse().unwrap_or(0),
                "procs" => {
                    g.procs = v
                        .split(',')
                        .filter_map(|p| {
                            let mut f = p.split(':');
                            let pid = f.next()?;
                            Some((
                                // 0: the loading process's first child.
                                if pid == "child" { 0 } else { pid.parse().ok()? },
                                f.next()?.parse().ok()?,
                                f.next()?.parse().ok()?,
                            ))
                        })
                        .collect()
                }
                _ => {}
            }
        }
        gpus.push(g);
    }
    Ok(gpus)
}

/// Runs `f` on GPU `dev` (handles are index + 1), counting lost GPUs.
fn with_gpu(dev: *mut c_void, counts: bool, f: impl FnOnce(&Gpu, f64) -> c_uint) -> c_uint {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(state) = guard.as_mut() else {
        return ERROR_UNINITIALIZED;
    };
    let idx = (dev as usize).wrapping_sub(1);
    let elapsed = state.start.elapsed().as_secs_f64();
    let Some(g) = state.gpus.get_mut(idx) else {
        return ERROR_INVALID_ARGUMENT;
    };
    if g.lost_after > 0 && g.calls >= g.lost_after {
        return ERROR_GPU_IS_LOST;
    }
    if counts {
        g.calls += 1;
    }
    f(g, elapsed)
}

unsafe fn write_str(s: &str, out: *mut c_char, len: c_uint) -> c_uint {
    if out.is_null() || (len as usize) <= s.len() {
        return ERROR_INSUFFICIENT_SIZE;
    }
    // SAFETY: the caller gave `len` bytes; s.len() + 1 fits.
    unsafe {
        std::ptr::copy_nonoverlapping(s.as_ptr(), out.cast(), s.len());
        *out.add(s.len()) = 0;
    }
    SUCCESS
}

#[repr(C)]
struct DlInfo {
    dli_fname: *const c_char,
    dli_fbase: *mut c_void,
    dli_sname: *const c_char,
    dli_saddr: *mut c_void,
}

unsafe extern "C" {
    fn dladdr(addr: *const c_void, info: *mut DlInfo) -> i32;
}

/// `scenario.txt` in the directory this library was loaded from.
fn scenario_text() -> String {
    let mut info = DlInfo {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    // SAFETY: dladdr with the address of one of our own functions.
    let found = unsafe { dladdr(nvmlInit_v2 as *const c_void, &mut info) } != 0;
    if !found || info.dli_fname.is_null() {
        return String::new();
    }
    // SAFETY: dladdr returns a NUL-terminated path.
    let path = unsafe { std::ffi::CStr::from_ptr(info.dli_fname) };
    let path = std::path::Path::new(
        <std::ffi::OsStr as std::os::unix::ffi::OsStrExt>::from_bytes(path.to_bytes()),
    );
    path.parent()
        .and_then(|d| std::fs::read_to_string(d.join("scenario.txt")).ok())
        .unwrap_or_default()
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlInit_v2() -> c_uint {
    let text = scenario_text();
    match parse(&text) {
        Ok(gpus) => {
            *STATE.lock().unwrap_or_else(|e| e.into_inner()) = Some(State {
                gpus,
                start: Instant::now(),
            });
            SUCCESS
        }
        Err(()) => ERROR_DRIVER_NOT_LOADED,
    }
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> c_uint {
    *STATE.lock().unwrap_or_else(|e| e.into_inner()) = None;
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetCount_v2(count: *mut c_uint) -> c_uint {
    let guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(state) = guard.as_ref() else {
        return ERROR_UNINITIALIZED;
    };
    // SAFETY: NVML's contract: a valid out-pointer.
    unsafe { *count = state.gpus.len() as c_uint };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetHandleByIndex_v2(
    index: c_uint,
    dev: *mut *mut c_void,
) -> c_uint {
    let guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(state) = guard.as_ref() else {
        return ERROR_UNINITIALIZED;
    };
    if index as usize >= state.gpus.len() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: valid out-pointer; the handle is an opaque index + 1.
    unsafe { *dev = (index as usize + 1) as *mut c_void };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetName(
    dev: *mut c_void,
    name: *mut c_char,
    len: c_uint,
) -> c_uint {
    // SAFETY: forwarded NVML contract.
    with_gpu(dev, false, |g, _| unsafe { write_str(&g.name, name, len) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    dev: *mut c_void,
    uuid: *mut c_char,
    len: c_uint,
) -> c_uint {
    // SAFETY: forwarded NVML contract.
    with_gpu(dev, false, |g, _| unsafe { write_str(&g.uuid, uuid, len) })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    dev: *mut c_void,
    mj: *mut c_ulonglong,
) -> c_uint {
    with_gpu(dev, true, |g, elapsed| {
        if !g.energy_counter {
            return ERROR_NOT_SUPPORTED;
        }
        // SAFETY: valid out-pointer. Counter starts at 1,000 J.
        unsafe { *mj = 1_000_000 + (f64::from(g.power_mw) * elapsed) as u64 };
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(dev: *mut c_void, mw: *mut c_uint) -> c_uint {
    with_gpu(dev, true, |g, _| {
        // SAFETY: valid out-pointer.
        unsafe { *mw = g.power_mw };
        SUCCESS
    })
}

#[repr(C)]
pub struct Utilization {
    gpu: c_uint,
    memory: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUtilizationRates(
    dev: *mut c_void,
    u: *mut Utilization,
) -> c_uint {
    with_gpu(dev, false, |g, _| {
        // SAFETY: valid out-pointer.
        unsafe {
            *u = Utilization {
                gpu: g.util,
                memory: g.util / 2,
            }
        };
        SUCCESS
    })
}

#[repr(C)]
pub struct MemoryV2 {
    version: c_uint,
    total: c_ulonglong,
    reserved: c_ulonglong,
    free: c_ulonglong,
    used: c_ulonglong,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMemoryInfo_v2(dev: *mut c_void, m: *mut MemoryV2) -> c_uint {
    with_gpu(dev, false, |g, _| {
        // SAFETY: valid out-pointer; the caller set `version`.
        unsafe {
            (*m).total = g.memory_total;
            (*m).reserved = 0;
            (*m).used = g.memory_used;
            (*m).free = g.memory_total.saturating_sub(g.memory_used);
        }
        SUCCESS
    })
}

#[repr(C)]
pub struct ProcessSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    dev: *mut c_void,
    samples: *mut ProcessSample,
    count: *mut c_uint,
    _last_seen: c_ulonglong,
) -> c_uint {
    with_gpu(dev, false, |g, elapsed| {
        // SAFETY: valid pointers per NVML's two-call contract.
        unsafe {
            if samples.is_null() || (*count as usize) < g.procs.len() {
                *count = g.procs.len() as c_uint;
                return if g.procs.is_empty() {
                    SUCCESS
                } else {
                    ERROR_INSUFFICIENT_SIZE
                };
            }
            for (i, &(pid, sm, _)) in g.procs.iter().enumerate() {
                *samples.add(i) = ProcessSample {
                    pid: resolve(pid),
                    time_stamp: (elapsed * 1e6) as u64 + 1,
                    sm_util: sm,
                    mem_util: sm / 2,
                    enc_util: 0,
                    dec_util: 0,
                };
            }
            *count = g.procs.len() as c_uint;
        }
        SUCCESS
    })
}

#[repr(C)]
pub struct ProcessInfo {
    pid: c_uint,
    used_gpu_memory: c_ulonglong,
    gpu_instance_id: c_uint,
    compute_instance_id: c_uint,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> c_uint {
    with_gpu(dev, false, |g, _| {
        // SAFETY: valid pointers per NVML's two-call contract.
        unsafe {
            if infos.is_null() || (*count as usize) < g.procs.len() {
                *count = g.procs.len() as c_uint;
                return if g.procs.is_empty() {
                    SUCCESS
                } else {
                    ERROR_INSUFFICIENT_SIZE
                };
            }
            for (i, &(pid, _, mem)) in g.procs.iter().enumerate() {
                *infos.add(i) = ProcessInfo {
                    pid: resolve(pid),
                    used_gpu_memory: mem,
                    gpu_instance_id: u32::MAX,
                    compute_instance_id: u32::MAX,
                };
            }
            *count = g.procs.len() as c_uint;
        }
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    dev: *mut c_void,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> c_uint {
    with_gpu(dev, false, |g, _| {
        // SAFETY: valid out-pointers.
        unsafe {
            *current = u32::from(g.mig);
            *pending = u32::from(g.mig);
        }
        SUCCESS
    })
}
