//! Helpers for wattprof's root integration tests: finding the binaries,
//! running `wattprof run`, and skipping (loudly) where eBPF cannot run.

pub mod containers;
pub mod schema;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use serde_json::Value;

/// Why these tests cannot run here, if they cannot.
pub fn skip_reason() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("needs root to load eBPF (run: sudo -E cargo xtask test)".into());
    }
    if !std::path::Path::new("/proc/sys/kernel/unprivileged_bpf_disabled").exists() {
        return Some("this kernel has no bpf() syscall (CONFIG_BPF_SYSCALL)".into());
    }
    None
}

/// Says that the running test is skipped, and why: one line,
/// `skipping: <test>: <reason>` (libtest names each test's thread after
/// the test). `cargo xtask test` counts each test named so once, as
/// skipped rather than passed, and lists them with their reasons.
pub fn say_skip(reason: &str) {
    eprintln!(
        "skipping: {}: {reason}",
        std::thread::current().name().unwrap_or("unnamed test")
    );
}

/// Returns early from a test, saying why, when eBPF tests cannot run.
#[macro_export]
macro_rules! require_ebpf {
    () => {
        if let Some(reason) = $crate::skip_reason() {
            $crate::say_skip(&reason);
            return;
        }
    };
}

/// The directory cargo put the binaries in (target/<profile>): integration
/// test executables live in its `deps/`.
fn target_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let deps = exe.parent().expect("deps dir");
    deps.parent().unwrap_or(deps).to_path_buf()
}

