//! `sealnode init`: ask (or take from flags) the engine, the model, the node's venv and the
//! gateway; write the config (sealnode::config::init generates it), the role users, the dirs with their
//! owners, the interpreter copy and the credential; then run `check` on the result.

use std::io::{BufRead, IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use sealnode::config::init::{self as gen, Answers, BindSpec, EngineKind, Interpreter, Owner};
use sealnode::config::{Invoker, DEFAULT_CONFIG};
use sealnode::doctor::Level;

use super::{Failure, Outcome};

/// `sealnode init`'s options (clap renders them into the man page and completions).
#[derive(clap::Args, Debug)]
pub struct Args {
    /// The engine program: llama.cpp's llama-server or ollama (its file name says which, else
    /// --engine-kind). Its dir and its RUNPATH dirs are bound read-only; a program in a venv's
    /// bin/ gets the venv and its interpreter bound instead.
    #[arg(long, value_name = "PATH")]
    pub engine: Option<PathBuf>,
    /// The engine's API, when the program's name does not say it.
    #[arg(long, value_enum)]
    pub engine_kind: Option<EngineKind>,
    /// The port the engine listens on (default 8080 for llama-server, 11434 for Ollama); init
    /// puts it in the engine's --port or OLLAMA_HOST and the node's engine address.
    #[arg(long, value_name = "PORT", value_parser = clap::value_parser!(u16).range(1..))]
    pub engine_port: Option<u16>,
    /// One more argument for the engine, after those init derives (repeatable; e.g.
    /// --engine-arg -t --engine-arg 2).
    #[arg(long = "engine-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub engine_args: Vec<String>,
    /// One more read-only bind for the engine, SRC or SRC:DST (repeatable).
    #[arg(long = "engine-bind", value_name = "SRC[:DST]")]
    pub engine_binds: Vec<String>,
    /// llama-server: the model file (its dir is mounted read-only at /models: keep only the
    /// models this node serves there). Ollama: the model store (OLLAMA_MODELS layout).
    #[arg(long, value_name = "PATH")]
    pub model: Option<PathBuf>,
    /// The model name the node offers (default: the model file's name without .gguf; required
    /// for Ollama).
    #[arg(long, value_name = "NAME")]
    pub model_name: Option<String>,
    /// The node's venv with frutebox-node installed (Python >= 3.12).
    #[arg(long, value_name = "DIR")]
    pub venv: Option<PathBuf>,
    /// Where to copy the venv's interpreter when the role users cannot reach it where it is
    /// (e.g. under root's 0700 home); the copy is bound at the original prefix. Reused when it
    /// exists. Default (as root): /opt/sealnode/python/NAME.
    #[arg(long, value_name = "DIR")]
    pub python_copy: Option<PathBuf>,
    /// The gateway's WebSocket URL (ws:// or wss://HOST[:PORT]/PATH): the node's
    /// --gateway-url, and the one egress entry (same host and port).
    #[arg(long, value_name = "URL")]
    pub gateway_url: Option<String>,
    /// Connect the gateway's egress to this fixed address instead of resolving its host.
    #[arg(long, value_name = "IP:PORT")]
    pub gateway_connect: Option<String>,
    /// The node's id at the gateway (default: node-HOSTNAME).
    #[arg(long, value_name = "ID")]
    pub node_id: Option<String>,
    /// Memory the node offers, in GB (default: this host's RAM).
    #[arg(long, value_name = "N")]
    pub memory_gb: Option<u32>,
    /// CPU cores the node reports (default: this host's).
    #[arg(long, value_name = "N")]
    pub cpu_cores: Option<u32>,
    /// The node's credential file: installed at --credential-dest, mode 0400, owned by the
    /// node's user.
    #[arg(long, value_name = "FILE")]
    pub credential: Option<PathBuf>,
    /// Where the credential is installed (default: `credential` beside the config).
    #[arg(long, value_name = "FILE")]
    pub credential_dest: Option<PathBuf>,
    /// The config file to write (an existing one is kept unless --force).
    #[arg(long, value_name = "FILE", env = "SEALNODE_CONFIG", default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// cell.state_dir; the scratch dirs are its engine/ and node/.
    #[arg(long, value_name = "DIR", default_value = "/var/lib/sealnode")]
    pub state_dir: PathBuf,
    /// cell.runtime_dir (the control socket).
    #[arg(long, value_name = "DIR", default_value = "/run/sealnode")]
    pub runtime_dir: PathBuf,
    /// The dir holding the policies' seccomp/ and landlock-rules/ (a checkout's root works).
    #[arg(long, value_name = "DIR", default_value = "/usr/share/sealnode")]
    pub policy_dir: PathBuf,
    /// As root: the engine role's host user (created as a system user when missing).
    #[arg(long, value_name = "USER", default_value = "sealnode-engine")]
    pub engine_user: String,
    /// As root: the node role's host user (created as a system user when missing).
    #[arg(long, value_name = "USER", default_value = "sealnode-node")]
    pub node_user: String,
    /// Print the config and what would be done, and do nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Replace an existing config file.
    #[arg(long)]
    pub force: bool,
    /// Do not ask for confirmation on a terminal.
    #[arg(long)]
    pub yes: bool,
    /// The engine's whole command instead of the one init derives (a stand-in, a custom
    /// build): CMD's install is bound as for --engine; it must listen on --engine-port.
    #[arg(last = true, value_name = "CMD")]
    pub command: Vec<String>,
}

/// One thing init does to the host, in order.
enum Action {
    User(String),
    Dir { path: PathBuf, owner: Owner, mode: u32 },
    CopyPython { from: PathBuf, to: PathBuf },
    Credential { from: PathBuf, to: PathBuf },
    Config { path: PathBuf, text: String },
}

impl Action {
    fn describe(&self) -> String {
        match self {
            Action::User(u) => format!("create system user {u} (no home, nologin)"),
            Action::Dir { path, owner, mode } => {
                let who = match owner {
                    Owner::Launcher => "sealnode's user",
                    Owner::Engine => "the engine's user",
                    Owner::Node => "the node's user",
                };
                format!("dir {} mode {mode:04o}, owned by {who}", path.display())
            }
            Action::CopyPython { from, to } => format!("copy the interpreter {} to {}", from.display(), to.display()),
            Action::Credential { from, to } => format!("install {} as {} (0400, node)", from.display(), to.display()),
            Action::Config { path, .. } => format!("write {} (0644)", path.display()),
        }
    }
}

pub fn init(mut a: Args) -> Outcome {
    let inv = Invoker::current();
    // Before anything is asked, read or written: init trusts its own uid as an owner.
    inv.check_ids().map_err(|e| Failure::setup(format!("init: {e}")))?;
    let rootful = inv.rootful();
    ask_missing(&mut a)?;
    let (answers, mut actions, notes) = resolve(&a, &inv).map_err(Failure::setup)?;
    let text = gen::config_text(&answers);
    if a.config.exists() && !a.force && !a.dry_run {
        return Err(Failure::setup(format!(
            "{}: exists; keeping it (--force replaces it, --dry-run shows what init would write)",
            a.config.display()
        )));
    }
    if let Some(c) = &a.credential {
        let to = answers.credential.clone().unwrap_or_default();
        actions.push(Action::Credential { from: c.clone(), to });
    }
    actions.push(Action::Config { path: a.config.clone(), text: text.clone() });
    for n in &notes {
        eprintln!("sealnode init: note: {n}");
    }
    if a.dry_run {
        println!("{text}");
        println!("# sealnode init would ({}):", if rootful { "rootful" } else { "rootless" });
        for x in &actions {
            println!("#   {}", x.describe());
        }
        return Ok(sealnode::exit::OK);
    }
    if std::io::stdin().is_terminal() && !a.yes {
        println!("{text}");
        for x in &actions {
            println!("  {}", x.describe());
        }
        if !prompt("Go ahead? [y/N]")?.eq_ignore_ascii_case("y") {
            return Err(Failure::setup("init: nothing written (not confirmed)"));
        }
    }
    // Everything init will write lies under dirs only root (or, rootless, this user) can
    // change, and everything it copies from is trusted the same way, before anything is
    // changed: another user's dir on the way refuses init, which then has written, chowned
    // and copied nothing (tests/init.rs: init_as_root_acts_only_where_no_other_user_can_reach).
    for x in &actions {
        preflight(x, &answers, &inv).map_err(|e| Failure::setup(format!("init: {}: {e}", x.describe())))?;
    }
    trusted_venv(&answers.node_python, &inv).map_err(|e| Failure::setup(format!("init: --venv: {e}")))?;
    for x in &actions {
        apply(x, &answers, &inv).map_err(|e| Failure::setup(format!("init: {}: {e}", x.describe())))?;
        println!("sealnode init: {}", x.describe());
    }
    println!();
    let checks = sealnode::check::checks(&a.config, &inv);
    let ok = !checks.iter().any(|c| c.level == Level::Fail);
    sealnode::doctor::print(&checks);
    if ok {
        println!("\n{}: written and checked; start it with `sealnode run --config {0}`.", a.config.display());
        Ok(sealnode::exit::OK)
    } else {
        println!("\n{}: written, but `sealnode run` would refuse it: fix each FAIL above, then `sealnode check --config {0}`.", a.config.display());
        Ok(sealnode::exit::CONFIG)
    }
}

/// On a terminal, ask for each of the four answers no flag gave; elsewhere, name them.
fn ask_missing(a: &mut Args) -> Result<(), Failure> {
    let need_engine = a.engine.is_none() && a.command.is_empty();
    let missing: Vec<&str> = [
        (need_engine, "--engine"),
        (a.model.is_none(), "--model"),
        (a.venv.is_none(), "--venv"),
        (a.gateway_url.is_none(), "--gateway-url"),
    ]
    .iter()
    .filter(|(m, _)| *m)
    .map(|(_, n)| *n)
    .collect();
    if missing.is_empty() {
        return Ok(());
    }
    if !std::io::stdin().is_terminal() {
        return Err(Failure::usage(format!("init: give {} (stdin is not a terminal to ask on)", missing.join(", "))));
    }
    if need_engine {
        a.engine = Some(prompt("Engine program (llama-server or ollama), absolute path:")?.into());
    }
    if a.model.is_none() {
        a.model = Some(prompt("Model (llama-server: the .gguf file; Ollama: the model store dir):")?.into());
    }
    if a.venv.is_none() {
        a.venv = Some(prompt("The node's venv (with frutebox-node installed):")?.into());
    }
    if a.gateway_url.is_none() {
        a.gateway_url = Some(prompt("Gateway URL (wss://HOST/PATH):")?);
    }
    Ok(())
}

fn prompt(q: &str) -> Result<String, Failure> {
    print!("{q} ");
    let _ = std::io::stdout().flush();
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line).map_err(Failure::general)?;
    Ok(line.trim().to_string())
}

