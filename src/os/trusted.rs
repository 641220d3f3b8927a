//! Reading the files sealnode trusts (the config and every policy file) so that what is
//! checked is what is read: each path component is opened relative to the directory before
//! it, without following symlinks, and the owner and mode of every directory on the way and of
//! the file itself are checked on the descriptor (fstat), then the bytes are read from that
//! same descriptor, once.
//!
//! Trusted owners: root, and in rootless mode also the launcher's own uid. A directory may not
//! be writable by group or others unless it is sticky (like /tmp: nobody can then rename or
//! remove an entry another user owns, and the next component is itself checked) or it is a
//! volume's root as kubelet mounts it (a ConfigMap volume's root is 0777, the root of a
//! read-only mount, holding kubelet's `..data` link: nobody in the container can write it).
//! A read-only view alone is not enough (found by review: the units' ProtectSystem=strict
//! shows every directory on a read-only mount, and a group-writable /etc/sealnode, which
//! its group writes through the host's own mount, passed under the unit and failed `check`
//! from a shell). The file may not be writable by group or others at all.
//!
//! One kind of symlink is followed, the kind kubelet's atomic writer makes for ConfigMap and
//! Secret volumes (`sealnode.toml -> ..data/sealnode.toml`, `..data -> ..2026_12_03_...`): a
//! link of a trusted owner whose target is relative, of one or two plain names (no `.`, `..`
//! or empty component), so that it resolves inside the directory holding it; at most
//! [`MAX_LINKS`] on one walk. The target's names are opened relative to that directory's
//! descriptor, never by path. Every other link is refused, naming it.

use std::os::fd::{AsFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

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

/// Symlinks one checked walk follows at most: kubelet's shape needs two (`NAME ->
/// ..data/NAME`, `..data -> ..TIMESTAMP`).
pub const MAX_LINKS: usize = 8;

/// Names a followed link's target may have at most (`..data/NAME`): with no `.` or `..`, it
/// stays inside the directory holding the link.
const MAX_LINK_NAMES: usize = 2;

/// Why a directory on the way to a trusted file is not trusted, if it is not.
/// `volume` is asked only of a directory writable by group or others: how it is mounted.
fn dir_problem(st: &FileStat, launcher_uid: u32, volume: impl FnOnce() -> Mounted) -> Option<String> {
    if !trusted_owner(st.st_uid, launcher_uid) {
        return Some(format!(
            "is owned by another user ({}); it must belong to root{}",
            describe(st),
            owner_hint(launcher_uid)
        ));
    }
    let sticky = st.st_mode & libc::S_ISVTX != 0;
    if st.st_mode & 0o022 == 0 || sticky {
        return None;
    }
    match volume() {
        Mounted::KubeletVolume => None,
        Mounted::ReadWrite => Some(format!(
            "is writable by group or others ({}) on a read-write mount: fix with chmod go-w",
            describe(st)
        )),
        Mounted::ReadOnly => Some(format!(
            "is writable by group or others ({}) on a read-only mount, but is not a volume's root as \
             kubelet mounts it (the mount's root, with kubelet's ..data link): a read-only view \
             does not stop writes through another mount; fix with chmod go-w",
            describe(st)
        )),
    }
}

/// How a directory others could write is mounted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mounted {
    /// On a read-write mount: anyone its mode lets in can write it here.
    ReadWrite,
    /// On a read-only mount (ST_RDONLY: the mount's flag or its superblock's), but not as a
    /// kubelet volume's root: others may write it through another mount (a ProtectSystem=
    /// view of the host's /etc, a read-only bind of a shared directory).
    ReadOnly,
    /// The root of a read-only mount, holding kubelet's `..data` link: a ConfigMap's or
    /// projected volume's root, which only kubelet writes, through its own mount.
    KubeletVolume,
}

/// How the directory `fd` is mounted ([`Mounted`]).
fn mounted(fd: &impl AsFd, launcher_uid: u32) -> Mounted {
    let read_only =
        nix::sys::statvfs::fstatvfs(fd).is_ok_and(|s| s.flags().contains(nix::sys::statvfs::FsFlags::ST_RDONLY));
    if !read_only {
        return Mounted::ReadWrite;
    }
    let root = crate::os::sys::mount_at(fd.as_fd()).is_ok_and(|(_, root)| root);
    if root && kubelet_data(fd, launcher_uid) {
        Mounted::KubeletVolume
    } else {
        Mounted::ReadOnly
    }
}

