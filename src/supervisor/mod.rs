//! `sealnode run`: the cell, both roles, egress, readiness, restarts and shutdown, driven by
//! one single-threaded epoll loop (signals arrive through a signalfd).
//!
//! Order: create the cell (netns + egress listeners), wipe both scratch dirs, pass both roles
//! through the gate (their programs measured, their sandboxes preflighted, off the loop),
//! write the receipt and the statement, start the engine, wait until it is ready (TCP accept
//! or HTTP 200 on loopback inside the cell), start the node, tell systemd READY=1. Every later
//! start of a role (crash restart, SIGHUP, recycle) passes the gate again. Stop: node first,
//! then engine, each SIGTERM then SIGKILL after the grace period; scratch is wiped; the model
//! dir is never touched.
//!
//! Each turn of the loop ([`Supervisor::run`]) takes the cell's next steps
//! ([`Supervisor::advance`], by the cell's table), waits, dispatches each event by its token
//! to the component that owns it, then acts on the gate's outcome (`poll_gate`) and the
//! components' timers (`on_timers`). Components own their fields and offer the loop what it
//! needs of them (a handler for their tokens, a next deadline and a sweep where they keep
//! time):
//! - [`gate`]: one pass at a time through measurement and preflight;
//! - [`readiness`]: the engine's readiness check;
//! - [`server`]: the control socket's clients (the protocol is crate::control's);
//! - [`attestation`]: the signed statements and their TPM quotes;
//! - [`role_io`]: the roles' output and denial logs;
//! - [`notify`]: sd_notify and the watchdog;
//! - [`watch`]: with `cell.reload_on_change`, the config's directory, for a change to reload;
//! - the forwarder (crate::egress) for the node's egress and its way to the engine.
//!
//! [`lifecycle`] is data and pure rules, unit-tested as tables: each role's phase and its
//! state × event table (`Phase::on`; every phase change goes through `Slot::apply`), the
//! cell's course and its tables (`Cycle::apply`: every change of the stop under way and the
//! wipes; `Cycle::next`: the next step, a clean stop's drain, its SIGTERMs in order, the wipes once both roles
//! are down, what follows the wipes), restarts and backoff, which of two stops wins, which
//! role a pass starts, and what makes the cell too busy for a SIGHUP or a recycle
//! (`UnderWay`: one rule for both); [`reload`] holds the reload in its steps and sorts what a
//! SIGHUP may change. The verbs that act on processes through the components are
//! `impl Supervisor` blocks, a file each: [`setup`] (the cell made once, before the loop:
//! `new`), [`admit`] (the gate's outcome to a start), [`roles`] (start, exit, stop),
//! [`wipes`] (before a start, after a stop, and what follows), [`sighup`] (the reload),
//! [`status`] (the reply); this file keeps the loop's own (`reap`, `on_request`, `on_timers`,
//! `advance`).
//!
//! Failures: a verb that fails stops the cell itself (`begin_stop` with the exit status of
//! what failed; a second stop keeps the stricter outcome) and returns nothing (a step of a
//! verb that did so returns None, and the verb goes no further); components return what
//! failed to the verb that called them (an exit status; the readiness check a time-out, which
//! is exit 4). Two verbs hand an exit status back: `enter_gate`, to its caller (a restart's
//! refusal stops the running cell; after the wipes, a refusal ends the loop at once, nothing
//! running and scratch just wiped), and `wipes_done`, whose Some(code) ends the loop (through
//! `finish_stop`, its one way out).
//!
//! Tokens: an event's top byte names its owner, the low bits its item (`tokens_are_distinct`
//! below): 1 signals (here), 2 egress listeners, 3 egress connections, 7 egress lookups
//! (crate::egress), 4 readiness, 5 the control listener and 6 its clients ([`server`]), 8 role
//! output and 9 denial logs ([`role_io`]), 10 the gate's pipes ([`gate`]), 11 the config
//! watch ([`watch`]).
//!
//! The sequences, hop by hop:
//! - First start: `run` → `begin_wipes`; each wipe child reaped (`reap` → `wipe_exited`);
//!   `advance` (`Cycle::next`: both wipes done) → `wipes_done` → `enter_gate(both)` →
//!   `gate.begin`; the gate's pipes and children (`gate.handle`, `gate.exited`); `poll_gate`
//!   → `admit` (receipt, statement; the node's plan kept, the node `Admitted`) →
//!   `start(engine)` → `readiness.begin`; the engine answers → `on_engine_ready` → `start(node)`
//!   → READY=1. A refusal at `gate.begin` ends the loop there (`finish_stop`, nothing ran); a
//!   refusal from the pass (`refused_start`) stops the cell as any failure does (scratch wiped
//!   again, `finish_stop`).
//! - Crash restart: `reap` → `role_process_exited` → `role_exited` (`Restarts::on_exit`: a
//!   backoff, give up, or stop) → `roles_timer` once the backoff is over → `enter_gate(role)`
//!   → `poll_gate` → `admit` → `start(role)` (the node after a ready engine).
//! - Stop (SIGTERM, a failure): `begin_stop(code, Exit)` (what was about to start does not;
//!   a clean stop's drain begins, the node's new connections to the engine wait) → `advance`:
//!   once the node's requests to the engine are done or the drain's time is over,
//!   `terminate(node)`, once it is reaped `terminate(engine)` (SIGKILL from `roles_timer`
//!   after the grace period), both down → `begin_wipes`, both done → `wipes_done` →
//!   `finish_stop` (forwarding closed, totals) → the exit status.
//! - Reload (SIGHUP): `on_sighup` (`Config::reload`, `reload::refused`,
//!   `cgroup::check_update`) → `reload::scope`: nothing restarts → `apply_in_place` (limits
//!   written live, the forwarder's bounds, a new receipt, READY=1); else the dry run
//!   (`gate.begin(DryRun)` in a throwaway cell) → `poll_gate` → `reload_passed` (limits
//!   written live) → `begin_stop(OK, RestartNode)` (the engine's inputs unchanged and it
//!   ready) or `begin_stop(OK, Restart)` → as a stop of those roles up to `wipes_done`, which
//!   switches the config (`Reload::take_next`; `switch_egress` while the node is down) and
//!   enters the gate with the stopped roles; READY=1 again once the node runs.
//! - Reload on a config change (with cell.reload_on_change): `watch.handle` (events of the config's
//!   directory) → `on_timers` once quiet for a second (`watch.due`) → `on_config_change`: the
//!   cell busy, it waits and asks again; the config's files as in force, nothing; else as a
//!   SIGHUP from `Config::reload` on.
//! - Recycle (`ctl recycle`): `on_request` → `begin_stop(OK, Restart)` → as a reload's switch,
//!   without a new config; the client is answered at `on_engine_ready`.

