use std::io::{Read, Write};
use std::net::TcpStream;

use base64::Engine;

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

fn energy_snapshot() -> Shared {
    Arc::new(std::sync::Mutex::new(Arc::new(Snapshot {
        families: vec![(
            &crate::sink::prometheus::ENERGY,
            vec![(vec![("domain".into(), "package".into())], 2.0)],
        )],
    })))
}

#[test]
fn paths_formats_and_bad_clients() {
    let shared = energy_snapshot();
    let ex = serve("127.0.0.1:0".parse().expect("addr"), shared.clone(), None).expect("serve");
    assert!(ex.url().starts_with("http://127.0.0.1:"));
    // A slow client holding a connection open does not stop others.
    let slow = TcpStream::connect(ex.addr).expect("slow client");
    let text = get(
        ex.addr,
        b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n",
    );
    assert!(text.starts_with("HTTP/1.1 200"), "{text}");
    assert!(text.contains("text/plain; version=0.0.4"), "{text}");
    assert!(
        text.contains("wattprof_energy_joules_total{domain=\"package\"} 2.0"),
        "{text}"
    );
    let om = get(
        ex.addr,
        b"GET /metrics HTTP/1.1\r\nAccept: application/openmetrics-text;version=1.0.0\r\nConnection: close\r\n\r\n",
    );
    assert!(
        om.contains("application/openmetrics-text") && om.contains("# EOF"),
        "{om}"
    );
    let head = get(ex.addr, b"HEAD /metrics HTTP/1.0\r\n\r\n");
    assert!(
        head.starts_with("HTTP/1.0 200") && !head.contains("wattprof_energy"),
        "{head}"
    );
    assert!(get(ex.addr, b"GET /nope HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 404"));
    assert!(get(ex.addr, b"POST /metrics HTTP/1.0\r\n\r\n").starts_with("HTTP/1.0 405"));
    let mut huge = b"GET /metrics HTTP/1.1\r\nX: ".to_vec();
    huge.extend(std::iter::repeat_n(b'a', 64 * 1024));
    let answer = get(ex.addr, &huge);
    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    // A new snapshot is served at once.
    *shared.lock().expect("lock") = Arc::new(Snapshot::default());
    assert!(!get(ex.addr, b"GET /metrics HTTP/1.0\r\n\r\n").contains("wattprof_energy"));
    // The exporter's own cost is counted.
    let text = get(ex.addr, b"GET /metrics HTTP/1.0\r\n\r\n");
    assert!(
        text.contains("wattprof_exporter_scrapes_total{} 4"),
        "{text}"
    );
    drop(slow);
    assert!(parse_addr("9101").is_ok_and(|a| a.ip().is_loopback()));
    assert!(parse_addr("0.0.0.0:9101").is_ok());
    assert!(parse_addr("nope").is_err());
}

#[test]
fn connections_past_the_limit_get_503_and_slots_come_back() {
    let ex = serve(
        "127.0.0.1:0".parse().expect("addr"),
        energy_snapshot(),
        None,
    )
    .expect("serve");
    let held: Vec<TcpStream> = (0..MAX_CONNECTIONS)
        .map(|_| TcpStream::connect(ex.addr).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let refused = get(ex.addr, b"GET /metrics HTTP/1.0\r\n\r\n");
    assert!(refused.starts_with("HTTP/1.1 503"), "{refused}");
    drop(held);
    std::thread::sleep(Duration::from_millis(200));
    let served = get(ex.addr, b"GET /metrics HTTP/1.0\r\n\r\n");
    assert!(served.starts_with("HTTP/1.0 200"), "{served}");
}

#[test]
fn basic_auth_answers_401_without_the_right_password() {
    let dir = tempfile::tempdir().expect("dir");
    let config = dir.path().join("web.yml");
    let hash = bcrypt::hash("s3cret", 4).expect("hash");
    std::fs::write(
        &config,
        format!("basic_auth_users:\n  prom: '{hash}'\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\n"),
    )
    .expect("write");
    let web = WebConfig::load(&config).expect("load");
    let ex = serve(
        "127.0.0.1:0".parse().expect("addr"),
        energy_snapshot(),
        Some(web),
    )
    .expect("serve");
    let with = |user: &str, password: &str| {
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
        get(
            ex.addr,
            format!("GET /metrics HTTP/1.0\r\nAuthorization: Basic {token}\r\n\r\n").as_bytes(),
        )
    };
    let none = get(ex.addr, b"GET /metrics HTTP/1.0\r\n\r\n");
    assert!(none.starts_with("HTTP/1.0 401"), "{none}");
    assert!(none.contains("www-authenticate: Basic"), "{none}");
    assert!(!none.contains("wattprof_energy"), "{none}");
    for (user, password) in [("prom", "wrong"), ("nobody", "s3cret"), ("prom", "")] {
        let denied = with(user, password);
        assert!(
            denied.starts_with("HTTP/1.0 401"),
            "{user}:{password}: {denied}"
        );
    }
    for _ in 0..2 {
        let ok = with("prom", "s3cret");
        assert!(ok.starts_with("HTTP/1.0 200"), "{ok}");
        assert!(ok.contains("wattprof_energy_joules_total"), "{ok}");
        assert!(ok.contains("x-frame-options: deny"), "{ok}");
    }
}

#[test]
fn plain_http_to_the_tls_port_gets_a_line_saying_so() {
    let dir = tempfile::tempdir().expect("dir");
    let d = dir.path();
    if !crate::testutil::self_signed(d) {
        skip_test!("no openssl command to make a certificate");
        return;
    }
    let config = d.join("web.yml");
    std::fs::write(
        &config,
        "tls_server_config:\n  cert_file: c.pem\n  key_file: k.pem\n",
    )
    .expect("write");
    let web = WebConfig::load(&config).expect("load");
    let ex = serve(
        "127.0.0.1:0".parse().expect("addr"),
        energy_snapshot(),
        Some(web),
    )
    .expect("serve");
    assert!(ex.url().starts_with("https://"));
    let answer = get(ex.addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n");
    assert!(
        answer.starts_with("HTTP/1.0 400") && answer.contains("HTTPS server"),
        "{answer}"
    );
    // A client that connects and says nothing is dropped, and others are
    // still served.
    let _silent = TcpStream::connect(ex.addr).expect("connect");
    let again = get(ex.addr, b"GET / HTTP/1.0\r\n\r\n");
    assert!(again.starts_with("HTTP/1.0 400"), "{again}");
}
