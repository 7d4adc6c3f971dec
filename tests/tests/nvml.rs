//! The NVML reader against a stub NVIDIA library (tests/nvml-stub) loaded
//! through nvml-wrapper's library path, driven by a scenario. No GPU or
//! root needed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use wattprof::sources::nvml::{GpuEnergyMethod, GpuReading, NvmlGpus, SmBasis};
use wattprof::sources::{Source, SourceError};
use wattprof_tests::nvml_stub;

fn stub(scenario: &str) -> PathBuf {
    nvml_stub(scenario)
}

fn open(lib: &std::path::Path) -> NvmlGpus {
    NvmlGpus::open(Some(lib.as_os_str())).expect("open stub NVML")
}

/// Energy over `ms` milliseconds, and the time it really took: at least
/// from the end of the first read to the start of the second, at most from
/// the start of the first to the end of the second.
fn energy_over_span(
    gpus: &mut NvmlGpus,
    ms: u64,
) -> (Vec<wattprof::sources::nvml::GpuReading>, f64, f64) {
    let t0 = Instant::now();
    gpus.read_gpus();
    let t1 = Instant::now();
    std::thread::sleep(Duration::from_millis(ms));
    let t2 = Instant::now();
    let r = gpus.read_gpus();
    let t3 = Instant::now();
    (r, (t2 - t1).as_secs_f64(), (t3 - t0).as_secs_f64())
}

/// Energy over `ms` milliseconds, and about how long it took.
fn energy_over(gpus: &mut NvmlGpus, ms: u64) -> (Vec<wattprof::sources::nvml::GpuReading>, f64) {
    let (r, lo, hi) = energy_over_span(gpus, ms);
    (r, (lo + hi) / 2.0)
}

#[test]
fn energy_counter_utilization_memory_and_processes() {
    let lib = stub(
        "gpu name=NVIDIA-H100 uuid=GPU-aaaa power_mw=250000 energy=counter util=60 \
         memory_total=85899345920 memory_used=4294967296 procs=4242:70:1073741824,4243:20:536870912\n",
    );
    let mut gpus = open(&lib);
    let info = &gpus.gpus()[0];
    assert_eq!(
        (info.name.as_str(), info.uuid.as_str()),
        ("NVIDIA-H100", "GPU-aaaa")
    );
    assert_eq!(info.method, GpuEnergyMethod::EnergyCounter);
    assert_eq!(info.memory_total_bytes, 85_899_345_920);
    let (r, lo, hi) = energy_over_span(&mut gpus, 300);
    let g = &r[0];
    // The stub's counter is 250 W × its own clock: the growth between the
    // two reads lies between 250 W × the time between them (bounded by
    // the reads' own start and end), with 1 mJ of the counter's rounding.
    let uj = g.energy_uj as f64;
    assert!(
        uj >= 250.0 * lo * 1e6 - 1e3 && uj <= 250.0 * hi * 1e6 + 1e3,
        "{uj} µJ, not within 250 W × [{lo}, {hi}] s"
    );
    // Units converted exactly: mW → W, the percentage, bytes.
    assert_eq!(
        (g.power_w, g.util_pct, g.memory_used_bytes),
        (Some(250.0), Some(60), Some(4_294_967_296))
    );
    // The driver sampled (every 167 ms) within the 300 ms.
    assert_eq!(g.sm_basis, SmBasis::Sampled);
    let procs: Vec<(u32, f64, u64)> = g
        .processes
        .iter()
        .map(|p| (p.pid, p.sm_util_pct, p.memory_bytes))
        .collect();
    assert_eq!(
        procs,
        vec![(4242, 70.0, 1_073_741_824), (4243, 20.0, 536_870_912)]
    );
}

#[test]
fn pre_volta_gpu_falls_back_to_integrating_power_and_agrees_with_the_counter() {
    let lib = stub(
        "gpu name=Tesla-P100 uuid=GPU-old power_mw=100000 energy=unsupported\n\
         gpu name=NVIDIA-A100 uuid=GPU-new power_mw=100000 energy=counter\n",
    );
    let mut gpus = open(&lib);
    let methods: Vec<_> = gpus.gpus().iter().map(|g| g.method).collect();
    assert_eq!(
        methods,
        vec![
            GpuEnergyMethod::PowerIntegration,
            GpuEnergyMethod::EnergyCounter
        ]
    );
    let (r, secs) = energy_over(&mut gpus, 300);
    let expected = 100.0 * secs * 1e6;
    for g in &r {
        let err = (g.energy_uj as f64 - expected).abs() / expected;
        assert!(
            err < 0.05,
            "GPU {}: {} µJ vs {expected} ({err})",
            g.index,
            g.energy_uj
        );
    }
    let diff = r[0].energy_uj.abs_diff(r[1].energy_uj) as f64 / r[1].energy_uj as f64;
    assert!(diff < 0.02, "integration vs counter {diff}");
}

#[test]
fn a_gpu_that_disappears_mid_run_is_reported_and_the_others_keep_reading() {
    let lib = stub(
        "gpu name=A uuid=GPU-0 power_mw=50000 energy=counter\n\
         gpu name=B uuid=GPU-1 power_mw=50000 energy=counter lost_after=4\n",
    );
    let mut gpus = open(&lib);
    assert_eq!(gpus.read_gpus().len(), 2);
    let mut last = Vec::new();
    for _ in 0..4 {
        last = gpus.read_gpus();
    }
    assert_eq!(last.iter().map(|g| g.index).collect::<Vec<_>>(), vec![0]);
    assert!(
        gpus.problems()
            .iter()
            .any(|(i, what)| *i == 1 && what.contains("lost")),
        "{:?}",
        gpus.problems()
    );
    // Through the Source trait too: GPU 0 still reads.
    assert_eq!(gpus.read().expect("read").len(), 1);
}

