//! Each role's lifecycle as data: its phase and its state × event table, its restart record;
//! the cell's course between runs of the roles (a stop, the scratch wipes in flight), its
//! state × event table and its table of next steps; and the rules the loop applies when a
//! role exits, a stop is asked for, or a SIGHUP or recycle meets a cell that is busy.
//! Everything here is pure (time is an argument, no process is touched): the tables in
//! tests.rs are the rules, as s6-supervise keeps its state × event table apart from the loop
//! that dispatches into it.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use nix::unistd::Pid;

use crate::config::{Restart, RestartLimit, Role};
use crate::control::protocol::RoleState;
use crate::exit;

/// Restart backoff bounds; a role that ran this long resets its backoff.
pub(super) const BACKOFF_MIN: Duration = Duration::from_millis(500);
pub(super) const BACKOFF_MAX: Duration = Duration::from_secs(60);
pub(super) const STABLE_AFTER: Duration = Duration::from_secs(60);

/// Where a role is. Each phase names what the loop waits for next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    /// Nothing of the role runs and nothing is under way for it: before its first start,
    /// after a refusal, an exit that is not restarted, a stop or its wipe.
    Down,
    /// Passing the gate: measured and preflighted.
    Starting,
    /// Admitted by the gate, its plan kept: it starts next (the node once the engine is
    /// ready: `Current::node_admitted`).
    Admitted,
    Running(Pid),
    /// SIGTERM sent; SIGKILL at this time.
    Stopping(Pid, Instant),
    /// Restart scheduled at this time.
    Waiting(Instant),
    /// Its scratch being emptied by this child, off the loop (cell::Cell::spawn_wipe).
    Wiping(Pid),
}

impl Phase {
    /// The name `ctl status` shows, and the process it waits on (docs/control.md).
    pub(super) fn shown(self) -> (RoleState, Option<Pid>) {
        match self {
            Phase::Down => (RoleState::Down, None),
            Phase::Starting | Phase::Admitted => (RoleState::Starting, None),
            Phase::Running(p) => (RoleState::Running, Some(p)),
            Phase::Stopping(p, _) => (RoleState::Stopping, Some(p)),
            Phase::Waiting(_) => (RoleState::Restarting, None),
            Phase::Wiping(p) => (RoleState::Wiping, Some(p)),
        }
    }

    /// The phase after `event`: the role's state × event table (`the_phase_table` below lists
    /// every pair it has). `None`: the pair is not in the table, and the phase stays.
    pub(super) fn on(self, event: Event) -> Option<Phase> {
        use Event as E;
        use Phase as P;
        Some(match (self, event) {
            // A pass through the gate begins (the first start, a restart whose backoff is
            // over); it ends refused (down), admitted (started next: the node once the
            // engine is ready), or, for a node whose engine is not ready, waiting again.
            (P::Down, E::EnterGate) => P::Starting,
            (P::Starting, E::Refused) => P::Down,
            (P::Starting, E::Admitted) => P::Admitted,
            (P::Starting | P::Waiting(_), E::RetryAt(at)) => P::Waiting(at),
            (P::Waiting(_), E::Due) => P::Down,
            (P::Admitted, E::Started(pid)) => P::Running(pid),
            // Its exit, by the lifecycle's decision (Restarts::on_exit).
            (P::Running(_), E::Exited(Decision::Restart(delay), now)) => P::Waiting(now + delay),
            (P::Running(_), E::Exited(_, _)) => P::Down,
            // A stop: what was about to start does not; a running role gets SIGTERM, then
            // SIGKILL once the grace period is over; reaped, it is down.
            (P::Waiting(_) | P::Starting | P::Admitted, E::StopAsked) => P::Down,
            (p, E::StopAsked) => p,
            (P::Running(pid), E::TermSent(kill_at)) => P::Stopping(pid, kill_at),
            (P::Stopping(pid, _), E::KillSent(next)) => P::Stopping(pid, next),
            (P::Stopping(..), E::Reaped) => P::Down,
            // Its scratch emptied by a child of its own, before a start or after a stop.
            (P::Down, E::WipeStarted(pid)) => P::Wiping(pid),
            (P::Wiping(_), E::WipeDone) => P::Down,
            _ => return None,
        })
    }
}

