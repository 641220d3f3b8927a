//! Seccomp policy: seccompiler JSON files under `seccomp/`, one filter per role.
//!
//! Loading lints the JSON for the pitfalls real escapes used (each check in [`lint`]) before
//! compiling it, so a weakened policy is refused rather than installed.

use std::collections::BTreeMap;
use std::path::Path;

use seccompiler::{BpfProgram, TargetArch};
use serde_json::Value;

use crate::error::{Error, Result};

/// The kernel refuses programs longer than this (BPF_MAXINSNS).
pub const MAX_INSNS: usize = 4096;

/// Any JSON value, deserialized once, refusing an object that names a key twice at any depth
/// (serde_json's own `Value` keeps the last, and seccompiler refuses the file: ambiguous).
struct Strict(Value);

impl<'de> serde::Deserialize<'de> for Strict {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> std::result::Result<Self, D::Error> {
        struct V;
        impl<'de> serde::de::Visitor<'de> for V {
            type Value = Strict;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON value")
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(self, mut m: A) -> std::result::Result<Self::Value, A::Error> {
                let mut map = serde_json::Map::new();
                while let Some(k) = m.next_key::<String>()? {
                    if map.contains_key(&k) {
                        return Err(serde::de::Error::custom(format!("duplicate key {k:?}")));
                    }
                    let Strict(v) = m.next_value()?;
                    map.insert(k, v);
                }
                Ok(Strict(Value::Object(map)))
            }
            fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut s: A) -> std::result::Result<Self::Value, A::Error> {
                let mut items = Vec::new();
                while let Some(Strict(v)) = s.next_element()? {
                    items.push(v);
                }
                Ok(Strict(Value::Array(items)))
            }
            fn visit_bool<E>(self, b: bool) -> std::result::Result<Self::Value, E> {
                Ok(Strict(Value::Bool(b)))
            }
            fn visit_i64<E>(self, n: i64) -> std::result::Result<Self::Value, E> {
                Ok(Strict(Value::from(n)))
            }
            fn visit_u64<E>(self, n: u64) -> std::result::Result<Self::Value, E> {
                Ok(Strict(Value::from(n)))
            }
            fn visit_f64<E>(self, n: f64) -> std::result::Result<Self::Value, E> {
                Ok(Strict(Value::from(n)))
            }
            fn visit_str<E>(self, s: &str) -> std::result::Result<Self::Value, E> {
                Ok(Strict(Value::String(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> std::result::Result<Self::Value, E> {
                Ok(Strict(Value::String(s)))
            }
            fn visit_unit<E>(self) -> std::result::Result<Self::Value, E> {
                Ok(Strict(Value::Null))
            }
        }
        d.deserialize_any(V)
    }
}

/// A policy file's JSON, parsed once for the lint and the compiler ([`Strict`]).
fn read(text: &str, file: &Path) -> Result<Value> {
    serde_json::from_str::<Strict>(text).map(|s| s.0).map_err(|e| Error::policy(file, format!("not valid JSON: {e}")))
}

/// Lint a seccompiler JSON document: allowlists only, every rule commented, no rule set that
/// mixes an unconditional and a conditional rule for one syscall (seccompiler would silently
/// keep only the conditional one).
pub fn lint(text: &str, file: &Path) -> Result<()> {
    lint_doc(&read(text, file)?, file)
}

/// [`lint`] of a document already read ([`read`]).
fn lint_doc(doc: &Value, file: &Path) -> Result<()> {
    let filters = doc.as_object().ok_or_else(|| Error::policy(file, "top level must be an object of named filters"))?;
    for (name, f) in filters {
        let err = |r: String| Error::policy(file, format!("filter {name:?}: {r}"));
        // Unknown keys are refused, as seccompiler does: a misspelt "Args" would otherwise
        // turn an argument-restricted rule into an unconditional allow.
        let known = |v: &Value, keys: &[&str], what: String| -> Result<()> {
            let obj = v.as_object().ok_or_else(|| err(format!("{what} must be an object")))?;
            match obj.keys().find(|k| !keys.contains(&k.as_str())) {
                Some(k) => Err(err(format!("{what}: unknown key {k:?} (known: {})", keys.join(", ")))),
                None => Ok(()),
            }
        };
        known(
            f,
            &["mismatch_action", "default_action", "match_action", "filter_action", "filter"],
            "the filter".into(),
        )?;
        for (a, b) in [("mismatch_action", "default_action"), ("match_action", "filter_action")] {
            if f.get(a).is_some() && f.get(b).is_some() {
                return Err(err(format!("both {a:?} and its alias {b:?} are set; keep one")));
            }
        }
        let mismatch = f.get("mismatch_action").or_else(|| f.get("default_action"));
        match mismatch {
            None => return Err(err("missing mismatch_action".into())),
            Some(Value::String(s)) if s == "allow" || s == "log" => {
                return Err(err(format!(
                    "mismatch_action {s:?} turns the allowlist into a denylist; use {{\"errno\": 38}}"
                )))
            }
            _ => {}
        }
        match f.get("match_action").or_else(|| f.get("filter_action")) {
            Some(Value::String(s)) if s == "allow" => {}
            _ => return Err(err("match_action must be \"allow\" (policies are allowlists)".into())),
        }
        let rules = f.get("filter").and_then(Value::as_array).ok_or_else(|| err("missing \"filter\" array".into()))?;
        let mut kinds: BTreeMap<&str, (bool, bool)> = BTreeMap::new();
        for (i, r) in rules.iter().enumerate() {
            known(r, &["syscall", "args", "comment"], format!("rule {i}"))?;
            let sc =
                r.get("syscall").and_then(Value::as_str).ok_or_else(|| err(format!("rule {i}: missing syscall")))?;
            match r.get("args") {
                None => {}
                Some(Value::Array(a)) if !a.is_empty() => {
                    for (j, c) in a.iter().enumerate() {
                        let what = format!("rule {i} ({sc}) args[{j}]");
                        known(c, &["index", "type", "op", "val", "comment"], what.clone())?;
                        if c.get("comment").is_some_and(|x| !x.is_string()) {
                            return Err(err(format!("{what}: comment must be a string")));
                        }
                        if let Some(Value::Object(op)) = c.get("op") {
                            if op.len() != 1 || !op.contains_key("masked_eq") {
                                return Err(err(format!("{what}: op object must be exactly {{\"masked_eq\": MASK}}")));
                            }
                        }
                    }
                }
                // Anything else would compile to an unconditional allow of the call.
                Some(_) => {
                    return Err(err(format!("rule {i} ({sc}): \"args\" must be a non-empty array of conditions")))
                }
            }
            if r.get("comment").and_then(Value::as_str).is_none_or(|c| c.trim().is_empty()) {
                return Err(err(format!("rule {i} ({sc}): every rule needs a \"comment\" saying why it is allowed")));
            }
            let e = kinds.entry(sc).or_default();
            if r.get("args").is_some() {
                e.1 = true;
            } else {
                e.0 = true;
            }
            if e.0 && e.1 {
                return Err(err(format!(
                    "{sc} has both an unconditional and a conditional rule; seccompiler keeps only the conditional one"
                )));
            }
        }
    }
    Ok(())
}

/// Read, lint and compile the filter named after `role` for `arch`.
pub fn compile_file(file: &Path, role: &str, arch: TargetArch) -> Result<BpfProgram> {
    let text = std::fs::read_to_string(file).map_err(|e| Error::policy(file, format!("cannot read: {e}")))?;
    compile_text(&text, file, role, arch)
}

/// Compile the filter for `role` from bytes sealnode already read (and checked), once per
/// distinct content: every later start with the same bytes reuses the same program.
pub fn compile_loaded(bytes: &[u8], sha256: &str, file: &Path, role: &str, arch: TargetArch) -> Result<BpfProgram> {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    /// (content sha256, role, architecture) -> the compiled program.
    type Cache = Mutex<HashMap<(String, String, String), BpfProgram>>;
    static CACHE: OnceLock<Cache> = OnceLock::new();
    let key = (sha256.to_string(), role.to_string(), format!("{arch:?}"));
    let cache = CACHE.get_or_init(|| Mutex::new(HashMap::new()));
    if let Some(p) = cache.lock().map_err(|_| Error::policy(file, "compile cache poisoned"))?.get(&key) {
        return Ok(p.clone());
    }
    let text = std::str::from_utf8(bytes).map_err(|e| Error::policy(file, format!("not UTF-8: {e}")))?;
    let prog = compile_text(text, file, role, arch)?;
    cache.lock().map_err(|_| Error::policy(file, "compile cache poisoned"))?.insert(key, prog.clone());
    Ok(prog)
}

fn for_arch(text: &str, file: &Path, arch: TargetArch) -> Result<String> {
    if matches!(arch, TargetArch::x86_64) {
        return Ok(text.to_string());
    }
    let mut doc: Value = serde_json::from_str(text).map_err(|e| Error::policy(file, format!("not valid JSON: {e}")))?;
    if let Some(filters) = doc.as_object_mut() {
        for f in filters.values_mut() {
            if let Some(rules) = f.get_mut("filter").and_then(Value::as_array_mut) {
                rules.retain(|r| {
                    !r.get("syscall").and_then(Value::as_str).is_some_and(|s| super::arch::X86_64_ONLY.contains(&s))
                });
            }
        }
    }
    Ok(doc.to_string())
}

/// Lint and compile with sealnode's binary-search compiler (see `bpf`).
pub fn compile_text(text: &str, file: &Path, role: &str, arch: TargetArch) -> Result<BpfProgram> {
    let doc = read(text, file)?;
    lint_doc(&doc, file)?;
    let prog = super::bpf::compile(&super::bpf::parse_doc(&doc, file, role, arch)?)?;
    if prog.len() >= MAX_INSNS {
        return Err(Error::policy(
            file,
            format!("filter {role:?} compiles to {} instructions; the kernel limit is {MAX_INSNS}", prog.len()),
        ));
    }
    Ok(prog)
}

/// The same policy compiled by seccompiler (its linear chain): the reference the tests
/// compare sealnode's compiler against, instruction decision by instruction decision.
pub fn compile_with_seccompiler(text: &str, file: &Path, role: &str, arch: TargetArch) -> Result<BpfProgram> {
    lint(text, file)?;
    let text = for_arch(text, file, arch)?;
    let mut map = seccompiler::compile_from_json(text.as_bytes(), arch)
        .map_err(|e| Error::policy(file, format!("does not compile for {arch:?}: {e}")))?;
    let prog = map.remove(role).ok_or_else(|| Error::policy(file, format!("has no filter named {role:?}")))?;
    if prog.len() >= MAX_INSNS {
        return Err(Error::policy(
            file,
            format!("filter {role:?} compiles to {} instructions; the kernel limit is {MAX_INSNS}", prog.len()),
        ));
    }
    Ok(prog)
}

/// The same program with every refusal handed to a listener (SECCOMP_RET_USER_NOTIF) instead
/// of failing in the kernel: the role's optional denial log (`log_refused_syscalls`). Returns
/// the program and the errno the listener must answer with (the policy's own: every refusal of
/// sealnode's compiled policies is one `errno` value). Allowed syscalls run exactly as before,
/// and the architecture check still kills. The program must allow read, write and execve
/// unconditionally: the role hands the listener over and execs after the filter is on.
pub fn notify_refusals(prog: &BpfProgram, arch: TargetArch) -> std::result::Result<(BpfProgram, i32), String> {
    const BPF_RET_K: u16 = 0x06;
    const RET_ERRNO: u32 = 0x0005_0000;
    let errnos: std::collections::BTreeSet<u32> =
        prog.iter().filter(|i| i.code == BPF_RET_K && i.k & 0xffff_0000 == RET_ERRNO).map(|i| i.k & 0xffff).collect();
    let errno = match errnos.iter().collect::<Vec<_>>()[..] {
        [e] => *e as i32,
        _ => return Err(format!("its refusals must be one errno action to be logged (found {errnos:?})")),
    };
    let audit = super::arch::audit_arch(arch);
    for name in ["read", "write", "execve"] {
        let nr = super::arch::syscall_nr(arch, name).ok_or_else(|| format!("no {name} on {arch:?}"))?;
        if super::bpf::interpret(prog, audit, nr, [0; 6]) != super::bpf::RET_ALLOW {
            return Err(format!("it must allow {name} unconditionally to hand the log's listener over"));
        }
    }
    let mut out = prog.clone();
    for i in out.iter_mut().filter(|i| i.code == BPF_RET_K && i.k & 0xffff_0000 == RET_ERRNO) {
        i.k = libc::SECCOMP_RET_USER_NOTIF;
    }
    Ok((out, errno))
}

/// Install the filter on the calling thread (sets no_new_privs first).
pub fn install(prog: &BpfProgram) -> std::result::Result<(), nix::errno::Errno> {
    seccompiler::apply_filter(prog).map_err(|e| match e {
        seccompiler::Error::Prctl(io) | seccompiler::Error::Seccomp(io) => {
            nix::errno::Errno::from_raw(io.raw_os_error().unwrap_or(libc::EINVAL))
        }
        _ => nix::errno::Errno::EINVAL,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Vec<(std::path::PathBuf, &'static str)> {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seccomp");
        ["engine.json", "engine-gpu.json", "engine-rocm.json", "engine-ollama.json", "node.json"]
            .iter()
            .map(|f| (root.join(f), if *f == "node.json" { "node" } else { "engine" }))
            .collect()
    }

    #[test]
    fn shipped_filters_compile_for_every_arch_under_the_limit() {
        for (file, role) in shipped() {
            for arch in [TargetArch::x86_64, TargetArch::aarch64] {
                let prog = compile_file(&file, role, arch).unwrap_or_else(|e| panic!("{e}"));
                assert!(prog.len() < MAX_INSNS, "{} {arch:?}: {}", file.display(), prog.len());
                assert!(prog.len() > 50, "suspiciously small filter");
            }
        }
    }

    /// engine-gpu.json (CUDA) and engine-rocm.json are engine.json, every rule unchanged
    /// (refitting the CPU filter must carry over), plus rules whose comment starts with "GPU:"
    /// or "ROCm (untested):" and says who needs them.
    #[test]
    fn gpu_engine_filters_are_the_cpu_engine_filter_plus_marked_gpu_rules() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("seccomp");
        let rules = |f: &str| -> Vec<serde_json::Value> {
            let v: serde_json::Value =
                serde_json::from_str(&std::fs::read_to_string(root.join(f)).expect("read")).expect("json");
            v["engine"]["filter"].as_array().expect("filter").clone()
        };
        let cpu = rules("engine.json");
        for (file, mark) in [("engine-gpu.json", "GPU: "), ("engine-rocm.json", "ROCm (untested): ")] {
            let gpu = rules(file);
            for r in &cpu {
                assert!(gpu.contains(r), "{file} lacks or changed the CPU rule {r}");
            }
            let extra: Vec<&serde_json::Value> = gpu.iter().filter(|r| !cpu.contains(r)).collect();
            assert!(!extra.is_empty());
            for r in extra {
                assert!(r["comment"].as_str().is_some_and(|c| c.starts_with(mark)), "{file}: unmarked rule {r}");
            }
        }
    }

    /// A misspelt key is refused at every level, never ignored: ignored, `"Args"` would make
    /// an argument-restricted rule an unconditional allow where seccompiler refuses the file.
    #[test]
    fn unknown_keys_are_refused_at_every_level() {
        let good = r#"{"engine": {"mismatch_action": {"errno": 38}, "match_action": "allow", "filter": [
            {"syscall": "ioctl", "comment": "c", "args": [{"index": 1, "type": "dword", "op": "eq", "val": 21505}]}]}}"#;
        lint(good, Path::new("p.json")).expect("good");
        for (from, to, key) in
            [("\"args\"", "\"Args\"", "Args"), ("\"op\"", "\"opp\"", "opp"), ("\"filter\":", "\"filters\":", "filters")]
        {
            let e = lint(&good.replacen(from, to, 1), Path::new("p.json")).expect_err(key).to_string();
            assert!(e.contains("p.json") && e.contains(&format!("unknown key {key:?}")), "{e}");
        }
    }

