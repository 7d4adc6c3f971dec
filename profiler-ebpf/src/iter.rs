//! The iterator tracker: nothing runs at context switches.
//!
//! The scheduler keeps each thread's exact run time in
//! `task_struct.se.sum_exec_runtime`. A task iterator (`iter/task`), run by
//! userspace at each read, writes one [`IterRecord`] per thread whose run
//! time grew since the previous read (the `LAST` map remembers what was
//! reported). Rare events complete the picture through
//! the `EVENTS` ring: a thread's exit (`sched_process_exit`, its run time up
//! to a tick stale), its final run time when its `task_struct` is freed
//! (`sched_process_free`), moves between packages (`sched_migrate_task`,
//! attached only on multi-package machines) and between cgroups
//! (`cgroup_attach_task`).
//!
//! Where the kernel has the open-coded task iterator (6.8 on), the reads
//! that skip idle threads run `wattprof_iter_walk` instead: one call of an
//! `iter/bpf_map` program walks every thread with the
//! `bpf_iter_task_new/next/destroy` kfuncs, doing the same per-thread work
//! without `iter/task`'s per-thread pid lookup, reference and program
//! call (the walk costs a quarter of what `iter/task` does at 10,000
//! threads), and writes its records
//! to `ITER_RING`, since one call's output would overflow the seq buffer.
//! Full reads stay on `iter/task`. aya 0.14 cannot relocate kfunc calls:
//! each is a raw `call` instruction (`asm!`), its id patched in by the
//! loader (`KFUNC_PLACEHOLDERS`).
//!
//! Field offsets come from the running kernel's BTF (`KERNEL_OFFSETS`, set
//! by userspace before load). The iterator's task pointer is BTF-typed, so
//! it reads fields with plain loads; the raw tracepoints use
//! `bpf_probe_read_kernel`.

use core::ffi::c_void;

use aya_ebpf::{
    helpers::{
        bpf_get_current_cgroup_id, bpf_get_current_comm, bpf_get_current_task,
        bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel, bpf_seq_write,
    },
    macros::{map, raw_tracepoint},
    maps::{Array, HashMap, RingBuf},
    programs::RawTracePointContext,
};
use profiler_common::iter::{
    EVENT_THREAD_CGROUP, EVENT_THREAD_EXIT, EVENT_THREAD_FREE, EVENT_THREAD_MIGRATE,
    ITER_FLAG_MORE, ITER_FLAG_RUNNING, ITER_FLAG_TRAILER, ITER_RING_BYTES, IterRecord,
    KernelOffsets, ThreadEvent,
};
use profiler_common::{COMM_LEN, DEFAULT_MAX_TASKS};

use crate::{CPUS, EVENTS};

/// Run time last reported per thread (`task_struct` address): the filter
/// that keeps idle threads out of a read. Entries are removed when the
/// task is freed, or by userspace when it settles a thread whose free was
/// not seen. When it is full, threads it cannot hold are reported at every
/// read (more work, nothing lost) and counted in the trailer.
#[map]
static LAST: HashMap<u64, u64> = HashMap::with_max_entries(DEFAULT_MAX_TASKS, 0);

/// The open-coded walk's records (see the module's documentation).
#[map]
static ITER_RING: RingBuf = RingBuf::with_byte_size(ITER_RING_BYTES, 0);

/// Dense package index per CPU id, set by userspace (multi-package only).
#[map]
static CPU_PACKAGE: Array<u32> = Array::with_max_entries(1, 0);

/// Set by userspace before a read: non-zero for a full read (every thread,
/// the filter ignored), which tells userspace which threads are gone.
#[map]
static ITER_CONTROL: Array<u64> = Array::with_max_entries(1, 0);

/// The read in progress: threads visited, threads the filter could not
/// hold, records written (sent in its trailer), and whether it is full
/// (copied from `ITER_CONTROL` by its first call). One reader runs the
/// iterator at a time (the seq_file lock). The verifier inlines lookups in
/// an array, so a slot costs a load.
#[map]
static ITER_READ: Array<u64> = Array::with_max_entries(6, 0);

const VISITED: u32 = 0;
const OVERFLOW: u32 = 1;
const WRITTEN: u32 = 2;
const FULL: u32 = 3;
/// `bpf_ktime_get_ns()` minus the scheduler clock (`rq_clock`), measured at
/// the start of the read (wrapping: either clock may be ahead).
const CLOCK_OFFSET: u32 = 4;
/// Non-zero when `CLOCK_OFFSET` was measured in this read.
const CLOCK_KNOWN: u32 = 5;

