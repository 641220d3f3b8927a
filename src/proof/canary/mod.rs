//! Proof of isolation: a battery of escape attempts run inside each role's exact sandbox.
//!
//! [`SPECS`] lists every attempt: what it tries, which layers are expected to refuse it, and
//! which errno means which layer refused. The inside half ([`inside`]) performs the attempts;
//! this half classifies outcomes, runs the battery in a cell like `run` builds (preflight) or
//! standalone per layer (the layer matrix), and renders a table or versioned JSON.

pub mod ci_report;
pub mod inside;

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::os::unix::fs::MetadataExt;

use serde::Serialize;

use crate::config::{Config, Invoker, Role};
use crate::error::{Error, Result};
use crate::sandbox::cell::Cell;
use crate::sandbox::{self, Layers, Plan, Program};
pub use inside::{Ctx, Outcome};

/// Version of the canary JSON report (docs/canary.md).
pub const SCHEMA: u32 = 1;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    Seccomp,
    Landlock,
    /// Namespaces and the private mount view (absent paths, read-only and noexec mounts,
    /// masked /proc, loopback-only network, own pid namespace, no nested user namespaces).
    Namespaces,
    /// Role uid/gid, no capabilities, no_new_privs (and DAC that follows from them).
    Credentials,
    Rlimits,
    /// What the launcher hands over: only stdio, only the configured environment.
    Launcher,
    /// The host kernel's own rules, which refuse it even with every sealnode layer off and
    /// all capabilities of the sandbox's user namespace held (init-namespace privileges,
    /// host sysctls). Only the matrix reports it.
    Host,
}

impl Layer {
    pub fn name(self) -> &'static str {
        match self {
            Layer::Seccomp => "seccomp",
            Layer::Landlock => "landlock",
            Layer::Namespaces => "namespaces",
            Layer::Credentials => "credentials",
            Layer::Rlimits => "rlimits",
            Layer::Launcher => "launcher",
            Layer::Host => "host",
        }
    }
}

/// The layers the matrix can isolate (one column each).
pub const MATRIX_LAYERS: [Layer; 4] = [Layer::Seccomp, Layer::Landlock, Layer::Namespaces, Layer::Credentials];

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Roles {
    Both,
    Engine,
    Node,
}

#[derive(Debug, Clone, Copy)]
pub struct Spec {
    pub id: &'static str,
    pub category: &'static str,
    pub what: &'static str,
    /// Layers expected to refuse it (at least two, except the documented exceptions).
    pub expected: &'static [Layer],
    pub roles: Roles,
    /// errno -> the layer that answers with it, for this attempt. Any other errno means the
    /// call reached the kernel: the attempt was not refused. Empty for facts.
    pub refusals: &'static [(i32, Layer)],
    /// A fact rather than an action: "ok" means the fact is violated.
    pub fact: bool,
}

use libc::{
    EACCES, ECONNREFUSED, EIO, ENETUNREACH, ENODATA, ENOENT, ENOPROTOOPT, ENOSPC, ENOSYS, EOPNOTSUPP, EPERM,
    EPROTONOSUPPORT, EROFS, ESRCH, EXDEV,
};
use Layer::{Credentials as C, Landlock as L, Launcher as H, Namespaces as N, Rlimits as R, Seccomp as S};

const PRIV: &[(i32, Layer)] = &[(ENOSYS, S), (EPERM, C)];
const USERNS: &[(i32, Layer)] = &[(ENOSYS, S), (ENOSPC, N), (EPERM, C)];
const READ: &[(i32, Layer)] = &[(ENOENT, N), (ENODATA, N), (EACCES, L), (EPERM, C)];
const WRITE: &[(i32, Layer)] = &[(EROFS, N), (ENOENT, N), (EACCES, L), (EPERM, C)];
const SCOPE: &[(i32, Layer)] = &[(ENOSYS, S), (EPERM, L), (EACCES, L), (ESRCH, N)];
const NET: &[(i32, Layer)] = &[(ENOSYS, S), (ECONNREFUSED, N), (ENETUNREACH, N), (EACCES, L), (EPERM, L)];
/// TCP Fast Open: seccomp refuses the flag; the sandbox's netns has it switched off. Nothing
/// else counts: Landlock never sees it, and a refused connection would only say that nothing
/// listened (the matrix's host-netns baseline), not that Fast Open was closed.
const FASTOPEN: &[(i32, Layer)] = &[(ENOSYS, S), (EOPNOTSUPP, N)];
/// MPTCP: seccomp refuses the protocol; the sandbox's netns has it switched off (a kernel
/// without MPTCP answers EPROTONOSUPPORT: nothing to close).
const MPTCP: &[(i32, Layer)] = &[(ENOSYS, S), (ENOPROTOOPT, N), (EPROTONOSUPPORT, N)];
const FACT: &[(i32, Layer)] = &[];

const fn a(
    id: &'static str,
    category: &'static str,
    what: &'static str,
    expected: &'static [Layer],
    refusals: &'static [(i32, Layer)],
) -> Spec {
    Spec { id, category, what, expected, roles: Roles::Both, refusals, fact: false }
}
const fn f(id: &'static str, category: &'static str, what: &'static str, expected: &'static [Layer]) -> Spec {
    Spec { id, category, what, expected, roles: Roles::Both, refusals: FACT, fact: true }
}
const fn only(s: Spec, roles: Roles) -> Spec {
    Spec { roles, ..s }
}

