//! `sealnode run`: real cells as root and as an unprivileged user.

mod common;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpListener;
use std::os::fd::AsRawFd;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{UnixDatagram, UnixListener};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::*;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;

const ENGINE_PORT: u16 = 18080;

/// A host-side upstream that answers every connection with a greeting.
fn upstream(greeting: &'static str) -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = l.local_addr().expect("addr").port();
    let l2 = l.try_clone().expect("clone");
    std::thread::spawn(move || {
        for s in l2.incoming().flatten() {
            let mut s = s;
            let _ = s.write_all(greeting.as_bytes());
        }
    });
    (l, port)
}

/// A cell fixture: sealnode's binary is visible read-only at /opt/sealnode in both roles.
fn cell(
    mode: Mode,
    name: &str,
    engine_sh: &str,
    node_sh: &str,
    extra_node: &str,
    extra_engine: &str,
    cell_extra: &str,
) -> Fixture {
    let mut f = Fixture::new(mode, name);
    std::fs::write(f.p("models/hello.txt"), "hello from the sealed engine\n").expect("write");
    let q = |s: &str| serde_json::to_string(s).expect("quote");
    f.engine_cmd = format!("[\"/usr/bin/busybox\", \"sh\", \"-c\", {}]", q(engine_sh));
    f.node_cmd = format!("[\"/usr/bin/busybox\", \"sh\", \"-c\", {}]", q(node_sh));
    let bin = f.p("bin").display().to_string();
    f.engine_extra = format!("ro_binds = [{{ src = \"{bin}\", dst = \"/opt/sealnode\" }}]\n{extra_engine}");
    f.node_extra = format!("ro_binds = [{{ src = \"{bin}\", dst = \"/opt/sealnode\" }}]\n{extra_node}");
    f.cell_extra = format!("stop_timeout_s = 2\n{cell_extra}");
    f.write_config();
    f
}

const HTTPD: &str = "exec /usr/bin/busybox httpd -f -p 127.0.0.1:18080 -h /models";

struct Running {
    child: Child,
    lines: mpsc::Receiver<String>,
    /// What sealnode wrote to stderr so far, and whether the pipe reached EOF.
    stderr: std::sync::Arc<std::sync::Mutex<(String, bool)>>,
}

impl Drop for Running {
    /// A test that fails while sealnode runs must not leave it running (its roles die with it).
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn start(f: &Fixture, envs: &[(&str, &str)]) -> Running {
    start_with(f, envs, false)
}

/// `watchdog_pid`: export WATCHDOG_PID as systemd does (the pid of sealnode itself): a shell
/// exports its own pid and execs the launcher command, which keeps the pid.
fn start_with(f: &Fixture, envs: &[(&str, &str)], watchdog_pid: bool) -> Running {
    start_in_shell(f, envs, if watchdog_pid { "export WATCHDOG_PID=$$; " } else { "" })
}

/// `sealnode run` started through `/bin/sh -c '<prefix>exec …'` (a prefix may set limits or
/// variables the process must have from its first instruction).
fn start_in_shell(f: &Fixture, envs: &[(&str, &str)], prefix: &str) -> Running {
    let cfg = f.config.display().to_string();
    let mut cmd = f.command(&["run", "--config", &cfg]);
    if !prefix.is_empty() {
        let prog = cmd.get_program().to_owned();
        let args: Vec<_> = cmd.get_args().map(|a| a.to_owned()).collect();
        let mut sh = std::process::Command::new("/bin/sh");
        sh.arg("-c").arg(format!("{prefix}exec \"$@\"")).arg("sh").arg(prog).args(args).current_dir(&f.dir);
        cmd = sh;
    }
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    for (k, v) in envs {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("spawn run");
    let out = child.stdout.take().expect("stdout");
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            let _ = tx.send(untag(&l));
        }
    });
    let stderr = std::sync::Arc::new(std::sync::Mutex::new((String::new(), false)));
    let mut err = child.stderr.take().expect("stderr");
    let e2 = stderr.clone();
    std::thread::spawn(move || {
        let mut b = [0u8; 4096];
        while let Ok(n) = err.read(&mut b) {
            if n == 0 {
                break;
            }
            e2.lock().expect("lock").0.push_str(&String::from_utf8_lossy(&b[..n]));
        }
        e2.lock().expect("lock").1 = true;
    });
    Running { child, lines, stderr }
}

impl Running {
    /// The next stdout line matching `pred`, within `secs`.
    fn line(&self, secs: u64, pred: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if pred(&l) => return l,
                Ok(_) => continue,
                Err(_) => panic!("no matching output within {secs}s; stderr:\n{}", self.stderr()),
            }
        }
    }
    /// Wait up to `secs` for `needle` in sealnode's stderr; fail with `what` and the log.
    fn wait_stderr(&self, secs: u64, needle: &str, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(secs);
        while !self.stderr().contains(needle) {
            assert!(Instant::now() < deadline, "{what}: {}", self.stderr());
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    fn stderr(&self) -> String {
        self.stderr.lock().expect("lock").0.clone()
    }
    /// Everything sealnode wrote to stderr, once it has exited: waits for the pipe's EOF (the
    /// reader thread's mark), not for a guessed time.
    fn stderr_after_exit(&self) -> String {
        let done = wait_until(READ_LIMIT, || self.stderr.lock().expect("lock").1);
        assert!(done, "sealnode's stderr still open {READ_LIMIT:?} after it exited");
        self.stderr()
    }
    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }
    /// SIGTERM and wait; returns (exit code, seconds it took).
    fn stop(mut self) -> (Option<i32>, f64, String) {
        let t = Instant::now();
        let _ = kill(self.pid(), Signal::SIGTERM);
        let st = wait_timeout(&mut self.child, 20);
        let secs = t.elapsed().as_secs_f64();
        (st, secs, self.stderr_after_exit())
    }
}

