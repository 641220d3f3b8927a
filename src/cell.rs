//! The cell: the user namespace both roles' sandboxes live in, and one network namespace per
//! role, each holding only its own loopback.
//!
//! A small cell init process creates the user namespace and the **node's** network namespace,
//! brings `lo` up there and binds, in it, one listener per egress upstream on a cell-local
//! address and one on `127.0.0.1:<engine.port>` (binding port 443 is fine: it is privileged in
//! the cell's user namespace). Then it creates the **engine's** network namespace (unshare) and
//! brings its `lo` up. It hands the listeners and both namespaces to the supervisor over a
//! socketpair (SCM_RIGHTS; a socket stays in the netns it was created in), confines itself, and
//! then serves as a socket factory: each request byte gets back a fresh TCP socket created in
//! the engine's namespace, which the supervisor uses to probe the engine's readiness and to
//! forward the node's connections to the engine's port (that port only). This works rootless,
//! where the supervisor itself cannot enter the cell. The supervisor keeps fds of all three
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

use crate::config::Ids;
use crate::error::{Error, Result};
use crate::sandbox::caps;
use crate::sandbox::stage::Record;
use crate::{policy, sys};

/// Steps of the cell init, for its failure record.
const STEPS: [&str; 8] = [
    "die_with_parent",
    "wait_for_id_maps",
    "loopback_up",
    "egress_listen",
    "send_listeners",
    "confine",
    "engine_listen",
    "engine_netns",
];

#[derive(Debug)]
pub struct Cell {
    /// Host pid of the cell init.
    pub pid: Pid,
    userns: OwnedFd,
    /// The node's network namespace (egress listeners, the engine-port listener).
    node_netns: OwnedFd,
    /// The engine's network namespace: its own loopback and nothing else.
    engine_netns: OwnedFd,
    /// Supervisor's end of the SOCK_SEQPACKET pair to the cell init.
    ctl: OwnedFd,
    /// One listener per egress upstream, inside the node's netns, non-blocking.
    pub listeners: Vec<OwnedFd>,
    /// The node's way to the engine: 127.0.0.1:<engine.port> in the node's netns, forwarded
    /// by the supervisor to the same port in the engine's netns.
    pub engine_listener: Option<OwnedFd>,
    _alive: OwnedFd,
}

/// Whose network namespace a process joins.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Net {
    Engine,
    Node,
}

fn fail(ctl: RawFd, step: usize, item: usize, e: Errno) -> ! {
    let rec = Record { stage: step as u32, item: item as u32, errno: e as i32 };
    let mut msg = vec![1u8];
    msg.extend_from_slice(&rec.encode());
    let _ = sys::write_all(ctl, &msg);
    sys::exit_now(125)
}

fn must<T>(ctl: RawFd, step: usize, item: usize, r: std::result::Result<T, Errno>) -> T {
    r.unwrap_or_else(|e| fail(ctl, step, item, e))
}

fn listener(addr: Ipv4Addr, port: u16) -> std::result::Result<OwnedFd, Errno> {
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None)?;
    setsockopt(&fd, sockopt::ReuseAddr, &true)?;
    bind(fd.as_raw_fd(), &SockaddrIn::from(std::net::SocketAddrV4::new(addr, port)))?;
    listen(&fd, Backlog::new(128)?)?;
    Ok(fd)
}

