//! Exact on-CPU time per thread, from the scheduler.
//!
//! `EbpfTracker` loads wattprof's eBPF object and turns its cumulative
//! counters into per-interval `CpuSample`s. Everything downstream consumes
//! samples through the `CpuSampler` trait, so it can be tested on
//! synthetic samples without root.

mod btf;
mod ebpf;
mod forks;
mod iter;
mod load;
pub(crate) mod stacks;
mod switch;
mod sys;
pub(crate) mod tracefs;

use profiler_common::{COMM_LEN, MAX_SOCKETS};

pub use btf::sum_exec_runtime_offset;
pub(crate) use ebpf::{
    EbpfTracker, ExitTracking, SkipEvent, TaskClock, TaskWalk, TaskWalkChoice, TrackerChoice,
    TrackerConfig,
};
pub use ebpf::{TrackerKind, kernel_memory_estimate, walk_ring_memory};

/// What went wrong loading or reading the tracker. Each message ends with
/// what the user can do about it.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TrackerError {
    /// Loading eBPF needs CAP_BPF and CAP_PERFMON (root has them): the
    /// message names the missing ones.
    #[error("{0}")]
    Privilege(String),
    /// tracefs is not mounted and could not be mounted.
    #[error("{0}")]
    Tracefs(String),
    /// A tracepoint format file is missing or unexpected.
    #[error("cannot use tracepoint {tracepoint}: {reason}")]
    Format {
        /// `category/name`.
        tracepoint: String,
        /// Why.
        reason: String,
    },
    /// The kernel refused the eBPF object.
    #[error(
        "the kernel refused wattprof's eBPF programs ({0}); wattprof needs Linux 5.8 \
         or later with CONFIG_BPF_SYSCALL and BPF ring buffers"
    )]
    Load(String),
    /// A program could not be attached.
    #[error("cannot attach {program}: {reason}")]
    Attach {
        /// Program name.
        program: String,
        /// Why.
        reason: String,
    },
    /// Reading or writing a map failed.
    #[error("eBPF map {map}: {reason}")]
    Map {
        /// Map name.
        map: &'static str,
        /// Why.
        reason: String,
    },
    /// The CPU topology could not be read.
    #[error(transparent)]
    Topology(#[from] crate::topology::TopologyError),
}

/// One CPU's time over an interval.
///
/// `busy_ns + idle_ns + lost_ns == window_ns`: `idle_ns` is the time the
/// scheduler charged to no task. `idle_task_ns` is the kernel's idle time:
/// with the switch tracker the wall time between context switches with the
/// idle task on CPU (interrupts taken while idle included), with the
/// iterator tracker `/proc/stat`'s idle + iowait over the window (in 10 ms
/// ticks; interrupts and waking from idle not included), or the time no
/// task ran for a CPU it does not list. The two differ by where the
/// scheduler draws slice boundaries (see `sched_gap_ns`) and by that.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CpuTimes {
    /// CPU id.
    pub(crate) cpu: u32,
    /// Dense package index (recorded as `package`; `socket` before schema
    /// 4, read as well: `model::wire::CpuTimesForm`).
    pub(crate) package: u32,
    /// Time tasks ran (recorded per task).
    pub(crate) busy_ns: u64,
    /// Time charged to no task: `window_ns - busy_ns - lost_ns`.
    pub(crate) idle_ns: u64,
    /// The kernel's idle time over the window (see above).
    pub(crate) idle_task_ns: u64,
    /// Time tasks ran that could not be recorded per task.
    pub(crate) lost_ns: u64,
    /// Context switches.
    pub(crate) switches: u64,
    /// Length of this CPU's accounting window over the interval.
    pub(crate) window_ns: u64,
    /// The part of `busy_ns` carried from earlier intervals (threads read
    /// a little after a boundary: their time past it was counted in the
    /// interval before). No task of this interval claims it, so energy is
    /// divided as if it were idle. Not in the recording.
    pub(crate) carried_ns: u64,
    /// Thread time read in this interval beyond its package's capacity
    /// (a read delayed on a loaded machine), on the package's first CPU:
    /// not in this interval's busy time, so its energy did not cover it;
    /// carried to the next intervals (`carried_ns`). Iterator tracker
    /// only. Not in the recording.
    pub(crate) over_ns: u64,
}

/// Nanoseconds per dense package index, for the machine's packages: a
/// fixed array that reads as a slice of its packages' entries, so a
/// task's or process's time per interval is no allocation.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) struct PackageNs {
    ns: [u64; MAX_SOCKETS],
    len: u8,
}

