//! Who may see what, decided in one place from what the kernel says about
//! a client (`SO_PEERCRED`) and about the processes it names
//! (`/proc/PID/status`), never from what the client says.
//!
//! - Root, and members of `--serve-admin-group`, may follow and window
//!   any process, and get the machine's figures with a window.
//! - Everyone else may follow and window only processes whose real and
//!   effective uid are their own (a setuid program they started is not
//!   theirs), gets no machine or package figures, gets figures over at
//!   least [`MIN_USER_SPAN_NS`] of whole intervals, and at most
//!   [`RATE_PER_S`] requests a second (docs/shared.md, "The RAPL side
//!   channel").

use std::path::Path;

/// A client, as the kernel names it when it connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Peer {
    /// Its process.
    pub(crate) pid: u32,
    /// Its user.
    pub(crate) uid: u32,
    /// Its primary group.
    pub(crate) gid: u32,
}

/// The shortest span an unprivileged client gets figures for: energy read
/// faster than this is what Platypus (CVE-2020-8694) used.
pub(crate) const MIN_USER_SPAN_NS: u64 = 1_000_000_000;

/// Requests a second an unprivileged user may make (all connections
/// together), after a burst of [`BURST`].
pub(crate) const RATE_PER_S: f64 = 20.0;

/// Requests an unprivileged user may make at once.
pub(crate) const BURST: f64 = 40.0;

/// The real and effective uid, and the supplementary groups, of a process
/// (`/proc/PID/status` under `proc`); `None` when it is gone.
pub(crate) fn credentials(proc: &Path, pid: u32) -> Option<(u32, u32, Vec<u32>)> {
    let text = std::fs::read_to_string(proc.join(pid.to_string()).join("status")).ok()?;
    let mut uids = None;
    let mut groups = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("Uid:") {
            let mut ids = rest.split_whitespace().map(str::parse::<u32>);
            uids = Some((ids.next()?.ok()?, ids.next()?.ok()?));
        } else if let Some(rest) = line.strip_prefix("Groups:") {
            groups = rest
                .split_whitespace()
                .filter_map(|g| g.parse().ok())
                .collect();
        }
    }
    uids.map(|(real, effective)| (real, effective, groups))
}

/// The supplementary groups of the client's process, when that process is
/// still the client's: a pid reused by another user's process since the
/// client connected gives none.
fn peer_groups(proc: &Path, peer: Peer) -> Vec<u32> {
    match credentials(proc, peer.pid) {
        Some((real, effective, groups)) if real == peer.uid && effective == peer.uid => groups,
        _ => Vec::new(),
    }
}

/// What a client may do.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Standing {
    /// Root or the admin group: any process, machine figures, no limits
    /// but the daemon's.
    Admin,
    /// Its own processes, whole intervals of at least a second, no
    /// machine figures, rate-limited.
    User,
}

/// The standing of `peer`: root, or a member of `admin_gid` (its primary
/// group, or a supplementary one the kernel lists for its process), is an
/// admin.
pub(crate) fn standing(proc: &Path, peer: Peer, admin_gid: Option<u32>) -> Standing {
    if peer.uid == 0 {
        return Standing::Admin;
    }
    let Some(gid) = admin_gid else {
        return Standing::User;
    };
    let in_group = peer.gid == gid || peer_groups(proc, peer).contains(&gid);
    if in_group {
        Standing::Admin
    } else {
        Standing::User
    }
}

/// Whether `peer` may be served at all (`--serve-group`: root and the
/// group's members only; the socket's mode says so too).
pub(crate) fn may_connect(proc: &Path, peer: Peer, group: Option<u32>) -> bool {
    match group {
        None => true,
        Some(_) if peer.uid == 0 => true,
        Some(gid) => peer.gid == gid || peer_groups(proc, peer).contains(&gid),
    }
}

/// Whether `peer` of `standing` may follow or window process `pid`: one
/// line why not.
pub(crate) fn may_touch(
    proc: &Path,
    peer: Peer,
    standing: Standing,
    pid: u32,
) -> Result<(), String> {
    let Some((real, effective, _)) = credentials(proc, pid) else {
        return Err(format!("no process {pid}"));
    };
    if standing == Standing::Admin || (real == peer.uid && effective == peer.uid) {
        return Ok(());
    }
    Err(format!(
        "process {pid} is not yours (uid {real}): only root and the daemon's admin group may \
         measure other users' processes"
    ))
}

