//! Config parsing and validation: every bad input gets one error naming file, field, reason.

use super::host::{in_system_view, in_units};
use super::*;
use crate::error::{Error, Result};
use crate::os::trusted::atomic_writer;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

const GOOD: &str = r#"
schema = 1
[cell]
state_dir = "/var/lib/sealnode"
runtime_dir = "/run/sealnode"
[engine]
command = ["/usr/bin/llama-server", "--port", "8080"]
port = 8080
seccomp = "/usr/share/sealnode/seccomp/engine.json"
landlock = "/usr/share/sealnode/landlock-rules/engine.toml"
models = "/srv/models"
scratch = "/var/lib/sealnode/engine"
[node]
command = ["/opt/venv/bin/python", "-I", "-m", "frutebox.provider"]
seccomp = "/usr/share/sealnode/seccomp/node.json"
landlock = "/usr/share/sealnode/landlock-rules/node.toml"
scratch = "/var/lib/sealnode/node"
credential = "/etc/sealnode/credential"
ro_binds = [{ src = "/opt/venv" }]
"#;

fn parse(text: &str) -> Result<Config> {
    Config::parse(text, Path::new("/etc/sealnode/test.toml"))
}

/// Parse `text` and return the error's (field, reason); panics if it parses.
fn bad(text: &str) -> (String, String) {
    match parse(text).map_err(plain) {
        Ok(_) => panic!("config unexpectedly valid:\n{text}"),
        Err(Error::Config { file, field, reason }) => {
            assert_eq!(file, Path::new("/etc/sealnode/test.toml"));
            (field, reason)
        }
        Err(e) => panic!("not a config error: {e}"),
    }
}

/// The first problem, its field without the line note (tests of one problem name the field;
/// the lines and the list of problems have their own tests).
fn plain(e: Error) -> Error {
    match e {
        Error::Problems(mut v) if !v.is_empty() => plain(v.remove(0)),
        Error::Config { file, field, reason } => {
            Error::Config { file, field: field.split(" (").next().unwrap_or_default().to_string(), reason }
        }
        e => e,
    }
}

fn with(from: &str, to: &str) -> String {
    assert!(GOOD.contains(from), "{from}");
    GOOD.replacen(from, to, 1)
}

/// `cell.control_uids` naming the overflow uid is refused where the user namespace leaves host
/// uids unmapped (every unmapped host user connects as it), naming the field and the reason;
/// in the initial namespace, and for any other uid, it passes.
#[test]
fn control_uids_may_not_name_the_overflow_uid_of_a_partial_namespace() {
    use crate::os::overflow::Overflow;
    let partial = Overflow { uid: 65534, gid: 65534, every_uid_mapped: false, every_gid_mapped: false };
    let initial = Overflow { every_uid_mapped: true, every_gid_mapped: true, ..partial };
    let cfg = parse(&with("[cell]\n", "[cell]\ncontrol_uids = [0, 65534]\n")).expect("parses");
    match cfg.check_control_uids(&partial) {
        Err(Error::Config { file, field, reason }) => {
            assert_eq!(
                (file.as_path(), field.as_str()),
                (Path::new("/etc/sealnode/test.toml"), "cell.control_uids[1]")
            );
            assert!(reason.contains("overflow uid") && reason.contains("does not map"), "{reason}");
        }
        other => panic!("not refused: {other:?}"),
    }
    assert!(cfg.check_control_uids(&initial).is_ok());
    let cfg = parse(&with("[cell]\n", "[cell]\ncontrol_uids = [0, 1000]\n")).expect("parses");
    assert!(cfg.check_control_uids(&partial).is_ok());
    assert!(parse(GOOD).expect("parses").check_control_uids(&partial).is_ok());
}

#[test]
fn good_config_parses() {
    let c = parse(GOOD).expect("valid");
    assert_eq!(c.engine.port, Some(8080));
    assert_eq!(c.cell.hostname, "sealnode");
    assert_eq!(c.node.rlimits.nofile, 4096);
}

#[test]
fn unknown_key_is_named() {
    let e = parse(&with("port = 8080", "port = 8080\ncolour = \"red\"")).expect_err("unknown");
    assert!(e.to_string().contains("engine.colour (line 9): unknown field"), "{e}");
    // Nothing close: the names it knows (not a guess).
    let (field, reason) = bad(&with("port = 8080", "port = 8080\nzzzzqqq = 1"));
    assert_eq!(field, "engine.zzzzqqq");
    assert!(reason.contains("unknown field (expected ") && reason.contains("models_writable"), "{reason}");
    // Close to one: that one, not all 22.
    let (_, reason) = bad(&with("port = 8080", "port = 8080\nmodel_writable = true"));
    assert_eq!(reason, "unknown field; did you mean `models_writable`? (docs/config.md)");
}

#[test]
fn relative_path_is_refused() {
    let (field, reason) = bad(&with("scratch = \"/var/lib/sealnode/engine\"", "scratch = \"var/lib/engine\""));
    assert_eq!(field, "engine.scratch");
    assert!(reason.contains("relative"), "{reason}");
    let (field, _) = bad(&with("/usr/share/sealnode/seccomp/node.json", "seccomp/node.json"));
    assert_eq!(field, "node.seccomp");
    let (field, _) = bad(&with("\"/usr/bin/llama-server\"", "\"llama-server\""));
    assert_eq!(field, "engine.command[0]");
}

#[test]
fn dotdot_is_refused() {
    let (field, reason) = bad(&with("models = \"/srv/models\"", "models = \"/srv/../etc\""));
    assert_eq!(field, "engine.models");
    assert!(reason.contains(".."));
}