/// What happens to a role, as its phase sees it ([`Phase::on`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Event {
    /// Its pass through the gate began.
    EnterGate,
    /// The gate refused it.
    Refused,
    /// The gate admitted it: it starts next (the node once the engine is ready).
    Admitted,
    /// It may not enter the gate yet (the node beside an engine not ready): try at this time.
    RetryAt(Instant),
    /// Its backoff is over: it enters the gate.
    Due,
    /// Its sandbox runs, this its init.
    Started(Pid),
    /// It exited; the lifecycle decided this (at this time).
    Exited(Decision, Instant),
    /// A stop was asked for.
    StopAsked,
    /// SIGTERM sent: SIGKILL at this time.
    TermSent(Instant),
    /// SIGKILL sent: look again at this time.
    KillSent(Instant),
    /// Its stopping process was reaped.
    Reaped,
    /// Its scratch wipe runs in this child.
    WipeStarted(Pid),
    /// Its scratch wipe ended (done or failed).
    WipeDone,
}

/// What follows a stop once both roles are down and their scratch is wiped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum After {
    /// sealnode exits.
    Exit,
    /// Both roles start again through the gate: a reload (with its new config) or a recycle
    /// (whose client the control server answers once the engine is ready).
    Restart,
    /// The node alone stops, its scratch is wiped and it starts again through the gate, the
    /// engine running on: a reload whose changes are the node's (reload::scope). Should the
    /// engine exit meanwhile, the stop becomes a [`After::Restart`] of both.
    RestartNode,
}

/// A stop in progress: the exit status it ends with, and what follows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Stop {
    pub code: i32,
    pub after: After,
}

impl Stop {
    /// A second stop asked for while this one runs (a failure during a restart, a second
    /// signal): the stricter of the two. An exit wins over a restart, a restart of both over
    /// the node's alone, and the exit status is
    /// the larger: a failure's over a clean stop's
    /// 0, and between failures the exit table's later row (125 config > 6 preflight error >
    /// 5 restart limit > 4 not ready > 3 escape > 1).
    pub(super) fn merge(self, code: i32, after: After) -> Stop {
        let after = match (self.after, after) {
            (After::Exit, _) | (_, After::Exit) => After::Exit,
            (After::Restart, _) | (_, After::Restart) => After::Restart,
            (After::RestartNode, After::RestartNode) => After::RestartNode,
        };
        Stop { code: self.code.max(code), after }
    }

    /// Whether this stop stops `role` (all but a [`After::RestartNode`] stop both).
    pub(super) fn stops(self, role: Role) -> bool {
        self.after != After::RestartNode || role == Role::Node
    }
}

/// A role's restarts: how many, the backoff the next one waits, and those within the
/// restart limit's interval.
#[derive(Debug)]
pub(super) struct Restarts {
    pub count: u32,
    backoff: Duration,
    recent: VecDeque<Instant>,
}

impl Default for Restarts {
    fn default() -> Self {
        Restarts { count: 0, backoff: BACKOFF_MIN, recent: VecDeque::new() }
    }
}

/// A role's process exited: what the loop knows of it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Exited {
    /// Its exit status (128 + the signal for a killed one).
    pub code: i32,
    /// How long it ran (None: its start time is unknown).
    pub ran: Option<Duration>,
    /// A stop is under way (nothing restarts then).
    pub stopping: bool,
    pub now: Instant,
}

/// What follows a role's exit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Decision {
    /// Start it again (through the gate) after this backoff.
    Restart(Duration),
    /// Its restart limit is reached (`restart_limit.burst` within `interval_s`): stop the cell,
    /// exit 5.
    GiveUp,
    /// Its restart policy does not restart this exit: stop the cell, exit 1.
    Stop,
    /// A stop is under way: the role stays down.
    StayDown,
}

