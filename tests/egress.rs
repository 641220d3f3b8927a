//! Egress name resolution (#13, item 3): lookups run off the event loop with a timeout and
//! negative caching, and resolved addresses are held to a deny set. The host's resolver and
//! hosts file are replaced for the test's sealnode only, in a mount namespace the test makes.

mod common;

use std::io::{BufRead, BufReader};
use std::net::UdpSocket;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::*;

struct Cell {
    child: Child,
    err: Arc<Mutex<String>>,
    out: Arc<Mutex<String>>,
}

impl Drop for Cell {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn read_into(pipe: impl std::io::Read + Send + 'static, into: Arc<Mutex<String>>) {
    std::thread::spawn(move || {
        for l in BufReader::new(pipe).lines().map_while(Result::ok) {
            let mut s = into.lock().expect("lock");
            s.push_str(&untag(&l));
            s.push('\n');
        }
    });
}

/// `sealnode run` with its own /etc/resolv.conf and /etc/hosts (bind mounts in a private mount
/// namespace; the launcher, rootful or rootless, is exec'd inside it).
fn start(f: &Fixture, resolv: &str, hosts: &str) -> Cell {
    start_with(f, resolv, hosts, &[])
}

/// [`start`] with `envs` in sealnode's environment.
fn start_with(f: &Fixture, resolv: &str, hosts: &str, envs: &[(&str, &str)]) -> Cell {
    let (r, h) = (f.p("resolv.conf"), f.p("hosts"));
    std::fs::write(&r, resolv).expect("resolv");
    std::fs::write(&h, hosts).expect("hosts");
    let cfg = f.config.display().to_string();
    let inner = f.command(&["run", "--config", &cfg]);
    let mut cmd = Command::new("/usr/bin/unshare");
    cmd.args(["-m", "--propagation", "private", "--", "/bin/sh", "-c"])
        .arg("mount --bind \"$1\" /etc/resolv.conf && mount --bind \"$2\" /etc/hosts && shift 2 && exec \"$@\"")
        .arg("sh")
        .arg(&r)
        .arg(&h)
        .arg(inner.get_program())
        .args(inner.get_args())
        .current_dir(&f.dir)
        .envs(envs.iter().copied())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().expect("spawn");
    let (err, out) = (Arc::new(Mutex::new(String::new())), Arc::new(Mutex::new(String::new())));
    read_into(child.stderr.take().expect("stderr"), err.clone());
    read_into(child.stdout.take().expect("stdout"), out.clone());
    Cell { child, err, out }
}

impl Cell {
    fn err_has(&self, what: &str, secs: u64) {
        let ok = wait_until(Duration::from_secs(secs), || self.err.lock().expect("lock").contains(what));
        assert!(ok, "no {what:?} within {secs}s:\n{}", self.err.lock().expect("lock"));
    }
    fn out_line(&self, pred: impl Fn(&str) -> bool, secs: u64) -> String {
        let mut found = None;
        let ok = wait_until(Duration::from_secs(secs), || {
            found = self.out.lock().expect("lock").lines().find(|l| pred(l)).map(str::to_string);
            found.is_some()
        });
        assert!(ok, "no matching stdout line within {secs}s; stderr:\n{}", self.err.lock().expect("lock"));
        found.expect("line")
    }
    fn stop(mut self) -> (Option<i32>, f64, String) {
        let t = Instant::now();
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        let st = wait_within(&mut self.child, Duration::from_secs(30), "sealnode run");
        let secs = t.elapsed().as_secs_f64();
        std::thread::sleep(Duration::from_millis(100));
        (st.code(), secs, self.err.lock().expect("lock").clone())
    }
}

fn cell(mode: Mode, name: &str, node_sh: &str, egress: &str) -> Fixture {
    let mut f = Fixture::new(mode, name);
    std::fs::write(f.p("models/hello.txt"), "hello\n").expect("write");
    let q = |s: &str| serde_json::to_string(s).expect("quote");
    f.engine_cmd = "[\"/usr/bin/busybox\", \"httpd\", \"-f\", \"-p\", \"127.0.0.1:18080\", \"-h\", \"/models\"]".into();
    f.node_cmd = format!("[\"/usr/bin/busybox\", \"sh\", \"-c\", {}]", q(node_sh));
    let bin = f.p("bin").display().to_string();
    f.node_extra = format!("ro_binds = [{{ src = \"{bin}\", dst = \"/opt/sealnode\" }}]\negress = [{egress}]");
    f.cell_extra = "stop_timeout_s = 2".into();
    f.write_config();
    f
}

/// What `pid`'s fds above stdio are (`pipe:[N]`, `socket:[N]`, a path).
fn fd_targets(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()).is_some_and(|n| n > 2))
                .map(|e| std::fs::read_link(e.path()).map(|l| l.display().to_string()).unwrap_or_default())
                .collect()
        })
        .unwrap_or_default()
}

