//! GPU joules a researcher can trust, end to end on the NVML stub set up
//! as the H200 behaved (80 W idle, 45 W more with a context, power that
//! settles over a second, a counter stepping every 100 ms, samples every
//! 200 ms that read 92% for whoever had a kernel in the period): the same
//! job is charged the same however soon it opens its context, time-sliced
//! turns split by time, MPS clients are holders, and NVML's host pids are
//! matched to processes by the tracker's host pids. Needs root.

use serde_json::Value;
use wattprof_tests::{
    domain, f, nvml_stub, process, require_ebpf, tempfile_dir, testload_bin,
    two_burners_on_the_stub, u, wattprof_bin, wattprof_run,
};

const UUID: &str = "GPU-6a3c0f0e-1b2d-4c5e-8f90-0123456789ab";

/// The H200 as the stub models it; `procs` are the processes on it.
fn h200(procs: &str) -> String {
    format!(
        "gpu name=Stub-H200 uuid={UUID} energy=counter energy_step_ms=100 sample_ms=200 \
         sm_window_ms=2000 timeslice=1 settle_ms=1000 load=80000:45000:4000 memory_total=150000000000 \
         memory_used=0{}\n",
        if procs.is_empty() {
            String::new()
        } else {
            format!(" procs={procs}")
        }
    )
}

/// `run` of `cmd` on the stub `lib`: the recording.
fn run_on(lib: &std::path::Path, extra: &[&str], cmd: &[&str]) -> Value {
    let lib_arg = format!("--nvml-lib={}", lib.display());
    let mut args = vec![lib_arg.as_str(), "--energy-sysfs=/nonexistent"];
    args.extend(extra);
    let run = wattprof_run(&args, cmd);
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report().clone();
    wattprof_tests::schema::assert_valid("recording", &report);
    report
}

/// The command's GPU joules against what it caused: the GPU's measured
/// energy less its true 80 W idle over the run.
fn charged_vs_caused(report: &Value) -> (f64, f64) {
    let g = domain(report, "gpu", Some(0));
    let wall_s = u(report, "/wall_ns") as f64 / 1e9;
    let cmd = process(report, u(report, "/command/pid"));
    (f(cmd, "/energy/gpu_j"), f(g, "/measured_j") - 80.0 * wall_s)
}

