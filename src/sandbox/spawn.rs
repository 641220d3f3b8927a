//! Parent side: clone the child into its namespaces, write its id maps, learn whether its
//! setup succeeded, and wait for it while forwarding signals.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, Id, WaitPidFlag, WaitStatus};
use nix::unistd::{pipe2, Pid};

use super::child::child_main;
use super::namespaces::{CELL_ROLE_NAMESPACES, MATRIX_NAMESPACES, NAMESPACES};
use super::plan::{Mount, Plan};
use super::protocol::{self, Failure, Frame, Reap, Step, FORWARDED};
use super::stage::{ChildFds, Stage};
use super::{caps, idmap, namespaces, shown};
use crate::error::{Error, Result};
use crate::os::sys;
use crate::sandbox::cell::Cell;

/// The steps of the short-lived intermediate that puts a role into a cell.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Enter {
    /// setns into the cell's user namespace and the role's network namespace; take the role's
    /// ids as the effective ones (item 1).
    JoinCell,
    /// clone the role's init with CLONE_PARENT and the role's own namespaces, its own user
    /// namespace (a child of the cell's) among them.
    CloneRole,
    /// write the uid_map and gid_map of the role's own user namespace.
    MapRole,
}

impl Step for Enter {
    const ALL: &'static [Enter] = &[Enter::JoinCell, Enter::CloneRole, Enter::MapRole];
    fn name(self) -> &'static str {
        match self {
            Enter::JoinCell => "join_cell",
            Enter::CloneRole => "clone_role",
            Enter::MapRole => "map_role",
        }
    }
}

/// A running sandbox whose workload has exec'd.
#[derive(Debug)]
pub struct Sandbox {
    /// Host pid of the sandbox's init (pid 1 inside).
    pub pid: Pid,
    /// Held open for the sandbox's lifetime: its closing tells a child still in setup that
    /// the launcher is gone.
    _alive: OwnedFd,
    /// The denial log's seccomp listener (plan.refusal_log): every refused syscall of the
    /// workload waits on it for an answer; closing it makes them fail with ENOSYS.
    pub listener: Option<OwnedFd>,
}

/// The signals the launcher handles synchronously (blocked, then taken with sigwait).
pub fn launcher_sigset() -> SigSet {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(s);
    }
    set.add(Signal::SIGCHLD);
    set
}

/// Start `plan` in a new sandbox with its own user and network namespaces (`exec`).
/// Returns once the workload has exec'd, or the setup error.
pub fn spawn(plan: &Plan) -> Result<Sandbox> {
    spawn_in(plan, None)
}

