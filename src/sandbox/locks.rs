//! The dirs one `sealnode run` holds for itself, for its whole life (first start, restarts,
//! reloads, recycles): its state dir, its runtime dir and each role's scratch dir. A second
//! `run` naming any of them, under any path, is refused before it creates, wipes or starts
//! anything: it would take over the control socket, share the generations, or wipe the first
//! cell's live scratch.
//!
//! Every lock is an flock(2) the supervisor takes through a descriptor of its own; the kernel
//! drops it with the last descriptor of that open file, so a supervisor that dies, however it
//! dies, leaves nothing locked. No role ever holds such a descriptor: they are close-on-exec,
//! and every child closes what it inherited first thing (`os::sys::close_all_except`), so no role
//! can release (LOCK_UN) a lock it does not hold.
//!
//! - **State and runtime dirs**: the dir itself, then a `lock` file in it (what `check` looks
//!   at; the dir first, so another cell's scratch never gets a file of ours).
//! - **A scratch dir**: the dir itself, never a file in it. The role owns its scratch and may
//!   write, remove or lock anything in it: a lock file there could be removed by the role (the
//!   next cell would lock a new file beside a live one) or held by it (its own next start
//!   refused). The dir's own inode is what the role can neither remove nor replace (it is the
//!   root of the role's bind mount), and the supervisor holds it exclusively before any wipe
//!   and any role: a role that flocks its `/scratch` (a policy may allow flock) is refused with
//!   EWOULDBLOCK for as long as its supervisor lives; once that supervisor is gone, so are its
//!   roles (the cell dies with it).
//!
//! Locking inodes, not paths, also refuses one dir reached by two paths (a bind mount), within
//! one config or across two, and a scratch dir that is another cell's state or runtime dir.

use std::fs::File;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{openat, Flock, FlockArg, OFlag};
use nix::sys::stat::{fstat, FileStat, Mode};
use nix::unistd::Uid;

use crate::config::{Config, Invoker, Role};
use crate::error::{Error, Result};

/// What [`take`] opened and locked, for the supervisor's lifetime.
pub struct Held {
    /// The state dir, opened and checked once: receipts and the counter are written through it.
    pub state_dir: OwnedFd,
    /// The runtime dir: the control socket is bound through it.
    pub runtime_dir: OwnedFd,
    /// Each role's scratch dir (engine, node), opened once without following symlinks and
    /// checked ([`open_scratch`]): every wipe works on this descriptor, never on the path again.
    pub scratch: [OwnedFd; 2],
    /// The locks themselves, released only when the supervisor drops them.
    pub locks: Locks,
}