#[test]
fn mig_devices_are_listed() {
    let lib = stub("gpu name=NVIDIA-A100 uuid=GPU-mig power_mw=90000 energy=counter mig=1\n");
    assert!(open(&lib).gpus()[0].mig);
}

#[test]
fn no_driver_or_no_gpu_is_a_status_not_an_error() {
    let lib = stub("driver=absent\n");
    for err in [
        NvmlGpus::open(Some(lib.as_os_str())).expect_err("no driver"),
        NvmlGpus::open(Some(std::ffi::OsStr::new("/nonexistent/libnvidia-ml.so.1")))
            .expect_err("no lib"),
    ] {
        match err {
            SourceError::NotSupported { reason, .. } => {
                assert_eq!(reason, "no NVIDIA driver found")
            }
            other => panic!("{other:?}"),
        }
    }
    let lib = stub("# a driver with no GPU\n");
    match NvmlGpus::open(Some(lib.as_os_str())).expect_err("no gpu") {
        SourceError::NotSupported { reason, .. } => assert!(reason.contains("no GPU"), "{reason}"),
        other => panic!("{other:?}"),
    }
}

/// (pid, SM %) of each process on a reading.
fn shares(r: &GpuReading) -> Vec<(u32, f64)> {
    r.processes.iter().map(|p| (p.pid, p.sm_util_pct)).collect()
}

/// The lines said by the last read, for GPU `index`, but the one about
/// pids this PID namespace cannot see: the scenarios' pids (5001...) are
/// made up (that line has a test of its own).
fn said(gpus: &NvmlGpus, index: u32) -> Vec<String> {
    gpus.problems()
        .iter()
        .filter(|(i, l)| *i == index && !l.contains("PID namespace"))
        .map(|(_, l)| l.clone())
        .collect()
}

#[test]
fn gpu_holders_are_as_nvml_lists_them_never_judged_by_this_namespace_s_proc() {
    // One real process (this test) and one with no /proc entry here, as
    // NVML lists host pids to wattprof in a container: the reader keeps
    // both (the profile matches them by the tracker's host pids, and says
    // the ones it cannot), and says nothing of /proc.
    let me = std::process::id();
    let lib = stub(&format!(
        "gpu name=A uuid=GPU-0 power_mw=1000 energy=counter procs={me}:10:1024,4000001:20:2048\n"
    ));
    let mut gpus = open(&lib);
    let r = gpus.read_gpus().remove(0);
    let pids: Vec<u32> = r.processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![me, 4_000_001]);
    assert!(gpus.problems().is_empty(), "{:?}", gpus.problems());
}

#[test]
fn garbage_samples_are_discarded_said_once_and_never_move_last_seen_into_the_future() {
    // nvtop issue 110: pid 0, SM 37100, a far-future timestamp, a
    // duplicate, an exited pid, in every call with something new.
    let lib = stub(
        "gpu name=A uuid=GPU-0 power_mw=100000 energy=counter sample_ms=100 \
         garbage=pid0,sm_over,future,dup,exited procs=5001:60:1024,5002:30:2048\n",
    );
    let mut gpus = open(&lib);
    gpus.read_gpus();
    let mut lines = Vec::new();
    for round in 0..4 {
        std::thread::sleep(Duration::from_millis(300));
        let r = gpus.read_gpus();
        lines.extend(said(&gpus, 0));
        // Exactly the two processes, at their own SM, the duplicate
        // weighted once: a far-future timestamp as the last seen would
        // have made every later call NOT_FOUND (carried, then equal).
        assert_eq!(r[0].sm_basis, SmBasis::Sampled, "round {round}");
        assert_eq!(
            shares(&r[0]),
            vec![(5001, 60.0), (5002, 30.0)],
            "round {round}"
        );
    }
    let discarded: Vec<_> = lines.iter().filter(|l| l.contains("discarded")).collect();
    assert_eq!(discarded.len(), 1, "said once while it lasts: {lines:?}");
    for what in ["of pid 0", "SM over 100%", "in the future", "duplicated"] {
        assert!(discarded[0].contains(what), "{what}: {}", discarded[0]);
    }
}

#[test]
fn a_count_race_is_retried() {
    // Two sized calls find one more sample than the count call said.
    let lib = stub(
        "gpu name=A uuid=GPU-0 power_mw=100000 energy=counter sample_ms=100 race=2 \
         procs=5001:50:1024,5002:25:2048\n",
    );
    let mut gpus = open(&lib);
    std::thread::sleep(Duration::from_millis(250));
    let r = gpus.read_gpus();
    assert_eq!(r[0].sm_basis, SmBasis::Sampled);
    assert_eq!(shares(&r[0]), vec![(5001, 50.0), (5002, 25.0)]);
    assert!(said(&gpus, 0).is_empty(), "{:?}", gpus.problems());
    // A race that never ends is a failure said, not a silent equal split.
    let lib = stub(
        "gpu name=A uuid=GPU-0 power_mw=100000 energy=counter sample_ms=100 race=1000 \
         procs=5001:50:1024,5002:25:2048\n",
    );
    let mut gpus = open(&lib);
    std::thread::sleep(Duration::from_millis(250));
    let r = gpus.read_gpus();
    assert_eq!(r[0].sm_basis, SmBasis::Equal);
    let lines = said(&gpus, 0);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("per-process samples failed")),
        "{lines:?}"
    );
}