/// The `wattprof` binary, built by `cargo build -p profiler` (xtask does).
pub fn wattprof_bin() -> PathBuf {
    let bin = std::env::var_os("WATTPROF_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| target_dir().join("wattprof"));
    assert!(
        bin.exists(),
        "{} is missing: build it first with `cargo build -p profiler` (cargo xtask test does)",
        bin.display()
    );
    bin
}

/// The workload helper (a bin of this package, built with its tests).
pub fn testload_bin() -> PathBuf {
    target_dir().join("wattprof-testload")
}

/// A binary another user (`nobody`) can execute: the original when every
/// directory above it lets others through, else a copy in a fresh
/// directory of mode 755 (removed when this is dropped). A root user's
/// clone under `/root`, or in `mktemp -d`, is mode 700, and `nobody`
/// cannot run a binary inside it.
pub struct PublicBin {
    /// The path to run.
    pub path: PathBuf,
    dir: Option<PathBuf>,
}

impl Drop for PublicBin {
    fn drop(&mut self) {
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `bin` where `nobody` can execute it (see [`PublicBin`]).
pub fn executable_by_others(bin: &Path) -> PublicBin {
    use std::io::Write;
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    use std::sync::atomic::{AtomicU32, Ordering};
    let passable =
        |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
    if bin.ancestors().all(passable) {
        return PublicBin {
            path: bin.to_path_buf(),
            dir: None,
        };
    }
    // A fresh directory (create_dir fails on one that exists, so nothing
    // planted there is followed), under a temporary directory others can
    // pass through (TMPDIR may be private, as with pam_tmpdir).
    let base = [std::env::temp_dir(), PathBuf::from("/tmp")]
        .into_iter()
        .find(|d| d.ancestors().all(passable))
        .expect("a temporary directory others can pass through");
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = base.join(format!(
        "wattprof-test-bin-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir(&dir).expect("a fresh directory for the binary");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let path = dir.join(bin.file_name().expect("a binary's name"));
    let bytes = std::fs::read(bin).expect("read the binary");
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o755)
        .open(&path)
        .expect("create the copy");
    f.write_all(&bytes).expect("write the copy");
    // Closed before anyone executes it (ETXTBSY otherwise).
    drop(f);
    PublicBin {
        path,
        dir: Some(dir),
    }
}

/// A finished `wattprof run`: its output and JSON report.
pub struct Run {
    /// Exit status, stdout (the command's) and stderr (wattprof's table).
    pub output: Output,
    /// The `--output` document, if it was written.
    pub report: Option<Value>,
}

impl Run {
    /// The report, which the test expects to exist.
    pub fn report(&self) -> &Value {
        self.report.as_ref().unwrap_or_else(|| {
            panic!(
                "no report; stderr:\n{}",
                String::from_utf8_lossy(&self.output.stderr)
            )
        })
    }

    /// The command's stdout lines parsed as JSON.
    pub fn stdout_json(&self) -> Vec<Value> {
        String::from_utf8_lossy(&self.output.stdout)
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect()
    }

    /// wattprof's stderr.
    pub fn stderr(&self) -> String {
        String::from_utf8_lossy(&self.output.stderr).into_owned()
    }
}

/// Runs `wattprof run [extra] --output <tmp> -- cmd...`.
pub fn wattprof_run(extra: &[&str], cmd: &[&str]) -> Run {
    let dir = tempfile_dir();
    let out = dir.join("run.json");
    let output = Command::new(wattprof_bin())
        .arg("run")
        .args(extra)
        .arg("--output")
        .arg(&out)
        .arg("--")
        .args(cmd)
        .output()
        .expect("start wattprof");
    let report = std::fs::read(&out)
        .ok()
        .map(|b| serde_json::from_slice(&b).expect("report is JSON"));
    let _ = std::fs::remove_dir_all(&dir);
    Run { output, report }
}

/// The JSON document at `path` (a recording), which the test expects.
pub fn read_json(path: &Path) -> Value {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_slice(&bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// A fresh private directory under the system temp dir.
pub fn tempfile_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "wattprof-test-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// A fresh directory in memory (`/dev/shm`), or in the temporary directory
/// where `/dev/shm` cannot be written.
pub fn memory_dir() -> PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let shm = std::path::Path::new("/dev/shm");
    let dir = shm.join(format!(
        "wattprof-shm-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    if std::fs::create_dir_all(&dir).is_ok() {
        dir
    } else {
        tempfile_dir()
    }
}

/// `u64` at a JSON pointer, failing the test with the pointer if absent.
pub fn u(v: &Value, ptr: &str) -> u64 {
    v.pointer(ptr)
        .and_then(Value::as_u64)
        .unwrap_or_else(|| panic!("no integer at {ptr}"))
}

/// Sum of `on_cpu_ns` over the process `pid` and all its descendants in a
/// report's `processes` (lineage from `ppid`).
pub fn subtree_ns(report: &Value, pid: u64) -> u64 {
    let procs = report["processes"].as_array().expect("processes");
    let mut total = 0;
    let mut stack = vec![pid];
    let mut visited = std::collections::HashSet::new();
    while let Some(p) = stack.pop() {
        if !visited.insert(p) {
            continue;
        }
        for q in procs {
            let qpid = q["pid"].as_u64().unwrap_or(0);
            if qpid == p {
                total += q["on_cpu_ns"].as_u64().unwrap_or(0);
            }
            if q["ppid"].as_u64() == Some(p) {
                stack.push(qpid);
            }
        }
    }
    total
}

/// Relative difference |a-b|/b.
pub fn rel_err(a: u64, b: u64) -> f64 {
    (a as f64 - b as f64).abs() / (b as f64).max(1.0)
}

/// `wattprof run` on the NVML stub (`lib_arg`) of a shell whose two
/// children burn `seconds` at `duty` (the stub's `child/1` and `child/2`),
/// with the host model left out (`--host-model=none`: no static power
/// learned elsewhere): the recording, schema-checked, and the two pids in
/// order.
pub fn two_burners_on_the_stub(
    lib_arg: &str,
    interval: &str,
    seconds: &str,
    duty: &str,
) -> (Value, Vec<u64>) {
    let t = testload_bin().to_string_lossy().into_owned();
    let script = format!("{t} burn {seconds} {duty} & {t} burn {seconds} {duty} & wait");
    let run = wattprof_run(
        &[
            lib_arg,
            "--energy-sysfs=/nonexistent",
            "--host-model=none",
            "--interval",
            interval,
        ],
        &["sh", "-c", &script],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report().clone();
    schema::assert_valid("recording", &report);
    let mut pids: Vec<u64> = run.stdout_json().iter().map(|v| u(v, "/pid")).collect();
    pids.sort_unstable();
    assert_eq!(
        pids.len(),
        2,
        "{}",
        String::from_utf8_lossy(&run.output.stdout)
    );
    (report, pids)
}

/// The recording's row of process `pid` (the test expects it there).
pub fn process(report: &Value, pid: u64) -> &Value {
    report["processes"]
        .as_array()
        .expect("processes")
        .iter()
        .find(|p| p["pid"].as_u64() == Some(pid))
        .unwrap_or_else(|| panic!("pid {pid} not in the report"))
}

/// A private copy of the NVML stub library (`cargo build -p nvml-stub`)
/// named like the real one, with `scenario` beside it: each caller gets its
/// own library instance and state.
pub fn nvml_stub(scenario: &str) -> PathBuf {
    let built = target_dir().join("libnvml_stub.so");
    assert!(
        built.exists(),
        "{} is missing: build it with `cargo build -p nvml-stub` (cargo xtask test does)",
        built.display()
    );
    let dir = tempfile_dir();
    let lib = dir.join("libnvidia-ml.so.1");
    std::fs::copy(&built, &lib).expect("copy the NVML stub");
    std::fs::write(dir.join("scenario.txt"), scenario).expect("write the scenario");
    lib
}

/// A powercap tree (package 0 with a DRAM subzone) in a temp directory
/// whose counters a thread advances at known power, every millisecond,
/// each write atomic (a rename), as the kernel's counters are.
pub struct FakeRapl {
    /// The sysfs root to give `--energy-sysfs`.
    pub sys: PathBuf,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

/// Busy and total jiffies of all CPUs (`/proc/stat`'s first line).
pub fn busy_jiffies() -> (u64, u64) {
    let text = std::fs::read_to_string("/proc/stat").expect("/proc/stat");
    let v: Vec<u64> = text
        .lines()
        .next()
        .expect("cpu line")
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    let total: u64 = v.iter().take(8).sum();
    (total - v[3] - v[4], total)
}

/// CPUs left idle by what else runs (measured over half a second).
pub fn free_cpus() -> f64 {
    let idle = || {
        let (busy, total) = busy_jiffies();
        (total - busy) as f64 / 100.0
    };
    let (i0, t0) = (idle(), std::time::Instant::now());
    std::thread::sleep(std::time::Duration::from_millis(500));
    (idle() - i0) / t0.elapsed().as_secs_f64()
}

/// Whether the machine is too busy for a load staircase or a varying load
/// to vary its busy CPUs (then said as the running test's skip): power
/// that follows the load cannot be fitted when the load cannot change.
pub fn saturated() -> bool {
    let free = free_cpus();
    if free < 0.7 {
        say_skip(&format!(
            "the machine is saturated ({free:.2} CPUs idle): no load can vary its busy CPUs, \
             so nothing can be fitted"
        ));
        return true;
    }
    false
}

/// A domain's power law: `static_w` + `per_cpu_w` × busy CPUs.
#[derive(Clone, Copy, Debug)]
pub struct PowerLaw {
    /// Watts with no CPU busy.
    pub static_w: f64,
    /// Watts per busy CPU.
    pub per_cpu_w: f64,
}

/// Joules by which a following fixture's energy may move `pid`'s share
/// of `domain` in `report`, over all intervals.
///
/// The fixture's power follows /proc/stat's busy time (irq, softirq and
/// steal included, in 10 ms ticks); wattprof divides each interval's
/// energy by task time. In an interval where the two differ, a
/// task-second carries more or less energy, and a process's energy moves
/// by up to that difference's energy × its share of the interval's task
/// time. A test's bound adds this to what wattprof itself may be off by.
pub fn fixture_shift_j(report: &Value, pid: u64, domain: &str, law: PowerLaw) -> f64 {
    let mut shift = 0.0;
    for iv in report["intervals"].as_array().into_iter().flatten() {
        let secs = iv["duration_ns"].as_f64().unwrap_or(0.0) / 1e9;
        let busy_s = iv["busy_ns"].as_f64().unwrap_or(0.0) / 1e9;
        let Some(w) = iv["domains"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|d| d["domain"] == domain)
            .and_then(|d| d["power_w"].as_f64())
        else {
            continue;
        };
        let fixture_busy_s = ((w - law.static_w) / law.per_cpu_w * secs).max(0.0);
        let off_j = (fixture_busy_s - busy_s).abs() * law.per_cpu_w;
        let t = iv["processes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|q| q["pid"] == pid)
            .and_then(|q| q["on_cpu_ns"].as_f64())
            .unwrap_or(0.0)
            / 1e9;
        if busy_s > 0.0 {
            shift += off_j * (t / busy_s).min(1.0);
        }
    }
    shift
}

/// A host power model for this machine with these package-0 and DRAM
/// laws for the powercap reader, as `wattprof calibrate` writes it (the
/// machine identity as wattprof reads it), in `dir`.
pub fn host_model_file(dir: &Path, package: PowerLaw, dram: PowerLaw) -> PathBuf {
    // The machine as wattprof identifies it (the library's own reading).
    let packages = wattprof::topology::Topology::read(&wattprof::topology::SysRoot::real())
        .map_or(1, |t| t.packages());
    let machine = wattprof::sources::static_power::Machine::this(packages);
    let fit = |domain: &str, law: PowerLaw| {
        serde_json::json!({
            "domain": domain, "package": 0, "reader": "powercap",
            "static_w": law.static_w, "per_cpu_w": law.per_cpu_w, "r_squared": 1.0,
            "rms_residual_w": 0.0, "points": []
        })
    };
    let model = serde_json::json!({
        "type": "wattprof_power_model",
        "version": 1,
        "host": "test",
        "machine": machine,
        "created_unix_ns": 0,
        "fits": [fit("package", package), fit("dram", dram)]
    });
    let path = dir.join("power-model.json");
    std::fs::write(&path, model.to_string()).expect("model");
    path
}

impl FakeRapl {
    /// Starts counting `package_w` and `dram_w` watts, whatever the load:
    /// for the tests that need exactly that (a constant makes every split
    /// rule give the same ratios, so energy tests use
    /// [`FakeRapl::following`]).
    pub fn start(package_w: f64, dram_w: f64) -> Self {
        Self::with_laws(
            PowerLaw {
                static_w: package_w,
                per_cpu_w: 0.0,
            },
            PowerLaw {
                static_w: dram_w,
                per_cpu_w: 0.0,
            },
        )
    }

    /// Starts counting power that follows the machine's load, as real
    /// RAPL's does: each domain's static watts over time plus its watts
    /// per busy CPU over the busy CPU time, which is the CPUs' time less
    /// the idle time `/proc/stat` counts (the kernel's exact no-tick idle
    /// time, in 10 ms units), sampled every 10 ms. The dynamic energy
    /// shown never goes back (the counter is monotonic, as RAPL's is): it
    /// trails the truth by at most 10 ms per CPU, and is exact over a
    /// test's seconds but for that. The counters advance every
    /// millisecond.
    pub fn following(package: PowerLaw, dram: PowerLaw) -> Self {
        Self::with_laws(package, dram)
    }

    fn with_laws(package: PowerLaw, dram: PowerLaw) -> Self {
        // In memory, as the real sysfs is: on the disk (ext4 here), each
        // rename over a counter file starts writeback of the new one, and at
        // 2,000 renames a second an `open` of a counter now and then waited
        // seconds, long enough to skew an interval's energy.
        let sys = memory_dir().join("sys");
        let zones = [
            ("intel-rapl:0", "package-0", package),
            ("intel-rapl:0:0", "dram", dram),
        ];
        for (dir, name, _) in zones {
            let d = sys.join("class/powercap").join(dir);
            std::fs::create_dir_all(&d).expect("fixture dir");
            std::fs::write(d.join("name"), format!("{name}\n")).expect("name");
            std::fs::write(d.join("enabled"), "1\n").expect("enabled");
            // A range far beyond the test: no wrap to reason about here
            // (wraps are unit-tested in the reader).
            std::fs::write(d.join("max_energy_range_uj"), "262143328850\n").expect("range");
            std::fs::write(d.join("energy_uj"), "0\n").expect("energy");
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = stop.clone();
        let root = sys.clone();
        let follows = package.per_cpu_w != 0.0 || dram.per_cpu_w != 0.0;
        // /proc/stat's idle time is summed over every online CPU.
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as f64;
        let thread = std::thread::spawn(move || {
            // Real-time priority, so the counter stays current while the
            // workloads keep every CPU busy (the kernel's counters always
            // are); a starved writer would make an interval's energy depend
            // on when it last ran. Root only, like these tests.
            let param = libc::sched_param { sched_priority: 10 };
            // SAFETY: this thread (0), a valid sched_param.
            unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) };
            let idle_s = || -> f64 {
                let (busy, total) = busy_jiffies();
                (total - busy) as f64 / 100.0
            };
            let t0 = std::time::Instant::now();
            let idle0 = idle_s();
            // The most busy CPU-seconds seen so far.
            let mut shown_busy_s = 0.0f64;
            let mut tick = 0u64;
            while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                std::thread::sleep(std::time::Duration::from_millis(1));
                tick += 1;
                let s = t0.elapsed().as_secs_f64();
                if follows && tick.is_multiple_of(10) {
                    shown_busy_s = shown_busy_s.max(cpus * s - (idle_s() - idle0));
                }
                for (dir, _, law) in &zones {
                    let uj = (law.static_w * s + law.per_cpu_w * shown_busy_s) * 1e6;
                    let d = root.join("class/powercap").join(dir);
                    let tmp = d.join(".energy_uj.tmp");
                    if std::fs::write(&tmp, format!("{}\n", uj as u64)).is_ok() {
                        let _ = std::fs::rename(&tmp, d.join("energy_uj"));
                    }
                }
            }
        });
        Self {
            sys,
            stop,
            thread: Some(thread),
        }
    }

    /// The `--energy-sysfs` argument.
    pub fn arg(&self) -> String {
        format!("--energy-sysfs={}", self.sys.display())
    }
}

impl Drop for FakeRapl {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Some(dir) = self.sys.parent() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// `f64` at a JSON pointer, failing the test with the pointer if absent.
pub fn f(v: &Value, ptr: &str) -> f64 {
    v.pointer(ptr)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("no number at {ptr} in {v}"))
}

/// The domain entry of a report's `energy.domains`.
pub fn domain<'a>(report: &'a Value, name: &str, package: Option<u64>) -> &'a Value {
    report["energy"]["domains"]
        .as_array()
        .expect("energy.domains")
        .iter()
        .find(|d| d["domain"] == name && d["package"].as_u64() == package)
        .unwrap_or_else(|| panic!("no domain {name} {package:?} in {}", report["energy"]))
}

/// `GET path` over HTTP/1.0 to `addr`: (status, body). Loopback only.
pub fn http_get(addr: &str, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(10)))
        .ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    let status = head.split_whitespace().nth(1)?.parse().ok()?;
    Some((status, body.to_string()))
}

/// A free TCP port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// The cgroup2 mount point, if any.
pub fn cgroup2_root() -> Option<PathBuf> {
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").ok()?;
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        (right.split_whitespace().next()? == "cgroup2")
            .then(|| PathBuf::from(left.split_whitespace().nth(4).unwrap_or("")))
    })
}

/// A test's cgroups, removed (deepest first) when dropped.
#[derive(Default)]
pub struct Cgroups {
    made: Vec<PathBuf>,
}

impl Cgroups {
    /// Creates `rel` (and its parents) under `root`.
    pub fn make(&mut self, root: &Path, rel: &str) -> PathBuf {
        let mut p = root.to_path_buf();
        for part in rel.split('/').filter(|p| !p.is_empty()) {
            p.push(part);
            if !p.exists() {
                std::fs::create_dir(&p).unwrap_or_else(|e| panic!("mkdir {}: {e}", p.display()));
                self.made.push(p.clone());
            }
        }
        p
    }
}

impl Drop for Cgroups {
    fn drop(&mut self) {
        for p in self.made.iter().rev() {
            let _ = std::fs::remove_dir(p);
        }
    }
}

/// Starts `wattprof-testload ARGS` (e.g. `cpu 0.2`) inside the cgroup `dir`.
pub fn burn_in(dir: &Path, seconds: &str) -> std::process::Child {
    let script = format!(
        "echo $$ > '{}/cgroup.procs' && exec {} {seconds}",
        dir.display(),
        testload_bin().display()
    );
    std::process::Command::new("sh")
        .args(["-c", &script])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("start a burner")
}

/// Waits (up to 20 s) until the `--jsonl` stream at `path` has its first
/// line: the header, written once the tracker counts. Starting a workload
/// before then would leave part of it uncounted.
pub fn wait_for_stream_header(path: &Path) {
    wait_for_stream_lines(path, "header", 1);
}

/// Waits (up to 20 s) until the JSONL stream at `path` holds `count`
/// complete records of `kind` (`"header"`, `"interval"`).
pub fn wait_for_stream_lines(path: &Path, kind: &str, count: usize) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let needle = format!("\"type\":\"{kind}\"");
    let complete = |t: &str| {
        let done = t.rfind('\n').map_or("", |i| &t[..i]);
        done.lines().filter(|l| l.contains(&needle)).count()
    };
    while !std::fs::read_to_string(path).is_ok_and(|t| complete(&t) >= count) {
        assert!(
            std::time::Instant::now() < deadline,
            "fewer than {count} {kind} records in {} after 20 s",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A local busybox image for container tests, or why there is none
/// (`scripts/busybox-image.sh`: the Docker daemon must answer, and
/// Debian's busybox-static gives the image).
pub fn docker_image() -> Result<String, String> {
    const IMAGE: &str = "wattprof-test-busybox:latest";
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/busybox-image.sh");
    let out = Command::new("sh")
        .arg(&script)
        .arg(IMAGE)
        .output()
        .map_err(|e| format!("running {}: {e}", script.display()))?;
    if out.status.success() {
        Ok(IMAGE.into())
    } else {
        Err(String::from_utf8_lossy(&out.stdout).trim().to_string())
    }
}

/// The lowest and highest of the figures `wattprof calibrate` printed on
/// its steps' lines, each between `after` and `before` (busy CPUs:
/// `"windows: "` and `" busy CPUs"`; counter watts: `"windows: x "` and
/// `","`). Panics with the text when fewer than two differ.
pub fn staircase_span(said: &str, after: &str, before: &str) -> (f64, f64) {
    let xs: Vec<f64> = said
        .lines()
        .filter_map(|l| l.split(after).nth(1))
        .filter_map(|l| l.split(before).next()?.trim().parse().ok())
        .collect();
    let (lo, hi) = xs
        .iter()
        .fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(*x), b.max(*x)));
    assert!(xs.len() >= 2 && hi > lo, "the staircase's steps: {said}");
    (lo, hi)
}

/// One `/proc/stat` tick (`USER_HZ`), ns.
pub fn tick_ns() -> u64 {
    // SAFETY: sysconf has no preconditions.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    1_000_000_000 / hz
}

/// Per CPU: interrupt, softirq and steal time so far (`/proc/stat`), ns.
pub fn not_task_ns() -> Vec<u64> {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let mut out = Vec::new();
    for line in text.lines() {
        let mut w = line.split_whitespace();
        let Some(cpu) = w
            .next()
            .and_then(|n| n.strip_prefix("cpu"))
            .and_then(|n| n.parse::<usize>().ok())
        else {
            continue;
        };
        // user nice system idle iowait irq softirq steal
        let f: Vec<u64> = w.filter_map(|x| x.parse().ok()).collect();
        let ticks = f.get(5).copied().unwrap_or(0)
            + f.get(6).copied().unwrap_or(0)
            + f.get(7).copied().unwrap_or(0);
        out.resize(out.len().max(cpu + 1), 0);
        out[cpu] = ticks * tick_ns();
    }
    out
}

/// All CPUs' interrupt, softirq and steal time so far (`/proc/stat`'s
/// `cpu` line, summed in ns before it is cut to ticks: less than a tick
/// short per field in all, however many CPUs), ns.
pub fn not_task_total_ns() -> u64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(line) = text.lines().find(|l| l.starts_with("cpu ")) else {
        return 0;
    };
    let f: Vec<u64> = line
        .split_whitespace()
        .skip(1)
        .filter_map(|x| x.parse().ok())
        .collect();
    (f.get(5).copied().unwrap_or(0)
        + f.get(6).copied().unwrap_or(0)
        + f.get(7).copied().unwrap_or(0))
        * tick_ns()
}

/// All CPUs' steal time so far (`/proc/stat`'s `cpu` line, summed in ns
/// before it is cut to ticks: less than a tick short), ns.
pub fn steal_total_ns() -> u64 {
    let text = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with("cpu "))
        .and_then(|l| l.split_whitespace().nth(8))
        .and_then(|x| x.parse::<u64>().ok())
        .unwrap_or(0)
        * tick_ns()
}

/// `wattprof run`, and each CPU's interrupt, softirq and steal time over it.
pub fn run_measuring_not_task(extra: &[&str], cmd: &[&str]) -> (Run, Vec<u64>) {
    let before = not_task_ns();
    let run = wattprof_run(extra, cmd);
    let after = not_task_ns();
    let delta = after
        .iter()
        .enumerate()
        .map(|(i, a)| a.saturating_sub(before.get(i).copied().unwrap_or(0)))
        .collect();
    (run, delta)
}
