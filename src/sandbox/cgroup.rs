//! Each role its own cgroup v2 leaf: the cell's subtree (`supervisor`, `engine`, `node`), the
//! limits written into a leaf before its role exists (roles are cloned straight into their
//! leaf, CLONE_INTO_CGROUP, so no instruction of theirs runs outside it), a reload's limits
//! written live into the running leaves (a lower memory limit's reclaim in a child:
//! [`super::limit_write`]), and what each leaf reports (usage, events).
//!
//! Where the subtree lives: under the unit (`Delegate=yes`, found by systemd's `user.delegate`
//! mark), the unit's cgroup; by hand, `cell.cgroup`. Either way sealnode moves itself into the
//! subtree's `supervisor` leaf first (unless systemd started it there, `DelegateSubgroup=`) and
//! makes the role leaves next to it. sealnode never writes the resource files of the cgroup it was
//! given (the unit's MemoryMax= and the like stay systemd's), only the delegated
//! `cgroup.subtree_control` (to enable controllers for its leaves) and its leaves' files.
//! Without either, nothing changes unless a limit is configured: then the start is refused,
//! naming the limit, why it cannot be enforced here and what to do (fail closed).

use std::collections::BTreeMap;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use super::limit_write::{self, Writer};
use crate::config::{Config, Limits, Role};
use crate::error::{Error, Result};

/// Where the unified hierarchy is mounted.
pub const MOUNT: &str = "/sys/fs/cgroup";
/// The supervisor's own leaf (a unit's `DelegateSubgroup=` may start sealnode there).
pub const SUPERVISOR_LEAF: &str = "supervisor";
/// Controllers sealnode enables for its leaves when the host offers them (usage is visible
/// in `ctl status` even without a limit).
const CONTROLLERS: [&str; 4] = ["memory", "pids", "cpu", "io"];

/// The cell's cgroups: one leaf per role, limits written.
#[derive(Debug)]
pub struct Tree {
    /// The cell's own cgroup, a path under [`MOUNT`].
    pub root: PathBuf,
    /// Controllers enabled for the leaves.
    pub controllers: Vec<String>,
    leaves: Vec<Leaf>,
}

#[derive(Debug)]
struct Leaf {
    role: Role,
    path: PathBuf,
    /// The leaf's directory: what CLONE_INTO_CGROUP takes.
    dir: OwnedFd,
    /// The files written and their values, in order (what the receipt records).
    written: BTreeMap<String, String>,
    limits: Limits,
    /// Children still in a live write of a lower memory limit, the kernel reclaiming
    /// (limit_write): reaped by the loop ([`Tree::writer_exited`]), stopped (SIGKILL) when their
    /// file is written again or the leaf goes.
    writers: Vec<Writer>,
}

/// Where the cell's cgroup is, or why there is none.
enum Place {
    /// The unit's delegated cgroup: sealnode already runs in its `supervisor` leaf.
    Delegated(PathBuf),
    /// `cell.cgroup`, by hand: sealnode makes it and moves itself into its `supervisor` leaf.
    Configured(PathBuf),
    /// No usable cgroup v2 subtree here: why, and what to do.
    None { why: String, fix: String },
}

/// Why a limit cannot be enforced: names the config field, the reason and the fix.
fn refuse(cfg: &Config, field: &str, why: &str, fix: &str) -> Error {
    Error::config(&cfg.file, field, format!("cannot be enforced here: {why}; {fix}"))
}

/// The first configured limit that needs `controller` (or any controller, for None), with its
/// config field as the operator wrote it (the role's own or `cell.limits`).
fn first_limit(cfg: &Config, controller: Option<&str>) -> Option<String> {
    Role::ALL.iter().find_map(|role| {
        let (field, _) =
            cfg.limits(*role).set_fields().into_iter().find(|(_, c)| controller.is_none_or(|w| w == *c))?;
        Some(cfg.limit_field(*role, field))
    })
}

/// sealnode's own cgroup v2 path ("/system.slice/sealnode.service/supervisor").
pub fn own_cgroup() -> Option<String> {
    std::fs::read_to_string("/proc/self/cgroup").ok()?.lines().find_map(|l| l.strip_prefix("0::").map(str::to_string))
}

/// Controllers bound to a cgroup v1 hierarchy on this host (a v1/v2 hybrid).
pub fn v1_controllers() -> Vec<String> {
    let Ok(s) = std::fs::read_to_string("/proc/self/cgroup") else { return Vec::new() };
    s.lines()
        .filter_map(|l| l.split(':').nth(1))
        .flat_map(|c| c.split(','))
        .filter(|c| CONTROLLERS.contains(c))
        .map(str::to_string)
        .collect()
}