#[test]
fn between_the_driver_s_samples_shares_are_carried_for_2_s_then_equal_and_said() {
    // Samples every 500 ms, reads every 100 ms: an interval with no new
    // sample keeps the last shares (2:1), never an equal split.
    let lib = stub(
        "gpu name=A uuid=GPU-0 power_mw=100000 energy=counter sample_ms=500 \
         procs=5001:60:1024,5002:30:2048\n",
    );
    let mut gpus = open(&lib);
    std::thread::sleep(Duration::from_millis(550));
    let mut bases = Vec::new();
    for _ in 0..20 {
        let r = gpus.read_gpus();
        assert_eq!(shares(&r[0]), vec![(5001, 60.0), (5002, 30.0)], "{r:?}");
        bases.push(r[0].sm_basis);
        std::thread::sleep(Duration::from_millis(100));
    }
    let sampled = bases.iter().filter(|b| **b == SmBasis::Sampled).count();
    let carried = bases.iter().filter(|b| **b == SmBasis::Carried).count();
    assert_eq!(sampled + carried, bases.len(), "{bases:?}");
    // About one read in five has a new sample (a loaded machine reads
    // later, so more can).
    assert!((3..=12).contains(&sampled), "{bases:?}");
    // The samples stop (their calls fail from the next read on; the
    // first read made two, the count and the sized call): the
    // shares are carried for 2 s, then equal, and the failure is said.
    let lib = stub(
        "gpu name=A uuid=GPU-0 power_mw=100000 energy=counter sample_ms=100 \
         fail=samples@3-10000:unknown procs=5001:60:1024,5002:30:2048\n",
    );
    let mut gpus = open(&lib);
    std::thread::sleep(Duration::from_millis(250));
    assert_eq!(gpus.read_gpus()[0].sm_basis, SmBasis::Sampled);
    let failed_at = Instant::now();
    let r = gpus.read_gpus();
    assert_eq!(r[0].sm_basis, SmBasis::Carried);
    assert_eq!(shares(&r[0]), vec![(5001, 60.0), (5002, 30.0)]);
    assert!(
        said(&gpus, 0)
            .iter()
            .any(|l| l.contains("per-process samples failed")),
        "{:?}",
        gpus.problems()
    );
    let mut last = r;
    while failed_at.elapsed() < Duration::from_millis(2600) {
        std::thread::sleep(Duration::from_millis(200));
        last = gpus.read_gpus();
        assert!(
            said(&gpus, 0).is_empty(),
            "said once: {:?}",
            gpus.problems()
        );
    }
    assert_eq!(last[0].sm_basis, SmBasis::Equal);
    assert_eq!(shares(&last[0]), vec![(5001, 0.0), (5002, 0.0)]);
}

#[test]
fn a_stepped_energy_counter_is_exact_to_a_step() {
    // The counter moves every 100 ms (some GPUs update every 20-100 ms):
    // each 30 ms read sees 0 or a whole step, and the sum is the draw
    // over the span to within a step.
    let lib = stub("gpu name=A uuid=GPU-0 power_mw=100000 energy=counter energy_step_ms=100\n");
    let mut gpus = open(&lib);
    let t0 = Instant::now();
    gpus.read_gpus();
    let t1 = Instant::now();
    let mut total = 0u64;
    let mut steps = Vec::new();
    let mut starts = Vec::new();
    for _ in 0..30 {
        std::thread::sleep(Duration::from_millis(30));
        starts.push(Instant::now());
        let uj = gpus.read_gpus()[0].energy_uj;
        steps.push(uj);
        total += uj;
    }
    let t2 = Instant::now();
    let step_uj = 100.0 * 0.1 * 1e6;
    for uj in &steps {
        let k = *uj as f64 / step_uj;
        assert!((k - k.round()).abs() < 1e-6, "not whole steps: {steps:?}");
    }
    assert!(
        steps.contains(&0),
        "some reads between two steps: {steps:?}"
    );
    // The counter's growth between the first read's end and the last
    // read's start, give or take a step at each end.
    let before_last = starts.last().copied().unwrap_or(t1);
    let lo = 100.0 * (before_last - t1).as_secs_f64() * 1e6 - step_uj;
    let hi = 100.0 * (t2 - t0).as_secs_f64() * 1e6 + step_uj;
    assert!(
        (lo..=hi).contains(&(total as f64)),
        "{total} not in [{lo}, {hi}]"
    );
}

#[test]
fn the_power_reading_is_a_1_s_mean_and_the_counter_follows_the_draw() {
    // 100 W, then 300 W from 500 ms: at 1 s the reading is the last
    // second's mean (200 W), while the counter's growth over the last
    // 400 ms is 300 W's.
    let lib =
        stub("gpu name=A uuid=GPU-0 power_mw=100000 power_step_ms=500:300000 energy=counter\n");
    let mut gpus = open(&lib);
    std::thread::sleep(Duration::from_millis(600));
    gpus.read_gpus();
    let t = Instant::now();
    std::thread::sleep(Duration::from_millis(400));
    let r = gpus.read_gpus();
    let secs = t.elapsed().as_secs_f64();
    let w = r[0].energy_uj as f64 / 1e6 / secs;
    assert!((w / 300.0 - 1.0).abs() < 0.05, "counter {w} W");
    let p = r[0].power_w.expect("power");
    assert!(p > 150.0 && p < 280.0, "a 1 s mean of 100 and 300 W: {p}");
}

#[test]
fn an_energy_counter_that_cannot_be_read_falls_back_to_power_integration_and_says_why() {
    for (energy, why) in [("noperm", "permission"), ("nofunc", "function")] {
        let lib = stub(&format!(
            "gpu name=A uuid=GPU-0 power_mw=80000 energy={energy}\n"
        ));
        let mut gpus = open(&lib);
        assert_eq!(gpus.gpus()[0].method, GpuEnergyMethod::PowerIntegration);
        let lines = said(&gpus, 0);
        assert!(
            lines
                .iter()
                .any(|l| l.contains("integrated from power") && l.to_lowercase().contains(why)),
            "{energy}: {lines:?}"
        );
        let (r, lo, hi) = energy_over_span(&mut gpus, 300);
        let uj = r[0].energy_uj as f64;
        assert!(
            uj >= 80.0 * lo * 1e6 * 0.98 && uj <= 80.0 * hi * 1e6 * 1.02,
            "{energy}: {uj} µJ, not 80 W × [{lo}, {hi}] s"
        );
        // Through the Source trait it is marked estimated.
        let d = gpus.read().expect("read");
        assert!(d[0].estimated);
    }
}