/// Clone the role into `cell`: a short-lived intermediate joins the cell's user namespace and
/// the role's own network namespace, then clones the role with CLONE_PARENT so the role's init is the supervisor's
/// own child (waitable, and its parent-death signal tied to the supervisor), in a user namespace
/// of its own whose id maps the intermediate writes: only a process in the parent namespace
/// (the cell's) may, and the supervisor is not in it.
/// The role's pid, with the id maps' failure when they failed (the role not yet reaped: a role
/// killed meanwhile is told as its kill, [`spawn_in`]).
fn clone_into_cell(cell: &Cell, plan: &Plan, fds: ChildFds) -> Result<(libc::pid_t, Option<Error>)> {
    let (pid_r, pid_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2", e))?;
    let leaf = cell.cgroups.as_ref().and_then(|t| t.dir(plan.role));
    // The intermediate starts straight in the role's leaf, as the supervisor (whose ids the
    // leaf lets in): the role it clones starts there, under its limits from its first
    // instruction, its cgroup namespace rooted there. Not the role's clone: that one is made
    // as the role's uid, which the leaf (root's, or the delegated user's) does not let in.
    let forked = match leaf {
        // SAFETY: the supervisor is single-threaded.
        Some(dir) => unsafe { sys::clone3(0, Some(dir)) }.map_err(|e| Error::Setup {
            step: Enter::CloneRole.name(),
            detail: format!("{} role: clone3 into its cgroup leaf (removed, or not writable?)", plan.role),
            errno: e,
        })?,
        // SAFETY: as above.
        None => match unsafe { nix::unistd::fork() }.map_err(|e| Error::errno("fork", e))? {
            nix::unistd::ForkResult::Child => 0,
            nix::unistd::ForkResult::Parent { child } => child.as_raw(),
        },
    };
    match forked {
        0 => {
            drop(pid_r);
            let w = pid_w.as_raw_fd();
            let net = match plan.role {
                crate::config::Role::Engine => crate::sandbox::cell::Net::Engine,
                crate::config::Role::Node => crate::sandbox::cell::Net::Node,
            };
            protocol::must(w, Enter::JoinCell, 0, cell.join(net));
            // The role's own user namespace is made by an id the cell maps: the role's.
            protocol::must(w, Enter::JoinCell, 1, caps::effective_ids_of(plan.ids));
            // SAFETY: the intermediate is single-threaded (a fresh fork).
            let cloned = unsafe { sys::clone_fork(libc::CLONE_PARENT | CELL_ROLE_NAMESPACES) };
            match protocol::must(w, Enter::CloneRole, 0, cloned) {
                0 => child_main(plan, fds),
                pid => {
                    // Its pid first: from here on, a failure leaves the supervisor a role to reap.
                    let _ = protocol::send(w, Frame::Ok(pid as u32));
                    // The role's ids only, 1:1 from the cell's; the role waits for them
                    // (wait_for_id_maps). A faked CLONE_NEWUSER fails here: the cell's maps are
                    // written once, already.
                    let mapped = idmap::write_errno(Pid::from_raw(pid), &[plan.ids.uid], &[plan.ids.gid], plan.rootful);
                    protocol::must(w, Enter::MapRole, 0, mapped);
                    sys::exit_now(0)
                }
            }
        }
        child => {
            let child = Pid::from_raw(child);
            drop(pid_w);
            let frame = protocol::read_frame(pid_r.as_raw_fd()).map_err(|e| Error::errno("read role pid", e));
            // With the role's pid, the second word: EOF once its maps are written, else a failure.
            let mapped = matches!(frame, Ok(Some(Frame::Ok(_)))).then(|| protocol::read_frame(pid_r.as_raw_fd()));
            // Its status kept: a kill is named.
            let status = waitpid(child, None);
            match frame? {
                Some(Frame::Ok(pid)) if pid > 0 && pid <= i32::MAX as u32 => {
                    let reap = Reap(Pid::from_raw(pid as libc::pid_t));
                    match (mapped, status) {
                        (Some(Ok(None)), Ok(WaitStatus::Exited(_, 0))) => Ok((pid as libc::pid_t, None)),
                        (Some(Ok(Some(f))), _) => Ok((pid as libc::pid_t, Some(entering_failed(f, plan.role)))),
                        // Without a word (found by review: told with a debug dump and a
                        // made-up errno): how it ended.
                        (_, status) => Err(reap.abort(Error::Killed {
                            what: format!(
                                "{} role: the process writing its user namespace's id maps (map_role) {}",
                                plan.role,
                                match status {
                                    Ok(WaitStatus::Signaled(_, sig, _)) => format!("was killed by {sig}"),
                                    Ok(WaitStatus::Exited(_, code)) =>
                                        format!("exited with status {code} without a report"),
                                    _ => "ended without a report".to_string(),
                                }
                            ),
                            fix: protocol::KILLED_FIX.into(),
                        })),
                    }
                }
                Some(f) => Err(entering_failed(f, plan.role)),
                // Without a word (found by review: told as "Broken pipe"): how it ended.
                None => Err(match status {
                    Ok(WaitStatus::Signaled(_, sig, _)) => Error::Killed {
                        what: format!(
                            "{} role: the process entering the cell (join_cell, clone_role) was killed by {sig}",
                            plan.role
                        ),
                        fix: protocol::KILLED_FIX.into(),
                    },
                    _ => Error::errno("intermediate died before cloning the role", Errno::EPIPE),
                }),
            }
        }
    }
}

/// What the intermediate's failure report means.
fn entering_failed(f: Frame, role: crate::config::Role) -> Error {
    match f.failure::<Enter>() {
        Some(Ok(Failure { step: Enter::MapRole, errno, .. })) => Error::Setup {
            step: Enter::MapRole.name(),
            detail: format!("{role} role: writing its own user namespace's uid_map and gid_map (from the cell's)"),
            errno,
        },
        Some(Ok(Failure { step, errno, .. })) => {
            let (what, fix) = namespaces::explain_userns_failure(errno);
            Error::Unsupported { what: format!("entering the cell ({}): {what}", step.name()), fix }
        }
        _ => Error::errno("the intermediate's report", Errno::EPROTO),
    }
}

/// Start `plan` in `cell` (a user namespace of its own inside the cell's, the role's network
/// namespace) or standalone when `cell` is None.
pub fn spawn_in(plan: &Plan, cell: Option<&Cell>) -> Result<Sandbox> {
    // Blocked before clone so no signal or child exit is lost between here and the wait loop.
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&launcher_sigset()), None)
        .map_err(|e| Error::errno("sigprocmask", e))?;
    let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2", e))?;
    let (sync_r, sync_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2", e))?;
    // The child closes every other fd as its first steps (close_inherited_fds).
    let fds = ChildFds { err: err_w.as_raw_fd(), sync: sync_r.as_raw_fd() };
    let (pid, map_failed) = match cell {
        Some(cell) => clone_into_cell(cell, plan, fds)?,
        None => {
            let flags = if plan.layers.namespaces { NAMESPACES } else { MATRIX_NAMESPACES };
            // SAFETY: the launcher is single-threaded (no thread is ever started before this point).
            let pid = unsafe { sys::clone_fork(flags) }.map_err(clone_error)?;
            if pid == 0 {
                child_main(plan, fds);
            }
            (pid, None)
        }
    };
    drop(err_w);
    drop(sync_r);
    let pid = Pid::from_raw(pid);
    let reap = Reap(pid);
    // Opened now, while the init is the launcher's own and dumpable (it confines itself later).
    // The role's id maps failed: a role killed meanwhile (a filter above sealnode, the OOM
    // killer) is what made them fail, told as its kill at its step (found by test: told as the
    // maps' EACCES); else the maps' failure.
    if let Some(e) = map_failed {
        let wait =
            || nix::sys::wait::waitid(Id::Pid(pid), WaitPidFlag::WEXITED | WaitPidFlag::WNOHANG | WaitPidFlag::WNOWAIT);
        let until = std::time::Instant::now() + std::time::Duration::from_millis(200);
        while matches!(wait(), Ok(WaitStatus::StillAlive)) && std::time::Instant::now() < until {
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        if !matches!(wait(), Ok(WaitStatus::Signaled(..))) {
            return Err(reap.abort(e));
        }
        let mut progress = Progress::default();
        let _ = next_report(err_r.as_raw_fd(), &mut progress, std::time::Instant::now() + SETUP_LIMIT, false);
        return Err(killed_in_setup(plan, pid, progress));
    }
    let mut init_files = shown::InitFiles::open(pid);
    // In a cell: the role's own user namespace, a child of the cell's, read back.
    if let Some(cell) = cell {
        cell.check_role_userns(pid).map_err(|e| reap.abort(e))?;
    }
    if cell.is_none() {
        idmap::write(pid, &[plan.ids.uid], &[plan.ids.gid], plan.rootful).map_err(|e| reap.abort(e))?;
    }
    // What the child said of its steps so far, and when its setup must have ended.
    let mut progress = Progress::default();
    let until = std::time::Instant::now() + SETUP_LIMIT;
    if let Err(e) = sys::write_all(sync_w.as_raw_fd(), &[1]) {
        // It failed before it was released (found by review: its own report was dropped and
        // the error read "Broken pipe"): what it said, or, without a word, how it ended.
        return Err(match next_report(err_r.as_raw_fd(), &mut progress, until, false) {
            Ok(Some(f)) => match f.failure::<Stage>() {
                Some(Ok(failure)) => {
                    let _ = waitpid(pid, None);
                    setup_error(plan, failure)
                }
                _ => reap.abort(Error::errno("release child", e)),
            },
            Ok(None) => killed_in_setup(plan, pid, progress),
            Err(_) => reap.abort(Error::errno("release child", e)),
        });
    }
    let mut listener = None;
    loop {
        let each = plan.refusal_log.is_some() && listener.is_none();
        match next_report(err_r.as_raw_fd(), &mut progress, until, each).map_err(|e| match e {
            Errno::ETIMEDOUT => reap.abort(held_error(plan.role, progress)),
            e => reap.abort(Error::errno("read setup status", e)),
        })? {
            // EOF once the exec was said and the init said it is confined: the workload's copy
            // of the pipe closed at its exec, the init's once it confined itself.
            None if progress.workload == Some(Stage::Exec) && progress.init == InitSaid::Confined => {
                check_shown(plan, &mut init_files).map_err(|e| reap.abort(e))?;
                return Ok(Sandbox { pid, _alive: sync_w, listener });
            }
            // EOF before it, with no step failed: a process of the setup was killed.
            None => return Err(killed_in_setup(plan, pid, progress)),
            // The denial log's listener, once: a copy taken, then the workload may exec.
            Some(Frame::Ok(fd)) if plan.refusal_log.is_some() && listener.is_none() => {
                listener = Some(take_listener(&mut init_files, fd).map_err(|e| reap.abort(e))?);
                sys::write_all(sync_w.as_raw_fd(), &[1]).map_err(|e| reap.abort(Error::errno("release child", e)))?;
            }
            Some(f) => {
                return match f.failure::<Stage>() {
                    Some(Ok(failure)) => {
                        let _ = waitpid(pid, None);
                        Err(setup_error(plan, failure))
                    }
                    _ => Err(reap.abort(Error::errno("the child's setup report", Errno::EPROTO))),
                }
            }
        }
    }
}

/// How long a role's setup may take, from its release to its exec: milliseconds on any host
/// (the longest step copies the program into its sealed file). A setup held longer (a filter
/// above sealnode holding a call in a supervisor that never answers, a hung filesystem) is
/// stopped and told at its step, never waited for for ever (found by test: a faked write(2)
/// spun the setup, and `run` waited with its stop signals blocked).
pub const SETUP_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// What the sandbox's two processes said of their setup: the last step the child (before its
/// fork, the init; after it, the workload) said it was about to make, and the init's own
/// confinement.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Progress {
    workload: Option<Stage>,
    init: InitSaid,
}

