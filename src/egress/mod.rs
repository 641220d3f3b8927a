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
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::sys::socket::{accept4, getsockopt, sockopt, SockFlag};
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
    /// The engine route: connections that waited for the engine to be ready (all of them,
    /// forwarded or not), and those closed because it was not ready within
    /// `cell.engine_hold_s`.
    pub held: u64,
    pub hold_expired: u64,
    /// The engine route: requests the engine dropped unanswered (it crashed or was killed)
    /// sent again to it once it was ready again (`cell.engine_replay_kb`).
    pub replayed: u64,
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
    /// The engine route: the node's connections waiting for the engine to be ready, each
    /// until its deadline (`cell.engine_hold_s`).
    held: Vec<Held>,
    pub stats: Stats,
}

/// A node's connection waiting for the engine: new, or one whose request the engine dropped
/// unanswered (with that request, to be sent again).
#[derive(Debug)]
struct Held {
    inner: OwnedFd,
    until: Instant,
    /// Not before then: a connection the engine dropped waits a moment, for the engine's exit
    /// to be seen first (else it would go straight back to an engine that is gone).
    not_before: Option<Instant>,
    record: Option<Unanswered>,
}

/// How long a connection the engine dropped waits before it may go to the engine again.
const REPLAY_SETTLE: Duration = Duration::from_millis(250);

