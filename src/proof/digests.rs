//! sha256 digests of the engine's model files, for the attestation's subjects: each file is
//! hashed once per (device, inode, size, mtime, ctime) and the digest kept in the state dir,
//! so a start re-reads only what changed (a multi-GB model costs seconds once, then a stat;
//! docs/performance.md). ctime is in the key too: an owner can set mtime back with `touch`,
//! nobody can set ctime.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

pub const CACHE_FILE: &str = "model-digests.json";
const CACHE_VERSION: u32 = 1;
/// More files than this in a model dir is a config mistake (a home dir, a whole disk).
pub const MAX_FILES: usize = 100_000;
/// The model files' subject names together may take at most this many bytes: they go into
/// every statement and the measurement's answer. The walk refuses a dir beyond it, for `check`
/// and `run` alike (unit test: digests::tests::names_beyond_their_budget_are_refused).
pub const MAX_NAME_BYTES: usize = 8 << 20;
/// How much is hashed between two looks at `stop`.
const STOP_EVERY: u64 = 64 << 20;

#[derive(Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Cache {
    version: u32,
    /// Absolute host path -> what it was when hashed.
    files: BTreeMap<String, Entry>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Entry {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
    ctime_ns: i128,
    sha256: String,
}

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Stats {
    pub files: usize,
    pub hashed: usize,
    pub hashed_bytes: u64,
    pub cached: usize,
    /// Symlinks and other non-regular entries, left out.
    pub skipped: usize,
}

fn key(md: &std::fs::Metadata, sha256: String) -> Entry {
    Entry {
        dev: md.dev(),
        ino: md.ino(),
        size: md.size(),
        mtime_ns: i128::from(md.mtime()) * 1_000_000_000 + i128::from(md.mtime_nsec()),
        ctime_ns: i128::from(md.ctime()) * 1_000_000_000 + i128::from(md.ctime_nsec()),
        sha256,
    }
}

/// Deepest directory nesting walked (a model dir is shallow; a loop of bind mounts is not).
const MAX_DEPTH: usize = 64;

/// Every regular file under `dir`, opened relative to its parent's descriptor with no symlink
/// followed at any level: a directory swapped for a symlink after the listing is skipped, so
/// the supervisor never hashes a file outside the dir (unit test:
/// digests::tests::a_dir_swapped_for_a_symlink_during_the_walk_is_not_followed). Each comes
/// with its path under `dir`; `visit` is called in no particular order.
fn walk(
    dir: &OwnedFd,
    rel: &Path,
    depth: usize,
    stats: &mut Stats,
    count: &mut usize,
    visit: &mut dyn FnMut(&Path, std::fs::File, &mut Stats) -> Result<()>,
) -> Result<()> {
    use nix::fcntl::{openat, OFlag};
    if depth > MAX_DEPTH {
        return Err(Error::io(
            format!("{}: nested more than {MAX_DEPTH} deep", rel.display()),
            std::io::Error::other("not a model dir"),
        ));
    }
    let listing = nix::dir::Dir::openat(
        dir,
        ".",
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| Error::errno(format!("list {}", rel.display()), e))?;
    let mut names = Vec::new();
    for e in listing {
        let e = e.map_err(|e| Error::errno(format!("list {}", rel.display()), e))?;
        let name = e.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(std::ffi::OsStr::from_bytes(name).to_os_string());
        }
    }
    for name in names {
        let here = rel.join(&name);
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let fd = match openat(dir, name.as_os_str(), flags, nix::sys::stat::Mode::empty()) {
            Ok(fd) => fd,
            // A symlink (O_NOFOLLOW): left out, as everything but files and dirs is.
            Err(nix::errno::Errno::ELOOP) => {
                stats.skipped += 1;
                continue;
            }
            Err(e) => return Err(Error::errno(format!("open {}", here.display()), e)),
        };
        let f = std::fs::File::from(fd);
        let md = f.metadata().map_err(|e| Error::io(format!("stat {}", here.display()), e))?;
        if md.is_dir() {
            walk(&OwnedFd::from(f), &here, depth + 1, stats, count, visit)?;
        } else if md.is_file() {
            *count += 1;
            if *count > MAX_FILES {
                return Err(Error::io(
                    format!("more than {MAX_FILES} files"),
                    std::io::Error::other("not a model dir"),
                ));
            }
            visit(&here, f, stats)?;
        } else {
            stats.skipped += 1;
        }
    }
    Ok(())
}

/// Hash an open file, looking at `stop` every [`STOP_EVERY`] bytes.
fn hash(f: &mut std::fs::File, shown: &Path, stop: &dyn Fn() -> bool) -> Result<(String, u64)> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let (mut total, mut since) = (0u64, 0u64);
    loop {
        let n = std::io::Read::read(f, &mut buf).map_err(|e| Error::io(format!("read {}", shown.display()), e))?;
        if n == 0 {
            return Ok((hex::encode(h.finalize()), total));
        }
        h.update(&buf[..n]);
        total += n as u64;
        since += n as u64;
        if since >= STOP_EVERY {
            since = 0;
            if stop() {
                return Err(Error::Stopped { what: format!("hashing {}", shown.display()) });
            }
        }
    }
}

