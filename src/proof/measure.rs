//! Measuring what runs, before a start and off the event loop (docs/attestation.md, "What the
//! digests are of"): each role's program copied into its sealed memfd and hashed there (the
//! copy is what the role executes), the engine's model files hashed, and every tree a role
//! sees through its binds walked for what must not be in it.
//!
//! One rule for everything hashed or run: it belongs to root or sealnode's own user and no
//! one else can write it, nor any directory above it, all the way down; no unix socket or FIFO
//! (a way to a host process) is in a role's view. The engine's model dir with
//! `models_writable` is the one exception the operator can ask for: its digests are then
//! declared not binding.
//!
//! [`run`] does the work in the calling process (`sealnode check`); [`Worker`] does it in a
//! forked child that the supervisor's event loop reaps, so a file of any size or type (a FIFO,
//! `/dev/zero`, a sparse 16 GiB model) never holds the loop: it keeps serving signals, control
//! requests, forwarding and the watchdog meanwhile.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{openat, OFlag};
use nix::sys::stat::{fstat, fstatat, FileStat, Mode};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::config::Role;
use crate::error::{Error, Result};

/// The largest program sealnode copies into memory to run.
pub const MAX_PROGRAM_BYTES: u64 = 1 << 30;
/// Entries walked at most in one role's trees (a venv and an interpreter are a few thousand; a
/// home dir or a whole disk is a config mistake). Per role, so a check of one role and a start
/// of both count alike.
pub const MAX_ENTRIES: usize = 200_000;
/// Deepest nesting walked.
const MAX_DEPTH: usize = 64;
/// Problems reported at most (then how many more).
const MAX_PROBLEMS: usize = 20;
/// The worker's answer is at most this big (the model digests dominate).
const MAX_ANSWER: usize = 64 << 20;

/// A role's program to copy into its sealed memfd and hash.
#[derive(Debug, Clone)]
pub struct ProgramJob {
    pub role: Role,
    /// The config fields that name it and pin it (`engine.command[0]`, `engine.sha256`).
    pub field: String,
    pub pin_field: String,
    pub pin: Option<String>,
    /// The host file the role's view shows at its program's path (sandbox::view).
    pub host: PathBuf,
    /// The plan's memfd (sandbox::plan::SealedProgram), empty and unsealed.
    pub memfd: RawFd,
    /// The role's ids (and, rootless, the supplementary groups it keeps): the copy grants the
    /// role what the file's own bits grant it, and a file the role could not execute is refused.
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// A tree a role sees through a bind, walked for what must not be in it.
#[derive(Debug, Clone)]
pub struct TreeJob {
    pub role: Role,
    pub field: String,
    pub root: PathBuf,
}

/// The engine's (read-only) model dir, hashed for the statements' subjects. With
/// `models_writable` nothing is hashed: the engine could change the files, and make every one
/// of its own starts hash gigabytes it wrote itself.
#[derive(Debug, Clone)]
pub struct ModelsJob {
    pub dir: PathBuf,
    /// Keep the digests' cache in the state dir (`run`); `check` only reads it.
    pub keep_cache: bool,
}

/// A file no role may see under another name: its (device, inode) and what it is.
#[derive(Debug, Clone)]
pub struct Secret {
    pub dev: u64,
    pub ino: u64,
    pub what: String,
    /// The config field it belongs to.
    pub field: String,
    /// The places a role sees (Config::seen_by_roles, but its own field's).
    pub seen: Vec<(PathBuf, String)>,
    /// Where it is (as resolved): a mount that shows it elsewhere refuses the start too.
    pub path: PathBuf,
}

#[derive(Debug, Clone, Default)]
pub struct Job {
    /// Root and this uid are the trusted owners.
    pub launcher_uid: u32,
    pub programs: Vec<ProgramJob>,
    pub trees: Vec<TreeJob>,
    /// The node's credential and the attestation key: an entry of a tree that is one of them
    /// (a hard link, a bind mount of it) refuses the start.
    pub secrets: Vec<Secret>,
    pub models: Option<ModelsJob>,
    /// What each role opens besides its program, opened as the role (crate::sandbox::access).
    pub access: Vec<crate::sandbox::access::Job>,
}

/// Something that refuses the start, with the config field it belongs to.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Problem {
    pub field: String,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProgramDigest {
    /// The role's name.
    pub role: String,
    pub sha256: String,
    pub bytes: u64,
    /// The copy's mode: what the file's bits grant the role (read, execute), for every class.
    pub mode: u32,
}

/// The engine's model files as `(model:<path under the dir>, sha256)`, and what it cost.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Models {
    pub files: Vec<(String, String)>,
    pub hashed: usize,
    pub hashed_bytes: u64,
    pub cached: usize,
    pub skipped: usize,
    pub ms: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Measured {
    pub programs: Vec<ProgramDigest>,
    pub problems: Vec<Problem>,
    /// Problems beyond the ones listed.
    pub more_problems: usize,
    /// Why something could not be checked at all (not a config problem: the start could not
    /// run, exit 6, which systemd restarts).
    #[serde(default)]
    pub could_not: Option<String>,
    pub models: Option<Models>,
}

impl Measured {
    fn problem(&mut self, field: &str, reason: String) {
        if self.problems.len() < MAX_PROBLEMS {
            self.problems.push(Problem { field: field.to_string(), reason });
        } else {
            self.more_problems += 1;
        }
    }

