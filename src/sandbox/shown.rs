//! What the kernel shows of a started sandbox, read by the launcher from /proc (a view no filter
//! above sealnode can fake by answering a call with a made-up success; found by review: faked
//! setresuid, setresgid, setgroups with getgroups, setrlimit, and capset with capget each left a
//! role or its init with a layer missing while every step reported success). Checked against
//! the plan at every start of every sandbox: its init and its workload.

use crate::sandbox::plan::Plan;

/// The fields of /proc/PID/status that say what a process holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Status {
    /// Real, effective, saved and filesystem uid (gid), as the reader's user namespace sees them.
    pub uid: [u32; 4],
    pub gid: [u32; 4],
    pub groups: Vec<u32>,
    /// CapInh, CapPrm, CapEff, CapBnd, CapAmb.
    pub caps: [u64; 5],
    pub no_new_privs: bool,
    /// Seccomp mode (2: filter) and how many filters.
    pub seccomp: u8,
    pub seccomp_filters: u32,
}

/// Parse /proc/PID/status; None when a field is missing or malformed.
pub fn status(text: &str) -> Option<Status> {
    let field = |name: &str| crate::os::sys::status_field(text, name);
    let nums = |name: &str| -> Option<Vec<u32>> { field(name)?.split_whitespace().map(|n| n.parse().ok()).collect() };
    let four = |name: &str| -> Option<[u32; 4]> { nums(name)?.try_into().ok() };
    let cap = |name: &str| u64::from_str_radix(field(name)?, 16).ok();
    Some(Status {
        uid: four("Uid")?,
        gid: four("Gid")?,
        groups: nums("Groups")?,
        caps: [cap("CapInh")?, cap("CapPrm")?, cap("CapEff")?, cap("CapBnd")?, cap("CapAmb")?],
        no_new_privs: field("NoNewPrivs")? == "1",
        seccomp: field("Seccomp")?.parse().ok()?,
        seccomp_filters: field("Seccomp_filters").map_or(Some(0), |n| n.parse().ok())?,
    })
}

/// Each limit's hard value from /proc/PID/limits, by its row's name (None: unlimited).
pub fn hard_limit(text: &str, row: &str) -> Option<Option<u64>> {
    let line = text.lines().find(|l| l.starts_with(row))?;
    let hard = line[row.len()..].split_whitespace().nth(1)?;
    if hard == "unlimited" {
        return Some(None);
    }
    hard.parse().ok().map(Some)
}

/// The row of /proc/PID/limits for `res`.
fn limit_row(res: nix::sys::resource::Resource) -> Option<&'static str> {
    use nix::sys::resource::Resource as R;
    Some(match res {
        R::RLIMIT_CORE => "Max core file size",
        R::RLIMIT_NOFILE => "Max open files",
        R::RLIMIT_NPROC => "Max processes",
        R::RLIMIT_FSIZE => "Max file size",
        R::RLIMIT_MEMLOCK => "Max locked memory",
        R::RLIMIT_STACK => "Max stack size",
        R::RLIMIT_CPU => "Max cpu time",
        R::RLIMIT_AS => "Max address space",
        R::RLIMIT_DATA => "Max data size",
        _ => return None,
    })
}

/// A sandbox init's status and children files, opened at its clone while it is the launcher's
/// own and dumpable: a /proc that hides a non-dumpable or another user's process (hidepid, the
/// units' ProtectProc=invisible) hides the init once it confines itself, and reading a file
/// already open checks nothing again (found by review: the rootless units refused every start,
/// and take_listener failed there).
#[derive(Debug)]
pub struct InitFiles {
    status: Option<std::fs::File>,
    children: Option<std::fs::File>,
}

impl InitFiles {
    pub fn open(init: nix::unistd::Pid) -> InitFiles {
        let open = |p: String| std::fs::File::open(p).ok();
        InitFiles {
            status: open(format!("/proc/{init}/status")),
            children: open(format!("/proc/{init}/task/{init}/children")),
        }
    }

    /// The init's status now (None: not shown, or gone).
    pub fn status(&mut self) -> Option<String> {
        self.status.as_mut().and_then(reread)
    }

    /// The init's children now, as the file lists them (None: not shown, or gone).
    pub fn children(&mut self) -> Option<String> {
        self.children.as_mut().and_then(reread)
    }

    /// The init's one child (its workload), while it has one.
    pub fn child(&mut self) -> Option<u32> {
        self.children()?.split_whitespace().next()?.parse().ok()
    }
}

