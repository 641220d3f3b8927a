//! The systemd integration files: the unit verifies, its exposure score stays under the
//! documented threshold, it avoids the settings that would break the sandbox, and the
//! sysusers/tmpfiles snippets apply to a scratch root.

mod common;

use std::process::Command;

use common::*;

/// docs/operator-guide.md explains this number.
const EXPOSURE_THRESHOLD: f64 = 4.0;

fn analyze() -> Option<&'static str> {
    let p = "/usr/bin/systemd-analyze";
    std::path::Path::new(p).exists().then_some(p)
}

/// The unit with ExecStart pointing at the binary under test (verify checks it exists).
fn unit_copy(dir: &std::path::Path) -> std::path::PathBuf {
    let unit = std::fs::read_to_string(repo().join("systemd/sealnode.service")).expect("unit");
    let path = dir.join("sealnode.service");
    std::fs::write(&path, unit.replace("/usr/bin/sealnode", env!("CARGO_BIN_EXE_sealnode"))).expect("write");
    path
}

#[test]
fn unit_verifies_and_exposure_stays_under_the_threshold() {
    let Some(sa) = analyze() else {
        return unavailable("systemd", "systemd-analyze missing (apt-get install systemd)");
    };
    let dir = tempfile::tempdir().expect("tmp");
    let unit = unit_copy(dir.path());
    let o = Command::new(sa).arg("verify").arg(&unit).output_within(COMMAND_LIMIT);
    assert!(o.status.success(), "systemd-analyze verify: {}", String::from_utf8_lossy(&o.stderr));
    let o = Command::new(sa).args(["security", "--offline=yes"]).arg(&unit).output_within(COMMAND_LIMIT);
    let text = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
    let score: f64 = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for sealnode.service:").nth(1))
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure score in: {text}"));
    eprintln!("systemd-analyze security exposure: {score} (threshold {EXPOSURE_THRESHOLD})");
    assert!(score <= EXPOSURE_THRESHOLD, "exposure {score} rose above {EXPOSURE_THRESHOLD}");
}

#[test]
fn unit_does_not_fight_the_launcher() {
    let unit = std::fs::read_to_string(repo().join("systemd/sealnode.service")).expect("unit");
    let active: Vec<&str> = unit.lines().filter(|l| !l.trim_start().starts_with('#')).collect();
    for forbidden in [
        "ProtectKernelTunables=",
        "ProtectKernelLogs=",
        "ProtectProc=",
        "ProcSubset=",
        // systemd 257 binds /proc/sys/kernel/hostname read-only for it: an over-mount too.
        "ProtectHostname=",
        "RestrictNamespaces=",
        "PrivateNetwork=",
        "PrivateUsers=",
    ] {
        assert!(!active.iter().any(|l| l.starts_with(forbidden)), "{forbidden} would break the per-role sandboxes");
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
        // Exit codes a restart cannot fix (docs/operator-guide.md, "Exit status").
        "RestartPreventExitStatus=3 125",
    ] {
        assert!(active.iter().any(|l| l.starts_with(needed)), "unit lacks {needed}");
    }
    let caps = active.iter().find(|l| l.starts_with("CapabilityBoundingSet=")).expect("bounding set");
    for c in caps.trim_start_matches("CapabilityBoundingSet=").split_whitespace() {
        assert!(["CAP_SETUID", "CAP_SETGID", "CAP_KILL", "CAP_DAC_OVERRIDE"].contains(&c), "unexpected capability {c}");
    }
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
        ("srv/sealnode/models", 0o755, (0, 0)),
    ] {
        let md = std::fs::metadata(root.path().join(dir)).unwrap_or_else(|e| panic!("{dir}: {e}"));
        assert_eq!((md.mode() & 0o7777, md.uid(), md.gid()), (mode, owner.0, owner.1), "{dir}");
    }
}