fn wait_timeout(child: &mut Child, secs: u64) -> Option<i32> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Ok(Some(st)) = child.try_wait() {
            return st.code();
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("sealnode run did not exit within {secs}s");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn report(line: &str) -> serde_json::Value {
    serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"))
}

#[test]
fn cell_isolation_egress_and_clean_stop() {
    for mode in modes() {
        let (_up, up_port) = upstream("hello-from-upstream\n");
        let (_other, other_port) = upstream("undeclared\n");
        let abs_name = format!("sealnode-test-{}-{mode:?}", std::process::id());
        let abs = UnixListener::bind_addr(
            &std::os::unix::net::SocketAddr::from_abstract_name(abs_name.as_bytes()).expect("abs"),
        )
        .expect("abstract listener");
        let engine_sh = format!(
            "/opt/sealnode/sealnode __probe-inside --connect 127.0.0.1:{ENGINE_PORT} --connect 127.0.0.1:{up_port} --stat /dev/fuse --stat /dev/net/tun --write /models/x; {HTTPD}"
        );
        let node_sh = format!(
            "echo state > /scratch/state; /opt/sealnode/sealnode __probe-inside --fetch 127.0.0.1:{ENGINE_PORT} --fetch gw.test:{up_port} --connect 127.0.0.1:{up_port} --connect 127.0.0.1:{other_port} --connect-abstract {abs_name} --stat /dev/fuse --bind 127.0.0.1:18081; exec sleep 1000"
        );
        let node_extra =
            format!("egress = [{{ host = \"gw.test\", port = {up_port}, connect = \"127.0.0.1:{up_port}\" }}]");
        let f = cell(
            mode,
            "iso",
            &engine_sh,
            &node_sh,
            &node_extra,
            "devices = [\"/dev/fuse\"]\nready = { kind = \"http\", path = \"/hello.txt\" }",
            "",
        );
        std::fs::write(f.p("engine-scratch/stale"), "x").ok();
        let run = start(&f, &[]);
        let e = report(&run.line(30, |l| l.contains("\"ENGINE_ONLY\"")));
        let n = report(&run.line(30, |l| l.contains("\"FRUTEBOX_ENGINE\"")));
        let ctx = format!("{mode:?}");
        // The cell's netns, which both roles share: TCP Fast Open and MPTCP off.
        for r in [&e, &n] {
            assert_eq!(r["net_sysctls"]["ipv4/tcp_fastopen"], "0", "{ctx}: {r}");
            mptcp_off(r["net_sysctls"]["mptcp/enabled"].as_str().unwrap_or("?"), &ctx);
        }
        // The engine: no connect at all (seccomp), not even to itself or the upstream's port.
        refused(&e, &format!("connect:127.0.0.1:{ENGINE_PORT}"), &[libc::ENOSYS]);
        refused(&e, &format!("connect:127.0.0.1:{up_port}"), &[libc::ENOSYS]);
        refused(&e, "write:/models/x", &[libc::EROFS, libc::EACCES]);
        // The declared device is in the engine's view only; undeclared ones nowhere.
        assert_eq!(attempt(&e, "stat:/dev/fuse")["ok"], true, "{ctx}: declared device missing in the engine");
        refused(&e, "stat:/dev/net/tun", &[libc::ENOENT]);
        refused(&n, "stat:/dev/fuse", &[libc::ENOENT]);
        // The node reaches the engine, and the upstream only through declared egress.
        assert_eq!(attempt(&n, &format!("fetch:127.0.0.1:{ENGINE_PORT}"))["ok"], true, "{ctx}: node -> engine: {n}");
        assert_eq!(
            attempt(&n, &format!("fetch:gw.test:{up_port}"))["ok"],
            true,
            "{ctx}: node -> egress -> upstream: {n}"
        );
        // The host's loopback is not the cell's (netns), even on an allowed port.
        refused(&n, &format!("connect:127.0.0.1:{up_port}"), &[libc::ECONNREFUSED]);
        // An undeclared port: Landlock.
        refused(&n, &format!("connect:127.0.0.1:{other_port}"), &[libc::EACCES]);
        // No role creates an AF_UNIX socket at all (seccomp: only connected stream pairs); the
        // host's abstract sockets would also be in the host's netns, and Landlock-scoped.
        refused(&n, &format!("connect-abstract:{abs_name}"), &[libc::ENOSYS]);
        // The node filter has no bind (seccomp); Landlock grants it no port either.
        refused(&n, "bind:127.0.0.1:18081", &[libc::ENOSYS]);
        // Neither sees the other's processes: each pid namespace holds init, sh and the probe.
        for (r, who) in [(&e, "engine"), (&n, "node")] {
            let pids = r["pids"].as_array().expect("pids").len();
            assert!(pids <= 3, "{ctx}: {who} sees {pids} pids: {}", r["pids"]);
            assert_eq!(r["interfaces"].as_object().expect("ifs").len(), 1, "{ctx}: {who} interfaces");
        }
        drop(abs);
        let (code, secs, err) = run.stop();
        assert_eq!(code, Some(0), "{ctx}: {err}");
        assert!(secs < 5.0, "{ctx}: stop took {secs}s");
        // Scratch wiped on stop, model dir untouched.
        for d in ["engine-scratch", "node-scratch"] {
            let left: Vec<_> = std::fs::read_dir(f.p(d)).expect("scratch").collect();
            assert!(left.is_empty(), "{ctx}: {d} not wiped: {left:?}");
        }
        assert!(f.p("models/hello.txt").exists() && f.p("models/model.gguf").exists(), "{ctx}: model dir touched");
        log_line_with(&err, "egress totals", "upstream", &format!("gw.test:{up_port}"));
    }
}

#[test]
fn supervisor_sigkill_leaves_nothing_behind() {
    for mode in modes() {
        let f = cell(mode, "kill", HTTPD, "echo node-up; exec sleep 1000", "", "", "");
        let mut run = start(&f, &[]);
        run.line(30, |l| l == "node-up");
        let sup = run.child.id() as i32;
        let mut tree = descendants(sup);
        assert!(tree.len() >= 4, "{mode:?}: expected cell init, two role inits and workloads: {tree:?}");
        kill(run.pid(), Signal::SIGKILL).expect("kill");
        let _ = run.child.wait();
        all_die(&mut tree, &format!("{mode:?}: survived the supervisor"));
    }
}

/// The processes in `tree` must all be gone. The kernel kills them at once (parent-death
/// signal, pid namespace teardown) but reaps them asynchronously; on a loaded 2-core machine
/// that has taken a few hundred ms. 10 s cannot hide a survivor: every workload here sleeps
/// for 1000 s or loops forever.
fn all_die(tree: &mut Vec<i32>, what: &str) {
    let gone = wait_until(Duration::from_secs(10), || {
        tree.retain(|p| alive(*p));
        tree.is_empty()
    });
    assert!(gone, "{what} by 10 s: {tree:?}");
}

#[test]
fn crashed_engine_is_restarted_and_the_node_reconnects() {
    for mode in modes() {
        // First run: serve until the node has fetched once (httpd logs the request), then
        // crash. Later runs: serve. No guessed time: the crash follows the node's first OK.
        let engine_sh = format!(
            "if [ ! -e /scratch/crashed ]; then : > /scratch/crashed; /usr/bin/busybox httpd -f -vv -p 127.0.0.1:18080 -h /models 2> /scratch/log & while ! /usr/bin/busybox grep -q response:200 /scratch/log; do sleep 0.05; done; kill $!; exit 3; fi; {HTTPD}"
        );
        let node_sh = "while true; do if /usr/bin/busybox wget -q -O /dev/null http://127.0.0.1:18080/hello.txt; then echo OK; else echo FAIL; fi; sleep 0.1; done";
        // With no hold (engine_hold_s = 0) the node's requests fail while the engine is down,
        // then succeed again; with the default hold they wait for it and none fails.
        for (cell_extra, hold) in [("engine_hold_s = 0", false), ("", true)] {
            let f = cell(mode, "restart", &engine_sh, node_sh, "", "restart = \"on-failure\"", cell_extra);
            let run = start(&f, &[]);
            run.line(30, |l| l == "OK");
            if hold {
                run.wait_stderr(30, "restarts=1", "the engine's crash");
                let deadline = Instant::now() + Duration::from_secs(30);
                let mut after = 0;
                while after < 3 {
                    let left = deadline.saturating_duration_since(Instant::now());
                    let l = run.lines.recv_timeout(left).unwrap_or_else(|_| panic!("{mode:?}: {}", run.stderr()));
                    assert_ne!(l, "FAIL", "{mode:?}: a request failed across the engine's restart: {}", run.stderr());
                    after += usize::from(
                        l == "OK"
                            && run.stderr().contains("role started role=engine pid")
                            && run.stderr().contains("generation=2"),
                    );
                }
            } else {
                run.line(30, |l| l == "FAIL");
                run.line(30, |l| l == "OK");
            }
            let (code, _, err) = run.stop();
            assert_eq!(code, Some(0), "{mode:?}: {err}");
            assert!(err.contains("role exited; restarting") && err.contains("code=3"), "{mode:?}: {err}");
        }
    }
}

#[test]
fn crashed_role_without_restart_stops_the_cell() {
    for mode in modes() {
        let f = cell(
            mode,
            "norestart",
            "/usr/bin/busybox httpd -f -p 127.0.0.1:18080 -h /models & sleep 1; exit 7",
            "echo node-up; exec sleep 1000",
            "",
            "",
            "",
        );
        let mut run = start(&f, &[]);
        run.line(30, |l| l == "node-up");
        // Recorded while the cell runs: once sealnode has exited, nothing has its pid as an
        // ancestor any more (survivors are reparented), so only this list can show one.
        let mut tree = descendants(run.child.id() as i32);
        assert!(tree.len() >= 4, "{mode:?}: expected cell init, two role inits and workloads: {tree:?}");
        let code = wait_timeout(&mut run.child, 20);
        let err = run.stderr_after_exit();
        assert_eq!(code, Some(1), "{mode:?}: {err}");
        assert!(err.contains("engine exited with status 7"), "{mode:?}: {err}");
        all_die(&mut tree, &format!("{mode:?}: survived the cell's stop"));
    }
}

#[test]
fn grace_period_then_sigkill() {
    for mode in modes() {
        let f = cell(mode, "grace", HTTPD, "trap '' TERM; echo node-up; while true; do sleep 1; done", "", "", "");
        let run = start(&f, &[]);
        run.line(30, |l| l == "node-up");
        let (code, secs, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        assert!((1.5..6.0).contains(&secs), "{mode:?}: stop took {secs}s (grace 2s)");
        assert!(err.contains("grace period over; SIGKILL"), "{mode:?}: {err}");
    }
}

#[test]
fn sd_notify_messages_arrive_in_order() {
    for mode in modes() {
        let f = cell(mode, "notify", HTTPD, "echo node-up; exec sleep 1000", "", "", "");
        let ns = notify_socket(&f);
        let run = start(&f, &[("NOTIFY_SOCKET", ns.path.as_str())]);
        run.line(30, |l| l == "node-up");
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        let msgs = ns.until_stopping();
        let pos = |needle: &str| msgs.iter().position(|m| m.lines().any(|l| l == needle || l.starts_with(needle)));
        let started = pos("STATUS=engine started").unwrap_or_else(|| panic!("{mode:?}: {msgs:?}"));
        let ready = pos("READY=1").unwrap_or_else(|| panic!("{mode:?}: no READY: {msgs:?}"));
        let stopping = pos("STOPPING=1").unwrap_or_else(|| panic!("{mode:?}: no STOPPING: {msgs:?}"));
        assert!(started < ready && ready < stopping, "{mode:?}: order: {msgs:?}");
        assert_eq!(msgs.iter().filter(|m| m.contains("READY=1")).count(), 1, "{mode:?}: READY once: {msgs:?}");
    }
}

/// A NOTIFY_SOCKET that is drained continuously, as systemd does (a datagram queue holds only
/// net.unix.max_dgram_qlen messages; a sender then blocks).
struct NotifySocket {
    path: String,
    msgs: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl NotifySocket {
    /// Every message up to and including STOPPING=1, the last one sealnode sends before it
    /// exits: the receiver thread may still be draining the queue when sealnode is gone.
    fn until_stopping(&self) -> Vec<String> {
        let done = wait_until(READ_LIMIT, || self.msgs.lock().expect("lock").iter().any(|m| m.contains("STOPPING=1")));
        assert!(done, "no STOPPING=1 within {READ_LIMIT:?}: {:?}", self.msgs.lock().expect("lock"));
        self.msgs.lock().expect("lock").clone()
    }
}

fn notify_socket(f: &Fixture) -> NotifySocket {
    use std::os::unix::fs::PermissionsExt;
    let path = f.p("notify.sock");
    let sock = UnixDatagram::bind(&path).expect("bind notify socket");
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let msgs = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let m2 = msgs.clone();
    std::thread::spawn(move || {
        let mut b = [0u8; 4096];
        while let Ok(n) = sock.recv(&mut b) {
            m2.lock().expect("lock").push(String::from_utf8_lossy(&b[..n]).into_owned());
        }
    });
    NotifySocket { path: path.display().to_string(), msgs }
}

fn sha256_of(path: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(std::fs::read(path).expect("read")))
}

#[test]
fn engine_binary_pin_is_enforced() {
    for mode in modes() {
        let good = sha256_of("/usr/bin/busybox");
        let f = cell(mode, "pin", HTTPD, "echo node-up; exec sleep 1000", "", &format!("sha256 = \"{good}\""), "");
        let run = start(&f, &[]);
        run.line(30, |l| l == "node-up");
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: pinned binary must start: {err}");
        let bad = "0".repeat(64);
        let f = cell(mode, "pin-bad", HTTPD, "echo node-up; exec sleep 1000", "", &format!("sha256 = \"{bad}\""), "");
        let cfg = f.config.display().to_string();
        let o = f.command(&["run", "--config", &cfg]).output_within(COMMAND_LIMIT);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{mode:?}: {err}");
        assert!(
            err.contains("engine.sha256")
                && err.contains(&format!("expected sha256 {bad}"))
                && err.contains(&format!("found {good}")),
            "{mode:?}: {err}"
        );
        assert!(!String::from_utf8_lossy(&o.stdout).contains("node-up"), "{mode:?}: the node started anyway");
    }
}

#[test]
fn orphaned_grandchildren_are_reaped() {
    for mode in modes() {
        // The subshell exits at once, orphaning its sleep; the orphan exits 0.2 s later. Only
        // the role's init can reap it.
        let node_sh =
            "( /usr/bin/busybox sleep 0.2 & ); sleep 1; /opt/sealnode/sealnode __probe-inside; exec sleep 1000";
        let f = cell(mode, "zombies", HTTPD, node_sh, "", "", "");
        let run = start(&f, &[]);
        let n = report(&run.line(30, |l| l.contains("\"FRUTEBOX_ENGINE\"")));
        assert_eq!(n["zombies"], serde_json::json!([]), "{mode:?}: unreaped: {n}");
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
    }
}

#[test]
fn sighup_restarts_both_roles_and_keeps_running() {
    for mode in modes() {
        let f = cell(mode, "hup", HTTPD, "echo node-up; exec sleep 1000", "", "", "");
        let run = start(&f, &[]);
        run.line(30, |l| l == "node-up");
        kill(run.pid(), Signal::SIGHUP).expect("hup");
        run.line(30, |l| l == "node-up");
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        assert!(err.contains("restarting both roles"), "{mode:?}: {err}");
        assert_eq!(err.matches("role started role=node").count(), 2, "{mode:?}: {err}");
    }
}

#[test]
fn egress_is_bounded_and_idle_connections_close() {
    for mode in modes() {
        // An upstream that keeps every connection open and greets it.
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in l.incoming().flatten() {
                let mut s = s;
                let _ = s.write_all(b"hi\n");
                held.push(s);
            }
        });
        // One connection held open by nc (the probe starts once nc got the greeting, so the
        // connection is up); a second (the probe's fetch) is over the limit.
        let node_sh = format!(
            "/usr/bin/busybox nc gw.test {port} > /scratch/held & while [ ! -s /scratch/held ]; do sleep 0.05; done; /opt/sealnode/sealnode __probe-inside --fetch gw.test:{port}; exec sleep 1000"
        );
        let node_extra = format!("egress = [{{ host = \"gw.test\", port = {port}, connect = \"127.0.0.1:{port}\" }}]");
        let f = cell(
            mode,
            "bounds",
            HTTPD,
            &node_sh,
            &node_extra,
            "",
            // 5 s idle: the probe's fetch (tens of ms after nc's greeting) must come while the
            // held connection is still open, even on a loaded machine.
            "egress_max_connections = 1\negress_idle_timeout_s = 5",
        );
        let run = start(&f, &[]);
        let n = report(&run.line(30, |l| l.contains("\"FRUTEBOX_ENGINE\"")));
        refused(&n, &format!("fetch:gw.test:{port}"), &[]);
        // The held connection goes idle and is closed after 5 s.
        run.wait_stderr(30, "egress connection closed: idle", &format!("{mode:?}: idle connection not closed"));
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        assert!(err.contains("egress connection refused: limit reached"), "{mode:?}: {err}");
        let totals = err.lines().find(|l| l.contains("egress totals")).unwrap_or_else(|| panic!("{mode:?}: {err}"));
        let field =
            |k: &str| totals.split_whitespace().find_map(|w| w.strip_prefix(k)?.strip_prefix('=')).unwrap_or("missing");
        assert_eq!((field("accepted"), field("refused")), ("1", "1"), "{mode:?}: {totals}");
    }
}

