//! Shared fixtures for integration tests that run real sandboxes.
//!
//! Each test builds a private tree (model dir, scratch dirs, credential, config) and runs the
//! real `sealnode` binary, as root (rootful: role users 61001/61002) and as an unprivileged
//! user (uid 65534 via setpriv: rootless). Missing kernel features or tools skip loudly, and
//! fail when `SEALNODE_TEST_REQUIRE` names them (`.ci/run` sets it).
#![allow(dead_code)]

use std::os::unix::fs::{chown, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

pub const ENGINE_IDS: (u32, u32) = (61001, 61001);
pub const NODE_IDS: (u32, u32) = (61002, 61002);
pub const NOBODY: u32 = 65534;

/// Skip (loudly) or fail, depending on SEALNODE_TEST_REQUIRE.
pub fn unavailable(feature: &str, why: &str) {
    let required = std::env::var("SEALNODE_TEST_REQUIRE").unwrap_or_default();
    if required.split(',').any(|f| f.trim() == feature || f.trim() == "all") {
        panic!("required feature {feature:?} unavailable: {why} (SEALNODE_TEST_REQUIRE={required})");
    }
    eprintln!("\n!!! SKIPPED: feature {feature:?} unavailable: {why}\n!!! set SEALNODE_TEST_REQUIRE={feature} to make this a failure\n");
    record_skip(feature, why);
}

/// Appends the skip to `SEALNODE_TEST_SKIP_LOG` (binary, test, feature, why; tab-separated), so
/// scripts/test counts this test as skipped rather than passed. libtest names each test's
/// thread after the test.
fn record_skip(feature: &str, why: &str) {
    let Some(path) = std::env::var_os("SEALNODE_TEST_SKIP_LOG") else { return };
    let exe = std::env::current_exe().ok().and_then(|p| Some(p.file_name()?.to_string_lossy().into_owned()));
    let exe = exe.unwrap_or_default();
    // The binary's name without cargo's hash suffix, as cargo's "Running" line shows it.
    let binary = exe.rsplit_once('-').map_or(exe.as_str(), |(b, _)| b);
    let thread = std::thread::current();
    let test = thread.name().unwrap_or("?");
    let line = format!("{binary}\t{test}\t{feature}\t{}\n", why.replace(['\t', '\n'], " "));
    let written = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&path)
        .and_then(|mut f| std::io::Write::write_all(&mut f, line.as_bytes()));
    if let Err(e) = written {
        panic!("cannot record the skip in {}: {e}", std::path::Path::new(&path).display());
    }
}

/// A line of `sealnode run`'s stdout or stderr without the role tag it re-emits a role's
/// output with (`engine[PID]: `, `node[PID]: `); sealnode's own lines are returned as they are.
pub fn untag(line: &str) -> String {
    for role in ["engine[", "node["] {
        if let Some(rest) = line.strip_prefix(role) {
            if let Some((pid, text)) = rest.split_once("]: ") {
                if !pid.is_empty() && pid.chars().all(|c| c.is_ascii_digit()) {
                    return text.to_string();
                }
            }
        }
    }
    line.to_string()
}

pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// sealnode runs as root; each role runs as its own host uid.
    Rootful,
    /// sealnode runs as uid 65534 (via setpriv when the test is root), roles as that uid.
    Rootless,
}

/// The modes this test process can exercise; says loudly what it cannot.
pub fn modes() -> Vec<Mode> {
    let mut v = Vec::new();
    if is_root() {
        v.push(Mode::Rootful);
        if Path::new("/usr/bin/setpriv").exists() {
            v.push(Mode::Rootless);
        } else {
            unavailable("rootless", "setpriv (util-linux) is missing");
        }
    } else {
        unavailable("rootful", "tests are not running as root");
        v.push(Mode::Rootless);
    }
    if sealnode::os::sys::landlock_abi() < 6 {
        unavailable("landlock", &format!("kernel Landlock ABI {} < 6", sealnode::os::sys::landlock_abi()));
        return vec![];
    }
    v
}

pub struct Fixture {
    pub mode: Mode,
    pub dir: PathBuf,
    pub bin: PathBuf,
    pub config: PathBuf,
    /// Extra TOML lines appended to [engine] / [node].
    pub engine_extra: String,
    pub node_extra: String,
    /// Basename of the engine's policy files under seccomp/ and landlock-rules/.
    pub engine_policy: String,
    /// TOML arrays for the roles' commands.
    pub engine_cmd: String,
    pub node_cmd: String,
    /// Extra [cell] lines.
    pub cell_extra: String,
}

fn mkdir(p: &Path, mode: u32, owner: Option<(u32, u32)>) {
    std::fs::create_dir_all(p).expect("mkdir");
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    if let Some((u, g)) = owner {
        chown(p, Some(u), Some(g)).expect("chown");
    }
}

fn write(p: &Path, contents: &str, mode: u32, owner: Option<(u32, u32)>) {
    std::fs::write(p, contents).expect("write");
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    if let Some((u, g)) = owner {
        chown(p, Some(u), Some(g)).expect("chown");
    }
}

pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

impl Fixture {
    pub fn new(mode: Mode, name: &str) -> Fixture {
        // Not under /tmp: the roles' Landlock rules grant their own /tmp, and the canary's
        // layer matrix (namespaces off) would then see host paths under /tmp as granted.
        let base =
            std::path::Path::new("/var/tmp").join(format!("sealnode-it-{}-{name}-{:?}", std::process::id(), mode));
        let _ = std::fs::remove_dir_all(&base);
        mkdir(&base, 0o755, None);
        let (eo, no) = match mode {
            Mode::Rootful => (Some(ENGINE_IDS), Some(NODE_IDS)),
            Mode::Rootless if is_root() => (Some((NOBODY, NOBODY)), Some((NOBODY, NOBODY))),
            Mode::Rootless => (None, None),
        };
        mkdir(&base.join("models"), 0o755, None);
        // State (receipts) and runtime (control socket) dirs belong to the launcher.
        let launcher = if mode == Mode::Rootless && is_root() { Some((NOBODY, NOBODY)) } else { None };
        mkdir(&base.join("state"), 0o750, launcher);
        mkdir(&base.join("run"), 0o755, launcher);
        write(&base.join("models/model.gguf"), "not really a model\n", 0o644, None);
        mkdir(&base.join("engine-scratch"), 0o700, eo);
        mkdir(&base.join("node-scratch"), 0o700, no);
        write(&base.join("credential"), "node-credential-token\n", 0o400, no);
        write(&base.join("host-secret"), "host secret\n", 0o644, None);
        // The binary and policies are copied so any uid can reach them and they are root-owned.
        mkdir(&base.join("bin"), 0o755, None);
        let bin = base.join("bin/sealnode");
        // A hard link, not a copy: a copy is open for writing while other test threads fork,
        // and exec'ing it then fails with ETXTBSY.
        if std::fs::hard_link(env!("CARGO_BIN_EXE_sealnode"), &bin).is_err() {
            std::fs::copy(env!("CARGO_BIN_EXE_sealnode"), &bin).expect("copy sealnode");
        }
        std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        mkdir(&base.join("policy"), 0o755, None);
        for f in [
            "seccomp/engine.json",
            "seccomp/node.json",
            "seccomp/engine-ollama.json",
            "seccomp/engine-gpu.json",
            "landlock-rules/engine-gpu.toml",
            "landlock-rules/engine.toml",
            "landlock-rules/node.toml",
            "landlock-rules/engine-ollama.toml",
        ] {
            let dst = base.join("policy").join(Path::new(f).file_name().expect("name"));
            std::fs::copy(repo().join(f), &dst).expect("copy policy");
            std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        let f = Fixture {
            mode,
            dir: base.clone(),
            bin,
            config: base.join("sealnode.toml"),
            engine_extra: String::new(),
            node_extra: String::new(),
            engine_policy: "engine".into(),
            engine_cmd: "[\"/usr/bin/true\"]".into(),
            node_cmd: "[\"/usr/bin/true\"]".into(),
            cell_extra: String::new(),
        };
        f.write_config();
        f
    }

    pub fn p(&self, rel: &str) -> PathBuf {
        self.dir.join(rel)
    }

    pub fn write_config(&self) {
        let d = self.dir.display();
        let rootful = if self.mode == Mode::Rootful {
            format!(
                "rootful = {{ engine = \"{}:{}\", node = \"{}:{}\" }}\n",
                ENGINE_IDS.0, ENGINE_IDS.1, NODE_IDS.0, NODE_IDS.1
            )
        } else {
            String::new()
        };
        let text = format!(
            r#"schema = 1
[cell]
hostname = "sealnode-test"
state_dir = "{d}/state"
runtime_dir = "{d}/run"
{rootful}
{cell_extra}
[engine]
command = {engine_cmd}
port = 18080
seccomp = "{d}/policy/{ep}.json"
landlock = "{d}/policy/{ep}.toml"
models = "{d}/models"
scratch = "{d}/engine-scratch"
env = {{ set = {{ ENGINE_ONLY = "1" }} }}
{}
[node]
command = {node_cmd}
seccomp = "{d}/policy/node.json"
landlock = "{d}/policy/node.toml"
scratch = "{d}/node-scratch"
credential = "{d}/credential"
env = {{ set = {{ FRUTEBOX_ENGINE = "llamacpp" }}, pass = ["SEALNODE_TEST_PASS"] }}
{}
"#,
            self.engine_extra,
            self.node_extra,
            ep = self.engine_policy,
            cell_extra = self.cell_extra,
            engine_cmd = self.engine_cmd,
            node_cmd = self.node_cmd,
        );
        write(&self.config, &text, 0o644, None);
    }

    /// A Command running this fixture's sealnode as the mode's launcher.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = if self.mode == Mode::Rootless && is_root() {
            let mut c = Command::new("/usr/bin/setpriv");
            c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"]).arg(&self.bin);
            c
        } else {
            Command::new(&self.bin)
        };
        c.args(args).current_dir(&self.dir);
        c
    }

    pub fn exec(&self, role: &str, argv: &[&str]) -> Output {
        let cfg = self.config.display().to_string();
        let mut args = vec!["exec", "--config", cfg.as_str(), "--role", role, "--"];
        args.extend_from_slice(argv);
        self.command(&args).output_within(COMMAND_LIMIT)
    }

    /// Run the probe in `role`'s sandbox and parse its report.
    pub fn probe(&self, role: &str, extra: &[&str]) -> serde_json::Value {
        let cfg = self.config.display().to_string();
        let mut args = vec!["probe", "--config", cfg.as_str(), "--role", role, "--"];
        args.extend_from_slice(extra);
        let out = self
            .command(&args)
            .env("SEALNODE_TEST_SECRET", "launcher-secret-value")
            .env("HTTPS_PROXY", "http://proxy.invalid:3128")
            .env("SEALNODE_TEST_PASS", "passed-through")
            .output_within(COMMAND_LIMIT);
        assert!(
            out.status.success(),
            "{:?} probe failed: {}\n{}",
            self.mode,
            out.status,
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("probe output: {e}: {}", String::from_utf8_lossy(&out.stdout)))
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        // SEALNODE_TEST_KEEP=1 keeps the fixture (config, policies, state) for debugging.
        if std::env::var_os("SEALNODE_TEST_KEEP").is_some() {
            eprintln!("kept fixture {}", self.dir.display());
            return;
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Find the outcome of the probe attempt named `name`.
pub fn attempt<'a>(report: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    report["attempts"]
        .as_array()
        .expect("attempts")
        .iter()
        .find(|a| a["name"] == name)
        .unwrap_or_else(|| panic!("no attempt {name}"))
}

/// Assert the attempt failed, with one of `errnos` if given.
pub fn refused(report: &serde_json::Value, name: &str, errnos: &[i32]) {
    let a = attempt(report, name);
    assert_eq!(a["ok"], false, "attempt {name} SUCCEEDED inside the sandbox: {a}");
    if !errnos.is_empty() {
        let e = a["errno"].as_i64().expect("errno") as i32;
        assert!(errnos.contains(&e), "attempt {name}: errno {e}, expected one of {errnos:?}: {a}");
    }
}

/// The program `p`: a path as given, a bare name searched in PATH (as a shell would).
pub fn which(p: &str) -> Option<PathBuf> {
    if p.contains('/') {
        let p = Path::new(p);
        return p.exists().then(|| p.to_path_buf());
    }
    let path = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
    std::env::split_paths(&path).map(|d| d.join(p)).find(|c| c.is_file())
}

/// A `sealnode run` started by a test. Its stderr (the roles' too) is drained while it runs: a
/// chatty role would otherwise fill the pipe and block in write(2).
pub struct RunningCell {
    child: std::process::Child,
    stderr: Option<std::thread::JoinHandle<String>>,
}

impl Fixture {
    /// Starts `sealnode run`. With SEALNODE_TEST_STRACE=DIR (root only) it runs under
    /// `strace -f`, one trace file per fixture in DIR, for `scripts/policy-usage` to hold the
    /// shipped policies against what the real programs call (docs/policies.md, "Fitting").
    pub fn start_run(&self) -> RunningCell {
        self.spawn_cell(Stdio::null()).0
    }

    /// [`Fixture::start_run`], with sealnode's stdout (the roles' lines, untagged) delivered
    /// line by line ([`next_line`]).
    pub fn start_run_with_output(&self) -> (RunningCell, std::sync::mpsc::Receiver<String>) {
        let (cell, out) = self.spawn_cell(Stdio::piped());
        let out = out.expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for l in std::io::BufRead::lines(std::io::BufReader::new(out)).map_while(Result::ok) {
                let _ = tx.send(untag(&l));
            }
        });
        (cell, rx)
    }

    fn spawn_cell(&self, stdout: Stdio) -> (RunningCell, Option<std::process::ChildStdout>) {
        let cfg = self.config.display().to_string();
        let mut cmd = self.command(&["run", "--config", &cfg]);
        if let Some(dir) = std::env::var_os("SEALNODE_TEST_STRACE").filter(|_| is_root()) {
            let name = self.dir.file_name().expect("fixture name").to_string_lossy().into_owned();
            let out = Path::new(&dir).join(format!("{name}.trace"));
            let mut traced = Command::new("strace");
            traced
                .args(["-f", "-qq", "--decode-pids=pidns", "-s", "128", "-o"])
                .arg(out)
                .arg(cmd.get_program())
                .args(cmd.get_args());
            traced.current_dir(&self.dir);
            cmd = traced;
        }
        let mut child = cmd.stdin(Stdio::null()).stdout(stdout).stderr(Stdio::piped()).spawn().expect("run");
        let mut pipe = child.stderr.take().expect("stderr");
        let stderr = std::thread::spawn(move || {
            let mut e = Vec::new();
            let _ = std::io::Read::read_to_end(&mut pipe, &mut e);
            String::from_utf8_lossy(&e).into_owned()
        });
        let out = child.stdout.take();
        (RunningCell { child, stderr: Some(stderr) }, out)
    }
}

