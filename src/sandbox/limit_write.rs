//! A limit written into a running role's cgroup leaf. A lower `memory.high` or `memory.max`
//! makes the kernel reclaim the difference inside the write(2), for as long as that takes
//! (about a second for 400 MiB of page cache in the emulated test guest; seconds for the tens
//! of GiB a large model leaves cached), and a write from the supervisor's loop would hold
//! forwarding, `ctl` and signals as long. Such a write, where the role uses more than the new
//! value, is made by a short-lived child (`sealnode-limit`, holding nothing of the supervisor's
//! but the file) instead, waited for [`WAIT`]: past that, the value read back from the file
//! proves the limit in force (the kernel sets it before it reclaims), the caller goes on and the
//! loop reaps the child once the kernel is done ([`super::cgroup::Tree::writer_exited`], which
//! also reads the file again: a stopped writer never leaves a value that is not in force). Any
//! other write is made directly, and so is this one where no child can be made (a role that
//! used up the unit's tasks: the limit matters more than the loop's pause). A writer is stopped
//! (SIGKILL, not waited for) when its file is written again: it reclaims towards the
//! value it wrote, no longer the one wanted, and the kernel sees the signal only between
//! rounds of reclaim (a round may be long: some cache may still go).

use std::io;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::{ForkResult, Pid};

use crate::os::sys;

/// The files whose lowering the kernel reclaims inside the write.
pub const RECLAIMING: [&str; 2] = ["memory.high", "memory.max"];

/// How long a write may hold the caller before the value read back is taken as proof.
pub const WAIT: Duration = Duration::from_millis(50);

/// How long the kernel may take to set the value at all (it does so before reclaiming, so
/// only a starved machine comes near): past it the write fails and its child is stopped.
const GIVE_UP: Duration = Duration::from_secs(2);

/// A child in the kernel's write: the limit in force and the kernel reclaiming, or stopped.
#[derive(Debug)]
pub struct Writer {
    pub pid: Pid,
    pub file: String,
    pub value: String,
    pub since: Instant,
    /// SIGKILLed: its value is no longer wanted; the loop reaps it all the same.
    pub stopped: bool,
    /// Itself a write of the value in force again after a stopped writer's late value
    /// (`Tree::writer_exited`): not written again a second time.
    pub again: bool,
}

impl Writer {
    /// SIGKILL: the kernel's reclaim loop ends at its next round. Not waited for (one round may
    /// be long): the loop reaps it as any writer.
    pub fn stop(&mut self) {
        if !self.stopped {
            let _ = kill(self.pid, Signal::SIGKILL);
            self.stopped = true;
        }
    }
}

/// Write `value` into the cgroup file `path`: directly, or through a child (the module doc).
/// Returns whether the write goes on in a child (pushed to `writers`, the limit in force). An
/// error is the write's own (opening the file, the kernel refusing the value) or the kernel
/// not taking it within [`GIVE_UP`] (its child stopped and pushed to `writers`, to be reaped).
pub fn write(path: &Path, value: &str, writers: &mut Vec<Writer>) -> io::Result<bool> {
    write_proven(path, value, writers, || in_force(path, value))
}

/// Whether writing `value` into `path` may make the kernel reclaim: a memory limit below what
/// the leaf uses now (memory.current beside it; unknown usage counts as more).
fn may_reclaim(path: &Path, value: &str) -> bool {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if !RECLAIMING.contains(&name) || value.trim() == "max" {
        return false;
    }
    let used =
        std::fs::read_to_string(path.with_file_name("memory.current")).ok().and_then(|s| s.trim().parse::<u64>().ok());
    match (value.trim().parse::<u64>(), used) {
        (Ok(v), Some(used)) => v < used,
        _ => true,
    }
}