/// The scratch wipe runs with the cell's authority, not the host's: what a role left (nested,
/// read-only dirs included) is gone before the next start, in both modes; a leftover of
/// another host user (rootful) refuses the start, naming the dir, and nothing runs (the unit
/// has no CAP_DAC_OVERRIDE; a failed wipe used to be only a warning).
#[test]
fn scratch_is_wiped_as_the_cell_and_a_foreign_leftover_refuses_the_start() {
    use std::os::unix::fs::{chown, PermissionsExt};
    for mode in modes() {
        let f = cell(mode, "wipe", HTTPD, "exec sleep 1000", "", "", "");
        let owner = match mode {
            Mode::Rootful => NODE_IDS,
            Mode::Rootless if is_root() => (NOBODY, NOBODY),
            Mode::Rootless => (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw()),
        };
        // What a role could have left: a nested tree with a read-only dir, all its own.
        let scratch = f.p("node-scratch");
        std::fs::create_dir_all(scratch.join("a/b")).expect("mkdir");
        std::fs::write(scratch.join("a/b/state"), "old").expect("write");
        for p in ["a", "a/b", "a/b/state"] {
            chown(scratch.join(p), Some(owner.0), Some(owner.1)).expect("chown");
        }
        std::fs::set_permissions(scratch.join("a"), std::fs::Permissions::from_mode(0o500)).expect("chmod");
        // The scratch dir itself left without permissions (its owner, the role, may chmod it):
        // `run` gives its owner's back, as the owner, and locks and wipes it.
        std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o000)).expect("chmod");
        let run = start(&f, &[]);
        run.wait_stderr(30, "role started role=node", &format!("{mode:?}: the node did not start"));
        let mode_now = std::fs::metadata(&scratch).expect("scratch").permissions().mode() & 0o7777;
        assert_eq!(mode_now, 0o700, "{mode:?}");
        let left: Vec<_> = std::fs::read_dir(&scratch).expect("scratch").flatten().map(|e| e.file_name()).collect();
        assert!(left.is_empty(), "{mode:?}: not wiped before the start: {left:?}");
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        if mode != Mode::Rootful {
            continue;
        }
        // Another host user's dir, with a file in it: nobody in the cell may remove that file
        // (root's own leftovers are removed: the wipe runs with sealnode's host uid).
        std::fs::create_dir(scratch.join("foreign")).expect("mkdir");
        std::fs::write(scratch.join("foreign/file"), "x").expect("write");
        chown(scratch.join("foreign"), Some(12345), Some(12345)).expect("chown");
        let o = f.command(&["run", "--config", &f.config.display().to_string()]).output_within(COMMAND_LIMIT);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{mode:?}: {err}");
        assert!(err.contains("cannot wipe node.scratch") && err.contains(&scratch.display().to_string()), "{err}");
        assert!(!err.contains("role started"), "{mode:?}: a role started: {err}");
        // Said like any stop (and to systemd: STOPPING=1), though the loop never ran a role.
        assert!(err.contains("cell stopped code=125"), "{mode:?}: {err}");
        assert!(scratch.join("foreign/file").exists(), "{mode:?}");
    }
}

/// Rootful sealnode with only the unit's capabilities (CAP_SETUID, CAP_SETGID: no
/// CAP_DAC_OVERRIDE, no CAP_KILL) starts over role leftovers in a 0700 scratch dir, signals
/// the roles and wipes their scratch (found in the guest: a plain root test passed while the
/// unit could not open the role's dir).
#[test]
fn rootful_with_only_the_units_capabilities_wipes_and_stops_the_roles() {
    if !modes().contains(&Mode::Rootful) {
        return;
    }
    use std::os::unix::fs::{chown, PermissionsExt};
    let f = cell(Mode::Rootful, "unitcaps", HTTPD, "trap '' TERM; exec sleep 1000", "", "", "");
    let scratch = f.p("node-scratch");
    std::fs::create_dir_all(scratch.join("a/b")).expect("mkdir");
    std::fs::write(scratch.join("a/b/state"), "old").expect("write");
    for p in ["a", "a/b", "a/b/state"] {
        chown(scratch.join(p), Some(NODE_IDS.0), Some(NODE_IDS.1)).expect("chown");
    }
    std::fs::write(scratch.join("root-file"), "x").expect("write");
    // Without CAP_DAC_OVERRIDE, the lock opens the role's dir as its owner (and gives the owner
    // back what the role took away).
    std::fs::set_permissions(&scratch, std::fs::Permissions::from_mode(0o000)).expect("chmod");
    let run = start_in_shell(
        &f,
        &[],
        "set -- /usr/bin/setpriv --bounding-set -all,+setuid,+setgid --inh-caps -all -- \"$@\"; ",
    );
    run.wait_stderr(30, "role started role=node", "the unit's capabilities did not start the cell");
    assert_eq!(std::fs::read_dir(&scratch).expect("scratch").count(), 0, "not wiped: {}", run.stderr());
    std::fs::write(scratch.join("root-file"), "x").expect("write");
    // The node ignores SIGTERM: the SIGKILL after the grace period needs no CAP_KILL either.
    let (code, secs, err) = run.stop();
    assert_eq!(code, Some(0), "{err}");
    assert!(secs < 10.0, "stop took {secs:.1}s: {err}");
    assert_eq!(std::fs::read_dir(&scratch).expect("scratch").count(), 0, "not wiped at stop: {err}");
}

