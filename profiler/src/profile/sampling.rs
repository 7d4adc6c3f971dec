//! The sampling loop of `run` and `monitor`: close an interval on every
//! tick, and between ticks sleep until the tracker's ring, or a file the
//! caller watches (the command's pidfd, the window socket), has something.

use std::os::fd::RawFd;
use std::time::Duration;

use super::Profile;
use crate::tracker::{CpuSampler, EventRing, monotonic_ns};

/// After the ring wakes the loop, how long it waits before the next drain
/// (still waking at once for the caller's files): records come one wake-up
/// each, so they are taken in batches. The ring holds ~30,000 records, far
/// more than 10 ms of forks.
const DRAIN_BATCH: Duration = Duration::from_millis(10);

/// The longest sleep: what the caller checks between wake-ups (a signal
/// flag, a child without a pidfd) is looked at at least this often.
const MAX_SLEEP_MS: i32 = 200;

/// When intervals close: every `interval_ns` from the start, skipping the
/// ticks a slow interval missed (ticks stay on the grid: the interval
/// after a late tick is shorter), or, with [`Ticker::full_periods`], a
/// whole period after the last tick, late or not.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Ticker {
    interval_ns: u64,
    next_ns: u64,
    /// After a late tick, the next is a whole period after it (off the
    /// grid): no interval is ever shorter than the period. The daemon's
    /// users get figures over whole intervals, and a short one would be a
    /// finer read than the period allows (`monitor --serve`).
    full_periods: bool,
}

impl Ticker {
    /// Ticks every `interval_ns` (at least 1 ns) after `start_ns`.
    pub(crate) fn new(start_ns: u64, interval_ns: u64) -> Self {
        let interval_ns = interval_ns.max(1);
        Self {
            interval_ns,
            next_ns: start_ns + interval_ns,
            full_periods: false,
        }
    }

    /// Never an interval shorter than the period (see `full_periods`).
    pub(crate) fn full_periods(self) -> Self {
        Self {
            full_periods: true,
            ..self
        }
    }

    /// Whether an interval closes at `now_ns`; if so, the next tick is
    /// set, past any ticks already missed.
    pub(crate) fn due(&mut self, now_ns: u64) -> bool {
        if now_ns < self.next_ns {
            return false;
        }
        // Late by more than a hundredth of the period: the next a whole
        // period after this one (an on-time tick stays on the grid).
        if self.full_periods && now_ns - self.next_ns > self.interval_ns / 100 {
            self.next_ns = now_ns + self.interval_ns;
            return true;
        }
        let missed = (now_ns - self.next_ns) / self.interval_ns;
        self.next_ns += self.interval_ns * (missed + 1);
        true
    }

    /// Ticks every `interval_ns` from now on: the next tick is the last
    /// one plus the new period (at once if that has passed).
    pub(crate) fn set_interval(&mut self, interval_ns: u64) {
        let interval_ns = interval_ns.max(1);
        self.next_ns = self.next_ns - self.interval_ns + interval_ns;
        self.interval_ns = interval_ns;
    }

    /// Time left until the next tick.
    pub(crate) fn until(&self, now_ns: u64) -> Duration {
        Duration::from_nanos(self.next_ns.saturating_sub(now_ns))
    }
}

/// What the caller does in the loop.
pub(crate) trait Hooks<S> {
    /// Files to wake on besides the ring (each `POLLIN`).
    fn fds(&self) -> Vec<RawFd>;
    /// Whether to stop now, before anything else (a signal, a deadline):
    /// looked at on every pass, so a loop that cannot keep up with its
    /// ticks still ends. `woke` can stop it too.
    fn done(&mut self, _now_ns: u64) -> bool {
        false
    }
    /// The longest sleep from `now_ns` (a deadline, a flag to look at).
    fn max_sleep_ms(&self, _now_ns: u64) -> i32 {
        MAX_SLEEP_MS
    }
    /// The interval from now on, where the caller changes it (`top`'s
    /// `+` and `-`).
    fn interval_ns(&self) -> Option<u64> {
        None
    }
    /// After each interval closed on a tick.
    fn after_interval(&mut self, profile: &mut Profile, now_ns: u64) -> anyhow::Result<()>;
    /// After a wake-up; `ready[i]` says whether `fds()[i]` was readable.
    /// May close an extra interval itself (a window boundary). Returns
    /// whether to stop.
    fn woke(
        &mut self,
        ready: &[bool],
        profile: &mut Profile,
        sampler: &mut S,
    ) -> anyhow::Result<bool>;
}

