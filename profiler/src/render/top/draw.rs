//! Drawing `top`'s screen with ratatui: the header (each domain's power,
//! static, idle and unattributed, the machine's power over the last
//! minutes), the table, and the key line; help and a process's details
//! over it. No I/O: the frame is the terminal's, or a test buffer.

use ratatui::Frame;
use ratatui::buffer::{Buffer, Cell};
use ratatui::layout::{Constraint, Flex, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::symbols::Marker;
use ratatui::text::{Line, Span};
use ratatui::widgets::{
    Axis, Block, Borders, Chart, Clear, Dataset, GraphType, Paragraph, Row as TableRow, Table, Wrap,
};

use super::keys::KEYS;
use super::{Column, Grouping, Mode, Row, TableLayout, Top, counted};

/// Block characters of a sparkline, lowest first.
const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];

/// Width of the process table's columns (the command takes the rest).
fn width(c: Column) -> Constraint {
    match c {
        Column::Pid => Constraint::Length(7),
        Column::User => Constraint::Length(7),
        Column::CpuPct => Constraint::Length(5),
        Column::CpuW | Column::DramW | Column::GpuW => Constraint::Length(6),
        Column::SmPct => Constraint::Length(4),
        Column::Energy => Constraint::Length(8),
        Column::Power => Constraint::Length(9),
        Column::Command => Constraint::Min(8),
    }
}

/// Draws the whole screen, and notes where the table went (for the mouse).
/// Any size, down to one cell: what does not fit is left out.
pub(crate) fn draw(f: &mut Frame<'_>, top: &mut Top) {
    let area = f.area();
    if area.height < 4 || area.width < 20 {
        // Too small for a table: say so, where there is a line for it.
        f.render_widget(Paragraph::new("wattprof top: too small"), area);
        top.layout = None;
        return;
    }
    let header_lines = 2 + u16::from(!top.domains.is_empty());
    let chart_h = if area.height >= 30 { 6 } else { 0 };
    let [head, chart, table, keys] = Layout::vertical([
        Constraint::Length(header_lines),
        Constraint::Length(chart_h),
        Constraint::Min(3),
        Constraint::Length(1),
    ])
    .areas(area);
    f.render_widget(Paragraph::new(header(top)), head);
    if chart_h > 0 {
        draw_chart(f, top, chart);
    }
    let n = top.row_count();
    fit_selection(top, n, table.height.saturating_sub(1));
    top.layout = Some(match top.grouping {
        Grouping::Process => draw_processes(f, top, table),
        _ => draw_groups(f, top, table),
    });
    f.render_widget(Paragraph::new(key_line(top)), keys);
    match top.mode.clone() {
        Mode::Help => draw_help(f, area),
        Mode::Details(pid) => draw_details(f, top, pid, area),
        _ => {}
    }
}

fn heading_style(top: &Top) -> Style {
    if top.color {
        Style::new().fg(Color::Black).bg(Color::Cyan)
    } else {
        Style::new().add_modifier(Modifier::REVERSED)
    }
}

/// The first lines: what the screen shows, then each domain's power.
fn header(top: &Top) -> Vec<Line<'static>> {
    let mut state = format!(
        "wattprof top  {:.1} s  interval {}  {}  sort {}{}",
        top.elapsed_s,
        interval_text(top.interval_ms),
        top.grouping.name(),
        top.sort.title(),
        if top.descending { " ↓" } else { " ↑" },
    );
    if top.tree {
        state.push_str("  tree");
    }
    if !top.filter.is_empty() {
        state.push_str(&format!("  filter \"{}\"", top.filter));
    }
    if let Some(u) = &top.user_filter {
        state.push_str(&format!("  user {u}"));
    }
    let mut lines = vec![Line::from(state)];
    if top.paused {
        lines[0].spans.push(Span::styled(
            "  PAUSED",
            Style::new().add_modifier(Modifier::BOLD),
        ));
    }
    if top.domains.is_empty() {
        lines.push(Line::from(
            "(no energy figures yet; without a reader see `wattprof sources`)",
        ));
        return lines;
    }
    let mut power = String::new();
    let mut rest = String::new();
    let (mut idle, mut unattributed) = (0.0, 0.0);
    for d in &top.domains {
        power.push_str(&format!(
            "{}: {:.1} W{}{}  ",
            d.name,
            d.power_w,
            d.static_w
                .map_or_else(String::new, |s| format!(" (static {s:.1})")),
            if d.estimated { " estimated" } else { "" },
        ));
        // Core is part of package: the machine's idle and unattributed
        // are package's, DRAM's and the GPUs'.
        if counted(d.domain) {
            idle += d.idle_w;
            unattributed += d.unattributed_w;
        }
    }
    rest.push_str(&format!(
        "idle {idle:.1} W  unattributed {unattributed:.1} W"
    ));
    lines.push(Line::from(power.trim_end().to_string()));
    lines.push(Line::from(rest));
    lines
}

