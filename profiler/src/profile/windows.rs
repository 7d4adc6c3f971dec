//! Profiling windows: named begin/end regions of a program, Zeus-style,
//! signalled with datagrams on a Unix socket (`WATTPROF_SOCKET`).
//!
//! A message is `begin NAME` or `end NAME`, optionally followed by
//! `pid=N` to name the process whose tree the window belongs to (a shell
//! script sending with `socat` names itself with `pid=$$`); by default it
//! is the sender, which the kernel tells (`SCM_CREDENTIALS`), so no client
//! library is needed. Windows nest and overlap freely; `end NAME` closes
//! the most recent open window of that name and tree.

use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};

use crate::attribution::{ConsumerId, DomainShare, EnergyBy};
use crate::sources::Domain;

/// A window command.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Command {
    /// `true` for begin, `false` for end.
    pub begin: bool,
    /// Window name.
    pub name: String,
    /// Whose tree: `pid=N`, or the sender.
    pub pid: u32,
}

/// Longest window name kept.
const MAX_NAME: usize = 200;

/// Parses one datagram from `sender` (its pid, from the kernel).
pub fn parse(text: &str, sender: u32) -> Result<Command, String> {
    let mut words = text.split_whitespace();
    let verb = words.next().ok_or("empty message")?;
    let begin = match verb {
        "begin" => true,
        "end" => false,
        other => {
            return Err(format!(
                "unknown verb `{other}` (use `begin NAME` or `end NAME`)"
            ));
        }
    };
    let name = words
        .next()
        .ok_or_else(|| format!("`{verb}` without a window name"))?;
    if name.len() > MAX_NAME {
        return Err(format!("window name longer than {MAX_NAME} bytes"));
    }
    let mut pid = sender;
    for w in words {
        match w.strip_prefix("pid=").map(str::parse::<u32>) {
            Some(Ok(p)) if p > 0 => pid = p,
            _ => {
                return Err(format!(
                    "unexpected `{w}` (only `pid=N` may follow the name)"
                ));
            }
        }
    }
    Ok(Command {
        begin,
        name: name.to_string(),
        pid,
    })
}

/// The socket wattprof listens on, in a private directory.
#[derive(Debug)]
pub(crate) struct WindowSocket {
    sock: UnixDatagram,
    dir: PathBuf,
    path: PathBuf,
}

impl WindowSocket {
    /// Binds `windows.sock` in a new directory under `parent`, owned by
    /// `owner` (uid, gid) when the command runs as another user, so that
    /// only the command's user (and root) can send.
    pub(crate) fn bind(parent: &Path, owner: Option<(u32, u32)>) -> std::io::Result<Self> {
        use std::os::unix::fs::PermissionsExt;
        let dir = parent.join(format!("wattprof-{}", std::process::id()));
        // A leftover from a crashed run with the same pid is ours to reuse.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o700))?;
        let path = dir.join("windows.sock");
        let sock = UnixDatagram::bind(&path)?;
        sock.set_nonblocking(true)?;
        let one: libc::c_int = 1;
        // SAFETY: valid socket and option pointer of the right size.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PASSCRED,
                (&one as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(std::io::Error::last_os_error());
        }
        if let Some((uid, gid)) = owner {
            std::os::unix::fs::chown(&dir, Some(uid), Some(gid))?;
            std::os::unix::fs::chown(&path, Some(uid), Some(gid))?;
        }
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600))?;
        Ok(Self { sock, dir, path })
    }

    /// Where programs send to (`WATTPROF_SOCKET`).
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// For poll().
    pub(crate) fn fd(&self) -> RawFd {
        self.sock.as_raw_fd()
    }

    /// Every datagram waiting.
    pub(crate) fn receive(&self) -> Vec<Message> {
        let mut out = Vec::new();
        loop {
            let mut buf = [0u8; 512];
            // SAFETY: sockaddr_un is plain data; zero is a valid start.
            let mut from: libc::sockaddr_un = unsafe { std::mem::zeroed() };
            // Room for one ucred control message.
            let mut cmsg = [0u64; 8];
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            // SAFETY: msghdr is plain data; zero is a valid start.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_name = (&raw mut from).cast();
            msg.msg_namelen = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cmsg.as_mut_ptr().cast();
            msg.msg_controllen = std::mem::size_of_val(&cmsg) as _;
            // SAFETY: msg points at live buffers of the sizes given.
            let n = unsafe {
                libc::recvmsg(
                    self.sock.as_raw_fd(),
                    &mut msg,
                    libc::MSG_DONTWAIT | libc::MSG_CMSG_CLOEXEC,
                )
            };
            if n < 0 {
                break;
            }
            let mut pid = 0u32;
            // SAFETY: walking the control buffer the kernel filled, with
            // the kernel's own macros.
            unsafe {
                let mut c = libc::CMSG_FIRSTHDR(&msg);
                while !c.is_null() {
                    if (*c).cmsg_level == libc::SOL_SOCKET
                        && (*c).cmsg_type == libc::SCM_CREDENTIALS
                    {
                        let cred: libc::ucred = std::ptr::read_unaligned(libc::CMSG_DATA(c).cast());
                        pid = cred.pid as u32;
                    }
                    if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                        // File descriptors a client attached: not ours to
                        // keep (they would pile up in wattprof).
                        let data = libc::CMSG_DATA(c);
                        let len = (*c).cmsg_len as usize - (data as usize - c as usize);
                        for i in 0..len / std::mem::size_of::<libc::c_int>() {
                            let fd: libc::c_int =
                                std::ptr::read_unaligned(data.cast::<libc::c_int>().add(i));
                            libc::close(fd);
                        }
                    }
                    c = libc::CMSG_NXTHDR(&msg, c);
                }
            }
            let text = String::from_utf8_lossy(&buf[..n as usize])
                .trim()
                .to_string();
            // A sender with an address (a bound or autobound socket) can be
            // answered; one that only sends has none.
            let reply_to = (msg.msg_namelen as usize > std::mem::size_of::<libc::sa_family_t>())
                .then_some(ReplyTo {
                    addr: from,
                    len: msg.msg_namelen,
                });
            out.push(Message {
                text,
                pid,
                reply_to,
            });
        }
        out
    }

    /// Answers a message's sender, without waiting: a sender that is gone
    /// or whose queue is full misses its answer, and wattprof goes on.
    pub(crate) fn reply(&self, to: &ReplyTo, payload: &[u8]) -> bool {
        // SAFETY: a live socket; the address and payload are valid for the
        // lengths given.
        let n = unsafe {
            libc::sendto(
                self.sock.as_raw_fd(),
                payload.as_ptr().cast(),
                payload.len(),
                libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                (&raw const to.addr).cast(),
                to.len,
            )
        };
        n == payload.len() as isize
    }
}

