//! Proof of isolation: the canary battery, the layer matrix, preflight refusing a weakened
//! sandbox, receipts, and the control socket. Real sandboxes, as root and as uid 65534.

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;
use serde_json::Value;

fn canary(f: &Fixture, args: &[&str]) -> (Option<i32>, Value, String) {
    let cfg = f.config.display().to_string();
    let mut a = vec!["canary", "--config", cfg.as_str(), "--json"];
    a.extend_from_slice(args);
    let o = f.command(&a).output_within(COMMAND_LIMIT);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let v = serde_json::from_slice(&o.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}\n{err}", String::from_utf8_lossy(&o.stdout)));
    (o.status.code(), v, err)
}

/// Run the battery again with `--junit` and `--tap`, validate the XML against the JUnit schema CI
/// systems read (xmllint) and feed the TAP to `prove`; both must agree with the JSON report.
/// Returns prove's output.
fn check_ci_reports(f: &Fixture, extra: &[&str], json: &Value) -> Option<String> {
    let (Some(xmllint), Some(prove)) = (which("/usr/bin/xmllint"), which("/usr/bin/prove")) else {
        unavailable("ci-reports", "xmllint (libxml2-utils) and prove (perl) are needed to check the reports");
        return None;
    };
    let cfg = f.config.display().to_string();
    // The reports belong to whoever runs the canary (uid 65534 in rootless mode).
    let dir = f.p("reports");
    std::fs::create_dir_all(&dir).expect("reports dir");
    if f.mode == Mode::Rootless {
        std::os::unix::fs::chown(&dir, Some(NOBODY), Some(NOBODY)).expect("chown reports");
    }
    let (junit, tap) = (dir.join("canary.xml"), dir.join("canary.tap"));
    let mut a = vec!["canary", "--config", cfg.as_str()];
    a.extend_from_slice(extra);
    let (j, t) = (junit.display().to_string(), tap.display().to_string());
    a.extend_from_slice(&["--junit", j.as_str(), "--tap", t.as_str()]);
    let o = f.command(&a).output_within(COMMAND_LIMIT);
    let passed = json["passed"] == true;
    assert_eq!(o.status.code(), Some(if passed { 0 } else { 1 }), "{}", String::from_utf8_lossy(&o.stderr));
    // The human table still goes to stdout.
    assert!(String::from_utf8_lossy(&o.stdout).contains("canary: "), "no table");

    let xsd = repo().join("tests/fixtures/junit.xsd");
    let v = std::process::Command::new(xmllint)
        .arg("--noout")
        .arg("--schema")
        .arg(&xsd)
        .arg(&junit)
        .output_within(COMMAND_LIMIT);
    assert!(v.status.success(), "JUnit XML does not validate: {}", String::from_utf8_lossy(&v.stderr));
    let xml = std::fs::read_to_string(&junit).expect("junit");
    let attempts: usize =
        json["roles"].as_array().expect("roles").iter().map(|r| r["attempts"].as_array().map_or(0, Vec::len)).sum();
    let escapes: usize =
        json["roles"].as_array().expect("roles").iter().map(|r| r["succeeded"].as_u64().unwrap_or(0) as usize).sum();
    assert_eq!(xml.matches("<testcase ").count(), attempts, "one test case per attempt and role");
    assert_eq!(xml.matches("<failure ").count(), escapes, "one failure per escape");

    // prove reads the TAP as one test script's output (`--exec cat`).
    let p =
        std::process::Command::new(prove).args(["--exec", "cat", "--verbose"]).arg(&tap).output_within(COMMAND_LIMIT);
    let out = String::from_utf8_lossy(&p.stdout).into_owned();
    assert_eq!(p.status.success(), passed, "prove disagrees with the JSON report:\n{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("ok ")).count(), attempts - escapes, "{out}");
    assert_eq!(out.lines().filter(|l| l.starts_with("not ok ")).count(), escapes, "{out}");
    Some(out)
}

/// What each attempt must get, written down here rather than taken from the canary's own
/// errno→layer tables: the system call's errno as the sandbox returned it (ENOSYS is
/// sealnode's seccomp answer), or a signal. Both roles unless the role is named.
const SECCOMP_ENOSYS: &[&str] = &[
    "setuid_root",
    "setgid_root",
    "setgroups_root",
    "capset_raise",
    "ambient_raise",
    "securebits",
    "unshare_user",
    "clone_newuser",
    "clone3_newuser",
    "unshare_net",
    "unshare_mount",
    "unshare_pid",
    "setns_net",
    "unix_socket_in_view",
    "symlink_escape",
    "hardlink_escape",
    "mknod_device",
    "open_by_handle_at",
    "mount_tmpfs",
    "fsopen",
    "open_tree",
    "move_mount",
    "mount_setattr",
    "umount_mask",
    "chroot",
    "pivot_root",
    "bpf_map_create",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "keyctl_session",
    "add_key",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "personality",
    "syslog_read",
    "reboot",
    "swapon",
    "ptrace_parent",
    "process_vm_readv_parent",
    "pidfd_getfd_parent",
    "tiocsti",
    "tiocsti_high_bits",
    "tioclinux",
    "socket_raw",
    "socket_udp",
    "socket_packet",
    "socket_netlink",
    "socket_alg",
    "socket_vsock",
    "socket_pfkey",
    "socket_autoload",
    "socket_mptcp",
];
/// x86_64 only (docs/canary.md): legacy calls and the x32 ABI.
const SECCOMP_ENOSYS_X86_64: &[&str] = &["iopl", "ioperm", "x32_getpid"];
/// (attempt, role or "both", errno): refused before seccomp matters, by the view or Landlock.
const ERRNOS: &[(&str, &str, i32)] = &[
    ("read_host_shadow", "both", libc::ENOENT),
    ("list_root_home", "both", libc::ENOENT),
    ("read_config", "both", libc::ENOENT),
    ("read_attest_key", "both", libc::ENOENT),
    ("read_foreign_paths", "both", libc::ENOENT),
    ("write_usr", "both", libc::EROFS),
    ("write_etc", "both", libc::ENOENT),
    ("write_models", "engine", libc::EROFS),
    ("write_proc_sys", "both", libc::EACCES),
    ("sysrq_trigger", "both", libc::ENOENT),
    ("read_kcore", "both", libc::ENOENT),
    ("exec_from_scratch", "both", libc::EACCES),
    ("open_dev_mem", "both", libc::ENOENT),
    ("proc_parent_root", "both", libc::EACCES),
    ("signal_foreign_processes", "both", libc::ESRCH),
    ("raise_hard_rlimit", "both", libc::EPERM),
    // The engine's filter has no connect at all; the node's has connect but Landlock grants no
    // port of the host. Neither filter creates AF_UNIX sockets (only connected stream pairs).
    ("host_loopback_service", "engine", libc::ENOSYS),
    ("host_loopback_service", "node", libc::EACCES),
    ("host_abstract_socket", "both", libc::ENOSYS),
    ("engine_connect", "engine", libc::ENOSYS),
    ("engine_to_egress", "engine", libc::ENOSYS),
    ("engine_fastopen_egress", "engine", libc::ENOSYS),
    // The node's filter has no bind (the engine may listen in its own namespace: not run).
    ("bind_other_port", "node", libc::ENOSYS),
];
/// Killed by the filter's architecture check (SIGSYS), x86_64 only.
const SIGSYS_X86_64: &[&str] = &["int80_getpid"];
/// Facts checked without a system call that can fail: no errno, no signal.
const FACTS: &[&str] = &[
    "caps_all_zero",
    "no_new_privs",
    "uid_not_root",
    "interfaces_only_lo",
    "userns_own_ids_only",
    "see_foreign_processes",
    "core_dumps_off",
    "rlimits_finite",
    "fds_beyond_stdio",
    "unexpected_env",
    "proxy_env",
];

/// The attempts `role` must run, each with the errno (Some) or signal (Err) it must get, or
/// neither (a fact).
fn expected_outcomes(role: &str) -> std::collections::BTreeMap<&'static str, Option<Result<i32, i32>>> {
    let mut m = std::collections::BTreeMap::new();
    let x86 = cfg!(target_arch = "x86_64");
    if !x86 {
        unavailable("x86_64", "iopl, ioperm, int80_getpid and x32_getpid exist on x86_64 only");
    }
    for id in SECCOMP_ENOSYS.iter().chain(SECCOMP_ENOSYS_X86_64.iter().filter(|_| x86)) {
        m.insert(*id, Some(Ok(libc::ENOSYS)));
    }
    for (id, r, e) in ERRNOS {
        if *r == "both" || *r == role {
            m.insert(*id, Some(Ok(*e)));
        }
    }
    for id in SIGSYS_X86_64.iter().filter(|_| x86) {
        m.insert(*id, Some(Err(libc::SIGSYS)));
    }
    for id in FACTS {
        m.insert(*id, None);
    }
    m
}

