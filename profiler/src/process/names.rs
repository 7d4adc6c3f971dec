//! Which container a cgroup is, and what its runtime calls it: Docker and
//! Podman through the Engine API (Podman's service speaks Docker's), and
//! containerd from its tasks' specs. Asking never blocks: an answer not
//! there yet comes at a later interval, and the id stands in meanwhile.

use crate::process::container::{Container, Runtime, from_cgroup_path};
use crate::process::containerd::ContainerdTasks;
use crate::process::docker::DockerNames;
use std::path::PathBuf;
use std::time::Duration;

/// Where each runtime is asked.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct RuntimeSockets {
    /// Docker's Engine API socket.
    pub(crate) docker: PathBuf,
    /// Podman's API socket (its Docker-compatible service).
    pub(crate) podman: PathBuf,
    /// containerd's state directory.
    pub(crate) containerd: PathBuf,
}

impl Default for RuntimeSockets {
    fn default() -> Self {
        Self {
            docker: "/var/run/docker.sock".into(),
            podman: "/run/podman/podman.sock".into(),
            containerd: "/run/containerd".into(),
        }
    }
}

/// Container names from every runtime wattprof knows.
#[derive(Debug)]
pub(crate) struct ContainerNames {
    docker: DockerNames,
    podman: DockerNames,
    containerd: ContainerdTasks,
}

impl ContainerNames {
    /// Names from the runtimes at `at`; a runtime that is not there costs
    /// nothing but a look every few seconds.
    pub(crate) fn new(at: &RuntimeSockets) -> Self {
        Self {
            docker: DockerNames::new(&at.docker, "wattprof-docker"),
            podman: DockerNames::new(&at.podman, "wattprof-podman"),
            containerd: ContainerdTasks::new(&at.containerd),
        }
    }

    /// The container cgroup `path` belongs to: what its path says, else a
    /// containerd task whose cgroup it is (`ctr` and nerdctl on cgroupfs
    /// name theirs `/<namespace>/<id>`). Ask while the cgroup exists: a
    /// stopped containerd task is not recognized any more.
    pub(crate) fn recognize(&self, path: &str) -> Option<Container> {
        from_cgroup_path(path).or_else(|| self.containerd.container_for(path))
    }

    /// Whether `runtime` can be asked for names now.
    pub(crate) fn available(&self, runtime: Runtime) -> bool {
        match runtime {
            Runtime::Docker => self.docker.available(),
            Runtime::Podman => self.podman.available(),
            Runtime::Containerd => self.containerd.available(),
            _ => false,
        }
    }

    /// `c`'s name if known; asks its runtime otherwise (the answer comes
    /// later).
    pub(crate) fn name(&self, c: &Container) -> Option<String> {
        match c.runtime {
            Runtime::Docker => self.docker.name(&c.id),
            Runtime::Podman => self.podman.name(&c.id),
            Runtime::Containerd => self.containerd.name(c),
            _ => None,
        }
    }

    /// `c`'s name if its runtime has answered, without asking.
    pub(crate) fn cached(&self, c: &Container) -> Option<String> {
        match c.runtime {
            Runtime::Docker => self.docker.cached(&c.id),
            Runtime::Podman => self.podman.cached(&c.id),
            Runtime::Containerd => self.containerd.name(c),
            _ => None,
        }
    }

    /// Makes every Engine API answer stale, so the next [`Self::name`]
    /// asks again (before a final report: containers renamed since).
    pub(crate) fn expire(&self) {
        self.docker.expire();
        self.podman.expire();
    }

    /// Waits, at most `limit` in all, for the lookups asked for.
    pub(crate) fn settle(&self, limit: Duration) {
        let deadline = std::time::Instant::now() + limit;
        self.docker.settle(limit);
        self.podman
            .settle(deadline.saturating_duration_since(std::time::Instant::now()));
    }
}
