//! `sealnode init`: a complete config from a few answers (the engine program, the model, the
//! node's venv, the gateway), and the dirs it needs. Generation is pure ([`config_text`],
//! [`layout`]); the few host facts it rests on (where a venv's interpreter lives, an ELF's
//! RUNPATH, whether a role can search a path) are read by the small functions at the end, and
//! `cli::init` applies the result (users, dirs, files) and runs `check`.

use std::path::{Component, Path, PathBuf};

use crate::layout::{INSIDE_CREDENTIAL, INSIDE_MODELS, SYSTEM_RO};

/// Which engine API the config is written for: it decides the policies, the command, the
/// port's flag and the node's variables.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum EngineKind {
    /// llama.cpp's llama-server: `-m /models/FILE --host 127.0.0.1 --port PORT`.
    LlamaServer,
    /// Ollama: `serve` with `OLLAMA_HOST=127.0.0.1:PORT`, the model store at /models.
    Ollama,
}

impl EngineKind {
    /// The kind a program's file name says (`llama-server`, `ollama`), if it says one.
    pub fn from_program(program: &Path) -> Option<EngineKind> {
        let name = program.file_name()?.to_string_lossy().to_ascii_lowercase();
        if name.contains("llama-server") || name.contains("llama_server") {
            Some(EngineKind::LlamaServer)
        } else if name.contains("ollama") {
            Some(EngineKind::Ollama)
        } else {
            None
        }
    }
    pub fn default_port(self) -> u16 {
        match self {
            EngineKind::LlamaServer => 8080,
            EngineKind::Ollama => 11434,
        }
    }
    /// The basename of the shipped seccomp and Landlock files for this engine.
    pub fn policy(self) -> &'static str {
        match self {
            EngineKind::LlamaServer => "engine",
            EngineKind::Ollama => "engine-ollama",
        }
    }
}

/// One `ro_binds` entry: `dst` only where the role must see `src` at another path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindSpec {
    pub src: PathBuf,
    pub dst: Option<PathBuf>,
}

impl BindSpec {
    pub fn at(src: impl Into<PathBuf>) -> BindSpec {
        BindSpec { src: src.into(), dst: None }
    }
    /// Where the role sees it.
    pub fn inside(&self) -> &Path {
        self.dst.as_deref().unwrap_or(&self.src)
    }
}

/// A venv and the interpreter its `bin/python` links to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Interpreter {
    pub venv: PathBuf,
    /// The interpreter's prefix (`sys.base_prefix`): where the venv's symlink points and what
    /// the interpreter's RUNPATH may name.
    pub prefix: PathBuf,
    /// A copy of the prefix to bind at `prefix`, when the roles cannot search the prefix
    /// itself (e.g. under root's 0700 home, as pyenv installs it).
    pub copy: Option<PathBuf>,
}

/// The node's gateway, and the egress entry that lets the node reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gateway {
    pub url: String,
    pub host: String,
    pub port: u16,
    /// A fixed upstream address instead of resolving `host` on the host (a local gateway).
    pub connect: Option<String>,
}