/// A running thread's estimate is at most this far past its counter (the
/// counter is updated at every tick: 10 ms at HZ=100); beyond, the
/// estimate is not trusted.
const MAX_ESTIMATE_AHEAD_NS: u64 = 20_000_000;

/// Offsets into this kernel's structures, from its BTF.
#[unsafe(no_mangle)]
static KERNEL_OFFSETS: KernelOffsets = KernelOffsets {
    sum_exec: 0,
    pid: 0,
    tgid: 0,
    start_time: 0,
    comm: 0,
    cpu: 0,
    cgroups: 0,
    dfl_cgrp: 0,
    cgroup_kn: 0,
    kn_id: 0,
    on_cpu: 0,
    exec_start: 0,
    se_cfs_rq: 0,
    cfs_rq_rq: 0,
    rq_clock: 0,
    rq_clock_task: 0,
    last_arrival: 0,
};

macro_rules! offset {
    ($field:ident) => {
        // SAFETY: reading a global that userspace sets before load.
        unsafe { core::ptr::read_volatile(&raw const KERNEL_OFFSETS.$field) } as usize
    };
}

/// `struct bpf_iter_meta`.
#[repr(C)]
struct IterMeta {
    seq: *mut c_void,
    session_id: u64,
    seq_num: u64,
}

/// A plain load from a BTF-typed kernel pointer (the verifier turns it
/// into a fault-safe load).
#[inline(always)]
unsafe fn load<T: Copy>(base: *const u8, offset: usize) -> T {
    // SAFETY: the caller passes a BTF-typed pointer and an offset from the
    // same kernel's BTF; the verifier checks the access against the type.
    unsafe { core::ptr::read_volatile(base.add(offset).cast::<T>()) }
}

#[inline(always)]
fn bump(slot: u32) {
    if let Some(n) = ITER_READ.get_ptr_mut(slot) {
        // SAFETY: one reader runs an iterator at a time (wattprof's read
        // runs the walk, then `iter/task`, never both at once), and only
        // those two programs touch this map.
        unsafe { *n += 1 };
    }
}

#[inline(always)]
fn slot(slot: u32) -> u64 {
    ITER_READ.get(slot).copied().unwrap_or(0)
}

/// The first call of a read: its counters zeroed, whether it is a full
/// read, and the scheduler clock's offset from `bpf_ktime_get_ns`.
#[inline(always)]
fn start_read() {
    for i in [VISITED, OVERFLOW, WRITTEN] {
        let _ = ITER_READ.set(i, 0, 0);
    }
    let _ = ITER_READ.set(FULL, ITER_CONTROL.get(0).copied().unwrap_or(0), 0);
    // The reader (`current`) slept just before this read, so it was
    // switched in a few microseconds ago: its `last_arrival` is the
    // scheduler clock of about now.
    let arrival_off = offset!(last_arrival);
    let (mut calibration, mut known) = (0u64, 0u64);
    if arrival_off != 0 {
        // SAFETY: helpers without preconditions.
        let (me, now) = unsafe { (bpf_get_current_task(), bpf_ktime_get_ns()) };
        let arrival: u64 = probe(me, arrival_off);
        if arrival != 0 {
            calibration = now.wrapping_sub(arrival);
            known = 1;
        }
    }
    let _ = ITER_READ.set(CLOCK_OFFSET, calibration, 0);
    let _ = ITER_READ.set(CLOCK_KNOWN, known, 0);
}

