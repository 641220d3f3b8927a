//! Making the cell once, before the loop: every check a start needs and everything the roles
//! will share, in order (the dirs locked, the cgroup leaves, the key and TPM, the cell's init
//! and namespaces, the forwarder, the control socket). A problem found here refuses the
//! start with nothing running; [`Supervisor::run`] (mod.rs) is what follows.

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags};
use nix::sys::signalfd::{SfdFlags, SignalFd};

use super::lifecycle::{self, Phase};
use super::{attestation, gate, notify, readiness, reload, role_io, server, watch};
use super::{Base, Current, Slot, Supervisor, TOKEN_SIGNAL};
use crate::config::{Config, Invoker, Role};
use crate::egress::{Forwarder, Upstream};
use crate::error::{Error, Result};
use crate::sandbox;
use crate::sandbox::cell::Cell;

impl Supervisor {
    /// Check what a start needs and make the cell: the dirs locked, the cgroup leaves with
    /// their limits, the attestation key and TPM checked, the cell's init and namespaces,
    /// the egress listeners, the control socket. No role runs yet ([`Supervisor::run`]
    /// starts them); a problem found here refuses the start with nothing running.
    pub fn new(cfg: Config, inv: Invoker) -> Result<Supervisor> {
        // The forwarder's connections are bounded by the fd limit (egress::fd_budget): take
        // the whole hard limit, as a server does (the roles set their own).
        // RLIMIT_NPROC too: above each role's own count (its user namespace's), the kernel
        // counts every process of the role's host uid against the limit sealnode had when it
        // made the cell's and the role's namespaces (rootless, both roles are one uid; found by
        // review: a low soft limit let one role's processes leave the other none).
        for res in [nix::sys::resource::Resource::RLIMIT_NOFILE, nix::sys::resource::Resource::RLIMIT_NPROC] {
            if let Ok((soft, hard)) = nix::sys::resource::getrlimit(res) {
                if soft < hard {
                    let _ = nix::sys::resource::setrlimit(res, hard, hard);
                }
            }
        }
        // Orphans of anything we start are reaped here.
        crate::os::sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1)
            .map_err(|e| Error::errno("PR_SET_CHILD_SUBREAPER", e))?;
        let set = sandbox::spawn::launcher_sigset();
        nix::sys::signal::sigprocmask(nix::sys::signal::SigmaskHow::SIG_BLOCK, Some(&set), None)
            .map_err(|e| Error::errno("sigprocmask", e))?;
        let sigfd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| Error::errno("signalfd", e))?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| Error::errno("epoll_create1", e))?;
        epoll
            .add(sigfd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_SIGNAL))
            .map_err(|e| Error::errno("epoll_ctl", e))?;

        // Each layer a role needs, tried once before anything is made (doctor's checks): in
        // a container a runtime option left out refuses the start here, named, never a role
        // started without it.
        crate::doctor::required(&cfg)?;
        // The denial log's pidfd_getfd, where a role logs its refusals: refused now, not at
        // that role's spawn (the node's comes after the engine started).
        crate::doctor::denial_log_ready(&cfg)?;
        // One cell per dir, before anything is made, wiped or started (crate::sandbox::locks): a second
        // `run` naming this state dir would share its generations, this runtime dir take over
        // the control socket, this scratch dir wipe a live role's files. Each dir is opened
        // (and checked) once, here; the receipt, the counter, the control socket and every
        // wipe work through these descriptors for the supervisor's lifetime.
        let crate::sandbox::locks::Held { state_dir, runtime_dir, scratch, locks } =
            crate::sandbox::locks::take(&cfg, &inv)?;
        // The roles' cgroup leaves and their limits, before anything is forked: a limit that
        // cannot be enforced refuses the start here, with nothing running (cgroup.rs).
        let cgroups = crate::sandbox::cgroup::Tree::setup(&cfg)?;
        log_devices_from(&cfg);
        // A key file that is there but not safe (readable by others, foreign owner) refuses
        // the start: statements signed with a key others could read prove nothing. The TPM
        // is checked with it; the node's view of the statements is emptied.
        let attest = attestation::Publisher::open(&cfg, &inv)?;
        if let Some(t) = &cgroups {
            tracing::info!(cgroup = %t.root.display(), controllers = %t.controllers.join(","), "cgroup leaves ready");
        }
        let mut cell = Cell::for_config(&cfg, &inv)?;
        cell.cgroups = cgroups;
        let mut fwd = forwarder(&cfg, &mut cell, &epoll)?;
        fwd.set_engine_hold(Duration::from_secs(cfg.cell.engine_hold_s));
        fwd.set_engine_replay(usize::try_from(cfg.cell.engine_replay_kb).unwrap_or(usize::MAX).saturating_mul(1024));
        tracing::info!(cell_pid = cell.pid.as_raw(), egress = cfg.node.egress.len(), "cell created");
        let server = server::Server::open(&cfg, &runtime_dir, &epoll)?;
        let mut scratch = scratch.into_iter();
        let mut slot = |role| Slot {
            role,
            phase: Phase::Down,
            started: None,
            restarts: lifecycle::Restarts::default(),
            starts: 0,
            passed: None,
            digests: None,
            config: None,
            sealed: None,
            oom_kills: 0,
            scratch: scratch.next().expect("one scratch per role"),
        };
        let roles = [slot(Role::Engine), slot(Role::Node)];
        let ids = [cfg.role_ids(Role::Engine)?, cfg.role_ids(Role::Node)?];
        // With cell.reload_on_change, the config's directory is watched from here on.
        let mut watch = watch::ConfigWatch::default();
        watch.follow(&cfg, &epoll);
        Ok(Supervisor {
            fwd,
            roles,
            cycle: lifecycle::Cycle::default(),
            gate: gate::Gate::default(),
            current: Current::default(),
            readiness: readiness::Readiness::default(),
            server,
            attest,
            io: role_io::RoleIo::default(),
            reload: reload::Reload::default(),
            watch,
            sd: notify::Notifier::from_env(),
            base: Base { cfg, inv, ids, cell, epoll, sigfd, state_dir, born: Instant::now(), _locks: locks },
        })
    }
}