/// The next line from `lines` that `pred` accepts, within `secs` (the others are skipped).
/// The next line matching `pred` within `secs`, or None (sealnode exited, or the time passed).
pub fn try_next_line(
    lines: &std::sync::mpsc::Receiver<String>,
    secs: u64,
    pred: impl Fn(&str) -> bool,
) -> Option<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(l) if pred(&l) => return Some(l),
            Ok(_) => continue,
            Err(_) => return None,
        }
    }
}

pub fn next_line(lines: &std::sync::mpsc::Receiver<String>, secs: u64, pred: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let mut seen = std::collections::VecDeque::new();
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(l) if pred(&l) => return l,
            Ok(l) => {
                seen.push_back(l);
                if seen.len() > 40 {
                    seen.pop_front();
                }
            }
            Err(e) => {
                panic!("no matching line within {secs}s ({e}); the last lines seen:\n{}", Vec::from(seen).join("\n"))
            }
        }
    }
}

impl RunningCell {
    /// sealnode's pid (to signal it).
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }

    /// Wait for a test gateway to exit; returns its status and stdout. Panics (with sealnode's
    /// stderr) if sealnode exits first, or when `timeout` passes.
    pub fn wait_for_gateway(
        &mut self,
        gw: &mut std::process::Child,
        timeout: std::time::Duration,
        mode: Mode,
    ) -> (std::process::ExitStatus, String) {
        let deadline = std::time::Instant::now() + timeout;
        let status = loop {
            if let Some(st) = gw.try_wait().expect("wait") {
                break st;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                let _ = gw.kill();
                let e = self.stderr.take().and_then(|t| t.join().ok()).unwrap_or_default();
                panic!("{mode:?}: sealnode run exited early: {st}: {e}");
            }
            assert!(std::time::Instant::now() < deadline, "{mode:?}: no round trip within {timeout:?}");
            std::thread::sleep(std::time::Duration::from_millis(50));
        };
        // Empty when the caller reads the gateway's stdout itself. Read in a thread: a
        // descendant holding the pipe must not hang the test.
        let out = gw.stdout.take().map(|mut o| {
            std::thread::spawn(move || {
                let mut s = String::new();
                let _ = std::io::Read::read_to_string(&mut o, &mut s);
                s
            })
        });
        let out = match out {
            Some(t) if wait_until(READ_LIMIT, || t.is_finished()) => t.join().unwrap_or_default(),
            Some(_) => panic!("{mode:?}: the gateway exited but its stdout stays open"),
            None => String::new(),
        };
        (status, out)
    }

    /// SIGTERM, as systemd stops it; returns sealnode's exit status and everything it wrote to stderr.
    pub fn stop(mut self) -> (std::process::ExitStatus, String) {
        let mut pid = self.child.id();
        // Under SEALNODE_TEST_STRACE the child is strace, which blocks fatal signals: signal
        // the sealnode it runs (its only child) instead.
        if let Ok(kids) = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")) {
            let traced = std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == "strace");
            if let Some(kid) = kids.split_whitespace().next().and_then(|k| k.parse().ok()).filter(|_| traced) {
                pid = kid;
            }
        }
        let pid = nix::unistd::Pid::from_raw(pid as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        // Well above the cells' grace period (stop_timeout_s, 10 s by default): a hang fails.
        if !wait_until(std::time::Duration::from_secs(60), || matches!(self.child.try_wait(), Ok(Some(_)))) {
            let _ = self.child.kill();
            panic!("sealnode run did not stop within 60 s of SIGTERM");
        }
        let status = self.child.wait().expect("run");
        // sealnode's stderr ends when every process it started is gone: a survivor fails.
        let stderr = self.stderr.take().expect("stderr reader");
        assert!(
            wait_until(READ_LIMIT, || stderr.is_finished()),
            "sealnode exited ({status}) but its stderr stays open: a survivor"
        );
        (status, stderr.join().unwrap_or_default())
    }
}

