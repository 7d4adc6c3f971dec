//! An external wattmeter: OmegaWatt `wattmetre-read` output.
//!
//! ```text
//! #timestamp,#frame_is_ok,#U1,#U2,#U3,#current1,#activepow1,#current2,#activepow2,...
//! 1671527189.304214184,false,,,,,,,,,,,,,,,
//! 1671527189.314471465,true,232.3,0.0,0.0,0.1,20.9,...
//! ```
//!
//! About 100 frames a second; the machine on outlet `n` draws `#activepown`
//! watts. Energy is the integral of active power over time (trapezoids
//! between consecutive good frames). Frames with `frame_is_ok=false`,
//! malformed lines and timestamps that go backwards are skipped and
//! counted, never fatal. The log is read from a file being written (its
//! last, unfinished line is kept for the next read) or from a
//! `wattmetre-read` command wattprof starts and stops.

use std::io::{Read, Seek, SeekFrom};
use std::os::fd::AsRawFd;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

use serde::Serialize;

use super::{Domain, DomainEnergy, Source, SourceError, SourceInfo};

/// One line of a `wattmetre-read` log.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Line {
    /// The header: the column holding `#activepow<outlet>`, if present.
    Header {
        /// Column index of the chosen outlet's active power.
        power_column: Option<usize>,
    },
    /// A frame: its time and, when the frame is good, the outlet's power.
    Frame {
        /// Seconds (Unix time).
        timestamp_s: f64,
        /// Active power in W; `None` for a frame marked not ok.
        power_w: Option<f64>,
    },
    /// Anything else.
    Malformed,
}

/// Column of `#activepow<outlet>` when the log has no header: timestamp,
/// frame_is_ok, U1..U3, then (current, activepow) per outlet.
pub(crate) fn default_power_column(outlet: u32) -> usize {
    6 + 2 * (outlet.max(1) as usize - 1)
}

/// Parses one line (without its newline). Pure: the fuzz target calls it.
pub(crate) fn parse_line(line: &str, outlet: u32, power_column: usize) -> Line {
    let line = line.trim_end_matches('\r');
    if line.starts_with('#') {
        let want = format!("#activepow{outlet}");
        return Line::Header {
            power_column: line.split(',').position(|c| c.trim() == want),
        };
    }
    let mut fields = line.split(',');
    let Some(timestamp_s) = fields.next().and_then(|t| t.trim().parse::<f64>().ok()) else {
        return Line::Malformed;
    };
    if !timestamp_s.is_finite() || timestamp_s < 0.0 {
        return Line::Malformed;
    }
    match fields.next().map(str::trim) {
        Some("false") => Line::Frame {
            timestamp_s,
            power_w: None,
        },
        Some("true") => {
            let power = line
                .split(',')
                .nth(power_column)
                .and_then(|p| p.trim().parse::<f64>().ok())
                .filter(|p| p.is_finite() && *p >= 0.0 && *p < 1e7);
            match power {
                Some(w) => Line::Frame {
                    timestamp_s,
                    power_w: Some(w),
                },
                None => Line::Malformed,
            }
        }
        _ => Line::Malformed,
    }
}

/// Counts of what the reader saw.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct WattmeterStats {
    /// Good frames integrated.
    pub frames_ok: u64,
    /// Frames marked not ok (skipped).
    pub frames_not_ok: u64,
    /// Lines that could not be parsed (skipped).
    pub malformed_lines: u64,
    /// Frames whose timestamp did not advance (skipped).
    pub out_of_order: u64,
    /// Seconds between good frames more than 0.5 s apart, bridged by
    /// interpolation.
    pub gap_s: f64,
    /// Mean power over good frames (W).
    pub mean_power_w: f64,
}

/// Trapezoidal integration of power over time.
#[derive(Clone, Debug, Default)]
pub struct Integrator {
    outlet: u32,
    power_column: usize,
    last: Option<(f64, f64)>,
    last_ts: Option<f64>,
    energy_j: f64,
    power_sum_w: f64,
    stats: WattmeterStats,
}

/// Frames further apart than this are a gap (normal spacing is 10 ms).
const GAP_S: f64 = 0.5;

impl Integrator {
    /// Integrates outlet `outlet` (1-based, as the meter numbers them).
    pub fn new(outlet: u32) -> Self {
        Self {
            outlet,
            power_column: default_power_column(outlet),
            ..Self::default()
        }
    }

