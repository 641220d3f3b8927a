//! What a role will open besides its program, opened as that role before it starts, so that
//! `sealnode check` and every start of `run` give one verdict: each bind's source
//! the way the role's sandbox opens it ([`crate::sandbox::mounts::open_source`], with the
//! role's filesystem ids), the credential and the model files its command names for reading,
//! its devices for reading and writing. A path the role could not open is a config problem
//! (exit 125, naming the field), found before anything starts, never a restartable failure of
//! the sandbox's setup or the role's own exit later.
//!
//! Rootful, the ids are switched in a forked child (the launcher keeps its own); rootless, the
//! roles run as the launcher's uid and groups, so the launcher opens them itself.

use std::os::fd::AsRawFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::OFlag;

use crate::config::{Config, Ids, Invoker, Role};
use crate::layout::{INSIDE_CREDENTIAL, INSIDE_MODELS};
use crate::sandbox::table::{Check, Mount};

/// One role's paths, and the ids it will have.
#[derive(Debug, Clone)]
pub struct Job {
    pub role: Role,
    pub ids: Ids,
    /// Take the role's filesystem ids first (the launcher is root and the role is not).
    pub switch: bool,
    pub items: Vec<Item>,
}

#[derive(Debug, Clone)]
pub struct Item {
    /// The config field that names the path.
    pub field: String,
    pub what: What,
}

#[derive(Debug, Clone)]
pub enum What {
    /// A bind's source (host path), opened as the sandbox opens it.
    Source { mount: Mount, host: PathBuf },
    /// A file the role reads: its credential.
    Read { host: PathBuf, inside: PathBuf },
    /// A model file the engine's command names: `rest` under the model dir `dir`, resolved
    /// beneath it (a symlink may not lead out of it: in the role's view it would lead
    /// elsewhere).
    Model { dir: PathBuf, rest: String, inside: PathBuf },
    /// A device node the role opens for reading and writing.
    Device { host: PathBuf },
}

/// The paths `role` will open under `plan`: the plan's binds (role paths and system binds
/// alike; a capped scratch's host dir, which the cell's tmpfs covers, by its path), the
/// credential, the model files the engine's command names (unless the model dir is the engine's
/// to write: it may fetch them itself), and the devices.
pub fn job_for(cfg: &Config, inv: &Invoker, role: Role, plan: &crate::sandbox::Plan) -> Job {
    let r = cfg.role(role);
    let mut named: Vec<(PathBuf, String)> = cfg.binds(role).into_iter().map(|(f, b)| (b.src.clone(), f)).collect();
    if let Some(m) = &r.models {
        named.push((m.clone(), format!("{role}.models")));
    }
    named.push((r.scratch.clone(), format!("{role}.scratch")));
    if let Some(c) = &r.credential {
        named.push((c.clone(), format!("{role}.credential")));
    }
    // The credential's bind source is the path it was reached by (a Secret volume's file is
    // bound from its timestamped dir: Config::checked_role_path): known by where it goes.
    let credential_dst = Path::new(crate::sandbox::table::NEWROOT).join(INSIDE_CREDENTIAL.trim_start_matches('/'));
    let mut items = Vec::new();
    for m in &plan.mounts {
        let Mount::Bind { src, dst, .. } = m else { continue };
        // A capped scratch is the cell's tmpfs over the host dir: the role reaches it by the
        // same path, so the dirs above it must be searchable by the role's ids as for any
        // bind (found by review: it was left out, and the start failed after `check` said OK).
        let mut mount = m.clone();
        if let Mount::Bind { check: c @ Check::Tmpfs(_), .. } = &mut mount {
            *c = Check::None;
        }
        let host = PathBuf::from(std::ffi::OsStr::from_bytes(src.as_bytes()));
        let to_credential =
            r.credential.is_some() && Path::new(std::ffi::OsStr::from_bytes(dst.as_bytes())) == credential_dst;
        let field = named
            .iter()
            .find(|(p, _)| *p == host)
            .map(|(_, f)| f.clone())
            .or_else(|| to_credential.then(|| format!("{role}.credential")))
            .unwrap_or_else(|| format!("{role} (system bind)"));
        items.push(Item { field, what: What::Source { mount, host } });
    }
    if let Some(c) = &r.credential {
        items.push(Item {
            field: format!("{role}.credential"),
            what: What::Read { host: c.clone(), inside: PathBuf::from(crate::layout::INSIDE_CREDENTIAL) },
        });
    }
    if let (Some(dir), false) = (&r.models, r.models_writable) {
        for (i, arg) in r.command.iter().enumerate().skip(1) {
            // `-m /models/x.gguf`, `--model=/models/x.gguf` and `-m/models/x.gguf` alike.
            let value = match arg.split_once('=') {
                Some((_, v)) => v,
                None => arg.strip_prefix("-m").filter(|v| v.starts_with('/')).unwrap_or(arg),
            };
            let Some(rest) = value.strip_prefix(INSIDE_MODELS).and_then(|r| r.strip_prefix('/')) else { continue };
            // `/models//x` is `/models/x` to the kernel: the slashes are trimmed, so `//x` is
            // looked up beneath the model dir, never as the host's `/x` (tests/check_run.rs:
            // model_paths_are_resolved_beneath_the_model_dir). A `..` may leave the dir: not
            // one the view can tell.
            let rest = rest.trim_start_matches('/');
            if rest.is_empty() || rest.split('/').any(|c| c == "..") {
                continue;
            }
            items.push(Item {
                field: format!("{role}.command[{i}]"),
                what: What::Model { dir: dir.clone(), rest: rest.to_string(), inside: PathBuf::from(value) },
            });
        }
    }
    for (i, d) in cfg.devices(role).into_iter().enumerate() {
        let field = if i < r.devices.len() { format!("{role}.devices[{i}]") } else { format!("{role}.devices_from") };
        items.push(Item { field, what: What::Device { host: d.to_path_buf() } });
    }
    Job { role, ids: plan.ids, switch: inv.rootful() && plan.ids.uid != nix::unistd::geteuid().as_raw(), items }
}

