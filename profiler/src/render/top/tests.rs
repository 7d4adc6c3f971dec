use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::crossterm::event::{
    Event, KeyCode, KeyEvent, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};

use super::*;
use crate::attribution::{Basis, DomainUj};
use crate::model::record::{DomainRow, GroupRows, IntervalPower, ProcessRow};
use crate::sources::DomainKey;

/// A second of 30 W on package 0 and the rows `(pid, ppid, comm, J)`.
fn record(t_s: u64, rows: &[(u32, Option<u32>, &str, f64)]) -> IntervalRecord {
    IntervalRecord {
        t_ns: t_s * 1_000_000_000,
        duration_ns: 1_000_000_000,
        busy_ns: 1_000_000_000,
        domains: vec![DomainRow::from_uj(
            &DomainUj {
                measured_uj: 30_000_000,
                attributed_uj: 30_000_000,
                ..DomainUj::empty(DomainKey::new(Domain::Package, Some(0)), Basis::CpuTime)
            },
            None,
            1_000_000_000,
            |power_w| IntervalPower {
                power_w,
                covers_ns: None,
            },
        )],
        gpus: Vec::new(),
        groups: GroupRows::default(),
        processes: Some(
            rows.iter()
                .map(|(pid, ppid, comm, j)| ProcessRow {
                    pid: *pid,
                    ppid: *ppid,
                    comm: (*comm).to_string(),
                    on_cpu_ns: (*j * 1e8) as u64,
                    package_j: *j,
                    ..ProcessRow::default()
                })
                .collect(),
        ),
    }
}

/// A `/proc` with no processes: every owner is unknown (`?`).
fn top() -> Top {
    Top::new(
        1000,
        Grouping::Process,
        false,
        ProcFs::at(std::env::temp_dir().join("wattprof-no-proc")),
    )
}

const FAMILY: &[(u32, Option<u32>, &str, f64)] = &[
    (10, Some(1), "parent", 1.0),
    (11, Some(10), "child-a", 4.0),
    (12, Some(10), "child-b", 2.0),
    (13, Some(11), "grandchild", 3.0),
    (20, Some(1), "other", 5.0),
];

fn key(c: KeyCode) -> Event {
    Event::Key(KeyEvent::new(c, KeyModifiers::NONE))
}

fn pids(t: &Top) -> Vec<u32> {
    t.shown().iter().map(|r| r.pid).collect()
}

