//! NVML's per-process samples, gathered between reads.
//!
//! The driver samples each process's SM use every 1/6 s to 1 s (200 ms on
//! an H200 with driver 580), and `nvmlDeviceGetProcessUtilization` returns
//! one sample per process, not every one since `lastSeenTimeStamp`
//! (measured on that GPU: one call a second after the last returned one
//! per process, of the five taken). So a thread asks every
//! [`SAMPLE_POLL`], faster than the driver samples, and keeps what it gets
//! until the interval's read takes it.
//!
//! Each call asks [`LOOK_BACK_US`] before the newest sample seen, not from
//! it: `lastSeenTimeStamp` is one for all processes, and a sample the
//! driver publishes after another process's newer one would otherwise
//! never be returned (nvitop reads 2 s back for this).
//!
//! What a sample is, as an H200 (driver 580) showed it: its process's SM
//! use over about the last 2 s (a load that began rose from 0 to 100 over
//! 2 s), revised while it is the newest (one timestamp came back with two
//! to four values 50 ms apart), and under time-slicing published for one
//! process per period (the one working then), the time share in its
//! value. So each call is an observation: each process's newest sample as
//! it reads now, and a process's share of an interval is the sum of its
//! observations over the interval's calls that observed any process (a
//! call without it counts 0: it was not working then; a call that saw
//! nothing, before the first sample, does not count). A sample more than
//! 2 s old when read is no observation: its process stopped. The H200's
//! own samples of two processes taking turns 2:1, replayed this way, split
//! 2.07:1 and 2.08:1 (busy 2.09:1) read every second and every 100 ms;
//! measured live on it (the mean of each process's observations, the rule
//! before), 1.976:1 (busy 1.982) and 2.184:1 (busy 2.047).

use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::{Device, Nvml, error::NvmlError};

use super::samples::{RawSample, plausible};

/// How often the samples are asked for between reads: under the driver's
/// fastest sampling period (1/6 s), so no sample is missed.
pub(crate) const SAMPLE_POLL: Duration = Duration::from_millis(100);

/// How far before the newest sample seen each call asks (µs): a sample
/// published up to a second late is still returned.
pub(crate) const LOOK_BACK_US: u64 = 1_000_000;

/// A sample older than this when read is not an observation: its process
/// stopped working ([`super::CARRY_SHARES`], the carry's own bound).
const STALE_US: u64 = 2_000_000;

/// How many times a count race (INSUFFICIENT_SIZE) is retried in a call.
const RACE_RETRIES: u32 = 3;

/// Observations kept for one read at most, the newest (reported when more
/// came): at 10 polls a second, 2 processes observed at every poll for 72
/// minutes, or 864 for a 10 s interval; past it, a long interval's shares
/// come from its later part.
const KEEP: usize = 86_400;

/// One GPU's samples since its last read.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// The `lastSeenTimeStamp` of the next call: the newest plausible
    /// timestamp returned (never one in the future).
    pub(crate) last_seen: u64,
    /// Observations since the last read: of each call, each process's
    /// newest sample as it reads now (and, as they came, samples that
    /// cannot be true).
    pub(crate) raw: Vec<RawSample>,
    /// Exact repeats within one call since the last read (garbage).
    pub(crate) duplicates: u32,
    /// Calls since the last read that observed some process: a process's
    /// share is the sum of its observations over these, so such a call
    /// that did not return it counts as 0 for it (under time-slicing the
    /// driver publishes only the process working then).
    pub(crate) polls: u32,
    /// Samples left out since the last read, past [`KEEP`].
    pub(crate) trimmed: usize,
    /// The holders the last read found (set by the read).
    pub(crate) known: std::collections::HashSet<u32>,
    /// Processes the driver listed between reads that the last read did
    /// not: a job that opens and closes its context between two reads
    /// (a 0.3 s burst under a 1 s interval) keeps its samples, however
    /// late they are published.
    pub(crate) listed_between: std::collections::HashSet<u32>,
    /// Processes listed between reads past [`LISTED_BETWEEN`]: not kept
    /// (their samples are dropped as a non-holder's), counted to be
    /// reported.
    pub(crate) between_dropped: u64,
}

/// At most this many processes listed between two reads are kept.
pub(super) const LISTED_BETWEEN: usize = 4096;

