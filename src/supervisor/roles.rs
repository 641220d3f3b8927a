//! The roles' processes: start one from the plan the gate admitted, act on its exit by the
//! lifecycle's rules (supervisor::lifecycle: restart after a backoff, give up, stop), stop both in
//! reverse order (SIGTERM, then SIGKILL after the grace period), and start the node once the
//! engine is ready.

use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use sd_notify::NotifyState;

use super::lifecycle::{self, After, CellEvent, Decision, Event, Phase, Stop};
use super::role_io::output_pipes;
use super::{gate, notify, Supervisor};
use crate::config::{Restart, Role};
use crate::sandbox;

impl Supervisor {
    /// The engine runs and answered its readiness check.
    pub(super) fn engine_is_ready(&self) -> bool {
        !self.readiness.pending() && matches!(self.roles[Role::Engine as usize].phase, Phase::Running(_))
    }

    /// Start a role from the plan the gate admitted for it (only the gate makes an
    /// [`gate::Admitted`]). A failure stops the cell, with lifecycle::start_failed's exit
    /// status (125 before any role has run, else 1).
    pub(super) fn start(&mut self, admitted: gate::Admitted) {
        let role = admitted.plan().role;
        let errno = admitted.plan().refusal_log;
        // The generation whose pass admitted this plan (the node's may be older than the
        // engine's latest: it passed beside an engine that has since restarted).
        let generation = admitted.digests.generation;
        let mut plan = admitted.into_plan();
        let mut pipes = None;
        let started = match output_pipes() {
            Ok((stdio, out, err)) => {
                plan.stdio = Some(stdio);
                pipes = Some((out, err));
                sandbox::spawn_in(&plan, Some(&self.base.cell))
            }
            Err(e) => Err(e),
        };
        // The plan (and with it the pipes' write ends) is dropped once spawned.
        drop(plan);
        match started {
            Ok(sb) => {
                let epoll = &self.base.epoll;
                tracing::info!(role = %role, pid = sb.pid.as_raw(), generation, "role started");
                if let Some((out, err)) = pipes {
                    self.io.capture(role, sb.pid.as_raw(), generation, false, out, epoll);
                    self.io.capture(role, sb.pid.as_raw(), generation, true, err, epoll);
                }
                self.io.watch_refusals(role, sb.listener, errno, epoll);
                let s = self.slot(role);
                s.apply(Event::Started(sb.pid));
                s.started = Some(Instant::now());
                s.starts += 1;
                notify(&[NotifyState::Status(&format!("{role} started"))]);
                if role == Role::Engine {
                    self.readiness.begin(&self.base.cfg);
                }
            }
            Err(e) => {
                tracing::error!(role = %role, error = %e, "role failed to start");
                crate::logging::log::say(&format!("{e}"));
                let any_started = self.roles.iter().any(|s| s.starts > 0);
                self.begin_stop(lifecycle::start_failed(any_started), After::Exit);
            }
        }
    }

    /// A child that is none of the loop's own helpers exited: a role stopping, or a role
    /// running.
    pub(super) fn role_process_exited(&mut self, pid: Pid, code: i32) {
        for i in 0..2 {
            let role = self.roles[i].role;
            match self.roles[i].phase {
                Phase::Stopping(p, _) if p == pid => {
                    tracing::info!(role = %role, pid = pid.as_raw(), code, "role stopped");
                    self.roles[i].apply(Event::Reaped);
                }
                Phase::Running(p) if p == pid => self.role_exited(role, pid, code),
                _ => {}
            }
        }
    }

