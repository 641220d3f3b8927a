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
use serde::{Deserialize, Serialize};

/// Epoll token kinds (top byte of the 64-bit token).
pub const TOKEN_LISTENER: u64 = 2 << 56;
pub const TOKEN_CONN: u64 = 3 << 56;
pub const TOKEN_LOOKUP: u64 = 7 << 56;
pub const TOKEN_KIND: u64 = 0xff << 56;

/// A name lookup that has not answered by then has failed (the resolver may still hang: its
/// helper process is killed).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(5);
/// A failed lookup is not retried for this long: connections meanwhile are refused at once.
const NEGATIVE_TTL: Duration = Duration::from_secs(10);
/// Lookups in flight at once, over all upstreams.
const MAX_LOOKUPS: usize = 4;

/// Bytes buffered in each direction's pipe.
const PIPE_SIZE: usize = 256 * 1024;
/// How long a resolved upstream address is reused before resolving again.
const RESOLVE_TTL: Duration = Duration::from_secs(60);

/// Counters per upstream, shown in the supervisor's status and logs (read back by `ctl`:
/// `control::protocol::Status`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
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
    engine: Option<crate::sandbox::cell::EngineSockets>,
    /// Private (RFC 1918, CGNAT, ULA) addresses are allowed for this upstream's name.
    allow_private: bool,
    /// The node's connections waiting for a lookup of `host`.
    parked: Vec<OwnedFd>,
    /// A lookup of `host` is in flight.
    looking_up: bool,
    /// The last lookup failed: refuse at once until then.
    failed_until: Option<Instant>,
    pub stats: Stats,
}

impl Upstream {
    pub fn new(
        host: String,
        port: u16,
        connect: Option<SocketAddr>,
        allow_private: bool,
        listener: OwnedFd,
    ) -> Upstream {
        let stats = Stats { upstream: format!("{host}:{port}"), ..Stats::default() };
        Upstream {
            host,
            port,
            connect,
            listener,
            resolved: None,
            engine: None,
            allow_private,
            parked: Vec::new(),
            looking_up: false,
            failed_until: None,
            stats,
        }
    }

    /// The node's way to the engine: `listener` is the node's 127.0.0.1:`port`.
    pub fn engine(port: u16, listener: OwnedFd, sockets: crate::sandbox::cell::EngineSockets) -> Upstream {
        let stats = Stats { upstream: format!("engine 127.0.0.1:{port}"), ..Stats::default() };
        let to = SocketAddr::from((std::net::Ipv4Addr::LOCALHOST, port));
        Upstream {
            host: "engine".into(),
            port,
            connect: Some(to),
            listener,
            resolved: None,
            engine: Some(sockets),
            allow_private: false,
            parked: Vec::new(),
            looking_up: false,
            failed_until: None,
            stats,
        }
    }

    pub fn is_engine(&self) -> bool {
        self.engine.is_some()
    }

    /// The address to connect to now, if known without a lookup: the configured one, or a
    /// resolved one that is still fresh.
    fn known_address(&self) -> Option<SocketAddr> {
        self.connect.or_else(|| self.resolved.filter(|(_, at)| at.elapsed() < RESOLVE_TTL).map(|(a, _)| a))
    }

    /// A non-blocking connect to `addr`: on the host, or in the engine's namespace.
    fn open(&self, addr: SocketAddr) -> Result<OwnedFd, (String, Errno)> {
        let fd = match &self.engine {
            Some(s) => s.socket().and_then(|fd| connect_nonblocking(fd, addr)),
            None => open_outer(addr),
        };
        fd.map_err(|e| (format!("{addr}: {}", e.desc()), e))
    }
}