    /// Feeds one complete line.
    pub fn line(&mut self, line: &str) {
        if line.trim().is_empty() {
            return;
        }
        match parse_line(line, self.outlet, self.power_column) {
            Line::Header { power_column } => {
                if let Some(c) = power_column {
                    self.power_column = c;
                }
            }
            Line::Frame { timestamp_s, .. } if self.last_ts.is_some_and(|t| timestamp_s <= t) => {
                self.stats.out_of_order += 1;
            }
            Line::Frame {
                timestamp_s,
                power_w: None,
            } => {
                self.last_ts = Some(timestamp_s);
                self.stats.frames_not_ok += 1;
            }
            Line::Frame {
                timestamp_s,
                power_w: Some(w),
            } => {
                if let Some((t0, w0)) = self.last {
                    let dt = timestamp_s - t0;
                    self.energy_j += dt * (w0 + w) / 2.0;
                    if dt > GAP_S {
                        self.stats.gap_s += dt;
                    }
                }
                self.last = Some((timestamp_s, w));
                self.last_ts = Some(timestamp_s);
                self.stats.frames_ok += 1;
                self.power_sum_w += w;
                self.stats.mean_power_w = self.power_sum_w / self.stats.frames_ok as f64;
            }
            Line::Malformed => self.stats.malformed_lines += 1,
        }
    }

    /// A new series starts (the log was truncated or replaced): the next
    /// frame is not joined to the previous one.
    pub(crate) fn restart(&mut self) {
        self.last = None;
        self.last_ts = None;
    }

    /// Joules integrated so far.
    pub fn energy_j(&self) -> f64 {
        self.energy_j
    }

    /// What was seen so far.
    pub fn stats(&self) -> &WattmeterStats {
        &self.stats
    }
}

fn file_identity(file: &std::fs::File) -> (u64, u64) {
    use std::os::unix::fs::MetadataExt;
    file.metadata().map_or((0, 0), |m| (m.dev(), m.ino()))
}

/// Where the log comes from.
#[derive(Debug)]
enum Input {
    /// A file being written by a `wattmetre-read` started elsewhere.
    File {
        path: PathBuf,
        file: std::fs::File,
        offset: u64,
        /// (device, inode) of the open file, to notice a replaced log.
        identity: (u64, u64),
    },
    /// A `wattmetre-read` wattprof started; stopped when the reader drops.
    Command { child: Child, argv: Vec<String> },
}

/// The wattmeter reader.
#[derive(Debug)]
pub(crate) struct Wattmeter {
    input: Input,
    pending: Vec<u8>,
    integrator: Integrator,
    reported_uj: u64,
    /// A failure at the last read whose energy was still counted.
    problems: Vec<String>,
}

impl Wattmeter {
    /// The time (the log's clock, s) of the last good frame integrated:
    /// the energy read so far covers the frames up to it, so energy over
    /// the span between two of these is exact whatever the read timing.
    pub(crate) fn last_frame_s(&self) -> Option<f64> {
        self.integrator.last.map(|(t, _)| t)
    }

    /// Follows a log file being written, from its beginning.
    pub(crate) fn open_file(path: impl Into<PathBuf>, outlet: u32) -> Result<Self, SourceError> {
        let path = path.into();
        let file = std::fs::File::open(&path).map_err(|e| {
            SourceError::unsupported(
                format!("cannot open wattmeter log {}: {e}", path.display()),
                "check the path given to wattprof",
            )
        })?;
        let identity = file_identity(&file);
        Ok(Self::with(
            Input::File {
                path,
                file,
                offset: 0,
                identity,
            },
            outlet,
        ))
    }

