//! The cell: the user namespace each role's own user namespace is made in, and one network
//! namespace per role, each holding only its own loopback.
//!
//! A small cell init process creates the user namespace and the **node's** network namespace,
//! brings `lo` up there, sets the seal's sysctls there (`namespaces::NETNS_SYSCTLS`) and binds, in it, one listener per egress upstream on a cell-local
//! address and one on `127.0.0.1:<engine.port>` (binding port 443 is fine: it is privileged in
//! the cell's user namespace). Then it creates the **engine's** network namespace (unshare),
//! brings its `lo` up and sets the same sysctls. Each role is cloned into a user namespace of
//! its own, a child of the cell's, so it holds no capability over either network namespace:
//! what is set in them is set here. It confines itself, then hands the listeners and both namespaces to the
//! supervisor over a socketpair (SCM_RIGHTS; a socket stays in the netns it was created in),
//! so a start never proceeds with an unconfined cell init. Then it serves as a socket factory:
//! each request byte gets back a fresh TCP socket created in the engine's namespace, which
//! the supervisor uses to probe the engine's readiness and to forward the node's connections
//! to the engine's port (that port only). This works rootless, where the supervisor itself
//! cannot enter the cell. The supervisor keeps fds of all three
//! namespaces, so they outlive any role restart.

use std::io::{IoSlice, IoSliceMut};
use std::net::Ipv4Addr;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sched::CloneFlags;
use nix::sys::signal::{kill, Signal};
use nix::sys::socket::{
    bind, listen, recvmsg, sendmsg, setsockopt, socket, socketpair, sockopt, AddressFamily, Backlog, ControlMessage,
    ControlMessageOwned, MsgFlags, SockFlag, SockType, SockaddrIn,
};
use nix::sys::wait::waitpid;
use nix::unistd::{pipe2, Pid};

use crate::config::{Config, Ids, Invoker, Role};
use crate::error::{Error, Result};
use crate::os::sys;
use crate::policy;
use crate::sandbox::protocol::{must, Failure, Frame, Reap, Step as _};
use crate::sandbox::{caps, idmap, namespaces};

/// The cell init's setup steps, in order ([`cell_main`]); a failure names one of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    DieWithParent,
    CloseInheritedFds,
    WaitForIdMaps,
    ScratchTmpfs,
    LoopbackUp,
    NetSysctls,
    EgressListen,
    EngineListen,
    EngineNetns,
    Confine,
    SendListeners,
}

impl crate::sandbox::protocol::Step for Step {
    const ALL: &'static [Step] = &[
        Step::DieWithParent,
        Step::CloseInheritedFds,
        Step::WaitForIdMaps,
        Step::ScratchTmpfs,
        Step::LoopbackUp,
        Step::NetSysctls,
        Step::EgressListen,
        Step::EngineListen,
        Step::EngineNetns,
        Step::Confine,
        Step::SendListeners,
    ];
    fn name(self) -> &'static str {
        match self {
            Step::DieWithParent => "die_with_parent",
            Step::CloseInheritedFds => "close_inherited_fds",
            Step::WaitForIdMaps => "wait_for_id_maps",
            Step::ScratchTmpfs => "scratch_tmpfs",
            Step::LoopbackUp => "loopback_up",
            Step::NetSysctls => "net_sysctls",
            Step::EgressListen => "egress_listen",
            Step::EngineListen => "engine_listen",
            Step::EngineNetns => "engine_netns",
            Step::Confine => "confine",
            Step::SendListeners => "send_listeners",
        }
    }
}

#[derive(Debug)]
pub struct Cell {
    /// Host pid of the cell init.
    pub pid: Pid,
    userns: OwnedFd,
    /// The node's network namespace (egress listeners, the engine-port listener).
    node_netns: OwnedFd,
    /// The engine's network namespace: its own loopback and nothing else.
    engine_netns: OwnedFd,
    /// The cell's mount namespace, when a role's scratch is capped: there, a tmpfs of the
    /// cap's size covers that scratch dir, for the cell's lifetime. Roles are cloned from it.
    mntns: Option<OwnedFd>,
    /// Role ids are separate host users (the wipe clears supplementary groups then).
    rootful: bool,
    /// The capped scratch dirs: each role's tmpfs in `mntns`, held by its root (O_PATH) since
    /// the cell init mounted it, for the wipes: a path walk would need search rights on the
    /// host dirs above it, which the role's ids may lack (found by review).
    scratch: Vec<(Role, OwnedFd)>,
    /// Supervisor's end of the SOCK_SEQPACKET pair to the cell init.
    ctl: OwnedFd,
    /// One listener per egress upstream, inside the node's netns, non-blocking.
    pub listeners: Vec<OwnedFd>,
    /// The node's way to the engine: 127.0.0.1:<engine.port> in the node's netns, forwarded
    /// by the supervisor to the same port in the engine's netns.
    pub engine_listener: Option<OwnedFd>,
    /// The roles' cgroup leaves, when the cell has them (cgroup::Tree::setup): every role
    /// and preflight sandbox of this cell is cloned into its role's leaf.
    pub cgroups: Option<crate::sandbox::cgroup::Tree>,
    _alive: OwnedFd,
}

/// A capped scratch: the tmpfs the cell init mounts over `path` in the cell's mount namespace.
#[derive(Debug, Clone)]
pub struct Scratch {
    pub role: Role,
    pub path: std::ffi::CString,
    pub mb: u64,
    pub uid: u32,
    pub gid: u32,
}

/// Whose network namespace a process joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    Engine,
    Node,
}

fn listener(addr: Ipv4Addr, port: u16) -> std::result::Result<OwnedFd, Errno> {
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(fd.as_raw_fd(), &SockaddrIn::from(std::net::SocketAddrV4::new(addr, port)))?;
    listen(&fd, Backlog::new(128)?)?;
    Ok(fd)
}

