//! Mount steps the child performs to build the private root, and the pivot into it.

use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{fstat, Mode};
use nix::sys::statfs::{PROC_SUPER_MAGIC, TMPFS_MAGIC};
use nix::unistd::{chdir, mkdir};

use super::plan::{Check, Mount, NEWROOT};
use crate::os::sys::{self, MOUNT_ATTR_NODEV, MOUNT_ATTR_NOEXEC, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY};

type R = Result<(), Errno>;

fn ms_flags(attrs: u64) -> MsFlags {
    let mut f = MsFlags::empty();
    for (a, m) in [
        (MOUNT_ATTR_RDONLY, MsFlags::MS_RDONLY),
        (MOUNT_ATTR_NOSUID, MsFlags::MS_NOSUID),
        (MOUNT_ATTR_NODEV, MsFlags::MS_NODEV),
        (MOUNT_ATTR_NOEXEC, MsFlags::MS_NOEXEC),
    ] {
        if attrs & a != 0 {
            f |= m;
        }
    }
    f
}

fn as_path(c: &CStr) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(c.to_bytes()))
}

fn bind_fd(fd: &OwnedFd, dst: &CStr) -> R {
    use std::os::fd::AsRawFd;
    let src = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|_| Errno::EINVAL)?;
    mount(Some(src.as_c_str()), dst, None::<&str>, MsFlags::MS_BIND | MsFlags::MS_REC, None::<&str>)
}

/// Open (O_PATH) and verify the source of every bind before anything is mounted: the new
/// root's tmpfs may cover the host path (e.g. a scratch dir under /tmp).
pub fn open_source(m: &Mount) -> Result<Option<OwnedFd>, Errno> {
    let Mount::Bind { src, check, nofollow, .. } = m else {
        return Ok(None);
    };
    let raw = if *nofollow { sys::open_path_no_symlinks_c(src)? } else { sys::open_path_c(src)? };
    let fd = owned(raw);
    match *check {
        Check::None => {}
        Check::Identity(dev, ino) => {
            let st = fstat(&fd)?;
            if st.st_dev != dev || st.st_ino != ino {
                // Swapped between the parent's validation and now: refuse.
                return Err(Errno::ESTALE);
            }
        }
        Check::Tmpfs(bytes) => {
            // The cell's capped scratch, not the host dir under it (nor anything else).
            let fs = nix::sys::statfs::fstatfs(&fd)?;
            let size = fs.blocks() * fs.block_size() as u64;
            if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC || size != bytes {
                return Err(Errno::ESTALE);
            }
        }
    }
    Ok(Some(fd))
}

/// A destination inside the new root, found with no symlink on its way ([`resolve_in`]):
/// `path` names the very inode that was found (its fd's magic link), so mount(2) lands there
/// and not wherever a second walk of the path would lead; the read-backs use the fd itself.
struct At {
    fd: OwnedFd,
    path: CString,
}

impl At {
    fn new(fd: OwnedFd) -> Result<At, Errno> {
        use std::os::fd::AsRawFd;
        let path = CString::new(format!("/proc/self/fd/{}", fd.as_raw_fd())).map_err(|_| Errno::EINVAL)?;
        Ok(At { fd, path })
    }