/// Found by review: under the units' ProtectProc=invisible (a hidepid=invisible /proc) a rootless
/// sealnode cannot see the cell's init or a sandbox's init once they are not dumpable, and
/// reading what the kernel shows of them refused every start. Their files are opened at the
/// clone, while they are the launcher's own: the cell starts, and stops cleanly. With the
/// units' ProcSubset=pid too, sealnode's /proc has no /proc/sys: the cell init sets the network
/// namespaces' sysctls from a fresh /proc of its own, and each role reads them back.
#[test]
fn a_proc_that_hides_the_inits_still_starts_the_cell() {
    if !is_root() {
        unavailable("rootful", "mounting a hidepid /proc for the test needs root");
        return;
    }
    for mode in modes() {
        let f = cell(mode, "hidepid", HTTPD, "exec sleep 1000", "", "", "");
        let prefix = "set -- /usr/bin/unshare -m --propagation private /bin/sh -c \
                      'mount -t proc -o hidepid=invisible,subset=pid proc /proc && exec \"$@\"' sh \"$@\"; ";
        let run = start_in_shell(&f, &[], prefix);
        run.wait_stderr(60, "role started role=node", &format!("{mode:?}: refused under a hidepid /proc"));
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
    }
}

/// The wipe, attacked (found by review): a scratch dir swapped for a symlink while the cell
/// runs (the pinned dir is wiped, the symlink's target untouched); a tree deeper than the fd
/// limit (wiped, the start goes on); a scratch dir whose group is root (starts); a mount
/// point inside scratch (refused, naming it, the mount's contents untouched).
#[test]
fn the_wipe_holds_against_swaps_deep_trees_odd_groups_and_mounts() {
    use std::os::unix::fs::chown;
    for mode in modes() {
        let lim = "rlimits = { nofile = 256 }";
        let f = cell(mode, "wipeattack", HTTPD, "exec sleep 1000", lim, lim, "");
        let scratch = f.p("node-scratch");
        let owner = match mode {
            Mode::Rootful => NODE_IDS,
            Mode::Rootless if is_root() => (NOBODY, NOBODY),
            Mode::Rootless => (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw()),
        };
        // 1000 levels, under a fd limit of 300: a recursive wipe ran out of fds.
        let mut p = scratch.clone();
        for _ in 0..1000 {
            p.push("d");
        }
        std::fs::create_dir_all(&p).expect("deep");
        let mut q = scratch.join("d");
        while q != p {
            chown(&q, Some(owner.0), Some(owner.1)).expect("chown");
            q.push("d");
        }
        chown(&p, Some(owner.0), Some(owner.1)).expect("chown");
        let run = start_in_shell(&f, &[], "ulimit -n 300; ");
        run.wait_stderr(60, "role started role=node", &format!("{mode:?}: the deep tree stopped the start"));
        assert_eq!(std::fs::read_dir(&scratch).expect("scratch").count(), 0, "{mode:?}: not wiped");
        // Something of the role's in scratch, then the dir swapped for a symlink to a victim
        // while the cell runs, then a stop (a wipe): the wipe empties the dir it opened (now
        // old-scratch), never the victim.
        std::fs::write(scratch.join("left-by-the-role"), "x").expect("write");
        chown(scratch.join("left-by-the-role"), Some(owner.0), Some(owner.1)).expect("chown");
        let victim = f.p("victim");
        std::fs::create_dir(&victim).expect("victim");
        std::fs::write(victim.join("precious"), "keep").expect("write");
        std::fs::rename(&scratch, f.p("old-scratch")).expect("rename");
        std::os::unix::fs::symlink(&victim, &scratch).expect("symlink");
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        assert_eq!(std::fs::read_to_string(victim.join("precious")).expect("victim"), "keep", "{mode:?}: {err}");
        let left: Vec<_> =
            std::fs::read_dir(f.p("old-scratch")).expect("old-scratch").flatten().map(|e| e.file_name()).collect();
        assert!(left.is_empty(), "{mode:?}: the swapped-out scratch dir was not wiped: {left:?}");
        std::fs::remove_file(&scratch).expect("unlink");
        std::fs::rename(f.p("old-scratch"), &scratch).expect("rename back");
        if mode != Mode::Rootful {
            continue;
        }
        // Group root on the scratch dir (mode 0700): the role's uid owns it, that is enough.
        chown(&scratch, Some(NODE_IDS.0), Some(0)).expect("chgrp");
        std::fs::write(scratch.join("left"), "x").expect("write");
        chown(scratch.join("left"), Some(NODE_IDS.0), Some(0)).expect("chown");
        let run = start(&f, &[]);
        run.wait_stderr(30, "role started role=node", &format!("{mode:?}: group root refused the start"));
        let _ = run.stop();
        chown(&scratch, Some(NODE_IDS.0), Some(NODE_IDS.1)).expect("chgrp back");
        // A bind mount inside scratch: refused, its contents untouched.
        let src = f.p("mounted");
        std::fs::create_dir(&src).expect("src");
        std::fs::write(src.join("data"), "keep").expect("write");
        std::fs::create_dir(scratch.join("cache")).expect("mountpoint");
        chown(scratch.join("cache"), Some(NODE_IDS.0), Some(NODE_IDS.1)).expect("chown");
        nix::mount::mount(Some(&src), &scratch.join("cache"), None::<&str>, nix::mount::MsFlags::MS_BIND, None::<&str>)
            .expect("bind");
        let o = f.command(&["run", "--config", &f.config.display().to_string()]).output_within(COMMAND_LIMIT);
        let _ = nix::mount::umount2(&scratch.join("cache"), nix::mount::MntFlags::MNT_DETACH);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{err}");
        assert!(err.contains("cannot wipe node.scratch") && err.contains("mount point"), "{err}");
        assert_eq!(std::fs::read_to_string(src.join("data")).expect("data"), "keep");
    }
}