/// The battery. Attempts listed in [`SINGLE_LAYER`] cannot have two independent layers.
pub const SPECS: &[Spec] = &[
    // credentials and capabilities
    f("caps_all_zero", "credentials", "any of the five capability sets non-empty", &[C]),
    f("no_new_privs", "credentials", "no_new_privs not set", &[C, S]),
    f("uid_not_root", "credentials", "running as uid 0", &[C, N]),
    a("setuid_root", "credentials", "setuid(0)", &[S, C, N], &[(ENOSYS, S), (EPERM, C), (libc::EINVAL, N)]),
    a("setgid_root", "credentials", "setgid(0)", &[S, C, N], &[(ENOSYS, S), (EPERM, C), (libc::EINVAL, N)]),
    a("setgroups_root", "credentials", "setgroups([0])", &[S, C, N], &[(ENOSYS, S), (EPERM, C), (libc::EINVAL, N)]),
    a("capset_raise", "credentials", "capset: raise every capability", &[S, C], PRIV),
    a("ambient_raise", "credentials", "raise an ambient capability", &[S, C], PRIV),
    a("securebits", "credentials", "change securebits", &[S, C], PRIV),
    // namespaces
    a("unshare_user", "namespaces", "unshare(CLONE_NEWUSER)", &[S, N], USERNS),
    a("clone_newuser", "namespaces", "clone(CLONE_NEWUSER)", &[S, N], USERNS),
    a("clone3_newuser", "namespaces", "clone3(CLONE_NEWUSER) (flags a filter cannot see)", &[S, N], USERNS),
    f("userns_own_ids_only", "namespaces", "the user namespace maps an id not the role's own (the other role's)", &[N]),
    a("unshare_net", "namespaces", "unshare(CLONE_NEWNET)", &[S, C], PRIV),
    a("unshare_mount", "namespaces", "unshare(CLONE_NEWNS)", &[S, C], PRIV),
    a("unshare_pid", "namespaces", "unshare(CLONE_NEWPID)", &[S, C], PRIV),
    a("setns_net", "namespaces", "setns into a network namespace", &[S, C], PRIV),
    // filesystem
    a("read_host_shadow", "filesystem", "read /etc/shadow", &[N, C], READ),
    a("list_root_home", "filesystem", "list /root", &[N, L, C], READ),
    a("read_config", "filesystem", "read sealnode's config file", &[N, L], READ),
    a(
        "read_attest_key",
        "filesystem",
        "read the attestation key (before attest init: list the state dir)",
        &[N, L, C],
        READ,
    ),
    a("read_foreign_paths", "filesystem", "read the other role's dirs and files", &[N, L], READ),
    // Before pivot_root: with every layer off (the matrix's baseline) a successful one moves
    // the probe's root, and the host's socket would then look absent.
    a(
        "unix_socket_in_view",
        "filesystem",
        "connect to a pathname unix socket (or open a FIFO) a host process listens on: any in the role's view, and one on the host",
        &[S, N],
        &[(ENOSYS, S), (ENOENT, N)],
    ),
    a("write_usr", "filesystem", "create a file in /usr (/usr/local/src)", &[N, L, C], WRITE),
    a("write_etc", "filesystem", "create a file in /etc (/etc/opt)", &[N, L, C], WRITE),
    only(a("write_models", "filesystem", "create a file in the model dir", &[N, L], WRITE), Roles::Engine),
    a("write_proc_sys", "filesystem", "open /proc/sys/kernel/hostname for writing", &[N, L, C], WRITE),
    a("sysrq_trigger", "filesystem", "open /proc/sysrq-trigger for writing", &[N, L, C], WRITE),
    a("read_kcore", "filesystem", "read /proc/kcore", &[N, C], READ),
    a(
        "exec_from_scratch",
        "filesystem",
        "write a program to scratch and execute it",
        &[N, L],
        &[(EACCES, L), (EROFS, N), (libc::ETXTBSY, N)],
    ),
    a(
        "symlink_escape",
        "filesystem",
        "symlink /etc/shadow into scratch and read it",
        &[S, N],
        &[(ENOSYS, S), (ENOENT, N), (EACCES, L), (ENODATA, N)],
    ),
    a(
        "hardlink_escape",
        "filesystem",
        "hard-link a system file into scratch",
        &[S, N, L],
        &[(ENOSYS, S), (EXDEV, N), (EACCES, L), (EPERM, C), (EROFS, N)],
    ),
    a(
        "mknod_device",
        "filesystem",
        "create a device node in scratch",
        &[S, C, L],
        &[(ENOSYS, S), (EPERM, C), (EACCES, L), (EROFS, N)],
    ),
    a("open_dev_mem", "filesystem", "open /dev/mem", &[N, L, C], READ),
    a("open_by_handle_at", "filesystem", "open_by_handle_at (the shocker escape)", &[S, C], PRIV),
    a(
        "proc_parent_root",
        "filesystem",
        "read the sandbox init's root through /proc/PID/root",
        &[C, L],
        &[(EACCES, L), (EPERM, C), (ENOENT, N)],
    ),
    a("mount_tmpfs", "filesystem", "mount(2) a tmpfs", &[S, C, L], &[(ENOSYS, S), (EPERM, C), (EACCES, L)]),
    a("fsopen", "filesystem", "new mount API: fsopen", &[S, C], PRIV),
    a("open_tree", "filesystem", "new mount API: open_tree(OPEN_TREE_CLONE)", &[S, C], PRIV),
    a("move_mount", "filesystem", "new mount API: move_mount", &[S, C], PRIV),
    a("mount_setattr", "filesystem", "clear the read-only flag of /", &[S, C], PRIV),
    a("umount_mask", "filesystem", "unmount the /proc/kcore mask", &[S, C], PRIV),
    a("chroot", "filesystem", "chroot", &[S, C], PRIV),
    a("pivot_root", "filesystem", "pivot_root", &[S, C], PRIV),
    // kernel attack surface
    a("bpf_map_create", "kernel", "bpf(BPF_MAP_CREATE)", &[S, C], PRIV),
    a("perf_event_open", "kernel", "perf_event_open", &[S, C], &[(ENOSYS, S), (EPERM, C), (EACCES, C)]),
    a("userfaultfd", "kernel", "userfaultfd", &[S, C], PRIV),
    a(
        "io_uring_setup",
        "kernel",
        "io_uring_setup (bypasses seccomp for its operations)",
        &[S],
        &[(ENOSYS, S), (EPERM, C)],
    ),
    a("keyctl_session", "kernel", "keyctl: new session keyring", &[S], PRIV),
    a("add_key", "kernel", "add_key to the process keyring", &[S], PRIV),
    a("init_module", "kernel", "init_module", &[S, C], PRIV),
    a("finit_module", "kernel", "finit_module", &[S, C], PRIV),
    a("delete_module", "kernel", "delete_module", &[S, C], PRIV),
    a("kexec_load", "kernel", "kexec_load", &[S, C], PRIV),
    a("kexec_file_load", "kernel", "kexec_file_load", &[S, C], PRIV),
    a("personality", "kernel", "personality(READ_IMPLIES_EXEC)", &[S], PRIV),
    a("syslog_read", "kernel", "read the kernel log (syslog)", &[S, C], PRIV),
    #[cfg(target_arch = "x86_64")]
    a("iopl", "kernel", "iopl(3)", &[S, C], PRIV),
    #[cfg(target_arch = "x86_64")]
    a("ioperm", "kernel", "ioperm", &[S, C], PRIV),
    a("reboot", "kernel", "reboot", &[S, C], PRIV),
    a("swapon", "kernel", "swapon", &[S, C], PRIV),
    a("ptrace_parent", "kernel", "ptrace the sandbox init", &[S, C, L], SCOPE),
    a("process_vm_readv_parent", "kernel", "read the sandbox init's memory", &[S, C, L], SCOPE),
    a("pidfd_getfd_parent", "kernel", "steal an fd from the sandbox init (pidfd_getfd)", &[S, C], SCOPE),
    // tty injection
    a("tiocsti", "tty", "TIOCSTI: push input into the terminal", &[S, C], &[(ENOSYS, S), (EPERM, C), (EIO, C)]),
    a(
        "tiocsti_high_bits",
        "tty",
        "TIOCSTI with the high 32 bits set (CVE-2019-10063)",
        &[S, C],
        &[(ENOSYS, S), (EPERM, C), (EIO, C)],
    ),
    a("tioclinux", "tty", "TIOCLINUX: console selection injection", &[S], PRIV),
    // compat syscall entry points
    #[cfg(target_arch = "x86_64")]
    a("int80_getpid", "compat", "i386 system call through int 0x80", &[S], PRIV),
    #[cfg(target_arch = "x86_64")]
    a("x32_getpid", "compat", "x32 system call number", &[S], PRIV),
    // sockets
    a("socket_raw", "sockets", "raw IPv4 socket", &[S, C], PRIV),
    a("socket_udp", "sockets", "UDP socket (Landlock's port rules cover TCP only)", &[S], PRIV),
    a("socket_packet", "sockets", "AF_PACKET socket", &[S, C], PRIV),
    a("socket_netlink", "sockets", "AF_NETLINK socket", &[S], PRIV),
    a("socket_alg", "sockets", "AF_ALG (kernel crypto) socket", &[S], PRIV),
    a("socket_vsock", "sockets", "AF_VSOCK socket", &[S], PRIV),
    a("socket_pfkey", "sockets", "AF_KEY socket", &[S, C], PRIV),
    a("socket_autoload", "sockets", "a family that autoloads a module (AF_APPLETALK)", &[S], PRIV),
    a("socket_mptcp", "sockets", "MPTCP socket (Landlock's port rules cover plain TCP only)", &[S, N], MPTCP),
    // network
    f("interfaces_only_lo", "network", "an interface other than lo", &[N]),
    a("host_loopback_service", "network", "connect to a service on the host's 127.0.0.1", &[N, L, S], NET),
    a("host_abstract_socket", "network", "connect to the host's abstract unix socket", &[N, L, S], NET),
    // The node only: the engine may listen on other ports of its own network namespace (an
    // Ollama runner), which nothing outside that namespace can reach.
    only(
        a("bind_other_port", "network", "listen on an undeclared port", &[L, S], &[(EACCES, L), (ENOSYS, S)]),
        Roles::Node,
    ),
    only(a("engine_connect", "network", "the engine connects anywhere (its own port)", &[S, L], NET), Roles::Engine),
    // The forwarders listen in the node's network namespace only: the engine's has none.
    only(a("engine_to_egress", "network", "the engine reaches an egress forwarder", &[S, L, N], NET), Roles::Engine),
    only(
        a(
            "engine_fastopen_egress",
            "network",
            "the engine reaches an egress forwarder with TCP Fast Open (no connect)",
            &[S, N],
            FASTOPEN,
        ),
        Roles::Engine,
    ),
    // cross-role
    f("see_foreign_processes", "cross-role", "processes outside the role are visible", &[N]),
    a("signal_foreign_processes", "cross-role", "signal a process outside the role", &[N, L, C], SCOPE),
    // resources
    f("core_dumps_off", "resources", "core dumps possible (RLIMIT_CORE > 0)", &[R]),
    f("rlimits_finite", "resources", "NOFILE, NPROC or FSIZE unlimited", &[R]),
    a("raise_hard_rlimit", "resources", "raise a hard rlimit", &[R, C], &[(EPERM, C), (ENOSYS, S)]),
    // environment and handover
    f("fds_beyond_stdio", "environment", "an fd beyond stdio was inherited", &[H]),
    f("unexpected_env", "environment", "a variable the config did not ask for", &[H]),
    f("proxy_env", "environment", "a proxy variable", &[H]),
];

