//! `sealnode run`: the cell, both roles, egress, readiness, restarts and shutdown, driven by
//! one single-threaded epoll loop (signals arrive through a signalfd).
//!
//! Order: create the cell (netns + egress listeners), pass both roles through the gate
//! ([`gate`]: their programs measured, their sandboxes preflighted, off the loop), write the
//! receipt and the statement, start the engine, wait until it is ready (TCP accept or HTTP 200
//! on loopback inside the cell), start the node, tell systemd READY=1. Every later start of a
//! role (crash restart, SIGHUP, recycle) passes the gate again. Stop: node first, then engine,
//! each SIGTERM then SIGKILL after the grace period; scratch is wiped; the model dir is never
//! touched.

mod gate;
mod locks;
mod reload;

pub use locks::{lock_status, open_scratch, scratch_status};

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollCreateFlags, EpollEvent, EpollFlags, EpollTimeout};
use nix::sys::signal::{kill, Signal};
use nix::sys::signalfd::{SfdFlags, SignalFd};
use nix::sys::socket::{connect, getsockopt, sockopt, SockaddrIn};
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use sd_notify::NotifyState;

use crate::cell::Cell;
use crate::config::{Config, Invoker, Restart, Role};
use crate::egress::{Forwarder, Upstream, TOKEN_KIND};
use crate::error::{Error, Result};
use crate::sandbox;

const TOKEN_SIGNAL: u64 = 1 << 56;
const TOKEN_READY: u64 = 4 << 56;
const TOKEN_CONTROL: u64 = 5 << 56;
const TOKEN_CLIENT: u64 = 6 << 56;
/// A role's stdout or stderr pipe (output.rs).
const TOKEN_OUTPUT: u64 = 8 << 56;
/// A role's denial-log listener (its refused syscalls); the low bits are the role.
const TOKEN_REFUSED: u64 = 9 << 56;
/// Refused syscalls answered per wake-up (the rest wait: a role cannot starve the loop).
const REFUSED_BUDGET: usize = 256;
/// Time between readiness attempts.
const READY_INTERVAL: Duration = Duration::from_millis(100);
/// Restart backoff bounds; a role that ran this long resets its backoff.
const BACKOFF_MIN: Duration = Duration::from_millis(500);
const BACKOFF_MAX: Duration = Duration::from_secs(60);
const STABLE_AFTER: Duration = Duration::from_secs(60);

// Exit codes of `sealnode run`: crate::exit (one table for every command).
use crate::exit;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Down,
    /// Passing the gate: measured and preflighted, then started.
    Starting,
    Running(Pid),
    Stopping(Pid, Instant),
    /// Restart scheduled at this time.
    Waiting(Instant),
    /// Its scratch being emptied by this child, off the loop (cell::Cell::spawn_wipe).
    Wiping(Pid),
}

/// What follows the scratch wipes in progress, once both are done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WipeFor {
    /// Both roles then pass the gate (first start).
    Start,
    /// The stop in progress completes: exit, or re-provision and pass the gate.
    Stop,
}

#[derive(Debug)]
struct Slot {
    role: Role,
    state: State,
    started: Option<Instant>,
    restarts: u32,
    /// Starts of this role since sealnode started (first, restarts, reloads, recycles).
    starts: u64,
    backoff: Duration,
    /// When this role was restarted within its restart_limit interval.
    recent: std::collections::VecDeque<Instant>,
    /// The gate this role's current (or next) start passed.
    passed: Option<GatePass>,
    /// What this role's current (or next) process is started from, as the gate measured it:
    /// every receipt and statement carries it unchanged while that process lives.
    digests: Option<crate::receipt::RoleDigests>,
    /// What this role's current (or next) sandbox holds, layer by layer, from the plan the
    /// gate admitted (`ctl status`'s "what is sealed").
    sealed: Option<crate::sealed_text::RoleSeal>,
    /// OOM kills seen in the role's cgroup leaf so far (memory.events oom_kill).
    oom_kills: u64,
    /// The role's scratch dir, opened once (no symlinks, owner checked): every wipe works on
    /// this descriptor, never on the path again (found by review: a swapped path was wiped).
    scratch: std::os::fd::OwnedFd,
}

/// One pass through the gate: the role's preflight and the receipt it produced.
#[derive(Debug, Clone, Copy)]
struct GatePass {
    generation: u64,
    /// The whole pass's duration (its roles' probes run side by side).
    preflight_ms: u64,
    /// This role's own escape attempts in the pass, as its receipt entry counts them.
    attempts: usize,
    /// When the pass admitted it (seconds since the Unix epoch).
    at: u64,
}

#[derive(Debug, PartialEq, Eq)]
enum ReadyStep {
    Connecting,
    Reading,
}

#[derive(Debug)]
struct ReadyCheck {
    fd: Option<OwnedFd>,
    step: ReadyStep,
    buf: Vec<u8>,
    next_try: Instant,
    deadline: Instant,
    /// When the check began (the engine's start): readiness latency is measured from here.
    began: Instant,
    /// What the last try saw ("connection refused", "HTTP/1.1 503 Service Unavailable"), for
    /// the timeout's message.
    last: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum After {
    Exit,
    Restart,
    Recycle,
}

#[derive(Debug)]
pub struct Supervisor {
    cfg: Config,
    inv: Invoker,
    cell: Cell,
    epoll: Epoll,
    sigfd: SignalFd,
    fwd: Forwarder,
    slots: [Slot; 2],
    ready_check: Option<ReadyCheck>,
    stopping: Option<(i32, After)>,
    ready_sent: bool,
    watchdog: Option<(Duration, Instant)>,
    control: std::os::unix::net::UnixListener,
    /// The client waiting for a recycle to finish.
    pending: Option<std::os::unix::net::UnixStream>,
    /// Control connections still sending their request: (stream, bytes so far, deadline).
    clients: std::collections::HashMap<u64, (std::os::unix::net::UnixStream, Vec<u8>, Instant)>,
    /// Refused control clients are logged once a second at most (any local user can connect).
    control_quiet: crate::ratelimit::Quiet,
    next_client: u64,
    receipt: Option<crate::receipt::Receipt>,
    /// The latest preflight result of each role, which the receipt summarises.
    report: Option<crate::canary::Report>,
    /// Each role's plan as the gate admitted it (its program's sealed copy measured): the
    /// next start of that role runs exactly this.
    prepared: [Option<gate::Admitted>; 2],
    /// The gate: one pass at a time, off the loop's back (gate.rs).
    gate: gate::Gate,
    /// A config a SIGHUP loaded, while its dry run passes the gate.
    reload_candidate: Option<Config>,
    /// A config a SIGHUP loaded, applied once both roles are down.
    next_cfg: Option<Config>,
    /// A reload is under way: READY=1 again once the node runs.
    reloading: bool,
    /// Scratch wipes in flight (slots in State::Wiping), and what follows them.
    wipe_for: Option<WipeFor>,
    wipe_failed: Vec<(Role, crate::cell::WipeFailed)>,
    /// A stop to exit waits this long for wipes in flight, then kills them: the next start
    /// wipes again (found by review: a stopped wipe child held the exit forever).
    wipe_deadline: Option<Instant>,
    /// The outcome of the last SIGHUP, for `ctl status`.
    last_reload: Option<serde_json::Value>,
    /// Held for the supervisor's lifetime: one `sealnode run` per state, runtime and scratch
    /// dir (locks.rs).
    _locks: locks::Locks,
    /// The state dir, opened and checked once: receipts and the counter are written through it.
    state_dir: OwnedFd,
    born: Instant,
    /// The roles' stdout and stderr pipes still open (a restarted role's old ones drain to EOF).
    outputs: std::collections::HashMap<u64, crate::output::Capture>,
    next_output: u64,
    /// Each role's output rate limit, shared by its stdout and stderr.
    buckets: [crate::output::Bucket; 2],
    /// How long the engine's last start took to pass its readiness check, in milliseconds.
    ready_ms: Option<f64>,
    /// Each role's denial log (its current run's listener).
    refusals: [Option<crate::denylog::DenyLog>; 2],
    /// Refusals of each role's earlier runs, per syscall name.
    refused_before: [std::collections::BTreeMap<String, u64>; 2],
    /// The attestation key's public half, checked at start (`sealnode attest init`); None: no
    /// statements. The private key is read for each signature and wiped right after: it is
    /// never in the memory the role children are forked from (found by review).
    attest_key: Option<ed25519_dalek::VerifyingKey>,
    /// The runtime dir's `attest/`, which the node sees read-only: the statement of each gate.
    attest_dir: OwnedFd,
    /// With `cell.tpm`: the tools and the attestation key every statement is quoted by.
    tpm: Option<(crate::tpm::Tools, p256::ecdsa::VerifyingKey)>,
    /// Signed statements waiting for their quote, in order. The TPM's tools run as children
    /// the loop reaps: quoting never holds the loop (found by review: a hung TPM held control
    /// and forwarding for seconds).
    quoting: std::collections::VecDeque<Quoting>,
    /// The statement being quoted, with its job: out of the queue, so that nothing done to
    /// the queue meanwhile can give its quote to another (found by review: a gate's removal of
    /// the older start statement shifted every later quote onto the wrong statement).
    quote_job: Option<(crate::tpm::QuoteJob, Quoting)>,
    /// The current generation's start statement could not be made: why, and when to try again.
    statement_missing: Option<String>,
    republish_at: Option<Instant>,
}

/// At most this many control requests wait for the TPM; more are answered "busy".
const MAX_QUOTING: usize = 4;

/// A signed statement waiting for the TPM's quote, and who gets it.
#[derive(Debug)]
struct Quoting {
    env: crate::attest::Envelope,
    payload: Vec<u8>,
    nonce: Option<Vec<u8>>,
    purpose: Purpose,
}

#[derive(Debug)]
enum Purpose {
    /// An `attest` request: the client waits for the envelope.
    Control(std::os::unix::net::UnixStream),
    /// The start statement of this generation, for the node.
    Publish(u64),
}

/// What `run` would sign its statements with, checked as at a start (for `sealnode check`).
pub fn attestation_status(cfg: &Config, inv: &Invoker) -> Result<String> {
    let key = crate::attest::load_signing(&cfg.cell.state_dir, inv.uid)
        .map_err(|e| Error::config(&cfg.file, "cell.state_dir", format!("attestation key: {e}")))?
        .map(|k| k.verifying_key());
    let tpm = tpm_for(cfg, inv, key.is_some())?;
    Ok(match (key, tpm) {
        (None, _) => "not signed: no key (`sealnode attest init` makes one)".into(),
        (Some(k), None) => format!("signed by key sha256:{}; no TPM", crate::attest::keyid(&k)),
        (Some(k), Some((_, ak))) => format!(
            "signed by key sha256:{}; quoted by the TPM's attestation key sha256:{}",
            crate::attest::keyid(&k),
            crate::tpm::ak_id(&ak)
        ),
    })
}

/// With `cell.tpm`: the TPM answers and holds the attestation key `attest tpm-init` stored,
/// or the start is refused before anything runs (statements that cannot be bound are not
/// made unbound instead).
fn tpm_for(
    cfg: &Config,
    inv: &Invoker,
    signing: bool,
) -> Result<Option<(crate::tpm::Tools, p256::ecdsa::VerifyingKey)>> {
    let Some(t) = &cfg.cell.tpm else { return Ok(None) };
    let bad = |why: String| Error::config(&cfg.file, "cell.tpm", why);
    if !signing {
        return Err(bad(format!(
            "binds signed statements, and there is no signing key: run `sealnode attest init --config {}` first",
            cfg.file.display()
        )));
    }
    let stored =
        crate::attest::load_tpm_ak(&cfg.cell.state_dir, inv.uid).map_err(|e| bad(e.to_string()))?.ok_or_else(|| {
            bad(format!(
                "no attestation key from the TPM: run `sealnode attest tpm-init --config {}`",
                cfg.file.display()
            ))
        })?;
    let tools = crate::attest::tpm_tools(&cfg.cell.state_dir, inv.uid, t.target()).map_err(|e| bad(e.to_string()))?;
    let (_, ak) = tools.read_ak(&stop_pending).map_err(|e| bad(format!("the TPM ({}): {e}", t.tcti)))?;
    if ak.key != stored {
        return Err(bad(format!(
            "the key at handle {:#010x} is not the one `attest tpm-init` stored ({}): run tpm-init again and enrol the new key",
            t.ak_handle,
            crate::tpm::AK_FILE
        )));
    }
    // One quote now, of a throwaway payload: a key that needs a password, or a TPM in lockout,
    // refuses the start instead of every statement (found by review).
    tools
        .quote(&ak.key, b"sealnode: the start's check of the TPM", None, &stop_pending)
        .map_err(|e| bad(format!("the TPM cannot quote with the key at {:#010x}: {e}", t.ak_handle)))?;
    tracing::info!(ak = %crate::tpm::ak_id(&ak.key), name = %hex::encode(&ak.name), tcti = %t.tcti, "TPM attestation key checked");
    Ok(Some((tools, ak.key)))
}

/// Tell the service manager (if any), never blocking the event loop: sd_notify's send
/// blocks when the receiver's queue is full, so the datagram is sent non-blocking and dropped
/// if the manager cannot take it now (systemd drains its socket at once).
fn notify(states: &[NotifyState]) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::ffi::OsStrExt;
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else { return };
    let msg: String = states.iter().map(|s| format!("{s}\n")).collect();
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else { return };
    let _ = sock.set_nonblocking(true);
    let sent = match path.as_bytes().strip_prefix(b"@") {
        Some(name) => {
            std::os::unix::net::SocketAddr::from_abstract_name(name).and_then(|a| sock.send_to_addr(msg.as_bytes(), &a))
        }
        None => sock.send_to(msg.as_bytes(), &path),
    };
    if let Err(e) = sent {
        tracing::debug!(error = %e, "notification dropped");
    }
}

