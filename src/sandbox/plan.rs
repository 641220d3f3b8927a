//! The plan: everything the child needs, computed in the parent before any clone.
//!
//! Paths are opened and checked, policies compiled, strings turned into C strings and pointer
//! arrays, so the child only performs system calls in order. A bad policy fails here, before
//! a process exists.

use std::ffi::{CString, OsStr};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use seccompiler::BpfProgram;

use crate::config::{Config, Ids, Invoker, PathKind, Role, RoleConfig, RolePath};
use crate::error::{Error, Result};
use crate::layout::{INSIDE_CREDENTIAL, INSIDE_MODELS, INSIDE_SCRATCH};
use crate::policy::{landlock, seccomp};
use crate::sandbox::namespaces::NETNS_SYSCTLS;

pub use crate::layout::SYSTEM_RO;

/// System directories the canary tries to create files in (empty on Debian). With the
/// namespaces layer on they are inside read-only binds (or absent); in the layer matrix's
/// namespaces-off columns they are covered by a mode 0555 tmpfs.
pub const MATRIX_WRITE_TARGETS: &[&str] = &["/usr/local/src", "/etc/opt"];

/// Device nodes every role gets.
pub const BASE_DEVICES: &[&str] = &["/dev/null", "/dev/zero", "/dev/full", "/dev/random", "/dev/urandom"];

/// /proc entries hidden behind /dev/null (files) or an empty read-only tmpfs (dirs).
pub const PROC_MASK_FILES: &[&str] = &[
    "/proc/kcore",
    "/proc/kallsyms",
    "/proc/sysrq-trigger",
    "/proc/timer_list",
    "/proc/keys",
    "/proc/latency_stats",
    "/proc/sched_debug",
    "/proc/kmsg",
    "/proc/config.gz",
    // The sandbox init is a fork of the launcher: its command line is sealnode's, config path
    // included (its environ is closed anyway: not dumpable). Its main thread shows the same
    // text under task/, masked too; the init never starts another thread
    // (tests/sandbox.rs: exit_codes_and_stdio_pass_through).
    "/proc/1/cmdline",
    "/proc/1/task/1/cmdline",
];
pub const PROC_MASK_DIRS: &[&str] = &["/proc/acpi", "/proc/scsi", "/proc/asound", "/proc/firmware"];
/// /proc subtrees kept visible but read-only.
pub const PROC_READONLY: &[&str] = &["/proc/sys", "/proc/bus", "/proc/fs", "/proc/irq"];

use crate::os::sys::{
    MOUNT_ATTR_NODEV as NODEV, MOUNT_ATTR_NOEXEC as NOEXEC, MOUNT_ATTR_NOSUID as NOSUID, MOUNT_ATTR_RDONLY as RDONLY,
};

pub use super::table::{Check, Mount, NEWROOT};

/// What to execute at the end.
#[derive(Debug)]
pub enum Program {
    /// A path inside the sandbox (or a bare name searched in the sandbox's PATH).
    Path(CString),
    /// sealnode's own sealed copy (memfd), for probes; executed via /proc/self/fd.
    SealedSelf(std::os::fd::OwnedFd),
    /// The role's own program ([`SealedProgram`]): bound over its path in the view from a sealed
    /// copy, so there is no window to swap the file between hashing and exec.
    Sealed(SealedProgram),
}

/// A role's program as the gate measures it: the file its `command[0]` resolves to in the
/// role's view (sandbox::view), to be copied into `fd` (a sealable memfd), sealed and hashed
/// off the event loop (crate::proof::measure). The copy is what the role runs.
#[derive(Debug)]
pub struct SealedProgram {
    pub fd: std::os::fd::OwnedFd,
    /// The config field that names it (`engine.command[0]`) and its pin (`engine.sha256`).
    pub field: String,
    pub pin: Option<String>,
    /// Where the view shows it (symlinks resolved) and the host file behind that.
    pub inside: PathBuf,
    pub host: PathBuf,
    /// The sha256 of the sealed copy, once measured: only a measured plan starts.
    pub sha256: Option<String>,
}

/// Which confinement layers a sandbox gets. Every real sandbox gets all of them; the canary's
/// layer matrix turns all but one off to show what each layer stops on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Layers {
    pub seccomp: bool,
    pub landlock: bool,
    /// Private root, masked /proc, own pid and net namespaces. When off (matrix only), the
    /// sandbox still gets user, mount, uts and ipc namespaces and sees the host's root
    /// read-only, so nothing it tries can change the host.
    pub namespaces: bool,
    /// Every capability dropped, no_new_privs. (The role uid/gid is always set: uid 0 is
    /// never mapped. When off, the matrix keeps all capabilities across exec instead.)
    pub credentials: bool,
}

impl Layers {
    pub const ALL: Layers = Layers { seccomp: true, landlock: true, namespaces: true, credentials: true };
    pub const NONE: Layers = Layers { seccomp: false, landlock: false, namespaces: false, credentials: false };
}

/// The limits every role's setup sets, in this order (core dumps off, then the role's
/// `limits`): the plan's values, the probe's calls (`sealnode doctor`) and the setup error's
/// names follow it.
pub const RLIMITS: [nix::sys::resource::Resource; 5] = [
    nix::sys::resource::Resource::RLIMIT_CORE,
    nix::sys::resource::Resource::RLIMIT_NOFILE,
    nix::sys::resource::Resource::RLIMIT_NPROC,
    nix::sys::resource::Resource::RLIMIT_FSIZE,
    nix::sys::resource::Resource::RLIMIT_MEMLOCK,
];

/// Everything the child needs.
#[derive(Debug)]
pub struct Plan {
    pub layers: Layers,
    pub role: Role,
    pub ids: Ids,
    pub rootful: bool,
    pub hostname: CString,
    pub mounts: Vec<Mount>,
    pub workdir: CString,
    pub rlimits: Vec<(nix::sys::resource::Resource, u64)>,
    pub landlock: landlock::Resolved,
    pub seccomp: BpfProgram,
    /// The denial log (`log_refused_syscalls`): `seccomp` hands every refusal to a listener the
    /// child passes to the launcher, which answers with this errno (Plan::log_refusals).
    pub refusal_log: Option<i32>,
    /// Candidate executable paths (one, or the PATH search of a bare name).
    pub exec_paths: Vec<CString>,
    pub argv: Vec<CString>,
    pub envp: Vec<CString>,
    // Keeps the sealed copy open until the child has copied or exec'd it.
    pub program: Program,
    /// The role's stdin and stdout when they are not the launcher's own (the canary's pty and
    /// report pipe; `run`'s /dev/null and output pipe); the child puts them on fds 0 and 1, and
    /// a stderr of its own (`run`'s second pipe) on fd 2.
    pub stdio: Option<Stdio>,
}