/// [`write`], with what proves the value in force.
fn write_proven(path: &Path, value: &str, writers: &mut Vec<Writer>, proven: impl Fn() -> bool) -> io::Result<bool> {
    if !may_reclaim(path, value) {
        return std::fs::write(path, value).map(|()| false);
    }
    // Opened here: a file that cannot be opened fails as a direct write would.
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    let parent = nix::unistd::getpid();
    // SAFETY: the supervisor is single-threaded; the child closes every other fd, names itself,
    // arms its death signal, writes one buffer and exits.
    let pid = match unsafe { nix::unistd::fork() } {
        Ok(ForkResult::Child) => {
            // Nothing of the supervisor's kept open while the kernel reclaims: sockets it
            // closes must close, its locks must go with it (found by review).
            if sys::close_all_except(&[file.as_raw_fd()]).is_err() {
                sys::exit_now(libc::EBADF);
            }
            let _ = nix::sys::prctl::set_name(c"sealnode-limit");
            // Never outlives the supervisor (a reload after a restart would race it), even one
            // that died before the death signal was armed.
            if sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong).is_err()
                || nix::unistd::getppid() != parent
            {
                sys::exit_now(libc::ESRCH);
            }
            let code = match nix::unistd::write(&file, value.as_bytes()) {
                Ok(n) if n == value.len() => 0,
                Ok(_) => libc::EIO,
                Err(e) => e as i32,
            };
            sys::exit_now(code)
        }
        Ok(ForkResult::Parent { child }) => child,
        Err(e) => {
            tracing::warn!(file = %path.display(), error = %e, "no child for a lower memory limit's write: written in sealnode's loop, which waits for the kernel's reclaim");
            return std::fs::write(path, value).map(|()| false);
        }
    };
    drop(file);
    let start = Instant::now();
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
    let writer =
        |stopped| Writer { pid, file: name.clone(), value: value.to_string(), since: start, stopped, again: false };
    let mut nap = Duration::from_micros(200);
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, 0)) => return Ok(false),
            Ok(WaitStatus::Exited(_, errno)) => return Err(io::Error::from_raw_os_error(errno)),
            Ok(WaitStatus::Signaled(_, s, _)) => return Err(io::Error::other(format!("the writer died of {s}"))),
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let waited = start.elapsed();
        if waited >= WAIT && proven() {
            writers.push(writer(false));
            return Ok(true);
        }
        if waited >= GIVE_UP {
            // Stopped, and left to the loop to reap (its file is read again then).
            let _ = kill(pid, Signal::SIGKILL);
            writers.push(writer(true));
            return Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the kernel did not take the value within {} s", GIVE_UP.as_secs()),
            ));
        }
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(5));
    }
}

