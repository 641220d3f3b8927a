//! Mount steps the child performs to build the private root, and the pivot into it.

use std::ffi::{CStr, CString};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use nix::errno::Errno;
use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{fstat, lstat, Mode};
use nix::sys::statfs::{PROC_SUPER_MAGIC, TMPFS_MAGIC};
use nix::unistd::{chdir, mkdir};

use super::plan::{Check, Mount};
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

/// mkdir -p (mode 0755); existing directories are fine. Tries the whole path first, so an
/// existing parent costs one call, not one per component.
fn mkdir_p(path: &Path) -> R {
    match mkdir(path, Mode::from_bits_truncate(0o755)) {
        Ok(()) | Err(Errno::EEXIST) => Ok(()),
        Err(Errno::ENOENT) => {
            if let Some(parent) = path.parent() {
                mkdir_p(parent)?;
            }
            match mkdir(path, Mode::from_bits_truncate(0o755)) {
                Ok(()) | Err(Errno::EEXIST) => Ok(()),
                Err(e) => Err(e),
            }
        }
        Err(e) => Err(e),
    }
}

fn as_path(c: &CStr) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(c.to_bytes()))
}

fn parent_of(c: &CStr) -> &Path {
    as_path(c).parent().unwrap_or(Path::new("/"))
}

fn exists(c: &CStr) -> bool {
    lstat(c).is_ok()
}