    /// Starts `argv` (e.g. `wattmetre-read --tty=/dev/ttyUSB0 --nb=6`) and
    /// reads its standard output.
    pub(crate) fn spawn(argv: &[String], outlet: u32) -> Result<Self, SourceError> {
        let (program, args) = argv.split_first().ok_or_else(|| {
            SourceError::unsupported("empty wattmeter command", "give the wattmetre-read command")
        })?;
        use std::os::unix::process::CommandExt;
        let mut child = Command::new(program)
            .args(args)
            // Its own process group: a Ctrl-C in the terminal must not kill
            // it before wattprof has read its last frames.
            .process_group(0)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| {
                SourceError::unsupported(
                    format!("cannot start {program}: {e}"),
                    "check the wattmetre-read path and the tty's permissions",
                )
            })?;
        if let Some(out) = &child.stdout {
            let fd = out.as_raw_fd();
            // SAFETY: fcntl on a pipe fd we own.
            let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
            // SAFETY: as above.
            if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0
            {
                let e = std::io::Error::last_os_error();
                let _ = child.kill();
                let _ = child.wait();
                return Err(SourceError::Fatal(format!(
                    "cannot read {program}'s output without blocking: {e}"
                )));
            }
        }
        Ok(Self::with(
            Input::Command {
                child,
                argv: argv.to_vec(),
            },
            outlet,
        ))
    }

    fn with(input: Input, outlet: u32) -> Self {
        Self {
            input,
            pending: Vec::new(),
            integrator: Integrator::new(outlet),
            reported_uj: 0,
            problems: Vec::new(),
        }
    }

    /// What was seen so far.
    pub fn stats(&self) -> &WattmeterStats {
        self.integrator.stats()
    }

    /// Takes a last line that has no newline as complete (the log has
    /// ended) and returns the energy it adds (µJ).
    fn finish(&mut self) -> u64 {
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            match std::str::from_utf8(&line) {
                Ok(text) => self.integrator.line(text),
                Err(_) => self.integrator.stats.malformed_lines += 1,
            }
        }
        let total_uj = (self.integrator.energy_j() * 1e6).round() as u64;
        let delta = total_uj.saturating_sub(self.reported_uj);
        self.reported_uj = total_uj;
        delta
    }

    /// Reads what arrived since the last call into `pending`.
    fn pull(&mut self) -> Result<(), SourceError> {
        let integrator = &mut self.integrator;
        let mut buf = [0u8; 64 * 1024];
        match &mut self.input {
            Input::File {
                path,
                file,
                offset,
                identity,
            } => {
                let meta = std::fs::metadata(&*path).ok();
                let now_identity = meta.as_ref().map(|m| {
                    use std::os::unix::fs::MetadataExt;
                    (m.dev(), m.ino())
                });
                let len = meta.map_or(*offset, |m| m.len());
                let replaced = now_identity.is_some_and(|id| id != *identity);
                if replaced || len < *offset {
                    // Truncated, or replaced (rotated by rename): start over
                    // from the top of the file now at the path.
                    *file = std::fs::File::open(&*path)
                        .map_err(|e| SourceError::Retryable(format!("{}: {e}", path.display())))?;
                    *identity = file_identity(file);
                    *offset = 0;
                    self.pending.clear();
                    integrator.restart();
                }
                file.seek(SeekFrom::Start(*offset))
                    .map_err(|e| SourceError::Retryable(e.to_string()))?;
                loop {
                    match file.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            *offset += n as u64;
                            self.pending.extend_from_slice(&buf[..n]);
                        }
                        Err(e) => return Err(SourceError::Retryable(e.to_string())),
                    }
                }
            }
            Input::Command { child, argv } => {
                let Some(out) = child.stdout.as_mut() else {
                    return Ok(());
                };
                loop {
                    match out.read(&mut buf) {
                        Ok(0) => {
                            if let Ok(Some(status)) = child.try_wait() {
                                return Err(SourceError::Retryable(format!(
                                    "{} exited ({status})",
                                    argv.join(" ")
                                )));
                            }
                            break;
                        }
                        Ok(n) => self.pending.extend_from_slice(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                        Err(e) => return Err(SourceError::Retryable(e.to_string())),
                    }
                }
            }
        }
        Ok(())
    }
}

impl Source for Wattmeter {
    fn name(&self) -> &'static str {
        "wattmeter"
    }

    fn kind(&self) -> super::ReaderKind {
        super::ReaderKind::Wall
    }

    fn info(&self) -> SourceInfo {
        SourceInfo {
            domains: vec![(Domain::Wall, None)],
            resolution_uj: None,
            location: match &self.input {
                Input::File { path, .. } => path.display().to_string(),
                Input::Command { argv, .. } => argv.join(" "),
            },
        }
    }

    /// Energy of the complete frames that arrived since the previous read.
    fn read(&mut self) -> Result<Vec<DomainEnergy>, SourceError> {
        let pulled = self.pull();
        let complete = self.pending.iter().rposition(|b| *b == b'\n');
        if let Some(end) = complete {
            let lines: Vec<u8> = self.pending.drain(..=end).collect();
            for line in lines.split(|b| *b == b'\n') {
                match std::str::from_utf8(line) {
                    Ok(text) => self.integrator.line(text),
                    Err(_) => self.integrator.stats.malformed_lines += 1,
                }
            }
        }
        // A line longer than any real frame is garbage, not a frame being
        // written: drop it rather than buffer without bound.
        if self.pending.len() > 4096 {
            self.pending.clear();
            self.integrator.stats.malformed_lines += 1;
        }
        // Deltas of the rounded running total: no drift, however many reads.
        let total_uj = (self.integrator.energy_j() * 1e6).round() as u64;
        let delta = total_uj.saturating_sub(self.reported_uj);
        self.reported_uj = total_uj;
        // Frames that arrived before a failure are reported first; the
        // failure surfaces on a read that has nothing else to give.
        if delta == 0 {
            pulled?;
        }
        Ok(vec![wall(delta)])
    }

    /// A read, then the last line as complete even without its newline
    /// (the log has ended). A failed read still counts that line, and
    /// reports why in [`Source::take_problems`].
    fn read_last(&mut self) -> Result<Vec<DomainEnergy>, SourceError> {
        let read = self.read();
        let rest = self.finish();
        match read {
            Ok(mut e) => {
                match e.first_mut() {
                    Some(d) => d.energy_uj += rest,
                    None => e.push(wall(rest)),
                }
                Ok(e)
            }
            Err(err) if rest == 0 => Err(err),
            Err(err) => {
                self.problems.push(format!("wattmeter: {err}"));
                Ok(vec![wall(rest)])
            }
        }
    }

    fn take_problems(&mut self) -> Vec<String> {
        std::mem::take(&mut self.problems)
    }
}

