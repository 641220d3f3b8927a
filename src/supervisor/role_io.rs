//! What the roles say, as a component of the event loop: each role's stdout and stderr
//! pipes (re-emitted line by line under its rate limit: crate::logging::output, crate::logging::log) under
//! [`TOKEN_OUTPUT`], and its denial log (the syscalls its filter refused, answered and
//! counted: crate::logging::denylog) under [`TOKEN_REFUSED`].

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsFd, OwnedFd};
use std::time::Instant;

use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};

use crate::config::Role;

/// A role's stdout or stderr pipe (output.rs); the low bits are the capture's id.
pub(super) const TOKEN_OUTPUT: u64 = 8 << 56;
/// A role's denial-log listener (its refused syscalls); the low bits are the role.
pub(super) const TOKEN_REFUSED: u64 = 9 << 56;
/// Refused syscalls answered per wake-up (the rest wait: a role cannot starve the loop).
const REFUSED_BUDGET: usize = 256;

/// What of a role's waits for its budget: its output pipes not read, its denial log not
/// served, until `at`.
#[derive(Debug, Default)]
struct Paused {
    at: Option<Instant>,
    outputs: Vec<u64>,
    refusals: bool,
}

#[derive(Debug)]
pub(super) struct RoleIo {
    /// The roles' stdout and stderr pipes still open (a restarted role's old ones drain to EOF).
    outputs: HashMap<u64, crate::logging::output::Capture>,
    next_output: u64,
    /// Each role's output budget, shared by its stdout and stderr.
    budgets: [crate::logging::output::Budget; 2],
    /// What of each role waits for its budget.
    paused: [Paused; 2],
    /// Each role's denial log (its current run's listener).
    refusals: [Option<crate::logging::denylog::DenyLog>; 2],
    /// Refusals of each role's earlier runs, per syscall name.
    refused_before: [BTreeMap<String, u64>; 2],
}

impl Default for RoleIo {
    fn default() -> Self {
        let now = Instant::now();
        RoleIo {
            outputs: HashMap::new(),
            next_output: 1,
            budgets: [crate::logging::output::budget(now), crate::logging::output::budget(now)],
            paused: [Paused::default(), Paused::default()],
            refusals: [None, None],
            refused_before: [BTreeMap::new(), BTreeMap::new()],
        }
    }
}

