//! Raw system calls that nix does not wrap (or wraps in a way the child cannot use).
//! Most of sealnode's `unsafe` blocks live here; every one, here or elsewhere, carries its
//! `// SAFETY:` argument.

use std::ffi::{CStr, CString};
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;

/// Open `path` as an O_PATH fd, failing with ELOOP if any component is a symlink.
pub fn open_path_no_symlinks(path: &Path) -> Result<OwnedFd, Errno> {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|_| Errno::EINVAL)?;
    let fd = open_path_no_symlinks_c(&c)?;
    // SAFETY: the fd was just opened for us and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Same as [`open_path_no_symlinks`] but with a pre-built C string (no allocation: child-safe).
/// `openat2(RESOLVE_NO_SYMLINKS)` where the kernel and the caller's seccomp filter allow it;
/// systemd's `RestrictSUIDSGID=` answers openat2 with ENOSYS (it cannot inspect its mode), and
/// then the same guarantee comes from a walk one component at a time ([`walk_no_symlinks`]).
pub fn open_path_no_symlinks_c(path: &CStr) -> Result<RawFd, Errno> {
    let flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    match openat2(libc::AT_FDCWD, path, flags, libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS) {
        Err(Errno::ENOSYS) => walk_no_symlinks(path),
        r => r,
    }
}

/// openat2(2) with `flags` (O_*) and `resolve` (RESOLVE_*); the caller owns the returned fd.
/// No allocation (the sandbox's child calls it before exec). ENOSYS where the kernel or a
/// seccomp filter (systemd's RestrictSUIDSGID=) refuses openat2: the caller's fallback.
pub fn openat2(dirfd: RawFd, path: &CStr, flags: u64, resolve: u64) -> Result<RawFd, Errno> {
    #[repr(C)]
    struct OpenHow {
        flags: u64,
        mode: u64,
        resolve: u64,
    }
    let how = OpenHow { flags, mode: 0, resolve };
    // SAFETY: path is a valid NUL-terminated string and `how` a valid open_how of the size passed.
    let r = unsafe {
        libc::syscall(libc::SYS_openat2, dirfd, path.as_ptr(), &how as *const OpenHow, std::mem::size_of::<OpenHow>())
    };
    Errno::result(r).map(|fd| fd as RawFd)
}

/// Open `path` O_PATH one component at a time, each with O_NOFOLLOW and checked not to be a
/// symlink (magic links included): what RESOLVE_NO_SYMLINKS does, without openat2. No
/// allocation (the child calls it before exec).
pub fn walk_no_symlinks(path: &CStr) -> Result<RawFd, Errno> {
    let start: &CStr = if path.to_bytes().first() == Some(&b'/') { c"/" } else { c"." };
    // SAFETY: a valid NUL-terminated path; the result is checked.
    let dir = Errno::result(unsafe { libc::open(start.as_ptr(), libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC) })?;
    walk_from(dir, path, false)
}

/// `rel` beneath the directory `root` one component at a time, refusing a symlink (ELOOP) and
/// `..` (EXDEV): what openat2 `RESOLVE_IN_ROOT|RESOLVE_NO_SYMLINKS` finds for the paths
/// sealnode's setup names, without openat2 (unit test:
/// sys::tests::the_walk_in_a_root_refuses_symlinks_and_dotdot).
pub fn walk_no_symlinks_at(root: &impl AsRawFd, rel: &CStr) -> Result<RawFd, Errno> {
    // SAFETY: fcntl F_DUPFD_CLOEXEC on a valid fd; the result is checked and owned by the walk.
    let dir = Errno::result(unsafe { libc::fcntl(root.as_raw_fd(), libc::F_DUPFD_CLOEXEC, 0) })?;
    walk_from(dir, rel, true)
}

/// The walk of [`walk_no_symlinks`] and [`walk_no_symlinks_at`] from `dir`, which it owns (and
/// closes); `beneath`: `..` is refused.
fn walk_from(mut dir: RawFd, path: &CStr, beneath: bool) -> Result<RawFd, Errno> {
    let close = |fd: RawFd| {
        // SAFETY: fd is one this function owns.
        unsafe { libc::close(fd) };
    };
    let bytes = path.to_bytes();
    // What the kernel's own lookup refuses, refused with the same errno (unit test:
    // sys::tests::the_walk_refuses_symlinks_like_openat2).
    if bytes.is_empty() {
        close(dir);
        return Err(Errno::ENOENT);
    }
    if bytes.len() >= libc::PATH_MAX as usize {
        close(dir);
        return Err(Errno::ENAMETOOLONG);
    }
    // A trailing "/" or "/." means the last component must be a directory.
    let must_be_dir = bytes.ends_with(b"/") || bytes.ends_with(b"/.");
    let flags = libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC;
    let mut name = [0u8; 256];
    for comp in bytes.split(|b| *b == b'/').filter(|c| !c.is_empty() && *c != b".") {
        if beneath && comp == b".." {
            close(dir);
            return Err(Errno::EXDEV);
        }
        if comp.len() >= name.len() {
            close(dir);
            return Err(Errno::ENAMETOOLONG);
        }
        name[..comp.len()].copy_from_slice(comp);
        name[comp.len()] = 0;
        // SAFETY: `name` holds a NUL-terminated component; dir is an fd we own.
        let next = unsafe { libc::openat(dir, name.as_ptr().cast(), flags) };
        close(dir);
        let next = Errno::result(next)?;
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: fstat fills the stat buffer we own; read only after success.
        if let Err(e) = Errno::result(unsafe { libc::fstat(next, st.as_mut_ptr()) }) {
            close(next);
            return Err(e);
        }
        // SAFETY: initialised by the successful fstat above.
        let kind = unsafe { st.assume_init() }.st_mode & libc::S_IFMT;
        if kind == libc::S_IFLNK {
            close(next);
            return Err(Errno::ELOOP);
        }
        if must_be_dir && kind != libc::S_IFDIR {
            close(next);
            return Err(Errno::ENOTDIR);
        }
        dir = next;
    }
    Ok(dir)
}

/// Open `path` as an O_PATH fd, following symlinks (system paths).
pub fn open_path_c(path: &CStr) -> Result<RawFd, Errno> {
    // SAFETY: path is a valid NUL-terminated string.
    let r = unsafe { libc::open(path.as_ptr(), libc::O_PATH | libc::O_CLOEXEC) };
    Errno::result(r)
}

/// The value of extended attribute `name` of `path` (following symlinks), if it has one.
pub fn getxattr(path: &Path, name: &str) -> Option<Vec<u8>> {
    let p = CString::new(path.as_os_str().as_bytes()).ok()?;
    let n = CString::new(name).ok()?;
    let mut buf = vec![0u8; 256];
    // SAFETY: both strings are NUL-terminated; `buf` is writable for its length.
    let r = unsafe { libc::getxattr(p.as_ptr(), n.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) };
    let len = usize::try_from(r).ok()?;
    buf.truncate(len);
    Some(buf)
}

