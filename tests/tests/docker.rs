//! Container names from a real Docker daemon, in the recording of a
//! `monitor` with no exporter and no terminal, and from a daemon whose
//! socket appears after wattprof started. Skips (saying why) where the
//! daemon does not answer. Needs root; run with `--test-threads=1`.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;
use wattprof_tests::containers::{
    BURN, BURN_MIN_NS, Expected, cgroup_cpu_ns, check_against_kernel, check_metrics, stop_monitor,
    wait_until_idle,
};
use wattprof_tests::{
    docker_image, read_json, require_ebpf, tempfile_dir, wait_for_stream_header, wattprof_bin,
};

/// Runs a container that burns a little CPU, then is removed.
fn container(image: &str, name: &str) {
    let _ = Command::new("docker").args(["rm", "-f", name]).output();
    let ok = Command::new("docker")
        .args(["run", "--rm", "--name", name, image])
        .args([
            "sh",
            "-c",
            "i=0; while [ $i -lt 600000 ]; do i=$((i+1)); done",
        ])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "docker run {name}");
}

fn monitor(socket: &Path, out: &Path, stream: &Path) -> Child {
    Command::new(wattprof_bin())
        .args(["monitor", "--interval", "250ms"])
        .arg("--docker-socket")
        .arg(socket)
        .arg("--output")
        .arg(out)
        .arg("--jsonl")
        .arg(stream)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("monitor")
}

/// The test image, or `None` after saying why the test is skipped.
fn image() -> Option<String> {
    docker_image()
        .map_err(|why| wattprof_tests::say_skip(&why))
        .ok()
}

fn named(report: &Value, name: &str) -> Option<Value> {
    report["containers"]
        .as_array()?
        .iter()
        .find(|c| c["runtime"] == "docker" && c["name"] == name)
        .cloned()
}

