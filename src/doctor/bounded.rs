//! A probe's child waited for, and its pipe read, within a bound: a filter above sealnode
//! that holds a call holds the child, never the caller.

use nix::errno::Errno;

use crate::os::sys;

/// How a child of a probe ended, waited for within a bound.
pub(super) enum Ended {
    Exited(i32),
    Killed(nix::sys::signal::Signal),
    /// Still there at the bound: killed (SIGKILL) and reaped.
    Hung,
    /// waitpid failed.
    Unknown(Errno),
}

/// Wait for `child` (polled, so that nothing else of the caller's waits on a signal) for up
/// to `limit`; past it the child is killed and reaped.
pub(super) fn ended_within(child: nix::unistd::Pid, limit: std::time::Duration) -> Ended {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let until = std::time::Instant::now() + limit;
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(2))
            }
            Ok(WaitStatus::StillAlive) => {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                let _ = waitpid(child, None);
                return Ended::Hung;
            }
            Ok(WaitStatus::Exited(_, e)) => return Ended::Exited(e),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ended::Killed(sig),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Ended::Unknown(e),
        }
    }
}

/// How reading a probe's pipe ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Read {
    /// Its writers closed it: everything said was read.
    Closed,
    TimedOut,
    Failed,
}

/// All that is written to `r` until its writers close it, or `limit` passes.
pub(super) fn read_within(r: &std::os::fd::OwnedFd, limit: std::time::Duration) -> (Vec<u8>, Read) {
    let mut said = Vec::new();
    let mut buf = [0u8; 256];
    let until = std::time::Instant::now() + limit;
    loop {
        match sys::readable_by(std::os::fd::AsFd::as_fd(r), until) {
            Ok(false) => return (said, Read::TimedOut),
            Err(_) => return (said, Read::Failed),
            Ok(true) => match nix::unistd::read(r, &mut buf) {
                Ok(0) => return (said, Read::Closed),
                Err(Errno::EINTR) => continue,
                Err(_) => return (said, Read::Failed),
                Ok(n) => said.extend_from_slice(&buf[..n]),
            },
        }
    }
}