fn interval_text(ms: u64) -> String {
    if ms.is_multiple_of(1000) {
        format!("{} s", ms / 1000)
    } else {
        format!("{ms} ms")
    }
}

/// The machine's power (package, DRAM and GPU) over the last minutes.
fn draw_chart(f: &mut Frame<'_>, top: &Top, area: Rect) {
    let points = top.machine_power();
    let Some(((t0, _), (t1, _))) = points.first().zip(points.last()) else {
        return;
    };
    let max = points.iter().map(|(_, w)| *w).fold(1.0_f64, f64::max) * 1.1;
    let data = [Dataset::default()
        .marker(Marker::Braille)
        .graph_type(GraphType::Line)
        .data(&points)];
    let chart = Chart::new(data.to_vec())
        .block(
            Block::new()
                .borders(Borders::TOP)
                .title(format!("machine power, last {:.0} s (W)", t1 - t0)),
        )
        .x_axis(Axis::default().bounds([*t0, t1.max(t0 + 1.0)]))
        .y_axis(
            Axis::default()
                .bounds([0.0, max])
                .labels(["0".to_string(), format!("{max:.0}")]),
        );
    f.render_widget(chart, area);
}

/// The process table: each row is one line of text in the columns'
/// places (a `Table` widget built ten cells per row, each its own text,
/// lines and spans: most of what a frame cost).
fn draw_processes(f: &mut Frame<'_>, top: &Top, area: Rect) -> TableLayout {
    let rows = top.shown();
    let body = area.height.saturating_sub(1);
    let columns: Vec<Constraint> = Column::ALL.iter().map(|c| width(*c)).collect();
    let xs = Layout::horizontal(columns)
        .flex(Flex::Start)
        .spacing(1)
        .split(Rect::new(area.x, 0, area.width, 1));
    let places: Vec<(Column, u16, u16)> = Column::ALL
        .iter()
        .zip(xs.iter())
        .map(|(c, r)| (*c, r.x, r.x + r.width))
        .collect();
    let heading = Column::ALL.iter().map(|c| {
        let (read, estimated) = top.column_read(*c);
        let mut t = c.title().to_string();
        if read && estimated {
            t.push('~');
        }
        if *c == top.sort {
            t.push(if top.descending { '↓' } else { '↑' });
        }
        t
    });
    let buf = f.buffer_mut();
    put_line(
        buf,
        area,
        area.y,
        &in_places(area.x, &places, heading),
        heading_style(top),
    );
    let max_w = rows.iter().map(|r| r.fig.power_w()).fold(0.0_f64, f64::max);
    for (y, (i, r)) in (area.y + 1..area.bottom())
        .zip(rows.iter().enumerate().skip(top.offset).take(body as usize))
    {
        let text = in_places(area.x, &places, process_cells(top, r, max_w).into_iter());
        let style = if i == top.selected {
            Style::new().add_modifier(Modifier::REVERSED)
        } else {
            Style::new()
        };
        put_line(buf, area, y, &text, style);
    }
    TableLayout {
        heading_y: area.y,
        first_row_y: area.y + 1,
        rows: body,
        columns: places,
    }
}

/// Texts, one per column, each at its column's place as one line, cut
/// to its width by characters (a wide character in a name shifts the
/// rest of its row; the command, last, is cut at the screen's edge).
/// Control characters become `?`: a process names itself, and its name
/// must not reach the terminal as an escape sequence.
fn in_places(
    x0: u16,
    places: &[(Column, u16, u16)],
    texts: impl Iterator<Item = String>,
) -> String {
    let mut line = String::with_capacity(usize::from(places.last().map_or(0, |p| p.2 - x0)));
    let mut at = 0usize;
    for ((_, from, to), text) in places.iter().zip(texts) {
        let (from, to) = (usize::from(from - x0), usize::from(to - x0));
        line.extend(std::iter::repeat_n(' ', from.saturating_sub(at)));
        at = at.max(from);
        for c in text.chars().take(to - from) {
            line.push(if c.is_control() { '?' } else { c });
            at += 1;
        }
    }
    line
}

