//! The TOML types of the config, their serde defaults, and the accessors that only read
//! them.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::tpm::TpmConfig;
use crate::os::trusted::TrustedFile;

/// Default config location.
pub const DEFAULT_CONFIG: &str = "/etc/sealnode/sealnode.toml";
/// The config schema this build understands.
pub const SCHEMA_VERSION: u32 = 1;

/// A role; as JSON (the control protocol's status) its name, `"engine"` or `"node"`.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, clap::ValueEnum, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Engine,
    Node,
}

impl Role {
    pub const ALL: [Role; 2] = [Role::Engine, Role::Node];
    pub fn name(self) -> &'static str {
        match self {
            Role::Engine => "engine",
            Role::Node => "node",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Config format version; must equal [`SCHEMA_VERSION`].
    pub schema: u32,
    pub cell: CellConfig,
    pub engine: RoleConfig,
    pub node: RoleConfig,
    /// The file this config was read from (not part of the TOML).
    #[serde(skip)]
    pub file: PathBuf,
    /// What [`Config::load`] read and resolved, once, through the checked path (not part of
    /// the TOML): every start uses these, never the files or the user database again. None for
    /// a config that was only parsed ([`Config::parse`]), from which nothing starts.
    #[serde(skip)]
    pub loaded: Option<Loaded>,
}

/// What [`Config::load`] read: the config file, each role's policy files, and the host ids
/// each role runs as.
#[derive(Debug, Clone)]
pub struct Loaded {
    pub config: TrustedFile,
    /// Indexed by [`Role`]: engine, node.
    pub seccomp: [TrustedFile; 2],
    pub landlock: [TrustedFile; 2],
    /// Each role's CDI devices, when it takes any.
    pub cdi: [Option<CdiLoaded>; 2],
    /// The host uid and gid each role runs as, the user names looked up once, here (a reload
    /// keeps them: [`Config::reload`]).
    pub ids: [Ids; 2],
    /// Rootless: the name of the user sealnode runs as, looked up once, here (the statements
    /// name it; a reload keeps it).
    pub launcher_user: Option<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CellConfig {
    /// Hostname inside the cell (UTS namespace).
    #[serde(default = "default_hostname")]
    pub hostname: String,
    /// Persistent state (receipts, generation counter).
    pub state_dir: PathBuf,
    /// Runtime files (control socket).
    pub runtime_dir: PathBuf,
    /// Host users the roles run as when sealnode runs as root. Ignored when rootless.
    pub rootful: Option<RootfulUsers>,
    /// Grace period between SIGTERM and SIGKILL when stopping a role, seconds.
    #[serde(default = "default_stop_timeout")]
    pub stop_timeout_s: u64,
    /// How long one role's canary battery may take before the preflight counts as hung.
    #[serde(default = "default_preflight_timeout")]
    pub preflight_timeout_s: u64,
    /// Most concurrent forwarded connections per egress upstream.
    #[serde(default = "default_egress_max")]
    pub egress_max_connections: usize,
    /// A forwarded connection idle this long (no byte either way) is closed, seconds.
    #[serde(default = "default_egress_idle")]
    pub egress_idle_timeout_s: u64,
    /// An outbound egress connect with no answer this long is given up and logged, seconds.
    #[serde(default = "default_egress_connect")]
    pub egress_connect_timeout_s: u64,
    /// While the engine is not ready (starting, restarting, loading its model), the node's new
    /// connections to it wait this long each before they are closed, seconds (0: forwarded at
    /// once, to be refused or answered 503 by the engine).
    #[serde(default = "default_engine_hold")]
    pub engine_hold_s: u64,
    /// A request the engine dropped before it answered a byte (it crashed, was killed) is sent
    /// again, once, to the engine once it is ready, if it was no longer than this, KiB (0: never;
    /// nothing is sent again without a hold either).
    #[serde(default = "default_engine_replay")]
    pub engine_replay_kb: u64,
    /// A stop with exit status 0 (SIGTERM, a reload, a recycle) lets the node's requests in
    /// flight to the engine finish first, up to this long, seconds (0: no drain).
    #[serde(default = "default_drain_timeout")]
    pub drain_timeout_s: u64,
    /// `run`: a change of the config file (a ConfigMap volume's swap, a rename over the file, a
    /// rewrite) reloads the cell as SIGHUP does, once the changes have settled.
    #[serde(default)]
    pub reload_on_change: bool,
    /// Uids allowed on the control socket (checked with SO_PEERCRED). Default: the uid
    /// sealnode runs as.
    pub control_uids: Option<Vec<u32>>,
    /// Run by hand as root: the cgroup v2 directory (relative to /sys/fs/cgroup) sealnode
    /// makes its own subtree in (`supervisor`, `engine`, `node` leaves). Under the unit
    /// (Delegate=yes) sealnode uses its delegated cgroup and this must be unset.
    pub cgroup: Option<PathBuf>,
    /// Resource limits both roles get unless a role's own `limits` sets the field.
    #[serde(default)]
    pub limits: Limits,
    /// Bind every signed statement to this TPM with a quote (docs/attestation.md, "TPM
    /// binding"). Unset: statements say "no TPM".
    pub tpm: Option<TpmConfig>,
}

/// Per-role cgroup v2 limits (docs/config.md, "Resource limits"). Every field is optional; a
/// set field that the host cannot enforce refuses the start.
#[derive(Debug, Clone, Default, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    /// memory.max, MiB: above it the kernel's OOM killer kills the role's whole cgroup.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_max_mb: Option<u64>,
    /// memory.high, MiB: above it the role is throttled and reclaimed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_high_mb: Option<u64>,
    /// memory.swap.max, MiB (where a memory controller is in use: 0 unless set).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub memory_swap_max_mb: Option<u64>,
    /// pids.max: processes and threads of the role together.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pids_max: Option<u64>,
    /// cpu.max as a number of CPUs (1.5 = 150 ms of CPU time per 100 ms).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_max: Option<f64>,
    /// cpu.weight, 1-10000 (100 is the kernel's default).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_weight: Option<u64>,
    /// io.weight, 1-10000 (needs the io controller).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub io_weight: Option<u64>,
    /// io.max per block device.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub io_max: Vec<IoMax>,
}

/// One io.max line: a block device and its bandwidth/IOPS caps.
#[derive(Debug, Clone, PartialEq, Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct IoMax {
    /// The block device node, e.g. /dev/nvme0n1.
    pub device: PathBuf,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rbps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wbps: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub riops: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub wiops: Option<u64>,
}

