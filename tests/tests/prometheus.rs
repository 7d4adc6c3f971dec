//! `wattprof monitor --prometheus` scraped by a real Prometheus server
//! (Debian's `prometheus`, which `cargo xtask test` installs), on loopback.
//! Needs root; run with `--test-threads=1`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use wattprof_tests::{
    FakeRapl, free_port, http_get, require_ebpf, tempfile_dir, testload_bin, wattprof_bin,
};

/// Kills and reaps a child when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts `wattprof monitor --prometheus 127.0.0.1:0 extra...` and returns
/// it with the address it printed.
fn monitor(extra: &[&str]) -> (Reaped, String) {
    let mut child = Command::new(wattprof_bin())
        .args([
            "monitor",
            "--prometheus",
            "127.0.0.1:0",
            "--interval",
            "250ms",
        ])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("monitor");
    let stderr = child.stderr.take().expect("stderr");
    let mut line = String::new();
    BufReader::new(stderr)
        .read_line(&mut line)
        .expect("first line");
    let addr = line
        .split("://")
        .nth(1)
        .and_then(|r| r.split('/').next())
        .unwrap_or_else(|| panic!("no address in: {line}"))
        .to_string();
    (Reaped(child), addr)
}

fn prometheus_bin() -> Option<&'static str> {
    ["/usr/bin/prometheus", "/usr/local/bin/prometheus"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
}

