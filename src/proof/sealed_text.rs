//! "What is sealed", on one screen: per role, each layer and what it holds (user, namespaces,
//! root, Landlock, seccomp, privileges, rlimits, cgroup limits, egress), the preflight's
//! attempts and which layer refused how many, and the statement's state. `sealnode check`
//! (from the plans it builds) and `sealnode ctl status` (from the status answer) show it.
//!
//! Two halves: [`role`] summarises a role's plan as data (the JSON both commands carry), and
//! [`render`] turns that JSON into text. The renderer is pure and takes any JSON (fuzzed:
//! `fuzzing::control_reply`); every string it shows is escaped, so no value can move the
//! cursor or forge a line.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::config::{Config, Role};
use crate::proof::canary::Layer;
use crate::sandbox::plan::{Check, Mount, Plan, BASE_DEVICES, NEWROOT, SYSTEM_RO};

/// The namespaces every role gets (its own net, pid, mount, ipc, uts and cgroup namespaces in
/// the cell's user namespace).
pub const NAMESPACES: [&str; 7] = ["user", "mount", "pid", "net", "ipc", "uts", "cgroup"];

/// The layers a preflight attempt can be refused by, in the order shown.
pub const LAYERS: [Layer; 7] = [
    Layer::Seccomp,
    Layer::Landlock,
    Layer::Namespaces,
    Layer::Credentials,
    Layer::Rlimits,
    Layer::Launcher,
    Layer::Host,
];