/// clone3's CLONE_INTO_CGROUP (Linux 5.7): the child starts in the cgroup `cgroup` names.
/// (libc's constant is a c_int that overflows, deprecated for that.)
pub const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// fork-like clone3 with `flags`, started in the cgroup whose directory `cgroup` is, if one is
/// given: no instruction of the child runs outside it. With CLONE_PARENT the exit signal is the
/// caller's own (the kernel refuses one given); otherwise SIGCHLD.
///
/// # Safety
/// As [`clone_fork`]: the caller is single-threaded, and the child returns 0 into a copy of it.
pub unsafe fn clone3(flags: libc::c_int, cgroup: Option<std::os::fd::BorrowedFd>) -> Result<libc::pid_t, Errno> {
    use std::os::fd::AsRawFd;
    let parent = flags & libc::CLONE_PARENT != 0;
    // SAFETY: clone_args is plain integers: all-zero is its "nothing set" value.
    let mut args: libc::clone_args = unsafe { std::mem::zeroed() };
    args.flags = flags as u32 as u64;
    args.exit_signal = if parent { 0 } else { libc::SIGCHLD as u64 };
    if let Some(cgroup) = cgroup {
        args.flags |= CLONE_INTO_CGROUP;
        args.cgroup = cgroup.as_raw_fd() as u64;
    }
    // SAFETY: `args` is a valid clone_args of the size passed; no stack: fork semantics.
    let r = unsafe {
        libc::syscall(libc::SYS_clone3, &mut args as *mut libc::clone_args, std::mem::size_of::<libc::clone_args>())
    };
    Errno::result(r).map(|p| p as libc::pid_t)
}

/// clone(2) with fork semantics (no new stack) and the given namespace flags.
/// Returns 0 in the child and the child's pid in the parent.
///
/// # Safety
/// The caller must be single-threaded: the child continues on a copy of the caller's
/// address space with only the calling thread, as after fork(2).
pub unsafe fn clone_fork(flags: libc::c_int) -> Result<libc::pid_t, Errno> {
    // SAFETY: a NULL stack gives fork semantics; the caller guarantees single-threadedness.
    let r = unsafe {
        libc::syscall(
            libc::SYS_clone,
            (flags | libc::SIGCHLD) as libc::c_ulong,
            std::ptr::null_mut::<libc::c_void>(),
            std::ptr::null_mut::<libc::c_int>(),
            std::ptr::null_mut::<libc::c_int>(),
            0 as libc::c_ulong,
        )
    };
    Errno::result(r).map(|p| p as libc::pid_t)
}

/// close_range(first, u32::MAX, CLOSE_RANGE_CLOEXEC): mark every fd from `first` on close-on-exec.
pub fn cloexec_from(first: u32) -> Result<(), Errno> {
    // SAFETY: close_range takes plain integers; CLOEXEC only sets flags and closes nothing.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, u32::MAX, libc::CLOSE_RANGE_CLOEXEC) };
    Errno::result(r).map(drop)
}

/// Close every fd in [first, last].
pub fn close_range(first: u32, last: u32) -> Result<(), Errno> {
    // SAFETY: close_range takes plain integers; the caller owns no Rust handles in that range.
    let r = unsafe { libc::syscall(libc::SYS_close_range, first, last, 0) };
    Errno::result(r).map(drop)
}

pub const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub const MOUNT_ATTR_NODEV: u64 = 0x4;
pub const MOUNT_ATTR_NOEXEC: u64 = 0x8;

#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}

/// Where a mount read-back looks: a path (followed as mount(2) follows it), or an fd already
/// open (O_PATH) on the very inode, read with AT_EMPTY_PATH and fstatfs: no second walk and
/// no trip through /proc/self/fd's magic links (docs/performance.md, "Launch").
#[derive(Clone, Copy)]
pub enum Place<'a> {
    Path(&'a CStr),
    Fd(BorrowedFd<'a>),
}

impl<'a> From<&'a CStr> for Place<'a> {
    fn from(p: &'a CStr) -> Self {
        Place::Path(p)
    }
}

impl<'a> From<BorrowedFd<'a>> for Place<'a> {
    fn from(fd: BorrowedFd<'a>) -> Self {
        Place::Fd(fd)
    }
}

impl Place<'_> {
    /// The (dirfd, path, flags) triple of an *at() call that names this place.
    fn at(&self) -> (RawFd, &CStr, libc::c_int) {
        match self {
            Place::Path(p) => (libc::AT_FDCWD, p, 0),
            Place::Fd(fd) => (fd.as_raw_fd(), c"", libc::AT_EMPTY_PATH),
        }
    }

    fn statfs(&self) -> Result<nix::sys::statfs::Statfs, Errno> {
        match self {
            Place::Path(p) => nix::sys::statfs::statfs(*p),
            Place::Fd(fd) => nix::sys::statfs::fstatfs(fd),
        }
    }

    fn statvfs(&self) -> Result<nix::sys::statvfs::Statvfs, Errno> {
        match self {
            Place::Path(p) => nix::sys::statvfs::statvfs(*p),
            Place::Fd(fd) => nix::sys::statvfs::fstatvfs(fd),
        }
    }
}

/// mount_setattr(place, AT_RECURSIVE?): add `set` attributes to a mount (and its submounts).
/// Only adds restrictions, so locked flags inherited from the host are never cleared.
pub fn mount_setattr<'a>(place: impl Into<Place<'a>>, set: u64, recursive: bool) -> Result<(), Errno> {
    let place = place.into();
    let attr = MountAttr { attr_set: set, attr_clr: 0, propagation: 0, userns_fd: 0 };
    let (dirfd, path, flags) = place.at();
    let flags = if recursive { flags | libc::AT_RECURSIVE } else { flags };
    // SAFETY: path is NUL-terminated; attr is a valid mount_attr of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            dirfd,
            path.as_ptr(),
            flags as libc::c_uint,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    Errno::result(r)?;
    // The call's return is not proof: a filter above sealnode (a container runtime's seccomp
    // profile) can answer it with a faked success (found in review). The mount's flags as the
    // kernel reports them must now hold what was asked; else EOPNOTSUPP.
    has_attrs(place, set)
}

/// A mount just made at `path`, as the kernel shows it: a new mount there (its id is not
/// `before`, the id of the mount `path` was on before the call: [`mount_id`]), the root of that
/// mount (statx's STATX_ATTR_MOUNT_ROOT), of filesystem `fs` when one is given, with the
/// `attrs` asked for (MOUNT_ATTR_*) among its flags; else EOPNOTSUPP. mount(2)'s return is not
/// proof: a filter above sealnode can answer it with a faked success, which would leave a /proc
/// file unmasked or a role's dir as the empty directory below it; and a path already on a mount
/// of that kind is no proof either (found by review: where the host's /tmp is a nosuid, nodev
/// tmpfs, a faked root tmpfs passed, and the root's skeleton was written into the host's /tmp).
/// Returns the new mount's id.
pub fn mounted<'a>(
    place: impl Into<Place<'a>>,
    before: u64,
    fs: Option<nix::sys::statfs::FsType>,
    attrs: u64,
) -> Result<u64, Errno> {
    let place = place.into();
    // One statx: the mount's id, and whether the place is its root.
    let st = statx_mount(place)?;
    if st.stx_mnt_id == before {
        return Err(Errno::EOPNOTSUPP);
    }
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    if st.stx_attributes_mask & root == 0 || st.stx_attributes & root == 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    if let Some(fs) = fs {
        if place.statfs()?.filesystem_type() != fs {
            return Err(Errno::EOPNOTSUPP);
        }
    }
    has_attrs(place, attrs).map(|()| st.stx_mnt_id)
}

/// The id of the mount `place` is on (statx's STATX_MNT_ID): a new mount there shows a new one.
pub fn mount_id<'a>(place: impl Into<Place<'a>>) -> Result<u64, Errno> {
    statx_mount(place.into()).map(|st| st.stx_mnt_id)
}

