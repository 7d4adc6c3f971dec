//! RAPL through the perf `power` PMU (`/sys/bus/event_source/devices/power`).
//!
//! Events `energy-pkg`, `energy-cores`, `energy-gpu`, `energy-ram` and
//! `energy-psys` are opened system-wide on one CPU per package (the PMU's
//! `cpumask`), with the scale and unit the PMU publishes. The kernel keeps
//! 64-bit totals, so only its own counter width matters here. Needs root
//! or `CAP_PERFMON` (or `kernel.perf_event_paranoid` at 0 or below).

use std::path::PathBuf;

use perf_event::{Builder, Counter, events::Dynamic};

use super::{
    Domain, DomainEnergy, Source, SourceError, SourceInfo,
    counter::{EnergyCounter, WrappingCounter},
};
use crate::topology::{SysRoot, Topology, parse_cpu_list};

/// The PMU's events and the domains they measure.
const EVENTS: &[(&str, Domain)] = &[
    ("energy-pkg", Domain::Package),
    ("energy-cores", Domain::Core),
    ("energy-gpu", Domain::Uncore),
    ("energy-ram", Domain::Dram),
    ("energy-psys", Domain::Psys),
];

struct Event {
    domain: Domain,
    package: Option<u32>,
    counter: Counter,
    energy: EnergyCounter,
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("domain", &self.domain)
            .field("package", &self.package)
            .finish_non_exhaustive()
    }
}

/// The perf `power` PMU reader.
#[derive(Debug)]
pub(crate) struct PerfPower {
    pmu: PathBuf,
    events: Vec<Event>,
}

fn unsupported(reason: String) -> SourceError {
    SourceError::unsupported(
        reason,
        "run wattprof as root (or with CAP_PERFMON); on bare metal the power PMU \
         comes with the intel_rapl / rapl perf driver",
    )
}