/// Held for the supervisor's lifetime, never read.
#[derive(Debug)]
pub struct Locks(#[allow(dead_code)] Vec<Flock<File>>);

/// Open and lock every dir of the cell's own, state and runtime dirs first (their refusals are
/// the ones an operator running one config twice meets), then each role's scratch.
pub fn take(cfg: &Config, inv: &Invoker) -> Result<Held> {
    let mut taken = Taken::default();
    let state_dir = taken.own_dir(cfg, inv, "cell.state_dir", &cfg.cell.state_dir, 0o750)?;
    let runtime_dir = taken.own_dir(cfg, inv, "cell.runtime_dir", &cfg.cell.runtime_dir, 0o755)?;
    let engine = taken.scratch(cfg, inv, Role::Engine)?;
    let node = taken.scratch(cfg, inv, Role::Node)?;
    Ok(Held { state_dir, runtime_dir, scratch: [engine, node], locks: Locks(taken.locks) })
}

/// The locks taken so far, and the dirs they are on (to name a dir that two fields share).
#[derive(Default)]
struct Taken {
    locks: Vec<Flock<File>>,
    dirs: Vec<(String, std::path::PathBuf, (u64, u64))>,
}

impl Taken {
    /// Open sealnode's own dir `path` (trusted::own_dir) and lock the dir itself, then its
    /// `lock` file; refuse if another `sealnode run` holds either. The dir first: another
    /// cell's scratch gets no lock file of ours.
    fn own_dir(&mut self, cfg: &Config, inv: &Invoker, field: &str, path: &Path, mode: u32) -> Result<OwnedFd> {
        let dir = crate::os::trusted::own_dir(path, inv.uid, mode).map_err(|e| Error::config(&cfg.file, field, e))?;
        let st = self.distinct(cfg, field, path, &dir)?;
        let shown = path.join("lock");
        let held = || {
            Error::config(
                &cfg.file,
                field,
                format!(
                    "another `sealnode run` holds {} (one cell per state and runtime dir: stop it, or give this config its own state_dir and runtime_dir)",
                    shown.display()
                ),
            )
        };
        // Not the dir itself: the shipped state and runtime dirs are readable by others
        // (0755), and any local user could hold a dir's flock and keep every start refused
        // (tests/check_run.rs: a_local_user_cannot_lock_a_cell_out). The `lock` file (0600, sealnode's) is ours alone. Another cell's scratch
        // dir is seen through its flock (taken shared for a moment): a scratch dir is never
        // readable by others (open_scratch), so only a dir no one else can open is asked.
        if !readable_by_others(&st) && dir_held(&dir, inv.uid).0 && !lock_file_held(&shown) {
            return Err(in_use(cfg, field, path, holder(&st)));
        }
        let fd = openat(
            &dir,
            "lock",
            OFlag::O_RDWR | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .map_err(|e| Error::errno(format!("open {}", shown.display()), e))?;
        match lock_exclusive(File::from(fd)) {
            Ok(l) => self.locks.push(l),
            Err(Errno::EWOULDBLOCK) => return Err(held()),
            Err(e) => return Err(Error::errno(format!("lock {}", shown.display()), e)),
        }
        Ok(dir)
    }

    /// Open `role`'s scratch dir ([`open_scratch`]) and lock the dir itself; refuse if a
    /// running sealnode holds it (as a scratch, state or runtime dir), or if it is one of this
    /// config's other dirs under another path.
    fn scratch(&mut self, cfg: &Config, inv: &Invoker, role: Role) -> Result<OwnedFd> {
        let field = format!("{role}.scratch");
        let path = &cfg.role(role).scratch;
        let dir = open_scratch(cfg, role)?;
        let st = self.distinct(cfg, &field, path, &dir)?;
        // A running cell's state or runtime dir: its `lock` file, sealnode's own (owned by the
        // launcher's uid: a role cannot make one in its rootful scratch), is held.
        let lock = path.join("lock");
        if std::fs::symlink_metadata(&lock).is_ok_and(|m| {
            use std::os::unix::fs::MetadataExt;
            m.uid() == inv.uid && m.is_file()
        }) && lock_file_held(&lock)
        {
            return Err(in_use(cfg, &field, path, None));
        }
        let uid = cfg.role_ids(role)?.uid;
        let readable =
            open_readable(&dir, uid, true).map_err(|e| Error::errno(format!("open {}", path.display()), e))?;
        match self.lock_dir(readable) {
            Ok(()) => Ok(dir),
            Err(Errno::EWOULDBLOCK) => Err(in_use(cfg, &field, path, holder(&st))),
            Err(e) => Err(Error::errno(format!("lock {}", path.display()), e)),
        }
    }

    /// `dir` (of `field`, at `path`) is none of the dirs locked before; its stat.
    fn distinct(&mut self, cfg: &Config, field: &str, path: &Path, dir: &OwnedFd) -> Result<FileStat> {
        let st = fstat(dir).map_err(|e| Error::errno(format!("stat {}", path.display()), e))?;
        let id = (st.st_dev, st.st_ino);
        if let Some((other, at, _)) = self.dirs.iter().find(|(_, _, d)| *d == id) {
            return Err(Error::config(
                &cfg.file,
                field,
                format!(
                    "{} is the same directory as {other} ({}): each role's scratch dir, the state dir and the runtime dir must be four different dirs",
                    path.display(),
                    at.display()
                ),
            ));
        }
        self.dirs.push((field.to_string(), path.to_path_buf(), id));
        Ok(st)
    }

    /// Lock the dir `readable` itself, for good.
    fn lock_dir(&mut self, readable: OwnedFd) -> std::result::Result<(), Errno> {
        self.locks.push(lock_exclusive(File::from(readable))?);
        Ok(())
    }
}

/// Readable by group or others: anyone could open it and hold its flock.
fn readable_by_others(st: &FileStat) -> bool {
    st.st_mode & 0o044 != 0
}

/// The refusal of a dir a running sealnode (`pid`, if known) holds, or another process that
/// could open it (found by review: a scratch dir's owner, the role's host user, held its flock
/// from the host and every start was refused as "in use by another running sealnode").
fn in_use(cfg: &Config, field: &str, path: &Path, pid: Option<i32>) -> Error {
    let by = match pid.map(|p| (p, process(p))) {
        Some((p, Some((name, _)))) if name == "sealnode" => format!("another running sealnode (pid {p})"),
        Some((p, Some((name, uid)))) => format!(
            "pid {p} ({}, uid {uid}), which is not a sealnode: whoever can open the dir can hold its flock (a scratch dir's owner is the role's host user); stop that process",
            crate::os::escape::clean(name.as_bytes())
        ),
        Some((p, None)) => format!("another running sealnode (pid {p})"),
        None => "another running sealnode".to_string(),
    };
    Error::config(
        &cfg.file,
        field,
        format!(
            "{} is in use by {by}, as its scratch, state or runtime dir; a dir belongs to one cell (every start wipes a scratch dir): stop that cell, or give this config its own {field}",
            path.display()
        ),
    )
}

/// A process's name and real uid, from /proc (none where it cannot be read).
fn process(pid: i32) -> Option<(String, u32)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let name = crate::os::sys::status_field(&status, "Name")?.to_string();
    let uid = crate::os::sys::status_field(&status, "Uid")?.split_whitespace().next()?.parse().ok()?;
    Some((name, uid))
}

/// Take `file`'s flock exclusively, without waiting. A `sealnode check` holds it shared for a
/// moment to see whether a cell runs: a few retries tell that apart from a running cell, which
/// holds it for good.
fn lock_exclusive(mut file: File) -> std::result::Result<Flock<File>, Errno> {
    for _ in 0..10 {
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Err((f, Errno::EWOULDBLOCK)) => {
                file = f;
                std::thread::sleep(Duration::from_millis(20));
            }
            other => return other.map_err(|(_, e)| e),
        }
    }
    Flock::lock(file, FlockArg::LockExclusiveNonblock).map_err(|(_, e)| e)
}

