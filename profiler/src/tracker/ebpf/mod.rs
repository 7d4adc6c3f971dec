//! The eBPF time tracker: its state, its reads and its samples (loading
//! and attaching are `start.rs`, the event ring `ring.rs`).

use std::os::fd::{AsFd, AsRawFd, RawFd};

use aya::{
    Ebpf, RawTracePointRunOptions, TestRun,
    maps::{HashMap as BpfHashMap, Map, MapData, PerCpuArray, RingBuf},
    programs::RawTracePoint,
};
use profiler_common::switch::{TASK_FLAG_DEAD, TaskStats};
use profiler_common::{COMM_LEN, CpuState};

use super::load::map_err;
use super::{
    CpuSample, CpuSampler, CpuTimes, TaskEvent, TrackerError,
    iter::IterState,
    monotonic_ns,
    switch::{Observation, Seen, ThreadLedger},
    sys::{self, Batch},
};
use crate::topology::Topology;

mod config;
mod kernel_log;
mod ring;
mod start;
mod walk;

pub(crate) use config::{
    ExitTracking, SkipEvent, TaskClock, TaskWalk, TaskWalkChoice, TrackerChoice, TrackerConfig,
};
pub use config::{TrackerKind, kernel_memory_estimate, walk_ring_memory};
use kernel_log::KernelLog;
use start::write_epoch;

static OBJECT: &[u8] = aya::include_bytes_aligned!("../../../ebpf/wattprof.bpf.o");

/// The loaded and attached eBPF tracker.
pub(crate) struct EbpfTracker {
    ebpf: Ebpf,
    /// The programs' aya-log ring, read at each sample.
    kernel_log: Option<(aya_log::EbpfLogger<KernelLog>, KernelLog)>,
    cpus: Map,
    tasks: Map,
    events: RingBuf<MapData>,
    epoch_map: Map,
    active: RingBuf<MapData>,
    /// Threads announced in `ACTIVE` since the last read.
    announced: Vec<u32>,
    /// Threads announced for the epoch after the one being read (they ran
    /// between the epoch bump and the drain): read now and next time too.
    carried: Vec<u32>,
    epoch: u64,
    samples: u64,
    topology: Topology,
    prev: Vec<CpuState>,
    ledger: ThreadLedger,
    pending: Vec<TaskEvent>,
    /// Threads forked lately whose end is unseen (for `run`'s settle wait).
    forks: super::forks::RecentForks,
    exit_tracking: ExitTracking,
    task_clock: TaskClock,
    flush_supported: bool,
    batch_supported: bool,
    read_syscalls: u64,
    start_ns: u64,
    /// Per CPU: task time settled beyond an interval's window (a slice
    /// charged at a flush, then settled with the scheduler's figure), taken
    /// from the next intervals' idle time so totals conserve exactly.
    idle_debt: Vec<u64>,
    closing: bool,
    /// The iterator tracker's state; `None` for the switch tracker (whose
    /// state is the fields above).
    iter: Option<IterState>,
    /// Why the switch tracker runs where the iterator was wanted.
    fallback: Option<String>,
    /// Iterator tracker: why its reads use `iter/task`, not the open-coded
    /// walk.
    walk_fallback: Option<String>,
}

impl EbpfTracker {
    /// Which tracker runs.
    pub(crate) fn kind(&self) -> TrackerKind {
        if self.iter.is_some() {
            TrackerKind::Iter
        } else {
            TrackerKind::Switch
        }
    }

    /// Why the switch tracker runs although `auto` asked for the iterator.
    pub(crate) fn fallback_reason(&self) -> Option<&str> {
        self.fallback.as_deref()
    }

    /// Iterator tracker: the walk its reads that skip idle threads use;
    /// `None` for the switch tracker.
    pub(crate) fn task_walk(&self) -> Option<TaskWalk> {
        self.iter.as_ref().map(|i| {
            if i.open_coded() {
                TaskWalk::OpenCoded
            } else {
                TaskWalk::IterTask
            }
        })
    }

