//! What `wattprof sources` reports: every reader probed in the
//! registry's order, read twice to compare them (`--check`), a wattmeter
//! read, and NVML.

use serde::Serialize;

use super::registry::{CpuMachine, cpu_counters};
use super::{Domain, Source, SourceError, SourceInfo, estimate, msr, nvml, wattmeter};
use crate::topology::SysRoot;

/// What a wattmeter log held.
#[derive(Debug, Serialize)]
pub(crate) struct WattmeterReport {
    /// The log.
    pub(crate) log: String,
    /// The outlet read (`socket` in the JSON, as before the rename).
    #[serde(rename = "socket")]
    pub(crate) outlet: u32,
    /// Energy over the whole log (J).
    pub(crate) energy_j: f64,
    /// Frames and problems.
    pub(crate) stats: wattmeter::WattmeterStats,
}

/// One reader's status.
#[derive(Debug, Serialize)]
pub(crate) struct ReaderStatus {
    /// Reader name.
    pub(crate) name: &'static str,
    /// `in_use`, `available` or `missing`.
    pub(crate) status: &'static str,
    /// What it reads, when found.
    pub(crate) info: Option<SourceInfo>,
    /// Why it is missing.
    pub(crate) reason: Option<String>,
    /// How to make it work.
    pub(crate) fix: Option<String>,
}

/// The report `wattprof sources --json` prints.
#[derive(Debug, Serialize)]
pub(crate) struct SourcesReport {
    /// Readers in order of preference.
    pub(crate) readers: Vec<ReaderStatus>,
    /// The reader wattprof uses for CPU energy, if any.
    pub(crate) cpu_energy_reader: Option<&'static str>,
    /// The wattmeter log, when one was given.
    pub(crate) wattmeter: Option<WattmeterReport>,
    /// With `--check`: readers that disagreed (empty: all agreed within 5%).
    pub(crate) disagreements: Option<Vec<crate::sources::Disagreement>>,
    /// With `--check`: the readers compared.
    pub(crate) checked: Vec<&'static str>,
    /// What fits this machine, where no counter is read (a VM guest: the
    /// host's counters, shared).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) advice: Vec<String>,
    /// NVIDIA GPUs through NVML.
    pub(crate) gpu: GpuStatus,
    /// Each CPU energy domain's static power, where it is known before a
    /// profile, and where it comes from.
    pub(crate) static_power: StaticPowerStatus,
}

/// Where `run` and `monitor` will take each domain's static power from.
#[derive(Debug, Default, Serialize)]
pub(crate) struct StaticPowerStatus {
    /// The host power model read (its path), if any.
    pub(crate) host_model: Option<String>,
    /// Figures known now: the host model's fits for the CPU reader in
    /// use, or the vCPU model's idle term.
    pub(crate) figures: Vec<StaticLine>,
    /// Why the model at the default place is not used, if it is not.
    pub(crate) ignored: Option<String>,
    /// What happens for domains with no figure here.
    pub(crate) otherwise: String,
}

/// One domain's static figure.
#[derive(Debug, Serialize)]
pub(crate) struct StaticLine {
    /// Domain.
    pub(crate) domain: Domain,
    /// Package.
    pub(crate) package: Option<u32>,
    /// Static power (W).
    pub(crate) static_w: f64,
    /// Watts per busy CPU, for a fit.
    pub(crate) per_cpu_w: Option<f64>,
    /// `host_model` or `shipped_model`.
    pub(crate) static_source: crate::sources::static_power::StaticSource,
}

/// The NVML reader's status.
#[derive(Debug, Default, Serialize)]
pub(crate) struct GpuStatus {
    /// `in_use` or `missing`.
    pub(crate) status: &'static str,
    /// The GPUs found.
    pub(crate) gpus: Vec<nvml::GpuInfo>,
    /// Why NVML cannot be used.
    pub(crate) reason: Option<String>,
    /// How to make it work.
    pub(crate) fix: Option<String>,
}

/// Probes NVML.
pub(crate) fn probe_gpus(lib: Option<&std::ffi::OsStr>) -> GpuStatus {
    match nvml::NvmlGpus::open(lib) {
        Ok(g) => GpuStatus {
            status: "in_use",
            gpus: g.gpus(),
            reason: None,
            fix: None,
        },
        Err(SourceError::NotSupported { reason, fix }) => GpuStatus {
            status: "missing",
            gpus: Vec::new(),
            reason: Some(reason),
            fix: Some(fix),
        },
        Err(e) => GpuStatus {
            status: "missing",
            gpus: Vec::new(),
            reason: Some(e.to_string()),
            fix: None,
        },
    }
}

