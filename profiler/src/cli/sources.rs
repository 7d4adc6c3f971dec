//! `wattprof sources`: which energy readers work here, and why not.

use serde::Serialize;

use crate::sources::registry::{CpuMachine, cpu_counters};
use crate::sources::{Domain, Source, SourceError, SourceInfo, estimate, msr, nvml, wattmeter};
use crate::topology::SysRoot;

/// Arguments of `wattprof sources`.
#[derive(clap::Args, Debug)]
#[command(
    after_help = "Readers are listed in order of preference; the first that works is \
    the one wattprof uses for CPU energy."
)]
pub(crate) struct SourcesArgs {
    /// Print JSON for scripts instead of text.
    #[arg(long)]
    pub(crate) json: bool,

    /// Also read this OmegaWatt `wattmetre-read` log and report its frames,
    /// mean power and energy.
    #[arg(long, value_name = "FILE")]
    pub(crate) wattmeter_log: Option<std::path::PathBuf>,

    /// How CPU energy is estimated where no counter works.
    #[command(flatten)]
    pub(crate) model: super::energy::ModelArgs,

    /// Load NVML from this file instead of the driver's libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    pub(crate) nvml_lib: Option<std::path::PathBuf>,

    /// Read every available reader twice, this long apart (e.g. 2s), and
    /// report readers that disagree by more than 5% on the same domain.
    #[arg(long, value_name = "DURATION", value_parser = super::setup::parse_interval)]
    pub(crate) check: Option<std::time::Duration>,

    /// Start this wattmeter command (e.g. "wattmetre-read --tty=/dev/ttyUSB0
    /// --nb=6"), read it for the --check duration (2 s by default), report,
    /// and stop it.
    #[arg(long, value_name = "CMD", conflicts_with = "wattmeter_log")]
    pub(crate) wattmeter_cmd: Option<String>,

    /// The wattmeter outlet the machine is plugged into (1-based: the log's
    /// `#activepowN` column). `--wattmeter-socket` is an older name.
    #[arg(long, value_name = "N", default_value_t = 1, alias = "wattmeter-socket", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) wattmeter_outlet: u32,

    /// The host power model to show (`wattprof calibrate` writes it).
    /// [default: /var/lib/wattprof/power-model.json]
    #[arg(long, value_name = "FILE", env = "WATTPROF_HOST_MODEL")]
    pub(crate) host_model: Option<std::path::PathBuf>,
}

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

/// The static figures `run` and `monitor` would start with.
fn static_status(
    report: &SourcesReport,
    given: Option<&std::path::Path>,
    model: estimate::ModelRequest,
    cpuinfo: &str,
) -> Result<StaticPowerStatus, String> {
    use crate::sources::static_power::StaticSource;
    let packages = crate::topology::Topology::read(&SysRoot::real()).map_or(1, |t| t.packages());
    let cfg =
        crate::profile::statics::StaticsConfig::load(Default::default(), given, packages, false)?;
    let mut figures: Vec<StaticLine> = cfg
        .host
        .iter()
        .flat_map(|m| m.fits.iter())
        .filter(|f| Some(f.reader.as_str()) == report.cpu_energy_reader)
        .map(|f| StaticLine {
            domain: f.domain,
            package: f.package,
            static_w: f.static_w,
            per_cpu_w: Some(f.per_cpu_w),
            static_source: match f.origin {
                crate::sources::static_power::FitOrigin::Calibrate => StaticSource::HostModel,
                crate::sources::static_power::FitOrigin::Learned => StaticSource::Learned,
            },
        })
        .collect();
    if report.cpu_energy_reader == Some("estimate")
        && let Ok(Some(chosen)) = estimate::choose_on(model, &SysRoot::real(), cpuinfo)
        && let estimate::PowerModel::Vcpu(v) = chosen.model
        && v.min_w > 0.0
    {
        // SAFETY: sysconf has no preconditions.
        let cpus = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as f64;
        figures.push(StaticLine {
            domain: Domain::Package,
            package: None,
            static_w: v.min_w * cpus,
            per_cpu_w: Some(v.max_w - v.min_w),
            static_source: StaticSource::ShippedModel,
        });
    }
    Ok(StaticPowerStatus {
        host_model: cfg.host_path.map(|p| p.display().to_string()),
        figures,
        ignored: cfg.ignored,
        otherwise: "learned during `run` and `monitor` once the load has varied by half a CPU \
                    over 10 intervals, else the lowest power seen (an upper bound); \
                    `wattprof calibrate` fits this host's"
            .into(),
    })
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
        gpu: GpuStatus::default(),
        static_power: StaticPowerStatus::default(),
    }
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

