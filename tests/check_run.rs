//! `check` is `run` without the start (issue #27): every refusal `run` makes before a role
//! starts, `check` makes first, with the same verdict (exit 125) and the same words; and a setup
//! failure that is a config problem exits 125 from `run`, never the restartable 6.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::process::Command;
use std::time::Duration;

use common::*;

const HTTPD: &str = "exec /usr/bin/busybox httpd -f -p 127.0.0.1:18080 -h /models";
const NODE: &str = "echo node-up; exec sleep 1000";

/// The fixture of every case: busybox's httpd as the engine, a shell that says `node-up` as the
/// node; `engine_prog`/`node_prog` replace the program (paths inside the view).
fn fixture(mode: Mode, name: &str) -> Fixture {
    let mut f = Fixture::new(mode, name);
    let q = |s: &str| serde_json::to_string(s).expect("quote");
    f.engine_cmd = format!("[\"/usr/bin/busybox\", \"sh\", \"-c\", {}]", q(HTTPD));
    f.node_cmd = format!("[\"/usr/bin/busybox\", \"sh\", \"-c\", {}]", q(NODE));
    f.cell_extra = "stop_timeout_s = 2".into();
    f.write_config();
    f
}

/// What `run` does with the fixture: `Ok(())` when the node came up (then stopped), or its exit
/// code and stderr when it exited first.
fn run_verdict(f: &Fixture) -> Result<(), (Option<i32>, String)> {
    let cfg = f.config.display().to_string();
    run_verdict_of(f, f.command(&["run", "--config", &cfg]))
}

/// [`run_verdict`] of `cmd`, a `sealnode run` of the fixture's config started another way.
fn run_verdict_of(f: &Fixture, cmd: Command) -> Result<(), (Option<i32>, String)> {
    let run = start_logged_command(cmd);
    let pid = run.pid().as_raw();
    let up = || LoggedRun::text(&run.out).lines().any(|l| l.ends_with("node-up"));
    let exited = || std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z "));
    assert!(wait_until(Duration::from_secs(90), || up() || exited()), "{:?}: run neither started nor exited", f.mode);
    if up() {
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{err}");
        Ok(())
    } else {
        Err(run.exited(10))
    }
}

fn check_verdict(f: &Fixture) -> (Option<i32>, String) {
    let cfg = f.config.display().to_string();
    check_verdict_of(f.command(&["check", "--config", &cfg]))
}

/// [`check_verdict`] of `cmd`, a `sealnode check` started another way.
fn check_verdict_of(mut cmd: Command) -> (Option<i32>, String) {
    let o = cmd.output_within(COMMAND_LIMIT);
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
}

/// Both verdicts for the fixture: `run` refuses with 125 before any role starts, `check`
/// refuses with 125, and `check` says what `run` says (`words`, in both).
fn same_refusal(f: &Fixture, what: &str, words: &[&str]) {
    let (code, checked) = check_verdict(f);
    let ran = run_verdict(f);
    let ctx = format!("{:?} {what}", f.mode);
    assert_eq!(code, Some(125), "{ctx}: check:\n{checked}");
    let Err((run_code, err)) = ran else { panic!("{ctx}: run started the roles; check said:\n{checked}") };
    assert_eq!(run_code, Some(125), "{ctx}: run:\n{err}");
    assert!(!err.contains("role started"), "{ctx}: a role started:\n{err}");
    for w in words {
        assert!(checked.contains(w), "{ctx}: check does not say {w:?}:\n{checked}");
        assert!(err.contains(w), "{ctx}: run does not say {w:?}:\n{err}");
    }
}

/// `run` starts the roles and `check` passes.
fn both_start(f: &Fixture, what: &str) {
    let (code, checked) = check_verdict(f);
    assert_eq!(code, Some(0), "{:?} {what}: check:\n{checked}", f.mode);
    if let Err((code, err)) = run_verdict(f) {
        panic!("{:?} {what}: check passed, run exited {code:?}:\n{err}", f.mode);
    }
}