impl Limits {
    /// This role's limits: each field its own, else the cell's.
    pub fn over(&self, cell: &Limits) -> Limits {
        Limits {
            memory_max_mb: self.memory_max_mb.or(cell.memory_max_mb),
            memory_high_mb: self.memory_high_mb.or(cell.memory_high_mb),
            memory_swap_max_mb: self.memory_swap_max_mb.or(cell.memory_swap_max_mb),
            pids_max: self.pids_max.or(cell.pids_max),
            cpu_max: self.cpu_max.or(cell.cpu_max),
            cpu_weight: self.cpu_weight.or(cell.cpu_weight),
            io_weight: self.io_weight.or(cell.io_weight),
            io_max: if self.io_max.is_empty() { cell.io_max.clone() } else { self.io_max.clone() },
        }
    }

    /// The set fields, as (config field, cgroup v2 controller), in a fixed order.
    pub fn set_fields(&self) -> Vec<(&'static str, &'static str)> {
        let mut v = Vec::new();
        let mut add = |set: bool, field, ctl| {
            if set {
                v.push((field, ctl));
            }
        };
        add(self.memory_max_mb.is_some(), "memory_max_mb", "memory");
        add(self.memory_high_mb.is_some(), "memory_high_mb", "memory");
        add(self.memory_swap_max_mb.is_some(), "memory_swap_max_mb", "memory");
        add(self.pids_max.is_some(), "pids_max", "pids");
        add(self.cpu_max.is_some(), "cpu_max", "cpu");
        add(self.cpu_weight.is_some(), "cpu_weight", "cpu");
        add(self.io_weight.is_some(), "io_weight", "io");
        add(!self.io_max.is_empty(), "io_max", "io");
        v
    }
}

