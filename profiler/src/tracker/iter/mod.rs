//! Reading the iterator tracker: a task iterator run at each read, and the
//! rare events of the ring (see `profiler-ebpf/src/iter.rs`).

use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use aya::maps::{Array, HashMap as BpfHashMap, Map, MapData, RingBuf};
use profiler_common::iter::{
    EVENT_THREAD_CGROUP, EVENT_THREAD_EXIT, EVENT_THREAD_FREE, EVENT_THREAD_MIGRATE,
    ITER_FLAG_MORE, ITER_FLAG_TRAILER, IterRecord, ThreadEvent,
};

mod runtime;
mod thread;

use runtime::{Kind, Reading, RuntimeLedger};

use super::load::map_err;
use super::{CpuTimes, TaskTime, TrackerError, monotonic_ns, sys};
use crate::topology::Topology;

/// How often a read shows every thread (not only those that ran), so
/// threads whose exit and free records were both lost are noticed.
const FULL_READ_EVERY_NS: u64 = 60_000_000_000;

/// Reads in a row whose walk fills `ITER_RING` before the walk gives way
/// to `iter/task` for the rest of the run: each such read pays for the
/// walk and for `iter/task` too (more threads run between reads than the
/// ring holds, or the filter map is full and resends its overflow).
const RING_FULL_GIVE_UP: u32 = 8;

/// The open-coded walk (see `profiler-ebpf/src/iter.rs`): its link, and
/// the ring its records come in.
pub(crate) struct Walk {
    pub(crate) link: OwnedFd,
    pub(crate) ring: RingBuf<MapData>,
}

/// The iterator tracker's state between reads.
pub(super) struct IterState {
    link: OwnedFd,
    /// The open-coded walk, for reads that skip idle threads; `None` where
    /// it did not load (every read then runs `iter/task`).
    walk: Option<Walk>,
    last: Map,
    control: Map,
    /// `CPU_PACKAGE` and `ITER_READ`, kept for their memory figure.
    package: Map,
    read_state: Map,
    ledger: RuntimeLedger,
    buf: Vec<u8>,
    records: Vec<IterRecord>,
    prev_at_ns: u64,
    last_full_ns: u64,
    full_now: bool,
    /// Busy time beyond a package's capacity, carried (per CPU: on each
    /// package's first).
    busy_carry: Vec<u64>,
    /// Per CPU: the kernel's own idle time so far (`/proc/stat`), ns, at
    /// the last window boundary; `None` where it could not be read.
    kernel_idle_ns: Vec<Option<u64>>,
    /// The same, read at the last read's boundary (right after the energy
    /// read), for the window it closes.
    kernel_idle_at_walk: Option<Vec<Option<u64>>>,
    /// When the last read's walk began (right after the energy read).
    walk_at_ns: u64,
    pub(super) filter_overflow: u64,
    pub(super) read_syscalls: u64,
    /// Reads whose open-coded walk filled `ITER_RING`, finished by
    /// `iter/task`.
    pub(super) walk_ring_full: u64,
    /// Of those, how many in a row up to the last read.
    ring_full_in_a_row: u32,
    /// Why the walk was given up during the run.
    pub(super) walk_given_up: Option<String>,
}

