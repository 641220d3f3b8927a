//! `sealnode canary`: the battery (or the layer matrix) in each role's exact sandbox, rendered
//! as a table, JSON, JUnit or TAP.

use std::path::{Path, PathBuf};

use sealnode::config::{Config, Invoker, Role};
use sealnode::proof::canary::{self, ci_report, Report};

use super::{Failure, Outcome};

/// What `sealnode canary` was asked for.
pub struct Args {
    pub config: PathBuf,
    pub role: Option<Role>,
    pub json: bool,
    pub matrix: bool,
    pub junit: Option<PathBuf>,
    pub tap: Option<PathBuf>,
}

fn is_stdout(p: &Option<PathBuf>) -> bool {
    p.as_deref() == Some(Path::new("-"))
}

pub fn canary(a: Args) -> Outcome {
    if usize::from(a.json) + usize::from(is_stdout(&a.junit)) + usize::from(is_stdout(&a.tap)) > 1 {
        return Err(Failure::usage("canary: only one of --json, --junit - and --tap - can use stdout"));
    }
    let inv = Invoker::current();
    let roles: Vec<Role> = a.role.map(|r| vec![r]).unwrap_or_else(|| Role::ALL.to_vec());
    let cfg = Config::load(&a.config, &inv).map_err(Failure::setup)?;
    if a.matrix {
        let m = canary::matrix(&cfg, &inv, &roles).map_err(Failure::setup)?;
        if a.json {
            println!("{}", serde_json::to_string_pretty(&m).unwrap_or_default());
        } else {
            print!("{}", canary::render_matrix(&m));
        }
        return Ok(if m.violations.is_empty() { 0 } else { 1 });
    }
    let r = canary::battery(&cfg, &inv, &roles, None).map_err(Failure::setup)?;
    write_ci_reports(&r, a.junit.as_deref(), a.tap.as_deref()).map_err(Failure::setup)?;
    if a.json {
        println!("{}", serde_json::to_string_pretty(&r).unwrap_or_default());
    } else if !is_stdout(&a.junit) && !is_stdout(&a.tap) {
        print!("{}", canary::render(&r));
    }
    Ok(if r.passed { 0 } else { 1 })
}

/// Write the battery's JUnit and TAP reports where asked (`-` is stdout).
fn write_ci_reports(r: &Report, junit: Option<&Path>, tap: Option<&Path>) -> Result<(), String> {
    let mut outputs = Vec::new();
    if let Some(p) = junit {
        let xml = ci_report::junit(r).map_err(|e| format!("canary --junit: cannot render the report: {e}"))?;
        outputs.push((p, xml));
    }
    if let Some(p) = tap {
        outputs.push((p, ci_report::tap(r)));
    }
    for (path, text) in outputs {
        if path == Path::new("-") {
            print!("{text}");
        } else {
            // New file then rename: never follows a planted symlink, never leaves half a report.
            sealnode::os::atomic::write_atomic(path, text.as_bytes(), 0o644).map_err(|e| format!("canary: {e}"))?;
        }
    }
    Ok(())
}
