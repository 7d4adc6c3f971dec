//! Unit tests of the NVML reader's pure parts.
use super::container_hint;

#[test]
fn in_a_container_the_missing_toolkit_option_is_named() {
    let root = std::env::temp_dir().join(format!("wattprof-nvml-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&root);
    std::fs::create_dir_all(root.join("dev")).expect("dir");
    assert_eq!(container_hint(&root), None, "not a container");
    std::fs::write(root.join(".dockerenv"), "").expect("write");
    let hint = container_hint(&root).expect("a container");
    assert!(
        hint.contains("--gpus all") && hint.contains("runtimeClassName"),
        "{hint}"
    );
    std::fs::write(root.join("dev/nvidiactl"), "").expect("write");
    let hint = container_hint(&root).expect("a container");
    assert!(
        hint.contains("NVIDIA_DRIVER_CAPABILITIES=utility"),
        "{hint}"
    );
    let _ = std::fs::remove_dir_all(&root);
}
