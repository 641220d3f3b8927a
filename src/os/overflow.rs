//! The ids that name no one in particular. In a user namespace, every host uid the namespace
//! does not map reads as the overflow uid (/proc/sys/kernel/overflowuid, 65534 unless changed),
//! and every unmapped gid as the overflow gid: in file owners (stat) and in a unix-socket
//! peer's credentials (SO_PEERCRED). sealnode trusts its own uid as a file owner and on the
//! control socket, so it may not run as the overflow id, nor admit it on the control socket,
//! in a namespace that leaves ids unmapped: every unmapped host user would count as that id.
//! The initial namespace maps every id (`0 0 4294967295`), and there the overflow uid is only
//! the user it is (`nobody`, the usual rootless launcher).

/// The kernel's overflow id where its sysctl cannot be read (DEFAULT_OVERFLOWUID, -GID).
pub const DEFAULT_OVERFLOW: u32 = 65534;

/// The line of an id map that maps every id: the initial user namespace's (user_namespaces(7)).
const EVERY_ID: [&str; 3] = ["0", "0", "4294967295"];

/// Whether an id map (the text of /proc/self/uid_map or gid_map) maps every id, as the
/// initial namespace's does. A map of any other shape, or none read (empty text), leaves ids
/// unmapped: fail closed, as an id that may stand for unmapped users.
pub fn maps_every_id(map: &str) -> bool {
    let mut lines = map.lines().map(|l| l.split_whitespace().collect::<Vec<_>>()).filter(|f| !f.is_empty());
    matches!((lines.next(), lines.next()), (Some(l), None) if l == EVERY_ID)
}

/// An overflow sysctl's value (`65534\n`); the kernel's default where it is not a number.
pub fn parse_overflow(text: &str) -> u32 {
    text.trim().parse().unwrap_or(DEFAULT_OVERFLOW)
}

/// This process's overflow ids and whether its user namespace maps every uid and gid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Overflow {
    pub uid: u32,
    pub gid: u32,
    pub every_uid_mapped: bool,
    pub every_gid_mapped: bool,
}

impl Overflow {
    /// Read from /proc (small kernel files that never block). One that cannot be read counts
    /// as a namespace that leaves ids unmapped.
    pub fn read() -> Overflow {
        let text = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
        Overflow {
            uid: parse_overflow(&text("/proc/sys/kernel/overflowuid")),
            gid: parse_overflow(&text("/proc/sys/kernel/overflowgid")),
            every_uid_mapped: maps_every_id(&text("/proc/self/uid_map")),
            every_gid_mapped: maps_every_id(&text("/proc/self/gid_map")),
        }
    }

    /// Whether `uid`, as read here (a file's owner, a control client), may be any host user
    /// this namespace does not map.
    pub fn ambiguous_uid(&self, uid: u32) -> bool {
        !self.every_uid_mapped && uid == self.uid
    }

    /// [`Overflow::ambiguous_uid`] for a gid.
    pub fn ambiguous_gid(&self, gid: u32) -> bool {
        !self.every_gid_mapped && gid == self.gid
    }

    /// Why sealnode may not run as (`uid`, `gid`) here, and the fix, if it may not: its own
    /// uid is trusted as a file owner and on the control socket, and each unmapped host user
    /// would read as it.
    pub fn launcher_problem(&self, uid: u32, gid: u32) -> Option<(String, String)> {
        let which = if self.ambiguous_uid(uid) {
            format!("uid {uid}, the overflow uid (/proc/sys/kernel/overflowuid),")
        } else if self.ambiguous_gid(gid) {
            format!("gid {gid}, the overflow gid (/proc/sys/kernel/overflowgid),")
        } else {
            return None;
        };
        Some((
            format!(
                "sealnode runs as {which} in a user namespace that does not map every host id: \
                 every host user the namespace does not map reads as this id, in file owners and \
                 control clients, so each would be trusted as sealnode's own user"
            ),
            "run sealnode as another uid and gid (Kubernetes runAsUser and runAsGroup, podman --user, \
             systemd User= with a uid other than nobody's), or map every host id into its user namespace"
                .into(),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ov(every: bool) -> Overflow {
        Overflow { uid: 65534, gid: 65534, every_uid_mapped: every, every_gid_mapped: every }
    }

    /// Only the initial namespace's one line maps every id; a container's map, an empty or
    /// unread one, or a full range with another line beside it do not.
    #[test]
    fn only_the_initial_map_maps_every_id() {
        assert!(maps_every_id("         0          0 4294967295\n"));
        assert!(maps_every_id("0 0 4294967295"));
        for partial in [
            "",
            "     65534      65534          1\n",
            "         0     100000      65536\n",
            "0 0 4294967294\n",
            "0 1 4294967295\n",
            "0 0 4294967295\n0 0 1\n",
            "0 0 4294967295 7\n",
        ] {
            assert!(!maps_every_id(partial), "{partial:?}");
        }
    }

    #[test]
    fn an_unreadable_overflow_sysctl_is_the_kernels_default() {
        assert_eq!(parse_overflow("65534\n"), 65534);
        assert_eq!(parse_overflow("1000"), 1000);
        assert_eq!(parse_overflow(""), DEFAULT_OVERFLOW);
    }

    /// The overflow uid (or gid) is refused as the launcher only where ids are unmapped; any
    /// other id, or the initial namespace, passes.
    #[test]
    fn the_overflow_id_is_refused_only_where_ids_are_unmapped() {
        let (what, fix) = ov(false).launcher_problem(65534, 65534).expect("refused");
        assert!(what.contains("uid 65534, the overflow uid") && what.contains("does not map"), "{what}");
        assert!(fix.contains("runAsUser") && fix.contains("podman --user"), "{fix}");
        let (what, _) = ov(false).launcher_problem(1000, 65534).expect("refused");
        assert!(what.contains("gid 65534, the overflow gid"), "{what}");
        assert_eq!(ov(false).launcher_problem(1000, 1000), None);
        assert_eq!(ov(true).launcher_problem(65534, 65534), None);
        assert!(ov(false).ambiguous_uid(65534) && !ov(false).ambiguous_uid(0) && !ov(true).ambiguous_uid(65534));
    }
}
