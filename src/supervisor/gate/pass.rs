//! What a pass through the gate is: its purpose, the job in flight (plans, the measurement,
//! the probes), and what it answers (admitted plans, or a refusal and its cause).

use std::time::Instant;

use crate::config::Role;
use crate::error::Error;
use crate::exit;
use crate::proof::canary::{self, Probe, Report};
use crate::proof::measure;
use crate::proof::receipt::RoleDigests;
use crate::sandbox::cell::Cell;
use crate::sandbox::Plan;

/// A role's plan as the gate admitted it: its program's sealed copy measured (and its pin
/// checked), its sandbox preflighted, and the digests a receipt records for it. Only the gate
/// makes one, and only an admitted plan starts a role.
#[derive(Debug)]
pub(in crate::supervisor) struct Admitted {
    pub(super) plan: Plan,
    pub digests: RoleDigests,
}

impl Admitted {
    pub(in crate::supervisor) fn into_plan(self) -> Plan {
        self.plan
    }

    pub(in crate::supervisor) fn plan(&self) -> &Plan {
        &self.plan
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(in crate::supervisor) enum Purpose {
    /// Roles about to start in the running cell.
    Start,
    /// A reload's check of a new config in a throwaway cell, before anything stops.
    DryRun,
}

/// A pass through the gate.
#[derive(Debug)]
pub(in crate::supervisor) struct Passed {
    pub purpose: Purpose,
    pub roles: Vec<Role>,
    pub admitted: Vec<(Role, Admitted)>,
    /// The fresh preflight of `roles`.
    pub report: Report,
    pub ms: u64,
    pub attempts: usize,
}

#[derive(Debug)]
pub(in crate::supervisor) enum Outcome {
    Passed(Box<Passed>),
    Refused(Cause),
}

/// Why the gate refused a pass: each cause has its exit status ([`Cause::code`]).
#[derive(Debug)]
pub(in crate::supervisor) enum Cause {
    /// What the config names cannot run (a role's plan, a pin, a file to measure): exit 125.
    Config(Error),
    /// The preflight could not run (its probe, the measurement, their deadline): exit 6.
    CouldNotRun(String),
    /// The preflight found escapes, each said ("preflight: <role> role: <id> (<what>)
    /// succeeded"): exit 3.
    Escapes(Vec<String>),
}

impl Cause {
    pub fn code(&self) -> i32 {
        match self {
            Cause::Config(_) => exit::CONFIG,
            Cause::CouldNotRun(_) => exit::PREFLIGHT_ERROR,
            Cause::Escapes(_) => exit::PREFLIGHT_FAILED,
        }
    }

    /// The refusal in one line (escapes: each is said before it).
    pub fn message(&self) -> String {
        match self {
            Cause::Config(e) => e.to_string(),
            Cause::CouldNotRun(why) => why.clone(),
            Cause::Escapes(_) => "refusing to start: the sandbox does not hold (see above)".into(),
        }
    }
}

#[derive(Debug)]
pub(super) struct ProbeRun {
    pub(super) probe: Probe,
    pub(super) buf: Vec<u8>,
    pub(super) eof: bool,
    pub(super) status: Option<i32>,
}

#[derive(Debug)]
pub(super) struct Job {
    pub(super) purpose: Purpose,
    pub(super) roles: Vec<Role>,
    pub(super) plans: Vec<(Role, Plan)>,
    pub(super) worker: measure::Worker,
    /// The engine has a model dir and statements are signed: the digests say what binds
    /// (the files, read-only; none, writable).
    pub(super) hash_models: bool,
    pub(super) probes: Vec<ProbeRun>,
    pub(super) _targets: canary::Targets,
    /// A dry run's own cell (the running one holds a live engine a probe could reach).
    pub(super) _throwaway: Option<Cell>,
    pub(super) began: Instant,
    pub(super) deadline: Instant,
    /// The measurement outlasted the probes' deadline and that was said (once: a model dir
    /// of hundreds of GB takes its time; a stopped or hung worker is shown in `ctl status`).
    pub(super) said_slow: bool,
    /// A probe could not be started: why. The pass still waits for the measurement, whose
    /// problems (a path the role cannot open, say: a config problem, 125) explain it better
    /// than the sandbox's failed setup (6), and are what `check` reports for the same config.
    pub(super) probe_failed: Option<String>,
}