fn unified() -> bool {
    nix::sys::statfs::statfs(MOUNT).is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

fn writable(p: &Path) -> bool {
    nix::unistd::access(p, nix::unistd::AccessFlags::W_OK).is_ok()
}

fn place(cfg: &Config) -> Place {
    if !unified() {
        let v1 = v1_controllers();
        let why = if v1.is_empty() {
            format!("{MOUNT} is not a unified cgroup v2 hierarchy")
        } else {
            format!("{MOUNT} is a v1/v2 hybrid: {} on cgroup v1, where sealnode cannot delegate them", v1.join(", "))
        };
        return Place::None {
            why,
            fix: "boot the host with cgroup v2 only (systemd.unified_cgroup_hierarchy=1; the default of Debian 11+, \
                  Ubuntu 21.10+, RHEL 9), or remove the limit"
                .into(),
        };
    }
    if let Some(rel) = &cfg.cell.cgroup {
        return Place::Configured(Path::new(MOUNT).join(rel));
    }
    let own = own_cgroup().unwrap_or_default();
    match delegated() {
        Some(root) => Place::Delegated(root),
        None => Place::None {
            why: format!("sealnode's cgroup {own} is not delegated to it"),
            fix: "run it from sealnode.service (Delegate=yes), or, by hand as root, set cell.cgroup".into(),
        },
    }
}

/// The cgroup systemd delegated to sealnode's unit (`Delegate=yes` marks it with the
/// `user.delegate` xattr): the one sealnode runs in, or its parent when sealnode already runs
/// in a `supervisor` leaf of it (`DelegateSubgroup=supervisor`).
pub fn delegated() -> Option<PathBuf> {
    let own = own_cgroup()?;
    let here = Path::new(MOUNT).join(own.trim_start_matches('/'));
    let euid = nix::unistd::geteuid().as_raw();
    let marked = |p: &Path| delegated_to(p, euid);
    if marked(&here) {
        return Some(here);
    }
    let parent = here.parent()?;
    (here.file_name().is_some_and(|n| n == SUPERVISOR_LEAF) && marked(parent)).then(|| parent.to_path_buf())
}

/// Whether the cgroup dir `p` is delegated to user `euid`: marked (`user.delegate` or
/// `trusted.delegate` is 1), its cgroup.subtree_control and cgroup.procs writable, and owned
/// by `euid`. systemd chowns a unit's delegated cgroup to its User= (root's stays root's), so a
/// mark another user set on a cgroup of their own is not a delegation to us (unit test:
/// cgroup::tests::a_delegation_mark_counts_only_on_a_cgroup_of_ours).
fn delegated_to(p: &Path, euid: u32) -> bool {
    nix::sys::stat::stat(p).is_ok_and(|st| st.st_uid == euid)
        && ["user.delegate", "trusted.delegate"]
            .iter()
            .any(|x| crate::os::sys::getxattr(p, x).is_some_and(|v| v == b"1"))
        && writable(&p.join("cgroup.subtree_control"))
        && writable(&p.join("cgroup.procs"))
}

fn read(p: &Path) -> std::io::Result<String> {
    std::fs::read_to_string(p).map(|s| s.trim().to_string())
}

fn write(p: &Path, v: &str) -> Result<()> {
    std::fs::write(p, v).map_err(|e| Error::io(format!("write {} ({v})", p.display()), e))
}

/// Without side effects: whether the configured limits can be enforced here, and where.
/// `Ok(None)`: no cgroup subtree and no limit configured (the cell runs as without cgroups).
pub fn check(cfg: &Config) -> Result<Option<PathBuf>> {
    match place(cfg) {
        Place::None { why, fix } => match first_limit(cfg, None) {
            Some(field) => Err(refuse(cfg, &field, &why, &fix)),
            None if cfg.cell.cgroup.is_some() => Err(refuse(cfg, "cell.cgroup", &why, &fix)),
            None => Ok(None),
        },
        Place::Configured(root) => {
            configured_ok(cfg, &root)?;
            controllers_ok(cfg, root)
        }
        Place::Delegated(root) => controllers_ok(cfg, root),
    }
}

/// `cell.cgroup` must be the cell's own: not while the unit delegates one, not a systemd
/// unit's or slice's cgroup, not in use, and every existing dir on the way sealnode's own (or
/// root's) and writable by no one else: cgroup v2 lets whoever may write a common ancestor's
/// cgroup.procs move the roles out of their leaves (tests/vm/limits.sh, run by tests/vm.rs:
/// "by hand: cell.cgroup under another user's cgroup is refused").
fn configured_ok(cfg: &Config, root: &Path) -> Result<()> {
    let bad = |why: String, fix: &str| Err(Error::config(&cfg.file, "cell.cgroup", format!("{why}; {fix}")));
    if delegated().is_some() {
        return bad(
            "sealnode runs in a cgroup its unit delegated to it".into(),
            "remove cell.cgroup (it is for runs by hand; under the unit the unit's cgroup is used)",
        );
    }
    if root.extension().is_some_and(|e| e == "slice" || e == "service" || e == "scope") {
        return bad(
            format!("{} is a systemd unit's cgroup", root.display()),
            "name a cgroup of sealnode's own, e.g. \"sealnode/node1\"",
        );
    }
    let euid = nix::unistd::geteuid().as_raw();
    let mut at = PathBuf::from(MOUNT);
    let rel = root.strip_prefix(MOUNT).unwrap_or(root).to_path_buf();
    for c in rel.components() {
        at.push(c);
        match nix::sys::stat::stat(&at) {
            Ok(st) if (st.st_uid != euid && st.st_uid != 0) || st.st_mode & 0o022 != 0 => {
                return bad(
                    format!(
                        "{} belongs to uid {} (mode {:o}): another user could move the roles out of their limits",
                        at.display(),
                        st.st_uid,
                        st.st_mode & 0o7777
                    ),
                    "use a cgroup path that only root or sealnode's user owns",
                );
            }
            Ok(_) => {}
            Err(_) => break,
        }
    }
    let procs = read(&root.join("cgroup.procs")).unwrap_or_default();
    let me = std::process::id().to_string();
    if procs.lines().any(|p| p != me) {
        return bad(
            format!("{} already holds processes", root.display()),
            "name a cgroup of sealnode's own, e.g. \"sealnode/node1\"",
        );
    }
    Ok(())
}

/// The controllers the configured limits need are offered where the cell's cgroup is.
fn controllers_ok(cfg: &Config, root: PathBuf) -> Result<Option<PathBuf>> {
    // By hand the cell's cgroup may not exist yet: its nearest existing ancestor says
    // what the host offers.
    let mut at = root.as_path();
    while !at.join("cgroup.controllers").exists() {
        at = at.parent().unwrap_or(Path::new(MOUNT));
        if at == Path::new(MOUNT) {
            break;
        }
    }
    let have = read(&at.join("cgroup.controllers")).unwrap_or_default();
    for ctl in CONTROLLERS {
        if !have.split_whitespace().any(|c| c == ctl) {
            if let Some(field) = first_limit(cfg, Some(ctl)) {
                return Err(refuse(
                    cfg,
                    &field,
                    &format!("the {ctl} controller is not available in {} (cgroup.controllers: {have})", at.display()),
                    "enable it in the parent's cgroup.subtree_control (systemd delegates memory, pids, cpu \
                             and io to a unit with Delegate=yes)",
                ));
            }
        }
    }
    Ok(Some(root))
}

impl Tree {
    /// Make the cell's subtree and write every role's limits, or refuse (see the module doc).
    /// Runs before the cell exists: nothing has started when it fails.
    pub fn setup(cfg: &Config) -> Result<Option<Tree>> {
        let Some(root) = check(cfg)? else { return Ok(None) };
        if let Place::Configured(_) = place(cfg) {
            make_path(&root).map_err(|e| {
                Error::config(
                    &cfg.file,
                    "cell.cgroup",
                    format!(
                        "cannot make {}: {e}; name a cgroup sealnode's user may manage (as root e.g. \"sealnode/node1\"; \
                         rootless, one under your own delegated user@UID.service)",
                        root.display()
                    ),
                )
            })?;
        }
        let sup = root.join(SUPERVISOR_LEAF);
        let own = Path::new(MOUNT).join(own_cgroup().unwrap_or_default().trim_start_matches('/'));
        if own != sup {
            mkdir(&sup)?;
            // Into our own leaf first: a cgroup with controllers for its children holds no
            // process itself, and the cell init and roles fork from here.
            write(&sup.join("cgroup.procs"), &std::process::id().to_string())?;
        }
        let controllers = enable(&root)?;
        let mut leaves = Vec::new();
        for role in Role::ALL {
            let path = root.join(role.name());
            fresh_leaf(&path)?;
            let limits = cfg.limits(role);
            let written = write_limits(cfg, role, &path, &limits, &controllers)?;
            let dir = nix::fcntl::open(&path, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty())
                .map_err(|e| Error::errno(format!("open {}", path.display()), e))?;
            leaves.push(Leaf { role, path, dir, written, limits, writers: Vec::new() });
        }
        Ok(Some(Tree { root, controllers, leaves }))
    }

    fn leaf(&self, role: Role) -> Option<&Leaf> {
        self.leaves.iter().find(|l| l.role == role)
    }

    /// The role's leaf, for CLONE_INTO_CGROUP.
    pub fn dir(&self, role: Role) -> Option<BorrowedFd<'_>> {
        self.leaf(role).map(|l| l.dir.as_fd())
    }

    /// The role's cgroup path and the limit files written there (the receipt's record).
    pub fn record(&self, role: Role) -> Option<(String, BTreeMap<String, String>)> {
        self.leaf(role).map(|l| (l.path.display().to_string(), l.written.clone()))
    }

    /// The role's configured limits in force.
    pub fn limits(&self, role: Role) -> Option<&Limits> {
        self.leaf(role).map(|l| &l.limits)
    }

    /// How often the kernel's OOM killer has killed in the role's leaf (memory.events).
    pub fn oom_kills(&self, role: Role) -> u64 {
        let Some(l) = self.leaf(role) else { return 0 };
        keyed(&l.path.join("memory.events")).get("oom_kill").copied().unwrap_or(0)
    }

    /// Usage and events of the role's leaf, for `ctl status` (none without a leaf).
    pub fn usage(&self, role: Role) -> Option<Usage> {
        let l = self.leaf(role)?;
        let num = |f: &str| read(&l.path.join(f)).ok().and_then(|s| s.parse::<u64>().ok());
        let cpu = keyed(&l.path.join("cpu.stat"));
        Some(Usage {
            cgroup: l.path.display().to_string(),
            limits: l.written.clone(),
            memory_current: num("memory.current"),
            memory_peak: num("memory.peak"),
            memory_events: keyed(&l.path.join("memory.events")),
            pids_current: num("pids.current"),
            pids_events: keyed(&l.path.join("pids.events")),
            cpu_usage_usec: cpu.get("usage_usec").copied(),
            cpu_nr_throttled: cpu.get("nr_throttled").copied(),
            cpu_throttled_usec: cpu.get("throttled_usec").copied(),
        })
    }
}

