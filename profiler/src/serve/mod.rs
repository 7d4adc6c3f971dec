//! The daemon's socket (`monitor --serve`): any user's program may ask the
//! running session to follow its process tree (an unprivileged `wattprof
//! run`) or to measure a window of its code, and is answered with the
//! figures the session already sums (`profile::served`).
//!
//! A Unix stream socket; each request is one line of text, each answer one
//! line of JSON. Clients are known by the kernel's peer credentials
//! (`SO_PEERCRED`) taken when they connect, never by what they say; who
//! may see what is `access`. Every client's state is bounded (lines,
//! pending output, trees, windows, requests a second), and goes when its
//! connection closes.
//!
//! Requests (`id=N` anywhere on a line is echoed in its answer as `"id"`):
//!
//! - `follow [pid=N] [children] [intervals]`: follow N's tree (default:
//!   the client's own process; `children`: its descendants, not itself).
//!   Answered at once; the tree's figures so far come after every interval
//!   (`{"progress": [...]}`), and with `intervals` the interval's record of
//!   the tree (`{"interval": {...}, "pid": N}`, its processes' rows).
//! - `finish pid=N`: stop following N; answered after the next interval
//!   closes with the tree's run document (`{"run": {...}}`).
//! - `begin NAME [pid=N]`, `end NAME [pid=N]`: a window (default: the
//!   client's process); `end` is answered after the next interval with
//!   the window's figures (`{"window": {...}}`).
//! - `status`: what the client holds (an admin: every client).
//!
//! A refusal is `{"error": "..."}` with the request's id.

mod access;
mod conn;

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};

use access::{Bucket, MIN_USER_SPAN_NS, Peer, Standing};
use conn::Conn;

use crate::hash::IntMap;
use crate::model::RunReport;
use crate::model::unread::{Read, writing};
use crate::profile::Profile;
use crate::profile::served::ClientId;
use crate::profile::windows;

/// Where the daemon listens by default, and `run` looks for it.
pub(crate) const DEFAULT_PATH: &str = "/run/wattprof/wattprof.sock";

/// Connections at once, all users.
const MAX_CONNECTIONS: usize = 1024;
/// Connections at once per unprivileged user.
const MAX_CONNECTIONS_PER_UID: usize = 32;
/// Trees an unprivileged user may follow at once.
const MAX_FOLLOWS_PER_UID: usize = 16;
/// Windows an unprivileged user may have open at once.
const MAX_WINDOWS_PER_UID: usize = 64;
/// Requests waiting for the next interval, per connection.
const MAX_DEFERRED_PER_CONN: usize = 128;
/// Refusals over the rate answered one by one per connection and wake-up;
/// the rest get one line together.
const MAX_REFUSALS_PER_WAKE: usize = 64;

/// The answer to requests over the rate.
fn rate_refusal(n: usize) -> serde_json::Value {
    let e = if n == 1 {
        format!(
            "rate limit: at most {} requests a second per user (docs/shared.md)",
            access::RATE_PER_S
        )
    } else {
        format!(
            "rate limit: {n} more requests refused (at most {} a second per user)",
            access::RATE_PER_S
        )
    };
    serde_json::json!({ "error": e })
}

/// How the socket is set up.
#[derive(Clone, Debug)]
pub(crate) struct ServeConfig {
    /// The socket's path.
    pub(crate) path: PathBuf,
    /// Only root and this group may connect (the socket is 0660, its group
    /// this one);
    /// `None`: everyone (0666).
    pub(crate) group: Option<u32>,
    /// Members may measure any process.
    pub(crate) admin_group: Option<u32>,
    /// Where processes are looked up (`/proc`).
    pub(crate) proc: PathBuf,
}

/// A group's id from its name (or a number).
pub(crate) fn group_id(name: &str) -> Result<u32, String> {
    if let Ok(gid) = name.parse::<u32>() {
        return Ok(gid);
    }
    let c = std::ffi::CString::new(name).map_err(|_| format!("group `{name}`: not a name"))?;
    // SAFETY: a valid C string; getgrnam's result is read at once, before
    // any other call that could reuse its buffer.
    let g = unsafe { libc::getgrnam(c.as_ptr()) };
    if g.is_null() {
        return Err(format!(
            "no group `{name}` (create it: groupadd {name}; or give a gid)"
        ));
    }
    // SAFETY: non-null, points at a struct group.
    Ok(unsafe { (*g).gr_gid })
}