/// What the init said of its confinement (confine_init).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
enum InitSaid {
    #[default]
    Nothing,
    Confining,
    Confined,
}

impl Progress {
    /// Past the fork: the workload said a step after it, or the init its own (found by review:
    /// an init killed before its workload spoke was told at fork_workload).
    fn forked(&self) -> bool {
        self.workload.is_some_and(|s| s.code() > Stage::ForkWorkload.code()) || self.init != InitSaid::Nothing
    }

    /// Take one `Reached` or `Done` frame; any other frame is not progress (`false`).
    fn take(&mut self, f: Frame) -> std::result::Result<bool, Errno> {
        let step = |code| <Stage as Step>::from_code(code).ok_or(Errno::EPROTO);
        match f {
            Frame::Reached(code) if step(code)? == Stage::ConfineInit => self.init = InitSaid::Confining,
            Frame::Reached(code) => self.workload = Some(step(code)?),
            Frame::Done(code) if step(code)? == Stage::ConfineInit => self.init = InitSaid::Confined,
            Frame::Done(_) => return Err(Errno::EPROTO),
            _ => return Ok(false),
        }
        Ok(true)
    }
}

/// The child's next report that is not progress (those update `progress`), or `None` at EOF;
/// ETIMEDOUT once `until` passes. A step code the child's steps do not have is EPROTO.
/// `each`: woken at each frame (the denial log's listener waits for the parent); otherwise
/// only once the pipe's writers are all gone (the exec, a failure, a kill), then every frame
/// is read from the pipe's buffer: the launcher does not wake at each of a setup's ~150 steps.
fn next_report(
    fd: std::os::fd::RawFd,
    progress: &mut Progress,
    until: std::time::Instant,
    each: bool,
) -> std::result::Result<Option<Frame>, Errno> {
    loop {
        // SAFETY: `fd` is the parent's read end of the setup pipe, open for this call.
        let pipe = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        let ready = if each { sys::readable_by(pipe, until)? } else { sys::hung_up_by(pipe, until)? };
        if !ready {
            // Held: what it said so far names the step it is held at.
            while sys::readable_by(pipe, std::time::Instant::now())? {
                match protocol::read_frame(fd)? {
                    Some(f) if progress.take(f)? => {}
                    other => return Ok(other),
                }
            }
            return Err(Errno::ETIMEDOUT);
        }
        match protocol::read_frame(fd)? {
            Some(f) if progress.take(f)? => {}
            other => return Ok(other),
        }
    }
}

