//! `sealnode ctl`: a request to the running supervisor over its control socket, shown as a
//! table (status), JSON (`--json`) or Prometheus text (metrics).

use std::path::{Path, PathBuf};

use serde_json::Value;

use sealnode::config::Config;

use super::{Failure, Outcome};

/// What to do with the answer.
pub enum Show {
    Status { json: bool },
    Recycle,
    Metrics { textfile: Option<PathBuf> },
}

pub fn ctl(config: &Path, show: Show) -> Outcome {
    let cfg = Config::read_for_client(config).map_err(Failure::setup)?;
    let verb = match show {
        Show::Recycle => "recycle",
        _ => "status",
    };
    let v = match sealnode::control::client(&sealnode::control::socket_path(&cfg), verb) {
        Ok(v) => v,
        // A scrape still gets an answer: sealnode_up 0 (and this command fails, saying why).
        Err(e) => {
            if let Show::Metrics { textfile } = &show {
                let down = sealnode::metrics::down();
                match textfile {
                    Some(path) => {
                        let _ = write_textfile(path, &down);
                    }
                    None => print!("{down}"),
                }
            }
            return Err(Failure::general(e));
        }
    };
    let ok = v["ok"] == true;
    match show {
        Show::Status { json: false } if ok => print!("{}", human(&v)),
        Show::Metrics { textfile } if ok => {
            let text = sealnode::metrics::render(&v);
            match textfile {
                // node_exporter's textfile collector reads *.prom files: written whole, atomically.
                Some(path) => write_textfile(&path, &text).map_err(|e| Failure::general(format!("metrics: {e}")))?,
                None => print!("{text}"),
            }
        }
        _ => println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default()),
    }
    Ok(if ok { sealnode::exit::OK } else { sealnode::exit::FAILED })
}

/// The textfile, replaced atomically in its directory, which is reached without following a
/// symlink in any component (the metrics unit runs as root: a directory another user can
/// rename must not redirect the write elsewhere).
fn write_textfile(path: &Path, text: &str) -> Result<(), String> {
    let abs = if path.is_absolute() {
        path.to_path_buf()
    } else {
        std::env::current_dir().map_err(|e| e.to_string())?.join(path)
    };
    let (Some(dir), Some(name)) = (abs.parent(), abs.file_name().and_then(|n| n.to_str())) else {
        return Err(format!("{}: not a file path", abs.display()));
    };
    let walked =
        sealnode::sys::open_path_no_symlinks(dir).map_err(|e| format!("open {}: {}", dir.display(), e.desc()))?;
    let dirfd = nix::fcntl::openat(
        &walked,
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("open {}: {}", dir.display(), e.desc()))?;
    sealnode::atomic::write_atomic_at(&dirfd, name, text.as_bytes(), 0o644, &abs).map_err(|e| e.to_string())
}

fn duration(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

fn bytes(b: f64) -> String {
    match b {
        b if b < 1024.0 => format!("{b} B"),
        b if b < 1024.0 * 1024.0 => format!("{:.1} KiB", b / 1024.0),
        b if b < 1024.0 * 1024.0 * 1024.0 => format!("{:.1} MiB", b / 1048576.0),
        b => format!("{:.2} GiB", b / 1073741824.0),
    }
}

/// The status as an operator reads it: one line for the cell, one per role, one per upstream.
fn human(v: &Value) -> String {
    let mut s = String::new();
    let up = v["uptime_s"].as_u64().map(duration).unwrap_or_default();
    let ready = if v["ready"] == true { "ready" } else { "starting (the engine is not ready yet)" };
    s.push_str(&format!("sealnode: {ready}, up {up}, cell pid {}\n", v["cell_pid"]));
    if let Some(r) = v["receipt"].as_object() {
        let canary = if r.get("canary_passed") == Some(&Value::Bool(true)) {
            "preflight passed"
        } else {
            "PREFLIGHT NOT PASSED"
        };
        s.push_str(&format!(
            "receipt:  generation {}, {canary}, {} ({})\n",
            r.get("generation").unwrap_or(&Value::Null),
            r.get("path").and_then(Value::as_str).unwrap_or("?"),
            r.get("started_at").and_then(Value::as_str).unwrap_or("?"),
        ));
    }
    if let Some(ms) = v["engine_ready_ms"].as_f64() {
        s.push_str(&format!("engine:   ready {:.1} s after its start\n", ms / 1000.0));
    }
    s.push_str(&format!(
        "\n{:<7} {:<11} {:>8} {:>8} {:>6} {:>8} {:>6}  {:<22} {}\n",
        "ROLE", "STATE", "PID", "UPTIME", "STARTS", "RESTARTS", "GEN", "PREFLIGHT", "MEMORY / PIDS"
    ));
    for r in v["roles"].as_array().cloned().unwrap_or_default() {
        let opt = |x: &Value| if x.is_null() { "-".to_string() } else { x.to_string() };
        let pre = match r["preflight"].as_object() {
            Some(p) => format!(
                "{} refused, {:.2} s",
                p.get("attempts").unwrap_or(&Value::Null),
                p.get("ms").and_then(Value::as_f64).unwrap_or(0.0) / 1000.0
            ),
            None => "-".into(),
        };
        let res = &r["resources"];
        let mem = match (res["memory_current"].as_f64(), res["limits"]["memory.max"].as_str()) {
            (Some(m), Some(max)) if max != "max" => {
                format!("{} of {}", bytes(m), max.parse::<f64>().map(bytes).unwrap_or_else(|_| max.to_string()))
            }
            (Some(m), _) => bytes(m),
            _ => "-".into(),
        };
        let pids = res["pids_current"].as_u64().map(|p| format!(" / {p} pids")).unwrap_or_default();
        s.push_str(&format!(
            "{:<7} {:<11} {:>8} {:>8} {:>6} {:>8} {:>6}  {:<22} {mem}{pids}\n",
            r["role"].as_str().unwrap_or("?"),
            r["state"].as_str().unwrap_or("?"),
            opt(&r["pid"]),
            r["uptime_s"].as_u64().map(duration).unwrap_or_else(|| "-".into()),
            opt(&r["starts"]),
            opt(&r["restarts"]),
            opt(&r["generation"]),
            pre,
        ));
        if let Some(n) = r["output_dropped_lines"].as_u64().filter(|n| *n > 0) {
            s.push_str(&format!("        ({n} output lines dropped over the rate limit)\n"));
        }
    }
    let mut ups: Vec<Value> = v["egress"].as_array().cloned().unwrap_or_default();
    if let Some(e) = v["engine_forwarding"].as_object() {
        let mut e = Value::Object(e.clone());
        e["upstream"] = Value::from("node -> engine");
        ups.push(e);
    }
    if !ups.is_empty() {
        s.push_str(&format!(
            "\n{:<28} {:>7} {:>6} {:>11} {:>11} {:>8} {:>7}\n",
            "FORWARDING", "CONNS", "ACTIVE", "UP", "DOWN", "REFUSED", "FAILED"
        ));
        for u in ups {
            let n = |k: &str| u[k].as_u64().unwrap_or(0);
            s.push_str(&format!(
                "{:<28} {:>7} {:>6} {:>11} {:>11} {:>8} {:>7}\n",
                u["upstream"].as_str().unwrap_or("?"),
                n("accepted"),
                n("active"),
                bytes(n("bytes_up") as f64),
                bytes(n("bytes_down") as f64),
                n("refused_over_limit"),
                n("connect_failed"),
            ));
        }
    }
    if let Some(r) = v["reload"].as_object() {
        s.push_str(&format!("\nlast reload: {}\n", Value::Object(r.clone())));
    }
    s
}