/// A token bucket: [`RATE_PER_S`] a second, [`BURST`] at once.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bucket {
    tokens: f64,
    at_ns: u64,
}

impl Bucket {
    /// A full bucket at `now_ns`.
    pub(crate) fn new(now_ns: u64) -> Self {
        Self {
            tokens: BURST,
            at_ns: now_ns,
        }
    }

    /// Takes one request at `now_ns`: `false` when over the rate.
    pub(crate) fn take(&mut self, now_ns: u64) -> bool {
        let dt = now_ns.saturating_sub(self.at_ns) as f64 / 1e9;
        self.at_ns = self.at_ns.max(now_ns);
        self.tokens = (self.tokens + dt * RATE_PER_S).min(BURST);
        if self.tokens >= 1.0 {
            self.tokens -= 1.0;
            true
        } else {
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status(dir: &Path, pid: u32, uid: &str, groups: &str) {
        let d = dir.join(pid.to_string());
        std::fs::create_dir_all(&d).expect("dir");
        std::fs::write(
            d.join("status"),
            format!("Name:\tx\nUid:\t{uid}\nGid:\t100\t100\t100\t100\nGroups:\t{groups}\n"),
        )
        .expect("write");
    }

    #[test]
    fn a_user_may_touch_only_processes_whose_real_and_effective_uid_are_theirs() {
        let dir = tempfile::tempdir().expect("tmp");
        let proc = dir.path();
        status(proc, 10, "1000\t1000\t1000\t1000", "");
        status(proc, 11, "1001\t1001\t1001\t1001", "");
        // A setuid program the user started: effective uid 0.
        status(proc, 12, "1000\t0\t0\t0", "");
        let me = Peer {
            pid: 10,
            uid: 1000,
            gid: 100,
        };
        assert_eq!(may_touch(proc, me, Standing::User, 10), Ok(()));
        let other = may_touch(proc, me, Standing::User, 11).expect_err("not theirs");
        assert!(other.contains("not yours (uid 1001)"), "{other}");
        assert!(may_touch(proc, me, Standing::User, 12).is_err());
        assert!(may_touch(proc, me, Standing::User, 99).is_err_and(|e| e.contains("no process")));
        assert_eq!(may_touch(proc, me, Standing::Admin, 11), Ok(()));
    }

    #[test]
    fn admins_are_root_and_the_admin_group_from_the_kernel_lists() {
        let dir = tempfile::tempdir().expect("tmp");
        let proc = dir.path();
        status(proc, 20, "1000\t1000\t1000\t1000", "27 500");
        let peer = Peer {
            pid: 20,
            uid: 1000,
            gid: 100,
        };
        assert_eq!(standing(proc, peer, None), Standing::User);
        assert_eq!(standing(proc, peer, Some(500)), Standing::Admin);
        assert_eq!(standing(proc, peer, Some(501)), Standing::User);
        assert_eq!(
            standing(proc, peer, Some(100)),
            Standing::Admin,
            "primary group"
        );
        // The pid now another user's process: its groups are not the
        // client's.
        let reused = Peer {
            uid: 1001,
            gid: 101,
            ..peer
        };
        assert_eq!(standing(proc, reused, Some(500)), Standing::User);
        let root = Peer { uid: 0, ..peer };
        assert_eq!(standing(proc, root, None), Standing::Admin);
        assert!(may_connect(proc, peer, Some(27)));
        assert!(!may_connect(proc, peer, Some(28)));
        assert!(may_connect(proc, root, Some(28)));
        assert!(may_connect(proc, peer, None));
    }

    #[test]
    fn the_bucket_allows_a_burst_then_the_rate() {
        let mut b = Bucket::new(0);
        let burst = (0..1000).filter(|_| b.take(0)).count();
        assert_eq!(burst, BURST as usize);
        // One second later: RATE_PER_S more, not a new burst.
        let later = (0..1000).filter(|_| b.take(1_000_000_000)).count();
        assert_eq!(later, RATE_PER_S as usize);
        // A clock that goes back gives nothing.
        assert!(!b.take(500_000_000));
    }
}