    /// The problems as one config error (the first one's field; every reason listed).
    pub fn error(&self, file: &Path) -> Option<Error> {
        let first = self.problems.first()?;
        if self.problems.len() == 1 && self.more_problems == 0 {
            return Some(Error::config(file, &first.field, &first.reason));
        }
        let mut all: Vec<String> = self.problems.iter().map(|p| format!("{}: {}", p.field, p.reason)).collect();
        if self.more_problems > 0 {
            all.push(format!("and {} more", self.more_problems));
        }
        Some(Error::config(file, &first.field, format!("{} problems:\n  {}", all.len(), all.join("\n  "))))
    }

    pub fn program(&self, role: Role) -> Option<&ProgramDigest> {
        self.programs.iter().find(|p| p.role == role.name())
    }
}

/// What the gate measures for `plans` (and `sealnode check` with it): each plan's program into
/// its sealed copy, and the trees its role sees: its extra binds, the CDI spec's files, the
/// engine's model dir unless it is writable (no model files: the gate adds them).
pub fn job_for(
    cfg: &crate::config::Config,
    inv: &crate::config::Invoker,
    plans: &[(Role, &crate::sandbox::Plan)],
) -> Job {
    let mut trees = Vec::new();
    for (role, _) in plans {
        for (field, b) in cfg.binds(*role) {
            trees.push(TreeJob { role: *role, field, root: b.src.clone() });
        }
        let r = cfg.role(*role);
        if let (Some(m), false) = (&r.models, r.models_writable) {
            trees.push(TreeJob { role: *role, field: format!("{role}.models"), root: m.clone() });
        }
    }
    // Found by review: a bind mount of the credential or the key into the engine's model dir
    // kept one name (no link count sees it) and the engine read it; every tree entry is
    // compared with them by (device, inode).
    let credentials = Role::ALL.iter().filter_map(|r| {
        let f = format!("{r}.credential");
        Some((cfg.role(*r).credential.clone()?, f.clone(), f))
    });
    let key = (
        crate::layout::attest_key_path(&cfg.cell.state_dir),
        "the attestation key (cell.state_dir)".to_string(),
        "cell.state_dir".to_string(),
    );
    // The state dir itself: a key made while the cell runs would be there at once.
    let state = (
        cfg.cell.state_dir.clone(),
        "the state dir, which holds the attestation key".to_string(),
        "cell.state_dir".to_string(),
    );
    let secrets = credentials
        .chain([key, state])
        .filter_map(|(p, what, field)| {
            use std::os::unix::fs::MetadataExt;
            let md = std::fs::metadata(&p).ok()?;
            let seen = cfg.seen_by_roles(if field.ends_with(".credential") { &field } else { "" });
            Some(Secret {
                dev: md.dev(),
                ino: md.ino(),
                what,
                field,
                seen,
                path: std::fs::canonicalize(&p).unwrap_or(p),
            })
        })
        .collect();
    // Rootless, a role keeps the launcher's supplementary groups (unmapped, for DAC).
    let groups: Vec<u32> = if inv.rootful() {
        Vec::new()
    } else {
        nix::unistd::getgroups().map(|g| g.iter().map(|g| g.as_raw()).collect()).unwrap_or_default()
    };
    Job {
        launcher_uid: inv.uid,
        programs: plans
            .iter()
            .filter_map(|(role, plan)| {
                let p = plan.sealed_program()?;
                Some(ProgramJob {
                    role: *role,
                    field: p.field.clone(),
                    pin_field: format!("{role}.sha256"),
                    pin: p.pin.clone(),
                    host: p.host.clone(),
                    memfd: p.fd.as_raw_fd(),
                    uid: plan.ids.uid,
                    gid: plan.ids.gid,
                    groups: groups.clone(),
                })
            })
            .collect(),
        trees,
        secrets,
        models: None,
        access: plans.iter().map(|(role, plan)| crate::sandbox::access::job_for(cfg, inv, *role, plan)).collect(),
    }
}

/// Measure everything `job` names, in this process. `state`: the state dir's descriptor and
/// path, for the model digests' cache.
pub fn run(job: &Job, state: Option<(&OwnedFd, &Path)>) -> Measured {
    let mut m = Measured::default();
    for p in &job.programs {
        match program(p, job.launcher_uid) {
            Ok(d) => m.programs.push(d),
            Err((field, reason)) => m.problem(&field, reason),
        }
    }
    for a in &job.access {
        let o = crate::sandbox::access::check(a);
        for (field, reason) in o.problems {
            m.problem(&field, reason);
        }
        if m.could_not.is_none() {
            m.could_not = o.could_not;
        }
    }
    // A mount showing one of them elsewhere (the system view, a writable dir, an overlay):
    // no walk of the roles' trees would meet it there.
    let mounts = crate::os::trusted::MountTable::read();
    for s in &job.secrets {
        if let Some((at, seen)) = mounts.shown_within(&s.path, &s.seen) {
            m.problem(
                &s.field,
                format!(
                    "{} ({}) is also shown at {} by a mount (a bind of it or of a directory above it, or an overlay), inside {seen}: a role could read it there; remove that mount",
                    shown(s.path.display().to_string()),
                    s.what,
                    shown(at.display().to_string())
                ),
            );
        }
    }
    let mut budgets = std::collections::BTreeMap::new();
    for t in &job.trees {
        let budget = budgets.entry(t.role).or_insert(MAX_ENTRIES);
        scan_tree(t, &job.secrets, job.launcher_uid, budget, &mut m);
    }
    // Gigabytes are hashed only for a start that can happen.
    if let (Some(mj), true) = (&job.models, m.problems.is_empty()) {
        let t = std::time::Instant::now();
        let (fd, state_shown) = match state {
            Some((fd, shown)) => (Some(fd), shown),
            None => (None, Path::new("-")),
        };
        match crate::proof::digests::models_with(&mj.dir, fd, mj.keep_cache, state_shown, &|| false) {
            Ok((files, st)) => {
                m.models = Some(Models {
                    files,
                    hashed: st.hashed,
                    hashed_bytes: st.hashed_bytes,
                    cached: st.cached,
                    skipped: st.skipped,
                    ms: t.elapsed().as_millis() as u64,
                })
            }
            Err(e) => m.problem("engine.models", format!("cannot hash the model files: {}", shown(e.to_string()))),
        }
    }
    m
}

/// Copy the program into its memfd, seal it, hash the sealed bytes. Errors name the field.
fn program(p: &ProgramJob, uid: u32) -> std::result::Result<ProgramDigest, (String, String)> {
    let shown = shown(p.host.display().to_string());
    let bad = |why: String| (p.field.clone(), why);
    // O_PATH first: nothing about the file is opened for reading until it is known to be a
    // regular file (a FIFO would block, a device would be opened).
    let at = crate::os::sys::open_path_no_symlinks(&p.host).map_err(|e| match e {
        Errno::ELOOP => bad(format!("{shown}: a symlink on the way (the view had none: changed since?)")),
        e => bad(format!("{shown}: {}", e.desc())),
    })?;
    let st = fstat(&at).map_err(|e| bad(format!("fstat {shown}: {}", e.desc())))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(bad(format!("{shown} is {}, not a regular file", crate::os::sys::file_kind(st.st_mode))));
    }
    crate::os::trusted::check_dirs_to(&p.host, uid)
        .map_err(|e| bad(format!("{e}: what runs would not be what was measured")))?;
    if let Some(why) = crate::os::trusted::entry_problem(&st, uid) {
        return Err(bad(format!(
            "{shown} can be rewritten by a user other than root or sealnode's user: it {why}; what runs would not be what was measured"
        )));
    }
    // What the file's own bits grant the role: it must be able to execute it, as it would have
    // to without the copy, and the copy grants it no more than that (never read where the file
    // gave execute only).
    let class = if st.st_uid == p.uid {
        (st.st_mode >> 6) & 7
    } else if st.st_gid == p.gid || p.groups.contains(&st.st_gid) {
        (st.st_mode >> 3) & 7
    } else {
        st.st_mode & 7
    };
    if class & 1 == 0 {
        return Err(bad(format!(
            "the {}'s user (uid {}) may not execute {shown} (owner uid {}, group {}, mode {:o})",
            p.role,
            p.uid,
            st.st_uid,
            st.st_gid,
            st.st_mode & 0o7777
        )));
    }
    let granted = class & 0o5;
    let mode = granted << 6 | granted << 3 | granted;
    // A file on a noexec mount cannot be executed where it is: neither from its copy.
    match nix::sys::statvfs::fstatvfs(&at) {
        Ok(v) if v.flags().contains(nix::sys::statvfs::FsFlags::ST_NOEXEC) => {
            return Err(bad(format!("{shown} is on a mount without exec (noexec): it cannot run from there")));
        }
        Ok(_) => {}
        Err(e) => return Err(bad(format!("statvfs {shown}: {}", e.desc()))),
    }
    let size = st.st_size as u64;
    if size > MAX_PROGRAM_BYTES {
        return Err(bad(format!(
            "{shown} is {size} bytes: sealnode copies a program into memory to run it, at most {MAX_PROGRAM_BYTES}"
        )));
    }
    let fd = nix::fcntl::open(
        format!("/proc/self/fd/{}", at.as_raw_fd()).as_str(),
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| match e {
        Errno::EACCES => bad(format!(
            "sealnode (uid {}) may not read {shown} (mode {:o}) to copy and hash it: a program must be readable by sealnode's user",
            nix::unistd::geteuid(),
            st.st_mode & 0o7777
        )),
        e => bad(format!("open {shown}: {}", e.desc())),
    })?;
    let again = fstat(&fd).map_err(|e| bad(format!("fstat {shown}: {}", e.desc())))?;
    if (again.st_dev, again.st_ino) != (st.st_dev, st.st_ino) {
        return Err(bad(format!("{shown} changed while it was opened")));
    }
    // The copy is granted from the mode bits alone, so a program with an ACL is refused: the
    // copy would lose what the ACL grants or denies (unit test:
    // measure::tests::a_program_with_an_acl_is_refused).
    match crate::os::sys::has_access_acl(fd.as_fd()) {
        Ok(false) => {}
        Ok(true) => {
            return Err(bad(format!(
                "{shown} carries a POSIX ACL: its sealed copy is granted from the mode bits alone, which would drop what the ACL grants or denies; remove it (setfacl -b) and set the mode"
            )))
        }
        Err(e) => return Err(bad(format!("read the ACL of {shown}: {}", e.desc()))),
    }
    // SAFETY: the plan's memfd, open in this process for as long as the plan lives; wrapped
    // without taking ownership (ManuallyDrop: never closed here).
    let mut copy = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(p.memfd) });
    let mut src = std::fs::File::from(fd).take(size + 1);
    let copied = std::io::copy(&mut src, &mut *copy).map_err(|e| bad(format!("copy {shown} into memory: {e}")))?;
    if copied != size {
        return Err(bad(format!("{shown} changed size while it was copied ({size} bytes, then {copied})")));
    }
    // SAFETY: as above: the memfd outlives this borrow.
    let memfd = unsafe { BorrowedFd::borrow_raw(p.memfd) };
    crate::sandbox::sealed::seal(&memfd).map_err(|e| bad(e.to_string()))?;
    let (sha256, head) = hash_at(memfd, size).map_err(|e| bad(format!("read the sealed copy of {shown}: {e}")))?;
    if head.starts_with(b"#!") {
        return Err(bad(format!(
            "{shown} is a #! script: name its interpreter as {} and the script as an argument (the \
             interpreter a script names would run unmeasured)",
            p.field
        )));
    }
    if !head.starts_with(b"\x7fELF") {
        return Err(bad(format!("{shown} is not an ELF executable")));
    }
    // The kernel's own ELF loader runs it, not a binfmt_misc handler (qemu-user for another
    // architecture would be an interpreter nothing measured): this machine's class and
    // machine, an executable or position-independent one.
    let (class64, machine) = (head.get(4) == Some(&2), head.get(18..20).map(|m| u16::from_le_bytes([m[0], m[1]])));
    let etype = head.get(16..18).map(|t| u16::from_le_bytes([t[0], t[1]]));
    let native = if cfg!(target_arch = "aarch64") { 183 } else { 62 };
    if !class64 || machine != Some(native) || !matches!(etype, Some(2) | Some(3)) {
        return Err(bad(format!(
            "{shown} is not an executable for this machine (ELF class, type or machine {machine:?} differ): another architecture's binary would run under an interpreter nothing measured"
        )));
    }
    if let Some(want) = &p.pin {
        if !sha256.eq_ignore_ascii_case(want) {
            return Err((
                p.pin_field.clone(),
                format!(
                    "{shown} does not match its pin: expected sha256 {}, found {sha256}; refusing to start",
                    want.to_ascii_lowercase()
                ),
            ));
        }
    }
    Ok(ProgramDigest { role: p.role.name().to_string(), sha256, bytes: size, mode })
}

