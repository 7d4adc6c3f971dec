//! `wattprof top`'s terminal: each interval goes into the screen's state
//! (`render::top`) and is drawn; keys and the mouse come in through
//! [`TopScreen::input`], which `top`'s loop calls when stdin is readable
//! or a resize may be waiting. The terminal is restored once, whichever
//! comes first: quit, the signals that end the profile (the loop ends,
//! then [`TopScreen::restore`]), an error (drop), a panic on the main
//! thread (a hook run before the default one), or a second signal while
//! the first is handled ([`restore_in_signal`], async-signal-safe, before
//! `_exit(130)`). SIGINT, SIGTERM and SIGHUP are blocked from when the
//! terminal is taken until their handlers are in place
//! ([`unblock_ending_signals`]) and while it is given back. A terminal
//! that hangs up (its window closed) ends `top` as SIGHUP would, with
//! nothing more written to it. While it draws, stderr goes to a file and
//! is written out where stderr went when the terminal is given back (or
//! hangs up), so that no warning tears the screen.

use std::cell::RefCell;
use std::fs::File;
use std::io::BufWriter;
use std::rc::Rc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::time::{Duration, Instant};

use ratatui::Terminal;
use ratatui::backend::{Backend, CrosstermBackend};
use ratatui::buffer::Buffer;
use ratatui::crossterm::{cursor, event, execute, terminal};

use super::{Sink, Totals};
use crate::model::record::IntervalRecord;
use crate::render::top::{Grouping, Outcome, Top, draw, frame_updates};

/// The screen, shared by the sink (intervals) and the loop (input).
pub(crate) type Shared = Rc<RefCell<TopScreen>>;

/// The terminal and what is drawn on it.
pub(crate) struct TopScreen {
    top: Top,
    /// `None` once the terminal hung up.
    terminal: Option<Terminal<CrosstermBackend<BufWriter<File>>>>,
    /// What the terminal shows: the last frame drawn (ratatui's own copy
    /// is not used; see [`Self::redraw`]).
    shown: Buffer,
    restored: bool,
    /// The user asked to quit.
    quit: bool,
    /// When the terminal's events were last read: a resize (no input on
    /// stdin) is looked for this often.
    last_input: Instant,
}

/// How often events are read when stdin has nothing: a resize is seen
/// within this.
const RESIZE_EVERY: Duration = Duration::from_millis(200);

/// Whether `top` holds the terminal (raw, alternate screen): whoever
/// gives it back first clears it, so it is restored once.
static HELD: AtomicBool = AtomicBool::new(false);
/// The terminal's settings before raw mode, for [`restore_in_signal`].
static SAVED_TERMIOS: OnceLock<libc::termios> = OnceLock::new();

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
/// meanwhile. Only the first call does it.
fn restore_terminal() {
    // A second signal meanwhile would find the terminal no longer held
    // and exit before it is given back: it waits until this is done.
    let _blocked = BlockedSignals::new();
    if !HELD.swap(false, Ordering::SeqCst) {
        return;
    }
    let _ = terminal::disable_raw_mode();
    let _ = execute!(
        std::io::stdout(),
        event::DisableMouseCapture,
        terminal::LeaveAlternateScreen,
        cursor::Show
    );
    give_back_stderr();
}

/// SIGINT, SIGTERM and SIGHUP held back while this lives (on this
/// thread: the one the handlers run on is the main one, which restores).
struct BlockedSignals(libc::sigset_t);

impl BlockedSignals {
    fn new() -> Self {
        // SAFETY: sigset_t is plain data; the calls fill it and swap this
        // thread's mask, keeping the old one to put back.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            let mut old: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
                libc::sigaddset(&mut set, sig);
            }
            libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
            Self(old)
        }
    }
}

impl Drop for BlockedSignals {
    fn drop(&mut self) {
        // SAFETY: puts back the mask `new` saved.
        unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, &self.0, std::ptr::null_mut()) };
    }
}

/// Blocks SIGINT, SIGTERM and SIGHUP from when `top` takes the terminal
/// until the session's handlers are in place ([`unblock_ending_signals`]):
/// one arriving between would end wattprof with the terminal raw.
fn block_ending_signals() {
    std::mem::forget(BlockedSignals::new());
}