#[test]
fn battery_refuses_every_attempt_with_the_expected_errno() {
    for mode in modes() {
        let f = Fixture::new(mode, "battery");
        let t = Instant::now();
        let (code, r, err) = canary(&f, &[]);
        let secs = t.elapsed().as_secs_f64();
        assert_eq!(code, Some(0), "{mode:?}: {err}\n{r}");
        assert_eq!(r["schema"], 1);
        assert_eq!(r["passed"], true);
        check_ci_reports(&f, &[], &r);
        let roles = r["roles"].as_array().expect("roles");
        let names: Vec<&str> = roles.iter().filter_map(|x| x["role"].as_str()).collect();
        assert_eq!(names, ["engine", "node"], "{mode:?}");
        for role in roles {
            let name = role["role"].as_str().expect("role");
            let attempts = role["attempts"].as_array().expect("attempts");
            let want = expected_outcomes(name);
            // Exactly the attempts written down above: none renamed, dropped or added unseen.
            let ids: std::collections::BTreeSet<&str> = attempts.iter().filter_map(|a| a["id"].as_str()).collect();
            let wanted: std::collections::BTreeSet<&str> = want.keys().copied().collect();
            assert_eq!(ids, wanted, "{mode:?} {name}: the battery's attempts differ from the test's list");
            assert_eq!(ids.len(), attempts.len(), "{mode:?} {name}: an attempt ran twice");
            for a in attempts {
                let id = a["id"].as_str().expect("id");
                let ctx = format!("{mode:?} {name} {id}: {a}");
                assert_eq!(a["outcome"], "refused", "{ctx}");
                match want[id] {
                    Some(Ok(e)) => {
                        assert_eq!(a["errno"], e, "{ctx}: expected {}", sealnode::proof::canary::errno_name(e));
                        assert!(a["signal"].is_null(), "{ctx}");
                    }
                    Some(Err(sig)) => assert_eq!(a["signal"], sig, "{ctx}: expected signal {sig}"),
                    None => assert!(a["errno"].is_null() && a["signal"].is_null(), "{ctx}: a fact has no errno"),
                }
            }
            assert_eq!(role["refused"], attempts.len(), "{mode:?} {name}: refused count");
            assert_eq!(role["succeeded"], 0, "{mode:?} {name}: succeeded count");
            let cats: std::collections::BTreeSet<&str> =
                attempts.iter().filter_map(|a| a["category"].as_str()).collect();
            for c in [
                "credentials",
                "namespaces",
                "filesystem",
                "kernel",
                "tty",
                "sockets",
                "network",
                "cross-role",
                "resources",
                "environment",
            ] {
                assert!(cats.contains(c), "{mode:?}: no {c} attempts");
            }
        }
        eprintln!("{mode:?}: battery for both roles in {secs:.2}s");
    }
}

/// Rows that cannot show two layers, with exactly the layers they do show here, written down
/// by the test (docs/canary.md explains each). A layer that stops doing its part fails the
/// test even for an exception.
const SINGLE_LAYER_ROWS: &[(&str, &[&str])] = &[
    ("caps_all_zero", &["credentials"]),
    ("uid_not_root", &[]),
    ("write_proc_sys", &["host"]),
    ("proc_parent_root", &["host"]),
    ("raise_hard_rlimit", &["host"]),
    ("io_uring_setup", &["seccomp"]),
    ("keyctl_session", &["seccomp"]),
    ("add_key", &["seccomp"]),
    ("personality", &["seccomp"]),
    ("tioclinux", &["seccomp"]),
    ("int80_getpid", &["seccomp"]),
    ("socket_udp", &["seccomp"]),
    ("socket_netlink", &["seccomp"]),
    ("socket_vsock", &["seccomp"]),
    ("interfaces_only_lo", &[]),
    ("userns_own_ids_only", &[]),
    ("see_foreign_processes", &[]),
    ("core_dumps_off", &[]),
    ("rlimits_finite", &[]),
    ("fds_beyond_stdio", &[]),
    ("unexpected_env", &[]),
    ("proxy_env", &[]),
];
/// Engine-only exceptions: none (bind_other_port, once one, runs in the node only).
const SINGLE_LAYER_ENGINE_ROWS: &[(&str, &[&str])] = &[];
/// Attempts whose target a kernel may lack entirely (a build option, a device, an ABI): only
/// these may be reported moot.
const MAY_BE_MOOT: &[&str] = &[
    "sysrq_trigger",
    "read_kcore",
    "open_dev_mem",
    "umount_mask",
    "init_module",
    "finit_module",
    "delete_module",
    "kexec_load",
    "kexec_file_load",
    "iopl",
    "ioperm",
    "x32_getpid",
    "socket_alg",
    "socket_pfkey",
    "socket_autoload",
];

/// The numbers docs/canary.md promises, per role: (stopped by two or more layers, by two of
/// sealnode's own), from its table in "Layer matrix".
fn documented_two_layer_counts(role: &str) -> (usize, usize) {
    let doc = std::fs::read_to_string(repo().join("docs/canary.md")).expect("doc");
    let section = doc.split("## Layer matrix").nth(1).expect("matrix section");
    let row = section
        .lines()
        .find(|l| l.starts_with(&format!("| {role} |")))
        .unwrap_or_else(|| panic!("docs/canary.md: no {role} row in the matrix table"));
    let cells: Vec<usize> = row.split('|').filter_map(|c| c.trim().parse().ok()).collect();
    assert_eq!(cells.len(), 4, "docs/canary.md: {row}");
    (cells[1], cells[2])
}