fn default_stop_timeout() -> u64 {
    10
}
fn default_engine_hold() -> u64 {
    30
}
fn default_engine_replay() -> u64 {
    256
}
fn default_drain_timeout() -> u64 {
    10
}
fn default_preflight_timeout() -> u64 {
    30
}
fn default_egress_max() -> usize {
    64
}
fn default_egress_idle() -> u64 {
    600
}

/// TCP's own SYN retries would take about two minutes; a dropped SYN (a firewall, a unit's
/// IPAddressDeny=) is otherwise silent.
fn default_egress_connect() -> u64 {
    15
}

fn default_hostname() -> String {
    "sealnode".to_string()
}

#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RootfulUsers {
    /// A user name (`"sealnode-engine"`) or numeric `"uid:gid"`.
    pub engine: String,
    pub node: String,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleConfig {
    /// argv of the role's program; argv[0] is an absolute path as seen inside the sandbox.
    pub command: Vec<String>,
    /// Optional sha256 pin of the program (64 hex digits).
    pub sha256: Option<String>,
    /// TCP port the engine listens on (engine only, required there).
    pub port: Option<u32>,
    /// Seccomp policy (seccompiler JSON with a filter named after the role).
    pub seccomp: PathBuf,
    /// Landlock rules file (TOML).
    pub landlock: PathBuf,
    /// Engine only: model directory, mounted at /models.
    pub models: Option<PathBuf>,
    /// Engine only: mount the model dir writable (default read-only).
    #[serde(default)]
    pub models_writable: bool,
    /// The role's own writable directory, mounted at /scratch (noexec); HOME and cwd.
    pub scratch: PathBuf,
    /// Cap scratch at this many MiB: a tmpfs of that size held by the cell over `scratch`
    /// (it survives a restart of the role, not of the cell), charged to the role's memory.
    pub scratch_max_mb: Option<u64>,
    /// Node only: credential file, mounted read-only at /run/sealnode/credential.
    pub credential: Option<PathBuf>,
    /// Extra read-only binds (e.g. a Python install or venv).
    #[serde(default)]
    pub ro_binds: Vec<Bind>,
    /// Device nodes bound into this role only (e.g. GPUs).
    #[serde(default)]
    pub devices: Vec<PathBuf>,
    /// Devices from a CDI spec (the driver's own description): their nodes, files and
    /// environment ([`Config::devices`], [`Config::binds`], [`Config::cdi`]).
    pub devices_from: Option<DevicesFrom>,
    /// Size of the private /tmp tmpfs, MiB.
    #[serde(default = "default_tmp_mb")]
    pub tmp_size_mb: u64,
    #[serde(default)]
    pub env: EnvConfig,
    #[serde(default)]
    pub rlimits: Rlimits,
    /// Node only: upstreams reachable through the launcher (e.g. the gateway).
    #[serde(default)]
    pub egress: Vec<Egress>,
    /// Engine only: how `run` decides the engine is ready before starting the node
    /// (unset: the default TCP check; [`RoleConfig::ready`]).
    #[serde(default, rename = "ready")]
    pub ready_set: Option<Ready>,
    /// cgroup v2 limits of this role (fields not set here come from `cell.limits`).
    #[serde(default)]
    pub limits: Limits,
    /// `run`: log each syscall the role's seccomp policy refuses (role, pid, syscall, errno), as
    /// systemd's SystemCallLog= does; allowed syscalls pay nothing (docs/policies.md).
    #[serde(default)]
    pub log_refused_syscalls: bool,
    /// Restart the role when it exits: "no" (stop the cell, exit non-zero), "on-failure", "always".
    #[serde(default)]
    pub restart: Restart,
    /// At most `burst` restarts within `interval_s`; one more stops the cell (exit 5).
    #[serde(default)]
    pub restart_limit: RestartLimit,
}

impl RoleConfig {
    /// The engine's readiness check: as set, else the default (a TCP connect).
    pub fn ready(&self) -> Ready {
        self.ready_set.clone().unwrap_or_default()
    }
}

/// What a role path on the host must be ([`Config::checked_role_path`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PathKind {
    /// A directory (scratch, the model dir).
    Dir,
    /// A directory or a file (an extra read-only bind).
    Any,
    /// A secret: a regular file readable by its owner only (the node's credential).
    Secret,
}