/// Whether the directory `fd` holds kubelet's `..data` as kubelet makes it: a link of a
/// trusted owner to one name beside it (`..2026_12_03_10_00_00.123456789`), a directory of a
/// trusted owner that no one else can write (found by review: any link named `..data`, a
/// dangling one of another user's, made a 0777 read-only bind pass).
fn kubelet_data(fd: &impl AsFd, launcher_uid: u32) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let at = |name: &std::ffi::OsStr| nix::sys::stat::fstatat(fd, name, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW);
    let kind = |st: &FileStat| SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT);
    let Ok(link) = at(std::ffi::OsStr::new("..data")) else { return false };
    if kind(&link) != SFlag::S_IFLNK || !trusted_owner(link.st_uid, launcher_uid) {
        return false;
    }
    let Ok(target) = nix::fcntl::readlinkat(fd, "..data") else { return false };
    let name = target.as_bytes();
    if name.len() <= 2 || !name.starts_with(b"..") || name.contains(&b'/') {
        return false;
    }
    at(&target)
        .is_ok_and(|d| kind(&d) == SFlag::S_IFDIR && trusted_owner(d.st_uid, launcher_uid) && d.st_mode & 0o022 == 0)
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
    std::io::Read::read_to_end(&mut f, &mut bytes).map_err(|e| format!("cannot read {}: {e}", shown(&path)))?;
    use sha2::Digest;
    Ok(TrustedFile { sha256: hex::encode(sha2::Sha256::digest(&bytes)), bytes })
}

/// The components of an absolute path with no `.` or `..` (a lexical check on such a path
/// says what the walk will reach).
fn components(path: &Path) -> std::result::Result<Vec<&std::ffi::OsStr>, String> {
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", shown(&path)));
    }
    path.components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(Ok(n)),
            Component::RootDir => None,
            _ => Some(Err(())),
        })
        .collect::<std::result::Result<_, ()>>()
        .map_err(|()| format!("{}: '.' and '..' are not allowed in a trusted path", shown(&path)))
}

/// Where a checked walk ended: the directory that holds what the path names (checked, as is
/// every one above it), its name there, its O_PATH descriptor, and the path it was reached by
/// (each followed link replaced by its target: no symlink is left in it).
struct Walked {
    dir: OwnedFd,
    name: std::ffi::OsString,
    fd: OwnedFd,
    real: PathBuf,
}

/// The checked walk to `path`: every directory from `/` checked on its descriptor, each name
/// opened relative to the one before without following it, and only the links [`follow`]
/// accepts followed (their targets' names opened relative to the directory holding the link).
fn walk(path: &Path, launcher_uid: u32) -> std::result::Result<Walked, String> {
    let names = components(path)?;
    if names.is_empty() {
        return Err(format!("{} names no file", shown(&path)));
    }
    let mut todo: std::collections::VecDeque<std::ffi::OsString> = names.into_iter().map(Into::into).collect();
    let dir_flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let mut here = PathBuf::from("/");
    let mut dir = nix::fcntl::open("/", dir_flags, Mode::empty()).map_err(|e| format!("open /: {e}"))?;
    check_dir(&dir, &here, launcher_uid)?;
    let mut followed = 0;
    while let Some(name) = todo.pop_front() {
        let at = here.join(&name);
        // O_PATH without O_DIRECTORY: a symlink is opened as itself, to be judged on its fd.
        let fd = openat(&dir, name.as_os_str(), OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC, Mode::empty())
            .map_err(|e| component_error(&at, e))?;
        let st = fstat(&fd).map_err(|e| format!("fstat {}: {e}", shown(&at)))?;
        match st.st_mode & libc::S_IFMT {
            libc::S_IFLNK => {
                followed += 1;
                for n in follow(&fd, &st, &at, followed, launcher_uid)?.into_iter().rev() {
                    todo.push_front(n);
                }
            }
            _ if todo.is_empty() => return Ok(Walked { dir, name, fd, real: at }),
            libc::S_IFDIR => {
                check_dir(&fd, &at, launcher_uid)?;
                (dir, here) = (fd, at);
            }
            _ => return Err(format!("{} is not a directory", shown(&at))),
        }
    }
    // Not reached: the last name returns above, and a link always adds a name after it
    // (link_names refuses an empty target). Said rather than assumed.
    Err(format!("{} names no file", shown(&path)))
}

/// The names a symlink met on a checked walk stands for, if it is one sealnode follows: owned
/// by a trusted owner (the directory holding it was checked already), at most [`MAX_LINKS`]
/// on the walk, its target relative, of at most [`MAX_LINK_NAMES`] plain names. Otherwise
/// the refusal, naming the link and why.
fn follow(
    link: &OwnedFd,
    st: &FileStat,
    at: &Path,
    followed: usize,
    launcher_uid: u32,
) -> std::result::Result<Vec<std::ffi::OsString>, String> {
    let refuse = |why: String| {
        format!(
            "{} is a symlink that sealnode does not follow ({why}); give the real path, or see docs/config.md, \"Files sealnode trusts\"",
            shown(&at)
        )
    };
    if !trusted_owner(st.st_uid, launcher_uid) {
        return Err(refuse(format!(
            "it is owned by another user (uid {}); only links of root{} are followed",
            st.st_uid,
            owner_hint(launcher_uid)
        )));
    }
    if followed > MAX_LINKS {
        return Err(refuse(format!("more than {MAX_LINKS} symlinks on the way")));
    }
    // The link's own descriptor, not its name again: what was judged is what is read.
    let target = nix::fcntl::readlinkat(link, "").map_err(|e| format!("readlink {}: {e}", shown(&at)))?;
    link_names(&target).map_err(refuse)
}