impl IterState {
    /// Takes over the attached iterator and its maps. The first read
    /// (`baseline`) sets every thread's starting point.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn new(
        link: OwnedFd,
        walk: Option<Walk>,
        last: Map,
        control: Map,
        package: Map,
        read_state: Map,
        topology: &Topology,
        start_ns: u64,
    ) -> Self {
        let cpus = topology.package_of_cpu.len();
        Self {
            link,
            walk,
            last,
            control,
            package,
            read_state,
            ledger: RuntimeLedger::new(topology.package_of_cpu.clone(), start_ns),
            buf: Vec::new(),
            records: Vec::new(),
            prev_at_ns: start_ns,
            last_full_ns: 0,
            full_now: false,
            busy_carry: vec![0; cpus],
            walk_at_ns: start_ns,
            // Read when the first window starts (`start_window`).
            kernel_idle_ns: vec![None; cpus],
            kernel_idle_at_walk: None,
            filter_overflow: 0,
            read_syscalls: 0,
            walk_ring_full: 0,
            ring_full_in_a_row: 0,
            walk_given_up: None,
        }
    }

    /// Threads born from `start_ns` on count from zero.
    pub(super) fn set_baseline(&mut self, start_ns: u64) {
        self.ledger.set_baseline(start_ns);
    }

    /// Starts the first interval's window at `at_ns` (after the baseline
    /// read).
    pub(super) fn start_window(&mut self, at_ns: u64) {
        self.prev_at_ns = at_ns;
        // The kernel's own idle time counts from here too: as read at the
        // baseline read's boundary.
        let n = self.kernel_idle_ns.len();
        self.kernel_idle_ns = self
            .kernel_idle_at_walk
            .take()
            .unwrap_or_else(|| read_kernel_idle(n));
    }

    /// When the last read's walk began: the interval boundary.
    pub(super) fn walk_at(&self) -> u64 {
        self.walk_at_ns
    }

    /// The iterator's maps, for their memory.
    pub(super) fn maps(&self) -> [&Map; 4] {
        [&self.last, &self.control, &self.package, &self.read_state]
    }

    /// The open-coded walk's ring, for its memory.
    pub(super) fn walk_ring(&self) -> Option<BorrowedFd<'_>> {
        self.walk.as_ref().map(|w| w.ring.as_fd())
    }

    /// Whether reads that skip idle threads use the open-coded walk (to
    /// the end of the run).
    pub(super) fn open_coded(&self) -> bool {
        self.walk.is_some()
    }

    /// The ledger, for questions about exits.
    pub(super) fn ledger(&self) -> &RuntimeLedger {
        &self.ledger
    }

    /// Runs the iterator once: the records of threads that ran since the
    /// last read (every thread on a full read: the first, the last, and one
    /// a minute), and of threads on a CPU, whose counter is as old as their
    /// last tick: for those the kernel side adds the time since the
    /// counter's last update. Returns the monotonic time the read began.
    pub(super) fn read(
        &mut self,
        first_or_last: bool,
        at_read: &mut dyn FnMut(),
    ) -> Result<u64, TrackerError> {
        let started = monotonic_ns();
        let full = first_or_last || started.saturating_sub(self.last_full_ns) >= FULL_READ_EVERY_NS;
        if full != self.full_now {
            let mut view = Array::<&mut MapData, u64>::try_from(&mut self.control)
                .map_err(map_err("ITER_CONTROL"))?;
            view.set(0, u64::from(full), 0)
                .map_err(map_err("ITER_CONTROL"))?;
            self.full_now = full;
        }
        // Sleep a moment, so this thread is switched in just before the
        // iterator starts: its switch-in time calibrates the scheduler
        // clock against the monotonic one for running threads' estimates.
        std::thread::sleep(std::time::Duration::from_micros(100));
        // After the sleep, whose wake-up can wait milliseconds for a CPU
        // when every CPU is busy: the energy counters are read here, a few
        // microseconds before the walk.
        at_read();
        // The interval's boundary: right after the counters, right before
        // the walk, so every thread's reading is at or after it (a running
        // thread's time past it is carried, see `cpu_times`).
        self.walk_at_ns = monotonic_ns();
        // The kernel's idle time at the same boundary (its clock ticks are
        // 10 ms; read here, not after the walk, whose length varies).
        self.kernel_idle_at_walk = Some(read_kernel_idle(self.kernel_idle_ns.len()));
        self.records.clear();
        let mut trailer = None;
        if let Some(walk) = self.walk.as_mut().filter(|_| !full) {
            let walked = run_iterator(
                "the open-coded walk",
                walk.link.as_fd(),
                &mut self.buf,
                &mut self.records,
                &mut self.read_syscalls,
            )?;
            while let Some(item) = walk.ring.next() {
                if item.len() >= std::mem::size_of::<IterRecord>() {
                    // SAFETY: an `IterRecord` written by our program;
                    // read_unaligned copes with the ring's 8-byte alignment.
                    self.records
                        .push(unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) });
                }
            }
            self.filter_overflow = self.filter_overflow.max(walked.cgroup_id);
            if walked.flags & ITER_FLAG_MORE == 0 {
                self.ring_full_in_a_row = 0;
                trailer = Some(walked);
            } else {
                // The ring filled before the walk was over: `iter/task`
                // finishes the read. The filter holds what went out, so it
                // sends the rest (and running threads again, whose later
                // reading is the one kept). Its calibration wants this
                // thread just switched in, as before the walk (on a busy
                // machine that wake-up can take milliseconds: those
                // readings are later, their time past the boundary carried
                // as for any running thread).
                self.walk_ring_full += 1;
                self.ring_full_in_a_row += 1;
                std::thread::sleep(std::time::Duration::from_micros(100));
            }
        }
        if self.ring_full_in_a_row >= RING_FULL_GIVE_UP && self.walk.is_some() {
            self.walk = None;
            self.walk_given_up = Some(format!(
                "the open-coded walk filled its ring at {RING_FULL_GIVE_UP} reads in a row: \
                 iter/task reads the rest"
            ));
        }
        let trailer = match trailer {
            Some(t) => t,
            None => run_iterator(
                "iter/task",
                self.link.as_fd(),
                &mut self.buf,
                &mut self.records,
                &mut self.read_syscalls,
            )?,
        };
        self.filter_overflow = self.filter_overflow.max(trailer.cgroup_id);
        if full {
            self.last_full_ns = started;
        }
        Ok(started)
    }

    /// Takes a thread event from the ring.
    pub(super) fn event(&mut self, ev: &ThreadEvent) {
        let kind = match ev.kind {
            EVENT_THREAD_EXIT => Kind::Exit { ts_ns: ev.ts_ns },
            EVENT_THREAD_FREE => Kind::Free { ts_ns: ev.ts_ns },
            EVENT_THREAD_MIGRATE => Kind::Migrate,
            EVENT_THREAD_CGROUP => Kind::CgroupMove,
            _ => return,
        };
        let cgroup_id = (ev.cgroup_id != 0).then_some(ev.cgroup_id);
        self.ledger.observe(
            Reading {
                task_ptr: ev.task_ptr,
                start_ns: ev.start_ns,
                tid: ev.tid,
                tgid: ev.tgid,
                cgroup_id,
                comm: Some(&ev.comm),
                sum_exec_ns: ev.sum_exec_ns,
                cpu: ev.cpu,
            },
            kind,
            ev.ts_ns,
        );
    }

    /// Applies the last read at `at_ns`: call it after the ring was
    /// drained, so checkpoints and exits before the read are in.
    pub(super) fn apply(&mut self, read_started: u64, at_ns: u64) {
        for rec in &self.records {
            self.ledger.observe(
                Reading {
                    task_ptr: rec.task_ptr,
                    start_ns: rec.start_ns,
                    tid: rec.tid,
                    tgid: rec.tgid,
                    cgroup_id: Some(rec.cgroup_id),
                    comm: Some(&rec.comm),
                    sum_exec_ns: rec.sum_exec_ns,
                    cpu: rec.cpu,
                },
                Kind::Read,
                at_ns,
            );
        }
        if self.full_now {
            self.ledger.full_read_done(read_started);
        }
    }

    /// Closes the interval at `at_ns`: each thread's time since the last
    /// close, and each CPU's.
    pub(super) fn close(
        &mut self,
        at_ns: u64,
        topology: &Topology,
        closing: bool,
    ) -> Result<(Vec<TaskTime>, Vec<CpuTimes>), TrackerError> {
        let tasks = self.ledger.finish(at_ns, closing);
        let forgotten = self.ledger.take_forgotten();
        // Gone already is fine (the free removed it); a failure leaves an
        // entry that only costs filter room.
        if !forgotten.is_empty()
            && let Ok(mut view) = BpfHashMap::<&mut MapData, u64, u64>::try_from(&mut self.last)
        {
            for ptr in forgotten {
                let _ = view.remove(&ptr);
            }
        }
        let busy = self.ledger.take_cpu_busy();
        let window_ns = at_ns.saturating_sub(self.prev_at_ns);
        self.prev_at_ns = at_ns;
        let idle_now = self
            .kernel_idle_at_walk
            .take()
            .unwrap_or_else(|| read_kernel_idle(busy.len()));
        let cpus = cpu_times(
            &busy,
            window_ns,
            topology,
            &mut self.busy_carry,
            closing,
            &idle_now,
            &self.kernel_idle_ns,
        );
        self.kernel_idle_ns = idle_now;
        Ok((tasks, cpus))
    }
}