fn status_code(ws: WaitStatus) -> Option<i32> {
    match ws {
        WaitStatus::Exited(_, c) => Some(c),
        WaitStatus::Signaled(_, s, _) => Some(128 + s as i32),
        _ => None,
    }
}

impl Supervisor {
    /// Create the cell and the event loop. Nothing runs yet.
    pub fn new(cfg: Config, inv: Invoker) -> Result<Supervisor> {
        // The forwarder's connections are bounded by the fd limit (egress::fd_budget): take
        // the whole hard limit, as a server does (the roles set their own).
        if let Ok((soft, hard)) = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE) {
            if soft < hard {
                let _ = nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard);
            }
        }
        // Orphans of anything we start are reaped here.
        crate::sys::prctl(libc::PR_SET_CHILD_SUBREAPER, 1).map_err(|e| Error::errno("PR_SET_CHILD_SUBREAPER", e))?;
        let set = sandbox::spawn::launcher_sigset();
        nix::sys::signal::sigprocmask(nix::sys::signal::SigmaskHow::SIG_BLOCK, Some(&set), None)
            .map_err(|e| Error::errno("sigprocmask", e))?;
        let sigfd = SignalFd::with_flags(&set, SfdFlags::SFD_NONBLOCK | SfdFlags::SFD_CLOEXEC)
            .map_err(|e| Error::errno("signalfd", e))?;
        let epoll = Epoll::new(EpollCreateFlags::EPOLL_CLOEXEC).map_err(|e| Error::errno("epoll_create1", e))?;
        epoll
            .add(sigfd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_SIGNAL))
            .map_err(|e| Error::errno("epoll_ctl", e))?;

        // One cell per dir, before anything is made, wiped or started (locks.rs): a second
        // `run` naming this state dir would share its generations, this runtime dir take over
        // the control socket, this scratch dir wipe a live role's files. Each dir is opened
        // (and checked) once, here; the receipt, the counter, the control socket and every
        // wipe work through these descriptors for the supervisor's lifetime.
        let locks::Held { state_dir, runtime_dir, scratch, locks } = locks::take(&cfg, &inv)?;
        // The roles' cgroup leaves and their limits, before anything is forked: a limit that
        // cannot be enforced refuses the start here, with nothing running (cgroup.rs).
        let cgroups = crate::cgroup::Tree::setup(&cfg)?;
        log_devices_from(&cfg);
        // A key file that is there but not safe (readable by others, foreign owner) refuses
        // the start: statements signed with a key others could read prove nothing.
        let attest_key = crate::attest::load_signing(&cfg.cell.state_dir, inv.uid)
            .map_err(|e| Error::config(&cfg.file, "cell.state_dir", format!("attestation key: {e}")))?
            .map(|k| k.verifying_key());
        match &attest_key {
            Some(k) => tracing::info!(key = %crate::attest::keyid(k), "attestation key checked"),
            None => tracing::info!("no attestation key (sealnode attest init makes one): no signed statements"),
        }
        let tpm = tpm_for(&cfg, &inv, attest_key.is_some())?;
        if let Some(t) = &cgroups {
            tracing::info!(cgroup = %t.root.display(), controllers = %t.controllers.join(","), "cgroup leaves ready");
        }
        let mut cell = Cell::for_config(&cfg, &inv)?;
        cell.cgroups = cgroups;
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
        // The node's one way to the engine: its 127.0.0.1:<engine.port>, forwarded into the
        // engine's namespace, to that port only.
        if let (Some(l), Some(port)) = (cell.engine_listener.take(), cfg.engine.port) {
            upstreams.push(Upstream::engine(port as u16, l, cell.engine_sockets()?));
        }
        let fwd = Forwarder::new(
            upstreams,
            cfg.cell.egress_max_connections,
            Duration::from_secs(cfg.cell.egress_idle_timeout_s),
            Duration::from_secs(cfg.cell.egress_connect_timeout_s),
            &epoll,
        )
        .map_err(|e| Error::errno("epoll_ctl (egress)", e))?;
        tracing::info!(cell_pid = cell.pid.as_raw(), egress = cfg.node.egress.len(), "cell created");
        let mut usec = 0;
        let watchdog =
            sd_notify::watchdog_enabled(false, &mut usec).then(|| (Duration::from_micros(usec / 2), Instant::now()));
        let control = open_control(&cfg, &runtime_dir)?;
        // The node's view of the statements (config::INSIDE_ATTESTATION_DIR), made before any
        // plan and emptied of an earlier run's statement: a node never reads a stale one.
        let attest_dir =
            crate::trusted::own_dir(&cfg.cell.runtime_dir.join(crate::config::RUNTIME_ATTEST_DIR), inv.uid, 0o755)
                .map_err(|e| Error::config(&cfg.file, "cell.runtime_dir", e))?;
        match nix::unistd::unlinkat(&attest_dir, crate::config::STATEMENT_FILE, nix::unistd::UnlinkatFlags::NoRemoveDir)
        {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(Error::errno("remove the previous run's statement", e)),
        }
        epoll
            .add(control.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_CONTROL))
            .map_err(|e| Error::errno("epoll_ctl (control)", e))?;
        let mut scratch = scratch.into_iter();
        let mut slot = |role| Slot {
            role,
            state: State::Down,
            started: None,
            restarts: 0,
            starts: 0,
            backoff: BACKOFF_MIN,
            recent: std::collections::VecDeque::new(),
            passed: None,
            digests: None,
            sealed: None,
            oom_kills: 0,
            scratch: scratch.next().expect("one scratch per role"),
        };
        Ok(Supervisor {
            cfg,
            inv,
            cell,
            epoll,
            sigfd,
            fwd,
            slots: [slot(Role::Engine), slot(Role::Node)],
            ready_check: None,
            stopping: None,
            ready_sent: false,
            watchdog,
            control,
            pending: None,
            clients: std::collections::HashMap::new(),
            control_quiet: crate::ratelimit::Quiet::default(),
            next_client: 1,
            receipt: None,
            report: None,
            prepared: [None, None],
            gate: gate::Gate::default(),
            reload_candidate: None,
            next_cfg: None,
            reloading: false,
            wipe_for: None,
            wipe_failed: Vec::new(),
            wipe_deadline: None,
            last_reload: None,
            _locks: locks,
            state_dir,
            born: Instant::now(),
            outputs: std::collections::HashMap::new(),
            next_output: 1,
            buckets: [crate::output::bucket(Instant::now()), crate::output::bucket(Instant::now())],
            ready_ms: None,
            refusals: [None, None],
            refused_before: [Default::default(), Default::default()],
            attest_key,
            attest_dir,
            tpm,
            quoting: std::collections::VecDeque::new(),
            quote_job: None,
            statement_missing: None,
            republish_at: None,
        })
    }

    fn slot(&mut self, role: Role) -> &mut Slot {
        &mut self.slots[role as usize]
    }

    /// Run until stopped. Returns the exit code (0 after SIGTERM/SIGINT, 1 after a failure).
    pub fn run(mut self) -> i32 {
        self.provision();
        let mut events = vec![EpollEvent::empty(); 64];
        loop {
            let timeout = self.next_deadline().map(|d| d.saturating_duration_since(Instant::now()));
            let timeout = match timeout {
                Some(t) => EpollTimeout::try_from(t.as_millis().min(60_000) as u64 + 1).unwrap_or(EpollTimeout::NONE),
                None => EpollTimeout::NONE,
            };
            let n = match self.epoll.wait(&mut events, timeout) {
                Ok(n) => n,
                Err(Errno::EINTR) => 0,
                Err(e) => {
                    tracing::error!(error = %e, "epoll_wait failed");
                    self.begin_stop(exit::FAILED, After::Exit);
                    0
                }
            };
            for ev in events.iter().take(n) {
                let token = ev.data();
                match token & TOKEN_KIND {
                    TOKEN_SIGNAL => self.on_signals(),
                    TOKEN_READY => self.advance_ready_check(),
                    TOKEN_CONTROL => self.on_control(),
                    TOKEN_CLIENT => self.on_client(token & !TOKEN_KIND),
                    TOKEN_OUTPUT => self.on_output(token & !TOKEN_KIND),
                    TOKEN_REFUSED => self.on_refused((token & !TOKEN_KIND) as usize),
                    gate::TOKEN_GATE => self.gate.handle(token, &self.epoll),
                    _ => self.fwd.handle(&self.epoll, token, ev.events()),
                }
            }
            self.poll_gate();
            self.on_timers();
            self.report_dropped_output();
            // Lines held back while a reader of sealnode's stdout or stderr was not reading.
            crate::logsink::pump();
            // Once every role is down after a stop: both scratch dirs wiped (off the loop).
            if self.stopping.is_some() && self.wipe_for.is_none() && self.slots.iter().all(|s| s.state == State::Down) {
                self.begin_wipes(WipeFor::Stop);
            }
            if let Some(code) = self.after_wipes() {
                return code;
            }
        }
    }

    /// Start emptying both roles' scratch dirs, each in a child of its own (cell::Cell::
    /// spawn_wipe) that the loop reaps; [`Supervisor::after_wipes`] goes on once both are done.
    fn begin_wipes(&mut self, then: WipeFor) {
        self.wipe_for = Some(then);
        self.wipe_failed.clear();
        for role in Role::ALL {
            let spawned = self.cfg.role_ids(role, &self.inv).map_err(|_| Errno::EINVAL).and_then(|ids| {
                let target = match self.cell.capped_scratch(role) {
                    Some(path) => crate::cell::WipeTarget::Tmpfs(path),
                    None => crate::cell::WipeTarget::Dir(self.slots[role as usize].scratch.as_fd()),
                };
                self.cell.spawn_wipe(target, ids)
            });
            match spawned {
                Ok(pid) => self.slot(role).state = State::Wiping(pid),
                Err(e) => self.wipe_failed.push((role, crate::cell::WipeFailed::Errno(e))),
            }
        }
        self.arm_wipe_deadline();
    }

    /// A wipe child exited: its role is down, its result kept for [`Supervisor::after_wipes`].
    fn wipe_exited(&mut self, pid: Pid, ws: WaitStatus) -> bool {
        let Some(i) = self.slots.iter().position(|s| s.state == State::Wiping(pid)) else { return false };
        self.slots[i].state = State::Down;
        if let Err(e) = crate::cell::wipe_result(ws) {
            self.wipe_failed.push((self.slots[i].role, e));
        }
        true
    }

    /// Both wipes done: what they were for. A role must never start on what an earlier run
    /// left behind, so a failed wipe before a start stops the cell (fail closed); before an
    /// exit it is only reported (the next start wipes again). Some(code): the loop ends.
    fn after_wipes(&mut self) -> Option<i32> {
        if self.wipe_for.is_none() || self.slots.iter().any(|s| matches!(s.state, State::Wiping(_))) {
            return None;
        }
        self.wipe_for = None;
        self.wipe_deadline = None;
        let failed = std::mem::take(&mut self.wipe_failed);
        let next = match self.stopping {
            // A stop that came during a start's wipes ends the loop like any stop.
            Some((code, After::Exit)) => {
                for (role, e) in &failed {
                    let dir = self.cfg.role(*role).scratch.display().to_string();
                    tracing::warn!(role = %role, dir, error = %e, "could not wipe scratch (the next start wipes it)");
                }
                return Some(self.finish_stop(code));
            }
            Some((_, after)) => {
                self.fwd.close_all(&self.epoll);
                self.stopping = None;
                if let Some(new) = self.next_cfg.take() {
                    self.cfg = new;
                }
                tracing::info!(recycle = after == After::Recycle, "re-provisioning both roles");
                "re-provision"
            }
            None => "start",
        };
        for (role, e) in &failed {
            let dir = self.cfg.role(*role).scratch.display().to_string();
            let hint = match e {
                crate::cell::WipeFailed::Errno(Errno::EACCES | Errno::EPERM) => {
                    " (it holds files the role cannot have left there: another host user's; remove them by hand)"
                }
                crate::cell::WipeFailed::Errno(Errno::EBUSY) => " (a mount point inside it: unmount it)",
                _ => "",
            };
            tracing::error!(role = %role, dir, error = %e, "cannot wipe the role's scratch; not starting{hint}");
            crate::log::say(&format!("cannot wipe {role}.scratch {dir}: {e}{hint}"));
        }
        let entered = if failed.is_empty() { self.enter_gate(&Role::ALL) } else { Err(sandbox::SETUP_FAILED) };
        match entered {
            Ok(()) => None,
            Err(code) => {
                if let Some(mut c) = self.pending.take() {
                    crate::control::respond(&mut c, &crate::control::error(format!("{next} failed; sealnode stops")));
                }
                Some(stopped_early(code))
            }
        }
    }

    /// The cell's last words after a stop: forwarding drained, totals logged.
    fn finish_stop(&mut self, code: i32) -> i32 {
        // Drain: no forwarded connection outlives the roles.
        self.fwd.close_all(&self.epoll);
        self.stopping = None;
        self.abandon_quotes();
        for s in self.fwd.stats() {
            tracing::info!(upstream = %s.upstream, accepted = s.accepted, bytes_up = s.bytes_up, bytes_down = s.bytes_down, refused = s.refused_over_limit, failed = s.connect_failed, "egress totals");
        }
        if let Some(s) = self.fwd.engine_stats() {
            tracing::info!(
                accepted = s.accepted,
                bytes_up = s.bytes_up,
                bytes_down = s.bytes_down,
                refused = s.refused_over_limit,
                failed = s.connect_failed,
                "node-to-engine totals"
            );
        }
        tracing::info!(code, "cell stopped");
        code
    }

    /// Before both roles first start: wipe both scratch dirs (off the loop), then both enter
    /// the gate ([`Supervisor::after_wipes`]); the engine starts once they pass
    /// ([`Supervisor::admit`]). A SIGHUP or recycle takes the same way once its stop is done.
    fn provision(&mut self) {
        self.begin_wipes(WipeFor::Start);
    }

    /// The gate every start passes, whatever started it (first start, crash restart, SIGHUP,
    /// recycle): the roles' programs measured and their preflight run in their exact
    /// sandboxes inside this cell, off the loop ([`gate`]); once they pass, a receipt with the
    /// next generation, the statement, and the start ([`Supervisor::admit`]). What is refused
    /// before anything runs is refused here, with the exit status.
    fn enter_gate(&mut self, roles: &[Role]) -> std::result::Result<(), i32> {
        let ctx = gate::Ctx {
            cfg: &self.cfg,
            inv: &self.inv,
            cell: &self.cell,
            state: &self.state_dir,
            epoll: &self.epoll,
            hash_models: self.attest_key.is_some(),
            scratch: [&self.slots[0].scratch, &self.slots[1].scratch],
        };
        match self.gate.begin(&ctx, roles, gate::Purpose::Start) {
            Ok(()) => {
                for role in roles {
                    self.slot(*role).state = State::Starting;
                }
                Ok(())
            }
            Err(outcome) => Err(self.refused_start(outcome)),
        }
    }

    /// A pass the gate refused: say why; the exit status for it.
    fn refused_start(&mut self, outcome: gate::Outcome) -> i32 {
        let gate::Outcome::Refused { code, message, details } = outcome else { return exit::FAILED };
        for d in &details {
            crate::log::say(d);
        }
        match code {
            exit::PREFLIGHT_ERROR => tracing::error!(error = %message, "preflight canary could not run"),
            exit::PREFLIGHT_FAILED => tracing::error!("preflight found an escape; not starting"),
            _ => tracing::error!(error = %message, "cannot prepare the role"),
        }
        crate::log::say(&message);
        for s in self.slots.iter_mut() {
            if s.state == State::Starting {
                s.state = State::Down;
            }
        }
        code
    }

    /// The gate answered: start what passed, stop on what did not; a reload's dry run goes on
    /// to the reload or is refused.
    fn poll_gate(&mut self) {
        // Each outcome goes to what its pass was for: a start's refusal stops the cell, a dry
        // run's refuses the reload (found by review: a start's refusal taken for a reload's
        // left the role starting forever).
        let purpose = self.gate.purpose();
        let outcome = match purpose {
            Some(gate::Purpose::DryRun) => {
                let Some(new) = self.reload_candidate.as_ref() else { return };
                self.gate.poll(new, &self.epoll)
            }
            Some(gate::Purpose::Start) => self.gate.poll(&self.cfg, &self.epoll),
            None => None,
        };
        match outcome {
            None => {}
            Some(gate::Outcome::Passed(p)) if p.purpose == gate::Purpose::DryRun => self.reload_passed(),
            Some(o @ gate::Outcome::Refused { .. }) if purpose == Some(gate::Purpose::DryRun) => self.reload_refused(o),
            Some(gate::Outcome::Passed(p)) => {
                if let Err(code) = self.admit(*p) {
                    self.begin_stop(code, After::Exit);
                }
            }
            Some(o) => {
                if let Some(mut c) = self.pending.take() {
                    crate::control::respond(&mut c, &crate::control::error("recycle failed; sealnode stops"));
                }
                let code = self.refused_start(o);
                self.begin_stop(code, After::Exit);
            }
        }
    }

    /// The roles passed: a new receipt (the passed roles' digests fresh, the others' those of
    /// their running processes), the statement, then the start: the engine when it passed,
    /// else the node.
    fn admit(&mut self, p: gate::Passed) -> std::result::Result<(), i32> {
        // The node's own pass admits it only beside a ready engine: if the engine went down
        // while the pass ran, the node waits for it (a pass again later), and no receipt says
        // otherwise (found by review: the node started next to a dead engine).
        if !p.roles.contains(&Role::Engine) && !self.engine_is_ready() {
            tracing::info!("the engine is not ready (it went down while the node's preflight ran): the node waits for it and passes the gate again");
            for role in &p.roles {
                self.slot(*role).state = State::Waiting(Instant::now() + READY_INTERVAL);
            }
            return Ok(());
        }
        // Each role's latest result: the fresh ones replace theirs, the others stay.
        let fresh = p.report;
        let mut report = self.report.take().unwrap_or_else(|| fresh.clone());
        for r in &fresh.roles {
            match report.roles.iter_mut().find(|x| x.role == r.role) {
                Some(x) => *x = r.clone(),
                None => report.roles.push(r.clone()),
            }
        }
        report.roles.sort_by_key(|r| r.role as usize);
        report.passed = report.roles.iter().all(|r| r.succeeded == 0);
        let mut roles = std::collections::BTreeMap::new();
        for (role, a) in &p.admitted {
            roles.insert(role.name().to_string(), a.digests.clone());
        }
        for s in &self.slots {
            if !p.roles.contains(&s.role) {
                if let Some(d) = &s.digests {
                    roles.insert(s.role.name().to_string(), d.clone());
                }
            }
        }
        let resources = Role::ALL
            .iter()
            .filter_map(|r| {
                let (cgroup, files) = self.cell.cgroups.as_ref()?.record(*r)?;
                Some((r.name().to_string(), crate::receipt::Resources { cgroup, files }))
            })
            .collect();
        let written = crate::receipt::write(&self.cfg, &self.inv, &self.state_dir, &report, roles, &p.roles, resources);
        self.report = Some(report);
        let r = match written {
            Ok(r) => r,
            Err(e) => {
                tracing::error!(error = %e, "cannot write the receipt");
                crate::log::say(&format!("{e}"));
                return Err(exit::FAILED);
            }
        };
        let names: Vec<&str> = p.roles.iter().map(|r| r.name()).collect();
        tracing::info!(roles = %names.join(","), attempts = p.attempts, ms = p.ms, generation = r.generation, path = %crate::receipt::path(&self.cfg).display(), "preflight passed; receipt written");
        for (role, mut a) in p.admitted {
            a.digests.generation = r.generation;
            // The role's own attempts (the pass's total covers every role it ran).
            let attempts = fresh.roles.iter().find(|x| x.role == role).map_or(0, |x| x.attempts.len());
            let cgroup = self.cell.cgroups.as_ref().and_then(|t| t.record(role)).map(|(_, f)| f).unwrap_or_default();
            let sealed = crate::sealed_text::role(&self.cfg, a.plan(), &self.inv, cgroup);
            let s = self.slot(role);
            s.passed = Some(GatePass { generation: r.generation, preflight_ms: p.ms, attempts, at: unix_now() });
            s.sealed = Some(sealed);
            s.digests = Some(a.digests.clone());
            s.state = State::Down;
            self.prepared[role as usize] = Some(a);
        }
        self.receipt = Some(r);
        self.publish_statement()?;
        let first = if p.roles.contains(&Role::Engine) { Role::Engine } else { Role::Node };
        self.start(first)
    }

    /// Accept control connections: check the peer's uid at once, then read its request
    /// without blocking (bytes arrive through epoll; a deadline bounds the whole request).
    fn on_control(&mut self) {
        // A bounded number per wake-up: a flood of local clients must not keep the loop from
        // its signals and timers (the listener stays readable; found by review).
        for _ in 0..crate::control::ACCEPTS_PER_WAKEUP {
            let mut stream = match self.control.accept() {
                Ok((s, _)) => s,
                Err(_) => return,
            };
            let allowed = self.cfg.cell.control_uids.clone().unwrap_or_else(|| vec![self.inv.uid]);
            match crate::control::peer_uid(&stream) {
                Some(uid) if allowed.contains(&uid) => {}
                uid => {
                    if let Some(suppressed) = self.control_quiet.allow(Instant::now()) {
                        tracing::warn!(
                            uid = uid.unwrap_or(u32::MAX),
                            suppressed,
                            "control: refused a uid not on the allowlist"
                        );
                    }
                    crate::control::respond(
                        &mut stream,
                        &crate::control::error(format!("uid {} is not allowed", uid.unwrap_or(u32::MAX))),
                    );
                    continue;
                }
            }
            if self.clients.len() >= crate::control::MAX_CLIENTS || stream.set_nonblocking(true).is_err() {
                crate::control::respond(&mut stream, &crate::control::error("busy: too many control connections"));
                continue;
            }
            let id = self.next_client;
            self.next_client += 1;
            if self.epoll.add(stream.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_CLIENT | id)).is_ok() {
                self.clients.insert(id, (stream, Vec::new(), Instant::now() + crate::control::READ_TIMEOUT));
            }
        }
    }

    fn on_client(&mut self, id: u64) {
        let Some((stream, buf, _)) = self.clients.get_mut(&id) else { return };
        let mut chunk = [0u8; 1024];
        let got = match std::io::Read::read(stream, &mut chunk) {
            Ok(0) => Some(Err("request must be one line ending in a newline".to_string())),
            Ok(n) => crate::control::feed(buf, &chunk[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
            Err(e) => Some(Err(format!("reading the request: {e}"))),
        };
        let Some(request) = got else { return };
        let Some((mut stream, _, _)) = self.clients.remove(&id) else { return };
        let _ = self.epoll.delete(stream.as_fd());
        match request {
            Err(e) => crate::control::respond(&mut stream, &crate::control::error(e)),
            Ok(crate::control::Request::Status) => {
                let v = self.status();
                crate::control::respond(&mut stream, &v);
            }
            Ok(crate::control::Request::Attest { nonce }) => {
                let v = match self.statement(Some(nonce.clone())) {
                    Ok((env, _)) if self.tpm.is_none() => serde_json::json!({ "ok": true, "envelope": env }),
                    Ok((env, payload)) => {
                        let waiting = self
                            .quoting
                            .iter()
                            .chain(self.quote_job.as_ref().map(|(_, q)| q))
                            .filter(|q| matches!(q.purpose, Purpose::Control(_)))
                            .count();
                        if waiting >= MAX_QUOTING {
                            crate::control::error(format!(
                                "busy: {waiting} statements wait for the TPM's quote; try again"
                            ))
                        } else {
                            let nonce = hex::decode(&nonce).ok();
                            self.quoting.push_back(Quoting { env, payload, nonce, purpose: Purpose::Control(stream) });
                            self.pump_quotes();
                            return;
                        }
                    }
                    Err(e) => crate::control::error(e),
                };
                crate::control::respond(&mut stream, &v);
            }
            Ok(crate::control::Request::Recycle) => {
                if self.stopping.is_some() || self.pending.is_some() || self.ready_check.is_some() || self.gate.busy() {
                    crate::control::respond(
                        &mut stream,
                        &crate::control::error("busy: a start, stop or recycle is in progress; try again"),
                    );
                } else {
                    tracing::info!("control: recycle requested");
                    self.pending = Some(stream);
                    self.begin_stop(0, After::Recycle);
                }
            }
        }
    }

    /// A signed statement over the current generation (docs/attestation.md), and its payload's
    /// bytes; with `cell.tpm` it still needs its quote ([`Supervisor::pump_quotes`]).
    fn statement(&self, nonce: Option<String>) -> std::result::Result<(crate::attest::Envelope, Vec<u8>), String> {
        let Some(public) = &self.attest_key else {
            return Err(format!(
                "no attestation key: run `sealnode attest init --config {}` and restart",
                self.cfg.file.display()
            ));
        };
        let key = match crate::attest::load_signing(&self.cfg.cell.state_dir, self.inv.uid) {
            Ok(Some(k)) if k.verifying_key() == *public => k,
            Ok(Some(_)) => {
                return Err("the attestation key changed since the start: restart sealnode run to sign with it".into())
            }
            Ok(None) => return Err("the attestation key is gone since the start".into()),
            Err(e) => return Err(format!("attestation key: {e}")),
        };
        let Some(receipt) = &self.receipt else { return Err("no generation yet: the cell has not started".into()) };
        let restarts = self.slots.iter().map(|s| (s.role.name().to_string(), s.restarts)).collect();
        let st = crate::attest::build(&crate::attest::Inputs {
            cfg: &self.cfg,
            receipt,
            report: self.report.as_ref(),
            nonce,
            restarts,
            tpm_ak: self.tpm.as_ref().map(|(_, ak)| crate::tpm::ak_id(ak)),
        });
        Ok((crate::attest::sign(&key, &st), crate::attest::statement_bytes(&st)))
    }

    /// After a gate (a start of either role): the generation's statement (no nonce) replaces
    /// the one in the runtime dir's `attest/`, which the running node sees at once
    /// (config::INSIDE_ATTESTATION_DIR). Without a key there is none. With `cell.tpm` the older
    /// generation's goes now and this one once quoted; one that cannot be made is tried again
    /// later ([`Supervisor::on_timers`]), and the node finds none meanwhile.
    fn publish_statement(&mut self) -> std::result::Result<(), i32> {
        if self.attest_key.is_none() {
            return Ok(());
        }
        self.republish_at = None;
        let generation = self.receipt.as_ref().map(|r| r.generation).unwrap_or(0);
        let (env, payload) = match self.statement(None) {
            Ok(x) => x,
            Err(e) => {
                self.statement_failed(e);
                return Ok(());
            }
        };
        if self.tpm.is_none() {
            return self.write_statement(&env);
        }
        self.remove_statement();
        self.quoting.retain(|q| !matches!(q.purpose, Purpose::Publish(_)));
        self.quoting.push_back(Quoting { env, payload, nonce: None, purpose: Purpose::Publish(generation) });
        self.pump_quotes();
        Ok(())
    }

    fn write_statement(&mut self, env: &crate::attest::Envelope) -> std::result::Result<(), i32> {
        let mut bytes = serde_json::to_vec(env).unwrap_or_default();
        bytes.push(b'\n');
        let file = crate::config::STATEMENT_FILE;
        let shown = self.cfg.cell.runtime_dir.join(crate::config::RUNTIME_ATTEST_DIR).join(file);
        if let Err(e) = crate::atomic::write_atomic_at(&self.attest_dir, file, &bytes, 0o644, &shown) {
            tracing::error!(error = %e, "cannot write the statement");
            crate::log::say(&format!("{e}"));
            return Err(exit::FAILED);
        }
        self.statement_missing = None;
        Ok(())
    }

    fn remove_statement(&self) {
        let _ = nix::unistd::unlinkat(
            &self.attest_dir,
            crate::config::STATEMENT_FILE,
            nix::unistd::UnlinkatFlags::NoRemoveDir,
        );
    }

    /// The start statement could not be made: the node finds none (not an older
    /// generation's), `ctl status` says why, and it is tried again after the TPM's backoff.
    fn statement_failed(&mut self, e: String) {
        tracing::error!(error = %e, "no statement for this generation");
        crate::log::say(&format!("no statement for this generation: {e}"));
        self.remove_statement();
        self.statement_missing = Some(e);
        self.republish_at = Some(Instant::now() + crate::tpm::UNRESPONSIVE_BACKOFF + Duration::from_secs(1));
    }

    /// Start quoting the first waiting statement unless one is being quoted; those the TPM
    /// refuses at once are answered at once.
    fn pump_quotes(&mut self) {
        while self.quote_job.is_none() {
            let Some((tools, ak)) = &self.tpm else { return };
            let Some(q) = self.quoting.pop_front() else { return };
            match tools.begin_quote(*ak, q.payload.clone(), q.nonce.clone()) {
                Ok(job) => self.quote_job = Some((job, q)),
                Err(e) => self.quoted(q, Err(e)),
            }
        }
    }

    /// The quote's tool exited (reaped by [`Supervisor::reap`]), or its deadline passed.
    fn quote_progress(&mut self, exit: Option<i32>) {
        let Some((mut job, q)) = self.quote_job.take() else { return };
        let Some((tools, _)) = &self.tpm else { return };
        let progress = match exit {
            Some(code) => tools.on_exit(&mut job, code == 0, &format!("exit status {code}")),
            None => crate::tpm::Progress::Done(Err(tools.expire(&mut job))),
        };
        match progress {
            crate::tpm::Progress::Running => self.quote_job = Some((job, q)),
            crate::tpm::Progress::Done(r) => {
                self.quoted(q, r);
                self.pump_quotes();
            }
        }
    }

    /// A statement's quote came, or failed: to the client that asked, or into the node's view
    /// when it is still this generation's.
    fn quoted(&mut self, q: Quoting, r: std::result::Result<crate::tpm::Quote, String>) {
        let Quoting { mut env, purpose, payload, nonce } = q;
        // The quote is this statement's, or it is not used: checked again here, where it is
        // attached (cheap; the job checked it against the payload it was given).
        let r = r.and_then(|quote| match &self.tpm {
            Some((_, ak)) => crate::tpm::verify(&quote, ak, &payload, nonce.as_deref()).map(|_| quote),
            None => Err("no TPM".into()),
        });
        match (purpose, r) {
            (Purpose::Control(mut stream), Ok(quote)) => {
                env.tpm_quote = Some(quote);
                crate::control::respond(&mut stream, &serde_json::json!({ "ok": true, "envelope": env }));
            }
            (Purpose::Control(mut stream), Err(e)) => {
                crate::control::respond(&mut stream, &crate::control::error(format!("TPM: {e}")));
            }
            (Purpose::Publish(g), r) if self.receipt.as_ref().is_some_and(|x| x.generation == g) => match r {
                Ok(quote) => {
                    env.tpm_quote = Some(quote);
                    if self.write_statement(&env).is_err() {
                        self.begin_stop(exit::FAILED, After::Exit);
                    }
                }
                Err(e) => self.statement_failed(format!("TPM: {e}")),
            },
            (Purpose::Publish(_), _) => {}
        }
    }

    /// Stopping for good: the quote in progress is abandoned, and the clients still waiting
    /// are told so.
    fn abandon_quotes(&mut self) {
        let mut waiting: Vec<Quoting> = std::mem::take(&mut self.quoting).into();
        if let Some((mut job, q)) = self.quote_job.take() {
            if let Some((tools, _)) = &self.tpm {
                tools.abandon(&mut job);
            }
            waiting.push(q);
        }
        for q in waiting {
            if let Purpose::Control(mut stream) = q.purpose {
                crate::control::respond(&mut stream, &crate::control::error("sealnode is stopping"));
            }
        }
    }

    /// Control clients that did not send a whole request in time get an error and are closed.
    fn expire_clients(&mut self) {
        let now = Instant::now();
        let late: Vec<u64> = self.clients.iter().filter(|(_, (_, _, d))| *d <= now).map(|(id, _)| *id).collect();
        for id in late {
            if let Some((mut s, _, _)) = self.clients.remove(&id) {
                let _ = self.epoll.delete(s.as_fd());
                crate::control::respond(&mut s, &crate::control::error("timed out waiting for the request line"));
            }
        }
    }

    fn status(&self) -> serde_json::Value {
        let dropped = crate::logsink::dropped();
        let roles: Vec<serde_json::Value> = self
            .slots
            .iter()
            .map(|s| {
                let (state, pid) = match s.state {
                    State::Down => ("down", None),
                    State::Starting => ("starting", None),
                    State::Running(p) => ("running", Some(p.as_raw())),
                    State::Stopping(p, _) => ("stopping", Some(p.as_raw())),
                    State::Waiting(_) => ("restarting", None),
                    State::Wiping(p) => ("wiping", Some(p.as_raw())),
                };
                serde_json::json!({
                    "role": s.role.name(),
                    "state": state,
                    "pid": pid,
                    "uptime_s": s.started.filter(|_| pid.is_some()).map(|t| t.elapsed().as_secs()),
                    "restarts": s.restarts,
                    "starts": s.starts,
                    "output_dropped_lines": self.buckets[s.role as usize].dropped_total,
                    "refused_syscalls": self.refused_counts(s.role),
                    "generation": s.passed.map(|g| g.generation),
                    "preflight": s.passed.map(|g| {
                        // Per layer, from the role's latest result (the one this pass wrote
                        // into the receipt).
                        let latest = self.report.as_ref().and_then(|r| r.roles.iter().find(|x| x.role == s.role));
                        serde_json::json!({
                            "passed": true,
                            "ms": g.preflight_ms,
                            "attempts": g.attempts,
                            "refused": latest.map(|x| x.refused),
                            "refused_by": latest.map(crate::sealed_text::refused_by),
                            "at": g.at,
                        })
                    }),
                    "sealed": s.sealed,
                    "resources": self.cell.cgroups.as_ref().map(|t| t.usage(s.role)),
                })
            })
            .collect();
        let mut statement = match (&self.attest_key, &self.statement_missing) {
            (None, _) => serde_json::json!({ "state": "none", "why": "no attestation key" }),
            (Some(_), Some(why)) => serde_json::json!({ "state": "missing", "why": why }),
            (Some(_), None)
                if self
                    .quoting
                    .iter()
                    .chain(self.quote_job.as_ref().map(|(_, q)| q))
                    .any(|q| matches!(q.purpose, Purpose::Publish(_))) =>
            {
                serde_json::json!({ "state": "quoting" })
            }
            (Some(_), None) => serde_json::json!({ "state": "published" }),
        };
        statement["signed"] = self.attest_key.is_some().into();
        statement["tpm_quoted"] = self.tpm.is_some().into();
        serde_json::json!({
            "ok": true,
            "uptime_s": self.born.elapsed().as_secs(),
            "cell_pid": self.cell.pid.as_raw(),
            "ready": self.ready_sent,
            "engine_ready_ms": self.ready_ms,
            "log_dropped_lines": {
                "stdout": dropped.0,
                "stderr": dropped.1,
                "journal": crate::journal::dropped(),
            },
            "roles": roles,
            // `attest` requests waiting for the TPM's quote (at most MAX_QUOTING).
            "attest_waiting": self
                .quoting
                .iter()
                .chain(self.quote_job.as_ref().map(|(_, q)| q))
                .filter(|q| matches!(q.purpose, Purpose::Control(_)))
                .count(),
            "gate": self.gate.progress().map(|(purpose, roles, t)| serde_json::json!({
                "purpose": match purpose { gate::Purpose::Start => "start", gate::Purpose::DryRun => "reload" },
                "roles": roles.iter().map(|r| r.name()).collect::<Vec<_>>(),
                "ms": t.as_millis() as u64,
            })),
            "statement": statement,
            "egress": self.fwd.stats(),
            "engine_forwarding": self.fwd.engine_stats(),
            "reload": self.last_reload,
            "receipt": self.receipt.as_ref().map(|r| serde_json::json!({
                "path": crate::receipt::path(&self.cfg),
                "generation": r.generation,
                "started_at": r.started_at,
                "canary_passed": r.canary.passed,
            })),
        })
    }

    fn next_deadline(&self) -> Option<Instant> {
        let mut d: Vec<Instant> = Vec::new();
        for s in &self.slots {
            match s.state {
                State::Stopping(_, at) | State::Waiting(at) => d.push(at),
                _ => {}
            }
        }
        if let Some(p) = &self.ready_check {
            d.push(p.deadline);
            if p.fd.is_none() {
                d.push(p.next_try);
            }
        }
        if let Some((iv, last)) = self.watchdog {
            d.push(last + iv);
        }
        d.extend(self.fwd.next_sweep());
        d.extend(self.clients.values().map(|(_, _, deadline)| *deadline));
        d.extend(self.fwd.next_lookup_deadline());
        d.extend(self.quote_job.as_ref().map(|(j, _)| j.deadline()));
        d.extend(self.republish_at);
        d.extend(self.wipe_deadline);
        d.extend(self.gate.next_deadline());
        d.into_iter().min()
    }

    /// The engine runs and answered its readiness check.
    fn engine_is_ready(&self) -> bool {
        self.ready_check.is_none() && matches!(self.slots[Role::Engine as usize].state, State::Running(_))
    }

    /// Start a role. Errors stop the cell (returned as the exit code when nothing runs yet).
    fn start(&mut self, role: Role) -> std::result::Result<(), i32> {
        // Only what the gate admitted starts: fail closed if there is none.
        let mut pipes = None;
        let errno = self.prepared[role as usize].as_ref().and_then(|a| a.plan().refusal_log);
        let started = match self.prepared[role as usize].take().map(gate::Admitted::into_plan) {
            Some(mut plan) => match output_pipes() {
                Ok((stdio, out, err)) => {
                    plan.stdio = Some(stdio);
                    pipes = Some((out, err));
                    // The plan (and with it the pipes' write ends) is dropped once spawned.
                    sandbox::spawn_in(&plan, Some(&self.cell))
                }
                Err(e) => Err(e),
            },
            None => Err(Error::errno(format!("{role}: no start passed the gate (internal error)"), Errno::EPERM)),
        };
        match started {
            Ok(sb) => {
                let generation = self.receipt.as_ref().map_or(0, |r| r.generation);
                tracing::info!(role = %role, pid = sb.pid.as_raw(), generation, "role started");
                if let Some((out, err)) = pipes {
                    self.capture(role, sb.pid.as_raw(), generation, false, out);
                    self.capture(role, sb.pid.as_raw(), generation, true, err);
                }
                self.watch_refusals(role, sb.listener, errno);
                let s = self.slot(role);
                s.state = State::Running(sb.pid);
                s.started = Some(Instant::now());
                s.starts += 1;
                notify(&[NotifyState::Status(&format!("{role} started"))]);
                if role == Role::Engine {
                    self.begin_ready_check();
                }
                Ok(())
            }
            Err(e) => {
                tracing::error!(role = %role, error = %e, "role failed to start");
                crate::log::say(&format!("{e}"));
                let nothing_running =
                    self.slots.iter().all(|s| matches!(s.state, State::Down | State::Waiting(_) | State::Starting));
                self.begin_stop(exit::FAILED, After::Exit);
                if nothing_running {
                    Err(sandbox::SETUP_FAILED)
                } else {
                    Ok(())
                }
            }
        }
    }

    /// Refusals the denial log saw for `role` (all its runs), per syscall name; null without it.
    fn refused_counts(&self, role: Role) -> serde_json::Value {
        if !self.cfg.role(role).log_refused_syscalls {
            return serde_json::Value::Null;
        }
        let mut all = self.refused_before[role as usize].clone();
        if let Some(d) = &self.refusals[role as usize] {
            for (k, v) in d.counts() {
                *all.entry(k).or_insert(0) += v;
            }
        }
        serde_json::json!(all)
    }

    /// Serve a role's denial-log listener (replacing its previous run's, which closes).
    fn watch_refusals(&mut self, role: Role, listener: Option<OwnedFd>, errno: Option<i32>) {
        if let Some(old) = self.refusals[role as usize].take() {
            let _ = self.epoll.delete(old.fd.as_fd());
            for (k, v) in old.counts() {
                *self.refused_before[role as usize].entry(k).or_insert(0) += v;
            }
        }
        let (Some(fd), Some(errno)) = (listener, errno) else { return };
        match self.epoll.add(fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_REFUSED | role as u64)) {
            Ok(()) => self.refusals[role as usize] = Some(crate::denylog::DenyLog::new(role, fd, errno)),
            // Dropped: its refusals then fail with ENOSYS in the kernel, unlogged.
            Err(e) => tracing::warn!(role = %role, error = %e, "cannot watch the denial log; refusals are not logged"),
        }
    }

    /// Refused syscalls of a role wait on its listener: answer and log them (denylog.rs),
    /// at most REFUSED_BUDGET per wake-up; forget the listener once its run ended.
    fn on_refused(&mut self, i: usize) {
        let Some(d) = self.refusals[i].as_mut() else { return };
        if d.serve(REFUSED_BUDGET) == crate::denylog::Served::Closed {
            let _ = self.epoll.delete(d.fd.as_fd());
            // Its counts stay for ctl status and the metrics.
            let counts = d.counts();
            for (k, v) in counts {
                *self.refused_before[i].entry(k).or_insert(0) += v;
            }
            self.refusals[i] = None;
        }
    }

    /// Watch one of a role's output pipes.
    fn capture(&mut self, role: Role, pid: i32, generation: u64, err: bool, fd: OwnedFd) {
        let id = self.next_output;
        self.next_output += 1;
        if let Err(e) = self.epoll.add(fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_OUTPUT | id)) {
            // The role keeps running; its output is lost (the pipe closes and it gets EPIPE).
            tracing::warn!(role = %role, pid, error = %e, "cannot watch the role's output; it is dropped");
            return;
        }
        self.outputs.insert(id, crate::output::Capture::new(role, pid, generation, err, fd));
    }

    /// A role's pipe is readable: re-emit its lines (bounded per wake-up), forget it at EOF.
    fn on_output(&mut self, id: u64) {
        let Some(c) = self.outputs.get_mut(&id) else { return };
        let bucket = &mut self.buckets[c.role as usize];
        let done = c.read(bucket, &mut |c, line| {
            crate::log::role_line(c.role, c.pid, c.generation, c.err, &crate::log::clean(line))
        });
        if done == crate::output::Read::Eof {
            if let Some(c) = self.outputs.remove(&id) {
                let _ = self.epoll.delete(c.fd.as_fd());
                if c.cut > 0 {
                    tracing::warn!(role = %c.role, pid = c.pid, lines = c.cut, max_bytes = crate::output::MAX_LINE, "role output: lines longer than the limit were cut");
                }
            }
        }
    }

    /// Lines a role wrote above its rate, said once a second at most.
    fn report_dropped_output(&mut self) {
        let now = Instant::now();
        for role in Role::ALL {
            if let Some(n) = self.buckets[role as usize].report(now) {
                tracing::warn!(role = %role, dropped = n, lines_per_s = crate::output::RATE, "role output over its rate limit: lines dropped");
            }
        }
    }

    fn begin_ready_check(&mut self) {
        let timeout = Duration::from_secs(self.cfg.engine.ready().timeout_s);
        self.ready_check = Some(ReadyCheck {
            fd: None,
            step: ReadyStep::Connecting,
            buf: Vec::new(),
            next_try: Instant::now(),
            deadline: Instant::now() + timeout,
            began: Instant::now(),
            last: "no answer yet".to_string(),
        });
    }

    fn try_ready_check(&mut self) {
        let port = self.cfg.engine.port.unwrap_or(0) as u16;
        let Some(p) = self.ready_check.as_mut() else { return };
        p.next_try = Instant::now() + READY_INTERVAL;
        let Ok(fd) = self.cell.engine_socket() else { return };
        match connect(fd.as_raw_fd(), &SockaddrIn::from(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))) {
            Ok(()) | Err(Errno::EINPROGRESS) => {}
            Err(e) => {
                p.last = format!("connect: {}", e.desc());
                return;
            }
        }
        if self.epoll.add(fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLOUT, TOKEN_READY)).is_ok() {
            p.step = ReadyStep::Connecting;
            p.buf.clear();
            p.fd = Some(fd);
        }
    }

    fn ready_check_failed(&mut self) {
        if let Some(p) = self.ready_check.as_mut() {
            if let Some(fd) = p.fd.take() {
                let _ = self.epoll.delete(fd.as_fd());
            }
        }
    }

    fn advance_ready_check(&mut self) {
        let http = self.cfg.engine.ready().kind == "http";
        let path = self.cfg.engine.ready().path.clone();
        let Some(p) = self.ready_check.as_mut() else { return };
        let Some(fd) = p.fd.as_ref() else { return };
        match p.step {
            ReadyStep::Connecting => {
                match getsockopt(fd, sockopt::SocketError) {
                    Ok(0) => {}
                    Ok(e) => {
                        p.last = format!("connect: {}", Errno::from_raw(e).desc());
                        return self.ready_check_failed();
                    }
                    Err(e) => {
                        p.last = format!("connect: {}", e.desc());
                        return self.ready_check_failed();
                    }
                }
                if !http {
                    return self.engine_ready();
                }
                let req = format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nUser-Agent: sealnode-readiness\r\n\r\n");
                if nix::unistd::write(fd, req.as_bytes()).ok() != Some(req.len()) {
                    return self.ready_check_failed();
                }
                p.step = ReadyStep::Reading;
                let _ = self.epoll.modify(fd.as_fd(), &mut EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_READY));
            }
            ReadyStep::Reading => {
                let mut b = [0u8; 512];
                match nix::unistd::read(fd, &mut b) {
                    Ok(0) | Err(_) => {
                        p.last = "the connection closed before an HTTP status line".to_string();
                        return self.ready_check_failed();
                    }
                    Ok(n) => p.buf.extend_from_slice(&b[..n]),
                }
                if let Some(end) = p.buf.windows(2).position(|w| w == b"\r\n") {
                    let line = String::from_utf8_lossy(&p.buf[..end]).into_owned();
                    if line.split_whitespace().nth(1) == Some("200") {
                        return self.engine_ready();
                    }
                    // The engine's words, escaped like its own output (it could forge a line).
                    tracing::debug!(status = %crate::log::clean(line.as_bytes()), "engine not ready yet");
                    p.last = format!("answered {:?}", line.chars().take(120).collect::<String>());
                    return self.ready_check_failed();
                }
                if p.buf.len() > 4096 {
                    p.last = "answered 4 KiB without an HTTP status line".to_string();
                    self.ready_check_failed();
                }
            }
        }
    }

    fn engine_ready(&mut self) {
        self.ready_check_failed();
        let latency = self.ready_check.take().map(|p| p.began.elapsed());
        self.ready_ms = latency.map(|d| d.as_secs_f64() * 1000.0);
        tracing::info!(role = "engine", ready_ms = self.ready_ms, "engine ready");
        if self.stopping.is_some() {
            return;
        }
        if self.slots[Role::Node as usize].state == State::Down && self.start(Role::Node).is_err() {
            return;
        }
        if !self.ready_sent && matches!(self.slots[Role::Node as usize].state, State::Running(_)) {
            self.ready_sent = true;
            notify(&[NotifyState::Ready, NotifyState::Status("engine ready, node running")]);
        } else if self.reloading && matches!(self.slots[Role::Node as usize].state, State::Running(_)) {
            notify(&[NotifyState::Ready, NotifyState::Status("reloaded: engine ready, node running")]);
        }
        if matches!(self.slots[Role::Node as usize].state, State::Running(_)) && self.reloading {
            self.reloading = false;
            tracing::info!(generation = self.receipt.as_ref().map(|r| r.generation), "reload complete");
        }
        if let Some(mut c) = self.pending.take() {
            let generation = self.receipt.as_ref().map(|r| r.generation);
            tracing::info!(generation, "recycle complete");
            crate::control::respond(
                &mut c,
                &serde_json::json!({ "ok": true, "recycled": true, "generation": generation }),
            );
        }
    }

    fn on_signals(&mut self) {
        while let Ok(Some(info)) = self.sigfd.read_signal() {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGCHLD) => self.reap(),
                Ok(Signal::SIGTERM) | Ok(Signal::SIGINT) | Ok(Signal::SIGQUIT) => {
                    tracing::info!(signal = info.ssi_signo, "stopping the cell");
                    self.begin_stop(0, After::Exit);
                }
                Ok(Signal::SIGHUP) => self.reload(),
                _ => {}
            }
        }
    }

    /// SIGHUP: read the config and its policies again through the checked path. Invalid, or a
    /// change only a new cell could apply (reload.rs): keep running as is, log why, show it in
    /// `ctl status`. Valid: the new config passes the gate first, in a throwaway cell of its
    /// own (its programs measured, its preflight; in this cell the running engine listens, and
    /// an engine allowed to connect would reach it and look like an escape), while the old
    /// roles keep running; then both roles are stopped and started again through the gate.
    fn reload(&mut self) {
        // Busy includes the wipes before the first start: that start's pass is next, and a
        // dry run begun meanwhile would meet it (found by review: the SIGHUP was lost and the
        // start's refusals were taken for the reload's).
        if self.stopping.is_some() || self.pending.is_some() || self.gate.busy() || self.wipe_for.is_some() {
            tracing::warn!("SIGHUP ignored: a start, stop, restart, recycle or reload is in progress");
            self.last_reload = Some(serde_json::json!({
                "ok": false,
                "at": unix_now(),
                "error": "a start, stop, restart, recycle or reload was in progress",
            }));
            return;
        }
        let loaded = Config::load(&self.cfg.file, &self.inv).and_then(|new| match reload::refused(&self.cfg, &new) {
            changed if changed.is_empty() => Ok(new),
            changed => Err(Error::config(
                &self.cfg.file,
                changed.join(", "),
                "changed, but the running cell (its network, listeners, users, dirs and TPM) was built with the old value; restart sealnode to apply it",
            )),
        });
        let new = match loaded {
            Ok(new) => new,
            Err(e) => return self.reload_failed(e.to_string()),
        };
        log_devices_from(&new);
        let ctx = gate::Ctx {
            cfg: &new,
            inv: &self.inv,
            cell: &self.cell,
            state: &self.state_dir,
            epoll: &self.epoll,
            // The dry run hashes what the start will (its cache makes the start cheap): a
            // model dir the start could not hash is refused now, with the roles untouched.
            hash_models: self.attest_key.is_some(),
            scratch: [&self.slots[0].scratch, &self.slots[1].scratch],
        };
        match self.gate.begin(&ctx, &Role::ALL, gate::Purpose::DryRun) {
            Ok(()) => {
                tracing::info!(config_sha256 = %new.loaded.config.sha256, "SIGHUP: the new config passes the gate first (a throwaway cell); the running roles are untouched meanwhile");
                self.reload_candidate = Some(new);
            }
            Err(o) => self.reload_refused(o),
        }
    }

    /// The new config's dry run failed: nothing changes.
    fn reload_refused(&mut self, o: gate::Outcome) {
        let file = self.reload_candidate.take().map(|c| c.file).unwrap_or_else(|| self.cfg.file.clone());
        let gate::Outcome::Refused { code, message, details } = o else { return };
        let why = match code {
            exit::PREFLIGHT_FAILED => Error::config(
                &file,
                "(policies)",
                format!("the new config's preflight found escapes: {}", details.join("; ")),
            )
            .to_string(),
            _ => message,
        };
        self.reload_failed(why);
    }

    fn reload_failed(&mut self, e: String) {
        tracing::error!(error = %e, "SIGHUP: reload refused; the cell keeps running unchanged");
        crate::log::say(&format!("reload refused: {e}"));
        notify(&[NotifyState::Status(&format!("reload refused: {e}"))]);
        self.last_reload = Some(serde_json::json!({ "ok": false, "at": unix_now(), "error": e }));
    }

    /// The new config passed its dry run: both roles stop and start again through the gate
    /// with it (the cell's network stays).
    fn reload_passed(&mut self) {
        let Some(new) = self.reload_candidate.take() else { return };
        tracing::info!(config_sha256 = %new.loaded.config.sha256, "SIGHUP: config reloaded; restarting both roles through the gate (the cell's network stays)");
        let mut states = vec![NotifyState::Reloading, NotifyState::Status("reloading")];
        if let Ok(usec) = NotifyState::monotonic_usec_now() {
            states.push(usec);
        }
        notify(&states);
        self.last_reload =
            Some(serde_json::json!({ "ok": true, "at": unix_now(), "config_sha256": new.loaded.config.sha256 }));
        self.next_cfg = Some(new);
        self.reloading = true;
        self.begin_stop(exit::OK, After::Restart);
    }

    fn reap(&mut self) {
        loop {
            let ws = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(ws) => ws,
            };
            let (Some(pid), Some(code)) = (ws.pid(), status_code(ws)) else { continue };
            if self.wipe_exited(pid, ws) {
                continue;
            }
            if self.gate.exited(pid, code) {
                continue;
            }
            if self.quote_job.as_ref().and_then(|(j, _)| j.pid()) == Some(pid.as_raw()) {
                self.quote_progress(Some(code));
                continue;
            }
            if pid == self.cell.pid {
                tracing::error!(code, "the cell init died; stopping");
                self.begin_stop(exit::FAILED, After::Exit);
                continue;
            }
            for i in 0..2 {
                let s = &self.slots[i];
                let role = s.role;
                match s.state {
                    State::Stopping(p, _) if p == pid => {
                        tracing::info!(role = %role, pid = pid.as_raw(), code, "role stopped");
                        self.slots[i].state = State::Down;
                    }
                    State::Running(p) if p == pid => self.role_exited(role, pid, code),
                    _ => {}
                }
            }
        }
    }

    fn role_exited(&mut self, role: Role, pid: Pid, code: i32) {
        // The kernel's OOM killer killed the role's whole leaf (memory.oom.group): say so, with
        // the limit, before the restart policy applies as to any other exit.
        let oom = self.cell.cgroups.as_ref().map(|t| (t.oom_kills(role), t.limits(role).and_then(|l| l.memory_max_mb)));
        if let Some((kills, max)) = oom {
            let seen = std::mem::replace(&mut self.slot(role).oom_kills, kills);
            if kills > seen {
                tracing::error!(role = %role, pid = pid.as_raw(), code, memory_max_mb = max, oom_kills = kills, "role OOM-killed: it reached its memory limit");
            }
        }
        let policy = self.cfg.role(role).restart;
        let restart =
            self.stopping.is_none() && (policy == Restart::Always || (policy == Restart::OnFailure && code != 0));
        let s = self.slot(role);
        if s.started.is_some_and(|t| t.elapsed() >= STABLE_AFTER) {
            s.backoff = BACKOFF_MIN;
        }
        let limit = self.cfg.role(role).restart_limit;
        let s = self.slot(role);
        let now = Instant::now();
        while s.recent.front().is_some_and(|t| now.duration_since(*t) > Duration::from_secs(limit.interval_s)) {
            s.recent.pop_front();
        }
        if restart && s.recent.len() >= limit.burst as usize {
            s.state = State::Down;
            tracing::error!(role = %role, pid = pid.as_raw(), code, burst = limit.burst, interval_s = limit.interval_s, "role exited; restart limit reached, stopping the cell");
            crate::log::say(&format!(
                "{role} exited with status {code}; it was restarted {} times within {} s already (restart_limit.burst); stopping the cell",
                limit.burst, limit.interval_s
            ));
            self.begin_stop(exit::RESTART_LIMIT, After::Exit);
            return;
        }
        if restart {
            s.recent.push_back(now);
            let delay = s.backoff;
            s.backoff = (s.backoff * 2).min(BACKOFF_MAX);
            s.restarts += 1;
            s.state = State::Waiting(Instant::now() + delay);
            tracing::warn!(role = %role, pid = pid.as_raw(), code, restart_in_ms = delay.as_millis() as u64, restarts = s.restarts, "role exited; restarting");
            notify(&[NotifyState::Status(&format!("{role} exited with {code}; restarting"))]);
            if role == Role::Engine {
                self.ready_check_failed();
                self.ready_check = None;
            }
        } else {
            s.state = State::Down;
            if self.stopping.is_none() {
                tracing::error!(role = %role, pid = pid.as_raw(), code, "role exited; stopping the cell (restart = \"{}\")", match policy { Restart::No => "no", Restart::OnFailure => "on-failure", Restart::Always => "always" });
                crate::log::say(&format!("{role} exited with status {code}; stopping the cell"));
                self.begin_stop(exit::FAILED, After::Exit);
            }
        }
    }

    fn begin_stop(&mut self, code: i32, after: After) {
        match self.stopping {
            // A failure during a restart or a second signal keeps the stricter outcome.
            Some((c, a)) => {
                self.stopping = Some((
                    c.max(code),
                    if a == After::Exit || after == After::Exit { After::Exit } else { After::Restart },
                ))
            }
            None => self.stopping = Some((code, after)),
        }
        if after == After::Exit {
            notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
            // A recycle in progress will not complete: say so rather than hang up.
            if let Some(mut c) = self.pending.take() {
                crate::control::respond(
                    &mut c,
                    &crate::control::error("sealnode is stopping; the recycle did not complete"),
                );
            }
        }
        self.ready_check_failed();
        self.ready_check = None;
        // A pass in progress is given up (its processes are killed and reaped later); a
        // reload's dry run with it.
        if self.gate.busy() {
            tracing::info!("preflight abandoned: a stop was requested (the gate's measurement and probes are killed)");
            self.gate.abandon(&self.epoll);
        }
        if self.reload_candidate.take().is_some() {
            self.last_reload =
                Some(serde_json::json!({ "ok": false, "at": unix_now(), "error": "abandoned: the cell stopped" }));
        }
        for s in self.slots.iter_mut() {
            if matches!(s.state, State::Waiting(_) | State::Starting) {
                s.state = State::Down;
            }
        }
        self.arm_wipe_deadline();
        self.stop_next();
    }

    /// A stop to exit gives wipes in flight the grace period the roles get.
    fn arm_wipe_deadline(&mut self) {
        let exiting = matches!(self.stopping, Some((_, After::Exit)));
        if exiting && self.wipe_deadline.is_none() && self.slots.iter().any(|s| matches!(s.state, State::Wiping(_))) {
            self.wipe_deadline = Some(Instant::now() + Duration::from_secs(self.cfg.cell.stop_timeout_s));
        }
    }

    /// Stop in reverse order: the node first, the engine once the node is down.
    fn stop_next(&mut self) {
        let grace = Duration::from_secs(self.cfg.cell.stop_timeout_s);
        for role in [Role::Node, Role::Engine] {
            let s = self.slot(role);
            match s.state {
                State::Running(pid) => {
                    tracing::info!(role = %role, pid = pid.as_raw(), "stopping role (SIGTERM)");
                    let _ = kill(pid, Signal::SIGTERM);
                    s.state = State::Stopping(pid, Instant::now() + grace);
                    return;
                }
                State::Stopping(..) => return,
                _ => {}
            }
        }
    }

    fn on_timers(&mut self) {
        let now = Instant::now();
        if self.wipe_deadline.is_some_and(|t| t <= now) {
            self.wipe_deadline = None;
            for s in &self.slots {
                if let State::Wiping(pid) = s.state {
                    tracing::warn!(role = %s.role, pid = pid.as_raw(), "the scratch wipe did not finish within the stop's grace period; killed (the next start wipes again)");
                    let _ = kill(pid, Signal::SIGKILL);
                }
            }
        }
        self.expire_clients();
        if self.quote_job.as_ref().is_some_and(|(j, _)| j.deadline() <= now) {
            self.quote_progress(None);
        }
        if self.republish_at.is_some_and(|t| t <= now) && self.stopping.is_none() {
            self.republish_at = None;
            if self.statement_missing.is_some() && self.publish_statement().is_err() {
                self.begin_stop(exit::FAILED, After::Exit);
            }
        }
        if self.stopping.is_some() {
            self.stop_next();
        }
        for i in 0..2 {
            match self.slots[i].state {
                State::Stopping(pid, at) if at <= now => {
                    tracing::warn!(role = %self.slots[i].role, pid = pid.as_raw(), "grace period over; SIGKILL");
                    let _ = kill(pid, Signal::SIGKILL);
                    self.slots[i].state = State::Stopping(pid, now + Duration::from_secs(3600));
                }
                State::Waiting(at) if at <= now && self.stopping.is_none() => {
                    let role = self.slots[i].role;
                    // The node restarts only once the engine is ready again, and one pass
                    // through the gate runs at a time. Either passes the gate first: its
                    // program measured, its preflight, a new receipt; then it starts.
                    if (role == Role::Engine || self.engine_is_ready()) && !self.gate.busy() {
                        self.slots[i].state = State::Down;
                        if let Err(code) = self.enter_gate(&[role]) {
                            self.begin_stop(code, After::Exit);
                        }
                    } else {
                        self.slots[i].state = State::Waiting(now + READY_INTERVAL);
                    }
                }
                _ => {}
            }
        }
        if let Some(p) = &self.ready_check {
            if p.deadline <= now {
                let ready = self.cfg.engine.ready();
                let what = match ready.kind.as_str() {
                    "http" => format!(
                        "GET http://127.0.0.1:{}{} answering 200",
                        self.cfg.engine.port.unwrap_or(0),
                        ready.path
                    ),
                    _ => format!("a TCP connect to 127.0.0.1:{}", self.cfg.engine.port.unwrap_or(0)),
                };
                tracing::error!(timeout_s = ready.timeout_s, last = %p.last, "engine not ready in time");
                crate::log::say(&format!(
                    "the engine did not become ready within {} s ({what}); last try: {}\n  \
                     next: check the engine's own output above (a model still loading needs a larger \
                     engine.ready.timeout_s; a wrong engine.port or --port never answers)",
                    ready.timeout_s, p.last
                ));
                self.begin_stop(exit::NOT_READY, After::Exit);
            } else if p.fd.is_none() && p.next_try <= now {
                self.try_ready_check();
            }
        }
        if let Some((iv, last)) = self.watchdog {
            if last + iv <= now {
                notify(&[NotifyState::Watchdog]);
                self.watchdog = Some((iv, now));
            }
        }
        self.fwd.sweep(&self.epoll);
        self.fwd.expire_lookups(&self.epoll);
    }
}

