//! `sealnode doctor`: what this kernel offers and what each fact means for sealnode.

use std::path::Path;

use nix::errno::Errno;
use serde::Serialize;

use crate::os::sys;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub level: Level,
    pub value: String,
    pub meaning: String,
}

fn sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// Try creating every namespace a role uses, in a child that exits at once.
fn try_namespaces() -> Result<(), Errno> {
    // SAFETY: doctor is single-threaded; the child only calls _exit.
    let pid = unsafe { sys::clone_fork(crate::sandbox::namespaces::NAMESPACES) }?;
    if pid == 0 {
        sys::exit_now(0);
    }
    nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None)?;
    Ok(())
}

pub fn checks(min_abi: u8) -> Vec<Check> {
    let mut v = Vec::new();
    let uid = nix::unistd::geteuid();
    let mode = if uid.is_root() {
        "rootful (each role runs as its own host user)"
    } else {
        "rootless (roles run as the invoking user)"
    };
    v.push(Check { name: "mode", level: Level::Ok, value: format!("uid {uid}"), meaning: mode.into() });

    match try_namespaces() {
        Ok(()) => v.push(Check {
            name: "user namespaces",
            level: Level::Ok,
            value: "available".into(),
            meaning: "sealnode can create user, mount, pid, net, ipc, uts and cgroup namespaces for this user".into(),
        }),
        Err(e) => {
            let (what, fix) = crate::sandbox::namespaces::explain_userns_failure(e);
            v.push(Check {
                name: "user namespaces",
                level: Level::Fail,
                value: e.desc().into(),
                meaning: format!("{what}; fix: {fix}"),
            });
        }
    }
    if let Some(a) = sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns") {
        let on = a == "1";
        v.push(Check {
            name: "apparmor userns restriction",
            level: if on && !uid.is_root() { Level::Warn } else { Level::Ok },
            value: format!("kernel.apparmor_restrict_unprivileged_userns = {a}"),
            meaning: if on {
                "Ubuntu 23.10+ restricts unprivileged user namespaces: rootless sealnode needs an AppArmor profile with `userns,` (root is not affected)".into()
            } else {
                "no AppArmor restriction on user namespaces".into()
            },
        });
    }
    // A fresh proc mount from a user namespace needs the current /proc fully visible.
    let over: Vec<String> = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|l| l.split_whitespace().nth(4).map(str::to_string))
        .filter(|mp| mp.starts_with("/proc/") && mp != "/proc/sys/fs/binfmt_misc")
        .collect();
    v.push(Check {
        name: "/proc fully visible",
        level: if over.is_empty() { Level::Ok } else { Level::Fail },
        value: if over.is_empty() { "no over-mounts".into() } else { format!("over-mounted: {}", over.join(", ")) },
        meaning: if over.is_empty() {
            "each role can get its own fresh /proc".into()
        } else {
            "the kernel refuses a fresh /proc in a user namespace while /proc has over-mounts; remove ProtectKernelTunables=, ProtectKernelLogs=, ProtectHostname= from the unit (sealnode masks /proc inside each role itself)".into()
        },
    });
    let abi = sys::landlock_abi();
    v.push(Check {
        name: "landlock",
        level: if abi >= i32::from(min_abi) { Level::Ok } else { Level::Fail },
        value: format!("ABI {abi}"),
        meaning: if abi >= i32::from(min_abi) {
            format!("files, TCP ports (ABI 4+) and scopes (ABI 6+) are enforced; the policies need ABI {min_abi}")
        } else {
            format!("the policies need ABI {min_abi}; sealnode refuses to start (boot a kernel >= 6.12 with landlock in lsm=)")
        },
    });
    // SAFETY-free check: PR_GET_SECCOMP returns the current mode, EINVAL without CONFIG_SECCOMP.
    let sec = sys::prctl(libc::PR_GET_SECCOMP, 0);
    let filter_ok =
        std::fs::read_to_string("/proc/self/status").map(|s| s.contains("Seccomp_filters")).unwrap_or(false);
    v.push(Check {
        name: "seccomp",
        level: if sec.is_ok() && filter_ok { Level::Ok } else { Level::Fail },
        value: if sec.is_ok() { "filter mode available".into() } else { "absent".into() },
        meaning: "each role gets a seccomp-BPF allowlist; without it sealnode refuses to start".into(),
    });
    v.extend(host_hardening());
    v
}

