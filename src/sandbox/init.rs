//! sealnode's pid 1 inside the sandbox: confines itself, then reaps and forwards signals
//! until the workload exits, and exits with the workload's status. Its exit tears down the
//! pid namespace: the kernel kills every process left in it.

use nix::errno::Errno;
use nix::sys::signal::{kill, sigaction, SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;

use super::caps;
use super::plan::Plan;
use super::protocol::{self, fail, Frame, Step, FORWARDED};
use super::stage::ChildFds;
use super::stage::Stage;
use crate::os::sys;
use crate::policy::landlock;

extern "C" fn noop(_: libc::c_int) {}

/// The parts of the init's confinement, as its failure report names them (the frame's item).
pub const CONFINE_PARTS: [&str; 5] =
    ["its ids", "its death signal", "every capability dropped", "not dumpable", "its deny-all Landlock domain"];

/// The init confines itself; a failure names its part ([`CONFINE_PARTS`], by index).
fn confine(plan: &Plan, fds: ChildFds) -> Result<(), (usize, Errno)> {
    // Same ids as the workload, so init can still signal it without any capability.
    caps::set_ids(plan.ids).map_err(|e| (0, e))?;
    // The id change cleared PDEATHSIG: re-arm it, and give up if the launcher is already gone.
    sys::rearm_pdeathsig(fds.sync).map_err(|e| (1, e))?;
    caps::drop_all_no_exec().map_err(|e| (2, e))?;
    // Not dumpable: the workload (same uid) cannot ptrace or read init's memory (read back:
    // found by review, a faked one went unseen; the id change above already made the init
    // non-dumpable where fs.suid_dumpable is 0, the default, but not where it is 1 or 2).
    sys::prctl(libc::PR_SET_DUMPABLE, 0).map_err(|e| (3, e))?;
    if sys::dumpable().map_err(|e| (3, e))? {
        return Err((3, Errno::EOPNOTSUPP));
    }
    // Init needs no file and no network at all (read back).
    landlock::deny_all(plan.landlock.abi).map_err(|e| (4, landlock::ApplyError::errno(e)))?;
    // pid 1 ignores signals whose disposition is SIG_DFL: install handlers, then wait for them.
    let act = SigAction::new(SigHandler::Handler(noop), SaFlags::SA_RESTART, SigSet::empty());
    for s in FORWARDED.iter().chain([Signal::SIGCHLD].iter()) {
        // SAFETY: the handler does nothing; signals are consumed with sigwait below.
        unsafe { sigaction(*s, &act) }.map_err(|e| (0, e))?;
    }
    Ok(())
}

fn wait_set() -> SigSet {
    let mut set = SigSet::empty();
    for s in FORWARDED {
        set.add(s);
    }
    set.add(Signal::SIGCHLD);
    set
}

pub fn run(plan: &Plan, workload: Pid, fds: ChildFds) -> ! {
    // Hold the workload's /proc/<pid>/task for its life: a Landlock rule on /proc/self/task
    // (the GPU profile's thread names) is tied to that inode, and procfs makes a new one once
    // an unused dentry is evicted, which would end the rule; held, the inode outlives a drop of
    // the dentry cache (tests/devices.rs: the_engines_thread_names_survive_a_dentry_cache_drop).
    // Best effort: without it only that rule can stop matching. O_PATH: no access to it.
    let _task_dir = nix::fcntl::open(
        format!("/proc/{}/task", workload.as_raw()).as_str(),
        nix::fcntl::OFlag::O_PATH | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    );
    let set = wait_set();
    // Said before and after (the parent waits for both this and the workload's exec): an init
    // killed or held while it confines itself is told so, never taken for a confined one (found
    // by review: one killed here after its workload's exec was accepted as started).
    let confined = protocol::send(fds.err, Frame::Reached(Stage::ConfineInit.code()))
        .and_then(|()| nix::sys::signal::sigprocmask(SigmaskHow::SIG_BLOCK, Some(&set), None))
        .map_err(|e| (0, e))
        .and_then(|_| confine(plan, fds))
        .and_then(|()| protocol::send(fds.err, Frame::Done(Stage::ConfineInit.code())).map_err(|e| (0, e)));
    if let Err((part, e)) = confined {
        let _ = kill(workload, Signal::SIGKILL);
        fail(fds.err, Stage::ConfineInit, part, e);
    }
    // Our copy of the error pipe closes now; the workload's closes at exec -> parent sees EOF.
    let _ = nix::unistd::close(fds.err);
    let _ = nix::unistd::close(fds.sync);
    loop {
        match set.wait() {
            Ok(Signal::SIGCHLD) => reap(workload),
            Ok(sig) => {
                let _ = kill(workload, sig);
            }
            Err(_) => {}
        }
    }
}

/// Reap every exited child; exit with the workload's status once it is gone.
fn reap(workload: Pid) {
    loop {
        match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(pid, code)) if pid == workload => sys::exit_now(code),
            Ok(WaitStatus::Signaled(pid, sig, _)) if pid == workload => sys::exit_now(128 + sig as i32),
            Ok(WaitStatus::StillAlive) => return,
            Ok(_) => continue,
            Err(Errno::EINTR) => continue,
            Err(_) => sys::exit_now(128 + libc::SIGKILL),
        }
    }
}
