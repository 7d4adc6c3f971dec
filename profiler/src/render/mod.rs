//! Tables for people: the run's table (run.rs), `top`'s live screen
//! (top/), `wattprof sources` (sources.rs), and the pieces they and
//! `report`'s views share (the energy part, named sums, labels).

mod run;
mod sources;
pub(crate) mod top;

pub(crate) use run::{Rows, args_cell, render_run_table};
pub(crate) use sources::render as render_sources;

use std::fmt::Write;

use crate::model::{EnergyJ, RunReport};
use crate::sources::Domain;

/// Rows shown one by one; the rest are summed by name.
const TOP_ROWS: usize = 20;

pub(crate) fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        100.0 * part as f64 / whole as f64
    }
}

/// Which kinds of energy were measured, for the columns.
pub(crate) struct Measured {
    cpu: bool,
    dram: bool,
    gpu: bool,
}

impl Measured {
    pub(crate) fn of(domains: &[crate::model::DomainReport]) -> Self {
        let has = |d: Domain| domains.iter().any(|x| x.domain == d);
        Self {
            cpu: has(Domain::Package),
            dram: has(Domain::Dram),
            gpu: has(Domain::Gpu),
        }
    }

    /// The columns of a report with no machine figures (a daemon's for
    /// a tree): the domains it says were read.
    pub(crate) fn of_domains(read: &[Domain]) -> Self {
        Self {
            cpu: read.contains(&Domain::Package),
            dram: read.contains(&Domain::Dram),
            gpu: read.contains(&Domain::Gpu),
        }
    }

    fn any(&self) -> bool {
        self.cpu || self.dram || self.gpu
    }

    pub(crate) fn header(&self) -> String {
        if self.any() {
            format!(
                " {:>9} {:>9} {:>9} {:>8} {:>8}",
                "CPU J", "DRAM J", "GPU J", "AVG W", "CO2 g"
            )
        } else {
            String::new()
        }
    }

    /// The energy cells without power and CO2 (idle and unattributed
    /// rows have none of their own).
    pub(crate) fn energy_cells(&self, e: &EnergyJ) -> String {
        let cells = self.cells(e);
        cells
            .get(..cells.len().saturating_sub(18))
            .unwrap_or("")
            .to_string()
    }

    pub(crate) fn cells(&self, e: &EnergyJ) -> String {
        if !self.any() {
            return String::new();
        }
        let cell = |on: bool, v: f64| {
            if on {
                format!(" {v:>9.3}")
            } else {
                format!(" {:>9}", "-")
            }
        };
        format!(
            "{}{}{} {:>8.2} {:>8.4}",
            cell(self.cpu, e.package_j),
            cell(self.dram, e.dram_j),
            cell(self.gpu, e.gpu_j),
            e.avg_power_w,
            e.co2_g
        )
    }
}

/// What the energy part of a table shows.
pub(crate) struct EnergyView<'a> {
    pub(crate) readers: &'a [crate::sources::registry::ReaderUse],
    pub(crate) domains: &'a [crate::model::DomainReport],
    pub(crate) g_per_kwh: f64,
    pub(crate) carbon_source: &'a str,
    pub(crate) problems: &'a [String],
    pub(crate) windows: &'a [crate::model::WindowReport],
    pub(crate) window_errors: &'a [String],
    pub(crate) static_note: Option<&'a str>,
    /// MIG instances' energy.
    pub(crate) mig: &'a [crate::model::MigInstanceReport],
    /// Every reader's whole detail (`--verbose`).
    pub(crate) verbose: bool,
}

impl<'a> EnergyView<'a> {
    fn of(r: &'a RunReport) -> Self {
        Self {
            readers: &r.energy.readers,
            domains: &r.energy.domains,
            g_per_kwh: r.energy.carbon_intensity_g_per_kwh,
            carbon_source: &r.energy.carbon_intensity_source,
            problems: &r.energy.problems,
            windows: &r.windows,
            window_errors: &r.window_errors,
            static_note: r.energy.static_power.as_ref().map(|p| p.note.as_str()),
            mig: &r.energy.mig_instances,
            verbose: false,
        }
    }
}