/// The names of a link target sealnode follows: relative, one or two names, none of them
/// empty, `.` or `..` (so it resolves inside the directory holding the link).
fn link_names(target: &std::ffi::OsStr) -> std::result::Result<Vec<std::ffi::OsString>, String> {
    use std::os::unix::ffi::OsStrExt;
    let shown = crate::os::escape::clean(target.as_bytes());
    if target.as_bytes().first() == Some(&b'/') {
        return Err(format!("its target {shown:?} is absolute"));
    }
    let names: Vec<&[u8]> = target.as_bytes().split(|b| *b == b'/').collect();
    if names.iter().any(|n| n.is_empty() || *n == b"." || *n == b"..") {
        return Err(format!("its target {shown:?} is not plain names: an empty name, '.' or '..'"));
    }
    if names.len() > MAX_LINK_NAMES {
        return Err(format!(
            "its target {shown:?} has more than {MAX_LINK_NAMES} names; a followed link stays beside it"
        ));
    }
    Ok(names.into_iter().map(|n| std::ffi::OsStr::from_bytes(n).to_os_string()).collect())
}

/// The checked walk: returns the file's descriptor, open for reading, once every component
/// passed and the file is a regular one of a trusted owner that no one else can write.
pub fn open(path: &Path, launcher_uid: u32) -> std::result::Result<OwnedFd, String> {
    let Walked { dir, name, fd: at, real: here } = walk(path, launcher_uid)?;
    // O_NONBLOCK: a FIFO planted at the path must not hang the launcher (it is refused below).
    let fd = openat(
        &dir,
        name.as_os_str(),
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NOCTTY | OFlag::O_NONBLOCK,
        Mode::empty(),
    )
    .map_err(|e| component_error(&here, e))?;
    let st = fstat(&fd).map_err(|e| format!("fstat {}: {e}", shown(&here)))?;
    // The name still is what the walk judged (the directory holding it was checked; only its
    // trusted owner could have swapped it since).
    let was = fstat(&at).map_err(|e| format!("fstat {}: {e}", shown(&here)))?;
    if (st.st_dev, st.st_ino) != (was.st_dev, was.st_ino) {
        return Err(format!("{} changed while it was opened; try again", shown(&here)));
    }
    if SFlag::from_bits_truncate(st.st_mode & libc::S_IFMT) != SFlag::S_IFREG {
        return Err(format!("{} is not a regular file", shown(&here)));
    }
    if !trusted_owner(st.st_uid, launcher_uid) {
        return Err(format!(
            "{} is owned by another user ({}); it must belong to root{}",
            shown(&here),
            describe(&st),
            owner_hint(launcher_uid)
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others ({}): fix with chmod go-w {}",
            shown(&here),
            describe(&st),
            shown(&here)
        ));
    }
    Ok(fd)
}

/// The checked walk to `path`, following only the links [`open`] follows, for a file whose
/// owner and mode the caller judges itself (the node's credential): its O_PATH descriptor and
/// the path it was reached by, with no symlink left in it (what a bind mount of it, reopened
/// without following symlinks, finds again).
pub fn resolve(path: &Path, launcher_uid: u32) -> std::result::Result<(OwnedFd, PathBuf), String> {
    walk(path, launcher_uid).map(|w| (w.fd, w.real))
}

/// Every directory from `/` down to `path`'s parent is one sealnode trusts (trusted owner, not
/// writable by group or others unless sticky or a volume's root as kubelet mounts it), reached without
/// following a symlink: no other user can replace `path` or anything on the way to it.
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
    walk_own_dir(path, launcher_uid, Some(mode))?.ok_or_else(|| format!("{} could not be created", shown(&path)))
}

/// The same checks as [`own_dir`] without creating anything (the config's load-time check):
/// a dir that does not exist yet passes, since sealnode creates it with a safe mode.
pub fn check_own_dir(path: &Path, launcher_uid: u32) -> std::result::Result<(), String> {
    walk_own_dir(path, launcher_uid, None).map(drop)
}