impl Decision {
    /// The exit status of the stop this decision begins, if any.
    pub(super) fn stop_code(self) -> Option<i32> {
        match self {
            Decision::GiveUp => Some(exit::RESTART_LIMIT),
            Decision::Stop => Some(exit::FAILED),
            Decision::Restart(_) | Decision::StayDown => None,
        }
    }
}

impl Restarts {
    /// The role exited: decide, and record a restart. A run of STABLE_AFTER or longer resets
    /// the backoff; restarts older than the limit's interval no longer count toward its burst.
    pub(super) fn on_exit(&mut self, e: Exited, policy: Restart, limit: RestartLimit) -> Decision {
        let restart = !e.stopping && (policy == Restart::Always || (policy == Restart::OnFailure && e.code != 0));
        if e.ran.is_some_and(|d| d >= STABLE_AFTER) {
            self.backoff = BACKOFF_MIN;
        }
        let interval = Duration::from_secs(limit.interval_s);
        while self.recent.front().is_some_and(|t| e.now.duration_since(*t) > interval) {
            self.recent.pop_front();
        }
        match (restart, e.stopping) {
            (true, _) if self.recent.len() >= limit.burst as usize => Decision::GiveUp,
            (true, _) => {
                self.recent.push_back(e.now);
                let delay = self.backoff;
                self.backoff = (self.backoff * 2).min(BACKOFF_MAX);
                self.count += 1;
                Decision::Restart(delay)
            }
            (false, true) => Decision::StayDown,
            (false, false) => Decision::Stop,
        }
    }
}

// The node runs only beside a ready engine: three rules say it, for a role whose backoff is
// over (may_restart), for a pass the gate admitted (admission), and for the node admitted
// beside the engine, which starts when the engine answers (Phase::Admitted, Supervisor::
// on_engine_ready).

/// A role waiting out its backoff may enter the gate now: the engine at once, the node only
/// beside a ready engine; and one pass through the gate at a time.
pub(super) fn may_restart(is_engine: bool, engine_ready: bool, gate_busy: bool) -> bool {
    (is_engine || engine_ready) && !gate_busy
}

/// What a pass the gate admitted starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Admission {
    /// Start this role now; the node, when the pass admitted it too, waits (Phase::Admitted)
    /// for the engine to answer its readiness check.
    Start(Role),
    /// The node's own pass, but the engine went down while it ran: the node waits and passes
    /// the gate again; no receipt says otherwise.
    Retry,
}

/// The pass admitted the engine (alone or with the node) or the node alone; the engine is
/// ready now or not.
pub(super) fn admission(engine_passed: bool, engine_ready: bool) -> Admission {
    match (engine_passed, engine_ready) {
        (true, _) => Admission::Start(Role::Engine),
        (false, true) => Admission::Start(Role::Node),
        (false, false) => Admission::Retry,
    }
}

/// The exit status of a stop for a role that could not be started (its sandbox not made,
/// after the gate admitted it): 125 while no role has started since sealnode did (what the
/// config names does not start: systemd's unit does not restart it, RestartPreventExitStatus),
/// else 1 (it ran before: a restart of the unit may well succeed).
pub(super) fn start_failed(any_started: bool) -> i32 {
    if any_started {
        exit::FAILED
    } else {
        exit::CONFIG
    }
}

/// The cell's course between runs of the roles: a stop in progress and what follows it, and
/// the scratch wipes in flight (before the first start, after every stop).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Cycle {
    pub stop: Option<Stop>,
    /// A clean stop lets the node's requests in flight to the engine finish before the node
    /// is stopped, until this time (`cell.drain_timeout_s`).
    pub drain: Option<Instant>,
    pub wipes: Wipes,
}