/// Which setup step `progress` says was held or killed, as the message names it.
fn at(progress: Progress) -> String {
    progress.workload.map(|s| format!("setup step {}", s.name())).unwrap_or("its first setup step".into())
}

/// The setup did not end within [`SETUP_LIMIT`]: where it was held (the child was killed).
fn held_error(role: crate::config::Role, progress: Progress) -> Error {
    // The workload exec'd: it is the init that did not say it is confined.
    let init_held = progress.workload == Some(Stage::Exec) && progress.init != InitSaid::Confined;
    Error::Setup {
        step: match (init_held, progress.workload) {
            (true, _) => Stage::ConfineInit.name(),
            (false, Some(s)) => s.name(),
            (false, None) => "before its first step",
        },
        detail: format!(
            "{role} role: {} held at this step for {} s, then stopped (a filter above sealnode holding a call of it \
             in a supervisor that does not answer, or a hung filesystem)",
            if init_held { "its init" } else { "its setup" },
            SETUP_LIMIT.as_secs()
        ),
        errno: Errno::ETIMEDOUT,
    }
}

/// The child's pipe closed before the exec was said and the init said it is confined, and no
/// step failed: a process of the setup was killed (a filter above sealnode killing a call, the
/// OOM killer, an operator). Found by review: this was taken for the workload's own exit, and
/// the role restarted as if it had run. Which process, by which signal, at which step; the
/// sandbox's init is reaped (it ends once its workload has: 5 s, then it is killed).
fn killed_in_setup(plan: &Plan, pid: Pid, progress: Progress) -> Error {
    let until = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let status = loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(10))
            }
            Ok(WaitStatus::StillAlive) => {
                let _ = kill(pid, Signal::SIGKILL);
                let _ = waitpid(pid, None);
                break Err(Errno::ETIMEDOUT);
            }
            other => break other,
        }
    };
    killed_error(plan.role, status, progress)
}