/// An existing directory of sealnode's own, checked as [`own_dir`] does, without creating
/// anything (an error if it is missing).
pub fn open_dir(path: &Path, launcher_uid: u32) -> std::result::Result<OwnedFd, String> {
    walk_own_dir(path, launcher_uid, None)?.ok_or_else(|| format!("{} does not exist", shown(&path)))
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
                    return Err(format!("create {}: {}", shown(&here), std::io::Error::from_raw_os_error(e as i32)))
                }
            }
        }
        dir = match openat(&dir, *name, walk, Mode::empty()) {
            Ok(fd) => fd,
            Err(nix::errno::Errno::ENOENT) if create.is_none() => return Ok(None),
            Err(e) => return Err(component_error(&here, e)),
        };
    }
    let st = fstat(&dir).map_err(|e| format!("fstat {}: {e}", shown(&here)))?;
    if !trusted_owner(st.st_uid, launcher_uid) {
        return Err(format!(
            "{} is owned by uid {}; it must belong to sealnode's user (uid {launcher_uid}) or root",
            shown(&here),
            st.st_uid
        ));
    }
    if st.st_mode & 0o022 != 0 {
        return Err(format!(
            "{} is writable by group or others ({}): chmod go-w {}",
            shown(&here),
            describe(&st),
            shown(&here)
        ));
    }
    match create {
        // A descriptor the caller can fsync and create files through: the checked dir itself.
        Some(_) => openat(&dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
            .map(Some)
            .map_err(|e| format!("open {}: {}", shown(&here), std::io::Error::from_raw_os_error(e as i32))),
        None => Ok(Some(dir)),
    }
}

fn check_dir(fd: &impl AsFd, here: &Path, launcher_uid: u32) -> std::result::Result<(), String> {
    let st = fstat(fd).map_err(|e| format!("fstat {}: {e}", shown(&here)))?;
    match dir_problem(&st, launcher_uid, || mounted(fd, launcher_uid)) {
        Some(why) => Err(format!("directory {} {why}", shown(&here))),
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
                shown(&here)
            )
        }
        e => format!("{}: {}", shown(&here), std::io::Error::from_raw_os_error(e as i32)),
    }
}

/// The mount table as /proc/self/mountinfo shows it, read once for a set of checks (one
/// read per file checked cost a start ~0.1 ms here, more on a host with many mounts).
pub struct MountTable(String);

impl MountTable {
    pub fn read() -> MountTable {
        MountTable(std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default())
    }

    /// Where else the table shows the file at `real` (a path with no symlink in it): a bind
    /// mount of it, or of a directory above it, elsewhere, and an overlay one of whose layers
    /// holds it. Found by review: a bind mount of the node's credential or the attestation key
    /// into the system view, a writable model dir or an overlay keeps one name and one link,
    /// and a role read it there. Each such place is returned as the path it shows the file at
    /// (a place under a later mount is returned too: the table cannot say what a role's view
    /// will hold).
    pub fn also_mounted_at(&self, real: &Path) -> Vec<PathBuf> {
        also_mounted_in(&self.0, real, nix::sys::stat::stat(real).ok().map(|st| st.st_dev))
    }

    /// The first place of [`MountTable::also_mounted_at`] inside one of `places` (a path and
    /// what it is: the places a role sees), with what holds it. A place no role sees is no
    /// exposure (found by review: systemd's BindReadOnlyPaths= of the credential from a
    /// private dir was refused).
    pub fn shown_within(&self, real: &Path, places: &[(PathBuf, String)]) -> Option<(PathBuf, String)> {
        self.also_mounted_at(real)
            .into_iter()
            .find_map(|at| places.iter().find(|(p, _)| at.starts_with(p)).map(|(_, what)| (at.clone(), what.clone())))
    }
}

