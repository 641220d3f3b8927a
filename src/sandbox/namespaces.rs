//! Which namespaces a sandbox gets, and why creating them failed when it does.

use std::path::Path;

use nix::errno::Errno;

/// The namespaces every role gets of its own, inside or outside a cell.
pub const ROLE_NAMESPACES: libc::c_int =
    libc::CLONE_NEWNS | libc::CLONE_NEWPID | libc::CLONE_NEWIPC | libc::CLONE_NEWUTS | libc::CLONE_NEWCGROUP;

/// The canary matrix's "namespaces off" columns: still private user, mount, uts and ipc
/// namespaces (so nothing the probe tries touches the host), but the host's pid and net.
pub const MATRIX_NAMESPACES: libc::c_int =
    libc::CLONE_NEWUSER | libc::CLONE_NEWNS | libc::CLONE_NEWUTS | libc::CLONE_NEWIPC;

/// All namespaces of a standalone sandbox (`exec`): the role's own plus user and net.
pub const NAMESPACES: libc::c_int = ROLE_NAMESPACES | libc::CLONE_NEWUSER | libc::CLONE_NEWNET;

/// A role inside a cell: the role's own namespaces and a user namespace of its own, a child of
/// the cell's (the network namespace is the cell's, joined). Its own user namespace owns its
/// mount, pid, ipc, uts and cgroup namespaces, so a role holds no capability over the other
/// role's, nor over the network namespaces (the cell's); and RLIMIT_NPROC counts each role's
/// processes on their own, also rootless, where both roles are one uid.
pub const CELL_ROLE_NAMESPACES: libc::c_int = ROLE_NAMESPACES | libc::CLONE_NEWUSER;

/// The sysctls the seal sets in a role's network namespace, each `(path under /proc/sys, value,
/// optional)`. TCP Fast Open off, since a sendto(MSG_FASTOPEN) connects without connect(2), the
/// call Landlock's port rules check (seccomp refuses the flag too); MPTCP off, since Landlock's
/// port rules cover plain TCP only (seccomp refuses the protocol too); absent without
/// CONFIG_MPTCP. Inside a cell the cell init writes them when it makes each network namespace
/// (a role, in its own user namespace, holds no capability over the cell's network
/// namespaces); the role reads them back.
pub const NETNS_SYSCTLS: [(&str, &[u8], bool); 2] =
    [("net/ipv4/tcp_fastopen", b"0\n", false), ("net/mptcp/enabled", b"0\n", true)];

fn sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}

/// Why creating a user namespace failed, and what to change.
pub fn explain_userns_failure(e: Errno) -> (String, String) {
    let uid = nix::unistd::geteuid();
    // A process limit, not the kernel's build (found by review: a reload's preflight cell, with
    // both roles at their nproc, was told to check CONFIG_USER_NS).
    if e == Errno::EAGAIN {
        return (
            format!("cannot create the sandbox's namespaces: {e} — a process limit is reached (RLIMIT_NPROC of uid {uid}, or the cgroup's pids.max)"),
            "raise sealnode's hard RLIMIT_NPROC (`ulimit -Hu`, LimitNPROC= in the unit) or the cgroup's limit (TasksMax=), or lower the roles' nproc; `sealnode check` warns where they do not fit".into(),
        );
    }
    if sysctl("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() == Some("1") && !uid.is_root() {
        return (
            format!("cannot create a user namespace as uid {uid}: {e} — AppArmor restricts unprivileged user namespaces (Ubuntu 23.10+)"),
            "run sealnode as root under its systemd unit, or install an AppArmor profile granting `userns,` to the sealnode binary (e.g. /etc/apparmor.d/sealnode: `profile sealnode /usr/bin/sealnode flags=(unconfined) { userns, }`), or set kernel.apparmor_restrict_unprivileged_userns=0".into(),
        );
    }
    if sysctl("/proc/sys/kernel/unprivileged_userns_clone").as_deref() == Some("0") && !uid.is_root() {
        return (
            format!("cannot create a user namespace as uid {uid}: {e} — kernel.unprivileged_userns_clone is 0"),
            "sysctl -w kernel.unprivileged_userns_clone=1, or run sealnode as root".into(),
        );
    }
    if sysctl("/proc/sys/user/max_user_namespaces").as_deref() == Some("0") {
        return (
            format!("cannot create a user namespace: {e} — user.max_user_namespaces is 0"),
            "sysctl -w user.max_user_namespaces=15000".into(),
        );
    }
    if e == Errno::EPERM && Path::new("/.dockerenv").exists() {
        return (
            format!("cannot create namespaces: {e} — the container runtime's seccomp profile forbids it"),
            "run sealnode on the host, or give its container a seccomp profile that allows clone with namespace flags"
                .into(),
        );
    }
    (
        format!("cannot create the sandbox's namespaces (user, mount, pid, net, ipc, uts, cgroup): {e}"),
        "check `sealnode doctor`; the kernel needs CONFIG_USER_NS, CONFIG_PID_NS, CONFIG_NET_NS, CONFIG_IPC_NS, CONFIG_UTS_NS, CONFIG_CGROUPS".into(),
    )
}

#[cfg(test)]
mod tests {
    /// A process limit is told as one, not as a kernel built without namespaces (found by
    /// review: a reload's preflight cell, with both roles at their nproc, was).
    #[test]
    fn eagain_is_a_process_limit() {
        let (what, fix) = super::explain_userns_failure(nix::errno::Errno::EAGAIN);
        assert!(what.contains("a process limit is reached (RLIMIT_NPROC"), "{what}");
        assert!(fix.contains("LimitNPROC=") && !fix.contains("CONFIG_USER_NS"), "{fix}");
    }
}
