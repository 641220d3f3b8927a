//! Emptying a role's scratch dir: iterative (one directory open at a time, whatever the
//! depth: a role's 100000-level tree neither exhausts the fd limit nor the stack), relative to
//! the dir's descriptor (never a path lookup: the dir cannot be swapped for a symlink), never
//! following a symlink and never entering another mount (a mount point inside scratch refuses
//! the wipe: EBUSY). Runs as the role's own ids (`Cell::wipe`), so what the role could not
//! have made is out of its reach.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};

use nix::errno::Errno;
use nix::fcntl::{openat, AtFlags, OFlag};
use nix::sys::stat::{fchmod, fstat, fstatat, Mode};
use nix::unistd::{unlinkat, UnlinkatFlags};

/// Names read from a directory per pass: removed entries vanish, so each pass re-reads.
const BATCH: usize = 4096;

fn open_dir<Fd: AsFd>(at: Fd, name: &CStr) -> Result<OwnedFd, Errno> {
    openat(at, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
}

/// Up to BATCH names in `dir` (not `.`/`..`), from the start.
fn batch(dir: &OwnedFd) -> Result<Vec<CString>, Errno> {
    let fresh = open_dir(dir, c".")?;
    let mut d = nix::dir::Dir::from_fd(fresh)?;
    let mut names = Vec::new();
    for e in d.iter() {
        let e = e?;
        let n = e.file_name();
        if n == c"." || n == c".." {
            continue;
        }
        names.push(n.to_owned());
        if names.len() == BATCH {
            break;
        }
    }
    Ok(names)
}

/// The role may have left a dir without owner write or search permission: give it back.
fn writable(dir: &OwnedFd) -> Result<(), Errno> {
    let st = fstat(dir)?;
    if st.st_mode & 0o700 != 0o700 {
        fchmod(dir, Mode::from_bits_truncate((st.st_mode & 0o7777) | 0o700))?;
    }
    Ok(())
}

/// Remove everything inside the directory `dir` refers to (any descriptor of it, O_PATH
/// included; not the dir itself), and give the dir back a scratch dir's mode, 0700: the role
/// may have changed it (a role whose filter allows chmod), and the next generation starts on
/// what a fresh one has. Found by review: `chmod 0 /scratch` failed the wipe (EACCES) and a
/// recycle or reload stopped the cell whenever the role liked; `chmod 0777` made the next start
/// refuse the dir (writable by others), and every later one, and opened it to the host's users
/// meanwhile. Through the descriptor's magic link, as the role's ids (its owner).
pub fn empty_dir(dir: BorrowedFd) -> Result<(), Errno> {
    let st = fstat(dir)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
        return Err(Errno::ENOTDIR);
    }
    let want = 0o700;
    if st.st_mode & 0o7777 != want {
        let at = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let mode = Mode::from_bits_truncate(want);
        nix::sys::stat::fchmodat(
            nix::fcntl::AT_FDCWD,
            at.as_str(),
            mode,
            nix::sys::stat::FchmodatFlags::FollowSymlink,
        )?;
    }
    empty(open_dir(dir, c".")?)
}