/// The screen as text, `w` by `h`.
fn screen(t: &mut Top, w: u16, h: u16) -> String {
    let mut term = Terminal::new(TestBackend::new(w, h)).expect("test terminal");
    term.draw(|f| draw(f, t)).expect("draw");
    let buf = term.backend().buffer().clone();
    (0..h)
        .map(|y| {
            (0..w)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn rows_are_the_record_s_figures_sorted_by_power() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    assert_eq!(pids(&t), vec![20, 11, 13, 12, 10]);
    let r = t.row(11).expect("row");
    assert_eq!(r.fig.cpu_w, Some(4.0), "J over the interval's seconds");
    assert_eq!(
        (r.fig.dram_w, r.fig.gpu_w),
        (None, None),
        "no reader: no figure"
    );
    assert!((r.fig.cpu_pct - 40.0).abs() < 1e-9);
    t.interval(&record(2, FAMILY), &[], &[], &[]);
    assert_eq!(
        t.row(11).map(|r| r.fig.energy_j),
        Some(8.0),
        "since top began"
    );
    assert_eq!(t.history(11).collect::<Vec<_>>(), vec![4.0, 4.0]);
}

#[test]
fn sorting_follows_the_keys_and_a_second_press_turns_it_round() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    t.event(&key(KeyCode::Char('N')));
    assert_eq!(pids(&t), vec![10, 11, 12, 13, 20], "PID, ascending");
    t.event(&key(KeyCode::Char('I')));
    assert_eq!(pids(&t), vec![20, 13, 12, 11, 10]);
    t.sort_by(Column::Command);
    t.refresh();
    assert_eq!(pids(&t), vec![11, 12, 13, 20, 10], "A to Z");
    t.sort_by(Column::Command);
    t.refresh();
    assert_eq!(pids(&t), vec![10, 20, 13, 12, 11], "again: Z to A");
    // F6 steps to the next column.
    t.event(&key(KeyCode::F(6)));
    assert_eq!(t.sort, Column::Pid, "after the last column, the first");
}

#[test]
fn the_tree_puts_children_under_parents_with_subtree_totals() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    t.event(&key(KeyCode::Char('t')));
    let rows = t.shown();
    let order: Vec<(u32, usize)> = rows.iter().map(|r| (r.pid, r.depth)).collect();
    // Siblings in the sort's order of their subtrees' sums: the parent's
    // 10 W before the other's 5.
    assert_eq!(order, vec![(10, 0), (11, 1), (13, 2), (12, 1), (20, 0)]);
    assert!(rows[0].subtree);
    assert_eq!(
        rows[0].fig.power_w(),
        1.0 + 4.0 + 2.0 + 3.0,
        "its own and all under it"
    );
    assert_eq!(rows[0].fig.cpu_w, Some(10.0), "the row shows the sums");
    assert_eq!(rows[1].fig.power_w(), 7.0);
    assert_eq!(rows[2].fig.power_w(), 3.0);
    let text = screen(&mut t, 120, 20);
    assert!(text.contains("└─ child-a"), "{text}");
}

#[test]
fn a_parent_loop_is_shown_not_lost() {
    let rows = [(1, Some(2), "a", 1.0), (2, Some(1), "b", 1.0)];
    let mut t = top();
    t.interval(&record(1, &rows), &[], &[], &[]);
    t.tree = true;
    t.refresh();
    assert_eq!(t.shown().len(), 2);
}

#[test]
fn the_filter_hides_what_does_not_match_and_esc_clears_it() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    t.event(&key(KeyCode::Char('/')));
    for c in "child".chars() {
        t.event(&key(KeyCode::Char(c)));
    }
    assert_eq!(pids(&t), vec![11, 13, 12], "applies as it is typed");
    t.event(&key(KeyCode::Enter));
    assert_eq!(t.mode, Mode::Table);
    assert_eq!(pids(&t), vec![11, 13, 12], "kept");
    t.event(&key(KeyCode::Char('/')));
    t.event(&key(KeyCode::Esc));
    assert_eq!(pids(&t).len(), 5, "cleared");
    // A pid matches too.
    t.filter = "20".into();
    t.refresh();
    assert_eq!(pids(&t), vec![20]);
}

#[test]
fn the_user_filter_shows_one_user_s_processes() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    t.event(&key(KeyCode::Char('u')));
    for c in "nobody".chars() {
        t.event(&key(KeyCode::Char(c)));
    }
    t.event(&key(KeyCode::Enter));
    assert!(pids(&t).is_empty(), "no process here is nobody's");
    t.event(&key(KeyCode::Char('u')));
    t.event(&key(KeyCode::Backspace));
    for _ in 0..10 {
        t.event(&key(KeyCode::Backspace));
    }
    t.event(&key(KeyCode::Enter));
    assert_eq!(pids(&t).len(), 5, "empty: everyone's");
}

#[test]
fn paused_the_rows_stay_and_energy_goes_on() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    t.event(&key(KeyCode::Char('Z')));
    t.interval(&record(2, &[(99, None, "new", 9.0)]), &[], &[], &[]);
    assert_eq!(pids(&t).len(), 5, "the screen stays");
    t.event(&key(KeyCode::Char('Z')));
    t.interval(&record(3, FAMILY), &[], &[], &[]);
    assert_eq!(t.row(20).map(|r| r.fig.energy_j), Some(10.0));
}

