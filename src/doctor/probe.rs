//! The setup a role makes in its namespaces, tried as doctor tries it: in a child, in
//! namespaces of its own, each step's outcome reported back over a pipe ([`try_namespaces`]),
//! bounded ([`try_namespaces_bounded`]).

use nix::errno::Errno;

use super::bounded::{ended_within, read_within, Ended, Read};
use crate::os::sys;

/// What a role's setup does first in its namespaces, as doctor tries it: a step and its errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refused {
    /// Creating the namespaces themselves.
    Namespaces(Errno),
    /// A call of the setup in the new namespaces ([`STEPS`]) answered with an error: podman's
    /// default seccomp profile refuses sethostname, Docker's and containerd's most of them.
    Step(&'static str, Errno),
    /// A call of the setup killed the process (a filter's KILL action, systemd's
    /// `SystemCallFilter=` default): the signal.
    Killed(&'static str, i32),
    /// A call of the setup did not return within [`PROBE_LIMIT`] (a filter handing it to a
    /// supervisor that never answers): the probe was killed.
    Hung(&'static str),
}

/// How long the probe of the setup's calls may take (it takes about 20 ms).
pub(super) const PROBE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The calls each role's setup makes in its new namespaces, and the helpers that join them,
/// in the order doctor tries them, with the forms the setup uses (a recursive bind, a
/// superblock remount, a recursive mount_setattr, setns into a user, a mount and a network
/// namespace, the loopback's ioctl, a Landlock rule, a seccomp filter) (found by review: a
/// profile refusing one of them, or killing on it, passed doctor, and run then failed with a
/// message that did not name the profile, or named the wrong cause: "another host user's
/// files"). Every start's `run` makes them too, through [`super::required`].
pub(super) const STEPS: [&str; 31] = [
    "close_range",
    "setsid",
    "prctl (PR_SET_PDEATHSIG)",
    "setgroups",
    "sethostname",
    "mount",
    "mount (bind)",
    "mount (move)",
    "mount (remount)",
    "mount_setattr",
    "setns (network namespace)",
    "unshare (network namespace)",
    "unshare (mount namespace)",
    "ioctl (SIOCSIFFLAGS: the loopback up)",
    "memfd_create",
    "sendfile",
    "pivot_root",
    "umount2",
    "prlimit64 (setrlimit)",
    "prctl (PR_SET_DUMPABLE)",
    "prctl (PR_SET_KEEPCAPS)",
    "setresgid",
    "setresuid",
    "capset (every capability dropped)",
    "landlock (create_ruleset, add_rule, restrict_self)",
    "seccomp",
    // Only some configs make these (tried last, each in a child of its own; what a refusal
    // means is the config's, Needs).
    CLONE3,
    LISTENER,
    // The helpers' join of a role's namespaces (a wipe, new egress listeners, a role's clone).
    "setns (user namespace)",
    "setns (mount namespace)",
    // The role's clone from there, into its own namespaces.
    "clone (a role's namespaces)",
];

/// The steps only some configs make: cgroup leaves (each role cloned into its own), and
/// `log_refused_syscalls` (a filter with a listener; a filter above sealnode that has one
/// already makes the kernel answer EBUSY).
pub(super) const CLONE3: &str = "clone3";
pub(super) const LISTENER: &str = "seccomp (a filter with a listener)";
/// The parent's part: each cell's id maps (rootful, mapping ids needs CAP_SETUID, CAP_SETGID),
/// and the namespaces held as a cell's are.
pub(super) const MAPS: &str = "writing uid_map and gid_map";
pub(super) const OPEN_NS: &str = "open (/proc/PID/ns)";
/// No step said: the namespaces' creation itself.
pub(super) const SETUP: &str = "the namespaces' setup";

/// How long the whole probe may take (its two processes, each bounded by [`PROBE_LIMIT`], and
/// the optional steps) before it is killed and told as held: the namespaces' clone itself can be
/// held too (found by review: `run` hung there, its stop signals blocked).
pub(super) const WHOLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A report's markers after a step's number: the step failed (the probe stops), or an
/// optional step failed (it goes on); 4 bytes of errno follow either.
pub(super) const FAILED: u8 = 0xff;
pub(super) const OPTIONAL_FAILED: u8 = 0xfe;
/// An optional step's child was killed by a signal (4 bytes of it follow), or held past
/// [`OPTIONAL_LIMIT`] (4 bytes of 0 follow).
pub(super) const OPTIONAL_KILLED: u8 = 0xfd;
pub(super) const OPTIONAL_HUNG: u8 = 0xfc;

/// How long an optional step's child may take before it is killed and told as held.
pub(super) const OPTIONAL_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The id a rootful probe maps in place of a role's user, where it can, and the kernel's
/// overflow id (what an id its namespace does not map reads as), which it never is.
pub(super) const STAND_IN: u32 = 65533;
pub(super) const OVERFLOW: u32 = 65534;

/// An id to map in a rootful probe without a config, in place of a role's user: one this
/// process's own user namespace maps (`map`: its uid_map or gid_map), never 0 (mapping host
/// root needs CAP_SETFCAP, which the unit does not give) nor the overflow id 65534 (what an
/// unmapped id reads as: a faked setresuid would read back as it; found by review): 65533
/// where it is mapped (a host, a container of 65536 ids), else the highest other one mapped.
pub(super) fn stand_in_id(map: &str) -> u32 {
    let ranges: Vec<(u64, u64)> = map
        .lines()
        .filter_map(|l| {
            let f: Vec<u64> = l.split_whitespace().filter_map(|n| n.parse().ok()).collect();
            (f.len() == 3 && f[2] > 0).then(|| (f[0], f[0] + f[2] - 1))
        })
        .collect();
    let mapped = |id: u64| ranges.iter().any(|(lo, hi)| (*lo..=*hi).contains(&id));
    if mapped(u64::from(STAND_IN)) {
        return STAND_IN;
    }
    let overflow = u64::from(OVERFLOW);
    ranges
        .iter()
        .map(|(_, hi)| if *hi == overflow { hi - 1 } else { *hi })
        .filter(|id| *id > 0 && *id != overflow && mapped(*id))
        .max()
        .and_then(|id| u32::try_from(id).ok())
        .unwrap_or(STAND_IN)
}

/// How a probe process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    Exited(i32),
    Signaled(i32),
    /// Held past [`PROBE_LIMIT`] (then killed).
    Hung,
    Unknown,
}

pub(super) fn step_name(n: Option<u8>) -> &'static str {
    n.and_then(|n| STEPS.get(usize::from(n)).copied()).unwrap_or(SETUP)
}

