//! Draining the event ring: forks, execs, exits and frees, as they come.

use std::os::fd::RawFd;

use profiler_common::iter::{EVENT_THREAD_EXIT, EVENT_THREAD_FREE, ThreadEvent};
use profiler_common::{EVENT_EXEC, EVENT_EXIT, EVENT_FORK, EVENT_REAPED, TaskEvent as RawEvent};

use super::EbpfTracker;
use crate::tracker::{
    TaskEvent, comm_to_string,
    switch::{Observation, Seen},
};

impl EbpfTracker {
    /// Consumes waiting ring-buffer records. Call it whenever the events fd
    /// is readable, so the ring never fills while waiting for a sample.
    pub(crate) fn drain_events(&mut self) {
        while let Some(item) = self.active.next() {
            let word = |i: usize| -> Option<u64> {
                Some(u64::from_ne_bytes(
                    item.get(i * 8..i * 8 + 8)?.try_into().ok()?,
                ))
            };
            if let (Some(tid), Some(epoch)) = (word(0), word(1)) {
                let tid = tid as u32;
                self.announced.push(tid);
                if epoch >= self.epoch {
                    // Ran in the epoch now open: it will not announce again
                    // in it, so the next read must look it up as well.
                    self.carried.push(tid);
                }
            }
        }
        while let Some(item) = self.events.next() {
            let kind = item
                .get(..4)
                .map_or(0, |b| u32::from_ne_bytes([b[0], b[1], b[2], b[3]]));
            if kind >= EVENT_THREAD_EXIT {
                if item.len() >= std::mem::size_of::<ThreadEvent>()
                    && let Some(iter) = self.iter.as_mut()
                {
                    // SAFETY: a `ThreadEvent` written by our program.
                    let ev: ThreadEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
                    // Its free carries the final run time: only that
                    // ends the settle wait's interest in it.
                    if ev.kind == EVENT_THREAD_FREE {
                        self.forks.ended(ev.tid);
                    }
                    iter.event(&ev);
                }
                continue;
            }
            if item.len() < std::mem::size_of::<RawEvent>() {
                continue;
            }
            // SAFETY: the record is a `RawEvent` written by our program;
            // read_unaligned copes with the ring's 8-byte alignment.
            let ev: RawEvent = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            match ev.kind {
                EVENT_FORK => {
                    self.forks.forked(ev.tid, ev.ts_ns);
                    self.pending.push(TaskEvent::Fork {
                        ts_ns: ev.ts_ns,
                        child: ev.tid,
                        parent_tid: ev.parent_tid,
                        parent_tgid: ev.parent_tgid,
                        comm: comm_to_string(&ev.comm),
                    });
                }
                EVENT_EXEC => self.pending.push(TaskEvent::Exec {
                    ts_ns: ev.ts_ns,
                    tid: ev.tid,
                    tgid: ev.tgid,
                    comm: comm_to_string(&ev.comm),
                }),
                EVENT_EXIT | EVENT_REAPED => {
                    self.forks.ended(ev.tid);
                    self.ledger.observe(
                        Observation {
                            tid: ev.tid,
                            created_ns: ev.created_ns,
                            tgid: ev.tgid,
                            cgroup_id: ev.cgroup_id,
                            comm: &ev.comm,
                            on_cpu_ns: &ev.on_cpu_ns,
                        },
                        Seen::Exit { ts_ns: ev.ts_ns },
                    );
                }
                _ => {}
            }
        }
    }
}

impl crate::tracker::EventRing for EbpfTracker {
    fn ring_fd(&self) -> Option<RawFd> {
        Some(self.events_fd())
    }

    fn drain(&mut self) {
        self.drain_events();
    }
}
