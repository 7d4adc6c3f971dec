//! Containers from real cgroups: cgroups named as Docker, containerd,
//! CRI-O, Podman and Kubernetes name them, real processes moved into them,
//! and `wattprof monitor` with a fixture RAPL tree. Needs root and a
//! cgroup2 mount; run with `--test-threads=1`.

use std::path::PathBuf;
use std::process::{Command, Stdio};

use serde_json::Value;
use wattprof_tests::{
    Cgroups, FakeRapl, burn_in, cgroup2_root, f, require_ebpf, tempfile_dir, testload_bin,
    wait_for_stream_header, wattprof_bin,
};

const ID: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
const POD: &str = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";

#[test]
fn each_runtime_s_container_gets_its_own_time_and_energy_even_after_its_processes_exit() {
    require_ebpf!();
    let Some(root) = cgroup2_root() else {
        wattprof_tests::say_skip("no cgroup2 mount");
        return;
    };
    let base = format!("wattprof-test-{}", std::process::id());
    let sd_pod = POD.replace('-', "_");
    let layouts = [
        ("docker", format!("{base}/system.slice/docker-{ID}.scope")),
        ("docker", format!("{base}/docker/{}", ID.replace('0', "9"))),
        (
            "containerd",
            format!(
                "{base}/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{sd_pod}.slice/cri-containerd-{}.scope",
                ID.replace('1', "8")
            ),
        ),
        (
            "crio",
            format!("{base}/machine.slice/crio-{}.scope", ID.replace('2', "7")),
        ),
        (
            "podman",
            format!("{base}/machine.slice/libpod-{}.scope", ID.replace('3', "6")),
        ),
        (
            "kubernetes",
            format!(
                "{base}/kubepods/besteffort/pod{POD}/{}",
                ID.replace('4', "5")
            ),
        ),
    ];
    let mut cgroups = Cgroups::default();
    let dirs: Vec<PathBuf> = layouts
        .iter()
        .map(|(_, rel)| cgroups.make(&root, rel))
        .collect();
    let rapl = FakeRapl::start(30.0, 3.0);
    let out = tempfile_dir().join("m.json");
    let stream = out.with_extension("jsonl");
    let mut monitor = Command::new(wattprof_bin())
        .args([
            "monitor",
            &rapl.arg(),
            "--duration",
            "3s",
            "--interval",
            "250ms",
        ])
        .arg("--output")
        .arg(&out)
        .arg("--jsonl")
        .arg(&stream)
        .stderr(Stdio::piped())
        .spawn()
        .expect("monitor");
    // Burners started before the tracker counts would be partly missed.
    wait_for_stream_header(&stream);
    // 0.2 s of CPU each, one after another: all exit well before the end.
    for d in &dirs {
        let mut c = burn_in(d, "cpu 0.2");
        assert!(c.wait().expect("burner").success());
    }
    let status = monitor.wait().expect("monitor");
    assert!(status.success());
    let report: Value =
        serde_json::from_slice(&std::fs::read(&out).expect("recording")).expect("JSON");
    wattprof_tests::schema::assert_valid("recording", &report);
    let containers = report["containers"].as_array().expect("containers");
    for ((runtime, rel), _) in layouts.iter().zip(&dirs) {
        let id = rel.rsplit('/').next().unwrap_or("");
        let id = id
            .trim_end_matches(".scope")
            .rsplit('-')
            .next()
            .unwrap_or(id);
        let c = containers
            .iter()
            .find(|c| c["id"] == id)
            .unwrap_or_else(|| panic!("{runtime} container {id} missing from {containers:?}"));
        assert_eq!(c["runtime"], *runtime, "{c}");
        let ns = c["on_cpu_ns"].as_u64().unwrap_or(0);
        let joules = f(c, "/energy/package_j");
        eprintln!(
            "{runtime:<10} {id:.12}: {:.3} s on CPU, {joules:.3} J",
            ns as f64 / 1e9
        );
        // 0.2 s of its own CPU, plus its shell's few ms.
        assert!((200_000_000..260_000_000).contains(&ns), "{c}");
        // At 30 W over 2 CPUs, 0.2 CPU-s is ~3 J.
        assert!(joules > 1.5 && joules < 4.5, "{c}");
    }
    let kube = containers
        .iter()
        .find(|c| c["runtime"] == "containerd")
        .expect("kube container");
    assert_eq!(kube["pod_uid"], POD);
    assert_eq!(kube["qos"], "burstable");
    let besteffort = containers
        .iter()
        .find(|c| c["runtime"] == "kubernetes")
        .expect("cgroupfs kube container");
    assert_eq!(besteffort["qos"], "besteffort");
}

