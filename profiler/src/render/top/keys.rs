//! What each key and mouse action does to the screen. The keys are
//! htop's where htop has one (F1 help, F4 and `\` filter, F5 and `t`
//! tree, F6 and `<` `>` sort, `u` user, `Z` pause, F10 and `q` quit;
//! htop's search, F3 and `/`, filters here too); what htop lacks has a
//! letter of its own. Ctrl chords are not keys of `top`, but for Ctrl-C
//! (quit), Ctrl-L (draw again) and Ctrl-H (Backspace); Alt-x is Esc then
//! x, as terminals send it.

use ratatui::crossterm::event::{
    Event, KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseButton, MouseEvent, MouseEventKind,
};

use super::{Column, Grouping, INTERVALS_MS, Mode, Top};

/// What the caller does after an event.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Outcome {
    /// Nothing changed.
    Same,
    /// Draw again.
    Redraw,
    /// Clear the terminal and draw it all again (Ctrl-L).
    Repaint,
    /// Leave `top`.
    Quit,
}

/// The key list, as `h` and `--help` show it.
pub(crate) const KEYS: &[(&str, &str)] = &[
    (
        "Up Down PgUp PgDn Home End",
        "move the selection (and the mouse wheel)",
    ),
    (
        "F6 > <",
        "sort by the next or previous column (or click a heading)",
    ),
    ("I", "invert the order"),
    ("P N E W", "sort by CPU%, PID, energy, power"),
    (
        "F5 t",
        "tree: children under their parent, with subtree totals",
    ),
    (
        "g",
        "group: processes, containers and units, cgroups, batch jobs",
    ),
    (
        "F3 F4 / \\",
        "filter by command or PID as you type (Enter keeps it, Esc clears it)",
    ),
    ("u", "show one user's processes (empty: everyone's)"),
    ("Enter", "the selected process's details (Esc back)"),
    (
        "Z space",
        "pause the screen (the profile goes on recording)",
    ),
    ("+ -", "longer or shorter interval"),
    ("F1 h ?", "this help"),
    ("F10 q Ctrl-C", "quit (the summary is printed after)"),
];

/// The keys as one text, for `--help`.
pub(crate) fn keys_help() -> String {
    KEYS.iter()
        .map(|(k, what)| format!("  {k:<28} {what}"))
        .collect::<Vec<_>>()
        .join("\n")
}

impl Top {
    /// Applies a terminal event.
    pub(crate) fn event(&mut self, ev: &Event) -> Outcome {
        let outcome = match ev {
            Event::Key(k) if k.kind != KeyEventKind::Release => self.key(*k),
            Event::Mouse(m) => self.mouse(*m),
            Event::Resize(..) => return Outcome::Redraw,
            _ => Outcome::Same,
        };
        if outcome == Outcome::Redraw {
            // The view follows what the key changed.
            self.refresh();
        }
        outcome
    }

    fn key(&mut self, k: KeyEvent) -> Outcome {
        if k.modifiers == KeyModifiers::ALT {
            // A terminal sends Alt-x as Esc then x, and so does Esc typed
            // just before x (crossterm cannot tell them apart): both
            // keys, in that order.
            let esc = self.key(KeyEvent::new(KeyCode::Esc, KeyModifiers::NONE));
            let then = self.key(KeyEvent::new(k.code, KeyModifiers::NONE));
            return match (esc, then) {
                (Outcome::Quit, _) | (_, Outcome::Quit) => Outcome::Quit,
                (Outcome::Same, Outcome::Same) => Outcome::Same,
                _ => Outcome::Redraw,
            };
        }
        if k.modifiers
            .intersects(KeyModifiers::CONTROL | KeyModifiers::ALT)
        {
            // Ctrl-C quits, Ctrl-L draws again, Ctrl-H is Backspace (as
            // some terminals send it); no other chord is a key of `top`.
            return match k.code {
                KeyCode::Char('c') if k.modifiers == KeyModifiers::CONTROL => Outcome::Quit,
                KeyCode::Char('l') if k.modifiers == KeyModifiers::CONTROL => Outcome::Repaint,
                KeyCode::Char('h') if k.modifiers == KeyModifiers::CONTROL => {
                    self.key(KeyEvent::new(KeyCode::Backspace, KeyModifiers::NONE))
                }
                _ => Outcome::Same,
            };
        }
        match self.mode.clone() {
            Mode::Filter(text) => self.typing(k, text, true),
            Mode::User(text) => self.typing(k, text, false),
            Mode::Help | Mode::Details(_) => match k.code {
                KeyCode::Char('q') | KeyCode::F(10) => Outcome::Quit,
                _ => {
                    self.mode = Mode::Table;
                    Outcome::Redraw
                }
            },
            Mode::Table => self.table_key(k),
        }
    }

    /// A key while typing a filter: Enter keeps it, Esc clears it.
    fn typing(&mut self, k: KeyEvent, mut text: String, filter: bool) -> Outcome {
        match k.code {
            KeyCode::Enter => {
                self.mode = Mode::Table;
                if !filter {
                    self.user_filter = (!text.is_empty()).then_some(text);
                }
            }
            KeyCode::Esc => {
                self.mode = Mode::Table;
                if filter {
                    self.filter.clear();
                }
            }
            KeyCode::Backspace => {
                text.pop();
                self.set_typing(text, filter);
            }
            KeyCode::Char(c) if !c.is_control() => {
                text.push(c);
                self.set_typing(text, filter);
            }
            _ => return Outcome::Same,
        }
        self.select(0);
        self.offset = 0;
        Outcome::Redraw
    }