/// Lets SIGINT, SIGTERM and SIGHUP in again, once their handlers are
/// installed (one that came meanwhile is handled now).
pub(crate) fn unblock_ending_signals() {
    // SAFETY: as in `BlockedSignals::new`, unblocking instead.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_UNBLOCK, &set, std::ptr::null_mut());
    }
}

/// Gives the terminal back from a signal handler, as
/// [`restore_terminal`] does, with async-signal-safe calls only (atomics,
/// `write`, `tcsetattr`, `dup2`, `read`, `close`): a second SIGINT, SIGTERM
/// or SIGHUP ends wattprof at once, and must not leave a raw terminal.
pub(crate) fn restore_in_signal() {
    if !HELD.swap(false, Ordering::SeqCst) {
        return;
    }
    // Mouse off (each mode crossterm turns on), normal screen, cursor on.
    const UNDO: &[u8] =
        b"\x1b[?1006l\x1b[?1015l\x1b[?1003l\x1b[?1002l\x1b[?1000l\x1b[?1049l\x1b[?25h";
    // SAFETY: write and tcsetattr on this process's descriptors, from a
    // termios saved before raw mode; both are async-signal-safe.
    unsafe {
        libc::write(libc::STDOUT_FILENO, UNDO.as_ptr().cast(), UNDO.len());
        if let Some(t) = SAVED_TERMIOS.get() {
            libc::tcsetattr(libc::STDIN_FILENO, libc::TCSANOW, t);
        }
    }
    give_back_stderr();
}

impl TopScreen {
    /// Takes the terminal (alternate screen, raw input, mouse) for `top`.
    pub(crate) fn open(top: Top) -> std::io::Result<Self> {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // The message must land on a usable terminal; a panic on
            // another thread does not end `top`, which goes on drawing.
            if std::thread::current().name() == Some("main") {
                restore_terminal();
            }
            previous(info);
        }));
        // SAFETY: a zeroed termios is valid for tcgetattr to fill.
        let mut saved: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: stdin is a descriptor of this process; `saved` is ours.
        if unsafe { libc::tcgetattr(libc::STDIN_FILENO, &mut saved) } == 0 {
            let _ = SAVED_TERMIOS.set(saved);
        }
        block_ending_signals();
        hold_stderr()?;
        if let Err(e) = terminal::enable_raw_mode() {
            give_back_stderr();
            return Err(e);
        }
        HELD.store(true, Ordering::SeqCst);
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
        let terminal = frame_writer()
            .and_then(|out| Terminal::new(CrosstermBackend::new(out)))
            .inspect_err(|_| restore_terminal())?;
        let mut screen = Self {
            top,
            terminal: Some(terminal),
            shown: Buffer::default(),
            restored: false,
            quit: false,
            last_input: Instant::now(),
        };
        screen.redraw();
        Ok(screen)
    }

    /// Draws the screen now (a failed write is tried again next time).
    ///
    /// As ratatui's `Terminal::draw` does (resize, draw into its buffer,
    /// write the cells that changed), but the cells that changed are
    /// found by [`frame_updates`], which does not measure the width of
    /// every ASCII cell, against [`Self::shown`]. The cursor stays hidden
    /// (hidden when the terminal was taken, and again at Ctrl-L or after
    /// a failed write).
    pub(crate) fn redraw(&mut self) {
        if self.restored {
            return;
        }
        let Some(terminal) = &mut self.terminal else {
            return;
        };
        // A new size clears the screen (and ratatui's buffers).
        if terminal.autoresize().is_err() {
            return;
        }
        draw(&mut terminal.get_frame(), &mut self.top);
        let mut next = std::mem::take(terminal.current_buffer_mut());
        if self.shown.area != next.area {
            self.shown = Buffer::empty(next.area);
        }
        let written = {
            let updates = frame_updates(&self.shown, &next);
            let backend = terminal.backend_mut();
            backend
                .draw(updates.into_iter())
                .and_then(|()| Backend::flush(backend))
        };
        if written.is_ok() {
            std::mem::swap(&mut self.shown, &mut next);
        } else {
            // Not known what reached the screen: the next frame is
            // written whole, over a cleared screen, cleared in the
            // default colours (the resets ratatui sends after a frame's
            // last cell first) with the cursor hidden again.
            let _ = terminal.backend_mut().draw(std::iter::empty());
            let _ = terminal.clear();
            let _ = terminal.hide_cursor();
            self.shown = Buffer::empty(next.area);
        }
        next.reset();
        *terminal.current_buffer_mut() = next;
    }

    /// Takes every key, mouse and resize event waiting, and draws once if
    /// any changed the screen; `stdin_ready`: the loop saw input. Without
    /// it, events are read at most every [`RESIZE_EVERY`] (a resize comes
    /// as a signal, not as input). Returns whether the user quit.
    pub(crate) fn input(&mut self, stdin_ready: bool) -> bool {
        if !stdin_ready && self.last_input.elapsed() < RESIZE_EVERY {
            return self.quit;
        }
        self.last_input = Instant::now();
        if terminal_gone() {
            // Its window closed: end as on SIGHUP, drawing nothing more
            // (and not trying to show a cursor on it when dropped); what
            // stderr held, and the summary after, go where stderr went.
            std::mem::forget(self.terminal.take());
            if HELD.swap(false, Ordering::SeqCst) {
                give_back_stderr();
            }
            self.restored = true;
            self.quit = true;
            return true;
        }
        let (mut redraw, mut repaint) = (false, false);
        while !self.quit && event::poll(Duration::ZERO).unwrap_or(false) {
            let Ok(ev) = event::read() else {
                break;
            };
            match self.top.event(&ev) {
                Outcome::Quit => self.quit = true,
                Outcome::Redraw => redraw = true,
                Outcome::Repaint => repaint = true,
                Outcome::Same => {}
            }
        }
        if repaint
            && !self.quit
            && let Some(terminal) = &mut self.terminal
        {
            // Cleared: what was shown is gone, the next frame is whole;
            // a cursor something else showed is hidden again.
            let _ = terminal.clear();
            let _ = terminal.hide_cursor();
            self.shown.reset();
        }
        if (redraw || repaint) && !self.quit {
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
                // Shown already by the restore: ratatui, which shows the
                // cursor at drop if it hid it (Ctrl-L), need not again.
                let _ = terminal.show_cursor();
            }
        }
    }
}