/// [`MountTable::also_mounted_at`] over a mount table's text; `dev`: the file's device.
fn also_mounted_in(info: &str, real: &Path, dev: Option<u64>) -> Vec<PathBuf> {
    use std::os::unix::ffi::OsStrExt;
    // The kernel writes space, tab, newline and backslash in a path as \ooo.
    fn unescape(s: &str) -> PathBuf {
        let b = s.as_bytes();
        let mut out = Vec::with_capacity(b.len());
        let mut i = 0;
        while i < b.len() {
            let oct = b.get(i + 1..i + 4).filter(|o| b[i] == b'\\' && o.iter().all(|c| (b'0'..=b'7').contains(c)));
            match oct {
                Some(o) => {
                    out.push((o[0] - b'0') * 64 + (o[1] - b'0') * 8 + (o[2] - b'0'));
                    i += 4;
                }
                None => {
                    out.push(b[i]);
                    i += 1;
                }
            }
        }
        PathBuf::from(std::ffi::OsStr::from_bytes(&out))
    }
    struct Mount {
        majmin: String,
        root: PathBuf,
        point: PathBuf,
        fstype: String,
        opts: String,
    }
    let mounts: Vec<Mount> = info
        .lines()
        .filter_map(|l| {
            let (pre, post) = l.split_once(" - ")?;
            let f: Vec<&str> = pre.split(' ').collect();
            let p: Vec<&str> = post.split(' ').collect();
            Some(Mount {
                majmin: f.get(2)?.to_string(),
                root: unescape(f.get(3)?),
                point: unescape(f.get(4)?),
                fstype: p.first()?.to_string(),
                opts: p.get(2).unwrap_or(&"").to_string(),
            })
        })
        .collect();
    let mut at = Vec::new();
    // The mount `real` is reached through: the deepest mount point above it, the latest of those.
    let home = mounts
        .iter()
        .enumerate()
        .filter(|(_, m)| real.starts_with(&m.point))
        .max_by_key(|(i, m)| (m.point.components().count(), *i));
    let want = dev.map(|d| format!("{}:{}", nix::sys::stat::major(d), nix::sys::stat::minor(d)));
    if let Some((h, home)) = home.filter(|(_, m)| Some(&m.majmin) == want.as_ref()) {
        if let Ok(rest) = real.strip_prefix(&home.point) {
            let inside = home.root.join(rest);
            for (i, m) in mounts.iter().enumerate() {
                if i == h || m.majmin != home.majmin {
                    continue;
                }
                if let Ok(below) = inside.strip_prefix(&m.root) {
                    let shown = if below.as_os_str().is_empty() { m.point.clone() } else { m.point.join(below) };
                    if shown != real {
                        at.push(shown);
                    }
                }
            }
        }
    }
    for m in mounts.iter().filter(|m| m.fstype == "overlay") {
        let layers = m.opts.split(',').filter_map(|o| {
            o.strip_prefix("lowerdir=").or_else(|| o.strip_prefix("upperdir=")).or_else(|| o.strip_prefix("lowerdir+="))
        });
        for dir in layers.flat_map(|l| l.split(':')).filter(|d| !d.is_empty()).map(unescape) {
            if let Ok(below) = real.strip_prefix(&dir) {
                at.push(m.point.join(below));
            }
        }
    }
    at
}

/// A path as the walk's messages show it: escaped ([`crate::os::escape::clean`]), since the
/// names past a followed link are the link's owner's words (found by review: a link target
/// with a line break and a terminal escape forged a line of `check`).
fn shown<P: AsRef<Path> + ?Sized>(p: &P) -> String {
    use std::os::unix::ffi::OsStrExt;
    crate::os::escape::clean(p.as_ref().as_os_str().as_bytes())
}

/// kubelet's atomic writer's tree in `root` (which exists): `files` (name, contents, mode) in
/// `..2026_12_03_10_00_00.123456789`, `..data` -> it, and `NAME` -> `..data/NAME` for each;
/// `swap` writes the next version the way an update does (a new timestamped dir,
/// `..data_tmp` -> it, renamed over `..data`, the old dir removed). For the tests of the
/// walk, the config and the reload.
#[cfg(test)]
pub(crate) fn atomic_writer(root: &Path, files: &[(&str, &str, u32)], swap: bool) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let old = std::fs::read_link(root.join("..data")).ok();
    let stamp = format!("..2026_12_03_10_00_{:02}.123456789", if swap { 1 } else { 0 });
    let dir = root.join(&stamp);
    std::fs::create_dir(&dir).expect("mkdir ..TIMESTAMP");
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    for (name, contents, mode) in files {
        std::fs::write(dir.join(name), contents).expect("write");
        std::fs::set_permissions(dir.join(name), std::fs::Permissions::from_mode(*mode)).expect("chmod");
    }
    std::os::unix::fs::symlink(&stamp, root.join("..data_tmp")).expect("..data_tmp");
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).expect("rename ..data");
    for (name, _, _) in files {
        if std::fs::symlink_metadata(root.join(name)).is_err() {
            std::os::unix::fs::symlink(format!("..data/{name}"), root.join(name)).expect("link");
        }
    }
    if let Some(old) = old.filter(|o| *o != Path::new(&stamp)) {
        std::fs::remove_dir_all(root.join(old)).expect("remove the old dir");
    }
    dir
}

#[cfg(test)]
pub(crate) mod tests {
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