fn status(name: &'static str, opened: Result<SourceInfo, SourceError>) -> ReaderStatus {
    match opened {
        Ok(info) => ReaderStatus {
            name,
            status: "available",
            info: Some(info),
            reason: None,
            fix: None,
        },
        Err(e) => {
            let (reason, fix) = e.reason_and_fix();
            ReaderStatus {
                name,
                status: "missing",
                info: None,
                reason: Some(reason),
                fix,
            }
        }
    }
}

/// Probes every reader on the machine described by `sys`, `msr_root` and
/// `cpuinfo`; the power model `model` asks for stands in when no counter
/// works.
pub(crate) fn probe(
    sys: &SysRoot,
    msr_root: &msr::MsrRoot,
    cpuinfo: &str,
    model: estimate::ModelRequest,
) -> SourcesReport {
    let machine = CpuMachine {
        sys,
        msr_root,
        cpuinfo,
    };
    let mut readers: Vec<ReaderStatus> = cpu_counters(machine)
        .into_iter()
        .map(|(name, opened)| status(name, opened.map(|s| s.info())))
        .collect();
    let measured = readers.iter().any(|r| r.status == "available");
    readers.push(match estimate::choose_on(model, sys, cpuinfo) {
        Ok(Some(chosen)) if measured => ReaderStatus {
            name: "estimate",
            status: "available",
            reason: Some(format!(
                "not needed: energy is measured (else the {} model: {})",
                chosen.model.name(),
                chosen.why
            )),
            info: Some(chosen.info()),
            fix: None,
        },
        Ok(Some(chosen)) => ReaderStatus {
            name: "estimate",
            status: "available",
            reason: Some(format!(
                "no CPU energy counter here: the {} model, because {}; source: {}",
                chosen.model.name(),
                chosen.why,
                chosen.source
            )),
            info: Some(chosen.info()),
            fix: None,
        },
        Ok(None) => ReaderStatus {
            name: "estimate",
            status: "missing",
            info: None,
            reason: Some("--power-model none".into()),
            fix: Some("leave --power-model at auto for an estimate where no counter works".into()),
        },
        Err(e) => {
            let (reason, fix) = e.reason_and_fix();
            ReaderStatus {
                name: "estimate",
                status: "missing",
                info: None,
                reason: Some(reason),
                fix,
            }
        }
    });
    let chosen = readers.iter_mut().find(|r| r.status == "available");
    let cpu_energy_reader = chosen.map(|r| {
        r.status = "in_use";
        r.name
    });
    SourcesReport {
        readers,
        cpu_energy_reader,
        wattmeter: None,
        disagreements: None,
        checked: Vec::new(),
        advice: Vec::new(),
        gpu: GpuStatus::default(),
        static_power: StaticPowerStatus::default(),
    }
}

/// `--powercap-root DIR`: that tree is the CPU energy reader, as `run`
/// would use it (first, in use); one line why when it cannot be.
pub(crate) fn given_powercap(
    report: &mut SourcesReport,
    root: &std::path::Path,
    cpuinfo: &str,
) -> Result<(), String> {
    let p = super::powercap::Powercap::open_dir(root.to_path_buf(), cpuinfo).map_err(|e| {
        let (reason, _) = e.reason_and_fix();
        format!(
            "--powercap-root {}: {reason} (give a directory holding intel-rapl:N zones, such as \
             one a host's `wattprof monitor --vm-export` writes)",
            root.display()
        )
    })?;
    for r in report.readers.iter_mut().filter(|r| r.status == "in_use") {
        r.status = "available";
    }
    report.readers.insert(
        0,
        ReaderStatus {
            name: "powercap",
            status: "in_use",
            info: Some(p.info()),
            reason: Some(format!("--powercap-root {}", root.display())),
            fix: None,
        },
    );
    report.cpu_energy_reader = Some("powercap");
    Ok(())
}