/// A role leaf's usage and events as `ctl status` shows them (its `resources`); a counter the
/// kernel does not offer (its controller off) is none.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    /// The leaf's path.
    pub cgroup: String,
    /// The limit files written in the leaf and their values.
    pub limits: BTreeMap<String, String>,
    pub memory_current: Option<u64>,
    pub memory_peak: Option<u64>,
    /// memory.events: `low`, `high`, `max`, `oom`, `oom_kill`, ... as the kernel lists them.
    pub memory_events: BTreeMap<String, u64>,
    pub pids_current: Option<u64>,
    /// pids.events: `max` (forks refused at pids.max).
    pub pids_events: BTreeMap<String, u64>,
    /// cpu.stat's `usage_usec`, `nr_throttled` and `throttled_usec`.
    pub cpu_usage_usec: Option<u64>,
    pub cpu_nr_throttled: Option<u64>,
    pub cpu_throttled_usec: Option<u64>,
}

impl Drop for Tree {
    /// The role leaves go with the cell (empty by then: each role's pid namespace died with
    /// its init). The supervisor's own leaf stays until sealnode exits (systemd removes the
    /// unit's cgroup; by hand it is reused by the next run).
    fn drop(&mut self) {
        for l in &mut self.leaves {
            l.writers.iter_mut().for_each(Writer::stop);
            let _ = std::fs::remove_dir(&l.path);
        }
    }
}

/// "key value" lines (memory.events, cpu.stat, pids.events).
fn keyed(p: &Path) -> BTreeMap<String, u64> {
    read(p)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| {
            let mut w = l.split_whitespace();
            Some((w.next()?.to_string(), w.next()?.parse().ok()?))
        })
        .collect()
}

/// A new, empty leaf: one left by an earlier run (a kill -9) is removed first, so no limit or
/// counter of it survives: not its memory.max, not its OOM kills (tests/vm/limits.sh, run by
/// tests/vm.rs: "by hand after a kill -9: the old leaf's memory.max is gone, no false OOM
/// report"). A leaf still in use (a process in it or below it, a child cgroup: another run,
/// or someone's) refuses the start ("by hand: a leaf still in use refuses the next run").
fn fresh_leaf(p: &Path) -> Result<()> {
    match std::fs::remove_dir(p) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => {
            return Err(Error::io(
                format!(
                    "{} is in use (processes or child cgroups in it: another sealnode run, or not sealnode's); \
                     stop that or remove it",
                    p.display()
                ),
                e,
            ))
        }
    }
    std::fs::create_dir(p).map_err(|e| Error::io(format!("mkdir {}", p.display()), e))
}

fn mkdir(p: &Path) -> Result<()> {
    match std::fs::create_dir(p) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(Error::io(format!("mkdir {}", p.display()), e)),
    }
}

/// Enable, for `at`'s children, each of sealnode's controllers `at` offers (writing only the
/// missing ones); returns the controllers the children get.
fn enable(at: &Path) -> Result<Vec<String>> {
    let have = read(&at.join("cgroup.controllers")).map_err(|e| Error::io(format!("read {}", at.display()), e))?;
    let enabled = read(&at.join("cgroup.subtree_control")).unwrap_or_default();
    let offered: Vec<String> =
        CONTROLLERS.iter().filter(|c| have.split_whitespace().any(|h| h == **c)).map(|c| c.to_string()).collect();
    let missing: Vec<String> = offered
        .iter()
        .filter(|c| !enabled.split_whitespace().any(|e| e == c.as_str()))
        .map(|c| format!("+{c}"))
        .collect();
    if !missing.is_empty() {
        write(&at.join("cgroup.subtree_control"), &missing.join(" "))?;
    }
    Ok(offered)
}

/// `cell.cgroup` and the dirs above it, each with the controllers enabled for the next.
fn make_path(root: &Path) -> Result<()> {
    let rel = root.strip_prefix(MOUNT).unwrap_or(root);
    let mut at = PathBuf::from(MOUNT);
    for c in rel.components() {
        enable(&at)?;
        at.push(c);
        mkdir(&at)?;
    }
    Ok(())
}

/// A role's limits as the files of its leaf and their values, in order, each with the limit's
/// field (for the error that names it); a device io.max names that is not a block device is
/// refused here, before anything is written.
fn limit_files(
    cfg: &Config,
    role: Role,
    leaf: &Path,
    l: &Limits,
    controllers: &[String],
) -> Result<Vec<(&'static str, String, &'static str)>> {
    let mut files: Vec<(&str, String, &str)> = Vec::new();
    // The config holds every MiB value to 16777216 (16 TiB): no product overflows.
    let mb = |m: u64| m.saturating_mul(1024 * 1024).to_string();
    let memory = controllers.iter().any(|c| c == "memory");
    if memory {
        // A blow-up in the role kills the whole role, never only some of its processes.
        files.push(("memory.oom.group", "1".into(), "memory_max_mb"));
        if let Some(m) = l.memory_high_mb {
            files.push(("memory.high", mb(m), "memory_high_mb"));
        }
        if let Some(m) = l.memory_max_mb {
            files.push(("memory.max", mb(m), "memory_max_mb"));
        }
        // No swap unless configured: a role at its limit is killed, not swapped to death.
        if leaf.join("memory.swap.max").exists() || l.memory_swap_max_mb.is_some() {
            files.push(("memory.swap.max", mb(l.memory_swap_max_mb.unwrap_or(0)), "memory_swap_max_mb"));
        }
    }
    if let Some(p) = l.pids_max {
        files.push(("pids.max", p.to_string(), "pids_max"));
    }
    if let Some(c) = l.cpu_max {
        files.push((
            "cpu.max",
            format!("{} {CPU_PERIOD}", ((c * CPU_PERIOD as f64).round() as u64).max(1000)),
            "cpu_max",
        ));
    }
    if let Some(w) = l.cpu_weight {
        files.push(("cpu.weight", w.to_string(), "cpu_weight"));
    }
    if let Some(w) = l.io_weight {
        files.push(("io.weight", format!("default {w}"), "io_weight"));
    }
    for io in &l.io_max {
        let (maj, min) = block_device_numbers(&io.device)
            .map_err(|why| Error::config(&cfg.file, format!("{}.device", cfg.limit_field(role, "io_max")), why))?;
        let mut v = format!("{maj}:{min}");
        for (k, x) in [("rbps", io.rbps), ("wbps", io.wbps), ("riops", io.riops), ("wiops", io.wiops)] {
            if let Some(x) = x {
                v.push_str(&format!(" {k}={x}"));
            }
        }
        files.push(("io.max", v, "io_max"));
    }
    Ok(files)
}