    /// Where else a mount table shows a file: binds of it and of a dir above it, overlays
    /// holding it; not a mount of the same path over itself (systemd's ReadWritePaths=), not
    /// another device's mount, not an unrelated bind.
    #[test]
    fn a_file_is_found_where_else_the_mount_table_shows_it() {
        let table = "\
22 1 254:0 / / rw,relatime - ext4 /dev/vda rw
30 22 254:0 /var/lib/sealnode /var/lib/sealnode rw,relatime - ext4 /dev/vda rw
31 22 254:0 /etc/sealnode/credential /var/lib/models/leak ro - ext4 /dev/vda rw
32 22 254:0 /etc /usr/share/doc/my\\040etc ro - ext4 /dev/vda rw
33 22 254:0 /srv/other /mnt/other ro - ext4 /dev/vda rw
34 22 0:45 /etc /mnt/tmpfs rw - tmpfs tmpfs rw
35 22 0:46 / /models/ov rw - overlay overlay rw,lowerdir=/etc/sealnode:/x,upperdir=/u,workdir=/w
";
        let dev = Some(nix::sys::stat::makedev(254, 0));
        let at = also_mounted_in(table, Path::new("/etc/sealnode/credential"), dev);
        let want: Vec<PathBuf> =
            ["/var/lib/models/leak", "/usr/share/doc/my etc/sealnode/credential", "/models/ov/credential"]
                .iter()
                .map(PathBuf::from)
                .collect();
        assert_eq!(at, want);
        // The state dir bound over itself: the key is where it is, once.
        assert!(also_mounted_in(table, Path::new("/var/lib/sealnode/attest/ed25519.key"), dev).is_empty());
        // This process's own table: a fresh temp file is nowhere else.
        let d = tree();
        assert!(MountTable::read().also_mounted_at(&d.path().join("p/f.json")).is_empty());
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

    /// Root's tests: skipped loudly when not root, a failure under SEALNODE_TEST_REQUIRE=all
    /// (or rootful), as tests/common's are.
    pub(crate) fn root_or_skip(what: &str) -> bool {
        if nix::unistd::geteuid().is_root() {
            return true;
        }
        let required = std::env::var("SEALNODE_TEST_REQUIRE").unwrap_or_default();
        if required.split(',').any(|f| matches!(f.trim(), "all" | "rootful")) {
            panic!("{what} needs root (mounts, chown), and SEALNODE_TEST_REQUIRE={required} requires it");
        }
        eprintln!("\n!!! SKIPPED: {what} needs root (mounts, chown)\n");
        false
    }

    /// `f` in a mount namespace of a thread of its own (unshare(CLONE_NEWNS) affects only the
    /// calling thread), its mounts private: they go when the thread ends. Root only.
    fn in_own_mount_ns(f: impl FnOnce() + Send) {
        std::thread::scope(|s| {
            s.spawn(|| {
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS).expect("unshare CLONE_NEWNS");
                let private = nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE;
                nix::mount::mount(None::<&str>, "/", None::<&str>, private, None::<&str>).expect("private /");
                f();
            })
            .join()
            .unwrap_or_else(|e| std::panic::resume_unwind(e));
        });
    }

