//! The demo's job round trip, in the suite: the real frutebox-node sealed as the node, the
//! stand-in engine sealed as the engine, the stand-in gateway on the host reached only
//! through declared egress.

mod common;

use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

#[test]
fn job_round_trip_through_the_sealed_node() {
    round_trip(false);
}

/// The Ollama profile (#13): the stand-in with Ollama's process shape (a server that spawns a
/// runner on a random loopback port and proxies to it) under engine-ollama.json/.toml, which
/// allow any bind and connect. Its own network namespace is what confines it; the canary
/// passes while it serves, and the node's egress is the gateway only.
#[test]
fn ollama_shaped_engine_under_the_ollama_profile() {
    round_trip(true);
}

fn round_trip(ollama: bool) {
    let (Ok(copy), Ok(prefix), Ok(venv)) = (
        std::env::var("SEALNODE_TEST_PYTHON"),
        std::env::var("SEALNODE_TEST_PYTHON_PREFIX"),
        std::env::var("SEALNODE_TEST_VENV"),
    ) else {
        return unavailable("frutebox", "SEALNODE_TEST_PYTHON/_PREFIX/_VENV not set (.ci/run prepares them)");
    };
    for (i, mode) in modes().into_iter().enumerate() {
        let mut f = Fixture::new(mode, if ollama { "demo-ollama" } else { "demo" });
        let standin = f.p("standin");
        std::fs::create_dir_all(&standin).expect("mkdir");
        for s in ["standin-engine.py", "standin-gateway.py"] {
            std::fs::copy(repo().join("examples/demo").join(s), standin.join(s)).expect("copy");
        }
        let gw_port = 18765 + i as u16 + (std::process::id() % 500) as u16 * 2 + if ollama { 1000 } else { 0 };
        let py = format!("{venv}/bin/python");
        let binds = format!("ro_binds = [{{ src = \"{copy}\", dst = \"{prefix}\" }}, {{ src = \"{venv}\" }}");
        let shape = if ollama { ", \"--ollama-shape\"" } else { "" };
        f.engine_cmd =
            format!("[\"{py}\", \"-I\", \"-u\", \"/opt/standin/standin-engine.py\", \"--port\", \"18080\"{shape}]");
        if ollama {
            f.engine_policy = "engine-ollama".into();
        }
        f.engine_extra = format!(
            "{binds}, {{ src = \"{}\", dst = \"/opt/standin\" }}]\nready = {{ kind = \"http\", path = \"/\" }}",
            standin.display()
        );
        f.node_cmd = format!(
            "[\"{py}\", \"-I\", \"-u\", \"-m\", \"frutebox.provider\", \"--id\", \"it-node\", \"--gateway-url\", \"ws://gateway.test:{gw_port}/provider/ws\", \"--models\", \"standin\", \"--compute-type\", \"cpu\", \"--memory-gb\", \"2\", \"--cpu-cores\", \"1\"]"
        );
        // The confidential lane (#29): the node reads the evidence a confidential VM's tooling
        // left in a host dir, each file bound alone and read-only; the rest of that dir stays
        // out of its view.
        let tee = f.p("tee");
        std::fs::create_dir_all(&tee).expect("mkdir");
        for (name, text) in
            [("cpu_tee.jwt", "cpu.evidence.jwt"), ("gpu_tee.jwt", "gpu.evidence.jwt"), ("key.pem", "secret")]
        {
            std::fs::write(tee.join(name), text).expect("write evidence");
        }
        let tee_binds = if ollama {
            String::new()
        } else {
            format!(
                ", {{ src = \"{0}/cpu_tee.jwt\", dst = \"/opt/tee/cpu_tee.jwt\" }}, {{ src = \"{0}/gpu_tee.jwt\", dst = \"/opt/tee/gpu_tee.jwt\" }}",
                tee.display()
            )
        };
        f.node_extra = format!(
            "{binds}{tee_binds}]\negress = [{{ host = \"gateway.test\", port = {gw_port}, connect = \"127.0.0.1:{gw_port}\" }}]"
        );
        f.write_config();
        // The node's environment for the Ollama-speaking stand-in engine (replaces the fixture's).
        let text = std::fs::read_to_string(&f.config).expect("read");
        let env = "env = { set = { FRUTEBOX_ENGINE = \"ollama\", OLLAMA_HOST = \"http://127.0.0.1:18080\", FRUTEBOX_OLLAMA_MODEL = \"standin\", FRUTEBOX_NODE_STATE_FILE = \"/scratch/state\" } }";
        let text: String = text
            .lines()
            .map(|l| if l.starts_with("env = { set = { FRUTEBOX_ENGINE") { env.to_string() } else { l.to_string() })
            .collect::<Vec<_>>()
            .join("\n");
        // Where the node looks for the evidence.
        let text = if ollama {
            text
        } else {
            let tee_env = "FRUTEBOX_ENGINE = \"ollama\", FRUTEBOX_TEE_CPU_EVIDENCE = \"/opt/tee/cpu_tee.jwt\", FRUTEBOX_TEE_GPU_EVIDENCE = \"/opt/tee/gpu_tee.jwt\"";
            assert!(text.contains("FRUTEBOX_ENGINE = \"ollama\""), "the node's env line: {text}");
            text.replace("FRUTEBOX_ENGINE = \"ollama\"", tee_env)
        };
        std::fs::write(&f.config, text).expect("write");
        let mut gw_args = vec![
            "-u".to_string(),
            standin.join("standin-gateway.py").display().to_string(),
            "--port".to_string(),
            gw_port.to_string(),
            "--timeout".to_string(),
            "60".to_string(),
        ];
        if !ollama {
            gw_args.extend(["--tee-challenge".to_string(), "c0ffee00c0ffee00c0ffee00".to_string()]);
        }
        let mut gw = Command::new(&py).args(&gw_args).stdout(Stdio::piped()).spawn().expect("gateway");
        std::thread::sleep(Duration::from_millis(500));
        let mut run = f.start_run();
        let (gw_status, gw_out) = run.wait_for_gateway(&mut gw, Duration::from_secs(70), mode);
        let mut canary = None;
        if ollama {
            // The runner child exists (Ollama's shape), and the seal holds while it serves.
            let runners = std::fs::read_dir("/proc")
                .expect("proc")
                .filter_map(|e| e.ok())
                .filter(|e| {
                    std::fs::read(e.path().join("cmdline")).is_ok_and(|c| {
                        String::from_utf8_lossy(&c).contains("standin-engine.py\0--runner")
                            && String::from_utf8_lossy(&c).contains("-I")
                    })
                })
                .count();
            assert!(runners >= 1, "{mode:?}: no stand-in runner process");
            let cfg = f.config.display().to_string();
            canary = Some(f.command(&["canary", "--config", &cfg, "--json"]).output_within(COMMAND_LIMIT));
        }
        let (status, err) = run.stop();
        if let Some(c) = canary {
            let v: serde_json::Value = serde_json::from_slice(&c.stdout).expect("canary json");
            assert_eq!(c.status.code(), Some(0), "{mode:?}: canary with the Ollama profile: {v}");
            assert_eq!(v["passed"], true, "{mode:?}: {v}");
        }
        assert!(gw_status.success(), "{mode:?}: gateway: {gw_out}\nsealnode: {err}");
        assert!(
            gw_out.contains(
                "job-plain result: 'Hello from the sealed stand-in engine. You asked: What is a sealed node?'"
            ),
            "{mode:?}: {gw_out}"
        );
        assert!(gw_out.contains("job-stream result") && gw_out.contains("streamed as"), "{mode:?}: {gw_out}");
        if !ollama {
            assert!(
                gw_out
                    .contains("<- attestation cpu_tee=cpu.evidence.jwt gpu_tee=gpu.evidence.jwt echo=c0ffee00c0ffee00"),
                "{mode:?}: the node did not answer the TEE challenge with the bound evidence: {gw_out}"
            );
            // Only the two files are in the node's view, read-only: not the rest of their dir.
            let cfg = f.config.display().to_string();
            let sh = "cat /opt/tee/cpu_tee.jwt; echo; cat /opt/tee/key.pem || echo NO-KEY; \
                      (: > /opt/tee/cpu_tee.jwt) 2>/dev/null && echo WROTE || echo NO-WRITE";
            let o = f
                .command(&["exec", "--config", &cfg, "--role", "node", "--", "/bin/sh", "-c", sh])
                .output_within(COMMAND_LIMIT);
            let seen = String::from_utf8_lossy(&o.stdout);
            assert_eq!(
                seen.split_whitespace().collect::<Vec<_>>(),
                ["cpu.evidence.jwt", "NO-KEY", "NO-WRITE"],
                "{mode:?}: {seen}\n{}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        assert_eq!(status.code(), Some(0), "{mode:?}: {err}");
        log_line_with(&err, "egress totals", "upstream", &format!("gateway.test:{gw_port}"));
    }
}

/// README's first command, as written: `./scripts/demo` as root seals the real llama-server with
/// SmolLM2 (built by the test command, cached) and the real frutebox node, and a job the gateway
/// stand-in sends is answered by the model.
#[test]
fn the_readme_demo_answers_with_the_real_engine() {
    if !is_root() {
        return unavailable("rootful", "scripts/demo creates role users: it runs as root");
    }
    if std::env::var("SEALNODE_TEST_LLAMA_SERVER").is_err() {
        return unavailable("llama", "SEALNODE_TEST_LLAMA_SERVER is unset (scripts/build-llama-server)");
    }
    let dir = format!("/var/tmp/sealnode-it-demo-script-{}", std::process::id());
    let cache = std::path::Path::new(&std::env::var("SEALNODE_TEST_LLAMA_SERVER").expect("llama"))
        .ancestors()
        .nth(3)
        .expect("cache dir")
        .display()
        .to_string();
    let port = (19500 + std::process::id() % 400).to_string();
    let o = Command::new(repo().join("scripts/demo"))
        .env("SEALNODE_DEMO_BIN", env!("CARGO_BIN_EXE_sealnode"))
        .env("SEALNODE_DEMO_DIR", &dir)
        .env("SEALNODE_TEST_CACHE", &cache)
        .env("SEALNODE_DEMO_GATEWAY_PORT", &port)
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT);
    let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    let _ = std::fs::remove_dir_all(&dir);
    assert!(o.status.success(), "scripts/demo failed:\n{out}");
    assert!(out.contains("the REAL engine (llama-server + SmolLM2)"), "not the real engine:\n{out}");
    assert!(out.contains("[ok  ] engine sandbox"), "no check:\n{out}");
    let answer = out
        .lines()
        .find(|l| l.starts_with("gateway: <- job-plain result: ") && l.contains("backend=llamacpp:smollm2"))
        .unwrap_or_else(|| panic!("no answer from the model:\n{out}"));
    assert!(answer.len() > "gateway: <- job-plain result: '' backend=llamacpp:smollm2".len() + 10, "{answer}");
    assert!(out.contains("demo OK: a job went gateway -> sealed node -> sealed engine (real)"), "{out}");
    // It ends clean: the cell stops while its gateway still serves, so sealnode warns of nothing
    // and the node never loses its gateway (it once reconnected to a closed port at the end).
    let noise: Vec<&str> = out
        .lines()
        .filter(|l| !l.starts_with("engine["))
        .filter(|l| l.contains(" WARN ") || l.contains(" ERROR ") || l.contains("disconnected"))
        .collect();
    assert!(noise.is_empty(), "scripts/demo: {noise:?}\n{out}");
}

/// The cache the demo and the tests run programs from (often as root) must be the invoking
/// user's own: one another user made first in world-writable /var/tmp is refused, untouched.
#[test]
fn a_cache_another_user_planted_is_refused() {
    if !is_root() {
        return unavailable("rootful", "planting as another user needs root to chown");
    }
    let dir = std::path::PathBuf::from(format!("/var/tmp/sealnode-it-planted-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir(&dir).expect("mkdir");
    std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).expect("chown");
    std::fs::write(dir.join("env"), "touch /planted-by-nobody\n").expect("env");
    // Both scripts that fill the cache (found by review: build-llama-server ran a planted cmake).
    std::fs::create_dir_all(dir.join("llm/tools/bin")).expect("mkdir");
    std::os::unix::fs::chown(dir.join("llm"), Some(NOBODY), Some(NOBODY)).expect("chown");
    let run = |script: &str, arg: std::path::PathBuf| {
        let o = Command::new(repo().join(script)).arg(arg).output_within(COMMAND_LIMIT);
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (code, err) = run("scripts/prepare-python", dir.clone());
    let (code2, err2) = run("scripts/build-llama-server", dir.join("llm"));
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("refusing") && err.contains("another user may have made it"), "{err}");
    assert_eq!(code2, Some(1), "{err2}");
    assert!(err2.contains("refusing"), "{err2}");
    assert!(!std::path::Path::new("/planted-by-nobody").exists());
}
