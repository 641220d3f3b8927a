//! The operator's configuration: TOML types, parsing and validation.
//!
//! Parsing and the checks that need no filesystem ([`Config::parse`]) are pure and can be
//! unit-tested and fuzzed without privileges. [`Config::load`] adds the host checks
//! (existence, symlinks, ownership, permissions) that must pass before any process exists.

pub mod cdi;
pub mod init;

use std::collections::BTreeMap;
use std::fmt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::error::{Error, Result};
use crate::layout::{RESERVED_INSIDE, RUNTIME_ATTEST_DIR, SYSTEM_RO};
use crate::os::trusted::TrustedFile;

/// Default config location.
pub const DEFAULT_CONFIG: &str = "/etc/sealnode/sealnode.toml";
/// The config schema this build understands.
pub const SCHEMA_VERSION: u32 = 1;

/// Where `attest tpm-init` persists the attestation key unless `cell.tpm.ak_handle` says.
pub const DEFAULT_AK_HANDLE: u32 = 0x8101_0002;

/// `cell.tpm`: how to reach the TPM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TpmTarget {
    /// A tpm2-tools TCTI: `device:/dev/tpmrm0`, or `swtpm:host=127.0.0.1,port=2321` for a
    /// software TPM on loopback.
    pub tcti: String,
    pub ak_handle: u32,
}

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

/// `cell.tpm`: the TPM statements are quoted by.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TpmConfig {
    /// The tpm2-tools TCTI: `device:/dev/tpmrm0` (the kernel's resource manager), or
    /// `swtpm:host=127.0.0.1,port=N` for a software TPM on loopback.
    pub tcti: String,
    /// The persistent handle of the attestation key `sealnode attest tpm-init` made.
    #[serde(default = "default_ak_handle")]
    pub ak_handle: u32,
}

/// A TPM device node: named tpm* under /dev, or a character device the kernel's tpm or tpmrm
/// class owns (/sys/dev/char/MAJ:MIN/subsystem), whatever its name.
fn is_tpm_device(p: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("tpm")) {
        return true;
    }
    let Ok(md) = std::fs::metadata(p) else { return false };
    if !md.file_type().is_char_device() {
        return false;
    }
    let (maj, min) = (nix::sys::stat::major(md.rdev()), nix::sys::stat::minor(md.rdev()));
    std::fs::read_link(format!("/sys/dev/char/{maj}:{min}/subsystem"))
        .ok()
        .and_then(|l| l.file_name().map(|n| n == "tpm" || n == "tpmrm"))
        .unwrap_or(false)
}

fn default_ak_handle() -> u32 {
    DEFAULT_AK_HANDLE
}

impl TpmConfig {
    /// A software TPM on loopback: its command and control ports (the swtpm and mssim TCTIs
    /// reach the control channel at port + 1).
    pub fn loopback_ports(&self) -> Option<[u16; 2]> {
        let conf = self.tcti.strip_prefix("swtpm:").or_else(|| self.tcti.strip_prefix("mssim:"))?;
        let port = conf.split(',').rev().find_map(|kv| kv.strip_prefix("port="))?.parse::<u16>().ok()?;
        Some([port, port.wrapping_add(1)])
    }

    pub fn target(&self) -> TpmTarget {
        TpmTarget { tcti: self.tcti.clone(), ak_handle: self.ak_handle }
    }

    /// The TCTI's form, without touching the host: a device under /dev, or a software TPM on
    /// loopback (a TPM elsewhere would bind statements to another machine).
    pub fn check(&self) -> std::result::Result<(), (&'static str, String)> {
        if !(0x8100_0000..=0x817f_ffff).contains(&self.ak_handle) {
            return Err((
                "cell.tpm.ak_handle",
                format!("{:#010x} is not an owner persistent handle (0x81000000-0x817fffff)", self.ak_handle),
            ));
        }
        if let Some(dev) = self.tcti.strip_prefix("device:") {
            let p = Path::new(dev);
            if !p.is_absolute() || !p.starts_with("/dev") || dev.contains("..") {
                return Err(("cell.tpm.tcti", format!("{dev:?}: a TPM device is a path under /dev, e.g. /dev/tpmrm0")));
            }
            return Ok(());
        }
        let Some((kind, conf)) = self.tcti.split_once(':').filter(|(k, _)| matches!(*k, "swtpm" | "mssim")) else {
            return Err((
                "cell.tpm.tcti",
                format!("{:?}: expected device:/dev/tpmrm0, or swtpm:host=127.0.0.1,port=N", self.tcti),
            ));
        };
        let (mut host, mut port) = (None, None);
        for kv in conf.split(',') {
            match kv.split_once('=') {
                Some(("host", h)) => host = Some(h),
                Some(("port", n)) if n.parse::<u16>().is_ok_and(|p| p < u16::MAX) => port = Some(n),
                _ => return Err(("cell.tpm.tcti", format!("{kind}: {kv:?} is not host=ADDRESS or port=N"))),
            }
        }
        // The port is explicit: the config's egress check needs to know it (libtss2's default
        // would otherwise be an unseen 2321).
        if port.is_none() {
            return Err((
                "cell.tpm.tcti",
                format!("{kind}: give port=N (the TPM's command port; N + 1 is its control port)"),
            ));
        }
        match host {
            Some("127.0.0.1" | "localhost" | "::1") => Ok(()),
            Some(h) => Err((
                "cell.tpm.tcti",
                format!("{kind} host {h:?}: a software TPM must be on loopback (a TPM elsewhere binds statements to another machine)"),
            )),
            None => Err(("cell.tpm.tcti", format!("{kind}: give host=127.0.0.1"))),
        }
    }
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
    /// the read-only system binds ([`SYSTEM_RO`]): nothing to add.
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

/// Names that must never reach a role: proxies would route loopback engine calls away.
pub fn is_proxy_var(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with("_proxy")
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether a path inside a role lies in the layout sealnode builds itself.
pub fn reserved_inside(inside: &Path) -> bool {
    RESERVED_INSIDE.iter().any(|r| inside == Path::new(r) || (*r != "/" && inside.starts_with(r)))
}

/// Whether the host's `path` is what a role sees at the same path through the read-only
/// system binds: it resolves (symlinks too, as the role's recreated ones do) to a path under
/// a [`SYSTEM_RO`] entry that is bound as is.
fn in_system_view(path: &Path) -> bool {
    let Ok(real) = std::fs::canonicalize(path) else {
        return false;
    };
    // The path itself must be under a system path (bound, or a recreated symlink such as /lib
    // -> usr/lib): a path elsewhere is not in the role's view whatever it points to (unit test:
    // config::tests::only_a_path_under_a_system_path_is_in_the_system_view). Then what it
    // resolves to must be under a system path bound as is.
    let bound = |s: &&&str| std::fs::symlink_metadata(s).is_ok_and(|m| !m.file_type().is_symlink());
    SYSTEM_RO.iter().any(|s| path.starts_with(s)) && SYSTEM_RO.iter().filter(bound).any(|s| real.starts_with(s))
}

/// Where a driver's files live on a host: a CDI spec's mounts must come from here. Anything
/// else (a home, /proc, /sys, sealnode's own dirs, the node's credential) is refused, not
/// bound (tests/devices.rs: bad_cdi_specs_are_config_errors_naming_the_spec_and_entry).
const CDI_HOST_ROOTS: &[&str] = &["/usr", "/lib", "/lib32", "/lib64", "/opt", "/var/lib"];

/// Variables a CDI spec may not set: sealnode's own base (PATH, HOME, TMPDIR, LANG), the
/// dynamic loader's (LD_*) and sealnode's (SEALNODE_*). The config's `env.set` can set them.
fn cdi_env_refused(name: &str) -> bool {
    ["PATH", "HOME", "TMPDIR", "LANG"].contains(&name) || name.starts_with("LD_") || name.starts_with("SEALNODE_")
}

/// The first symlink among the components of an absolute path, if any (the child opens
/// device nodes with no symlink in any component; one on the way fails the start otherwise).
fn symlink_on_the_way(path: &Path) -> Option<PathBuf> {
    let mut here = PathBuf::from("/");
    for c in path.components().skip(1) {
        here.push(c);
        if std::fs::symlink_metadata(&here).is_ok_and(|m| m.file_type().is_symlink()) {
            return Some(here);
        }
    }
    None
}

/// A bind's mount point inside a read-only system bind (e.g. `/usr/...`) cannot be created in
/// the role's view: it must already be there, of the same kind as the bind's source. None when
/// the destination is not under a system bind, or is fine.
fn system_mount_point_problem(inside: &Path, src_is_dir: bool) -> Option<String> {
    let sys = SYSTEM_RO
        .iter()
        .map(Path::new)
        .find(|s| inside.starts_with(s) && std::fs::symlink_metadata(s).is_ok_and(|m| !m.file_type().is_symlink()))?;
    match std::fs::metadata(inside) {
        Ok(m) if m.is_dir() == src_is_dir => None,
        Ok(_) => Some(format!(
            "{} is a {} in the read-only system bind of {}, the bind's source a {}",
            inside.display(),
            if src_is_dir { "file" } else { "directory" },
            sys.display(),
            if src_is_dir { "directory" } else { "file" }
        )),
        Err(_) => Some(format!(
            "{} does not exist in the read-only system bind of {}, and no mount point can be made there; bind it elsewhere",
            inside.display(),
            sys.display()
        )),
    }
}

/// Does `a` contain `b` (or equal it), path-component-wise?
fn contains(a: &Path, b: &Path) -> bool {
    b.starts_with(a)
}

impl Config {
    /// Parse and check everything that needs no filesystem access: every problem found (see
    /// [`every_problem`]).
    pub fn parse(text: &str, file: &Path) -> Result<Config> {
        every_problem(text, file, &|t| Config::parse_once(t, file))
    }

    /// Parse and check, stopping at the first problem (its line from `text` where the
    /// deserializer gave one).
    fn parse_once(text: &str, file: &Path) -> Result<Config> {
        // Check the schema first so a newer file gets the clearest message.
        let probe: toml::Table = toml::from_str(text).map_err(|e| toml_error(file, text, e, None))?;
        match probe.get("schema") {
            None => return Err(Error::config(file, "schema", "missing; this build reads schema = 1")),
            Some(toml::Value::Integer(v)) if *v == i64::from(SCHEMA_VERSION) => {}
            Some(toml::Value::Integer(v)) if *v > i64::from(SCHEMA_VERSION) => {
                return Err(Error::config(
                    file,
                    "schema",
                    format!("schema {v} is newer than this sealnode understands (1); upgrade sealnode"),
                ))
            }
            Some(v) => return Err(Error::config(file, "schema", format!("unsupported schema {v}; expected 1"))),
        }
        let de = toml::Deserializer::parse(text).map_err(|e| toml_error(file, text, e, None))?;
        let mut cfg: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            toml_error(file, text, e.into_inner(), Some(path))
        })?;
        cfg.file = file.to_path_buf();
        cfg.check_pure()?;
        Ok(cfg)
    }

