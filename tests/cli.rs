//! The command line: doctor, help, argument errors.

mod common;

use common::*;

#[test]
fn doctor_reports_this_kernel() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sealnode"))
        .args(["doctor", "--json"])
        .env_remove("SEALNODE_CONFIG")
        .output_within(COMMAND_LIMIT);
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = checks.as_array().expect("array").iter().filter_map(|c| c["name"].as_str()).collect();
    for n in ["user namespaces", "landlock", "seccomp", "cgroup v2"] {
        assert!(names.contains(&n), "doctor lacks {n}: {names:?}");
    }
    let failed: Vec<_> = checks.as_array().expect("array").iter().filter(|c| c["level"] == "fail").collect();
    assert_eq!(out.status.code() == Some(0), failed.is_empty(), "exit code must reflect FAIL checks: {failed:?}");
    if !failed.is_empty() {
        unavailable("userns", &format!("doctor reports failures on this machine: {failed:?}"));
    }
}

/// `doctor` reads the config `SEALNODE_CONFIG` names, as every command that takes `--config`
/// does (found by a docs audit: it ignored the variable and passed where `run` refuses);
/// `--config` wins over it.
#[test]
fn doctor_reads_the_config_sealnode_config_names() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.toml");
    let doctor = |args: &[&str]| {
        std::process::Command::new(env!("CARGO_BIN_EXE_sealnode"))
            .arg("doctor")
            .args(args)
            .env("SEALNODE_CONFIG", &missing)
            .output_within(COMMAND_LIMIT)
    };
    let out = doctor(&[]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains(&missing.display().to_string()), "{err}");
    let other = dir.path().join("other.toml");
    let out = doctor(&["--config", &other.display().to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(err.contains("other.toml") && !err.contains("missing.toml"), "{err}");
}

#[test]
fn doctor_fails_and_explains_where_namespaces_are_missing() {
    // Inside a node sandbox, namespaces and Landlock are refused: doctor must say so and exit 1.
    for mode in modes() {
        let mut f = Fixture::new(mode, "doctor");
        f.node_extra = format!("ro_binds = [{{ src = \"{}\", dst = \"/opt/sealnode\" }}]", f.p("bin").display());
        f.write_config();
        let o = f.exec("node", &["/opt/sealnode/sealnode", "doctor"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(1), "{mode:?}: {out}\n{}", String::from_utf8_lossy(&o.stderr));
        assert!(out.contains("[FAIL] user namespaces") && out.contains("fix:"), "{mode:?}: {out}");
        assert!(out.contains("[FAIL] landlock"), "{mode:?}: {out}");
    }
}

#[test]
fn help_lists_the_commands() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sealnode")).arg("--help").output_within(COMMAND_LIMIT);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("exec") && text.contains("doctor"), "{text}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sealnode"))
        .args(["exec", "--config", "/nonexistent.toml", "--role", "engine", "--", "/bin/true"])
        .output_within(COMMAND_LIMIT);
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent.toml"), "{err}");
}

fn sealnode(args: &[&str]) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_sealnode")).args(args).output_within(COMMAND_LIMIT)
}

/// The visible subcommands, as `sealnode --help` lists them.
fn subcommands() -> Vec<String> {
    let help = String::from_utf8(sealnode(&["--help"]).stdout).expect("utf8");
    help.split("Commands:")
        .nth(1)
        .expect("a Commands: section")
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .filter_map(|l| l.split_whitespace().next().map(str::to_string))
        .filter(|c| c != "help")
        .collect()
}

