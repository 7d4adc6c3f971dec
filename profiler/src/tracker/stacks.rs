//! The stack sampler behind `--stacks`: user and kernel stacks of whatever
//! runs on every CPU, at a fixed rate, from wattprof's second eBPF object.
//!
//! The software `cpu-clock` event needs no hardware counter, so this works
//! in VMs. User frames come from the kernel as (build id, file offset)
//! pairs, resolved while the process was alive; a frame the kernel could
//! not resolve (no build id, anonymous memory such as JIT code) is an
//! address.

use aya::{
    Ebpf, EbpfLoader,
    maps::{MapData, PerCpuArray, RingBuf},
    programs::{
        PerfEvent, TracePoint,
        perf_event::{PerfEventConfig, PerfEventScope, SamplePolicy, SoftwareEvent},
    },
};
use profiler_common::stacks::{
    STACK_EXEC_PATH_LEN, STACK_RECORD_EXEC, STACK_RECORD_SAMPLE, STACK_USER_FRAME_BYTES,
    StackRecord, StackStats,
};

use super::TrackerError;
use super::load::{attach_err, load_err, map_err, program, raise_memlock_limit, take_map};

static OBJECT: &[u8] = aya::include_bytes_aligned!("../../ebpf/wattprof-stacks.bpf.o");

/// Highest sampling rate accepted: above it the sampler's own cost is no
/// longer small.
pub(crate) const MAX_HZ: u32 = 10_000;

/// `bpf_stack_build_id.status`: the frame was resolved to a file offset.
const BUILD_ID_VALID: i32 = 1;
/// `bpf_stack_build_id.status`: only the address is known.
const BUILD_ID_IP: i32 = 2;

/// One user-space frame as the kernel reported it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum UserFrame {
    /// A file with this build id (zero-padded to 20 bytes), at this file
    /// offset.
    File {
        /// The ELF build id.
        build_id: [u8; 20],
        /// Offset in the file.
        offset: u64,
    },
    /// An address the kernel could not tie to a file (anonymous memory,
    /// a file without build id, a page not in memory).
    Addr(u64),
}

/// One stack sample.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct StackSample {
    /// Process id.
    pub(crate) tgid: u32,
    /// When (`CLOCK_MONOTONIC` ns).
    pub(crate) ts_ns: u64,
    /// The thread's name.
    pub(crate) comm: String,
    /// Kernel frames, innermost first (empty in user mode).
    pub(crate) kernel: Vec<u64>,
    /// User frames, innermost first.
    pub(crate) user: Vec<UserFrame>,
}

/// One exec: the file a process now runs, as the program named it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ExecSeen {
    /// Process id.
    pub(crate) tgid: u32,
    /// The path given to execve (relative to the caller's directory, when
    /// relative).
    pub(crate) path: String,
}

/// What a drain found.
#[derive(Debug, Default)]
pub(crate) struct Drained {
    /// Stack samples, in ring order.
    pub(crate) samples: Vec<StackSample>,
    /// Execs.
    pub(crate) execs: Vec<ExecSeen>,
}

/// The stack sampler, loaded and attached.
pub(crate) struct StackSampler {
    _ebpf: Ebpf,
    ring: RingBuf<MapData>,
    stats: PerCpuArray<MapData, StackStats>,
    hz: u32,
    cpus: usize,
}