#[test]
fn plus_and_minus_step_the_interval_within_its_range() {
    let mut t = top();
    t.event(&key(KeyCode::Char('+')));
    assert_eq!(t.interval_ms, 2_000);
    for _ in 0..20 {
        t.event(&key(KeyCode::Char('-')));
    }
    assert_eq!(t.interval_ms, 100);
    for _ in 0..20 {
        t.event(&key(KeyCode::Char('+')));
    }
    assert_eq!(t.interval_ms, 30_000);
}

#[test]
fn quit_help_and_details() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    assert_eq!(t.event(&key(KeyCode::Char('h'))), Outcome::Redraw);
    assert!(screen(&mut t, 100, 30).contains("tree: children under their parent"));
    assert_eq!(t.event(&key(KeyCode::Char('x'))), Outcome::Redraw);
    assert_eq!(t.mode, Mode::Table);
    t.event(&key(KeyCode::Down));
    t.event(&key(KeyCode::Enter));
    assert_eq!(t.mode, Mode::Details(11));
    let text = screen(&mut t, 110, 30);
    assert!(text.contains("child-a (pid 11)"), "{text}");
    assert!(
        text.contains("lineage: child-a (11) <- parent (10) <- 1"),
        "{text}"
    );
    t.event(&key(KeyCode::Esc));
    assert_eq!(t.event(&key(KeyCode::Char('q'))), Outcome::Quit);
    assert_eq!(t.event(&key(KeyCode::F(10))), Outcome::Quit);
    let ctrl_c = Event::Key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
    assert_eq!(t.event(&ctrl_c), Outcome::Quit);
}

#[test]
fn the_screen_fits_80_by_24_and_shows_the_header_and_rows() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    let text = screen(&mut t, 80, 24);
    assert!(text.contains("package 0: 30.0 W"), "{text}");
    assert!(text.contains("POWER 1m↓"), "{text}");
    assert!(text.contains("grandchild"), "{text}");
    assert!(text.contains("F10Quit"), "{text}");
    // The power column is the row's figure, then its last minute.
    assert!(text.contains("5.0  █"), "{text}");
    assert!(!text.contains("grandchi "), "the command has room: {text}");
}

#[test]
fn a_click_on_a_heading_sorts_by_it_and_on_a_row_selects_it() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    screen(&mut t, 120, 24);
    let layout = t.layout.clone().expect("drawn");
    let (_, x0, _) = layout
        .columns
        .iter()
        .find(|(c, ..)| *c == Column::Pid)
        .copied()
        .expect("pid column");
    let click = |row, column| {
        Event::Mouse(MouseEvent {
            kind: MouseEventKind::Down(MouseButton::Left),
            column,
            row,
            modifiers: KeyModifiers::NONE,
        })
    };
    t.event(&click(layout.heading_y, x0));
    assert_eq!(t.sort, Column::Pid);
    t.event(&click(layout.first_row_y + 2, x0));
    assert_eq!(t.selected_pid(), Some(12));
}

#[test]
fn an_empty_name_is_shown_as_the_pid() {
    let mut t = top();
    t.interval(&record(1, &[(7, None, "", 1.0)]), &[], &[], &[]);
    assert_eq!(t.row(7).map(|r| &*r.comm), Some("[7]"));
}