#[test]
fn the_same_job_is_charged_the_same_however_soon_it_opens_its_context() {
    require_ebpf!();
    // The GPU learned the documented way: `calibrate --gpu-only` measures
    // its idle power and, with a CUDA context of its own, its held power.
    let lib = nvml_stub(&h200(""));
    let model = tempfile_dir().join("model.json");
    let out = std::process::Command::new(wattprof_bin())
        .args(["calibrate", "--gpu-only", "--step", "4s", "--nvml-lib"])
        .arg(&lib)
        .arg("--cuda-lib")
        .arg(&lib)
        .arg("-o")
        .arg(&model)
        .output()
        .expect("calibrate");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let m: Value = serde_json::from_slice(&std::fs::read(&model).expect("model")).expect("JSON");
    let (idle_w, held_w) = (f(&m, "/gpus/0/idle_w"), f(&m, "/gpus/0/held_w"));
    eprintln!("calibrated: {idle_w:.2} W idle, {held_w:.2} W held (stub: 80, 45)");
    assert_eq!(m["gpus"][0]["uuid"], UUID);
    assert!((idle_w / 80.0 - 1.0).abs() < 0.04, "{idle_w}");
    assert!((held_w / 45.0 - 1.0).abs() < 0.08, "{held_w}");
    let model_arg = format!("--host-model={}", model.display());
    // A job at 90% SM that opens its context 1 s after run starts, and
    // the same job opening it 9 s after: each charged what it caused.
    for (from_ms, secs) in [(1000, "10"), (9000, "18")] {
        let lib = nvml_stub(&h200(&format!(
            "child:90:1073741824@{from_ms}-{}",
            from_ms + 8000
        )));
        let report = run_on(&lib, &[&model_arg], &["sleep", secs]);
        let (charged, caused) = charged_vs_caused(&report);
        let g = domain(&report, "gpu", Some(0));
        eprintln!("context at {from_ms} ms: charged {charged:.1} J, caused {caused:.1} J");
        assert!(
            (charged / caused - 1.0).abs() < 0.02,
            "{from_ms}: {charged} vs {caused}"
        );
        // The static figure is the lower of two upper bounds (each
        // figure's power times one plus its error): the model's idle
        // power and, where the run itself saw the GPU idle long enough
        // (the late job), the lowest power it saw. Which one wins turns on
        // the calibration's noise and the errors, which the recording does
        // not carry (79.6 W calibrated won once under load; 80.0 W seen won
        // over a model a little lower but less certain): so whichever wins
        // is checked to be that figure, and near the stub's true 80 W.
        let static_w = f(g, "/static_w");
        match g["static_source"].as_str() {
            Some("host_model") => {
                assert!((static_w - idle_w).abs() < 1e-6, "{g}");
            }
            Some("lowest_seen") if from_ms == 9000 => {
                assert!((static_w / 80.0 - 1.0).abs() < 0.01, "{g}");
            }
            _ => panic!("{from_ms}: {g}"),
        }
        // Without the model the early job pays the idle power too.
        if from_ms == 1000 {
            let lib = nvml_stub(&h200("child:90:1073741824@1000-9000"));
            let report = run_on(&lib, &["--host-model=none"], &["sleep", secs]);
            let (charged, caused) = charged_vs_caused(&report);
            eprintln!("without the host model: charged {charged:.1} J, caused {caused:.1} J");
            assert!(charged / caused > 1.1, "{charged} vs {caused}");
        }
    }
    // A model of another GPU is refused for this one, said in one line.
    let other = h200("").replace(UUID, "GPU-00000000-1111-2222-3333-444444444444");
    let lib = nvml_stub(&other);
    let lib_arg = format!("--nvml-lib={}", lib.display());
    let run = wattprof_run(
        &[&lib_arg, "--energy-sysfs=/nonexistent", &model_arg],
        &["true"],
    );
    assert!(run.output.status.success(), "{}", run.stderr());
    let problems = run.report()["energy"]["problems"].to_string();
    assert!(
        problems.contains(&format!(
            "GPU {UUID} (Stub-H200) are not used: no such GPU here"
        )),
        "{problems}"
    );
}

/// Each pid's GPU joules over the whole run (the intervals the power
/// settled after them included).
fn sampled_j(report: &Value, pids: &[u64]) -> Vec<f64> {
    pids.iter()
        .map(|pid| f(process(report, *pid), "/energy/gpu_j"))
        .collect()
}

/// `run` of a shell whose two children burn lightly for `secs`: the
/// recording and the two pids in order (the stub's `child/1` and
/// `child/2`).
fn two_children(lib: &std::path::Path, interval: &str, secs: &str) -> (Value, Vec<u64>) {
    let lib_arg = format!("--nvml-lib={}", lib.display());
    two_burners_on_the_stub(&lib_arg, interval, secs, "0.05")
}

#[test]
fn time_sliced_turns_are_split_by_time_at_1_s_and_100_ms() {
    require_ebpf!();
    // 200/100 ms turns from 1 s to 37 s, as the H200 was measured: each
    // sample is its process's SM over the last 2 s, revised while newest,
    // and published for the one working at the tick (testdata of
    // profiler/src/sources/nvml). Counting periods gave 3.07:1 on the
    // H200; the split is 2:1 in time.
    for interval in ["1s", "100ms"] {
        let lib = nvml_stub(&h200(
            "child/1:92:1024~0-200/300@1000-37000,child/2:92:1024~200-300/300@1000-37000",
        ));
        let (report, pids) = two_children(&lib, interval, "37.5");
        // The whole run counts, the intervals where the turns began and
        // ended (the power settling after them) included.
        let j = sampled_j(&report, &pids);
        eprintln!(
            "{interval}: {:.1} J : {:.1} J ({:.4}:1)",
            j[0],
            j[1],
            j[0] / j[1]
        );
        assert!((j[0] / j[1] / 2.0 - 1.0).abs() < 0.02, "{interval}: {j:?}");
    }
}