/// Notes the holders the driver lists now that the last read did not
/// find (one process-list call per poll; `v2`: the `_v2` call, on drivers
/// whose `_v3` entries are not the header's size).
pub(crate) fn note_holders(device: &Device<'_>, p: &mut Pending, v2: bool) {
    let list = if v2 {
        device.running_compute_processes_v2()
    } else {
        device.running_compute_processes()
    };
    let Ok(list) = list else {
        return;
    };
    for pid in list.iter().map(|x| x.pid) {
        if p.known.contains(&pid) || p.listed_between.contains(&pid) {
            continue;
        }
        if p.listed_between.len() < LISTED_BETWEEN {
            p.listed_between.insert(pid);
        } else {
            p.between_dropped += 1;
        }
    }
}

/// Asks for the samples newer than [`LOOK_BACK_US`] before the last seen
/// (a count race retried), keeps each process's newest as it reads now,
/// and moves the last seen to the newest plausible one (not in the
/// future: the clock is read after the call). NOT_FOUND (nothing new: the driver's
/// pace) is no failure.
pub(crate) fn fetch(device: &Device<'_>, p: &mut Pending) -> Result<(), NvmlError> {
    let ask = p.last_seen.saturating_sub(LOOK_BACK_US);
    let mut samples = device.process_utilization_stats(ask);
    for _ in 0..RACE_RETRIES {
        if !matches!(samples, Err(NvmlError::InsufficientSize(_))) {
            break;
        }
        samples = device.process_utilization_stats(ask);
    }
    let now_us = super::now_epoch_us();
    match samples {
        Ok(s) => {
            // One observation of each process per call: the value its
            // newest sample has now. What cannot be true goes to the read
            // as it came, which reports it; an exact repeat within the
            // call is counted.
            let mut all: Vec<RawSample> = Vec::new();
            let mut newest: Vec<RawSample> = Vec::new();
            for x in s.iter() {
                let r = RawSample {
                    pid: x.pid,
                    timestamp: x.timestamp,
                    sm_util: x.sm_util,
                };
                if all.contains(&r) {
                    p.duplicates += 1;
                    continue;
                }
                all.push(r);
                if !plausible(&r, now_us) {
                    // Once per distinct sample: a driver that returns
                    // the same garbage at every call does not fill the
                    // buffer with it.
                    if !p.raw.contains(&r) {
                        p.raw.push(r);
                    }
                    continue;
                }
                // A sample this old is of a process that stopped working
                // (the driver keeps returning it while the newest seen
                // does not move): not an observation of now.
                if r.timestamp.saturating_add(STALE_US) < now_us {
                    continue;
                }
                match newest.iter_mut().find(|q| q.pid == r.pid) {
                    Some(q) if r.timestamp >= q.timestamp => *q = r,
                    Some(_) => {}
                    None => newest.push(r),
                }
            }
            for r in &newest {
                p.last_seen = p.last_seen.max(r.timestamp);
            }
            // A call that observed some process: one where the driver
            // was publishing, so a process it did not return was not
            // working then (a call with none says nothing: no sample yet).
            if !newest.is_empty() {
                p.polls = p.polls.saturating_add(1);
            }
            p.raw.extend(newest);
            if p.raw.len() > KEEP {
                let drop = p.raw.len() - KEEP;
                p.raw.drain(..drop);
                p.trimmed += drop;
            }
            Ok(())
        }
        Err(NvmlError::NotFound) => Ok(()),
        Err(e) => Err(e),
    }
}

/// The thread that fetches every GPU's samples between reads; stopped
/// and joined when dropped.
#[derive(Debug)]
pub(crate) struct Sampler {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Sampler {
    /// Starts fetching `gpus` (NVML index, its pending samples) every
    /// `every`. Its failures are left to the read's own fetch, which
    /// meets them too and reports them.
    pub(crate) fn start(
        nvml: Arc<Nvml>,
        gpus: Vec<(u32, Arc<Mutex<Pending>>)>,
        every: Duration,
        processes_v2: bool,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("wattprof-nvml".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                    // Idle GPUs too: a job that starts between reads is
                    // sampled from its first period (a call returns one
                    // sample per process, so a later first call loses the
                    // ones before it).
                    for (index, pending) in &gpus {
                        let Ok(device) = nvml.device_by_index(*index) else {
                            continue;
                        };
                        let mut p = pending.lock().unwrap_or_else(PoisonError::into_inner);
                        let _ = fetch(&device, &mut p);
                        note_holders(&device, &mut p, processes_v2);
                    }
                }
            })?;
        Ok(Self {
            stop: Some(tx),
            thread: Some(thread),
        })
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        // Closing the channel wakes the thread at once.
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