/// `ws://host:port/path` (also wss, http, https; default ports 80/443) into the egress
/// entry's host and port. The host must be a DNS name: inside the cell a name is what egress
/// maps (an address would bypass it), so a gateway known only by address needs a name in the
/// URL and the address as `connect`.
pub fn parse_gateway(url: &str, connect: Option<&str>) -> Result<Gateway, String> {
    let (scheme, rest) = url.split_once("://").ok_or_else(|| format!("{url}: not a URL (ws://HOST:PORT/PATH)"))?;
    let default_port = match scheme {
        "ws" | "http" => 80,
        "wss" | "https" => 443,
        other => return Err(format!("{url}: scheme {other:?}: expected ws, wss, http or https")),
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    if authority.contains('@') || authority.starts_with('[') {
        return Err(format!("{url}: give the gateway as HOST[:PORT] (no user, no IPv6 literal)"));
    }
    let (host, port) = match authority.rsplit_once(':') {
        Some((h, p)) => (h, p.parse::<u16>().map_err(|_| format!("{url}: port {p:?} is not 1-65535"))?),
        None => (authority, default_port),
    };
    if host.is_empty() || port == 0 {
        return Err(format!("{url}: no host or port"));
    }
    let host = host.to_ascii_lowercase();
    if host.parse::<std::net::IpAddr>().is_ok() || host == "localhost" {
        return Err(format!(
            "{url}: the gateway must be named by a DNS name (the node reaches it through declared egress, which maps names); \
             put a name in the URL (e.g. ws://gateway.local:{port}/...) and the address in --gateway-connect {host}:{port}"
        ));
    }
    if let Some(c) = connect {
        c.parse::<std::net::SocketAddr>().map_err(|_| format!("--gateway-connect {c}: expected IP:PORT"))?;
    }
    Ok(Gateway { url: url.to_string(), host, port, connect: connect.map(str::to_string) })
}

/// Everything the config is generated from.
#[derive(Debug, Clone)]
pub struct Answers {
    pub kind: EngineKind,
    /// The engine's whole argv (`[0]` its host path): given whole (`-- CMD ...`), or derived
    /// by [`engine_argv`].
    pub engine_command: Vec<String>,
    pub engine_port: u16,
    /// The engine's install (its dir, its RUNPATH dirs, or its venv and interpreter) and any
    /// extra binds.
    pub engine_binds: Vec<BindSpec>,
    /// The model dir mounted at /models (llama-server: the model file's own dir; Ollama: the store).
    pub models: PathBuf,
    /// The model name the node offers (`--models`).
    pub model_name: String,
    pub node_python: Interpreter,
    pub gateway: Gateway,
    pub node_id: String,
    pub memory_gb: u32,
    pub cpu_cores: u32,
    pub state_dir: PathBuf,
    pub runtime_dir: PathBuf,
    /// The installed credential file (the node reads it at /run/sealnode/credential).
    pub credential: Option<PathBuf>,
    /// Holds `seccomp/` and `landlock-rules/`.
    pub policy_dir: PathBuf,
    /// Rootful: the engine's and the node's host users. None: rootless.
    pub users: Option<(String, String)>,
}

/// llama-server's or Ollama's command for a model served on `port`: the port in the engine's
/// own flag or variable is the same as `engine.port` (the config's cross-check requires it).
pub fn engine_argv(
    kind: EngineKind,
    program: &Path,
    model_file: Option<&str>,
    port: u16,
    extra: &[String],
) -> Vec<String> {
    let mut v = vec![program.display().to_string()];
    match kind {
        EngineKind::LlamaServer => {
            let model = format!("{INSIDE_MODELS}/{}", model_file.unwrap_or("model.gguf"));
            v.extend(["-m".into(), model, "--host".into(), "127.0.0.1".into(), "--port".into(), port.to_string()]);
        }
        EngineKind::Ollama => v.push("serve".into()),
    }
    v.extend(extra.iter().cloned());
    v
}

/// The scratch dirs: the engine's and the node's, under the state dir (as the shipped layout).
pub fn scratch(a: &Answers) -> (PathBuf, PathBuf) {
    (a.state_dir.join("engine"), a.state_dir.join("node"))
}

/// Who a dir or file belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// sealnode itself: root (rootful) or the invoking user.
    Launcher,
    Engine,
    Node,
}

/// One dir to create (or fix): path, owner, mode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dir {
    pub path: PathBuf,
    pub owner: Owner,
    pub mode: u32,
}

/// The dirs the config names, with their owners and modes (systemd/sealnode.tmpfile's
/// layout): state 0755 and runtime 0755 sealnode's, each scratch 0700 its role's.
pub fn layout(a: &Answers) -> Vec<Dir> {
    let (e, n) = scratch(a);
    vec![
        Dir { path: a.state_dir.clone(), owner: Owner::Launcher, mode: 0o755 },
        Dir { path: a.runtime_dir.clone(), owner: Owner::Launcher, mode: 0o755 },
        Dir { path: e, owner: Owner::Engine, mode: 0o700 },
        Dir { path: n, owner: Owner::Node, mode: 0o700 },
    ]
}

