//! wattprof's kernel side: exact on-CPU nanoseconds per thread, per package.
//!
//! Two trackers share this object, each named the same in the three
//! crates (its programs here, its shared types in `profiler_common`, its
//! reader in `profiler::tracker`): `iter`, the iterator tracker (the
//! default), reads the scheduler's counters at each read and at rare
//! events; `switch` (`--tracker switch`, the fallback without BTF) charges
//! every context switch. This file holds their maps and the fork, exec and
//! exit records both send. The stack sampler, `stacks`, is a second object.
//!
//! Bounds: `TASKS` holds `DEFAULT_MAX_TASKS` threads (userspace may change it
//! at load time); `EVENTS` is `DEFAULT_RING_BYTES`; `ITER_RING` (the
//! iterator's open-coded walk) is `ITER_RING_BYTES`, and a walk that fills
//! it says so in its trailer; `CPUS` has one entry per possible CPU. What does not fit is counted in `CpuState`, and said once
//! through aya-log (`AYA_LOGS`): the first loss of each kind on a CPU, and
//! ring overflows at each power of two, so a full map cannot flood the log.
//! The log statements sit on the failure paths only; the ring's reserve
//! is never reached on a switch that records its slice.
#![no_std]
#![no_main]
// The open-coded walk's kfunc calls are raw instructions (`iter.rs`).
#![cfg_attr(target_arch = "bpf", feature(asm_experimental_arch))]

mod iter;
mod switch;

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_smp_processor_id, bpf_ktime_get_ns,
    },
    macros::{map, tracepoint},
    maps::{Array, HashMap, PerCpuArray, RingBuf},
    programs::TracePointContext,
};
use aya_log_ebpf::warn;
use profiler_common::{
    ACTIVE_RING_BYTES, COMM_LEN, CpuState, DEFAULT_MAX_TASKS, DEFAULT_RING_BYTES, EVENT_EXEC,
    EVENT_EXIT, EVENT_FORK, EVENT_REAPED, MAX_SOCKETS, TaskEvent,
    switch::{TASK_FLAG_BASELINE, TASK_FLAG_DEAD, TaskStats},
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
    // SAFETY: see `switch::charge`.
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
    // SAFETY: see `switch::charge`.
    let cpu = unsafe { &mut *cpu };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tid = pid_tgid as u32;
    if let Some(task) = TASKS.get_ptr_mut(tid) {
        // SAFETY: `current` owns its entry (see `switch::charge`).
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
    // SAFETY: see `switch::charge`.
    let cpu = unsafe { &mut *cpu };
    let tid = bpf_get_current_pid_tgid() as u32;
    if let Some(task) = TASKS.get_ptr_mut(tid) {
        // SAFETY: `current` owns its entry (see `switch::charge`).
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
