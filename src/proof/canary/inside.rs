//! The canary's attempts, executed inside a role's sandbox (by sealnode re-executed from its
//! sealed in-memory copy). Each attempt runs in a forked child, so one that succeeds (chroot,
//! unshare, mount) or gets the process killed (int 0x80) cannot affect the next. Attempts are
//! harmless if they succeed: writes go to fresh files that are removed, mounts happen in the
//! sandbox's own mount namespace, signals are signal 0, ptrace uses PTRACE_SEIZE + DETACH.

use std::collections::BTreeMap;
use std::io::Write;

use nix::errno::Errno;
use serde::{Deserialize, Serialize};

use crate::os::sys::{syscall_args, Arg};

/// What the runner tells the inside about the world.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Ctx {
    pub role: String,
    /// A writable directory of the role (its scratch).
    pub scratch: String,
    /// The model directory as the role would see it (engine).
    pub models: String,
    /// A TCP listener on the host's 127.0.0.1.
    pub host_port: u16,
    /// An abstract unix socket listening on the host.
    pub host_abstract: String,
    /// A pathname unix socket listening on the host (outside the view).
    #[serde(default)]
    pub host_unix: String,
    /// Parts of the view walked for sockets and FIFOs.
    #[serde(default)]
    pub view_roots: Vec<String>,
    /// Paths only the other role (or only the host) should see.
    pub foreign_paths: Vec<String>,
    /// The config file's host path.
    pub config_path: String,
    /// The host's /root (st_dev, st_ino), to tell it from a /root the role's view makes.
    #[serde(default)]
    pub root_home: Option<(u64, u64)>,
    /// The attestation key's host path, or the state dir's before there is a key.
    pub attest_key: String,
    pub engine_port: u16,
    /// Cell-local egress listeners (node upstreams), as ip:port.
    pub egress: Vec<String>,
    /// A port nobody may bind.
    pub free_port: u16,
    /// Environment variable names the role is expected to have.
    pub expected_env: Vec<String>,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcome {
    /// The operation succeeded (for a fact: the fact is violated).
    pub ok: bool,
    pub errno: Option<i32>,
    /// The attempt's process was killed by this signal.
    pub signal: Option<i32>,
}

fn c(s: &str) -> Vec<u8> {
    let mut v = s.as_bytes().to_vec();
    v.push(0);
    v
}

type R = Result<(), Errno>;

fn sc(nr: libc::c_long, args: [Arg<'_>; 6]) -> R {
    syscall_args(nr, args).map(drop)
}

fn i(v: impl TryInto<u64>) -> Arg<'static> {
    Arg::I(v.try_into().unwrap_or(u64::MAX))
}

const Z: Arg<'static> = Arg::I(0);

fn fact(violated: bool) -> R {
    if violated {
        Ok(())
    } else {
        Err(Errno::UnknownErrno)
    }
}

fn open_path(path: &str, flags: libc::c_int, mode: u32) -> Result<i32, Errno> {
    let mut p = c(path);
    syscall_args(libc::SYS_openat, [i(libc::AT_FDCWD as i64 as u64), Arg::B(&mut p), i(flags), i(mode), Z, Z])
        .map(|fd| fd as i32)
}

/// Read some bytes from a path: ok only if data came back (a masked file reads nothing).
fn read_some(path: &str) -> R {
    let fd = open_path(path, libc::O_RDONLY | libc::O_CLOEXEC, 0)?;
    let mut b = [0u8; 64];
    let n = nix::unistd::read(unsafe_borrow(fd), &mut b)?;
    if n > 0 {
        Ok(())
    } else {
        Err(Errno::ENODATA)
    }
}

fn unsafe_borrow(fd: i32) -> std::os::fd::BorrowedFd<'static> {
    // SAFETY: the attempt's child owns this fd until it exits right after the attempt.
    unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) }
}

/// A suffix for the files an attempt makes in the role's own scratch: unpredictable, so a
/// role's earlier run cannot have planted something there (the files are created O_EXCL and
/// never followed through a symlink, too).
fn unique() -> String {
    format!("{}-{:016x}", std::process::id(), crate::os::sys::random_u64().unwrap_or(0))
}

/// Create a fresh file in `dir` and remove it again.
fn create_in(dir: &str) -> R {
    let path = format!("{dir}/.sealnode-canary-{}", unique());
    let fd = open_path(&path, libc::O_CREAT | libc::O_EXCL | libc::O_WRONLY | libc::O_CLOEXEC, 0o600)?;
    let _ = nix::unistd::close(fd);
    remove(&path);
    Ok(())
}

/// Remove a file an attempt created. unlinkat, not unlink: the roles' filters allow only the
/// former (x86_64's legacy unlink is not in them).
fn remove(path: &str) {
    let _ = nix::unistd::unlinkat(nix::fcntl::AT_FDCWD, path, nix::unistd::UnlinkatFlags::NoRemoveDir);
}