/// What follows once both wipes are done.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum AfterWipes {
    /// A stop to exit ends the loop with its code (a wipe that failed is only reported: the
    /// next start wipes again).
    Exit(i32),
    /// Both roles pass the gate: a first start, or (`reprovision`) a restart, recycle or
    /// reload whose stop is over.
    Gate { reprovision: bool },
    /// A wipe failed before a start: no role starts on what an earlier run left; the cell
    /// ends with `code` (125), after the re-provision's own steps when a stop was in progress.
    Refuse { reprovision: bool, code: i32 },
}

impl AfterWipes {
    /// A stop other than one to exit is over: its re-provision follows (the forwarding
    /// drained, a reload's config switched).
    pub(super) fn reprovision(self) -> bool {
        matches!(self, AfterWipes::Gate { reprovision: true } | AfterWipes::Refuse { reprovision: true, .. })
    }
}

/// What happens to the cell's course: every change of a [`Cycle`] is one of these, applied by
/// [`Cycle::apply`] (the cell's state × event table, as [`Phase::on`] is each role's).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum CellEvent {
    /// A stop was asked for: the stricter of it and a stop under way ([`Stop::merge`]). A
    /// failure's stop (exit status not 0) does not wait for a drain.
    StopAsked(Stop),
    /// A clean stop drains the node's requests to the engine until this time (once).
    Drain(Instant),
    /// The stop is over: the loop exits, or both roles are re-provisioned.
    StopOver,
    /// The wipes of the roles [`Cycle::to_wipe`] names began (each in a child of its own, or
    /// failed to start); again, while wipes run, for a role the stop came to stop after they
    /// began.
    WipesBegun,
    /// A role's wipe failed (it could not start, or it ended with an error).
    WipeFailed(Role, crate::sandbox::cell::WipeFailed),
    /// Both wipes are done and what follows them is taken.
    WipesOver,
    /// A stop to exit gives the wipes in flight its grace period, until this time (once).
    Grace(Instant),
    /// The wipes' grace period is over (they are killed; the next start wipes again).
    GraceOver,
}

/// After the node's last connection to the engine closed, a drain still gives it this long to
/// pass the answer on (to the gateway) before it is stopped.
pub(super) const DRAIN_SETTLE: Duration = Duration::from_secs(1);

/// The node is still busy with the engine, for a drain: a connection open (forwarded or
/// waiting for the engine), or the last one closed less than [`DRAIN_SETTLE`] ago.
pub(super) fn engine_busy(open: usize, last_closed: Option<Instant>, now: Instant) -> bool {
    open > 0 || last_closed.is_some_and(|t| now < t + DRAIN_SETTLE)
}

/// The cell's next step, as [`Cycle::next`] decides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Step {
    /// Nothing until the next event.
    Wait,
    /// SIGTERM to this role (a stop: the node first, the engine once the node is down).
    Term(Role),
    /// The roles a stop stops are down: empty their scratch dirs ([`Cycle::stopped`]).
    Wipe,
    /// Both wipes are done: this follows.
    WipesDone(AfterWipes),
}