/// Attempts that cannot be stopped by two independent layers, and why (docs/canary.md).
pub const SINGLE_LAYER: &[(&str, &str)] = &[
    ("uid_not_root", "uid 0 is never mapped into a sandbox's user namespace; it holds with every layer off"),
    ("write_proc_sys", "sysctl files belong to the initial namespace's root: the kernel's permission check refuses first, so the read-only /proc/sys and Landlock (both present) cannot be told apart"),
    ("proc_parent_root", "the sandbox init is not dumpable: the kernel's ptrace check refuses first, before Landlock's own ptrace restriction can be observed"),
    ("raise_hard_rlimit", "raising a hard limit needs CAP_SYS_RESOURCE in the initial user namespace, which nothing in a sandbox has; the limits themselves are the rlimits layer"),
    ("read_config", "the config holds no secret (the credential is a separate file); it is outside every role's view, and its directory is granted to the role only as /etc inside the sandbox"),
    ("caps_all_zero", "a fact about the credentials layer itself"),
    ("no_new_privs", "a fact about the credentials layer (seccomp also sets it, but it is the same bit)"),
    ("io_uring_setup", "unprivileged; only seccomp refuses it here (kernel.io_uring_disabled=2 on the host would add a layer)"),
    ("keyctl_session", "keyrings need no privilege; only seccomp refuses them"),
    ("add_key", "keyrings need no privilege; only seccomp refuses them"),
    ("personality", "needs no privilege; only seccomp refuses it"),
    ("tioclinux", "only seccomp; the role has no virtual console in its view either way"),
    ("int80_getpid", "the architecture check of the seccomp filter; ia32 emulation is a kernel build option"),
    ("x32_getpid", "only seccomp (and whether the kernel was built with x32)"),
    ("socket_udp", "Landlock restricts TCP ports only; seccomp refuses UDP sockets (nothing in a role needs UDP: the cell has no DNS)"),
    ("socket_netlink", "creating one needs no privilege; changing anything through it needs CAP_NET_ADMIN"),
    ("socket_alg", "AF_ALG is unprivileged; only seccomp refuses it"),
    ("socket_vsock", "unprivileged; only seccomp (and no vsock transport in the cell's netns)"),
    ("socket_autoload", "module autoload is triggered without privilege; only seccomp refuses it"),
    ("interfaces_only_lo", "a fact about the network namespace"),
    ("userns_own_ids_only", "a fact about the user namespace: each role's own maps only its ids"),
    ("see_foreign_processes", "visibility is the pid namespace's job"),
    ("core_dumps_off", "a fact about rlimits"),
    ("rlimits_finite", "a fact about rlimits"),
    ("fds_beyond_stdio", "a fact about what the launcher hands over"),
    ("unexpected_env", "a fact about what the launcher hands over"),
    ("proxy_env", "a fact about what the launcher hands over"),
];