/// Whether the engine's drop of connection `c` sends its request again: the engine route with
/// a record; the node still there; and either a request to send again whose connect failed,
/// or a connection the engine never sent a byte on (none taken, none in the pipe, none waiting
/// in the socket) with the node's bytes all kept.
fn replayable(c: &Conn) -> bool {
    let Some(r) = c.record.as_ref() else { return false };
    if c.gone[0] {
        return false;
    }
    if c.connecting {
        return !c.dirs[0].first.is_empty();
    }
    r.may_replay() && c.dirs[1].taken == 0 && c.dirs[1].buffered == 0 && !conn::has_bytes(&c.outer)
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
            held: Vec::new(),
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
            held: Vec::new(),
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

mod conn;
mod deny;
mod lookup;
#[cfg(test)]
mod tests;

use conn::{connect_nonblocking, interest, open_outer, Conn, Dir, Fault, Unanswered};
pub use deny::denied;
use deny::own_addresses;
use lookup::{spawn_lookup, Lookup};

fn spare_fd() -> Option<OwnedFd> {
    nix::fcntl::open("/dev/null", OFlag::O_RDONLY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty()).ok()
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
    /// The engine answered its readiness check and no stop is under way: the node's
    /// connections to it are forwarded at once; else they wait (`engine_hold`).
    engine_ready: bool,
    /// How long a connection to an engine that is not ready waits (`cell.engine_hold_s`;
    /// zero: none waits, each is forwarded at once).
    engine_hold: Duration,
    /// A request the engine dropped unanswered is sent again if it was no longer than this
    /// (`cell.engine_replay_kb`; zero, or no hold: never).
    engine_replay: usize,
    /// A stop is under way: the engine is not coming back for the node (nothing is sent again).
    stopping: bool,
    /// When the node's last connection to the engine closed (a drain gives the node a moment
    /// after it to pass the answer on).
    engine_closed_at: Option<Instant>,
    /// The counters of upstreams a reload took out, for the totals at the end.
    retired: Vec<Stats>,
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
            engine_ready: false,
            engine_hold: Duration::ZERO,
            engine_replay: 0,
            stopping: false,
            engine_closed_at: None,
            retired: Vec::new(),
        })
    }

    /// A reload's bounds (`cell.egress_max_connections`, `egress_idle_timeout_s`,
    /// `egress_connect_timeout_s`): they hold for every connection from now on, and the next
    /// sweep looks at the open ones with the new timeouts.
    pub fn set_bounds(&mut self, max_per_upstream: usize, idle_timeout: Duration, connect_timeout: Duration) {
        self.max_per_upstream = max_per_upstream;
        self.idle_timeout = idle_timeout;
        self.connect_timeout = connect_timeout;
        self.next_sweep = (!self.conns.is_empty()).then(Instant::now);
    }

    /// A reload's egress, while the node is down and nothing is forwarded: the declared
    /// upstreams are taken out (their listeners given back, in order, for the new ones to keep
    /// where their address stays), and name lookups in flight for them are given up.
    pub fn take_egress(&mut self, epoll: &Epoll) -> Vec<OwnedFd> {
        // Connections name their upstream by index: none may outlive the switch.
        self.close_all(epoll);
        for (_, l) in self.lookups.drain() {
            let _ = epoll.delete(l.pipe.as_fd());
            let _ = nix::sys::signal::kill(l.pid, nix::sys::signal::Signal::SIGKILL);
        }
        for u in &self.upstreams {
            let _ = epoll.delete(u.listener.as_fd());
        }
        let (engine, egress): (Vec<Upstream>, Vec<Upstream>) =
            std::mem::take(&mut self.upstreams).into_iter().partition(Upstream::is_engine);
        self.upstreams = engine;
        // Their counters go on in the upstream of the same name, if the new egress has one
        // (set_egress), else into the totals of those taken out.
        egress
            .into_iter()
            .map(|u| {
                self.retired.push(u.stats);
                u.listener
            })
            .collect()
    }

    /// The new egress upstreams, before the node's way to the engine; every listener is
    /// watched again under its new index.
    pub fn set_egress(&mut self, epoll: &Epoll, mut egress: Vec<Upstream>) -> Result<(), Errno> {
        for u in &mut egress {
            if let Some(i) = self.retired.iter().position(|s| s.upstream == u.stats.upstream) {
                u.stats = self.retired.swap_remove(i);
            }
        }
        let engine = std::mem::take(&mut self.upstreams);
        self.upstreams = egress.into_iter().chain(engine).collect();
        for (i, u) in self.upstreams.iter().enumerate() {
            epoll.add(u.listener.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_LISTENER | i as u64))?;
        }
        let nofile =
            nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).map(|l| l.0).unwrap_or(1024);
        self.max_total = fd_budget(nofile, self.upstreams.len());
        Ok(())
    }

    /// How long the node's connections wait for an engine that is not ready (a reload's
    /// config brings its own).
    pub fn set_engine_hold(&mut self, hold: Duration) {
        self.engine_hold = hold;
    }

    /// The longest request sent again to an engine that dropped it unanswered, in bytes (a
    /// reload's config brings its own; connections open now keep the bound they began with).
    pub fn set_engine_replay(&mut self, bytes: usize) {
        self.engine_replay = bytes;
    }

    /// Whether the engine may be reached now (ready, and no stop under way). Once it may,
    /// the connections that waited for it are forwarded.
    pub fn set_engine_ready(&mut self, epoll: &Epoll, ready: bool) {
        if ready == self.engine_ready {
            return;
        }
        self.engine_ready = ready;
        self.release_held(epoll);
    }

    /// While the engine is ready, the connections waiting for it go through (those it dropped
    /// once their settle time has passed), the requests it left unanswered sent first.
    fn release_held(&mut self, epoll: &Epoll) {
        let Some(i) = self.upstreams.iter().position(Upstream::is_engine).filter(|_| self.engine_ready) else {
            return;
        };
        let Some(addr) = self.upstreams[i].connect else { return };
        let now = Instant::now();
        let (go, stay): (Vec<Held>, Vec<Held>) = std::mem::take(&mut self.upstreams[i].held)
            .into_iter()
            .partition(|h| h.not_before.is_none_or(|t| t <= now));
        self.upstreams[i].held = stay;
        // Said for those that waited for a start; one the engine refused or dropped says so
        // when it does (at most once a second).
        let waited = go.iter().filter(|h| h.not_before.is_none()).count();
        if waited > 0 {
            tracing::info!(connections = waited, "the engine is ready: the node's waiting connections go through");
        }
        for h in go {
            // A node that gave up on its request while it waited is not answered by sending
            // it (again: found by review; its own retry would run it twice). One that had
            // half-closed after sending cannot be told from one that left.
            if conn::peer_gone(&h.inner, h.record.as_ref().is_some_and(|r| r.node_done)) {
                let u = &mut self.upstreams[i].stats;
                u.hold_expired += 1;
                tracing::info!(upstream = %u.upstream, "the node closed a connection waiting for the engine: not sent");
                continue;
            }
            self.connect_out(epoll, i, h.inner, addr, h.record);
        }
    }

    /// The node's connections to the engine in flight (forwarded, not those waiting).
    pub fn engine_active(&self) -> usize {
        self.upstreams.iter().find(|u| u.is_engine()).map_or(0, |u| u.stats.active)
    }

    /// The node's connections waiting for the engine (cell.engine_hold_s).
    pub fn engine_waiting(&self) -> usize {
        self.upstreams.iter().find(|u| u.is_engine()).map_or(0, |u| u.held.len())
    }

    /// The engine is serving the node: one of the node's connections to it (forwarded, not
    /// waiting) is being served ([`conn::being_served`]). The readiness recheck waits
    /// meanwhile, within its bound (supervisor::readiness).
    pub fn engine_serving(&self, now: Instant, quiet: Duration) -> bool {
        self.conns.values().any(|c| self.upstreams[c.upstream].is_engine() && conn::being_served(c, now, quiet))
    }

    /// When the node's last connection to the engine closed (None: none has yet).
    pub fn engine_closed_at(&self) -> Option<Instant> {
        self.engine_closed_at
    }

    /// When the first connection waiting for the engine gives up, or (the engine being ready)
    /// one it dropped may go to it again.
    pub fn next_hold_deadline(&self) -> Option<Instant> {
        let ready = self.engine_ready;
        self.upstreams
            .iter()
            .flat_map(|u| {
                u.held.iter().map(move |h| h.not_before.filter(|_| ready).map_or(h.until, |t| t.min(h.until)))
            })
            .min()
    }

    /// Connections that waited for the engine as long as they may are closed (as a connection
    /// to an engine that is down always was); those it dropped go to it again once their
    /// settle time has passed, if it is ready.
    pub fn hold_timers(&mut self, epoll: &Epoll) {
        let now = Instant::now();
        for u in self.upstreams.iter_mut() {
            let before = u.held.len();
            u.held.retain(|h| h.until > now);
            let expired = before - u.held.len();
            if expired > 0 {
                u.stats.hold_expired += expired as u64;
                if let Some(suppressed) = self.quiet.allow(now) {
                    tracing::warn!(upstream = %u.stats.upstream, closed = expired, hold_s = self.engine_hold.as_secs(), suppressed, "the engine was not ready in time: the node's waiting connections are closed (cell.engine_hold_s)");
                }
            }
        }
        self.release_held(epoll);
    }

    /// Counters of the declared egress upstreams.
    pub fn stats(&self) -> Vec<Stats> {
        self.upstreams.iter().filter(|u| !u.is_engine()).map(|u| u.stats.clone()).collect()
    }

    /// Counters of the egress upstreams a reload took out (none declared them since).
    pub fn retired(&self) -> &[Stats] {
        &self.retired
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
                // Which of the connection's sockets epoll says is readable (0: the node's).
                let mut readable = [false; 2];
                readable[(token & 1) as usize] = events.contains(EpollFlags::EPOLLIN);
                self.pump(epoll, id, readable);
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
        // The engine's side went with the node's request unanswered (or before it connected):
        // the node's side waits for the engine, as in `pump`.
        if side == 1 && !self.stopping && replayable(c) {
            return self.requeue(epoll, id);
        }
        if error || c.connecting {
            return self.close(epoll, id);
        }
        let fd = if side == 0 { &c.inner } else { &c.outer };
        let _ = epoll.delete(fd.as_fd());
        c.gone[side] = true;
        // Nothing can be delivered to that side any more: stop reading the other side (there
        // is nowhere to put its bytes). What that side sent and its socket still holds goes on
        // being read, driven by the other side's events, to its end: a hang-up says it sends
        // no more, not that all was read (found by review: a full pipe lost the rest).
        c.dirs[1 - side].eof = true;
        c.dirs[1 - side].shut = true;
        c.dirs[1 - side].buffered = 0;
        if c.gone[1 - side] || (c.dirs[side].eof && !c.dirs[side].pending()) {
            self.close(epoll, id);
        }
    }

    /// Connections held now, all upstreams together (parked and waiting ones included).
    fn held(&self) -> usize {
        self.upstreams.iter().map(|u| u.stats.active + u.parked.len() + u.held.len()).sum()
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
            if u.stats.active + u.parked.len() + u.held.len() >= self.max_per_upstream {
                self.refuse(i, "per upstream");
                continue;
            }
            if self.held() >= self.max_total {
                self.refuse(i, "fd budget");
                continue;
            }
            let u = &mut self.upstreams[i];
            // An engine that is not ready (starting, restarting, loading its model, or a stop
            // draining): the connection waits for it, as long as the hold allows.
            if u.is_engine() && !self.engine_ready && !self.engine_hold.is_zero() {
                u.stats.held += 1;
                u.held.push(Held { inner, until: Instant::now() + self.engine_hold, not_before: None, record: None });
                continue;
            }
            match u.known_address() {
                Some(addr) => self.connect_out(epoll, i, inner, addr, None),
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
                    self.connect_out(epoll, i, inner, addr, None);
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

    /// When the next name lookup times out.
    pub fn next_lookup_deadline(&self) -> Option<Instant> {
        self.lookups.values().map(|l| l.deadline).min()
    }

    /// Connect the node's connection `inner` out to `addr` for upstream `i`; on the engine
    /// route, with what the engine left unanswered on it before (`record`), sent first.
    fn connect_out(&mut self, epoll: &Epoll, i: usize, inner: OwnedFd, addr: SocketAddr, record: Option<Unanswered>) {
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
        let (Ok(mut d0), Ok(d1)) = (Dir::new(), Dir::new()) else {
            u.stats.connect_failed += 1;
            if let Some(suppressed) = self.quiet.allow(Instant::now()) {
                tracing::warn!(upstream = %u.stats.upstream, suppressed, "egress connection dropped: no pipe for it (out of fds)");
            }
            return;
        };
        // The engine route records what the engine has not answered, while a connection it
        // drops may wait for it (a hold) and the bound allows.
        let replay = u.is_engine() && !self.engine_hold.is_zero() && self.engine_replay > 0;
        // A connection the engine dropped was accepted (and counted) before.
        let again = record.is_some();
        let record = match record {
            Some(mut r) => {
                // Sent first, before anything more from the node (moved, not copied: a
                // refused connect moves them back); counted once connected.
                d0.first = std::mem::take(&mut r.bytes);
                d0.eof = r.node_done;
                Some(r)
            }
            None => replay.then(|| Unanswered::new(self.engine_replay)),
        };
        if !again {
            u.stats.accepted += 1;
        }
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
            node_said: None,
            upstream_said: None,
            record,
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

    fn pump(&mut self, epoll: &Epoll, id: u64, readable: [bool; 2]) {
        let Some(c) = self.conns.get_mut(&id) else { return };
        if c.connecting {
            match getsockopt(&c.outer, sockopt::SocketError) {
                Ok(0) => {
                    c.connecting = false;
                    if let Some(r) = c.record.as_mut().filter(|_| !c.dirs[0].first.is_empty()) {
                        // Sent this once: nothing more is kept, nothing sent again.
                        r.end();
                        let u = &mut self.upstreams[c.upstream].stats;
                        u.replayed += 1;
                        tracing::info!(upstream = %u.upstream, bytes = c.dirs[0].first.len(), "a request the engine dropped unanswered is sent to it again");
                    }
                }
                // A request to send again met a refusal: the engine is gone (the supervisor
                // has not seen its exit yet) or not listening yet; it waits on, within its
                // hold. A new connection refused fails at once, as it always did.
                Ok(e) if !self.stopping && replayable(c) => {
                    // Part of its wait, not a failure (counted once, if the wait runs out).
                    tracing::debug!(error = %Errno::from_raw(e), "the engine refused a request to send again: it waits on");
                    return self.requeue(epoll, id);
                }
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
        let up = c.dirs[0].pump(&c.inner, &c.outer, c.record.as_mut(), readable[0]);
        let down = c.dirs[1].pump(&c.outer, &c.inner, None, readable[1]);
        if c.dirs[1].taken > 0 {
            // The engine sent a byte on this connection: it is never sent again.
            if let Some(r) = c.record.as_mut().filter(|r| r.recording()) {
                r.end();
            }
        }
        let stats = &mut self.upstreams[c.upstream].stats;
        // Bytes delivered count even when that direction or the other failed in the same pass,
        // as for an upstream that answers and closes at once (tests/operator.rs:
        // metrics_parse_and_count_what_happened).
        let ((u, up), (d, down)) = (up, down);
        stats.bytes_up += u;
        stats.bytes_down += d;
        if u + d > 0 {
            let now = Instant::now();
            c.last_active = now;
            c.node_said = if u > 0 { Some(now) } else { c.node_said };
            c.upstream_said = if d > 0 { Some(now) } else { c.upstream_said };
        }
        // The engine dropped the connection (reset, or ended it) with the node's request
        // unanswered, while the node still waits: it is sent again once the engine is ready.
        let engine_dropped = matches!(up, Err(Fault::Dst(_)))
            || matches!(down, Err(Fault::Src(_)))
            || (c.dirs[1].eof && c.dirs[1].buffered == 0);
        let node_failed = matches!(up, Err(Fault::Src(_))) || matches!(down, Err(Fault::Dst(_)));
        if engine_dropped && !node_failed && !self.stopping && replayable(c) {
            return self.requeue(epoll, id);
        }
        if up.is_err() || down.is_err() {
            return self.close(epoll, id);
        }
        c.dirs[0].pass_half_close(&c.outer);
        c.dirs[1].pass_half_close(&c.inner);
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

    /// The engine dropped connection `id` with the node's request unanswered, or refused to
    /// connect: the node's side waits for the engine (its deadline kept from the first drop),
    /// with that request, to be sent again once the engine is ready.
    fn requeue(&mut self, epoll: &Epoll, id: u64) {
        let Some(mut c) = self.conns.remove(&id) else { return };
        for (side, fd) in [&c.inner, &c.outer].into_iter().enumerate() {
            if !c.gone[side] {
                let _ = epoll.delete(fd.as_fd());
            }
        }
        let mut record = c.record.take().unwrap_or_else(|| Unanswered::new(self.engine_replay));
        if !c.dirs[0].first.is_empty() {
            // Its connect was refused: the bytes go back to wait with it.
            record.bytes = std::mem::take(&mut c.dirs[0].first);
        }
        let now = Instant::now();
        let u = &mut self.upstreams[c.upstream];
        u.stats.active -= 1;
        if record.until.is_none() {
            // Waits for the engine from its first drop, up to the hold (counted as waiting).
            u.stats.held += 1;
            if let Some(suppressed) = self.quiet.allow(now) {
                tracing::info!(upstream = %u.stats.upstream, bytes = record.bytes.len(), suppressed, "the engine dropped a request it had not answered: it is sent again once the engine is ready");
            }
        }
        let until = *record.until.get_or_insert(now + self.engine_hold);
        // The node had finished sending: its half-close follows the bytes sent again.
        record.node_done = c.dirs[0].eof;
        u.held.push(Held { inner: c.inner, until, not_before: Some(now + REPLAY_SETTLE), record: Some(record) });
    }

    /// A stop is under way (or over): the engine is not coming back for the node, so nothing
    /// waits to be sent again: those waiting are closed (counted as `hold_expired`), and a
    /// request the engine drops from now on fails at once.
    pub fn set_stopping(&mut self, stopping: bool) {
        self.stopping = stopping;
        if !stopping {
            return;
        }
        for u in self.upstreams.iter_mut() {
            let before = u.held.len();
            u.held.retain(|h| h.record.is_none());
            let closed = before - u.held.len();
            if closed > 0 {
                u.stats.hold_expired += closed as u64;
                tracing::warn!(upstream = %u.stats.upstream, closed, "the cell is stopping: the node's requests waiting to be sent to the engine again are closed");
            }
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
            let u = &mut self.upstreams[c.upstream];
            u.stats.active -= 1;
            if u.is_engine() {
                self.engine_closed_at = Some(Instant::now());
            }
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
                // Bytes not delivered yet: the side they were for is reset, not ended, so it
                // cannot take a cut answer for a whole one (found by review).
                let c = &self.conns[&id];
                for (dir, src, dst) in [(&c.dirs[0], &c.inner, &c.outer), (&c.dirs[1], &c.outer, &c.inner)] {
                    if dir.pending() || (!dir.eof && conn::has_bytes(src)) {
                        conn::reset_on_close(dst);
                    }
                }
            }
            self.close(epoll, id);
        }
        self.next_sweep = self.conns.values().map(limit).min();
    }

    /// Drop every connection (stop, recycle), waiting ones too.
    pub fn close_all(&mut self, epoll: &Epoll) {
        for u in self.upstreams.iter_mut() {
            u.parked.clear();
            if !u.held.is_empty() {
                // A stop ends what waited for the engine: said and counted, never silent.
                tracing::warn!(
                    connections = u.held.len(),
                    "the cell stopped: the node's connections waiting for the engine are closed"
                );
                u.stats.hold_expired += u.held.len() as u64;
                u.held.clear();
            }
        }
        let ids: Vec<u64> = self.conns.keys().copied().collect();
        for id in ids {
            self.close(epoll, id);
        }
    }
}
