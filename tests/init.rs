//! `sealnode init`: the config it writes passes `check` and runs the real llama-server with
//! SmolLM2 and the real frutebox node, which registers with a stand-in gateway and answers its
//! jobs (rootful and rootless); and its refusals (an existing config, a missing answer off a
//! terminal). The config generation itself is unit-tested in src/init.rs.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

struct Real {
    server: String,
    model: String,
    pycopy: String,
    prefix: String,
    venv: String,
}

fn real() -> Option<Real> {
    let v = |k: &str| std::env::var(k).ok().filter(|p| Path::new(p).exists());
    Some(Real {
        server: v("SEALNODE_TEST_LLAMA_SERVER")?,
        model: v("SEALNODE_TEST_MODEL")?,
        pycopy: v("SEALNODE_TEST_PYTHON")?,
        prefix: std::env::var("SEALNODE_TEST_PYTHON_PREFIX").ok()?,
        venv: v("SEALNODE_TEST_VENV")?,
    })
}

/// The checkout's policies in a root-owned tree laid out as installed (seccomp/, landlock-rules/).
fn policy_tree(f: &Fixture) -> String {
    for (sub, ext) in [("seccomp", "json"), ("landlock-rules", "toml")] {
        let dir = f.p(&format!("policies/{sub}"));
        std::fs::create_dir_all(&dir).expect("mkdir");
        for e in std::fs::read_dir(repo().join(sub)).expect("policies") {
            let src = e.expect("entry").path();
            if src.extension().is_some_and(|x| x == ext) {
                let dst = dir.join(src.file_name().expect("name"));
                std::fs::copy(&src, &dst).expect("copy");
                std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o644)).expect("chmod");
            }
        }
    }
    f.p("policies").display().to_string()
}

