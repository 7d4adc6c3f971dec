//! Which processes are reported one by one: `--pid`, `--cgroup`,
//! `--container`, and `monitor`'s top rows (energy is still divided over
//! every process).

use super::Profile;
use super::Scope;
use super::stacks;
use crate::attribution::ConsumerId;
use crate::attribution::EnergyBy;
use crate::hash::IntMap;
use crate::process::IntervalUsage;
use crate::process::ProcFs;
use crate::process::ProcessTable;
use crate::process::Role;
use crate::process::names::ContainerNames;

/// Which processes are reported one by one (`--cgroup`, `--container`);
/// energy is still divided over every process.
#[derive(Clone, Debug, Default)]
pub(crate) struct Filter {
    /// cgroup path, and everything below it.
    pub(crate) cgroup: Option<String>,
    /// Container id (or a prefix of 4 or more characters), name, or pod UID.
    pub(crate) container: Option<String>,
}

impl Filter {
    /// Whether it lets every process through.
    pub(crate) fn is_empty(&self) -> bool {
        self.cgroup.is_none() && self.container.is_none()
    }

    pub(super) fn matches(&self, path: Option<&str>, names: &ContainerNames) -> bool {
        if self.cgroup.is_none() && self.container.is_none() {
            return true;
        }
        let Some(path) = path else { return false };
        if let Some(prefix) = &self.cgroup {
            let prefix = prefix.trim_end_matches('/');
            let below = path == prefix
                || path
                    .strip_prefix(prefix)
                    .is_some_and(|r| r.starts_with('/'))
                || prefix.is_empty();
            if !below {
                return false;
            }
        }
        if let Some(want) = &self.container {
            let Some(c) = names.recognize(path) else {
                return false;
            };
            let name = names.name(&c);
            let hit = (want.len() >= 4 && c.id.starts_with(want.as_str()))
                || name.as_deref() == Some(want.as_str())
                || c.pod_uid.as_deref() == Some(want.as_str());
            if !hit {
                return false;
            }
        }
        true
    }
}

impl Profile {
    /// cgroup path of a process record, when known (its v1 path where its
    /// v2 one is the root).
    pub(super) fn cgroup_path(&self, id: ConsumerId, cgroup_id: u64) -> Option<&str> {
        self.sums.cgroups.path_of(id, cgroup_id)
    }

    /// Whether a process passes `--pid`, `--cgroup` and `--container`.
    pub(super) fn wanted(&self, id: ConsumerId, cgroup_id: u64) -> bool {
        let pids_ok = match &self.cfg.scope {
            Scope::Machine { pids, .. } if !pids.is_empty() => {
                pids.iter().any(|p| self.table.descends_from(id, *p))
            }
            _ => true,
        };
        pids_ok
            && self.cfg.filter.matches(
                self.cgroup_path(id, cgroup_id),
                self.sums.cgroups.containers(),
            )
    }

    /// Indices in `usage` of the processes reported one by one this
    /// interval.
    pub(super) fn selected(
        &self,
        usage: &[IntervalUsage],
        energy: &IntMap<ConsumerId, EnergyBy>,
    ) -> Vec<usize> {
        let all = 0..usage.len();
        match &self.cfg.scope {
            Scope::Tree => all
                .filter(|i| matches!(usage[*i].role, Role::Tree | Role::Profiler))
                .filter(|i| {
                    let u = &usage[*i];
                    u.role == Role::Profiler || self.wanted(u.id, u.cgroup_id)
                })
                .collect(),
            Scope::Machine { top, pids, .. } => {
                // Most energy, then most CPU time, then first seen; each
                // key made once (`top` orders a thousand rows each
                // interval).
                let mut v: Vec<(std::cmp::Reverse<(u64, u64)>, usize)> = usage
                    .iter()
                    .enumerate()
                    .map(|(i, u)| {
                        let energy = energy.get(&u.id).map_or(0, EnergyBy::total_uj);
                        let cpu = u.on_cpu_ns.iter().sum::<u64>();
                        (std::cmp::Reverse((energy, cpu)), i)
                    })
                    .collect();
                let filtered = !pids.is_empty() || !self.cfg.filter.is_empty();
                if !filtered && v.len() > *top {
                    // Only the top ones are ordered: O(n), not O(n log n),
                    // with thousands of processes each interval.
                    v.select_nth_unstable(*top);
                    v.truncate(*top);
                }
                v.sort_unstable();
                v.into_iter()
                    .map(|(_, i)| i)
                    .filter(|i| self.wanted(usage[*i].id, usage[*i].cgroup_id))
                    .take(*top)
                    .collect()
            }
        }
    }

    /// Whose stacks are profiled: the command's tree in `run` (within
    /// `--container`/`--cgroup`), every process in `monitor`.
    pub(super) fn stack_filter(
        &self,
    ) -> impl Fn(&ProcessTable<ProcFs>, u32) -> stacks::Wanted + use<> {
        let tree_only = matches!(self.cfg.scope, Scope::Tree);
        move |table, pid| match table.get(pid) {
            None if tree_only => stacks::Wanted::NotKnownYet,
            None => stacks::Wanted::Yes,
            Some(p) if !tree_only || p.role == Role::Tree => stacks::Wanted::Yes,
            Some(_) => stacks::Wanted::No,
        }
    }
}
