//! CPU topology from sysfs: which package (socket) each possible CPU is on.
//!
//! Per-CPU data is sized by *possible* CPUs, as the kernel sizes per-CPU
//! maps, so a CPU brought online later still has a slot.

use std::path::{Path, PathBuf};

use profiler_common::MAX_SOCKETS;

/// Errors reading the topology.
#[derive(Debug, thiserror::Error)]
pub enum TopologyError {
    /// A sysfs file could not be read.
    #[error("cannot read {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        source: std::io::Error,
    },
    /// A CPU list (`0-3,8`) could not be parsed.
    #[error("cannot parse CPU list {text:?} in {path}")]
    CpuList {
        /// The file.
        path: PathBuf,
        /// Its content.
        text: String,
    },
    /// More packages than wattprof's eBPF maps can split time over.
    #[error(
        "this machine has {found} CPU packages; wattprof supports at most {max} \
         (rebuild with a larger profiler_common::MAX_SOCKETS)"
    )]
    TooManySockets {
        /// Packages found.
        found: usize,
        /// `MAX_SOCKETS`.
        max: usize,
    },
}

/// Where sysfs is mounted; injectable so tests can use a fixture tree.
#[derive(Clone, Debug)]
pub struct SysRoot(PathBuf);

impl SysRoot {
    /// The real `/sys`.
    pub fn real() -> Self {
        Self(PathBuf::from("/sys"))
    }

    /// A fixture tree standing in for `/sys`.
    pub(crate) fn at(path: impl Into<PathBuf>) -> Self {
        Self(path.into())
    }

    /// A path below the root, given without its leading `/sys/`.
    pub(crate) fn join(&self, rel: &str) -> PathBuf {
        self.0.join(rel)
    }
}

/// Which package each CPU belongs to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Topology {
    /// Dense package index (`0..sockets`) per possible CPU, indexed by CPU id.
    pub(crate) package_of_cpu: Vec<u32>,
    /// The kernel's `physical_package_id` of each dense index.
    pub(crate) package_ids: Vec<u32>,
    /// Online CPU ids.
    pub(crate) online: Vec<u32>,
}

impl Topology {
    /// Reads the topology of the machine `sys` describes.
    ///
    /// A CPU whose topology is unreadable (offline on some kernels) is put on
    /// the first package; it runs nothing while offline.
    pub fn read(sys: &SysRoot) -> Result<Self, TopologyError> {
        let possible = read_cpu_list(&sys.join("devices/system/cpu/possible"))?;
        let online = read_cpu_list(&sys.join("devices/system/cpu/online"))?;
        let n = possible.iter().max().map_or(0, |m| *m as usize + 1);
        let mut raw = vec![None; n];
        for &cpu in &possible {
            let path = sys.join(&format!(
                "devices/system/cpu/cpu{cpu}/topology/physical_package_id"
            ));
            raw[cpu as usize] = std::fs::read_to_string(&path)
                .ok()
                .and_then(|s| s.trim().parse::<i64>().ok())
                // -1 means "unknown" (some VMs); treat it as package 0.
                .map(|id| id.max(0) as u32);
        }
        let mut package_ids: Vec<u32> = raw.iter().flatten().copied().collect();
        package_ids.sort_unstable();
        package_ids.dedup();
        if package_ids.is_empty() {
            package_ids.push(0);
        }
        if package_ids.len() > MAX_SOCKETS {
            return Err(TopologyError::TooManySockets {
                found: package_ids.len(),
                max: MAX_SOCKETS,
            });
        }
        let package_of_cpu = raw
            .iter()
            .map(|id| {
                id.and_then(|id| package_ids.iter().position(|p| *p == id))
                    .unwrap_or(0) as u32
            })
            .collect();
        Ok(Self {
            package_of_cpu,
            package_ids,
            online,
        })
    }

    /// The kernel's `physical_package_id` of `cpu` (the first package for
    /// a CPU the topology does not know).
    pub(crate) fn package_id_of(&self, cpu: u32) -> u32 {
        let dense = self.package_of_cpu.get(cpu as usize).copied().unwrap_or(0);
        self.package_ids.get(dense as usize).copied().unwrap_or(0)
    }

    /// Number of packages.
    pub fn packages(&self) -> usize {
        self.package_ids.len()
    }

    /// Number of possible CPUs (the size of per-CPU data).
    pub(crate) fn possible_cpus(&self) -> usize {
        self.package_of_cpu.len()
    }
}

/// This machine's host name (empty when unreadable).
pub(crate) fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default()
}

/// Parses a kernel CPU list file such as `0-3,8,10-11`.
pub(crate) fn read_cpu_list(path: &Path) -> Result<Vec<u32>, TopologyError> {
    let text = std::fs::read_to_string(path).map_err(|source| TopologyError::Read {
        path: path.to_path_buf(),
        source,
    })?;
    parse_cpu_list(&text).ok_or_else(|| TopologyError::CpuList {
        path: path.to_path_buf(),
        text: text.trim().to_string(),
    })
}

/// Parses `0-3,8,10-11` into CPU ids; `None` when malformed.
pub fn parse_cpu_list(text: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in text.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (u32, u32) = (a.parse().ok()?, b.parse().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
        // No machine has more: without a cap, a few KiB of repeated wide
        // ranges would allocate gigabytes.
        if cpus.len() > 1 << 16 {
            return None;
        }
    }
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::write;

    #[test]
    fn cpu_lists() {
        assert_eq!(
            parse_cpu_list("0-3,8,10-11\n"),
            Some(vec![0, 1, 2, 3, 8, 10, 11])
        );
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list("3-1"), None);
        assert_eq!(parse_cpu_list("x"), None);
        // Repeated wide ranges: refused, not gigabytes.
        assert_eq!(parse_cpu_list(&["0-65535"; 200].join(",")), None);
    }

    #[test]
    fn two_sockets_with_sparse_package_ids_and_an_offline_cpu() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        write(root, "devices/system/cpu/possible", "0-4\n");
        write(root, "devices/system/cpu/online", "0-3\n");
        for (cpu, pkg) in [(0, 0), (1, 0), (2, 3), (3, 3)] {
            write(
                root,
                &format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id"),
                &format!("{pkg}\n"),
            );
        }
        let t = Topology::read(&SysRoot::at(root)).expect("topology");
        assert_eq!(t.package_ids, vec![0, 3]);
        assert_eq!(t.package_of_cpu, vec![0, 0, 1, 1, 0]);
        assert_eq!(t.online, vec![0, 1, 2, 3]);
        assert_eq!((t.packages(), t.possible_cpus()), (2, 5));
        assert_eq!(
            (t.package_id_of(2), t.package_id_of(4), t.package_id_of(99)),
            (3, 0, 0)
        );
    }

    #[test]
    fn too_many_sockets_is_an_error() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let n = MAX_SOCKETS + 1;
        write(root, "devices/system/cpu/possible", &format!("0-{}", n - 1));
        write(root, "devices/system/cpu/online", &format!("0-{}", n - 1));
        for cpu in 0..n {
            write(
                root,
                &format!("devices/system/cpu/cpu{cpu}/topology/physical_package_id"),
                &cpu.to_string(),
            );
        }
        let err = Topology::read(&SysRoot::at(root)).expect_err("too many");
        assert!(matches!(err, TopologyError::TooManySockets { .. }), "{err}");
    }
}
