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
pub(crate) enum Batch<K, V> {
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
pub(crate) fn lookup_batch<K: aya::Pod + Default, V: aya::Pod>(
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
pub(crate) fn map_memlock_bytes(fd: BorrowedFd<'_>) -> Option<u64> {
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", fd.as_raw_fd())).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("memlock:"))
        .and_then(|v| v.trim().parse().ok())
}

const BPF_ITER_CREATE: libc::c_long = 33;

/// A new read of an attached iterator (`BPF_ITER_CREATE` on its link): a
/// file whose reads run the iterator program from the start.
pub(crate) fn iter_create(link: BorrowedFd<'_>) -> std::io::Result<std::fs::File> {
    #[repr(C)]
    struct IterCreateAttr {
        link_fd: u32,
        flags: u32,
    }
    let mut attr = IterCreateAttr {
        link_fd: link.as_raw_fd() as u32,
        flags: 0,
    };
    // SAFETY: the attr is the kernel's `iter_create` struct.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_ITER_CREATE,
            &mut attr as *mut IterCreateAttr,
            std::mem::size_of::<IterCreateAttr>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd, and nothing else owns it.
    Ok(unsafe { <std::fs::File as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}

const BPF_LINK_CREATE: libc::c_long = 28;
const BPF_TRACE_ITER: u32 = 28;

/// Attaches a loaded iterator program (`BPF_LINK_CREATE`): the link every
/// read is created from. aya keeps an iterator link's fd to itself.
pub(crate) fn iter_link_create(prog: BorrowedFd<'_>) -> std::io::Result<std::os::fd::OwnedFd> {
    #[repr(C)]
    struct LinkCreateAttr {
        prog_fd: u32,
        target_fd: u32,
        attach_type: u32,
        flags: u32,
        /// `iter_info`, `iter_info_len` and the other variants: zero.
        rest: [u64; 4],
    }
    let mut attr = LinkCreateAttr {
        prog_fd: prog.as_raw_fd() as u32,
        target_fd: 0,
        attach_type: BPF_TRACE_ITER,
        flags: 0,
        rest: [0; 4],
    };
    // SAFETY: the attr is the kernel's `link_create` struct, zero beyond
    // the fields an iterator uses.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_LINK_CREATE,
            &mut attr as *mut LinkCreateAttr,
            std::mem::size_of::<LinkCreateAttr>(),
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: the kernel just returned this fd, and nothing else owns it.
    Ok(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as i32) })
}