#[test]
fn init_writes_a_config_that_checks_and_runs_the_real_engine_and_node() {
    let Some(r) = real() else {
        return unavailable("llama", "SEALNODE_TEST_LLAMA_SERVER/_MODEL or the Python env are not prepared (scripts/build-llama-server, scripts/prepare-python)");
    };
    for (i, mode) in modes().into_iter().enumerate() {
        let mut f = Fixture::new(mode, "init");
        let policies = policy_tree(&f);
        // Rootless, init runs as uid 65534: its dirs go in one it owns.
        let home = f.p("home");
        std::fs::create_dir(&home).expect("mkdir");
        if mode == Mode::Rootless && is_root() {
            std::os::unix::fs::chown(&home, Some(NOBODY), Some(NOBODY)).expect("chown");
        }
        let cred = home.join("credential.in");
        std::fs::write(&cred, "node-credential-token\n").expect("credential");
        std::fs::set_permissions(&cred, std::fs::Permissions::from_mode(0o400)).expect("chmod");
        if mode == Mode::Rootless && is_root() {
            std::os::unix::fs::chown(&cred, Some(NOBODY), Some(NOBODY)).expect("chown");
        }
        let gw_port = 19200 + i as u16 + (std::process::id() % 40) as u16 * 2;
        let config = home.join("sealnode.toml");
        // The interpreter's prefix lies under root's 0700 home: rootful, init copies it into the
        // fixture and binds the copy at the prefix (the dst case); rootless, uid 65534 cannot
        // read it at all, so init reuses the copy the test cache made.
        let pycopy = match mode {
            Mode::Rootful => f.p("pycopy/python").display().to_string(),
            Mode::Rootless => r.pycopy.clone(),
        };
        let (h, c, url) = (
            home.display().to_string(),
            config.display().to_string(),
            format!("ws://gateway.test:{gw_port}/provider/ws"),
        );
        let connect = format!("127.0.0.1:{gw_port}");
        let (state, run) = (format!("{h}/state"), format!("{h}/run"));
        let args = [
            "init",
            "--engine",
            &r.server,
            "--model",
            &r.model,
            "--venv",
            &r.venv,
            "--python-copy",
            &pycopy,
            "--gateway-url",
            &url,
            "--gateway-connect",
            &connect,
            "--node-id",
            "init-llama",
            "--memory-gb",
            "2",
            "--cpu-cores",
            "1",
            "--engine-port",
            "18080",
            "--engine-arg",
            "-t",
            "--engine-arg",
            "1",
            "--engine-arg",
            "-c",
            "--engine-arg",
            "2048",
            "--credential",
            &cred.display().to_string(),
            "--config",
            &c,
            "--state-dir",
            &state,
            "--runtime-dir",
            &run,
            "--policy-dir",
            &policies,
        ];
        let out = f.command(&args).stdin(Stdio::null()).output_within(COMMAND_LIMIT);
        let text = std::fs::read_to_string(&config).unwrap_or_default();
        let said = format!("{}{}\n{text}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
        assert_eq!(out.status.code(), Some(0), "{mode:?}: init: {said}");
        assert!(said.contains("written and checked"), "{mode:?}: {said}");
        // The dst case: the interpreter seen at its own prefix, from the copy.
        assert!(text.contains(&format!("{{ src = \"{pycopy}\", dst = \"{}\" }}", r.prefix)), "{mode:?}: {text}");
        assert_eq!(text.contains("rootful ="), mode == Mode::Rootful, "{mode:?}: {text}");
        let meta = std::fs::metadata(home.join("credential")).expect("installed credential");
        assert_eq!(meta.permissions().mode() & 0o777, 0o400, "{mode:?}");
        // A second init keeps the config.
        let again = f.command(&args).stdin(Stdio::null()).output_within(COMMAND_LIMIT);
        assert_eq!(again.status.code(), Some(125), "{mode:?}: {}", String::from_utf8_lossy(&again.stderr));
        assert!(String::from_utf8_lossy(&again.stderr).contains("--force"), "{mode:?}");
        f.config = config.clone();
        let check = f.command(&["check", "--config", &c]).output_within(COMMAND_LIMIT);
        assert_eq!(check.status.code(), Some(0), "{mode:?}: check: {}", String::from_utf8_lossy(&check.stdout));
        // Run it: the node registers with the stand-in gateway and answers its jobs.
        let py = format!("{}/bin/python", r.venv);
        let gw_script = repo().join("examples/demo/standin-gateway.py").display().to_string();
        let mut gw = Command::new(&py)
            .args(["-u", &gw_script, "--port", &gw_port.to_string(), "--model", "smollm2", "--timeout", "150"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("gateway");
        let mut cell = f.start_run();
        let (gw_status, gw_out) = cell.wait_for_gateway(&mut gw, Duration::from_secs(170), mode);
        let (status, err) = cell.stop();
        assert!(gw_out.contains("job round trip complete"), "{mode:?}: {gw_out}\nsealnode: {err}");
        assert!(gw_status.success(), "{mode:?}: gateway: {gw_out}\nsealnode: {err}");
        assert_eq!(status.code(), Some(0), "{mode:?}: {err}");
        if mode == Mode::Rootful {
            let _ = std::fs::remove_dir_all(f.p("pycopy"));
        }
    }
}

/// A venv whose interpreter is the system's (/usr: nothing to bind for it), enough for
/// init's derivations without the test cache.
fn fake_venv(dir: &Path) {
    std::fs::create_dir_all(dir.join("bin")).expect("mkdir");
    std::fs::write(dir.join("pyvenv.cfg"), "home = /usr/bin\n").expect("cfg");
    std::os::unix::fs::symlink("/usr/bin/python3", dir.join("bin/python")).expect("symlink");
}

#[test]
fn init_dry_run_writes_nothing_and_missing_answers_are_named() {
    let dir = tempfile::Builder::new().prefix("sealnode-init-").tempdir_in("/var/tmp").expect("tmp");
    let d = dir.path();
    fake_venv(&d.join("venv"));
    std::fs::create_dir(d.join("models")).expect("mkdir");
    std::fs::write(d.join("models/tiny.gguf"), "x").expect("model");
    let bin = env!("CARGO_BIN_EXE_sealnode");
    let cfg = d.join("out.toml");
    let s = |p: &Path| p.display().to_string();
    let out = Command::new(bin)
        .args(["init", "--engine", "/usr/bin/true", "--engine-kind", "llama-server", "--engine-port", "8099"])
        .args(["--model", &s(&d.join("models/tiny.gguf")), "--venv", &s(&d.join("venv"))])
        .args(["--gateway-url", "wss://gw.example/provider/ws", "--config", &s(&cfg), "--dry-run"])
        .args(["--state-dir", &s(&d.join("state")), "--runtime-dir", &s(&d.join("run"))])
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(!cfg.exists() && !d.join("state").exists(), "--dry-run changed the host");
    for want in [
        "\"-m\", \"/models/tiny.gguf\"",
        "\"--port\", \"8099\"",
        "port = 8099",
        "FRUTEBOX_LLAMACPP_HOST = \"http://127.0.0.1:8099\"",
        "egress = [{ host = \"gw.example\", port = 443 }]",
        "\"--models\", \"tiny\"",
        "/usr/share/sealnode/seccomp/engine.json",
    ] {
        assert!(text.contains(want), "missing {want:?} in:\n{text}");
    }
    // The system interpreter is in every role's view: only the venv is bound.
    assert!(text.contains(&format!("ro_binds = [{{ src = \"{}\" }}]", s(&d.join("venv")))), "{text}");
    // Off a terminal, a missing answer is a usage error naming the flags.
    let out = Command::new(bin).args(["init", "--config", &s(&cfg)]).stdin(Stdio::null()).output_within(COMMAND_LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("--engine, --model, --venv, --gateway-url"), "{err}");
    // A gateway named by address cannot be declared as egress: the fix is named.
    let out = Command::new(bin)
        .args(["init", "--engine", "/usr/bin/true", "--engine-kind", "llama-server"])
        .args(["--model", &s(&d.join("models/tiny.gguf")), "--venv", &s(&d.join("venv"))])
        .args(["--gateway-url", "ws://10.0.0.1:8000/ws", "--config", &s(&cfg), "--dry-run"])
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("--gateway-connect 10.0.0.1:8000"), "{err}");
}
