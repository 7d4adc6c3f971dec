//! Options shared by `run` and `monitor`: energy readers, CO2, streaming.

use std::ffi::OsString;
use std::path::PathBuf;

use super::Fatal;
use crate::carbon::CarbonIntensity;
use crate::profile::ReaderConfig;
use crate::sink::csv::IntervalCsv;
use crate::sink::jsonl::Jsonl;
use crate::sources::calibration::Calibration;
use crate::sources::estimate::{ModelChoice, ModelRequest, TdpModel, VcpuModel};

impl EnergyArgs {
    /// The final table's rows as `--all` and `--cmdline` ask.
    pub(crate) fn rows(&self) -> crate::render::Rows {
        crate::render::Rows {
            all: self.all,
            cmdline: self.cmdline,
            verbose: self.verbose,
        }
    }
}

/// Energy and output options of `run` and `monitor`.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct EnergyArgs {
    /// Show every process in the final table. By default processes under
    /// 1% of the CPU time shown (and under 50 ms) are folded by command
    /// name with a count (shell shims, `readlink`...), and at most 20 rows
    /// are shown; the recording always has every row.
    #[arg(long)]
    pub(crate) all: bool,

    /// Read and record each process's command line (cut to 200 bytes), and
    /// show it at the end of its row in the final table, to tell workers
    /// of one program apart (`python3 train.py --rank 3`): `run` reads its
    /// tree's, `monitor` every process's (one file read per exec). Off by
    /// default, since a command line may carry a secret; with it,
    /// --output and --jsonl are made readable by their owner only.
    #[arg(long)]
    pub(crate) cmdline: bool,

    /// Print each energy reader's whole detail in the final table: why it
    /// is used, the power model's source, why the others are not.
    #[arg(long, short)]
    pub(crate) verbose: bool,

    /// Also stream one JSON record per interval (and per window) to FILE,
    /// each line written whole as its interval ends (a killed wattprof
    /// leaves every finished line).
    #[arg(long, value_name = "FILE")]
    pub(crate) jsonl: Option<PathBuf>,

    /// Append one row to FILE in codecarbon's emissions.csv layout
    /// (codecarbon 3's columns, in its order and units: kWh, kg CO2eq, W,
    /// s): the command tree's energy in `run`, the machine's in `monitor`.
    /// A new file gets the header; a file with other columns is refused
    /// before anything runs. Columns wattprof cannot know (location,
    /// cloud, Python, water) are empty; `pue` is 1.0. codecarbon's own
    /// EmissionsData reads it (tested).
    #[arg(long, value_name = "FILE")]
    pub(crate) csv: Option<PathBuf>,

    /// Also write FILE: one CSV row per interval and domain, flushed as
    /// each interval ends: timestamp, t_s, duration_s, domain, package,
    /// estimated, basis, measured_j, attributed_j, idle_j, unattributed_j,
    /// power_w, energy_kwh, emissions_kg, busy_cpu_s, static_j,
    /// attributed_static_j, static_w, static_source. `wattprof report FILE
    /// --csv-intervals` writes the same bytes afterwards.
    #[arg(long, value_name = "FILE")]
    pub(crate) csv_intervals: Option<PathBuf>,

    /// Grams of CO2eq per kWh for the CO2 figures (default: the world
    /// average, 475).
    #[arg(
        long,
        value_name = "G_PER_KWH",
        conflicts_with = "country",
        allow_negative_numbers = true
    )]
    pub(crate) carbon_intensity: Option<f64>,

    /// Take the carbon intensity of this country's electricity from the
    /// shipped table (ISO 3166-1 alpha-3: FRA, USA, DEU, ...).
    #[arg(long, value_name = "ISO3")]
    pub(crate) country: Option<String>,

    /// How CPU energy is estimated where no counter works.
    #[command(flatten)]
    pub(crate) model: ModelArgs,

    /// Read CPU energy from this powercap tree (a directory of
    /// intel-rapl:N zones) instead of looking for counters: in a VM guest,
    /// the tree its host's `wattprof monitor --vm-export` writes and
    /// shares in (virtiofs or 9p). Its energy is measured by the host.
    #[arg(long, value_name = "DIR", conflicts_with = "energy_sysfs")]
    pub(crate) powercap_root: Option<PathBuf>,

    /// Report wall energy per process, group and window from this
    /// calibration (`wattprof calibrate`): wall = a x counters + b. The
    /// static b is the node's own, reported as idle wall energy. Not with
    /// --wattmeter-log or --wattmeter-cmd.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["wattmeter_log", "wattmeter_cmd"])]
    pub(crate) calibration: Option<PathBuf>,

    /// How each package's static power (what it draws with no task
    /// running) is shared: `capacity` (default) charges each program its
    /// share of the CPUs × time it held, so its energy is what it caused
    /// plus that rent, whatever runs beside it; `busy` charges all of it
    /// to whoever ran, by CPU time (the cost of a machine rented whole);
    /// `idle` gives none of it to programs. Dynamic energy always goes by
    /// CPU time.
    #[arg(long, value_name = "RULE", value_enum, default_value_t = crate::attribution::StaticShare::Capacity)]
    pub(crate) static_power: crate::attribution::StaticShare,

    /// The host power model `wattprof calibrate` writes (each domain's
    /// static power and watts per busy CPU, fitted on this machine). A
    /// missing file at the default place is no error: static power is
    /// then learned as the load varies, or taken from the power model, or
    /// bounded by the lowest power seen. `none` reads no model. Also
    /// $WATTPROF_HOST_MODEL. [default: /var/lib/wattprof/power-model.json]
    #[arg(long, value_name = "FILE", env = "WATTPROF_HOST_MODEL")]
    pub(crate) host_model: Option<PathBuf>,

    /// Do not read NVIDIA GPUs.
    #[arg(long)]
    pub(crate) no_gpu: bool,

    /// Load this NVML library instead of the driver's libnvidia-ml.so.1.
    #[arg(long, value_name = "PATH")]
    pub(crate) nvml_lib: Option<OsString>,

    /// Follow an OmegaWatt wattmetre-read log being written, for the
    /// whole machine's power at the wall.
    #[arg(long, value_name = "FILE", conflicts_with = "wattmeter_cmd")]
    pub(crate) wattmeter_log: Option<PathBuf>,

    /// Start this wattmeter program (e.g. "wattmetre-read --tty=/dev/ttyUSB0
    /// --nb=6"), read it for the whole profile, and stop it at the end.
    #[arg(long, value_name = "CMD")]
    pub(crate) wattmeter_cmd: Option<String>,

    /// The wattmeter outlet the machine is plugged into (1-based: the log's
    /// `#activepowN` column). `--wattmeter-socket` is an older name.
    #[arg(long, value_name = "N", default_value_t = 1, alias = "wattmeter-socket", value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) wattmeter_outlet: u32,

    /// Report only processes in this container (id, or a prefix of 4 or
    /// more characters; Docker name; or Kubernetes pod UID). Energy is
    /// still divided over every process.
    #[arg(long, value_name = "ID|NAME")]
    pub(crate) container: Option<String>,

    /// Report only processes in this cgroup (v2 path, as in
    /// /proc/PID/cgroup, e.g. /system.slice/nginx.service) or below it.
    #[arg(long, value_name = "PATH")]
    pub(crate) cgroup: Option<String>,

    /// The Docker Engine API socket, for container names (asked on a
    /// background thread; without it, containers are named by id).
    #[arg(long, value_name = "PATH", default_value = "/var/run/docker.sock")]
    pub(crate) docker_socket: PathBuf,

    /// Podman's API socket, for Podman's container names (`systemctl
    /// enable --now podman.socket` makes it; without it, Podman's
    /// containers are named by id).
    #[arg(long, value_name = "PATH", default_value = "/run/podman/podman.sock")]
    pub(crate) podman_socket: PathBuf,

    /// containerd's state directory: its running tasks' specs say which
    /// cgroup is which `ctr`, nerdctl or Kubernetes container and what it
    /// is called (k3s: /run/k3s/containerd).
    #[arg(long, value_name = "DIR", default_value = "/run/containerd")]
    pub(crate) containerd_state: PathBuf,

    /// Read CPU energy counters from this copy of /sys (testing).
    #[arg(long, value_name = "DIR", hide = true)]
    pub(crate) energy_sysfs: Option<PathBuf>,
}