/// A role's own stdin and stdout, and stderr when it is not the launcher's (see [`Plan::stdio`]).
#[derive(Debug)]
pub struct Stdio {
    pub stdin: std::os::fd::OwnedFd,
    pub stdout: std::os::fd::OwnedFd,
    pub stderr: Option<std::os::fd::OwnedFd>,
}

impl Plan {
    /// Put the plan's stdio (if any) on fds 0 and 1 (in the child, before fds are closed).
    pub fn install_stdio(&self) -> std::result::Result<(), nix::errno::Errno> {
        if let Some(s) = &self.stdio {
            nix::unistd::dup2_stdin(&s.stdin)?;
            nix::unistd::dup2_stdout(&s.stdout)?;
            if let Some(e) = &s.stderr {
                nix::unistd::dup2_stderr(e)?;
            }
        }
        Ok(())
    }

    /// The fd the workload is executed or copied from, if any (-1 otherwise).
    pub fn program_fd(&self) -> std::os::fd::RawFd {
        use std::os::fd::AsRawFd;
        match &self.program {
            Program::SealedSelf(fd) => fd.as_raw_fd(),
            Program::Sealed(p) => p.fd.as_raw_fd(),
            Program::Path(_) => -1,
        }
    }

    /// The role's own program, when this plan runs it (not `exec`'s command or a probe).
    pub fn sealed_program(&self) -> Option<&SealedProgram> {
        match &self.program {
            Program::Sealed(p) => Some(p),
            _ => None,
        }
    }

    /// Record the gate's measurement of the sealed copy: its digest, and the mode the copy
    /// gets in the view (what the host file's bits grant the role). Only a measured plan runs.
    pub fn measured(&mut self, sha256: String, mode: u32) -> bool {
        use std::os::fd::AsRawFd;
        let Program::Sealed(p) = &mut self.program else { return false };
        p.sha256 = Some(sha256);
        let fd = p.fd.as_raw_fd();
        for mount in &mut self.mounts {
            if let Mount::SealedProgram { fd: f, mode: m, .. } = mount {
                if *f == fd {
                    *m = mode;
                    return true;
                }
            }
        }
        false
    }

    /// The sha256 of the sealed copy this plan runs, once measured.
    pub fn program_sha256(&self) -> Option<&str> {
        self.sealed_program().and_then(|p| p.sha256.as_deref())
    }
}

/// NULL-terminated pointer array into `strings` (valid while `strings` lives).
pub fn ptr_array(strings: &[CString]) -> Vec<*const libc::c_char> {
    strings.iter().map(|s| s.as_ptr()).chain(std::iter::once(std::ptr::null())).collect()
}

fn cstr(p: impl AsRef<OsStr>) -> Result<CString> {
    let p = p.as_ref();
    CString::new(p.as_bytes()).map_err(|e| {
        Error::io(format!("path {}", Path::new(p).display()), std::io::Error::new(std::io::ErrorKind::InvalidInput, e))
    })
}

fn under_root(inside: &Path) -> Result<CString> {
    let mut s = PathBuf::from(NEWROOT);
    s.push(inside.strip_prefix("/").unwrap_or(inside));
    cstr(s)
}

/// The environment: a fixed base, explicit values, and allowlisted names from the launcher.
/// Never the launcher's environment as a whole; never a proxy variable.
pub fn build_env(cfg: &Config, role: Role, launcher_env: &[(String, String)]) -> Vec<(String, String)> {
    let r = cfg.role(role);
    let mut env: std::collections::BTreeMap<String, String> =
        [("PATH", "/usr/local/bin:/usr/bin:/bin"), ("HOME", INSIDE_SCRATCH), ("TMPDIR", "/tmp"), ("LANG", "C.UTF-8")]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
    for name in &r.env.pass {
        if let Some((_, v)) = launcher_env.iter().find(|(k, _)| k == name) {
            env.insert(name.clone(), v.clone());
        }
    }
    // The CDI spec's environment (CUDA's), under what the config sets itself.
    for (k, v) in cfg.cdi(role).map(|c| c.edits.env.as_slice()).unwrap_or_default() {
        env.insert(k.clone(), v.clone());
    }
    for (k, v) in &r.env.set {
        env.insert(k.clone(), v.clone());
    }
    env.retain(|k, _| !crate::config::is_proxy_var(k));
    env.into_iter().collect()
}

/// Variables the dynamic loader and libc act on before `main` or beyond the program's own code:
/// `LD_*` (LD_PRELOAD, LD_LIBRARY_PATH, LD_AUDIT, LD_DEBUG_OUTPUT...), `MALLOC_*`, and the rest
/// of the list glibc drops for setuid programs (its "unsecure" variables; TMPDIR aside, which
/// sealnode sets itself). The role's program gets them as configured; sealnode's own sealed
/// copy (the canary probe) runs without them, or a library in a role's bind would run as the
/// probe and answer for it (tests/gate.rs: the_probe_runs_without_the_roles_loader_variables).
pub fn loader_var(name: &str) -> bool {
    const NAMES: &[&str] = &[
        "GLIBC_TUNABLES",
        "GCONV_PATH",
        "GETCONF_DIR",
        "HOSTALIASES",
        "LOCALDOMAIN",
        "LOCPATH",
        "NIS_PATH",
        "NLSPATH",
        "RESOLV_HOST_CONF",
        "RES_OPTIONS",
        "TZDIR",
    ];
    name.starts_with("LD_") || name.starts_with("MALLOC_") || NAMES.contains(&name)
}

