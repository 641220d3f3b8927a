//! Proof of isolation: the canary battery, the layer matrix, preflight refusing a weakened
//! sandbox, receipts, and the control socket. Real sandboxes, as root and as uid 65534.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn canary(f: &Fixture, args: &[&str]) -> (Option<i32>, Value, String) {
    let cfg = f.config.display().to_string();
    let mut a = vec!["canary", "--config", cfg.as_str(), "--json"];
    a.extend_from_slice(args);
    let o = f.command(&a).stdin(Stdio::null()).output().expect("canary");
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let v = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{err}", String::from_utf8_lossy(&o.stdout)));
    (o.status.code(), v, err)
}

/// Run the battery again with `--junit` and `--tap`, validate the XML against the JUnit schema CI
/// systems read (xmllint) and feed the TAP to `prove`; both must agree with the JSON report.
/// Returns prove's output.
fn check_ci_reports(f: &Fixture, extra: &[&str], json: &Value) -> Option<String> {
    let (Some(xmllint), Some(prove)) = (which("/usr/bin/xmllint"), which("/usr/bin/prove")) else {
        unavailable("ci-reports", "xmllint (libxml2-utils) and prove (perl) are needed to check the reports");
        return None;
    };
    let cfg = f.config.display().to_string();
    // The reports belong to whoever runs the canary (uid 65534 in rootless mode).
    let dir = f.p("reports");
    std::fs::create_dir_all(&dir).expect("reports dir");
    if f.mode == Mode::Rootless {
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).expect("chown reports");
    }
    let (junit, tap) = (dir.join("canary.xml"), dir.join("canary.tap"));
    let mut a = vec!["canary", "--config", cfg.as_str()];
    a.extend_from_slice(extra);
    let (j, t) = (junit.display().to_string(), tap.display().to_string());
    a.extend_from_slice(&["--junit", j.as_str(), "--tap", t.as_str()]);
    let o = f.command(&a).stdin(Stdio::null()).output().expect("canary");
    let passed = json["passed"] == true;
    assert_eq!(o.status.code(), Some(if passed { 0 } else { 1 }), "{}", String::from_utf8_lossy(&o.stderr));
    // The human table still goes to stdout.
    assert!(String::from_utf8_lossy(&o.stdout).contains("canary: "), "no table");

    let xsd = repo().join("tests/fixtures/junit.xsd");
    let v = std::process::Command::new(xmllint)
        .arg("--noout")
        .arg("--schema")
        .arg(&xsd)
        .arg(&junit)
        .output()
        .expect("xmllint");
    assert!(v.status.success(), "JUnit XML does not validate: {}", String::from_utf8_lossy(&v.stderr));
    let xml = std::fs::read_to_string(&junit).expect("junit");
    let attempts: usize =
        json["roles"].as_array().expect("roles").iter().map(|r| r["attempts"].as_array().map_or(0, Vec::len)).sum();
    let escapes: usize =
        json["roles"].as_array().expect("roles").iter().map(|r| r["succeeded"].as_u64().unwrap_or(0) as usize).sum();
    assert_eq!(xml.matches("<testcase ").count(), attempts, "one test case per attempt and role");
    assert_eq!(xml.matches("<failure ").count(), escapes, "one failure per escape");

    // prove reads the TAP as one test script's output (`--exec cat`).
    let p = std::process::Command::new(prove).args(["--exec", "cat", "--verbose"]).arg(&tap).output().expect("prove");
    let out = String::from_utf8_lossy(&p.stdout).into_owned();
    assert_eq!(p.status.success(), passed, "prove disagrees with the JSON report:\n{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("ok ")).count(), attempts - escapes, "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("not ok ")).count(), escapes, "{out}");
    Some(out)
}

