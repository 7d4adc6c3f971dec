//! `wattprof top`'s terminal: each interval goes into the screen's state
//! (`render::top`) and is drawn; keys and the mouse come in through
//! [`TopScreen::input`], which `top`'s loop calls whenever it wakes. The
//! terminal is restored on quit, on the signals that end the profile
//! (the loop ends, then [`TopScreen::restore`]), on an error (drop), and on
//! a panic (a hook run before the default one). A terminal that hangs up
//! (its window closed) ends `top` as SIGHUP would. While it draws, stderr
//! goes to a file and is written out when the terminal is given back, so
//! that no warning tears the screen.

use std::cell::RefCell;
use std::io::Stdout;
use std::rc::Rc;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::{cursor, event, execute, terminal};

use super::{Sink, Totals};
use crate::model::record::IntervalRecord;
use crate::render::top::{Grouping, Outcome, Top, draw};

/// The screen, shared by the sink (intervals) and the loop (input).
pub(crate) type Shared = Rc<RefCell<TopScreen>>;

/// The terminal and what is drawn on it.
pub(crate) struct TopScreen {
    top: Top,
    /// `None` once the terminal hung up.
    terminal: Option<Terminal<CrosstermBackend<Stdout>>>,
    restored: bool,
    /// The user asked to quit.
    quit: bool,
}

/// stderr as it was while `top` holds it elsewhere (-1: not held).
static SAVED_STDERR: AtomicI32 = AtomicI32::new(-1);
/// The unlinked file that holds what was written to stderr meanwhile.
static HELD_STDERR: AtomicI32 = AtomicI32::new(-1);

/// Sends stderr to an unlinked file while `top` draws: a warning written
/// on the terminal would tear the screen. What it holds is written out
/// when the terminal is given back.
fn hold_stderr() -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let file = tempfile::tempfile()?.into_raw_fd();
    // SAFETY: dup of the process's own stderr.
    let saved = unsafe { libc::dup(libc::STDERR_FILENO) };
    // SAFETY: both are open descriptors of this process.
    if saved < 0 || unsafe { libc::dup2(file, libc::STDERR_FILENO) } < 0 {
        let e = std::io::Error::last_os_error();
        // SAFETY: closing descriptors this function opened.
        unsafe {
            libc::close(file);
            if saved >= 0 {
                libc::close(saved);
            }
        }
        return Err(e);
    }
    HELD_STDERR.store(file, Ordering::SeqCst);
    SAVED_STDERR.store(saved, Ordering::SeqCst);
    Ok(())
}

/// Gives stderr back and writes out what it held. Safe to call more than
/// once, and from the panic hook.
fn give_back_stderr() {
    let saved = SAVED_STDERR.swap(-1, Ordering::SeqCst);
    let held = HELD_STDERR.swap(-1, Ordering::SeqCst);
    if saved < 0 {
        return;
    }
    // SAFETY: `saved` and `held` are descriptors `hold_stderr` opened and
    // only this function (which took them out of the statics) closes.
    unsafe {
        libc::dup2(saved, libc::STDERR_FILENO);
        libc::close(saved);
        if held >= 0 {
            libc::lseek(held, 0, libc::SEEK_SET);
            let mut buf = [0u8; 8192];
            loop {
                let n = libc::read(held, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 || libc::write(libc::STDERR_FILENO, buf.as_ptr().cast(), n as usize) < 0 {
                    break;
                }
            }
            libc::close(held);
        }
    }
}

/// Puts the terminal back as it was: a normal screen, cooked input, the
/// cursor shown, the mouse released, stderr on it with what it said
/// meanwhile. Safe to call more than once.
fn restore_terminal() {
    let _ = terminal::disable_raw_mode();
    let _ = execute!(
        std::io::stdout(),
        event::DisableMouseCapture,
        terminal::LeaveAlternateScreen,
        cursor::Show
    );
    give_back_stderr();
}

impl TopScreen {
    /// Takes the terminal (alternate screen, raw input, mouse) for `top`.
    pub(crate) fn open(top: Top) -> std::io::Result<Self> {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // The message must land on a usable terminal.
            restore_terminal();
            previous(info);
        }));
        hold_stderr()?;
        if let Err(e) = terminal::enable_raw_mode() {
            give_back_stderr();
            return Err(e);
        }
        let mut out = std::io::stdout();
        if let Err(e) = execute!(
            out,
            terminal::EnterAlternateScreen,
            event::EnableMouseCapture,
            cursor::Hide
        ) {
            restore_terminal();
            return Err(e);
        }
        let terminal = Terminal::new(CrosstermBackend::new(std::io::stdout()))
            .inspect_err(|_| restore_terminal())?;
        let mut screen = Self {
            top,
            terminal: Some(terminal),
            restored: false,
            quit: false,
        };
        screen.redraw();
        Ok(screen)
    }

    /// Draws the screen now (a failed write is tried again next time).
    pub(crate) fn redraw(&mut self) {
        if self.restored {
            return;
        }
        let top = &mut self.top;
        if let Some(terminal) = &mut self.terminal {
            let _ = terminal.draw(|f| draw(f, top));
        }
    }

    /// Takes every key, mouse and resize event waiting, and draws once if
    /// any changed the screen. Returns whether the user quit.
    pub(crate) fn input(&mut self) -> bool {
        if terminal_gone() {
            // Its window closed: end as on SIGHUP, drawing nothing more
            // (and not trying to show a cursor on it when dropped).
            std::mem::forget(self.terminal.take());
            self.restored = true;
            self.quit = true;
            return true;
        }
        let mut redraw = false;
        while !self.quit && event::poll(Duration::ZERO).unwrap_or(false) {
            let Ok(ev) = event::read() else {
                break;
            };
            match self.top.event(&ev) {
                Outcome::Quit => self.quit = true,
                Outcome::Redraw => redraw = true,
                Outcome::Same => {}
            }
        }
        if redraw && !self.quit {
            self.redraw();
        }
        self.quit
    }

    /// The interval the user asked for (ms).
    pub(crate) fn interval_ms(&self) -> u64 {
        self.top.interval_ms
    }

    /// Gives the terminal back (before the summary is printed).
    pub(crate) fn restore(&mut self) {
        if !std::mem::replace(&mut self.restored, true) {
            restore_terminal();
            if let Some(terminal) = &mut self.terminal {
                // Shown already: ratatui need not show it again at drop.
                let _ = terminal.show_cursor();
            }
        }
    }
}

/// Whether the terminal hung up (stdin reports `POLLHUP`: reading it
/// would return at once, forever).
fn terminal_gone() -> bool {
    let mut fd = libc::pollfd {
        fd: libc::STDIN_FILENO,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd; a zero timeout does not wait.
    let n = unsafe { libc::poll(&mut fd, 1, 0) };
    n > 0 && fd.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

impl Drop for TopScreen {
    fn drop(&mut self) {
        self.restore();
    }
}

/// The sink half: each interval into the screen.
pub(crate) struct TopSink(pub(crate) Shared);

impl Sink for TopSink {
    fn interval(&mut self, record: &IntervalRecord, totals: &Totals<'_>) {
        let mut screen = self.0.borrow_mut();
        // The groups' sums are built only when they are on screen.
        let (containers, cgroups) = match screen.top.grouping {
            Grouping::Process => (Vec::new(), Vec::new()),
            Grouping::Container => (totals.container_reports(None), Vec::new()),
            Grouping::Cgroup => (Vec::new(), totals.cgroup_reports(None)),
        };
        screen.top.interval(record, &containers, &cgroups);
        screen.redraw();
    }
}