/// sha256 of the first `len` bytes of `fd` read with pread (the offset is left alone), and
/// its first 20 bytes (an ELF header's identification, type and machine).
fn hash_at(fd: BorrowedFd, len: u64) -> std::result::Result<(String, Vec<u8>), Errno> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    let mut off = 0u64;
    let mut head = Vec::new();
    while off < len {
        let want = buf.len().min((len - off) as usize);
        let n = nix::sys::uio::pread(fd, &mut buf[..want], off as libc::off_t)?;
        if n == 0 {
            return Err(Errno::EIO);
        }
        if head.len() < 20 {
            head.extend_from_slice(&buf[..n.min(20 - head.len())]);
        }
        h.update(&buf[..n]);
        off += n as u64;
    }
    Ok((hex::encode(h.finalize()), head))
}

/// sha256 of a file that should be a program, read safely (a CLI's check against the receipt:
/// no symlink, a regular file, at most [`MAX_PROGRAM_BYTES`]). Never on the event loop.
pub fn file_sha256(path: &Path) -> std::result::Result<String, String> {
    let shown = path.display();
    let at = crate::os::sys::open_path_no_symlinks(path).map_err(|e| format!("{shown}: {}", e.desc()))?;
    let st = fstat(&at).map_err(|e| format!("fstat {shown}: {}", e.desc()))?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(format!("{shown} is {}, not a regular file", crate::os::sys::file_kind(st.st_mode)));
    }
    if st.st_size as u64 > MAX_PROGRAM_BYTES {
        return Err(format!("{shown} is larger than {MAX_PROGRAM_BYTES} bytes"));
    }
    let fd = nix::fcntl::open(
        format!("/proc/self/fd/{}", at.as_raw_fd()).as_str(),
        OFlag::O_RDONLY | OFlag::O_NONBLOCK | OFlag::O_NOCTTY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("open {shown}: {}", e.desc()))?;
    hash_at(fd.as_fd(), st.st_size as u64).map(|(h, _)| h).map_err(|e| format!("read {shown}: {}", e.desc()))
}

