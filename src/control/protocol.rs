//! The control protocol's types: what a client asks ([`Request`]) and what the supervisor
//! answers ([`Status`], [`Recycled`], [`Attested`], or a [`Refusal`]), as both sides build and
//! read them (docs/control.md). Pure: no I/O; the socket is `control`'s.
//!
//! The wire form is docs/control.md's, field for field: the same names, a null where an
//! optional value is absent (`engine_ready_ms`, `gate`, a role's `pid`), a field left out only
//! where the doc says so (the statement's `why`, the reload's `error` or `config_sha256`); and
//! two fields the supervisor writes that the doc's table does not list, `log_dropped_lines`
//! and a role's `refused_syscalls`. JSON objects are unordered, so the order a type writes its
//! fields in carries nothing.
//!
//! Requests are read strictly ([`parse`]: unknown fields, unknown commands and a misplaced
//! nonce refused, each with the message docs/control.md lists). Answers are read liberally:
//! "within this protocol, response fields are only added", so a field this client does not know
//! is ignored, and a state word it does not know ([`RoleState`], [`StatementState`],
//! [`GatePurpose`]) is kept as `Other` rather than refused. A counter or part an answer lacks
//! (an older supervisor's, still running after a package upgrade replaced `ctl`) reads as its
//! default (a counter as 0), and a part of a shape this client cannot read (a role's
//! `preflight`, `sealed`, `resources`; the answer's `gate`, `reload`, `receipt`,
//! `engine_forwarding`) as absent, the `statement` as "unknown": only `ok`, `roles` and each
//! role's `role` and `state` are required. `ctl --json` prints the answer as it came.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use serde_json::Value;

use crate::config::Role;
use crate::egress::Stats;
use crate::proof::attest::Envelope;
use crate::proof::sealed_text::RoleSeal;
use crate::sandbox::cgroup::Usage;

/// Largest request line accepted, newline included.
pub const MAX_REQUEST: usize = 4096;

// ---- requests ----

/// One request: `{"cmd":"status"}`, `{"cmd":"recycle"}`, `{"cmd":"attest","nonce":"<hex>"}`.
/// Serialized by the client as that line; read by the supervisor through [`parse`] (the same
/// rules as its `Deserialize`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "Wire", into = "Wire")]
pub enum Request {
    Status,
    Recycle,
    /// A signed statement over the current generation and this nonce (lowercase hex).
    Attest {
        nonce: String,
    },
}

/// A request as it is on the wire, before its command and nonce are checked together.
#[derive(Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    cmd: String,
    /// Absent (None), or present: a `null` is a nonce given, and refused as one (found by
    /// review: `{"cmd":"status","nonce":null}` passed, where docs/control.md says status takes
    /// no nonce).
    #[serde(default, deserialize_with = "present", skip_serializing_if = "Option::is_none")]
    nonce: Option<Option<String>>,
}

/// A field that is there, whatever its value (`null` too).
fn present<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Option<String>>, D::Error> {
    Option::<String>::deserialize(d).map(Some)
}

impl TryFrom<Wire> for Request {
    type Error = String;
    fn try_from(w: Wire) -> Result<Self, String> {
        match (w.cmd.as_str(), w.nonce) {
            ("status", None) => Ok(Request::Status),
            ("recycle", None) => Ok(Request::Recycle),
            ("attest", Some(Some(n))) => crate::proof::attest::parse_nonce(&n).map(|nonce| Request::Attest { nonce }),
            ("attest", None | Some(None)) => {
                Err("attest needs a nonce: {\"cmd\":\"attest\",\"nonce\":\"<hex>\"}".into())
            }
            ("status" | "recycle", Some(_)) => Err(format!("{} takes no nonce", w.cmd)),
            (other, _) => Err(format!("unknown command {other:?} (known: status, recycle, attest)")),
        }
    }
}