/// The cell init, in the new user namespace and the node's network namespace. Never returns.
/// One step per line; a failure goes to the supervisor as a frame on `ctl`.
fn cell_main(
    sync: RawFd,
    ctl: RawFd,
    egress: &[(Ipv4Addr, u16)],
    engine_port: Option<u16>,
    scratch: &[Scratch],
    abi: u8,
) -> ! {
    // First: if the supervisor dies from here on, so does the cell (and both namespaces).
    must(ctl, Step::DieWithParent, 0, sys::die_with_parent());
    // Nothing of the supervisor's but these two may live in the cell.
    must(ctl, Step::CloseInheritedFds, 0, sys::close_all_except(&[sync, ctl]));
    // Binding and unsharing need our ids mapped: the supervisor writes the maps, then one byte.
    must(ctl, Step::WaitForIdMaps, 0, wait_byte(sync));
    // Capped scratch: the cell's own mount namespace, a tmpfs of the cap's size over each
    // capped scratch dir (owned by the role's ids, which the maps made valid here).
    let (mntns, roots) = match scratch.is_empty() {
        true => (None, Vec::new()),
        false => {
            let (ns, roots) = must(ctl, Step::ScratchTmpfs, 0, scratch_mounts(scratch));
            (Some(ns), roots)
        }
    };
    // The node's loopback, which its egress listeners and the engine-port listener live on.
    must(ctl, Step::LoopbackUp, 0, sys::loopback_up());
    // One listener per egress upstream, before anything could take its address.
    let mut fds: Vec<OwnedFd> =
        egress.iter().enumerate().map(|(i, (a, p))| must(ctl, Step::EgressListen, i, listener(*a, *p))).collect();
    // The node's way to the engine: its 127.0.0.1:<engine.port>, forwarded by the supervisor.
    if let Some(port) = engine_port {
        fds.push(must(ctl, Step::EngineListen, 0, listener(Ipv4Addr::LOCALHOST, port)));
    }
    // Held before leaving it: the node's namespace, for the supervisor to clone the node into.
    fds.push(must(ctl, Step::EngineNetns, 0, open_netns()));
    // The engine's namespace: from here on the init (and every socket it makes) is in it.
    must(ctl, Step::EngineNetns, 1, sys::unshare_verified(CloneFlags::CLONE_NEWNET));
    must(ctl, Step::EngineNetns, 2, sys::loopback_up());
    fds.push(must(ctl, Step::EngineNetns, 3, open_netns()));
    // The seal's sysctls in both network namespaces, while CAP_NET_ADMIN over them is ours (a
    // role's own user namespace holds none): by a child that can mount a /proc showing them.
    must(ctl, Step::NetSysctls, SYSCTL_CHILD_START, net_sysctls_by_child(ctl, &fds[fds.len() - 2..]));
    fds.extend(mntns);
    fds.extend(roots);
    // Confined before anything is handed out: nothing but socket creation is left to it.
    must(ctl, Step::Confine, 0, caps::drop_all());
    must(ctl, Step::Confine, 1, sys::prctl(libc::PR_SET_DUMPABLE, 0));
    must(ctl, Step::Confine, 2, policy::landlock::deny_all(abi).map_err(policy::landlock::ApplyError::errno));
    // Last: the listeners and both namespaces, with an Ok frame, as one message.
    must(ctl, Step::SendListeners, 0, send_fds(ctl, Frame::Ok(fds.len() as u32), &fds));
    drop(fds);
    serve_sockets(ctl)
}

/// Each capped scratch's root, as the cell init sent it, read back: a tmpfs of the cap's size
/// and inodes (a faked mount would leave the wipes the host dir beneath it, not the cap).
fn capped_roots(scratch: &[Scratch], roots: Vec<OwnedFd>) -> Result<Vec<(Role, OwnedFd)>> {
    let mut held = Vec::with_capacity(roots.len());
    for (s, root) in scratch.iter().zip(roots) {
        let fs = nix::sys::statfs::fstatfs(&root).map_err(|e| Error::errno("fstatfs a capped scratch", e))?;
        let size = fs.blocks() * fs.block_size() as u64;
        let inodes = crate::sandbox::table::scratch_tmpfs_inodes(s.mb);
        if fs.filesystem_type() != nix::sys::statfs::TMPFS_MAGIC || size != s.mb << 20 || fs.files() != inodes {
            return Err(Error::Unsupported {
                what: format!(
                    "the cell's capped scratch of the {} role is not a tmpfs of {} MiB and {inodes} inodes as the \
                     kernel shows it",
                    s.role, s.mb
                ),
                fix: "a seccomp filter above sealnode fakes mount: allow it (`sealnode doctor` tries it)".into(),
            });
        }
        held.push((s.role, root));
    }
    Ok(held)
}

