//! Where sealnode's own events and its roles' output go: the systemd journal, natively, when
//! stderr is the journal (`JOURNAL_STREAM` names it); plain text on stderr otherwise.
//!
//! In the journal, sealnode's events carry their priority (error 3, warn 4, info 5, debug 6)
//! and their fields as journal fields (ROLE, PID, GENERATION, UPSTREAM, ...), under
//! SYSLOG_IDENTIFIER=sealnode; each role's lines are under their own identifier
//! (`sealnode-engine`, `sealnode-node`), so `journalctl -t sealnode-engine` is the engine's
//! output alone and no role line can pass for one of sealnode's. In text mode a role's line is
//! prefixed with `engine[PID]: ` and its control characters are escaped. With
//! `SEALNODE_LOG_FORMAT=json` (a container's log driver keeps JSON lines whole) every line is
//! one JSON object: sealnode's events on stderr with their fields, a role's lines on the
//! stream it wrote them to, with `role`, `pid`, `generation` and `stream`. Nothing here blocks:
//! text goes through logsink (lines dropped and counted when a reader stops reading), and the
//! journal's socket is non-blocking (journal.rs: entries dropped when the journal stalls).

use std::sync::OnceLock;

use crate::logging::logsink::{self, Out};

use tracing_subscriber::filter::{filter_fn, EnvFilter};
use tracing_subscriber::prelude::*;

use crate::config::Role;

/// The tracing targets role lines are sent to in journal mode (one journald layer each).
const ROLE_TARGET: [&str; 2] = ["sealnode::role::engine", "sealnode::role::node"];
/// And in JSON mode, by the stream the role wrote them to (one writer each).
const ROLE_STREAM_TARGET: [&str; 2] = ["sealnode::role::stdout", "sealnode::role::stderr"];

/// Where the log goes; decided once, by [`init`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sink {
    Journal,
    Text,
    /// JSON lines on stdout and stderr (`SEALNODE_LOG_FORMAT=json`).
    Json,
}

/// The format asked for by `SEALNODE_LOG_FORMAT` (unset: text, or the journal when stderr is
/// the journal); an unknown value is an error that names it.
fn asked_format() -> Result<Option<Sink>, String> {
    match std::env::var_os("SEALNODE_LOG_FORMAT") {
        None => Ok(None),
        Some(v) => match v.to_str() {
            Some("text") => Ok(Some(Sink::Text)),
            Some("json") => Ok(Some(Sink::Json)),
            _ => Err(format!(
                "SEALNODE_LOG_FORMAT={}: unknown log format (text or json)",
                crate::os::escape::clean(v.as_encoded_bytes())
            )),
        },
    }
}

static SINK: OnceLock<Sink> = OnceLock::new();

/// The sink in use ([`Sink::Text`] before [`init`]).
pub fn sink() -> Sink {
    *SINK.get().unwrap_or(&Sink::Text)
}

/// Is fd 2 the journal stream systemd set up for this service? `JOURNAL_STREAM` is
/// "DEVICE:INODE" of that stream; a child that inherited the variable but has another stderr
/// must not take it as the journal (systemd.exec(5)).
fn stderr_is_journal() -> bool {
    let Some(v) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Some((dev, ino)) = v.to_str().and_then(|s| s.split_once(':')) else { return false };
    match nix::sys::stat::fstat(std::io::stderr()) {
        Ok(st) => dev.parse::<u64>().ok() == Some(st.st_dev) && ino.parse::<u64>().ok() == Some(st.st_ino),
        Err(_) => false,
    }
}