/// Why `ip` may not be an egress upstream's address, if it may not: the places a name could
/// be pointed at to turn the node's egress against the host or its network. `own`: the host's
/// own addresses. Private ranges pass only where the upstream allows them.
pub fn denied(ip: std::net::IpAddr, own: &[std::net::IpAddr], allow_private: bool) -> Option<&'static str> {
    use std::net::IpAddr;
    if let IpAddr::V6(v6) = ip {
        // An IPv6 address that carries an IPv4 one is judged as that IPv4 address too: a name
        // does not reach 127.0.0.1 or 169.254.169.254 through a translator (unit test:
        // egress::tests::the_deny_set).
        if let Some(v4) = embedded_ipv4(v6) {
            if let Some(why) = denied(IpAddr::V4(v4), own, allow_private) {
                return Some(why);
            }
            if v6.to_ipv4_mapped().is_some() {
                return None;
            }
        }
    }
    if own.contains(&ip) {
        return Some("one of this host's own addresses");
    }
    match ip {
        IpAddr::V4(a) => {
            let o = a.octets();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_link_local() {
                Some("link-local (169.254.0.0/16, cloud metadata services)")
            } else if a.is_unspecified() || o[0] == 0 {
                Some("unspecified or 'this network' (0.0.0.0/8)")
            } else if a.is_multicast() || a.is_broadcast() {
                Some("multicast or broadcast")
            } else if !allow_private && (a.is_private() || (o[0] == 100 && (o[1] & 0xc0) == 64)) {
                Some("private (10/8, 172.16/12, 192.168/16, 100.64/10); set allow_private for this upstream")
            } else {
                None
            }
        }
        IpAddr::V6(a) => {
            let seg = a.segments();
            if a.is_loopback() {
                Some("loopback")
            } else if a.is_unspecified() {
                Some("unspecified")
            } else if a.is_multicast() {
                Some("multicast")
            } else if (seg[0] & 0xffc0) == 0xfe80 {
                Some("link-local (fe80::/10)")
            } else if (seg[0] & 0xffc0) == 0xfec0 {
                Some("site-local (fec0::/10)")
            } else if seg[0] == 0x2001 && seg[1] == 0 {
                Some("Teredo (2001::/32): a tunnel that carries IPv4 addresses")
            } else if seg[..3] == [0x64, 0xff9b, 1] {
                Some("local-use NAT64 (64:ff9b:1::/48): a translator to IPv4")
            } else if seg[..6] == [0, 0, 0, 0, 0xffff, 0] {
                Some("IPv4-translated (::ffff:0:0:0/96)")
            } else if seg[0] == 0x2001 && matches!(seg[1] & 0xfff0, 0x10 | 0x20) {
                Some("ORCHID (2001:10::/28, 2001:20::/28): not routable")
            } else if !allow_private && (seg[0] & 0xfe00) == 0xfc00 {
                Some("unique local (fc00::/7); set allow_private for this upstream")
            } else {
                None
            }
        }
    }
}

/// The IPv4 address inside an IPv6 one: IPv4-mapped (`::ffff:a.b.c.d`), IPv4-compatible
/// (`::a.b.c.d`, deprecated but still routed by some stacks), NAT64's well-known prefix
/// (`64:ff9b::/96`, RFC 6052) and 6to4 (`2002:AABB:CCDD::/48`, RFC 3056).
fn embedded_ipv4(a: std::net::Ipv6Addr) -> Option<std::net::Ipv4Addr> {
    let seg = a.segments();
    let tail = |hi: u16, lo: u16| std::net::Ipv4Addr::from((u32::from(hi) << 16) | u32::from(lo));
    if let Some(v4) = a.to_ipv4_mapped() {
        return Some(v4);
    }
    if seg[..6] == [0; 6] && !(seg[6] == 0 && seg[7] <= 1) {
        return Some(tail(seg[6], seg[7]));
    }
    if seg[..6] == [0x64, 0xff9b, 0, 0, 0, 0] {
        return Some(tail(seg[6], seg[7]));
    }
    if seg[0] == 0x2002 {
        return Some(tail(seg[1], seg[2]));
    }
    None
}

/// This host's own addresses, every interface.
fn own_addresses() -> Vec<std::net::IpAddr> {
    let Ok(addrs) = nix::ifaddrs::getifaddrs() else { return Vec::new() };
    addrs
        .filter_map(|i| {
            let a = i.address?;
            if let Some(v4) = a.as_sockaddr_in() {
                return Some(std::net::IpAddr::V4(v4.ip()));
            }
            a.as_sockaddr_in6().map(|v6| std::net::IpAddr::V6(v6.ip()))
        })
        .collect()
}

/// A name lookup in a short-lived helper process (the supervisor stays single-threaded and
/// never blocks on the resolver): it writes one address per line to its pipe and exits.
#[derive(Debug)]
struct Lookup {
    upstream: usize,
    pid: nix::unistd::Pid,
    pipe: OwnedFd,
    out: Vec<u8>,
    deadline: Instant,
}