/// On a CPU: the task's counter is as old as its last update (a tick at
/// most). The time since, on its runqueue's task clock: the scheduler
/// clock now (calibrated at the start of the read) less what the runqueue
/// keeps out of task time (interrupt and steal time, as of its last clock
/// update), less `exec_start`. `None` when it is not running, or the
/// estimate cannot be trusted.
#[inline(always)]
fn running_estimate(task_addr: u64, on_cpu: u32) -> Option<u64> {
    if on_cpu == 0 || slot(CLOCK_KNOWN) == 0 {
        return None;
    }
    let clock_offset = slot(CLOCK_OFFSET);
    let exec_start: u64 = probe(task_addr, offset!(exec_start));
    let cfs_rq: u64 = probe(task_addr, offset!(se_cfs_rq));
    let rq: u64 = probe(cfs_rq, offset!(cfs_rq_rq));
    // `clock_task` first: an update landing between the two loads then
    // makes the estimate low, never high.
    let clock_task: u64 = probe(rq, offset!(rq_clock_task));
    let clock: u64 = probe(rq, offset!(rq_clock));
    // SAFETY: helper without preconditions.
    let now_sched = unsafe { bpf_ktime_get_ns() }.wrapping_sub(clock_offset);
    // The runqueue's task clock now: as of its last update, plus the
    // scheduler-clock time since. The calibration errs a few tens of
    // microseconds late, and CPUs' clocks may differ by as much: a clock
    // that seems ahead of now was just updated.
    let since_update = now_sched.saturating_sub(clock);
    let now_task = clock_task.wrapping_add(since_update);
    if exec_start != 0 && clock >= clock_task && now_task >= exec_start {
        let ahead = now_task - exec_start;
        if ahead <= MAX_ESTIMATE_AHEAD_NS {
            return Some(ahead);
        }
    }
    None
}

/// The end of a read: how it went, in the seq file.
#[inline(always)]
fn write_trailer(seq: *mut c_void, flags: u32) {
    let trailer = IterRecord {
        task_ptr: slot(WRITTEN),
        sum_exec_ns: slot(VISITED),
        cgroup_id: slot(OVERFLOW),
        flags: ITER_FLAG_TRAILER | flags,
        ..IterRecord::default()
    };
    // SAFETY: seq comes from the iterator's meta; the record is on the stack.
    unsafe {
        bpf_seq_write(
            seq.cast(),
            (&raw const trailer).cast(),
            size_of::<IterRecord>() as u32,
        )
    };
}

/// A thread's record, when the read must report it (its run time grew, it
/// is on a CPU, or the read is full), with its counter and whether that
/// differs from what the filter holds. (A bool, not the filter's
/// `Option<u64>`: a `None`'s undefined payload, copied out, becomes a read
/// of a clobbered register, which the verifier refuses.)
///
/// # Safety
/// `task` is a non-null, BTF-typed `task_struct` pointer.
#[inline(always)]
unsafe fn examine(task: *const u8) -> Option<(IterRecord, u64, bool)> {
    bump(VISITED);
    let (sum_off, on_cpu_off) = (offset!(sum_exec), offset!(on_cpu));
    // SAFETY: the caller's pointer.
    let sum: u64 = unsafe { load(task, sum_off) };
    // SAFETY: as above.
    let on_cpu: u32 = unsafe { load(task, on_cpu_off) };
    let key = task as u64;
    // SAFETY: the value is copied out at once.
    let known = unsafe { LAST.get(key) }.copied();
    if known == Some(sum) && on_cpu == 0 && slot(FULL) == 0 {
        return None;
    }
    // On a CPU: its counter plus the time since its last update.
    let (reported, flags) = match running_estimate(task as u64, on_cpu) {
        Some(ahead) => (sum + ahead, ITER_FLAG_RUNNING),
        None => (sum, 0),
    };
    let (cgroups_off, dfl_off, kn_off, id_off) = (
        offset!(cgroups),
        offset!(dfl_cgrp),
        offset!(cgroup_kn),
        offset!(kn_id),
    );
    let (start_off, pid_off, tgid_off, cpu_off, comm_off) = (
        offset!(start_time),
        offset!(pid),
        offset!(tgid),
        offset!(cpu),
        offset!(comm),
    );
    // SAFETY: as above, for every field.
    let rec = unsafe {
        let cgroups: *const u8 = load(task, cgroups_off);
        let dfl: *const u8 = load(cgroups, dfl_off);
        let kn: *const u8 = load(dfl, kn_off);
        IterRecord {
            task_ptr: key,
            start_ns: load(task, start_off),
            sum_exec_ns: reported,
            cgroup_id: load(kn, id_off),
            tid: load(task, pid_off),
            tgid: load(task, tgid_off),
            cpu: load(task, cpu_off),
            flags,
            comm: bpf_probe_read_kernel(task.add(comm_off).cast::<[u8; COMM_LEN]>())
                .unwrap_or([0; COMM_LEN]),
        }
    };
    Some((rec, sum, known != Some(sum)))
}

/// A record is out: the filter remembers the thread's counter. Only then,
/// so a record that did not fit is reported by the next read.
#[inline(always)]
fn remember(key: u64, sum: u64, changed: bool) {
    bump(WRITTEN);
    if changed && LAST.insert(key, sum, 0).is_err() {
        bump(OVERFLOW);
    }
}