impl Drop for RunningCell {
    /// A test that fails while a cell runs must not leave it running.
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// How long one sealnode command (or a tool the tests run) may take before the test fails
/// instead of hanging CI. The slowest command is a full `canary --matrix` (five batteries per
/// role); under the whole suite on 2 cores it takes well under a minute, so 5 minutes can only
/// mean a hang.
pub const COMMAND_LIMIT: std::time::Duration = std::time::Duration::from_secs(300);

/// How long a test waits for one line from a socket or pipe of sealnode's.
pub const READ_LIMIT: std::time::Duration = std::time::Duration::from_secs(60);

/// One request on a control socket, its answer line (empty if none came). The write's error
/// is ignored on purpose: a refused peer (or one over the connection limit) is answered at
/// once, without its request being read, so the write may fail with EPIPE while the answer is
/// already waiting to be read, the same as `sealnode ctl` handles it.
pub fn control_request(sock: &std::path::Path, bytes: &[u8]) -> String {
    use std::io::{BufRead, Write};
    let mut s = std::os::unix::net::UnixStream::connect(sock).expect("connect to the control socket");
    s.set_read_timeout(Some(READ_LIMIT)).expect("read timeout");
    let _ = s.write_all(bytes);
    let mut line = String::new();
    std::io::BufReader::new(s).read_line(&mut line).expect("read the control answer");
    line
}

/// `Command::output` with a deadline: a command still running at `limit` is killed and the
/// test fails with what it printed so far. stdin is /dev/null, as with `output()`.
pub trait OutputWithin {
    fn output_within(&mut self, limit: std::time::Duration) -> Output {
        self.try_output_within(limit).unwrap_or_else(|e| panic!("spawn: {e}"))
    }
    /// The same, with a failed spawn returned rather than a panic.
    fn try_output_within(&mut self, limit: std::time::Duration) -> std::io::Result<Output>;
}

impl OutputWithin for Command {
    /// The command runs in its own process group, so a timeout kills everything it started;
    /// and a descendant that outlives it holding the output pipes open fails the test instead
    /// of hanging it (found by review: the readers' join waited for EOF forever).
    fn try_output_within(&mut self, limit: std::time::Duration) -> std::io::Result<Output> {
        use std::os::unix::process::CommandExt;
        let mut child =
            self.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0).spawn()?;
        let group = nix::unistd::Pid::from_raw(-(child.id() as i32));
        let drain = |p: Option<Box<dyn std::io::Read + Send>>| {
            std::thread::spawn(move || {
                let mut b = Vec::new();
                if let Some(mut p) = p {
                    let _ = p.read_to_end(&mut b);
                }
                b
            })
        };
        let out = drain(child.stdout.take().map(|p| Box::new(p) as _));
        let err = drain(child.stderr.take().map(|p| Box::new(p) as _));
        let deadline = std::time::Instant::now() + limit;
        let status = loop {
            if let Some(st) = child.try_wait().expect("wait") {
                break st;
            }
            if std::time::Instant::now() > deadline {
                let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "{:?} {:?} still running after {limit:?}: killed (its whole process group)",
                    self.get_program(),
                    self.get_args().collect::<Vec<_>>(),
                );
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        // Exited; its output ends once nothing else holds the pipes. A descendant that does
        // (a survivor) gets 10 s, then the group is killed and the test fails.
        if !wait_until(std::time::Duration::from_secs(10), || out.is_finished() && err.is_finished()) {
            let _ = nix::sys::signal::kill(group, nix::sys::signal::Signal::SIGKILL);
            panic!(
                "{:?} {:?} exited ({status}), but something it started still holds its output open: killed its process group",
                self.get_program(),
                self.get_args().collect::<Vec<_>>()
            );
        }
        Ok(Output { status, stdout: out.join().unwrap_or_default(), stderr: err.join().unwrap_or_default() })
    }
}

/// Poll `cond` every 10 ms until it holds or `limit` passes; returns whether it held.
pub fn wait_until(limit: std::time::Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = std::time::Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if std::time::Instant::now() > deadline {
            return false;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// MPTCP must be off in a sandbox's netns ("0"). "absent" passes only where the host kernel
/// has no MPTCP at all, and is then reported as a skip (SEALNODE_TEST_REQUIRE=mptcp fails it).
pub fn mptcp_off(value: &str, ctx: &str) {
    if value == "absent" {
        assert!(
            !Path::new("/proc/sys/net/mptcp/enabled").exists(),
            "{ctx}: the host has MPTCP, but the sandbox's netns has no mptcp.enabled to turn it off"
        );
        unavailable("mptcp", "the kernel has no MPTCP: the sysctl that turns it off cannot be checked");
        return;
    }
    assert_eq!(value, "0", "{ctx}: MPTCP is on in the sandbox's netns");
}

/// Wait for `child` to exit, at most `limit`; a child still running then is killed and the
/// test fails.
pub fn wait_within(
    child: &mut std::process::Child,
    limit: std::time::Duration,
    what: &str,
) -> std::process::ExitStatus {
    if !wait_until(limit, || matches!(child.try_wait(), Ok(Some(_)))) {
        let _ = child.kill();
        let _ = child.wait();
        panic!("{what}: still running after {limit:?}: killed");
    }
    child.wait().expect("wait")
}

/// Is `pid` alive (not gone, not a zombie)?
pub fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).map(|s| !s.contains(") Z ")).unwrap_or(false)
}

fn ppid(pid: i32) -> Option<i32> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    s.rsplit_once(") ")?.1.split_whitespace().nth(1)?.parse().ok()
}

