//! `sealnode run`: the supervisor.

use std::path::Path;

use sealnode::config::{Config, Invoker};
use sealnode::supervisor::Supervisor;

use super::{Failure, Outcome};

pub fn run(config: &Path) -> Outcome {
    // Signals wait (blocked) from the first instruction: the supervisor takes them from its
    // signalfd, so one sent while the config loads or the cell is made is not lost and does
    // not kill sealnode half-way (tests/run.rs:
    // a_sigterm_while_the_config_loads_stops_the_cell_cleanly).
    let _ = nix::sys::signal::sigprocmask(
        nix::sys::signal::SigmaskHow::SIG_BLOCK,
        Some(&sealnode::sandbox::spawn::launcher_sigset()),
        None,
    );
    let inv = Invoker::current();
    let sup = Config::load(config, &inv).and_then(|cfg| Supervisor::new(cfg, inv)).map_err(Failure::setup)?;
    Ok(sup.run())
}