/// `envp` ("NAME=value" each) without the [`loader_var`]s: sealnode's own copy runs with it.
fn without_loader_vars(envp: &[CString]) -> Vec<CString> {
    envp.iter()
        .filter(|e| {
            let name = e.to_bytes().split(|b| *b == b'=').next().unwrap_or_default();
            !std::str::from_utf8(name).map_or(true, loader_var)
        })
        .cloned()
        .collect()
}

fn generated_etc(cfg: &Config, role: Role, ids: Ids) -> Vec<(&'static str, String)> {
    let host = &cfg.cell.hostname;
    let mut hosts = format!("127.0.0.1\tlocalhost {host}\n::1\tlocalhost ip6-localhost\n");
    // Each egress upstream's name points at its forwarder inside the cell.
    for (i, e) in cfg.role(role).egress.iter().enumerate() {
        hosts.push_str(&format!("{}\t{}\n", Config::egress_addr(i), e.host));
    }
    vec![
        ("/etc/hostname", format!("{host}\n")),
        ("/etc/hosts", hosts),
        (
            "/etc/passwd",
            format!("sealnode:x:{}:{}:sealnode role:{INSIDE_SCRATCH}:/usr/sbin/nologin\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n", ids.uid, ids.gid),
        ),
        ("/etc/group", format!("sealnode:x:{}:\nnogroup:x:65534:\n", ids.gid)),
        ("/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files\n".to_string()),
        ("/etc/host.conf", "multi on\n".to_string()),
        ("/etc/resolv.conf", "# no DNS inside the sealnode cell; egress names are in /etc/hosts\n".to_string()),
    ]
}

impl Plan {
    /// Build the plan for running `argv` (or the role's own command) in `role`'s sandbox.
    pub fn build(
        cfg: &Config,
        role: Role,
        inv: &Invoker,
        argv: Option<Vec<String>>,
        program: Option<Program>,
    ) -> Result<Plan> {
        Plan::build_layers(cfg, role, inv, argv, program, Layers::ALL)
    }

    /// The plan a role of `run` starts with: the role's own command (its program resolved in
    /// its view, a memfd for the sealed copy), with its denial log when it has
    /// `log_refused_syscalls`.
    pub fn for_run(cfg: &Config, role: Role, inv: &Invoker) -> Result<Plan> {
        Ok(Plan::for_run_and_probe(cfg, role, inv, None)?.0)
    }

    /// [`Plan::for_run`], and with `probe` (the battery's command line and sealnode's sealed
    /// copy) the preflight's plan made from it ([`Plan::probe`]) before the denial log
    /// replaces its filter: the probe's refusals are refused in the kernel, as the role's are
    /// without the log.
    pub fn for_run_and_probe(
        cfg: &Config,
        role: Role,
        inv: &Invoker,
        probe: Option<(Vec<String>, std::os::fd::OwnedFd)>,
    ) -> Result<(Plan, Option<Plan>)> {
        let mut plan = Plan::build(cfg, role, inv, None, None)?;
        let probe = match probe {
            Some((argv, fd)) => Some(plan.probe(argv, fd)?),
            None => None,
        };
        if cfg.role(role).log_refused_syscalls {
            plan.log_refusals(cfg)?;
        }
        Ok((plan, probe))
    }

    /// The same sandbox running sealnode's sealed copy (`fd`, [`sealed_self`]) with `argv`
    /// instead of the role's program: the preflight runs the very plan the role starts from
    /// (its ids, view with the (dev, inode) of each bind as checked, Landlock rules, seccomp
    /// filter, rlimits and environment), built and checked once. Only the sealed copy of the
    /// role's program is not mounted (the probe does not run it; the gate measures it).
    pub fn probe(&self, argv: Vec<String>, fd: std::os::fd::OwnedFd) -> Result<Plan> {
        use std::os::fd::AsRawFd;
        if self.refusal_log.is_some() {
            return Err(Error::io(
                "probe plan",
                std::io::Error::other("made after the denial log replaced the filter (internal error)"),
            ));
        }
        Ok(Plan {
            layers: self.layers,
            role: self.role,
            ids: self.ids,
            rootful: self.rootful,
            hostname: self.hostname.clone(),
            mounts: self.mounts.iter().filter(|m| !matches!(m, Mount::SealedProgram { .. })).cloned().collect(),
            workdir: self.workdir.clone(),
            rlimits: self.rlimits.clone(),
            landlock: self.landlock.clone(),
            seccomp: self.seccomp.clone(),
            refusal_log: None,
            exec_paths: vec![cstr(format!("/proc/self/fd/{}", fd.as_raw_fd()))?],
            argv: argv.iter().map(cstr).collect::<Result<_>>()?,
            envp: without_loader_vars(&self.envp),
            program: Program::SealedSelf(fd),
            stdio: None,
        })
    }

    /// `run`, for a role with `log_refused_syscalls`: its refusals go to a listener the
    /// supervisor serves (and logs) instead of failing in the kernel; the answer is the same.
    pub fn log_refusals(&mut self, cfg: &Config) -> Result<()> {
        let (prog, errno) = crate::policy::seccomp::notify_refusals(&self.seccomp, crate::policy::arch::native_arch())
            .map_err(|e| {
                Error::config(
                    &cfg.file,
                    format!("{}.log_refused_syscalls", self.role),
                    format!("the seccomp policy: {e}"),
                )
            })?;
        self.seccomp = prog;
        self.refusal_log = Some(errno);
        Ok(())
    }

    /// Outside a cell (`exec`, `probe`, the canary's matrix): a capped scratch becomes a fresh tmpfs of the cap's
    /// size, the role's own (nothing persists; in a cell, the cell holds it).
    pub fn fresh_capped_scratch(&mut self) -> Result<()> {
        for m in &mut self.mounts {
            if let Mount::Bind { dst, check: Check::Tmpfs(bytes), attrs, .. } = m {
                let opts = crate::sandbox::table::scratch_tmpfs_options(*bytes >> 20, self.ids.uid, self.ids.gid);
                *m = Mount::Tmpfs { dst: dst.clone(), opts: cstr(&opts)?, attrs: *attrs };
            }
        }
        Ok(())
    }

