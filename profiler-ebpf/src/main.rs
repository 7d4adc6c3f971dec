//! wattprof's kernel side: exact on-CPU nanoseconds per thread, per package.
//!
//! Two trackers share this object. The iterator tracker (`iter`, the
//! default) reads the scheduler's counters at each read and at rare events;
//! the switch tracker below (`--tracker switch`, the fallback without BTF)
//! charges every context switch.
//!
//! At every context switch the task leaving the CPU (`current`) is charged
//! for the slice it ran: the growth of its own `se.sum_exec_runtime` (the
//! scheduler's counter, read at an offset userspace finds in the running
//! kernel's BTF), or, without BTF, the time since the CPU's previous switch.
//! Time that cannot be recorded (`TASKS` full) goes to the CPU's `lost_ns`.
//! Userspace closes slices still in progress before each read with a flush
//! program run on every CPU through `BPF_PROG_TEST_RUN`; a flush charges
//! wall time provisionally, and the task's next switch settles the
//! difference with the scheduler's figure.
//!
//! Bounds: `TASKS` holds `DEFAULT_MAX_TASKS` threads (userspace may change it
//! at load time); `EVENTS` is `DEFAULT_RING_BYTES`; `CPUS` has one entry per
//! possible CPU. What does not fit is counted in `CpuState`, and said once
//! through aya-log (`AYA_LOGS`): the first loss of each kind on a CPU, and
//! ring overflows at each power of two, so a full map cannot flood the log.
//! The log statements sit on the failure paths only; the ring's reserve
//! is never reached on a switch that records its slice.
#![no_std]
#![no_main]

mod iter;

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_current_task, bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{map, raw_tracepoint, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::{RawTracePointContext, TracePointContext},
};
use aya_log_ebpf::warn;
use profiler_common::{
    ACTIVE_RING_BYTES, COMM_LEN, CPU_FLAG_CLOSED, CPU_FLAG_SWITCH_OPENS, CpuState,
    DEFAULT_MAX_TASKS, DEFAULT_RING_BYTES, EVENT_EXEC, EVENT_EXIT, EVENT_FORK, EVENT_REAPED,
    MAX_SOCKETS, TASK_DEAD, TASK_FLAG_BASELINE, TASK_FLAG_DEAD, TaskEvent, TaskStats,
};

/// Per-CPU accounting state (one entry).
#[map]
static CPUS: PerCpuArray<CpuState> = PerCpuArray::with_max_entries(1, 0);

/// Cumulative on-CPU time per thread id.
#[map]
static TASKS: HashMap<u32, TaskStats> = HashMap::with_max_entries(DEFAULT_MAX_TASKS, 0);

/// Fork, exec and exit records for userspace.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(DEFAULT_RING_BYTES, 0);

/// The current read epoch (one entry), bumped by userspace at each read.
#[map]
static EPOCH: Array<u64> = Array::with_max_entries(1, 0);

/// Thread ids charged in the current epoch, each once, so userspace reads
/// those entries instead of every thread on the machine.
#[map]
static ACTIVE: RingBuf = RingBuf::with_byte_size(ACTIVE_RING_BYTES, 0);

/// Offset of `child_pid` in the `sched:sched_process_fork` record. It moved
/// when the comm fields became `__data_loc` strings, so userspace reads it
/// from the tracefs `format` file and sets it at load time.
#[unsafe(no_mangle)]
static FORK_CHILD_PID_OFFSET: u32 = 20;

/// Non-zero when the iterator tracker runs (no `TASKS` entries to keep).
#[unsafe(no_mangle)]
static ITER_MODE: u32 = 0;

/// `offsetof(struct task_struct, se.sum_exec_runtime)` in the running kernel,
/// from its BTF; 0 when unknown (time context switches instead).
#[unsafe(no_mangle)]
static SUM_EXEC_OFFSET: u32 = 0;

/// The scheduler's run-time counter of the task at `task`, where it can be
/// read.
#[inline(always)]
fn sum_exec(task: u64) -> Option<u64> {
    // SAFETY: reading a global that userspace sets before load.
    let offset = unsafe { core::ptr::read_volatile(&SUM_EXEC_OFFSET) } as u64;
    if offset == 0 {
        return None;
    }
    // SAFETY: probe_read_kernel checks the address; the offset comes from
    // this kernel's own BTF.
    unsafe { bpf_probe_read_kernel((task + offset) as *const u64) }.ok()
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Charge {
    /// A context switch; the leaving task continues to exist.
    Switch,
    /// The final context switch of a task that has exited.
    SwitchDead,
    /// No switch: userspace closes the slice in progress.
    Flush,
}

/// sched_switch, Linux 5.18 and later: `prev_state` (argument 3) tells the
/// final switch of an exiting task, so its totals go out exactly once and its
/// entry is freed in the kernel.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn wattprof_sched_switch(ctx: RawTracePointContext) -> i32 {
    let prev_state: u64 = ctx.arg(3);
    let kind = if prev_state & TASK_DEAD != 0 {
        Charge::SwitchDead
    } else {
        Charge::Switch
    };
    charge(&ctx, kind);
    0
}

