//! The Python client (`clients/python`) under `wattprof run`: the energy a
//! window's `end` returns is the recording's own figure for that window,
//! the decorator and Zeus-style calls work, a refused `end` raises, and
//! outside wattprof every call is a no-op. Needs root and `python3`; run
//! with `--test-threads=1`.

use std::path::PathBuf;

use serde_json::Value;
use wattprof_tests::{FakeRapl, require_ebpf, wattprof_run};

fn script() -> String {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../clients/python/tests/windows_under_wattprof.py")
        .to_string_lossy()
        .into_owned()
}

#[test]
fn a_window_returns_exactly_what_the_recording_holds() {
    require_ebpf!();
    let rapl = FakeRapl::start(40.0, 4.0);
    let run = wattprof_run(&[&rapl.arg(), "--interval", "5s"], &["python3", &script()]);
    assert!(run.output.status.success(), "{}", run.stderr());
    let report = run.report();
    let told = &run.stdout_json()[0];
    assert_eq!(told["active"], true);
    let windows = report["windows"].as_array().expect("windows");
    let recorded = |name: &str| -> &Value {
        windows
            .iter()
            .find(|w| w["name"] == name)
            .unwrap_or_else(|| panic!("no window {name} in {windows:?}"))
    };
    for (key, name) in [("with", "train"), ("decorator", "step"), ("zeus", "epoch")] {
        let answer = &told[key];
        assert_eq!(answer["name"], name);
        // The whole object, to the last digit: the answer is the record.
        assert_eq!(&answer["raw"], recorded(name), "{key}");
        let energy = answer["energy_j"].as_f64().expect("energy_j");
        assert_eq!(Some(energy), recorded(name)["energy"]["total_j"].as_f64());
        assert!(energy > 0.0, "{key}: {answer}");
        let duration = answer["duration_s"].as_f64().expect("duration_s");
        eprintln!("python window {name}: {energy:.6} J over {duration:.3} s");
    }
    assert_eq!(told["with_energy_j"], told["with"]["energy_j"]);
    // 0.3 s of CPU inside `train`: the window lasts at least that.
    assert!(told["with"]["duration_s"].as_f64().expect("s") >= 0.29);
    let refused = told["refused"].as_str().expect("a refused end raises");
    assert!(refused.contains("no open window"), "{refused}");
    // The refusal is in the report too, as every bad message is.
    assert!(
        report["window_errors"]
            .as_array()
            .expect("window_errors")
            .iter()
            .any(|e| e.as_str().is_some_and(|e| e.contains("never-begun"))),
        "{report}"
    );
}

#[test]
fn outside_wattprof_every_call_is_a_no_op() {
    let out = std::process::Command::new("python3")
        .arg(script())
        .env_remove("WATTPROF_SOCKET")
        .output()
        .expect("python3 (Debian's python3 package)");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let told: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    assert_eq!(told["active"], false);
    for key in ["with", "with_energy_j", "decorator", "zeus", "refused"] {
        assert_eq!(told[key], Value::Null, "{key}: {told}");
    }
}
