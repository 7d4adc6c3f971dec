//! Docker container names from the Docker Engine API on its Unix socket.
//!
//! Lookups run on a background thread: asking for a name never blocks
//! (the id stands in until the answer comes), each id is asked once, and a
//! lookup that fails (no answer within the timeout, no such container) is
//! tried again 30 s later. A daemon that starts after wattprof is found:
//! the socket is looked for again at most every [`SOCKET_RECHECK`] until
//! it appears.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// What one request may take.
const TIMEOUT: Duration = Duration::from_millis(500);

/// Largest answer read (a container's JSON is a few KiB).
const MAX_ANSWER: u64 = 4 << 20;

/// A lookup's state.
#[derive(Clone, Debug)]
enum Lookup {
    /// Asked, no answer yet.
    Pending,
    /// The daemon named it.
    Named(String),
    /// No answer (no such container, daemon busy): asked again after
    /// [`RETRY`].
    Failed(std::time::Instant),
}

/// Time before a failed lookup is tried again.
const RETRY: Duration = Duration::from_secs(30);

/// Container names cached at most.
const MAX_NAMES: usize = 10_000;

/// How often a missing socket is looked for again.
pub const SOCKET_RECHECK: Duration = Duration::from_secs(5);

type Names = Arc<Mutex<HashMap<String, Lookup>>>;

/// Cached Docker names.
#[derive(Debug)]
pub struct DockerNames {
    names: Names,
    socket: PathBuf,
    /// The lookup thread's queue, once the socket has been seen.
    ask: OnceLock<Sender<String>>,
    /// When the socket was last looked for (while it has not been seen).
    looked: Mutex<Option<Instant>>,
}

/// The `Name` of a container from the Engine API's `GET /containers/ID/json`
/// answer (headers and body), without its leading `/`.
pub fn parse_name(answer: &str) -> Option<String> {
    let (head, body) = answer.split_once("\r\n\r\n")?;
    if !head.starts_with("HTTP/1.") || head.split_whitespace().nth(1) != Some("200") {
        return None;
    }
    let v: serde_json::Value = serde_json::from_str(body.trim()).ok()?;
    Some(v["Name"].as_str()?.trim_start_matches('/').to_string())
}

fn lookup(socket: &Path, id: &str) -> Option<String> {
    let mut s = UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(TIMEOUT)).ok()?;
    s.set_write_timeout(Some(TIMEOUT)).ok()?;
    // HTTP/1.0: the daemon closes the connection after the answer. One
    // write for the whole request.
    s.write_all(format!("GET /containers/{id}/json HTTP/1.0\r\nHost: docker\r\n\r\n").as_bytes())
        .ok()?;
    let mut answer = String::new();
    s.take(MAX_ANSWER).read_to_string(&mut answer).ok()?;
    parse_name(&answer)
}

fn serve(socket: PathBuf, rx: Receiver<String>, names: Names) {
    for id in rx {
        let answer = match lookup(&socket, &id) {
            Some(name) => Lookup::Named(name),
            None => Lookup::Failed(std::time::Instant::now()),
        };
        names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(id, answer);
    }
}

impl DockerNames {
    /// Names from the daemon at `socket` (normally `/var/run/docker.sock`).
    /// While there is no socket there, every lookup answers `None` at once
    /// (the socket is looked for again every [`SOCKET_RECHECK`]).
    pub fn new(socket: &Path) -> Self {
        let names = Self {
            names: Arc::new(Mutex::new(HashMap::new())),
            socket: socket.to_path_buf(),
            ask: OnceLock::new(),
            looked: Mutex::new(None),
        };
        names.queue();
        names
    }

    /// The lookup thread's queue, started when the socket exists.
    fn queue(&self) -> Option<&Sender<String>> {
        if let Some(q) = self.ask.get() {
            return Some(q);
        }
        {
            let mut looked = self.looked.lock().unwrap_or_else(PoisonError::into_inner);
            if looked.is_some_and(|at| at.elapsed() < SOCKET_RECHECK) {
                return None;
            }
            *looked = Some(Instant::now());
        }
        if !self.socket.exists() {
            return None;
        }
        let q = self.ask.get_or_init(|| {
            let (tx, rx) = channel();
            let (path, shared) = (self.socket.clone(), self.names.clone());
            let _ = std::thread::Builder::new()
                .name("wattprof-docker".into())
                .spawn(move || serve(path, rx, shared));
            tx
        });
        Some(q)
    }

    /// Whether the daemon's socket has been found (names can be asked for).
    pub fn available(&self) -> bool {
        self.queue().is_some()
    }

