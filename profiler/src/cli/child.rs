//! Starting the profiled command: finding it, dropping to the sudo user,
//! forwarding signals, and waiting for it.

use std::ffi::{CStr, CString, OsStr, OsString};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::{Arc, Mutex, PoisonError};

use super::{EXIT_CANNOT_EXECUTE, EXIT_NOT_FOUND, Fatal};

/// The user the command runs as, when wattprof drops root for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RunAs {
    /// User id.
    pub(crate) uid: libc::uid_t,
    /// Primary group id.
    pub(crate) gid: libc::gid_t,
    /// Supplementary groups.
    pub(crate) groups: Vec<libc::gid_t>,
    /// Login name, if the user has a passwd entry.
    pub(crate) name: Option<String>,
    /// Home directory, if known.
    pub(crate) home: Option<PathBuf>,
}

/// The user who invoked sudo, from `SUDO_UID`/`SUDO_GID`, unless that is
/// root or the variables are absent.
pub(crate) fn sudo_user(env: impl Fn(&str) -> Option<OsString>) -> Result<Option<RunAs>, Fatal> {
    let parse = |name: &str| -> Result<Option<u32>, Fatal> {
        match env(name) {
            None => Ok(None),
            Some(v) => v
                .to_str()
                .and_then(|s| s.parse().ok())
                .map(Some)
                .ok_or_else(|| {
                    Fatal::profiler(format!(
                        "{name}={v:?} is not a number; unset it or pass --as-root"
                    ))
                }),
        }
    };
    let (Some(uid), Some(gid)) = (parse("SUDO_UID")?, parse("SUDO_GID")?) else {
        return Ok(None);
    };
    if uid == 0 {
        return Ok(None);
    }
    let (name, home) = passwd_entry(uid);
    let groups = match &name {
        Some(n) => group_list(n, gid),
        None => vec![gid],
    };
    Ok(Some(RunAs {
        uid,
        gid,
        groups,
        name,
        home,
    }))
}

fn passwd_entry(uid: libc::uid_t) -> (Option<String>, Option<PathBuf>) {
    let mut buf = vec![0 as libc::c_char; 16 * 1024];
    // SAFETY: zeroed passwd is a valid out-parameter.
    let mut pwd: libc::passwd = unsafe { std::mem::zeroed() };
    let mut result: *mut libc::passwd = std::ptr::null_mut();
    // SAFETY: all pointers are valid for the call; buf outlives the reads.
    let rc = unsafe { libc::getpwuid_r(uid, &mut pwd, buf.as_mut_ptr(), buf.len(), &mut result) };
    if rc != 0 || result.is_null() {
        return (None, None);
    }
    // SAFETY: on success both fields point to NUL-terminated strings in buf.
    let name = unsafe { CStr::from_ptr(pwd.pw_name) }
        .to_string_lossy()
        .into_owned();
    // SAFETY: as above.
    let home = PathBuf::from(OsStr::from_bytes(
        unsafe { CStr::from_ptr(pwd.pw_dir) }.to_bytes(),
    ));
    (Some(name), Some(home))
}

fn group_list(name: &str, gid: libc::gid_t) -> Vec<libc::gid_t> {
    let Ok(cname) = CString::new(name) else {
        return vec![gid];
    };
    let mut n: libc::c_int = 64;
    loop {
        let mut groups = vec![0 as libc::gid_t; n as usize];
        let mut count = n;
        // SAFETY: groups has room for `count` entries.
        let rc =
            unsafe { libc::getgrouplist(cname.as_ptr(), gid, groups.as_mut_ptr(), &mut count) };
        if rc >= 0 {
            groups.truncate(count.max(0) as usize);
            return groups;
        }
        if count <= n || n > 65_536 {
            return vec![gid];
        }
        n = count;
    }
}

/// Finds the program as `execvp` would, so a bad name fails before the
/// tracker is loaded, with exit code 127 (not found) or 126 (not runnable).
pub(crate) fn resolve_program(program: &OsStr, path_var: Option<&OsStr>) -> Result<PathBuf, Fatal> {
    let shown = Path::new(program).display().to_string();
    let check = |p: &Path| -> Result<Option<PathBuf>, Fatal> {
        match std::fs::metadata(p) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => {
                Ok(Some(p.to_path_buf()))
            }
            Ok(_) => Err(Fatal {
                code: EXIT_CANNOT_EXECUTE,
                message: format!(
                    "cannot execute {}: not an executable file (check its permissions)",
                    p.display()
                ),
            }),
            Err(_) => Ok(None),
        }
    };
    if program.as_bytes().contains(&b'/') {
        return check(Path::new(program))?.ok_or_else(|| Fatal {
            code: EXIT_NOT_FOUND,
            message: format!("command not found: {shown} (no such file)"),
        });
    }
    let path_var = path_var.unwrap_or(OsStr::new("/usr/local/bin:/usr/bin:/bin"));
    let mut not_executable = None;
    for dir in std::env::split_paths(path_var) {
        let candidate = dir.join(program);
        match check(&candidate) {
            Ok(Some(found)) => return Ok(found),
            Ok(None) => {}
            Err(e) => not_executable = Some(e),
        }
    }
    Err(not_executable.unwrap_or_else(|| Fatal {
        code: EXIT_NOT_FOUND,
        message: format!(
            "command not found: {shown} (not in PATH; under sudo, PATH is sudo's secure_path: give the full path)"
        ),
    }))
}

