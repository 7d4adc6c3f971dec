//! Loading the object and attaching each tracker's programs: the
//! iterator tracker where it loads (or is asked for), else the switch
//! tracker, each with its maps set up and its starting point taken.

use std::os::fd::{AsFd, OwnedFd};

use aya::{
    Ebpf, EbpfLoader,
    maps::{Array, Map, MapData, PerCpuArray, PerCpuValues, RingBuf},
    programs::{Iter, ProgramError, RawTracePoint, TracePoint},
};
use profiler_common::iter::{ITER_RING_BYTES, KernelOffsets};
use profiler_common::{CPU_FLAG_SWITCH_OPENS, CpuState};

use super::{
    EbpfTracker, ExitTracking, KernelLog, OBJECT, SkipEvent, TaskClock, TaskWalkChoice,
    TrackerChoice, TrackerConfig, walk,
};
use crate::topology::Topology;
use crate::tracker::load::{attach_err, load_err, map_err, program, raise_memlock_limit, take_map};
use crate::tracker::{
    TrackerError,
    iter::{IterState, Walk},
    monotonic_ns,
    switch::ThreadLedger,
    sys::{self},
    tracefs,
};

/// The smallest ring (a page): for a ring a tracker does not use.
const MIN_RING_BYTES: u32 = 4096;

impl EbpfTracker {
    /// Loads and attaches the programs of the tracker `cfg` asks for
    /// (with `auto`, the iterator where it loads, else the switch tracker)
    /// and takes the starting point of every thread.
    pub(crate) fn start(cfg: &TrackerConfig) -> Result<Self, TrackerError> {
        let missing = crate::privilege::missing_for_ebpf();
        if !missing.is_empty() {
            return Err(TrackerError::Privilege(crate::privilege::ebpf_message(
                &missing,
            )));
        }
        raise_memlock_limit();
        let topology = Topology::read(&cfg.sys)?;
        let tracefs = tracefs::ensure_mounted()?;
        let child_pid_offset =
            tracefs::field_offset(&tracefs, "sched", "sched_process_fork", "child_pid")?;
        // The switch path's test switches mean the switch tracker.
        let choice = if cfg.force_exit_tracepoint || cfg.force_switch_timing {
            TrackerChoice::Switch
        } else {
            cfg.tracker
        };
        if choice == TrackerChoice::Switch {
            if cfg.task_walk == TaskWalkChoice::OpenCoded {
                return Err(TrackerError::Load(
                    "--task-walk open-coded is the iterator tracker's: use --tracker iter".into(),
                ));
            }
            return Self::start_switch(cfg, topology, child_pid_offset, None);
        }
        let why_not = match crate::tracker::btf::running_kernel() {
            _ if in_child_pid_namespace() => {
                "wattprof runs in a child PID namespace, where the task \
                 iterator sees only that namespace's threads (run it in the host's: hostPID)"
                    .to_string()
            }
            None => "this kernel has no BTF (/sys/kernel/btf/vmlinux)".to_string(),
            Some(btf) => match btf.kernel_offsets() {
                Err(missing) => format!("this kernel's BTF has no {missing}"),
                Ok(offsets) => {
                    let walk = match cfg.task_walk {
                        TaskWalkChoice::IterTask => Err("--task-walk iter-task".to_string()),
                        _ => walk::kfunc_ids(
                            &std::fs::read_to_string("/proc/sys/kernel/osrelease")
                                .unwrap_or_default(),
                            |name| btf.func_id(name),
                        ),
                    };
                    match Self::start_iter(cfg, topology.clone(), child_pid_offset, offsets, walk) {
                        Ok(tracker) => return Ok(tracker),
                        Err(e @ TrackerError::Privilege(_)) => return Err(e),
                        // Asked for by name: its own error, no fallback.
                        Err(e) if cfg.task_walk == TaskWalkChoice::OpenCoded => return Err(e),
                        Err(e) => e.to_string(),
                    }
                }
            },
        };
        if cfg.task_walk == TaskWalkChoice::OpenCoded {
            return Err(TrackerError::Load(format!(
                "the open-coded task walk cannot run here: {why_not}"
            )));
        }
        if choice == TrackerChoice::Iter {
            return Err(TrackerError::Load(format!(
                "the iterator tracker cannot run here: {why_not} (use --tracker switch)"
            )));
        }
        Self::start_switch(cfg, topology, child_pid_offset, Some(why_not))
    }

