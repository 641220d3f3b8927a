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

/// What a role's setup does first in its namespaces, as doctor tries it: a step and its errno.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refused {
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
const PROBE_LIMIT: std::time::Duration = std::time::Duration::from_secs(10);

/// The calls each role's setup makes in its new namespaces, and the helpers that join them,
/// in the order doctor tries them, with the forms the setup uses (a recursive bind, a
/// superblock remount, a recursive mount_setattr, setns into a user, a mount and a network
/// namespace, the loopback's ioctl, a Landlock rule, a seccomp filter) (found by review: a
/// profile refusing one of them, or killing on it, passed doctor, and run then failed with a
/// message that did not name the profile, or named the wrong cause: "another host user's
/// files"). Every start's `run` makes them too, through [`required`].
const STEPS: [&str; 31] = [
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
const CLONE3: &str = "clone3";
const LISTENER: &str = "seccomp (a filter with a listener)";
/// The parent's part: each cell's id maps (rootful, mapping ids needs CAP_SETUID, CAP_SETGID),
/// and the namespaces held as a cell's are.
const MAPS: &str = "writing uid_map and gid_map";
const OPEN_NS: &str = "open (/proc/PID/ns)";
/// No step said: the namespaces' creation itself.
const SETUP: &str = "the namespaces' setup";

/// How long the whole probe may take (its two processes, each bounded by [`PROBE_LIMIT`], and
/// the optional steps) before it is killed and told as held: the namespaces' clone itself can be
/// held too (found by review: `run` hung there, its stop signals blocked).
const WHOLE_LIMIT: std::time::Duration = std::time::Duration::from_secs(30);

/// A report's markers after a step's number: the step failed (the probe stops), or an
/// optional step failed (it goes on); 4 bytes of errno follow either.
const FAILED: u8 = 0xff;
const OPTIONAL_FAILED: u8 = 0xfe;
/// An optional step's child was killed by a signal (4 bytes of it follow), or held past
/// [`OPTIONAL_LIMIT`] (4 bytes of 0 follow).
const OPTIONAL_KILLED: u8 = 0xfd;
const OPTIONAL_HUNG: u8 = 0xfc;

/// How long an optional step's child may take before it is killed and told as held.
const OPTIONAL_LIMIT: std::time::Duration = std::time::Duration::from_secs(3);

/// The id a rootful probe maps in place of a role's user, where it can, and the kernel's
/// overflow id (what an id its namespace does not map reads as), which it never is.
const STAND_IN: u32 = 65533;
const OVERFLOW: u32 = 65534;

/// What a config asks of the setup beyond what every start needs (`None`: no config given;
/// doctor then warns where it would fail).
#[derive(Debug, Clone, Copy, Default)]
pub struct Needs {
    /// The Landlock ABI the policies need.
    pub min_abi: u8,
    /// Each role is cloned into its own cgroup leaf (clone3): per-role limits or the unit's
    /// delegated cgroup.
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

/// An id to map in a rootful probe without a config, in place of a role's user: one this
/// process's own user namespace maps (`map`: its uid_map or gid_map), never 0 (mapping host
/// root needs CAP_SETFCAP, which the unit does not give) nor the overflow id 65534 (what an
/// unmapped id reads as: a faked setresuid would read back as it; found by review): 65533
/// where it is mapped (a host, a container of 65536 ids), else the highest other one mapped.
fn stand_in_id(map: &str) -> u32 {
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
enum End {
    Exited(i32),
    Signaled(i32),
    /// Held past [`PROBE_LIMIT`] (then killed).
    Hung,
    Unknown,
}

fn step_name(n: Option<u8>) -> &'static str {
    n.and_then(|n| STEPS.get(usize::from(n)).copied()).unwrap_or(SETUP)
}

/// What a probe's reports (`said`) and its end mean: the optional steps refused, or the
/// step that stopped it. A probe killed or held at an optional step is that step's refusal.
fn verdict(said: &[u8], end: End) -> Result<Vec<Refused>, Refused> {
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
struct Reporter(std::os::fd::OwnedFd);

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

/// How a child of a probe ended, waited for within a bound.
enum Ended {
    Exited(i32),
    Killed(nix::sys::signal::Signal),
    /// Still there at the bound: killed (SIGKILL) and reaped.
    Hung,
    /// waitpid failed.
    Unknown(Errno),
}

/// Wait for `child` (polled, so that nothing else of the caller's waits on a signal) for up
/// to `limit`; past it the child is killed and reaped.
fn ended_within(child: nix::unistd::Pid, limit: std::time::Duration) -> Ended {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    let until = std::time::Instant::now() + limit;
    loop {
        match waitpid(child, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::StillAlive) if std::time::Instant::now() < until => {
                std::thread::sleep(std::time::Duration::from_millis(2))
            }
            Ok(WaitStatus::StillAlive) => {
                let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                let _ = waitpid(child, None);
                return Ended::Hung;
            }
            Ok(WaitStatus::Exited(_, e)) => return Ended::Exited(e),
            Ok(WaitStatus::Signaled(_, sig, _)) => return Ended::Killed(sig),
            Ok(_) | Err(Errno::EINTR) => {}
            Err(e) => return Ended::Unknown(e),
        }
    }
}

/// How reading a probe's pipe ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Read {
    /// Its writers closed it: everything said was read.
    Closed,
    TimedOut,
    Failed,
}

/// All that is written to `r` until its writers close it, or `limit` passes.
fn read_within(r: &std::os::fd::OwnedFd, limit: std::time::Duration) -> (Vec<u8>, Read) {
    let mut said = Vec::new();
    let mut buf = [0u8; 256];
    let until = std::time::Instant::now() + limit;
    loop {
        match sys::readable_by(std::os::fd::AsFd::as_fd(r), until) {
            Ok(false) => return (said, Read::TimedOut),
            Err(_) => return (said, Read::Failed),
            Ok(true) => match nix::unistd::read(r, &mut buf) {
                Ok(0) => return (said, Read::Closed),
                Err(Errno::EINTR) => continue,
                Err(_) => return (said, Read::Failed),
                Ok(n) => said.extend_from_slice(&buf[..n]),
            },
        }
    }
}

/// Read a probe process's reports until it closes its end or [`PROBE_LIMIT`] passes (then it
/// is killed), reap it, and say what its reports mean.
fn collect(child: nix::unistd::Pid, r: std::os::fd::OwnedFd) -> Result<Vec<Refused>, Refused> {
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
fn try_namespaces(ids: Option<[crate::config::Ids; 2]>) -> Result<Vec<Refused>, Refused> {
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
fn try_namespaces_bounded(ids: Option<[crate::config::Ids; 2]>) -> Result<Vec<Refused>, Refused> {
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
fn names() -> impl Iterator<Item = &'static str> {
    STEPS.iter().copied().chain([MAPS, OPEN_NS, SETUP, "prctl (PR_SET_PDEATHSIG)"])
}

/// A probe's result as bytes: 1 (failed) or 0 (passed), then 6 bytes a refusal (its kind, its
/// name's number, its errno or signal), the stopping one first.
fn encode(result: &Result<Vec<Refused>, Refused>) -> Vec<u8> {
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
fn decode(b: &[u8]) -> Option<Result<Vec<Refused>, Refused>> {
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
fn status_at(procfs: &std::os::fd::OwnedFd, field: &str) -> Result<String, Errno> {
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
fn open_ns(path: &str) -> Result<std::os::fd::OwnedFd, Errno> {
    nix::fcntl::open(path, nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
}

/// Each option a container needs for sealnode, named as its runtime spells it.
struct Options {
    userns: &'static str,
    seccomp: &'static str,
    proc: &'static str,
    cgroup: &'static str,
    caps: &'static str,
}

fn options(c: &crate::os::container::Container) -> Options {
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
            "each role is cloned straight into its own cgroup leaf with clone3 (per-role limits, cell.cgroup, the unit's delegated cgroup)",
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

/// Whether the container's root is the host's root (`uid_map`: this process's
/// /proc/self/uid_map). Refused (found by review): /proc must be unmasked for sealnode, and with
/// it the container's root (any process `exec`'d in the container, a `--privileged` one, or a
/// compromised sealnode) could write the host's sysctls (a pipe in `kernel.core_pattern` runs
/// as host root) and /proc/sysrq-trigger.
fn container_userns(uid_map: &str, o: &Options) -> Check {
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
fn container_caps(root: bool, o: &Options) -> Option<Check> {
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
fn host_hardening(opts: Option<&Options>) -> Vec<Check> {
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

/// Whether the denial log can take the roles' seccomp listeners, where a role of `cfg` logs
/// its refused calls: the supervisor copies each with pidfd_getfd, which systemd's `@debug`
/// set holds (the units deny it unless a drop-in allows it). Tried as the supervisor makes it
/// ([`pidfd_getfd_tried`]): `run` and a reload refuse here, before anything starts or stops
/// (found by a docs audit: the spawn failed once the engine ran, exit 1, which the unit
/// restarts), and `check` reports it.
pub fn denial_log(cfg: &crate::config::Config) -> Option<std::result::Result<(), String>> {
    if !crate::config::Role::ALL.iter().any(|r| cfg.role(*r).log_refused_syscalls) {
        return None;
    }
    Some(pidfd_getfd_tried().map_err(|e| {
        format!(
            "pidfd_getfd {e}: under the systemd units, allow it with a drop-in for the unit that runs this \
             config: [Service] SystemCallFilter=pidfd_getfd (or turn log_refused_syscalls off)"
        )
    }))
}

/// How long [`pidfd_getfd_tried`] waits for its answer: an honest call returns in
/// microseconds, and a reload waits for it in the event loop (found by review: a filter that
/// held the call stalled the loop for the 5 s this was).
const PIDFD_GETFD_LIMIT: std::time::Duration = std::time::Duration::from_secs(2);

/// pidfd_getfd as the supervisor makes it to take a role's listener: on another process of
/// this one's making that holds the fd (found by review: tried on itself, the kernel hands a
/// process its own fds without the ptrace checks Yama or an LSM make, and a filter keyed on
/// the fd number let fd 0 through), from a throwaway child, so that a filter that kills on the
/// call kills only that child (found by review: it killed `check`, and a running cell at a
/// reload) and one that holds it is bounded. Err: how it was refused.
fn pidfd_getfd_tried() -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let (_r, held) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| format!("not tried: pipe2: {e}"))?;
    let fd = held.as_raw_fd();
    let supervisor = nix::unistd::getpid();
    // SAFETY: the child makes raw system calls only (no allocation, no lock) and exits.
    let prober = match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            // Holding nothing of sealnode's and gone with it (found by review: a prober held
            // by a filter outlived a killed supervisor with its dir locks and sockets, and the
            // next start was refused), its signals as a fresh process's.
            let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            let _ = nix::sys::signal::sigprocmask(
                nix::sys::signal::SigmaskHow::SIG_SETMASK,
                Some(&nix::sys::signal::SigSet::empty()),
                None,
            );
            if fd > 3 {
                let _ = sys::close_range(3, fd as u32 - 1);
            }
            let _ = sys::close_range(fd as u32 + 1, u32::MAX);
            sys::exit_now(pidfd_getfd_of_a_child(fd, supervisor))
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
        Err(e) => return Err(format!("not tried: fork: {e}")),
    };
    match ended_within(prober, PIDFD_GETFD_LIMIT) {
        Ended::Exited(0) => Ok(()),
        Ended::Exited(e) => Err(format!("refused ({})", Errno::from_raw(e))),
        Ended::Killed(sig) => Err(format!("killed the process ({sig})")),
        Ended::Hung => Err(format!("did not return within {} s", PIDFD_GETFD_LIMIT.as_secs())),
        Ended::Unknown(e) => Err(format!("not tried: waitpid: {e}")),
    }
}

/// In the prober: a child that holds `fd` (as a role's workload holds its listener) and
/// waits; pidfd_getfd of that fd from it; the errno, or 0.
fn pidfd_getfd_of_a_child(fd: std::os::fd::RawFd, supervisor: nix::unistd::Pid) -> i32 {
    let prober = nix::unistd::getpid();
    if nix::unistd::getppid() != supervisor {
        // The supervisor went before the death signal was set.
        return libc::ESRCH;
    }
    // SAFETY: the child makes raw system calls only and never returns.
    let target = match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            // Gone with the prober, whatever ends it.
            let _ = sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            if nix::unistd::getppid() != prober {
                sys::exit_now(0);
            }
            loop {
                // SAFETY: pause takes no argument; it returns only for a handled signal.
                unsafe { libc::pause() };
            }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => child,
        Err(e) => return e as i32,
    };
    let tried = sys::pidfd_open(target.as_raw()).and_then(|p| sys::pidfd_getfd(&p, fd));
    let _ = nix::sys::signal::kill(target, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(target, None);
    match tried {
        Ok(_) => 0,
        Err(e) => e as i32,
    }
}

/// [`denial_log`] as a refusal: the start or reload does not go on.
pub fn denial_log_ready(cfg: &crate::config::Config) -> crate::error::Result<()> {
    match denial_log(cfg) {
        Some(Err(fix)) => Err(crate::error::Error::Unsupported {
            what: "the denial log (log_refused_syscalls): it takes each role's seccomp listener with pidfd_getfd"
                .into(),
            fix,
        }),
        _ => Ok(()),
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