/// #27 item 2: a second config naming a running cell's scratch dirs (with its own state and
/// runtime dirs) passed `check`, and its `run` wiped the live cell's files. Each scratch dir is
/// locked by the `run` that uses it, for its whole life: `check` fails on it and `run` exits
/// 125, each naming the file, the field, the dir and the holder's pid; nothing is wiped or
/// started, and the first cell runs on. The lock holds through a SIGHUP reload and a recycle
/// (both wipe and restart the roles), and is gone with the first cell.
#[test]
fn a_shared_scratch_dir_is_refused_with_the_live_cells_files_intact() {
    for mode in modes() {
        let node_sh = "echo live > /scratch/live; echo node-up; exec sleep 1000";
        let f = cell(mode, "scratch-live", HTTPD, node_sh, "", "", "");
        let g = cell(mode, "scratch-second", HTTPD, node_sh, "", "", "");
        let text = std::fs::read_to_string(&g.config).expect("cfg");
        let mut shared = text.clone();
        for d in ["engine-scratch", "node-scratch"] {
            shared = shared.replace(&g.p(d).display().to_string(), &f.p(d).display().to_string());
        }
        assert_ne!(text, shared);
        std::fs::write(&g.config, shared).expect("cfg");
        let (fcfg, gcfg) = (f.config.display().to_string(), g.config.display().to_string());
        let live = f.p("node-scratch/live");
        let run = start(&f, &[]);
        run.line(30, |l| l == "node-up");
        let holder = format!("pid {}", run.pid());
        let refused = |when: &str| {
            assert_eq!(std::fs::read_to_string(&live).ok().as_deref(), Some("live\n"), "{mode:?} {when}: no live file");
            let o = g.command(&["check", "--config", &gcfg]).output_within(COMMAND_LIMIT);
            let out = String::from_utf8_lossy(&o.stdout);
            assert_eq!(o.status.code(), Some(125), "{mode:?} {when}: check passed:\n{out}");
            for (name, field) in [("engine scratch", "engine.scratch"), ("node scratch", "node.scratch")] {
                let line = out.lines().find(|l| l.get(7..).is_some_and(|r| r.starts_with(name)));
                let line = line.unwrap_or_else(|| panic!("{mode:?} {when}: no {name} line:\n{out}"));
                assert!(
                    line.starts_with("[FAIL] ") && line.contains(field) && line.contains(&holder),
                    "{mode:?} {when}: {line}"
                );
            }
            let o = g.command(&["run", "--config", &gcfg]).output_within(COMMAND_LIMIT);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(125), "{mode:?} {when}: {err}");
            let dir = f.p("engine-scratch").display().to_string();
            assert!(
                err.contains(&format!(
                    "{gcfg}: engine.scratch: {dir} is in use by another running sealnode ({holder})"
                )),
                "{mode:?} {when}: {err}"
            );
            assert!(!err.contains("cell created") && !err.contains("role started"), "{mode:?} {when}: {err}");
            assert_eq!(std::fs::read_to_string(&live).ok().as_deref(), Some("live\n"), "{mode:?} {when}: wiped");
            let o = f.command(&["ctl", "--config", &fcfg, "status", "--json"]).output_within(COMMAND_LIMIT);
            let st: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
            assert_eq!(st["roles"][1]["state"], "running", "{mode:?} {when}: the first cell was disturbed: {st}");
        };
        refused("while the first cell runs");
        // Rootless (one uid owns every dir): a third config whose state dir is the live node's
        // scratch is refused on it the same way, and leaves no lock file there.
        if mode == Mode::Rootless {
            let state = format!("state_dir = \"{}\"", g.p("state").display());
            assert!(text.contains(&state));
            let third = g.p("third.toml");
            let scratch = f.p("node-scratch").display().to_string();
            std::fs::write(&third, text.replace(&state, &format!("state_dir = \"{scratch}\""))).expect("cfg");
            let hcfg = third.display().to_string();
            let o = g.command(&["check", "--config", &hcfg]).output_within(COMMAND_LIMIT);
            let out = String::from_utf8_lossy(&o.stdout);
            assert_eq!(o.status.code(), Some(125), "{mode:?}: check passed:\n{out}");
            assert!(
                out.lines().any(|l| l.starts_with("[FAIL] state and runtime dirs") && l.contains(&holder)),
                "{mode:?}: {out}"
            );
            let o = g.command(&["run", "--config", &hcfg]).output_within(COMMAND_LIMIT);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(125), "{mode:?}: {err}");
            assert!(
                err.contains(&format!("cell.state_dir: {scratch} is in use by another running sealnode ({holder})")),
                "{mode:?}: {err}"
            );
            let left: Vec<_> =
                std::fs::read_dir(f.p("node-scratch")).expect("scratch").flatten().map(|e| e.file_name()).collect();
            assert_eq!(left, vec![std::ffi::OsString::from("live")], "{mode:?}: {err}");
        }
        // Its own `check` warns (a reload is fine) and passes.
        let o = f.command(&["check", "--config", &fcfg]).output_within(COMMAND_LIMIT);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{mode:?}: {out}");
        assert!(out.lines().any(|l| l.starts_with("[warn] node scratch") && l.contains(&holder)), "{mode:?}: {out}");
        // A reload and a recycle wipe scratch and restart both roles under the lock held since
        // the start.
        kill(run.pid(), Signal::SIGHUP).expect("hup");
        run.line(60, |l| l == "node-up");
        refused("after a reload");
        let o = f.command(&["ctl", "--config", &fcfg, "recycle", "--json"]).output_within(COMMAND_LIMIT);
        let rc: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap_or_default();
        assert!(
            o.status.success() && rc["ok"] == true,
            "{mode:?}: recycle: {rc} {}",
            String::from_utf8_lossy(&o.stderr)
        );
        run.line(60, |l| l == "node-up");
        refused("after a recycle");
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        assert_eq!(err.matches("role started role=node").count(), 3, "{mode:?}: {err}");
        // Gone with the first cell: the second config's `check` passes.
        let o = g.command(&["check", "--config", &gcfg]).output_within(COMMAND_LIMIT);
        assert_eq!(o.status.code(), Some(0), "{mode:?}: {}", String::from_utf8_lossy(&o.stdout));
    }
}

/// Within one config: a scratch dir that is (or is in) the statements' dir sealnode makes in
/// the runtime dir is refused by name (`check` and `run`), and so is one dir given as both
/// roles' scratch dirs under two paths (a bind mount: rootless, both belong to the launcher),
/// before anything is wiped.
#[test]
fn a_scratch_dir_among_the_cells_own_dirs_is_refused() {
    for mode in modes() {
        let f = cell(mode, "scratch-own", HTTPD, "exec sleep 1000", "", "", "");
        let text = std::fs::read_to_string(&f.config).expect("cfg");
        let node = format!("scratch = \"{}\"", f.p("node-scratch").display());
        assert!(text.contains(&node));
        let cfg = f.config.display().to_string();
        let owner = match mode {
            Mode::Rootful => NODE_IDS,
            Mode::Rootless if is_root() => (NOBODY, NOBODY),
            Mode::Rootless => (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw()),
        };
        for inside in ["run/attest", "run/attest/node"] {
            // A dir the role could use, but for where it is.
            std::fs::create_dir(f.p(inside)).expect("mkdir");
            std::os::unix::fs::chown(f.p(inside), Some(owner.0), Some(owner.1)).expect("chown");
            std::fs::write(&f.config, text.replace(&node, &format!("scratch = \"{}\"", f.p(inside).display())))
                .expect("cfg");
            for cmd in ["check", "run"] {
                let o = f.command(&[cmd, "--config", &cfg]).output_within(COMMAND_LIMIT);
                let all = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
                assert_eq!(o.status.code(), Some(125), "{mode:?} {inside} {cmd}: {all}");
                assert!(
                    all.contains("node.scratch") && all.contains("sealnode's own dir for the node's statements"),
                    "{mode:?} {cmd}: {all}"
                );
            }
        }
        if mode != Mode::Rootless || !is_root() {
            continue;
        }
        let alias = f.p("alias");
        std::fs::create_dir(&alias).expect("alias");
        std::fs::write(f.p("engine-scratch/kept"), "x").expect("write");
        nix::mount::mount(
            Some(&f.p("engine-scratch")),
            &alias,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .expect("bind");
        std::fs::write(&f.config, text.replace(&node, &format!("scratch = \"{}\"", alias.display()))).expect("cfg");
        let o = f.command(&["run", "--config", &cfg]).output_within(COMMAND_LIMIT);
        let _ = nix::mount::umount2(&alias, nix::mount::MntFlags::MNT_DETACH);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{err}");
        assert!(err.contains("node.scratch") && err.contains("the same directory as engine.scratch"), "{err}");
        assert!(f.p("engine-scratch/kept").exists(), "wiped: {err}");
    }
}

/// scratch_max_mb: the role's scratch is a tmpfs of that size held by the cell. Filling it
/// gives the role ENOSPC at the cap and writes nothing to the host's dir; a state file
/// survives a restart of the role (the cell keeps the tmpfs), and the cell's stop wipes it.
#[test]
fn a_capped_scratch_stops_at_the_cap_and_survives_a_role_restart() {
    for mode in modes() {
        let node_sh = "if [ -f /scratch/state ]; then echo \"state survived: $(cat /scratch/state)\"; exec sleep 1000; fi; \
             echo \"inodes $(/usr/bin/busybox awk '$5 == \"/scratch\" { print $NF }' /proc/self/mountinfo | /usr/bin/busybox grep -o 'nr_inodes=[0-9]*')\"; echo kept > /scratch/state; \
             /usr/bin/busybox dd if=/dev/zero of=/scratch/fill bs=1M count=16 2>&1 | /usr/bin/busybox grep -o 'No space left on device' | /usr/bin/busybox head -1; \
             echo \"filled $(/usr/bin/busybox du -k /scratch/fill | /usr/bin/busybox cut -f1) KiB\"; exit 1";
        let f = cell(mode, "scratchcap", HTTPD, node_sh, "scratch_max_mb = 4\nrestart = \"on-failure\"", "", "");
        let run = start(&f, &[]);
        // The cell's tmpfs bounds its inodes with its size (4 MiB: the floor, 4096).
        assert_eq!(run.line(30, |l| l.starts_with("inodes ")), "inodes nr_inodes=4096", "{mode:?}");
        let full = run.line(30, |l| l.contains("No space left on device") || l.starts_with("filled"));
        assert!(full.contains("No space left on device"), "{mode:?}: no ENOSPC: {full}");
        let filled = run.line(30, |l| l.starts_with("filled"));
        let kib: u64 = filled.split_whitespace().nth(1).and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!((3000..=4096).contains(&kib), "{mode:?}: filled {kib} KiB of a 4 MiB cap");
        // The host's dir under the tmpfs got nothing.
        let host: Vec<_> =
            std::fs::read_dir(f.p("node-scratch")).expect("scratch").flatten().map(|e| e.file_name()).collect();
        assert!(host.is_empty(), "{mode:?}: the host dir got {host:?}");
        // The node exited 1 and was restarted: its state file is still there.
        let kept = run.line(60, |l| l.starts_with("state survived"));
        assert_eq!(kept, "state survived: kept", "{mode:?}");
        // A recycle wipes it (inside the cell's mount namespace): the node starts afresh.
        let cfg = f.config.display().to_string();
        let o = f.command(&["ctl", "--config", &cfg, "recycle"]).output_within(COMMAND_LIMIT);
        assert!(o.status.success(), "{mode:?}: recycle: {}", String::from_utf8_lossy(&o.stderr));
        let after = run.line(60, |l| l.contains("No space left on device") || l.starts_with("state survived"));
        assert!(after.contains("No space left on device"), "{mode:?}: the recycle did not wipe scratch: {after}");
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        // A new cell starts from an empty scratch.
        let run = start(&f, &[]);
        let again = run.line(30, |l| l.contains("No space left on device") || l.starts_with("state survived"));
        assert!(again.contains("No space left on device"), "{mode:?}: a new cell saw old scratch: {again}");
        let _ = run.stop();
    }
}

/// A role that changes its own scratch dir's mode (which the Ollama profile's filter allows)
/// cannot make the wipe fail or the next start refuse: `chmod 0` (no rights left: the wipe
/// failed, EACCES) or `chmod 0777` (open to the host's users: the start refused it, 125, then
/// every later start). The wipe gives the dir its mode back, and a recycle starts the role again
/// on an empty 0700 scratch, capped or not (found by review: the cell stopped, exit 125,
/// whenever the role liked).
#[test]
fn a_role_that_changes_its_scratch_dirs_mode_is_still_wiped_and_started() {
    use std::os::unix::fs::PermissionsExt;
    for mode in modes() {
        for (capped, chmod) in [(false, 0), (true, 0), (false, 0o777), (true, 0o1777)] {
            let ctx = format!("{mode:?}, capped: {capped}, chmod {chmod:o}");
            let engine_sh = format!(
                "/usr/bin/python3 -c 'import os; fd = os.open(\"/scratch\", os.O_RDONLY); \
                 print(\"scratch mode\", oct(os.fstat(fd).st_mode & 0o7777), flush=True); os.fchmod(fd, {chmod})' \
                 && exec /usr/bin/busybox httpd -f -p 127.0.0.1:18080 -h /models"
            );
            let extra_engine = if capped { "scratch_max_mb = 4" } else { "" };
            let mut f = cell(mode, "chmodscratch", &engine_sh, "exec sleep 1000", "", extra_engine, "");
            f.engine_policy = "engine-ollama".into();
            f.write_config();
            let run = start(&f, &[]);
            assert_eq!(run.line(30, |l| l.contains("scratch mode")), "scratch mode 0o700", "{ctx}");
            let cfg = f.config.display().to_string();
            let o = f.command(&["ctl", "--config", &cfg, "recycle"]).output_within(COMMAND_LIMIT);
            assert!(o.status.success(), "{ctx}: recycle: {}\n{}", String::from_utf8_lossy(&o.stderr), run.stderr());
            assert_eq!(run.line(60, |l| l.contains("scratch mode")), "scratch mode 0o700", "{ctx}: after the wipe");
            let (code, _, err) = run.stop();
            assert_eq!(code, Some(0), "{ctx}: {err}");
            assert!(!err.contains("cannot wipe"), "{ctx}: {err}");
            // The stop's wipe too: the host dir is the role's 0700 again for the next run.
            let host = std::fs::metadata(f.p("engine-scratch")).expect("scratch").permissions().mode() & 0o7777;
            assert_eq!(host, 0o700, "{ctx}: the host dir after the stop");
        }
    }
}

/// A capped scratch is wiped through the tmpfs the cell holds, never by its path again: a
/// directory above it made root's 0700 while the cell runs leaves the wipe whole, and the next
/// start is refused naming node.scratch (found by review: the wipe walked the path as the role,
/// failed with EACCES and was told as "another host user's files; remove them by hand").
#[test]
fn a_capped_scratch_is_wiped_through_the_tmpfs_the_cell_holds() {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        return unavailable("rootful", "a directory above the scratch that only root may search");
    }
    for mode in modes() {
        let node_sh = "echo left > /scratch/left && echo node-wrote; exec sleep 1000";
        let f = cell(mode, "scratchheld", HTTPD, node_sh, "scratch_max_mb = 4", "", "");
        let old = f.p("node-scratch");
        let new = f.p("outer/node-scratch");
        std::fs::create_dir(f.p("outer")).expect("mkdir");
        std::fs::rename(&old, &new).expect("move the scratch");
        let text = std::fs::read_to_string(&f.config).expect("config");
        let moved = text.replace(&old.display().to_string(), &new.display().to_string());
        assert_ne!(text, moved, "the scratch line was not found");
        std::fs::write(&f.config, moved).expect("config");
        let mut run = start(&f, &[]);
        run.line(30, |l| l == "node-wrote");
        std::fs::set_permissions(f.p("outer"), std::fs::Permissions::from_mode(0o700)).expect("chmod");
        let cfg = f.config.display().to_string();
        let o = f.command(&["ctl", "--config", &cfg, "recycle"]).output_within(COMMAND_LIMIT);
        let said = String::from_utf8_lossy(&o.stderr).into_owned();
        let code = wait_timeout(&mut run.child, 60);
        let err = run.stderr_after_exit();
        assert!(!err.contains("cannot wipe"), "{mode:?}: the wipe walked the path: {err}\n{said}");
        assert_eq!(code, Some(125), "{mode:?}: {err}");
        assert!(err.contains("node.scratch"), "{mode:?}: the refusal does not name the field: {err}");
    }
}