#[test]
fn battery_refuses_every_attempt_with_the_expected_layer() {
    for mode in modes() {
        let f = Fixture::new(mode, "battery");
        let t = Instant::now();
        let (code, r, err) = canary(&f, &[]);
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(code, Some(0), "{mode:?}: {err}\n{r}");
        assert_eq!(r["schema"], 1);
        assert_eq!(r["passed"], true);
        check_ci_reports(&f, &[], &r);
        let roles = r["roles"].as_array().expect("roles");
        assert_eq!(roles.len(), 2);
        for role in roles {
            let attempts = role["attempts"].as_array().expect("attempts");
            assert!(attempts.len() >= 60, "{mode:?}: only {} attempts", attempts.len());
            let cats: std::collections::BTreeSet<&str> =
                attempts.iter().filter_map(|a| a["category"].as_str()).collect();
            for c in [
                "credentials",
                "namespaces",
                "filesystem",
                "kernel",
                "tty",
                "sockets",
                "network",
                "cross-role",
                "resources",
                "environment",
            ] {
                assert!(cats.contains(c), "{mode:?}: no {c} attempts");
            }
            for a in attempts {
                assert_eq!(a["outcome"], "refused", "{mode:?} {}: {a}", role["role"]);
                let by = a["refused_by"].as_str().expect("refused_by");
                let expected: Vec<&str> =
                    a["expected_layers"].as_array().expect("expected").iter().filter_map(Value::as_str).collect();
                assert!(
                    expected.contains(&by),
                    "{mode:?} {} {}: refused by {by}, expected {expected:?}",
                    role["role"],
                    a["id"]
                );
            }
        }
        eprintln!("{mode:?}: battery for both roles in {secs:.2}s");
    }
}

#[test]
fn matrix_shows_two_independent_layers() {
    for mode in modes() {
        let f = Fixture::new(mode, "matrix");
        let (code, m, err) = canary(&f, &["--matrix"]);
        assert_eq!(m["violations"], serde_json::json!([]), "{mode:?}: {err}");
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        let rows = m["rows"].as_array().expect("rows");
        let mut two = 0;
        for r in rows {
            let n = r["stopped_by"].as_array().expect("stopped_by").len();
            let moot = r["moot_on_this_kernel"] == true;
            let exception = !r["single_layer_reason"].is_null();
            assert!(n >= 2 || moot || exception, "{mode:?}: {r}");
            if n >= 2 {
                two += 1;
            }
        }
        assert!(two >= 40, "{mode:?}: only {two} attempts shown stopped by two layers");
        // A few the design relies on, checked by name.
        let row_of = |id: &str, role: &str| {
            rows.iter().find(|r| r["id"] == id && r["role"] == role).unwrap_or_else(|| panic!("{id}"))
        };
        let row = |id: &str| row_of(id, "node");
        let stops_in = |id: &str, role: &str, l: &str| {
            row_of(id, role)["stopped_by"].as_array().expect("s").iter().any(|x| x == l)
        };
        let stops = |id: &str, l: &str| stops_in(id, "node", l);
        // Ways around Landlock's port rules: each closed by the filter and by the netns sysctls,
        // and never credited to the host (whose TCP Fast Open and MPTCP are on).
        let tfo = row_of("engine_fastopen_egress", "engine");
        assert!(
            stops_in("engine_fastopen_egress", "engine", "seccomp")
                && stops_in("engine_fastopen_egress", "engine", "namespaces")
                && !stops_in("engine_fastopen_egress", "engine", "host"),
            "{mode:?}: {tfo}"
        );
        assert!(
            stops("socket_mptcp", "seccomp") && stops("socket_mptcp", "namespaces"),
            "{mode:?}: {}",
            row("socket_mptcp")
        );
        assert!(
            stops("unshare_user", "seccomp") && stops("unshare_user", "namespaces"),
            "{mode:?}: {}",
            row("unshare_user")
        );
        assert!(stops("exec_from_scratch", "landlock") && stops("exec_from_scratch", "namespaces"), "{mode:?}");
        assert!(stops("write_etc", "landlock") && stops("write_etc", "namespaces"), "{mode:?}");
        assert!(stops("host_loopback_service", "namespaces") && stops("host_loopback_service", "landlock"), "{mode:?}");
    }
}

/// A copy of a policy file, edited, owned by root and referenced by the config.
fn weaken(f: &mut Fixture, file: &str, edit: impl Fn(String) -> String) {
    let p = f.p(&format!("policy/{file}"));
    let text = std::fs::read_to_string(&p).expect("policy");
    std::fs::write(&p, edit(text)).expect("write policy");
}