/// Attempts a role's own policy leaves to one layer: with `connect_any` its Landlock rules do
/// not restrict TCP connect (the Ollama profile, whose server reaches its runners on random
/// loopback ports), so its own network namespace alone keeps it from the host's services and
/// the node's forwarders, and connecting to its own port is what the profile allows.
pub const CONNECT_ANY: &[&str] = &["host_loopback_service", "engine_connect", "engine_to_egress"];
pub const CONNECT_ANY_REASON: &str = "the role's Landlock rules leave TCP connect unrestricted (connect_any, the Ollama profile: its server reaches its runners on random loopback ports); its own network namespace is what keeps it from the host's services and the node's forwarders (docs/policies.md)";

/// Whether `role`'s Landlock rules leave TCP connect unrestricted (`connect_any`).
fn connects_anywhere(cfg: &Config, role: Role) -> Result<bool> {
    let (_, ll) = cfg.policy_files(role)?;
    Ok(crate::policy::landlock::Rules::from_loaded(&ll.bytes, &cfg.role(role).landlock)?.net.connect_any)
}

impl Spec {
    /// Whether this attempt is an escape for `role` under `cfg`. With `models_writable` the
    /// operator grants the engine its model dir (its statements then say the model digests do
    /// not bind), so writing there is no escape and is not attempted.
    pub fn applies(&self, cfg: &Config, role: Role) -> bool {
        let for_role =
            matches!((self.roles, role), (Roles::Both, _) | (Roles::Engine, Role::Engine) | (Roles::Node, Role::Node));
        for_role && !(self.id == "write_models" && cfg.role(role).models_writable)
    }

    /// Which layer refused this outcome, if it was refused.
    pub fn refused_by(&self, o: &Outcome) -> Option<Layer> {
        if o.signal == Some(libc::SIGSYS) {
            return Some(S);
        }
        if o.ok || o.signal.is_some() {
            return None;
        }
        if self.fact {
            return self.expected.first().copied();
        }
        let e = o.errno?;
        self.refusals.iter().find(|(x, _)| *x == e).map(|(_, l)| *l)
    }
}

pub fn errno_name(e: i32) -> String {
    format!("{:?}", nix::errno::Errno::from_raw(e))
}

#[derive(Debug, Clone, Serialize)]
pub struct AttemptResult {
    pub id: &'static str,
    pub category: &'static str,
    pub description: &'static str,
    /// "refused" or "succeeded" (a succeeded attempt is an escape: the sandbox failed).
    pub outcome: &'static str,
    pub errno: Option<i32>,
    pub errno_name: Option<String>,
    pub signal: Option<i32>,
    pub expected_layers: Vec<Layer>,
    pub refused_by: Option<Layer>,
}

#[derive(Debug, Clone, Serialize)]
pub struct RoleReport {
    pub role: Role,
    pub attempts: Vec<AttemptResult>,
    pub refused: usize,
    pub succeeded: usize,
}

#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: u32,
    pub sealnode_version: &'static str,
    pub roles: Vec<RoleReport>,
    /// True when no attempt succeeded in any role.
    pub passed: bool,
}

fn classify(cfg: &Config, role: Role, raw: &BTreeMap<String, Outcome>) -> RoleReport {
    let attempts: Vec<AttemptResult> = SPECS
        .iter()
        .filter(|s| s.applies(cfg, role))
        .map(|s| {
            let o = raw.get(s.id).copied().unwrap_or(Outcome { ok: true, errno: None, signal: None });
            let by = s.refused_by(&o);
            AttemptResult {
                id: s.id,
                category: s.category,
                description: s.what,
                outcome: if by.is_some() { "refused" } else { "succeeded" },
                errno: o.errno,
                errno_name: o.errno.map(errno_name),
                signal: o.signal,
                expected_layers: s.expected.to_vec(),
                refused_by: by,
            }
        })
        .collect();
    let refused = attempts.iter().filter(|a| a.refused_by.is_some()).count();
    RoleReport { role, succeeded: attempts.len() - refused, refused, attempts }
}

/// Host-side fixtures the attempts aim at: a loopback listener and an abstract socket.
#[derive(Debug)]
pub struct Targets {
    _tcp: std::net::TcpListener,
    _abs: std::os::unix::net::UnixListener,
    /// Host listeners where the engine's egress attempt aims (each egress forwarder's address,
    /// else 127.0.0.2:port): in the host's network namespace (the matrix's baseline) they
    /// answer, so the layer that stops the engine reaching them is visible, the namespaces'
    /// included. Best effort: a port taken or privileged is left out.
    _egress: Vec<std::net::TcpListener>,
    port: u16,
    name: String,
    /// A pathname unix socket listening on the host, outside every role's view.
    unix: HostSocket,
}

/// A listening pathname socket in a directory of its own under /tmp, removed on drop.
#[derive(Debug)]
struct HostSocket {
    dir: std::path::PathBuf,
    _listener: std::os::unix::net::UnixListener,
}

impl HostSocket {
    fn path(&self) -> std::path::PathBuf {
        self.dir.join("sock")
    }
}