/// One datagram on the window socket.
#[derive(Clone)]
pub(crate) struct Message {
    /// Its text, trimmed.
    pub(crate) text: String,
    /// The sender's pid, from the kernel (0 if it sent none).
    pub(crate) pid: u32,
    /// Where to answer, when the sender's socket has an address.
    pub(crate) reply_to: Option<ReplyTo>,
}

impl Message {
    /// Whether it asks to end a window (the messages answered).
    pub(crate) fn is_end(&self) -> bool {
        self.text.split_whitespace().next() == Some("end")
    }
}

impl std::fmt::Debug for Message {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Message")
            .field("text", &self.text)
            .field("pid", &self.pid)
            .field("reply", &self.reply_to.is_some())
            .finish()
    }
}

/// A sender's socket address.
#[derive(Clone, Copy)]
pub(crate) struct ReplyTo {
    addr: libc::sockaddr_un,
    len: libc::socklen_t,
}

impl Drop for WindowSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// One domain's measured energy during a window (whole machine).
#[derive(Clone, Debug, PartialEq)]
pub struct WindowDomain {
    /// Domain.
    pub domain: Domain,
    /// Package or GPU index.
    pub package: Option<u32>,
    /// Measured over the window (µJ).
    pub measured_uj: u64,
    /// Modelled.
    pub estimated: bool,
}

/// A profiling window as the profile keeps it: energy in µJ, monotonic
/// begin and end (the end is the run's end if it was never ended).
pub type Window = crate::model::WindowOf<EnergyBy, WindowDomain>;

/// Open and finished windows.
#[derive(Debug, Default)]
pub struct Windows {
    open: Vec<Window>,
    done: Vec<Window>,
    errors: Vec<String>,
    error_count: u64,
    /// A daemon's client's windows: an `end` closes only a window of its
    /// own name and pid, and nothing is kept once answered.
    served: bool,
}

/// Problems kept for the report (the rest are counted).
const MAX_ERRORS: usize = 20;

/// Windows open at once; a `begin` beyond this is refused (a program
/// that never sends `end` must not slow every read down).
pub(crate) const MAX_OPEN: usize = 1000;

impl Windows {
    /// Whether any window is open.
    pub(crate) fn any_open(&self) -> bool {
        !self.open.is_empty()
    }

    /// A daemon's client's windows (see `served`).
    pub(crate) fn served() -> Self {
        Self {
            served: true,
            ..Self::default()
        }
    }