fn status_field(name: &str) -> String {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(name).map(|v| v.trim_start_matches(':').trim().to_string()))
        .unwrap_or_default()
}

/// Connect with TCP Fast Open: sendto(MSG_FASTOPEN) on a fresh socket sends the SYN (and the
/// data) without connect(2), the call Landlock's port rules check.
fn fastopen(addr: &str) -> R {
    let a: std::net::SocketAddrV4 = addr.parse().map_err(|_| Errno::EINVAL)?;
    let fd = syscall_args(libc::SYS_socket, [i(libc::AF_INET), i(libc::SOCK_STREAM | libc::SOCK_CLOEXEC), Z, Z, Z, Z])?;
    // struct sockaddr_in: family (native endian), port and address (network order), zero pad.
    let mut sa = [0u8; 16];
    sa[..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
    sa[2..4].copy_from_slice(&a.port().to_be_bytes());
    sa[4..8].copy_from_slice(&a.ip().octets());
    let mut data = *b"x";
    let r = sc(
        libc::SYS_sendto,
        [i(fd as u64), Arg::B(&mut data), i(1u64), i(libc::MSG_FASTOPEN), Arg::B(&mut sa), i(16u64)],
    );
    let _ = nix::unistd::close(fd as i32);
    r
}

/// Sockets and FIFOs under `dir` (no symlink followed), at most `budget` entries looked at.
fn ipc_inodes(dir: &std::path::Path, depth: usize, budget: &mut usize, found: &mut Vec<(std::path::PathBuf, bool)>) {
    use std::os::unix::fs::FileTypeExt;
    let Ok(entries) = std::fs::read_dir(dir) else { return };
    for e in entries.flatten() {
        if *budget == 0 || depth > 16 {
            return;
        }
        *budget -= 1;
        let Ok(t) = e.file_type() else { continue };
        if t.is_socket() || t.is_fifo() {
            found.push((e.path(), t.is_fifo()));
        } else if t.is_dir() {
            ipc_inodes(&e.path(), depth + 1, budget, found);
        }
    }
}

fn connect_unix(path: &std::path::Path) -> R {
    use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    use std::os::fd::AsRawFd;
    let fd = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    connect(fd.as_raw_fd(), &UnixAddr::new(path)?)
}

/// A FIFO some host process reads: opening it for writing succeeds (ENXIO: nobody reads).
fn open_fifo(path: &std::path::Path) -> R {
    use nix::fcntl::OFlag;
    nix::fcntl::open(path, OFlag::O_WRONLY | OFlag::O_NONBLOCK | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
        .map(drop)
}

fn connect_tcp(addr: &str) -> R {
    std::net::TcpStream::connect(addr).map(drop).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))
}

/// The sandbox's init (the probe's parent): the target of the cross-process attempts. Not
/// the attempt's own parent, which is the probe itself (same process tree, same domain).
static INIT: std::sync::OnceLock<i32> = std::sync::OnceLock::new();

fn ppid() -> u64 {
    INIT.get().copied().unwrap_or(1) as u64
}

/// Visible pids that are not this attempt's own process tree (init, the probe, itself).
fn foreign_pids() -> Vec<i32> {
    let own = [1, nix::unistd::getpid().as_raw(), nix::unistd::getppid().as_raw()];
    let grand = std::fs::read_to_string(format!("/proc/{}/stat", own[2])).ok().and_then(|s| {
        s.rsplit_once(") ").and_then(|(_, r)| r.split_whitespace().nth(1).and_then(|p| p.parse::<i32>().ok()))
    });
    std::fs::read_dir("/proc")
        .map(|d| d.filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok()).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| !own.contains(p) && Some(*p) != grand)
        .collect()
}

/// An attempt: run in a forked child inside the sandbox; `Ok` means it succeeded (for a fact:
/// the fact is violated).
type Attempt = fn(&Ctx) -> R;