    fn load(loader: &mut EbpfLoader<'_>, object: &[u8]) -> Result<Ebpf, TrackerError> {
        loader.load(object).map_err(|e| load_err("", e))
    }

    /// The fields both trackers fill alike.
    fn assemble(
        mut ebpf: Ebpf,
        topology: Topology,
        exit_tracking: ExitTracking,
        task_clock: TaskClock,
    ) -> Result<Self, TrackerError> {
        let mut cpus = take_map(&mut ebpf, "CPUS")?;
        init_cpus(&mut cpus, &topology, 0)?;
        let tasks = take_map(&mut ebpf, "TASKS")?;
        let events =
            RingBuf::try_from(take_map(&mut ebpf, "EVENTS")?).map_err(map_err("EVENTS"))?;
        let mut epoch_map = take_map(&mut ebpf, "EPOCH")?;
        write_epoch(&mut epoch_map, 1)?;
        let active =
            RingBuf::try_from(take_map(&mut ebpf, "ACTIVE")?).map_err(map_err("ACTIVE"))?;
        let sockets = topology.packages();
        let log = KernelLog::default();
        let kernel_log = aya_log::EbpfLogger::init_with_logger(&mut ebpf, log.clone())
            .ok()
            .map(|l| (l, log));
        Ok(Self {
            ebpf,
            kernel_log,
            cpus,
            tasks,
            events,
            epoch_map,
            active,
            announced: Vec::new(),
            carried: Vec::new(),
            epoch: 1,
            samples: 0,
            prev: vec![CpuState::default(); topology.possible_cpus()],
            topology,
            ledger: ThreadLedger::new(sockets),
            pending: Vec::new(),
            exit_tracking,
            task_clock,
            flush_supported: true,
            batch_supported: true,
            read_syscalls: 0,
            start_ns: 0,
            idle_debt: Vec::new(),
            forks: crate::tracker::forks::RecentForks::default(),
            closing: false,
            iter: None,
            fallback: None,
            walk_fallback: None,
        })
    }