impl PackageNs {
    /// Zero on each of `packages` packages (at most `MAX_SOCKETS`).
    pub(crate) fn zeros(packages: usize) -> Self {
        // `topology` refuses machines with more packages.
        debug_assert!(packages <= MAX_SOCKETS, "{packages} packages");
        Self {
            ns: [0; MAX_SOCKETS],
            len: packages.min(MAX_SOCKETS) as u8,
        }
    }

    /// The first `MAX_SOCKETS` entries of `ns`.
    pub(crate) fn from_slice(ns: &[u64]) -> Self {
        let mut p = Self::zeros(ns.len());
        let n = p.len();
        p.copy_from_slice(&ns[..n]);
        p
    }
}

impl std::ops::Deref for PackageNs {
    type Target = [u64];
    fn deref(&self) -> &[u64] {
        &self.ns[..usize::from(self.len)]
    }
}

impl std::ops::DerefMut for PackageNs {
    fn deref_mut(&mut self) -> &mut [u64] {
        &mut self.ns[..usize::from(self.len)]
    }
}

impl std::fmt::Debug for PackageNs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.iter()).finish()
    }
}

impl PartialEq<Vec<u64>> for PackageNs {
    fn eq(&self, other: &Vec<u64>) -> bool {
        **self == **other
    }
}

/// `name` as the kernel keeps a task's name (cut to 15 bytes,
/// NUL-padded), for tests that make samples.
#[cfg(test)]
pub(crate) fn comm_bytes(name: &str) -> [u8; COMM_LEN] {
    let mut c = [0; COMM_LEN];
    let n = name.len().min(COMM_LEN - 1);
    c[..n].copy_from_slice(&name.as_bytes()[..n]);
    c
}

/// One thread's on-CPU time over an interval.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct TaskTime {
    /// Thread id.
    pub(crate) tid: u32,
    /// Process id.
    pub(crate) tgid: u32,
    /// cgroup v2 id at its last context switch.
    pub(crate) cgroup_id: u64,
    /// Task name, as the kernel keeps it (NUL-padded; [`comm_to_string`]
    /// makes it a name where one is needed).
    pub(crate) comm: [u8; COMM_LEN],
    /// Nanoseconds on CPU in this interval, per dense package index.
    pub(crate) on_cpu_ns: PackageNs,
    /// Monotonic time (ns) of its exit, if it exited.
    pub(crate) exit_ns: Option<u64>,
}

impl TaskTime {
    /// On-CPU nanoseconds over all packages.
    pub(crate) fn total_ns(&self) -> u64 {
        self.on_cpu_ns.iter().sum()
    }
}

/// A lifecycle event, in the order the kernel produced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum TaskEvent {
    /// `child` was created by a thread of `parent_tgid`. Whether it is a new
    /// process or a thread shows when it runs (its tgid).
    Fork {
        /// Monotonic time (ns).
        ts_ns: u64,
        /// The new task's id.
        child: u32,
        /// The thread that forked.
        parent_tid: u32,
        /// The process that forked.
        parent_tgid: u32,
        /// The name the child inherits.
        comm: String,
    },
    /// A thread of `tgid` executed a new program.
    Exec {
        /// Monotonic time (ns).
        ts_ns: u64,
        /// Thread id.
        tid: u32,
        /// Process id.
        tgid: u32,
        /// The new name.
        comm: String,
    },
}

/// Everything the tracker measured over one interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct CpuSample {
    /// Monotonic time (ns, `CLOCK_MONOTONIC`) the sample was taken.
    pub(crate) at_ns: u64,
    /// Per possible CPU.
    pub(crate) cpus: Vec<CpuTimes>,
    /// Threads that ran, or exited, in the interval.
    pub(crate) tasks: Vec<TaskTime>,
    /// Forks and execs, in order.
    pub(crate) events: Vec<TaskEvent>,
    /// Ring-buffer records that could not be written (lineage or names may
    /// be missing; time is never lost through this).
    pub(crate) events_lost: u64,
    /// On-CPU time of exited threads whose final record was overwritten.
    pub(crate) discarded_ns: u64,
    /// What the eBPF programs logged (aya-log) since the last sample.
    pub(crate) kernel_log: Vec<String>,
}

impl CpuSample {
    /// Sum of `busy_ns` over CPUs.
    pub(crate) fn busy_ns(&self) -> u64 {
        self.cpus.iter().map(|c| c.busy_ns).sum()
    }
}