fn chmod(p: &std::path::Path, mode: u32) {
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// A busybox of our own in `rel` under the fixture (its dirs 0755, the file 0755 root's).
fn own_busybox(f: &Fixture, rel: &str) -> std::path::PathBuf {
    let p = f.p(rel);
    std::fs::create_dir_all(p.parent().expect("dir")).expect("mkdir");
    std::fs::copy("/usr/bin/busybox", &p).expect("copy busybox");
    chmod(&p, 0o755);
    p
}

/// The cases (#27 item 1), each a config `check` passed and `run` refused or failed on
/// (or the reverse), in both modes: now one verdict, with the same words.
#[test]
fn check_and_run_give_one_verdict() {
    for mode in modes() {
        // A program bound from under a directory only root may search (a 0700 home, where
        // pyenv installs an interpreter): the sandbox opens the bind as the role.
        let mut f = fixture(mode, "cr-private");
        own_busybox(&f, "private/bin/busybox");
        chmod(&f.p("private"), 0o700);
        f.node_extra = format!("ro_binds = [{{ src = \"{}\", dst = \"/opt/py\" }}]", f.p("private/bin").display());
        f.node_cmd = format!("[\"/opt/py/busybox\", \"sh\", \"-c\", \"{NODE}\"]");
        f.write_config();
        match mode {
            // Rootful: the role's uid cannot reach it (run exited 6, "open_sources ... EACCES").
            Mode::Rootful => same_refusal(&f, "a bind under a 0700 dir", &["node.ro_binds[0].src", "cannot reach it"]),
            // Rootless: the launcher itself cannot (the config check, before any plan).
            Mode::Rootless => {
                same_refusal(&f, "a bind under a 0700 dir", &["node.ro_binds[0].src", "Permission denied"])
            }
        }
        drop(f);

        // A capped scratch under a directory only root may search: the role binds the cell's
        // tmpfs by that path, so it cannot reach it either (found by review: `check` passed it,
        // and `run` failed in the wipe with "another host user's files", then in the start).
        let mut f = fixture(mode, "cr-capped-private");
        let owner = match mode {
            Mode::Rootful => Some(NODE_IDS),
            Mode::Rootless if is_root() => Some((NOBODY, NOBODY)),
            Mode::Rootless => None,
        };
        let scratch = f.p("private/node-scratch");
        std::fs::create_dir_all(&scratch).expect("mkdir");
        chmod(&scratch, 0o700);
        if let Some((u, g)) = owner {
            std::os::unix::fs::chown(&scratch, Some(u), Some(g)).expect("chown");
        }
        chmod(&f.p("private"), 0o700);
        f.node_extra = "scratch_max_mb = 4".into();
        f.write_config();
        let text = std::fs::read_to_string(&f.config).expect("config");
        let moved = text.replace(&f.p("node-scratch").display().to_string(), &scratch.display().to_string());
        assert_ne!(text, moved, "the scratch line was not found");
        std::fs::write(&f.config, moved).expect("config");
        let words = match mode {
            Mode::Rootful => ["node.scratch", "cannot reach it"],
            Mode::Rootless => ["node.scratch", "Permission denied"],
        };
        if is_root() {
            same_refusal(&f, "a capped scratch under a 0700 dir", &words);
        }
        if mode == Mode::Rootful {
            // `canary` runs no access check first: its setup failure says where to look.
            let cfg = f.config.display().to_string();
            let o = f.command(&["canary", "--config", &cfg]).output_within(COMMAND_LIMIT);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(125), "{err}");
            assert!(err.contains("not searchable") && err.contains("sealnode check"), "{err}");
        }
        drop(f);

        // A program reached through a symlink that only resolves in the role's view: the venv
        // case (bin/python -> the interpreter's prefix under a 0700 home, bound there with dst
        // from a copy). `check` must resolve it in the view as `run` does, and both start.
        let mut f = fixture(mode, "cr-venv");
        own_busybox(&f, "pycopy/busybox");
        std::fs::create_dir_all(f.p("private/prefix")).expect("mkdir");
        chmod(&f.p("private"), 0o700);
        std::fs::create_dir_all(f.p("venv/bin")).expect("mkdir");
        let prefix = f.p("private/prefix");
        std::os::unix::fs::symlink(prefix.join("busybox"), f.p("venv/bin/sh")).expect("symlink");
        f.node_extra = format!(
            "ro_binds = [{{ src = \"{}\", dst = \"{}\" }}, {{ src = \"{}\" }}]",
            f.p("pycopy").display(),
            prefix.display(),
            f.p("venv").display()
        );
        f.node_cmd = format!("[\"{}\", \"-c\", \"{NODE}\"]", f.p("venv/bin/sh").display());
        f.write_config();
        both_start(&f, "a venv whose interpreter resolves only in the view");
        drop(f);

        // The credential, owned by root and 0400: the node would run without it.
        let f = fixture(mode, "cr-cred");
        std::os::unix::fs::chown(f.p("credential"), Some(0), Some(0)).expect("chown");
        chmod(&f.p("credential"), 0o400);
        if is_root() {
            same_refusal(&f, "an unreadable credential", &["node.credential", "cannot read it", "mode 400"]);
        }
        drop(f);

        // A model file the engine's command names, 0600 root's: the engine would exit 1.
        let mut f = fixture(mode, "cr-model");
        chmod(&f.p("models/model.gguf"), 0o600);
        f.engine_cmd = format!("[\"/usr/bin/busybox\", \"sh\", \"-c\", \"{HTTPD}\", \"-m\", \"/models/model.gguf\"]");
        f.write_config();
        same_refusal(&f, "an unreadable model", &["engine.command[5]", "/models/model.gguf", "cannot read it"]);
        // And one that is not in the model dir at all, as `--model=`.
        f.engine_cmd = format!("[\"/usr/bin/busybox\", \"sh\", \"-c\", \"{HTTPD}\", \"--model=/models/nope.gguf\"]");
        f.write_config();
        same_refusal(&f, "a model not in the dir", &["engine.command[4]", "/models/nope.gguf is not in the model dir"]);
        drop(f);

        // The node's Landlock rules named by the engine (a swapped pair in one policy dir):
        // tighter for the engine, which then could not bind its port.
        let f = fixture(mode, "cr-swapped-rules");
        let text = std::fs::read_to_string(&f.config).expect("config");
        let engine_rules = format!("landlock = \"{}\"", f.p("policy/engine.toml").display());
        let node_rules = format!("landlock = \"{}\"", f.p("policy/node.toml").display());
        assert!(text.contains(&engine_rules), "{text}");
        std::fs::write(&f.config, text.replace(&engine_rules, &node_rules)).expect("config");
        same_refusal(&f, "the node's rules named by the engine", &["node.toml", "written for the node role"]);
        drop(f);

        // A world-writable engine program (mode 757), unpinned.
        let mut f = fixture(mode, "cr-ww");
        let prog = own_busybox(&f, "ebin/busybox");
        chmod(&prog, 0o757);
        f.engine_extra = format!("ro_binds = [{{ src = \"{}\", dst = \"/opt/e\" }}]", f.p("ebin").display());
        f.engine_cmd = format!("[\"/opt/e/busybox\", \"sh\", \"-c\", \"{HTTPD}\"]");
        f.write_config();
        same_refusal(&f, "a world-writable program", &["engine.command[0]", "writable by group or others"]);
        drop(f);

        // A device the role cannot open (rootful: root's 0600 node under /dev).
        if mode == Mode::Rootful {
            let mut f = fixture(mode, "cr-dev");
            let dev = std::path::PathBuf::from(format!("/dev/sealnode-test-null-{}", std::process::id()));
            mknod_char(&dev, 0o600, 1, 3);
            f.engine_extra = format!("devices = [\"{}\"]", dev.display());
            f.write_config();
            same_refusal(&f, "an unopenable device", &["engine.devices[0]", "cannot open it for reading and writing"]);
            // Readable and writable by all: both start.
            chmod(&dev, 0o666);
            both_start(&f, "an openable device");
            let _ = std::fs::remove_file(&dev);
        }
    }
}

/// Issue #27 item 5: `check` of a rootful config by another user than root says that this is
/// rootless mode, where `cell.rootful` is ignored, next to the problem that follows from it.
#[test]
fn a_rootful_config_checked_as_another_user_says_rootless() {
    if !is_root() {
        return unavailable("rootful", "the rootful fixture's dirs belong to its role users (made by root)");
    }
    let f = fixture(Mode::Rootful, "cr-rootless-hint");
    let o = std::process::Command::new("/usr/bin/setpriv")
        .args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
        .arg(&f.bin)
        .args(["check", "--config", &f.config.display().to_string()])
        .output_within(COMMAND_LIMIT);
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(o.status.code(), Some(125), "{out}");
    assert!(out.contains("you are uid 65534, not root, so this is rootless mode: cell.rootful is ignored"), "{out}");
}

/// The fixture's sealnode with `args`, as uid 65534 in a user namespace of its own that maps
/// only that uid and gid, as a container with `runAsUser: 65534` and `hostUsers: false` runs
/// it: every other host uid (61001 too) reads there as 65534, the overflow uid.
fn in_partial_userns(f: &Fixture, args: &[&str]) -> Command {
    let mut c = Command::new("/usr/bin/setpriv");
    c.args(["--reuid", "65534", "--regid", "65534", "--clear-groups", "--"])
        .args(["/usr/bin/unshare", "-U", "--map-user=65534", "--map-group=65534", "--"])
        .arg(&f.bin)
        .args(args)
        .current_dir(&f.dir);
    c
}