impl EnergyArgs {
    /// The `--cgroup` / `--container` filter.
    pub(crate) fn filter(&self) -> crate::profile::Filter {
        crate::profile::Filter {
            cgroup: self.cgroup.clone(),
            container: self.container.clone(),
        }
    }

    /// The readers to open.
    pub(crate) fn readers(&self) -> Result<ReaderConfig, Fatal> {
        Ok(ReaderConfig {
            sys: self.energy_sysfs.clone(),
            model: self.model.request(),
            powercap_root: self.powercap_root.clone(),
            no_gpu: self.no_gpu,
            nvml_lib: self.nvml_lib.clone(),
            wattmeter_log: self.wattmeter_log.clone(),
            wattmeter_cmd: self.wattmeter_cmd.as_ref().map(|c| super::split_command(c)),
            wattmeter_outlet: self.wattmeter_outlet,
            calibration: self
                .calibration
                .as_deref()
                .map(Calibration::load)
                .transpose()
                .map_err(Fatal::profiler)?,
        })
    }

    /// Cheap checks, before anything is loaded or started: the carbon
    /// intensity, the TDP, the JSONL file.
    pub(crate) fn validate(&self) -> Result<(CarbonIntensity, Streams), Fatal> {
        if let Some(c) = &self.cgroup
            && !c.starts_with('/')
        {
            return Err(Fatal::usage(format!(
                "--cgroup {c}: give the cgroup's path from its root, as /proc/PID/cgroup shows \
                 it (e.g. /system.slice/docker-ID.scope)"
            )));
        }
        let carbon = CarbonIntensity::choose(self.carbon_intensity, self.country.as_deref())
            .map_err(|e| Fatal::usage(e.to_string()))?;
        if let Some(c) = &self.calibration {
            Calibration::load(c).map_err(Fatal::profiler)?;
        }
        self.model.check().map_err(Fatal::usage)?;
        if self.powercap_root.is_some() && self.model.any() {
            return Err(Fatal::usage(
                "--powercap-root reads a counter: no power model (--power-model, --cpu-tdp, \
                 --vcpu-watts) is used with it",
            ));
        }
        if let Some(root) = &self.powercap_root
            && !root.is_dir()
        {
            return Err(Fatal::usage(format!(
                "--powercap-root {}: not a directory (give the directory holding intel-rapl:N \
                 zones, e.g. the share of a host's --vm-export)",
                root.display()
            )));
        }
        if let Some(csv) = &self.csv {
            // Refused now, before anything is measured: a path that cannot
            // be written, or a CSV that is not codecarbon's.
            crate::sink::csv::check(csv).map_err(Fatal::profiler)?;
        }
        let jsonl = self
            .jsonl
            .as_deref()
            .map(|p| {
                Jsonl::create(p).map_err(|e| {
                    Fatal::profiler(format!(
                        "cannot write --jsonl {}: {e} (check that the directory exists and is \
                         writable)",
                        p.display()
                    ))
                })
            })
            .transpose()?;
        let csv_intervals = self
            .csv_intervals
            .as_deref()
            .map(IntervalCsv::create)
            .transpose()
            .map_err(Fatal::profiler)?;
        Ok((
            carbon,
            Streams {
                jsonl,
                csv_intervals,
                recording: None,
                emissions: self.csv.clone(),
            },
        ))
    }
}