/// An upstream that never answers (its SYNs dropped, as a firewall or the unit's
/// IPAddressDeny= does) is given up after `cell.egress_connect_timeout_s` and logged with the
/// fix: without it the node's connection hung silently (found in the test guest, tests/vm).
#[test]
fn a_silently_dropped_egress_connect_times_out_and_says_why() {
    use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, SockaddrIn};
    for mode in modes() {
        // A listener that never accepts, its accept queue (backlog 0: one entry) filled by us:
        // the kernel drops every further SYN.
        let l = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).expect("socket");
        bind(l.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).expect("bind");
        listen(&l, Backlog::new(0).expect("backlog")).expect("listen");
        let addr: SockaddrIn = nix::sys::socket::getsockname(l.as_raw_fd()).expect("name");
        let port = addr.port();
        let _queued = std::net::TcpStream::connect(("127.0.0.1", port)).expect("fill the queue");
        let node_sh = format!("/usr/bin/busybox nc -w 20 gw.test {port} </dev/null >/dev/null 2>&1; exec sleep 1000");
        let node_extra = format!("egress = [{{ host = \"gw.test\", port = {port}, connect = \"127.0.0.1:{port}\" }}]");
        let f = cell(mode, "connecttimeout", HTTPD, &node_sh, &node_extra, "", "egress_connect_timeout_s = 2");
        let run = start(&f, &[]);
        run.wait_stderr(30, "egress connect timed out", &format!("{mode:?}: the hung connect was not given up"));
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        assert!(err.contains("IPAddressAllow="), "{mode:?}: the warning names the fix: {err}");
        let totals = err.lines().find(|l| l.contains("egress totals")).unwrap_or_else(|| panic!("{mode:?}: {err}"));
        assert!(totals.contains("failed=1"), "{mode:?}: counted as a failed connect: {totals}");
        drop(l);
    }
}

/// The node cannot take the supervisor's fds: all connections together stay within what the
/// fd limit allows less a reserve, so a restart's preflight still runs while the node holds
/// every connection it can, and a node opening connections in a loop does not flood the log
/// (found by review: at 1024 fds the next engine restart stopped the cell with exit 6).
#[test]
fn the_fd_budget_bounds_forwarding_and_keeps_the_gate_working() {
    for mode in modes() {
        let up = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = up.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for c in up.incoming().flatten() {
                held.push(c);
            }
        });
        // 70 connections held open (6 fds each unbounded: more than 400), then a churn.
        let node_sh = format!(
            "for i in $(seq 70); do sleep 1000 | /usr/bin/busybox nc gw.test {port} >/dev/null 2>&1 & done; \
             sleep 2; echo node-holding; \
             for i in $(seq 200); do /usr/bin/busybox nc -w 1 gw.test {port} </dev/null >/dev/null 2>&1; done; exec sleep 1000"
        );
        let node_extra = format!(
            "egress = [{{ host = \"gw.test\", port = {port}, connect = \"127.0.0.1:{port}\" }}]\nrlimits = {{ nofile = 256 }}"
        );
        let engine_extra = "restart = \"always\"\nrlimits = { nofile = 256 }";
        let f = cell(mode, "fdbudget", HTTPD, &node_sh, &node_extra, engine_extra, "egress_max_connections = 1000");
        // 400 fds, soft and hard, two routes (the egress and the engine hop): room for
        // (400 - 256 - 2 * 3) / 6 = 23 connections.
        let run = start_in_shell(&f, &[], "ulimit -n 400; ");
        run.line(60, |l| l == "node-holding");
        // Kill the engine: its restart passes the gate (a preflight needs fds) while the node
        // holds all it may.
        let engine = descendants(run.pid().as_raw())
            .into_iter()
            .find(|p| {
                std::fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| c.starts_with(b"/usr/bin/busybox\0httpd"))
            })
            .unwrap_or_else(|| panic!("{mode:?}: no engine process"));
        kill(nix::unistd::Pid::from_raw(engine), Signal::SIGKILL).expect("kill engine");
        let deadline = Instant::now() + Duration::from_secs(60);
        while run.stderr().matches("preflight passed").count() < 2 {
            assert!(Instant::now() < deadline, "{mode:?}: no second preflight: {}", run.stderr());
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_secs(2));
        let (code, secs, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        assert!(secs < 10.0, "{mode:?}: SIGTERM took {secs:.1}s");
        assert!(!err.contains("Too many open files"), "{mode:?}: {err}");
        assert!(err.contains("egress forwarding budget connections="), "{mode:?}: the budget is logged: {err}");
        let totals = err.lines().find(|l| l.contains("egress totals")).unwrap_or_else(|| panic!("{mode:?}: {err}"));
        let field = |k: &str| -> u64 {
            totals.split_whitespace().find_map(|w| w.strip_prefix(k)?.strip_prefix('=')?.parse().ok()).unwrap_or(0)
        };
        assert!(field("refused") >= 46, "{mode:?}: 70 held against a budget of 23: {totals}");
        // Refusals are counted one by one but logged at most once a second.
        let warnings = err.matches("egress connection refused: limit reached").count();
        assert!((1..=30).contains(&warnings), "{mode:?}: {warnings} refusal warnings: {err}");
    }
}