fn absolute(p: &Path) -> PathBuf {
    if p.is_absolute() {
        p.to_path_buf()
    } else {
        std::env::current_dir().unwrap_or_else(|_| "/".into()).join(p)
    }
}

/// Everything init derives from the options and the host: the answers the config is
/// generated from, the actions before the config is written, and notes for the operator.
fn resolve(a: &Args, inv: &Invoker) -> Result<(Answers, Vec<Action>, Vec<String>), String> {
    let rootful = inv.rootful();
    let role_ids = if rootful { None } else { Some((inv.uid, inv.gid)) };
    let mut actions = Vec::new();
    let mut notes = Vec::new();
    // The engine: its program, kind, port and command.
    let program = match (a.command.first(), &a.engine) {
        (Some(c), _) => absolute(Path::new(c)),
        (None, Some(e)) => absolute(e),
        (None, None) => return Err("no engine: give --engine PATH".into()),
    };
    if !program.is_file() {
        return Err(format!("--engine {}: not a file", program.display()));
    }
    let kind = a.engine_kind.or_else(|| EngineKind::from_program(&program)).ok_or_else(|| {
        format!("{}: cannot tell llama-server from ollama by its name: give --engine-kind", program.display())
    })?;
    let port = a.engine_port.unwrap_or(kind.default_port());
    // The model: llama-server's file (its dir is the model dir), or Ollama's store.
    let model = absolute(a.model.as_deref().ok_or("no model: give --model")?);
    let (models, model_file, default_name) = match kind {
        EngineKind::LlamaServer => {
            if !model.is_file() {
                return Err(format!("--model {}: not a file (llama-server serves one .gguf file)", model.display()));
            }
            let dir = model.parent().ok_or("--model: no dir")?.to_path_buf();
            let file = model.file_name().ok_or("--model: no file name")?.to_string_lossy().into_owned();
            let others = std::fs::read_dir(&dir).map(|d| d.count()).unwrap_or(0).saturating_sub(1);
            if others > 0 {
                notes.push(format!(
                    "{} holds {others} more entr{} besides {file}: the engine sees them all at /models (llama-server serves only the one it loaded)",
                    dir.display(),
                    if others == 1 { "y" } else { "ies" }
                ));
            }
            let stem = file.strip_suffix(".gguf").unwrap_or(&file).to_string();
            (dir, Some(file), Some(stem))
        }
        EngineKind::Ollama => {
            if !model.is_dir() {
                return Err(format!(
                    "--model {}: not a dir (Ollama's model store: blobs/, manifests/)",
                    model.display()
                ));
            }
            (model.clone(), None, None)
        }
    };
    let model_name = a
        .model_name
        .clone()
        .or(default_name)
        .ok_or("Ollama: give --model-name (the model the node offers, as `ollama list` names it)")?;
    let engine_command = if a.command.is_empty() {
        gen::engine_argv(kind, &program, model_file.as_deref(), port, &a.engine_args)
    } else {
        let mut c = a.command.clone();
        c[0] = program.display().to_string();
        c.extend(a.engine_args.iter().cloned());
        c
    };
    let mut engine_binds = match gen::venv_of(&program) {
        Some(venv) => gen::python_binds(&interpreter(&venv, a, role_ids, &mut actions)?),
        None => gen::program_binds(&program, &gen::runpath(&program)),
    };
    for b in &a.engine_binds {
        let (src, dst) = match b.split_once(':') {
            Some((s, d)) => (absolute(Path::new(s)), Some(PathBuf::from(d))),
            None => (absolute(Path::new(b)), None),
        };
        engine_binds.push(BindSpec { src, dst });
    }
    for b in &engine_binds {
        if let Some(d) = gen::blocked_at(&b.src, role_ids) {
            notes.push(format!("the engine's bind {}: the role cannot search {}", b.src.display(), d.display()));
        }
    }
    // The node.
    let venv = absolute(a.venv.as_deref().ok_or("no venv: give --venv")?);
    let node_python = interpreter(&venv, a, role_ids, &mut actions)?;
    if let Some(d) = gen::blocked_at(&venv.join("bin"), role_ids) {
        notes.push(format!("the venv {}: the node role cannot search {}; move it", venv.display(), d.display()));
    }
    let gateway = gen::parse_gateway(
        a.gateway_url.as_deref().ok_or("no gateway: give --gateway-url")?,
        a.gateway_connect.as_deref(),
    )?;
    let host =
        nix::unistd::gethostname().map(|h| h.to_string_lossy().into_owned()).unwrap_or_else(|_| "sealnode".into());
    let config = absolute(&a.config);
    let credential = a.credential.as_ref().map(|_| {
        a.credential_dest.clone().map(|d| absolute(&d)).unwrap_or_else(|| config.with_file_name("credential"))
    });
    let answers = Answers {
        kind,
        engine_command,
        engine_port: port,
        engine_binds,
        models,
        model_name,
        node_python,
        gateway,
        node_id: a.node_id.clone().unwrap_or(format!("node-{host}")),
        memory_gb: a.memory_gb.unwrap_or_else(host_memory_gb),
        cpu_cores: a
            .cpu_cores
            .unwrap_or_else(|| std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1)),
        state_dir: absolute(&a.state_dir),
        runtime_dir: absolute(&a.runtime_dir),
        credential,
        policy_dir: absolute(&a.policy_dir),
        users: rootful.then(|| (a.engine_user.clone(), a.node_user.clone())),
    };
    let mut before = Vec::new();
    if rootful {
        for u in [&a.engine_user, &a.node_user] {
            if !u.contains(':') && nix::unistd::User::from_name(u).ok().flatten().is_none() {
                before.push(Action::User(u.clone()));
            }
        }
    }
    for d in gen::layout(&answers) {
        before.push(Action::Dir { path: d.path, owner: d.owner, mode: d.mode });
    }
    before.append(&mut actions);
    Ok((answers, before, notes))
}