    #[test]
    fn shipped_filters_are_linted_allowlists() {
        for (file, role) in shipped() {
            let text = std::fs::read_to_string(&file).expect("read");
            lint(&text, &file).expect("lint");
            let doc: Value = serde_json::from_str(&text).expect("json");
            let f = &doc[role];
            assert_ne!(f["mismatch_action"], Value::String("allow".into()));
            assert_eq!(f["mismatch_action"]["errno"], 38, "denials answer ENOSYS (clone3 fallback)");
            let names: Vec<&str> =
                f["filter"].as_array().expect("rules").iter().filter_map(|r| r["syscall"].as_str()).collect();
            for forbidden in [
                "clone3",
                "unshare",
                "setns",
                "mount",
                "umount2",
                "pivot_root",
                "chroot",
                "ptrace",
                "bpf",
                "keyctl",
                "add_key",
                "request_key",
                "init_module",
                "finit_module",
                "delete_module",
                "kexec_load",
                "kexec_file_load",
                "perf_event_open",
                "userfaultfd",
                "io_uring_setup",
                "io_uring_enter",
                "io_uring_register",
                "fsopen",
                "fsmount",
                "fsconfig",
                "open_tree",
                "move_mount",
                "mount_setattr",
                "open_by_handle_at",
                "name_to_handle_at",
                "personality",
                "syslog",
                "iopl",
                "ioperm",
                "setuid",
                "setgid",
                "setgroups",
                "setresuid",
                "setresgid",
                "capset",
                "process_vm_readv",
                "process_vm_writev",
                "memfd_secret",
                "landlock_create_ruleset",
                "seccomp",
                "quotactl",
                "swapon",
                "reboot",
                "acct",
                "vhangup",
            ] {
                assert!(!names.contains(&forbidden), "{} allows {forbidden}", file.display());
            }
        }
    }