#[test]
fn matrix_shows_two_independent_layers() {
    for mode in modes() {
        // The engine's scratch capped: with no cell to hold its tmpfs, the matrix's sandboxes
        // get a fresh one, as `exec` does (found by review: they bound the host dir and
        // refused it as no tmpfs, ESTALE).
        let mut f = Fixture::new(mode, "matrix");
        f.engine_extra = "scratch_max_mb = 8".into();
        f.write_config();
        let (code, m, err) = canary(&f, &["--matrix"]);
        // The report says which cell failed (seen once in a full run, rootless, not again in 10).
        assert_eq!(code, Some(0), "{mode:?}: {err}\n{m}");
        // What an attempt runs writes nowhere the operator sees (#27 item 3).
        assert!(!err.contains("write error"), "{mode:?}: {err}");
        let rows = m["rows"].as_array().expect("rows");
        for role in ["engine", "node"] {
            let (doc_two, doc_own) = documented_two_layer_counts(role);
            let (mut two, mut own) = (0, 0);
            for r in rows.iter().filter(|r| r["role"] == role) {
                let id = r["id"].as_str().expect("id");
                let by: Vec<&str> =
                    r["stopped_by"].as_array().expect("stopped_by").iter().filter_map(Value::as_str).collect();
                let ctx = format!("{mode:?} {role} {id}: {r}");
                if r["moot_on_this_kernel"] == true {
                    assert!(MAY_BE_MOOT.contains(&id), "{ctx}: moot, but its target is no kernel option");
                    assert!(by.is_empty(), "{ctx}: a moot row credits no layer");
                    continue;
                }
                let single = SINGLE_LAYER_ROWS
                    .iter()
                    .chain(SINGLE_LAYER_ENGINE_ROWS.iter().filter(|_| role == "engine"))
                    .find(|(x, _)| *x == id);
                match single {
                    Some((_, layers)) => {
                        assert_eq!(&by, layers, "{ctx}: a documented exception changed");
                        assert!(!r["single_layer_reason"].is_null(), "{ctx}: no documented reason");
                    }
                    None => {
                        assert!(by.len() >= 2, "{ctx}: stopped by fewer than two layers");
                        two += 1;
                        own += usize::from(by.iter().filter(|l| **l != "host").count() >= 2);
                    }
                }
            }
            assert!(two >= doc_two, "{mode:?} {role}: {two} attempts shown stopped by two layers, docs say {doc_two}");
            assert!(own >= doc_own, "{mode:?} {role}: {own} stopped by two of sealnode's layers, docs say {doc_own}");
        }
        // The report's own verdict agrees with the test's.
        assert_eq!(m["violations"], serde_json::json!([]), "{mode:?}: {err}");
        // A few the design relies on, checked by name.
        let row_of = |id: &str, role: &str| {
            rows.iter().find(|r| r["id"] == id && r["role"] == role).unwrap_or_else(|| panic!("{id}"))
        };
        let row = |id: &str| row_of(id, "node");
        let stops_in = |id: &str, role: &str, l: &str| {
            row_of(id, role)["stopped_by"].as_array().expect("s").iter().any(|x| x == l)
        };
        let stops = |id: &str, l: &str| stops_in(id, "node", l);
        // Ways around Landlock's port rules: each closed by the filter and by the netns sysctls,
        // and never credited to the host (whose TCP Fast Open and MPTCP are on).
        let tfo = row_of("engine_fastopen_egress", "engine");
        assert!(
            stops_in("engine_fastopen_egress", "engine", "seccomp")
                && stops_in("engine_fastopen_egress", "engine", "namespaces")
                && !stops_in("engine_fastopen_egress", "engine", "host"),
            "{mode:?}: {tfo}"
        );
        // The engine's own network namespace holds no egress forwarder (#13): the namespaces
        // layer stops it reaching one, as seccomp and Landlock do.
        assert!(
            ["seccomp", "landlock", "namespaces"].iter().all(|l| stops_in("engine_to_egress", "engine", l)),
            "{mode:?}: {}",
            row_of("engine_to_egress", "engine")
        );
        assert!(
            stops("socket_mptcp", "seccomp") && stops("socket_mptcp", "namespaces"),
            "{mode:?}: {}",
            row("socket_mptcp")
        );
        assert!(
            stops("unshare_user", "seccomp") && stops("unshare_user", "namespaces"),
            "{mode:?}: {}",
            row("unshare_user")
        );
        assert!(stops("exec_from_scratch", "landlock") && stops("exec_from_scratch", "namespaces"), "{mode:?}");
        assert!(stops("write_etc", "landlock") && stops("write_etc", "namespaces"), "{mode:?}");
        assert!(stops("host_loopback_service", "namespaces") && stops("host_loopback_service", "landlock"), "{mode:?}");
    }
}

/// A path the test made on the host outside its fixture (a device node, a dir under root's
/// home), removed when dropped.
struct MadeOnHost(std::path::PathBuf);

impl Drop for MadeOnHost {
    fn drop(&mut self) {
        match std::fs::symlink_metadata(&self.0) {
            Ok(m) if m.is_dir() => drop(std::fs::remove_dir_all(&self.0)),
            _ => drop(std::fs::remove_file(&self.0)),
        }
    }
}

/// A dir made with `mode`, root's like the trees sealnode binds (binds must be root's and
/// writable by no one else).
fn made_dir(p: &std::path::Path, mode: u32) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::create_dir_all(p).expect("mkdir");
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A character device `/dev/TAG` with /dev/full's numbers, mode 0666, in place of a GPU's node
/// (as tests/devices.rs makes them).
fn made_device(tag: &str) -> MadeOnHost {
    let p = std::path::PathBuf::from(format!("/dev/{tag}"));
    mknod_char(&p, 0o666, 1, 7);
    MadeOnHost(p)
}

/// An example's `rlimits` entries (`nofile = 65536, ... }`), each lowered to what this
/// launcher's hard limit allows: a role's limit above it cannot be set inside the role's user
/// namespace (the units raise LimitNOFILE to 65536; a shell or CI job may have less).
fn within_hard_limits(list: &str) -> String {
    use nix::sys::resource::{getrlimit, Resource};
    let hard = |r: Resource, unit: u64| getrlimit(r).map(|(_, h)| h / unit).unwrap_or(u64::MAX);
    let (entries, tail) = list.split_once('}').expect("one-line rlimits");
    let entries: Vec<String> = entries
        .split(',')
        .filter_map(|e| {
            let (k, v) = e.split_once('=')?;
            let (k, v) = (k.trim(), v.trim().parse::<u64>().expect("a number"));
            let max = match k {
                "nofile" => hard(Resource::RLIMIT_NOFILE, 1),
                "nproc" => hard(Resource::RLIMIT_NPROC, 1),
                "fsize_mb" => hard(Resource::RLIMIT_FSIZE, 1 << 20),
                "memlock_kb" => hard(Resource::RLIMIT_MEMLOCK, 1 << 10),
                other => panic!("rlimits.{other}: not known to the test"),
            };
            Some(format!("{k} = {}", v.min(max)))
        })
        .collect();
    format!("{} }}{tail}", entries.join(", "))
}