/// `pid`'s children in its own pid namespace (the cell's init, the lookup helpers; the roles'
/// inits are in namespaces of their own), each with what it holds of `pid`'s fds.
fn children_holding(pid: u32) -> Vec<(u32, Vec<String>)> {
    let ns = |p: u32| std::fs::read_link(format!("/proc/{p}/ns/pid")).ok();
    let theirs = fd_targets(pid);
    let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
    children
        .split_whitespace()
        .filter_map(|c| c.parse::<u32>().ok())
        .filter(|c| ns(*c).is_some() && ns(*c) == ns(pid))
        .map(|c| (c, fd_targets(c).into_iter().filter(|t| theirs.contains(t)).collect()))
        .collect()
}

/// A resolver that never answers: the node's connections wait (then fail after the lookup
/// timeout), while the supervisor keeps answering the control socket at once and stops on
/// SIGTERM within the grace period. The lookup's helper process holds its answer pipe and
/// nothing else of the supervisor's (no listener, connection or socket factory) while it waits.
#[test]
fn a_hanging_resolver_never_stalls_the_supervisor() {
    if !is_root() {
        return unavailable("rootful", "the test replaces /etc/resolv.conf in a mount namespace (root)");
    }
    // The test's resolver: takes queries, never answers.
    let dns = UdpSocket::bind("127.0.0.77:53").expect("bind the silent resolver");
    for mode in modes() {
        let (_up, port) = greeter();
        let node_sh = format!(
            "echo node-up; while true; do /usr/bin/busybox nc -w 8 gw.hang.test {port} </dev/null >/dev/null 2>&1; sleep 0.2; done"
        );
        let f = cell(mode, "dns-hang", &node_sh, &format!("{{ host = \"gw.hang.test\", port = {port} }}"));
        let c = start(&f, "nameserver 127.0.0.77\noptions timeout:30 attempts:1\n", "127.0.0.1 localhost\n");
        c.out_line(|l| l == "node-up", 60);
        c.err_has("egress name lookup started", 30);
        // Of the supervisor's fds, each child in its pid namespace (the cell's init, the
        // lookup's helper) holds one pipe, whose other end the supervisor reads; what the
        // resolver opens in the helper is its own.
        let mut seen = Vec::new();
        let only_a_pipe = wait_until(Duration::from_secs(3), || {
            seen = children_holding(c.child.id());
            !seen.is_empty() && seen.iter().all(|(_, held)| held.len() == 1 && held[0].starts_with("pipe:"))
        });
        assert!(only_a_pipe, "{mode:?}: a child holds more of the supervisor's fds than its pipe: {seen:?}");
        // The lookup hangs: the loop answers anyway, at once. (Rootful the test's root is
        // allowed; rootless the refusal is the loop's answer just the same.)
        for _ in 0..5 {
            let t = Instant::now();
            let line = control_request(&f.p("run/control.sock"), b"{\"cmd\":\"status\"}\n");
            let ms = t.elapsed().as_millis();
            assert!(!line.is_empty() && ms < 100, "{mode:?}: control answered in {ms} ms while a lookup hangs: {line}");
            std::thread::sleep(Duration::from_millis(200));
        }
        c.err_has("egress name lookup failed", 30);
        assert!(c.err.lock().expect("lock").contains("timed out after 5 s"), "{mode:?}");
        // The lookup's helper was among the children checked: it is gone with the lookup
        // (killed when the failure is logged, reaped by the loop just after).
        let helper_gone = wait_until(Duration::from_secs(5), || {
            seen.iter().any(|(p, _)| !std::path::Path::new(&format!("/proc/{p}")).exists())
        });
        assert!(helper_gone, "{mode:?}: none of {seen:?} was the lookup's helper (none gone 5 s after the failure)");
        let (code, secs, err) = c.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        assert!(secs < 5.0, "{mode:?}: stop took {secs:.1}s with a hanging resolver");
    }
    drop(dns);
}

