//! Binding a statement to the machine's TPM 2.0 (docs/attestation.md, "TPM binding").
//!
//! For every statement the supervisor resets PCR 23, extends it with the sha256 of the
//! statement's exact bytes, and has the attestation key (a restricted ECDSA P-256 signing key
//! that `sealnode attest tpm-init` made under the endorsement key and persisted) quote PCRs
//! 0-7 and 23 with the verifier's nonce. The work is done by Debian's tpm2-tools; [`verify`]
//! checks a quote offline with no TPM.
//!
//! What a quote is, byte by byte (TPM 2.0 Library, Part 2): `attest` is a TPMS_ATTEST
//! (magic `ff544347`, type `8018` = quote, qualifiedSigner, extraData, clockInfo,
//! firmwareVersion, then TPMS_QUOTE_INFO: the PCR selection and the sha256 over the selected
//! PCRs' values in ascending order); `signature` is a TPMT_SIGNATURE (`0018` ECDSA, `000b`
//! sha256, then r and s, each a TPM2B). These are parsed here, a few fixed fields: the
//! Rust TPM stack (tss-esapi) would link libtss2 into every sealnode for that.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use p256::ecdsa::signature::Verifier as _;
use p256::pkcs8::DecodePublicKey as _;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

/// The PCR a statement's digest is extended into: resettable from locality 0 (TCG PC Client
/// profile), reserved for sealnode on a host that binds statements.
pub const PCR: u32 = 23;
/// The boot-state PCRs quoted beside it (firmware, boot loader, Secure Boot policy).
pub const BOOT_PCRS: [u32; 8] = [0, 1, 2, 3, 4, 5, 6, 7];
use crate::layout::TPM_TOOLS as TOOLS;
/// In the state dir's attest/: the attestation key's public key (SPKI PEM), its public area
/// (TPM2B_PUBLIC) and name (hex), and the endorsement key's public key, for enrolment.
pub const AK_FILE: &str = "tpm-ak.pem";
pub const AK_PUBLIC_FILE: &str = "tpm-ak.pub";
pub const AK_NAME_FILE: &str = "tpm-ak.name";
pub const EK_FILE: &str = "tpm-ek.pem";

const TPM_GENERATED: u32 = 0xff54_4347;
const ST_ATTEST_QUOTE: u16 = 0x8018;
const ALG_SHA256: u16 = 0x000b;
const ALG_ECDSA: u16 = 0x0018;

/// The quote an envelope carries beside its signatures (`tpmQuote`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Quote {
    /// hex sha256 of the attestation key's public key (SubjectPublicKeyInfo DER).
    pub ak: String,
    /// The quoted PCRs' sha256 values, by number: 0-7 and 23.
    pub pcrs: BTreeMap<String, String>,
    /// base64 of the TPMS_ATTEST the TPM signed.
    pub attest: String,
    /// base64 of the TPMT_SIGNATURE over it.
    pub signature: String,
}

use crate::config::TpmTarget as Target;

/// hex sha256 of a P-256 key's SubjectPublicKeyInfo DER: the `ak` of quotes and predicates.
pub fn ak_id(ak: &p256::ecdsa::VerifyingKey) -> String {
    use p256::pkcs8::EncodePublicKey as _;
    let der = ak.to_public_key_der().map(|d| d.as_bytes().to_vec()).unwrap_or_default();
    hex::encode(Sha256::digest(&der))
}

/// A P-256 public key in SPKI PEM (what tpm2-tools write with `-f pem`).
pub fn parse_ak(bytes: &[u8]) -> Result<p256::ecdsa::VerifyingKey, String> {
    let text = std::str::from_utf8(bytes).map_err(|_| "not UTF-8".to_string())?.trim();
    if !text.starts_with("-----BEGIN") {
        return Err("not a PEM block (nothing may come before it)".into());
    }
    p256::ecdsa::VerifyingKey::from_public_key_pem(text)
        .map_err(|e| format!("not an ECDSA P-256 public key in PEM: {e}"))
}

/// PCR 23's value after a reset and one extend with sha256(statement bytes).
pub fn expected_pcr(payload: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([0u8; 32]);
    h.update(Sha256::digest(payload));
    h.finalize().into()
}

/// The quote's extraData for a nonce: sha256 of its bytes (32 bytes fit every TPM's
/// TPM2B_DATA); empty for the start-time statement, which answers none.
pub fn qualifying_data(nonce: Option<&[u8]>) -> Vec<u8> {
    nonce.map(|n| Sha256::digest(n).to_vec()).unwrap_or_default()
}

/// The PCR numbers every quote selects, ascending.
fn selected() -> Vec<u32> {
    BOOT_PCRS.iter().copied().chain([PCR]).collect()
}

struct Reader<'a>(&'a [u8], &'static str);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8], String> {
        if self.0.len() < n {
            return Err(format!("the {} ends inside {what}", self.1));
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Ok(a)
    }
    fn u8(&mut self, what: &str) -> Result<u8, String> {
        Ok(self.take(1, what)?[0])
    }
    fn u16(&mut self, what: &str) -> Result<u16, String> {
        let b = self.take(2, what)?;
        Ok(u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self, what: &str) -> Result<u32, String> {
        let b = self.take(4, what)?;
        Ok(u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn u64(&mut self, what: &str) -> Result<u64, String> {
        let b = self.take(8, what)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(b);
        Ok(u64::from_be_bytes(a))
    }
    fn tpm2b(&mut self, what: &str) -> Result<&'a [u8], String> {
        let n = self.u16(what)? as usize;
        self.take(n, what)
    }
}

/// The fields of a quote's TPMS_ATTEST a verifier checks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attested {
    pub extra_data: Vec<u8>,
    pub reset_count: u32,
    pub restart_count: u32,
    /// The sha256 bank's selected PCR numbers, ascending.
    pub pcrs: Vec<u32>,
    pub pcr_digest: Vec<u8>,
}

