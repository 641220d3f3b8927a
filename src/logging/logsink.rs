//! sealnode's own stdout and stderr, written without ever blocking the supervisor: a reader
//! that stops reading (a full pipe, a stalled journal stream, a paused terminal) costs lines,
//! counted, never the event loop. No thread: the supervisor forks, and stays single-threaded.
//!
//! How, per stream, without touching the file description others share (a shell, systemd):
//! a pipe, FIFO or terminal is reopened through /proc/self/fd (a new description of the same
//! pipe or tty) and that one made O_NONBLOCK; where the reopen is not allowed (rootless, a
//! root-owned pipe or tty), a pipe is written with pwritev2(RWF_NOWAIT) and anything else only
//! as far as poll(2) says it takes now, 64 bytes at a time; a socket (systemd's journal
//! stream) with send(MSG_DONTWAIT); a regular file or /dev/null as is (it does not block).
//! Every line not written, whatever the reason (a full pipe, ENOSPC, EPIPE), is counted. A line that does not fit now waits in a buffer of [`PENDING_MAX`] bytes, tried
//! again at the next write and each turn of the event loop ([`pump`]); beyond that, lines are
//! dropped and counted ([`dropped`]).

use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::sync::Mutex;

use nix::errno::Errno;

/// Bytes a stream may hold back while its reader is not reading.
pub const PENDING_MAX: usize = 256 * 1024;

#[derive(Debug)]
enum How {
    /// A pipe: pwritev2(RWF_NOWAIT) on the inherited fd.
    NoWait(RawFd),
    /// Our own non-blocking description of the same pipe or tty.
    Reopened(OwnedFd),
    /// Neither: only what poll(2) says the fd takes now, in small writes.
    Polled(RawFd),
    /// A socket: send(MSG_DONTWAIT) on the inherited fd.
    Socket(RawFd),
    /// A file: plain write(2) on the inherited fd.
    Plain(RawFd),
}

#[derive(Debug)]
struct Stream {
    how: How,
    pending: Vec<u8>,
    dropped: u64,
}

static STREAMS: Mutex<[Option<Stream>; 2]> = Mutex::new([None, None]);

/// Which of sealnode's streams.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Out {
    Stdout = 0,
    Stderr = 1,
}

fn prepare(fd: RawFd) -> How {
    // SAFETY: stdout/stderr, open for the process's life; borrowed for the call.
    let Ok(st) = nix::sys::stat::fstat(unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }) else {
        return How::Plain(fd);
    };
    match st.st_mode & libc::S_IFMT {
        libc::S_IFSOCK => How::Socket(fd),
        kind @ (libc::S_IFIFO | libc::S_IFCHR) => {
            let path = std::ffi::CString::new(format!("/proc/self/fd/{fd}")).unwrap_or_default();
            // SAFETY: a valid C string; the flags open a new description for writing only.
            let new = unsafe {
                libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_NONBLOCK | libc::O_CLOEXEC | libc::O_NOCTTY)
            };
            if new >= 0 {
                // SAFETY: `new` is a fresh fd we own.
                return How::Reopened(unsafe { OwnedFd::from_raw_fd(new) });
            }
            // An anonymous pipe takes RWF_NOWAIT; a FIFO opened by path refuses it (EOPNOTSUPP,
            // at the first write: Stream::flush then polls instead), and so does a tty.
            if kind == libc::S_IFIFO {
                How::NoWait(fd)
            } else {
                How::Polled(fd)
            }
        }
        _ => How::Plain(fd),
    }
}

/// Set up both streams (once, at logging's init, before anything is forked).
pub fn init() {
    if let Ok(mut s) = STREAMS.lock() {
        for (i, fd) in [1, 2].into_iter().enumerate() {
            s[i] = Some(Stream { how: prepare(fd), pending: Vec::new(), dropped: 0 });
        }
    }
}