/// The task iterator: one record per thread whose run time grew since the
/// last read (every thread on a full read).
///
/// # Safety
/// Called by the kernel with a `struct bpf_iter__task *`.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub unsafe extern "C" fn wattprof_iter_task(ctx: *mut c_void) -> i32 {
    let ctx = ctx.cast::<*const u8>();
    // SAFETY: `bpf_iter__task` is { meta, task }.
    let meta = unsafe { core::ptr::read_volatile(ctx) }.cast::<IterMeta>();
    // SAFETY: as above.
    let task = unsafe { core::ptr::read_volatile(ctx.add(1)) };
    // SAFETY: meta is valid for the call.
    let seq = unsafe { core::ptr::read_volatile(&raw const (*meta).seq) };
    // SAFETY: as above.
    let seq_num = unsafe { core::ptr::read_volatile(&raw const (*meta).seq_num) };
    if seq_num == 0 {
        start_read();
    }
    if task.is_null() {
        // The final call: say how the read went.
        write_trailer(seq, 0);
        return 0;
    }
    // SAFETY: the iterator's non-null task pointer.
    let Some((rec, sum, changed)) = (unsafe { examine(task) }) else {
        return 0;
    };
    // SAFETY: seq comes from the iterator's meta; the record is on the stack.
    let written = unsafe {
        bpf_seq_write(
            seq.cast(),
            (&raw const rec).cast(),
            size_of::<IterRecord>() as u32,
        )
    };
    // When the buffer is full the kernel shows this task again in the
    // next chunk.
    if written == 0 {
        remember(task as u64, sum, changed);
    }
    0
}

/// `struct bpf_iter_task`: the open-coded iterator's state, on the stack.
type TaskIter = [u64; 3];

/// `BPF_TASK_ITER_ALL_THREADS`.
const ALL_THREADS: u64 = 1;

/// `BPF_RB_NO_WAKEUP`.
const BPF_RB_NO_WAKEUP: u64 = 1;

/// `bpf_iter_task_new(it, NULL, flags)`, as a raw kfunc call.
///
/// # Safety
/// `it` is an uninitialised iterator on this program's stack.
#[cfg(target_arch = "bpf")]
#[inline(always)]
unsafe fn iter_task_new(it: *mut TaskIter, flags: u64) -> i64 {
    let ret: i64;
    // SAFETY: a kfunc call (src_reg 2) whose id the loader patches in; it
    // takes r1..r3 and clobbers r0..r5 like any call.
    unsafe {
        core::arch::asm!(
            ".8byte ({imm} << 32) | 0x2085",
            imm = const profiler_common::iter::KFUNC_PLACEHOLDERS[0].0,
            inlateout("r1") it => _,
            inlateout("r2") 0u64 => _,
            inlateout("r3") flags => _,
            lateout("r0") ret,
            lateout("r4") _,
            lateout("r5") _,
        )
    };
    ret
}

/// `bpf_iter_task_next(it)`: the next thread, or null at the end.
///
/// # Safety
/// `it` was set up by [`iter_task_new`].
#[cfg(target_arch = "bpf")]
#[inline(always)]
unsafe fn iter_task_next(it: *mut TaskIter) -> *const u8 {
    let ret: u64;
    // SAFETY: as in `iter_task_new`.
    unsafe {
        core::arch::asm!(
            ".8byte ({imm} << 32) | 0x2085",
            imm = const profiler_common::iter::KFUNC_PLACEHOLDERS[1].0,
            inlateout("r1") it => _,
            lateout("r0") ret,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        )
    };
    ret as *const u8
}

/// `bpf_iter_task_destroy(it)`.
///
/// # Safety
/// `it` was set up by [`iter_task_new`].
#[cfg(target_arch = "bpf")]
#[inline(always)]
unsafe fn iter_task_destroy(it: *mut TaskIter) {
    // SAFETY: as in `iter_task_new`.
    unsafe {
        core::arch::asm!(
            ".8byte ({imm} << 32) | 0x2085",
            imm = const profiler_common::iter::KFUNC_PLACEHOLDERS[2].0,
            inlateout("r1") it => _,
            lateout("r0") _,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        )
    };
}

// On the host (`cargo clippy --workspace` checks this crate there too)
// there are no BPF registers: the walk is empty.
#[cfg(not(target_arch = "bpf"))]
unsafe fn iter_task_new(_it: *mut TaskIter, _flags: u64) -> i64 {
    0
}