#[test]
fn watchdog_pings_while_running() {
    for mode in modes() {
        let f = cell(mode, "watchdog", HTTPD, "echo node-up; exec sleep 1000", "", "", "");
        let ns = notify_socket(&f);
        let run = start_with(&f, &[("NOTIFY_SOCKET", ns.path.as_str()), ("WATCHDOG_USEC", "200000")], true);
        run.line(30, |l| l == "node-up");
        std::thread::sleep(Duration::from_millis(600));
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        let pings: usize = ns.until_stopping().iter().map(|m| m.lines().filter(|l| *l == "WATCHDOG=1").count()).sum();
        assert!(pings >= 3, "{mode:?}: {pings} watchdog pings in >600 ms at a 100 ms interval");
    }
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rsplit_once(") ").map(|(_, r)| r.to_string()).unwrap_or_default();
    let f: Vec<&str> = rest.split_whitespace().collect();
    f.get(11).and_then(|u| u.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
}

/// Found by review: a node that filled the pipe towards an upstream that never reads and then
/// reset its connection made the supervisor spin at 100% CPU (epoll reports the hang-up
/// whatever the interest; nothing acted on it).
#[test]
fn a_vanished_peer_does_not_make_the_supervisor_spin() {
    for mode in modes() {
        // An upstream that accepts and never reads.
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = l.local_addr().expect("addr").port();
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for s in l.incoming().flatten() {
                held.push(s);
            }
        });
        let node_sh = format!(
            "/opt/sealnode/sealnode __probe-inside --blast gw.test:{port} > /dev/null; echo blasted; exec sleep 1000"
        );
        let node_extra = format!("egress = [{{ host = \"gw.test\", port = {port}, connect = \"127.0.0.1:{port}\" }}]");
        let f = cell(mode, "spin", HTTPD, &node_sh, &node_extra, "", "");
        let run = start(&f, &[]);
        run.line(60, |l| l == "blasted");
        std::thread::sleep(Duration::from_millis(300));
        let before = cpu_ticks(run.child.id());
        std::thread::sleep(Duration::from_secs(2));
        let used = cpu_ticks(run.child.id()) - before;
        // Clock ticks are 1/100 s: a busy loop would use ~200 in 2 s.
        assert!(used < 30, "{mode:?}: the supervisor used {used} ticks of CPU in 2 s while idle");
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
    }
}

/// Found by review: the notification send blocked when nobody read NOTIFY_SOCKET, freezing
/// the loop (SIGTERM ignored). Notifications are now sent without blocking.
#[test]
fn an_unread_notify_socket_does_not_freeze_the_supervisor() {
    for mode in modes() {
        let f = cell(mode, "deadnotify", HTTPD, "echo node-up; exec sleep 1000", "", "", "");
        use std::os::unix::fs::PermissionsExt;
        let path = f.p("dead-notify.sock");
        let _sock = UnixDatagram::bind(&path).expect("bind");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let p = path.display().to_string();
        let run = start_with(&f, &[("NOTIFY_SOCKET", p.as_str()), ("WATCHDOG_USEC", "20000")], true);
        run.line(30, |l| l == "node-up");
        std::thread::sleep(Duration::from_millis(500));
        let (code, secs, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        assert!(secs < 5.0, "{mode:?}: stop took {secs}s");
    }
}

/// `restart = "always"` restarts a role that exits cleanly, with the documented backoff:
/// 0.5 s, doubling (docs/config.md). The gaps between starts are at least the backoff (a start
/// adds its own time, so only lower bounds are exact), and the log names each delay.
#[test]
fn restart_always_restarts_a_clean_exit_with_a_doubling_backoff() {
    for mode in modes() {
        let f = cell(mode, "always", HTTPD, "echo node-up; exit 0", "restart = \"always\"", "", "");
        let run = start(&f, &[]);
        let mut at = Vec::new();
        for _ in 0..4 {
            run.line(30, |l| l == "node-up");
            at.push(Instant::now());
        }
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        let gaps: Vec<f64> = at.windows(2).map(|w| (w[1] - w[0]).as_secs_f64()).collect();
        for (gap, backoff) in gaps.iter().zip([0.5, 1.0, 2.0]) {
            // 0.1 s for the reader thread's own delay in handing the line over.
            assert!(*gap >= backoff - 0.1, "{mode:?}: restarted after {gap:.2} s, backoff {backoff} s: {gaps:?}");
        }
        for ms in [500, 1000, 2000] {
            assert!(
                err.lines().any(|l| l.contains("role exited; restarting")
                    && l.contains("code=0")
                    && l.contains(&format!("restart_in_ms={ms} "))),
                "{mode:?}: no restart after {ms} ms logged: {err}"
            );
        }
    }
}

/// Each role its own network (#13): an engine whose policy allows connect (filter and
/// Landlock) still reaches nothing but its own loopback: not the node's egress listeners, not
/// the host. The node reaches the engine's API port through the forwarder and nothing else of
/// the engine (not a runner-style port it also listens on), and sees none of its sockets.
#[test]
fn each_role_has_its_own_network() {
    for mode in modes() {
        let (_up, up_port) = upstream("hello-from-upstream\n");
        let (_host, host_port) = upstream("host service\n");
        let fwd = sealnode::config::Config::egress_addr(0);
        let engine_sh = format!(
            "/usr/bin/busybox httpd -f -p 127.0.0.1:18090 -h /models & until /usr/bin/busybox wget -q -O /dev/null http://127.0.0.1:18090/hello.txt; do sleep 0.05; done; /opt/sealnode/sealnode __probe-inside --connect {fwd}:{up_port} --connect 127.0.0.1:{host_port} --connect 127.0.0.1:18090; {HTTPD}"
        );
        let node_sh = format!(
            "/opt/sealnode/sealnode __probe-inside --fetch 127.0.0.1:{ENGINE_PORT} --fetch gw.test:{up_port} --connect 127.0.0.1:18090; echo TCP-BEGIN; cat /proc/net/tcp; echo TCP-END; exec sleep 1000"
        );
        let mut f = cell(
            mode,
            "own-net",
            &engine_sh,
            &node_sh,
            &format!("egress = [{{ host = \"gw.test\", port = {up_port}, connect = \"127.0.0.1:{up_port}\" }}]"),
            "",
            "",
        );
        // A test engine policy that lets it connect anywhere and listen on any port: the
        // namespace is what stops it.
        f.use_engine_policy_allowing_connect();
        let run = start(&f, &[]);
        let e = report(&run.line(60, |l| l.contains("\"ENGINE_ONLY\"")));
        let n = report(&run.line(60, |l| l.contains("\"FRUTEBOX_ENGINE\"")));
        run.line(30, |l| l == "TCP-BEGIN");
        let mut tcp = Vec::new();
        loop {
            let l = run.line(30, |_| true);
            if l == "TCP-END" {
                break;
            }
            tcp.push(l);
        }
        let ctx = format!("{mode:?}");
        // The engine's own runner-style port: its policy really allows connect...
        assert_eq!(attempt(&e, "connect:127.0.0.1:18090")["ok"], true, "{ctx}: {e}");
        // ...and still nothing outside its namespace answers.
        refused(&e, &format!("connect:{fwd}:{up_port}"), &[libc::ECONNREFUSED]);
        refused(&e, &format!("connect:127.0.0.1:{host_port}"), &[libc::ECONNREFUSED]);
        // The node: the engine's API and the declared egress, nothing else of the engine.
        assert_eq!(attempt(&n, &format!("fetch:127.0.0.1:{ENGINE_PORT}"))["ok"], true, "{ctx}: {n}");
        assert_eq!(attempt(&n, &format!("fetch:gw.test:{up_port}"))["ok"], true, "{ctx}: {n}");
        refused(&n, "connect:127.0.0.1:18090", &[libc::EACCES, libc::ECONNREFUSED]);
        // The node's /proc/net/tcp: only its own namespace's sockets. Listening: exactly the
        // engine-port forwarder and the egress listener; the engine's port 18090 nowhere.
        let port_hex = |p: u16| format!("{p:04X}");
        let listening: Vec<String> = tcp
            .iter()
            .skip(1)
            .filter_map(|l| {
                let f: Vec<&str> = l.split_whitespace().collect();
                (f.get(3) == Some(&"0A")).then(|| f[1].to_string())
            })
            .collect();
        let mut want = vec![format!("0100007F:{}", port_hex(ENGINE_PORT)), format!("0200007F:{}", port_hex(up_port))];
        let mut got = listening.clone();
        want.sort();
        got.sort();
        assert_eq!(got, want, "{ctx}: listening sockets in the node's namespace: {tcp:?}");
        assert!(
            !tcp.iter().any(|l| l.contains(&format!(":{}", port_hex(18090)))),
            "{ctx}: the engine's runner port is visible to the node: {tcp:?}"
        );
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{ctx}: {err}");
        let totals = log_fields(&err, "node-to-engine totals");
        assert_eq!(totals.len(), 1, "{ctx}: {err}");
        assert_eq!(totals[0]["accepted"], "1", "{ctx}: {err}");
    }
}

/// `run` blocks the signals it handles from its first instruction: a SIGTERM that arrives
/// while the config loads is not lost and does not kill sealnode half-way; the supervisor takes
/// it from its signalfd and stops the cell cleanly (exit 0). The window is held open: sealnode
/// runs in a mount namespace whose /etc/passwd is a file the test holds a write lease on, and
/// the config names the role users, so loading it waits in the user lookup's open until the
/// test, having sent the signal, gives the lease up.
#[test]
fn a_sigterm_while_the_config_loads_stops_the_cell_cleanly() {
    use std::os::unix::process::ExitStatusExt;
    if !is_root() {
        return unavailable("rootful", "the test replaces /etc/passwd in a mount namespace (root)");
    }
    if !modes().contains(&Mode::Rootful) {
        return;
    }
    let f = cell(Mode::Rootful, "sigload", HTTPD, "echo node-up; exec sleep 1000", "", "", "");
    let ids = format!("engine = \"{}:{}\", node = \"{}:{}\"", ENGINE_IDS.0, ENGINE_IDS.1, NODE_IDS.0, NODE_IDS.1);
    let text = std::fs::read_to_string(&f.config).expect("config");
    assert!(text.contains(&ids), "{text}");
    std::fs::write(&f.config, text.replace(&ids, "engine = \"sn-test-engine\", node = \"sn-test-node\""))
        .expect("write");
    let passwd = f.p("passwd");
    std::fs::write(
        &passwd,
        format!(
            "root:x:0:0:root:/root:/bin/sh\nsn-test-engine:x:{}:{}::/:/usr/sbin/nologin\nsn-test-node:x:{}:{}::/:/usr/sbin/nologin\n",
            ENGINE_IDS.0, ENGINE_IDS.1, NODE_IDS.0, NODE_IDS.1
        ),
    )
    .expect("passwd");
    // A write lease: whoever opens the file waits until the test gives it up. The break is
    // signalled to the test with SIGURG, which it ignores by default.
    let lease = std::fs::OpenOptions::new().read(true).write(true).open(&passwd).expect("open passwd");
    let fd = lease.as_raw_fd();
    const F_SETSIG: libc::c_int = 10; // <fcntl.h>; the libc crate does not export it
                                      // SAFETY: fcntl on a descriptor this test owns, with integer arguments.
    let set = unsafe { (libc::fcntl(fd, F_SETSIG, libc::SIGURG), libc::fcntl(fd, libc::F_SETLEASE, libc::F_WRLCK)) };
    assert_eq!(set, (0, 0), "F_SETSIG, F_SETLEASE: {}", std::io::Error::last_os_error());
    let cfg = f.config.display().to_string();
    let inner = f.command(&["run", "--config", &cfg]);
    let mut child = std::process::Command::new("/usr/bin/unshare")
        .args(["-m", "--propagation", "private", "--", "/bin/sh", "-c"])
        .arg("mount --bind \"$1\" /etc/passwd && shift && exec \"$@\"")
        .arg("sh")
        .arg(&passwd)
        .arg(inner.get_program())
        .args(inner.get_args())
        .current_dir(&f.dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let err = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
    let (pipe, e2) = (child.stderr.take().expect("stderr"), err.clone());
    std::thread::spawn(move || {
        for l in BufReader::new(pipe).lines().map_while(Result::ok) {
            e2.lock().expect("lock").push_str(&format!("{l}\n"));
        }
    });
    // sealnode itself (exec'd by then), waiting for the lease in its first user lookup.
    let pid = child.id();
    let waiting = || {
        std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|e| e.file_name() == f.bin.file_name())
            && std::fs::read_to_string(format!("/proc/{pid}/wchan")).is_ok_and(|w| w.contains("break_lease"))
    };
    assert!(
        wait_until(Duration::from_secs(30), waiting),
        "sealnode never opened /etc/passwd: {}",
        err.lock().expect("lock")
    );
    kill(Pid::from_raw(pid as i32), Signal::SIGTERM).expect("sigterm");
    std::thread::sleep(Duration::from_millis(300));
    assert!(matches!(child.try_wait(), Ok(None)), "sealnode ended at the SIGTERM: {}", err.lock().expect("lock"));
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fcntl(fd, libc::F_SETLEASE, libc::F_UNLCK) }, 0, "{}", std::io::Error::last_os_error());
    let st = wait_within(&mut child, Duration::from_secs(90), "sealnode run after an early SIGTERM");
    std::thread::sleep(Duration::from_millis(100));
    let err = err.lock().expect("lock").clone();
    assert_eq!(st.signal(), None, "sealnode was killed by signal {:?} while it loaded the config:\n{err}", st.signal());
    assert_eq!(st.code(), Some(0), "{err}");
    drop(lease);
}

