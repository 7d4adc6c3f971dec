//! Containers from cgroup paths: what Docker, containerd/CRI, CRI-O,
//! Podman, Kubernetes and systemd name their cgroups, on the systemd and
//! the cgroupfs cgroup drivers, for cgroup v1 and v2 paths alike.

/// Who made the cgroup.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Runtime {
    /// Docker (`docker-<id>.scope`, `/docker/<id>`).
    Docker,
    /// containerd through CRI (`cri-containerd-<id>.scope`).
    Containerd,
    /// CRI-O (`crio-<id>.scope`).
    Crio,
    /// Podman (`libpod-<id>.scope`, `/libpod_parent/libpod-<id>`).
    Podman,
    /// A Kubernetes container whose runtime the path does not say
    /// (cgroupfs driver: `/kubepods/burstable/pod<uid>/<id>`).
    Kubernetes,
    /// A systemd unit (`nginx.service`, `session-2.scope`).
    Systemd,
}

impl Runtime {
    /// Name as reports and labels spell it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Docker => "docker",
            Self::Containerd => "containerd",
            Self::Crio => "crio",
            Self::Podman => "podman",
            Self::Kubernetes => "kubernetes",
            Self::Systemd => "systemd",
        }
    }
}

/// A container (or systemd unit) a cgroup belongs to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct Container {
    /// Who made it.
    pub(crate) runtime: Runtime,
    /// Container id (64 hex digits for Docker and CRI runtimes), or the
    /// unit name for systemd.
    pub(crate) id: String,
    /// Kubernetes pod UID, when the container is in a pod.
    pub(crate) pod_uid: Option<String>,
    /// Kubernetes QoS class: `guaranteed`, `burstable` or `besteffort`.
    pub(crate) qos: Option<String>,
}

fn is_id(s: &str) -> bool {
    s.len() >= 12 && s.bytes().all(|b| b.is_ascii_hexdigit())
}

/// `prefix<id>.scope` or `prefix<id>` → id.
fn strip<'a>(component: &'a str, prefix: &str) -> Option<&'a str> {
    let rest = component.strip_prefix(prefix)?;
    let id = rest.strip_suffix(".scope").unwrap_or(rest);
    is_id(id).then_some(id)
}