/// Writes one line of the table at row `y` of `area`, cut at its right
/// edge, in `style` across the whole width (the selection is a bar
/// across the screen, as the groups' `Table` draws it). A line of
/// characters ratatui takes as one column (ASCII, arrows, box and block
/// characters: every line of the table but a name with other letters)
/// goes straight into the cells: ratatui's general path splits it into
/// graphemes and measures each, a fifth of what a frame cost.
fn put_line(buf: &mut Buffer, area: Rect, y: u16, text: &str, style: Style) {
    if y >= area.bottom() {
        return;
    }
    buf.set_style(Rect::new(area.x, y, area.width, 1), style);
    if text.chars().all(one_column) {
        for (x, c) in (area.x..area.right()).zip(text.chars()) {
            buf[(x, y)].set_char(c);
        }
    } else {
        buf.set_stringn(area.x, y, text, usize::from(area.width), Style::new());
    }
}

/// What changed between two frames, as ratatui's `Buffer::diff` finds it
/// (the same cells, in the same order: a test holds the two together),
/// with a cell of one printable ASCII byte taken as one column without
/// measuring it. ratatui measures three Unicode widths per cell, and on a
/// 160x50 screen that was the largest part of a frame's cost.
pub(crate) fn frame_updates<'a>(prev: &Buffer, next: &'a Buffer) -> Vec<(u16, u16, &'a Cell)> {
    fn width(c: &Cell) -> usize {
        match c.symbol().as_bytes() {
            [b] if (0x20..0x7f).contains(b) => 1,
            _ => unicode_width::UnicodeWidthStr::width(c.symbol()),
        }
    }
    let mut updates = Vec::new();
    // As ratatui: cells a wide character before them covered, or uncovers.
    let (mut invalidated, mut to_skip) = (0usize, 0usize);
    for (i, (cur, old)) in next.content.iter().zip(&prev.content).enumerate() {
        if !cur.skip && (cur != old || invalidated > 0) && to_skip == 0 {
            let (x, y) = next.pos_of(i);
            updates.push((x, y, cur));
        }
        let w = width(cur);
        to_skip = w.saturating_sub(1);
        invalidated = w.max(width(old)).max(invalidated).saturating_sub(1);
    }
    updates
}

/// A character ratatui measures as one column: printable ASCII, and the
/// arrows, box-drawing and block characters the table uses (East Asian
/// ambiguous: a terminal set to CJK widths shows them wider, as it does
/// whatever ratatui draws).
fn one_column(c: char) -> bool {
    matches!(c, ' '..='~' | '\u{2190}'..='\u{21FF}' | '\u{2500}'..='\u{259F}')
}

/// Keeps the selection on screen.
fn fit_selection(top: &mut Top, n: usize, body: u16) {
    let body = usize::from(body.max(1));
    top.selected = top.selected.min(n.saturating_sub(1));
    if top.selected < top.offset {
        top.offset = top.selected;
    } else if top.selected >= top.offset + body {
        top.offset = top.selected + 1 - body;
    }
    top.offset = top.offset.min(n.saturating_sub(body.min(n)));
}

fn process_cells(top: &Top, r: &Row, max_w: f64) -> [String; 10] {
    let w = |x: Option<f64>| x.map_or_else(|| "-".to_string(), |v| format!("{v:.2}"));
    // In the tree, a row's figures are its own and everything under it.
    let fig = &r.fig;
    let (cpu, power) = (fig.cpu_pct, fig.power_w());
    let history: Vec<f64> = top.history(r.pid).collect();
    let command = if top.tree {
        format!("{}{}", tree_prefix(r.depth), r.comm)
    } else {
        r.comm.to_string()
    };
    [
        r.pid.to_string(),
        r.user.to_string(),
        format!("{cpu:.1}"),
        w(fig.cpu_w),
        w(fig.dram_w),
        w(fig.gpu_w),
        fig.sm_pct
            .map_or_else(|| "-".to_string(), |v| format!("{v:.0}")),
        energy_text(fig.energy_j),
        format!(
            "{:<5}{}",
            format!("{power:.1}"),
            sparkline(&history, max_w, 4)
        ),
        command,
    ]
}

