//! Signed attestations of the seal (docs/attestation.md): an in-toto Statement v1, whose
//! subjects are the sha256 digests of what runs and whose predicate says how it is sealed,
//! in a DSSE envelope signed with an ed25519 key that only the launcher holds.
//!
//! Bytes: the statement is UTF-8 JSON without insignificant whitespace, its members in the
//! documented order, every map sorted by key (serde_json of these types). A verifier never
//! re-serialises: the signature is over DSSE's pre-authentication encoding of exactly the
//! payload bytes, which the envelope carries in base64.

use std::collections::BTreeMap;
use std::io::Read as _;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use ed25519_dalek::pkcs8::{DecodePrivateKey, DecodePublicKey, EncodePrivateKey, EncodePublicKey};
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// DSSE payload type of an in-toto statement.
pub const PAYLOAD_TYPE: &str = "application/vnd.in-toto+json";
pub const STATEMENT_TYPE: &str = "https://in-toto.io/Statement/v1";
/// The predicate's type and version: a change to its fields is a new version.
pub const PREDICATE_TYPE: &str = "urn:sealnode:seal:v3";
/// In the state dir: the key pair (the dir 0700, the private key 0600, never in a role's view).
pub const KEY_DIR: &str = crate::layout::ATTEST_KEY_DIR;
pub const KEY_FILE: &str = crate::layout::ATTEST_KEY_FILE;
pub const PUB_FILE: &str = "ed25519.pub";
/// Nonces: 8 to 64 bytes, given in hex.
pub const NONCE_MIN: usize = 8;
pub const NONCE_MAX: usize = 64;

