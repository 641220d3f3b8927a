//! Each role's stdout and stderr, captured by the supervisor through a pipe and re-emitted
//! line by line (log::role_line), tagged with the role: a line is cut at [`MAX_LINE`] bytes;
//! each role may emit [`RATE`] lines and [`RATE_BYTES`] bytes a second (bursts to [`BURST`]
//! and [`BURST_BYTES`]), and have [`READ_RATE`] bytes a second read (bursts to
//! [`READ_BURST`]; every byte read counts, of a line shown, dropped or cut alike). Lines over
//! the rates are dropped and counted, and sealnode says how many once a second. The
//! supervisor reads at most [`READ_BUDGET`] bytes per wake-up, and once a role's budget is
//! spent its pipes are not read until [`RESUME`] of it is back ([`Read::Dry`]): a flooding
//! role waits in its own `write`, and its flood costs the supervisor little (found by review:
//! `yes` as a role cost the supervisor 4.5 times the role's own CPU; then lines refused for
//! their bytes and one endless line were read at the pipe's speed, spending nothing). Its
//! memory stays at one line buffer per stream.

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
/// Bytes a second of lines a role may emit, sustained (found by review: 200 lines of 16 KiB a
/// second were 3.2 MB/s, ~280 GB a day, into the journal or a container's log).
pub const RATE_BYTES: f64 = 64.0 * 1024.0;
/// Bytes of lines a role may emit at once after a quiet spell.
pub const BURST_BYTES: f64 = 1024.0 * 1024.0;
/// Bytes a second read from a role's pipes, sustained: what a flood may cost the supervisor
/// (reading and splitting 4 MiB a second is a small part of a CPU), and enough for a role
/// that writes a long line once (a 10 MB one goes in one burst).
pub const READ_RATE: f64 = 4.0 * 1024.0 * 1024.0;
/// Bytes read from a role's pipes at once after a quiet spell.
pub const READ_BURST: f64 = 16.0 * 1024.0 * 1024.0;
/// The part of a second's budget that must be back before a role's dry pipes are read again.
pub const RESUME: f64 = 0.1;

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

/// A role's output budget, fresh.
pub fn budget(now: Instant) -> Budget {
    Budget {
        lines: Bucket::new(now, RATE, BURST),
        bytes: Bucket::new(now, RATE_BYTES, BURST_BYTES),
        read: Bucket::new(now, READ_RATE, READ_BURST),
    }
}

pub use crate::logging::ratelimit::Bucket;

/// What a role may still emit (lines, and their bytes) and have read (bytes). A line refused
/// counts as one dropped.
#[derive(Debug)]
pub struct Budget {
    pub lines: Bucket,
    pub bytes: Bucket,
    pub read: Bucket,
}

impl Budget {
    /// `n` bytes were read from the role's pipe: spent, whatever becomes of them.
    pub fn charge(&mut self, n: usize) {
        self.read.spend(n as f64);
    }

    /// May a line of `len` bytes go at `now`? Taken if so; counted as dropped if not.
    pub fn take(&mut self, now: Instant, len: usize) -> bool {
        let len = len as f64 + 1.0;
        if self.lines.ready_n(now, 1.0) && self.bytes.ready_n(now, len) {
            self.bytes.spend(len);
            return self.lines.take(now);
        }
        self.lines.dropped += 1;
        self.lines.dropped_total += 1;
        false
    }

    /// Spent at `now`: no line could go, or no byte be read (its pipes wait until
    /// [`Budget::resume_at`]).
    pub fn dry(&mut self, now: Instant) -> bool {
        !(self.lines.ready_n(now, 1.0) && self.bytes.ready_n(now, 1.0) && self.read.ready_n(now, 1.0))
    }

    /// When [`RESUME`] of a second's budget is back, of each.
    pub fn resume_at(&self) -> Instant {
        self.lines.when(RATE * RESUME).max(self.bytes.when(RATE_BYTES * RESUME)).max(self.read.when(READ_RATE * RESUME))
    }
}

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
    /// More may come (the read budget was used, or the pipe is empty for now).
    More,
    /// The role's output budget is spent: read no more of its pipes until it is back.
    Dry,
    /// The role closed its end: the capture is done.
    Eof,
}

impl Capture {
    pub fn new(role: Role, pid: i32, generation: u64, err: bool, fd: OwnedFd) -> Capture {
        Capture { role, pid, generation, err, fd, buf: Vec::new(), skipping: false, cut: 0 }
    }

    /// Read what the pipe holds (up to READ_BUDGET) and emit each complete line through
    /// `emit`, subject to `budget`; stop once it is spent (nothing is read while it is).
    pub fn read(&mut self, budget: &mut Budget, emit: &mut dyn FnMut(&Capture, &[u8])) -> Read {
        // One clock read per wake-up, not per line (found by review: a flood of short lines
        // cost the supervisor a clock read each).
        let now = Instant::now();
        let mut chunk = [0u8; 8192];
        let mut left = READ_BUDGET;
        while left > 0 {
            if budget.dry(now) {
                return Read::Dry;
            }
            let n = match nix::unistd::read(self.fd.as_fd(), &mut chunk[..left.min(8192)]) {
                Ok(0) => {
                    self.finish(budget, now, emit);
                    return Read::Eof;
                }
                Ok(n) => n,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return Read::More,
                Err(_) => {
                    self.finish(budget, now, emit);
                    return Read::Eof;
                }
            };
            left -= n;
            budget.charge(n);
            self.feed(&chunk[..n], budget, now, emit);
        }
        Read::More
    }

    /// Split `data` into lines: complete ones are emitted, a long one is cut once.
    pub fn feed(&mut self, mut data: &[u8], budget: &mut Budget, now: Instant, emit: &mut dyn FnMut(&Capture, &[u8])) {
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
                    self.out(&line, budget, now, emit);
                    self.skipping = true;
                }
            }
            if nl.is_some() {
                if self.skipping {
                    self.skipping = false;
                } else {
                    let line = std::mem::take(&mut self.buf);
                    self.out(&line, budget, now, emit);
                }
            }
            data = rest;
        }
    }

    /// At EOF: a last line without its newline still counts.
    fn finish(&mut self, budget: &mut Budget, now: Instant, emit: &mut dyn FnMut(&Capture, &[u8])) {
        if !self.buf.is_empty() && !self.skipping {
            let line = std::mem::take(&mut self.buf);
            self.out(&line, budget, now, emit);
        }
    }

    fn out(&self, line: &[u8], budget: &mut Budget, now: Instant, emit: &mut dyn FnMut(&Capture, &[u8])) {
        if budget.take(now, line.len()) {
            emit(self, line);
        }
    }
}

#[cfg(test)]
mod tests;