/// Every config the project ships or shows, by name: the demo's two templates (as
/// scripts/demo fills them in) and each examples/*.toml.
fn shipped_configs() -> Vec<(String, String)> {
    let read = |p: std::path::PathBuf| std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut v: Vec<(String, String)> = ["sealnode.toml.in", "sealnode-llama.toml.in"]
        .iter()
        .map(|t| (format!("demo/{t}"), read(repo().join("examples/demo").join(t))))
        .collect();
    let mut examples: Vec<std::path::PathBuf> = std::fs::read_dir(repo().join("examples"))
        .expect("examples")
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "toml"))
        .collect();
    examples.sort();
    v.extend(examples.into_iter().map(|p| (p.file_name().expect("name").to_string_lossy().into_owned(), read(p))));
    v
}

/// `text` (a template's placeholders or an example's install paths) rewritten to this fixture,
/// the way an operator fills it in on this machine: the fixture's state, runtime, model,
/// scratch dirs, credential and policies; the role users of the test's mode; each bind's
/// source from this machine (the prepared Python when there is one, else an empty stand-in) at
/// the example's own path inside (`dst`); a stand-in node per device, and a CDI spec naming
/// one. `prefix` is where the demo's interpreter is bound inside (`@PYPREFIX@`). What the
/// test made outside the fixture is returned, to be removed.
fn on_this_machine(f: &Fixture, text: &str, prefix: &str, gw_port: u16) -> (String, Vec<MadeOnHost>) {
    let d = f.dir.display().to_string();
    let env = |k: &str| std::env::var(k).ok().filter(|p| std::path::Path::new(p).exists());
    let standin = |p: &str| {
        let s = f.p(&format!("host{p}"));
        made_dir(&s, 0o755);
        s.display().to_string()
    };
    let python = env("SEALNODE_TEST_PYTHON").unwrap_or_else(|| standin("/opt/python3.12"));
    let venv = env("SEALNODE_TEST_VENV").unwrap_or_else(|| standin("/opt/frutebox/venv"));
    let llama_bin = env("SEALNODE_TEST_LLAMA_SERVER")
        .and_then(|s| Some(std::path::Path::new(&s).parent()?.display().to_string()))
        .unwrap_or_else(|| standin("/opt/llama/bin"));
    let standin_scripts = f.p("standin");
    made_dir(&standin_scripts, 0o755);
    for s in ["standin-engine.py", "standin-gateway.py"] {
        std::fs::copy(repo().join("examples/demo").join(s), standin_scripts.join(s)).expect("copy");
    }
    // The AMD example's filter, which the fixture does not copy.
    std::fs::copy(repo().join("seccomp/engine-rocm.json"), f.p("policy/engine-rocm.json")).expect("copy policy");
    let rootful = match f.mode {
        Mode::Rootful => format!(
            "rootful = {{ engine = \"{}:{}\", node = \"{}:{}\" }}",
            ENGINE_IDS.0, ENGINE_IDS.1, NODE_IDS.0, NODE_IDS.1
        ),
        Mode::Rootless => String::new(),
    };
    let mut t = text.to_string();
    for (from, to) in [
        // The demo's placeholders (scripts/demo).
        ("@POLICY@/seccomp/", format!("{d}/policy/")),
        ("@POLICY@/landlock-rules/", format!("{d}/policy/")),
        ("@DEMO@/engine\"", format!("{d}/engine-scratch\"")),
        ("@DEMO@/node\"", format!("{d}/node-scratch\"")),
        ("@DEMO@", d.clone()),
        ("@VENV@", venv.clone()),
        ("@PYCOPY@", python.clone()),
        ("@PYPREFIX@", prefix.to_string()),
        ("@LLAMABIN@", llama_bin.clone()),
        ("@GWPORT@", gw_port.to_string()),
        // The examples' install paths (README, "Operator quick start").
        ("\"/usr/share/sealnode/seccomp/", format!("\"{d}/policy/")),
        ("\"/usr/share/sealnode/landlock-rules/", format!("\"{d}/policy/")),
        ("state_dir = \"/var/lib/sealnode\"", format!("state_dir = \"{d}/state\"")),
        ("runtime_dir = \"/run/sealnode\"", format!("runtime_dir = \"{d}/run\"")),
        ("\"/var/lib/sealnode/models\"", format!("\"{d}/models\"")),
        ("\"/var/lib/sealnode/ollama-models\"", format!("\"{d}/models\"")),
        ("\"/var/lib/sealnode/engine\"", format!("\"{d}/engine-scratch\"")),
        ("\"/var/lib/sealnode/node\"", format!("\"{d}/node-scratch\"")),
        ("\"/etc/sealnode/credential\"", format!("\"{d}/credential\"")),
        ("rootful = { engine = \"sealnode-engine\", node = \"sealnode-node\" }", rootful),
    ] {
        t = t.replace(from, &to);
    }
    // Each bind's source from this machine, shown at the example's own path.
    let mut out = String::new();
    let mut rest = t.as_str();
    while let Some(at) = rest.find("{ src = \"") {
        let (head, tail) = rest.split_at(at + "{ src = \"".len());
        let end = tail.find('"').expect("closing quote");
        let src = &tail[..end];
        let host = match src {
            s if [&d, &python, &venv, &llama_bin].iter().any(|m| s.starts_with(m.as_str())) => s.to_string(),
            "/opt/python3.12" => python.clone(),
            "/opt/frutebox/venv" => venv.clone(),
            s if s.starts_with("/sys/") && std::path::Path::new(s).exists() => s.to_string(),
            s => standin(s),
        };
        out.push_str(head);
        out.push_str(&host);
        out.push('"');
        if host != src && !tail[end + 1..].trim_start().starts_with(", dst") {
            out.push_str(&format!(", dst = \"{src}\""));
        }
        rest = &tail[end + 1..];
    }
    out.push_str(rest);
    // A stand-in node per device (the examples' GPUs), and a CDI spec naming one.
    let mut made = Vec::new();
    let mut lines = Vec::new();
    for line in out.lines() {
        if let Some(list) = line.strip_prefix("rlimits = { ") {
            lines.push(format!("rlimits = {{ {}", within_hard_limits(list)));
        } else if let Some(list) = line.strip_prefix("devices = [") {
            let n = list.matches('"').count() / 2;
            let nodes: Vec<String> = (0..n)
                .map(|i| {
                    let m = made_device(&format!("{}-{i}", f.dir.file_name().expect("n").to_string_lossy()));
                    let p = format!("\"{}\"", m.0.display());
                    made.push(m);
                    p
                })
                .collect();
            lines.push(format!("devices = [{}]", nodes.join(", ")));
        } else if line.starts_with("devices_from = { cdi = \"/etc/cdi/") {
            let m = made_device(&format!("{}-cdi", f.dir.file_name().expect("n").to_string_lossy()));
            made_dir(&f.p("cdi"), 0o755);
            let spec = f.p("cdi/gpu.yaml");
            std::fs::write(
                &spec,
                format!(
                    "cdiVersion: \"0.6.0\"\nkind: nvidia.com/gpu\ndevices:\n- name: \"0\"\n  containerEdits:\n    deviceNodes:\n    - path: {}\n      type: c\n      major: 1\n      minor: 7\n",
                    m.0.display()
                ),
            )
            .expect("write the CDI spec");
            made.push(m);
            let (_, after) = line.split_once("\", devices").expect("cdi line");
            lines.push(format!("devices_from = {{ cdi = \"{}\", devices{after}", spec.display()));
        } else {
            lines.push(line.to_string());
        }
    }
    (lines.join("\n") + "\n", made)
}