impl Drop for HostSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(self.path());
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// The host socket the `unix_socket_in_view` attempt aims at: reachable by any uid once the
/// namespaces and seccomp layers are off (mode 0777 in a 0755 dir), so those layers are what
/// the matrix shows stopping it.
fn host_socket(r: u64) -> Result<HostSocket> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    let dir = std::path::PathBuf::from(format!("/tmp/sealnode-canary-{r:016x}"));
    std::fs::DirBuilder::new()
        .mode(0o755)
        .create(&dir)
        .map_err(|e| Error::io(format!("canary: mkdir {}", dir.display()), e))?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))
        .map_err(|e| Error::io(format!("canary: chmod {}", dir.display()), e))?;
    let path = dir.join("sock");
    let listener = match std::os::unix::net::UnixListener::bind(&path) {
        Ok(l) => l,
        Err(e) => {
            let _ = std::fs::remove_dir(&dir);
            return Err(Error::io(format!("canary: bind {}", path.display()), e));
        }
    };
    let socket = HostSocket { dir, _listener: listener };
    std::fs::set_permissions(socket.path(), std::fs::Permissions::from_mode(0o777))
        .map_err(|e| Error::io(format!("canary: chmod {}", socket.path().display()), e))?;
    Ok(socket)
}

pub fn targets(cfg: &Config) -> Result<Targets> {
    use std::os::linux::net::SocketAddrExt;
    let tcp = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("canary: host listener", e))?;
    let port = tcp.local_addr().map_err(|e| Error::io("canary: host listener", e))?.port();
    // Unpredictable: abstract names are shared by every user of the host's network namespace,
    // so another user cannot take the name first and stop the preflight (tests/gate.rs:
    // a_squatted_canary_name_does_not_stop_the_cell).
    let r = crate::os::sys::random_u64().map_err(|e| Error::errno("canary: getrandom", e))?;
    let name = format!("sealnode-canary-{r:016x}");
    let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes())
        .map_err(|e| Error::io("canary: abstract name", e))?;
    let abs =
        std::os::unix::net::UnixListener::bind_addr(&addr).map_err(|e| Error::io("canary: abstract socket", e))?;
    let mut aims: Vec<String> =
        cfg.node.egress.iter().enumerate().map(|(i, e)| format!("{}:{}", Config::egress_addr(i), e.port)).collect();
    if aims.is_empty() {
        aims.push(format!("127.0.0.2:{port}"));
    }
    let egress = aims.iter().filter_map(|a| std::net::TcpListener::bind(a.as_str()).ok()).collect();
    let unix = host_socket(r)?;
    Ok(Targets { _tcp: tcp, _abs: abs, _egress: egress, port, name, unix })
}

/// The parts of a role's view the `unix_socket_in_view` attempt walks for sockets and FIFOs.
fn view_roots(cfg: &Config, role: Role) -> Vec<String> {
    let mut v: Vec<String> =
        ["/etc", "/run", "/tmp", "/dev/shm", crate::layout::INSIDE_SCRATCH].iter().map(|s| s.to_string()).collect();
    if cfg.role(role).models.is_some() {
        v.push(crate::layout::INSIDE_MODELS.into());
    }
    v.extend(cfg.binds(role).iter().map(|(_, b)| b.inside().display().to_string()));
    v
}

fn ctx_for(cfg: &Config, role: Role, t: &Targets, layers: Layers) -> Ctx {
    let r = cfg.role(role);
    let other = cfg.role(match role {
        Role::Engine => Role::Node,
        Role::Node => Role::Engine,
    });
    let mut foreign: Vec<String> = vec![other.scratch.display().to_string()];
    foreign.extend(other.credential.iter().map(|p| p.display().to_string()));
    foreign.extend(other.models.iter().map(|p| p.display().to_string()));
    match role {
        Role::Engine => foreign.push(crate::layout::INSIDE_CREDENTIAL.into()),
        Role::Node => foreign.push(crate::layout::INSIDE_MODELS.into()),
    }
    let launcher_env: Vec<(String, String)> = std::env::vars().collect();
    // The probe runs without the loader's variables (sandbox::plan::loader_var): one that
    // reaches it is unexpected.
    let expected_env = crate::sandbox::plan::build_env(cfg, role, &launcher_env)
        .into_iter()
        .map(|(k, _)| k)
        .filter(|k| !crate::sandbox::plan::loader_var(k))
        .collect();
    let engine_port = cfg.engine.port.unwrap_or(0) as u16;
    let egress =
        cfg.node.egress.iter().enumerate().map(|(i, e)| format!("{}:{}", Config::egress_addr(i), e.port)).collect();
    Ctx {
        role: role.name().into(),
        scratch: if layers.namespaces { crate::layout::INSIDE_SCRATCH.into() } else { r.scratch.display().to_string() },
        models: match (&r.models, layers.namespaces) {
            (Some(_), true) => crate::layout::INSIDE_MODELS.into(),
            (Some(m), false) => m.display().to_string(),
            (None, _) => crate::layout::INSIDE_MODELS.into(),
        },
        host_port: t.port,
        host_abstract: t.name.clone(),
        host_unix: t.unix.path().display().to_string(),
        // Where the role's view shows the host's files beyond the system trees: its binds,
        // /etc and /run (generated and sealnode's), its own dirs. Only with the namespaces
        // layer: without it the view is the host's, whose daemons' sockets are not targets.
        view_roots: if layers.namespaces { view_roots(cfg, role) } else { Vec::new() },
        foreign_paths: foreign,
        config_path: cfg.file.display().to_string(),
        root_home: std::fs::metadata("/root").ok().map(|m| (m.dev(), m.ino())),
        // The key once `attest init` made it; before, the state dir that will hold it.
        attest_key: Some(crate::layout::attest_key_path(&cfg.cell.state_dir))
            .filter(|k| k.exists())
            .unwrap_or_else(|| cfg.cell.state_dir.clone())
            .display()
            .to_string(),
        engine_port,
        egress,
        free_port: if engine_port == 1 { 2 } else { 1 }.max(engine_port.wrapping_add(1)),
        expected_env,
    }
}

/// One role's battery, started: its probe runs in the role's sandbox and writes its outcomes
/// to `out`, which the caller reads to its end ([`finish`] then classifies them). `run`'s
/// event loop watches `out` and reaps the probe like any child; the commands wait for it.
#[derive(Debug)]
pub struct Probe {
    pub role: Role,
    pub sandbox: sandbox::spawn::Sandbox,
    /// The probe's stdout: its JSON outcomes, then EOF when it exits.
    pub out: OwnedFd,
    /// The other end of the probe's stdin, a pty (TIOCSTI has a real target).
    _pty: OwnedFd,
}