/// What the host adds or takes away: cgroups, io_uring, TIOCSTI.
fn host_hardening() -> Vec<Check> {
    let mut v = Vec::new();
    let cg2 = Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    let hybrid = Path::new("/sys/fs/cgroup/unified").exists();
    let own = crate::sandbox::cgroup::own_cgroup().unwrap_or_default();
    let base = if cg2 { "/sys/fs/cgroup" } else { "/sys/fs/cgroup/unified" };
    let delegated = if cg2 { crate::sandbox::cgroup::delegated() } else { None };
    let offered = delegated
        .as_ref()
        .and_then(|p| std::fs::read_to_string(p.join("cgroup.controllers")).ok())
        .or_else(|| std::fs::read_to_string(Path::new(base).join("cgroup.controllers")).ok())
        .unwrap_or_default();
    let v1 = crate::sandbox::cgroup::v1_controllers();
    v.push(Check {
        name: "cgroup v2",
        level: if cg2 { Level::Ok } else { Level::Warn },
        value: format!(
            "{}; own cgroup {own}{}; controllers {}",
            if cg2 {
                "unified".to_string()
            } else if hybrid {
                format!("hybrid ({} on v1)", v1.join(", "))
            } else {
                "v1 only".to_string()
            },
            if delegated.is_some() { " (delegated to sealnode's unit)" } else { "" },
            if cg2 && !offered.trim().is_empty() { offered.trim().to_string() } else { "none usable".to_string() },
        ),
        meaning: if delegated.is_some() {
            "per-role limits (engine.limits, node.limits, cell.limits) are enforced in this delegated cgroup: memory_* need memory, pids_max pids, cpu_* cpu, io_* io".into()
        } else {
            "per-role limits need a unified cgroup v2 hierarchy and a cgroup sealnode may manage: the unit (Delegate=yes) or, by hand as root, cell.cgroup; here a configured limit refuses the start".into()
        },
    });
    if let Some(u) = sysctl("/proc/sys/kernel/io_uring_disabled") {
        v.push(Check {
            name: "io_uring",
            level: if u == "0" { Level::Warn } else { Level::Ok },
            value: format!("kernel.io_uring_disabled = {u}"),
            meaning: if u == "0" {
                "io_uring is open to every process (it bypasses seccomp argument checks); sealnode's filters deny io_uring_setup in roles; consider sysctl kernel.io_uring_disabled=2 host-wide".into()
            } else {
                "io_uring restricted host-wide; sealnode's filters deny it in roles as well".into()
            },
        });
    }
    if let Some(t) = sysctl("/proc/sys/dev/tty/legacy_tiocsti") {
        v.push(Check {
            name: "TIOCSTI",
            level: if t == "1" { Level::Warn } else { Level::Ok },
            value: format!("dev.tty.legacy_tiocsti = {t}"),
            meaning: if t == "1" {
                "terminal input injection is allowed host-wide; sealnode blocks it in roles (new session, seccomp on the ioctl's low 32 bits); consider dev.tty.legacy_tiocsti=0".into()
            } else {
                "terminal input injection disabled host-wide".into()
            },
        });
    }
    v
}

/// The checks as a table, one entry per check: level, name, value, then what it means.
pub fn print(checks: &[Check]) {
    for c in checks {
        let tag = match c.level {
            Level::Ok => "ok  ",
            Level::Warn => "warn",
            Level::Fail => "FAIL",
        };
        println!("[{tag}] {:<28} {}\n       {}", c.name, c.value, c.meaning);
    }
}

/// Print the report; return the process exit code (1 if something required is missing).
pub fn report(checks: &[Check], json: bool) -> i32 {
    if json {
        println!("{}", serde_json::to_string_pretty(checks).unwrap_or_default());
    } else {
        print(checks);
    }
    if checks.iter().any(|c| c.level == Level::Fail) {
        if !json {
            println!("\nsealnode cannot run here until every FAIL above is fixed.");
        }
        1
    } else {
        0
    }
}