/// The venv and its interpreter as binds: the venv where it is; the prefix where it is, or
/// its copy bound at the prefix (the venv's symlink and the interpreter's RUNPATH both name
/// the prefix, so the role must see it there). Nothing for a prefix in the system view (/usr).
pub fn python_binds(i: &Interpreter) -> Vec<BindSpec> {
    let mut v = Vec::new();
    if !in_system_view(&i.prefix) {
        v.push(match &i.copy {
            Some(c) if c != &i.prefix => BindSpec { src: c.clone(), dst: Some(i.prefix.clone()) },
            _ => BindSpec::at(&i.prefix),
        });
    }
    if !in_system_view(&i.venv) {
        v.push(BindSpec::at(&i.venv));
    }
    v
}

/// A native program's install: its own dir, and each RUNPATH dir (`$ORIGIN` is its dir) the
/// system view does not already show, at the same paths (so `$ORIGIN` and absolute entries
/// resolve as on the host). Nothing for a program in the system view.
pub fn program_binds(program: &Path, runpath: &[String]) -> Vec<BindSpec> {
    let Some(dir) = program.parent() else { return vec![] };
    let mut dirs: Vec<PathBuf> = vec![dir.to_path_buf()];
    for entry in runpath.iter().flat_map(|r| r.split(':')) {
        let e = entry.replace("${ORIGIN}", "$ORIGIN").replace("$ORIGIN", &dir.display().to_string());
        if e.starts_with('/') {
            dirs.push(normalize(Path::new(&e)));
        }
    }
    let mut v: Vec<BindSpec> = Vec::new();
    for d in dirs {
        if in_system_view(&d) || v.iter().any(|b| d.starts_with(&b.src)) {
            continue;
        }
        v.retain(|b| !b.src.starts_with(&d));
        v.push(BindSpec::at(d));
    }
    v
}

/// Whether every role sees `p` without a bind (`/usr`, `/lib`, ...).
pub fn in_system_view(p: &Path) -> bool {
    SYSTEM_RO.iter().any(|s| p.starts_with(s))
}

/// `a/b/../c` -> `a/c`, lexically (RUNPATH entries are joined this way by the loader).
fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

fn s(v: &str) -> String {
    toml::Value::String(v.to_string()).to_string()
}

fn p(v: &Path) -> String {
    s(&v.display().to_string())
}

fn array(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| s(i)).collect();
    format!("[{}]", quoted.join(", "))
}

fn binds(v: &[BindSpec]) -> String {
    let items: Vec<String> = v
        .iter()
        .map(|b| match &b.dst {
            Some(d) => format!("{{ src = {}, dst = {} }}", p(&b.src), p(d)),
            None => format!("{{ src = {} }}", p(&b.src)),
        })
        .collect();
    format!("[{}]", items.join(", "))
}

