//! The `/metrics` endpoint of `wattprof monitor --prometheus`: hyper on a
//! one-thread tokio runtime, with TLS (rustls) and basic auth from
//! `--web-config` ([`web_config`]).
//!
//! Sampling never waits for it: after each interval it swaps in a new
//! [`Snapshot`] (a pointer under a mutex held for nanoseconds) and scrapes
//! encode from their own copy on the `wattprof-http` thread. What a client
//! can hold is bounded: [`MAX_CONNECTIONS`] at once (more get 503), the
//! request head within [`IO_TIMEOUT`] and [`MAX_REQUEST`] bytes (431), a
//! TLS handshake within [`IO_TIMEOUT`], each write within [`IO_TIMEOUT`],
//! and an idle keep-alive connection for [`IDLE_TIMEOUT`]. bcrypt checks
//! run on tokio's blocking pool, once per user and password.

pub(crate) mod web_config;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, PoisonError};
use std::time::Duration;

use http_body_util::Full;
use hyper::body::{Bytes, Incoming};
use hyper::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue, WWW_AUTHENTICATE};
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;

use crate::sink::prometheus::{self, Snapshot, classic_text, openmetrics};
pub(crate) use web_config::WebConfig;

/// Connections served at once; more are answered 503 and closed.
pub(crate) const MAX_CONNECTIONS: usize = 16;
/// Longest request head read (hyper's smallest buffer is 8 KiB).
pub(crate) const MAX_REQUEST: usize = 16 * 1024;
/// Time a client has to send its request head, finish a TLS handshake, or
/// take each part of the answer.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(5);
/// A keep-alive connection with nothing sent for this long is closed.
pub(crate) const IDLE_TIMEOUT: Duration = Duration::from_secs(60);

/// The latest snapshot, shared with the server.
pub(crate) type Shared = crate::sink::snapshot::Published;

