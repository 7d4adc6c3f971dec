//! The table `wattprof run` prints when the command ends.

use std::collections::BTreeMap;
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
        }
    }
}

/// Renders the energy part: domains, readers, CO2, windows.
pub(crate) fn render_energy(s: &mut String, r: &EnergyView<'_>) {
    let _ = writeln!(s, "\n  energy readers:");
    for u in r.readers {
        let _ = writeln!(
            s,
            "    {:<5} {:<10} {}{}",
            u.kind,
            u.name,
            u.detail,
            if u.estimated { " [ESTIMATED]" } else { "" }
        );
        if let Some(fix) = &u.fix {
            let _ = writeln!(s, "                     fix: {fix}");
        }
    }
    if !r.domains.is_empty() {
        let _ = writeln!(
            s,
            "\n  {:<16} {:>12} {:>12} {:>12} {:>12} {:>9}",
            "DOMAIN", "MEASURED J", "PROCESSES J", "IDLE J", "UNATTRIB. J", "AVG W"
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
        if let Some(note) = r.static_note {
            let _ = writeln!(s, "  note: {note}");
        }
        let _ = writeln!(
            s,
            "  CO2 at {} gCO2eq/kWh ({})",
            r.g_per_kwh, r.carbon_source
        );
    }
    for p in r.problems.iter().take(3) {
        let _ = writeln!(s, "  warning: {p}");
    }
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
    if let Some(first) = r.window_errors.first() {
        let _ = writeln!(
            s,
            "  warning: window messages: {first} (all problems are in the recording's \
             window_errors)"
        );
    }
}

/// Renders the end-of-run table. Shares are of all CPU time in the run
/// (every CPU's window: busy + idle + lost).
pub(crate) fn render_run_table(r: &RunReport) -> String {
    let mut s = String::new();
    let m = Measured::of(&r.energy.domains);
    let tree_procs = run_header(&mut s, r, &m);
    run_processes(&mut s, r, &m);
    run_groups(&mut s, r, &m, tree_procs);
    run_notes(&mut s, r);
    render_containers(&mut s, &r.containers);
    render_energy(&mut s, &EnergyView::of(r));
    if let Some(st) = &r.stacks {
        render_functions(&mut s, st, 10);
    }
    s
}

/// The run's first line and the process table's header; the number of
/// processes in the command's tree.
fn run_header(s: &mut String, r: &RunReport, m: &Measured) -> usize {
    let (argv, outcome, tree_procs) = match &r.command {
        Some(c) => (
            c.argv.join(" "),
            match (c.exit_code, c.signal) {
                (_, Some(sig)) => format!("was killed by signal {sig}"),
                (Some(code), _) => format!("exited with code {code}"),
                _ => "ended".to_string(),
            },
            c.processes,
        ),
        None => ("the machine".to_string(), "monitored".to_string(), 0),
    };
    let _ = writeln!(
        s,
        "\nwattprof: `{argv}` {outcome} after {:.3} s; {} CPUs, {} package(s); {} tracker",
        secs(r.wall_ns),
        r.machine.cpus,
        r.machine.package_ids.len(),
        match r.profiler.tracker {
            crate::tracker::TrackerKind::Iter => "iterator",
            crate::tracker::TrackerKind::Switch => "switch",
        }
    );
    let _ = writeln!(
        s,
        "\n{:>8} {:>8}  {:<16} {:>10} {:>7}{} {:>9} {:>9}",
        "PID",
        "PPID",
        "COMMAND",
        "ON-CPU s",
        "SHARE",
        m.header(),
        "START s",
        "END s"
    );
    tree_procs
}

/// The processes with the most CPU time, then the rest folded by name.
fn run_processes(s: &mut String, r: &RunReport, m: &Measured) {
    let total = r.machine.window_ns;
    let mut procs: Vec<_> = r.processes.iter().collect();
    procs.sort_by(|a, b| b.on_cpu_ns.cmp(&a.on_cpu_ns).then(a.pid.cmp(&b.pid)));
    let opt = |t: Option<u64>| t.map_or_else(|| "-".to_string(), |t| format!("{:.3}", secs(t)));
    for p in procs.iter().take(TOP_ROWS) {
        let _ = writeln!(
            s,
            "{:>8} {:>8}  {:<16} {:>10.3} {:>6.1}%{} {:>9} {:>9}",
            p.pid,
            p.ppid.map_or_else(|| "-".to_string(), |v| v.to_string()),
            p.comm,
            secs(p.on_cpu_ns),
            pct(p.on_cpu_ns, total),
            m.cells(&p.energy),
            opt(p.start_ns),
            opt(p.exit_ns),
        );
    }
    if procs.len() > TOP_ROWS {
        let mut by_name: BTreeMap<&str, (usize, u64)> = BTreeMap::new();
        for p in &procs[TOP_ROWS..] {
            let e = by_name.entry(p.comm.as_str()).or_default();
            e.0 += 1;
            e.1 += p.on_cpu_ns;
        }
        let mut rest: Vec<_> = by_name.into_iter().collect();
        rest.sort_by_key(|r| std::cmp::Reverse(r.1.1));
        for (name, (n, ns)) in rest.iter().take(5) {
            let _ = writeln!(
                s,
                "{:>8} {:>8}  {:<16} {:>10.3} {:>6.1}%   ({n} more processes)",
                "+",
                "",
                name,
                secs(*ns),
                pct(*ns, total)
            );
        }
        if rest.len() > 5 {
            let (n, ns) = rest[5..]
                .iter()
                .fold((0, 0), |(a, b), (_, (n, ns))| (a + n, b + ns));
            let _ = writeln!(
                s,
                "{:>8} {:>8}  {:<16} {:>10.3} {:>6.1}%   ({n} more processes)",
                "+",
                "",
                "(other names)",
                secs(ns),
                pct(ns, total)
            );
        }
    }
}

/// The groups every process is in, idle and unattributed energy, and all
/// CPU time.
fn run_groups(s: &mut String, r: &RunReport, m: &Measured, tree_procs: usize) {
    let total = r.machine.window_ns;
    let sum = |d: Domain, f: fn(&crate::model::DomainReport) -> f64| -> f64 {
        r.energy
            .domains
            .iter()
            .filter(|x| x.domain == d)
            .map(f)
            .sum()
    };
    let idle = EnergyJ {
        package_j: sum(Domain::Package, |x| x.idle_j),
        dram_j: sum(Domain::Dram, |x| x.idle_j),
        gpu_j: sum(Domain::Gpu, |x| x.idle_j),
        ..EnergyJ::default()
    };
    let lost = EnergyJ {
        package_j: sum(Domain::Package, |x| x.unattributed_j),
        dram_j: sum(Domain::Dram, |x| x.unattributed_j),
        gpu_j: sum(Domain::Gpu, |x| x.unattributed_j),
        ..EnergyJ::default()
    };
    let g = &r.energy.groups;
    let mut rows = vec![
        (
            "wattprof itself".to_string(),
            r.groups.profiler_ns,
            g.profiler,
        ),
        (
            "rest of the machine".to_string(),
            r.groups.other_ns,
            g.other,
        ),
        ("idle".to_string(), r.machine.idle_ns, idle),
        ("lost / unattributed".to_string(), r.lost_ns, lost),
    ];
    if r.command.is_some() {
        rows.insert(
            0,
            (
                format!("command tree ({tree_procs} processes)"),
                r.groups.tree_ns,
                g.tree,
            ),
        );
    }
    let _ = writeln!(s);
    for (label, ns, e) in rows {
        // Idle and unattributed rows have no power or CO2 of their own.
        let cells = if label == "idle" || label.starts_with("lost") {
            m.energy_cells(&e)
        } else {
            m.cells(&e)
        };
        let _ = writeln!(
            s,
            "  {label:<34} {:>10.3} s {:>6.1}%{cells}",
            secs(ns),
            pct(ns, total)
        );
    }
    let _ = writeln!(
        s,
        "  {:<34} {:>10.3} s  ({} CPUs x {:.3} s)",
        "all CPU time",
        secs(total),
        r.machine.cpus,
        secs(r.wall_ns)
    );
}

/// What was lost or approximated, and why the switch tracker ran.
fn run_notes(s: &mut String, r: &RunReport) {
    if r.lost_ns > 0 || r.profiler.events_lost > 0 || r.profiler.discarded_ns > 0 {
        let _ = writeln!(
            s,
            "  warning: {:.3} s of task time not recorded, {} events lost, {:.3} s discarded \
             (raise --max-tasks; see README, \"Limits\")",
            secs(r.lost_ns),
            r.profiler.events_lost,
            secs(r.profiler.discarded_ns)
        );
    }
    let p = &r.profiler;
    if p.filter_overflow > 0 {
        let _ = writeln!(
            s,
            "  note: {} threads did not fit the tracker's filter and were read at every \
             interval (nothing lost; raise --max-tasks to read less)",
            p.filter_overflow
        );
    }
    if p.settled_from_exit > 0 || p.vanished_threads > 0 {
        let _ = writeln!(
            s,
            "  note: {} exited threads settled from their exit's reading (up to a tick \
             short), {} threads gone unseen (events lost); see README, \"Limits\"",
            p.settled_from_exit, p.vanished_threads
        );
    }
    if p.ended_unseen > 0 {
        let _ = writeln!(
            s,
            "  note: {} processes ended with neither exit nor free record (both lost): named \
             from their fork, time up to their last reading; see README, \"Guarantees\"",
            p.ended_unseen
        );
    }
    if let Some(why) = &p.tracker_fallback {
        let _ = writeln!(
            s,
            "  note: the switch tracker ran (it costs every context switch) because {why}"
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
    let wall = st
        .functions
        .iter()
        .any(|f| f.energy.total_j == 0.0 && f.energy.wall_j > 0.0);
    let j = |e: &crate::model::EnergyJ| if wall { e.wall_j } else { e.total_j };
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
        let _ = write!(power, "  {name}: {:.1} W", d.power.power_w);
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
            for p in iv.process_rows().iter().take(top) {
                let _ = writeln!(
                    s,
                    "{:>8}  {:<16} {:>6.1}% {:>9.2} {:>9.2} {:>9.2} {:>10}",
                    p.pid,
                    p.comm,
                    100.0 * p.on_cpu_ns as f64 / 1e9 / dur_s,
                    p.package_j / dur_s,
                    p.dram_j / dur_s,
                    p.gpu_j / dur_s,
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
