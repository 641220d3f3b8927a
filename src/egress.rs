//! Declared egress: the node reaches each upstream only through this forwarder; and the
//! node's one way to the engine.
//!
//! Each upstream has a listener in the node's network namespace (on its own loopback address,
//! named in the node's /etc/hosts). The supervisor accepts there and connects out on the host
//! side to that upstream only, resolving the name outside the cell. The engine route is the
//! same with its listener on the node's 127.0.0.1:<engine.port> and its outer socket made in
//! the engine's network namespace, connected to that port only. Bytes move with splice(2) through a
//! pipe per direction (no copies through user space), driven by the supervisor's epoll loop:
//! no thread per connection. Connections per upstream are bounded, idle ones are closed, and
//! connections and bytes are counted per upstream.

use std::collections::HashMap;
use std::net::{SocketAddr, ToSocketAddrs};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::{splice, OFlag, SpliceFFlags};
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::sys::socket::{
    accept4, connect, getsockopt, shutdown, socket, sockopt, AddressFamily, Shutdown, SockFlag, SockType,
    SockaddrStorage,
};
use serde::Serialize;

/// Epoll token kinds (top byte of the 64-bit token).
pub const TOKEN_LISTENER: u64 = 2 << 56;
pub const TOKEN_CONN: u64 = 3 << 56;
pub const TOKEN_KIND: u64 = 0xff << 56;

/// Bytes buffered in each direction's pipe.
const PIPE_SIZE: usize = 256 * 1024;
/// How long a resolved upstream address is reused before resolving again.
const RESOLVE_TTL: Duration = Duration::from_secs(60);

/// Counters per upstream, shown in the supervisor's status and logs.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Stats {
    pub upstream: String,
    pub accepted: u64,
    pub refused_over_limit: u64,
    pub connect_failed: u64,
    pub active: usize,
    pub bytes_up: u64,
    pub bytes_down: u64,
}

#[derive(Debug)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
    /// Fixed upstream address from the config, else `host:port` resolved on the host.
    pub connect: Option<SocketAddr>,
    pub listener: OwnedFd,
    resolved: Option<(SocketAddr, Instant)>,
    /// The engine route: outer sockets come from the engine's namespace, to 127.0.0.1:port.
    engine: Option<crate::cell::EngineSockets>,
    pub stats: Stats,
}

impl Upstream {
    pub fn new(host: String, port: u16, connect: Option<SocketAddr>, listener: OwnedFd) -> Upstream {
        let stats = Stats { upstream: format!("{host}:{port}"), ..Stats::default() };
        Upstream { host, port, connect, listener, resolved: None, engine: None, stats }
    }

    /// The node's way to the engine: `listener` is the node's 127.0.0.1:`port`.
    pub fn engine(port: u16, listener: OwnedFd, sockets: crate::cell::EngineSockets) -> Upstream {
        let stats = Stats { upstream: format!("engine 127.0.0.1:{port}"), ..Stats::default() };
        let to = SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
        Upstream {
            host: "engine".into(),
            port,
            connect: Some(to),
            listener,
            resolved: None,
            engine: Some(sockets),
            stats,
        }
    }

    pub fn is_engine(&self) -> bool {
        self.engine.is_some()
    }

    /// A non-blocking connect to this upstream: on the host, or in the engine's namespace.
    fn open(&mut self) -> Result<OwnedFd, (String, Errno)> {
        let addr = self.address().map_err(|e| (e.to_string(), Errno::EHOSTUNREACH))?;
        let fd = match &self.engine {
            Some(s) => s.socket().and_then(|fd| connect_nonblocking(fd, addr)),
            None => open_outer(addr),
        };
        fd.map_err(|e| (format!("{addr}: {}", e.desc()), e))
    }

    fn address(&mut self) -> std::io::Result<SocketAddr> {
        if let Some(a) = self.connect {
            return Ok(a);
        }
        if let Some((a, at)) = self.resolved {
            if at.elapsed() < RESOLVE_TTL {
                return Ok(a);
            }
        }
        let a = (self.host.as_str(), self.port)
            .to_socket_addrs()?
            .next()
            .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::NotFound, "no address"))?;
        self.resolved = Some((a, Instant::now()));
        Ok(a)
    }
}

/// One direction of a forwarded connection: socket -> pipe -> socket.
#[derive(Debug)]
struct Dir {
    pipe_r: OwnedFd,
    pipe_w: OwnedFd,
    buffered: usize,
    eof: bool,
    shut: bool,
}