#[test]
fn man_pages_cover_every_subcommand_and_option() {
    let dir = std::env::temp_dir().join(format!("sealnode-man-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let o = sealnode(&["man", "--dir", dir.to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let subs = subcommands();
    assert!(subs.len() >= 9, "{subs:?}");
    let mut expected: Vec<String> = subs.iter().map(|s| format!("sealnode-{s}.1")).collect();
    expected.push("sealnode.1".into());
    expected.push("sealnode.toml.5".into());
    expected.sort();
    let mut got: Vec<String> = std::fs::read_dir(&dir)
        .expect("man dir")
        .filter_map(|e| e.ok().and_then(|e| e.file_name().into_string().ok()))
        .collect();
    got.sort();
    assert_eq!(got, expected, "one page per subcommand, nothing else");
    let groff = which("/usr/bin/groff");
    let renders = |file: &str| {
        if let Some(g) = &groff {
            let r = std::process::Command::new(g)
                .args(["-k", "-man", "-Tutf8", "-ww", "-z"])
                .arg(dir.join(file))
                .output_within(COMMAND_LIMIT);
            assert!(r.status.success() && r.stderr.is_empty(), "{file}: {}", String::from_utf8_lossy(&r.stderr));
        }
    };
    for page in std::iter::once("sealnode".to_string()).chain(subs.iter().map(|s| format!("sealnode-{s}"))) {
        let text = std::fs::read_to_string(dir.join(format!("{page}.1"))).expect("page");
        for section in ["NAME", "SYNOPSIS", "DESCRIPTION", "EXIT STATUS", "ENVIRONMENT", "FILES", "SEE ALSO"] {
            assert!(
                text.contains(&format!(".SH \"{section}\"")) || text.contains(&format!(".SH {section}\n")),
                "{page}.1 lacks {section}"
            );
        }
        assert!(text.contains("SEALNODE_LOG") && text.contains("sealnode.toml"), "{page}.1");
        // EXIT STATUS holds the README's documented rows for this command (read from the README,
        // not from the table the pages are generated from): 0, 2 and 125 everywhere.
        let sub = page.strip_prefix("sealnode-").unwrap_or("sealnode");
        for code in readme_exit_codes(sub) {
            assert!(text.contains(&format!("\\fB{code}\\fR")), "{page}.1 lacks exit status {code}");
        }
        renders(&format!("{page}.1"));
    }
    // sealnode.toml(5) is docs/config.md: every heading of it is a section of the page.
    let page = std::fs::read_to_string(dir.join("sealnode.toml.5")).expect("sealnode.toml.5");
    let reference = std::fs::read_to_string(repo().join("docs/config.md")).expect("config.md");
    for h in reference.lines().filter_map(|l| l.strip_prefix("## ").or_else(|| l.strip_prefix("### "))) {
        let h = h.replace('`', "").replace('-', "\\-");
        assert!(page.to_uppercase().contains(&h.to_uppercase()), "sealnode.toml.5 lacks the section {h:?}");
    }
    for key in ["state_dir", "egress_connect_timeout_s", "memory_max_mb", "scratch_max_mb", "restart_limit"] {
        assert!(page.contains(&format!("\\fB{}\\fR", key)), "sealnode.toml.5 lacks {key}");
    }
    renders("sealnode.toml.5");
    for s in &subs {
        let page = std::fs::read_to_string(dir.join(format!("sealnode-{s}.1"))).expect("page");
        // Every long option the subcommand's --help shows is documented on its page.
        let help = String::from_utf8(sealnode(&[s.as_str(), "--help"]).stdout).expect("utf8");
        for opt in help.split_whitespace().filter(|w| w.starts_with("--")) {
            let opt = opt.trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
            let roff = opt.replace('-', "\\-");
            assert!(page.contains(&roff) || page.contains(opt), "sealnode-{s}.1 lacks {opt}");
        }
    }
    if groff.is_none() {
        unavailable("groff", "groff is not installed; man pages were not rendered");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn completions_know_every_subcommand() {
    let subs = subcommands();
    for shell in ["bash", "zsh", "fish", "elvish", "powershell"] {
        let o = sealnode(&["completions", shell]);
        assert!(o.status.success(), "{shell}: {}", String::from_utf8_lossy(&o.stderr));
        let script = String::from_utf8(o.stdout).expect("utf8");
        // The shell's own form of "complete this subcommand", not any occurrence of the word
        // ("run" appears in every script's help texts).
        let entry = |s: &str| match shell {
            "bash" => format!("sealnode,{s})"),
            "zsh" => format!("'{s}:"),
            "fish" => format!("-a \"{s}\" -d "),
            "elvish" => format!("cand {s} '"),
            _ => format!("[CompletionResult]::new('{s}', '{s}', "),
        };
        for s in &subs {
            assert!(script.contains(&entry(s)), "{shell} completion lacks {s} ({:?})", entry(s));
        }
        // Hidden subcommands are not offered (bash once offered the sandbox's internal entry
        // points): neither as an entry nor anywhere in the script.
        for hidden in ["__canary-inside", "__probe-inside", "probe"] {
            assert!(!subs.iter().any(|s| s == hidden), "{hidden} is listed by --help");
            assert!(!script.contains(&entry(hidden)), "{shell} completion offers the hidden {hidden}");
        }
        assert!(!script.contains("canary-inside") && !script.contains("probe-inside"), "{shell}: {script}");
        if shell == "bash" {
            // The script must at least parse.
            let mut c = std::process::Command::new("/bin/bash");
            c.args(["-n", "/dev/stdin"]).stdin(std::process::Stdio::piped());
            let mut child = c.spawn().expect("bash");
            use std::io::Write;
            child.stdin.take().expect("stdin").write_all(script.as_bytes()).expect("write");
            assert!(wait_within(&mut child, COMMAND_LIMIT, "bash -n").success(), "bash completion does not parse");
        }
    }
    let bad = sealnode(&["completions", "tcsh"]);
    assert_eq!(bad.status.code(), Some(2));
}

#[test]
fn canary_reports_cannot_share_stdout_or_follow_the_matrix() {
    for args in [&["--json", "--tap", "-"][..], &["--junit", "-", "--tap", "-"], &["--matrix", "--junit", "x.xml"]] {
        let mut a = vec!["canary", "--config", "/nonexistent/sealnode.toml"];
        a.extend_from_slice(args);
        let o = sealnode(&a);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// The exit statuses README.md's table documents for `command` (`sealnode`: all of them).
fn readme_exit_codes(command: &str) -> Vec<String> {
    let readme = std::fs::read_to_string(repo().join("README.md")).expect("README");
    let table =
        readme.split("<!-- exit-codes").nth(1).and_then(|t| t.split("<!-- /exit-codes -->").next()).expect("table");
    let codes: Vec<String> = table
        .lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| status"))
        .filter_map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split(" | ").map(str::trim).collect();
            let (code, cmds) = (cells.first()?, cells.get(1)?);
            code.parse::<i32>().ok()?;
            let applies = command == "sealnode" || *cmds == "all" || cmds.split(", ").any(|c| c == command);
            applies.then(|| code.to_string())
        })
        .collect();
    assert!(codes.len() >= 3, "README's exit table for {command}: {codes:?}");
    codes
}

/// `ctl status`'s table: the receipt's start time as RFC 3339 (once `(?)`: a number read as a
/// string), and each role's own preflight count, as `ctl metrics` exposes it.
#[test]
fn ctl_status_shows_the_receipt_time_and_each_roles_own_preflight() {
    // A status answer as the supervisor wrote it (tests/fixtures), then this test's numbers.
    let fixture = std::fs::read_to_string(repo().join("tests/fixtures/control-status.json")).expect("fixture");
    let mut status: sealnode::control::protocol::Status = serde_json::from_str(&fixture).expect("a status answer");
    let receipt = status.receipt.as_mut().expect("a receipt");
    receipt.generation = 3;
    receipt.started_at = 1_700_000_000;
    for (r, n) in status.roles.iter_mut().zip([91, 88]) {
        let p = r.preflight.as_mut().expect("a preflight");
        p.ms = 150;
        p.attempts = n;
    }
    let table = sealnode::control::status_text::render(&status);
    let receipt = table.lines().find(|l| l.starts_with("receipt:")).expect("a receipt line");
    assert_eq!(
        receipt,
        "receipt:  generation 3, preflight passed, /var/lib/sealnode/receipt.json (started 2023-11-14T22:13:20Z)"
    );
    for (role, n) in [("engine", 91), ("node", 88)] {
        let line = table.lines().find(|l| l.starts_with(&format!("{role:<7} "))).expect("the role's line");
        assert!(line.contains(&format!(" {n} refused, 0.15 s")), "{line}");
    }
    let metrics = sealnode::control::metrics::render(&status);
    assert!(metrics.contains("sealnode_preflight_attempts{role=\"engine\"} 91\n"), "{metrics}");
    assert!(metrics.contains("sealnode_preflight_attempts{role=\"node\"} 88\n"), "{metrics}");
}

/// The pages' SUBCOMMANDS section: on a page whose command has subcommands (as its --help lists
/// them), each of them named, and every page it refers to generated; on every other page, no
/// such section (clap_mangen wrote an empty one on 11 pages).
#[test]
fn man_pages_list_subcommands_only_where_there_are_some() {
    let dir = tempfile::tempdir().expect("tmp");
    let o = sealnode(&["man", "--dir", dir.path().to_str().expect("utf8")]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let mut with_section = Vec::new();
    for page in std::iter::once("sealnode".to_string()).chain(subcommands().iter().map(|s| format!("sealnode-{s}"))) {
        let text = std::fs::read_to_string(dir.path().join(format!("{page}.1"))).expect("page");
        let args: Vec<&str> = page.strip_prefix("sealnode-").into_iter().collect();
        let help = String::from_utf8(sealnode(&[&args[..], &["--help"]].concat()).stdout).expect("utf8");
        let listed: Vec<String> = help
            .split("Commands:")
            .nth(1)
            .map(|t| {
                t.lines()
                    .skip(1)
                    .take_while(|l| !l.trim().is_empty())
                    .filter_map(|l| l.split_whitespace().next().map(str::to_string))
                    .filter(|c| c != "help")
                    .collect()
            })
            .unwrap_or_default();
        let section = text.split(".SH SUBCOMMANDS\n").nth(1).map(|s| s.split("\n.SH ").next().expect("end"));
        let Some(section) = section else {
            assert!(listed.is_empty(), "{page}.1 has no SUBCOMMANDS section, its --help lists {listed:?}");
            continue;
        };
        assert!(!listed.is_empty(), "{page}.1 has a SUBCOMMANDS section, its command has none:\n{section}");
        with_section.push(page.clone());
        let entries: Vec<&str> = section.lines().filter(|l| l.starts_with("\\fB")).collect();
        assert_eq!(entries.len(), listed.len(), "{page}.1: {entries:?} vs {listed:?}");
        for (entry, sub) in entries.iter().zip(&listed) {
            let name = entry.trim_start_matches("\\fB").split("\\fR").next().expect("name").replace("\\-", "-");
            if let Some(refers) = entry.strip_suffix("(1)") {
                let target = refers.trim_start_matches("\\fB").trim_end_matches("\\fR").replace("\\-", "-");
                assert!(
                    dir.path().join(format!("{target}.1")).exists(),
                    "{page}.1 refers to {target}(1), not generated"
                );
                assert_eq!(target, format!("sealnode-{sub}"), "{page}.1");
            } else {
                assert_eq!(name, format!("sealnode {} {sub}", args.join(" ")), "{page}.1");
            }
        }
    }
    assert!(with_section.contains(&"sealnode".to_string()) && with_section.contains(&"sealnode-attest".to_string()));
}

/// `sealnode ARGS` for the fixture under a seccomp filter of `rules` (a call, with its rules)
/// whose match answers `action`, as a filter above sealnode would: its exit status and what it
/// said.
fn under_filter(
    f: &Fixture,
    args: &[&str],
    rules: Vec<(i64, Vec<seccompiler::SeccompRule>)>,
    action: seccompiler::SeccompAction,
) -> (Option<i32>, String) {
    under_filter_within(f, args, rules, action, COMMAND_LIMIT)
}

fn under_filter_within(
    f: &Fixture,
    args: &[&str],
    rules: Vec<(i64, Vec<seccompiler::SeccompRule>)>,
    action: seccompiler::SeccompAction,
    limit: std::time::Duration,
) -> (Option<i32>, String) {
    use std::os::unix::process::CommandExt;
    let filter: seccompiler::BpfProgram = seccompiler::SeccompFilter::new(
        rules.into_iter().collect(),
        seccompiler::SeccompAction::Allow,
        action,
        std::env::consts::ARCH.try_into().expect("arch"),
    )
    .and_then(|f| f.try_into())
    .expect("filter");
    let mut c = f.command(args);
    // SAFETY: between fork and exec the child only makes the prctl and seccomp calls
    // apply_filter makes, on a program built before the fork.
    unsafe {
        c.pre_exec(move || {
            // A supplementary group, as a root shell has, for a faked setgroups to leave behind.
            // SAFETY: one gid, read from the array for the call.
            if libc::geteuid() == 0 && libc::setgroups(1, [4 as libc::gid_t].as_ptr()) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // SAFETY: PR_SET_NO_NEW_PRIVS takes integers.
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            seccompiler::apply_filter(&filter).map_err(|e| std::io::Error::other(e.to_string()))
        })
    };
    let o = c.output_within(limit);
    (o.status.code(), format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr)))
}

/// Found by review: a filter above sealnode (a container's seccomp profile, systemd's
/// `SystemCallFilter=`) refusing or killing on one call of a role's setup passed doctor, and
/// `run` failed later (exit 6, or a wipe's message) without naming the filter. Each is tried
/// now: doctor fails naming the call, and `run` refuses with 125 before anything starts.
/// Then (found again): a call the probe did not make (capset, setgroups, the loopback's ioctl,
/// a remount, setns into a user or mount namespace) failed later with a wrong cause ("another
/// host user's files: remove them by hand", "sealed copy of the program").
#[test]
fn a_filter_refusing_one_setup_call_is_named_by_doctor_and_run() {
    use seccompiler::SeccompAction::{Errno, KillProcess};
    use seccompiler::{SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompRule as Rule};
    let arg =
        |i: u8, op: Op, v: u64| vec![Rule::new(vec![Cond::new(i, Len::Qword, op, v).expect("cond")]).expect("rule")];
    let eperm = Errno(libc::EPERM as u32);
    let landlock = "landlock (create_ruleset, add_rule, restrict_self)";
    let capset = "capset (every capability dropped)";
    for mode in common::modes() {
        let f = Fixture::new(mode, "doctor-filter");
        let cfg = f.config.display().to_string();
        // Rootless under a root test, setpriv runs under the filter too (it sets groups and
        // capabilities): those two are tried where sealnode itself makes the change of ids.
        let own_ids = mode == Mode::Rootful || !common::is_root();
        for (nr, rules, action, named, said) in [
            (libc::SYS_mount_setattr, vec![], Errno(libc::ENOSYS as u32), "mount_setattr", "refused"),
            (libc::SYS_setns, vec![], eperm.clone(), "setns (network namespace)", "refused"),
            (libc::SYS_pivot_root, vec![], Errno(libc::ENOSYS as u32), "pivot_root", "refused"),
            (libc::SYS_pivot_root, vec![], KillProcess, "pivot_root", "killed the process (SIGSYS)"),
            (libc::SYS_sethostname, vec![], KillProcess, "sethostname", "killed the process (SIGSYS)"),
            (libc::SYS_landlock_restrict_self, vec![], eperm.clone(), landlock, "refused"),
            (libc::SYS_landlock_add_rule, vec![], eperm.clone(), landlock, "refused"),
            (libc::SYS_memfd_create, vec![], eperm.clone(), "memfd_create", "refused"),
            (libc::SYS_seccomp, vec![], eperm.clone(), "seccomp", "refused"),
            (
                libc::SYS_mount,
                arg(3, Op::MaskedEq(libc::MS_REMOUNT), libc::MS_REMOUNT),
                eperm.clone(),
                "mount (remount)",
                "refused",
            ),
            (
                libc::SYS_ioctl,
                arg(1, Op::Eq, libc::SIOCSIFFLAGS),
                eperm.clone(),
                "ioctl (SIOCSIFFLAGS: the loopback up)",
                "refused",
            ),
            (
                libc::SYS_setns,
                arg(1, Op::Eq, libc::CLONE_NEWUSER as u64),
                eperm.clone(),
                "setns (user namespace)",
                "refused",
            ),
            (
                libc::SYS_setns,
                arg(1, Op::Eq, libc::CLONE_NEWNS as u64),
                eperm.clone(),
                "setns (mount namespace)",
                "refused",
            ),
            (libc::SYS_capset, vec![], eperm.clone(), capset, "refused"),
            (libc::SYS_capset, vec![], KillProcess, capset, "killed the process (SIGSYS)"),
            (libc::SYS_setgroups, vec![], eperm.clone(), "setgroups", "refused"),
            (libc::SYS_setresuid, vec![], eperm.clone(), "setresuid", "refused"),
            (libc::SYS_setresgid, vec![], KillProcess, "setresgid", "killed the process (SIGSYS)"),
            (libc::SYS_sendfile, vec![], eperm.clone(), "sendfile", "refused"),
            (libc::SYS_setsid, vec![], KillProcess, "setsid", "killed the process (SIGSYS)"),
            (libc::SYS_close_range, vec![], Errno(libc::ENOSYS as u32), "close_range", "refused"),
            // Setting one limit (not reading it): the probe set only RLIMIT_CORE, so this
            // passed it and killed the workload's setup (taken for the workload's own exit).
            (
                libc::SYS_prlimit64,
                vec![Rule::new(vec![
                    Cond::new(1, Len::Qword, Op::Eq, libc::RLIMIT_MEMLOCK as u64).expect("cond"),
                    Cond::new(2, Len::Qword, Op::Ne, 0).expect("cond"),
                ])
                .expect("rule")],
                KillProcess,
                "prlimit64 (setrlimit)",
                "killed the process (SIGSYS)",
            ),
            (
                libc::SYS_prctl,
                arg(0, Op::Eq, libc::PR_SET_DUMPABLE as u64),
                eperm.clone(),
                "prctl (PR_SET_DUMPABLE)",
                "refused",
            ),
            (
                libc::SYS_prctl,
                arg(0, Op::Eq, libc::PR_SET_KEEPCAPS as u64),
                eperm.clone(),
                "prctl (PR_SET_KEEPCAPS)",
                "refused",
            ),
            (
                libc::SYS_unshare,
                arg(0, Op::Eq, libc::CLONE_NEWNS as u64),
                eperm.clone(),
                "unshare (mount namespace)",
                "refused",
            ),
            // A faked success (a filter answering 0 without making the call; found by review:
            // the engine ran in the node's network namespace, a role kept the supervisor's
            // groups, the roles saw the host's name): read back, refused.
            (
                libc::SYS_unshare,
                arg(0, Op::Eq, libc::CLONE_NEWNET as u64),
                Errno(0),
                "unshare (network namespace)",
                "refused",
            ),
            (
                libc::SYS_setns,
                arg(1, Op::Eq, libc::CLONE_NEWUSER as u64),
                Errno(0),
                "setns (user namespace)",
                "refused",
            ),
            (libc::SYS_setgroups, vec![], Errno(0), "setgroups", "refused"),
            (libc::SYS_sethostname, vec![], Errno(0), "sethostname", "refused"),
            (libc::SYS_setsid, vec![], Errno(0), "setsid", "refused"),
            // Found by review: a faked close_range left a role's init holding the supervisor's
            // fds (its dirs, sockets, another role's scratch); read back from /proc now.
            (libc::SYS_close_range, vec![], Errno(0), "close_range", "refused"),
            // A faked mount(2), listed as not read back after the reviews: each mount is now (a
            // mount root there, of its filesystem, with its flags).
            (libc::SYS_mount, vec![], Errno(0), "mount", "refused"),
            (libc::SYS_mount, arg(3, Op::MaskedEq(libc::MS_BIND), libc::MS_BIND), Errno(0), "mount (bind)", "refused"),
            // Each bind is moved from its stage onto its destination (the second review of #29's
            // mount destinations): refused or faked, the probe tells it.
            (
                libc::SYS_mount,
                arg(3, Op::MaskedEq(libc::MS_MOVE), libc::MS_MOVE),
                eperm.clone(),
                "mount (move)",
                "refused",
            ),
            (libc::SYS_mount, arg(3, Op::MaskedEq(libc::MS_MOVE), libc::MS_MOVE), Errno(0), "mount (move)", "refused"),
            (
                libc::SYS_mount,
                arg(3, Op::MaskedEq(libc::MS_REMOUNT), libc::MS_REMOUNT),
                Errno(0),
                "mount (remount)",
                "refused",
            ),
            // Found by the second review: faked setresgid, setresuid, setgroups with getgroups,
            // capset with capget, restrict_self, seccomp; each read back now.
            (libc::SYS_setresgid, vec![], Errno(0), "setresgid", "refused"),
            (libc::SYS_setresuid, vec![], Errno(0), "setresuid", "refused"),
            (libc::SYS_landlock_restrict_self, vec![], Errno(0), landlock, "refused"),
            (libc::SYS_seccomp, arg(0, Op::Eq, libc::SECCOMP_SET_MODE_FILTER as u64), Errno(0), "seccomp", "refused"),
        ] {
            let changes_ids = [libc::SYS_capset, libc::SYS_setgroups, libc::SYS_setresuid, libc::SYS_setresgid]
                .contains(&nr)
                || named.contains("KEEPCAPS");
            // Rootless, sealnode never sets groups (the kernel would not let it).
            if changes_ids && !own_ids || nr == libc::SYS_setgroups && mode == Mode::Rootless {
                continue;
            }
            let what = format!("{named} {said}");
            let (code, out) = under_filter(&f, &["doctor"], vec![(nr, rules.clone())], action.clone());
            assert_eq!(code, Some(1), "{mode:?} {nr} {action:?}: {out}");
            assert!(out.contains("[FAIL] user namespaces") && out.contains(&what), "{mode:?} {nr} {action:?}: {out}");
            let (code, out) = under_filter(&f, &["run", "--config", &cfg], vec![(nr, rules)], action.clone());
            assert_eq!(code, Some(125), "{mode:?} {nr} {action:?}: {out}");
            assert!(out.contains(&what) && !out.contains("role started"), "{mode:?} {nr} {action:?}: {out}");
            assert!(!out.contains("remove them by hand"), "{mode:?} {nr} {action:?}: {out}");
        }
    }
}

/// Install `prog` on this process as a seccomp filter with a listener (no_new_privs first), as
/// a supervisor above sealnode does: the listener's fd.
///
/// # Safety
/// Only system calls, on a program built before: for a pre_exec closure (between fork and exec).
unsafe fn listener_filter(prog: &[libc::sock_filter]) -> std::io::Result<libc::c_int> {
    let fprog = libc::sock_fprog { len: prog.len() as u16, filter: prog.as_ptr() as *mut _ };
    // SAFETY: PR_SET_NO_NEW_PRIVS takes integers; seccomp reads `fprog`, valid for the call.
    let fd = unsafe {
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
            &fprog as *const libc::sock_fprog,
        )
    };
    match fd {
        fd if fd < 0 => Err(std::io::Error::last_os_error()),
        fd => Ok(fd as libc::c_int),
    }
}

/// Found by review: a filter handing the namespaces' clone to a supervisor that never answers
/// held `run` there for as long as it liked, its stop signals blocked. The probe runs in a child
/// of its own, bounded: doctor and run say it was held and stop.
#[test]
fn a_held_namespace_clone_is_told_within_the_probes_limit() {
    use std::os::unix::process::CommandExt;
    let f = Fixture::new(Mode::Rootless, "held-clone");
    let cfg = f.config.display().to_string();
    // `run` (doctor takes the same path, with its signals not blocked).
    let args = ["run", "--config", cfg.as_str()];
    {
        let mut c = f.command(&args);
        // SAFETY: between fork and exec the child installs a filter, forks a holder that only
        // sleeps with the filter's listener (never answering it), and closes that listener.
        unsafe {
            c.pre_exec(|| {
                let nr = libc::SYS_clone as u32;
                let user = libc::CLONE_NEWUSER as u32;
                let f = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter { code: code as u16, jt, jf, k };
                let prog = [
                    f(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 0),
                    f(libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K, 0, 3, nr),
                    f(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0, 0, 16),
                    f(libc::BPF_JMP | libc::BPF_JSET | libc::BPF_K, 0, 1, user),
                    f(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_USER_NOTIF),
                    f(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW),
                ];
                let fd = listener_filter(&prog)?;
                if libc::fork() == 0 {
                    // The holder: nothing of the test's but the listener, for longer than the
                    // probe's limit.
                    libc::close_range(0, (fd - 1) as u32, 0);
                    libc::close_range((fd + 1) as u32, u32::MAX, 0);
                    libc::sleep(40);
                    libc::_exit(0);
                }
                libc::close(fd);
                Ok(())
            })
        };
        let t = std::time::Instant::now();
        let o = c.output_within(COMMAND_LIMIT);
        let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.status.code(), Some(125), "{args:?}: {out}");
        assert!(out.contains("the namespaces' setup did not return within 30 s"), "{args:?}: {out}");
        assert!(t.elapsed() < std::time::Duration::from_secs(39), "{args:?}: {:?}", t.elapsed());
        assert!(!out.contains("role started"), "{out}");
    }
}

/// Found by the second review: a filter faking two calls at once (the change and its read-back:
/// setgroups with getgroups, capset with capget) or one the probe cannot read back (setrlimit
/// for one resource) passed doctor and the preflight, and a role ran with the supervisor's
/// groups, every capability in its init, or the host's limit. The probe reads each back
/// another way (/proc/thread-self/status, a capget that starts full), and every start reads
/// what the kernel shows of the role from /proc: refused, 125, no role started.
#[test]
fn a_filter_faking_a_call_and_its_read_back_is_caught() {
    use seccompiler::SeccompAction::Errno;
    use seccompiler::{SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompRule as Rule};
    let arg = |i: u8, v: u64| vec![Rule::new(vec![Cond::new(i, Len::Qword, Op::Eq, v).expect("cond")]).expect("rule")];
    for mode in common::modes() {
        let f = Fixture::new(mode, "faked-pairs");
        let cfg = f.config.display().to_string();
        let own_ids = mode == Mode::Rootful || !common::is_root();
        type Rules = Vec<(i64, Vec<Rule>)>;
        let mut cases: Vec<(Rules, &str)> = vec![
            // The node's NPROC limit (the plan's rlimits), faked: the host's stays.
            (vec![(libc::SYS_prlimit64, arg(1, libc::RLIMIT_NPROC as u64))], "Max processes"),
            // A bind without MS_REC (a /proc file's mask, the program's sealed copy), faked: the
            // probe's bind is recursive; the role's own read-back refuses it, naming the mount
            // (before it, a later call's EINVAL did, by chance).
            (vec![(libc::SYS_mount, arg(3, libc::MS_BIND))], "the kernel does not show it as it was asked"),
            // A sysctl's write (2 bytes: "0\n"), faked: the namespace's value stays. The first
            // met is the cell init's, setting the network namespaces' sysctls.
            (vec![(libc::SYS_write, arg(2, 2))], "net_sysctls: cell: setting /proc/sys/net/ipv4/tcp_fastopen to 0"),
        ];
        if own_ids {
            cases.push((
                vec![(libc::SYS_capset, vec![]), (libc::SYS_capget, vec![])],
                "capset (every capability dropped) refused",
            ));
        }
        if mode == Mode::Rootful {
            cases.push((vec![(libc::SYS_setgroups, vec![]), (libc::SYS_getgroups, vec![])], "setgroups refused"));
        }
        for (rules, said) in cases {
            let (code, out) = under_filter(&f, &["run", "--config", &cfg], rules, Errno(0));
            // 125 from the probe, 6 where the preflight's first sandbox is what shows it.
            assert!(matches!(code, Some(125 | 6)), "{mode:?} {said}: {out}");
            assert!(out.contains(said) && !out.contains("role started"), "{mode:?} {said}: {out}");
        }
    }
}

/// Found by review: where the host's /tmp is a nosuid, nodev tmpfs (systemd's tmp.mount), a
/// faked mount of a role's root tmpfs (there: sealnode builds the root at /tmp) passed its read
/// back (a tmpfs mount root with those flags was there already), and the root's skeleton was
/// written into the host's /tmp. Each mount is read back as a new mount now: doctor and `run`
/// refuse the faked one by name, before anything is written.
#[test]
fn a_faked_mount_over_a_tmpfs_already_there_is_caught() {
    use seccompiler::{SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompRule as Rule};
    use std::os::unix::process::CommandExt;
    if !common::is_root() {
        common::unavailable("rootful", "a /tmp tmpfs of its own for sealnode needs root to mount");
        return;
    }
    let flags = libc::MS_NOSUID | libc::MS_NODEV;
    let rule = Rule::new(vec![Cond::new(3, Len::Qword, Op::Eq, flags).expect("cond")]).expect("rule");
    let filter: seccompiler::BpfProgram = seccompiler::SeccompFilter::new(
        vec![(libc::SYS_mount, vec![rule])].into_iter().collect(),
        seccompiler::SeccompAction::Allow,
        seccompiler::SeccompAction::Errno(0),
        std::env::consts::ARCH.try_into().expect("arch"),
    )
    .and_then(|f| f.try_into())
    .expect("filter");
    for mode in common::modes() {
        let f = Fixture::new(mode, "tmp-tmpfs");
        let cfg = f.config.display().to_string();
        for args in [vec!["doctor"], vec!["run", "--config", cfg.as_str()]] {
            let filter = filter.clone();
            let mut c = f.command(&args);
            // SAFETY: between fork and exec the child only makes system calls: a mount
            // namespace of its own with a tmpfs on /tmp (as systemd's tmp.mount makes), then
            // the filter, a program built before the fork.
            unsafe {
                c.pre_exec(move || {
                    let none = std::ptr::null::<libc::c_char>();
                    let private = libc::MS_REC | libc::MS_PRIVATE;
                    if libc::unshare(libc::CLONE_NEWNS) != 0
                        || libc::mount(none, c"/".as_ptr(), none, private, std::ptr::null()) != 0
                        || libc::mount(
                            c"tmpfs".as_ptr(),
                            c"/tmp".as_ptr(),
                            c"tmpfs".as_ptr(),
                            libc::MS_NOSUID | libc::MS_NODEV,
                            c"mode=1777".as_ptr().cast(),
                        ) != 0
                        || libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    {
                        return Err(std::io::Error::last_os_error());
                    }
                    seccompiler::apply_filter(&filter).map_err(|e| std::io::Error::other(e.to_string()))
                })
            };
            let o = c.output_within(COMMAND_LIMIT);
            let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
            assert_eq!(o.status.code(), Some(if args[0] == "doctor" { 1 } else { 125 }), "{mode:?} {args:?}: {out}");
            assert!(out.contains("mount refused") && !out.contains("role started"), "{mode:?} {args:?}: {out}");
        }
    }
}

/// Found by review: a filter refusing Landlock's calls on a kernel that has Landlock was told
/// as an old kernel only ("boot a kernel >= 6.12"). Where the kernel's LSM list shows Landlock,
/// the filter is named; where it cannot be read (securityfs not mounted), both causes are.
#[test]
fn a_filter_refusing_landlock_is_not_blamed_on_the_kernel() {
    let f = Fixture::new(Mode::Rootless, "landlock-filter");
    let enosys = seccompiler::SeccompAction::Errno(libc::ENOSYS as u32);
    let (code, out) = under_filter(&f, &["doctor"], vec![(libc::SYS_landlock_create_ruleset, vec![])], enosys);
    assert_eq!(code, Some(1), "{out}");
    let listed =
        std::fs::read_to_string("/sys/kernel/security/lsm").is_ok_and(|l| l.split(',').any(|m| m.trim() == "landlock"));
    let named =
        if listed { "the kernel has Landlock" } else { "seccomp filter(s) sealnode runs under refuses its calls" };
    assert!(out.contains("[FAIL] landlock") && out.contains(named), "{out}");
}

/// The probe maps ids as each cell does: a root without CAP_SETGID (a unit's
/// CapabilityBoundingSet=) is told which capability, by doctor and by `run` before anything is
/// made (it failed later, writing the cell's gid_map).
#[test]
fn a_root_without_the_capability_to_map_ids_is_told_so() {
    if !common::is_root() {
        common::unavailable("rootful", "mapping ids as root needs root");
        return;
    }
    let f = Fixture::new(Mode::Rootful, "no-setgid");
    let cfg = f.config.display().to_string();
    for args in [vec!["doctor"], vec!["run", "--config", cfg.as_str()]] {
        let o = std::process::Command::new("/usr/bin/setpriv")
            .args(["--bounding-set", "-setgid", "--"])
            .arg(&f.bin)
            .args(&args)
            .current_dir(&f.dir)
            .output_within(COMMAND_LIMIT);
        let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        assert_eq!(o.status.code(), Some(if args[0] == "doctor" { 1 } else { 125 }), "{args:?}: {out}");
        assert!(out.contains("writing uid_map and gid_map refused") && out.contains("CAP_SETGID"), "{args:?}: {out}");
        assert!(!out.contains("role started"), "{out}");
    }
}

/// A call only some configs make, refused by a filter above sealnode: a seccomp filter with a
/// listener (`log_refused_syscalls`; a filter above that has one already makes the kernel
/// answer EBUSY) and clone3 (cgroup leaves; Docker's and podman's defaults answer ENOSYS).
/// doctor warns without a config and with one that does not make it; `run` with one that
/// does refuses with 125, naming it and the field, before any role starts.
#[test]
fn a_filter_refusing_a_call_only_some_configs_make_fails_only_those() {
    use seccompiler::{SeccompCmpArgLen as Len, SeccompCmpOp as Op, SeccompCondition as Cond, SeccompRule as Rule};
    let listener = libc::SECCOMP_FILTER_FLAG_NEW_LISTENER;
    let with_listener = || {
        vec![Rule::new(vec![Cond::new(1, Len::Qword, Op::MaskedEq(listener), listener).expect("cond")]).expect("rule")]
    };
    let ebusy = seccompiler::SeccompAction::Errno(libc::EBUSY as u32);
    let enosys = seccompiler::SeccompAction::Errno(libc::ENOSYS as u32);
    let mut f = Fixture::new(Mode::Rootless, "optional-filter");
    let cfg = f.config.display().to_string();
    let (code, out) = under_filter(&f, &["doctor"], vec![(libc::SYS_seccomp, with_listener())], ebusy.clone());
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("[warn] refused-call log")
            && out.contains("seccomp (a filter with a listener) refused: Device or resource busy"),
        "{out}"
    );
    let (code, out) = under_filter(&f, &["doctor", "--config", &cfg], vec![(libc::SYS_clone3, vec![])], enosys);
    assert_eq!(code, Some(0), "{out}");
    assert!(
        out.contains("[warn] cgroup leaves")
            && out.contains("clone3 refused")
            && out.contains("this config does not use it"),
        "{out}"
    );
    f.engine_extra.push_str("\nlog_refused_syscalls = true\n");
    f.write_config();
    let (code, out) =
        under_filter(&f, &["doctor", "--config", &cfg], vec![(libc::SYS_seccomp, with_listener())], ebusy.clone());
    assert_eq!(code, Some(1), "{out}");
    assert!(out.contains("[FAIL] refused-call log") && out.contains("this config needs it"), "{out}");
    let (code, out) = under_filter(&f, &["run", "--config", &cfg], vec![(libc::SYS_seccomp, with_listener())], ebusy);
    assert_eq!(code, Some(125), "{out}");
    assert!(
        out.contains("seccomp (a filter with a listener) refused") && out.contains("log_refused_syscalls = false"),
        "{out}"
    );
    assert!(!out.contains("role started"), "{out}");
}

