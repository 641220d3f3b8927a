//! The child's setup sequence: one function, top to bottom, one step per line, each with
//! the reason it sits where it does. Order is correctness
//! (docs/architecture.md, "The child's setup sequence", says why each step sits where it does).

use std::os::fd::RawFd;

use nix::errno::Errno;
use nix::unistd::{fork, ForkResult};

use super::plan::{ptr_array, Plan};
use super::protocol::{fail, reached, step};
use super::stage::{ChildFds, Stage};
use super::{caps, init, mounts};
use crate::os::sys;
use crate::policy::{landlock, seccomp};

/// Runs in the clone()d child: pid 1 of the new pid namespace, inside new user, mount, net (the
/// cell's, in a cell), ipc, uts and cgroup namespaces. Never returns: execs the workload or exits 125.
pub fn child_main(plan: &Plan, fds: ChildFds) -> ! {
    // Die with the launcher: first, so no later step can outlive a dead supervisor.
    step(fds.err, Stage::DieWithParent, 0, sys::die_with_parent);
    // The plan's own stdin/stdout onto fds 0 and 1, before the fds they come from are closed.
    step(fds.err, Stage::Stdio, 0, || plan.install_stdio());
    // Keep only the setup pipes (and the program fd): sandbox init lives as long as the role and
    // must not hold the supervisor's sockets, listeners or another role's pipes.
    step(fds.err, Stage::CloseInheritedFds, 0, || sys::close_all_except(&[fds.err, fds.sync, plan.program_fd()]));
    // New session, no controlling terminal: closes TIOCSTI/TIOCLINUX injection into the host tty.
    step(fds.err, Stage::NewSession, 0, sys::new_session);
    // Block until the parent wrote uid_map/gid_map; EOF means the launcher died meanwhile.
    step(fds.err, Stage::WaitForIdMaps, 0, || wait_for_maps(fds.sync));
    // Rootful only: shed root's groups while setgroups is permitted, and create files as the
    // role (our kuid 0 is unmapped in the cell; creating files as it fails with EOVERFLOW).
    // That credential change clears PDEATHSIG: re-arm it and check the launcher still lives.
    if plan.rootful {
        step(fds.err, Stage::RootfulFsIds, 0, || {
            caps::rootful_fs_ids(plan.ids).and_then(|()| sys::rearm_pdeathsig(fds.sync))
        });
    }
    // Before any mount: nothing we mount may propagate back to the host.
    step(fds.err, Stage::PrivatePropagation, 0, mounts::make_private);
    // Open and re-verify every bind source before the new root's tmpfs can cover it.
    let sources: Vec<_> = plan
        .mounts
        .iter()
        .enumerate()
        .map(|(i, m)| step(fds.err, Stage::OpenSources, i, || mounts::open_source(m)))
        .collect();
    // Private root: tmpfs, read-only system binds, role dirs, minimal /dev, /tmp, fresh masked /proc, /etc.
    let mut tree = mounts::Tree::default();
    for (i, (m, src)) in plan.mounts.iter().zip(&sources).enumerate() {
        step(fds.err, Stage::BuildRoot, i, || mounts::apply(m, src.as_ref(), &mut tree));
    }
    drop(sources);
    // Enter the new root (the one read back) and detach the host's; the root tmpfs becomes read-only.
    step(fds.err, Stage::PivotRoot, 0, || mounts::pivot(tree, &plan.workdir));
    // A new netns starts with lo down; bring it up while CAP_NET_ADMIN is held (exec; in a cell,
    // whose netns the role's own userns holds no capability over, the cell init brought it up).
    if plan.layers.namespaces {
        step(fds.err, Stage::LoopbackUp, 0, sys::loopback_up);
    }
    // The cell's own hostname (UTS namespace), while CAP_SYS_ADMIN is held.
    step(fds.err, Stage::Hostname, 0, || sys::set_hostname(plan.hostname.to_str().unwrap_or("sealnode")));
    // Pid 1 stays behind as a minimal init (reaps, forwards signals); the workload is its child.
    let init_pid = nix::unistd::getpid();
    let forked = step(fds.err, Stage::ForkWorkload, 0, fork_workload);
    if let ForkResult::Parent { child } = forked {
        init::run(plan, child, fds);
    }
    // Inherited from the launcher (blocked signals, ignored SIGPIPE) and kept across exec: reset.
    step(fds.err, Stage::ResetSignals, 0, sys::reset_signals);
    // Limits before dropping privilege, so the role cannot raise them back.
    for (i, (res, val)) in plan.rlimits.iter().enumerate() {
        step(fds.err, Stage::Rlimits, i, || nix::sys::resource::setrlimit(*res, *val, *val));
    }
    // Become the role's gid then uid (rootful: its own host uid; rootless: the invoking uid).
    step(fds.err, Stage::Credentials, 0, || caps::set_ids(plan.ids));
    // The credential change cleared PDEATHSIG: re-arm it, then make sure init is still our parent.
    step(fds.err, Stage::RearmParentDeath, 0, || rearm_parent_death(init_pid));
    // All five capability sets emptied (bounding first), no_new_privs set, result verified.
    if plan.layers.credentials {
        step(fds.err, Stage::DropCapabilities, 0, caps::drop_all);
    } else {
        // Layer matrix only: keep every capability across exec.
        step(fds.err, Stage::DropCapabilities, 1, caps::keep_all_across_exec);
    }
    // Nothing but stdio may cross into the workload (the error pipe closes at exec).
    step(fds.err, Stage::CloseFds, 0, || sys::cloexec_from(3));
    // The audit login uid, while unset, can be set once by the process itself: set it to the
    // role's uid, so no process of the role can claim another (a set one stays). As the role's
    // uid, dumpable again (exec makes it so anyway) so that /proc/self is its own; before
    // Landlock, which leaves /proc read-only.
    step(fds.err, Stage::AuditLoginuid, 0, || {
        sys::prctl(libc::PR_SET_DUMPABLE, 1).and_then(|()| sys::set_loginuid_if_unset(plan.ids.uid))
    });
    // Landlock after pivot_root (rules name the sandbox's paths) and before seccomp (needs its syscalls).
    if plan.layers.landlock {
        step(fds.err, Stage::Landlock, 0, || landlock::apply(&plan.landlock).map_err(|e| landlock_errno(fds, e)));
    }
    // Seccomp last: from here on only the role's allowlist, which must include execve.
    let listener = plan.layers.seccomp.then(|| step(fds.err, Stage::Seccomp, 0, || install_seccomp(plan))).flatten();
    // The denial log's listener to the launcher, before exec closes it: only read and write.
    if let Some(fd) = listener {
        step(fds.err, Stage::HandOverListener, 0, || hand_over(fds, fd));
    }
    // Exec with the explicit environment, said first: EOF on the error pipe after this tells the
    // parent it happened, EOF before it that the setup was killed (at the last step said).
    reached(fds.err, Stage::Exec, 0);
    let errno = exec(plan);
    fail(fds.err, Stage::Exec, 0, errno)
}

