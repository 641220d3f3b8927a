//! The engine's readiness check, as a component of the event loop: from the engine's start,
//! a TCP connect to its port inside the cell (or an HTTP GET answering 200) every
//! READY_INTERVAL until its deadline, through a non-blocking socket in the engine's network
//! namespace that the loop watches under [`TOKEN_READY`]. It offers `handle` (the socket is
//! ready), a next deadline and `sweep` (the next try, or the timeout), and answers with an
//! [`Verdict`] the supervisor acts on. Once the engine is ready, the same check is made again
//! every [`RECHECK_INTERVAL`] while it runs (a try that fails or takes over
//! [`RECHECK_TIMEOUT`] marks it as not answering, the next that passes as answering again):
//! `ctl ready` and status's `ready` follow it; a recheck never stops or restarts anything.
//! An HTTP recheck waits while the engine serves the node (a request of the node's waits for
//! its answer, or the engine sent a byte on one of its connections within [`SERVING_QUIET`]),
//! for at most [`HOLD_MAX`] in a row: the last verdict stands meanwhile.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::sys::socket::{connect, getsockopt, sockopt, SockaddrIn};

use crate::config::{Config, ReadyKind};
use crate::sandbox::cell::Cell;

pub(super) const TOKEN_READY: u64 = 4 << 56;
/// Time between readiness attempts.
pub(super) const READY_INTERVAL: Duration = Duration::from_millis(100);
/// Time between the checks of an engine that was ready (found by review: checked once per
/// start, an engine that closed its port later stayed "ready" for `ctl ready`).
pub(super) const RECHECK_INTERVAL: Duration = Duration::from_secs(5);
/// How long one recheck may take before it counts as not answering.
pub(super) const RECHECK_TIMEOUT: Duration = Duration::from_secs(5);
/// A connection of the node's to the engine on which the engine sent a byte this recently is
/// being answered (the recheck waits): longer than the 15 s between the keep-alive pings
/// llama-cpp-python's server sends while a streamed answer is still being computed.
pub(super) const SERVING_QUIET: Duration = Duration::from_secs(30);
/// The longest the rechecks wait in a row while the engine serves the node: past it they come
/// at their pace again, so that a wedged engine is told within this and a recheck's interval
/// and timeout, whatever the node does (found by review: a node that kept a request waiting,
/// or the engine's buffered or cheap answers coming, held them off for as long as it liked).
pub(super) const HOLD_MAX: Duration = Duration::from_secs(60);

#[derive(Debug, PartialEq, Eq)]
enum Stage {
    Connecting,
    Reading,
}

#[derive(Debug)]
struct Check {
    fd: Option<OwnedFd>,
    stage: Stage,
    buf: Vec<u8>,
    next_try: Instant,
    deadline: Instant,
    /// When the check began (the engine's start): readiness latency is measured from here.
    began: Instant,
    /// What the last try saw ("connection refused", "HTTP/1.1 503 Service Unavailable"), for
    /// the timeout's message.
    last: String,
    /// A check of an engine that was ready: one try at a time, each until its `deadline`, and
    /// never a verdict.
    recheck: bool,
    /// Since when the rechecks have waited for the node's requests, in a row.
    held_since: Option<Instant>,
    /// The last recheck due was put off for them (and none has been tried since).
    waiting: bool,
}

impl Check {
    /// Whether an HTTP recheck due now waits, the engine serving the node or not. The node's
    /// requests in flight come first: a recheck would compete with them (found by CI:
    /// llama-cpp-python's server cut a streamed answer short to serve it, and an engine
    /// serving one request at a time answers it only after them, so a busy engine was told as
    /// not answering), but for [`HOLD_MAX`] in a row at most: then rechecks come at their pace
    /// again until the engine serves the node no more. A TCP recheck, a connect the kernel
    /// answers, competes with nothing and never waits.
    /// `confirmed`: asked just before the request goes (handle); only then does an engine
    /// serving nobody end the hold (found by review: a node idle when sweep() sampled and busy
    /// when handle() asked again started a fresh hold every 5 s, and no request ever went).
    fn waits_for(&mut self, now: Instant, http: bool, serving: bool, confirmed: bool) -> bool {
        self.waiting = if !http || !serving {
            if confirmed || !http {
                self.held_since = None;
            }
            false
        } else {
            now.saturating_duration_since(*self.held_since.get_or_insert(now)) < HOLD_MAX
        };
        self.waiting
    }
}

