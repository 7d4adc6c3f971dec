//! Container names from a real Docker daemon, in the recording of a
//! `monitor` with no exporter and no terminal, and from a daemon whose
//! socket appears after wattprof started. Skips (saying why) where the
//! daemon does not answer. Needs root; run with `--test-threads=1`.

use std::path::Path;
use std::process::{Child, Command, Stdio};

use serde_json::Value;
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

fn stop(child: Child) {
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGINT) };
    let out = child.wait_with_output().expect("monitor");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The test image, or `None` after saying why the test is skipped.
fn image() -> Option<String> {
    docker_image()
        .map_err(|why| eprintln!("skipping: {why}"))
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
    stop(m);
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
    stop(m);
    let report = read_json(&out);
    assert!(
        named(&report, &name).is_some(),
        "{name} not named in {}",
        report["containers"]
    );
    let _ = std::fs::remove_dir_all(&dir);
}