/// Parse a TPMS_ATTEST of a quote (and nothing after it).
pub fn parse_attest(b: &[u8]) -> Result<Attested, String> {
    let mut r = Reader(b, "TPMS_ATTEST");
    if r.u32("magic")? != TPM_GENERATED {
        return Err("not made by a TPM (magic is not TPM_GENERATED)".into());
    }
    let kind = r.u16("type")?;
    if kind != ST_ATTEST_QUOTE {
        return Err(format!("type {kind:#06x} is not a quote ({ST_ATTEST_QUOTE:#06x})"));
    }
    r.tpm2b("qualifiedSigner")?;
    let extra_data = r.tpm2b("extraData")?.to_vec();
    let _clock = r.u64("clockInfo.clock")?;
    let reset_count = r.u32("clockInfo.resetCount")?;
    let restart_count = r.u32("clockInfo.restartCount")?;
    let _safe = r.u8("clockInfo.safe")?;
    let _firmware = r.u64("firmwareVersion")?;
    let banks = r.u32("pcrSelect.count")?;
    let mut pcrs = Vec::new();
    for _ in 0..banks {
        let alg = r.u16("pcrSelections.hash")?;
        let size = r.u8("pcrSelections.sizeofSelect")? as usize;
        let bits = r.take(size, "pcrSelections.pcrSelect")?;
        if alg != ALG_SHA256 {
            return Err(format!("the quote selects PCRs of bank {alg:#06x}; only sha256 ({ALG_SHA256:#06x}) is used"));
        }
        for (i, byte) in bits.iter().enumerate() {
            for bit in 0..8 {
                if byte & (1 << bit) != 0 {
                    pcrs.push((i * 8 + bit) as u32);
                }
            }
        }
    }
    if banks != 1 {
        return Err(format!("the quote selects {banks} PCR banks; sealnode's select one (sha256)"));
    }
    let pcr_digest = r.tpm2b("pcrDigest")?.to_vec();
    if !r.0.is_empty() {
        return Err(format!("{} bytes follow the TPMS_ATTEST", r.0.len()));
    }
    Ok(Attested { extra_data, reset_count, restart_count, pcrs, pcr_digest })
}

/// Parse a TPMT_SIGNATURE: ECDSA with sha256, r and s.
pub fn parse_signature(b: &[u8]) -> Result<p256::ecdsa::Signature, String> {
    let mut r = Reader(b, "TPMT_SIGNATURE");
    let alg = r.u16("sigAlg")?;
    let hash = r.u16("hash")?;
    if alg != ALG_ECDSA || hash != ALG_SHA256 {
        return Err(format!("signature scheme {alg:#06x}/{hash:#06x} is not ECDSA/sha256 (0x0018/0x000b)"));
    }
    let mut raw = [0u8; 64];
    for (i, what) in ["signatureR", "signatureS"].iter().enumerate() {
        let v = r.tpm2b(what)?;
        if v.len() > 32 {
            return Err(format!("{what} is {} bytes; P-256's are at most 32", v.len()));
        }
        raw[i * 32 + 32 - v.len()..(i + 1) * 32].copy_from_slice(v);
    }
    if !r.0.is_empty() {
        return Err(format!("{} bytes follow the TPMT_SIGNATURE", r.0.len()));
    }
    p256::ecdsa::Signature::from_slice(&raw).map_err(|e| format!("not an ECDSA signature: {e}"))
}

/// Verify a quote: signed by `ak`, over exactly PCRs 0-7 and 23 whose values it carries,
/// PCR 23 holding `payload`'s digest, extraData = [`qualifying_data`]`(nonce)`. Returns
/// what was verified, a line each.
pub fn verify(
    q: &Quote,
    ak: &p256::ecdsa::VerifyingKey,
    payload: &[u8],
    nonce: Option<&[u8]>,
) -> Result<Vec<String>, String> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let id = ak_id(ak);
    if !q.ak.eq_ignore_ascii_case(&id) {
        return Err(format!("the quote names attestation key {}, not the given one ({id})", q.ak));
    }
    let attest = b64.decode(&q.attest).map_err(|e| format!("tpmQuote.attest is not base64: {e}"))?;
    let sig = b64.decode(&q.signature).map_err(|e| format!("tpmQuote.signature is not base64: {e}"))?;
    let sig = parse_signature(&sig)?;
    ak.verify(&attest, &sig).map_err(|_| format!("the quote's signature does not verify with attestation key {id}"))?;
    let a = parse_attest(&attest)?;
    let want = qualifying_data(nonce);
    if a.extra_data != want {
        return Err(match nonce {
            Some(_) => "the quote was made for another nonce (a replayed quote?)".to_string(),
            None => "the quote carries a nonce, the statement none".to_string(),
        });
    }
    if a.pcrs != selected() {
        return Err(format!("the quote selects PCRs {:?}; sealnode's select {:?}", a.pcrs, selected()));
    }
    let mut values = Vec::new();
    if q.pcrs.len() != a.pcrs.len() {
        return Err(format!("tpmQuote.pcrs has {} values for {} quoted PCRs", q.pcrs.len(), a.pcrs.len()));
    }
    let mut composite = Sha256::new();
    for n in &a.pcrs {
        let v = q.pcrs.get(&n.to_string()).ok_or_else(|| format!("tpmQuote.pcrs has no PCR {n}"))?;
        let v = hex::decode(v)
            .ok()
            .filter(|v| v.len() == 32)
            .ok_or_else(|| format!("PCR {n}'s value is not 32 bytes of hex"))?;
        composite.update(&v);
        values.push((*n, v));
    }
    if composite.finalize().as_slice() != a.pcr_digest.as_slice() {
        return Err("the PCR values given are not the ones the TPM quoted (pcrDigest differs)".into());
    }
    let pcr23 = values.iter().find(|(n, _)| *n == PCR).map(|(_, v)| v.clone()).unwrap_or_default();
    if pcr23 != expected_pcr(payload) {
        return Err(format!(
            "PCR {PCR} is {}, not the statement's (sha256(0^32 || sha256(payload)) = {}): the quote is not over this statement",
            hex::encode(&pcr23),
            hex::encode(expected_pcr(payload))
        ));
    }
    let boot: Vec<String> =
        values.iter().filter(|(n, _)| *n != PCR).map(|(n, v)| format!("{n}={}", hex::encode(v))).collect();
    Ok(vec![
        format!("TPM: quote by attestation key {id} (ECDSA P-256 over the TPMS_ATTEST)"),
        format!(
            "TPM: PCR {PCR} holds this statement's digest{}",
            if nonce.is_some() { ", extraData = sha256(nonce)" } else { "" }
        ),
        format!(
            "TPM: reset count {}, restart count {} (its boot cycles, if the key is in the endorsement hierarchy: enrolment tells)",
            a.reset_count, a.restart_count
        ),
        format!("TPM: boot PCRs (sha256) {}", boot.join(" ")),
    ])
}

