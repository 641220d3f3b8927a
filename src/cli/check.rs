//! `sealnode check`: a dry run of everything `run` checks before it starts anything.

use std::path::Path;

use sealnode::config::Invoker;
use sealnode::doctor::Level;

use super::Outcome;

pub fn check(config: &Path, json: bool) -> Outcome {
    let (checks, sealed) = sealnode::check::run(config, &Invoker::current());
    let ok = !checks.iter().any(|c| c.level == Level::Fail);
    if json {
        let v = serde_json::json!({ "config": config, "ok": ok, "checks": checks, "sealed": sealed });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        sealnode::doctor::print(&checks);
        // What the plans hold, layer by layer (once the config loads).
        if sealed.is_object() {
            print!("\n{}", sealnode::proof::sealed_text::render(&sealed));
        }
        if ok {
            println!("\n{}: `sealnode run` would start (the preflight canary runs at every start).", config.display());
        } else {
            println!("\n{}: `sealnode run` would refuse to start: fix each FAIL above.", config.display());
        }
    }
    Ok(if ok { sealnode::exit::OK } else { sealnode::exit::CONFIG })
}