#[test]
fn a_transient_error_skips_one_read_whose_energy_comes_with_the_next() {
    // The 3rd energy call answers Unknown: that read has no reading for
    // the GPU (said), the GPU is not lost, and the next read's energy
    // covers both intervals.
    let lib =
        stub("gpu name=A uuid=GPU-0 power_mw=100000 energy=counter fail=energy@3-3:unknown\n");
    let mut gpus = open(&lib); // 1st call
    let t0 = Instant::now();
    gpus.read_gpus(); // 2nd
    let t1 = Instant::now();
    std::thread::sleep(Duration::from_millis(200));
    assert!(gpus.read_gpus().is_empty(), "the failed read gives none");
    let lines = said(&gpus, 0);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("energy read failed") && l.contains("next good read")),
        "{lines:?}"
    );
    std::thread::sleep(Duration::from_millis(200));
    let t2 = Instant::now();
    let r = gpus.read_gpus();
    let t3 = Instant::now();
    assert_eq!(r.len(), 1, "not lost: {:?}", gpus.problems());
    let uj = r[0].energy_uj as f64;
    let (lo, hi) = ((t2 - t1).as_secs_f64(), (t3 - t0).as_secs_f64());
    assert!(
        uj >= 100.0 * lo * 1e6 - 1e3 && uj <= 100.0 * hi * 1e6 + 1e3,
        "{uj} µJ, not 100 W × [{lo}, {hi}] s"
    );
    assert!(
        said(&gpus, 0).iter().any(|l| l == "energy reads again"),
        "{:?}",
        gpus.problems()
    );
}

#[test]
fn a_gpu_lost_and_back_is_said_both_times_and_its_energy_meanwhile_is_kept() {
    // Lost after 3 energy/power calls (open's, and the first read's
    // two: the rest of that read already finds it lost), back after
    // answering GPU_IS_LOST 8 times (that read's 4 other calls, then two
    // reads' power and energy).
    let lib =
        stub("gpu name=A uuid=GPU-0 power_mw=100000 energy=counter lost_after=3 back_after=8\n");
    let mut gpus = open(&lib);
    let t0 = Instant::now();
    assert_eq!(gpus.read_gpus().len(), 1);
    let t1 = Instant::now();
    let mut lost_reads = 0;
    let mut lines = Vec::new();
    let (r, before) = loop {
        std::thread::sleep(Duration::from_millis(100));
        let before = Instant::now();
        let r = gpus.read_gpus();
        lines.extend(said(&gpus, 0));
        if !r.is_empty() {
            break (r, before);
        }
        lost_reads += 1;
        assert!(lost_reads < 10, "never back: {lines:?}");
    };
    let t2 = Instant::now();
    assert!(lost_reads >= 1, "{lines:?}");
    assert!(lines.iter().any(|l| l.contains("lost")), "{lines:?}");
    assert!(
        lines
            .iter()
            .any(|l| l.contains("answers again") && l.contains("covers that time")),
        "{lines:?}"
    );
    let uj = r[0].energy_uj as f64;
    // From the first read to the one that found it back, lost reads and
    // all (within a minute, the counter's growth is kept).
    let (lo, hi) = ((before - t1).as_secs_f64(), (t2 - t0).as_secs_f64());
    assert!(
        uj >= 100.0 * lo * 1e6 - 1e3 && uj <= 100.0 * hi * 1e6 + 1e3,
        "{uj} µJ, not 100 W × [{lo}, {hi}] s"
    );
}

#[test]
fn a_failed_power_or_memory_read_is_absent_and_said_never_0() {
    let lib = stub(
        "gpu name=A uuid=GPU-0 power_mw=100000 energy=counter util=40 memory_total=1000 \
         memory_used=500 fail=power@2-3:unknown,memory@3-4:unknown\n",
    );
    // Power: a call a read; memory: one at open, then one a read.
    let mut gpus = open(&lib);
    let mut rows = Vec::new();
    let mut lines = Vec::new();
    for _ in 0..5 {
        let r = gpus.read_gpus();
        lines.extend(said(&gpus, 0));
        rows.push((r[0].power_w, r[0].memory_used_bytes));
    }
    assert_eq!(
        rows,
        vec![
            (Some(100.0), Some(500)),
            (None, None),
            (None, None),
            (Some(100.0), Some(500)),
            (Some(100.0), Some(500)),
        ]
    );
    let n = |s: &str| lines.iter().filter(|l| l.contains(s)).count();
    assert_eq!(n("power read failed"), 1, "{lines:?}");
    assert_eq!(n("memory read failed"), 1, "{lines:?}");
    assert_eq!(n("power reads again"), 1, "{lines:?}");
    assert_eq!(n("memory reads again"), 1, "{lines:?}");
}

#[test]
fn with_mig_on_nvml_gives_no_utilization_the_holders_share_equally_and_it_is_said() {
    let lib = stub(
        "gpu name=NVIDIA-A100 uuid=GPU-mig power_mw=90000 energy=counter mig=1 \
         procs=5001:60:1024,5002:30:2048\n",
    );
    let mut gpus = open(&lib);
    std::thread::sleep(Duration::from_millis(250));
    let r = gpus.read_gpus();
    assert_eq!(r[0].util_pct, None);
    assert_eq!(r[0].sm_basis, SmBasis::Equal);
    assert_eq!(shares(&r[0]), vec![(5001, 0.0), (5002, 0.0)]);
    assert!(
        said(&gpus, 0).iter().any(|l| l.contains("MIG is on")),
        "{:?}",
        gpus.problems()
    );
}