/// sched_switch before Linux 5.18 (no `prev_state` argument): exits are
/// flagged by `wattprof_sched_process_exit`, and userspace frees the entry.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn wattprof_sched_switch_legacy(ctx: RawTracePointContext) -> i32 {
    charge(&ctx, Charge::Switch);
    0
}

/// Never attached: run on one CPU by userspace (`BPF_F_TEST_RUN_ON_CPU`) in
/// interrupt context there, where `current` is the task that CPU is running.
/// A non-zero argument 0 closes the CPU's window after charging.
#[raw_tracepoint(tracepoint = "wattprof_flush")]
pub fn wattprof_flush(ctx: RawTracePointContext) -> i32 {
    charge(&ctx, Charge::Flush);
    let close: u64 = ctx.arg(0);
    if close != 0
        && let Some(cpu) = CPUS.get_ptr_mut(0)
    {
        // SAFETY: see `charge`.
        unsafe { (*cpu).flags |= CPU_FLAG_CLOSED };
    }
    0
}

#[inline(always)]
fn charge<C: EbpfContext>(ctx: &C, kind: Charge) {
    let Some(cpu) = CPUS.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a per-CPU slot, touched only by programs running on this CPU,
    // which cannot interleave (sched_switch runs with interrupts off).
    let cpu = unsafe { &mut *cpu };
    if cpu.flags & CPU_FLAG_CLOSED != 0 {
        return;
    }
    // SAFETY: helper without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if kind != Charge::Flush {
        cpu.switches += 1;
    }
    if cpu.last_ns == 0 {
        // Userspace's opening flush starts the window, so no task time is
        // recorded before it (switches may open it where flushes are not
        // available).
        if kind == Charge::Flush || cpu.flags & CPU_FLAG_SWITCH_OPENS != 0 {
            cpu.first_ns = now;
            cpu.last_ns = now;
        }
        return;
    }
    let wall = now.wrapping_sub(cpu.last_ns);
    cpu.last_ns = now;

    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if tid == 0 {
        cpu.idle_task_ns += wall;
        return;
    }
    let socket = (cpu.socket as usize) & (MAX_SOCKETS - 1);
    // SAFETY: helper without preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    // SAFETY: helper without preconditions.
    let task_ptr = unsafe { bpf_get_current_task() };
    let mut found = TASKS.get_ptr_mut(tid);
    if let Some(entry) = found {
        // SAFETY: a task is `current` on one CPU at a time, so only this
        // program updates its entry now; userspace only reads it.
        let entry = unsafe { &mut *entry };
        if entry.task_ptr == 0 {
            entry.task_ptr = task_ptr;
        } else if entry.task_ptr != task_ptr {
            // The tid now belongs to another task: retire the old entry
            // with its totals, then start this task's own.
            retire(ctx, tid, entry, now, cpu);
            found = None;
        }
    }
    let task = match found {
        // SAFETY: as above.
        Some(task) => unsafe { &mut *task },
        None => {
            let comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
            let fresh = TaskStats::new(now, cgroup_id, task_ptr, 0, comm);
            if TASKS.insert(tid, fresh, BPF_NOEXIST.into()).is_err() {
                if cpu.lost_ns == 0 {
                    warn!(
                        ctx,
                        "TASKS is full: thread {} is not tracked, so its time is counted as lost on this CPU (raise --max-tasks)",
                        tid
                    );
                }
                cpu.lost_ns += wall;
                return;
            }
            match TASKS.get_ptr_mut(tid) {
                // SAFETY: as above.
                Some(task) => unsafe { &mut *task },
                None => {
                    cpu.lost_ns += wall;
                    return;
                }
            }
        }
    };
    task.tgid = (pid_tgid >> 32) as u32;
    task.cgroup_id = cgroup_id;
    let delta = delta_of(task, task_ptr, kind, wall);
    task.on_cpu_ns[socket] += delta;
    cpu.busy_ns += delta;

    // Announce the thread once per epoch; if the ring is full, try again at
    // its next charge and let userspace know to read everything.
    if let Some(epoch) = EPOCH.get(0)
        && task.epoch != *epoch
    {
        if ACTIVE
            .output::<[u64; 2]>(&[u64::from(tid), *epoch], 0)
            .is_ok()
        {
            task.epoch = *epoch;
        } else {
            cpu.active_lost += 1;
        }
    }

    if kind != Charge::Switch {
        // Names change without exec too (prctl, pthread_setname_np): take
        // the current one at flushes and at exit, off the hot path.
        task.comm = bpf_get_current_comm().unwrap_or(task.comm);
    }
    if kind == Charge::SwitchDead {
        task.flags |= TASK_FLAG_DEAD;
        if emit_totals(ctx, EVENT_EXIT, tid, task, now, cpu) {
            let _ = TASKS.remove(tid);
        }
        // Otherwise the flagged entry stays for userspace to read and free.
    }
}

