//! NVML's per-process samples made trustworthy, and the driver quirks
//! that decide how they are asked for. Pure: no NVML calls here.

use std::collections::{HashMap, HashSet};

/// Samples of different processes less than this apart (µs) are of one
/// driver period: the driver's fastest period is 1/6 s.
const SAME_PERIOD_US: u64 = 50_000;

/// Whether a driver writes `_v3` process entries of another size than
/// NVML's header says (535.43 to 535.86; nvitop PRs 79 and 89).
pub(crate) fn v3_quirk(driver_version: &str) -> bool {
    let mut v = driver_version.trim().split('.');
    let major: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let minor: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    major == 535 && (43..=86).contains(&minor)
}

/// One raw per-process sample, as NVML returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawSample {
    /// Process id.
    pub(crate) pid: u32,
    /// CPU timestamp, µs since the epoch.
    pub(crate) timestamp: u64,
    /// SM utilization, percent.
    pub(crate) sm_util: u32,
}

/// What [`sanitise`] kept and discarded.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Sanitised {
    /// Each kept process's SM over the driver's sampling periods the
    /// samples cover: the sum of its samples over the number of periods
    /// in which NVML sampled any process (timestamps less than 50 ms apart
    /// are one period). A period in which NVML did not sample a process is
    /// one in which it did not use the SM, so it counts as 0.
    pub(crate) shares: HashMap<u32, f64>,
    /// The newest kept timestamp (the next `lastSeenTimeStamp`).
    pub(crate) newest: Option<u64>,
    /// Discarded: pid 0.
    pub(crate) pid0: u32,
    /// Discarded: not in the process list (ended, or never a holder).
    pub(crate) not_listed: u32,
    /// Discarded: SM over 100.
    pub(crate) sm_over_100: u32,
    /// Discarded: not after the last seen, or in the future.
    pub(crate) bad_timestamp: u32,
    /// Exact duplicates dropped.
    pub(crate) duplicates: u32,
}

impl Sanitised {
    /// What was discarded, for a problem line; `None` when nothing was.
    pub(crate) fn discarded(&self) -> Option<String> {
        // A pid no longer in the process list is a process that just
        // ended (its last samples come after): dropped, not a problem;
        // pid 0 never is a process.
        let parts: Vec<String> = [
            (self.pid0, "of pid 0"),
            (self.sm_over_100, "with SM over 100%"),
            (
                self.bad_timestamp,
                "with a timestamp not after the last seen or in the future",
            ),
            (self.duplicates, "duplicated"),
        ]
        .iter()
        .filter(|(n, _)| *n > 0)
        .map(|(n, what)| format!("{n} {what}"))
        .collect();
        (!parts.is_empty()).then(|| format!("NVML samples discarded: {}", parts.join(", ")))
    }
}

/// Keeps the samples that can be true: the pid is in the driver's process
/// list (`listed`; `None` when the list could not be read: any pid but 0),
/// SM at most 100, the timestamp in (`last_seen`, `now_us`]; exact
/// duplicates once. Each process's share is its SM summed over the
/// periods sampled, over their number (see [`Sanitised::shares`]).
pub(crate) fn sanitise(
    samples: &[RawSample],
    listed: Option<&[u32]>,
    last_seen: u64,
    now_us: u64,
) -> Sanitised {
    let mut out = Sanitised::default();
    // A set: a read can hold a day of samples against thousands of pids.
    let listed: Option<HashSet<u32>> = listed.map(|l| l.iter().copied().collect());
    let mut seen: HashSet<(u32, u64, u32)> = HashSet::new();
    let mut kept: Vec<RawSample> = Vec::new();
    for s in samples {
        if s.pid == 0 {
            out.pid0 += 1;
        } else if listed.as_ref().is_some_and(|l| !l.contains(&s.pid)) {
            out.not_listed += 1;
        } else if s.sm_util > 100 {
            out.sm_over_100 += 1;
        } else if s.timestamp <= last_seen || s.timestamp > now_us {
            out.bad_timestamp += 1;
        } else if !seen.insert((s.pid, s.timestamp, s.sm_util)) {
            out.duplicates += 1;
        } else {
            kept.push(*s);
            out.newest = Some(out.newest.map_or(s.timestamp, |n| n.max(s.timestamp)));
        }
    }
    let (sums, periods) = period_sums(&mut kept);
    out.shares = sums
        .into_iter()
        .map(|(pid, sum)| (pid, round3(sum / periods as f64)))
        .collect();
    out
}

