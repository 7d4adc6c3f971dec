//! cgroup v2 ids (what the kernel hands the eBPF program) to paths.
//!
//! A cgroup v2 id is the inode number of its directory in the cgroup2
//! mount, so the path is found by walking the mount once and caching; an
//! id not in the cache triggers one new walk (at most once per `refresh`
//! interval, so a storm of short-lived cgroups costs one walk each time).

use std::collections::HashMap;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Maps cgroup ids to paths under a cgroup2 mount.
#[derive(Debug)]
pub(crate) struct CgroupNames {
    root: PathBuf,
    names: HashMap<u64, String>,
    /// The walk before: a cgroup removed since is still named until the
    /// next walk.
    previous: HashMap<u64, String>,
    mounted: bool,
    first_asked_ns: HashMap<u64, u64>,
    walked_at_ns: Option<u64>,
    refresh_ns: u64,
}

/// Directories deeper than this are not walked (systemd nests 5–8 deep).
const MAX_DEPTH: usize = 16;

impl CgroupNames {
    /// Paths under `root` (normally `/sys/fs/cgroup`), walking again for an
    /// unknown id at most every `refresh_ns`.
    pub(crate) fn new(root: impl Into<PathBuf>, refresh_ns: u64) -> Self {
        Self {
            root: root.into(),
            names: HashMap::new(),
            previous: HashMap::new(),
            mounted: true,
            first_asked_ns: HashMap::new(),
            walked_at_ns: None,
            refresh_ns,
        }
    }

    /// The cgroup v2 id of the root cgroup (where every task is on a host
    /// that keeps its units in cgroup v1 hierarchies); `None` without a
    /// cgroup2 mount, where no v2 id says anything.
    pub(crate) fn root_id(&self) -> Option<u64> {
        if !self.mounted {
            return None;
        }
        std::fs::metadata(&self.root).ok().map(|m| m.ino())
    }

    /// The cgroup2 mount of this machine (`/sys/fs/cgroup`, or
    /// `/sys/fs/cgroup/unified` on hybrid v1/v2 hosts), from mountinfo.
    pub(crate) fn real(refresh_ns: u64) -> Self {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        match cgroup2_mount(&mountinfo) {
            Some(root) => Self::new(root, refresh_ns),
            None => Self {
                mounted: false,
                ..Self::new("/sys/fs/cgroup", refresh_ns)
            },
        }
    }

    fn walk(&mut self, dir: &Path, rel: &str, depth: usize, dev: Option<u64>) {
        let Ok(md) = std::fs::metadata(dir) else {
            return;
        };
        // Stay on the cgroup2 file system (v1 hierarchies may be mounted
        // below it on hybrid hosts).
        if dev.is_some_and(|d| d != md.dev()) {
            return;
        }
        let name = if rel.is_empty() { "/" } else { rel };
        self.names.insert(md.ino(), name.to_string());
        if depth >= MAX_DEPTH {
            return;
        }
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                let child = format!("{rel}/{}", e.file_name().to_string_lossy());
                self.walk(&e.path(), &child, depth + 1, Some(md.dev()));
            }
        }
    }

    /// The path of cgroup `id` (`/` for the root, `/system.slice/x.service`),
    /// or `None` when it is not (or no longer) in the mount. `now_ns` is a
    /// monotonic time for rate-limiting walks.
    pub(crate) fn name(&mut self, id: u64, now_ns: u64) -> Option<&str> {
        let asked = *self.first_asked_ns.entry(id).or_insert(now_ns);
        // A walk that began after the id was first asked for did not find
        // it: the cgroup is gone (ids are never reused), stop looking.
        let gone = self.walked_at_ns.is_some_and(|t| t > asked);
        if id != 0
            && !gone
            && !self.names.contains_key(&id)
            && !self.previous.contains_key(&id)
            && self
                .walked_at_ns
                .is_none_or(|t| now_ns.saturating_sub(t) >= self.refresh_ns)
        {
            self.walked_at_ns = Some(now_ns);
            let root = self.root.clone();
            // Cgroups that exist now, and those of the walk before: the
            // maps stay the size of the mount, however many come and go.
            self.previous = std::mem::take(&mut self.names);
            self.walk(&root, "", 0, None);
        }
        self.names
            .get(&id)
            .or_else(|| self.previous.get(&id))
            .map(String::as_str)
    }
}