/// The scratch dir `dir` (an O_PATH descriptor) opened for reading with the file-system uid
/// `uid`, its owner: rootful, the dir is the role's, mode 0700, and the unit gives sealnode no
/// CAP_DAC_OVERRIDE. With `repair`, a dir the role left without owner read or search permission
/// gets them back first, as its owner (as the wipe does for every dir in it): a role cannot
/// keep its next cell from locking and wiping its scratch by a chmod.
fn open_readable(dir: &OwnedFd, uid: u32, repair: bool) -> std::result::Result<OwnedFd, Errno> {
    let _as_owner = FsUid::switch(uid)?;
    let open = || openat(dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty());
    match open() {
        Err(Errno::EACCES) if repair => {
            let st = fstat(dir)?;
            // chmod(2) through the descriptor's own /proc link: that very inode, no path lookup.
            let at = format!("/proc/self/fd/{}", dir.as_raw_fd());
            nix::sys::stat::fchmodat(
                nix::fcntl::AT_FDCWD,
                at.as_str(),
                Mode::from_bits_truncate((st.st_mode & 0o7777) | 0o700),
                nix::sys::stat::FchmodatFlags::FollowSymlink,
            )?;
            open()
        }
        r => r,
    }
}

/// The file-system uid switched to another for as long as this lives (this thread only; no
/// other id changes). Rootless, the role's uid is sealnode's own: nothing changes.
struct FsUid {
    old: Uid,
    /// The kernel makes a process non-dumpable when its fsuid changes: its /proc files become
    /// root's, and the cell's namespaces, opened through /proc later, would be refused without
    /// CAP_SYS_PTRACE (the unit has none). Put back as it was.
    dumpable: Option<bool>,
}

impl FsUid {
    fn switch(uid: u32) -> std::result::Result<FsUid, Errno> {
        let euid = nix::unistd::geteuid();
        if euid.as_raw() == uid {
            return Ok(FsUid { old: euid, dumpable: None });
        }
        let dumpable = nix::sys::prctl::get_dumpable()?;
        let old = nix::unistd::setfsuid(Uid::from_raw(uid));
        let fs = FsUid { old, dumpable: Some(dumpable) };
        // setfsuid reports no errors: a second call returns the uid the first one set.
        if nix::unistd::setfsuid(Uid::from_raw(uid)).as_raw() != uid {
            return Err(Errno::EPERM);
        }
        Ok(fs)
    }
}

impl Drop for FsUid {
    fn drop(&mut self) {
        nix::unistd::setfsuid(self.old);
        if let Some(d) = self.dumpable {
            let _ = nix::sys::prctl::set_dumpable(d);
        }
    }
}