impl StackSampler {
    /// Loads the sampler and starts sampling every online CPU `hz` times a
    /// second.
    pub(crate) fn start(hz: u32) -> Result<Self, TrackerError> {
        let missing = crate::privilege::missing_for_ebpf();
        if !missing.is_empty() {
            return Err(TrackerError::Privilege(crate::privilege::ebpf_message(
                &missing,
            )));
        }
        raise_memlock_limit();
        let tracefs = super::tracefs::ensure_mounted()?;
        let filename =
            super::tracefs::field_offset(&tracefs, "sched", "sched_process_exec", "filename")?;
        let online =
            crate::topology::read_cpu_list(std::path::Path::new("/sys/devices/system/cpu/online"))?;
        if let Some(max) = std::fs::read_to_string("/proc/sys/kernel/perf_event_max_sample_rate")
            .ok()
            .and_then(|t| t.trim().parse::<u32>().ok())
            .filter(|max| hz > *max)
        {
            return Err(TrackerError::Load(format!(
                "--stack-hz {hz} is above this kernel's perf_event_max_sample_rate ({max}), \
                 which would throttle the samples: choose {max} or less"
            )));
        }
        let ring_bytes = ring_bytes(hz, online.len());
        let mut ebpf = EbpfLoader::new()
            .override_global("EXEC_FILENAME_OFFSET", &filename, true)
            .map_max_entries("SAMPLES", ring_bytes)
            .load(OBJECT)
            .map_err(|e| load_err("stack sampler: ", e))?;
        let exec: &mut TracePoint = program(&mut ebpf, "wattprof_stack_exec")?;
        exec.load().map_err(attach_err("wattprof_stack_exec"))?;
        exec.attach("sched", "sched_process_exec")
            .map_err(attach_err("wattprof_stack_exec"))?;
        let online =
            crate::topology::read_cpu_list(std::path::Path::new("/sys/devices/system/cpu/online"))?;
        let sample: &mut PerfEvent = program(&mut ebpf, "wattprof_stack_sample")?;
        sample.load().map_err(attach_err("wattprof_stack_sample"))?;
        let period_ns = 1_000_000_000 / u64::from(hz.max(1));
        for cpu in &online {
            sample
                .attach(
                    PerfEventConfig::Software(SoftwareEvent::CpuClock),
                    PerfEventScope::AllProcessesOneCpu { cpu: *cpu },
                    SamplePolicy::Period(period_ns),
                    false,
                )
                .map_err(|e| TrackerError::Attach {
                    program: format!("wattprof_stack_sample on CPU {cpu}"),
                    reason: e.to_string(),
                })?;
        }
        let ring =
            RingBuf::try_from(take_map(&mut ebpf, "SAMPLES")?).map_err(map_err("SAMPLES"))?;
        let stats =
            PerCpuArray::try_from(take_map(&mut ebpf, "STATS")?).map_err(map_err("STATS"))?;
        Ok(Self {
            _ebpf: ebpf,
            ring,
            stats,
            hz,
            cpus: online.len(),
        })
    }

    /// Samples per second per CPU.
    pub(crate) fn hz(&self) -> u32 {
        self.hz
    }

    /// CPUs sampled.
    pub(crate) fn cpus(&self) -> usize {
        self.cpus
    }

    /// Takes every record waiting in the ring.
    pub(crate) fn drain(&mut self, out: &mut Drained) {
        while let Some(item) = self.ring.next() {
            match decode(&item) {
                Some(Record::Sample(s)) => out.samples.push(s),
                Some(Record::Exec(e)) => out.execs.push(e),
                None => {}
            }
        }
    }

    /// The kernel side's counters, summed over CPUs.
    pub(crate) fn stats(&self) -> StackStats {
        let mut sum = StackStats::default();
        if let Ok(values) = self.stats.get(&0, 0) {
            for v in values.iter() {
                sum.samples += v.samples;
                sum.idle += v.idle;
                sum.ring_full += v.ring_full;
                sum.exec_lost += v.exec_lost;
            }
        }
        sum
    }
}

/// The ring's size: a second of samples at `hz` on `cpus` CPUs (2 KiB
/// each, more than a typical stack takes), a power of two between 1 MiB
/// and 256 MiB. It is drained ten times a second.
pub(crate) fn ring_bytes(hz: u32, cpus: usize) -> u32 {
    let want = u64::from(hz) * cpus.max(1) as u64 * 2048;
    want.clamp(1 << 20, 256 << 20)
        .next_power_of_two()
        .min(256 << 20) as u32
}

enum Record {
    Sample(StackSample),
    Exec(ExecSeen),
}

/// One ring record, as the eBPF program laid it out.
fn decode(bytes: &[u8]) -> Option<Record> {
    let head_len = std::mem::size_of::<StackRecord>();
    let head_bytes = bytes.get(..head_len)?;
    // SAFETY: `StackRecord` is plain `#[repr(C)]` integers (every bit
    // pattern valid) and the slice is long enough; read unaligned.
    let head: StackRecord = unsafe { std::ptr::read_unaligned(head_bytes.as_ptr().cast()) };
    let rest = &bytes[head_len..];
    match head.kind {
        STACK_RECORD_EXEC => {
            let path = rest.get(..STACK_EXEC_PATH_LEN.min(rest.len()))?;
            Some(Record::Exec(ExecSeen {
                tgid: head.tgid,
                path: super::comm_to_string(path),
            }))
        }
        STACK_RECORD_SAMPLE => {
            let kernel_len = usize::try_from(head.kernel_bytes).unwrap_or(0);
            let user_len = usize::try_from(head.user_bytes).unwrap_or(0);
            let kernel_bytes = rest.get(..kernel_len)?;
            let user_bytes = rest.get(kernel_len..kernel_len + user_len)?;
            let kernel = kernel_bytes
                .chunks_exact(8)
                .filter_map(|c| c.try_into().ok().map(u64::from_ne_bytes))
                .filter(|ip| *ip != 0)
                .collect();
            let user = user_bytes
                .chunks_exact(STACK_USER_FRAME_BYTES)
                .filter_map(user_frame)
                .collect();
            Some(Record::Sample(StackSample {
                tgid: head.tgid,
                ts_ns: head.ts_ns,
                comm: super::comm_to_string(&head.comm),
                kernel,
                user,
            }))
        }
        _ => None,
    }
}