/// Every attempt by id. A unit test holds this table and [`super::SPECS`] to the same ids, and
/// [`main`] refuses an id not in it: a renamed attempt can never pass as "refused".
pub const ATTEMPTS: &[(&str, Attempt)] = &[
    // ---- credentials and capabilities ----
    ("caps_all_zero", |_| {
        fact(["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"].iter().any(|k| status_field(k) != "0000000000000000"))
    }),
    ("no_new_privs", |_| fact(status_field("NoNewPrivs") != "1")),
    ("uid_not_root", |_| fact(nix::unistd::getuid().is_root() || nix::unistd::geteuid().is_root())),
    ("setuid_root", |_| sc(libc::SYS_setuid, [Z, Z, Z, Z, Z, Z])),
    ("setgid_root", |_| sc(libc::SYS_setgid, [Z, Z, Z, Z, Z, Z])),
    ("setgroups_root", |_| {
        let mut g = 0u32.to_ne_bytes();
        sc(libc::SYS_setgroups, [i(1u64), Arg::B(&mut g), Z, Z, Z, Z])
    }),
    ("capset_raise", |_| {
        // _LINUX_CAPABILITY_VERSION_3 header, then two data structs with every bit set.
        let mut hdr = [0u8; 8];
        hdr[..4].copy_from_slice(&0x2008_0522u32.to_ne_bytes());
        let mut data = [0xffu8; 24];
        sc(libc::SYS_capset, [Arg::B(&mut hdr), Arg::B(&mut data), Z, Z, Z, Z])
    }),
    ("ambient_raise", |_| {
        sc(
            libc::SYS_prctl,
            [i(libc::PR_CAP_AMBIENT), i(libc::PR_CAP_AMBIENT_RAISE), i(12u64 /* CAP_NET_ADMIN */), Z, Z, Z],
        )
    }),
    ("securebits", |_| sc(libc::SYS_prctl, [i(libc::PR_SET_SECUREBITS), i(0x2fu64), Z, Z, Z, Z])),
    // ---- namespaces ----
    ("unshare_user", |_| sc(libc::SYS_unshare, [i(libc::CLONE_NEWUSER), Z, Z, Z, Z, Z])),
    ("userns_own_ids_only", |_| {
        // One line each, the role's own id 1:1 (unreadable counts as violated): a user
        // namespace shared with the other role maps its ids too.
        let own = |map: &str, id: u32| {
            std::fs::read_to_string(map).is_ok_and(|s| {
                let lines: Vec<Vec<&str>> = s.lines().map(|l| l.split_whitespace().collect()).collect();
                lines.len() == 1 && lines[0].len() == 3 && lines[0][0] == id.to_string() && lines[0][2] == "1"
            })
        };
        let (uid, gid) = (nix::unistd::getuid().as_raw(), nix::unistd::getgid().as_raw());
        fact(!own("/proc/self/uid_map", uid) || !own("/proc/self/gid_map", gid))
    }),
    ("unshare_net", |_| sc(libc::SYS_unshare, [i(libc::CLONE_NEWNET), Z, Z, Z, Z, Z])),
    ("unshare_mount", |_| sc(libc::SYS_unshare, [i(libc::CLONE_NEWNS), Z, Z, Z, Z, Z])),
    ("unshare_pid", |_| sc(libc::SYS_unshare, [i(libc::CLONE_NEWPID), Z, Z, Z, Z, Z])),
    ("clone_newuser", |_| {
        match syscall_args(libc::SYS_clone, [i((libc::CLONE_NEWUSER | libc::SIGCHLD) as u64), Z, Z, Z, Z, Z]) {
            Ok(0) => crate::os::sys::exit_now(0),
            Ok(pid) => {
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }),
    ("clone3_newuser", |_| {
        let mut args = [0u8; 88];
        args[..8].copy_from_slice(&(libc::CLONE_NEWUSER as u64).to_ne_bytes());
        args[32..40].copy_from_slice(&(libc::SIGCHLD as u64).to_ne_bytes());
        match syscall_args(libc::SYS_clone3, [Arg::B(&mut args), i(88u64), Z, Z, Z, Z]) {
            Ok(0) => crate::os::sys::exit_now(0),
            Ok(pid) => {
                let _ = nix::sys::wait::waitpid(nix::unistd::Pid::from_raw(pid as i32), None);
                Ok(())
            }
            Err(e) => Err(e),
        }
    }),
    ("setns_net", |_| {
        let fd = open_path("/proc/self/ns/net", libc::O_RDONLY | libc::O_CLOEXEC, 0)?;
        sc(libc::SYS_setns, [i(fd as u64), i(libc::CLONE_NEWNET), Z, Z, Z, Z])
    }),
    // ---- filesystem ----
    ("read_host_shadow", |_| read_some("/etc/shadow")),
    ("list_root_home", |ctx| {
        use std::os::unix::fs::MetadataExt;
        let errno = |e: std::io::Error| Errno::from_raw(e.raw_os_error().unwrap_or(5));
        std::fs::read_dir("/root").map(drop).map_err(errno)?;
        // Listed: an escape only if it is the host's root home. A bind whose `dst` lies under
        // /root (an interpreter's original prefix) gives the role's view a /root of its own,
        // sealnode's dir around the mount point, which shows nothing of the host's: the view
        // held, as for a masked file (ENODATA).
        match (ctx.root_home, std::fs::metadata("/root")) {
            (Some(host), Ok(m)) if (m.dev(), m.ino()) != host => Err(Errno::ENODATA),
            _ => Ok(()),
        }
    }),
    ("read_config", |ctx| read_some(&ctx.config_path)),
    ("read_attest_key", |ctx| match std::fs::symlink_metadata(&ctx.attest_key) {
        Ok(m) if m.is_dir() => {
            std::fs::read_dir(&ctx.attest_key).map(drop).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(5)))
        }
        _ => read_some(&ctx.attest_key),
    }),
    ("read_foreign_paths", |ctx| {
        // Succeeds if any is readable; otherwise prefer a refusal over a mere absence.
        let mut worst = Err(Errno::ENOENT);
        for p in &ctx.foreign_paths {
            let r = match std::fs::symlink_metadata(p) {
                Ok(m) if m.is_dir() => {
                    std::fs::read_dir(p).map(drop).map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(5)))
                }
                Ok(_) => read_some(p),
                Err(e) => Err(Errno::from_raw(e.raw_os_error().unwrap_or(5))),
            };
            match r {
                Ok(()) => return Ok(()),
                Err(Errno::ENOENT) => {}
                Err(e) => worst = Err(e),
            }
        }
        worst
    }),
    ("write_usr", |_| create_in(crate::sandbox::plan::MATRIX_WRITE_TARGETS[0])),
    ("write_etc", |_| create_in(crate::sandbox::plan::MATRIX_WRITE_TARGETS[1])),
    ("write_models", |ctx| create_in(&ctx.models)),
    ("write_proc_sys", |_| {
        let fd = open_path("/proc/sys/kernel/hostname", libc::O_WRONLY | libc::O_CLOEXEC, 0)?;
        let _ = nix::unistd::close(fd);
        Ok(())
    }),
    ("sysrq_trigger", |_| {
        let fd = open_path("/proc/sysrq-trigger", libc::O_WRONLY | libc::O_CLOEXEC, 0)?;
        let _ = nix::unistd::close(fd);
        Ok(())
    }),
    ("read_kcore", |_| read_some("/proc/kcore")),
    ("exec_from_scratch", |ctx| {
        let scratch = ctx.scratch.as_str();
        let path = format!("{scratch}/.sealnode-canary-exec-{}", unique());
        // A small program that exits 0 when run (copying sealnode itself costs tens of MiB).
        let me = std::fs::read("/usr/bin/true")
            .or_else(|_| std::fs::read("/proc/self/exe"))
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(5)))?;
        let fd = open_path(
            &path,
            libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_WRONLY | libc::O_CLOEXEC,
            0o755,
        )?;
        let mut f = std::fs::File::from(unsafe_owned(fd));
        let _ = f.write_all(&me);
        drop(f);
        let r =
            nix::unistd::execv(&std::ffi::CString::new(path.clone()).unwrap_or_default(), &[c"sealnode", c"--version"]);
        remove(&path);
        r.map(drop)
    }),
    ("symlink_escape", |ctx| {
        let scratch = ctx.scratch.as_str();
        let link = format!("{scratch}/.sealnode-canary-link-{}", unique());
        let (mut t, mut l) = (c("/etc/shadow"), c(&link));
        let r = sc(libc::SYS_symlinkat, [Arg::B(&mut t), i(libc::AT_FDCWD as i64 as u64), Arg::B(&mut l), Z, Z, Z])
            .and_then(|()| read_some(&link));
        remove(&link);
        r
    }),
    ("hardlink_escape", |ctx| {
        let scratch = ctx.scratch.as_str();
        let link = format!("{scratch}/.sealnode-canary-hard-{}", unique());
        let (mut t, mut l) = (c("/etc/hostname"), c(&link));
        let fdcwd = libc::AT_FDCWD as i64 as u64;
        let r = sc(libc::SYS_linkat, [i(fdcwd), Arg::B(&mut t), i(fdcwd), Arg::B(&mut l), Z, Z]);
        remove(&link);
        r
    }),
    ("mknod_device", |ctx| {
        let scratch = ctx.scratch.as_str();
        let path = format!("{scratch}/.sealnode-canary-null-{}", unique());
        let mut p = c(&path);
        let dev = libc::makedev(1, 3);
        let r = sc(
            libc::SYS_mknodat,
            [i(libc::AT_FDCWD as i64 as u64), Arg::B(&mut p), i(libc::S_IFCHR | 0o666), i(dev), Z, Z],
        );
        remove(&path);
        r
    }),
    ("open_dev_mem", |_| open_path("/dev/mem", libc::O_RDONLY | libc::O_CLOEXEC, 0).map(drop)),
    ("open_by_handle_at", |_| {
        let mut handle = [0u8; 136];
        handle[..4].copy_from_slice(&128u32.to_ne_bytes());
        sc(
            libc::SYS_open_by_handle_at,
            [i(libc::AT_FDCWD as i64 as u64), Arg::B(&mut handle), i(libc::O_RDONLY), Z, Z, Z],
        )
    }),
    ("proc_parent_root", |_| read_some(&format!("/proc/{}/root/etc/hostname", ppid()))),
    ("mount_tmpfs", |ctx| {
        let scratch = ctx.scratch.as_str();
        let (mut src, mut dst, mut fs) = (c("none"), c(scratch), c("tmpfs"));
        let r = sc(libc::SYS_mount, [Arg::B(&mut src), Arg::B(&mut dst), Arg::B(&mut fs), Z, Z, Z]);
        if r.is_ok() {
            let _ = nix::mount::umount2(scratch, nix::mount::MntFlags::MNT_DETACH);
        }
        r
    }),
    ("fsopen", |_| {
        let mut fs = c("tmpfs");
        sc(libc::SYS_fsopen, [Arg::B(&mut fs), Z, Z, Z, Z, Z])
    }),
    ("open_tree", |_| {
        let mut p = c("/");
        sc(
            libc::SYS_open_tree,
            [i(libc::AT_FDCWD as i64 as u64), Arg::B(&mut p), i(1u64 /* OPEN_TREE_CLONE */), Z, Z, Z],
        )
    }),
    ("move_mount", |ctx| {
        let scratch = ctx.scratch.as_str();
        let (mut a, mut b) = (c(""), c(scratch));
        sc(
            libc::SYS_move_mount,
            [i(u64::MAX), Arg::B(&mut a), i(libc::AT_FDCWD as i64 as u64), Arg::B(&mut b), i(4u64), Z],
        )
    }),
    ("mount_setattr", |_| {
        // Clear MOUNT_ATTR_RDONLY on /.
        let mut p = c("/");
        let mut attr = [0u8; 32];
        attr[8..16].copy_from_slice(&1u64.to_ne_bytes());
        sc(
            libc::SYS_mount_setattr,
            [i(libc::AT_FDCWD as i64 as u64), Arg::B(&mut p), Z, Arg::B(&mut attr), i(32u64), Z],
        )
    }),
    ("umount_mask", |_| {
        let mut p = c("/proc/kcore");
        sc(libc::SYS_umount2, [Arg::B(&mut p), i(libc::MNT_DETACH), Z, Z, Z, Z])
    }),
    ("chroot", |ctx| {
        let scratch = ctx.scratch.as_str();
        let mut p = c(scratch);
        sc(libc::SYS_chroot, [Arg::B(&mut p), Z, Z, Z, Z, Z])
    }),
    ("pivot_root", |ctx| {
        let scratch = ctx.scratch.as_str();
        let (mut a, mut b) = (c(scratch), c(scratch));
        sc(libc::SYS_pivot_root, [Arg::B(&mut a), Arg::B(&mut b), Z, Z, Z, Z])
    }),
    // ---- kernel attack surface ----
    ("bpf_map_create", |_| {
        let mut attr = [0u8; 72];
        attr[..4].copy_from_slice(&2u32.to_ne_bytes()); // BPF_MAP_TYPE_ARRAY
        attr[4..8].copy_from_slice(&4u32.to_ne_bytes());
        attr[8..12].copy_from_slice(&4u32.to_ne_bytes());
        attr[12..16].copy_from_slice(&1u32.to_ne_bytes());
        sc(libc::SYS_bpf, [Z, Arg::B(&mut attr), i(72u64), Z, Z, Z])
    }),
    ("perf_event_open", |_| {
        // PERF_TYPE_SOFTWARE, PERF_COUNT_SW_CPU_CLOCK, counting the kernel too.
        let mut attr = [0u8; 128];
        attr[..4].copy_from_slice(&1u32.to_ne_bytes());
        attr[4..8].copy_from_slice(&128u32.to_ne_bytes());
        sc(libc::SYS_perf_event_open, [Arg::B(&mut attr), Z, i(u64::MAX), i(u64::MAX), Z, Z])
    }),
    ("userfaultfd", |_| sc(libc::SYS_userfaultfd, [i(libc::O_CLOEXEC), Z, Z, Z, Z, Z])),
    ("io_uring_setup", |_| {
        let mut params = [0u8; 120];
        sc(libc::SYS_io_uring_setup, [i(1u64), Arg::B(&mut params), Z, Z, Z, Z])
    }),
    ("keyctl_session", |_| sc(libc::SYS_keyctl, [i(1u64 /* KEYCTL_JOIN_SESSION_KEYRING */), Z, Z, Z, Z, Z])),
    ("add_key", |_| {
        let (mut t, mut d, mut p) = (c("user"), c("sealnode-canary"), c("x"));
        sc(
            libc::SYS_add_key,
            [Arg::B(&mut t), Arg::B(&mut d), Arg::B(&mut p), i(1u64), i(-2i64 as u64 /* process keyring */), Z],
        )
    }),
    ("init_module", |_| {
        let mut params = c("");
        sc(libc::SYS_init_module, [Z, Z, Arg::B(&mut params), Z, Z, Z])
    }),
    ("finit_module", |_| {
        let mut params = c("");
        sc(libc::SYS_finit_module, [i(u64::MAX), Arg::B(&mut params), Z, Z, Z, Z])
    }),
    ("delete_module", |_| {
        let mut name = c("sealnode_canary_none");
        sc(libc::SYS_delete_module, [Arg::B(&mut name), Z, Z, Z, Z, Z])
    }),
    ("kexec_load", |_| sc(libc::SYS_kexec_load, [Z, Z, Z, Z, Z, Z])),
    ("kexec_file_load", |_| {
        sc(libc::SYS_kexec_file_load, [i(u64::MAX), i(u64::MAX), Z, Z, i(4u64 /* NO_INITRAMFS */), Z])
    }),
    ("personality", |_| sc(libc::SYS_personality, [i(0x0040_0000u64 /* READ_IMPLIES_EXEC */), Z, Z, Z, Z, Z])),
    ("syslog_read", |_| {
        let mut buf = [0u8; 256];
        sc(libc::SYS_syslog, [i(3u64 /* READ_ALL */), Arg::B(&mut buf), i(256u64), Z, Z, Z])
    }),
    #[cfg(target_arch = "x86_64")]
    ("iopl", |_| sc(libc::SYS_iopl, [i(3u64), Z, Z, Z, Z, Z])),
    #[cfg(target_arch = "x86_64")]
    ("ioperm", |_| sc(libc::SYS_ioperm, [i(0x80u64), i(1u64), i(1u64), Z, Z, Z])),
    ("reboot", |_| sc(libc::SYS_reboot, [i(0xfee1_deadu64), i(0u64 /* bad magic2 */), Z, Z, Z, Z])),
    ("swapon", |_| {
        let mut p = c("/nonexistent-swap");
        sc(libc::SYS_swapon, [Arg::B(&mut p), Z, Z, Z, Z, Z])
    }),
    ("ptrace_parent", |_| {
        let r = sc(libc::SYS_ptrace, [i(libc::PTRACE_SEIZE as u64), i(ppid()), Z, Z, Z, Z]);
        if r.is_ok() {
            let _ = sc(libc::SYS_ptrace, [i(libc::PTRACE_DETACH as u64), i(ppid()), Z, Z, Z, Z]);
        }
        r
    }),
    ("process_vm_readv_parent", |_| {
        // Read 8 bytes of the parent at an address of ours (same binary, same layout).
        let mut local = [0u8; 8];
        let mut remote_target = [0u8; 8];
        let addr = remote_target.as_mut_ptr() as u64;
        let mut liov = [0u8; 16];
        liov[..8].copy_from_slice(&(local.as_mut_ptr() as u64).to_ne_bytes());
        liov[8..].copy_from_slice(&8u64.to_ne_bytes());
        let mut riov = [0u8; 16];
        riov[..8].copy_from_slice(&addr.to_ne_bytes());
        riov[8..].copy_from_slice(&8u64.to_ne_bytes());
        sc(libc::SYS_process_vm_readv, [i(ppid()), Arg::B(&mut liov), i(1u64), Arg::B(&mut riov), i(1u64), Z])
    }),
    ("pidfd_getfd_parent", |_| {
        let pidfd = syscall_args(libc::SYS_pidfd_open, [i(ppid()), Z, Z, Z, Z, Z])?;
        sc(libc::SYS_pidfd_getfd, [i(pidfd as u64), Z, Z, Z, Z, Z])
    }),
    // ---- tty injection (stdin is a pty the runner owns) ----
    ("tiocsti", |_| {
        let mut ch = [b'#'];
        sc(libc::SYS_ioctl, [Z, i(libc::TIOCSTI), Arg::B(&mut ch), Z, Z, Z])
    }),
    ("tiocsti_high_bits", |_| {
        let mut ch = [b'#'];
        sc(libc::SYS_ioctl, [Z, i(0xdead_0000_0000_0000 | libc::TIOCSTI), Arg::B(&mut ch), Z, Z, Z])
    }),
    ("tioclinux", |_| {
        let mut sub = [2u8, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]; // TIOCL_SETSEL
        sc(libc::SYS_ioctl, [Z, i(libc::TIOCLINUX), Arg::B(&mut sub), Z, Z, Z])
    }),
    // ---- compat syscall entry points ----
    #[cfg(target_arch = "x86_64")]
    ("int80_getpid", |_| {
        let r = crate::os::sys::int80(20);
        if r > 0 {
            Ok(())
        } else {
            Err(Errno::from_raw(-r as i32))
        }
    }),
    #[cfg(target_arch = "x86_64")]
    ("x32_getpid", |_| sc(39 | 0x4000_0000, [Z, Z, Z, Z, Z, Z])),
    // ---- sockets ----
    ("socket_raw", |_| sock(libc::AF_INET, libc::SOCK_RAW, libc::IPPROTO_ICMP)),
    ("socket_udp", |_| sock(libc::AF_INET, libc::SOCK_DGRAM, 0)),
    ("socket_mptcp", |_| sock(libc::AF_INET, libc::SOCK_STREAM, 262 /* IPPROTO_MPTCP */)),
    ("socket_packet", |_| sock(libc::AF_PACKET, libc::SOCK_RAW, 0)),
    ("socket_netlink", |_| sock(libc::AF_NETLINK, libc::SOCK_RAW, 0)),
    ("socket_alg", |_| sock(libc::AF_ALG, libc::SOCK_SEQPACKET, 0)),
    ("socket_vsock", |_| sock(libc::AF_VSOCK, libc::SOCK_STREAM, 0)),
    ("socket_pfkey", |_| sock(libc::AF_KEY, libc::SOCK_RAW, 2 /* PF_KEY_V2 */)),
    ("socket_autoload", |_| sock(libc::AF_APPLETALK, libc::SOCK_DGRAM, 0)),
    // ---- network ----
    ("interfaces_only_lo", |_| fact(crate::proof::probe::interface_names().iter().any(|n| n != "lo"))),
    ("host_loopback_service", |ctx| connect_tcp(&format!("127.0.0.1:{}", ctx.host_port))),
    ("host_abstract_socket", |ctx| {
        use nix::sys::socket::{connect, socket, AddressFamily, SockFlag, SockType, UnixAddr};
        use std::os::fd::AsRawFd;
        let fd = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
        connect(fd.as_raw_fd(), &UnixAddr::new_abstract(ctx.host_abstract.as_bytes())?)
    }),
    ("unix_socket_in_view", |ctx| {
        // Every socket and FIFO the role's view shows beyond the system trees, then the
        // host's socket outside it: any that answers is a way out.
        let mut found = Vec::new();
        let mut budget = 20_000usize;
        for r in &ctx.view_roots {
            ipc_inodes(std::path::Path::new(r), 0, &mut budget, &mut found);
        }
        let mut last = Err(Errno::ENOENT);
        for (path, fifo) in
            found.iter().map(|(p, f)| (p.as_path(), *f)).chain([(std::path::Path::new(&ctx.host_unix), false)])
        {
            last = if fifo { open_fifo(path) } else { connect_unix(path) };
            if last.is_ok() {
                return last;
            }
        }
        last
    }),
    ("bind_other_port", |ctx| {
        std::net::TcpListener::bind(("127.0.0.1", ctx.free_port))
            .map(drop)
            .map_err(|e| Errno::from_raw(e.raw_os_error().unwrap_or(5)))
    }),
    ("engine_connect", |ctx| connect_tcp(&format!("127.0.0.1:{}", ctx.engine_port))),
    ("engine_fastopen_egress", |ctx| {
        fastopen(&match ctx.egress.first() {
            Some(a) => a.clone(),
            None => format!("127.0.0.2:{}", ctx.host_port),
        })
    }),
    ("engine_to_egress", |ctx| match ctx.egress.first() {
        Some(a) => connect_tcp(a),
        None => connect_tcp(&format!("127.0.0.2:{}", ctx.host_port)),
    }),
    // ---- the other role ----
    ("see_foreign_processes", |_| fact(!foreign_pids().is_empty())),
    ("signal_foreign_processes", |_| {
        let pids = foreign_pids();
        if pids.is_empty() {
            return Err(Errno::ESRCH);
        }
        let mut last = Err(Errno::ESRCH);
        for p in pids {
            last = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None);
            if last.is_ok() {
                return last;
            }
        }
        last
    }),
    // ---- resources ----
    ("core_dumps_off", |_| {
        fact(nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_CORE).map(|l| l.1 != 0).unwrap_or(true))
    }),
    ("rlimits_finite", |_| {
        use nix::sys::resource::{getrlimit, Resource};
        let inf = libc::RLIM_INFINITY;
        fact(
            [Resource::RLIMIT_NOFILE, Resource::RLIMIT_NPROC, Resource::RLIMIT_FSIZE]
                .iter()
                .any(|r| getrlimit(*r).map(|l| l.1 == inf).unwrap_or(true)),
        )
    }),
    ("raise_hard_rlimit", |_| {
        use nix::sys::resource::{getrlimit, setrlimit, Resource};
        let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
        setrlimit(Resource::RLIMIT_NOFILE, hard.saturating_add(1), hard.saturating_add(1))
    }),
    // ---- what the launcher hands over ----
    ("fds_beyond_stdio", |_| fact(inherited_fds() > 0)),
    ("unexpected_env", |ctx| fact(std::env::vars().any(|(k, _)| !ctx.expected_env.contains(&k)))),
    ("proxy_env", |_| fact(std::env::vars().any(|(k, _)| crate::config::is_proxy_var(&k)))),
];

