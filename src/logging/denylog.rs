//! The denial log (`log_refused_syscalls`): a role's refused syscalls arrive on its seccomp
//! listener (SECCOMP_RET_USER_NOTIF, Plan::log_refusals); each is answered at once with the
//! policy's errno and logged: role, pid, syscall name and number, errno, the arguments as
//! numbers. Nothing of the role's memory is read. One line a second at most per syscall name
//! and [`LINES_PER_S`] per role in all (bursts of [`LINES_BURST`]); every refusal is counted
//! (`ctl status`, metrics), per name of a syscall this build knows, and numbers it does not
//! know (a role can try any of 2^32) all under one name, "unknown": what is tracked is bounded.
//! At most [`ANSWERS_PER_S`] refusals a second per role are answered (bursts of
//! [`ANSWERS_BURST`]); past them the role's refused calls wait in the kernel until answers are
//! back (found by review: a role making refused calls in a loop, 172,000 a second, kept the
//! supervisor busy answering them, on the loop that forwards the node's traffic).

use std::collections::BTreeMap;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::time::Instant;

use nix::errno::Errno;

use crate::config::Role;

/// Log lines a second per role, sustained, whatever the syscalls.
pub const LINES_PER_S: f64 = 20.0;
/// Log lines per role at once after a quiet spell.
pub const LINES_BURST: f64 = 200.0;
/// Refusals answered a second per role, sustained: what a role's refused calls may cost the
/// supervisor; past it they wait (the role's time, not the supervisor's).
pub const ANSWERS_PER_S: f64 = 2000.0;
/// Refusals answered at once after a quiet spell.
pub const ANSWERS_BURST: f64 = 10_000.0;

/// One role's listener and what it has seen.
#[derive(Debug)]
pub struct DenyLog {
    pub role: Role,
    pub fd: OwnedFd,
    /// The errno every refusal is answered with (the policy's own).
    pub errno: i32,
    /// Refusals per syscall name (known syscalls, and "unknown"), and each name's rate limit.
    seen: BTreeMap<&'static str, (u64, crate::logging::ratelimit::Quiet)>,
    /// The role's log lines in all.
    lines: crate::logging::ratelimit::Bucket,
    /// The role's answers.
    answers: crate::logging::ratelimit::Bucket,
}

/// What serving found.
#[derive(Debug, PartialEq, Eq)]
pub enum Served {
    /// Everything pending was answered (or the budget was used: more may wait).
    Open,
    /// The role's answers a second are spent: serve it again at this time (refusals wait).
    Spent(Instant),
    /// No task uses the filter any more (the role's run ended), or the listener failed.
    Closed,
}

enum Pending {
    Notification,
    Nothing,
    HungUp,
}

/// What the listener has now (poll, no wait).
fn pending(fd: RawFd) -> Pending {
    let mut p = libc::pollfd { fd, events: libc::POLLIN, revents: 0 };
    // SAFETY: one valid pollfd, a zero timeout.
    let n = unsafe { libc::poll(&mut p, 1, 0) };
    if n <= 0 {
        Pending::Nothing
    } else if p.revents & libc::POLLIN != 0 {
        Pending::Notification
    } else if p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0 {
        Pending::HungUp
    } else {
        Pending::Nothing
    }
}

/// The name of syscall `nr` on this architecture; "unknown" for a number this build does not
/// know (the log line still shows the number).
pub fn syscall_name(nr: i32) -> &'static str {
    match usize::try_from(nr).ok().and_then(syscalls::Sysno::new) {
        Some(s) => s.name(),
        None => "unknown",
    }
}

impl DenyLog {
    pub fn new(role: Role, fd: OwnedFd, errno: i32) -> DenyLog {
        let now = Instant::now();
        let lines = crate::logging::ratelimit::Bucket::new(now, LINES_PER_S, LINES_BURST);
        let answers = crate::logging::ratelimit::Bucket::new(now, ANSWERS_PER_S, ANSWERS_BURST);
        DenyLog { role, fd, errno, seen: BTreeMap::new(), lines, answers }
    }

    /// Answer and log up to `budget` pending refusals (never waits: only what is pending).
    pub fn serve(&mut self, budget: usize) -> Served {
        let fd = self.fd.as_raw_fd();
        // One clock read per wake-up, not per refusal.
        let now = Instant::now();
        for _ in 0..budget {
            match pending(fd) {
                Pending::Notification => {}
                Pending::Nothing => return Served::Open,
                Pending::HungUp => return Served::Closed,
            }
            if !self.answers.ready_n(now, 1.0) {
                return Served::Spent(self.answers.when(ANSWERS_PER_S * 0.1));
            }
            self.answers.spend(1.0);
            let n = match crate::os::sys::seccomp_notif_recv(fd) {
                Ok(n) => n,
                // The task died before it was seen: nothing to answer.
                Err(Errno::ENOENT) | Err(Errno::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(role = %self.role, error = %e, "denial log: the listener failed; refusals are no longer logged");
                    return Served::Closed;
                }
            };
            // Answer first: the task is waiting. ENOENT: it died meanwhile.
            let _ = crate::os::sys::seccomp_notif_fail(fd, n.id, self.errno);
            let name = syscall_name(n.data.nr);
            let entry = self.seen.entry(name).or_insert_with(|| (0, Default::default()));
            entry.0 += 1;
            let total = entry.0;
            // The role's cap first: a line it refuses is one more suppressed for that name.
            let allowed = if self.lines.ready(now) {
                entry.1.allow(now).inspect(|_| {
                    self.lines.take(now);
                })
            } else {
                entry.1.skip();
                None
            };
            if let Some(suppressed) = allowed {
                let a = n.data.args;
                tracing::warn!(
                    role = %self.role,
                    pid = n.pid,
                    syscall = %name,
                    nr = n.data.nr,
                    errno = %Errno::from_raw(self.errno),
                    args = %format!("{:#x} {:#x} {:#x} {:#x} {:#x} {:#x}", a[0], a[1], a[2], a[3], a[4], a[5]),
                    total,
                    suppressed,
                    "refused syscall"
                );
            }
        }
        Served::Open
    }

    /// Refusals so far, per syscall name.
    pub fn counts(&self) -> BTreeMap<String, u64> {
        self.seen.iter().map(|(k, (n, _))| (k.to_string(), *n)).collect()
    }

    /// Serve until no task uses the filter any more (`exec`: on a thread of its own).
    pub fn serve_until_closed(mut self) {
        loop {
            let mut p = libc::pollfd { fd: self.fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
            // SAFETY: one valid pollfd; waits without a timeout.
            let n = unsafe { libc::poll(&mut p, 1, -1) };
            if n < 0 && Errno::last() != Errno::EINTR {
                return;
            }
            match self.serve(256) {
                Served::Closed => return,
                Served::Spent(at) => std::thread::sleep(at.saturating_duration_since(Instant::now())),
                Served::Open => {}
            }
        }
    }
}
