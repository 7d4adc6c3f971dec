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
    /// `stream.jsonl` in its directory, in a 140x40 terminal, once its
    /// first rows are drawn.
    fn start(extra: &[&str]) -> Option<Self> {
        let s = Self::start_sized(&[], extra, 140, 40)?;
        s.wait_for("the first rows", |t| {
            t.contains("COMMAND") && t.contains("package 0")
        });
        Some(s)
    }

    /// `wattprof top` in a `w` x `h` terminal, with `env` (`NAME=value`)
    /// in its environment. When it ends, the pane shows `EXIT=` its
    /// status, then `STTY:` the terminal's line discipline as `stty -a`
    /// has it.
    fn start_sized(env: &[&str], extra: &[&str], w: u16, h: u16) -> Option<Self> {
        if !Path::new("/usr/bin/tmux").exists() {
            wattprof_tests::say_skip("tmux is not installed (apt-get install tmux)");
            return None;
        }
        let rapl = FakeRapl::start(30.0, 3.0);
        let dir = tempfile_dir();
        let name = format!("wattprof-top-{}", std::process::id());
        let stream = dir.join("stream.jsonl");
        let mut cmd = format!(
            "env WATTPROF_HOST_MODEL=none {} {} top {} --no-gpu --interval 500ms --jsonl {}",
            env.join(" "),
            wattprof_bin().display(),
            rapl.arg(),
            stream.display()
        );
        for a in extra {
            cmd.push(' ');
            cmd.push_str(a);
        }
        // The exit status, what was printed after and the terminal's
        // modes are kept on screen.
        let cmd = format!(
            "{cmd}; echo EXIT=$?; echo STTY: $(stty -a | tr ' ;' '\\n\\n' | \
             grep -xE -- '-?(icanon|echo|isig|icrnl|opost)'); sleep 600"
        );
        let _ = tmux(&["kill-session", "-t", &name]);
        let ok = tmux(&[
            "new-session",
            "-d",
            "-s",
            &name,
            "-x",
            &w.to_string(),
            "-y",
            &h.to_string(),
            &cmd,
        ]);
        assert!(ok, "tmux new-session");
        Some(Self {
            name,
            dir,
            _rapl: rapl,
        })
    }

    fn capture(&self) -> String {
        let out = Command::new("tmux")
            .args(["capture-pane", "-p", "-t", &self.name])
            .output()
            .expect("tmux capture-pane");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }

    /// Types `keys` (what they do is waited for with [`Screen::wait_for`]).
    fn keys(&self, keys: &[&str]) {
        for k in keys {
            assert!(tmux(&["send-keys", "-t", &self.name, k]), "send-keys {k}");
        }
    }

    /// Waits for `top` to end, and checks the terminal is as it was: the
    /// normal screen, the cursor shown, the mouse let go, and `stty`'s
    /// canonical mode, echo and signals on. Returns the screen.
    fn ended_and_restored(&self, status: &str) -> String {
        let text = self.wait_for("the exit and stty", |t| t.contains("STTY:"));
        assert!(text.contains(&format!("EXIT={status}")), "{text}");
        assert_eq!(
            self.pane("#{alternate_on}"),
            "0",
            "the normal screen: {text}"
        );
        assert_eq!(self.pane("#{cursor_flag}"), "1", "the cursor: {text}");
        assert_eq!(self.pane("#{mouse_any_flag}"), "0", "the mouse: {text}");
        let stty: Vec<&str> = text
            .lines()
            .find_map(|l| l.strip_prefix("STTY:"))
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        for mode in ["icanon", "echo", "isig", "icrnl", "opost"] {
            assert!(stty.contains(&mode), "{mode} is on again: {stty:?}");
        }
        text
    }

    /// The pid of `wattprof` under the pane's shell.
    fn wattprof_pid(&self) -> String {
        let pane = self.pane("#{pane_pid}");
        let out = Command::new("pgrep")
            .args(["-P", &pane, "-f", "wattprof"])
            .output()
            .expect("pgrep");
        let pid = String::from_utf8_lossy(&out.stdout).trim().to_string();
        assert!(!pid.is_empty(), "wattprof under the pane's shell");
        pid
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

/// Whether the wattprof tested is this build's debug binary (the fault
/// hooks are in debug builds only); says why it skips when not.
fn debug_build() -> bool {
    if std::env::var_os("WATTPROF_BIN").is_some() {
        wattprof_tests::say_skip(
            "WATTPROF_BIN may be a release build, which has no fault hooks (WATTPROF_TEST_*)",
        );
        return false;
    }
    true
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
    s.wait_for("rows by PID, ascending", |t| {
        let up = pids(t);
        t.contains("sort PID ↑") && up.len() > 3 && up.windows(2).all(|w| w[0] < w[1])
    });
    s.keys(&["I"]);
    s.wait_for("the order turned", |t| {
        let down = pids(t);
        t.contains("sort PID ↓") && down.len() > 3 && down.windows(2).all(|w| w[0] > w[1])
    });
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
    let text = s.wait_for("the filter kept", |t| {
        t.contains("filter \"wp-burn\"") && t.contains("F10Quit")
    });
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
        t.contains("  tree")
            && !t.contains("filter \"")
            && t.lines()
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
    let text = s.wait_for("the pause", |t| t.contains("PAUSED"));
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
    let text = s.ended_and_restored("0");
    assert!(text.contains("busy CPU time"), "the summary: {text}");
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
    let wattprof = s.wattprof_pid();
    assert!(
        Command::new("kill")
            .args(["-TERM", &wattprof])
            .status()
            .is_ok()
    );
    s.ended_and_restored("0");
}

#[test]
fn a_panic_gives_the_terminal_back_and_its_message_is_seen() {
    require_ebpf!();
    if !debug_build() {
        return;
    }
    // A debug build panics once top has drawn for a second, when told to.
    let Some(s) = Screen::start_sized(&["WATTPROF_TEST_PANIC=top"], &[], 140, 40) else {
        return;
    };
    let text = s.ended_and_restored("101");
    assert!(
        text.contains("WATTPROF_TEST_PANIC=top"),
        "the panic's message, on the normal screen: {text}"
    );
}

#[test]
fn a_second_sigterm_while_the_summary_is_written_still_gives_the_terminal_back() {
    require_ebpf!();
    if !debug_build() {
        return;
    }
    // A debug build told so holds an interval for 10 s (a hung GPU read)
    // once it has drawn for a second, and says when it begins.
    let hung = tempfile_dir().join("hung");
    let env = format!("WATTPROF_TEST_HANG={}", hung.display());
    let Some(s) = Screen::start_sized(&[&env], &[], 140, 40) else {
        return;
    };
    let t0 = Instant::now();
    while !hung.exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "the interval never hung"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let wattprof = s.wattprof_pid();
    // The first asks the loop to end (it cannot: the interval hangs); the
    // second ends wattprof at once.
    for _ in 0..2 {
        assert!(
            Command::new("kill")
                .args(["-TERM", &wattprof])
                .status()
                .is_ok()
        );
        std::thread::sleep(Duration::from_millis(300));
    }
    s.ended_and_restored("130");
    let _ = std::fs::remove_dir_all(hung.parent().expect("its directory"));
}

#[test]
fn a_resize_redraws_to_the_new_size_down_to_a_few_cells() {
    require_ebpf!();
    let Some(s) = Screen::start(&[]) else {
        return;
    };
    let resize = |w: u16, h: u16| {
        assert!(tmux(&[
            "resize-window",
            "-t",
            &s.name,
            "-x",
            &w.to_string(),
            "-y",
            &h.to_string()
        ]));
    };
    resize(80, 24);
    let text = s.wait_for("80x24", |t| {
        t.lines().count() <= 24 && t.contains("F10Quit") && t.contains("COMMAND")
    });
    assert!(text.lines().all(|l| l.chars().count() <= 80), "{text}");
    resize(24, 3);
    s.wait_for("a note that it is too small", |t| t.contains("too small"));
    resize(140, 40);
    s.wait_for("the table again", |t| {
        t.contains("COMMAND") && t.contains("package 0")
    });
    s.keys(&["q"]);
    s.ended_and_restored("0");
}

#[test]
fn a_terminal_that_hangs_up_ends_top_with_its_stream_whole() {
    require_ebpf!();
    let Some(s) = Screen::start(&[]) else {
        return;
    };
    let wattprof = s.wattprof_pid();
    // The window closes: the pty hangs up under wattprof.
    assert!(tmux(&["kill-session", "-t", &s.name]));
    let t0 = Instant::now();
    while Path::new(&format!("/proc/{wattprof}")).exists() {
        assert!(
            t0.elapsed() < Duration::from_secs(15),
            "wattprof {wattprof} still runs after its terminal hung up"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let text = std::fs::read_to_string(s.dir.join("stream.jsonl")).expect("the stream");
    assert!(text.ends_with('\n'), "the last line is whole");
    assert!(
        text.lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok()),
        "every line is a record"
    );
    assert!(s.stream().iter().any(|r| r["type"] == "interval"));
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