/// An upstream's name is looked up as declared, never with the resolver's search list
/// appended (found by review: with `search evil.test` and Kubernetes' `ndots:5`, the first
/// query was `gw.search.test.evil.test`, and its answer was used; with `ndots:1`, after the
/// name's own NXDOMAIN). The test's resolver answers every name under `evil.test` (with a
/// private address, which the deny set would refuse: nothing leaves the host) and no other;
/// the lookup fails, and no query under the search domain reaches it.
#[test]
fn an_upstream_name_is_looked_up_without_the_search_list() {
    if !is_root() {
        return unavailable("rootful", "the test replaces /etc/resolv.conf in a mount namespace (root)");
    }
    let (dns, asked) = searching_resolver("127.0.0.78:53");
    for mode in modes() {
        // And a one-label name with an alias file in sealnode's environment (found by review:
        // HOSTALIASES mapped it under the search domain).
        for (ndots, name) in [(5, "gw.search.test"), (1, "gw.search.test"), (1, "gwone")] {
            asked.lock().expect("lock").clear();
            let node_sh = format!(
                "echo node-up; while true; do /usr/bin/busybox nc -w 2 {name} 443 </dev/null >/dev/null 2>&1; sleep 0.5; done"
            );
            let f = cell(mode, "dns-search", &node_sh, &format!("{{ host = \"{name}\", port = 443 }}"));
            let resolv =
                format!("nameserver 127.0.0.78\nsearch evil.test\noptions ndots:{ndots} timeout:1 attempts:1\n");
            let aliases = f.p("aliases");
            std::fs::write(&aliases, "gwone gwone.evil.test\n").expect("aliases");
            std::fs::set_permissions(&aliases, std::os::unix::fs::PermissionsExt::from_mode(0o644)).expect("chmod");
            let aliases = aliases.display().to_string();
            let c = start_with(&f, &resolv, "127.0.0.1 localhost\n", &[("HOSTALIASES", &aliases)]);
            c.out_line(|l| l == "node-up", 60);
            c.err_has("egress name lookup failed", 30);
            let (code, _, err) = c.stop();
            let asked = asked.lock().expect("lock").clone();
            assert!(asked.iter().any(|n| n == name), "{mode:?} ndots:{ndots}: {name} was not asked: {asked:?}");
            assert!(
                !asked.iter().any(|n| n.ends_with("evil.test")),
                "{mode:?} ndots:{ndots}: the search list was applied: {asked:?}\n{err}"
            );
            assert!(
                !err.contains("10.66.66.66"),
                "{mode:?} ndots:{ndots}: the search domain's answer was used:\n{err}"
            );
            assert_eq!(code, Some(0), "{mode:?}: {err}");
        }
    }
    drop(dns);
}