/// The fixture's sealnode with `args`, as root in a user namespace of its own that maps only
/// root (`unshare -U --map-root-user`): every other host uid reads there as 65534.
fn as_root_in_partial_userns(f: &Fixture, args: &[&str]) -> Command {
    let mut c = Command::new("/usr/bin/unshare");
    c.args(["-U", "--map-root-user", "--"]).arg(&f.bin).args(args).current_dir(&f.dir);
    c
}

/// Found by the independent review: as the overflow uid of a user namespace that leaves host
/// uids unmapped, every unmapped host user read as sealnode's own uid, in file owners and on
/// the control socket (host uid 61001 got status, recycle and a signed statement; a policy in
/// its dir passed `check`). Both `check` and `run` refuse there with 125, naming the reason
/// and the fix, nothing started, and so they do with a policy in a dir of host uid 61001. The
/// same config as uid 65534 in the initial namespace (the rootless mode) still starts.
#[test]
fn the_overflow_uid_in_a_partial_user_namespace_is_refused() {
    if !is_root() {
        return unavailable("rootful", "the test runs sealnode as uid 65534 (setpriv) in a user namespace of its own");
    }
    let f = fixture(Mode::Rootless, "cr-overflow");
    let tried = in_partial_userns(&f, &["--version"]).output_within(COMMAND_LIMIT);
    if !tried.status.success() {
        return unavailable("userns", &format!("unshare -U as uid 65534: {}", String::from_utf8_lossy(&tried.stderr)));
    }
    let words = ["overflow uid", "every host user the namespace does not map reads as this id", "runAsUser"];
    let refused = |f: &Fixture, what: &str| {
        let cfg = f.config.display().to_string();
        let (code, checked) = check_verdict_of(in_partial_userns(f, &["check", "--config", &cfg]));
        assert_eq!(code, Some(125), "{what}: check:\n{checked}");
        let Err((run_code, err)) = run_verdict_of(f, in_partial_userns(f, &["run", "--config", &cfg])) else {
            panic!("{what}: run started the roles; check said:\n{checked}")
        };
        assert_eq!(run_code, Some(125), "{what}: run:\n{err}");
        assert!(!err.contains("role started"), "{what}: a role started:\n{err}");
        assert!(!f.p("run/control.sock").exists(), "{what}: the control socket was made");
        for w in words {
            assert!(checked.contains(w), "{what}: check does not say {w:?}:\n{checked}");
            assert!(err.contains(w), "{what}: run does not say {w:?}:\n{err}");
        }
    };
    refused(&f, "as the overflow uid");
    // The same config in the initial namespace, where uid 65534 is only nobody: it starts.
    both_start(&f, "as uid 65534 in the initial namespace");

    // The engine's policy in a dir of host uid 61001, which the namespace does not map.
    let f = fixture(Mode::Rootless, "cr-overflow-owner");
    std::fs::create_dir(f.p("theirs")).expect("mkdir");
    std::fs::copy(f.p("policy/engine.json"), f.p("theirs/engine.json")).expect("copy");
    std::os::unix::fs::chown(f.p("theirs"), Some(ENGINE_IDS.0), Some(ENGINE_IDS.1)).expect("chown");
    let text = std::fs::read_to_string(&f.config).expect("config");
    let moved = text.replace(
        &format!("{}/policy/engine.json", f.dir.display()),
        &format!("{}/theirs/engine.json", f.dir.display()),
    );
    std::fs::write(&f.config, moved).expect("config");
    refused(&f, "a policy in an unmapped user's dir");
    let (code, checked) = check_verdict(&f);
    assert_eq!(code, Some(125), "in the initial namespace: {checked}");
    assert!(checked.contains("engine.seccomp") && checked.contains("owned by another user"), "{checked}");
}

/// `cell.control_uids` naming the overflow uid, where the namespace leaves host uids unmapped,
/// would admit every unmapped host user to the control socket: `check` and `run` refuse it
/// with 125, naming the field and the reason, nothing started.
#[test]
fn control_uids_naming_the_overflow_uid_in_a_partial_user_namespace_are_refused() {
    if !is_root() {
        return unavailable("rootful", "the test runs sealnode as root in a user namespace that maps only root");
    }
    let mut f = fixture(Mode::Rootful, "cr-overflow-control");
    f.cell_extra = format!("{}\ncontrol_uids = [0, 65534]", f.cell_extra);
    f.write_config();
    let tried = as_root_in_partial_userns(&f, &["--version"]).output_within(COMMAND_LIMIT);
    if !tried.status.success() {
        return unavailable("userns", &format!("unshare -U: {}", String::from_utf8_lossy(&tried.stderr)));
    }
    let cfg = f.config.display().to_string();
    let (code, checked) = check_verdict_of(as_root_in_partial_userns(&f, &["check", "--config", &cfg]));
    assert_eq!(code, Some(125), "check:\n{checked}");
    let Err((run_code, err)) = run_verdict_of(&f, as_root_in_partial_userns(&f, &["run", "--config", &cfg])) else {
        panic!("run started the roles; check said:\n{checked}")
    };
    assert_eq!(run_code, Some(125), "run:\n{err}");
    assert!(!err.contains("role started"), "a role started:\n{err}");
    for w in ["cell.control_uids[1]", "uid 65534 is the overflow uid", "every host user the namespace does not map"] {
        assert!(checked.contains(w), "check does not say {w:?}:\n{checked}");
        assert!(err.contains(w), "run does not say {w:?}:\n{err}");
    }
}

/// Found by the review of #27: the model path the command names is resolved beneath the model
/// dir, as the engine finds it under /models: `//` is the dir itself, a symlink out of the dir
/// is refused by both, the form `-m/models/X` is checked too.
#[test]
fn model_paths_are_resolved_beneath_the_model_dir() {
    for mode in modes() {
        let mut f = fixture(mode, "cr-models");
        let engine = |arg: &str| format!("[\"/usr/bin/busybox\", \"sh\", \"-c\", \"{HTTPD}\", \"{arg}\"]");
        f.engine_cmd = engine("--model=/models//model.gguf");
        f.write_config();
        both_start(&f, "a model path with //");
        f.engine_cmd = engine("--model=/models//etc/hostname");
        f.write_config();
        same_refusal(&f, "a // path naming a host file", &["engine.command[4]", "is not in the model dir"]);
        std::os::unix::fs::symlink(f.p("host-secret"), f.p("models/out.gguf")).expect("symlink");
        f.engine_cmd = engine("-m/models/out.gguf");
        f.write_config();
        same_refusal(&f, "a symlink out of the model dir", &["engine.command[4]", "leads out of the model dir"]);
    }
}