/// What a probe's reports (`said`) and its end mean: the optional steps refused, or the
/// step that stopped it. A probe killed or held at an optional step is that step's refusal.
pub(super) fn verdict(said: &[u8], end: End) -> Result<Vec<Refused>, Refused> {
    let mut optional = Vec::new();
    let mut last = None;
    let mut i = 0;
    while let Some(&b) = said.get(i) {
        if [FAILED, OPTIONAL_FAILED, OPTIONAL_KILLED, OPTIONAL_HUNG].contains(&b) {
            let e = said.get(i + 1..i + 5).and_then(|b| b.try_into().ok()).map_or(0, i32::from_le_bytes);
            let r = match b {
                OPTIONAL_KILLED => Refused::Killed(step_name(last), e),
                OPTIONAL_HUNG => Refused::Hung(step_name(last)),
                _ => Refused::Step(step_name(last), Errno::from_raw(e)),
            };
            if b == FAILED {
                return Err(r);
            }
            optional.push(r);
            i += 5;
        } else {
            last = Some(b);
            i += 1;
        }
    }
    let stopped = match end {
        End::Exited(0) => return Ok(optional),
        End::Hung => Refused::Hung(step_name(last)),
        End::Signaled(sig) => Refused::Killed(step_name(last), sig),
        End::Exited(_) | End::Unknown => Refused::Step(step_name(last), Errno::EIO),
    };
    if [CLONE3, LISTENER].contains(&step_name(last)) {
        optional.push(stopped);
        return Ok(optional);
    }
    Err(stopped)
}

/// Each step's report, written by a probe process: its number before its call (a kill leaves
/// it the last said), then [`FAILED`] or [`OPTIONAL_FAILED`] with the errno when it fails.
pub(super) struct Reporter(std::os::fd::OwnedFd);

impl Reporter {
    fn say(&self, name: &str) {
        let n = STEPS.iter().position(|s| *s == name).unwrap_or(0) as u8;
        let _ = nix::unistd::write(&self.0, &[n]);
    }

    fn failed(&self, marker: u8, e: i32) {
        let mut b = [marker; 5];
        b[1..].copy_from_slice(&e.to_le_bytes());
        let _ = nix::unistd::write(&self.0, &b);
    }