/// #27 item 3: `canary --matrix` failed on the demo's own config (exit 125, "landlock: node
/// role: rule for <the interpreter's prefix under root's home>: EACCES"): without namespaces
/// the Landlock column resolved each rule at its inside path on the host, as the role's uid,
/// and a bind's `dst` under root's 0700 home cannot be searched. And every run printed
/// "sealnode: write error: Bad file descriptor" from an attempt run with its stdout closed.
/// Every shipped and example config, on this machine's paths, in both modes: exit 0, no noise,
/// no violation.
#[test]
fn the_matrix_runs_on_every_example_config() {
    let configs = shipped_configs();
    let names: Vec<&str> = configs.iter().map(|c| c.0.as_str()).collect();
    assert!(
        names.len() >= 7 && names.contains(&"llamacpp.toml"),
        "the demo's templates and examples/*.toml: {names:?}"
    );
    if !is_root() {
        return unavailable("rootful", "the test makes stand-in device nodes and a dir under root's home");
    }
    for (i, mode) in modes().into_iter().enumerate() {
        // An interpreter prefix under root's home (0700), where pyenv installs it and where a
        // config binds the interpreter with `dst` (its RUNPATH names it): the stand-in demo's
        // always; the real-engine demo's as scripts/demo fills it in on this machine.
        let home = std::path::PathBuf::from(format!("/root/.sealnode-it-{}-{mode:?}", std::process::id()));
        made_dir(&home.join("versions/3.12"), 0o755);
        let _home = MadeOnHost(home.clone());
        let under_root_home = home.join("versions/3.12").display().to_string();
        let prepared = std::env::var("SEALNODE_TEST_PYTHON_PREFIX").unwrap_or_else(|_| under_root_home.clone());
        for (j, (name, text)) in configs.iter().enumerate() {
            let prefix = if name == "demo/sealnode.toml.in" { &under_root_home } else { &prepared };
            let f = Fixture::new(mode, &format!("mx{j}"));
            let gw_port = 20000 + (std::process::id() % 1000) as u16 * 20 + (i * 10 + j) as u16;
            let (config, _made) = on_this_machine(&f, text, prefix, gw_port);
            std::fs::write(&f.config, &config).expect("write the config");
            let ctx = format!("{mode:?} {name}");
            let cfg = f.config.display().to_string();
            let o = f.command(&["canary", "--config", &cfg, "--json", "--matrix"]).output_within(COMMAND_LIMIT);
            let err = String::from_utf8_lossy(&o.stderr).into_owned();
            let out = String::from_utf8_lossy(&o.stdout).into_owned();
            assert_eq!(o.status.code(), Some(0), "{ctx}: {err}\n{out}\n{config}");
            let m: Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{ctx}: {e}: {out}"));
            assert!(!err.contains("write error"), "{ctx}: noise on stderr: {err}");
            assert_eq!(m["violations"], serde_json::json!([]), "{ctx}: {err}");
            let rows = m["rows"].as_array().expect("rows");
            for role in ["engine", "node"] {
                assert!(rows.iter().any(|r| r["role"] == role), "{ctx}: no {role} rows");
            }
        }
    }
}

/// A copy of a policy file, edited, owned by root and referenced by the config.
fn weaken(f: &mut Fixture, file: &str, edit: impl Fn(String) -> String) {
    let p = f.p(&format!("policy/{file}"));
    let text = std::fs::read_to_string(&p).expect("policy");
    std::fs::write(&p, edit(text)).expect("write policy");
}

#[test]
fn a_weakened_sandbox_fails_the_canary_and_run_refuses_to_start() {
    for mode in modes() {
        // 1. The node's seccomp filter allows io_uring.
        let mut f = Fixture::new(mode, "weak-seccomp");
        weaken(&mut f, "node.json", |t| {
            t.replacen(
                "\"filter\": [",
                "\"filter\": [\n   {\"syscall\": \"io_uring_setup\", \"comment\": \"weakened on purpose\"},",
                1,
            )
        });
        let (code, r, _) = canary(&f, &["--role", "node"]);
        assert_eq!(code, Some(1), "{mode:?}: {r}");
        let io = r["roles"][0]["attempts"]
            .as_array()
            .expect("a")
            .iter()
            .find(|a| a["id"] == "io_uring_setup")
            .cloned()
            .expect("io");
        assert_eq!(io["outcome"], "succeeded", "{mode:?}: {io}");
        if let Some(out) = check_ci_reports(&f, &["--role", "node"], &r) {
            let line = out.lines().find(|l| l.starts_with("not ok ")).expect("a failing test");
            assert!(line.contains("node/io_uring_setup"), "{mode:?}: {out}");
        }
        f.node_cmd = "[\"/bin/sh\", \"-c\", \"echo node-up; exec sleep 100\"]".into();
        f.write_config();
        let cfg = f.config.display().to_string();
        let o = f.command(&["run", "--config", &cfg]).output_within(COMMAND_LIMIT);
        let err = String::from_utf8_lossy(&o.stderr);
        // 3: the preflight failed (docs/operator-guide.md, "Exit status").
        assert_eq!(o.status.code(), Some(3), "{mode:?}: {err}");
        assert!(err.contains("io_uring_setup") && err.contains("refusing to start"), "{mode:?}: {err}");
        assert!(!String::from_utf8_lossy(&o.stdout).contains("node-up"), "{mode:?}: a role started anyway");
        assert!(!f.p("state/receipt.json").exists(), "{mode:?}: a receipt for a failed preflight");

        // 2. The engine's rules granting write on its model dir: the read-only bind still
        //    refuses it (EROFS), so only with models_writable can the engine write there, and
        //    then the operator has granted it: not attempted, the battery passes, and the
        //    statements say the model digests do not bind (docs/canary.md; found by review:
        //    such a config could never start).
        let mut f = Fixture::new(mode, "weak-models");
        weaken(&mut f, "engine.toml", |t| {
            t.replace(
                "paths = [\"@models\"]\naccess = [\"read\"]",
                "paths = [\"@models\"]\naccess = [\"read\", \"write\"]",
            )
        });
        let (code, r, _) = canary(&f, &["--role", "engine"]);
        assert_eq!(code, Some(0), "{mode:?}: {r}");
        let wm = r["roles"][0]["attempts"]
            .as_array()
            .expect("a")
            .iter()
            .find(|a| a["id"] == "write_models")
            .cloned()
            .expect("wm");
        assert_eq!(
            (&wm["outcome"], &wm["errno_name"]),
            (&serde_json::json!("refused"), &serde_json::json!("EROFS")),
            "{mode:?}: {wm}"
        );
        // A writable model dir must belong to the engine's user (validation insists).
        let owner = if mode == Mode::Rootful { ENGINE_IDS.0 } else { NOBODY };
        std::os::unix::fs::chown(f.p("models"), Some(owner), Some(owner)).expect("chown");
        f.engine_extra = "models_writable = true".into();
        f.write_config();
        let (code, r, _) = canary(&f, &["--role", "engine"]);
        assert_eq!(code, Some(0), "{mode:?}: {r}");
        let ids: Vec<&str> =
            r["roles"][0]["attempts"].as_array().expect("a").iter().filter_map(|a| a["id"].as_str()).collect();
        assert!(!ids.contains(&"write_models") && ids.contains(&"write_usr"), "{mode:?}: {ids:?}");
    }
}