/// cpu.max's period, µs.
const CPU_PERIOD: u64 = 100_000;

/// Write a role's limits into its leaf; returns the files and values written. A file that
/// cannot be written fails the start, naming the limit.
fn write_limits(
    cfg: &Config,
    role: Role,
    leaf: &Path,
    l: &Limits,
    controllers: &[String],
) -> Result<BTreeMap<String, String>> {
    write_files(cfg, role, leaf, limit_files(cfg, role, leaf, l, controllers)?)
}

fn write_files(
    cfg: &Config,
    role: Role,
    leaf: &Path,
    files: Vec<(&str, String, &str)>,
) -> Result<BTreeMap<String, String>> {
    for (file, value, field) in &files {
        let p = leaf.join(file);
        if let Err(e) = std::fs::write(&p, value) {
            return Err(Error::config(
                &cfg.file,
                cfg.limit_field(role, field),
                format!("cannot be enforced here: writing {value:?} to {} failed: {e}", p.display()),
            ));
        }
    }
    // io.max takes one line per device: the record keeps them all.
    Ok(record(&files))
}

/// What undoes a limit file written before and not written now (a limit taken out of the
/// config on reload): the kernel's own default for it. io.max: each device line written
/// before and not now, back to no cap.
fn resets(
    before: &BTreeMap<String, String>,
    now: &[(&str, String, &str)],
) -> Vec<(&'static str, String, &'static str)> {
    let mut out = Vec::new();
    for (file, default, field) in [
        ("memory.high", "max".to_string(), "memory_high_mb"),
        ("memory.max", "max".to_string(), "memory_max_mb"),
        ("memory.swap.max", "max".to_string(), "memory_swap_max_mb"),
        ("pids.max", "max".to_string(), "pids_max"),
        ("cpu.max", format!("max {CPU_PERIOD}"), "cpu_max"),
        ("cpu.weight", "100".to_string(), "cpu_weight"),
        ("io.weight", "default 100".to_string(), "io_weight"),
    ] {
        if before.contains_key(file) && !now.iter().any(|(f, _, _)| *f == file) {
            out.push((file, default, field));
        }
    }
    let device = |line: &str| line.split_whitespace().next().map(str::to_string);
    let kept: Vec<String> = now.iter().filter(|(f, _, _)| *f == "io.max").filter_map(|(_, v, _)| device(v)).collect();
    for line in before.get("io.max").map(|v| v.split("; ").collect::<Vec<_>>()).unwrap_or_default() {
        if let Some(d) = device(line).filter(|d| !kept.contains(d)) {
            out.push(("io.max", format!("{d} rbps=max wbps=max riops=max wiops=max"), "io_max"));
        }
    }
    out
}

/// For a reload, without side effects: whether `cfg`'s limits can be written into the running
/// cell's leaves (`tree`), each controller they need enabled there, each io.max device a block
/// device. A cell made without cgroups (no limits then, or none the host could enforce) has
/// no leaves to write into: any limit is refused, even where the host could enforce it now
/// (found by review: the config in force and its receipt would have claimed limits nothing
/// enforced).
pub fn check_update(tree: Option<&Tree>, cfg: &Config) -> Result<()> {
    let Some(tree) = tree else {
        return match first_limit(cfg, None) {
            Some(field) => Err(refuse(
                cfg,
                &field,
                "the running cell was made without cgroup leaves (it had no limits when it started)",
                "restart sealnode to apply limits",
            )),
            None => Ok(()),
        };
    };
    for ctl in CONTROLLERS {
        if !tree.controllers.iter().any(|c| c == ctl) {
            if let Some(field) = first_limit(cfg, Some(ctl)) {
                return Err(refuse(
                    cfg,
                    &field,
                    &format!(
                        "the running cell's cgroup {} has no {ctl} controller for its leaves",
                        tree.root.display()
                    ),
                    "restart sealnode where the controller is delegated",
                ));
            }
        }
    }
    for l in &tree.leaves {
        limit_files(cfg, l.role, &l.path, &cfg.limits(l.role), &tree.controllers)?;
    }
    Ok(())
}

impl Tree {
    /// A reload's limits, written live into the leaves of the roles whose limits changed
    /// (the kernel applies a cgroup file the moment it is written: a lower memory.max reclaims,
    /// and OOM-kills the role if it cannot); a limit taken out goes back to the kernel's
    /// default. Returns the roles whose limits changed. A write that fails puts every leaf's
    /// earlier values back and names the limit: the cell goes on with the limits it had.
    pub fn update(&mut self, cfg: &Config) -> Result<Vec<Role>> {
        let mut done: Vec<(usize, BTreeMap<String, String>, Limits)> = Vec::new();
        for i in 0..self.leaves.len() {
            let leaf = &self.leaves[i];
            let limits = cfg.limits(leaf.role);
            if limits == leaf.limits {
                continue;
            }
            let applied = limit_files(cfg, leaf.role, &leaf.path, &limits, &self.controllers)
                .map(|now| (resets(&leaf.written, &now), now))
                .and_then(|(resets, now)| {
                    let leaf = &mut self.leaves[i];
                    leaf.write_live(cfg, resets)?;
                    leaf.write_live(cfg, now)
                });
            match applied {
                Ok(written) => {
                    let leaf = &mut self.leaves[i];
                    let before = std::mem::replace(&mut leaf.written, written);
                    done.push((i, before, std::mem::replace(&mut leaf.limits, limits)));
                }
                Err(e) => {
                    // Back to what the receipt says is in force, this leaf and those before it.
                    let (written, limits) = (self.leaves[i].written.clone(), self.leaves[i].limits.clone());
                    self.restore(i, &written, &cfg.limits(self.leaves[i].role), limits, cfg);
                    for (j, written, limits) in done.into_iter().rev() {
                        let tried = self.leaves[j].limits.clone();
                        self.restore(j, &written, &tried, limits, cfg);
                    }
                    return Err(e);
                }
            }
        }
        Ok(done.iter().map(|(i, _, _)| self.leaves[*i].role).collect())
    }

