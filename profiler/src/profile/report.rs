//! The end of a profile: its figures as the run document
//! ([`RunReport`]).

use super::Profile;
use super::Scope;
use super::output_errors;
use super::windows;
use crate::model::CommandReport;
use crate::model::DomainReport;
use crate::model::EnergyJ;
use crate::model::EnergyReport;
use crate::model::HostReport;
use crate::model::LearnedFit;
use crate::model::ProcessReport;
use crate::model::ProfilerReport;
use crate::model::RUN_SCHEMA_VERSION;
use crate::model::RunReport;
use crate::model::StaticPowerReport;
use crate::model::WindowDomainReport;
use crate::model::WindowReport;
use crate::process::Process;
use crate::sums::most_energy_first;
use crate::units::{joules, watts};

/// Host facts for the report header.
pub(crate) fn host_report(gpus: Vec<crate::sources::nvml::GpuInfo>) -> HostReport {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    };
    let cpu_model = read("/proc/cpuinfo")
        .lines()
        .find_map(|l| {
            l.strip_prefix("model name")?
                .split_once(':')
                .map(|(_, v)| v.trim().to_string())
        })
        .unwrap_or_default();
    HostReport {
        hostname: crate::topology::hostname(),
        kernel: read("/proc/sys/kernel/osrelease"),
        cpu_model,
        gpus,
    }
}

/// How the profiled command ended.
pub(crate) struct CommandEnd {
    /// Its command line.
    pub(crate) argv: Vec<String>,
    /// Its pid.
    pub(crate) pid: u32,
    /// Exit code, if it exited.
    pub(crate) exit_code: Option<i32>,
    /// The signal that killed it, if one did.
    pub(crate) signal: Option<i32>,
}

/// A profile's end: its report, and what its sinks wrote or could not.
pub(crate) struct Finished {
    /// The run document (without its intervals).
    pub(crate) report: RunReport,
    /// What was written, one line each (`report written to FILE`), to be
    /// printed after the run's table.
    pub(crate) said: Vec<String>,
    /// Outputs that could not be written, one line each.
    pub(crate) failed: Vec<String>,
}

/// Facts about how the profile ended, for the report.
pub(crate) struct Ending {
    /// `run` or `monitor`.
    pub(crate) mode: &'static str,
    /// The command (`run`).
    pub(crate) command: Option<CommandEnd>,
    /// Wall-clock start (ns since the epoch).
    pub(crate) start_unix_ns: u64,
    /// The tracker's facts.
    pub(crate) profiler: ProfilerReport,
}

impl Profile {
    pub(super) fn window_report(&self, w: &windows::Window) -> WindowReport {
        let span = w.end_ns.saturating_sub(w.begin_ns);
        WindowReport {
            name: w.name.clone(),
            pid: w.pid,
            depth: w.depth,
            begin_ns: w.begin_ns.saturating_sub(self.start_ns),
            end_ns: w.end_ns.saturating_sub(self.start_ns),
            unterminated: w.unterminated,
            on_cpu_ns: w.on_cpu_ns,
            energy: EnergyJ::new(&w.energy, span, &self.cfg.carbon),
            machine: w
                .machine
                .iter()
                .map(|m| WindowDomainReport {
                    domain: m.domain,
                    package: m.package,
                    measured_j: joules(m.measured_uj),
                    avg_power_w: watts(m.measured_uj, span),
                    estimated: m.estimated,
                })
                .collect(),
        }
    }

    pub(super) fn process_report(&self, p: &Process, end_ns: u64) -> ProcessReport {
        let from = p.start_ns.unwrap_or(self.start_ns).max(self.start_ns);
        let to = p.exit_ns.unwrap_or(end_ns);
        ProcessReport {
            pid: p.pid,
            ppid: p.ppid,
            comm: p.name(),
            cmdline: p.args.clone(),
            on_cpu_ns: p.total_ns(),
            on_cpu_ns_per_package: p.on_cpu_ns.clone(),
            start_ns: p.start_ns.map(|t| t.saturating_sub(self.start_ns)),
            exit_ns: p.exit_ns.map(|t| t.saturating_sub(self.start_ns)),
            energy: EnergyJ::new(
                &self.sums.ledger.consumer(p.id),
                to.saturating_sub(from),
                &self.cfg.carbon,
            ),
            memory: self.sums.memory.peak(p.id),
            cgroup: self.cgroup_path(p.id, p.cgroup_id).map(str::to_string),
        }
    }