/// [`killed_in_setup`]'s error from the init's wait status.
fn killed_error(role: crate::config::Role, status: nix::Result<WaitStatus>, progress: Progress) -> Error {
    let at = at(progress);
    // Before the fork the init was the setup's only process; after it, the workload makes the
    // steps and the init, confining itself, passes on the workload's death as 128+N.
    let (what, signal) = match status {
        Ok(WaitStatus::Signaled(_, sig, _)) if progress.forked() => (
            match progress.init {
                InitSaid::Confined => format!("its init was killed by {sig} once confined (its workload was at {at})"),
                _ => format!(
                    "its init was killed by {sig} at setup step {} (its workload was at {at})",
                    Stage::ConfineInit.name()
                ),
            },
            Some(sig),
        ),
        Ok(WaitStatus::Signaled(_, sig, _)) => (format!("its init was killed by {sig} at {at}"), Some(sig)),
        // A step failed and could not say so (its report refused: after the seccomp step the
        // role's own policy must allow write(2)).
        Ok(WaitStatus::Exited(_, crate::exit::CONFIG)) => {
            (format!("a step failed at {at} or after it and its report could not be written"), None)
        }
        Ok(WaitStatus::Exited(_, code)) if progress.forked() && code > 128 => match Signal::try_from(code - 128) {
            Ok(sig) => (format!("its workload was killed by {sig} at {at}, before its exec"), Some(sig)),
            Err(_) => (format!("its workload ended with status {code} at {at}, without a report"), None),
        },
        other => (format!("its setup ended at {at} without a report ({other:?})"), None),
    };
    let fix = match (signal, status) {
        (Some(Signal::SIGSYS), _) => {
            "a seccomp filter above sealnode (a unit's SystemCallFilter=, a container runtime's profile) kills a call \
             this step makes: allow it there (`sealnode doctor` tries the setup's calls and names each one refused)"
        }
        (Some(Signal::SIGKILL), _) => {
            "something outside sealnode killed it: the OOM killer (the role's memory limit below what its setup \
             needs), or an operator or another supervisor; the kernel log (`journalctl -k`) says which"
        }
        (Some(_), _) => "something outside sealnode sent it that signal",
        (None, Ok(WaitStatus::Exited(_, crate::exit::CONFIG))) => {
            "the role's seccomp policy must allow write(2) without conditions (the setup reports on a pipe after \
             the filter is in force), and no filter above sealnode may refuse it"
        }
        (None, _) => "a bug in sealnode: please report it with this message",
    };
    Error::Killed { what: format!("{role} role: {what}"), fix: fix.into() }
}

/// The started sandbox as the kernel shows it, against its plan ([`shown`]): its init (through
/// the files opened at its clone), then its workload (the init's one child), whose exec closed
/// the error pipe. A process already gone is not checked (it holds nothing any more), nor one
/// this /proc does not show (hidepid, the units' ProtectProc=invisible: another user's
/// process; docs/canary.md).
fn check_shown(plan: &Plan, init: &mut shown::InitFiles) -> Result<()> {
    let role = plan.role;
    let filters = sys::own_status("Seccomp_filters").ok().and_then(|n| n.parse().ok()).unwrap_or(0);
    let wrong = |what: String| Error::Setup {
        step: "as the kernel shows it",
        detail: format!(
            "{role} role: {what}; a filter above sealnode fakes a call's success (`sealnode doctor` tries them)"
        ),
        errno: Errno::EPERM,
    };
    let held = |who: &str, what: Option<String>| match what {
        Some(w) => Err(wrong(format!("{who}: {w}"))),
        None => Ok(()),
    };
    if let Some(status) = init.status().and_then(|t| shown::status(&t)) {
        held("its init", shown::wrong(&status, plan, shown::Who::Init, filters))?;
    }
    let Some(workload) = init.child() else { return Ok(()) };
    if let Some(status) = shown::read(&format!("/proc/{workload}/status")).and_then(|t| shown::status(&t)) {
        held("its workload", shown::wrong(&status, plan, shown::Who::Workload, filters))?;
    }
    if let Some(limits) = shown::read(&format!("/proc/{workload}/limits")) {
        held("its workload", shown::wrong_limits(&limits, plan))?;
    }
    Ok(())
}

