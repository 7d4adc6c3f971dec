//! One client connection: lines in, JSON lines out, both bounded.

use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use super::access::{Peer, Standing};
use crate::profile::served::ClientId;

/// The longest request line.
pub(crate) const MAX_LINE: usize = 1024;
/// Bytes read from one connection per wake-up (a flood cannot starve the
/// others or the intervals).
const READ_PER_WAKE: usize = 64 * 1024;
/// Answers waiting before a client's requests are read no further.
const READ_WHILE_PENDING: usize = 64 * 1024;
/// Answers waiting to be read by a client; past this it is cut off (it
/// does not read what it asked for: trees and intervals it follows).
pub(crate) const MAX_PENDING_OUT: usize = 16 << 20;

/// A client's connection.
pub(crate) struct Conn {
    fd: OwnedFd,
    id: ClientId,
    /// Who it is (from the kernel).
    pub(crate) peer: Peer,
    /// What it may do.
    pub(crate) standing: Standing,
    /// A line not yet ended.
    partial: Vec<u8>,
    /// Bytes of the line being skipped (too long) until its end.
    skipping: bool,
    out: Vec<u8>,
    closed: bool,
    /// The client closed its side: nothing more to read; it is kept
    /// while answers it waits for are pending (`printf 'end x\n' | nc
    /// -N`).
    eof: bool,
}

impl Conn {
    pub(crate) fn new(fd: OwnedFd, id: ClientId, peer: Peer, standing: Standing) -> Self {
        Self {
            fd,
            id,
            peer,
            standing,
            partial: Vec::new(),
            skipping: false,
            out: Vec::new(),
            closed: false,
            eof: false,
        }
    }

    /// Whether the client closed its side.
    pub(crate) fn eof(&self) -> bool {
        self.eof
    }

    /// Whether answers are waiting to be written.
    pub(crate) fn pending(&self) -> bool {
        !self.out.is_empty()
    }

    /// Whether to read from it: not after its end, nor while it has more
    /// than [`READ_WHILE_PENDING`] of answers unread (a client that asks
    /// without reading is read no further until it reads).
    pub(crate) fn readable(&self) -> bool {
        !self.eof && !self.closed && self.out.len() <= READ_WHILE_PENDING
    }

    /// Cuts it off.
    pub(crate) fn close(&mut self) {
        self.closed = true;
    }

    pub(crate) fn id(&self) -> ClientId {
        self.id
    }

    pub(crate) fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Whether it is to be forgotten (closed by the client, or cut off).
    pub(crate) fn closed(&self) -> bool {
        self.closed
    }

