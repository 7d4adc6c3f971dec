//! wattprof's kernel side: exact on-CPU nanoseconds per thread, per package.
//!
//! Every nanosecond of every CPU between its first and last event is charged
//! to exactly one of: a task (`TASKS`, and the CPU's `busy_ns`), the idle task
//! (`idle_ns`), or `lost_ns` when `TASKS` is full. The charging point is a
//! context switch (the task leaving the CPU is `current`, so no `task_struct`
//! field is read and no kernel-specific offset is needed), or a flush that
//! userspace runs on a CPU through `BPF_PROG_TEST_RUN` to close the slice in
//! progress before it reads the maps.
//!
//! Bounds: `TASKS` holds `DEFAULT_MAX_TASKS` threads (userspace may change it
//! at load time); `EVENTS` is `DEFAULT_RING_BYTES`; `CPUS` has one entry per
//! possible CPU. What does not fit is counted in `CpuState`.
#![no_std]
#![no_main]

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_smp_processor_id, bpf_ktime_get_ns,
    },
    macros::{map, raw_tracepoint, tracepoint},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::{RawTracePointContext, TracePointContext},
};
use profiler_common::{
    COMM_LEN, CpuState, DEFAULT_MAX_TASKS, DEFAULT_RING_BYTES, EVENT_EXEC, EVENT_EXIT, EVENT_FORK,
    EVENT_REAPED, MAX_SOCKETS, TASK_DEAD, TASK_FLAG_DEAD, TaskEvent, TaskStats,
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

/// Offset of `child_pid` in the `sched:sched_process_fork` record. It moved
/// when the comm fields became `__data_loc` strings, so userspace reads it
/// from the tracefs `format` file and sets it at load time.
#[unsafe(no_mangle)]
static FORK_CHILD_PID_OFFSET: u32 = 20;

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
    charge(kind);
    0
}

/// sched_switch before Linux 5.18 (no `prev_state` argument): exits are
/// flagged by `wattprof_sched_process_exit`, and userspace frees the entry.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn wattprof_sched_switch_legacy(_ctx: RawTracePointContext) -> i32 {
    charge(Charge::Switch);
    0
}

/// Never attached: run on one CPU by userspace (`BPF_F_TEST_RUN_ON_CPU`) in
/// interrupt context there, where `current` is the task that CPU is running.
#[raw_tracepoint(tracepoint = "wattprof_flush")]
pub fn wattprof_flush(_ctx: RawTracePointContext) -> i32 {
    charge(Charge::Flush);
    0
}

#[inline(always)]
fn charge(kind: Charge) {
    let Some(cpu) = CPUS.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: a per-CPU slot, touched only by programs running on this CPU,
    // which cannot interleave (sched_switch runs with interrupts off).
    let cpu = unsafe { &mut *cpu };
    // SAFETY: helpers without preconditions.
    let now = unsafe { bpf_ktime_get_ns() };
    if kind != Charge::Flush {
        cpu.switches += 1;
    }
    if cpu.last_ns == 0 {
        // The first event on this CPU opens its accounting window.
        cpu.first_ns = now;
        cpu.last_ns = now;
        return;
    }
    let delta = now.wrapping_sub(cpu.last_ns);
    cpu.last_ns = now;

    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if tid == 0 {
        cpu.idle_ns += delta;
        return;
    }
    let socket = (cpu.socket as usize) & (MAX_SOCKETS - 1);
    // SAFETY: helper without preconditions.
    let cgroup_id = unsafe { bpf_get_current_cgroup_id() };
    let task = match TASKS.get_ptr_mut(tid) {
        Some(task) => {
            // SAFETY: a task is `current` on one CPU at a time, so only this
            // program updates its entry now; userspace only reads it.
            let task = unsafe { &mut *task };
            task.on_cpu_ns[socket] += delta;
            task.cgroup_id = cgroup_id;
            task
        }
        None => {
            let mut fresh = TaskStats {
                created_ns: now,
                cgroup_id,
                on_cpu_ns: [0; MAX_SOCKETS],
                tgid: (pid_tgid >> 32) as u32,
                flags: 0,
                comm: bpf_get_current_comm().unwrap_or([0; COMM_LEN]),
            };
            fresh.on_cpu_ns[socket] = delta;
            if TASKS.insert(tid, fresh, BPF_NOEXIST.into()).is_err() {
                cpu.lost_ns += delta;
                return;
            }
            match TASKS.get_ptr_mut(tid) {
                // SAFETY: as above.
                Some(task) => unsafe { &mut *task },
                None => {
                    cpu.busy_ns += delta;
                    return;
                }
            }
        }
    };
    cpu.busy_ns += delta;

    if kind == Charge::SwitchDead {
        task.flags |= TASK_FLAG_DEAD;
        if emit_totals(EVENT_EXIT, tid, task, now, cpu) {
            let _ = TASKS.remove(tid);
        }
        // Otherwise the flagged entry stays for userspace to read and free.
    }
}

/// Sends a task's totals; counts the event as lost when the ring is full.
#[inline(always)]
fn emit_totals(kind: u32, tid: u32, task: &TaskStats, now: u64, cpu: &mut CpuState) -> bool {
    let Some(mut slot) = EVENTS.reserve::<TaskEvent>(0) else {
        cpu.events_lost += 1;
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
fn emit_current(kind: u32, tid: u32, tgid: u32, parent: u64, cpu: &mut CpuState) {
    let Some(mut slot) = EVENTS.reserve::<TaskEvent>(0) else {
        cpu.events_lost += 1;
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
        ts_ns: unsafe { bpf_ktime_get_ns() },
        created_ns: 0,
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
    if let Some(stale) = TASKS.get_ptr(child) {
        // SAFETY: the stale task is gone; nothing else writes this entry.
        let stale = unsafe { *stale };
        // SAFETY: helper without preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        if !emit_totals(EVENT_REAPED, child, &stale, now, cpu) {
            cpu.discarded_ns += stale.total_ns();
        }
        let _ = TASKS.remove(child);
    }
    emit_current(EVENT_FORK, child, 0, bpf_get_current_pid_tgid(), cpu);
    0
}

/// `current` replaced its program image: note its new name.
#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn wattprof_sched_process_exec(_ctx: TracePointContext) -> i32 {
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
    emit_current(EVENT_EXEC, tid, (pid_tgid >> 32) as u32, 0, cpu);
    0
}

/// Exit on kernels without `prev_state` in sched_switch: flag the entry and
/// report the totals so far; the last slice lands in the same entry, which
/// userspace reads once more and then frees.
#[tracepoint(category = "sched", name = "sched_process_exit")]
pub fn wattprof_sched_process_exit(_ctx: TracePointContext) -> i32 {
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
        // SAFETY: helper without preconditions.
        let now = unsafe { bpf_ktime_get_ns() };
        emit_totals(EVENT_EXIT, tid, task, now, cpu);
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 13] = *b"Dual MIT/GPL\0";