    /// `pid` was a live limit write's child (limit_write): the kernel is done reclaiming (or the
    /// write failed after the limit was in force: logged). False for any other child.
    pub fn writer_exited(&mut self, pid: nix::unistd::Pid, ws: nix::sys::wait::WaitStatus) -> bool {
        use nix::sys::wait::WaitStatus;
        for l in &mut self.leaves {
            let Some(at) = l.writers.iter().position(|w| w.pid == pid) else { continue };
            let w = l.writers.remove(at);
            let secs = format!("{:.1}", w.since.elapsed().as_secs_f64());
            if w.stopped {
                tracing::info!(role = %l.role, file = %w.file, value = %w.value, secs, "a lower memory limit's reclaim was stopped: its file was written again");
            } else {
                match ws {
                    WaitStatus::Exited(_, 0) => {
                        tracing::info!(role = %l.role, file = %w.file, value = %w.value, secs, "a lower memory limit's reclaim is done")
                    }
                    // Its exit status is the write's errno (limit_write's child).
                    WaitStatus::Exited(_, errno) => {
                        let error = std::io::Error::from_raw_os_error(errno);
                        tracing::warn!(role = %l.role, file = %w.file, value = %w.value, secs, %error, "a lower memory limit's write ended in an error after the limit was in force");
                    }
                    _ => {
                        tracing::warn!(role = %l.role, file = %w.file, value = %w.value, secs, status = ?ws, "a lower memory limit's writer was killed from outside sealnode after the limit was in force")
                    }
                }
            }
            // A stopped writer may have set its value after a later one was proven (its write
            // had not reached the kernel's store yet): the value in force is the record's, read
            // back once no live writer of the file is left (found by review).
            let want = l.written.get(&w.file).map_or("max", String::as_str).to_string();
            let path = l.path.join(&w.file);
            // Once only: a writer that was itself such a rewrite is not retried (found by review:
            // one the kernel never took was given up and retried without end, 2 s a time).
            if !l.writers.iter().any(|o| o.file == w.file && !o.stopped)
                && path.exists()
                && !limit_write::in_force(&path, &want)
            {
                if w.again {
                    tracing::error!(role = %l.role, file = %w.file, value = %want, "the limit in force could not be written again: the file and the record differ until the next reload");
                } else {
                    tracing::warn!(role = %l.role, file = %w.file, value = %want, "a stopped write left another value: written again");
                    let before = l.writers.len();
                    if let Err(error) = limit_write::write(&path, &want, &mut l.writers) {
                        tracing::error!(role = %l.role, file = %w.file, value = %want, %error, "could not write the limit in force again");
                    }
                    l.writers[before..].iter_mut().for_each(|n| n.again = true);
                }
            }
            return true;
        }
        false
    }

    /// Leaf `i` back to `limits` and the files `written` records (what the `tried` limits set
    /// and they do not, to the kernel's default), best effort: the update that needs it has
    /// failed already.
    fn restore(&mut self, i: usize, written: &BTreeMap<String, String>, tried: &Limits, limits: Limits, cfg: &Config) {
        let controllers = self.controllers.clone();
        let leaf = &mut self.leaves[i];
        let before: Vec<(&str, String, &str)> =
            written.iter().flat_map(|(f, v)| v.split("; ").map(move |v| (f.as_str(), v.to_string(), ""))).collect();
        let tried = limit_files(cfg, leaf.role, &leaf.path, tried, &controllers).unwrap_or_default();
        let tried = record(&tried);
        leaf.writers.iter_mut().for_each(Writer::stop);
        for (file, value, _) in resets(&tried, &before).into_iter().chain(before) {
            if let Err(e) = limit_write::write(&leaf.path.join(file), &value, &mut leaf.writers) {
                tracing::error!(cgroup = %leaf.path.display(), file, value, error = %e, "could not put a limit back");
            }
        }
        leaf.written = written.clone();
        leaf.limits = limits;
    }
}

impl Leaf {
    /// A reload's files written into this running leaf, in order (limit_write: a lower memory
    /// limit's reclaim goes on in a child once the limit is in force); returns the record as
    /// [`write_files`] does. A file that cannot be written names its limit.
    fn write_live(&mut self, cfg: &Config, files: Vec<(&str, String, &str)>) -> Result<BTreeMap<String, String>> {
        for (file, value, field) in &files {
            let p = self.path.join(file);
            // A memory limit the leaf has already (its file reads it): nothing to write, and a
            // writer still reclaiming towards it goes on.
            if limit_write::RECLAIMING.contains(file) && limit_write::in_force(&p, value) {
                continue;
            }
            // An earlier write of this file still reclaiming aims at a value no longer wanted.
            self.writers.iter_mut().filter(|w| w.file == *file).for_each(Writer::stop);
            match limit_write::write(&p, value, &mut self.writers) {
                Ok(false) => {}
                Ok(true) => {
                    tracing::info!(role = %self.role, file, value, "limit in force; the kernel reclaims the difference in a child (sealnode-limit) while sealnode goes on");
                }
                Err(e) => {
                    return Err(Error::config(
                        &cfg.file,
                        cfg.limit_field(self.role, field),
                        format!("cannot be enforced here: writing {value:?} to {} failed: {e}", p.display()),
                    ))
                }
            }
        }
        Ok(record(&files))
    }
}

/// The files and values of a write, as the receipt records them (io.max's lines joined).
fn record(files: &[(&str, String, &str)]) -> BTreeMap<String, String> {
    let mut written = BTreeMap::new();
    for (file, value, _) in files {
        written
            .entry(file.to_string())
            .and_modify(|v: &mut String| v.push_str(&format!("; {value}")))
            .or_insert_with(|| value.clone());
    }
    written
}

/// A block device's major:minor, for io.max. `/dev/NAME` missing from this mount namespace (the
/// unit's `PrivateDevices=` leaves only pseudo devices in /dev) is read from the kernel's own
/// list instead, /sys/class/block/NAME/dev.
fn block_device_numbers(device: &Path) -> std::result::Result<(u32, u32), String> {
    let shown = device.display();
    match nix::sys::stat::stat(device) {
        Ok(st) if st.st_mode & libc::S_IFMT == libc::S_IFBLK => Ok((libc::major(st.st_rdev), libc::minor(st.st_rdev))),
        Ok(_) => Err(format!("{shown} is not a block device")),
        Err(nix::errno::Errno::ENOENT) => {
            let name = device
                .strip_prefix("/dev")
                .ok()
                .and_then(|n| n.to_str())
                .filter(|n| !n.is_empty() && !n.contains('/') && !n.starts_with('.'))
                .ok_or_else(|| format!("{shown} does not exist"))?;
            let sys = Path::new("/sys/class/block").join(name).join("dev");
            let text = std::fs::read_to_string(&sys).map_err(|e| {
                format!("{shown} does not exist, and the kernel knows no block device {name} ({}: {e})", sys.display())
            })?;
            let (a, b) =
                text.trim().split_once(':').ok_or_else(|| format!("{}: unexpected {text:?}", sys.display()))?;
            match (a.parse(), b.parse()) {
                (Ok(a), Ok(b)) => Ok((a, b)),
                _ => Err(format!("{}: unexpected {text:?}", sys.display())),
            }
        }
        Err(e) => Err(format!("cannot stat {shown}: {}", e.desc())),
    }
}