/// Parses `--prometheus`: `HOST:PORT`, `[v6]:PORT`, or a bare port (on
/// 127.0.0.1).
pub(crate) fn parse_addr(text: &str) -> Result<SocketAddr, String> {
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

/// What one request gets: status, content type, body. `accept` is the
/// request's `Accept` header (lowercase).
pub(crate) fn answer(
    method: &Method,
    path: &str,
    accept: &str,
    snapshots: &[&Snapshot],
) -> (StatusCode, &'static str, String) {
    if method != Method::GET && method != Method::HEAD {
        return (
            StatusCode::METHOD_NOT_ALLOWED,
            "text/plain",
            "GET or HEAD only\n".into(),
        );
    }
    match path {
        "/metrics" => {
            let om = openmetrics(snapshots);
            if accept.contains("application/openmetrics-text") {
                (
                    StatusCode::OK,
                    "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    om,
                )
            } else {
                (
                    StatusCode::OK,
                    "text/plain; version=0.0.4; charset=utf-8",
                    classic_text(&om),
                )
            }
        }
        "/" => (
            StatusCode::OK,
            "text/plain; charset=utf-8",
            "wattprof exporter: metrics at /metrics\n".into(),
        ),
        _ => (
            StatusCode::NOT_FOUND,
            "text/plain",
            "not found: try /metrics\n".into(),
        ),
    }
}

/// What serving has cost so far.
#[derive(Debug, Default)]
pub(crate) struct ScrapeCost {
    /// `/metrics` answers served.
    pub(crate) scrapes: AtomicU64,
    /// CPU time of the exporter's thread (accepting, TLS, parsing,
    /// building and sending answers), read at each scrape, plus that of
    /// its bcrypt checks (ns).
    pub(crate) cpu_ns: AtomicU64,
    /// CPU time of bcrypt checks so far (ns).
    auth_cpu_ns: AtomicU64,
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

/// What every connection shares.
struct State {
    shared: Shared,
    web: Option<Arc<WebConfig>>,
    cost: Arc<ScrapeCost>,
}

type Answer = Response<Full<Bytes>>;

fn plain(status: StatusCode, body: &'static str) -> Answer {
    let mut r = Response::new(Full::new(Bytes::from_static(body.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

async fn handle(
    req: Request<Incoming>,
    state: Arc<State>,
) -> Result<Answer, std::convert::Infallible> {
    let mut response = respond(&req, &state).await;
    if let Some(web) = &state.web {
        for (name, value) in &web.headers {
            response.headers_mut().insert(name.clone(), value.clone());
        }
    }
    Ok(response)
}

async fn respond(req: &Request<Incoming>, state: &State) -> Answer {
    if let Some(web) = &state.web {
        let allowed = match web.check(req.headers().get(AUTHORIZATION).map(|v| v.as_bytes())) {
            web_config::Auth::Allowed => true,
            web_config::Auth::Denied => false,
            web_config::Auth::Check(value) => {
                let (cost, web) = (state.cost.clone(), web.clone());
                tokio::task::spawn_blocking(move || {
                    let cpu0 = thread_cpu_ns();
                    let good = web.verify(&value);
                    cost.auth_cpu_ns
                        .fetch_add(thread_cpu_ns().saturating_sub(cpu0), Ordering::Relaxed);
                    good
                })
                .await
                .unwrap_or(false)
            }
        };
        if !allowed {
            let mut r = plain(StatusCode::UNAUTHORIZED, "Unauthorized\n");
            r.headers_mut().insert(
                WWW_AUTHENTICATE,
                HeaderValue::from_static("Basic realm=\"wattprof\""),
            );
            return r;
        }
    }
    let accept = req
        .headers()
        .get(ACCEPT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    let snapshot = state
        .shared
        .lock()
        .unwrap_or_else(PoisonError::into_inner)
        .clone();
    let path = req.uri().path();
    let (status, ctype, body) = answer(
        req.method(),
        path,
        &accept,
        &[&snapshot, &state.cost.snapshot()],
    );
    if status == StatusCode::OK && path == "/metrics" {
        state.cost.scrapes.fetch_add(1, Ordering::Relaxed);
        state.cost.cpu_ns.store(
            thread_cpu_ns() + state.cost.auth_cpu_ns.load(Ordering::Relaxed),
            Ordering::Relaxed,
        );
    }
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(ctype));
    r
}

/// Go's answer to plain HTTP on a TLS port: a client that forgot
/// `https://` (or Prometheus without `scheme: https`) gets a line that
/// says so instead of a dropped connection.
const PLAIN_HTTP_TO_TLS: &[u8] = b"HTTP/1.0 400 Bad Request\r\nContent-Type: text/plain\r\n\
    Connection: close\r\n\r\nClient sent an HTTP request to an HTTPS server.\n";

async fn serve_connection(stream: TcpStream, state: Arc<State>) {
    let _ = stream.set_nodelay(true);
    let tls = state.web.as_ref().and_then(|w| w.tls.clone());
    if tls.is_some() {
        // A TLS connection starts with a handshake record (0x16).
        let mut first = [0u8; 1];
        match tokio::time::timeout(IO_TIMEOUT, stream.peek(&mut first)).await {
            Ok(Ok(1)) if first[0] != 0x16 => {
                let mut stream = stream;
                let _ = tokio::time::timeout(IO_TIMEOUT, stream.write_all(PLAIN_HTTP_TO_TLS)).await;
                // Closing with the request unread would reset the
                // connection and could lose the answer: end ours, then
                // read what the client sent (bounded).
                let _ = stream.shutdown().await;
                let mut sink = [0u8; 4096];
                let _ = tokio::time::timeout(Duration::from_secs(1), async {
                    let mut left = MAX_REQUEST;
                    while left > 0 {
                        match tokio::io::AsyncReadExt::read(&mut stream, &mut sink).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => left = left.saturating_sub(n),
                        }
                    }
                })
                .await;
                return;
            }
            Ok(Ok(1)) => {}
            _ => return,
        }
    }
    let mut timed = tokio_io_timeout::TimeoutStream::new(stream);
    timed.set_write_timeout(Some(IO_TIMEOUT));
    timed.set_read_timeout(Some(IDLE_TIMEOUT));
    let timed = Box::pin(timed);
    let service = {
        let state = state.clone();
        hyper::service::service_fn(move |req| handle(req, state.clone()))
    };
    let mut http = hyper::server::conn::http1::Builder::new();
    http.timer(TokioTimer::new())
        .header_read_timeout(IO_TIMEOUT)
        .max_buf_size(MAX_REQUEST);
    match tls {
        None => {
            let _ = http.serve_connection(TokioIo::new(timed), service).await;
        }
        Some(config) => {
            let acceptor = tokio_rustls::TlsAcceptor::from(config);
            let Ok(Ok(stream)) = tokio::time::timeout(IO_TIMEOUT, acceptor.accept(timed)).await
            else {
                return;
            };
            let _ = http.serve_connection(TokioIo::new(stream), service).await;
        }
    }
}

async fn accept_loop(listener: TcpListener, state: Arc<State>) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let stream = match listener.accept().await {
            Ok((stream, _)) => stream,
            Err(_) => {
                // Out of file descriptors, say: the connection stays
                // queued, so wait instead of spinning.
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            let plain = state.web.as_ref().is_none_or(|w| w.tls.is_none());
            tokio::spawn(async move {
                // Over TLS there is no cheap answer: the connection closes.
                if plain {
                    let mut stream = stream;
                    let _ = tokio::time::timeout(
                        Duration::from_millis(100),
                        stream.write_all(
                            b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
                        ),
                    )
                    .await;
                }
            });
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _slot = slot;
            serve_connection(stream, state).await;
        });
    }
}

/// A running exporter.
#[derive(Debug)]
pub(crate) struct Exporter {
    /// Where it listens.
    pub(crate) addr: SocketAddr,
    /// Whether it answers over TLS (`https://`).
    pub(crate) tls: bool,
}

impl Exporter {
    /// The URL of its metrics.
    pub(crate) fn url(&self) -> String {
        format!(
            "{}://{}/metrics",
            if self.tls { "https" } else { "http" },
            self.addr
        )
    }
}

/// Binds `addr` and serves `shared` on the `wattprof-http` thread, with
/// `web`'s TLS and users when given.
pub(crate) fn serve(
    addr: SocketAddr,
    shared: Shared,
    web: Option<WebConfig>,
) -> std::io::Result<Exporter> {
    let listener = std::net::TcpListener::bind(addr)?;
    listener.set_nonblocking(true)?;
    let addr = listener.local_addr()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .enable_time()
        .max_blocking_threads(2)
        .thread_name("wattprof-auth")
        .build()?;
    let cost = Arc::new(ScrapeCost::default());
    let tls = web.as_ref().is_some_and(|w| w.tls.is_some());
    let state = Arc::new(State {
        shared,
        web: web.map(Arc::new),
        cost,
    });
    // Registered with the runtime's reactor on its own thread.
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("wattprof-http".into())
        .spawn(move || {
            runtime.block_on(async move {
                match TcpListener::from_std(listener) {
                    Ok(listener) => {
                        let _ = ready_tx.send(Ok(()));
                        accept_loop(listener, state).await;
                    }
                    Err(e) => {
                        let _ = ready_tx.send(Err(e));
                    }
                }
            });
        })?;
    ready_rx
        .recv()
        .map_err(|_| std::io::Error::other("the exporter's thread ended at start"))??;
    Ok(Exporter { addr, tls })
}

#[cfg(test)]
mod tests;