/// Whether `path` reads `value` back: "max", or a number of bytes (the kernel keeps pages:
/// compared to the page below).
pub fn in_force(path: &Path, value: &str) -> bool {
    let Ok(now) = std::fs::read_to_string(path) else { return false };
    let (now, value) = (now.trim(), value.trim());
    let page = |s: &str| s.parse::<u64>().ok().map(|b| b / 4096);
    now == value || page(now).is_some_and(|p| Some(p) == page(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    /// The children this test thread has (forked and not reaped).
    fn children() -> String {
        std::fs::read_to_string("/proc/thread-self/children").expect("children")
    }

    /// A file the kernel does not reclaim for is written at once, no child.
    #[test]
    fn other_files_are_written_directly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("pids.max");
        std::fs::write(&p, "").expect("create");
        let mut writers = Vec::new();
        assert!(!write(&p, "64", &mut writers).expect("write"));
        assert!(writers.is_empty());
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "64");
    }

    /// Only a memory limit below what the leaf uses may make the kernel reclaim: "max", a
    /// value at or above memory.current, any other file are written directly.
    #[test]
    fn only_a_limit_below_the_usage_may_reclaim() {
        let dir = tempfile::tempdir().expect("tempdir");
        let max = dir.path().join("memory.max");
        assert!(may_reclaim(&max, "268435456"), "usage unknown: counted as more");
        assert!(!may_reclaim(&max, "max"));
        assert!(!may_reclaim(&dir.path().join("pids.max"), "1"));
        std::fs::write(dir.path().join("memory.current"), "268435456\n").expect("current");
        assert!(!may_reclaim(&max, "268435456"), "at the usage");
        assert!(!may_reclaim(&dir.path().join("memory.high"), "536870912"), "above it");
        assert!(may_reclaim(&max, "134217728"), "below it");
    }

    /// A reclaiming file's write through the child: done within the wait, nothing left.
    #[test]
    fn a_quick_write_is_waited_for() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("memory.max");
        std::fs::write(&p, "").expect("create");
        let mut writers = Vec::new();
        assert!(!write(&p, "268435456", &mut writers).expect("write"));
        assert!(writers.is_empty());
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "268435456");
    }

    /// A write the kernel refuses fails with its errno; a file that is not there, at once.
    #[test]
    fn a_refused_write_fails_with_its_errno() {
        let dir = tempfile::tempdir().expect("tempdir");
        let mut writers = Vec::new();
        let e = write(&dir.path().join("memory.max"), "1", &mut writers).expect_err("no file");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        // /dev/full refuses every write with ENOSPC, as a kernel refusing the value would.
        std::os::unix::fs::symlink("/dev/full", dir.path().join("memory.high")).expect("symlink");
        let e = write(&dir.path().join("memory.high"), "1", &mut writers).expect_err("ENOSPC");
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
        assert!(writers.is_empty());
    }

    /// A FIFO named memory.max whose reader reads nothing and whose buffer is full: a write
    /// into it blocks, as a kernel write that reclaims does. (The reader and the filler are
    /// returned to be held.)
    fn blocking_file(dir: &Path) -> (std::path::PathBuf, std::fs::File, std::fs::File) {
        let fifo = dir.join("memory.max");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).expect("mkfifo");
        let reader = std::fs::OpenOptions::new().read(true).custom_flags(libc::O_NONBLOCK).open(&fifo).expect("reader");
        let filler =
            std::fs::OpenOptions::new().write(true).custom_flags(libc::O_NONBLOCK).open(&fifo).expect("filler");
        while nix::unistd::write(&filler, &[0u8; 4096]).is_ok() {}
        (fifo, reader, filler)
    }

    /// A write still blocked once the value is in force holds the caller for the wait and no
    /// longer: its child is left to the kernel, and stopping it waits for nothing.
    #[test]
    fn a_blocked_write_in_force_is_left_to_its_child() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (fifo, _reader, _filler) = blocking_file(dir.path());
        let mut writers = Vec::new();
        let t = Instant::now();
        assert!(write_proven(&fifo, "268435456", &mut writers, || true).expect("write"), "left to its child");
        let held = t.elapsed();
        assert!(held >= WAIT && held < WAIT + Duration::from_millis(500), "held the caller {held:?}");
        let mut w = writers.pop().expect("the writer");
        assert_eq!((w.file.as_str(), w.value.as_str(), w.stopped), ("memory.max", "268435456", false));
        assert_eq!(kill(w.pid, None), Ok(()), "still writing");
        let t = Instant::now();
        w.stop();
        assert!(w.stopped && t.elapsed() < Duration::from_millis(100), "stopping waits for nothing");
        assert!(matches!(waitpid(w.pid, None), Ok(WaitStatus::Signaled(_, Signal::SIGKILL, _))));
    }

    /// The writer holds nothing of the caller's but its file: a socket the caller closes while
    /// the kernel reclaims is closed (found by review: its peer saw no end until the writer
    /// was gone).
    #[test]
    fn a_writer_holds_nothing_of_the_callers() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (fifo, _reader, _filler) = blocking_file(dir.path());
        let (ours, peer) = std::os::unix::net::UnixStream::pair().expect("pair");
        let mut writers = Vec::new();
        assert!(write_proven(&fifo, "268435456", &mut writers, || true).expect("write"));
        drop(ours);
        peer.set_read_timeout(Some(Duration::from_millis(500))).expect("timeout");
        let mut b = [0u8; 1];
        let read = std::io::Read::read(&mut &peer, &mut b);
        let mut w = writers.pop().expect("the writer");
        w.stop();
        let _ = waitpid(w.pid, None);
        assert!(matches!(read, Ok(0)), "the end while the writer lived: {read:?}");
    }

    /// A write whose value never reads back fails once the kernel has had long enough; its
    /// child is stopped and handed over to be reaped: a limit not proven in force is not taken
    /// as written.
    #[test]
    fn a_blocked_write_never_in_force_fails() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (fifo, _reader, _filler) = blocking_file(dir.path());
        let mut writers = Vec::new();
        let t = Instant::now();
        let e = write_proven(&fifo, "268435456", &mut writers, || false).expect_err("never in force");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= GIVE_UP && t.elapsed() < GIVE_UP + Duration::from_secs(1), "{:?}", t.elapsed());
        let w = writers.pop().expect("handed over");
        assert!(w.stopped);
        assert!(matches!(waitpid(w.pid, None), Ok(WaitStatus::Signaled(_, Signal::SIGKILL, _))));
    }

    /// Where no child can be made (no processes left to this user), the write is made directly:
    /// the limit is written, the caller waits as it did before writers.
    #[test]
    fn no_child_means_a_direct_write() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("memory.max");
        std::fs::write(&p, "").expect("create");
        let before = children();
        // SAFETY: the child only drops its ids and limits, writes, reports and exits.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            ForkResult::Child => {
                use nix::unistd::{Gid, Uid};
                let code = (|| -> Result<i32, nix::errno::Errno> {
                    if nix::unistd::geteuid().is_root() {
                        std::os::unix::fs::chown(dir.path(), Some(65534), Some(65534))
                            .map_err(|_| nix::errno::Errno::EPERM)?;
                        std::os::unix::fs::chown(&p, Some(65534), Some(65534)).map_err(|_| nix::errno::Errno::EPERM)?;
                        nix::unistd::setresgid(Gid::from_raw(65534), Gid::from_raw(65534), Gid::from_raw(65534))?;
                        nix::unistd::setresuid(Uid::from_raw(65534), Uid::from_raw(65534), Uid::from_raw(65534))?;
                    }
                    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NPROC, 0, 0)?;
                    let mut writers = Vec::new();
                    Ok(match write(&p, "268435456", &mut writers) {
                        Ok(false) if writers.is_empty() => 0,
                        _ => 2,
                    })
                })()
                .unwrap_or(3);
                sys::exit_now(code)
            }
            ForkResult::Parent { child } => {
                assert!(matches!(waitpid(child, None), Ok(WaitStatus::Exited(_, 0))), "written without a child");
            }
        }
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "268435456");
        assert_eq!(children(), before);
    }

    /// What proves a value in force: the same text, or the same page count.
    #[test]
    fn in_force_reads_the_value_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("memory.max");
        for (now, value, yes) in [
            ("max\n", "max", true),
            ("268435456\n", "268435456", true),
            ("268435456\n", "268439551", true),
            ("max\n", "268435456", false),
            ("268435456\n", "134217728", false),
        ] {
            std::fs::write(&p, now).expect("write");
            assert_eq!(in_force(&p, value), yes, "{now:?} {value:?}");
        }
        assert!(!in_force(&dir.path().join("none"), "max"));
    }
}