/// Create an empty file to bind a file onto.
fn touch(path: &CStr) -> R {
    let fd = nix::fcntl::open(
        path,
        nix::fcntl::OFlag::O_CREAT
            | nix::fcntl::OFlag::O_WRONLY
            | nix::fcntl::OFlag::O_CLOEXEC
            | nix::fcntl::OFlag::O_NOFOLLOW,
        Mode::from_bits_truncate(0o644),
    )?;
    drop(fd);
    Ok(())
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

/// Perform one mount step (paths are absolute, under the new root's mount point).
pub fn apply(m: &Mount, src: Option<&OwnedFd>) -> R {
    match m {
        Mount::Tmpfs { dst, opts, attrs } => {
            mkdir_p(as_path(dst))?;
            let before = sys::mount_id(dst)?;
            mount(Some("tmpfs"), dst.as_c_str(), Some("tmpfs"), ms_flags(*attrs), Some(opts.as_c_str()))?;
            sys::mounted(dst, before, Some(TMPFS_MAGIC), *attrs)
        }
        Mount::Bind { dst, dir, attrs, .. } => {
            let fd = src.ok_or(Errno::EBADF)?;
            if *dir {
                mkdir_p(as_path(dst))?;
            } else {
                mkdir_p(parent_of(dst))?;
                // An existing file (in a read-only system bind, say) is the mount point as it is,
                // never opened for writing, which a read-only mount refuses (tests/devices.rs:
                // a_cdi_spec_gives_the_engine_exactly_its_nodes_files_and_environment).
                if nix::sys::stat::lstat(dst.as_c_str()).is_err() {
                    touch(dst)?;
                }
            }
            let before = sys::mount_id(dst)?;
            bind_fd(fd, dst)?;
            sys::mounted(dst, before, None, 0)?;
            // Only adds restrictions: flags the host locked (nosuid, atime...) stay as they were.
            sys::mount_setattr(dst, *attrs, true)
        }
        Mount::Symlink { target, dst } => {
            mkdir_p(parent_of(dst))?;
            nix::unistd::symlinkat(target.as_c_str(), nix::fcntl::AT_FDCWD, dst.as_c_str())
        }
        Mount::File { dst, contents } => {
            mkdir_p(parent_of(dst))?;
            let fd = nix::fcntl::open(
                dst.as_c_str(),
                nix::fcntl::OFlag::O_CREAT
                    | nix::fcntl::OFlag::O_WRONLY
                    | nix::fcntl::OFlag::O_TRUNC
                    | nix::fcntl::OFlag::O_CLOEXEC
                    | nix::fcntl::OFlag::O_NOFOLLOW,
                Mode::from_bits_truncate(0o644),
            )?;
            use std::os::fd::AsRawFd;
            sys::write_all(fd.as_raw_fd(), contents)
        }
        Mount::Proc { dst } => {
            mkdir_p(as_path(dst))?;
            let before = sys::mount_id(dst)?;
            mount(
                Some("proc"),
                dst.as_c_str(),
                Some("proc"),
                MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                None::<&str>,
            )?;
            sys::mounted(dst, before, Some(PROC_SUPER_MAGIC), MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC)
        }
        Mount::MaskFile { dst } => {
            if !exists(dst) {
                return Ok(());
            }
            let before = sys::mount_id(dst)?;
            mount(Some("/dev/null"), dst.as_c_str(), None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
            sys::mounted(dst, before, None, 0)?;
            sys::mount_setattr(dst, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, false)
        }
        Mount::MaskDir { dst } => {
            if !exists(dst) {
                return Ok(());
            }
            let before = sys::mount_id(dst)?;
            mount(
                Some("tmpfs"),
                dst.as_c_str(),
                Some("tmpfs"),
                MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC,
                Some("size=4k,nr_inodes=1,mode=0555"),
            )?;
            sys::mounted(
                dst,
                before,
                Some(TMPFS_MAGIC),
                MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC,
            )
        }
        Mount::Freeze { dst } => sys::mount_setattr(dst, MOUNT_ATTR_RDONLY, false),
        Mount::Sysctl { dst, value, optional } => {
            if *optional && !exists(dst) {
                return Ok(());
            }
            let fd = nix::fcntl::open(
                dst.as_c_str(),
                nix::fcntl::OFlag::O_WRONLY | nix::fcntl::OFlag::O_CLOEXEC,
                Mode::empty(),
            )?;
            use std::os::fd::AsRawFd;
            sys::write_all(fd.as_raw_fd(), value)?;
            drop(fd);
            // Read back: a faked write would leave the namespace's value as it was.
            let shown =
                std::fs::read(as_path(dst)).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
            if shown.trim_ascii() != value.trim_ascii() {
                return Err(Errno::EOPNOTSUPP);
            }
            Ok(())
        }
        Mount::SealedProgram { dst, fd, mode } => sealed_program(dst, *fd, *mode),
        Mount::ReadOnly { dst } => {
            if !exists(dst) {
                return Ok(());
            }
            let before = sys::mount_id(dst)?;
            mount(
                Some(dst.as_c_str()),
                dst.as_c_str(),
                None::<&str>,
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )?;
            sys::mounted(dst, before, None, 0)?;
            sys::mount_setattr(dst, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV | MOUNT_ATTR_NOEXEC, true)
        }
    }
}

/// Where the program's copy is staged, in the new root's tmpfs; removed once bound.
const STAGING: &CStr = c"/tmp/.sealnode-program";
const STAGED: &CStr = c"/tmp/.sealnode-program/program";

/// The role's program over `dst`: a tmpfs of its own (sized to the copy) receives the sealed
/// memfd `fd` byte for byte, is made read-only for good (the superblock, not only this mount),
/// and its one file is bound over `dst`, read-only, nosuid, nodev; the tmpfs then leaves the
/// tree (the bind holds it) and the memfd is closed: the sandbox init would otherwise hold a
/// second copy for the role's lifetime.
fn sealed_program(dst: &CStr, fd: std::os::fd::RawFd, mode: u32) -> R {
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
    let before = sys::mount_id(dst)?;
    mount(Some(STAGED), dst, None::<&str>, MsFlags::MS_BIND, None::<&str>)?;
    sys::mounted(dst, before, None, 0)?;
    sys::mount_setattr(dst, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, false)?;
    umount2(STAGING, MntFlags::MNT_DETACH)?;
    nix::unistd::unlinkat(nix::fcntl::AT_FDCWD, STAGING, nix::unistd::UnlinkatFlags::RemoveDir)?;
    nix::unistd::close(fd)
}

fn owned(raw: std::os::fd::RawFd) -> OwnedFd {
    // SAFETY: `raw` was just returned by a successful open and is owned by nobody else.
    unsafe { OwnedFd::from_raw_fd(raw) }
}

/// pivot_root into `newroot`, detach the host's root, freeze the root tmpfs read-only and
/// enter the role's working directory.
pub fn pivot(newroot: &CStr, workdir: &CStr) -> R {
    chdir(newroot)?;
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