/// statx of `place` (a path followed as mount(2) follows it, or the fd's own inode) with its
/// mount id, which must be there (else EOPNOTSUPP); the attributes (STATX_ATTR_MOUNT_ROOT)
/// come with every statx. The id is the unique one where the kernel has it (the same kind for every call on a host): the
/// old one is reused once a mount is gone (found by review: a bind detached from the host
/// during a setup gave its id to the next mount, and the refusal named the wrong bind).
fn statx_mount(place: Place<'_>) -> Result<libc::statx, Errno> {
    let (dirfd, path, flags) = place.at();
    // SAFETY: statx is plain data; zeroed is a valid value for the kernel to fill.
    let mut st: libc::statx = unsafe { std::mem::zeroed() };
    // STATX_MNT_ID_UNIQUE (Linux 6.8): an id never reused while the system runs.
    let want = libc::STATX_MNT_ID | libc::STATX_MNT_ID_UNIQUE;
    // SAFETY: path is NUL-terminated, dirfd AT_FDCWD or a live borrowed fd; `st` a valid,
    // writable statx buffer.
    let r = unsafe { libc::statx(dirfd, path.as_ptr(), flags | libc::AT_NO_AUTOMOUNT, want, &mut st) };
    Errno::result(r)?;
    if st.stx_mask & want == 0 {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(st)
}

/// The id of the mount `place` is on ([`mount_id`]) and whether `place` is that mount's root.
pub fn mount_at<'a>(place: impl Into<Place<'a>>) -> Result<(u64, bool), Errno> {
    let st = statx_mount(place.into())?;
    let root = libc::STATX_ATTR_MOUNT_ROOT as u64;
    Ok((st.stx_mnt_id, st.stx_attributes_mask & root != 0 && st.stx_attributes & root != 0))
}

/// The mount at `place` has every flag of `attrs` (MOUNT_ATTR_*), as statvfs reports them (a
/// superblock made read-only shows as read-only too); else EOPNOTSUPP.
pub fn has_attrs<'a>(place: impl Into<Place<'a>>, attrs: u64) -> Result<(), Errno> {
    let want = [
        (MOUNT_ATTR_RDONLY, nix::sys::statvfs::FsFlags::ST_RDONLY),
        (MOUNT_ATTR_NOSUID, nix::sys::statvfs::FsFlags::ST_NOSUID),
        (MOUNT_ATTR_NODEV, nix::sys::statvfs::FsFlags::ST_NODEV),
        (MOUNT_ATTR_NOEXEC, nix::sys::statvfs::FsFlags::ST_NOEXEC),
    ];
    if attrs == 0 {
        return Ok(());
    }
    let flags = place.into().statvfs()?.flags();
    if want.iter().any(|(attr, st)| attrs & attr != 0 && !flags.contains(*st)) {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// No mount of this mount namespace propagates (/proc/self/mountinfo shows no `shared:` or
/// `master:` peer group): `MS_REC|MS_PRIVATE` on `/` read back, as a faked one would leave
/// the copied mounts' propagation as it was.
pub fn no_propagation() -> Result<(), Errno> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    // The optional fields sit between the mount options (6th) and the " - " separator.
    let propagates = text.lines().any(|l| {
        let head = l.split(" - ").next().unwrap_or(l);
        head.split_whitespace().skip(6).any(|f| f.starts_with("shared:") || f.starts_with("master:"))
    });
    if text.is_empty() || propagates {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// pivot_root(new_root, put_old).
pub fn pivot_root(new_root: &CStr, put_old: &CStr) -> Result<(), Errno> {
    // SAFETY: both are valid NUL-terminated paths.
    let r = unsafe { libc::syscall(libc::SYS_pivot_root, new_root.as_ptr(), put_old.as_ptr()) };
    Errno::result(r).map(drop)
}

/// Bring the loopback interface up (a new network namespace starts with it down).
pub fn loopback_up() -> Result<(), Errno> {
    // SAFETY: plain socket(2) call; the fd is owned below.
    let s = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    let s = Errno::result(s)?;
    // SAFETY: s is a fresh fd we own.
    let sock = unsafe { OwnedFd::from_raw_fd(s) };
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (d, s) in ifr.ifr_name.iter_mut().zip(b"lo\0") {
        *d = *s as libc::c_char;
    }
    use std::os::fd::AsRawFd;
    // SAFETY: SIOCGIFFLAGS reads into the ifreq we own.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut ifr) })?;
    // SAFETY: ifru_flags is the active union member after SIOCGIFFLAGS.
    let flags = unsafe { ifr.ifr_ifru.ifru_flags };
    // Already up (a role inside a cell: the cell init brought it up, and the role, in a user
    // namespace of its own, holds no CAP_NET_ADMIN over the cell's network namespaces).
    if flags & libc::IFF_UP as libc::c_short != 0 {
        return Ok(());
    }
    ifr.ifr_ifru.ifru_flags = flags | libc::IFF_UP as libc::c_short;
    // SAFETY: SIOCSIFFLAGS reads the ifreq we own.
    Errno::result(unsafe { libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &ifr) })?;
    Ok(())
}

/// Confine this process with a Landlock ruleset that handles execution, with one rule allowing
/// it beneath / (and no_new_privs first): what each role's setup does, as doctor tries it in a
/// throwaway child (a container's seccomp profile may refuse any of the three calls).
pub fn landlock_restrict_probe() -> Result<(), Errno> {
    #[repr(C)]
    struct RulesetAttr {
        handled_access_fs: u64,
    }
    const LANDLOCK_ACCESS_FS_EXECUTE: u64 = 1;
    const LANDLOCK_ACCESS_FS_READ_DIR: u64 = 1 << 3;
    // Listing directories handled and granted nowhere: the read-back below.
    let attr = RulesetAttr { handled_access_fs: LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_DIR };
    // SAFETY: attr is a valid landlock_ruleset_attr (its first field) of the size passed.
    let fd = Errno::result(unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            &attr as *const RulesetAttr,
            std::mem::size_of::<RulesetAttr>(),
            0 as libc::c_uint,
        )
    })?;
    // SAFETY: the kernel returned a new descriptor, which this function alone owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    // One rule, as each role's ruleset has many: execution beneath /.
    #[repr(C, packed)]
    struct PathBeneath {
        allowed_access: u64,
        parent_fd: i32,
    }
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_uint = 1;
    use nix::fcntl::OFlag;
    let root = nix::fcntl::open("/", OFlag::O_PATH | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())?;
    let rule = PathBeneath { allowed_access: LANDLOCK_ACCESS_FS_EXECUTE, parent_fd: root.as_raw_fd() };
    // SAFETY: rule is a valid landlock_path_beneath_attr (packed, as the kernel's) for the call.
    Errno::result(unsafe {
        libc::syscall(
            libc::SYS_landlock_add_rule,
            fd.as_raw_fd(),
            LANDLOCK_RULE_PATH_BENEATH,
            &rule as *const PathBeneath,
            0 as libc::c_uint,
        )
    })?;
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1)?;
    // SAFETY: fd is a Landlock ruleset descriptor; flags 0.
    Errno::result(unsafe { libc::syscall(libc::SYS_landlock_restrict_self, fd.as_raw_fd(), 0 as libc::c_uint) })?;
    // Read back (found by review: a faked restrict_self passed): listing / is now refused.
    match nix::fcntl::open("/", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
    {
        Err(Errno::EACCES) => Ok(()),
        _ => Err(Errno::EOPNOTSUPP),
    }
}

/// The Landlock ABI version the running kernel offers (0 if none).
pub fn landlock_abi() -> i32 {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a NULL attr and size 0 and the VERSION flag, the call only returns a number.
    let r = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    if r < 0 {
        0
    } else {
        r as i32
    }
}