mod admit;
mod attestation;
mod gate;
mod lifecycle;
mod notify;
mod readiness;
mod reload;
mod role_io;
mod roles;
mod server;
mod setup;
mod sighup;
mod status;
mod watch;
mod wipes;

use std::os::fd::OwnedFd;
use std::time::Instant;

use nix::errno::Errno;
use nix::sys::epoll::{Epoll, EpollEvent, EpollTimeout};
use nix::sys::signal::Signal;
use nix::sys::signalfd::SignalFd;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};

use crate::config::{Config, Invoker, Role};
use crate::egress::{Forwarder, TOKEN_KIND};
use crate::exit;
use crate::sandbox::cell::Cell;

use lifecycle::{After, Phase, Step};
use notify::notify;

const TOKEN_SIGNAL: u64 = 1 << 56;

/// What every part reads: the config in force (a reload replaces it), who runs sealnode, the
/// cell, the loop and its signals, the state dir. Made once by [`Supervisor::new`].
#[derive(Debug)]
struct Base {
    cfg: Config,
    inv: Invoker,
    /// Each role's host ids, resolved once (user names looked up when the cell was made, whose
    /// user namespace maps them; a reload may not change `cell.rootful`): nothing in the loop
    /// asks the user database.
    ids: [crate::config::Ids; 2],
    cell: Cell,
    epoll: Epoll,
    sigfd: SignalFd,
    /// The state dir, opened and checked once: receipts and the counter are written through it.
    state_dir: OwnedFd,
    born: Instant,
    /// Held for the supervisor's lifetime: one `sealnode run` per state, runtime and scratch
    /// dir (crate::sandbox::locks). Base is the supervisor's last field and this its last, so
    /// the last dropped: every descriptor of the dirs it guards (the roles' scratch, the
    /// control socket) is closed before another run can take them.
    _locks: crate::sandbox::locks::Locks,
}