/// Where frames are written: stdout (a dup of it), buffered whole. Not
/// `std::io::stdout()`: it is line-buffered with 1 KiB, so a frame went
/// out in a write per KiB, each waking the terminal, and each searched
/// for newlines (a third of what the screen cost, measured with perf).
fn frame_writer() -> std::io::Result<BufWriter<File>> {
    use std::os::fd::{AsFd, OwnedFd};
    let fd: OwnedFd = std::io::stdout().as_fd().try_clone_to_owned()?;
    Ok(BufWriter::with_capacity(1 << 16, File::from(fd)))
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
        let (mut containers, mut cgroups, mut jobs) = (Vec::new(), Vec::new(), Vec::new());
        match screen.top.grouping {
            Grouping::Process => {}
            Grouping::Container => containers = totals.container_reports(None),
            Grouping::Cgroup => cgroups = totals.cgroup_reports(None),
            Grouping::Job => jobs = totals.job_reports(None),
        }
        screen.top.interval(record, &containers, &cgroups, &jobs);
        // Paused, the screen does not change.
        if !screen.top.paused {
            screen.redraw();
        }
        #[cfg(debug_assertions)]
        test_faults(screen.top.elapsed_s);
    }
}

/// Debug builds only, for the tests of what happens to the terminal,
/// once `top` has drawn for a second: `WATTPROF_TEST_PANIC=top` panics
/// (a bug), and `WATTPROF_TEST_HANG=FILE` creates FILE and then holds the
/// interval for 10 s (a hung GPU read), once.
#[cfg(debug_assertions)]
fn test_faults(elapsed_s: f64) {
    if elapsed_s < 1.0 {
        return;
    }
    if std::env::var_os("WATTPROF_TEST_PANIC").is_some_and(|v| v == "top") {
        panic!("WATTPROF_TEST_PANIC=top: a panic while top draws");
    }
    if let Some(file) = std::env::var_os("WATTPROF_TEST_HANG") {
        // SAFETY: the tests run top single-threaded at this point; no
        // other thread reads the environment.
        unsafe { std::env::remove_var("WATTPROF_TEST_HANG") };
        let _ = std::fs::write(file, b"hung\n");
        std::thread::sleep(Duration::from_secs(10));
    }
}