/// The forwarder: the node's declared egress, each through its listener in the node's
/// namespace, and the node's one way to the engine: its 127.0.0.1:<engine.port>, forwarded
/// into the engine's namespace, to that port only.
fn forwarder(cfg: &Config, cell: &mut Cell, epoll: &Epoll) -> Result<Forwarder> {
    let mut upstreams: Vec<Upstream> = std::mem::take(&mut cell.listeners)
        .into_iter()
        .zip(&cfg.node.egress)
        .map(|(l, e)| {
            Upstream::new(
                e.host.clone(),
                e.port as u16,
                e.connect.as_ref().and_then(|c| c.parse().ok()),
                e.allow_private,
                l,
            )
        })
        .collect();
    if let (Some(l), Some(port)) = (cell.engine_listener.take(), cfg.engine.port) {
        upstreams.push(Upstream::engine(port as u16, l, cell.engine_sockets()?));
    }
    Forwarder::new(
        upstreams,
        cfg.cell.egress_max_connections,
        Duration::from_secs(cfg.cell.egress_idle_timeout_s),
        Duration::from_secs(cfg.cell.egress_connect_timeout_s),
        epoll,
    )
    .map_err(|e| Error::errno("epoll_ctl (egress)", e))
}

/// What each role takes from its CDI spec, and what of the spec it leaves out and why: an
/// operator comparing the spec with the role's view finds every difference here.
pub(super) fn log_devices_from(cfg: &Config) {
    for role in Role::ALL {
        let Some(c) = cfg.cdi(role) else { continue };
        tracing::info!(
            role = role.name(),
            spec = %c.spec.display(),
            devices = c.edits.devices.join(" "),
            nodes = c.edits.nodes.len(),
            binds = c.binds.len(),
            in_view = c.in_view.len(),
            env = c.edits.env.len(),
            "devices from a CDI spec"
        );
        for (entry, why) in &c.left_out {
            tracing::info!(role = role.name(), spec = %c.spec.display(), entry = entry.as_str(), why = why.as_str(), "CDI edit left out");
        }
    }
}