impl CgroupNames {
    /// Forgets cgroup `id` (pruned: its processes have not run for a
    /// while); asked again, it is looked up again.
    pub(crate) fn forget(&mut self, id: u64) {
        self.names.remove(&id);
        self.previous.remove(&id);
        self.first_asked_ns.remove(&id);
    }
}

/// The cgroup v1 path of a process from its `/proc/PID/cgroup` text: a
/// batch job's step on whichever hierarchy holds it (a scheduler's
/// plugins use a few controllers, not always those below), else the
/// `name=systemd` hierarchy (systemd mirrors units and container scopes
/// there), else the `cpu` controller's; `None` on pure cgroup v2.
pub(crate) fn v1_path(proc_cgroup: &str) -> Option<String> {
    if let Some(job) = super::batch::job_path(proc_cgroup) {
        return Some(job);
    }
    let mut cpu = None;
    for line in proc_cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (_, controllers, path) = (f.next()?, f.next()?, f.next()?);
        if controllers == "name=systemd" {
            return Some(path.to_string());
        }
        if controllers.split(',').any(|c| c == "cpu") {
            cpu = Some(path.to_string());
        }
    }
    cpu
}

/// A key for a cgroup v1 path that cannot collide with a cgroup v2 id
/// (inode numbers stay far below 2^63).
pub(crate) fn v1_key(path: &str) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    path.hash(&mut h);
    h.finish() | (1 << 63)
}

/// The mount point of the cgroup2 file system in a mountinfo text.
pub(crate) fn cgroup2_mount(mountinfo: &str) -> Option<PathBuf> {
    mountinfo.lines().find_map(|l| {
        let (left, right) = l.split_once(" - ")?;
        let point = left.split_whitespace().nth(4)?;
        (right.split_whitespace().next()? == "cgroup2").then(|| PathBuf::from(point))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn v1_paths_prefer_systemd_s_hierarchy() {
        let v1 =
            "12:cpu,cpuacct:/docker/abc\n1:name=systemd:/system.slice/docker-abc.scope\n0::/\n";
        assert_eq!(
            v1_path(v1).as_deref(),
            Some("/system.slice/docker-abc.scope")
        );
        assert_eq!(
            v1_path("4:cpu,cpuacct:/docker/abc\n").as_deref(),
            Some("/docker/abc")
        );
        assert_eq!(v1_path("0::/user.slice\n"), None);
        assert!(v1_key("/docker/abc") >= 1 << 63);
        assert_ne!(v1_key("/a"), v1_key("/b"));
    }

    #[test]
    fn finds_the_cgroup2_mount_on_hybrid_hosts() {
        let hybrid = "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n\
                      32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n\
                      41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n";
        assert_eq!(
            cgroup2_mount(hybrid),
            Some(PathBuf::from("/sys/fs/cgroup/unified"))
        );
        assert_eq!(
            cgroup2_mount("31 23 0:28 / /sys/fs/cgroup rw - tmpfs tmpfs rw\n"),
            None
        );
    }

    #[test]
    fn ids_are_directory_inodes_and_unknown_ids_walk_again_after_the_refresh() {
        let dir = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(dir.path().join("system.slice/docker-abc.scope")).expect("mkdir");
        let ino = |p: &str| std::fs::metadata(dir.path().join(p)).expect("md").ino();
        let mut names = CgroupNames::new(dir.path(), 1_000);
        let id = ino("system.slice/docker-abc.scope");
        assert_eq!(names.name(id, 0), Some("/system.slice/docker-abc.scope"));
        assert_eq!(names.name(ino(""), 0), Some("/"));
        std::fs::create_dir(dir.path().join("user.slice")).expect("mkdir");
        let user = ino("user.slice");
        // Within the refresh interval an unknown id is not walked for.
        assert_eq!(names.name(user, 500), None);
        assert_eq!(names.name(user, 1_500), Some("/user.slice"));
        // An id no walk after its first sighting finds is given up on.
        assert_eq!(names.name(999_999_999, 2_000), None);
        assert_eq!(names.name(999_999_999, 3_000), None);
        let walked = names.walked_at_ns;
        assert_eq!(names.name(999_999_999, 9_000), None);
        assert_eq!(names.walked_at_ns, walked, "no walk for a gone cgroup");
    }
}