/// The pid holding an flock on the inode `st` describes, from /proc/locks. None: not found
/// (a holder in a pid namespace this one cannot see, or a filesystem whose stat reports
/// another device than its superblock's, as btrfs subvolumes do).
fn holder(st: &FileStat) -> Option<i32> {
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    holder_in(&locks, &inode_key(st.st_dev, st.st_ino))
}

/// An inode as /proc/locks names it: "MAJOR:MINOR:INODE", the device numbers in hex.
fn inode_key(dev: u64, ino: u64) -> String {
    format!("{:02x}:{:02x}:{ino}", libc::major(dev), libc::minor(dev))
}

/// The pid of the first granted flock in `locks` (/proc/locks) on `dev_ino` ("08:01:1234").
fn holder_in(locks: &str, dev_ino: &str) -> Option<i32> {
    locks.lines().find_map(|l| {
        // "1: FLOCK  ADVISORY  WRITE 1234 08:01:1234 0 EOF"; a waiter's line has "->" after
        // the number.
        let w: Vec<&str> = l.split_whitespace().collect();
        if w.get(1) != Some(&"FLOCK") || w.get(5) != Some(&dev_ino) {
            return None;
        }
        w.get(4)?.parse().ok().filter(|p: &i32| *p > 0)
    })
}

/// For `sealnode check`: the state and runtime dirs pass the checks `run` makes (nothing is
/// created), and whether a running `sealnode run` holds either (`Some(which)`). Err, as `run`
/// refuses it: another running sealnode holds the dir itself but not its lock file (the dir
/// is that cell's scratch).
pub fn lock_status(cfg: &Config, inv: &Invoker) -> Result<Option<String>> {
    let mut held = Vec::new();
    for (field, dir) in [("cell.state_dir", &cfg.cell.state_dir), ("cell.runtime_dir", &cfg.cell.runtime_dir)] {
        crate::os::trusted::check_own_dir(dir, inv.uid).map_err(|e| Error::config(&cfg.file, field, e))?;
        let lock = dir.join("lock");
        if lock_file_held(&lock) {
            held.push(format!("{} is held by a running sealnode", lock.display()));
            continue;
        }
        let Ok(fd) = crate::os::sys::open_path_no_symlinks(dir) else { continue };
        // As `run` asks (Taken::own_dir): a dir others can read tells nothing by its flock.
        let Ok(st) = fstat(&fd) else { continue };
        if readable_by_others(&st) {
            continue;
        }
        if let (true, pid) = dir_held(&fd, inv.uid) {
            return Err(in_use(cfg, field, dir, pid));
        }
    }
    Ok((!held.is_empty()).then(|| held.join("; ")))
}

/// Whether a running sealnode holds the dir `dir` (an O_PATH descriptor; opened as `uid`, its
/// flock taken shared for a moment), and the holder's pid where /proc/locks names it.
fn dir_held(dir: &OwnedFd, uid: u32) -> (bool, Option<i32>) {
    let pid = fstat(dir).ok().and_then(|st| holder(&st));
    let held = match open_readable(dir, uid, false) {
        Ok(fd) => matches!(Flock::lock(File::from(fd), FlockArg::LockSharedNonblock), Err((_, Errno::EWOULDBLOCK))),
        // Unreadable (a role took its owner's permissions away; `run` gives them back): the
        // kernel's list of locks is all there is to go by.
        Err(_) => pid.is_some(),
    };
    (held, pid)
}

/// Whether a running sealnode holds the lock file `lock` (taken shared for a moment). Opened
/// without following a symlink, never created: a missing lock is an unused dir. O_NONBLOCK: a
/// FIFO planted as the lock must not hang the check.
fn lock_file_held(lock: &Path) -> bool {
    let Ok(f) = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | libc::O_NONBLOCK)
        .open(lock)
    else {
        return false;
    };
    matches!(Flock::lock(f, FlockArg::LockSharedNonblock), Err((_, Errno::EWOULDBLOCK)))
}

