//! Through the gate to a start: every start of a role, whatever began it (first start, crash
//! restart, SIGHUP, recycle), enters the gate (supervisor::gate: its program measured, its preflight
//! run in its exact sandbox inside this cell, off the loop); a pass that comes back admitted
//! is recorded (a receipt with the next generation, the statement) and started; a refused
//! one stops the cell with its exit status. A reload's dry run goes back to sighup.rs
//! (`reload_passed`, `reload_refused`).

use std::time::Instant;

use super::lifecycle::{self, Admission, After, Event, Phase};
use super::{gate, GatePass, Supervisor};
use crate::config::Role;
use crate::exit;
use crate::proof::receipt::Receipt;

impl Supervisor {
    /// `roles` enter the gate. What is refused before anything runs is refused here, with
    /// the exit status.
    pub(super) fn enter_gate(&mut self, roles: &[Role]) -> std::result::Result<(), i32> {
        let ctx = super::gate_ctx(&self.base.cfg, &self.base, self.attest.signing(), &self.roles);
        match self.gate.begin(&ctx, roles, gate::Purpose::Start) {
            Ok(()) => {
                for role in roles {
                    self.slot(*role).apply(Event::EnterGate);
                }
                Ok(())
            }
            Err(r) => Err(self.refused_start(r)),
        }
    }

    /// A pass the gate refused: say why; the exit status for it.
    fn refused_start(&mut self, refusal: gate::Cause) -> i32 {
        let message = refusal.message();
        match &refusal {
            gate::Cause::Config(_) => tracing::error!(error = %message, "cannot prepare the role"),
            gate::Cause::CouldNotRun(_) => tracing::error!(error = %message, "preflight canary could not run"),
            gate::Cause::Escapes(escapes) => {
                for d in escapes {
                    crate::logging::log::say(d);
                }
                tracing::error!("preflight found an escape; not starting");
            }
        }
        crate::logging::log::say(&message);
        for s in self.roles.iter_mut() {
            if s.phase == Phase::Starting {
                s.apply(Event::Refused);
            }
        }
        refusal.code()
    }

    /// The gate answered: start what passed, stop on what did not; a reload's dry run goes on
    /// to the reload or is refused.
    pub(super) fn poll_gate(&mut self) {
        // Each outcome goes to what its pass was for: a start's refusal stops the cell, a dry
        // run's refuses the reload (tests/gate.rs: a_reload_that_cannot_start_keeps_the_cell,
        // a_sighup_during_the_first_wipes_is_refused_and_the_start_goes_on).
        let purpose = self.gate.purpose();
        let outcome = match purpose {
            Some(gate::Purpose::DryRun) => {
                let Some(new) = self.reload.candidate() else {
                    // A dry run keeps its candidate until it answers: without one, the pass is
                    // given up rather than left holding the gate.
                    tracing::error!("a reload's dry run without its config (internal error); the pass is given up");
                    return self.gate.abandon(&self.base.epoll);
                };
                self.gate.poll(new, &self.base.epoll)
            }
            Some(gate::Purpose::Start) => self.gate.poll(&self.base.cfg, &self.base.epoll),
            None => None,
        };
        match outcome {
            None => {}
            Some(gate::Outcome::Passed(p)) if p.purpose == gate::Purpose::DryRun => self.reload_passed(),
            Some(gate::Outcome::Refused(r)) if purpose == Some(gate::Purpose::DryRun) => self.reload_refused(r),
            Some(gate::Outcome::Passed(p)) => self.admit(*p),
            Some(gate::Outcome::Refused(r)) => {
                self.server.recycle_done(&crate::control::protocol::Refusal::new("recycle failed; sealnode stops"));
                let code = self.refused_start(r);
                self.begin_stop(code, After::Exit);
            }
        }
    }

    /// The roles passed: a new receipt (the passed roles' digests fresh, the others' those of
    /// their running processes), the statement, then the start: the engine when it passed,
    /// else the node. A failure stops the cell.
    fn admit(&mut self, p: gate::Passed) {
        // Which role starts now, by the lifecycle's rule: the node's own pass waits for an
        // engine that went down while it ran (tests/gate.rs:
        // a_node_admitted_while_the_engine_went_down_waits_for_the_engine).
        let first = match lifecycle::admission(p.roles.contains(&Role::Engine), self.engine_is_ready()) {
            Admission::Start(role) => role,
            Admission::Retry => return self.pass_again_later(&p.roles),
        };
        // The receipt first: nothing of this generation runs before it is on disk.
        let Some(receipt) = self.write_receipt(&p) else { return };
        // Each admitted role's record (its pass, digests, what is sealed); the node's plan
        // kept for the ready engine when the engine starts first.
        let starts_now = self.record_admitted(p, &receipt, first);
        self.current.receipt = Some(receipt);
        self.current.config = Some(self.base.cfg.clone());
        // The statement next: the node is handed this generation's statement before it runs.
        let facts = super::facts(&self.base, &self.current, &self.roles);
        if let Err(code) = self.attest.publish(&facts) {
            return self.begin_stop(code, After::Exit);
        }
        // Then the start, from exactly the plan the gate admitted.
        match starts_now {
            Some(a) => self.start(a),
            None => self.nothing_admitted(first),
        }
        // The node's own pass, beside the ready engine (a crash restart, the node's own
        // reload): the roles are up again once it runs.
        if first == Role::Node && self.cycle.stop.is_none() {
            self.roles_up();
        }
    }

    /// The node's pass came back while the engine was not ready: it waits and passes again.
    fn pass_again_later(&mut self, roles: &[Role]) {
        tracing::info!("the engine is not ready (it went down while the node's preflight ran): the node waits for it and passes the gate again");
        for role in roles {
            self.slot(*role).apply(Event::RetryAt(Instant::now() + super::readiness::READY_INTERVAL));
        }
    }