#[test]
fn mps_clients_are_holders_weighed_by_their_samples() {
    require_ebpf!();
    // An MPS server (this test process: a process the tracker knows)
    // holds the context; two clients at 60% and 30% SM.
    let me = std::process::id();
    let lib = nvml_stub(&format!(
        "gpu name=Stub-H200 uuid={UUID} energy=counter energy_step_ms=100 sample_ms=200 \
         load=80000:45000:4000 memory_total=150000000000 memory_used=0 \
         mps_server={me}:268435456 \
         procs=child/1:60:1024%mps@1000-7000,child/2:30:1024%mps@1000-7000\n"
    ));
    let (report, pids) = two_children(&lib, "1s", "7.5");
    let holders: Vec<u64> = report["intervals"]
        .as_array()
        .expect("intervals")
        .iter()
        .flat_map(|i| {
            i["gpus"][0]["processes"]
                .as_array()
                .cloned()
                .unwrap_or_default()
        })
        .map(|p| u(&p, "/pid"))
        .collect();
    for pid in pids.iter().chain([&u64::from(me)]) {
        assert!(holders.contains(pid), "{pid} never a holder: {holders:?}");
    }
    let j = sampled_j(&report, &pids);
    eprintln!(
        "MPS clients: {:.1} J : {:.1} J ({:.4}:1)",
        j[0],
        j[1],
        j[0] / j[1]
    );
    assert!((j[0] / j[1] / 2.0 - 1.0).abs() < 0.02, "{j:?}");
}

#[test]
fn mps_clients_get_their_work_when_the_driver_samples_it_as_the_server_s() {
    require_ebpf!();
    // As an H200 on driver 580: every sample of the clients' work carries
    // the MPS server's pid. The server is found by its name
    // (`nvidia-cuda-mps-server`, `comm` truncated to 15 bytes): here a
    // copy of sleep under that name.
    let server_bin = wattprof_tests::tempfile_dir().join("nvidia-cuda-mps-server");
    std::fs::copy("/bin/sleep", &server_bin).expect("copy sleep");
    let mut server = std::process::Command::new(&server_bin)
        .arg("60")
        .spawn()
        .expect("the stand-in MPS server");
    let scenario = |samples: &str| {
        format!(
            "gpu name=Stub-H200 uuid={UUID} energy=counter energy_step_ms=100 sample_ms=200 \
             load=80000:45000:4000 memory_total=150000000000 memory_used=0 {samples} \
             mps_server={}:268435456 \
             procs=child/1:60:1024%mps@1000-7000,child/2:30:1024%mps@1000-7000\n",
            server.id()
        )
    };
    let (own, own_pids) = two_children(&nvml_stub(&scenario("")), "1s", "7.5");
    let (theirs, pids) = two_children(&nvml_stub(&scenario("mps_samples=server")), "1s", "7.5");
    let _ = server.kill();
    let _ = server.wait();
    let j_own = sampled_j(&own, &own_pids);
    let j = sampled_j(&theirs, &pids);
    eprintln!(
        "MPS clients with their own samples: {:.1} + {:.1} J; sampled as the server's: {:.1} + {:.1} J",
        j_own[0], j_own[1], j[0], j[1]
    );
    // The tree gets the same energy either way; the clients, equally
    // (NVML gives no per-client figure then).
    let (sum_own, sum) = (j_own[0] + j_own[1], j[0] + j[1]);
    assert!((sum / sum_own - 1.0).abs() < 0.03, "{j:?} vs {j_own:?}");
    assert!((j[0] / j[1] - 1.0).abs() < 0.02, "{j:?}");
    let problems = theirs["energy"]["problems"].to_string();
    assert!(problems.contains("divided equally"), "{problems}");
}