/// TPMA_OBJECT bits an attestation key must have: made in this TPM and never to leave it
/// (fixedTPM, fixedParent, sensitiveDataOrigin), signing only what the TPM itself produced
/// (restricted, sign). And must not have: decrypt.
const AK_MUST: u32 = 0x2 | 0x10 | 0x20 | 0x1_0000 | 0x4_0000;
const AK_MUST_NOT: u32 = 0x2_0000;
const ALG_ECC: u16 = 0x0023;
const ALG_NULL: u16 = 0x0010;
const CURVE_NIST_P256: u16 = 0x0003;

/// An attestation key's public area (TPMT_PUBLIC), checked to be a restricted ECDSA P-256
/// signing key made in the TPM.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AkPublic {
    pub key: p256::ecdsa::VerifyingKey,
    /// nameAlg (sha256) || sha256(TPMT_PUBLIC): what the TPM calls the key, and what a
    /// gateway's credential activation (`tpm2_makecredential`) is made for.
    pub name: Vec<u8>,
    pub attributes: u32,
}

/// Parse a TPM2B_PUBLIC (as `tpm2_readpublic -o` writes it) and check it is an attestation key
/// fit to quote: refused otherwise, saying which attribute or parameter is wrong.
pub fn parse_ak_public(b: &[u8]) -> Result<AkPublic, String> {
    let mut outer = Reader(b, "TPM2B_PUBLIC");
    let area = outer.tpm2b("publicArea")?;
    if !outer.0.is_empty() {
        return Err(format!("{} bytes follow the TPM2B_PUBLIC", outer.0.len()));
    }
    let mut r = Reader(area, "TPMT_PUBLIC");
    let kind = r.u16("type")?;
    let name_alg = r.u16("nameAlg")?;
    let attributes = r.u32("objectAttributes")?;
    r.tpm2b("authPolicy")?;
    if kind != ALG_ECC || name_alg != ALG_SHA256 {
        return Err(format!(
            "type {kind:#06x} / nameAlg {name_alg:#06x}: an attestation key here is ECC with sha256 names"
        ));
    }
    if attributes & AK_MUST != AK_MUST || attributes & AK_MUST_NOT != 0 {
        // Each attribute that is wrong, by name: the operator fixes that one.
        const NAMES: [(u32, &str); 6] = [
            (0x0000_0002, "fixedtpm"),
            (0x0000_0010, "fixedparent"),
            (0x0000_0020, "sensitivedataorigin"),
            (0x0001_0000, "restricted"),
            (0x0004_0000, "sign"),
            (0x0002_0000, "decrypt"),
        ];
        let lacks: Vec<&str> =
            NAMES.iter().filter(|(b, _)| AK_MUST & b != 0 && attributes & b == 0).map(|(_, n)| *n).collect();
        let has: Vec<&str> =
            NAMES.iter().filter(|(b, _)| AK_MUST_NOT & b != 0 && attributes & b != 0).map(|(_, n)| *n).collect();
        let mut wrong = Vec::new();
        if !lacks.is_empty() {
            wrong.push(format!("lacks {}", lacks.join(", ")));
        }
        if !has.is_empty() {
            wrong.push(format!("has {}", has.join(", ")));
        }
        return Err(format!(
            "attributes {attributes:#010x} {}: an attestation key must be fixedtpm|fixedparent|sensitivedataorigin|restricted|sign and not decrypt (a key without `restricted` signs anything, so its quotes prove nothing)",
            wrong.join(" and ")
        ));
    }
    let sym = r.u16("symmetric.algorithm")?;
    if sym != ALG_NULL {
        return Err(format!("symmetric {sym:#06x}: a signing key has none"));
    }
    let scheme = r.u16("scheme")?;
    let hash = if scheme != ALG_NULL { r.u16("scheme.hashAlg")? } else { ALG_NULL };
    if scheme != ALG_ECDSA || hash != ALG_SHA256 {
        return Err(format!("scheme {scheme:#06x}/{hash:#06x}: the attestation key must sign with ECDSA/sha256"));
    }
    let curve = r.u16("curveID")?;
    if curve != CURVE_NIST_P256 {
        return Err(format!("curve {curve:#06x} is not NIST P-256"));
    }
    let kdf = r.u16("kdf")?;
    if kdf != ALG_NULL {
        r.u16("kdf.hashAlg")?;
    }
    let x = r.tpm2b("unique.x")?;
    let y = r.tpm2b("unique.y")?;
    if !r.0.is_empty() || x.len() > 32 || y.len() > 32 {
        return Err("the public point is not a P-256 point".into());
    }
    let pad = |v: &[u8]| {
        let mut a = [0u8; 32];
        a[32 - v.len()..].copy_from_slice(v);
        a
    };
    let (x, y) = (pad(x), pad(y));
    let point = p256::EncodedPoint::from_affine_coordinates(&x.into(), &y.into(), false);
    let key = p256::ecdsa::VerifyingKey::from_encoded_point(&point)
        .map_err(|_| "the public point is not on P-256".to_string())?;
    let mut name = ALG_SHA256.to_be_bytes().to_vec();
    name.extend(Sha256::digest(area));
    Ok(AkPublic { key, name, attributes })
}