/// Found by review: a filter above sealnode answering prctl(PR_SET_PDEATHSIG) with a faked
/// success left every role running after the supervisor was killed. The death signal is read
/// back, by the setup probe first and by the cell's init and each role's child: such a start is
/// refused, naming it, and no role runs.
#[test]
fn a_faked_parent_death_signal_refuses_the_start() {
    let f = Fixture::new(Mode::Rootless, "pdeathsig-filter");
    let pdeathsig = seccompiler::SeccompRule::new(vec![seccompiler::SeccompCondition::new(
        0,
        seccompiler::SeccompCmpArgLen::Dword,
        seccompiler::SeccompCmpOp::Eq,
        libc::PR_SET_PDEATHSIG as u64,
    )
    .expect("condition")])
    .expect("rule");
    let cfg = f.config.display().to_string();
    let faked = seccompiler::SeccompAction::Errno(0);
    let (code, said) = under_filter(&f, &["run", "--config", &cfg], vec![(libc::SYS_prctl, vec![pdeathsig])], faked);
    assert_eq!(code, Some(125), "{said}");
    assert!(!said.contains("role started"), "a role started without its parent's death signal: {said}");
    // The setup probe, the first to arm it, names it (and is never left behind by it).
    assert!(said.contains("prctl (PR_SET_PDEATHSIG) refused"), "{said}");
}

