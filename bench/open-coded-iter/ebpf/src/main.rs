//! Experiment: the per-task cost of `iter/task` against an open-coded task
//! iterator (`bpf_iter_task_new/next/destroy` kfuncs) run once from a
//! cheap iterator (`iter/bpf_map`'s final call), for the same per-task
//! work: the run time loaded, the LAST filter looked up.
#![no_std]
#![no_main]
#![feature(asm_experimental_arch)]

use core::ffi::c_void;

use aya_ebpf::{helpers::bpf_seq_write, macros::map, maps::HashMap};

#[map]
static LAST: HashMap<u64, u64> = HashMap::with_max_entries(65536, 0);

#[unsafe(no_mangle)]
static SUM_EXEC_OFFSET: u64 = 0;

#[repr(C)]
struct IterMeta {
    seq: *mut c_void,
    session_id: u64,
    seq_num: u64,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Count {
    visited: u64,
    changed: u64,
}

static mut COUNT: Count = Count {
    visited: 0,
    changed: 0,
};

#[inline(always)]
fn off() -> usize {
    unsafe { core::ptr::read_volatile(&raw const SUM_EXEC_OFFSET) as usize }
}

/// The per-task work both variants do.
#[inline(always)]
unsafe fn visit(task: *const u8, c: &mut Count) {
    c.visited += 1;
    let sum: u64 = unsafe { core::ptr::read_volatile(task.add(off()).cast::<u64>()) };
    let key = task as u64;
    let known = unsafe { LAST.get(key) }.copied();
    if known != Some(sum) {
        c.changed += 1;
        let _ = LAST.insert(key, sum, 0);
    }
}

#[inline(always)]
unsafe fn finish(seq: *mut c_void, c: &Count) {
    unsafe { bpf_seq_write(seq.cast(), (c as *const Count).cast(), 16) };
}

#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/task")]
pub unsafe extern "C" fn kexp_iter_task(ctx: *mut c_void) -> i32 {
    let ctx = ctx.cast::<*const u8>();
    let meta = unsafe { core::ptr::read_volatile(ctx) }.cast::<IterMeta>();
    let task = unsafe { core::ptr::read_volatile(ctx.add(1)) };
    let seq = unsafe { core::ptr::read_volatile(&raw const (*meta).seq) };
    let seq_num = unsafe { core::ptr::read_volatile(&raw const (*meta).seq_num) };
    let c = unsafe { &mut *(&raw mut COUNT) };
    if seq_num == 0 {
        *c = Count::default();
    }
    if task.is_null() {
        unsafe { finish(seq, c) };
        return 0;
    }
    unsafe { visit(task, c) };
    0
}

// The kfunc calls, as raw instructions: `call` with src_reg 2
// (BPF_PSEUDO_KFUNC_CALL); the imm is a placeholder userspace replaces
// with the kfunc's id in this kernel's BTF before load.
#[inline(always)]
unsafe fn iter_task_new(it: *mut [u64; 3], flags: u64) -> i64 {
    let ret: i64;
    unsafe {
        core::arch::asm!(
            ".8byte 0x7EAD000100002085",
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

#[inline(always)]
unsafe fn iter_task_next(it: *mut [u64; 3]) -> *const u8 {
    let ret: u64;
    unsafe {
        core::arch::asm!(
            ".8byte 0x7EAD000200002085",
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

#[inline(always)]
unsafe fn iter_task_destroy(it: *mut [u64; 3]) {
    unsafe {
        core::arch::asm!(
            ".8byte 0x7EAD000300002085",
            inlateout("r1") it => _,
            lateout("r0") _,
            lateout("r2") _,
            lateout("r3") _,
            lateout("r4") _,
            lateout("r5") _,
        )
    };
}

/// `iter/bpf_map`: its final call (no map) walks every thread with the
/// open-coded iterator.
#[unsafe(no_mangle)]
#[unsafe(link_section = "iter/bpf_map")]
pub unsafe extern "C" fn kexp_open_coded(ctx: *mut c_void) -> i32 {
    let ctx = ctx.cast::<*const u8>();
    let meta = unsafe { core::ptr::read_volatile(ctx) }.cast::<IterMeta>();
    let map = unsafe { core::ptr::read_volatile(ctx.add(1)) };
    let seq = unsafe { core::ptr::read_volatile(&raw const (*meta).seq) };
    if !map.is_null() {
        return 0;
    }
    let mut c = Count::default();
    let mut it = [0u64; 3];
    // BPF_TASK_ITER_ALL_THREADS
    unsafe { iter_task_new(&mut it, 1) };
    loop {
        let task = unsafe { iter_task_next(&mut it) };
        if task.is_null() {
            break;
        }
        unsafe { visit(task, &mut c) };
    }
    unsafe { iter_task_destroy(&mut it) };
    unsafe { finish(seq, &c) };
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[unsafe(link_section = "license")]
#[unsafe(no_mangle)]
static LICENSE: [u8; 4] = *b"GPL\0";