/// How long one statement's TPM work may take, all tools and tries together (off the loop:
/// the supervisor reaps the tools like any child and keeps serving meanwhile).
pub const QUOTE_DEADLINE: Duration = Duration::from_secs(10);
/// After a TPM did not answer in time, statements fail at once for this long instead of each
/// waiting out the deadline again.
pub const UNRESPONSIVE_BACKOFF: Duration = Duration::from_secs(30);
/// `tpm-init` and the start's key check: slower TPMs make keys in seconds.
const SETUP_DEADLINE: Duration = Duration::from_secs(20);

/// Why a tool run ended without a result.
#[derive(Debug)]
enum ToolError {
    /// The tool failed (its status and last stderr lines): worth another try.
    Failed(String),
    /// The deadline passed (the tool was killed) or a stop was requested: no further try.
    Abandoned(String),
}

impl From<ToolError> for String {
    fn from(e: ToolError) -> String {
        match e {
            ToolError::Failed(s) | ToolError::Abandoned(s) => s,
        }
    }
}

/// A tool started and not yet waited for.
#[derive(Debug)]
struct Spawned {
    tool: String,
    child: std::process::Child,
    out: std::fs::File,
    err: std::fs::File,
}

/// A statement being quoted: PCR 23 reset, extended, quoted, one tool at a time.
#[derive(Debug)]
pub struct QuoteJob {
    ak: p256::ecdsa::VerifyingKey,
    payload: Vec<u8>,
    nonce: Option<Vec<u8>>,
    until: Instant,
    tries: u32,
    /// 0 reset, 1 extend, 2 quote.
    step: u8,
    last: String,
    running: Option<Spawned>,
}

impl QuoteJob {
    /// The running tool's pid, for the caller's reaping.
    pub fn pid(&self) -> Option<i32> {
        self.running.as_ref().map(|s| s.child.id() as i32)
    }
    /// When the job is given up ([`Tools::expire`]).
    pub fn deadline(&self) -> Instant {
        self.until
    }
}

/// What a job's step came to.
#[derive(Debug)]
pub enum Progress {
    /// The next tool runs.
    Running,
    Done(Result<Quote, String>),
}

/// Runs the tpm2-tools for one TPM, with files in a dir only the launcher can reach.
#[derive(Debug)]
pub struct Tools {
    target: Target,
    /// The work dir: the tools run in it (entered by fd) and write their files there.
    work_fd: OwnedFd,
    /// Until when statements fail at once: the TPM last did not answer in time.
    unresponsive_until: std::cell::Cell<Option<Instant>>,
}

impl Tools {
    /// `work_fd`: a dir only the launcher can write ([`work_dir`]).
    pub fn new(target: Target, work_fd: OwnedFd) -> Self {
        Tools { target, work_fd, unresponsive_until: std::cell::Cell::new(None) }
    }

