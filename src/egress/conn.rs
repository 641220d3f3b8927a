//! One forwarded connection: two sockets, a pipe per direction, bytes moved with splice(2);
//! and the host-side connect.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{splice, OFlag, SpliceFFlags};
use nix::sys::epoll::EpollFlags;
use nix::sys::socket::{
    connect, recv, send, shutdown, socket, sockopt, AddressFamily, MsgFlags, Shutdown, SockFlag, SockType,
    SockaddrStorage,
};

/// Bytes buffered in each direction's pipe.
pub(super) const PIPE_SIZE: usize = 256 * 1024;
/// The most a recorded direction copies out of the socket per splice (a peek, then the splice
/// of exactly those bytes).
const PEEK: usize = 16 * 1024;

/// The engine route: every byte the node sent on a connection the engine has not answered a
/// byte on, kept so that if the engine drops it (it crashed, or was killed) the request is
/// sent again, once, to the engine once it is ready again (`cell.engine_replay_kb`). The
/// engine's first byte on the connection ends the record for good (a `100 Continue` included):
/// what a node reads on a connection is always one engine's answer, never two spliced, and a
/// request is never sent twice to an engine that began to answer it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Unanswered {
    /// At most this many bytes are kept; a connection that sends more is not sent again.
    pub(super) limit: usize,
    pub(super) bytes: Vec<u8>,
    /// Nothing more is kept and nothing is sent again: the engine sent a byte, more than
    /// `limit` came, or the bytes were sent again already.
    pub(super) ended: bool,
    /// The node had finished sending (its half-close is passed on after the bytes).
    pub(super) node_done: bool,
    /// When a connection waiting to be sent again gives up (set at its first drop, kept
    /// across failed connects to the engine).
    pub(super) until: Option<Instant>,
}

impl Unanswered {
    pub(super) fn new(limit: usize) -> Unanswered {
        Unanswered { limit, ..Unanswered::default() }
    }

    /// Whether bytes the node sends are still kept.
    pub(super) fn recording(&self) -> bool {
        !self.ended
    }

    /// Bytes the node sent towards the engine.
    pub(super) fn take(&mut self, b: &[u8]) {
        if self.ended {
            return;
        }
        if self.bytes.len() + b.len() > self.limit {
            self.end();
        } else {
            self.bytes.extend_from_slice(b);
        }
    }

    /// Recording is over for good (its memory given back).
    pub(super) fn end(&mut self) {
        self.bytes = Vec::new();
        self.ended = true;
    }

    /// The engine dropped the connection: whether what the node sent may be sent again.
    pub(super) fn may_replay(&self) -> bool {
        !self.ended && !self.bytes.is_empty()
    }
}

/// SIOCATMARK from linux/sockios.h (asm-generic: x86_64 and aarch64 alike; the libc crate does
/// not name it).
const SIOCATMARK: libc::Ioctl = 0x8905;

/// Socket `fd` stands at TCP's urgent mark (SIOCATMARK; false for what is not a TCP socket).
fn at_urgent_mark(fd: &OwnedFd) -> bool {
    let mut at: libc::c_int = 0;
    // SAFETY: SIOCATMARK writes one int through the pointer, which points at `at`, alive for
    // the call; the fd is borrowed, open for the call.
    let r = unsafe { libc::ioctl(fd.as_raw_fd(), SIOCATMARK, &mut at as *mut libc::c_int) };
    r == 0 && at != 0
}

/// The peer of socket `fd` is gone: reset, or ended its side when it had not before
/// (`ended_before`: it had half-closed after sending, so an end says nothing).
pub(super) fn peer_gone(fd: &OwnedFd, ended_before: bool) -> bool {
    let mut b = [0u8; 1];
    match recv(fd.as_raw_fd(), &mut b, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
        Ok(0) => !ended_before,
        Ok(_) | Err(Errno::EAGAIN) | Err(Errno::EINTR) => false,
        Err(_) => true,
    }
}

/// Close socket `fd` with a reset rather than an end (SO_LINGER, zero time): its peer sees an
/// error, not a whole answer.
pub(super) fn reset_on_close(fd: &OwnedFd) {
    let _ = nix::sys::socket::setsockopt(fd, sockopt::Linger, &libc::linger { l_onoff: 1, l_linger: 0 });
}

