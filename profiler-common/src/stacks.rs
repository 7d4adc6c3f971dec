//! The stack sampler's shared types (`profiler-ebpf/src/stacks.rs`, read
//! by `profiler/src/tracker/stacks.rs`).

use crate::COMM_LEN;
/// Deepest kernel stack a stack sample keeps (`PERF_MAX_STACK_DEPTH`).
pub const STACK_MAX_KERNEL_FRAMES: usize = 127;

/// Deepest user stack a stack sample keeps (`PERF_MAX_STACK_DEPTH`).
pub const STACK_MAX_USER_FRAMES: usize = 127;

/// Bytes of one user frame: the kernel's `struct bpf_stack_build_id`
/// (`status: i32`, `build_id: [u8; 20]`, then the file offset, or the
/// address where no build id was found).
pub const STACK_USER_FRAME_BYTES: usize = 32;

/// `StackRecord::kind` of a stack sample.
pub const STACK_RECORD_SAMPLE: u32 = 1;

/// `StackRecord::kind` of an exec (the file that was executed follows).
pub const STACK_RECORD_EXEC: u32 = 2;

/// Longest exec file name the stack sampler reports (with the NUL).
pub const STACK_EXEC_PATH_LEN: usize = 256;

/// Size of the stack sampler's ring buffer by default (a power of two).
pub const STACK_RING_BYTES: u32 = 8 << 20;

/// The fixed head of every record of the stack sampler's ring buffer.
///
/// A sample is followed by `kernel_bytes` of kernel frames (addresses,
/// `u64` each) and then `user_bytes` of user frames
/// (`STACK_USER_FRAME_BYTES` each). An exec is followed by a
/// NUL-terminated path of `STACK_EXEC_PATH_LEN` bytes.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackRecord {
    /// `STACK_RECORD_*`.
    pub kind: u32,
    /// Process (thread group) id.
    pub tgid: u32,
    /// Thread id.
    pub tid: u32,
    /// CPU the sample was taken on.
    pub cpu: u32,
    /// `bpf_ktime_get_ns()` when it was taken.
    pub ts_ns: u64,
    /// Bytes of kernel frames that follow; negative: the helper's error.
    pub kernel_bytes: i32,
    /// Bytes of user frames that follow the kernel frames; negative: the
    /// helper's error.
    pub user_bytes: i32,
    /// The thread's name.
    pub comm: [u8; COMM_LEN],
}

/// Size of the stack sampler's per-CPU scratch buffer: a record with the
/// deepest stacks.
pub const STACK_SCRATCH_BYTES: usize = core::mem::size_of::<StackRecord>()
    + STACK_MAX_KERNEL_FRAMES * 8
    + STACK_MAX_USER_FRAMES * STACK_USER_FRAME_BYTES;

/// The stack sampler's counters, one per CPU: nothing is dropped uncounted.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StackStats {
    /// Samples of a task (not the idle task) taken.
    pub samples: u64,
    /// Samples of the idle task (not reported).
    pub idle: u64,
    /// Samples lost because the ring buffer was full.
    pub ring_full: u64,
    /// Exec records lost because the ring buffer was full.
    pub exec_lost: u64,
}