/// A /proc file's content generated afresh: read from its start.
fn reread(f: &mut std::fs::File) -> Option<String> {
    use std::io::{Read, Seek};
    f.seek(std::io::SeekFrom::Start(0)).ok()?;
    let mut text = String::new();
    f.read_to_string(&mut text).ok()?;
    Some(text)
}

/// A file of another process's /proc dir (None: gone, or not shown here: hidepid).
pub fn read(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

/// Which of the sandbox's two processes is checked: its init, or its workload after exec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    Init,
    Workload,
}

/// What is wrong with `s` (a sandbox's init or workload, as the launcher sees it) for `plan`;
/// `launcher_filters`: how many seccomp filters the launcher itself runs under (a role's are
/// on top). The role's ids on each of the four; no supplementary group when rootful (rootless,
/// the invoking user's stay: the kernel keeps them); every capability gone (init keeps its
/// bounding set: it never executes), no_new_privs; the workload under its own filter.
pub fn wrong(s: &Status, plan: &Plan, who: Who, launcher_filters: u32) -> Option<String> {
    let layers = &plan.layers;
    wrong_for(
        s,
        (plan.ids.uid, plan.ids.gid),
        plan.rootful,
        (layers.credentials, layers.seccomp),
        who,
        launcher_filters,
    )
}

/// [`wrong`] for the role's `(uid, gid)`, `rootful`, and whether its credentials and seccomp
/// layers are on (both but in the layer matrix).
fn wrong_for(
    s: &Status,
    (u, g): (u32, u32),
    rootful: bool,
    (credentials, seccomp): (bool, bool),
    who: Who,
    launcher_filters: u32,
) -> Option<String> {
    if s.uid.iter().any(|x| *x != u) || s.gid.iter().any(|x| *x != g) {
        return Some(format!(
            "ids uid {:?} gid {:?}, not the role's {u}/{g} (a faked setresuid or setresgid)",
            s.uid, s.gid
        ));
    }
    if rootful && !s.groups.is_empty() {
        return Some(format!("supplementary groups {:?} (a faked setgroups)", s.groups));
    }
    if credentials {
        let names = ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"];
        for (i, (c, n)) in s.caps.iter().zip(names).enumerate() {
            if *c != 0 && !(who == Who::Init && i == 3) {
                return Some(format!("{n} {c:016x} (a faked capset or prctl)"));
            }
        }
        if !s.no_new_privs {
            return Some("no_new_privs not set (a faked prctl)".into());
        }
    }
    if who == Who::Workload && seccomp && (s.seccomp != 2 || s.seccomp_filters <= launcher_filters) {
        return Some(format!("seccomp mode {} with {} filters (a faked seccomp)", s.seccomp, s.seccomp_filters));
    }
    None
}

/// The workload's limits above the plan's (a faked setrlimit), if any.
pub fn wrong_limits(limits: &str, plan: &Plan) -> Option<String> {
    wrong_limits_for(limits, &plan.rlimits)
}