    /// `src` bound read-only at `dst` (in the caller's mount namespace).
    fn bind_read_only(src: &Path, dst: &Path) {
        use nix::mount::{mount, MsFlags};
        mount(Some(src), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("bind");
        let ro = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY;
        mount(None::<&str>, dst, None::<&str>, ro, None::<&str>).expect("remount read-only");
    }

    fn mkdir(p: &Path, mode: u32) {
        std::fs::create_dir_all(p).expect("mkdir");
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }

    /// The ConfigMap's shape in a 0755 dir: the config is read through both links, from the
    /// timestamped dir, and `resolve` says where that is; after an update's swap, the new one.
    #[test]
    fn kubelets_links_are_followed_to_the_timestamped_dir() {
        let d = tree();
        let cm = d.path().join("cm");
        mkdir(&cm, 0o755);
        let real = atomic_writer(&cm, &[("sealnode.toml", "v1", 0o644), ("node.json", "{}", 0o644)], false);
        let f = read(&cm.join("sealnode.toml"), me()).expect("through both links");
        assert_eq!(f.bytes, b"v1");
        let (_, at) = resolve(&cm.join("sealnode.toml"), me()).expect("resolve");
        assert_eq!(at, real.join("sealnode.toml"));
        // A path through `..data` itself (a link in the middle) is followed too.
        assert_eq!(read(&cm.join("..data/node.json"), me()).expect("through ..data").bytes, b"{}");
        let real = atomic_writer(&cm, &[("sealnode.toml", "v2", 0o644), ("node.json", "{}", 0o644)], true);
        assert_eq!(read(&cm.join("sealnode.toml"), me()).expect("after the swap").bytes, b"v2");
        assert_eq!(resolve(&cm.join("sealnode.toml"), me()).expect("resolve").1, real.join("sealnode.toml"));
    }

    /// Every link but kubelet's kind is refused, naming the link and why; so is the file or a
    /// directory it leads to when that is not trusted. (what, link name, target, words).
    #[test]
    fn links_of_any_other_shape_are_refused_by_name() {
        let cases: &[(&str, &str, &str, &[&str])] = &[
            ("absolute", "abs.toml", "/etc/passwd", &["abs.toml is a symlink", "is absolute"]),
            ("escapes with ..", "up.toml", "../p/f.json", &["up.toml is a symlink", "not plain names"]),
            ("a '.' name", "dot.toml", "./real/f.json", &["dot.toml is a symlink", "not plain names"]),
            ("an empty name", "slash.toml", "real//f.json", &["slash.toml is a symlink", "not plain names"]),
            ("three names", "deep.toml", "real/sub/f.json", &["deep.toml is a symlink", "more than 2 names"]),
            ("a loop", "loop-a", "loop-b", &["is a symlink", "more than 8 symlinks"]),
            ("to a writable file", "w.toml", "real/w.json", &["real/w.json is writable by group or others"]),
            ("to a dir, not a file", "dir.toml", "real", &["real is not a regular file"]),
            ("missing", "gone.toml", "real/none.json", &["real/none.json", "No such file"]),
            // Found by review: a target's names were shown raw (a forged line of `check`).
            (
                "a target with a line break and an escape",
                "odd.toml",
                "..T\n[ok  ] fine\x1b[2J",
                &[r"..T\u{a}[ok  ] fine\u{1b}[2J: No such file"],
            ),
        ];
        let d = tree();
        let at = d.path().join("links");
        mkdir(&at.join("real/sub"), 0o755);
        std::fs::write(at.join("real/sub/f.json"), "{}").expect("write");
        std::fs::write(at.join("real/w.json"), "{}").expect("write");
        std::fs::set_permissions(at.join("real/w.json"), std::fs::Permissions::from_mode(0o666)).expect("chmod");
        std::os::unix::fs::symlink("loop-a", at.join("loop-b")).expect("symlink");
        for (what, name, target, words) in cases {
            if *name != "loop-b" {
                std::os::unix::fs::symlink(target, at.join(name)).expect("symlink");
            }
            let e = read(&at.join(name), me()).expect_err(what);
            for w in *words {
                assert!(e.contains(w), "{what}: {w:?} not in: {e}");
            }
            assert!(e.contains(&at.display().to_string()), "{what}: the path is named: {e}");
            assert!(!e.chars().any(|c| c.is_control()), "{what}: a control character shown raw: {e:?}");
        }
        // Eight links in a row are followed; a ninth is one too many.
        std::fs::write(at.join("real/f.json"), "eight").expect("write");
        for i in 1..=8 {
            let to = if i == 8 { "real/f.json".to_string() } else { format!("l{}", i + 1) };
            std::os::unix::fs::symlink(to, at.join(format!("l{i}"))).expect("symlink");
        }
        assert_eq!(read(&at.join("l1"), me()).expect("eight links").bytes, b"eight");
        std::os::unix::fs::symlink("l1", at.join("l0")).expect("symlink");
        let e = read(&at.join("l0"), me()).expect_err("nine links");
        assert!(e.contains("more than 8 symlinks"), "{e}");
        // A kubelet-shaped link in a directory others can write (a read-write mount): refused
        // at the directory, before the link is looked at.
        let cm = d.path().join("cm-rw");
        mkdir(&cm, 0o755);
        atomic_writer(&cm, &[("sealnode.toml", "v1", 0o644)], false);
        std::fs::set_permissions(&cm, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let e = read(&cm.join("sealnode.toml"), me()).expect_err("0777 on a read-write mount");
        assert!(
            e.contains(&format!("directory {} is writable by group or others", cm.display()))
                && e.contains("read-write mount"),
            "{e}"
        );
    }

    /// A link another user owns is never followed, even of kubelet's shape, in a sticky
    /// directory (where that user may create it) or any other.
    #[test]
    fn a_link_of_another_user_is_refused() {
        if !root_or_skip("a_link_of_another_user_is_refused") {
            return;
        }
        let d = tree();
        let cm = d.path().join("cm");
        mkdir(&cm, 0o1777);
        atomic_writer(&cm, &[("sealnode.toml", "v1", 0o644)], false);
        read(&cm.join("sealnode.toml"), 0).expect("root's links, in a sticky dir");
        for link in ["sealnode.toml", "..data"] {
            std::os::unix::fs::lchown(cm.join(link), Some(4242), None).expect("lchown");
            let e = read(&cm.join("sealnode.toml"), 0).expect_err(link);
            assert!(
                e.contains(&format!("{} is a symlink", cm.join(link).display()))
                    && e.contains("owned by another user (uid 4242)"),
                "{link}: {e}"
            );
            std::os::unix::fs::lchown(cm.join(link), Some(0), None).expect("lchown");
        }
        // The launcher's own links are trusted when it is not root, a third user's are not.
        read(&cm.join("sealnode.toml"), 65534).expect("root's links, rootless");
    }

    /// A directory writable by group or others is trusted only as a volume's root as kubelet
    /// mounts it: the ConfigMap's root (0777, a read-only bind, with kubelet's links) and the
    /// Secret's (a 1777 tmpfs, read-only: sticky); the same 0777 dir through its read-write
    /// path is refused, and so is one a read-only view shows that is not such a root.
    #[test]
    fn a_writable_dir_is_trusted_only_on_a_read_only_mount() {
        if !root_or_skip("a_writable_dir_is_trusted_only_on_a_read_only_mount") {
            return;
        }
        let d = tree();
        let (src, cm) = (d.path().join("cm-src"), d.path().join("cm"));
        mkdir(&src, 0o755);
        mkdir(&cm, 0o755);
        atomic_writer(&src, &[("sealnode.toml", "v1", 0o644)], false);
        std::fs::set_permissions(&src, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let (secret_src, secret) = (d.path().join("secret-src"), d.path().join("secret"));
        mkdir(&secret_src, 0o755);
        mkdir(&secret, 0o755);
        in_own_mount_ns(|| {
            let e = read(&src.join("sealnode.toml"), 0).expect_err("0777, read-write");
            assert!(e.contains("writable by group or others") && e.contains("read-write mount"), "{e}");
            bind_read_only(&src, &cm);
            assert_eq!(read(&cm.join("sealnode.toml"), 0).expect("0777, read-only").bytes, b"v1");
            check_dirs_to(&cm.join("sealnode.toml"), 0).expect("check_dirs_to: 0777, read-only");
            // Still refused through the read-write path, beside the read-only one.
            read(&src.join("sealnode.toml"), 0).expect_err("0777, read-write, again");
            // A read-only view is not enough (found by review: under ProtectSystem=strict
            // every directory is on a read-only mount): a 0777 dir below a read-only mount's
            // root, and a 0777 mount root without kubelet's ..data link, are refused.
            let (plain_src, plain) = (d.path().join("plain-src"), d.path().join("plain"));
            mkdir(&plain_src, 0o755);
            mkdir(&plain, 0o755);
            let inner = plain_src.join("etc-sealnode");
            mkdir(&inner, 0o755);
            std::fs::write(inner.join("sealnode.toml"), "v1").expect("write");
            std::fs::set_permissions(&inner, std::fs::Permissions::from_mode(0o775)).expect("chmod");
            bind_read_only(&plain_src, &plain);
            let e = read(&plain.join("etc-sealnode/sealnode.toml"), 0).expect_err("0775 below a read-only root");
            assert!(e.contains("on a read-only mount, but is not a volume's root"), "{e}");
            std::fs::set_permissions(&plain_src, std::fs::Permissions::from_mode(0o777)).expect("chmod");
            std::fs::write(plain_src.join("sealnode.toml"), "v1").expect("write");
            let e = read(&plain.join("sealnode.toml"), 0).expect_err("a 0777 read-only root without ..data");
            assert!(e.contains("on a read-only mount, but is not a volume's root"), "{e}");
            // Nor with a ..data kubelet did not make (found by review): another user's link, a
            // dangling one of root's, one to a directory others can write.
            let data = plain_src.join("..data");
            std::os::unix::fs::symlink("nothing", &data).expect("link");
            std::os::unix::fs::lchown(&data, Some(12345), Some(12345)).expect("lchown");
            read(&plain.join("sealnode.toml"), 0).expect_err("another user's ..data");
            std::os::unix::fs::lchown(&data, Some(0), Some(0)).expect("lchown");
            read(&plain.join("sealnode.toml"), 0).expect_err("a dangling ..data");
            std::fs::remove_file(&data).expect("rm");
            mkdir(&plain_src.join("..2026_12_06"), 0o777);
            std::os::unix::fs::symlink("..2026_12_06", &data).expect("link");
            read(&plain.join("sealnode.toml"), 0).expect_err("..data to a dir others can write");
            std::fs::set_permissions(plain_src.join("..2026_12_06"), std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
            assert_eq!(read(&plain.join("sealnode.toml"), 0).expect("kubelet's shape").bytes, b"v1");
            // The Secret: a tmpfs of mode 1777 (sticky: accepted as such too), read-only.
            nix::mount::mount(
                Some("tmpfs"),
                &secret_src,
                Some("tmpfs"),
                nix::mount::MsFlags::empty(),
                Some("mode=1777,size=1m"),
            )
            .expect("tmpfs");
            atomic_writer(&secret_src, &[("credential", "token", 0o400)], false);
            bind_read_only(&secret_src, &secret);
            let (_, real) = resolve(&secret.join("credential"), 0).expect("the Secret's credential");
            assert!(real.starts_with(secret.join("..2026_12_03_10_00_00.123456789")), "{}", real.display());
            // Writable by group (0775, not sticky) on a read-write tmpfs: refused.
            std::fs::set_permissions(&secret_src, std::fs::Permissions::from_mode(0o775)).expect("chmod");
            let e = resolve(&secret_src.join("credential"), 0).expect_err("0775, read-write");
            assert!(e.contains("read-write mount"), "{e}");
        });
    }
}