    /// [`Plan::build`] with some layers off (the canary's layer matrix only).
    pub fn build_layers(
        cfg: &Config,
        role: Role,
        inv: &Invoker,
        argv: Option<Vec<String>>,
        program: Option<Program>,
        layers: Layers,
    ) -> Result<Plan> {
        let r = cfg.role(role);
        let ids = cfg.role_ids(role)?;
        let (landlock, seccomp) = policies(cfg, role)?;
        let (mut mounts, workdir, landlock) = if layers.namespaces {
            (mount_table(cfg, role, inv, ids)?, cstr(INSIDE_SCRATCH)?, landlock)
        } else {
            (matrix_mounts(r)?, cstr("/")?, matrix_landlock(cfg, role, landlock)?)
        };
        let exec = Exec::resolve(cfg, role, argv, program, &mut mounts)?;
        let l = &r.rlimits;
        Ok(Plan {
            layers,
            role,
            ids,
            rootful: inv.rootful(),
            hostname: cstr(&cfg.cell.hostname)?,
            mounts,
            workdir,
            rlimits: RLIMITS
                .into_iter()
                .zip([0, l.nofile, l.nproc, l.fsize_mb.saturating_mul(1 << 20), l.memlock_kb.saturating_mul(1 << 10)])
                .collect(),
            landlock,
            seccomp,
            exec_paths: exec.paths,
            argv: exec.argv,
            envp: exec.envp,
            program: exec.program,
            stdio: None,
            refusal_log: None,
        })
    }
}

/// The role's Landlock ruleset, resolved against its view, and its compiled seccomp filter,
/// from the policies as `Config::load` read them (checked, once): never the files again.
fn policies(cfg: &Config, role: Role) -> Result<(landlock::Resolved, BpfProgram)> {
    let r = cfg.role(role);
    let (sc, ll) = cfg.policy_files(role)?;
    let rules = landlock::Rules::from_loaded(&ll.bytes, &r.landlock)?;
    rules.check_role(role, &r.landlock)?;
    landlock::require_kernel_abi(rules.min_abi, &r.landlock)?;
    let landlock = rules.resolve(cfg, role);
    let seccomp =
        seccomp::compile_loaded(&sc.bytes, &sc.sha256, &r.seccomp, role.name(), crate::policy::arch::native_arch())?;
    Ok((landlock, seccomp))
}

/// The mount table of a role's private root, in the order the child applies it.
fn mount_table(cfg: &Config, role: Role, inv: &Invoker, ids: Ids) -> Result<Vec<Mount>> {
    let r = cfg.role(role);
    let mut mounts = vec![Mount::Tmpfs {
        dst: cstr(NEWROOT)?,
        opts: cstr("size=1m,nr_inodes=4096,mode=0755")?,
        attrs: NOSUID | NODEV,
    }];
    // System paths, read-only; symlinks recreated.
    for p in SYSTEM_RO {
        let path = Path::new(p);
        let Ok(md) = std::fs::symlink_metadata(path) else {
            continue;
        };
        if md.file_type().is_symlink() {
            let target = std::fs::read_link(path).map_err(|e| Error::io(format!("readlink {p}"), e))?;
            mounts.push(Mount::Symlink { target: cstr(&target)?, dst: under_root(path)? });
        } else {
            mounts.push(Mount::Bind {
                src: cstr(path)?,
                dst: under_root(path)?,
                dir: md.is_dir(),
                attrs: RDONLY | NOSUID | NODEV,
                check: Check::None,
                nofollow: false,
            });
        }
    }
    // Role paths: opened without symlinks and checked (owner, mode) on that same fd, whose
    // (dev, inode) the child verifies again right before mounting. What is bound is the path
    // that fd was reached by: the credential's in a Secret volume is its timestamped dir's,
    // with no symlink left in it, resolved again at every start.
    let role_bind = |field: String, src: &Path, inside: &Path, writable: bool, exec: bool, kind| -> Result<Mount> {
        let (md, src) = cfg.checked_role_path(role, &RolePath { field, path: src, writable, kind }, inv)?;
        let mut attrs = NOSUID | NODEV;
        if !writable {
            attrs |= RDONLY;
        }
        if writable || !exec {
            attrs |= NOEXEC;
        }
        Ok(Mount::Bind {
            src: cstr(&src)?,
            dst: under_root(inside)?,
            dir: md.is_dir(),
            attrs,
            check: Check::Identity(md.dev(), md.ino()),
            nofollow: true,
        })
    };
    if let Some(m) = &r.models {
        mounts.push(role_bind(
            format!("{role}.models"),
            m,
            Path::new(INSIDE_MODELS),
            r.models_writable,
            false,
            PathKind::Dir,
        )?);
    }
    let mut scratch =
        role_bind(format!("{role}.scratch"), &r.scratch, Path::new(INSIDE_SCRATCH), true, false, PathKind::Dir)?;
    if let (Some(mb), Mount::Bind { check, .. }) = (r.scratch_max_mb, &mut scratch) {
        // Capped: what the child must find at the scratch path is the cell's tmpfs.
        *check = Check::Tmpfs(mb << 20);
    }
    mounts.push(scratch);
    if let Some(c) = &r.credential {
        mounts.push(role_bind(
            format!("{role}.credential"),
            c,
            Path::new(INSIDE_CREDENTIAL),
            false,
            false,
            PathKind::Secret,
        )?);
    }
    for (field, b) in cfg.binds(role) {
        mounts.push(role_bind(field, &b.src, b.inside(), false, b.exec, PathKind::Any)?);
    }
    // The node's view of the latest signed statement: `run`'s dir for it, read-only, where the
    // file is replaced at every start (a dir bind shows each new file). Only once `run` made it.
    let attest = cfg.cell.runtime_dir.join(crate::layout::RUNTIME_ATTEST_DIR);
    if role == Role::Node && std::fs::symlink_metadata(&attest).is_ok_and(|m| m.is_dir()) {
        mounts.push(role_bind(
            "cell.runtime_dir (attest/)".into(),
            &attest,
            Path::new(crate::layout::INSIDE_ATTESTATION_DIR),
            false,
            false,
            PathKind::Dir,
        )?);
    }
    mounts.extend(dev_and_tmp(r, &cfg.devices(role))?);
    mounts.extend(proc_mounts()?);
    for (p, contents) in generated_etc(cfg, role, ids) {
        mounts.push(Mount::File { dst: under_root(Path::new(p))?, contents: contents.into_bytes() });
    }
    through_own_links(&mut mounts)?;
    Ok(mounts)
}

