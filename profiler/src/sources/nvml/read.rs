//! One GPU's read: its energy, power, utilization and memory, the
//! per-process samples since the last read made into shares, the process
//! list, and on a MIG GPU its instances; every failure reported when it
//! begins and ends.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use nvml_wrapper::enums::device::UsedGpuMemory;
use nvml_wrapper::{Device, Nvml, error::NvmlError};

use super::samples::{RawSample, round3};

use super::energy::{Energy, Miss, read_energy};
use super::said::Said;
use super::{
    CARRY_SHARES, Gpu, GpuProcess, GpuReading, LOST_CATCH_UP, MigInstance, SmBasis, mig,
    now_epoch_us, nvml_err, sampler, sanitise,
};

/// Reads one GPU; `None` when it gave no reading this time (reported): its
/// energy counter, its device figures, the per-process samples since the
/// last read, who holds a context (the list, MPS clients, MIG instances),
/// and from those each holder's share.
pub(super) fn read_gpu(
    nvml: &Nvml,
    g: &mut Gpu,
    processes_v2: bool,
    mig_raw: Result<&Arc<mig::Raw>, &str>,
    problems: &mut Vec<(u32, String)>,
) -> Option<GpuReading> {
    let index = g.info.index;
    let mut said = Said {
        index,
        failing: &mut g.failing,
        out: problems,
    };
    let counted = read_counter(nvml, index, &mut g.energy, &mut g.lost, &mut said)?;
    let device = counted.device;
    let power_w = answer(
        &mut said,
        "power",
        counted.power.map(|mw| f64::from(mw) / 1e3),
        "power read failed",
    );
    let util_pct = match device.utilization_rates() {
        // MIG gives none: no failure.
        Err(NvmlError::NotSupported) if g.info.mig => None,
        r => answer(
            &mut said,
            "utilization",
            r.map(|u| u.gpu),
            "utilization read failed",
        ),
    };
    let memory_used_bytes = answer(
        &mut said,
        "memory",
        device.memory_info().map(|m| m.used),
        "memory read failed",
    );
    // The samples first, then the process list: a process that starts in
    // between is listed.
    let taken = take_samples(&device, &g.pending, &mut said);
    let now_us = now_epoch_us();
    let mut listed = list_holders(&device, processes_v2, &mut said);
    let mut mps_clients = Vec::new();
    if !g.info.mig
        && let (Some(l), Ok(raw)) = (listed.as_mut(), mig_raw)
    {
        mps_clients = add_mps_clients(&device, raw, processes_v2, l, &mut said);
    }
    // MIG: each instance with its processes and GPM's activity.
    let instances = if g.info.mig {
        mig::mig_instances(nvml, &device, &mut g.gpm, processes_v2, mig_raw, &mut said)
    } else {
        None
    };
    say_samples(
        &taken.fetched,
        instances.is_some(),
        g.gpm.is_some(),
        g.info.mig,
        &mut said,
    );
    let gone = gone_holders(&g.listed_before, &taken.between, listed.as_ref());
    let (shares, sm_basis) = shares_of(
        &taken,
        listed.as_ref(),
        &gone,
        (&mut g.read_floor, &mut g.shares),
        now_us,
        &mut said,
    );
    let mut processes = holders(listed.as_ref(), &gone, &shares, sm_basis);
    mps_samples_to_clients(&mut processes, mps_clients, &mut g.mps_before, &mut said);
    if let Some(l) = &listed {
        remember_listed(l, &mut g.listed_before, &g.pending);
    }
    let (sm_basis, at_rest) = basis_and_rest(sm_basis, &processes, taken.fetched.is_ok(), util_pct);
    let (sm_basis, instances, unheld_sm_pct, at_rest) = match instances {
        Some((list, memory)) => {
            let (basis, unheld, at_rest) = mig_holders(&list, &memory, &mut processes);
            (basis, list, unheld, at_rest)
        }
        None => (sm_basis, Vec::new(), 0.0, at_rest),
    };
    Some(GpuReading {
        index,
        energy_uj: counted.energy_uj,
        method: g.info.method,
        power_w,
        util_pct,
        memory_used_bytes,
        processes,
        sm_basis,
        at_rest,
        whole: counted.whole,
        instances,
        unheld_sm_pct,
    })
}

