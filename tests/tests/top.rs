//! `wattprof top` in a real terminal: tmux runs it, `send-keys` types,
//! `capture-pane` reads the screen. The fixture RAPL gives the energy.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use wattprof_tests::{
    FakeRapl, docker_image, require_ebpf, tempfile_dir, testload_bin, wattprof_bin,
};

/// A tmux session running `wattprof top` (killed on drop).
struct Screen {
    name: String,
    dir: PathBuf,
    _rapl: FakeRapl,
}

impl Screen {
    /// `wattprof top` on the fixture RAPL at 500 ms, streaming to
    /// `stream.jsonl` in its directory, in a 140x100 terminal (room for
    /// the tree of a loaded machine).
    fn start(extra: &[&str]) -> Option<Self> {
        if !Path::new("/usr/bin/tmux").exists() {
            wattprof_tests::say_skip("tmux is not installed (apt-get install tmux)");
            return None;
        }
        let rapl = FakeRapl::start(30.0, 3.0);
        let dir = tempfile_dir();
        let name = format!("wattprof-top-{}", std::process::id());
        let stream = dir.join("stream.jsonl");
        let mut cmd = format!(
            "env WATTPROF_HOST_MODEL=none {} top {} --no-gpu --interval 500ms --jsonl {}",
            wattprof_bin().display(),
            rapl.arg(),
            stream.display()
        );
        for a in extra {
            cmd.push(' ');
            cmd.push_str(a);
        }
        // The exit status and what was printed after are kept on screen.
        let cmd = format!("{cmd}; echo EXIT=$?; sleep 600");
        let _ = tmux(&["kill-session", "-t", &name]);
        let ok = tmux(&[
            "new-session",
            "-d",
            "-s",
            &name,
            "-x",
            "140",
            "-y",
            "40",
            &cmd,
        ]);
        assert!(ok, "tmux new-session");
        let s = Self {
            name,
            dir,
            _rapl: rapl,
        };
        s.wait_for("the first rows", |t| {
            t.contains("COMMAND") && t.contains("package 0")
        });
        Some(s)
    }