/// What opening `job`'s paths as its role found.
#[derive(Debug, Default)]
pub struct Outcome {
    /// What the role could not open: config problems, as (field, reason).
    pub problems: Vec<(String, String)>,
    /// Why the check itself could not be made (a fork refused, a descriptor table full, a
    /// path changed under it): a start that could not be checked, which the gate answers with
    /// the restartable exit 6, not a config problem's 125 (unit test:
    /// access::tests::a_passing_host_failure_is_not_a_config_problem).
    pub could_not: Option<String>,
}

/// Open everything `job` names as its role.
pub fn check(job: &Job) -> Outcome {
    let results = if job.switch { in_child(job) } else { Ok(attempt_all(job)) };
    let results = match results {
        Ok(r) => r,
        Err(e) => {
            return Outcome {
                problems: Vec::new(),
                could_not: Some(format!("cannot check what the {} role opens as uid {}: {e}", job.role, job.ids.uid)),
            }
        }
    };
    let mut out = Outcome::default();
    for (item, r) in job.items.iter().zip(results) {
        match r {
            Ok(()) => {}
            Err(e) if is_config_problem(e) => out.problems.push((item.field.clone(), reason(job, item, e))),
            Err(e) => {
                out.could_not.get_or_insert_with(|| format!("{}: {}", item.field, reason(job, item, e)));
            }
        }
    }
    out
}

/// An errno that says what the config names cannot be opened by the role (as opposed to a
/// passing failure of the host: out of memory or descriptors, I/O, a path replaced meanwhile).
fn is_config_problem(e: Errno) -> bool {
    matches!(
        e,
        Errno::EACCES
            | Errno::EPERM
            | Errno::ENOENT
            | Errno::ENOTDIR
            | Errno::ELOOP
            | Errno::EXDEV
            | Errno::EISDIR
            | Errno::ENXIO
            | Errno::ENODEV
            | Errno::ENAMETOOLONG
    )
}

/// Each item's outcome, as this process's ids.
fn attempt_all(job: &Job) -> Vec<Result<(), Errno>> {
    job.items.iter().map(|i| attempt(&i.what)).collect()
}

fn attempt(w: &What) -> Result<(), Errno> {
    match w {
        What::Source { mount, .. } => crate::sandbox::mounts::open_source(mount).map(drop),
        // Non-blocking: a FIFO in place of a file must not hang the check; no controlling tty.
        What::Read { host, .. } => nix::fcntl::open(host, READ, nix::sys::stat::Mode::empty()).map(drop),
        What::Model { dir, rest, .. } => open_beneath(dir, rest),
        // Never opened (opening a device may do something: reset it, take it): asked.
        What::Device { host } => nix::unistd::faccessat(
            nix::fcntl::AT_FDCWD,
            host,
            nix::unistd::AccessFlags::R_OK | nix::unistd::AccessFlags::W_OK,
            nix::fcntl::AtFlags::AT_EACCESS,
        ),
    }
}

const READ: OFlag = OFlag::O_RDONLY.union(OFlag::O_NONBLOCK).union(OFlag::O_NOCTTY).union(OFlag::O_CLOEXEC);