    /// A step every start needs: the probe stops at its failure.
    fn step(&self, name: &str, call: &dyn Fn() -> Result<(), Errno>) {
        self.say(name);
        if let Err(e) = call() {
            self.failed(FAILED, e as i32);
            sys::exit_now(1);
        }
    }

    /// A step only some configs need, in a child of its own (found by review: one killed or
    /// held hid the next): the probe goes on past its failure, kill or hold.
    fn optional(&self, name: &str, call: &dyn Fn() -> Result<(), Errno>) {
        self.say(name);
        // SAFETY: the probe is single-threaded; the child makes the call and _exits.
        let child = match unsafe { nix::unistd::fork() } {
            Ok(nix::unistd::ForkResult::Child) => sys::exit_now(call().map_or_else(|e| e as i32, |()| 0)),
            Ok(nix::unistd::ForkResult::Parent { child }) => child,
            Err(e) => return self.failed(OPTIONAL_FAILED, e as i32),
        };
        match ended_within(child, OPTIONAL_LIMIT) {
            Ended::Exited(0) => {}
            Ended::Exited(e) => self.failed(OPTIONAL_FAILED, e),
            Ended::Killed(sig) => self.failed(OPTIONAL_KILLED, sig as i32),
            Ended::Hung => self.failed(OPTIONAL_HUNG, 0),
            Ended::Unknown(e) => self.failed(OPTIONAL_FAILED, e as i32),
        }
    }
}

/// Read a probe process's reports until it closes its end or [`PROBE_LIMIT`] passes (then it
/// is killed), reap it, and say what its reports mean.
pub(super) fn collect(child: nix::unistd::Pid, r: std::os::fd::OwnedFd) -> Result<Vec<Refused>, Refused> {
    let (said, end) = read_within(&r, PROBE_LIMIT);
    let hung = end == Read::TimedOut;
    if hung {
        let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
    }
    let end = match nix::sys::wait::waitpid(child, None) {
        _ if hung => End::Hung,
        Ok(nix::sys::wait::WaitStatus::Exited(_, code)) => End::Exited(code),
        Ok(nix::sys::wait::WaitStatus::Signaled(_, sig, _)) => End::Signaled(sig as i32),
        _ => End::Unknown,
    };
    verdict(&said, end)
}