#[test]
fn a_weakened_sandbox_fails_the_canary_and_run_refuses_to_start() {
    for mode in modes() {
        // 1. The node's seccomp filter allows io_uring.
        let mut f = Fixture::new(mode, "weak-seccomp");
        weaken(&mut f, "node.json", |t| {
            t.replacen(
                "\"filter\": [",
                "\"filter\": [\n   {\"syscall\": \"io_uring_setup\", \"comment\": \"weakened on purpose\"},",
                1,
            )
        });
        let (code, r, _) = canary(&f, &["--role", "node"]);
        assert_eq!(code, Some(1), "{mode:?}: {r}");
        let io = r["roles"][0]["attempts"]
            .as_array()
            .expect("a")
            .iter()
            .find(|a| a["id"] == "io_uring_setup")
            .cloned()
            .expect("io");
        assert_eq!(io["outcome"], "succeeded", "{mode:?}: {io}");
        if let Some(out) = check_ci_reports(&f, &["--role", "node"], &r) {
            let line = out.lines().find(|l| l.starts_with("not ok ")).expect("a failing test");
            assert!(line.contains("node/io_uring_setup"), "{mode:?}: {out}");
        }
        f.node_cmd = "[\"/bin/sh\", \"-c\", \"echo node-up; exec sleep 100\"]".into();
        f.write_config();
        let cfg = f.config.display().to_string();
        let o = f.command(&["run", "--config", &cfg]).stdin(Stdio::null()).output().expect("run");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{mode:?}: {err}");
        assert!(err.contains("io_uring_setup") && err.contains("refusing to start"), "{mode:?}: {err}");
        assert!(!String::from_utf8_lossy(&o.stdout).contains("node-up"), "{mode:?}: a role started anyway");
        assert!(!f.p("state/receipt.json").exists(), "{mode:?}: a receipt for a failed preflight");

        // 2. The model dir mounted writable and the engine's rules granting write on it.
        let mut f = Fixture::new(mode, "weak-models");
        // A writable model dir must belong to the engine's user (validation insists).
        let owner = if mode == Mode::Rootful { ENGINE_IDS.0 } else { NOBODY };
        std::os::unix::fs::chown(f.p("models"), Some(owner), Some(owner)).expect("chown");
        f.engine_extra = "models_writable = true".into();
        f.write_config();
        weaken(&mut f, "engine.toml", |t| {
            t.replace(
                "paths = [\"@models\"]\naccess = [\"read\"]",
                "paths = [\"@models\"]\naccess = [\"read\", \"write\"]",
            )
        });
        let (code, r, _) = canary(&f, &["--role", "engine"]);
        assert_eq!(code, Some(1), "{mode:?}: {r}");
        let wm = r["roles"][0]["attempts"]
            .as_array()
            .expect("a")
            .iter()
            .find(|a| a["id"] == "write_models")
            .cloned()
            .expect("wm");
        assert_eq!(wm["outcome"], "succeeded", "{mode:?}: {wm}");
    }
}

struct Run {
    child: Child,
    out: std::sync::mpsc::Receiver<String>,
}

fn start_run(f: &Fixture) -> Run {
    let cfg = f.config.display().to_string();
    let mut child = f
        .command(&["run", "--config", &cfg])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, out) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    Run { child, out }
}

impl Run {
    fn wait_line(&self, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(40);
        while Instant::now() < deadline {
            if let Ok(l) = self.out.recv_timeout(Duration::from_millis(200)) {
                if l.contains(want) {
                    return;
                }
            }
        }
        panic!("no {want:?} within 40s");
    }
    fn stop(mut self) -> Option<i32> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        self.child.wait().ok().and_then(|s| s.code())
    }
}

fn cell_fixture(mode: Mode, name: &str) -> Fixture {
    let mut f = Fixture::new(mode, name);
    f.engine_cmd = "[\"/usr/bin/busybox\", \"httpd\", \"-f\", \"-p\", \"127.0.0.1:18080\", \"-h\", \"/models\"]".into();
    f.node_cmd = "[\"/bin/sh\", \"-c\", \"echo x > /scratch/started-$(cat /proc/sys/kernel/random/uuid); echo node-up; exec sleep 1000\"]".into();
    f.write_config();
    f
}