/// Each process's SM summed over the driver periods of `samples`
/// (timestamps less than [`SAME_PERIOD_US`] after a period's first are of
/// that period, unless its process already has one there), and the number of periods (never fewer than one
/// process's own samples, nor 0).
///
/// Contexts of different processes time-slice: in one period their SM
/// cannot add up to more than 100%. Samples that do are each the SM
/// activity of a process *while it ran* (an H200 read about 92% for
/// either of two processes taking turns, whatever their share of the
/// period), so that period is split between them in proportion to their
/// samples, and together they weigh what the busiest of them read.
/// Without this, a process that ran a sliver of many periods weighed as
/// one that ran all of them.
fn period_sums(samples: &mut [RawSample]) -> (HashMap<u32, f64>, u64) {
    samples.sort_unstable_by_key(|s| s.timestamp);
    let mut sums: HashMap<u32, f64> = HashMap::new();
    let mut own: HashMap<u32, u64> = HashMap::new();
    let mut periods = 0u64;
    let mut rest = &samples[..];
    while let Some(first) = rest.first() {
        // A period ends 50 ms after its first sample, or at a second
        // sample of a process it already has (the driver gives one per
        // process per period).
        let mut pids: Vec<u32> = Vec::new();
        let n = rest
            .iter()
            .position(|s| {
                let next = s.timestamp - first.timestamp >= SAME_PERIOD_US || pids.contains(&s.pid);
                pids.push(s.pid);
                next
            })
            .unwrap_or(rest.len());
        let (period, tail) = rest.split_at(n);
        rest = tail;
        periods += 1;
        let total: u64 = period.iter().map(|s| u64::from(s.sm_util)).sum();
        let busiest = period.iter().map(|s| s.sm_util).max().unwrap_or(0);
        let scale = if total > 100 {
            f64::from(busiest) / total as f64
        } else {
            1.0
        };
        for s in period {
            *sums.entry(s.pid).or_default() += f64::from(s.sm_util) * scale;
            *own.entry(s.pid).or_default() += 1;
        }
    }
    let periods = own.values().copied().fold(periods, u64::max).max(1);
    (sums, periods)
}

/// To 0.001 of a percent, the attribution's weight unit.
pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Whether a sample's timestamp may become the next `lastSeenTimeStamp`:
/// a real process, SM at most 100, not in the future (a far-future one
/// would make every later call NOT_FOUND).
pub(crate) fn plausible(s: &RawSample, now_us: u64) -> bool {
    s.pid != 0 && s.sm_util <= 100 && s.timestamp <= now_us
}

#[cfg(test)]
mod tests {
    use super::{RawSample, sanitise, v3_quirk};

    fn s(pid: u32, timestamp: u64, sm_util: u32) -> RawSample {
        RawSample {
            pid,
            timestamp,
            sm_util,
        }
    }

    #[test]
    fn samples_that_cannot_be_true_are_discarded_and_the_rest_averaged() {
        let now = 10_000;
        let raw = [
            s(10, 2_000, 60),
            s(10, 3_000, 40),
            s(10, 3_000, 40), // an exact duplicate: once
            s(20, 3_000, 30),
            s(0, 3_000, 50),                 // pid 0
            s(99, 3_000, 90),                // not in the process list (exited)
            s(10, 3_000, 37_100),            // SM over 100 (nvtop issue 110)
            s(20, 1_000, 30),                // not after the last seen
            s(20, now + 86_400_000_000, 99), // in the future
        ];
        let c = sanitise(&raw, Some(&[10, 20]), 1_000, now);
        // pid 10: (60 + 40) / 2, not weighted by its duplicate; pid 20 was
        // sampled in one of the two periods (in the other it did not use
        // the SM): 30 / 2.
        assert_eq!(c.shares.get(&10), Some(&50.0));
        assert_eq!(c.shares.get(&20), Some(&15.0));
        assert_eq!(c.shares.len(), 2);
        assert_eq!(
            (
                c.pid0,
                c.not_listed,
                c.sm_over_100,
                c.bad_timestamp,
                c.duplicates
            ),
            (1, 1, 1, 2, 1)
        );
        // The next lastSeenTimeStamp is the newest sane one, never the
        // future one.
        assert_eq!(c.newest, Some(3_000));
        let line = c.discarded().expect("said");
        assert!(line.contains("1 of pid 0"), "{line}");
        assert!(
            !line.contains("process list"),
            "an ended process is no problem: {line}"
        );
        assert!(line.contains("1 with SM over 100%"), "{line}");
    }