#[test]
fn groups_show_power_from_their_energy_so_far() {
    let mut t = Top::new(
        1000,
        Grouping::Cgroup,
        false,
        ProcFs::at(std::env::temp_dir().join("wattprof-no-proc")),
    );
    let cg = |j: f64, ns: u64| CgroupReport {
        path: "/system.slice/x.service".into(),
        id: 5,
        on_cpu_ns: ns,
        energy: crate::model::EnergyJ {
            total_j: j,
            ..crate::model::EnergyJ::default()
        },
    };
    t.interval(&record(1, FAMILY), &[], &[cg(10.0, 100)], &[]);
    assert_eq!(t.shown_groups()[0].power_w, None, "one sum: no power yet");
    t.interval(&record(2, FAMILY), &[], &[cg(13.0, 500_000_100)], &[]);
    let g = &t.shown_groups()[0];
    assert_eq!((g.power_w, g.energy_j), (Some(3.0), 13.0));
    assert!((g.cpu_pct.expect("cpu") - 50.0).abs() < 1e-9);
    assert!(screen(&mut t, 80, 24).contains("/system.slice/x.service"));
    // Away to batch jobs, processes, containers and back ten minutes
    // later: the sums then are not divided by one interval.
    t.event(&key(KeyCode::Char('g')));
    assert_eq!(t.grouping, Grouping::Job);
    t.interval(&record(3, FAMILY), &[], &[cg(14.0, 600_000_000)], &[]);
    for _ in 0..3 {
        t.event(&key(KeyCode::Char('g')));
    }
    assert_eq!(t.grouping, Grouping::Cgroup);
    t.interval(
        &record(600, FAMILY),
        &[],
        &[cg(900.0, 900_000_000_000)],
        &[],
    );
    assert_eq!(t.shown_groups()[0].power_w, None);
    t.interval(
        &record(601, FAMILY),
        &[],
        &[cg(902.0, 900_500_000_000)],
        &[],
    );
    assert_eq!(t.shown_groups()[0].power_w, Some(2.0));
}

#[test]
fn sparklines_scale_to_the_largest_row() {
    assert_eq!(super::draw::sparkline(&[0.0, 5.0, 10.0], 10.0, 3), "▁▅█");
    assert_eq!(
        super::draw::sparkline(&[1.0; 10], 2.0, 5).chars().count(),
        5
    );
    assert_eq!(super::draw::sparkline(&[], 1.0, 5), "");
}

