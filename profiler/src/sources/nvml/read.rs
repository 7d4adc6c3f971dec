//! One GPU's read: its energy, power, utilization and memory, the
//! per-process samples since the last read made into shares, the process
//! list, and on a MIG GPU its instances; every failure said when it
//! begins and ends.

use std::collections::HashMap;
use std::sync::{Arc, PoisonError};
use std::time::Instant;

use nvml_wrapper::{Nvml, error::NvmlError};

use super::energy::{Energy, Miss, read_energy};
use super::said::Said;
use super::{
    CARRY_SHARES, Gpu, GpuProcess, GpuReading, LOST_CATCH_UP, SmBasis, mig, now_epoch_us, nvml_err,
    sampler, sanitise,
};

/// Reads one GPU; `None` when it gave no reading this time (said).
pub(super) fn read_gpu(
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
    let (fetched, raw, trimmed, last_seen, between, between_dropped) = {
        let mut p = g.pending.lock().unwrap_or_else(PoisonError::into_inner);
        let fetched = sampler::fetch(&device, &mut p);
        (
            fetched,
            std::mem::take(&mut p.raw),
            std::mem::take(&mut p.trimmed),
            p.last_seen,
            std::mem::take(&mut p.listed_between),
            std::mem::take(&mut p.between_dropped),
        )
    };
    if between_dropped > 0 {
        // Each time: a count of what one interval lost, not a state.
        said.out.push((
            index,
            format!(
                "{between_dropped} processes listed between two reads past the {} kept: their \
                 samples in the interval are left out",
                4096
            ),
        ));
    }
    let now_us = now_epoch_us();
    let samples_ok = fetched.is_ok();
    // The driver's process list: who holds a context, and their memory.
    let list = if processes_v2 {
        device.running_compute_processes_v2()
    } else {
        device.running_compute_processes()
    };
    let mut listed: Option<HashMap<u32, u64>> = match list {
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
    // MPS: the clients are holders too (the server is in the list above).
    if let (Some(l), Ok(raw)) = (listed.as_mut(), mig_raw)
        && !g.info.mig
    {
        // SAFETY: the handle of a device NVML gave for this read.
        match raw.mps_clients(unsafe { device.handle() }, processes_v2) {
            Ok(clients) => {
                said.set("mps", None);
                for (pid, bytes) in clients {
                    l.entry(pid).or_insert(bytes);
                }
            }
            Err(e) => said.set(
                "mps",
                Some(format!(
                    "MPS clients cannot be listed ({e}): under MPS their energy goes to the \
                     server's holders"
                )),
            ),
        }
    }
    // MIG: each instance with its processes and GPM's activity.
    let instances = if g.info.mig {
        mig::mig_instances(nvml, &device, &mut g.gpm, processes_v2, mig_raw, &mut said)
    } else {
        None
    };
    match fetched {
        Ok(()) => said.set("samples", None),
        Err(NvmlError::NotSupported) if g.info.mig => {
            said.set(
                "samples",
                Some(match (&instances, g.gpm.is_some()) {
                    (Some(_), true) => "MIG is on: NVML gives no per-process utilization, so the energy goes to each GPU instance by its busy SMs from GPM (by its compute slices until GPM has two samples of it), and equally among its processes".into(),
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
    // Who may have samples: the holders now, those at the last read (a
    // process that ended since used the GPU in this interval), and those
    // the sampler saw listed in between (a job shorter than an interval).
    let gone: Vec<u32> = match &listed {
        Some(l) => {
            let mut v: Vec<u32> = g
                .listed_before
                .iter()
                .copied()
                .filter(|b| !l.contains_key(b))
                .collect();
            for b in &between {
                if !l.contains_key(b) && !v.contains(b) {
                    v.push(*b);
                }
            }
            v
        }
        None => Vec::new(),
    };
    let pids: Option<Vec<u32>> = listed.as_ref().map(|l| {
        let mut p: Vec<u32> = l.keys().copied().collect();
        p.extend(&gone);
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
    if let Some(l) = &listed {
        g.listed_before = l.keys().copied().collect();
        g.pending
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .known = g.listed_before.iter().copied().collect();
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
    // MIG: the holders are those of the GPU's list and of every
    // instance's (the GPU's may leave some out, or fail), and the
    // instances' weights make their shares.
    let (sm_basis, instances, unheld_sm_pct) = match instances {
        Some((list, memory)) => {
            for i in &list {
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
            let (basis, unheld) = mig::mig_shares(&list, &mut processes);
            // At rest: every instance's GPM activity says 0.
            at_rest = !processes.is_empty()
                && basis == SmBasis::InstanceActivity
                && list.iter().all(|i| i.sm_util_pct == Some(0.0));
            (basis, list, unheld)
        }
        None => (sm_basis, Vec::new(), 0.0),
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
        unheld_sm_pct,
    })
}