fn receipt(f: &Fixture) -> Value {
    serde_json::from_slice(&std::fs::read(f.p("state/receipt.json")).expect("receipt")).expect("json")
}

#[test]
fn receipts_are_atomic_valid_and_strictly_increasing() {
    for mode in modes() {
        let f = cell_fixture(mode, "receipt");
        let run = start_run(&f);
        run.wait_line("node-up");
        let r1 = receipt(&f);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(f.p("state/receipt.json")).expect("md").mode() & 0o777, 0o640);
        assert_eq!(r1["schema"], 1);
        assert_eq!(r1["canary"]["passed"], true);
        assert_eq!(r1["kernel"]["userns_mode"], if mode == Mode::Rootful { "rootful" } else { "rootless" });
        for role in ["engine", "node"] {
            assert_eq!(r1["roles"][role]["seccomp_program_sha256"].as_str().expect("sha").len(), 64);
            assert_eq!(r1["roles"][role]["landlock_rules_sha256"].as_str().expect("sha").len(), 64);
        }
        assert_eq!(r1["roles"]["engine"]["program_sha256"].as_str().expect("program"), sha256_file("/usr/bin/busybox"));
        // No temp files left behind.
        let names: Vec<String> = std::fs::read_dir(f.p("state"))
            .expect("state")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{mode:?}: leftovers {names:?}");
        // verify-receipt matches now...
        let cfg = f.config.display().to_string();
        let v = f.command(&["verify-receipt", "--config", &cfg]).output().expect("verify");
        assert_eq!(v.status.code(), Some(0), "{mode:?}: {}", String::from_utf8_lossy(&v.stdout));
        // ...a SIGHUP restart writes a higher generation...
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(run.child.id() as i32), nix::sys::signal::Signal::SIGHUP)
            .expect("hup");
        run.wait_line("node-up");
        let g1 = r1["generation"].as_u64().expect("g");
        let g2 = receipt(&f)["generation"].as_u64().expect("g");
        assert!(g2 > g1, "{mode:?}: {g1} -> {g2}");
        assert_eq!(run.stop(), Some(0));
        // ...so does the next start, even if the counter file is lost...
        std::fs::remove_file(f.p("state/generation")).expect("rm counter");
        let run = start_run(&f);
        run.wait_line("node-up");
        let g3 = receipt(&f)["generation"].as_u64().expect("g");
        assert!(g3 > g2, "{mode:?}: {g2} -> {g3}");
        assert_eq!(run.stop(), Some(0));
        // ...and a changed config no longer matches the receipt.
        let mut text = std::fs::read_to_string(&f.config).expect("cfg");
        text.push_str("# changed\n");
        std::fs::write(&f.config, text).expect("write");
        let v = f.command(&["verify-receipt", "--config", &cfg]).output().expect("verify");
        assert_eq!(v.status.code(), Some(1), "{mode:?}");
        assert!(
            String::from_utf8_lossy(&v.stdout).contains("config sha256"),
            "{mode:?}: {}",
            String::from_utf8_lossy(&v.stdout)
        );
    }
}

fn sha256_file(p: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(std::fs::read(p).expect("read")))
}

