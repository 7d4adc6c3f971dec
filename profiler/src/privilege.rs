//! The Linux capabilities wattprof uses, and errors that name the one
//! missing and what needs it.
//!
//! wattprof does not need root: on Linux 5.8+ it runs as any user with
//!
//! | capability | needed for |
//! | --- | --- |
//! | `CAP_BPF` | loading the eBPF programs and their maps |
//! | `CAP_PERFMON` | tracing programs, tracepoints and perf events (stack samples, the perf `power` PMU) |
//! | `CAP_DAC_READ_SEARCH` | root-only files: tracefs (tracepoint formats and ids), RAPL's `energy_uj` (root-only since CVE-2020-8694), `/dev/cpu/*/msr` |
//! | `CAP_SYS_PTRACE` | `/proc/PID/maps` and executables of other users' processes, for `--stacks` |
//! | `CAP_SYS_RAWIO` | the MSR reader only (the `msr` driver checks it) |
//!
//! Linux before 5.8 has no `CAP_BPF` or `CAP_PERFMON`: `CAP_SYS_ADMIN`
//! stands in for both. Before 5.11, BPF maps count against
//! RLIMIT_MEMLOCK: raise it (systemd `LimitMEMLOCK=infinity`) or add
//! `CAP_SYS_RESOURCE`.

use caps::{CapSet, Capability};

/// Whether the effective set holds `cap`.
pub(crate) fn has(cap: Capability) -> bool {
    caps::has_cap(None, CapSet::Effective, cap).unwrap_or(false)
}

/// The capabilities loading eBPF programs needs that the process lacks
/// (`CAP_SYS_ADMIN` covers both, as on kernels before 5.8).
pub(crate) fn missing_for_ebpf() -> Vec<&'static str> {
    if has(Capability::CAP_SYS_ADMIN) {
        return Vec::new();
    }
    [
        (Capability::CAP_BPF, "CAP_BPF"),
        (Capability::CAP_PERFMON, "CAP_PERFMON"),
    ]
    .into_iter()
    .filter(|(c, _)| !has(*c))
    .map(|(_, name)| name)
    .collect()
}

/// Whether system-wide perf events may be opened (`CAP_PERFMON`, or
/// `CAP_SYS_ADMIN`; `perf_event_paranoid` -1 lets anyone).
#[cfg(test)]
pub(crate) fn may_perf_system_wide() -> bool {
    has(Capability::CAP_PERFMON)
        || has(Capability::CAP_SYS_ADMIN)
        || std::fs::read_to_string("/proc/sys/kernel/perf_event_paranoid")
            .ok()
            .and_then(|t| t.trim().parse::<i32>().ok())
            .is_some_and(|p| p < 0)
}

/// The hint for a root-only file that could not be read: root, or
/// `CAP_DAC_READ_SEARCH`.
pub(crate) fn read_hint() -> &'static str {
    if has(Capability::CAP_DAC_READ_SEARCH) || has(Capability::CAP_DAC_OVERRIDE) {
        "even with CAP_DAC_READ_SEARCH (is it mounted read-only elsewhere, or blocked by an LSM?)"
    } else {
        "it is readable by root only: run wattprof as root, or grant it CAP_DAC_READ_SEARCH"
    }
}

/// The line for a program that may not load its eBPF programs.
pub(crate) fn ebpf_message(missing: &[&str]) -> String {
    format!(
        "missing {}: loading wattprof's eBPF programs needs CAP_BPF and CAP_PERFMON \
         (CAP_SYS_ADMIN before Linux 5.8); run it as root (sudo), or grant CAP_BPF, \
         CAP_PERFMON and CAP_DAC_READ_SEARCH (docs/deployment.md: Least privilege)",
        missing.join(" and ")
    )
}

/// Drops every ambient capability, so a command `wattprof run` starts
/// does not inherit wattprof's (call in the child before `exec`).
/// Async-signal-safe: one `prctl`.
pub(crate) fn clear_ambient() {
    // SAFETY: prctl with integer arguments; no memory is passed.
    unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_message_names_what_is_missing_and_what_to_grant() {
        let m = ebpf_message(&["CAP_BPF"]);
        assert!(m.starts_with("missing CAP_BPF: loading"), "{m}");
        assert!(
            m.contains("CAP_DAC_READ_SEARCH") && m.contains("sudo"),
            "{m}"
        );
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } == 0 && has(Capability::CAP_SYS_ADMIN) {
            assert!(missing_for_ebpf().is_empty());
            assert!(may_perf_system_wide());
        }
    }
}
