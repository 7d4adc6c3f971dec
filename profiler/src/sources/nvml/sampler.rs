//! NVML's per-process samples, gathered between reads.
//!
//! The driver samples each process's SM use every 1/6 s to 1 s (200 ms on
//! an H200 with driver 580), and `nvmlDeviceGetProcessUtilization` returns
//! of each process only its newest sample after `lastSeenTimeStamp`, not
//! every one since (measured on that GPU: one call a second apart returned
//! one sample per process). A read once an interval would weigh a whole
//! second by its last 200 ms: two processes taking turns 2:1 were split
//! 1.68:1. So a thread asks every [`SAMPLE_POLL`], faster than the driver
//! samples, and keeps what it gets until the interval's read takes it.

use std::sync::{Arc, Mutex, PoisonError, mpsc};
use std::thread::JoinHandle;
use std::time::Duration;

use nvml_wrapper::{Device, Nvml, error::NvmlError};

use super::samples::{RawSample, plausible};

/// How often the samples are asked for between reads: under the driver's
/// fastest sampling period (1/6 s), so no sample is missed.
pub(crate) const SAMPLE_POLL: Duration = Duration::from_millis(100);

/// How many times a count race (INSUFFICIENT_SIZE) is retried in a call.
const RACE_RETRIES: u32 = 3;

/// Samples kept for one read at most (a read that stalls for minutes
/// keeps the newest): 16 processes sampled 6 times a second for 40 s.
const KEEP: usize = 4096;

/// One GPU's samples since its last read.
#[derive(Debug, Default)]
pub(crate) struct Pending {
    /// The `lastSeenTimeStamp` of the next call: the newest plausible
    /// timestamp returned (never one in the future).
    pub(crate) last_seen: u64,
    /// Samples returned since the last read, as returned.
    pub(crate) raw: Vec<RawSample>,
}

/// Asks for the samples newer than the last seen (a count race retried),
/// keeps them, and moves the last seen to the newest plausible one.
/// NOT_FOUND (nothing new: the driver's pace) is no failure.
pub(crate) fn fetch(device: &Device<'_>, p: &mut Pending, now_us: u64) -> Result<(), NvmlError> {
    let mut samples = device.process_utilization_stats(p.last_seen);
    for _ in 0..RACE_RETRIES {
        if !matches!(samples, Err(NvmlError::InsufficientSize(_))) {
            break;
        }
        samples = device.process_utilization_stats(p.last_seen);
    }
    match samples {
        Ok(s) => {
            for x in s {
                let r = RawSample {
                    pid: x.pid,
                    timestamp: x.timestamp,
                    sm_util: x.sm_util,
                };
                if plausible(&r, now_us) {
                    p.last_seen = p.last_seen.max(r.timestamp);
                }
                p.raw.push(r);
            }
            if p.raw.len() > KEEP {
                let drop = p.raw.len() - KEEP;
                p.raw.drain(..drop);
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
    /// meets them too and says them.
    pub(crate) fn start(
        nvml: Arc<Nvml>,
        gpus: Vec<(u32, Arc<Mutex<Pending>>)>,
        every: Duration,
    ) -> std::io::Result<Self> {
        let (tx, rx) = mpsc::channel::<()>();
        let thread = std::thread::Builder::new()
            .name("wattprof-nvml".into())
            .spawn(move || {
                while let Err(mpsc::RecvTimeoutError::Timeout) = rx.recv_timeout(every) {
                    for (index, pending) in &gpus {
                        let Ok(device) = nvml.device_by_index(*index) else {
                            continue;
                        };
                        let mut p = pending.lock().unwrap_or_else(PoisonError::into_inner);
                        let _ = fetch(&device, &mut p, super::now_epoch_us());
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