impl Cycle {
    /// The cell's course after `event`: its state × event table (`the_cells_course_table`
    /// lists every pair it has). False: the pair is not in the table (the wipes begun twice,
    /// a wipe's end without wipes, a stop's end without a stop), and the course stays.
    pub(super) fn apply(&mut self, event: CellEvent) -> bool {
        let in_table = match event {
            CellEvent::WipesBegun => !self.wipes.running || !self.to_wipe().is_empty(),
            CellEvent::WipeFailed(..) | CellEvent::WipesOver => self.wipes.running,
            CellEvent::StopOver => self.stop.is_some(),
            CellEvent::GraceOver => self.wipes.deadline.is_some(),
            CellEvent::Drain(_) => self.stop.is_some_and(|s| s.code == exit::OK),
            CellEvent::StopAsked(_) | CellEvent::Grace(_) => true,
        };
        if !in_table {
            return false;
        }
        match event {
            CellEvent::StopAsked(s) => {
                let stop = match self.stop {
                    Some(now) => now.merge(s.code, s.after),
                    None => s,
                };
                if stop.code != exit::OK {
                    self.drain = None;
                }
                self.stop = Some(stop);
            }
            CellEvent::Drain(until) => {
                self.drain.get_or_insert(until);
            }
            CellEvent::StopOver => {
                self.stop = None;
                self.drain = None;
            }
            CellEvent::WipesBegun => {
                if !self.wipes.running {
                    self.wipes = Wipes { running: true, ..Wipes::default() };
                }
                for r in self.to_wipe() {
                    self.wipes.of[r as usize] = true;
                }
            }
            CellEvent::WipeFailed(role, why) => self.wipes.failed.push((role, why)),
            CellEvent::WipesOver => self.wipes = Wipes::default(),
            // Only a stop to exit bounds the wipes (a re-provision waits for them: it may not
            // start on what they did not remove), and only once.
            CellEvent::Grace(at) => {
                let exiting = matches!(self.stop, Some(Stop { after: After::Exit, .. }));
                if exiting && self.wipes.running && self.wipes.deadline.is_none() {
                    self.wipes.deadline = Some(at);
                }
            }
            CellEvent::GraceOver => self.wipes.deadline = None,
        }
        true
    }

    /// The cell's own table, beside each role's ([`Phase::on`]): from the cell's state (the
    /// stop under way, the wipes in flight, both roles' phases), the step the loop takes next.
    /// The loop takes these steps before every wait for events until this says `Wait`.
    /// `engine_busy`: the node has requests in flight to the engine; `now`: the time, for the
    /// drain's deadline.
    pub(super) fn next(&self, engine: Phase, node: Phase, engine_busy: bool, now: Instant) -> Step {
        if self.wipes.running {
            // A role the stop came to stop after its wipes began (a SIGTERM, or the engine
            // exiting, during the node's own restart): stopped as any stop stops it, then wiped
            // too, before anything starts or the loop ends (found by review: a SIGTERM during
            // the node's wipe left the engine running, unsignalled, and its scratch wiped under it).
            let phase = |r: Role| if r == Role::Engine { engine } else { node };
            let more = self.to_wipe();
            if let Some(r) = more.iter().find(|r| matches!(phase(**r), Phase::Running(_))) {
                return Step::Term(*r);
            }
            let wiping = [engine, node].iter().any(|p| matches!(p, Phase::Wiping(_) | Phase::Stopping(..)));
            return if wiping {
                Step::Wait
            } else if !more.is_empty() {
                Step::Wipe
            } else {
                Step::WipesDone(self.after_wipes(!self.wipes.failed.is_empty()))
            };
        }
        if self.stop.is_none() {
            return Step::Wait;
        }
        let draining = engine_busy && self.drain.is_some_and(|until| now < until);
        let node_only = self.stop.is_some_and(|s| !s.stops(Role::Engine));
        match (node, engine) {
            // A clean stop lets the node's requests to the engine finish first (bounded).
            (Phase::Running(_), _) if draining => Step::Wait,
            (Phase::Running(_), _) => Step::Term(Role::Node),
            (Phase::Stopping(..), _) | (_, Phase::Stopping(..)) => Step::Wait,
            // The node's own restart: the engine runs on.
            (Phase::Down, _) if node_only => Step::Wipe,
            (_, Phase::Running(_)) => Step::Term(Role::Engine),
            (Phase::Down, Phase::Down) => Step::Wipe,
            // A stop moves every other phase to Down (Phase::on, StopAsked).
            _ => Step::Wait,
        }
    }

    /// Whether the node's new connections to the engine go through now (else they wait,
    /// cell.engine_hold_s): while the engine is ready and no stop is under way, and during a
    /// stop's drain while the node still runs. A job the node sends while the drain waits for
    /// its earlier ones reaches the engine that is still up, and the drain waits for it too,
    /// instead of holding it for an engine that is about to stop and cutting it with the node
    /// (found by bench/soak.sh: each reload and recycle cut the jobs sent during its drain).
    pub(super) fn forwards(&self, engine_ready: bool, node: Phase) -> bool {
        engine_ready && (self.stop.is_none() || (self.drain.is_some() && matches!(node, Phase::Running(_))))
    }

