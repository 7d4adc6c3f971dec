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
//! driver_version=535.54.03
//! ```
//!
//! It behaves as the driver does, not as the documentation's happy path:
//! - **Per-process samples at the driver's pace, as an H200 gave them.**
//!   The driver samples every `sample_ms` (default 167: its fastest,
//!   1/6 s; the slowest is 1 s; an H200 on driver 580 took 200 ms) and
//!   keeps its last 16 samples. A sample's SM is its process's mean over
//!   the `sm_window_ms` before it (default: the period; 2000 as an H200,
//!   whose samples rose from 0 to 100 over 2 s after a load began), and
//!   the newest sample is revised
//!   until the next is taken (its window ends at the call; an H200
//!   returned one timestamp with two to four values 50 ms apart). Of
//!   processes taking turns, a period's sample is of the one working at
//!   its tick (an H200 gave one process per period, the time share in
//!   the values); when none works then, of each with any SM in its
//!   window. Timestamps are CPU time in microseconds since the epoch.
//!   `nvmlDeviceGetProcessUtilization` returns, of each process newer
//!   than `lastSeenTimeStamp`, only its newest sample, as driver 580 does
//!   (`history=all`: every one), and NVML_ERROR_NOT_FOUND when there is
//!   none. `sample_ms=0` samples at every call.
//! - **Garbage on request**, `garbage=pid0,sm_over,future,dup,exited`, added
//!   to every call that has something new: a pid-0 entry, a second entry for the first process with
//!   SM 37100 (nvtop issue 110), one a day in the future, an exact
//!   duplicate, and a pid that is in no process list (an exited process).
//! - **A count race**, `race=N`: the first N sized calls for samples find a
//!   sample more than the count call said (NVML_ERROR_INSUFFICIENT_SIZE).
//! - **A stepped energy counter**, `energy_step_ms=N`: the counter moves
//!   every N ms (20–100 ms on some GPUs). `energy=counter` grows at
//!   `power_mw` from `nvmlInit`; `energy=unsupported` (pre-Volta),
//!   `energy=noperm` and `energy=nofunc` answer NOT_SUPPORTED, NO_PERMISSION
//!   and FUNCTION_NOT_FOUND.
//! - **Power that follows the load**, `load=IDLE:HELD:PER_SM` (mW): the
//!   draw is IDLE, + HELD while any process holds a context, + PER_SM per
//!   SM percent of each holder; the counter integrates it exactly. With
//!   `procs=PID:SM:MEM@FROM-TO` a process holds the GPU only from FROM to
//!   TO ms after nvmlInit (several entries may give one pid phases), and
//!   with `PID:SM:MEM~A-B/P` it works only from A to B ms of every P ms
//!   (holding its context idle the rest): processes taking turns. A
//!   `+LAG` after either publishes its samples LAG ms after their
//!   timestamp, so another process's newer sample can move
//!   `lastSeenTimeStamp` past them (stop 30's hypothesis for the H200's
//!   1 s turns).
//! - **A 1 s averaged power reading**, as Ampere and later report: with
//!   `power_step_ms=N:MW` the draw changes to MW after N ms, and
//!   `nvmlDeviceGetPowerUsage` answers the mean over the last second while
//!   the counter follows the draw at once.
//! - **Field values**: NVML_FI_DEV_POWER_INSTANT (the draw now) and
//!   NVML_FI_DEV_POWER_AVERAGE (its mean over the last second), in mW.
//! - **MIG**, `mig=1`: MIG mode on; utilization, device and per-process,
//!   answers NOT_SUPPORTED, as NVML does on a MIG-enabled GPU. With
//!   `instances=GI.CI:SLICES:SMS,...` the GPU has MIG devices (compute
//!   instances CI of GPU instances GI; `GI` alone is CI 0) in those slots
//!   (`-` leaves a slot empty: NOT_FOUND, as a driver answers for slots
//!   with no instance), each with SLICES compute slices and SMS streaming
//!   multiprocessors; `PID:SM:MEM#GI.CI` puts a process in that compute
//!   instance, where its SM is a percentage of the compute instance's
//!   SMs. A MIG device handle answers its own process list (the parent
//!   lists every instance's, with their ids; with `parent_procs=none`,
//!   none, as for a caller without the privilege), its UUID
//!   (`MIG-xxxxxxxx-...`), attributes, instance ids and memory, and
//!   NOT_SUPPORTED for energy, power and utilization, as the driver does.
//!   The draw's per-SM term counts the GPU's busy SMs: SM × the compute
//!   instance's SMs / all instances' SMs.
//! - **GPM** (Hopper and later), `gpm=1`: `nvmlGpmQueryDeviceSupport`
//!   says yes, and `nvmlGpmMigSampleGet` / `nvmlGpmMetricsGet` give a
//!   GPU instance's SM utilization (`NVML_GPM_METRIC_SM_UTIL`) between two
//!   samples at least 100 ms apart (closer ones are refused, as NVML
//!   asks): its processes' mean busy SMs over that span, as a percentage
//!   of the GPU instance's SMs, at most 100.
//!   `gpm=over` answers 250% (a driver's garbage); without `gpm` the GPU
//!   is not GPM-capable (Ampere). `fail=gpm@...` fails the sample calls.
//! - **Failures**: `lost_after=N` makes every call on the GPU answer
//!   NVML_ERROR_GPU_IS_LOST after N energy or power calls, and
//!   `back_after=M` brings it back after M such answers (0: never).
//!   `fail=CALL@FROM-TO:ERROR,...` makes CALL's FROM-th to TO-th calls
//!   (from 1) answer ERROR; CALL is energy, power, util, memory, procs or
//!   samples, ERROR unknown, no_permission, not_supported, gpu_lost or
//!   function_not_found.
//! - **The `_v3` quirk of drivers 535.43–535.86**: with such a
//!   `driver_version`, `nvmlDeviceGetComputeRunningProcesses_v3` writes
//!   32-byte entries where the caller's are 24 bytes (kept within the
//!   caller's buffer, so later entries come out garbled rather than
//!   overrunning it); `_v2` writes 24-byte entries.
//!
//! - **Time-slicing**, `timeslice=1`: where the working holders' SM adds
//!   up to more than 100, each runs its part of the time (their samples
//!   read their parts), and the draw's per-SM term counts at most 100%.
//! - **Power that settles**, `settle_ms=N`: the draw follows the load as a
//!   first-order lag, within 2% of a new level after N ms (an H200 took up
//!   to a second to fall to its idle power after a load).
//! - **MPS**, `mps_server=PID:MEM` and clients `PID:SM:MEM%mps`: the
//!   server is in the compute list, holding a context and doing no work;
//!   the clients are listed by `nvmlDeviceGetMPSComputeRunningProcesses_v3`
//!   and sampled as processes are; with `mps_samples=server`, as an H200
//!   on driver 580 did, every sample of their work carries the server's
//!   pid (the sum of theirs) and the clients have none.
//! - **The CUDA driver API** for a context and nothing else (`cuInit`,
//!   `cuDeviceGetCount`, `cuDeviceGet`, `cuDeviceGetUuid[_v2]`,
//!   `cuCtxCreate_v2`, `cuCtxDestroy_v2`, `cuGetErrorName`): a context
//!   makes the calling process a holder of its GPU (SM 0, 512 MiB) until
//!   destroyed. A GPU's CUDA UUID is its NVML UUID's 16 bytes (zeros for a
//!   short scenario UUID). `cuda=absent` answers CUDA_ERROR_NO_DEVICE,
//!   `cuda=busy` refuses contexts (CUDA_ERROR_DEVICES_UNAVAILABLE, as in
//!   exclusive-process mode with another holder).
//!
//! In `procs`, the pid `child` stands for the loading process's first
//! child (the command that `wattprof run` started), and `child/N` for that
//! child's N-th child (by pid), found in /proc when NVML is asked; a
//! process that does not exist (yet) holds no context and has no samples.
#![allow(non_snake_case, clippy::missing_safety_doc)]

use std::ffi::{c_char, c_uint, c_ulonglong, c_void};
use std::sync::Mutex;
use std::time::{Instant, SystemTime, UNIX_EPOCH};

const SUCCESS: c_uint = 0;
const ERROR_UNINITIALIZED: c_uint = 1;
const ERROR_INVALID_ARGUMENT: c_uint = 2;
const ERROR_NOT_SUPPORTED: c_uint = 3;
const ERROR_NO_PERMISSION: c_uint = 4;
const ERROR_NOT_FOUND: c_uint = 6;
const ERROR_INSUFFICIENT_SIZE: c_uint = 7;
const ERROR_DRIVER_NOT_LOADED: c_uint = 9;
const ERROR_FUNCTION_NOT_FOUND: c_uint = 13;
const ERROR_GPU_IS_LOST: c_uint = 15;
const ERROR_UNKNOWN: c_uint = 999;