/// Open `rest` for reading beneath `dir` (openat2 RESOLVE_BENEATH: `..` and symlinks may not
/// leave it, EXDEV), as the engine will find it under `/models`. Where openat2 is refused
/// (systemd's RestrictSUIDSGID= answers ENOSYS), no symlink at all (stricter).
fn open_beneath(dir: &Path, rest: &str) -> Result<(), Errno> {
    let d = crate::os::sys::open_path_no_symlinks(dir)?;
    let name = std::ffi::CString::new(rest).map_err(|_| Errno::EINVAL)?;
    let resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_MAGICLINKS;
    match crate::os::sys::openat2(d.as_raw_fd(), &name, READ.bits() as u64, resolve) {
        Ok(fd) => {
            // SAFETY: fd was just returned by openat2 and is owned here.
            drop(unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) });
            Ok(())
        }
        Err(Errno::ENOSYS) => {
            let path = dir.join(rest);
            drop(crate::os::sys::open_path_no_symlinks(&path)?);
            nix::fcntl::open(&path, READ | OFlag::O_NOFOLLOW, nix::sys::stat::Mode::empty()).map(drop)
        }
        Err(e) => Err(e),
    }
}

/// Rootful: a child becomes the role (no supplementary groups, its gid and uid: every
/// capability goes with uid 0, so it holds none while it opens paths others chose; unit test:
/// access::tests::the_child_that_opens_as_the_role_holds_no_capability) and reports each
/// outcome as one errno per item (0: ok). For file access that is what the sandbox's own opens
/// see (it switches its filesystem ids to the same ones).
fn in_child(job: &Job) -> Result<Vec<Result<(), Errno>>, String> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| format!("pipe2: {e}"))?;
    // SAFETY: the child only runs Rust code that the callers' processes allow after fork: the
    // supervisor's gate worker and the CLI are single-threaded (glibc's fork keeps malloc
    // usable in the child regardless).
    match unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))? {
        nix::unistd::ForkResult::Child => {
            drop(r);
            let _ = crate::os::sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            let mut out = Vec::with_capacity(job.items.len() * 4);
            match become_role(job.ids) {
                Ok(()) => {
                    for i in &job.items {
                        let e = attempt(&i.what).err().map_or(0, |e| e as i32);
                        out.extend_from_slice(&e.to_le_bytes());
                    }
                }
                Err(e) => out.extend_from_slice(&(-(e as i32)).to_le_bytes()),
            }
            let code = if crate::os::sys::write_all(w.as_raw_fd(), &out).is_ok() { 0 } else { 1 };
            crate::os::sys::exit_now(code)
        }
        nix::unistd::ForkResult::Parent { child } => {
            drop(w);
            let mut buf = Vec::new();
            let mut f = std::fs::File::from(r);
            let read = std::io::Read::read_to_end(&mut f, &mut buf);
            let status = nix::sys::wait::waitpid(child, None).map_err(|e| format!("waitpid: {e}"))?;
            read.map_err(|e| format!("reading the child's answer: {e}"))?;
            if !matches!(status, nix::sys::wait::WaitStatus::Exited(_, 0)) {
                return Err(format!("the child ended with {status:?}"));
            }
            let codes: Vec<i32> = buf.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
            if let [c] = codes.as_slice() {
                if *c < 0 {
                    return Err(format!("taking the role's ids: {}", Errno::from_raw(-c)));
                }
            }
            if codes.len() != job.items.len() {
                return Err(format!("{} answers for {} paths", codes.len(), job.items.len()));
            }
            Ok(codes.into_iter().map(|c| if c == 0 { Ok(()) } else { Err(Errno::from_raw(c)) }).collect())
        }
    }
}

fn become_role(ids: Ids) -> Result<(), Errno> {
    crate::os::sys::clear_groups()?;
    crate::os::sys::set_ids(ids.uid, ids.gid)?;
    crate::os::sys::prctl(libc::PR_SET_NO_NEW_PRIVS, 1).map(drop)
}

/// Owner and mode of `p`, as the launcher sees them, for the message.
fn bits(p: &Path) -> String {
    match std::fs::metadata(p) {
        Ok(m) => format!("owner uid {}, gid {}, mode {:o}", m.uid(), m.gid(), m.mode() & 0o7777),
        Err(_) => "not readable by the launcher either".into(),
    }
}