impl Dir {
    fn new() -> Result<Dir, Errno> {
        let (pipe_r, pipe_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
        // A larger pipe means fewer wake-ups per megabyte; the default still works if refused.
        let _ = nix::fcntl::fcntl(&pipe_w, nix::fcntl::FcntlArg::F_SETPIPE_SZ(PIPE_SIZE as i32));
        Ok(Dir { pipe_r, pipe_w, buffered: 0, eof: false, shut: false })
    }

    /// Move what can be moved from `src` to `dst`; returns bytes delivered to `dst`.
    fn pump(&mut self, src: &OwnedFd, dst: &OwnedFd) -> Result<u64, Errno> {
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
                    Err(e) => return Err(e),
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
                    Err(e) => return Err(e),
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
        Ok(delivered)
    }
}

#[derive(Debug)]
struct Conn {
    upstream: usize,
    /// The node's side, inside the cell.
    inner: OwnedFd,
    /// Our connection to the upstream, on the host.
    outer: OwnedFd,
    connecting: bool,
    /// [0]: node -> upstream, [1]: upstream -> node.
    dirs: [Dir; 2],
    /// That side hung up and is no longer in epoll.
    gone: [bool; 2],
    /// The interest currently registered for (inner, outer): epoll_ctl only on change.
    registered: (EpollFlags, EpollFlags),
    last_active: Instant,
}

/// Interest for a connection's two sockets given its state.
fn interest(c: &Conn) -> (EpollFlags, EpollFlags) {
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

#[derive(Debug)]
pub struct Forwarder {
    pub upstreams: Vec<Upstream>,
    conns: HashMap<u64, Conn>,
    next_id: u64,
    max_per_upstream: usize,
    idle_timeout: Duration,
}

impl Forwarder {
    pub fn new(
        upstreams: Vec<Upstream>,
        max_per_upstream: usize,
        idle_timeout: Duration,
        epoll: &Epoll,
    ) -> Result<Forwarder, Errno> {
        for (i, u) in upstreams.iter().enumerate() {
            epoll.add(u.listener.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_LISTENER | i as u64))?;
        }
        Ok(Forwarder { upstreams, conns: HashMap::new(), next_id: 1, max_per_upstream, idle_timeout })
    }

    /// Counters of the declared egress upstreams.
    pub fn stats(&self) -> Vec<Stats> {
        self.upstreams.iter().filter(|u| !u.is_engine()).map(|u| u.stats.clone()).collect()
    }

    /// Counters of the node's connections to the engine.
    pub fn engine_stats(&self) -> Option<Stats> {
        self.upstreams.iter().find(|u| u.is_engine()).map(|u| u.stats.clone())
    }

    pub fn active(&self) -> usize {
        self.conns.len()
    }

    /// Handle an epoll event whose token belongs to the forwarder.
    pub fn handle(&mut self, epoll: &Epoll, token: u64, events: EpollFlags) {
        match token & TOKEN_KIND {
            TOKEN_LISTENER => self.accept(epoll, (token & !TOKEN_KIND) as usize),
            TOKEN_CONN => {
                let id = (token & !TOKEN_KIND) >> 1;
                self.pump(epoll, id);
                // epoll reports an error or a hang-up whatever the interest: act on it, or a
                // dead peer behind a full pipe would wake the loop forever (busy loop).
                if events.intersects(EpollFlags::EPOLLERR | EpollFlags::EPOLLHUP) {
                    self.hang_up(epoll, id, (token & 1) as usize, events.contains(EpollFlags::EPOLLERR));
                }
            }
            _ => {}
        }
    }

    /// One side (0: node, 1: upstream) errored or hung up. On an error, or when nothing is left
    /// to deliver to the other side, the connection closes; otherwise that side is taken out of
    /// epoll and the remaining buffered bytes still flow the other way.
    fn hang_up(&mut self, epoll: &Epoll, id: u64, side: usize, error: bool) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if error || c.connecting {
            return self.close(epoll, id);
        }
        let fd = if side == 0 { &c.inner } else { &c.outer };
        let _ = epoll.delete(fd.as_fd());
        c.gone[side] = true;
        // Nothing more comes from that side, and nothing can be delivered to it: stop reading
        // the other side too (there is nowhere to put its bytes).
        c.dirs[side].eof = true;
        c.dirs[1 - side].eof = true;
        c.dirs[1 - side].shut = true;
        c.dirs[1 - side].buffered = 0;
        if c.dirs[side].buffered == 0 || c.gone[1 - side] {
            self.close(epoll, id);
        }
    }