    /// The iterator tracker: no program on context switches. `kfuncs`:
    /// the open-coded walk's kfunc ids in this kernel, or why it is not
    /// tried.
    fn start_iter(
        cfg: &TrackerConfig,
        topology: Topology,
        child_pid_offset: u32,
        offsets: KernelOffsets,
        kfuncs: Result<[u32; 3], String>,
    ) -> Result<Self, TrackerError> {
        let possible = topology.possible_cpus().max(1) as u32;
        // The walk's kfunc calls, patched into a copy of the object.
        let patched = kfuncs.and_then(|ids| walk::patch_kfuncs(OBJECT, ids));
        let object: &[u8] = patched.as_deref().unwrap_or(OBJECT);
        let ring_bytes = if patched.is_ok() {
            cfg.task_walk_ring.unwrap_or(ITER_RING_BYTES)
        } else {
            MIN_RING_BYTES
        };
        let mut ebpf = Self::load(
            EbpfLoader::new()
                .override_global("FORK_CHILD_PID_OFFSET", &child_pid_offset, true)
                .override_global("SUM_EXEC_OFFSET", &offsets.sum_exec, true)
                .override_global("KERNEL_OFFSETS", &offsets, true)
                .override_global("ITER_MODE", &1u32, true)
                .map_max_entries("TASKS", 1)
                .map_max_entries("ACTIVE", 4096)
                .map_max_entries("LAST", cfg.max_tasks.max(1))
                .map_max_entries("CPU_PACKAGE", possible)
                .map_max_entries("ITER_RING", ring_bytes),
            object,
        )?;
        let mut package = take_map(&mut ebpf, "CPU_PACKAGE")?;
        {
            let mut view = Array::<&mut MapData, u32>::try_from(&mut package)
                .map_err(map_err("CPU_PACKAGE"))?;
            for (cpu, socket) in topology.package_of_cpu.iter().enumerate() {
                view.set(cpu as u32, *socket, 0)
                    .map_err(map_err("CPU_PACKAGE"))?;
            }
        }
        let last = take_map(&mut ebpf, "LAST")?;
        let control = take_map(&mut ebpf, "ITER_CONTROL")?;
        let read_state = take_map(&mut ebpf, "ITER_READ")?;

        let (link, walk, walk_fallback) = attach_walks(&mut ebpf, cfg, patched.map(|_| ()))?;
        if cfg.skip_event != Some(SkipEvent::Exit) {
            attach_raw(&mut ebpf, "wattprof_thread_exit", "sched_process_exit")?;
        }
        if cfg.skip_event != Some(SkipEvent::Free) {
            attach_raw(&mut ebpf, "wattprof_thread_free", "sched_process_free")?;
        }
        // A move between packages is a checkpoint; on one package there
        // is nothing to split.
        if topology.packages() > 1 {
            attach_raw(&mut ebpf, "wattprof_thread_migrate", "sched_migrate_task")?;
        }
        attach_raw(&mut ebpf, "wattprof_cgroup_attach", "cgroup_attach_task")?;
        for (prog, name) in [
            ("wattprof_sched_process_fork", "sched_process_fork"),
            ("wattprof_sched_process_exec", "sched_process_exec"),
        ] {
            attach_tracepoint(&mut ebpf, prog, name)?;
        }

        let mut tracker = Self::assemble(
            ebpf,
            topology,
            ExitTracking::FreeEvent,
            TaskClock::SumExecRuntime,
        )?;
        tracker.prev = tracker.read_cpus()?;
        let state = IterState::new(
            link,
            walk,
            last,
            control,
            package,
            read_state,
            &tracker.topology,
            monotonic_ns(),
        );
        tracker.iter = Some(state);
        tracker.walk_fallback = walk_fallback;
        Ok(tracker)
    }

    /// The iterator tracker's starting point: a full read, applied but not
    /// closed, so time after it belongs to the first interval.
    pub(super) fn begin_iter(&mut self, at_read: &mut dyn FnMut()) -> Result<u64, TrackerError> {
        let Some(state) = self.iter.as_mut() else {
            return Err(TrackerError::Load("no iterator".into()));
        };
        // Threads born from here on count from zero.
        state.set_baseline(monotonic_ns());
        let began = state.read(true, at_read)?;
        // As in every sample: the walk's start, right after the counters
        // were read, is the interval boundary.
        let at_ns = state.walk_at();
        self.drain_events();
        if let Some(state) = self.iter.as_mut() {
            state.apply(began, at_ns);
            state.start_window(at_ns);
        }
        Ok(at_ns)
    }

    /// The switch tracker. Accounting starts on each CPU at its first
    /// event; a flush right after attaching opens every online CPU.
    fn start_switch(
        cfg: &TrackerConfig,
        topology: Topology,
        child_pid_offset: u32,
        fallback: Option<String>,
    ) -> Result<Self, TrackerError> {
        let sum_exec_offset = if cfg.force_switch_timing {
            0
        } else {
            crate::tracker::btf::sum_exec_runtime_offset().unwrap_or(0)
        };
        let task_clock = if sum_exec_offset == 0 {
            TaskClock::SwitchTiming
        } else {
            TaskClock::SumExecRuntime
        };
        let mut ebpf = Self::load(
            EbpfLoader::new()
                .override_global("FORK_CHILD_PID_OFFSET", &child_pid_offset, true)
                .override_global("SUM_EXEC_OFFSET", &sum_exec_offset, true)
                .map_max_entries("TASKS", cfg.max_tasks.max(1))
                .map_max_entries("LAST", 1)
                .map_max_entries("ITER_RING", MIN_RING_BYTES),
            OBJECT,
        )?;
        // The iterator's walk ring: not this tracker's; freed.
        drop(take_map(&mut ebpf, "ITER_RING")?);
        let exit_tracking = attach_switch(&mut ebpf, cfg.force_exit_tracepoint)?;
        for (prog, name) in [
            ("wattprof_sched_process_fork", "sched_process_fork"),
            ("wattprof_sched_process_exec", "sched_process_exec"),
        ] {
            attach_tracepoint(&mut ebpf, prog, name)?;
        }
        let flush: &mut RawTracePoint = program(&mut ebpf, "wattprof_flush")?;
        flush.load().map_err(attach_err("wattprof_flush"))?;

        let mut tracker = Self::assemble(ebpf, topology, exit_tracking, task_clock)?;
        tracker.fallback = fallback;
        Ok(tracker)
    }

