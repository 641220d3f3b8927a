//! The forwarder's name lookups: each in a short-lived helper process whose answer arrives on
//! a pipe the loop watches (the supervisor never blocks on the resolver), with a deadline, a
//! bound on lookups in flight and a remembered failure.

use std::net::ToSocketAddrs;
use std::os::fd::{AsRawFd, OwnedFd};
use std::time::Instant;

use nix::errno::Errno;
use nix::fcntl::OFlag;

/// A name lookup in a short-lived helper process (the supervisor stays single-threaded and
/// never blocks on the resolver): it writes one address per line to its pipe and exits.
#[derive(Debug)]
pub(super) struct Lookup {
    pub(super) upstream: usize,
    pub(super) pid: nix::unistd::Pid,
    pub(super) pipe: OwnedFd,
    pub(super) out: Vec<u8>,
    pub(super) deadline: Instant,
}

pub(super) fn spawn_lookup(host: &str, port: u16) -> Result<(nix::unistd::Pid, OwnedFd), Errno> {
    let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK)?;
    let parent = nix::unistd::getpid();
    // SAFETY: the supervisor is single-threaded; the child only resolves, writes and exits.
    match unsafe { nix::unistd::fork() }? {
        nix::unistd::ForkResult::Child => {
            // Dies with the supervisor, and if it already died before PDEATHSIG was armed.
            let _ = crate::os::sys::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL as libc::c_ulong);
            if nix::unistd::getppid() != parent {
                crate::os::sys::exit_now(1);
            }
            // Holds nothing of the supervisor's but its answer pipe while it waits on the
            // resolver: not the listeners, the connections or the cell's socket factory
            // (tests/egress.rs: a_hanging_resolver_never_stalls_the_supervisor).
            if crate::os::sys::close_all_except(&[w.as_raw_fd()]).is_err() {
                crate::os::sys::exit_now(1);
            }
            // The name as declared, never with the resolver's search list appended (found by
            // review: with `search` and Kubernetes' ndots:5, a zone in the list answered for
            // the gateway's name first; with ndots:1, after the name's own NXDOMAIN). An empty
            // LOCALDOMAIN makes that list empty (resolv.conf(5)); the hosts file still
            // answers. Read again here: the supervisor may have read the config before.
            std::env::set_var("LOCALDOMAIN", "");
            // Nor an alias file or resolver options from sealnode's own environment (found by
            // review: HOSTALIASES turned a one-label name into one under the search domain).
            std::env::remove_var("HOSTALIASES");
            std::env::remove_var("RES_OPTIONS");
            // SAFETY: res_init takes no argument; this process is single-threaded.
            unsafe { libc::res_init() };
            let text: String = match (host, port).to_socket_addrs() {
                Ok(addrs) => addrs.map(|a| format!("{}\n", a.ip())).collect(),
                Err(e) => format!("error {e}\n"),
            };
            let _ = crate::os::sys::write_all(w.as_raw_fd(), text.as_bytes());
            crate::os::sys::exit_now(0)
        }
        nix::unistd::ForkResult::Parent { child } => Ok((child, r)),
    }
}