/// Who asks: the connection, its peer and standing, and when.
#[derive(Clone, Copy)]
struct Asker {
    conn: ClientId,
    peer: Peer,
    standing: Standing,
    now_ns: u64,
}

/// A request waiting for the next interval.
#[derive(Debug)]
struct Deferred {
    conn: ClientId,
    id: Option<u64>,
    /// The session's last tick when it came: it is answered after a later
    /// one.
    after_ns: u64,
    what: Later,
}

#[derive(Debug)]
enum Later {
    End(windows::Command),
    Finish(u32),
}

/// The listening socket and its clients.
pub(crate) struct Server {
    listener: OwnedFd,
    cfg: ServeConfig,
    conns: Vec<Conn>,
    next_id: ClientId,
    buckets: IntMap<u32, Bucket>,
    deferred: Vec<Deferred>,
    /// Connections refused (over the limits, or not in `--serve-group`).
    pub(crate) refused: u64,
}

impl Server {
    /// Binds the socket (its folder made 0755 if missing; a stale socket
    /// from a daemon that died is replaced, a live one is not).
    pub(crate) fn bind(cfg: ServeConfig) -> Result<Self, String> {
        use std::os::unix::fs::PermissionsExt;
        let path = &cfg.path;
        let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
        if let Some(dir) = dir
            && !dir.exists()
        {
            std::fs::create_dir_all(dir)
                .and_then(|()| {
                    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))
                })
                .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        }
        if path.exists() {
            if std::os::unix::net::UnixStream::connect(path).is_ok() {
                return Err(format!(
                    "{} is served by another daemon (stop it, or give --serve another path)",
                    path.display()
                ));
            }
            std::fs::remove_file(path)
                .map_err(|e| format!("cannot replace {}: {e}", path.display()))?;
        }
        let listener = std::os::unix::net::UnixListener::bind(path)
            .map_err(|e| format!("cannot listen on {}: {e}", path.display()))?;
        listener
            .set_nonblocking(true)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let mode = if let Some(gid) = cfg.group {
            std::os::unix::fs::chown(path, None, Some(gid))
                .map_err(|e| format!("cannot give {} to group {gid}: {e}", path.display()))?;
            0o660
        } else {
            0o666
        };
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
            .map_err(|e| format!("{}: {e}", path.display()))?;
        Ok(Self {
            listener: listener.into(),
            cfg,
            conns: Vec::new(),
            next_id: 1,
            buckets: IntMap::default(),
            deferred: Vec::new(),
            refused: 0,
        })
    }

    /// The socket's path.
    pub(crate) fn path(&self) -> &Path {
        &self.cfg.path
    }

    /// Files to wake on: the listener, then each connection.
    pub(crate) fn fds(&self) -> Vec<RawFd> {
        std::iter::once(self.listener.as_raw_fd())
            .chain(self.conns.iter().filter(|c| c.readable()).map(Conn::fd))
            .collect()
    }

    /// After a wake-up: `ready` as [`Server::fds`]. New clients are taken,
    /// waiting lines handled, closed connections forgotten (with all they
    /// held), and pending answers written.
    pub(crate) fn woke(&mut self, ready: &[bool], profile: &mut Profile, now_ns: u64) {
        // The connections polled, in the order `fds` gave them.
        let was: Vec<ClientId> = self
            .conns
            .iter()
            .filter(|c| c.readable())
            .map(Conn::id)
            .collect();
        if ready.first() == Some(&true) {
            self.accept(now_ns);
        }
        for (i, id) in was.iter().enumerate() {
            if ready.get(i + 1) != Some(&true) {
                continue;
            }
            let Some(at) = self.conns.iter().position(|c| c.id() == *id) else {
                continue;
            };
            let lines = self.conns[at].read_lines();
            // Over the rate, the first refusals are answered one by one
            // and the rest together: a flood costs one line each, not
            // one answer each.
            let mut limited = 0usize;
            for line in lines {
                if !self.within_rate(at, &line, now_ns, profile) {
                    limited += 1;
                    if limited <= MAX_REFUSALS_PER_WAKE {
                        let (id, _) = split_id(&line);
                        self.conns[at].answer(id, rate_refusal(1));
                    }
                    continue;
                }
                self.handle(at, &line, profile, now_ns);
            }
            if limited > MAX_REFUSALS_PER_WAKE {
                self.conns[at].answer(None, rate_refusal(limited - MAX_REFUSALS_PER_WAKE));
            }
        }
        self.flush_and_reap(profile);
    }

    /// After an interval closed: the requests waiting for it answered, and
    /// each followed tree's figures so far sent to its client.
    pub(crate) fn after_interval(&mut self, profile: &mut Profile) {
        let tick = profile.last_tick_ns();
        // Each streamed tree's interval first: a tree finished now has its
        // last interval before its document.
        let read = profile.read();
        #[derive(serde::Serialize)]
        struct Streamed<'a> {
            interval: &'a crate::model::record::IntervalRecord,
            pid: u32,
        }
        for c in &mut self.conns {
            for (pid, record) in profile.serve_records(c.id()) {
                // The tree's rows, the domains read as the session's.
                writing(read, || {
                    c.line(&Streamed {
                        interval: &record,
                        pid,
                    });
                });
            }
        }
        let mut waiting = Vec::new();
        for d in std::mem::take(&mut self.deferred) {
            if d.after_ns >= tick {
                waiting.push(d);
                continue;
            }
            let Some(at) = self.conns.iter().position(|c| c.id() == d.conn) else {
                continue;
            };
            let user = self.conns[at].standing == Standing::User;
            let answer = match &d.what {
                Later::End(cmd) => {
                    let begun = profile.serve_window_begin(d.conn, &cmd.name, cmd.pid);
                    if user && begun.is_some_and(|b| tick.saturating_sub(b) < MIN_USER_SPAN_NS) {
                        waiting.push(d);
                        continue;
                    }
                    match profile.serve_window(d.conn, cmd.clone(), user, 0) {
                        Ok(Some(w)) => {
                            // Domains with no reader are null, never 0.
                            let read = Read::of_window(profile.read(), &w);
                            let w = writing(read, || serde_json::to_value(&w)).unwrap_or_default();
                            serde_json::json!({ "window": w })
                        }
                        Ok(None) => continue,
                        Err(e) => serde_json::json!({ "error": e }),
                    }
                }
                Later::Finish(pid) => {
                    let span_short = profile
                        .serve_progress(d.conn)
                        .iter()
                        .any(|p| p.pid == *pid && p.span_ns < MIN_USER_SPAN_NS);
                    if user && span_short {
                        waiting.push(d);
                        continue;
                    }
                    match profile.serve_finish(d.conn, *pid, &self.cfg.path.to_string_lossy()) {
                        Some(run) => {
                            let run = writing(run.read(), || serde_json::to_value(&run))
                                .unwrap_or_default();
                            serde_json::json!({ "run": run })
                        }
                        None => {
                            serde_json::json!({ "error": format!("pid {pid} is not followed") })
                        }
                    }
                }
            };
            self.conns[at].answer(d.id, answer);
        }
        self.deferred = waiting;
        for c in &mut self.conns {
            let progress = profile.serve_progress(c.id());
            if !progress.is_empty() {
                writing(read, || c.push("progress", &progress));
            }
        }
        self.flush_and_reap(profile);
    }

    /// Writes what is pending; forgets closed and failed connections, and
    /// those whose client closed its side once nothing it waits for is
    /// left.
    fn flush_and_reap(&mut self, profile: &mut Profile) {
        let mut gone = Vec::new();
        let deferred = &self.deferred;
        self.conns.retain_mut(|c| {
            c.flush();
            // Done once nothing it waits for is left unwritten (one that
            // never reads what is written is cut off at MAX_PENDING_OUT:
            // its trees' lines keep coming).
            if c.eof() && !c.pending() && !deferred.iter().any(|d| d.conn == c.id()) {
                c.close();
            }
            if c.closed() {
                gone.push(c.id());
                false
            } else {
                true
            }
        });
        for id in gone {
            profile.serve_drop(id);
            self.deferred.retain(|d| d.conn != id);
        }
    }

    /// Takes every waiting connection, refusing those over the limits.
    fn accept(&mut self, now_ns: u64) {
        loop {
            // SAFETY: accept4 on our listener; no address asked for.
            let fd = unsafe {
                libc::accept4(
                    self.listener.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                )
            };
            if fd < 0 {
                return;
            }
            // SAFETY: a new descriptor we own.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            let Some(peer) = peer_of(&fd) else {
                continue;
            };
            let proc = &self.cfg.proc;
            let standing = access::standing(proc, peer, self.cfg.admin_group);
            let mut conn = Conn::new(fd, self.next_id, peer, standing);
            self.next_id += 1;
            let of_uid = self.conns.iter().filter(|c| c.peer.uid == peer.uid).count();
            let refusal = if !access::may_connect(proc, peer, self.cfg.group) {
                Some("you are not in the daemon's --serve-group".to_string())
            } else if self.conns.len() >= MAX_CONNECTIONS {
                Some(format!(
                    "the daemon serves {MAX_CONNECTIONS} connections already"
                ))
            } else if standing == Standing::User && of_uid >= MAX_CONNECTIONS_PER_UID {
                Some(format!(
                    "uid {} has {MAX_CONNECTIONS_PER_UID} connections open already",
                    peer.uid
                ))
            } else {
                None
            };
            if let Some(why) = refusal {
                self.refused += 1;
                conn.answer(None, serde_json::json!({ "error": why }));
                conn.flush();
                continue;
            }
            self.buckets
                .entry(peer.uid)
                .or_insert_with(|| Bucket::new(now_ns));
            self.conns.push(conn);
        }
    }

    /// Handles one line of connection `at`.
    /// Whether connection `at` may make this request now: an admin always,
    /// a user within the rate (`finish`, which ends what was asked for,
    /// always).
    fn within_rate(&mut self, at: usize, line: &str, now_ns: u64, profile: &Profile) -> bool {
        let c = &self.conns[at];
        if c.standing == Standing::Admin || self.ends_a_follow(c, line, profile) {
            return true;
        }
        self.buckets
            .entry(c.peer.uid)
            .or_insert_with(|| Bucket::new(now_ns))
            .take(now_ns)
    }

    /// Whether `line` is a `finish` of a tree this connection follows and
    /// has not asked to finish yet (the one request the rate never holds
    /// back: it ends what was asked for).
    fn ends_a_follow(&self, c: &Conn, line: &str, profile: &Profile) -> bool {
        let (_, words) = split_id(line);
        if words.first() != Some(&"finish") {
            return false;
        }
        let pid = words[1..]
            .iter()
            .find_map(|w| w.strip_prefix("pid=")?.parse::<u32>().ok())
            .unwrap_or(c.peer.pid);
        profile.serve_follows(c.id(), pid)
            && !self
                .deferred
                .iter()
                .any(|d| d.conn == c.id() && matches!(d.what, Later::Finish(p) if p == pid))
    }

    fn handle(&mut self, at: usize, line: &str, profile: &mut Profile, now_ns: u64) {
        let who = {
            let c = &self.conns[at];
            Asker {
                conn: c.id(),
                peer: c.peer,
                standing: c.standing,
                now_ns,
            }
        };
        let (id, words) = split_id(line);
        let answer = match self.request(who, id, &words, profile) {
            Ok(Some(v)) => v,
            Ok(None) => return,
            Err(e) => serde_json::json!({ "error": e }),
        };
        self.conns[at].answer(id, answer);
    }

    /// One request: its answer now, `None` when it comes after the next
    /// interval, or why it is refused.
    fn request(
        &mut self,
        who: Asker,
        id: Option<u64>,
        words: &[&str],
        profile: &mut Profile,
    ) -> Result<Option<serde_json::Value>, String> {
        let Asker {
            conn,
            peer,
            standing,
            now_ns,
        } = who;
        let proc = self.cfg.proc.clone();
        let pid_of = |words: &[&str]| -> Result<u32, String> {
            let mut pid = peer.pid;
            for w in words {
                match w.strip_prefix("pid=").map(str::parse::<u32>) {
                    Some(Ok(p)) if p > 0 => pid = p,
                    Some(_) => return Err(format!("`{w}`: pid=N with N a process id")),
                    None => {}
                }
            }
            Ok(pid)
        };
        let uid_conns: Vec<ClientId> = self
            .conns
            .iter()
            .filter(|c| c.peer.uid == peer.uid)
            .map(Conn::id)
            .collect();
        let held = profile.serve_held(Some(&uid_conns));
        match words.first().copied() {
            Some("follow") => {
                let children = words[1..].contains(&"children");
                let stream = words[1..].contains(&"intervals");
                if let Some(w) = words[1..]
                    .iter()
                    .find(|w| !matches!(**w, "children" | "intervals") && !w.starts_with("pid="))
                {
                    return Err(format!(
                        "`follow`: unexpected `{w}` (follow [pid=N] [children] [intervals])"
                    ));
                }
                let pid = pid_of(&words[1..])?;
                access::may_touch(&proc, peer, standing, pid)?;
                if standing == Standing::User && held.follows >= MAX_FOLLOWS_PER_UID {
                    return Err(format!(
                        "uid {} follows {MAX_FOLLOWS_PER_UID} trees already",
                        peer.uid
                    ));
                }
                profile.serve_follow(conn, pid, (children, stream), now_ns)?;
                let run = profile.serve_skeleton(conn, pid, &self.cfg.path.to_string_lossy());
                let read = run.as_ref().map_or(Read::NONE, RunReport::read);
                let run = writing(read, || serde_json::to_value(&run)).unwrap_or_default();
                Ok(Some(serde_json::json!({ "following": pid, "run": run })))
            }
            Some("finish") => {
                let pid = pid_of(&words[1..])?;
                if !profile.serve_follows(conn, pid) {
                    return Err(format!("pid {pid} is not followed on this connection"));
                }
                self.defer(conn, id, Later::Finish(pid), profile)?;
                Ok(None)
            }
            Some("begin" | "end") => {
                let cmd = windows::parse(&words.join(" "), peer.pid)?;
                access::may_touch(&proc, peer, standing, cmd.pid)?;
                if cmd.begin {
                    if standing == Standing::User && held.windows >= MAX_WINDOWS_PER_UID {
                        return Err(format!(
                            "uid {} has {MAX_WINDOWS_PER_UID} windows open already",
                            peer.uid
                        ));
                    }
                    profile.serve_window(conn, cmd, standing == Standing::User, now_ns)?;
                    return Ok(Some(serde_json::json!({ "begun": true })));
                }
                if profile
                    .serve_window_begin(conn, &cmd.name, cmd.pid)
                    .is_none()
                {
                    return Err(format!(
                        "`end {}` with no open window of that name and pid on this connection",
                        cmd.name
                    ));
                }
                self.defer(conn, id, Later::End(cmd), profile)?;
                Ok(None)
            }
            Some("status") => Ok(Some(self.status(
                standing,
                peer,
                held,
                uid_conns.len(),
                profile,
            ))),
            Some(other) => Err(format!(
                "unknown request `{}` (follow, finish, begin, end, status)",
                other.escape_debug()
            )),
            None => Err("empty request".to_string()),
        }
    }

    /// What a client holds (an admin: every client).
    fn status(
        &self,
        standing: Standing,
        peer: Peer,
        held: crate::profile::served::Held,
        uid_conns: usize,
        profile: &Profile,
    ) -> serde_json::Value {
        let all = standing == Standing::Admin;
        let held = if all { profile.serve_held(None) } else { held };
        serde_json::json!({
            "status": held,
            "connections": if all { self.conns.len() } else { uid_conns },
            "admin": all,
            "uid": peer.uid,
            "refused_connections": if all { self.refused } else { 0 },
        })
    }

    fn defer(
        &mut self,
        conn: ClientId,
        id: Option<u64>,
        what: Later,
        profile: &Profile,
    ) -> Result<(), String> {
        if self.deferred.iter().filter(|d| d.conn == conn).count() >= MAX_DEFERRED_PER_CONN {
            return Err(format!(
                "{MAX_DEFERRED_PER_CONN} requests wait for the next interval on this connection"
            ));
        }
        self.deferred.push(Deferred {
            conn,
            id,
            after_ns: profile.last_tick_ns(),
            what,
        });
        Ok(())
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.cfg.path);
    }
}

/// The request's `id=N`, and its other words.
fn split_id(line: &str) -> (Option<u64>, Vec<&str>) {
    let mut id = None;
    let words = line
        .split_whitespace()
        .filter(|w| match w.strip_prefix("id=").map(str::parse::<u64>) {
            Some(Ok(n)) => {
                id = Some(n);
                false
            }
            _ => true,
        })
        .collect();
    (id, words)
}

/// The connected process, as the kernel tells it.
fn peer_of(fd: &OwnedFd) -> Option<Peer> {
    // SAFETY: ucred is plain data; zero is a valid start.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: a live socket and a buffer of the size given.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&raw mut cred).cast(),
            &mut len,
        )
    };
    (rc == 0 && cred.pid > 0).then_some(Peer {
        pid: cred.pid as u32,
        uid: cred.uid,
        gid: cred.gid,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_id_is_taken_from_anywhere_on_the_line() {
        assert_eq!(split_id("end x id=7"), (Some(7), vec!["end", "x"]));
        assert_eq!(split_id("id=3 status"), (Some(3), vec!["status"]));
        assert_eq!(split_id("status id=x"), (None, vec!["status", "id=x"]));
        assert_eq!(split_id(""), (None, vec![]));
    }
}
