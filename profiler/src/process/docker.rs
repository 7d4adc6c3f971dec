//! Docker container names from the Docker Engine API on its Unix socket
//! (Podman's API service answers the same requests: the same client asks
//! it for Podman's names).
//!
//! Lookups run on a background thread: asking for a name never blocks
//! (the id stands in until the answer comes), each id is asked once, and a
//! lookup that fails (no answer within the timeout, no such container) is
//! tried again 30 s later. A daemon that starts after wattprof is found:
//! the socket is looked for again at most every [`SOCKET_RECHECK`] until
//! it appears.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

/// What one request may take.
const TIMEOUT: Duration = Duration::from_millis(500);

/// Largest answer read (a container's JSON is a few KiB).
const MAX_ANSWER: usize = 4 << 20;

/// A name older than this is asked for again when next wanted (a `docker
/// rename`); the old one is used meanwhile.
const REFRESH: Duration = Duration::from_secs(30);

/// A lookup's state.
#[derive(Clone, Debug)]
enum Lookup {
    /// Asked, no answer yet.
    Pending,
    /// The daemon named it, at that time.
    Named(String, Instant),
    /// Named, and asked again (the name may have changed).
    Refreshing(String),
    /// No answer (no such container, daemon busy): asked again after
    /// [`RETRY`].
    Failed(Instant),
}

/// Time before a failed lookup is tried again.
const RETRY: Duration = Duration::from_secs(30);

/// Container names cached at most.
const MAX_NAMES: usize = 10_000;

/// How often a missing socket is looked for again.
pub(crate) const SOCKET_RECHECK: Duration = Duration::from_secs(5);

type Names = Arc<Mutex<HashMap<String, Lookup>>>;

/// Cached Docker names.
#[derive(Debug)]
pub(crate) struct DockerNames {
    names: Names,
    socket: PathBuf,
    /// The lookup thread's name.
    thread: &'static str,
    /// The lookup thread's queue, once the socket has been seen.
    ask: OnceLock<Sender<String>>,
    /// When the socket was last looked for (while it has not been seen).
    looked: Mutex<Option<Instant>>,
}

/// The `Name` of a container from the Engine API's `GET /containers/ID/json`
/// body, without its leading `/`.
pub(crate) fn parse_name(body: &[u8]) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(body).ok()?;
    Some(v["Name"].as_str()?.trim_start_matches('/').to_string())
}

/// One `GET /containers/ID/json` over the socket, with hyper's HTTP/1.1
/// client, within [`TIMEOUT`].
async fn lookup(socket: &Path, id: &str) -> Option<String> {
    use http_body_util::{BodyExt, Empty, Limited};
    let ask = async {
        let stream = tokio::net::UnixStream::connect(socket).await.ok()?;
        let (mut sender, conn) =
            hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
                .await
                .ok()?;
        tokio::spawn(conn);
        let request = hyper::Request::get(format!("/containers/{id}/json"))
            .header(hyper::header::HOST, "docker")
            .body(Empty::<hyper::body::Bytes>::new())
            .ok()?;
        let answer = sender.send_request(request).await.ok()?;
        if answer.status() != hyper::StatusCode::OK {
            return None;
        }
        let body = Limited::new(answer.into_body(), MAX_ANSWER)
            .collect()
            .await
            .ok()?
            .to_bytes();
        parse_name(&body)
    };
    tokio::time::timeout(TIMEOUT, ask).await.ok().flatten()
}

fn serve(socket: PathBuf, rx: Receiver<String>, names: Names) {
    let Ok(runtime) = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .build()
    else {
        return;
    };
    for id in rx {
        let found = runtime.block_on(lookup(&socket, &id));
        let mut names = names.lock().unwrap_or_else(PoisonError::into_inner);
        let answer = match (found, names.get(&id)) {
            (Some(name), _) => Lookup::Named(name, Instant::now()),
            // A container gone since keeps the name it had.
            (None, Some(Lookup::Refreshing(old))) => Lookup::Named(old.clone(), Instant::now()),
            (None, _) => Lookup::Failed(Instant::now()),
        };
        names.insert(id, answer);
    }
}