/// The cell init, in the new user namespace and the node's network namespace. Never returns.
fn cell_main(sync: RawFd, ctl: RawFd, egress: &[(Ipv4Addr, u16)], engine_port: Option<u16>, abi: u8) -> ! {
    must(ctl, 0, 0, sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong));
    let mut b = [0u8; 1];
    if !matches!(sys::read_retry(sync, &mut b), Ok(1)) {
        fail(ctl, 1, 0, Errno::EPIPE);
    }
    must(ctl, 2, 0, sys::loopback_up());
    let mut fds: Vec<OwnedFd> =
        egress.iter().enumerate().map(|(i, (a, p))| must(ctl, 3, i, listener(*a, *p))).collect();
    if let Some(port) = engine_port {
        fds.push(must(ctl, 6, 0, listener(Ipv4Addr::LOCALHOST, port)));
    }
    let ns = |step| {
        must(
            ctl,
            step,
            0,
            nix::fcntl::open("/proc/self/ns/net", OFlag::O_RDONLY | OFlag::O_CLOEXEC, nix::sys::stat::Mode::empty()),
        )
    };
    let node_ns = ns(7);
    // The engine's namespace: from here on the init (and every socket it makes) is in it.
    must(ctl, 7, 1, nix::sched::unshare(CloneFlags::CLONE_NEWNET));
    must(ctl, 7, 2, sys::loopback_up());
    let engine_ns = ns(7);
    fds.push(node_ns);
    fds.push(engine_ns);
    let raw: Vec<RawFd> = fds.iter().map(AsRawFd::as_raw_fd).collect();
    let cmsg = [ControlMessage::ScmRights(&raw)];
    let iov = [IoSlice::new(&[0u8])];
    must(ctl, 4, 0, sendmsg::<()>(ctl, &iov, &cmsg, MsgFlags::empty(), None));
    drop(fds);
    // Nothing but socket creation from here: no capabilities, no files, not dumpable.
    must(ctl, 5, 0, caps::drop_all());
    must(ctl, 5, 1, sys::prctl(libc::PR_SET_DUMPABLE, 0));
    must(ctl, 5, 2, policy::landlock::deny_all(abi).map_err(|_| Errno::EPERM));
    loop {
        let mut req = [0u8; 1];
        match nix::sys::socket::recv(ctl, &mut req, MsgFlags::empty()) {
            Ok(1) => {}
            Err(Errno::EINTR) => continue,
            _ => sys::exit_now(0),
        }
        let sock =
            socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_NONBLOCK | SockFlag::SOCK_CLOEXEC, None);
        let sent = match &sock {
            Ok(s) => {
                let fds = [s.as_raw_fd()];
                sendmsg::<()>(ctl, &[IoSlice::new(&[0u8])], &[ControlMessage::ScmRights(&fds)], MsgFlags::empty(), None)
            }
            Err(_) => sendmsg::<()>(ctl, &[IoSlice::new(&[1u8])], &[], MsgFlags::empty(), None),
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
    let mut fds = Vec::new();
    for c in msg.cmsgs()? {
        if let ControlMessageOwned::ScmRights(raw) = c {
            for fd in raw {
                // SAFETY: the kernel just installed these fds in our table; we own them now.
                fds.push(unsafe { OwnedFd::from_raw_fd(fd) });
            }
        }
    }
    Ok((buf[..n].to_vec(), fds))
}

