//! sealnode in a container: the options each runtime and Kubernetes name for what the cell
//! needs ([`options`]), and the container's and the host's checks that follow from them.

use std::path::Path;

use super::check::{sysctl, Check, Level};

/// Each option a container needs for sealnode, named as its runtime spells it.
pub(super) struct Options {
    pub(super) userns: &'static str,
    pub(super) seccomp: &'static str,
    pub(super) proc: &'static str,
    pub(super) cgroup: &'static str,
    pub(super) caps: &'static str,
}

pub(super) fn options(c: &crate::os::container::Container) -> Options {
    if c.orchestrator.as_deref() == Some("kubernetes") {
        return Options {
            userns: "the pod's hostUsers: false",
            seccomp: "the container's securityContext.seccompProfile: {type: Localhost, localhostProfile: profiles/sealnode.json} (/usr/share/sealnode/container-seccomp's profile on each node)",
            proc: "the container's securityContext.procMount: Unmasked (with the pod's hostUsers: false)",
            cgroup: "none in a pod spec: the kubelet mounts /sys/fs/cgroup read-only; leave per-role limits out and size the pod's resources",
            caps: "the container's securityContext.capabilities.add",
        };
    }
    match c.runtime.as_str() {
        "podman" => Options {
            userns: "podman run --userns=auto (or rootless podman)",
            seccomp: "podman run --security-opt seccomp=FILE (/usr/share/sealnode/container-seccomp /usr/share/containers/seccomp.json > FILE)",
            proc: "podman run --security-opt unmask=/proc/*",
            cgroup: "none found for podman: /sys/fs/cgroup stays read-only with unmask, and with unmask=ALL the container's cgroup takes no controllers while sealnode is in it (EBUSY); leave per-role limits out and cap the container (--memory, --cpus, --pids-limit)",
            caps: "podman run --cap-add",
        },
        "docker" => Options {
            userns: "dockerd --userns-remap=default",
            seccomp: "docker run --security-opt seccomp=FILE (/usr/share/sealnode/container-seccomp's profile)",
            proc: "docker run --security-opt systempaths=unconfined",
            cgroup: "docker run --cgroupns=private with a writable /sys/fs/cgroup (not offered by docker run; leave per-role limits out)",
            caps: "docker run --cap-add",
        },
        _ => Options {
            userns: "the runtime spec's linux.uidMappings and gidMappings (ctr run --uidmap, --gidmap)",
            seccomp: "the runtime spec's linux.seccomp: /usr/share/sealnode/container-seccomp's profile (ctr run --seccomp-profile FILE)",
            proc: "the runtime spec's linux.maskedPaths and linux.readonlyPaths without /proc entries",
            cgroup: "a writable cgroup2 mount at /sys/fs/cgroup in the runtime spec (options rw)",
            caps: "the runtime spec's process.capabilities",
        },
    }
}

/// Whether the container's root is the host's root (`uid_map`: this process's
/// /proc/self/uid_map). Refused (found by review): /proc must be unmasked for sealnode, and with
/// it the container's root (any process `exec`'d in the container, a `--privileged` one, or a
/// compromised sealnode) could write the host's sysctls (a pipe in `kernel.core_pattern` runs
/// as host root) and /proc/sysrq-trigger.
pub(super) fn container_userns(uid_map: &str, o: &Options) -> Check {
    let host_root = uid_map.lines().any(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 3 && f[0] == "0" && f[1] == "0"
    });
    Check {
        name: "container user namespace",
        level: if host_root { Level::Fail } else { Level::Ok },
        value: uid_map.lines().next().unwrap_or("").split_whitespace().collect::<Vec<_>>().join(" "),
        meaning: if host_root {
            format!("the container's root is the host's root: with /proc unmasked, as sealnode needs it, the container's root could write the host's sysctls and /proc/sysrq-trigger; fix: {}", o.userns)
        } else {
            "the container's root is an unprivileged host user".into()
        },
    }
}

/// The capabilities a rootful sealnode uses in a container (found by trying each runtime
/// without it, docs/containers.md): each role's host user is mapped into the cell's user
/// namespace, scratch and runtime files are handed to those users, and a role is signalled.
pub const CONTAINER_CAPS: &[caps::Capability] = &[
    caps::Capability::CAP_SETUID,
    caps::Capability::CAP_SETGID,
    caps::Capability::CAP_CHOWN,
    caps::Capability::CAP_DAC_OVERRIDE,
    caps::Capability::CAP_FOWNER,
    caps::Capability::CAP_KILL,
];

/// Which of [`CONTAINER_CAPS`] this process lacks (rootful in a container only).
pub(super) fn container_caps(root: bool, o: &Options) -> Option<Check> {
    if !root {
        return None;
    }
    let eff = caps::read(None, caps::CapSet::Effective).unwrap_or_default();
    let missing: Vec<String> = CONTAINER_CAPS
        .iter()
        .filter(|c| !eff.contains(c))
        .map(|c| c.to_string().trim_start_matches("CAP_").to_string())
        .collect();
    Some(Check {
        name: "capabilities",
        level: if missing.is_empty() { Level::Ok } else { Level::Fail },
        value: if missing.is_empty() {
            "what a rootful cell uses".into()
        } else {
            format!("missing {}", missing.join(", "))
        },
        meaning: if missing.is_empty() {
            "rootful in a container: each role's user is mapped, its files handed over, its processes signalled".into()
        } else {
            format!(
                "rootful in a container, sealnode maps each role's user and hands it its files; fix: {} {}",
                o.caps,
                missing.join(",")
            )
        },
    })
}

/// What the host adds or takes away: cgroups, io_uring, TIOCSTI.
pub(super) fn host_hardening(opts: Option<&Options>) -> Vec<Check> {
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
        } else if let Some(o) = opts {
            let rw = cg2 && nix::unistd::access("/sys/fs/cgroup", nix::unistd::AccessFlags::W_OK).is_ok();
            if rw {
                "per-role limits need cell.cgroup (a dir under the container's writable /sys/fs/cgroup, e.g. \"sealnode\")".into()
            } else {
                format!("per-role limits need a writable cgroup v2 mount; fix: {}; without limits the cell runs and the container's own limits cap it", o.cgroup)
            }
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