/// One role as the supervisor keeps it.
#[derive(Debug)]
struct Slot {
    role: Role,
    phase: Phase,
    started: Option<Instant>,
    restarts: lifecycle::Restarts,
    /// Starts of this role since sealnode started (first, restarts, reloads, recycles).
    starts: u64,
    /// The gate this role's current (or next) start passed.
    passed: Option<GatePass>,
    /// What this role's current (or next) process is started from, as the gate measured it:
    /// every receipt and statement carries it unchanged while that process lives.
    digests: Option<crate::proof::receipt::RoleDigests>,
    /// The config that start passed the gate with: a statement names this role's policies,
    /// rlimits and devices from it, never from a config switched in since (a reload's, before
    /// the role passes again: found by review).
    config: Option<Config>,
    /// What this role's current (or next) sandbox holds, layer by layer, from the plan the
    /// gate admitted (`ctl status`'s "what is sealed").
    sealed: Option<crate::proof::sealed_text::RoleSeal>,
    /// OOM kills seen in the role's cgroup leaf so far (memory.events oom_kill).
    oom_kills: u64,
    /// The role's scratch dir, opened once (no symlinks, owner checked): every wipe works on
    /// this descriptor, never on the path again (tests/run.rs:
    /// the_wipe_holds_against_swaps_deep_trees_odd_groups_and_mounts).
    scratch: OwnedFd,
}

impl Slot {
    /// The role's phase after `event`, by the lifecycle's table ([`Phase::on`]); a pair the
    /// table does not have leaves the phase as it is, and is logged (it is a bug).
    fn apply(&mut self, event: lifecycle::Event) {
        match self.phase.on(event) {
            Some(next) => self.phase = next,
            None => {
                tracing::error!(role = %self.role, phase = ?self.phase, ?event, "internal error: no such phase transition; the phase stays")
            }
        }
    }
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

/// The generation in force: its receipt, the latest preflight of each role it sums up, and
/// the node's plan as the gate admitted it while the node waits for a ready engine (its start
/// runs exactly this; a role the pass starts at once is handed its plan directly).
#[derive(Debug, Default)]
struct Current {
    receipt: Option<crate::proof::receipt::Receipt>,
    /// The config the receipt was written with: a statement describes one generation, never
    /// the receipt's with a reload's config switched in before its own receipt (found by
    /// review: the policy subjects of the new config beside the old config's digest).
    config: Option<Config>,
    report: Option<crate::proof::canary::Report>,
    node_admitted: Option<gate::Admitted>,
}

#[derive(Debug)]
pub struct Supervisor {
    fwd: Forwarder,
    roles: [Slot; 2],
    /// A stop in progress and the scratch wipes around each start.
    cycle: lifecycle::Cycle,
    gate: gate::Gate,
    current: Current,
    readiness: readiness::Readiness,
    server: server::Server,
    attest: attestation::Publisher,
    io: role_io::RoleIo,
    reload: reload::Reload,
    /// `cell.reload_on_change`: the config's directory watched.
    watch: watch::ConfigWatch,
    sd: notify::Notifier,
    /// The last field: dropped last, the cell after every part that uses it, and the dirs'
    /// locks last of all (Base's last field).
    base: Base,
}

fn status_code(ws: WaitStatus) -> Option<i32> {
    match ws {
        WaitStatus::Exited(_, c) => Some(c),
        WaitStatus::Signaled(_, s, _) => Some(128 + s as i32),
        _ => None,
    }
}

impl Supervisor {
    fn slot(&mut self, role: Role) -> &mut Slot {
        &mut self.roles[role as usize]
    }