    /// Start one tool: the environment is explicit, it starts in the work dir, and no fd of
    /// ours is inherited. Its stdout and stderr go to unnamed files [`Tools::finish`] reads.
    fn spawn(&self, tool: &str, args: &[String]) -> Result<Spawned, ToolError> {
        use std::os::unix::process::CommandExt as _;
        let failed = |e: String| ToolError::Failed(format!("{tool}: {e}"));
        let path = Path::new(TOOLS).join(tool);
        let out = self.unnamed().map_err(|e| failed(format!("output file: {e}")))?;
        let err = self.unnamed().map_err(|e| failed(format!("output file: {e}")))?;
        let mut cmd = Command::new(&path);
        cmd.args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("TPM2TOOLS_TCTI", &self.target.tcti)
            .stdin(Stdio::null())
            .stdout(out.try_clone().map_err(|e| failed(e.to_string()))?)
            .stderr(err.try_clone().map_err(|e| failed(e.to_string()))?);
        let dir = std::os::fd::AsRawFd::as_raw_fd(&self.work_fd);
        // SAFETY: between fork and exec only fchdir and close_range run (async-signal-safe,
        // allocating nothing): the tool starts in the work dir, entered by the fd we checked,
        // and every fd of the supervisor above stderr is marked close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                // SAFETY: `dir` stays open in the child until exec (self outlives the spawn).
                nix::unistd::fchdir(std::os::fd::BorrowedFd::borrow_raw(dir)).map_err(std::io::Error::from)?;
                crate::os::sys::cloexec_from(3).map_err(std::io::Error::from)
            });
        }
        let child = cmd.spawn().map_err(|e| failed(format!("{}: {e} (install tpm2-tools)", path.display())))?;
        Ok(Spawned { tool: tool.to_string(), child, out, err })
    }

    /// A tool exited (`ok`: with status 0; `how`: its status, for the message): its stdout,
    /// or why it failed with the last of its stderr. The TPM refusing the key's authorization
    /// or being in lockout is never tried again: each try would raise its dictionary-attack
    /// counter towards lockout (tests/attest.rs:
    /// statements_are_quoted_by_the_tpm_and_a_replayed_quote_fails).
    fn finish(&self, s: Spawned, ok: bool, how: &str) -> Result<Vec<u8>, ToolError> {
        let read = |mut f: &std::fs::File| {
            use std::io::{Read, Seek};
            let mut v = Vec::new();
            let _ = f.rewind().and_then(|_| f.take(1 << 20).read_to_end(&mut v));
            v
        };
        if ok {
            return Ok(read(&s.out));
        }
        let e = String::from_utf8_lossy(&read(&s.err)).into_owned();
        let last: Vec<&str> = e.lines().filter(|l| !l.trim().is_empty()).collect();
        let tail = last[last.len().saturating_sub(3)..].join(" | ");
        let lower = e.to_ascii_lowercase();
        if ["0x98e", "0x921", "0x9a2", "lockout", "authorization hmac check failed", "da counter"]
            .iter()
            .any(|m| lower.contains(m))
        {
            return Err(ToolError::Abandoned(format!(
                "{}: the TPM refused the key's authorization or is in lockout ({tail}); not tried again",
                s.tool
            )));
        }
        Err(ToolError::Failed(format!("{} failed ({how}): {tail}", s.tool)))
    }

    /// Run one tool to its end, by `until` at the latest, and sooner if `stop()` (checked every
    /// few ms). For the steps before the event loop (`tpm-init`, the start's checks).
    fn run(&self, tool: &str, args: &[String], until: Instant, stop: &dyn Fn() -> bool) -> Result<Vec<u8>, ToolError> {
        let mut s = self.spawn(tool, args)?;
        loop {
            match s.child.try_wait() {
                Ok(Some(st)) => return self.finish(s, st.success(), &st.to_string()),
                Ok(None) if Instant::now() < until && !stop() => std::thread::sleep(Duration::from_millis(2)),
                Ok(None) | Err(_) => {
                    let _ = s.child.kill();
                    let _ = s.child.wait();
                    return Err(self.gave_up(tool, stop()));
                }
            }
        }
    }

    /// A tool killed: for a stop, or because the TPM did not answer in time (then statements
    /// fail at once for a while).
    fn gave_up(&self, tool: &str, stopped: bool) -> ToolError {
        if stopped {
            return ToolError::Abandoned(format!("{tool}: a stop was requested"));
        }
        self.unresponsive_until.set(Some(Instant::now() + UNRESPONSIVE_BACKOFF));
        ToolError::Abandoned(format!(
            "the TPM did not answer in time ({tool} killed); statements fail at once for the next {} s",
            UNRESPONSIVE_BACKOFF.as_secs()
        ))
    }

    /// A setup step (`tpm-init`, the start's key check): one try within [`SETUP_DEADLINE`],
    /// ended early by `stop()`.
    fn setup(&self, tool: &str, args: &[&str], stop: &dyn Fn() -> bool) -> Result<Vec<u8>, String> {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        self.run(tool, &args, Instant::now() + SETUP_DEADLINE, stop).map_err(String::from)
    }

    /// An unnamed file in the work dir, for a tool's output.
    fn unnamed(&self) -> nix::Result<std::fs::File> {
        use nix::fcntl::{openat, OFlag};
        let fd = openat(
            &self.work_fd,
            ".",
            OFlag::O_TMPFILE | OFlag::O_RDWR | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::from_bits_truncate(0o600),
        )?;
        Ok(std::fs::File::from(fd))
    }

    /// Read (and remove) a file a tool wrote in the work dir.
    fn take_file(&self, name: &str) -> Result<Vec<u8>, String> {
        use nix::fcntl::{openat, OFlag};
        let fd = openat(
            &self.work_fd,
            name,
            OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| format!("{name}: {e}"))?;
        let mut v = Vec::new();
        std::io::Read::read_to_end(&mut std::io::Read::take(std::fs::File::from(fd), 1 << 20), &mut v)
            .map_err(|e| format!("{name}: {e}"))?;
        let _ = nix::unistd::unlinkat(&self.work_fd, name, nix::unistd::UnlinkatFlags::NoRemoveDir);
        Ok(v)
    }

    fn clear(&self, names: &[&str]) {
        for n in names {
            let _ = nix::unistd::unlinkat(&self.work_fd, *n, nix::unistd::UnlinkatFlags::NoRemoveDir);
        }
    }

    fn handle(&self) -> String {
        format!("{:#010x}", self.target.ak_handle)
    }

    /// The persisted attestation key's public area, read from the TPM and checked
    /// ([`parse_ak_public`]): as TPM2B_PUBLIC bytes and parsed.
    pub fn read_ak(&self, stop: &dyn Fn() -> bool) -> Result<(Vec<u8>, AkPublic), String> {
        self.clear(&["ak-read.pub"]);
        self.setup("tpm2_readpublic", &["-c", &self.handle(), "-o", "ak-read.pub"], stop)?;
        let raw = self.take_file("ak-read.pub")?;
        let ak = parse_ak_public(&raw).map_err(|e| format!("the key at {}: {e}", self.handle()))?;
        Ok((raw, ak))
    }

    /// Start quoting `payload` for `nonce` ([`Tools::quote`] says how), without waiting: the
    /// caller reaps the job's tool ([`QuoteJob::pid`]) and hands its exit to
    /// [`Tools::on_exit`], or [`Tools::expire`]s it at [`QuoteJob::deadline`]. Refused at
    /// once while the TPM is held unresponsive.
    pub fn begin_quote(
        &self,
        ak: p256::ecdsa::VerifyingKey,
        payload: Vec<u8>,
        nonce: Option<Vec<u8>>,
    ) -> Result<QuoteJob, String> {
        if let Some(t) = self.unresponsive_until.get() {
            let left = t.saturating_duration_since(Instant::now());
            if !left.is_zero() {
                return Err(format!(
                    "the TPM did not answer in time {} s ago; not asked again for {} s",
                    (UNRESPONSIVE_BACKOFF - left).as_secs(),
                    left.as_secs() + 1
                ));
            }
            self.unresponsive_until.set(None);
        }
        let mut job = QuoteJob {
            ak,
            payload,
            nonce,
            until: Instant::now() + QUOTE_DEADLINE,
            tries: 0,
            step: 0,
            last: String::new(),
            running: None,
        };
        match self.spawn_step(&mut job) {
            Ok(()) => Ok(job),
            Err(e) => match self.retry(&mut job, e) {
                Progress::Done(r) => r.map(|_| job).map_err(|e| e.to_string()),
                Progress::Running => Ok(job),
            },
        }
    }

    /// The job's tool exited (the caller reaped it; `ok`: status 0): the next step, a retry,
    /// or the result.
    pub fn on_exit(&self, job: &mut QuoteJob, ok: bool, how: &str) -> Progress {
        let Some(s) = job.running.take() else { return Progress::Done(Err("no TPM tool was running".into())) };
        if let Err(e) = self.finish(s, ok, how) {
            return self.retry(job, e);
        }
        if job.step < 2 {
            job.step += 1;
            return match self.spawn_step(job) {
                Ok(()) => Progress::Running,
                Err(e) => self.retry(job, e),
            };
        }
        match self.collect(job) {
            Ok(q) => Progress::Done(Ok(q)),
            Err(e) => self.retry(job, e),
        }
    }

    /// The job's deadline passed: its tool is killed (the caller still reaps it) and the TPM
    /// held unresponsive for a while.
    pub fn expire(&self, job: &mut QuoteJob) -> String {
        let tool = job.running.as_ref().map(|s| s.tool.clone()).unwrap_or_default();
        self.abandon(job);
        self.gave_up(&tool, false).into()
    }

    /// Kill the job's tool, if one runs (a stop; the caller still reaps it).
    pub fn abandon(&self, job: &mut QuoteJob) {
        if let Some(mut s) = job.running.take() {
            let _ = s.child.kill();
        }
    }

    fn retry(&self, job: &mut QuoteJob, e: ToolError) -> Progress {
        let e = match e {
            ToolError::Abandoned(e) => return Progress::Done(Err(e)),
            ToolError::Failed(e) => e,
        };
        job.tries += 1;
        if job.tries >= 3 || Instant::now() >= job.until {
            return Progress::Done(Err(format!("the TPM quote failed {} times: {e}", job.tries)));
        }
        tracing::warn!(error = %e, "a TPM quote failed; quoting again");
        job.last = e;
        job.step = 0;
        match self.spawn_step(job) {
            Ok(()) => Progress::Running,
            Err(e) => self.retry(job, e),
        }
    }

    /// Start the job's current step: reset PCR 23, extend it, quote.
    fn spawn_step(&self, job: &mut QuoteJob) -> Result<(), ToolError> {
        let (tool, args): (&str, Vec<String>) = match job.step {
            0 => {
                self.clear(&["quote.msg", "quote.sig", "quote.pcrs"]);
                ("tpm2_pcrreset", vec![PCR.to_string()])
            }
            1 => ("tpm2_pcrextend", vec![format!("{PCR}:sha256={}", hex::encode(Sha256::digest(&job.payload)))]),
            _ => {
                let list: Vec<String> = selected().iter().map(u32::to_string).collect();
                let mut args: Vec<String> = ["-c", &self.handle(), "-g", "sha256", "-l"].map(String::from).to_vec();
                args.push(format!("sha256:{}", list.join(",")));
                let q = qualifying_data(job.nonce.as_deref());
                if !q.is_empty() {
                    args.extend(["-q".into(), hex::encode(&q)]);
                }
                args.extend(
                    ["-m", "quote.msg", "-s", "quote.sig", "-o", "quote.pcrs", "-F", "values"].map(String::from),
                );
                ("tpm2_quote", args)
            }
        };
        job.running = Some(self.spawn(tool, &args)?);
        Ok(())
    }

    /// The quote's files, as a [`Quote`] checked with [`verify`].
    fn collect(&self, job: &QuoteJob) -> Result<Quote, ToolError> {
        let b64 = base64::engine::general_purpose::STANDARD;
        let msg = self.take_file("quote.msg").map_err(ToolError::Failed)?;
        let sig = self.take_file("quote.sig").map_err(ToolError::Failed)?;
        let values = self.take_file("quote.pcrs").map_err(ToolError::Failed)?;
        let sel = selected();
        if values.len() != 32 * sel.len() {
            return Err(ToolError::Failed(format!(
                "tpm2_quote wrote {} bytes of PCR values, not {}",
                values.len(),
                32 * sel.len()
            )));
        }
        let pcrs = sel.iter().zip(values.chunks(32)).map(|(n, v)| (n.to_string(), hex::encode(v))).collect();
        let q = Quote { ak: ak_id(&job.ak), pcrs, attest: b64.encode(&msg), signature: b64.encode(&sig) };
        verify(&q, &job.ak, &job.payload, job.nonce.as_deref())
            .map_err(|e| ToolError::Failed(format!("the quote does not check: {e}")))?;
        Ok(q)
    }

    /// Extend PCR 23 with the payload's digest (after a reset) and quote it, checked with
    /// [`verify`] before it is returned, waiting for it (for the start's check; `run` quotes
    /// through [`Tools::begin_quote`]). A try that fails (PCR 23 changed by someone else in
    /// between, a tool's error) is made again, three tries within [`QUOTE_DEADLINE`]; a TPM
    /// that does not answer in time, refuses the key's authorization, or a stop, ends it.
    pub fn quote(
        &self,
        ak: &p256::ecdsa::VerifyingKey,
        payload: &[u8],
        nonce: Option<&[u8]>,
        stop: &dyn Fn() -> bool,
    ) -> Result<Quote, String> {
        let mut job = self.begin_quote(*ak, payload.to_vec(), nonce.map(<[u8]>::to_vec))?;
        loop {
            let Some(s) = job.running.as_mut() else { return Err("no TPM tool is running".into()) };
            match s.child.try_wait() {
                Ok(Some(st)) => {
                    if let Progress::Done(r) = self.on_exit(&mut job, st.success(), &st.to_string()) {
                        return r;
                    }
                }
                Ok(None) if Instant::now() < job.until && !stop() => std::thread::sleep(Duration::from_millis(2)),
                Ok(None) | Err(_) => {
                    if stop() {
                        self.abandon(&mut job);
                        return Err("a stop was requested".into());
                    }
                    let e = self.expire(&mut job);
                    return Err(e);
                }
            }
        }
    }

    /// A step of `tpm-init` (a command an operator runs: no stop to watch for).
    fn init_step(&self, tool: &str, args: &[&str]) -> Result<Vec<u8>, String> {
        self.setup(tool, args, &|| false)
    }

    /// `attest tpm-init`: an ECC endorsement key, an ECDSA P-256 attestation key under it,
    /// the latter persisted at the handle (an existing one there is evicted only if `force`).
    /// Returns the AK's TPM2B_PUBLIC, parsed, and the EK's public key as PEM.
    pub fn init(&self, force: bool) -> Result<(Vec<u8>, AkPublic, Vec<u8>), String> {
        // Anything at the handle counts, a key fit to quote or not.
        if self.init_step("tpm2_readpublic", &["-c", &self.handle()]).is_ok() {
            if !force {
                return Err(format!(
                    "handle {} holds a key already; keep it, or replace it with --force (verifiers then need the new key)",
                    self.handle()
                ));
            }
            self.init_step("tpm2_evictcontrol", &["-C", "o", "-c", &self.handle()])?;
        }
        self.clear(&["ek.ctx", "ek.pem", "ak.ctx", "ak.pub", "ak.name"]);
        self.init_step("tpm2_createek", &["-G", "ecc", "-c", "ek.ctx", "-u", "ek.pem", "-f", "pem"])?;
        self.init_step(
            "tpm2_createak",
            &[
                "-C", "ek.ctx", "-G", "ecc", "-g", "sha256", "-s", "ecdsa", "-c", "ak.ctx", "-u", "ak.pub", "-n",
                "ak.name",
            ],
        )?;
        self.init_step("tpm2_flushcontext", &["-t"])?;
        self.init_step("tpm2_evictcontrol", &["-C", "o", "-c", "ak.ctx", &self.handle()])?;
        self.init_step("tpm2_flushcontext", &["-t"])?;
        let ek = self.take_file("ek.pem")?;
        let made =
            parse_ak_public(&self.take_file("ak.pub")?).map_err(|e| format!("the key tpm2_createak made: {e}"))?;
        self.clear(&["ek.ctx", "ak.ctx", "ak.name"]);
        let (raw, persisted) = self.read_ak(&|| false)?;
        if made != persisted {
            return Err(format!("the key persisted at {} is not the one just made", self.handle()));
        }
        Ok((raw, persisted, ek))
    }
}