/// Runs an iterator (`BPF_ITER_CREATE` on its link, read to the end):
/// its records are added to `records`, and its trailer returned.
fn run_iterator(
    what: &'static str,
    link: BorrowedFd<'_>,
    buf: &mut Vec<u8>,
    records: &mut Vec<IterRecord>,
    syscalls: &mut u64,
) -> Result<IterRecord, TrackerError> {
    let mut file = sys::iter_create(link).map_err(|e| TrackerError::Map {
        map: what,
        reason: format!("cannot start a read: {e}"),
    })?;
    buf.clear();
    let mut chunk = [0u8; 64 * 1024];
    loop {
        *syscalls += 1;
        match file.read(&mut chunk) {
            Ok(0) => break,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => {
                return Err(TrackerError::Map {
                    map: what,
                    reason: format!("read failed: {e}"),
                });
            }
        }
    }
    let size = std::mem::size_of::<IterRecord>();
    let mut trailer = None;
    for raw in buf.chunks_exact(size) {
        // SAFETY: `IterRecord` is plain integers; read_unaligned copes
        // with the Vec's alignment.
        let rec: IterRecord = unsafe { std::ptr::read_unaligned(raw.as_ptr().cast()) };
        if rec.flags & ITER_FLAG_TRAILER != 0 {
            trailer = Some(rec);
        } else {
            records.push(rec);
        }
    }
    trailer.ok_or_else(|| TrackerError::Map {
        map: what,
        reason: "a read ended without its trailer".into(),
    })
}