struct Run {
    child: Child,
    out: std::sync::mpsc::Receiver<String>,
}

impl Drop for Run {
    /// A test that fails while sealnode runs must not leave it running (its roles die with it).
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

fn start_run(f: &Fixture) -> Run {
    let cfg = f.config.display().to_string();
    let mut child = f
        .command(&["run", "--config", &cfg])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("run");
    let stdout = child.stdout.take().expect("stdout");
    let (tx, out) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    Run { child, out }
}

impl Run {
    fn wait_line(&self, want: &str) {
        let deadline = Instant::now() + Duration::from_secs(40);
        while Instant::now() < deadline {
            if let Ok(l) = self.out.recv_timeout(Duration::from_millis(200)) {
                if l.contains(want) {
                    return;
                }
            }
        }
        panic!("no {want:?} within 40s");
    }
    fn stop(mut self) -> Option<i32> {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(self.child.id() as i32),
            nix::sys::signal::Signal::SIGTERM,
        );
        // The cells here stop within their 10 s grace period; a hang fails the test.
        let stopped = wait_until(Duration::from_secs(60), || matches!(self.child.try_wait(), Ok(Some(_))));
        if !stopped {
            let _ = self.child.kill();
            panic!("sealnode run did not stop within 60 s of SIGTERM");
        }
        self.child.wait().ok().and_then(|s| s.code())
    }
}

/// A cell whose engine is busybox httpd, from a copy of busybox the test owns (so a test can
/// change the engine's program), bound at /opt/engine.
fn cell_fixture(mode: Mode, name: &str) -> Fixture {
    let mut f = Fixture::new(mode, name);
    std::fs::create_dir(f.p("engine-bin")).expect("engine-bin");
    std::fs::copy("/usr/bin/busybox", f.p("engine-bin/busybox")).expect("copy busybox");
    f.engine_cmd =
        "[\"/opt/engine/busybox\", \"httpd\", \"-f\", \"-p\", \"127.0.0.1:18080\", \"-h\", \"/models\"]".into();
    f.engine_extra = format!("ro_binds = [{{ src = \"{}\", dst = \"/opt/engine\" }}]", f.p("engine-bin").display());
    f.node_cmd = "[\"/bin/sh\", \"-c\", \"echo x > /scratch/started-$(cat /proc/sys/kernel/random/uuid); echo node-up; exec sleep 1000\"]".into();
    f.write_config();
    f
}

fn receipt(f: &Fixture) -> Value {
    serde_json::from_slice(&std::fs::read(f.p("state/receipt.json")).expect("receipt")).expect("json")
}

#[test]
fn receipts_are_atomic_valid_and_strictly_increasing() {
    for mode in modes() {
        let mut f = cell_fixture(mode, "receipt");
        let run = start_run(&f);
        run.wait_line("node-up");
        let r1 = receipt(&f);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(f.p("state/receipt.json")).expect("md").mode() & 0o777, 0o640);
        assert_eq!(r1["schema"], 3);
        assert!(r1.get("container").is_none(), "no container on this host: {}", r1);
        assert_eq!(r1["canary"]["passed"], true);
        assert_eq!(r1["kernel"]["userns_mode"], if mode == Mode::Rootful { "rootful" } else { "rootless" });
        // Each digest is of what it names: the compiled filter as `seccomp-bpf` writes it (the
        // BPF the kernel runs), the Landlock rules file's bytes.
        for (role, policy) in [("engine", "engine"), ("node", "node")] {
            let json = f.p(&format!("policy/{policy}.json")).display().to_string();
            let bpf = f.command(&["seccomp-bpf", &json, "--role", role]).output_within(COMMAND_LIMIT);
            assert_eq!(bpf.status.code(), Some(0), "{mode:?}: {}", String::from_utf8_lossy(&bpf.stderr));
            use sha2::Digest;
            let want = hex::encode(sha2::Sha256::digest(&bpf.stdout));
            assert_eq!(r1["roles"][role]["seccomp_program_sha256"], want.as_str(), "{mode:?} {role}");
            let rules = sha256_file(&f.p(&format!("policy/{policy}.toml")).display().to_string());
            assert_eq!(r1["roles"][role]["landlock_rules_sha256"], rules.as_str(), "{mode:?} {role}");
        }
        assert_eq!(
            r1["roles"]["engine"]["program_sha256"].as_str().expect("program"),
            sha256_file(&f.p("engine-bin/busybox").display().to_string())
        );
        // No temp files left behind.
        let names: Vec<String> = std::fs::read_dir(f.p("state"))
            .expect("state")
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        assert!(names.iter().all(|n| !n.starts_with('.')), "{mode:?}: leftovers {names:?}");
        // verify-receipt matches now...
        let cfg = f.config.display().to_string();
        let v = f.command(&["verify-receipt", "--config", &cfg]).output_within(COMMAND_LIMIT);
        assert_eq!(v.status.code(), Some(0), "{mode:?}: {}", String::from_utf8_lossy(&v.stdout));
        // ...a SIGHUP restart writes a higher generation...
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(run.child.id() as i32), nix::sys::signal::Signal::SIGHUP)
            .expect("hup");
        run.wait_line("node-up");
        let g1 = r1["generation"].as_u64().expect("g");
        let g2 = receipt(&f)["generation"].as_u64().expect("g");
        assert!(g2 > g1, "{mode:?}: {g1} -> {g2}");
        assert_eq!(run.stop(), Some(0));
        // ...so does the next start, even if the counter file is lost...
        std::fs::remove_file(f.p("state/generation")).expect("rm counter");
        let run = start_run(&f);
        run.wait_line("node-up");
        let g3 = receipt(&f)["generation"].as_u64().expect("g");
        assert!(g3 > g2, "{mode:?}: {g2} -> {g3}");
        assert_eq!(run.stop(), Some(0));
        // ...and whatever changed since is named: the config, each policy, the engine's
        // program, sealnode's own binary. Each is changed alone, checked, and put back.
        let verify = |f: &Fixture| {
            // Just rewritten, the binary may still be open for writing in a child another
            // test thread forked (until its exec closes it): ETXTBSY, retried.
            for _ in 0..50 {
                match f.command(&["verify-receipt", "--config", &cfg]).try_output_within(COMMAND_LIMIT) {
                    Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) => {}
                    Err(e) => panic!("{mode:?}: verify-receipt: {e}"),
                    Ok(v) if String::from_utf8_lossy(&v.stderr).contains("Text file busy") => {}
                    Ok(v) => return (v.status.code(), String::from_utf8_lossy(&v.stdout).into_owned()),
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            panic!("{mode:?}: verify-receipt kept failing with ETXTBSY");
        };
        assert_eq!(verify(&f).0, Some(0), "{mode:?}: nothing changed yet");
        let changes: [(&str, std::path::PathBuf, &str); 4] = [
            ("config sha256", f.config.clone(), "\n# changed\n"),
            ("node landlock rules sha256", f.p("policy/node.toml"), "\n# changed\n"),
            ("engine program sha256", f.p("engine-bin/busybox"), "appended"),
            ("sealnode binary sha256", f.bin.clone(), "appended"),
        ];
        for (what, file, append) in changes {
            let before = std::fs::read(&file).expect("read");
            if file == f.bin {
                // A hard link to cargo's binary: replace it with a changed copy, never edit it.
                std::fs::remove_file(&file).expect("unlink");
            }
            let mut changed = before.clone();
            changed.extend_from_slice(append.as_bytes());
            std::fs::write(&file, &changed).expect("change");
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o755)).expect("chmod");
            let (code, out) = verify(&f);
            assert_eq!(code, Some(1), "{mode:?}: {what} changed, verify-receipt: {out}");
            assert!(out.contains(what), "{mode:?}: {what} not named: {out}");
            assert_eq!(out.matches(": receipt ").count(), 1, "{mode:?}: only {what} changed: {out}");
            std::fs::write(&file, &before).expect("restore");
            assert_eq!(verify(&f).0, Some(0), "{mode:?}: {what} restored");
        }
        // The seccomp policy: a comment changes nothing the kernel runs; one more allowed
        // system call changes the compiled program.
        weaken(&mut f, "engine.json", |t| {
            t.replacen(
                "\"filter\": [",
                "\"filter\": [\n   {\"syscall\": \"io_uring_setup\", \"comment\": \"weakened\"},",
                1,
            )
        });
        let (code, out) = verify(&f);
        assert_eq!(code, Some(1), "{mode:?}: {out}");
        assert!(out.contains("engine seccomp program sha256"), "{mode:?}: {out}");
    }
}

