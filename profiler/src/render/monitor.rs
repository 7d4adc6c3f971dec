//! One screen of `wattprof monitor`.

use std::fmt::Write;

use super::{container_label, render_sums, secs};
use crate::sources::Domain;

/// What `monitor`'s rows are.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum By {
    /// Processes, by power over the last interval.
    Process,
    /// Containers and systemd units, by energy so far.
    Container,
    /// cgroups, by energy so far.
    Cgroup,
}

/// One screen of `wattprof monitor`: the last interval's top processes by
/// power, or the containers or cgroups with the most energy so far.
pub(crate) fn render_monitor_frame(
    interval: Option<&crate::model::record::IntervalRecord>,
    containers: &[crate::model::ContainerReport],
    cgroups: &[crate::model::CgroupReport],
    elapsed_ns: u64,
    top: usize,
    by: By,
) -> String {
    let mut s = String::new();
    let Some(iv) = interval else {
        return s;
    };
    let dur_s = iv.duration_s();
    let mut power = String::new();
    for d in &iv.domains {
        let name = match d.package {
            Some(p) => format!("{} {p}", d.domain.name()),
            None => d.domain.name().to_string(),
        };
        let _ = write!(
            power,
            "  {name}: {:.1} W{}",
            d.power.power_w,
            if d.estimated { " (estimated)" } else { "" }
        );
    }
    if power.is_empty() {
        power = "  (no energy reader: see `wattprof sources`)".into();
    }
    let _ = writeln!(s, "wattprof monitor  {:.0} s{power}", secs(elapsed_ns));
    match by {
        By::Process => {
            let _ = writeln!(
                s,
                "\n{:>8}  {:<16} {:>7} {:>9} {:>9} {:>9} {:>10}",
                "PID", "COMMAND", "CPU%", "CPU W", "DRAM W", "GPU W", "PSS MiB"
            );
            // A domain with no reader is `-`, as in every table.
            let read = iv.read();
            let watts = |d: Domain, j: f64| {
                if read.has(d) {
                    format!("{:.2}", j / dur_s)
                } else {
                    "-".to_string()
                }
            };
            for p in iv.process_rows().iter().take(top) {
                let _ = writeln!(
                    s,
                    "{:>8}  {:<16} {:>6.1}% {:>9} {:>9} {:>9} {:>10}",
                    p.pid,
                    p.comm,
                    100.0 * p.on_cpu_ns as f64 / 1e9 / dur_s,
                    watts(Domain::Package, p.package_j),
                    watts(Domain::Dram, p.dram_j),
                    watts(Domain::Gpu, p.gpu_j),
                    p.pss_bytes.map_or_else(
                        || "-".to_string(),
                        |b| format!("{:.1}", b as f64 / 1048576.0)
                    ),
                );
            }
        }
        By::Container => render_sums(
            &mut s,
            "CONTAINER / UNIT",
            containers
                .iter()
                .take(top)
                .map(|c| (container_label(c), c.on_cpu_ns, &c.energy)),
        ),
        By::Cgroup => render_sums(
            &mut s,
            "CGROUP",
            cgroups
                .iter()
                .take(top)
                .map(|c| (c.path.clone(), c.on_cpu_ns, &c.energy)),
        ),
    }
    s
}
