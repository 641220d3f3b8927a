//! The status reply (`{"cmd":"status"}`, docs/control.md), as the protocol's type: what each
//! part reports, in one answer. Read-only: building it changes nothing.

use crate::control::protocol::{
    Always, GateProgress, GatePurpose, GateWait, LogDropped, Preflight, ProcessState, ReceiptSummary, RoleStatus,
    Status,
};

use super::lifecycle::Phase;
use super::Supervisor;

impl Supervisor {
    pub(super) fn status(&self) -> Status {
        let dropped = crate::logging::logsink::dropped();
        let cfg = &self.base.cfg;
        let now = std::time::Instant::now();
        // What each role's process is doing, read from /proc once per answer.
        let held: [Option<ProcessState>; 2] = [slot_state(self.roles[0].phase), slot_state(self.roles[1].phase)];
        let ready = self.serving(&held);
        let roles = self
            .roles
            .iter()
            .zip(held)
            .map(|(s, pid_state)| {
                let (state, pid) = s.phase.shown();
                // Per layer, from the role's latest result (the one its pass wrote into the
                // receipt).
                let latest = self.current.report.as_ref().and_then(|r| r.roles.iter().find(|x| x.role == s.role));
                RoleStatus {
                    role: s.role,
                    state,
                    pid: pid.map(|p| p.as_raw()),
                    pid_state,
                    uptime_s: s.started.filter(|_| pid.is_some()).map(|t| t.elapsed().as_secs()),
                    restarts: s.restarts.count,
                    starts: s.starts,
                    output_dropped_lines: self.io.dropped_lines(s.role),
                    refused_syscalls: cfg.role(s.role).log_refused_syscalls.then(|| self.io.refused_counts(s.role)),
                    generation: s.passed.map(|g| g.generation),
                    preflight: s.passed.map(|g| Preflight {
                        passed: true,
                        ms: g.preflight_ms,
                        attempts: g.attempts,
                        refused: latest.map(|x| x.refused),
                        refused_by: latest.map(|x| {
                            crate::proof::sealed_text::refused_by(x)
                                .into_iter()
                                .map(|(k, v)| (k.to_string(), v))
                                .collect()
                        }),
                        at: g.at,
                    }),
                    sealed: s.sealed.clone(),
                    resources: self.base.cell.cgroups.as_ref().and_then(|t| t.usage(s.role)),
                }
            })
            .collect();
        Status {
            ok: Always,
            uptime_s: self.base.born.elapsed().as_secs(),
            cell_pid: self.base.cell.pid.as_raw(),
            ready,
            engine_ready_ms: self.readiness.last_ms(),
            engine_not_answering: self.readiness.not_answering().map(str::to_string),
            engine_answered_ago_s: self.readiness.answered_ago(now).map(seconds),
            engine_rechecks_waiting_s: self.readiness.rechecks_waiting(now).map(seconds),
            log_dropped_lines: LogDropped {
                stdout: dropped.0,
                stderr: dropped.1,
                journal: crate::logging::journal::dropped(),
            },
            roles,
            egress: self.fwd.stats(),
            engine_forwarding: self.fwd.engine_stats(),
            reload: self.reload.last().cloned(),
            gate: self.gate.progress().map(|p| GateProgress {
                purpose: match p.purpose {
                    super::gate::Purpose::Start => GatePurpose::Start,
                    super::gate::Purpose::DryRun => GatePurpose::Reload,
                },
                roles: p.roles,
                ms: p.elapsed.as_millis() as u64,
                waiting_for: Some(
                    p.waiting_for
                        .into_iter()
                        .map(|(what, pid)| GateWait { what, pid: pid.as_raw(), state: state_of(pid) })
                        .collect(),
                ),
            }),
            // `attest` requests waiting for the TPM's quote (at most 4).
            attest_waiting: self.attest.waiting_requests(),
            receipt: self.current.receipt.as_ref().map(|r| ReceiptSummary {
                path: crate::proof::receipt::path(cfg).display().to_string(),
                generation: r.generation,
                started_at: r.started_at,
                canary_passed: r.canary.passed,
            }),
            statement: self.attest.status(),
        }
    }

    /// The cell serves now: no stop under way, both roles run and the engine answered its
    /// readiness check since its last start, and its last recheck. READY=1 is said once; this
    /// follows the roles down and up again (a crash, a restart, a recycle, a reload).
    /// A role whose processes are held (stopped or traced: its init or any process under it,
    /// `states` as [`slot_state`] read them) does not serve either.
    fn serving(&self, states: &[Option<ProcessState>; 2]) -> bool {
        self.cycle.stop.is_none()
            && self.readiness.last_ms().is_some()
            && !self.readiness.pending()
            && self.readiness.not_answering().is_none()
            && self
                .roles
                .iter()
                .zip(states)
                .all(|(r, st)| matches!(r.phase, Phase::Running(_)) && !st.as_ref().is_some_and(|s| s.held()))
    }
}

/// What the process a role's phase waits on is doing: its wipe, its init while it stops, or
/// (running) its init, except that a held process anywhere under the init (stopped or traced)
/// shows as held: the program, or a server it started (found by review: a stopped grandchild,
/// under `sh -c`, was shown running and ready).
/// More processes and threads than [`HELD_READS`] allow are told as such, not as running: a
/// held one could be past the budget (found by review: the 4097th process, stopped, was
/// shown ready).
fn slot_state(phase: Phase) -> Option<ProcessState> {
    let (_, pid) = phase.shown();
    let own = state_of(pid?);
    let Phase::Running(init) = phase else { return own };
    let mut reads = HELD_READS;
    let under = crate::os::sys::descendants(init, &mut reads);
    for pid in under.pids {
        match crate::os::sys::held_letter(pid, &mut reads) {
            crate::os::sys::Held::Yes(c) => return Some(ProcessState::from_letter(c)),
            crate::os::sys::Held::No => {}
            crate::os::sys::Held::OutOfReads => return Some(ProcessState::TooMany),
        }
    }
    if !under.whole {
        return Some(ProcessState::TooMany);
    }
    own
}

/// How many reads of /proc a status spends looking for a held process under a role's init
/// (its task lists, each thread's children file, a stat per process found, and per thread of
/// one whose main thread is gone): the answer is made in the event loop that forwards the
/// node's traffic, so it is bounded (milliseconds); the engine and node run tens of threads, a
/// role's `pids.max` may allow far more.
const HELD_READS: usize = 4096;

/// What the kernel shows `pid` doing.
fn state_of(pid: nix::unistd::Pid) -> Option<ProcessState> {
    crate::os::sys::process_state(pid).map(ProcessState::from_letter)
}

/// A duration as the status says it: seconds, to the millisecond.
fn seconds(d: std::time::Duration) -> f64 {
    d.as_millis() as f64 / 1000.0
}