#[cfg(not(target_arch = "bpf"))]
unsafe fn iter_task_next(_it: *mut TaskIter) -> *const u8 {
    core::ptr::null()
}

#[cfg(not(target_arch = "bpf"))]
unsafe fn iter_task_destroy(_it: *mut TaskIter) {}

/// The walk's work for one thread: its record to the ring when it must be
/// reported. Returns non-zero when the ring is full (nothing was
/// remembered). A subprogram, not inlined: the verifier explores the
/// loop's body until its states repeat, and this keeps the record, its
/// branches and its stack out of the loop's state (inlined, it went past
/// the verifier's million instructions).
///
/// # Safety
/// `task` is a non-null, trusted `task_struct` pointer.
#[inline(never)]
unsafe fn walk_visit(task: *const u8) -> u32 {
    let pid_off = offset!(pid);
    // The walk starts at `init_task`, CPU 0's idle task (pid 0), which
    // `iter/task` never shows: on a CPU whenever it idles, it would be
    // reported as a running thread at every read.
    // SAFETY: the caller's pointer.
    if unsafe { load::<u32>(task, pid_off) } == 0 {
        return 0;
    }
    // SAFETY: the caller's pointer.
    let Some((rec, sum, changed)) = (unsafe { examine(task) }) else {
        return 0;
    };
    // No wakeup: nobody polls this ring; userspace drains it after the
    // walk.
    if ITER_RING
        .output::<IterRecord>(&rec, BPF_RB_NO_WAKEUP)
        .is_err()
    {
        return 1;
    }
    remember(task as u64, sum, changed);
    0
}

/// The open-coded walk: `iter/bpf_map` calls this once per BPF map (it
/// returns at once) and a last time with none, when it walks every thread
/// with the task iterator kfuncs and sends the records of those that ran
/// to `ITER_RING`. A full ring ends the walk early, flagged in the trailer
/// (userspace then finishes the read with `iter/task`).
///
/// # Safety
/// Called by the kernel with a `struct bpf_iter__bpf_map *`.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/bpf_map")]
pub unsafe extern "C" fn wattprof_iter_walk(ctx: *mut c_void) -> i32 {
    let ctx = ctx.cast::<*const u8>();
    // SAFETY: `bpf_iter__bpf_map` is { meta, map }.
    let meta = unsafe { core::ptr::read_volatile(ctx) }.cast::<IterMeta>();
    // SAFETY: as above.
    let map = unsafe { core::ptr::read_volatile(ctx.add(1)) };
    if !map.is_null() {
        return 0;
    }
    // SAFETY: meta is valid for the call.
    let seq = unsafe { core::ptr::read_volatile(&raw const (*meta).seq) };
    // After a call per BPF map on the machine (a few microseconds): the
    // calibration errs that much late, which makes running threads'
    // estimates low, never high. The walk is one program run under RCU:
    // it does not reschedule between threads as `iter/task` can (100,000
    // threads: some milliseconds).
    start_read();
    let mut flags = 0;
    let mut it: TaskIter = [0; 3];
    // SAFETY: `it` is on this stack, destroyed below. Should it fail
    // (it cannot with these arguments), the walk is empty: flagged, so
    // `iter/task` does the read.
    if unsafe { iter_task_new(&mut it, ALL_THREADS) } != 0 {
        flags = ITER_FLAG_MORE;
    }
    loop {
        // SAFETY: `it` was set up above.
        let task = unsafe { iter_task_next(&mut it) };
        if task.is_null() {
            break;
        }
        // SAFETY: the kfunc's non-null, trusted task pointer.
        if unsafe { walk_visit(task) } != 0 {
            flags = ITER_FLAG_MORE;
            break;
        }
    }
    // SAFETY: as above.
    unsafe { iter_task_destroy(&mut it) };
    write_trailer(seq, flags);
    0
}

/// A field of a task (or any kernel object) by address, through
/// `bpf_probe_read_kernel`; 0 where it cannot be read.
#[inline(always)]
fn probe<T: Copy + Default>(base: u64, offset: usize) -> T {
    // SAFETY: probe_read_kernel checks the address; the offset comes from
    // this kernel's own BTF.
    unsafe { bpf_probe_read_kernel((base + offset as u64) as *const T) }.unwrap_or_default()
}

