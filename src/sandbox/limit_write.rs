//! A limit written into a running role's cgroup leaf. A lower `memory.high` or `memory.max`
//! makes the kernel reclaim the difference inside the write(2), for as long as that takes
//! (about a second for 400 MiB of page cache in the emulated test guest; seconds for the tens
//! of GiB a large model leaves cached), and a write from the supervisor's loop would hold
//! forwarding, `ctl` and signals as long. Such a write is made by a short-lived child
//! (`sealnode-limit`) instead, waited for [`WAIT`]: past that, the value read back from the
//! file proves the limit in force (the kernel sets it before it reclaims), the caller goes on
//! and the loop reaps the child once the kernel is done ([`super::cgroup::Tree::writer_exited`]).
//! A writer is stopped (SIGKILL ends the kernel's reclaim loop at its next round; not waited
//! for) when its leaf's limits are written again: it reclaims towards the value it wrote, no
//! longer the one wanted.

use std::io;
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

/// A child still in the kernel's write, the limit in force.
#[derive(Debug)]
pub struct Writer {
    pub pid: Pid,
    pub file: String,
    pub value: String,
    pub since: Instant,
    /// SIGKILLed: its value is no longer wanted; the loop reaps it all the same.
    pub stopped: bool,
}

impl Writer {
    /// SIGKILL: a fatal signal ends the kernel's reclaim loop at its next round. Not waited
    /// for (one round may be long): the loop reaps it as any writer.
    pub fn stop(&mut self) {
        if !self.stopped {
            let _ = kill(self.pid, Signal::SIGKILL);
            self.stopped = true;
        }
    }
}

/// The write is over (`None`), or still reclaiming with the limit in force.
pub type Outcome = Option<Writer>;

/// Write `value` into the cgroup file `path`: at once for a file the kernel does not reclaim
/// for, through a child otherwise (the module doc). An error is the write's own (opening the
/// file, the kernel refusing the value) or the kernel not taking it within [`GIVE_UP`].
pub fn write(path: &Path, value: &str) -> io::Result<Outcome> {
    write_proven(path, value, || in_force(path, value))
}

/// [`write`], with what proves the value in force.
fn write_proven(path: &Path, value: &str, proven: impl Fn() -> bool) -> io::Result<Outcome> {
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or_default();
    if !RECLAIMING.contains(&name) {
        return std::fs::write(path, value).map(|()| None);
    }
    // Opened here: a file that cannot be opened fails as a direct write would.
    let file = std::fs::OpenOptions::new().write(true).open(path)?;
    // SAFETY: the supervisor is single-threaded; the child only names itself, arms its death
    // signal, writes one buffer to an fd it inherited and exits.
    let pid = match unsafe { nix::unistd::fork() }.map_err(io::Error::from)? {
        ForkResult::Child => {
            let _ = nix::sys::prctl::set_name(c"sealnode-limit");
            // Never outlives the supervisor (a reload after a restart would race it).
            let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            let code = match nix::unistd::write(&file, value.as_bytes()) {
                Ok(n) if n == value.len() => 0,
                Ok(_) => libc::EIO,
                Err(e) => e as i32,
            };
            sys::exit_now(code)
        }
        ForkResult::Parent { child } => child,
    };
    drop(file);
    let start = Instant::now();
    let mut nap = Duration::from_micros(200);
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, 0)) => return Ok(None),
            Ok(WaitStatus::Exited(_, errno)) => return Err(io::Error::from_raw_os_error(errno)),
            Ok(WaitStatus::Signaled(_, s, _)) => return Err(io::Error::other(format!("the writer died of {s}"))),
            Ok(_) => {}
            Err(e) => return Err(e.into()),
        }
        let waited = start.elapsed();
        if waited >= WAIT && proven() {
            return Ok(Some(Writer {
                pid,
                file: name.to_string(),
                value: value.to_string(),
                since: start,
                stopped: false,
            }));
        }
        if waited >= GIVE_UP {
            // Stopped, and reaped here if it is gone soon (else by the loop, as a child of
            // no one's).
            let _ = kill(pid, Signal::SIGKILL);
            for _ in 0..20 {
                if !matches!(waitpid(pid, Some(WaitPidFlag::WNOHANG)), Ok(WaitStatus::StillAlive)) {
                    break;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
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
fn in_force(path: &Path, value: &str) -> bool {
    let Ok(now) = std::fs::read_to_string(path) else { return false };
    let (now, value) = (now.trim(), value.trim());
    let page = |s: &str| s.parse::<u64>().ok().map(|b| b / 4096);
    now == value || page(now).is_some_and(|p| Some(p) == page(value))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::OpenOptionsExt;

    /// A file the kernel does not reclaim for is written at once, no child.
    #[test]
    fn other_files_are_written_directly() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("pids.max");
        std::fs::write(&p, "").expect("create");
        assert!(write(&p, "64").expect("write").is_none());
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "64");
    }

    /// A reclaiming file's write through the child: done within the wait, nothing left.
    #[test]
    fn a_quick_write_is_waited_for() {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("memory.max");
        std::fs::write(&p, "").expect("create");
        assert!(write(&p, "268435456").expect("write").is_none());
        assert_eq!(std::fs::read_to_string(&p).expect("read"), "268435456");
    }

    /// A write the kernel refuses fails with its errno; a file that is not there, at once.
    #[test]
    fn a_refused_write_fails_with_its_errno() {
        let dir = tempfile::tempdir().expect("tempdir");
        let e = write(&dir.path().join("memory.max"), "1").expect_err("no file");
        assert_eq!(e.kind(), io::ErrorKind::NotFound);
        // /dev/full refuses every write with ENOSPC, as a kernel refusing the value would.
        std::os::unix::fs::symlink("/dev/full", dir.path().join("memory.high")).expect("symlink");
        let e = write(&dir.path().join("memory.high"), "1").expect_err("ENOSPC");
        assert_eq!(e.raw_os_error(), Some(libc::ENOSPC));
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
    /// longer: its child is left to the kernel, and stopping it ends it at once.
    #[test]
    fn a_blocked_write_in_force_is_left_to_its_child() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (fifo, _reader, _filler) = blocking_file(dir.path());
        let t = Instant::now();
        let w = write_proven(&fifo, "max", || true).expect("write").expect("left to its child");
        let held = t.elapsed();
        assert!(held >= WAIT && held < WAIT + Duration::from_millis(500), "held the caller {held:?}");
        assert_eq!((w.file.as_str(), w.value.as_str()), ("memory.max", "max"));
        assert_eq!(kill(w.pid, None), Ok(()), "still writing");
        let (mut w, t) = (w, Instant::now());
        w.stop();
        assert!(w.stopped && t.elapsed() < Duration::from_millis(100), "stopping waits for nothing");
        assert!(matches!(waitpid(w.pid, None), Ok(WaitStatus::Signaled(_, Signal::SIGKILL, _))), "it ends at once");
    }

    /// A write whose value never reads back fails once the kernel has had long enough, and
    /// its child is stopped: a limit not proven in force is not taken as written.
    #[test]
    fn a_blocked_write_never_in_force_fails() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (fifo, _reader, _filler) = blocking_file(dir.path());
        let children = || std::fs::read_to_string("/proc/thread-self/children").expect("children");
        let before = children();
        let t = Instant::now();
        let e = write_proven(&fifo, "max", || false).expect_err("never in force");
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert!(t.elapsed() >= GIVE_UP && t.elapsed() < GIVE_UP + Duration::from_secs(1), "{:?}", t.elapsed());
        assert_eq!(children(), before, "the writer was stopped and reaped");
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