/// [`Cell::check_role_userns`]: `pid`'s user namespace is not `cell_userns`, and its parent is.
fn own_child_userns(cell_userns: std::os::fd::BorrowedFd, pid: Pid) -> Result<()> {
    let at = format!("/proc/{pid}/ns/user");
    let ns = nix::fcntl::open(at.as_str(), OFlag::O_RDONLY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
        .map_err(|e| Error::errno(format!("open {at}"), e))?;
    let id = |fd: std::os::fd::BorrowedFd| nix::sys::stat::fstat(fd).map(|s| (s.st_dev, s.st_ino));
    let cell = id(cell_userns).map_err(|e| Error::errno("fstat the cell's user namespace", e))?;
    let own = id(ns.as_fd()).map_err(|e| Error::errno(format!("fstat {at}"), e))?;
    let parent = sys::userns_parent(ns.as_fd()).map_err(|e| Error::errno(format!("NS_GET_PARENT of {at}"), e))?;
    if own == cell || parent != cell {
        return Err(Error::Unsupported {
            what: "a role's own user namespace: the role is not in a user namespace of its own inside the cell's \
                   (a filter above sealnode fakes clone's CLONE_NEWUSER)"
                .into(),
            fix: "allow clone and clone3 with namespace flags (`sealnode doctor` tries them)".into(),
        });
    }
    Ok(())
}

/// The seal's sysctls (`namespaces::NETNS_SYSCTLS`) in each of `netns` (the node's, then the
/// engine's), written by a child in a pid and a mount namespace of its own, both owned by the
/// cell's user namespace as the network namespaces are: there it mounts a fresh /proc, since
/// sealnode's own may show no /proc/sys (`ProcSubset=pid` under the units) or a read-only one
/// (the kernel allows that mount where it allows each role's own /proc). The child reports a
/// failed item on `ctl` itself (item 0: the fresh /proc; then 1 + netns index × sysctls +
/// sysctl index); how it ended otherwise, this process reports.
fn net_sysctls_by_child(ctl: RawFd, netns: &[OwnedFd]) -> std::result::Result<(), Errno> {
    // SAFETY: the cell init is single-threaded.
    let pid = unsafe { sys::clone_fork(libc::CLONE_NEWPID | libc::CLONE_NEWNS) }?;
    if pid == 0 {
        let n = namespaces::NETNS_SYSCTLS.len();
        let at = |item: usize| move |e| crate::sandbox::protocol::fail(ctl, Step::NetSysctls, item, e);
        // Nothing mounted here reaches another mount namespace.
        let none: Option<&str> = None;
        let private = nix::mount::MsFlags::MS_REC | nix::mount::MsFlags::MS_PRIVATE;
        nix::mount::mount(none, "/", none, private, none).unwrap_or_else(at(0));
        let flags = nix::mount::MsFlags::MS_NOSUID | nix::mount::MsFlags::MS_NODEV | nix::mount::MsFlags::MS_NOEXEC;
        nix::mount::mount(Some("proc"), "/proc", Some("proc"), flags, none).unwrap_or_else(at(0));
        for (k, ns) in netns.iter().enumerate() {
            sys::setns_verified(ns.as_fd(), CloneFlags::CLONE_NEWNET).unwrap_or_else(at(1 + k * n));
            if let Err((i, e)) = net_sysctls() {
                at(1 + k * n + i)(e)
            }
        }
        sys::exit_now(0)
    }
    // How it ended, when it did not succeed, as an item of its own: the supervisor takes the
    // first report on ctl, the child's own where it made one (found by review: a child killed
    // or ended without a word was told as a failed /proc mount, or as no report at all).
    let item = match waitpid(Pid::from_raw(pid), None)? {
        nix::sys::wait::WaitStatus::Exited(_, 0) => return Ok(()),
        nix::sys::wait::WaitStatus::Exited(_, code) => SYSCTL_CHILD_EXITED + code as usize,
        nix::sys::wait::WaitStatus::Signaled(_, sig, _) => SYSCTL_CHILD_KILLED + sig as usize,
        _ => SYSCTL_CHILD_KILLED,
    };
    crate::sandbox::protocol::fail(ctl, Step::NetSysctls, item, Errno::ECHILD)
}

/// Items of a failed `net_sysctls` past the child's own: it could not be started (or waited
/// for), it exited with a status (added), or was killed by a signal (added).
const SYSCTL_CHILD_START: usize = 999;
const SYSCTL_CHILD_EXITED: usize = 1000;
const SYSCTL_CHILD_KILLED: usize = 2000;

/// The seal's sysctls written in this thread's network namespace (/proc/sys/net is the
/// opener's), each read back; an absent optional one is skipped. The failed item's index.
fn net_sysctls() -> std::result::Result<(), (usize, Errno)> {
    for (i, (p, value, optional)) in namespaces::NETNS_SYSCTLS.iter().enumerate() {
        match sys::write_sysctl(&std::path::Path::new("/proc/sys").join(p), value) {
            Err(Errno::ENOENT) if *optional => continue,
            r => r.map_err(|e| (i, e))?,
        }
    }
    Ok(())
}

/// A new mount namespace (nothing propagates back to the host), a tmpfs over each capped
/// scratch dir; returns the namespace and each tmpfs's root (O_PATH), in `scratch`'s order.
fn scratch_mounts(scratch: &[Scratch]) -> std::result::Result<(OwnedFd, Vec<OwnedFd>), Errno> {
    use nix::mount::{mount, MsFlags};
    sys::unshare_verified(CloneFlags::CLONE_NEWNS)?;
    mount(None::<&str>, "/", None::<&str>, MsFlags::MS_REC | MsFlags::MS_PRIVATE, None::<&str>)?;
    sys::no_propagation()?;
    // Each tmpfs is read back by the role that binds it (its size and type: Check::Tmpfs).
    let mut roots = Vec::with_capacity(scratch.len());
    for s in scratch {
        // The dir reached without following symlinks, mounted on through its fd.
        // SAFETY: walk_no_symlinks returns an fd we own.
        let dir = unsafe { OwnedFd::from_raw_fd(sys::walk_no_symlinks(&s.path)?) };
        let at = format!("/proc/self/fd/{}", dir.as_raw_fd());
        let opts = crate::sandbox::table::scratch_tmpfs_options(s.mb, s.uid, s.gid);
        let flags = MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC;
        mount(Some("tmpfs"), at.as_str(), Some("tmpfs"), flags, Some(opts.as_str()))?;
        // The walk again, which now ends on the tmpfs's root (the supervisor reads it back).
        // SAFETY: walk_no_symlinks returns an fd we own.
        roots.push(unsafe { OwnedFd::from_raw_fd(sys::walk_no_symlinks(&s.path)?) });
    }
    let ns = nix::fcntl::open("/proc/self/ns/mnt", OFlag::O_RDONLY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())?;
    Ok((ns, roots))
}

fn wait_byte(sync: RawFd) -> std::result::Result<(), Errno> {
    let mut b = [0u8; 1];
    match sys::read_retry(sync, &mut b)? {
        1 => Ok(()),
        _ => Err(Errno::EPIPE),
    }
}

fn open_netns() -> std::result::Result<OwnedFd, Errno> {
    nix::fcntl::open("/proc/self/ns/net", OFlag::O_RDONLY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty())
}

fn send_fds(ctl: RawFd, frame: Frame, fds: &[OwnedFd]) -> std::result::Result<(), Errno> {
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let bytes = frame.encode();
    let cmsgs: &[ControlMessage] = if raw.is_empty() { &[] } else { &cmsg };
    sendmsg::<()>(ctl, &[IoSlice::new(&bytes)], cmsgs, MsgFlags::empty(), None).map(drop)
}

/// The cell init's life after setup: each request byte gets back a fresh TCP socket made in
/// the engine's namespace (an `Ok` frame with the fd), or a failure frame. Exits when the
/// supervisor's end closes.
fn serve_sockets(ctl: RawFd) -> ! {
    loop {
        let mut req = [0u8; 1];
        match nix::sys::socket::recv(ctl, &mut req, MsgFlags::empty()) {
            Ok(1) => {}
            Err(Errno::EINTR) => continue,
            _ => sys::exit_now(0),
        }
        let sent =
            match socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)
            {
                Ok(s) => send_fds(ctl, Frame::Ok(1), &[s]),
                Err(e) => send_fds(ctl, Frame::Failed { step: 0, item: 0, errno: e as i32 }, &[]),
            };
        if sent.is_err() {
            sys::exit_now(0);
        }
    }
}