/// Send raw bytes to the control socket as the test process; return the response line.
fn raw_request(f: &Fixture, bytes: &[u8]) -> Value {
    let mut s = UnixStream::connect(f.p("run/control.sock")).expect("connect");
    let _ = s.write_all(bytes);
    let mut line = String::new();
    BufReader::new(s).read_line(&mut line).expect("read");
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

fn ctl(f: &Fixture, cmd: &str) -> (Option<i32>, Value) {
    let cfg = f.config.display().to_string();
    let o = f.command(&["ctl", "--config", &cfg, cmd]).output().expect("ctl");
    (o.status.code(), serde_json::from_slice(&o.stdout).unwrap_or(Value::Null))
}

#[test]
fn control_socket_checks_peers_and_requests_and_recycles() {
    if !is_root() {
        return unavailable("rootful", "the test connects as a uid other than the launcher's");
    }
    for mode in modes() {
        let f = cell_fixture(mode, "control");
        let run = start_run(&f);
        run.wait_line("node-up");
        // The launcher's own uid (the default allowlist) gets a status.
        let (code, st) = ctl(&f, "status");
        assert_eq!(code, Some(0), "{mode:?}: {st}");
        assert_eq!(st["roles"][0]["state"], "running");
        assert!(
            st["roles"][1]["pid"].as_i64().is_some() && st["egress"].is_array() && st["receipt"]["generation"].is_u64(),
            "{st}"
        );
        let g1 = st["receipt"]["generation"].as_u64().expect("g");
        match mode {
            // Rootful: the launcher is root; uid 65534 is not on the list.
            Mode::Rootful => {
                let o = std::process::Command::new("/usr/bin/setpriv")
                    .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
                    .arg(&f.bin)
                    .args(["ctl", "--config", &f.config.display().to_string(), "status"])
                    .output()
                    .expect("ctl as 65534");
                let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
                assert_eq!(o.status.code(), Some(1));
                assert_eq!(v["error"], "uid 65534 is not allowed", "{v}");
            }
            // Rootless: the launcher is 65534; root (this test) is not on the list.
            Mode::Rootless => {
                let v = raw_request(&f, b"{\"cmd\":\"status\"}\n");
                assert_eq!(v["error"], "uid 0 is not allowed", "{v}");
            }
        }
        if mode == Mode::Rootful {
            // Bounded, strict requests (as the allowed uid, root).
            assert!(raw_request(&f, &[b'a'; 5000]).to_string().contains("too large"));
            assert!(raw_request(&f, b"{\"cmd\":\"status\"\n").to_string().contains("malformed"));
            assert!(raw_request(&f, b"{\"cmd\":\"reboot\"}\n").to_string().contains("unknown command"));
            assert!(raw_request(&f, b"{\"cmd\":\"status\",\"extra\":1}\n").to_string().contains("unknown field"));
        }
        let before: Vec<_> = std::fs::read_dir(f.p("node-scratch"))
            .expect("scratch")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(before.len(), 1, "{mode:?}: {before:?}");
        // Recycle: new receipt with a higher generation, scratch wiped, roles running again.
        let (code, rc) = ctl(&f, "recycle");
        assert_eq!(code, Some(0), "{mode:?}: {rc}");
        let g2 = rc["generation"].as_u64().expect("g");
        assert!(g2 > g1, "{mode:?}: {g1} -> {g2}");
        assert_eq!(receipt(&f)["generation"].as_u64(), Some(g2));
        run.wait_line("node-up");
        let after: Vec<_> = std::fs::read_dir(f.p("node-scratch"))
            .expect("scratch")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(after.len(), 1, "{mode:?}: {after:?}");
        assert_ne!(before, after, "{mode:?}: scratch was not wiped by the recycle");
        let (_, st) = ctl(&f, "status");
        assert_eq!(st["roles"][1]["state"], "running", "{st}");
        assert_eq!(run.stop(), Some(0));
    }
}

/// Found by review: one silent control client blocked the event loop (egress, signals,
/// status) for the read timeout, and a slow one for hours. Requests are now read without
/// blocking, with a deadline for the whole line.
#[test]
fn a_silent_control_client_does_not_stall_the_supervisor() {
    if !is_root() {
        return unavailable("rootful", "the test connects to the control socket as root");
    }
    let f = cell_fixture(Mode::Rootful, "silent-ctl");
    let run = start_run(&f);
    run.wait_line("node-up");
    let silent: Vec<UnixStream> =
        (0..5).map(|_| UnixStream::connect(f.p("run/control.sock")).expect("connect")).collect();
    let mut slow = UnixStream::connect(f.p("run/control.sock")).expect("connect");
    let _ = slow.write_all(b"{");
    let t = Instant::now();
    let (code, st) = ctl(&f, "status");
    assert_eq!(code, Some(0), "{st}");
    assert!(t.elapsed() < Duration::from_millis(500), "status took {:?} behind silent clients", t.elapsed());
    // The silent ones are answered with a timeout error, not kept forever.
    let mut line = String::new();
    BufReader::new(&silent[0]).read_line(&mut line).expect("read");
    assert!(line.contains("timed out"), "{line}");
    drop(silent);
    assert_eq!(run.stop(), Some(0));
}