/// The digests of the model files under `dir`, as `(model:<path under dir>, sha256)`, with
/// the cache in `state` (the state dir's descriptor; `shown` names it). A file changed while it
/// was hashed is hashed again on the next pass (its key no longer matches).
pub fn models(
    dir: &Path,
    state: &OwnedFd,
    shown: &Path,
    stop: &dyn Fn() -> bool,
) -> Result<(Vec<(String, String)>, Stats)> {
    models_with(dir, Some(state), true, shown, stop)
}

/// [`models`] with the cache optional (`state` None: none) and, with `keep` false, only read:
/// `sealnode check` hashes what `run` would, writing nothing.
pub fn models_with(
    dir: &Path,
    state: Option<&OwnedFd>,
    keep: bool,
    shown: &Path,
    stop: &dyn Fn() -> bool,
) -> Result<(Vec<(String, String)>, Stats)> {
    let mut stats = Stats::default();
    let old: Cache = state.and_then(read_cache).unwrap_or_default();
    let mut new = Cache { version: CACHE_VERSION, files: BTreeMap::new() };
    let mut out = Vec::new();
    let root = nix::fcntl::open(
        dir,
        nix::fcntl::OFlag::O_RDONLY
            | nix::fcntl::OFlag::O_DIRECTORY
            | nix::fcntl::OFlag::O_NOFOLLOW
            | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| Error::errno(format!("open {}", dir.display()), e))?;
    let mut count = 0;
    let mut name_bytes = 0;
    walk(&root, Path::new(""), 0, &mut stats, &mut count, &mut |rel, mut f, stats| {
        let subject = subject_name(rel);
        name_bytes += subject.len();
        if name_bytes > MAX_NAME_BYTES {
            return Err(Error::io(
                format!("the model files' names come to more than {} MiB", MAX_NAME_BYTES >> 20),
                std::io::Error::other("not a model dir"),
            ));
        }
        let path = dir.join(rel);
        let md = f.metadata().map_err(|e| Error::io(format!("stat {}", path.display()), e))?;
        let name = path.display().to_string();
        let cached = old.files.get(&name).filter(|e| **e == key(&md, e.sha256.clone())).cloned();
        let entry = match cached {
            Some(e) => {
                stats.cached += 1;
                e
            }
            None => {
                let (digest, bytes) = hash(&mut f, &path, stop)?;
                stats.hashed += 1;
                stats.hashed_bytes += bytes;
                key(&md, digest)
            }
        };
        stats.files += 1;
        out.push((subject, entry.sha256.clone()));
        new.files.insert(name, entry);
        Ok(())
    })?;
    out.sort();
    let write = state.filter(|_| keep && (stats.hashed > 0 || new.files.len() != old.files.len()));
    if let Some(state) = write {
        let mut bytes =
            serde_json::to_vec_pretty(&new).map_err(|e| Error::io("model digests", std::io::Error::other(e)))?;
        bytes.push(b'\n');
        crate::os::atomic::write_atomic_at(state, CACHE_FILE, &bytes, 0o640, &shown.join(CACHE_FILE))?;
    }
    Ok((out, stats))
}

/// A model file's subject name: `model:` and its path under the model dir. A path that is not
/// UTF-8 is named by its bytes in hex instead (`model-hex:...`), so no two files share a name
/// (a lossy conversion could give them one; unit test:
/// digests::tests::files_are_hashed_once_then_again_when_they_change).
fn subject_name(rel: &Path) -> String {
    match rel.to_str() {
        Some(s) => format!("model:{s}"),
        None => format!("model-hex:{}", hex::encode(rel.as_os_str().as_bytes())),
    }
}