/// Create every namespace a role uses, with the id maps a cell gets, and in a child there make
/// each call of [`STEPS`], as each role's setup does; then join them from another process, as
/// the supervisor's helpers do: what a container's seccomp profile may refuse or kill. The
/// optional steps' refusals are returned.
pub(super) fn try_namespaces(ids: Option<[crate::config::Ids; 2]>) -> Result<Vec<Refused>, Refused> {
    let landlock = sys::landlock_abi() >= 1;
    let rootful = nix::unistd::geteuid().is_root();
    // An allow-all filter, installed as each role's is (its content is not what is tried).
    let allow_all: seccompiler::BpfProgram = vec![seccompiler::sock_filter {
        code: (libc::BPF_RET | libc::BPF_K) as u16,
        jt: 0,
        jf: 0,
        k: libc::SECCOMP_RET_ALLOW,
    }];
    // The roles' ids, as the cell maps them; without a config, rootless the caller's own,
    // rootful an unprivileged id its user namespace maps (never root, as a cell never does).
    let own = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let (uids, gids) = match (ids, rootful) {
        (Some(ids), _) => (ids.map(|i| i.uid).to_vec(), ids.map(|i| i.gid).to_vec()),
        (None, true) => (vec![stand_in_id(&own("/proc/self/uid_map"))], vec![stand_in_id(&own("/proc/self/gid_map"))]),
        (None, false) => (vec![nix::unistd::geteuid().as_raw()], vec![nix::unistd::getegid().as_raw()]),
    };
    let role = (nix::unistd::Uid::from_raw(uids[0]), nix::unistd::Gid::from_raw(gids[0]));
    let (r, w) = nix::unistd::pipe().map_err(Refused::Namespaces)?;
    let (maps_r, maps_w) = nix::unistd::pipe().map_err(Refused::Namespaces)?;
    // SAFETY: doctor is single-threaded; the child only makes system calls and _exits.
    let pid = unsafe { sys::clone_fork(crate::sandbox::namespaces::NAMESPACES) }.map_err(Refused::Namespaces)?;
    if pid == 0 {
        drop((r, maps_w));
        use std::os::fd::AsRawFd;
        let keep = [w.as_raw_fd(), maps_r.as_raw_fd()];
        let p = Reporter(w);
        // Never left behind (found by review: a probe held by a filter outlived a killed run;
        // then, with the death signal faked too; then, held before it was armed): armed first,
        // read back, said once the parent holds the namespaces.
        let armed = sys::die_with_parent();
        // The parent writes the id maps, as a cell's are, while this waits (it must not be
        // gone before its namespaces are opened); EOF: the parent is gone.
        if !matches!(nix::unistd::read(&maps_r, &mut [0u8; 1]), Ok(1)) {
            sys::exit_now(1);
        }
        p.step("prctl (PR_SET_PDEATHSIG)", &|| armed);
        // As each role's first steps: nothing inherited kept, a session of its own.
        p.step("close_range", &|| sys::close_all_except(&keep));
        p.step("setsid", &sys::new_session);
        // What the kernel shows of this process, after its root is gone too.
        let procfs = match open_ns("/proc") {
            Ok(fd) => fd,
            Err(_) => sys::exit_now(1),
        };
        use nix::mount::{mount, MsFlags};
        use nix::sched::CloneFlags;
        let none = None::<&str>;
        // Rootful, each role sheds root's groups in the cell (read back).
        if rootful {
            p.step("setgroups", &sys::clear_groups);
        }
        p.step("sethostname", &|| sys::set_hostname("sealnode-doctor"));
        // Private first: nothing done here reaches the mount namespace doctor came from.
        // Each mount read back as the kernel shows it, as a role's setup reads its own back.
        p.step("mount", &|| {
            mount(none, "/", none, MsFlags::MS_REC | MsFlags::MS_PRIVATE, none).and_then(|()| sys::no_propagation())
        });
        // As a role's root tmpfs is mounted (nosuid, nodev), read back as a new mount there.
        p.step("mount", &|| {
            let before = sys::mount_id(c"/tmp")?;
            let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
            mount(Some("tmpfs"), "/tmp", Some("tmpfs"), flags, Some("size=4k"))?;
            let attrs = sys::MOUNT_ATTR_NOSUID | sys::MOUNT_ATTR_NODEV;
            sys::mounted(c"/tmp", before, Some(nix::sys::statfs::TMPFS_MAGIC), attrs).map(drop)
        });
        p.step("mount (bind)", &|| {
            let before = sys::mount_id(c"/tmp")?;
            mount(Some("/tmp"), "/tmp", none, MsFlags::MS_BIND | MsFlags::MS_REC, none)?;
            sys::mounted(c"/tmp", before, None, 0).map(drop)
        });
        // As each bind is moved from its stage onto its destination (read back: the same mount
        // now shows there).
        p.step("mount (move)", &|| {
            // Made with the role's fs ids, as the setup makes its mount points (kuid 0 is
            // unmapped in a cell: creating a file as it fails with EOVERFLOW).
            let mode = nix::sys::stat::Mode::from_bits_truncate(0o700);
            let (fsuid, fsgid) = (nix::unistd::setfsuid(role.0), nix::unistd::setfsgid(role.1));
            let made = nix::unistd::mkdir(c"/tmp/stage", mode).and_then(|()| nix::unistd::mkdir(c"/tmp/dst", mode));
            nix::unistd::setfsuid(fsuid);
            nix::unistd::setfsgid(fsgid);
            made?;
            let before = sys::mount_id(c"/tmp/stage")?;
            mount(Some("tmpfs"), "/tmp/stage", Some("tmpfs"), MsFlags::empty(), Some("size=4k"))?;
            let id = sys::mounted(c"/tmp/stage", before, Some(nix::sys::statfs::TMPFS_MAGIC), 0)?;
            mount(Some("/tmp/stage"), "/tmp/dst", none, MsFlags::MS_MOVE, none)?;
            if sys::mount_id(c"/tmp/dst")? != id {
                return Err(nix::errno::Errno::EOPNOTSUPP);
            }
            Ok(())
        });
        // As the sealed copy of a role's program is made read-only at its superblock.
        p.step("mount (remount)", &|| {
            let ro = MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_NOSUID | MsFlags::MS_NODEV;
            mount(none, "/tmp", none, ro, none)?;
            sys::has_attrs(c"/tmp", sys::MOUNT_ATTR_RDONLY)
        });
        p.step("mount_setattr", &|| sys::mount_setattr(c"/tmp", sys::MOUNT_ATTR_NOSUID, true));
        // Its own network namespace again (read back): the helpers join a role's this way.
        p.step("setns (network namespace)", &|| {
            sys::setns_verified(std::os::fd::AsFd::as_fd(&open_ns("/proc/self/ns/net")?), CloneFlags::CLONE_NEWNET)
        });
        // A network namespace of its own, as the cell makes the engine's, and its loopback up;
        // a mount namespace of its own, as the cell makes for capped scratch (both read back).
        p.step("unshare (network namespace)", &|| sys::unshare_verified(CloneFlags::CLONE_NEWNET));
        p.step("unshare (mount namespace)", &|| sys::unshare_verified(CloneFlags::CLONE_NEWNS));
        p.step("ioctl (SIOCSIFFLAGS: the loopback up)", &sys::loopback_up);
        // A role's program is copied into a sealed file with sendfile.
        let memfd = || nix::sys::memfd::memfd_create(c"sealnode-doctor", nix::sys::memfd::MFdFlags::MFD_CLOEXEC);
        p.step("memfd_create", &|| memfd().map(drop));
        p.step("sendfile", &|| {
            let (from, to) = (memfd()?, memfd()?);
            nix::unistd::write(&from, b"x")?;
            nix::sys::sendfile::sendfile(&to, &from, Some(&mut 0), 1).map(drop)
        });
        p.step("pivot_root", &|| nix::unistd::chdir("/tmp").and_then(|()| sys::pivot_root(c".", c".")));
        p.step("umount2", &|| nix::mount::umount2(".", nix::mount::MntFlags::MNT_DETACH));
        // Each limit a role's setup sets (a filter can key on the resource), at its value now.
        p.step("prlimit64 (setrlimit)", &|| {
            crate::sandbox::plan::RLIMITS.into_iter().try_for_each(|r| {
                let (soft, hard) = nix::sys::resource::getrlimit(r)?;
                nix::sys::resource::setrlimit(r, soft, hard)
            })
        });
        p.step("prctl (PR_SET_DUMPABLE)", &|| {
            sys::prctl(libc::PR_SET_DUMPABLE, 0).and_then(|()| sys::prctl(libc::PR_SET_DUMPABLE, 1))
        });
        // The role's ids, capabilities kept for the drop that follows, as each role's init does.
        p.step("prctl (PR_SET_KEEPCAPS)", &|| sys::prctl(libc::PR_SET_KEEPCAPS, 1));
        p.step("setresgid", &|| sys::set_gids(role.1.as_raw()));
        p.step("setresuid", &|| sys::set_uids(role.0.as_raw()));
        p.step("capset (every capability dropped)", &crate::sandbox::caps::drop_all);
        if landlock {
            p.step("landlock (create_ruleset, add_rule, restrict_self)", &sys::landlock_restrict_probe);
        }
        // Read back: one filter more than before (found by review: a faked seccomp passed).
        let filters =
            || status_at(&procfs, "Seccomp_filters").and_then(|n| n.parse::<u32>().map_err(|_| Errno::EOPNOTSUPP));
        p.step("seccomp", &|| {
            let before = filters()?;
            seccompiler::apply_filter(&allow_all).map_err(|e| match e {
                seccompiler::Error::Prctl(io) | seccompiler::Error::Seccomp(io) => {
                    Errno::from_raw(io.raw_os_error().unwrap_or(libc::EINVAL))
                }
                _ => Errno::EINVAL,
            })?;
            if filters()? != before + 1 {
                return Err(Errno::EOPNOTSUPP);
            }
            Ok(())
        });
        p.optional(CLONE3, &|| {
            // SAFETY: the probe's child is single-threaded; the clone only exits.
            match unsafe { sys::clone3(0, None) }? {
                0 => sys::exit_now(0),
                pid => nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid), None).map(drop),
            }
        });
        p.optional(LISTENER, &|| {
            let fd = sys::seccomp_with_listener(&allow_all)?;
            // Read back: a listener, not a made-up number (found by review: a faked call
            // answered fd 0).
            let is = nix::fcntl::readlinkat(&procfs, format!("thread-self/fd/{fd}").as_str())
                .is_ok_and(|l| l.to_string_lossy().starts_with("anon_inode:seccomp notify"));
            if fd <= 2 || !is {
                return Err(Errno::EOPNOTSUPP);
            }
            Ok(())
        });
        sys::exit_now(0);
    }
    drop((w, maps_r));
    let child = nix::unistd::Pid::from_raw(pid);
    // Held as a cell's are, before it is released: the helper joins them after it exits.
    let held = (|| {
        let ns = |name: &str| open_ns(&format!("/proc/{pid}/ns/{name}")).map_err(|e| (OPEN_NS, e));
        let held = (ns("user")?, ns("mnt")?, ns("net")?);
        crate::sandbox::idmap::write(child, &uids, &gids, rootful).map_err(|e| match e {
            crate::error::Error::Io { source, .. } => {
                (MAPS, Errno::from_raw(source.raw_os_error().unwrap_or(libc::EIO)))
            }
            _ => (MAPS, Errno::EIO),
        })?;
        Ok(held)
    })();
    let (userns, mntns, netns) = match held {
        Ok(held) => held,
        Err((what, e)) => {
            let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(child, None);
            return Err(Refused::Step(what, e));
        }
    };
    let _ = nix::unistd::write(&maps_w, &[1]);
    drop(maps_w);
    let refused = collect(child, r)?;
    // A helper joins them from here, as a wipe, new egress listeners or a role's clone does.
    let (r, w) = nix::unistd::pipe().map_err(Refused::Namespaces)?;
    // SAFETY: doctor is single-threaded; the child only makes system calls and _exits.
    match unsafe { nix::unistd::fork() }.map_err(Refused::Namespaces)? {
        nix::unistd::ForkResult::Child => {
            drop(r);
            let p = Reporter(w);
            use nix::sched::CloneFlags;
            use std::os::fd::AsFd;
            p.step("prctl (PR_SET_PDEATHSIG)", &sys::die_with_parent);
            p.step("setns (user namespace)", &|| sys::setns_verified(userns.as_fd(), CloneFlags::CLONE_NEWUSER));
            p.step("setns (mount namespace)", &|| sys::setns_verified(mntns.as_fd(), CloneFlags::CLONE_NEWNS));
            p.step("setns (network namespace)", &|| sys::setns_verified(netns.as_fd(), CloneFlags::CLONE_NEWNET));
            // As a role is cloned from there into its own namespaces: by an intermediate, with
            // CLONE_PARENT, so the clone is this helper's child to reap (as a role is the
            // supervisor's). The intermediate's death by a signal is this helper's too, so
            // the step is told killed as any other.
            p.step("clone (a role's namespaces)", &|| {
                use nix::sys::wait::{waitpid, WaitStatus};
                // SAFETY: the helper is single-threaded; the intermediate only clones and _exits,
                // the clone only _exits.
                let inter = match unsafe { nix::unistd::fork() }? {
                    nix::unistd::ForkResult::Child => {
                        let flags = libc::CLONE_PARENT | crate::sandbox::namespaces::ROLE_NAMESPACES;
                        // SAFETY: the intermediate is single-threaded (a fresh fork).
                        sys::exit_now(match unsafe { sys::clone_fork(flags) } {
                            Ok(0) => sys::exit_now(0),
                            Ok(_) => 0,
                            Err(e) => e as i32,
                        })
                    }
                    nix::unistd::ForkResult::Parent { child } => child,
                };
                let status = waitpid(inter, None)?;
                // The clone, if it was made (this helper's only other child).
                while waitpid(None, None).is_ok() {}
                match status {
                    WaitStatus::Exited(_, 0) => Ok(()),
                    WaitStatus::Exited(_, e) => Err(Errno::from_raw(e)),
                    WaitStatus::Signaled(_, sig, _) => {
                        let _ = nix::sys::signal::kill(nix::unistd::getpid(), sig);
                        Err(Errno::EINTR)
                    }
                    _ => Err(Errno::ECHILD),
                }
            });
            sys::exit_now(0)
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(w);
            collect(child, r).map(|more| refused.into_iter().chain(more).collect())
        }
    }
}