/// What a supervisor of a filter above sealnode does, and to which call: the first setrlimit
/// a sandbox's workload makes (innermost pid 2: the child of a sandbox's init; the probe's
/// processes are pid 1) killed or held (never answered); a sandbox's init (pid 1 with a child)
/// held where it confines itself (prctl(PR_SET_DUMPABLE, 0)) until its workload has exec'd,
/// then killed; the second setsid of a pid 1 (the first is the probe's) killed, before the
/// child is released.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Above {
    KillWorkloadAtItsLimit,
    HoldWorkloadAtItsLimit,
    KillInitConfining,
    KillBeforeRelease,
    /// landlock_restrict_self answered 0 without being made, for the first sandbox workload
    /// (pid 2) or the first sandbox init (pid 1 with a child).
    FakeWorkloadLandlock,
    FakeInitLandlock,
}

/// `sealnode run` of `f` under a filter sending one call (per `act`) to a supervisor in this
/// test that lets each go on but the one `act` names: the exit status, the output, and whether
/// that one was met.
fn run_under_a_supervisor_above(f: &Fixture, act: Above) -> (Option<i32>, String, bool) {
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
    use std::os::unix::process::CommandExt;
    let cfg = f.config.display().to_string();
    let (ours, theirs) = std::os::unix::net::UnixDatagram::pair().expect("socketpair");
    let theirs_fd = theirs.as_raw_fd();
    let mut c = f.command(&["run", "--config", &cfg]);
    // SAFETY: between fork and exec the child only installs a filter (a program on its stack)
    // and sends the filter's listener to the test over an inherited socket.
    unsafe {
        c.pre_exec(move || {
            let f = |code: u32, jt: u8, jf: u8, k: u32| libc::sock_filter { code: code as u16, jt, jf, k };
            let ld = libc::BPF_LD | libc::BPF_W | libc::BPF_ABS;
            let jeq = libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K;
            let notif = f(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_USER_NOTIF);
            let allow = f(libc::BPF_RET | libc::BPF_K, 0, 0, libc::SECCOMP_RET_ALLOW);
            let prog: Vec<libc::sock_filter> = match act {
                // prlimit64 with a new limit (args[2], at offset 32, not NULL).
                Above::KillWorkloadAtItsLimit | Above::HoldWorkloadAtItsLimit => vec![
                    f(ld, 0, 0, 0),
                    f(jeq, 0, 5, libc::SYS_prlimit64 as u32),
                    f(ld, 0, 0, 32),
                    f(jeq, 0, 2, 0),
                    f(ld, 0, 0, 36),
                    f(jeq, 1, 0, 0),
                    notif,
                    allow,
                ],
                // prctl(PR_SET_DUMPABLE (args[0], offset 16), 0 (args[1], offset 24)).
                Above::KillInitConfining => vec![
                    f(ld, 0, 0, 0),
                    f(jeq, 0, 5, libc::SYS_prctl as u32),
                    f(ld, 0, 0, 16),
                    f(jeq, 0, 3, libc::PR_SET_DUMPABLE as u32),
                    f(ld, 0, 0, 24),
                    f(jeq, 0, 1, 0),
                    notif,
                    allow,
                ],
                Above::KillBeforeRelease => vec![f(ld, 0, 0, 0), f(jeq, 0, 1, libc::SYS_setsid as u32), notif, allow],
                Above::FakeWorkloadLandlock | Above::FakeInitLandlock => {
                    vec![f(ld, 0, 0, 0), f(jeq, 0, 1, libc::SYS_landlock_restrict_self as u32), notif, allow]
                }
            };
            let fd = listener_filter(&prog)?;
            let mut space = [0u8; 64];
            let mut iov = libc::iovec { iov_base: b"L".as_ptr() as *mut _, iov_len: 1 };
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = space.as_mut_ptr() as *mut _;
            msg.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
            let cmsg = libc::CMSG_FIRSTHDR(&msg);
            (*cmsg).cmsg_level = libc::SOL_SOCKET;
            (*cmsg).cmsg_type = libc::SCM_RIGHTS;
            (*cmsg).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
            std::ptr::write_unaligned(libc::CMSG_DATA(cmsg) as *mut libc::c_int, fd);
            if libc::sendmsg(theirs_fd, &msg, 0) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            Ok(())
        })
    };
    let supervisor = std::thread::spawn(move || {
        let mut space = nix::cmsg_space!(libc::c_int);
        let mut b = [0u8; 1];
        let mut iov = [std::io::IoSliceMut::new(&mut b)];
        let msg = nix::sys::socket::recvmsg::<()>(
            ours.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            nix::sys::socket::MsgFlags::empty(),
        )
        .expect("the filter's listener");
        let Some(nix::sys::socket::ControlMessageOwned::ScmRights(fds)) = msg.cmsgs().expect("cmsgs").next() else {
            panic!("no listener sent");
        };
        // SAFETY: the fd just received is ours alone.
        let listener = unsafe { OwnedFd::from_raw_fd(fds[0]) };
        let kill = |pid: u32| {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), nix::sys::signal::Signal::SIGKILL);
        };
        let (mut met, mut pid1_setsids) = (false, 0);
        loop {
            let mut p = [libc::pollfd { fd: listener.as_raw_fd(), events: libc::POLLIN, revents: 0 }];
            // SAFETY: one valid pollfd.
            if unsafe { libc::poll(p.as_mut_ptr(), 1, 120_000) } <= 0 || p[0].revents & libc::POLLIN == 0 {
                return met;
            }
            let Ok(n) = sealnode::os::sys::seccomp_notif_recv(listener.as_raw_fd()) else { continue };
            let status = std::fs::read_to_string(format!("/proc/{}/status", n.pid)).unwrap_or_default();
            let innermost =
                status.lines().find_map(|l| l.strip_prefix("NSpid:")).and_then(|l| l.split_whitespace().last());
            let children = std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", n.pid)).unwrap_or_default();
            if !met {
                match act {
                    Above::KillWorkloadAtItsLimit | Above::HoldWorkloadAtItsLimit if innermost == Some("2") => {
                        met = true;
                        if act == Above::KillWorkloadAtItsLimit {
                            kill(n.pid);
                        }
                        continue;
                    }
                    Above::KillInitConfining if innermost == Some("1") && !children.trim().is_empty() => {
                        met = true;
                        // Its workload goes on to its exec meanwhile.
                        std::thread::sleep(std::time::Duration::from_secs(1));
                        kill(n.pid);
                        continue;
                    }
                    Above::FakeWorkloadLandlock | Above::FakeInitLandlock
                        if (act == Above::FakeWorkloadLandlock && innermost == Some("2"))
                            || (act == Above::FakeInitLandlock
                                && innermost == Some("1")
                                && !children.trim().is_empty()) =>
                    {
                        met = true;
                        // A success, without the call made.
                        let resp = libc::seccomp_notif_resp { id: n.id, val: 0, error: 0, flags: 0 };
                        // SAFETY: a valid response the ioctl reads.
                        unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SEND, &resp) };
                        continue;
                    }
                    Above::KillBeforeRelease if innermost == Some("1") => {
                        pid1_setsids += 1;
                        if pid1_setsids == 2 {
                            met = true;
                            kill(n.pid);
                            continue;
                        }
                    }
                    _ => {}
                }
            }
            let resp = libc::seccomp_notif_resp {
                id: n.id,
                val: 0,
                error: 0,
                flags: libc::SECCOMP_USER_NOTIF_FLAG_CONTINUE as u32,
            };
            // SAFETY: a valid response the ioctl reads; a task gone meanwhile is ENOENT.
            unsafe { libc::ioctl(listener.as_raw_fd(), libc::SECCOMP_IOCTL_NOTIF_SEND, &resp) };
        }
    });
    let o = c.output_within(COMMAND_LIMIT);
    drop(theirs);
    let out = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    (o.status.code(), out, supervisor.join().expect("supervisor"))
}