/// Joules in at most 8 characters: `9999.9`, then kJ (`12.3k`), MJ,
/// GJ (a long training run reaches GJ): the first scale under 10,000.
pub(crate) fn energy_text(j: f64) -> String {
    const SCALES: [(f64, &str); 4] = [(1.0, ""), (1e3, "k"), (1e6, "M"), (1e9, "G")];
    let (div, suffix) = SCALES
        .iter()
        .copied()
        .find(|(div, _)| j.abs() / div < 1e4)
        .unwrap_or(SCALES[3]);
    format!("{:.1}{suffix}", j / div)
}

fn tree_prefix(depth: usize) -> String {
    if depth == 0 {
        String::new()
    } else {
        format!("{}└─ ", "  ".repeat(depth - 1))
    }
}

/// The last values as `width` block characters (each the mean of its
/// share of them), scaled to `max`.
pub(crate) fn sparkline(values: &[f64], max: f64, width: usize) -> String {
    if values.is_empty() || width == 0 {
        return String::new();
    }
    let per = values.len().div_ceil(width);
    values
        .chunks(per)
        .map(|c| {
            let mean = c.iter().sum::<f64>() / c.len() as f64;
            let level = if max > 0.0 {
                ((mean / max) * (BARS.len() - 1) as f64).round() as usize
            } else {
                0
            };
            BARS[level.min(BARS.len() - 1)]
        })
        .collect()
}

fn draw_groups(f: &mut Frame<'_>, top: &Top, area: Rect) -> TableLayout {
    let rows = top.shown_groups();
    let body = area.height.saturating_sub(1);
    let title = match top.grouping {
        Grouping::Container => "CONTAINER / UNIT",
        Grouping::Job => "BATCH JOB",
        _ => "CGROUP",
    };
    let heading = TableRow::new(["CPU%", "POWER W", "ENERGY J", title]).style(heading_style(top));
    let lines: Vec<TableRow<'_>> = rows
        .iter()
        .enumerate()
        .skip(top.offset)
        .take(body as usize)
        .map(|(i, g)| {
            let row = TableRow::new([
                g.cpu_pct
                    .map_or_else(|| "-".to_string(), |c| format!("{c:.1}")),
                g.power_w
                    .map_or_else(|| "-".to_string(), |w| format!("{w:.2}")),
                energy_text(g.energy_j),
                printable(&g.name),
            ]);
            if i == top.selected {
                row.style(Style::new().add_modifier(Modifier::REVERSED))
            } else {
                row
            }
        })
        .collect();
    let widths = [
        Constraint::Length(6),
        Constraint::Length(8),
        Constraint::Length(10),
        Constraint::Min(10),
    ];
    f.render_widget(
        Table::new(lines, widths)
            .header(heading)
            .flex(Flex::Start)
            .column_spacing(1),
        area,
    );
    if rows.is_empty() && area.height >= 2 {
        let note = Rect::new(area.x, area.y + 1, area.width, 1);
        f.render_widget(
            Paragraph::new(format!(
                "(no {} have used the CPU yet)",
                top.grouping.name()
            )),
            note,
        );
    }
    TableLayout {
        heading_y: area.y,
        first_row_y: area.y + 1,
        rows: body,
        columns: Vec::new(),
    }
}

fn key_line(top: &Top) -> Line<'static> {
    let keys = [
        ("F1", "Help"),
        ("F4", "Filter"),
        ("F5", "Tree"),
        ("F6", "Sort"),
        ("g", "Group"),
        ("u", "User"),
        ("Z", "Pause"),
        ("+-", "Interval"),
        ("F10", "Quit"),
    ];
    let mut spans = Vec::new();
    for (k, what) in keys {
        spans.push(Span::styled(k, Style::new().add_modifier(Modifier::BOLD)));
        spans.push(Span::styled(format!("{what} "), heading_style(top)));
    }
    match &top.mode {
        Mode::Filter(t) => Line::from(format!("filter (Enter keeps, Esc clears): {t}_")),
        Mode::User(t) => Line::from(format!("user (Enter keeps, empty: everyone): {t}_")),
        _ => Line::from(spans),
    }
}

/// A box in the middle of `area`, at most `w` by `h`.
fn centered(area: Rect, w: u16, h: u16) -> Rect {
    let w = w.min(area.width);
    let h = h.min(area.height);
    Rect::new(
        area.x + (area.width - w) / 2,
        area.y + (area.height - h) / 2,
        w,
        h,
    )
}

