//! One interval: the tracker's sample and the energy read with it go
//! through the attribution engine, and the results are summed per
//! process, group, cgroup, VM and window, and written.

use super::Profile;
use super::Scope;
use super::held;
use super::record::Built;
use crate::attribution;
use crate::attribution::ConsumerId;
use crate::attribution::DomainShare;
use crate::attribution::EnergyBy;
use crate::attribution::GpuInterval;
use crate::attribution::Interval;
use crate::attribution::PackageTime;
use crate::hash::IntMap;
use crate::process::IntervalUsage;
use crate::process::Role;
use crate::sources::registry::IntervalEnergy;
use crate::tracker::CpuSample;

use crate::sources::nvml::statics::SETTLE_NS;

/// GPU holders no process matched, remembered so each is reported once.
const MAX_UNMAPPED: usize = 4096;

impl Profile {
    /// Warns when the wall clock jumped (`date -s`, a VM resumed, NTP
    /// stepping it): intervals are timed on the monotonic clock, which does
    /// not jump, and timestamps are the start's wall-clock time plus
    /// monotonic time, so they do not jump either; the report says it did.
    pub(super) fn watch_clock(&mut self, at_ns: u64) {
        if self.start_unix_ns == 0 {
            return;
        }
        // Both clocks read back to back: a delay since the sample (a
        // SIGSTOP, a slow read) is not a jump.
        let wall_ns = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos() as i128);
        let now_ns = crate::tracker::monotonic_ns().max(at_ns);
        let since_ns = i128::from(now_ns.saturating_sub(self.start_ns));
        let skew = wall_ns - i128::from(self.start_unix_ns) - since_ns;
        let jump = skew - self.clock_skew_ns;
        if jump.abs() > 1_000_000_000 {
            self.clock_skew_ns = skew;
            let p = format!(
                "the wall clock jumped {:+.1} s about {:.1} s into the profile (intervals are \
                 timed on the monotonic clock; timestamps are the start's wall-clock time plus \
                 monotonic time, so they do not jump)",
                jump as f64 / 1e9,
                since_ns as f64 / 1e9
            );
            eprintln!("wattprof: {p}");
            self.problem(p);
        }
    }

    /// Adds the interval's shares to the open windows, each its sender's
    /// tree.
    fn add_to_windows(&mut self, usage: &[IntervalUsage], shares: &[DomainShare]) {
        if self.windows.any_open() {
            let consumers: Vec<(ConsumerId, u64)> = usage
                .iter()
                .map(|u| (u.id, u.on_cpu_ns.iter().sum()))
                .collect();
            let table = &self.table;
            self.windows
                .add_interval(shares, &consumers, |id, pid| table.descends_from(id, pid));
        }
    }

    /// MIG: what each instance's processes were given, summed; per GPU and
    /// instance, for the record.
    fn sum_mig(&mut self, read: &IntervalEnergy, shares: &[DomainShare]) -> Vec<Vec<u64>> {
        let mig = self.mig_energy(read, shares);
        for (g, uj) in read.gpus.iter().zip(&mig) {
            for (i, uj) in g.instances.iter().zip(uj) {
                self.sums.mig.add(
                    g.index,
                    i.gpu_instance_id,
                    i.compute_instance_id,
                    &i.uuid,
                    i.slices,
                    *uj,
                );
            }
        }
        mig
    }

    /// Folds in one interval: the tracker's sample and the energy read
    /// just before it. Each step below is one stage of the data flow.
    pub(super) fn step(&mut self, sample: &CpuSample, mut read: IntervalEnergy) {
        self.watch_clock(sample.at_ns);
        self.say_kernel_log(sample);
        let duration_ns = sample.at_ns.saturating_sub(self.last_ns);
        self.last_ns = sample.at_ns;
        // Time: per package, as divided and as the kernel counts it.
        let times = package_times(sample, self.package_ids.len());
        // Energy: the models stand in where no counter is, and static
        // power is learned and applied.
        self.readers.add_estimate(
            &mut read,
            times.busy_ns,
            times.window_ns,
            times.online.max(1),
        );
        let wall = self
            .readers
            .add_wall_model(&mut read, times.busy_ns, duration_ns);
        let (statics, static_w) = self.statics.interval(
            &read.energy,
            &read.caught_up,
            &times.physical,
            &self.package_ids,
            duration_ns,
            self.readers.model_static_uj(times.window_ns),
        );
        // Processes: the sample applied to the table.
        let mut usage = self.table.apply(sample);
        self.sums.machine.add(sample);
        for p in self.readers.take_problems() {
            self.problem(p);
        }
        // Attribution: this interval's energy divided, and reads that
        // failed before held and caught up.
        let gpus = self.gpu_intervals(&read, duration_ns, sample.at_ns);
        let cpu_usage: Vec<attribution::Usage> = usage
            .iter()
            .map(|u| attribution::Usage {
                id: u.id,
                on_cpu_ns: u.on_cpu_ns,
            })
            .collect();
        let mut shares = attribution::attribute(&Interval {
            packages: &times.packages,
            package_ids: &self.package_ids,
            usage: &cpu_usage,
            energy: &read.energy,
            gpus: &gpus,
            wall,
            statics: &statics,
            static_share: self.statics.share(),
        });
        // Domains whose read failed hold this interval's CPU time; a
        // read after failed ones is divided over the whole span.
        let span = held::Span {
            packages: &times.packages,
            package_ids: &self.package_ids,
            usage: &cpu_usage,
            start_ns: sample.at_ns.saturating_sub(duration_ns),
            end_ns: sample.at_ns,
            static_w: &static_w,
            static_share: self.statics.share(),
        };
        let held_problems = self.held.hold(&read.missed, &span);
        let caught = self.held.catch_up(&read.caught_up, &span);
        for p in held_problems {
            self.problem(p);
        }
        shares.extend(caught.shares);
        for p in self.statics.problems(&shares) {
            eprintln!("wattprof: {p}");
            self.problem(p);
        }
        self.sums.ledger.add(&shares);
        // Sums: per consumer, group, cgroup, container, VM and window.
        let (energy, index) = self.energy_per_consumer(&shares, &mut usage);
        self.place_in_cgroups(&mut usage);
        self.close_stacks(&usage, &energy, sample.at_ns);
        let groups = self.sum_groups_and_cgroups(&usage, &energy, &index, sample.at_ns);
        self.sums.cgroups.name(sample.at_ns);
        self.sum_vms(&usage, &energy);
        self.add_to_windows(&usage, &shares);
        self.add_to_served(&usage, &energy, &shares, duration_ns);
        let mig = self.sum_mig(&read, &shares);
        // Outputs: the interval's record, streamed and kept.
        let record = self.build_record(&Built {
            mig: &mig,
            sample,
            duration_ns,
            usage: &usage,
            energy: &energy,
            read: &read,
            shares: &shares,
            covers_ns: &caught.covers_ns,
            groups: &groups,
        });
        self.write_record(record);
        self.scratch.energy = energy;
        self.scratch.index = index;
        self.forget_gone(sample.at_ns);
    }

    /// Each process's cgroup where its v2 one does not say it: its v1
    /// path, its batch job's, its `slurmstepd`'s or its parent's
    /// ([`crate::sums::cgroups::Cgroups::v1_cgroups`]).
    fn place_in_cgroups(&mut self, usage: &mut [IntervalUsage]) {
        let table = &self.table;
        self.sums
            .cgroups
            .v1_cgroups(usage, &self.procfs, |id| lineage(table, id));
    }

    /// The eBPF programs' own word on a full map or ring (aya-log): printed
    /// on stderr as it happens, and kept in the recording's problems.
    fn say_kernel_log(&mut self, sample: &CpuSample) {
        for m in &sample.kernel_log {
            let p = format!("eBPF: {m}");
            eprintln!("wattprof: {p}");
            self.problem(p);
        }
    }

    /// Per GPU in `read`, per MIG instance: the energy its processes
    /// were given in `shares` (µJ; none off MIG).
    fn mig_energy(&self, read: &IntervalEnergy, shares: &[DomainShare]) -> Vec<Vec<u64>> {
        read.gpus
            .iter()
            .map(|g| {
                let mut uj = vec![0u64; g.instances.len()];
                let Some(share) = shares.iter().find(|s| {
                    s.key.domain == crate::sources::Domain::Gpu && s.key.package == Some(g.index)
                }) else {
                    return uj;
                };
                for (id, e) in &share.attributed {
                    let Some(pid) = self.table.by_id(*id).map(|p| p.pid) else {
                        continue;
                    };
                    if let Some(k) = g.instances.iter().position(|i| i.pids.contains(&pid)) {
                        uj[k] += e;
                    }
                }
                uj
            })
            .collect()
    }

    /// Each GPU's energy and the processes on it, for the attribution.
    ///
    /// NVML reports host pids, and the tracker knows every process by
    /// its host pid (the kernel's own), so a holder is matched by that
    /// alone: never by what `/proc` in wattprof's own PID namespace shows
    /// (in a container, pid 42 there can be another process than the
    /// host's 42). A holder the tracker does not know (another namespace's
    /// view, or it ended) keeps its share unattributed, reported once.
    ///
    /// When the last holders have gone, the power takes up to a second to
    /// settle to idle (an H200's did): for [`SETTLE_NS`] after they were
    /// last seen, the energy above the known idle figure is theirs, by
    /// their last weights, not the idle row's.
    fn gpu_intervals(
        &mut self,
        read: &IntervalEnergy,
        duration_ns: u64,
        at_ns: u64,
    ) -> Vec<GpuInterval> {
        let mut gpus: Vec<GpuInterval> = Vec::with_capacity(read.gpus.len());
        for g in &read.gpus {
            for p in &g.processes {
                if self.table.id_of(p.pid).is_none() && self.unmapped_gpu_pids.insert(p.pid) {
                    if self.unmapped_gpu_pids.len() > MAX_UNMAPPED {
                        // A daemon's set stays bounded: an old pid may be
                        // reported again, never grow it without end.
                        self.unmapped_gpu_pids.clear();
                        self.unmapped_gpu_pids.insert(p.pid);
                    }
                    self.problem(format!(
                        "GPU {}: pid {} holds a context but is no process the tracker knows \
                         (NVML gives host pids: another PID namespace's process, or one that \
                         ended): its GPU energy is unattributed",
                        g.index, p.pid
                    ));
                }
            }
            let mut processes: Vec<(Option<ConsumerId>, u32)> = g
                .processes
                .iter()
                .map(|p| {
                    (
                        self.table.id_of(p.pid),
                        (p.sm_util_pct * 1000.0).round() as u32,
                    )
                })
                .collect();
            let statics = self.statics.gpu_interval(g, duration_ns);
            // Only above a known idle figure: without one, the idle power
            // would be charged to them.
            let mut settling = false;
            if processes.is_empty() {
                if statics.idle_uj > 0 {
                    processes = self.settling_holders(g.index, at_ns.saturating_sub(duration_ns));
                    settling = !processes.is_empty();
                }
            } else {
                self.gpu_tail.insert(g.index, (processes.clone(), at_ns));
            }
            gpus.push(GpuInterval {
                index: g.index,
                energy_uj: g.energy_uj,
                estimated: g.method == crate::sources::nvml::GpuEnergyMethod::PowerIntegration,
                processes,
                unheld: (g.unheld_sm_pct * 1000.0).round() as u32,
                statics,
                settling,
            });
        }
        gpus
    }

    /// The holders a GPU had when it was last held, for an interval that
    /// starts at `from_ns`, while its power may still be settling from
    /// their work (within [`SETTLE_NS`] of when they were last seen); none
    /// after. A holder the table no longer knows (or never knew) keeps its
    /// weight, unattributed.
    fn settling_holders(&mut self, index: u32, from_ns: u64) -> Vec<(Option<ConsumerId>, u32)> {
        let Some((holders, since)) = self.gpu_tail.get(&index) else {
            return Vec::new();
        };
        if from_ns.saturating_sub(*since) >= SETTLE_NS {
            self.gpu_tail.remove(&index);
            return Vec::new();
        }
        holders
            .iter()
            .map(|(id, sm)| (id.filter(|id| self.table.by_id(*id).is_some()), *sm))
            .collect()
    }

    /// This interval's energy per consumer, and where each is in `usage`
    /// (maps reused from interval to interval). Processes with energy but
    /// no CPU time this interval (a GPU job asleep on its CPU) are added
    /// to `usage`, to be reported like the others.
    fn energy_per_consumer(
        &mut self,
        shares: &[DomainShare],
        usage: &mut Vec<IntervalUsage>,
    ) -> (IntMap<ConsumerId, EnergyBy>, IntMap<ConsumerId, usize>) {
        let mut energy = std::mem::take(&mut self.scratch.energy);
        energy.clear();
        for s in shares {
            for (id, uj) in &s.attributed {
                energy.entry(*id).or_default().add(s.key.domain, *uj);
            }
            for (id, uj) in &s.attributed_static {
                energy.entry(*id).or_default().add_static(s.key.domain, *uj);
            }
        }
        let mut index = std::mem::take(&mut self.scratch.index);
        index.clear();
        index.extend(usage.iter().enumerate().map(|(i, u)| (u.id, i)));
        for id in energy.keys() {
            if index.contains_key(id) {
                continue;
            }
            if let Some(p) = self.table.by_id(*id) {
                index.insert(*id, usage.len());
                usage.push(IntervalUsage {
                    id: *id,
                    pid: p.pid,
                    role: p.role,
                    cgroup_id: p.cgroup_id,
                    on_cpu_ns: crate::tracker::PackageNs::zeros(self.package_ids.len().max(1)),
                    other_cgroups_ns: Vec::new(),
                });
            }
        }
        (energy, index)
    }

    /// Closes the stack profile's interval: each reported process's
    /// energy divided over its stacks (`--stacks`).
    fn close_stacks(
        &mut self,
        usage: &[IntervalUsage],
        energy: &IntMap<ConsumerId, EnergyBy>,
        at_ns: u64,
    ) {
        if self.stacks.is_some() {
            let tree_only = matches!(self.cfg.scope, Scope::Tree);
            let consumers: Vec<(u32, &str, EnergyBy)> = usage
                .iter()
                .filter(|u| (!tree_only || u.role == Role::Tree) && self.wanted(u.id, u.cgroup_id))
                .map(|u| {
                    (
                        u.pid,
                        self.table.by_id(u.id).map_or("", |p| p.comm.as_str()),
                        energy.get(&u.id).copied().unwrap_or_default(),
                    )
                })
                .collect();
            let want = self.stack_filter();
            if let Some(st) = self.stacks.as_mut() {
                st.drain(Some(at_ns), |pid| want(&self.table, pid));
                st.close(consumers.into_iter());
            }
        }
    }

    /// Each VM's energy (`monitor --vm-export`): its processes found by
    /// their cgroup, their ancestors and their command lines.
    fn sum_vms(&mut self, usage: &[IntervalUsage], energy: &IntMap<ConsumerId, EnergyBy>) {
        if let Some(vms) = &mut self.sums.vms {
            let table = &self.table;
            let procfs = &self.procfs;
            for u in usage {
                let e = energy.get(&u.id).copied().unwrap_or_default();
                let cgroup = self.sums.cgroups.path(u.cgroup_id);
                let chain = std::iter::successors(table.by_id(u.id), |p| {
                    p.ppid
                        .filter(|pp| *pp != p.pid)
                        .and_then(|pp| table.get(pp))
                })
                .map(|p| crate::sums::vms::ProcView {
                    pid: p.pid,
                    comm: &p.comm,
                });
                let cmdline = |pid: u32| procfs.cmdline(pid);
                vms.add(u.id, cgroup, chain, cmdline, &e, u.on_cpu_ns.iter().sum());
            }
        }
    }

    /// Forgets what is kept per process for processes the table has
    /// forgotten (their energy is in the group and cgroup sums), and
    /// prunes cgroups.
    fn forget_gone(&mut self, now_ns: u64) {
        // `monitor`: who used the energy is kept, exited or not (the top
        // consumers over the whole session, bounded), before the ledger
        // forgets them.
        let gone = self.table.take_forgotten();
        if let Scope::Machine { top, .. } = self.cfg.scope {
            let keep = top.max(100);
            for p in gone {
                self.keep_departed(&p, now_ns, keep);
            }
        }
        let table = &self.table;
        self.sums.forget(|id| table.by_id(id).is_some());
        let live = table.processes().map(|p| p.cgroup_id);
        self.sums.cgroups.prune(now_ns, live);
    }

    /// Sums this interval's energy per group (returned: this interval's
    /// per group) and per cgroup, and each cgroup's CPU time; keeps where
    /// each process was while reads are held.
    fn sum_groups_and_cgroups(
        &mut self,
        usage: &[IntervalUsage],
        energy: &IntMap<ConsumerId, EnergyBy>,
        index: &IntMap<ConsumerId, usize>,
        at_ns: u64,
    ) -> [EnergyBy; 3] {
        let origin = &self.held_origin;
        let groups =
            self.sums
                .add_interval(usage, energy, index, |id| origin.get(&id).copied(), at_ns);
        // While reads are held, where each process that ran was (its
        // record may be forgotten before the read that covers it comes);
        // at most a minute of processes (HELD_MAX_NS).
        if !self.held.any_live() {
            self.held_origin.clear();
        } else {
            self.held_origin
                .extend(usage.iter().map(|u| (u.id, (u.cgroup_id, u.role))));
        }
        groups
    }
}