fn wall(energy_uj: u64) -> DomainEnergy {
    DomainEnergy {
        domain: Domain::Wall,
        package: None,
        energy_uj,
        estimated: false,
        busy_only: false,
    }
}

impl Drop for Wattmeter {
    fn drop(&mut self) {
        if let Input::Command { child, .. } = &mut self.input {
            // Already reaped: its pid may belong to someone else now.
            if !matches!(child.try_wait(), Ok(None)) {
                return;
            }
            // wattmetre-read stops on SIGUSR1; make sure it is gone.
            // SAFETY: signalling our own child, not yet reaped.
            unsafe { libc::kill(child.id() as i32, libc::SIGUSR1) };
            std::thread::sleep(std::time::Duration::from_millis(50));
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    const HEADER: &str =
        "#timestamp,#frame_is_ok,#U1,#U2,#U3,#current1,#activepow1,#current2,#activepow2";

    fn frame(ts: f64, p2: f64) -> String {
        format!("{ts:.9},true,232.3,0.0,0.0,0.1,20.9,0.5,{p2}")
    }

    #[test]
    fn lines() {
        assert_eq!(
            parse_line(HEADER, 2, 6),
            Line::Header {
                power_column: Some(8)
            }
        );
        assert_eq!(
            parse_line(HEADER, 3, 6),
            Line::Header { power_column: None }
        );
        assert_eq!(
            parse_line("1671527189.294241015,false,,,,,,,,", 1, 6),
            Line::Frame {
                timestamp_s: 1_671_527_189.294_241,
                power_w: None
            }
        );
        assert_eq!(
            parse_line(&frame(10.0, 100.5), 2, 8),
            Line::Frame {
                timestamp_s: 10.0,
                power_w: Some(100.5)
            }
        );
        for bad in [
            "",
            "garbage",
            "12.5,maybe,1",
            "12.5,true,1,2",
            "nan,true,1,2,3,4,5",
            "1,true,1,1,1,1,-5",
        ] {
            assert_eq!(parse_line(bad, 1, 6), Line::Malformed, "{bad:?}");
        }
        assert_eq!(default_power_column(1), 6);
        assert_eq!(default_power_column(6), 16);
    }

    #[test]
    fn integrates_outlet_power_skipping_bad_frames_and_counting_them() {
        let mut i = Integrator::new(2);
        i.line(HEADER);
        // 100 W for 1 s at 100 frames/s, with not-ok frames, garbage and a
        // truncated line mixed in, and one frame out of order.
        for k in 0..=100 {
            let ts = 1000.0 + k as f64 * 0.01;
            i.line(&frame(ts, 100.0));
            if k % 10 == 0 {
                i.line(&format!("{:.9},false,,,,,,,", ts + 0.005));
                i.line("\u{0}\u{1}garbage");
                i.line("1000.5,tr");
            }
        }
        i.line(&frame(999.0, 500.0));
        assert!((i.energy_j() - 100.0).abs() < 1e-6, "{}", i.energy_j());
        let s = i.stats();
        assert_eq!((s.frames_ok, s.frames_not_ok), (101, 11));
        assert_eq!((s.malformed_lines, s.out_of_order), (22, 1));
        assert_eq!(s.mean_power_w, 100.0);
    }

    #[test]
    fn a_gap_is_bridged_and_reported() {
        let mut i = Integrator::new(1);
        i.line("10.0,true,230,0,0,1,50");
        i.line("12.0,true,230,0,0,1,150");
        assert!((i.energy_j() - 200.0).abs() < 1e-9);
        assert_eq!(i.stats().gap_s, 2.0);
    }

    #[test]
    fn follows_a_file_being_written_keeping_the_unfinished_line() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wm.log");
        let mut f = std::fs::File::create(&path).expect("create");
        writeln!(f, "{HEADER}").expect("w");
        let mut wm = Wattmeter::open_file(&path, 2).expect("open");
        for k in 0..=50 {
            writeln!(f, "{}", frame(k as f64 * 0.01, 200.0)).expect("w");
        }
        // Half a line: the writer is mid-frame.
        let next = frame(0.51, 200.0);
        write!(f, "{}", &next[..12]).expect("w");
        f.flush().expect("flush");
        let e = wm.read().expect("read")[0].energy_uj;
        assert_eq!(e, 100_000_000, "0.5 s at 200 W");
        writeln!(f, "{}", &next[12..]).expect("w");
        f.flush().expect("flush");
        let e = wm.read().expect("read")[0].energy_uj;
        assert_eq!(e, 2_000_000, "the completed frame adds 10 ms at 200 W");
        assert_eq!(wm.stats().malformed_lines, 0);
        // Truncated and rewritten (log rotation): read from the top again.
        std::fs::write(
            &path,
            format!("{HEADER}\n{}\n{}\n", frame(5.0, 10.0), frame(6.0, 10.0)),
        )
        .expect("rewrite");
        let e = wm.read().expect("read")[0].energy_uj;
        assert_eq!(e, 10_000_000, "1 s at 10 W, not joined to the old log");
    }

    #[test]
    fn a_log_replaced_by_rename_is_followed_and_a_last_line_without_newline_counts() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("wm.log");
        let lines = |a: f64, b: f64| format!("{HEADER}\n{}\n{}\n", frame(a, 10.0), frame(b, 10.0));
        std::fs::write(&path, lines(0.0, 1.0)).expect("w");
        let mut wm = Wattmeter::open_file(&path, 2).expect("open");
        assert_eq!(wm.read().expect("read")[0].energy_uj, 10_000_000);
        // Rotated: a longer new file renamed over the old one.
        let next = dir.path().join("wm.log.new");
        std::fs::write(
            &next,
            lines(10.0, 13.0) + "# padding to be longer than before\n",
        )
        .expect("w");
        std::fs::rename(&next, &path).expect("rename");
        assert_eq!(
            wm.read().expect("read")[0].energy_uj,
            30_000_000,
            "new series, not joined"
        );
        // A final frame without its newline is complete once the log ends.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(&path)
            .expect("open");
        write!(f, "{}", frame(14.0, 10.0)).expect("w");
        assert_eq!(
            wm.read().expect("read")[0].energy_uj,
            0,
            "still being written"
        );
        assert_eq!(wm.read_last().expect("last")[0].energy_uj, 10_000_000);
    }