/// Found by the review of #27: any local user could hold the flock of a dir others can read
/// and keep every start refused. The state dir (shipped 0755) is locked through its own 0600
/// lock file only; a scratch dir others can read is refused (they could lock it).
#[test]
fn a_local_user_cannot_lock_a_cell_out() {
    if !is_root() {
        return unavailable("rootful", "the test holds a flock as another uid and chmods the fixture's dirs");
    }
    for mode in modes() {
        let f = fixture(mode, "cr-flock");
        chmod(&f.p("state"), 0o755);
        chmod(&f.p("run"), 0o755);
        let mut holders = vec![flock_as("1000", &f.p("state")), flock_as("1000", &f.p("run"))];
        // The holders have their locks before the start (flock takes them at once).
        assert!(wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string("/proc/locks").is_ok_and(|l| l.lines().filter(|x| x.contains("FLOCK")).count() >= 2)
        }));
        both_start(&f, "state and runtime dirs flocked by another user");
        // A scratch dir others can read: refused, naming the fix.
        chmod(&f.p("node-scratch"), 0o755);
        same_refusal(
            &f,
            "a scratch dir others can read",
            &["node.scratch", "not be readable or writable by group or others"],
        );
        for h in &mut holders {
            let _ = h.kill();
            let _ = h.wait();
        }
    }
}

/// A scratch dir's owner (the role's host user) can hold its flock from the host, as anyone
/// who can open a dir can: the start is refused, and the refusal names the process that holds
/// it, not "another running sealnode" (found by review: the operator was sent looking for a
/// second cell that did not exist).
#[test]
fn a_scratch_dir_held_by_another_process_is_refused_naming_it() {
    use std::os::unix::fs::MetadataExt;
    if !is_root() {
        return unavailable("rootful", "the test holds a flock as the scratch dir's owner");
    }
    for mode in modes() {
        let f = fixture(mode, "cr-flock-scratch");
        let uid = std::fs::metadata(f.p("node-scratch")).expect("scratch").uid().to_string();
        let mut holder = flock_as(&uid, &f.p("node-scratch"));
        let sleeper = wait_until(Duration::from_secs(10), || {
            std::fs::read_to_string(format!("/proc/{}/task/{}/children", holder.id(), holder.id()))
                .is_ok_and(|c| !c.trim().is_empty())
        });
        assert!(sleeper, "{mode:?}: flock did not take the lock");
        let Err((code, err)) = run_verdict(&f) else { panic!("{mode:?}: run started with the scratch dir held") };
        let _ = holder.kill();
        let _ = holder.wait();
        assert_eq!(code, Some(125), "{mode:?}: {err}");
        assert!(
            err.contains(&format!(
                "node.scratch: {} is in use by pid {} (flock, uid {uid}), which is not a sealnode",
                f.p("node-scratch").display(),
                holder.id()
            )),
            "{mode:?}: {err}"
        );
        assert!(!err.contains("role started"), "{mode:?}: {err}");
    }
}

/// `flock -x DIR sleep 60` as `uid` (and that gid): a process of another user holding the
/// dir's flock, as anyone who can open it can.
fn flock_as(uid: &str, dir: &std::path::Path) -> std::process::Child {
    std::process::Command::new("/usr/bin/setpriv")
        .args(["--reuid", uid, "--regid", uid, "--clear-groups", "--", "/usr/bin/flock", "-x"])
        .arg(dir)
        .args(["/bin/sleep", "60"])
        .spawn()
        .expect("flock")
}

/// Found by the review of #27: the scratch dir renamed while the cell ran; a restart bound the
/// new dir at the old path (which another cell could then lock) while the wipes went on in the
/// renamed one. The restart is refused, naming the field.
#[test]
fn a_scratch_dir_replaced_while_running_refuses_the_restart() {
    for mode in modes() {
        let mut f = fixture(mode, "cr-rename");
        f.engine_extra = "restart = \"on-failure\"".into();
        f.write_config();
        let run = start_logged(&f, &[]);
        run.out_line(60, |l| l.ends_with("node-up"));
        let old = f.p("engine-scratch");
        std::fs::rename(&old, f.p("engine-scratch.moved")).expect("rename");
        std::fs::create_dir(&old).expect("mkdir");
        chmod(&old, 0o700);
        let owner = std::fs::metadata(f.p("engine-scratch.moved")).expect("stat");
        use std::os::unix::fs::MetadataExt;
        std::os::unix::fs::chown(&old, Some(owner.uid()), Some(owner.gid())).expect("chown");
        // The engine crashes: its restart passes the gate again.
        let engine = LoggedRun::text(&run.err)
            .lines()
            .filter_map(|l| l.split("role started role=engine pid=").nth(1))
            .filter_map(|r| r.split_whitespace().next()?.parse::<i32>().ok())
            .next_back()
            .expect("the engine's pid");
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(engine), nix::sys::signal::Signal::SIGKILL).expect("kill");
        let (code, err) = run.exited(60);
        assert_eq!(code, Some(125), "{mode:?}: {err}");
        assert!(
            err.contains("engine.scratch") && err.contains("is no longer the dir this `sealnode run` locked"),
            "{mode:?}: {err}"
        );
    }
}

/// Found while writing `sealnode init`: a role's rlimit above sealnode's own hard limit passed
/// `check`, and the sandbox then failed to set it (EPERM), a preflight that "could not run"
/// (6), which systemd restarts for ever. Both refuse it now, naming the field.
#[test]
fn an_rlimit_above_the_launchers_hard_limit_is_refused_by_both() {
    let (_, hard) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).expect("getrlimit");
    // Linux caps RLIMIT_NOFILE at fs.nr_open: never infinite.
    assert_ne!(hard, nix::libc::RLIM_INFINITY);
    for mode in modes() {
        let mut f = fixture(mode, "cr-rlimit");
        f.engine_extra = format!("rlimits = {{ nofile = {} }}", hard + 1);
        f.write_config();
        same_refusal(&f, "nofile above the hard limit", &["engine.rlimits.nofile", "above sealnode's own hard limit"]);
    }
}