/// The container a cgroup path (as in `/proc/PID/cgroup` or under the
/// cgroup2 mount) belongs to, the innermost one when they nest; `None`
/// for cgroups no runtime or unit made (`/`, `/user.slice`).
pub(crate) fn from_cgroup_path(path: &str) -> Option<Container> {
    let parts: Vec<&str> = path.split('/').filter(|p| !p.is_empty()).collect();
    let mut pod_uid = None;
    let mut qos = None;
    let mut in_kube = false;
    let mut found: Option<(Runtime, String)> = None;
    for (i, part) in parts.iter().enumerate() {
        // `kubepods.slice`, `kubepods`, and under a kubelet --cgroup-root
        // (kind) `kubelet-kubepods-burstable.slice`.
        if part.contains("kubepods") {
            in_kube = true;
            // systemd driver: kubepods-burstable.slice; cgroupfs: kubepods/burstable.
            for class in ["burstable", "besteffort"] {
                if part.contains(class) {
                    qos = Some(class.to_string());
                }
            }
        }
        if in_kube && (*part == "burstable" || *part == "besteffort") {
            qos = Some(part.to_string());
        }
        // Pod: `kubepods-burstable-pod<uid with _>.slice` or `pod<uid>`.
        if in_kube && let Some(pos) = part.rfind("pod") {
            let uid = part[pos + 3..].trim_end_matches(".slice");
            if uid.len() >= 32
                && uid
                    .bytes()
                    .all(|b| b.is_ascii_hexdigit() || b == b'-' || b == b'_')
            {
                pod_uid = Some(uid.replace('_', "-"));
                continue;
            }
        }
        // The conmon monitor of CRI-O and Podman is not the container,
        // nor a unit of its own.
        if part.contains("conmon") {
            return None;
        }
        let hit = if let Some(id) = strip(part, "docker-") {
            Some((Runtime::Docker, id))
        } else if let Some(id) = strip(part, "cri-containerd-") {
            Some((Runtime::Containerd, id))
        } else if let Some(id) = strip(part, "crio-") {
            Some((Runtime::Crio, id))
        } else if let Some(id) = strip(part, "nerdctl-") {
            Some((Runtime::Containerd, id))
        } else if let Some(id) = strip(part, "libpod-payload-") {
            // Quadlet / `podman generate systemd --new` (--cgroups=split).
            Some((Runtime::Podman, id))
        } else if let Some(id) = strip(part, "libpod-") {
            Some((Runtime::Podman, id))
        } else if i > 0 && parts[i - 1] == "docker" && is_id(part) {
            Some((Runtime::Docker, *part))
        } else if in_kube && pod_uid.is_some() && is_id(part) {
            Some((Runtime::Kubernetes, *part))
        } else {
            None
        };
        if let Some((r, id)) = hit {
            found = Some((r, id.to_string()));
        }
    }
    if let Some((runtime, id)) = found {
        // Guaranteed pods sit directly under kubepods: no class in the path.
        let qos = pod_uid
            .as_ref()
            .map(|_| qos.unwrap_or_else(|| "guaranteed".into()));
        return Some(Container {
            runtime,
            id,
            pod_uid,
            qos,
        });
    }
    if in_kube {
        // A pod's own cgroup, or kubepods itself: no container.
        return None;
    }
    // Otherwise the innermost systemd unit, named by its whole path (the
    // host's nginx.service and a user's or a guest's are different units).
    let unit = parts
        .iter()
        .rposition(|p| p.ends_with(".service") || p.ends_with(".scope"))?;
    Some(Container {
        runtime: Runtime::Systemd,
        id: format!("/{}", parts[..=unit].join("/")),
        pod_uid: None,
        qos: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "4f1c2a3b5d6e7f80912a3b4c5d6e7f80912a3b4c5d6e7f80912a3b4c5d6e7f80";

    fn c(path: &str) -> Option<(Runtime, String, Option<String>, Option<String>)> {
        from_cgroup_path(path).map(|c| (c.runtime, c.id, c.pod_uid, c.qos))
    }

    #[test]
    fn runtimes_on_both_cgroup_drivers() {
        let d = |r: Runtime| Some((r, ID.to_string(), None, None));
        assert_eq!(
            c(&format!("/system.slice/docker-{ID}.scope")),
            d(Runtime::Docker)
        );
        assert_eq!(c(&format!("/docker/{ID}")), d(Runtime::Docker));
        assert_eq!(
            c(&format!("/system.slice/cri-containerd-{ID}.scope")),
            d(Runtime::Containerd)
        );
        assert_eq!(
            c(&format!("/machine.slice/crio-{ID}.scope")),
            d(Runtime::Crio)
        );
        assert_eq!(
            c(&format!("/machine.slice/libpod-{ID}.scope")),
            d(Runtime::Podman)
        );
        assert_eq!(
            c(&format!(
                "/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope/container"
            )),
            d(Runtime::Podman)
        );
        assert_eq!(c(&format!("/machine.slice/libpod-conmon-{ID}.scope")), None);
        assert_eq!(
            c(&format!("/system.slice/web.service/libpod-payload-{ID}")),
            d(Runtime::Podman)
        );
        assert_eq!(
            c(&format!("/system.slice/nerdctl-{ID}.scope")),
            d(Runtime::Containerd)
        );
        assert_eq!(
            c("/system.slice/nginx.service"),
            Some((
                Runtime::Systemd,
                "/system.slice/nginx.service".into(),
                None,
                None
            ))
        );
        assert_ne!(
            c("/user.slice/user-1000.slice/user@1000.service/init.scope").map(|x| x.1),
            c("/init.scope").map(|x| x.1)
        );
        assert_eq!(c("/"), None);
        assert_eq!(c("/user.slice"), None);
    }

    #[test]
    fn kubernetes_pods_with_their_qos_class() {
        let uid = "0a1b2c3d-4e5f-6789-abcd-ef0123456789";
        let sd = uid.replace('-', "_");
        assert_eq!(
            c(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{sd}.slice/cri-containerd-{ID}.scope"
            )),
            Some((
                Runtime::Containerd,
                ID.into(),
                Some(uid.into()),
                Some("burstable".into())
            ))
        );
        assert_eq!(
            c(&format!(
                "/kubepods.slice/kubepods-pod{sd}.slice/crio-{ID}.scope"
            )),
            Some((
                Runtime::Crio,
                ID.into(),
                Some(uid.into()),
                Some("guaranteed".into())
            ))
        );
        // kind: kubelet under a --cgroup-root inside the node's container.
        assert_eq!(
            c(&format!(
                "/system.slice/docker-{}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-burstable.slice/kubelet-kubepods-burstable-pod{sd}.slice/cri-containerd-{ID}.scope",
                "e".repeat(64)
            ))
            .map(|x| (x.2, x.3)),
            Some((Some(uid.into()), Some("burstable".into())))
        );
        assert_eq!(
            c(&format!(
                "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{sd}.slice/crio-conmon-{ID}.scope"
            )),
            None
        );
        assert_eq!(
            c(&format!("/kubepods/besteffort/pod{uid}/{ID}")),
            Some((
                Runtime::Kubernetes,
                ID.into(),
                Some(uid.into()),
                Some("besteffort".into())
            ))
        );
    }
}