/// The task's new on-CPU time for this charge: the scheduler's own
/// counter where it has a baseline for the task, else the `wall` time of
/// the slice just ended (provisional at a flush, settled at the next
/// switch).
#[inline(always)]
fn delta_of(task: &mut TaskStats, task_ptr: u64, kind: Charge, wall: u64) -> u64 {
    match sum_exec(task_ptr) {
        // A counter below the baseline cannot be this task's: time it.
        Some(sum) if task.flags & TASK_FLAG_BASELINE != 0 && sum >= task.sum_exec_seen => {
            if kind == Charge::Flush {
                task.provisional_ns += wall;
                wall
            } else {
                let exact = sum - task.sum_exec_seen;
                let settled = exact.saturating_sub(task.provisional_ns);
                task.sum_exec_seen = sum;
                task.provisional_ns = 0;
                settled
            }
        }
        Some(sum) => {
            // First sight of a task older than tracking: this slice is
            // timed. At a switch the counter is current, so later slices
            // are the scheduler's; at a flush it is stale by up to a tick,
            // so the baseline waits for the next switch (timed from here).
            task.provisional_ns = 0;
            if kind == Charge::Flush {
                task.flags &= !TASK_FLAG_BASELINE;
            } else {
                task.sum_exec_seen = sum;
                task.flags |= TASK_FLAG_BASELINE;
            }
            wall
        }
        None => wall,
    }
}

/// Reports an entry whose task is gone (or whose tid moved to another
/// task) with its totals, and frees it. If the ring is full its time is
/// counted as discarded, never dropped silently.
#[inline(always)]
fn retire<C: EbpfContext>(ctx: &C, tid: u32, stale: &TaskStats, now: u64, cpu: &mut CpuState) {
    let stale = *stale;
    if !emit_totals(ctx, EVENT_REAPED, tid, &stale, now, cpu) {
        if cpu.discarded_ns == 0 {
            warn!(
                ctx,
                "thread {} exited and its id was reused before its final totals fit in the EVENTS ring: {} ns of its time discarded on this CPU",
                tid,
                stale.total_ns()
            );
        }
        cpu.discarded_ns += stale.total_ns();
    }
    let _ = TASKS.remove(tid);
}

/// Counts a record that did not fit in `EVENTS`, and says so at the first
/// on this CPU and at each power of two after.
#[inline(always)]
pub(crate) fn events_lost<C: EbpfContext>(ctx: &C, cpu: &mut CpuState) {
    cpu.events_lost += 1;
    if cpu.events_lost.is_power_of_two() {
        warn!(
            ctx,
            "the EVENTS ring is full: {} record(s) lost on this CPU so far (lineage or names may be missing; time is not)",
            cpu.events_lost
        );
    }
}

/// Sends a task's totals; counts the event as lost when the ring is full.
#[inline(always)]
fn emit_totals<C: EbpfContext>(
    ctx: &C,
    kind: u32,
    tid: u32,
    task: &TaskStats,
    now: u64,
    cpu: &mut CpuState,
) -> bool {
    let Some(mut slot) = EVENTS.reserve::<TaskEvent>(0) else {
        events_lost(ctx, cpu);
        return false;
    };
    slot.write(TaskEvent {
        kind,
        tid,
        tgid: task.tgid,
        parent_tid: 0,
        parent_tgid: 0,
        // SAFETY: helper without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        ts_ns: now,
        created_ns: task.created_ns,
        cgroup_id: task.cgroup_id,
        on_cpu_ns: task.on_cpu_ns,
        comm: task.comm,
    });
    slot.submit(0);
    true
}