    /// The cell's course after `event`, by its table ([`lifecycle::Cycle::apply`]); a pair
    /// the table does not have leaves the course as it is, and is logged (it is a bug).
    fn course(&mut self, event: lifecycle::CellEvent) {
        if !self.cycle.apply(event) {
            tracing::error!(cycle = ?self.cycle, ?event, "internal error: no such change of the cell's course; it stays");
        }
    }

    /// Run until stopped. Returns the exit status (docs/operator-guide.md's table: 0 after
    /// SIGTERM/SIGINT; 1, 3 to 6 or 125 after a failure).
    pub fn run(mut self) -> i32 {
        // Both scratch dirs wiped (off the loop), then both roles enter the gate
        // ([`Supervisor::wipes_done`]); the engine starts once they pass ([`Supervisor::admit`]).
        self.begin_wipes();
        let mut events = vec![EpollEvent::empty(); 64];
        loop {
            // The cell's next steps first: what the last turn's events (or the first wipes)
            // call for, before the loop waits again.
            if let Some(code) = self.advance() {
                return code;
            }
            let timeout = self.next_deadline().map(|d| d.saturating_duration_since(Instant::now()));
            let timeout = match timeout {
                Some(t) => EpollTimeout::try_from(t.as_millis().min(60_000) as u64 + 1).unwrap_or(EpollTimeout::NONE),
                None => EpollTimeout::NONE,
            };
            let n = match self.base.epoll.wait(&mut events, timeout) {
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
                let epoll = &self.base.epoll;
                match token & TOKEN_KIND {
                    TOKEN_SIGNAL => self.on_signals(),
                    readiness::TOKEN_READY => {
                        let fwd = &self.fwd;
                        let serving = || fwd.engine_serving(Instant::now(), readiness::SERVING_QUIET);
                        if self.readiness.handle(serving, &self.base.cfg, epoll) == Some(readiness::Verdict::Ready) {
                            self.on_engine_ready();
                        }
                    }
                    server::TOKEN_CONTROL => {
                        let allowed =
                            self.base.cfg.cell.control_uids.clone().unwrap_or_else(|| vec![self.base.inv.uid]);
                        self.server.accept(&allowed, epoll);
                    }
                    server::TOKEN_CLIENT => {
                        if let Some((stream, request)) = self.server.handle(token & !TOKEN_KIND, epoll) {
                            self.on_request(stream, request);
                        }
                    }
                    role_io::TOKEN_OUTPUT => self.io.on_output(token & !TOKEN_KIND, epoll),
                    role_io::TOKEN_REFUSED => self.io.on_refused((token & !TOKEN_KIND) as usize, epoll),
                    gate::TOKEN_GATE => self.gate.handle(token, epoll),
                    watch::TOKEN_WATCH => self.watch.handle(Instant::now()),
                    _ => self.fwd.handle(epoll, token, ev.events()),
                }
            }
            self.poll_gate();
            self.on_timers();
            self.io.report_dropped();
            // Lines held back while a reader of sealnode's stdout or stderr was not reading.
            crate::logging::logsink::pump();
        }
    }

    /// The cell's next steps, by its table ([`lifecycle::Cycle::next`]), taken until it waits
    /// for an event: a stop's drain and SIGTERMs (node, then engine), both scratch dirs wiped
    /// once both roles are down, and what follows the wipes. Some(code): the loop ends with it.
    fn advance(&mut self) -> Option<i32> {
        // The node's connections to the engine go through while it is ready and no stop is
        // under way, or a stop drains while the node runs; meanwhile they wait
        // (cell.engine_hold_s) and count as busy for the drain.
        let node = self.roles[Role::Node as usize].phase;
        let reachable = self.cycle.forwards(self.engine_is_ready(), node);
        // A stop does not bring the engine back for the node: nothing waits to be sent again.
        self.fwd.set_stopping(self.cycle.stop.is_some());
        self.fwd.set_engine_ready(&self.base.epoll, reachable);
        loop {
            let (engine, node) = (self.roles[Role::Engine as usize].phase, self.roles[Role::Node as usize].phase);
            let now = Instant::now();
            let open = self.fwd.engine_active() + self.fwd.engine_waiting();
            let engine_busy = lifecycle::engine_busy(open, self.fwd.engine_closed_at(), now);
            match self.cycle.next(engine, node, engine_busy, now) {
                Step::Wait => return None,
                Step::Term(role) => self.terminate(role),
                Step::Wipe => self.begin_wipes(),
                Step::WipesDone(next) => {
                    if let Some(code) = self.wipes_done(next) {
                        return Some(code);
                    }
                }
            }
        }
    }