fn write_some(how: &How, buf: &[u8]) -> Result<usize, Errno> {
    match how {
        How::NoWait(fd) => {
            let iov = libc::iovec { iov_base: buf.as_ptr() as *mut libc::c_void, iov_len: buf.len() };
            // SAFETY: one iovec over `buf`, valid for its length; offset -1: the current position
            // (pipes have none); RWF_NOWAIT: EAGAIN instead of waiting for the reader.
            let r = unsafe { libc::pwritev2(*fd, &iov, 1, -1, libc::RWF_NOWAIT) };
            Errno::result(r).map(|n| n as usize)
        }
        How::Reopened(fd) => nix::unistd::write(fd, buf),
        How::Socket(fd) => {
            // SAFETY: `buf` is valid for its length; MSG_NOSIGNAL: a closed reader is EPIPE.
            let r = unsafe { libc::send(*fd, buf.as_ptr().cast(), buf.len(), libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
            Errno::result(r).map(|n| n as usize)
        }
        // SAFETY: a borrowed fd that stays open for the process's life (stdout/stderr).
        How::Plain(fd) => nix::unistd::write(unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) }, buf),
        How::Polled(fd) => {
            let mut done = 0;
            while done < buf.len() {
                let mut p = libc::pollfd { fd: *fd, events: libc::POLLOUT, revents: 0 };
                // SAFETY: one valid pollfd, no wait.
                if unsafe { libc::poll(&mut p, 1, 0) } <= 0 || p.revents & libc::POLLOUT == 0 {
                    break;
                }
                let end = (done + 64).min(buf.len());
                // SAFETY: as for Plain.
                match nix::unistd::write(unsafe { std::os::fd::BorrowedFd::borrow_raw(*fd) }, &buf[done..end]) {
                    // Nothing taken (a filter above sealnode faking write(2)): never spin on it.
                    Ok(0) => break,
                    Ok(n) => done += n,
                    Err(Errno::EINTR) => {}
                    Err(e) if done == 0 => return Err(e),
                    Err(_) => break,
                }
            }
            if done == 0 && !buf.is_empty() {
                Err(Errno::EAGAIN)
            } else {
                Ok(done)
            }
        }
    }
}

impl Stream {
    /// Write what is pending, as far as the reader takes it now.
    fn flush(&mut self) {
        while !self.pending.is_empty() {
            match write_some(&self.how, &self.pending) {
                Ok(0) => break,
                Ok(n) => {
                    self.pending.drain(..n);
                }
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => break,
                Err(Errno::EOPNOTSUPP) if matches!(self.how, How::NoWait(_)) => {
                    if let How::NoWait(fd) = self.how {
                        self.how = How::Polled(fd);
                    }
                }
                // A reader that is gone, a full disk, a device that refuses: nothing will take
                // what is pending; its lines are counted as dropped.
                Err(_) => {
                    self.dropped += self.pending.iter().filter(|b| **b == b'\n').count().max(1) as u64;
                    self.pending.clear();
                    break;
                }
            }
        }
    }

    fn line(&mut self, line: &[u8]) {
        self.flush();
        if self.pending.len() + line.len() > PENDING_MAX {
            self.dropped += 1;
            return;
        }
        self.pending.extend_from_slice(line);
        self.flush();
    }
}

/// Write one whole line (with its newline) to `out`, never blocking; before [`init`], a plain
/// write of the inherited fd.
pub fn line(out: Out, line: &[u8]) {
    let Ok(mut s) = STREAMS.lock() else { return };
    match s[out as usize].as_mut() {
        Some(st) => st.line(line),
        None => {
            let _ = write_some(&How::Plain(out as RawFd + 1), line);
        }
    }
}

/// Try the pending bytes of both streams again (each turn of the event loop).
pub fn pump() {
    if let Ok(mut s) = STREAMS.lock() {
        for st in s.iter_mut().flatten() {
            st.flush();
        }
    }
}

/// Lines dropped so far because a reader was not reading: (stdout, stderr).
pub fn dropped() -> (u64, u64) {
    match STREAMS.lock() {
        Ok(s) => (s[0].as_ref().map_or(0, |x| x.dropped), s[1].as_ref().map_or(0, |x| x.dropped)),
        Err(_) => (0, 0),
    }
}

/// A `std::io::Write` over one stream for tracing's fmt layer: each event arrives as one write.
#[derive(Debug, Clone, Copy)]
pub struct Writer(pub Out);

impl std::io::Write for Writer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        line(self.0, buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for Writer {
    type Writer = Writer;
    fn make_writer(&'a self) -> Writer {
        *self
    }
}