    fn set_typing(&mut self, text: String, filter: bool) {
        if filter {
            // The filter applies as it is typed.
            self.filter.clone_from(&text);
            self.mode = Mode::Filter(text);
        } else {
            self.mode = Mode::User(text);
        }
    }

    fn table_key(&mut self, k: KeyEvent) -> Outcome {
        let page = self.layout.as_ref().map_or(10, |l| l.rows.max(1) as usize);
        match k.code {
            KeyCode::Char('q') | KeyCode::F(10) => return Outcome::Quit,
            KeyCode::Char('h' | '?') | KeyCode::F(1) => self.mode = Mode::Help,
            KeyCode::Up => self.move_by(-1),
            KeyCode::Down => self.move_by(1),
            KeyCode::PageUp => self.move_by(-(page as isize)),
            KeyCode::PageDown => self.move_by(page as isize),
            KeyCode::Home => self.move_by(isize::MIN / 2),
            KeyCode::End => self.move_by(isize::MAX / 2),
            KeyCode::F(6) | KeyCode::Char('>' | '.') => self.step_sort(1),
            KeyCode::Char('<' | ',') => self.step_sort(-1),
            KeyCode::Char('I') => self.descending = !self.descending,
            KeyCode::Char('P') => self.sort_by_fresh(Column::CpuPct),
            KeyCode::Char('N') => self.sort_by_fresh(Column::Pid),
            KeyCode::Char('E') => self.sort_by_fresh(Column::Energy),
            KeyCode::Char('W') => self.sort_by_fresh(Column::Power),
            KeyCode::F(5) | KeyCode::Char('t') => self.tree = !self.tree,
            KeyCode::Char('g') => {
                self.grouping = self.grouping.next();
                // Its power comes from two intervals seen in this view.
                self.group_before.clear();
                self.selected = 0;
                self.offset = 0;
                self.refresh();
                self.select(0);
            }
            KeyCode::F(3 | 4) | KeyCode::Char('/' | '\\') => {
                self.mode = Mode::Filter(self.filter.clone());
            }
            KeyCode::Char('u') => {
                self.mode = Mode::User(self.user_filter.clone().unwrap_or_default());
            }
            KeyCode::Enter => match self.selected_pid() {
                Some(pid) => self.mode = Mode::Details(pid),
                None => return Outcome::Same,
            },
            KeyCode::Char('Z' | 'z' | ' ') => self.paused = !self.paused,
            KeyCode::Char('+' | '=') => self.step_interval(true),
            KeyCode::Char('-' | '_') => self.step_interval(false),
            KeyCode::Esc => {
                self.filter.clear();
                self.user_filter = None;
            }
            _ => return Outcome::Same,
        }
        Outcome::Redraw
    }

    fn sort_by_fresh(&mut self, column: Column) {
        self.sort = column;
        self.descending = !column.ascending_first();
    }

    fn step_sort(&mut self, by: isize) {
        let n = Column::ALL.len() as isize;
        let at = Column::ALL
            .iter()
            .position(|c| *c == self.sort)
            .unwrap_or(0) as isize;
        self.sort_by_fresh(Column::ALL[(at + by).rem_euclid(n) as usize]);
    }

    /// The next longer (`longer`) or shorter interval of the list; from
    /// one between two of them (`--interval 1500ms`), the nearest that way.
    fn step_interval(&mut self, longer: bool) {
        let now = self.interval_ms;
        let to = if longer {
            INTERVALS_MS.iter().find(|ms| **ms > now)
        } else {
            INTERVALS_MS.iter().rev().find(|ms| **ms < now)
        };
        if let Some(ms) = to {
            self.interval_ms = *ms;
        }
    }

    fn move_by(&mut self, by: isize) {
        let n = self.row_count();
        let to = (self.selected as isize)
            .saturating_add(by)
            .clamp(0, (n as isize - 1).max(0));
        self.select(to as usize);
    }

    fn mouse(&mut self, m: MouseEvent) -> Outcome {
        match m.kind {
            MouseEventKind::ScrollUp => self.move_by(-3),
            MouseEventKind::ScrollDown => self.move_by(3),
            MouseEventKind::Down(MouseButton::Left) => {
                let Some(layout) = self.layout.clone() else {
                    return Outcome::Same;
                };
                if self.mode != Mode::Table {
                    self.mode = Mode::Table;
                } else if m.row == layout.heading_y && self.grouping == Grouping::Process {
                    match layout
                        .columns
                        .iter()
                        .find(|(_, x0, x1)| (*x0..*x1).contains(&m.column))
                    {
                        Some((c, ..)) => self.sort_by(*c),
                        None => return Outcome::Same,
                    }
                } else if m.row >= layout.first_row_y && m.row < layout.first_row_y + layout.rows {
                    let at = self.offset + usize::from(m.row - layout.first_row_y);
                    if at >= self.row_count() {
                        return Outcome::Same;
                    }
                    self.select(at);
                } else {
                    return Outcome::Same;
                }
            }
            _ => return Outcome::Same,
        }
        Outcome::Redraw
    }
}