/// What a check came to.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Verdict {
    /// The engine answered (its latency is kept: [`Readiness::last_ms`]).
    Ready,
    /// It did not within `engine.ready.timeout_s`: the stop's exit is 4 (said and logged).
    TimedOut,
}

#[derive(Debug, Default)]
pub(super) struct Readiness {
    check: Option<Check>,
    /// How long the engine's last start took to pass its readiness check, in milliseconds.
    last_ms: Option<f64>,
    /// What the last recheck of the ready engine saw, while it does not answer.
    not_answering: Option<String>,
    /// When the engine last answered its check (its start's or a recheck), since its start:
    /// how old the verdict that `ready` stands on is (a held recheck keeps the last verdict
    /// for up to ~70 s: the status shows its age).
    answered_at: Option<Instant>,
}

impl Readiness {
    /// The engine just started: check it from now until `engine.ready.timeout_s`.
    pub(super) fn begin(&mut self, cfg: &Config) {
        let now = Instant::now();
        self.check = Some(Check {
            fd: None,
            stage: Stage::Connecting,
            buf: Vec::new(),
            next_try: now,
            deadline: now + Duration::from_secs(cfg.engine.ready().timeout_s),
            began: now,
            last: "no answer yet".to_string(),
            recheck: false,
            held_since: None,
            waiting: false,
        });
        self.not_answering = None;
        self.answered_at = None;
    }

    /// A check is under way (the engine started and has not answered yet).
    pub(super) fn pending(&self) -> bool {
        self.check.as_ref().is_some_and(|c| !c.recheck)
    }

    /// What the last recheck of the ready engine saw, while it does not answer.
    pub(super) fn not_answering(&self) -> Option<&str> {
        self.not_answering.as_deref()
    }

    pub(super) fn last_ms(&self) -> Option<f64> {
        self.last_ms
    }

    /// How long ago the engine last answered its check, since its start; none before it did.
    pub(super) fn answered_ago(&self, now: Instant) -> Option<Duration> {
        self.answered_at.map(|t| now.saturating_duration_since(t))
    }

    /// How long the rechecks have waited in a row for the node's requests, while they wait
    /// (less than [`HOLD_MAX`]); none while they come at their pace.
    pub(super) fn rechecks_waiting(&self, now: Instant) -> Option<Duration> {
        let c = self.check.as_ref().filter(|c| c.recheck && c.waiting)?;
        Some(now.saturating_duration_since(c.held_since?))
    }

    /// The engine stopped or exited: no check.
    pub(super) fn cancel(&mut self, epoll: &Epoll) {
        self.close_try(epoll);
        self.check = None;
        self.not_answering = None;
        self.answered_at = None;
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        let c = self.check.as_ref()?;
        Some(match (c.fd.is_none(), c.recheck) {
            (true, true) => c.next_try,
            (true, false) => c.deadline.min(c.next_try),
            (false, _) => c.deadline,
        })
    }

