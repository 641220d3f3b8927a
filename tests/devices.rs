//! Devices from a CDI spec (`devices_from`): a spec the test writes, naming device nodes this
//! machine has (/dev/fuse, /dev/net/tun) and one the test makes (a world-writable node with
//! /dev/full's numbers, so a role can open it and issue ioctls), and files the test creates.
//! Real sandboxes, as root and as uid 65534, under the GPU profile.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use common::*;

/// A path the test made on the host (a file, a symlink or a dir tree), removed when dropped.
struct Removed(PathBuf);

impl Removed {
    fn path(&self) -> &std::path::Path {
        &self.0
    }
}

impl Drop for Removed {
    fn drop(&mut self) {
        match std::fs::symlink_metadata(&self.0) {
            Ok(m) if m.is_dir() => drop(std::fs::remove_dir_all(&self.0)),
            _ => drop(std::fs::remove_file(&self.0)),
        }
    }
}

/// A device node the test makes under /dev, removed when dropped.
struct TestNode(Removed);

impl TestNode {
    /// `c 1 7` (the kernel's /dev/full), mode 0666: any role user can open it, and the driver
    /// answers every ioctl with ENOTTY, so the errno says which layer stopped a call.
    fn new(tag: &str) -> TestNode {
        let p = PathBuf::from(format!("/dev/sealnode-test-{}-{tag}", std::process::id()));
        mknod_char(&p, 0o666, 1, 7);
        TestNode(Removed(p))
    }
    fn path(&self) -> String {
        self.0.path().display().to_string()
    }
}

/// An NVIDIA frontend request (type 'F': `_IOWR('F', 0xd2, 0x48)`), which the GPU profile's
/// seccomp filter lets through; the node's driver then answers ENOTTY.
const NV_REQUEST: &str = "0xc04846d2";
/// A request of another type ('R', RNDGETENTCNT): the GPU profile refuses it.
const OTHER_REQUEST: &str = "0x80045200";

/// The "driver's" files, where a driver's files live (CDI mounts must come from /usr, /lib*,
/// /opt or /var/lib): a dir the test makes under /var/lib, removed when dropped.
struct DriverDir(Removed);

impl DriverDir {
    fn new(tag: &str) -> DriverDir {
        let p = PathBuf::from(format!("/var/lib/sealnode-test-{}-{tag}", std::process::id()));
        let _ = std::fs::remove_dir_all(&p);
        for d in ["", "lib", "share"] {
            std::fs::create_dir_all(p.join(d)).expect("mkdir");
            std::fs::set_permissions(p.join(d), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        }
        std::fs::write(p.join("lib/libfake.so.1"), "not really a library\n").expect("write");
        std::fs::write(p.join("share/data"), "driver data\n").expect("write");
        std::fs::write(p.join("share/icd.json"), "{}\n").expect("write");
        DriverDir(Removed(p))
    }
    fn path(&self) -> String {
        self.0.path().display().to_string()
    }
}

/// The spec: spec-wide /dev/fuse, an env pair and files; device "0" the test node, device
/// "1" /dev/net/tun (not taken).
fn spec(drv: &DriverDir, node: &TestNode) -> String {
    let d = drv.path();
    format!(
        r#"cdiVersion: "0.6.0"
kind: example.com/gpu
containerEdits:
  env:
  - CDI_TEST=from-spec
  - ENGINE_ONLY=from-spec
  - LD_PRELOAD=/opt/cdi/lib/libfake.so.1
  - PATH=/scratch
  deviceNodes:
  - path: /dev/fuse
    type: c
    major: 10
    minor: 229
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache]
  mounts:
  - hostPath: {d}/lib/libfake.so.1
    containerPath: /opt/cdi/lib/libfake.so.1
    options: [ro, nosuid, nodev, bind]
  - hostPath: {d}/share
    containerPath: /opt/cdi/share
    options: [ro, nosuid, nodev, bind, noexec]
  - hostPath: /usr/bin/busybox
    containerPath: /usr/bin/busybox
    options: [ro, nosuid, nodev, bind]
  - hostPath: {d}/persistenced.sock
    containerPath: /opt/cdi/persistenced.sock
    options: [ro, nosuid, nodev, bind, noexec]
  - hostPath: {d}/share/icd.json
    containerPath: /etc/vulkan/icd.d/icd.json
    options: [ro, nosuid, nodev, bind]
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: {node}
      type: c
      major: 1
      minor: 7
- name: "1"
  containerEdits:
    deviceNodes:
    - path: /dev/net/tun
"#,
        node = node.path()
    )
}