/// Destinations through sealnode's own links (`/lib -> usr/lib`, made earlier in the table)
/// named by where they lead: the child follows no symlink on a destination's way
/// (`sandbox::mounts`), so a CDI spec's `/lib/x86_64-linux-gnu/libcuda.so.1` is bound at
/// `/usr/lib/x86_64-linux-gnu/libcuda.so.1`, where the role reaches it through the same link.
/// A link whose target climbs (`..`) is left as it is: a destination through it fails the
/// start. Unit test: plan::tests::a_destination_through_sealnodes_own_link_is_named_by_its_target.
fn through_own_links(mounts: &mut [Mount]) -> Result<()> {
    let links: Vec<(PathBuf, PathBuf)> = mounts
        .iter()
        .filter_map(|m| {
            let Mount::Symlink { target, dst } = m else { return None };
            let (dst, target) = (as_path(dst), as_path(target));
            if target.components().any(|c| c == std::path::Component::ParentDir) {
                return None;
            }
            let to = if target.is_absolute() {
                Path::new(NEWROOT).join(target.strip_prefix("/").unwrap_or(target))
            } else {
                dst.parent()?.join(target)
            };
            Some((dst.to_path_buf(), to))
        })
        .collect();
    for m in mounts.iter_mut() {
        let (Mount::Bind { dst, .. } | Mount::Tmpfs { dst, .. } | Mount::File { dst, .. }) = m else { continue };
        let mut path = as_path(dst).to_path_buf();
        // Bounded as the kernel bounds a walk's links.
        for _ in 0..40 {
            let Some((rest, to)) = links.iter().find_map(|(l, to)| path.strip_prefix(l).ok().map(|r| (r, to))) else {
                break;
            };
            path = if rest.as_os_str().is_empty() { to.clone() } else { to.join(rest) };
        }
        *dst = cstr(&path)?;
    }
    Ok(())
}

fn as_path(c: &CString) -> &Path {
    Path::new(std::ffi::OsStr::from_bytes(c.as_bytes()))
}

/// `/dev` (a tmpfs with bound device nodes, then frozen), `/dev/shm` and `/tmp`.
fn dev_and_tmp(r: &RoleConfig, devices: &[&Path]) -> Result<Vec<Mount>> {
    let mut mounts = Vec::new();
    // Minimal /dev: tmpfs without devices of its own; device nodes are bind mounts.
    mounts.push(Mount::Tmpfs {
        dst: under_root(Path::new("/dev"))?,
        opts: cstr("size=64k,nr_inodes=64,mode=0755")?,
        attrs: NOSUID | NODEV | NOEXEC,
    });
    for d in BASE_DEVICES.iter().map(Path::new).chain(devices.iter().copied()) {
        mounts.push(Mount::Bind {
            src: cstr(d)?,
            dst: under_root(d)?,
            dir: false,
            attrs: NOSUID | NOEXEC,
            check: Check::None,
            nofollow: true,
        });
    }
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        mounts.push(Mount::Symlink { target: cstr(target)?, dst: under_root(&Path::new("/dev").join(name))? });
    }
    let tmp_opts = format!("size={}m,nr_inodes=65536,mode=1777", r.tmp_size_mb);
    mounts.push(Mount::Tmpfs {
        dst: under_root(Path::new("/dev/shm"))?,
        opts: cstr(&tmp_opts)?,
        attrs: NOSUID | NODEV | NOEXEC,
    });
    // /dev is populated: nothing more may be created in it.
    mounts.push(Mount::Freeze { dst: under_root(Path::new("/dev"))? });
    mounts.push(Mount::Tmpfs {
        dst: under_root(Path::new("/tmp"))?,
        opts: cstr(&tmp_opts)?,
        attrs: NOSUID | NODEV | NOEXEC,
    });
    Ok(mounts)
}

/// A fresh `/proc` with the kernel's sharp edges masked, and the sysctls the seal sets.
fn proc_mounts() -> Result<Vec<Mount>> {
    let mut mounts = Vec::new();
    // Fresh /proc for the new pid namespace, with the kernel's sharp edges hidden.
    mounts.push(Mount::Proc { dst: under_root(Path::new("/proc"))? });
    for p in PROC_MASK_FILES {
        mounts.push(Mount::MaskFile { dst: under_root(Path::new(p))? });
    }
    for p in PROC_MASK_DIRS {
        mounts.push(Mount::MaskDir { dst: under_root(Path::new(p))? });
    }
    // No nested user namespaces in this user namespace: a second layer behind seccomp
    // (the limit is per user namespace; the role cannot raise it: /proc/sys is read-only).
    mounts.push(Mount::Sysctl {
        dst: under_root(Path::new("/proc/sys/user/max_user_namespaces"))?,
        value: b"0\n",
        optional: false,
    });
    // The role's network namespace (the cell's, inside a cell, where the cell init set them
    // and the role reads them back): see NETNS_SYSCTLS.
    for (p, value, optional) in NETNS_SYSCTLS {
        mounts.push(Mount::Sysctl { dst: under_root(&Path::new("/proc/sys").join(p))?, value, optional });
    }
    for p in PROC_READONLY {
        mounts.push(Mount::ReadOnly { dst: under_root(Path::new(p))? });
    }
    Ok(mounts)
}

/// The canary matrix's "namespaces off" columns: the host's whole tree, read-only, as the
/// root, so nothing the probe tries can change the host. The canary's write and exec targets
/// get throwaway tmpfs mounts, so each remaining layer's own refusal stays observable: the
/// scratch dir writable and executable, the other targets mode 0555.
fn matrix_mounts(r: &RoleConfig) -> Result<Vec<Mount>> {
    let mut host = vec![Mount::Bind {
        src: cstr("/")?,
        dst: cstr(NEWROOT)?,
        dir: true,
        attrs: RDONLY | NOSUID | NODEV,
        check: Check::None,
        nofollow: false,
    }];
    let mut targets = vec![(r.scratch.clone(), "mode=1777")];
    for t in MATRIX_WRITE_TARGETS.iter().map(PathBuf::from).chain(r.models.clone()) {
        targets.push((t, "mode=0555"));
    }
    for (t, mode) in targets {
        if t.is_dir() {
            host.push(Mount::Tmpfs {
                dst: under_root(&t)?,
                opts: cstr(format!("size=16m,{mode}"))?,
                attrs: NOSUID | NODEV,
            });
        }
    }
    Ok(host)
}