impl DockerNames {
    /// Names from the daemon at `socket` (normally `/var/run/docker.sock`).
    /// While there is no socket there, every lookup answers `None` at once
    /// (the socket is looked for again every [`SOCKET_RECHECK`]).
    /// The lookups run on a thread called `thread`.
    pub(crate) fn new(socket: &Path, thread: &'static str) -> Self {
        let names = Self {
            names: Arc::new(Mutex::new(HashMap::new())),
            socket: socket.to_path_buf(),
            thread,
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
                .name(self.thread.into())
                .spawn(move || serve(path, rx, shared));
            tx
        });
        Some(q)
    }

    /// Whether the daemon's socket has been found (names can be asked for).
    pub(crate) fn available(&self) -> bool {
        self.queue().is_some()
    }

    /// Waits (at most `limit`) for the lookups asked for to be answered:
    /// called before a final report, so a container first seen in the
    /// last second still has its name there.
    pub(crate) fn settle(&self, limit: Duration) {
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
                .any(|l| matches!(l, Lookup::Pending | Lookup::Refreshing(_)))
        {
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Makes every name known stale, so the next [`Self::name`] asks the
    /// daemon again (before a final report: containers renamed since).
    pub(crate) fn expire(&self) {
        for l in self
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values_mut()
        {
            if let Lookup::Named(_, at) = l {
                *at = Instant::now() - REFRESH;
            }
        }
    }

    /// The name of container `id` if the daemon has answered, without
    /// asking.
    pub(crate) fn cached(&self, id: &str) -> Option<String> {
        match self
            .names
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(id)
        {
            Some(Lookup::Named(n, _) | Lookup::Refreshing(n)) => Some(n.clone()),
            _ => None,
        }
    }

    /// The name of container `id`, if known yet; asks for it otherwise.
    pub(crate) fn name(&self, id: &str) -> Option<String> {
        let ask = self.queue()?;
        let mut names = self.names.lock().unwrap_or_else(PoisonError::into_inner);
        match names.get(id) {
            Some(Lookup::Named(n, at)) if at.elapsed() < REFRESH => return Some(n.clone()),
            Some(Lookup::Named(n, _)) => {
                let n = n.clone();
                names.insert(id.to_string(), Lookup::Refreshing(n.clone()));
                let _ = ask.send(id.to_string());
                return Some(n);
            }
            Some(Lookup::Refreshing(n)) => return Some(n.clone()),
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
                names.retain(|_, l| matches!(l, Lookup::Pending | Lookup::Refreshing(_)));
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
    use std::io::{Read, Write};
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
        let names = DockerNames::new(&sock, "test-docker");
        assert_eq!(names.name("abc"), None, "first ask does not wait");
        let req = server.join().expect("server");
        assert!(
            req.starts_with("GET /containers/abc/json HTTP/1.1\r\n"),
            "{req}"
        );
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while names.name("abc").is_none() && std::time::Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(names.name("abc").as_deref(), Some("web-1"));
        assert_eq!(parse_name(b"{\"message\":\"no\"}"), None);
        assert_eq!(
            DockerNames::new(&dir.path().join("none.sock"), "test-docker").name("x"),
            None
        );
    }

    #[test]
    fn a_daemon_that_starts_later_is_found() {
        let dir = tempfile::tempdir().expect("tmp");
        let sock = dir.path().join("docker.sock");
        let names = DockerNames::new(&sock, "test-docker");
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

    #[test]
    fn a_renamed_container_is_asked_again_and_a_removed_one_keeps_its_name() {
        let dir = tempfile::tempdir().expect("tmp");
        let sock = dir.path().join("docker.sock");
        let listener = UnixListener::bind(&sock).expect("bind");
        // Answers "/first", then "/second", then 404 (removed).
        let server = std::thread::spawn(move || {
            for answer in ["first", "second", ""] {
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
                let (status, body) = if answer.is_empty() {
                    (
                        "404 Not Found",
                        r#"{"message":"no such container"}"#.to_string(),
                    )
                } else {
                    ("200 OK", format!(r#"{{"Name":"/{answer}"}}"#))
                };
                let _ = write!(
                    c,
                    "HTTP/1.1 {status}\r\nContent-Length: {}\r\n\r\n{body}",
                    body.len()
                );
            }
        });
        let names = DockerNames::new(&sock, "test-docker");
        let wait_for = |want: &str| {
            let deadline = Instant::now() + Duration::from_secs(5);
            names.settle(Duration::from_secs(5));
            while names.cached("abc").as_deref() != Some(want) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            assert_eq!(names.cached("abc").as_deref(), Some(want));
        };
        assert_eq!(names.name("abc"), None);
        wait_for("first");
        assert_eq!(
            names.name("abc").as_deref(),
            Some("first"),
            "fresh: not asked"
        );
        names.expire();
        assert_eq!(
            names.name("abc").as_deref(),
            Some("first"),
            "old name meanwhile"
        );
        wait_for("second");
        names.expire();
        assert_eq!(names.name("abc").as_deref(), Some("second"));
        names.settle(Duration::from_secs(5));
        server.join().expect("server");
        assert_eq!(
            names.cached("abc").as_deref(),
            Some("second"),
            "kept after a 404"
        );
    }
}
