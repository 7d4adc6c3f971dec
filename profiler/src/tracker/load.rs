//! Loading wattprof's eBPF object and attaching its programs: the one
//! place their failures become [`TrackerError`]s, for the time trackers
//! (`ebpf/`, `iter/`) and the stack sampler (`stacks.rs`) alike.

use aya::Ebpf;
use aya::maps::Map;

use super::TrackerError;

/// The object failed to load: a refusal for want of privilege says what
/// may be blocking `bpf()`; another error says what loaded (`what`, e.g.
/// "stack sampler: ", or nothing for the time tracker), and whether the
/// memlock limit it needs could not be raised.
pub(super) fn load_err(what: &str, e: aya::EbpfError) -> TrackerError {
    if is_permission(&e) {
        TrackerError::Privilege(format!(
            "the kernel refused to load wattprof's eBPF programs ({e}) although it holds \
             CAP_BPF and CAP_PERFMON: is a security module (lockdown, SELinux, seccomp) \
             blocking bpf()?"
        ))
    } else {
        let mut text = format!("{what}{e}");
        // Before Linux 5.11 maps are charged to RLIMIT_MEMLOCK.
        if let Some(why) = MEMLOCK_PROBLEM.get() {
            text.push_str(&format!(" (RLIMIT_MEMLOCK could not be raised: {why})"));
        }
        TrackerError::Load(text)
    }
}

/// A map error, naming the map.
pub(super) fn map_err(map: &'static str) -> impl Fn(aya::maps::MapError) -> TrackerError {
    move |e| TrackerError::Map {
        map,
        reason: e.to_string(),
    }
}

pub(super) fn attach_err(
    program: &str,
) -> impl Fn(aya::programs::ProgramError) -> TrackerError + '_ {
    move |e| TrackerError::Attach {
        program: program.to_string(),
        reason: e.to_string(),
    }
}

/// Whether an error comes from a syscall the kernel refused for want of
/// privilege (EPERM, EACCES), anywhere down its chain of causes.
pub(super) fn is_permission(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cause = Some(e);
    while let Some(err) = cause {
        if let Some(io) = err.downcast_ref::<std::io::Error>()
            && matches!(io.raw_os_error(), Some(libc::EPERM | libc::EACCES))
        {
            return true;
        }
        cause = err.source();
    }
    false
}

pub(super) fn take_map(ebpf: &mut Ebpf, name: &'static str) -> Result<Map, TrackerError> {
    ebpf.take_map(name).ok_or(TrackerError::Map {
        map: name,
        reason: "missing from the object".into(),
    })
}

/// Program `prog` of the object, as its type.
pub(super) fn program<'a, P>(ebpf: &'a mut Ebpf, prog: &str) -> Result<&'a mut P, TrackerError>
where
    &'a mut P: TryFrom<&'a mut aya::programs::Program, Error = aya::programs::ProgramError>,
{
    ebpf.program_mut(prog)
        .ok_or_else(|| TrackerError::Load(format!("{prog} missing")))?
        .try_into()
        .map_err(attach_err(prog))
}

/// Why RLIMIT_MEMLOCK could not be raised, for the load error it may
/// cause.
static MEMLOCK_PROBLEM: std::sync::OnceLock<std::io::Error> = std::sync::OnceLock::new();

/// Kernels before 5.11 charge eBPF maps to RLIMIT_MEMLOCK. A failure is
/// harmless on later kernels; on earlier ones the load error says it.
pub(super) fn raise_memlock_limit() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: valid pointer to an rlimit.
    if unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &unlimited) } != 0 {
        let _ = MEMLOCK_PROBLEM.set(std::io::Error::last_os_error());
    }
}

#[cfg(test)]
mod tests {
    use super::is_permission;

    #[test]
    fn permission_errors_are_found_by_errno_down_the_chain_of_causes() {
        let map = |errno: i32| {
            aya::EbpfError::MapError(aya::maps::MapError::CreateError {
                name: "TASKS".into(),
                io_error: std::io::Error::from_raw_os_error(errno),
            })
        };
        assert!(is_permission(&map(libc::EPERM)));
        assert!(is_permission(&map(libc::EACCES)));
        assert!(!is_permission(&map(libc::ENOMEM)));
        assert!(!is_permission(&std::io::Error::other(
            "EPERM in the text only"
        )));
    }
}
