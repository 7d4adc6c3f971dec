//! The `/metrics` endpoint of `wattprof monitor --prometheus`.
//!
//! A small HTTP/1.x server on its own threads. Sampling only swaps in a
//! new [`Snapshot`] after each interval (a pointer under a mutex held for
//! nanoseconds); scrapes encode from their own copy. Each connection gets
//! a thread, at most [`MAX_CONNECTIONS`] at once, with [`IO_TIMEOUT`] for
//! the whole request head, a time limit on each write and a cap on the
//! request's size, so unknown paths, huge headers and slow clients cost a
//! thread for a few seconds at most and never touch sampling.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::output::prometheus::{self, Snapshot, classic_text, openmetrics};

/// Connections served at once; more are answered 503 and closed.
pub const MAX_CONNECTIONS: usize = 16;
/// Longest request head read.
pub const MAX_REQUEST: usize = 16 * 1024;
/// Time a client has to send its request, and to take the answer.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// The latest snapshot, shared with the server.
pub type Shared = Arc<Mutex<Arc<Snapshot>>>;

/// Parses `--prometheus`: `HOST:PORT`, `[v6]:PORT`, or a bare port (on
/// 127.0.0.1).
pub fn parse_addr(text: &str) -> Result<SocketAddr, String> {
    if let Ok(port) = text.parse::<u16>() {
        return Ok(SocketAddr::from(([127, 0, 0, 1], port)));
    }
    text.parse().map_err(|_| {
        format!("`{text}` is not an address: use PORT, 127.0.0.1:9101, 0.0.0.0:9101 or [::1]:9101")
    })
}

/// CPU time of the calling thread (ns).
fn thread_cpu_ns() -> u64 {
    crate::tracker::clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Reads the request head (up to the blank line), all of it within
/// [`IO_TIMEOUT`] (a client trickling a byte at a time is cut off too).
/// `Err` carries the status to answer.
fn read_head(stream: &mut TcpStream) -> Result<String, (u16, &'static str)> {
    let deadline = std::time::Instant::now() + IO_TIMEOUT;
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 2048];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() || stream.set_read_timeout(Some(left)).is_err() {
            return Err((408, "Request Timeout"));
        }
        if buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n") {
            return Ok(String::from_utf8_lossy(&buf).into_owned());
        }
        if buf.len() > MAX_REQUEST {
            return Err((431, "Request Header Fields Too Large"));
        }
        match stream.read(&mut chunk) {
            Ok(0) => return Err((400, "Bad Request")),
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(_) => return Err((408, "Request Timeout")),
        }
    }
}

fn respond(stream: &mut TcpStream, status: u16, reason: &str, ctype: &str, body: &str, head: bool) {
    let header = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(header.as_bytes());
    if !head {
        let _ = stream.write_all(body.as_bytes());
    }
}

/// What one request gets (status, reason, content type, body).
pub fn answer(request: &str, snapshots: &[&Snapshot]) -> (u16, &'static str, &'static str, String) {
    let mut lines = request.lines();
    let first = lines.next().unwrap_or("");
    let mut parts = first.split_whitespace();
    let (method, target) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let path = target.split('?').next().unwrap_or("");
    if method != "GET" && method != "HEAD" {
        return (
            405,
            "Method Not Allowed",
            "text/plain",
            "GET or HEAD only\n".into(),
        );
    }
    match path {
        "/metrics" => {
            let accept = lines
                .filter_map(|l| l.split_once(':'))
                .find(|(k, _)| k.trim().eq_ignore_ascii_case("accept"))
                .map(|(_, v)| v.to_ascii_lowercase())
                .unwrap_or_default();
            let om = openmetrics(snapshots);
            if accept.contains("application/openmetrics-text") {
                (
                    200,
                    "OK",
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    om,
                )
            } else {
                (
                    200,
                    "OK",
                    "text/plain; version=0.0.4; charset=utf-8",
                    classic_text(&om),
                )
            }
        }
        "/" => (
            200,
            "OK",
            "text/plain; charset=utf-8",
            "wattprof exporter: metrics at /metrics\n".into(),
        ),
        _ => (
            404,
            "Not Found",
            "text/plain",
            "not found: try /metrics\n".into(),
        ),
    }
}

/// What serving scrapes has cost so far.
#[derive(Debug, Default)]
pub struct ScrapeCost {
    /// `/metrics` answers served.
    pub scrapes: std::sync::atomic::AtomicU64,
    /// CPU time their threads spent building and sending them (ns).
    pub cpu_ns: std::sync::atomic::AtomicU64,
}

impl ScrapeCost {
    /// The exporter's own cost, up to the previous scrape, as metrics.
    fn snapshot(&self) -> Snapshot {
        Snapshot {
            families: vec![
                (
                    &prometheus::EXPORTER_SCRAPES,
                    vec![(Vec::new(), self.scrapes.load(Ordering::Relaxed) as f64)],
                ),
                (
                    &prometheus::EXPORTER_CPU,
                    vec![(Vec::new(), self.cpu_ns.load(Ordering::Relaxed) as f64 / 1e9)],
                ),
            ],
        }
    }
}

