//! The few `bpf(2)` calls aya does not wrap: batch map lookups, and the
//! kernel's own account of a map's memory.

use std::os::fd::{AsRawFd, BorrowedFd};

const BPF_MAP_LOOKUP_BATCH: libc::c_long = 24;

#[repr(C)]
#[derive(Default)]
struct BatchAttr {
    in_batch: u64,
    out_batch: u64,
    keys: u64,
    values: u64,
    count: u32,
    map_fd: u32,
    elem_flags: u64,
    flags: u64,
}

/// Outcome of a batch read.
pub enum Batch<K, V> {
    /// Every entry, read in `calls` syscalls.
    Read {
        /// Entries.
        entries: Vec<(K, V)>,
        /// Syscalls made.
        calls: u32,
    },
    /// The kernel has no batch operations for this map (before Linux 5.6).
    Unsupported,
}

/// Reads every entry of a hash map with `BPF_MAP_LOOKUP_BATCH`, `chunk`
/// entries per call.
///
/// `K` and `V` must be the map's exact key and value types (`Pod`).
pub fn lookup_batch<K: aya::Pod + Default, V: aya::Pod>(
    fd: BorrowedFd<'_>,
    chunk: u32,
    zero: V,
) -> std::io::Result<Batch<K, V>> {
    let mut chunk = chunk.max(1);
    let mut entries = Vec::new();
    let mut keys: Vec<K> = Vec::new();
    let mut values: Vec<V> = Vec::new();
    let mut token_in: u64 = 0;
    let mut token_out: u64 = 0;
    let mut first = true;
    let mut calls = 0;
    loop {
        keys.resize(chunk as usize, K::default());
        values.resize(chunk as usize, zero);
        let mut attr = BatchAttr {
            in_batch: if first {
                0
            } else {
                &mut token_in as *mut u64 as u64
            },
            out_batch: &mut token_out as *mut u64 as u64,
            keys: keys.as_mut_ptr() as u64,
            values: values.as_mut_ptr() as u64,
            count: chunk,
            map_fd: fd.as_raw_fd() as u32,
            elem_flags: 0,
            flags: 0,
        };
        // SAFETY: the attr points at buffers of `chunk` keys and values of
        // the map's own types, and at two u64 batch tokens (a hash map's
        // token is a u32 bucket index).
        let rc = unsafe {
            libc::syscall(
                libc::SYS_bpf,
                BPF_MAP_LOOKUP_BATCH,
                &mut attr as *mut BatchAttr,
                std::mem::size_of::<BatchAttr>(),
            )
        };
        calls += 1;
        let err = (rc < 0).then(std::io::Error::last_os_error);
        match err.as_ref().and_then(|e| e.raw_os_error()) {
            None | Some(libc::ENOENT) => {
                let n = attr.count as usize;
                entries.extend(keys.drain(..n).zip(values.drain(..n)));
                if err.is_some() {
                    return Ok(Batch::Read { entries, calls });
                }
                token_in = token_out;
                first = false;
            }
            // A bucket holds more entries than fit: retry it with room.
            Some(libc::ENOSPC) => chunk = chunk.saturating_mul(2),
            Some(libc::EINVAL) | Some(libc::ENOTSUP) | Some(524) if first => {
                return Ok(Batch::Unsupported);
            }
            _ => return Err(err.unwrap_or_else(std::io::Error::last_os_error)),
        }
    }
}

/// The kernel's `memlock` figure for a map, from `/proc/self/fdinfo`.
pub fn map_memlock_bytes(fd: BorrowedFd<'_>) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
}
