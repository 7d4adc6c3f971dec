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
    // seconds at rest is exact to 0.1/T of its power, about 6 s idle
    // (±0.5 W) and 9 s held (±0.6 W of the 54 W, less the idle figure).
    assert!((value("learned idle power") - 31.7).abs() < 0.6, "{stdout}");
    assert!((value("learned held power") - 22.3).abs() < 1.2, "{stdout}");
    let _ = std::fs::remove_dir_all(&out);
}