/// The config's text: every field explained where init derived it.
pub fn config_text(a: &Answers) -> String {
    let (escratch, nscratch) = scratch(a);
    let policy = |kind: &str, name: &str, ext: &str| a.policy_dir.join(kind).join(format!("{name}.{ext}"));
    let engine_host = format!("http://127.0.0.1:{}", a.engine_port);
    let mut t = String::new();
    t.push_str(
        "# Written by `sealnode init` (docs/operator-guide.md, \"sealnode init\"); reference: docs/config.md.\n",
    );
    t.push_str(
        "# Check it after any edit: sealnode check --config THIS_FILE\nschema = 1\n\n[cell]\nhostname = \"sealnode\"\n",
    );
    t.push_str(&format!("state_dir = {}\nruntime_dir = {}\n", p(&a.state_dir), p(&a.runtime_dir)));
    if let Some((e, n)) = &a.users {
        t.push_str(&format!("rootful = {{ engine = {}, node = {} }}\n", s(e), s(n)));
    }
    t.push_str("\n[engine]\n");
    t.push_str(&format!("command = {}\n", array(&a.engine_command)));
    t.push_str(&format!("port = {}\n", a.engine_port));
    t.push_str(&format!("seccomp = {}\n", p(&policy("seccomp", a.kind.policy(), "json"))));
    t.push_str(&format!("landlock = {}\n", p(&policy("landlock-rules", a.kind.policy(), "toml"))));
    t.push_str(&format!("models = {}    # read-only at {INSIDE_MODELS}\n", p(&a.models)));
    t.push_str(&format!("scratch = {}\n", p(&escratch)));
    if !a.engine_binds.is_empty() {
        t.push_str("# The engine's install: its dir and its libraries (RUNPATH), or its venv and interpreter.\n");
        t.push_str(&format!("ro_binds = {}\n", binds(&a.engine_binds)));
    }
    match a.kind {
        EngineKind::LlamaServer => {
            t.push_str("# The node starts once llama-server answers 200 on /health (the model loaded).\n");
            t.push_str("ready = { kind = \"http\", path = \"/health\", timeout_s = 300 }\n");
        }
        EngineKind::Ollama => {
            t.push_str("# Under load Ollama may want more: rlimits = { nofile = 65536, nproc = 1024 } (within\n");
            t.push_str("# sealnode's own hard limit: the unit's LimitNOFILE=).\n");
            t.push_str(&format!(
                "env = {{ set = {{ OLLAMA_HOST = {}, OLLAMA_MODELS = {}, OLLAMA_NOPRUNE = \"1\" }} }}\n",
                s(&format!("127.0.0.1:{}", a.engine_port)),
                s(INSIDE_MODELS)
            ));
        }
    }
    t.push_str("restart = \"on-failure\"\n\n[node]\n");
    let py = a.node_python.venv.join("bin/python").display().to_string();
    let mut cmd: Vec<String> = vec![py, "-I".into(), "-u".into(), "-m".into(), "frutebox.provider".into()];
    cmd.extend(["--id".into(), a.node_id.clone(), "--gateway-url".into(), a.gateway.url.clone()]);
    cmd.extend(["--models".into(), a.model_name.clone(), "--compute-type".into(), "cpu".into()]);
    cmd.extend(["--memory-gb".into(), a.memory_gb.to_string(), "--cpu-cores".into(), a.cpu_cores.to_string()]);
    if a.credential.is_some() {
        cmd.extend(["--credential-file".into(), INSIDE_CREDENTIAL.into()]);
    }
    t.push_str(&format!("command = {}\n", array(&cmd)));
    t.push_str(&format!("seccomp = {}\n", p(&policy("seccomp", "node", "json"))));
    t.push_str(&format!("landlock = {}\n", p(&policy("landlock-rules", "node", "toml"))));
    t.push_str(&format!("scratch = {}\n", p(&nscratch)));
    if let Some(c) = &a.credential {
        t.push_str(&format!("credential = {}    # at {INSIDE_CREDENTIAL}\n", p(c)));
    }
    let pb = python_binds(&a.node_python);
    if !pb.is_empty() {
        t.push_str("# The venv and the interpreter its bin/python links to (seen at its own prefix).\n");
        t.push_str(&format!("ro_binds = {}\n", binds(&pb)));
    }
    let engine_env = match a.kind {
        EngineKind::LlamaServer => {
            format!("FRUTEBOX_ENGINE = \"llamacpp\", FRUTEBOX_LLAMACPP_HOST = {}", s(&engine_host))
        }
        EngineKind::Ollama => format!(
            "FRUTEBOX_ENGINE = \"ollama\", OLLAMA_HOST = {}, FRUTEBOX_OLLAMA_MODEL = {}",
            s(&engine_host),
            s(&a.model_name)
        ),
    };
    t.push_str(&format!(
        "env = {{ set = {{ {engine_env}, FRUTEBOX_NODE_STATE_FILE = \"/scratch/frutebox_node_state\" }} }}\n"
    ));
    t.push_str("# The gateway of --gateway-url: the only place the node reaches (a systemd unit also needs\n");
    t.push_str("# its addresses in IPAddressAllow=, docs/operator-guide.md \"Declared egress\").\n");
    let connect = a.gateway.connect.as_ref().map(|c| format!(", connect = {}", s(c))).unwrap_or_default();
    t.push_str(&format!("egress = [{{ host = {}, port = {}{connect} }}]\n", s(&a.gateway.host), a.gateway.port));
    t.push_str("restart = \"on-failure\"\n");
    t
}

// Host facts.

