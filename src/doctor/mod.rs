//! `sealnode doctor`: what this kernel offers and what each fact means for sealnode
//! ([`checks`]), and the part of it every start requires ([`required`]). Its parts:
//! - [`probe`]: the setup a role makes in its namespaces, tried in a child;
//! - [`container`]: the options a container's runtime names for what the cell needs;
//! - [`denial_log`]: whether the denial log can take the roles' seccomp listeners;
//! - [`check`]: a check's result, as doctor and `check` show it;
//! - [`bounded`]: a probe's child waited for and read within a bound.

mod bounded;
mod check;
mod container;
mod denial_log;
mod probe;

pub use check::{Check, Level};
pub use denial_log::{denial_log, denial_log_ready};

use nix::errno::Errno;

use crate::os::sys;
use check::sysctl;
use container::{container_caps, container_userns, host_hardening, options, Options};
use probe::{try_namespaces_bounded, Refused, CLONE3, MAPS, PROBE_LIMIT, SETUP, WHOLE_LIMIT};

/// What a config asks of the setup beyond what every start needs (`None`: no config given;
/// doctor then warns where it would fail).
#[derive(Debug, Clone, Copy, Default)]
pub struct Needs {
    /// The Landlock ABI the policies need.
    pub min_abi: u8,
    /// Each role starts in its own cgroup leaf (its intermediate cloned there with clone3):
    /// per-role limits or the unit's delegated cgroup.
    pub cgroup_leaves: Option<bool>,
    /// A role's refused calls are logged (`log_refused_syscalls`: a seccomp listener).
    pub refusal_log: Option<bool>,
    /// The host ids the cell maps (each role's): the probe maps the same.
    pub ids: Option<[crate::config::Ids; 2]>,
}

impl Needs {
    /// Without a config: the calls a config may add are tried and warned about.
    pub fn any(min_abi: u8) -> Needs {
        Needs { min_abi, ..Needs::default() }
    }

    /// What `cfg` needs. A cgroup setup the host refuses is `run`'s and `check`'s to name.
    pub fn of(cfg: &crate::config::Config, min_abi: u8) -> Needs {
        let ids = |r| cfg.role_ids(r).ok();
        Needs {
            min_abi,
            cgroup_leaves: Some(crate::sandbox::cgroup::check(cfg).is_ok_and(|leaves| leaves.is_some())),
            refusal_log: Some(crate::config::Role::ALL.iter().any(|r| cfg.role(*r).log_refused_syscalls)),
            ids: ids(crate::config::Role::Engine).zip(ids(crate::config::Role::Node)).map(|(e, n)| [e, n]),
        }
    }
}

