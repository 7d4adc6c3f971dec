//! `report --plot FILE.svg` and `--html FILE.html`: power over time per
//! domain, the stacked power of the top processes (or groups) with the
//! windows shaded, and the energy of each window, drawn with plotters.
//! The HTML page is self-contained: the SVG inline, a stylesheet, no
//! script and nothing fetched.

use std::fmt::Write;

use plotters::coord::Shift;
use plotters::coord::types::RangedCoordf64;
use plotters::prelude::*;

use super::{Loaded, Summary};
use crate::model::record::IntervalRecord;
use crate::sources::Domain;

/// The plots' size in pixels.
const WIDTH: u32 = 1100;
const PANEL_HEIGHT: u32 = 380;
/// Processes drawn one by one in the stack; the rest are summed.
const TOP: usize = 6;
/// Windows drawn as bars (the first ones); all are in the file.
const BARS: usize = 120;

/// Why there is nothing to draw, or drawing failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum PlotError {
    /// No interval records.
    #[error("{0} has no interval records: there is no power over time to plot")]
    NoIntervals(String),
    /// plotters failed.
    #[error("drawing the plot failed: {0}")]
    Draw(String),
}

fn draw_err<E: std::fmt::Debug>(e: E) -> PlotError {
    PlotError::Draw(format!("{e:?}"))
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Step points for per-interval values: flat over each interval.
fn steps<'a>(
    values: impl Iterator<Item = (&'a IntervalRecord, f64)> + 'a,
) -> impl Iterator<Item = (f64, f64)> + 'a {
    values.flat_map(|(iv, v)| {
        [
            (secs(iv.t_ns.saturating_sub(iv.duration_ns)), v),
            (secs(iv.t_ns), v),
        ]
    })
}

/// A line of text where a panel has nothing to draw.
fn note(area: &DrawingArea<SVGBackend<'_>, Shift>, text: &str) -> Result<(), PlotError> {
    area.draw(&Text::new(text, (80, 60), ("sans-serif", 16)))
        .map_err(draw_err)
}

fn x_range(l: &Loaded) -> std::ops::Range<f64> {
    let first = l
        .intervals
        .first()
        .map_or(0, |i| i.t_ns.saturating_sub(i.duration_ns));
    let last = l.intervals.last().map_or(1, |i| i.t_ns);
    secs(first)..secs(last.max(first + 1))
}

/// Text for plotters: control characters (a process can name itself
/// anything) would make the SVG invalid XML.
fn clean(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

type Chart<'a, 'b> = ChartContext<'a, SVGBackend<'b>, Cartesian2d<RangedCoordf64, RangedCoordf64>>;

/// A panel's chart: `x` by 0 to a little above `y_max`, which must be
/// finite (values near f64's limit in a damaged file would make plotters
/// loop for ever).
/// A chart whose y axis reaches above `y_max` by room for a legend of
/// `legend_rows` rows in its upper left corner, so it never sits on the
/// data.
fn chart<'a, 'b: 'a>(
    area: &'a DrawingArea<SVGBackend<'b>, Shift>,
    caption: &str,
    x: std::ops::Range<f64>,
    y_max: f64,
    legend_rows: usize,
) -> Result<Chart<'a, 'b>, PlotError> {
    // A legend row is about 20 px of a 300 px panel's 210 px of plot.
    let legend = (legend_rows as f64 * 20.0 + 10.0) / 210.0;
    let y_top = y_max * 1.05 / (1.0 - legend.min(0.6));
    if !y_top.is_finite() || !x.end.is_finite() {
        return Err(PlotError::Draw(format!(
            "{caption}: a value too large to plot ({y_max:e}); is the file damaged?"
        )));
    }
    ChartBuilder::on(area)
        .caption(caption, ("sans-serif", 20))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(55)
        .build_cartesian_2d(x, 0.0..y_top)
        .map_err(draw_err)
}

fn color(i: usize) -> RGBColor {
    let c = Palette99::pick(i).to_rgba();
    RGBColor(c.0, c.1, c.2)
}