/// The probe's command line: sealnode's sealed copy, told the context and the attempts that
/// apply to `role`.
pub fn probe_argv(cfg: &Config, role: Role, t: &Targets, layers: Layers) -> Result<Vec<String>> {
    let ctx = ctx_for(cfg, role, t, layers);
    let ctx_json = serde_json::to_string(&ctx).map_err(|e| Error::io("canary context", std::io::Error::other(e)))?;
    let mut argv = vec!["sealnode-canary".to_string(), "__canary-inside".to_string(), ctx_json];
    argv.extend(SPECS.iter().filter(|s| s.applies(cfg, role)).map(|s| s.id.to_string()));
    Ok(argv)
}

/// Start the battery for `role` in a sandbox built here: in `cell` (`canary`) or standalone
/// with `layers` (the matrix). The preflight does not: it runs the plan the gate admits
/// ([`start_plan`] with [`Plan::probe`]).
pub fn start(
    cfg: &Config,
    role: Role,
    inv: &Invoker,
    cell: Option<&Cell>,
    layers: Layers,
    t: &Targets,
) -> Result<Probe> {
    let argv = probe_argv(cfg, role, t, layers)?;
    let program = Program::SealedSelf(crate::sandbox::plan::sealed_self()?);
    let mut plan = Plan::build_layers(cfg, role, inv, Some(argv), Some(program), layers)?;
    // Standalone (the matrix), no cell holds a capped scratch's tmpfs: a fresh one, as `exec`
    // gets (found by review: the matrix bound the host dir and refused it as no tmpfs).
    if cell.is_none() {
        plan.fresh_capped_scratch()?;
    }
    start_plan(plan, cell)
}

/// Start a probe's plan (its command the battery: [`probe_argv`]) in `cell`, its stdin a pty
/// and its stdout the report's pipe.
pub fn start_plan(mut plan: Plan, cell: Option<&Cell>) -> Result<Probe> {
    let role = plan.role;
    // The attempts' stdin is a pty whose other end we hold: TIOCSTI has a real target.
    let pty = nix::pty::openpty(None, None).map_err(|e| Error::errno("openpty", e))?;
    // Close-on-exec like every other fd of the supervisor's (the child dup2s the slave).
    for fd in [&pty.master, &pty.slave] {
        nix::fcntl::fcntl(fd, nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC))
            .map_err(|e| Error::errno("pty FD_CLOEXEC", e))?;
    }
    let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2", e))?;
    plan.stdio = Some(crate::sandbox::plan::Stdio { stdin: pty.slave, stdout: out_w, stderr: None });
    let spawned = sandbox::spawn_in(&plan, cell);
    // Our copies of the role's stdio close now: EOF on the pipe is then the probe's exit.
    plan.stdio = None;
    Ok(Probe { role, sandbox: spawned?, out: out_r, _pty: pty.master })
}

/// Classify what a probe wrote (`out`, read to its end) and how it exited (`code`).
pub fn finish(cfg: &Config, role: Role, out: &[u8], code: i32) -> Result<RoleReport> {
    if code != 0 {
        return Err(Error::errno(
            format!("canary probe in the {role} role exited with {code}"),
            nix::errno::Errno::EIO,
        ));
    }
    Ok(classify(cfg, role, &outcomes(role, out)?))
}

/// A probe's JSON outcomes, by attempt id.
fn outcomes(role: Role, out: &[u8]) -> Result<BTreeMap<String, Outcome>> {
    serde_json::from_slice(out).map_err(|e| {
        let shown = String::from_utf8_lossy(&out[..out.len().min(300)]).into_owned();
        Error::io(format!("canary output of the {role} role ({shown:?})"), std::io::Error::other(e))
    })
}

/// Run the battery for `role` once and wait for it (`canary`, the matrix, `check`).
fn run_battery(
    cfg: &Config,
    role: Role,
    inv: &Invoker,
    cell: Option<&Cell>,
    layers: Layers,
    t: &Targets,
    stop: StopRequested,
) -> Result<BTreeMap<String, Outcome>> {
    let p = start(cfg, role, inv, cell, layers, t)?;
    let out = match read_until_eof(p.out, battery_deadline(cfg), stop) {
        Ok(out) => out,
        Err(e) => {
            let _ = nix::sys::signal::kill(p.sandbox.pid, nix::sys::signal::Signal::SIGKILL);
            let _ = sandbox::spawn::wait_exit(p.sandbox);
            let what = format!("canary probe in the {role} role");
            return Err(if e == nix::errno::Errno::ECANCELED {
                Error::Stopped { what }
            } else {
                Error::errno(what, e)
            });
        }
    };
    // Never sigwait here: a caller with its own signal handling would lose a SIGTERM to it.
    let code = sandbox::spawn::wait_exit(p.sandbox);
    if code != 0 {
        return Err(Error::errno(
            format!("canary probe in the {role} role exited with {code}"),
            nix::errno::Errno::EIO,
        ));
    }
    outcomes(role, &out)
}

/// How long one role's battery may take before it counts as hung (`cell.preflight_timeout_s`:
/// a slow or emulated host needs more than the default 30 s).
pub fn battery_deadline(cfg: &Config) -> std::time::Duration {
    std::time::Duration::from_secs(cfg.cell.preflight_timeout_s)
}

/// Asked at least every [`STOP_CHECK`] while a battery waits for its probe: true once the
/// caller wants to stop (the supervisor: a stop signal pending on its signalfd).
pub type StopRequested<'a> = &'a dyn Fn() -> bool;

/// How often a waiting battery asks whether to stop.
const STOP_CHECK: std::time::Duration = std::time::Duration::from_millis(50);

/// Read `fd` to its end, at most until `limit` has passed (ETIMEDOUT then), or until `stop`
/// says so (ECANCELED).
fn read_until_eof(
    fd: OwnedFd,
    limit: std::time::Duration,
    stop: StopRequested,
) -> std::result::Result<Vec<u8>, nix::errno::Errno> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let deadline = std::time::Instant::now() + limit;
    let mut out = Vec::new();
    let mut buf = [0u8; 8192];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            return Err(nix::errno::Errno::ETIMEDOUT);
        }
        if stop() {
            return Err(nix::errno::Errno::ECANCELED);
        }
        let slice = left.min(STOP_CHECK);
        let ms = PollTimeout::try_from(slice.as_millis() as u64 + 1).unwrap_or(PollTimeout::MAX);
        let mut fds = [PollFd::new(std::os::fd::AsFd::as_fd(&fd), PollFlags::POLLIN)];
        match poll(&mut fds, ms) {
            Ok(0) | Err(nix::errno::Errno::EINTR) => continue,
            Ok(_) => {}
            Err(e) => return Err(e),
        }
        match nix::unistd::read(&fd, &mut buf) {
            Ok(0) => return Ok(out),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(nix::errno::Errno::EINTR) | Err(nix::errno::Errno::EAGAIN) => {}
            Err(e) => return Err(e),
        }
    }
}

