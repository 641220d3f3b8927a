//! The end of a pass: everything answered (the measurement, each role's probe), and the
//! plans admitted with what was measured for them, or the pass refused with its cause.

use super::pass::{Admitted, Cause, Job, Outcome, Passed};
use crate::config::{Config, Role};
use crate::proof::canary::{self, Report};
use crate::proof::measure::Measured;

/// Everything answered: the plans admitted, or why not.
pub(super) fn finish(cfg: &Config, mut job: Job) -> Outcome {
    let could_not = |why: String| Outcome::Refused(Cause::CouldNotRun(why));
    let measured: Measured = match job.worker.answer() {
        Ok(m) => m,
        Err(e) => return could_not(format!("measuring what runs: {e}")),
    };
    if let Some(e) = measured.error(&cfg.file) {
        return Outcome::Refused(Cause::Config(e));
    }
    if let Some(why) = &measured.could_not {
        return could_not(format!("preflight could not run: {why}"));
    }
    if let Some(why) = job.probe_failed.take() {
        return could_not(why);
    }
    let mut reports = Vec::new();
    for p in &job.probes {
        match canary::finish(cfg, p.probe.role, &p.buf, p.status.unwrap_or(-1)) {
            Ok(r) => reports.push(r),
            Err(e) => return could_not(format!("preflight could not run: {e}")),
        }
    }
    let passed = reports.iter().all(|r| r.succeeded == 0);
    let report = Report { schema: canary::SCHEMA, sealnode_version: env!("CARGO_PKG_VERSION"), roles: reports, passed };
    if !passed {
        let mut details = Vec::new();
        for r in &report.roles {
            for a in r.attempts.iter().filter(|a| a.refused_by.is_none()) {
                tracing::error!(role = %r.role, attempt = a.id, what = a.description, "preflight: escape attempt SUCCEEDED");
                details.push(format!("preflight: {} role: {} ({}) succeeded", r.role, a.id, a.description));
            }
        }
        return Outcome::Refused(Cause::Escapes(details));
    }
    if let Some(m) = &measured.models {
        tracing::info!(
            files = m.files.len(),
            hashed = m.hashed,
            hashed_bytes = m.hashed_bytes,
            cached = m.cached,
            skipped = m.skipped,
            ms = m.ms,
            "model digests"
        );
    }
    let mut admitted = Vec::new();
    for (role, mut plan) in std::mem::take(&mut job.plans) {
        let mut digests = match crate::proof::receipt::policy_digests(cfg, role) {
            Ok(d) => d,
            Err(e) => return Outcome::Refused(Cause::Config(e)),
        };
        if let Some(sp) = plan.sealed_program() {
            let Some(d) = measured.program(role) else {
                return could_not(format!("measuring what runs: no digest of the {role}'s program"));
            };
            // The worker sealed the copy it hashed; a copy not sealed, or of another size,
            // is not what was hashed.
            let size = nix::sys::stat::fstat(&sp.fd).map(|st| st.st_size as u64).ok();
            if !crate::sandbox::sealed::is_sealed(&sp.fd) || size != Some(d.bytes) {
                return could_not(format!(
                    "measuring what runs: the copy of {} is not the one hashed",
                    sp.host.display()
                ));
            }
            digests.program_resolved = Some(sp.inside.display().to_string());
            digests.program_host = Some(sp.host.display().to_string());
            digests.program_sha256 = Some(d.sha256.clone());
            tracing::debug!(role = %role, program = %sp.inside.display(), host = %sp.host.display(), sha256 = %d.sha256, bytes = d.bytes, mode = format!("{:o}", d.mode), "program measured");
            plan.measured(d.sha256.clone(), d.mode);
        }
        if role == Role::Engine && job.hash_models {
            match &measured.models {
                Some(m) => {
                    digests.models = m.files.iter().cloned().collect();
                    digests.models_binding = Some(true);
                }
                // Writable: the engine could change the files, so none are listed.
                None => digests.models_binding = Some(false),
            }
        }
        admitted.push((role, Admitted { plan, digests }));
    }
    let attempts = report.roles.iter().map(|r| r.attempts.len()).sum();
    Outcome::Passed(Box::new(Passed {
        purpose: job.purpose,
        roles: job.roles.clone(),
        admitted,
        report,
        ms: job.began.elapsed().as_millis() as u64,
        attempts,
    }))
}