/// Every process whose ancestry (up to 10 levels) reaches `root`.
pub fn descendants(root: i32) -> Vec<i32> {
    let all: Vec<i32> =
        std::fs::read_dir("/proc").expect("proc").filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok()).collect();
    all.into_iter()
        .filter(|p| {
            let mut cur = *p;
            for _ in 0..10 {
                match ppid(cur) {
                    Some(pp) if pp == root => return true,
                    Some(pp) if pp > 1 => cur = pp,
                    _ => return false,
                }
            }
            false
        })
        .collect()
}

impl Fixture {
    /// Run the engine under a test policy that lets it connect anywhere and listen on any port
    /// (Ollama-like: the shipped engine policy plus `connect` in the filter, and `connect_any`
    /// and `bind_any` in the Landlock rules): its own network namespace is then what confines it.
    pub fn use_engine_policy_allowing_connect(&mut self) {
        let sc = std::fs::read_to_string(self.p("policy/engine.json")).expect("policy");
        let sc = sc.replacen(
            "\"filter\": [",
            "\"filter\": [\n   {\"syscall\": \"connect\", \"comment\": \"test: connect allowed\"},",
            1,
        );
        write(&self.p("policy/engine-connect.json"), &sc, 0o644, None);
        let ll = std::fs::read_to_string(self.p("policy/engine.toml")).expect("rules");
        let ll =
            ll.replace("connect = []", "connect_any = true").replace("bind = [\"@engine_port\"]", "bind_any = true");
        write(&self.p("policy/engine-connect.toml"), &ll, 0o644, None);
        self.engine_policy = "engine-connect".into();
        self.write_config();
    }
}

