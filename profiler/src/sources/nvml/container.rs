//! What NVML needs in a container: the fix given when it cannot load there.

/// In a container (seen from the root `root`), what the NVIDIA container
/// toolkit was not asked for: `None` outside one.
pub(crate) fn container_hint(root: &std::path::Path) -> Option<String> {
    let cgroup = std::fs::read_to_string(root.join("proc/1/cgroup")).unwrap_or_default();
    let inside = root.join(".dockerenv").exists()
        || root.join("run/.containerenv").exists()
        || ["docker", "kubepods", "libpod", "containerd"]
            .iter()
            .any(|w| cgroup.contains(w));
    if !inside {
        return None;
    }
    Some(if root.join("dev/nvidiactl").exists() {
        // The devices were given, not the driver's libraries.
        "the GPU devices are here but not libnvidia-ml.so.1: set NVIDIA_DRIVER_CAPABILITIES=utility \
         (or all) so the NVIDIA container toolkit mounts it"
            .into()
    } else {
        "run it with the NVIDIA container toolkit: `docker run --gpus all -e \
         NVIDIA_DRIVER_CAPABILITIES=utility` (Kubernetes: runtimeClassName: nvidia and \
         NVIDIA_VISIBLE_DEVICES=all), or --no-gpu on a node without GPUs"
            .into()
    })
}