impl From<Request> for Wire {
    fn from(r: Request) -> Wire {
        match r {
            Request::Status => Wire { cmd: "status".into(), nonce: None },
            Request::Recycle => Wire { cmd: "recycle".into(), nonce: None },
            Request::Attest { nonce } => Wire { cmd: "attest".into(), nonce: Some(Some(nonce)) },
        }
    }
}

/// Parse one request line. Pure: no I/O.
pub fn parse(line: &[u8]) -> Result<Request, String> {
    if line.len() > MAX_REQUEST {
        return Err(format!("request too large (more than {MAX_REQUEST} bytes)"));
    }
    let text = std::str::from_utf8(line).map_err(|_| "request is not UTF-8".to_string())?;
    // In two steps, so a JSON error says "malformed" and a wrong command or nonce says only what
    // is wrong (no position: the line is one object).
    let w: Wire =
        serde_json::from_str(text.trim_end_matches(['\n', '\r'])).map_err(|e| format!("malformed request: {e}"))?;
    Request::try_from(w)
}

// ---- answers ----

/// A JSON boolean that is always `V`: an answer's `"ok": true` (or a refusal's `false`), the
/// recycle answer's `"recycled": true`. Written as `Always` (`ok: Always`); reading any other
/// value refuses the answer as that type.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Always<const V: bool>;

impl<const V: bool> Serialize for Always<V> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_bool(V)
    }
}

impl<'de, const V: bool> Deserialize<'de> for Always<V> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        match bool::deserialize(d)? {
            b if b == V => Ok(Always),
            b => Err(serde::de::Error::custom(format!("expected {V}, found {b}"))),
        }
    }
}

/// An answer to one request: what was asked for, or the supervisor's refusal (told apart by
/// `ok`, which every answer has).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum Reply<T> {
    Ok(T),
    Refused(Refusal),
}

impl<T: DeserializeOwned> Reply<T> {
    /// Read an answer: `ok` first, then the type it says (so a broken answer is refused with
    /// the field that is wrong, not a "no variant matched").
    pub fn from_value(v: Value) -> Result<Self, serde_json::Error> {
        #[derive(Deserialize)]
        struct Said {
            ok: bool,
        }
        if Said::deserialize(&v)?.ok {
            T::deserialize(v).map(Reply::Ok)
        } else {
            Refusal::deserialize(v).map(Reply::Refused)
        }
    }
}

impl<'de, T: DeserializeOwned> Deserialize<'de> for Reply<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Reply::from_value(Value::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// Every refusal: `{"ok":false,"error":"..."}` (docs/control.md, "Errors").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Refusal {
    pub ok: Always<false>,
    pub error: String,
}

impl Refusal {
    pub fn new(error: impl Into<String>) -> Refusal {
        Refusal { ok: Always, error: error.into() }
    }
}

impl From<Refusal> for Value {
    /// The refusal as JSON, built without a serializer that could fail (its wire form, tested).
    fn from(r: Refusal) -> Value {
        let fields = [("ok".to_string(), Value::Bool(false)), ("error".to_string(), Value::String(r.error))];
        Value::Object(fields.into_iter().collect())
    }
}

/// `recycle`'s answer once done: `{"ok":true,"recycled":true,"generation":N}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recycled {
    pub ok: Always<true>,
    pub recycled: Always<true>,
    /// The new receipt's generation (none only without a receipt, which a recycle writes).
    pub generation: Option<u64>,
}

impl Recycled {
    pub fn new(generation: Option<u64>) -> Recycled {
        Recycled { ok: Always, recycled: Always, generation }
    }
}

/// `attest`'s answer: `{"ok":true,"envelope":{...}}`, a signed statement over the current
/// generation and the request's nonce (quoted by the TPM with `cell.tpm`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Attested {
    pub ok: Always<true>,
    pub envelope: Envelope,
}

impl Attested {
    pub fn new(envelope: Envelope) -> Attested {
        Attested { ok: Always, envelope }
    }
}