    /// Windows open.
    pub(crate) fn open_count(&self) -> usize {
        self.open.len()
    }

    /// When the first window still open on `pid`'s tree began.
    pub(crate) fn begin_of_pid(&self, pid: u32) -> Option<u64> {
        self.open
            .iter()
            .filter(|w| w.pid == pid)
            .map(|w| w.begin_ns)
            .min()
    }

    /// When the window an `end NAME` from `pid` would close began.
    pub(crate) fn begin_of(&self, name: &str, pid: u32) -> Option<u64> {
        self.open
            .iter()
            .rev()
            .find(|w| w.name == name && w.pid == pid)
            .map(|w| w.begin_ns)
    }

    /// Applies a command at monotonic time `at_ns` (the caller took a
    /// sample at that instant first). Returns the window it closed.
    pub fn apply(&mut self, cmd: Command, at_ns: u64) -> Result<Option<Window>, String> {
        let r = self.apply_command(cmd, at_ns);
        if let Err(e) = &r {
            self.error(e.clone());
        }
        r
    }

    fn apply_command(&mut self, cmd: Command, at_ns: u64) -> Result<Option<Window>, String> {
        if cmd.begin {
            if self.open.len() >= MAX_OPEN {
                return Err(format!(
                    "`begin {}` refused: {MAX_OPEN} windows already open (missing `end`s?)",
                    cmd.name
                ));
            }
            let depth = self.open.iter().filter(|w| w.pid == cmd.pid).count();
            self.open.push(Window {
                name: cmd.name,
                pid: cmd.pid,
                depth,
                begin_ns: at_ns,
                end_ns: at_ns,
                unterminated: false,
                on_cpu_ns: 0,
                energy: EnergyBy::default(),
                machine: Vec::new(),
            });
            return Ok(None);
        }
        // Another sender may end a window (a helper process, `pid=` left
        // out), but only when that leaves no doubt which one.
        let by_name: Vec<usize> = self
            .open
            .iter()
            .enumerate()
            .filter(|(_, w)| w.name == cmd.name)
            .map(|(i, _)| i)
            .collect();
        let found = by_name
            .iter()
            .rev()
            .find(|i| self.open[**i].pid == cmd.pid)
            .or(if by_name.len() == 1 && !self.served {
                by_name.first()
            } else {
                None
            })
            .copied();
        match found {
            Some(i) => {
                let mut w = self.open.remove(i);
                w.end_ns = at_ns;
                if w.end_ns == w.begin_ns {
                    self.error(format!(
                        "window `{}` began and ended between two reads (its messages arrived \
                         together): it shows 0 J; make it longer than a read takes",
                        w.name
                    ));
                }
                if !self.served {
                    self.done.push(w.clone());
                }
                Ok(Some(w))
            }
            None if by_name.is_empty() => Err(format!(
                "`end {}` with no open window of that name",
                cmd.name
            )),
            None => Err(format!(
                "`end {}` from pid {}: {} windows of that name are open, none of its tree \
                     (send `pid=N`)",
                cmd.name,
                cmd.pid,
                by_name.len()
            )),
        }
    }

    /// Records a bad message.
    pub fn error(&mut self, what: String) {
        self.error_count += 1;
        if self.errors.len() < MAX_ERRORS {
            self.errors.push(what);
        }
    }

    /// Adds one interval to every open window: `in_tree(consumer, pid)`
    /// says whether a consumer belongs to the tree of `pid`; `on_cpu`
    /// gives a consumer's on-CPU time in the interval.
    pub(crate) fn add_interval(
        &mut self,
        shares: &[DomainShare],
        consumers: &[(ConsumerId, u64)],
        in_tree: impl Fn(ConsumerId, u32) -> bool,
    ) {
        for w in &mut self.open {
            for (id, ns) in consumers {
                if in_tree(*id, w.pid) {
                    w.on_cpu_ns += ns;
                }
            }
            for s in shares {
                for (id, uj) in &s.attributed {
                    if in_tree(*id, w.pid) {
                        w.energy.add(s.key.domain, *uj);
                    }
                }
                for (id, uj) in &s.attributed_static {
                    if in_tree(*id, w.pid) {
                        w.energy.add_static(s.key.domain, *uj);
                    }
                }
                match w
                    .machine
                    .iter_mut()
                    .find(|m| m.domain == s.key.domain && m.package == s.key.package)
                {
                    Some(m) => {
                        m.measured_uj += s.measured_uj;
                        m.estimated |= s.estimated;
                    }
                    None => w.machine.push(WindowDomain {
                        domain: s.key.domain,
                        package: s.key.package,
                        measured_uj: s.measured_uj,
                        estimated: s.estimated,
                    }),
                }
            }
        }
    }

