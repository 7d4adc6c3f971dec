//! wattprof's stack sampler (`--stacks`): user and kernel stacks of whatever
//! runs on each CPU, at a fixed rate, for energy flame graphs.
//!
//! A `perf_event` program on the software `cpu-clock` event (one per CPU,
//! opened by userspace with a period of 1/hz) copies the running task's
//! kernel stack (addresses) and user stack into a record and sends it
//! through `SAMPLES`, whole or not at all. User frames are taken with
//! `BPF_F_USER_BUILD_ID`: the kernel resolves each to its file's build id
//! and file offset while the process is alive, so a process that is gone
//! by the time userspace reads the record is still symbolized. The
//! `sched_process_exec` program reports the path of each executed file,
//! which is how userspace finds a file from its build id.
//!
//! Bounds: `SAMPLES` is sized by userspace for a second of samples at the
//! chosen rate (`STACK_RING_BYTES` here) and drained at least ten times a
//! second; a record that does not fit is counted in `STATS`, never
//! dropped silently.
#![no_std]
#![no_main]

use aya_ebpf::{
    EbpfContext,
    bindings::{BPF_F_USER_BUILD_ID, BPF_F_USER_STACK, BPF_RB_NO_WAKEUP},
    helpers::{
        bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_get_smp_processor_id, bpf_get_stack,
        bpf_ktime_get_ns, bpf_probe_read_kernel_str_bytes,
    },
    macros::{map, perf_event, tracepoint},
    maps::{PerCpuArray, RingBuf},
    programs::{PerfEventContext, TracePointContext},
};
use profiler_common::stacks::{
    STACK_EXEC_PATH_LEN, STACK_MAX_KERNEL_FRAMES, STACK_MAX_USER_FRAMES, STACK_RECORD_EXEC,
    STACK_RECORD_SAMPLE, STACK_RING_BYTES, STACK_SCRATCH_BYTES, STACK_USER_FRAME_BYTES,
    StackRecord, StackStats,
};

const HEAD: usize = core::mem::size_of::<StackRecord>();
const KERNEL_MAX_BYTES: usize = STACK_MAX_KERNEL_FRAMES * 8;
const USER_MAX_BYTES: usize = STACK_MAX_USER_FRAMES * STACK_USER_FRAME_BYTES;

/// Samples and exec records for userspace.
#[map]
static SAMPLES: RingBuf = RingBuf::with_byte_size(STACK_RING_BYTES, 0);

/// Where a sample is assembled, one per CPU (too large for the stack).
#[map]
static SCRATCH: PerCpuArray<[u8; STACK_SCRATCH_BYTES]> = PerCpuArray::with_max_entries(1, 0);

/// What was taken and what was lost, per CPU.
#[map]
static STATS: PerCpuArray<StackStats> = PerCpuArray::with_max_entries(1, 0);

/// Offset of the `filename` `__data_loc` field in the
/// `sched:sched_process_exec` record; userspace reads it from tracefs.
#[unsafe(no_mangle)]
static EXEC_FILENAME_OFFSET: u32 = 8;

/// Never wake userspace: it drains the ring on a timer (a wake-up per
/// sample would cost more than the sample, and a BPF ring buffer polls
/// readable whenever it holds anything).
const NO_WAKEUP: u64 = BPF_RB_NO_WAKEUP as u64;

