//! Landlock policy: TOML rules files under `landlock-rules/`.
//!
//! A rules file names paths *inside* the sandbox, the access each gets, TCP ports the role
//! may bind or connect to, the scopes to enforce and the minimum ABI it needs. Tokens
//! (`@scratch`, `@models`, `@credential`, `@ro_binds`, `@devices`, `@engine_port`) are expanded
//! from the config, so one policy fits every operator's layout.

use std::ffi::CString;
use std::path::Path;

use landlock::{
    Access, AccessFs, AccessNet, BitFlags, CompatLevel, Compatible, NetPort, PathBeneath, PathFd, Ruleset, RulesetAttr,
    RulesetCreatedAttr, RulesetStatus, Scope, ABI,
};
use serde::Deserialize;

use crate::config::{Config, Role};
use crate::error::{Error, Result};
use crate::layout::{INSIDE_CREDENTIAL, INSIDE_MODELS, INSIDE_SCRATCH};

/// Newest ABI whose rights sealnode knows how to use.
pub const KNOWN_ABI: u8 = 7;

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Rules {
    /// The role the rules are written for: a file named by the other role's `landlock` is
    /// refused ([`Rules::check_role`]), since policies of both roles sit side by side (a
    /// ConfigMap, /etc/sealnode/landlock) and a swapped pair fails only later, and obscurely
    /// (the engine cannot bind its port, the node cannot connect). Optional: without it the
    /// file fits either role.
    #[serde(default)]
    pub role: Option<Role>,
    /// Refuse to start on kernels with a lower Landlock ABI.
    pub min_abi: u8,
    #[serde(default)]
    pub fs: Vec<FsRule>,
    #[serde(default)]
    pub net: NetRules,
    #[serde(default)]
    pub scope: Scopes,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FsRule {
    pub paths: Vec<String>,
    pub access: Vec<String>,
    /// Skip paths that do not exist in the sandbox (e.g. /lib64 on aarch64).
    #[serde(default)]
    pub optional: bool,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NetRules {
    #[serde(default)]
    pub bind: Vec<Port>,
    #[serde(default)]
    pub connect: Vec<Port>,
    /// Leave TCP bind unrestricted by Landlock (programs that listen on random ports, e.g.
    /// Ollama's runners). Weaker: say why in the policy file.
    #[serde(default)]
    pub bind_any: bool,
    /// Leave TCP connect unrestricted by Landlock. Weaker: say why in the policy file.
    #[serde(default)]
    pub connect_any: bool,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum Port {
    Number(u16),
    Token(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scopes {
    #[serde(default = "yes")]
    pub abstract_unix_socket: bool,
    #[serde(default = "yes")]
    pub signal: bool,
}

fn yes() -> bool {
    true
}

impl Default for Scopes {
    fn default() -> Self {
        Scopes { abstract_unix_socket: true, signal: true }
    }
}

/// Access names a rule may use: the groups, then single rights. (name, rights, minimum ABI)
fn access_by_name(name: &str) -> Option<(BitFlags<AccessFs>, u8)> {
    use AccessFs::*;
    Some(match name {
        "read" => (ReadFile | ReadDir, 1),
        "exec" => (Execute.into(), 1),
        "write" => (
            WriteFile | RemoveDir | RemoveFile | MakeDir | MakeReg | MakeSock | MakeFifo | MakeSym | Refer | Truncate,
            3,
        ),
        "read_file" => (ReadFile.into(), 1),
        "read_dir" => (ReadDir.into(), 1),
        "execute" => (Execute.into(), 1),
        "write_file" => (WriteFile.into(), 1),
        "remove_file" => (RemoveFile.into(), 1),
        "remove_dir" => (RemoveDir.into(), 1),
        "make_reg" => (MakeReg.into(), 1),
        "make_dir" => (MakeDir.into(), 1),
        "make_sym" => (MakeSym.into(), 1),
        "make_sock" => (MakeSock.into(), 1),
        "make_fifo" => (MakeFifo.into(), 1),
        "make_char" => (MakeChar.into(), 1),
        "make_block" => (MakeBlock.into(), 1),
        "refer" => (Refer.into(), 2),
        "truncate" => (Truncate.into(), 3),
        "ioctl_dev" => (IoctlDev.into(), 5),
        _ => return None,
    })
}

fn abi_of(v: u8) -> ABI {
    ABI::from(i32::from(v))
}

impl Rules {
    pub fn parse(text: &str, file: &Path) -> Result<Rules> {
        let rules: Rules = toml::from_str(text).map_err(|e| Error::policy(file, e.message().trim().to_string()))?;
        if rules.min_abi == 0 || rules.min_abi > KNOWN_ABI {
            return Err(Error::policy(file, format!("min_abi {} is outside 1-{KNOWN_ABI}", rules.min_abi)));
        }
        for (i, r) in rules.fs.iter().enumerate() {
            if r.paths.is_empty() || r.access.is_empty() {
                return Err(Error::policy(file, format!("fs[{i}]: needs paths and access")));
            }
            for a in &r.access {
                let Some((_, need)) = access_by_name(a) else {
                    return Err(Error::policy(file, format!("fs[{i}]: unknown access {a:?}")));
                };
                if need > rules.min_abi {
                    return Err(Error::policy(
                        file,
                        format!("fs[{i}]: access {a:?} needs Landlock ABI {need} but min_abi is {}", rules.min_abi),
                    ));
                }
            }
            for p in &r.paths {
                if !(p.starts_with('/') || TOKENS.contains(&p.as_str())) {
                    return Err(Error::policy(
                        file,
                        format!("fs[{i}]: {p:?} is neither an absolute path nor one of {TOKENS:?}"),
                    ));
                }
            }
        }
        let net_used = !rules.net.bind.is_empty() || !rules.net.connect.is_empty();
        if rules.min_abi < 4 {
            return Err(Error::policy(
                file,
                "min_abi must be at least 4: sealnode restricts TCP bind/connect ports (ABI 4)",
            ));
        }
        if (rules.scope.signal || rules.scope.abstract_unix_socket) && rules.min_abi < 6 {
            return Err(Error::policy(file, "scopes need Landlock ABI 6; raise min_abi or turn the scopes off"));
        }
        for p in rules.net.bind.iter().chain(&rules.net.connect) {
            match p {
                Port::Number(0) => return Err(Error::policy(file, "port 0 is not a port")),
                Port::Token(t) if t != "@engine_port" && t != "@egress_ports" => {
                    return Err(Error::policy(
                        file,
                        format!("unknown port token {t:?} (known: \"@engine_port\", \"@egress_ports\")"),
                    ))
                }
                _ => {}
            }
        }
        let _ = net_used;
        if rules.net.bind_any && !rules.net.bind.is_empty() {
            return Err(Error::policy(
                file,
                "bind_any = true leaves bind unrestricted; drop the bind list or bind_any",
            ));
        }
        if rules.net.connect_any && !rules.net.connect.is_empty() {
            return Err(Error::policy(
                file,
                "connect_any = true leaves connect unrestricted; drop the connect list or connect_any",
            ));
        }
        Ok(rules)
    }

    /// The rules are `role`'s to apply, if they name their role ([`Rules::role`]).
    pub fn check_role(&self, role: Role, file: &Path) -> Result<()> {
        match self.role {
            Some(theirs) if theirs != role => Err(Error::policy(
                file,
                format!(
                    "role: the rules are written for the {theirs} role, and {role}.landlock names them: name the \
                     {role} role's own rules there (the shipped ones: landlock-rules/{role}*.toml)"
                ),
            )),
            _ => Ok(()),
        }
    }

    /// Parse rules from bytes sealnode already read (and checked).
    pub fn from_loaded(bytes: &[u8], file: &Path) -> Result<Rules> {
        let text = std::str::from_utf8(bytes).map_err(|e| Error::policy(file, format!("not UTF-8: {e}")))?;
        Rules::parse(text, file)
    }

    pub fn load(file: &Path) -> Result<Rules> {
        let text = std::fs::read_to_string(file).map_err(|e| Error::policy(file, format!("cannot read: {e}")))?;
        Rules::parse(&text, file)
    }
}

const TOKENS: [&str; 6] = ["@scratch", "@models", "@credential", "@ro_binds", "@ro_binds_exec", "@devices"];

/// A rules file with tokens expanded for one role of one config; ready for the child.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub abi: u8,
    pub fs: Vec<(CString, BitFlags<AccessFs>, bool)>,
    pub bind: Vec<u16>,
    pub connect: Vec<u16>,
    /// TCP rights Landlock enforces (all of them unless the policy opted out).
    pub handled_net: BitFlags<AccessNet>,
    pub scopes: BitFlags<Scope>,
}

impl Rules {
    pub fn resolve(&self, cfg: &Config, role: Role) -> Resolved {
        let r = cfg.role(role);
        let (binds, devices) = (cfg.binds(role), cfg.devices(role));
        let expand = |p: &str| -> Vec<String> {
            match p {
                "@scratch" => vec![INSIDE_SCRATCH.into()],
                "@models" => r.models.iter().map(|_| INSIDE_MODELS.to_string()).collect(),
                "@credential" => r.credential.iter().map(|_| INSIDE_CREDENTIAL.to_string()).collect(),
                "@ro_binds" => binds.iter().map(|(_, b)| b.inside().display().to_string()).collect(),
                "@ro_binds_exec" => {
                    binds.iter().filter(|(_, b)| b.exec).map(|(_, b)| b.inside().display().to_string()).collect()
                }
                "@devices" => devices.iter().map(|d| d.display().to_string()).collect(),
                other => vec![other.to_string()],
            }
        };
        let mut fs = Vec::new();
        for rule in &self.fs {
            let access =
                rule.access.iter().filter_map(|a| access_by_name(a)).fold(BitFlags::EMPTY, |acc, (f, _)| acc | f);
            for p in &rule.paths {
                // Tokens that expand to nothing (no model dir) simply add no rule.
                let optional = rule.optional || p.starts_with('@');
                for path in expand(p) {
                    if let Ok(c) = CString::new(path) {
                        fs.push((c, access, optional));
                    }
                }
            }
        }
        let ports = |p: &Port| -> Vec<u16> {
            match p {
                Port::Number(n) => vec![*n],
                Port::Token(t) if t == "@egress_ports" => {
                    r.egress.iter().filter_map(|e| u16::try_from(e.port).ok()).collect()
                }
                Port::Token(_) => cfg.engine.port.and_then(|p| u16::try_from(p).ok()).into_iter().collect(),
            }
        };
        let mut scopes = BitFlags::EMPTY;
        if self.scope.abstract_unix_socket {
            scopes |= Scope::AbstractUnixSocket;
        }
        if self.scope.signal {
            scopes |= Scope::Signal;
        }
        Resolved {
            abi: self.min_abi,
            fs,
            bind: self.net.bind.iter().flat_map(ports).collect(),
            connect: self.net.connect.iter().flat_map(ports).collect(),
            handled_net: {
                let mut h = AccessNet::BindTcp | AccessNet::ConnectTcp;
                if self.net.bind_any {
                    h.remove(AccessNet::BindTcp);
                }
                if self.net.connect_any {
                    h.remove(AccessNet::ConnectTcp);
                }
                h
            },
            scopes,
        }
    }
}

/// Refuse, with the fix, when the running kernel's Landlock ABI is below `min_abi` (what the
/// rules file `file` needs). Checked before anything is created: the cell init confines
/// itself with the same ABI, and without this a 6.1 kernel got only "confine: cell: EPERM"
/// (found in the test guest, tests/vm).
pub fn require_kernel_abi(min_abi: u8, file: &Path) -> Result<()> {
    let kernel_abi = crate::os::sys::landlock_abi();
    if kernel_abi >= i32::from(min_abi) {
        return Ok(());
    }
    Err(Error::Unsupported {
        what: format!(
            "{}: needs Landlock ABI {} but this kernel offers {} ({})",
            file.display(),
            min_abi,
            kernel_abi,
            if kernel_abi == 0 { "Landlock disabled or absent" } else { "kernel too old" }
        ),
        fix: "boot a kernel >= 6.12 with CONFIG_SECURITY_LANDLOCK=y and \"landlock\" in the lsm= list (see `sealnode doctor`)".into(),
    })
}

/// Where a Landlock application failed (for the child's error record).
#[derive(Debug, Clone, Copy)]
pub enum ApplyError {
    Ruleset(i32),
    Path(usize, i32),
    Restrict(i32),
    NotEnforced,
}

impl ApplyError {
    /// The errno the kernel answered (EOPNOTSUPP: a ruleset the kernel would not enforce).
    pub fn errno(self) -> nix::errno::Errno {
        match self {
            ApplyError::Ruleset(e) | ApplyError::Path(_, e) | ApplyError::Restrict(e) => nix::errno::Errno::from_raw(e),
            ApplyError::NotEnforced => nix::errno::Errno::EOPNOTSUPP,
        }
    }
}

fn errno_of<E: std::error::Error + 'static>(e: &E) -> i32 {
    // The landlock crate wraps io::Error; walk the source chain for the OS error.
    let mut cur: Option<&dyn std::error::Error> = Some(e);
    while let Some(c) = cur {
        if let Some(io) = c.downcast_ref::<std::io::Error>() {
            return io.raw_os_error().unwrap_or(libc::EINVAL);
        }
        cur = c.source();
    }
    libc::EINVAL
}

/// Build the ruleset and restrict the calling thread. Runs in the child after pivot_root,
/// so paths are the sandbox's own.
pub fn apply(res: &Resolved) -> std::result::Result<(), ApplyError> {
    let abi = abi_of(res.abi);
    let handled_fs = AccessFs::from_all(abi);
    let mut ruleset = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(handled_fs)
        .map_err(|e| ApplyError::Ruleset(errno_of(&e)))?;
    if !res.handled_net.is_empty() {
        ruleset = ruleset.handle_access(res.handled_net).map_err(|e| ApplyError::Ruleset(errno_of(&e)))?;
    }
    if !res.scopes.is_empty() {
        ruleset = ruleset.scope(res.scopes).map_err(|e| ApplyError::Ruleset(errno_of(&e)))?;
    }
    let mut created = ruleset.create().map_err(|e| ApplyError::Ruleset(errno_of(&e)))?;
    for (i, (path, access, optional)) in res.fs.iter().enumerate() {
        let fd = match PathFd::new(path.as_c_str().to_str().unwrap_or("")) {
            Ok(fd) => fd,
            Err(e) => {
                let errno = errno_of(&e);
                if *optional && errno == libc::ENOENT {
                    continue;
                }
                return Err(ApplyError::Path(i, errno));
            }
        };
        // Directory-only rights are invalid on a file: keep the file rights for file rules.
        let is_dir = nix::sys::stat::fstat(&fd).map(|s| s.st_mode & libc::S_IFMT == libc::S_IFDIR).unwrap_or(false);
        let rights = if is_dir { *access } else { *access & AccessFs::from_file(abi) };
        created = created
            .add_rule(PathBeneath::new(fd, rights & handled_fs))
            .map_err(|e| ApplyError::Path(i, errno_of(&e)))?;
    }
    for p in &res.bind {
        created =
            created.add_rule(NetPort::new(*p, AccessNet::BindTcp)).map_err(|e| ApplyError::Ruleset(errno_of(&e)))?;
    }
    for p in &res.connect {
        created =
            created.add_rule(NetPort::new(*p, AccessNet::ConnectTcp)).map_err(|e| ApplyError::Ruleset(errno_of(&e)))?;
    }
    let status = created.restrict_self().map_err(|e| ApplyError::Restrict(errno_of(&e)))?;
    if status.ruleset != RulesetStatus::FullyEnforced {
        return Err(ApplyError::NotEnforced);
    }
    // The call's return is not proof: a filter above sealnode (a container runtime's seccomp
    // profile) can answer landlock_restrict_self with a faked success (found in review). With
    // the signal scope in force, even signal 0 to the parent, outside this domain, is refused;
    // whatever the scopes (found by the next review: a policy with the signal scope off was
    // never read back), an access the domain handles and no rule grants is refused too.
    if res.scopes.contains(Scope::Signal)
        && nix::sys::signal::kill(nix::unistd::getppid(), None) != Err(nix::errno::Errno::EPERM)
    {
        return Err(ApplyError::NotEnforced);
    }
    refused_somewhere(res)
}

/// Directories a role's view always has, tried in turn for one no rule grants listing.
const UNGRANTED_CANDIDATES: [&str; 6] = ["/", "/proc", "/dev", "/etc", "/usr", "/tmp"];

/// A directory of `res`'s view whose listing no rule grants (none beneath a rule that grants
/// READ_DIR), if there is one.
fn ungranted_dir(res: &Resolved) -> Option<&'static str> {
    let beneath = |dir: &str, rule: &str| {
        let rule = rule.trim_end_matches('/');
        rule.is_empty() || dir == rule || dir.strip_prefix(rule).is_some_and(|rest| rest.starts_with('/'))
    };
    UNGRANTED_CANDIDATES.into_iter().find(|dir| {
        !res.fs
            .iter()
            .any(|(path, access, _)| access.contains(AccessFs::ReadDir) && beneath(dir, &path.to_string_lossy()))
    })
}

/// Read the domain back: listing a directory no rule grants must be refused (EACCES), or,
/// where every candidate is granted, a TCP connect to a port no rule grants; a domain that
/// refuses neither is not in force (a faked landlock_restrict_self).
fn refused_somewhere(res: &Resolved) -> std::result::Result<(), ApplyError> {
    use nix::fcntl::{open, OFlag};
    if let Some(dir) = ungranted_dir(res) {
        return match open(dir, OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty()) {
            Err(nix::errno::Errno::EACCES) => Ok(()),
            _ => Err(ApplyError::NotEnforced),
        };
    }
    let port = (1..=u16::MAX).find(|p| !res.connect.contains(p));
    match port {
        Some(port) if res.handled_net.contains(AccessNet::ConnectTcp) => {
            use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, SockaddrIn};
            let s = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
                .map_err(|e| ApplyError::Restrict(e as i32))?;
            match connect(std::os::fd::AsRawFd::as_raw_fd(&s), &SockaddrIn::new(127, 0, 0, 1, port)) {
                Err(nix::errno::Errno::EACCES) => Ok(()),
                _ => Err(ApplyError::NotEnforced),
            }
        }
        // Nothing this domain handles is left ungranted to try: only the signal scope (above)
        // can say it is in force; without it, refuse rather than trust the call's return.
        _ if res.scopes.contains(Scope::Signal) => Ok(()),
        _ => Err(ApplyError::NotEnforced),
    }
}

/// Deny-all ruleset for sealnode's own in-sandbox init: it needs no files and no network.
/// No signal scope: the workload's domain is not nested in init's, and init must still be
/// able to forward signals to it.
pub fn deny_all(abi: u8) -> std::result::Result<(), ApplyError> {
    let abi = abi_of(abi);
    let scopes = if abi >= ABI::V6 { BitFlags::from(Scope::AbstractUnixSocket) } else { BitFlags::EMPTY };
    let mut rs = Ruleset::default()
        .set_compatibility(CompatLevel::HardRequirement)
        .handle_access(AccessFs::from_all(abi))
        .and_then(|r| r.handle_access(AccessNet::from_all(abi)))
        .map_err(|e| ApplyError::Ruleset(errno_of(&e)))?;
    if !scopes.is_empty() {
        rs = rs.scope(scopes).map_err(|e| ApplyError::Ruleset(errno_of(&e)))?;
    }
    rs.create().and_then(|r| r.restrict_self()).map_err(|e| ApplyError::Restrict(errno_of(&e)))?;
    // Read back (found by review: a faked restrict_self left the init unconfined): with every
    // file access handled and no rule, even listing / is refused.
    match nix::fcntl::open(
        "/",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    ) {
        Err(nix::errno::Errno::EACCES) => Ok(()),
        _ => Err(ApplyError::NotEnforced),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The read-back's directory is one no rule lets the role list: `/` unless a rule grants it
    /// (then everything is beneath it and only a TCP connect is left to try).
    #[test]
    fn the_read_back_lists_a_directory_no_rule_grants() {
        let rule = |p: &str, a: BitFlags<AccessFs>| (CString::new(p).expect("path"), a, false);
        let mut res = Resolved {
            abi: 6,
            fs: vec![rule("/usr", AccessFs::from_all(abi_of(6))), rule("/etc/hosts", AccessFs::ReadFile.into())],
            bind: vec![],
            connect: vec![],
            handled_net: BitFlags::EMPTY,
            scopes: BitFlags::EMPTY,
        };
        assert_eq!(ungranted_dir(&res), Some("/"));
        res.fs.push(rule("/", AccessFs::ReadFile.into()));
        assert_eq!(ungranted_dir(&res), Some("/"), "a rule for / without listing leaves it ungranted");
        res.fs.push(rule("/", AccessFs::ReadDir.into()));
        assert_eq!(ungranted_dir(&res), None);
        res.fs.pop();
        res.fs.push(rule("/proc/", AccessFs::ReadDir.into()));
        res.fs[0] = rule("/tmp", AccessFs::ReadDir.into());
        assert_eq!(ungranted_dir(&res), Some("/"));
    }

    #[test]
    fn shipped_rules_parse() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("landlock-rules");
        for f in ["engine.toml", "engine-gpu.toml", "node.toml", "engine-ollama.toml"] {
            let r = Rules::load(&root.join(f)).unwrap_or_else(|e| panic!("{e}"));
            assert!(r.min_abi >= 6, "{f}: scopes need ABI 6");
            assert!(r.scope.signal && r.scope.abstract_unix_socket, "{f}");
            // Each names its role: named by the other role's `landlock`, it is refused.
            let (own, other) =
                if f.starts_with("node") { (Role::Node, Role::Engine) } else { (Role::Engine, Role::Node) };
            assert_eq!(r.role, Some(own), "{f}");
            r.check_role(own, Path::new(f)).expect("its own role");
            let e = r.check_role(other, Path::new(f)).expect_err("the other role").to_string();
            assert!(e.contains(f) && e.contains(&format!("written for the {own} role")), "{e}");
        }
        // A file that names no role fits either; an unknown role is refused by name.
        let text = "min_abi = 6\n";
        let any = Rules::parse(text, Path::new("any.toml")).expect("no role");
        assert!(
            any.check_role(Role::Engine, Path::new("x")).is_ok() && any.check_role(Role::Node, Path::new("x")).is_ok()
        );
        let e = Rules::parse("role = \"gateway\"\nmin_abi = 6\n", Path::new("g.toml")).expect_err("unknown role");
        assert!(e.to_string().contains("g.toml") && e.to_string().contains("gateway"), "{e}");
        let engine = Rules::load(&root.join("engine.toml")).expect("engine");
        assert!(engine.net.connect.is_empty() && !engine.net.connect_any, "the engine connects nowhere");
        let node = Rules::load(&root.join("node.toml")).expect("node");
        assert!(node.net.bind.is_empty() && !node.net.bind_any && !node.net.connect_any, "the node listens nowhere");
    }

    /// The GPU rules are the CPU engine's, every rule unchanged, plus rules that each say
    /// (with "GPU:") who needs them: refitting engine.toml must carry over.
    #[test]
    fn gpu_engine_rules_are_the_cpu_engine_rules_plus_marked_gpu_rules() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("landlock-rules");
        let cpu = Rules::load(&root.join("engine.toml")).expect("engine");
        let gpu = Rules::load(&root.join("engine-gpu.toml")).expect("engine-gpu");
        let key = |r: &FsRule| format!("{:?} {:?} {}", r.paths, r.access, r.optional);
        let gpu_rules: Vec<String> = gpu.fs.iter().map(key).collect();
        for r in &cpu.fs {
            assert!(gpu_rules.contains(&key(r)), "engine-gpu.toml lacks the CPU rule {}", key(r));
        }
        assert_eq!(format!("{:?}", cpu.net), format!("{:?}", gpu.net));
        assert_eq!(format!("{:?}", cpu.scope), format!("{:?}", gpu.scope));
        assert_eq!(cpu.min_abi, gpu.min_abi);
        // Each extra rule's block in the file carries a "# GPU:" comment.
        let text = std::fs::read_to_string(root.join("engine-gpu.toml")).expect("read");
        let cpu_rules: Vec<String> = cpu.fs.iter().map(key).collect();
        let extra: Vec<&FsRule> = gpu.fs.iter().filter(|r| !cpu_rules.contains(&key(r))).collect();
        assert!(!extra.is_empty());
        let blocks: Vec<&str> = text.split("[[fs]]").skip(1).collect();
        for r in extra {
            let line = format!("paths = {}", serde_json::to_string(&r.paths).expect("json").replace("\",\"", "\", \""));
            let block = blocks.iter().find(|b| b.contains(&line)).unwrap_or_else(|| panic!("no block with {line}"));
            assert!(block.contains("# GPU:"), "the GPU rule {line} says nothing of who needs it");
        }
    }

    #[test]
    fn bad_rules_are_refused() {
        let f = Path::new("rules.toml");
        for (text, why) in [
            ("min_abi = 9", "outside"),
            ("min_abi = 6\n[[fs]]\npaths = [\"/x\"]\naccess = [\"fly\"]", "unknown access"),
            ("min_abi = 6\n[[fs]]\npaths = [\"x\"]\naccess = [\"read\"]", "neither an absolute path"),
            ("min_abi = 4\n[[fs]]\npaths = [\"/x\"]\naccess = [\"ioctl_dev\"]", "needs Landlock ABI 5"),
            ("min_abi = 6\n[net]\nbind = [\"@other\"]", "unknown port token"),
            ("min_abi = 6\nextra = 1", "unknown field"),
            ("min_abi = 5", "scopes need"),
            ("min_abi = 6\n[net]\nbind = [80]\nbind_any = true", "bind_any"),
        ] {
            let e = Rules::parse(text, f).expect_err(text).to_string();
            assert!(e.contains(why), "{text}: {e}");
        }
    }

    #[test]
    fn shipped_node_rules_resolve_to_exactly_the_roles_own_paths_and_ports() {
        let cfg = Config::parse(
            r#"
schema = 1
[cell]
state_dir = "/var/lib/sealnode"
runtime_dir = "/run/sealnode"
[engine]
command = ["/usr/bin/llama-server"]
port = 8080
seccomp = "/p/engine.json"
landlock = "/p/engine.toml"
models = "/srv/models"
scratch = "/var/lib/sealnode/engine"
[node]
command = ["/opt/venv/bin/python"]
seccomp = "/p/node.json"
landlock = "/p/node.toml"
scratch = "/var/lib/sealnode/node"
credential = "/etc/sealnode/credential"
ro_binds = [{ src = "/opt/venv" }, { src = "/opt/data", dst = "/data", exec = false }]
egress = [{ host = "gw.example", port = 443 }, { host = "logs.example", port = 8443 }]
"#,
            Path::new("/etc/sealnode/t.toml"),
        )
        .expect("config");
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("landlock-rules");
        let node = Rules::load(&root.join("node.toml")).expect("node").resolve(&cfg, Role::Node);
        // The node connects to the engine's port and its egress ports, binds nothing.
        assert_eq!(node.connect, vec![8080, 443, 8443]);
        assert!(node.bind.is_empty());
        assert_eq!(node.handled_net, AccessNet::BindTcp | AccessNet::ConnectTcp);
        let paths = |want: &str| -> Vec<String> {
            node.fs
                .iter()
                .filter(|(p, _, _)| p.to_str() == Ok(want))
                .map(|(_, a, o)| format!("{a:?} optional={o}"))
                .collect()
        };
        // Tokens expand to the paths inside the sandbox; a bind gets execute rights unless it
        // says exec = false.
        assert_eq!(paths(INSIDE_CREDENTIAL).len(), 1);
        assert_eq!(paths("/opt/venv").len(), 2, "read and exec: {:?}", paths("/opt/venv"));
        assert_eq!(paths("/data").len(), 1, "read only: {:?}", paths("/data"));
        assert!(paths(INSIDE_MODELS).is_empty(), "the node has no model dir");
        assert!(node.fs.iter().all(|(p, _, _)| !p.to_bytes().starts_with(b"@")), "every token expanded");
        // The engine's rules: its own port only to bind, nothing to connect to.
        let engine = Rules::load(&root.join("engine.toml")).expect("engine").resolve(&cfg, Role::Engine);
        assert_eq!(engine.bind, vec![8080]);
        assert!(engine.connect.is_empty());
        assert!(!engine.fs.iter().any(|(p, _, _)| p.to_str() == Ok(INSIDE_CREDENTIAL)));
        assert!(engine.fs.iter().any(|(p, _, _)| p.to_str() == Ok(INSIDE_MODELS)));
    }
}