/// A source of `CpuSample`s: the eBPF tracker, or a synthetic one in tests.
pub(crate) trait CpuSampler {
    /// Takes every thread's starting point: returns the monotonic time
    /// counting starts. `at_read` runs right before the read (the energy
    /// counters take theirs there), with nothing that can sleep between.
    fn begin(&mut self, at_read: &mut dyn FnMut()) -> Result<u64, TrackerError>;
    /// Closes the current interval and returns what happened in it;
    /// `last` closes the final one. `at_read` runs right before the read,
    /// as in [`CpuSampler::begin`].
    fn sample(&mut self, last: bool, at_read: &mut dyn FnMut()) -> Result<CpuSample, TrackerError>;
}

/// A source of samples whose in-between records come through a ring the
/// loop sleeps on (the eBPF tracker), or none (a synthetic sampler).
pub(crate) trait EventRing {
    /// The ring's file descriptor, readable when records wait.
    fn ring_fd(&self) -> Option<std::os::fd::RawFd>;
    /// Takes the records waiting in the ring.
    fn drain(&mut self);
}

/// A CPU's idle time over a window of `window_ns` in which `owed_ns` was
/// charged to tasks (or lost): what is left after `debt`, the charged time
/// earlier windows could not hold (a running thread's up-to-date figure,
/// read after its window began), which is paid first and carried on.
pub(crate) fn idle_after_debt(window_ns: u64, owed_ns: u64, debt: &mut u64) -> u64 {
    let owed = owed_ns + *debt;
    *debt = owed.saturating_sub(window_ns);
    window_ns.saturating_sub(owed)
}

/// `CLOCK_MONOTONIC` in nanoseconds: the clock `bpf_ktime_get_ns()` reads.
pub(crate) fn monotonic_ns() -> u64 {
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// A clock in nanoseconds (0 if the kernel has no such clock).
pub(crate) fn clock_ns(clock: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: valid pointer to a timespec.
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// A kernel `comm` as text, up to its NUL.
pub(crate) fn comm_to_string(comm: &[u8]) -> String {
    let end = comm.iter().position(|b| *b == 0).unwrap_or(comm.len());
    String::from_utf8_lossy(&comm[..end]).into_owned()
}

/// Whether `name` is what [`comm_to_string`] makes of `comm`, without
/// making it (this runs for every task every interval). A name the kernel
/// cut inside a character ends in an invalid sequence, which both read
/// as U+FFFD.
pub(crate) fn comm_is(name: &str, comm: &[u8]) -> bool {
    let end = comm.iter().position(|b| *b == 0).unwrap_or(comm.len());
    let mut rest = name;
    for chunk in comm[..end].utf8_chunks() {
        let Some(r) = rest.strip_prefix(chunk.valid()) else {
            return false;
        };
        rest = r;
        if !chunk.invalid().is_empty() {
            let Some(r) = rest.strip_prefix('\u{FFFD}') else {
                return false;
            };
            rest = r;
        }
    }
    rest.is_empty()
}

#[cfg(test)]
mod tests {
    use super::{comm_is, comm_to_string, kernel_memory_estimate};

    #[test]
    fn a_name_compares_as_its_string_would_cut_or_not() {
        // The kernel keeps 15 bytes: the `и` is cut in two.
        let mut raw = [0u8; 16];
        raw[..15].copy_from_slice(&"xЖурнал-ик".as_bytes()[..15]);
        let cut = "xЖурнал-";
        assert_eq!(comm_to_string(&raw), format!("{cut}\u{FFFD}"));
        for comm in [
            &raw[..],
            b"bash\0\0\0\0\0\0\0\0\0\0\0\0",
            b"sixteen-bytes-xx",
            b"\0",
        ] {
            let name = comm_to_string(comm);
            assert!(comm_is(&name, comm), "{name:?}");
            assert!(!comm_is(&format!("{name}x"), comm));
            let mut shorter = name.chars();
            shorter.next_back();
            assert!(name.is_empty() || !comm_is(shorter.as_str(), comm));
        }
        assert!(!comm_is(cut, &raw), "a cut name is not its valid prefix");
    }

    #[test]
    fn kernel_memory_on_a_256_cpu_machine_with_32768_threads_is_under_64_mib() {
        // The default map holds 65,536 threads: 32,768 live ones with room
        // for as many again.
        let max = u64::from(profiler_common::DEFAULT_MAX_TASKS);
        let bytes = kernel_memory_estimate(super::TrackerKind::Switch, 256, max);
        assert!(bytes < 64 << 20, "{bytes}");
        assert!(bytes > 16 << 20, "{bytes}: the formula lost a term");
        let iter = kernel_memory_estimate(super::TrackerKind::Iter, 256, max);
        // 64 instead of 184 bytes a thread (7.5 MiB at 65,536), and no
        // 1 MiB announcement ring.
        assert!(iter + (8 << 20) < bytes, "{iter} vs {bytes}");
    }
}
