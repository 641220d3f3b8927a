//! Small file primitives every writer of sealnode's own files shares: an atomic replace
//! (readers see the old file or the new one, never a part), and sha256 in hex.

use std::io::Write;
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

/// sha256 of everything `r` yields, read 64 KiB at a time (never the whole file in memory).
pub fn sha256_read(r: &mut impl std::io::Read) -> std::io::Result<String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        match r.read(&mut buf) {
            Ok(0) => return Ok(hex::encode(h.finalize())),
            Ok(n) => h.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// Write `bytes` to `path` atomically (see [`write_atomic_at`]), in the directory `path` names.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use nix::fcntl::OFlag;
    let dir_path = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::io(format!("write {}", path.display()), std::io::Error::other("no file name")))?;
    let dir = nix::fcntl::open(
        dir_path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| Error::io(format!("write {}", path.display()), std::io::Error::from(e)))?;
    write_atomic_at(&dir, name, bytes, mode, path)
}

/// Write `name` in `dir` atomically: a temp file created there (never through a symlink),
/// fsync, rename onto `name`, fsync of the directory. Readers see the old or the new file,
/// never a partial one. `shown` names the file in errors.
pub fn write_atomic_at(dir: &std::os::fd::OwnedFd, name: &str, bytes: &[u8], mode: u32, shown: &Path) -> Result<()> {
    use nix::fcntl::{openat, renameat, OFlag};
    use nix::unistd::{unlinkat, UnlinkatFlags};
    let tmp = format!(".{name}.tmp-{}", std::process::id());
    let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    let res = (|| -> std::io::Result<()> {
        let fd = openat(
            dir,
            tmp.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::from_bits_truncate(mode),
        )?;
        let mut f = std::fs::File::from(fd);
        f.write_all(bytes)?;
        f.sync_all()?;
        renameat(dir, tmp.as_str(), dir, name)?;
        nix::unistd::fsync(dir)?;
        Ok(())
    })();
    res.map_err(|e| {
        let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
        Error::io(format!("write {}", shown.display()), e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    const FILE: &str = "receipt.json";

    /// Atomic: a reader that opened the old receipt keeps reading all of it after a new one is
    /// written, and the path then names a new, complete file. An in-place rewrite (truncate and
    /// write) fails this: the old reader would see the new bytes or none.
    #[test]
    fn write_atomic_replaces_the_file_whole() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(FILE);
        let old = vec![b'o'; 100_000];
        write_atomic(&path, &old, 0o640).expect("first write");
        let mut reader = std::fs::File::open(&path).expect("open old");
        let old_ino = std::fs::metadata(&path).expect("md").ino();
        let new = vec![b'n'; 50_000];
        write_atomic(&path, &new, 0o640).expect("second write");
        let mut seen = Vec::new();
        std::io::Read::read_to_end(&mut reader, &mut seen).expect("read old");
        assert!(seen == old, "the old reader saw {} bytes, not the whole old receipt", seen.len());
        let md = std::fs::metadata(&path).expect("md");
        assert_ne!(md.ino(), old_ino, "rewritten in place");
        assert_eq!(md.mode() & 0o777, 0o640);
        assert_eq!(std::fs::read(&path).expect("read new"), new);
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).expect("dir").filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from(FILE)], "leftovers");
    }

    /// A reader opening the path while receipts are being replaced sees one whole receipt every
    /// time, never an empty or partial file: the temp file is written before it is renamed into
    /// place (an order the test above cannot tell).
    #[test]
    fn readers_never_see_a_partial_receipt() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(FILE);
        let body = |i: usize| vec![b'a' + (i % 26) as u8; 20_000 + (i % 7) * 10_000];
        write_atomic(&path, &body(0), 0o640).expect("first");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p2, s2) = (path.clone(), stop.clone());
        let reader = std::thread::spawn(move || {
            let mut reads = 0usize;
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                let b = std::fs::read(&p2).expect("read");
                let whole = !b.is_empty() && b.iter().all(|c| *c == b[0]) && (b.len() - 20_000) % 10_000 == 0;
                assert!(whole, "a reader saw a partial receipt: {} bytes", b.len());
                reads += 1;
            }
            reads
        });
        for i in 1..300 {
            write_atomic(&path, &body(i), 0o640).expect("write");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let reads = reader.join().expect("reader");
        assert!(reads >= 50, "only {reads} reads raced the writes");
    }

    /// A write that fails (the target is a directory: rename refuses) leaves the old state and
    /// no temp file, and names the path.
    #[test]
    fn a_failed_write_leaves_no_temp_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let target = dir.path().join("receipt.json");
        std::fs::create_dir(&target).expect("dir");
        std::fs::write(target.join("inside"), "x").expect("inside");
        let e = write_atomic(&target, b"new", 0o640).expect_err("rename onto a dir").to_string();
        assert!(e.contains(&target.display().to_string()), "{e}");
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).expect("dir").filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from("receipt.json")], "a temp file was left behind");
        assert!(target.join("inside").exists());
        let _ = std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700));
    }
}