/// write(2) that retries on EINTR and short writes; no allocation (child-safe).
pub fn write_all(fd: RawFd, mut buf: &[u8]) -> Result<(), Errno> {
    while !buf.is_empty() {
        // SAFETY: buf is a valid readable slice of buf.len() bytes.
        let r = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
        match Errno::result(r) {
            // Nothing written for a non-empty buffer: no file sealnode writes answers so, but a
            // filter above sealnode faking write(2) does, and retrying would spin for ever
            // (found by test: the setup's sysctl write spun).
            Ok(0) => return Err(Errno::EIO),
            Ok(n) => buf = &buf[n as usize..],
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// read(2) retrying on EINTR; returns the byte count (0 = EOF).
pub fn read_retry(fd: RawFd, buf: &mut [u8]) -> Result<usize, Errno> {
    loop {
        // SAFETY: buf is a valid writable slice of buf.len() bytes.
        let r = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
        match Errno::result(r) {
            Ok(n) => return Ok(n as usize),
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// execve(2) with pre-built argv/envp pointer arrays (NULL-terminated). Returns only on error.
pub fn execve(path: &CStr, argv: &[*const libc::c_char], envp: &[*const libc::c_char]) -> Errno {
    debug_assert!(argv.last().is_some_and(|p| p.is_null()));
    debug_assert!(envp.last().is_some_and(|p| p.is_null()));
    // SAFETY: path is NUL-terminated; argv and envp are NULL-terminated arrays of pointers to
    // NUL-terminated strings that outlive the call (owned by the caller's plan).
    unsafe { libc::execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    Errno::last()
}

/// Is any of `sigs` pending for this process or thread (blocked and not yet taken)? Looks
/// without consuming: the supervisor's signalfd still reads it afterwards.
pub fn signal_pending(sigs: &[nix::sys::signal::Signal]) -> bool {
    let mut set = std::mem::MaybeUninit::<libc::sigset_t>::uninit();
    // SAFETY: sigpending fills the whole sigset_t we own; it is read only after success.
    if unsafe { libc::sigpending(set.as_mut_ptr()) } != 0 {
        return false;
    }
    // SAFETY: initialised by the successful sigpending above.
    let set = unsafe { nix::sys::signal::SigSet::from_sigset_t_unchecked(set.assume_init()) };
    sigs.iter().any(|s| set.contains(*s))
}

/// Is `sig` ignored (SIG_IGN) in this process: by `nohup`, or a shell's background job (SIGINT
/// and SIGQUIT)? A query only: the disposition is not changed.
pub fn is_ignored(sig: nix::sys::signal::Signal) -> bool {
    let mut old = std::mem::MaybeUninit::<libc::sigaction>::uninit();
    // SAFETY: a null new action only reads the disposition into `old`, which we own; it is
    // read only after success.
    let r = unsafe { libc::sigaction(sig as libc::c_int, std::ptr::null(), old.as_mut_ptr()) };
    // SAFETY: filled by the successful sigaction above.
    r == 0 && unsafe { old.assume_init() }.sa_sigaction == libc::SIG_IGN
}

/// Take one of the blocked signals in `set` (sigtimedwait(2)): the signal, or None when
/// `timeout` passed first (no timeout: wait as long as it takes). EINTR is the caller's.
pub fn wait_signal(
    set: &nix::sys::signal::SigSet,
    timeout: Option<std::time::Duration>,
) -> Result<Option<nix::sys::signal::Signal>, Errno> {
    let ts = timeout.map(|t| libc::timespec {
        tv_sec: t.as_secs().min(libc::time_t::MAX as u64) as libc::time_t,
        tv_nsec: t.subsec_nanos() as libc::c_long,
    });
    let at = ts.as_ref().map_or(std::ptr::null(), |t| t as *const libc::timespec);
    // SAFETY: `set` is a valid sigset_t, no siginfo is asked for (null), `at` is null or
    // points to a timespec that lives until the call returns.
    let r = unsafe { libc::sigtimedwait(set.as_ref(), std::ptr::null_mut(), at) };
    match Errno::result(r) {
        Ok(n) => nix::sys::signal::Signal::try_from(n).map(Some),
        Err(Errno::EAGAIN) if timeout.is_some() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Exit immediately without running destructors or atexit handlers (child after clone).
pub fn exit_now(code: i32) -> ! {
    // SAFETY: _exit never returns and touches no Rust state.
    unsafe { libc::_exit(code) }
}

/// Drop every capability from the bounding set (needs CAP_SETPCAP in the effective set).
pub fn drop_bounding_set() -> Result<(), Errno> {
    for cap in 0..64 {
        // SAFETY: PR_CAPBSET_DROP takes an integer capability number.
        let r = unsafe { libc::prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, 0, 0, 0) };
        match Errno::result(r) {
            Ok(_) => {}
            // Past the kernel's last capability.
            Err(Errno::EINVAL) if cap > 0 => return Ok(()),
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Clear the ambient capability set.
pub fn prctl_ambient_clear_all() -> Result<(), Errno> {
    // SAFETY: PR_CAP_AMBIENT with PR_CAP_AMBIENT_CLEAR_ALL takes only integers.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAP_AMBIENT,
            libc::PR_CAP_AMBIENT_CLEAR_ALL as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    Errno::result(r).map(drop)
}

/// Is `cap` still in the bounding set?
pub fn capbset_has(cap: u32) -> Result<bool, Errno> {
    // SAFETY: PR_CAPBSET_READ takes an integer capability number.
    let r = unsafe {
        libc::prctl(
            libc::PR_CAPBSET_READ,
            cap as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    Errno::result(r).map(|v| v == 1)
}

/// prctl(option, arg) for the integer-only options sealnode uses.
pub fn prctl(option: libc::c_int, arg: libc::c_ulong) -> Result<(), Errno> {
    // SAFETY: every option passed here takes plain integer arguments.
    let r = unsafe { libc::prctl(option, arg, 0 as libc::c_ulong, 0 as libc::c_ulong, 0 as libc::c_ulong) };
    Errno::result(r).map(drop)
}

/// Whether this process is dumpable (PR_GET_DUMPABLE).
pub fn dumpable() -> Result<bool, Errno> {
    // SAFETY: PR_GET_DUMPABLE takes no argument and returns the flag.
    let r = unsafe {
        libc::prctl(
            libc::PR_GET_DUMPABLE,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
            0 as libc::c_ulong,
        )
    };
    Errno::result(r).map(|v| v != 0)
}

/// Reset every catchable signal to its default disposition and unblock all signals.
/// The launcher ignores SIGPIPE (Rust's runtime does) and blocks the signals it forwards;
/// both would otherwise survive execve into the workload.
pub fn reset_signals() -> Result<(), Errno> {
    use nix::sys::signal::{sigaction, SaFlags, SigAction, SigHandler, SigSet, SigmaskHow, Signal};
    let dfl = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for sig in Signal::iterator() {
        if sig == Signal::SIGKILL || sig == Signal::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL has no handler code to be unsafe.
        unsafe { sigaction(sig, &dfl) }?;
    }
    nix::sys::signal::sigprocmask(SigmaskHow::SIG_SETMASK, Some(&SigSet::empty()), None)
}

/// A raw system call whose arguments are plain integers (no pointers), for the probe's escape
/// attempts. Returns the result or the errno.
pub fn syscall_ints(nr: libc::c_long, args: [u64; 6]) -> Result<i64, Errno> {
    // SAFETY: every argument is an integer the kernel reads by value; calls that take pointers
    // are only made through `syscall_with_buf`, which supplies a valid buffer.
    let r = unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) };
    Errno::result(r)
}

/// A raw system call whose argument `buf_index` is a pointer to `buf` (a writable buffer the
/// kernel may read or fill, e.g. io_uring params or a TIOCSTI byte).
pub fn syscall_with_buf(nr: libc::c_long, mut args: [u64; 6], buf_index: usize, buf: &mut [u8]) -> Result<i64, Errno> {
    args[buf_index] = buf.as_mut_ptr() as u64;
    // SAFETY: the pointer argument points to `buf`, valid and writable for its whole length,
    // which the caller sizes for the call (largest kernel structure it may write).
    let r = unsafe { libc::syscall(nr, args[0], args[1], args[2], args[3], args[4], args[5]) };
    Errno::result(r)
}

/// Close every fd except those in `keep` (and stdio). Used first thing in children, so a
/// long-lived sandbox init never holds the supervisor's other fds.
pub fn close_all_except(keep: &[RawFd]) -> Result<(), Errno> {
    let mut kept: Vec<u32> = keep.iter().filter(|&&f| f > 2).map(|&f| f as u32).collect();
    kept.sort_unstable();
    kept.dedup();
    let mut next = 3u32;
    for &k in &kept {
        if k > next {
            close_range(next, k - 1)?;
        }
        next = k + 1;
    }
    close_range(next, u32::MAX)?;
    // Read back (found by review: a faked close_range left a role's init holding the
    // supervisor's dirs, sockets and another role's scratch): no fd open beyond stdio and `keep`.
    let dir = nix::dir::Dir::open(
        "/proc/thread-self/fd",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let own = std::os::fd::AsRawFd::as_raw_fd(&dir);
    let mut dir = dir;
    for entry in dir.iter() {
        let name = entry?.file_name().to_bytes().to_vec();
        let Some(fd) = std::str::from_utf8(&name).ok().and_then(|n| n.parse::<RawFd>().ok()) else { continue };
        if fd > 2 && fd != own && !kept.contains(&(fd as u32)) {
            return Err(Errno::EOPNOTSUPP);
        }
    }
    Ok(())
}

/// Wait until `fd` can be read (data, or its writers gone) or `until` passes: `false` then.
pub fn readable_by(fd: std::os::fd::BorrowedFd, until: std::time::Instant) -> Result<bool, Errno> {
    ready_by(fd, until, nix::poll::PollFlags::POLLIN)
}

/// Have all writers of the pipe `fd` gone (POLLHUP; what they wrote is still there to read)
/// by `until`? A reader that needs no word before then sleeps through every write.
pub fn hung_up_by(fd: std::os::fd::BorrowedFd, until: std::time::Instant) -> Result<bool, Errno> {
    ready_by(fd, until, nix::poll::PollFlags::empty())
}

fn ready_by(
    fd: std::os::fd::BorrowedFd,
    until: std::time::Instant,
    events: nix::poll::PollFlags,
) -> Result<bool, Errno> {
    loop {
        let left = until.saturating_duration_since(std::time::Instant::now());
        let ms = nix::poll::PollTimeout::try_from(left.as_millis().min(60_000) as i32)
            .unwrap_or(nix::poll::PollTimeout::ZERO);
        let mut fds = [nix::poll::PollFd::new(fd, events)];
        match nix::poll::poll(&mut fds, ms) {
            Ok(0) if left.as_millis() <= 60_000 => return Ok(false),
            Ok(0) | Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
            Ok(_) => return Ok(true),
        }
    }
}

/// Has every writer of this pipe gone (POLLHUP)? The launcher holds the write end of the
/// sync pipe for as long as it lives, so this tells a child whether its launcher died.
pub fn pipe_hung_up(fd: RawFd) -> bool {
    use std::os::fd::BorrowedFd;
    // SAFETY: fd is a pipe end the caller keeps open for the duration of the call.
    let bfd = unsafe { BorrowedFd::borrow_raw(fd) };
    let mut pfd = [nix::poll::PollFd::new(bfd, nix::poll::PollFlags::POLLIN)];
    match nix::poll::poll(&mut pfd, nix::poll::PollTimeout::ZERO) {
        Ok(_) => pfd[0].revents().is_some_and(|r| r.contains(nix::poll::PollFlags::POLLHUP)),
        Err(_) => true,
    }
}

/// Die by SIGKILL when the parent dies, read back: a filter above sealnode can answer the
/// prctl with a faked success (found by review: every role outlived a killed supervisor);
/// EOPNOTSUPP when the signal is not in force.
pub fn die_with_parent() -> Result<(), Errno> {
    prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong)?;
    let mut sig: libc::c_int = 0;
    // SAFETY: PR_GET_PDEATHSIG writes one int through the pointer, which outlives the call.
    Errno::result(unsafe { libc::prctl(libc::PR_GET_PDEATHSIG, &mut sig as *mut libc::c_int) })?;
    if sig != libc::SIGKILL {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// This thread's namespace of the kind `flag` names: (device, inode) of /proc/thread-self/ns/X.
/// Whether the sysctl file at `path` reads as `value` (surrounding whitespace aside).
pub fn sysctl_is(path: &std::path::Path, value: &[u8]) -> Result<bool, Errno> {
    let shown = std::fs::read(path).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    Ok(shown.trim_ascii() == value.trim_ascii())
}

/// Write `value` to the sysctl file at `path`, read back: a faked write would leave the
/// namespace's value as it was (EOPNOTSUPP).
pub fn write_sysctl(path: &std::path::Path, value: &[u8]) -> Result<(), Errno> {
    let fd = nix::fcntl::open(
        path,
        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    write_all(fd.as_raw_fd(), value)?;
    drop(fd);
    if !sysctl_is(path, value)? {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// The parent of the user namespace `ns` (an open /proc/PID/ns/user), as (dev, inode):
/// ioctl NS_GET_PARENT.
pub fn userns_parent(ns: BorrowedFd) -> Result<(u64, u64), Errno> {
    // NS_GET_PARENT = _IO(0xb7, 0x2) (linux/nsfs.h; the libc crate does not define it).
    const NS_GET_PARENT: libc::c_ulong = 0xb702;
    // SAFETY: NS_GET_PARENT takes no argument and returns a new fd, owned below.
    let fd = Errno::result(unsafe { libc::ioctl(ns.as_raw_fd(), NS_GET_PARENT as _) })?;
    // SAFETY: fd is a fresh descriptor the ioctl returned.
    let parent = unsafe { OwnedFd::from_raw_fd(fd) };
    let st = nix::sys::stat::fstat(std::os::fd::AsFd::as_fd(&parent))?;
    Ok((st.st_dev, st.st_ino))
}

fn own_namespace(flag: nix::sched::CloneFlags) -> Result<(u64, u64), Errno> {
    use nix::sched::CloneFlags as F;
    let name = match flag {
        f if f == F::CLONE_NEWUSER => "user",
        f if f == F::CLONE_NEWNS => "mnt",
        f if f == F::CLONE_NEWNET => "net",
        f if f == F::CLONE_NEWUTS => "uts",
        _ => return Err(Errno::EINVAL),
    };
    let st = nix::sys::stat::stat(format!("/proc/thread-self/ns/{name}").as_str())?;
    Ok((st.st_dev, st.st_ino))
}

/// Enter the namespace `fd` is (setns), read back: a filter above sealnode can answer setns
/// with a faked success, leaving the caller where it was (found by review: a faked unshare
/// put the engine in the node's network namespace); EOPNOTSUPP when this thread is not in it.
pub fn setns_verified(fd: BorrowedFd, flag: nix::sched::CloneFlags) -> Result<(), Errno> {
    nix::sched::setns(fd, flag)?;
    let want = nix::sys::stat::fstat(fd)?;
    if own_namespace(flag)? != (want.st_dev, want.st_ino) {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// A new namespace of the kind `flag` names for this thread (unshare, one kind), read back as
/// [`setns_verified`] is: EOPNOTSUPP when it is still in the one it had.
pub fn unshare_verified(flag: nix::sched::CloneFlags) -> Result<(), Errno> {
    let before = own_namespace(flag)?;
    nix::sched::unshare(flag)?;
    if own_namespace(flag)? == before {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// This UTS namespace's hostname set to `name`, read back (uname): a faked sethostname would
/// show the host's name to the roles (found by review).
pub fn set_hostname(name: &str) -> Result<(), Errno> {
    nix::unistd::sethostname(name)?;
    if nix::sys::utsname::uname()?.nodename() != name {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// A session of its own (setsid), read back (getsid): a faked setsid left a role in the
/// supervisor's session, with its terminal (found by review).
pub fn new_session() -> Result<(), Errno> {
    nix::unistd::setsid()?;
    if nix::unistd::getsid(None)? != nix::unistd::getpid() {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// A line of this thread's /proc/thread-self/status, as the kernel writes it (a faked read
/// gives none): its value, trimmed.
pub fn own_status(field: &str) -> Result<String, Errno> {
    let text = std::fs::read_to_string("/proc/thread-self/status")
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    status_field(&text, field).map(str::to_string).ok_or(Errno::EOPNOTSUPP)
}

/// The value of line `field` of a /proc/PID/status text (`Name:\tvalue`), trimmed.
pub fn status_field<'a>(text: &'a str, field: &str) -> Option<&'a str> {
    text.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':').map(str::trim))
}

/// No supplementary group, read back from /proc/thread-self/status: a filter above sealnode can
/// answer setgroups with a faked success (found by review: a role kept the supervisor's groups
/// and read a file of one of them; then getgroups faked too); EOPNOTSUPP when a group is left.
pub fn clear_groups() -> Result<(), Errno> {
    nix::unistd::setgroups(&[])?;
    if !own_status("Groups")?.is_empty() {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// All three gids, then all three uids, set to `gid` and `uid`, each read back.
pub fn set_ids(uid: u32, gid: u32) -> Result<(), Errno> {
    set_gids(gid)?;
    set_uids(uid)
}

/// setresgid to `gid`, read back with getresgid into values no id has (a faked call leaves
/// them; found by review: a faked setresgid left a role host gid 0).
pub fn set_gids(gid: u32) -> Result<(), Errno> {
    let g = nix::unistd::Gid::from_raw(gid);
    nix::unistd::setresgid(g, g, g)?;
    let (mut r, mut e, mut s) = (u32::MAX, u32::MAX, u32::MAX);
    // SAFETY: three valid pointers to gid_t, written by the call.
    Errno::result(unsafe { libc::getresgid(&mut r, &mut e, &mut s) })?;
    if [r, e, s] != [gid; 3] {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// setresuid to `uid`, read back as [`set_gids`] is (found by review: a faked setresuid ran a
/// role as host root).
pub fn set_uids(uid: u32) -> Result<(), Errno> {
    let u = nix::unistd::Uid::from_raw(uid);
    nix::unistd::setresuid(u, u, u)?;
    let (mut r, mut e, mut s) = (u32::MAX, u32::MAX, u32::MAX);
    // SAFETY: three valid pointers to uid_t, written by the call.
    Errno::result(unsafe { libc::getresuid(&mut r, &mut e, &mut s) })?;
    if [r, e, s] != [uid; 3] {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// Exactly one mount at "/" in this mount namespace (/proc/self/mountinfo): after pivot_root
/// the old root stacked on the new one is detached, read back (found by review: a faked
/// umount2 left the host's whole mount tree listed in the role's mountinfo).
pub fn one_root_mount() -> Result<(), Errno> {
    let text = std::fs::read_to_string("/proc/self/mountinfo")
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    if text.lines().filter(|l| l.split_whitespace().nth(4) == Some("/")).count() != 1 {
        return Err(Errno::EOPNOTSUPP);
    }
    Ok(())
}

/// Re-arm PR_SET_PDEATHSIG (any credential change clears it) and make sure the launcher did
/// not die before it was armed.
pub fn rearm_pdeathsig(sync: RawFd) -> Result<(), Errno> {
    die_with_parent()?;
    if pipe_hung_up(sync) {
        return Err(Errno::ESRCH);
    }
    Ok(())
}

/// An argument of a raw system call made by the canary: an integer, or a buffer the kernel may
/// read or write (C strings include their NUL).
pub enum Arg<'a> {
    I(u64),
    B(&'a mut [u8]),
}

/// A raw system call with up to six integer-or-buffer arguments (canary attempts).
pub fn syscall_args(nr: libc::c_long, args: [Arg<'_>; 6]) -> Result<i64, Errno> {
    let mut v = [0u64; 6];
    for (slot, a) in v.iter_mut().zip(args) {
        *slot = match a {
            Arg::I(i) => i,
            Arg::B(b) => b.as_mut_ptr() as u64,
        };
    }
    // SAFETY: every pointer argument comes from a `&mut [u8]` that lives until the call
    // returns; callers size buffers for the largest structure the kernel may write.
    let r = unsafe { libc::syscall(nr, v[0], v[1], v[2], v[3], v[4], v[5]) };
    Errno::result(r)
}

/// Execute `int $0x80` (the i386 system call gate) with eax = `nr`; returns eax.
#[cfg(target_arch = "x86_64")]
pub fn int80(nr: u32) -> i64 {
    let mut eax: u64 = nr as u64;
    // SAFETY: an i386 system call with no pointer arguments; rax is in/out and the kernel
    // preserves every other register (r8-r11 are declared clobbered to be safe). Under
    // sealnode's filters the process is killed before the call runs (architecture pinned).
    unsafe {
        std::arch::asm!("int 0x80", inout("rax") eax, out("r8") _, out("r9") _, out("r10") _, out("r11") _);
    }
    eax as i64
}

/// capget/capset header and data (version 3: two 32-bit words per set).
#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Default, Clone, Copy)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

const CAP_V3: u32 = 0x2008_0522;

/// The calling thread's (effective, permitted, inheritable) sets as 64-bit masks.
pub fn capget() -> Result<(u64, u64, u64), Errno> {
    let mut hdr = CapHeader { version: CAP_V3, pid: 0 };
    // Every bit set before the call: a faked capget (a filter above sealnode answering 0
    // without the call; found by review) reads as every capability held, not as none.
    let mut data = [CapData { effective: u32::MAX, permitted: u32::MAX, inheritable: u32::MAX }; 2];
    // SAFETY: hdr and data are valid for capget's version-3 layout (two data structs).
    Errno::result(unsafe { libc::syscall(libc::SYS_capget, &mut hdr as *mut CapHeader, data.as_mut_ptr()) })?;
    let w = |f: fn(&CapData) -> u32| u64::from(f(&data[0])) | u64::from(f(&data[1])) << 32;
    Ok((w(|d| d.effective), w(|d| d.permitted), w(|d| d.inheritable)))
}

/// Set the calling thread's (effective, permitted, inheritable) sets in one call.
pub fn capset(effective: u64, permitted: u64, inheritable: u64) -> Result<(), Errno> {
    let mut hdr = CapHeader { version: CAP_V3, pid: 0 };
    let split = |v: u64| (v as u32, (v >> 32) as u32);
    let (e, p, i) = (split(effective), split(permitted), split(inheritable));
    let data = [
        CapData { effective: e.0, permitted: p.0, inheritable: i.0 },
        CapData { effective: e.1, permitted: p.1, inheritable: i.1 },
    ];
    // SAFETY: hdr and data are valid for capset's version-3 layout (two data structs).
    Errno::result(unsafe { libc::syscall(libc::SYS_capset, &mut hdr as *mut CapHeader, data.as_ptr()) }).map(drop)
}

/// Fill `buf` from the kernel's random source (getrandom(2), blocking until it is seeded):
/// key material.
pub fn random_bytes(buf: &mut [u8]) -> Result<(), Errno> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: getrandom writes at most rest.len() bytes into the buffer we own.
        match Errno::result(unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) }) {
            Ok(n) => done += n as usize,
            Err(Errno::EINTR) => continue,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Set the calling process's audit login uid (/proc/self/loginuid) to `uid` if it is unset. A
/// set one cannot be changed without CAP_AUDIT_CONTROL in the initial namespace (EPERM: left
/// as it is); a kernel without audit has no such file.
pub fn set_loginuid_if_unset(uid: u32) -> Result<(), Errno> {
    use std::os::fd::AsRawFd;
    let fd = match nix::fcntl::open(
        c"/proc/self/loginuid",
        nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::ENOENT) | Err(Errno::EROFS) => return Ok(()),
        Err(e) => return Err(e),
    };
    let current = std::fs::read_to_string("/proc/self/loginuid").unwrap_or_default();
    if current.trim() != "4294967295" {
        return Ok(());
    }
    // EPERM: already set (by the kernel's rules, for the role too). EROFS: /proc is read-only
    // here (the canary's columns without a private /proc), for the role as well.
    match write_all(fd.as_raw_fd(), uid.to_string().as_bytes()) {
        Ok(()) | Err(Errno::EPERM) | Err(Errno::EROFS) => Ok(()),
        Err(e) => Err(e),
    }
}

/// A random 64-bit value from the kernel (getrandom(2)), for names nobody can predict.
pub fn random_u64() -> Result<u64, Errno> {
    let mut b = [0u8; 8];
    // SAFETY: getrandom writes at most b.len() bytes into the buffer we own.
    let n = Errno::result(unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) })?;
    if n as usize != b.len() {
        return Err(Errno::EIO);
    }
    Ok(u64::from_ne_bytes(b))
}

/// Install `prog` on the calling thread as seccomp(2) does with SECCOMP_FILTER_FLAG_NEW_LISTENER
/// (no_new_privs set first): returns the filter's user-notification fd (O_CLOEXEC), through
/// which the syscalls it answers SECCOMP_RET_USER_NOTIF for are handed to whoever holds it.
pub fn seccomp_with_listener(prog: &[seccompiler::sock_filter]) -> Result<RawFd, Errno> {
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1)?;
    let len = u16::try_from(prog.len()).map_err(|_| Errno::E2BIG)?;
    let fprog = libc::sock_fprog { len, filter: prog.as_ptr() as *mut libc::sock_filter };
    // SAFETY: `fprog` points to `prog`, alive for the call; seccompiler's sock_filter has the
    // kernel's layout (code u16, jt u8, jf u8, k u32), as libc's does.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER as libc::c_ulong,
            // Once sealnode has received a notification, only a fatal signal interrupts the
            // waiting task (a handled signal would turn the policy's errno into EINTR).
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER | libc::SECCOMP_FILTER_FLAG_WAIT_KILLABLE_RECV,
            &fprog as *const libc::sock_fprog,
        )
    };
    Errno::result(r).map(|fd| fd as RawFd)
}

/// A pidfd for `pid` (pidfd_open(2)).
pub fn pidfd_open(pid: libc::pid_t) -> Result<OwnedFd, Errno> {
    // SAFETY: integer arguments only.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    // SAFETY: on success the kernel returned a new fd we now own.
    Errno::result(r).map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) })
}

/// A copy of fd `target` of the process behind `pidfd` (pidfd_getfd(2); needs ptrace access
/// to it), close-on-exec.
pub fn pidfd_getfd(pidfd: &OwnedFd, target: RawFd) -> Result<OwnedFd, Errno> {
    use std::os::fd::AsRawFd;
    // SAFETY: integer arguments only.
    let r = unsafe { libc::syscall(libc::SYS_pidfd_getfd, pidfd.as_raw_fd(), target, 0) };
    // SAFETY: on success the kernel returned a new fd we now own.
    Errno::result(r).map(|fd| unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd as RawFd) })
}

/// The next pending notification on a seccomp listener (SECCOMP_IOCTL_NOTIF_RECV). Only called
/// when epoll says one is pending; a notification whose task died meanwhile gives ENOENT.
pub fn seccomp_notif_recv(listener: RawFd) -> Result<libc::seccomp_notif, Errno> {
    // SAFETY: seccomp_notif is plain integers; the kernel requires it zeroed before the call.
    let mut n: libc::seccomp_notif = unsafe { std::mem::zeroed() };
    // SAFETY: `n` is a valid, writable seccomp_notif for the ioctl to fill.
    let r = unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_RECV, &mut n as *mut libc::seccomp_notif) };
    Errno::result(r).map(|_| n)
}

/// Answer notification `id`: the syscall fails with `errno` in the task (nothing runs).
pub fn seccomp_notif_fail(listener: RawFd, id: u64, errno: i32) -> Result<(), Errno> {
    let resp = libc::seccomp_notif_resp { id, val: 0, error: -errno, flags: 0 };
    // SAFETY: `resp` is a valid seccomp_notif_resp the ioctl reads.
    let r = unsafe { libc::ioctl(listener, libc::SECCOMP_IOCTL_NOTIF_SEND, &resp as *const libc::seccomp_notif_resp) };
    Errno::result(r).map(drop)
}

/// What a file's type is, in words ("a FIFO").
/// Whether the open file `fd` carries a POSIX access ACL (beyond its mode bits). A filesystem
/// without extended attributes has none.
pub fn has_access_acl(fd: BorrowedFd) -> Result<bool, Errno> {
    // SAFETY: a NULL buffer of size 0 only asks for the value's size; the name is a valid
    // NUL-terminated string.
    let n = unsafe { libc::fgetxattr(fd.as_raw_fd(), c"system.posix_acl_access".as_ptr(), std::ptr::null_mut(), 0) };
    match n {
        n if n >= 0 => Ok(true),
        _ => match Errno::last() {
            Errno::ENODATA | Errno::EOPNOTSUPP => Ok(false),
            e => Err(e),
        },
    }
}

pub fn file_kind(mode: u32) -> &'static str {
    match mode & libc::S_IFMT {
        libc::S_IFREG => "a regular file",
        libc::S_IFDIR => "a directory",
        libc::S_IFIFO => "a FIFO",
        libc::S_IFSOCK => "a unix socket",
        libc::S_IFCHR => "a character device",
        libc::S_IFBLK => "a block device",
        libc::S_IFLNK => "a symlink",
        _ => "not a file",
    }
}

/// A process's state letter as /proc/PID/stat shows it (R, S, D, T, t, Z...); none once it
/// is gone. The name before it is in parentheses and may hold anything, so the letter is read
/// after the last ')'.
pub fn process_state(pid: nix::unistd::Pid) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.chars().next()
}

/// What [`descendants`] found under a process: `pids`, and whether that is all of them.
#[derive(Debug, Default)]
pub struct Under {
    pub pids: Vec<nix::unistd::Pid>,
    /// False when the walk stopped at its budget with more to read.
    pub whole: bool,
}

/// Every process under `pid`, its children's children too, forked from any of their threads
/// (each thread's /proc/PID/task/TID/children), breadth first, spending one of `reads` per
/// read of /proc (each task list and each thread's children file: a role's thousands of
/// threads cost as much as its processes, found by review) and one per process found (what
/// the caller reads of it next); `whole` false once they run out. Read once each: a process
/// forked or gone meanwhile may be missed or listed gone.
pub fn descendants(pid: nix::unistd::Pid, reads: &mut usize) -> Under {
    let mut under = Under::default();
    let mut seen = std::collections::HashSet::new();
    let mut queue = std::collections::VecDeque::from([pid]);
    let spend = |reads: &mut usize| reads.checked_sub(1).map(|left| *reads = left).is_some();
    while let Some(p) = queue.pop_front() {
        if !spend(reads) {
            return under;
        }
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else { continue };
        for task in tasks.flatten() {
            if !spend(reads) {
                return under;
            }
            let kids = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            for kid in kids.split_whitespace().filter_map(|k| k.parse().ok()).map(nix::unistd::Pid::from_raw) {
                if seen.insert(kid) {
                    if !spend(reads) {
                        return under;
                    }
                    under.pids.push(kid);
                    queue.push_back(kid);
                }
            }
        }
    }
    under.whole = true;
    under
}

/// Whether some thread of `pid` is stopped or traced: its own state letter (its main
/// thread's), or, where that thread is gone (`Z`) and others live on, each one's (found by
/// review: a process that ended its main thread and stopped the rest read `Z`), one of
/// `reads` spent per thread.
pub fn held_letter(pid: nix::unistd::Pid, reads: &mut usize) -> Held {
    let held = |c: char| matches!(c, 'T' | 't').then_some(c);
    match process_state(pid) {
        Some('Z') => {}
        other => return other.and_then(held).map_or(Held::No, Held::Yes),
    }
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return Held::No };
    for task in tasks.flatten() {
        let Some(left) = reads.checked_sub(1) else { return Held::OutOfReads };
        *reads = left;
        let stat = std::fs::read_to_string(task.path().join("stat")).unwrap_or_default();
        if let Some(c) = stat.rsplit_once(") ").and_then(|(_, r)| r.chars().next()).and_then(held) {
            return Held::Yes(c);
        }
    }
    Held::No
}

/// What [`held_letter`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Held {
    /// A thread held: its state letter (`T` stopped, `t` traced).
    Yes(char),
    /// None held, or the process is gone.
    No,
    /// The reads ran out before every thread was read.
    OutOfReads,
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::ffi::CString;
    use std::os::fd::{FromRawFd, OwnedFd};
    use std::os::unix::fs::MetadataExt;

    fn ino(fd: std::os::fd::RawFd) -> (u64, u64) {
        // SAFETY: the test owns fd.
        let f = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let m = f.metadata().expect("fstat");
        (m.dev(), m.ino())
    }

    /// The walk is what RESOLVE_NO_SYMLINKS is, for the paths sealnode opens: the same file,
    /// and ELOOP for a symlink anywhere in the path, the last component included.
    #[test]
    fn the_walk_refuses_symlinks_like_openat2() {
        let d = tempfile::tempdir().expect("tmp");
        std::fs::create_dir(d.path().join("a")).expect("mkdir");
        std::fs::write(d.path().join("a/f"), "x").expect("write");
        std::os::unix::fs::symlink(d.path().join("a"), d.path().join("l")).expect("link");
        std::os::unix::fs::symlink("f", d.path().join("a/lf")).expect("link");
        let c = |p: &str| CString::new(format!("{}/{p}", d.path().display())).expect("c");
        for p in ["a/f", "a", "./a//f", "a/./f"] {
            let walked = super::walk_no_symlinks(&c(p)).expect(p);
            let opened = super::open_path_no_symlinks_c(&c(p)).expect(p);
            assert_eq!(ino(walked), ino(opened), "{p}");
        }
        // The kernel's own rules: a trailing slash wants a directory, an empty path is nothing.
        for p in ["a/f/", "a/f/."] {
            assert_eq!(super::walk_no_symlinks(&c(p)), Err(nix::errno::Errno::ENOTDIR), "{p}");
            assert_eq!(super::open_path_no_symlinks_c(&c(p)), Err(nix::errno::Errno::ENOTDIR), "{p}");
        }
        assert!(super::walk_no_symlinks(&c("a/")).is_ok());
        assert_eq!(super::walk_no_symlinks(c""), Err(nix::errno::Errno::ENOENT));
        let long = CString::new(format!("/{}", "x/".repeat(2100))).expect("c");
        assert_eq!(super::walk_no_symlinks(&long), Err(nix::errno::Errno::ENAMETOOLONG));
        for p in ["l/f", "l", "a/lf"] {
            assert_eq!(super::walk_no_symlinks(&c(p)), Err(nix::errno::Errno::ELOOP), "{p}");
            assert_eq!(super::open_path_no_symlinks_c(&c(p)), Err(nix::errno::Errno::ELOOP), "{p}");
        }
        assert_eq!(super::walk_no_symlinks(&c("a/none")), Err(nix::errno::Errno::ENOENT));
        // A magic link (/proc/self/root) is a symlink too.
        assert_eq!(super::walk_no_symlinks(c"/proc/self/root/etc"), Err(nix::errno::Errno::ELOOP));
    }

    /// The walk in a root is what openat2 RESOLVE_IN_ROOT|RESOLVE_NO_SYMLINKS finds: the same
    /// file, ELOOP at any symlink (absolute, relative, last), and `..` refused where openat2
    /// would clamp it at the root (sealnode's setup never names one).
    #[test]
    fn the_walk_in_a_root_refuses_symlinks_and_dotdot() {
        let d = tempfile::tempdir().expect("tmp");
        std::fs::create_dir_all(d.path().join("a/b")).expect("mkdir");
        std::fs::write(d.path().join("a/b/f"), "x").expect("write");
        std::os::unix::fs::symlink("/a", d.path().join("abs")).expect("link");
        std::os::unix::fs::symlink("a/b", d.path().join("rel")).expect("link");
        std::os::unix::fs::symlink("f", d.path().join("a/b/lf")).expect("link");
        let root = std::fs::File::open(d.path()).expect("root");
        use std::os::fd::AsRawFd;
        let in_root = |p: &std::ffi::CStr| {
            let r = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
            super::openat2(root.as_raw_fd(), p, (libc::O_PATH | libc::O_CLOEXEC) as u64, r)
        };
        for p in [c"a/b/f", c"a", c"a//b/./f", c"/a/b"] {
            let walked = super::walk_no_symlinks_at(&root, p).expect("walk");
            assert_eq!(ino(walked), ino(in_root(p).expect("openat2")), "{p:?}");
        }
        for p in [c"abs/b", c"rel/f", c"a/b/lf", c"abs"] {
            assert_eq!(super::walk_no_symlinks_at(&root, p), Err(nix::errno::Errno::ELOOP), "{p:?}");
            assert_eq!(in_root(p), Err(nix::errno::Errno::ELOOP), "{p:?}");
        }
        assert_eq!(super::walk_no_symlinks_at(&root, c"a/../a"), Err(nix::errno::Errno::EXDEV));
        assert_eq!(super::walk_no_symlinks_at(&root, c"a/none"), Err(nix::errno::Errno::ENOENT));
    }

    /// A process under a child is found, as is one forked from a thread other than the main
    /// one (this test runs on a thread of the harness), and the count is bounded.
    #[test]
    fn descendants_walks_every_thread_and_generation() {
        use std::io::BufRead;
        let mut sh = std::process::Command::new("/bin/sh")
            .args(["-c", "sleep 30 & echo $!; wait"])
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        let mut line = String::new();
        std::io::BufReader::new(sh.stdout.take().expect("stdout")).read_line(&mut line).expect("pid");
        let grandchild = nix::unistd::Pid::from_raw(line.trim().parse().expect("a pid"));
        let child = nix::unistd::Pid::from_raw(sh.id() as i32);
        let found = super::descendants(nix::unistd::Pid::this(), &mut 4096);
        // Two reads: this process's task list and one thread's children, no more.
        let capped = super::descendants(nix::unistd::Pid::this(), &mut 2);
        let _ = nix::sys::signal::kill(grandchild, nix::sys::signal::Signal::SIGKILL);
        let _ = sh.kill();
        let _ = sh.wait();
        assert!(found.whole, "{found:?}");
        assert!(found.pids.contains(&child) && found.pids.contains(&grandchild), "{found:?}: {child} {grandchild}");
        assert!(!capped.whole && !capped.pids.contains(&grandchild), "{capped:?}");
    }
}
