//! A path as a role will see it: resolved through the plan's mount table, component by
//! component, with every symlink read where the sandbox would read it and followed inside the
//! sandbox's view (never on the host). `run` hashes and seals exactly the file this finds, and
//! mounts that sealed copy at the path this returns, so the digest is of the bytes the role
//! executes whatever the host's own resolution of the same path would say.
//!
//! Only metadata is read here (`lstat`, `readlink` of host paths the mount table names): no
//! file is opened, so nothing of untrusted size or type is read.

use std::ffi::CStr;
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use super::table::{Mount, NEWROOT};

/// Symlinks followed at most while resolving one path (the kernel's own limit).
const MAX_LINKS: usize = 40;

/// A regular file in the role's view, and where it comes from on the host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The path inside the sandbox with every symlink resolved.
    pub inside: PathBuf,
    /// The host file that path shows.
    pub host: PathBuf,
    /// The mount attributes of the bind that shows it (`MOUNT_ATTR_*`).
    pub attrs: u64,
    /// Its file type and mode bits as the host's `lstat` saw them.
    pub mode: u32,
}

/// What one path of the view is, before symlinks are followed.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Node {
    /// Shown from the host: this host path, through a bind with these attributes.
    Host(PathBuf, u64),
    /// A symlink sealnode creates (`/lib -> usr/lib`, `/dev/fd`).
    Link(PathBuf),
    /// A directory of a tmpfs sealnode mounts (the root, `/dev`, `/tmp`), or one it creates
    /// there as a mount point.
    Dir,
    /// A file sealnode writes or a mount it makes (`/etc/hosts`, `/proc`): nothing to run.
    Own(&'static str),
    Missing,
}

fn inside_of(dst: &CStr) -> PathBuf {
    let p = Path::new(std::ffi::OsStr::from_bytes(dst.to_bytes()));
    match p.strip_prefix(NEWROOT) {
        Ok(rest) => Path::new("/").join(rest),
        Err(_) => p.to_path_buf(),
    }
}

/// The mount that decides what `p` is: the last one applied at or above it.
fn lookup(mounts: &[Mount], p: &Path) -> Node {
    for (i, m) in mounts.iter().enumerate().rev() {
        match m {
            Mount::Bind { src, dst, dir, attrs, .. } => {
                let d = inside_of(dst);
                let src = Path::new(std::ffi::OsStr::from_bytes(src.to_bytes()));
                if p == d {
                    return Node::Host(src.to_path_buf(), *attrs);
                }
                if *dir {
                    if let Ok(rest) = p.strip_prefix(&d) {
                        return Node::Host(src.join(rest), *attrs);
                    }
                }
            }
            Mount::Symlink { target, dst } if inside_of(dst) == p => {
                return Node::Link(PathBuf::from(std::ffi::OsStr::from_bytes(target.to_bytes())));
            }
            Mount::Tmpfs { dst, .. } => {
                let d = inside_of(dst);
                if p == d {
                    return Node::Dir;
                }
                if p.starts_with(&d) {
                    // Inside a tmpfs only what a later step creates exists: the parents of its
                    // mount points and files (mkdir -p).
                    let made = mounts[i + 1..].iter().any(|later| match later {
                        Mount::Bind { dst, .. }
                        | Mount::Symlink { dst, .. }
                        | Mount::File { dst, .. }
                        | Mount::Tmpfs { dst, .. }
                        | Mount::Proc { dst } => {
                            let l = inside_of(dst);
                            l != p && l.starts_with(p)
                        }
                        _ => false,
                    });
                    return if made { Node::Dir } else { Node::Missing };
                }
            }
            Mount::File { dst, .. } if inside_of(dst) == p => return Node::Own("a file sealnode writes"),
            Mount::Proc { dst } if p.starts_with(inside_of(dst)) => return Node::Own("the role's own /proc"),
            Mount::SealedProgram { dst, .. } if inside_of(dst) == p => {
                return Node::Own("the sealed copy of the program")
            }
            _ => {}
        }
    }
    Node::Missing
}