/// Bytes wait to be read from socket `fd` (an answer the engine sent before it went).
pub(super) fn has_bytes(fd: &OwnedFd) -> bool {
    let mut b = [0u8; 1];
    matches!(recv(fd.as_raw_fd(), &mut b, MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT), Ok(n) if n > 0)
}

/// Where a direction failed: reading its source, or writing its destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Fault {
    Src(Errno),
    Dst(Errno),
}

/// One direction of a forwarded connection: socket -> pipe -> socket.
#[derive(Debug)]
pub(super) struct Dir {
    pub(super) pipe_r: OwnedFd,
    pub(super) pipe_w: OwnedFd,
    pub(super) buffered: usize,
    pub(super) eof: bool,
    pub(super) shut: bool,
    /// Bytes written to the destination before any from the pipe (a request sent again).
    pub(super) first: Vec<u8>,
    /// Bytes taken from the source so far.
    pub(super) taken: u64,
    /// What the pipe holds (PIPE_SIZE, or the kernel's default if it refused that).
    pub(super) cap: usize,
    /// The source is readable but nothing more goes into the pipe until it drains: it is full
    /// by its slots (a pipe holds 16 buffers by default, however small each spliced segment),
    /// or the source stands at an urgent mark with bytes still in the pipe. Not read meanwhile
    /// (else the level-triggered loop spins); cleared when bytes leave the pipe.
    pub(super) stalled: bool,
}