    /// Iterator tracker: why its reads use `iter/task`, not the open-coded
    /// walk.
    pub(crate) fn walk_fallback_reason(&self) -> Option<&str> {
        self.walk_fallback
            .as_deref()
            .or_else(|| self.iter.as_ref()?.walk_given_up.as_deref())
    }

    /// Reads whose open-coded walk filled its ring (finished by
    /// `iter/task`).
    pub(crate) fn walk_ring_full(&self) -> u64 {
        self.iter.as_ref().map_or(0, |i| i.walk_ring_full)
    }

    /// Iterator tracker: threads its filter map could not hold at the
    /// busiest read (read every time instead); 0 for the switch tracker.
    pub(crate) fn filter_overflow(&self) -> u64 {
        self.iter.as_ref().map_or(0, |i| i.filter_overflow)
    }

    /// Iterator tracker: threads settled from their exit reading because
    /// their free never came, and threads gone with neither (events lost).
    pub(crate) fn exits_without_free(&self) -> (u64, u64) {
        self.iter.as_ref().map_or((0, 0), |i| {
            (i.ledger().settled_from_exit(), i.ledger().vanished())
        })
    }

    /// The CPU topology in use.
    pub(crate) fn topology(&self) -> &Topology {
        &self.topology
    }

    /// How exits are detected on this kernel.
    pub(crate) fn exit_tracking(&self) -> ExitTracking {
        self.exit_tracking
    }

    /// Which clock task time comes from.
    pub(crate) fn task_clock(&self) -> TaskClock {
        self.task_clock
    }

    /// Whether in-progress slices are closed before each read (Linux 5.10+).
    /// Without it, a slice still running at a read is counted at its end.
    pub(crate) fn flush_supported(&self) -> bool {
        self.flush_supported
    }

    /// Syscalls spent reading the per-thread map (or the iterator) so far.
    pub(crate) fn read_syscalls(&self) -> u64 {
        self.iter
            .as_ref()
            .map_or(self.read_syscalls, |i| i.read_syscalls)
    }

    /// File descriptor that becomes readable when events are waiting.
    pub(crate) fn events_fd(&self) -> RawFd {
        self.events.as_raw_fd()
    }

    /// Bytes of kernel memory the maps use, as the kernel accounts them
    /// (see [`kernel_memory_estimate`] for the formula).
    pub(crate) fn kernel_memory_bytes(&self) -> u64 {
        let fds = [
            map_fd(&self.cpus),
            map_fd(&self.tasks),
            map_fd(&self.epoch_map),
            Some(self.events.as_fd()),
            Some(self.active.as_fd()),
        ];
        let iter_fds = self
            .iter
            .as_ref()
            .map(|i| i.maps().map(map_fd).into_iter().chain([i.walk_ring()]))
            .into_iter()
            .flatten();
        fds.into_iter()
            .chain(iter_fds)
            .flatten()
            .filter_map(sys::map_memlock_bytes)
            .sum()
    }

    /// Start of accounting (monotonic ns): the flush that opened the CPUs'
    /// windows when the tracker started. Samples count from there.
    pub(crate) fn start_ns(&self) -> u64 {
        self.start_ns
    }

    /// Threads of `tgid` seen alive that have not reported their exit.
    pub(crate) fn live_threads_of(&self, tgid: u32) -> usize {
        match &self.iter {
            Some(i) => i.ledger().live_threads_of(tgid),
            None => self.ledger.live_threads_of(tgid),
        }
    }

    /// Threads that exited between `since_ns` and `until_ns` (monotonic)
    /// and whose final run time has not come yet (the iterator tracker's free events,
    /// an RCU grace period after the thread is reaped).
    pub(crate) fn awaiting_final_since(&self, since_ns: u64, until_ns: u64) -> usize {
        self.iter
            .as_ref()
            .map_or(0, |i| i.ledger().awaiting_free_since(since_ns, until_ns))
    }