/// A container runtime's masked /proc (a file bound over /proc/timer_list, as podman, containerd
/// and the kubelet do unless told `unmask=/proc/*` / `procMount: Unmasked`): the kernel would
/// refuse each role's fresh /proc. `run` refuses before the cell is made, 125, naming the
/// layer, and nothing runs. Rootful only: masking needs a mount namespace of root's.
#[test]
fn a_masked_proc_refuses_the_start_naming_it_before_anything_runs() {
    if !modes().contains(&Mode::Rootful) {
        return;
    }
    let f = cell(
        Mode::Rootful,
        "maskedproc",
        "echo engine-up; exec sleep 1000",
        "echo node-up; exec sleep 1000",
        "",
        "",
        "",
    );
    let mut run = start_in_shell(
        &f,
        &[],
        "exec unshare -m --propagation private /bin/sh -c 'mount --bind /dev/null /proc/timer_list && exec \"$0\" \"$@\"' \"$@\"; ",
    );
    let code = wait_timeout(&mut run.child, 30);
    let err = run.stderr_after_exit();
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("/proc fully visible") && err.contains("over-mounted: /proc/timer_list"), "{err}");
    assert!(err.contains("fix:"), "the refusal says what to change: {err}");
    assert!(!err.contains("role started") && !err.contains("cell created"), "nothing may start: {err}");
    assert!(!f.p("state/receipt.json").exists(), "no receipt for a refused start");
}

/// Each role its own user namespace, inside the cell's: rootless, both roles are one uid, and
/// RLIMIT_NPROC counts a uid's processes per user namespace, so with one namespace for both an
/// engine that forked up to its `nproc` left the node none (found by review). The engine forks
/// until its limit refuses; the node, under the same `nproc`, still forks every time, also with
/// sealnode's own soft limit below both roles' together. From the host: the engine's and the
/// node's processes are in two user namespaces, neither sealnode's.
#[test]
fn each_role_has_its_own_user_namespace_and_process_count() {
    for mode in modes() {
        // Forks until its limit refuses one: the subshell dies there (busybox sh exits on a
        // failed fork, status 2), its sleeps stay, and the engine's shell execs without forking.
        let engine_sh =
            "( while :; do /usr/bin/busybox sleep 1000 & done ) 2>/dev/null; echo ENGINE-FULL-$?; ".to_string() + HTTPD;
        let node_sh = "ok=0; i=0; while [ $i -lt 10 ]; do /usr/bin/busybox sleep 0 && ok=$((ok+1)); i=$((i+1)); done; \
             echo NODE-FORKS-$ok; exec /usr/bin/busybox sleep 999";
        let f =
            cell(mode, "own-userns", &engine_sh, node_sh, "rlimits = { nproc = 40 }", "rlimits = { nproc = 40 }", "");
        // sealnode's own soft RLIMIT_NPROC below what both roles may hold: every process of the
        // roles' host uid counts against it too, so `run` takes the hard limit (found by review).
        let run = start_in_shell(&f, &[], "set -- prlimit --nproc=30: -- \"$@\"; ");
        let ctx = format!("{mode:?}");
        // The engine reached its own limit.
        assert_eq!(run.line(60, |l| l.starts_with("ENGINE-FULL-")), "ENGINE-FULL-2", "{ctx}: {}", run.stderr());
        assert_eq!(run.line(60, |l| l.starts_with("NODE-FORKS-")), "NODE-FORKS-10", "{ctx}: {}", run.stderr());
        let userns = |pid: i32| std::fs::read_link(format!("/proc/{pid}/ns/user")).ok();
        let comm = |pid: i32| std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap_or_default();
        let of = |needle: &str| {
            let mut found = None;
            // The node's exec of its sleep may not have happened yet.
            wait_until(Duration::from_secs(10), || {
                found = descendants(run.child.id() as i32).into_iter().find(|p| comm(*p).contains(needle));
                found.is_some()
            });
            found.and_then(userns).unwrap_or_else(|| panic!("{ctx}: no process running {needle:?}"))
        };
        let (e, n, own) = (of("httpd"), of("sleep\u{0}999\u{0}"), userns(run.child.id() as i32));
        assert_ne!(e, n, "{ctx}: the engine and the node share a user namespace");
        assert!(Some(&e) != own.as_ref() && Some(&n) != own.as_ref(), "{ctx}: a role in sealnode's user namespace");
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{ctx}: {err}");
    }
}