/// Resolve `path` (absolute, as the role names it) to a non-directory in the role's view.
/// The error says why not, in the operator's terms.
pub fn resolve(mounts: &[Mount], path: &Path) -> Result<Found, String> {
    if !path.is_absolute() {
        return Err(format!("{} is not an absolute path", path.display()));
    }
    let mut todo: std::collections::VecDeque<std::ffi::OsString> = std::collections::VecDeque::new();
    push_front(&mut todo, path);
    let mut cur = PathBuf::from("/");
    let mut links = 0;
    let mut via: Vec<String> = Vec::new();
    let follow = |links: &mut usize, via: &mut Vec<String>, at: &Path, target: PathBuf| -> Result<PathBuf, String> {
        *links += 1;
        if *links > MAX_LINKS {
            return Err(format!("more than {MAX_LINKS} symlinks on the way to {}", path.display()));
        }
        via.push(format!("{} -> {}", at.display(), target.display()));
        Ok(target)
    };
    while let Some(c) = todo.pop_front() {
        if c == "." {
            continue;
        }
        if c == ".." {
            cur.pop();
            continue;
        }
        let next = cur.join(&c);
        let last = todo.is_empty();
        let target = match lookup(mounts, &next) {
            Node::Link(t) => Some(t),
            Node::Host(host, attrs) => match std::fs::symlink_metadata(&host) {
                Ok(md) if md.file_type().is_symlink() => {
                    Some(std::fs::read_link(&host).map_err(|e| format!("readlink {}: {e}", host.display()))?)
                }
                Ok(md) if md.is_dir() => {
                    cur = next;
                    None
                }
                Ok(md) if last => {
                    use std::os::unix::fs::MetadataExt;
                    return Ok(Found { inside: next, host, attrs, mode: md.mode() });
                }
                Ok(_) => return Err(format!("{} is not a directory in the role's view", next.display())),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(not_found(path, &next, &via));
                }
                Err(e) => return Err(format!("{} (host {}): {e}", next.display(), host.display())),
            },
            Node::Dir => {
                cur = next;
                None
            }
            Node::Own(what) => return Err(format!("{} is {what}, not a program", next.display())),
            Node::Missing => return Err(not_found(path, &next, &via)),
        };
        if let Some(t) = target {
            let t = follow(&mut links, &mut via, &cur.join(&c), t)?;
            if t.is_absolute() {
                cur = PathBuf::from("/");
            }
            push_front(&mut todo, &t);
        }
    }
    Err(format!("{} is a directory in the role's view, not a program", cur.display()))
}

fn push_front(todo: &mut std::collections::VecDeque<std::ffi::OsString>, p: &Path) {
    let parts: Vec<std::ffi::OsString> = p
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::CurDir => None,
            Component::ParentDir => Some("..".into()),
            Component::RootDir | Component::Prefix(_) => None,
        })
        .collect();
    for part in parts.into_iter().rev() {
        todo.push_front(part);
    }
}