#[test]
fn container_and_cgroup_filters_choose_the_reported_processes() {
    require_ebpf!();
    let Some(root) = cgroup2_root() else {
        wattprof_tests::say_skip("no cgroup2 mount");
        return;
    };
    let base = format!("wattprof-test-f{}", std::process::id());
    let mut cgroups = Cgroups::default();
    let inside = cgroups.make(&root, &format!("{base}/system.slice/docker-{ID}.scope"));
    let dir = tempfile_dir();
    let stream = dir.join("s.jsonl");
    let mut monitor = Command::new(wattprof_bin())
        .args([
            "monitor",
            "--duration",
            "1500ms",
            "--interval",
            "250ms",
            "--container",
            &ID[..12],
        ])
        .arg("--jsonl")
        .arg(&stream)
        .stderr(Stdio::null())
        .spawn()
        .expect("monitor");
    wait_for_stream_header(&stream);
    let mut outside = Command::new(testload_bin())
        .args(["cpu", "0.4"])
        .stdout(Stdio::null())
        .spawn()
        .expect("outside");
    let mut c = burn_in(&inside, "cpu 0.4");
    let _ = outside.wait();
    let _ = c.wait();
    assert!(monitor.wait().expect("monitor").success());
    let text = std::fs::read_to_string(&stream).expect("stream");
    let mut rows = 0;
    for line in text.lines() {
        let v: Value = serde_json::from_str(line).expect("line");
        for p in v["processes"].as_array().into_iter().flatten() {
            rows += 1;
            assert_ne!(p["pid"].as_u64(), Some(u64::from(outside.id())), "{p}");
        }
    }
    assert!(rows > 0, "the container's burner was reported");
    // A bad --cgroup is a one-line error before anything starts.
    let out = Command::new(wattprof_bin())
        .args(["monitor", "--cgroup", "system.slice"])
        .output()
        .expect("monitor");
    assert_eq!(out.status.code(), Some(2), "a bad value is a usage error");
    let _ = std::fs::remove_dir_all(dir);
}

/// A process moved to another cgroup in the middle of a long interval: its
/// time (and energy) before the move stays with the cgroup it left, the
/// rest goes to the new one (`cgroup_attach_task` checkpoints the move in
/// the iterator tracker).
#[test]
fn a_process_moved_between_cgroups_mid_interval_is_split_at_the_move() {
    require_ebpf!();
    let Some(root) = cgroup2_root() else {
        wattprof_tests::say_skip("no cgroup2 mount");
        return;
    };
    let base = format!("wattprof-test-move-{}", std::process::id());
    let mut cgroups = Cgroups::default();
    let from = cgroups.make(&root, &format!("{base}/from"));
    let to = cgroups.make(&root, &format!("{base}/to"));
    let rapl = FakeRapl::start(30.0, 3.0);
    let out = tempfile_dir().join("m.json");
    let mut monitor = Command::new(wattprof_bin())
        .args([
            "monitor",
            &rapl.arg(),
            "--tracker",
            "iter",
            "--duration",
            "4s",
            "--interval",
            "3s",
        ])
        .arg("--output")
        .arg(&out)
        .arg("--jsonl")
        .arg(out.with_extension("jsonl"))
        .stderr(Stdio::piped())
        .spawn()
        .expect("monitor");
    wait_for_stream_header(&out.with_extension("jsonl"));
    let mut burner = burn_in(&from, "cpu 1.2");
    let schedstat = |pid: u32| -> u64 {
        std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
            .ok()
            .and_then(|s| s.split_whitespace().next()?.parse().ok())
            .unwrap_or(0)
    };
    std::thread::sleep(std::time::Duration::from_millis(600));
    let pid = burner.id();
    let before = schedstat(pid);
    std::fs::write(to.join("cgroup.procs"), pid.to_string()).expect("move the burner");
    let after = schedstat(pid);
    assert!(burner.wait().expect("burner").success());
    assert!(monitor.wait().expect("monitor").success());
    let report: Value =
        serde_json::from_slice(&std::fs::read(&out).expect("recording")).expect("JSON");
    let cgroup_ns = |dir: &std::path::Path| -> u64 {
        let rel = format!(
            "/{}",
            dir.strip_prefix(&root).expect("under root").display()
        );
        report["cgroups"]
            .as_array()
            .expect("cgroups")
            .iter()
            .find(|c| c["path"] == rel.as_str())
            .and_then(|c| c["on_cpu_ns"].as_u64())
            .unwrap_or(0)
    };
    let (old, new) = (cgroup_ns(&from), cgroup_ns(&to));
    eprintln!(
        "moved at {before}-{after} ns of its CPU time: {old} ns in the cgroup it left, \
         {new} ns in the new one"
    );
    // Before the move: the burner's own time (read just around the move)
    // plus its shell's few ms; after it: the rest of its 1.2 s.
    assert!(
        old >= before && old < after + 20_000_000,
        "old cgroup {old}"
    );
    assert!(
        new > 1_100_000_000u64.saturating_sub(after) && new < 1_250_000_000 - before,
        "new cgroup {new}"
    );
}