/// How many samples per process the driver keeps.
const SAMPLE_BUFFER: u64 = 16;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Call {
    Energy,
    Power,
    Util,
    Memory,
    Procs,
    Samples,
    Gpm,
}

impl Call {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "energy" => Self::Energy,
            "power" => Self::Power,
            "util" => Self::Util,
            "memory" => Self::Memory,
            "procs" => Self::Procs,
            "samples" => Self::Samples,
            "gpm" => Self::Gpm,
            _ => return None,
        })
    }
}

#[derive(Clone, Debug, Default)]
struct Garbage {
    pid0: bool,
    sm_over: bool,
    future: bool,
    dup: bool,
    exited: bool,
}

#[derive(Clone, Copy, Debug)]
struct Proc {
    pid: u32,
    sm: u32,
    mem: u64,
    /// Held from..to (ms after nvmlInit); always when `None`.
    window: Option<(u64, u64)>,
    /// Works (at `sm`) only from A to B ms of every P ms after nvmlInit,
    /// and holds its context idle the rest of the time: processes taking
    /// turns on the GPU.
    duty: Option<(u64, u64, u64)>,
    /// Its samples are published this many ms after their timestamp.
    lag_ms: u64,
    /// The MIG compute instance it runs in: (GPU instance, compute
    /// instance).
    instance: Option<(u32, u32)>,
    /// An MPS client (`%mps`): listed by the MPS call, not the compute
    /// list (the MPS server holds the context there).
    mps_client: bool,
}

impl Proc {
    fn active(&self, t: f64) -> bool {
        self.window
            .is_none_or(|(a, b)| t * 1e3 >= a as f64 && t * 1e3 < b as f64)
    }

    /// Its SM use at `t` s: `sm` while it holds the GPU and is in its
    /// working part of the cycle, else 0.
    fn sm_at(&self, t: f64) -> u32 {
        if !self.active(t) {
            return 0;
        }
        match self.duty {
            Some((a, b, p)) if p > 0 => {
                let phase = (t * 1e3).rem_euclid(p as f64);
                if phase >= a as f64 && phase < b as f64 {
                    self.sm
                } else {
                    0
                }
            }
            _ => self.sm,
        }
    }

    /// The times in (0, `t`) s at which its SM use changes.
    fn cuts(&self, t: f64) -> Vec<f64> {
        let mut out: Vec<f64> = self
            .window
            .into_iter()
            .flat_map(|(a, b)| [a as f64 / 1e3, b as f64 / 1e3])
            .collect();
        if let Some((a, b, p)) = self.duty.filter(|d| d.2 > 0) {
            let p_s = p as f64 / 1e3;
            for k in 0..=(t / p_s) as u64 {
                let base = k as f64 * p_s;
                out.push(base + a as f64 / 1e3);
                out.push(base + b as f64 / 1e3);
            }
        }
        out.retain(|c| *c > 0.0 && *c < t);
        out
    }
}

#[derive(Clone, Debug, Default)]
struct Gpu {
    name: String,
    uuid: String,
    power_mw: u32,
    /// (after ms, new draw mW).
    power_step: Option<(u64, u32)>,
    /// SUCCESS, or what the energy call answers.
    energy: c_uint,
    energy_step_ms: u64,
    util: u32,
    memory_total: u64,
    memory_used: u64,
    mig: bool,
    lost_after: u32,
    back_after: u32,
    /// Energy and power calls made while not lost.
    calls: u32,
    /// GPU_IS_LOST answers given.
    lost_answers: u32,
    /// (pid, SM %, memory bytes, held from..to ms after nvmlInit).
    procs: Vec<Proc>,
    /// Power that follows the load (mW): idle, + held with a context
    /// open, + per SM percent of every process; replaces `power_mw`.
    load: Option<(f64, f64, f64)>,
    /// None: the default pace; Some(0): a sample at every call.
    sample_ms: Option<u64>,
    /// Samples calls return every sample since the last seen, not each
    /// process's newest only (`history=all`).
    history_all: bool,
    garbage: Garbage,
    race: u32,
    fail: Vec<(Call, u32, u32, c_uint)>,
    counts: [u32; 7],
    /// MIG device slots: a GPU instance, or an empty slot.
    instances: Vec<Option<Instance>>,
    /// GPM: None (not capable), Some(false) (faithful), Some(true)
    /// (garbage: 250%).
    gpm: Option<bool>,
    /// On MIG, the GPU's own handle lists no process (a caller without
    /// the privilege for the aggregate list).
    parent_procs_none: bool,
    /// Contexts take turns on the SMs (`timeslice=1`): where the working
    /// holders' SM adds up to more than 100, each runs its part of the
    /// time, and together they keep the SMs at most fully busy.
    timeslice: Option<u32>,
    /// The MPS server's pid (`mps_server=`).
    mps_server: Option<u32>,
    /// `mps_samples=server`: the MPS clients' samples carry the server's
    /// pid, as on an H200 with driver 580.
    mps_samples_server: bool,
    /// How far back a sample's SM looks (`sm_window_ms=N`, ms; 2000 on an
    /// H200; default: the sampling period).
    sm_window_ms: Option<u64>,
    /// The draw follows the load with a first-order lag that settles
    /// (to 2%) within this many ms (`settle_ms=N`; 0: at once).
    settle_ms: u64,
    /// The lagged draw integrated on a 5 ms grid: (draw mW, energy mJ)
    /// at each grid point from nvmlInit, extended as calls need it.
    settled: std::cell::RefCell<Vec<(f64, f64)>>,
}

/// A MIG device: compute instance `ci` of GPU instance `gi`.
#[derive(Clone, Copy, Debug)]
struct Instance {
    gi: u32,
    ci: u32,
    slices: u32,
    sms: u32,
}

impl Gpu {
    /// Every instance's SMs together.
    fn mig_sms(&self) -> u32 {
        self.instances.iter().flatten().map(|i| i.sms).sum()
    }

    /// The compute instance `p` runs in.
    fn instance_of(&self, p: &Proc) -> Option<Instance> {
        let (gi, ci) = p.instance?;
        self.instances
            .iter()
            .flatten()
            .find(|i| i.gi == gi && i.ci == ci)
            .copied()
    }

    /// GPU instance `gi`'s SMs (its compute instances').
    fn gi_sms(&self, gi: u32) -> u32 {
        self.instances
            .iter()
            .flatten()
            .filter(|i| i.gi == gi)
            .map(|i| i.sms)
            .sum()
    }

    /// `p`'s share of the whole GPU's SMs when it works at 100% (1 off MIG).
    fn sm_scale(&self, p: &Proc) -> f64 {
        match self.instance_of(p) {
            Some(i) if self.mig_sms() > 0 => f64::from(i.sms) / f64::from(self.mig_sms()),
            _ => 1.0,
        }
    }
}

struct State {
    gpus: Vec<Gpu>,
    /// nvmlInit calls not yet shut down (NVML counts them; the CUDA
    /// stand-in's contexts live in the same state).
    inits: u32,
    /// What `cuInit` answers (`cuda=absent|nodevice|busy` in the
    /// scenario): 0, CUDA_ERROR_NO_DEVICE (100) for the first two, and
    /// for `busy` cuCtxCreate answers CUDA_ERROR_DEVICES_UNAVAILABLE (46).
    cuda: CudaMode,
    start: Instant,
    start_epoch_us: u64,
    driver_version: String,
}

static STATE: Mutex<Option<State>> = Mutex::new(None);

/// How the CUDA stand-in behaves.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum CudaMode {
    #[default]
    Works,
    /// No libcuda: every call fails as a library without a device would.
    Absent,
    /// cuCtxCreate refused (exclusive-process mode held by another).
    Busy,
}

/// The pid `child/N` stands for in a scenario.
const CHILD_OF_CHILD: u32 = u32::MAX - 64;

/// The children of `pid`, oldest (lowest pid) first.
fn children(pid: &str) -> Vec<u32> {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return Vec::new();
    };
    let mut out: Vec<u32> = tasks
        .flatten()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|c| {
            c.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect::<Vec<u32>>()
        })
        .collect();
    out.sort_unstable();
    out
}