/// The interpreter a venv's `bin/python` resolves to, and its prefix (the dir above `bin/`).
pub fn venv_interpreter(venv: &Path) -> Result<(PathBuf, PathBuf), String> {
    let py = venv.join("bin/python");
    if !venv.join("pyvenv.cfg").is_file() {
        return Err(format!("{}: not a venv (no pyvenv.cfg); make one with python3.12 -m venv DIR", venv.display()));
    }
    let real = follow_links(&py).map_err(|e| format!("{}: {e}", py.display()))?;
    let prefix = real
        .parent()
        .and_then(Path::parent)
        .filter(|_| real.parent().is_some_and(|b| b.ends_with("bin")))
        .ok_or_else(|| format!("{} -> {}: not in a PREFIX/bin dir", py.display(), real.display()))?;
    Ok((real.clone(), prefix.to_path_buf()))
}

/// Where a chain of symlinks leads, read link by link: as far as this user can see (a link
/// into a dir it cannot search ends the walk at the path the link names, which is what a role
/// that sees the dir will find).
fn follow_links(start: &Path) -> std::io::Result<PathBuf> {
    let mut cur = start.to_path_buf();
    for _ in 0..40 {
        match std::fs::read_link(&cur) {
            Ok(next) => cur = normalize(&cur.parent().unwrap_or(Path::new("/")).join(next)),
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Ok(cur),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied && cur != start => return Ok(cur),
            Err(e) => return Err(e),
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::ELOOP))
}

/// The venv a program runs from, when it is a venv's `bin/` entry (a Python engine).
pub fn venv_of(program: &Path) -> Option<PathBuf> {
    let venv = program.parent().filter(|b| b.ends_with("bin"))?.parent()?;
    venv.join("pyvenv.cfg").is_file().then(|| venv.to_path_buf())
}

/// The first directory on the way to `path` (itself included) that a role with these ids
/// cannot search (read for the last component), judged from the mode bits as the kernel
/// would for a user that is not root; `None` = (uid, gid) of nobody in particular: the other
/// bits (the role users own nothing there).
pub fn blocked_at(path: &Path, ids: Option<(u32, u32)>) -> Option<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let mut cur = PathBuf::from("/");
    let mut parts: Vec<PathBuf> = vec![cur.clone()];
    for c in path.components().skip(1) {
        cur.push(c);
        parts.push(cur.clone());
    }
    let last = parts.len() - 1;
    for (i, d) in parts.iter().enumerate() {
        let Ok(m) = std::fs::metadata(d) else { return Some(d.clone()) };
        let need = if i == last && !m.is_dir() { 0o4 } else { 0o1 };
        let bits = match ids {
            Some((u, _)) if m.uid() == u => m.mode() >> 6,
            Some((_, g)) if m.gid() == g => m.mode() >> 3,
            _ => m.mode(),
        };
        if bits & need == 0 {
            return Some(d.clone());
        }
    }
    None
}

/// An ELF file's DT_RUNPATH (or DT_RPATH) entries; empty for anything else. 64-bit
/// little-endian only (x86_64, aarch64): the machines sealnode runs on.
pub fn runpath(program: &Path) -> Vec<String> {
    std::fs::read(program).ok().and_then(|b| elf_runpath(&b)).unwrap_or_default()
}