/// Renders the energy part: readers, domains, CO2, windows.
pub(crate) fn render_energy(s: &mut String, r: &EnergyView<'_>) {
    render_readers(s, r.readers, r.verbose);
    render_domains(s, r);
    for p in r.problems.iter().take(3) {
        let _ = writeln!(s, "  warning: {p}");
    }
    render_windows(s, r);
    if let Some(first) = r.window_errors.first() {
        let _ = writeln!(
            s,
            "  warning: window messages: {first} (all problems are in the recording's \
             window_errors)"
        );
    }
}

/// The energy readers, each detail short (`wattprof sources` has why).
fn render_readers(s: &mut String, readers: &[crate::sources::registry::ReaderUse], verbose: bool) {
    let _ = writeln!(s, "\n  energy readers:");
    let mut cut = false;
    for u in readers {
        let (detail, shortened) = if verbose {
            (u.detail.clone(), false)
        } else {
            short_detail(&u.detail)
        };
        cut |= shortened;
        let _ = writeln!(
            s,
            "    {:<5} {:<10} {detail}{}",
            u.kind,
            u.name,
            if u.estimated { " [ESTIMATED]" } else { "" }
        );
        if let Some(fix) = &u.fix {
            let _ = writeln!(s, "                     fix: {fix}");
        }
    }
    if cut {
        let _ = writeln!(
            s,
            "    (why each reader, and the model's source: --verbose, `wattprof sources`, or \
             `energy.readers` in the recording)"
        );
    }
}

/// Each domain's energy and how it was divided, MIG instances, the static
/// power note and the carbon intensity.
fn render_domains(s: &mut String, r: &EnergyView<'_>) {
    if !r.domains.is_empty() {
        let _ = writeln!(
            s,
            "\n  {:<16} {:>12} {:>12} {:>12} {:>12} {:>9}",
            "DOMAIN", "ENERGY J", "PROCESSES J", "IDLE J", "UNATTRIB. J", "AVG W"
        );
        for d in r.domains {
            let name = d.domain.label(d.package);
            let _ = writeln!(
                s,
                "  {:<16} {:>12.3} {:>12.3} {:>12.3} {:>12.3} {:>9.2}{}",
                name,
                d.measured_j,
                d.attributed_j,
                d.idle_j,
                d.unattributed_j,
                d.power.avg_power_w,
                if d.estimated { "  estimated" } else { "" }
            );
            if d.static_j > 0.0 && d.basis == crate::attribution::Basis::Calibrated {
                // The calibration's static power: its own row, inside the
                // wall's idle energy.
                let _ = writeln!(
                    s,
                    "  {:<16} {:>12.3} {:>12} {:>12.3} {:>12} {:>9}  estimated (in wall's IDLE J)",
                    "  node static", d.static_j, "-", d.static_j, "-", "",
                );
            }
        }
        // MIG: what each instance's processes were given of its GPU's.
        for m in r.mig {
            let _ = writeln!(
                s,
                "  {:<16} {:>12} {:>12.3}   {} ({} slices)",
                format!("  MIG {}.{}", m.gpu_instance_id, m.compute_instance_id),
                "-",
                m.energy_j,
                m.uuid,
                m.slices
            );
        }
        if let Some(note) = r.static_note {
            let _ = writeln!(s, "  note: {note}");
        }
        let _ = writeln!(
            s,
            "  CO2 at {} gCO2eq/kWh ({})",
            r.g_per_kwh, r.carbon_source
        );
    }
}

/// The windows (the first 40: the recording has them all).
fn render_windows(s: &mut String, r: &EnergyView<'_>) {
    if !r.windows.is_empty() {
        let m = Measured::of(r.domains);
        let _ = writeln!(
            s,
            "\n  {:<20} {:>8} {:>10} {:>10}{}",
            "WINDOW",
            "PID",
            "LENGTH s",
            "ON-CPU s",
            m.header()
        );
        // Per-step windows can number thousands: the recording has them all.
        const SHOWN: usize = 40;
        for w in r.windows.iter().take(SHOWN) {
            // A file's depth is not trusted: at most 8 levels of indent.
            let name = format!("{}{}", "  ".repeat(w.depth.min(8)), w.name);
            let _ = writeln!(
                s,
                "  {:<20} {:>8} {:>10.3} {:>10.3}{}{}",
                name,
                w.pid,
                secs(w.end_ns.saturating_sub(w.begin_ns)),
                secs(w.on_cpu_ns),
                m.cells(&w.energy),
                if w.unterminated {
                    "  (never ended)"
                } else {
                    ""
                }
            );
        }
    }
    if r.windows.len() > 40 {
        let _ = writeln!(
            s,
            "  ... {} more windows (all are in the --output recording)",
            r.windows.len() - 40
        );
    }
}