fn read_cache(state: &OwnedFd) -> Option<Cache> {
    use nix::fcntl::{openat, OFlag};
    let fd = openat(
        state,
        CACHE_FILE,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    let mut b = Vec::new();
    std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut b).ok()?;
    let c: Cache = serde_json::from_slice(&b).ok()?;
    (c.version == CACHE_VERSION).then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Long names of many files: refused by the walk, before any cache is written.
    #[test]
    fn names_beyond_their_budget_are_refused() {
        let t = tempfile::tempdir().expect("tmp");
        let models = t.path().join("models");
        let mut deep = models.clone();
        for i in 0..8 {
            deep.push(format!("{i}{}", "d".repeat(249)));
        }
        std::fs::create_dir_all(&deep).expect("mkdir");
        let per = "model:".len() + deep.strip_prefix(&models).expect("under").as_os_str().len() + 6;
        for i in 0..MAX_NAME_BYTES / per + 1 {
            std::fs::write(deep.join(format!("{i:05}")), b"").expect("write");
        }
        let state: OwnedFd = std::fs::File::open(t.path()).expect("open").into();
        let e = models_with(&models, Some(&state), true, t.path(), &|| false).expect_err("over the budget");
        assert!(e.to_string().contains("names come to more than 8 MiB"), "{e}");
        assert!(!t.path().join(CACHE_FILE).exists(), "a cache written for a refused dir");
    }

    #[test]
    fn files_are_hashed_once_then_again_when_they_change() {
        let t = tempfile::tempdir().expect("tmp");
        let models = t.path().join("models");
        std::fs::create_dir_all(models.join("sub")).expect("mkdir");
        std::fs::write(models.join("a.gguf"), b"hello").expect("write");
        std::fs::write(models.join("sub/b.bin"), b"world").expect("write");
        std::os::unix::fs::symlink("/etc/passwd", models.join("link")).expect("symlink");
        std::os::unix::fs::symlink("/etc", models.join("dirlink")).expect("symlink");
        let state_path = t.path().join("state");
        std::fs::create_dir(&state_path).expect("mkdir");
        let state: OwnedFd = std::fs::File::open(&state_path).expect("open").into();
        let never = || false;
        let (d, s) = models_of(&models, &state, &state_path, &never);
        assert_eq!(d[0], ("model:a.gguf".into(), hex::encode(Sha256::digest(b"hello"))));
        assert_eq!(d[1].0, "model:sub/b.bin");
        assert_eq!((s.files, s.hashed, s.cached, s.skipped), (2, 2, 0, 2));
        let (_, s) = models_of(&models, &state, &state_path, &never);
        assert_eq!((s.hashed, s.cached), (0, 2), "the second pass reads nothing");
        // Same size, content changed, mtime set back: ctime still tells.
        let md = std::fs::metadata(models.join("a.gguf")).expect("md");
        std::fs::write(models.join("a.gguf"), b"HELLO").expect("write");
        let times = [
            nix::sys::time::TimeSpec::new(md.atime(), md.atime_nsec()),
            nix::sys::time::TimeSpec::new(md.mtime(), md.mtime_nsec()),
        ];
        nix::sys::stat::utimensat(
            nix::fcntl::AT_FDCWD,
            &models.join("a.gguf"),
            &times[0],
            &times[1],
            nix::sys::stat::UtimensatFlags::NoFollowSymlink,
        )
        .expect("utimensat");
        let (d, s) = models_of(&models, &state, &state_path, &never);
        assert_eq!((s.hashed, s.cached), (1, 1));
        assert_eq!(d[0].1, hex::encode(Sha256::digest(b"HELLO")));
        // Two names a lossy conversion would make one: two subjects.
        use std::os::unix::ffi::OsStrExt;
        std::fs::write(models.join(std::ffi::OsStr::from_bytes(b"m\xff.gguf")), b"1").expect("write");
        std::fs::write(models.join("m\u{fffd}.gguf"), b"2").expect("write");
        let (d, _) = models_of(&models, &state, &state_path, &never);
        let names: std::collections::BTreeSet<&str> = d.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names.len(), d.len(), "{d:?}");
        assert!(names.contains("model-hex:6dff2e67677566"), "{d:?}");
    }

    /// A dir swapped for a symlink after its parent was listed is skipped, not walked: each
    /// entry is opened relative to its parent's descriptor, never following a symlink.
    #[test]
    fn a_dir_swapped_for_a_symlink_during_the_walk_is_not_followed() {
        let t = tempfile::tempdir().expect("tmp");
        let models = t.path().join("models");
        for (dir, file) in [("x", "a"), ("y", "b"), ("secret", "key")] {
            let d = if dir == "secret" { t.path().join(dir) } else { models.join(dir) };
            std::fs::create_dir_all(&d).expect("mkdir");
            std::fs::write(d.join(file), b"x").expect("write");
        }
        let root: OwnedFd = std::fs::File::open(&models).expect("open").into();
        let (mut stats, mut count, mut seen) = (Stats::default(), 0, Vec::new());
        walk(&root, Path::new(""), 0, &mut stats, &mut count, &mut |rel, _, _| {
            if seen.is_empty() {
                // The other dir, listed but not opened yet, becomes a symlink to the secret.
                let other = if rel.starts_with("x") { "y" } else { "x" };
                std::fs::rename(models.join(other), t.path().join("moved")).expect("rename");
                std::os::unix::fs::symlink(t.path().join("secret"), models.join(other)).expect("symlink");
            }
            seen.push(rel.to_path_buf());
            Ok(())
        })
        .expect("walk");
        assert_eq!(seen.len(), 1, "the swapped dir was walked: {seen:?}");
        assert_eq!(stats.skipped, 1, "the symlink is skipped");
    }

    fn models_of(m: &Path, s: &OwnedFd, p: &Path, stop: &dyn Fn() -> bool) -> (Vec<(String, String)>, Stats) {
        models(m, s, p, stop).expect("digests")
    }
}
