//! The shipped policies run real programs: a Go binary and a C HTTP server under the engine
//! policy, CPython 3.12 with frutebox-node 0.1.0 under the node policy.

mod common;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

#[test]
fn go_runtime_survives_the_engine_filter() {
    let Some(go) = which("/usr/bin/age-keygen") else {
        return unavailable("go", "no Go binary (apt-get install age provides /usr/bin/age-keygen)");
    };
    for mode in modes() {
        let f = Fixture::new(mode, "go");
        let o = f.exec("engine", &[go.to_str().expect("path")]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{mode:?}: Go program failed: {}", String::from_utf8_lossy(&o.stderr));
        assert!(out.contains("AGE-SECRET-KEY-"), "{mode:?}: {out}");
    }
}

#[test]
fn c_http_server_serves_on_loopback_under_the_engine_policy() {
    let (Some(bb), Some(_)) = (which("/usr/bin/busybox"), which("/usr/bin/nsenter")) else {
        return unavailable("httpd", "busybox (apt-get install busybox-static) or nsenter missing");
    };
    if !is_root() {
        return unavailable("httpd", "joining the sandbox's netns as a client needs root in this test");
    }
    for mode in modes() {
        let f = Fixture::new(mode, "httpd");
        std::fs::write(f.p("models/hello.txt"), "served from the sealed engine\n").expect("write");
        let cfg = f.config.display().to_string();
        let bbs = bb.display().to_string();
        let mut server = f
            .command(&[
                "exec",
                "--config",
                &cfg,
                "--role",
                "engine",
                "--",
                &bbs,
                "httpd",
                "-f",
                "-p",
                "127.0.0.1:18080",
                "-h",
                "/models",
            ])
            .stdin(Stdio::null())
            .spawn()
            .expect("spawn");
        let launcher = server.id();
        // The client joins the sandbox's user+net namespaces from the host (the engine has
        // no connect right, so it cannot be its own client).
        let deadline = Instant::now() + Duration::from_secs(10);
        let body = loop {
            let httpd = std::fs::read_dir("/proc")
                .expect("proc")
                .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
                .find(|p| {
                    std::fs::read(format!("/proc/{p}/cmdline"))
                        .map(|c| c.starts_with(b"/usr/bin/busybox\0httpd"))
                        .unwrap_or(false)
                        && std::fs::read_to_string(format!("/proc/{p}/status"))
                            .map(|s| s.contains("NoNewPrivs:\t1"))
                            .unwrap_or(false)
                        && grand_parent(*p) == Some(launcher)
                });
            if let Some(pid) = httpd {
                let o = Command::new("/usr/bin/nsenter")
                    .args([
                        "-t",
                        &pid.to_string(),
                        "-U",
                        "-n",
                        "--preserve-credentials",
                        "--",
                        &bbs,
                        "wget",
                        "-q",
                        "-O",
                        "-",
                        "http://127.0.0.1:18080/hello.txt",
                    ])
                    .output_within(COMMAND_LIMIT);
                if o.status.success() {
                    break String::from_utf8_lossy(&o.stdout).into_owned();
                }
            }
            assert!(Instant::now() < deadline, "{mode:?}: httpd never served");
            std::thread::sleep(Duration::from_millis(50));
        };
        assert_eq!(body, "served from the sealed engine\n", "{mode:?}");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(launcher as i32), nix::sys::signal::Signal::SIGTERM)
            .expect("term");
        let st = wait_within(&mut server, COMMAND_LIMIT, "the sandboxed httpd after SIGTERM");
        assert_eq!(st.code(), Some(128 + libc::SIGTERM), "{mode:?}: SIGTERM forwarded to the workload");
    }
}

fn parent(pid: u32) -> Option<u32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")?.1.split_whitespace().nth(1)?.parse().ok()
}

fn grand_parent(pid: u32) -> Option<u32> {
    parent(parent(pid)?)
}

/// Python 3.12 with frutebox-node, prepared by .ci/run (see there): a world-readable copy of
/// the interpreter (bound at its original prefix, which its RUNPATH names) and a venv.
fn python() -> Option<(String, String, String)> {
    let copy = std::env::var("SEALNODE_TEST_PYTHON").ok()?;
    let prefix = std::env::var("SEALNODE_TEST_PYTHON_PREFIX").ok()?;
    let venv = std::env::var("SEALNODE_TEST_VENV").ok()?;
    std::path::Path::new(&format!("{venv}/bin/python")).exists().then_some((copy, prefix, venv))
}

#[test]
fn frutebox_node_runs_under_the_node_policy() {
    let Some((copy, prefix, venv)) = python() else {
        return unavailable(
            "frutebox",
            "SEALNODE_TEST_PYTHON/_PREFIX/_VENV not set (.ci/run prepares Python 3.12 + frutebox-node 0.1.0)",
        );
    };
    for mode in modes() {
        let mut f = Fixture::new(mode, "frutebox");
        f.node_extra = format!("ro_binds = [{{ src = \"{copy}\", dst = \"{prefix}\" }}, {{ src = \"{venv}\" }}]");
        f.write_config();
        let py = format!("{venv}/bin/python");
        let o = f.exec("node", &[&py, "-I", "-m", "frutebox.provider", "--help"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{mode:?}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(out.contains("frutebox provider node") && out.contains("--gateway-url"), "{mode:?}: {out}");
        // What the node does at start-up: the nvidia-smi probe fails with an errno (not a
        // seccomp kill), TLS context loads the CA store, threads and asyncio work, the state
        // file is written in its own dir (truncated in place, as frutebox-node does).
        let script = r#"
import subprocess, ssl, asyncio, threading, os
try:
    subprocess.run(["nvidia-smi"], capture_output=True)
    print("nvidia-smi ran")
except OSError as e:
    print("nvidia-smi errno", e.errno)
ctx = ssl.create_default_context()
assert ctx.cert_store_stats()["x509_ca"] > 0
async def main():
    await asyncio.sleep(0)
    return "asyncio"
print(asyncio.run(main()))
t = threading.Thread(target=print, args=("thread",)); t.start(); t.join()
open("/scratch/state.json", "w").write("{}")
try:
    os.replace("/scratch/state.json", "/scratch/moved.json")
except OSError as e:
    print("rename errno", e.errno)
print(open("/run/sealnode/credential").read().strip())
"#;
        let o = f.exec("node", &[&py, "-I", "-c", script]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(0), "{mode:?}: {}\n{out}", String::from_utf8_lossy(&o.stderr));
        assert!(out.contains("nvidia-smi errno 2"), "{mode:?}: {out}");
        // frutebox-node truncates its state file in place; renames are not in the fitted filter.
        assert!(out.contains("rename errno 38"), "{mode:?}: {out}");
        assert!(
            out.contains("asyncio") && out.contains("thread") && out.contains("node-credential-token"),
            "{mode:?}: {out}"
        );
        assert!(f.p("node-scratch/state.json").exists());
    }
}