    /// Read, parse and check a config file, including host checks; the role users are looked
    /// up in the user database.
    pub fn load(file: &Path, inv: &Invoker) -> Result<Config> {
        Config::load_with(file, inv, None)
    }

    /// [`Config::load`] for a SIGHUP: the roles keep the ids `running` looked up at its load,
    /// and nothing is looked up (a user database that hangs, such as a FIFO bound over
    /// /etc/passwd, would hang the supervisor's loop; tests/gate.rs:
    /// a_reload_looks_no_user_up). Other users than `running`'s are refused: the running
    /// cell's user namespace maps those.
    pub fn reload(file: &Path, inv: &Invoker, running: &Config) -> Result<Config> {
        Config::load_with(file, inv, Some(running))
    }

    fn load_with(file: &Path, inv: &Invoker, running: Option<&Config>) -> Result<Config> {
        if !file.is_absolute() {
            let abs = std::env::current_dir().map_err(|e| Error::io("current directory", e))?.join(file);
            return Config::load_with(&abs, inv, running);
        }
        let config = crate::os::trusted::read(file, inv.uid).map_err(|e| Error::config(file, "(config file)", e))?;
        let text = std::str::from_utf8(&config.bytes)
            .map_err(|e| Error::config(file, "(config file)", format!("not UTF-8: {e}")))?;
        let ids = std::cell::Cell::new(None);
        let mut cfg = every_problem(text, file, &|t| {
            let cfg = Config::parse_once(t, file)?;
            ids.set(Some(cfg.check_host(inv, running).map_err(|e| rootless_hint(e, &cfg, inv))?));
            Ok(cfg)
        })?;
        let ids =
            ids.get().ok_or_else(|| Error::config(file, "(config file)", "no host check ran (internal error)"))?;
        let read = |path: &Path, field: String| {
            crate::os::trusted::read(path, inv.uid).map_err(|e| Error::config(file, field, e))
        };
        // Each role's policies and CDI spec, read through the checked path.
        let role_files = |role: Role| -> Result<(TrustedFile, TrustedFile, Option<CdiLoaded>)> {
            let r = cfg.role(role);
            let seccomp = read(&r.seccomp, format!("{role}.seccomp"))?;
            let landlock = read(&r.landlock, format!("{role}.landlock"))?;
            let cdi = match &r.devices_from {
                Some(d) => Some(cfg.load_cdi(role, d, read(&d.cdi, format!("{role}.devices_from.cdi"))?)?),
                None => None,
            };
            Ok((seccomp, landlock, cdi))
        };
        let (engine_seccomp, engine_landlock, engine_cdi) = role_files(Role::Engine)?;
        let (node_seccomp, node_landlock, node_cdi) = role_files(Role::Node)?;
        let launcher_user = match running {
            Some(r) => r.loaded.as_ref().and_then(|l| l.launcher_user.clone()),
            None if inv.rootful() => None,
            None => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(inv.uid)).ok().flatten().map(|u| u.name),
        };
        cfg.loaded = Some(Loaded {
            config,
            seccomp: [engine_seccomp, node_seccomp],
            landlock: [engine_landlock, node_landlock],
            cdi: [engine_cdi, node_cdi],
            ids,
            launcher_user,
        });
        cfg.check_no_role_tpm()?;
        Ok(cfg)
    }

    /// With `cell.tpm`, no role gets a TPM device (by `devices` or a CDI spec): with it a role
    /// could reset PCR 23 and quote with the attestation key. `check` and `run` refuse such a
    /// config (tests/attest.rs: with_a_tpm_no_role_gets_a_tpm_device).
    fn check_no_role_tpm(&self) -> Result<()> {
        if self.cell.tpm.is_none() {
            return Ok(());
        }
        for role in Role::ALL {
            if let Some(d) = self.devices(role).into_iter().find(|d| is_tpm_device(d)) {
                let field = if self.role(role).devices.iter().any(|x| x == d) { "devices" } else { "devices_from" };
                return Err(self.err(
                    format!("{role}.{field}"),
                    format!("{} is a TPM: with cell.tpm set, a role with it could reset PCR 23 and quote with the attestation key", d.display()),
                ));
            }
        }
        Ok(())
    }

    /// The role's policy files as loaded: (seccomp, landlock). An error for a config that was
    /// only parsed: nothing may start from policies that were not read through the checks.
    pub fn policy_files(&self, role: Role) -> Result<(&TrustedFile, &TrustedFile)> {
        let l = self.loaded(format!("{role}.seccomp"))?;
        Ok((&l.seccomp[role as usize], &l.landlock[role as usize]))
    }

    /// What [`Config::load`] read, or an error naming `field` for a config that was only
    /// parsed: nothing may start from policies or ids that were not read through the checks.
    pub fn loaded(&self, field: impl Into<String>) -> Result<&Loaded> {
        self.loaded.as_ref().ok_or_else(|| {
            Error::config(&self.file, field, "the config was not loaded (internal error: Config::load was not used)")
        })
    }

    /// The sha256 of the config file's bytes as loaded (empty for a config only parsed).
    pub fn config_sha256(&self) -> &str {
        self.loaded.as_ref().map_or("", |l| l.config.sha256.as_str())
    }

    /// The config's `cell.runtime_dir` alone (where the control socket is), read from its TOML
    /// without the rest of the checks: `ctl` reaches a running cell whose config was since
    /// edited into one that does not load.
    pub fn runtime_dir_of(file: &Path) -> Result<PathBuf> {
        let text = std::fs::read_to_string(file).map_err(|e| Error::config(file, "(config file)", cannot_read(e)))?;
        let v: toml::Table =
            toml::from_str(&text).map_err(|e| Error::config(file, "(config file)", format!("not TOML: {e}")))?;
        v.get("cell")
            .and_then(|c| c.get("runtime_dir"))
            .and_then(|d| d.as_str())
            .map(PathBuf::from)
            .ok_or_else(|| Error::config(file, "cell.runtime_dir", "missing"))
    }

    /// Read and parse without the host checks (ownership is judged against the launcher's
    /// uid): for clients such as `sealnode attest pubkey`, which only need the state dir.
    pub fn read_for_client(file: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(file).map_err(|e| Error::config(file, "(config file)", cannot_read(e)))?;
        Config::parse(&text, file)
    }

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

    /// Check a role's CDI edits against the host: every node exists and is the device the
    /// spec says; every file exists, is no socket, lies outside every role-writable dir and
    /// outside the sandbox's own layout. Errors name the config field, the spec and its entry.
    fn load_cdi(&self, role: Role, d: &DevicesFrom, spec: TrustedFile) -> Result<CdiLoaded> {
        use std::os::unix::fs::FileTypeExt;
        let field = format!("{role}.devices_from");
        let fail = |reason: String| self.err(field.clone(), format!("{}: {reason}", d.cdi.display()));
        // 4 MiB is far above any real spec (nvidia-ctk's are tens of KiB) and bounds what the
        // YAML parser is given, and so its memory: a larger spec is refused unparsed
        // (tests/devices.rs: bad_cdi_specs_are_config_errors_naming_the_spec_and_entry).
        if spec.bytes.len() > 4 << 20 {
            return Err(fail(format!("{} bytes: a CDI spec is at most 4 MiB", spec.bytes.len())));
        }
        let edits = crate::config::cdi::edits(&spec.bytes, &d.devices).map_err(fail)?;
        for n in &edits.nodes {
            if let Some(link) = symlink_on_the_way(&n.path) {
                return Err(fail(format!(
                    "{}.path: {} is a symlink on the way to {}",
                    n.entry,
                    link.display(),
                    n.path.display()
                )));
            }
            let md = std::fs::symlink_metadata(&n.path)
                .map_err(|e| fail(format!("{}.path: {}: {e}", n.entry, n.path.display())))?;
            let ft = md.file_type();
            let is_kind = match n.kind {
                Some('b') => ft.is_block_device(),
                Some(_) => ft.is_char_device(),
                None => ft.is_char_device() || ft.is_block_device(),
            };
            if !is_kind {
                return Err(fail(format!(
                    "{}.path: {} is not a {} device node",
                    n.entry,
                    n.path.display(),
                    match n.kind {
                        Some('b') => "block",
                        Some(_) => "character",
                        None => "character or block",
                    }
                )));
            }
            let (major, minor) = (libc::major(md.rdev()), libc::minor(md.rdev()));
            if n.major.is_some_and(|m| m != u64::from(major)) || n.minor.is_some_and(|m| m != u64::from(minor)) {
                return Err(fail(format!(
                    "{}: {} is device {major}:{minor}, the spec says {}:{} (a stale spec: regenerate it)",
                    n.entry,
                    n.path.display(),
                    n.major.map_or("*".into(), |m| m.to_string()),
                    n.minor.map_or("*".into(), |m| m.to_string())
                )));
            }
        }
        for (k, _) in &edits.env {
            if is_proxy_var(k) {
                return Err(fail(format!("env sets {k}: proxy variables never reach a role")));
            }
        }
        let writable: Vec<RolePath> =
            Role::ALL.iter().flat_map(|r| self.host_paths(*r)).filter(|p| p.writable).collect();
        let mut out = CdiLoaded { spec: d.cdi.clone(), sha256: spec.sha256.clone(), ..CdiLoaded::default() };
        out.left_out.extend(edits.ignored.iter().cloned());
        let mut edits = edits;
        let r = self.role(role);
        edits.env.retain(|(k, _)| {
            let keep = !cdi_env_refused(k) && !r.env.pass.contains(k);
            if !keep && !r.env.set.contains_key(k) {
                out.left_out.push((
                    format!("containerEdits.env {k}"),
                    format!("{k} is sealnode's own, the loader's or passed through by env.pass; set it in env.set to have it"),
                ));
            }
            keep
        });
        // Everything a role must never be handed from a spec: sealnode's own files and dirs,
        // each role's credential, models and scratch, the policies, either way round.
        let mut guarded: Vec<(String, PathBuf)> = vec![
            ("cell.state_dir".into(), self.cell.state_dir.clone()),
            ("cell.runtime_dir".into(), self.cell.runtime_dir.clone()),
            ("(config file)".into(), self.file.clone()),
        ];
        for other in Role::ALL {
            for p in self.host_paths(other) {
                guarded.push((p.field.clone(), p.path.to_path_buf()));
            }
            guarded.push((format!("{other}.seccomp"), self.role(other).seccomp.clone()));
            guarded.push((format!("{other}.landlock"), self.role(other).landlock.clone()));
        }
        guarded.retain(|(f, _)| !f.contains("ro_binds"));
        let ro_dsts: Vec<&Path> = r.ro_binds.iter().map(Bind::inside).collect();
        for m in &edits.mounts {
            let md = std::fs::symlink_metadata(&m.host)
                .map_err(|e| fail(format!("{}.hostPath: {}: {e}", m.entry, m.host.display())))?;
            if md.file_type().is_socket() {
                out.left_out.push((
                    m.entry.clone(),
                    format!(
                        "{} is a unix socket, a way to a host daemon: a role reaches no host service",
                        m.host.display()
                    ),
                ));
                continue;
            }
            if let Some(w) = writable.iter().find(|w| contains(w.path, &m.host) || contains(&m.host, w.path)) {
                return Err(fail(format!(
                    "{}.hostPath: {} overlaps {} ({}), which a role can write",
                    m.entry,
                    m.host.display(),
                    w.path.display(),
                    w.field
                )));
            }
            if !CDI_HOST_ROOTS.iter().any(|root| m.host.starts_with(root)) {
                return Err(fail(format!(
                    "{}.hostPath: {} is outside where a driver's files live ({}); bind it with ro_binds if you mean it",
                    m.entry,
                    m.host.display(),
                    CDI_HOST_ROOTS.join(", ")
                )));
            }
            if let Some((f, g)) = guarded.iter().find(|(_, g)| contains(g, &m.host) || contains(&m.host, g)) {
                return Err(fail(format!(
                    "{}.hostPath: {} overlaps {} ({f}), which no spec may hand a role",
                    m.entry,
                    m.host.display(),
                    g.display()
                )));
            }
            if let Some(dst) = ro_dsts.iter().find(|dst| contains(dst, &m.inside) || contains(&m.inside, dst)) {
                return Err(fail(format!(
                    "{}.containerPath: {} overlaps the ro_binds destination {}: a spec may not shadow the config's binds",
                    m.entry,
                    m.inside.display(),
                    dst.display()
                )));
            }
            if m.host == m.inside && in_system_view(&m.host) {
                out.in_view.push(m.inside.clone());
                continue;
            }
            if reserved_inside(&m.inside) {
                out.left_out.push((
                    m.entry.clone(),
                    format!(
                        "{} is in the sandbox's own layout (/etc, /run, /dev, /tmp are sealnode's)",
                        m.inside.display()
                    ),
                ));
                continue;
            }
            // Into the system view only the same file at the same path (in view, above): a spec
            // adds files, it never replaces or covers /usr's, libc included (tests/devices.rs:
            // bad_cdi_specs_are_config_errors_naming_the_spec_and_entry).
            if let Some(sys) = SYSTEM_RO.iter().find(|s| m.inside.starts_with(s) || Path::new(s).starts_with(&m.inside))
            {
                return Err(fail(format!(
                    "{}.containerPath: {} would replace or cover {} of the read-only system view; a spec may add files, not replace the host's (install the driver on the host, or bind it elsewhere)",
                    m.entry,
                    m.inside.display(),
                    sys
                )));
            }
            out.binds.push((m.entry.clone(), Bind { src: m.host.clone(), dst: Some(m.inside.clone()), exec: m.exec }));
        }
        out.edits = edits;
        Ok(out)
    }

    fn err(&self, field: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::config(&self.file, field, reason)
    }

    fn check_pure(&self) -> Result<()> {
        let h = &self.cell.hostname;
        if h.is_empty() || h.len() > 64 || !h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.') {
            return Err(self.err("cell.hostname", "must be 1-64 characters of [A-Za-z0-9.-]"));
        }
        self.abs("cell.state_dir", &self.cell.state_dir)?;
        if let Some(c) = &self.cell.cgroup {
            let ok = c.is_relative()
                && c.components().all(|p| matches!(p, std::path::Component::Normal(_)))
                && c.components().next().is_some();
            if !ok {
                return Err(self.err(
                    "cell.cgroup",
                    "must be a path relative to /sys/fs/cgroup without `..`, e.g. \"sealnode/node1\"",
                ));
            }
        }
        if self.cell.stop_timeout_s == 0 || self.cell.stop_timeout_s > 3600 {
            return Err(self.err("cell.stop_timeout_s", "must be between 1 and 3600"));
        }
        if !(5..=600).contains(&self.cell.preflight_timeout_s) {
            return Err(self.err("cell.preflight_timeout_s", "must be between 5 and 600"));
        }
        if self.cell.egress_max_connections == 0 || self.cell.egress_max_connections > 65536 {
            return Err(self.err("cell.egress_max_connections", "must be between 1 and 65536"));
        }
        if self.cell.egress_idle_timeout_s == 0 || self.cell.egress_idle_timeout_s > 7 * 86400 {
            return Err(self.err("cell.egress_idle_timeout_s", "must be between 1 and 604800 (seconds)"));
        }
        if self.cell.egress_connect_timeout_s == 0 || self.cell.egress_connect_timeout_s > 3600 {
            return Err(self.err("cell.egress_connect_timeout_s", "must be between 1 and 3600 (seconds)"));
        }
        self.abs("cell.runtime_dir", &self.cell.runtime_dir)?;
        if let Some(t) = &self.cell.tpm {
            t.check().map_err(|(field, why)| self.err(field, why))?;
            // A software TPM's ports are the TPM: a role that can connect to them can reset
            // PCR 23, quote with the attestation key, or evict it. So no egress may connect to
            // them at any address: 0.0.0.0, v4-mapped and the host's own addresses reach
            // loopback too (unit test:
            // config::tests::a_tpm_is_a_local_device_or_a_loopback_software_tpm).
            if let Some(ports) = t.loopback_ports() {
                for (i, e) in self.node.egress.iter().enumerate() {
                    let to = e.connect.as_deref().and_then(|c| c.parse::<std::net::SocketAddr>().ok());
                    if let Some(a) = to.filter(|a| ports.contains(&a.port())) {
                        return Err(self.err(
                            format!("node.egress[{i}].connect"),
                            format!("{a} is the TPM of cell.tpm ({}): a role that reaches it can reset PCR 23 and quote with the attestation key", t.tcti),
                        ));
                    }
                }
            }
        }
        if let Some(u) = &self.cell.rootful {
            parse_user_spec(&u.engine).map_err(|r| self.err("cell.rootful.engine", r))?;
            parse_user_spec(&u.node).map_err(|r| self.err("cell.rootful.node", r))?;
            if u.engine == u.node {
                return Err(self.err("cell.rootful.node", "engine and node must run as different users"));
            }
        }
        for role in Role::ALL {
            self.check_role_pure(role)?;
        }
        self.check_overlaps()?;
        self.check_writable_outside_statements()?;
        self.cross_checks()
    }

    /// Where the config says the same thing twice, the two must agree (each of these otherwise
    /// runs, and fails as "engine exited with status 1" or a node looping on its gateway's
    /// name): the engine's `--port` (or `OLLAMA_HOST`) and `engine.port`; the node's
    /// engine address (`OLLAMA_HOST`, `FRUTEBOX_`/`STEVAI_` `OLLAMA_HOST`/`LLAMACPP_HOST`) and
    /// `engine.port`; the node's `--gateway-url` and a declared `egress` host and port.
    fn cross_checks(&self) -> Result<()> {
        let e = &self.engine;
        // Required of the engine (check_role_pure); nothing to compare without it.
        let Some(port) = e.port else { return Ok(()) };
        for (i, a) in e.command.iter().enumerate().skip(1) {
            let value = match a.strip_prefix("--port=") {
                Some(v) => Some((i, v)),
                None if a == "--port" => e.command.get(i + 1).map(|v| (i + 1, v.as_str())),
                None => None,
            };
            if let Some((at, v)) = value {
                if v.parse::<u32>().ok() != Some(port) {
                    return Err(self.err(
                        format!("engine.command[{at}]"),
                        format!("the engine listens on --port {v}, but engine.port is {port}: make them the same"),
                    ));
                }
            }
        }
        if let Some(h) = e.env.set.get("OLLAMA_HOST") {
            if let Some(p) = url_port(h).filter(|p| *p != port) {
                return Err(self.err(
                    "engine.env.set.OLLAMA_HOST",
                    format!("the engine listens on port {p} ({h}), but engine.port is {port}: make them the same"),
                ));
            }
        }
        let n = &self.node;
        for k in [
            "OLLAMA_HOST",
            "FRUTEBOX_OLLAMA_HOST",
            "STEVAI_OLLAMA_HOST",
            "FRUTEBOX_LLAMACPP_HOST",
            "STEVAI_LLAMACPP_HOST",
        ] {
            let Some(h) = n.env.set.get(k) else { continue };
            if let Some(p) = url_port(h).filter(|p| *p != port) {
                return Err(self.err(
                    format!("node.env.set.{k}"),
                    format!(
                        "the node calls the engine at port {p} ({h}), but the engine's port, the one the cell forwards, \
                         is engine.port = {port}"
                    ),
                ));
            }
        }
        for (i, a) in n.command.iter().enumerate().skip(1) {
            let value = match a.strip_prefix("--gateway-url=") {
                Some(v) => Some((i, v)),
                None if a == "--gateway-url" => n.command.get(i + 1).map(|v| (i + 1, v.as_str())),
                None => None,
            };
            let Some((at, url)) = value else { continue };
            let Some((host, port)) = url_host_port(url) else { continue };
            if !n.egress.iter().any(|g| g.host.eq_ignore_ascii_case(&host) && g.port == port) {
                let declared: Vec<String> = n.egress.iter().map(|g| format!("{}:{}", g.host, g.port)).collect();
                return Err(self.err(
                    format!("node.command[{at}]"),
                    format!(
                        "the node's gateway is {host}:{port} ({url}), which node.egress does not declare ({}): the \
                         node could not reach it; add {{ host = \"{host}\", port = {port} }} to node.egress",
                        if declared.is_empty() { "no egress at all".to_string() } else { declared.join(", ") }
                    ),
                ));
            }
        }
        Ok(())
    }

    fn abs(&self, field: &str, p: &Path) -> Result<()> {
        if !p.is_absolute() {
            return Err(self.err(field, format!("{} is a relative path; use an absolute path", p.display())));
        }
        if p.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
            return Err(self.err(field, format!("{} contains '..'", p.display())));
        }
        Ok(())
    }

    fn check_role_pure(&self, role: Role) -> Result<()> {
        self.check_role_program(role)?;
        self.check_role_paths(role)?;
        self.check_role_limits(role)?;
        self.check_role_env(role)?;
        self.check_role_egress(role)?;
        self.check_role_ready(role)?;
        Ok(())
    }

    /// A role's program: command, pin, port.
    fn check_role_program(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        match r.command.first() {
            None => return Err(self.err(f("command"), "must name a program")),
            Some(p) => self.abs(&f("command[0]"), Path::new(p))?,
        }
        if let Some(d) = &r.sha256 {
            if d.len() != 64 || !d.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(self.err(f("sha256"), "must be 64 hexadecimal digits"));
            }
        }
        match (role, r.port) {
            (Role::Engine, None) => {
                return Err(self.err(f("port"), "the engine must declare the TCP port it listens on"))
            }
            (Role::Engine, Some(p)) if !(1..=65535).contains(&p) => {
                return Err(self.err(f("port"), format!("{p} is out of range 1-65535")))
            }
            (Role::Node, Some(_)) => return Err(self.err(f("port"), "only the engine listens; the node has no port")),
            _ => {}
        }
        Ok(())
    }

    /// A role's paths: policies, scratch, models, credential, extra binds, devices.
    fn check_role_paths(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        self.abs(&f("seccomp"), &r.seccomp)?;
        self.abs(&f("landlock"), &r.landlock)?;
        self.abs(&f("scratch"), &r.scratch)?;
        match (role, &r.models) {
            (Role::Engine, Some(m)) => self.abs(&f("models"), m)?,
            (Role::Node, Some(_)) => return Err(self.err(f("models"), "only the engine sees models")),
            _ => {}
        }
        if role == Role::Node && r.models_writable {
            return Err(self.err(f("models_writable"), "only the engine has a model dir"));
        }
        match (role, &r.credential) {
            (Role::Node, Some(c)) => self.abs(&f("credential"), c)?,
            (Role::Engine, Some(_)) => {
                return Err(self.err(f("credential"), "the engine never sees the node's credential"))
            }
            _ => {}
        }
        for (i, b) in r.ro_binds.iter().enumerate() {
            self.abs(&f(&format!("ro_binds[{i}].src")), &b.src)?;
            self.abs(&f(&format!("ro_binds[{i}].dst")), b.inside())?;
            let inside = b.inside();
            if reserved_inside(inside) {
                return Err(self.err(
                    f(&format!("ro_binds[{i}].dst")),
                    format!("{} is reserved for the sandbox's own layout", inside.display()),
                ));
            }
            for other in Role::ALL {
                if let Some(c) = &self.role(other).credential {
                    if contains(&b.src, c) || contains(c, &b.src) {
                        return Err(self.err(
                            f(&format!("ro_binds[{i}].src")),
                            format!(
                                "{} overlaps {other}.credential {}; the credential reaches the node only through `credential`",
                                b.src.display(),
                                c.display()
                            ),
                        ));
                    }
                }
            }
        }
        for (i, d) in r.devices.iter().enumerate() {
            self.abs(&f(&format!("devices[{i}]")), d)?;
            if !d.starts_with("/dev/") {
                return Err(self.err(f(&format!("devices[{i}]")), "devices must live under /dev/"));
            }
        }
        if let Some(d) = &r.devices_from {
            self.abs(&f("devices_from.cdi"), &d.cdi)?;
            if d.devices.is_empty() {
                return Err(
                    self.err(f("devices_from.devices"), "name at least one device, e.g. [\"nvidia.com/gpu=0\"]")
                );
            }
            for (i, q) in d.devices.iter().enumerate() {
                crate::config::cdi::parse_qualified(q)
                    .map_err(|e| self.err(f(&format!("devices_from.devices[{i}]")), e))?;
            }
        }
        Ok(())
    }

    /// A role's sizes, restart limits.
    fn check_role_limits(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        if r.tmp_size_mb == 0 || r.tmp_size_mb > 65536 {
            return Err(self.err(f("tmp_size_mb"), "must be between 1 and 65536"));
        }
        if r.scratch_max_mb.is_some_and(|m| m == 0 || m > 1024 * 1024) {
            return Err(self.err(f("scratch_max_mb"), "must be between 1 and 1048576 (MiB)"));
        }
        if r.restart_limit.burst == 0 || r.restart_limit.burst > 1000 {
            return Err(self.err(f("restart_limit.burst"), "must be between 1 and 1000"));
        }
        if r.restart_limit.interval_s == 0 || r.restart_limit.interval_s > 86400 {
            return Err(self.err(f("restart_limit.interval_s"), "must be between 1 and 86400 (seconds)"));
        }
        // Each field is reported where it is written: the role's own or the cell's default.
        let l = self.limits(role);
        let at = |k: &str| self.limit_field(role, k);
        if let Some(m) = l.memory_max_mb {
            if !(16..=16 * 1024 * 1024).contains(&m) {
                return Err(self.err(at("memory_max_mb"), "must be between 16 and 16777216 (MiB)"));
            }
        }
        if let Some(h) = l.memory_high_mb {
            if h < 16 || l.memory_max_mb.is_some_and(|m| h > m) {
                return Err(self.err(at("memory_high_mb"), "must be at least 16 (MiB) and not above memory_max_mb"));
            }
        }
        if l.memory_swap_max_mb.is_some_and(|s| s > 16 * 1024 * 1024) {
            return Err(self.err(at("memory_swap_max_mb"), "must be at most 16777216 (MiB)"));
        }
        if let Some(p) = l.pids_max {
            if !(8..=4_194_304).contains(&p) {
                return Err(self.err(at("pids_max"), "must be between 8 and 4194304 (a role needs a few processes)"));
            }
        }
        if let Some(c) = l.cpu_max {
            if !(c.is_finite() && (0.01..=4096.0).contains(&c)) {
                return Err(self.err(at("cpu_max"), "must be a number of CPUs between 0.01 and 4096"));
            }
        }
        for (k, w) in [("cpu_weight", l.cpu_weight), ("io_weight", l.io_weight)] {
            if w.is_some_and(|w| !(1..=10000).contains(&w)) {
                return Err(self.err(at(k), "must be between 1 and 10000"));
            }
        }
        for (i, io) in l.io_max.iter().enumerate() {
            let k = format!("{}[{i}]", at("io_max"));
            self.abs(&format!("{k}.device"), &io.device)?;
            if [io.rbps, io.wbps, io.riops, io.wiops].iter().all(Option::is_none) {
                return Err(self.err(k, "set at least one of rbps, wbps, riops, wiops"));
            }
            if [io.rbps, io.wbps, io.riops, io.wiops].contains(&Some(0)) {
                return Err(self.err(k, "a cap of 0 would stop the role's I/O; leave the field out for no cap"));
            }
        }
        Ok(())
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

    /// A role's environment: names only, never a proxy variable.
    fn check_role_env(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        for k in r.env.set.keys() {
            if !valid_env_name(k) {
                return Err(self.err(f(&format!("env.set.{k}")), "not a valid variable name"));
            }
            if is_proxy_var(k) {
                return Err(self.err(
                    f(&format!("env.set.{k}")),
                    "proxy variables never reach a role (they would route loopback engine calls through a proxy)",
                ));
            }
        }
        for (i, k) in r.env.pass.iter().enumerate() {
            if !valid_env_name(k) {
                return Err(self.err(f(&format!("env.pass[{i}]")), format!("{k:?} is not a valid variable name")));
            }
            if is_proxy_var(k) {
                return Err(self.err(
                    f(&format!("env.pass[{i}]")),
                    format!("{k} is a proxy variable; proxies never reach a role"),
                ));
            }
        }
        Ok(())
    }

    /// A role's egress upstreams.
    fn check_role_egress(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        if role == Role::Engine && !r.egress.is_empty() {
            return Err(self.err(f("egress"), "the engine has no egress at all (models are staged by the operator)"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, e) in r.egress.iter().enumerate() {
            let fe = f(&format!("egress[{i}]"));
            let h = &e.host;
            if h.is_empty()
                || h.len() > 253
                || h.parse::<std::net::IpAddr>().is_ok()
                || inet_aton_accepts(h)
                || !h
                    .split('.')
                    .all(|l| !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
            {
                return Err(self.err(format!("{fe}.host"), format!("{h:?} must be a DNS name (the node dials it; sealnode maps it to a cell-local address in /etc/hosts)")));
            }
            if h == "localhost" {
                return Err(self.err(format!("{fe}.host"), "localhost is the cell's own loopback"));
            }
            if !(1..=65535).contains(&e.port) {
                return Err(self.err(format!("{fe}.port"), format!("{} is out of range 1-65535", e.port)));
            }
            if let Some(c) = &e.connect {
                if c.parse::<std::net::SocketAddr>().is_err() {
                    return Err(self.err(format!("{fe}.connect"), format!("{c:?} must be an ip:port address")));
                }
            }
            if !seen.insert((h.clone(), e.port)) {
                return Err(self.err(fe, format!("{h}:{} is declared twice", e.port)));
            }
        }
        if r.egress.len() > 250 {
            return Err(self.err(f("egress"), "at most 250 upstreams"));
        }
        Ok(())
    }

    /// A role's the engine's readiness check and the rlimits.
    fn check_role_ready(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        if role == Role::Node && r.ready_set.is_some() {
            return Err(
                self.err(f("ready"), "only the engine has a readiness check; the node starts once the engine is ready")
            );
        }
        if role == Role::Engine {
            let ready = r.ready();
            if !ready.path.starts_with('/') || ready.path.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(self.err(f("ready.path"), "must be an absolute URL path without spaces"));
            }
            if ready.timeout_s == 0 || ready.timeout_s > 3600 {
                return Err(self.err(f("ready.timeout_s"), "must be between 1 and 3600"));
            }
        }
        let l = &r.rlimits;
        for (k, v) in [("nofile", l.nofile), ("nproc", l.nproc), ("fsize_mb", l.fsize_mb)] {
            if v == 0 || v > (1 << 40) {
                return Err(self.err(f(&format!("rlimits.{k}")), "must be a positive, finite number"));
            }
        }
        Ok(())
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

    /// What sealnode trusts (this config, every policy file, its state and runtime dirs) may
    /// not lie in or below a directory a role can write: the role could rewrite it. Rootless,
    /// the roles are the launcher's own uid, so the owner checks cannot catch this; this check
    /// does, in both modes (tests/gate.rs: nothing_sealnode_trusts_may_live_in_a_role_writable_dir).
    fn check_trusted_outside_roles(&self) -> Result<()> {
        let mut trusted: Vec<(String, &Path)> = vec![
            ("(config file)".into(), self.file.as_path()),
            ("cell.state_dir".into(), self.cell.state_dir.as_path()),
            ("cell.runtime_dir".into(), self.cell.runtime_dir.as_path()),
        ];
        for role in Role::ALL {
            trusted.push((format!("{role}.seccomp"), self.role(role).seccomp.as_path()));
            trusted.push((format!("{role}.landlock"), self.role(role).landlock.as_path()));
            if let Some(d) = &self.role(role).devices_from {
                trusted.push((format!("{role}.devices_from.cdi"), d.cdi.as_path()));
            }
        }
        let writable: Vec<RolePath> =
            Role::ALL.iter().flat_map(|r| self.host_paths(*r)).filter(|p| p.writable).collect();
        for (field, path) in &trusted {
            for RolePath { field: wf, path: w, .. } in &writable {
                if contains(w, path) {
                    return Err(self.err(
                        field.clone(),
                        format!(
                            "{} is inside {} ({wf}), which a role can write; keep what sealnode trusts outside every role's writable dirs",
                            path.display(),
                            w.display()
                        ),
                    ));
                }
            }
        }
        // The state dir holds the attestation key: no role may see it, through the system view
        // (tests/attest.rs: a_state_dir_in_the_system_view_is_refused) ...
        let real = std::fs::canonicalize(&self.cell.state_dir).unwrap_or_else(|_| self.cell.state_dir.clone());
        if let Some(s) = SYSTEM_RO.iter().find(|s| self.cell.state_dir.starts_with(s) || real.starts_with(s)) {
            return Err(self.err(
                "cell.state_dir",
                format!(
                    "{} is under {s}, which every role sees read-only; the state dir holds the attestation key (use /var/lib/sealnode)",
                    self.cell.state_dir.display()
                ),
            ));
        }
        // ... or through any of its binds (after the writable dirs, whose message is the more
        // specific one).
        for RolePath { field, path, .. } in Role::ALL.iter().flat_map(|r| self.host_paths(*r)) {
            if contains(path, &self.cell.state_dir) {
                return Err(self.err(
                    "cell.state_dir",
                    format!(
                        "{} is inside {} ({field}), which a role sees; the state dir holds the attestation key and must be outside every role's view",
                        self.cell.state_dir.display(),
                        path.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A dir a role can write (its scratch, a writable model dir) must not be or lie in the
    /// statements' dir sealnode makes in the runtime dir (RUNTIME_ATTEST_DIR), which the node
    /// sees as INSIDE_ATTESTATION_DIR: rootless, the owner checks pass (one uid), and a role
    /// writing there could hand the node a statement sealnode never signed. (A role's dir
    /// holding sealnode's own: check_trusted_outside_roles; one dir named by two fields under
    /// two paths: the run's locks.)
    fn check_writable_outside_statements(&self) -> Result<()> {
        let dir = self.cell.runtime_dir.join(RUNTIME_ATTEST_DIR);
        for w in Role::ALL.iter().flat_map(|r| self.host_paths(*r)).filter(|p| p.writable) {
            if contains(&dir, w.path) {
                return Err(self.err(
                    w.field.clone(),
                    format!(
                        "{} is in {}, sealnode's own dir for the node's statements (in cell.runtime_dir); give the role a dir of its own outside it",
                        w.path.display(),
                        dir.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A writable dir must not overlap any other bound path, in either role.
    fn check_overlaps(&self) -> Result<()> {
        let all: Vec<_> = Role::ALL.iter().flat_map(|r| self.host_paths(*r)).collect();
        for (i, RolePath { field: fa, path: a, writable: wa, .. }) in all.iter().enumerate() {
            for RolePath { field: fb, path: b, writable: wb, .. } in all.iter().skip(i + 1) {
                if (*wa || *wb) && (contains(a, b) || contains(b, a)) {
                    let (wf, wp, of, op) = if *wa { (fa, a, fb, b) } else { (fb, b, fa, a) };
                    return Err(self.err(
                        wf.clone(),
                        format!(
                            "writable {} overlaps {} ({of}); writable dirs must be disjoint from every other bound path",
                            wp.display(),
                            op.display()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Which host ids `role` runs as, as [`Config::load`] resolved them (the user database is
    /// not asked again while the cell runs).
    pub fn role_ids(&self, role: Role) -> Result<Ids> {
        let field = if self.cell.rootful.is_some() { format!("cell.rootful.{role}") } else { "cell.rootful".into() };
        Ok(self.loaded(field)?.ids[role as usize])
    }

    /// Which host ids each role runs as: a user name is looked up in the user database (at
    /// load only: [`Config::role_ids`] after).
    fn resolve_role_ids(&self, role: Role, inv: &Invoker) -> Result<Ids> {
        if !inv.rootful() {
            return Ok(Ids { uid: inv.uid, gid: inv.gid });
        }
        let Some(u) = &self.cell.rootful else {
            return Err(self.err(
                "cell.rootful",
                "required when sealnode runs as root: name an unprivileged user per role (engine = \"sealnode-engine\", node = \"sealnode-node\")",
            ));
        };
        let (field, spec) = match role {
            Role::Engine => ("cell.rootful.engine", &u.engine),
            Role::Node => ("cell.rootful.node", &u.node),
        };
        let ids = match parse_user_spec(spec).map_err(|r| self.err(field, r))? {
            UserSpec::Ids(ids) => ids,
            UserSpec::Name(n) => match nix::unistd::User::from_name(&n) {
                Ok(Some(u)) => Ids { uid: u.uid.as_raw(), gid: u.gid.as_raw() },
                Ok(None) => return Err(self.err(field, format!("no such user {n:?} (create it: useradd --system --no-create-home --shell /usr/sbin/nologin {n})"))),
                Err(e) => return Err(self.err(field, format!("cannot look up user {n:?}: {e}"))),
            },
        };
        if ids.uid == 0 || ids.gid == 0 {
            return Err(self.err(field, "must be an unprivileged user (uid and gid not 0)"));
        }
        Ok(ids)
    }

    /// A role's rlimits are set inside its user namespace, where no hard limit can be raised:
    /// each must be within this process's own hard limit, or the sandbox would fail with EPERM
    /// at every start; `check` and `run` both refuse it (tests/check_run.rs:
    /// an_rlimit_above_the_launchers_hard_limit_is_refused_by_both).
    fn check_rlimits_within_the_launchers(&self) -> Result<()> {
        use nix::sys::resource::{getrlimit, Resource};
        for role in Role::ALL {
            let l = &self.role(role).rlimits;
            for (name, res, value, unit) in [
                ("nofile", Resource::RLIMIT_NOFILE, l.nofile, 1),
                ("nproc", Resource::RLIMIT_NPROC, l.nproc, 1),
                ("fsize_mb", Resource::RLIMIT_FSIZE, l.fsize_mb, 1 << 20),
                ("memlock_kb", Resource::RLIMIT_MEMLOCK, l.memlock_kb, 1 << 10),
            ] {
                let Ok((_, hard)) = getrlimit(res) else { continue };
                if hard != libc::RLIM_INFINITY && value.saturating_mul(unit) > hard {
                    return Err(self.err(
                        format!("{role}.rlimits.{name}"),
                        format!(
                            "{value} is above sealnode's own hard limit ({}), which no role can raise: lower it, or \
                             raise sealnode's (the unit's Limit{}=, or ulimit -H)",
                            hard / unit,
                            match name {
                                "nofile" => "NOFILE",
                                "nproc" => "NPROC",
                                "fsize_mb" => "FSIZE",
                                _ => "MEMLOCK",
                            }
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Host checks: files exist, no symlinks on role paths, ownership and modes. Returns the
    /// host ids each role runs as: looked up here, once, or the `running` config's.
    fn check_host(&self, inv: &Invoker, running: Option<&Config>) -> Result<[Ids; 2]> {
        self.check_trusted_outside_roles()?;
        self.check_rlimits_within_the_launchers()?;
        let ids = match running {
            None => [self.resolve_role_ids(Role::Engine, inv)?, self.resolve_role_ids(Role::Node, inv)?],
            // Rootless, the roles run as sealnode's own user whatever cell.rootful says.
            Some(r) if !inv.rootful() || r.cell.rootful == self.cell.rootful => r.loaded("cell.rootful")?.ids,
            Some(_) => {
                return Err(self.err(
                    "cell.rootful",
                    "changed, but the running cell's user namespace maps the old users (a reload looks no user up); restart sealnode to apply it",
                ))
            }
        };
        if inv.rootful() && ids[0] == ids[1] {
            return Err(self.err("cell.rootful.node", "engine and node must run as different users"));
        }
        for (field, dir) in [("cell.state_dir", &self.cell.state_dir), ("cell.runtime_dir", &self.cell.runtime_dir)] {
            self.check_own_dir(field, dir, inv)?;
        }
        if let Some(t) = &self.cell.tpm {
            if let Some(tool) =
                crate::layout::TPM_QUOTE_TOOLS.iter().find(|t| !Path::new(crate::layout::TPM_TOOLS).join(t).is_file())
            {
                return Err(self.err(
                    "cell.tpm",
                    format!("{}/{tool} is missing: install Debian's tpm2-tools", crate::layout::TPM_TOOLS),
                ));
            }
            if let Some(dev) = t.tcti.strip_prefix("device:") {
                use std::os::unix::fs::FileTypeExt;
                match std::fs::metadata(dev) {
                    Ok(m) if m.file_type().is_char_device() => {}
                    Ok(_) => return Err(self.err("cell.tpm.tcti", format!("{dev} is not a character device"))),
                    Err(e) => {
                        return Err(self.err(
                            "cell.tpm.tcti",
                            format!(
                                "{dev}: {e} (no TPM here? under the unit, see docs/attestation.md for the drop-in)"
                            ),
                        ))
                    }
                }
            }
        }
        for role in Role::ALL {
            let r = self.role(role);
            for p in self.host_paths(role) {
                self.check_role_path(role, &p, ids[role as usize], inv)?;
            }
            for (i, b) in r.ro_binds.iter().enumerate() {
                if b.src.starts_with("/proc") {
                    return Err(self.err(
                        format!("{role}.ro_binds[{i}].src"),
                        "the host's /proc shows the host's processes; each role has its own /proc",
                    ));
                }
                if let Some(why) = system_mount_point_problem(b.inside(), b.src.is_dir()) {
                    return Err(self.err(format!("{role}.ro_binds[{i}].dst"), why));
                }
            }
            for (i, d) in r.devices.iter().enumerate() {
                if let Some(link) = symlink_on_the_way(d) {
                    return Err(self.err(
                        format!("{role}.devices[{i}]"),
                        format!("{} is a symlink on the way to {}", link.display(), d.display()),
                    ));
                }
                let md = std::fs::symlink_metadata(d)
                    .map_err(|e| self.err(format!("{role}.devices[{i}]"), format!("{}: {e}", d.display())))?;
                use std::os::unix::fs::FileTypeExt;
                if !(md.file_type().is_char_device() || md.file_type().is_block_device()) {
                    return Err(
                        self.err(format!("{role}.devices[{i}]"), format!("{} is not a device node", d.display()))
                    );
                }
            }
        }
        Ok(ids)
    }

    /// Open a role path without following symlinks and check it (type, mode, owner) on that
    /// very descriptor. Returns its metadata, so the caller records (dev, inode) of exactly
    /// what was checked: a path swapped later is caught in the child (ESTALE). At every start
    /// (the path may have changed since load); the role's ids are the loaded ones.
    pub fn checked_role_path(&self, role: Role, p: &RolePath, inv: &Invoker) -> Result<std::fs::Metadata> {
        self.check_role_path(role, p, self.role_ids(role)?, inv)
    }

    fn check_role_path(&self, role: Role, p: &RolePath, owner: Ids, inv: &Invoker) -> Result<std::fs::Metadata> {
        let (field, path, writable) = (p.field.as_str(), p.path, p.writable);
        let md = self.no_symlink_stat(field, path)?;
        match p.kind {
            PathKind::Dir if !md.is_dir() => {
                return Err(self.err(field.to_string(), format!("{} is not a directory", path.display())))
            }
            PathKind::Secret if !md.is_file() => {
                return Err(self.err(field.to_string(), format!("{} is not a regular file", path.display())))
            }
            _ => {}
        }
        let mode = md.mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Err(self.err(
                field.to_string(),
                format!(
                    "{} is writable by group or others (mode {:o}); make it 0755/0700 or stricter",
                    path.display(),
                    mode
                ),
            ));
        }
        if writable {
            if md.uid() != owner.uid {
                return Err(self.err(
                    field.to_string(),
                    format!(
                        "{} is owned by uid {} but the {role} runs as uid {}; chown it to the role's user",
                        path.display(),
                        md.uid(),
                        owner.uid
                    ),
                ));
            }
        } else if md.uid() != 0 && md.uid() != inv.uid && md.uid() != owner.uid {
            return Err(self.err(
                field.to_string(),
                format!(
                    "{} is owned by uid {}, another user; it must be owned by root, the launcher or the role",
                    path.display(),
                    md.uid()
                ),
            ));
        }
        if p.kind == PathKind::Secret && mode & 0o077 != 0 {
            return Err(self.err(
                field.to_string(),
                format!("{} is readable by group or others (mode {:o}); chmod 0400", path.display(), mode),
            ));
        }
        Ok(md)
    }

    /// sealnode's own dirs (receipts, control socket): if present, a real directory owned by
    /// the launcher (or root) and writable by nobody else. Otherwise another local user could
    /// swap files (or a symlink for the control socket) under sealnode's feet.
    fn check_own_dir(&self, field: &str, dir: &Path, inv: &Invoker) -> Result<()> {
        // The same walk and checks `run` does when it opens the dir (trusted::own_dir).
        crate::os::trusted::check_own_dir(dir, inv.uid).map_err(|e| self.err(field, e))
    }

    /// Stat a path, refusing symlinks in any component.
    fn no_symlink_stat(&self, field: &str, path: &Path) -> Result<std::fs::Metadata> {
        match crate::os::sys::open_path_no_symlinks(path) {
            Ok(fd) => {
                std::fs::File::from(fd).metadata().map_err(|e| self.err(field, format!("{}: {e}", path.display())))
            }
            Err(nix::errno::Errno::ELOOP) => {
                Err(self.err(field, format!("{} is reached through a symlink; name the real path", path.display())))
            }
            Err(nix::errno::Errno::ENOENT) => Err(self.err(field, format!("{} does not exist", path.display()))),
            Err(e) => Err(self.err(field, format!("{}: {}", path.display(), e.desc()))),
        }
    }
}

enum UserSpec {
    Name(String),
    Ids(Ids),
}

fn parse_user_spec(s: &str) -> std::result::Result<UserSpec, String> {
    if let Some((u, g)) = s.split_once(':') {
        let uid = u.parse().map_err(|_| format!("{s:?}: uid must be a number"))?;
        let gid = g.parse().map_err(|_| format!("{s:?}: gid must be a number"))?;
        if uid == 0 || gid == 0 {
            return Err("must be an unprivileged user (uid and gid not 0)".into());
        }
        return Ok(UserSpec::Ids(Ids { uid, gid }));
    }
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(format!("{s:?} is neither a user name nor \"uid:gid\""));
    }
    if s == "root" {
        return Err("must be an unprivileged user, not root".into());
    }
    Ok(UserSpec::Name(s.to_string()))
}

/// A TOML error as a config error: the field's path from the deserializer (`engine.port`,
/// `engine.rlimits.nofile`, `node.egress[0].port`), the line the error points at, and the
/// reason. Unknown and missing fields are named with their own path ("`.` is the top level").
fn toml_error(file: &Path, text: &str, e: toml::de::Error, path: Option<String>) -> Error {
    let msg = e.message().trim().to_string();
    let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
    // serde_path_to_error names the table an unknown or missing field is in; the field itself
    // is in the message ("unknown field `engnie`, expected one of ...").
    let named = |prefix: &str| msg.strip_prefix(prefix).and_then(|rest| rest.split('`').next()).map(str::to_string);
    let table = path.filter(|p| p != ".");
    // The path of an unknown field already ends in it; a missing field's ends at its table.
    let join = |k: &str| match &table {
        Some(t) if t == k || t.ends_with(&format!(".{k}")) => t.clone(),
        Some(t) => format!("{t}.{k}"),
        None => k.to_string(),
    };
    let (mut field, reason) = if let Some(k) = named("unknown field `") {
        let expected = msg
            .split_once(", expected ")
            .map(|(_, x)| x.trim_start_matches("one of ").replace('`', ""))
            .unwrap_or_default();
        // The closest known name, when one is close: "did you mean", not the whole list.
        let closest = expected
            .split(", ")
            .map(|c| (strsim::jaro_winkler(&k, c), c))
            .filter(|(score, _)| *score >= 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, c)| c.to_string());
        let reason = match closest {
            Some(c) => format!("unknown field; did you mean `{c}`? (docs/config.md)"),
            None if expected.is_empty() => {
                "unknown field; check the spelling and the table it is in (docs/config.md)".into()
            }
            None => format!(
                "unknown field (expected {expected}); check the spelling and the table it is in (docs/config.md)"
            ),
        };
        (join(&k), reason)
    } else if let Some(k) = named("missing field `") {
        (join(&k), "missing; this field is required (docs/config.md)".to_string())
    } else {
        match &table {
            Some(t) => (t.clone(), msg),
            None if e.span().is_some() => ("(syntax)".to_string(), msg),
            None => ("(file)".to_string(), msg),
        }
    };
    if let Some(l) = line {
        let at = if reason.starts_with("missing") { "in the table at line" } else { "line" };
        field.push_str(&format!(" ({at} {l})"));
    }
    // A key is the file's text: shown escaped, as every value is, so a key holding an escape
    // sequence cannot drive the operator's terminal (unit test:
    // config::tests::keys_are_shown_escaped).
    Error::config(file, crate::os::escape::clean(field.as_bytes()), crate::os::escape::clean(reason.as_bytes()))
}

/// The port of `http://host:port`, `host:port` or `:port` (an address as OLLAMA_HOST takes it),
/// if one is given.
fn url_port(s: &str) -> Option<u32> {
    let rest = s.split_once("://").map_or(s, |(_, r)| r);
    let hostport = rest.split('/').next()?;
    let (_, port) = hostport.rsplit_once(':')?;
    port.parse().ok()
}

/// Host and port of a ws://, wss://, http:// or https:// URL (the scheme's port when none is
/// given).
fn url_host_port(url: &str) -> Option<(String, u32)> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "ws" | "http" => 80,
        "wss" | "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']')?;
        let port = after.strip_prefix(':').map_or(Some(default), |p| p.parse().ok())?;
        return Some((h.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((authority.to_string(), default)),
    }
}

/// Whether the C library reads `h` as an IPv4 address in one of inet_aton's old forms
/// (`127.1`, `0x7f000001`, `2130706433`): the resolver then never asks /etc/hosts, and the
/// name would bypass the cell's mapping, so such a host is not a DNS name (unit test:
/// config::tests::ipv4_shorthands_are_not_dns_names).
fn inet_aton_accepts(h: &str) -> bool {
    extern "C" {
        // POSIX-less but in every libc sealnode links against (glibc, musl); the libc crate
        // does not declare it.
        fn inet_aton(cp: *const libc::c_char, inp: *mut libc::in_addr) -> libc::c_int;
    }
    let Ok(c) = std::ffi::CString::new(h) else { return false };
    let mut addr = libc::in_addr { s_addr: 0 };
    // SAFETY: a NUL-terminated string and a valid in_addr to write to; inet_aton reads only
    // the string and writes only the address.
    unsafe { inet_aton(c.as_ptr(), &mut addr) != 0 }
}

/// Problems reported at once, at most.
const MAX_REPORTED: usize = 20;

/// Every problem `attempt` finds in `text`, not only the first: after a problem, the field it
/// names is taken out of the document (the whole list, for a list's element) and the rest is
/// checked again, until it passes or a problem repeats or follows from what was taken out (a
/// required field now missing). Each problem gets the line of its field in `text` (the
/// re-checked documents are rewritten, their lines are not the file's). A syntax error or a
/// wrong schema is reported alone: nothing else can be read.
fn every_problem(text: &str, file: &Path, attempt: &dyn Fn(&str) -> Result<Config>) -> Result<Config> {
    let first = match attempt(text) {
        Ok(cfg) => return Ok(cfg),
        Err(e) => e,
    };
    let Error::Config { field, .. } = &first else { return Err(first) };
    let base = base_field(field).to_string();
    if base.starts_with('(') || base == "schema" {
        return Err(first);
    }
    let Ok(mut doc) = text.parse::<toml::Table>() else { return Err(first) };
    let mut errors = vec![with_line(first, text)];
    let mut removed: Vec<Vec<String>> = Vec::new();
    let mut next = base;
    while errors.len() < MAX_REPORTED {
        let key = removable_key(&next);
        if key.is_empty() || removed.contains(&key) || !remove_key(&mut doc, &key) {
            break;
        }
        removed.push(key);
        let Ok(rewritten) = toml::to_string(&doc) else { break };
        let e = match attempt(&rewritten) {
            Ok(_) => break,
            Err(e) => e,
        };
        let Error::Config { field, .. } = &e else { break };
        next = base_field(field).to_string();
        // A consequence of what was taken out, not a problem of the file.
        let follows = removed.iter().any(|k| {
            let k = k.join(".");
            next == k || next.starts_with(&format!("{k}.")) || next.starts_with(&format!("{k}["))
        });
        if follows || errors.iter().any(|x| matches!(x, Error::Config { field, .. } if base_field(field) == next)) {
            break;
        }
        errors.push(with_line(e, text));
    }
    if errors.len() == 1 {
        return Err(errors.remove(0));
    }
    let _ = file;
    Err(Error::Problems(errors))
}

/// A field without its " (line N)" note.
fn base_field(field: &str) -> &str {
    field.split(" (").next().unwrap_or(field)
}

/// `e` with the line of its field in `text` (replacing a line the deserializer gave for a
/// rewritten document).
fn with_line(e: Error, text: &str) -> Error {
    let Error::Config { file, field, reason } = e else { return e };
    let base = base_field(&field).to_string();
    match line_of(text, &base) {
        Some(l) if field.contains("(in the table at line") => {
            Error::Config { file, field: format!("{base} (in the table at line {l})"), reason }
        }
        Some(l) => Error::Config { file, field: format!("{base} (line {l})"), reason },
        None => Error::Config { file, field: base, reason },
    }
}

/// The dotted path of a field (`node.ro_binds[0].src` -> ["node", "ro_binds", "0", "src"]).
fn field_path(field: &str) -> Vec<String> {
    let mut v = Vec::new();
    for part in field.split('.') {
        let mut rest = part;
        if let Some(i) = rest.find('[') {
            v.push(rest[..i].to_string());
            rest = &rest[i..];
            // `[N]` after `[N]`; anything else (a quoted key may hold brackets) ends the part.
            while let (Some(inner), Some(end)) = (rest.strip_prefix('['), rest.find(']')) {
                v.push(inner[..end - 1].to_string());
                rest = &rest[end + 1..];
            }
        } else {
            v.push(rest.to_string());
        }
    }
    v.retain(|s| !s.is_empty());
    v
}

/// What to take out of the document for a problem at `field`: the field, or the whole list
/// one of whose elements it names (taking an element out would renumber the rest).
fn removable_key(field: &str) -> Vec<String> {
    let mut key = Vec::new();
    for p in field_path(field) {
        if p.parse::<usize>().is_ok() {
            break;
        }
        key.push(p);
    }
    key
}

fn remove_key(doc: &mut toml::Table, key: &[String]) -> bool {
    let Some((last, parents)) = key.split_last() else { return false };
    let mut t = doc;
    for p in parents {
        match t.get_mut(p) {
            Some(toml::Value::Table(x)) => t = x,
            _ => return false,
        }
    }
    t.remove(last).is_some()
}

/// The line (1-based) where `field` is written in `text`: its key, or a list's element; the
/// deepest part of the path found.
pub fn line_of(text: &str, field: &str) -> Option<usize> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let path = field_path(field);
    let line = |at: usize| text[..at.min(text.len())].matches('\n').count() + 1;
    let mut found = None;
    let mut table = Some(doc.get_ref());
    let mut value: Option<&toml::Spanned<toml::de::DeValue>> = None;
    for p in &path {
        if let Some(t) = table.take() {
            let Some((k, v)) = t.iter().find(|(k, _)| k.get_ref().as_ref() == p.as_str()) else { break };
            found = Some(line(k.span().start));
            value = Some(v);
        } else if let (Some(v), Ok(i)) = (value, p.parse::<usize>()) {
            let toml::de::DeValue::Array(a) = v.get_ref() else { break };
            let Some(el) = a.get(i) else { break };
            found = Some(line(el.span().start));
            value = Some(el);
        } else {
            break;
        }
        table = match value.map(|v| v.get_ref()) {
            Some(toml::de::DeValue::Table(t)) => Some(t),
            _ => None,
        };
    }
    found
}

/// Rootless (the launcher is not root) with a `cell.rootful` in the file: say so next to a
/// host check's problem, which would otherwise read as advice for the rootful users.
fn rootless_hint(e: Error, cfg: &Config, inv: &Invoker) -> Error {
    match e {
        Error::Config { file, field, reason } if !inv.rootful() && cfg.cell.rootful.is_some() => Error::Config {
            file,
            field,
            reason: format!(
                "{reason} (note: you are uid {}, not root, so this is rootless mode: cell.rootful is ignored and \
                 both roles run as uid {}; run as root for the rootful users)",
                inv.uid, inv.uid
            ),
        },
        e => e,
    }
}

/// Why a config file could not be read, with where else sealnode looks when it is missing.
pub fn cannot_read(e: std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::NotFound {
        format!("cannot read: {e} (give the config with --config FILE, or set SEALNODE_CONFIG)")
    } else {
        format!("cannot read: {e}")
    }
}

#[cfg(test)]
mod tests;