/// Per-CPU times of an interval from the task time handed out per CPU.
///
/// A thread's delta goes to the CPU it was read on, though it may have run
/// on several CPUs of its package since the last read: busy time above a
/// CPU's window is moved to CPUs of the same package with room. Busy time
/// beyond the whole package's capacity (a running thread read a little
/// after the interval's close, on a machine busy enough to delay the read)
/// is carried to the package's next intervals, into the first CPU with
/// room (`carry`, per CPU, kept on each package's first CPU). So every
/// CPU's busy + idle is its window in every interval. Each window begins
/// where a read's walk does and the last ends after the last read, so
/// every stretch of intervals up to the last spans the thread time it is
/// given and nothing is left to carry at the end; whatever is (`last`)
/// goes to the first CPU, so the package's busy is its threads' time.
fn cpu_times(
    busy: &[u64],
    window_ns: u64,
    topology: &Topology,
    carry: &mut [u64],
    last: bool,
    kernel_idle_now: &[Option<u64>],
    kernel_idle_prev: &[Option<u64>],
) -> Vec<CpuTimes> {
    let online = |cpu: usize| topology.online.contains(&(cpu as u32));
    let mut busy = busy.to_vec();
    let mut carried_in = vec![0u64; busy.len()];
    let mut over = vec![0u64; busy.len()];
    let packages = topology.packages().max(1);
    for package in 0..packages as u32 {
        let members: Vec<usize> = (0..busy.len())
            .filter(|c| topology.package_of_cpu.get(*c) == Some(&package) && online(*c))
            .collect();
        let Some(&first) = members.first() else {
            continue;
        };
        // This interval's time above a CPU's window first, then what
        // earlier intervals carried, into the package's room.
        let mut spill: u64 = members
            .iter()
            .map(|c| {
                let over = busy[*c].saturating_sub(window_ns);
                busy[*c] -= over;
                over
            })
            .sum::<u64>();
        let mut carried = std::mem::take(&mut carry[first]);
        for c in &members {
            let take = (window_ns - busy[*c]).min(spill);
            busy[*c] += take;
            spill -= take;
            let take = (window_ns - busy[*c]).min(carried);
            busy[*c] += take;
            carried -= take;
            carried_in[*c] = take;
        }
        over[first] = spill;
        if last {
            busy[first] += spill + carried;
        } else {
            carry[first] = spill + carried;
        }
    }
    busy.iter()
        .enumerate()
        .map(|(cpu, busy_ns)| {
            let window = if online(cpu) { window_ns } else { 0 };
            CpuTimes {
                cpu: cpu as u32,
                package: topology.package_of_cpu.get(cpu).copied().unwrap_or(0),
                busy_ns: *busy_ns,
                idle_ns: window.saturating_sub(*busy_ns),
                // The kernel's count where both ends were read; else (a
                // CPU /proc/stat did not list, as one gone offline) the
                // time no task ran.
                idle_task_ns: match (
                    kernel_idle_now.get(cpu).copied().flatten(),
                    kernel_idle_prev.get(cpu).copied().flatten(),
                ) {
                    (Some(n), Some(p)) => n.saturating_sub(p),
                    _ => window.saturating_sub(*busy_ns),
                },
                lost_ns: 0,
                switches: 0,
                window_ns: window,
                carried_ns: carried_in[cpu],
                over_ns: over[cpu],
            }
        })
        .collect()
}

