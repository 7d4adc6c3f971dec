//! containerd's containers, from the state its runc shim keeps for each
//! running task: `<state>/io.containerd.runtime.v2.task/<namespace>/<id>/
//! config.json`, the container's OCI spec. It says which cgroup is the
//! container's (`linux.cgroupsPath`) and, through annotations, what it is
//! called: Kubernetes' CRI plugin writes the pod, its namespace and the
//! container's name, nerdctl writes `nerdctl/name`; a `ctr` container is
//! known by its id.
//!
//! This covers `ctr`, nerdctl and Kubernetes nodes on containerd without
//! its gRPC API. The directories are root's (0700): CAP_DAC_READ_SEARCH
//! reads them, as it reads the energy counters. Nothing here talks to
//! the daemon, so nothing here can hang.
//!
//! The state is scanned again only when a task directory changed (a
//! container started or stopped): a cgroup that is no container costs one
//! `stat` per namespace.

use crate::process::container::{Container, Runtime};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// The runc shim's directory under containerd's state directory.
const TASKS: &str = "io.containerd.runtime.v2.task";

/// Largest spec read (a real one is a few KiB).
const MAX_SPEC: u64 = 1 << 20;

/// Containers remembered at most (those gone since are dropped first).
const MAX_TASKS: usize = 10_000;

/// How often a missing state directory is looked for again.
const RECHECK: Duration = Duration::from_secs(5);

/// A task seen in the state directory.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Task {
    namespace: String,
    id: String,
    /// `linux.cgroupsPath` as the spec gives it: `/ns/id` (cgroupfs) or
    /// `slice:prefix:name` (systemd).
    cgroups_path: String,
    name: String,
    pod_uid: Option<String>,
    /// Still in the state directory at the last scan.
    running: bool,
}

impl Task {
    /// The container as reports key it: CRI containers by their id (as
    /// the `cri-containerd-<id>.scope` cgroup names them), others by
    /// namespace and id (two namespaces may each have a `web`).
    fn container(&self) -> Container {
        let id = if self.is_cri() {
            self.id.clone()
        } else {
            format!("{}/{}", self.namespace, self.id)
        };
        Container {
            runtime: Runtime::Containerd,
            id,
            pod_uid: self.pod_uid.clone(),
            qos: None,
        }
    }

    /// Whether `path` (a cgroup path as wattprof names it) is this
    /// task's cgroup.
    fn is_cgroup(&self, path: &str) -> bool {
        let p = self.cgroups_path.as_str();
        if p.is_empty() {
            return false;
        }
        match systemd_unit(p) {
            // The systemd driver: the unit is the path's last component.
            Some(unit) => path.rsplit('/').next() == Some(unit.as_str()),
            // cgroupfs: the path (relative ones are below the runtime's
            // own cgroup: a suffix at a component boundary).
            None => {
                let p = p.trim_end_matches('/');
                path.strip_suffix(p).is_some_and(|head| {
                    head.is_empty() || head.ends_with('/') || p.starts_with('/')
                })
            }
        }
    }

    /// Whether reports' id `id` (see [`Self::container`]) is this task.
    fn is(&self, id: &str) -> bool {
        if self.is_cri() {
            return self.id == id;
        }
        id.strip_prefix(self.namespace.as_str())
            .and_then(|r| r.strip_prefix('/'))
            == Some(self.id.as_str())
    }

    /// A Kubernetes container or sandbox (CRI names it by its id alone).
    fn is_cri(&self) -> bool {
        self.namespace == "k8s.io" || self.pod_uid.is_some()
    }
}

/// `slice:prefix:name` (runc's systemd cgroup path) → the unit it makes:
/// `prefix-name.scope`, or `name` itself when it is a slice or has no
/// prefix.
fn systemd_unit(cgroups_path: &str) -> Option<String> {
    let mut parts = cgroups_path.splitn(3, ':');
    let (_slice, prefix, name) = (parts.next()?, parts.next()?, parts.next()?);
    if cgroups_path.starts_with('/') {
        return None;
    }
    Some(if name.ends_with(".slice") || prefix.is_empty() {
        name.to_string()
    } else {
        format!("{prefix}-{name}.scope")
    })
}