/// `status`'s answer (docs/control.md, the status row and the paragraphs below the table).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub ok: Always<true>,
    /// Seconds since `sealnode run` started.
    #[serde(default)]
    pub uptime_s: u64,
    /// The cell init's pid.
    #[serde(default)]
    pub cell_pid: i32,
    /// The cell serves now: both roles run (none of their processes stopped or traced), the
    /// engine answered its readiness check since its last start and its last recheck, and no
    /// stop is under way.
    #[serde(default)]
    pub ready: bool,
    /// The engine's last start to readiness, in ms; none before its first ready.
    pub engine_ready_ms: Option<f64>,
    /// What the last recheck of the ready engine saw, while it does not answer; none while it
    /// does (or before it was first ready).
    #[serde(default, deserialize_with = "lenient")]
    pub engine_not_answering: Option<String>,
    /// Seconds since the engine last answered its readiness check (its start's or a recheck):
    /// the age of the verdict `ready` stands on; none before its first answer since its start.
    /// With a TCP check the kernel's accept is the answer (a listening but wedged engine gets
    /// it too); an HTTP check asks the engine.
    #[serde(default, deserialize_with = "lenient")]
    pub engine_answered_ago_s: Option<f64>,
    /// Seconds the rechecks have waited in a row while the engine serves the node (under 60);
    /// none while they come at their pace.
    #[serde(default, deserialize_with = "lenient")]
    pub engine_rechecks_waiting_s: Option<f64>,
    /// Lines of sealnode's own log dropped rather than block the loop.
    #[serde(default)]
    pub log_dropped_lines: LogDropped,
    /// One per role, the engine first.
    pub roles: Vec<RoleStatus>,
    /// Each declared egress upstream's counters.
    #[serde(default)]
    pub egress: Vec<Stats>,
    /// The node's connections to the engine (the same counters); none without an engine port.
    #[serde(default, deserialize_with = "lenient")]
    pub engine_forwarding: Option<Stats>,
    /// The last SIGHUP's outcome; none if there was none.
    #[serde(default, deserialize_with = "lenient")]
    pub reload: Option<ReloadOutcome>,
    /// The pass through the gate in progress; none when none runs.
    #[serde(default, deserialize_with = "lenient")]
    pub gate: Option<GateProgress>,
    /// `attest` requests waiting for the TPM's quote.
    #[serde(default)]
    pub attest_waiting: usize,
    /// The last start's receipt; none before the first.
    #[serde(default, deserialize_with = "lenient")]
    pub receipt: Option<ReceiptSummary>,
    /// The published statement of the seal.
    #[serde(default = "StatementStatus::unknown", deserialize_with = "lenient_statement")]
    pub statement: StatementStatus,
}

/// sealnode's own log lines dropped (its stdout and stderr are written without blocking; the
/// journal's socket too).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct LogDropped {
    pub stdout: u64,
    pub stderr: u64,
    pub journal: u64,
}

/// One role in the status answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RoleStatus {
    pub role: Role,
    pub state: RoleState,
    /// The role's init (or, `wiping`, the wipe's child); none when nothing runs.
    pub pid: Option<i32>,
    /// What that process is doing (`stopped` or `traced`: something holds it; for a running
    /// role, also when the program its init runs is held).
    #[serde(default)]
    pub pid_state: Option<ProcessState>,
    /// Seconds since its current run started; none when nothing runs.
    pub uptime_s: Option<u64>,
    /// Restarts after it exited.
    #[serde(default)]
    pub restarts: u32,
    /// Starts since sealnode started (first, restarts, reloads, recycles).
    #[serde(default)]
    pub starts: u64,
    /// Lines of its output dropped over its rate limit.
    #[serde(default)]
    pub output_dropped_lines: u64,
    /// Refusals the denial log saw, per syscall name (all its runs); none without
    /// `log_refused_syscalls`.
    pub refused_syscalls: Option<BTreeMap<String, u64>>,
    /// The receipt generation of the gate its current (or next) start passed.
    pub generation: Option<u64>,
    /// That pass's preflight; none before its first pass.
    #[serde(default, deserialize_with = "lenient")]
    pub preflight: Option<Preflight>,
    /// What that admitted plan holds, layer by layer; none before its first pass.
    #[serde(default, deserialize_with = "lenient")]
    pub sealed: Option<RoleSeal>,
    /// Its cgroup leaf's usage; none without a leaf.
    #[serde(default, deserialize_with = "lenient")]
    pub resources: Option<Usage>,
}