/// Power over time, one line per domain and package.
fn power_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, l: &Loaded) -> Result<(), PlotError> {
    let series: Vec<(Domain, Option<u32>)> = l
        .summary
        .domains
        .iter()
        .map(|d| (d.domain, d.package))
        .collect();
    let power = |iv: &IntervalRecord, d: Domain, p: Option<u32>| {
        iv.domains
            .iter()
            .find(|x| x.domain == d && x.package == p)
            .map_or(0.0, |x| x.power.power_w)
    };
    let top = l
        .intervals
        .iter()
        .flat_map(|iv| series.iter().map(move |&(d, p)| power(iv, d, p)))
        .fold(1.0f64, f64::max);
    // Titled as it is: a model's estimate is never headed "measured".
    let estimated = l.summary.domains.iter().filter(|d| d.estimated).count();
    let title = match estimated {
        0 => "Measured power per domain",
        n if n == l.summary.domains.len() => "Estimated power per domain",
        _ => "Power per domain (some estimated: see the table)",
    };
    let mut chart = chart(area, title, x_range(l), top, series.len())?;
    chart
        .configure_mesh()
        .x_desc("time since start (s)")
        .y_desc("W")
        .draw()
        .map_err(draw_err)?;
    if series.is_empty() {
        note(area, "no energy was measured (see `wattprof sources`)")?;
    }
    for (i, &(d, p)) in series.iter().enumerate() {
        let c = color(i);
        chart
            .draw_series(LineSeries::new(
                steps(l.intervals.iter().map(move |iv| (iv, power(iv, d, p)))),
                c.stroke_width(2),
            ))
            .map_err(draw_err)?
            .label(d.label(p))
            .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], c.stroke_width(2)));
    }
    if !series.is_empty() {
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::UpperLeft)
            .background_style(WHITE.mix(0.85))
            .border_style(BLACK)
            .draw()
            .map_err(draw_err)?;
    }
    Ok(())
}

/// The layers of the stack: each a name and its power per interval.
fn layers(l: &Loaded) -> (String, Vec<(String, Vec<f64>)>) {
    let ivs = &l.intervals;
    let has_processes = ivs.iter().any(|i| !i.process_rows().is_empty());
    let measured = |iv: &IntervalRecord, f: fn(&crate::model::record::DomainRow) -> f64| {
        iv.domains
            .iter()
            .filter(|d| matches!(d.domain, Domain::Package | Domain::Dram | Domain::Gpu))
            .map(f)
            .sum::<f64>()
    };
    let mut out: Vec<(String, Vec<f64>)> = Vec::new();
    let title;
    if has_processes {
        title = format!("Power of the top {TOP} processes, stacked (windows shaded)");
        let top: Vec<(u32, String)> = l
            .summary
            .processes
            .iter()
            .take(TOP)
            .map(|p| (p.pid, p.comm.clone()))
            .collect();
        for (pid, comm) in &top {
            out.push((
                format!("{} ({pid})", clean(comm)),
                ivs.iter()
                    .map(|iv| {
                        iv.process_rows()
                            .iter()
                            .find(|p| p.pid == *pid)
                            .map_or(0.0, |p| p.total_j() / iv.duration_s())
                    })
                    .collect(),
            ));
        }
        out.push((
            "other processes".into(),
            ivs.iter()
                .map(|iv| {
                    let all = iv.groups.tree.energy_j
                        + iv.groups.profiler.energy_j
                        + iv.groups.other.energy_j;
                    let shown: f64 = iv
                        .process_rows()
                        .iter()
                        .filter(|p| top.iter().any(|t| t.0 == p.pid))
                        .map(|p| p.total_j())
                        .sum();
                    (all - shown).max(0.0) / iv.duration_s()
                })
                .collect(),
        ));
    } else {
        title = "Power of each group, stacked (windows shaded)".to_string();
        let group = |name: &str, f: fn(&IntervalRecord) -> f64| {
            (
                name.to_string(),
                ivs.iter().map(|iv| f(iv) / iv.duration_s()).collect(),
            )
        };
        if l.summary.mode == "run" {
            out.push(group("command tree", |iv| iv.groups.tree.energy_j));
        }
        out.push(group("wattprof", |iv| iv.groups.profiler.energy_j));
        out.push(group("rest of the machine", |iv| iv.groups.other.energy_j));
    }
    out.push((
        "idle".into(),
        ivs.iter()
            .map(|iv| measured(iv, |d| d.idle_j) / iv.duration_s())
            .collect(),
    ));
    out.push((
        "unattributed".into(),
        ivs.iter()
            .map(|iv| measured(iv, |d| d.unattributed_j) / iv.duration_s())
            .collect(),
    ));
    (title, out)
}