fn sha256_file(p: &str) -> String {
    use sha2::{Digest, Sha256};
    hex::encode(Sha256::digest(std::fs::read(p).expect("read")))
}

/// Send raw bytes to the control socket as the test process; return the response line.
fn raw_request(f: &Fixture, bytes: &[u8]) -> Value {
    let line = control_request(&f.p("run/control.sock"), bytes);
    serde_json::from_str(&line).unwrap_or_else(|e| panic!("{e}: {line:?}"))
}

fn ctl(f: &Fixture, cmd: &str) -> (Option<i32>, Value) {
    let cfg = f.config.display().to_string();
    let mut args = vec!["ctl", "--config", &cfg, cmd];
    if cmd == "status" || cmd == "recycle" {
        args.push("--json");
    }
    let o = f.command(&args).output_within(COMMAND_LIMIT);
    (o.status.code(), serde_json::from_slice(&o.stdout).unwrap_or(Value::Null))
}

#[test]
fn control_socket_checks_peers_and_requests_and_recycles() {
    if !is_root() {
        return unavailable("rootful", "the test connects as a uid other than the launcher's");
    }
    for mode in modes() {
        let mut f = cell_fixture(mode, "control");
        // The node ignores SIGTERM (SIG_IGN survives exec), so each stop, and so each recycle,
        // lasts the 3 s grace period: a second recycle sent as soon as status shows the first
        // (a ctl process: tens of ms) arrives while it is surely in progress.
        f.node_cmd = f.node_cmd.replacen("\"-c\", \"", "\"-c\", \"trap '' TERM; ", 1);
        f.cell_extra = "stop_timeout_s = 3".into();
        f.write_config();
        let run = start_run(&f);
        run.wait_line("node-up");
        // The launcher's own uid (the default allowlist) gets a status.
        let (code, st) = ctl(&f, "status");
        assert_eq!(code, Some(0), "{mode:?}: {st}");
        assert_eq!(st["roles"][0]["state"], "running");
        assert!(
            st["roles"][1]["pid"].as_i64().is_some() && st["egress"].is_array() && st["receipt"]["generation"].is_u64(),
            "{st}"
        );
        let g1 = st["receipt"]["generation"].as_u64().expect("g");
        match mode {
            // Rootful: the launcher is root; uid 65534 is not on the list.
            Mode::Rootful => {
                let as_65534 = |extra: &[&str]| {
                    std::process::Command::new("/usr/bin/setpriv")
                        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
                        .arg(&f.bin)
                        .args(["ctl", "--config", &f.config.display().to_string(), "status"])
                        .args(extra)
                        .output_within(COMMAND_LIMIT)
                };
                let o = as_65534(&["--json"]);
                let v: Value = serde_json::from_slice(&o.stdout).unwrap_or(Value::Null);
                assert_eq!(o.status.code(), Some(1));
                assert_eq!(v["error"], "uid 65534 is not allowed", "{v}");
                // Without --json: the refusal in words on stderr, nothing on stdout.
                let o = as_65534(&[]);
                let err = String::from_utf8_lossy(&o.stderr);
                assert_eq!((o.status.code(), o.stdout.is_empty()), (Some(1), true), "{err}");
                assert!(err.contains("ctl status: uid 65534 is not allowed"), "{err}");
            }
            // Rootless: the launcher is 65534; root (this test) is not on the list.
            Mode::Rootless => {
                let v = raw_request(&f, b"{\"cmd\":\"status\"}\n");
                assert_eq!(v["error"], "uid 0 is not allowed", "{v}");
            }
        }
        if mode == Mode::Rootful {
            // Bounded, strict requests (as the allowed uid, root).
            assert!(raw_request(&f, &[b'a'; 5000]).to_string().contains("too large"));
            assert!(raw_request(&f, b"{\"cmd\":\"status\"\n").to_string().contains("malformed"));
            assert!(raw_request(&f, b"{\"cmd\":\"reboot\"}\n").to_string().contains("unknown command"));
            assert!(raw_request(&f, b"{\"cmd\":\"status\",\"extra\":1}\n").to_string().contains("unknown field"));
        }
        let before: Vec<_> = std::fs::read_dir(f.p("node-scratch"))
            .expect("scratch")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(before.len(), 1, "{mode:?}: {before:?}");
        // Recycle: new receipt with a higher generation, scratch wiped, roles running again.
        let (code, rc) = ctl(&f, "recycle");
        assert_eq!(code, Some(0), "{mode:?}: {rc}");
        let g2 = rc["generation"].as_u64().expect("g");
        assert!(g2 > g1, "{mode:?}: {g1} -> {g2}");
        assert_eq!(receipt(&f)["generation"].as_u64(), Some(g2));
        run.wait_line("node-up");
        let after: Vec<_> = std::fs::read_dir(f.p("node-scratch"))
            .expect("scratch")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name())
            .collect();
        assert_eq!(after.len(), 1, "{mode:?}: {after:?}");
        assert_ne!(before, after, "{mode:?}: scratch was not wiped by the recycle");
        let (_, st) = ctl(&f, "status");
        assert_eq!(st["roles"][1]["state"], "running", "{st}");
        // Recycles are serialised: while one is in progress (seen through status: the node
        // stopping), a second is answered busy and never runs; the first completes.
        let cfg = f.config.display().to_string();
        let first = f
            .command(&["ctl", "--config", &cfg, "recycle", "--json"])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("first recycle");
        let busy_seen = wait_until(Duration::from_secs(30), || {
            let (_, st) = ctl(&f, "status");
            st["roles"][1]["state"] == "stopping"
        });
        assert!(busy_seen, "{mode:?}: the recycle never showed in status");
        let (code, second) = ctl(&f, "recycle");
        assert_eq!(code, Some(1), "{mode:?}: {second}");
        assert!(second["error"].as_str().is_some_and(|e| e.starts_with("busy: ")), "{mode:?}: {second}");
        let mut first = first;
        assert!(wait_until(Duration::from_secs(60), || matches!(first.try_wait(), Ok(Some(_)))), "{mode:?}: hung");
        let out = first.wait_with_output().expect("first recycle");
        let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
        assert_eq!(out.status.code(), Some(0), "{mode:?}: {v}");
        assert_eq!(v["generation"].as_u64(), Some(g2 + 1), "{mode:?}: exactly one more generation: {v}");
        run.wait_line("node-up");
        assert_eq!(run.stop(), Some(0));
    }
}