/// Two reads `ms` apart (GPM's utilization needs two samples), and the
/// lines either said for GPU 0.
fn two_reads(gpus: &mut NvmlGpus, ms: u64) -> (GpuReading, GpuReading, Vec<String>) {
    let first = gpus.read_gpus().remove(0);
    let mut lines = said(gpus, 0);
    std::thread::sleep(Duration::from_millis(ms));
    let second = gpus.read_gpus().remove(0);
    lines.extend(said(gpus, 0));
    (first, second, lines)
}

#[test]
fn mig_instances_share_by_gpm_busy_sms_and_equally_within_an_instance() {
    // Three instances (a fourth slot empty): 1 with one process at 60% of
    // its 28 SMs, 2 with two at 20% each (40% in all), 3 with none.
    let lib = stub(
        "gpu name=NVIDIA-H100 uuid=GPU-h power_mw=300000 energy=counter mig=1 gpm=1 \
         instances=1:2:28,-,2:2:28,3:3:42 \
         procs=5001:60:1024#1,5002:20:2048#2,5003:20:4096#2\n",
    );
    let mut gpus = open(&lib);
    let (first, r, lines) = two_reads(&mut gpus, 300);
    // The first read has no earlier GPM sample: compute slices, 2:2:0 of
    // 7 (instance 3 has no process), equally within an instance.
    assert_eq!(first.sm_basis, SmBasis::InstanceSlices);
    assert_eq!(
        shares(&first),
        vec![(5001, 28.571), (5002, 14.286), (5003, 14.286)]
    );
    // Then GPM: 60% of 28 SMs and 40% of 28, as shares of the GPU's 98.
    assert_eq!(r.sm_basis, SmBasis::InstanceActivity);
    type Instance = (u32, String, u32, u32, Option<f64>, Vec<u32>);
    let inst: Vec<Instance> = r
        .instances
        .iter()
        .map(|i| {
            (
                i.gpu_instance_id,
                i.uuid.clone(),
                i.slices,
                i.sms,
                i.sm_util_pct.map(|u| (u * 1000.0).round() / 1000.0),
                i.pids.clone(),
            )
        })
        .collect();
    assert_eq!(
        inst,
        vec![
            (
                1,
                "MIG-00000001-0001-0000-0000-000000000000".into(),
                2,
                28,
                Some(60.0),
                vec![5001]
            ),
            (
                2,
                "MIG-00000001-0002-0000-0000-000000000000".into(),
                2,
                28,
                Some(40.0),
                vec![5002, 5003]
            ),
            (
                3,
                "MIG-00000001-0003-0000-0000-000000000000".into(),
                3,
                42,
                Some(0.0),
                vec![]
            ),
        ]
    );
    assert_eq!(
        shares(&r),
        vec![(5001, 17.143), (5002, 5.714), (5003, 5.714)]
    );
    // The GPU's own figures are the parent's: its energy and memory.
    assert!(r.energy_uj > 0 && r.util_pct.is_none());
    assert!(!r.at_rest);
    assert!(
        lines.iter().any(|l| l.contains("busy SMs from GPM")),
        "{lines:?}"
    );
    assert_eq!(r.unheld_sm_pct, 0.0);
}

#[test]
fn gpm_weighs_a_gpu_instance_once_with_its_compute_instances_together() {
    // GPU instance 1 has two compute instances of 14 SMs (processes at 60%
    // and 20% of theirs: 40% of the GPU instance); GPU instance 2 one of
    // 28 SMs at 50%. The stub refuses GPM samples under 100 ms apart, as
    // NVML asks: sampling a GPU instance once per compute instance fails.
    let lib = stub(
        "gpu name=NVIDIA-H100 uuid=GPU-h power_mw=300000 energy=counter mig=1 gpm=1 \
         instances=1.0:1:14,1.1:1:14,2.0:2:28 \
         procs=5001:60:1024#1.0,5002:20:2048#1.1,5003:50:4096#2.0\n",
    );
    let mut gpus = open(&lib);
    let (_, r, lines) = two_reads(&mut gpus, 300);
    assert_eq!(r.sm_basis, SmBasis::InstanceActivity, "{lines:?}");
    let ids: Vec<(u32, u32, Option<f64>)> = r
        .instances
        .iter()
        .map(|i| (i.gpu_instance_id, i.compute_instance_id, i.sm_util_pct))
        .collect();
    assert_eq!(
        ids,
        vec![(1, 0, Some(40.0)), (1, 1, Some(40.0)), (2, 0, Some(50.0))]
    );
    // GPU instance 1: 40% of 28 SMs, between its two processes; GPU
    // instance 2: 50% of 28; as shares of the GPU's 56 SMs.
    assert_eq!(shares(&r), vec![(5001, 10.0), (5002, 10.0), (5003, 25.0)]);
    assert!(!lines.iter().any(|l| l.contains("GPM:")), "{lines:?}");
}

#[test]
fn a_busy_instance_with_no_listed_process_is_work_of_no_one() {
    // GPU instance 2's process does not exist to list (the shell's child
    // that never started): GPM sees its work, no list shows it.
    let lib = stub(
        "gpu name=NVIDIA-H100 uuid=GPU-h power_mw=300000 energy=counter mig=1 gpm=1 \
         instances=1:2:28,2:2:28 procs=5001:60:1024#1,child/7:50:1024#2\n",
    );
    let mut gpus = open(&lib);
    let (_, r, _) = two_reads(&mut gpus, 300);
    assert_eq!(r.sm_basis, SmBasis::InstanceActivity);
    assert_eq!(shares(&r), vec![(5001, 30.0)]);
    assert_eq!(r.unheld_sm_pct, 25.0);
}