/// What a spec names its container: `namespace/pod/container` for a
/// Kubernetes container (`namespace/pod` for the pod's sandbox), nerdctl's
/// name, else the id.
fn name_from(spec: &serde_json::Value, id: &str) -> String {
    let a = &spec["annotations"];
    let get = |k: &str| a[k].as_str().filter(|s| !s.is_empty());
    if let (Some(ns), Some(pod)) = (
        get("io.kubernetes.cri.sandbox-namespace"),
        get("io.kubernetes.cri.sandbox-name"),
    ) {
        return match get("io.kubernetes.cri.container-name") {
            Some(c) if get("io.kubernetes.cri.container-type") != Some("sandbox") => {
                format!("{ns}/{pod}/{c}")
            }
            _ => format!("{ns}/{pod}"),
        };
    }
    get("nerdctl/name").unwrap_or(id).to_string()
}

/// One task's spec, if it can be read.
fn read_task(dir: &Path, namespace: &str, id: &str) -> Option<Task> {
    use std::io::Read;
    let mut body = Vec::new();
    std::fs::File::open(dir.join("config.json"))
        .ok()?
        .take(MAX_SPEC)
        .read_to_end(&mut body)
        .ok()?;
    let spec: serde_json::Value = serde_json::from_slice(&body).ok()?;
    Some(Task {
        namespace: namespace.to_string(),
        id: id.to_string(),
        cgroups_path: spec["linux"]["cgroupsPath"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
        name: name_from(&spec, id),
        pod_uid: spec["annotations"]["io.kubernetes.cri.sandbox-uid"]
            .as_str()
            .map(str::to_string),
        running: true,
    })
}

#[derive(Debug, Default)]
struct State {
    /// By namespace and id.
    tasks: HashMap<(String, String), Task>,
    /// Each namespace directory's mtime at the last scan (the tasks
    /// directory's own under "").
    seen: HashMap<String, SystemTime>,
    /// When the tasks directory was last found missing.
    missing_at: Option<Instant>,
}

/// containerd's tasks, as far as its state directory shows them.
#[derive(Debug)]
pub(crate) struct ContainerdTasks {
    dir: PathBuf,
    state: Mutex<State>,
}

fn mtime(p: &Path) -> Option<SystemTime> {
    std::fs::metadata(p).and_then(|m| m.modified()).ok()
}

impl ContainerdTasks {
    /// Tasks under containerd's state directory `state` (normally
    /// `/run/containerd`; k3s: `/run/k3s/containerd`).
    pub(crate) fn new(state: &Path) -> Self {
        Self {
            dir: state.join(TASKS),
            state: Mutex::new(State::default()),
        }
    }

    /// Reads what changed since the last scan: namespaces whose
    /// directory's mtime moved are listed again, and only new tasks' specs
    /// are read.
    fn refresh(&self, st: &mut State) {
        if st.missing_at.is_some_and(|at| at.elapsed() < RECHECK) {
            return;
        }
        let Some(top) = mtime(&self.dir) else {
            st.missing_at = Some(Instant::now());
            return;
        };
        st.missing_at = None;
        let mut namespaces: Vec<String> =
            st.seen.keys().filter(|k| !k.is_empty()).cloned().collect();
        if st.seen.get("") != Some(&top) {
            st.seen.insert(String::new(), top);
            namespaces = std::fs::read_dir(&self.dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
        }
        for ns in namespaces {
            let dir = self.dir.join(&ns);
            let Some(t) = mtime(&dir) else {
                st.seen.remove(&ns);
                for task in st.tasks.values_mut().filter(|t| t.namespace == ns) {
                    task.running = false;
                }
                continue;
            };
            if st.seen.get(&ns) == Some(&t) {
                continue;
            }
            st.seen.insert(ns.clone(), t);
            let ids: Vec<String> = std::fs::read_dir(&dir)
                .into_iter()
                .flatten()
                .flatten()
                .filter_map(|e| e.file_name().into_string().ok())
                .collect();
            for task in st.tasks.values_mut().filter(|t| t.namespace == ns) {
                task.running = ids.contains(&task.id);
            }
            for id in ids {
                let key = (ns.clone(), id);
                if st.tasks.contains_key(&key) {
                    continue;
                }
                if let Some(task) = read_task(&dir.join(&key.1), &ns, &key.1) {
                    st.tasks.insert(key, task);
                }
            }
        }
        if st.tasks.len() > MAX_TASKS {
            st.tasks.retain(|_, t| t.running);
        }
    }

    /// The containerd container whose cgroup `path` is, if it is one the
    /// cgroup's path does not already say (a `ctr` or nerdctl container
    /// on the cgroupfs driver: `/default/web`).
    pub(crate) fn container_for(&self, path: &str) -> Option<Container> {
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let find = |st: &State| {
            st.tasks
                .values()
                .filter(|t| t.running)
                .find(|t| t.is_cgroup(path))
                .map(Task::container)
        };
        if let Some(c) = find(&st) {
            return Some(c);
        }
        self.refresh(&mut st);
        find(&st)
    }

    /// The name of containerd container `c` (its id as
    /// [`Self::container_for`] or the `cri-containerd-<id>.scope` cgroup
    /// gives it), once its task has been seen; a container that has
    /// stopped since keeps its name.
    pub(crate) fn name(&self, c: &Container) -> Option<String> {
        if c.runtime != Runtime::Containerd {
            return None;
        }
        let mut st = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        let find = |st: &State| {
            st.tasks
                .values()
                .find(|t| t.is(&c.id))
                .map(|t| t.name.clone())
        };
        if let Some(n) = find(&st) {
            return Some(n);
        }
        self.refresh(&mut st);
        find(&st)
    }

    /// Whether containerd's state directory is there.
    pub(crate) fn available(&self) -> bool {
        self.dir.is_dir()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_task(root: &Path, ns: &str, id: &str, spec: &serde_json::Value) {
        let dir = root.join(TASKS).join(ns).join(id);
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(dir.join("config.json"), spec.to_string()).expect("spec");
    }

    /// Moves a directory's mtime on, as a new entry would (the test's
    /// writes may land in the same clock tick).
    fn touch(dir: &Path, secs: u64) {
        let t = SystemTime::UNIX_EPOCH + Duration::from_secs(secs);
        std::fs::File::open(dir)
            .and_then(|f| f.set_modified(t))
            .expect("touch");
    }

    const CRI_ID: &str = "4f1c2a3b5d6e7f80912a3b4c5d6e7f80912a3b4c5d6e7f80912a3b4c5d6e7f80";

    #[test]
    fn ctr_nerdctl_and_cri_tasks_are_named_from_their_specs() {
        let root = tempfile::tempdir().expect("tmp");
        write_task(
            root.path(),
            "default",
            "web",
            &serde_json::json!({"linux": {"cgroupsPath": "/default/web"}}),
        );
        write_task(
            root.path(),
            "default",
            "nerd1",
            &serde_json::json!({"linux": {"cgroupsPath": "system.slice:nerdctl:nerd1"},
                "annotations": {"nerdctl/name": "db"}}),
        );
        write_task(
            root.path(),
            "k8s.io",
            CRI_ID,
            &serde_json::json!({"linux": {"cgroupsPath": format!("kubepods-besteffort-podab.slice:cri-containerd:{CRI_ID}")},
                "annotations": {"io.kubernetes.cri.container-type": "container",
                    "io.kubernetes.cri.container-name": "trainer",
                    "io.kubernetes.cri.sandbox-name": "job-7",
                    "io.kubernetes.cri.sandbox-namespace": "ml",
                    "io.kubernetes.cri.sandbox-uid": "0b7e1c2d-1111-2222-3333-444455556666"}}),
        );
        let tasks = ContainerdTasks::new(root.path());
        assert!(tasks.available());
        let web = tasks.container_for("/default/web").expect("ctr task");
        assert_eq!(
            (web.runtime, web.id.as_str()),
            (Runtime::Containerd, "default/web")
        );
        assert_eq!(tasks.name(&web).as_deref(), Some("web"));
        // Seen from inside a cgroup namespace rooted above it, or from a
        // deeper mount: still the same cgroup; a sibling is not.
        assert!(tasks.container_for("/sys/fs/cgroup/default/web").is_some());
        assert!(tasks.container_for("/default/web2").is_none());
        assert!(tasks.container_for("/other/default/webx").is_none());
        assert!(tasks.container_for("/default").is_none());
        let nerd = tasks
            .container_for("/system.slice/nerdctl-nerd1.scope")
            .expect("systemd driver");
        assert_eq!(tasks.name(&nerd).as_deref(), Some("db"));
        // A CRI container: the id from its cgroup's name, the name from
        // the pod's annotations.
        let cri = Container {
            runtime: Runtime::Containerd,
            id: CRI_ID.into(),
            pod_uid: None,
            qos: None,
        };
        assert_eq!(tasks.name(&cri).as_deref(), Some("ml/job-7/trainer"));
        assert!(tasks.container_for("/user.slice").is_none());
    }

    #[test]
    fn tasks_started_later_are_found_and_stopped_ones_keep_their_names() {
        let root = tempfile::tempdir().expect("tmp");
        let tasks = ContainerdTasks::new(root.path());
        assert!(!tasks.available());
        assert!(tasks.container_for("/default/a").is_none());
        // containerd starts: the missing directory is looked for again
        // only after RECHECK.
        write_task(
            root.path(),
            "default",
            "a",
            &serde_json::json!({"linux": {"cgroupsPath": "/default/a"}}),
        );
        assert!(tasks.container_for("/default/a").is_none());
        tasks
            .state
            .lock()
            .expect("lock")
            .missing_at
            .replace(Instant::now() - RECHECK);
        let a = tasks.container_for("/default/a").expect("found now");
        // A second task in the same namespace: found once the
        // namespace's directory changed.
        write_task(
            root.path(),
            "default",
            "b",
            &serde_json::json!({"linux": {"cgroupsPath": "/default/b"}}),
        );
        touch(&root.path().join(TASKS).join("default"), 1_000);
        assert!(tasks.container_for("/default/b").is_some());
        // `a` stops: no longer a running cgroup, but its name stays.
        std::fs::remove_dir_all(root.path().join(TASKS).join("default").join("a")).expect("rm");
        touch(&root.path().join(TASKS).join("default"), 2_000);
        assert!(tasks.container_for("/default/nothing").is_none());
        assert!(tasks.container_for("/default/a").is_none());
        assert_eq!(tasks.name(&a).as_deref(), Some("a"));
        // A spec that is not JSON is no task, and no panic.
        let bad = root.path().join(TASKS).join("default").join("bad");
        std::fs::create_dir_all(&bad).expect("dir");
        std::fs::write(bad.join("config.json"), b"{not json").expect("write");
        touch(&root.path().join(TASKS).join("default"), 3_000);
        assert!(tasks.container_for("/default/bad").is_none());
    }

    #[test]
    fn systemd_cgroup_paths_become_units() {
        assert_eq!(
            systemd_unit("system.slice:cri-containerd:abc").as_deref(),
            Some("cri-containerd-abc.scope")
        );
        assert_eq!(
            systemd_unit("kubepods.slice:pod:x.slice").as_deref(),
            Some("x.slice")
        );
        assert_eq!(systemd_unit("/default/web"), None);
    }
}
