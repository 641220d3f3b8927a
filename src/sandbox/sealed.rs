//! Sealed in-memory copies: a memfd that, once sealed, nobody can write, grow or shrink, and
//! whose seals cannot change. What sealnode executes from it (a role's program, its own probe)
//! is exactly what was copied and hashed.

use crate::error::{Error, Result};

/// A memfd that can be sealed (close-on-exec).
pub fn memfd(name: &str) -> Result<std::os::fd::OwnedFd> {
    use nix::sys::memfd::{memfd_create, MFdFlags};
    memfd_create(name, MFdFlags::MFD_CLOEXEC | MFdFlags::MFD_ALLOW_SEALING).map_err(|e| Error::errno("memfd_create", e))
}

/// The seals of a sealed copy: no write, grow, shrink, and no further seal changes.
pub const SEALS: i32 = libc::F_SEAL_SEAL | libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_WRITE;

/// Whether `fd` carries every one of [`SEALS`].
pub fn is_sealed(fd: &impl std::os::fd::AsFd) -> bool {
    nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_GET_SEALS).is_ok_and(|s| s & SEALS == SEALS)
}

/// How long a seal waits out pages the kernel holds, on top of the kernel's own ~150 ms.
const SEAL_BUSY_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

/// Seal a memfd for good: no write, grow, shrink, and no further seal changes.
///
/// `F_SEAL_WRITE` answers EBUSY while any page of the file holds an extra reference (the
/// kernel waits ~150 ms for it first). Nothing maps these copies, but on a loaded machine the
/// kernel itself can hold a fresh page longer (migration, compaction): seen once in CI, as a
/// preflight that could not run. The seal is retried with a doubling pause for up to
/// [`SEAL_BUSY_WAIT`], then refused; an unsealed copy is never used.
pub fn seal(fd: &impl std::os::fd::AsFd) -> Result<()> {
    seal_within(fd, SEAL_BUSY_WAIT)
}

fn seal_within(fd: &impl std::os::fd::AsFd, budget: std::time::Duration) -> Result<()> {
    use nix::errno::Errno;
    use nix::fcntl::{fcntl, FcntlArg, SealFlag};
    let seals = SealFlag::from_bits_truncate(SEALS);
    let start = std::time::Instant::now();
    let mut pause = std::time::Duration::from_millis(20);
    loop {
        match fcntl(fd, FcntlArg::F_ADD_SEALS(seals)) {
            Ok(_) => return Ok(()),
            Err(Errno::EBUSY) if start.elapsed() + pause <= budget => {
                tracing::debug!(?pause, "memfd pages still held; retrying the seal");
                std::thread::sleep(pause);
                pause = (pause * 2).min(std::time::Duration::from_millis(500));
            }
            Err(Errno::EBUSY) => {
                return Err(Error::errno(
                    format!("seal memfd (pages still held after {} ms)", start.elapsed().as_millis()),
                    Errno::EBUSY,
                ))
            }
            Err(e) => return Err(Error::errno("seal memfd", e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A writable shared mapping makes `F_SEAL_WRITE` answer EBUSY, as a page the kernel holds
    /// does: the seal waits it out within its budget, and past it refuses, saying why.
    #[test]
    fn a_busy_seal_is_retried_then_refused() {
        use nix::sys::mman::{mmap, munmap, MapFlags, ProtFlags};
        use std::io::Write;
        use std::num::NonZeroUsize;
        let mapped = |name: &str| {
            let fd = memfd(name).expect("memfd");
            let mut f = std::fs::File::from(fd);
            f.write_all(&[7u8; 4096]).expect("fill the memfd");
            let fd: std::os::fd::OwnedFd = f.into();
            let len = NonZeroUsize::new(4096).expect("nonzero");
            // SAFETY: a fresh shared mapping of a file this test owns, at an address the
            // kernel picks; nothing dereferences it, and only munmap below ends it.
            let addr =
                unsafe { mmap(None, len, ProtFlags::PROT_READ | ProtFlags::PROT_WRITE, MapFlags::MAP_SHARED, &fd, 0) }
                    .expect("mmap the memfd");
            (fd, addr.as_ptr() as usize, len)
        };

        let (fd, addr, len) = mapped("busy-then-free");
        let unmapper = std::thread::spawn(move || {
            std::thread::sleep(std::time::Duration::from_millis(200));
            // SAFETY: the mapping made above, unmapped once, and never touched again.
            unsafe { munmap(std::ptr::NonNull::new(addr as *mut libc::c_void).expect("mapped address"), len.get()) }
                .expect("munmap");
        });
        seal_within(&fd, std::time::Duration::from_secs(5)).expect("the seal waits out the mapping");
        unmapper.join().expect("unmapper");
        let seals = nix::fcntl::fcntl(&fd, nix::fcntl::FcntlArg::F_GET_SEALS).expect("F_GET_SEALS");
        assert_ne!(seals & libc::F_SEAL_WRITE, 0, "sealed for write");

        let (fd, addr, len) = mapped("busy-for-good");
        let err = seal_within(&fd, std::time::Duration::from_millis(100)).expect_err("still mapped: refused");
        assert!(err.to_string().contains("pages still held"), "{err}");
        // SAFETY: the second mapping, unmapped once at the end of the test.
        unsafe { munmap(std::ptr::NonNull::new(addr as *mut libc::c_void).expect("mapped address"), len.get()) }
            .expect("munmap");
    }
}