fn lookup(id: &str) -> Option<Attempt> {
    ATTEMPTS.iter().find(|(a, _)| *a == id).map(|(_, f)| *f)
}

fn unsafe_owned(fd: i32) -> std::os::fd::OwnedFd {
    use std::os::fd::FromRawFd;
    // SAFETY: fd was just returned by open and nothing else owns it.
    unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) }
}

fn sock(dom: libc::c_int, ty: libc::c_int, proto: libc::c_int) -> R {
    let fd = syscall_args(libc::SYS_socket, [i(dom), i(ty | libc::SOCK_CLOEXEC), i(proto), Z, Z, Z])?;
    let _ = nix::unistd::close(fd as i32);
    Ok(())
}

/// Fds open in the probe at start besides stdio (counted once, before any attempt runs).
static INHERITED: std::sync::OnceLock<usize> = std::sync::OnceLock::new();

fn inherited_fds() -> usize {
    *INHERITED.get().unwrap_or(&0)
}

fn count_fds() -> usize {
    // read_dir holds one fd of its own while listing.
    std::fs::read_dir("/proc/self/fd").map(|d| d.count().saturating_sub(4)).unwrap_or(0)
}

/// In an attempt's child: whatever the attempt runs (`exec_from_scratch` executes a copy of
/// `true --version`, which writes) must write neither into the report on stdout nor onto the
/// launcher's stderr (the operator's terminal, `run`'s log). Both go to /dev/null. Where the
/// view has none the role may open (the matrix's columns without namespaces show the host's
/// /dev on a nodev mount), both go to a pipe no one reads whose read end stays open: a short
/// write then lands in its buffer instead of failing. Never closed: a program run with a
/// closed stdout reports `write error: Bad file descriptor` on stderr, and the attempt's next
/// open would take fd 1 or 2.
fn quiet_stdout_and_stderr() {
    use std::os::fd::IntoRawFd;
    let sink = match open_path("/dev/null", libc::O_WRONLY | libc::O_CLOEXEC, 0) {
        Ok(null) => Some(null),
        // Both ends stay open (the read end across exec too) until the child exits.
        Err(_) => nix::unistd::pipe().ok().map(|(r, w)| {
            let _ = r.into_raw_fd();
            w.into_raw_fd()
        }),
    };
    if let Some(fd) = sink {
        let _ = nix::unistd::dup2_stdout(unsafe_borrow(fd));
        let _ = nix::unistd::dup2_stderr(unsafe_borrow(fd));
    }
}

