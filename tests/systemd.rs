//! The systemd integration files: the unit verifies, its exposure score stays under the
//! documented threshold, it avoids the settings that would break the sandbox, and the
//! sysusers/tmpfiles snippets apply to a scratch root.

mod common;

use std::process::Command;

use common::*;

/// The units and the exposure each may have on the host's systemd (docs/operator-guide.md
/// explains the numbers; tests/vm.rs holds the guest's systemd 257 to its own).
const UNITS: [(&str, f64); 4] = [
    ("sealnode.service", 3.3),
    ("sealnode-rootless.service", 2.5),
    ("sealnode@.service", 2.5),
    ("sealnode-metrics.service", 1.1),
];

/// The units that run `sealnode run` (the metrics unit only runs `ctl`).
fn launcher_units() -> impl Iterator<Item = &'static str> {
    UNITS.iter().map(|(n, _)| *n).filter(|n| *n != "sealnode-metrics.service")
}

fn analyze() -> Option<&'static str> {
    let p = "/usr/bin/systemd-analyze";
    std::path::Path::new(p).exists().then_some(p)
}

/// The unit with ExecStart pointing at the binary under test (verify checks it exists).
/// A template is copied as its instance `test` (`sealnode@test.service`).
fn unit_copy(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    let unit = std::fs::read_to_string(repo().join("systemd").join(name)).expect("unit");
    let path = dir.join(name.replace("@.", "@test."));
    std::fs::write(&path, unit.replace("/usr/bin/sealnode", env!("CARGO_BIN_EXE_sealnode"))).expect("write");
    path
}

/// The unit's lines that are not comments.
fn active(name: &str) -> Vec<String> {
    let unit = std::fs::read_to_string(repo().join("systemd").join(name)).expect("unit");
    unit.lines().filter(|l| !l.trim_start().starts_with('#') && !l.trim().is_empty()).map(str::to_string).collect()
}