    /// The switch tracker's starting point: a flush opens every online
    /// CPU's window.
    pub(super) fn begin_switch(&mut self, at_read: &mut dyn FnMut()) -> Result<u64, TrackerError> {
        at_read();
        self.flush_cpus();
        if !self.flush_supported {
            // Before Linux 5.10: nothing is open yet; let switches open.
            init_cpus(&mut self.cpus, &self.topology, CPU_FLAG_SWITCH_OPENS)?;
        }
        // Every counter starts at zero when its window opens, so the first
        // sample counts from the opening flush for CPUs and tasks alike.
        self.prev = self
            .read_cpus()?
            .into_iter()
            .map(|c| CpuState {
                first_ns: c.first_ns,
                last_ns: c.first_ns,
                socket: c.socket,
                flags: c.flags,
                ..CpuState::default()
            })
            .collect();
        Ok(self
            .prev
            .iter()
            .map(|c| c.first_ns)
            .filter(|t| *t > 0)
            .min()
            .unwrap_or_else(monotonic_ns))
    }
}

pub(super) fn write_epoch(map: &mut Map, epoch: u64) -> Result<(), TrackerError> {
    let mut view = Array::<&mut MapData, u64>::try_from(map).map_err(map_err("EPOCH"))?;
    view.set(0, epoch, 0).map_err(map_err("EPOCH"))
}

fn init_cpus(cpus: &mut Map, topology: &Topology, flags: u32) -> Result<(), TrackerError> {
    let mut view =
        PerCpuArray::<&mut MapData, CpuState>::try_from(cpus).map_err(map_err("CPUS"))?;
    let values: Vec<CpuState> = topology
        .package_of_cpu
        .iter()
        .map(|s| CpuState {
            socket: *s,
            flags,
            ..CpuState::default()
        })
        .collect();
    let values = PerCpuValues::try_from(values).map_err(|e| TrackerError::Map {
        map: "CPUS",
        reason: e.to_string(),
    })?;
    view.set(0, values, 0).map_err(map_err("CPUS"))
}

fn attach_switch(ebpf: &mut Ebpf, force_legacy: bool) -> Result<ExitTracking, TrackerError> {
    if !force_legacy {
        let prog = "wattprof_sched_switch";
        let p: &mut RawTracePoint = program(ebpf, prog)?;
        p.load().map_err(attach_err(prog))?;
        // Before 5.18 sched_switch has three arguments and the kernel
        // refuses a program reading the fourth: fall back.
        if p.attach("sched_switch").is_ok() {
            return Ok(ExitTracking::FinalSwitch);
        }
    }
    attach_raw(ebpf, "wattprof_sched_switch_legacy", "sched_switch")?;
    attach_tracepoint(ebpf, "wattprof_sched_process_exit", "sched_process_exit")?;
    Ok(ExitTracking::ExitTracepoint)
}