/// Receive one message with up to `max_fds` fds; returns (payload, fds).
fn recv_with_fds(ctl: RawFd, max_fds: usize) -> std::result::Result<(Vec<u8>, Vec<OwnedFd>), Errno> {
    let mut buf = [0u8; 64];
    let mut space = vec![0u8; nix::sys::socket::cmsg_space::<RawFd>() * max_fds.max(1) + 64];
    let mut iov = [IoSliceMut::new(&mut buf)];
    let msg = recvmsg::<()>(ctl, &mut iov, Some(&mut space), MsgFlags::MSG_CMSG_CLOEXEC)?;
    let n = msg.bytes;
    // Fds or payload cut off: never act on part of a message.
    let truncated = msg.flags.intersects(MsgFlags::MSG_CTRUNC | MsgFlags::MSG_TRUNC);
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                // SAFETY: the kernel just installed these fds in our table; we own them now.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    if truncated {
        return Err(Errno::EMSGSIZE);
    }
    Ok((buf[..n].to_vec(), fds))
}

impl Cell {
    /// The cell `run` and the canary use for `cfg`: both roles' ids mapped, one listener per
    /// node egress upstream, the engine-port listener when the engine has a port.
    pub fn for_config(cfg: &Config, inv: &Invoker) -> Result<Cell> {
        let (ids, abi) = Cell::ids_and_abi(cfg)?;
        let egress: Vec<(Ipv4Addr, u16)> =
            cfg.node.egress.iter().enumerate().map(|(i, e)| (Config::egress_addr(i), e.port as u16)).collect();
        let mut scratch = Vec::new();
        for (role, id) in Role::ALL.iter().zip(&ids) {
            if let Some(mb) = cfg.role(*role).scratch_max_mb {
                let path = std::ffi::CString::new(cfg.role(*role).scratch.as_os_str().as_encoded_bytes())
                    .map_err(|_| Error::config(&cfg.file, format!("{role}.scratch"), "contains a NUL byte"))?;
                scratch.push(Scratch { role: *role, path, mb, uid: id.uid, gid: id.gid });
            }
        }
        Cell::create(&ids, inv.rootful(), &egress, cfg.engine.port.map(|p| p as u16), &scratch, abi)
    }

    /// The host ids the cell maps (each role's) and the Landlock ABI its init confines itself
    /// with, which this kernel must have: refused here with the fix, not with the init's EPERM.
    fn ids_and_abi(cfg: &Config) -> Result<(Vec<Ids>, u8)> {
        let ids: Vec<_> = Role::ALL.iter().map(|r| cfg.role_ids(*r)).collect::<Result<_>>()?;
        let (_, ll) = cfg.policy_files(Role::Node)?;
        let abi = policy::landlock::Rules::from_loaded(&ll.bytes, &cfg.node.landlock)?.min_abi;
        policy::landlock::require_kernel_abi(abi, &cfg.node.landlock)?;
        Ok((ids, abi))
    }

    /// For `sealnode check`: what [`Cell::for_config`] needs before it creates anything.
    pub fn requirements(cfg: &Config) -> Result<String> {
        let (ids, abi) = Cell::ids_and_abi(cfg)?;
        let ids: Vec<_> = ids.iter().map(|i| format!("{}:{}", i.uid, i.gid)).collect();
        Ok(format!("maps {}; Landlock ABI {abi}", ids.join(" and ")))
    }