    /// Ends the profile: closes open windows, builds the report and hands
    /// it to every sink. Call after the final [`Profile::step`].
    pub(crate) fn finish(mut self, ending: Ending) -> Finished {
        // The stack samples' frames named, for the report and the sinks.
        if let Some(st) = &mut self.stacks {
            st.resolve();
        }
        let end_ns = self.last_ns;
        let span = end_ns.saturating_sub(self.start_ns);
        let (windows, window_errors) = self.windows.finish(end_ns);
        let windows: Vec<WindowReport> = windows.iter().map(|w| self.window_report(w)).collect();
        for s in &mut self.sinks {
            for w in windows.iter().filter(|w| w.unterminated) {
                s.window(w);
            }
        }
        let carbon = &self.cfg.carbon;
        let processes = self.process_reports(end_ns);
        let groups = self.table.totals().clone();
        let group_energy = crate::sums::group_energy(&self.sums.groups, span, carbon);
        let cgroups = self.totals().cgroup_reports(None);
        // Every container's name asked for (those first seen while the
        // daemon was not there yet too), and the answers waited for (each
        // lookup takes at most 0.5 s).
        self.sums.cgroups.ask_container_names();
        self.sums
            .cgroups
            .settle(std::time::Duration::from_millis(600));
        let containers = self.totals().container_reports(None);
        let jobs = self.totals().job_reports(None);
        let profiler = self.profiler_report(ending.profiler, &processes);
        let command = ending.command.map(|c| CommandReport {
            argv: c.argv,
            pid: c.pid,
            exit_code: c.exit_code,
            signal: c.signal,
            on_cpu_ns: groups.tree_ns,
            processes: processes.len(),
            energy: group_energy.tree,
        });
        let attributed_ns = groups.tree_ns + groups.profiler_ns + groups.other_ns;
        let mut report = RunReport {
            schema_version: RUN_SCHEMA_VERSION,
            wattprof_version: env!("CARGO_PKG_VERSION").to_string(),
            mode: ending.mode.to_string(),
            start_unix_ns: ending.start_unix_ns,
            wall_ns: span,
            host: self.host.clone(),
            command,
            processes,
            energy: EnergyReport {
                readers: self.readers.used().to_vec(),
                domains: self.domain_reports(span),
                groups: group_energy,
                carbon_intensity_g_per_kwh: carbon.g_per_kwh,
                carbon_intensity_source: carbon.source.clone(),
                problems: self.problem_lines(),
                static_power: self.static_power_report(),
                mig_instances: self.sums.mig.reports(),
            },
            groups,
            cgroups,
            containers,
            jobs,
            windows,
            window_errors,
            machine: self
                .sums
                .machine
                .report(self.package_ids.clone(), attributed_ns),
            lost_ns: self.sums.machine.lost_ns(),
            profiler,
            stacks: self
                .stacks
                .as_ref()
                .map(|st| crate::model::stacks::StackReport {
                    functions: crate::model::stacks::functions(st.ledger(), 20, span, carbon),
                    ..st.report()
                }),
            served: None,
            intervals: Default::default(),
        };
        // Each sink's end is tried whatever another's did; each sees the
        // streams' failures so far (the stream's summary may fail too).
        let (mut said, mut failed) = (Vec::new(), Vec::new());
        let mut sinks = std::mem::take(&mut self.sinks);
        for i in 0..sinks.len() {
            report.profiler.output_errors = output_errors(&sinks);
            for done in sinks[i].finish(&report, &self.totals()) {
                match done {
                    Ok(line) => said.push(line),
                    Err(e) => failed.push(e),
                }
            }
        }
        report.profiler.output_errors = output_errors(&sinks);
        Finished {
            report,
            said,
            failed,
        }
    }

