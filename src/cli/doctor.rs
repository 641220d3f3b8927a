//! `sealnode doctor`: what this kernel offers sealnode, and what each fact means.

use std::path::PathBuf;

use sealnode::config::{Config, Invoker, Role};

use super::{Failure, Outcome};

pub fn doctor(config: Option<PathBuf>, json: bool) -> Outcome {
    let inv = Invoker::current();
    // Without a config: the Landlock ABI the shipped policies need.
    let mut min_abi = 6;
    let mut needs = None;
    if let Some(c) = config {
        let cfg = Config::load(&c, &inv).map_err(Failure::setup)?;
        for r in Role::ALL {
            let (_, ll) = cfg.policy_files(r).map_err(Failure::setup)?;
            let rules = sealnode::policy::landlock::Rules::from_loaded(&ll.bytes, &cfg.role(r).landlock)
                .map_err(Failure::setup)?;
            min_abi = min_abi.max(rules.min_abi);
        }
        // A configured limit this host cannot enforce: the same refusal `run` gives.
        sealnode::sandbox::cgroup::check(&cfg).map_err(Failure::setup)?;
        needs = Some(sealnode::doctor::Needs::of(&cfg, min_abi));
    }
    let needs = needs.unwrap_or(sealnode::doctor::Needs::any(min_abi));
    Ok(sealnode::doctor::report(&sealnode::doctor::checks(needs), json))
}
