//! Writing to the systemd journal with its native protocol (systemd.io/JOURNAL_NATIVE_PROTOCOL),
//! as a tracing layer. Written here rather than with tracing-journald for two things it does
//! not do: MESSAGE carries the event's fields as text too (`role stopped role=node code=143`,
//! what `journalctl -u sealnode` shows), and the socket is non-blocking, so a stalled journal
//! drops entries (counted) instead of blocking the supervisor. Every field is also a journal
//! field of its own (ROLE=node, CODE=143): `journalctl ROLE=node`, `-o json`.

use std::fmt::Write as _;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::field::{Field, Visit};
use tracing::{Event, Level, Subscriber};
use tracing_subscriber::layer::Context;

/// journald's native socket.
pub const SOCKET: &str = "/run/systemd/journal/socket";

/// Entries the journal did not take (its queue was full, or the entry too large).
static DROPPED: AtomicU64 = AtomicU64::new(0);

pub fn dropped() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// One layer: entries under `identifier`; `fields_in_message` appends the fields to MESSAGE
/// (sealnode's own events; a role's line is its own text alone).
pub struct Layer {
    socket: UnixDatagram,
    identifier: &'static str,
    fields_in_message: bool,
}

impl Layer {
    /// A layer whose socket reaches journald (an empty datagram, which journald ignores, is
    /// sent to check), non-blocking.
    pub fn new(identifier: &'static str, fields_in_message: bool) -> std::io::Result<Layer> {
        let socket = UnixDatagram::unbound()?;
        socket.set_nonblocking(true)?;
        socket.send_to(&[], SOCKET)?;
        Ok(Layer { socket, identifier, fields_in_message })
    }
}

/// A field name as journald takes it: upper case letters, digits and `_`, not starting with
/// `_` or a digit (those are journald's own).
fn journal_name(name: &str) -> Option<String> {
    let n: String =
        name.chars().map(|c| if c.is_ascii_alphanumeric() { c.to_ascii_uppercase() } else { '_' }).collect();
    (!n.is_empty() && !n.starts_with('_') && !n.starts_with(|c: char| c.is_ascii_digit())).then_some(n)
}

/// `KEY=value\n`, or for a value with a newline the binary form: `KEY\n`, its length as
/// 64-bit little endian, the value, `\n`.
fn put(buf: &mut Vec<u8>, key: &str, value: &[u8]) {
    buf.extend_from_slice(key.as_bytes());
    if value.contains(&b'\n') {
        buf.push(b'\n');
        buf.extend_from_slice(&(value.len() as u64).to_le_bytes());
    } else {
        buf.push(b'=');
    }
    buf.extend_from_slice(value);
    buf.push(b'\n');
}

#[derive(Default)]
struct Fields {
    message: String,
    rest: Vec<(String, String)>,
}

impl Visit for Fields {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        self.record(field, format!("{value:?}"));
    }
    fn record_str(&mut self, field: &Field, value: &str) {
        self.record(field, value.to_string());
    }
}

impl Fields {
    fn record(&mut self, field: &Field, value: String) {
        match field.name() {
            "message" => self.message = value,
            // log::say's marker: the message is already the whole sentence.
            "human" => {}
            name => self.rest.push((name.to_string(), value)),
        }
    }
}

fn priority(level: &Level) -> &'static [u8] {
    match *level {
        Level::ERROR => b"3",
        Level::WARN => b"4",
        Level::INFO => b"5",
        Level::DEBUG => b"6",
        Level::TRACE => b"7",
    }
}

impl<S: Subscriber> tracing_subscriber::Layer<S> for Layer {
    fn on_event(&self, event: &Event<'_>, _ctx: Context<'_, S>) {
        let mut f = Fields::default();
        event.record(&mut f);
        let mut message = f.message;
        if self.fields_in_message {
            for (k, v) in &f.rest {
                let _ = write!(message, " {k}={v}");
            }
        }
        let mut buf = Vec::with_capacity(256 + message.len());
        put(&mut buf, "PRIORITY", priority(event.metadata().level()));
        put(&mut buf, "SYSLOG_IDENTIFIER", self.identifier.as_bytes());
        put(&mut buf, "MESSAGE", message.as_bytes());
        for (k, v) in &f.rest {
            if let Some(name) = journal_name(k) {
                put(&mut buf, &name, v.as_bytes());
            }
        }
        // Never waits: a full journal queue (EAGAIN) or an entry too large drops it, counted.
        if self.socket.send_to(&buf, SOCKET).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn native_protocol_fields() {
        let mut b = Vec::new();
        put(&mut b, "MESSAGE", b"one line");
        put(&mut b, "MESSAGE", b"two\nlines");
        let mut want = b"MESSAGE=one line\nMESSAGE\n".to_vec();
        want.extend_from_slice(&9u64.to_le_bytes());
        want.extend_from_slice(b"two\nlines\n");
        assert_eq!(b, want);
        assert_eq!(journal_name("memory_max_mb").as_deref(), Some("MEMORY_MAX_MB"));
        assert_eq!(journal_name("_pid"), None);
        assert_eq!(journal_name("9x"), None);
    }
}