/// One interval's CPU time per package.
struct Times {
    /// As the attribution divides it: task time, and idle (time carried
    /// in from the interval before included).
    packages: Vec<PackageTime>,
    /// As the kernel counts it: what static power is learned from.
    physical: Vec<PackageTime>,
    /// All CPUs' windows.
    window_ns: u64,
    /// All CPUs' task time (lost time included).
    busy_ns: u64,
    /// CPUs with a window.
    online: usize,
}

/// The sample's CPU time per package.
fn package_times(sample: &CpuSample, packages: usize) -> Times {
    let mut packages = vec![PackageTime::default(); packages.max(1)];
    // What the CPUs did by the kernel's own count (all but its idle
    // and iowait time, as `calibrate` fits): what the power followed,
    // and so what static power is learned from. With the iterator
    // tracker it holds what task clocks leave out (interrupts, waking
    // from idle: on the test VM about 2% of a CPU at low load, none
    // when the CPUs are saturated, which put a learned static figure
    // 1.5-6% high under load). Summed per package, then its busy part
    // taken (a CPU's 10 ms ticks can read more idle than its window).
    let mut physical = packages.clone();
    let mut online = 0;
    let (mut window_ns, mut busy_ns) = (0, 0);
    for c in &sample.cpus {
        window_ns += c.window_ns;
        // Lost time is task time too: a model's energy covers it.
        busy_ns += c.busy_ns + c.lost_ns;
        if let Some(s) = packages.get_mut(c.package as usize) {
            // Time carried in from the interval before was divided
            // there, with the threads that claimed it: here it is
            // divided as idle, so no dynamic energy goes unclaimed.
            let carried = c.carried_ns.min(c.busy_ns);
            s.busy_ns += c.busy_ns - carried;
            s.idle_ns += c.idle_ns + carried;
            s.lost_ns += c.lost_ns;
        }
        if let Some(s) = physical.get_mut(c.package as usize) {
            // Window and kernel idle for now; busy = window - idle
            // below.
            s.busy_ns += c.window_ns;
            s.idle_ns += c.idle_task_ns;
        }
        online += usize::from(c.window_ns > 0);
    }
    for s in &mut physical {
        let window = s.busy_ns;
        s.idle_ns = s.idle_ns.min(window);
        s.busy_ns = window - s.idle_ns;
    }
    Times {
        packages,
        physical,
        window_ns,
        busy_ns,
        online,
    }
}

