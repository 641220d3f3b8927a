//! Reading the files sealnode trusts (the config and every policy file) so that what is
//! checked is what is read: each path component is opened without following symlinks, and the
//! owner and mode of every directory on the way and of the file itself are checked on the
//! descriptor (fstat), then the bytes are read from that same descriptor, once.
//!
//! Trusted owners: root, and in rootless mode also the launcher's own uid. A directory may not
//! be writable by group or others unless it is sticky (like /tmp: nobody can then rename or
//! remove an entry another user owns, and the next component is itself checked); the file may
//! not be writable by group or others at all.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path};

use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, FileStat, Mode, SFlag};

/// A file read through the checked path: its bytes and their sha256.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TrustedFile {
    pub bytes: Vec<u8>,
    pub sha256: String,
}

/// Who may own what sealnode reads: root, plus the launcher itself when it is not root.
fn trusted_owner(uid: u32, launcher_uid: u32) -> bool {
    uid == 0 || uid == launcher_uid
}

fn describe(st: &FileStat) -> String {
    format!("owner uid {}, mode {:o}", st.st_uid, st.st_mode & 0o7777)
}

/// Why a directory on the way to a trusted file is not trusted, if it is not.
fn dir_problem(st: &FileStat, launcher_uid: u32) -> Option<String> {
    if !trusted_owner(st.st_uid, launcher_uid) {
        return Some(format!(
            "is owned by another user ({}); it must belong to root{}",
            describe(st),
            owner_hint(launcher_uid)
        ));
    }
    let sticky = st.st_mode & libc::S_ISVTX != 0;
    if st.st_mode & 0o022 != 0 && !sticky {
        return Some(format!("is writable by group or others ({}): fix with chmod go-w", describe(st)));
    }
    None
}

fn owner_hint(launcher_uid: u32) -> String {
    if launcher_uid == 0 {
        String::new()
    } else {
        format!(" or to the launcher (uid {launcher_uid})")
    }
}

/// Open `path` read-only through the checked walk and read it. The error is the reason only;
/// the caller names the config file and field.
pub fn read(path: &Path, launcher_uid: u32) -> std::result::Result<TrustedFile, String> {
    let fd = open(path, launcher_uid)?;
    let mut f = std::fs::File::from(fd);
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut f, &mut bytes).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    use sha2::Digest;
    Ok(TrustedFile { sha256: hex::encode(sha2::Sha256::digest(&bytes)), bytes })
}

/// The components of an absolute path with no `.` or `..` (a lexical check on such a path
/// says what the walk will reach).
fn components(path: &Path) -> std::result::Result<Vec<&std::ffi::OsStr>, String> {
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Ok(n)),
            Component::RootDir => None,
            _ => Some(Err(())),
        })
        .collect::<std::result::Result<_, ()>>()
        .map_err(|()| format!("{}: '.' and '..' are not allowed in a trusted path", path.display()))
}

/// The checked walk: returns the file's descriptor once every component passed.
pub fn open(path: &Path, launcher_uid: u32) -> std::result::Result<OwnedFd, String> {
    let names = components(path)?;
    let Some((file, dirs)) = names.split_last() else {
        return Err(format!("{} names no file", path.display()));
    };
    let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut here = std::path::PathBuf::from("/");
    let mut dir = nix::fcntl::open("/", dir_flags, Mode::empty()).map_err(|e| format!("open /: {e}"))?;
    check_dir(&dir, &here, launcher_uid)?;
    for name in dirs {
        here.push(name);
        dir = openat(&dir, *name, dir_flags, Mode::empty()).map_err(|e| component_error(&here, e))?;
        check_dir(&dir, &here, launcher_uid)?;
    }
    here.push(file);
    // O_NONBLOCK: a FIFO planted at the path must not hang the launcher (it is refused below).
    let fd = openat(
        &dir,
        *file,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| component_error(&here, e))?;
    let st = fstat(&fd).map_err(|e| format!("fstat {}: {e}", here.display()))?;
    if SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) != SFlag::S_IFREG {
        return Err(format!("{} is not a regular file", here.display()));
    }
    if !trusted_owner(st.st_uid, launcher_uid) {
        return Err(format!(
            "{} is owned by another user ({}); it must belong to root{}",
            here.display(),
            describe(&st),
            owner_hint(launcher_uid)
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others ({}): fix with chmod go-w {}",
            here.display(),
            describe(&st),
            here.display()
        ));
    }
    Ok(fd)
}

/// Every directory from `/` down to `path`'s parent is one sealnode trusts (trusted owner, not
/// writable by group or others unless sticky), reached without following a symlink: no other
/// user can replace `path` or anything on the way to it.
pub fn check_dirs_to(path: &Path, launcher_uid: u32) -> std::result::Result<(), String> {
    let names = components(path)?;
    let dirs = names.split_last().map(|(_, d)| d).unwrap_or_default();
    let walk = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut here = std::path::PathBuf::from("/");
    let mut dir = nix::fcntl::open("/", walk, Mode::empty()).map_err(|e| format!("open /: {e}"))?;
    check_dir(&dir, &here, launcher_uid)?;
    for name in dirs {
        here.push(name);
        dir = openat(&dir, *name, walk, Mode::empty()).map_err(|e| component_error(&here, e))?;
        check_dir(&dir, &here, launcher_uid)?;
    }
    Ok(())
}

