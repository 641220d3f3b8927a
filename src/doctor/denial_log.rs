//! Whether the denial log (`log_refused_syscalls`) can take the roles' seccomp listeners:
//! pidfd_getfd, tried as the supervisor makes it.

use nix::errno::Errno;

use super::bounded::{ended_within, Ended};
use crate::os::sys;

/// Whether the denial log can take the roles' seccomp listeners, where a role of `cfg` logs
/// its refused calls: the supervisor copies each with pidfd_getfd, which systemd's `@debug`
/// set holds (the units deny it unless a drop-in allows it). Tried as the supervisor makes it
/// ([`pidfd_getfd_tried`]): `run` and a reload refuse here, before anything starts or stops
/// (found by a docs audit: the spawn failed once the engine ran, exit 1, which the unit
/// restarts), and `check` reports it.
pub fn denial_log(cfg: &crate::config::Config) -> Option<std::result::Result<(), String>> {
    if !crate::config::Role::ALL.iter().any(|r| cfg.role(*r).log_refused_syscalls) {
        return None;
    }
    Some(pidfd_getfd_tried().map_err(|e| {
        format!(
            "pidfd_getfd {e}: under the systemd units, allow it with a drop-in for the unit that runs this \
             config: [Service] SystemCallFilter=pidfd_getfd (or turn log_refused_syscalls off)"
        )
    }))
}

/// How long [`pidfd_getfd_tried`] waits for its answer: an honest call returns in
/// microseconds, and a reload waits for it in the event loop (found by review: a filter that
/// held the call stalled the loop for the 5 s this was).
const PIDFD_GETFD_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// pidfd_getfd as the supervisor makes it to take a role's listener: on another process of
/// this one's making that holds the fd (found by review: tried on itself, the kernel hands a
/// process its own fds without the ptrace checks Yama or an LSM make, and a filter keyed on
/// the fd number let fd 0 through), from a throwaway child, so that a filter that kills on the
/// call kills only that child (found by review: it killed `check`, and a running cell at a
/// reload) and one that holds it is bounded. Err: how it was refused.
fn pidfd_getfd_tried() -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let (_r, held) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("not tried: pipe2: {e}"))?;
    let fd = held.as_raw_fd();
    let supervisor = nix::unistd::getpid();
    // SAFETY: the child makes raw system calls only (no allocation, no lock) and exits.
    let prober = match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            // Holding nothing of sealnode's and gone with it (found by review: a prober held
            // by a filter outlived a killed supervisor with its dir locks and sockets, and the
            // next start was refused), its signals as a fresh process's.
            let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            let _ = nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_SETMASK,
                Some(&nix::sys::signal::SigSet::empty()),
                None,
            );
            if fd > 3 {
                let _ = sys::close_range(3, fd as u32 - 1);
            }
            let _ = sys::close_range(fd as u32 + 1, u32::MAX);
            sys::exit_now(pidfd_getfd_of_a_child(fd, supervisor))
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
        Err(e) => return Err(format!("not tried: fork: {e}")),
    };
    match ended_within(prober, PIDFD_GETFD_LIMIT) {
        Ended::Exited(0) => Ok(()),
        Ended::Exited(e) => Err(format!("refused ({})", Errno::from_raw(e))),
        Ended::Killed(sig) => Err(format!("killed the process ({sig})")),
        Ended::Hung => Err(format!("did not return within {} s", PIDFD_GETFD_LIMIT.as_secs())),
        Ended::Unknown(e) => Err(format!("not tried: waitpid: {e}")),
    }
}

/// In the prober: a child that holds `fd` (as a role's workload holds its listener), in a
/// user namespace of its own as a role is (one this process owns: under Yama's
/// ptrace_scope=2, which asks for CAP_SYS_PTRACE in the target's user namespace, the
/// supervisor has it in a role's and not in its own, which the units drop it from), and
/// waits; pidfd_getfd of that fd from it; the errno, or 0.
fn pidfd_getfd_of_a_child(fd: std::os::fd::RawFd, supervisor: nix::unistd::Pid) -> i32 {
    let prober = nix::unistd::getpid();
    if nix::unistd::getppid() != supervisor {
        // The supervisor went before the death signal was set.
        return libc::ESRCH;
    }
    // The child says when it is in its namespace: the call is tried on it there.
    let (placed, in_place) = match nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) {
        Ok(p) => p,
        Err(e) => return e as i32,
    };
    // SAFETY: the child makes raw system calls only and never returns.
    let target = match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            // Gone with the prober, whatever ends it.
            let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            if nix::unistd::getppid() != prober {
                sys::exit_now(0);
            }
            drop(placed);
            // Where a user namespace cannot be made, the cell cannot be either: the call is
            // then tried in this one (which errs towards refusing).
            let _ = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER);
            let _ = nix::unistd::write(&in_place, &[1]);
            drop(in_place);
            loop {
                // SAFETY: pause takes no argument; it returns only for a handled signal.
                unsafe { libc::pause() };
            }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
        Err(e) => return e as i32,
    };
    drop(in_place);
    let mut said = [0u8; 1];
    // Bounded by the supervisor's wait for this process (PIDFD_GETFD_LIMIT).
    let placed_said = nix::unistd::read(&placed, &mut said);
    // Holding nothing but what the call needs while it is made (a filter may hold it).
    drop(placed);
    let tried = match placed_said {
        Ok(1) => sys::pidfd_open(target.as_raw()).and_then(|p| sys::pidfd_getfd(&p, fd)).map(drop),
        Ok(_) => Err(Errno::ESRCH),
        Err(e) => Err(e),
    };
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(target, None);
    match tried {
        Ok(()) => 0,
        Err(e) => e as i32,
    }
}

/// [`denial_log`] as a refusal: the start or reload does not go on.
pub fn denial_log_ready(cfg: &crate::config::Config) -> crate::error::Result<()> {
    match denial_log(cfg) {
        Some(Err(fix)) => Err(crate::error::Error::Unsupported {
            what: "the denial log (log_refused_syscalls): it takes each role's seccomp listener with pidfd_getfd"
                .into(),
            fix,
        }),
        _ => Ok(()),
    }
}