/// Starts the command, as `run_as` when given, with `env` added to its
/// environment.
pub(crate) fn spawn(
    program: &Path,
    args: &[OsString],
    run_as: Option<&RunAs>,
    env: &[(&str, &std::ffi::OsStr)],
) -> Result<Child, Fatal> {
    let mut cmd = Command::new(program);
    cmd.args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    // The command gets none of wattprof's capabilities: where wattprof
    // runs as a user with ambient CAP_BPF and friends (the systemd unit),
    // they would otherwise pass on through exec.
    // SAFETY: one prctl between fork and exec, async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            crate::privilege::clear_ambient();
            Ok(())
        });
    }
    if let Some(user) = run_as {
        if let Some(home) = &user.home {
            cmd.env("HOME", home);
        }
        if let Some(name) = &user.name {
            cmd.env("USER", name).env("LOGNAME", name);
        }
        let user = user.clone();
        // SAFETY: only async-signal-safe syscalls between fork and exec.
        unsafe {
            cmd.pre_exec(move || {
                if libc::setgroups(user.groups.len(), user.groups.as_ptr()) != 0
                    || libc::setgid(user.gid) != 0
                    || libc::setuid(user.uid) != 0
                {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    cmd.spawn().map_err(|e| Fatal {
        code: if e.kind() == std::io::ErrorKind::NotFound {
            EXIT_NOT_FOUND
        } else {
            EXIT_CANNOT_EXECUTE
        },
        message: format!("cannot start {}: {e}", program.display()),
    })
}

/// A pollable handle that becomes readable when the child exits.
pub(crate) fn pidfd(pid: u32) -> Option<OwnedFd> {
    // SAFETY: pidfd_open takes a pid and flags.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0) };
    // SAFETY: a new fd we own.
    (fd >= 0).then(|| unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The shell convention: the exit code, or 128 + the signal that killed it.
pub(crate) fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|s| 128 + s))
        .unwrap_or(1)
}

/// Where forwarded signals go: the command once started; until then a
/// signal is held and delivered as soon as it starts.
#[derive(Debug, Default)]
pub(crate) struct SignalTarget {
    state: Mutex<(i32, Option<i32>)>,
}

impl SignalTarget {
    fn lock(&self) -> std::sync::MutexGuard<'_, (i32, Option<i32>)> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The command started as `pid`: deliver a held signal now.
    pub(crate) fn started(&self, pid: u32) {
        let mut state = self.lock();
        state.0 = pid as i32;
        if let Some(sig) = state.1.take() {
            // SAFETY: kill with a pid we started.
            unsafe { libc::kill(state.0, sig) };
        }
    }

    /// The command was reaped: its pid may be reused, stop forwarding.
    pub(crate) fn ended(&self) {
        *self.lock() = (-1, None);
    }

    fn deliver(&self, sig: i32, sender: Option<i32>) {
        let mut state = self.lock();
        match state.0 {
            0 => state.1 = Some(sig),
            pid if pid > 0 && sender != Some(pid) => {
                // SAFETY: kill with a pid we started and have not reaped.
                unsafe { libc::kill(pid, sig) };
            }
            _ => {}
        }
    }
}

/// Forwards SIGINT, SIGTERM and SIGHUP sent to wattprof to the child.
///
/// Signals the terminal sends to the whole foreground group (Ctrl-C) have
/// already reached the child and are not sent twice; signals the child
/// sends to wattprof are not sent back.
pub(crate) fn forward_signals(target: Arc<SignalTarget>) -> std::io::Result<()> {
    use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
    use signal_hook::iterator::{SignalsInfo, exfiltrator::WithOrigin};
    use signal_hook::low_level::siginfo::Cause;
    let mut signals = SignalsInfo::<WithOrigin>::new([SIGINT, SIGTERM, SIGHUP])?;
    std::thread::Builder::new()
        .name("wattprof-signals".into())
        .spawn(move || {
            for origin in signals.forever() {
                if !matches!(origin.cause, Cause::Kernel) {
                    target.deliver(origin.signal, origin.process.map(|p| p.pid));
                }
            }
        })?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::process::ExitStatusExt;

    #[test]
    fn a_signal_before_the_command_starts_is_delivered_when_it_does() {
        let target = SignalTarget::default();
        target.deliver(libc::SIGTERM, None);
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        target.started(child.id());
        let status = child.wait().expect("wait");
        assert_eq!(status.signal(), Some(libc::SIGTERM));
    }

    #[test]
    fn signals_from_the_command_itself_or_after_it_ended_are_not_forwarded() {
        let target = SignalTarget::default();
        let mut child = Command::new("sleep").arg("30").spawn().expect("sleep");
        target.started(child.id());
        target.deliver(libc::SIGTERM, Some(child.id() as i32));
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "not sent back"
        );
        target.deliver(libc::SIGKILL, None);
        assert_eq!(child.wait().expect("wait").signal(), Some(libc::SIGKILL));
        target.ended();
        target.deliver(libc::SIGKILL, None); // must not signal a reused pid
    }

    #[test]
    fn sudo_variables() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(v))
            }
        };
        assert_eq!(sudo_user(env(&[])).expect("none"), None);
        assert_eq!(
            sudo_user(env(&[("SUDO_UID", "0"), ("SUDO_GID", "0")])).expect("root"),
            None
        );
        let err = sudo_user(env(&[("SUDO_UID", "x"), ("SUDO_GID", "1")])).expect_err("bad");
        assert!(err.message.contains("SUDO_UID"), "{}", err.message);
        let user = sudo_user(env(&[("SUDO_UID", "65534"), ("SUDO_GID", "65534")]))
            .expect("ok")
            .expect("a user");
        assert_eq!((user.uid, user.gid), (65534, 65534));
        assert!(user.groups.contains(&65534), "{:?}", user.groups);
    }

    #[test]
    fn exit_codes_follow_the_shell() {
        assert_eq!(exit_code(ExitStatus::from_raw(7 << 8)), 7);
        assert_eq!(exit_code(ExitStatus::from_raw(libc::SIGKILL)), 137);
    }
}