/// With a role's `log_refused_syscalls`, `check` and `run` try pidfd_getfd (what the denial
/// log takes each role's seccomp listener with) as the supervisor makes it, on a process of
/// their own making: under a seccomp filter that refuses it, as a unit's SystemCallFilter=
/// may, however it refuses (EPERM for all, EPERM for all but fd 0, a kill), check refuses the
/// config and `run` refuses to start, exit 125, naming the drop-in, before any role starts.
#[test]
fn check_and_run_try_the_denial_logs_pidfd_getfd() {
    for mode in modes() {
        let mut f = fixture(mode, "cr-pidfd");
        let cfg = f.config.display().to_string();
        f.engine_extra = "log_refused_syscalls = true".into();
        f.write_config();
        let (code, out) = check_verdict(&f);
        assert_eq!(code, Some(0), "{mode:?}: {out}");
        assert!(out.contains("pidfd_getfd allowed"), "{mode:?}: {out}");
        for how in [Refusal::Blanket, Refusal::ButFdZero, Refusal::Kill] {
            let ctx = format!("{mode:?} {how:?}");
            let said = match how {
                Refusal::Kill => "pidfd_getfd killed the process (SIGSYS)",
                Refusal::Blanket | Refusal::ButFdZero => "pidfd_getfd refused (EPERM",
            };
            f.engine_extra = "log_refused_syscalls = true".into();
            f.node_extra = String::new();
            f.write_config();
            let (code, out) = under_filter(&f, how, &["check", "--config", &cfg], COMMAND_LIMIT);
            assert_eq!(code, Some(125), "{ctx}: {out}");
            assert!(out.contains(said) && out.contains("SystemCallFilter=pidfd_getfd"), "{ctx}: {out}");
            // `run` refuses the same before anything starts, with the node's log too (found by
            // a docs audit: the node's spawn failed once the engine ran, exit 1, which a unit
            // restarts rather than stopping on a config error, 125).
            f.engine_extra = String::new();
            f.node_extra = "log_refused_syscalls = true".into();
            f.write_config();
            let (code, err) = under_filter(&f, how, &["run", "--config", &cfg], Duration::from_secs(60));
            assert_eq!(code, Some(125), "{ctx}: {err}");
            assert!(err.contains(said) && err.contains("SystemCallFilter=pidfd_getfd"), "{ctx}: {err}");
            assert!(!err.contains("role started") && !err.contains("preflight"), "{ctx}: something started: {err}");
        }
    }
}

/// A reload that turns a role's denial log on where pidfd_getfd is refused (for all fds but 0,
/// or by a kill) is refused itself, before any role stops, naming the drop-in; the cell runs
/// on (found by a docs audit: the check came at the role's spawn, after the old roles were
/// stopped; then by review: the probe passed a filter keyed on the fd, and a killing filter
/// killed the running cell).
#[test]
fn a_reload_that_needs_pidfd_getfd_where_it_is_refused_changes_nothing() {
    use std::os::unix::process::CommandExt;
    for (mode, how) in modes().into_iter().flat_map(|m| [(m, Refusal::ButFdZero), (m, Refusal::Kill)]) {
        let ctx = format!("{mode:?} {how:?}");
        let mut f = fixture(mode, "cr-pidfd-reload");
        let cfg = f.config.display().to_string();
        let mut cmd = f.command(&["run", "--config", &cfg]);
        let bpf = filter_of_pidfd_getfd(how);
        // SAFETY: between fork and exec only prctl and seccomp run; only a failure (which
        // fails the test) allocates its message.
        unsafe {
            cmd.pre_exec(move || seccompiler::apply_filter(&bpf).map_err(|e| std::io::Error::other(e.to_string())));
        }
        let run = start_logged_command(cmd);
        run.out_line(60, |l| l.ends_with("node-up"));
        // Its log line read too (stdout and stderr are read apart).
        run.err_line(60, |l| l.contains("role started role=node"));
        let started = run.stderr().matches("role started").count();
        f.node_extra = "log_refused_syscalls = true".into();
        f.write_config();
        nix::sys::signal::kill(run.pid(), nix::sys::signal::Signal::SIGHUP).expect("SIGHUP");
        run.err_line(60, |l| l.contains("SystemCallFilter=pidfd_getfd"));
        assert!(run.stderr().contains("SIGHUP: reload refused"), "{ctx}: {}", run.stderr());
        let st = f.command(&["ctl", "--config", &cfg, "status", "--json"]).output_within(COMMAND_LIMIT);
        let st: serde_json::Value = serde_json::from_slice(&st.stdout).expect("status");
        let (code, _, err) = run.stop();
        assert_eq!(st["reload"]["ok"], false, "{ctx}: {st}");
        assert!(st["reload"]["error"].as_str().is_some_and(|e| e.contains("SystemCallFilter=pidfd_getfd")), "{st}");
        assert_eq!(st["ready"], true, "{ctx}: the cell does not run on: {st}");
        assert_eq!(err.matches("role started").count(), started, "{ctx}: a role restarted: {err}");
        assert!(!err.contains("draining"), "{ctx}: a role was stopped for it: {err}");
        assert_eq!(code, Some(0), "{ctx}: {err}");
    }
}