/// The workload's seccomp listener `fd`: the workload is the only child of the sandbox's init
/// (`init`, host pid) at this point, waiting for the copy; the copy must be a seccomp listener.
fn take_listener(init: &mut shown::InitFiles, fd: u32) -> Result<OwnedFd> {
    let what = "take the denial log's seccomp listener";
    let children = init.children().ok_or_else(|| {
        Error::errno(format!("{what}: the sandbox's init's children, opened at its clone"), Errno::ENOENT)
    })?;
    let workload: libc::pid_t = match children.split_whitespace().collect::<Vec<_>>()[..] {
        [one] => one
            .parse()
            .map_err(|e| Error::errno(format!("{what}: the sandbox's init's child {one:?}: {e}"), Errno::EPROTO))?,
        _ => return Err(Error::errno(format!("{what}: the sandbox's init has not exactly one child"), Errno::EPROTO)),
    };
    let pidfd = sys::pidfd_open(workload).map_err(|e| Error::errno(format!("{what}: pidfd_open"), e))?;
    let copy = sys::pidfd_getfd(&pidfd, fd as i32).map_err(|e| match e {
        // The shipped units deny @debug, which holds pidfd_getfd: the log is opt-in, and so is
        // the one syscall it needs (docs/policies.md, "The denial log").
        Errno::EPERM | Errno::ENOSYS => Error::Unsupported {
            what: format!("{what}: pidfd_getfd refused ({e})"),
            fix: "under the systemd units, allow it with a drop-in for the unit that runs this config \
                  (systemctl edit sealnode.service, sealnode-rootless.service or sealnode@NAME.service) -> \
                  [Service] SystemCallFilter=pidfd_getfd (or turn log_refused_syscalls off)"
                .into(),
        },
        e => Error::errno(format!("{what}: pidfd_getfd"), e),
    })?;
    // A reused pid would hand over some other fd: only a seccomp listener is kept.
    let link = std::fs::read_link(format!("/proc/self/fd/{}", copy.as_raw_fd())).unwrap_or_default();
    if link.as_os_str() != "anon_inode:seccomp notify" {
        return Err(Error::errno(
            format!("{what}: fd {fd} is {} (not a seccomp listener)", link.display()),
            Errno::EPROTO,
        ));
    }
    Ok(copy)
}

fn clone_error(e: Errno) -> Error {
    let (what, fix) = namespaces::explain_userns_failure(e);
    Error::Unsupported { what, fix }
}

fn setup_error(plan: &Plan, f: Failure<Stage>) -> Error {
    let stage = f.step;
    let item = f.item;
    let detail = match stage {
        Stage::BuildRoot | Stage::OpenSources => plan.mounts.get(item).map(Mount::describe).unwrap_or_default(),
        Stage::Landlock if item > 0 => plan
            .landlock
            .fs
            .get(item - 1)
            .map(|(p, _, _)| format!("rule for {}", p.to_string_lossy()))
            .unwrap_or_default(),
        Stage::Rlimits => plan.rlimits.get(item).map(|(r, _)| format!("{r:?}")).unwrap_or_default(),
        Stage::Exec => plan.argv.first().map(|a| a.to_string_lossy().into_owned()).unwrap_or_default(),
        Stage::Credentials => format!("uid {} gid {}", plan.ids.uid, plan.ids.gid),
        Stage::ConfineInit => format!("its init: {}", super::init::CONFINE_PARTS.get(item).copied().unwrap_or("")),
        _ => String::new(),
    };
    let mut detail = detail;
    if stage == Stage::BuildRoot && matches!(plan.mounts.get(item), Some(Mount::Proc { .. })) && f.errno == Errno::EPERM
    {
        detail.push_str(
            " (the kernel refuses a fresh /proc in a user namespace while the host's /proc has over-mounts: \
             systemd's ProtectKernelTunables=, ProtectKernelLogs=, ProtectHostname= or a container runtime's masks; \
             `sealnode doctor` lists them)",
        );
    }
    if matches!(stage, Stage::ConfineInit | Stage::Landlock) && f.errno == Errno::EOPNOTSUPP {
        detail.push_str(
            " (not in force as the kernel shows it: each is read back, and a filter above sealnode answering \
             landlock_restrict_self or prctl with a faked success is refused; `sealnode doctor` tries the calls)",
        );
    }
    if matches!(stage, Stage::BuildRoot | Stage::PrivatePropagation | Stage::PivotRoot) && f.errno == Errno::EOPNOTSUPP
    {
        detail.push_str(
            " (the kernel does not show it as it was asked: each mount and sysctl is read back, and a filter above \
             sealnode answering a call with a faked success is refused; `sealnode doctor` tries the calls)",
        );
    }
    if stage == Stage::BuildRoot && matches!(plan.mounts.get(item), Some(Mount::Bind { .. } | Mount::Tmpfs { .. })) {
        let why = match f.errno {
            Errno::ELOOP => Some(
                "a destination may cross no symlink (but sealnode's own, /lib -> usr/lib and the like): one in a \
                 bound directory could lead it out of the new root or over another path of the view; name the path \
                 the link leads to",
            ),
            Errno::EROFS => Some("no mount point can be made inside a read-only bind: bind it where the view has one"),
            Errno::ENOENT | Errno::ENOTDIR => {
                Some("a file or a missing path on the destination's way leaves no mount point")
            }
            Errno::ESTALE => Some(
                "its destination showed another mount than the one just made: a directory of a bound host tree was \
                 renamed or removed during the setup; the start is refused",
            ),
            _ => None,
        };
        if let Some(why) = why {
            detail.push_str(&format!(" ({why})"));
        }
    }
    if stage == Stage::OpenSources && f.errno == Errno::ESTALE {
        detail.push_str(" (it was replaced since it was checked before this start: the start is refused; start again)");
    }
    // `canary` and `exec` do not run `check`'s access check first (found by review: a capped
    // scratch under a root-only dir was told by its errno alone).
    if stage == Stage::OpenSources && f.errno == Errno::EACCES {
        detail.push_str(
            " (the role's ids cannot reach it: a directory on the way is not searchable by them; `sealnode check` names \
             the field)",
        );
    }
    Error::Setup {
        step: stage.name(),
        // Trimmed: a detail may be only a parenthesis pushed above (no double space).
        detail: match detail.trim_start() {
            "" => format!("{} role", plan.role),
            d => format!("{} role: {d}", plan.role),
        },
        errno: f.errno,
    }
}