/// A path (or a message holding one) as sealnode may print it: a name a role or a local user
/// chose could carry terminal escapes or a forged log line (crate::logging::log::clean).
fn shown(s: String) -> String {
    crate::logging::log::clean(s.as_bytes())
}

/// Walk `t.root` (and check every directory above it) for what must not be in a role's view.
fn scan_tree(t: &TreeJob, secrets: &[Secret], uid: u32, budget: &mut usize, m: &mut Measured) {
    let shown = shown(t.root.display().to_string());
    if let Err(e) = crate::os::trusted::check_dirs_to(&t.root, uid) {
        m.problem(&t.field, e);
        return;
    }
    let root = match crate::os::sys::open_path_no_symlinks(&t.root) {
        Ok(fd) => fd,
        Err(e) => return m.problem(&t.field, format!("{shown}: {}", e.desc())),
    };
    let st = match fstat(&root) {
        Ok(st) => st,
        Err(e) => return m.problem(&t.field, format!("fstat {shown}: {}", e.desc())),
    };
    if !entry(t, secrets, &t.root, &st, uid, m) {
        return;
    }
    if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
        match nix::fcntl::open(
            format!("/proc/self/fd/{}", root.as_raw_fd()).as_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(dir) => walk(t, secrets, &dir, &t.root, 0, uid, budget, m),
            Err(e) => m.problem(&t.field, format!("list {shown}: {}", e.desc())),
        }
    }
}