    /// Keeps an exited process's row (`monitor`) if it is among the `keep`
    /// that used the most energy of those that exited: a long monitor
    /// stays bounded, and a burner that ended before the report is in it.
    pub(super) fn keep_departed(&mut self, p: &Process, end_ns: u64, keep: usize) {
        if !self.wanted(p.id, p.cgroup_id) {
            return;
        }
        let row = self.process_report(p, end_ns);
        let least = self.departed.last().map(|r| (&r.energy, r.on_cpu_ns));
        if self.departed.len() >= keep
            && least.is_none_or(|l| {
                most_energy_first((&row.energy, row.on_cpu_ns), l) != std::cmp::Ordering::Less
            })
        {
            return;
        }
        let at = self.departed.partition_point(|r| {
            most_energy_first((&r.energy, r.on_cpu_ns), (&row.energy, row.on_cpu_ns))
                != std::cmp::Ordering::Greater
        });
        self.departed.insert(at, row);
        self.departed.truncate(keep);
    }

    /// The processes reported one by one: the command's tree in start
    /// order (`run`), or the processes with the most energy, live or
    /// exited (`monitor`, at least 100).
    fn process_reports(&self, end_ns: u64) -> Vec<ProcessReport> {
        let mut processes: Vec<ProcessReport> = match &self.cfg.scope {
            Scope::Tree => self
                .table
                .tree()
                .into_iter()
                .filter(|p| self.wanted(p.id, p.cgroup_id))
                .map(|p| self.process_report(p, end_ns))
                .collect(),
            Scope::Machine { top, .. } => {
                let mut v: Vec<ProcessReport> = self
                    .table
                    .processes()
                    .filter(|p| self.wanted(p.id, p.cgroup_id))
                    .map(|p| self.process_report(p, end_ns))
                    .chain(self.departed.iter().cloned())
                    .collect();
                v.sort_by(|a, b| {
                    most_energy_first((&a.energy, a.on_cpu_ns), (&b.energy, b.on_cpu_ns))
                });
                v.truncate((*top).max(100));
                v
            }
        };
        if matches!(self.cfg.scope, Scope::Tree) {
            processes.sort_by_key(|p| (p.start_ns.unwrap_or(0), p.pid));
        }
        processes
    }

    /// Each domain's energy over the profile.
    fn domain_reports(&self, span: u64) -> Vec<DomainReport> {
        self.sums
            .ledger
            .reports(span, |k| self.statics.figure(k.domain, k.package).copied())
    }

    /// The problems kept, and how many more there were.
    fn problem_lines(&self) -> Vec<String> {
        let mut problems = self.problems.clone();
        if self.problem_count > problems.len() as u64 {
            problems.push(format!(
                "... and {} more",
                self.problem_count - problems.len() as u64
            ));
        }
        problems
    }

    /// How static power was shared and what was learned of it.
    fn static_power_report(&self) -> Option<StaticPowerReport> {
        self.statics.note().map(|note| StaticPowerReport {
            rule: self.statics.share(),
            note,
            learned: self
                .statics
                .learned()
                .into_iter()
                .map(
                    |(domain, package, static_w, per_cpu_w, r_squared, intervals)| LearnedFit {
                        domain,
                        package,
                        static_w,
                        per_cpu_w,
                        r_squared,
                        intervals,
                    },
                )
                .collect(),
        })
    }

    /// wattprof's own figures: the tracker's, with the health of its
    /// samples and what the end found.
    fn profiler_report(
        &self,
        mut profiler: ProfilerReport,
        processes: &[ProcessReport],
    ) -> ProfilerReport {
        profiler.on_cpu_ns = self.table.totals().profiler_ns;
        (
            profiler.events_lost,
            profiler.discarded_ns,
            profiler.samples,
        ) = self.sums.machine.health();
        profiler.unmatched_forks = self.table.unmatched_forks();
        profiler.ended_unseen = processes
            .iter()
            .filter(|p| p.exit_ns.is_none() && self.unlisted_at_end.contains(&p.pid))
            .count() as u64;
        profiler
    }
}