/// The work dir's fd, for [`Tools::new`].
pub fn work_dir(path: &Path, uid: u32) -> Result<OwnedFd, String> {
    crate::os::trusted::own_dir(path, uid, 0o700).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer as _;

    /// A quote as a TPM would make it, marshalled by hand from the spec's layout.
    fn marshal(extra: &[u8], pcrs: &[u32], digest: &[u8]) -> Vec<u8> {
        let mut v = Vec::new();
        v.extend(TPM_GENERATED.to_be_bytes());
        v.extend(ST_ATTEST_QUOTE.to_be_bytes());
        v.extend(34u16.to_be_bytes());
        v.extend([0xaa; 34]);
        v.extend((extra.len() as u16).to_be_bytes());
        v.extend(extra);
        v.extend(77u64.to_be_bytes());
        v.extend(5u32.to_be_bytes());
        v.extend(0u32.to_be_bytes());
        v.push(1);
        v.extend(0x2019_1023u64.to_be_bytes());
        v.extend(1u32.to_be_bytes());
        v.extend(ALG_SHA256.to_be_bytes());
        v.push(3);
        let mut bits = [0u8; 3];
        for p in pcrs {
            bits[*p as usize / 8] |= 1 << (p % 8);
        }
        v.extend(bits);
        v.extend((digest.len() as u16).to_be_bytes());
        v.extend(digest);
        v
    }

    fn tpm_sig(key: &p256::ecdsa::SigningKey, msg: &[u8]) -> Vec<u8> {
        let sig: p256::ecdsa::Signature = key.sign(msg);
        let b = sig.to_bytes();
        let mut v = Vec::new();
        v.extend(ALG_ECDSA.to_be_bytes());
        v.extend(ALG_SHA256.to_be_bytes());
        for half in [&b[..32], &b[32..]] {
            v.extend(32u16.to_be_bytes());
            v.extend(half);
        }
        v
    }

    fn quote_for(key: &p256::ecdsa::SigningKey, payload: &[u8], nonce: Option<&[u8]>) -> Quote {
        let mut pcrs = BTreeMap::new();
        let mut composite = Sha256::new();
        for n in selected() {
            let v = if n == PCR { expected_pcr(payload) } else { [n as u8; 32] };
            composite.update(v);
            pcrs.insert(n.to_string(), hex::encode(v));
        }
        let attest = marshal(&qualifying_data(nonce), &selected(), &composite.finalize());
        let b64 = base64::engine::general_purpose::STANDARD;
        Quote {
            ak: ak_id(key.verifying_key()),
            pcrs,
            attest: b64.encode(&attest),
            signature: b64.encode(tpm_sig(key, &attest)),
        }
    }

    #[test]
    fn a_quote_verifies_and_each_forgery_fails_with_its_reason() {
        let key = p256::ecdsa::SigningKey::from_slice(&[3u8; 32]).expect("key");
        let other = p256::ecdsa::SigningKey::from_slice(&[4u8; 32]).expect("key");
        let ak = *key.verifying_key();
        let payload = b"{\"statement\":1}";
        let nonce = b"0123456789abcdef";
        let q = quote_for(&key, payload, Some(nonce));
        let said = verify(&q, &ak, payload, Some(nonce)).expect("verifies");
        assert!(said[1].contains("PCR 23 holds this statement's digest"), "{said:?}");
        assert!(said[2].contains("reset count 5"), "{said:?}");

        let err = |q: &Quote, p: &[u8], n: Option<&[u8]>| verify(q, &ak, p, n).expect_err("must fail");
        // A replayed quote: another nonce.
        assert!(err(&q, payload, Some(b"fedcba9876543210")).contains("another nonce"));
        // Another statement's bytes.
        assert!(err(&q, b"{\"statement\":2}", Some(nonce)).contains("not over this statement"));
        // A changed PCR value.
        let mut changed = q.clone();
        changed.pcrs.insert("7".into(), "00".repeat(32));
        assert!(err(&changed, payload, Some(nonce)).contains("pcrDigest differs"));
        // Signed by another key, named as this one.
        let mut forged = quote_for(&other, payload, Some(nonce));
        forged.ak = ak_id(&ak);
        assert!(err(&forged, payload, Some(nonce)).contains("does not verify"));
        // Another key's quote, named as such.
        let theirs = quote_for(&other, payload, Some(nonce));
        assert!(err(&theirs, payload, Some(nonce)).contains("names attestation key"));
        // A changed byte of the attested structure.
        let b64 = base64::engine::general_purpose::STANDARD;
        let mut raw = b64.decode(&q.attest).expect("b64");
        raw[10] ^= 1;
        let flipped = Quote { attest: b64.encode(&raw), ..q.clone() };
        assert!(err(&flipped, payload, Some(nonce)).contains("does not verify"));
        // No nonce on either side: the start-time statement's quote.
        let start = quote_for(&key, payload, None);
        assert!(verify(&start, &ak, payload, None).is_ok());
        assert!(err(&start, payload, Some(nonce)).contains("another nonce"));
    }

    #[test]
    fn only_quotes_of_sealnodes_pcr_selection_are_taken() {
        let key = p256::ecdsa::SigningKey::from_slice(&[3u8; 32]).expect("key");
        let payload = b"p";
        let mut q = quote_for(&key, payload, None);
        // Re-sign a selection without PCR 23 (a quote of boot state only).
        let attest = marshal(&[], &BOOT_PCRS, &[0u8; 32]);
        let b64 = base64::engine::general_purpose::STANDARD;
        q.attest = b64.encode(&attest);
        q.signature = b64.encode(tpm_sig(&key, &attest));
        assert!(verify(&q, key.verifying_key(), payload, None).expect_err("refused").contains("selects PCRs"));
        assert!(parse_attest(&attest[..20]).expect_err("short").contains("ends inside"));
        let mut not_tpm = attest.clone();
        not_tpm[0] = 0;
        assert!(parse_attest(&not_tpm).expect_err("magic").contains("TPM_GENERATED"));
        assert!(parse_signature(&[0, 0x14, 0, 0x0b]).expect_err("rsa").contains("not ECDSA"));
    }

    /// An attestation key's public area as swtpm and tpm2_createak made it (tpm2_readpublic
    /// -o), and the name tpm2-tools printed for it.
    const REAL_AK: &str = "00580023000b00050072000000100018000b00030010002089a3c0cbda4626947a7a636ebc5608d353f86cbf697c7d95ce542975076311c9002050080ea301a8521ce1cbbf8f90d4e445ba5a0ec8bcb34a599d76bb9d39d459d2";
    const REAL_NAME: &str = "000bd24f3be85bdb75f1efa8dc1ae6f9992b7919fd3535a1b7f2b1dac0458d45edb4";

    #[test]
    fn only_a_restricted_p256_signing_key_made_in_the_tpm_is_an_attestation_key() {
        let raw = hex::decode(REAL_AK).expect("hex");
        let ak = parse_ak_public(&raw).expect("a real AK");
        assert_eq!(hex::encode(&ak.name), REAL_NAME);
        assert_eq!(ak.attributes, 0x0005_0072);
        // The same key with one attribute changed: each refused (the name changes too).
        let attrs_at = 2 + 2 + 2;
        for (attrs, why) in [
            (0x0004_0072u32, "lacks restricted:"), // signs anything
            (0x0005_0070, "lacks fixedtpm:"),      // may leave the TPM
            (0x0007_0072, "has decrypt:"),         // decrypt as well
            (0x0001_0072, "lacks sign:"),          // cannot quote
        ] {
            let mut b = raw.clone();
            b[attrs_at..attrs_at + 4].copy_from_slice(&attrs.to_be_bytes());
            let e = parse_ak_public(&b).expect_err("refused");
            assert!(e.contains(&format!("attributes {attrs:#010x} {why}")), "{attrs:#x}: {e}");
        }
        // Another curve, scheme, or trailing bytes.
        let curve_at = raw.len() - 2 - 32 - 2 - 32 - 2 - 2;
        let mut b = raw.clone();
        b[curve_at..curve_at + 2].copy_from_slice(&0x0004u16.to_be_bytes());
        assert!(parse_ak_public(&b).expect_err("P-384").contains("not NIST P-256"));
        let mut b = raw.clone();
        b[14..16].copy_from_slice(&0x001au16.to_be_bytes());
        assert!(parse_ak_public(&b).expect_err("ECDAA").contains("ECDSA/sha256"));
        let mut b = raw.clone();
        b.push(0);
        assert!(parse_ak_public(&b).expect_err("trailing").contains("follow"));
        assert!(parse_ak_public(&raw[..40]).expect_err("short").contains("ends inside"));
    }
}