    /// Create the cell. `ids` are the host ids mapped 1:1 into its user namespace (both roles'
    /// when rootful, the invoking user's when rootless). `engine_port`: the port the node
    /// reaches the engine on (forwarded), if the engine has one.
    pub fn create(
        ids: &[Ids],
        rootful: bool,
        egress: &[(Ipv4Addr, u16)],
        engine_port: Option<u16>,
        scratch: &[Scratch],
        landlock_abi: u8,
    ) -> Result<Cell> {
        let (sup, child) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .map_err(|e| Error::errno("socketpair", e))?;
        let (sync_r, sync_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2", e))?;
        // SAFETY: the supervisor is single-threaded.
        let pid = unsafe { sys::clone_fork(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) }.map_err(|e| {
            let (what, fix) = namespaces::explain_userns_failure(e);
            Error::Unsupported { what, fix }
        })?;
        if pid == 0 {
            drop(sup);
            drop(sync_w);
            cell_main(sync_r.as_raw_fd(), child.as_raw_fd(), egress, engine_port, scratch, landlock_abi);
        }
        drop(child);
        drop(sync_r);
        let pid = Pid::from_raw(pid);
        let reap = Reap(pid);
        // Its status, opened now for the same reason (read once it has confined itself).
        let mut status = crate::sandbox::shown::InitFiles::open(pid);
        // Hold the namespaces now: once the cell init confines itself (not dumpable) its
        // /proc/PID/ns entries are closed to a rootless supervisor.
        let userns = nix::fcntl::open(
            format!("/proc/{pid}/ns/user").as_str(),
            OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| reap.abort(Error::errno(format!("open /proc/{pid}/ns/user"), e)))?;
        let uids: Vec<u32> = ids.iter().map(|i| i.uid).collect();
        let gids: Vec<u32> = ids.iter().map(|i| i.gid).collect();
        idmap::write(pid, &uids, &gids, rootful).map_err(|e| reap.abort(e))?;
        let released = sys::write_all(sync_w.as_raw_fd(), &[1]);
        let wanted =
            egress.len() + usize::from(engine_port.is_some()) + 2 + usize::from(!scratch.is_empty()) + scratch.len();
        // Its report, whether it was released or failed before (found by review: a failure
        // before the release was told as "release cell init: Broken pipe", its report dropped).
        let (payload, mut listeners) = recv_with_fds(sup.as_raw_fd(), wanted).map_err(|e| {
            let e = match released {
                Err(r) => Error::errno("release cell init", r),
                Ok(()) => Error::errno("receive cell listeners", e),
            };
            reap.abort(e)
        })?;
        match Frame::decode(&payload) {
            Some(Frame::Ok(n)) if n as usize == wanted && listeners.len() == wanted => {}
            Some(f @ Frame::Failed { .. }) => {
                let _ = waitpid(pid, None);
                return Err(match f.failure::<Step>() {
                    Some(Ok(failure)) => setup_error(failure, egress, engine_port),
                    _ => Error::errno("the cell init's report", Errno::EPROTO),
                });
            }
            _ => {
                return Err(reap.abort(match released {
                    Err(e) => Error::errno("release cell init", e),
                    Ok(()) => Error::errno("cell init sent no listeners", Errno::EPROTO),
                }))
            }
        }
        // Sent in order: the egress listeners, the engine-port listener, the two network
        // namespaces, the mount namespace and each capped scratch's root (capped scratch only).
        let roots = listeners.split_off(listeners.len() - scratch.len());
        let scratch = capped_roots(scratch, roots).map_err(|e| reap.abort(e))?;
        let mntns = if scratch.is_empty() {
            None
        } else {
            Some(listeners.pop().ok_or_else(|| reap.abort(Error::errno("cell namespaces", Errno::EPROTO)))?)
        };
        let engine_netns = listeners.pop().ok_or_else(|| reap.abort(Error::errno("cell namespaces", Errno::EPROTO)))?;
        let node_netns = listeners.pop().ok_or_else(|| reap.abort(Error::errno("cell namespaces", Errno::EPROTO)))?;
        let engine_listener = if engine_port.is_some() { listeners.pop() } else { None };
        // Three network namespaces, each its own: the engine's, the node's, the host's (found
        // by review: a faked unshare put both roles in one; the init reads it back as well).
        let ns = |fd: std::os::fd::BorrowedFd| nix::sys::stat::fstat(fd).map(|s| (s.st_dev, s.st_ino));
        let host = nix::sys::stat::stat("/proc/thread-self/ns/net").map(|s| (s.st_dev, s.st_ino));
        match (ns(engine_netns.as_fd()), ns(node_netns.as_fd()), host) {
            (Ok(e), Ok(n), Ok(h)) if e != n && e != h && n != h => {}
            _ => return Err(reap.abort(Error::Unsupported {
                what:
                    "the cell's network namespaces are not three distinct ones (the engine's, the node's, the host's)"
                        .into(),
                fix:
                    "a seccomp filter above sealnode fakes unshare or setns: allow them (`sealnode doctor` tries them)"
                        .into(),
            })),
        }
        // The init confined itself (every capability, no_new_privs) as the kernel shows it
        // (found by review: a faked capset with a faked capget left it every capability).
        // Not shown here at all (hidepid at its clone: not the launcher's own): not checked.
        let confined = status.status().map(|t| crate::sandbox::shown::status(&t));
        if confined.as_ref().is_some_and(|s| !s.as_ref().is_some_and(|s| s.caps == [0; 5] && s.no_new_privs)) {
            return Err(reap.abort(Error::Unsupported {
                what: format!("the cell's init is not confined as the kernel shows it: {confined:?}"),
                fix: "a seccomp filter above sealnode fakes capset, capget or prctl: allow them (`sealnode doctor` tries them)".into(),
            }));
        }
        Ok(Cell {
            pid,
            userns,
            node_netns,
            engine_netns,
            mntns,
            rootful,
            scratch,
            ctl: sup,
            listeners,
            engine_listener,
            cgroups: None,
            _alive: sync_w,
        })
    }

    /// A fresh non-blocking TCP socket inside the engine's network namespace.
    pub fn engine_socket(&self) -> Result<OwnedFd> {
        engine_socket(&self.ctl).map_err(|e| Error::errno("a socket in the engine's namespace", e))
    }

    /// A handle that makes sockets in the engine's namespace (for the forwarder).
    pub fn engine_sockets(&self) -> Result<EngineSockets> {
        Ok(EngineSockets(self.ctl.try_clone().map_err(|e| Error::io("dup the cell's socket factory", e))?))
    }

    /// Read back that the role `pid`, just cloned into the cell, is in a user namespace of its
    /// own whose parent is the cell's (found by review: rootless, a faked CLONE_NEWUSER with
    /// faked map writes left a role in the cell's namespace, and no check saw it; the canary
    /// fact cannot tell where the cell maps one id).
    pub fn check_role_userns(&self, pid: Pid) -> Result<()> {
        own_child_userns(self.userns.as_fd(), pid)
    }

    /// Enter the cell's user namespace and `net`'s network namespace (in a short-lived
    /// intermediate process).
    pub fn join(&self, net: Net) -> std::result::Result<(), Errno> {
        sys::setns_verified(self.userns.as_fd(), CloneFlags::CLONE_NEWUSER)?;
        // The cell's mount namespace (capped scratch): the role's own is copied from it.
        if let Some(m) = &self.mntns {
            sys::setns_verified(m.as_fd(), CloneFlags::CLONE_NEWNS)?;
        }
        let ns = match net {
            Net::Engine => &self.engine_netns,
            Net::Node => &self.node_netns,
        };
        sys::setns_verified(ns.as_fd(), CloneFlags::CLONE_NEWNET)
    }
}

impl Cell {
    /// Listeners bound in the node's network namespace at `addrs` (a reload's new egress,
    /// while the node is down), made by a short-lived child that joins the cell's user
    /// namespace and the node's network namespace and hands them back over a socketpair
    /// (a socket stays in the namespace it was made in), as the cell init handed the first.
    pub fn node_listeners(&self, addrs: &[(Ipv4Addr, u16)]) -> Result<Vec<OwnedFd>> {
        if addrs.is_empty() {
            return Ok(Vec::new());
        }
        let (ours, theirs) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .map_err(|e| Error::errno("socketpair", e))?;
        // SAFETY: the supervisor is single-threaded; the child only joins two namespaces,
        // binds sockets, sends them and exits.
        match unsafe { nix::unistd::fork() }.map_err(|e| Error::errno("fork", e))? {
            nix::unistd::ForkResult::Child => {
                drop(ours);
                let _ = nix::sys::prctl::set_name(c"sealnode-listen");
                let (step, item, errno) = match self.listen_child(addrs, theirs.as_raw_fd()) {
                    Ok(()) => sys::exit_now(0),
                    Err((item, e)) => (Step::EgressListen as u32, item as u32, e as i32),
                };
                let _ = send_fds(theirs.as_raw_fd(), Frame::Failed { step, item, errno }, &[]);
                sys::exit_now(1)
            }
            nix::unistd::ForkResult::Parent { child } => {
                drop(theirs);
                let got = recv_with_fds(ours.as_raw_fd(), addrs.len());
                let _ = waitpid(child, None);
                let (payload, fds) = got.map_err(|e| Error::errno("receive the node's new listeners", e))?;
                match Frame::decode(&payload) {
                    Some(Frame::Ok(n)) if n as usize == addrs.len() && fds.len() == addrs.len() => Ok(fds),
                    Some(Frame::Failed { item, errno, .. }) if fds.is_empty() => {
                        let (a, p) = addrs.get(item as usize).copied().unwrap_or((Ipv4Addr::UNSPECIFIED, 0));
                        Err(Error::Setup {
                            step: Step::EgressListen.name(),
                            detail: format!("cell: listen on {a}:{p}"),
                            errno: Errno::from_raw(errno),
                        })
                    }
                    _ => Err(Error::errno("the node's new listeners", Errno::EPROTO)),
                }
            }
        }
    }