/// The paths a role's view places its own dirs and binds at (inside, host), in the order the
/// mount table binds them ([`mount_table`]): a later one shows over an earlier one.
fn placed(cfg: &Config, role: Role) -> Vec<(PathBuf, PathBuf)> {
    let r = cfg.role(role);
    let mut v: Vec<(PathBuf, PathBuf)> = Vec::new();
    v.extend(r.models.iter().map(|m| (PathBuf::from(INSIDE_MODELS), m.clone())));
    v.push((PathBuf::from(INSIDE_SCRATCH), r.scratch.clone()));
    v.extend(r.credential.iter().map(|c| (PathBuf::from(INSIDE_CREDENTIAL), c.clone())));
    v.extend(cfg.binds(role).iter().map(|(_, b)| (b.inside().to_path_buf(), b.src.clone())));
    let attest = cfg.cell.runtime_dir.join(crate::layout::RUNTIME_ATTEST_DIR);
    if role == Role::Node && std::fs::symlink_metadata(&attest).is_ok_and(|m| m.is_dir()) {
        v.push((PathBuf::from(crate::layout::INSIDE_ATTESTATION_DIR), attest));
    }
    v
}

/// Where the host shows what the role's view shows at `inside`: beneath the last of `placed`
/// at or above it, that bind's source; `None` where the view shows the host's own path.
fn host_of(placed: &[(PathBuf, PathBuf)], inside: &Path) -> Option<PathBuf> {
    placed.iter().rev().find_map(|(at, host)| {
        let rest = inside.strip_prefix(at).ok()?;
        Some(if rest.as_os_str().is_empty() { host.clone() } else { host.join(rest) })
    })
}

/// The canary matrix's columns without namespaces (and so its Landlock column) see the host's
/// root, where nothing is bound at the paths the role's view gives its scratch, model dir,
/// credential and binds. A rule naming such a path (or one beneath it) is resolved where the
/// host shows the same files, the bind's source, as the role's uid would reach it in `run`:
/// Landlock alone grants exactly what it grants in the real sandbox, on the same files, and
/// refuses nothing because a grant pointed at an empty host path. Never the host's own file at
/// the inside path: a bind's `dst` (an interpreter's original prefix under root's 0700 home) can
/// name something else on the host, or something the role's uid cannot search, which the real
/// view never shows (docs/canary.md, "Layer matrix").
fn matrix_landlock(cfg: &Config, role: Role, mut res: landlock::Resolved) -> Result<landlock::Resolved> {
    let placed = placed(cfg, role);
    for (path, _, _) in &mut res.fs {
        if let Some(host) = host_of(&placed, Path::new(OsStr::from_bytes(path.to_bytes()))) {
            *path = cstr(host)?;
        }
    }
    Ok(res)
}

/// Where the child tries to exec `prog0`: itself when it names a path, else each absolute
/// directory of the role's PATH (default `/usr/bin:/bin`) in order; relative entries are skipped.
fn exec_candidates(prog0: &str, env: &[(String, String)]) -> Result<Vec<CString>> {
    if prog0.contains('/') {
        return Ok(vec![cstr(prog0)?]);
    }
    let path = env.iter().find(|(k, _)| k == "PATH").map(|(_, v)| v.as_str()).unwrap_or("/usr/bin:/bin");
    path.split(':').filter(|d| d.starts_with('/')).map(|d| cstr(format!("{d}/{prog0}"))).collect()
}

/// What the child executes, and with what arguments and environment.
struct Exec {
    program: Program,
    /// Where the child tries to exec, in order (a PATH search, or one path).
    paths: Vec<CString>,
    argv: Vec<CString>,
    envp: Vec<CString>,
}

impl Exec {
    /// The role's own command (no `argv`, no `program`) runs its program from a sealed copy:
    /// `command[0]` is resolved through `mounts` as the sandbox will resolve it, a memfd is
    /// made for the copy, and the copy is mounted over the resolved path (the last step of
    /// `mounts`), which is what the child executes. Anything else (`exec`'s command, a probe)
    /// runs as given.
    fn resolve(
        cfg: &Config,
        role: Role,
        argv: Option<Vec<String>>,
        program: Option<Program>,
        mounts: &mut Vec<Mount>,
    ) -> Result<Exec> {
        let r = cfg.role(role);
        let own = argv.is_none() && program.is_none();
        let argv = argv.unwrap_or_else(|| r.command.clone());
        let Some(prog0) = argv.first() else {
            return Err(Error::config(&cfg.file, format!("{role}.command"), "empty command"));
        };
        let launcher_env: Vec<(String, String)> =
            std::env::vars_os().filter_map(|(k, v)| Some((k.into_string().ok()?, v.into_string().ok()?))).collect();
        let env = build_env(cfg, role, &launcher_env);
        let program = match program {
            Some(p) => p,
            None if own => Program::Sealed(sealed_program(cfg, role, prog0, mounts)?),
            None => Program::Path(cstr(prog0)?),
        };
        let paths = match &program {
            Program::SealedSelf(fd) => {
                use std::os::fd::AsRawFd;
                vec![cstr(format!("/proc/self/fd/{}", fd.as_raw_fd()))?]
            }
            Program::Sealed(p) => vec![cstr(&p.inside)?],
            Program::Path(_) => exec_candidates(prog0, &env)?,
        };
        let envp: Vec<CString> = env.iter().map(|(k, v)| cstr(format!("{k}={v}"))).collect::<Result<_>>()?;
        let envp = match program {
            Program::SealedSelf(_) => without_loader_vars(&envp),
            _ => envp,
        };
        Ok(Exec { program, paths, argv: argv.iter().map(cstr).collect::<Result<_>>()?, envp })
    }
}