/// Judge one entry; true when a directory should be walked into.
fn entry(t: &TreeJob, secrets: &[Secret], path: &Path, st: &FileStat, uid: u32, m: &mut Measured) -> bool {
    if let Some(s) = secrets.iter().find(|s| s.dev == st.st_dev && s.ino == st.st_ino) {
        m.problem(
            &t.field,
            format!(
                "{} is {} under another name (a hard link or a bind mount of it): the {} would read it; remove it",
                shown(path.display().to_string()),
                s.what,
                t.role
            ),
        );
        return false;
    }
    match st.st_mode & libc::S_IFMT {
        // Not followed: the view resolves it, to something judged on its own.
        libc::S_IFLNK => false,
        libc::S_IFSOCK | libc::S_IFIFO => {
            m.problem(
                &t.field,
                format!(
                    "{} is {} in the role's view: a way to whatever host process has it open; remove it",
                    shown(path.display().to_string()),
                    crate::os::sys::file_kind(st.st_mode)
                ),
            );
            false
        }
        // Device nodes do nothing there: every bind is nodev.
        libc::S_IFCHR | libc::S_IFBLK => false,
        _ => match crate::os::trusted::entry_problem(st, uid) {
            Some(why) => {
                m.problem(&t.field, format!("{} {why}", shown(path.display().to_string())));
                false
            }
            None => st.st_mode & libc::S_IFMT == libc::S_IFDIR,
        },
    }
}

#[allow(clippy::too_many_arguments)]
fn walk(
    t: &TreeJob,
    secrets: &[Secret],
    dir: &OwnedFd,
    here: &Path,
    depth: usize,
    uid: u32,
    budget: &mut usize,
    m: &mut Measured,
) {
    if depth > MAX_DEPTH {
        return m
            .problem(&t.field, format!("{}: nested more than {MAX_DEPTH} deep", shown(here.display().to_string())));
    }
    let listing =
        match nix::dir::Dir::openat(dir, ".", OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC, Mode::empty()) {
            Ok(l) => l,
            Err(e) => return m.problem(&t.field, format!("list {}: {}", shown(here.display().to_string()), e.desc())),
        };
    let mut names = Vec::new();
    for e in listing {
        match e {
            Ok(e) => {
                let n = e.file_name().to_bytes();
                if n != b"." && n != b".." {
                    names.push(std::ffi::OsStr::from_bytes(n).to_os_string());
                }
            }
            Err(e) => return m.problem(&t.field, format!("list {}: {}", shown(here.display().to_string()), e.desc())),
        }
    }
    for name in names {
        if *budget == 0 {
            if m.problems.iter().all(|p| !p.reason.contains("entries under")) {
                m.problem(
                    &t.field,
                    format!(
                        "more than {MAX_ENTRIES} entries under the {}'s binds: bind only what the role needs",
                        t.role
                    ),
                );
            }
            return;
        }
        *budget -= 1;
        let path = here.join(&name);
        let st = match fstatat(dir, name.as_os_str(), nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => {
                m.problem(&t.field, format!("stat {}: {}", shown(path.display().to_string()), e.desc()));
                continue;
            }
        };
        if !entry(t, secrets, &path, &st, uid, m) {
            continue;
        }
        match openat(
            dir,
            name.as_os_str(),
            OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            Mode::empty(),
        ) {
            Ok(sub) => walk(t, secrets, &sub, &path, depth + 1, uid, budget, m),
            Err(e) => m.problem(&t.field, format!("list {}: {}", shown(path.display().to_string()), e.desc())),
        }
    }
}