/// A resolver on `addr` (UDP) that answers an A query for any name under `evil.test` with
/// 10.66.66.66 and every other query with NXDOMAIN; each name asked is kept.
fn searching_resolver(addr: &str) -> (std::thread::JoinHandle<()>, Arc<Mutex<Vec<String>>>) {
    let sock = UdpSocket::bind(addr).expect("bind the test's resolver");
    let asked: Arc<Mutex<Vec<String>>> = Arc::default();
    let kept = asked.clone();
    let t = std::thread::spawn(move || {
        let mut q = [0u8; 512];
        // Ends with the test process (the socket is never closed before it).
        while let Ok((n, from)) = sock.recv_from(&mut q) {
            let q = &q[..n];
            let (mut i, mut labels) = (12, Vec::new());
            while i < n && q[i] != 0 {
                let len = usize::from(q[i]);
                labels.push(String::from_utf8_lossy(&q[(i + 1).min(n)..(i + 1 + len).min(n)]).into_owned());
                i += 1 + len;
            }
            if i + 5 > n {
                continue;
            }
            let name = labels.join(".");
            let qtype = u16::from_be_bytes([q[i + 1], q[i + 2]]);
            kept.lock().expect("lock").push(name.clone());
            let question = &q[12..i + 5];
            let ours = name.ends_with("evil.test");
            let mut r = vec![
                q[0],
                q[1],
                0x81,
                if ours { 0x80 } else { 0x83 },
                0,
                1,
                0,
                u8::from(ours && qtype == 1),
                0,
                0,
                0,
                0,
            ];
            r.extend_from_slice(question);
            if ours && qtype == 1 {
                r.extend_from_slice(&[0xc0, 0x0c, 0, 1, 0, 1, 0, 0, 0, 60, 0, 4, 10, 66, 66, 66]);
            }
            let _ = sock.send_to(&r, from);
        }
    });
    (t, asked)
}

/// Names that resolve to loopback or to the link-local metadata address are refused and
/// logged with the name and the address; an upstream with an explicit `connect` still works.
#[test]
fn resolved_addresses_are_held_to_the_deny_set() {
    if !is_root() {
        return unavailable("rootful", "the test replaces /etc/hosts in a mount namespace (root)");
    }
    for mode in modes() {
        let (_a, p1) = greeter();
        let (_b, p2) = greeter();
        let (_c, p3) = greeter();
        let node_sh = format!(
            "/opt/sealnode/sealnode __probe-inside --fetch loop.test:{p1} --fetch metadata.test:{p2} --fetch gw.test:{p3}; exec sleep 1000"
        );
        let egress = format!(
            "{{ host = \"loop.test\", port = {p1} }}, {{ host = \"metadata.test\", port = {p2} }}, {{ host = \"gw.test\", port = {p3}, connect = \"127.0.0.1:{p3}\" }}"
        );
        let f = cell(mode, "dns-deny", &node_sh, &egress);
        let c = start(
            &f,
            "nameserver 127.0.0.77\noptions timeout:1 attempts:1\n",
            "127.0.0.1 localhost loop.test\n169.254.169.254 metadata.test\n",
        );
        let n: serde_json::Value =
            serde_json::from_str(&c.out_line(|l| l.contains("\"FRUTEBOX_ENGINE\""), 60)).expect("probe");
        // loop.test resolves to the host's loopback, where an upstream does listen: refused.
        refused(&n, &format!("fetch:loop.test:{p1}"), &[]);
        refused(&n, &format!("fetch:metadata.test:{p2}"), &[]);
        assert_eq!(attempt(&n, &format!("fetch:gw.test:{p3}"))["ok"], true, "{mode:?}: {n}");
        let (code, _, err) = c.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        let refused_line = |name: &str, addr: &str| {
            err.lines().any(|l| {
                l.contains("egress address refused")
                    && l.contains(&format!("name={name}"))
                    && l.contains(&format!("address={addr}"))
            })
        };
        assert!(refused_line("loop.test", "127.0.0.1"), "{mode:?}: {err}");
        assert!(refused_line("metadata.test", "169.254.169.254"), "{mode:?}: {err}");
    }
}