/// A fixture whose engine takes device 0 from the test's spec, under the GPU profile.
fn fixture(mode: Mode, name: &str, node: &TestNode) -> (Fixture, (std::os::unix::net::UnixListener, DriverDir)) {
    let mut f = Fixture::new(mode, name);
    std::fs::create_dir_all(f.p("cdi")).expect("mkdir");
    std::fs::set_permissions(f.p("cdi"), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let drv = DriverDir::new(&format!("{name}-{mode:?}"));
    let sock = std::os::unix::net::UnixListener::bind(drv.0.path().join("persistenced.sock")).expect("bind the socket");
    std::fs::write(f.p("cdi/gpu.yaml"), spec(&drv, node)).expect("write the spec");
    std::fs::set_permissions(f.p("cdi/gpu.yaml"), std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let bin = f.p("bin").display().to_string();
    f.engine_policy = "engine-gpu".into();
    f.engine_extra = format!(
        "devices_from = {{ cdi = \"{}\", devices = [\"example.com/gpu=0\"] }}\nro_binds = [{{ src = \"{bin}\", dst = \"/opt/sealnode\" }}]",
        f.p("cdi/gpu.yaml").display()
    );
    f.write_config();
    (f, (sock, drv))
}

fn run(f: &Fixture, args: &[&str]) -> (i32, String, String) {
    let o = f.command(args).output_within(COMMAND_LIMIT);
    (
        o.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

#[test]
fn a_cdi_spec_gives_the_engine_exactly_its_nodes_files_and_environment() {
    if !is_root() {
        return unavailable("rootful", "the test makes a device node under /dev (root)");
    }
    for mode in modes() {
        let node = TestNode::new(&format!("{mode:?}"));
        let (mut f, drv) = fixture(mode, "cdi", &node);
        // An extra bind onto a file that exists in the read-only system view: a mount point as
        // it is (found by review: the start failed opening it for writing).
        f.engine_extra = f.engine_extra.replace(
            "ro_binds = [",
            &format!(
                "ro_binds = [{{ src = \"{}/share/data\", dst = \"/usr/lib/os-release\", exec = false }}, ",
                drv.1.path()
            ),
        );
        f.write_config();
        let ctx = format!("{mode:?}");
        let n = node.path();
        let e = f.probe(
            "engine",
            &[
                "--stat",
                &n,
                "--stat",
                "/dev/fuse",
                "--stat",
                "/dev/net/tun",
                "--read",
                "/opt/cdi/lib/libfake.so.1",
                "--read",
                "/opt/cdi/share/data",
                "--stat",
                "/opt/cdi/persistenced.sock",
                "--stat",
                "/etc/vulkan/icd.d/icd.json",
                "--ioctl",
                &format!("{n}:{NV_REQUEST}"),
                "--ioctl",
                &format!("/dev/full:{NV_REQUEST}"),
                "--ioctl",
                &format!("{n}:{OTHER_REQUEST}"),
                "--write",
                "/opt/cdi/share/new",
                "--write",
                "/proc/thread-self/comm",
                "--write",
                "/proc/self/oom_score_adj",
                "--read",
                "/usr/lib/os-release",
            ],
        );
        // The taken device's node and the spec-wide one are in view; device 1's is not.
        assert_eq!(attempt(&e, &format!("stat:{n}"))["ok"], true, "{ctx}: {e}");
        assert_eq!(attempt(&e, "stat:/dev/fuse")["ok"], true, "{ctx}: {e}");
        refused(&e, "stat:/dev/net/tun", &[libc::ENOENT]);
        // The spec's files, read-only; its socket (a way to a host daemon) and its /etc file
        // (sealnode's own layout) are left out.
        assert_eq!(attempt(&e, "read:/opt/cdi/lib/libfake.so.1")["ok"], true, "{ctx}: {e}");
        assert_eq!(attempt(&e, "read:/opt/cdi/share/data")["ok"], true, "{ctx}: {e}");
        refused(&e, "write:/opt/cdi/share/new", &[libc::EROFS, libc::EACCES]);
        refused(&e, "stat:/opt/cdi/persistenced.sock", &[libc::ENOENT]);
        refused(&e, "stat:/etc/vulkan/icd.d/icd.json", &[libc::ENOENT]);
        // An NVIDIA-type request on the spec's node gets through seccomp and Landlock to the
        // driver (ENOTTY); on a base device Landlock refuses it (no ioctl_dev there); another
        // request type stops at seccomp (the policy's ENOSYS).
        refused(&e, &format!("ioctl:{n}:{NV_REQUEST}"), &[libc::ENOTTY]);
        refused(&e, &format!("ioctl:/dev/full:{NV_REQUEST}"), &[libc::EACCES]);
        refused(&e, &format!("ioctl:{n}:{OTHER_REQUEST}"), &[libc::ENOSYS]);
        // The GPU profile's one Landlock addition: the engine names its own threads (libcuda
        // does), and the rest of its /proc stays read-only.
        assert_eq!(attempt(&e, "write:/proc/thread-self/comm")["ok"], true, "{ctx}: {e}");
        refused(&e, "write:/proc/self/oom_score_adj", &[libc::EACCES]);
        assert_eq!(attempt(&e, "read:/usr/lib/os-release")["ok"], true, "{ctx}: {e}");
        // The spec's environment, under the config's own values; never the loader's or
        // sealnode's own variables (found by review).
        assert_eq!(e["env"]["CDI_TEST"], "from-spec", "{ctx}: {}", e["env"]);
        assert_eq!(e["env"]["ENGINE_ONLY"], "1", "{ctx}: the config's value wins: {}", e["env"]);
        assert!(e["env"].get("LD_PRELOAD").is_none(), "{ctx}: {}", e["env"]);
        assert_eq!(e["env"]["PATH"], "/usr/local/bin:/usr/bin:/bin", "{ctx}: {}", e["env"]);
        // The node gets none of it.
        let nd = f.probe(
            "node",
            &["--stat", &n, "--stat", "/dev/fuse", "--stat", "/opt/cdi/share", "--write", "/proc/thread-self/comm"],
        );
        refused(&nd, "write:/proc/thread-self/comm", &[libc::EACCES]);
        refused(&nd, &format!("stat:{n}"), &[libc::ENOENT]);
        refused(&nd, "stat:/dev/fuse", &[libc::ENOENT]);
        refused(&nd, "stat:/opt/cdi/share", &[libc::ENOENT]);
        assert!(nd["env"].get("CDI_TEST").is_none(), "{ctx}: {}", nd["env"]);
        // check reports what was taken and what was left out, and why.
        let cfg = f.config.display().to_string();
        let (code, out, err) = run(&f, &["check", "--config", &cfg]);
        assert_eq!(code, 0, "{ctx}: {out}\n{err}");
        let row = out.lines().find(|l| l.contains("engine devices")).unwrap_or_else(|| panic!("{ctx}: {out}"));
        assert!(row.contains("example.com/gpu=0") && row.contains("2 device nodes"), "{ctx}: {row}");
        assert!(row.contains("2 files bound") && row.contains("1 already in view"), "{ctx}: {row}");
        for why in ["hooks[0]", "unix socket", "sandbox's own layout", "env LD_PRELOAD", "env PATH"] {
            assert!(row.contains(why), "{ctx}: no {why:?} in {row}");
        }
        // The canary battery passes under the GPU profile with the test devices in view, and
        // the receipt records the spec's digest and the nodes.
        let (code, out, err) = run(&f, &["canary", "--config", &cfg]);
        assert_eq!(code, 0, "{ctx}: the canary failed under the GPU profile:\n{out}\n{err}");
    }
}

#[test]
fn a_started_cell_records_its_cdi_devices_in_the_receipt() {
    if !is_root() {
        return unavailable("rootful", "the test makes a device node under /dev (root)");
    }
    for mode in modes() {
        let node = TestNode::new(&format!("r{mode:?}"));
        let (mut f, _sock) = fixture(mode, "cdi-receipt", &node);
        f.engine_cmd =
            "[\"/usr/bin/busybox\", \"httpd\", \"-f\", \"-p\", \"127.0.0.1:18080\", \"-h\", \"/models\"]".into();
        f.node_cmd = "[\"/usr/bin/busybox\", \"sh\", \"-c\", \"echo node-up; exec sleep 1000\"]".into();
        f.cell_extra = "stop_timeout_s = 1".into();
        f.write_config();
        let cfg = f.config.display().to_string();
        let cell = f.start_run();
        let receipt = f.p("state/receipt.json");
        let started = wait_until(std::time::Duration::from_secs(60), || receipt.exists());
        let (st, err) = cell.stop();
        assert!(started, "{mode:?}: no receipt: {err}");
        assert_eq!(st.code(), Some(0), "{mode:?}: {err}");
        let r: serde_json::Value = serde_json::from_slice(&std::fs::read(&receipt).expect("receipt")).expect("json");
        let d = &r["roles"]["engine"]["devices_from"];
        assert_eq!(d["cdi"], f.p("cdi/gpu.yaml").display().to_string(), "{mode:?}: {r}");
        assert_eq!(d["devices"], serde_json::json!(["example.com/gpu=0"]), "{mode:?}: {r}");
        assert_eq!(d["nodes"], serde_json::json!(["/dev/fuse", node.path()]), "{mode:?}: {r}");
        // Of the spec as it was read at the start (the file is changed only below).
        use sha2::Digest;
        let spec_sha = hex::encode(sha2::Sha256::digest(std::fs::read(f.p("cdi/gpu.yaml")).expect("spec")));
        assert_eq!(d["cdi_sha256"], spec_sha.as_str(), "{mode:?}: {r}");
        assert!(r["roles"]["node"].get("devices_from").is_none(), "{mode:?}: {r}");
        // The start logged what the spec gave and what it left out.
        assert!(err.contains("devices from a CDI spec") && err.contains("CDI edit left out"), "{mode:?}: {err}");
        // verify-receipt notices a spec changed since.
        let spec = std::fs::read_to_string(f.p("cdi/gpu.yaml")).expect("spec");
        std::fs::write(f.p("cdi/gpu.yaml"), spec.replace("CDI_TEST=from-spec", "CDI_TEST=changed")).expect("write");
        let (code, out, err) = run(&f, &["verify-receipt", "--config", &cfg]);
        // README's exit table: 1, a mismatch.
        assert_eq!(code, 1, "{mode:?}: {out}{err}");
        assert!(format!("{out}{err}").contains("engine CDI spec sha256"), "{mode:?}: {out}{err}");
    }
}

/// Each bad spec or device name is a config error (exit 125) naming the config file, the
/// field, the spec and the entry, and nothing starts.
#[test]
fn bad_cdi_specs_are_config_errors_naming_the_spec_and_entry() {
    if !is_root() {
        return unavailable("rootful", "the test makes a device node under /dev (root)");
    }
    let Some(&mode) = modes().first() else { return };
    let node = TestNode::new("bad");
    let (mut f, drv) = fixture(mode, "cdi-bad", &node);
    let spec_path = f.p("cdi/gpu.yaml");
    let good = std::fs::read_to_string(&spec_path).expect("spec");
    let cfg = f.config.display().to_string();
    let d = drv.1.path();
    let fixture_dir = f.dir.display().to_string();
    // A directory symlink on the way to a device node (found by review: check passed, the
    // start failed with ELOOP naming nothing).
    let link = PathBuf::from(format!("/dev/sealnode-test-{}-lnk", std::process::id()));
    let _ = std::fs::remove_file(&link);
    std::os::unix::fs::symlink("/dev", &link).expect("symlink");
    let _link = Removed(link.clone());
    let via_link = format!("path: {}/fuse", link.display());
    let cases: Vec<(String, Option<&str>, &str)> = vec![
        (
            good.replace("path: /dev/fuse", "path: /dev/sealnode-no-such-node"),
            None,
            "containerEdits.deviceNodes[0].path: /dev/sealnode-no-such-node: No such file",
        ),
        (good.replace("minor: 229", "minor: 230"), None, "is device 10:229, the spec says 10:230 (a stale spec"),
        (good.replace("path: /dev/fuse", "path: /dev/shm"), None, "/dev/shm is not a character device node"),
        (good.replace(&format!("{d}/share\n"), &format!("{d}/nothing\n")), None, "containerEdits.mounts[1].hostPath"),
        (
            good.replace(&format!("hostPath: {d}/share\n"), &format!("hostPath: {fixture_dir}/engine-scratch\n")),
            None,
            "which a role can write",
        ),
        // Found by review: a spec handed the engine the node's credential and the host's /proc.
        (
            good.replace(&format!("hostPath: {d}/share\n"), &format!("hostPath: {fixture_dir}/credential\n")),
            None,
            "is outside where a driver's files live",
        ),
        (
            good.replace(&format!("hostPath: {d}/share\n"), "hostPath: /proc\n"),
            None,
            "is outside where a driver's files live",
        ),
        // ... and shadowed the config's own binds and the system view.
        (
            good.replace("containerPath: /opt/cdi/share", "containerPath: /opt/sealnode"),
            None,
            "overlaps the ro_binds destination /opt/sealnode",
        ),
        (good.replace("containerPath: /opt/cdi/share", "containerPath: /usr"), None, "would replace or cover /usr"),
        (
            good.replace(
                "containerPath: /opt/cdi/lib/libfake.so.1",
                "containerPath: /usr/lib/x86_64-linux-gnu/libc.so.6",
            ),
            None,
            "would replace or cover /usr",
        ),
        (
            good.replace("containerPath: /opt/cdi/persistenced.sock", "containerPath: /opt/cdi/share"),
            None,
            "mounted twice, differently",
        ),
        (good.replace("path: /dev/fuse", &via_link), None, "is a symlink on the way to"),
        (
            good.replace("kind: example.com/gpu", "kind: example.com/other"),
            None,
            "describes \"example.com/other\" devices, not \"example.com/gpu\"",
        ),
        (
            good.replace(
                "containerPath: /opt/cdi/lib/libfake.so.1",
                "containerPath: /usr/lib/sealnode-no-such-lib.so.1",
            ),
            None,
            "containerEdits.mounts[0].containerPath: /usr/lib/sealnode-no-such-lib.so.1 would replace or cover /usr",
        ),
        (good.clone(), Some("example.com/gpu=9"), "no device \"9\" in the spec (example.com/gpu=9); it has: 0, 1"),
        (
            good.replace("cdiVersion: \"0.6.0\"", "cdiVersion: \"7.0.0\""),
            None,
            "cdiVersion: \"7.0.0\" is not a CDI version",
        ),
        // Valid YAML, but over 4 MiB: refused before the parser is given it.
        (format!("{good}# {}\n", "x".repeat(4 << 20)), None, "bytes: a CDI spec is at most 4 MiB"),
        (
            good.replace("  - CDI_TEST=from-spec", "  - HTTPS_PROXY=http://p:1"),
            None,
            "env sets HTTPS_PROXY: proxy variables never reach a role",
        ),
        (
            good.replace("    type: c\n    major: 10", "    type: c\n    colour: red\n    major: 10"),
            None,
            "unknown field `colour`",
        ),
        (
            good.replace(
                "containerEdits:\n  env:",
                "containerEdits:\n  netDevices: [{hostInterfaceName: eth0, name: eth0}]\n  env:",
            ),
            None,
            "netDevices[0]",
        ),
    ];
    for (text, device, want) in cases {
        std::fs::write(&spec_path, &text).expect("write");
        f.engine_extra = f.engine_extra.replace("example.com/gpu=9", "example.com/gpu=0");
        if let Some(dev) = device {
            f.engine_extra = f.engine_extra.replace("example.com/gpu=0", dev);
        }
        f.write_config();
        let (code, out, err) = run(&f, &["check", "--config", &cfg]);
        assert_eq!(code, 125, "{want}: {out}\n{err}");
        let all = format!("{out}{err}");
        let spec = spec_path.display().to_string();
        assert!(
            all.contains(&format!("{cfg}: engine.devices_from: {spec}: ")),
            "{want}: no file, field and spec in: {all}"
        );
        assert!(all.contains(want), "want {want:?} in: {all}");
        // run refuses the same way, starting nothing.
        let (code, _, err) = run(&f, &["run", "--config", &cfg]);
        assert_eq!(code, 125, "{want}: {err}");
        assert!(!f.p("state/receipt.json").exists(), "{want}: something started");
    }
    // The spec is trusted like a policy: writable by others, it is refused.
    std::fs::write(&spec_path, &good).expect("write");
    f.engine_extra = f.engine_extra.replace("example.com/gpu=9", "example.com/gpu=0");
    f.write_config();
    std::fs::set_permissions(&spec_path, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let (code, out, err) = run(&f, &["check", "--config", &cfg]);
    assert_eq!(code, 125, "{out}{err}");
    assert!(format!("{out}{err}").contains("engine.devices_from.cdi"), "{out}{err}");
    std::fs::set_permissions(&spec_path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    // Extra binds held to the same rules (found by review): not the host's /proc, not a
    // credential, not a mount point the read-only system view lacks.
    let good_extra = f.engine_extra.clone();
    for (bind, want) in [
        (
            "{ src = \"/proc\", dst = \"/opt/hostproc\", exec = false }".to_string(),
            "engine.ro_binds[0].src: the host's /proc",
        ),
        (
            format!("{{ src = \"{fixture_dir}/credential\", dst = \"/opt/cred\", exec = false }}"),
            "overlaps node.credential",
        ),
        (
            format!("{{ src = \"{d}/share\", dst = \"/usr/share/sealnode-no-such\", exec = false }}"),
            "engine.ro_binds[0].dst: /usr/share/sealnode-no-such does not exist in the read-only system bind of /usr",
        ),
        // Through sealnode's own link where /lib is one (found by review: `check` passed it).
        (
            format!("{{ src = \"{d}/share\", dst = \"/lib/sealnode-no-such\", exec = false }}"),
            if std::fs::read_link("/lib").is_ok_and(|t| t == std::path::Path::new("usr/lib")) {
                "engine.ro_binds[0].dst: /usr/lib/sealnode-no-such does not exist in the read-only system bind of /usr"
            } else {
                "engine.ro_binds[0].dst: /lib/sealnode-no-such does not exist in the read-only system bind of /lib"
            },
        ),
    ] {
        f.engine_extra = good_extra.replace("ro_binds = [", &format!("ro_binds = [{bind}, "));
        f.write_config();
        let (code, out, err) = run(&f, &["check", "--config", &cfg]);
        assert_eq!(code, 125, "{want}: {out}{err}");
        // The field as named, without its line (every error gives one now).
        let shown = format!("{out}{err}");
        let unlined: String = shown
            .split(" (line ")
            .enumerate()
            .map(|(i, part)| if i == 0 { part } else { part.split_once(')').map_or(part, |(_, rest)| rest) })
            .collect();
        assert!(unlined.contains(want), "want {want:?} in: {shown}");
    }
    f.engine_extra = good_extra;
    f.write_config();
    // Config-only mistakes need no spec read: a device name that is not qualified.
    f.engine_extra = f.engine_extra.replace("example.com/gpu=0", "gpu0");
    f.write_config();
    let (code, out, err) = run(&f, &["check", "--config", &cfg]);
    assert_eq!(code, 125, "{out}{err}");
    assert!(
        format!("{out}{err}")
            .contains("engine.devices_from.devices[0] (line 17): \"gpu0\" is not a qualified CDI device name"),
        "{out}{err}"
    );
}

/// The GPU profile's thread-name rule holds for the engine's whole life, also after the
/// kernel dropped its dentry cache (found by review: the Landlock rule is tied to the
/// /proc/<pid>/task inode, which procfs replaces once an unused dentry is evicted; the role's
/// init now holds it). And the audit login uid is the role's, fixed before the workload runs.
#[test]
fn the_engines_thread_names_survive_a_dentry_cache_drop() {
    if !is_root() {
        return unavailable("rootful", "the test drops the host's dentry cache (root)");
    }
    for mode in modes() {
        let node = TestNode::new(&format!("dc{mode:?}"));
        let (f, _drv) = fixture(mode, "cdi-dcache", &node);
        let cfg = f.config.display().to_string();
        let go = f.p("models/go");
        let sh = "echo a >> /proc/$$/task/$$/comm && echo first-ok; cat /proc/self/loginuid; echo; \
                  while [ ! -e /models/go ]; do sleep 0.1; done; \
                  echo b >> /proc/$$/task/$$/comm && echo second-ok; \\
                  echo $(/usr/bin/busybox id -u) >> /proc/$$/task/$$/loginuid 2>/dev/null || echo loginuid-fixed";
        let mut child = f
            .command(&["exec", "--config", &cfg, "--role", "engine", "--", "/usr/bin/busybox", "sh", "-c", sh])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .expect("exec");
        let lines = line_channel(child.stdout.take().expect("stdout"));
        let first = next_line(&lines, 60, |_| true);
        assert_eq!(first, "first-ok", "{mode:?}");
        let loginuid = next_line(&lines, 60, |_| true);
        let want = if mode == Mode::Rootful { ENGINE_IDS.0 } else { NOBODY };
        assert_eq!(loginuid, want.to_string(), "{mode:?}: the audit login uid is the role's");
        std::fs::write("/proc/sys/vm/drop_caches", "2\n").expect("drop caches");
        std::fs::write(&go, "").expect("go");
        let st = wait_within(&mut child, std::time::Duration::from_secs(30), "exec");
        let rest: Vec<String> =
            std::iter::from_fn(|| lines.recv_timeout(std::time::Duration::from_secs(10)).ok()).collect();
        let mut err = String::new();
        std::io::Read::read_to_string(child.stderr.as_mut().expect("stderr"), &mut err).expect("stderr");
        assert!(rest.contains(&"second-ok".to_string()), "{mode:?}: {rest:?} {err}");
        assert!(rest.contains(&"loginuid-fixed".to_string()), "{mode:?}: the role changed its login uid: {rest:?}");
        assert_eq!(st.code(), Some(0), "{mode:?}: {err}");
        let _ = std::fs::remove_file(&go);
    }
}