/// One host path a role binds.
#[derive(Debug, Clone)]
pub struct RolePath<'a> {
    /// The config field naming it (for errors), e.g. `node.ro_binds[1].src`.
    pub field: String,
    pub path: &'a Path,
    pub writable: bool,
    pub kind: PathKind,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestartLimit {
    #[serde(default = "default_burst")]
    pub burst: u32,
    #[serde(default = "default_interval")]
    pub interval_s: u64,
}

impl Default for RestartLimit {
    fn default() -> Self {
        RestartLimit { burst: default_burst(), interval_s: default_interval() }
    }
}

fn default_burst() -> u32 {
    5
}
fn default_interval() -> u64 {
    60
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Egress {
    /// The name the node dials (its usual URL's host); resolved outside the cell.
    pub host: String,
    /// The port the node dials, and the upstream's port.
    pub port: u32,
    /// Optional fixed upstream address ("ip:port") instead of resolving `host`.
    pub connect: Option<String>,
    /// Let `host` resolve to a private address (10/8, 172.16/12, 192.168/16, 100.64/10,
    /// fc00::/7). Loopback, link-local, the host's own addresses and the rest of the deny set
    /// stay refused; name a `connect` address for those.
    #[serde(default)]
    pub allow_private: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Ready {
    #[serde(default)]
    pub kind: ReadyKind,
    #[serde(default = "default_ready_path")]
    pub path: String,
    #[serde(default = "default_ready_timeout")]
    pub timeout_s: u64,
}

impl Default for Ready {
    fn default() -> Self {
        Ready { kind: ReadyKind::Tcp, path: default_ready_path(), timeout_s: default_ready_timeout() }
    }
}

/// What the engine's readiness check waits for.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReadyKind {
    /// The port accepts a connection.
    #[default]
    Tcp,
    /// GET `path` answers 200.
    Http,
}

fn default_ready_path() -> String {
    "/".into()
}
fn default_ready_timeout() -> u64 {
    120
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Restart {
    #[default]
    No,
    OnFailure,
    Always,
}

fn default_tmp_mb() -> u64 {
    64
}

/// `devices_from = { cdi = "/etc/cdi/nvidia.yaml", devices = ["nvidia.com/gpu=0"] }`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicesFrom {
    /// The CDI spec (YAML or JSON), read through the trusted walk like a policy file.
    pub cdi: PathBuf,
    /// Qualified device names (`vendor.com/class=name`) the spec describes.
    pub devices: Vec<String>,
}

/// What a role took from its CDI spec once the host was checked ([`Config::load`]).
#[derive(Debug, Clone, Default)]
pub struct CdiLoaded {
    pub spec: PathBuf,
    pub sha256: String,
    pub edits: crate::config::cdi::Edits,
    /// The spec's files that need a bind of their own (read-only), with their entry.
    pub binds: Vec<(String, Bind)>,
    /// The spec's files already in the role's view, the same file at the same path, through
    /// the read-only system binds ([`SYSTEM_RO`](crate::layout::SYSTEM_RO)): nothing to add.
    pub in_view: Vec<PathBuf>,
    /// The spec's edits sealnode leaves out, with their entry and why (hooks, sockets, paths
    /// in the sandbox's own layout).
    pub left_out: Vec<(String, String)>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Bind {
    /// Host path.
    pub src: PathBuf,
    /// Path inside the sandbox (default: same as src).
    pub dst: Option<PathBuf>,
    /// Allow executing files from this bind (default true: binds are for programs).
    #[serde(default = "yes")]
    pub exec: bool,
}

fn yes() -> bool {
    true
}

impl Bind {
    pub fn inside(&self) -> &Path {
        self.dst.as_deref().unwrap_or(&self.src)
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvConfig {
    /// Explicit values.
    #[serde(default)]
    pub set: BTreeMap<String, String>,
    /// Names passed through from the launcher's environment when present.
    #[serde(default)]
    pub pass: Vec<String>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rlimits {
    #[serde(default = "d_nofile")]
    pub nofile: u64,
    #[serde(default = "d_nproc")]
    pub nproc: u64,
    #[serde(default = "d_fsize")]
    pub fsize_mb: u64,
    #[serde(default = "d_memlock")]
    pub memlock_kb: u64,
}

fn d_nofile() -> u64 {
    4096
}
fn d_nproc() -> u64 {
    512
}
fn d_fsize() -> u64 {
    4096
}
fn d_memlock() -> u64 {
    64
}

impl Default for Rlimits {
    fn default() -> Self {
        Rlimits { nofile: d_nofile(), nproc: d_nproc(), fsize_mb: d_fsize(), memlock_kb: d_memlock() }
    }
}

/// Host uid/gid a role runs as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ids {
    pub uid: u32,
    pub gid: u32,
}

/// Who is launching, which decides rootful vs rootless.
#[derive(Debug, Clone, Copy)]
pub struct Invoker {
    pub uid: u32,
    pub gid: u32,
}

impl Invoker {
    pub fn current() -> Self {
        Invoker { uid: nix::unistd::geteuid().as_raw(), gid: nix::unistd::getegid().as_raw() }
    }
    pub fn rootful(&self) -> bool {
        self.uid == 0
    }
}

impl Config {
    /// The cell-local address the node's i-th egress upstream gets (127.0.0.2, .3, ...).
    pub fn egress_addr(i: usize) -> std::net::Ipv4Addr {
        std::net::Ipv4Addr::new(127, 0, 0, 2 + i as u8)
    }
}

impl Config {
    pub fn role(&self, role: Role) -> &RoleConfig {
        match role {
            Role::Engine => &self.engine,
            Role::Node => &self.node,
        }
    }

    /// The role's CDI devices as loaded (None without `devices_from`, or before [`Config::load`]).
    pub fn cdi(&self, role: Role) -> Option<&CdiLoaded> {
        self.loaded.as_ref().and_then(|l| l.cdi[role as usize].as_ref())
    }

    /// Every device node the role gets beyond the base ones: `devices`, then its CDI spec's,
    /// each path once.
    pub fn devices(&self, role: Role) -> Vec<&Path> {
        let mut v: Vec<&Path> = self.role(role).devices.iter().map(PathBuf::as_path).collect();
        for n in self.cdi(role).map(|c| c.edits.nodes.as_slice()).unwrap_or_default() {
            if !v.contains(&n.path.as_path()) {
                v.push(&n.path);
            }
        }
        v
    }

    /// Every extra read-only bind of the role with the field naming it: `ro_binds`, then its
    /// CDI spec's files that are not already in view.
    pub fn binds(&self, role: Role) -> Vec<(String, &Bind)> {
        let r = self.role(role);
        let mut v: Vec<(String, &Bind)> =
            r.ro_binds.iter().enumerate().map(|(i, b)| (format!("{role}.ro_binds[{i}].src"), b)).collect();
        if let Some(c) = self.cdi(role) {
            v.extend(
                c.binds.iter().map(|(entry, b)| (format!("{role}.devices_from ({}: {entry})", c.spec.display()), b)),
            );
        }
        v
    }

    /// Where limit `field` of `role` is written: the role's own `limits`, else `cell.limits`.
    pub fn limit_field(&self, role: Role, field: &str) -> String {
        if self.role(role).limits.set_fields().iter().any(|(f, _)| *f == field) {
            format!("{role}.limits.{field}")
        } else {
            format!("cell.limits.{field}")
        }
    }

    /// A role's limits in force: its own fields, else the cell's.
    pub fn limits(&self, role: Role) -> Limits {
        self.role(role).limits.over(&self.cell.limits)
    }

    /// Every host path a role binds, with the field naming it, whether it is writable and what
    /// it must be.
    pub fn host_paths(&self, role: Role) -> Vec<RolePath<'_>> {
        fn p(field: String, path: &Path, writable: bool, kind: PathKind) -> RolePath<'_> {
            RolePath { field, path, writable, kind }
        }
        let r = self.role(role);
        let mut v = vec![p(format!("{role}.scratch"), r.scratch.as_path(), true, PathKind::Dir)];
        if let Some(m) = &r.models {
            v.push(p(format!("{role}.models"), m.as_path(), r.models_writable, PathKind::Dir));
        }
        if let Some(c) = &r.credential {
            v.push(p(format!("{role}.credential"), c.as_path(), false, PathKind::Secret));
        }
        for (i, b) in r.ro_binds.iter().enumerate() {
            v.push(p(format!("{role}.ro_binds[{i}].src"), b.src.as_path(), false, PathKind::Any));
        }
        v
    }
}
