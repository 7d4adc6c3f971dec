//! NVML's per-process samples made trustworthy, and the driver quirks
//! that decide how they are asked for. Pure: no NVML calls here.

use std::collections::{HashMap, HashSet};

/// Whether a driver writes `_v3` process entries of another size than
/// NVML's header says (535.43 to 535.86; nvitop PRs 79 and 89).
pub(crate) fn v3_quirk(driver_version: &str) -> bool {
    let mut v = driver_version.trim().split('.');
    let major: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    let minor: u32 = v.next().and_then(|x| x.parse().ok()).unwrap_or(0);
    major == 535 && (43..=86).contains(&minor)
}

/// One raw per-process sample, as NVML returns it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
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
    /// Each kept process's share: its observations (each call's reading
    /// of its newest sample; see the sampler) summed over the interval's
    /// calls, a call without one of it counting 0. On an H200
    /// (driver 580) a sample is the process's SM use over about the last
    /// 2 s, revised while it is the newest, and under time-slicing the
    /// driver publishes one process per period (the one working then), so
    /// a process's time share is in its values, not in how many periods
    /// have one of it.
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
    /// Exact repeats within one call (counted by the sampler).
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

/// Keeps the observations that can be true: the pid is in the driver's
/// process list (`listed`; `None` when the list could not be read: any
/// pid but 0), SM at most 100, the timestamp in (`last_seen`, `now_us`].
/// Each process's share is the sum of its observations over the `polls`
/// of the interval (calls that observed some process), or over its own
/// observations where there were more: such a call that did not return a
/// process counts as 0 for it (it was not working then), so a process
/// that started within the interval is not weighted as if it had run all
/// of it; a call that returned nothing (no sample yet) does not count
/// (see [`Sanitised::shares`]).
pub(crate) fn sanitise(
    samples: &[RawSample],
    listed: Option<&[u32]>,
    (last_seen, now_us): (u64, u64),
    polls: u32,
) -> Sanitised {
    let mut out = Sanitised::default();
    // A set: a read can hold a day of samples against thousands of pids.
    let listed: Option<HashSet<u32>> = listed.map(|l| l.iter().copied().collect());
    let mut sums: HashMap<u32, (f64, u32)> = HashMap::new();
    for s in samples {
        if s.pid == 0 {
            out.pid0 += 1;
        } else if listed.as_ref().is_some_and(|l| !l.contains(&s.pid)) {
            out.not_listed += 1;
        } else if s.sm_util > 100 {
            out.sm_over_100 += 1;
        } else if s.timestamp <= last_seen || s.timestamp > now_us {
            out.bad_timestamp += 1;
        } else {
            let e = sums.entry(s.pid).or_default();
            e.0 += f64::from(s.sm_util);
            e.1 += 1;
            out.newest = Some(out.newest.map_or(s.timestamp, |n| n.max(s.timestamp)));
        }
    }
    out.shares = sums
        .into_iter()
        .map(|(pid, (sum, n))| (pid, round3(sum / f64::from(n.max(polls)))))
        .collect();
    out
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
    use std::collections::HashMap;

    use super::{RawSample, Sanitised, sanitise, v3_quirk};

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
            s(20, 3_000, 30),
            s(0, 3_000, 50),                 // pid 0
            s(99, 3_000, 90),                // not in the process list (exited)
            s(10, 3_000, 37_100),            // SM over 100 (nvtop issue 110)
            s(20, 1_000, 30),                // not after the last seen
            s(20, now + 86_400_000_000, 99), // in the future
        ];
        let c = sanitise(&raw, Some(&[10, 20]), (1_000, now), 0);
        // pid 10: (60 + 40) / 2; pid 20: its one observation.
        assert_eq!(c.shares.get(&10), Some(&50.0));
        assert_eq!(c.shares.get(&20), Some(&30.0));
        assert_eq!(c.shares.len(), 2);
        assert_eq!(
            (
                c.pid0,
                c.not_listed,
                c.sm_over_100,
                c.bad_timestamp,
                c.duplicates
            ),
            (1, 1, 1, 2, 0)
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
        let c = sanitise(&[s(7, 5, 20), s(0, 5, 20)], None, (0, 10), 0);
        assert_eq!(c.shares.get(&7), Some(&20.0));
        assert_eq!(c.pid0, 1);
        // Samples of a process that has just ended: dropped, not reported.
        let c = sanitise(&[s(7, 5, 20), s(8, 5, 20)], Some(&[7]), (0, 10), 0);
        assert_eq!((c.not_listed, c.discarded()), (1, None));
        let c = sanitise(&[s(7, 5, 20)], Some(&[7]), (0, 10), 0);
        assert_eq!(c.discarded(), None);
        assert_eq!(sanitise(&[], Some(&[7]), (0, 10), 0).newest, None);
    }

    #[test]
    fn a_share_is_the_mean_of_its_own_samples_and_a_revision_replaces_its_value() {
        // One process per period, as an H200 publishes them when contexts
        // take turns: a period without a sample of B says nothing of it.
        let raw = [
            s(10, 1_000_000, 60),
            s(20, 1_200_000, 30),
            s(10, 1_400_000, 62),
            s(20, 1_600_000, 28),
            s(10, 1_800_000, 58),
        ];
        let c = sanitise(&raw, None, (0, 2_000_000), 0);
        assert_eq!(c.shares.get(&10), Some(&60.0));
        assert_eq!(c.shares.get(&20), Some(&29.0));
        // The same timestamp again with another value (the driver revises
        // its newest sample): each observation counts, no problem.
        let raw = [
            s(10, 1_000_000, 36),
            s(10, 1_000_000, 39),
            s(10, 1_200_000, 45),
        ];
        let c = sanitise(&raw, None, (0, 2_000_000), 0);
        assert_eq!(c.shares.get(&10), Some(&40.0));
        assert_eq!(c.discarded(), None);
        // Small shares keep their weight.
        let mut raw: Vec<RawSample> = (0..300).map(|k| s(20, 1_000 + k * 200_000, 50)).collect();
        raw.push(s(10, 1_000, 1));
        let c = sanitise(&raw, None, (0, u64::MAX), 0);
        assert_eq!(c.shares.get(&10), Some(&1.0));
    }

    #[test]
    fn a_process_seen_in_few_of_the_calls_is_weighted_by_all_of_them() {
        // B works at 50% all interval; A started in its last tenth, at
        // 50%: ten calls, A in one of them.
        let mut raw: Vec<RawSample> = (0..10).map(|k| s(20, 1_000 + k * 100_000, 50)).collect();
        raw.push(s(10, 950_000, 50));
        let c = sanitise(&raw, None, (0, 2_000_000), 10);
        assert_eq!(c.shares.get(&20), Some(&50.0));
        assert_eq!(c.shares.get(&10), Some(&5.0));
        // More observations of a process than calls counted (a caller
        // that counts none): its own mean.
        let c = sanitise(&raw, None, (0, 2_000_000), 0);
        assert_eq!(c.shares.get(&10), Some(&50.0));
    }

    /// The H200's own samples of two processes taking turns 2:1
    /// (testdata/h200-turns-2to1.txt), observed as the sampler does: every
    /// 100 ms, each process's newest sample as it read then, if within the
    /// look-back of the newest seen; read every `read_ms`. The summed
    /// shares of the reads both worked through (the first 2 s, while the
    /// samples' window fills, and the last second left out).
    fn replayed_h200_turns(read_ms: u64, keep: impl Fn(&[RawSample], u32) -> Sanitised) -> f64 {
        let rows: Vec<(u32, u64, u32, u64)> = include_str!("testdata/h200-turns-2to1.txt")
            .lines()
            .filter(|l| !l.starts_with('#'))
            .map(|l| {
                let f: Vec<&str> = l.split(' ').collect();
                // Timestamps from 10 s on: the file's start at -5.5 s.
                let n = |i: usize| (f[i].parse::<i64>().expect("a number") + 10_000_000) as u64;
                (
                    if f[0] == "A" { 10 } else { 20 },
                    n(1),
                    f[2].parse().expect("SM"),
                    n(3),
                )
            })
            .collect();
        let end = rows.iter().map(|r| r.3).max().expect("rows");
        let mut newest: HashMap<u32, (u64, u32)> = HashMap::new();
        let (mut last_seen, mut next) = (0u64, 0usize);
        let (mut read, mut a, mut b) = (Vec::new(), 0.0, 0.0);
        let start = 10_000_000;
        let mut t = start;
        while t <= end {
            while next < rows.len() && rows[next].3 <= t {
                let (pid, ts, sm, _) = rows[next];
                if newest.get(&pid).is_none_or(|n| ts >= n.0) {
                    newest.insert(pid, (ts, sm));
                }
                last_seen = last_seen.max(ts);
                next += 1;
            }
            for (&pid, &(ts, sm)) in &newest {
                // The sampler's look-back: a second.
                if ts > last_seen.saturating_sub(1_000_000) {
                    read.push(s(pid, ts, sm));
                }
            }
            t += 100_000;
            if (t - start) % (read_ms * 1000) == 0 {
                let c = keep(&read, (read_ms / 100) as u32);
                read.clear();
                if t > start + 2_000_000 && t + 1_000_000 <= end {
                    let (x, y) = (c.shares[&10], c.shares[&20]);
                    a += x / (x + y);
                    b += y / (x + y);
                }
            }
        }
        a / b
    }

    #[test]
    fn the_h200s_own_samples_of_2_to_1_turns_split_2_to_1_every_second_and_every_100_ms() {
        // Their busy times: 8.35 s and 3.99 s.
        let truth = 8.35 / 3.99;
        for read_ms in [1000, 100] {
            let ratio =
                replayed_h200_turns(read_ms, |r, polls| sanitise(r, None, (0, u64::MAX), polls));
            assert!(
                (ratio / truth - 1.0).abs() < 0.03,
                "{read_ms} ms: {ratio} vs {truth}"
            );
        }
        // Each distinct value once, over the periods sampled (the rule
        // before these samples were seen), is far off.
        let counted = replayed_h200_turns(1000, |r, _| {
            let mut c = Sanitised::default();
            let mut seen = std::collections::HashSet::new();
            let distinct: Vec<&RawSample> = r.iter().filter(|x| seen.insert(**x)).collect();
            let periods = distinct.len().max(1) as f64;
            for x in distinct {
                *c.shares.entry(x.pid).or_default() += f64::from(x.sm_util) / periods;
            }
            c.shares.entry(10).or_default();
            c.shares.entry(20).or_default();
            c
        });
        assert!((counted / truth - 1.0).abs() > 0.10, "{counted}");
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