fn handle(mut stream: TcpStream, shared: &Shared, cost: &ScrapeCost) {
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let request = match read_head(&mut stream) {
        Ok(r) => r,
        Err((status, reason)) => {
            respond(&mut stream, status, reason, "text/plain", "", false);
            return;
        }
    };
    let cpu0 = thread_cpu_ns();
    let snapshot = shared
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let (status, reason, ctype, body) = answer(&request, &[&snapshot, &cost.snapshot()]);
    respond(
        &mut stream,
        status,
        reason,
        ctype,
        &body,
        request.starts_with("HEAD"),
    );
    let path = request
        .split_whitespace()
        .nth(1)
        .and_then(|t| t.split('?').next());
    if status == 200 && path == Some("/metrics") {
        cost.scrapes.fetch_add(1, Ordering::Relaxed);
        cost.cpu_ns
            .fetch_add(thread_cpu_ns().saturating_sub(cpu0), Ordering::Relaxed);
    }
}

/// A running exporter.
#[derive(Debug)]
pub struct Exporter {
    /// Where it listens.
    pub addr: SocketAddr,
    /// What serving scrapes has cost.
    pub cost: Arc<ScrapeCost>,
}

/// Binds `addr` and serves `shared` on background threads.
pub fn serve(addr: SocketAddr, shared: Shared) -> std::io::Result<Exporter> {
    let listener = TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    let active = Arc::new(AtomicUsize::new(0));
    let last = Arc::new(ScrapeCost::default());
    let cost = last.clone();
    std::thread::Builder::new()
        .name("wattprof-http".into())
        .spawn(move || {
            for stream in listener.incoming() {
                let Ok(mut stream) = stream else {
                    // Out of file descriptors, say: the connection stays
                    // queued, so wait instead of spinning.
                    std::thread::sleep(Duration::from_millis(50));
                    continue;
                };
                if active.load(Ordering::Relaxed) >= MAX_CONNECTIONS {
                    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
                    respond(
                        &mut stream,
                        503,
                        "Service Unavailable",
                        "text/plain",
                        "",
                        false,
                    );
                    continue;
                }
                active.fetch_add(1, Ordering::Relaxed);
                let (shared, slot, last) = (shared.clone(), active.clone(), last.clone());
                let spawned = std::thread::Builder::new()
                    .name("wattprof-scrape".into())
                    .spawn(move || {
                        // The slot is given back even if answering panics.
                        struct Slot(Arc<AtomicUsize>);
                        impl Drop for Slot {
                            fn drop(&mut self) {
                                self.0.fetch_sub(1, Ordering::Relaxed);
                            }
                        }
                        let _slot = Slot(slot);
                        handle(stream, &shared, &last);
                    });
                if spawned.is_err() {
                    // No thread for it: the client is dropped, sampling goes on.
                    active.fetch_sub(1, Ordering::Relaxed);
                }
            }
        })?;
    Ok(Exporter { addr, cost })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn get(addr: SocketAddr, request: &[u8]) -> String {
        let mut s = TcpStream::connect(addr).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("timeout");
        s.write_all(request).expect("send");
        let mut out = String::new();
        let _ = s.read_to_string(&mut out);
        out
    }

    #[test]
    fn paths_formats_and_bad_clients() {
        let snap = Snapshot {
            families: vec![(
                &crate::output::prometheus::ENERGY,
                vec![(vec![("domain".into(), "package".into())], 2.0)],
            )],
        };
        let shared: Shared = Arc::new(Mutex::new(Arc::new(snap)));
        let ex = serve("127.0.0.1:0".parse().expect("addr"), shared.clone()).expect("serve");
        // A slow client holding a connection open does not stop others.
        let slow = TcpStream::connect(ex.addr).expect("slow client");
        let text = get(ex.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
        assert!(text.starts_with("HTTP/1.1 200"), "{text}");
        assert!(text.contains("text/plain; version=0.0.4"), "{text}");
        assert!(
            text.contains("wattprof_energy_joules_total{domain=\"package\"} 2.0"),
            "{text}"
        );
        let om = get(
            ex.addr,
            b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0\r\n\r\n",
        );
        assert!(
            om.contains("application/openmetrics-text") && om.contains("# EOF"),
            "{om}"
        );
        assert!(get(ex.addr, b"GET /nope HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 404"));
        assert!(get(ex.addr, b"POST /metrics HTTP/1.1\r\n\r\n").starts_with("HTTP/1.1 405"));
        let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
        huge.extend(std::iter::repeat_n(b'a', 64 * 1024));
        assert!(get(ex.addr, &huge).starts_with("HTTP/1.1 431"));
        // A new snapshot is served at once.
        *shared.lock().expect("lock") = Arc::new(Snapshot::default());
        assert!(!get(ex.addr, b"GET /metrics HTTP/1.0\r\n\r\n").contains("wattprof_energy"));
        drop(slow);
        assert!(parse_addr("9101").is_ok_and(|a| a.ip().is_loopback()));
        assert!(parse_addr("0.0.0.0:9101").is_ok());
        assert!(parse_addr("nope").is_err());
    }
}