/// A tracer that holds pidfd_getfd (strace's delay, as a debugger or a supervisor's tracer
/// may hold a call; a seccomp listener cannot: the denial log needs the only one) holds the
/// denial log's probe at a start; the probe holds nothing of sealnode's (its stdio and its own
/// pipe, no signal blocked), and it and the process it made die with sealnode: a sealnode
/// killed meanwhile leaves nothing behind, and the next `run` starts (found by review: the
/// prober kept sealnode's fds, its dir locks among them, and its blocked signals, had no death
/// signal, and outlived a killed sealnode, so the next start was refused).
#[test]
fn a_held_denial_log_probe_holds_nothing_of_sealnode_and_dies_with_it() {
    if which("strace").is_none() {
        return unavailable("strace", "it holds the denial log's probe in pidfd_getfd (scripts/test installs it)");
    }
    for mode in modes() {
        let mut f = fixture(mode, "cr-pidfd-held");
        let cfg = f.config.display().to_string();
        f.node_extra = "log_refused_syscalls = true".into();
        f.write_config();
        let sealnode = f.command(&["run", "--config", &cfg]);
        let mut cmd = Command::new("strace");
        // 60 s held at the call's entry: far past the probe's own bound (2 s), which only a
        // living sealnode keeps.
        cmd.args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=pidfd_getfd"])
            .args(["-e", "inject=pidfd_getfd:delay_enter=60000000"])
            .arg(sealnode.get_program())
            .args(sealnode.get_args())
            .current_dir(&f.dir);
        let run = start_logged_command(cmd);
        // sealnode (strace's child) and its prober, its child held in pidfd_getfd.
        let (mut supervisor, mut prober) = (0, 0);
        let held = wait_until(Duration::from_secs(60), || {
            supervisor = children(run.pid().as_raw()).first().copied().unwrap_or(0);
            prober = children(supervisor).into_iter().find(|c| in_syscall(*c, libc::SYS_pidfd_getfd)).unwrap_or(0);
            prober != 0
        });
        assert!(held, "{mode:?}: no child of sealnode waits in pidfd_getfd: {}", run.stderr());
        let target = children(prober);
        assert_eq!(target.len(), 1, "{mode:?}: the prober's children: {target:?}");
        for p in [prober, target[0]] {
            let fds: Vec<String> = std::fs::read_dir(format!("/proc/{p}/fd"))
                .expect("fds")
                .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
                .map(|l| l.display().to_string())
                .collect();
            // Beyond its stdio: the pipe it holds for the probe, and the prober its pidfd of
            // its child.
            let own: Vec<&String> =
                fds.iter().skip(3).filter(|l| !(p == prober && *l == "anon_inode:[pidfd]")).collect();
            assert!(own.len() == 1 && own[0].starts_with("pipe:"), "{mode:?}: {p} holds {fds:?}");
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).expect("status");
            assert!(status.lines().any(|l| l == "SigBlk:\t0000000000000000"), "{mode:?}: {p}: {status}");
        }
        let pid = nix::unistd::Pid::from_raw(supervisor);
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL).expect("kill sealnode");
        // Its death signal reaches the prober while the call is held (a traced process takes
        // it when its tracer lets it go; a process a filter holds, at once).
        let told = wait_until(Duration::from_secs(2), || !alive(prober) || sigkill_pending(prober));
        assert!(told, "{mode:?}: the prober {prober} was not told of sealnode's death");
        // strace gone, the call is let go: the prober dies of it, and its child with it.
        drop(run);
        let gone = wait_until(Duration::from_secs(2), || !alive(prober) && !alive(target[0]));
        assert!(gone, "{mode:?}: the prober {prober} or its child {} outlived sealnode", target[0]);
        // Nothing of the killed start holds the cell: the next one starts.
        if let Err((code, err)) = run_verdict(&f) {
            panic!("{mode:?}: the start after a killed one exited {code:?}:\n{err}");
        }
    }
}

/// The pids of `pid`'s children (every thread's).
fn children(pid: i32) -> Vec<i32> {
    let tasks: Vec<_> =
        std::fs::read_dir(format!("/proc/{pid}/task")).map(|d| d.flatten().collect()).unwrap_or_default();
    tasks
        .iter()
        .filter_map(|t| std::fs::read_to_string(t.path().join("children")).ok())
        .flat_map(|s| s.split_whitespace().filter_map(|p| p.parse().ok()).collect::<Vec<i32>>())
        .collect()
}

/// Whether `pid` has a SIGKILL pending (for it or its process).
fn sigkill_pending(pid: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .filter_map(|l| l.strip_prefix("SigPnd:\t").or(l.strip_prefix("ShdPnd:\t")))
        .any(|m| u64::from_str_radix(m, 16).is_ok_and(|m| m & (1 << (libc::SIGKILL - 1)) != 0))
}

/// Whether `pid` is in the system call `nr` (its /proc syscall file).
fn in_syscall(pid: i32, nr: libc::c_long) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/syscall"))
        .is_ok_and(|s| s.split_whitespace().next() == Some(nr.to_string().as_str()))
}

/// How a filter above sealnode refuses pidfd_getfd.
#[derive(Clone, Copy, Debug)]
enum Refusal {
    /// EPERM for every call, as systemd's SystemCallFilter=~@debug with
    /// SystemCallErrorNumber=EPERM (the units) does.
    Blanket,
    /// EPERM unless the fd asked for is 0 (found by review: a probe copying its own fd 0
    /// passed, and the listener's copy failed once the engine ran).
    ButFdZero,
    /// The process killed (SIGSYS), as SystemCallFilter= without SystemCallErrorNumber= does
    /// (found by review: `check` died silently, and a reload killed the running cell).
    Kill,
}

/// A seccomp filter that refuses pidfd_getfd as `how` says and allows the rest.
fn filter_of_pidfd_getfd(how: Refusal) -> seccompiler::BpfProgram {
    use seccompiler::{SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompRule};
    let rule = match how {
        Refusal::ButFdZero => {
            vec![SeccompRule::new(vec![
                SeccompCondition::new(1, SeccompCmpArgLen::Dword, SeccompCmpOp::Ne, 0).expect("condition")
            ])
            .expect("rule")]
        }
        Refusal::Blanket | Refusal::Kill => vec![],
    };
    let rules = [(libc::SYS_pidfd_getfd, rule)].into_iter().collect();
    let refused = match how {
        Refusal::Kill => seccompiler::SeccompAction::KillProcess,
        Refusal::Blanket | Refusal::ButFdZero => seccompiler::SeccompAction::Errno(libc::EPERM as u32),
    };
    let arch = std::env::consts::ARCH.try_into().expect("arch");
    let filter =
        seccompiler::SeccompFilter::new(rules, seccompiler::SeccompAction::Allow, refused, arch).expect("filter");
    filter.try_into().expect("bpf")
}

/// `args` of sealnode under a filter that refuses pidfd_getfd as `how` says: exit code, output.
fn under_filter(f: &Fixture, how: Refusal, args: &[&str], limit: Duration) -> (Option<i32>, String) {
    use std::os::unix::process::CommandExt;
    let mut cmd = f.command(args);
    let bpf = filter_of_pidfd_getfd(how);
    // SAFETY: between fork and exec only prctl and seccomp run; only a failure (which fails the
    // test) allocates its message.
    unsafe {
        cmd.pre_exec(move || seccompiler::apply_filter(&bpf).map_err(|e| std::io::Error::other(e.to_string())));
    }
    let o = cmd.output_within(limit);
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr))
}

