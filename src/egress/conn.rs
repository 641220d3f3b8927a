//! One forwarded connection: two sockets, a pipe per direction, bytes moved with splice(2);
//! and the host-side connect.

use std::net::SocketAddr;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::{splice, OFlag, SpliceFFlags};
use nix::sys::epoll::EpollFlags;
use nix::sys::socket::{
    connect, shutdown, socket, sockopt, AddressFamily, Shutdown, SockFlag, SockType, SockaddrStorage,
};

/// Bytes buffered in each direction's pipe.
pub(super) const PIPE_SIZE: usize = 256 * 1024;

/// One direction of a forwarded connection: socket -> pipe -> socket.
#[derive(Debug)]
pub(super) struct Dir {
    pub(super) pipe_r: OwnedFd,
    pub(super) pipe_w: OwnedFd,
    pub(super) buffered: usize,
    pub(super) eof: bool,
    pub(super) shut: bool,
}

impl Dir {
    pub(super) fn new() -> Result<Dir, Errno> {
        let (pipe_r, pipe_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        // A larger pipe means fewer wake-ups per megabyte; the default still works if refused.
        let _ = nix::fcntl::fcntl(&pipe_w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as i32));
        Ok(Dir { pipe_r, pipe_w, buffered: 0, eof: false, shut: false })
    }

    /// Move what can be moved from `src` to `dst`: the bytes delivered to `dst`, and the error
    /// that ended this direction, if one did (bytes delivered before it still count).
    pub(super) fn pump(&mut self, src: &OwnedFd, dst: &OwnedFd) -> (u64, Result<(), Errno>) {
        let flags = SpliceFFlags::SPLICE_F_NONBLOCK | SpliceFFlags::SPLICE_F_MOVE;
        let mut delivered = 0u64;
        loop {
            let mut progressed = false;
            if !self.eof && self.buffered < PIPE_SIZE {
                match splice(src, None, &self.pipe_w, None, PIPE_SIZE - self.buffered, flags) {
                    Ok(0) => self.eof = true,
                    Ok(n) => {
                        self.buffered += n;
                        progressed = true;
                    }
                    Err(Errno::EAGAIN) => {}
                    Err(Errno::EINTR) => progressed = true,
                    Err(e) => return (delivered, Err(e)),
                }
            }
            if self.buffered > 0 {
                match splice(&self.pipe_r, None, dst, None, self.buffered, flags) {
                    Ok(n) => {
                        self.buffered -= n;
                        delivered += n as u64;
                        progressed |= n > 0;
                    }
                    Err(Errno::EAGAIN) => {}
                    Err(Errno::EINTR) => progressed = true,
                    Err(e) => return (delivered, Err(e)),
                }
            }
            if !progressed {
                break;
            }
        }
        if self.eof && self.buffered == 0 && !self.shut {
            // Pass the half-close on (a client that finished sending still gets its answer).
            let _ = shutdown(dst.as_raw_fd(), Shutdown::Write);
            self.shut = true;
        }
        (delivered, Ok(()))
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
}

/// Interest for a connection's two sockets given its state.
pub(super) fn interest(c: &Conn) -> (EpollFlags, EpollFlags) {
    let mut inner = EpollFlags::empty();
    let mut outer = EpollFlags::empty();
    if c.connecting {
        return (inner, EpollFlags::EPOLLOUT);
    }
    if !c.dirs[0].eof && c.dirs[0].buffered < PIPE_SIZE {
        inner |= EpollFlags::EPOLLIN;
    }
    if c.dirs[0].buffered > 0 {
        outer |= EpollFlags::EPOLLOUT;
    }
    if !c.dirs[1].eof && c.dirs[1].buffered < PIPE_SIZE {
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