/// Logging, filtered by `SEALNODE_LOG` (else `default`): JSON lines when
/// `SEALNODE_LOG_FORMAT=json`; else to the journal when stderr is the journal and its socket
/// answers, else plain lines on stderr (colour only on a terminal). An unknown
/// `SEALNODE_LOG_FORMAT` is an error, before anything is logged or started.
pub fn init(default: &str) -> Result<(), String> {
    let asked = asked_format()?;
    logsink::init();
    let filter = || EnvFilter::try_from_env("SEALNODE_LOG").unwrap_or_else(|_| default.into());
    let own = || filter_fn(|m| !m.target().starts_with("sealnode::role::"));
    if asked == Some(Sink::Json) {
        let _ = SINK.set(Sink::Json);
        let stream = |t: &'static str| filter_fn(move |m| m.target() == t);
        let _ = tracing_subscriber::registry()
            .with(json_lines(Out::Stderr).with_filter(own()).with_filter(filter()))
            .with(json_lines(Out::Stdout).with_filter(stream(ROLE_STREAM_TARGET[0])))
            .with(json_lines(Out::Stderr).with_filter(stream(ROLE_STREAM_TARGET[1])))
            .try_init();
        return Ok(());
    }
    if asked.is_none() && stderr_is_journal() {
        // sealnode's own events with their fields in MESSAGE too; a role's line as it wrote it.
        let layers = (
            crate::logging::journal::Layer::new("sealnode", true),
            crate::logging::journal::Layer::new("sealnode-engine", false),
            crate::logging::journal::Layer::new("sealnode-node", false),
        );
        if let (Ok(main), Ok(engine), Ok(node)) = layers {
            let _ = SINK.set(Sink::Journal);
            let role = |t: &'static str| filter_fn(move |m| m.target() == t);
            let _ = tracing_subscriber::registry()
                .with(main.with_filter(own()).with_filter(filter()))
                .with(engine.with_filter(role(ROLE_TARGET[0])))
                .with(node.with_filter(role(ROLE_TARGET[1])))
                .try_init();
            return Ok(());
        }
    }
    let _ = SINK.set(Sink::Text);
    use std::io::IsTerminal;
    let _ = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(logsink::Writer(Out::Stderr))
                .with_ansi(std::io::stderr().is_terminal())
                .with_target(false)
                .with_filter(own())
                .with_filter(filter()),
        )
        .try_init();
    Ok(())
}

/// One JSON object per event, its fields flattened beside `timestamp`, `level`, `message`,
/// written to `out` without blocking (logsink).
fn json_lines<S>(out: Out) -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    tracing_subscriber::fmt::layer()
        .json()
        .flatten_event(true)
        .with_current_span(false)
        .with_span_list(false)
        .with_target(false)
        .with_writer(logsink::Writer(out))
}

/// What an operator must read, said once: at error priority in the journal (the event's
/// fields carry the rest), as a `sealnode: ` line on stderr otherwise.
pub fn say(message: &str) {
    match sink() {
        Sink::Journal | Sink::Json => tracing::error!(human = true, "{message}"),
        Sink::Text => logsink::line(Out::Stderr, format!("sealnode: {message}\n").as_bytes()),
    }
}

pub use crate::os::escape::{clean, invisible_or_reordering};

/// One role line, from its stdout (`err` false) or stderr: in the journal under the role's
/// own identifier, with ROLE, PID, GENERATION and STREAM; on sealnode's own stdout or stderr
/// with the `engine[PID]: ` prefix otherwise.
pub fn role_line(role: Role, pid: i32, generation: u64, err: bool, line: &str) {
    let stream = if err { "stderr" } else { "stdout" };
    match (sink(), role) {
        (Sink::Journal, Role::Engine) => {
            tracing::info!(target: "sealnode::role::engine", role = "engine", pid, generation, stream, "{line}")
        }
        (Sink::Journal, Role::Node) => {
            tracing::info!(target: "sealnode::role::node", role = "node", pid, generation, stream, "{line}")
        }
        // On the stream the role wrote it to, as one JSON object (the line escaped the JSON way).
        (Sink::Json, _) if err => {
            tracing::info!(target: "sealnode::role::stderr", role = role.name(), pid, generation, stream, "{line}")
        }
        (Sink::Json, _) => {
            tracing::info!(target: "sealnode::role::stdout", role = role.name(), pid, generation, stream, "{line}")
        }
        // A closed or full stdout/stderr never stops the supervisor (logsink).
        (Sink::Text, _) => {
            let out = if err { Out::Stderr } else { Out::Stdout };
            logsink::line(out, format!("{role}[{pid}]: {line}\n").as_bytes());
        }
    }
}