/// The holders listed now: the next read's "listed before", and the
/// sampler's known holders.
fn remember_listed(
    listed: &HashMap<u32, u64>,
    before: &mut Vec<u32>,
    pending: &Mutex<sampler::Pending>,
) {
    *before = listed.keys().copied().collect();
    pending.lock().unwrap_or_else(PoisonError::into_inner).known = before.iter().copied().collect();
}

/// The basis once the holders are known (carried shares of processes
/// that have all left are no shares), and whether the GPU was at rest:
/// NVML samples only processes that used the SM, so holders with no
/// sample within 2 s, on a GPU whose utilization is 0 where known, did no
/// work.
fn basis_and_rest(
    sm_basis: SmBasis,
    processes: &[GpuProcess],
    samples_ok: bool,
    util_pct: Option<u32>,
) -> (SmBasis, bool) {
    let idle = processes.iter().all(|p| p.sm_util_pct == 0.0);
    let basis = if sm_basis == SmBasis::Carried && idle {
        SmBasis::Equal
    } else {
        sm_basis
    };
    let at_rest = !processes.is_empty() && samples_ok && idle && util_pct.is_none_or(|u| u == 0);
    (basis, at_rest)
}

/// A GPU's energy since the last read, with its device and power reading.
struct Counted<'n> {
    device: nvml_wrapper::Device<'n>,
    power: Result<u32, NvmlError>,
    energy_uj: u64,
    /// It covers exactly the interval (not one after failed reads, a
    /// first power reading, or a GPU that was lost).
    whole: bool,
}