    /// Closes every open window at `at_ns` (marked unterminated) and
    /// returns all windows in the order they ended, and the first errors
    /// (with a count of the rest).
    pub fn finish(&mut self, at_ns: u64) -> (Vec<Window>, Vec<String>) {
        for mut w in self.open.drain(..) {
            w.end_ns = at_ns;
            w.unterminated = true;
            self.done.push(w);
        }
        let mut errors = std::mem::take(&mut self.errors);
        if self.error_count > errors.len() as u64 {
            errors.push(format!(
                "... and {} more",
                self.error_count - errors.len() as u64
            ));
        }
        (std::mem::take(&mut self.done), errors)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attribution::Basis;

    #[test]
    fn messages() {
        assert_eq!(
            parse("begin train\n", 42),
            Ok(Command {
                begin: true,
                name: "train".into(),
                pid: 42
            })
        );
        assert_eq!(
            parse("end eval pid=7", 42).map(|c| (c.begin, c.pid)),
            Ok((false, 7))
        );
        assert!(parse("", 1).is_err());
        assert!(parse("start x", 1).is_err());
        assert!(parse("begin", 1).is_err());
        assert!(parse("begin x pid=abc", 1).is_err());
        assert!(parse("begin x y", 1).is_err());
    }

    #[test]
    fn nested_windows_get_the_intervals_they_span_for_their_tree_only() {
        let mut w = Windows::default();
        w.apply(parse("begin outer", 10).expect("ok"), 0)
            .expect("accepted");
        let share = |uj: u64| DomainShare {
            key: crate::sources::DomainKey::new(Domain::Package, Some(0)),
            estimated: false,
            basis: Basis::CpuTime,
            measured_uj: 3 * uj,
            idle_uj: 0,
            unattributed_uj: uj,
            attributed: vec![(1, uj), (2, uj)],
            attributed_static: vec![(1, uj / 4), (2, uj / 4)],
            static_uj: 0,
            static_cut_uj: 0,
        };
        // Consumer 1 is in pid 10's tree; 2 is not.
        let in_tree = |id: ConsumerId, pid: u32| id == 1 && pid == 10;
        w.add_interval(&[share(100)], &[(1, 5), (2, 7)], in_tree);
        w.apply(parse("begin inner", 10).expect("ok"), 1)
            .expect("accepted");
        w.add_interval(&[share(10)], &[(1, 1)], in_tree);
        let inner = w
            .apply(parse("end inner", 10).expect("ok"), 2)
            .expect("accepted")
            .expect("closed");
        assert_eq!(
            (inner.depth, inner.energy.package_uj, inner.on_cpu_ns),
            (1, 10, 1)
        );
        assert_eq!(inner.machine[0].measured_uj, 30);
        let refused = w.apply(parse("end nothing", 10).expect("ok"), 3);
        assert!(refused.is_err_and(|e| e.contains("no open window")));
        // Begin and end in one read: kept, and flagged.
        w.apply(parse("begin blink", 10).expect("ok"), 3)
            .expect("accepted");
        let blink = w
            .apply(parse("end blink", 10).expect("ok"), 3)
            .expect("accepted")
            .expect("closed");
        assert_eq!(blink.end_ns, blink.begin_ns);
        let (all, errors) = w.finish(4);
        assert_eq!(errors.len(), 2, "{errors:?}");
        assert!(errors[1].contains("0 J"), "{errors:?}");
        let outer = &all[2];
        assert!(outer.unterminated);
        assert_eq!((outer.energy.package_uj, outer.on_cpu_ns), (110, 6));
        assert_eq!(outer.machine[0].measured_uj, 330);
    }

    #[test]
    fn an_end_from_another_tree_closes_only_an_unambiguous_window() {
        let mut w = Windows::default();
        w.apply(parse("begin step", 10).expect("ok"), 0)
            .expect("accepted");
        w.apply(parse("begin step", 20).expect("ok"), 0)
            .expect("accepted");
        assert_eq!(w.open[1].depth, 0, "depth counts the sender's own windows");
        assert!(w.apply(parse("end step", 30).expect("ok"), 1).is_err());
        assert_eq!(
            w.apply(parse("end step", 20).expect("ok"), 1)
                .map(|x| x.map(|x| x.pid)),
            Ok(Some(20))
        );
        assert_eq!(
            w.apply(parse("end step", 30).expect("ok"), 2)
                .map(|x| x.map(|x| x.pid)),
            Ok(Some(10))
        );
        for i in 0..MAX_OPEN + 25 {
            let r = w.apply(parse(&format!("begin w{i}"), 1).expect("ok"), 3);
            assert_eq!(r.is_ok(), i < MAX_OPEN, "begin w{i}");
        }
        assert_eq!(w.open.len(), MAX_OPEN);
        let (_, errors) = w.finish(4);
        assert!(
            errors.last().is_some_and(|e| e.contains("more")),
            "{errors:?}"
        );
    }

    #[test]
    fn a_served_end_closes_only_its_own_pid_and_keeps_nothing() {
        let mut w = Windows::served();
        w.apply(parse("begin x", 10).expect("ok"), 0)
            .expect("accepted");
        // Another pid's `end x`: refused, not the only `x` closed.
        assert!(w.apply(parse("end x", 20).expect("ok"), 1).is_err());
        assert!(w.apply(parse("end x", 10).expect("ok"), 1).is_ok());
        assert_eq!((w.open_count(), w.done.len()), (0, 0));
    }

    #[test]
    fn passed_file_descriptors_are_closed() {
        let dir = tempfile::tempdir().expect("tmp");
        let s = WindowSocket::bind(dir.path(), None).expect("bind");
        let c = UnixDatagram::unbound().expect("client");
        let passed = dir.path().join("passed-file");
        let file = std::fs::File::create(&passed).expect("a file to pass");
        // Other tests open files in this process at the same time: count
        // only descriptors of this file.
        let open_on = || {
            std::fs::read_dir("/proc/self/fd")
                .expect("fds")
                .flatten()
                .filter(|e| std::fs::read_link(e.path()).is_ok_and(|t| t == passed))
                .count()
        };
        let fd = file.as_raw_fd();
        let mut cmsg = [0u64; 4];
        let mut text = *b"begin x";
        let mut iov = libc::iovec {
            iov_base: text.as_mut_ptr().cast(),
            iov_len: text.len(),
        };
        // SAFETY: a message with one SCM_RIGHTS fd, built with the kernel's
        // macros into a buffer large enough for it.
        unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            for (d, b) in addr
                .sun_path
                .iter_mut()
                .zip(s.path().as_os_str().as_encoded_bytes())
            {
                *d = *b as libc::c_char;
            }
            msg.msg_name = (&mut addr as *mut libc::sockaddr_un).cast();
            msg.msg_namelen = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cmsg.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as _;
            let c0 = libc::CMSG_FIRSTHDR(&msg);
            (*c0).cmsg_level = libc::SOL_SOCKET;
            (*c0).cmsg_type = libc::SCM_RIGHTS;
            (*c0).cmsg_len = libc::CMSG_LEN(4) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(c0).cast::<libc::c_int>(), fd);
            let sent = libc::sendmsg(c.as_raw_fd(), &msg, 0);
            assert!(sent > 0, "{}", std::io::Error::last_os_error());
        }
        assert_eq!(s.receive().len(), 1);
        assert_eq!(open_on(), 1, "only the test's own descriptor is left");
    }

    #[test]
    fn the_socket_tells_the_sender_pid() {
        let dir = tempfile::tempdir().expect("tmp");
        let s = WindowSocket::bind(dir.path(), None).expect("bind");
        let c = UnixDatagram::unbound().expect("client");
        c.send_to(b"begin x", s.path()).expect("send");
        c.send_to(b"end x", s.path()).expect("send");
        let got: Vec<(String, u32, bool)> = s
            .receive()
            .into_iter()
            .map(|m| (m.text, m.pid, m.reply_to.is_some()))
            .collect();
        // An unbound sender cannot be answered.
        assert_eq!(
            got,
            vec![
                ("begin x".to_string(), std::process::id(), false),
                ("end x".to_string(), std::process::id(), false)
            ]
        );
    }

    #[test]
    fn a_sender_with_an_address_is_answered() {
        let dir = tempfile::tempdir().expect("tmp");
        let s = WindowSocket::bind(dir.path(), None).expect("bind");
        let c = UnixDatagram::bind(dir.path().join("client.sock")).expect("client");
        c.send_to(b"end x", s.path()).expect("send");
        let got = s.receive();
        assert_eq!(got.len(), 1);
        assert!(got[0].is_end());
        let to = got[0].reply_to.as_ref().expect("an address");
        assert!(s.reply(to, b"{\"energy\":1}"));
        let mut buf = [0u8; 64];
        let n = c.recv(&mut buf).expect("the answer");
        assert_eq!(&buf[..n], b"{\"energy\":1}");
        // Gone: the answer is dropped, wattprof does not wait.
        drop(c);
        assert!(!s.reply(to, b"late"));
    }
}