/// The role's filter; with the denial log, the filter's listener fd too.
fn install_seccomp(plan: &Plan) -> Result<Option<RawFd>, Errno> {
    match plan.refusal_log {
        None => seccomp::install(&plan.seccomp).map(|()| None),
        // Dumpable first, while prctl is still allowed: the launcher's pidfd_getfd needs ptrace
        // access, which a process that changed its uid (rootful) only grants to CAP_SYS_PTRACE
        // in the launcher's namespace, which the unit does not have. The exec that follows
        // makes the workload dumpable anyway (same ids, not setuid).
        Some(_) => {
            sys::prctl(libc::PR_SET_DUMPABLE, 1).and_then(|()| sys::seccomp_with_listener(&plan.seccomp)).map(Some)
        }
    }
}

/// Tell the launcher the listener's fd number (it takes a copy with pidfd_getfd), then wait
/// until it has: the fd closes at exec.
fn hand_over(fds: ChildFds, listener: RawFd) -> Result<(), Errno> {
    super::protocol::send(fds.err, super::protocol::Frame::Ok(listener as u32))?;
    let mut b = [0u8; 1];
    match sys::read_retry(fds.sync, &mut b)? {
        1 => Ok(()),
        _ => Err(Errno::EPIPE),
    }
}

fn wait_for_maps(sync: RawFd) -> Result<(), Errno> {
    let mut b = [0u8; 1];
    match sys::read_retry(sync, &mut b)? {
        1 => Ok(()),
        _ => Err(Errno::EPIPE),
    }
}

fn fork_workload() -> Result<ForkResult, Errno> {
    // SAFETY: sealnode's launcher is single-threaded, so the child of fork() may do anything.
    unsafe { fork() }
}

fn rearm_parent_death(init: nix::unistd::Pid) -> Result<(), Errno> {
    sys::die_with_parent()?;
    // Our parent is the sandbox's init (pid 1 of the namespace); anything else means it died.
    if nix::unistd::getppid() != init {
        return Err(Errno::ESRCH);
    }
    Ok(())
}

fn landlock_errno(fds: ChildFds, e: landlock::ApplyError) -> Errno {
    match e {
        landlock::ApplyError::Path(i, errno) => fail(fds.err, Stage::Landlock, i + 1, Errno::from_raw(errno)),
        landlock::ApplyError::Ruleset(errno) | landlock::ApplyError::Restrict(errno) => Errno::from_raw(errno),
        landlock::ApplyError::NotEnforced => Errno::EOPNOTSUPP,
    }
}

/// execve each candidate path in turn (like execvp); returns the last error.
fn exec(plan: &Plan) -> Errno {
    let argv = ptr_array(&plan.argv);
    let envp = ptr_array(&plan.envp);
    let mut last = Errno::ENOENT;
    for path in &plan.exec_paths {
        last = sys::execve(path, &argv, &envp);
        // Like execvp: keep searching only past "not found here".
        if !matches!(last, Errno::ENOENT | Errno::ENOTDIR) {
            break;
        }
    }
    last
}