/// [`try_namespaces`] in a child of its own, bounded by [`WHOLE_LIMIT`]: its result comes back
/// over a pipe ([`encode`]); a child killed or held past the limit is told as held at the
/// namespaces' setup.
pub(super) fn try_namespaces_bounded(ids: Option<[crate::config::Ids; 2]>) -> Result<Vec<Refused>, Refused> {
    let (r, w) = nix::unistd::pipe().map_err(Refused::Namespaces)?;
    // SAFETY: doctor (and `run` at this point) is single-threaded; the child runs the probe,
    // writes its result and _exits.
    let child = match unsafe { nix::unistd::fork() }.map_err(Refused::Namespaces)? {
        nix::unistd::ForkResult::Child => {
            drop(r);
            let result = sys::die_with_parent()
                .map_err(|e| Refused::Step("prctl (PR_SET_PDEATHSIG)", e))
                .and_then(|()| try_namespaces(ids));
            let _ = sys::write_all(std::os::fd::AsRawFd::as_raw_fd(&w), &encode(&result));
            sys::exit_now(0)
        }
        nix::unistd::ForkResult::Parent { child } => child,
    };
    drop(w);
    let (said, end) = read_within(&r, WHOLE_LIMIT);
    let complete = end == Read::Closed;
    // Its end closed without a whole result: killed (found by review: a filter killing its
    // first call was told as a 30 s hang); else it is killed here, held past the limit.
    let ended = match complete {
        true => nix::sys::wait::waitpid(child, None).ok(),
        false => {
            let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(child, None);
            None
        }
    };
    match (complete.then(|| decode(&said)).flatten(), ended) {
        (Some(result), _) => result,
        (None, Some(nix::sys::wait::WaitStatus::Signaled(_, sig, _))) => Err(Refused::Killed(SETUP, sig as i32)),
        (None, _) => Err(Refused::Hung(SETUP)),
    }
}

