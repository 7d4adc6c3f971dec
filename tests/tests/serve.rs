//! The daemon (`monitor --serve`) with clients run as `nobody`: an
//! unprivileged `wattprof run` measures like a root one, a Python window
//! in a program not started by wattprof is answered and recorded, no one
//! measures another user's process, the side-channel limits hold, hostile
//! input leaves the daemon serving, and a client killed mid-run leaves no
//! state. Needs root (to start the daemon and become `nobody`) and
//! `setpriv`; run with `--test-threads=1`.

use std::io::{BufRead, BufReader, Write};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use wattprof_tests::{
    FakeRapl, PowerLaw, executable_by_others, f, read_json, require_ebpf, tempfile_dir, u,
    wattprof_bin, wattprof_run,
};

/// A daemon on a socket in its own directory, stopped (SIGTERM) when
/// dropped.
struct Daemon {
    child: Child,
    sock: PathBuf,
    dir: PathBuf,
}

impl Daemon {
    fn start(extra: &[&str]) -> Self {
        let dir = tempfile_dir();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let sock = dir.join("wattprof.sock");
        let child = Command::new(wattprof_bin())
            .arg("monitor")
            .arg("--serve")
            .arg(&sock)
            .arg("--output")
            .arg(dir.join("daemon.json"))
            .args(extra)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start the daemon");
        let until = Instant::now() + Duration::from_secs(30);
        while UnixStream::connect(&sock).is_err() {
            assert!(Instant::now() < until, "the daemon did not listen");
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { child, sock, dir }
    }

    fn rss_kb(&self) -> u64 {
        let status =
            std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).expect("status");
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next()?.parse().ok())
            .expect("VmRSS")
    }

    /// Stops it and returns its recording.
    fn stop(mut self) -> Value {
        // SAFETY: kill with a pid we own.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let status = self.child.wait().expect("wait");
        assert!(status.success(), "the daemon failed: {status}");
        read_json(&self.dir.join("daemon.json"))
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A root connection to ask `status`.
fn status(sock: &Path) -> Value {
    let s = UnixStream::connect(sock).expect("connect");
    let mut r = BufReader::new(s.try_clone().expect("clone"));
    (&s).write_all(b"status id=1\n").expect("send");
    let mut line = String::new();
    r.read_line(&mut line).expect("answer");
    serde_json::from_str(&line).expect("JSON")
}

/// `cmd` as user `nobody` (no groups, no capabilities), in `dir`.
fn as_nobody(dir: &Path, env: &[(&str, &str)], cmd: &[&str]) -> Command {
    let mut c = Command::new("setpriv");
    c.args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .args(cmd)
        .current_dir(dir)
        .env("TMPDIR", dir)
        .env_remove("WATTPROF_SOCKET");
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// The system's Python (`nobody` cannot run a root user's pyenv shim).
const PYTHON: &str = "/usr/bin/python3";

fn skip() -> bool {
    if !Path::new("/usr/bin/setpriv").exists() {
        wattprof_tests::say_skip("no setpriv (util-linux; cargo xtask test installs it)");
        return true;
    }
    false
}

/// A directory `nobody` may write in.
fn open_dir() -> PathBuf {
    let dir = tempfile_dir();
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    dir
}

fn python_client() -> String {
    // Readable by nobody: a copy in an open directory.
    let dir = open_dir();
    let src = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../clients/python/wattprof");
    let dest = dir.join("wattprof");
    std::fs::create_dir(&dest).expect("mkdir");
    std::fs::copy(src.join("__init__.py"), dest.join("__init__.py")).expect("copy");
    for p in [&dir, &dest] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    std::fs::set_permissions(
        dest.join("__init__.py"),
        std::fs::Permissions::from_mode(0o644),
    )
    .expect("chmod");
    dir.to_string_lossy().into_owned()
}

fn joules_per_cpu_s(report: &Value) -> f64 {
    f(report, "/command/energy/total_j") / (u(report, "/command/on_cpu_ns") as f64 / 1e9)
}

fn said(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// The stream: a header, the tree's intervals, the summary; the intervals
/// add up to the tree's energy and are the recording's; one --csv row.
fn check_streams(report: &Value, jsonl: &Path, csv: &Path) {
    let lines: Vec<Value> = std::fs::read_to_string(jsonl)
        .expect("the stream")
        .lines()
        .map(|l| serde_json::from_str(l).expect("a JSON line"))
        .collect();
    assert_eq!(lines[0]["type"], "header");
    assert_eq!(lines.last().expect("a summary")["type"], "summary");
    let streamed: f64 = lines
        .iter()
        .filter(|l| l["type"] == "interval")
        .map(|l| f(l, "/groups/tree/energy_j"))
        .sum();
    let total = f(report, "/command/energy/total_j");
    assert!(
        (streamed - total).abs() < 1e-5 * total.max(1.0),
        "{streamed} != {total}"
    );
    assert_eq!(
        report["intervals"].as_array().map(Vec::len),
        Some(lines.len() - 2),
        "the recording holds the streamed intervals"
    );
    let rows = std::fs::read_to_string(csv).expect("the --csv row");
    assert_eq!(
        rows.lines().count(),
        2,
        "codecarbon's header and one row: {rows}"
    );
}

#[test]
fn nobodys_run_through_the_daemon_measures_as_roots_run_does() {
    require_ebpf!();
    if skip() {
        return;
    }
    let law = PowerLaw {
        static_w: 20.0,
        per_cpu_w: 10.0,
    };
    let dram = PowerLaw {
        static_w: 2.0,
        per_cpu_w: 1.0,
    };
    let rapl = FakeRapl::following(law, dram);
    // This host's model, as `calibrate` would fit it, for both: with none,
    // the static power is the lowest power seen so far, which a daemon
    // that has run longer has seen lower (static_power.rs).
    let models = tempfile_dir();
    let model = wattprof_tests::host_model_file(&models, law, dram);
    let model = model.to_string_lossy().into_owned();
    let daemon = Daemon::start(&[&rapl.arg(), "--host-model", &model]);
    let wattprof = executable_by_others(&wattprof_bin());
    let load = executable_by_others(&wattprof_tests::testload_bin());
    let load = load.path.to_string_lossy().into_owned();
    let dir = open_dir();
    let mut mine = Vec::new();
    let mut roots = Vec::new();
    // Alternated, three each: the VM's noise falls on both.
    for round in 0..3 {
        let root = wattprof_run(&[&rapl.arg(), "--host-model", &model], &[&load, "cpu", "2"]);
        assert!(root.output.status.success(), "{}", root.stderr());
        roots.push(joules_per_cpu_s(root.report()));
        let out = dir.join(format!("nobody-{round}.json"));
        let (jsonl, csv) = (
            dir.join(format!("nobody-{round}.jsonl")),
            dir.join(format!("nobody-{round}.csv")),
        );
        let o = as_nobody(
            &dir,
            &[],
            &[
                &wattprof.path.to_string_lossy(),
                "run",
                "--daemon",
                &daemon.sock.to_string_lossy(),
                "--output",
                &out.to_string_lossy(),
                "--jsonl",
                &jsonl.to_string_lossy(),
                "--csv",
                &csv.to_string_lossy(),
                "--",
                &load,
                "cpu",
                "2",
            ],
        )
        .output()
        .expect("setpriv");
        assert!(o.status.success(), "{}", said(&o));
        let report = read_json(&out);
        check_streams(&report, &jsonl, &csv);
        wattprof_tests::schema::assert_valid("recording", &report);
        assert_eq!(report["served"]["machine_withheld"], true, "{report}");
        assert!(report["served"]["missing"].is_null(), "{report}");
        // Its own rows: the burner, named.
        assert!(
            report["processes"]
                .as_array()
                .expect("rows")
                .iter()
                .any(|p| p["comm"] == "wp-cpu"),
            "{report}"
        );
        assert!(u(&report, "/command/on_cpu_ns") > 1_900_000_000, "{report}");
        mine.push(joules_per_cpu_s(&report));
    }
    roots.sort_by(f64::total_cmp);
    mine.sort_by(f64::total_cmp);
    let (root, nobody) = (roots[1], mine[1]);
    eprintln!("J per CPU-s: root {roots:?}, nobody via the daemon {mine:?}");
    assert!(
        (nobody / root - 1.0).abs() < 0.02,
        "nobody {nobody:.4} J/CPU-s, root {root:.4} (medians of {mine:?} and {roots:?})"
    );
    let _ = std::fs::remove_dir_all(&dir);
    daemon.stop();
    let _ = std::fs::remove_dir_all(&models);
}

#[test]
fn a_python_window_outside_run_is_answered_and_inside_run_recorded() {
    require_ebpf!();
    if skip() {
        return;
    }
    let rapl = FakeRapl::start(30.0, 3.0);
    let daemon = Daemon::start(&[&rapl.arg(), "--host-model", "none"]);
    let py = python_client();
    let dir = open_dir();
    let script = "import json, time, wattprof\n\
        with wattprof.window('burn') as w:\n\
        \x20   t = time.time()\n\
        \x20   while time.time() - t < 1.2: pass\n\
        print(json.dumps(w.measurement.raw))\n";
    let sock = daemon.sock.to_string_lossy().into_owned();
    // A program not started by wattprof: the daemon answers.
    let o = as_nobody(
        &dir,
        &[("PYTHONPATH", &py), ("WATTPROF_DAEMON", &sock)],
        &[PYTHON, "-c", script],
    )
    .output()
    .expect("python3");
    assert!(o.status.success(), "{}", said(&o));
    let w: Value = serde_json::from_slice(&o.stdout).expect("the window");
    assert!(f(&w, "/energy/total_j") > 0.0, "{w}");
    assert!(u(&w, "/on_cpu_ns") > 1_100_000_000, "{w}");
    // No machine figures, and a second at least.
    assert_eq!(w["machine"], serde_json::json!([]), "{w}");
    assert!(
        u(&w, "/end_ns") - u(&w, "/begin_ns") >= 1_000_000_000,
        "{w}"
    );
    // A client that closes its writing side after `end` (`nc -N`) still
    // gets the window, then the daemon closes.
    let half = format!(
        "import socket, json\n\
         s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect({sock:?})\n\
         s.sendall(b'begin h id=1\\nend h id=2\\n'); s.shutdown(socket.SHUT_WR)\n\
         print(json.dumps([json.loads(l) for l in s.makefile()]))\n"
    );
    let o = as_nobody(&dir, &[], &[PYTHON, "-c", &half])
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", said(&o));
    let answers: Value = serde_json::from_slice(&o.stdout).expect("answers");
    assert_eq!(answers[0]["begun"], true, "{answers}");
    assert_eq!(answers[1]["window"]["name"], "h", "{answers}");
    // Under nobody's `wattprof run`: the answer is the recording's.
    let wattprof = executable_by_others(&wattprof_bin());
    let out = dir.join("run.json");
    let o = as_nobody(
        &dir,
        &[("PYTHONPATH", &py)],
        &[
            &wattprof.path.to_string_lossy(),
            "run",
            "--daemon",
            &sock,
            "--output",
            &out.to_string_lossy(),
            "--",
            PYTHON,
            "-c",
            script,
        ],
    )
    .output()
    .expect("setpriv");
    assert!(o.status.success(), "{}", said(&o));
    let told: Value = serde_json::from_slice(&o.stdout).expect("the window");
    let report = read_json(&out);
    assert_eq!(report["windows"][0], told, "{report}");
    assert!(f(&told, "/energy/total_j") > 0.0);
    let _ = std::fs::remove_dir_all(&dir);
    daemon.stop();
}

#[test]
fn nobody_cannot_measure_another_users_process_and_is_rate_limited() {
    require_ebpf!();
    if skip() {
        return;
    }
    let daemon = Daemon::start(&["--host-model", "none"]);
    let py = python_client();
    let dir = open_dir();
    let sock = daemon.sock.to_string_lossy().into_owned();
    // Root's process (pid 1) by pid: follow, and a window.
    for request in ["follow pid=1", "begin w pid=1"] {
        let script = format!(
            "import socket, json, sys\n\
             s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect({sock:?})\n\
             s.sendall(b'{request} id=1\\n')\n\
             a = json.loads(s.makefile().readline())\n\
             if 'error' in a: print('wattprof:', a['error'], file=sys.stderr); sys.exit(1)\n"
        );
        let o = as_nobody(&dir, &[("PYTHONPATH", &py)], &[PYTHON, "-c", &script])
            .output()
            .expect("python3");
        assert_eq!(o.status.code(), Some(1), "{request}: {}", said(&o));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(err.lines().count(), 1, "{err}");
        assert!(err.contains("process 1 is not yours (uid 0)"), "{err}");
    }
    // 1,000 requests in a second: the burst and the rate, no more.
    let script = format!(
        "import socket, json, time\n\
         s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM); s.connect({sock:?})\n\
         f = s.makefile()\n\
         t = time.time(); ok = 0; limited = 0\n\
         for i in range(1000):\n\
         \x20   s.sendall(b'status id=%d\\n' % i)\n\
         \x20   a = json.loads(f.readline())\n\
         \x20   if 'error' in a: limited += 1\n\
         \x20   else: ok += 1\n\
         \x20   time.sleep(max(0, t + (i + 1) / 1000 - time.time()))\n\
         print(json.dumps({{'ok': ok, 'limited': limited, 's': time.time() - t}}))\n"
    );
    let o = as_nobody(&dir, &[], &[PYTHON, "-c", &script])
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", said(&o));
    let got: Value = serde_json::from_slice(&o.stdout).expect("counts");
    let secs = f(&got, "/s");
    let ok = u(&got, "/ok") as f64;
    eprintln!("1,000 requests in {secs:.2} s: {got}");
    // 40 at once, then 20 a second.
    assert!(ok <= 40.0 + 20.0 * secs + 1.0, "{got}");
    assert!(ok >= 40.0, "{got}");
    let _ = std::fs::remove_dir_all(&dir);
    daemon.stop();
}

#[test]
fn hostile_input_leaves_the_daemon_serving_and_a_killed_client_leaves_nothing() {
    require_ebpf!();
    if skip() {
        return;
    }
    let daemon = Daemon::start(&["--host-model", "none", "--interval", "1s"]);
    let dir = open_dir();
    let sock = daemon.sock.to_string_lossy().into_owned();
    let rss_before = daemon.rss_kb();
    // 100,000 messages from nobody: random bytes, oversized lines, lines
    // with no end, over many connections; datagrams the kernel refuses.
    let script = format!(
        "import os, random, socket\n\
         random.seed(7); sent = 0; refused = 0; cut = 0\n\
         while sent < 100000:\n\
         \x20   s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n\
         \x20   s.connect({sock:?}); s.settimeout(10)\n\
         \x20   for i in range(1000):\n\
         \x20       k = random.random()\n\
         \x20       m = os.urandom(random.randint(1, 300)) if k < 0.5 else (b'begin ' + b'x' * random.randint(1, 5000)) if k < 0.7 else random.choice([b'end nothing', b'follow pid=1', b'finish pid=99999999', b'begin a pid=-1', b'status', b'\\x00' * 50])\n\
         \x20       try: s.sendall(m + b'\\n'); sent += 1\n\
         \x20       except OSError: cut += 1; break\n\
         \x20   s.close()\n\
         for i in range(100):\n\
         \x20   d = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\n\
         \x20   try: d.sendto(os.urandom(100), {sock:?})\n\
         \x20   except OSError: refused += 1\n\
         print(sent, 'sent,', cut, 'connections cut off,', refused, 'datagrams refused')\n"
    );
    let o = as_nobody(&dir, &[], &[PYTHON, "-c", &script])
        .output()
        .expect("python3");
    assert!(o.status.success(), "{}", said(&o));
    eprintln!(
        "hostile client: {}",
        String::from_utf8_lossy(&o.stdout).trim()
    );
    // Still serving, holding nothing of the hostile client.
    let st = status(&daemon.sock);
    assert_eq!(st["status"]["follows"], 0, "{st}");
    assert_eq!(st["status"]["windows"], 0, "{st}");
    let rss_after = daemon.rss_kb();
    eprintln!("daemon RSS {rss_before} kB before, {rss_after} kB after 100,000 hostile messages");
    assert!(
        rss_after < rss_before + 32 * 1024,
        "{rss_before} -> {rss_after} kB"
    );
    // A client killed mid-run: its follow is gone within one interval.
    // (The flood spent nobody's requests: the rate refills first.)
    std::thread::sleep(Duration::from_secs(3));
    let wattprof = executable_by_others(&wattprof_bin());
    let mut client = as_nobody(
        &dir,
        &[],
        &[
            &wattprof.path.to_string_lossy(),
            "run",
            "--daemon",
            &sock,
            "--",
            "sleep",
            "30",
        ],
    )
    .stderr(Stdio::null())
    .spawn()
    .expect("setpriv");
    let until = Instant::now() + Duration::from_secs(10);
    while status(&daemon.sock)["status"]["follows"] != 1 {
        assert!(Instant::now() < until, "the client never followed");
        std::thread::sleep(Duration::from_millis(50));
    }
    client.kill().expect("SIGKILL the client");
    let killed = Instant::now();
    client.wait().expect("wait");
    while status(&daemon.sock)["status"]["follows"] != 0 {
        assert!(
            killed.elapsed() < Duration::from_secs(1),
            "the killed client's follow outlived an interval"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!("killed client's state freed after {:?}", killed.elapsed());
    let _ = Command::new("pkill")
        .args(["-x", "sleep", "-U", "65534"])
        .status();
    // Nothing the daemon recorded was lost: its recording is whole.
    let recording = daemon.stop();
    assert!(
        recording["intervals"]
            .as_array()
            .is_some_and(|i| !i.is_empty())
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_daemon_that_goes_away_mid_run_is_said_and_the_run_fails() {
    require_ebpf!();
    if skip() {
        return;
    }
    let daemon = Daemon::start(&["--host-model", "none"]);
    let dir = open_dir();
    let wattprof = executable_by_others(&wattprof_bin());
    let out = dir.join("run.json");
    let client = as_nobody(
        &dir,
        &[],
        &[
            &wattprof.path.to_string_lossy(),
            "run",
            "--daemon",
            &daemon.sock.to_string_lossy(),
            "--output",
            &out.to_string_lossy(),
            "--",
            "sleep",
            "4",
        ],
    )
    .stderr(Stdio::piped())
    .spawn()
    .expect("setpriv");
    std::thread::sleep(Duration::from_millis(2500));
    drop(daemon);
    let o = client.wait_with_output().expect("wait");
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("went away"), "{err}");
    let report = read_json(&out);
    wattprof_tests::schema::assert_valid("recording", &report);
    let missing = report["served"]["missing"][0]
        .as_str()
        .expect("what is missing");
    assert!(
        missing.contains("went away") && missing.contains("missing"),
        "{missing}"
    );
    // A daemon whose intervals are shorter than the users' second: refused.
    let o = Command::new(wattprof_bin())
        .args(["monitor", "--serve"])
        .arg(dir.join("x.sock"))
        .args(["--interval", "100ms"])
        .output()
        .expect("wattprof");
    assert_eq!(o.status.code(), Some(2), "{}", said(&o));
    assert!(
        said(&o).contains("--serve needs --interval 1s or more"),
        "{}",
        said(&o)
    );
    // Neither root nor a daemon: both ways out, in one line.
    let o = as_nobody(
        &dir,
        &[("WATTPROF_DAEMON", "/nonexistent/wattprof.sock")],
        &[&wattprof.path.to_string_lossy(), "run", "--", "true"],
    )
    .output()
    .expect("setpriv");
    assert_eq!(o.status.code(), Some(125), "{}", said(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("CAP_BPF") && err.contains("wattprof monitor --serve"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