#[test]
fn the_tree_reaches_parents_that_did_not_run_through_proc() {
    // /proc knows pid 5, a shell asleep (no row), parent of 11 and 12.
    let dir = std::env::temp_dir().join(format!("wattprof-top-proc-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("5")).expect("fixture");
    std::fs::write(dir.join("5/stat"), "5 (sh) S 1 5 5 0").expect("stat");
    std::fs::write(dir.join("5/comm"), "sh\n").expect("comm");
    let mut t = Top::new(1000, Grouping::Process, false, ProcFs::at(dir.clone()));
    let rows = [(11, Some(5), "a", 2.0), (12, Some(5), "b", 1.0)];
    t.interval(&record(1, &rows), &[], &[], &[]);
    assert_eq!(pids(&t), vec![11, 12], "flat: only what ran");
    t.tree = true;
    t.refresh();
    let shown = t.shown();
    let order: Vec<(u32, usize)> = shown.iter().map(|r| (r.pid, r.depth)).collect();
    assert_eq!(order, vec![(5, 0), (11, 1), (12, 1)]);
    assert_eq!(&*shown[0].comm, "sh");
    assert!(shown[0].asleep);
    assert_eq!(shown[0].fig.power_w(), 3.0);
    let _ = std::fs::remove_dir_all(dir);
}

/// `record`, with the profile's id for each row (a reused pid has
/// another).
fn record_ids(t_s: u64, rows: &[(u32, u64, &str, f64)]) -> IntervalRecord {
    let plain: Vec<(u32, Option<u32>, &str, f64)> = rows
        .iter()
        .map(|(pid, _, c, j)| (*pid, None, *c, *j))
        .collect();
    let mut r = record(t_s, &plain);
    for (row, (_, id, ..)) in r.processes.iter_mut().flatten().zip(rows) {
        row.live.id = *id;
    }
    r
}

#[test]
fn a_reused_pid_starts_again_and_a_sleeper_keeps_its_energy() {
    // /proc lists 5 (asleep for minutes) and not 6 (exited).
    let dir = std::env::temp_dir().join(format!("wattprof-top-seen-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("5")).expect("fixture");
    let mut t = Top::new(1000, Grouping::Process, false, ProcFs::at(dir.clone()));
    t.interval(
        &record_ids(1, &[(5, 50, "sleeper", 2.0), (6, 60, "gone", 3.0)]),
        &[],
        &[],
        &[],
    );
    t.interval(&record_ids(2, &[(7, 70, "w", 1.0)]), &[], &[], &[]);
    // Same pid, same name, another process: its energy starts again.
    t.interval(&record_ids(3, &[(7, 71, "w", 1.0)]), &[], &[], &[]);
    assert_eq!(t.row(7).map(|r| r.fig.energy_j), Some(1.0));
    for s in 4..300 {
        t.interval(&record_ids(s, &[(7, 71, "w", 1.0)]), &[], &[], &[]);
    }
    t.interval(
        // 6 again with its old id, as if it had never gone: only the
        // prune can have forgotten it.
        &record_ids(300, &[(5, 50, "sleeper", 2.0), (6, 60, "gone", 3.0)]),
        &[],
        &[],
        &[],
    );
    assert_eq!(
        t.row(5).map(|r| r.fig.energy_j),
        Some(4.0),
        "slept 298 s, kept"
    );
    assert_eq!(
        t.row(6).map(|r| r.fig.energy_j),
        Some(3.0),
        "exited, forgotten"
    );
    assert_eq!(
        t.row(7).map(|r| r.fig.energy_j),
        None,
        "did not run: no row"
    );
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn every_size_down_to_one_cell_draws_in_every_view() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    let views: [&dyn Fn(&mut Top); 6] = [
        &|t| t.mode = Mode::Table,
        &|t| t.mode = Mode::Help,
        &|t| t.mode = Mode::Details(11),
        &|t| t.mode = Mode::Filter("chi".into()),
        &|t| {
            t.mode = Mode::Table;
            t.grouping = Grouping::Cgroup;
            t.refresh();
        },
        &|t| {
            t.grouping = Grouping::Process;
            t.tree = true;
            t.refresh();
        },
    ];
    for set in views {
        set(&mut t);
        for w in [1, 2, 5, 19, 20, 21, 40, 80] {
            for h in [1, 2, 3, 4, 5, 6, 12, 24] {
                let _ = screen(&mut t, w, h);
            }
        }
    }
    assert!(screen(&mut t, 30, 2).contains("too small"));
}

#[test]
fn help_and_details_boxes_hold_all_their_text_at_80_by_24() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    t.mode = Mode::Help;
    let text = screen(&mut t, 80, 24);
    assert!(text.contains("Any key: back."), "{text}");
    assert!(text.contains("F10 q Ctrl-C"), "{text}");
    // 11's 4 J over the second: 1 J of it the package's static share.
    let mut r = record(2, FAMILY);
    for p in r.processes.iter_mut().flatten().filter(|p| p.pid == 11) {
        p.live.static_j = [1.0, 0.0, 0.0];
    }
    t.interval(&r, &[], &[], &[]);
    t.mode = Mode::Details(11);
    let text = screen(&mut t, 80, 24);
    assert!(text.contains("Any key: back."), "{text}");
    assert!(
        text.contains("CPU package      4.00 W: static 1.00 W, dynamic 3.00 W"),
        "{text}"
    );
    assert!(
        text.contains("of which static 1.00 W and dynamic 3.00 W"),
        "{text}"
    );
    // A path as long as a Docker scope's still leaves the last line in.
    t.mode = Mode::Details(12);
    for w in [60, 100, 120] {
        let text = screen(&mut t, w, 30);
        assert!(text.contains("Any key: back."), "{w}: {text}");
    }
}

#[test]
fn details_of_a_parent_that_did_not_run_and_of_a_process_gone() {
    let dir = std::env::temp_dir().join(format!("wattprof-top-asleep-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("5")).expect("fixture");
    std::fs::write(dir.join("5/stat"), "5 (sh) S 1 5 5 0").expect("stat");
    std::fs::write(dir.join("5/comm"), "sh\n").expect("comm");
    std::fs::write(
        dir.join("5/cgroup"),
        "0::/system.slice/docker-0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef.scope\n",
    )
    .expect("cgroup");
    let mut t = Top::new(1000, Grouping::Process, false, ProcFs::at(dir.clone()));
    t.interval(&record(1, &[(11, Some(5), "a", 2.0)]), &[], &[], &[]);
    t.event(&key(KeyCode::Char('t')));
    assert_eq!(
        t.selected_pid(),
        Some(11),
        "the selection stays on its process"
    );
    t.event(&key(KeyCode::Up));
    assert_eq!(
        t.selected_pid(),
        Some(5),
        "the sleeping parent heads the tree"
    );
    t.event(&key(KeyCode::Enter));
    let text = screen(&mut t, 110, 30);
    assert!(text.contains("asleep: it did not run"), "{text}");
    assert!(text.contains("lineage: sh (5) <- 1"), "{text}");
    assert!(text.contains("docker 0123456789ab"), "{text}");
    t.mode = Mode::Details(99);
    assert!(screen(&mut t, 110, 30).contains("pid 99 has exited"));
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_selection_stays_on_its_process_when_the_rows_move() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    t.event(&key(KeyCode::Down));
    assert_eq!(t.selected_pid(), Some(11));
    // 11 now uses the least: it moves to the bottom, the selection too.
    let mut later = FAMILY.to_vec();
    later[1].3 = 0.5;
    t.interval(&record(2, &later), &[], &[], &[]);
    assert_eq!(t.selected_pid(), Some(11));
    assert_eq!(t.selected, 4);
    // Another process takes pid 11 (a new id) and uses the most: the
    // selection does not follow the pid to it; it stays at its place.
    let mut reused = record(3, &later);
    for p in reused.processes.iter_mut().flatten() {
        if p.pid == 11 {
            p.live.id = 99;
            p.package_j = 9.0;
        }
    }
    t.interval(&reused, &[], &[], &[]);
    assert_eq!(t.shown()[0].pid, 11, "the new 11 heads the rows");
    assert_eq!(t.selected, 4, "the selection stays where the old 11 was");
    assert_ne!(t.selected_pid(), Some(11));
}

#[test]
fn chords_are_not_keys_but_ctrl_c_l_h_and_alt_is_esc_first() {
    let mut t = top();
    t.interval(&record(1, FAMILY), &[], &[], &[]);
    let chord = |c, m| Event::Key(KeyEvent::new(KeyCode::Char(c), m));
    assert_eq!(t.event(&chord('z', KeyModifiers::CONTROL)), Outcome::Same);
    assert!(!t.paused);
    // Esc then `/` typed quickly arrive as Alt-/: the filter is cleared,
    // then its box opens.
    t.filter = "child".into();
    t.event(&chord('/', KeyModifiers::ALT));
    assert_eq!(
        (t.filter.as_str(), &t.mode),
        ("", &Mode::Filter(String::new()))
    );
    t.event(&key(KeyCode::Char('a')));
    t.event(&key(KeyCode::Char('b')));
    // Ctrl-H is Backspace, as some terminals send it.
    t.event(&chord('h', KeyModifiers::CONTROL));
    assert_eq!(t.filter, "a");
    t.event(&key(KeyCode::Esc));
    assert_eq!(
        t.event(&chord('l', KeyModifiers::CONTROL)),
        Outcome::Repaint
    );
    // Upper case comes with Shift: still a key.
    assert_eq!(t.event(&chord('N', KeyModifiers::SHIFT)), Outcome::Redraw);
    assert_eq!(t.sort, Column::Pid);
}

#[test]
fn from_an_interval_between_steps_plus_and_minus_go_to_the_nearest() {
    let mut t = Top::new(
        1500,
        Grouping::Process,
        false,
        ProcFs::at("/nonexistent".into()),
    );
    t.event(&key(KeyCode::Char('+')));
    assert_eq!(t.interval_ms, 2_000);
    let mut t = Top::new(
        1500,
        Grouping::Process,
        false,
        ProcFs::at("/nonexistent".into()),
    );
    t.event(&key(KeyCode::Char('-')));
    assert_eq!(t.interval_ms, 1_000);
}

#[test]
fn energy_is_scaled_to_fit_its_column() {
    use super::draw::energy_text;
    assert_eq!(energy_text(0.0), "0.0");
    assert_eq!(energy_text(9_999.9), "9999.9");
    assert_eq!(energy_text(12_345.0), "12.3k");
    assert_eq!(energy_text(98_765_432.0), "98.8M");
    assert_eq!(energy_text(3.2e12), "3200.0G");
    for j in [1.0, 1e4, 1e5, 1e7, 1e9, 1e11, 9e12] {
        assert!(energy_text(j).len() <= 8, "{j}: {}", energy_text(j));
    }
}

#[test]
fn the_header_s_idle_and_unattributed_leave_core_out() {
    let mut t = top();
    let mut r = record(1, FAMILY);
    let mut core = r.domains[0];
    core.domain = Domain::Core;
    r.domains[0].idle_j = 2.0;
    core.idle_j = 1.5;
    r.domains.push(core);
    t.interval(&r, &[], &[], &[]);
    let text = screen(&mut t, 120, 24);
    assert!(
        text.contains("idle 2.0 W"),
        "core is part of package: {text}"
    );
}

#[test]
fn a_name_s_control_characters_never_reach_the_terminal() {
    let mut t = top();
    t.interval(
        &record(1, &[(7, None, "\u{1b}]52;c;eA==\u{7}x", 1.0)]),
        &[],
        &[],
        &[],
    );
    let text = screen(&mut t, 100, 24);
    assert!(text.contains("?]52;c;eA==?x"), "{text}");
    assert!(
        !text.contains('\u{1b}') && !text.contains('\u{7}'),
        "{text}"
    );
    t.event(&key(KeyCode::Enter));
    let text = screen(&mut t, 100, 24);
    assert!(text.contains("?]52;c;eA==?x (pid 7)"), "{text}");
}

#[test]
fn a_sleeping_parent_shows_its_own_energy_not_that_of_an_earlier_process_with_its_pid() {
    let dir = std::env::temp_dir().join(format!("wattprof-top-reuse-{}", std::process::id()));
    std::fs::create_dir_all(dir.join("5")).expect("fixture");
    // /proc/5/stat with its start time (the 22nd field) `start`.
    let stat = |comm: &str, start: u64| {
        std::fs::write(
            dir.join("5/stat"),
            format!("5 ({comm}) S 1 5 5 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0"),
        )
        .expect("stat");
        std::fs::write(dir.join("5/comm"), format!("{comm}\n")).expect("comm");
    };
    let with_ids = |t_s, rows: &[(u32, Option<u32>, &str, f64)]| {
        let mut r = record(t_s, rows);
        for p in r.processes.iter_mut().flatten() {
            p.live.id = u64::from(p.pid) * 10;
        }
        r
    };
    for (start_then, shown) in [(100, 50.0), (200, 0.0)] {
        stat("make", 100);
        let mut t = Top::new(1000, Grouping::Process, false, ProcFs::at(dir.clone()));
        t.interval(
            &with_ids(1, &[(5, Some(1), "make", 50.0), (11, Some(5), "a", 1.0)]),
            &[],
            &[],
            &[],
        );
        // 5 sleeps now: the same process (start 100), or make exited and
        // a shell got its pid (start 200).
        stat(if start_then == 100 { "make" } else { "bash" }, start_then);
        t.tree = true;
        t.interval(&with_ids(2, &[(11, Some(5), "a", 1.0)]), &[], &[], &[]);
        let five = t
            .shown()
            .iter()
            .find(|r| r.pid == 5)
            .expect("the parent")
            .clone();
        assert!(five.asleep);
        assert_eq!(
            five.fig.energy_j - 2.0,
            shown,
            "start {start_then}: its subtree less a's"
        );
    }
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn a_frame_s_changes_are_the_cells_ratatui_would_write() {
    use ratatui::buffer::Buffer;
    use ratatui::layout::Rect;
    use ratatui::style::{Modifier, Style};
    // Texts of one column, two (CJK, emoji), none (a combining accent
    // alone), and box and block characters; some cells skipped.
    const SYMBOLS: [&str; 9] = [
        " ",
        "a",
        "~",
        "\u{2502}",
        "\u{2585}",
        "\u{4e2d}",
        "\u{1f600}",
        "e\u{301}",
        "\u{301}",
    ];
    let mut seed = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next_u = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let area = Rect::new(0, 0, 23, 7);
    let mut random = |same_as: Option<&Buffer>| {
        let mut b = Buffer::empty(area);
        for i in 0..b.content.len() {
            let r = next_u();
            match (same_as, r % 4) {
                // Most cells unchanged from the frame before, as on screen.
                (Some(prev), 0..=2) => b.content[i] = prev.content[i].clone(),
                _ => {
                    b.content[i].set_symbol(SYMBOLS[(r >> 8) as usize % SYMBOLS.len()]);
                    b.content[i].skip = (r >> 16) % 17 == 0;
                    if (r >> 24) % 5 == 0 {
                        b.content[i].set_style(Style::new().add_modifier(Modifier::BOLD));
                    }
                }
            }
        }
        b
    };
    for _ in 0..500 {
        let prev = random(None);
        let next = random(Some(&prev));
        assert_eq!(draw::frame_updates(&prev, &next), prev.diff(&next));
        let blank = Buffer::empty(area);
        assert_eq!(draw::frame_updates(&blank, &next), blank.diff(&next));
    }
}

#[test]
fn batch_jobs_are_rows_named_by_scheduler_id_step_and_user() {
    let mut t = Top::new(
        1000,
        Grouping::Job,
        false,
        ProcFs::at(std::env::temp_dir().join("wattprof-no-proc")),
    );
    let energy = |j: f64| crate::model::EnergyJ {
        total_j: j,
        ..crate::model::EnergyJ::default()
    };
    let job = |id: &str, steps: &[(&str, f64)], j: f64, ns: u64| crate::model::JobReport {
        scheduler: "slurm".into(),
        job_id: id.into(),
        uid: Some(1000),
        user: Some("alice".into()),
        first_ns: 0,
        last_ns: 0,
        on_cpu_ns: ns,
        energy: energy(j),
        steps: steps
            .iter()
            .map(|(s, j)| crate::model::JobStepReport {
                step: (*s).into(),
                cgroups: Vec::new(),
                on_cpu_ns: 0,
                energy: energy(*j),
            })
            .collect(),
    };
    let jobs = |k: f64| {
        vec![
            job("41", &[("batch", 2.0 * k)], 2.0 * k, 0),
            job("42", &[("0", 9.0 * k), ("batch", 1.0 * k)], 10.0 * k, 0),
        ]
    };
    t.interval(&record(1, FAMILY), &[], &[], &jobs(1.0));
    t.interval(&record(2, FAMILY), &[], &[], &jobs(2.0));
    let rows: Vec<(String, Option<f64>)> = t
        .shown_groups()
        .iter()
        .map(|g| (g.name.clone(), g.power_w))
        .collect();
    assert_eq!(
        rows,
        vec![
            ("slurm 42 (alice)".to_string(), Some(10.0)),
            ("slurm 41 (alice)".to_string(), Some(2.0)),
        ],
        "named by job (its steps come and go); most power first"
    );
    let shown = screen(&mut t, 80, 24);
    assert!(
        shown.contains("BATCH JOB") && shown.contains("slurm 42 (alice)"),
        "{shown}"
    );
}