impl Dir {
    pub(super) fn new() -> Result<Dir, Errno> {
        let (pipe_r, pipe_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        // A larger pipe means fewer wake-ups per megabyte; the default still works if refused
        // (an unprivileged user past fs.pipe-user-pages-soft), and is what is counted then.
        let _ = nix::fcntl::fcntl(&pipe_w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as i32));
        let cap = nix::fcntl::fcntl(&pipe_w, nix::fcntl::FcntlArg::F_GETPIPE_SZ)
            .ok()
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0)
            .unwrap_or(4096);
        Ok(Dir {
            pipe_r,
            pipe_w,
            buffered: 0,
            eof: false,
            shut: false,
            first: Vec::new(),
            taken: 0,
            cap,
            stalled: false,
        })
    }

    /// Room left in the pipe.
    pub(super) fn room(&self) -> usize {
        self.cap.saturating_sub(self.buffered)
    }

    /// splice(2) stops at TCP's urgent mark (a byte sent with MSG_OOB): it moves nothing there
    /// (or answers 0, as at the end, if a FIN follows) while the socket stays readable, so the
    /// level-triggered loop would spin, or the bytes after the mark be lost (found by review).
    /// With the pipe empty, a plain read takes what follows the mark (the urgent byte itself is
    /// not part of the stream and is dropped) into it, at most a page, which an empty pipe
    /// always takes. Returns the bytes moved, copied into `buf` (`Some` of none: the end;
    /// `None`: the urgent byte was all there was for now, and it is gone: not the end, found
    /// by review).
    fn past_urgent_mark<'b>(&mut self, src: &OwnedFd, buf: &'b mut [u8; 4096]) -> Result<Option<&'b [u8]>, Errno> {
        let n = loop {
            match recv(src.as_raw_fd(), buf, MsgFlags::MSG_DONTWAIT) {
                Ok(n) => break n,
                Err(Errno::EINTR) => {}
                Err(Errno::EAGAIN) => return Ok(None),
                Err(e) => return Err(e),
            }
        };
        let mut put = 0;
        while put < n {
            match nix::unistd::write(&self.pipe_w, &buf[put..n]) {
                // Nothing taken (a filter above sealnode faking write(2)): never spin on it.
                Ok(0) => return Err(Errno::EIO),
                Ok(m) => put += m,
                Err(Errno::EINTR) => {}
                // An empty pipe takes a page: not expected.
                Err(e) => return Err(e),
            }
        }
        self.buffered += n;
        self.taken += n as u64;
        Ok(Some(&buf[..n]))
    }

    /// Bytes wait to go to the destination.
    pub(super) fn pending(&self) -> bool {
        self.buffered > 0 || !self.first.is_empty()
    }

    /// Move what can be moved from `src` to `dst`: the bytes delivered to `dst`, and the fault
    /// that ended this direction, if one did (bytes delivered before it still count). With a
    /// `record` still recording, each byte taken from `src` is copied into it too (peeked, then
    /// exactly those spliced). `readable`: epoll said `src` is readable (if nothing can be
    /// spliced from it then, it may be stopped at an urgent mark).
    pub(super) fn pump(
        &mut self,
        src: &OwnedFd,
        dst: &OwnedFd,
        mut record: Option<&mut Unanswered>,
        readable: bool,
    ) -> (u64, Result<(), Fault>) {
        let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
        let mut delivered = 0u64;
        let taken_before = self.taken;
        // Only a direction still recording pays for the copy.
        let mut peek = if record.as_deref().is_some_and(Unanswered::recording) { Some([0u8; PEEK]) } else { None };
        loop {
            let mut progressed = false;
            if !self.first.is_empty() {
                match send(dst.as_raw_fd(), &self.first, MsgFlags::MSG_NOSIGNAL | MsgFlags::MSG_DONTWAIT) {
                    Ok(n) => {
                        self.first.drain(..n);
                        delivered += n as u64;
                        progressed |= n > 0;
                    }
                    Err(Errno::EAGAIN) => {}
                    Err(Errno::EINTR) => progressed = true,
                    Err(e) => return (delivered, Err(Fault::Dst(e))),
                }
            }
            if !self.eof && self.room() > 0 {
                let mut len = self.room();
                let mut copy = None;
                if let (Some(r), Some(peek)) = (record.as_deref_mut().filter(|r| r.recording()), peek.as_mut()) {
                    // Never more than one past the bound: that byte is enough to know it is over.
                    let want = len.min(PEEK).min(r.limit + 1 - r.bytes.len());
                    match recv(src.as_raw_fd(), &mut peek[..want], MsgFlags::MSG_PEEK | MsgFlags::MSG_DONTWAIT) {
                        Ok(n) => {
                            len = n;
                            copy = Some(r);
                        }
                        Err(Errno::EAGAIN) => len = 0,
                        Err(Errno::EINTR) => {
                            progressed = true;
                            len = 0;
                        }
                        Err(e) => return (delivered, Err(Fault::Src(e))),
                    }
                }
                match (len, &copy) {
                    // The peek saw the end (or nothing yet).
                    (0, Some(_)) => self.eof = true,
                    (0, None) => {}
                    _ => match splice(src, None, &self.pipe_w, None, len, flags) {
                        // Nothing moved where the socket stands at an urgent mark: past it once
                        // the pipe is empty (what follows the mark may be the end).
                        Ok(0) | Err(Errno::EAGAIN) if at_urgent_mark(src) => {
                            if self.buffered > 0 {
                                self.stalled = true;
                            } else {
                                let mut buf = [0u8; 4096];
                                match self.past_urgent_mark(src, &mut buf) {
                                    Ok(None) => {}
                                    Ok(Some([])) => self.eof = true,
                                    Ok(Some(b)) => {
                                        if let Some(r) = record.as_deref_mut() {
                                            r.take(b);
                                        }
                                        progressed = true;
                                    }
                                    Err(e) => return (delivered, Err(Fault::Src(e))),
                                }
                            }
                        }
                        Ok(0) => self.eof = true,
                        Ok(n) => {
                            self.buffered += n;
                            self.taken += n as u64;
                            if let (Some(r), Some(peek)) = (copy, peek.as_ref()) {
                                r.take(&peek[..n]);
                            }
                            progressed = true;
                        }
                        // Readable, yet nothing went in: the pipe is full by its slots. Wait
                        // for it to drain rather than be woken for the same bytes again.
                        Err(Errno::EAGAIN) if readable && self.taken == taken_before && self.buffered > 0 => {
                            self.stalled = true;
                        }
                        Err(Errno::EAGAIN) => {}
                        Err(Errno::EINTR) => progressed = true,
                        Err(e) => return (delivered, Err(Fault::Src(e))),
                    },
                }
            }
            if self.buffered > 0 && self.first.is_empty() {
                match splice(&self.pipe_r, None, dst, None, self.buffered, flags) {
                    Ok(n) => {
                        self.buffered -= n;
                        delivered += n as u64;
                        progressed |= n > 0;
                        self.stalled &= n == 0;
                    }
                    Err(Errno::EAGAIN) => {}
                    Err(Errno::EINTR) => progressed = true,
                    Err(e) => return (delivered, Err(Fault::Dst(e))),
                }
            }
            if !progressed {
                break;
            }
        }
        (delivered, Ok(()))
    }

    /// Once the source has ended and everything is delivered, pass the half-close on (a client
    /// that finished sending still gets its answer).
    pub(super) fn pass_half_close(&mut self, dst: &OwnedFd) {
        if self.eof && !self.pending() && !self.shut {
            let _ = shutdown(dst.as_raw_fd(), Shutdown::Write);
            self.shut = true;
        }
    }
}