#[test]
fn a_recording_names_containers_without_an_exporter_or_a_screen() {
    require_ebpf!();
    let Some(image) = image() else { return };
    let dir = tempfile_dir();
    let (out, stream) = (dir.join("m.json"), dir.join("m.jsonl"));
    let m = monitor(Path::new("/var/run/docker.sock"), &out, &stream);
    wait_for_stream_header(&stream);
    let name = format!("wp-test-{}", std::process::id());
    container(&image, &name);
    stop_monitor(m);
    let report = read_json(&out);
    let c = named(&report, &name)
        .unwrap_or_else(|| panic!("{name} not named in {}", report["containers"]));
    assert!(c["on_cpu_ns"].as_u64().unwrap_or(0) > 0, "{c}");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_docker_socket_that_appears_later_is_found() {
    require_ebpf!();
    let Some(image) = image() else { return };
    let dir = tempfile_dir();
    let socket = dir.join("late.sock");
    let (out, stream) = (dir.join("m.json"), dir.join("m.jsonl"));
    let m = monitor(&socket, &out, &stream);
    wait_for_stream_header(&stream);
    // A container wattprof sees while there is no socket yet: it wakes
    // every half second.
    let name = format!("wp-late-{}", std::process::id());
    let _ = Command::new("docker").args(["rm", "-f", &name]).output();
    let started = Command::new("docker")
        .args(["run", "-d", "--name", &name, &image])
        .args([
            "sh",
            "-c",
            "while true; do i=0; while [ $i -lt 2000 ]; do i=$((i+1)); done; sleep 0.5; done",
        ])
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(started, "docker run -d {name}");
    std::thread::sleep(std::time::Duration::from_secs(2));
    // The daemon "starts": its socket appears where wattprof looks, and
    // is looked for again within 5 s.
    std::os::unix::fs::symlink("/var/run/docker.sock", &socket).expect("socket link");
    std::thread::sleep(std::time::Duration::from_secs(7));
    // Gone before the end: only a name asked for while it ran is known.
    let _ = Command::new("docker").args(["rm", "-f", &name]).output();
    std::thread::sleep(std::time::Duration::from_secs(1));
    stop_monitor(m);
    let report = read_json(&out);
    assert!(
        named(&report, &name).is_some(),
        "{name} not named in {}",
        report["containers"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The cgroups Docker container `id` may have: cgroup v1, or v2 with the
/// systemd or the cgroupfs driver.
fn cgroups(id: &str) -> Vec<String> {
    vec![
        format!("/docker/{id}"),
        format!("/system.slice/docker-{id}.scope"),
    ]
}

/// Starts a detached container running `script`; its full id.
fn detached(image: &str, name: &str, script: &str) -> String {
    let _ = Command::new("docker").args(["rm", "-f", name]).output();
    let out = Command::new("docker")
        .args(["run", "-d", "--name", name, image, "sh", "-c", script])
        .output()
        .expect("docker run");
    assert!(out.status.success(), "docker run {name}: {:?}", out);
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

#[test]
fn containers_at_two_rates_started_before_and_after_and_renamed_match_the_kernel() {
    require_ebpf!();
    let Some(image) = image() else { return };
    let pid = std::process::id();
    let (a, b) = (format!("wp-rate1-{pid}"), format!("wp-rate2-{pid}"));
    let renamed = format!("{a}-renamed");
    let _ = Command::new("docker").args(["rm", "-f", &renamed]).output();
    let burn = BURN;
    // One loop, in a container started before wattprof (it waits first,
    // so nearly all its CPU time falls while wattprof runs).
    let id_a = detached(&image, &a, &format!("sleep 3; {burn}; sleep 600"));
    let dir = tempfile_dir();
    let (out, stream) = (dir.join("m.json"), dir.join("m.jsonl"));
    let port = wattprof_tests::free_port();
    let addr = format!("127.0.0.1:{port}");
    let m = Command::new(wattprof_bin())
        .args(["monitor", "--interval", "250ms", "--cpu-tdp", "40"])
        .args(["--prometheus", &addr, "--output"])
        .arg(&out)
        .arg("--jsonl")
        .arg(&stream)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("monitor");
    wait_for_stream_header(&stream);
    // What A used before wattprof started (runc's init and the shell,
    // in its cgroup): A only sleeps until 3 s after its start.
    let before_a = cgroup_cpu_ns(&cgroups(&id_a)).unwrap_or(0);
    // Two loops at once, in a container started after: twice the rate.
    let id_b = detached(
        &image,
        &b,
        &format!("({burn}) & ({burn}) & wait; sleep 600"),
    );
    std::thread::sleep(std::time::Duration::from_secs(1));
    let ok = Command::new("docker")
        .args(["rename", &a, &renamed])
        .status()
        .is_ok_and(|s| s.success());
    assert!(ok, "docker rename");
    wait_until_idle(
        &[cgroups(&id_a), cgroups(&id_b)],
        BURN_MIN_NS,
        std::time::Duration::from_secs(90),
    );
    // /metrics: both containers' energy, and their names.
    check_metrics(&addr, "docker", &[&id_a, &id_b], &b);
    let kernel: Vec<u64> = [&id_a, &id_b]
        .iter()
        .map(|id| cgroup_cpu_ns(&cgroups(id)).expect("the container's cgroup"))
        .collect();
    stop_monitor(m);
    let _ = Command::new("docker")
        .args(["rm", "-f", &renamed, &b])
        .output();
    // A is checked under its name after `docker rename`.
    check_against_kernel(
        &read_json(&out),
        "docker",
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

#[test]
fn the_wattprof_image_monitors_the_host_from_a_container_without_privileges() {
    require_ebpf!();
    let Some(_) = image() else { return };
    const TAG: &str = "wattprof-test-image:latest";
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/image.sh");
    let built = Command::new("sh")
        .arg(&script)
        .arg(wattprof_bin())
        .arg(TAG)
        .output()
        .expect("scripts/image.sh");
    assert!(
        built.status.success(),
        "{}",
        String::from_utf8_lossy(&built.stdout)
    );
    let dir = tempfile_dir();
    std::fs::set_permissions(&dir, std::os::unix::fs::PermissionsExt::from_mode(0o777))
        .expect("chmod");
    let rapl = wattprof_tests::FakeRapl::start(30.0, 3.0);
    let sysfs = rapl.arg();
    let sysfs_dir = sysfs.trim_start_matches("--energy-sysfs=").to_string();
    // Something on the host for it to see.
    let mut burner = Command::new("sh")
        .args(["-c", "while :; do :; done"])
        .spawn()
        .expect("burner");
    let run = |caps: &[&str]| {
        let mut cmd = Command::new("docker");
        cmd.args(["run", "--rm", "--pid=host", "--cap-drop=ALL"]);
        for c in caps {
            cmd.arg(format!("--cap-add={c}"));
        }
        cmd.args(["-v", "/sys:/sys:ro"])
            .args(["-v", "/sys/kernel/tracing:/sys/kernel/tracing:ro"])
            .args(["-v", &format!("{sysfs_dir}:{sysfs_dir}:ro")])
            .args(["-v", &format!("{}:/out", dir.display())])
            .arg(TAG)
            .args([
                "monitor",
                &sysfs,
                "--duration",
                "3s",
                "--output",
                "/out/m.json",
            ])
            .output()
            .expect("docker run")
    };
    let mut out = run(&["BPF", "PERFMON", "DAC_READ_SEARCH"]);
    let err = String::from_utf8_lossy(&out.stderr).to_string();
    if err.contains("unknown capability") {
        // Docker before 23 does not know CAP_BPF and CAP_PERFMON by name:
        // CAP_SYS_ADMIN stands in for both (docs/deployment.md: Least privilege).
        eprintln!("this Docker has no CAP_BPF/CAP_PERFMON: SYS_ADMIN instead");
        out = run(&["SYS_ADMIN", "DAC_READ_SEARCH"]);
    }
    let _ = burner.kill();
    let _ = burner.wait();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report = read_json(&dir.join("m.json"));
    let measured = report
        .pointer("/energy/domains/0/measured_j")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    // The fixture's 30 W package for about 3 s.
    assert!((60.0..120.0).contains(&measured), "{measured} J");
    let seen = report["processes"].as_array().is_some_and(|v| {
        v.iter().any(|p| {
            p["pid"].as_u64() == Some(u64::from(burner.id()))
                && p["on_cpu_ns"].as_f64().unwrap_or(0.0) > 1e8
        })
    });
    assert!(
        seen,
        "the host's burner (pid {}) is not among the {} processes recorded",
        burner.id(),
        report["processes"].as_array().map_or(0, Vec::len)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