/// The role's program found in its view (`mounts`), a memfd made for its sealed copy, and the
/// copy's mount added as the table's last step.
fn sealed_program(cfg: &Config, role: Role, prog0: &str, mounts: &mut Vec<Mount>) -> Result<SealedProgram> {
    use std::os::fd::AsRawFd;
    let field = format!("{role}.command[0]");
    let found = super::view::resolve(mounts, Path::new(prog0)).map_err(|e| Error::config(&cfg.file, &field, e))?;
    if found.mode & libc::S_IFMT != libc::S_IFREG {
        return Err(Error::config(
            &cfg.file,
            &field,
            format!(
                "{prog0} resolves to {} (host {}), which is {}, not a regular file",
                found.inside.display(),
                found.host.display(),
                crate::os::sys::file_kind(found.mode)
            ),
        ));
    }
    if found.attrs & NOEXEC != 0 {
        return Err(Error::config(
            &cfg.file,
            &field,
            format!(
                "{prog0} resolves to {} (host {}), which the role's view mounts noexec (the model dir, scratch, a \
                 credential or an extra bind with exec = false): bind the program's directory with exec = true",
                found.inside.display(),
                found.host.display()
            ),
        ));
    }
    let fd = crate::sandbox::sealed::memfd(&format!("sealnode-{role}"))?;
    // Mode 0 until measured (Plan::measured): an unmeasured copy cannot be executed.
    mounts.push(Mount::SealedProgram { dst: under_root(&found.inside)?, fd: fd.as_raw_fd(), mode: 0 });
    Ok(SealedProgram {
        fd,
        field,
        pin: cfg.role(role).sha256.clone(),
        inside: found.inside,
        host: found.host,
        sha256: None,
    })
}

