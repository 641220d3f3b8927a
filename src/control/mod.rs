//! The control socket: a unix socket in the runtime dir. Every connection's peer uid is
//! checked with SO_PEERCRED against `cell.control_uids`; then exactly one request line of
//! strict JSON (at most [`MAX_REQUEST`] bytes, unknown fields refused) gets one response line.
//! Both ends are here: the supervisor's (read a request without waiting, answer without
//! blocking) and the client's (`ctl`, `attest --nonce`: one request, one answer, bounded).
//!
//! What the lines hold is `control::protocol`'s: the request and every answer as types that
//! both ends use (docs/control.md). A module of its own because it is pure data: the
//! renderers of the status answer (`status_text`, `metrics`) and the fuzz entries depend on it
//! and not on the socket, and it depends on the modules whose data the status carries
//! (`sealed_text`, `egress`, `cgroup`, `attest`), which this transport does not need.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;
use serde_json::Value;

use crate::config::Config;
use crate::error::{Error, Result};

pub mod metrics;
pub mod protocol;
pub mod status_text;

pub use protocol::{parse, Refusal, Reply, Request, MAX_REQUEST};

pub const SOCKET: &str = "control.sock";
/// How long a client may take to send its request.
pub const READ_TIMEOUT: Duration = Duration::from_secs(2);

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

/// Send one response line (any answer: a `protocol` type, or JSON) without ever blocking the
/// supervisor (a response is a few KiB; a client that does not read it loses it).
pub fn respond<T: Serialize + ?Sized>(stream: &mut UnixStream, answer: &T) {
    // Only a map with keys that are not strings, or a path that is not UTF-8, fails to
    // serialize: the client then learns that much rather than nothing.
    let mut s = serde_json::to_string(answer).unwrap_or_else(|e| {
        serde_json::Value::from(Refusal::new(format!("internal error: the answer cannot be written: {e}"))).to_string()
    });
    s.push('\n');
    let _ = stream.set_nonblocking(true);
    let _ = stream.write_all(s.as_bytes());
}

/// The peer's uid (SO_PEERCRED).
pub fn peer_uid(stream: &UnixStream) -> Option<u32> {
    nix::sys::socket::getsockopt(stream, nix::sys::socket::sockopt::PeerCredentials).ok().map(|c| c.uid())
}

/// Why a peer of uid `uid` (None: its credentials could not be read) is refused, if it is:
/// a uid not in `allowed`, or the overflow uid of a user namespace that leaves host uids
/// unmapped, whatever `allowed` says, since every unmapped host user connects as it
/// (os::overflow; the config's check refuses such a `cell.control_uids` first).
pub fn peer_refused(uid: Option<u32>, allowed: &[u32], ov: &crate::os::overflow::Overflow) -> Option<String> {
    match uid {
        None => Some(format!("uid {} is not allowed", u32::MAX)),
        Some(u) if ov.ambiguous_uid(u) => Some(format!(
            "uid {u} is not allowed: it is the overflow uid, which every host user this user namespace does not map connects as"
        )),
        Some(u) if !allowed.contains(&u) => Some(format!("uid {u} is not allowed")),
        Some(_) => None,
    }
}

/// One answer as a client got it: read into its type, and as it came (`ctl --json` shows it
/// as is, fields this client does not know included).
#[derive(Debug)]
pub struct Answer<T> {
    pub reply: Reply<T>,
    pub json: Value,
}

/// `sealnode ctl`, `attest --nonce`: send one request, read the answer as `T` (or a refusal).
pub fn client<T: DeserializeOwned>(path: &Path, req: &Request) -> Result<Answer<T>> {
    client_within(path, req, CLIENT_TIMEOUT)
}

/// [`client`], the whole exchange within `limit`.
pub fn client_within<T: DeserializeOwned>(path: &Path, req: &Request, limit: std::time::Duration) -> Result<Answer<T>> {
    let json = request_within(path, req, limit)?;
    let reply = Reply::from_value(json.clone()).map_err(|e| peer_error("parse response", e))?;
    Ok(Answer { reply, json })
}

/// An error whose text quotes the peer's answer (serde's quotes the value it could not read):
/// escaped, so an answer cannot put terminal escapes or line breaks on the caller's stderr.
pub fn peer_error(what: &str, e: impl std::fmt::Display) -> Error {
    Error::io(what, std::io::Error::other(crate::os::escape::clean(e.to_string().as_bytes())))
}

