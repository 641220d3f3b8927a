//! The one id-map writer: a new user namespace's uid_map and gid_map, each host id mapped to
//! itself, written by the parent once the child exists (and before it is released).

use nix::unistd::Pid;

use crate::error::{Error, Result};

/// Map each of `uids` and `gids` 1:1 into `pid`'s user namespace. Unprivileged (`!rootful`),
/// setgroups is denied first, as the kernel requires before an unprivileged gid_map.
pub fn write(pid: Pid, uids: &[u32], gids: &[u32], rootful: bool) -> Result<()> {
    let dir = format!("/proc/{pid}");
    let w = |name: &str, data: String| {
        std::fs::write(format!("{dir}/{name}"), data.as_bytes())
            .map_err(|e| Error::io(format!("write {dir}/{name} ({})", data.trim().replace('\n', "; ")), e))
    };
    if !rootful {
        w("setgroups", "deny".into())?;
    }
    w("uid_map", lines(uids))?;
    w("gid_map", lines(gids))
}

/// [`write`] for a process that reports an errno (the intermediate that maps a role's own
/// user namespace from the cell's).
pub fn write_errno(pid: Pid, uids: &[u32], gids: &[u32], rootful: bool) -> std::result::Result<(), nix::errno::Errno> {
    write(pid, uids, gids, rootful).map_err(|e| match e {
        Error::Io { source, .. } => nix::errno::Errno::from_raw(source.raw_os_error().unwrap_or(libc::EIO)),
        _ => nix::errno::Errno::EIO,
    })
}

/// `id id 1` per distinct id, in order: each map is written once (the kernel allows one write).
fn lines(ids: &[u32]) -> String {
    let mut v = ids.to_vec();
    v.sort_unstable();
    v.dedup();
    v.iter().map(|i| format!("{i} {i} 1\n")).collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn each_distinct_id_maps_to_itself_once() {
        assert_eq!(super::lines(&[61002, 61001, 61002]), "61001 61001 1\n61002 61002 1\n");
        assert_eq!(super::lines(&[0]), "0 0 1\n");
    }
}