#[test]
fn units_verify_and_exposure_stays_under_the_threshold() {
    let Some(sa) = analyze() else {
        return unavailable("systemd", "systemd-analyze missing (apt-get install systemd)");
    };
    // systemd < 257 cannot parse ProtectControlGroups=private and rates it as unset (0.2):
    // the units are scored as systemd 257 does in the guest (tests/vm.rs) plus that.
    let version = Command::new(sa).arg("--version").output_within(COMMAND_LIMIT);
    let major: u32 =
        String::from_utf8_lossy(&version.stdout).split_whitespace().nth(1).and_then(|v| v.parse().ok()).unwrap_or(0);
    let old = if major < 257 { 0.2 } else { 0.0 };
    for (name, threshold) in UNITS {
        let threshold = threshold + old;
        let dir = tempfile::tempdir().expect("tmp");
        let unit = unit_copy(dir.path(), name);
        let o = Command::new(sa).arg("verify").arg(&unit).output_within(COMMAND_LIMIT);
        assert!(o.status.success(), "systemd-analyze verify {name}: {}", String::from_utf8_lossy(&o.stderr));
        let o = Command::new(sa).args(["security", "--offline=yes"]).arg(&unit).output_within(COMMAND_LIMIT);
        let text = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        let score: f64 = text
            .lines()
            .find_map(|l| l.split(&format!("Overall exposure level for {}:", name.replace("@.", "@test."))).nth(1))
            .and_then(|r| r.split_whitespace().next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no exposure score in: {text}"));
        eprintln!("systemd-analyze security {name}: {score} (threshold {threshold})");
        assert!(score <= threshold, "{name}: exposure {score} rose above {threshold}");
    }
}

#[test]
fn units_do_not_fight_the_launcher() {
    for name in launcher_units() {
        let active = active(name);
        for forbidden in [
            // Their over-mounts in /proc make the kernel refuse each role's fresh /proc.
            "ProtectKernelTunables=",
            "ProtectKernelLogs=",
            // systemd 257 binds /proc/sys/kernel/hostname read-only for it: an over-mount too.
            "ProtectHostname=",
            "RestrictNamespaces=",
            "PrivateNetwork=",
            "MemoryDenyWriteExecute=",
            // The Ollama engine policy allows sched_setaffinity.
            "@resources",
        ] {
            assert!(
                !active.iter().any(|l| l.contains(forbidden)),
                "{name}: {forbidden} would break the per-role sandboxes"
            );
        }
        for needed in [
            "Type=notify",
            "NotifyAccess=main",
            "KillMode=mixed",
            "WatchdogSec=",
            "MemoryMax=",
            "TasksMax=",
            "ProtectSystem=strict",
            "NoNewPrivileges=yes",
            // A new proc instance for sealnode, not an over-mount (tried in the guest, tests/vm).
            "ProtectProc=invisible",
            "ProcSubset=pid",
            // The host side of egress: loopback until the operator allows the gateway.
            "IPAddressDeny=any",
            "IPAddressAllow=localhost",
            // Exit codes a restart cannot fix (docs/operator-guide.md, "Exit status").
            "RestartPreventExitStatus=3 125",
        ] {
            assert!(active.iter().any(|l| l.starts_with(needed)), "{name} lacks {needed}");
        }
    }
    let caps = |name: &str| -> Vec<String> {
        let a = active(name);
        let line = a.iter().find(|l| l.starts_with("CapabilityBoundingSet=")).expect("bounding set").clone();
        line.trim_start_matches("CapabilityBoundingSet=").split_whitespace().map(str::to_string).collect()
    };
    // Rootful: only what mapping the role users needs; signals and the scratch wipe happen as
    // the owner of the cell's user namespace (tests/vm checks both under the real systemd).
    assert_eq!(caps("sealnode.service"), ["CAP_SETUID", "CAP_SETGID"]);
    assert!(caps("sealnode-rootless.service").is_empty(), "the rootless unit has no capability");
    // Rootful, the role users must be the host's own (the cell's setup fails in the guest).
    assert!(
        !active("sealnode.service").iter().any(|l| l.starts_with("PrivateUsers=")),
        "PrivateUsers= in sealnode.service"
    );
}

/// The rootless unit is the rootful one plus a user and minus the capabilities: every other
/// setting of sealnode.service is in it, so hardening added to one is not forgotten in the other.
#[test]
fn the_rootless_unit_keeps_every_setting_of_the_rootful_one() {
    let rootless = active("sealnode-rootless.service");
    // Where the two differ, on purpose (the rootless unit's comments say why).
    let differs =
        ["Description=", "ExecStart=", "CapabilityBoundingSet=", "StateDirectory", "RuntimeDirectory", "Conflicts="];
    for line in active("sealnode.service") {
        if differs.iter().any(|d| line.starts_with(d)) {
            continue;
        }
        assert!(rootless.contains(&line), "sealnode-rootless.service lacks {line:?} of sealnode.service");
    }
    for extra in ["User=sealnode", "Group=sealnode", "RemoveIPC=yes", "PrivateUsers=yes", "Conflicts=sealnode.service"]
    {
        assert!(rootless.iter().any(|l| l == extra), "sealnode-rootless.service lacks {extra}");
    }
}

/// Each instance of sealnode@.service is the rootless unit with its own user, config and dirs:
/// every other setting is the same, so hardening added to one reaches the other.
#[test]
fn the_template_unit_is_the_rootless_one_per_instance() {
    let template = active("sealnode@.service");
    let rootless = active("sealnode-rootless.service");
    let differs =
        ["Description=", "ExecStart=", "User=", "Group=", "StateDirectory=", "RuntimeDirectory=", "Conflicts="];
    for line in &rootless {
        if differs.iter().any(|d| line.starts_with(d)) {
            continue;
        }
        assert!(template.contains(line), "sealnode@.service lacks {line:?} of sealnode-rootless.service");
    }
    for want in [
        "ExecStart=/usr/bin/sealnode run --config /etc/sealnode/%i.toml",
        "User=sealnode-%i",
        "Group=sealnode-%i",
        "StateDirectory=sealnode-%i sealnode-%i/engine sealnode-%i/node",
        "RuntimeDirectory=sealnode-%i",
    ] {
        assert!(template.iter().any(|l| l == want), "sealnode@.service lacks {want}");
    }
    assert!(!template.iter().any(|l| l.starts_with("Conflicts=")), "instances run side by side");
}

#[test]
fn sysusers_and_tmpfiles_apply_to_a_scratch_root() {
    let (Some(_), true, true) = (
        analyze(),
        std::path::Path::new("/usr/bin/systemd-sysusers").exists(),
        std::path::Path::new("/usr/bin/systemd-tmpfiles").exists(),
    ) else {
        return unavailable("systemd", "systemd-sysusers/systemd-tmpfiles missing");
    };
    if !is_root() {
        return unavailable("rootful", "systemd-tmpfiles --root needs root to chown");
    }
    let root = tempfile::tempdir().expect("tmp");
    std::fs::create_dir_all(root.path().join("etc")).expect("etc");
    let o = Command::new("/usr/bin/systemd-sysusers")
        .arg(format!("--root={}", root.path().display()))
        .arg(repo().join("systemd/sealnode.sysusers"))
        .output_within(COMMAND_LIMIT);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let passwd = std::fs::read_to_string(root.path().join("etc/passwd")).expect("passwd");
    assert!(
        passwd.contains("sealnode-engine:")
            && passwd.contains("sealnode-node:")
            && passwd.lines().any(|l| l.starts_with("sealnode:"))
            && passwd.contains("/usr/sbin/nologin"),
        "{passwd}"
    );
    let o = Command::new("/usr/bin/systemd-tmpfiles")
        .arg(format!("--root={}", root.path().display()))
        .arg("--create")
        .arg(repo().join("systemd/sealnode.tmpfile"))
        .output_within(COMMAND_LIMIT);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    use std::os::unix::fs::MetadataExt;
    // The ids sysusers gave the role users in this root, which tmpfiles must have used.
    let ids = |user: &str| -> (u32, u32) {
        let line = passwd.lines().find(|l| l.starts_with(&format!("{user}:"))).expect("user");
        let f: Vec<&str> = line.split(':').collect();
        (f[2].parse().expect("uid"), f[3].parse().expect("gid"))
    };
    let (engine, node) = (ids("sealnode-engine"), ids("sealnode-node"));
    assert_ne!(engine, node, "each role its own user");
    assert!(engine.0 != 0 && node.0 != 0, "{passwd}");
    for (dir, mode, owner) in [
        ("var/lib/sealnode", 0o755, (0, 0)),
        ("var/lib/sealnode/engine", 0o700, engine),
        ("var/lib/sealnode/node", 0o700, node),
        ("var/lib/sealnode/models", 0o755, (0, 0)),
    ] {
        let md = std::fs::metadata(root.path().join(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        assert_eq!((md.mode() & 0o7777, md.uid(), md.gid()), (mode, owner.0, owner.1), "{dir}");
    }
    // FHS leaves /srv to the admin: the package makes nothing there.
    assert!(!root.path().join("srv/sealnode").exists(), "tmpfiles made /srv/sealnode");
}
