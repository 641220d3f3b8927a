//! The status reply (`{"cmd":"status"}`, docs/control.md): what each part reports, in one
//! answer. Read-only: building it changes nothing.

use super::Supervisor;

impl Supervisor {
    pub(super) fn status(&self) -> serde_json::Value {
        let dropped = crate::logsink::dropped();
        let roles: Vec<serde_json::Value> = self
            .roles
            .iter()
            .map(|s| {
                let (state, pid) = s.phase.shown();
                let pid = pid.map(|p| p.as_raw());
                let refused = if self.base.cfg.role(s.role).log_refused_syscalls {
                    serde_json::json!(self.io.refused_counts(s.role))
                } else {
                    serde_json::Value::Null
                };
                serde_json::json!({
                    "role": s.role.name(),
                    "state": state,
                    "pid": pid,
                    "uptime_s": s.started.filter(|_| pid.is_some()).map(|t| t.elapsed().as_secs()),
                    "restarts": s.restarts.count,
                    "starts": s.starts,
                    "output_dropped_lines": self.io.dropped_lines(s.role),
                    "refused_syscalls": refused,
                    "generation": s.passed.map(|g| g.generation),
                    "preflight": s.passed.map(|g| {
                        // Per layer, from the role's latest result (the one this pass wrote
                        // into the receipt).
                        let latest = self.current.report.as_ref().and_then(|r| r.roles.iter().find(|x| x.role == s.role));
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
                    "resources": self.base.cell.cgroups.as_ref().map(|t| t.usage(s.role)),
                })
            })
            .collect();
        serde_json::json!({
            "ok": true,
            "uptime_s": self.base.born.elapsed().as_secs(),
            "cell_pid": self.base.cell.pid.as_raw(),
            "ready": self.sd.ready_sent(),
            "engine_ready_ms": self.ready.last_ms(),
            "log_dropped_lines": {
                "stdout": dropped.0,
                "stderr": dropped.1,
                "journal": crate::journal::dropped(),
            },
            "roles": roles,
            // `attest` requests waiting for the TPM's quote (at most 4).
            "attest_waiting": self.attest.waiting_requests(),
            "gate": self.gate.progress().map(|(purpose, roles, t)| serde_json::json!({
                "purpose": match purpose { super::gate::Purpose::Start => "start", super::gate::Purpose::DryRun => "reload" },
                "roles": roles.iter().map(|r| r.name()).collect::<Vec<_>>(),
                "ms": t.as_millis() as u64,
            })),
            "statement": self.attest.status(),
            "egress": self.fwd.stats(),
            "engine_forwarding": self.fwd.engine_stats(),
            "reload": self.reload.last(),
            "receipt": self.current.receipt.as_ref().map(|r| serde_json::json!({
                "path": crate::receipt::path(&self.base.cfg),
                "generation": r.generation,
                "started_at": r.started_at,
                "canary_passed": r.canary.passed,
            })),
        })
    }
}