/// A role's preflight in the pass that admitted it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Preflight {
    /// Always true: a role that did not pass has no pass to show.
    #[serde(default)]
    pub passed: bool,
    /// The whole pass's duration (its roles' probes run side by side).
    #[serde(default)]
    pub ms: u64,
    /// This role's own escape attempts (the receipt's count for it).
    #[serde(default)]
    pub attempts: usize,
    /// How many of them were refused; none when the pass's report is gone.
    pub refused: Option<usize>,
    /// Per layer name (docs/canary.md's `refused_by`), the attempts it answered; they add up
    /// to `refused`.
    pub refused_by: Option<BTreeMap<String, usize>>,
    /// When the pass admitted it (Unix seconds).
    #[serde(default)]
    pub at: u64,
}

/// The outcome of the last SIGHUP: `{"ok","at","config_sha256"}` applied, or
/// `{"ok":false,"at","error"}` refused (the cell kept running unchanged).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReloadOutcome {
    pub ok: bool,
    /// Unix seconds.
    pub at: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config_sha256: Option<String>,
}

impl ReloadOutcome {
    /// The new config passed its dry run; both roles restart with it.
    pub fn applied(at: u64, config_sha256: impl Into<String>) -> ReloadOutcome {
        ReloadOutcome { ok: true, at, error: None, config_sha256: Some(config_sha256.into()) }
    }
    /// The new config was refused (or the reload abandoned).
    pub fn refused(at: u64, error: impl Into<String>) -> ReloadOutcome {
        ReloadOutcome { ok: false, at, error: Some(error.into()), config_sha256: None }
    }
}

/// A pass through the gate in progress.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateProgress {
    pub purpose: GatePurpose,
    /// The roles it measures and probes.
    pub roles: Vec<Role>,
    /// How long it has run.
    pub ms: u64,
    /// What it still waits for: the measurement, a role's preflight probe.
    #[serde(default, deserialize_with = "lenient")]
    pub waiting_for: Option<Vec<GateWait>>,
}

/// A process a pass through the gate waits for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct GateWait {
    /// `measurement`, or `preflight <role>`.
    pub what: String,
    pub pid: i32,
    /// None once it is gone.
    pub state: Option<ProcessState>,
}

/// The last start's receipt.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReceiptSummary {
    pub path: String,
    pub generation: u64,
    /// Unix seconds.
    pub started_at: u64,
    pub canary_passed: bool,
}

impl StatementStatus {
    /// What an answer without a `statement` (an older supervisor's) reads as.
    pub fn unknown() -> StatementStatus {
        StatementStatus { state: StatementState::Other("unknown".into()), why: None, signed: false, tpm_quoted: false }
    }
}

/// A part of a role's answer this client cannot read (an older or newer supervisor's shape of
/// it) is read as absent: the rest of the answer still shows.
fn lenient<'de, D: Deserializer<'de>, T: DeserializeOwned>(d: D) -> Result<Option<T>, D::Error> {
    let v = Value::deserialize(d)?;
    Ok(serde_json::from_value(v).ok())
}

/// The statement's state, or "unknown" where it cannot be read.
fn lenient_statement<'de, D: Deserializer<'de>>(d: D) -> Result<StatementStatus, D::Error> {
    Ok(lenient(d)?.unwrap_or_else(StatementStatus::unknown))
}

/// The statement of the seal: `state`, `why` (only `missing` and `none` say), whether a key
/// signs it and whether the TPM quotes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StatementStatus {
    pub state: StatementState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
    #[serde(default)]
    pub signed: bool,
    #[serde(default)]
    pub tpm_quoted: bool,
}

