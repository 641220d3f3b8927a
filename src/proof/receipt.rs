//! The receipt: what exactly was started, and proof it was checked (docs/receipt.md).
//!
//! Written after every preflight (start, restart, recycle) as JSON, atomically (temp file,
//! fsync, rename, fsync of the directory), mode 0640. It binds the launcher's version and
//! binary digest, the config digest, each role's compiled seccomp program digest, Landlock
//! rules digest and program digest, kernel facts, the canary results, the start time, and a
//! generation number that strictly increases across restarts, recycles and reboots (it is
//! kept in the state dir, and never below the last receipt's).
//!
//! Each role's digests belong to its process: they are taken when that role passes the gate
//! (its program's sealed copy, its policies, the engine's model files) and carried unchanged
//! into every later receipt while that process lives, with the generation it started at. A
//! restart of one role never re-reads the other's files.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::{Config, Invoker, Role};
use crate::error::{Error, Result};
use crate::proof::canary::Report;

/// Version of the receipt format.
pub const SCHEMA: u32 = 3;
pub const FILE: &str = "receipt.json";
const GENERATION_FILE: &str = "generation";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Receipt {
    pub schema: u32,
    pub generation: u64,
    /// Seconds since the Unix epoch.
    pub started_at: u64,
    /// /proc/sys/kernel/random/boot_id: which boot this start belongs to.
    pub boot_id: String,
    pub sealnode: Artifact,
    pub config: Artifact,
    pub roles: BTreeMap<String, RoleDigests>,
    pub kernel: Kernel,
    /// The container sealnode ran in, by its runtime's marks (docs/containers.md); absent on a host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub container: Option<crate::os::container::Container>,
    pub canary: CanarySummary,
    /// Per role: its cgroup leaf and the limit files written there (none without a cgroup).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub resources: BTreeMap<String, Resources>,
}