/// Runs a wattmeter command for `over`, then stops it.
pub(crate) fn read_wattmeter_cmd(
    cmd: &str,
    outlet: u32,
    over: std::time::Duration,
) -> Result<WattmeterReport, SourceError> {
    let argv = super::split_command(cmd);
    let mut wm = wattmeter::Wattmeter::spawn(&argv, outlet)?;
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
        energy_j: crate::model::record::joules(energy_uj),
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
        energy_j: crate::model::record::joules(energy_uj),
        stats: wm.stats().clone(),
    })
}

fn describe_domains(domains: &[(Domain, Option<u32>)]) -> String {
    let mut packages: Vec<u32> = domains.iter().filter_map(|(_, p)| *p).collect();
    packages.sort_unstable();
    packages.dedup();
    let mut parts: Vec<String> = packages
        .iter()
        .map(|p| {
            let names: Vec<&str> = domains
                .iter()
                .filter(|(_, q)| *q == Some(*p))
                .map(|(d, _)| d.name())
                .collect();
            format!("package {p}: {}", names.join(", "))
        })
        .collect();
    if domains.iter().any(|(d, _)| *d == Domain::Psys) {
        parts.push("platform: psys".into());
    }
    parts.join("; ")
}

/// Renders the text form.
pub(crate) fn render(report: &SourcesReport) -> String {
    let mut out = String::from("CPU energy readers, in order of preference:\n");
    for r in &report.readers {
        out.push_str(&format!(
            "  {:<9} {:<9}",
            r.name,
            r.status.replace('_', " ")
        ));
        match (&r.info, &r.reason) {
            (Some(info), _) => {
                let res = info
                    .resolution_uj
                    .map(|u| format!("; resolution {u:.1} µJ"))
                    .unwrap_or_default();
                let domains = describe_domains(&info.domains);
                let sep = if domains.is_empty() { "" } else { ": " };
                out.push_str(&format!(" {}{sep}{domains}{res}\n", info.location));
                if let Some(why) = &r.reason {
                    out.push_str(&format!("  {:<19} why: {why}\n", ""));
                }
            }
            (None, Some(reason)) => {
                out.push_str(&format!(" {reason}\n"));
                if let Some(fix) = &r.fix {
                    out.push_str(&format!("  {:<19} fix: {fix}\n", ""));
                }
            }
            (None, None) => out.push('\n'),
        }
    }
    out.push_str("GPU energy readers:\n");
    match (&report.gpu.reason, report.gpu.gpus.is_empty()) {
        (Some(reason), _) => {
            out.push_str(&format!("  {:<9} {:<9} {reason}\n", "nvml", "missing"));
            if let Some(fix) = &report.gpu.fix {
                out.push_str(&format!("  {:<19} fix: {fix}\n", ""));
            }
        }
        (None, false) => {
            for g in &report.gpu.gpus {
                let method = match g.method {
                    nvml::GpuEnergyMethod::EnergyCounter => "total-energy counter",
                    nvml::GpuEnergyMethod::PowerIntegration => {
                        "power samples integrated (no energy counter on this GPU: estimated)"
                    }
                };
                out.push_str(&format!(
                    "  nvml      in use    GPU {} {} ({}): {method}, {:.1} GiB{}\n",
                    g.index,
                    g.name,
                    g.uuid,
                    g.memory_total_bytes as f64 / f64::from(1u32 << 30),
                    if g.mig {
                        "; MIG enabled: instances are not attributed separately yet"
                    } else {
                        ""
                    }
                ));
            }
        }
        (None, true) => out.push_str("  nvml      missing\n"),
    }
    if let Some(w) = &report.wattmeter {
        let s = &w.stats;
        out.push_str(&format!(
            "Wattmeter {} (outlet {}): {} good frames, {} not ok, {} malformed lines, \
             {} out of order; mean {:.1} W, {:.3} J{}\n",
            w.log,
            w.outlet,
            s.frames_ok,
            s.frames_not_ok,
            s.malformed_lines,
            s.out_of_order,
            s.mean_power_w,
            w.energy_j,
            if s.gap_s > 0.0 {
                format!(", {:.2} s of gaps bridged", s.gap_s)
            } else {
                String::new()
            }
        ));
    }
    if let Some(d) = &report.disagreements {
        if report.checked.len() < 2 {
            out.push_str("Cross-check: fewer than two readers work here; nothing to compare.\n");
        } else if d.is_empty() {
            out.push_str(&format!(
                "Cross-check: {} agree within 5% on every domain they share.\n",
                report.checked.join(", ")
            ));
        }
        for x in d {
            out.push_str(&format!(
                "Cross-check: {} and {} disagree on {} energy{}: {:.3} J vs {:.3} J ({:.1}%)\n",
                x.a.0,
                x.b.0,
                x.domain.name(),
                x.package
                    .map(|p| format!(" of package {p}"))
                    .unwrap_or_default(),
                crate::model::record::joules(x.a.1),
                crate::model::record::joules(x.b.1),
                x.relative * 100.0
            ));
        }
    }
    match report.cpu_energy_reader {
        Some("estimate") => out.push_str(&format!(
            "CPU energy is ESTIMATED with a power model ({}; no energy counter here): every \
             figure from it is marked estimated.\n",
            report
                .readers
                .iter()
                .find(|r| r.name == "estimate")
                .and_then(|r| r.info.as_ref())
                .map_or("", |i| i.location.as_str())
        )),
        Some(name) => out.push_str(&format!("CPU energy is measured with {name}.\n")),
        None => out.push_str(
            "No CPU energy counter is readable on this machine: wattprof cannot measure CPU \
             energy here.\n",
        ),
    }
    let st = &report.static_power;
    out.push_str(&format!(
        "\nStatic power (what each domain draws with no task running; each program pays its \
         share of the CPUs' time){}:\n",
        st.host_model
            .as_ref()
            .map(|p| format!(", host power model {p}"))
            .unwrap_or_else(|| ", no host power model".into())
    ));
    for f in &st.figures {
        out.push_str(&format!(
            "  {:<16} {:>8.2} W static{} ({})\n",
            f.domain.label(f.package),
            f.static_w,
            f.per_cpu_w
                .map(|k| format!(" + {k:.3} W per busy CPU"))
                .unwrap_or_default(),
            match f.static_source {
                crate::sources::static_power::StaticSource::HostModel => "host model",
                crate::sources::static_power::StaticSource::Learned => {
                    "host model, learned by monitor"
                }
                _ => "the power model's idle term",
            }
        ));
    }
    if let Some(why) = &st.ignored {
        out.push_str(&format!("  warning: {why}\n"));
    }
    out.push_str(&format!("  otherwise: {}\n", st.otherwise));
    out
}