/// A word of the protocol with a fixed set of values: an enum, with `Other` holding a value a
/// newer supervisor may send (written back as it came).
macro_rules! open_words {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident = $word:literal,)+ }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
        #[serde(from = "String", into = "String")]
        pub enum $name {
            $($(#[$vdoc])* $variant,)+
            /// A word this client does not know.
            Other(String),
        }

        impl $name {
            /// Every word this client knows, in the order shown.
            pub const KNOWN: &'static [$name] = &[$($name::$variant,)+];
            pub fn as_str(&self) -> &str {
                match self {
                    $($name::$variant => $word,)+
                    $name::Other(w) => w,
                }
            }
        }

        impl From<String> for $name {
            fn from(w: String) -> $name {
                match w.as_str() {
                    $($word => $name::$variant,)+
                    _ => $name::Other(w),
                }
            }
        }

        impl From<$name> for String {
            fn from(v: $name) -> String {
                match v {
                    $name::Other(w) => w,
                    known => known.as_str().to_string(),
                }
            }
        }
    };
}

open_words! {
    /// What a role is doing (docs/control.md, `state`).
    RoleState {
        Running = "running",
        /// Passing the gate: its program measured, its preflight.
        Starting = "starting",
        Stopping = "stopping",
        /// Waiting out a restart backoff.
        Restarting = "restarting",
        /// Its scratch being emptied before a start or after a stop.
        Wiping = "wiping",
        Down = "down",
    }
}

open_words! {
    /// The statement's state.
    StatementState {
        Published = "published",
        /// Signed, waiting for the TPM's quote.
        Quoting = "quoting",
        /// It should exist and does not (`why` says why).
        Missing = "missing",
        /// No attestation key: nothing is signed.
        None = "none",
    }
}

open_words! {
    /// What the kernel shows a process doing (the state letter of /proc/PID/stat): a process
    /// the supervisor waits on that is `stopped` (SIGSTOP) or `traced` (a debugger holds it)
    /// holds that wait until someone lets it go; `disk-wait` is I/O the kernel has not finished.
    ProcessState {
        Running = "running",
        Sleeping = "sleeping",
        DiskWait = "disk-wait",
        Stopped = "stopped",
        Traced = "traced",
        Zombie = "zombie",
        /// A running role with more processes and threads under its init than a status reads
        /// (4096 reads of /proc): one of those not read could be held, so it is not shown
        /// serving.
        TooMany = "too-many-to-check",
    }
}

impl ProcessState {
    /// From /proc/PID/stat's state letter.
    pub fn from_letter(c: char) -> ProcessState {
        match c {
            'R' => ProcessState::Running,
            'S' | 'I' => ProcessState::Sleeping,
            'D' => ProcessState::DiskWait,
            'T' => ProcessState::Stopped,
            't' => ProcessState::Traced,
            'Z' | 'X' => ProcessState::Zombie,
            c => ProcessState::Other(c.to_string()),
        }
    }

    /// Nothing moves until someone lets it go.
    /// Stopped or traced, or too many under it to tell (then held as far as anyone can see).
    pub fn held(&self) -> bool {
        matches!(self, ProcessState::Stopped | ProcessState::Traced | ProcessState::TooMany)
    }
}

