//! The control socket's server side, as a component of the event loop: it accepts
//! connections (the peer's uid checked at once), reads each client's one request line without
//! blocking (bytes arrive through epoll under [`TOKEN_CLIENT`]; a deadline bounds the whole
//! request) and hands the parsed request to the supervisor, which answers it. The wire
//! protocol itself is crate::control's (docs/control.md).

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};

use crate::config::Config;
use crate::control::Request;
use crate::error::{Error, Result};

pub(super) const TOKEN_CONTROL: u64 = 5 << 56;
pub(super) const TOKEN_CLIENT: u64 = 6 << 56;

/// A client still sending its request: its stream, the bytes so far, its deadline.
type Client = (UnixStream, Vec<u8>, Instant);

#[derive(Debug)]
pub(super) struct Server {
    listener: UnixListener,
    clients: HashMap<u64, Client>,
    next_client: u64,
    /// Refused control clients are logged once a second at most (any local user can connect).
    quiet: crate::logging::ratelimit::Quiet,
    /// The client waiting for a recycle to finish (answered when the node runs again, or
    /// told why not).
    recycle_waiting: Option<UnixStream>,
    /// The overflow ids as the socket was opened: a peer of the overflow uid is never admitted
    /// where the namespace leaves host uids unmapped (control::peer_refused).
    overflow: crate::os::overflow::Overflow,
}

impl Server {
    /// Bind the socket in sealnode's runtime dir (through its descriptor) and watch it.
    pub(super) fn open(cfg: &Config, runtime_dir: &OwnedFd, epoll: &Epoll) -> Result<Server> {
        let listener = bind(cfg, runtime_dir)?;
        epoll
            .add(listener.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_CONTROL))
            .map_err(|e| Error::errno("epoll_ctl (control)", e))?;
        Ok(Server {
            listener,
            clients: HashMap::new(),
            next_client: 1,
            quiet: crate::logging::ratelimit::Quiet::default(),
            recycle_waiting: None,
            overflow: crate::os::overflow::Overflow::read(),
        })
    }

    /// Accept connections: a peer not among `allowed`, or of an ambiguous uid, is answered
    /// with an error at once, reading nothing; the others' requests are read as their bytes come.
    pub(super) fn accept(&mut self, allowed: &[u32], epoll: &Epoll) {
        // A bounded number per wake-up: a flood of local clients does not keep the loop from
        // its signals and timers (the listener stays readable).
        for _ in 0..crate::control::ACCEPTS_PER_WAKEUP {
            let mut stream = match self.listener.accept() {
                Ok((s, _)) => s,
                Err(_) => return,
            };
            let uid = crate::control::peer_uid(&stream);
            if let Some(why) = crate::control::peer_refused(uid, allowed, &self.overflow) {
                if let Some(suppressed) = self.quiet.allow(Instant::now()) {
                    tracing::warn!(
                        uid = uid.unwrap_or(u32::MAX),
                        suppressed,
                        "control: refused a uid not on the allowlist"
                    );
                }
                crate::control::respond(&mut stream, &crate::control::protocol::Refusal::new(why));
                continue;
            }
            if self.clients.len() >= crate::control::MAX_CLIENTS || stream.set_nonblocking(true).is_err() {
                crate::control::respond(
                    &mut stream,
                    &crate::control::protocol::Refusal::new("busy: too many control connections"),
                );
                continue;
            }
            let id = self.next_client;
            self.next_client += 1;
            if epoll.add(stream.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_CLIENT | id)).is_ok() {
                self.clients.insert(id, (stream, Vec::new(), Instant::now() + crate::control::READ_TIMEOUT));
            }
        }
    }

    /// A client's bytes arrived: its request once the line is whole (the client is then no
    /// longer watched; the supervisor answers on its stream). A malformed one is answered here.
    pub(super) fn handle(&mut self, id: u64, epoll: &Epoll) -> Option<(UnixStream, Request)> {
        let (stream, buf, _) = self.clients.get_mut(&id)?;
        let mut chunk = [0u8; 1024];
        let got = match std::io::Read::read(stream, &mut chunk) {
            Ok(0) => Some(Err("request must be one line ending in a newline".to_string())),
            Ok(n) => crate::control::feed(buf, &chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) => Some(Err(format!("reading the request: {e}"))),
        };
        let request = got?;
        let (mut stream, _, _) = self.clients.remove(&id)?;
        let _ = epoll.delete(stream.as_fd());
        match request {
            Ok(r) => Some((stream, r)),
            Err(e) => {
                crate::control::respond(&mut stream, &crate::control::protocol::Refusal::new(e));
                None
            }
        }
    }

    /// Clients that did not send a whole request in time get an error and are closed.
    pub(super) fn expire(&mut self, now: Instant, epoll: &Epoll) {
        let late: Vec<u64> = self.clients.iter().filter(|(_, (_, _, d))| *d <= now).map(|(id, _)| *id).collect();
        for id in late {
            if let Some((mut s, _, _)) = self.clients.remove(&id) {
                let _ = epoll.delete(s.as_fd());
                crate::control::respond(
                    &mut s,
                    &crate::control::protocol::Refusal::new("timed out waiting for the request line"),
                );
            }
        }
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.clients.values().map(|(_, _, d)| *d).min()
    }

    /// A recycle's client waits for its end.
    pub(super) fn await_recycle(&mut self, stream: UnixStream) {
        self.recycle_waiting = Some(stream);
    }

    pub(super) fn recycle_waiting(&self) -> bool {
        self.recycle_waiting.is_some()
    }

    /// The recycle ended (or never will): answer its client, if one waits.
    pub(super) fn recycle_done<T: serde::Serialize>(&mut self, v: &T) {
        if let Some(mut c) = self.recycle_waiting.take() {
            crate::control::respond(&mut c, v);
        }
    }
}

/// Bind the control socket (mode 0666: access is decided per connection by SO_PEERCRED) in
/// sealnode's own runtime dir, through its descriptor: created 0755 if missing, checked with
/// fstat, the old socket removed and the new one bound with no path lookup an other user
/// could redirect.
fn bind(cfg: &Config, dir: &OwnedFd) -> Result<UnixListener> {
    let path = crate::control::socket_path(cfg);
    match nix::unistd::unlinkat(dir, crate::control::SOCKET, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(Error::errno(format!("remove the old {}", path.display()), e)),
    }
    // The socket is created in the directory the descriptor holds, through /proc/self/fd.
    let at = format!("/proc/self/fd/{}/{}", dir.as_raw_fd(), crate::control::SOCKET);
    // Mode 0666 through the umask at creation, not a chmod afterwards (chmod follows symlinks).
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o111));
    let bound = UnixListener::bind(&at);
    nix::sys::stat::umask(old);
    let l = bound.map_err(|e| Error::io(format!("bind {}", path.display()), e))?;
    l.set_nonblocking(true).map_err(|e| Error::io("control socket", e))?;
    Ok(l)
}
