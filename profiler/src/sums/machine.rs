//! Per-CPU time over a profile: what the tracker's samples add up to,
//! closed so each CPU's busy, idle and lost time make its window.

use crate::model::MachineReport;
use crate::tracker::{CpuSample, CpuTimes};

/// Per-CPU times accumulated over a run.
#[derive(Clone, Debug, Default)]
pub(crate) struct MachineTimes {
    cpus: Vec<CpuTimes>,
    events_lost: u64,
    discarded_ns: u64,
    samples: u64,
}

impl MachineTimes {
    /// Adds one sample's CPU times.
    pub(crate) fn add(&mut self, sample: &CpuSample) {
        if self.cpus.len() < sample.cpus.len() {
            self.cpus.resize(sample.cpus.len(), CpuTimes::default());
        }
        for (acc, c) in self.cpus.iter_mut().zip(&sample.cpus) {
            acc.cpu = c.cpu;
            acc.package = c.package;
            acc.busy_ns += c.busy_ns;
            acc.idle_ns += c.idle_ns;
            acc.idle_task_ns += c.idle_task_ns;
            acc.lost_ns += c.lost_ns;
            acc.switches += c.switches;
            acc.window_ns += c.window_ns;
            acc.carried_ns += c.carried_ns;
            acc.over_ns += c.over_ns;
        }
        self.events_lost += sample.events_lost;
        self.discarded_ns += sample.discarded_ns;
        self.samples += 1;
    }

    fn sum(&self, f: impl Fn(&CpuTimes) -> u64) -> u64 {
        self.cpus.iter().map(f).sum()
    }
}

/// Per-CPU totals that close: task time handed out late (a thread's
/// final time from a free that came intervals after it ran, its exit
/// record lost) lands in the interval it arrives in, whose CPUs may have
/// no room left; it ran earlier, in time those intervals counted as idle.
/// Over the profile it is taken back from that idle: busy above a CPU's
/// window goes to CPUs of its package with idle room, and each CPU's idle
/// is its window less busy and lost time. Busy time stays exactly the
/// threads'; only if a package's threads had more time than its CPUs'
/// windows (never, but for a clock's ppm) does a CPU stay over.
fn closed(cpus: &[CpuTimes]) -> Vec<CpuTimes> {
    let mut out = cpus.to_vec();
    let mut packages: Vec<u32> = out.iter().map(|c| c.package).collect();
    packages.sort_unstable();
    packages.dedup();
    for p in packages {
        let members: Vec<usize> = (0..out.len()).filter(|i| out[*i].package == p).collect();
        let mut over = 0;
        for &i in &members {
            let c = &mut out[i];
            let x = (c.busy_ns + c.lost_ns)
                .saturating_sub(c.window_ns)
                .min(c.busy_ns);
            c.busy_ns -= x;
            over += x;
        }
        for &i in &members {
            let c = &mut out[i];
            let take = c.window_ns.saturating_sub(c.busy_ns + c.lost_ns).min(over);
            c.busy_ns += take;
            over -= take;
        }
        if let Some(&first) = members.first() {
            out[first].busy_ns += over;
        }
        for &i in &members {
            let c = &mut out[i];
            c.idle_ns = c.window_ns.saturating_sub(c.busy_ns + c.lost_ns);
        }
    }
    out
}

impl MachineTimes {
    /// The machine section of a report.
    pub(crate) fn report(&self, package_ids: Vec<u32>, attributed_ns: u64) -> MachineReport {
        let cpus = closed(&self.cpus);
        let sum = |f: fn(&CpuTimes) -> u64| cpus.iter().map(f).sum();
        MachineReport {
            cpus: cpus.len(),
            package_ids,
            busy_ns: sum(|c| c.busy_ns),
            idle_ns: sum(|c| c.idle_ns),
            idle_task_ns: sum(|c| c.idle_task_ns),
            window_ns: sum(|c| c.window_ns),
            attributed_ns,
            switches: sum(|c| c.switches),
            carried_ns: sum(|c| c.over_ns),
            per_cpu: cpus,
        }
    }

    /// Busy, idle and lost time over all CPUs (closed, as in the report).
    pub(crate) fn totals(&self) -> (u64, u64, u64) {
        let cpus = closed(&self.cpus);
        (
            cpus.iter().map(|c| c.busy_ns).sum(),
            cpus.iter().map(|c| c.idle_ns).sum(),
            cpus.iter().map(|c| c.lost_ns).sum(),
        )
    }

    /// Lost task time over all CPUs.
    pub(crate) fn lost_ns(&self) -> u64 {
        self.sum(|c| c.lost_ns)
    }

    /// Ring-buffer records lost, time discarded, samples taken.
    pub(crate) fn health(&self) -> (u64, u64, u64) {
        (self.events_lost, self.discarded_ns, self.samples)
    }
}

#[cfg(test)]
mod closed_tests {
    use super::{CpuTimes, closed};

    fn cpu(cpu: u32, package: u32, busy: u64, idle: u64, lost: u64, window: u64) -> CpuTimes {
        CpuTimes {
            cpu,
            package,
            busy_ns: busy,
            idle_ns: idle,
            lost_ns: lost,
            window_ns: window,
            ..CpuTimes::default()
        }
    }

    #[test]
    fn late_task_time_is_taken_back_from_idle_within_its_package() {
        // CPU 0 got 30 ns of a thread's time late, above its window; CPU 1
        // counted 50 idle; package 1 is untouched.
        let cpus = closed(&[
            cpu(0, 0, 1_030, 0, 0, 1_000),
            cpu(1, 0, 950, 50, 0, 1_000),
            cpu(2, 1, 400, 500, 100, 1_000),
        ]);
        let busy: Vec<u64> = cpus.iter().map(|c| c.busy_ns).collect();
        assert_eq!(busy, vec![1_000, 980, 400]);
        for c in &cpus {
            assert_eq!(c.busy_ns + c.idle_ns + c.lost_ns, c.window_ns, "{c:?}");
        }
        // Busy time is the threads', all of it.
        assert_eq!(busy.iter().sum::<u64>(), 1_030 + 950 + 400);
        // Over the package's capacity: kept, on its first CPU.
        let cpus = closed(&[cpu(0, 0, 1_100, 0, 0, 1_000), cpu(1, 0, 1_000, 0, 0, 1_000)]);
        assert_eq!((cpus[0].busy_ns, cpus[1].busy_ns), (1_100, 1_000));
    }
}