    fn capture(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.name])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    fn keys(&self, keys: &[&str]) {
        for k in keys {
            assert!(tmux(&["send-keys", "-t", &self.name, k]), "send-keys {k}");
        }
        // A key is taken within the loop's longest sleep (200 ms).
        std::thread::sleep(Duration::from_millis(400));
    }

    /// Waits up to 15 s for the screen to satisfy `ok`.
    fn wait_for(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        let t0 = Instant::now();
        loop {
            let text = self.capture();
            if ok(&text) {
                return text;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(15),
                "no {what} on screen:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// A tmux format of the pane (`#{alternate_on}`, `#{cursor_flag}`).
    fn pane(&self, format: &str) -> String {
        let out = Command::new("tmux")
            .args(["display-message", "-p", "-t", &self.name, format])
            .output()
            .expect("tmux display-message");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    fn stream(&self) -> Vec<Value> {
        std::fs::read_to_string(self.dir.join("stream.jsonl"))
            .unwrap_or_default()
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        // wattprof first (the pane's shell would not pass a hang-up on),
        // so that none outlives a failed test.
        let pane = self.pane("#{pane_pid}");
        let _ = Command::new("pkill").args(["-TERM", "-P", &pane]).status();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(10)
            && Command::new("pgrep")
                .args(["-P", &pane, "wattprof"])
                .output()
                .is_ok_and(|o| !o.stdout.is_empty())
        {
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = tmux(&["kill-session", "-t", &self.name]);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn tmux(args: &[&str]) -> bool {
    Command::new("tmux")
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// The table's rows: each line under the heading up to the first blank.
fn rows(screen: &str) -> Vec<Vec<String>> {
    screen
        .lines()
        .skip_while(|l| !l.trim_start().starts_with("PID"))
        .skip(1)
        .take_while(|l| !l.trim().is_empty() && !l.contains("F10Quit"))
        .map(|l| l.split_whitespace().map(String::from).collect())
        .collect()
}

fn pids(screen: &str) -> Vec<u32> {
    rows(screen)
        .iter()
        .filter_map(|r| r.first()?.parse().ok())
        .collect()
}

/// Two burners of different weight under one shell, killed (the whole
/// group) on drop, a failed test's too.
struct Burners(std::process::Child);

impl Burners {
    fn start() -> Self {
        let load = testload_bin();
        Self(
            Command::new("sh")
                .arg("-c")
                .arg(format!(
                    "{0} burn 60 1.0 & {0} burn 60 0.3 & wait",
                    load.display()
                ))
                .process_group(0)
                .spawn()
                .expect("burners"),
        )
    }

    fn id(&self) -> u32 {
        self.0.id()
    }
}

impl Drop for Burners {
    fn drop(&mut self) {
        // SAFETY: kill has no memory preconditions; the group is the child's.
        unsafe { libc::kill(-(self.0.id() as i32), libc::SIGKILL) };
        let _ = self.0.wait();
    }
}

use std::os::unix::process::CommandExt;

#[test]
fn keys_sort_filter_and_tree_the_rows() {
    require_ebpf!();
    let load = Burners::start();
    let Some(s) = Screen::start(&[]) else {
        return;
    };
    s.wait_for("the burners", |t| t.matches("wp-burn").count() >= 2);
    // By PID, ascending; `I` turns it round.
    s.keys(&["N"]);
    let up = pids(&s.capture());
    assert!(up.len() > 3 && up.windows(2).all(|w| w[0] < w[1]), "{up:?}");
    s.keys(&["I"]);
    let down = pids(&s.capture());
    assert!(down.windows(2).all(|w| w[0] > w[1]), "{down:?}");
    // The filter: only burners (an earlier test's may still show in the
    // interval it exited in), ours among them.
    let ours: Vec<u32> = String::from_utf8_lossy(
        &Command::new("pgrep")
            .args(["-P", &load.id().to_string()])
            .output()
            .expect("pgrep")
            .stdout,
    )
    .split_whitespace()
    .filter_map(|p| p.parse().ok())
    .collect();
    assert_eq!(ours.len(), 2, "the shell's two burners");
    s.keys(&["/", "wp-burn", "Enter"]);
    let text = s.capture();
    let shown = rows(&text);
    assert!(
        shown
            .iter()
            .all(|r| r.last().is_some_and(|c| c == "wp-burn")),
        "{text}"
    );
    assert!(
        ours.iter().all(|p| pids(&text).contains(p)),
        "{ours:?}: {text}"
    );
    // The tree, by power: the shell's row holds its own figures and its
    // children's.
    s.keys(&["Escape", "/", "Escape", "W", "t"]);
    let shell = load.id();
    let text = s.wait_for("the shell over its burners", |t| {
        t.lines()
            .any(|l| l.trim_start().starts_with(&format!("{shell} ")))
    });
    let all = rows(&text);
    let at = all
        .iter()
        .position(|r| r[0] == shell.to_string())
        .expect("the shell's row");
    // Columns: PID USER CPU% CPU-W DRAM-W GPU-W SM% ENERGY POWER spark COMMAND.
    let cpu = |r: &Vec<String>| r[2].parse::<f64>().expect("CPU%");
    let children: Vec<&Vec<String>> = all[at + 1..]
        .iter()
        .take_while(|r| r.last().is_some_and(|c| c == "wp-burn"))
        .collect();
    assert_eq!(children.len(), 2, "{text}");
    let sum: f64 = children.iter().map(|r| cpu(r)).sum();
    // Each figure is cut to 0.1; the shell itself waits (0.0).
    assert!(
        (cpu(&all[at]) - sum).abs() <= 0.2,
        "shell {} against its children's {sum}:\n{text}",
        cpu(&all[at])
    );
    assert!(text.contains("└─ wp-burn"), "{text}");
}

#[test]
fn the_screen_s_figures_are_the_stream_s_for_the_same_interval() {
    require_ebpf!();
    let _load = Burners::start();
    let Some(s) = Screen::start(&[]) else {
        return;
    };
    s.wait_for("the burners", |t| t.matches("wp-burn").count() >= 2);
    s.keys(&["Z"]);
    let text = s.capture();
    assert!(text.contains("PAUSED"), "{text}");
    // The interval shown: the header's time since the start.
    let shown_s: f64 = text
        .lines()
        .next()
        .and_then(|l| l.split_whitespace().nth(2))
        .and_then(|t| t.parse().ok())
        .expect("the header's time");
    let record = s
        .stream()
        .into_iter()
        .filter(|r| r["type"] == "interval")
        .find(|r| (r["t_ns"].as_f64().unwrap_or(0.0) / 1e9 - shown_s).abs() < 0.05)
        .unwrap_or_else(|| panic!("no interval at {shown_s} s in the stream"));
    let dur_s = record["duration_ns"].as_f64().expect("duration") / 1e9;
    let stream_rows = record["processes"].as_array().expect("processes");
    let mut compared = 0;
    for row in rows(&text) {
        let pid: u64 = row[0].parse().expect("pid");
        let p = stream_rows
            .iter()
            .find(|p| p["pid"].as_u64() == Some(pid))
            .unwrap_or_else(|| panic!("pid {pid} on screen, not in the stream's interval"));
        let cpu_pct = 100.0 * p["on_cpu_ns"].as_f64().unwrap_or(0.0) / 1e9 / dur_s;
        let cpu_w = p["package_j"].as_f64().unwrap_or(0.0) / dur_s;
        assert_eq!(row[2], format!("{cpu_pct:.1}"), "CPU% of {pid}");
        assert_eq!(row[3], format!("{cpu_w:.2}"), "CPU W of {pid}");
        assert!(!row.last().expect("command").is_empty());
        compared += 1;
    }
    assert!(compared >= 2, "{text}");
}

#[test]
fn quitting_gives_the_terminal_back_and_prints_the_summary() {
    require_ebpf!();
    let Some(s) = Screen::start(&[]) else {
        return;
    };
    assert_eq!(
        s.pane("#{alternate_on}"),
        "1",
        "top draws on the alternate screen"
    );
    assert_eq!(s.pane("#{mouse_any_flag}"), "1", "and takes the mouse");
    s.keys(&["q"]);
    let text = s.wait_for("the exit", |t| t.contains("EXIT="));
    assert!(text.contains("EXIT=0"), "{text}");
    assert!(text.contains("busy CPU time"), "the summary: {text}");
    assert_eq!(s.pane("#{alternate_on}"), "0", "the normal screen is back");
    assert_eq!(s.pane("#{cursor_flag}"), "1", "the cursor is shown");
    assert_eq!(s.pane("#{mouse_any_flag}"), "0", "the mouse is let go");
    // The stream was completed, not cut.
    let stream = s.stream();
    assert!(stream.iter().any(|r| r["type"] == "interval"));
}

#[test]
fn sigterm_gives_the_terminal_back_too() {
    require_ebpf!();
    let Some(s) = Screen::start(&[]) else {
        return;
    };
    let pid = s.pane("#{pane_pid}");
    // The pane runs the shell; wattprof is its child.
    let out = Command::new("pgrep")
        .args(["-P", &pid, "-f", "wattprof"])
        .output()
        .expect("pgrep");
    let wattprof = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(!wattprof.is_empty(), "wattprof under the pane's shell");
    assert!(
        Command::new("kill")
            .args(["-TERM", &wattprof])
            .status()
            .is_ok()
    );
    let text = s.wait_for("the exit", |t| t.contains("EXIT="));
    assert!(text.contains("EXIT=0"), "{text}");
    assert_eq!(s.pane("#{alternate_on}"), "0");
    assert_eq!(s.pane("#{cursor_flag}"), "1");
}

#[test]
fn without_a_terminal_top_says_so_in_one_line() {
    let out = Command::new(wattprof_bin())
        .arg("top")
        .stdin(Stdio::null())
        .output()
        .expect("wattprof top");
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(
        err.contains("needs a terminal") && err.contains("monitor --jsonl"),
        "{err}"
    );
}

#[test]
fn grouping_by_container_shows_a_real_docker_container_by_name() {
    require_ebpf!();
    let image = match docker_image() {
        Ok(i) => i,
        Err(why) => {
            wattprof_tests::say_skip(&why);
            return;
        }
    };
    let name = format!("wattprof-top-{}", std::process::id());
    let _ = Command::new("docker").args(["rm", "-f", &name]).output();
    /// Removes the container, a failed test's too.
    struct Removed<'a>(&'a str);
    impl Drop for Removed<'_> {
        fn drop(&mut self) {
            let _ = Command::new("docker").args(["rm", "-f", self.0]).output();
        }
    }
    let _removed = Removed(&name);
    let started = Command::new("docker")
        .args(["run", "-d", "--name", &name, &image])
        .args(["sh", "-c", "while true; do :; done"])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(started, "docker run -d {name}");
    let Some(s) = Screen::start(&[]) else {
        return;
    };
    s.keys(&["g"]);
    // CPU% POWER ENERGY NAME: the container burns a CPU (its power is
    // known from the second interval the groups are on screen).
    let cpu_of = |t: &str| -> f64 {
        t.lines()
            .find(|l| l.contains(&name))
            .and_then(|l| l.split_whitespace().next()?.parse().ok())
            .unwrap_or(0.0)
    };
    let text = s.wait_for("the container's busy row", |t| cpu_of(t) > 20.0);
    assert!(text.contains("CONTAINER / UNIT"), "{text}");
    assert!(text.contains(&format!("docker {name} (")), "named: {text}");
}

#[test]
fn without_root_top_says_so_and_gives_the_terminal_back() {
    // Root only to become nobody; no eBPF is loaded.
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 || !Path::new("/usr/bin/tmux").exists() {
        wattprof_tests::say_skip("needs root (to run as nobody) and tmux");
        return;
    }
    let bin = wattprof_tests::executable_by_others(&wattprof_bin());
    let name = format!("wattprof-top-nobody-{}", std::process::id());
    let cmd = format!(
        "setpriv --reuid=65534 --regid=65534 --clear-groups {} top; echo EXIT=$?; sleep 600",
        bin.path.display()
    );
    assert!(tmux(&[
        "new-session",
        "-d",
        "-s",
        &name,
        "-x",
        "200",
        "-y",
        "20",
        &cmd
    ]));
    let capture = || {
        let out = Command::new("tmux")
            // -J: a wrapped line is one line.
            .args(["capture-pane", "-p", "-J", "-t", &name])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let t0 = Instant::now();
    let mut text = capture();
    while !text.contains("EXIT=") && t0.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(200));
        text = capture();
    }
    let alternate = Command::new("tmux")
        .args(["display-message", "-p", "-t", &name, "#{alternate_on}"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    let _ = tmux(&["kill-session", "-t", &name]);
    assert!(text.contains("EXIT=125"), "{text}");
    let said: Vec<&str> = text
        .lines()
        .take_while(|l| !l.starts_with("EXIT="))
        .filter(|l| !l.trim().is_empty())
        .collect();
    assert_eq!(said.len(), 1, "one line: {text}");
    assert!(
        said[0].contains("missing CAP_BPF and CAP_PERFMON") && said[0].contains("root"),
        "{text}"
    );
    assert_eq!(
        alternate.ok().as_deref(),
        Some("0"),
        "the normal screen: {text}"
    );
}