    fn accept(&mut self, epoll: &Epoll, i: usize) {
        loop {
            let Some(u) = self.upstreams.get_mut(i) else { return };
            let inner = match accept4(u.listener.as_fd(), SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC) {
                Ok(fd) => fd,
                Err(Errno::EINTR) | Err(Errno::ECONNABORTED) => continue,
                Err(_) => return,
            };
            // Small request/response traffic (WebSocket frames) must not wait for Nagle.
            let _ = nix::sys::socket::setsockopt(&inner, sockopt::TcpNoDelay, &true);
            if u.stats.active >= self.max_per_upstream {
                u.stats.refused_over_limit += 1;
                tracing::warn!(upstream = %u.stats.upstream, limit = self.max_per_upstream, "egress connection refused: limit reached");
                continue;
            }
            let outer = match u.open() {
                Ok(fd) => fd,
                Err((why, _)) => {
                    u.stats.connect_failed += 1;
                    tracing::warn!(upstream = %u.stats.upstream, error = %why, "egress connect failed");
                    continue;
                }
            };
            let (Ok(d0), Ok(d1)) = (Dir::new(), Dir::new()) else { continue };
            u.stats.accepted += 1;
            u.stats.active += 1;
            let id = self.next_id;
            self.next_id += 1;
            let mut c = Conn {
                upstream: i,
                inner,
                outer,
                connecting: true,
                dirs: [d0, d1],
                gone: [false; 2],
                registered: (EpollFlags::empty(), EpollFlags::empty()),
                last_active: Instant::now(),
            };
            let (fi, fo) = interest(&c);
            c.registered = (fi, fo);
            let ok = epoll.add(c.inner.as_fd(), EpollEvent::new(fi, TOKEN_CONN | id << 1)).is_ok()
                && epoll.add(c.outer.as_fd(), EpollEvent::new(fo, TOKEN_CONN | id << 1 | 1)).is_ok();
            self.conns.insert(id, c);
            if !ok {
                self.close(epoll, id);
            }
        }
    }

    fn pump(&mut self, epoll: &Epoll, id: u64) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if c.connecting {
            match getsockopt(&c.outer, sockopt::SocketError) {
                Ok(0) => c.connecting = false,
                Ok(e) => {
                    let u = &mut self.upstreams[c.upstream].stats;
                    u.connect_failed += 1;
                    tracing::warn!(upstream = %u.upstream, error = %Errno::from_raw(e), "egress connect failed");
                    return self.close(epoll, id);
                }
                Err(_) => return self.close(epoll, id),
            }
        }
        let up = c.dirs[0].pump(&c.inner, &c.outer);
        let down = c.dirs[1].pump(&c.outer, &c.inner);
        let stats = &mut self.upstreams[c.upstream].stats;
        match (up, down) {
            (Ok(u), Ok(d)) => {
                stats.bytes_up += u;
                stats.bytes_down += d;
                if u + d > 0 {
                    c.last_active = Instant::now();
                }
            }
            _ => return self.close(epoll, id),
        }
        if c.dirs[0].shut && c.dirs[1].shut {
            return self.close(epoll, id);
        }
        let (fi, fo) = interest(c);
        let ok = (c.gone[0]
            || fi == c.registered.0
            || epoll.modify(c.inner.as_fd(), &mut EpollEvent::new(fi, TOKEN_CONN | id << 1)).is_ok())
            && (c.gone[1]
                || fo == c.registered.1
                || epoll.modify(c.outer.as_fd(), &mut EpollEvent::new(fo, TOKEN_CONN | id << 1 | 1)).is_ok());
        c.registered = (fi, fo);
        if !ok {
            self.close(epoll, id);
        }
    }

    fn close(&mut self, epoll: &Epoll, id: u64) {
        if let Some(c) = self.conns.remove(&id) {
            if !c.gone[0] {
                let _ = epoll.delete(c.inner.as_fd());
            }
            if !c.gone[1] {
                let _ = epoll.delete(c.outer.as_fd());
            }
            self.upstreams[c.upstream].stats.active -= 1;
        }
    }

    /// Close connections idle longer than the timeout; returns when to look again.
    pub fn sweep(&mut self, epoll: &Epoll) -> Option<Instant> {
        let idle: Vec<u64> = self
            .conns
            .iter()
            .filter(|(_, c)| c.last_active.elapsed() >= self.idle_timeout)
            .map(|(id, _)| *id)
            .collect();
        for id in idle {
            tracing::info!(upstream = %self.upstreams[self.conns[&id].upstream].stats.upstream, "egress connection closed: idle");
            self.close(epoll, id);
        }
        self.conns.values().map(|c| c.last_active + self.idle_timeout).min()
    }

    /// Drop every connection (stop, recycle).
    pub fn close_all(&mut self, epoll: &Epoll) {
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.close(epoll, id);
        }
    }
}

/// A non-blocking connect on the host side.
fn open_outer(addr: SocketAddr) -> Result<OwnedFd, Errno> {
    let fam = if addr.is_ipv4() { AddressFamily::Inet } else { AddressFamily::Inet6 };
    let fd = socket(fam, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)?;
    connect_nonblocking(fd, addr)
}

/// Start connecting the non-blocking socket `fd` to `addr`.
fn connect_nonblocking(fd: OwnedFd, addr: SocketAddr) -> Result<OwnedFd, Errno> {
    let _ = nix::sys::socket::setsockopt(&fd, sockopt::TcpNoDelay, &true);
    match connect(fd.as_raw_fd(), &SockaddrStorage::from(addr)) {
        Ok(()) | Err(Errno::EINPROGRESS) => Ok(fd),
        Err(e) => Err(e),
    }
}