/// A scenario pid: 0 is the loading process's first child, and
/// CHILD_OF_CHILD + N that child's N-th child; 0 when there is none (yet).
fn resolve(pid: u32) -> u32 {
    if pid != 0 && pid <= CHILD_OF_CHILD {
        return pid;
    }
    let Some(&first) = children("self").first() else {
        return 0;
    };
    if pid == 0 {
        return first;
    }
    let n = (pid - CHILD_OF_CHILD) as usize;
    children(&first.to_string())
        .get(n - 1)
        .copied()
        .unwrap_or(0)
}

/// The scenario's processes that hold the GPU at `t` s and exist: (pid,
/// SM %, memory bytes).
fn running(g: &Gpu, t: f64) -> Vec<(u32, u32, u64)> {
    running_in(g, t, None)
        .into_iter()
        .map(|(pid, sm, mem, _)| (pid, sm, mem))
        .collect()
}

/// A process holding the GPU: pid, SM %, memory bytes, MIG compute
/// instance.
type Running = (u32, u32, u64, Option<(u32, u32)>);

/// As [`running`], with each one's MIG compute instance; only those of
/// compute instance `of` when given.
fn running_in(g: &Gpu, t: f64, of: Option<(u32, u32)>) -> Vec<Running> {
    running_where(g, t, of, false)
}

/// As [`running_in`], of the MPS clients (`mps`) or the rest.
fn running_where(g: &Gpu, t: f64, of: Option<(u32, u32)>, mps: bool) -> Vec<Running> {
    g.procs
        .iter()
        .filter(|p| p.mps_client == mps)
        .filter(|p| p.active(t) && of.is_none_or(|of| p.instance == Some(of)))
        .map(|p| (resolve(p.pid), p.sm, p.mem, p.instance.filter(|_| g.mig)))
        .filter(|p| p.0 != 0)
        .collect()
}

fn error_code(s: &str) -> Option<c_uint> {
    Some(match s {
        "unknown" => ERROR_UNKNOWN,
        "no_permission" => ERROR_NO_PERMISSION,
        "not_supported" => ERROR_NOT_SUPPORTED,
        "gpu_lost" => ERROR_GPU_IS_LOST,
        "function_not_found" => ERROR_FUNCTION_NOT_FOUND,
        _ => return None,
    })
}

fn parse_fail(v: &str) -> Vec<(Call, u32, u32, c_uint)> {
    v.split(',')
        .filter_map(|f| {
            let (call, rest) = f.split_once('@')?;
            let (range, err) = rest.split_once(':')?;
            let (from, to) = range.split_once('-').unwrap_or((range, range));
            Some((
                Call::parse(call)?,
                from.parse().ok()?,
                to.parse().ok()?,
                error_code(err)?,
            ))
        })
        .collect()
}

/// `GI.CI`, or `GI` (compute instance 0).
fn parse_instance(id: &str) -> Option<(u32, u32)> {
    match id.split_once('.') {
        Some((gi, ci)) => Some((gi.parse().ok()?, ci.parse().ok()?)),
        None => Some((id.parse().ok()?, 0)),
    }
}

fn parse(text: &str) -> Result<(Vec<Gpu>, String), ()> {
    let mut gpus = Vec::new();
    let mut driver_version = "550.54.15".to_string();
    for line in text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
    {
        if line == "driver=absent" {
            return Err(());
        }
        if let Some(v) = line.strip_prefix("driver_version=") {
            driver_version = v.to_string();
            continue;
        }
        if line.starts_with("cuda=") {
            continue;
        }
        let mut g = Gpu {
            energy: ERROR_NOT_SUPPORTED,
            ..Gpu::default()
        };
        for kv in line.split_whitespace().skip(1) {
            if let Some((k, v)) = kv.split_once('=') {
                set(&mut g, k, v);
            }
        }
        gpus.push(g);
    }
    Ok((gpus, driver_version))
}

/// One `key=value` of a GPU's line; an unknown key is ignored.
fn set(g: &mut Gpu, k: &str, v: &str) {
    match k {
        "name" => g.name = v.to_string(),
        "uuid" => g.uuid = v.to_string(),
        "power_mw" => g.power_mw = v.parse().unwrap_or(0),
        "power_step_ms" => {
            g.power_step = v
                .split_once(':')
                .and_then(|(a, b)| Some((a.parse().ok()?, b.parse().ok()?)))
        }
        "energy" => {
            g.energy = match v {
                "counter" => SUCCESS,
                "noperm" => ERROR_NO_PERMISSION,
                "nofunc" => ERROR_FUNCTION_NOT_FOUND,
                _ => ERROR_NOT_SUPPORTED,
            }
        }
        "energy_step_ms" => g.energy_step_ms = v.parse().unwrap_or(0),
        "util" => g.util = v.parse().unwrap_or(0),
        "memory_total" => g.memory_total = v.parse().unwrap_or(0),
        "memory_used" => g.memory_used = v.parse().unwrap_or(0),
        "mig" => g.mig = v == "1",
        "instances" => g.instances = v.split(',').map(parse_mig_instance).collect(),
        "parent_procs" => g.parent_procs_none = v == "none",
        "gpm" => {
            g.gpm = match v {
                "1" => Some(false),
                "over" => Some(true),
                _ => None,
            }
        }
        "lost_after" => g.lost_after = v.parse().unwrap_or(0),
        "back_after" => g.back_after = v.parse().unwrap_or(0),
        "sample_ms" => g.sample_ms = v.parse().ok(),
        "history" => g.history_all = v == "all",
        "race" => g.race = v.parse().unwrap_or(0),
        "fail" => g.fail = parse_fail(v),
        "garbage" => set_garbage(&mut g.garbage, v),
        "procs" => g.procs.extend(v.split(',').filter_map(parse_proc)),
        "timeslice" => g.timeslice = v.parse().ok(),
        "sm_window_ms" => g.sm_window_ms = v.parse().ok(),
        "settle_ms" => g.settle_ms = v.parse().unwrap_or(0),
        // The MPS server: a holder with no work of its own.
        "mps_server" => {
            let server = parse_mps_server(v);
            g.mps_server = server.as_ref().map(|p| p.pid);
            g.procs.extend(server);
        }
        "mps_samples" => g.mps_samples_server = v == "server",
        "load" => {
            let w: Vec<f64> = v.split(':').filter_map(|x| x.parse().ok()).collect();
            if let [idle, held, per_sm] = w[..] {
                g.load = Some((idle, held, per_sm));
            }
        }
        _ => {}
    }
}

/// `GI.CI:SLICES:SMS` (or `GI:...`): one MIG instance.
fn parse_mig_instance(i: &str) -> Option<Instance> {
    let (id, rest) = i.split_once(':')?;
    let (gi, ci) = parse_instance(id)?;
    let f: Vec<u32> = rest.split(':').filter_map(|x| x.parse().ok()).collect();
    match f[..] {
        [slices, sms] => Some(Instance {
            gi,
            ci,
            slices,
            sms,
        }),
        _ => None,
    }
}

/// `garbage=pid0,sm_over,...`: which kinds of garbage samples to return.
fn set_garbage(garbage: &mut Garbage, v: &str) {
    for w in v.split(',') {
        match w {
            "pid0" => garbage.pid0 = true,
            "sm_over" => garbage.sm_over = true,
            "future" => garbage.future = true,
            "dup" => garbage.dup = true,
            "exited" => garbage.exited = true,
            _ => {}
        }
    }
}

/// `PID:MEM`: the MPS server, a holder with no work of its own.
fn parse_mps_server(v: &str) -> Option<Proc> {
    let (pid, mem) = v.split_once(':')?;
    Some(Proc {
        pid: pid.parse().ok()?,
        sm: 0,
        mem: mem.parse().ok()?,
        window: None,
        duty: None,
        lag_ms: 0,
        instance: None,
        mps_client: false,
    })
}

/// `...~A-B/P`: works A to B ms of every P.
fn parse_duty(d: &str) -> Option<(u64, u64, u64)> {
    let (ab, period) = d.split_once('/')?;
    let (a, b) = ab.split_once('-')?;
    Some((a.parse().ok()?, b.parse().ok()?, period.parse().ok()?))
}

