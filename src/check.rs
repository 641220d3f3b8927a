//! `sealnode check`: everything `run` checks before it starts anything, without starting
//! anything (like `nginx -t`): the config and its ownership, the policies, each role's plan
//! (paths, program, pin), the users, the dirs, the kernel, the limits, the attestation key and
//! TPM (which `check` reads, as `run` would: it asks the TPM for its key). The config's own
//! checks list up to 20 problems at once; once it loads, every other check runs, so one pass
//! lists every problem. Nothing is created, locked or started; only doctor's throwaway namespace probe
//! forks.

use std::path::Path;

use crate::config::{Config, Invoker, Role};
use crate::doctor::{Check, Level};

/// Rootless, what sealnode's own processes need of its RLIMIT_NPROC beside both roles': the
/// supervisor, the cell init, a wipe or a probe, and a reload's preflight cell (its init and
/// both roles' sandboxes, each a sandbox init and a workload with a few helpers).
const NPROC_HEADROOM: u64 = 32;

/// The checks for `file`, in the order `run` meets them.
pub fn checks(file: &Path, inv: &Invoker) -> Vec<Check> {
    run(file, inv).0
}

/// The checks, and "what is sealed" (crate::proof::sealed_text) from the plans they built: `roles`
/// (each role's layers, and the preflight it would run) and `statement`; `null` until the
/// config loads.
pub fn run(file: &Path, inv: &Invoker) -> (Vec<Check>, serde_json::Value) {
    let mut v = Vec::new();
    let mut sealed = Vec::new();
    let add = |v: &mut Vec<Check>, name: &'static str, r: Result<String, String>, meaning: &str| {
        v.push(match r {
            Ok(value) => Check { name, level: Level::Ok, value, meaning: meaning.into() },
            Err(value) => Check { name, level: Level::Fail, value, meaning: meaning.into() },
        })
    };
    // The config, its ownership, the role paths and the policies' bytes (Config::load).
    let cfg = match Config::load(file, inv) {
        Ok(c) => c,
        Err(e) => {
            add(&mut v, "config", Err(e.to_string()), "nothing else can be checked until the config loads");
            return (v, serde_json::Value::Null);
        }
    };
    add(
        &mut v,
        "config",
        Ok(format!("{} (schema 1)", cfg.file.display())),
        "parsed; owned by root or sealnode's user and writable by no one else, as are the policies it names",
    );
    let signing = matches!(crate::proof::attest::load_signing(&cfg.cell.state_dir, inv.uid), Ok(Some(_)));
    let state = nix::fcntl::open(
        &cfg.cell.state_dir,
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .ok();
    for role in Role::ALL {
        let name = match role {
            Role::Engine => "engine sandbox",
            Role::Node => "node sandbox",
        };
        // The plan `run` builds at every start: seccomp compiled, Landlock rules resolved, every
        // bind checked, the program found in the role's view, copied, sealed and hashed (a pin
        // verified), the trees the role sees walked, and what the role opens besides (each bind's
        // source, the credential, the model files its command names, its devices) opened as
        // the role (crate::sandbox::access), as the gate's measurement does at every start.
        // With a signing key, the engine's read-only model files are hashed as `run` hashes
        // them (through the digests' cache, which check reads and never writes).
        let plan = crate::sandbox::Plan::for_run(&cfg, role, inv).map_err(|e| e.to_string()).and_then(|p| {
            let mut job = crate::proof::measure::job_for(&cfg, inv, &[(role, &p)]);
            let r = cfg.role(role);
            if let (Some(dir), false, true) = (&r.models, r.models_writable, signing) {
                job.models = Some(crate::proof::measure::ModelsJob { dir: dir.clone(), keep_cache: false });
            }
            let m = crate::proof::measure::run(&job, state.as_ref().map(|fd| (fd, cfg.cell.state_dir.as_path())));
            match (m.error(&cfg.file), &m.could_not) {
                (Some(e), _) => Err(e.to_string()),
                (None, Some(why)) => Err(format!("could not be checked: {why}")),
                (None, None) => Ok((p, m)),
            }
        });
        // The role's layers as this plan holds them; its cgroup limits as configured (whether
        // this host enforces them is the "cgroup limits" check).
        let configured = serde_json::to_value(cfg.limits(role)).ok();
        let limits = configured
            .as_ref()
            .and_then(|l| l.as_object())
            .map(|o| o.iter().map(|(k, x)| (k.clone(), x.to_string())).collect())
            .unwrap_or_default();
        let layers = plan.as_ref().ok().map(|(p, _)| crate::proof::sealed_text::role(&cfg, p, limits));
        sealed.push(serde_json::json!({
            "role": role.name(),
            "sealed": layers,
            "preflight": { "planned": crate::proof::sealed_text::planned_attempts(&cfg, role) },
        }));
        let plan = plan.map(|(p, m)| {
            let program = match (p.sealed_program(), m.program(role)) {
                (Some(sp), Some(d)) => {
                    let configured = cfg.role(role).command[0].as_str();
                    let shown = if sp.inside.as_os_str() == configured {
                        configured.to_string()
                    } else {
                        format!("{configured} -> {}", sp.inside.display())
                    };
                    let host =
                        if sp.host == sp.inside { String::new() } else { format!(" (host {})", sp.host.display()) };
                    let pin = if sp.pin.is_some() { ", pin verified" } else { "" };
                    format!("{shown}{host} sha256 {}{pin}", &d.sha256[..16])
                }
                _ => p.argv.first().map(|a| a.to_string_lossy().into_owned()).unwrap_or_default(),
            };
            format!(
                "{program} as uid {}, {} mounts, {} seccomp instructions",
                p.ids.uid,
                p.mounts.len(),
                p.seccomp.len()
            )
        });
        add(&mut v, name, plan, "the sandbox `run` builds: policies, binds, program, user");
        if let Some(c) = cfg.cdi(role) {
            let left = match c.left_out.len() {
                0 => String::new(),
                n => format!(
                    "; {n} left out: {}",
                    c.left_out.iter().map(|(e, w)| format!("{e} ({w})")).collect::<Vec<_>>().join("; ")
                ),
            };
            add(
                &mut v,
                match role {
                    Role::Engine => "engine devices",
                    Role::Node => "node devices",
                },
                Ok(format!(
                    "{} from {}: {} device nodes, {} files bound, {} already in view, {} variables ({}){left}",
                    c.edits.devices.join(", "),
                    c.spec.display(),
                    c.edits.nodes.len(),
                    c.binds.len(),
                    c.in_view.len(),
                    c.edits.env.len(),
                    c.edits.env.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>().join(" ")
                )),
                "devices_from: the CDI spec's nodes (Landlock ioctl_dev on exactly those), files (read-only) and environment",
            );
        }
        let name = match role {
            Role::Engine => "engine scratch",
            Role::Node => "node scratch",
        };
        let meaning = "the role's own dir: its owner, no one else may write it, no other running cell's \
                       (wiped before the cell starts its roles, at a reload and a recycle; a role's own restart keeps it)";
        // Locked by the `run` that uses it: another cell's is refused, as `run` refuses it.
        v.push(match crate::sandbox::locks::scratch_status(&cfg, role) {
            Ok(None) => Check {
                name,
                level: Level::Ok,
                value: cfg.role(role).scratch.display().to_string(),
                meaning: meaning.into(),
            },
            Ok(Some(held)) => Check {
                name,
                level: Level::Warn,
                value: held,
                meaning: "this config's `sealnode run` is running: a second one would refuse to start \
                          (a reload, `systemctl reload`, is fine)"
                    .into(),
            },
            Err(e) => Check { name, level: Level::Fail, value: e.to_string(), meaning: meaning.into() },
        });
    }
    // The denial log takes each role's seccomp listener with pidfd_getfd, which a unit's
    // SystemCallFilter= may deny: try it on ourselves, so check fails where the start would
    // (tests/check_run.rs: check_tries_the_denial_logs_pidfd_getfd).
    if let Some(tried) = crate::doctor::denial_log(&cfg) {
        add(
            &mut v,
            "denial log",
            tried.map(|()| "pidfd_getfd allowed".to_string()),
            "log_refused_syscalls takes each role's seccomp listener with pidfd_getfd",
        );
    }
    add(
        &mut v,
        "cell",
        crate::sandbox::cell::Cell::requirements(&cfg).map_err(|e| e.to_string()),
        "the cell's user namespace maps the roles' ids; its init confines itself with Landlock",
    );
    // Rootless, both roles are one host uid: above each role's own count, every process of that
    // uid counts against sealnode's own RLIMIT_NPROC (`run` takes its hard limit), which both
    // roles' nproc may not fit in (found by review).
    let hard_nproc =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NPROC).map_or(u64::MAX, |l| l.1);
    let both = cfg.engine.rlimits.nproc.saturating_add(cfg.node.rlimits.nproc);
    if !inv.rootful() && both.saturating_add(NPROC_HEADROOM) > hard_nproc {
        v.push(Check {
            name: "process limits",
            level: Level::Warn,
            value: format!(
                "rootless: engine.rlimits.nproc + node.rlimits.nproc = {both}, plus {NPROC_HEADROOM} for sealnode's own, \
                 over its hard RLIMIT_NPROC ({hard_nproc})"
            ),
            meaning: "every process and thread of uid {} counts against sealnode's limit too, its own included (the supervisor, \
                      the cell init, a reload's preflight cell): one role may use up what the other's nproc allows, or a reload \
                      fail; raise it (`ulimit -Hu`, LimitNPROC= in the unit) or lower nproc"
                .replace("{}", &inv.uid.to_string()),
        });
    }
    add(
        &mut v,
        "cgroup limits",
        crate::sandbox::cgroup::check(&cfg)
            .map(|at| match at {
                Some(p) => format!("enforced under {}", p.display()),
                None => "none set".to_string(),
            })
            .map_err(|e| e.to_string()),
        "each limit set is one this host can enforce",
    );
    add(
        &mut v,
        "attestation",
        crate::proof::attest::signer_status(&cfg, inv).map_err(|e| e.to_string()),
        "the key statements are signed with (owner-only) and, with cell.tpm, the TPM that quotes them",
    );
    v.push(match crate::sandbox::locks::lock_status(&cfg, inv) {
        Ok(None) => Check {
            name: "state and runtime dirs",
            level: Level::Ok,
            value: format!("{}, {}", cfg.cell.state_dir.display(), cfg.cell.runtime_dir.display()),
            meaning: "trusted owners, writable by no one else, not in use by another `sealnode run`".into(),
        },
        Ok(Some(held)) => Check {
            name: "state and runtime dirs",
            level: Level::Warn,
            value: held,
            meaning: "a `sealnode run` with these dirs is running: a second one would refuse to start \
                      (a reload, `systemctl reload`, is fine)"
                .into(),
        },
        Err(e) => Check {
            name: "state and runtime dirs",
            level: Level::Fail,
            value: e.to_string(),
            meaning: "sealnode keeps its lock, receipts and control socket there".into(),
        },
    });
    // The kernel: what doctor would fail on (its warnings are doctor's to show).
    let min_abi = Role::ALL
        .iter()
        .filter_map(|r| {
            let (_, ll) = cfg.policy_files(*r).ok()?;
            crate::policy::landlock::Rules::from_loaded(&ll.bytes, &cfg.role(*r).landlock).ok()
        })
        .map(|r| r.min_abi)
        .max()
        .unwrap_or(6);
    let kernel = crate::doctor::checks(crate::doctor::Needs::of(&cfg, min_abi));
    let failed: Vec<_> = kernel.iter().filter(|c| c.level == Level::Fail).collect();
    add(
        &mut v,
        "kernel",
        if failed.is_empty() {
            Ok(format!("{} checks pass (Landlock ABI {min_abi} needed)", kernel.len()))
        } else {
            Err(failed.iter().map(|c| format!("{}: {}", c.name, c.value)).collect::<Vec<_>>().join("; "))
        },
        "what `sealnode doctor` requires; run it for the details and fixes",
    );
    let statement =
        serde_json::json!({ "state": "planned", "signed": signing, "tpm_quoted": signing && cfg.cell.tpm.is_some() });
    (v, serde_json::json!({ "roles": sealed, "statement": statement }))
}