/// `cell.control_uids` replaces the default (the launcher's uid): the uids listed are answered,
/// the launcher itself no longer is.
#[test]
fn control_uids_replace_the_default_allowlist() {
    if !is_root() {
        return unavailable("rootful", "the test connects as several uids");
    }
    for mode in modes() {
        let mut f = cell_fixture(mode, "control-uids");
        // Rootful: only uid 4242 (the launcher, root, is not listed). Rootless: only root.
        let (listed, launcher) = match mode {
            Mode::Rootful => (4242u32, 0u32),
            Mode::Rootless => (0, NOBODY),
        };
        f.cell_extra = format!("control_uids = [{listed}]");
        f.write_config();
        let run = start_run(&f);
        run.wait_line("node-up");
        let as_uid = |uid: u32| -> Value {
            let o = std::process::Command::new("/usr/bin/setpriv")
                .args(["--reuid", &uid.to_string(), "--regid", &uid.to_string(), "--clear-groups", "--"])
                .arg(&f.bin)
                .args(["ctl", "--config", &f.config.display().to_string(), "status", "--json"])
                .output_within(COMMAND_LIMIT);
            serde_json::from_slice(&o.stdout).unwrap_or(Value::Null)
        };
        let allowed = if listed == 0 { raw_request(&f, b"{\"cmd\":\"status\"}\n") } else { as_uid(listed) };
        assert_eq!(allowed["ok"], true, "{mode:?}: uid {listed} is listed: {allowed}");
        let refused = if launcher == 0 { raw_request(&f, b"{\"cmd\":\"status\"}\n") } else { as_uid(launcher) };
        assert_eq!(refused["error"], format!("uid {launcher} is not allowed"), "{mode:?}: {refused}");
        assert_eq!(run.stop(), Some(0));
    }
}

/// Found by review: one silent control client blocked the event loop (egress, signals,
/// status) for the read timeout, and a slow one for hours. Requests are now read without
/// blocking, with a deadline for the whole line; at most MAX_CLIENTS are pending at once.
#[test]
fn a_silent_control_client_does_not_stall_the_supervisor() {
    if !is_root() {
        return unavailable("rootful", "the test connects to the control socket as root");
    }
    let f = cell_fixture(Mode::Rootful, "silent-ctl");
    let run = start_run(&f);
    run.wait_line("node-up");
    let connect = || {
        let s = UnixStream::connect(f.p("run/control.sock")).expect("connect");
        s.set_read_timeout(Some(READ_LIMIT)).expect("timeout");
        s
    };
    let silent: Vec<UnixStream> = (0..5).map(|_| connect()).collect();
    let mut slow = connect();
    let _ = slow.write_all(b"{");
    // Timed on the socket itself, not a ctl process's start: a loop that read its clients one
    // by one would answer only after each of the six had timed out (2 s each, docs/control.md;
    // 12 s in all), and even after the first (2 s).
    let t = Instant::now();
    let st = raw_request(&f, b"{\"cmd\":\"status\"}\n");
    let took = t.elapsed();
    assert_eq!(st["ok"], true, "{st}");
    assert!(took < Duration::from_secs(2), "status took {took:?} behind silent clients");
    // The silent ones are answered with a timeout error, not kept forever.
    for mut s in silent.into_iter().chain([slow]) {
        let mut line = String::new();
        BufReader::new(&mut s).read_line(&mut line).expect("read");
        assert!(line.contains("timed out"), "{line}");
    }
    // The connection limit (16, docs/control.md): 16 pending requests at once; one more is
    // answered busy at once, and once they are gone, requests are served again.
    let pending_since = Instant::now();
    let pending: Vec<UnixStream> = (0..16).map(|_| connect()).collect();
    let over = raw_request(&f, b"{\"cmd\":\"status\"}\n");
    assert_eq!(over["error"], "busy: too many control connections", "{over}");
    // ...and each of the 16 was accepted, not answered busy: nothing to read yet (the
    // 17th's answer came after they were all taken in; their timeout is 2 s away).
    for (i, s) in pending.iter().enumerate() {
        s.set_nonblocking(true).expect("nonblocking");
        let mut b = [0u8; 64];
        let r = std::io::Read::read(&mut &*s, &mut b);
        assert!(
            matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::WouldBlock),
            "pending client {i} was not kept waiting: {:?}",
            r.map(|n| String::from_utf8_lossy(&b[..n]).into_owned())
        );
    }
    // Only meaningful inside their 2 s: later, an answer would be their timeout's.
    assert!(
        pending_since.elapsed() < Duration::from_secs(2),
        "the pending clients were checked {:?} after they connected: past their timeout, the check proved nothing",
        pending_since.elapsed()
    );
    drop(pending);
    let served = wait_until(Duration::from_secs(10), || raw_request(&f, b"{\"cmd\":\"status\"}\n")["ok"] == true);
    assert!(served, "status not served after the pending clients went away");
    assert_eq!(run.stop(), Some(0));
}