/// Remove everything inside the directory `root` (not `root` itself).
pub fn empty(root: OwnedFd) -> Result<(), Errno> {
    let dev = fstat(&root)?.st_dev;
    // The way down: the name of each dir entered, and its parent's (dev, ino).
    let mut down: Vec<(CString, (u64, u64))> = Vec::new();
    let mut cur = root;
    loop {
        writable(&cur)?;
        let names = batch(&cur)?;
        let mut entered = None;
        for name in &names {
            let st = match fstatat(&cur, name.as_c_str(), AtFlags::AT_SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                Err(Errno::ENOENT) => continue,
                Err(e) => return Err(e),
            };
            if st.st_mode & libc::S_IFMT != libc::S_IFDIR {
                unlinkat(&cur, name.as_c_str(), UnlinkatFlags::NoRemoveDir)?;
                continue;
            }
            if st.st_dev != dev {
                // A mount point: its contents are not the role's to lose, nor ours to remove.
                return Err(Errno::EBUSY);
            }
            match unlinkat(&cur, name.as_c_str(), UnlinkatFlags::RemoveDir) {
                Ok(()) => continue,
                Err(Errno::ENOTEMPTY | Errno::EEXIST) => {}
                Err(e) => return Err(e),
            }
            let next = match open_dir(&cur, name) {
                // A dir the role left without owner search/read permission: its owner (the
                // role, as which this runs) may give that back. (fstatat said it is a dir.)
                Err(Errno::EACCES) => {
                    let mode = Mode::from_bits_truncate((st.st_mode & 0o7777) | 0o700);
                    nix::sys::stat::fchmodat(
                        &cur,
                        name.as_c_str(),
                        mode,
                        nix::sys::stat::FchmodatFlags::FollowSymlink,
                    )?;
                    open_dir(&cur, name)?
                }
                r => r?,
            };
            let nst = fstat(&next)?;
            if (nst.st_dev, nst.st_ino) != (st.st_dev, st.st_ino) {
                return Err(Errno::ESTALE);
            }
            let here = fstat(&cur)?;
            entered = Some((name.clone(), (here.st_dev, here.st_ino), next));
            break;
        }
        if let Some((name, parent, next)) = entered {
            down.push((name, parent));
            cur = next;
            continue;
        }
        if !names.is_empty() {
            // This pass removed what it read; read again until the dir is empty.
            continue;
        }
        // Empty: back up one level and remove it there.
        let Some((name, parent)) = down.pop() else { return Ok(()) };
        let up = open_dir(&cur, c"..")?;
        let ust = fstat(&up)?;
        if (ust.st_dev, ust.st_ino) != parent {
            return Err(Errno::ESTALE);
        }
        cur = up;
        unlinkat(&cur, name.as_c_str(), UnlinkatFlags::RemoveDir)?;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn root(p: &std::path::Path) -> OwnedFd {
        std::fs::File::open(p).expect("open").into()
    }

    /// Deep (3000 levels: more than PATH_MAX can name), wide (more entries than one batch), read-only dirs, a
    /// symlink to a file outside (the link goes, the file stays), FIFOs: all gone, nothing else.
    #[test]
    fn empties_deep_wide_and_read_only_trees_and_never_follows_links() {
        let d = tempfile::tempdir().expect("tmp");
        let scratch = d.path().join("scratch");
        let outside = d.path().join("outside");
        std::fs::create_dir(&scratch).expect("mkdir");
        std::fs::write(&outside, "keep").expect("write");
        // Deeper than PATH_MAX allows naming from the top: made relative to each level.
        let mut at: OwnedFd = root(&scratch);
        for _ in 0..3000 {
            nix::sys::stat::mkdirat(&at, c"d", Mode::from_bits_truncate(0o700)).expect("mkdirat");
            at = open_dir(&at, c"d").expect("openat");
        }
        drop(at);
        for i in 0..(BATCH + 10) {
            std::fs::write(scratch.join(format!("f{i}")), "").expect("wide");
        }
        std::os::unix::fs::symlink(&outside, scratch.join("link")).expect("symlink");
        std::os::unix::fs::symlink(d.path(), scratch.join("dirlink")).expect("symlink");
        nix::unistd::mkfifo(&scratch.join("fifo"), Mode::from_bits_truncate(0o600)).expect("fifo");
        std::fs::create_dir_all(scratch.join("ro/inner")).expect("ro");
        std::fs::write(scratch.join("ro/inner/x"), "").expect("x");
        std::fs::set_permissions(scratch.join("ro/inner"), std::fs::Permissions::from_mode(0o500)).expect("chmod");
        std::fs::set_permissions(scratch.join("ro"), std::fs::Permissions::from_mode(0o000)).expect("chmod");
        empty(root(&scratch)).expect("empty");
        assert_eq!(std::fs::read_dir(&scratch).expect("read").count(), 0);
        assert_eq!(std::fs::read_to_string(&outside).expect("outside"), "keep");
        assert!(d.path().exists());
    }

    /// The dir itself gets a scratch dir's mode back, whatever the role made of it, through any
    /// descriptor of it (O_PATH: what the cell holds of a capped scratch).
    #[test]
    fn the_dir_itself_gets_its_mode_back() {
        let d = tempfile::tempdir().expect("tmp");
        for mode in [0o000, 0o777, 0o1777, 0o500] {
            let scratch = d.path().join(format!("s{mode:o}"));
            std::fs::create_dir(&scratch).expect("mkdir");
            std::fs::write(scratch.join("left"), "x").expect("write");
            std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(mode)).expect("chmod");
            let fd = crate::os::sys::open_path_no_symlinks(&scratch).expect("O_PATH");
            empty_dir(fd.as_fd()).expect("empty");
            let now = std::fs::metadata(&scratch).expect("stat").permissions().mode() & 0o7777;
            assert_eq!(now, 0o700, "{mode:o}");
            assert_eq!(std::fs::read_dir(&scratch).expect("read").count(), 0, "{mode:o}");
        }
    }
}