/// Wait for the sandbox to exit without taking any signal: a caller with its own signal
/// handling (the supervisor's signalfd) still finds SIGTERM and the rest pending afterwards.
/// Returns the workload's exit code (128+N if killed by signal N).
pub fn wait_exit(sb: Sandbox) -> i32 {
    loop {
        match waitpid(sb.pid, None) {
            Ok(WaitStatus::Exited(_, code)) => return code,
            Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
            Ok(_) | Err(Errno::EINTR) => continue,
            Err(_) => return 128 + libc::SIGKILL,
        }
    }
}

/// Wait for the sandbox to exit, forwarding SIGTERM/SIGINT/SIGHUP/SIGQUIT/SIGUSR1/SIGUSR2 to its
/// init. A terminating signal (SIGTERM, SIGINT, SIGHUP, SIGQUIT) is a stop, as `run`'s: if the
/// sandbox has not exited `grace` after the first, or at a second, its init is killed, and with
/// it the sandbox's whole pid namespace, so a workload that ignores or blocks signals, or hangs,
/// never holds `exec` (`timeout`, a unit's stop, a second Ctrl-C). A signal that was ignored
/// when this process started (`nohup`, a shell's background job) stays ignored: neither passed
/// on nor a stop (found by review: `nohup sealnode exec` was killed at a hangup). Returns the
/// workload's exit code (128+N if killed by signal N).
pub fn run_to_exit(sb: Sandbox, grace: std::time::Duration) -> i32 {
    let set = launcher_sigset();
    // Blocked, an ignored signal is queued rather than dropped: taken here and let go.
    let ignored: Vec<Signal> = FORWARDED.into_iter().filter(|s| sys::is_ignored(*s)).collect();
    let mut kill_at: Option<std::time::Instant> = None;
    loop {
        let left = kill_at.map(|t| t.saturating_duration_since(std::time::Instant::now()));
        match sys::wait_signal(&set, left) {
            Ok(Some(Signal::SIGCHLD)) => match waitpid(sb.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => return code,
                Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
                Ok(_) => continue,
                Err(Errno::EINTR) => continue,
                Err(_) => return 128 + libc::SIGKILL,
            },
            Ok(Some(sig)) if ignored.contains(&sig) => {}
            // The stop's grace is over, or a second stop came: no more asking.
            Ok(None) => {
                kill_at = None;
                let _ = kill(sb.pid, Signal::SIGKILL);
            }
            Ok(Some(sig)) if is_terminating(sig) && kill_at.is_some() => {
                kill_at = None;
                let _ = kill(sb.pid, Signal::SIGKILL);
            }
            Ok(Some(sig)) => {
                if is_terminating(sig) {
                    kill_at = Some(std::time::Instant::now() + grace);
                }
                let _ = kill(sb.pid, sig);
            }
            Err(_) => continue,
        }
    }
}