    /// The timeout, or the next try when due. `serving`: whether the engine is serving the
    /// node's requests now (crate::egress::Forwarder::engine_serving), asked only when a
    /// recheck is due.
    pub(super) fn sweep(
        &mut self,
        now: Instant,
        serving: impl FnOnce() -> bool,
        cfg: &Config,
        cell: &Cell,
        epoll: &Epoll,
    ) -> Option<Verdict> {
        let c = self.check.as_mut()?;
        if c.recheck {
            if c.fd.is_some() && c.deadline <= now {
                self.missed(format!("no answer within {} s", RECHECK_TIMEOUT.as_secs()), epoll);
            } else if c.fd.is_none() && c.next_try <= now {
                let http = cfg.engine.ready().kind == ReadyKind::Http;
                if c.waits_for(now, http, http && serving(), false) {
                    c.next_try = now + RECHECK_INTERVAL;
                    tracing::debug!(role = "engine", "readiness recheck postponed: the engine is serving the node");
                } else {
                    self.try_connect(cfg, cell, epoll);
                }
            }
            return None;
        }
        if c.deadline <= now {
            // A try still open at the deadline is the last one (found by review: the message
            // named an earlier try's refusal).
            let last = match (&c.fd, &c.stage) {
                (None, _) => c.last.clone(),
                (Some(_), Stage::Connecting) => "the connect did not complete".to_string(),
                (Some(_), Stage::Reading) => "connected, but no HTTP status line came".to_string(),
            };
            let ready = cfg.engine.ready();
            let port = cfg.engine.port.unwrap_or(0);
            let what = match ready.kind {
                ReadyKind::Http => format!("GET http://127.0.0.1:{port}{} answering 200", ready.path),
                ReadyKind::Tcp => format!("a TCP connect to 127.0.0.1:{port}"),
            };
            tracing::error!(timeout_s = ready.timeout_s, %last, "engine not ready in time");
            crate::logging::log::say(&format!(
                "the engine did not become ready within {} s ({what}); last try: {}\n  \
                 next: check the engine's own output above (a model still loading needs a larger \
                 engine.ready.timeout_s; a wrong engine.port or --port never answers)",
                ready.timeout_s, last
            ));
            self.cancel(epoll);
            return Some(Verdict::TimedOut);
        }
        if c.fd.is_none() && c.next_try <= now {
            self.try_connect(cfg, cell, epoll);
        }
        None
    }

