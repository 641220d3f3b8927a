//! `sealnode ctl`: a request to the running supervisor over its control socket, shown as a
//! table (status), JSON (`--json`) or Prometheus text (metrics).

use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;

use sealnode::config::Config;
use sealnode::control::protocol::{Recycled, Status};
use sealnode::control::{self, Reply, Request};

use super::{Failure, Outcome};

/// What to do with the answer.
pub enum Show {
    Status {
        json: bool,
    },
    Recycle {
        json: bool,
    },
    Metrics {
        textfile: Option<PathBuf>,
    },
    /// A readiness probe: exit 0 when the cell serves, else 1 (an orchestrator's probe, a
    /// script waiting for the node).
    Ready,
}

/// Where the supervisor listens: `--socket`, else the config's `cell.runtime_dir`, read without
/// checking the rest of the config (a bad edit to a running cell's config must not cut the
/// operator off from it).
pub enum Target<'a> {
    Socket(&'a Path),
    Config(&'a Path),
}

fn socket(target: Target) -> Result<PathBuf, Failure> {
    match target {
        Target::Socket(p) => Ok(p.to_path_buf()),
        Target::Config(config) => {
            Config::runtime_dir_of(config).map(|d| d.join(sealnode::control::SOCKET)).map_err(|e| {
                Failure::setup(format!(
                    "{e}\n  (the running cell's socket: ctl --socket RUNTIME_DIR/{})",
                    sealnode::control::SOCKET
                ))
            })
        }
    }
}

pub fn ctl(target: Target, show: Show) -> Outcome {
    // A recycle's answer comes once both roles run again: its wait follows the config's bounds
    // (control::recycle_wait), read from the whole config (parsed, not checked); the plain
    // wait, said, when it cannot be read. Every other request reads only `cell.runtime_dir`.
    let config = match target {
        Target::Config(c) => Some(c),
        Target::Socket(_) => None,
    };
    let path = socket(target)?;
    let recycle_wait = match (&show, config) {
        (Show::Recycle { .. }, Some(c)) => match Config::read_for_client(c) {
            Ok(cfg) => control::recycle_wait(&cfg),
            Err(e) => {
                eprintln!(
                    "sealnode: note: the recycle's wait is {} s: its bounds in the config cannot be read:\n  {}",
                    control::CLIENT_TIMEOUT.as_secs(),
                    e.to_string().trim_end().replace('\n', "\n  ")
                );
                control::CLIENT_TIMEOUT
            }
        },
        _ => control::CLIENT_TIMEOUT,
    };
    match show {
        Show::Status { json } => {
            match ask::<Status>(&path, Request::Status, json, "status", control::CLIENT_TIMEOUT)? {
                Asked::Shown(code) => Ok(code),
                Asked::Read(s) => {
                    print!("{}", sealnode::control::status_text::render(&s));
                    Ok(sealnode::exit::OK)
                }
            }
        }
        Show::Ready => match ask::<Status>(&path, Request::Status, false, "status", control::CLIENT_TIMEOUT)? {
            Asked::Read(s) if s.ready => {
                println!("ready");
                Ok(sealnode::exit::OK)
            }
            Asked::Read(s) => Err(Failure::general(format!("not ready: {}", not_ready_because(&s)))),
            Asked::Shown(code) => Ok(code),
        },
        Show::Recycle { json } => match ask::<Recycled>(&path, Request::Recycle, json, "recycle", recycle_wait)? {
            Asked::Shown(code) => Ok(code),
            Asked::Read(r) => {
                let generation = r.generation.map_or("?".to_string(), |g| g.to_string());
                println!("recycled: both roles restarted through the gate, receipt generation {generation}");
                Ok(sealnode::exit::OK)
            }
        },
        Show::Metrics { textfile } => {
            // A scrape still gets an answer. No answer (or not JSON): sealnode_up 0; a refusal
            // (busy) or an answer of a shape this ctl cannot read: sealnode_up 1 and nothing
            // else (the supervisor did answer). Either way this command fails, saying why, and
            // the textfile no longer holds the last scrape's numbers.
            let answered = control::request(&path, &Request::Status);
            let read = answered
                .as_ref()
                .map_err(|e| e.to_string())
                .and_then(|v| {
                    Reply::<Status>::from_value(v.clone())
                        .map_err(|e| control::peer_error("parse response", e).to_string())
                })
                .and_then(|reply| refused_in_words(reply, "status").map_err(|f| f.message));
            let status = match read {
                Ok(status) => status,
                Err(e) => {
                    let down = sealnode::control::metrics::up_only(answered.is_ok());
                    match textfile {
                        Some(path) => {
                            let _ = write_textfile(&path, &down);
                        }
                        None => print!("{down}"),
                    }
                    return Err(Failure::general(e));
                }
            };
            let text = sealnode::control::metrics::render(&status);
            match textfile {
                // node_exporter's textfile collector reads *.prom files: written whole, atomically.
                Some(path) => write_textfile(&path, &text).map_err(|e| Failure::general(format!("metrics: {e}")))?,
                None => print!("{text}"),
            }
            Ok(sealnode::exit::OK)
        }
    }
}

/// Why a status says the cell does not serve: each role that is not running, or is held;
/// else the engine's readiness check, or a stop.
fn not_ready_because(s: &Status) -> String {
    let mut why: Vec<String> = s
        .roles
        .iter()
        .filter_map(|r| {
            let state = r.state.as_str();
            let held = r.pid_state.as_ref().filter(|p| p.held()).map(|p| p.as_str());
            match (state, held) {
                ("running", None) => None,
                ("running", Some("too-many-to-check")) => {
                    Some(format!("the {} has more processes and threads than a status reads", r.role))
                }
                ("running", Some(h)) => Some(format!("the {} is {h}", r.role)),
                (other, _) => Some(format!("the {} is {other}", r.role)),
            }
        })
        .collect();
    if let Some(last) = &s.engine_not_answering {
        why.push(format!(
            "the engine stopped answering its readiness check (last try: {})",
            sealnode::logging::log::clean(last.as_bytes())
        ));
    }
    if why.is_empty() {
        why.push("the engine has not answered its readiness check since its last start, or a stop is under way".into());
    }
    why.join(", ")
}

/// An answer `ctl` printed as it came (`--json`: exit 1 for a refusal), or read for showing.
enum Asked<T> {
    Shown(i32),
    Read(T),
}

/// Ask `request`; with `--json`, print the answer as it came (any field this `ctl` does not
/// know included), else read it (a refusal in words, exit 1).
fn ask<T: DeserializeOwned>(
    path: &Path,
    request: Request,
    json: bool,
    verb: &str,
    limit: std::time::Duration,
) -> Result<Asked<T>, Failure> {
    if json {
        // As it came, whatever its shape; the exit status is what reading it says, as without
        // --json: 0 only for the answer asked for (a `"recycled": false` is no recycle).
        let v = control::request_within(path, &request, limit).map_err(Failure::general)?;
        // As it came, but for what a terminal would act on (escaped the JSON way).
        println!("{}", sealnode::os::escape::json(&serde_json::to_string_pretty(&v).unwrap_or_default()));
        let ok = matches!(Reply::<T>::from_value(v), Ok(Reply::Ok(_)));
        return Ok(Asked::Shown(if ok { sealnode::exit::OK } else { sealnode::exit::FAILED }));
    }
    let a = control::client_within::<T>(path, &request, limit).map_err(Failure::general)?;
    refused_in_words(a.reply, verb).map(Asked::Read)
}

/// What was asked for, or the refusal in words, as every other failure.
fn refused_in_words<T>(reply: Reply<T>, verb: &str) -> Result<T, Failure> {
    match reply {
        Reply::Ok(t) => Ok(t),
        Reply::Refused(r) => {
            Err(Failure::general(format!("ctl {verb}: {}", sealnode::logging::log::clean(r.error.as_bytes()))))
        }
    }
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
        sealnode::os::sys::open_path_no_symlinks(dir).map_err(|e| format!("open {}: {}", dir.display(), e.desc()))?;
    let dirfd = nix::fcntl::openat(
        &walked,
        ".",
        nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| format!("open {}: {}", dir.display(), e.desc()))?;
    sealnode::os::atomic::write_atomic_at(&dirfd, name, text.as_bytes(), 0o644, &abs).map_err(|e| e.to_string())
}