/// One of `procs=`: `PID:SM:MEM`, then in this order the optional
/// `~A-B/P` (duty), `+LAG`, `#GI.CI`, `%mps` and `@FROM-TO` (its window).
fn parse_proc(p: &str) -> Option<Proc> {
    let (p, window) = match p.split_once('@') {
        Some((p, w)) => {
            let (a, b) = w.split_once('-')?;
            (p, Some((a.parse().ok()?, b.parse().ok()?)))
        }
        None => (p, None),
    };
    // ...%mps: an MPS client.
    let (p, mps_client) = match p.strip_suffix("%mps") {
        Some(p) => (p, true),
        None => (p, false),
    };
    // ...#GI.CI: it runs in that MIG compute instance.
    let (p, instance) = match p.split_once('#') {
        Some((p, id)) => (p, Some(parse_instance(id)?)),
        None => (p, None),
    };
    // ...+LAG: its samples are published LAG ms late.
    let (p, lag_ms) = match p.split_once('+') {
        Some((p, lag)) => (p, lag.parse().ok()?),
        None => (p, 0),
    };
    let (p, duty) = match p.split_once('~') {
        Some((p, d)) => (p, Some(parse_duty(d)?)),
        None => (p, None),
    };
    let mut f = p.split(':');
    let pid = f.next()?;
    Some(Proc {
        // The loading process's first child, or that child's N-th child.
        pid: match pid.strip_prefix("child") {
            Some("") => 0,
            Some(n) => CHILD_OF_CHILD + n.strip_prefix('/')?.parse::<u32>().ok()?.clamp(1, 64),
            None => pid.parse().ok()?,
        },
        sm: f.next()?.parse().ok()?,
        mem: f.next()?.parse().ok()?,
        window,
        duty,
        lag_ms,
        instance,
        mps_client,
    })
}

/// What the GPU's clock and the scenario's environment say at a call.
struct Now {
    /// Seconds since nvmlInit.
    elapsed: f64,
    /// Microseconds since the epoch (NVML's sample timestamps).
    epoch_us: u64,
    start_epoch_us: u64,
    driver_version: String,
}

/// A MIG device's handle: its slot + 1 in the high bits, its GPU's index
/// + 1 in the low 16.
fn mig_handle(idx: usize, slot: usize) -> *mut c_void {
    (((slot + 1) << 16) | (idx + 1)) as *mut c_void
}

/// Runs `f` on the GPU of `dev` (a GPU's handle is its index + 1), with
/// the MIG slot when `dev` is a MIG device's, answering lost GPUs and
/// injected failures for `call`.
fn with_dev(
    dev: *mut c_void,
    call: Option<Call>,
    f: impl FnOnce(&mut Gpu, Option<usize>, &Now) -> c_uint,
) -> c_uint {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(state) = guard.as_mut() else {
        return ERROR_UNINITIALIZED;
    };
    let idx = (dev as usize & 0xffff).wrapping_sub(1);
    let slot = (dev as usize >> 16).checked_sub(1);
    let now = Now {
        elapsed: state.start.elapsed().as_secs_f64(),
        epoch_us: epoch_us(),
        start_epoch_us: state.start_epoch_us,
        driver_version: state.driver_version.clone(),
    };
    let Some(g) = state.gpus.get_mut(idx) else {
        return ERROR_INVALID_ARGUMENT;
    };
    if g.lost_after > 0 && g.calls >= g.lost_after {
        g.lost_answers += 1;
        if g.back_after > 0 && g.lost_answers > g.back_after {
            // Back, for good.
            g.calls = 0;
            g.lost_answers = 0;
            g.lost_after = u32::MAX;
        } else {
            return ERROR_GPU_IS_LOST;
        }
    }
    if let Some(call) = call {
        if matches!(call, Call::Energy | Call::Power) {
            g.calls += 1;
        }
        let n = &mut g.counts[call as usize];
        *n += 1;
        let n = *n;
        if let Some(&(_, _, _, err)) = g
            .fail
            .iter()
            .find(|(c, from, to, _)| *c == call && (*from..=*to).contains(&n))
        {
            return err;
        }
    }
    if let Some(slot) = slot
        && !(g.mig && g.instances.get(slot).is_some_and(Option::is_some))
    {
        return ERROR_INVALID_ARGUMENT;
    }
    f(g, slot, &now)
}

/// As [`with_dev`], for calls a MIG device answers NOT_SUPPORTED (energy,
/// power, utilization, samples: the driver gives them for the whole GPU).
fn with_gpu(
    dev: *mut c_void,
    call: Option<Call>,
    f: impl FnOnce(&mut Gpu, &Now) -> c_uint,
) -> c_uint {
    with_dev(dev, call, |g, slot, now| match slot {
        Some(_) => ERROR_NOT_SUPPORTED,
        None => f(g, now),
    })
}

fn epoch_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
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
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    // NVML counts its inits: a second one (the same library loaded again
    // for its raw calls, or by the CUDA stand-in) keeps the state.
    if let Some(state) = guard.as_mut() {
        state.inits += 1;
        return SUCCESS;
    }
    match init_state() {
        Some(state) => {
            *guard = Some(state);
            SUCCESS
        }
        None => ERROR_DRIVER_NOT_LOADED,
    }
}