/// Lines a process wrote, each with when it arrived.
pub type Lines = std::sync::Arc<std::sync::Mutex<Vec<(std::time::Instant, String)>>>;

/// A `sealnode run` whose stdout and stderr lines are collected as they come (`start`).
pub struct LoggedRun {
    pub child: std::process::Child,
    pub out: Lines,
    pub err: Lines,
    readers: Vec<std::thread::JoinHandle<()>>,
}

impl Drop for LoggedRun {
    /// A test that fails while sealnode runs must not leave it running (its roles die with it).
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn collect(pipe: impl std::io::Read + Send + 'static) -> (Lines, std::thread::JoinHandle<()>) {
    let lines: Lines = std::sync::Arc::default();
    let l2 = lines.clone();
    let t = std::thread::spawn(move || {
        for l in std::io::BufRead::lines(std::io::BufReader::new(pipe)).map_while(Result::ok) {
            l2.lock().expect("lock").push((std::time::Instant::now(), untag(&l)));
        }
    });
    (lines, t)
}

/// `sealnode run` with `envs`, its output collected.
pub fn start_logged(f: &Fixture, envs: &[(&str, &str)]) -> LoggedRun {
    start_logged_in_shell(f, envs, "")
}

/// [`start_logged`] through `/bin/sh -c '<prefix>exec …'` (a prefix sets what the process must
/// have from its first instruction, e.g. `export WATCHDOG_PID=$$; `).
pub fn start_logged_in_shell(f: &Fixture, envs: &[(&str, &str)], prefix: &str) -> LoggedRun {
    let cfg = f.config.display().to_string();
    let mut cmd = f.command(&["run", "--config", &cfg]);
    if !prefix.is_empty() {
        let prog = cmd.get_program().to_owned();
        let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
        let mut sh = Command::new("/bin/sh");
        sh.arg("-c").arg(format!("{prefix}exec \"$@\"")).arg("sh").arg(prog).args(args).current_dir(&f.dir);
        cmd = sh;
    }
    for (k, v) in envs {
        cmd.env(k, v);
    }
    start_logged_command(cmd)
}

/// `cmd` (a `sealnode run` made by [`Fixture::command`], with whatever the test adds) started
/// as [`start_logged`] starts it.
pub fn start_logged_command(mut cmd: Command) -> LoggedRun {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn run");
    let (out, t1) = collect(child.stdout.take().expect("stdout"));
    let (err, t2) = collect(child.stderr.take().expect("stderr"));
    LoggedRun { child, out, err, readers: vec![t1, t2] }
}

impl LoggedRun {
    pub fn pid(&self) -> nix::unistd::Pid {
        nix::unistd::Pid::from_raw(self.child.id() as i32)
    }
    pub fn text(lines: &Lines) -> String {
        lines.lock().expect("lock").iter().map(|(_, l)| format!("{l}\n")).collect()
    }
    pub fn stderr(&self) -> String {
        Self::text(&self.err)
    }
    /// When the first stdout (or stderr) line matching `pred` arrived, waiting up to `secs`.
    pub fn wait(&self, lines: &Lines, secs: u64, pred: impl Fn(&str) -> bool) -> std::time::Instant {
        let mut at = None;
        let found = wait_until(std::time::Duration::from_secs(secs), || {
            at = lines.lock().expect("lock").iter().find(|(_, l)| pred(l)).map(|(t, _)| *t);
            at.is_some()
        });
        assert!(
            found,
            "no matching line within {secs}s; stdout:\n{}\nstderr:\n{}",
            Self::text(&self.out),
            self.stderr()
        );
        at.expect("found")
    }
    pub fn out_line(&self, secs: u64, pred: impl Fn(&str) -> bool) -> std::time::Instant {
        self.wait(&self.out, secs, pred)
    }
    pub fn err_line(&self, secs: u64, pred: impl Fn(&str) -> bool) -> std::time::Instant {
        self.wait(&self.err, secs, pred)
    }
    /// Wait for sealnode to exit by itself; (exit code, stderr).
    pub fn exited(mut self, secs: u64) -> (Option<i32>, String) {
        let st = wait_within(&mut self.child, std::time::Duration::from_secs(secs), "sealnode run");
        for t in self.readers.drain(..) {
            assert!(wait_until(READ_LIMIT, || t.is_finished()), "sealnode's output still open after it exited");
        }
        (st.code(), self.stderr())
    }
    /// SIGTERM; (exit code, seconds it took, stderr).
    pub fn stop(self) -> (Option<i32>, f64, String) {
        let t = std::time::Instant::now();
        let _ = nix::sys::signal::kill(self.pid(), nix::sys::signal::Signal::SIGTERM);
        let (code, err) = self.exited(30);
        (code, t.elapsed().as_secs_f64(), err)
    }
}

/// The fields of each line of sealnode's log (text format) whose message is exactly `msg`:
/// `... INFO egress totals upstream=gw:443 accepted=1` gives `{upstream: gw:443, accepted: 1}`.
/// A check then reads the field it means, not a substring another line or value also holds
/// (`accepted=1` in `accepted=10`).
pub fn log_fields(log: &str, msg: &str) -> Vec<std::collections::BTreeMap<String, String>> {
    log.lines()
        .filter_map(|l| {
            // `<timestamp> <LEVEL> <message> <key=value ...>`
            let (_, rest) = l.trim_start().split_once(' ')?;
            let (level, after) = rest.trim_start().split_once(' ')?;
            if !["TRACE", "DEBUG", "INFO", "WARN", "ERROR"].contains(&level) {
                return None;
            }
            let rest = after.trim_start().strip_prefix(msg)?;
            if !(rest.is_empty() || rest.starts_with(' ')) {
                return None;
            }
            Some(
                rest.split_whitespace()
                    .filter_map(|kv| kv.split_once('='))
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            )
        })
        .collect()
}

/// The one log line with message `msg` whose field `key` is `value` (panics naming the log
/// otherwise).
pub fn log_line_with(log: &str, msg: &str, key: &str, value: &str) -> std::collections::BTreeMap<String, String> {
    let hits: Vec<_> =
        log_fields(log, msg).into_iter().filter(|f| f.get(key).map(String::as_str) == Some(value)).collect();
    assert_eq!(hits.len(), 1, "exactly one {msg:?} line with {key}={value} expected in:\n{log}");
    hits.into_iter().next().expect("one")
}

/// The lines `r` yields (a child's stdout, untagged), delivered through a channel by a thread,
/// so every wait for one has a deadline ([`next_line`], [`try_next_line`], [`lines_until`]).
pub fn line_channel(r: impl std::io::Read + Send + 'static) -> std::sync::mpsc::Receiver<String> {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in std::io::BufRead::lines(std::io::BufReader::new(r)).map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

/// Every line from `lines` up to and including the first that `pred` accepts, within `secs`;
/// panics with the lines seen when the time passes or the writer closes first.
pub fn lines_until(lines: &std::sync::mpsc::Receiver<String>, secs: u64, pred: impl Fn(&str) -> bool) -> Vec<String> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    let mut seen = Vec::new();
    loop {
        match lines.recv_timeout(deadline.saturating_duration_since(std::time::Instant::now())) {
            Ok(l) => {
                let done = pred(&l);
                seen.push(l);
                if done {
                    return seen;
                }
            }
            Err(e) => panic!("no matching line within {secs}s ({e}); seen:\n{}", seen.join("\n")),
        }
    }
}

/// The gate's measurement process (named `sealnode-gate`), while one runs as a child of the
/// supervisor `sealnode`: found and stopped with SIGSTOP, it holds a pass through the gate open
/// for as long as a test needs (SIGCONT lets it finish; the supervisor's SIGKILL ends it).
pub fn stop_gate_measurement(sealnode: i32, secs: u64) -> nix::unistd::Pid {
    stop_child_named(sealnode, "sealnode-gate", secs)
}

/// A child of `sealnode` whose name (comm) is `name` (`sealnode-gate`, `sealnode-wipe`), found
/// within `secs` and stopped with SIGSTOP.
pub fn stop_child_named(sealnode: i32, name: &str, secs: u64) -> nix::unistd::Pid {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    loop {
        let kids = std::fs::read_to_string(format!("/proc/{sealnode}/task/{sealnode}/children")).unwrap_or_default();
        let found = kids
            .split_whitespace()
            .find(|p| {
                // A child that already exited (a zombie) keeps its name: not one to hold.
                let alive = std::fs::read_to_string(format!("/proc/{p}/stat"))
                    .is_ok_and(|s| s.rsplit_once(") ").is_some_and(|(_, r)| !r.starts_with('Z')));
                alive && std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == name)
            })
            .and_then(|p| p.parse::<i32>().ok());
        if let Some(p) = found {
            let pid = nix::unistd::Pid::from_raw(p);
            nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).expect("SIGSTOP the child");
            return pid;
        }
        assert!(std::time::Instant::now() < deadline, "no {name} under pid {sealnode} within {secs} s");
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// CPU time (user + system) a process has used so far.
pub fn cpu_time(pid: i32) -> std::time::Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    let rest = stat.rsplit_once(") ").map(|(_, r)| r).expect("stat format");
    let f: Vec<u64> = rest.split_whitespace().map(|x| x.parse().unwrap_or(0)).collect();
    // utime and stime are fields 14 and 15 of the whole line (11 and 12 after the name).
    // SAFETY: sysconf takes a plain integer.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    std::time::Duration::from_millis((f[11] + f[12]) * 1000 / hz)
}