/// For `sealnode check`: `role`'s scratch dir passes the checks `run` makes ([`open_scratch`];
/// nothing is changed), and whether a running sealnode holds it. Ok(None): free;
/// Ok(Some(what)): this config's own running cell holds it (a reload is fine); Err: `run`
/// would refuse it, with the very error `run` gives (another cell holds it, among others).
pub fn scratch_status(cfg: &Config, role: Role) -> Result<Option<String>> {
    let field = format!("{role}.scratch");
    let path = &cfg.role(role).scratch;
    let dir = open_scratch(cfg, role)?;
    let (held, pid) = dir_held(&dir, cfg.role_ids(role)?.uid);
    if !held {
        return Ok(None);
    }
    // Held by this config's running cell (a reload or a recycle is fine), or by another one.
    let lock = cfg.cell.state_dir.join("lock");
    let ours = match (pid, std::fs::metadata(&lock).ok()) {
        (Some(p), Some(m)) => {
            use std::os::unix::fs::MetadataExt;
            let locks = std::fs::read_to_string("/proc/locks").unwrap_or_default();
            match holder_in(&locks, &inode_key(m.dev(), m.ino())) {
                Some(q) => q == p,
                None => lock_file_held(&lock),
            }
        }
        _ => lock_file_held(&lock),
    };
    if !ours {
        return Err(in_use(cfg, &field, path, pid));
    }
    let by = pid.map(|p| format!(" (pid {p})")).unwrap_or_default();
    Ok(Some(format!("{} is held by this config's running sealnode{by}", path.display())))
}

/// A role's scratch dir, reached without following symlinks (an O_PATH descriptor) and
/// checked to be a directory owned by the role's user (rootless: the launcher) that no one
/// else may write.
pub fn open_scratch(cfg: &Config, role: Role) -> Result<OwnedFd> {
    let dir = &cfg.role(role).scratch;
    let field = format!("{role}.scratch");
    // O_PATH: no read permission needed here (the unit has no CAP_DAC_OVERRIDE and the dir is
    // the role's, mode 0700); the wipe opens it for reading as the role itself.
    let fd =
        crate::os::sys::open_path_no_symlinks(dir).map_err(|e| Error::errno(format!("open {}", dir.display()), e))?;
    let st = fstat(&fd).map_err(|e| Error::errno(format!("stat {}", dir.display()), e))?;
    let ids = cfg.role_ids(role)?;
    // Not readable by group or others either: a reader could open it and hold its flock, the
    // lock that keeps one cell per scratch dir, and keep every start refused. Search (x) is
    // harmless: an O_PATH descriptor takes no flock (tests/check_run.rs:
    // a_local_user_cannot_lock_a_cell_out).
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR || st.st_uid != ids.uid || st.st_mode & 0o066 != 0 {
        return Err(Error::config(
            &cfg.file,
            field,
            format!(
                "{} must belong to uid {} and not be readable or writable by group or others, as a role's own dir (chmod 0700) (it is uid {}, mode {:o})",
                dir.display(),
                ids.uid,
                st.st_uid,
                st.st_mode & 0o7777
            ),
        ));
    }
    Ok(fd)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_holder_is_the_granted_flock_on_that_inode() {
        let locks = "1: POSIX  ADVISORY  WRITE 77 08:01:42 0 EOF\n\
                     2: FLOCK  ADVISORY  WRITE 1234 08:01:42 0 EOF\n\
                     2: -> FLOCK  ADVISORY  WRITE 999 08:01:42 0 EOF\n\
                     3: FLOCK  ADVISORY  READ 55 103:1a:42 0 EOF\n\
                     4: OFDLCK ADVISORY  READ -1 103:1a:7 0 EOF\n";
        assert_eq!(holder_in(locks, "08:01:42"), Some(1234));
        assert_eq!(holder_in(locks, "103:1a:42"), Some(55));
        assert_eq!(holder_in(locks, "103:1a:7"), None);
        assert_eq!(holder_in(locks, "08:01:4"), None);
        assert_eq!(holder_in("", "08:01:42"), None);
    }

    /// The pid /proc/locks gives for a flock taken here is this process's.
    #[test]
    fn a_lock_taken_here_names_this_process() {
        let d = tempfile::tempdir().expect("tmp");
        let f = File::open(d.path()).expect("open");
        let st = fstat(&f).expect("stat");
        assert_eq!(holder(&st), None);
        let l = lock_exclusive(f).expect("lock");
        assert_eq!(holder(&st), Some(std::process::id() as i32));
        // A second open file of the same dir is refused, as a second cell's would be.
        assert_eq!(lock_exclusive(File::open(d.path()).expect("open")).err(), Some(Errno::EWOULDBLOCK));
        drop(l);
        assert!(lock_exclusive(File::open(d.path()).expect("open")).is_ok());
    }
}