    /// What is under way besides the roles running: a SIGHUP and a recycle are refused while
    /// any of it is ([`lifecycle::UnderWay::busy`]).
    fn under_way(&self) -> lifecycle::UnderWay {
        lifecycle::UnderWay {
            stop: self.cycle.stop.is_some(),
            wipes: self.cycle.wipes.busy(),
            gate: self.gate.busy(),
            recycle: self.server.recycle_waiting(),
        }
    }

    /// A control client's request (its peer checked, its line parsed: control.rs).
    fn on_request(&mut self, mut stream: std::os::unix::net::UnixStream, request: crate::control::Request) {
        match request {
            crate::control::Request::Status => {
                let v = self.status();
                crate::control::respond(&mut stream, &v);
            }
            crate::control::Request::Attest { nonce } => {
                let facts = facts(&self.base, &self.current, &self.roles);
                if let Err(code) = self.attest.request(stream, nonce, &facts) {
                    self.begin_stop(code, After::Exit);
                }
            }
            crate::control::Request::Recycle => {
                if let Some(what) = self.under_way().busy() {
                    crate::control::respond(
                        &mut stream,
                        &crate::control::protocol::Refusal::new(format!("busy: {what} is in progress; try again")),
                    );
                } else {
                    tracing::info!("control: recycle requested");
                    self.server.await_recycle(stream);
                    self.begin_stop(exit::OK, After::Restart);
                }
            }
        }
    }

    fn generation(&self) -> u64 {
        self.current.receipt.as_ref().map_or(0, |r| r.generation)
    }

    fn next_deadline(&self) -> Option<Instant> {
        let roles = self.roles.iter().filter_map(|s| match s.phase {
            Phase::Stopping(_, at) | Phase::Waiting(at) => Some(at),
            _ => None,
        });
        roles
            .chain(self.readiness.next_deadline())
            .chain(self.sd.next_deadline())
            .chain(self.fwd.next_sweep())
            .chain(self.server.next_deadline())
            .chain(self.fwd.next_lookup_deadline())
            .chain(self.fwd.next_hold_deadline())
            .chain(self.cycle.drain_deadline(self.fwd.engine_closed_at(), Instant::now()))
            .chain(self.attest.next_deadline())
            .chain(self.cycle.wipes.next_deadline())
            .chain(self.gate.next_deadline())
            .chain(self.watch.next_deadline())
            .chain(self.io.next_deadline())
            .min()
    }

    /// Every part's timers, when due.
    fn on_timers(&mut self) {
        let now = Instant::now();
        self.wipes_timer(now);
        self.server.expire(now, &self.base.epoll);
        let facts = facts(&self.base, &self.current, &self.roles);
        let swept = self.attest.sweep(now, &facts, self.cycle.stop.is_some());
        if let Err(code) = swept {
            self.begin_stop(code, After::Exit);
        }
        self.roles_timer(now);
        let fwd = &self.fwd;
        let serving = || fwd.engine_serving(now, readiness::SERVING_QUIET);
        if self.readiness.sweep(now, serving, &self.base.cfg, &self.base.cell, &self.base.epoll)
            == Some(readiness::Verdict::TimedOut)
        {
            self.begin_stop(exit::NOT_READY, After::Exit);
        }
        self.sd.sweep(now);
        self.fwd.sweep(&self.base.epoll);
        self.fwd.expire_lookups(&self.base.epoll);
        self.fwd.hold_timers(&self.base.epoll);
        if self.watch.due(now) {
            self.on_config_change(now);
        }
        self.io.resume(now, &self.base.epoll);
    }