#[test]
fn ready_kind_is_tcp_or_http() {
    let (field, reason) = bad(&with("port = 8080", "port = 8080\nready = { kind = \"udp\" }"));
    assert_eq!(field, "engine.ready.kind");
    assert!(reason.contains("expected `tcp` or `http`"), "{reason}");
    for (kind, want) in [("tcp", ReadyKind::Tcp), ("http", ReadyKind::Http)] {
        let c = parse(&with("port = 8080", &format!("port = 8080\nready = {{ kind = \"{kind}\" }}"))).expect(kind);
        assert_eq!(c.engine.ready().kind, want);
    }
    assert_eq!(parse(GOOD).expect("good").engine.ready().kind, ReadyKind::Tcp, "the default");
}

#[test]
fn port_out_of_range() {
    let (field, reason) = bad(&with("port = 8080", "port = 70000"));
    assert_eq!(field, "engine.port");
    assert!(reason.contains("out of range"), "{reason}");
    let (field, _) = bad(&with("port = 8080", "port = 0"));
    assert_eq!(field, "engine.port");
    let (field, _) = bad(&with("port = 8080\n", ""));
    assert_eq!(field, "engine.port");
}

#[test]
fn node_may_not_listen_or_see_models() {
    let (field, _) =
        bad(&with("scratch = \"/var/lib/sealnode/node\"", "scratch = \"/var/lib/sealnode/node\"\nport = 9000"));
    assert_eq!(field, "node.port");
    let (field, _) = bad(&with(
        "scratch = \"/var/lib/sealnode/node\"",
        "scratch = \"/var/lib/sealnode/node\"\nmodels = \"/srv/m2\"",
    ));
    assert_eq!(field, "node.models");
}

#[test]
fn writable_dir_overlapping_readonly_is_refused() {
    // Engine scratch inside the model dir.
    let (field, reason) = bad(&with("scratch = \"/var/lib/sealnode/engine\"", "scratch = \"/srv/models/tmp\""));
    assert_eq!(field, "engine.scratch");
    assert!(reason.contains("overlaps"), "{reason}");
    // Node scratch containing the venv bind.
    let (field, _) = bad(&with("scratch = \"/var/lib/sealnode/node\"", "scratch = \"/opt\""));
    assert_eq!(field, "node.scratch");
    // Both roles sharing one writable dir.
    let (field, _) = bad(&with("scratch = \"/var/lib/sealnode/node\"", "scratch = \"/var/lib/sealnode/engine\""));
    assert!(field.ends_with(".scratch"), "{field}");
}

#[test]
fn proxy_variables_never_pass() {
    let (field, reason) = bad(&with(
        "ro_binds = [{ src = \"/opt/venv\" }]",
        "ro_binds = [{ src = \"/opt/venv\" }]\nenv = { pass = [\"HTTPS_PROXY\"] }",
    ));
    assert_eq!(field, "node.env.pass[0]");
    assert!(reason.contains("proxy"));
    let (field, _) = bad(&with(
        "ro_binds = [{ src = \"/opt/venv\" }]",
        "ro_binds = [{ src = \"/opt/venv\" }]\nenv = { set = { all_proxy = \"x\" } }",
    ));
    assert_eq!(field, "node.env.set.all_proxy");
}

#[test]
fn schema_versions() {
    let (field, reason) = bad(&GOOD.replace("schema = 1", "schema = 2"));
    assert_eq!(field, "schema");
    assert!(reason.contains("newer"), "{reason}");
    let (field, _) = bad(&GOOD.replace("schema = 1", ""));
    assert_eq!(field, "schema");
}

#[test]
fn sha256_pin_format() {
    let (field, _) = bad(&with("port = 8080", "port = 8080\nsha256 = \"abc\""));
    assert_eq!(field, "engine.sha256");
    parse(&with("port = 8080", &format!("port = 8080\nsha256 = \"{}\"", "a".repeat(64)))).expect("valid pin");
}

#[test]
fn reserved_bind_destinations() {
    let (field, _) =
        bad(&with("ro_binds = [{ src = \"/opt/venv\" }]", "ro_binds = [{ src = \"/opt/venv\", dst = \"/proc/x\" }]"));
    assert_eq!(field, "node.ro_binds[0].dst");
}

#[test]
fn rootful_users_must_differ_and_be_unprivileged() {
    let (field, _) = bad(&with(
        "runtime_dir = \"/run/sealnode\"",
        "runtime_dir = \"/run/sealnode\"\nrootful = { engine = \"a\", node = \"a\" }",
    ));
    assert_eq!(field, "cell.rootful.node");
    let (field, _) = bad(&with(
        "runtime_dir = \"/run/sealnode\"",
        "runtime_dir = \"/run/sealnode\"\nrootful = { engine = \"0:0\", node = \"5:5\" }",
    ));
    assert_eq!(field, "cell.rootful.engine");
}

// ---- host checks (real files in a temp dir) ----

struct Host {
    dir: tempfile::TempDir,
}