fn elf_runpath(b: &[u8]) -> Option<Vec<String>> {
    let u16_at = |o: usize| Some(u16::from_le_bytes(b.get(o..o + 2)?.try_into().ok()?));
    let u64_at = |o: usize| Some(u64::from_le_bytes(b.get(o..o + 8)?.try_into().ok()?));
    if b.get(0..4)? != b"\x7fELF" || b.get(4)? != &2 || b.get(5)? != &1 {
        return None;
    }
    let (phoff, phentsize, phnum) = (u64_at(0x20)? as usize, u16_at(0x36)? as usize, u16_at(0x38)? as usize);
    let mut loads = Vec::new();
    let mut dynamic = None;
    for i in 0..phnum {
        let h = phoff + i * phentsize;
        let kind = u32::from_le_bytes(b.get(h..h + 4)?.try_into().ok()?);
        let (off, vaddr, filesz) = (u64_at(h + 8)?, u64_at(h + 16)?, u64_at(h + 32)?);
        match kind {
            1 => loads.push((vaddr, off, filesz)),
            2 => dynamic = Some((off as usize, filesz as usize)),
            _ => {}
        }
    }
    let (doff, dsize) = dynamic?;
    let (mut strtab, mut wanted) = (None, Vec::new());
    for e in (doff..doff + dsize).step_by(16) {
        let (tag, val) = (u64_at(e)?, u64_at(e + 8)?);
        match tag {
            0 => break,
            5 => strtab = Some(val),
            15 | 29 => wanted.push(val),
            _ => {}
        }
    }
    let strtab = strtab?;
    let file_off =
        loads.iter().find(|(va, _, sz)| strtab >= *va && strtab < va + sz).map(|(va, off, _)| strtab - va + off)?;
    let out = wanted
        .iter()
        .filter_map(|o| {
            let start = (file_off + o) as usize;
            let end = start + b.get(start..)?.iter().position(|&c| c == 0)?;
            Some(String::from_utf8_lossy(&b[start..end]).into_owned())
        })
        .collect();
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answers() -> Answers {
        let prog = Path::new("/opt/llama.cpp/bin/llama-server");
        Answers {
            kind: EngineKind::LlamaServer,
            engine_command: engine_argv(
                EngineKind::LlamaServer,
                prog,
                Some("smollm2.gguf"),
                8081,
                &["-t".into(), "1".into()],
            ),
            engine_port: 8081,
            engine_binds: program_binds(prog, &["$ORIGIN/../lib".into()]),
            models: "/srv/models".into(),
            model_name: "smollm2".into(),
            node_python: Interpreter {
                venv: "/opt/frutebox/venv".into(),
                prefix: "/root/.pyenv/versions/3.12.1".into(),
                copy: Some("/opt/sealnode/python/3.12.1".into()),
            },
            gateway: parse_gateway("wss://Gateway.example.net/provider/ws", None).expect("gateway"),
            node_id: "node-1".into(),
            memory_gb: 8,
            cpu_cores: 2,
            state_dir: "/var/lib/sealnode".into(),
            runtime_dir: "/run/sealnode".into(),
            credential: Some("/etc/sealnode/credential".into()),
            policy_dir: "/usr/share/sealnode".into(),
            users: Some(("sealnode-engine".into(), "sealnode-node".into())),
        }
    }

    fn parsed(a: &Answers) -> crate::config::Config {
        let text = config_text(a);
        crate::config::Config::parse(&text, Path::new("/etc/sealnode/sealnode.toml"))
            .unwrap_or_else(|e| panic!("{e}\n{text}"))
    }

    #[test]
    fn llama_server_config_passes_the_pure_checks_with_matching_ports_and_egress() {
        let a = answers();
        let cfg = parsed(&a);
        let text = config_text(&a);
        assert_eq!(cfg.engine.port, Some(8081), "{text}");
        let cmd = &cfg.engine.command;
        assert_eq!(cmd[..3], ["/opt/llama.cpp/bin/llama-server", "-m", "/models/smollm2.gguf"]);
        let port = cmd.iter().position(|x| x == "--port").expect("--port");
        assert_eq!(cmd[port + 1], "8081");
        assert!(text.contains("FRUTEBOX_LLAMACPP_HOST = \"http://127.0.0.1:8081\""), "{text}");
        assert_eq!(cfg.node.egress.len(), 1);
        assert_eq!((cfg.node.egress[0].host.as_str(), cfg.node.egress[0].port), ("gateway.example.net", 443));
        assert!(text.contains("\"--gateway-url\", \"wss://Gateway.example.net/provider/ws\""), "{text}");
        assert!(text.contains("\"--credential-file\", \"/run/sealnode/credential\""), "{text}");
        assert!(text.contains("seccomp = \"/usr/share/sealnode/seccomp/engine.json\""), "{text}");
        assert!(text.contains("rootful = { engine = \"sealnode-engine\", node = \"sealnode-node\" }"), "{text}");
    }

    #[test]
    fn the_interpreter_copy_is_bound_at_its_original_prefix() {
        let a = answers();
        let text = config_text(&a);
        assert!(
            text.contains("ro_binds = [{ src = \"/opt/sealnode/python/3.12.1\", dst = \"/root/.pyenv/versions/3.12.1\" }, { src = \"/opt/frutebox/venv\" }]"),
            "{text}"
        );
        // Reachable where it is: bound in place; in the system view: not bound at all.
        let mut i = a.node_python.clone();
        i.copy = None;
        assert_eq!(
            python_binds(&i),
            vec![BindSpec::at("/root/.pyenv/versions/3.12.1"), BindSpec::at("/opt/frutebox/venv")]
        );
        i.prefix = "/usr".into();
        assert_eq!(python_binds(&i), vec![BindSpec::at("/opt/frutebox/venv")]);
    }

    #[test]
    fn engine_binds_cover_its_dir_and_runpath() {
        let prog = Path::new("/opt/llama.cpp/bin/llama-server");
        assert_eq!(program_binds(prog, &[]), vec![BindSpec::at("/opt/llama.cpp/bin")]);
        assert_eq!(
            program_binds(prog, &["$ORIGIN/../lib:$ORIGIN".into()]),
            vec![BindSpec::at("/opt/llama.cpp/bin"), BindSpec::at("/opt/llama.cpp/lib")]
        );
        // A RUNPATH above the program's dir replaces the narrower bind; system dirs are not bound.
        assert_eq!(program_binds(prog, &["$ORIGIN/..:/usr/lib/x".into()]), vec![BindSpec::at("/opt/llama.cpp")]);
        assert!(program_binds(Path::new("/usr/local/bin/ollama"), &[]).is_empty());
    }

    #[test]
    fn ollama_config_names_its_port_in_ollama_host() {
        let mut a = answers();
        a.kind = EngineKind::Ollama;
        a.engine_port = 11434;
        a.engine_command = engine_argv(EngineKind::Ollama, Path::new("/usr/local/bin/ollama"), None, 11434, &[]);
        a.engine_binds = vec![];
        a.users = None;
        a.credential = None;
        let cfg = parsed(&a);
        let text = config_text(&a);
        assert_eq!(cfg.engine.command, ["/usr/local/bin/ollama", "serve"]);
        assert!(text.contains("OLLAMA_HOST = \"127.0.0.1:11434\""), "{text}");
        assert!(text.contains("engine-ollama.json") && !text.contains("rootful"), "{text}");
        assert!(!text.contains("credential"), "{text}");
    }

    #[test]
    fn gateway_urls() {
        let g = parse_gateway("ws://gateway.demo:18765/provider/ws", Some("127.0.0.1:18765")).expect("ok");
        assert_eq!((g.host.as_str(), g.port, g.connect.as_deref()), ("gateway.demo", 18765, Some("127.0.0.1:18765")));
        assert_eq!(parse_gateway("http://gw.example", None).expect("ok").port, 80);
        assert!(parse_gateway("ws://127.0.0.1:8000/x", None).unwrap_err().contains("--gateway-connect"));
        assert!(parse_gateway("gw.example:80", None).is_err());
        assert!(parse_gateway("ftp://gw.example", None).is_err());
        assert!(parse_gateway("ws://gw.example:0/", None).is_err());
        assert!(parse_gateway("ws://gw.example/", Some("gw:1")).is_err());
    }

    #[test]
    fn kind_from_program_name() {
        assert_eq!(EngineKind::from_program(Path::new("/opt/x/bin/llama-server")), Some(EngineKind::LlamaServer));
        assert_eq!(EngineKind::from_program(Path::new("/usr/local/bin/ollama")), Some(EngineKind::Ollama));
        assert_eq!(EngineKind::from_program(Path::new("/usr/bin/python3")), None);
    }

    #[test]
    fn layout_gives_each_scratch_to_its_role() {
        let l = layout(&answers());
        assert_eq!(l[2], Dir { path: "/var/lib/sealnode/engine".into(), owner: Owner::Engine, mode: 0o700 });
        assert_eq!(l[3], Dir { path: "/var/lib/sealnode/node".into(), owner: Owner::Node, mode: 0o700 });
    }

    #[test]
    fn runpath_of_this_test_binary_parses() {
        // Whatever it says, reading a real ELF does not fail and a non-ELF gives nothing.
        let _ = runpath(&std::env::current_exe().expect("exe"));
        assert!(elf_runpath(b"#!/bin/sh\n").is_none());
    }

    #[test]
    fn blocked_dirs() {
        assert_eq!(blocked_at(Path::new("/usr/bin"), None), None);
        assert_eq!(blocked_at(Path::new("/nonexistent-sealnode-x"), None), Some("/nonexistent-sealnode-x".into()));
    }
}
