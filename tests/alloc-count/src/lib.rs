//! Counts a process's heap allocations: loaded with `LD_PRELOAD`, it
//! stands in front of glibc's `malloc`, `calloc`, `realloc`,
//! `posix_memalign`, `aligned_alloc` and `memalign`, counts each call,
//! and hands it to glibc's own (`__libc_*`, which glibc exports for
//! exactly this). Any binary is measured as it is, a baseline build too.
//!
//! At exit it writes `allocations <N>\nfrees <N>\n` to `$ALLOC_COUNT_FILE.PID`
//! (nothing without the variable; the pid, because children inherit the
//! preload too). A `realloc` counts as an allocation (a grown buffer is
//! one), and the free inside a moving `realloc` is not counted: `frees` is
//! not `allocations`' counterpart. `cargo xtask bench allocs`
//! runs `wattprof monitor` for two lengths and divides the difference by
//! the intervals between them: the steady state's allocations per
//! interval, start-up taken out.

use std::ffi::{c_int, c_void};
use std::sync::atomic::{AtomicU64, Ordering};

unsafe extern "C" {
    fn __libc_malloc(size: usize) -> *mut c_void;
    fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
    fn __libc_realloc(ptr: *mut c_void, size: usize) -> *mut c_void;
    fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    fn __libc_free(ptr: *mut c_void);
}

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);
static FREES: AtomicU64 = AtomicU64::new(0);

fn counted() {
    ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
}

/// `malloc(3)`, counted.
///
/// # Safety
/// As glibc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn malloc(size: usize) -> *mut c_void {
    counted();
    // SAFETY: the caller's contract is malloc's.
    unsafe { __libc_malloc(size) }
}

/// `calloc(3)`, counted.
///
/// # Safety
/// As glibc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    counted();
    // SAFETY: the caller's contract is calloc's.
    unsafe { __libc_calloc(n, size) }
}

/// `realloc(3)`, counted as an allocation (a grown buffer is one).
///
/// # Safety
/// As glibc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn realloc(ptr: *mut c_void, size: usize) -> *mut c_void {
    counted();
    // SAFETY: the caller's contract is realloc's.
    unsafe { __libc_realloc(ptr, size) }
}

/// `memalign(3)`, counted.
///
/// # Safety
/// As glibc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    counted();
    // SAFETY: the caller's contract is memalign's.
    unsafe { __libc_memalign(align, size) }
}

/// `aligned_alloc(3)`, counted.
///
/// # Safety
/// As glibc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    counted();
    // SAFETY: the caller's contract is aligned_alloc's.
    unsafe { __libc_memalign(align, size) }
}

/// `posix_memalign(3)` (Rust's allocator uses it past 16-byte
/// alignment), counted.
///
/// # Safety
/// As glibc's: `out` is writable.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    counted();
    if !align.is_power_of_two() || !align.is_multiple_of(std::mem::size_of::<*mut c_void>()) {
        return libc_einval();
    }
    // SAFETY: the alignment is checked as posix_memalign requires.
    let p = unsafe { __libc_memalign(align, size) };
    if p.is_null() && size != 0 {
        return 12; // ENOMEM
    }
    // SAFETY: the caller gives a writable pointer.
    unsafe { out.write(p) };
    0
}

fn libc_einval() -> c_int {
    22
}

/// `free(3)`, counted.
///
/// # Safety
/// As glibc's.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn free(ptr: *mut c_void) {
    if !ptr.is_null() {
        FREES.fetch_add(1, Ordering::Relaxed);
    }
    // SAFETY: the caller's contract is free's.
    unsafe { __libc_free(ptr) }
}

/// Writes the counts at exit (run by the dynamic loader's `.fini_array`).
extern "C" fn report() {
    let Some(mut path) = std::env::var_os("ALLOC_COUNT_FILE") else {
        return;
    };
    path.push(format!(".{}", std::process::id()));
    let text = format!(
        "allocations {}\nfrees {}\n",
        ALLOCATIONS.load(Ordering::Relaxed),
        FREES.load(Ordering::Relaxed)
    );
    let _ = std::fs::write(path, text);
}

#[used]
#[unsafe(link_section = ".fini_array")]
static REPORT: extern "C" fn() = report;