    /// When a drain under way may end without an event: its own end, or a second after the
    /// node's last connection to the engine closed (`last_closed`, [`engine_busy`]); only
    /// times still ahead of `now` (a past one would wake the loop at once).
    pub(super) fn drain_deadline(&self, last_closed: Option<Instant>, now: Instant) -> Option<Instant> {
        let until = self.stop.and(self.drain)?;
        let settled = last_closed.map(|t| t + DRAIN_SETTLE);
        [Some(until), settled].into_iter().flatten().filter(|t| *t > now).min()
    }

    /// The roles the stop under way stops, which its wipes empty and its re-provision starts
    /// again: both, but for the node's own restart; both before the first start.
    pub(super) fn stopped(&self) -> Vec<Role> {
        Role::ALL.into_iter().filter(|r| self.stop.is_none_or(|s| s.stops(*r))).collect()
    }

    /// The roles [`Cycle::stopped`] names whose wipes have not begun.
    pub(super) fn to_wipe(&self) -> Vec<Role> {
        self.stopped().into_iter().filter(|r| !self.wipes.of[*r as usize]).collect()
    }

    /// What follows once both wipes are done (`failed`: one of them failed).
    pub(super) fn after_wipes(&self, failed: bool) -> AfterWipes {
        let reprovision = self.stop.is_some();
        match self.stop {
            Some(Stop { code, after: After::Exit }) => AfterWipes::Exit(code),
            _ if failed => AfterWipes::Refuse { reprovision, code: exit::CONFIG },
            _ => AfterWipes::Gate { reprovision },
        }
    }
}

/// What is under way in the cell besides its roles running. A SIGHUP and a recycle are both
/// refused while any of it is ([`UnderWay::busy`]: one rule for both): each would stop the
/// roles and pass both through the gate, and would meet what is under way there. An engine
/// still loading is not in the way: its start is given up for the new one (a SIGHUP right
/// after a crash restart applies; tests/attest.rs:
/// statements_verify_fresh_and_every_forgery_fails_with_its_own_status).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct UnderWay {
    /// A stop (to exit, or a reload's or recycle's stop before its re-provision).
    pub stop: bool,
    /// The scratch wipes (before the first start, after a stop).
    pub wipes: bool,
    /// A pass through the gate (a start, a restart, a reload's dry run).
    pub gate: bool,
    /// A recycle that has not answered its client yet.
    pub recycle: bool,
}

impl UnderWay {
    /// What makes the cell busy (the refusal names it), or None.
    pub(super) fn busy(self) -> Option<&'static str> {
        [
            (self.stop, "a stop"),
            (self.wipes, "a scratch wipe"),
            (self.gate, "a pass through the gate"),
            (self.recycle, "a recycle"),
        ]
        .into_iter()
        .find_map(|(on, what)| on.then_some(what))
    }
}

#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Wipes {
    /// Wipes begun and not yet over (their roles in Phase::Wiping until each is reaped); what
    /// follows them is the stop's (Cycle::after_wipes), or a start when there is none.
    pub running: bool,
    /// The roles whose wipes began, by [`Role`] index.
    pub of: [bool; 2],
    pub failed: Vec<(Role, crate::sandbox::cell::WipeFailed)>,
    /// A stop to exit waits this long for wipes in flight, then kills them: the next start
    /// wipes again (tests/gate.rs: a_stop_gives_a_held_wipe_its_grace_period_only).
    pub deadline: Option<Instant>,
}

impl Wipes {
    pub(super) fn busy(&self) -> bool {
        self.running
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        self.deadline
    }
}

#[cfg(test)]
mod tests;