#[test]
fn on_mig_the_holders_are_also_those_only_the_instances_list() {
    // The GPU's own handle lists nothing (a caller without the privilege
    // for the aggregate list); each instance lists its own.
    let lib = stub(
        "gpu name=NVIDIA-A100 uuid=GPU-a power_mw=200000 energy=counter mig=1 parent_procs=none \
         instances=1:2:28,2:2:28 procs=5001:60:1024#1,5002:20:2048#2\n",
    );
    let mut gpus = open(&lib);
    let (_, r, _) = two_reads(&mut gpus, 300);
    let procs: Vec<(u32, f64, u64)> = r
        .processes
        .iter()
        .map(|p| (p.pid, p.sm_util_pct, p.memory_bytes))
        .collect();
    assert_eq!(procs, vec![(5001, 50.0, 1024), (5002, 50.0, 2048)]);
}

#[test]
fn an_instance_s_failed_process_list_is_said_when_it_begins_and_ends() {
    // Process-list calls 1 and 2 fail: the GPU's and instance 1's of the
    // first read.
    let lib = stub(
        "gpu name=NVIDIA-A100 uuid=GPU-a power_mw=200000 energy=counter mig=1 \
         fail=procs@1-2:unknown instances=1:2:28,2:2:28 procs=5001:60:1024#1,5002:20:2048#2\n",
    );
    let mut gpus = open(&lib);
    let (first, second, lines) = two_reads(&mut gpus, 150);
    // Instance 1's list failed: its slices' share is no one's (unheld),
    // not instance 2's.
    assert_eq!(shares(&first), vec![(5002, 50.0)]);
    assert_eq!(first.unheld_sm_pct, 50.0);
    assert_eq!(shares(&second), vec![(5001, 50.0), (5002, 50.0)]);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("instance 1.0's process list failed")),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l == "mig processes reads again"),
        "{lines:?}"
    );
}

#[test]
fn reads_under_100_ms_apart_weigh_by_the_last_gpm_figure() {
    let lib = stub(
        "gpu name=NVIDIA-H100 uuid=GPU-h power_mw=300000 energy=counter mig=1 gpm=1 \
         instances=1:2:28,2:2:28 procs=5001:60:1024#1,5002:20:2048#2\n",
    );
    let mut gpus = open(&lib);
    let (_, second, _) = two_reads(&mut gpus, 150);
    // 40 ms later: too soon for GPM; the last figure, not compute slices.
    std::thread::sleep(Duration::from_millis(40));
    let third = gpus.read_gpus().remove(0);
    assert_eq!(second.sm_basis, SmBasis::InstanceActivity);
    assert_eq!(third.sm_basis, SmBasis::InstanceActivity);
    assert_eq!(shares(&third), shares(&second));
    assert!(said(&gpus, 0).is_empty(), "{:?}", said(&gpus, 0));
}

#[test]
fn mig_without_gpm_shares_by_compute_slices_and_says_so() {
    let lib = stub(
        "gpu name=NVIDIA-A100 uuid=GPU-a power_mw=200000 energy=counter mig=1 \
         instances=1:2:28,2:2:28,3:3:42 procs=5001:60:1024#1,5002:20:2048#2,5003:20:4096#2\n",
    );
    let mut gpus = open(&lib);
    let (_, r, lines) = two_reads(&mut gpus, 300);
    assert_eq!(r.sm_basis, SmBasis::InstanceSlices);
    assert!(r.instances.iter().all(|i| i.sm_util_pct.is_none()));
    assert_eq!(
        shares(&r),
        vec![(5001, 28.571), (5002, 14.286), (5003, 14.286)]
    );
    assert!(lines.iter().any(|l| l.contains("has no GPM")), "{lines:?}");
}

#[test]
fn a_gpm_figure_that_cannot_be_falls_back_to_slices_and_is_said() {
    let lib = stub(
        "gpu name=NVIDIA-H100 uuid=GPU-h power_mw=300000 energy=counter mig=1 gpm=over \
         instances=1:2:28,2:2:28 procs=5001:60:1024#1,5002:20:2048#2\n",
    );
    let mut gpus = open(&lib);
    let (_, r, lines) = two_reads(&mut gpus, 300);
    assert_eq!(r.sm_basis, SmBasis::InstanceSlices);
    assert_eq!(shares(&r), vec![(5001, 50.0), (5002, 50.0)]);
    assert!(
        lines
            .iter()
            .any(|l| l.contains("SM utilization read 250%") && l.contains("compute slices")),
        "{lines:?}"
    );
}