    /// The receipt of a pass: each role's latest preflight (the fresh ones replace theirs),
    /// the passed roles' digests (the others' those of their running processes), the cgroup
    /// records. None: it could not be written, and the cell stops.
    fn write_receipt(&mut self, p: &gate::Passed) -> Option<Receipt> {
        let fresh = &p.report;
        let mut report = self.current.report.take().unwrap_or_else(|| fresh.clone());
        for r in &fresh.roles {
            match report.roles.iter_mut().find(|x| x.role == r.role) {
                Some(x) => *x = r.clone(),
                None => report.roles.push(r.clone()),
            }
        }
        report.roles.sort_by_key(|r| r.role as usize);
        report.passed = report.roles.iter().all(|r| r.succeeded == 0);
        let mut digests = std::collections::BTreeMap::new();
        for (role, a) in &p.admitted {
            digests.insert(role.name().to_string(), a.digests.clone());
        }
        for s in &self.roles {
            if !p.roles.contains(&s.role) {
                if let Some(d) = &s.digests {
                    digests.insert(s.role.name().to_string(), d.clone());
                }
            }
        }
        let (cfg, inv) = (&self.base.cfg, &self.base.inv);
        let resources = self.resources();
        let written =
            crate::proof::receipt::write(cfg, inv, &self.base.state_dir, &report, digests, &p.roles, resources);
        self.current.report = Some(report);
        match written {
            Ok(r) => {
                let names: Vec<&str> = p.roles.iter().map(|r| r.name()).collect();
                tracing::info!(roles = %names.join(","), attempts = p.attempts, ms = p.ms, generation = r.generation, path = %crate::proof::receipt::path(cfg).display(), "preflight passed; receipt written");
                Some(r)
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot write the receipt");
                crate::logging::log::say(&format!("{e}"));
                self.begin_stop(exit::FAILED, After::Exit);
                None
            }
        }
    }

    /// Each role's cgroup and the limit files in force there, for the receipt.
    fn resources(&self) -> std::collections::BTreeMap<String, crate::proof::receipt::Resources> {
        let tree = self.base.cell.cgroups.as_ref();
        Role::ALL
            .iter()
            .filter_map(|r| {
                let (cgroup, files) = tree?.record(*r)?;
                Some((r.name().to_string(), crate::proof::receipt::Resources { cgroup, files }))
            })
            .collect()
    }

    /// A reload applied in place: a receipt of the next generation for the config now in
    /// force, with the running roles' digests and latest preflights and the limits now in
    /// force (no role passed the gate: none started), and its statement. A receipt that
    /// cannot be written stops the cell, as at a start.
    pub(super) fn receipt_in_place(&mut self) {
        let Some(report) = self.current.report.clone() else { return };
        let digests = self.roles.iter().filter_map(|s| Some((s.role.name().to_string(), s.digests.clone()?))).collect();
        let resources = self.resources();
        let (cfg, inv) = (&self.base.cfg, &self.base.inv);
        match crate::proof::receipt::write(cfg, inv, &self.base.state_dir, &report, digests, &[], resources) {
            Ok(r) => {
                tracing::info!(generation = r.generation, path = %crate::proof::receipt::path(cfg).display(), "reload applied in place; receipt written");
                self.current.receipt = Some(r);
                self.current.config = Some(self.base.cfg.clone());
            }
            Err(e) => {
                tracing::error!(error = %e, "cannot write the receipt");
                crate::logging::log::say(&format!("{e}"));
                return self.begin_stop(exit::FAILED, After::Exit);
            }
        }
        let facts = super::facts(&self.base, &self.current, &self.roles);
        if let Err(code) = self.attest.publish(&facts) {
            self.begin_stop(code, After::Exit);
        }
    }

    /// Each admitted role's pass, digests (of `receipt`'s generation) and what is sealed, for
    /// its status and statements; `first`'s plan is returned to start now, the other's (the
    /// node's, beside an engine that starts now) kept in `node_admitted`.
    fn record_admitted(&mut self, p: gate::Passed, receipt: &Receipt, first: Role) -> Option<gate::Admitted> {
        let cfg = &self.base.cfg;
        let cell = &self.base.cell;
        let mut starts_now = None;
        for (role, mut a) in p.admitted {
            a.digests.generation = receipt.generation;
            // The role's own attempts (the pass's total covers every role it ran).
            let attempts = p.report.roles.iter().find(|x| x.role == role).map_or(0, |x| x.attempts.len());
            let cgroup = cell.cgroups.as_ref().and_then(|t| t.record(role)).map(|(_, f)| f).unwrap_or_default();
            let sealed = crate::proof::sealed_text::role(cfg, a.plan(), cgroup);
            let s = &mut self.roles[role as usize];
            s.passed = Some(GatePass {
                generation: receipt.generation,
                preflight_ms: p.ms,
                attempts,
                at: crate::os::sys::unix_now(),
            });
            s.sealed = Some(sealed);
            s.digests = Some(a.digests.clone());
            s.config = Some(cfg.clone());
            s.apply(Event::Admitted);
            if role == first {
                starts_now = Some(a);
            } else {
                self.current.node_admitted = Some(a);
            }
        }
        starts_now
    }

    /// A role about to start has no plan the gate admitted: nothing starts unsealed, the cell
    /// stops (an internal error: the gate admits every role of its pass).
    pub(super) fn nothing_admitted(&mut self, role: Role) {
        tracing::error!(role = %role, "no start of this role passed the gate (internal error); stopping");
        crate::logging::log::say(&format!("{role}: no start passed the gate (internal error)"));
        self.begin_stop(exit::FAILED, After::Exit);
    }
}