fn reason(job: &Job, item: &Item, e: Errno) -> String {
    let who = format!("the {} role (uid {}, gid {})", job.role, job.ids.uid, job.ids.gid);
    let shown = |p: &Path| crate::os::escape::clean(p.as_os_str().as_encoded_bytes());
    match (&item.what, e) {
        (What::Source { host, .. }, Errno::EACCES) => format!(
            "{}: {who} cannot reach it (EACCES): a directory on the way is not searchable by that uid (a 0700 home, \
             say); move it where the role can reach it, or let that uid search (x) each directory above it",
            shown(host)
        ),
        (What::Source { host, .. }, Errno::ESTALE) => {
            format!("{}: changed while it was being checked (replaced, or a mount over it): try again", shown(host))
        }
        (What::Source { host, .. }, e) => format!("{}: {who} cannot open it: {}", shown(host), e.desc()),
        (What::Model { dir, rest, inside }, Errno::ENOENT) => {
            format!("{} is not in the model dir: {} does not exist", shown(inside), shown(&dir.join(rest)))
        }
        (What::Model { inside, .. }, Errno::EXDEV | Errno::ELOOP) => format!(
            "{}: a symlink (or `..`) that leads out of the model dir: in the engine's view it would not reach the \
             same file; name the file itself, in the model dir",
            shown(inside)
        ),
        (What::Model { dir, rest, inside }, Errno::EACCES) => format!(
            "{} (the role's {}): {who} cannot read it ({}): make it readable by that uid (chown it, or a group the \
             role has)",
            shown(&dir.join(rest)),
            shown(inside),
            bits(&dir.join(rest))
        ),
        (What::Model { dir, rest, .. }, e) => format!("{}: {who} cannot read it: {}", shown(&dir.join(rest)), e.desc()),
        (What::Read { host, inside }, Errno::EACCES) => format!(
            "{} (the role's {}): {who} cannot read it ({}): make it readable by that uid (chown it, or a group \
             the role has)",
            shown(host),
            shown(inside),
            bits(host)
        ),
        (What::Read { host, .. }, e) => format!("{}: {who} cannot read it: {}", shown(host), e.desc()),
        (What::Device { host }, e) => format!(
            "{}: {who} cannot open it for reading and writing ({}; {}): give that uid or a group of the role access",
            shown(host),
            e.desc(),
            bits(host)
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A path that failed for a passing reason of the host (here, swapped between the plan and
    /// the check: ESTALE) is "could not check", which the gate answers with the restartable
    /// exit 6; a path the role cannot open (ENOENT) is a config problem, exit 125.
    #[test]
    fn a_passing_host_failure_is_not_a_config_problem() {
        let t = tempfile::tempdir().expect("tmp");
        let scratch = t.path().join("scratch");
        std::fs::create_dir(&scratch).expect("mkdir");
        let st = std::fs::metadata(&scratch).expect("stat");
        let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).expect("path");
        let swapped = Mount::Bind {
            src: c(&scratch),
            dst: c(Path::new("/scratch")),
            dir: true,
            attrs: 0,
            check: Check::Identity(st.dev(), st.ino() + 1),
            nofollow: true,
        };
        let job = Job {
            role: Role::Node,
            ids: Ids { uid: nix::unistd::geteuid().as_raw(), gid: nix::unistd::getegid().as_raw() },
            switch: false,
            items: vec![
                Item { field: "node.scratch".into(), what: What::Source { mount: swapped, host: scratch.clone() } },
                Item {
                    field: "node.credential".into(),
                    what: What::Read { host: t.path().join("none"), inside: PathBuf::from("/run/sealnode/credential") },
                },
            ],
        };
        let out = check(&job);
        assert_eq!(out.problems.len(), 1, "{out:?}");
        assert_eq!(out.problems[0].0, "node.credential", "{out:?}");
        let why = out.could_not.expect("the swapped source is a check that could not be made");
        assert!(why.starts_with("node.scratch: ") && why.contains("changed while it was being checked"), "{why}");
    }

    /// Rootful, the child that opens the role's paths is the role: its uid and gid, no
    /// supplementary group and no capability left (a switch of the filesystem ids alone would
    /// keep CAP_SYS_ADMIN and the rest).
    #[test]
    fn the_child_that_opens_as_the_role_holds_no_capability() {
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: switching to a role's ids needs root");
            return;
        }
        // SAFETY: the child runs only this test's code and exits with exit_now; glibc's fork
        // keeps malloc usable in it though the test harness has other threads.
        match unsafe { nix::unistd::fork() }.expect("fork") {
            nix::unistd::ForkResult::Child => {
                let ok = become_role(Ids { uid: 61001, gid: 61001 }).is_ok()
                    && std::fs::read_to_string("/proc/self/status").is_ok_and(|s| {
                        s.lines()
                            .filter(|l| l.starts_with("Cap"))
                            .all(|l| l.starts_with("CapBnd:") || l.ends_with("0000000000000000"))
                            && s.lines()
                                .any(|l| l.starts_with("Uid:") && l.split_whitespace().skip(1).all(|u| u == "61001"))
                            && s.lines().any(|l| l.trim_end() == "Groups:")
                    });
                crate::os::sys::exit_now(if ok { 0 } else { 1 })
            }
            nix::unistd::ForkResult::Parent { child } => {
                let st = nix::sys::wait::waitpid(child, None).expect("waitpid");
                assert_eq!(st, nix::sys::wait::WaitStatus::Exited(child, 0), "the role's child kept privileges");
            }
        }
    }
}