/// Sends an event about `current` without totals.
#[inline(always)]
fn emit_current<C: EbpfContext>(
    ctx: &C,
    kind: u32,
    tid: u32,
    tgid: u32,
    parent: u64,
    cpu: &mut CpuState,
) {
    let Some(mut slot) = EVENTS.reserve::<TaskEvent>(0) else {
        events_lost(ctx, cpu);
        return;
    };
    slot.write(TaskEvent {
        kind,
        tid,
        tgid,
        parent_tid: parent as u32,
        parent_tgid: (parent >> 32) as u32,
        // SAFETY: helpers without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        // SAFETY: as above.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        created_ns: 0,
        // SAFETY: as above.
        cgroup_id: unsafe { bpf_get_current_cgroup_id() },
        on_cpu_ns: [0; MAX_SOCKETS],
        comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
    });
    slot.submit(0);
}

/// A new task: record its lineage. `current` is the parent; the child has
/// not run yet, so any entry under its tid belongs to an earlier task whose
/// exit could not be reported: report it now and free the slot.
#[tracepoint(category = "sched", name = "sched_process_fork")]
pub fn wattprof_sched_process_fork(ctx: TracePointContext) -> i32 {
    let Some(cpu) = CPUS.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: see `charge`.
    let cpu = unsafe { &mut *cpu };
    // SAFETY: reading a global that userspace sets before load.
    let offset = unsafe { core::ptr::read_volatile(&FORK_CHILD_PID_OFFSET) } as usize;
    // SAFETY: the offset comes from this kernel's own format description.
    let child: i32 = match unsafe { ctx.read_at(offset) } {
        Ok(pid) => pid,
        Err(_) => return 0,
    };
    if child <= 0 {
        return 0;
    }
    let child = child as u32;
    // SAFETY: reading a global that userspace sets before load.
    if unsafe { core::ptr::read_volatile(&ITER_MODE) } != 0 {
        emit_current(&ctx, EVENT_FORK, child, 0, bpf_get_current_pid_tgid(), cpu);
        return 0;
    }
    if let Some(stale) = TASKS.get_ptr(child) {
        // SAFETY: the stale task is gone; nothing else writes this entry.
        let stale = unsafe { &*stale };
        // SAFETY: helper without preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        retire(&ctx, child, stale, now, cpu);
    }
    // The child's run-time counter starts at zero: with this entry its very
    // first slice is the scheduler's figure too. (No room: first sight later.)
    // SAFETY: helpers without preconditions.
    let fresh = TaskStats::new(
        unsafe { bpf_ktime_get_ns() },
        unsafe { bpf_get_current_cgroup_id() },
        0,
        TASK_FLAG_BASELINE,
        bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
    );
    let _ = TASKS.insert(child, fresh, BPF_NOEXIST.into());
    emit_current(&ctx, EVENT_FORK, child, 0, bpf_get_current_pid_tgid(), cpu);
    0
}

/// `current` replaced its program image: note its new name.
#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn wattprof_sched_process_exec(ctx: TracePointContext) -> i32 {
    let Some(cpu) = CPUS.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: see `charge`.
    let cpu = unsafe { &mut *cpu };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if let Some(task) = TASKS.get_ptr_mut(tid) {
        // SAFETY: `current` owns its entry (see `charge`).
        let task = unsafe { &mut *task };
        task.comm = bpf_get_current_comm().unwrap_or(task.comm);
    }
    emit_current(&ctx, EVENT_EXEC, tid, (pid_tgid >> 32) as u32, 0, cpu);
    0
}

/// Exit on kernels without `prev_state` in sched_switch: flag the entry and
/// report the totals so far; the last slice lands in the same entry, which
/// userspace reads once more and then frees.
#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn wattprof_sched_process_exit(ctx: TracePointContext) -> i32 {
    let Some(cpu) = CPUS.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: see `charge`.
    let cpu = unsafe { &mut *cpu };
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(task) = TASKS.get_ptr_mut(tid) {
        // SAFETY: `current` owns its entry (see `charge`).
        let task = unsafe { &mut *task };
        task.flags |= TASK_FLAG_DEAD;
        task.comm = bpf_get_current_comm().unwrap_or(task.comm);
        // SAFETY: helper without preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        emit_totals(&ctx, EVENT_EXIT, tid, task, now, cpu);
    }
    0
}

// Only in the BPF build: `cargo clippy --workspace` checks this crate on
// the host too, where std (through aya, by feature unification) has one.
#[cfg(target_arch = "bpf")]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