/// `--power-model`, `--cpu-tdp`, `--vcpu-watts`: `run`, `monitor` and
/// `sources`.
#[derive(clap::Args, Debug, Clone, Default)]
pub(crate) struct ModelArgs {
    /// Where no CPU energy counter works (VMs, clouds), estimate CPU energy
    /// with a power model (every figure is then marked estimated): `auto`
    /// picks watts per vCPU in a VM guest, the TDP of a CPU model in the
    /// shipped table on bare metal, else the microarchitecture's (or the
    /// default) watts per vCPU; `none` reports no CPU energy.
    #[arg(long, value_name = "MODEL", value_enum, default_value_t = ModelChoice::Auto)]
    pub(crate) power_model: ModelChoice,

    /// The TDP model with this TDP in watts (all CPU packages together,
    /// from the spec sheet): energy = TDP x CPU utilization.
    #[arg(long, value_name = "WATTS", value_parser = parse_tdp, conflicts_with = "vcpu_watts")]
    pub(crate) cpu_tdp: Option<f64>,

    /// The vCPU model with these watts per vCPU at 0% and 100%
    /// utilization: energy = vCPUs x (MIN + utilization x (MAX - MIN)).
    #[arg(long, value_name = "MIN,MAX", value_parser = parse_vcpu_watts)]
    pub(crate) vcpu_watts: Option<(f64, f64)>,
}