/// The functions with the most energy (`--stacks`).
pub(crate) fn render_functions(s: &mut String, st: &crate::model::stacks::StackReport, top: usize) {
    let lost = if st.lost_samples + st.merged_samples + st.lost_execs > 0 {
        format!(
            "; {} samples lost (ring full), {} merged into [other stacks], {} execs lost",
            st.lost_samples, st.merged_samples, st.lost_execs
        )
    } else {
        String::new()
    };
    let _ = writeln!(
        s,
        "\n  stacks: {} samples profiled ({} taken) at {} Hz on {} CPUs, {} distinct stacks{lost}",
        st.profiled_samples, st.samples, st.hz, st.cpus, st.stacks
    );
    if st.functions.is_empty() {
        return;
    }
    let (wall, j) = (st.wall_only(), st.shown_j());
    let _ = writeln!(
        s,
        "  top functions by energy{} (self: as the innermost frame; total: with what it called):\n  {:>12} {:>12} {:>8}  function",
        if wall { " (wall)" } else { "" },
        "self J",
        "total J",
        "samples"
    );
    for f in st.functions.iter().take(top) {
        let _ = writeln!(
            s,
            "  {:>12.3} {:>12.3} {:>8}  {}",
            j(&f.self_energy),
            j(&f.energy),
            f.samples,
            f.function
        );
    }
}

/// The ten containers with the most energy, and how many more there are.
pub(crate) fn render_containers(s: &mut String, containers: &[crate::model::ContainerReport]) {
    if containers.is_empty() {
        return;
    }
    render_sums(
        s,
        "CONTAINER / UNIT",
        containers
            .iter()
            .take(10)
            .map(|c| (container_label(c), c.on_cpu_ns, &c.energy)),
    );
    if containers.len() > 10 {
        let _ = writeln!(s, "  ... {} more (in the recording)", containers.len() - 10);
    }
}

/// Every batch job with its steps (a node runs a handful at a time; a
/// long `monitor` lists the ten with the most energy).
pub(crate) fn render_jobs(s: &mut String, jobs: &[crate::model::JobReport]) {
    if jobs.is_empty() {
        return;
    }
    let rows = jobs.iter().take(10).flat_map(|j| {
        let own = std::iter::once((job_label(j), j.on_cpu_ns, &j.energy));
        // A job of one step has its row only.
        let steps = j.steps.iter().filter(|_| j.steps.len() > 1).map(move |st| {
            let name = if st.step.is_empty() {
                format!("  {}.(no step)", j.job_id)
            } else {
                format!("  {}.{}", j.job_id, st.step)
            };
            (name, st.on_cpu_ns, &st.energy)
        });
        own.chain(steps)
    });
    render_sums(s, "BATCH JOB (STEP)", rows);
    if jobs.len() > 10 {
        let _ = writeln!(s, "  ... {} more (in the recording)", jobs.len() - 10);
    }
}

/// A batch job's label in tables: scheduler, id, user, and its step
/// where it has one only.
pub(crate) fn job_label(j: &crate::model::JobReport) -> String {
    let mut label = format!("{} {}", j.scheduler, j.job_id);
    if let [only] = j.steps.as_slice()
        && !only.step.is_empty()
    {
        label = format!("{label}.{}", only.step);
    }
    with_user(label, j)
}

/// A batch job's name whatever its steps: scheduler, id, user.
pub(crate) fn job_name(j: &crate::model::JobReport) -> String {
    with_user(format!("{} {}", j.scheduler, j.job_id), j)
}

/// `label (user)`, printable.
fn with_user(mut label: String, j: &crate::model::JobReport) -> String {
    if let Some(u) = &j.user {
        label.push_str(&format!(" ({u})"));
    }
    printable_text(&label)
}