/// Keeps the events that count: watched until one moves (up to
/// [`COUNTS_WITHIN_SLOW`]), then a little longer for the rest; none
/// moving, or a read failing, is an error.
fn keep_counting(events: &mut Vec<Event>, pmu: &std::path::Path) -> Result<(), SourceError> {
    // A VM can list the PMU and open its events without the hardware
    // behind them (seen on a Firecracker guest: psys read 0 J for
    // good). RAPL's counters step about every millisecond; a VM's
    // virtual RAPL (QEMU's) refreshes once a second. So events are
    // watched until one moves, for up to COUNTS_WITHIN_SLOW, then a
    // little longer for the rest (COUNTS_WITHIN after the start); an
    // event that has not moved by then counts nothing and is dropped.
    let first: Vec<Option<u64>> = events.iter_mut().map(|e| e.counter.read().ok()).collect();
    let opened_at = std::time::Instant::now();
    let mut moved = vec![false; events.len()];
    let mut read_error = None;
    loop {
        for ((e, m), f) in events.iter_mut().zip(&mut moved).zip(&first) {
            match e.counter.read() {
                Ok(raw) => *m |= f.is_some_and(|f| f != raw),
                Err(err) => {
                    read_error.get_or_insert(format!("perf read: {err}"));
                }
            }
        }
        let waited = opened_at.elapsed();
        let any = moved.iter().any(|m| *m);
        if moved.iter().all(|m| *m)
            || (any && waited >= COUNTS_WITHIN)
            || waited >= COUNTS_WITHIN_SLOW
        {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    if let Some(err) = read_error {
        return Err(SourceError::unsupported(
            err,
            "check `perf stat -a -e power/energy-pkg/ sleep 1`",
        ));
    }
    if !moved.iter().any(|m| *m) {
        return Err(SourceError::unsupported(
            format!(
                "the perf power events in {} count nothing (a VM that lists the PMU without the hardware)",
                pmu.display()
            ),
            "another reader is used; on bare metal, check `perf stat -a -e power/energy-pkg/ sleep 1`",
        ));
    }
    // Events that count nothing beside ones that do are left out.
    let mut keep = moved.iter();
    events.retain(|_| *keep.next().unwrap_or(&false));
    Ok(())
}

impl PerfPower {
    /// Opens every energy event of the PMU at `sys`'s
    /// `bus/event_source/devices/power`, one counter per package.
    pub(crate) fn open(sys: &SysRoot) -> Result<Self, SourceError> {
        let pmu = sys.join("bus/event_source/devices/power");
        if !pmu.join("type").exists() {
            return Err(SourceError::unsupported(
                format!("no perf power PMU ({} is missing)", pmu.display()),
                "on bare metal: a kernel with CONFIG_PERF_EVENTS_INTEL_RAPL (Intel, AMD 17h+)",
            ));
        }
        let topology = Topology::read(sys).map_err(|e| SourceError::Fatal(e.to_string()))?;
        let cpumask = std::fs::read_to_string(pmu.join("cpumask"))
            .ok()
            .and_then(|t| parse_cpu_list(&t))
            .unwrap_or_else(|| vec![0]);
        let mut events = Vec::new();
        let mut first_error = None;
        for &(name, domain) in EVENTS {
            if !pmu.join("events").join(name).exists() {
                continue;
            }
            let Some(joules_per_step) = scale_of(&pmu, name) else {
                continue;
            };
            let mut builder = Dynamic::builder(&pmu)
                .map_err(|e| SourceError::Fatal(format!("{}: {e}", pmu.display())))?;
            let event = builder
                .event(name)
                .map_err(|e| SourceError::Fatal(format!("{name}: {e}")))?
                .build()
                .map_err(|e| SourceError::Fatal(format!("{name}: {e}")))?;
            // Platform energy is one counter for the machine.
            let cpus: &[u32] = if domain == Domain::Psys {
                &cpumask[..cpumask.len().min(1)]
            } else {
                &cpumask
            };
            for &cpu in cpus {
                let package = topology.package_id_of(cpu);
                let opened = Builder::new(event)
                    .one_cpu(cpu as usize)
                    .any_pid()
                    .include_kernel()
                    .include_hv()
                    .build()
                    .and_then(|mut c| c.enable().map(|()| c));
                match opened {
                    Ok(mut counter) => {
                        let mut energy =
                            EnergyCounter::new(WrappingCounter::bits(64), joules_per_step);
                        energy.advance(counter.read().unwrap_or(0));
                        events.push(Event {
                            domain,
                            package: (domain != Domain::Psys).then_some(package),
                            counter,
                            energy,
                        });
                    }
                    Err(e) => {
                        first_error
                            .get_or_insert(format!("perf_event_open {name} on CPU {cpu}: {e}"));
                    }
                }
            }
        }
        if events.is_empty() {
            return Err(unsupported(first_error.unwrap_or_else(|| {
                format!("no energy events in {}", pmu.display())
            })));
        }
        keep_counting(&mut events, &pmu)?;
        // The energy counted from here on (the probe's is not the
        // profile's).
        for e in &mut events {
            if let Ok(raw) = e.counter.read() {
                e.energy.advance(raw);
            }
        }
        Ok(Self { pmu, events })
    }
}

/// How long, once one event counted, the others may take to count their
/// first step (RAPL steps about every millisecond).
const COUNTS_WITHIN: std::time::Duration = std::time::Duration::from_millis(60);

/// How long the first event may take to count (a VM's virtual RAPL
/// refreshes once a second).
const COUNTS_WITHIN_SLOW: std::time::Duration = std::time::Duration::from_millis(1100);

/// `events/<name>.scale`: joules per count (an event without one cannot be
/// turned into energy and is skipped).
fn scale_of(pmu: &std::path::Path, name: &str) -> Option<f64> {
    std::fs::read_to_string(pmu.join("events").join(format!("{name}.scale")))
        .ok()?
        .trim()
        .parse()
        .ok()
        .filter(|s: &f64| s.is_finite() && *s > 0.0)
}

impl Source for PerfPower {
    fn name(&self) -> &'static str {
        "perf"
    }

    fn kind(&self) -> super::ReaderKind {
        super::ReaderKind::Cpu
    }

    fn info(&self) -> SourceInfo {
        SourceInfo {
            domains: self.events.iter().map(|e| (e.domain, e.package)).collect(),
            resolution_uj: self
                .events
                .iter()
                .map(|e| e.energy.joules_per_step() * 1e6)
                .reduce(f64::min),
            location: self.pmu.display().to_string(),
        }
    }

    /// Counters were read when probed, so even the first read reports the
    /// energy since then.
    fn read(&mut self) -> Result<Vec<DomainEnergy>, SourceError> {
        // All counters first: if one fails, none has advanced.
        let raws = self
            .events
            .iter_mut()
            .map(|e| {
                e.counter
                    .read()
                    .map_err(|err| SourceError::Retryable(format!("perf read: {err}")))
            })
            .collect::<Result<Vec<u64>, SourceError>>()?;
        Ok(self
            .events
            .iter_mut()
            .zip(raws)
            .map(|(e, raw)| DomainEnergy {
                domain: e.domain,
                package: e.package,
                energy_uj: e.energy.advance(raw).unwrap_or(0),
                estimated: false,
                busy_only: false,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::software_backed_power_pmu;

    #[test]
    fn opens_reads_and_scales_a_real_perf_counter() {
        if !crate::privilege::may_perf_system_wide() {
            skip_test!("system-wide perf counters need CAP_PERFMON");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        software_backed_power_pmu(dir.path());
        let mut perf = PerfPower::open(&SysRoot::at(dir.path())).expect("open");
        assert_eq!(perf.info().domains, vec![(Domain::Package, Some(0))]);
        let t = std::time::Instant::now();
        std::thread::sleep(std::time::Duration::from_millis(300));
        let uj = perf.read().expect("read")[0].energy_uj;
        let elapsed_us = t.elapsed().as_micros() as f64;
        // cpu-clock counts wall time on CPU 0 whatever runs there.
        let ratio = uj as f64 / elapsed_us;
        assert!(
            (0.9..=1.05).contains(&ratio),
            "{uj} µJ over {elapsed_us} µs"
        );
    }

    #[test]
    fn events_that_count_nothing_are_not_a_reader() {
        if !crate::privilege::may_perf_system_wide() {
            skip_test!("system-wide perf counters need CAP_PERFMON");
            return;
        }
        // As a Firecracker guest's psys: listed, opened, never counting
        // (here the dummy software event, 9, which counts nothing).
        let dir = tempfile::tempdir().expect("tempdir");
        software_backed_power_pmu(dir.path());
        std::fs::write(
            dir.path()
                .join("bus/event_source/devices/power/events/energy-pkg"),
            "event=0x09\n",
        )
        .expect("event");
        match PerfPower::open(&SysRoot::at(dir.path())) {
            Err(SourceError::NotSupported { reason, .. }) => {
                assert!(reason.contains("count nothing"), "{reason}")
            }
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("a counter that never moves was taken as a reader"),
        }
    }

    #[test]
    fn an_event_that_counts_nothing_beside_one_that_counts_is_left_out() {
        if !crate::privilege::may_perf_system_wide() {
            skip_test!("system-wide perf counters need CAP_PERFMON");
            return;
        }
        // A live package counter and a dead psys (the dummy event, 9).
        let dir = tempfile::tempdir().expect("tempdir");
        software_backed_power_pmu(dir.path());
        let events = dir.path().join("bus/event_source/devices/power/events");
        std::fs::write(events.join("energy-psys"), "event=0x09\n").expect("event");
        std::fs::write(events.join("energy-psys.scale"), "1e-9\n").expect("scale");
        let perf = PerfPower::open(&SysRoot::at(dir.path())).expect("open");
        assert_eq!(perf.info().domains, vec![(Domain::Package, Some(0))]);
    }

    #[test]
    fn no_power_pmu() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = PerfPower::open(&SysRoot::at(dir.path())).expect_err("none");
        match err {
            SourceError::NotSupported { reason, .. } => {
                assert!(reason.contains("no perf power PMU"))
            }
            other => panic!("{other:?}"),
        }
    }
}