/// A signal that asks a foreground command to end (its second one is not asked again).
fn is_terminating(sig: Signal) -> bool {
    matches!(sig, Signal::SIGTERM | Signal::SIGINT | Signal::SIGHUP | Signal::SIGQUIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Role;

    /// The intermediate's failure names its step: a failed clone of the role is the cell's
    /// namespaces; a failed map write names its own step. (A failed clone straight into the
    /// role's cgroup leaf, the intermediate's own, is the supervisor's: named there.)
    #[test]
    fn the_intermediates_failures_name_their_step() {
        let clone_failed = Frame::Failed { step: Enter::CloneRole.code(), item: 0, errno: libc::ENOENT };
        let e = entering_failed(clone_failed, Role::Node);
        assert!(
            matches!(&e, Error::Unsupported { what, .. } if what.contains("entering the cell (clone_role)")),
            "{e}"
        );
        let join_failed = Frame::Failed { step: Enter::JoinCell.code(), item: 0, errno: libc::EPERM };
        let e = entering_failed(join_failed, Role::Node);
        assert!(matches!(&e, Error::Unsupported { what, .. } if what.contains("entering the cell (join_cell)")), "{e}");
        let map_failed = Frame::Failed { step: Enter::MapRole.code(), item: 0, errno: libc::EPERM };
        match entering_failed(map_failed, Role::Node) {
            Error::Setup { step, detail, errno } => {
                assert_eq!((step, errno), ("map_role", Errno::EPERM));
                assert!(detail.contains("node role") && detail.contains("uid_map and gid_map"), "{detail}");
            }
            e => panic!("not the map: {e}"),
        }
    }

    /// A setup killed without a word is told by process, signal and step: the workload (its
    /// init passes on 128+N), the init before the fork (the only process then) and after it
    /// (confining itself); an end that is no kill is a bug, said so.
    #[test]
    fn a_killed_setup_names_the_process_the_signal_and_the_step() {
        let p = Pid::from_raw(7);
        let at = |s: Stage, init| Progress { workload: Some(s), init };
        let said = |status, progress| killed_error(Role::Engine, Ok(status), progress).to_string();
        let e = said(WaitStatus::Exited(p, 128 + libc::SIGSYS), at(Stage::Rlimits, InitSaid::Confining));
        assert!(
            e.contains("engine role: its workload was killed by SIGSYS at setup step rlimits, before its exec"),
            "{e}"
        );
        assert!(e.contains("SystemCallFilter=") && e.contains("sealnode doctor"), "{e}");
        let e = said(WaitStatus::Signaled(p, Signal::SIGKILL, false), at(Stage::BuildRoot, InitSaid::Nothing));
        assert!(e.contains("its init was killed by SIGKILL at setup step build_root") && e.contains("OOM"), "{e}");
        let e = said(WaitStatus::Signaled(p, Signal::SIGSYS, false), at(Stage::Exec, InitSaid::Confining));
        assert!(
            e.contains(
                "its init was killed by SIGSYS at setup step confine_init (its workload was at setup step exec)"
            ),
            "{e}"
        );
        let e = said(WaitStatus::Signaled(p, Signal::SIGKILL, false), at(Stage::Exec, InitSaid::Confined));
        assert!(e.contains("its init was killed by SIGKILL once confined"), "{e}");
        let e = said(WaitStatus::Exited(p, crate::exit::CONFIG), at(Stage::HandOverListener, InitSaid::Confined));
        assert!(
            e.contains(
                "a step failed at setup step hand_over_listener or after it and its report could not be written"
            ) && e.contains("must allow write(2)"),
            "{e}"
        );
        let e = said(WaitStatus::Exited(p, 0), at(Stage::Landlock, InitSaid::Confined));
        assert!(e.contains("ended at setup step landlock without a report") && e.contains("a bug in sealnode"), "{e}");
        let e = said(WaitStatus::Signaled(p, Signal::SIGTERM, false), Progress::default());
        assert!(e.contains("killed by SIGTERM at its first setup step"), "{e}");
        let e = killed_error(Role::Node, Err(Errno::ETIMEDOUT), at(Stage::Seccomp, InitSaid::Confined)).to_string();
        assert!(e.contains("node role: its setup ended at setup step seccomp without a report"), "{e}");
    }

    /// The workload's and the init's frames are kept apart, and a setup held past its limit is
    /// told at the init's step when the workload had exec'd.
    #[test]
    fn progress_keeps_the_two_processes_apart() {
        let mut p = Progress::default();
        for f in [
            Frame::Reached(Stage::ForkWorkload.code()),
            Frame::Reached(Stage::ConfineInit.code()),
            Frame::Reached(Stage::Rlimits.code()),
            Frame::Reached(Stage::Exec.code()),
        ] {
            assert_eq!(p.take(f), Ok(true));
        }
        assert_eq!(p, Progress { workload: Some(Stage::Exec), init: InitSaid::Confining });
        let e = held_error(Role::Engine, p).to_string();
        assert!(e.contains("confine_init: engine role: its init held at this step for 60 s"), "{e}");
        assert_eq!(p.take(Frame::Done(Stage::ConfineInit.code())), Ok(true));
        assert_eq!(p.init, InitSaid::Confined);
        assert_eq!(p.take(Frame::Done(Stage::Exec.code())), Err(Errno::EPROTO));
        assert_eq!(p.take(Frame::Reached(999)), Err(Errno::EPROTO));
        assert_eq!(p.take(Frame::Ok(3)), Ok(false));
        let e =
            held_error(Role::Node, Progress { workload: Some(Stage::BuildRoot), init: InitSaid::Nothing }).to_string();
        assert!(e.contains("build_root: node role: its setup held at this step for 60 s"), "{e}");
    }
}