/// A process's parent record and the `slurmstepd`s above it, for the
/// jobs no cgroup names ([`crate::sums::cgroups::Cgroups::v1_cgroups`]).
/// A parent that started after the process is a reused pid, not its
/// parent.
fn lineage<M: crate::process::ProcMeta>(
    table: &crate::process::ProcessTable<M>,
    id: u64,
) -> crate::sums::cgroups::Lineage {
    let up = |p: &crate::process::Process| {
        p.ppid
            .filter(|pp| *pp != p.pid)
            .and_then(|pp| table.get(pp))
            .filter(|parent| match (parent.start_ns, p.start_ns) {
                (Some(a), Some(b)) => a <= b,
                _ => true,
            })
    };
    let mut out = crate::sums::cgroups::Lineage::default();
    let Some(me) = table.by_id(id) else {
        return out;
    };
    // Itself still named slurmstepd: forked, not yet the job's program
    // nor its user's. Its parent only (a child gone at once takes the
    // parent's job), and a look again later.
    if me.comm == "slurmstepd" {
        out.parent = up(me).map(|p| p.id);
        out.again = true;
        return out;
    }
    let mut at = me;
    for _ in 0..64 {
        let Some(parent) = up(at) else {
            // Cut short by a parent the table does not have (it has not
            // run since wattprof started): it may yet.
            out.again |= at.ppid.is_some_and(|pp| pp > 1);
            break;
        };
        if out.parent.is_none() {
            out.parent = Some(parent.id);
        }
        if parent.comm == "slurmstepd" {
            out.stepds.push(parent.pid);
        }
        at = parent;
    }
    out
}
