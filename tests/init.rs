//! `sealnode init`: the config it writes passes `check` and runs the real llama-server with
//! SmolLM2 and the real frutebox node, which registers with a stand-in gateway and answers its
//! jobs (rootful and rootless); and its refusals (an existing config, a missing answer off a
//! terminal, paths and interpreter prefixes another user controls), before it changes
//! anything. The config generation itself is unit-tested in src/config/init.rs.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::*;

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
    // Without --config, SEALNODE_CONFIG names the file to write, as for every command (found
    // by a docs audit: init wrote /etc/sealnode/sealnode.toml whatever it said).
    let from_env = d.join("from-env.toml");
    let out = Command::new(bin)
        .args(["init", "--engine", "/usr/bin/true", "--engine-kind", "llama-server", "--engine-port", "8099"])
        .args(["--model", &s(&d.join("models/tiny.gguf")), "--venv", &s(&d.join("venv"))])
        .args(["--gateway-url", "wss://gw.example/provider/ws", "--dry-run"])
        .args(["--state-dir", &s(&d.join("state")), "--runtime-dir", &s(&d.join("run"))])
        .env("SEALNODE_CONFIG", &from_env)
        .stdin(Stdio::null())
        .output_within(COMMAND_LIMIT);
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains(&format!("write {} (0644)", s(&from_env))), "{text}");
    assert!(!from_env.exists(), "--dry-run wrote the config");
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

/// Found by the review of `init`: run as root, it wrote, chowned and copied through paths
/// another user controls (a planted symlink as its temporary config name or as a scratch dir,
/// a credential or venv of theirs), before `check` refused the result. Now it refuses first,
/// changes nothing, and names the path.
#[test]
fn init_as_root_acts_only_where_no_other_user_can_reach() {
    if !is_root() {
        return unavailable("rootful", "the test plays root against another local user's files");
    }
    let dir = tempfile::Builder::new().prefix("sealnode-init-atk-").tempdir_in("/var/tmp").expect("tmp");
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let s = |p: &Path| p.display().to_string();
    fake_venv(&d.join("venv"));
    std::fs::create_dir(d.join("models")).expect("mkdir");
    std::fs::write(d.join("models/tiny.gguf"), "x").expect("model");
    let victim = d.join("victim");
    std::fs::write(&victim, "ROOT ONLY\n").expect("victim");
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let victim_dir = d.join("victim-dir");
    std::fs::create_dir(&victim_dir).expect("mkdir");
    // The other user's dir, with what they planted.
    let theirs = d.join("theirs");
    std::fs::create_dir(&theirs).expect("mkdir");
    std::os::unix::fs::symlink(&victim, theirs.join("credential.txt")).expect("symlink");
    std::os::unix::fs::symlink(&victim, theirs.join("sealnode.toml")).expect("symlink");
    std::fs::create_dir(theirs.join("state")).expect("mkdir");
    std::os::unix::fs::symlink(&victim_dir, theirs.join("state/engine")).expect("symlink");
    fake_venv(&theirs.join("venv"));
    let chown_r = |p: &Path| {
        let st = Command::new("chown").args(["-hR", "1000:1000"]).arg(p).status().expect("chown");
        assert!(st.success());
    };
    chown_r(&theirs);
    let init = |extra: &[&str], state: &Path| {
        Command::new(env!("CARGO_BIN_EXE_sealnode"))
            .args(["init", "--engine", "/usr/bin/true", "--engine-kind", "llama-server", "--engine-port", "8099"])
            .args(["--model", &s(&d.join("models/tiny.gguf")), "--gateway-url", "wss://gw.example/provider/ws"])
            .args(["--state-dir", &s(state), "--runtime-dir", &s(&d.join("run")), "--yes"])
            .args(extra)
            .stdin(Stdio::null())
            .output_within(COMMAND_LIMIT)
    };
    let ours = d.join("ours");
    let venv = s(&d.join("venv"));
    for (what, extra, state, want) in [
        (
            "a config in their dir (over their symlink, --force)",
            vec!["--venv", &venv, "--force", "--config", &s(&theirs.join("sealnode.toml"))],
            ours.join("s1"),
            "is owned by uid 1000",
        ),
        (
            "their credential",
            vec![
                "--venv",
                &venv,
                "--config",
                &s(&ours.join("c2/sealnode.toml")),
                "--credential",
                &s(&theirs.join("credential.txt")),
            ],
            ours.join("s2"),
            "the credential to install",
        ),
        (
            "their venv",
            vec!["--venv", &s(&theirs.join("venv")), "--config", &s(&ours.join("c3/sealnode.toml"))],
            ours.join("s3"),
            "--venv",
        ),
        (
            "a state dir in their dir",
            vec!["--venv", &venv, "--config", &s(&ours.join("c4/sealnode.toml"))],
            theirs.join("state"),
            "owned by another user",
        ),
    ] {
        let o = init(&extra, &state);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{what}: {err}{}", String::from_utf8_lossy(&o.stdout));
        assert!(err.contains(want), "{what}: {err}");
        // Nothing changed: the victims are as they were, no config or dir was made.
        assert_eq!(std::fs::read_to_string(&victim).expect("victim"), "ROOT ONLY\n", "{what}");
        use std::os::unix::fs::MetadataExt;
        let vm = std::fs::metadata(&victim).expect("stat");
        assert_eq!((vm.uid(), vm.mode() & 0o7777), (0, 0o600), "{what}");
        let dm = std::fs::metadata(&victim_dir).expect("stat");
        assert_eq!(dm.uid(), 0, "{what}: the victim dir was chowned");
        assert!(!ours.exists(), "{what}: init made {}", ours.display());
    }
    // An existing scratch dir of another owner, in a trusted state dir: not taken over.
    std::fs::create_dir_all(ours.join("s5/engine")).expect("mkdir");
    chown_r(&ours.join("s5/engine"));
    let o = init(&["--venv", &venv, "--config", &s(&ours.join("c5/sealnode.toml"))], &ours.join("s5"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(125), "{err}");
    assert!(err.contains("init does not take over a dir"), "{err}");
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(ours.join("s5/engine")).expect("stat").uid(), 1000);
}