/// Control characters as `?` (names come from cgroup paths and users).
pub(crate) fn printable_text(t: &str) -> String {
    t.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// Shortens from the left to `width` characters.
pub(crate) fn left_cut(text: &str, width: usize) -> String {
    let n = text.chars().count();
    if n > width {
        format!(
            "...{}",
            text.chars().skip(n + 3 - width).collect::<String>()
        )
    } else {
        text.to_string()
    }
}

/// Rows of named energy sums (containers, cgroups): name, on-CPU time,
/// energy, average power, CO2.
fn render_sums<'a>(
    s: &mut String,
    title: &str,
    rows: impl Iterator<Item = (String, u64, &'a EnergyJ)>,
) {
    let _ = writeln!(
        s,
        "\n  {:<56} {:>10} {:>10} {:>8} {:>9}",
        title, "ON-CPU s", "ENERGY J", "AVG W", "CO2 g"
    );
    for (name, ns, e) in rows {
        let _ = writeln!(
            s,
            "  {:<56} {:>10.3} {:>10.3} {:>8.2} {:>9.4}",
            left_cut(&name, 56),
            secs(ns),
            e.total_j,
            e.avg_power_w,
            e.co2_g
        );
    }
}

/// A container's label in tables: runtime, name or short id, pod.
pub(crate) fn container_label(c: &crate::model::ContainerReport) -> String {
    let short: String = c.id.chars().take(12).collect();
    let mut label = match &c.name {
        Some(n) => format!("{} {n} ({short})", c.runtime.name()),
        None => format!(
            "{} {}",
            c.runtime.name(),
            if c.runtime == crate::process::container::Runtime::Systemd {
                c.id.clone()
            } else {
                short
            }
        ),
    };
    if let Some(pod) = &c.pod_uid {
        label.push_str(&format!(" pod {}", pod.chars().take(8).collect::<String>()));
    }
    label
}

/// The closing line of `run`'s and `report`'s group rows: the busy CPU
/// time out of all the CPUs' time over the profile's wall time.
pub(crate) fn cpu_time_line(busy_ns: u64, window_ns: u64, cpus: usize, wall_ns: u64) -> String {
    format!(
        "  {:<34} {:>10.3} s  of {:.3} s ({cpus} CPUs x {:.3} s)",
        "busy CPU time",
        secs(busy_ns),
        secs(window_ns),
        secs(wall_ns)
    )
}

/// "1 process", "2 processes".
pub(crate) fn processes(n: usize) -> String {
    if n == 1 {
        "1 process".to_string()
    } else {
        format!("{n} processes")
    }
}

/// A reader's detail as a table shows it: whole up to 100 characters,
/// else up to its first `: ` (what it reads; why, and the model's source,
/// are in `wattprof sources` and the recording), else cut at a word.
/// Whether it was shortened.
pub(crate) fn short_detail(detail: &str) -> (String, bool) {
    const MAX: usize = 100;
    if detail.chars().count() <= MAX {
        return (detail.to_string(), false);
    }
    let head = detail.split_once(": ").map_or(detail, |(h, _)| h);
    if head.chars().count() <= MAX {
        return (head.to_string(), head.len() < detail.len());
    }
    let mut out: String = head.chars().take(MAX).collect();
    if let Some(space) = out.rfind(' ') {
        out.truncate(space);
    }
    out.push_str("...");
    (out, true)
}

#[cfg(test)]
mod detail_tests {
    use super::short_detail;

    #[test]
    fn a_long_reader_detail_is_cut_to_what_it_reads() {
        let short = "no GPU energy: no NVIDIA driver found";
        assert_eq!(short_detail(short), (short.to_string(), false));
        let vcpu = format!(
            "vcpu model, vCPUs x (0.45 W + utilization x 1.57 W): a VM guest {}",
            "(hypervisor flag), ".repeat(20)
        );
        assert_eq!(
            short_detail(&vcpu),
            (
                "vcpu model, vCPUs x (0.45 W + utilization x 1.57 W)".to_string(),
                true
            )
        );
        let words = "word ".repeat(60);
        let (cut, shortened) = short_detail(&words);
        assert!(
            shortened && cut.ends_with("...") && cut.len() <= 103,
            "{cut}"
        );
    }
}