/// A measurement running in a forked child of the supervisor, whose answer arrives on a pipe
/// the event loop watches; the loop reaps it like any child.
#[derive(Debug)]
pub struct Worker {
    pub pid: nix::unistd::Pid,
    /// The answer's read end (non-blocking).
    pub out: OwnedFd,
    buf: Vec<u8>,
    eof: bool,
    status: Option<i32>,
    pub started: std::time::Instant,
}

impl Worker {
    /// Fork the measurement of `job`. The child keeps only its pipe, the state dir and the
    /// programs' memfds, runs at a lower CPU priority than the supervisor, and dies with it.
    pub fn spawn(job: &Job, state: &OwnedFd, shown: &Path) -> Result<Worker> {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2 (measure)", e))?;
        nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
            .map_err(|e| Error::errno("fcntl (measure)", e))?;
        let parent = nix::unistd::getpid();
        // SAFETY: the supervisor is single-threaded, so the child may allocate and run Rust code.
        match unsafe { nix::unistd::fork() }.map_err(|e| Error::errno("fork (measure)", e))? {
            nix::unistd::ForkResult::Child => {
                drop(r);
                let _ = crate::os::sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
                if nix::unistd::getppid() != parent {
                    crate::os::sys::exit_now(1);
                }
                // Named for `ps` (and the tests that find it): the gate's measurement (15 bytes at most).
                let _ = nix::sys::prctl::set_name(c"sealnode-gate");
                // SAFETY: setpriority takes plain integers and affects only this process.
                unsafe { libc::setpriority(libc::PRIO_PROCESS, 0, 10) };
                let mut keep = vec![w.as_raw_fd(), state.as_raw_fd()];
                keep.extend(job.programs.iter().map(|p| p.memfd));
                if crate::os::sys::close_all_except(&keep).is_err() {
                    crate::os::sys::exit_now(1);
                }
                let m = run(job, Some((state, shown)));
                let bytes = serde_json::to_vec(&m).unwrap_or_default();
                let code = if crate::os::sys::write_all(w.as_raw_fd(), &bytes).is_ok() { 0 } else { 1 };
                crate::os::sys::exit_now(code)
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(w);
                Ok(Worker {
                    pid: child,
                    out: r,
                    buf: Vec::new(),
                    eof: false,
                    status: None,
                    started: std::time::Instant::now(),
                })
            }
        }
    }

    /// Take what the pipe holds now (without blocking).
    pub fn pump(&mut self) {
        let mut chunk = [0u8; 65536];
        while !self.eof {
            match nix::unistd::read(&self.out, &mut chunk) {
                Ok(0) => self.eof = true,
                Ok(n) if self.buf.len() + n <= MAX_ANSWER => self.buf.extend_from_slice(&chunk[..n]),
                // Too big an answer: kept at the limit, and refused when it is read.
                Ok(_) => self.buf.resize(MAX_ANSWER + 1, 0),
                Err(Errno::EINTR) => {}
                Err(_) => return,
            }
        }
    }

    /// The worker exited with `code` (the loop reaped it).
    pub fn exited(&mut self, code: i32) {
        self.status = Some(code);
        self.pump();
        // Nothing writes any more: whatever is not there now never comes.
        self.eof = true;
    }

    pub fn done(&self) -> bool {
        self.status.is_some()
    }

    /// Its pipe reached its end (it exited, or closed it).
    pub fn eof(&self) -> bool {
        self.eof
    }

    /// Its answer, once it exited.
    pub fn answer(&self) -> std::result::Result<Measured, String> {
        match self.status {
            Some(0) if self.buf.len() <= MAX_ANSWER => {
                serde_json::from_slice(&self.buf).map_err(|e| format!("the measurement's answer: {e}"))
            }
            Some(0) => Err(format!("the measurement's answer is over {MAX_ANSWER} bytes")),
            Some(code) => Err(format!("the measurement exited with status {code}")),
            None => Err("the measurement has not finished".into()),
        }
    }