    fn fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// `rel` in the new root `root`, with no symlink on its way, the last component included
/// (ELOOP): openat2 RESOLVE_IN_ROOT|RESOLVE_NO_SYMLINKS, or the same walk one component at a
/// time where openat2 is refused (ENOSYS: systemd's RestrictSUIDSGID=). A symlink in a bound
/// host directory can neither lead a destination out of the new root nor over another path of
/// the view (/usr/bin, /run/sealnode: found by review); sealnode's own links (`/lib ->
/// usr/lib`) are followed when the plan is made (`sandbox::plan`).
fn resolve_in(root: &OwnedFd, rel: &Path) -> Result<OwnedFd, Errno> {
    use std::os::fd::AsRawFd;
    let c = CString::new(rel.as_os_str().as_bytes()).map_err(|_| Errno::EINVAL)?;
    if rel.as_os_str().is_empty() {
        return nix::fcntl::openat(root, c".", OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty());
    }
    let flags = (libc::O_PATH | libc::O_CLOEXEC) as u64;
    let resolve = libc::RESOLVE_IN_ROOT | libc::RESOLVE_NO_SYMLINKS | libc::RESOLVE_NO_MAGICLINKS;
    match sys::openat2(root.as_raw_fd(), &c, flags, resolve) {
        Ok(fd) => Ok(owned(fd)),
        Err(Errno::ENOSYS) => sys::walk_no_symlinks_at(root, &c).map(owned),
        Err(e) => Err(e),
    }
}

/// The directory `rel` in `root`, made (mode 0755) with its parents where missing: the deepest
/// part that is there is found ([`resolve_in`]), and each missing component is made under it
/// and opened with O_NOFOLLOW|O_DIRECTORY (a symlink there is refused).
fn mkdir_in(root: &OwnedFd, rel: &Path) -> Result<OwnedFd, Errno> {
    match resolve_in(root, rel) {
        Err(Errno::ENOENT) => {}
        found => return found,
    }
    let name = rel.file_name().ok_or(Errno::EINVAL)?;
    let parent = mkdir_in(root, rel.parent().unwrap_or(Path::new("")))?;
    match nix::sys::stat::mkdirat(&parent, name, Mode::from_bits_truncate(0o755)) {
        Ok(()) | Err(Errno::EEXIST) => {}
        Err(e) => return Err(e),
    }
    let flags = OFlag::O_PATH | OFlag::O_NOFOLLOW | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    nix::fcntl::openat(&parent, name, flags, Mode::empty())
}

/// The new root as this setup builds it: its mount point (NEWROOT in this mount namespace),
/// opened once and again only after a step mounts over it (the root tmpfs itself), and the
/// mounts made and read back so far, by mount id. Opening the root once per step cost a tenth
/// of the setup (docs/performance.md, "Launch").
#[derive(Default)]
pub struct Tree {
    root: Option<OwnedFd>,
    made: Vec<u64>,
}

impl Tree {
    /// The new root and `dst` relative to it.
    fn in_root<'d>(&mut self, dst: &'d CStr) -> Result<(&OwnedFd, &'d Path), Errno> {
        let rel = as_path(dst).strip_prefix(NEWROOT).map_err(|_| Errno::EINVAL)?;
        Ok((self.root()?, rel))
    }

    /// The new root's mount point, opened where it is not yet.
    fn root(&mut self) -> Result<&OwnedFd, Errno> {
        if self.root.is_none() {
            let flags = OFlag::O_PATH | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
            self.root = Some(nix::fcntl::open(NEWROOT, flags, Mode::empty())?);
        }
        self.root.as_ref().ok_or(Errno::EBADF)
    }

    /// `dst` as it is in the new root (ENOENT where it is not).
    fn existing(&mut self, dst: &CStr) -> Result<At, Errno> {
        let (root, rel) = self.in_root(dst)?;
        At::new(resolve_in(root, rel)?)
    }