/// Starts Prometheus with `config`, its data in `dir`; with its address.
fn start_prometheus(
    bin: &str,
    config: &std::path::Path,
    dir: &std::path::Path,
) -> (Reaped, String) {
    let prom = format!("127.0.0.1:{}", free_port());
    let server = Command::new(bin)
        .arg(format!("--config.file={}", config.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address={prom}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start prometheus");
    (Reaped(server), prom)
}

/// Runs a PromQL instant query; the result vector.
fn query(prom: &str, q: &str) -> Vec<Value> {
    let path = format!(
        "/api/v1/query?query={}",
        q.bytes()
            .map(|b| if b.is_ascii_alphanumeric() || b == b'_' {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            })
            .collect::<String>()
    );
    http_get(prom, &path)
        .and_then(|(_, body)| serde_json::from_str::<Value>(&body).ok())
        .and_then(|v| v["data"]["result"].as_array().cloned())
        .unwrap_or_default()
}

/// The shipped dashboard's queries are valid PromQL (asked of the
/// Prometheus at `prom`) over series the exporter at `addr` serves (the
/// shipped scrape config is checked with TLS).
fn check_dashboard(prom: &str, addr: &str) {
    let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy");
    let dashboard: Value = serde_json::from_str(
        &std::fs::read_to_string(format!("{root}/grafana-dashboard.json")).expect("dashboard"),
    )
    .expect("dashboard is JSON");
    let scraped = http_get(addr, "/metrics").expect("scrape").1;
    let mut exprs = 0;
    for panel in dashboard["panels"].as_array().expect("panels") {
        for t in panel["targets"].as_array().expect("targets") {
            let expr = t["expr"].as_str().expect("expr");
            let q = expr
                .replace("$__rate_interval", "5s")
                .replace("$__range", "1m")
                .replace("$instance", ".*");
            let path = format!(
                "/api/v1/query?query={}",
                q.bytes()
                    .map(|b| if b.is_ascii_alphanumeric() {
                        (b as char).to_string()
                    } else {
                        format!("%{b:02X}")
                    })
                    .collect::<String>()
            );
            let answer: Value = serde_json::from_str(&http_get(prom, &path).expect("query").1)
                .expect("JSON answer");
            assert_eq!(answer["status"], "success", "{expr}: {answer}");
            for name in expr.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
                // GPU series exist only with GPUs, names only with Docker,
                // batch jobs only with a scheduler (tests/tests/slurm.rs).
                if name.starts_with("wattprof_")
                    && ![
                        "wattprof_gpu_power_watts",
                        "wattprof_container_info",
                        "wattprof_job_energy_joules_total",
                    ]
                    .contains(&name)
                {
                    assert!(scraped.contains(name), "dashboard uses {name}, not served");
                }
            }
            exprs += 1;
        }
    }
    assert!(exprs >= 9);
}

#[test]
fn a_real_prometheus_server_scrapes_energy_per_container_and_domain() {
    require_ebpf!();
    let Some(prom_bin) = prometheus_bin() else {
        wattprof_tests::say_skip(
            "no prometheus binary (cargo xtask test installs Debian's package)",
        );
        return;
    };
    let rapl = FakeRapl::start(30.0, 3.0);
    let (_monitor, addr) = monitor(&[&rapl.arg(), "--duration", "60s"]);
    let dir = tempfile_dir();
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\nscrape_configs:\n  \
             - job_name: wattprof\n    static_configs:\n      - targets: ['{addr}']\n"
        ),
    )
    .expect("config");
    let (_server, prom) = start_prometheus(prom_bin, &config, &dir);
    // Something to measure while it scrapes.
    // In a cgroup named as Docker names them, so container series exist.
    let Some(cg_root) = wattprof_tests::cgroup2_root() else {
        wattprof_tests::say_skip("no cgroup2 mount");
        return;
    };
    let mut cgroups = wattprof_tests::Cgroups::default();
    let scope = cgroups.make(
        &cg_root,
        &format!(
            "wattprof-test-p{}/system.slice/docker-{}.scope",
            std::process::id(),
            "ab".repeat(32)
        ),
    );
    let mut burner = Reaped(wattprof_tests::burn_in(&scope, "burn 20 0.5"));
    let deadline = Instant::now() + Duration::from_secs(40);
    let mut energy = Vec::new();
    while Instant::now() < deadline {
        energy = query(&prom, "wattprof_energy_joules_total{domain=\"package\"}");
        if energy
            .first()
            .and_then(|r| r["value"][1].as_str()?.parse::<f64>().ok())
            .is_some_and(|v| v > 5.0)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let value = |r: &Value| -> f64 {
        r["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    assert_eq!(energy.len(), 1, "{energy:?}");
    assert_eq!(energy[0]["metric"]["package"], "0");
    assert!(value(&energy[0]) > 5.0, "{energy:?}");
    let up = query(&prom, "up{job=\"wattprof\"}");
    assert_eq!(up.first().map(value), Some(1.0), "{up:?}");
    // The cgroup the burner runs in has energy, and the process series
    // are bounded by the top N plus `other`.
    let cg = query(
        &prom,
        "wattprof_cgroup_energy_joules_total{domain=\"package\"}",
    );
    assert!(cg.iter().any(|r| value(r) > 0.0), "{cg:?}");
    let procs = query(&prom, "wattprof_process_power_watts");
    assert!(!procs.is_empty() && procs.len() <= 11, "{procs:?}");
    assert!(
        procs.iter().any(|r| r["metric"]["pid"] == "other"),
        "{procs:?}"
    );
    let busy = query(&prom, "wattprof_cpu_seconds_total{state=\"busy\"}");
    assert!(busy.first().map(value).is_some_and(|v| v > 0.1), "{busy:?}");
    let own = query(&prom, "wattprof_self_cpu_seconds_total");
    assert_eq!(own.len(), 1, "{own:?}");
    check_dashboard(&prom, &addr);
    eprintln!(
        "prometheus: package {:.2} J, {} process series, busy {:.2} s",
        value(&energy[0]),
        procs.len(),
        busy.first().map(value).unwrap_or(0.0)
    );
    let containers = query(&prom, "wattprof_container_cpu_seconds_total");
    assert!(
        containers
            .iter()
            .any(|r| r["metric"]["container_id"] == "ab".repeat(32).as_str()
                && r["metric"]["runtime"] == "docker"),
        "{containers:?}"
    );
    let _ = burner.0.kill();
    let _ = burner.0.wait();
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn series_stay_bounded_through_a_storm_and_bad_requests_do_not_stall_sampling() {
    require_ebpf!();
    let rapl = FakeRapl::start(30.0, 3.0);
    let dir = tempfile_dir();
    let stream = dir.join("s.jsonl");
    let (_monitor, addr) = monitor(&[
        &rapl.arg(),
        "--duration",
        "30s",
        "--prometheus-top",
        "5",
        "--jsonl",
        stream.to_str().expect("utf-8"),
    ]);
    assert_eq!(http_get(&addr, "/nope").map(|(s, _)| s), Some(404));
    // Slow clients that never finish their request, and one with huge
    // headers: sampling must go on.
    let slow: Vec<std::net::TcpStream> = (0..20)
        .filter_map(|_| std::net::TcpStream::connect(&addr).ok())
        .collect();
    let huge = format!("/metrics?{}", "a".repeat(100_000));
    let status = http_get(&addr, &huge).map(|(s, _)| s);
    assert!(matches!(status, Some(431) | Some(503) | None), "{status:?}");
    // 2,000 short-lived processes during the scrapes.
    let mut storm = Reaped(
        Command::new(testload_bin())
            .args(["spawn", "2000"])
            .stdout(Stdio::null())
            .spawn()
            .expect("storm"),
    );
    let started = Instant::now();
    let mut max_series = 0;
    let mut max_process_series = 0;
    while storm.0.try_wait().expect("storm").is_none()
        && started.elapsed() < Duration::from_secs(25)
    {
        // The slow clients hold up to 16 connection slots for 5 s: retry.
        if let Some((200, body)) = http_get(&addr, "/metrics") {
            let samples: Vec<&str> = body.lines().filter(|l| !l.starts_with('#')).collect();
            max_series = max_series.max(samples.len());
            max_process_series = max_process_series.max(
                samples
                    .iter()
                    .filter(|l| l.starts_with("wattprof_process_power_watts"))
                    .count(),
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    drop(slow);
    eprintln!("storm: at most {max_series} series, {max_process_series} process series");
    assert!(max_series > 0, "no scrape answered");
    assert!(max_process_series <= 6, "{max_process_series}");
    assert!(max_series < 60, "{max_series}");
    // Sampling went on: an interval record at least every 250 ms or so.
    let text = std::fs::read_to_string(&stream).expect("stream");
    let intervals = text
        .lines()
        .filter(|l| l.contains("\"type\":\"interval\""))
        .count();
    let elapsed = started.elapsed().as_secs_f64();
    eprintln!("{intervals} intervals in {elapsed:.1} s of monitoring");
    assert!(
        intervals as f64 >= elapsed / 0.25 * 0.8,
        "{intervals} in {elapsed} s"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_finished_container_s_series_end_after_the_grace_period() {
    require_ebpf!();
    let Some(cg_root) = wattprof_tests::cgroup2_root() else {
        wattprof_tests::say_skip("no cgroup2 mount");
        return;
    };
    let id = "cd".repeat(32);
    let mut cgroups = wattprof_tests::Cgroups::default();
    let scope = cgroups.make(
        &cg_root,
        &format!(
            "wattprof-test-g{}/system.slice/docker-{id}.scope",
            std::process::id()
        ),
    );
    let rapl = FakeRapl::start(30.0, 3.0);
    let (_monitor, addr) = monitor(&[&rapl.arg(), "--duration", "60s", "--prometheus-grace", "3s"]);
    let mut burner = wattprof_tests::burn_in(&scope, "cpu 0.3");
    assert!(burner.wait().expect("burner").success());
    let exited = Instant::now();
    let series = || {
        http_get(&addr, "/metrics")
            .map(|(_, body)| {
                body.lines()
                    .filter(|l| l.starts_with("wattprof_container_") && l.contains(&id))
                    .count()
            })
            .expect("the exporter answers /metrics")
    };
    // The exporter's snapshot is rebuilt at most once a second, so the
    // series appear within a second or two of the burner's last interval
    // and end once 3 s of grace have passed since then, plus that age.
    // Polled with deadlines: a loaded machine only makes both later.
    let poll = |want: &dyn Fn(usize) -> bool, within: Duration| -> (usize, Duration) {
        let deadline = Instant::now() + within;
        loop {
            let n = series();
            if want(n) || Instant::now() >= deadline {
                return (n, exited.elapsed());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (during, seen_at) = poll(&|n| n > 0, Duration::from_secs(10));
    let (after, gone_at) = poll(&|n| n == 0, Duration::from_secs(15));
    eprintln!(
        "container series: {during} seen {:.2} s after the exit, gone {:.2} s after",
        seen_at.as_secs_f64(),
        gone_at.as_secs_f64()
    );
    // Energy per domain read (package and DRAM: no GPU, and a domain with
    // no reader has no series), its static part and CPU seconds.
    assert_eq!(
        during, 4,
        "energy per domain read (2), its static part (1) and CPU seconds (1)"
    );
    assert_eq!(
        after, 0,
        "the series still existed {gone_at:?} after the exit (grace 3 s)"
    );
    // The grace period is counted from the last interval the burner ran
    // in, which ended no earlier than its exit.
    assert!(
        gone_at >= Duration::from_secs(3),
        "the series ended {gone_at:?} after the exit, within the 3 s grace period"
    );
}

/// Makes a CA and a certificate for 127.0.0.1 signed by it, in `dir`
/// (`ca.crt`, `server.crt`, `server.key`), with the openssl command.
fn make_certificates(dir: &std::path::Path) -> bool {
    let openssl = |args: &[&str]| {
        Command::new("openssl")
            .current_dir(dir)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    let ec = [
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
    ];
    std::fs::write(
        dir.join("san.ext"),
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
    )
    .is_ok()
        && openssl(
            &[
                &["req", "-x509"][..],
                &ec,
                &["-days", "2", "-subj", "/CN=wattprof-test-ca"],
            ]
            .concat()
            .into_iter()
            .chain(["-keyout", "ca.key", "-out", "ca.crt"])
            .collect::<Vec<_>>(),
        )
        && openssl(
            &[
                &["req"][..],
                &ec,
                &["-subj", "/CN=localhost", "-keyout", "server.key"],
            ]
            .concat()
            .into_iter()
            .chain(["-out", "server.csr"])
            .collect::<Vec<_>>(),
        )
        && openssl(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "san.ext",
            "-out",
            "server.crt",
        ])
}

/// `curl`'s HTTP status for `url` (0: no HTTP answer) and body.
fn curl(args: &[&str], url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "10", "-w", "\n%{http_code}"])
        .args(args)
        .arg(url)
        .output()
        .expect("curl");
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// The shipped scrape config (deploy/prometheus.yml), pointed at the
/// exporter at `addr` and at the CA and password files in `dir`, and
/// checked by promtool where it is installed.
fn shipped_scrape_config(
    dir: &std::path::Path,
    deploy: &std::path::Path,
    addr: &str,
    ca: &str,
) -> std::path::PathBuf {
    std::fs::write(dir.join("password"), "change-me").expect("password");
    let mut config =
        std::fs::read_to_string(deploy.join("prometheus.yml")).expect("deploy/prometheus.yml");
    for (from, to) in [
        ("/etc/prometheus/wattprof-ca.crt", ca.to_string()),
        (
            "/etc/prometheus/wattprof.password",
            dir.join("password").display().to_string(),
        ),
        (
            "'host-a.example:9101', 'host-b.example:9101'",
            format!("'{addr}'"),
        ),
        ("scrape_interval: 15s", "scrape_interval: 1s".into()),
    ] {
        assert!(
            config.contains(from),
            "deploy/prometheus.yml no longer has {from}"
        );
        config = config.replace(from, &to);
    }
    let config_path = dir.join("prometheus.yml");
    std::fs::write(&config_path, config).expect("config");
    if std::path::Path::new("/usr/bin/promtool").exists() {
        let check = Command::new("/usr/bin/promtool")
            .arg("check")
            .arg("config")
            .arg(&config_path)
            .output()
            .expect("promtool");
        assert!(
            check.status.success(),
            "{}",
            String::from_utf8_lossy(&check.stderr)
        );
    }
    config_path
}

#[test]
fn prometheus_scrapes_over_tls_with_basic_auth_from_the_shipped_configs() {
    require_ebpf!();
    let Some(prom_bin) = prometheus_bin() else {
        wattprof_tests::say_skip(
            "no prometheus binary (cargo xtask test installs Debian's package)",
        );
        return;
    };
    if !std::path::Path::new("/usr/bin/curl").exists() {
        wattprof_tests::say_skip("no curl (cargo xtask test installs it)");
        return;
    }
    let dir = tempfile_dir();
    if !make_certificates(&dir) {
        wattprof_tests::say_skip("the openssl command could not make certificates");
        return;
    }
    // The shipped web config as it is: its certificate names are those
    // made above, and its example user's password is "change-me".
    let deploy = std::path::Path::new(concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy"));
    std::fs::copy(deploy.join("web-config.yml"), dir.join("web.yml")).expect("web config");
    let rapl = FakeRapl::start(30.0, 3.0);
    let web = dir.join("web.yml");
    let (_monitor, addr) = monitor(&[
        &rapl.arg(),
        "--duration",
        "60s",
        "--web-config",
        web.to_str().expect("utf-8"),
    ]);
    let url = format!("https://{addr}/metrics");
    let ca = dir.join("ca.crt");
    let ca = ca.to_str().expect("utf-8");
    let (status, body) = curl(&["--cacert", ca, "-u", "prometheus:change-me"], &url);
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("wattprof_cpu_seconds_total"), "{body}");
    let (status, body) = curl(&["--cacert", ca, "-u", "prometheus:wrong"], &url);
    assert_eq!(status, 401, "{body}");
    assert!(!body.contains("wattprof_"), "{body}");
    assert_eq!(curl(&["--cacert", ca], &url).0, 401);
    // A client that does not trust the certificate fails its handshake.
    assert_eq!(curl(&["-u", "prometheus:change-me"], &url).0, 0);
    // Plain HTTP to the TLS port gets one line saying so, as Go's servers
    // (node_exporter) answer.
    let plain = http_get(&addr, "/metrics");
    assert!(
        plain
            .as_ref()
            .is_some_and(|(s, b)| *s == 400 && b.contains("HTTPS server")),
        "{plain:?}"
    );
    let config_path = shipped_scrape_config(&dir, deploy, &addr, ca);
    let (_server, prom) = start_prometheus(prom_bin, &config_path, &dir);
    let deadline = Instant::now() + Duration::from_secs(40);
    let value = |r: &Value| -> f64 {
        r["value"][1]
            .as_str()
            .and_then(|v| v.parse().ok())
            .unwrap_or(f64::NAN)
    };
    let (mut up, mut energy) = (Vec::new(), Vec::new());
    while Instant::now() < deadline {
        up = query(&prom, "up{job=\"wattprof\"}");
        energy = query(&prom, "wattprof_energy_joules_total{domain=\"package\"}");
        if up.first().map(value) == Some(1.0) && energy.first().map(value).is_some_and(|v| v > 1.0)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let targets = http_get(&prom, "/api/v1/targets")
        .map(|(_, b)| b)
        .unwrap_or_default();
    assert_eq!(up.first().map(value), Some(1.0), "{up:?} {targets}");
    assert!(
        energy.first().map(value).is_some_and(|v| v > 1.0),
        "{energy:?}"
    );
    assert!(targets.contains("https://"), "{targets}");
    eprintln!(
        "prometheus over TLS with basic auth: up 1, package {:.2} J",
        value(&energy[0])
    );
    let _ = std::fs::remove_dir_all(&dir);
}