impl Cell {
    /// Create the cell. `ids` are the host ids mapped 1:1 into its user namespace (both roles'
    /// when rootful, the invoking user's when rootless). `engine_port`: the port the node
    /// reaches the engine on (forwarded), if the engine has one.
    pub fn create(
        ids: &[Ids],
        rootful: bool,
        egress: &[(Ipv4Addr, u16)],
        engine_port: Option<u16>,
        landlock_abi: u8,
    ) -> Result<Cell> {
        let (sup, child) = socketpair(AddressFamily::Unix, SockType::SeqPacket, None, SockFlag::SOCK_CLOEXEC)
            .map_err(|e| Error::errno("socketpair", e))?;
        let (sync_r, sync_w) = pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2", e))?;
        // SAFETY: the supervisor is single-threaded.
        let pid = unsafe { sys::clone_fork(libc::CLONE_NEWUSER | libc::CLONE_NEWNET) }.map_err(|e| {
            let (what, fix) = crate::doctor::explain_userns_failure(e);
            Error::Unsupported { what, fix }
        })?;
        if pid == 0 {
            drop(sup);
            drop(sync_w);
            let keep = [sync_r.as_raw_fd(), child.as_raw_fd()];
            if let Err(e) = sys::close_all_except(&keep) {
                fail(child.as_raw_fd(), 0, 1, e);
            }
            cell_main(sync_r.as_raw_fd(), child.as_raw_fd(), egress, engine_port, landlock_abi);
        }
        drop(child);
        drop(sync_r);
        let pid = Pid::from_raw(pid);
        let abort = |e: Error| {
            let _ = kill(pid, Signal::SIGKILL);
            let _ = waitpid(pid, None);
            e
        };
        // Hold the namespaces now: once the cell init confines itself (not dumpable) its
        // /proc/PID/ns entries are closed to a rootless supervisor.
        let ns = |n: &str| {
            nix::fcntl::open(
                format!("/proc/{pid}/ns/{n}").as_str(),
                OFlag::O_RDONLY | OFlag::O_CLOEXEC,
                nix::sys::stat::Mode::empty(),
            )
            .map_err(|e| Error::errno(format!("open /proc/{pid}/ns/{n}"), e))
        };
        let userns = ns("user").map_err(abort)?;
        let mut uids: Vec<u32> = ids.iter().map(|i| i.uid).collect();
        let mut gids: Vec<u32> = ids.iter().map(|i| i.gid).collect();
        uids.sort_unstable();
        uids.dedup();
        gids.sort_unstable();
        gids.dedup();
        let map = |v: &[u32]| v.iter().map(|i| format!("{i} {i} 1\n")).collect::<String>();
        let dir = format!("/proc/{pid}");
        let w = |name: &str, data: String| {
            std::fs::write(format!("{dir}/{name}"), data.as_bytes())
                .map_err(|e| Error::io(format!("write {dir}/{name}"), e))
        };
        if !rootful {
            w("setgroups", "deny".into()).map_err(abort)?;
        }
        w("uid_map", map(&uids)).map_err(abort)?;
        w("gid_map", map(&gids)).map_err(abort)?;
        sys::write_all(sync_w.as_raw_fd(), &[1]).map_err(|e| abort(Error::errno("release cell init", e)))?;
        let wanted = egress.len() + usize::from(engine_port.is_some()) + 2;
        let (payload, mut listeners) =
            recv_with_fds(sup.as_raw_fd(), wanted).map_err(|e| abort(Error::errno("receive cell listeners", e)))?;
        match payload.first() {
            Some(0) if listeners.len() == wanted => {}
            Some(1) if payload.len() > Record::SIZE => {
                let mut b = [0u8; Record::SIZE];
                b.copy_from_slice(&payload[1..=Record::SIZE]);
                let rec = Record::decode(&b);
                let step = STEPS.get(rec.stage as usize).copied().unwrap_or("unknown");
                let detail = match (step, egress.get(rec.item as usize)) {
                    ("egress_listen", Some((a, p))) => format!("cell: listen on {a}:{p}"),
                    ("engine_listen", _) => {
                        format!("cell: listen on 127.0.0.1:{} (the node's way to the engine)", engine_port.unwrap_or(0))
                    }
                    _ => "cell".to_string(),
                };
                let _ = waitpid(pid, None);
                return Err(Error::Setup { step, detail, errno: Errno::from_raw(rec.errno) });
            }
            _ => return Err(abort(Error::errno("cell init sent no listeners", Errno::EPROTO))),
        }
        // Sent in order: the egress listeners, the engine-port listener, the two namespaces.
        let engine_netns = listeners.pop().ok_or_else(|| abort(Error::errno("cell namespaces", Errno::EPROTO)))?;
        let node_netns = listeners.pop().ok_or_else(|| abort(Error::errno("cell namespaces", Errno::EPROTO)))?;
        let engine_listener = if engine_port.is_some() { listeners.pop() } else { None };
        Ok(Cell { pid, userns, node_netns, engine_netns, ctl: sup, listeners, engine_listener, _alive: sync_w })
    }

    /// A fresh non-blocking TCP socket inside the engine's network namespace.
    pub fn engine_socket(&self) -> Result<OwnedFd> {
        engine_socket(&self.ctl).map_err(|e| Error::errno("a socket in the engine's namespace", e))
    }

    /// A handle that makes sockets in the engine's namespace (for the forwarder).
    pub fn engine_sockets(&self) -> Result<EngineSockets> {
        Ok(EngineSockets(self.ctl.try_clone().map_err(|e| Error::io("dup the cell's socket factory", e))?))
    }

    /// Enter the cell's user namespace and `net`'s network namespace (in a short-lived
    /// intermediate process).
    pub fn join(&self, net: Net) -> std::result::Result<(), Errno> {
        nix::sched::setns(self.userns.as_fd(), CloneFlags::CLONE_NEWUSER)?;
        let ns = match net {
            Net::Engine => &self.engine_netns,
            Net::Node => &self.node_netns,
        };
        nix::sched::setns(ns.as_fd(), CloneFlags::CLONE_NEWNET)
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
    match (payload.first(), fds.pop()) {
        (Some(0), Some(fd)) => Ok(fd),
        _ => Err(Errno::EIO),
    }
}

impl Drop for Cell {
    fn drop(&mut self) {
        let _ = kill(self.pid, Signal::SIGKILL);
        let _ = waitpid(self.pid, None);
    }
}