/// Runs `wattprof sources`.
pub(crate) fn execute(args: SourcesArgs) -> anyhow::Result<i32> {
    args.model.check().map_err(super::Fatal::profiler)?;
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mut report = probe(
        &SysRoot::real(),
        &msr::MsrRoot::real(),
        &cpuinfo,
        args.model.request(),
    );
    report.gpu = probe_gpus(args.nvml_lib.as_deref().map(|p| p.as_os_str()));
    report.static_power = static_status(
        &report,
        args.host_model.as_deref(),
        args.model.request(),
        &cpuinfo,
    )
    .map_err(super::Fatal::usage)?;
    if let Some(over) = args.check {
        let (checked, d) = check_readers(&SysRoot::real(), &msr::MsrRoot::real(), &cpuinfo, over);
        report.checked = checked;
        report.disagreements = Some(d);
    }
    let wattmeter = match (&args.wattmeter_log, &args.wattmeter_cmd) {
        (Some(log), _) => Some((
            log.display().to_string(),
            read_wattmeter_log(log, args.wattmeter_outlet),
        )),
        (None, Some(cmd)) => {
            let over = args.check.unwrap_or(std::time::Duration::from_secs(2));
            Some((
                cmd.clone(),
                read_wattmeter_cmd(cmd, args.wattmeter_outlet, over),
            ))
        }
        (None, None) => None,
    };
    if let Some((source, w)) = wattmeter {
        let w = w.map_err(|e| super::Fatal::profiler(e.to_string()))?;
        if w.stats.frames_ok == 0 {
            return Err(super::Fatal::profiler(format!(
                "wattmeter {source}: no good frame for outlet {} ({} not ok, {} malformed \
                 lines): check --wattmeter-outlet and the log",
                args.wattmeter_outlet, w.stats.frames_not_ok, w.stats.malformed_lines
            ))
            .into());
        }
        report.wattmeter = Some(w);
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render(&report));
    }
    Ok(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixture_machine_prefers_powercap_and_explains_msr() {
        let sys = SysRoot::at(
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("testdata/intel-2s/sys"),
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let report = probe(
            &sys,
            &msr::MsrRoot::at(dir.path()),
            "vendor_id: GenuineIntel\ncpu family: 6\nmodel: 85\n",
            tdp(150.0),
        );
        assert_eq!(report.cpu_energy_reader, Some("powercap"));
        assert_eq!(report.readers[0].status, "in_use");
        // The fixture has no power PMU and no CPU topology.
        assert_eq!(report.readers[1].status, "missing");
        assert_eq!(report.readers[2].status, "missing");
        let text = render(&report);
        assert!(
            text.contains("package 1: package, core, uncore, dram"),
            "{text}"
        );
        assert!(text.contains("platform: psys"), "{text}");
        assert!(text.contains("measured with powercap"), "{text}");
        // A measured reader wins over the estimate, even with a TDP given.
        assert_eq!(report.readers[3].name, "estimate");
        assert_eq!(report.readers[3].status, "available");
    }

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

    fn tdp(w: f64) -> estimate::ModelRequest {
        estimate::ModelRequest {
            cpu_tdp_w: Some(w),
            ..Default::default()
        }
    }

    #[test]
    fn machine_without_rapl_says_why_and_which_model_stands_in() {
        let dir = tempfile::tempdir().expect("tempdir");
        let cpuinfo = "vendor_id: AuthenticAMD\ncpu family: 25\nmodel: 1\nmodel name: AMD EPYC\n\
                       flags: fpu hypervisor\n";
        let probe_with = |model| {
            probe(
                &SysRoot::at(dir.path()),
                &msr::MsrRoot::at(dir.path()),
                cpuinfo,
                model,
            )
        };
        // With no option: the vCPU model of the microarchitecture, and why.
        let report = probe_with(estimate::ModelRequest::default());
        assert_eq!(report.cpu_energy_reader, Some("estimate"));
        let text = render(&report);
        assert!(text.contains("modprobe intel_rapl_msr"), "{text}");
        assert!(text.contains("vcpu model: vCPUs x (0.45 W"), "{text}");
        assert!(text.contains("VM guest (hypervisor flag)"), "{text}");
        assert!(text.contains("AMD EPYC 3rd Gen"), "{text}");
        assert!(text.contains("Cloud Carbon Footprint"), "{text}");
        assert!(text.contains("CPU energy is ESTIMATED"), "{text}");
        let json = serde_json::to_value(&report).expect("json");
        assert_eq!(json["readers"][0]["status"], "missing");
        assert!(json["readers"][0]["fix"].is_string());
        // --power-model none: nothing, and what would give an estimate.
        let report = probe_with(estimate::ModelRequest {
            choice: estimate::ModelChoice::None,
            ..Default::default()
        });
        assert_eq!(report.cpu_energy_reader, None);
        let text = render(&report);
        assert!(text.contains("cannot measure CPU energy here"), "{text}");
        assert!(text.contains("--power-model at auto"), "{text}");
        // --power-model tdp for a CPU not in the table: why, and the fix.
        let report = probe_with(estimate::ModelRequest {
            choice: estimate::ModelChoice::Tdp,
            ..Default::default()
        });
        assert_eq!(report.cpu_energy_reader, None);
        let text = render(&report);
        assert!(text.contains("AMD EPYC is not in the TDP table"), "{text}");
        assert!(text.contains("give --cpu-tdp WATTS"), "{text}");
        // With a TDP, the TDP model.
        let report = probe_with(tdp(120.0));
        assert_eq!(report.cpu_energy_reader, Some("estimate"));
        assert!(render(&report).contains("TDP 120 W x CPU utilization"));
    }
}
