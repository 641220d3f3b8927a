//! The service manager (sd_notify): READY=1 once both roles run, RELOADING=1 and READY=1 again
//! around a reload, STOPPING=1, STATUS= lines and the watchdog's keep-alive; none of it ever
//! blocks the loop.

use std::time::{Duration, Instant};

use sd_notify::NotifyState;

/// Tell the service manager (if any), never blocking the event loop: sd_notify's send
/// blocks when the receiver's queue is full, so the datagram is sent non-blocking and dropped
/// if the manager cannot take it now (systemd drains its socket at once).
pub(super) fn notify(states: &[NotifyState]) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let msg: String = states.iter().map(|s| format!("{s}\n")).collect();
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else { return };
    let _ = sock.set_nonblocking(true);
    let sent = match path.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            std::os::unix::net::SocketAddr::from_abstract_name(name).and_then(|a| sock.send_to_addr(msg.as_bytes(), &a))
        }
        None => sock.send_to(msg.as_bytes(), &path),
    };
    if let Err(e) = sent {
        tracing::debug!(error = %e, "notification dropped");
    }
}

/// What the service manager was told, and the watchdog's keep-alive.
#[derive(Debug)]
pub(super) struct Notifier {
    /// READY=1 was sent (both roles ran).
    ready_sent: bool,
    /// WATCHDOG=1 every half of WatchdogSec: (that interval, the last one sent).
    watchdog: Option<(Duration, Instant)>,
}

impl Notifier {
    /// The watchdog's interval from the environment systemd set (WATCHDOG_USEC).
    pub(super) fn from_env() -> Notifier {
        let mut usec = 0;
        let watchdog =
            sd_notify::watchdog_enabled(false, &mut usec).then(|| (Duration::from_micros(usec / 2), Instant::now()));
        Notifier { ready_sent: false, watchdog }
    }

    /// The engine is ready and the node runs: READY=1 the first time; after a reload
    /// (RELOADING=1 holds the unit in "reloading") READY=1 again.
    pub(super) fn roles_up(&mut self, reloading: bool) {
        if !self.ready_sent {
            self.ready_sent = true;
            notify(&[NotifyState::Ready, NotifyState::Status("engine ready, node running")]);
        } else if reloading {
            notify(&[NotifyState::Ready, NotifyState::Status("reloaded: engine ready, node running")]);
        }
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.watchdog.map(|(iv, last)| last + iv)
    }

    /// The watchdog's keep-alive, when due.
    pub(super) fn sweep(&mut self, now: Instant) {
        if let Some((iv, last)) = self.watchdog {
            if last + iv <= now {
                notify(&[NotifyState::Watchdog]);
                self.watchdog = Some((iv, now));
            }
        }
    }
}