    /// A new try: a connect from inside the engine's network namespace, watched by the loop.
    fn try_connect(&mut self, cfg: &Config, cell: &Cell, epoll: &Epoll) {
        let port = cfg.engine.port.unwrap_or(0) as u16;
        let Some(c) = self.check.as_mut() else { return };
        let now = Instant::now();
        if c.recheck {
            c.next_try = now + RECHECK_INTERVAL;
            c.deadline = now + RECHECK_TIMEOUT;
        } else {
            c.next_try = now + READY_INTERVAL;
        }
        let Ok(fd) = cell.engine_socket() else { return };
        match connect(fd.as_raw_fd(), &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))) {
            Ok(()) | Err(Errno::EINPROGRESS) => {}
            Err(e) => {
                c.last = format!("connect: {}", e.desc());
                let why = c.last.clone();
                return self.missed(why, epoll);
            }
        }
        if epoll.add(fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLOUT, TOKEN_READY)).is_ok() {
            c.stage = Stage::Connecting;
            c.buf.clear();
            c.fd = Some(fd);
        }
    }

    /// This try is over; the next comes after READY_INTERVAL (RECHECK_INTERVAL once ready).
    fn close_try(&mut self, epoll: &Epoll) {
        if let Some(fd) = self.check.as_mut().and_then(|c| c.fd.take()) {
            let _ = epoll.delete(fd.as_fd());
        }
    }

    /// This try failed, saying `why`. A recheck's failure marks the engine as not answering
    /// (logged when it starts); a start's check just tries again.
    fn missed(&mut self, why: String, epoll: &Epoll) {
        self.close_try(epoll);
        if !self.check.as_ref().is_some_and(|c| c.recheck) {
            return;
        }
        if self.not_answering.is_none() {
            // The engine's words, escaped like its own output (it could forge a line).
            tracing::warn!(role = "engine", last = %crate::logging::log::clean(why.as_bytes()), "the engine stopped answering its readiness check: not ready until it does");
        }
        self.not_answering = Some(why);
    }

    fn ready(&mut self, epoll: &Epoll) -> Option<Verdict> {
        self.close_try(epoll);
        let c = self.check.as_mut()?;
        // The first answer since the start is the verdict; then the engine is checked again.
        let first = !c.recheck;
        self.answered_at = Some(Instant::now());
        c.recheck = true;
        c.next_try = Instant::now() + RECHECK_INTERVAL;
        c.last = String::new();
        if !first {
            if self.not_answering.take().is_some() {
                tracing::info!(role = "engine", "the engine answers its readiness check again");
            }
            return None;
        }
        self.last_ms = Some(c.began.elapsed().as_secs_f64() * 1000.0);
        tracing::info!(role = "engine", ready_ms = self.last_ms, "engine ready");
        Some(Verdict::Ready)
    }

    /// The try's socket is ready: connected (then, for HTTP, the request is sent), or the
    /// answer's bytes arrived.
    pub(super) fn handle(&mut self, serving: impl FnOnce() -> bool, cfg: &Config, epoll: &Epoll) -> Option<Verdict> {
        let http = cfg.engine.ready().kind == ReadyKind::Http;
        let c = self.check.as_mut()?;
        let fd = c.fd.as_ref()?;
        match c.stage {
            Stage::Connecting => {
                match getsockopt(fd, sockopt::SocketError) {
                    Ok(0) => {}
                    Ok(e) => {
                        c.last = format!("connect: {}", Errno::from_raw(e).desc());
                        let why = c.last.clone();
                        self.missed(why, epoll);
                        return None;
                    }
                    Err(e) => {
                        c.last = format!("connect: {}", e.desc());
                        let why = c.last.clone();
                        self.missed(why, epoll);
                        return None;
                    }
                }
                if !http {
                    return self.ready(epoll);
                }
                // Asked again before the request goes (found by review): a request of the
                // node's may have reached the engine since the recheck was decided. Not a miss.
                let now = Instant::now();
                if c.recheck && c.waits_for(now, http, serving(), true) {
                    c.next_try = now + RECHECK_INTERVAL;
                    self.close_try(epoll);
                    tracing::debug!(role = "engine", "readiness recheck postponed: the engine is serving the node");
                    return None;
                }
                let fd = c.fd.as_ref()?;
                let path = &cfg.engine.ready().path;
                let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nUser-Agent: sealnode-readiness\r\n\r\n");
                if nix::unistd::write(fd, req.as_bytes()).ok() != Some(req.len()) {
                    self.missed("could not send the request".to_string(), epoll);
                    return None;
                }
                c.stage = Stage::Reading;
                let _ = epoll.modify(fd.as_fd(), &mut EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_READY));
            }
            Stage::Reading => {
                let mut b = [0u8; 512];
                match nix::unistd::read(fd, &mut b) {
                    Ok(0) | Err(_) => {
                        c.last = "the connection closed before an HTTP status line".to_string();
                        let why = c.last.clone();
                        self.missed(why, epoll);
                        return None;
                    }
                    Ok(n) => c.buf.extend_from_slice(&b[..n]),
                }
                if let Some(end) = c.buf.windows(2).position(|w| w == b"\r\n") {
                    let line = String::from_utf8_lossy(&c.buf[..end]).into_owned();
                    if line.split_whitespace().nth(1) == Some("200") {
                        return self.ready(epoll);
                    }
                    // The engine's words, escaped like its own output (it could forge a line).
                    tracing::debug!(status = %crate::logging::log::clean(line.as_bytes()), "engine not ready yet");
                    c.last = format!("answered {:?}", line.chars().take(120).collect::<String>());
                    let why = c.last.clone();
                    self.missed(why, epoll);
                    return None;
                }
                if c.buf.len() > 4096 {
                    c.last = "answered 4 KiB without an HTTP status line".to_string();
                    let why = c.last.clone();
                    self.missed(why, epoll);
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recheck(now: Instant) -> Check {
        Check {
            fd: None,
            stage: Stage::Connecting,
            buf: Vec::new(),
            next_try: now,
            deadline: now,
            began: now,
            last: String::new(),
            recheck: true,
            held_since: None,
            waiting: false,
        }
    }

    /// When the recheck's request goes, each 5 s tick asked first as sweep() asks (`at_sweep`)
    /// and then, if not held, again as handle() asks just before the request (`at_handle`).
    fn requests_sent(at_sweep: impl Fn(u64) -> bool, at_handle: impl Fn(u64) -> bool) -> Vec<u64> {
        let t0 = Instant::now();
        let mut c = recheck(t0);
        let mut sent = Vec::new();
        for s in (0..=120).step_by(5) {
            let now = t0 + Duration::from_secs(s);
            if !c.waits_for(now, true, at_sweep(s), false) && !c.waits_for(now, true, at_handle(s), true) {
                sent.push(s);
            }
        }
        sent
    }

    /// Held 60 s in a row at most, however the node's serving falls on the two questions
    /// (found by review: a node idle at sweep() and busy at handle() started a fresh hold each
    /// time, and no request ever went); then one every 5 s while it lasts.
    #[test]
    fn a_recheck_is_held_for_60_s_in_a_row_at_most() {
        let from_60: Vec<u64> = (60..=120).step_by(5).collect();
        assert_eq!(requests_sent(|_| true, |_| true), from_60, "a steady serve");
        assert_eq!(requests_sent(|_| false, |_| true), from_60, "idle when sampled, busy when asked again");
        // Not serving at all: every tick; a TCP check is never held.
        assert_eq!(requests_sent(|_| false, |_| false).len(), 25);
        let t0 = Instant::now();
        assert!(!recheck(t0).waits_for(t0, false, true, true));
        // The node done (confirmed just before the request): a new hold may begin later.
        assert_eq!(
            requests_sent(|s| s < 30, |s| s < 30),
            (30..=120).step_by(5).collect::<Vec<_>>(),
            "held while serving, then every tick"
        );
        // A second row after a pause: held afresh for its own 60 s (found by review: a hold
        // never ended by an idle confirmation held nothing of any later row).
        let serving = |s: u64| !(30..60).contains(&s);
        let mut second: Vec<u64> = (30..60).step_by(5).collect();
        second.push(120);
        assert_eq!(requests_sent(serving, serving), second, "a second row, held from its start");
    }

    /// The status says how long the rechecks have waited, only while they wait: from the
    /// hold's start, none past 60 s in a row, and none once a recheck goes.
    #[test]
    fn a_status_shows_the_rechecks_wait_while_it_lasts() {
        let t0 = Instant::now();
        let mut r = Readiness { check: Some(recheck(t0)), ..Readiness::default() };
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(r.rechecks_waiting(at(0)), None, "nothing asked yet");
        let c = r.check.as_mut().expect("check");
        assert!(c.waits_for(at(0), true, true, false));
        assert!(c.waits_for(at(55), true, true, false));
        assert_eq!(r.rechecks_waiting(at(57)), Some(Duration::from_secs(57)));
        let c = r.check.as_mut().expect("check");
        assert!(!c.waits_for(at(60), true, true, false), "past 60 s in a row");
        assert_eq!(r.rechecks_waiting(at(61)), None, "a recheck goes: not waiting");
        // Not serving (asked at the sweep, not yet confirmed): the recheck goes.
        let mut r = Readiness { check: Some(recheck(t0)), ..Readiness::default() };
        let c = r.check.as_mut().expect("check");
        assert!(c.waits_for(at(0), true, true, false));
        assert!(!c.waits_for(at(5), true, false, false));
        assert_eq!(r.rechecks_waiting(at(6)), None);
        // Before the engine's first answer: no recheck, nothing waits.
        let mut start = recheck(t0);
        start.recheck = false;
        start.held_since = Some(t0);
        start.waiting = true;
        let r = Readiness { check: Some(start), ..Readiness::default() };
        assert_eq!(r.rechecks_waiting(at(1)), None);
        assert_eq!(r.answered_ago(at(1)), None);
    }
}