/// The config and the node's policies in a ConfigMap volume, the credential in a Secret volume,
/// each exactly as kubelet lays them out and mounts them: the ConfigMap's root 0777 and bound
/// read-only, the Secret a 1777 tmpfs bound read-only, the files behind `..data` links. `check`
/// passes and `run` starts, both in a mount namespace of their own where the volumes are; the
/// same ConfigMap through its read-write path (0777) is refused by both, naming the directory.
/// kubelet writes a Secret's files as root; the credential here belongs to the node's user, as
/// sealnode's credential rule asks (docs/config.md, "Files sealnode trusts").
#[test]
fn a_configmap_and_a_secret_volume_are_trusted_read_only() {
    if !is_root() {
        return unavailable("rootful", "read-only bind mounts in a private mount namespace need root");
    }
    for mode in modes() {
        let mut f = fixture(mode, "cr-configmap");
        let node_sh = format!("echo cred=$(cat /run/sealnode/credential); {NODE}");
        f.node_cmd =
            format!("[\"/usr/bin/busybox\", \"sh\", \"-c\", {}]", serde_json::to_string(&node_sh).expect("quote"));
        f.write_config();
        let d = f.dir.display().to_string();
        let (cm, cm_src, secret, secret_src) = (f.p("cm"), f.p("cm-src"), f.p("secret"), f.p("secret-src"));
        for dir in [&cm, &cm_src, &secret, &secret_src] {
            std::fs::create_dir(dir).expect("mkdir");
            chmod(dir, 0o755);
        }
        let text = std::fs::read_to_string(&f.config)
            .expect("config")
            .replace(&format!("{d}/credential\""), &format!("{}\"", secret.join("credential").display()))
            .replace(&format!("{d}/policy/node."), &format!("{}/node.", cm.display()));
        let policy = |ext: &str| std::fs::read(f.p(&format!("policy/node.{ext}"))).expect("policy");
        let (json, toml) = (policy("json"), policy("toml"));
        let file = |name, contents, mode| VolumeFile { name, contents, mode, owner: None };
        kubelet_volume(
            &cm_src,
            &[
                file("sealnode.toml", text.as_bytes(), 0o644),
                file("node.json", &json, 0o644),
                file("node.toml", &toml, 0o644),
            ],
        );
        chmod(&cm_src, 0o777);
        // The Secret is staged on disk and copied (links, owners, modes) into its tmpfs.
        let node = if mode == Mode::Rootful { NODE_IDS } else { (NOBODY, NOBODY) };
        let cred =
            VolumeFile { name: "credential", contents: b"node-credential-token\n", mode: 0o400, owner: Some(node) };
        kubelet_volume(&secret_src, &[cred]);
        let volumes = format!(
            "mount --bind {src} {cm} && mount -o remount,bind,ro {cm} && \
             mount -t tmpfs -o mode=1777,size=1m tmpfs {secret} && cp -a {ssrc}/. {secret} && \
             mount -o remount,ro {secret}",
            src = cm_src.display(),
            cm = cm.display(),
            secret = secret.display(),
            ssrc = secret_src.display()
        );
        let prefix =
            format!("exec /usr/bin/unshare -m --propagation private /bin/sh -c '{volumes} && exec \"$@\"' sh \"$@\"; ");
        f.config = cm.join("sealnode.toml");
        let cfg = f.config.display().to_string();
        let check = f.command(&["check", "--config", &cfg]);
        let o = Command::new("/bin/sh")
            .arg("-c")
            .arg(format!("{prefix}exec \"$@\""))
            .arg("sh")
            .arg(check.get_program())
            .args(check.get_args())
            .current_dir(&f.dir)
            .output_within(COMMAND_LIMIT);
        let said = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{mode:?}: check refused the volumes:\n{said}");
        let run = start_logged_in_shell(&f, &[], &prefix);
        run.out_line(90, |l| l == "node-up");
        // The node reads the Secret's credential at /run/sealnode/credential.
        let read = LoggedRun::text(&run.out).lines().any(|l| l == "cred=node-credential-token");
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
        assert!(read, "{mode:?}: the node did not read the Secret's credential:\n{err}");
        // The ConfigMap's own dir, read-write and 0777: refused, by `check` and `run` alike.
        f.config = cm_src.join("sealnode.toml");
        let want = format!("directory {} is writable by group or others", cm_src.display());
        let (code, checked) = check_verdict(&f);
        assert_eq!(code, Some(125), "{mode:?}: check:\n{checked}");
        assert!(checked.contains(&want) && checked.contains("read-write mount"), "{mode:?}: {checked}");
        let Err((code, err)) = run_verdict(&f) else { panic!("{mode:?}: run started from a 0777 read-write dir") };
        assert_eq!(code, Some(125), "{mode:?}: {err}");
        assert!(err.contains(&want), "{mode:?}: {err}");
        f.config = f.p("sealnode.toml");
    }
}

/// The node's credential reached through a link (the shape a Secret volume's is) into the
/// engine's model dir: the engine could read it. Refused by where the link leads, not only by
/// the name in the config (found in review: a link into the engine's writable model dir passed).
#[test]
fn a_credential_linked_into_the_engines_model_dir_is_refused() {
    for mode in modes() {
        let f = fixture(mode, "cred-link");
        let real = f.p("models/cred");
        std::fs::rename(f.p("credential"), &real).expect("move the credential");
        std::os::unix::fs::symlink("models/cred", f.p("credential")).expect("link");
        same_refusal(
            &f,
            "a credential linked into the model dir",
            &["node.credential", "engine.models", "another role can read"],
        );
    }
}