/// The venv's interpreter: where it is, or a copy (made by an action, or reused) when the
/// roles cannot search its prefix.
fn interpreter(
    venv: &Path,
    a: &Args,
    ids: Option<(u32, u32)>,
    actions: &mut Vec<Action>,
) -> Result<Interpreter, String> {
    let (real, prefix) = gen::venv_interpreter(venv)?;
    let Some(blocked) = gen::blocked_at(&real, ids) else {
        return Ok(Interpreter { venv: venv.to_path_buf(), prefix, copy: None });
    };
    let name = prefix.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "python".into());
    let copy = match &a.python_copy {
        Some(c) => absolute(c),
        None if ids.is_none() => PathBuf::from("/opt/sealnode/python").join(name),
        None => {
            return Err(format!(
                "{}: the interpreter {} is under {}, which this user cannot search: give --python-copy DIR (a copy of {} made by a user who can read it, or where init should make one)",
                venv.display(),
                real.display(),
                blocked.display(),
                prefix.display()
            ))
        }
    };
    let rel = real.strip_prefix(&prefix).map_err(|_| format!("{}: not under {}", real.display(), prefix.display()))?;
    if !copy.join(rel).is_file() {
        if copy.exists() {
            return Err(format!("--python-copy {}: exists but has no {}", copy.display(), rel.display()));
        }
        if !actions.iter().any(|x| matches!(x, Action::CopyPython { to, .. } if to == &copy)) {
            actions.push(Action::CopyPython { from: prefix.clone(), to: copy.clone() });
        }
    }
    Ok(Interpreter { venv: venv.to_path_buf(), prefix, copy: Some(copy) })
}