    /// Stop it (a stop or a reload came first); the loop still reaps it.
    pub fn abandon(&self) {
        let _ = nix::sys::signal::kill(self.pid, nix::sys::signal::Signal::SIGKILL);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn me() -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    fn tree() -> tempfile::TempDir {
        let d = tempfile::Builder::new().prefix("measure-").tempdir_in("/var/tmp").expect("tmp");
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
        d
    }

    fn job_for(host: &Path, memfd: RawFd, pin: Option<String>) -> Job {
        Job {
            launcher_uid: me(),
            programs: vec![ProgramJob {
                role: Role::Engine,
                field: "engine.command[0]".into(),
                pin_field: "engine.sha256".into(),
                pin,
                host: host.to_path_buf(),
                memfd,
                uid: me(),
                gid: nix::unistd::getegid().as_raw(),
                groups: Vec::new(),
            }],
            ..Job::default()
        }
    }

    #[test]
    fn the_program_is_copied_sealed_and_hashed_from_the_copy() {
        let d = tree();
        let prog = d.path().join("prog");
        let bytes = std::fs::read("/usr/bin/true").expect("read true");
        std::fs::write(&prog, &bytes).expect("write");
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let memfd = crate::sandbox::sealed::memfd("t").expect("memfd");
        let want = hex::encode(Sha256::digest(&bytes));
        let m = run(&job_for(&prog, memfd.as_raw_fd(), Some(want.to_uppercase())), None);
        assert!(m.problems.is_empty(), "{m:?}");
        assert_eq!(
            m.programs,
            vec![ProgramDigest { role: "engine".into(), sha256: want.clone(), bytes: bytes.len() as u64, mode: 0o555 }]
        );
        assert!(crate::sandbox::sealed::is_sealed(&memfd), "the copy is sealed");
        let (copied, head) = hash_at(memfd.as_fd(), bytes.len() as u64).expect("read the copy");
        assert!(copied == want && head.starts_with(b"\x7fELF"), "the memfd holds the program");
        // A wrong pin names the pin's field.
        let memfd = crate::sandbox::sealed::memfd("t").expect("memfd");
        let m = run(&job_for(&prog, memfd.as_raw_fd(), Some("0".repeat(64))), None);
        assert_eq!(m.problems[0].field, "engine.sha256");
        assert!(m.problems[0].reason.contains("does not match its pin"), "{m:?}");
    }

    /// The copy grants the role what the file's own bits grant it (its class: owner, group,
    /// other), read and execute only; a file it may not execute is refused, naming its uid.
    #[test]
    fn the_copy_grants_the_role_what_the_file_grants_it() {
        let d = tree();
        // Mode 155, sealnode's own: root reads it; a rootless sealnode may not (said so).
        let own_155 = if nix::unistd::geteuid().is_root() { Ok(0o111) } else { Err("may not read") };
        let prog = d.path().join("prog");
        std::fs::copy("/usr/bin/true", &prog).expect("copy");
        let gid = nix::unistd::getegid().as_raw();
        let other = me().wrapping_add(4242);
        for (file_mode, uid, gid_, want) in [
            (0o755, other, other, Ok(0o555)),
            (0o711, other, other, Ok(0o111)),
            (0o751, other, gid, Ok(0o555)),
            (0o155, me(), other, own_155),
            (0o700, me(), gid, Ok(0o555)),
            (0o700, other, gid, Err("may not execute")),
            (0o750, other, other, Err("may not execute")),
            (0o644, me(), gid, Err("may not execute")),
        ] {
            std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(file_mode)).expect("chmod");
            let memfd = crate::sandbox::sealed::memfd("t").expect("memfd");
            let mut job = job_for(&prog, memfd.as_raw_fd(), None);
            (job.programs[0].uid, job.programs[0].gid) = (uid, gid_);
            let m = run(&job, None);
            match want {
                Ok(mode) => assert_eq!(m.programs.first().map(|p| p.mode), Some(mode), "{file_mode:o}: {m:?}"),
                Err(why) => {
                    let p = m.problems.first().unwrap_or_else(|| panic!("{file_mode:o} uid {uid}: {m:?}"));
                    assert!(p.field == "engine.command[0]" && p.reason.contains(why), "{m:?}");
                    assert!(p.reason.contains(&format!("(uid {uid})")), "{m:?}");
                }
            }
        }
    }

    /// A program with a POSIX ACL is refused: its copy would lose what the ACL denies.
    #[test]
    fn a_program_with_an_acl_is_refused() {
        let d = tree();
        let prog = d.path().join("prog");
        std::fs::copy("/usr/bin/true", &prog).expect("copy");
        std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        // user::rwx user:61001:--- group::r-x mask::r-x other::r-x (the kernel's xattr layout).
        let mut acl = 2u32.to_le_bytes().to_vec();
        for (tag, perm, id) in
            [(1u16, 7u16, u32::MAX), (2, 0, 61001), (4, 5, u32::MAX), (0x10, 5, u32::MAX), (0x20, 5, u32::MAX)]
        {
            acl.extend(tag.to_le_bytes());
            acl.extend(perm.to_le_bytes());
            acl.extend(id.to_le_bytes());
        }
        let path = std::ffi::CString::new(prog.as_os_str().as_encoded_bytes()).expect("path");
        // SAFETY: valid NUL-terminated strings and a buffer of the length given.
        let r = unsafe {
            libc::setxattr(path.as_ptr(), c"system.posix_acl_access".as_ptr(), acl.as_ptr().cast(), acl.len(), 0)
        };
        assert_eq!(r, 0, "setxattr: {}", Errno::last());
        let memfd = crate::sandbox::sealed::memfd("t").expect("memfd");
        let m = run(&job_for(&prog, memfd.as_raw_fd(), None), None);
        assert!(m.problems.first().is_some_and(|p| p.reason.contains("carries a POSIX ACL")), "{m:?}");
    }