/// Runs the loop from the profile's start until `hooks` says stop.
pub(crate) fn sample_until<S: CpuSampler + EventRing, H: Hooks<S>>(
    profile: &mut Profile,
    sampler: &mut S,
    ticker: &mut Ticker,
    hooks: &mut H,
) -> anyhow::Result<()> {
    loop {
        let now = monotonic_ns();
        if hooks.done(now) {
            return Ok(());
        }
        if let Some(ns) = hooks.interval_ns().filter(|ns| *ns != ticker.interval_ns) {
            ticker.set_interval(ns);
        }
        if ticker.due(now) {
            profile.tick(sampler, false)?;
            hooks.after_interval(profile, now)?;
            continue;
        }
        let timeout_ms = (ticker.until(now).as_millis() as i32)
            .min(hooks.max_sleep_ms(now))
            .min(profile.max_sleep_ms())
            .max(1);
        let extra = hooks.fds();
        let ring = sampler.ring_fd();
        let mut fds: Vec<libc::pollfd> = ring
            .iter()
            .chain(&extra)
            .map(|fd| libc::pollfd {
                fd: *fd,
                events: libc::POLLIN,
                revents: 0,
            })
            .collect();
        // SAFETY: `fds` is a valid array of pollfd. EINTR (a signal) just
        // ends the wait.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        let offset = usize::from(ring.is_some());
        let ready: Vec<bool> = fds[offset..offset + extra.len()]
            .iter()
            .map(|p| n > 0 && p.revents != 0)
            .collect();
        if hooks.woke(&ready, profile, sampler)? {
            return Ok(());
        }
        sampler.drain();
        profile.drain_stacks();
        if n > 0 && ring.is_some() && fds[0].revents != 0 {
            let wait = DRAIN_BATCH.min(ticker.until(monotonic_ns()));
            let mut watch: Vec<libc::pollfd> = extra
                .iter()
                .map(|fd| libc::pollfd {
                    fd: *fd,
                    events: libc::POLLIN,
                    revents: 0,
                })
                .collect();
            // SAFETY: a valid (possibly empty) array of pollfd: with none,
            // this sleeps.
            unsafe {
                libc::poll(
                    watch.as_mut_ptr(),
                    watch.len() as libc::nfds_t,
                    wait.as_millis() as i32,
                )
            };
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Ticker;

    #[test]
    fn a_tick_comes_each_period_and_missed_ones_are_skipped() {
        let mut t = Ticker::new(1_000, 100);
        assert!(!t.due(1_099));
        assert!(t.due(1_100));
        assert!(!t.due(1_150));
        assert_eq!(t.until(1_150).as_nanos(), 50);
        // A slow interval: ticks at 1,200..1,400 missed; the next is 1,500.
        assert!(t.due(1_420));
        assert_eq!(t.until(1_420).as_nanos(), 80);
        assert!(!t.due(1_499));
        assert!(t.due(1_500));
    }

    #[test]
    fn with_full_periods_a_late_tick_puts_the_next_a_period_after_it() {
        let mut t = Ticker::new(1_000, 100).full_periods();
        assert!(t.due(1_100));
        assert!(t.due(1_200), "on time: on the grid");
        assert!(t.due(1_360), "late by 60");
        assert!(
            !t.due(1_459),
            "a whole period after the late tick, not 1,400"
        );
        assert!(t.due(1_460));
    }

    #[test]
    fn a_new_interval_counts_from_the_last_tick() {
        let mut t = Ticker::new(0, 1_000);
        assert!(t.due(1_000));
        t.set_interval(200);
        assert!(!t.due(1_199));
        assert!(t.due(1_200));
        t.set_interval(5_000);
        assert!(!t.due(6_199));
        assert!(t.due(6_200));
        // Shorter than the time since the last tick: due at once.
        t.set_interval(100);
        assert!(t.due(6_700));
    }
}