    /// The one parse the lint and the compiler share refuses a key named twice at any depth
    /// (serde_json keeps the last: a second "args" or "mismatch_action" would silently win),
    /// and otherwise reads exactly what serde_json reads.
    #[test]
    fn a_key_named_twice_is_refused_at_every_depth() {
        let rule = r#"{"syscall": "read", "comment": "c"}"#;
        for doc in [
            format!(r#"{{"r": {{"mismatch_action": {{"errno": 38}}, "match_action": "allow", "filter": [{rule}]}}, "r": {{}}}}"#),
            format!(r#"{{"r": {{"mismatch_action": {{"errno": 38}}, "mismatch_action": "allow", "match_action": "allow", "filter": [{rule}]}}}}"#),
            format!(r#"{{"r": {{"mismatch_action": {{"errno": 38, "errno": 1}}, "match_action": "allow", "filter": [{rule}]}}}}"#),
            r#"{"r": {"mismatch_action": {"errno": 38}, "match_action": "allow", "filter": [{"syscall": "read", "syscall": "ptrace", "comment": "c"}]}}"#.to_string(),
        ] {
            let e = compile_text(&doc, Path::new("x.json"), "r", TargetArch::x86_64).expect_err(&doc).to_string();
            assert!(e.contains("duplicate key"), "{doc}: {e}");
        }
        for (file, _) in shipped() {
            let text = std::fs::read_to_string(&file).expect("read");
            let plain: Value = serde_json::from_str(&text).expect("json");
            assert_eq!(read(&text, &file).expect("strict"), plain, "{}", file.display());
        }
    }

    #[test]
    fn lint_refuses_allow_mismatch() {
        let t = r#"{"r": {"mismatch_action": "allow", "match_action": "allow", "filter": []}}"#;
        assert!(lint(t, Path::new("x.json")).unwrap_err().to_string().contains("denylist"));
    }

    #[test]
    fn lint_refuses_mixed_rules() {
        let t = r#"{"r": {"mismatch_action": {"errno": 38}, "match_action": "allow", "filter": [
            {"syscall": "ioctl", "comment": "all"},
            {"syscall": "ioctl", "comment": "some", "args": [{"index": 1, "type": "dword", "op": "eq", "val": 1}]}]}}"#;
        assert!(lint(t, Path::new("x.json")).unwrap_err().to_string().contains("unconditional and a conditional"));
    }

    #[test]
    fn lint_refuses_uncommented_rules() {
        let t =
            r#"{"r": {"mismatch_action": {"errno": 38}, "match_action": "allow", "filter": [{"syscall": "read"}]}}"#;
        assert!(lint(t, Path::new("x.json")).unwrap_err().to_string().contains("comment"));
    }

    #[test]
    fn unknown_syscall_names_fail_on_every_arch() {
        let t = r#"{"r": {"mismatch_action": {"errno": 38}, "match_action": "allow", "filter": [{"syscall": "raed", "comment": "typo"}]}}"#;
        for arch in [TargetArch::x86_64, TargetArch::aarch64] {
            assert!(compile_text(t, Path::new("x.json"), "r", arch).is_err());
        }
    }

    #[test]
    fn missing_role_filter_is_an_error() {
        let t = r#"{"other": {"mismatch_action": {"errno": 38}, "match_action": "allow", "filter": [{"syscall": "read", "comment": "c"}]}}"#;
        assert!(compile_text(t, Path::new("x.json"), "node", TargetArch::x86_64)
            .unwrap_err()
            .to_string()
            .contains("no filter named"));
    }
}
