//! `scripts/gpu-check.py`, the check a GPU machine runs, end to end against
//! the NVML stub with stand-in loads: the same script, a fake GPU whose
//! behaviour each step's scenario sets. Needs root (wattprof loads eBPF).

use wattprof_tests::{require_ebpf, tempfile_dir, wattprof_bin};

#[test]
fn the_gpu_check_passes_against_the_stub() {
    require_ebpf!();
    let stub = wattprof_bin().with_file_name("libnvml_stub.so");
    assert!(
        stub.exists(),
        "{} is missing: cargo build -p nvml-stub",
        stub.display()
    );
    let out = tempfile_dir();
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../scripts/gpu-check.py");
    let run = std::process::Command::new("python3")
        .arg(script)
        .arg("--wattprof")
        .arg(wattprof_bin())
        .arg("--stub")
        .arg(&stub)
        .arg("--quick")
        .arg("--out")
        .arg(&out)
        .output()
        .expect("python3");
    let stdout = String::from_utf8_lossy(&run.stdout);
    eprintln!("{stdout}{}", String::from_utf8_lossy(&run.stderr));
    let summary: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("gpu-check.json")).expect("gpu-check.json written"),
    )
    .expect("JSON");
    let results = summary["results"].as_array().expect("results");
    // Every step ran and held to its bound.
    for step in [
        "nvml",
        "counter vs instant power",
        "two processes 2:1",
        "idle and held power",
        "overhead",
    ] {
        assert!(
            results.iter().any(|r| r["step"] == step),
            "{step} missing: {stdout}"
        );
    }
    let failed: Vec<&serde_json::Value> = results.iter().filter(|r| r["pass"] == false).collect();
    assert!(failed.is_empty(), "{failed:?}");
    assert!(run.status.success(), "{stdout}");
    // Every bounded figure counted: 9 against the stub (the rest are
    // recorded with no bound).
    assert_eq!(summary["passed"], 9, "{stdout}");
    // The stub's figures come back: the learned idle and held power of its
    // 31.7 W + 22.3 W GPU, and the 2:1 turns.
    let value = |figure: &str| {
        results
            .iter()
            .find(|r| r["figure"].as_str().is_some_and(|f| f.starts_with(figure)))
            .and_then(|r| r["value"].as_f64())
            .unwrap_or_else(|| panic!("{figure}: {stdout}"))
    };
    // Its counter steps every 100 ms, as an H200's does: a stretch of T
    // seconds at rest is exact to one step, 0.1/T of its power. T is what
    // the learner kept of the run's idle and held stretches: each less its
    // first interval, a second settling and a second of tail (see
    // sources/nvml/statics.rs). Fresh-clone run 40 had 5 s of idle
    // (32.33 W: one step high), where the bound assumed 6 s.
    let hold: serde_json::Value = serde_json::from_slice(
        &std::fs::read(out.join("hold.json")).expect("hold.json kept"),
    )
    .expect("JSON");
    let (idle_s, held_s) = learned_stretches(&hold);
    let step = |watts: f64, secs: f64| watts * 0.1 / secs;
    let idle_bound = step(31.7, idle_s) + 0.02;
    let held_bound = idle_bound + step(31.7 + 22.3, held_s) + 0.02;
    eprintln!(
        "stretches kept: idle {idle_s:.2} s (±{idle_bound:.2} W), held {held_s:.2} s (±{held_bound:.2} W)"
    );
    assert!(idle_s >= 2.0 && held_s >= 2.0, "too short to teach: {stdout}");
    assert!((value("learned idle power") - 31.7).abs() < idle_bound, "{stdout}");
    assert!((value("learned held power") - 22.3).abs() < held_bound, "{stdout}");
    let _ = std::fs::remove_dir_all(&out);
}

/// The seconds of the recording's first idle stretch (no process holds
/// GPU 0) and of the held stretch after it that the learner keeps: each
/// less its first interval, [`SETTLE_S`] and [`TAIL_S`].
fn learned_stretches(rec: &serde_json::Value) -> (f64, f64) {
    const SETTLE_S: f64 = 1.0;
    const TAIL_S: f64 = 1.0;
    let rows: Vec<(bool, f64)> = rec["intervals"]
        .as_array()
        .expect("intervals")
        .iter()
        .filter_map(|i| {
            let g = i["gpus"].get(0)?;
            let held = g["processes"].as_array().is_some_and(|p| !p.is_empty());
            Some((held, i["duration_ns"].as_f64()? / 1e9))
        })
        .collect();
    let kept = |state: bool, from: usize| -> (f64, usize) {
        let run: Vec<f64> = rows[from..]
            .iter()
            .take_while(|(h, _)| *h == state)
            .map(|(_, s)| *s)
            .collect();
        let total: f64 = run.iter().skip(1).sum();
        ((total - SETTLE_S - TAIL_S).max(0.0), from + run.len())
    };
    let (idle, end) = kept(false, 0);
    let (held, _) = kept(true, end);
    (idle, held)
}
