//! tracefs: finding (or mounting) it, and reading tracepoint record formats.

use std::path::{Path, PathBuf};

use super::TrackerError;

const CANDIDATES: &[&str] = &["/sys/kernel/tracing", "/sys/kernel/debug/tracing"];

/// Returns a mounted tracefs, mounting it at `/sys/kernel/tracing` if none is.
pub fn ensure_mounted() -> Result<PathBuf, TrackerError> {
    if let Some(found) = CANDIDATES
        .iter()
        .map(PathBuf::from)
        .find(|p| p.join("events").is_dir())
    {
        return Ok(found);
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
        return Err(TrackerError::Tracefs(
            std::io::Error::last_os_error().to_string(),
        ));
    }
    Ok(PathBuf::from(CANDIDATES[0]))
}

/// Byte offset of `field` in the record of tracepoint `category/name`.
pub fn field_offset(
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
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    parse_field_offset(&text, field).ok_or_else(|| TrackerError::Format {
        tracepoint: format!("{category}/{name}"),
        reason: format!("no field `{field}` in {}", path.display()),
    })
}

/// Finds `field:<type> <field>;\toffset:N;` in a format description.
pub fn parse_field_offset(format: &str, field: &str) -> Option<u32> {
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