/// Run the battery in each role's exact sandbox, inside `cell` (which `run` already built)
/// or a fresh cell like `run` would build.
pub fn battery(cfg: &Config, inv: &Invoker, roles: &[Role], cell: Option<&Cell>) -> Result<Report> {
    battery_until(cfg, inv, roles, cell, &|| false)
}

/// [`battery`], abandoned with [`Error::Stopped`] as soon as `stop` says so: the supervisor
/// runs it inside its event loop and must not sit on a pending SIGTERM.
pub fn battery_until(
    cfg: &Config,
    inv: &Invoker,
    roles: &[Role],
    cell: Option<&Cell>,
    stop: StopRequested,
) -> Result<Report> {
    let t = targets(cfg)?;
    let owned;
    let cell = match cell {
        Some(c) => c,
        None => {
            owned = crate::sandbox::cell::Cell::for_config(cfg, inv)?;
            &owned
        }
    };
    let mut reports = Vec::new();
    for role in roles {
        let raw = run_battery(cfg, *role, inv, Some(cell), Layers::ALL, &t, stop)?;
        reports.push(classify(cfg, *role, &raw));
    }
    let passed = reports.iter().all(|r| r.succeeded == 0);
    Ok(Report { schema: SCHEMA, sealnode_version: env!("CARGO_PKG_VERSION"), roles: reports, passed })
}

#[derive(Debug, Clone, Serialize)]
pub struct MatrixRow {
    pub id: &'static str,
    pub role: Role,
    /// The host kernel refuses it with every sealnode layer off (feature not built in, or a
    /// host sysctl): moot on this machine, and no layer is credited.
    pub moot_on_this_kernel: bool,
    /// What the baseline run (no sealnode layer) got, for the record.
    pub baseline: Outcome,
    /// Layers that refused the attempt on their own.
    pub stopped_by: Vec<Layer>,
    pub expected_layers: Vec<Layer>,
    /// Documented reason when fewer than two layers can stop it.
    pub single_layer_reason: Option<&'static str>,
}

#[derive(Debug, Clone, Serialize)]
pub struct Matrix {
    pub schema: u32,
    pub columns: Vec<Layer>,
    pub rows: Vec<MatrixRow>,
    /// Attempts stopped by fewer than two layers that are not documented exceptions.
    pub violations: Vec<String>,
}

fn only_layer(l: Layer) -> Layers {
    let mut x = Layers::NONE;
    match l {
        Layer::Seccomp => x.seccomp = true,
        Layer::Landlock => x.landlock = true,
        Layer::Namespaces => x.namespaces = true,
        Layer::Credentials => x.credentials = true,
        _ => {}
    }
    x
}

/// Did turning on `col` alone (compared with the baseline, every layer off) stop the attempt?
fn credits(spec: &Spec, o: &Outcome, base: &Outcome) -> bool {
    if spec.fact {
        return o.ok != base.ok && !o.ok;
    }
    let refused = |x: &Outcome| spec.refused_by(x).is_some();
    refused(o) && (!refused(base) || o.errno != base.errno || o.signal != base.signal)
}

/// A sandbox setup failure in one of the matrix's columns, said to be that column's: without
/// namespaces its view is the host's root, and its Landlock rules are resolved there.
fn in_column(e: Error, column: &str) -> Error {
    match e {
        Error::Setup { step, detail, errno } => {
            Error::Setup { step, detail: format!("{detail} (canary --matrix, column {column})"), errno }
        }
        e => e,
    }
}

/// Re-run the battery with one layer at a time (standalone sandboxes) and record which
/// attempts each layer stops on its own.
pub fn matrix(cfg: &Config, inv: &Invoker, roles: &[Role]) -> Result<Matrix> {
    let t = targets(cfg)?;
    let mut rows = Vec::new();
    for role in roles {
        let connect_any = connects_anywhere(cfg, *role)?;
        let base = run_battery(cfg, *role, inv, None, Layers::NONE, &t, &|| false)
            .map_err(|e| in_column(e, "baseline (every layer off)"))?;
        let mut cols: Vec<(Layer, BTreeMap<String, Outcome>)> = Vec::new();
        for l in MATRIX_LAYERS {
            let raw = run_battery(cfg, *role, inv, None, only_layer(l), &t, &|| false)
                .map_err(|e| in_column(e, &format!("{} alone", l.name())))?;
            cols.push((l, raw));
        }
        for spec in SPECS.iter().filter(|s| s.applies(cfg, *role)) {
            let baseline = base.get(spec.id).copied().unwrap_or_default();
            // Moot when the host itself lacks the feature or the target (not merely refuses it).
            let absent = [ENOSYS, libc::EAFNOSUPPORT, ENOENT, libc::ENODEV, libc::EOPNOTSUPP, libc::EPROTONOSUPPORT];
            let moot = !spec.fact
                && !baseline.ok
                && baseline.signal.is_none()
                && baseline.errno.is_some_and(|e| absent.contains(&e));
            let stopped_by: Vec<Layer> = if moot {
                Vec::new()
            } else {
                let mut v: Vec<Layer> = cols
                    .iter()
                    .filter(|(_, raw)| raw.get(spec.id).is_some_and(|o| credits(spec, o, &baseline)))
                    .map(|(l, _)| *l)
                    .collect();
                if !spec.fact && spec.refused_by(&baseline).is_some() {
                    v.push(Layer::Host);
                }
                v
            };
            let reason = SINGLE_LAYER
                .iter()
                .find(|(id, _)| *id == spec.id)
                .map(|(_, r)| *r)
                .or_else(|| (connect_any && CONNECT_ANY.contains(&spec.id)).then_some(CONNECT_ANY_REASON));
            rows.push(MatrixRow {
                id: spec.id,
                role: *role,
                moot_on_this_kernel: moot,
                baseline,
                stopped_by,
                expected_layers: spec.expected.to_vec(),
                single_layer_reason: reason,
            });
        }
    }
    let violations = rows
        .iter()
        .filter(|r| !r.moot_on_this_kernel && r.stopped_by.len() < 2 && r.single_layer_reason.is_none())
        .map(|r| format!("{} ({}): stopped by {:?}", r.id, r.role, r.stopped_by))
        .collect();
    Ok(Matrix { schema: SCHEMA, columns: MATRIX_LAYERS.to_vec(), rows, violations })
}