    /// The listening child: in the node's network namespace, one listener per address, sent
    /// back in order; the index of the address that failed, with why.
    fn listen_child(&self, addrs: &[(Ipv4Addr, u16)], to: RawFd) -> std::result::Result<(), (usize, Errno)> {
        let at0 = |e| (0, e);
        // Never outlives the supervisor, which waits for it.
        sys::die_with_parent().map_err(at0)?;
        sys::setns_verified(self.userns.as_fd(), CloneFlags::CLONE_NEWUSER).map_err(at0)?;
        sys::setns_verified(self.node_netns.as_fd(), CloneFlags::CLONE_NEWNET).map_err(at0)?;
        let fds = addrs
            .iter()
            .enumerate()
            .map(|(i, (a, p))| listener(*a, *p).map_err(|e| (i, e)))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        send_fds(to, Frame::Ok(fds.len() as u32), &fds).map_err(at0)
    }
}

impl Cell {
    /// The root of the cell's tmpfs over `role`'s scratch dir, when that scratch is capped.
    pub fn capped_scratch(&self, role: Role) -> Option<std::os::fd::BorrowedFd<'_>> {
        self.scratch.iter().find(|(r, _)| *r == role).map(|(_, fd)| fd.as_fd())
    }

    /// Empty a role's scratch dir `dir` (its descriptor: the uncapped dir opened once when the
    /// run began, or the capped one's tmpfs root held since the cell was made; never a path
    /// walked again) with crate::os::wipe, in a short-lived child that joins the cell's user
    /// namespace and becomes the role's own ids there: it can remove whatever the role could
    /// have left, and nothing else (a file of another host user, a mount point: EACCES, EBUSY).
    /// The supervisor needs no host CAP_DAC_OVERRIDE. The child's pid is returned at once: what
    /// a role left is of any size, so the supervisor's loop reaps it like any child
    /// ([`wipe_result`]) and keeps serving.
    pub fn spawn_wipe(&self, dir: std::os::fd::BorrowedFd, ids: Ids) -> std::result::Result<Pid, Errno> {
        // SAFETY: the supervisor is single-threaded; the child only joins namespaces, drops to
        // the role's ids, removes files and exits.
        match unsafe { nix::unistd::fork() }? {
            nix::unistd::ForkResult::Child => {
                // Named for `ps` (and the tests that find it).
                let _ = nix::sys::prctl::set_name(c"sealnode-wipe");
                let code = match self.wipe_child(dir, ids) {
                    Ok(()) => 0,
                    Err(e) => wipe_code(e),
                };
                sys::exit_now(code)
            }
            nix::unistd::ForkResult::Parent { child } => Ok(child),
        }
    }

    fn wipe_child(&self, dir: std::os::fd::BorrowedFd, ids: Ids) -> std::result::Result<(), WipeFailed> {
        self.become_role_in_cell(ids).map_err(WipeFailed::Entering)?;
        crate::os::wipe::empty_dir(dir).map_err(WipeFailed::Errno)
    }

    /// Join the cell as the role: its user namespace, the role's own ids, no capability left.
    fn become_role_in_cell(&self, ids: Ids) -> std::result::Result<(), Errno> {
        // A wipe never outlives the supervisor (a new one would race it).
        sys::die_with_parent()?;
        sys::setns_verified(self.userns.as_fd(), CloneFlags::CLONE_NEWUSER)?;
        // The role's own ids in the cell before anything is opened: no supplementary group,
        // no capability left, only what the role itself may touch (its own scratch dir).
        if sys::clear_groups().is_err() && self.rootful {
            return Err(Errno::EPERM);
        }
        sys::set_ids(ids.uid, ids.gid)?;
        // The change kept every capability in the cell (the kernel drops them only on leaving
        // the namespace's own uid 0, which the cell does not map): all five sets emptied,
        // no_new_privs, read back (found by review: the wipe ran with all of them).
        caps::drop_all()?;
        // The id change cleared the death signal (found by review): armed again, read back.
        sys::die_with_parent()
    }
}