/// The real engine and node from the test cache (scripts/prepare-python, scripts/build-llama-server):
/// llama-server, its model, the interpreter copy and the prefix it is bound at, the venv.
pub struct Real {
    pub server: String,
    pub model: String,
    pub pycopy: String,
    pub prefix: String,
    pub venv: String,
}

/// [`Real`], when every part of it is there (the callers record the skip).
pub fn real() -> Option<Real> {
    let v = |k: &str| std::env::var(k).ok().filter(|p| std::path::Path::new(p).exists());
    Some(Real {
        server: v("SEALNODE_TEST_LLAMA_SERVER")?,
        model: v("SEALNODE_TEST_MODEL")?,
        pycopy: v("SEALNODE_TEST_PYTHON")?,
        prefix: std::env::var("SEALNODE_TEST_PYTHON_PREFIX").ok()?,
        venv: v("SEALNODE_TEST_VENV")?,
    })
}

/// The character device `path` (`major:minor`, `mode`), replacing one left there by an earlier
/// run; the mode is set again after mknod (the umask narrows it).
pub fn mknod_char(path: &Path, mode: u32, major: u64, minor: u64) {
    let _ = std::fs::remove_file(path);
    nix::sys::stat::mknod(
        path,
        nix::sys::stat::SFlag::S_IFCHR,
        nix::sys::stat::Mode::from_bits_truncate(mode),
        nix::sys::stat::makedev(major, minor),
    )
    .expect("mknod a test device");
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// One file of a Kubernetes volume ([`kubelet_volume`]): its name, bytes, mode and owner.
pub struct VolumeFile<'a> {
    pub name: &'a str,
    pub contents: &'a [u8],
    pub mode: u32,
    pub owner: Option<(u32, u32)>,
}

