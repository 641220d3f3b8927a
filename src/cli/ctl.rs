//! `sealnode ctl`: a request to the running supervisor over its control socket, shown as a
//! table (status), JSON (`--json`) or Prometheus text (metrics).

use std::path::{Path, PathBuf};

use sealnode::config::Config;

use super::{Failure, Outcome};

/// What to do with the answer.
pub enum Show {
    Status { json: bool },
    Recycle { json: bool },
    Metrics { textfile: Option<PathBuf> },
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
    let path = socket(target)?;
    let verb = match show {
        Show::Recycle { .. } => "recycle",
        _ => "status",
    };
    let v = match sealnode::control::client(&path, verb) {
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
    let json = matches!(show, Show::Status { json: true } | Show::Recycle { json: true });
    if !ok && !json {
        // A refusal in words, as every other failure (the JSON with --json).
        let why = v["error"].as_str().unwrap_or("the supervisor refused the request");
        return Err(Failure::general(format!("ctl {verb}: {}", sealnode::log::clean(why.as_bytes()))));
    }
    match show {
        Show::Status { json: false } => print!("{}", sealnode::status_text::render(&v)),
        Show::Recycle { json: false } => {
            println!("recycled: both roles restarted through the gate, receipt generation {}", v["generation"])
        }
        Show::Metrics { textfile } => {
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