/// The scenario's state from now (`None`: `driver=absent`).
fn init_state() -> Option<State> {
    let text = scenario_text();
    let cuda = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("cuda="))
        .map_or(CudaMode::Works, |v| match v.trim() {
            "absent" | "nodevice" => CudaMode::Absent,
            "busy" => CudaMode::Busy,
            _ => CudaMode::Works,
        });
    let (gpus, driver_version) = parse(&text).ok()?;
    Some(State {
        gpus,
        inits: 1,
        cuda,
        start: Instant::now(),
        start_epoch_us: epoch_us(),
        driver_version,
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn nvmlShutdown() -> c_uint {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    match guard.as_mut() {
        Some(state) if state.inits > 1 => state.inits -= 1,
        Some(_) => *guard = None,
        None => return ERROR_UNINITIALIZED,
    }
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlSystemGetDriverVersion(version: *mut c_char, len: c_uint) -> c_uint {
    let guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(state) = guard.as_ref() else {
        return ERROR_UNINITIALIZED;
    };
    // SAFETY: forwarded NVML contract.
    unsafe { write_str(&state.driver_version, version, len) }
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
    with_dev(dev, None, |g, _, _| unsafe {
        write_str(&g.name, name, len)
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetUUID(
    dev: *mut c_void,
    uuid: *mut c_char,
    len: c_uint,
) -> c_uint {
    with_dev(dev, None, |g, slot, _| {
        let id = match slot.and_then(|s| g.instances[s]) {
            // A MIG device's UUID is its own (`MIG-` and a UUID).
            Some(i) => format!(
                "MIG-{:08x}-{:04x}-{:04x}-0000-000000000000",
                dev as usize & 0xffff,
                i.gi,
                i.ci
            ),
            None => g.uuid.clone(),
        };
        // SAFETY: forwarded NVML contract.
        unsafe { write_str(&id, uuid, len) }
    })
}

impl Gpu {
    /// The draw the load asks for at `t` seconds (mW); with `settle_ms`
    /// the GPU reaches it over that time ([`Gpu::energy_mj`]).
    fn draw_mw(&self, t: f64) -> f64 {
        if let Some((idle, held, per_sm)) = self.load {
            let on: Vec<&Proc> = self.procs.iter().filter(|p| p.active(t)).collect();
            let mut sm: f64 = on
                .iter()
                .map(|p| f64::from(p.sm_at(t)) * self.sm_scale(p))
                .sum();
            // Time-sliced contexts take turns on the SMs: together they
            // keep them at most fully busy.
            if self.timeslice.is_some() {
                sm = sm.min(100.0);
            }
            return idle + if on.is_empty() { 0.0 } else { held } + per_sm * sm;
        }
        match self.power_step {
            Some((ms, mw)) if t * 1e3 >= ms as f64 => f64::from(mw),
            _ => f64::from(self.power_mw),
        }
    }

    /// Energy since nvmlInit (mJ): the draw integrated exactly, piece by
    /// piece between the times it changes; with `settle_ms`, the lagged
    /// draw integrated on a 5 ms grid.
    fn energy_mj(&self, t: f64) -> f64 {
        if self.settle_ms > 0 {
            return self.settled_mj(t);
        }
        let mut cuts: Vec<f64> = self
            .procs
            .iter()
            .flat_map(|p| p.cuts(t))
            .chain(self.power_step.map(|(ms, _)| ms as f64 / 1e3))
            .filter(|c| *c > 0.0 && *c < t)
            .collect();
        cuts.push(t);
        cuts.sort_by(f64::total_cmp);
        let mut from = 0.0;
        let mut mj = 0.0;
        for to in cuts {
            mj += self.draw_mw((from + to) / 2.0) * (to - from);
            from = to;
        }
        mj
    }

    /// The energy of a draw that follows the load as a first-order lag
    /// (time constant a quarter of `settle_ms`: within 2% of a new level
    /// after `settle_ms`), as an H200 took up to a second to fall to its
    /// idle power after a load. Integrated on a 5 ms grid, kept and
    /// extended, so each call costs only the time since the last.
    fn settled_mj(&self, t: f64) -> f64 {
        const DT: f64 = 0.005;
        let tau = self.settle_ms as f64 / 1e3 / 4.0;
        let keep = (-DT / tau).exp();
        let mut grid = self.settled.borrow_mut();
        if grid.is_empty() {
            grid.push((self.draw_mw(0.0), 0.0));
        }
        let want = (t.max(0.0) / DT).floor() as usize;
        while grid.len() <= want + 1 {
            let k = grid.len() - 1;
            let (draw, mj) = grid[k];
            let target = self.draw_mw((k as f64 + 0.5) * DT);
            let next = target + (draw - target) * keep;
            grid.push((next, mj + (draw + next) / 2.0 * DT));
        }
        let (d0, e0) = grid[want];
        let (d1, _) = grid[want + 1];
        let frac = (t.max(0.0) - want as f64 * DT) / DT;
        // Within a grid step the draw moves linearly.
        e0 + (d0 + (d0 + (d1 - d0) * frac)) / 2.0 * frac * DT
    }

    /// The draw now (mW), lagged where `settle_ms` says.
    fn draw_now_mw(&self, t: f64) -> f64 {
        if self.settle_ms > 0 {
            self.settled_mj(t);
            let grid = self.settled.borrow();
            let k = ((t.max(0.0) / 0.005).floor() as usize).min(grid.len() - 1);
            return grid[k].0;
        }
        self.draw_mw(t)
    }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetTotalEnergyConsumption(
    dev: *mut c_void,
    mj: *mut c_ulonglong,
) -> c_uint {
    with_gpu(dev, Some(Call::Energy), |g, now| {
        if g.energy != SUCCESS {
            return g.energy;
        }
        // The counter moves in steps where the GPU updates it that way.
        let t = if g.energy_step_ms > 0 {
            let step = g.energy_step_ms as f64 / 1e3;
            (now.elapsed / step).floor() * step
        } else {
            now.elapsed
        };
        // SAFETY: valid out-pointer. Counter starts at 1,000 J.
        unsafe { *mj = 1_000_000 + g.energy_mj(t) as u64 };
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetPowerUsage(dev: *mut c_void, mw: *mut c_uint) -> c_uint {
    with_gpu(dev, Some(Call::Power), |g, now| {
        // Where the draw steps, the reading is its mean over the last
        // second (Ampere and later), as the energy counter's growth says.
        let w = if g.power_step.is_some() || g.load.is_some() {
            let from = (now.elapsed - 1.0).max(0.0);
            let span = now.elapsed - from;
            if span > 0.0 {
                (g.energy_mj(now.elapsed) - g.energy_mj(from)) / span
            } else {
                g.draw_now_mw(now.elapsed)
            }
        } else {
            f64::from(g.power_mw)
        };
        // SAFETY: valid out-pointer.
        unsafe { *mw = w.round() as c_uint };
        SUCCESS
    })
}

#[repr(C)]
pub struct FieldValue {
    field_id: c_uint,
    scope_id: c_uint,
    timestamp: i64,
    latency_usec: i64,
    value_type: c_uint,
    nvml_return: c_uint,
    value: c_ulonglong,
}

/// NVML_FI_DEV_POWER_AVERAGE and NVML_FI_DEV_POWER_INSTANT: the 1 s mean
/// and the draw now (mW, unsigned int); other fields are not supported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetFieldValues(
    dev: *mut c_void,
    count: i32,
    values: *mut FieldValue,
) -> c_uint {
    with_gpu(dev, Some(Call::Power), |g, now| {
        for i in 0..count.max(0) as usize {
            // SAFETY: the caller gave `count` entries.
            let v = unsafe { &mut *values.add(i) };
            let mw = match v.field_id {
                185 => {
                    let from = (now.elapsed - 1.0).max(0.0);
                    let span = now.elapsed - from;
                    Some(if span > 0.0 {
                        (g.energy_mj(now.elapsed) - g.energy_mj(from)) / span
                    } else {
                        g.draw_now_mw(now.elapsed)
                    })
                }
                186 => Some(g.draw_now_mw(now.elapsed)),
                _ => None,
            };
            v.timestamp = now.epoch_us as i64;
            v.latency_usec = 0;
            match mw {
                Some(mw) => {
                    v.value_type = 1;
                    v.nvml_return = SUCCESS;
                    v.value = mw.round() as c_ulonglong;
                }
                None => v.nvml_return = ERROR_NOT_SUPPORTED,
            }
        }
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
    with_gpu(dev, Some(Call::Util), |g, _| {
        if g.mig {
            return ERROR_NOT_SUPPORTED;
        }
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
    with_dev(dev, Some(Call::Memory), |g, slot, _| {
        // A MIG device's memory is its slices' share.
        let (total, used) = match slot.and_then(|s| g.instances[s]) {
            Some(i) => {
                let all: u64 = g
                    .instances
                    .iter()
                    .flatten()
                    .map(|i| u64::from(i.slices))
                    .sum();
                let part = |b: u64| b / all.max(1) * u64::from(i.slices);
                (part(g.memory_total), part(g.memory_used))
            }
            None => (g.memory_total, g.memory_used),
        };
        // SAFETY: valid out-pointer; the caller set `version`.
        unsafe {
            (*m).total = total;
            (*m).reserved = 0;
            (*m).used = used;
            (*m).free = total.saturating_sub(used);
        }
        SUCCESS
    })
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ProcessSample {
    pid: c_uint,
    time_stamp: c_ulonglong,
    sm_util: c_uint,
    mem_util: c_uint,
    enc_util: c_uint,
    dec_util: c_uint,
}

/// A process's mean SM use over (`from`, `to`] s: what the driver reports
/// for a sampling period (a process working 200 ms of every 300 reads 57
/// or 76 of 95 on an H200, by where the period falls).
fn mean_sm(procs: &[&Proc], from: f64, to: f64) -> f64 {
    if to <= from {
        return procs.iter().map(|p| f64::from(p.sm_at(to))).sum();
    }
    let sm = |t: f64| procs.iter().map(|p| f64::from(p.sm_at(t))).sum::<f64>();
    integral(procs, from, to, sm) / (to - from)
}

/// `value` (constant between `procs`' changes) integrated over (`from`,
/// `to`] s, piece by piece between the times any of `procs` changes.
fn integral(procs: &[&Proc], from: f64, to: f64, value: impl Fn(f64) -> f64) -> f64 {
    let mut cuts: Vec<f64> = procs
        .iter()
        .flat_map(|p| p.cuts(to))
        .filter(|c| *c > from)
        .collect();
    cuts.push(to);
    cuts.sort_by(f64::total_cmp);
    let (mut a, mut sum) = (from, 0.0);
    for c in cuts {
        if c > a {
            sum += value((a + c) / 2.0) * (c - a);
        }
        a = c;
    }
    sum
}

/// `sample_ms=0`: a sample at every call, of the moment.
fn sample_ms_zero(g: &Gpu) -> bool {
    g.sample_ms == Some(0)
}

impl Gpu {
    /// A process's (its entries') SM at `t`: with `timeslice`, its part
    /// of the SMs when the working holders' SM adds up to more than 100
    /// (contexts take turns).
    fn sm_share_at(&self, ps: &[&Proc], t: f64) -> f64 {
        let mine: f64 = ps.iter().map(|p| f64::from(p.sm_at(t))).sum();
        if self.timeslice.is_none() || mine == 0.0 {
            return mine;
        }
        let all: f64 = self.procs.iter().map(|p| f64::from(p.sm_at(t))).sum();
        if all > 100.0 {
            mine * 100.0 / all
        } else {
            mine
        }
    }

    /// Whether any of `ps` is working at `t`.
    fn working(&self, ps: &[&Proc], t: f64) -> bool {
        ps.iter().any(|p| p.sm_at(t) > 0)
    }

    /// A process's mean SM over (`from`, `to`] s (before nvmlInit: 0),
    /// its part under `timeslice` included: the value of a sample whose
    /// window that is.
    fn window_sm(&self, ps: &[&Proc], from: f64, to: f64) -> f64 {
        if to <= from {
            return self.sm_share_at(ps, to);
        }
        let from_ = from.max(0.0);
        if to <= from_ {
            return 0.0;
        }
        let all: Vec<&Proc> = self.procs.iter().collect();
        integral(&all, from_, to, |t| self.sm_share_at(ps, t)) / (to - from)
    }
}

/// The scenario's processes by the pid they resolve to now (with
/// `mps_samples=server`, the MPS clients under the server's).
fn by_pid(g: &Gpu) -> Vec<(u32, Vec<&Proc>)> {
    let mut by_pid: Vec<(u32, Vec<&Proc>)> = Vec::new();
    for p in &g.procs {
        // `mps_samples=server`: the clients' work is sampled as the
        // server's (an H200 on driver 580 gave every sample the server's
        // pid, and the clients none).
        let pid = match g.mps_server {
            Some(server) if g.mps_samples_server && p.mps_client => server,
            _ => resolve(p.pid),
        };
        if pid == 0 {
            continue;
        }
        match by_pid.iter_mut().find(|(q, _)| *q == pid) {
            Some((_, v)) => v.push(p),
            None => by_pid.push((pid, vec![p])),
        }
    }
    by_pid
}

/// The samples the driver gives for `last_seen`: of each process that
/// used the SM, its newest sample after `last_seen` only (driver 580 on an
/// H200: one call a second apart returns one sample per process, not
/// the five it took), or every one with `history=all`.
fn samples(g: &Gpu, now: &Now, last_seen: u64) -> Vec<ProcessSample> {
    let sample = |pid, time_stamp, sm_util: u32| ProcessSample {
        pid,
        time_stamp,
        sm_util,
        mem_util: sm_util / 2,
        enc_util: 0,
        dec_util: 0,
    };
    let period_us = g.sample_ms.unwrap_or(167) * 1000;
    // The ticks the driver sampled at, its last SAMPLE_BUFFER of them.
    let ticks: Vec<u64> = match now
        .epoch_us
        .saturating_sub(now.start_epoch_us)
        .checked_div(period_us)
    {
        None => vec![now.epoch_us],
        Some(k_now) => (k_now.saturating_sub(SAMPLE_BUFFER - 1)..=k_now)
            .filter(|k| *k > 0)
            .map(|k| now.start_epoch_us + k * period_us)
            .collect(),
    };
    let by_pid = by_pid(g);
    let secs = |ts: u64| ts.saturating_sub(now.start_epoch_us) as f64 / 1e6;
    let window_s = g
        .sm_window_ms
        .map_or(period_us as f64 / 1e6, |w| w as f64 / 1e3);
    let period_s = period_us as f64 / 1e6;
    let mut out: Vec<ProcessSample> = Vec::new();
    let mut procs = Vec::new();
    for &ts in ticks.iter().filter(|ts| **ts > last_seen) {
        let t = secs(ts);
        // Who held the GPU then.
        procs = running(g, t);
        // The newest sample is revised until the next is taken: its
        // window ends now (an H200 returned one timestamp with several
        // values, 50 ms apart).
        let end = if sample_ms_zero(g) {
            t
        } else {
            t.max(secs(now.epoch_us).min(t + period_s))
        };
        // Each process's SM over the window: about 2 s on an H200, so a
        // sample is a moving average (it rose from 0 to 100 over 2 s
        // after a load began).
        let values: Vec<(u32, u32, bool)> = by_pid
            .iter()
            .map(|(pid, ps)| {
                let lag_us = ps.iter().map(|p| p.lag_ms).max().unwrap_or(0) * 1000;
                let sm = if ts + lag_us > now.epoch_us {
                    0
                } else {
                    g.window_sm(ps, end - window_s, end).round() as u32
                };
                (*pid, sm, g.working(ps, t))
            })
            .collect();
        // Contexts that take turns: the driver publishes a sample of the
        // one working at the tick (an H200 gave one process per period,
        // the time share in the values); with none working then, of each
        // with any SM in its window.
        let any_working = values.iter().any(|v| v.1 > 0 && v.2);
        for &(pid, sm, working) in &values {
            if sm > 0 && (working || !any_working) {
                if !g.history_all {
                    out.retain(|s| s.pid != pid);
                }
                out.push(sample(pid, ts, sm));
            }
        }
    }
    // Garbage, once per call that has anything new.
    let newest = ticks.iter().rev().find(|ts| **ts > last_seen);
    if let Some(&ts) = newest {
        let first = procs.first().map(|p| p.0);
        let gb = &g.garbage;
        if gb.pid0 {
            out.push(sample(0, ts, 50));
        }
        if let Some(pid) = first {
            if gb.sm_over {
                out.push(sample(pid, ts, 37100));
            }
            if gb.dup {
                out.push(
                    *out.iter()
                        .find(|s| s.pid == pid)
                        .unwrap_or(&sample(pid, ts, 0)),
                );
            }
        }
        if gb.exited {
            out.push(sample(4_000_000, ts, 90));
        }
    }
    // A timestamp a day ahead, once per call that has anything new.
    if let Some(p) = procs
        .first()
        .filter(|_| g.garbage.future && !out.is_empty())
    {
        out.push(sample(p.0, now.epoch_us + 86_400_000_000, 99));
    }
    out
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetProcessUtilization(
    dev: *mut c_void,
    out: *mut ProcessSample,
    count: *mut c_uint,
    last_seen: c_ulonglong,
) -> c_uint {
    with_gpu(dev, Some(Call::Samples), |g, now| {
        if g.mig {
            return ERROR_NOT_SUPPORTED;
        }
        let mut s = samples(g, now, last_seen);
        // SAFETY: valid pointers per NVML's two-call contract.
        unsafe {
            if s.is_empty() {
                *count = 0;
                return ERROR_NOT_FOUND;
            }
            if out.is_null() {
                *count = s.len() as c_uint;
                return ERROR_INSUFFICIENT_SIZE;
            }
            if g.race > 0 {
                // A new sample landed since the count call.
                g.race -= 1;
                *count = s.len() as c_uint + 1;
                return ERROR_INSUFFICIENT_SIZE;
            }
            if (*count as usize) < s.len() {
                *count = s.len() as c_uint;
                return ERROR_INSUFFICIENT_SIZE;
            }
            s.truncate(*count as usize);
            for (i, x) in s.iter().enumerate() {
                *out.add(i) = *x;
            }
            *count = s.len() as c_uint;
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

/// Drivers 535.43 to 535.86 write `_v3` entries of 32 bytes (with
/// usedGpuCcProtectedMemory) where the header, and the caller, say 24.
fn v3_quirk(version: &str) -> bool {
    let mut v = version.split('.');
    let major: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let minor: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    major == 535 && (43..=86).contains(&minor)
}

unsafe fn running_processes(
    dev: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
    v3: bool,
) -> c_uint {
    // SAFETY: forwarded NVML contract.
    unsafe { listed_processes(dev, count, infos, v3, false) }
}

/// A process list: the compute list, or the MPS clients' (`mps`).
unsafe fn listed_processes(
    dev: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
    v3: bool,
    mps: bool,
) -> c_uint {
    with_dev(dev, Some(Call::Procs), |g, slot, now| {
        // A MIG device lists its instance's processes; the GPU, all (none
        // for a caller without the privilege, `parent_procs=none`).
        let of = slot.and_then(|s| g.instances[s]).map(|i| (i.gi, i.ci));
        let procs = if of.is_none() && g.mig && g.parent_procs_none {
            Vec::new()
        } else {
            running_where(g, now.elapsed, of, mps)
        };
        let n = procs.len();
        // SAFETY: valid pointers per NVML's two-call contract.
        unsafe {
            if infos.is_null() || (*count as usize) < n {
                *count = n as c_uint;
                return if n == 0 {
                    SUCCESS
                } else {
                    ERROR_INSUFFICIENT_SIZE
                };
            }
            let cap_bytes = *count as usize * std::mem::size_of::<ProcessInfo>();
            let entry = if v3 && v3_quirk(&now.driver_version) {
                32
            } else {
                std::mem::size_of::<ProcessInfo>()
            };
            for (i, &(pid, _, mem, gi)) in procs.iter().enumerate() {
                let at = i * entry;
                if at >= cap_bytes {
                    // A real driver writes on past the buffer; the stub
                    // stops at its end.
                    break;
                }
                let mut bytes = [0u8; 32];
                bytes[0..4].copy_from_slice(&pid.to_ne_bytes());
                bytes[8..16].copy_from_slice(&mem.to_ne_bytes());
                // Off MIG the instance ids are 0xFFFFFFFF.
                let (gi, ci) = gi.unwrap_or((u32::MAX, u32::MAX));
                bytes[16..20].copy_from_slice(&gi.to_ne_bytes());
                bytes[20..24].copy_from_slice(&ci.to_ne_bytes());
                let len = entry.min(cap_bytes - at);
                std::ptr::copy_nonoverlapping(bytes.as_ptr(), infos.cast::<u8>().add(at), len);
            }
            *count = n as c_uint;
        }
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v3(
    dev: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> c_uint {
    // SAFETY: forwarded NVML contract.
    unsafe { running_processes(dev, count, infos, true) }
}

/// As `_v3`, with the 24-byte entries of `_v2`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v2(
    dev: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> c_uint {
    // SAFETY: forwarded NVML contract.
    unsafe { listed_processes(dev, count, infos, false, true) }
}

/// Under MPS the clients are listed here, and the server in the compute
/// list (`mps_server=PID:MEM`, clients `PID:SM:MEM%mps`).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMPSComputeRunningProcesses_v3(
    dev: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> c_uint {
    // SAFETY: forwarded NVML contract.
    unsafe { listed_processes(dev, count, infos, true, true) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeRunningProcesses_v2(
    dev: *mut c_void,
    count: *mut c_uint,
    infos: *mut ProcessInfo,
) -> c_uint {
    // SAFETY: forwarded NVML contract.
    unsafe { running_processes(dev, count, infos, false) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigMode(
    dev: *mut c_void,
    current: *mut c_uint,
    pending: *mut c_uint,
) -> c_uint {
    with_gpu(dev, None, |g, _| {
        // SAFETY: valid out-pointers.
        unsafe {
            *current = u32::from(g.mig);
            *pending = u32::from(g.mig);
        }
        SUCCESS
    })
}

/// The most MIG devices a GPU can have (an H100's 7; more if the scenario
/// lists more slots).
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMaxMigDeviceCount(
    dev: *mut c_void,
    count: *mut c_uint,
) -> c_uint {
    with_gpu(dev, None, |g, _| {
        // SAFETY: valid out-pointer.
        unsafe { *count = g.instances.len().max(7) as c_uint };
        SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetMigDeviceHandleByIndex(
    dev: *mut c_void,
    index: c_uint,
    mig: *mut *mut c_void,
) -> c_uint {
    let idx = (dev as usize).wrapping_sub(1);
    with_gpu(dev, None, |g, _| {
        if !g.mig {
            return ERROR_NOT_SUPPORTED;
        }
        match g.instances.get(index as usize) {
            Some(Some(_)) => {
                // SAFETY: valid out-pointer.
                unsafe { *mig = mig_handle(idx, index as usize) };
                SUCCESS
            }
            // An empty slot, or past the instances: NOT_FOUND, as the
            // driver answers for a slot with no instance.
            _ => ERROR_NOT_FOUND,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetGpuInstanceId(dev: *mut c_void, id: *mut c_uint) -> c_uint {
    with_dev(dev, None, |g, slot, _| {
        match slot.and_then(|s| g.instances[s]) {
            Some(i) => {
                // SAFETY: valid out-pointer.
                unsafe { *id = i.gi };
                SUCCESS
            }
            None => ERROR_NOT_SUPPORTED,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetComputeInstanceId(
    dev: *mut c_void,
    id: *mut c_uint,
) -> c_uint {
    with_dev(dev, None, |g, slot, _| {
        match slot.and_then(|s| g.instances[s]) {
            Some(i) => {
                // SAFETY: valid out-pointer.
                unsafe { *id = i.ci };
                SUCCESS
            }
            None => ERROR_NOT_SUPPORTED,
        }
    })
}

#[repr(C)]
pub struct DeviceAttributes {
    multiprocessor_count: c_uint,
    shared_copy_engine_count: c_uint,
    shared_decoder_count: c_uint,
    shared_encoder_count: c_uint,
    shared_jpeg_count: c_uint,
    shared_ofa_count: c_uint,
    gpu_instance_slice_count: c_uint,
    compute_instance_slice_count: c_uint,
    memory_size_mb: c_ulonglong,
}

/// A MIG device's attributes: its SMs and slices.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlDeviceGetAttributes_v2(
    dev: *mut c_void,
    a: *mut DeviceAttributes,
) -> c_uint {
    with_dev(dev, None, |g, slot, _| {
        let Some(i) = slot.and_then(|s| g.instances[s]) else {
            return ERROR_NOT_SUPPORTED;
        };
        // SAFETY: valid out-pointer.
        unsafe {
            *a = DeviceAttributes {
                multiprocessor_count: i.sms,
                shared_copy_engine_count: 1,
                shared_decoder_count: 0,
                shared_encoder_count: 0,
                shared_jpeg_count: 0,
                shared_ofa_count: 0,
                gpu_instance_slice_count: i.slices,
                compute_instance_slice_count: i.slices,
                memory_size_mb: g.memory_total / (1 << 20) / 7 * u64::from(i.slices),
            }
        };
        SUCCESS
    })
}

#[repr(C)]
pub struct GpmSupport {
    version: c_uint,
    is_supported_device: c_uint,
}

const ERROR_ARGUMENT_VERSION_MISMATCH: c_uint = 25;

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmQueryDeviceSupport(dev: *mut c_void, s: *mut GpmSupport) -> c_uint {
    with_gpu(dev, None, |g, _| {
        // SAFETY: valid pointer; the caller set `version`.
        unsafe {
            if (*s).version != 1 {
                return ERROR_ARGUMENT_VERSION_MISMATCH;
            }
            (*s).is_supported_device = u32::from(g.gpm.is_some());
        }
        SUCCESS
    })
}

/// A GPM sample: which GPU and instance, and when (s since nvmlInit).
pub struct GpmSample {
    gpu: usize,
    gi: u32,
    t: f64,
    taken: bool,
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleAlloc(sample: *mut *mut GpmSample) -> c_uint {
    if sample.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: valid out-pointer; freed by nvmlGpmSampleFree.
    unsafe {
        *sample = Box::into_raw(Box::new(GpmSample {
            gpu: 0,
            gi: 0,
            t: 0.0,
            taken: false,
        }))
    };
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmSampleFree(sample: *mut GpmSample) -> c_uint {
    if sample.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: allocated by nvmlGpmSampleAlloc, freed once.
    drop(unsafe { Box::from_raw(sample) });
    SUCCESS
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMigSampleGet(
    dev: *mut c_void,
    gi: c_uint,
    sample: *mut GpmSample,
) -> c_uint {
    let idx = (dev as usize).wrapping_sub(1);
    with_gpu(dev, Some(Call::Gpm), |g, now| {
        if g.gpm.is_none() || !g.mig {
            return ERROR_NOT_SUPPORTED;
        }
        if sample.is_null() || !g.instances.iter().flatten().any(|i| i.gi == gi) {
            return ERROR_INVALID_ARGUMENT;
        }
        // SAFETY: a sample from nvmlGpmSampleAlloc.
        unsafe {
            *sample = GpmSample {
                gpu: idx,
                gi,
                t: now.elapsed,
                taken: true,
            }
        };
        SUCCESS
    })
}

#[repr(C)]
pub struct GpmMetric {
    metric_id: c_uint,
    nvml_return: c_uint,
    value: f64,
    short_name: *mut c_char,
    long_name: *mut c_char,
    unit: *mut c_char,
}

#[repr(C)]
pub struct GpmMetricsGet {
    version: c_uint,
    num_metrics: c_uint,
    sample1: *mut GpmSample,
    sample2: *mut GpmSample,
    metrics: [GpmMetric; 98],
}

/// NVML_GPM_METRIC_SM_UTIL between two samples of one instance: its
/// processes' mean SM over the span (each a percentage of the instance's
/// SMs), at most 100; `gpm=over` answers 250. Other metrics are not
/// supported.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn nvmlGpmMetricsGet(m: *mut GpmMetricsGet) -> c_uint {
    if m.is_null() {
        return ERROR_INVALID_ARGUMENT;
    }
    // SAFETY: the caller's struct, its samples from nvmlGpmSampleAlloc.
    let (version, n, a, b) = unsafe {
        let m = &*m;
        if m.sample1.is_null() || m.sample2.is_null() {
            return ERROR_INVALID_ARGUMENT;
        }
        (m.version, m.num_metrics as usize, &*m.sample1, &*m.sample2)
    };
    if version != 1 {
        return ERROR_ARGUMENT_VERSION_MISMATCH;
    }
    if !a.taken || !b.taken || a.gpu != b.gpu || a.gi != b.gi || n > 98 {
        return ERROR_INVALID_ARGUMENT;
    }
    let guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    let Some(state) = guard.as_ref() else {
        return ERROR_UNINITIALIZED;
    };
    let Some(g) = state.gpus.get(a.gpu) else {
        return ERROR_INVALID_ARGUMENT;
    };
    let (from, to) = if a.t <= b.t { (a.t, b.t) } else { (b.t, a.t) };
    // NVML asks for samples at least 100 ms apart.
    if to - from < 0.1 {
        return ERROR_INVALID_ARGUMENT;
    }
    // Each process's busy SMs (its SM % of its compute instance's SMs),
    // as a percentage of the GPU instance's.
    let gi_sms = f64::from(g.gi_sms(a.gi).max(1));
    let util: f64 = g
        .procs
        .iter()
        .filter(|p| p.instance.is_some_and(|(gi, _)| gi == a.gi))
        .map(|p| {
            let sms = g.instance_of(p).map_or(0.0, |i| f64::from(i.sms));
            mean_sm(&[p], from, to) * sms / gi_sms
        })
        .sum();
    let util = match g.gpm {
        Some(true) => 250.0,
        _ => util.min(100.0),
    };
    for i in 0..n {
        // SAFETY: `n` entries, within the array.
        let metric = unsafe { &mut (*m).metrics[i] };
        metric.short_name = std::ptr::null_mut();
        metric.long_name = std::ptr::null_mut();
        metric.unit = std::ptr::null_mut();
        if metric.metric_id == 2 {
            metric.value = util;
            metric.nvml_return = SUCCESS;
        } else {
            metric.value = 0.0;
            metric.nvml_return = ERROR_NOT_SUPPORTED;
        }
    }
    SUCCESS
}

// ------------------------------------------------------------ CUDA ---
//
// The CUDA driver API calls `wattprof calibrate` makes to hold a context
// on each GPU, in the same library: a context makes the calling process a
// holder of the GPU whose UUID matches (SM 0) until it is destroyed, so
// the draw gains the scenario's held power and NVML lists the process.

const CUDA_SUCCESS: c_uint = 0;
const CUDA_ERROR_INVALID_VALUE: c_uint = 1;
const CUDA_ERROR_NOT_INITIALIZED: c_uint = 3;
const CUDA_ERROR_DEVICES_UNAVAILABLE: c_uint = 46;
const CUDA_ERROR_NO_DEVICE: c_uint = 100;
const CUDA_ERROR_INVALID_DEVICE: c_uint = 101;
const CUDA_ERROR_INVALID_CONTEXT: c_uint = 201;

/// Memory a context takes (bytes): what an H200 showed for an empty one.
const CONTEXT_BYTES: u64 = 536_870_912;

/// Runs `f` on the state, starting it as nvmlInit would (libcuda loads
/// the driver's state itself); CUDA_ERROR_NO_DEVICE without a driver.
fn with_cuda(f: impl FnOnce(&mut State) -> c_uint) -> c_uint {
    let mut guard = STATE.lock().unwrap_or_else(|e| e.into_inner());
    if guard.is_none() {
        match init_state() {
            Some(state) => *guard = Some(state),
            None => return CUDA_ERROR_NO_DEVICE,
        }
    }
    let Some(state) = guard.as_mut() else {
        return CUDA_ERROR_NOT_INITIALIZED;
    };
    if state.cuda == CudaMode::Absent {
        return CUDA_ERROR_NO_DEVICE;
    }
    f(state)
}

#[unsafe(no_mangle)]
pub extern "C" fn cuInit(_flags: c_uint) -> c_uint {
    // The state lives as long as the process: CUDA is never shut down.
    with_cuda(|state| {
        state.inits += 1;
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetCount(count: *mut i32) -> c_uint {
    with_cuda(|state| {
        if count.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: a valid out-pointer (checked not null).
        unsafe { *count = state.gpus.len() as i32 };
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGet(dev: *mut i32, ordinal: i32) -> c_uint {
    with_cuda(|state| {
        if dev.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if ordinal < 0 || ordinal as usize >= state.gpus.len() {
            return CUDA_ERROR_INVALID_DEVICE;
        }
        // SAFETY: as above.
        unsafe { *dev = ordinal };
        CUDA_SUCCESS
    })
}

/// The 16 bytes of an NVML UUID (`GPU-` and 32 hex digits in 8-4-4-4-12
/// groups); zeros for a scenario's short UUID.
fn uuid_bytes(uuid: &str) -> [u8; 16] {
    let hex: String = uuid
        .trim_start_matches("GPU-")
        .chars()
        .filter(|c| *c != '-')
        .collect();
    let mut out = [0u8; 16];
    if hex.len() == 32 {
        for (i, b) in out.iter_mut().enumerate() {
            *b = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap_or(0);
        }
    }
    out
}

unsafe fn device_uuid(uuid: *mut u8, dev: i32) -> c_uint {
    with_cuda(|state| {
        let Some(g) = usize::try_from(dev).ok().and_then(|d| state.gpus.get(d)) else {
            return CUDA_ERROR_INVALID_DEVICE;
        };
        if uuid.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        // SAFETY: the caller's 16-byte CUuuid.
        unsafe { std::ptr::copy_nonoverlapping(uuid_bytes(&g.uuid).as_ptr(), uuid, 16) };
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid(uuid: *mut u8, dev: i32) -> c_uint {
    // SAFETY: forwarded CUDA contract.
    unsafe { device_uuid(uuid, dev) }
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuDeviceGetUuid_v2(uuid: *mut u8, dev: i32) -> c_uint {
    // SAFETY: forwarded CUDA contract.
    unsafe { device_uuid(uuid, dev) }
}

/// A context's handle: its GPU's index + 1 in the high 32 bits, its entry
/// in that GPU's processes in the low.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuCtxCreate_v2(ctx: *mut *mut c_void, _flags: c_uint, dev: i32) -> c_uint {
    with_cuda(|state| {
        if ctx.is_null() {
            return CUDA_ERROR_INVALID_VALUE;
        }
        if state.cuda == CudaMode::Busy {
            return CUDA_ERROR_DEVICES_UNAVAILABLE;
        }
        let now_ms = (state.start.elapsed().as_secs_f64() * 1e3).ceil() as u64;
        let Some(g) = usize::try_from(dev)
            .ok()
            .and_then(|d| state.gpus.get_mut(d))
        else {
            return CUDA_ERROR_INVALID_DEVICE;
        };
        g.procs.push(Proc {
            pid: std::process::id(),
            sm: 0,
            mem: CONTEXT_BYTES,
            window: Some((now_ms, u64::MAX)),
            duty: None,
            lag_ms: 0,
            instance: None,
            mps_client: false,
        });
        let handle = ((dev as usize + 1) << 32) | (g.procs.len() - 1);
        // SAFETY: as above.
        unsafe { *ctx = handle as *mut c_void };
        CUDA_SUCCESS
    })
}

#[unsafe(no_mangle)]
pub extern "C" fn cuCtxDestroy_v2(ctx: *mut c_void) -> c_uint {
    with_cuda(|state| {
        let h = ctx as usize;
        let now_ms = (state.start.elapsed().as_secs_f64() * 1e3).ceil() as u64;
        let Some(p) = (h >> 32)
            .checked_sub(1)
            .and_then(|d| state.gpus.get_mut(d))
            .and_then(|g| g.procs.get_mut(h & 0xffff_ffff))
        else {
            return CUDA_ERROR_INVALID_CONTEXT;
        };
        match p.window {
            Some((from, u64::MAX)) if p.pid == std::process::id() => {
                p.window = Some((from, now_ms.max(from)));
                CUDA_SUCCESS
            }
            _ => CUDA_ERROR_INVALID_CONTEXT,
        }
    })
}

#[unsafe(no_mangle)]
pub unsafe extern "C" fn cuGetErrorName(err: c_uint, name: *mut *const c_char) -> c_uint {
    let s: &'static [u8] = match err {
        CUDA_SUCCESS => b"CUDA_SUCCESS\0",
        CUDA_ERROR_NO_DEVICE => b"CUDA_ERROR_NO_DEVICE\0",
        CUDA_ERROR_DEVICES_UNAVAILABLE => b"CUDA_ERROR_DEVICES_UNAVAILABLE\0",
        CUDA_ERROR_INVALID_DEVICE => b"CUDA_ERROR_INVALID_DEVICE\0",
        _ => return CUDA_ERROR_INVALID_VALUE,
    };
    if name.is_null() {
        return CUDA_ERROR_INVALID_VALUE;
    }
    // SAFETY: a valid out-pointer; the string is static.
    unsafe { *name = s.as_ptr().cast() };
    CUDA_SUCCESS
}