    fn on_signals(&mut self) {
        while let Ok(Some(info)) = self.base.sigfd.read_signal() {
            match Signal::try_from(info.ssi_signo as i32) {
                Ok(Signal::SIGCHLD) => self.reap(),
                Ok(Signal::SIGTERM) | Ok(Signal::SIGINT) | Ok(Signal::SIGQUIT) => {
                    tracing::info!(signal = info.ssi_signo, "stopping the cell");
                    self.begin_stop(exit::OK, After::Exit);
                }
                Ok(Signal::SIGHUP) => self.on_sighup(),
                _ => {}
            }
        }
    }

    /// Every child that exited, to the part that owns it: a wipe, the gate's measurement or
    /// probes, a live limit write, the TPM's tools, the cell's init, a role.
    fn reap(&mut self) {
        loop {
            let ws = match waitpid(None, Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(ws) => ws,
            };
            let (Some(pid), Some(code)) = (ws.pid(), status_code(ws)) else { continue };
            if self.wipe_exited(pid, ws) || self.gate.exited(pid, code) {
                continue;
            }
            if self.base.cell.cgroups.as_mut().is_some_and(|t| t.writer_exited(pid, ws)) {
                continue;
            }
            let generation = self.generation();
            if let Some(r) = self.attest.exited(pid, code, &self.base.cfg, generation) {
                if let Err(code) = r {
                    self.begin_stop(code, After::Exit);
                }
                continue;
            }
            if pid == self.base.cell.pid {
                tracing::error!(code, "the cell init died; stopping");
                self.begin_stop(exit::FAILED, After::Exit);
                continue;
            }
            self.role_process_exited(pid, code);
        }
    }
}

/// What a statement is made of now (a function of the fields it reads, so that the
/// publisher can be borrowed beside it).
fn facts<'a>(base: &'a Base, current: &'a Current, roles: &'a [Slot]) -> attestation::Facts<'a> {
    let cfg = current.config.as_ref().unwrap_or(&base.cfg);
    attestation::Facts {
        cfg,
        role_cfgs: [0, 1].map(|i| roles[i].config.as_ref().unwrap_or(cfg)),
        inv: &base.inv,
        receipt: current.receipt.as_ref(),
        report: current.report.as_ref(),
        restarts: roles.iter().map(|s| (s.role.name().to_string(), s.restarts.count)).collect(),
    }
}

/// What a pass through the gate needs, for `cfg` (the config in force, or a reload's
/// candidate): this cell, its state dir, each role's locked scratch, and whether statements are
/// signed (the engine's model files are then hashed for them).
fn gate_ctx<'a>(cfg: &'a Config, base: &'a Base, signing: bool, roles: &'a [Slot; 2]) -> gate::Ctx<'a> {
    gate::Ctx {
        cfg,
        inv: &base.inv,
        cell: &base.cell,
        state: &base.state_dir,
        epoll: &base.epoll,
        hash_models: signing,
        scratch: [&roles[0].scratch, &roles[1].scratch],
    }
}

#[cfg(test)]
mod tests {
    /// Each owner's token has a top byte of its own: the loop dispatches on it.
    #[test]
    fn tokens_are_distinct() {
        let tokens = [
            super::TOKEN_SIGNAL,
            crate::egress::TOKEN_LISTENER,
            crate::egress::TOKEN_CONN,
            crate::egress::TOKEN_LOOKUP,
            super::readiness::TOKEN_READY,
            super::server::TOKEN_CONTROL,
            super::server::TOKEN_CLIENT,
            super::role_io::TOKEN_OUTPUT,
            super::role_io::TOKEN_REFUSED,
            super::gate::TOKEN_GATE,
            super::watch::TOKEN_WATCH,
        ];
        let kinds: std::collections::BTreeSet<u64> = tokens.iter().map(|t| t & crate::egress::TOKEN_KIND).collect();
        assert_eq!(kinds.len(), tokens.len(), "{tokens:x?}");
        assert!(tokens.iter().all(|t| t & !crate::egress::TOKEN_KIND == 0 && *t != 0));
    }
}
