//! The switch tracker (`--tracker switch`, the fallback without BTF):
//! every context switch charges the task leaving the CPU for the slice it
//! ran, and a flush run on each CPU before a read closes the slices in
//! progress. Its userspace half is `profiler/src/tracker/switch.rs` (the
//! per-thread ledger) with `tracker/ebpf/` (the reads); its shared types
//! are `profiler_common::switch`.
//!
//! At every context switch the task leaving the CPU (`current`) is charged
//! for the slice it ran: the growth of its own `se.sum_exec_runtime` (the
//! scheduler's counter, read at an offset userspace finds in the running
//! kernel's BTF), or, without BTF, the time since the CPU's previous switch.
//! Time that cannot be recorded (`TASKS` full) goes to the CPU's `lost_ns`.
//! Userspace closes slices still in progress before each read with a flush
//! program run on every CPU through `BPF_PROG_TEST_RUN`; a flush charges
//! wall time provisionally, and the task's next switches settle the
//! difference with the scheduler's figure (an excess is repaid from later
//! slices). Without BTF the slices are wall time between switches, which
//! includes time a hypervisor stole from the CPU (the scheduler's clock
//! leaves it out under `CONFIG_PARAVIRT_TIME_ACCOUNTING`).

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_pid_tgid,
        bpf_get_current_task, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::raw_tracepoint,
    programs::RawTracePointContext,
};
use aya_log_ebpf::warn;
use profiler_common::switch::{Owner, TASK_DEAD, TASK_FLAG_DEAD, TaskStats, owner};
use profiler_common::{
    COMM_LEN, CPU_FLAG_CLOSED, CPU_FLAG_SWITCH_OPENS, CpuState, EVENT_EXIT, MAX_SOCKETS,
};

use crate::{ACTIVE, CPUS, EPOCH, TASKS, emit_totals, retire};

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
    switched_in(&ctx);
    0
}

/// sched_switch before Linux 5.18 (no `prev_state` argument): exits are
/// flagged by `wattprof_sched_process_exit`, and userspace frees the entry.
#[raw_tracepoint(tracepoint = "sched_switch")]
pub fn wattprof_sched_switch_legacy(ctx: RawTracePointContext) -> i32 {
    charge(&ctx, Charge::Switch);
    switched_in(&ctx);
    0
}

/// Notes the task a switch puts on the CPU (argument 2, `next`) and its
/// scheduler counter, for a first sight of it at the end of its slice
/// (see `TaskStats::settle`).
#[inline(always)]
fn switched_in(ctx: &RawTracePointContext) {
    let Some(cpu) = CPUS.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: see `charge`.
    let cpu = unsafe { &mut *cpu };
    let next: u64 = ctx.arg(2);
    match sum_exec(next) {
        Some(sum) if next != 0 => {
            cpu.in_task = next;
            cpu.in_sum_ns = sum;
            cpu.in_fresh = u64::from(sum == 0);
        }
        _ => cpu.in_task = 0,
    }
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
            // A counter noted before the window opened would charge time
            // from before it: the running task's first slice is timed.
            if kind == Charge::Flush {
                cpu.in_task = 0;
            }
        }
        return;
    }
    let wall = now.wrapping_sub(cpu.last_ns);
    cpu.last_ns = now;
    if kind == Charge::Flush {
        // Whoever runs, this much of the slice is charged now.
        cpu.in_sum_ns = cpu.in_sum_ns.wrapping_add(wall);
    }

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
    let Some(task) = entry_of(ctx, tid, task_ptr, cgroup_id, now, cpu) else {
        cpu.lost_ns += wall;
        return;
    };
    task.tgid = (pid_tgid >> 32) as u32;
    task.cgroup_id = cgroup_id;
    let since_in = (cpu.in_task == task_ptr).then_some(cpu.in_sum_ns);
    let delta = task.settle(sum_exec(task_ptr), kind == Charge::Flush, wall, since_in);
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

/// The entry of the task at `task_ptr` under `tid`: its own, a fork's it
/// claims, or a new one (an entry of another task is retired first).
/// `None` when `TASKS` is full.
#[inline(always)]
fn entry_of<C: EbpfContext>(
    ctx: &C,
    tid: u32,
    task_ptr: u64,
    cgroup_id: u64,
    now: u64,
    cpu: &mut CpuState,
) -> Option<&'static mut TaskStats> {
    let mut found = TASKS.get_ptr_mut(tid);
    if let Some(entry) = found {
        // SAFETY: a task is `current` on one CPU at a time, so only this
        // program updates its entry now; userspace only reads it.
        let entry = unsafe { &mut *entry };
        let fresh = (cpu.in_task == task_ptr).then_some(cpu.in_fresh != 0);
        match owner(entry.task_ptr, task_ptr, fresh) {
            Owner::Own => {}
            Owner::Claim => entry.task_ptr = task_ptr,
            // A fork's entry that no task claimed holds no time.
            Owner::Retire if entry.task_ptr == 0 => {
                let _ = TASKS.remove(tid);
                found = None;
            }
            Owner::Retire => {
                retire(ctx, tid, entry, now, cpu);
                found = None;
            }
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
                return None;
            }
            // SAFETY: as above.
            TASKS.get_ptr_mut(tid).map(|task| unsafe { &mut *task })?
        }
    };
    Some(task)
}
