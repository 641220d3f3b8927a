//! `sealnode exec` (a command in one role's sandbox) and `sealnode probe` (sealnode's own
//! probe there).

use std::path::Path;

use sealnode::config::{Config, Invoker, Role};
use sealnode::sandbox::{self, Plan, Program};

use super::{Failure, Outcome};

pub fn exec(config: &Path, role: Role, command: Vec<String>) -> Outcome {
    run_sandboxed(config, role, command, None)
}

pub fn probe(config: &Path, role: Role, args: Vec<String>) -> Outcome {
    let fd = sandbox::plan::sealed_self().map_err(Failure::setup)?;
    let mut argv = vec!["sealnode-probe".to_string(), "__probe-inside".to_string()];
    argv.extend(args);
    run_sandboxed(config, role, argv, Some(Program::SealedSelf(fd)))
}

/// Build the plan and run it to completion; any failure before the workload runs is 125.
fn run_sandboxed(config: &Path, role: Role, argv: Vec<String>, program: Option<Program>) -> Outcome {
    let inv = Invoker::current();
    let cfg = Config::load(config, &inv).map_err(Failure::setup)?;
    let mut plan = Plan::build(&cfg, role, &inv, Some(argv), program).map_err(Failure::setup)?;
    let limited: Vec<String> = sealnode::config::Role::ALL
        .iter()
        .filter(|r| **r == role && !cfg.limits(**r).set_fields().is_empty())
        .map(|r| format!("{r}.limits"))
        .collect();
    if !limited.is_empty() {
        eprintln!("sealnode: note: {} not applied: exec and probe run outside the cell's cgroups", limited.join(", "));
    }
    // No cell holds a capped scratch here: the sandbox gets a fresh one of the cap's size.
    plan.fresh_capped_scratch().map_err(Failure::setup)?;
    // The denial log, as `run` has it: refusals logged on stderr while the command runs.
    if cfg.role(role).log_refused_syscalls {
        plan.log_refusals(&cfg).map_err(Failure::setup)?;
    }
    let mut sb = sandbox::spawn(&plan).map_err(Failure::setup)?;
    tracing::info!(role = %role, pid = sb.pid.as_raw(), "sandbox started");
    if let (Some(fd), Some(errno)) = (sb.listener.take(), plan.refusal_log) {
        // A thread of its own (the sandbox is started: nothing forks from here on).
        let log = sealnode::logging::denylog::DenyLog::new(role, fd, errno);
        std::thread::spawn(move || log.serve_until_closed());
    }
    // A stop's grace, as `run` gives a role: then the sandbox is killed.
    Ok(sandbox::run_to_exit(sb, std::time::Duration::from_secs(cfg.cell.stop_timeout_s)))
}
