//! `wattprof sources`: which energy readers work here, and why not.

use crate::render::render_sources;
use crate::sources::probe::{
    SourcesReport, StaticLine, StaticPowerStatus, check_readers, probe, probe_gpus,
    read_wattmeter_cmd, read_wattmeter_log,
};
use crate::sources::{Domain, estimate, msr};
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

    /// Do not look for NVIDIA GPUs (as `run --no-gpu`).
    #[arg(long)]
    pub(crate) no_gpu: bool,

    /// Read CPU energy from this powercap tree (a directory holding
    /// intel-rapl:N zones, such as the share a host's `wattprof monitor
    /// --vm-export` writes for a VM), as `run --powercap-root` would.
    #[arg(long, value_name = "DIR")]
    pub(crate) powercap_root: Option<std::path::PathBuf>,

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

    /// The host power model to show (`wattprof calibrate` writes it). Also
    /// $WATTPROF_HOST_MODEL. [default: /var/lib/wattprof/power-model.json]
    #[arg(long, value_name = "FILE", env = "WATTPROF_HOST_MODEL")]
    pub(crate) host_model: Option<std::path::PathBuf>,
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
                    `wattprof calibrate` fits this host's static power and writes it to the \
                    host power model, which run and monitor then use"
            .into(),
    })
}

/// Runs `wattprof sources`.
pub(crate) fn execute(args: SourcesArgs) -> anyhow::Result<i32> {
    args.model.check().map_err(super::Fatal::usage)?;
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let mut report = probe(
        &SysRoot::real(),
        &msr::MsrRoot::real(),
        &cpuinfo,
        args.model.request(),
    );
    if let Some(root) = &args.powercap_root {
        crate::sources::probe::given_powercap(&mut report, root, &cpuinfo)
            .map_err(super::Fatal::usage)?;
    }
    // In a VM no counter of the host's CPU is readable (the hypervisor
    // hides RAPL): the real figures come from the host, shared.
    let guest = cpuinfo.lines().any(|l| {
        l.split_once(':').is_some_and(|(k, v)| {
            matches!(k.trim(), "flags" | "Features")
                && v.split_whitespace().any(|f| f == "hypervisor")
        })
    });
    if guest && report.cpu_energy_reader.is_none_or(|r| r == "estimate") {
        report.advice.push(
            "this is a VM: its CPU energy here is an estimate. For measured figures, run \
             `wattprof monitor --vm-export DIR` on the host and give this VM's share with \
             `--powercap-root DIR` (run, monitor and sources take it)"
                .into(),
        );
    }
    report.gpu = if args.no_gpu {
        crate::sources::probe::GpuStatus {
            status: "disabled",
            reason: Some("--no-gpu".into()),
            ..Default::default()
        }
    } else {
        probe_gpus(args.nvml_lib.as_deref().map(|p| p.as_os_str()))
    };
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
                read_wattmeter_cmd(cmd, &super::split_command(cmd), args.wattmeter_outlet, over),
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
        print!("{}", render_sources(&report));
    }
    Ok(0)
}
