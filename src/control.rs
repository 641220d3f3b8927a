//! The control socket: a unix socket in the runtime dir. Every connection's peer uid is
//! checked with SO_PEERCRED against `cell.control_uids`; then exactly one request line of
//! strict JSON (at most [`MAX_REQUEST`] bytes, unknown fields refused) gets one response line.
//!
//! Requests: `{"cmd":"status"}`, `{"cmd":"recycle"}`, `{"cmd":"attest","nonce":"<hex>"}`
//! (docs/control.md).

use std::io::{BufRead, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;
use serde_json::{json, Value};

use crate::config::Config;
use crate::error::{Error, Result};

pub const SOCKET: &str = "control.sock";
/// Largest request line accepted, newline included.
pub const MAX_REQUEST: usize = 4096;
/// How long a client may take to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    Status,
    Recycle,
    /// A signed statement over the current generation and this nonce (lowercase hex).
    Attest {
        nonce: String,
    },
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    cmd: String,
    nonce: Option<String>,
}

/// Parse one request line. Pure: no I/O.
pub fn parse(line: &[u8]) -> std::result::Result<Request, String> {
    if line.len() > MAX_REQUEST {
        return Err(format!("request too large (more than {MAX_REQUEST} bytes)"));
    }
    let text = std::str::from_utf8(line).map_err(|_| "request is not UTF-8".to_string())?;
    let w: Wire =
        serde_json::from_str(text.trim_end_matches(['\n', '\r'])).map_err(|e| format!("malformed request: {e}"))?;
    match (w.cmd.as_str(), w.nonce) {
        ("status", None) => Ok(Request::Status),
        ("recycle", None) => Ok(Request::Recycle),
        ("attest", Some(n)) => crate::attest::parse_nonce(&n).map(|nonce| Request::Attest { nonce }),
        ("attest", None) => Err("attest needs a nonce: {\"cmd\":\"attest\",\"nonce\":\"<hex>\"}".into()),
        ("status" | "recycle", Some(_)) => Err(format!("{} takes no nonce", w.cmd)),
        (other, _) => Err(format!("unknown command {other:?} (known: status, recycle, attest)")),
    }
}

pub fn error(msg: impl Into<String>) -> Value {
    json!({ "ok": false, "error": msg.into() })
}

pub fn socket_path(cfg: &Config) -> PathBuf {
    cfg.cell.runtime_dir.join(SOCKET)
}

/// Control connections accepted per wake-up of the event loop (the rest wait in the backlog).
pub const ACCEPTS_PER_WAKEUP: usize = 32;
/// Most control connections served at once; more are answered "busy".
pub const MAX_CLIENTS: usize = 16;

/// Add bytes a client sent; returns the request once a whole line (or too much) arrived.
/// Pure: the supervisor reads non-blocking and never waits for a client.
pub fn feed(buf: &mut Vec<u8>, new: &[u8]) -> Option<std::result::Result<Request, String>> {
    buf.extend_from_slice(new);
    if let Some(end) = buf.iter().position(|b| *b == b'\n') {
        return Some(parse(&buf[..=end]));
    }
    if buf.len() > MAX_REQUEST {
        return Some(Err(format!("request too large (more than {MAX_REQUEST} bytes)")));
    }
    None
}

/// Send one response line without ever blocking the supervisor (a response is a few hundred
/// bytes; a client that does not read it loses it).
pub fn respond(stream: &mut UnixStream, v: &Value) {
    let mut s = v.to_string();
    s.push('\n');
    let _ = stream.set_nonblocking(true);
    let _ = stream.write_all(s.as_bytes());
}

/// The peer's uid (SO_PEERCRED).
pub fn peer_uid(stream: &UnixStream) -> Option<u32> {
    nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials).ok().map(|c| c.uid())
}

/// `sealnode ctl`: send one request, return the response.
pub fn client(path: &Path, cmd: &str) -> Result<Value> {
    request(path, &json!({ "cmd": cmd }))
}

/// How long a client waits for its answer.
pub const CLIENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);
/// The longest answer a client reads.
pub const MAX_RESPONSE: u64 = 16 << 20;

/// Send one request (a JSON object), return the response.
pub fn request(path: &Path, req: &Value) -> Result<Value> {
    let mut s = UnixStream::connect(path).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                " (is `sealnode run` running with this config? `systemctl status sealnode` says)"
            }
            std::io::ErrorKind::PermissionDenied => " (only root and cell.control_uids may use it)",
            _ => "",
        };
        Error::io(format!("connect {}{hint}", path.display()), e)
    })?;
    // A refused peer is answered at once, without its request being read: the write may then
    // fail (EPIPE) while the answer is already waiting to be read.
    // Bounded (found by review): a socket that never answers, or answers without end, must
    // not hang `ctl` or a metrics scrape, nor grow it without limit. Generous: an attest
    // request waits for the TPM's quote.
    let _ = s.set_read_timeout(Some(CLIENT_TIMEOUT));
    let _ = s.set_write_timeout(Some(CLIENT_TIMEOUT));
    let sent = s.write_all(format!("{req}\n").as_bytes());
    let mut line = String::new();
    std::io::BufReader::new(std::io::Read::take(s, MAX_RESPONSE))
        .read_line(&mut line)
        .map_err(|e| Error::io("read response", e))?;
    if line.len() as u64 >= MAX_RESPONSE && !line.ends_with('\n') {
        return Err(Error::io("read response", std::io::Error::other(format!("longer than {MAX_RESPONSE} bytes"))));
    }
    if line.is_empty() {
        return Err(Error::io("no response", sent.err().unwrap_or_else(|| std::io::ErrorKind::UnexpectedEof.into())));
    }
    serde_json::from_str(&line).map_err(|e| Error::io("parse response", std::io::Error::other(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_strictly() {
        assert_eq!(parse(b"{\"cmd\":\"status\"}\n"), Ok(Request::Status));
        assert_eq!(parse(b"{\"cmd\":\"recycle\"}"), Ok(Request::Recycle));
        assert!(parse(b"{\"cmd\":\"reboot\"}\n").unwrap_err().contains("unknown command"));
        assert!(parse(b"{\"cmd\":\"status\",\"x\":1}\n").unwrap_err().contains("unknown field"));
        assert!(parse(b"status\n").unwrap_err().contains("malformed"));
        assert!(parse(b"{}\n").unwrap_err().contains("malformed"));
        assert!(parse(&[0xff, 0xfe, b'\n']).unwrap_err().contains("UTF-8"));
        assert!(parse(&vec![b' '; MAX_REQUEST + 1]).unwrap_err().contains("too large"));
        let mut buf = Vec::new();
        assert_eq!(feed(&mut buf, b"{\"cmd\":"), None);
        assert_eq!(feed(&mut buf, b"\"status\"}\nrest"), Some(Ok(Request::Status)));
        let mut buf = Vec::new();
        assert!(feed(&mut buf, &vec![b'x'; MAX_REQUEST + 1]).is_some_and(|r| r.is_err()));
    }

    /// Found by review: an answer without end grew `ctl` without limit.
    #[test]
    fn an_endless_answer_is_cut_and_refused() {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("control.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().expect("accept");
            let chunk = vec![b'x'; 1 << 20];
            // Until the client hangs up (past the cap it stops reading).
            while c.write_all(&chunk).is_ok() {}
        });
        let e = client(&path, "status").expect_err("endless");
        assert!(e.to_string().contains(&format!("longer than {MAX_RESPONSE} bytes")), "{e}");
        server.join().expect("server");
    }
}