/// Fork, run the attempt in the child, report its outcome through a pipe.
fn fork_attempt(attempt: Attempt, ctx: &Ctx) -> Outcome {
    let Ok((r, w)) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC) else {
        return Outcome { ok: false, errno: Some(libc::EMFILE), signal: None };
    };
    // SAFETY: the probe is single-threaded; the child only runs the attempt and exits.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(r);
            quiet_stdout_and_stderr();
            let res = attempt(ctx);
            let (ok, errno) = match res {
                Ok(()) => (1u8, 0i32),
                Err(Errno::UnknownErrno) => (0, 0),
                Err(e) => (0, e as i32),
            };
            let mut rec = [0u8; 5];
            rec[0] = ok;
            rec[1..].copy_from_slice(&errno.to_ne_bytes());
            use std::os::fd::AsRawFd;
            let _ = crate::os::sys::write_all(w.as_raw_fd(), &rec);
            crate::os::sys::exit_now(0)
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(w);
            let mut rec = [0u8; 5];
            use std::os::fd::AsRawFd;
            let n = crate::os::sys::read_retry(r.as_raw_fd(), &mut rec).unwrap_or(0);
            let status = nix::sys::wait::waitpid(child, None);
            let signal = match status {
                Ok(nix::sys::wait::WaitStatus::Signaled(_, s, _)) => Some(s as i32),
                _ => None,
            };
            if n == 5 {
                let errno = i32::from_ne_bytes([rec[1], rec[2], rec[3], rec[4]]);
                Outcome { ok: rec[0] == 1, errno: (errno != 0).then_some(errno), signal }
            } else {
                Outcome { ok: false, errno: None, signal }
            }
        }
        Err(e) => Outcome { ok: false, errno: Some(e as i32), signal: None },
    }
}