/// Text with its control characters shown as `?` (names and paths come
/// from processes, which choose them).
pub(crate) fn printable(text: &str) -> String {
    text.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// A bordered box over the middle of `area`, at most `w` wide and as
/// tall as its text wrapped inside the border (cut where the terminal is
/// shorter).
fn popup(f: &mut Frame<'_>, area: Rect, title: &str, lines: Vec<Line<'static>>, w: u16) {
    let w = w.min(area.width);
    let text = Paragraph::new(lines).wrap(Wrap { trim: false });
    // Counted at the width inside the border, where it is drawn.
    let h = u16::try_from(text.line_count(w.saturating_sub(2)))
        .unwrap_or(u16::MAX)
        .saturating_add(2);
    let r = centered(area, w, h);
    f.render_widget(Clear, r);
    f.render_widget(text.block(Block::bordered().title(format!(" {title} "))), r);
}

fn draw_help(f: &mut Frame<'_>, area: Rect) {
    let mut lines: Vec<Line<'static>> = KEYS
        .iter()
        .map(|(k, what)| Line::from(format!("{k:<28} {what}")))
        .collect();
    lines.push(Line::from(""));
    lines.push(Line::from(
        "Figures: each interval's, as the --jsonl stream holds them; ENERGY J since top \
         began (k, M, G: thousands, millions, billions of J); ~ estimated, - no reader. \
         Static power is each domain's power when idle, shared by the time each process \
         held it; the rest is dynamic. Any key: back.",
    ));
    popup(f, area, "wattprof top: keys", lines, 100);
}

fn draw_details(f: &mut Frame<'_>, top: &mut Top, pid: u32, area: Rect) {
    let lines = details(top, pid);
    popup(f, area, "process", lines, 100);
}

/// What the details box says of `pid`.
fn details(top: &mut Top, pid: u32) -> Vec<Line<'static>> {
    let mut lines: Vec<Line<'static>> = Vec::new();
    let Some(r) = top.row(pid).cloned() else {
        lines.push(Line::from(if top.alive(pid) {
            format!("pid {pid} did not run in the last interval")
        } else {
            format!("pid {pid} has exited")
        }));
        lines.push(Line::from("Any key: back."));
        return lines;
    };
    lines.push(Line::from(printable(&format!(
        "{} (pid {}), user {}",
        r.comm, r.pid, r.user
    ))));
    lines.push(Line::from(printable(&format!(
        "lineage: {}",
        top.lineage(pid)
    ))));
    let (cgroup, container) = top.cgroup_of(pid);
    lines.push(Line::from(printable(&format!("cgroup: {cgroup}"))));
    lines.push(Line::from(printable(&format!(
        "container or unit: {}",
        container.as_deref().unwrap_or("none")
    ))));
    lines.push(Line::from(""));
    if r.asleep {
        lines.push(Line::from(
            "asleep: it did not run in the last interval (shown as the parent of rows that did)",
        ));
    } else {
        let fig = &r.fig;
        let dur = top.interval_s.max(1e-9);
        lines.push(Line::from(format!(
            "last interval{}: CPU {:.1}%, {:.2} W, of which static {:.2} W and dynamic {:.2} W",
            if r.subtree { ", with all under it" } else { "" },
            fig.cpu_pct,
            fig.interval_j / dur,
            fig.static_total_j() / dur,
            (fig.interval_j - fig.static_total_j()).max(0.0) / dur
        )));
        let domains = [
            ("CPU package", fig.cpu_w, fig.static_j[0]),
            ("DRAM", fig.dram_w, fig.static_j[1]),
            ("GPU", fig.gpu_w, fig.static_j[2]),
        ];
        for (name, w, static_j) in domains {
            let text = match w {
                Some(w) => {
                    let s = static_j / dur;
                    format!(
                        "  {name:<12} {w:>8.2} W: static {s:.2} W, dynamic {:.2} W",
                        (w - s).max(0.0)
                    )
                }
                None => format!("  {name:<12}        - (no reader)"),
            };
            lines.push(Line::from(text));
        }
        if let Some(sm) = fig.sm_pct {
            lines.push(Line::from(format!("  GPU SM {sm:.0}%")));
        }
    }
    lines.push(Line::from(format!(
        "since top began: {} J",
        energy_text(r.fig.energy_j)
    )));
    lines.push(Line::from(
        "windows: opened under `wattprof run` (WATTPROF_SOCKET); its report lists them",
    ));
    lines.push(Line::from(""));
    lines.push(Line::from("Any key: back."));
    lines
}