fn not_found(path: &Path, at: &Path, via: &[String]) -> String {
    let how = if via.is_empty() { String::new() } else { format!(" (through {})", via.join(", ")) };
    if at == path {
        format!("{} is not in the role's view{how}", path.display())
    } else {
        format!("{} is not in the role's view: {} is missing there{how}", path.display(), at.display())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;

    fn c(p: &str) -> CString {
        CString::new(p).expect("cstring")
    }
    fn root(p: &str) -> CString {
        c(&format!("{NEWROOT}{p}"))
    }
    fn bind(src: &Path, dst: &str, dir: bool) -> Mount {
        Mount::Bind {
            src: c(src.to_str().expect("utf8")),
            dst: root(dst),
            dir,
            attrs: 7,
            check: super::super::table::Check::None,
            nofollow: true,
        }
    }

    /// The table the scenarios share: a root tmpfs, a "system" dir bound at /usr, a
    /// merged-usr style /lib symlink, a venv bound at /opt/venv, a generated /etc/hosts.
    fn view(host: &Path) -> Vec<Mount> {
        vec![
            Mount::Tmpfs { dst: c(NEWROOT), opts: c("size=1m"), attrs: 0 },
            bind(&host.join("usr"), "/usr", true),
            Mount::Symlink { target: c("usr/lib"), dst: root("/lib") },
            bind(&host.join("venv"), "/opt/venv", true),
            Mount::File { dst: root("/etc/hosts"), contents: vec![] },
        ]
    }

    fn tree() -> tempfile::TempDir {
        let t = tempfile::tempdir().expect("tmp");
        let h = t.path();
        for d in ["usr/bin", "usr/lib", "venv/bin", "copy"] {
            std::fs::create_dir_all(h.join(d)).expect("mkdir");
        }
        std::fs::write(h.join("usr/bin/python3.12"), "interpreter").expect("write");
        std::fs::write(h.join("usr/lib/ld.so"), "loader").expect("write");
        std::fs::write(h.join("copy/env"), "copy of env").expect("write");
        std::fs::write(h.join("usr/bin/env"), "the host's env").expect("write");
        std::os::unix::fs::symlink("python3.12", h.join("usr/bin/python3")).expect("symlink");
        // A venv's python names the interpreter by its path inside the sandbox.
        std::os::unix::fs::symlink("/usr/bin/python3", h.join("venv/bin/python")).expect("symlink");
        std::os::unix::fs::symlink("/usr/bin/env", h.join("venv/bin/tool")).expect("symlink");
        std::os::unix::fs::symlink("../../../outside", h.join("venv/bin/up")).expect("symlink");
        std::os::unix::fs::symlink("loop2", h.join("venv/bin/loop1")).expect("symlink");
        std::os::unix::fs::symlink("loop1", h.join("venv/bin/loop2")).expect("symlink");
        std::os::unix::fs::symlink("/lib/ld.so", h.join("venv/bin/via-lib")).expect("symlink");
        std::os::unix::fs::symlink("/etc/hosts", h.join("venv/bin/hosts")).expect("symlink");
        t
    }

    #[test]
    fn symlinks_are_followed_inside_the_view() {
        let t = tree();
        let h = t.path();
        let m = view(h);
        let f = resolve(&m, Path::new("/opt/venv/bin/python")).expect("resolves");
        assert_eq!(f.inside, Path::new("/usr/bin/python3.12"));
        assert_eq!(f.host, h.join("usr/bin/python3.12"));
        // Through sealnode's own /lib symlink.
        let f = resolve(&m, Path::new("/opt/venv/bin/via-lib")).expect("resolves");
        assert_eq!((f.inside.as_path(), f.host), (Path::new("/usr/lib/ld.so"), h.join("usr/lib/ld.so")));
        // A plain file.
        let f = resolve(&m, Path::new("/usr/bin/env")).expect("resolves");
        assert_eq!(f.host, h.join("usr/bin/env"));
    }

    /// A later bind over a file (a venv symlink to /usr/bin/env, with a copy bound there) wins:
    /// what the role runs is the copy, whatever the host's /usr/bin/env is.
    #[test]
    fn a_later_bind_covers_what_is_under_it() {
        let t = tree();
        let h = t.path();
        let mut m = view(h);
        m.push(bind(&h.join("copy/env"), "/usr/bin/env", false));
        let f = resolve(&m, Path::new("/opt/venv/bin/tool")).expect("resolves");
        assert_eq!(f.inside, Path::new("/usr/bin/env"));
        assert_eq!(f.host, h.join("copy/env"), "the host's /usr/bin/env is not what runs");
    }

    #[test]
    fn what_is_not_a_program_in_the_view_is_refused_with_the_reason() {
        let t = tree();
        let m = view(t.path());
        let e = |p: &str| resolve(&m, Path::new(p)).expect_err(p);
        assert!(e("/opt/venv/bin/missing").contains("is not in the role's view"), "{}", e("/opt/venv/bin/missing"));
        // ".." from the bind's root stays in the view: /outside is not there.
        let up = e("/opt/venv/bin/up");
        assert!(up.contains("/outside") && up.contains("-> ../../../outside"), "{up}");
        assert!(e("/opt/venv/bin/loop1").contains("more than 40 symlinks"));
        assert!(e("/opt/venv/bin/hosts").contains("a file sealnode writes"));
        assert!(e("/opt/venv/bin").contains("is a directory"));
        assert!(e("/usr/bin/env/x").contains("not a directory"));
        assert!(e("/home/x").contains("not in the role's view"));
        assert!(e("relative").contains("not an absolute path"));
    }
}