    /// Iterator tracker: threads read since `since_ns` that /proc no
    /// longer lists but that reported no exit (the event was lost): their
    /// free brings the final time. One look at /proc per such thread.
    pub(crate) fn lost_exits_since(&self, since_ns: u64) -> Vec<(u64, u64)> {
        let gone = |tgid: u32, tid: u32| {
            !std::path::Path::new(&format!("/proc/{tgid}/task/{tid}")).exists()
        };
        self.iter.as_ref().map_or_else(Vec::new, |i| {
            i.ledger().gone_unreported_since(since_ns, gone)
        })
    }

    /// How many of these threads (from [`EbpfTracker::lost_exits_since`])
    /// are still waiting for their free.
    pub(crate) fn not_freed(&self, threads: &[(u64, u64)]) -> usize {
        self.iter
            .as_ref()
            .map_or(0, |i| i.ledger().not_freed(threads))
    }

    /// Threads forked since `since_ns` (monotonic) whose free has not come
    /// and that `/proc` no longer lists: their free, with the final run
    /// time, is on its way. They include threads no
    /// read ever showed, which [`EbpfTracker::lost_exits_since`] cannot
    /// know.
    pub(crate) fn unended_forks_since(&self, since_ns: u64) -> Vec<u32> {
        // The switch tracker has no free events, and its exits come only
        // for threads it holds: nothing to wait for that could come.
        if self.iter.is_none() {
            return Vec::new();
        }
        self.forks.gone_unended_since(since_ns, |tid| {
            !std::path::Path::new(&format!("/proc/{tid}")).exists()
        })
    }

    /// How many of these threads (from
    /// [`EbpfTracker::unended_forks_since`]) have still not ended.
    pub(crate) fn still_unended(&self, tids: &[u32]) -> usize {
        self.forks.still_open(tids)
    }

    /// Whether thread `tid` has reported its exit.
    pub(crate) fn has_exited(&self, tid: u32) -> bool {
        match &self.iter {
            Some(i) => i.ledger().has_exited(tid),
            None => self.ledger.has_exited(tid),
        }
    }

    /// Closes the slice in progress on every online CPU by running the
    /// flush program there.
    fn flush_cpus(&mut self) {
        if !self.flush_supported {
            return;
        }
        let Some(prog) = self.ebpf.program("wattprof_flush") else {
            self.flush_supported = false;
            return;
        };
        let Ok(prog) = <&RawTracePoint>::try_from(prog) else {
            self.flush_supported = false;
            return;
        };
        let mut any_ok = false;
        for &cpu in &self.topology.online {
            let mut args = [0; 12];
            args[0] = u64::from(self.closing);
            let opts = RawTracePointRunOptions {
                args,
                cpu: Some(cpu),
            };
            // ENXIO: the CPU went offline since the topology was read.
            any_ok |= prog.test_run(opts).is_ok();
        }
        self.flush_supported = any_ok;
    }

    fn read_cpus(&self) -> Result<Vec<CpuState>, TrackerError> {
        let view =
            PerCpuArray::<&MapData, CpuState>::try_from(&self.cpus).map_err(map_err("CPUS"))?;
        let values = view.get(&0, 0).map_err(map_err("CPUS"))?;
        Ok(values.to_vec())
    }

