//! The receipt: what exactly was started, and proof it was checked (docs/receipt.md).
//!
//! Written after every preflight (start, restart, recycle) as JSON, atomically (temp file,
//! fsync, rename, fsync of the directory), mode 0640. It binds the launcher's version and
//! binary digest, the config digest, each role's compiled seccomp program digest, Landlock
//! rules digest and program digest, kernel facts, the canary results, the start time, and a
//! generation number that strictly increases across restarts, recycles and reboots (it is
//! kept in the state dir, and never below the last receipt's).

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::canary::Report;
use crate::config::{Config, Invoker, Role};
use crate::error::{Error, Result};

/// Version of the receipt format.
pub const SCHEMA: u32 = 1;
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
    pub seccomp_file: String,
    /// sha256 of the compiled BPF program (what the kernel runs), not of the JSON.
    pub seccomp_program_sha256: String,
    pub seccomp_instructions: usize,
    pub landlock_file: String,
    pub landlock_rules_sha256: String,
    /// The role's program as configured (command[0]) and the digest of its host file.
    pub program: String,
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

pub fn sha256_hex(bytes: &[u8]) -> String {
    hex::encode(Sha256::digest(bytes))
}

fn file_sha256(path: &Path) -> Result<String> {
    let mut f = std::fs::File::open(path).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = std::io::Read::read(&mut f, &mut buf).map_err(|e| Error::io(format!("read {}", path.display()), e))?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(hex::encode(h.finalize()))
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

/// The digests of everything a start depends on, computed now.
pub fn current_digests(cfg: &Config) -> Result<(Artifact, Artifact, BTreeMap<String, RoleDigests>)> {
    let exe = std::fs::read_link("/proc/self/exe").unwrap_or_default();
    // The running binary cannot change under us: hash it once per process.
    static SELF_SHA256: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    let sha256 = match SELF_SHA256.get() {
        Some(s) => s.clone(),
        None => SELF_SHA256.get_or_init(|| file_sha256(Path::new("/proc/self/exe")).unwrap_or_default()).clone(),
    };
    let sealnode =
        Artifact { path: exe.display().to_string(), sha256, version: Some(env!("CARGO_PKG_VERSION").into()) };
    // The bytes Config::load read and every start uses, not the files as they are now.
    let config =
        Artifact { path: cfg.file.display().to_string(), sha256: cfg.loaded.config.sha256.clone(), version: None };
    let mut roles = BTreeMap::new();
    for role in Role::ALL {
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
        let program = r.command.first().cloned().unwrap_or_default();
        let host = crate::sandbox::plan::host_path(cfg, role, Path::new(&program));
        roles.insert(
            role.name().to_string(),
            RoleDigests {
                seccomp_file: r.seccomp.display().to_string(),
                seccomp_program_sha256: program_sha256(&prog),
                seccomp_instructions: prog.len(),
                landlock_file: r.landlock.display().to_string(),
                landlock_rules_sha256: ll.sha256.clone(),
                program,
                // The file as it is now; a start records the sealed copy it runs instead
                // (write's `programs`), so verify-receipt sees a pinned file changed since.
                program_sha256: file_sha256(&host).ok(),
                program_pin: r.sha256.clone(),
                refused_syscalls_logged: r.log_refused_syscalls,
                devices_from: cfg.cdi(role).map(|c| DevicesFrom {
                    cdi: c.spec.display().to_string(),
                    cdi_sha256: c.sha256.clone(),
                    devices: c.edits.devices.clone(),
                    nodes: c.edits.nodes.iter().map(|n| n.path.display().to_string()).collect(),
                }),
            },
        );
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

/// Write `bytes` to `path` atomically (see [`write_atomic_at`]), in the directory `path` names.
pub fn write_atomic(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use nix::fcntl::OFlag;
    let dir_path = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::io(format!("write {}", path.display()), std::io::Error::other("no file name")))?;
    let dir = nix::fcntl::open(
        dir_path,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| Error::io(format!("write {}", path.display()), std::io::Error::from(e)))?;
    write_atomic_at(&dir, name, bytes, mode, path)
}

/// Write `name` in `dir` atomically: a temp file created there (never through a symlink),
/// fsync, rename onto `name`, fsync of the directory. Readers see the old or the new file,
/// never a partial one. `shown` names the file in errors.
pub fn write_atomic_at(dir: &std::os::fd::OwnedFd, name: &str, bytes: &[u8], mode: u32, shown: &Path) -> Result<()> {
    use nix::fcntl::{openat, renameat, OFlag};
    use nix::unistd::{unlinkat, UnlinkatFlags};
    let tmp = format!(".{name}.tmp-{}", std::process::id());
    let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
    let res = (|| -> std::io::Result<()> {
        let fd = openat(
            dir,
            tmp.as_str(),
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::from_bits_truncate(mode),
        )?;
        let mut f = std::fs::File::from(fd);
        f.write_all(bytes)?;
        f.sync_all()?;
        renameat(dir, tmp.as_str(), dir, name)?;
        nix::unistd::fsync(dir)?;
        Ok(())
    })();
    res.map_err(|e| {
        let _ = unlinkat(dir, tmp.as_str(), UnlinkatFlags::NoRemoveDir);
        Error::io(format!("write {}", shown.display()), e)
    })
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
    write_atomic_at(state, GENERATION_FILE, format!("{next}\n").as_bytes(), 0o640, &shown.join(GENERATION_FILE))?;
    Ok(next)
}

pub fn path(cfg: &Config) -> PathBuf {
    cfg.cell.state_dir.join(FILE)
}

/// Build and write the receipt for a start whose preflight produced `canary`, through `dir`,
/// the state dir's descriptor (opened and checked once, by the supervisor: trusted::own_dir).
/// `programs`: role name -> sha256 of the sealed copy each pinned role will run (what was
/// verified).
pub fn write(
    cfg: &Config,
    inv: &Invoker,
    dir: &std::os::fd::OwnedFd,
    canary: &Report,
    programs: &BTreeMap<String, String>,
    resources: BTreeMap<String, Resources>,
) -> Result<Receipt> {
    let state = &cfg.cell.state_dir;
    let (sealnode, config, mut roles) = current_digests(cfg)?;
    for (role, digest) in programs {
        if let Some(r) = roles.get_mut(role) {
            r.program_sha256 = Some(digest.clone());
        }
    }
    let report = serde_json::to_vec(canary).map_err(|e| Error::io("canary report", std::io::Error::other(e)))?;
    let receipt = Receipt {
        schema: SCHEMA,
        generation: next_generation(dir, state)?,
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
            landlock_abi: crate::sys::landlock_abi(),
            userns_mode: if inv.rootful() { "rootful" } else { "rootless" }.into(),
        },
        canary: CanarySummary {
            passed: canary.passed,
            schema: canary.schema,
            roles: canary
                .roles
                .iter()
                .map(|r| (r.role.name().to_string(), [r.attempts.len(), r.refused, r.succeeded]))
                .collect(),
            report_sha256: sha256_hex(&report),
        },
        resources,
    };
    let mut bytes = serde_json::to_vec_pretty(&receipt).map_err(|e| Error::io("receipt", std::io::Error::other(e)))?;
    bytes.push(b'\n');
    write_atomic_at(dir, FILE, &bytes, 0o640, &path(cfg))?;
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
pub fn verify(receipt: &Receipt, cfg: &Config) -> Result<Vec<String>> {
    let (sealnode, config, roles) = current_digests(cfg)?;
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
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    fn sample() -> Receipt {
        let digests = RoleDigests {
            seccomp_file: "/p/engine.json".into(),
            seccomp_program_sha256: "a".repeat(64),
            seccomp_instructions: 100,
            landlock_file: "/p/engine.toml".into(),
            landlock_rules_sha256: "b".repeat(64),
            program: "/usr/bin/true".into(),
            program_sha256: Some("c".repeat(64)),
            program_pin: None,
            refused_syscalls_logged: false,
            devices_from: None,
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
        assert!(e.contains("r.json") && e.contains("receipt schema 2 is not 1"), "{e}");
        v["schema"] = 1.into();
        v["kernel"]["extra"] = true.into();
        let e = parse(v.to_string().as_bytes(), Path::new("r.json")).expect_err("unknown field").to_string();
        assert!(e.contains("unknown field") && e.contains("extra"), "{e}");
        let e = parse(b"{\"schema\":1}", Path::new("r.json")).expect_err("truncated").to_string();
        assert!(e.contains("not a sealnode receipt") && e.contains("missing field"), "{e}");
    }

    /// Atomic: a reader that opened the old receipt keeps reading all of it after a new one is
    /// written, and the path then names a new, complete file. An in-place rewrite (truncate and
    /// write) fails this: the old reader would see the new bytes or none.
    #[test]
    fn write_atomic_replaces_the_file_whole() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(FILE);
        let old = vec![b'o'; 100_000];
        write_atomic(&path, &old, 0o640).expect("first write");
        let mut reader = std::fs::File::open(&path).expect("open old");
        let old_ino = std::fs::metadata(&path).expect("md").ino();
        let new = vec![b'n'; 50_000];
        write_atomic(&path, &new, 0o640).expect("second write");
        let mut seen = Vec::new();
        std::io::Read::read_to_end(&mut reader, &mut seen).expect("read old");
        assert!(seen == old, "the old reader saw {} bytes, not the whole old receipt", seen.len());
        let md = std::fs::metadata(&path).expect("md");
        assert_ne!(md.ino(), old_ino, "rewritten in place");
        assert_eq!(md.mode() & 0o777, 0o640);
        assert_eq!(std::fs::read(&path).expect("read new"), new);
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).expect("dir").filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from(FILE)], "leftovers");
    }

    /// A reader opening the path while receipts are being replaced sees one whole receipt every
    /// time, never an empty or partial file. (Found by review: renaming the temp file into
    /// place before writing it passed the test above.)
    #[test]
    fn readers_never_see_a_partial_receipt() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join(FILE);
        let body = |i: usize| vec![b'a' + (i % 26) as u8; 20_000 + (i % 7) * 10_000];
        write_atomic(&path, &body(0), 0o640).expect("first");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p2, s2) = (path.clone(), stop.clone());
        let reader = std::thread::spawn(move || {
            let mut reads = 0usize;
            while !s2.load(std::sync::atomic::Ordering::Relaxed) {
                let b = std::fs::read(&p2).expect("read");
                let whole = !b.is_empty() && b.iter().all(|c| *c == b[0]) && (b.len() - 20_000) % 10_000 == 0;
                assert!(whole, "a reader saw a partial receipt: {} bytes", b.len());
                reads += 1;
            }
            reads
        });
        for i in 1..300 {
            write_atomic(&path, &body(i), 0o640).expect("write");
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let reads = reader.join().expect("reader");
        assert!(reads >= 50, "only {reads} reads raced the writes");
    }

    /// A write that fails (the target is a directory: rename refuses) leaves the old state and
    /// no temp file, and names the path.
    #[test]
    fn a_failed_write_leaves_no_temp_file() {
        let dir = tempfile::tempdir().expect("tmp");
        let target = dir.path().join("receipt.json");
        std::fs::create_dir(&target).expect("dir");
        std::fs::write(target.join("inside"), "x").expect("inside");
        let e = write_atomic(&target, b"new", 0o640).expect_err("rename onto a dir").to_string();
        assert!(e.contains(&target.display().to_string()), "{e}");
        let names: Vec<_> =
            std::fs::read_dir(dir.path()).expect("dir").filter_map(|e| e.ok()).map(|e| e.file_name()).collect();
        assert_eq!(names, [std::ffi::OsString::from("receipt.json")], "a temp file was left behind");
        assert!(target.join("inside").exists());
        let _ = std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o700));
    }

    #[test]
    fn the_next_generation_is_above_the_counter_and_the_last_receipt() {
        let dir = tempfile::tempdir().expect("tmp");
        let fd = crate::trusted::own_dir(dir.path(), nix::unistd::geteuid().as_raw(), 0o700).expect("dir");
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
