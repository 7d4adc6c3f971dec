//! The NVML reader against a stub NVIDIA library (tests/nvml-stub) loaded
//! through nvml-wrapper's library path, driven by a scenario. No GPU or
//! root needed.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use wattprof::sources::nvml::{GpuEnergyMethod, NvmlGpus};
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
        (250.0, 60, 4_294_967_296)
    );
    let procs: Vec<(u32, u32, u64)> = g
        .processes
        .iter()
        .map(|p| (p.pid, p.sm_util_pct, p.memory_bytes))
        .collect();
    assert_eq!(
        procs,
        vec![(4242, 70, 1_073_741_824), (4243, 20, 536_870_912)]
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