/// Stacked power of the top processes (or groups), windows shaded.
fn stack_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, l: &Loaded) -> Result<(), PlotError> {
    let (title, layers) = layers(l);
    // Running sums, bottom layer first.
    let mut cumulative: Vec<Vec<f64>> = Vec::new();
    for (_, v) in &layers {
        let below = cumulative.last();
        cumulative.push(
            v.iter()
                .enumerate()
                .map(|(i, x)| x + below.map_or(0.0, |b| b[i]))
                .collect(),
        );
    }
    let top = cumulative
        .last()
        .map_or(1.0, |c| c.iter().copied().fold(1.0f64, f64::max));
    let mut chart = chart(area, &title, x_range(l), top, cumulative.len())?;
    chart
        .configure_mesh()
        .x_desc("time since start (s)")
        .y_desc("W")
        .draw()
        .map_err(draw_err)?;
    let y_top = top * 1.15;
    for (i, w) in l.summary.windows.iter().enumerate() {
        let (b, e) = (secs(w.begin_ns), secs(w.end_ns));
        let shade = if i % 2 == 0 {
            BLUE.mix(0.08)
        } else {
            BLUE.mix(0.14)
        };
        chart
            .draw_series([Rectangle::new([(b, 0.0), (e, y_top)], shade.filled())])
            .map_err(draw_err)?;
        if l.summary.windows.len() <= 30 {
            chart
                .draw_series([Text::new(
                    clean(&w.name),
                    (b, y_top * (0.98 - 0.05 * w.depth.min(8) as f64)),
                    ("sans-serif", 12),
                )])
                .map_err(draw_err)?;
        }
    }
    // Top layer first, so each lower one is drawn over it.
    for (i, c) in cumulative.iter().enumerate().rev() {
        let col = color(i);
        let points: Vec<(f64, f64)> = steps(l.intervals.iter().zip(c.iter().copied())).collect();
        chart
            .draw_series(AreaSeries::new(points, 0.0, col.mix(0.75)).border_style(col))
            .map_err(draw_err)?
            .label(layers[i].0.clone())
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 14, y + 5)], col.filled()));
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(draw_err)?;
    Ok(())
}

/// The tree's energy in each window, as bars.
fn window_panel(area: &DrawingArea<SVGBackend<'_>, Shift>, s: &Summary) -> Result<(), PlotError> {
    let ws: Vec<_> = s.windows.iter().take(BARS).collect();
    let top = ws.iter().map(|w| w.energy.total_j).fold(1e-3f64, f64::max);
    let caption = if s.windows.len() > BARS {
        format!("Energy per window (first {BARS} of {})", s.windows.len())
    } else {
        "Energy per window".to_string()
    };
    let mut chart = chart(area, &caption, -0.5..(ws.len().max(1) as f64 - 0.5), top, 0)?;
    let names: Vec<String> = ws.iter().map(|w| clean(&w.name)).collect();
    chart
        .configure_mesh()
        .disable_x_mesh()
        .x_labels(ws.len().clamp(1, 20))
        .x_label_formatter(&|x| {
            let i = x.round();
            if (x - i).abs() < 1e-9 && i >= 0.0 && (i as usize) < names.len() {
                names[i as usize].clone()
            } else {
                String::new()
            }
        })
        .x_desc("window, in the order it ended")
        .y_desc("J (the tree's energy)")
        .draw()
        .map_err(draw_err)?;
    if ws.is_empty() {
        note(area, "no windows in this profile (see docs/windows.md)")?;
        return Ok(());
    }
    chart
        .draw_series(ws.iter().enumerate().map(|(i, w)| {
            let x = i as f64;
            Rectangle::new(
                [(x - 0.4, 0.0), (x + 0.4, w.energy.total_j)],
                color(0).mix(0.8).filled(),
            )
        }))
        .map_err(draw_err)?;
    Ok(())
}

/// The panels as one SVG document: power per domain, the stacked power,
/// and the energy per window where there are windows (no empty plot).
pub(crate) fn svg(l: &Loaded) -> Result<String, PlotError> {
    if l.intervals.is_empty() {
        return Err(PlotError::NoIntervals(l.summary.file.clone()));
    }
    let n = if l.summary.windows.is_empty() { 2 } else { 3 };
    let mut out = String::new();
    {
        let root = SVGBackend::with_string(&mut out, (WIDTH, PANEL_HEIGHT * n)).into_drawing_area();
        root.fill(&WHITE).map_err(draw_err)?;
        let panels = root.split_evenly((n as usize, 1));
        power_panel(&panels[0], l)?;
        stack_panel(&panels[1], l)?;
        if n == 3 {
            window_panel(&panels[2], &l.summary)?;
        }
        root.present().map_err(draw_err)?;
    }
    Ok(out)
}

/// Escapes text for HTML.
fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '&' => o.push_str("&amp;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c => o.push(c),
        }
    }
    o
}