impl RoleIo {
    /// Watch one of a role's output pipes.
    pub(super) fn capture(&mut self, role: Role, pid: i32, generation: u64, err: bool, fd: OwnedFd, epoll: &Epoll) {
        let id = self.next_output;
        self.next_output += 1;
        if let Err(e) = epoll.add(fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_OUTPUT | id)) {
            // The role keeps running; its output is lost (the pipe closes and it gets EPIPE).
            tracing::warn!(role = %role, pid, error = %e, "cannot watch the role's output; it is dropped");
            return;
        }
        self.outputs.insert(id, crate::logging::output::Capture::new(role, pid, generation, err, fd));
    }

    /// A role's pipe is readable: re-emit its lines (bounded per wake-up), forget it at EOF;
    /// once the role's budget is spent, stop watching the pipe until enough is back
    /// ([`RoleIo::next_deadline`], [`RoleIo::resume`]): the role waits in its own `write`.
    pub(super) fn on_output(&mut self, id: u64, epoll: &Epoll) {
        let Some(c) = self.outputs.get_mut(&id) else { return };
        let role = c.role as usize;
        let budget = &mut self.budgets[role];
        let done = c.read(budget, &mut |c, line| {
            crate::logging::log::role_line(c.role, c.pid, c.generation, c.err, &crate::logging::output::escaped(line))
        });
        match done {
            crate::logging::output::Read::More => {}
            crate::logging::output::Read::Dry => {
                // Not watched at all while it waits: a hung-up pipe is reported whatever
                // the events asked for, and would wake the loop again and again.
                let _ = epoll.delete(c.fd.as_fd());
                let p = &mut self.paused[role];
                p.outputs.push(id);
                let at = budget.resume_at();
                p.at = Some(p.at.map_or(at, |t| t.min(at)));
            }
            crate::logging::output::Read::Eof => {
                if let Some(c) = self.outputs.remove(&id) {
                    let _ = epoll.delete(c.fd.as_fd());
                    if c.cut > 0 {
                        tracing::warn!(role = %c.role, pid = c.pid, lines = c.cut, max_bytes = crate::logging::output::MAX_LINE, "role output: lines longer than the limit were cut");
                    }
                }
            }
        }
    }

    /// When a role's budget is back for what waits for it.
    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.paused.iter().filter_map(|p| p.at).min()
    }

    /// Watch again what waited for its role's budget, where it is back.
    pub(super) fn resume(&mut self, now: Instant, epoll: &Epoll) {
        for role in Role::ALL {
            let p = &mut self.paused[role as usize];
            if p.at.is_none_or(|at| at > now) {
                continue;
            }
            p.at = None;
            for id in std::mem::take(&mut p.outputs) {
                if let Some(c) = self.outputs.get(&id) {
                    let _ = epoll.add(c.fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_OUTPUT | id));
                }
            }
            if std::mem::take(&mut p.refusals) {
                if let Some(d) = &self.refusals[role as usize] {
                    let _ = epoll.add(d.fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_REFUSED | role as u64));
                }
            }
        }
    }

    /// Lines a role wrote above its rate, said once a second at most.
    pub(super) fn report_dropped(&mut self) {
        let now = Instant::now();
        for role in Role::ALL {
            if let Some(n) = self.budgets[role as usize].lines.report(now) {
                tracing::warn!(role = %role, dropped = n, lines_per_s = crate::logging::output::RATE, "role output over its rate limit: lines dropped");
            }
        }
    }

    /// Lines of `role` dropped over its rate limit, all its runs.
    pub(super) fn dropped_lines(&self, role: Role) -> u64 {
        self.budgets[role as usize].lines.dropped_total
    }

    /// Serve a role's denial-log listener (replacing its previous run's, which closes).
    pub(super) fn watch_refusals(&mut self, role: Role, listener: Option<OwnedFd>, errno: Option<i32>, epoll: &Epoll) {
        // A new listener is watched at once; the old one's wait ends with it.
        self.paused[role as usize].refusals = false;
        if let Some(old) = self.refusals[role as usize].take() {
            let _ = epoll.delete(old.fd.as_fd());
            for (k, v) in old.counts() {
                *self.refused_before[role as usize].entry(k).or_insert(0) += v;
            }
        }
        let (Some(fd), Some(errno)) = (listener, errno) else { return };
        match epoll.add(fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_REFUSED | role as u64)) {
            Ok(()) => self.refusals[role as usize] = Some(crate::logging::denylog::DenyLog::new(role, fd, errno)),
            // Dropped: its refusals then fail with ENOSYS in the kernel, unlogged.
            Err(e) => tracing::warn!(role = %role, error = %e, "cannot watch the denial log; refusals are not logged"),
        }
    }

    /// Refused syscalls of a role wait on its listener: answer and log them (denylog.rs),
    /// at most REFUSED_BUDGET per wake-up and the role's answers a second
    /// (crate::logging::denylog::ANSWERS_PER_S: past them the listener is not watched until
    /// some are back, and the role's refused calls wait); forget the listener once its run
    /// ended.
    pub(super) fn on_refused(&mut self, i: usize, epoll: &Epoll) {
        let Some(d) = self.refusals.get_mut(i).and_then(|d| d.as_mut()) else { return };
        match d.serve(REFUSED_BUDGET) {
            crate::logging::denylog::Served::Open => {}
            crate::logging::denylog::Served::Spent(at) => {
                let _ = epoll.delete(d.fd.as_fd());
                self.paused[i].refusals = true;
                self.paused[i].at = Some(self.paused[i].at.map_or(at, |t| t.min(at)));
            }
            crate::logging::denylog::Served::Closed => {
                let _ = epoll.delete(d.fd.as_fd());
                // Its counts stay for ctl status and the metrics.
                let counts = d.counts();
                for (k, v) in counts {
                    *self.refused_before[i].entry(k).or_insert(0) += v;
                }
                self.refusals[i] = None;
            }
        }
    }

    /// Refusals the denial log saw for `role` (all its runs), per syscall name.
    pub(super) fn refused_counts(&self, role: Role) -> BTreeMap<String, u64> {
        let mut all = self.refused_before[role as usize].clone();
        if let Some(d) = &self.refusals[role as usize] {
            for (k, v) in d.counts() {
                *all.entry(k).or_insert(0) += v;
            }
        }
        all
    }
}

/// A role's stdio for `run`: stdin /dev/null, stdout and stderr each a pipe whose read end
/// (non-blocking) the supervisor keeps: (the role's stdio, stdout's read end, stderr's).
pub(super) fn output_pipes() -> crate::error::Result<(crate::sandbox::plan::Stdio, OwnedFd, OwnedFd)> {
    use nix::fcntl::OFlag;
    let pipe = || {
        let (r, w) =
            nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| crate::error::Error::errno("pipe2 (role output)", e))?;
        nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
            .map_err(|e| crate::error::Error::errno("fcntl (role output)", e))?;
        Ok::<_, crate::error::Error>((r, w))
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let null = std::fs::File::open("/dev/null").map_err(|e| crate::error::Error::io("open /dev/null", e))?;
    Ok((crate::sandbox::plan::Stdio { stdin: null.into(), stdout: out_w, stderr: Some(err_w) }, out_r, err_r))
}