/// A role's cgroup leaf and the limits in force there, as the files and values written.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Resources {
    pub cgroup: String,
    pub files: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Artifact {
    pub path: String,
    pub sha256: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleDigests {
    /// The generation whose gate this role's process (running, or about to start) passed: a
    /// role that did not restart keeps the one it started at.
    pub generation: u64,
    pub seccomp_file: String,
    /// sha256 of the compiled BPF program (what the kernel runs), not of the JSON.
    pub seccomp_program_sha256: String,
    pub seccomp_instructions: usize,
    pub landlock_file: String,
    pub landlock_rules_sha256: String,
    /// The role's program as configured (command[0]).
    pub program: String,
    /// Where the role's view resolves it (every symlink followed inside the sandbox), and the
    /// host file behind that path.
    pub program_resolved: Option<String>,
    pub program_host: Option<String>,
    /// sha256 of the bytes the role executes: its program's sealed copy (none only where the
    /// program could not be read: `verify-receipt`'s view of the file now).
    pub program_sha256: Option<String>,
    /// The configured pin, if any (verified before the start).
    pub program_pin: Option<String>,
    /// `log_refused_syscalls`: refusals go to sealnode's denial log (SECCOMP_RET_USER_NOTIF,
    /// answered with the same errno); `seccomp_program_sha256` is then that program's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub refused_syscalls_logged: bool,
    /// `devices_from`: the CDI spec as read (its digest), the devices taken from it and the
    /// device nodes the role got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub devices_from: Option<DevicesFrom>,
    /// The engine with a model dir: its model files as started (`model:<path under the dir>`
    /// -> sha256), and whether they bind: false with `models_writable` (the engine may change
    /// them) or when they could not be hashed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub models: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models_binding: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevicesFrom {
    pub cdi: String,
    pub cdi_sha256: String,
    pub devices: Vec<String>,
    pub nodes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Kernel {
    pub release: String,
    pub landlock_abi: i32,
    /// "rootful" (each role its own host uid) or "rootless".
    pub userns_mode: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CanarySummary {
    pub passed: bool,
    pub schema: u32,
    /// role -> [attempts, refused, succeeded]
    pub roles: BTreeMap<String, [usize; 3]>,
    /// sha256 of the full canary JSON report.
    pub report_sha256: String,
}

/// Digest of a compiled seccomp program: its instructions as the kernel receives them.
pub fn program_sha256(prog: &seccompiler::BpfProgram) -> String {
    let mut h = Sha256::new();
    for i in prog {
        h.update(i.code.to_le_bytes());
        h.update([i.jt, i.jf]);
        h.update(i.k.to_le_bytes());
    }
    hex::encode(h.finalize())
}

/// The running sealnode binary's digest: hashed once per process (it cannot change under us).
fn self_sha256() -> String {
    static SELF_SHA256: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    SELF_SHA256
        .get_or_init(|| {
            // The magic link is the running binary itself (no path lookup to race).
            std::fs::File::open("/proc/self/exe")
                .and_then(|mut f| crate::os::atomic::sha256_read(&mut f))
                .unwrap_or_default()
        })
        .clone()
}

/// sealnode itself and the config as [`Config::load`] read them (the bytes every start uses,
/// not the files as they are now).
pub fn artifacts(cfg: &Config) -> (Artifact, Artifact) {
    let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
    let sealnode = Artifact {
        path: exe.display().to_string(),
        sha256: self_sha256(),
        version: Some(env!("CARGO_PKG_VERSION").into()),
    };
    let config =
        Artifact { path: cfg.file.display().to_string(), sha256: cfg.config_sha256().to_string(), version: None };
    (sealnode, config)
}

/// A role's digests from its policies as loaded (the compiled seccomp program, the Landlock
/// rules, the CDI spec), with its program named as configured and not yet measured.
pub fn policy_digests(cfg: &Config, role: Role) -> Result<RoleDigests> {
    let r = cfg.role(role);
    let (sc, ll) = cfg.policy_files(role)?;
    let prog = crate::policy::seccomp::compile_loaded(
        &sc.bytes,
        &sc.sha256,
        &r.seccomp,
        role.name(),
        crate::policy::arch::native_arch(),
    )?;
    // With the denial log, the program the kernel runs is the notifying one (Plan::log_refusals).
    let prog = match r.log_refused_syscalls {
        true => crate::policy::seccomp::notify_refusals(&prog, crate::policy::arch::native_arch())
            .map(|(p, _)| p)
            .unwrap_or(prog),
        false => prog,
    };
    Ok(RoleDigests {
        generation: 0,
        seccomp_file: r.seccomp.display().to_string(),
        seccomp_program_sha256: program_sha256(&prog),
        seccomp_instructions: prog.len(),
        landlock_file: r.landlock.display().to_string(),
        landlock_rules_sha256: ll.sha256.clone(),
        program: r.command.first().cloned().unwrap_or_default(),
        program_resolved: None,
        program_host: None,
        program_sha256: None,
        program_pin: r.sha256.clone(),
        refused_syscalls_logged: r.log_refused_syscalls,
        devices_from: cfg.cdi(role).map(|c| DevicesFrom {
            cdi: c.spec.display().to_string(),
            cdi_sha256: c.sha256.clone(),
            devices: c.edits.devices.clone(),
            nodes: c.edits.nodes.iter().map(|n| n.path.display().to_string()).collect(),
        }),
        models: BTreeMap::new(),
        models_binding: None,
    })
}

/// The digests of everything a start of `cfg` depends on as the files are now (for
/// `verify-receipt` and `attest subjects`, never a start): each role's program resolved in its
/// view as a start resolves it, and hashed there (no model files: the caller adds them).
pub fn current_digests(cfg: &Config, inv: &Invoker) -> Result<(Artifact, Artifact, BTreeMap<String, RoleDigests>)> {
    let (sealnode, config) = artifacts(cfg);
    let mut roles = BTreeMap::new();
    for role in Role::ALL {
        let mut d = policy_digests(cfg, role)?;
        if let Ok(plan) = crate::sandbox::Plan::build(cfg, role, inv, None, None) {
            if let Some(p) = plan.sealed_program() {
                d.program_resolved = Some(p.inside.display().to_string());
                d.program_host = Some(p.host.display().to_string());
                d.program_sha256 = crate::proof::measure::file_sha256(&p.host).ok();
            }
        }
        roles.insert(role.name().to_string(), d);
    }
    Ok((sealnode, config, roles))
}

/// Read a small file of `dir` without following a symlink; None if it is not there.
fn read_at(dir: &impl std::os::fd::AsFd, name: &str) -> Option<Vec<u8>> {
    use nix::fcntl::{openat, OFlag};
    let fd = openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        nix::sys::stat::Mode::empty(),
    )
    .ok()?;
    let mut b = Vec::new();
    std::io::Read::read_to_end(&mut std::fs::File::from(fd), &mut b).ok()?;
    Some(b)
}

/// The next generation: above both the counter and the last receipt, persisted (fsync)
/// before use, so no two starts ever share one, across crashes and reboots.
fn next_generation(state: &std::os::fd::OwnedFd, shown: &Path) -> Result<u64> {
    let num = |b: Option<Vec<u8>>| b.and_then(|b| String::from_utf8(b).ok()?.trim().parse::<u64>().ok()).unwrap_or(0);
    let counter = num(read_at(state, GENERATION_FILE));
    let last = read_at(state, FILE).and_then(|b| parse(&b, &shown.join(FILE)).ok()).map(|r| r.generation).unwrap_or(0);
    let next = counter.max(last).checked_add(1).ok_or_else(|| {
        Error::io(format!("generation counter in {} is exhausted", shown.display()), std::io::Error::other("u64::MAX"))
    })?;
    crate::os::atomic::write_atomic_at(
        state,
        GENERATION_FILE,
        format!("{next}\n").as_bytes(),
        0o640,
        &shown.join(GENERATION_FILE),
    )?;
    Ok(next)
}

pub fn path(cfg: &Config) -> PathBuf {
    cfg.cell.state_dir.join(FILE)
}

/// Build and write the receipt for a start whose preflight produced `canary`, through `dir`,
/// the state dir's descriptor (opened and checked once, by the supervisor: trusted::own_dir).
/// `roles`: each role's digests (its process's, [`RoleDigests`]); those of the `gated` roles
/// get this receipt's generation.
pub fn write(
    cfg: &Config,
    inv: &Invoker,
    dir: &std::os::fd::OwnedFd,
    canary: &Report,
    mut roles: BTreeMap<String, RoleDigests>,
    gated: &[Role],
    resources: BTreeMap<String, Resources>,
) -> Result<Receipt> {
    let state = &cfg.cell.state_dir;
    let (sealnode, config) = artifacts(cfg);
    let report = serde_json::to_vec(canary).map_err(|e| Error::io("canary report", std::io::Error::other(e)))?;
    let generation = next_generation(dir, state)?;
    for role in gated {
        if let Some(d) = roles.get_mut(role.name()) {
            d.generation = generation;
        }
    }
    let receipt = Receipt {
        schema: SCHEMA,
        generation,
        started_at: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0),
        boot_id: std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default().trim().to_string(),
        sealnode,
        config,
        roles,
        kernel: Kernel {
            release: nix::sys::utsname::uname().map(|u| u.release().to_string_lossy().into_owned()).unwrap_or_default(),
            landlock_abi: crate::os::sys::landlock_abi(),
            userns_mode: if inv.rootful() { "rootful" } else { "rootless" }.into(),
        },
        container: crate::os::container::detect(),
        canary: CanarySummary {
            passed: canary.passed,
            schema: canary.schema,
            roles: canary
                .roles
                .iter()
                .map(|r| (r.role.name().to_string(), [r.attempts.len(), r.refused, r.succeeded]))
                .collect(),
            report_sha256: crate::os::atomic::sha256_hex(&report),
        },
        resources,
    };
    let mut bytes = serde_json::to_vec_pretty(&receipt).map_err(|e| Error::io("receipt", std::io::Error::other(e)))?;
    bytes.push(b'\n');
    crate::os::atomic::write_atomic_at(dir, FILE, &bytes, 0o640, &path(cfg))?;
    Ok(receipt)
}

/// Parse a receipt file (strict: unknown fields and other schema versions are refused).
pub fn load(file: &Path) -> Result<Receipt> {
    let text = std::fs::read(file).map_err(|e| Error::io(format!("read {}", file.display()), e))?;
    parse(&text, file)
}

pub fn parse(text: &[u8], file: &Path) -> Result<Receipt> {
    let r: Receipt =
        serde_json::from_slice(text).map_err(|e| Error::policy(file, format!("not a sealnode receipt: {e}")))?;
    if r.schema != SCHEMA {
        return Err(Error::policy(
            file,
            format!("receipt schema {} is not {SCHEMA}, the one this sealnode reads", r.schema),
        ));
    }
    Ok(r)
}

/// Compare a receipt with the current config and binaries; returns the mismatches.
pub fn verify(receipt: &Receipt, cfg: &Config, inv: &Invoker) -> Result<Vec<String>> {
    let (sealnode, config, roles) = current_digests(cfg, inv)?;
    let mut bad = Vec::new();
    let cmp = |bad: &mut Vec<String>, what: &str, then: &str, now: &str| {
        if then != now {
            bad.push(format!("{what}: receipt {then}, now {now}"));
        }
    };
    cmp(&mut bad, "sealnode binary sha256", &receipt.sealnode.sha256, &sealnode.sha256);
    cmp(&mut bad, "config sha256", &receipt.config.sha256, &config.sha256);
    for (role, now) in &roles {
        let Some(then) = receipt.roles.get(role) else {
            bad.push(format!("{role}: missing from the receipt"));
            continue;
        };
        cmp(
            &mut bad,
            &format!("{role} seccomp program sha256"),
            &then.seccomp_program_sha256,
            &now.seccomp_program_sha256,
        );
        cmp(
            &mut bad,
            &format!("{role} landlock rules sha256"),
            &then.landlock_rules_sha256,
            &now.landlock_rules_sha256,
        );
        cmp(
            &mut bad,
            &format!("{role} program sha256"),
            then.program_sha256.as_deref().unwrap_or("-"),
            now.program_sha256.as_deref().unwrap_or("-"),
        );
        let cdi = |d: &Option<DevicesFrom>| d.as_ref().map_or("-".to_string(), |d| d.cdi_sha256.clone());
        cmp(&mut bad, &format!("{role} CDI spec sha256"), &cdi(&then.devices_from), &cdi(&now.devices_from));
    }
    if !receipt.canary.passed {
        bad.push("the receipt records a failed canary".into());
    }
    Ok(bad)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Receipt {
        let digests = RoleDigests {
            generation: 7,
            seccomp_file: "/p/engine.json".into(),
            seccomp_program_sha256: "a".repeat(64),
            seccomp_instructions: 100,
            landlock_file: "/p/engine.toml".into(),
            landlock_rules_sha256: "b".repeat(64),
            program: "/usr/bin/true".into(),
            program_resolved: Some("/usr/bin/true".into()),
            program_host: Some("/usr/bin/true".into()),
            program_sha256: Some("c".repeat(64)),
            program_pin: None,
            refused_syscalls_logged: false,
            devices_from: None,
            models: BTreeMap::new(),
            models_binding: None,
        };
        Receipt {
            schema: SCHEMA,
            generation: 7,
            started_at: 1_700_000_000,
            boot_id: "boot".into(),
            sealnode: Artifact {
                path: "/usr/bin/sealnode".into(),
                sha256: "d".repeat(64),
                version: Some("0.1.0".into()),
            },
            config: Artifact { path: "/etc/sealnode/sealnode.toml".into(), sha256: "e".repeat(64), version: None },
            roles: [("engine".to_string(), digests.clone()), ("node".to_string(), digests)].into(),
            kernel: Kernel { release: "6.18".into(), landlock_abi: 7, userns_mode: "rootful".into() },
            container: None,
            canary: CanarySummary {
                passed: true,
                schema: 1,
                roles: [("engine".to_string(), [90, 90, 0])].into(),
                report_sha256: "f".repeat(64),
            },
            resources: BTreeMap::new(),
        }
    }

    #[test]
    fn a_receipt_round_trips_and_other_schemas_are_refused() {
        let r = sample();
        let bytes = serde_json::to_vec(&r).expect("json");
        assert_eq!(parse(&bytes, Path::new("r.json")).expect("parse"), r);
        let mut v: serde_json::Value = serde_json::from_slice(&bytes).expect("value");
        v["schema"] = 2.into();
        let e = parse(v.to_string().as_bytes(), Path::new("r.json")).expect_err("schema 2").to_string();
        assert!(e.contains("r.json") && e.contains("receipt schema 2 is not 3"), "{e}");
        v["schema"] = 3.into();
        v["kernel"]["extra"] = true.into();
        let e = parse(v.to_string().as_bytes(), Path::new("r.json")).expect_err("unknown field").to_string();
        assert!(e.contains("unknown field") && e.contains("extra"), "{e}");
        let e = parse(b"{\"schema\":3}", Path::new("r.json")).expect_err("truncated").to_string();
        assert!(e.contains("not a sealnode receipt") && e.contains("missing field"), "{e}");
    }

    #[test]
    fn the_next_generation_is_above_the_counter_and_the_last_receipt() {
        let dir = tempfile::tempdir().expect("tmp");
        let fd = crate::os::trusted::own_dir(dir.path(), nix::unistd::geteuid().as_raw(), 0o700).expect("dir");
        let next_generation = |_: &Path| super::next_generation(&fd, dir.path());
        assert_eq!(next_generation(dir.path()).expect("first"), 1);
        assert_eq!(next_generation(dir.path()).expect("second"), 2);
        // A receipt from a later generation than the counter (the counter was lost or old).
        let mut r = sample();
        r.generation = 41;
        std::fs::write(dir.path().join(FILE), serde_json::to_vec(&r).expect("json")).expect("receipt");
        std::fs::write(dir.path().join(GENERATION_FILE), "3\n").expect("counter");
        assert_eq!(next_generation(dir.path()).expect("third"), 42);
        assert_eq!(std::fs::read_to_string(dir.path().join(GENERATION_FILE)).expect("counter"), "42\n");
        std::fs::write(dir.path().join(GENERATION_FILE), format!("{}\n", u64::MAX)).expect("counter");
        let e = next_generation(dir.path()).expect_err("exhausted").to_string();
        assert!(e.contains("exhausted"), "{e}");
    }
}