/// Who used the energy, as the text table says it: the command tree,
/// wattprof, the rest of the machine, idle and unattributed, and the CO2
/// at the carbon intensity used.
fn html_groups(h: &mut String, s: &Summary) {
    let (t, e) = (&s.group_times, &s.group_energy);
    let sum = |f: fn(&crate::model::DomainReport) -> f64| s.domains.iter().map(f).sum::<f64>();
    let mut rows: Vec<(&str, Option<f64>, f64)> = Vec::new();
    if s.mode == "run" {
        rows.push(("command tree", Some(t.tree_ns as f64 / 1e9), e.tree.total_j));
    }
    rows.push((
        "wattprof",
        Some(t.profiler_ns as f64 / 1e9),
        e.profiler.total_j,
    ));
    rows.push((
        "rest of the machine",
        Some(t.other_ns as f64 / 1e9),
        e.other.total_j,
    ));
    rows.push(("idle", None, sum(|d| d.idle_j)));
    rows.push(("unattributed", None, sum(|d| d.unattributed_j)));
    h.push_str(
        "<h2>Who used the energy</h2>\n<table><tr><th>group</th><th>on-CPU s</th>\
         <th>energy J</th></tr>\n",
    );
    for (name, cpu, j) in rows {
        let _ = writeln!(
            h,
            "<tr><td>{name}</td><td>{}</td><td>{j:.3}</td></tr>",
            cpu.map_or_else(|| "-".to_string(), |c| format!("{c:.3}"))
        );
    }
    let _ = writeln!(
        h,
        "</table>\n<p>CO2 at a carbon intensity of {:.0} gCO2eq/kWh ({}).</p>",
        s.carbon_intensity_g_per_kwh,
        esc(&s.carbon_intensity_source)
    );
}

/// The energy readers, each labelled estimated where it is a model.
fn html_readers(h: &mut String, s: &Summary) {
    if s.readers.is_empty() {
        return;
    }
    h.push_str(
        "<h2>Energy readers</h2>\n<table><tr><th>kind</th><th>reader</th><th>what</th></tr>\n",
    );
    for u in &s.readers {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td class=\"text\">{}{}</td><td class=\"text\">{}</td></tr>",
            esc(&u.kind),
            esc(&u.name),
            if u.estimated { " (estimated)" } else { "" },
            esc(&u.detail)
        );
    }
    h.push_str("</table>\n");
}

/// The top functions by energy (`--stacks`), as the text table has them.
fn html_functions(h: &mut String, s: &Summary) {
    let Some(st) = &s.stacks else {
        return;
    };
    let _ = writeln!(
        h,
        "<h2>Top functions by energy</h2>\n<p>{} samples of the profiled processes ({} \
         taken) at {} Hz on {} CPUs, {} distinct stacks. Self: as the innermost frame; \
         total: with what it called.</p>",
        st.profiled_samples, st.samples, st.hz, st.cpus, st.stacks
    );
    if st.functions.is_empty() {
        return;
    }
    let (wall, j) = (st.wall_only(), st.shown_j());
    let unit = if wall { "wall J" } else { "J" };
    let _ = writeln!(
        h,
        "<table><tr><th>function</th><th>self {unit}</th><th>total {unit}</th>\
         <th>samples</th></tr>"
    );
    for f in st.functions.iter().take(20) {
        let _ = writeln!(
            h,
            "<tr><td class=\"text\">{}</td><td>{:.3}</td><td>{:.3}</td><td>{}</td></tr>",
            esc(&f.function),
            j(&f.self_energy),
            j(&f.energy),
            f.samples
        );
    }
    h.push_str("</table>\n");
}

/// Each domain: its energy, how it was divided, its average power; an
/// estimate marked.
fn html_domains(h: &mut String, s: &Summary) {
    h.push_str(
        "<h2>Energy per domain</h2>\n<table><tr><th>domain</th><th>energy J</th>\
         <th>processes J</th><th>idle J</th><th>unattributed J</th><th>average W</th></tr>\n",
    );
    for d in &s.domains {
        let _ = writeln!(
            h,
            "<tr><td>{}{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td>\
             <td>{:.2}</td></tr>",
            esc(&d.domain.label(d.package)),
            if d.estimated { " (estimated)" } else { "" },
            d.measured_j,
            d.attributed_j,
            d.idle_j,
            d.unattributed_j,
            d.power.avg_power_w
        );
    }
    h.push_str("</table>\n");
}

