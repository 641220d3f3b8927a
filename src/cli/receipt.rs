//! `sealnode verify-receipt`: a receipt against the current config, policies and binaries.

use std::path::{Path, PathBuf};

use sealnode::config::{Config, Invoker};
use sealnode::proof::receipt;

use super::{Failure, Outcome};

pub fn verify(file: Option<PathBuf>, config: &Path) -> Outcome {
    let inv = Invoker::current();
    let cfg = Config::load(config, &inv).map_err(Failure::setup)?;
    let path = file.unwrap_or_else(|| receipt::path(&cfg));
    let r = receipt::load(&path).map_err(Failure::general)?;
    let bad = receipt::verify(&r, &cfg, &inv).map_err(Failure::general)?;
    let generation = r.generation;
    if bad.is_empty() {
        println!("{}: generation {generation} matches the current config, policies and binaries", path.display());
        return Ok(0);
    }
    println!("{}: generation {generation} does NOT match:", path.display());
    for b in bad {
        println!("  {b}");
    }
    Ok(1)
}