#[test]
fn a_job_in_a_pid_namespace_is_attributed_and_a_colliding_pid_is_not_it() {
    require_ebpf!();
    // The job runs as pid 1 of its own PID namespace; NVML (host pids)
    // lists it at 80% SM, and the host's pid 1 at 20%. Matched by the
    // namespace's view, pid 1 would be the job: it must not be.
    let unshare = ["/usr/bin/unshare", "/bin/unshare"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists());
    let Some(unshare) = unshare else {
        wattprof_tests::say_skip("no unshare");
        return;
    };
    // Side by side (not time-sliced): samples that read their share.
    let lib = nvml_stub(
        &h200("child/1:80:1073741824@500-6500,1:20:1024@500-6500,4000001:0:1024@500-6500")
            .replace(" timeslice=1", ""),
    );
    let t = testload_bin().to_string_lossy().into_owned();
    let report = run_on(
        &lib,
        &["--host-model=none"],
        &[
            unshare,
            "--pid",
            "--fork",
            "--mount-proc",
            &t,
            "burn",
            "7",
            "0.05",
        ],
    );
    let g = domain(&report, "gpu", Some(0));
    let tree = f(&report["energy"]["groups"]["tree"], "/gpu_j");
    let measured = f(g, "/measured_j");
    eprintln!("tree {tree:.1} J of {measured:.1} J");
    // The job's 80% of the work, and of the held power its half; the host
    // pid 1's share is never the tree's.
    assert!(
        tree > 0.5 * measured,
        "the job in its namespace got {tree} of {measured} J"
    );
    // A holder no process has (pid 4000001: another namespace's view) is
    // said once, and its share is unattributed.
    let problems: Vec<String> = report["energy"]["problems"]
        .as_array()
        .expect("problems")
        .iter()
        .filter_map(|p| p.as_str().map(str::to_string))
        .filter(|p| p.contains("pid 4000001 holds a context"))
        .collect();
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(
        tree < 0.95 * measured,
        "the colliding pid 1's energy went to the job: {tree} of {measured} J"
    );
}

/// A Slurm step's cgroup as slurmd makes it on a v1 host, removed when
/// dropped (its processes gone by then).
struct SlurmStep(Vec<std::path::PathBuf>);

impl Drop for SlurmStep {
    fn drop(&mut self) {
        for d in &self.0 {
            let _ = std::fs::remove_dir(d);
        }
    }
}

#[test]
fn a_slurm_job_s_process_on_the_gpu_puts_its_gpu_energy_in_the_job() {
    require_ebpf!();
    let freezer = std::path::Path::new("/sys/fs/cgroup/freezer");
    if !freezer.join("cgroup.procs").exists() {
        wattprof_tests::say_skip("no cgroup v1 freezer hierarchy");
        return;
    }
    // The job's step, as `proctrack/cgroup` makes it with cgroup/v1.
    let id = std::process::id().to_string();
    let top = freezer.join(format!("slurm_wattprof_test{id}"));
    let job = top.join("uid_0").join(format!("job_{id}"));
    let step = job.join("step_batch");
    std::fs::create_dir_all(&step).expect("the step's cgroup");
    let _cleanup = SlurmStep(vec![step.clone(), job.clone(), top.join("uid_0"), top]);
    // The step's process holds the GPU at 80% SM from 0.5 s to 3.5 s.
    let lib = nvml_stub(&h200("child:80:1073741824@500-3500"));
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec {} burn 4 0.05",
        step.display(),
        testload_bin().display()
    );
    let report = run_on(&lib, &["--host-model=none"], &["/bin/sh", "-c", &script]);
    let jobs = report["jobs"].as_array().expect("jobs[]");
    let j = jobs
        .iter()
        .find(|j| j["job_id"] == id.as_str())
        .unwrap_or_else(|| panic!("job {id} missing from {jobs:?}"));
    assert_eq!(j["scheduler"], "slurm", "{j}");
    let cmd = process(&report, u(&report, "/command/pid"));
    let (in_job, of_cmd) = (f(j, "/energy/gpu_j"), f(cmd, "/energy/gpu_j"));
    eprintln!("job {id}: {in_job:.3} GPU J; its process: {of_cmd:.3} J");
    assert!(of_cmd > 100.0, "{of_cmd}");
    assert!((in_job - of_cmd).abs() < 1e-3, "{in_job} vs {of_cmd}");
}