/// Entry point inside the sandbox: run the listed attempts, print one JSON object
/// {id: outcome} on stdout.
pub fn main(ctx_json: &str, ids: &[String]) -> i32 {
    let _ = INHERITED.set(count_fds());
    let _ = INIT.set(nix::unistd::getppid().as_raw());
    let Ok(ctx) = serde_json::from_str::<Ctx>(ctx_json) else { return 2 };
    let mut attempts = Vec::with_capacity(ids.len());
    for id in ids {
        match lookup(id) {
            Some(f) => attempts.push((id.clone(), f)),
            None => {
                eprintln!("sealnode canary-inside: no attempt named {id:?}");
                return 2;
            }
        }
    }
    let out: BTreeMap<String, Outcome> = attempts.into_iter().map(|(id, f)| (id, fork_attempt(f, &ctx))).collect();
    match serde_json::to_string(&out) {
        Ok(s) => {
            println!("{s}");
            0
        }
        Err(_) => 1,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn every_spec_has_exactly_one_attempt_and_every_attempt_a_spec() {
        let mut table: Vec<&str> = super::ATTEMPTS.iter().map(|(id, _)| *id).collect();
        let n = table.len();
        table.sort_unstable();
        table.dedup();
        assert_eq!(table.len(), n, "an attempt id is listed twice");
        let mut specs: Vec<&str> = super::super::SPECS.iter().map(|s| s.id).collect();
        specs.sort_unstable();
        assert_eq!(table, specs);
        assert!(super::lookup("no_such_attempt").is_none());
    }
}