/// Reads the energy counter (or integrates power): `None` when the GPU is
/// lost or the read failed (reported; the next good read covers this
/// interval). A GPU that answers again after more than
/// [`LOST_CATCH_UP`] gives no energy for the time it was lost.
fn read_counter<'n>(
    nvml: &'n Nvml,
    index: u32,
    energy: &mut Energy,
    lost: &mut Option<Instant>,
    said: &mut Said<'_>,
) -> Option<Counted<'n>> {
    // Power integration's first reading has nothing to integrate from.
    let from_nothing = matches!(energy, Energy::Integrate { last: None, .. });
    let read = nvml
        .device_by_index(index)
        .map_err(Miss::from)
        .and_then(|d| {
            let power = d.power_usage();
            let uj = read_energy(&d, energy, &power)?;
            Ok((d, power, uj))
        });
    let (device, power, mut energy_uj) = match read {
        Err(Miss::Lost) => {
            lost.get_or_insert_with(Instant::now);
            // The same line every read: reported once while it lasts.
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
    if let Some(since) = lost.take() {
        whole = false;
        let lost_for = since.elapsed();
        let line = if lost_for > LOST_CATCH_UP {
            let line = format!(
                "answers again after {:.0} s lost: its energy meanwhile ({:.1} J) is not divided",
                lost_for.as_secs_f64(),
                energy_uj as f64 / 1e6
            );
            energy_uj = 0;
            line
        } else {
            format!(
                "answers again after {:.1} s lost: this read's energy covers that time",
                lost_for.as_secs_f64()
            )
        };
        said.out.push((index, line));
    }
    Some(Counted {
        device,
        power,
        energy_uj,
        whole,
    })
}

/// One device figure: reported when it starts failing and when it answers
/// again.
fn answer<T>(
    said: &mut Said<'_>,
    what: &'static str,
    r: Result<T, NvmlError>,
    failed: &str,
) -> Option<T> {
    match r {
        Ok(v) => {
            said.set(what, None);
            Some(v)
        }
        Err(e) => {
            said.set(what, Some(nvml_err(failed, &e)));
            None
        }
    }
}

/// What the sampler and this read fetched since the last read.
struct Taken {
    /// Whether this read's own fetch worked.
    fetched: Result<(), NvmlError>,
    raw: Vec<RawSample>,
    /// The newest plausible timestamp: the next read's floor.
    last_seen: u64,
    /// Processes the sampler saw listed between the reads.
    between: std::collections::HashSet<u32>,
    /// Samples left out past what is kept (reported after the samples'
    /// sanity).
    trimmed: usize,
    /// Exact repeats within one call (garbage, reported).
    duplicates: u32,
    /// Calls that answered since the last read ([`sampler::Pending::polls`]).
    polls: u32,
}

/// Fetches the newest samples (a count race retried) and takes what the
/// sampler fetched meanwhile; reports the processes listed between reads
/// that were left out.
fn take_samples(
    device: &Device<'_>,
    pending: &Mutex<sampler::Pending>,
    said: &mut Said<'_>,
) -> Taken {
    let (taken, between_dropped) = {
        let mut p = pending.lock().unwrap_or_else(PoisonError::into_inner);
        let fetched = sampler::fetch(device, &mut p);
        (
            Taken {
                fetched,
                raw: std::mem::take(&mut p.raw),
                last_seen: p.last_seen,
                between: std::mem::take(&mut p.listed_between),
                trimmed: std::mem::take(&mut p.trimmed),
                duplicates: std::mem::take(&mut p.duplicates),
                polls: std::mem::take(&mut p.polls),
            },
            std::mem::take(&mut p.between_dropped),
        )
    };
    // Each time: a count of what one interval lost, not a state.
    if between_dropped > 0 {
        said.out.push((
            said.index,
            format!(
                "{between_dropped} processes listed between two reads past the {} kept: their \
                 samples in the interval are left out",
                sampler::LISTED_BETWEEN
            ),
        ));
    }
    taken
}

/// The driver's process list: who holds a context, with its memory
/// (`None` when the list failed, reported: the processes with samples are
/// then the holders).
fn list_holders(
    device: &Device<'_>,
    processes_v2: bool,
    said: &mut Said<'_>,
) -> Option<HashMap<u32, u64>> {
    let list = if processes_v2 {
        device.running_compute_processes_v2()
    } else {
        device.running_compute_processes()
    };
    match list {
        Ok(l) => {
            said.set("process list", None);
            Some(
                l.into_iter()
                    .map(|p| {
                        let bytes = match p.used_gpu_memory {
                            UsedGpuMemory::Used(b) => b,
                            UsedGpuMemory::Unavailable => 0,
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
    }
}

/// MPS: its clients hold the GPU too (the server is in the list).
fn add_mps_clients(
    device: &Device<'_>,
    raw: &mig::Raw,
    processes_v2: bool,
    listed: &mut HashMap<u32, u64>,
    said: &mut Said<'_>,
) -> Vec<u32> {
    // SAFETY: the handle of a device NVML gave for this read.
    match raw.mps_clients(unsafe { device.handle() }, processes_v2) {
        Ok(clients) => {
            said.set("mps", None);
            clients
                .into_iter()
                .map(|(pid, bytes)| {
                    listed.entry(pid).or_insert(bytes);
                    pid
                })
                .collect()
        }
        Err(e) => {
            said.set(
                "mps",
                Some(format!(
                    "MPS clients cannot be listed ({e}): under MPS their energy goes to the \
                     server's holders"
                )),
            );
            Vec::new()
        }
    }
}

/// MPS clients with no sample of their own while the MPS server has some:
/// their work was sampled as the server's (an H200 on driver 580 gave
/// every sample the server's pid, and the clients none). The server's
/// share goes to the clients, equally (NVML gives no per-client figure
/// there), so a job's tree gets its dynamic energy, not the server. The
/// server is the holder whose `comm` is `nvidia-cuda-mps-server`'s (15
/// bytes); another process beside MPS keeps its own share. The clients
/// are those listed now (`listed`, then kept in `before` for the next
/// read) and at the last read (one that left since did its work in this
/// interval).
fn mps_samples_to_clients(
    processes: &mut Vec<GpuProcess>,
    listed: Vec<u32>,
    before: &mut Vec<u32>,
    said: &mut Said<'_>,
) {
    let mut clients = std::mem::replace(before, listed.clone());
    clients.retain(|p| !listed.contains(p));
    clients.extend(listed);
    let is_client = |p: &GpuProcess| clients.contains(&p.pid);
    let theirs: f64 = processes
        .iter()
        .filter(|p| is_client(p))
        .map(|p| p.sm_util_pct)
        .sum();
    // No MPS, or clients with samples of their own: /proc is not read.
    let servers: Vec<u32> = if clients.is_empty() || theirs > 0.0 {
        Vec::new()
    } else {
        processes
            .iter()
            .filter(|p| !is_client(p) && p.sm_util_pct > 0.0 && is_mps_server(p.pid))
            .map(|p| p.pid)
            .collect()
    };
    if servers.is_empty() {
        said.set("mps samples", None);
        return;
    }
    // Clients that left since the last read worked in this interval:
    // holders with no memory now.
    for &pid in &clients {
        if !processes.iter().any(|p| p.pid == pid) {
            processes.push(GpuProcess {
                pid,
                sm_util_pct: 0.0,
                memory_bytes: 0,
            });
        }
    }
    processes.sort_by_key(|p| p.pid);
    let held = clients.len();
    let server: f64 = processes
        .iter()
        .filter(|p| servers.contains(&p.pid))
        .map(|p| p.sm_util_pct)
        .sum();
    let each = round3(server / held as f64);
    for p in processes.iter_mut() {
        if is_client(p) {
            p.sm_util_pct = each;
        } else if servers.contains(&p.pid) {
            p.sm_util_pct = 0.0;
        }
    }
    said.set(
        "mps samples",
        Some(format!(
            "MPS: the driver gives its {held} clients no samples of their own (they carry the \
             server's pid): the server's share is divided equally among them"
        )),
    );
}

/// Whether `pid` is an MPS server: named so (`comm`), and running a file
/// named `nvidia-cuda-mps-server` that root owns. A name alone anyone can
/// take (`prctl`, a copied binary), and the server's share goes to other
/// processes: other users' jobs. NVML's pids are the host's, so this is
/// only asked where wattprof's `/proc` is the host's (its own PID
/// namespace is the first); elsewhere no holder is taken for a server.
fn is_mps_server(pid: u32) -> bool {
    use std::os::unix::fs::MetadataExt;
    if !in_first_pid_namespace() {
        return false;
    }
    let exe = format!("/proc/{pid}/exe");
    std::fs::read_to_string(format!("/proc/{pid}/comm"))
        .is_ok_and(|c| c.trim_end() == "nvidia-cuda-mps")
        && std::fs::read_link(&exe)
            .is_ok_and(|p| p.file_name().is_some_and(|n| n == "nvidia-cuda-mps-server"))
        && std::fs::metadata(&exe).is_ok_and(|m| m.uid() == 0)
}

/// Whether wattprof runs in the first PID namespace (its `NSpid` has one
/// pid: in a container's namespace it lists one per level).
fn in_first_pid_namespace() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .is_none_or(|pids| pids.split_whitespace().count() == 1)
    })
}

/// Reports whether per-process samples could be fetched, and under MIG how
/// the energy is divided instead.
fn say_samples(
    fetched: &Result<(), NvmlError>,
    instances: bool,
    gpm: bool,
    mig: bool,
    said: &mut Said<'_>,
) {
    match fetched {
        Ok(()) => said.set("samples", None),
        Err(NvmlError::NotSupported) if mig => {
            said.set(
                "samples",
                Some(match (instances, gpm) {
                    (true, true) => "MIG is on: NVML gives no per-process utilization, so the energy goes to each GPU instance by its busy SMs from GPM (by its compute slices until GPM has two samples of it), and equally among its processes".into(),
                    (true, false) => "MIG is on and this GPU has no GPM: the energy goes to each instance by its compute slices, and equally among an instance's processes".into(),
                    (false, _) => "MIG is on: NVML gives no per-process utilization, so the processes holding the GPU share its energy equally".into(),
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
}

/// Who may have samples though not listed now: the holders at the last
/// read (a process that ended since used the GPU in this interval), and
/// those the sampler saw listed in between (a job shorter than an
/// interval). None without a list.
fn gone_holders(
    before: &[u32],
    between: &std::collections::HashSet<u32>,
    listed: Option<&HashMap<u32, u64>>,
) -> Vec<u32> {
    let Some(l) = listed else {
        return Vec::new();
    };
    let mut v: Vec<u32> = before
        .iter()
        .copied()
        .filter(|b| !l.contains_key(b))
        .collect();
    for b in between {
        if !l.contains_key(b) && !v.contains(b) {
            v.push(*b);
        }
    }
    v
}

/// Each process's latest sampled share (pid → when, SM %; [`Gpu`]'s).
type LastShares = HashMap<u32, (Instant, f64)>;

/// Each holder's SM share from the samples since the last read (those
/// of unknown processes, repeats and impossible figures left out,
/// reported), or carried ([`carry_shares`]); moves the read floor on.
fn shares_of(
    taken: &Taken,
    listed: Option<&HashMap<u32, u64>>,
    gone: &[u32],
    (read_floor, last): (&mut u64, &mut LastShares),
    now_us: u64,
    said: &mut Said<'_>,
) -> (HashMap<u32, f64>, SmBasis) {
    // Each call asked a second back (late samples), so the floor is too.
    let floor = read_floor.saturating_sub(sampler::LOOK_BACK_US);
    let before = std::mem::replace(read_floor, taken.last_seen);
    let pids: Option<Vec<u32>> = listed.map(|l| {
        let mut p: Vec<u32> = l.keys().copied().collect();
        p.extend(gone);
        p
    });
    let mut clean = sanitise(&taken.raw, pids.as_deref(), (floor, now_us), taken.polls);
    clean.duplicates += taken.duplicates;
    // Judged only on reads that returned samples (NOT_FOUND says nothing).
    if !taken.raw.is_empty() {
        said.set("sample sanity", clean.discarded());
    }
    if taken.trimmed > 0 {
        // Each time: a count of what one interval lost, not a state.
        said.out.push((
            said.index,
            format!(
                "more NVML samples in one interval than are kept: the oldest {} left out",
                taken.trimmed
            ),
        ));
    }
    // Observations only of samples an earlier read saw: carried.
    let fresh = clean.newest.is_some_and(|n| n > before);
    carry_shares(clean.shares, fresh, last, pids.as_deref())
}

/// This read's shares where it has observations, and for a holder (of
/// `listed`, when known) with none in it, its last, up to
/// [`CARRY_SHARES`] old. `Sampled` when a sample is new to this read
/// (`fresh`); else `Carried`, or `Equal` with nothing recent.
fn carry_shares(
    sampled: HashMap<u32, f64>,
    fresh: bool,
    last: &mut LastShares,
    listed: Option<&[u32]>,
) -> (HashMap<u32, f64>, SmBasis) {
    let now = Instant::now();
    if fresh {
        for (&pid, &sm) in &sampled {
            last.insert(pid, (now, sm));
        }
    }
    last.retain(|_, (at, _)| now.duration_since(*at) <= CARRY_SHARES);
    let basis = if fresh {
        SmBasis::Sampled
    } else if last.is_empty() && sampled.is_empty() {
        return (HashMap::new(), SmBasis::Equal);
    } else {
        SmBasis::Carried
    };
    let mut shares = sampled;
    for (&pid, &(_, sm)) in last.iter() {
        if listed.is_none_or(|l| l.contains(&pid)) {
            shares.entry(pid).or_insert(sm);
        }
    }
    (shares, basis)
}

/// The holders with their shares: the process list (and those that ended
/// since the last read with samples of this interval), else those with
/// shares; by pid.
fn holders(
    listed: Option<&HashMap<u32, u64>>,
    gone: &[u32],
    shares: &HashMap<u32, f64>,
    sm_basis: SmBasis,
) -> Vec<GpuProcess> {
    let mut processes: Vec<GpuProcess> = match listed {
        Some(l) => l
            .iter()
            .map(|(&pid, &memory_bytes)| GpuProcess {
                pid,
                sm_util_pct: shares.get(&pid).copied().unwrap_or(0.0),
                memory_bytes,
            })
            .chain(
                gone.iter()
                    .filter(|_| sm_basis == SmBasis::Sampled)
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
    processes
}

/// MIG: the holders are those of the GPU's list and of every instance's
/// (the GPU's may leave some out, or fail), and the instances' weights
/// make their shares. The basis, the share no instance's process holds,
/// and whether every instance's GPM activity says 0 (at rest).
fn mig_holders(
    list: &[MigInstance],
    memory: &HashMap<u32, u64>,
    processes: &mut Vec<GpuProcess>,
) -> (SmBasis, f64, bool) {
    for i in list {
        for pid in &i.pids {
            if !processes.iter().any(|p| p.pid == *pid) {
                processes.push(GpuProcess {
                    pid: *pid,
                    sm_util_pct: 0.0,
                    memory_bytes: memory.get(pid).copied().unwrap_or(0),
                });
            }
        }
    }
    processes.sort_by_key(|p| p.pid);
    let (basis, unheld) = mig::mig_shares(list, processes);
    let at_rest = !processes.is_empty()
        && basis == SmBasis::InstanceActivity
        && list.iter().all(|i| i.sm_util_pct == Some(0.0));
    (basis, unheld, at_rest)
}

#[cfg(test)]
mod tests {
    use super::is_mps_server;

    /// A copy of sleep named as the MPS server, owned by `uid`, running.
    fn stand_in(dir: &std::path::Path, uid: u32) -> std::process::Child {
        let bin = dir.join("nvidia-cuda-mps-server");
        std::fs::copy("/bin/sleep", &bin).expect("copy sleep");
        std::os::unix::fs::chown(&bin, Some(uid), None).expect("chown");
        std::process::Command::new(&bin)
            .arg("30")
            .spawn()
            .expect("the stand-in")
    }

    #[test]
    fn an_mps_server_is_root_s_binary_under_that_name_not_a_name_anyone_can_take() {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipping: chown needs root");
            return;
        }
        let base = std::env::temp_dir().join(format!("wattprof-mps-{}", std::process::id()));
        let (root_dir, user_dir) = (base.join("root"), base.join("user"));
        for d in [&root_dir, &user_dir] {
            std::fs::create_dir_all(d).expect("dir");
        }
        let mut real = stand_in(&root_dir, 0);
        let mut forged = stand_in(&user_dir, 65534);
        std::thread::sleep(std::time::Duration::from_millis(100));
        let (is_real, is_forged) = (is_mps_server(real.id()), is_mps_server(forged.id()));
        for c in [&mut real, &mut forged] {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&base);
        assert!(is_real, "root's nvidia-cuda-mps-server");
        assert!(!is_forged, "a user's binary under that name");
        assert!(!is_mps_server(std::process::id()));
    }
}