open_words! {
    /// Why the gate runs.
    GatePurpose {
        /// A start (the first, a restart, a recycle).
        Start = "start",
        /// A SIGHUP's dry run of the new config.
        Reload = "reload",
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A status answer as the supervisor wrote it (`ctl status --json` on a rootful cell:
    /// tests/operator.rs's metrics cell), paths made neutral.
    pub const STATUS: &str = include_str!("../../tests/fixtures/control-status.json");
    /// The same from a cell with the denial log on the engine (`refused_syscalls`).
    pub const STATUS_DENYLOG: &str = include_str!("../../tests/fixtures/control-status-denylog.json");

    pub(crate) fn sample() -> Status {
        serde_json::from_str(STATUS).expect("the fixture is a status answer")
    }

    /// Read into the type and written back: the same JSON, every field, null and absence.
    fn round_trip<T: Serialize + DeserializeOwned>(text: &str) -> T {
        let v: Value = serde_json::from_str(text).expect("json");
        let t: T = serde_json::from_value(v.clone()).expect("reads into the type");
        assert_eq!(serde_json::to_value(&t).expect("writes"), v);
        t
    }

    /// An older supervisor's answer, still running after a package upgrade replaced `ctl`:
    /// counters it lacks read as 0, a role part of another shape as absent, and the answer
    /// still reads (monitoring keeps seeing the cell up).
    #[test]
    fn an_older_supervisors_answer_still_reads() {
        let v: Status = serde_json::from_str(
            r#"{"ok":true,"roles":[{"role":"engine","state":"running","pid":7,
                 "preflight":{"passed":true,"ms":5,"attempts":91},"sealed":{"user":1},"resources":"odd"}],
                 "statement":{"state":"published"},"receipt":{"path":"/r"},"egress":[{"upstream":"gw:1"}]}"#,
        )
        .expect("an older answer reads");
        let r = &v.roles[0];
        assert_eq!((r.state.as_str(), r.pid, r.restarts), ("running", Some(7), 0));
        // A preflight without `at` (supervisors before it was added) still shows its counts.
        assert_eq!(r.preflight.as_ref().map(|p| (p.ms, p.attempts, p.at)), Some((5, 91, 0)), "{r:?}");
        assert!(r.sealed.is_none() && r.resources.is_none(), "{r:?}");
        // A statement without `signed` and `tpm_quoted` (supervisors before them) keeps its state.
        assert_eq!((v.statement.state.as_str(), v.statement.signed), ("published", false));
        assert!(v.receipt.is_none(), "a receipt of another shape reads as absent");
        assert_eq!(v.egress[0].upstream, "gw:1");
        assert_eq!(v.uptime_s, 0);
        let none: Status = serde_json::from_str(r#"{"ok":true,"roles":[]}"#).expect("bare");
        assert_eq!(none.statement.state.as_str(), "unknown");
        // What stays required: ok, roles, each role's role and state.
        for bad in [r#"{"ok":true}"#, r#"{"ok":true,"roles":[{"role":"engine"}]}"#, r#"{"roles":[]}"#] {
            assert!(serde_json::from_str::<Status>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_real_status_answer_reads_and_writes_back_unchanged() {
        let s: Status = round_trip(STATUS);
        assert_eq!(s.roles.iter().map(|r| r.role).collect::<Vec<_>>(), Role::ALL);
        assert!(s.roles.iter().all(|r| r.state == RoleState::Running && r.sealed.is_some()));
        assert_eq!(s.statement.state, StatementState::None);
        assert_eq!(s.egress.len(), 1);
        assert!(s.engine_forwarding.is_some() && s.reload.is_none() && s.gate.is_none());
        let s: Status = round_trip(STATUS_DENYLOG);
        assert!(s.roles[0].refused_syscalls.as_ref().is_some_and(|m| m.get("bpf") >= Some(&1)));
        assert!(s.roles[1].refused_syscalls.is_none());
    }

    /// What the two captures leave at null, filled as the supervisor's status() fills it: a
    /// gate in progress, reloads both ways, a statement without `why`, cgroup usage.
    #[test]
    fn every_optional_part_reads_and_writes_back_unchanged() {
        let mut v: Value = serde_json::from_str(STATUS).expect("json");
        v["gate"] = serde_json::json!({ "purpose": "reload", "roles": ["engine", "node"], "ms": 12, "waiting_for": [{ "what": "measurement", "pid": 7001, "state": "stopped" }] });
        v["statement"] = serde_json::json!({ "state": "quoting", "signed": true, "tpm_quoted": true });
        v["reload"] = serde_json::json!({ "ok": false, "at": 1_700_000_000u64, "error": "cell.x: changed" });
        v["attest_waiting"] = 2.into();
        v["engine_ready_ms"] = Value::Null;
        v["engine_not_answering"] = "connect: Connection refused".into();
        v["engine_answered_ago_s"] = 47.25.into();
        v["engine_rechecks_waiting_s"] = 42.0.into();
        v["receipt"] = Value::Null;
        v["roles"][0]["resources"] = serde_json::json!({
            "cgroup": "/sys/fs/cgroup/system.slice/sealnode.service/engine",
            "limits": { "memory.max": "4294967296", "pids.max": "256" },
            "memory_current": 1_048_576u64, "memory_peak": 2_097_152u64,
            "memory_events": { "low": 0, "high": 0, "max": 1, "oom": 0, "oom_kill": 0 },
            "pids_current": 3, "pids_events": { "max": 0 },
            "cpu_usage_usec": 5000, "cpu_nr_throttled": null, "cpu_throttled_usec": null,
        });
        v["roles"][1]["state"] = "wiping".into();
        v["roles"][1]["uptime_s"] = Value::Null;
        v["roles"][1]["preflight"] = serde_json::json!({ "passed": true, "ms": 684, "attempts": 88,
            "refused": null, "refused_by": null, "at": 1_796_211_095u64 });
        v["roles"][1]["sealed"] = Value::Null;
        let s: Status = round_trip(&v.to_string());
        assert_eq!(s.gate.as_ref().map(|g| &g.purpose), Some(&GatePurpose::Reload));
        assert_eq!(s.reload, Some(ReloadOutcome::refused(1_700_000_000, "cell.x: changed")));
        assert_eq!(s.roles[1].state, RoleState::Wiping);
        v["reload"] = serde_json::json!({ "ok": true, "at": 1, "config_sha256": "ab" });
        v["statement"] = serde_json::json!({ "state": "missing", "why": "w", "signed": true, "tpm_quoted": false });
        let s: Status = round_trip(&v.to_string());
        assert_eq!(s.reload, Some(ReloadOutcome::applied(1, "ab")));
    }

    /// Forward compatibility: a newer supervisor's added field is ignored, its new state word
    /// kept (and written back as it came).
    #[test]
    fn an_added_field_or_word_is_accepted() {
        let mut v: Value = serde_json::from_str(STATUS).expect("json");
        v["added"] = serde_json::json!({ "x": 1 });
        v["roles"][0]["added"] = 1.into();
        v["roles"][0]["state"] = "hibernating".into();
        v["statement"]["state"] = "rotating".into();
        let s: Status = serde_json::from_value(v).expect("still a status");
        assert_eq!(s.roles[0].state, RoleState::Other("hibernating".into()));
        assert_eq!(serde_json::to_value(&s.roles[0].state).expect("word"), "hibernating");
        assert_eq!(s.statement.state.as_str(), "rotating");
        for w in RoleState::KNOWN.iter().chain([RoleState::Other("x".into())].iter()) {
            assert_eq!(&RoleState::from(String::from(w.clone())), w);
        }
    }

    #[test]
    fn answers_are_told_apart_by_ok() {
        let refused: Reply<Status> =
            serde_json::from_str(r#"{"ok":false,"error":"uid 5 is not allowed"}"#).expect("a refusal");
        assert_eq!(refused, Reply::Refused(Refusal::new("uid 5 is not allowed")));
        let r: Reply<Recycled> =
            serde_json::from_str(r#"{"ok":true,"recycled":true,"generation":4}"#).expect("recycled");
        assert_eq!(r, Reply::Ok(Recycled::new(Some(4))));
        assert_eq!(
            serde_json::to_string(&Recycled::new(Some(4))).expect("json"),
            r#"{"ok":true,"recycled":true,"generation":4}"#
        );
        // A status whose field is wrong is refused naming it, not as "no variant matched".
        let mut v: Value = serde_json::from_str(STATUS).expect("json");
        v["roles"] = 3.into();
        let e = Reply::<Status>::from_value(v).expect_err("roles is not a list");
        assert!(e.to_string().contains("expected a sequence"), "{e}");
        assert!(Reply::<Status>::from_value(serde_json::json!({"error": "x"})).is_err());
        assert!(serde_json::from_str::<Recycled>(r#"{"ok":true,"recycled":false,"generation":4}"#).is_err());
        // The refusal's JSON built by hand is its serialized form.
        let r = Refusal::new("busy: \"x\"");
        assert_eq!(Value::from(r.clone()), serde_json::to_value(&r).expect("json"));
    }

    #[test]
    fn the_attest_answer_carries_the_envelope() {
        let text = r#"{"ok":true,"envelope":{"payloadType":"application/vnd.in-toto+json","payload":"e30=","signatures":[{"keyid":"ab","sig":"cd"}]}}"#;
        let a: Attested = round_trip(text);
        assert_eq!(a.envelope.payload, "e30=");
        assert_eq!(a.envelope.tpm_quote, None);
    }

    #[test]
    fn requests_are_written_as_documented_and_read_back() {
        for (r, line) in [
            (Request::Status, r#"{"cmd":"status"}"#),
            (Request::Recycle, r#"{"cmd":"recycle"}"#),
            (Request::Attest { nonce: "00112233445566ff".into() }, r#"{"cmd":"attest","nonce":"00112233445566ff"}"#),
        ] {
            assert_eq!(serde_json::to_string(&r).expect("json"), line);
            assert_eq!(parse(format!("{line}\n").as_bytes()), Ok(r.clone()));
            assert_eq!(serde_json::from_str::<Request>(line).expect("reads"), r);
        }
        // Deserialize keeps parse's rules.
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"attest"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"status","nonce":"00112233445566ff"}"#).is_err());
    }

    /// Every message docs/control.md lists for a request, word for word.
    #[test]
    fn requests_parse_strictly_with_the_documented_messages() {
        assert_eq!(parse(b"{\"cmd\":\"status\"}\n"), Ok(Request::Status));
        assert_eq!(parse(b"{\"cmd\":\"recycle\"}"), Ok(Request::Recycle));
        assert_eq!(
            parse(b"{\"cmd\":\"reboot\"}\n"),
            Err("unknown command \"reboot\" (known: status, recycle, attest)".into())
        );
        assert!(
            parse(b"{\"cmd\":\"status\",\"x\":1}\n").is_err_and(|e| e.starts_with("malformed request: unknown field"))
        );
        assert!(parse(b"status\n").is_err_and(|e| e.starts_with("malformed request: ")));
        assert!(parse(b"{}\n").is_err_and(|e| e.starts_with("malformed request: ")));
        assert_eq!(parse(&[0xff, 0xfe, b'\n']), Err("request is not UTF-8".into()));
        assert_eq!(parse(&vec![b' '; MAX_REQUEST + 1]), Err("request too large (more than 4096 bytes)".into()));
        assert!(parse(b"{\"cmd\":\"attest\"}\n").is_err_and(|e| e.starts_with("attest needs a nonce")));
        assert_eq!(parse(b"{\"cmd\":\"status\",\"nonce\":\"0011223344556677\"}"), Err("status takes no nonce".into()));
        // A null nonce is a nonce given (found by review: it passed as none).
        assert_eq!(parse(b"{\"cmd\":\"status\",\"nonce\":null}"), Err("status takes no nonce".into()));
        assert_eq!(parse(b"{\"cmd\":\"recycle\",\"nonce\":null}"), Err("recycle takes no nonce".into()));
        assert!(parse(b"{\"cmd\":\"attest\",\"nonce\":null}").is_err_and(|e| e.starts_with("attest needs a nonce")));
        assert_eq!(parse(b"{\"cmd\":\"status\"}"), Ok(Request::Status));
        assert_eq!(
            parse(b"{\"cmd\":\"attest\",\"nonce\":\"0011\"}"),
            Err("the nonce is 2 bytes; it must be 8 to 64 (hex: twice as many digits)".into())
        );
        assert_eq!(
            parse(b"{\"cmd\":\"attest\",\"nonce\":\"00112233445566AA\"}"),
            Ok(Request::Attest { nonce: "00112233445566aa".into() })
        );
    }
}