/// One `struct bpf_stack_build_id`.
fn user_frame(c: &[u8]) -> Option<UserFrame> {
    let status = i32::from_ne_bytes(c.get(0..4)?.try_into().ok()?);
    let build_id: [u8; 20] = c.get(4..24)?.try_into().ok()?;
    let value = u64::from_ne_bytes(c.get(24..32)?.try_into().ok()?);
    match status {
        BUILD_ID_VALID => Some(UserFrame::File {
            build_id,
            offset: value,
        }),
        BUILD_ID_IP if value != 0 => Some(UserFrame::Addr(value)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: u32, kernel: &[u64], user: &[[u8; 32]]) -> Vec<u8> {
        let head = StackRecord {
            kind,
            tgid: 42,
            tid: 43,
            cpu: 1,
            ts_ns: 1_000,
            kernel_bytes: (kernel.len() * 8) as i32,
            user_bytes: (user.len() * 32) as i32,
            comm: *b"burner\0\0\0\0\0\0\0\0\0\0",
        };
        // SAFETY: plain integers, viewed as bytes.
        let mut v = unsafe {
            std::slice::from_raw_parts(
                (&raw const head).cast::<u8>(),
                std::mem::size_of::<StackRecord>(),
            )
        }
        .to_vec();
        for k in kernel {
            v.extend(k.to_ne_bytes());
        }
        for u in user {
            v.extend(u);
        }
        v
    }

    fn frame(status: i32, id: u8, value: u64) -> [u8; 32] {
        let mut f = [0u8; 32];
        f[0..4].copy_from_slice(&status.to_ne_bytes());
        f[4..24].fill(id);
        f[24..32].copy_from_slice(&value.to_ne_bytes());
        f
    }

    #[test]
    fn a_sample_decodes_kernel_then_user_frames_and_skips_empty_ones() {
        let bytes = record(
            STACK_RECORD_SAMPLE,
            &[0xffff_1000, 0xffff_2000],
            &[frame(1, 7, 0x1234), frame(2, 0, 0x7f00), frame(0, 0, 0)],
        );
        let Some(Record::Sample(s)) = decode(&bytes) else {
            panic!("not a sample");
        };
        assert_eq!(s.tgid, 42);
        assert_eq!(s.comm, "burner");
        assert_eq!(s.kernel, vec![0xffff_1000, 0xffff_2000]);
        assert_eq!(
            s.user,
            vec![
                UserFrame::File {
                    build_id: [7; 20],
                    offset: 0x1234
                },
                UserFrame::Addr(0x7f00)
            ]
        );
    }

    #[test]
    fn a_truncated_record_is_ignored_not_misread() {
        let mut bytes = record(STACK_RECORD_SAMPLE, &[1, 2, 3], &[]);
        bytes.truncate(bytes.len() - 4);
        assert!(decode(&bytes).is_none());
        assert!(decode(&bytes[..10]).is_none());
    }

    #[test]
    fn the_ring_holds_a_second_of_samples_within_bounds() {
        assert_eq!(ring_bytes(99, 2), 1 << 20);
        assert_eq!(ring_bytes(99, 64), 16 << 20);
        assert_eq!(ring_bytes(10_000, 512), 256 << 20);
        assert!(ring_bytes(999, 16).is_power_of_two());
    }

    #[test]
    fn an_exec_carries_its_path() {
        let mut bytes = record(STACK_RECORD_EXEC, &[], &[]);
        let mut path = [0u8; STACK_EXEC_PATH_LEN];
        path[..9].copy_from_slice(b"/bin/true");
        bytes.extend(path);
        let Some(Record::Exec(e)) = decode(&bytes) else {
            panic!("not an exec");
        };
        assert_eq!(e.path, "/bin/true");
        assert_eq!(e.tgid, 42);
    }
}