pub fn checks(needs: Needs) -> Vec<Check> {
    let min_abi = needs.min_abi;
    let mut v = Vec::new();
    let uid = nix::unistd::geteuid();
    let mode = if uid.is_root() {
        "rootful (each role runs as its own host user)"
    } else {
        "rootless (roles run as the invoking user)"
    };
    v.push(Check { name: "mode", level: Level::Ok, value: format!("uid {uid}"), meaning: mode.into() });
    // Shown only when it fails: sealnode as the overflow id of a partial user namespace would
    // trust every unmapped host user as its own (Config::load refuses it; os::overflow).
    let gid = nix::unistd::getegid().as_raw();
    if let Some((what, fix)) = crate::os::overflow::Overflow::read().launcher_problem(uid.as_raw(), gid) {
        v.push(Check {
            name: "launcher ids",
            level: Level::Fail,
            value: format!("uid {uid}, gid {gid}"),
            meaning: format!("{what}; fix: {fix}"),
        });
    }

    let container = crate::os::container::detect();
    let opts = container.as_ref().map(options);
    v.push(match &container {
        None => Check { name: "container", level: Level::Ok, value: "none".into(), meaning: "sealnode runs on the host".into() },
        Some(c) => Check {
            name: "container",
            level: Level::Ok,
            value: format!(
                "{}{}{}{}",
                c.runtime,
                c.version.as_deref().map(|v| format!(" {v}")).unwrap_or_default(),
                match c.rootless {
                    Some(true) => " (rootless)",
                    Some(false) => " (rootful)",
                    None => "",
                },
                c.orchestrator.as_deref().map(|o| format!(" under {o}")).unwrap_or_default(),
            ),
            meaning: format!(
                "sealnode runs in a container ({}); the runtime is part of the trusted base and each option it needs is named below (docs/containers.md)",
                c.evidence.join(", ")
            ),
        },
    });
    // The container's own options first: the probe maps ids (CAP_SETUID, CAP_SETGID), so a
    // missing capability is named as the option that adds it, not as a refused call.
    if let Some(o) = &opts {
        v.extend(container_caps(uid.is_root(), o));
        v.push(container_userns(&std::fs::read_to_string("/proc/self/uid_map").unwrap_or_default(), o));
    }
    match try_namespaces_bounded(needs.ids) {
        Ok(optional) => {
            v.push(Check {
                name: "user namespaces",
                level: Level::Ok,
                value: "available".into(),
                meaning: "sealnode can create user, mount, pid, net, ipc, uts and cgroup namespaces for this user, with id maps, make there the calls a role's setup makes (close_range, setsid, setgroups when rootful, sethostname, mounts, binds, a move and a remount, mount_setattr, setns, unshare, the loopback's ioctl, memfd_create, sendfile, pivot_root, umount2, setrlimit, prctl, setresgid, setresuid, capset, Landlock, seccomp; the ones that can be read back, read back, mounts with statx, statfs and statvfs), and join them from another process (setns into the user, mount and network namespaces) and clone a role there (with CLONE_PARENT, from an intermediate, as a role is)".into(),
            });
            v.extend(optional.into_iter().map(|r| optional_check(r, &needs, opts.as_ref())));
        }
        Err(Refused::Namespaces(e)) => {
            let (what, fix) = crate::sandbox::namespaces::explain_userns_failure(e);
            let fix = match &opts {
                Some(o) if e == Errno::EPERM || e == Errno::ENOSYS => {
                    format!("the container's seccomp profile refuses the namespace calls: {}", o.seccomp)
                }
                _ => fix,
            };
            v.push(Check {
                name: "user namespaces",
                level: Level::Fail,
                value: e.desc().into(),
                meaning: format!("{what}; fix: {fix}"),
            });
        }
        Err(r @ (Refused::Hung(step) | Refused::Killed(step, _) | Refused::Step(step, _))) => {
            let (value, does, fix) = described(r, opts.as_ref());
            v.push(Check {
                name: "user namespaces",
                level: Level::Fail,
                value,
                meaning: format!(
                    "the namespaces are made, but {step} in them {does}, as each role's setup needs it; fix: {fix}"
                ),
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
        meaning: match (over.is_empty(), &opts) {
            (true, _) => "each role can get its own fresh /proc".into(),
            (false, Some(o)) => format!("the kernel refuses a fresh /proc in a user namespace while /proc has over-mounts, as the runtime's masked paths are; fix: {} (sealnode masks /proc inside each role itself)", o.proc),
            (false, None) => "the kernel refuses a fresh /proc in a user namespace while /proc has over-mounts; remove ProtectKernelTunables=, ProtectKernelLogs=, ProtectHostname= from the unit (sealnode masks /proc inside each role itself)".into(),
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
            let in_kernel = std::fs::read_to_string("/sys/kernel/security/lsm").is_ok_and(|l| l.split(',').any(|m| m.trim() == "landlock"));
            // Filters sealnode itself runs under (its status; securityfs may not be mounted).
            let above = sys::own_status("Seccomp_filters").ok().and_then(|n| n.parse::<u32>().ok()).unwrap_or(0);
            let allow = opts.as_ref().map_or("allow landlock_create_ruleset, landlock_add_rule and landlock_restrict_self in it, or run sealnode outside it (the systemd unit as shipped)".to_string(), |o| o.seccomp.to_string());
            match (&opts, abi) {
                // The kernel has it, and the query is refused (found by review: blamed on the
                // kernel): a filter above sealnode.
                (_, ..=0) if in_kernel => format!(
                    "the kernel has Landlock (/sys/kernel/security/lsm) but its calls are refused here: a seccomp filter above sealnode; fix: {allow}"
                ),
                // Not known which: say both (sealnode runs under a filter that may refuse it).
                (None, ..=0) if above > 0 => format!(
                    "the policies need ABI {min_abi}; sealnode refuses to start: the kernel lacks Landlock, or one of the {above} seccomp filter(s) sealnode runs under refuses its calls; fix: boot a kernel >= 6.12 with landlock in lsm=, or {allow}"
                ),
                // ABI 0 in a container is as often the runtime's filter as the kernel (found by
                // review: the message blamed only the kernel).
                (Some(o), 0) => format!("the policies need ABI {min_abi}; sealnode refuses to start (boot a kernel >= 6.12 with landlock in lsm=, or, if the kernel has it, the container's seccomp profile refuses Landlock's calls: {})", o.seccomp),
                _ => format!("the policies need ABI {min_abi}; sealnode refuses to start (boot a kernel >= 6.12 with landlock in lsm=)"),
            }
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
    v.extend(host_hardening(opts.as_ref()));
    v
}

/// What a refused step looks like from here: what the probe saw, what the call does in the
/// namespaces, and the fix (the container's option, or what a filter above sealnode must allow).
fn described(r: Refused, opts: Option<&Options>) -> (String, &'static str, String) {
    let (value, does, above) = match r {
        Refused::Hung(step) => (
            format!(
                "{step} did not return within {} s",
                if step == SETUP { WHOLE_LIMIT } else { PROBE_LIMIT }.as_secs()
            ),
            "hangs",
            "a seccomp filter above sealnode hands it to a supervisor that does not answer: allow it",
        ),
        Refused::Killed(step, sig) => (
            format!(
                "{step} killed the process ({})",
                nix::sys::signal::Signal::try_from(sig).map_or(sig.to_string(), |s| s.as_str().to_string())
            ),
            "kills the process",
            "a seccomp filter above sealnode kills it (systemd's SystemCallFilter= without SystemCallErrorNumber=): allow it",
        ),
        Refused::Step(MAPS, e) => {
            let fix = match opts {
                Some(o) => format!(
                    "{} SETUID,SETGID, and a user namespace for the container that maps the roles' users ({})",
                    o.caps, o.userns
                ),
                None => "give sealnode CAP_SETUID and CAP_SETGID (the units as shipped do), and run it in a user namespace that maps the roles' users".into(),
            };
            return (format!("{MAPS} refused: {}", e.desc()), "is refused", fix);
        }
        Refused::Step(step, Errno::EOPNOTSUPP) => (
            format!("{step} refused: {} (or answered success without taking effect, read back)", Errno::EOPNOTSUPP.desc()),
            "is refused",
            "allow it in the seccomp filter or LSM above sealnode that refuses it or fakes its success",
        ),
        Refused::Step(step, e) => {
            (format!("{step} refused: {}", e.desc()), "is refused", "allow it in the seccomp filter or LSM above sealnode that refuses it")
        }
        Refused::Namespaces(e) => {
            (format!("namespaces refused: {}", e.desc()), "is refused", "allow them in the seccomp filter or LSM above sealnode that refuses them")
        }
    };
    let fix = match opts {
        Some(o) => o.seccomp.to_string(),
        None => format!("{above}, or run sealnode outside it (the systemd unit as shipped)"),
    };
    (value, does, fix)
}

/// A call only some configs make, refused here: a failure where the config makes it
/// (`needs`), a warning where it does not or no config was given.
fn optional_check(r: Refused, needs: &Needs, opts: Option<&Options>) -> Check {
    let step = match r {
        Refused::Hung(s) | Refused::Killed(s, _) | Refused::Step(s, _) => s,
        Refused::Namespaces(_) => "",
    };
    let (value, does, fix) = described(r, opts);
    let (name, needed, why, without) = if step == CLONE3 {
        (
            "cgroup leaves",
            needs.cgroup_leaves,
            "each role starts in its own cgroup leaf, cloned by a process cloned straight into it with clone3 (per-role limits, cell.cgroup, the unit's delegated cgroup)",
            "leave per-role limits and cell.cgroup out",
        )
    } else {
        (
            "refused-call log",
            needs.refusal_log,
            "log_refused_syscalls hands a role's refused calls to sealnode through a seccomp listener (EBUSY: a filter above sealnode has one already, and the kernel allows one)",
            "set log_refused_syscalls = false",
        )
    };
    let so = match needed {
        Some(true) => "this config needs it: sealnode refuses to start",
        Some(false) => "this config does not use it",
        None => "a config that uses it refuses to start",
    };
    Check {
        name,
        level: if needed == Some(true) { Level::Fail } else { Level::Warn },
        value,
        meaning: format!("{why}, and {step} {does} here; {so}; fix: {fix}, or {without}"),
    }
}

/// What every start needs of the kernel and, in a container, of the runtime, tried as doctor
/// tries it (namespaces with a hostname and a mount in them, a /proc without over-mounts,
/// seccomp, a rootful cell's capabilities): the first one missing refuses the start, before
/// the cell is made, naming it and the option that adds it.
pub fn required(cfg: &crate::config::Config) -> crate::error::Result<()> {
    // ABI 0: the Landlock ABI the policies need is checked where they are compiled.
    match checks(Needs::of(cfg, 0)).into_iter().find(|c| c.level == Level::Fail) {
        None => Ok(()),
        Some(c) => {
            // A check's meaning reads "why; fix: what to change": the error says each once.
            let (why, fix) = c.meaning.split_once("; fix: ").unwrap_or((c.meaning.as_str(), ""));
            let fix = if fix.is_empty() { why.to_string() } else { fix.to_string() };
            let what =
                if fix == why { format!("{}: {}", c.name, c.value) } else { format!("{}: {}: {why}", c.name, c.value) };
            Err(crate::error::Error::Unsupported { what, fix })
        }
    }
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

#[cfg(test)]
mod tests {
    use super::container::*;
    use super::probe::*;
    use super::*;
    use crate::os::container::Container;

    fn container(runtime: &str, orchestrator: Option<&str>) -> Container {
        Container {
            runtime: runtime.into(),
            version: None,
            rootless: None,
            orchestrator: orchestrator.map(str::to_string),
            evidence: vec![],
        }
    }

    #[test]
    fn each_runtime_gets_its_own_words_for_each_option() {
        let k = options(&container("containerd", Some("kubernetes")));
        assert!(k.seccomp.contains("seccompProfile") && k.seccomp.contains("Localhost"), "{}", k.seccomp);
        assert!(k.proc.contains("procMount: Unmasked") && k.proc.contains("hostUsers: false"), "{}", k.proc);
        assert!(k.caps.contains("capabilities.add"), "{}", k.caps);
        let p = options(&container("podman", None));
        assert!(p.seccomp.contains("--security-opt seccomp="), "{}", p.seccomp);
        assert!(p.proc.contains("unmask=/proc/*"), "{}", p.proc);
        assert!(p.cgroup.contains("/sys/fs/cgroup") && p.cgroup.contains("--memory"), "{}", p.cgroup);
        assert!(p.caps.contains("--cap-add"), "{}", p.caps);
        let d = options(&container("docker", None));
        assert!(d.proc.contains("systempaths=unconfined"), "{}", d.proc);
        let c = options(&container("containerd", None));
        assert!(c.proc.contains("maskedPaths") && c.seccomp.contains("linux.seccomp"), "{}", c.proc);
    }

    /// The container's root is the host's root (no user namespace for the container, or a
    /// privileged one): refused, naming the runtime's option; a mapped root passes.
    #[test]
    fn a_container_whose_root_is_the_hosts_is_refused() {
        let podman = options(&container("podman", None));
        let host = container_userns("         0          0 4294967295\n", &podman);
        assert_eq!((host.level, host.value.as_str()), (Level::Fail, "0 0 4294967295"));
        assert!(host.meaning.contains("fix: ") && host.meaning.contains("--userns=auto"), "{}", host.meaning);
        let k = container_userns("0 0 4294967295\n", &options(&container("containerd", Some("kubernetes"))));
        assert!(k.level == Level::Fail && k.meaning.contains("hostUsers: false"), "{}", k.meaning);
        for mapped in ["         0     100000      65536\n", "0 1000 1\n1 100000 65536\n"] {
            assert_eq!(container_userns(mapped, &podman).level, Level::Ok, "{mapped}");
        }
    }

    #[test]
    fn on_this_machine_the_namespaces_and_their_first_steps_work() {
        // The host tests run where sealnode runs: the probe that doctor reports must pass here,
        // or every sandbox test would fail first.
        assert_eq!(try_namespaces(None), Ok(Vec::new()));
    }

    fn said(steps: &[&str]) -> Vec<u8> {
        steps.iter().map(|s| STEPS.iter().position(|t| t == s).expect("a step") as u8).collect()
    }

    fn failed(marker: u8, e: Errno) -> Vec<u8> {
        let mut b = vec![marker];
        b.extend_from_slice(&(e as i32).to_le_bytes());
        b
    }

    #[test]
    fn a_report_names_the_step_it_stopped_at_and_goes_on_past_an_optional_one() {
        let all = said(&["prctl (PR_SET_PDEATHSIG)", "sethostname", "seccomp"]);
        assert_eq!(verdict(&all, End::Exited(0)), Ok(Vec::new()));
        // A step every start needs: refused, killed, held.
        let mut r = said(&["prctl (PR_SET_PDEATHSIG)", "capset (every capability dropped)"]);
        r.extend(failed(FAILED, Errno::EPERM));
        let capset = "capset (every capability dropped)";
        assert_eq!(verdict(&r, End::Exited(1)), Err(Refused::Step(capset, Errno::EPERM)));
        let at = said(&["prctl (PR_SET_PDEATHSIG)", "mount (remount)"]);
        assert_eq!(verdict(&at, End::Signaled(31)), Err(Refused::Killed("mount (remount)", 31)));
        assert_eq!(verdict(&at, End::Hung), Err(Refused::Hung("mount (remount)")));
        assert_eq!(verdict(&at, End::Exited(1)), Err(Refused::Step("mount (remount)", Errno::EIO)));
        // An optional step: its refusal is kept and the probe goes on to the next.
        let mut o = said(&["seccomp", CLONE3]);
        o.extend(failed(OPTIONAL_FAILED, Errno::ENOSYS));
        o.extend(said(&[LISTENER]));
        assert_eq!(verdict(&o, End::Exited(0)), Ok(vec![Refused::Step(CLONE3, Errno::ENOSYS)]));
        // Killed or held at one: that step's refusal, the others passed.
        assert_eq!(
            verdict(&o, End::Signaled(31)),
            Ok(vec![Refused::Step(CLONE3, Errno::ENOSYS), Refused::Killed(LISTENER, 31)])
        );
        let mut e = said(&["seccomp", CLONE3, LISTENER]);
        e.extend(failed(OPTIONAL_FAILED, Errno::EBUSY));
        assert_eq!(verdict(&e, End::Exited(0)), Ok(vec![Refused::Step(LISTENER, Errno::EBUSY)]));
        // Nothing said: the setup itself.
        assert_eq!(verdict(&[], End::Unknown), Err(Refused::Step("the namespaces' setup", Errno::EIO)));
    }

    #[test]
    fn a_probe_result_comes_back_whole_from_its_child() {
        let results = [
            Ok(Vec::new()),
            Ok(vec![Refused::Step(CLONE3, Errno::ENOSYS), Refused::Killed(LISTENER, 31)]),
            Err(Refused::Namespaces(Errno::EPERM)),
            Err(Refused::Step(MAPS, Errno::EPERM)),
            Err(Refused::Hung("setns (user namespace)")),
            Err(Refused::Killed("capset (every capability dropped)", 31)),
        ];
        for r in results {
            assert_eq!(decode(&encode(&r)), Some(r));
        }
        assert_eq!(decode(&[]), None);
        assert_eq!(decode(&[1, 1, 0]), None);
        assert_eq!(decode(&[1]), None);
    }

    #[test]
    fn a_rootful_probe_maps_an_unprivileged_id_its_own_namespace_has() {
        assert_eq!(stand_in_id("         0          0 4294967295\n"), STAND_IN);
        assert_eq!(stand_in_id("         0     100000      65536\n"), STAND_IN);
        // A container of 1024 ids (podman --userns=auto sized to its image).
        assert_eq!(stand_in_id("         0     200000       1024\n"), 1023);
        assert_eq!(stand_in_id("0 1000 1\n1 100000 2000\n"), 2000);
        // Never the overflow id, even where it is the highest mapped.
        assert_eq!(stand_in_id("0 1000 1\n65534 100000 1\n"), STAND_IN);
        assert_eq!(stand_in_id("0 1000 1\n60000 100000 5535\n"), 65533);
        // Only root mapped: nothing else to stand in; the map write says so.
        assert_eq!(stand_in_id("0 1000 1\n"), STAND_IN);
    }

    #[test]
    fn an_optional_call_refused_fails_only_a_config_that_makes_it() {
        let podman = options(&container("podman", None));
        let clone3 = Refused::Step(CLONE3, Errno::ENOSYS);
        let with = |cgroup_leaves, refusal_log| Needs { min_abi: 6, cgroup_leaves, refusal_log, ids: None };
        let c = optional_check(clone3, &with(Some(true), Some(false)), Some(&podman));
        assert_eq!((c.name, c.level), ("cgroup leaves", Level::Fail));
        assert!(
            c.value == "clone3 refused: Function not implemented" && c.meaning.contains("--security-opt seccomp="),
            "{c:?}"
        );
        assert_eq!(optional_check(clone3, &with(Some(false), None), None).level, Level::Warn);
        let listener = optional_check(Refused::Step(LISTENER, Errno::EBUSY), &with(None, None), None);
        assert_eq!((listener.name, listener.level), ("refused-call log", Level::Warn));
        assert!(listener.meaning.contains("log_refused_syscalls = false"), "{listener:?}");
        let needed = optional_check(Refused::Killed(LISTENER, 31), &with(None, Some(true)), None);
        assert!(needed.level == Level::Fail && needed.value.contains("killed the process (SIGSYS)"), "{needed:?}");
    }
}