    /// Looks up the announced threads and those awaiting a free, one
    /// syscall each.
    fn read_announced(&mut self) -> Result<Vec<(u32, TaskStats)>, TrackerError> {
        let mut tids = std::mem::take(&mut self.announced);
        tids.extend(self.ledger.awaiting_free());
        tids.sort_unstable();
        tids.dedup();
        let view = BpfHashMap::<&MapData, u32, TaskStats>::try_from(&self.tasks)
            .map_err(map_err("TASKS"))?;
        let mut out = Vec::with_capacity(tids.len());
        for tid in tids {
            self.read_syscalls += 1;
            match view.get(&tid, 0) {
                Ok(stats) => out.push((tid, stats)),
                // Exited (its exit record carries the totals).
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err("TASKS")(e)),
            }
        }
        Ok(out)
    }

    fn read_tasks(&mut self) -> Result<Vec<(u32, TaskStats)>, TrackerError> {
        let zero = TaskStats::new(0, 0, 0, 0, [0; COMM_LEN]);
        if self.batch_supported
            && let Some(fd) = map_fd(&self.tasks)
        {
            match sys::lookup_batch::<u32, TaskStats>(fd, 4096, zero) {
                Ok(Batch::Read { entries, calls }) => {
                    self.read_syscalls += u64::from(calls);
                    return Ok(entries);
                }
                Ok(Batch::Unsupported) => self.batch_supported = false,
                Err(e) => {
                    return Err(TrackerError::Map {
                        map: "TASKS",
                        reason: e.to_string(),
                    });
                }
            }
        }
        let view = BpfHashMap::<&MapData, u32, TaskStats>::try_from(&self.tasks)
            .map_err(map_err("TASKS"))?;
        let mut out = Vec::new();
        for entry in view.iter() {
            self.read_syscalls += 2;
            match entry {
                Ok(kv) => out.push(kv),
                // Deleted between get_next_key and lookup: its exit record
                // carries the totals.
                Err(aya::maps::MapError::KeyNotFound) => {}
                Err(e) => return Err(map_err("TASKS")(e)),
            }
        }
        Ok(out)
    }
}

impl EbpfTracker {
    /// A sample of the iterator tracker: read, drain the ring (exits,
    /// frees and checkpoints up to now), apply the read, close.
    fn sample_iter(&mut self, at_read: &mut dyn FnMut()) -> Result<CpuSample, TrackerError> {
        let began = match self.iter.as_mut() {
            Some(i) => i.read(self.closing, at_read)?,
            None => return Err(TrackerError::Load("no iterator".into())),
        };
        // The others close where the walk began, right after the energy
        // read: every thread is read at or after it, and time a running
        // thread ran past it is carried into the next interval. The final
        // window closes after the ring is drained: a free drained here
        // carries its thread's final time, which may run past the read,
        // and the last interval must span every time it hands out (closed
        // at the read's end before the drain, a loaded machine left its
        // CPUs busier than their window: run.rs:39).
        let at_ns = if self.closing {
            self.drain_events();
            monotonic_ns()
        } else {
            self.drain_events();
            self.iter
                .as_ref()
                .map_or_else(monotonic_ns, |s| s.walk_at())
        };
        let now = self.read_cpus()?;
        let Some(state) = self.iter.as_mut() else {
            return Err(TrackerError::Load("no iterator".into()));
        };
        state.apply(began, at_ns);
        let (tasks, cpus) = state.close(at_ns, &self.topology, self.closing)?;
        self.samples += 1;
        Ok(self.sample_of(at_ns, now, cpus, tasks, 0))
    }

    /// The sample both trackers hand out: their per-CPU and per-thread
    /// times, the events since the last one, and the ring records lost
    /// since (`now` becomes the CPUs' previous state).
    fn sample_of(
        &mut self,
        at_ns: u64,
        now: Vec<CpuState>,
        cpus: Vec<CpuTimes>,
        tasks: Vec<super::TaskTime>,
        discarded_ns: u64,
    ) -> CpuSample {
        let events_lost = now
            .iter()
            .zip(&self.prev)
            .map(|(n, p)| n.events_lost.saturating_sub(p.events_lost))
            .sum();
        self.prev = now;
        let kernel_log = match &mut self.kernel_log {
            Some((ring, log)) => {
                ring.flush();
                log.take()
            }
            None => Vec::new(),
        };
        CpuSample {
            at_ns,
            cpus,
            tasks,
            events: std::mem::take(&mut self.pending),
            events_lost,
            discarded_ns,
            kernel_log,
        }
    }
}

impl CpuSampler for EbpfTracker {
    fn begin(&mut self, at_read: &mut dyn FnMut()) -> Result<u64, TrackerError> {
        self.start_ns = if self.iter.is_some() {
            self.begin_iter(at_read)?
        } else {
            self.begin_switch(at_read)?
        };
        Ok(self.start_ns)
    }