/// Every name a refusal can carry, by number: the steps, then the parent's parts.
pub(super) fn names() -> impl Iterator<Item = &'static str> {
    STEPS.iter().copied().chain([MAPS, OPEN_NS, SETUP, "prctl (PR_SET_PDEATHSIG)"])
}

/// A probe's result as bytes: 1 (failed) or 0 (passed), then 6 bytes a refusal (its kind, its
/// name's number, its errno or signal), the stopping one first.
pub(super) fn encode(result: &Result<Vec<Refused>, Refused>) -> Vec<u8> {
    let one = |r: &Refused| {
        let (kind, name, value) = match *r {
            Refused::Namespaces(e) => (0u8, SETUP, e as i32),
            Refused::Step(n, e) => (1, n, e as i32),
            Refused::Killed(n, sig) => (2, n, sig),
            Refused::Hung(n) => (3, n, 0),
        };
        let at = names().position(|s| s == name).unwrap_or(0) as u8;
        let mut b = vec![kind, at];
        b.extend_from_slice(&value.to_le_bytes());
        b
    };
    match result {
        Err(r) => [vec![1], one(r)].concat(),
        Ok(optional) => std::iter::once(vec![0]).chain(optional.iter().map(one)).collect::<Vec<_>>().concat(),
    }
}