/// Seconds since the Unix epoch.
fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// The cell stops before (or while) both roles start: say so to the log and to systemd, as a
/// stop from the loop does (found by review: an abandoned gate exited without either).
fn stopped_early(code: i32) -> i32 {
    notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
    tracing::info!(code, "cell stopped");
    code
}

/// A stop signal waits on the signalfd (the battery gives up its preflight for it).
fn stop_pending() -> bool {
    use nix::sys::signal::Signal;
    crate::sys::signal_pending(&[Signal::SIGTERM, Signal::SIGINT, Signal::SIGQUIT])
}

/// A role's stdio for `run`: stdin /dev/null, stdout and stderr each a pipe whose read end
/// (non-blocking) the supervisor keeps: (the role's stdio, stdout's read end, stderr's).
fn output_pipes() -> Result<(sandbox::plan::Stdio, OwnedFd, OwnedFd)> {
    use nix::fcntl::OFlag;
    let pipe = || {
        let (r, w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(|e| Error::errno("pipe2 (role output)", e))?;
        nix::fcntl::fcntl(&r, nix::fcntl::FcntlArg::F_SETFL(OFlag::O_NONBLOCK))
            .map_err(|e| Error::errno("fcntl (role output)", e))?;
        Ok::<_, Error>((r, w))
    };
    let (out_r, out_w) = pipe()?;
    let (err_r, err_w) = pipe()?;
    let null = std::fs::File::open("/dev/null").map_err(|e| Error::io("open /dev/null", e))?;
    Ok((sandbox::plan::Stdio { stdin: null.into(), stdout: out_w, stderr: Some(err_w) }, out_r, err_r))
}

/// Bind the control socket (mode 0666: access is decided per connection by SO_PEERCRED) in
/// sealnode's own runtime dir, through its descriptor: created 0755 if missing, checked with
/// fstat, the old socket removed and the new one bound with no path lookup an other user
/// could redirect.
fn open_control(cfg: &Config, dir: &OwnedFd) -> Result<std::os::unix::net::UnixListener> {
    let path = crate::control::socket_path(cfg);
    match nix::unistd::unlinkat(dir, crate::control::SOCKET, nix::unistd::UnlinkatFlags::NoRemoveDir) {
        Ok(()) | Err(Errno::ENOENT) => {}
        Err(e) => return Err(Error::errno(format!("remove the old {}", path.display()), e)),
    }
    // The socket is created in the directory the descriptor holds, through /proc/self/fd.
    let at = format!("/proc/self/fd/{}/{}", dir.as_raw_fd(), crate::control::SOCKET);
    // Mode 0666 through the umask at creation, not a chmod afterwards (chmod follows symlinks).
    let old = nix::sys::stat::umask(nix::sys::stat::Mode::from_bits_truncate(0o111));
    let bound = std::os::unix::net::UnixListener::bind(&at);
    nix::sys::stat::umask(old);
    let l = bound.map_err(|e| Error::io(format!("bind {}", path.display()), e))?;
    l.set_nonblocking(true).map_err(|e| Error::io("control socket", e))?;
    Ok(l)
}

/// What each role takes from its CDI spec, and what of the spec it leaves out and why: an
/// operator comparing the spec with the role's view finds every difference here.
fn log_devices_from(cfg: &Config) {
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
