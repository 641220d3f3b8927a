//! `sealnode ctl`: a request to the running supervisor over its control socket.

use std::path::Path;

use sealnode::config::Config;

use super::{Failure, Outcome};

pub fn ctl(config: &Path, verb: &str) -> Outcome {
    let cfg = Config::read_for_client(config).map_err(Failure::setup)?;
    let v = sealnode::control::client(&sealnode::control::socket_path(&cfg), verb).map_err(Failure::general)?;
    println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    Ok(if v["ok"] == true { 0 } else { 1 })
}