    /// A running role exited: its OOM kill said, then the lifecycle's decision applied.
    fn role_exited(&mut self, role: Role, pid: Pid, code: i32) {
        // The kernel's OOM killer killed the role's whole leaf (memory.oom.group): say so, with
        // the limit, before the restart policy applies as to any other exit.
        let oom =
            self.base.cell.cgroups.as_ref().map(|t| (t.oom_kills(role), t.limits(role).and_then(|l| l.memory_max_mb)));
        if let Some((kills, max)) = oom {
            let seen = std::mem::replace(&mut self.slot(role).oom_kills, kills);
            if kills > seen {
                tracing::error!(role = %role, pid = pid.as_raw(), code, memory_max_mb = max, oom_kills = kills, "role OOM-killed: it reached its memory limit");
            }
        }
        // The engine gone while the node's own restart is under way (a stop that does not stop
        // it): an exit like any other, its restart policy and limit applied and counted.
        let during_node_restart = role == Role::Engine && self.cycle.stop.is_some_and(|s| !s.stops(Role::Engine));
        let policy = self.base.cfg.role(role).restart;
        let limit = self.base.cfg.role(role).restart_limit;
        let now = Instant::now();
        let stopping = self.cycle.stop.is_some() && !during_node_restart;
        let s = self.slot(role);
        let ran = s.started.map(|t| now.duration_since(t));
        let mut decision = s.restarts.on_exit(lifecycle::Exited { code, ran, stopping, now }, policy, limit);
        if during_node_restart && matches!(decision, Decision::Restart(_)) {
            // Its restart is the stop's: both roles restart (the node would come back beside
            // an engine that is down), both scratch dirs wiped (lifecycle::Cycle::to_wipe).
            let restarts = s.restarts.count;
            tracing::warn!(
                pid = pid.as_raw(),
                code,
                restarts,
                "the engine exited during the node's restart: both roles restart"
            );
            self.course(CellEvent::StopAsked(Stop { code: crate::exit::OK, after: After::Restart }));
            decision = Decision::StayDown;
        }
        self.slot(role).apply(Event::Exited(decision, now));
        let s = self.slot(role);
        match decision {
            Decision::Restart(delay) => {
                let restarts = s.restarts.count;
                tracing::warn!(role = %role, pid = pid.as_raw(), code, restart_in_ms = delay.as_millis() as u64, restarts, "role exited; restarting");
                notify(&[NotifyState::Status(&format!("{role} exited with {code}; restarting"))]);
                if role == Role::Engine {
                    self.readiness.cancel(&self.base.epoll);
                }
            }
            Decision::GiveUp => {
                tracing::error!(role = %role, pid = pid.as_raw(), code, burst = limit.burst, interval_s = limit.interval_s, "role exited; restart limit reached, stopping the cell");
                crate::logging::log::say(&format!(
                    "{role} exited with status {code}; it was restarted {} times within {} s already (restart_limit.burst); stopping the cell",
                    limit.burst, limit.interval_s
                ));
            }
            Decision::Stop => {
                let policy = match policy {
                    Restart::No => "no",
                    Restart::OnFailure => "on-failure",
                    Restart::Always => "always",
                };
                tracing::error!(role = %role, pid = pid.as_raw(), code, "role exited; stopping the cell (restart = \"{policy}\")");
                crate::logging::log::say(&format!("{role} exited with status {code}; stopping the cell"));
            }
            Decision::StayDown => {}
        }
        if let Some(code) = decision.stop_code() {
            self.begin_stop(code, After::Exit);
        }
    }

    /// Stop both roles (node first: the loop's [`Supervisor::advance`] sends the SIGTERMs),
    /// or the node alone (`After::RestartNode`), for `after`; a stop already under way keeps
    /// the stricter outcome (lifecycle::Stop::merge). Whatever was about to start of what it
    /// stops does not: the readiness check, a pass through the gate (its processes killed), a
    /// reload's dry run, restarts waiting out their backoff, a node admitted and waiting for
    /// the engine.
    pub(super) fn begin_stop(&mut self, code: i32, after: After) {
        self.course(CellEvent::StopAsked(Stop { code, after }));
        // A clean stop lets the node's requests in flight to the engine finish first (the
        // cell's table waits for them: lifecycle::Cycle::next), up to cell.drain_timeout_s.
        let drain = Duration::from_secs(self.base.cfg.cell.drain_timeout_s);
        let in_flight = self.fwd.engine_active() + self.fwd.engine_waiting();
        let node_runs = matches!(self.roles[Role::Node as usize].phase, Phase::Running(_));
        let clean = self.cycle.stop.is_some_and(|s| s.code == crate::exit::OK);
        if clean && !drain.is_zero() && node_runs && self.cycle.drain.is_none() {
            if in_flight > 0 {
                tracing::info!(
                    in_flight,
                    drain_timeout_s = drain.as_secs(),
                    "draining: the node's requests to the engine finish before it is stopped"
                );
            }
            self.course(CellEvent::Drain(Instant::now() + drain));
        }
        if after == After::Exit {
            notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
            // A recycle in progress will not complete: say so rather than hang up.
            self.server.recycle_done(&crate::control::protocol::Refusal::new(
                "sealnode is stopping; the recycle did not complete",
            ));
        }
        let stop = self.cycle.stop.unwrap_or(Stop { code, after });
        if stop.stops(Role::Engine) {
            self.readiness.cancel(&self.base.epoll);
        }
        if self.gate.busy() {
            tracing::info!("preflight abandoned: a stop was requested (the gate's measurement and probes are killed)");
            self.gate.abandon(&self.base.epoll);
        }
        self.reload.abandon();
        for s in self.roles.iter_mut().filter(|s| stop.stops(s.role)) {
            s.apply(Event::StopAsked);
        }
        self.current.node_admitted = None;
        self.arm_wipe_deadline();
    }

