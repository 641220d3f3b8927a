//! Parent side: clone the child into its namespaces, write its id maps, learn whether its
//! setup succeeded, and wait for it while forwarding signals.

use std::os::fd::{AsRawFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::signal::{kill, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{pipe2, Pid};

use super::child::{child_main, ChildFds};
use super::plan::{Mount, Plan};
use super::stage::{Record, Stage};
use crate::cell::Cell;
use crate::error::{Error, Result};
use crate::sys;

/// The namespaces every role gets of its own, inside or outside a cell.
pub const ROLE_NAMESPACES: libc::c_int =
    libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWCGROUP;

/// The canary matrix's "namespaces off" columns: still private user, mount, uts and ipc
/// namespaces (so nothing the probe tries touches the host), but the host's pid and net.
pub const MATRIX_NAMESPACES: libc::c_int =
    libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC;

/// All namespaces of a standalone sandbox (`exec`): the role's own plus user and net.
pub const NAMESPACES: libc::c_int = ROLE_NAMESPACES | libc::CLONE_NEWUSER | libc::CLONE_NEWNET;

/// Signals the launcher passes on to the sandbox's init.
pub const FORWARDED: [Signal; 6] =
    [Signal::SIGTERM, Signal::SIGINT, Signal::SIGHUP, Signal::SIGQUIT, Signal::SIGUSR1, Signal::SIGUSR2];

/// A running sandbox whose workload has exec'd.
#[derive(Debug)]
pub struct Sandbox {
    /// Host pid of the sandbox's init (pid 1 inside).
    pub pid: Pid,
    /// Held open for the sandbox's lifetime: its closing tells a child still in setup that
    /// the launcher is gone.
    _alive: OwnedFd,
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
/// own child (waitable, and its parent-death signal tied to the supervisor).
fn clone_into_cell(cell: &Cell, plan: &Plan, fds: ChildFds) -> Result<libc::pid_t> {
    let (pid_r, pid_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2", e))?;
    // SAFETY: the supervisor is single-threaded.
    match unsafe { nix::unistd::fork() }.map_err(|e| Error::errno("fork", e))? {
        nix::unistd::ForkResult::Child => {
            drop(pid_r);
            let net = match plan.role {
                crate::config::Role::Engine => crate::cell::Net::Engine,
                crate::config::Role::Node => crate::cell::Net::Node,
            };
            // SAFETY: the intermediate is single-threaded (a fresh fork).
            let r = cell.join(net).and_then(|()| unsafe { sys::clone_fork(libc::CLONE_PARENT | ROLE_NAMESPACES) });
            match r {
                Ok(0) => child_main(plan, fds),
                Ok(pid) => {
                    let _ = sys::write_all(pid_w.as_raw_fd(), &pid.to_ne_bytes());
                    sys::exit_now(0)
                }
                Err(e) => {
                    let _ = sys::write_all(pid_w.as_raw_fd(), &(-(e as i32)).to_ne_bytes());
                    sys::exit_now(1)
                }
            }
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(pid_w);
            let mut b = [0u8; 4];
            let n = sys::read_retry(pid_r.as_raw_fd(), &mut b).map_err(|e| Error::errno("read role pid", e))?;
            let _ = waitpid(child, None);
            let v = i32::from_ne_bytes(b);
            match (n, v) {
                (4, v) if v > 0 => Ok(v),
                (4, v) => {
                    let (what, fix) = crate::doctor::explain_userns_failure(Errno::from_raw(-v));
                    Err(Error::Unsupported { what: format!("entering the cell: {what}"), fix })
                }
                _ => Err(Error::errno("intermediate died before cloning the role", Errno::EPIPE)),
            }
        }
    }
}

/// Start `plan` in `cell` (shared user + net namespaces) or standalone when `cell` is None.
pub fn spawn_in(plan: &Plan, cell: Option<&Cell>) -> Result<Sandbox> {
    // Blocked before clone so no signal or child exit is lost between here and the wait loop.
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&launcher_sigset()), None)
        .map_err(|e| Error::errno("sigprocmask", e))?;
    let (err_r, err_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2", e))?;
    let (sync_r, sync_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2", e))?;
    // The child closes every other fd as its first steps (close_inherited_fds).
    let fds = ChildFds { err: err_w.as_raw_fd(), sync: sync_r.as_raw_fd() };
    let pid = match cell {
        Some(cell) => clone_into_cell(cell, plan, fds)?,
        None => {
            let flags = if plan.layers.namespaces { NAMESPACES } else { MATRIX_NAMESPACES };
            // SAFETY: the launcher is single-threaded (no thread is ever started before this point).
            let pid = unsafe { sys::clone_fork(flags) }.map_err(clone_error)?;
            if pid == 0 {
                child_main(plan, fds);
            }
            pid
        }
    };
    drop(err_w);
    drop(sync_r);
    let pid = Pid::from_raw(pid);
    let abort = |e: Error| {
        let _ = kill(pid, Signal::SIGKILL);
        let _ = waitpid(pid, None);
        e
    };
    if cell.is_none() {
        write_id_maps(pid, plan).map_err(abort)?;
    }
    sys::write_all(sync_w.as_raw_fd(), &[1]).map_err(|e| abort(Error::errno("release child", e)))?;
    let mut buf = [0u8; Record::SIZE];
    let mut got = 0;
    while got < buf.len() {
        match sys::read_retry(err_r.as_raw_fd(), &mut buf[got..]) {
            Ok(0) => break,
            Ok(n) => got += n,
            Err(e) => return Err(abort(Error::errno("read setup status", e))),
        }
    }
    match got {
        0 => Ok(Sandbox { pid, _alive: sync_w }),
        Record::SIZE => {
            let _ = waitpid(pid, None);
            Err(setup_error(plan, Record::decode(&buf)))
        }
        _ => Err(abort(Error::errno("short setup status record", Errno::EPROTO))),
    }
}

fn write_id_maps(pid: Pid, plan: &Plan) -> Result<()> {
    let dir = format!("/proc/{pid}");
    let w = |name: &str, data: String| {
        std::fs::write(format!("{dir}/{name}"), data.as_bytes())
            .map_err(|e| Error::io(format!("write {dir}/{name} ({})", data.trim()), e))
    };
    if !plan.rootful {
        // Unprivileged: setgroups must be denied before gid_map may be written.
        w("setgroups", "deny".into())?;
    }
    // Each map written once, one line: the role's host ids map to themselves.
    w("uid_map", format!("{0} {0} 1\n", plan.ids.uid))?;
    w("gid_map", format!("{0} {0} 1\n", plan.ids.gid))?;
    Ok(())
}

fn clone_error(e: Errno) -> Error {
    let (what, fix) = crate::doctor::explain_userns_failure(e);
    Error::Unsupported { what, fix }
}

fn setup_error(plan: &Plan, rec: Record) -> Error {
    let stage = Stage::from_u32(rec.stage);
    let item = rec.item as usize;
    let detail = match stage {
        Some(Stage::BuildRoot | Stage::OpenSources) => plan.mounts.get(item).map(Mount::describe).unwrap_or_default(),
        Some(Stage::Landlock) if item > 0 => plan
            .landlock
            .fs
            .get(item - 1)
            .map(|(p, _, _)| format!("rule for {}", p.to_string_lossy()))
            .unwrap_or_default(),
        Some(Stage::Rlimits) => ["RLIMIT_CORE", "RLIMIT_NOFILE", "RLIMIT_NPROC", "RLIMIT_FSIZE", "RLIMIT_MEMLOCK"]
            .get(item)
            .map(|s| s.to_string())
            .unwrap_or_default(),
        Some(Stage::Exec) => plan.argv.first().map(|a| a.to_string_lossy().into_owned()).unwrap_or_default(),
        Some(Stage::Credentials) => format!("uid {} gid {}", plan.ids.uid, plan.ids.gid),
        _ => String::new(),
    };
    let mut detail = detail;
    if stage == Some(Stage::BuildRoot)
        && matches!(plan.mounts.get(item), Some(Mount::Proc { .. }))
        && rec.errno == libc::EPERM
    {
        detail.push_str(
            " (the kernel refuses a fresh /proc in a user namespace while the host's /proc has over-mounts: \
             systemd's ProtectKernelTunables=, ProtectKernelLogs=, ProtectProc= or a container runtime's masks; \
             `sealnode doctor` lists them)",
        );
    }
    Error::Setup {
        step: stage.map(Stage::name).unwrap_or("unknown"),
        detail: if detail.is_empty() { format!("{} role", plan.role) } else { format!("{} role: {detail}", plan.role) },
        errno: Errno::from_raw(rec.errno),
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
/// init. Returns the workload's exit code (128+N if killed by signal N).
pub fn run_to_exit(sb: Sandbox) -> i32 {
    let set = launcher_sigset();
    loop {
        match set.wait() {
            Ok(Signal::SIGCHLD) => match waitpid(sb.pid, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(_, code)) => return code,
                Ok(WaitStatus::Signaled(_, sig, _)) => return 128 + sig as i32,
                Ok(_) => continue,
                Err(Errno::EINTR) => continue,
                Err(_) => return 128 + libc::SIGKILL,
            },
            Ok(sig) => {
                let _ = kill(sb.pid, sig);
            }
            Err(_) => continue,
        }
    }
}