impl ModelArgs {
    /// Options that contradict each other (clap cannot see values).
    pub(crate) fn check(&self) -> Result<(), String> {
        use ModelChoice as M;
        let given = match (self.cpu_tdp.is_some(), self.vcpu_watts.is_some()) {
            (true, _) => Some("--cpu-tdp"),
            (_, true) => Some("--vcpu-watts"),
            _ => None,
        };
        match (self.power_model, given) {
            (M::None, Some(opt)) => Err(format!(
                "{opt} gives a power model, but --power-model none asks for none"
            )),
            (M::Tdp, Some("--vcpu-watts")) => {
                Err("--vcpu-watts gives the vCPU model, not --power-model tdp".into())
            }
            (M::Vcpu, Some("--cpu-tdp")) => {
                Err("--cpu-tdp gives the TDP model, not --power-model vcpu".into())
            }
            _ => Ok(()),
        }
    }

    /// Whether any model option was given.
    pub(crate) fn any(&self) -> bool {
        self.power_model != ModelChoice::Auto || self.cpu_tdp.is_some() || self.vcpu_watts.is_some()
    }

    /// What the registry is asked for.
    pub(crate) fn request(&self) -> ModelRequest {
        ModelRequest {
            choice: self.power_model,
            cpu_tdp_w: self.cpu_tdp,
            vcpu_watts: self.vcpu_watts,
        }
    }
}

/// `--cpu-tdp WATTS`.
pub(crate) fn parse_tdp(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(w) if TdpModel::new(w).is_ok() => Ok(w),
        _ => Err(format!(
            "`{text}` is not a TDP in watts (e.g. 120 or 2x 205 = 410)"
        )),
    }
}

/// `--vcpu-watts MIN,MAX`.
pub(crate) fn parse_vcpu_watts(text: &str) -> Result<(f64, f64), String> {
    let bad =
        || format!("`{text}` is not MIN,MAX watts per vCPU with 0 <= MIN <= MAX (e.g. 0.74,3.5)");
    let (lo, hi) = text.split_once(',').ok_or_else(bad)?;
    let (lo, hi) = (
        lo.trim().parse::<f64>().map_err(|_| bad())?,
        hi.trim().parse::<f64>().map_err(|_| bad())?,
    );
    VcpuModel::new(lo, hi).map_err(|_| bad())?;
    Ok((lo, hi))
}

/// The outputs of a profile, opened before anything is measured.
#[derive(Default)]
pub(crate) struct Streams {
    /// `--jsonl`.
    pub(crate) jsonl: Option<Jsonl>,
    /// `--csv-intervals`.
    pub(crate) csv_intervals: Option<IntervalCsv>,
    /// `--output`.
    pub(crate) recording: Option<crate::sink::recording::Recording>,
    /// `--csv` (checked: codecarbon's layout, or a new file).
    pub(crate) emissions: Option<PathBuf>,
}

impl Streams {
    /// The profile's sinks, in the order they are written (the recording
    /// before the emissions row: what is kept first).
    pub(crate) fn sinks(self) -> Vec<Box<dyn crate::sink::Sink>> {
        let mut out: Vec<Box<dyn crate::sink::Sink>> = Vec::new();
        if let Some(j) = self.jsonl {
            out.push(Box::new(j));
        }
        if let Some(c) = self.csv_intervals {
            out.push(Box::new(crate::sink::csv::IntervalCsvSink::new(c)));
        }
        if let Some(r) = self.recording {
            out.push(Box::new(r));
        }
        if let Some(path) = self.emissions {
            out.push(Box::new(crate::sink::csv::EmissionsRow::new(path)));
        }
        out
    }
}