/// Root copies an interpreter's prefix (for roles that cannot search it) only when it is a
/// Python install (lib/python3.*) in dirs only root can change, with no device, FIFO or socket
/// in it: a venv whose bin/python leads anywhere else is refused, and nothing is copied.
#[test]
fn init_copies_only_a_python_prefix_no_one_else_controls() {
    if !is_root() {
        return unavailable("rootful", "the test plays root against a prefix another user owns");
    }
    let dir = tempfile::Builder::new().prefix("sealnode-init-prefix-").tempdir_in("/var/tmp").expect("tmp");
    let d = dir.path();
    std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let s = |p: &Path| p.display().to_string();
    std::fs::create_dir(d.join("models")).expect("mkdir");
    std::fs::write(d.join("models/tiny.gguf"), "x").expect("model");
    // Under root's 0700 dir: the roles cannot search it, so init plans a copy.
    let hidden = d.join("hidden");
    std::fs::create_dir(&hidden).expect("mkdir");
    std::fs::set_permissions(&hidden, std::fs::Permissions::from_mode(0o700)).expect("chmod");
    let prefix = |name: &str, python: bool| {
        let p = hidden.join(name);
        std::fs::create_dir_all(p.join("bin")).expect("mkdir");
        std::fs::write(p.join("bin/python3"), "not run\n").expect("python3");
        if python {
            std::fs::create_dir_all(p.join("lib/python3.12")).expect("mkdir");
        }
        std::fs::write(p.join("secret"), "ROOT ONLY\n").expect("secret");
        p
    };
    let not_python = prefix("not-python", false);
    let theirs = prefix("theirs", true);
    let st = Command::new("chown").args(["-hR", "1000:1000"]).arg(&theirs).status().expect("chown");
    assert!(st.success());
    let with_fifo = prefix("with-fifo", true);
    nix::unistd::mkfifo(&with_fifo.join("lib/python3.12/fifo"), nix::sys::stat::Mode::from_bits_truncate(0o644))
        .expect("mkfifo");
    for (what, p, want) in [
        ("not a Python install", &not_python, "not a Python install"),
        ("another user's prefix", &theirs, "not a dir of root's (or yours) that no one else can write"),
        ("a prefix with a FIFO", &with_fifo, "holds a device, FIFO or socket"),
    ] {
        let venv = d.join("venv");
        let _ = std::fs::remove_dir_all(&venv);
        std::fs::create_dir_all(venv.join("bin")).expect("mkdir");
        std::fs::write(venv.join("pyvenv.cfg"), format!("home = {}\n", s(&p.join("bin")))).expect("cfg");
        std::os::unix::fs::symlink(p.join("bin/python3"), venv.join("bin/python")).expect("symlink");
        let o = Command::new(env!("CARGO_BIN_EXE_sealnode"))
            .args(["init", "--engine", "/usr/bin/true", "--engine-kind", "llama-server", "--engine-port", "8099"])
            .args(["--model", &s(&d.join("models/tiny.gguf")), "--gateway-url", "wss://gw.example/provider/ws"])
            .args(["--state-dir", &s(&d.join("state")), "--runtime-dir", &s(&d.join("run")), "--yes"])
            .args(["--venv", &s(&venv), "--python-copy", &s(&d.join("pycopy"))])
            .args(["--config", &s(&d.join("c/sealnode.toml"))])
            .stdin(Stdio::null())
            .output_within(COMMAND_LIMIT);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{what}: {err}{}", String::from_utf8_lossy(&o.stdout));
        assert!(err.contains("copy the interpreter") && err.contains(want), "{what}: {err}");
        for made in ["pycopy", "c", "state", "run"] {
            assert!(!d.join(made).exists(), "{what}: init made {made}");
        }
    }
}