impl Host {
    fn new() -> Host {
        let dir = tempfile::tempdir().expect("tempdir");
        let h = Host { dir };
        for d in ["models", "escratch", "nscratch", "venv", "pol"] {
            std::fs::create_dir(h.p(d)).expect("mkdir");
            std::fs::set_permissions(h.p(d), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        std::fs::set_permissions(h.dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        std::fs::write(h.p("cred"), "c").expect("write");
        std::fs::set_permissions(h.p("cred"), std::fs::Permissions::from_mode(0o600)).expect("chmod");
        if nix::unistd::geteuid().is_root() {
            // Rootful: writable dirs and the credential belong to the role users.
            for (p, id) in [("escratch", 61001), ("nscratch", 61002), ("cred", 61002)] {
                std::os::unix::fs::chown(h.p(p), Some(id), Some(id)).expect("chown");
            }
        }
        for f in ["pol/engine.json", "pol/node.json", "pol/engine.toml", "pol/node.toml"] {
            std::fs::write(h.p(f), "{}").expect("write");
            std::fs::set_permissions(h.p(f), std::fs::Permissions::from_mode(0o644)).expect("chmod");
        }
        h
    }
    fn p(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }
    fn config(&self) -> String {
        let d = self.dir.path().display();
        format!(
            r#"schema = 1
[cell]
state_dir = "{d}"
runtime_dir = "{d}"
rootful = {{ engine = "61001:61001", node = "61002:61002" }}
[engine]
command = ["/usr/bin/true"]
port = 8080
seccomp = "{d}/pol/engine.json"
landlock = "{d}/pol/engine.toml"
models = "{d}/models"
scratch = "{d}/escratch"
[node]
command = ["/usr/bin/true"]
seccomp = "{d}/pol/node.json"
landlock = "{d}/pol/node.toml"
scratch = "{d}/nscratch"
credential = "{d}/cred"
ro_binds = [{{ src = "{d}/venv", dst = "/opt/venv" }}]
"#
        )
    }
    /// Run the host checks as if invoked by `inv`.
    fn check(&self, text: &str, inv: Invoker) -> Result<Config> {
        let f = self.p("c.toml");
        std::fs::write(&f, text).expect("write");
        std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        Config::load(&f, &inv).map_err(plain)
    }
    fn me(&self) -> Invoker {
        // Rootless as the file owner: ownership checks compare against this uid.
        let md = std::fs::metadata(self.dir.path()).expect("stat");
        Invoker { uid: md.uid(), gid: md.gid() }
    }
}

fn host_bad(h: &Host, text: &str) -> (String, String) {
    match h.check(text, h.me()) {
        Ok(_) => panic!("host check unexpectedly passed"),
        Err(Error::Config { field, reason, .. }) => (field, reason),
        Err(e) => panic!("not a config error: {e}"),
    }
}

#[test]
fn host_good() {
    let h = Host::new();
    h.check(&h.config(), h.me()).expect("valid");
}

#[test]
fn host_missing_file() {
    let h = Host::new();
    std::fs::remove_dir(h.p("models")).expect("rm");
    let (field, reason) = host_bad(&h, &h.config());
    assert_eq!(field, "engine.models");
    assert!(reason.contains("does not exist"), "{reason}");
    let h = Host::new();
    std::fs::remove_file(h.p("pol/node.json")).expect("rm");
    let (field, _) = host_bad(&h, &h.config());
    assert_eq!(field, "node.seccomp");
}

#[test]
fn host_symlinked_role_dir() {
    let h = Host::new();
    std::fs::create_dir(h.p("real")).expect("mkdir");
    std::fs::set_permissions(h.p("real"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    std::fs::remove_dir(h.p("models")).expect("rm");
    std::os::unix::fs::symlink(h.p("real"), h.p("models")).expect("symlink");
    let (field, reason) = host_bad(&h, &h.config());
    assert_eq!(field, "engine.models");
    assert!(reason.contains("symlink"), "{reason}");
}

#[test]
fn host_world_writable_dir() {
    let h = Host::new();
    std::fs::set_permissions(h.p("models"), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let (field, reason) = host_bad(&h, &h.config());
    assert_eq!(field, "engine.models");
    assert!(reason.contains("writable by group or others"), "{reason}");
}

#[test]
fn host_dir_owned_by_another_user() {
    // As another user than root, the config file itself (the test's own) is refused first.
    if !crate::os::trusted::tests::root_or_skip("host_dir_owned_by_another_user") {
        return;
    }
    let h = Host::new();
    let mut inv = h.me();
    // Pretend the launcher is someone else: the scratch dir then belongs to another user.
    inv.uid = inv.uid.wrapping_add(4242);
    match h.check(&h.config(), inv) {
        Err(Error::Config { field, reason, .. }) => {
            assert!(
                field.ends_with("scratch")
                    || field.ends_with("models")
                    || field.ends_with("credential")
                    || field.contains("ro_binds"),
                "{field}"
            );
            assert!(reason.contains("owned by uid"), "{reason}");
        }
        other => panic!("expected ownership error, got {other:?}"),
    }
}

#[test]
fn host_credential_readable_by_others() {
    let h = Host::new();
    std::fs::set_permissions(h.p("cred"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let (field, reason) = host_bad(&h, &h.config());
    assert_eq!(field, "node.credential");
    assert!(reason.contains("readable by group or others"), "{reason}");
}

/// A hard link to the credential is a name no path check sees (in the engine's model dir,
/// rootless, the engine could read it): refused at load and by the check every start makes.
#[test]
fn a_credential_with_a_second_name_is_refused_at_every_start() {
    let h = Host::new();
    let cfg = h.check(&h.config(), h.me()).expect("loads with one name");
    std::fs::hard_link(h.p("cred"), h.p("cred.other")).expect("link");
    let (field, reason) = host_bad(&h, &h.config());
    assert_eq!(field, "node.credential");
    assert!(reason.contains("has 2 hard links"), "{reason}");
    let r = RolePath { field: "node.credential".into(), path: &h.p("cred"), writable: false, kind: PathKind::Secret };
    match cfg.checked_role_path(Role::Node, &r, &h.me()).map_err(plain) {
        Err(Error::Config { reason, .. }) => assert!(reason.contains("has 2 hard links"), "{reason}"),
        other => panic!("a start took a credential with two names: {other:?}"),
    }
}

/// The system view (/usr, /etc/ssl, ...) is every role's to read: no credential there.
#[test]
fn a_credential_in_the_system_view_is_refused() {
    let h = Host::new();
    let d = h.dir.path().display().to_string();
    let text = h.config().replace(&format!("{d}/cred\""), "/usr/share/sealnode-nothing/credential\"");
    let (field, reason) = host_bad(&h, &text);
    assert_eq!(field, "node.credential");
    assert!(reason.contains("is under /usr, which every role sees read-only"), "{reason}");
}

#[test]
fn host_config_writable_by_non_root_when_root() {
    // The launcher is root here: as another user, the test's dirs are another user's to root.
    if !crate::os::trusted::tests::root_or_skip("host_config_writable_by_non_root_when_root") {
        return;
    }
    let h = Host::new();
    let f = h.p("c.toml");
    std::fs::write(&f, h.config()).expect("write");
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let inv = Invoker { uid: 0, gid: 0 };
    match Config::load(&f, &inv).map_err(plain) {
        Err(Error::Config { field, reason, .. }) => {
            assert_eq!(field, "(config file)");
            assert!(reason.contains("writable by group or others") && reason.contains("chmod go-w"), "{reason}");
        }
        other => panic!("expected refusal, got {other:?}"),
    }
}

/// The config, its policies and the credential, laid out as kubelet lays out a ConfigMap and
/// a Secret volume (`NAME -> ..data/NAME`, `..data -> ..TIMESTAMP`): the config loads through
/// the links, and the credential is checked and bound from its timestamped dir, the path with
/// no symlink in it, resolved again after the Secret's update. Each refusal the links may
/// meet names the field: (what, the credential link's target, words).
#[test]
fn a_credential_in_a_secret_volume_is_bound_from_its_real_path() {
    let h = Host::new();
    let (cm, secret) = (h.p("cm"), h.p("secret"));
    for d in [&cm, &secret] {
        std::fs::create_dir(d).expect("mkdir");
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }
    let d = h.dir.path().display().to_string();
    let text = h
        .config()
        .replace(&format!("{d}/cred\""), &format!("{}\"", secret.join("credential").display()))
        .replace(&format!("{d}/pol/node.json"), &cm.join("node.json").display().to_string());
    atomic_writer(&cm, &[("sealnode.toml", &text, 0o644), ("node.json", "{}", 0o644)], false);
    let real = atomic_writer(&secret, &[("credential", "token", 0o400)], false);
    let owner = std::fs::metadata(h.p("cred")).expect("stat").uid();
    std::os::unix::fs::chown(real.join("credential"), Some(owner), Some(owner)).expect("chown");
    let cfg = Config::load(&cm.join("sealnode.toml"), &h.me()).map_err(plain).expect("loads through the links");
    let cred = |cfg: &Config| {
        let r = RolePath {
            field: "node.credential".into(),
            path: cfg.node.credential.as_deref().expect("credential"),
            writable: false,
            kind: PathKind::Secret,
        };
        cfg.checked_role_path(Role::Node, &r, &h.me())
    };
    assert_eq!(cred(&cfg).expect("checked").1, real.join("credential"));
    let real = atomic_writer(&secret, &[("credential", "token2", 0o400)], true);
    std::os::unix::fs::chown(real.join("credential"), Some(owner), Some(owner)).expect("chown");
    assert_eq!(cred(&cfg).expect("checked after the update").1, real.join("credential"), "resolved again");
    // The file's own rules still hold at the end of the links.
    std::fs::set_permissions(real.join("credential"), std::fs::Permissions::from_mode(0o440)).expect("chmod");
    let (field, reason) = match Config::load(&cm.join("sealnode.toml"), &h.me()).map_err(plain) {
        Err(Error::Config { field, reason, .. }) => (field, reason),
        other => panic!("a group-readable credential loaded: {other:?}"),
    };
    assert_eq!(field, "node.credential");
    assert!(reason.contains(&format!("{} is readable by group", real.join("credential").display())), "{reason}");
    std::fs::set_permissions(real.join("credential"), std::fs::Permissions::from_mode(0o400)).expect("chmod");
    for (what, target, words) in [
        ("absolute", real.join("credential").display().to_string(), vec!["is a symlink", "is absolute"]),
        ("out of its dir", "../cred".to_string(), vec!["is a symlink", "not plain names"]),
    ] {
        std::fs::remove_file(secret.join("credential")).expect("rm");
        std::os::unix::fs::symlink(&target, secret.join("credential")).expect("symlink");
        match Config::load(&cm.join("sealnode.toml"), &h.me()).map_err(plain) {
            Err(Error::Config { field, reason, .. }) => {
                assert_eq!(field, "node.credential", "{what}: {reason}");
                for w in words {
                    assert!(
                        reason.contains(w) && reason.contains(&secret.join("credential").display().to_string()),
                        "{what}: {w}: {reason}"
                    );
                }
            }
            other => panic!("{what}: loaded: {other:?}"),
        }
    }
    // Every other role path still refuses any symlink.
    let (field, reason) = host_bad(&h, &h.config().replace(&format!("{d}/models"), &format!("{d}/secret/..data")));
    assert_eq!(field, "engine.models");
    assert!(reason.contains("reached through a symlink"), "{reason}");
}

/// What sealnode trusts may not lie in a role-writable dir through a link either: a config
/// whose link leads into the node's scratch (rootless, where the owners are all one uid) is
/// refused, naming the real path.
#[test]
fn a_config_linked_into_a_role_writable_dir_is_refused() {
    let h = Host::new();
    let inside = h.p("nscratch/c.toml");
    std::fs::write(&inside, h.config()).expect("write");
    std::fs::set_permissions(&inside, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    std::os::unix::fs::symlink("nscratch/c.toml", h.p("c.toml")).expect("symlink");
    // Rootless as the scratch's owner: every owner check passes, only this one can refuse.
    let md = std::fs::metadata(h.p("nscratch")).expect("stat");
    std::os::unix::fs::chown(&inside, Some(md.uid()), Some(md.gid())).expect("chown");
    match Config::load(&h.p("c.toml"), &Invoker { uid: md.uid(), gid: md.gid() }).map_err(plain) {
        Err(Error::Config { field, reason, .. }) => {
            assert_eq!(field, "(config file)", "{reason}");
            assert!(
                reason.contains(&format!("{} is inside", inside.display())) && reason.contains("node.scratch"),
                "{reason}"
            );
        }
        other => panic!("a config in the node's scratch loaded: {other:?}"),
    }
}

#[test]
fn shipped_examples_parse() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("examples");
    let mut seen = 0;
    for entry in std::fs::read_dir(&root).expect("examples") {
        let p = entry.expect("entry").path();
        if p.extension().is_some_and(|e| e == "toml") {
            Config::parse(&std::fs::read_to_string(&p).expect("read"), &p).unwrap_or_else(|e| panic!("{e}"));
            seen += 1;
        }
    }
    assert!(seen >= 1, "no examples found");
    let demo = std::fs::read_to_string(root.join("demo/sealnode.toml.in")).expect("demo");
    let filled = demo
        .replace("@DEMO@", "/var/lib/sealnode-demo")
        .replace("@POLICY@", "/usr/share/sealnode")
        .replace("@VENV@", "/var/lib/sealnode-demo/py/venv")
        .replace("@PYCOPY@", "/var/lib/sealnode-demo/py/python")
        .replace("@PYPREFIX@", "/opt/python3.12")
        .replace("@GWPORT@", "18765");
    Config::parse(&filled, Path::new("demo.toml")).unwrap_or_else(|e| panic!("{e}"));
}

#[test]
fn host_own_dirs_must_not_be_writable_by_others() {
    let h = Host::new();
    let text = h.config().replace(
        &format!("state_dir = \"{}\"", h.dir.path().display()),
        &format!("state_dir = \"{}\"", h.p("st").display()),
    );
    std::fs::create_dir(h.p("st")).expect("mkdir");
    std::fs::set_permissions(h.p("st"), std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let (field, reason) = host_bad(&h, &text);
    assert_eq!(field, "cell.state_dir");
    assert!(reason.contains("writable by group or others"), "{reason}");
    std::fs::remove_dir(h.p("st")).expect("rm");
    std::os::unix::fs::symlink(h.p("venv"), h.p("st")).expect("symlink");
    let (field, reason) = host_bad(&h, &text);
    assert_eq!(field, "cell.state_dir");
    assert!(reason.contains("symlink"), "{reason}");
}

/// The whole message an operator reads, for each type error the issue "Operators' daily life"
/// quoted with a guessed field: now the deserializer's own path, with the line.
#[test]
fn type_errors_name_the_field_path() {
    let msg = |text: &str| parse(text).map(|_| ()).expect_err("must be refused").to_string();
    let f = "/etc/sealnode/test.toml";
    // GOOD's lines: 2 schema, 3 [cell], 6 [engine], 7 command, 8 port, 13 [node], 19 ro_binds.
    assert_eq!(
        msg(&with("port = 8080", "port = \"8080\"")),
        format!("{f}: engine.port (line 8): invalid type: string \"8080\", expected u32")
    );
    assert_eq!(
        msg(&with("[cell]\n", "[cell]\nstop_timeout_s = \"10\"\n")),
        format!("{f}: cell.stop_timeout_s (line 4): invalid type: string \"10\", expected u64")
    );
    assert_eq!(
        msg(&with("port = 8080", "port = 8080\nmodels_writable = \"yes\"")),
        format!("{f}: engine.models_writable (line 9): invalid type: string \"yes\", expected a boolean")
    );
    assert_eq!(
        msg(&with("port = 8080", "port = 8080\nrestart = \"sometimes\"")),
        format!(
            "{f}: engine.restart (line 9): unknown variant `sometimes`, expected one of `no`, `on-failure`, `always`"
        )
    );
    assert_eq!(
        msg(&with("scratch = \"/var/lib/sealnode/engine\"\n", "")),
        format!("{f}: engine.scratch (in the table at line 6): missing; this field is required (docs/config.md)")
    );
    assert_eq!(
        msg(&with("[node]", "[engine.rlimits]\nnofile = \"many\"\n[node]")),
        format!("{f}: engine.rlimits.nofile (line 14): invalid type: string \"many\", expected u64")
    );
    assert_eq!(
        msg(&with("[node]", "[engine.rlimits]\nnofiles = 10\n[node]")),
        format!("{f}: engine.rlimits.nofiles (line 14): unknown field; did you mean `nofile`? (docs/config.md)")
    );
    let top = msg(&format!("{GOOD}\n[engnie]\nport = 1\n"));
    assert!(top.starts_with(&format!("{f}: engnie (line 21): unknown field; did you mean `engine`?")), "{top}");
    assert_eq!(
        msg(&with("ro_binds = [{ src = \"/opt/venv\" }]", "ro_binds = [{ src = \"/opt/venv\", exec = 1 }]")),
        format!("{f}: node.ro_binds[0].exec (line 19): invalid type: integer `1`, expected a boolean")
    );
    assert_eq!(msg("schema = 1\n[cell\n"), format!("{f}: (syntax) (line 2): unclosed table, expected `]`"));
}

/// A field only one role has, set in the other role, is refused (never silently ignored).
#[test]
fn role_only_fields_in_the_wrong_role_are_refused() {
    let node = |line: &str| {
        bad(&with("scratch = \"/var/lib/sealnode/node\"", &format!("scratch = \"/var/lib/sealnode/node\"\n{line}")))
    };
    let engine = |line: &str| bad(&with("port = 8080", &format!("port = 8080\n{line}")));
    for (line, field, why) in [
        ("port = 1", "node.port", "only the engine listens"),
        ("models = \"/srv/models\"", "node.models", "only the engine sees models"),
        ("models_writable = true", "node.models_writable", "only the engine has a model dir"),
        ("ready = { kind = \"http\" }", "node.ready", "only the engine has a readiness check"),
    ] {
        let (f, r) = node(line);
        assert_eq!(f, field, "{line}");
        assert!(r.contains(why), "{line}: {r}");
    }
    for (line, field, why) in [
        ("credential = \"/etc/sealnode/credential\"", "engine.credential", "never sees the node's credential"),
        ("egress = [{ host = \"gw.example\", port = 443 }]", "engine.egress", ""),
    ] {
        let (f, r) = engine(line);
        assert_eq!(f, field, "{line}");
        assert!(r.contains(why), "{line}: {r}");
    }
}

#[test]
fn a_tpm_is_a_local_device_or_a_loopback_software_tpm() {
    let tpm = |t: &str| with("runtime_dir = \"/run/sealnode\"", &format!("runtime_dir = \"/run/sealnode\"\ntpm = {t}"));
    let c = parse(&tpm("{ tcti = \"device:/dev/tpmrm0\" }")).expect("valid");
    assert_eq!(c.cell.tpm.as_ref().map(|t| t.ak_handle), Some(crate::config::DEFAULT_AK_HANDLE));
    parse(&tpm("{ tcti = \"swtpm:host=127.0.0.1,port=2321\", ak_handle = 0x81010005 }")).expect("valid");
    for (t, field, why) in [
        ("{ tcti = \"device:tpmrm0\" }", "cell.tpm.tcti", "under /dev"),
        ("{ tcti = \"device:/tmp/tpm\" }", "cell.tpm.tcti", "under /dev"),
        ("{ tcti = \"swtpm:host=10.0.0.5,port=2321\" }", "cell.tpm.tcti", "loopback"),
        ("{ tcti = \"swtpm:port=2321\" }", "cell.tpm.tcti", "host=127.0.0.1"),
        ("{ tcti = \"swtpm:host=127.0.0.1,port=99999\" }", "cell.tpm.tcti", "port=N"),
        ("{ tcti = \"tabrmd:bus_name=com.intel.tss2.Tabrmd\" }", "cell.tpm.tcti", "expected device:"),
        ("{ tcti = \"device:/dev/tpmrm0\", ak_handle = 0x80000001 }", "cell.tpm.ak_handle", "persistent handle"),
    ] {
        let (f, r) = bad(&tpm(t));
        assert_eq!(f, field, "{t}: {r}");
        assert!(r.contains(why), "{t}: {r}");
    }
    let (f, r) = bad(&tpm("{ tcti = \"device:/dev/tpmrm0\", pcr = 16 }"));
    assert!(f.contains("pcr") && r.contains("unknown field"), "{f}: {r}");
    // The node's egress may not lead to a software TPM's command or control port.
    let sw = "{ tcti = \"swtpm:host=127.0.0.1,port=2321\" }";
    let egress = |to: &str| {
        tpm(sw).replacen(
            "credential = \"/etc/sealnode/credential\"",
            &format!("credential = \"/etc/sealnode/credential\"\negress = [{{ host = \"gw.example\", port = 443, connect = \"{to}\" }}]"),
            1,
        )
    };
    for to in [
        "127.0.0.1:2321",
        "127.0.0.1:2322",
        "[::1]:2322",
        "127.0.0.2:2321",
        "0.0.0.0:2321",
        "[::ffff:127.0.0.1]:2322",
        "192.0.2.7:2321",
    ] {
        let (f, r) = bad(&egress(to));
        assert_eq!(f, "node.egress[0].connect", "{to}: {r}");
        assert!(r.contains("is the TPM of cell.tpm"), "{to}: {r}");
    }
    parse(&egress("127.0.0.1:2323")).expect("another port");
    // The port is explicit (libtss2's default would be unseen).
    let (f, r) = bad(&tpm("{ tcti = \"swtpm:host=127.0.0.1\" }"));
    assert_eq!(f, "cell.tpm.tcti");
    assert!(r.contains("give port=N"), "{r}");
}

#[test]
fn the_preflight_timeout_is_bounded() {
    for bad in ["4", "601"] {
        let e = parse(&with("[cell]\n", &format!("[cell]\npreflight_timeout_s = {bad}\n"))).map(|_| ()).expect_err(bad);
        assert!(
            e.to_string().contains("cell.preflight_timeout_s") && e.to_string().contains("between 5 and 600"),
            "{e}"
        );
    }
    let ok = parse(&with("[cell]\n", "[cell]\npreflight_timeout_s = 120\n")).expect("120");
    assert_eq!(ok.cell.preflight_timeout_s, 120);
    assert_eq!(parse(GOOD).expect("default").cell.preflight_timeout_s, 30);
}

/// Issue #27 item 4: what the config says twice must agree, or the roles fail later with
/// "engine exited with status 1" or a node looping on its gateway's name.
#[test]
fn cross_checks_catch_what_would_fail_later() {
    // The engine's --port vs engine.port, in both spellings.
    let (f, r) = bad(&with("\"--port\", \"8080\"]", "\"--port\", \"8081\"]"));
    assert_eq!(f, "engine.command[2]");
    assert!(r.contains("--port 8081, but engine.port is 8080"), "{r}");
    let (f, _) = bad(&with("\"--port\", \"8080\"]", "\"--port=8081\"]"));
    assert_eq!(f, "engine.command[1]");
    assert!(parse(&with("\"--port\", \"8080\"]", "\"--port=8080\"]")).is_ok());
    // Ollama's address.
    let (f, r) = bad(&with("port = 8080\n", "port = 8080\nenv = { set = { OLLAMA_HOST = \"127.0.0.1:11434\" } }\n"));
    assert_eq!(f, "engine.env.set.OLLAMA_HOST");
    assert!(r.contains("port 11434"), "{r}");
    // The node's engine address.
    let node_env = |v: &str| {
        with(
            "ro_binds = [{ src = \"/opt/venv\" }]",
            &format!(
                "ro_binds = [{{ src = \"/opt/venv\" }}]\nenv = {{ set = {{ FRUTEBOX_LLAMACPP_HOST = \"{v}\" }} }}"
            ),
        )
    };
    let (f, r) = bad(&node_env("http://127.0.0.1:8081"));
    assert_eq!(f, "node.env.set.FRUTEBOX_LLAMACPP_HOST");
    assert!(r.contains("port 8081") && r.contains("engine.port = 8080"), "{r}");
    assert!(parse(&node_env("http://127.0.0.1:8080")).is_ok());
    // The node's gateway vs egress: undeclared host, wrong port, the scheme's default port.
    let gateway = |url: &str, egress: &str| {
        with(
            "\"-m\", \"frutebox.provider\"]",
            &format!("\"-m\", \"frutebox.provider\", \"--gateway-url\", \"{url}\"]\n{egress}"),
        )
    };
    let (f, r) = bad(&gateway("wss://gw.example/provider/ws", ""));
    assert_eq!(f, "node.command[5]");
    assert!(r.contains("gw.example:443") && r.contains("no egress at all"), "{r}");
    let (_, r) = bad(&gateway("wss://gw.example:8443/ws", "egress = [{ host = \"gw.example\", port = 443 }]"));
    assert!(r.contains("gw.example:8443") && r.contains("(gw.example:443)"), "{r}");
    assert!(parse(&gateway("wss://GW.example/ws", "egress = [{ host = \"gw.example\", port = 443 }]")).is_ok());
    assert!(parse(&gateway("ws://gw.example:8765/ws", "egress = [{ host = \"gw.example\", port = 8765 }]")).is_ok());
}

/// Issue #27 item 5: three mistakes, three problems at once, each with its line; a range error
/// has its line too; a problem in a list is reported once for the list.
#[test]
fn every_problem_at_once_with_lines() {
    let text = with("port = 8080", "port = 8080\ncolour = 1\ntmp_size_mb = 0")
        .replace("[cell]\n", "[cell]\nstop_timeout_s = 0\n")
        .replace("ro_binds = [{ src = \"/opt/venv\" }]", "ro_binds = [{ src = \"opt/venv\" }, { src = \"x/y\" }]");
    let e = parse(&text).expect_err("four problems");
    let Error::Problems(v) = &e else { panic!("one problem only: {e}") };
    let shown: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    let f = "/etc/sealnode/test.toml";
    assert_eq!(
        shown,
        [
            format!("{f}: engine.colour (line 10): unknown field (expected command, sha256, port, seccomp, landlock, models, models_writable, scratch, scratch_max_mb, credential, ro_binds, devices, devices_from, tmp_size_mb, env, rlimits, egress, ready, limits, log_refused_syscalls, restart, restart_limit); check the spelling and the table it is in (docs/config.md)"),
            format!("{f}: cell.stop_timeout_s (line 4): must be between 1 and 3600"),
            format!("{f}: engine.tmp_size_mb (line 11): must be between 1 and 65536"),
            format!("{f}: node.ro_binds[0].src (line 22): opt/venv is a relative path; use an absolute path"),
        ],
        "{e}"
    );
    assert!(e.to_string().starts_with("4 problems:\n  "), "{e}");
}

/// A quoted key with brackets is named as an unknown field; splitting its path never panics.
#[test]
fn odd_keys_are_named_not_crashed_on() {
    for key in ["\"x[]]\"", "\"]\"", "\"[\"", "\"a.b[0]]x\"", "\"[0][1]\""] {
        let text = with("port = 8080", &format!("port = 8080\n{key} = 1\ntmp_size_mb = 0"));
        let e = parse(&text).expect_err(key);
        assert!(e.to_string().contains("unknown field"), "{key}: {e}");
    }
}

/// A key holding an escape sequence is shown escaped, never printed raw.
#[test]
fn keys_are_shown_escaped() {
    let e = parse(&with("port = 8080", "port = 8080\n\"\\u001b[2J\" = 1")).expect_err("unknown");
    let shown = e.to_string();
    assert!(!shown.contains('\u{1b}') && shown.contains("\\u{1b}[2J"), "{shown}");
}

/// Hosts the C library reads as IPv4 addresses (inet_aton's old forms) are not DNS names: the
/// resolver would never ask /etc/hosts for them.
#[test]
fn ipv4_shorthands_are_not_dns_names() {
    for h in ["127.1", "0x7f000001", "2130706433", "10.1.2"] {
        let text = with(
            "ro_binds = [{ src = \"/opt/venv\" }]",
            &format!("ro_binds = [{{ src = \"/opt/venv\" }}]\negress = [{{ host = \"{h}\", port = 443 }}]"),
        );
        let (field, reason) = bad(&text);
        assert_eq!(field, "node.egress[0].host", "{h}");
        assert!(reason.contains("must be a DNS name"), "{h}: {reason}");
    }
    let ok = with(
        "ro_binds = [{ src = \"/opt/venv\" }]",
        "ro_binds = [{ src = \"/opt/venv\" }]\negress = [{ host = \"gw1.example\", port = 443 }]",
    );
    assert!(parse(&ok).is_ok());
}

/// A path is in the roles' system view only when it is itself under a system path: a symlink
/// elsewhere that leads into /usr is not there (the role would not find it at that path),
/// while a recreated system symlink such as /lib -> usr/lib is.
#[test]
fn only_a_path_under_a_system_path_is_in_the_system_view() {
    assert!(in_system_view(Path::new("/usr/bin")));
    let t = tempfile::tempdir().expect("tmp");
    let link = t.path().join("bin");
    std::os::unix::fs::symlink("/usr/bin", &link).expect("symlink");
    assert!(!in_system_view(&link), "{} leads into /usr but is not under a system path", link.display());
    if std::fs::symlink_metadata("/lib").is_ok_and(|m| m.file_type().is_symlink()) {
        assert!(in_system_view(Path::new("/lib")));
    }
}

/// A reload (SIGHUP) keeps the ids the running cell loaded with and looks no user up; other
/// users than the running cell's are refused before any lookup (tests/gate.rs:
/// a_reload_looks_no_user_up runs it against a user database that hangs).
#[test]
fn a_reload_keeps_the_running_ids_and_refuses_other_users() {
    let h = Host::new();
    let mut running = h.check(&h.config(), h.me()).expect("valid");
    // The ids the host checks then hold the role paths to are the running cell's.
    let kept = [Ids { uid: 7001, gid: 7001 }, Ids { uid: 7002, gid: 7002 }];
    running.loaded.as_mut().expect("loaded").ids = kept;
    let f = h.p("c.toml");
    match Config::reload(&f, &h.me(), &running).map_err(plain) {
        Err(Error::Config { field, reason, .. }) => {
            assert_eq!(field, "engine.scratch");
            assert!(reason.contains("runs as uid 7001"), "{reason}");
        }
        other => panic!("the running ids were not used: {other:?}"),
    }
    let kept = if nix::unistd::geteuid().is_root() {
        for (p, id) in [("escratch", 7001), ("nscratch", 7002), ("cred", 7002)] {
            std::os::unix::fs::chown(h.p(p), Some(id), Some(id)).expect("chown");
        }
        kept
    } else {
        // Rootless, the role paths are the invoker's: only the refusal below is shown.
        [Ids { uid: h.me().uid, gid: h.me().gid }; 2]
    };
    running.loaded.as_mut().expect("loaded").ids = kept;
    let again = Config::reload(&f, &h.me(), &running).map_err(plain).expect("reload");
    assert_eq!(again.role_ids(Role::Engine).expect("ids"), kept[0]);
    assert_eq!(again.role_ids(Role::Node).expect("ids"), kept[1]);
    let other = h.config().replace("engine = \"61001:61001\"", "engine = \"no-such-user-anywhere\"");
    std::fs::write(&f, other).expect("write");
    match Config::reload(&f, &h.me(), &running).map_err(plain) {
        Err(Error::Config { field, reason, .. }) if h.me().rootful() => {
            assert_eq!(field, "cell.rootful");
            assert!(reason.contains("looks no user up"), "{reason}");
        }
        // Rootless, cell.rootful is not read: the roles keep sealnode's own ids.
        Ok(c) if !h.me().rootful() => assert_eq!(c.role_ids(Role::Engine).expect("ids"), kept[0]),
        other => panic!("another user was not refused (rootful) or kept (rootless): {other:?}"),
    }
}

/// `cell.reload_on_change`: off unless set; a boolean, refused otherwise by name with its line.
#[test]
fn reload_on_change_is_an_opt_in_boolean() {
    assert!(!parse(GOOD).expect("good").cell.reload_on_change, "off by default");
    let on = parse(&with("[cell]\n", "[cell]\nreload_on_change = true\n")).expect("true");
    assert!(on.cell.reload_on_change);
    let e = parse(&with("[cell]\n", "[cell]\nreload_on_change = \"yes\"\n")).expect_err("a string");
    assert_eq!(
        e.to_string(),
        "/etc/sealnode/test.toml: cell.reload_on_change (line 4): invalid type: string \"yes\", expected a boolean"
    );
}

/// The engine hold, the replay bound and the drain (#29 item 6): 0 turns each off, past its
/// bound is refused by name, with its line.
#[test]
fn the_engine_hold_and_the_drain_are_bounded() {
    let f = "/etc/sealnode/test.toml";
    for field in ["engine_hold_s", "drain_timeout_s"] {
        assert!(parse(&with("[cell]\n", &format!("[cell]\n{field} = 0\n"))).is_ok(), "{field} = 0");
        assert!(parse(&with("[cell]\n", &format!("[cell]\n{field} = 3600\n"))).is_ok(), "{field} = 3600");
        let e = parse(&with("[cell]\n", &format!("[cell]\n{field} = 3601\n"))).expect_err(field);
        assert_eq!(e.to_string(), format!("{f}: cell.{field} (line 4): must be between 0 and 3600 (seconds)"));
    }
    assert_eq!(parse(&with("[cell]\n", "[cell]\n")).expect("default").cell.engine_replay_kb, 256);
    for ok in [0, 16384] {
        assert!(parse(&with("[cell]\n", &format!("[cell]\nengine_replay_kb = {ok}\n"))).is_ok(), "{ok}");
    }
    let e = parse(&with("[cell]\n", "[cell]\nengine_replay_kb = 16385\n")).expect_err("over");
    assert_eq!(e.to_string(), format!("{f}: cell.engine_replay_kb (line 4): must be between 0 and 16384 (KiB)"));
}

/// The launcher's hard limit in a refusal is never rounded down: 1.5 MB is not "1".
#[test]
fn a_hard_limit_is_shown_in_the_fields_unit_only_when_whole() {
    assert_eq!(in_units(4096, 1), "4096");
    assert_eq!(in_units(3 << 20, 1 << 20), "3");
    assert_eq!(in_units(3 << 19, 1 << 20), "1572864 bytes");
    assert_eq!(in_units(1023, 1 << 10), "1023 bytes");
}