/// Writes `files` into `root` (which exists) as kubelet's atomic writer does for a ConfigMap
/// or Secret volume: the files in a new `..<timestamp>` dir (0755), `..data_tmp` -> it renamed
/// over `..data` (one atomic swap), a `NAME -> ..data/NAME` link per file where there is none
/// yet, then the previous timestamped dir removed. Returns the new timestamped dir. The
/// first call makes the volume; each later one is an update.
pub fn kubelet_volume(root: &Path, files: &[VolumeFile]) -> PathBuf {
    let old = std::fs::read_link(root.join("..data")).ok();
    let mut n = 0;
    let stamp = loop {
        let s = format!("..2026_12_03_10_00_{n:02}.123456789");
        if !root.join(&s).exists() {
            break s;
        }
        n += 1;
    };
    let dir = root.join(&stamp);
    mkdir(&dir, 0o755, None);
    for f in files {
        let p = dir.join(f.name);
        std::fs::write(&p, f.contents).expect("write");
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(f.mode)).expect("chmod");
        if let Some((u, g)) = f.owner {
            chown(&p, Some(u), Some(g)).expect("chown");
        }
    }
    std::os::unix::fs::symlink(&stamp, root.join("..data_tmp")).expect("..data_tmp");
    std::fs::rename(root.join("..data_tmp"), root.join("..data")).expect("rename ..data_tmp ..data");
    for f in files {
        if std::fs::symlink_metadata(root.join(f.name)).is_err() {
            std::os::unix::fs::symlink(format!("..data/{}", f.name), root.join(f.name)).expect("link");
        }
    }
    if let Some(old) = old {
        std::fs::remove_dir_all(root.join(old)).expect("remove the old timestamped dir");
    }
    dir
}

/// A host upstream on 127.0.0.1 that greets every connection with "hello\n"; the listener is
/// kept open while the returned handle lives.
pub fn greeter() -> (std::net::TcpListener, u16) {
    use std::io::Write;
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let l2 = l.try_clone().expect("clone");
    std::thread::spawn(move || {
        for mut s in l2.incoming().flatten() {
            let _ = s.write_all(b"hello\n");
        }
    });
    (l, port)
}