/// [`wrong_limits`] for `rlimits` (the plan's). A file without its header is not checked (a
/// process reaped while the kernel wrote it: found by review), nor a limit planned unlimited.
fn wrong_limits_for(limits: &str, rlimits: &[(nix::sys::resource::Resource, u64)]) -> Option<String> {
    if !limits.starts_with("Limit") {
        return None;
    }
    rlimits.iter().filter(|(_, want)| *want != libc::RLIM_INFINITY).find_map(|(res, want)| {
        let row = limit_row(*res)?;
        let got = match hard_limit(limits, row) {
            Some(Some(v)) if v <= *want => return None,
            Some(Some(v)) => v.to_string(),
            Some(None) => "unlimited".into(),
            None => "not shown".into(),
        };
        Some(format!("{row}: {got}, not at most {want} (a faked setrlimit)"))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\tsleep\nUmask:\t0022\nState:\tS (sleeping)\nUid:\t61001\t61001\t61001\t61001\nGid:\t61001\t61001\t61001\t61001\nFDSize:\t64\nGroups:\t\nNStgid:\t7\t1\nCapInh:\t0000000000000000\nCapPrm:\t0000000000000000\nCapEff:\t0000000000000000\nCapBnd:\t0000000000000000\nCapAmb:\t0000000000000000\nNoNewPrivs:\t1\nSeccomp:\t2\nSeccomp_filters:\t2\n";

    #[test]
    fn the_kernels_status_is_read_field_by_field() {
        let s = status(STATUS).expect("status");
        assert_eq!((s.uid, s.gid), ([61001; 4], [61001; 4]));
        assert!(s.groups.is_empty() && s.caps == [0; 5] && s.no_new_privs);
        assert_eq!((s.seccomp, s.seccomp_filters), (2, 2));
        // A missing or malformed field is no status (an empty read: a faked read).
        assert_eq!(status(""), None);
        assert_eq!(status(&STATUS.replace("Uid:\t61001\t61001\t61001\t61001", "Uid:\t61001")), None);
        assert_eq!(status(&STATUS.replace("CapEff:\t0000000000000000", "CapEff:\tzz")), None);
        let g = status(&STATUS.replace("Groups:\t", "Groups:\t0 4 ")).expect("status");
        assert_eq!(g.groups, vec![0, 4]);
    }

    #[test]
    fn what_the_kernel_shows_is_held_to_the_plan() {
        let ok = status(STATUS).expect("status");
        let on = (true, true);
        let check = |s: &Status, who| wrong_for(s, (61001, 61001), true, on, who, 1);
        assert_eq!(check(&ok, Who::Workload), None);
        let with = |f: &dyn Fn(&mut Status)| {
            let mut s = ok.clone();
            f(&mut s);
            s
        };
        // Each layer a faked call leaves out.
        assert!(check(&with(&|s| s.uid = [0; 4]), Who::Workload).is_some_and(|w| w.contains("setresuid")));
        assert!(check(&with(&|s| s.gid[3] = 0), Who::Init).is_some());
        assert!(check(&with(&|s| s.groups = vec![4]), Who::Workload).is_some_and(|w| w.contains("setgroups")));
        assert!(check(&with(&|s| s.caps[2] = 1 << 21), Who::Init).is_some_and(|w| w.contains("CapEff")));
        assert!(check(&with(&|s| s.no_new_privs = false), Who::Workload).is_some());
        assert!(check(&with(&|s| s.seccomp_filters = 1), Who::Workload).is_some_and(|w| w.contains("seccomp")));
        // Init keeps its bounding set (it never executes) and has no filter of its own.
        assert_eq!(check(&with(&|s| s.caps[3] = u64::MAX), Who::Init), None);
        assert!(check(&with(&|s| s.caps[3] = u64::MAX), Who::Workload).is_some());
        assert_eq!(check(&with(&|s| s.seccomp_filters = 0), Who::Init), None);
        // Rootless, the invoking user's groups stay (the kernel keeps them); the layer
        // matrix's credentials and seccomp off are not held to.
        assert_eq!(wrong_for(&with(&|s| s.groups = vec![4]), (61001, 61001), false, on, Who::Workload, 1), None);
        let off = with(&|s| {
            s.caps = [u64::MAX; 5];
            s.no_new_privs = false;
            s.seccomp = 0
        });
        assert_eq!(wrong_for(&off, (61001, 61001), true, (false, false), Who::Workload, 1), None);
    }

    #[test]
    fn a_limits_row_gives_its_hard_value() {
        let l = "Limit                     Soft Limit           Hard Limit           Units     \nMax processes             512                  512                  processes \nMax locked memory         65536                8388608              bytes     \nMax open files            unlimited            unlimited            files     \n";
        assert_eq!(hard_limit(l, "Max processes"), Some(Some(512)));
        assert_eq!(hard_limit(l, "Max locked memory"), Some(Some(8388608)));
        assert_eq!(hard_limit(l, "Max open files"), Some(None));
        assert_eq!(hard_limit(l, "Max file size"), None);
        use nix::sys::resource::Resource as R;
        assert_eq!(wrong_limits_for(l, &[(R::RLIMIT_NPROC, 512)]), None);
        assert!(wrong_limits_for(l, &[(R::RLIMIT_MEMLOCK, 65536)]).is_some_and(|w| w.contains("8388608")));
        assert!(wrong_limits_for(l, &[(R::RLIMIT_NOFILE, 4096)]).is_some_and(|w| w.contains("unlimited")));
        // Planned unlimited; a file cut short (its process reaped meanwhile): not held to.
        assert_eq!(wrong_limits_for(l, &[(R::RLIMIT_NOFILE, libc::RLIM_INFINITY)]), None);
        assert_eq!(wrong_limits_for("", &[(R::RLIMIT_NPROC, 512)]), None);
    }
}