    /// Waits (at most `limit`) for the lookups asked for to be answered:
    /// called before a final report, so a container first seen in the
    /// last second still has its name there.
    pub fn settle(&self, limit: Duration) {
        if self.ask.get().is_none() {
            return;
        }
        let deadline = Instant::now() + limit;
        while Instant::now() < deadline
            && self
                .names
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .values()
                .any(|l| matches!(l, Lookup::Pending))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// The name of container `id` if the daemon has answered, without
    /// asking.
    pub fn cached(&self, id: &str) -> Option<String> {
        match self
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
        {
            Some(Lookup::Named(n)) => Some(n.clone()),
            _ => None,
        }
    }

    /// The name of container `id`, if known yet; asks for it otherwise.
    pub fn name(&self, id: &str) -> Option<String> {
        let ask = self.queue()?;
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        match names.get(id) {
            Some(Lookup::Named(n)) => return Some(n.clone()),
            Some(Lookup::Pending) => return None,
            Some(Lookup::Failed(at)) if at.elapsed() < RETRY => return None,
            _ => {}
        }
        if names.len() >= MAX_NAMES {
            // Bounded under container churn: failed lookups go first, then
            // answers (the profile keeps each answer with its cgroup);
            // lookups under way stay.
            names.retain(|_, l| !matches!(l, Lookup::Failed(_)));
            if names.len() >= MAX_NAMES {
                names.retain(|_, l| matches!(l, Lookup::Pending));
            }
        }
        names.insert(id.to_string(), Lookup::Pending);
        let _ = ask.send(id.to_string());
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixListener;

    #[test]
    fn names_come_from_the_engine_api_without_blocking() {
        let dir = tempfile::tempdir().expect("tmp");
        let sock = dir.path().join("docker.sock");
        let listener = UnixListener::bind(&sock).expect("bind");
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().expect("accept");
            let mut req = [0u8; 512];
            // The head may come in more than one read.
            let mut n = 0;
            while !req[..n].windows(4).any(|w| w == b"\r\n\r\n") && n < req.len() {
                let got = c.read(&mut req[n..]).expect("request");
                if got == 0 {
                    break;
                }
                n += got;
            }
            let req = String::from_utf8_lossy(&req[..n]).to_string();
            let body = r#"{"Id":"abc","Name":"/web-1","State":{}}"#;
            let _ = write!(
                c,
                "HTTP/1.0 200 OK\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
            req
        });
        let names = DockerNames::new(&sock);
        assert_eq!(names.name("abc"), None, "first ask does not wait");
        let req = server.join().expect("server");
        assert!(
            req.starts_with("GET /containers/abc/json HTTP/1.0\r\n"),
            "{req}"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while names.name("abc").is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(names.name("abc").as_deref(), Some("web-1"));
        assert_eq!(
            parse_name("HTTP/1.0 404 Not Found\r\n\r\n{\"message\":\"no\"}"),
            None
        );
        assert_eq!(
            DockerNames::new(&dir.path().join("none.sock")).name("x"),
            None
        );
    }

    #[test]
    fn a_daemon_that_starts_later_is_found() {
        let dir = tempfile::tempdir().expect("tmp");
        let sock = dir.path().join("docker.sock");
        let names = DockerNames::new(&sock);
        assert_eq!(names.name("abc"), None, "no socket yet");
        let listener = UnixListener::bind(&sock).expect("bind");
        // Not looked for again before SOCKET_RECHECK: no thread yet.
        *names.looked.lock().expect("lock") = Some(Instant::now());
        assert_eq!(names.name("abc"), None);
        assert!(names.ask.get().is_none());
        *names.looked.lock().expect("lock") = Some(Instant::now() - SOCKET_RECHECK);
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().expect("accept");
            let mut req = Vec::new();
            let mut buf = [0u8; 512];
            while !req.windows(4).any(|w| w == b"\r\n\r\n") {
                let n = c.read(&mut buf).expect("request");
                if n == 0 {
                    break;
                }
                req.extend_from_slice(&buf[..n]);
            }
            let body = r#"{"Name":"/late"}"#;
            let _ = write!(
                c,
                "HTTP/1.0 200 OK\r\nContent-Length: {}\r\n\r\n{body}",
                body.len()
            );
        });
        assert_eq!(names.name("abc"), None, "asked now");
        server.join().expect("server");
        let deadline = Instant::now() + Duration::from_secs(5);
        while names.name("abc").is_none() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(names.name("abc").as_deref(), Some("late"));
    }
}