/// How long a client waits for its whole answer.
pub const CLIENT_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// How long `ctl recycle` waits for its answer with `cfg`: what the recycle may take by the
/// config's own bounds (the drain, the node's and the engine's grace periods and a wipe's,
/// the preflight, the engine's readiness), and a minute for the rest (measuring, the gate's
/// other steps): never less than [`CLIENT_TIMEOUT`].
pub fn recycle_wait(cfg: &crate::config::Config) -> std::time::Duration {
    let c = &cfg.cell;
    recycle_wait_for(c.drain_timeout_s, c.stop_timeout_s, c.preflight_timeout_s, cfg.engine.ready().timeout_s)
}

fn recycle_wait_for(drain_s: u64, stop_s: u64, preflight_s: u64, ready_s: u64) -> std::time::Duration {
    let bounds = drain_s + 3 * stop_s + preflight_s + ready_s;
    CLIENT_TIMEOUT + std::time::Duration::from_secs(bounds)
}
/// The longest answer a client reads.
pub const MAX_RESPONSE: u64 = 16 << 20;

/// Connect to the control socket within `limit`: a connect to a socket whose queue is full
/// waits for room, as long as the socket's send timeout allows (Linux), so that timeout is set
/// before the connect (tests: a_full_queue_is_given_up_at_the_deadline).
fn connect_within(path: &Path, limit: std::time::Duration) -> std::io::Result<UnixStream> {
    use nix::sys::socket::{connect, setsockopt, socket, sockopt, AddressFamily, SockFlag, SockType, UnixAddr};
    let fd = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    let tv = nix::sys::time::TimeVal::new(limit.as_secs() as i64, limit.subsec_micros() as i64);
    setsockopt(&fd, sockopt::SendTimeout, &tv)?;
    let addr = UnixAddr::new(path)?;
    connect(std::os::fd::AsRawFd::as_raw_fd(&fd), &addr)?;
    Ok(UnixStream::from(fd))
}

/// Send one request, return the answer's JSON, unread.
pub fn request(path: &Path, req: &Request) -> Result<Value> {
    request_within(path, req, CLIENT_TIMEOUT)
}