    #[test]
    fn with_no_process_list_any_pid_but_0_is_kept_and_clean_samples_say_nothing() {
        let c = sanitise(&[s(7, 5, 20), s(0, 5, 20)], None, 0, 10);
        assert_eq!(c.shares.get(&7), Some(&20.0));
        assert_eq!(c.pid0, 1);
        // Samples of a process that has just ended: dropped, not reported.
        let c = sanitise(&[s(7, 5, 20), s(8, 5, 20)], Some(&[7]), 0, 10);
        assert_eq!((c.not_listed, c.discarded()), (1, None));
        let c = sanitise(&[s(7, 5, 20)], Some(&[7]), 0, 10);
        assert_eq!(c.discarded(), None);
        assert_eq!(sanitise(&[], Some(&[7]), 0, 10).newest, None);
    }

    #[test]
    fn a_share_counts_every_period_any_process_was_sampled_in() {
        // A sampled in three driver periods (200 ms apart), B in the
        // middle one only, its timestamp 20 µs off A's: one period, in
        // which they time-sliced (90 + 90 > 100): 45 each.
        let raw = [
            s(10, 1_000_000, 90),
            s(10, 1_200_000, 90),
            s(20, 1_200_020, 90),
            s(10, 1_400_000, 90),
        ];
        let c = sanitise(&raw, Some(&[10, 20]), 0, 2_000_000);
        assert_eq!(c.shares.get(&10), Some(&75.0));
        assert_eq!(c.shares.get(&20), Some(&15.0));
        // Under 100 together they ran side by side: as they read.
        let raw = [s(10, 1_000_000, 60), s(20, 1_000_010, 30)];
        let c = sanitise(&raw, None, 0, 2_000_000);
        assert_eq!(
            (c.shares.get(&10), c.shares.get(&20)),
            (Some(&60.0), Some(&30.0))
        );
        // Periods in which only B was sampled count for A as 0.
        let raw = [
            s(10, 1_000_000, 60),
            s(20, 1_200_000, 30),
            s(20, 1_400_000, 30),
        ];
        let c = sanitise(&raw, None, 0, 2_000_000);
        assert_eq!(c.shares.get(&10), Some(&20.0));
        assert_eq!(c.shares.get(&20), Some(&20.0));
        // Small shares keep their weight: 1% in one period of 300.
        let mut raw: Vec<RawSample> = (0..300).map(|k| s(20, 1_000 + k * 200_000, 50)).collect();
        raw.push(s(10, 1_000, 1));
        let c = sanitise(&raw, None, 0, u64::MAX);
        assert_eq!(c.shares.get(&10), Some(&0.003));
    }

    /// Two processes taking turns `a_ms`/`b_ms` sampled every `period_ms`
    /// as the H200 showed under time-slicing: 92% for each process that
    /// had any kernel in the period.
    fn turns(a_ms: u64, b_ms: u64, period_ms: u64, secs: u64) -> Vec<RawSample> {
        let cycle = a_ms + b_ms;
        let mut out = Vec::new();
        // A 1 ms grid: which process ran in each millisecond.
        for k in 1..=(secs * 1000 / period_ms) {
            let (from, to) = ((k - 1) * period_ms, k * period_ms);
            let ran = |pid_a: bool| (from..to).any(|t| ((t % cycle) < a_ms) == pid_a);
            let ts = 1_000_000 + to * 1000;
            if ran(true) {
                out.push(s(10, ts, 92));
            }
            if ran(false) {
                out.push(s(20, ts + 3, 92));
            }
        }
        out
    }

    #[test]
    fn time_sliced_turns_split_by_time_not_by_the_periods_touched() {
        // 600/300 ms turns, a sample every 200 ms: A touches 8 periods of
        // 9 and B 5, so counting periods gives 1.6:1; splitting the
        // shared periods gives the true 2:1.
        let c = sanitise(&turns(600, 300, 200, 90), None, 0, u64::MAX);
        let ratio = c.shares[&10] / c.shares[&20];
        assert!((ratio / 2.0 - 1.0).abs() < 0.01, "{ratio}");
        // 2 s / 1 s turns at the 1/6 s period.
        let c = sanitise(&turns(2000, 1000, 167, 300), None, 0, u64::MAX);
        let ratio = c.shares[&10] / c.shares[&20];
        assert!((ratio / 2.0 - 1.0).abs() < 0.02, "{ratio}");
    }

    #[test]
    fn the_v3_quirk_is_drivers_535_43_to_535_86() {
        for (v, quirk) in [
            ("535.43.02", true),
            ("535.54.03", true),
            ("535.86.10", true),
            ("535.42.00", false),
            ("535.104.05", false),
            ("550.54.15", false),
            ("525.60.13", false),
            ("garbage", false),
        ] {
            assert_eq!(v3_quirk(v), quirk, "{v}");
        }
    }
}