/// [`encode`]'s bytes back; None when they are not whole.
pub(super) fn decode(b: &[u8]) -> Option<Result<Vec<Refused>, Refused>> {
    let (&failed, rest) = b.split_first()?;
    if rest.len() % 6 != 0 {
        return None;
    }
    let refusals = rest
        .chunks(6)
        .map(|c| {
            let name = names().nth(usize::from(c[1]))?;
            let value = i32::from_le_bytes(c[2..6].try_into().ok()?);
            Some(match c[0] {
                0 => Refused::Namespaces(Errno::from_raw(value)),
                1 => Refused::Step(name, Errno::from_raw(value)),
                2 => Refused::Killed(name, value),
                3 => Refused::Hung(name),
                _ => return None,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    match (failed, refusals.as_slice()) {
        (1, [r]) => Some(Err(*r)),
        (0, _) => Some(Ok(refusals)),
        _ => None,
    }
}

/// A field of /proc/thread-self/status read through `procfs` (a descriptor of /proc, held
/// after the probe's root is gone).
pub(super) fn status_at(procfs: &std::os::fd::OwnedFd, field: &str) -> Result<String, Errno> {
    use std::io::Read;
    let fd = nix::fcntl::openat(
        procfs,
        "thread-self/status",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )?;
    let mut text = String::new();
    std::fs::File::from(fd)
        .read_to_string(&mut text)
        .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    sys::status_field(&text, field).map(str::to_string).ok_or(Errno::EOPNOTSUPP)
}

/// A namespace's file, opened as the cell holds one.
pub(super) fn open_ns(path: &str) -> Result<std::os::fd::OwnedFd, Errno> {
    nix::fcntl::open(path, nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
}