/// [`request`], the whole exchange within `limit`: an answer that comes a byte at a time
/// cannot keep the client waiting longer (tests: a_dripping_answer_is_cut_at_the_deadline).
pub fn request_within(path: &Path, req: &Request, limit: std::time::Duration) -> Result<Value> {
    let deadline = std::time::Instant::now() + limit;
    let mut s = connect_within(path, limit).map_err(|e| {
        let hint = match e.kind() {
            std::io::ErrorKind::NotFound | std::io::ErrorKind::ConnectionRefused => {
                " (is `sealnode run` running with this config? `systemctl status sealnode` says)"
            }
            std::io::ErrorKind::PermissionDenied => " (only root and cell.control_uids may use it)",
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut => &format!(
                " (not accepted within {} s: its queue is full, or sealnode is not serving it)",
                limit.as_secs_f64()
            ),
            _ => "",
        };
        Error::io(format!("connect {}{hint}", path.display()), e)
    })?;
    // A refused peer is answered at once, without its request being read: the write may then
    // fail (EPIPE) while the answer is already waiting to be read.
    // Bounded: a socket that never answers, or answers without end, must not hang `ctl` or a
    // metrics scrape, nor grow it without limit (tests: an_endless_answer_is_cut_and_refused
    // below). Generous: an attest request waits for the TPM's quote.
    let _ = s.set_write_timeout(Some(deadline.saturating_duration_since(std::time::Instant::now())));
    let req = serde_json::to_string(req).map_err(|e| Error::io("write request", std::io::Error::other(e)))?;
    let sent = s.write_all(format!("{req}\n").as_bytes());
    let mut line: Vec<u8> = Vec::new();
    let mut chunk = [0u8; 65536];
    let mut ended = false;
    while !ended {
        if line.len() as u64 >= MAX_RESPONSE {
            return Err(Error::io("read response", std::io::Error::other(format!("longer than {MAX_RESPONSE} bytes"))));
        }
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        if left.is_zero() {
            let why = format!("no complete answer within {} s", limit.as_secs_f64());
            return Err(Error::io("read response", std::io::Error::new(std::io::ErrorKind::TimedOut, why)));
        }
        // Each read waits at most for what is left of the whole exchange's time.
        let _ = s.set_read_timeout(Some(left));
        let n = match std::io::Read::read(&mut s, &mut chunk) {
            Ok(n) => n,
            // Interrupted, or this read's timeout ran out (the deadline is checked above).
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::Interrupted | std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                continue
            }
            Err(e) => return Err(Error::io("read response", e)),
        };
        if n == 0 {
            break;
        }
        // Only the new bytes are looked at: a long answer is not scanned again at each read.
        ended = chunk[..n].contains(&b'\n');
        line.extend_from_slice(&chunk[..n]);
    }
    if line.is_empty() {
        return Err(Error::io("no response", sent.err().unwrap_or_else(|| std::io::ErrorKind::UnexpectedEof.into())));
    }
    let end = line.iter().position(|b| *b == b'\n').unwrap_or(line.len());
    if end as u64 > MAX_RESPONSE {
        return Err(Error::io("read response", std::io::Error::other(format!("longer than {MAX_RESPONSE} bytes"))));
    }
    serde_json::from_slice(&line[..end]).map_err(|e| peer_error("parse response", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A control socket path in a fresh temp dir (kept while the first value lives), listening.
    fn listening() -> (tempfile::TempDir, std::path::PathBuf, std::os::unix::net::UnixListener) {
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("control.sock");
        let listener = std::os::unix::net::UnixListener::bind(&path).expect("bind");
        (dir, path, listener)
    }

    /// The overflow uid of a namespace that leaves uids unmapped is refused even where the
    /// allowlist names it (any unmapped host user connects as it); in the initial namespace it
    /// is the user it is, admitted where listed.
    #[test]
    fn the_overflow_uid_is_no_peer_where_uids_are_unmapped() {
        use crate::os::overflow::Overflow;
        let partial = Overflow { uid: 65534, gid: 65534, every_uid_mapped: false, every_gid_mapped: false };
        let initial = Overflow { every_uid_mapped: true, every_gid_mapped: true, ..partial };
        let why = peer_refused(Some(65534), &[65534], &partial).expect("refused");
        assert!(why.contains("overflow uid"), "{why}");
        assert_eq!(peer_refused(Some(65534), &[65534], &initial), None);
        assert_eq!(peer_refused(Some(1000), &[1000], &partial), None);
        assert!(peer_refused(Some(1001), &[1000], &partial).is_some_and(|w| w == "uid 1001 is not allowed"));
        assert!(peer_refused(None, &[1000], &initial).is_some());
    }

    /// A request fed in pieces is the same request (the strict parse itself: protocol's tests).
    #[test]
    fn requests_are_fed_in_pieces() {
        let mut buf = Vec::new();
        assert_eq!(feed(&mut buf, b"{\"cmd\":"), None);
        assert_eq!(feed(&mut buf, b"\"status\"}\nrest"), Some(Ok(Request::Status)));
        let mut buf = Vec::new();
        assert!(feed(&mut buf, &vec![b'x'; MAX_REQUEST + 1]).is_some_and(|r| r.is_err()));
    }

    /// An answer that comes a byte at a time is cut at the exchange's deadline: the read
    /// timeout alone is per read, and each byte would restart it.
    #[test]
    fn a_dripping_answer_is_cut_at_the_deadline() {
        let (_dir, path, listener) = listening();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().expect("accept");
            // Until the client hangs up.
            while c.write_all(b"x").is_ok() {
                std::thread::sleep(std::time::Duration::from_millis(50));
            }
        });
        let began = std::time::Instant::now();
        let e = request_within(&path, &Request::Status, std::time::Duration::from_secs(1)).expect_err("dripping");
        assert!(e.to_string().contains("no complete answer within 1 s"), "{e}");
        assert!(began.elapsed() < std::time::Duration::from_secs(20), "{:?}", began.elapsed());
        server.join().expect("server");
    }

    /// A socket whose queue is full (a supervisor that stopped accepting, and clients filling
    /// its backlog) is given up at the deadline too: a connect would wait for room without end.
    #[test]
    fn a_full_queue_is_given_up_at_the_deadline() {
        use nix::sys::socket::{bind, listen, socket, AddressFamily, Backlog, SockFlag, SockType, UnixAddr};
        let dir = tempfile::tempdir().expect("tmp");
        let path = dir.path().join("control.sock");
        let listener = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).expect("socket");
        bind(std::os::fd::AsRawFd::as_raw_fd(&listener), &UnixAddr::new(&path).expect("addr")).expect("bind");
        // Room for one waiting connection, which the filler takes; nothing is ever accepted.
        listen(&listener, Backlog::new(0).expect("backlog")).expect("listen");
        let _filler = UnixStream::connect(&path).expect("the one waiting connection");
        let began = std::time::Instant::now();
        let e = request_within(&path, &Request::Status, std::time::Duration::from_secs(1)).expect_err("full queue");
        assert!(e.to_string().contains("not accepted within 1 s"), "{e}");
        assert!(began.elapsed() < std::time::Duration::from_secs(20), "{:?}", began.elapsed());
    }

    /// An answer the client cannot read is said without its terminal escapes or line breaks
    /// (serde's message quotes the value).
    #[test]
    fn an_unreadable_answer_is_said_escaped() {
        let (_dir, path, listener) = listening();
        let server = std::thread::spawn(move || {
            for answer in [&b"{\"ok\":true,\"roles\":\"\\u001b[2J\\nsealnode: forged\"}\n"[..], b"\x1b[2J not json\n"] {
                let (mut c, _) = listener.accept().expect("accept");
                c.write_all(answer).expect("answer");
            }
        });
        let typed = client::<protocol::Status>(&path, &Request::Status).expect_err("not a status").to_string();
        let raw = request(&path, &Request::Status).expect_err("not JSON").to_string();
        server.join().expect("server");
        for e in [typed, raw] {
            assert!(e.contains("parse response") && !e.contains('\x1b') && !e.contains('\n'), "{e:?}");
        }
    }

    /// An answer without end is cut at MAX_RESPONSE and refused: `ctl` does not grow with it.
    #[test]
    fn an_endless_answer_is_cut_and_refused() {
        let (_dir, path, listener) = listening();
        let server = std::thread::spawn(move || {
            let (mut c, _) = listener.accept().expect("accept");
            let chunk = vec![b'x'; 1 << 20];
            // Until the client hangs up (past the cap it stops reading).
            while c.write_all(&chunk).is_ok() {}
        });
        let e = client::<protocol::Status>(&path, &Request::Status).expect_err("endless");
        assert!(e.to_string().contains(&format!("longer than {MAX_RESPONSE} bytes")), "{e}");
        server.join().expect("server");
    }

    /// One exchange end to end: the request line the client writes is the one the supervisor
    /// parses, and what `respond` writes (typed or as JSON) the client reads back as sent.
    #[test]
    fn a_request_and_its_answer_cross_the_socket() {
        let (_dir, path, listener) = listening();
        let server = std::thread::spawn(move || {
            for answer in 0..3 {
                let (mut c, _) = listener.accept().expect("accept");
                let mut line = String::new();
                std::io::BufRead::read_line(&mut std::io::BufReader::new(&c), &mut line).expect("request");
                let got = parse(line.as_bytes());
                match answer {
                    0 => respond(&mut c, &protocol::tests::sample()),
                    1 => respond(&mut c, &Refusal::new(format!("{got:?}"))),
                    _ => respond(&mut c, &Refusal::new(format!("{got:?}"))),
                }
            }
        });
        let a = client::<protocol::Status>(&path, &Request::Status).expect("status");
        assert_eq!(a.reply, Reply::Ok(protocol::tests::sample()));
        assert_eq!(a.json, serde_json::from_str::<Value>(protocol::tests::STATUS).expect("json"));
        let nonce = "00112233445566ff".to_string();
        for _ in 0..2 {
            let a = client::<protocol::Attested>(&path, &Request::Attest { nonce: nonce.clone() }).expect("answer");
            assert_eq!(a.reply, Reply::Refused(Refusal::new(format!("Ok(Attest {{ nonce: {nonce:?} }})"))));
        }
        server.join().expect("server");
    }

    /// A recycle's client waits as long as the config lets the recycle take, plus a minute;
    /// never less than any other request (the live review of #29's drain: a 70 s drain outlived
    /// the 60 s wait while the recycle went on to complete).
    #[test]
    fn a_recycle_waits_as_long_as_the_config_lets_it_take() {
        use std::time::Duration;
        assert_eq!(super::recycle_wait_for(0, 1, 1, 1), super::CLIENT_TIMEOUT + Duration::from_secs(5));
        // The defaults: drain 10, stop 10, preflight 30, ready 120.
        assert_eq!(super::recycle_wait_for(10, 10, 30, 120), Duration::from_secs(10 + 30 + 30 + 120 + 60));
        assert_eq!(super::recycle_wait_for(70, 2, 30, 60), Duration::from_secs(70 + 6 + 30 + 60 + 60));
    }
}
