//! Podman and containerd, as the Docker tests do Docker: two containers
//! burning at one and two loops, one started before wattprof and one
//! after, checked in the recording (ids, names, runtime) against the
//! kernel's cgroup CPU accounting, and their energy against their CPU
//! time. Skips, saying why, only where the runtime is not installed or
//! does not answer (`cargo xtask test` installs Debian's podman and
//! starts containerd). Needs root; run with `--test-threads=1`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use wattprof_tests::containers::{
    BURN, BURN_MIN_NS, Expected, busybox_rootfs, cgroup_cpu_ns, check_against_kernel,
    check_metrics, stop_monitor, wait_until_idle,
};
use wattprof_tests::{read_json, require_ebpf, tempfile_dir, wait_for_stream_header, wattprof_bin};

/// `monitor` with `extra` arguments, writing a recording and a stream to
/// `dir`, serving /metrics on `addr`.
fn monitor(extra: &[&std::ffi::OsStr], dir: &Path, addr: &str) -> Child {
    let stream = dir.join("m.jsonl");
    let child = Command::new(wattprof_bin())
        .args(["monitor", "--interval", "250ms", "--cpu-tdp", "40"])
        .args(["--prometheus", addr])
        .args(extra)
        .arg("--output")
        .arg(dir.join("m.json"))
        .arg("--jsonl")
        .arg(&stream)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("monitor");
    wait_for_stream_header(&stream);
    child
}