/// Found by review: a setup process killed before its exec closed the setup pipe as an exec
/// does, and the start was taken for the workload's own exit (the role restarted as if it had
/// run, its status 137); then (found by the next review) an init killed while it confined
/// itself, after its workload's exec, was too; and a child killed before its release was told
/// as "release child: Broken pipe". Each is killed here by a supervisor of a filter above
/// sealnode: `run` refuses, 125 (6 where the preflight's sandbox meets it), naming the process,
/// the signal and the step; no role starts.
#[test]
fn a_setup_killed_before_its_exec_is_told_as_such() {
    for mode in common::modes() {
        for (act, said) in [
            (
                Above::KillWorkloadAtItsLimit,
                "its workload was killed by SIGKILL at setup step rlimits, before its exec",
            ),
            (Above::KillInitConfining, "its init was killed by SIGKILL at setup step confine_init"),
            (Above::KillBeforeRelease, "its init was killed by SIGKILL at setup step new_session"),
        ] {
            let f = Fixture::new(mode, "killed-setup");
            let (code, out, met) = run_under_a_supervisor_above(&f, act);
            assert!(met, "{mode:?} {act:?}: nothing was killed: {out}");
            assert!(matches!(code, Some(125 | 6)), "{mode:?} {act:?}: {out}");
            assert!(
                out.contains(said) && out.contains("OOM killer") && !out.contains("role started"),
                "{mode:?} {act:?}: {out}"
            );
        }
    }
}