/// The compact human table.
pub fn render(report: &Report) -> String {
    let mut s = String::new();
    for r in &report.roles {
        s.push_str(&format!(
            "{} role: {} attempts, {} refused, {} SUCCEEDED\n",
            r.role,
            r.attempts.len(),
            r.refused,
            r.succeeded
        ));
        s.push_str(&format!(
            "  {:<26} {:<12} {:<9} {:<14} {:<12} {}\n",
            "attempt", "category", "outcome", "errno/signal", "refused by", "expected"
        ));
        for a in &r.attempts {
            let e = match (a.signal, &a.errno_name) {
                (Some(sig), _) => format!("signal {sig}"),
                (None, Some(n)) => n.clone(),
                (None, None) => "-".into(),
            };
            let exp: Vec<&str> = a.expected_layers.iter().map(|l| l.name()).collect();
            s.push_str(&format!(
                "  {:<26} {:<12} {:<9} {:<14} {:<12} {}\n",
                a.id,
                a.category,
                if a.outcome == "refused" { "refused" } else { "SUCCEEDED" },
                e,
                a.refused_by.map(Layer::name).unwrap_or("-"),
                exp.join(",")
            ));
        }
    }
    s.push_str(if report.passed {
        "canary: PASSED (every attempt refused)\n"
    } else {
        "canary: FAILED (an attempt succeeded)\n"
    });
    s
}

pub fn render_matrix(m: &Matrix) -> String {
    let mut s = format!(
        "  {:<26} {:<7} {:<8} {:<9} {:<11} {:<12} {:<5} {}\n",
        "attempt", "role", "seccomp", "landlock", "namespaces", "credentials", "host", "note"
    );
    for r in &m.rows {
        let cell = |l: Layer| if r.stopped_by.contains(&l) { "stops" } else { "-" };
        let note = match (r.stopped_by.len(), r.single_layer_reason) {
            _ if r.moot_on_this_kernel => format!(
                "moot: this kernel refuses it with no sealnode layer ({})",
                r.baseline.errno.map(errno_name).unwrap_or_default()
            ),
            (n, _) if n >= 2 => String::new(),
            (_, Some(reason)) => format!("single layer: {reason}"),
            _ => "FEWER THAN TWO LAYERS".into(),
        };
        s.push_str(&format!(
            "  {:<26} {:<7} {:<8} {:<9} {:<11} {:<12} {:<5} {}\n",
            r.id,
            r.role.name(),
            cell(S),
            cell(L),
            cell(N),
            cell(C),
            cell(Layer::Host),
            note
        ));
    }
    s.push_str(&if m.violations.is_empty() {
        "matrix: every attempt not listed as an exception is stopped by at least two layers\n".to_string()
    } else {
        format!(
            "matrix: {} attempt(s) stopped by fewer than two layers: {}\n",
            m.violations.len(),
            m.violations.join("; ")
        )
    });
    s
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    #[test]
    fn a_waiting_battery_gives_up_for_a_stop_and_for_its_deadline() {
        // A probe that never writes nor exits: the pipe's write end stays open.
        let (r, _w) = nix::unistd::pipe().expect("pipe");
        let t = Instant::now();
        let asked = std::cell::Cell::new(0);
        let stop = || {
            asked.set(asked.get() + 1);
            t.elapsed() > Duration::from_millis(120)
        };
        assert_eq!(super::read_until_eof(r, Duration::from_secs(30), &stop), Err(nix::errno::Errno::ECANCELED));
        assert!(t.elapsed() < Duration::from_secs(2), "gave up after {:?}", t.elapsed());
        assert!(asked.get() >= 2, "asked {} times", asked.get());
        let (r, _w) = nix::unistd::pipe().expect("pipe");
        let t = Instant::now();
        assert_eq!(super::read_until_eof(r, Duration::from_millis(150), &|| false), Err(nix::errno::Errno::ETIMEDOUT));
        assert!(t.elapsed() < Duration::from_secs(2));
        let (r, w) = nix::unistd::pipe().expect("pipe");
        crate::os::sys::write_all(std::os::fd::AsRawFd::as_raw_fd(&w), b"{}").expect("write");
        drop(w);
        assert_eq!(super::read_until_eof(r, Duration::from_secs(5), &|| false), Ok(b"{}".to_vec()));
    }

    #[test]
    fn the_exceptions_a_policy_makes_are_documented_and_are_attempts() {
        let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/docs/canary.md")).expect("doc");
        let para =
            doc.split("\n\n").find(|p| p.contains("`connect_any`")).expect("docs/canary.md: the connect_any paragraph");
        for id in super::CONNECT_ANY {
            assert!(super::SPECS.iter().any(|s| s.id == *id), "{id}: no such attempt");
            assert!(para.contains(&format!("`{id}`")), "docs/canary.md does not name {id} for connect_any");
        }
    }

    #[test]
    fn a_blocked_signal_is_seen_pending_without_being_taken() {
        use nix::sys::signal::{SigSet, SigmaskHow, Signal};
        // This thread only: the test harness's other threads keep their masks.
        let mut set = SigSet::empty();
        set.add(Signal::SIGUSR2);
        set.thread_block().expect("block");
        assert!(!crate::os::sys::signal_pending(&[Signal::SIGUSR2]));
        nix::sys::signal::raise(Signal::SIGUSR2).expect("raise"); // to this thread
        assert!(crate::os::sys::signal_pending(&[Signal::SIGUSR2]));
        assert!(!crate::os::sys::signal_pending(&[Signal::SIGTERM]));
        // Still there to be taken.
        assert_eq!(set.wait(), Ok(Signal::SIGUSR2));
        assert!(!crate::os::sys::signal_pending(&[Signal::SIGUSR2]));
        let _ = nix::sys::signal::pthread_sigmask(SigmaskHow::SIG_UNBLOCK, Some(&set), None);
    }
}