    /// A stop's SIGTERM to a running role (the cell's table orders them: lifecycle::Cycle::next);
    /// SIGKILL follows once the grace period is over ([`Supervisor::roles_timer`]).
    pub(super) fn terminate(&mut self, role: Role) {
        let grace = Duration::from_secs(self.base.cfg.cell.stop_timeout_s);
        if role == Role::Node && self.cycle.drain.is_some() {
            match self.fwd.engine_active() + self.fwd.engine_waiting() {
                0 => tracing::debug!("drained: no request to the engine in flight"),
                n => tracing::warn!(
                    in_flight = n,
                    drain_timeout_s = self.base.cfg.cell.drain_timeout_s,
                    "drain timed out: the node's requests to the engine in flight are cut"
                ),
            }
        }
        let s = self.slot(role);
        if let Phase::Running(pid) = s.phase {
            tracing::info!(role = %role, pid = pid.as_raw(), "stopping role (SIGTERM)");
            let _ = kill(pid, Signal::SIGTERM);
            s.apply(Event::TermSent(Instant::now() + grace));
        }
    }

    /// The roles' timers: SIGKILL after the grace period; a restart whose backoff is over
    /// enters the gate when it may (lifecycle::may_restart).
    pub(super) fn roles_timer(&mut self, now: Instant) {
        for i in 0..2 {
            match self.roles[i].phase {
                Phase::Stopping(pid, at) if at <= now => {
                    tracing::warn!(role = %self.roles[i].role, pid = pid.as_raw(), "grace period over; SIGKILL");
                    let _ = kill(pid, Signal::SIGKILL);
                    // Reaped when it dies; looked at again in an hour if it somehow does not.
                    self.roles[i].apply(Event::KillSent(now + Duration::from_secs(3600)));
                }
                Phase::Waiting(at) if at <= now => {
                    let role = self.roles[i].role;
                    // Either passes the gate first: its program measured, its preflight, a
                    // new receipt; then it starts.
                    if lifecycle::may_restart(role == Role::Engine, self.engine_is_ready(), self.gate.busy()) {
                        self.roles[i].apply(Event::Due);
                        if let Err(code) = self.enter_gate(&[role]) {
                            self.begin_stop(code, After::Exit);
                        }
                    } else {
                        self.roles[i].apply(Event::RetryAt(now + super::readiness::READY_INTERVAL));
                    }
                }
                _ => {}
            }
        }
    }

    /// The engine answered its readiness check: start the node (if down), tell systemd, end a
    /// reload or answer a recycle.
    pub(super) fn on_engine_ready(&mut self) {
        if self.cycle.stop.is_some() {
            return;
        }
        if self.roles[Role::Node as usize].phase == Phase::Admitted {
            match self.current.node_admitted.take() {
                Some(a) => self.start(a),
                None => self.nothing_admitted(Role::Node),
            }
            if self.cycle.stop.is_some() {
                return;
            }
        }
        self.roles_up();
    }

    /// The engine is ready and the node runs (again): tell systemd, end a reload, answer a
    /// recycle.
    pub(super) fn roles_up(&mut self) {
        // Both: an in-place reload while the engine restarts after a crash completes once it
        // answers (on_engine_ready), not before (found by review).
        if matches!(self.roles[Role::Node as usize].phase, Phase::Running(_)) && self.engine_is_ready() {
            self.sd.roles_up(self.reload.in_progress());
            if self.reload.finish() {
                tracing::info!(generation = self.current.receipt.as_ref().map(|r| r.generation), "reload complete");
            }
        }
        let generation = self.current.receipt.as_ref().map(|r| r.generation);
        if self.server.recycle_waiting() {
            tracing::info!(generation, "recycle complete");
        }
        self.server.recycle_done(&crate::control::protocol::Recycled::new(generation));
    }
}
