//! The mount table: the steps that build a role's private root, as data. `sandbox::plan`
//! computes it, `sandbox::mounts` applies it in the child, `sandbox::view` reads it to resolve a
//! path the way the role will.

use std::ffi::CString;

/// Where the child assembles the new root inside its private mount namespace.
/// The host's /tmp is only overmounted in the child's own mount namespace.
pub const NEWROOT: &str = "/tmp";

/// The options of a capped scratch's tmpfs of `mb` MiB, the role's (`uid`, `gid`): the cell's
/// (sandbox::cell) or a standalone sandbox's fresh one (`Plan::fresh_capped_scratch`). Its
/// inodes are bounded with its size, one per 4 KiB page, at least 4096 and at most 1048576:
/// inode memory (about 1 KiB each, in the kernel's slab) is not counted in `size=`, and 1048576
/// inodes let a 1 MiB cap hold about 1 GiB of it (found by review); the top keeps a large cap's
/// to about that (found by the re-review: a 1 TiB cap allowed 268 million).
pub fn scratch_tmpfs_options(mb: u64, uid: u32, gid: u32) -> String {
    format!("size={mb}m,nr_inodes={},mode=0700,uid={uid},gid={gid}", scratch_tmpfs_inodes(mb))
}

/// The inodes of a capped scratch's tmpfs of `mb` MiB ([`scratch_tmpfs_options`]).
pub fn scratch_tmpfs_inodes(mb: u64) -> u64 {
    mb.saturating_mul(256).clamp(4096, 1 << 20)
}

/// One step of building the root, in order.
#[derive(Debug, Clone)]
pub enum Mount {
    /// tmpfs at `dst` (absolute, under NEWROOT).
    Tmpfs { dst: CString, opts: CString, attrs: u64 },
    /// Bind host `src` on `dst`; `check`: what the child must find there ([`Check`]);
    /// `nofollow` refuses symlinks in any component (role paths).
    Bind { src: CString, dst: CString, dir: bool, attrs: u64, check: Check, nofollow: bool },
    /// Symlink `dst` -> `target`.
    Symlink { target: CString, dst: CString },
    /// Regular file with generated contents.
    File { dst: CString, contents: Vec<u8> },
    /// Fresh procfs (from inside the new pid namespace).
    Proc { dst: CString },
    /// Hide a /proc file behind /dev/null (skipped if absent).
    MaskFile { dst: CString },
    /// Hide a /proc dir behind an empty read-only tmpfs (skipped if absent).
    MaskDir { dst: CString },
    /// Make an existing subtree read-only (skipped if absent).
    ReadOnly { dst: CString },
    /// Make one mount read-only once populated (not its submounts).
    Freeze { dst: CString },
    /// Write a value to a (namespaced) sysctl file under the new /proc before it is frozen
    /// (`optional`: skipped when the kernel lacks it).
    Sysctl { dst: CString, value: &'static [u8], optional: bool },
    /// The role's program: its sealed copy (the memfd `fd`, filled and hashed by the gate)
    /// copied onto a small tmpfs of its own that is then made read-only, and that file bound
    /// over `dst`, the program's path in the view with every symlink resolved. The role
    /// executes exactly the bytes that were hashed, at the path it expects (its
    /// `/proc/self/exe`, `$ORIGIN` and re-execs stay right).
    SealedProgram { dst: CString, fd: std::os::fd::RawFd, mode: u32 },
}

/// What the child checks a bind's source is, once it has opened it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// Nothing (system paths).
    None,
    /// The (dev, ino) the parent validated: a path swapped since is refused (ESTALE).
    Identity(u64, u64),
    /// A capped scratch: the root of a tmpfs of exactly this many bytes (the cell's, mounted
    /// over the scratch dir in the cell's mount namespace; `exec`'s own).
    Tmpfs(u64),
}

impl Mount {
    pub fn describe(&self) -> String {
        // The path as the role sees it: the new root's prefix removed once (a role's /tmp is
        // NEWROOT + "/tmp", which must not lose both).
        let s = |c: &CString| {
            let p = c.to_string_lossy();
            match p.strip_prefix(NEWROOT) {
                Some("") => "/".to_string(),
                Some(rest) if rest.starts_with('/') => rest.to_string(),
                _ => p.into_owned(),
            }
        };
        match self {
            Mount::Tmpfs { dst, .. } => format!("tmpfs on {}", s(dst)),
            Mount::Bind { src, dst, .. } => format!("bind {} -> {}", src.to_string_lossy(), s(dst)),
            Mount::Symlink { target, dst } => {
                format!("symlink {} -> {}", s(dst), target.to_string_lossy())
            }
            Mount::File { dst, .. } => format!("write {}", s(dst)),
            Mount::Proc { dst } => format!("proc on {}", s(dst)),
            Mount::MaskFile { dst } => format!("mask {}", s(dst)),
            Mount::MaskDir { dst } => format!("mask {}", s(dst)),
            Mount::ReadOnly { dst } => format!("read-only {}", s(dst)),
            Mount::Freeze { dst } => format!("freeze {}", s(dst)),
            Mount::Sysctl { dst, .. } => format!("sysctl {}", s(dst)),
            Mount::SealedProgram { dst, .. } => format!("sealed copy of the program -> {}", s(dst)),
        }
    }
}

#[cfg(test)]
mod tests {
    /// One inode per 4 KiB of the cap, within 4096 and 1048576.
    #[test]
    fn a_capped_scratch_has_an_inode_per_page_within_bounds() {
        let n = super::scratch_tmpfs_inodes;
        assert_eq!((n(1), n(16), n(17), n(64), n(4096), n(1 << 20)), (4096, 4096, 4352, 16384, 1 << 20, 1 << 20));
    }
}