/// A role's sandbox as its plan holds it, layer by layer (read back by `ctl`: a role's
/// `sealed` in `control::protocol::Status`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoleSeal {
    /// The user name the role runs as (rootful: the configured one; rootless: the invoker's),
    /// when known.
    pub user: Option<String>,
    pub uid: u32,
    pub gid: u32,
    /// "rootful" (the role's own host uid) or "rootless" (the invoker's uid).
    pub mode: String,
    pub namespaces: Vec<String>,
    /// What the role's network namespace holds besides its loopback.
    pub net: String,
    pub root: Root,
    pub landlock: LandlockSeal,
    pub seccomp: SeccompSeal,
    /// Capabilities left in every set: none.
    pub capabilities: String,
    pub no_new_privs: bool,
    /// Resource limits (RLIMIT_*), in their units (bytes for fsize and memlock).
    pub rlimits: BTreeMap<String, u64>,
    /// cgroup limits in force: the files written and their values (`run`), or the configured
    /// fields (`check`); empty: none set.
    pub cgroup: BTreeMap<String, String>,
    /// Declared egress upstreams (`host:port`) the node reaches through sealnode; none for the
    /// engine.
    pub egress: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Root {
    /// Host system paths bound read-only (the rest of the root is a private tmpfs).
    pub system_ro: usize,
    /// The model dir: "ro", "rw", or none.
    pub models: Option<String>,
    /// The scratch dir's size cap, MiB (none: uncapped, the host dir's filesystem).
    pub scratch_max_mb: Option<u64>,
    pub credential: bool,
    /// The config's read-only binds (`ro_binds`).
    pub ro_binds: usize,
    /// Device nodes in the role's /dev.
    pub devices: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LandlockSeal {
    /// The policy's minimum Landlock ABI (the kernel has at least this).
    pub abi: u8,
    pub fs_rules: usize,
    /// TCP ports the role may bind / connect to; none: that right is not restricted.
    pub tcp_bind: Option<Vec<u16>>,
    pub tcp_connect: Option<Vec<u16>>,
    pub scopes: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeccompSeal {
    pub policy: String,
    /// Syscalls the allowlist names, and how many of them only with argument checks.
    pub syscalls: usize,
    pub conditional: usize,
    /// What any other syscall gets (the policy's mismatch action).
    pub default: String,
    /// `log_refused_syscalls`: refusals are answered the same and logged.
    pub logged: bool,
    pub instructions: usize,
}

/// The role's sandbox as `plan` (built for `cfg`, by `inv`) holds it; `cgroup`: its limits
/// in force.
pub fn role(cfg: &Config, plan: &Plan, cgroup: BTreeMap<String, String>) -> RoleSeal {
    let r = cfg.role(plan.role);
    let user = if plan.rootful {
        // A name as configured (a numeric `uid:gid` says nothing the ids do not).
        cfg.cell
            .rootful
            .as_ref()
            .map(|u| match plan.role {
                Role::Engine => u.engine.clone(),
                Role::Node => u.node.clone(),
            })
            .filter(|u| !u.starts_with(|c: char| c.is_ascii_digit()))
    } else {
        // Looked up at load: this runs in the supervisor's loop at every start.
        cfg.loaded.as_ref().and_then(|l| l.launcher_user.clone())
    };
    let engine_port = cfg.engine.port.map(|p| format!("127.0.0.1:{p}"));
    let egress: Vec<String> = r.egress.iter().map(|e| format!("{}:{}", e.host, e.port)).collect();
    let net = match plan.role {
        Role::Engine => "loopback only (the node reaches its port through sealnode)".to_string(),
        Role::Node => {
            let mut held = vec![format!("{} forwarded to the engine", engine_port.as_deref().unwrap_or("no port"))];
            if !egress.is_empty() {
                held.push(format!("{} egress listener(s)", egress.len()));
            }
            format!("loopback + {}", held.join(", "))
        }
    };
    let inside = |c: &std::ffi::CString| {
        let p = c.to_string_lossy().into_owned();
        p.strip_prefix(NEWROOT).map(str::to_string).unwrap_or(p)
    };
    let mut system_ro = 0;
    let mut devices = Vec::new();
    let mut scratch_max_mb = None;
    for m in &plan.mounts {
        match m {
            Mount::Bind { src, dst, check, .. } => {
                let s = src.to_string_lossy();
                if SYSTEM_RO.contains(&s.as_ref()) {
                    system_ro += 1;
                } else if inside(dst).starts_with("/dev/") {
                    devices.push(inside(dst));
                }
                if let Check::Tmpfs(bytes) = check {
                    scratch_max_mb = Some(bytes >> 20);
                }
            }
            Mount::Symlink { dst, .. } if SYSTEM_RO.contains(&inside(dst).as_str()) => system_ro += 1,
            _ => {}
        }
    }
    if devices.is_empty() {
        devices = BASE_DEVICES.iter().map(|d| d.to_string()).collect();
    }
    let ll = &plan.landlock;
    use landlock::{AccessNet, Scope};
    let ports = |right: AccessNet, ports: &[u16]| ll.handled_net.contains(right).then(|| ports.to_vec());
    let mut scopes = Vec::new();
    if ll.scopes.contains(Scope::AbstractUnixSocket) {
        scopes.push("abstract_unix_socket".to_string());
    }
    if ll.scopes.contains(Scope::Signal) {
        scopes.push("signal".to_string());
    }
    let (syscalls, conditional, default) = seccomp_counts(cfg, plan.role);
    RoleSeal {
        user,
        uid: plan.ids.uid,
        gid: plan.ids.gid,
        mode: if plan.rootful { "rootful" } else { "rootless" }.to_string(),
        namespaces: NAMESPACES.iter().map(|n| n.to_string()).collect(),
        net,
        root: Root {
            system_ro,
            models: r.models.as_ref().map(|_| if r.models_writable { "rw" } else { "ro" }.to_string()),
            scratch_max_mb: scratch_max_mb.or(r.scratch_max_mb),
            credential: r.credential.is_some(),
            ro_binds: cfg.binds(plan.role).len(),
            devices,
        },
        landlock: LandlockSeal {
            abi: ll.abi,
            fs_rules: ll.fs.len(),
            tcp_bind: ports(AccessNet::BindTcp, &ll.bind),
            tcp_connect: ports(AccessNet::ConnectTcp, &ll.connect),
            scopes,
        },
        seccomp: SeccompSeal {
            policy: r.seccomp.display().to_string(),
            syscalls,
            conditional,
            default,
            logged: plan.refusal_log.is_some(),
            instructions: plan.seccomp.len(),
        },
        // Every sandbox of `run` has the credentials layer: all five capability sets empty,
        // no_new_privs set (Plan::layers; the preflight checks both from inside).
        capabilities: if plan.layers.credentials { "none" } else { "kept (matrix only)" }.to_string(),
        no_new_privs: plan.layers.credentials,
        rlimits: plan
            .rlimits
            .iter()
            .map(|(res, v)| {
                use nix::sys::resource::Resource as R;
                let name = match res {
                    R::RLIMIT_CORE => "core",
                    R::RLIMIT_NOFILE => "nofile",
                    R::RLIMIT_NPROC => "nproc",
                    R::RLIMIT_FSIZE => "fsize",
                    R::RLIMIT_MEMLOCK => "memlock",
                    _ => "other",
                };
                (name.to_string(), *v)
            })
            .collect(),
        cgroup,
        egress,
    }
}

/// The role's seccomp allowlist as loaded: syscalls named, those with argument checks, and the
/// action for any other.
fn seccomp_counts(cfg: &Config, role: Role) -> (usize, usize, String) {
    let Ok((sc, _)) = cfg.policy_files(role) else { return (0, 0, "?".into()) };
    let doc: Value = serde_json::from_slice(&sc.bytes).unwrap_or(Value::Null);
    let f = &doc[role.name()];
    let mut names: BTreeMap<&str, bool> = BTreeMap::new();
    for rule in f["filter"].as_array().map(Vec::as_slice).unwrap_or_default() {
        if let Some(n) = rule["syscall"].as_str() {
            *names.entry(n).or_default() |= rule.get("args").is_some();
        }
    }
    let default = match f.get("mismatch_action").or_else(|| f.get("default_action")) {
        Some(Value::Object(o)) if o.len() == 1 => {
            let (k, v) = o.iter().next().map(|(k, v)| (k.as_str(), v)).unwrap_or(("?", &Value::Null));
            match (k, v.as_i64()) {
                ("errno", Some(e)) => format!("errno {e} ({})", crate::proof::canary::errno_name(e as i32)),
                (k, _) => format!("{k} {v}"),
            }
        }
        Some(Value::String(s)) => s.clone(),
        _ => "?".into(),
    };
    (names.len(), names.values().filter(|c| **c).count(), default)
}

/// A preflight's refused attempts per layer (every layer named, zero included).
pub fn refused_by(report: &crate::proof::canary::RoleReport) -> BTreeMap<&'static str, usize> {
    let mut by: BTreeMap<&'static str, usize> = LAYERS.iter().map(|l| (l.name(), 0)).collect();
    for a in &report.attempts {
        if let Some(l) = a.refused_by {
            *by.entry(l.name()).or_default() += 1;
        }
    }
    by
}

/// The attempts the preflight makes in `role` under `cfg`.
pub fn planned_attempts(cfg: &Config, role: Role) -> usize {
    crate::proof::canary::SPECS.iter().filter(|s| s.applies(cfg, role)).count()
}

// ---- rendering: any JSON in, text out ----

use crate::os::escape::cell;

fn text(v: &Value) -> String {
    match v {
        Value::String(s) => cell(s),
        Value::Null => "?".into(),
        other => cell(&other.to_string()),
    }
}

fn bytes(b: u64) -> String {
    match b {
        b if b < 1024 => format!("{b} B"),
        b if b < 1 << 20 => format!("{} KiB", b >> 10),
        b if b < 1 << 30 => format!("{} MiB", b >> 20),
        b => format!("{:.1} GiB", b as f64 / (1u64 << 30) as f64),
    }
}

fn list(v: &Value, sep: &str) -> String {
    match v.as_array() {
        Some(a) if a.is_empty() => "none".into(),
        Some(a) => a.iter().map(text).collect::<Vec<_>>().join(sep),
        None => "?".into(),
    }
}

fn when(v: &Value) -> Option<String> {
    v.as_i64()
        .and_then(|t| chrono::DateTime::from_timestamp(t, 0))
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

/// The summary: `v["roles"]`, each with `role`, `sealed` (a [`RoleSeal`]) and `preflight`
/// (`attempts`, `refused`, `refused_by`, `ms`, `at`; or `planned`, when `check` shows what a
/// start would run), then `v["statement"]`. The status answer has this shape, and so does
/// `check --json`'s `sealed`.
pub fn render(v: &Value) -> String {
    let mut s = String::from("WHAT IS SEALED\n");
    for r in v["roles"].as_array().map(Vec::as_slice).unwrap_or_default() {
        role_lines(&mut s, r);
    }
    s.push_str(&format!("statement   {}\n", statement(&v["statement"])));
    s
}

fn role_lines(s: &mut String, r: &Value) {
    let name = text(&r["role"]);
    let x = &r["sealed"];
    if !x.is_object() {
        s.push_str(&format!("{name}: no plan to show (it did not build, or the role has not passed the gate yet)\n"));
        preflight(s, &r["preflight"]);
        return;
    }
    let user = x["user"].as_str().map(|u| format!(" ({})", cell(u))).unwrap_or_default();
    s.push_str(&format!("{name}: {}, uid {} gid {}{user}\n", text(&x["mode"]), text(&x["uid"]), text(&x["gid"])));
    s.push_str(&format!("  namespaces  {}; net: {}\n", list(&x["namespaces"], " "), text(&x["net"])));
    let root = &x["root"];
    let models = match root["models"].as_str() {
        Some("ro") => "; models read-only".to_string(),
        Some("rw") => "; models WRITABLE".to_string(),
        Some(o) => format!("; models {}", cell(o)),
        None => String::new(),
    };
    let scratch = match root["scratch_max_mb"].as_u64() {
        Some(mb) => format!("scratch capped at {}", bytes(mb.saturating_mul(1 << 20))),
        None => "scratch uncapped".into(),
    };
    let extra = match (root["credential"] == true, root["ro_binds"].as_u64().unwrap_or(0)) {
        (true, 0) => "; credential ro".to_string(),
        (true, n) => format!("; credential ro; {n} ro binds"),
        (false, 0) => String::new(),
        (false, n) => format!("; {n} ro binds"),
    };
    s.push_str(&format!(
        "  root        {} system paths read-only{models}; {scratch}{extra}; /dev: {}\n",
        text(&root["system_ro"]),
        list(&root["devices"], " ").replace("/dev/", "")
    ));
    let ll = &x["landlock"];
    let ports = |p: &Value| if p.is_null() { "any port".to_string() } else { list(p, ",") };
    s.push_str(&format!(
        "  landlock    ABI {}, {} path rules; TCP bind {}, connect {}; scopes {}\n",
        text(&ll["abi"]),
        text(&ll["fs_rules"]),
        ports(&ll["tcp_bind"]),
        ports(&ll["tcp_connect"]),
        list(&ll["scopes"], " ")
    ));
    let sc = &x["seccomp"];
    s.push_str(&format!(
        "  seccomp     {} syscalls allowed ({} with argument checks), others {}{}; {} insns; {}\n",
        text(&sc["syscalls"]),
        text(&sc["conditional"]),
        text(&sc["default"]),
        if sc["logged"] == true { " and logged" } else { "" },
        text(&sc["instructions"]),
        text(&sc["policy"])
    ));
    let caps = match x["capabilities"].as_str() {
        Some("none") => "no capabilities".to_string(),
        other => format!("CAPABILITIES {}", text(&other.map(Value::from).unwrap_or(Value::Null))),
    };
    let nnp = if x["no_new_privs"] == true { "no_new_privs" } else { "NO no_new_privs" };
    s.push_str(&format!("  privileges  {caps}, {nnp}\n"));
    let rl: Vec<String> = x["rlimits"]
        .as_object()
        .map(|o| {
            o.iter()
                .map(|(k, v)| match (k.as_str(), v.as_u64()) {
                    ("fsize" | "memlock", Some(b)) => format!("{} {}", cell(k), bytes(b)),
                    _ => format!("{} {}", cell(k), text(v)),
                })
                .collect()
        })
        .unwrap_or_default();
    s.push_str(&format!("  rlimits     {}\n", if rl.is_empty() { "?".into() } else { rl.join(", ") }));
    let cg: Vec<String> = x["cgroup"]
        .as_object()
        .map(|o| o.iter().map(|(k, v)| format!("{}={}", cell(k), text(v))).collect())
        .unwrap_or_default();
    s.push_str(&format!("  cgroup      {}\n", if cg.is_empty() { "none set".into() } else { cg.join(", ") }));
    s.push_str(&format!("  egress      {}\n", list(&x["egress"], ", ")));
    preflight(s, &r["preflight"]);
}

fn preflight(s: &mut String, p: &Value) {
    let line = if let Some(n) = p["planned"].as_u64() {
        format!("not run by `check`: its {n} attempts run at every start; `sealnode canary` runs them now")
    } else if p.is_object() {
        // Layers in their usual order, then any other key; a zero is left out.
        let by: Vec<String> = p["refused_by"]
            .as_object()
            .map(|o| {
                let known = LAYERS.iter().filter_map(|l| o.get_key_value(l.name()));
                let other = o.iter().filter(|(k, _)| !LAYERS.iter().any(|l| l.name() == k.as_str()));
                known
                    .chain(other)
                    .filter(|(_, n)| n.as_u64() != Some(0))
                    .map(|(k, n)| format!("{} {}", cell(k), text(n)))
                    .collect()
            })
            .unwrap_or_default();
        let escaped = match (p["attempts"].as_u64(), p["refused"].as_u64()) {
            (Some(a), Some(r)) if a > r => format!(", {} ESCAPED", a - r),
            (Some(_), Some(_)) => ", 0 escaped".into(),
            _ => String::new(),
        };
        let at = when(&p["at"]).map(|t| format!(" at {t}")).unwrap_or_default();
        let secs = p["ms"].as_f64().map(|ms| format!("; {:.2} s{at}", ms / 1000.0)).unwrap_or(at);
        format!(
            "{} attempts, {} refused ({}){escaped}{secs}",
            text(&p["attempts"]),
            text(&p["refused"]),
            if by.is_empty() { "?".into() } else { by.join(", ") }
        )
    } else {
        "not run yet".into()
    };
    s.push_str(&format!("  preflight   {line}\n"));
}

fn statement(st: &Value) -> String {
    let tpm = if st["tpm_quoted"] == true { "TPM-quoted" } else { "not TPM-quoted" };
    let why = st["why"].as_str().map(|w| format!(": {}", cell(w))).unwrap_or_default();
    match st["state"].as_str() {
        Some("published") => format!("published: signed, {tpm}"),
        Some("quoting") => "signed, waiting for the TPM's quote".into(),
        Some("missing") => format!("MISSING{why}"),
        Some("none") => format!("none, not signed{why}"),
        Some("planned") if st["signed"] == true => format!("signed at every start, {tpm}"),
        Some("planned") => "none, not signed: no attestation key (`sealnode attest init` makes one)".into(),
        Some(other) => cell(other),
        None => "?".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(role: &str) -> Value {
        serde_json::json!({
            "role": role,
            "sealed": {
                "user": "sealnode-engine", "uid": 990, "gid": 991, "mode": "rootful",
                "namespaces": NAMESPACES, "net": "loopback only",
                "root": {"system_ro": 12, "models": "ro", "scratch_max_mb": 512, "credential": false,
                         "ro_binds": 0, "devices": ["/dev/null", "/dev/zero"]},
                "landlock": {"abi": 6, "fs_rules": 14, "tcp_bind": [8080], "tcp_connect": null,
                             "scopes": ["abstract_unix_socket", "signal"]},
                "seccomp": {"policy": "/usr/share/sealnode/seccomp/engine.json", "syscalls": 92,
                            "conditional": 5, "default": "errno 38 (ENOSYS)", "logged": false,
                            "instructions": 301},
                "capabilities": "none", "no_new_privs": true,
                "rlimits": {"core": 0, "fsize": 1u64 << 30, "memlock": 65536, "nofile": 4096, "nproc": 512},
                "cgroup": {"memory.max": "4294967296", "pids.max": "256"},
                "egress": [],
            },
            "preflight": {"passed": true, "attempts": 90, "refused": 90, "ms": 1234,
                          "at": 1_700_000_000,
                          "refused_by": {"seccomp": 40, "landlock": 20, "namespaces": 25,
                                         "credentials": 5, "rlimits": 0, "launcher": 0, "host": 0}},
        })
    }

    /// Fixed input, exact lines: what an operator reads.
    #[test]
    fn the_summary_renders_each_layer_on_its_line() {
        let v = serde_json::json!({"roles": [sample("engine")],
            "statement": {"state": "published", "signed": true, "tpm_quoted": false}});
        let want = "\
WHAT IS SEALED
engine: rootful, uid 990 gid 991 (sealnode-engine)
  namespaces  user mount pid net ipc uts cgroup; net: loopback only
  root        12 system paths read-only; models read-only; scratch capped at 512 MiB; /dev: null zero
  landlock    ABI 6, 14 path rules; TCP bind 8080, connect any port; scopes abstract_unix_socket signal
  seccomp     92 syscalls allowed (5 with argument checks), others errno 38 (ENOSYS); 301 insns; /usr/share/sealnode/seccomp/engine.json
  privileges  no capabilities, no_new_privs
  rlimits     core 0, fsize 1.0 GiB, memlock 64 KiB, nofile 4096, nproc 512
  cgroup      memory.max=4294967296, pids.max=256
  egress      none
  preflight   90 attempts, 90 refused (seccomp 40, landlock 20, namespaces 25, credentials 5), 0 escaped; 1.23 s at 2023-11-14T22:13:20Z
statement   published: signed, not TPM-quoted
";
        assert_eq!(render(&v), want);
    }

    #[test]
    fn check_says_the_preflight_has_not_run() {
        let mut r = sample("node");
        r["preflight"] = serde_json::json!({"planned": 87});
        let v = serde_json::json!({"roles": [r], "statement": {"state": "planned", "signed": false}});
        let t = render(&v);
        assert!(t.contains("  preflight   not run by `check`: its 87 attempts run at every start; `sealnode canary` runs them now\n"), "{t}");
        assert!(
            t.ends_with("statement   none, not signed: no attestation key (`sealnode attest init` makes one)\n"),
            "{t}"
        );
    }

    /// A role name, a path or a user with control characters cannot forge a line or a column.
    #[test]
    fn values_are_escaped() {
        let mut r = sample("engine\nnode: rootless\x1b[2J\t");
        r["sealed"]["seccomp"]["policy"] = "/p\n  seccomp     0 syscalls".into();
        r["sealed"]["user"] = "u\r\u{202e}x".into();
        r["sealed"]["cgroup"] = serde_json::json!({"a\nb": "c\nd"});
        let v = serde_json::json!({"roles": [r], "statement": {"state": "missing", "why": "w\nstatement   published"}});
        let t = render(&v);
        assert!(
            !t.chars().any(|c| c != '\n' && (c.is_control() || crate::logging::log::invisible_or_reordering(c))),
            "{t:?}"
        );
        assert_eq!(t.lines().count(), 12, "{t}");
        assert_eq!(t.lines().filter(|l| l.starts_with("statement")).count(), 1, "{t}");
        assert!(t.contains("engine\\u{a}node: rootless\\u{1b}[2J\\u{9}: rootful"), "{t}");
    }

    /// Whatever the JSON, the renderer answers (an old supervisor, a role not yet admitted).
    #[test]
    fn any_json_renders() {
        for v in [
            serde_json::json!(null),
            serde_json::json!({"roles": [{"role": "engine"}], "statement": 3}),
            serde_json::json!({"roles": [{"sealed": {"root": 1, "rlimits": [1], "capabilities": 7}, "preflight": {"refused_by": []}}]}),
            serde_json::json!({"roles": [{"sealed": {"root": {"scratch_max_mb": u64::MAX}}, "preflight": {"attempts": 1, "refused": 5, "at": i64::MAX}}]}),
        ] {
            let t = render(&v);
            assert!(t.starts_with("WHAT IS SEALED\n") && t.ends_with('\n'), "{t}");
        }
    }
}