/// Reads every reader that opens, twice, `over` apart, and compares them.
pub(crate) fn check_readers(
    sys: &SysRoot,
    msr_root: &msr::MsrRoot,
    cpuinfo: &str,
    over: std::time::Duration,
) -> (Vec<&'static str>, Vec<crate::sources::Disagreement>) {
    let machine = CpuMachine {
        sys,
        msr_root,
        cpuinfo,
    };
    let mut readers: Vec<Box<dyn Source>> = cpu_counters(machine)
        .into_iter()
        .filter_map(|(_, opened)| opened.ok())
        .collect();
    for r in &mut readers {
        let _ = r.read();
    }
    // Read every second and add up: 32-bit counters can wrap more than
    // once in a long check (about 160 s at 400 W on AMD).
    let mut totals: Vec<Option<Vec<crate::sources::DomainEnergy>>> =
        readers.iter().map(|_| Some(Vec::new())).collect();
    let deadline = std::time::Instant::now() + over;
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        std::thread::sleep(left.min(std::time::Duration::from_secs(1)));
        for (r, total) in readers.iter_mut().zip(totals.iter_mut()) {
            match (r.read(), total.as_mut()) {
                (Ok(energy), Some(acc)) => {
                    for e in energy {
                        match acc
                            .iter_mut()
                            .find(|a| a.domain == e.domain && a.package == e.package)
                        {
                            Some(a) => a.energy_uj += e.energy_uj,
                            None => acc.push(e),
                        }
                    }
                }
                // A reader that failed is not compared.
                _ => *total = None,
            }
        }
        if std::time::Instant::now() >= deadline {
            break;
        }
    }
    let readings: Vec<(String, Vec<crate::sources::DomainEnergy>)> = readers
        .iter()
        .zip(totals)
        .filter_map(|(r, t)| Some((r.name().to_string(), t?)))
        .collect();
    let names = readers
        .iter()
        .map(|r| r.name())
        .filter(|n| readings.iter().any(|(m, _)| m == n))
        .collect();
    // Below 1 mJ over the interval, counter steps dominate any comparison.
    (names, crate::sources::cross_check(&readings, 1_000))
}

/// Runs a wattmeter command (`cmd`, split into `argv`) for `over`, then
/// stops it.
pub(crate) fn read_wattmeter_cmd(
    cmd: &str,
    argv: &[String],
    outlet: u32,
    over: std::time::Duration,
) -> Result<WattmeterReport, SourceError> {
    let mut wm = wattmeter::Wattmeter::spawn(argv, outlet)?;
    let deadline = std::time::Instant::now() + over;
    let mut energy_uj = 0;
    while std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(100));
        match wm.read() {
            Ok(e) => energy_uj += e.iter().map(|d| d.energy_uj).sum::<u64>(),
            // The meter stopped early: report what it gave.
            Err(_) => break,
        }
    }
    energy_uj += wm
        .read_last()
        .map_or(0, |e| e.iter().map(|d| d.energy_uj).sum::<u64>());
    Ok(WattmeterReport {
        log: cmd.to_string(),
        outlet,
        energy_j: crate::units::joules(energy_uj),
        stats: wm.stats().clone(),
    })
}

/// Reads a whole wattmeter log.
pub(crate) fn read_wattmeter_log(
    path: &std::path::Path,
    outlet: u32,
) -> Result<WattmeterReport, SourceError> {
    let mut wm = wattmeter::Wattmeter::open_file(path, outlet)?;
    let energy_uj = wm.read_last()?.iter().map(|d| d.energy_uj).sum::<u64>();
    // A read that failed after the last line was counted.
    if let Some(problem) = wm.take_problems().into_iter().next() {
        return Err(SourceError::Retryable(problem));
    }
    Ok(WattmeterReport {
        log: path.display().to_string(),
        outlet,
        energy_j: crate::units::joules(energy_uj),
        stats: wm.stats().clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_reports_two_real_readers_that_disagree() {
        if !crate::privilege::may_perf_system_wide() {
            skip_test!("the perf reader needs CAP_PERFMON");
            return;
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path();
        let copy = std::process::Command::new("cp")
            .arg("-r")
            .arg(
                std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("testdata/intel-2s/sys/class"),
            )
            .arg(root)
            .status()
            .expect("cp");
        assert!(copy.success());
        crate::testutil::software_backed_power_pmu(root);
        let (checked, d) = check_readers(
            &SysRoot::at(root),
            &msr::MsrRoot::at(root.join("no-msr")),
            "",
            std::time::Duration::from_millis(200),
        );
        assert_eq!(checked, vec!["powercap", "perf"]);
        // powercap's package 0 stood still while perf's counted ~0.2 J.
        assert_eq!(d.len(), 1, "{d:?}");
        assert_eq!((d[0].domain, d[0].package), (Domain::Package, Some(0)));
        assert_eq!(d[0].a.1, 0);
        assert!(d[0].b.1 > 150_000, "{:?}", d[0].b);
    }
}