/// Each CPU's idle + iowait time so far by the kernel's own count
/// (`/proc/stat`, in clock ticks), in ns; `None` for CPUs it does not list
/// (offline), and for all when it cannot be read.
fn read_kernel_idle(cpus: usize) -> Vec<Option<u64>> {
    let mut out = vec![None; cpus];
    let Ok(text) = std::fs::read_to_string("/proc/stat") else {
        return out;
    };
    parse_proc_stat_idle(&text, &mut out, clock_tick_ns());
    out
}

fn clock_tick_ns() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    1_000_000_000 / u64::try_from(hz).ok().filter(|h| *h > 0).unwrap_or(100)
}

fn parse_proc_stat_idle(text: &str, out: &mut [Option<u64>], tick_ns: u64) {
    for line in text.lines() {
        let mut words = line.split_whitespace();
        let Some(cpu) = words
            .next()
            .and_then(|w| w.strip_prefix("cpu"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        let fields: Vec<u64> = words.filter_map(|w| w.parse().ok()).collect();
        // user nice system idle iowait ...
        if let (Some(idle), Some(slot)) = (fields.get(3), out.get_mut(cpu)) {
            *slot = Some((idle + fields.get(4).copied().unwrap_or(0)) * tick_ns);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn two_packages() -> Topology {
        Topology {
            package_of_cpu: vec![0, 0, 1, 1],
            package_ids: vec![0, 1],
            online: vec![0, 1, 2, 3],
        }
    }

    #[test]
    fn busy_above_a_cpus_window_moves_to_a_cpu_of_its_package() {
        let mut carry = vec![0; 4];
        let cpus = cpu_times(
            &[150, 10, 0, 0],
            100,
            &two_packages(),
            &mut carry,
            false,
            &[],
            &[],
        );
        let busy: Vec<u64> = cpus.iter().map(|c| c.busy_ns).collect();
        assert_eq!(busy, vec![100, 60, 0, 0]);
        for c in &cpus {
            assert_eq!(c.busy_ns + c.idle_ns, c.window_ns);
        }
        assert_eq!(carry, vec![0; 4]);
    }

    #[test]
    fn busy_beyond_the_package_is_carried_to_its_next_intervals() {
        let mut carry = vec![0; 4];
        let topo = two_packages();
        let cpus = cpu_times(&[150, 90, 0, 0], 100, &topo, &mut carry, false, &[], &[]);
        let busy: Vec<u64> = cpus.iter().map(|c| c.busy_ns).collect();
        assert_eq!(busy, vec![100, 100, 0, 0]);
        assert_eq!(carry, vec![40, 0, 0, 0]);
        // Recorded on the package's first CPU: the time its interval's
        // energy did not cover.
        let over: Vec<u64> = cpus.iter().map(|c| c.over_ns).collect();
        assert_eq!(over, vec![40, 0, 0, 0]);
        // Every CPU closes in every interval, and the package's busy over
        // the two is its threads' 240.
        let later = cpu_times(&[0, 30, 0, 0], 100, &topo, &mut carry, false, &[], &[]);
        let busy: Vec<u64> = later.iter().map(|c| c.busy_ns).collect();
        assert_eq!(busy, vec![40, 30, 0, 0]);
        // The 40 carried in: busy time no thread of this interval claims.
        assert_eq!(later[0].carried_ns, 40);
        assert!(later.iter().all(|c| c.over_ns == 0), "{later:?}");
        for c in cpus.iter().chain(&later) {
            assert_eq!(c.busy_ns + c.idle_ns, c.window_ns, "{c:?}");
        }
        assert_eq!(carry, vec![0; 4]);
        // A package busy throughout keeps carrying, and still closes.
        let mut carry = vec![0; 4];
        for _ in 0..3 {
            for c in cpu_times(&[110, 100, 0, 0], 100, &topo, &mut carry, false, &[], &[]) {
                assert_eq!(c.busy_ns + c.idle_ns, c.window_ns);
            }
        }
        assert_eq!(carry[0], 30);
        // The last interval gives what is left to the first CPU.
        let cpus = cpu_times(&[100, 100, 0, 0], 100, &topo, &mut carry, true, &[], &[]);
        assert_eq!(cpus[0].busy_ns, 130);
        assert_eq!(carry[0], 0);
    }

    #[test]
    fn proc_stat_idle_and_iowait_per_cpu() {
        let text = "cpu  10 0 5 900 4 0 0 0 0 0\ncpu0 5 0 2 450 2 0 0 0 0 0\n\
                    cpu1 5 0 3 450 2 0 0 0 0 0\nintr 1 2 3\n";
        let mut out = vec![None; 3];
        parse_proc_stat_idle(text, &mut out, 10_000_000);
        assert_eq!(out, vec![Some(4_520_000_000), Some(4_520_000_000), None]);
    }

    #[test]
    fn a_cpu_the_kernel_did_not_list_has_the_time_no_task_ran_as_idle() {
        // CPU 1 unlisted at the start (offline then, say): its idle is the
        // window less its busy time, not the window (which read as 0% busy
        // for the static learner) nor 0 (100% busy).
        let mut carry = vec![0; 4];
        let now = [Some(1_000), Some(2_000), None, None];
        let prev = [Some(960), None, None, None];
        let cpus = cpu_times(
            &[30, 70, 0, 0],
            100,
            &two_packages(),
            &mut carry,
            false,
            &now,
            &prev,
        );
        let idle: Vec<u64> = cpus.iter().map(|c| c.idle_task_ns).collect();
        assert_eq!(&idle[..2], &[40, 30]);
    }
}