/// Strict, as the Python verifier reads it: no member beyond DSSE's and `tpmQuote`, so no
/// member holds what one verifier parses and the other ignores (unit test:
/// attest::tests::envelopes_and_statements_are_read_strictly).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    #[serde(rename = "payloadType")]
    pub payload_type: String,
    /// base64 (standard alphabet, padded) of the statement's bytes.
    pub payload: String,
    pub signatures: Vec<Signature>,
    /// With `cell.tpm`: the TPM's quote over this payload (DSSE verifiers ignore the member;
    /// [`verify`] checks it when given the attestation key).
    #[serde(rename = "tpmQuote", default, skip_serializing_if = "Option::is_none")]
    pub tpm_quote: Option<crate::proof::tpm::Quote>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Signature {
    /// hex sha256 of the raw 32-byte public key ([`keyid`]).
    pub keyid: String,
    /// base64 of the 64-byte ed25519 signature over [`pae`]`(payloadType, payload bytes)`.
    pub sig: String,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Statement {
    #[serde(rename = "_type")]
    pub kind: String,
    pub subject: Vec<Subject>,
    #[serde(rename = "predicateType")]
    pub predicate_type: String,
    pub predicate: Predicate,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subject {
    pub name: String,
    pub digest: BTreeMap<String, String>,
}

/// `urn:sealnode:seal:v3`: how what the subjects name is sealed, at which generation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Predicate {
    /// The receipt's generation: strictly increasing across starts, restarts and reboots.
    pub generation: u64,
    /// The verifier's nonce (hex) this statement answers; null in the one written at start.
    pub nonce: Option<String>,
    /// When this statement was made, and when its generation started (Unix seconds).
    pub issued_at: u64,
    pub started_at: u64,
    pub boot_id: String,
    pub host: Host,
    pub roles: BTreeMap<String, RoleSeal>,
    pub preflight: Preflight,
    /// Per role: the cgroup leaf and the limit files written there (absent without a cgroup).
    pub limits: BTreeMap<String, Limits>,
    pub tpm: Tpm,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    pub kernel_release: String,
    pub landlock_abi: i32,
    /// "rootful" or "rootless".
    pub userns_mode: String,
    pub sealnode_version: String,
    /// The container sealnode ran in and its runtime (null on a host): the outer runtime is
    /// then part of the trusted base (docs/containers.md).
    pub container: Option<crate::os::container::Container>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoleSeal {
    /// The generation whose gate this role's running process passed: the subjects named after
    /// this role are what that process was started from (a role that did not restart keeps
    /// its own generation and digests).
    pub generation: u64,
    /// The program as configured (command[0], as the role sees it).
    pub program: String,
    /// The layers in force, by the canary's names.
    pub layers: Vec<String>,
    pub seccomp_instructions: usize,
    pub refused_syscalls_logged: bool,
    pub rlimits: BTreeMap<String, u64>,
    /// Device nodes in the role's view beyond the base ones.
    pub devices: Vec<String>,
    /// Restarts of the role since `run` started, and since the preflight of this generation
    /// (every restart passes a new preflight and gets a new generation, so the second is 0).
    pub restarts: u32,
    pub restarts_since_preflight: u32,
    /// The engine with a model dir: whether its `model:` subjects bind (false with
    /// `models_writable`, where the engine itself may change them, or when they could not be
    /// hashed: then there are none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub models_binding: Option<bool>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Preflight {
    pub passed: bool,
    /// sha256 of the full canary report.
    pub report_sha256: String,
    pub roles: BTreeMap<String, PreflightRole>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreflightRole {
    pub attempts: usize,
    pub refused: usize,
    pub succeeded: usize,
    /// layer -> attempts that layer refused first.
    pub refused_by: BTreeMap<String, usize>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Limits {
    pub cgroup: String,
    pub files: BTreeMap<String, String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tpm {
    /// False: the statement is bound to the signing key only ("no TPM").
    pub present: bool,
    /// With a TPM: the PCR holding the statement's digest (23).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pcr: Option<u32>,
    /// With a TPM: hex sha256 of the attestation key's SubjectPublicKeyInfo DER.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ak: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

impl Tpm {
    /// What the predicate says of a TPM: the attestation key's id, or none.
    pub fn of(ak: Option<&str>) -> Tpm {
        match ak {
            Some(id) => Tpm {
                present: true,
                pcr: Some(crate::proof::tpm::PCR),
                ak: Some(id.to_string()),
                note: Some(format!(
                    "quoted by the TPM: the envelope's tpmQuote, PCR {} = sha256(0^32 || sha256(payload)), extraData = sha256(nonce)",
                    crate::proof::tpm::PCR
                )),
            },
            None => Tpm { present: false, pcr: None, ak: None, note: Some("no TPM: bound to the signing key only".into()) },
        }
    }
}

/// What a statement is made of, beyond the receipt: the supervisor's facts of the moment.
pub struct Inputs<'a> {
    pub cfg: &'a crate::config::Config,
    /// The config each role's record in the receipt was made with (its last pass), by
    /// [`crate::config::Role`] index: its policies, rlimits and devices are named from it.
    pub role_cfgs: [&'a crate::config::Config; 2],
    pub receipt: &'a crate::proof::receipt::Receipt,
    /// The latest preflight of each role (the receipt summarises it).
    pub report: Option<&'a crate::proof::canary::Report>,
    pub nonce: Option<String>,
    /// Restarts of each role since `run` started, by role name.
    pub restarts: BTreeMap<String, u32>,
    /// With `cell.tpm`: the attestation key's id ([`crate::proof::tpm::ak_id`]).
    pub tpm_ak: Option<String>,
}

/// The layers a role runs under in `run` (all of them; the canary's names), and the cgroup
/// when the role has limits there.
const LAYERS: &[&str] = &["namespaces", "landlock", "seccomp", "credentials", "rlimits", "launcher"];

/// The subjects, in a fixed order: sealnode, the config, each role's program, policies
/// (the loaded files and the compiled seccomp program) and CDI spec, then the engine's model
/// files by path. Each role's are its process's (`roles`, from the receipt). `attest subjects`
/// prints the same list for a config, so a gateway knows what to expect.
pub fn subjects(
    role_cfgs: [&crate::config::Config; 2],
    sealnode: &str,
    config: &str,
    roles: &BTreeMap<String, crate::proof::receipt::RoleDigests>,
) -> Vec<Subject> {
    let sha = |d: &str| -> BTreeMap<String, String> { [("sha256".to_string(), d.to_string())].into() };
    let mut subject = vec![
        Subject { name: "sealnode".into(), digest: sha(sealnode) },
        Subject { name: "config".into(), digest: sha(config) },
    ];
    for role in crate::config::Role::ALL {
        let name = role.name();
        let Some(d) = roles.get(name) else { continue };
        if let Some(p) = &d.program_sha256 {
            subject.push(Subject { name: format!("{name}.program"), digest: sha(p) });
        }
        if let Ok((sc, ll)) = role_cfgs[role as usize].policy_files(role) {
            subject.push(Subject { name: format!("{name}.seccomp"), digest: sha(&sc.sha256) });
            subject.push(Subject { name: format!("{name}.landlock"), digest: sha(&ll.sha256) });
        }
        subject.push(Subject { name: format!("{name}.seccomp_program"), digest: sha(&d.seccomp_program_sha256) });
        if let Some(c) = &d.devices_from {
            subject.push(Subject { name: format!("{name}.cdi"), digest: sha(&c.cdi_sha256) });
        }
    }
    for (name, digest) in roles.get(crate::config::Role::Engine.name()).map(|d| &d.models).into_iter().flatten() {
        subject.push(Subject { name: name.clone(), digest: sha(digest) });
    }
    subject
}

/// The statement for `inputs`: [`subjects`], then the predicate.
pub fn build(i: &Inputs) -> Statement {
    use crate::config::Role;
    let r = i.receipt;
    let subject = subjects(i.role_cfgs, &r.sealnode.sha256, &r.config.sha256, &r.roles);
    let mut roles = BTreeMap::new();
    for role in Role::ALL {
        let name = role.name();
        let cfg = i.role_cfgs[role as usize];
        let rc = cfg.role(role);
        let Some(d) = r.roles.get(name) else { continue };
        let mut layers: Vec<String> = LAYERS.iter().map(|l| l.to_string()).collect();
        if r.resources.contains_key(name) {
            layers.push("cgroup".into());
        }
        let l = &rc.rlimits;
        roles.insert(
            name.to_string(),
            RoleSeal {
                generation: d.generation,
                program: d.program.clone(),
                layers,
                seccomp_instructions: d.seccomp_instructions,
                refused_syscalls_logged: d.refused_syscalls_logged,
                rlimits: [
                    ("core".to_string(), 0),
                    ("nofile".to_string(), l.nofile),
                    ("nproc".to_string(), l.nproc),
                    ("fsize_mb".to_string(), l.fsize_mb),
                    ("memlock_kb".to_string(), l.memlock_kb),
                ]
                .into(),
                devices: cfg.devices(role).iter().map(|p| p.display().to_string()).collect(),
                restarts: i.restarts.get(name).copied().unwrap_or(0),
                restarts_since_preflight: 0,
                models_binding: d.models_binding,
            },
        );
    }
    let preflight_roles = r
        .canary
        .roles
        .iter()
        .map(|(name, [attempts, refused, succeeded])| {
            let mut by = BTreeMap::new();
            if let Some(rep) = i.report.and_then(|rep| rep.roles.iter().find(|x| x.role.name() == name)) {
                for a in &rep.attempts {
                    if let Some(l) = a.refused_by {
                        *by.entry(l.name().to_string()).or_insert(0) += 1;
                    }
                }
            }
            (
                name.clone(),
                PreflightRole { attempts: *attempts, refused: *refused, succeeded: *succeeded, refused_by: by },
            )
        })
        .collect();
    Statement {
        kind: STATEMENT_TYPE.into(),
        subject,
        predicate_type: PREDICATE_TYPE.into(),
        predicate: Predicate {
            generation: r.generation,
            nonce: i.nonce.clone(),
            issued_at: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            started_at: r.started_at,
            boot_id: r.boot_id.clone(),
            host: Host {
                kernel_release: r.kernel.release.clone(),
                landlock_abi: r.kernel.landlock_abi,
                userns_mode: r.kernel.userns_mode.clone(),
                sealnode_version: r.sealnode.version.clone().unwrap_or_default(),
                container: r.container.clone(),
            },
            roles,
            preflight: Preflight {
                passed: r.canary.passed,
                report_sha256: r.canary.report_sha256.clone(),
                roles: preflight_roles,
            },
            limits: r
                .resources
                .iter()
                .map(|(k, v)| (k.clone(), Limits { cgroup: v.cgroup.clone(), files: v.files.clone() }))
                .collect(),
            tpm: Tpm::of(i.tpm_ak.as_deref()),
        },
    }
}

/// DSSE's pre-authentication encoding: what the signature covers.
pub fn pae(payload_type: &str, payload: &[u8]) -> Vec<u8> {
    let mut v = format!("DSSEv1 {} {} {} ", payload_type.len(), payload_type, payload.len()).into_bytes();
    v.extend_from_slice(payload);
    v
}

/// hex sha256 of the raw public key: the envelope's keyid and the key's fingerprint.
pub fn keyid(vk: &VerifyingKey) -> String {
    crate::os::atomic::sha256_hex(vk.as_bytes())
}

/// The statement's bytes, as signed.
pub fn statement_bytes(s: &Statement) -> Vec<u8> {
    serde_json::to_vec(s).unwrap_or_default()
}

/// Sign a statement into an envelope.
pub fn sign(key: &SigningKey, s: &Statement) -> Envelope {
    let body = statement_bytes(s);
    let sig = key.sign(&pae(PAYLOAD_TYPE, &body));
    let b64 = base64::engine::general_purpose::STANDARD;
    Envelope {
        payload_type: PAYLOAD_TYPE.into(),
        payload: b64.encode(&body),
        signatures: vec![Signature { keyid: keyid(&key.verifying_key()), sig: b64.encode(sig.to_bytes()) }],
        tpm_quote: None,
    }
}

/// Parse a hex nonce, held to [`NONCE_MIN`]..=[`NONCE_MAX`] bytes.
pub fn parse_nonce(hex_nonce: &str) -> std::result::Result<String, String> {
    let b = hex::decode(hex_nonce).map_err(|e| format!("the nonce {hex_nonce:?} is not hex: {e}"))?;
    if !(NONCE_MIN..=NONCE_MAX).contains(&b.len()) {
        return Err(format!(
            "the nonce is {} bytes; it must be {NONCE_MIN} to {NONCE_MAX} (hex: twice as many digits)",
            b.len()
        ));
    }
    Ok(hex::encode(b))
}

/// JSON read as strictly as the Python verifier reads it, where serde alone would keep the
/// last of duplicate keys in a map and take an array for a struct: no key twice in any object,
/// and an object at each of `objects` (JSON pointers; `*` for every member or element) (unit
/// test: attest::tests::envelopes_and_statements_are_read_strictly; both verifiers:
/// tests/attest.rs: statements_are_quoted_by_the_tpm_and_a_replayed_quote_fails).
fn strict_parse<T: serde::de::DeserializeOwned>(bytes: &[u8], objects: &[&str]) -> std::result::Result<T, String> {
    use serde::de::DeserializeSeed as _;
    let mut de = serde_json::Deserializer::from_slice(bytes);
    NoDuplicates.deserialize(&mut de).map_err(|e| e.to_string())?;
    de.end().map_err(|e| e.to_string())?;
    let v: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| e.to_string())?;
    for p in objects {
        for (at, found) in pointed(&v, p, String::new()) {
            if !found.is_object() && !found.is_null() {
                return Err(format!("{at}: an object is expected, not {found}"));
            }
        }
    }
    if !v.is_object() {
        return Err("an object is expected".into());
    }
    serde_json::from_value(v).map_err(|e| e.to_string())
}

/// Where structs are, in an envelope and in a statement (null: an absent Option).
const ENVELOPE_OBJECTS: &[&str] = &["/signatures/*", "/tpmQuote", "/tpmQuote/pcrs"];
const STATEMENT_OBJECTS: &[&str] = &[
    "/subject/*",
    "/subject/*/digest",
    "/predicate",
    "/predicate/host",
    "/predicate/host/container",
    "/predicate/roles",
    "/predicate/roles/*",
    "/predicate/roles/*/rlimits",
    "/predicate/preflight",
    "/predicate/preflight/roles",
    "/predicate/preflight/roles/*",
    "/predicate/preflight/roles/*/refused_by",
    "/predicate/limits",
    "/predicate/limits/*",
    "/predicate/limits/*/files",
    "/predicate/tpm",
];

/// The values at a pointer whose segments may be `*`, with their paths.
fn pointed<'a>(v: &'a serde_json::Value, pointer: &str, at: String) -> Vec<(String, &'a serde_json::Value)> {
    let Some(rest) = pointer.strip_prefix('/') else { return vec![(at, v)] };
    let (seg, tail) = rest.split_once('/').map_or((rest, ""), |(a, b)| (a, b));
    let tail = if tail.is_empty() { String::new() } else { format!("/{tail}") };
    let next: Vec<(String, &serde_json::Value)> = match (seg, v) {
        ("*", serde_json::Value::Object(m)) => m.iter().map(|(k, x)| (format!("{at}/{k}"), x)).collect(),
        ("*", serde_json::Value::Array(a)) => a.iter().enumerate().map(|(i, x)| (format!("{at}/{i}"), x)).collect(),
        (k, serde_json::Value::Object(m)) => m.get(k).map(|x| vec![(format!("{at}/{k}"), x)]).unwrap_or_default(),
        _ => Vec::new(),
    };
    next.into_iter().flat_map(|(p, x)| pointed(x, &tail, p)).collect()
}

/// Walks any JSON value, refusing an object with a key twice.
struct NoDuplicates;

impl<'de> serde::de::DeserializeSeed<'de> for NoDuplicates {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> std::result::Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for NoDuplicates {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("JSON")
    }
    fn visit_bool<E>(self, _: bool) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_f64<E>(self, _: f64) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_str<E>(self, _: &str) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> std::result::Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut a: A) -> std::result::Result<(), A::Error> {
        while a.next_element_seed(NoDuplicates)?.is_some() {}
        Ok(())
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut a: A) -> std::result::Result<(), A::Error> {
        let mut seen = std::collections::BTreeSet::new();
        while let Some(k) = a.next_key::<String>()? {
            if !seen.insert(k.clone()) {
                return Err(serde::de::Error::custom(format!("duplicate key {k:?}")));
            }
            a.next_value_seed(NoDuplicates)?;
        }
        Ok(())
    }
}

/// Why a verification failed, each its own exit status (`exit::ATTEST_*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Failure {
    /// Not a DSSE envelope holding a sealnode statement.
    Malformed(String),
    /// No signature by the given key verifies over these bytes.
    Signature(String),
    /// The statement answers another nonce (or none).
    Nonce(String),
    /// A subject digest or the generation is not what the verifier expected.
    Mismatch(Vec<String>),
    /// The TPM quote is missing, or does not bind this statement to the given attestation key.
    Tpm(String),
}

/// What a verifier demands beyond a good signature.
#[derive(Debug, Clone, Default)]
pub struct Expect {
    /// The nonce the verifier sent; None: only a statement without one (the one written at
    /// start, which the node forwards) is accepted.
    pub nonce: Option<String>,
    /// subject name -> sha256 hex
    pub subjects: Vec<(String, String)>,
    pub min_generation: Option<u64>,
    /// The TPM's attestation key the verifier enrolled: the quote must verify with it.
    pub tpm_ak: Option<p256::ecdsa::VerifyingKey>,
}

/// Verify an envelope with `key` against `expect`: returns the statement and the lines that
/// say what was verified, or the first kind of failure (a signature before the contents: an
/// unsigned statement's contents mean nothing).
pub fn verify(
    bytes: &[u8],
    key: &VerifyingKey,
    expect: &Expect,
) -> std::result::Result<(Statement, Vec<String>), Failure> {
    let env: Envelope =
        strict_parse(bytes, ENVELOPE_OBJECTS).map_err(|e| Failure::Malformed(format!("not a DSSE envelope: {e}")))?;
    if env.payload_type != PAYLOAD_TYPE {
        return Err(Failure::Malformed(format!("payloadType {:?} is not {PAYLOAD_TYPE:?}", env.payload_type)));
    }
    let b64 = base64::engine::general_purpose::STANDARD;
    let body = b64.decode(&env.payload).map_err(|e| Failure::Malformed(format!("payload is not base64: {e}")))?;
    let want = keyid(key);
    let signed = pae(&env.payload_type, &body);
    let mut tried = Vec::new();
    let good = env.signatures.iter().any(|s| {
        tried.push(s.keyid.clone());
        let Ok(raw) = b64.decode(&s.sig) else { return false };
        let Ok(sig) = ed25519_dalek::Signature::from_slice(&raw) else { return false };
        s.keyid == want && key.verify_strict(&signed, &sig).is_ok()
    });
    if !good {
        return Err(Failure::Signature(if tried.contains(&want) {
            format!("the signature by key {want} does not verify: the envelope was changed or is not this key's")
        } else {
            format!(
                "no signature by key {want} (signed by: {})",
                if tried.is_empty() { "none".into() } else { tried.join(", ") }
            )
        }));
    }
    let st: Statement = strict_parse(&body, STATEMENT_OBJECTS)
        .map_err(|e| Failure::Malformed(format!("the payload is not a sealnode statement: {e}")))?;
    let mut names = std::collections::BTreeSet::new();
    if let Some(dup) = st.subject.iter().find(|s| !names.insert(s.name.as_str())) {
        return Err(Failure::Malformed(format!("the subject {:?} is listed twice", dup.name)));
    }
    if st.kind != STATEMENT_TYPE || st.predicate_type != PREDICATE_TYPE {
        return Err(Failure::Malformed(format!(
            "_type {:?} / predicateType {:?}: expected {STATEMENT_TYPE} / {PREDICATE_TYPE}",
            st.kind, st.predicate_type
        )));
    }
    let mut said = vec![format!("signature: ed25519 key {want} over the DSSE encoding of the payload")];
    match (&st.predicate.nonce, &expect.nonce) {
        (Some(n), Some(want)) if n.eq_ignore_ascii_case(want) => {
            said.push(format!("nonce: {n} (fresh: made for this request)"))
        }
        (Some(n), Some(want)) => return Err(Failure::Nonce(format!("the statement answers nonce {n}, not {want}"))),
        (None, Some(want)) => {
            return Err(Failure::Nonce(format!(
                "the statement answers no nonce (the one written at start), not {want}"
            )))
        }
        (Some(n), None) => {
            return Err(Failure::Nonce(format!(
                "the statement answers nonce {n}; --no-nonce accepts only the start-time one"
            )))
        }
        (None, None) => said.push(
            "nonce: none (the statement written at start: not fresh; rely on --min-generation and issued_at)".into(),
        ),
    }
    match (&expect.tpm_ak, &env.tpm_quote) {
        (Some(ak), quote) => {
            let id = crate::proof::tpm::ak_id(ak);
            let t = &st.predicate.tpm;
            if !t.present {
                return Err(Failure::Tpm("the statement says no TPM: it is bound to the signing key only".into()));
            }
            if t.pcr != Some(crate::proof::tpm::PCR) {
                return Err(Failure::Tpm(format!(
                    "the statement names PCR {}; sealnode's quotes hold the statement in PCR {}",
                    t.pcr.map_or("none".to_string(), |p| p.to_string()),
                    crate::proof::tpm::PCR
                )));
            }
            if !t.ak.as_deref().is_some_and(|a| a.eq_ignore_ascii_case(&id)) {
                return Err(Failure::Tpm(format!(
                    "the statement names attestation key {}, not the given one ({id})",
                    t.ak.as_deref().unwrap_or("none")
                )));
            }
            let Some(q) = quote else {
                return Err(Failure::Tpm("the envelope carries no tpmQuote".into()));
            };
            let nonce = st
                .predicate
                .nonce
                .as_deref()
                .map(hex::decode)
                .transpose()
                .map_err(|_| Failure::Malformed("the statement's nonce is not hex".into()))?;
            said.extend(crate::proof::tpm::verify(q, ak, &body, nonce.as_deref()).map_err(Failure::Tpm)?);
        }
        (None, Some(_)) => said.push("TPM: a quote is attached, not checked (give --tpm-ak)".into()),
        (None, None) => {}
    }
    let mut bad = Vec::new();
    if let Some(min) = expect.min_generation {
        if st.predicate.generation < min {
            bad.push(format!("generation {} is older than {min} (--min-generation)", st.predicate.generation));
        } else {
            said.push(format!("generation: {} (>= {min})", st.predicate.generation));
        }
    }
    let models_bind = st.predicate.roles.get("engine").and_then(|r| r.models_binding) != Some(false);
    for (name, digest) in &expect.subjects {
        if !models_bind && (name.starts_with("model:") || name.starts_with("model-hex:")) {
            bad.push(format!(
                "{name}: the statement says the engine's model digests do not bind (models_writable: the engine may change them)"
            ));
            continue;
        }
        match st.subject.iter().find(|s| &s.name == name) {
            None => bad.push(format!("{name}: no such subject in the statement")),
            Some(s) => match s.digest.get("sha256") {
                Some(d) if d.eq_ignore_ascii_case(digest) => said.push(format!("{name}: sha256 {d} as expected")),
                Some(d) => bad.push(format!("{name}: sha256 {d}, expected {digest}")),
                None => bad.push(format!("{name}: no sha256 digest")),
            },
        }
    }
    if !bad.is_empty() {
        return Err(Failure::Mismatch(bad));
    }
    said.push(format!(
        "sealed: generation {}, preflight {} ({} roles), kernel {}, Landlock ABI {}, {}, TPM {}",
        st.predicate.generation,
        if st.predicate.preflight.passed { "passed" } else { "FAILED" },
        st.predicate.preflight.roles.len(),
        st.predicate.host.kernel_release,
        st.predicate.host.landlock_abi,
        st.predicate.host.userns_mode,
        match (st.predicate.tpm.present, expect.tpm_ak.is_some()) {
            (true, true) => "bound (quote verified)",
            (true, false) => "present (quote not checked)",
            _ => "none",
        }
    ));
    Ok((st, said))
}

/// The key dir under the state dir: made if missing (0700), owned by the launcher or root,
/// writable by no one else (trusted::own_dir).
fn key_dir(state_dir: &Path, uid: u32) -> Result<OwnedFd> {
    let p = state_dir.join(KEY_DIR);
    crate::os::trusted::own_dir(&p, uid, 0o700)
        .map_err(|e| Error::io(format!("key dir {}", p.display()), std::io::Error::other(e)))
}

/// `sealnode attest init`: make the key pair. An existing key is kept unless `force`; then it
/// is moved aside as `ed25519.key.retired-<unix time>` (rotation: docs/attestation.md).
pub fn init(state_dir: &Path, uid: u32, force: bool) -> Result<VerifyingKey> {
    let dir = key_dir(state_dir, uid)?;
    let shown = state_dir.join(KEY_DIR).join(KEY_FILE);
    let exists = nix::sys::stat::fstatat(&dir, KEY_FILE, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_ok();
    if exists && !force {
        return Err(Error::io(
            format!("{} exists", shown.display()),
            std::io::Error::other("keep it (sealnode attest pubkey prints its public key) or replace it with --force"),
        ));
    }
    if exists {
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let retired = format!("{KEY_FILE}.retired-{now}");
        nix::fcntl::renameat(&dir, KEY_FILE, &dir, retired.as_str())
            .map_err(|e| Error::errno(format!("retire {}", shown.display()), e))?;
    }
    let mut seed = [0u8; 32];
    crate::os::sys::random_bytes(&mut seed).map_err(|e| Error::errno("getrandom", e))?;
    let key = SigningKey::from_bytes(&seed);
    // PKCS#8 v1 (the private key alone): what OpenSSL and Python's cryptography load; v2,
    // with the public key beside it, they refuse (tests/attest.rs:
    // statements_verify_fresh_and_every_forgery_fails_with_its_own_status).
    let pem = ed25519_dalek::pkcs8::KeypairBytes { secret_key: seed, public_key: None }
        .to_pkcs8_pem(Default::default())
        .map_err(|e| Error::io("encode the private key", std::io::Error::other(e.to_string())))?;
    zeroize::Zeroize::zeroize(&mut seed);
    crate::os::atomic::write_atomic_at(&dir, KEY_FILE, pem.as_bytes(), 0o600, &shown)?;
    let vk = key.verifying_key();
    let public = vk
        .to_public_key_pem(Default::default())
        .map_err(|e| Error::io("encode the public key", std::io::Error::other(e.to_string())))?;
    crate::os::atomic::write_atomic_at(
        &dir,
        PUB_FILE,
        public.as_bytes(),
        0o644,
        &state_dir.join(KEY_DIR).join(PUB_FILE),
    )?;
    Ok(vk)
}

/// Read a file of the key dir without following symlinks; it must be a regular file of the
/// launcher or root, and for the private key readable by its owner only.
fn read_key_file(dir: &impl AsFd, name: &str, shown: &Path, uid: u32, private: bool) -> Result<Vec<u8>> {
    use nix::fcntl::{openat, OFlag};
    let fd = openat(
        dir,
        name,
        OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK,
        nix::sys::stat::Mode::empty(),
    )
    .map_err(|e| Error::errno(format!("open {}", shown.display()), e))?;
    let f = std::fs::File::from(fd);
    let md = f.metadata().map_err(|e| Error::io(format!("stat {}", shown.display()), e))?;
    let bad = if !md.is_file() {
        Some("is not a regular file".to_string())
    } else if md.uid() != uid && md.uid() != 0 {
        Some(format!("is owned by uid {}, not sealnode's user (uid {uid}) or root", md.uid()))
    } else if private && md.mode() & 0o077 != 0 {
        Some(format!(
            "is readable or writable by others (mode {:o}): chmod 0600 it, and rotate the key",
            md.mode() & 0o7777
        ))
    } else if md.mode() & 0o022 != 0 {
        Some(format!("is writable by others (mode {:o})", md.mode() & 0o7777))
    } else if private && md.nlink() != 1 {
        // Another name for the key (a hard link in a role's dir) is a way in no path check sees.
        Some(format!("has {} hard links: remove the other names, and rotate the key", md.nlink()))
    } else {
        None
    };
    if let Some(why) = bad {
        return Err(Error::io(format!("{} {why}", shown.display()), std::io::Error::other("refused")));
    }
    let mut b = Vec::new();
    std::io::Read::read_to_end(&mut (&f).take(1 << 16), &mut b)
        .map_err(|e| Error::io(format!("read {}", shown.display()), e))?;
    Ok(b)
}

/// The signing key, if `sealnode attest init` made one (None: no key file).
pub fn load_signing(state_dir: &Path, uid: u32) -> Result<Option<SigningKey>> {
    let p = state_dir.join(KEY_DIR);
    let Ok(dir) = crate::os::trusted::open_dir(&p, uid) else {
        return Ok(None);
    };
    let shown = p.join(KEY_FILE);
    if nix::sys::stat::fstatat(&dir, KEY_FILE, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_err() {
        return Ok(None);
    }
    // The key's bytes are wiped when dropped (Zeroizing; SigningKey zeroizes itself).
    let pem = zeroize::Zeroizing::new(read_key_file(&dir, KEY_FILE, &shown, uid, true)?);
    let text = std::str::from_utf8(&pem)
        .map_err(|e| Error::io(format!("{} is not PEM", shown.display()), std::io::Error::other(e)))?;
    SigningKey::from_pkcs8_pem(text).map(Some).map_err(|e| {
        Error::io(format!("{} is not an ed25519 PKCS#8 key", shown.display()), std::io::Error::other(e.to_string()))
    })
}

/// The public key, from the key dir (readable by anyone who can reach the state dir).
pub fn load_public(state_dir: &Path, uid: u32) -> Result<VerifyingKey> {
    let p = state_dir.join(KEY_DIR);
    let dir = crate::os::trusted::open_dir(&p, uid).map_err(|e| {
        Error::io(format!("{}: {e}", p.display()), std::io::Error::other("run `sealnode attest init` first"))
    })?;
    let shown = p.join(PUB_FILE);
    let pem = read_key_file(&dir, PUB_FILE, &shown, uid, false)?;
    parse_public(&pem)
        .map_err(|e| Error::io(format!("{}: {e}", shown.display()), std::io::Error::other("not a public key")))
}

/// The TPM attestation key's public half `attest tpm-init` stored (None: no file).
pub fn load_tpm_ak(state_dir: &Path, uid: u32) -> Result<Option<p256::ecdsa::VerifyingKey>> {
    let p = state_dir.join(KEY_DIR);
    let Ok(dir) = crate::os::trusted::open_dir(&p, uid) else { return Ok(None) };
    if nix::sys::stat::fstatat(&dir, crate::proof::tpm::AK_FILE, nix::fcntl::AtFlags::AT_SYMLINK_NOFOLLOW).is_err() {
        return Ok(None);
    }
    let shown = p.join(crate::proof::tpm::AK_FILE);
    let pem = read_key_file(&dir, crate::proof::tpm::AK_FILE, &shown, uid, false)?;
    crate::proof::tpm::parse_ak(&pem)
        .map(Some)
        .map_err(|e| Error::io(format!("{}: {e}", shown.display()), std::io::Error::other("not an attestation key")))
}

/// The attestation key's TPM name (hex) `attest tpm-init` stored, if any.
pub fn load_tpm_ak_name(state_dir: &Path, uid: u32) -> Option<String> {
    let p = state_dir.join(KEY_DIR);
    let dir = crate::os::trusted::open_dir(&p, uid).ok()?;
    let b = read_key_file(&dir, crate::proof::tpm::AK_NAME_FILE, &p.join(crate::proof::tpm::AK_NAME_FILE), uid, false)
        .ok()?;
    Some(String::from_utf8_lossy(&b).trim().to_string())
}

/// `attest tpm-init`: make the TPM's attestation key (persisted at `cell.tpm.ak_handle`) and
/// store its public half and the endorsement key's beside the signing key.
pub fn tpm_init(
    state_dir: &Path,
    uid: u32,
    target: crate::config::TpmTarget,
    force: bool,
) -> Result<crate::proof::tpm::AkPublic> {
    let dir = key_dir(state_dir, uid)?;
    let tools = tpm_tools(state_dir, uid, target)?;
    let (raw, ak, ek) = tools.init(force).map_err(|e| Error::io("attest tpm-init", std::io::Error::other(e)))?;
    let p = state_dir.join(KEY_DIR);
    use p256::pkcs8::EncodePublicKey as _;
    let pem = ak
        .key
        .to_public_key_pem(Default::default())
        .map_err(|e| Error::io("encode the attestation key", std::io::Error::other(e.to_string())))?;
    let name = format!("{}\n", hex::encode(&ak.name));
    for (file, bytes) in [
        (crate::proof::tpm::EK_FILE, ek.as_slice()),
        (crate::proof::tpm::AK_PUBLIC_FILE, raw.as_slice()),
        (crate::proof::tpm::AK_NAME_FILE, name.as_bytes()),
        (crate::proof::tpm::AK_FILE, pem.as_bytes()),
    ] {
        crate::os::atomic::write_atomic_at(&dir, file, bytes, 0o644, &p.join(file))?;
    }
    Ok(ak)
}

/// The tpm2-tools for a target, working in the key dir's `tpm/` (0700, the launcher's).
pub fn tpm_tools(state_dir: &Path, uid: u32, target: crate::config::TpmTarget) -> Result<crate::proof::tpm::Tools> {
    key_dir(state_dir, uid)?;
    let work = state_dir.join(KEY_DIR).join("tpm");
    let fd =
        crate::proof::tpm::work_dir(&work, uid).map_err(|e| Error::io("TPM work dir", std::io::Error::other(e)))?;
    Ok(crate::proof::tpm::Tools::new(target, fd))
}

/// A public key file: SPKI PEM (what `attest pubkey` prints), or the raw key in hex.
pub fn parse_public(bytes: &[u8]) -> std::result::Result<VerifyingKey, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?.trim();
    if text.starts_with("-----BEGIN") {
        return VerifyingKey::from_public_key_pem(text).map_err(|e| format!("not an ed25519 public key: {e}"));
    }
    let raw = hex::decode(text).map_err(|_| "neither PEM nor hex".to_string())?;
    let arr: [u8; 32] = raw.try_into().map_err(|_| "a raw ed25519 key is 32 bytes".to_string())?;
    VerifyingKey::from_bytes(&arr).map_err(|e| format!("not an ed25519 public key: {e}"))
}

/// The public key as `attest pubkey` prints it (SPKI PEM).
pub fn public_pem(vk: &VerifyingKey) -> String {
    vk.to_public_key_pem(Default::default()).unwrap_or_default()
}

/// Where the key and the latest statement live for a config.
pub fn key_path(state_dir: &Path) -> PathBuf {
    crate::layout::attest_key_path(state_dir)
}

/// What `run` would sign its statements with, checked as at a start (for `sealnode check`).
pub fn signer_status(cfg: &crate::config::Config, inv: &crate::config::Invoker) -> Result<String> {
    let key = load_signing(&cfg.cell.state_dir, inv.uid)
        .map_err(|e| Error::config(&cfg.file, "cell.state_dir", format!("attestation key: {e}")))?
        .map(|k| k.verifying_key());
    let tpm = tpm_checked(cfg, inv, key.is_some())?;
    Ok(match (key, tpm) {
        (None, _) => "not signed: no key (`sealnode attest init` makes one)".into(),
        (Some(k), None) => format!("signed by key sha256:{}; no TPM", keyid(&k)),
        (Some(k), Some((_, ak))) => format!(
            "signed by key sha256:{}; quoted by the TPM's attestation key sha256:{}",
            keyid(&k),
            crate::proof::tpm::ak_id(&ak)
        ),
    })
}

/// With `cell.tpm`: the TPM answers and holds the attestation key `attest tpm-init` stored,
/// or the start is refused before anything runs (statements that cannot be bound are not
/// made unbound instead).
pub fn tpm_checked(
    cfg: &crate::config::Config,
    inv: &crate::config::Invoker,
    signing: bool,
) -> Result<Option<(crate::proof::tpm::Tools, p256::ecdsa::VerifyingKey)>> {
    let Some(t) = &cfg.cell.tpm else { return Ok(None) };
    let bad = |why: String| Error::config(&cfg.file, "cell.tpm", why);
    if !signing {
        return Err(bad(format!(
            "binds signed statements, and there is no signing key: run `sealnode attest init --config {}` first",
            cfg.file.display()
        )));
    }
    let stored = load_tpm_ak(&cfg.cell.state_dir, inv.uid).map_err(|e| bad(e.to_string()))?.ok_or_else(|| {
        bad(format!("no attestation key from the TPM: run `sealnode attest tpm-init --config {}`", cfg.file.display()))
    })?;
    let tools = tpm_tools(&cfg.cell.state_dir, inv.uid, t.target()).map_err(|e| bad(e.to_string()))?;
    let (_, ak) = tools.read_ak(&stop_pending).map_err(|e| bad(format!("the TPM ({}): {e}", t.tcti)))?;
    if ak.key != stored {
        return Err(bad(format!(
            "the key at handle {:#010x} is not the one `attest tpm-init` stored ({}): run tpm-init again and enrol the new key",
            t.ak_handle,
            crate::proof::tpm::AK_FILE
        )));
    }
    // One quote now, of a throwaway payload: a key that needs a password, or a TPM in lockout,
    // refuses the start instead of every statement.
    tools
        .quote(&ak.key, b"sealnode: the start's check of the TPM", None, &stop_pending)
        .map_err(|e| bad(format!("the TPM cannot quote with the key at {:#010x}: {e}", t.ak_handle)))?;
    tracing::info!(ak = %crate::proof::tpm::ak_id(&ak.key), name = %hex::encode(&ak.name), tcti = %t.tcti, "TPM attestation key checked");
    Ok(Some((tools, ak.key)))
}

/// A stop signal waits on the signalfd: the TPM's check at the start gives up for it.
fn stop_pending() -> bool {
    use nix::sys::signal::Signal;
    crate::os::sys::signal_pending(&[Signal::SIGTERM, Signal::SIGINT, Signal::SIGQUIT])
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) fn sample(nonce: Option<&str>, generation: u64) -> Statement {
        Statement {
            kind: STATEMENT_TYPE.into(),
            subject: vec![Subject { name: "sealnode".into(), digest: [("sha256".into(), "ab".repeat(32))].into() }],
            predicate_type: PREDICATE_TYPE.into(),
            predicate: Predicate {
                generation,
                nonce: nonce.map(str::to_string),
                issued_at: 1,
                started_at: 1,
                boot_id: "b".into(),
                host: Host {
                    kernel_release: "6.18".into(),
                    landlock_abi: 7,
                    userns_mode: "rootful".into(),
                    sealnode_version: "0".into(),
                    container: None,
                },
                roles: BTreeMap::new(),
                preflight: Preflight { passed: true, report_sha256: "c".into(), roles: BTreeMap::new() },
                limits: BTreeMap::new(),
                tpm: Tpm::of(None),
            },
        }
    }

    #[test]
    fn pae_is_dsse_v1() {
        // The DSSE spec's own example.
        assert_eq!(
            pae("http://example.com/HelloWorld", b"hello world"),
            b"DSSEv1 29 http://example.com/HelloWorld 11 hello world"
        );
    }

    #[test]
    fn a_signed_statement_verifies_and_every_tampering_fails_with_its_reason() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let other = SigningKey::from_bytes(&[8u8; 32]);
        let nonce = "00112233445566778899aabbccddeeff";
        let env = sign(&key, &sample(Some(nonce), 5));
        let bytes = serde_json::to_vec(&env).expect("json");
        let vk = key.verifying_key();
        let ok = Expect {
            nonce: Some(nonce.into()),
            subjects: vec![("sealnode".into(), "ab".repeat(32))],
            min_generation: Some(5),
            tpm_ak: None,
        };
        let (st, said) = verify(&bytes, &vk, &ok).expect("verifies");
        assert_eq!(st.predicate.generation, 5);
        assert!(said.iter().any(|l| l.contains("nonce")) && said.iter().any(|l| l.contains("as expected")), "{said:?}");
        // A changed byte of the payload.
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut body = b64.decode(&env.payload).expect("b64");
        let i = body.iter().position(|b| *b == b'5').expect("digit");
        body[i] = b'6';
        let changed = Envelope { payload: b64.encode(&body), ..env.clone() };
        assert!(
            matches!(verify(&serde_json::to_vec(&changed).expect("json"), &vk, &ok), Err(Failure::Signature(m)) if m.contains("does not verify"))
        );
        // The wrong key.
        assert!(
            matches!(verify(&bytes, &other.verifying_key(), &ok), Err(Failure::Signature(m)) if m.contains("no signature by key"))
        );
        // The wrong nonce.
        let wrong = Expect { nonce: Some("ff".repeat(16)), ..ok.clone() };
        assert!(matches!(verify(&bytes, &vk, &wrong), Err(Failure::Nonce(_))));
        // An older generation than the verifier has seen.
        let newer = Expect { min_generation: Some(6), ..ok.clone() };
        assert!(matches!(verify(&bytes, &vk, &newer), Err(Failure::Mismatch(m)) if m[0].contains("older than 6")));
        // A swapped subject digest.
        let swapped = Expect { subjects: vec![("sealnode".into(), "cd".repeat(32))], ..ok.clone() };
        assert!(matches!(verify(&bytes, &vk, &swapped), Err(Failure::Mismatch(m)) if m[0].contains("expected")));
        // Not an envelope.
        assert!(matches!(verify(b"{}", &vk, &ok), Err(Failure::Malformed(_))));
        // The start-time statement answers no nonce.
        let start = serde_json::to_vec(&sign(&key, &sample(None, 5))).expect("json");
        assert!(matches!(verify(&start, &vk, &ok), Err(Failure::Nonce(m)) if m.contains("no nonce")));
        let start_ok = Expect { nonce: None, ..ok.clone() };
        assert!(verify(&start, &vk, &start_ok).is_ok());
        assert!(matches!(verify(&bytes, &vk, &start_ok), Err(Failure::Nonce(_))));
    }

    /// Envelopes and statements are read as strictly as the Python verifier reads them: a
    /// member DSSE does not have, a key given twice in a map (serde would keep the last), or an
    /// array where an object belongs (serde would take it for a struct) is malformed.
    #[test]
    fn envelopes_and_statements_are_read_strictly() {
        let key = SigningKey::from_bytes(&[7u8; 32]);
        let vk = key.verifying_key();
        let v = serde_json::to_value(sign(&key, &sample(None, 5))).expect("json");
        let expect = Expect { nonce: None, subjects: Vec::new(), min_generation: None, tpm_ak: None };
        assert!(verify(v.to_string().as_bytes(), &vk, &expect).is_ok());
        let edited = |f: &dyn Fn(&mut serde_json::Value)| {
            let mut v = v.clone();
            f(&mut v);
            v.to_string()
        };
        let extra = edited(&|v| v["x"] = 1.into());
        let array = edited(&|v| {
            let s = v["signatures"][0].clone();
            v["signatures"][0] = serde_json::json!([s["keyid"], s["sig"]]);
        });
        // A subject's digest given twice, in a statement signed as it is.
        let body = String::from_utf8(statement_bytes(&sample(None, 5))).expect("utf-8");
        let body = body.replacen("\"sha256\":\"", &format!("\"sha256\":\"{}\",\"sha256\":\"", "cd".repeat(32)), 1);
        assert!(body.contains(&"cd".repeat(32)), "{body}");
        let b64 = base64::engine::general_purpose::STANDARD;
        let twice = edited(&|v| {
            v["payload"] = b64.encode(&body).into();
            v["signatures"][0]["sig"] = b64.encode(key.sign(&pae(PAYLOAD_TYPE, body.as_bytes())).to_bytes()).into();
        });
        for (what, text) in [("an extra member", extra), ("a key twice", twice), ("an array for an object", array)] {
            assert!(
                matches!(verify(text.as_bytes(), &vk, &expect), Err(Failure::Malformed(_))),
                "{what}: {:?}",
                verify(text.as_bytes(), &vk, &expect).err()
            );
        }
    }

    #[test]
    fn nonces_are_hex_of_a_bounded_length() {
        assert_eq!(parse_nonce("00112233445566AA"), Ok("00112233445566aa".into()));
        assert!(parse_nonce("0011").unwrap_err().contains("8 to 64"));
        assert!(parse_nonce("zz").unwrap_err().contains("not hex"));
        assert!(parse_nonce(&"00".repeat(65)).is_err());
    }

    #[test]
    fn public_keys_parse_from_pem_or_hex() {
        let vk = SigningKey::from_bytes(&[9u8; 32]).verifying_key();
        assert_eq!(parse_public(public_pem(&vk).as_bytes()), Ok(vk));
        assert_eq!(parse_public(hex::encode(vk.as_bytes()).as_bytes()), Ok(vk));
        assert!(parse_public(b"nonsense").is_err());
    }
}
