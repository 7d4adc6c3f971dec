//! tracefs: finding (or mounting) it, and reading tracepoint record formats.

use std::path::{Path, PathBuf};

use super::TrackerError;

const CANDIDATES: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// The mount points of tracefs, from `/proc/self/mountinfo`.
fn mounted() -> Vec<PathBuf> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let (left, right) = l.split_once(" - ")?;
            let point = left.split_whitespace().nth(4)?;
            (right.split_whitespace().next()? == "tracefs").then(|| PathBuf::from(point))
        })
        .collect()
}

/// Returns a mounted tracefs, mounting it at `/sys/kernel/tracing` if none is.
pub(crate) fn ensure_mounted() -> Result<PathBuf, TrackerError> {
    let mounts = mounted();
    if let Some(found) = CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| mounts.contains(p) || p.join("events").is_dir())
    {
        // tracefs is root-only (0700) unless mounted with other modes.
        return match std::fs::read_dir(found.join("events")) {
            Ok(_) => Ok(found),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                Err(TrackerError::Tracefs(format!(
                    "cannot read tracefs at {} (tracepoint formats): {}",
                    found.display(),
                    crate::privilege::read_hint()
                )))
            }
            Err(e) => Err(TrackerError::Tracefs(format!(
                "cannot read tracefs at {}: {e}",
                found.display()
            ))),
        };
    }
    let target = c"/sys/kernel/tracing";
    // SAFETY: NUL-terminated strings; no data argument.
    let rc = unsafe {
        libc::mount(
            c"nodev".as_ptr(),
            target.as_ptr(),
            c"tracefs".as_ptr(),
            0,
            std::ptr::null(),
        )
    };
    if rc != 0 {
        return Err(TrackerError::Tracefs(format!(
            "tracefs is not mounted and mounting it failed ({}): run `mount -t tracefs nodev \
             /sys/kernel/tracing` as root (mounting needs CAP_SYS_ADMIN, which wattprof does \
             not otherwise need)",
            std::io::Error::last_os_error()
        )));
    }
    Ok(PathBuf::from(CANDIDATES[0]))
}

/// Byte offset of `field` in the record of tracepoint `category/name`.
pub(crate) fn field_offset(
    tracefs: &Path,
    category: &str,
    name: &str,
    field: &str,
) -> Result<u32, TrackerError> {
    let path = tracefs
        .join("events")
        .join(category)
        .join(name)
        .join("format");
    let text = std::fs::read_to_string(&path).map_err(|e| TrackerError::Format {
        tracepoint: format!("{category}/{name}"),
        reason: if e.kind() == std::io::ErrorKind::PermissionDenied {
            format!(
                "cannot read {}: {}",
                path.display(),
                crate::privilege::read_hint()
            )
        } else {
            format!("cannot read {}: {e}", path.display())
        },
    })?;
    parse_field_offset(&text, field).ok_or_else(|| TrackerError::Format {
        tracepoint: format!("{category}/{name}"),
        reason: format!("no field `{field}` in {}", path.display()),
    })
}

/// Finds `field:<type> <field>;\toffset:N;` in a format description.
pub(crate) fn parse_field_offset(format: &str, field: &str) -> Option<u32> {
    format.lines().find_map(|line| {
        let mut parts = line.trim().split(';');
        let decl = parts.next()?.strip_prefix("field:")?;
        let name = decl.rsplit(' ').next()?;
        let name = name.split('[').next()?;
        if name != field {
            return None;
        }
        parts
            .map(str::trim)
            .find_map(|p| p.strip_prefix("offset:"))
            .and_then(|v| v.parse().ok())
    })
}

#[cfg(test)]
mod tests {
    use super::parse_field_offset;

    const NEW: &str = "name: sched_process_fork\nID: 366\nformat:\n\
\tfield:unsigned short common_type;\toffset:0;\tsize:2;\tsigned:0;\n\
\tfield:__data_loc char[] parent_comm;\toffset:8;\tsize:4;\tsigned:0;\n\
\tfield:pid_t parent_pid;\toffset:12;\tsize:4;\tsigned:1;\n\
\tfield:__data_loc char[] child_comm;\toffset:16;\tsize:4;\tsigned:0;\n\
\tfield:pid_t child_pid;\toffset:20;\tsize:4;\tsigned:1;\n";

    const OLD: &str = "format:\n\
\tfield:char parent_comm[16];\toffset:8;\tsize:16;\tsigned:1;\n\
\tfield:pid_t parent_pid;\toffset:24;\tsize:4;\tsigned:1;\n\
\tfield:char child_comm[16];\toffset:28;\tsize:16;\tsigned:1;\n\
\tfield:pid_t child_pid;\toffset:44;\tsize:4;\tsigned:1;\n";

    #[test]
    fn offsets_of_both_layouts() {
        assert_eq!(parse_field_offset(NEW, "child_pid"), Some(20));
        assert_eq!(parse_field_offset(OLD, "child_pid"), Some(44));
        assert_eq!(parse_field_offset(OLD, "child_comm"), Some(28));
        assert_eq!(parse_field_offset(NEW, "pid"), None);
    }
}