/// Why a file or directory in a tree sealnode hashes or runs from is not one it can trust:
/// another owner than root or the launcher, or writable by group or others (a sticky
/// directory included: anyone could add to it).
pub fn entry_problem(st: &FileStat, launcher_uid: u32) -> Option<String> {
    if !trusted_owner(st.st_uid, launcher_uid) {
        return Some(format!(
            "is owned by another user ({}); it must belong to root{}",
            describe(st),
            owner_hint(launcher_uid)
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Some(format!("is writable by group or others ({}): fix with chmod go-w", describe(st)));
    }
    None
}

/// sealnode's own directory (state_dir, runtime_dir), race-free: the parents are walked as
/// for [`open`] (trusted owners, no symlinks), a missing component is created with `mkdirat`
/// (the last one with `mode`, others 0755), and the directory itself must belong to the
/// launcher or root and be writable by nobody else. Every file sealnode keeps in it is then
/// created and replaced with `*at` calls on the returned descriptor.
pub fn own_dir(path: &Path, launcher_uid: u32, mode: u32) -> std::result::Result<OwnedFd, String> {
    walk_own_dir(path, launcher_uid, Some(mode))?.ok_or_else(|| format!("{} could not be created", path.display()))
}

/// The same checks as [`own_dir`] without creating anything (the config's load-time check):
/// a dir that does not exist yet passes, since sealnode creates it with a safe mode.
pub fn check_own_dir(path: &Path, launcher_uid: u32) -> std::result::Result<(), String> {
    walk_own_dir(path, launcher_uid, None).map(drop)
}

/// An existing directory of sealnode's own, checked as [`own_dir`] does, without creating
/// anything (an error if it is missing).
pub fn open_dir(path: &Path, launcher_uid: u32) -> std::result::Result<OwnedFd, String> {
    walk_own_dir(path, launcher_uid, None)?.ok_or_else(|| format!("{} does not exist", path.display()))
}

/// The walk behind [`own_dir`] and [`check_own_dir`]: with `create`, missing components are
/// made (the last with that mode); without, a missing component ends the walk with `None`.
fn walk_own_dir(path: &Path, launcher_uid: u32, create: Option<u32>) -> std::result::Result<Option<OwnedFd>, String> {
    let names = components(path)?;
    let walk = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut here = std::path::PathBuf::from("/");
    let mut dir = nix::fcntl::open("/", walk, Mode::empty()).map_err(|e| format!("open /: {e}"))?;
    let last = names.len().saturating_sub(1);
    for (i, name) in names.iter().enumerate() {
        check_dir(&dir, &here, launcher_uid)?;
        here.push(name);
        if let Some(mode) = create {
            let want = if i == last { mode } else { 0o755 };
            match nix::sys::stat::mkdirat(&dir, *name, Mode::from_bits_truncate(want)) {
                Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
                Err(e) => {
                    return Err(format!("create {}: {}", here.display(), std::io::Error::from_raw_os_error(e as i32)))
                }
            }
        }
        dir = match openat(&dir, *name, walk, Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) if create.is_none() => return Ok(None),
            Err(e) => return Err(component_error(&here, e)),
        };
    }
    let st = fstat(&dir).map_err(|e| format!("fstat {}: {e}", here.display()))?;
    if !trusted_owner(st.st_uid, launcher_uid) {
        return Err(format!(
            "{} is owned by uid {}; it must belong to sealnode's user (uid {launcher_uid}) or root",
            here.display(),
            st.st_uid
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others ({}): chmod go-w {}",
            here.display(),
            describe(&st),
            here.display()
        ));
    }
    match create {
        // A descriptor the caller can fsync and create files through: the checked dir itself.
        Some(_) => openat(&dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map(Some)
            .map_err(|e| format!("open {}: {}", here.display(), std::io::Error::from_raw_os_error(e as i32))),
        None => Ok(Some(dir)),
    }
}

fn check_dir(fd: &impl AsFd, here: &Path, launcher_uid: u32) -> std::result::Result<(), String> {
    let st = fstat(fd).map_err(|e| format!("fstat {}: {e}", here.display()))?;
    match dir_problem(&st, launcher_uid) {
        Some(why) => Err(format!("directory {} {why}", here.display())),
        None => Ok(()),
    }
}

fn component_error(here: &Path, e: nix::errno::Errno) -> String {
    match e {
        nix::errno::Errno::ELOOP | nix::errno::Errno::ENOTDIR
            if std::fs::symlink_metadata(here).is_ok_and(|m| m.file_type().is_symlink()) =>
        {
            format!(
                "{} is a symlink; sealnode does not follow symlinks to the files it trusts: give the real path",
                here.display()
            )
        }
        e => format!("{}: {}", here.display(), std::io::Error::from_raw_os_error(e as i32)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn tree() -> tempfile::TempDir {
        let d = tempfile::Builder::new().prefix("trusted-").tempdir_in("/var/tmp").expect("tmp");
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::create_dir(d.path().join("p")).expect("p");
        std::fs::write(d.path().join("p/f.json"), "{}").expect("f");
        std::fs::set_permissions(d.path().join("p/f.json"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
        d
    }

    fn me() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    #[test]
    fn a_checked_file_is_read_with_its_digest() {
        let d = tree();
        let f = read(&d.path().join("p/f.json"), me()).expect("read");
        assert_eq!(f.bytes, b"{}");
        assert_eq!(f.sha256, {
            use sha2::Digest;
            hex::encode(sha2::Sha256::digest(b"{}"))
        });
    }

    #[test]
    fn writable_dirs_files_and_symlinks_are_refused() {
        let d = tree();
        let p = d.path().join("p");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = read(&p.join("f.json"), me()).expect_err("group/other-writable dir");
        assert!(e.contains(&format!("directory {}", p.display())) && e.contains("chmod go-w"), "{e}");
        // Sticky and world-writable, like /tmp: allowed (the next component is checked).
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        read(&p.join("f.json"), me()).expect("sticky dir");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::set_permissions(p.join("f.json"), std::fs::Permissions::from_mode(0o664)).expect("chmod");
        let e = read(&p.join("f.json"), me()).expect_err("group-writable file");
        assert!(e.contains("writable by group or others"), "{e}");
        std::fs::set_permissions(p.join("f.json"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
        std::os::unix::fs::symlink(p.join("f.json"), d.path().join("link.json")).expect("symlink");
        let e = read(&d.path().join("link.json"), me()).expect_err("symlinked file");
        assert!(e.contains("is a symlink"), "{e}");
        std::os::unix::fs::symlink(&p, d.path().join("linkdir")).expect("symlink");
        let e = read(&d.path().join("linkdir/f.json"), me()).expect_err("symlinked dir");
        assert!(e.contains("linkdir is a symlink"), "{e}");
        let e = read(&d.path().join("p/../p/f.json"), me()).expect_err("dotdot");
        assert!(e.contains("'..'"), "{e}");
        nix::unistd::mkfifo(&d.path().join("fifo"), Mode::from_bits_truncate(0o644)).expect("fifo");
        let e = read(&d.path().join("fifo"), me()).expect_err("fifo");
        assert!(e.contains("not a regular file"), "{e}");
    }

    #[test]
    fn own_dirs_are_created_with_their_mode_and_checked() {
        use std::os::unix::fs::MetadataExt;
        let d = tree();
        let state = d.path().join("new/state");
        let fd = own_dir(&state, me(), 0o750).expect("created");
        assert_eq!(std::fs::metadata(&state).expect("md").mode() & 0o7777, 0o750);
        assert_eq!(std::fs::metadata(d.path().join("new")).expect("md").mode() & 0o7777, 0o755);
        // Files inside are made through the descriptor.
        nix::sys::stat::mkdirat(&fd, "x", Mode::from_bits_truncate(0o700)).expect("mkdirat");
        assert!(state.join("x").is_dir());
        own_dir(&state, me(), 0o700).expect("exists: kept, mode unchanged");
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o1777)).expect("chmod");
        let e = own_dir(&state, me(), 0o750).expect_err("world-writable, even sticky");
        assert!(e.contains("writable by group or others"), "{e}");
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o750)).expect("chmod");
        std::os::unix::fs::symlink(&state, d.path().join("link")).expect("symlink");
        let e = own_dir(&d.path().join("link"), me(), 0o750).expect_err("symlink");
        assert!(e.contains("is a symlink"), "{e}");
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&state, Some(4242), None).expect("chown");
            let e = own_dir(&state, 0, 0o750).expect_err("foreign owner");
            assert!(e.contains("owned by uid 4242"), "{e}");
        }
    }

    #[test]
    fn files_of_other_users_are_refused() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let d = tree();
        std::os::unix::fs::chown(d.path().join("p/f.json"), Some(65534), None).expect("chown");
        let e = read(&d.path().join("p/f.json"), 0).expect_err("owned by 65534");
        assert!(e.contains("owned by another user") && e.contains("uid 65534"), "{e}");
        // A rootless launcher (uid 65534) trusts its own files...
        read(&d.path().join("p/f.json"), 65534).expect("the launcher's own file");
        // ...but not a directory of a third user on the way.
        std::os::unix::fs::chown(d.path().join("p"), Some(4242), None).expect("chown");
        let e = read(&d.path().join("p/f.json"), 65534).expect_err("dir of uid 4242");
        assert!(e.contains(&format!("directory {}", d.path().join("p").display())) && e.contains("4242"), "{e}");
    }
}