#[derive(Debug)]
pub(super) struct Conn {
    /// Where the outer socket connects (the upstream's address).
    pub(super) to: SocketAddr,
    pub(super) upstream: usize,
    /// The node's side, inside the cell.
    pub(super) inner: OwnedFd,
    /// Our connection to the upstream, on the host.
    pub(super) outer: OwnedFd,
    pub(super) connecting: bool,
    /// [0]: node -> upstream, [1]: upstream -> node.
    pub(super) dirs: [Dir; 2],
    /// That side hung up and is no longer in epoll.
    pub(super) gone: [bool; 2],
    /// The interest currently registered for (inner, outer): epoll_ctl only on change.
    pub(super) registered: (EpollFlags, EpollFlags),
    pub(super) last_active: Instant,
    /// When the node last sent a byte on it, and when the upstream last sent one back: on the
    /// engine route, a connection whose node spoke last has a request waiting for its answer.
    pub(super) node_said: Option<Instant>,
    pub(super) upstream_said: Option<Instant>,
    /// The engine route with `cell.engine_replay_kb`: what the engine has not answered yet.
    pub(super) record: Option<Unanswered>,
}

/// A node's connection to the engine is being served while a request of the node's waits for
/// its answer (the node spoke last, a trickle of bytes included) or the engine sent a byte on
/// it within `quiet` (an answer still coming). A connection just opened, on which nobody has
/// said anything yet, is not.
pub(super) fn being_served(c: &Conn, now: Instant, quiet: std::time::Duration) -> bool {
    served(c.node_said, c.upstream_said, now, quiet)
}

/// [`being_served`] on the times alone: when the node and the upstream last said something.
pub(super) fn served(
    node_said: Option<Instant>,
    upstream_said: Option<Instant>,
    now: Instant,
    quiet: std::time::Duration,
) -> bool {
    node_said > upstream_said || upstream_said.is_some_and(|t| now.saturating_duration_since(t) < quiet)
}

/// Interest for a connection's two sockets given its state.
pub(super) fn interest(c: &Conn) -> (EpollFlags, EpollFlags) {
    let mut inner = EpollFlags::empty();
    let mut outer = EpollFlags::empty();
    if c.connecting {
        return (inner, EpollFlags::EPOLLOUT);
    }
    if !c.dirs[0].eof && c.dirs[0].room() > 0 && !c.dirs[0].stalled {
        inner |= EpollFlags::EPOLLIN;
    }
    if c.dirs[0].pending() {
        outer |= EpollFlags::EPOLLOUT;
    }
    if !c.dirs[1].eof && c.dirs[1].room() > 0 && !c.dirs[1].stalled {
        outer |= EpollFlags::EPOLLIN;
    }
    if c.dirs[1].buffered > 0 {
        inner |= EpollFlags::EPOLLOUT;
    }
    (inner, outer)
}

/// A non-blocking connect on the host side.
pub(super) fn open_outer(addr: SocketAddr) -> Result<OwnedFd, Errno> {
    let fam = if addr.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let fd = socket(fam, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)?;
    connect_nonblocking(fd, addr)
}

/// Start connecting the non-blocking socket `fd` to `addr`.
pub(super) fn connect_nonblocking(fd: OwnedFd, addr: SocketAddr) -> Result<OwnedFd, Errno> {
    let _ = nix::sys::socket::setsockopt(&fd, sockopt::TcpNoDelay, &true);
    match connect(fd.as_raw_fd(), &SockaddrStorage::from(addr)) {
        Ok(()) | Err(Errno::EINPROGRESS) => Ok(fd),
        Err(e) => Err(e),
    }
}