/// One sample: the running task's stacks, or a count for the idle task.
#[perf_event]
pub fn wattprof_stack_sample(ctx: PerfEventContext) -> u32 {
    let Some(stats) = STATS.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: a per-CPU value, and programs do not nest on one CPU.
    let stats = unsafe { &mut *stats };
    let pid_tgid = bpf_get_current_pid_tgid();
    let tgid = (pid_tgid >> 32) as u32;
    if tgid == 0 {
        stats.idle += 1;
        return 0;
    }
    stats.samples += 1;
    let Some(buf) = SCRATCH.get_ptr_mut(0) else {
        return 0;
    };
    let buf = buf.cast::<u8>();
    let head = StackRecord {
        kind: STACK_RECORD_SAMPLE,
        tgid,
        tid: pid_tgid as u32,
        // SAFETY: helpers without preconditions.
        cpu: unsafe { bpf_get_smp_processor_id() },
        // SAFETY: as above.
        ts_ns: unsafe { bpf_ktime_get_ns() },
        kernel_bytes: 0,
        user_bytes: 0,
        comm: bpf_get_current_comm().unwrap_or_default(),
    };
    // SAFETY: `buf` is this CPU's scratch value, STACK_SCRATCH_BYTES long;
    // each write below stays inside it (the verifier checks it too).
    unsafe {
        let k = bpf_get_stack(
            ctx.as_ptr(),
            buf.add(HEAD).cast(),
            KERNEL_MAX_BYTES as u32,
            0,
        );
        let kernel = if k > 0 {
            (k as usize).min(KERNEL_MAX_BYTES)
        } else {
            0
        };
        let u = bpf_get_stack(
            ctx.as_ptr(),
            buf.add(HEAD + kernel).cast(),
            USER_MAX_BYTES as u32,
            u64::from(BPF_F_USER_STACK | BPF_F_USER_BUILD_ID),
        );
        let user = if u > 0 {
            (u as usize).min(USER_MAX_BYTES)
        } else {
            0
        };
        let rec = buf.cast::<StackRecord>();
        core::ptr::write_unaligned(
            rec,
            StackRecord {
                kernel_bytes: if k < 0 { k as i32 } else { kernel as i32 },
                user_bytes: if u < 0 { u as i32 } else { user as i32 },
                ..head
            },
        );
        let len = HEAD + kernel + user;
        let bytes = core::slice::from_raw_parts(buf, len.min(STACK_SCRATCH_BYTES));
        if SAMPLES.output::<[u8]>(bytes, NO_WAKEUP).is_err() {
            stats.ring_full += 1;
        }
    }
    0
}

/// The record of an exec: which file the process now runs.
#[repr(C)]
struct ExecRecord {
    head: StackRecord,
    path: [u8; STACK_EXEC_PATH_LEN],
}

#[tracepoint(category = "sched", name = "sched_process_exec")]
pub fn wattprof_stack_exec(ctx: TracePointContext) -> u32 {
    let Some(stats) = STATS.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: see `wattprof_stack_sample`.
    let stats = unsafe { &mut *stats };
    let Some(mut entry) = SAMPLES.reserve::<ExecRecord>(0) else {
        stats.exec_lost += 1;
        return 0;
    };
    let pid_tgid = bpf_get_current_pid_tgid();
    // SAFETY: reading a global that userspace sets before load.
    let offset = unsafe { core::ptr::read_volatile(&EXEC_FILENAME_OFFSET) } as usize;
    // SAFETY: the field is in the tracepoint's record; read_at checks it.
    let loc: u32 = unsafe { ctx.read_at(offset) }.unwrap_or(0);
    let rec = entry.as_mut_ptr();
    // SAFETY: `rec` is the reserved record, written whole before submit.
    unsafe {
        (*rec).head = StackRecord {
            kind: STACK_RECORD_EXEC,
            tgid: (pid_tgid >> 32) as u32,
            tid: pid_tgid as u32,
            cpu: bpf_get_smp_processor_id(),
            ts_ns: bpf_ktime_get_ns(),
            kernel_bytes: 0,
            user_bytes: 0,
            comm: bpf_get_current_comm().unwrap_or_default(),
        };
        (*rec).path[0] = 0;
        if loc != 0 {
            let src = ctx.as_ptr().cast::<u8>().add((loc & 0xffff) as usize);
            let _ = bpf_probe_read_kernel_str_bytes(src, &mut (*rec).path);
        }
    }
    entry.submit(NO_WAKEUP);
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