/// The task's cgroup v2 id, by address.
#[inline(always)]
fn task_cgroup(task: u64) -> u64 {
    let cgroups: u64 = probe(task, offset!(cgroups));
    let dfl: u64 = probe(cgroups, offset!(dfl_cgrp));
    let kn: u64 = probe(dfl, offset!(cgroup_kn));
    probe(kn, offset!(kn_id))
}

/// Sends a thread event about the task at `task`; counts it as lost when
/// the ring is full.
#[inline(always)]
fn emit_thread(
    ctx: &RawTracePointContext,
    kind: u32,
    task: u64,
    cpu: u32,
    cgroup_id: u64,
    arg: u32,
    comm: [u8; COMM_LEN],
) {
    let Some(mut slot) = EVENTS.reserve::<ThreadEvent>(0) else {
        if let Some(state) = CPUS.get_ptr_mut(0) {
            // SAFETY: a per-CPU slot; programs on one CPU do not interleave
            // on it (see `charge`).
            super::events_lost(ctx, unsafe { &mut *state });
        }
        return;
    };
    slot.write(ThreadEvent {
        kind,
        tid: probe(task, offset!(pid)),
        tgid: probe(task, offset!(tgid)),
        cpu,
        // SAFETY: helper without preconditions.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        task_ptr: task,
        start_ns: probe(task, offset!(start_time)),
        sum_exec_ns: probe(task, offset!(sum_exec)),
        cgroup_id,
        arg,
        pad: 0,
        comm,
    });
    slot.submit(0);
}

/// `current` is exiting: its run time so far (up to a tick stale) and
/// where it ran, in case its free is never seen.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn wattprof_thread_exit(ctx: RawTracePointContext) -> i32 {
    // SAFETY: helpers without preconditions.
    let (task, cpu, cgroup) = unsafe {
        (
            bpf_get_current_task(),
            bpf_get_smp_processor_id(),
            bpf_get_current_cgroup_id(),
        )
    };
    let comm = bpf_get_current_comm().unwrap_or([0; COMM_LEN]);
    emit_thread(&ctx, EVENT_THREAD_EXIT, task, cpu, cgroup, 0, comm);
    0
}

/// A task is freed (an RCU grace period after it was reaped): its final,
/// exact run time. Its filter entry goes.
#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn wattprof_thread_free(ctx: RawTracePointContext) -> i32 {
    let task: u64 = ctx.arg(0);
    if task == 0 {
        return 0;
    }
    let cpu: u32 = probe(task, offset!(cpu));
    let comm: [u8; COMM_LEN] = probe(task, offset!(comm));
    emit_thread(
        &ctx,
        EVENT_THREAD_FREE,
        task,
        cpu,
        task_cgroup(task),
        0,
        comm,
    );
    let _ = LAST.remove(task);
    0
}

fn package_of(cpu: u32) -> u32 {
    CPU_PACKAGE.get(cpu).copied().unwrap_or(0)
}

/// A task moves to another CPU (it is off CPU, so its run time is exact):
/// a checkpoint when the move crosses packages.
#[raw_tracepoint(tracepoint = "sched_migrate_task")]
pub fn wattprof_thread_migrate(ctx: RawTracePointContext) -> i32 {
    let task: u64 = ctx.arg(0);
    let dest: u64 = ctx.arg(1);
    if task == 0 {
        return 0;
    }
    let dest = dest as u32;
    let src: u32 = probe(task, offset!(cpu));
    if package_of(src) == package_of(dest) {
        return 0;
    }
    emit_thread(
        &ctx,
        EVENT_THREAD_MIGRATE,
        task,
        src,
        task_cgroup(task),
        dest,
        [0; COMM_LEN],
    );
    0
}

/// A task (or its whole thread group) was moved to another cgroup: a
/// checkpoint of the moved task, with its new cgroup v2 id.
#[raw_tracepoint(tracepoint = "cgroup_attach_task")]
pub fn wattprof_cgroup_attach(ctx: RawTracePointContext) -> i32 {
    let task: u64 = ctx.arg(2);
    let group: u64 = ctx.arg(3);
    if task == 0 {
        return 0;
    }
    let cpu: u32 = probe(task, offset!(cpu));
    emit_thread(
        &ctx,
        EVENT_THREAD_CGROUP,
        task,
        cpu,
        task_cgroup(task),
        (group & 1) as u32,
        [0; COMM_LEN],
    );
    0
}
