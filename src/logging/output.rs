//! Each role's stdout and stderr, captured by the supervisor through a pipe and re-emitted
//! line by line (log::role_line), tagged with the role: a line is cut at [`MAX_LINE`] bytes, and
//! each role may emit [`RATE`] lines a second (bursts to [`BURST`]); the rest are dropped and
//! counted, and sealnode says how many once a second. The supervisor reads at most
//! [`READ_BUDGET`] bytes per wake-up, so a role flooding its output can neither stall the event
//! loop nor grow the supervisor's memory past one line buffer per stream.

use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use nix::errno::Errno;

use crate::config::Role;

/// The longest line re-emitted; the rest of a longer one is dropped (journald's own LineMax
/// is 48 KiB).
pub const MAX_LINE: usize = 16 * 1024;
/// Bytes read from one pipe per wake-up of the event loop.
pub const READ_BUDGET: usize = 64 * 1024;
/// Lines a second a role may emit, sustained: below journald's own default per-unit limit
/// (RateLimitBurst=10000 per 30 s), so a role's flood does not make journald drop sealnode's
/// own lines of the same unit.
pub const RATE: f64 = 200.0;
/// Lines a role may emit at once after a quiet spell.
pub const BURST: f64 = 2000.0;

/// The longest line re-emitted once escaped: a line of [`MAX_LINE`] bytes and the mark of its cut.
pub const MAX_SHOWN: usize = MAX_LINE + 64;

/// A captured line as it is re-emitted: escaped ([`crate::logging::log::clean`]) and, once
/// escaped, at most [`MAX_SHOWN`] bytes (as text, and as a JSON string), cut between escapes,
/// never inside one (found by review: an escape is up to 10 bytes for one of the role's, and
/// 16 KiB of control bytes made a 96 KiB line, past what log drivers keep as one).
pub fn escaped(line: &[u8]) -> String {
    // What JSON adds (`SEALNODE_LOG_FORMAT=json`): a backslash before each `\` and `"`; the
    // bound holds for that form too (found by review: 20,000 backslashes made 33 KB of JSON).
    let json = |s: &str| s.bytes().filter(|b| matches!(b, b'\\' | b'"')).count();
    let all = crate::logging::log::clean(line);
    if all.len() + json(&all) <= MAX_SHOWN {
        return all;
    }
    let mut s = String::with_capacity(MAX_LINE + 64);
    let mut cost = 0;
    let mut utf8 = [0u8; 4];
    for c in String::from_utf8_lossy(line).chars() {
        let one = crate::logging::log::clean(c.encode_utf8(&mut utf8).as_bytes());
        cost += one.len() + json(&one);
        if cost > MAX_LINE {
            s.push_str(&format!(" [line cut at {MAX_LINE} bytes once escaped]"));
            // (MAX_LINE and this mark are within MAX_SHOWN.)
            break;
        }
        s.push_str(&one);
    }
    s
}

/// A role's output bucket.
pub fn bucket(now: Instant) -> Bucket {
    Bucket::new(now, RATE, BURST)
}

pub use crate::logging::ratelimit::Bucket;

/// One captured stream of one run of a role.
#[derive(Debug)]
pub struct Capture {
    pub role: Role,
    pub pid: i32,
    pub generation: u64,
    pub err: bool,
    pub fd: OwnedFd,
    /// The current line so far (at most MAX_LINE bytes).
    buf: Vec<u8>,
    /// The current line passed MAX_LINE: drop the rest of it.
    skipping: bool,
    /// Lines cut at MAX_LINE.
    pub cut: u64,
}

/// What a read found.
#[derive(Debug, PartialEq, Eq)]
pub enum Read {
    /// More may come (the budget was used, or the pipe is empty for now).
    More,
    /// The role closed its end: the capture is done.
    Eof,
}

impl Capture {
    pub fn new(role: Role, pid: i32, generation: u64, err: bool, fd: OwnedFd) -> Capture {
        Capture { role, pid, generation, err, fd, buf: Vec::new(), skipping: false, cut: 0 }
    }

    /// Read what the pipe holds (up to READ_BUDGET) and emit each complete line through
    /// `emit`, subject to `bucket`.
    pub fn read(&mut self, bucket: &mut Bucket, emit: &mut dyn FnMut(&Capture, &[u8])) -> Read {
        let mut chunk = [0u8; 8192];
        let mut budget = READ_BUDGET;
        while budget > 0 {
            let n = match nix::unistd::read(self.fd.as_fd(), &mut chunk[..budget.min(8192)]) {
                Ok(0) => {
                    self.finish(bucket, emit);
                    return Read::Eof;
                }
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Read::More,
                Err(_) => {
                    self.finish(bucket, emit);
                    return Read::Eof;
                }
            };
            budget -= n;
            self.feed(&chunk[..n], bucket, emit);
        }
        Read::More
    }

    /// Split `data` into lines: complete ones are emitted, a long one is cut once.
    pub fn feed(&mut self, mut data: &[u8], bucket: &mut Bucket, emit: &mut dyn FnMut(&Capture, &[u8])) {
        while !data.is_empty() {
            let nl = data.iter().position(|b| *b == b'\n');
            let (part, rest) = match nl {
                Some(i) => (&data[..i], &data[i + 1..]),
                None => (data, &[][..]),
            };
            if !self.skipping {
                let room = MAX_LINE - self.buf.len();
                self.buf.extend_from_slice(&part[..part.len().min(room)]);
                if part.len() > room {
                    // The line is too long: emit what fits now, marked, and drop the rest.
                    self.cut += 1;
                    let mut line = std::mem::take(&mut self.buf);
                    line.extend_from_slice(format!(" [line cut at {MAX_LINE} bytes]").as_bytes());
                    self.out(&line, bucket, emit);
                    self.skipping = true;
                }
            }
            if nl.is_some() {
                if self.skipping {
                    self.skipping = false;
                } else {
                    let line = std::mem::take(&mut self.buf);
                    self.out(&line, bucket, emit);
                }
            }
            data = rest;
        }
    }

    /// At EOF: a last line without its newline still counts.
    fn finish(&mut self, bucket: &mut Bucket, emit: &mut dyn FnMut(&Capture, &[u8])) {
        if !self.buf.is_empty() && !self.skipping {
            let line = std::mem::take(&mut self.buf);
            self.out(&line, bucket, emit);
        }
    }

    fn out(&self, line: &[u8], bucket: &mut Bucket, emit: &mut dyn FnMut(&Capture, &[u8])) {
        if bucket.take(Instant::now()) {
            emit(self, line);
        }
    }
}

#[cfg(test)]
mod tests;