    /// `dst` in the new root, if it is there: a mask or remount of a path the kernel or the
    /// host lacks is skipped.
    fn if_there(&mut self, dst: &CStr) -> Result<Option<At>, Errno> {
        match self.existing(dst) {
            Ok(at) => Ok(Some(at)),
            Err(Errno::ENOENT) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The parent directory of `dst` in the new root, made where missing ([`mkdir_in`]), and
    /// `dst`'s own name, to make or open under that fd with O_NOFOLLOW.
    fn parent_of<'d>(&mut self, dst: &'d CStr) -> Result<(OwnedFd, &'d std::ffi::OsStr), Errno> {
        let (root, rel) = self.in_root(dst)?;
        let name = rel.file_name().ok_or(Errno::EINVAL)?;
        Ok((mkdir_in(root, rel.parent().unwrap_or(Path::new("")))?, name))
    }

    /// The directory `dst` in the new root, made (mode 0755, with its parents) where missing.
    fn dir_at(&mut self, dst: &CStr) -> Result<At, Errno> {
        let (root, rel) = self.in_root(dst)?;
        At::new(mkdir_in(root, rel)?)
    }

    /// The file `dst` in the new root to bind a file onto: an existing one (in a read-only
    /// system bind, say) as it is, never opened for writing, which a read-only mount refuses
    /// (tests/devices.rs: a_cdi_spec_gives_the_engine_exactly_its_nodes_files_and_environment);
    /// else an empty one, made (never through a symlink: O_NOFOLLOW).
    fn file_at(&mut self, dst: &CStr) -> Result<At, Errno> {
        match self.existing(dst) {
            Err(Errno::ENOENT) => {}
            found => return found,
        }
        let (parent, name) = self.parent_of(dst)?;
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        At::new(nix::fcntl::openat(&parent, name, flags, Mode::from_bits_truncate(0o644))?)
    }

    /// After a mount at `dst`: the role's view there, found again, shows a new mount (read
    /// back as [`sys::mounted`] says) that no earlier step made: a directory of a bound host
    /// tree renamed between the mount and this read-back could otherwise show an earlier bind
    /// here, and its flags would be set on that one (found by review). Returned to set its
    /// flags.
    fn shown(
        &mut self,
        dst: &CStr,
        before: u64,
        fs: Option<nix::sys::statfs::FsType>,
        attrs: u64,
    ) -> Result<At, Errno> {
        // A mount over the new root itself (its tmpfs): the fd held is the directory below.
        if as_path(dst) == Path::new(NEWROOT) {
            self.root = None;
        }
        let now = self.existing(dst)?;
        let id = sys::mounted(now.fd(), before, fs, attrs)?;
        if self.made.contains(&id) {
            return Err(Errno::ESTALE);
        }
        self.made.push(id);
        Ok(now)
    }
}

/// Perform one mount step (paths are absolute, under the new root's mount point; each is
/// resolved inside the new root, [`At`]).
pub fn apply(m: &Mount, src: Option<&OwnedFd>, tree: &mut Tree) -> R {
    match m {
        Mount::Tmpfs { dst, opts, attrs } => {
            let at = tree.dir_at(dst)?;
            let before = sys::mount_id(at.fd())?;
            mount(Some("tmpfs"), at.path.as_c_str(), Some("tmpfs"), ms_flags(*attrs), Some(opts.as_c_str()))?;
            tree.shown(dst, before, Some(TMPFS_MAGIC), *attrs).map(drop)
        }
        // The new root itself (the canary matrix's host tree): nothing can rename around it.
        Mount::Bind { dst, attrs, .. } if as_path(dst) == Path::new(NEWROOT) => {
            let fd = src.ok_or(Errno::EBADF)?;
            let at = tree.dir_at(dst)?;
            let before = sys::mount_id(at.fd())?;
            bind_fd(fd, &at.path)?;
            let now = tree.shown(dst, before, None, 0)?;
            // Only adds restrictions: flags the host locked (nosuid, atime...) stay as they were.
            sys::mount_setattr(now.fd(), *attrs, true)
        }
        Mount::Bind { dst, dir, attrs, .. } => {
            let fd = src.ok_or(Errno::EBADF)?;
            let at = if *dir { tree.dir_at(dst)? } else { tree.file_at(dst)? };
            staged_bind(fd, &at, dst, *dir, *attrs, tree)
        }
        Mount::Symlink { target, dst } => {
            let (parent, name) = tree.parent_of(dst)?;
            nix::unistd::symlinkat(target.as_c_str(), &parent, name)
        }
        Mount::File { dst, contents } => {
            let (parent, name) = tree.parent_of(dst)?;
            let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
            let fd = nix::fcntl::openat(&parent, name, flags, Mode::from_bits_truncate(0o644))?;
            use std::os::fd::AsRawFd;
            sys::write_all(fd.as_raw_fd(), contents)
        }
        Mount::Proc { dst } => {
            let at = tree.dir_at(dst)?;
            let before = sys::mount_id(at.fd())?;
            mount(
                Some("proc"),
                at.path.as_c_str(),
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            )?;
            tree.shown(dst, before, Some(PROC_SUPER_MAGIC), MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)
                .map(drop)
        }
        Mount::MaskFile { dst } => {
            let Some(at) = tree.if_there(dst)? else {
                return Ok(());
            };
            let before = sys::mount_id(at.fd())?;
            mount(Some("/dev/null"), at.path.as_c_str(), None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
            let now = tree.shown(dst, before, None, 0)?;
            sys::mount_setattr(
                now.fd(),
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                false,
            )
        }
        Mount::MaskDir { dst } => {
            let Some(at) = tree.if_there(dst)? else {
                return Ok(());
            };
            let before = sys::mount_id(at.fd())?;
            mount(
                Some("tmpfs"),
                at.path.as_c_str(),
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=4k,nr_inodes=1,mode=0555"),
            )?;
            tree.shown(
                dst,
                before,
                Some(TMPFS_MAGIC),
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            )
            .map(drop)
        }
        Mount::Freeze { dst } => {
            let at = tree.existing(dst)?;
            sys::mount_setattr(at.fd(), MOUNT_ATTR_RDONLY, false)
        }
        Mount::Sysctl { dst, value, optional } => {
            let at = match tree.if_there(dst)? {
                Some(at) => at,
                None if *optional => return Ok(()),
                None => return Err(Errno::ENOENT),
            };
            // Already the value: inside a cell, the cell init set its network namespace's (the
            // role, in a user namespace of its own, may not write them); read, never trusted
            // to be so.
            if sys::sysctl_is(as_path(&at.path), value)? {
                return Ok(());
            }
            sys::write_sysctl(as_path(&at.path), value)
        }
        Mount::SealedProgram { dst, fd, mode } => sealed_program(dst, *fd, *mode, tree),
        Mount::ReadOnly { dst } => {
            let Some(at) = tree.if_there(dst)? else {
                return Ok(());
            };
            let before = sys::mount_id(at.fd())?;
            mount(
                Some(at.path.as_c_str()),
                at.path.as_c_str(),
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )?;
            let now = tree.shown(dst, before, None, 0)?;
            sys::mount_setattr(
                now.fd(),
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
                true,
            )
        }
    }
}

/// Where a bind is made and given its flags before it is moved to its destination: in the new
/// root's own tmpfs, where nothing outside this setup can rename a directory; removed after.
const BIND_STAGE: &CStr = c"/tmp/.sealnode-bind";

/// Bind `src` at `at` (the destination `dst`, found in the new root) with `attrs`: made at
/// [`BIND_STAGE`], its flags set and read back there, then moved (MS_MOVE, flags and all) onto
/// the very inode found, and read back at `dst` as exactly that mount. Found by review: made
/// at its destination and then found again by path, a directory of a bound host tree renamed
/// in between showed another mount there (an earlier bind, a copy of a host submount that came
/// with a recursive bind), whose flags were set instead, and the start was accepted with this
/// bind writable, suid and exec.
fn staged_bind(src: &OwnedFd, at: &At, dst: &CStr, dir: bool, attrs: u64, tree: &mut Tree) -> R {
    if dir {
        mkdir(BIND_STAGE, Mode::from_bits_truncate(0o700))?;
    } else {
        let flags = OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_WRONLY | OFlag::O_CLOEXEC;
        drop(nix::fcntl::open(BIND_STAGE, flags, Mode::from_bits_truncate(0o600))?);
    }
    let before = sys::mount_id(BIND_STAGE)?;
    bind_fd(src, BIND_STAGE)?;
    let id = sys::mounted(BIND_STAGE, before, None, 0)?;
    // Only adds restrictions: flags the host locked (nosuid, atime...) stay as they were.
    sys::mount_setattr(BIND_STAGE, attrs, true)?;
    mount(Some(BIND_STAGE), at.path.as_c_str(), None::<&str>, MsFlags::MS_MOVE, None::<&str>)?;
    // Read back at `dst`: exactly this mount, as its root. Else, the bind still at its stage
    // means the move did not happen (a faked success); anything else, a rename under the setup
    // (found by review: the mount that was at `dst` before is no proof of a faked move, as a
    // renamed sibling directory of a bound tree is on that mount too).
    let now = tree.existing(dst)?;
    match sys::mount_at(now.fd())? {
        (shown, true) if shown == id && !tree.made.contains(&id) => {}
        _ if sys::mount_at(BIND_STAGE).is_ok_and(|staged| staged == (id, true)) => return Err(Errno::EOPNOTSUPP),
        _ => return Err(Errno::ESTALE),
    }
    sys::has_attrs(now.fd(), attrs)?;
    tree.made.push(id);
    use nix::unistd::UnlinkatFlags;
    let stage = if dir { UnlinkatFlags::RemoveDir } else { UnlinkatFlags::NoRemoveDir };
    nix::unistd::unlinkat(nix::fcntl::AT_FDCWD, BIND_STAGE, stage)
}

/// Where the program's copy is staged, in the new root's tmpfs; removed once bound.
const STAGING: &CStr = c"/tmp/.sealnode-program";
const STAGED: &CStr = c"/tmp/.sealnode-program/program";

/// The role's program over `dst`: a tmpfs of its own (sized to the copy) receives the sealed
/// memfd `fd` byte for byte, is made read-only for good (the superblock, not only this mount),
/// and its one file is bound over `dst`, read-only, nosuid, nodev; the tmpfs then leaves the
/// tree (the bind holds it) and the memfd is closed: the sandbox init would otherwise hold a
/// second copy for the role's lifetime.
fn sealed_program(dst: &CStr, fd: std::os::fd::RawFd, mode: u32, tree: &mut Tree) -> R {
    use std::os::fd::BorrowedFd;
    // SAFETY: the plan's memfd, which the child inherited and keeps until this step.
    let src = unsafe { BorrowedFd::borrow_raw(fd) };
    let len = fstat(src)?.st_size as u64;
    mkdir(STAGING, Mode::from_bits_truncate(0o700))?;
    let opts =
        CString::new(format!("size={}k,nr_inodes=4,mode=0700", len.div_ceil(1024) + 4)).map_err(|_| Errno::EINVAL)?;
    let before = sys::mount_id(STAGING)?;
    mount(Some("tmpfs"), STAGING, Some("tmpfs"), MsFlags::MS_NOSUID | MsFlags::MS_NODEV, Some(opts.as_c_str()))?;
    sys::mounted(STAGING, before, Some(TMPFS_MAGIC), MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV)?;
    let out = nix::fcntl::open(
        STAGED,
        nix::fcntl::OFlag::O_CREAT
            | nix::fcntl::OFlag::O_EXCL
            | nix::fcntl::OFlag::O_WRONLY
            | nix::fcntl::OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o500),
    )?;
    let mut off: libc::off_t = 0;
    while (off as u64) < len {
        let left = (len - off as u64) as usize;
        let n = nix::sys::sendfile::sendfile(&out, src, Some(&mut off), left)?;
        if n == 0 {
            return Err(Errno::EIO);
        }
    }
    // The bits the host file grants the role (measured; 0 until then): the copy grants no more.
    nix::sys::stat::fchmod(&out, Mode::from_bits_truncate(mode & 0o555))?;
    drop(out);
    // Read-only at the superblock: no mount of it, present or future, can write the copy.
    mount(
        None::<&str>,
        STAGING,
        None::<&str>,
        MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV,
        None::<&str>,
    )?;
    sys::has_attrs(STAGING, MOUNT_ATTR_RDONLY)?;
    let at = tree.existing(dst)?;
    let before = sys::mount_id(at.fd())?;
    mount(Some(STAGED), at.path.as_c_str(), None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
    let now = tree.shown(dst, before, None, 0)?;
    sys::mount_setattr(now.fd(), MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, false)?;
    umount2(STAGING, MntFlags::MNT_DETACH)?;
    nix::unistd::unlinkat(nix::fcntl::AT_FDCWD, STAGING, nix::unistd::UnlinkatFlags::RemoveDir)?;
    nix::unistd::close(fd)
}

fn owned(raw: std::os::fd::RawFd) -> OwnedFd {
    // SAFETY: `raw` was just returned by a successful open and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// pivot_root into the new root the setup built and read back (the tree's own fd: found by
/// review, entered by its path it could be another tree mounted over that path meanwhile,
/// by host root), detach the host's root, freeze the root tmpfs read-only and enter the
/// role's working directory.
pub fn pivot(mut tree: Tree, workdir: &CStr) -> R {
    nix::unistd::fchdir(tree.root()?)?;
    drop(tree);
    // pivot_root(".", "."): the old root ends up stacked on the new one and is detached below.
    sys::pivot_root(c".", c".")?;
    umount2(".", MntFlags::MNT_DETACH)?;
    sys::one_root_mount()?;
    chdir("/")?;
    sys::mount_setattr(c"/", MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, false)?;
    chdir(workdir)
}

/// Make every mount private so nothing propagates back to the host (read back).
pub fn make_private() -> R {
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)?;
    sys::no_propagation()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A config's bind may not land on a stage of the setup (found by review: `check` passed
    /// dst = /.sealnode-bind, and every start failed).
    #[test]
    fn the_setups_stages_are_reserved_in_the_config() {
        for stage in [BIND_STAGE, STAGING] {
            let inside = Path::new("/").join(as_path(stage).strip_prefix(NEWROOT).expect("under the root"));
            assert!(crate::config::reserved_inside(&inside), "{}", inside.display());
        }
    }
}