    /// The complete lines waiting (at most [`READ_PER_WAKE`] bytes read):
    /// a line over [`MAX_LINE`] is answered with an error and skipped to
    /// its end; bytes that are not UTF-8 are replaced.
    pub(crate) fn read_lines(&mut self) -> Vec<String> {
        let mut lines = Vec::new();
        let mut buf = [0u8; 8192];
        let mut read = 0;
        while read < READ_PER_WAKE {
            // SAFETY: a live socket and a buffer of the size given.
            let n = unsafe {
                libc::recv(
                    self.fd.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n == 0 {
                self.eof = true;
                break;
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::Interrupted
                {
                    self.closed = true;
                }
                break;
            }
            read += n as usize;
            for &b in &buf[..n as usize] {
                if b == b'\n' {
                    if !std::mem::take(&mut self.skipping) {
                        lines.push(String::from_utf8_lossy(&self.partial).trim().to_string());
                    }
                    self.partial.clear();
                } else if !self.skipping {
                    self.partial.push(b);
                    if self.partial.len() > MAX_LINE {
                        self.partial.clear();
                        self.skipping = true;
                        self.answer(
                            None,
                            serde_json::json!({
                                "error": format!("a request longer than {MAX_LINE} bytes: skipped")
                            }),
                        );
                    }
                }
            }
        }
        lines.retain(|l| !l.is_empty());
        lines
    }

    /// Queues an answer (one JSON line, with the request's id).
    pub(crate) fn answer(&mut self, id: Option<u64>, mut v: serde_json::Value) {
        if let (Some(id), Some(o)) = (id, v.as_object_mut()) {
            o.insert("id".into(), id.into());
        }
        if self.out.len() > MAX_PENDING_OUT {
            // It asks and does not read: cut off (its state goes with it).
            self.closed = true;
            return;
        }
        if serde_json::to_writer(&mut self.out, &v).is_ok() {
            self.out.push(b'\n');
        }
    }

    /// Queues `value` as a line, serialised straight into the output.
    pub(crate) fn line(&mut self, value: &impl serde::Serialize) {
        if self.out.len() > MAX_PENDING_OUT {
            self.closed = true;
            return;
        }
        let start = self.out.len();
        if serde_json::to_writer(&mut self.out, value).is_ok() {
            self.out.push(b'\n');
        } else {
            self.out.truncate(start);
        }
    }

    /// Queues `{"KEY": value}` (a line the daemon sends unasked, each
    /// interval), serialised straight into the output: no JSON tree built.
    pub(crate) fn push(&mut self, key: &str, value: &impl serde::Serialize) {
        if self.out.len() > MAX_PENDING_OUT {
            self.closed = true;
            return;
        }
        let start = self.out.len();
        self.out.extend_from_slice(b"{\"");
        self.out.extend_from_slice(key.as_bytes());
        self.out.extend_from_slice(b"\":");
        if serde_json::to_writer(&mut self.out, value).is_ok() {
            self.out.extend_from_slice(b"}\n");
        } else {
            self.out.truncate(start);
        }
    }

    /// Writes what is pending, without waiting.
    pub(crate) fn flush(&mut self) {
        while !self.out.is_empty() {
            // SAFETY: a live socket and a buffer of the size given.
            let n = unsafe {
                libc::send(
                    self.fd.as_raw_fd(),
                    self.out.as_ptr().cast(),
                    self.out.len(),
                    libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL,
                )
            };
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::WouldBlock
                    && e.kind() != std::io::ErrorKind::Interrupted
                {
                    self.closed = true;
                    self.out.clear();
                }
                return;
            }
            self.out.drain(..n as usize);
        }
        if self.out.capacity() > 1 << 16 {
            self.out.shrink_to(1 << 16);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    fn pair() -> (Conn, std::os::unix::net::UnixStream) {
        let (a, b) = std::os::unix::net::UnixStream::pair().expect("pair");
        a.set_nonblocking(true).expect("nonblocking");
        let peer = Peer {
            pid: 1,
            uid: 1000,
            gid: 1000,
        };
        (Conn::new(a.into(), 1, peer, Standing::User), b)
    }

    #[test]
    fn lines_are_split_long_ones_skipped_and_a_close_seen() {
        let (mut c, mut client) = pair();
        client.write_all(b"status\nbeg").expect("write");
        assert_eq!(c.read_lines(), vec!["status".to_string()]);
        client.write_all(b"in x\n\n").expect("write");
        assert_eq!(c.read_lines(), vec!["begin x".to_string()]);
        let long = vec![b'a'; MAX_LINE * 3];
        client.write_all(&long).expect("write");
        client.write_all(b"\nstatus\n\xff\xfe\n").expect("write");
        let lines = c.read_lines();
        assert_eq!(
            lines,
            vec!["status".to_string(), "\u{fffd}\u{fffd}".to_string()]
        );
        c.flush();
        let mut got = [0u8; 256];
        let n = client.read(&mut got).expect("the error");
        assert!(
            String::from_utf8_lossy(&got[..n]).contains("longer than 1024"),
            "{}",
            String::from_utf8_lossy(&got[..n])
        );
        assert!(!c.closed());
        drop(client);
        assert!(c.read_lines().is_empty());
        assert!(c.eof() && !c.readable(), "its end seen, nothing more read");
    }

    #[test]
    fn a_client_that_never_reads_is_cut_off() {
        let (mut c, _client) = pair();
        let big = serde_json::json!({ "x": "y".repeat(1 << 20) });
        for _ in 0..40 {
            c.answer(Some(1), big.clone());
            c.flush();
        }
        assert!(c.closed(), "cut off past {MAX_PENDING_OUT} bytes");
    }
}