fn spawn_lookup(host: &str, port: u16) -> Result<(nix::unistd::Pid, OwnedFd), Errno> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
    let parent = nix::unistd::getpid();
    // SAFETY: the supervisor is single-threaded; the child only resolves, writes and exits.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            // Dies with the supervisor, and if it already died before PDEATHSIG was armed.
            let _ = crate::os::sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            if nix::unistd::getppid() != parent {
                crate::os::sys::exit_now(1);
            }
            // Holds nothing of the supervisor's but its answer pipe while it waits on the
            // resolver: not the listeners, the connections or the cell's socket factory
            // (tests/egress.rs: a_hanging_resolver_never_stalls_the_supervisor).
            if crate::os::sys::close_all_except(&[w.as_raw_fd()]).is_err() {
                crate::os::sys::exit_now(1);
            }
            let text: String = match (host, port).to_socket_addrs() {
                Ok(addrs) => addrs.map(|a| format!("{}\n", a.ip())).collect(),
                Err(e) => format!("error {e}\n"),
            };
            let _ = crate::os::sys::write_all(w.as_raw_fd(), text.as_bytes());
            crate::os::sys::exit_now(0)
        }
        nix::unistd::ForkResult::Parent { child } => Ok((child, r)),
    }
}

fn spare_fd() -> Option<OwnedFd> {
    nix::fcntl::open("/dev/null", OFlag::O_RDONLY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty()).ok()
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

    /// Move what can be moved from `src` to `dst`: the bytes delivered to `dst`, and the error
    /// that ended this direction, if one did (bytes delivered before it still count).
    fn pump(&mut self, src: &OwnedFd, dst: &OwnedFd) -> (u64, Result<(), Errno>) {
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
struct Conn {
    /// Where the outer socket connects (the upstream's address).
    to: SocketAddr,
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
    /// All upstreams together (the node-to-engine hop included): what the supervisor's fd
    /// limit allows, less a reserve for the control socket and the gate ([`fd_budget`]).
    max_total: usize,
    idle_timeout: Duration,
    /// An outbound connect with no answer this long is given up (`cell.egress_connect_timeout_s`).
    connect_timeout: Duration,
    /// When [`Forwarder::sweep`] has something to do next (a connect or an idle timeout).
    next_sweep: Option<Instant>,
    lookups: HashMap<u64, Lookup>,
    /// An fd held in reserve: at EMFILE it is closed to accept (and drop) the waiting
    /// connection, so a level-triggered listener never spins.
    spare: Option<OwnedFd>,
    /// One forwarder warning a second at most: a node can cause them at will.
    quiet: crate::logging::ratelimit::Quiet,
}

/// Fds one forwarded connection holds: the node's socket, the outer one, two pipes.
pub const FDS_PER_CONNECTION: usize = 6;
/// Fds kept free of forwarding: control clients, a preflight (memfds, pipes, a pty, the cell's
/// sockets), a reload's throwaway cell, receipts, lookups.
pub const FD_RESERVE: usize = 256;
/// And per route (each egress upstream, the engine hop): its listener, the preflight's host
/// listener standing in for it, and a reload's throwaway cell's listener (unit test:
/// egress::tests::the_fd_budget_keeps_a_reserve).
pub const FD_RESERVE_PER_ROUTE: usize = 3;

/// How many connections the fd limit `nofile` leaves room for, all `routes` together.
pub fn fd_budget(nofile: u64, routes: usize) -> usize {
    let reserve = FD_RESERVE + FD_RESERVE_PER_ROUTE * routes;
    (usize::try_from(nofile).unwrap_or(usize::MAX).saturating_sub(reserve) / FDS_PER_CONNECTION).max(1)
}

impl Forwarder {
    pub fn new(
        upstreams: Vec<Upstream>,
        max_per_upstream: usize,
        idle_timeout: Duration,
        connect_timeout: Duration,
        epoll: &Epoll,
    ) -> Result<Forwarder, Errno> {
        for (i, u) in upstreams.iter().enumerate() {
            epoll.add(u.listener.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_LISTENER | i as u64))?;
        }
        let nofile =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map(|l| l.0).unwrap_or(1024);
        let max_total = fd_budget(nofile, upstreams.len());
        tracing::info!(connections = max_total, fd_limit = nofile, "egress forwarding budget");
        if max_total < 2 * upstreams.len() {
            tracing::warn!(
                connections = max_total,
                fd_limit = nofile,
                upstreams = upstreams.len(),
                "the fd limit leaves room for very few forwarded connections; raise LimitNOFILE= (ulimit -n)"
            );
        }
        Ok(Forwarder {
            upstreams,
            conns: HashMap::new(),
            next_id: 1,
            max_per_upstream,
            max_total,
            idle_timeout,
            connect_timeout,
            next_sweep: None,
            lookups: HashMap::new(),
            spare: spare_fd(),
            quiet: crate::logging::ratelimit::Quiet::default(),
        })
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
            TOKEN_LOOKUP => self.read_lookup(epoll, token & !TOKEN_KIND),
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

    /// Connections held now, all upstreams together (parked ones included).
    fn held(&self) -> usize {
        self.upstreams.iter().map(|u| u.stats.active + u.parked.len()).sum()
    }

    /// A refused connection: counted always, logged at most once a second, so a node opening
    /// connections in a loop does not flood the journal (tests/run.rs:
    /// the_fd_budget_bounds_forwarding_and_keeps_the_gate_working).
    fn refuse(&mut self, i: usize, why: &'static str) {
        let limit = if why == "fd budget" { self.max_total } else { self.max_per_upstream };
        let u = &mut self.upstreams[i];
        u.stats.refused_over_limit += 1;
        if let Some(suppressed) = self.quiet.allow(Instant::now()) {
            tracing::warn!(upstream = %u.stats.upstream, limit, why, suppressed, "egress connection refused: limit reached");
        }
    }

    fn accept(&mut self, epoll: &Epoll, i: usize) {
        loop {
            let Some(u) = self.upstreams.get_mut(i) else { return };
            let inner = match accept4(u.listener.as_fd(), SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC) {
                Ok(fd) => fd,
                Err(Errno::EINTR) | Err(Errno::ECONNABORTED) => continue,
                Err(Errno::EMFILE) | Err(Errno::ENFILE) => {
                    // Out of fds: free the spare, take the waiting connection and drop it, so
                    // the listener does not stay readable and spin the loop.
                    // accept4 says EMFILE whether or not a connection waits: with nothing
                    // waiting (EAGAIN) this wake-up is done, never gone round again (unit test:
                    // egress::tests::out_of_fds_with_nothing_waiting_ends_the_wake_up).
                    if self.spare.take().is_none() {
                        return;
                    }
                    let waiting = accept4(self.upstreams[i].listener.as_fd(), SockFlag::SOCK_CLOEXEC);
                    self.spare = spare_fd();
                    match waiting {
                        Ok(fd) => {
                            drop(fd);
                            self.refuse(i, "out of fds");
                            continue;
                        }
                        Err(Errno::EINTR) | Err(Errno::ECONNABORTED) => continue,
                        Err(_) => return,
                    }
                }
                Err(_) => return,
            };
            // Small request/response traffic (WebSocket frames) must not wait for Nagle.
            let _ = nix::sys::socket::setsockopt(&inner, sockopt::TcpNoDelay, &true);
            if u.stats.active + u.parked.len() >= self.max_per_upstream {
                self.refuse(i, "per upstream");
                continue;
            }
            if self.held() >= self.max_total {
                self.refuse(i, "fd budget");
                continue;
            }
            let u = &mut self.upstreams[i];
            match u.known_address() {
                Some(addr) => self.connect_out(epoll, i, inner, addr),
                None => self.park(epoll, i, inner),
            }
        }
    }

    /// The name of upstream `i` must be looked up first: the connection waits while a helper
    /// process resolves it (off the loop), or is refused at once while a recent failure stands.
    fn park(&mut self, epoll: &Epoll, i: usize, inner: OwnedFd) {
        let in_flight = self.lookups.len();
        let id = self.next_id;
        let u = &mut self.upstreams[i];
        if u.failed_until.is_some_and(|t| Instant::now() < t) {
            u.stats.connect_failed += 1;
            tracing::debug!(upstream = %u.stats.upstream, "egress connection refused: the last lookup failed");
            return;
        }
        if !u.looking_up {
            if in_flight >= MAX_LOOKUPS {
                u.stats.connect_failed += 1;
                if let Some(suppressed) = self.quiet.allow(Instant::now()) {
                    tracing::warn!(upstream = %u.stats.upstream, limit = MAX_LOOKUPS, suppressed, "egress connection refused: too many name lookups in flight");
                }
                return;
            }
            let (pid, pipe) = match spawn_lookup(&u.host, u.port) {
                Ok(l) => l,
                Err(e) => {
                    u.stats.connect_failed += 1;
                    if let Some(suppressed) = self.quiet.allow(Instant::now()) {
                        tracing::warn!(upstream = %u.stats.upstream, error = %e, suppressed, "egress name lookup could not start");
                    }
                    return;
                }
            };
            if epoll.add(pipe.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_LOOKUP | id)).is_err() {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                u.stats.connect_failed += 1;
                return;
            }
            u.looking_up = true;
            self.next_id += 1;
            tracing::info!(upstream = %u.stats.upstream, name = %u.host, pid = pid.as_raw(), "egress name lookup started");
            self.lookups.insert(
                id,
                Lookup { upstream: i, pid, pipe, out: Vec::new(), deadline: Instant::now() + LOOKUP_TIMEOUT },
            );
        }
        self.upstreams[i].parked.push(inner);
    }

    fn read_lookup(&mut self, epoll: &Epoll, id: u64) {
        let Some(l) = self.lookups.get_mut(&id) else { return };
        let mut b = [0u8; 4096];
        loop {
            match nix::unistd::read(&l.pipe, &mut b) {
                Ok(0) => break,
                Ok(n) if l.out.len() < 65536 => l.out.extend_from_slice(&b[..n]),
                Ok(_) => break,
                Err(Errno::EINTR) => continue,
                Err(Errno::EAGAIN) => return,
                Err(_) => break,
            }
        }
        let Some(l) = self.lookups.remove(&id) else { return };
        let _ = epoll.delete(l.pipe.as_fd());
        let text = String::from_utf8_lossy(&l.out).into_owned();
        self.lookup_done(epoll, l.upstream, Ok(text));
    }

    /// A lookup answered (`Ok(lines)`) or failed: take the first address that may be used, or
    /// refuse every parked connection and remember the failure for NEGATIVE_TTL.
    fn lookup_done(&mut self, epoll: &Epoll, i: usize, answer: std::result::Result<String, String>) {
        let own = own_addresses();
        let u = &mut self.upstreams[i];
        u.looking_up = false;
        let mut why = String::new();
        let mut chosen = None;
        match answer {
            Err(e) => why = e,
            Ok(text) if text.starts_with("error ") => why = text.trim_start_matches("error ").trim().to_string(),
            Ok(text) => {
                for ip in text.lines().filter_map(|l| l.trim().parse::<std::net::IpAddr>().ok()) {
                    match denied(ip, &own, u.allow_private) {
                        Some(reason) => {
                            tracing::warn!(upstream = %u.stats.upstream, name = %u.host, address = %ip, reason, "egress address refused");
                            why = format!("{ip} refused: {reason}");
                        }
                        None if chosen.is_none() => chosen = Some(SocketAddr::new(ip, u.port)),
                        None => {}
                    }
                }
                if chosen.is_none() && why.is_empty() {
                    why = "no address".into();
                }
            }
        }
        let parked = std::mem::take(&mut u.parked);
        match chosen {
            Some(addr) => {
                u.resolved = Some((addr, Instant::now()));
                u.failed_until = None;
                for inner in parked {
                    self.connect_out(epoll, i, inner, addr);
                }
            }
            None => {
                u.failed_until = Some(Instant::now() + NEGATIVE_TTL);
                u.stats.connect_failed += parked.len() as u64;
                tracing::warn!(upstream = %u.stats.upstream, name = %u.host, error = %why, refused = parked.len(), "egress name lookup failed");
            }
        }
    }

    /// Lookups past their deadline fail (their helper is killed); returns the next deadline.
    pub fn expire_lookups(&mut self, epoll: &Epoll) -> Option<Instant> {
        let now = Instant::now();
        let late: Vec<u64> = self.lookups.iter().filter(|(_, l)| l.deadline <= now).map(|(id, _)| *id).collect();
        for id in late {
            if let Some(l) = self.lookups.remove(&id) {
                let _ = epoll.delete(l.pipe.as_fd());
                let _ = nix::sys::signal::kill(l.pid, nix::sys::signal::Signal::SIGKILL);
                self.lookup_done(epoll, l.upstream, Err(format!("timed out after {} s", LOOKUP_TIMEOUT.as_secs())));
            }
        }
        self.lookups.values().map(|l| l.deadline).min()
    }

    /// Connect the node's connection `inner` out to `addr` for upstream `i`.
    fn connect_out(&mut self, epoll: &Epoll, i: usize, inner: OwnedFd, addr: SocketAddr) {
        let u = &mut self.upstreams[i];
        let outer = match u.open(addr) {
            Ok(fd) => fd,
            Err((why, _)) => {
                u.stats.connect_failed += 1;
                if let Some(suppressed) = self.quiet.allow(Instant::now()) {
                    tracing::warn!(upstream = %u.stats.upstream, error = %why, suppressed, "egress connect failed");
                }
                return;
            }
        };
        let (Ok(d0), Ok(d1)) = (Dir::new(), Dir::new()) else {
            u.stats.connect_failed += 1;
            if let Some(suppressed) = self.quiet.allow(Instant::now()) {
                tracing::warn!(upstream = %u.stats.upstream, suppressed, "egress connection dropped: no pipe for it (out of fds)");
            }
            return;
        };
        u.stats.accepted += 1;
        u.stats.active += 1;
        let id = self.next_id;
        self.next_id += 1;
        let mut c = Conn {
            upstream: i,
            to: addr,
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
        let due = c.last_active + self.connect_timeout;
        self.next_sweep = Some(self.next_sweep.map_or(due, |s| s.min(due)));
        let ok = epoll.add(c.inner.as_fd(), EpollEvent::new(fi, TOKEN_CONN | id << 1)).is_ok()
            && epoll.add(c.outer.as_fd(), EpollEvent::new(fo, TOKEN_CONN | id << 1 | 1)).is_ok();
        self.conns.insert(id, c);
        if !ok {
            self.close(epoll, id);
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
                    if let Some(suppressed) = self.quiet.allow(Instant::now()) {
                        tracing::warn!(upstream = %u.upstream, error = %Errno::from_raw(e), suppressed, "egress connect failed");
                    }
                    return self.close(epoll, id);
                }
                Err(_) => return self.close(epoll, id),
            }
        }
        let up = c.dirs[0].pump(&c.inner, &c.outer);
        let down = c.dirs[1].pump(&c.outer, &c.inner);
        let stats = &mut self.upstreams[c.upstream].stats;
        // Bytes delivered count even when that direction or the other failed in the same pass,
        // as for an upstream that answers and closes at once (tests/operator.rs:
        // metrics_parse_and_count_what_happened).
        let ((u, up), (d, down)) = (up, down);
        stats.bytes_up += u;
        stats.bytes_down += d;
        if u + d > 0 {
            c.last_active = Instant::now();
        }
        if up.is_err() || down.is_err() {
            return self.close(epoll, id);
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

    /// When [`Forwarder::sweep`] should run next (None: no connection to watch).
    pub fn next_sweep(&self) -> Option<Instant> {
        self.next_sweep
    }

    /// Close connections idle longer than the timeout, and outbound connects that got no
    /// answer within the connect timeout, if one is due.
    pub fn sweep(&mut self, epoll: &Epoll) {
        let now = Instant::now();
        if self.next_sweep.is_none_or(|s| s > now) {
            return;
        }
        let (idle, connect) = (self.idle_timeout, self.connect_timeout);
        let limit = move |c: &Conn| c.last_active + if c.connecting { connect } else { idle };
        let due: Vec<(u64, bool)> =
            self.conns.iter().filter(|(_, c)| limit(c) <= now).map(|(id, c)| (*id, c.connecting)).collect();
        for (id, connecting) in due {
            let tried = self.conns[&id].to;
            let up = &mut self.upstreams[self.conns[&id].upstream];
            let engine = up.is_engine();
            let u = &mut up.stats;
            if connecting {
                u.connect_failed += 1;
                if let Some(suppressed) = self.quiet.allow(now) {
                    if engine {
                        tracing::warn!(upstream = %u.upstream, timeout_s = connect.as_secs(), suppressed, "the engine accepted no connection in time: it is stalled or its listen backlog is full");
                    } else {
                        // A dropped SYN fails silently (a firewall, or the unit's IPAddressDeny=:
                        // its filter drops packets, the connect never returns): say where to look.
                        tracing::warn!(
                            upstream = %u.upstream,
                            address = %tried,
                            timeout_s = connect.as_secs(),
                            suppressed,
                            "egress connect timed out: nothing answered; if the unit sets IPAddressDeny=, add this address to IPAddressAllow= (docs/operator-guide.md)"
                        );
                    }
                }
            } else {
                tracing::info!(upstream = %u.upstream, "egress connection closed: idle");
            }
            self.close(epoll, id);
        }
        self.next_sweep = self.conns.values().map(limit).min();
    }

    /// When the next name lookup times out.
    pub fn next_lookup_deadline(&self) -> Option<Instant> {
        self.lookups.values().map(|l| l.deadline).min()
    }

    /// Drop every connection (stop, recycle), waiting ones too.
    pub fn close_all(&mut self, epoll: &Epoll) {
        for u in self.upstreams.iter_mut() {
            u.parked.clear();
        }
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

#[cfg(test)]
mod tests {
    use super::{denied, fd_budget, FDS_PER_CONNECTION, FD_RESERVE};
    use std::net::IpAddr;

    fn ip(s: &str) -> IpAddr {
        s.parse().expect("ip")
    }

    #[test]
    fn the_deny_set() {
        let own = [ip("203.0.113.7")];
        for (a, why) in [
            ("127.0.0.1", "loopback"),
            ("127.5.6.7", "loopback"),
            ("169.254.169.254", "link-local"),
            ("0.0.0.0", "unspecified"),
            ("0.1.2.3", "this network"),
            ("224.0.0.1", "multicast"),
            ("255.255.255.255", "broadcast"),
            ("10.1.2.3", "private"),
            ("172.16.0.1", "private"),
            ("192.168.1.1", "private"),
            ("100.64.0.1", "private"),
            ("203.0.113.7", "own addresses"),
            ("::1", "loopback"),
            ("::", "unspecified"),
            ("ff02::1", "multicast"),
            ("fe80::1", "link-local"),
            ("fc00::1", "unique local"),
            ("::ffff:127.0.0.1", "loopback"),
            ("::ffff:169.254.169.254", "link-local"),
            // IPv4 inside IPv6 is judged as that IPv4 address: compatible, NAT64, 6to4.
            ("::127.0.0.1", "loopback"),
            ("::a9fe:a9fe", "link-local"),
            ("64:ff9b::a9fe:a9fe", "link-local"),
            ("64:ff9b::7f00:1", "loopback"),
            ("2002:7f00:1::1", "loopback"),
            ("2002:a9fe:a9fe::", "link-local"),
            ("2002:a01:203::1", "private"),
            ("::ffff:203.0.113.7", "own addresses"),
            ("64:ff9b::cb00:7107", "own addresses"),
            // Transition and special-purpose prefixes are refused outright.
            ("2001:0:a9fe:a9fe::80ff:fffe", "Teredo"),
            ("64:ff9b:1::7f00:1", "NAT64"),
            ("64:ff9b:1:7f00:0:100::", "NAT64"),
            ("::ffff:0:7f00:1", "IPv4-translated"),
            ("::ffff:0:a9fe:a9fe", "IPv4-translated"),
            ("fec0::1", "site-local"),
            ("2001:20::1", "ORCHID"),
            ("2001:10::1", "ORCHID"),
        ] {
            let r = denied(ip(a), &own, false);
            assert!(r.is_some_and(|r| r.contains(why)), "{a}: {r:?}");
        }
        // Private ranges pass where the upstream allows them; the rest never does.
        assert_eq!(denied(ip("10.1.2.3"), &own, true), None);
        assert_eq!(denied(ip("fc00::1"), &own, true), None);
        assert!(denied(ip("127.0.0.1"), &own, true).is_some());
        assert!(denied(ip("169.254.169.254"), &own, true).is_some());
        // Public addresses pass.
        assert_eq!(denied(ip("198.51.100.10"), &own, false), None);
        assert_eq!(denied(ip("2001:db8::1"), &own, false), None);
        assert_eq!(denied(ip("100.128.0.1"), &own, false), None);
        assert_eq!(denied(ip("64:ff9b::c633:640a"), &own, false), None, "NAT64 of a public address");
        assert_eq!(denied(ip("2002:c633:640a::1"), &own, false), None, "6to4 of a public address");
        assert_eq!(denied(ip("::ffff:198.51.100.10"), &own, false), None);
    }

    #[test]
    fn the_fd_budget_keeps_a_reserve() {
        assert_eq!(fd_budget(1024, 0), (1024 - FD_RESERVE) / FDS_PER_CONNECTION);
        assert_eq!(fd_budget(65536, 2), (65536 - FD_RESERVE - 6) / 6);
        // The reserve grows with the routes: 250 upstreams need 750 more fds kept free.
        assert_eq!(fd_budget(1024, 251), (1024 - FD_RESERVE - 753) / 6);
        assert_eq!(fd_budget(1000, 251), 1);
        assert_eq!(fd_budget(20000, 251), (20000 - FD_RESERVE - 753) / 6);
        // Below the reserve: one connection, never zero (the node still gets its gateway).
        assert_eq!(fd_budget(100, 1), 1);
    }

    /// Out of fds with no connection waiting, a wake-up of the listener ends: accept4 answers
    /// EMFILE whether or not one waits, so freeing the spare and trying again would go round
    /// for ever. Run in a child: the fd limit and the exhaustion are the whole process's.
    #[test]
    fn out_of_fds_with_nothing_waiting_ends_the_wake_up() {
        use super::{Forwarder, Upstream};
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        use std::time::{Duration, Instant};
        // SAFETY: the child runs only this test's code and exits with exit_now; glibc's fork
        // keeps malloc usable in it though the test harness has other threads.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => {
                let code = (|| {
                    use nix::sys::resource::{getrlimit, setrlimit, Resource};
                    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
                    setrlimit(Resource::RLIMIT_NOFILE, 256.min(hard), hard).ok()?;
                    let l = std::net::TcpListener::bind("127.0.0.1:0").ok()?;
                    l.set_nonblocking(true).ok()?;
                    let to = l.local_addr().ok()?;
                    let epoll = nix::sys::epoll::Epoll::new(nix::sys::epoll::EpollCreateFlags::EPOLL_CLOEXEC).ok()?;
                    let up = Upstream::new("gw.test".into(), to.port(), Some(to), false, l.into());
                    let mut fw =
                        Forwarder::new(vec![up], 8, Duration::from_secs(60), Duration::from_secs(5), &epoll).ok()?;
                    fw.spare.as_ref()?;
                    // Every fd taken: the spare is the only one the forwarder can free.
                    let mut held = Vec::new();
                    while let Ok(fd) = nix::fcntl::open(
                        "/dev/null",
                        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
                        nix::sys::stat::Mode::empty(),
                    ) {
                        held.push(fd);
                    }
                    fw.accept(&epoll, 0);
                    // Returned, with the spare taken again and nothing counted as refused.
                    Some(fw.spare.is_some() && fw.upstreams[0].stats.refused_over_limit == 0)
                })();
                crate::os::sys::exit_now(match code {
                    Some(true) => 0,
                    Some(false) => 3,
                    None => 2,
                })
            }
            nix::unistd::ForkResult::Parent { child } => {
                let deadline = Instant::now() + Duration::from_secs(20);
                let status = loop {
                    match waitpid(child, Some(WaitPidFlag::WNOHANG)).expect("waitpid") {
                        WaitStatus::StillAlive if Instant::now() < deadline => {
                            std::thread::sleep(Duration::from_millis(20))
                        }
                        WaitStatus::StillAlive => {
                            let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                            let _ = waitpid(child, None);
                            panic!("accept went round and round at EMFILE with nothing waiting");
                        }
                        st => break st,
                    }
                };
                assert_eq!(status, WaitStatus::Exited(child, 0), "2: the setup failed; 3: the spare or a count");
            }
        }
    }
}