/// A sealed, read-only in-memory copy of the running sealnode binary, for probes: nothing in
/// the sandbox can modify it, and it needs no path inside the sandbox. Made once per process
/// (the running binary cannot change under it; a debug build is ~100 MB, and every gate runs a
/// probe per role) and handed out as a new descriptor of that one copy.
pub fn sealed_self() -> Result<std::os::fd::OwnedFd> {
    static COPY: std::sync::OnceLock<std::os::fd::OwnedFd> = std::sync::OnceLock::new();
    let copy = match COPY.get() {
        Some(c) => c,
        None => {
            let fd = crate::sandbox::sealed::memfd("sealnode-probe")?;
            let mut src = std::fs::File::open("/proc/self/exe").map_err(|e| Error::io("open /proc/self/exe", e))?;
            let mut dst = std::fs::File::from(fd);
            std::io::copy(&mut src, &mut dst).map_err(|e| Error::io("copy sealnode into memfd", e))?;
            let fd: std::os::fd::OwnedFd = dst.into();
            crate::sandbox::sealed::seal(&fd)?;
            COPY.get_or_init(|| fd)
        }
    };
    copy.try_clone().map_err(|e| Error::io("dup the sealed copy of sealnode", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn role(extra: &str) -> RoleConfig {
        toml::from_str(&format!(
            "command = [\"/usr/bin/true\"]\nseccomp = \"/p/s.json\"\nlandlock = \"/p/l.toml\"\nscratch = \"/srv/s\"\n{extra}"
        ))
        .expect("role config")
    }

    fn described(m: &[Mount]) -> Vec<String> {
        m.iter().map(Mount::describe).collect()
    }

    #[test]
    fn dev_holds_exactly_the_base_and_declared_devices_then_is_frozen_before_tmp() {
        let m = dev_and_tmp(&role("tmp_size_mb = 32"), &[Path::new("/dev/nvidia0")]).expect("dev");
        let d = described(&m);
        assert_eq!(d.first().map(String::as_str), Some("tmpfs on /dev"));
        assert_eq!(
            Mount::Tmpfs { dst: cstr(NEWROOT).expect("c"), opts: cstr("").expect("c"), attrs: 0 }.describe(),
            "tmpfs on /"
        );
        let binds: Vec<&Mount> = m.iter().filter(|x| matches!(x, Mount::Bind { .. })).collect();
        let want: Vec<String> =
            BASE_DEVICES.iter().copied().chain(["/dev/nvidia0"]).map(|p| format!("bind {p} -> {p}")).collect();
        assert_eq!(binds.iter().map(|b| b.describe()).collect::<Vec<_>>(), want);
        for b in &binds {
            let Mount::Bind { attrs, nofollow, check, .. } = b else { unreachable!() };
            // Device nodes work (no NODEV) but nothing there is setuid or executable, and a
            // device path is never followed through a symlink.
            assert_eq!(*attrs, NOSUID | NOEXEC);
            assert!(*nofollow);
            assert_eq!(*check, Check::None);
        }
        let freeze = d.iter().position(|x| x == "freeze /dev").expect("freeze");
        let last_dev =
            d.iter().rposition(|x| x.contains(" /dev/") || x.ends_with("-> /dev/nvidia0")).expect("dev entries");
        assert!(freeze > last_dev, "/dev is frozen after everything in it: {d:?}");
        assert_eq!(d.last().map(String::as_str), Some("tmpfs on /tmp"));
        let mut sized = 0;
        for m in &m {
            if let Mount::Tmpfs { dst, opts, attrs } = m {
                if dst.to_bytes().ends_with(b"/dev/shm") || dst.to_bytes() == b"/tmp/tmp" {
                    assert_eq!(opts.to_str(), Ok("size=32m,nr_inodes=65536,mode=1777"));
                    assert_eq!(*attrs, NOSUID | NODEV | NOEXEC);
                    sized += 1;
                }
            }
        }
        assert_eq!(sized, 2, "/dev/shm and /tmp are sized by tmp_size_mb");
    }

    #[test]
    fn proc_is_fresh_masked_read_only_and_sets_the_seal_sysctls() {
        let m = proc_mounts().expect("proc");
        let d = described(&m);
        assert_eq!(d[0], "proc on /proc");
        for p in PROC_MASK_FILES.iter().chain(PROC_MASK_DIRS) {
            assert!(d.contains(&format!("mask {p}")), "{p} masked: {d:?}");
        }
        for p in PROC_READONLY {
            let ro = d.iter().position(|x| *x == format!("read-only {p}")).expect("read-only");
            // The sysctls are written before /proc/sys turns read-only.
            if *p == "/proc/sys" {
                assert!(d.iter().filter(|x| x.starts_with("sysctl ")).count() == 3);
                assert!(d.iter().rposition(|x| x.starts_with("sysctl ")).expect("sysctl") < ro);
            }
        }
        let sysctls: Vec<(String, &[u8], bool)> = m
            .iter()
            .filter_map(|x| match x {
                Mount::Sysctl { value, optional, .. } => Some((x.describe(), *value, *optional)),
                _ => None,
            })
            .collect();
        assert_eq!(
            sysctls,
            vec![
                ("sysctl /proc/sys/user/max_user_namespaces".to_string(), &b"0\n"[..], false),
                ("sysctl /proc/sys/net/ipv4/tcp_fastopen".to_string(), &b"0\n"[..], false),
                ("sysctl /proc/sys/net/mptcp/enabled".to_string(), &b"0\n"[..], true),
            ]
        );
    }

    #[test]
    fn the_matrix_root_is_the_host_read_only_with_throwaway_targets() {
        let dir = tempfile::tempdir().expect("tmp");
        let scratch = dir.path().join("scratch");
        std::fs::create_dir(&scratch).expect("mkdir");
        let r = role("").clone();
        let r = RoleConfig { scratch: scratch.clone(), models: Some(dir.path().join("absent")), ..r };
        let m = matrix_mounts(&r).expect("matrix");
        let Mount::Bind { src, attrs, .. } = &m[0] else { panic!("first is the host root: {:?}", described(&m)) };
        assert_eq!(src.to_str(), Ok("/"));
        assert_eq!(*attrs, RDONLY | NOSUID | NODEV);
        // The scratch dir exists: a writable tmpfs covers it; an absent model dir gets nothing.
        let tmpfs: Vec<String> = m
            .iter()
            .filter_map(|x| match x {
                Mount::Tmpfs { opts, .. } => Some(format!("{} {}", x.describe(), opts.to_string_lossy())),
                _ => None,
            })
            .collect();
        assert!(tmpfs.contains(&format!("tmpfs on {} size=16m,mode=1777", scratch.display())), "{tmpfs:?}");
        assert!(!tmpfs.iter().any(|t| t.contains("absent")), "{tmpfs:?}");
    }

    #[test]
    fn the_matrix_resolves_a_rule_for_a_bind_where_the_host_holds_its_files() {
        let placed: Vec<(PathBuf, PathBuf)> = [
            ("/models", "/srv/models"),
            ("/scratch", "/srv/engine"),
            // An interpreter bound at its original prefix under root's 0700 home (pyenv's).
            ("/root/.pyenv/versions/3.12.1", "/var/tmp/python"),
            // A later bind beneath an earlier one shows over it.
            ("/root/.pyenv/versions/3.12.1/lib/extra", "/srv/extra"),
            ("/opt/llama", "/opt/llama"),
        ]
        .iter()
        .map(|(a, b)| (PathBuf::from(a), PathBuf::from(b)))
        .collect();
        let host = |p: &str| host_of(&placed, Path::new(p)).map(|h| h.display().to_string());
        assert_eq!(host("/root/.pyenv/versions/3.12.1").as_deref(), Some("/var/tmp/python"));
        assert_eq!(host("/root/.pyenv/versions/3.12.1/bin/python3").as_deref(), Some("/var/tmp/python/bin/python3"));
        assert_eq!(host("/root/.pyenv/versions/3.12.1/lib/extra/x").as_deref(), Some("/srv/extra/x"));
        assert_eq!(host("/scratch").as_deref(), Some("/srv/engine"));
        assert_eq!(host("/models/m.gguf").as_deref(), Some("/srv/models/m.gguf"));
        assert_eq!(host("/opt/llama/llama-server").as_deref(), Some("/opt/llama/llama-server"));
        // Component by component; system paths are the host's own in both views.
        for own in ["/root", "/root/.pyenv", "/models2", "/opt/llama.cpp", "/usr", "/etc", "/tmp", "/dev/null"] {
            assert_eq!(host(own), None, "{own}");
        }
    }

    #[test]
    fn a_bare_name_is_searched_in_the_roles_path_only() {
        let env = |p: &str| vec![("PATH".to_string(), p.to_string())];
        let got = |prog: &str, e: &[(String, String)]| -> Vec<String> {
            exec_candidates(prog, e).expect("paths").iter().map(|c| c.to_string_lossy().into_owned()).collect()
        };
        assert_eq!(got("/opt/x/server", &env("/usr/bin")), vec!["/opt/x/server"]);
        assert_eq!(got("python3", &env("/venv/bin:relative:/usr/bin")), vec!["/venv/bin/python3", "/usr/bin/python3"]);
        assert_eq!(got("true", &[]), vec!["/usr/bin/true", "/bin/true"]);
        assert!(exec_candidates("a\0b", &[]).is_err());
    }

    #[test]
    fn a_destination_through_sealnodes_own_link_is_named_by_its_target() {
        let c = |p: &str| CString::new(p).expect("c");
        let bind = |dst: &str| Mount::Bind {
            src: c("/x"),
            dst: c(dst),
            dir: false,
            attrs: 0,
            check: Check::None,
            nofollow: true,
        };
        let mut m = vec![
            Mount::Symlink { target: c("usr/lib"), dst: c("/tmp/lib") },
            Mount::Symlink { target: c("/usr/bin"), dst: c("/tmp/bin") },
            Mount::Symlink { target: c("../etc"), dst: c("/tmp/up") },
            bind("/tmp/lib/x86_64-linux-gnu/libcuda.so.1"),
            bind("/tmp/bin/tool"),
            bind("/tmp/lib"),
            bind("/tmp/up/x"),
            bind("/tmp/library/y"),
            Mount::File { dst: c("/tmp/lib/f"), contents: vec![] },
        ];
        through_own_links(&mut m).expect("links");
        let dsts: Vec<String> = m[3..]
            .iter()
            .map(|x| match x {
                Mount::Bind { dst, .. } | Mount::File { dst, .. } => dst.to_string_lossy().into_owned(),
                _ => unreachable!(),
            })
            .collect();
        assert_eq!(
            dsts,
            [
                "/tmp/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "/tmp/usr/bin/tool",
                // The link itself (as `check` names it, found by review), a link that climbs,
                // and a name that only starts the same.
                "/tmp/usr/lib",
                "/tmp/up/x",
                "/tmp/library/y",
                "/tmp/usr/lib/f",
            ]
        );
    }
}