/// Found by review: a bind mount of the credential, or of the attestation key, onto a file in
/// the engine's model dir keeps one name and one link, and the engine read it; so did an
/// overlay whose lower layer holds the credential. A mount showing either elsewhere is refused
/// (the mount table is read at load and at every start), and every entry of the trees a role
/// sees is compared with them by (device, inode): check and run refuse alike.
#[test]
fn a_credential_or_key_bound_into_the_model_dir_is_refused() {
    if !is_root() {
        return unavailable("rootful", "bind mounts need root");
    }
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = nix::mount::umount2(&self.0, nix::mount::MntFlags::MNT_DETACH);
        }
    }
    use nix::mount::{mount, MsFlags};
    for mode in modes() {
        let f = fixture(mode, "cred-bind");
        let cfg = f.config.display().to_string();
        let o = f.command(&["attest", "init", "--config", &cfg]).output_within(COMMAND_LIMIT);
        assert!(o.status.success(), "{mode:?}: attest init: {}", String::from_utf8_lossy(&o.stderr));
        // `src` bound at `at` in the model dir (a file or a dir, as `src` is): refused, saying `words`.
        let refused_bound = |src: std::path::PathBuf, at: &str, words: &[&str]| {
            let at = f.p(at);
            if src.is_dir() {
                std::fs::create_dir(&at).expect("mount point");
            } else {
                std::fs::write(&at, "").expect("mount point");
            }
            mount(Some(&src), &at, None::<&str>, MsFlags::MS_BIND, None::<&str>).expect("bind");
            let guard = Unmount(at.clone());
            same_refusal(&f, &format!("{} bound at {}", src.display(), at.display()), words);
            drop(guard);
            let _ = std::fs::remove_file(&at).or_else(|_| std::fs::remove_dir(&at));
        };
        refused_bound(f.p("credential"), "models/leak", &["node.credential", "is also shown at", "models/leak"]);
        let key = f.p("state/attest/ed25519.key");
        refused_bound(key, "models/leak", &["attestation key", "is also shown at", "models/leak"]);
        // The state dir, before any key is made there (attest init while the cell runs).
        refused_bound(f.p("state"), "models/st", &["cell.state_dir", "is also shown at", "models/st"]);
        // A bind no role sees is no exposure: the credential bound from a private dir onto the
        // path the config names (systemd's BindReadOnlyPaths=) starts.
        let private = f.p("private");
        std::fs::create_dir(&private).expect("mkdir");
        std::fs::set_permissions(&private, std::fs::Permissions::from_mode(0o700)).expect("chmod");
        std::fs::copy(f.p("credential"), private.join("cred")).expect("copy");
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(f.p("credential")).expect("stat");
        std::os::unix::fs::chown(private.join("cred"), Some(md.uid()), Some(md.gid())).expect("chown");
        std::fs::set_permissions(private.join("cred"), std::fs::Permissions::from_mode(0o400)).expect("chmod");
        mount(Some(&private.join("cred")), &f.p("credential"), None::<&str>, MsFlags::MS_BIND, None::<&str>)
            .expect("bind");
        let guard = Unmount(f.p("credential"));
        both_start(&f, "the credential bound from a dir no role sees");
        drop(guard);
        // An overlay whose lower layer holds the credential, in the model dir.
        let lower = f.p("lower");
        std::fs::create_dir(&lower).expect("mkdir");
        std::fs::rename(f.p("credential"), lower.join("credential")).expect("move");
        std::os::unix::fs::symlink("lower/credential", f.p("credential")).expect("link");
        let text = std::fs::read_to_string(&f.config).expect("cfg");
        std::fs::write(
            &f.config,
            text.replace(&f.p("credential").display().to_string(), &lower.join("credential").display().to_string()),
        )
        .expect("cfg");
        let ov = f.p("models/ov");
        std::fs::create_dir(&ov).expect("mkdir");
        let opts = format!("lowerdir={}:{}", lower.display(), f.p("bin").display());
        mount(Some("overlay"), &ov, Some("overlay"), MsFlags::MS_RDONLY, Some(opts.as_str())).expect("overlay");
        let guard = Unmount(ov.clone());
        same_refusal(
            &f,
            "an overlay holding the credential",
            &["node.credential", "is also shown at", "models/ov/credential"],
        );
        drop(guard);
        let _ = std::fs::remove_dir(&ov);
    }
}

/// A second name for the credential in the engine's model dir (a hard link: no path check
/// sees where it leads; rootless, the engine is the launcher's uid and could read it). Found
/// by review: check and run passed it, and the engine printed the credential.
#[test]
fn a_credential_another_role_can_reach_is_refused_by_check_and_run() {
    for mode in modes() {
        let f = fixture(mode, "cred-hardlink");
        std::fs::hard_link(f.p("credential"), f.p("models/.cache")).expect("link");
        same_refusal(&f, "a credential hard-linked into the model dir", &["node.credential", "has 2 hard links"]);
    }
}

/// The scratch wipe joins the cell's user namespace as the role's ids: it holds no capability
/// there and has no_new_privs (found by review: the id change kept every capability, since the
/// kernel drops them only on leaving the namespace's own uid 0, which the cell does not map;
/// with capabilities in the cell's namespace, the wipe reached every role's namespaces). strace,
/// attached once the cell runs, holds the wipe at its first directory read after a stop.
#[test]
fn the_scratch_wipe_holds_no_capability() {
    if which("strace").is_none() {
        return unavailable("strace", "it holds the wipe in getdents64 (scripts/test installs it)");
    }
    for mode in modes() {
        let f = fixture(mode, "cr-wipe-caps");
        let run = start_logged(&f, &[]);
        run.out_line(60, |l| l.ends_with("node-up"));
        let supervisor = run.pid().as_raw();
        let mut strace = Command::new("strace")
            .args(["-f", "-qq", "-o", "/dev/null", "-e", "trace=getdents64"])
            .args(["-e", "inject=getdents64:delay_enter=3000000", "-p", &supervisor.to_string()])
            .spawn()
            .expect("strace");
        std::thread::sleep(Duration::from_millis(500));
        nix::sys::signal::kill(run.pid(), nix::sys::signal::Signal::SIGTERM).expect("SIGTERM");
        let comm = |p: i32| std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
        let mut wipes = Vec::new();
        let held = wait_until(Duration::from_secs(20), || {
            // Held in its first directory read: its setup (ids, capabilities) is done.
            wipes = children(supervisor)
                .into_iter()
                .filter(|p| comm(*p).trim() == "sealnode-wipe" && in_syscall(*p, libc::SYS_getdents64))
                .collect();
            !wipes.is_empty()
        });
        assert!(held, "{mode:?}: no wipe held in getdents64 after the stop: {}", run.stderr());
        for p in wipes {
            let status = std::fs::read_to_string(format!("/proc/{p}/status")).expect("the held wipe's status");
            for k in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
                assert!(status.lines().any(|l| l == format!("{k}:\t0000000000000000")), "{mode:?}: wipe {p}: {status}");
            }
            assert!(status.lines().any(|l| l == "NoNewPrivs:\t1"), "{mode:?}: wipe {p}: {status}");
        }
        let _ = strace.kill();
        let _ = strace.wait();
        let (code, _, err) = run.stop();
        assert_eq!(code, Some(0), "{mode:?}: {err}");
    }
}

/// Rootless, both roles are one host uid: each role's nproc counts in its own user namespace,
/// but every process of that uid also counts against sealnode's own RLIMIT_NPROC. `check`
/// warns, naming both fields and the limit, when the roles' nproc do not fit in it (found by
/// review: a low limit let the engine's processes leave the node none); rootful (a host uid
/// per role), and rootless within the limit, it does not.
#[test]
fn check_warns_when_both_roles_nproc_exceed_sealnodes_own() {
    for mode in modes() {
        let f = fixture(mode, "cr-nproc");
        for (limit, want) in [("2000", false), ("600", mode == Mode::Rootless)] {
            let cfg = f.config.display().to_string();
            let inner = f.command(&["check", "--config", &cfg]);
            let mut cmd = Command::new("prlimit");
            cmd.arg(format!("--nproc={limit}:{limit}")).arg("--").arg(inner.get_program()).args(inner.get_args());
            cmd.current_dir(&f.dir);
            let (code, out) = check_verdict_of(cmd);
            assert_eq!(code, Some(0), "{mode:?} {limit}: {out}");
            let warned = out.lines().any(|l| {
                l.starts_with("[warn] process limits")
                    && l.contains("engine.rlimits.nproc + node.rlimits.nproc = 1024")
                    && l.contains(&format!("hard RLIMIT_NPROC ({limit})"))
            });
            assert_eq!(warned, want, "{mode:?} {limit}: {out}");
        }
    }
}