    /// What is not a regular ELF file of a trusted owner is refused, without blocking on it
    /// (a FIFO) or reading it (a device).
    #[test]
    fn fifos_devices_scripts_and_writable_files_are_refused() {
        let d = tree();
        let fifo = d.path().join("fifo");
        nix::unistd::mkfifo(&fifo, Mode::from_bits_truncate(0o755)).expect("mkfifo");
        let script = d.path().join("script");
        std::fs::write(&script, "#!/bin/sh\necho hi\n").expect("write");
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        let writable = d.path().join("writable");
        std::fs::copy("/usr/bin/true", &writable).expect("copy");
        std::fs::set_permissions(&writable, std::fs::Permissions::from_mode(0o757)).expect("chmod");
        let text = d.path().join("text");
        std::fs::write(&text, "not a program").expect("write");
        std::fs::set_permissions(&text, std::fs::Permissions::from_mode(0o755)).expect("chmod");
        for (path, want) in [
            (fifo.as_path(), "is a FIFO, not a regular file"),
            (Path::new("/dev/zero"), "is a character device, not a regular file"),
            (script.as_path(), "is a #! script: name its interpreter as engine.command[0]"),
            (writable.as_path(), "can be rewritten by a user other than root or sealnode's user"),
            (text.as_path(), "is not an ELF executable"),
        ] {
            let memfd = crate::sandbox::sealed::memfd("t").expect("memfd");
            let t = std::time::Instant::now();
            let m = run(&job_for(path, memfd.as_raw_fd(), None), None);
            assert!(t.elapsed() < std::time::Duration::from_secs(5), "{} took {:?}", path.display(), t.elapsed());
            assert_eq!(m.problems.len(), 1, "{}: {m:?}", path.display());
            assert_eq!(m.problems[0].field, "engine.command[0]");
            assert!(m.problems[0].reason.contains(want), "{}: {m:?}", path.display());
        }
    }

    #[test]
    fn trees_refuse_sockets_fifos_foreign_and_writable_entries() {
        let d = tree();
        let root = d.path().join("venv");
        std::fs::create_dir_all(root.join("lib/deep")).expect("mkdir");
        std::fs::write(root.join("lib/ok.py"), "x").expect("write");
        std::os::unix::fs::symlink("/etc/passwd", root.join("lib/link")).expect("symlink");
        let ok = Job {
            launcher_uid: me(),
            trees: vec![TreeJob { role: Role::Node, field: "node.ro_binds[0].src".into(), root: root.clone() }],
            ..Job::default()
        };
        assert_eq!(run(&ok, None).problems, vec![], "a clean tree passes");
        let _l = std::os::unix::net::UnixListener::bind(root.join("lib/deep/sock")).expect("bind");
        nix::unistd::mkfifo(&root.join("lib/fifo"), Mode::from_bits_truncate(0o644)).expect("mkfifo");
        std::fs::write(root.join("lib/open.py"), "x").expect("write");
        std::fs::set_permissions(root.join("lib/open.py"), std::fs::Permissions::from_mode(0o666)).expect("chmod");
        let m = run(&ok, None);
        let reasons: Vec<&str> = m.problems.iter().map(|p| p.reason.as_str()).collect();
        assert_eq!(m.problems.len(), 3, "{reasons:?}");
        assert!(m.problems.iter().all(|p| p.field == "node.ro_binds[0].src"));
        assert!(reasons.iter().any(|r| r.contains("deep/sock is a unix socket in the role's view")), "{reasons:?}");
        assert!(reasons.iter().any(|r| r.contains("lib/fifo is a FIFO")), "{reasons:?}");
        assert!(reasons.iter().any(|r| r.contains("open.py is writable by group or others")), "{reasons:?}");
        let e = m.error(Path::new("/etc/x.toml")).expect("an error").to_string();
        assert!(e.contains("3 problems") && e.contains("node.ro_binds[0].src"), "{e}");
        // A directory above the tree writable by others refuses the tree.
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o777)).expect("chmod");
        let m = run(&ok, None);
        assert!(m.problems[0].reason.contains("is writable by group or others"), "{m:?}");
        std::fs::set_permissions(d.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    }

    /// The worker answers through its pipe what `run` would have said.
    #[test]
    fn the_worker_answers_like_run() {
        let d = tree();
        let prog = d.path().join("prog");
        std::fs::copy("/usr/bin/true", &prog).expect("copy");
        let memfd = crate::sandbox::sealed::memfd("t").expect("memfd");
        let state: OwnedFd = std::fs::File::open(d.path()).expect("open").into();
        let mut w = Worker::spawn(&job_for(&prog, memfd.as_raw_fd(), None), &state, d.path()).expect("spawn");
        let code = match nix::sys::wait::waitpid(w.pid, None).expect("wait") {
            nix::sys::wait::WaitStatus::Exited(_, c) => c,
            other => panic!("{other:?}"),
        };
        w.exited(code);
        let m = w.answer().expect("answer");
        assert_eq!(m.programs.len(), 1, "{m:?}");
        assert_eq!(m.programs[0].sha256, hex::encode(Sha256::digest(std::fs::read("/usr/bin/true").expect("read"))));
        assert!(crate::sandbox::sealed::is_sealed(&memfd), "sealed by the worker");
    }
}