/// Found by review: a faked landlock_restrict_self was read back only through the signal scope,
/// so a policy with it off (one written for a kernel before ABI 6 must turn it off) ran the
/// role without Landlock, and the sandbox init's own domain was not read back at all. Both are
/// read back now by an access the domain handles and no rule grants: refused, no role starts.
#[test]
fn a_faked_landlock_is_caught_without_the_signal_scope() {
    for mode in common::modes() {
        for (act, said) in [
            // Either role's workload may be told first; the detail as tests/sandbox.rs takes it.
            (Above::FakeWorkloadLandlock, "role: (not in force as the kernel shows it"),
            (Above::FakeInitLandlock, "sandbox setup failed: confine_init"),
        ] {
            let f = Fixture::new(mode, "faked-landlock");
            for role in ["engine", "node"] {
                let p = f.p(&format!("policy/{role}.toml"));
                let text = std::fs::read_to_string(&p).expect("policy");
                assert!(text.contains("\nsignal = true"), "{role}.toml");
                std::fs::write(&p, text.replace("\nsignal = true", "\nsignal = false")).expect("policy");
            }
            let (code, out, met) = run_under_a_supervisor_above(&f, act);
            assert!(met, "{mode:?} {act:?}: nothing was faked: {out}");
            assert!(matches!(code, Some(125 | 6)), "{mode:?} {act:?}: {out}");
            assert!(out.contains(said) && !out.contains("role started"), "{mode:?} {act:?}: {out}");
            if act == Above::FakeWorkloadLandlock {
                assert!(
                    out.contains("sandbox setup failed: landlock: engine role: (not in force")
                        || out.contains("sandbox setup failed: landlock: node role: (not in force"),
                    "{mode:?}: {out}"
                );
            }
        }
    }
}

/// Found by test: a setup held at a call (here the first sandbox workload's setrlimit, in a
/// supervisor above sealnode that never answers) held `run` for ever, its stop signals
/// blocked. It is stopped at the setup's limit (60 s) and told at its step; no role starts.
#[test]
fn a_setup_held_at_a_call_is_stopped_and_told_at_its_step() {
    let f = Fixture::new(Mode::Rootless, "held-setup");
    let t = std::time::Instant::now();
    let (code, out, met) = run_under_a_supervisor_above(&f, Above::HoldWorkloadAtItsLimit);
    assert!(met, "nothing was held: {out}");
    assert!(matches!(code, Some(125 | 6)), "{out}");
    assert!(
        out.contains("rlimits: node role: its setup held at this step for 60 s, then stopped")
            || out.contains("rlimits: engine role: its setup held at this step for 60 s, then stopped"),
        "{out}"
    );
    assert!(t.elapsed() < std::time::Duration::from_secs(90), "{:?}", t.elapsed());
    assert!(!out.contains("role started"), "{out}");
}