    #[test]
    fn frames_before_the_command_exits_are_reported() {
        let script = format!(
            "echo '{HEADER}'; echo '{}'; echo '{}'",
            frame(1.0, 20.0),
            frame(3.0, 20.0)
        );
        let mut wm = Wattmeter::spawn(&["sh".into(), "-c".into(), script], 2).expect("spawn");
        std::thread::sleep(std::time::Duration::from_millis(300));
        assert_eq!(wm.read().expect("frames first")[0].energy_uj, 40_000_000);
        assert!(wm.read().is_err(), "then the exit");
    }

    #[test]
    fn reads_a_command_it_starts_and_stops_it() {
        let script = format!(
            "echo '{HEADER}'; echo '{}'; echo '{}'; exec sleep 30",
            frame(1.0, 50.0),
            frame(2.0, 50.0)
        );
        let argv = vec!["sh".to_string(), "-c".to_string(), script];
        let mut wm = Wattmeter::spawn(&argv, 2).expect("spawn");
        let mut total = 0;
        for _ in 0..100 {
            total += wm.read().expect("read")[0].energy_uj;
            if total > 0 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        assert_eq!(total, 50_000_000);
        let pid = match &wm.input {
            Input::Command { child, .. } => child.id(),
            Input::File { .. } => unreachable!(),
        };
        drop(wm);
        assert!(
            !std::path::Path::new(&format!("/proc/{pid}")).exists(),
            "stopped and reaped"
        );
    }
}