    fn sample(&mut self, last: bool, at_read: &mut dyn FnMut()) -> Result<CpuSample, TrackerError> {
        // The final read: every thread, and windows closed for good.
        self.closing |= last;
        if self.iter.is_some() {
            return self.sample_iter(at_read);
        }
        at_read();
        // Threads charged from here on announce themselves for the next read.
        self.epoch += 1;
        write_epoch(&mut self.epoch_map, self.epoch)?;
        self.flush_cpus();
        let at_ns = monotonic_ns();
        let now = self.read_cpus()?;
        self.drain_events();
        let announce_overflow = now
            .iter()
            .zip(&self.prev)
            .any(|(n, p)| n.active_lost > p.active_lost);
        // Read only the threads that ran, unless that is most of them, the
        // announcements overflowed, or this is the first or final read.
        let full_scan = self.closing
            || self.samples == 0
            || announce_overflow
            || self.announced.len() * 4 > self.ledger.len();
        let entries = if full_scan {
            self.announced.clear();
            self.read_tasks()?
        } else {
            self.read_announced()?
        };
        self.announced = std::mem::take(&mut self.carried);
        self.samples += 1;
        let mut to_free = Vec::new();
        // tgid 0: created at fork, not run yet; nothing to count.
        for (tid, stats) in entries.iter().filter(|(_, s)| s.tgid != 0) {
            let free = self.ledger.observe(
                Observation {
                    tid: *tid,
                    created_ns: stats.created_ns,
                    tgid: stats.tgid,
                    cgroup_id: stats.cgroup_id,
                    comm: &stats.comm,
                    on_cpu_ns: &stats.on_cpu_ns,
                },
                Seen::Map {
                    dead: stats.flags & TASK_FLAG_DEAD != 0,
                },
            );
            if free {
                to_free.push((*tid, stats.created_ns));
            }
        }
        if !to_free.is_empty() {
            let mut view = BpfHashMap::<&mut MapData, u32, TaskStats>::try_from(&mut self.tasks)
                .map_err(map_err("TASKS"))?;
            for (tid, created) in to_free {
                // Free only the generation that was read: a reused tid's
                // fresh entry stays. (Already gone is fine: the kernel
                // retired it and reported it.)
                if view.get(&tid, 0).is_ok_and(|s| s.created_ns == created) {
                    let _ = view.remove(&tid);
                }
                self.ledger.freed(tid, created, at_ns);
            }
        }
        self.drain_events();
        let tasks = self.ledger.finish(full_scan);

        let mut discarded_ns = 0;
        self.idle_debt.resize(now.len(), 0);
        let cpus = now
            .iter()
            .zip(&self.prev)
            .zip(self.idle_debt.iter_mut())
            .enumerate()
            .map(|(cpu, ((n, p), debt))| {
                discarded_ns += n.discarded_ns.saturating_sub(p.discarded_ns);
                let window = |s: &CpuState| s.last_ns.saturating_sub(s.first_ns);
                let window_ns = window(n).saturating_sub(window(p));
                let busy_ns = n.busy_ns.saturating_sub(p.busy_ns);
                let lost_ns = n.lost_ns.saturating_sub(p.lost_ns);
                let idle_ns = super::idle_after_debt(window_ns, busy_ns + lost_ns, debt);
                CpuTimes {
                    cpu: cpu as u32,
                    package: n.socket,
                    busy_ns,
                    idle_ns,
                    idle_task_ns: n.idle_task_ns.saturating_sub(p.idle_task_ns),
                    lost_ns,
                    switches: n.switches.saturating_sub(p.switches),
                    window_ns,
                    carried_ns: 0,
                    over_ns: 0,
                }
            })
            .collect();
        Ok(self.sample_of(at_ns, now, cpus, tasks, discarded_ns))
    }
}

pub(super) fn map_fd(map: &Map) -> Option<std::os::fd::BorrowedFd<'_>> {
    match map {
        Map::HashMap(data) | Map::PerCpuArray(data) | Map::RingBuf(data) | Map::Array(data) => {
            Some(data.fd().as_fd())
        }
        _ => None,
    }
}