#[cfg(test)]
mod tests {
    /// A dir laid out as a delegated cgroup (the mark, the two files writable) is ours only
    /// when it belongs to our uid: another user's mark on their own dir delegates nothing.
    #[test]
    fn a_delegation_mark_counts_only_on_a_cgroup_of_ours() {
        use std::os::unix::fs::MetadataExt;
        let d = tempfile::tempdir().expect("tmp");
        let p = d.path();
        for f in ["cgroup.subtree_control", "cgroup.procs"] {
            std::fs::write(p.join(f), "").expect("write");
        }
        let owner = std::fs::metadata(p).expect("stat").uid();
        assert!(!super::delegated_to(p, owner), "no mark yet");
        let path = std::ffi::CString::new(p.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: valid NUL-terminated strings and a buffer of the length given.
        let r = unsafe { libc::setxattr(path.as_ptr(), c"user.delegate".as_ptr(), b"1".as_ptr().cast(), 1, 0) };
        assert_eq!(r, 0, "setxattr user.delegate: {}", nix::errno::Errno::last());
        assert!(super::delegated_to(p, owner), "marked, and the owner's");
        assert!(!super::delegated_to(p, owner.wrapping_add(1)), "marked, but by another user on their own dir");
    }

    #[test]
    fn io_max_devices_are_block_devices_named_by_path_or_by_the_kernel() {
        use std::path::Path;
        assert_eq!(super::block_device_numbers(Path::new("/dev/null")), Err("/dev/null is not a block device".into()));
        let e = super::block_device_numbers(Path::new("/dev/sealnode-no-such-disk")).expect_err("missing");
        assert!(e.contains("the kernel knows no block device sealnode-no-such-disk"), "{e}");
        let e = super::block_device_numbers(Path::new("/var/no/such")).expect_err("missing");
        assert_eq!(e, "/var/no/such does not exist");
        // A real disk, by path, gives the numbers the kernel lists for it.
        if let Some(disk) = std::fs::read_dir("/sys/class/block").ok().and_then(|d| {
            d.filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .find(|n| Path::new("/dev").join(n).exists())
        }) {
            let listed = std::fs::read_to_string(format!("/sys/class/block/{disk}/dev")).expect("dev");
            let (a, b) = super::block_device_numbers(&Path::new("/dev").join(&disk)).expect("numbers");
            assert_eq!(format!("{a}:{b}"), listed.trim());
        }
    }

    use super::*;

    fn cfg(engine_limits: &str, cell_limits: &str) -> Config {
        let text = format!(
            "schema = 1\n[cell]\nstate_dir = \"/s\"\nruntime_dir = \"/r\"\n{cell_limits}\n\
             [engine]\ncommand = [\"/e\"]\nport = 1\nseccomp = \"/p\"\nlandlock = \"/l\"\nscratch = \"/x\"\n{engine_limits}\n\
             [node]\ncommand = [\"/n\"]\nseccomp = \"/p\"\nlandlock = \"/l\"\nscratch = \"/y\"\n"
        );
        Config::parse(&text, Path::new("/t.toml")).expect("config")
    }

    /// What each field becomes in the leaf: bytes for MiB, quota/period for CPUs, the whole
    /// leaf killed together, no swap unless asked; the cell's defaults fill what a role leaves out.
    #[test]
    fn limits_become_the_cgroup_files_in_force() {
        let c = cfg(
            "limits = { memory_max_mb = 512, cpu_max = 1.5, io_weight = 50 }",
            "limits = { memory_max_mb = 64, memory_high_mb = 48, pids_max = 100, cpu_weight = 200 }",
        );
        let leaf = tempfile::tempdir().expect("tmp");
        std::fs::write(leaf.path().join("memory.swap.max"), "max").expect("swap file");
        let all = ["memory", "pids", "cpu", "io"].map(String::from);
        let engine = write_limits(&c, Role::Engine, leaf.path(), &c.limits(Role::Engine), &all).expect("engine");
        let want = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
        };
        assert_eq!(
            engine,
            want(&[
                ("memory.oom.group", "1"),
                ("memory.high", "50331648"),
                ("memory.max", "536870912"),
                ("memory.swap.max", "0"),
                ("pids.max", "100"),
                ("cpu.max", "150000 100000"),
                ("cpu.weight", "200"),
                ("io.weight", "default 50"),
            ])
        );
        for (file, value) in &engine {
            assert_eq!(&std::fs::read_to_string(leaf.path().join(file)).expect("read"), value, "{file}");
        }
        // Without the memory controller nothing memory-related is written (and no limit asks).
        let node = tempfile::tempdir().expect("tmp");
        let c = cfg("", "limits = { pids_max = 10 }");
        let got = write_limits(&c, Role::Node, node.path(), &c.limits(Role::Node), &["pids".into()]).expect("node");
        assert_eq!(got, want(&[("pids.max", "10")]));
        assert_eq!(c.limits(Role::Node).set_fields(), [("pids_max", "pids")]);
    }

    /// A tree over two temp dirs laid out as the role leaves, with `c`'s limits written.
    fn tree_in(dir: &Path, c: &Config) -> Tree {
        let controllers: Vec<String> = ["memory", "pids", "cpu", "io"].map(String::from).to_vec();
        let leaves = Role::ALL
            .into_iter()
            .map(|role| {
                let path = dir.join(role.name());
                std::fs::create_dir(&path).expect("leaf");
                let limits = c.limits(role);
                let written = write_limits(c, role, &path, &limits, &controllers).expect("write");
                let fd = nix::fcntl::open(&path, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty()).expect("open");
                Leaf { role, path, dir: fd, written, limits, writers: Vec::new() }
            })
            .collect();
        Tree { root: dir.to_path_buf(), controllers, leaves }
    }

    /// A reload's limits go into the leaves of the roles whose limits changed, a limit taken
    /// out goes back to the kernel's default, and the record follows; a write that fails puts
    /// every leaf back as it was and names the limit.
    #[test]
    fn a_reload_writes_changed_limits_live_and_undoes_them_all_on_a_failure() {
        let d = tempfile::tempdir().expect("tmp");
        let read = |role: &str, f: &str| std::fs::read_to_string(d.path().join(role).join(f)).expect(f);
        let before = cfg("limits = { memory_max_mb = 512, cpu_max = 1.5 }", "limits = { pids_max = 100 }");
        let mut tree = tree_in(d.path(), &before);
        assert_eq!(read("engine", "cpu.max"), "150000 100000");

        // The engine's memory lowered, its CPU cap taken out; the node's limits as they were.
        let after = cfg("limits = { memory_max_mb = 256 }", "limits = { pids_max = 100 }");
        assert_eq!(tree.update(&after).expect("update"), vec![Role::Engine]);
        assert_eq!(read("engine", "memory.max"), "268435456");
        assert_eq!(read("engine", "cpu.max"), "max 100000", "a cap taken out is the kernel's default again");
        assert_eq!(read("engine", "pids.max"), "100");
        let engine = tree.leaf(Role::Engine).expect("leaf");
        assert_eq!(engine.written.get("memory.max").map(String::as_str), Some("268435456"));
        assert!(!engine.written.contains_key("cpu.max"), "the record holds what is in force");
        assert_eq!(tree.update(&after).expect("again"), Vec::<Role>::new(), "nothing changed, nothing written");

        // Both roles change and the node's pids.max cannot be written: the engine, written
        // first, is put back too, and the error names the node's field.
        std::fs::remove_file(d.path().join("node/pids.max")).expect("rm");
        std::fs::create_dir(d.path().join("node/pids.max")).expect("a dir where the file was");
        let worse = cfg("limits = { memory_max_mb = 128, cpu_max = 0.5 }", "limits = { pids_max = 50 }");
        let e = tree.update(&worse).expect_err("node fails").to_string();
        assert!(e.contains("pids_max") && e.contains("cannot be enforced here"), "{e}");
        assert_eq!(read("engine", "memory.max"), "268435456", "the engine's earlier value is back");
        assert_eq!(read("engine", "cpu.max"), "max 100000", "what the failed update set is undone");
        assert_eq!(tree.leaf(Role::Engine).expect("leaf").limits, after.limits(Role::Engine));
        assert_eq!(tree.leaf(Role::Node).expect("leaf").limits, after.limits(Role::Node));
    }