/// The iterator tracker's walks: `iter/task`, attached (its link, which
/// every read is created from), and the open-coded walk where `patched`
/// says its kfunc calls were written in and it loads, else why not (an
/// error where `--task-walk open-coded` asked for it).
fn attach_walks(
    ebpf: &mut Ebpf,
    cfg: &TrackerConfig,
    patched: Result<(), String>,
) -> Result<(OwnedFd, Option<Walk>, Option<String>), TrackerError> {
    let btf = aya::Btf::from_sys_fs().map_err(|e| TrackerError::Load(e.to_string()))?;
    let prog = "wattprof_iter_task";
    let iter: &mut Iter = program(ebpf, prog)?;
    iter.load("task", &btf).map_err(attach_err(prog))?;
    let prog_fd = iter.fd().map_err(attach_err(prog))?;
    let link = sys::iter_link_create(prog_fd.as_fd()).map_err(|e| TrackerError::Attach {
        program: prog.into(),
        reason: e.to_string(),
    })?;
    // Taken either way: where the walk does not load, its ring is
    // dropped here, and the kernel frees it (no program uses it).
    let ring = take_map(ebpf, "ITER_RING")?;
    match patched.and_then(|()| attach_walk(ebpf, &btf, ring)) {
        Ok(walk) => Ok((link, Some(walk), None)),
        Err(why) if cfg.task_walk == TaskWalkChoice::OpenCoded => Err(TrackerError::Load(format!(
            "the open-coded task walk cannot run here: {why} (use --task-walk auto)"
        ))),
        Err(why) => Ok((link, None, Some(why))),
    }
}

/// The open-coded walk, loaded (the verifier checks it here) and attached
/// as an `iter/bpf_map` iterator; or why not, in a line.
fn attach_walk(ebpf: &mut Ebpf, btf: &aya::Btf, ring: Map) -> Result<Walk, String> {
    let prog = "wattprof_iter_walk";
    let iter: &mut Iter = program(ebpf, prog).map_err(|e| e.to_string())?;
    if let Err(e) = iter.load("bpf_map", btf) {
        return Err(match e {
            ProgramError::LoadError {
                io_error,
                verifier_log,
            } => {
                // The log ends with statistics; the refusal is the last
                // line before them.
                let stats = ["processed ", "verification time", "stack depth"];
                let last = verifier_log
                    .to_string()
                    .lines()
                    .rev()
                    .map(str::trim)
                    .find(|l| !l.is_empty() && !stats.iter().any(|s| l.starts_with(s)))
                    .unwrap_or_default()
                    .to_string();
                format!("the verifier refused {prog} ({io_error}): {last}")
            }
            other => format!("{prog}: {other}"),
        });
    }
    let attached = iter
        .fd()
        .map_err(|e| format!("{prog}: {e}"))
        .and_then(|fd| sys::iter_link_create(fd.as_fd()).map_err(|e| format!("{prog}: {e}")))
        .and_then(|link| {
            let ring = RingBuf::try_from(ring).map_err(|e| format!("ITER_RING: {e}"))?;
            Ok(Walk { link, ring })
        });
    if attached.is_err() {
        // Unloaded, so the ring it holds is freed with it.
        let _ = iter.unload();
    }
    attached
}

fn attach_raw(ebpf: &mut Ebpf, prog: &str, tracepoint: &str) -> Result<(), TrackerError> {
    let p: &mut RawTracePoint = program(ebpf, prog)?;
    p.load().map_err(attach_err(prog))?;
    p.attach(tracepoint).map_err(attach_err(prog))?;
    Ok(())
}

fn attach_tracepoint(ebpf: &mut Ebpf, prog: &str, name: &str) -> Result<(), TrackerError> {
    let p: &mut TracePoint = program(ebpf, prog)?;
    p.load().map_err(attach_err(prog))?;
    p.attach("sched", name).map_err(attach_err(prog))?;
    Ok(())
}

/// Whether this process is in a PID namespace below the host's (its
/// `NSpid` lists more than one pid): the task iterator walks only the
/// reader's namespace, while the tracepoints see every thread.
fn in_child_pid_namespace() -> bool {
    std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("NSpid:"))
            .is_some_and(|v| v.split_whitespace().count() > 1)
    })
}