#[test]
fn a_failed_gpm_sample_falls_back_to_slices_for_that_read_and_is_said_when_it_ends() {
    // GPM's sample calls 3 and 4 (the second read's, one per instance)
    // fail; the third read has no earlier sample for them, the fourth
    // weighs by activity again.
    let lib = stub(
        "gpu name=NVIDIA-H100 uuid=GPU-h power_mw=300000 energy=counter mig=1 gpm=1 \
         fail=gpm@3-4:unknown instances=1:2:28,2:2:28 procs=5001:60:1024#1,5002:20:2048#2\n",
    );
    let mut gpus = open(&lib);
    let mut bases = Vec::new();
    let mut lines = Vec::new();
    for _ in 0..4 {
        bases.push(gpus.read_gpus()[0].sm_basis);
        lines.extend(said(&gpus, 0));
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(
        bases,
        vec![
            SmBasis::InstanceSlices,
            SmBasis::InstanceSlices,
            SmBasis::InstanceSlices,
            SmBasis::InstanceActivity
        ]
    );
    assert!(
        lines
            .iter()
            .any(|l| l.contains("GPM: instance 1's sample failed")),
        "{lines:?}"
    );
    assert!(lines.iter().any(|l| l == "gpm reads again"), "{lines:?}");
}

#[test]
fn a_failed_process_list_keeps_the_sampled_processes_and_is_said() {
    let lib = stub(
        "gpu name=A uuid=GPU-0 power_mw=100000 energy=counter sample_ms=100 \
         fail=procs@1-1000:unknown procs=5001:60:1024,5002:30:2048\n",
    );
    let mut gpus = open(&lib);
    std::thread::sleep(Duration::from_millis(250));
    let r = gpus.read_gpus();
    assert_eq!(shares(&r[0]), vec![(5001, 60.0), (5002, 30.0)]);
    assert!(
        said(&gpus, 0)
            .iter()
            .any(|l| l.contains("process list failed")),
        "{:?}",
        gpus.problems()
    );
}

#[test]
fn drivers_with_the_v3_quirk_are_read_through_v2() {
    let procs = "procs=5001:10:1024,5002:20:2048,5003:30:4096";
    // The stub is faithful: read through _v3, as nvml-wrapper does, the
    // quirky driver's process list comes out garbled.
    let lib = stub(&format!(
        "driver_version=535.54.03\ngpu name=A uuid=GPU-0 power_mw=1000 energy=counter {procs}\n"
    ));
    let nvml = nvml_wrapper::Nvml::builder()
        .lib_path(lib.as_os_str())
        .init()
        .expect("stub");
    let raw: Vec<u32> = nvml
        .device_by_index(0)
        .and_then(|d| d.running_compute_processes())
        .expect("v3")
        .iter()
        .map(|p| p.pid)
        .collect();
    assert_ne!(raw, vec![5001, 5002, 5003], "the stub models the quirk");
    drop(nvml);
    let mut gpus = open(&lib);
    assert_eq!(gpus.driver_version(), Some("535.54.03"));
    assert!(
        said(&gpus, 0).iter().any(|l| l.contains("_v2")),
        "{:?}",
        gpus.problems()
    );
    let r = gpus.read_gpus();
    let pids: Vec<u32> = r[0].processes.iter().map(|p| p.pid).collect();
    assert_eq!(pids, vec![5001, 5002, 5003]);
    let mem: Vec<u64> = r[0].processes.iter().map(|p| p.memory_bytes).collect();
    assert_eq!(mem, vec![1024, 2048, 4096]);
    // Another driver: _v3, as NVML's header says.
    let lib = stub(&format!(
        "driver_version=550.54.15\ngpu name=A uuid=GPU-0 power_mw=1000 energy=counter {procs}\n"
    ));
    let mut gpus = open(&lib);
    assert!(said(&gpus, 0).is_empty(), "{:?}", gpus.problems());
    let pids: Vec<u32> = gpus.read_gpus()[0]
        .processes
        .iter()
        .map(|p| p.pid)
        .collect();
    assert_eq!(pids, vec![5001, 5002, 5003]);
}

/// A's share of A and B on a reading (0 when neither has one).
fn share_of_first(r: &GpuReading) -> f64 {
    let s = shares(r);
    let a = s.iter().find(|p| p.0 == 5001).map_or(0.0, |p| p.1);
    let b = s.iter().find(|p| p.0 == 5002).map_or(0.0, |p| p.1);
    if a + b > 0.0 { a / (a + b) } else { 0.0 }
}

#[test]
fn processes_taking_turns_are_weighed_by_every_sample_of_the_interval_not_the_last() {
    // As measured on an H200 (driver 580): the driver samples every 200
    // ms, a sample is the process's mean SM over its period, and a call
    // returns each process's newest sample only. A works 200 ms of every
    // 300, B the other 100 ms: A's true share of any second is 2/3 ± 0.1
    // (a second is 3.33 of their cycles).
    let scenario = "gpu name=A uuid=GPU-0 power_mw=100000 energy=counter sample_ms=200 \
                    procs=5001:90:1024~0-200/300,5002:90:2048~200-300/300\n";
    let mut by_read = Vec::new();
    let mut with_sampler = Vec::new();
    for sampler in [false, true] {
        let lib = stub(scenario);
        let mut gpus = open(&lib);
        if sampler {
            gpus.sample_between_reads(Duration::from_millis(100))
                .expect("the sampling thread");
        }
        std::thread::sleep(Duration::from_millis(450));
        gpus.read_gpus();
        let mut a = Vec::new();
        for _ in 0..6 {
            std::thread::sleep(Duration::from_millis(1000));
            let r = gpus.read_gpus();
            assert_eq!(r[0].sm_basis, SmBasis::Sampled, "{r:?}");
            a.push(share_of_first(&r[0]));
        }
        if sampler {
            with_sampler = a;
        } else {
            by_read = a;
        }
    }
    eprintln!(
        "A's share per 1 s interval: read once {by_read:.3?}, sampled between reads {with_sampler:.3?}"
    );
    // One sample a read: A's share 1/2 or 2/3 (B's newest can be older).
    assert!(
        by_read.iter().any(|s| (s - 2.0 / 3.0).abs() > 0.15),
        "the stub gives the newest sample only: {by_read:?}"
    );
    for s in &with_sampler {
        assert!((s - 2.0 / 3.0).abs() <= 0.1, "{with_sampler:?}");
    }
    let mean = with_sampler.iter().sum::<f64>() / with_sampler.len() as f64;
    assert!((mean / (2.0 / 3.0) - 1.0).abs() < 0.05, "{with_sampler:?}");
}

#[test]
fn a_process_that_ended_since_the_last_read_keeps_its_samples_of_the_interval() {
    // A works until 1.8 s after NVML's init and then leaves the process
    // list; B works throughout; reads every 300 ms. The first read after A
    // left still gives A its samples from before it left (it used the GPU
    // in that interval) instead of handing B all of the interval, and the
    // read after that is B's alone. Read late on a loaded machine, the
    // same holds of whichever read comes first after 1.8 s.
    let lib = stub(
        "gpu name=A uuid=GPU-0 power_mw=100000 energy=counter sample_ms=100 \
         procs=5001:60:1024@0-1800,5002:30:2048\n",
    );
    let mut gpus = open(&lib);
    gpus.sample_between_reads(Duration::from_millis(50))
        .expect("the sampling thread");
    let mut readings = Vec::new();
    let start = Instant::now();
    while start.elapsed() < Duration::from_millis(3000) {
        std::thread::sleep(Duration::from_millis(300));
        readings.push(gpus.read_gpus().remove(0));
    }
    let listed = |r: &GpuReading| {
        r.processes
            .iter()
            .any(|p| p.pid == 5001 && p.memory_bytes > 0)
    };
    let first_after = readings
        .iter()
        .position(|r| !listed(r))
        .expect("A left the list");
    assert!(first_after > 0, "A was listed at some read: {readings:?}");
    let r = &readings[first_after];
    let s = shares(r);
    assert_eq!(
        s.len(),
        2,
        "the ended process is kept for this interval: {r:?}"
    );
    assert!(s[0].0 == 5001 && s[0].1 > 0.0 && s[0].1 <= 60.0, "{s:?}");
    assert_eq!(r.processes[0].memory_bytes, 0, "no longer holds memory");
    let next = readings.get(first_after + 1).expect("a read after");
    assert_eq!(shares(next), vec![(5002, 30.0)], "{next:?}");
}

#[test]
fn a_sample_published_after_another_process_s_newer_one_is_still_counted() {
    // lastSeenTimeStamp is one for all processes. B's samples are
    // published 150 ms after their timestamp, A's at once: by the time
    // B's sample of a tick is there, A's sample of the same tick has moved
    // the last seen to it, and asking from the last seen never returns B.
    // Each call asks a second back and drops the samples it had already.
    let lib = stub(
        "gpu name=A uuid=GPU-0 power_mw=100000 energy=counter sample_ms=200 \
         procs=5001:60:1024,5002:30:2048+150\n",
    );
    let mut gpus = open(&lib);
    gpus.sample_between_reads(Duration::from_millis(100))
        .expect("the sampling thread");
    std::thread::sleep(Duration::from_millis(700));
    gpus.read_gpus();
    for round in 0..3 {
        std::thread::sleep(Duration::from_millis(1000));
        let r = gpus.read_gpus();
        let s = shares(&r[0]);
        // A's samples of a second and B's (its newest of the second is
        // not out yet, its last one of the second before is): each counted
        // once, so A's share is twice B's, or 2.5 or 5/3 times when a late
        // read gives one of them a sample more. The periods spanned (one
        // more than A's) make A's 50 or so.
        assert_eq!(s.len(), 2, "round {round}: {r:?}");
        let ratio = s[0].1 / s[1].1;
        assert!((1.6..=2.55).contains(&ratio), "round {round}: {s:?}");
        assert!(s[0].1 >= 40.0 && s[0].1 <= 60.0, "round {round}: {s:?}");
        // Asked a second back, the calls return what they gave before:
        // dropped as repeats there, never seen here as duplicates.
        assert!(
            said(&gpus, 0).iter().all(|l| !l.contains("duplicated")),
            "{:?}",
            gpus.problems()
        );
    }
}

#[test]
fn a_sample_returned_again_by_the_look_back_is_no_new_sample() {
    // The driver samples once a second; reads 200 ms apart. A call asks a
    // second back, so the same sample comes back for several calls: only
    // the first read after it is "sampled", the others carry it.
    let lib = stub(
        "gpu name=A uuid=GPU-0 power_mw=100000 energy=counter sample_ms=1000 \
         procs=5001:60:1024,5002:30:2048\n",
    );
    let mut gpus = open(&lib);
    gpus.sample_between_reads(Duration::from_millis(50))
        .expect("the sampling thread");
    std::thread::sleep(Duration::from_millis(1100));
    let mut bases = Vec::new();
    for _ in 0..8 {
        let r = gpus.read_gpus();
        assert_eq!(shares(&r[0]), vec![(5001, 60.0), (5002, 30.0)], "{r:?}");
        bases.push(r[0].sm_basis);
        std::thread::sleep(Duration::from_millis(200));
    }
    let sampled = bases.iter().filter(|b| **b == SmBasis::Sampled).count();
    // 1.7 s of reads see two or three of the driver's samples (a loaded
    // machine reads later, so up to four), not eight.
    assert!((1..=4).contains(&sampled), "{bases:?}");
}

#[test]
fn a_job_that_opens_and_closes_its_context_between_two_reads_keeps_its_samples() {
    // A 0.3 s burst from 1.2 s to 1.5 s on the stub's clock, its samples
    // published 600 ms late (after it left the process list), and reads at
    // 1 s and 2.4 s: neither read lists it, the sampling thread did.
    for lag in ["", "+600"] {
        let lib = stub(&format!(
            "gpu name=A uuid=GPU-0 energy=counter load=60000:20000:2000 sample_ms=100 \
             procs=5001:60:1024{lag}@1200-1500\n"
        ));
        let mut gpus = open(&lib);
        gpus.sample_between_reads(Duration::from_millis(100))
            .expect("sampler");
        let start = Instant::now();
        std::thread::sleep(Duration::from_millis(1000));
        let first = gpus.read_gpus().remove(0);
        assert!(first.processes.is_empty(), "{lag}: {first:?}");
        std::thread::sleep(Duration::from_millis(2400).saturating_sub(start.elapsed()));
        let r = gpus.read_gpus().remove(0);
        let burst = r.processes.iter().find(|p| p.pid == 5001);
        assert!(
            burst.is_some_and(|p| p.sm_util_pct > 0.0),
            "{lag}: the burst has no share of the interval it ran in: {:?}",
            r.processes
        );
    }
}