/// Why a wipe did not empty a scratch dir.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WipeFailed {
    /// Joining the cell as the role failed with this errno (setns, setgroups, the id change:
    /// a filter above sealnode; found by review: it was told as "another host user's files").
    Entering(Errno),
    /// Emptying the dir failed with this errno (EACCES: another user's file; EBUSY: a mount point).
    Errno(Errno),
    /// It was killed by this signal (out of memory, an operator, a stop's deadline).
    Killed(i32),
}

impl std::fmt::Display for WipeFailed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            WipeFailed::Entering(e) => write!(f, "joining the cell as the role: {e}"),
            WipeFailed::Errno(e) => write!(f, "{e}"),
            WipeFailed::Killed(s) => write!(f, "the wipe was killed (signal {s})"),
        }
    }
}

/// A wipe child's exit status for `e`: an emptying errno as itself (1-127), a failure to join
/// the cell as 128 + its errno; an errno above 127 is told as EIO.
fn wipe_code(e: WipeFailed) -> i32 {
    let low = |e: Errno| if (1..128).contains(&(e as i32)) { e as i32 } else { Errno::EIO as i32 };
    match e {
        WipeFailed::Entering(e) => 128 + low(e),
        WipeFailed::Errno(e) => low(e),
        WipeFailed::Killed(_) => Errno::EIO as i32,
    }
}

/// What a wipe child's exit says: done, the errno it failed with (and where), or the signal
/// that killed it.
pub fn wipe_result(ws: nix::sys::wait::WaitStatus) -> std::result::Result<(), WipeFailed> {
    match ws {
        nix::sys::wait::WaitStatus::Exited(_, 0) => Ok(()),
        nix::sys::wait::WaitStatus::Exited(_, c) if c > 128 => Err(WipeFailed::Entering(Errno::from_raw(c - 128))),
        nix::sys::wait::WaitStatus::Exited(_, e) => Err(WipeFailed::Errno(Errno::from_raw(e))),
        nix::sys::wait::WaitStatus::Signaled(_, s, _) => Err(WipeFailed::Killed(s as i32)),
        _ => Err(WipeFailed::Errno(Errno::ECHILD)),
    }
}

/// Makes TCP sockets in the engine's network namespace, through the cell init.
#[derive(Debug)]
pub struct EngineSockets(OwnedFd);

impl EngineSockets {
    pub fn socket(&self) -> std::result::Result<OwnedFd, Errno> {
        engine_socket(&self.0)
    }
}

fn engine_socket(ctl: &OwnedFd) -> std::result::Result<OwnedFd, Errno> {
    nix::sys::socket::send(ctl.as_raw_fd(), &[1u8], MsgFlags::empty())?;
    let (payload, mut fds) = recv_with_fds(ctl.as_raw_fd(), 1)?;
    // Exactly one fd with an Ok frame, or none with a failure: anything else (extra fds
    // included) is refused with EIO (unit test:
    // cell::tests::the_socket_factory_answer_is_held_to_exactly_one_fd).
    match (Frame::decode(&payload), fds.len()) {
        (Some(Frame::Ok(1)), 1) => fds.pop().ok_or(Errno::EIO),
        (Some(Frame::Failed { errno, .. }), 0) => Err(Errno::from_raw(errno)),
        _ => Err(Errno::EIO),
    }
}

/// What a failed cell step means, for the operator.
fn setup_error(f: Failure<Step>, egress: &[(Ipv4Addr, u16)], engine_port: Option<u16>) -> Error {
    // The sysctl child ended without a report: how it ended, with no errno (there is none).
    if f.step == Step::NetSysctls && f.item >= SYSCTL_CHILD_EXITED {
        let how = if f.item >= SYSCTL_CHILD_KILLED {
            let sig = i32::try_from(f.item - SYSCTL_CHILD_KILLED).ok().and_then(|s| Signal::try_from(s).ok());
            format!("was killed{}", sig.map(|s| format!(" by {s}")).unwrap_or_default())
        } else {
            format!("exited with status {} without a report", f.item - SYSCTL_CHILD_EXITED)
        };
        return Error::Killed {
            what: format!("cell (net_sysctls): the child setting the network namespaces' sysctls {how}"),
            fix: crate::sandbox::protocol::KILLED_FIX.into(),
        };
    }
    let detail = match (f.step, egress.get(f.item)) {
        (Step::EgressListen, Some((a, p))) => format!("cell: listen on {a}:{p}"),
        (Step::NetSysctls, _) if f.item == SYSCTL_CHILD_START => {
            "cell: starting (or waiting for) the child that sets the network namespaces' sysctls".to_string()
        }
        (Step::NetSysctls, _) if f.item == 0 => {
            "cell: mounting a fresh /proc to set the network namespaces' sysctls (the kernel refuses one where /proc \
             has over-mounts: ProtectKernelTunables=, a container's masked /proc)"
                .to_string()
        }
        (Step::NetSysctls, _) => {
            let n = namespaces::NETNS_SYSCTLS.len();
            let (p, value, _) = namespaces::NETNS_SYSCTLS[(f.item - 1) % n];
            let netns = if f.item - 1 < n { "node" } else { "engine" };
            format!(
                "cell: setting /proc/sys/{p} to {} in the {netns}'s network namespace",
                String::from_utf8_lossy(value).trim()
            )
        }
        (Step::EngineListen, _) => {
            format!("cell: listen on 127.0.0.1:{} (the node's way to the engine)", engine_port.unwrap_or(0))
        }
        _ => "cell".to_string(),
    };
    Error::Setup { step: f.step.name(), detail, errno: f.errno }
}