    /// A reload that changes no memory limit writes none (nothing to reclaim, no child to make):
    /// one where this user can make no process at all still applies a pids limit (found by
    /// review: it was refused, naming memory_max_mb).
    #[test]
    fn a_reload_without_a_memory_change_needs_no_child() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().expect("tmp");
        let before = cfg("limits = { memory_max_mb = 512 }", "limits = { memory_max_mb = 256, pids_max = 100 }");
        let mut tree = tree_in(d.path(), &before);
        for p in [d.path().to_path_buf(), d.path().join("engine"), d.path().join("node")] {
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o777)).expect("chmod");
            for e in std::fs::read_dir(&p).expect("ls").flatten() {
                std::fs::set_permissions(e.path(), std::fs::Permissions::from_mode(0o666)).expect("chmod");
            }
        }
        let (r, w) = nix::unistd::pipe().expect("pipe");
        // SAFETY: the child drops its ids, limits itself, updates the tree, reports and exits.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => {
                use nix::unistd::{Gid, Uid};
                drop(r);
                let msg = (|| -> std::result::Result<String, nix::errno::Errno> {
                    if nix::unistd::geteuid().is_root() {
                        nix::unistd::setresgid(Gid::from_raw(65534), Gid::from_raw(65534), Gid::from_raw(65534))?;
                        nix::unistd::setresuid(Uid::from_raw(65534), Uid::from_raw(65534), Uid::from_raw(65534))?;
                    }
                    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NPROC, 0, 0)?;
                    let after =
                        cfg("limits = { memory_max_mb = 512 }", "limits = { memory_max_mb = 256, pids_max = 50 }");
                    Ok(match tree.update(&after) {
                        Ok(r) => format!("ok {r:?}"),
                        Err(e) => format!("refused: {e}"),
                    })
                })()
                .unwrap_or_else(|e| format!("setup: {e}"));
                let _ = nix::unistd::write(&w, msg.as_bytes());
                crate::os::sys::exit_now(0)
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(w);
                let _ = nix::sys::wait::waitpid(child, None);
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::fs::File::from(r), &mut s).expect("read");
                assert_eq!(s, "ok [Engine, Node]", "cell.limits.pids_max is both roles'");
                let read = |r: &str, f: &str| std::fs::read_to_string(d.path().join(r).join(f)).expect(f);
                assert_eq!(
                    (read("engine", "pids.max"), read("engine", "memory.max")),
                    ("50".into(), "536870912".into())
                );
                assert_eq!((read("node", "pids.max"), read("node", "memory.max")), ("50".into(), "268435456".into()));
            }
        }
    }

    /// A stopped writer that set its value after a later write was proven: once it is reaped,
    /// the file reads the value in force again (found by review).
    #[test]
    fn a_stopped_writers_late_value_is_written_over() {
        let d = tempfile::tempdir().expect("tmp");
        let c = cfg("limits = { memory_max_mb = 512 }", "limits = { memory_max_mb = 256 }");
        let mut tree = tree_in(d.path(), &c);
        let max = d.path().join("node/memory.max");
        let pid = node_writer(&mut tree, "67108864", true, true, false);
        std::fs::write(&max, "67108864").expect("the stale value");
        assert!(tree.writer_exited(pid, killed(pid)), "its writer");
        assert_eq!(std::fs::read_to_string(&max).expect("read"), "268435456", "the value in force again");
        assert!(tree.leaves.iter().all(|l| l.writers.is_empty()));
        assert!(!tree.writer_exited(pid, nix::sys::wait::WaitStatus::Exited(pid, 0)), "not a writer any more");
    }

    /// A child that sleeps, standing in for a live writer still reclaiming.
    fn sleeper() -> nix::unistd::Pid {
        // SAFETY: the child only sleeps and exits.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => {
                std::thread::sleep(std::time::Duration::from_secs(30));
                crate::os::sys::exit_now(0)
            }
            nix::unistd::ForkResult::Parent { child } => child,
        }
    }

    /// A writer of the node's memory.max that wrote `value` (its child sleeping, or gone and
    /// reaped when `gone`), tracked in the node's leaf; returns its pid.
    /// How the loop sees a writer it stopped: killed by SIGKILL.
    fn killed(pid: nix::unistd::Pid) -> nix::sys::wait::WaitStatus {
        nix::sys::wait::WaitStatus::Signaled(pid, nix::sys::signal::Signal::SIGKILL, false)
    }

    fn node_writer(tree: &mut Tree, value: &str, gone: bool, stopped: bool, again: bool) -> nix::unistd::Pid {
        let pid = sleeper();
        if gone {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(pid, None);
        }
        let leaf = tree.leaves.iter_mut().find(|l| l.role == Role::Node).expect("leaf");
        let since = std::time::Instant::now();
        leaf.writers.push(Writer { pid, file: "memory.max".into(), value: value.into(), since, stopped, again });
        pid
    }

    /// A reload that changes only pids_max leaves the live reclaim of the node's memory.max
    /// (unchanged) going (found by review: it was stopped, and nothing written in its place).
    #[test]
    fn a_reload_of_other_limits_leaves_a_live_reclaim_going() {
        let d = tempfile::tempdir().expect("tmp");
        let before = cfg("limits = { memory_max_mb = 512 }", "limits = { memory_max_mb = 256, pids_max = 100 }");
        let mut tree = tree_in(d.path(), &before);
        // Usage above the limit in force: the kernel is still reclaiming towards 256 MiB.
        std::fs::write(d.path().join("node/memory.current"), "1073741824").expect("current");
        let pid = node_writer(&mut tree, "268435456", false, false, false);
        let after = cfg("limits = { memory_max_mb = 512 }", "limits = { memory_max_mb = 256, pids_max = 50 }");
        tree.update(&after).expect("update");
        let leaf = tree.leaves.iter_mut().find(|l| l.role == Role::Node).expect("leaf");
        let live = leaf.writers.iter().filter(|w| w.file == "memory.max" && !w.stopped).count();
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(pid, None);
        for w in leaf.writers.drain(..) {
            let _ = nix::sys::signal::kill(w.pid, nix::sys::signal::Signal::SIGKILL);
            let _ = nix::sys::wait::waitpid(w.pid, None);
        }
        assert_eq!(live, 1, "the reclaim of a limit still wanted goes on (or is resumed)");
    }

    /// A memory.max that differs from the record (a restore that could not write it back, a
    /// rewrite in writer_exited that failed) is written by the next reload of the role: what
    /// is skipped is what the file reads, not what the record says (found by review).
    #[test]
    fn a_memory_limit_that_differs_from_the_record_is_written_on_reload() {
        let d = tempfile::tempdir().expect("tmp");
        let before = cfg("limits = { memory_max_mb = 512 }", "limits = { memory_max_mb = 256, pids_max = 100 }");
        let mut tree = tree_in(d.path(), &before);
        std::fs::write(d.path().join("node/memory.max"), "536870912").expect("not what the record says");
        let after = cfg("limits = { memory_max_mb = 512 }", "limits = { memory_max_mb = 256, pids_max = 50 }");
        tree.update(&after).expect("update");
        let (_, rec) = tree.record(Role::Node).expect("record");
        assert_eq!(
            std::fs::read_to_string(d.path().join("node/memory.max")).expect("read"),
            rec["memory.max"],
            "the file holds what the record (receipt, ctl status) says is in force"
        );
    }

    /// memory_high_mb is bounded without memory_max_mb too (found by review: MiB to bytes
    /// overflowed, a panic in debug, a wrap to 0 bytes in release).
    #[test]
    fn memory_high_mb_without_max_is_bounded() {
        let text = "schema = 1\n[cell]\nstate_dir = \"/s\"\nruntime_dir = \"/r\"\nlimits = { memory_high_mb = 17592186044416 }\n\
                    [engine]\ncommand = [\"/e\"]\nport = 1\nseccomp = \"/p\"\nlandlock = \"/l\"\nscratch = \"/x\"\n\
                    [node]\ncommand = [\"/n\"]\nseccomp = \"/p\"\nlandlock = \"/l\"\nscratch = \"/y\"\n";
        let e = Config::parse(text, Path::new("/t.toml")).expect_err("2^44 MiB refused").to_string();
        assert!(e.contains("cell.limits.memory_high_mb") && e.contains("between 16 and 16777216"), "{e}");
    }

    /// A limit taken out is "max" in the file; a stopped writer's late value is written over
    /// with "max", not with the old limit.
    #[test]
    fn a_late_value_after_a_limit_taken_out_becomes_max() {
        let d = tempfile::tempdir().expect("tmp");
        let before = cfg("", "limits = { memory_max_mb = 256 }");
        let mut tree = tree_in(d.path(), &before);
        tree.update(&cfg("", "limits = { pids_max = 50 }")).expect("update");
        let max = d.path().join("node/memory.max");
        assert_eq!(std::fs::read_to_string(&max).expect("read"), "max");
        let pid = node_writer(&mut tree, "67108864", true, true, false);
        std::fs::write(&max, "67108864").expect("stale");
        assert!(tree.writer_exited(pid, killed(pid)));
        assert_eq!(std::fs::read_to_string(&max).expect("read"), "max");
    }

    /// A stopped writer reaped while a newer live writer of its file is still in the write:
    /// its file is not touched (the live writer owns it).
    #[test]
    fn a_newer_live_writer_owns_its_file() {
        let d = tempfile::tempdir().expect("tmp");
        let c = cfg("", "limits = { memory_max_mb = 256 }");
        let mut tree = tree_in(d.path(), &c);
        let max = d.path().join("node/memory.max");
        let old = node_writer(&mut tree, "67108864", true, true, false);
        let live = node_writer(&mut tree, "268435456", false, false, false);
        std::fs::write(&max, "1").expect("what the file holds");
        assert!(tree.writer_exited(old, killed(old)));
        let after = std::fs::read_to_string(&max).expect("read");
        let n = tree.leaves.iter().map(|l| l.writers.len()).sum::<usize>();
        let _ = nix::sys::signal::kill(live, nix::sys::signal::Signal::SIGKILL);
        let _ = nix::sys::wait::waitpid(live, None);
        assert_eq!((after.as_str(), n), ("1", 1));
    }

    /// A rewrite in writer_exited that is itself given up on (the value does not read back
    /// within 2 s) is not retried when its child is reaped (found by review: each reap
    /// blocked the loop 2 s and left one more given-up writer, without end): the file is left
    /// as it reads, said in the log, until the next reload.
    #[test]
    fn a_given_up_rewrite_is_not_retried() {
        let d = tempfile::tempdir().expect("tmp");
        let c = cfg("", "limits = { memory_max_mb = 256 }");
        let mut tree = tree_in(d.path(), &c);
        let max = d.path().join("node/memory.max");
        let pid = node_writer(&mut tree, "268435456", true, true, true);
        std::fs::write(&max, "67108864").expect("what the kernel kept");
        let at = std::time::Instant::now();
        assert!(tree.writer_exited(pid, killed(pid)));
        assert!(at.elapsed() < std::time::Duration::from_millis(500), "nothing waited for");
        assert_eq!(std::fs::read_to_string(&max).expect("read"), "67108864", "not written a second time");
        assert!(tree.leaves.iter().all(|l| l.writers.is_empty()), "no new writer");
    }

    /// A cell made without leaves takes no limit on reload, even where the host could now
    /// enforce one: nothing would write it (found by review).
    #[test]
    fn a_cell_without_leaves_refuses_every_limit_on_reload() {
        let e = check_update(None, &cfg("", "limits = { pids_max = 10 }")).expect_err("refused").to_string();
        assert!(e.contains("cell.limits.pids_max") && e.contains("without cgroup leaves"), "{e}");
        assert!(check_update(None, &cfg("", "")).is_ok());
    }

    /// Resets: what was written before and is not now; io.max per device line.
    #[test]
    fn a_limit_taken_out_resets_to_the_kernels_default() {
        let before = record(&[
            ("memory.max", "1".into(), ""),
            ("cpu.weight", "200".into(), ""),
            ("io.max", "8:0 rbps=1".into(), ""),
            ("io.max", "8:16 wbps=2".into(), ""),
        ]);
        assert_eq!(before.get("io.max").map(String::as_str), Some("8:0 rbps=1; 8:16 wbps=2"));
        let now = [("memory.max", "2".to_string(), ""), ("io.max", "8:16 wbps=3".to_string(), "")];
        assert_eq!(
            resets(&before, &now),
            vec![
                ("cpu.weight", "100".to_string(), "cpu_weight"),
                ("io.max", "8:0 rbps=max wbps=max riops=max wiops=max".to_string(), "io_max"),
            ]
        );
    }

    #[test]
    fn keyed_files_parse_and_skip_what_is_not_a_count() {
        let d = tempfile::tempdir().expect("tmp");
        let p = d.path().join("memory.events");
        std::fs::write(&p, "low 0\nhigh 3\nmax 7\noom 1\noom_kill 1\nbogus\nweird x\n").expect("write");
        let k = keyed(&p);
        assert_eq!((k["high"], k["oom_kill"], k.len()), (3, 1, 5));
    }
}