fn ok(cmd: &mut Command) -> bool {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

// ---------------------------------------------------------------- Podman

const PODMAN_IMAGE: &str = "localhost/wattprof-test-busybox:latest";

/// The busybox image in Podman's store (imported from a rootfs: nothing
/// is pulled), or why not.
fn podman_image() -> Result<(), String> {
    if !Path::new("/usr/bin/podman").exists() {
        return Err("no podman (apt install podman)".into());
    }
    if ok(Command::new("podman").args(["image", "exists", PODMAN_IMAGE])) {
        return Ok(());
    }
    let root = tempfile_dir();
    busybox_rootfs(&root)?;
    let imported = Command::new("sh")
        .arg("-c")
        .arg(format!(
            "tar -C '{}' -c . | podman import - {PODMAN_IMAGE}",
            root.display()
        ))
        .output()
        .map_err(|e| format!("podman import: {e}"))?;
    let _ = std::fs::remove_dir_all(&root);
    if imported.status.success() {
        Ok(())
    } else {
        Err(format!(
            "podman import failed: {}",
            String::from_utf8_lossy(&imported.stderr).trim()
        ))
    }
}

/// Podman's API service on `socket`, as `podman.socket` would run it.
struct PodmanService(Child);

impl PodmanService {
    fn start(socket: &Path) -> Result<Self, String> {
        let child = Command::new("podman")
            .args(["system", "service", "--time=0"])
            .arg(format!("unix://{}", socket.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("podman system service: {e}"))?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while !socket.exists() {
            if Instant::now() > deadline {
                return Err("podman's API service made no socket in 15 s".into());
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(Self(child))
    }
}

impl Drop for PodmanService {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts a detached Podman container running `script`; its full id.
fn podman_detached(name: &str, script: &str) -> String {
    let _ = Command::new("podman").args(["rm", "-f", name]).output();
    // Podman asks runc for RLIMIT_NOFILE and RLIMIT_NPROC of 1048576 by
    // default; where the test runs without CAP_SYS_RESOURCE (this VM's
    // root) that fails, so the container gets limits below the host's.
    let mut run = Command::new("podman");
    run.args(["run", "-d", "--network", "none", "--name", name]);
    // Debian's podman prefers crun, which refuses a host with cgroup v1
    // hierarchies beside a cgroup2 mount that has a controller ("cgroups
    // in hybrid mode not supported": this VM's cgroup2 has hugetlb, seen
    // on a fresh machine); runc runs there. The runtime plays no part in
    // what is checked: podman names the cgroup and answers the API.
    if let Some(runc) = ["/usr/sbin/runc", "/usr/bin/runc"]
        .into_iter()
        .find(|p| Path::new(p).exists())
    {
        run.args(["--runtime", runc]);
    }
    let out = run
        .args([
            "--ulimit",
            "nofile=1024:1024",
            "--ulimit",
            "nproc=1024:1024",
        ])
        .args([PODMAN_IMAGE, "sh", "-c", script])
        .output()
        .expect("podman run");
    assert!(out.status.success(), "podman run {name}: {out:?}");
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// Podman's cgroups for container `id`: the cgroupfs and systemd drivers.
fn podman_cgroups(id: &str) -> Vec<String> {
    vec![
        format!("/libpod_parent/libpod-{id}"),
        format!("/machine.slice/libpod-{id}.scope"),
    ]
}

#[test]
fn podman_containers_at_two_rates_started_before_and_after_and_renamed_match_the_kernel() {
    require_ebpf!();
    if let Err(why) = podman_image() {
        wattprof_tests::say_skip(&why);
        return;
    }
    let dir = tempfile_dir();
    let socket = dir.join("podman.sock");
    let service = match PodmanService::start(&socket) {
        Ok(s) => s,
        Err(why) => {
            wattprof_tests::say_skip(&why);
            return;
        }
    };
    let pid = std::process::id();
    let (a, b) = (format!("wp-pod1-{pid}"), format!("wp-pod2-{pid}"));
    let renamed = format!("{a}-renamed");
    let _ = Command::new("podman").args(["rm", "-f", &renamed]).output();
    // One loop, started before wattprof (it waits first, so nearly all
    // its CPU time falls while wattprof runs).
    let id_a = podman_detached(&a, &format!("sleep 3; {BURN}; sleep 600"));
    let addr = format!("127.0.0.1:{}", wattprof_tests::free_port());
    let m = monitor(
        &["--podman-socket".as_ref(), socket.as_os_str()],
        &dir,
        &addr,
    );
    let before_a = cgroup_cpu_ns(&podman_cgroups(&id_a)).unwrap_or(0);
    // Two loops at once, started after: twice the rate.
    let id_b = podman_detached(&b, &format!("({BURN}) & ({BURN}) & wait; sleep 600"));
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        ok(Command::new("podman").args(["rename", &a, &renamed])),
        "podman rename"
    );
    wait_until_idle(
        &[podman_cgroups(&id_a), podman_cgroups(&id_b)],
        BURN_MIN_NS,
        Duration::from_secs(90),
    );
    check_metrics(&addr, "podman", &[&id_a, &id_b], &b);
    let kernel: Vec<u64> = [&id_a, &id_b]
        .iter()
        .map(|id| cgroup_cpu_ns(&podman_cgroups(id)).expect("the container's cgroup"))
        .collect();
    stop_monitor(m);
    let _ = Command::new("podman")
        .args(["rm", "-f", "-t", "0", &renamed, &b])
        .output();
    drop(service);
    check_against_kernel(
        &read_json(&dir.join("m.json")),
        "podman",
        &[
            Expected {
                id: &id_a,
                name: &renamed,
                kernel_ns: kernel[0] - before_a.min(kernel[0]),
            },
            Expected {
                id: &id_b,
                name: &b,
                kernel_ns: kernel[1],
            },
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}

// ------------------------------------------------------------ containerd

/// The containerd namespace the tests' containers live in.
const NAMESPACE: &str = "wattprof-test";

fn ctr() -> Command {
    let mut c = Command::new("ctr");
    c.args(["-n", NAMESPACE]);
    c
}

/// A `ctr` task from a busybox rootfs of its own; removed when dropped.
struct CtrTask {
    id: String,
    rootfs: PathBuf,
}

impl CtrTask {
    fn start(id: &str, script: &str, annotation: Option<&str>) -> Self {
        let rootfs = tempfile_dir();
        busybox_rootfs(&rootfs).expect("rootfs");
        let mut cmd = ctr();
        cmd.args(["run", "-d", "--null-io", "--rootfs"]);
        if let Some(a) = annotation {
            cmd.args(["--annotation", a]);
        }
        // `--rootfs` is a switch: the directory takes the image's place.
        let out = cmd
            .arg(&rootfs)
            .args([id, "/bin/sh", "-c", script])
            .output()
            .expect("ctr run");
        assert!(out.status.success(), "ctr run {id}: {out:?}");
        Self {
            id: id.to_string(),
            rootfs,
        }
    }

    /// ctr's cgroupfs default: `/<namespace>/<id>`.
    fn cgroups(&self) -> Vec<String> {
        vec![format!("/{NAMESPACE}/{}", self.id)]
    }
}

impl Drop for CtrTask {
    fn drop(&mut self) {
        let _ = ctr()
            .args(["task", "kill", "-s", "SIGKILL", &self.id])
            .output();
        // The task is deleted once it has exited.
        for _ in 0..50 {
            if ok(ctr().args(["task", "delete", &self.id])) {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = ctr().args(["container", "delete", &self.id]).output();
        let _ = std::fs::remove_dir_all(&self.rootfs);
    }
}

#[test]
fn containerd_containers_at_two_rates_started_before_and_after_match_the_kernel() {
    require_ebpf!();
    if !ok(Command::new("ctr").arg("version")) {
        wattprof_tests::say_skip("containerd does not answer on /run/containerd/containerd.sock");
        return;
    }
    let pid = std::process::id();
    let (a, b) = (format!("wp-ctr1-{pid}"), format!("wp-ctr2-{pid}"));
    let nerd_name = format!("wp-db-{pid}");
    // A plain `ctr` container, known by its id, started before wattprof.
    let task_a = CtrTask::start(&a, &format!("sleep 3; {BURN}; sleep 600"), None);
    let dir = tempfile_dir();
    let addr = format!("127.0.0.1:{}", wattprof_tests::free_port());
    let m = monitor(&[], &dir, &addr);
    let before_a = cgroup_cpu_ns(&task_a.cgroups()).unwrap_or(0);
    // One named as nerdctl names its containers, started after.
    let task_b = CtrTask::start(
        &b,
        &format!("({BURN}) & ({BURN}) & wait; sleep 600"),
        Some(&format!("nerdctl/name={nerd_name}")),
    );
    wait_until_idle(
        &[task_a.cgroups(), task_b.cgroups()],
        BURN_MIN_NS,
        Duration::from_secs(90),
    );
    check_metrics(
        &addr,
        "containerd",
        &[&format!("{NAMESPACE}/{a}"), &format!("{NAMESPACE}/{b}")],
        &nerd_name,
    );
    let kernel: Vec<u64> = [&task_a, &task_b]
        .iter()
        .map(|t| cgroup_cpu_ns(&t.cgroups()).expect("the task's cgroup"))
        .collect();
    stop_monitor(m);
    let (id_a, id_b) = (format!("{NAMESPACE}/{a}"), format!("{NAMESPACE}/{b}"));
    drop((task_a, task_b));
    check_against_kernel(
        &read_json(&dir.join("m.json")),
        "containerd",
        &[
            Expected {
                id: &id_a,
                name: &a,
                kernel_ns: kernel[0] - before_a.min(kernel[0]),
            },
            Expected {
                id: &id_b,
                name: &nerd_name,
                kernel_ns: kernel[1],
            },
        ],
    );
    let _ = std::fs::remove_dir_all(&dir);
}