impl Drop for Cell {
    fn drop(&mut self) {
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = waitpid(self.pid, None);
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::{AsRawFd, OwnedFd};

    use nix::sys::socket::{socketpair, AddressFamily, SockFlag, SockType};

    use super::{engine_socket, send_fds, Frame};

    fn null() -> OwnedFd {
        std::fs::File::open("/dev/null").expect("open").into()
    }

    /// Each way the cell init's sysctl step fails is told as what it was (found by review: a
    /// child killed was told as a failed /proc mount, one that exited without a word as no
    /// report at all).
    #[test]
    fn a_failed_sysctl_step_names_what_failed() {
        use crate::sandbox::protocol::Failure;
        let told = |item: usize| {
            let f = Failure { step: super::Step::NetSysctls, item, errno: nix::errno::Errno::EACCES };
            super::setup_error(f, &[], None).to_string()
        };
        assert!(told(0).contains("mounting a fresh /proc"), "{}", told(0));
        assert!(told(1).contains("net/ipv4/tcp_fastopen to 0 in the node's"), "{}", told(1));
        assert!(told(4).contains("net/mptcp/enabled to 0 in the engine's"), "{}", told(4));
        assert!(told(super::SYSCTL_CHILD_START).contains("starting (or waiting for) the child"));
        let exited = told(super::SYSCTL_CHILD_EXITED + 7);
        assert!(exited.contains("exited with status 7 without a report"), "{exited}");
        let killed = told(super::SYSCTL_CHILD_KILLED + libc::SIGSEGV as usize);
        assert!(killed.contains("was killed by SIGSEGV"), "{killed}");
    }

    /// The read-back of a role's own user namespace (found by review: rootless, a faked
    /// CLONE_NEWUSER went unseen): a process in the "cell's" namespace itself is refused; one in
    /// a user namespace made inside it passes; one in a namespace nested a level deeper is refused.
    #[test]
    fn a_role_must_be_in_a_user_namespace_of_its_own_inside_the_cells() {
        use nix::unistd::{fork, ForkResult, Pid};
        let me = std::fs::File::open("/proc/self/ns/user").expect("own userns");
        let me = std::os::fd::AsFd::as_fd(&me);
        assert!(super::own_child_userns(me, Pid::this()).is_err(), "the cell's own namespace passed");
        for depth in [1, 2] {
            let (r, w) = nix::unistd::pipe().expect("pipe");
            // SAFETY: the test's child only unshares, writes a byte and pauses.
            match unsafe { fork() }.expect("fork") {
                ForkResult::Child => {
                    drop(r);
                    let (uid, gid) = (nix::unistd::geteuid(), nix::unistd::getegid());
                    // Each level maps its creator's ids, so the next may be made inside it.
                    let ok = (0..depth).all(|_| {
                        nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER).is_ok()
                            && std::fs::write("/proc/self/setgroups", "deny").is_ok()
                            && std::fs::write("/proc/self/uid_map", format!("{uid} {uid} 1")).is_ok()
                            && std::fs::write("/proc/self/gid_map", format!("{gid} {gid} 1")).is_ok()
                    });
                    let _ = nix::unistd::write(&w, &[u8::from(ok)]);
                    std::thread::sleep(std::time::Duration::from_secs(30));
                    crate::os::sys::exit_now(0)
                }
                ForkResult::Parent { child } => {
                    drop(w);
                    let mut b = [0u8; 1];
                    let _ = nix::unistd::read(&r, &mut b);
                    let verdict = super::own_child_userns(me, child);
                    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                    let _ = nix::sys::wait::waitpid(child, None);
                    if b[0] != 1 {
                        // A machine without user namespaces: said loudly, a failure where the
                        // suite demands them (.ci/run: SEALNODE_TEST_REQUIRE=all).
                        let req = std::env::var("SEALNODE_TEST_REQUIRE").unwrap_or_default();
                        assert!(!(req == "all" || req.split(',').any(|f| f == "userns")), "no user namespaces");
                        eprintln!("SKIPPED: unshare(CLONE_NEWUSER) refused here");
                        return;
                    }
                    assert_eq!(verdict.is_ok(), depth == 1, "depth {depth}: {verdict:?}");
                }
            }
        }
    }

    /// Found by review: a wipe whose join of the cell a filter refused was told as "another
    /// host user's files: remove them by hand". Where it failed survives its exit status.
    #[test]
    fn a_wipe_says_whether_it_failed_joining_the_cell_or_emptying_the_dir() {
        use nix::errno::Errno;
        use nix::sys::wait::WaitStatus;

        use super::{wipe_code, wipe_result, WipeFailed};
        let pid = nix::unistd::Pid::from_raw(1);
        for e in [WipeFailed::Entering(Errno::EPERM), WipeFailed::Errno(Errno::EPERM), WipeFailed::Errno(Errno::EBUSY)]
        {
            assert_eq!(wipe_result(WaitStatus::Exited(pid, wipe_code(e))), Err(e));
        }
        assert_eq!(
            wipe_result(WaitStatus::Exited(pid, wipe_code(WipeFailed::Entering(Errno::ENOSYS)))),
            Err(WipeFailed::Entering(Errno::ENOSYS))
        );
        // An errno no exit status holds is told as EIO, in its place.
        assert_eq!(wipe_code(WipeFailed::Errno(Errno::EHWPOISON)), Errno::EIO as i32);
        assert_eq!(wipe_code(WipeFailed::Entering(Errno::EHWPOISON)), 128 + Errno::EIO as i32);
        assert_eq!(wipe_result(WaitStatus::Exited(pid, 0)), Ok(()));
    }

    /// The socket factory's answer is exactly one fd with an Ok frame, or none with a failure.
    #[test]
    fn the_socket_factory_answer_is_held_to_exactly_one_fd() {
        let answer = |frame: Frame, fds: Vec<OwnedFd>| {
            let (ours, theirs) =
                socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC).expect("pair");
            send_fds(theirs.as_raw_fd(), frame, &fds).expect("send");
            engine_socket(&ours)
        };
        assert!(answer(Frame::Ok(1), vec![null()]).is_ok());
        // Extra fds are refused, not some taken and the rest dropped.
        assert_eq!(answer(Frame::Ok(1), vec![null(), null()]).err(), Some(nix::errno::Errno::EIO));
        assert_eq!(answer(Frame::Ok(1), vec![]).err(), Some(nix::errno::Errno::EIO));
        assert_eq!(
            answer(Frame::Failed { step: 0, item: 0, errno: libc::EMFILE }, vec![]).err(),
            Some(nix::errno::Errno::EMFILE)
        );
        assert_eq!(
            answer(Frame::Failed { step: 0, item: 0, errno: libc::EMFILE }, vec![null()]).err(),
            Some(nix::errno::Errno::EIO)
        );
    }
}