fn host_memory_gb() -> u32 {
    let kb = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| m.lines().find(|l| l.starts_with("MemTotal:"))?.split_whitespace().nth(1)?.parse::<u64>().ok());
    kb.map(|k| (k / (1024 * 1024)).max(1) as u32).unwrap_or(1)
}

/// The host uid and gid of an owner.
fn ids_of(owner: Owner, a: &Answers, inv: &Invoker) -> Result<(u32, u32), String> {
    let user = match (owner, &a.users) {
        (Owner::Launcher, _) | (_, None) => return Ok((inv.uid, inv.gid)),
        (Owner::Engine, Some((e, _))) => e,
        (Owner::Node, Some((_, n))) => n,
    };
    if let Some((u, g)) = user.split_once(':') {
        return Ok((
            u.parse().map_err(|_| format!("{user}: bad uid"))?,
            g.parse().map_err(|_| format!("{user}: bad gid"))?,
        ));
    }
    let u = nix::unistd::User::from_name(user).map_err(|e| e.to_string())?.ok_or(format!("no user {user}"))?;
    Ok((u.uid.as_raw(), u.gid.as_raw()))
}

fn run(cmd: &mut Command) -> Result<(), String> {
    let out = cmd.output().map_err(|e| format!("{:?}: {e}", cmd.get_program()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{:?} {}: {}", cmd.get_program(), out.status, String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// What must hold before `x` is applied (nothing is changed here).
fn preflight(x: &Action, a: &Answers, inv: &Invoker) -> Result<(), String> {
    use sealnode::os::trusted;
    match x {
        Action::User(_) => Ok(()),
        // sealnode's own dirs: as `run` checks them (a missing one is made with a safe mode).
        Action::Dir { path, owner: Owner::Launcher, .. } => trusted::check_own_dir(path, inv.uid),
        // A role's dir: made in a trusted dir; an existing one is never taken over.
        Action::Dir { path, owner, .. } => {
            let parent = path.parent().ok_or("no parent dir")?;
            trusted::check_own_dir(parent, inv.uid)?;
            match std::fs::symlink_metadata(path) {
                Err(_) => Ok(()),
                Ok(m) => role_dir_as_made(&m, ids_of(*owner, a, inv).ok(), path),
            }
        }
        Action::CopyPython { from, to } => {
            if let Some(parent) = to.parent() {
                trusted::check_own_dir(parent, inv.uid)?;
            }
            if std::fs::symlink_metadata(to).is_ok() {
                return Err(format!("{} exists: init copies into a new dir only", to.display()));
            }
            trusted_prefix(from, inv)
        }
        Action::Credential { from, to } => {
            trusted::open(from, inv.uid).map_err(|e| format!("the credential to install: {e}"))?;
            let parent = to.parent().ok_or("no parent dir")?;
            trusted::check_own_dir(parent, inv.uid)
        }
        Action::Config { path, .. } => {
            let parent = path.parent().ok_or("no parent dir")?;
            trusted::check_own_dir(parent, inv.uid)?;
            match std::fs::symlink_metadata(path) {
                Ok(m) if !m.file_type().is_file() => {
                    Err(format!("{} exists and is not a regular file", path.display()))
                }
                _ => Ok(()),
            }
        }
    }
}

/// An existing role dir init would otherwise make: it must be just what init makes (a dir,
/// the role's, no access for group or others), or init stops.
fn role_dir_as_made(m: &std::fs::Metadata, ids: Option<(u32, u32)>, path: &Path) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    let mine = ids.is_some_and(|(u, _)| m.uid() == u);
    if m.file_type().is_dir() && mine && m.mode() & 0o077 == 0 {
        return Ok(());
    }
    Err(format!(
        "{} exists (uid {}, mode {:o}, {}): init does not take over a dir; remove it or give another --state-dir",
        path.display(),
        m.uid(),
        m.mode() & 0o7777,
        if m.file_type().is_symlink() {
            "a symlink"
        } else if m.file_type().is_dir() {
            "a dir"
        } else {
            "not a dir"
        }
    ))
}

/// An interpreter prefix init may copy: reached through dirs only root (or this user) can
/// change, itself such a dir, and a Python install (lib/python3.*), holding no device, FIFO
/// or socket. A venv's symlink into any other tree is refused before anything is copied, so
/// root never copies, and opens to every user, a tree it points into (tests/init.rs:
/// init_copies_only_a_python_prefix_no_one_else_controls).
fn trusted_prefix(prefix: &Path, inv: &Invoker) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    sealnode::os::trusted::check_dirs_to(prefix, inv.uid)?;
    let m = std::fs::symlink_metadata(prefix).map_err(|e| format!("{}: {e}", prefix.display()))?;
    if !m.file_type().is_dir() || !(m.uid() == 0 || m.uid() == inv.uid) || m.mode() & 0o022 != 0 {
        return Err(format!("{}: not a dir of root's (or yours) that no one else can write", prefix.display()));
    }
    let is_python = std::fs::read_dir(prefix.join("lib"))
        .map(|d| d.filter_map(|e| e.ok()).any(|e| e.file_name().to_string_lossy().starts_with("python3")))
        .unwrap_or(false);
    if !is_python {
        return Err(format!(
            "{}: not a Python install (no lib/python3.*): init copies only an interpreter's prefix",
            prefix.display()
        ));
    }
    let special = Command::new("find")
        .arg(prefix)
        .args(["(", "-type", "p", "-o", "-type", "s", "-o", "-type", "b", "-o", "-type", "c", ")", "-print", "-quit"])
        .output()
        .map_err(|e| format!("find: {e}"))?;
    let found = String::from_utf8_lossy(&special.stdout).trim().to_string();
    if !special.status.success() || !found.is_empty() {
        return Err(format!("{}: holds a device, FIFO or socket ({found}): not copied", prefix.display()));
    }
    Ok(())
}

/// The venv the node runs from: root's or this user's, no one else can write it or the dirs
/// above it (`check` refuses it otherwise, but only after init acted on it).
fn trusted_venv(i: &Interpreter, inv: &Invoker) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    sealnode::os::trusted::check_dirs_to(&i.venv.join("bin"), inv.uid)?;
    for d in [i.venv.clone(), i.venv.join("bin")] {
        let m = std::fs::symlink_metadata(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        if !(m.uid() == 0 || m.uid() == inv.uid) || m.mode() & 0o022 != 0 {
            return Err(format!(
                "{}: owned by uid {} with mode {:o}: a venv init builds on must be root's (or yours) and writable by no one else",
                d.display(),
                m.uid(),
                m.mode() & 0o7777
            ));
        }
    }
    Ok(())
}

/// A trusted dir's descriptor (made if missing, as sealnode makes its own dirs).
fn dir_fd(path: &Path, inv: &Invoker) -> Result<std::os::fd::OwnedFd, String> {
    sealnode::os::trusted::own_dir(path, inv.uid, 0o755)
}

/// Write `bytes` as `name` in the dir `dir` race-free: a new file (O_EXCL, no symlink
/// followed) with a temporary name, its owner and mode set on the descriptor, then renamed
/// over `name`.
fn write_in(
    dir: &std::os::fd::OwnedFd,
    name: &std::ffi::OsStr,
    bytes: &[u8],
    mode: u32,
    ids: Option<(u32, u32)>,
) -> Result<(), String> {
    use nix::fcntl::{openat, renameat, OFlag};
    use nix::sys::stat::Mode;
    let tmp = format!(".{}.init-{}", name.to_string_lossy(), std::process::id());
    let fd = openat(
        dir,
        tmp.as_str(),
        OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
        Mode::from_bits_truncate(0o600),
    )
    .map_err(|e| format!("create {tmp}: {e}"))?;
    let mut f = std::fs::File::from(fd);
    let written = (|| -> Result<(), String> {
        f.write_all(bytes).map_err(|e| format!("write: {e}"))?;
        if let Some((u, g)) = ids {
            nix::unistd::fchown(&f, Some(u.into()), Some(g.into())).map_err(|e| format!("chown: {e}"))?;
        }
        nix::sys::stat::fchmod(&f, Mode::from_bits_truncate(mode)).map_err(|e| format!("chmod: {e}"))?;
        f.sync_all().map_err(|e| format!("fsync: {e}"))?;
        renameat(dir, tmp.as_str(), dir, name).map_err(|e| format!("rename: {e}"))
    })();
    if written.is_err() {
        let _ = nix::unistd::unlinkat(dir, tmp.as_str(), nix::unistd::UnlinkatFlags::NoRemoveDir);
    }
    written
}

fn apply(x: &Action, a: &Answers, inv: &Invoker) -> Result<(), String> {
    use nix::fcntl::{openat, OFlag};
    use nix::sys::stat::Mode;
    let leaf = |p: &Path| -> Result<(PathBuf, std::ffi::OsString), String> {
        let parent = p.parent().ok_or("no parent dir")?.to_path_buf();
        let name = p.file_name().ok_or("no file name")?.to_os_string();
        Ok((parent, name))
    };
    match x {
        Action::User(u) => run(Command::new("useradd").args([
            "--system",
            "--no-create-home",
            "--home-dir",
            "/nonexistent",
            "--shell",
            "/usr/sbin/nologin",
            u,
        ])),
        Action::Dir { path, owner: Owner::Launcher, mode } => {
            sealnode::os::trusted::own_dir(path, inv.uid, *mode).map(drop)
        }
        Action::Dir { path, owner, mode } => {
            let (parent, name) = leaf(path)?;
            let dir = dir_fd(&parent, inv)?;
            let ids = ids_of(*owner, a, inv)?;
            let made = match nix::sys::stat::mkdirat(&dir, name.as_os_str(), Mode::from_bits_truncate(0o700)) {
                Ok(()) => true,
                Err(nix::errno::Errno::EEXIST) => false,
                Err(e) => return Err(format!("mkdir: {e}")),
            };
            let fd = openat(
                &dir,
                name.as_os_str(),
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| format!("open: {e}"))?;
            if made {
                nix::unistd::fchown(&fd, Some(ids.0.into()), Some(ids.1.into())).map_err(|e| format!("chown: {e}"))?;
                nix::sys::stat::fchmod(&fd, Mode::from_bits_truncate(*mode)).map_err(|e| format!("chmod: {e}"))
            } else {
                let st = nix::sys::stat::fstat(&fd).map_err(|e| format!("stat: {e}"))?;
                if st.st_uid != ids.0 || st.st_mode & 0o077 != 0 {
                    return Err(format!(
                        "{} exists with uid {}, mode {:o}: init does not take over a dir",
                        path.display(),
                        st.st_uid,
                        st.st_mode & 0o7777
                    ));
                }
                Ok(())
            }
        }
        Action::CopyPython { from, to } => {
            if let Some(parent) = to.parent() {
                dir_fd(parent, inv)?;
            }
            // Owned by whoever runs init (not the source's owner), no set-id bits; readable
            // and searchable by the role users, writable by no one but the owner.
            run(Command::new("cp").args(["-a", "--no-preserve=ownership", "--"]).arg(from).arg(to))?;
            run(Command::new("chmod").args(["-R", "u-s,g-s,a+rX,go-w", "--"]).arg(to))
        }
        Action::Credential { from, to } => {
            let src = sealnode::os::trusted::open(from, inv.uid)?;
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut std::fs::File::from(src), &mut bytes).map_err(|e| format!("read: {e}"))?;
            let (parent, name) = leaf(to)?;
            write_in(&dir_fd(&parent, inv)?, &name, &bytes, 0o400, Some(ids_of(Owner::Node, a, inv)?))
        }
        Action::Config { path, text } => {
            let (parent, name) = leaf(path)?;
            write_in(&dir_fd(&parent, inv)?, &name, text.as_bytes(), 0o644, None)
        }
    }
}