/// The top processes' energy per domain (`-` for a domain with no reader).
fn html_processes(h: &mut String, s: &Summary) {
    h.push_str(
        "<h2>Top processes</h2>\n<table><tr><th>process</th><th>pid</th>\
         <th>on-CPU s</th><th>CPU J</th><th>DRAM J</th><th>GPU J</th><th>CO2 g</th></tr>\n",
    );
    // A domain with no reader is `-`, as in the text tables, never 0.
    let read = s.read();
    let cell = |d: Domain, j: f64| {
        if read.has(d) {
            format!("{j:.3}")
        } else {
            "-".to_string()
        }
    };
    for p in s.processes.iter().take(15) {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{}</td><td>{:.3}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{:.4}</td></tr>",
            esc(&p.comm),
            p.pid,
            p.on_cpu_ns as f64 / 1e9,
            cell(Domain::Package, p.energy.package_j),
            cell(Domain::Dram, p.energy.dram_j),
            cell(Domain::Gpu, p.energy.gpu_j),
            p.energy.co2_g
        );
    }
    h.push_str("</table>\n");
}

/// Containers and systemd units, as the text's table (the first 10).
fn html_containers(h: &mut String, s: &Summary) {
    if s.containers.is_empty() {
        return;
    }
    h.push_str(
        "<h2>Containers and units</h2>\n<table><tr><th>container / unit</th><th>on-CPU s</th>\
         <th>energy J</th><th>average W</th><th>CO2 g</th></tr>\n",
    );
    for c in s.containers.iter().take(10) {
        let _ = writeln!(
            h,
            "<tr><td>{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.2}</td><td>{:.4}</td></tr>",
            esc(&crate::render::container_label(c)),
            c.on_cpu_ns as f64 / 1e9,
            c.energy.total_j,
            c.energy.avg_power_w,
            c.energy.co2_g
        );
    }
    h.push_str("</table>\n");
}

/// The windows, nested by depth (only where there are windows).
fn html_windows(h: &mut String, s: &Summary) {
    if !s.windows.is_empty() {
        h.push_str(
            "<h2>Windows</h2>\n<table><tr><th>window</th><th>begin s</th><th>length s</th>\
             <th>energy J</th><th>average W</th></tr>\n",
        );
        for w in s.windows.iter().take(BARS) {
            let _ = writeln!(
                h,
                "<tr><td>{}{}</td><td>{:.3}</td><td>{:.3}</td><td>{:.3}</td><td>{:.2}</td></tr>",
                "&nbsp;&nbsp;".repeat(w.depth.min(8)),
                esc(&w.name),
                secs(w.begin_ns),
                secs(w.end_ns.saturating_sub(w.begin_ns)),
                w.energy.total_j,
                w.energy.avg_power_w
            );
        }
        h.push_str("</table>\n");
    }
}

/// A self-contained page: the figures as tables, then the plots.
pub(crate) fn html(l: &Loaded) -> Result<String, PlotError> {
    let svg = svg(l)?;
    let s = &l.summary;
    let what = match &s.command {
        Some(c) => format!("<code>{}</code>", esc(&c.argv.join(" "))),
        None => "the machine (monitor)".to_string(),
    };
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <title>wattprof report: {title}</title>\n<style>\
         body{{font-family:sans-serif;margin:2em;color:#222}}\
         table{{border-collapse:collapse;margin:0.5em 0 1.5em}}\
         td,th{{border:1px solid #ccc;padding:3px 8px;text-align:right}}\
         td:first-child,th:first-child,td.text{{text-align:left}}\
         .note{{color:#a40}}</style></head><body>\n\
         <h1>wattprof report</h1>\n<p>{what}: {wall:.3} s, {n} intervals, from <code>{file}</code> \
         ({format}, wattprof {ver})</p>\n",
        title = esc(&s.file),
        wall = s.wall_ns as f64 / 1e9,
        n = s.intervals,
        file = esc(&s.file),
        format = s.format.words(),
        ver = esc(&s.wattprof_version),
    );
    if let Some(cut) = &s.cut {
        let _ = writeln!(
            h,
            "<p class=\"note\">The stream was cut after {} complete lines; missing: {}.</p>",
            cut.complete_lines,
            esc(&s.missing.join("; "))
        );
    }
    html_groups(&mut h, s);
    html_domains(&mut h, s);
    html_processes(&mut h, s);
    html_containers(&mut h, s);
    html_readers(&mut h, s);
    html_functions(&mut h, s);
    html_windows(&mut h, s);
    let _ = write!(h, "<h2>Power over time</h2>\n{svg}\n</body></html>\n");
    Ok(h)
}
