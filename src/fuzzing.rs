//! Fuzz entry points: one function per parser that faces operator-written or untrusted input.
//! The cargo-fuzz targets under `fuzz/` call these, and `tests/fuzz_corpus.rs` replays the
//! committed corpus through the same functions, so CI catches a regression without a fuzzer.
//!
//! Each function panics only when it finds a bug: a panic inside a parser, a rejection without a
//! clear message naming the file, or (for seccomp) a compiled program that decides a syscall
//! differently from what the JSON policy says.

use std::path::Path;

use seccompiler::TargetArch;

const FILE: &str = "fuzz-input";

/// A rejection must be a clear error: it names the file and says why.
fn clear(e: &crate::Error) {
    let msg = e.to_string();
    assert!(msg.contains(FILE), "error does not name the file: {msg:?}");
    assert!(msg.len() > FILE.len() + 4, "error without a reason: {msg:?}");
}

/// The config loader's pure half (TOML, schema, field validation).
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = crate::config::Config::parse(text, Path::new(FILE)) {
        clear(&e);
    }
}

/// A Landlock rules file.
pub fn landlock_rules(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = crate::policy::landlock::Rules::parse(text, Path::new(FILE)) {
        clear(&e);
    }
}

/// Differential: the first 53 bytes choose an architecture, a syscall number and six arguments;
/// the rest is a seccompiler JSON policy whose filter `engine` sealnode compiles. When sealnode
/// accepts the policy, seccompiler (the reference implementation of the JSON's meaning) must
/// accept it too, and both programs must decide the chosen call, every syscall the policy names
/// and their neighbours, and every number below 1024, with the chosen, zero, all-ones and
/// high-word-flipped arguments, exactly alike. Rules for calls only sealnode's newer table
/// knows are dropped from the comparison.
pub fn seccomp(data: &[u8]) {
    const HEAD: usize = 1 + 4 + 6 * 8;
    if data.len() < HEAD {
        return;
    }
    let (head, json) = data.split_at(HEAD);
    let Ok(text) = std::str::from_utf8(json) else { return };
    let arch = if head[0] & 1 == 0 { TargetArch::x86_64 } else { TargetArch::aarch64 };
    let nr = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    let mut args = [0u64; 6];
    for (i, a) in args.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&head[5 + i * 8..13 + i * 8]);
        *a = u64::from_le_bytes(b);
    }
    let file = Path::new(FILE);
    let _accepted = match crate::policy::seccomp::compile_text(text, file, "engine", arch) {
        Ok(p) => p,
        Err(e) => return clear(&e),
    };
    // sealnode's syscall table (the `syscalls` crate) knows newer calls than seccompiler's, e.g.
    // setxattrat: drop the rules seccompiler cannot name and compare both compilers on the rest.
    let mut text = text.to_string();
    let theirs = loop {
        match crate::policy::seccomp::compile_with_seccompiler(&text, file, "engine", arch) {
            Ok(p) => break p,
            Err(e) => {
                let msg = e.to_string();
                let Some(name) = msg.split("Invalid syscall name: ").nth(1).and_then(|r| r.split(' ').next()) else {
                    panic!("sealnode accepted a policy seccompiler rejects: {msg}");
                };
                let mut doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
                let rules = doc["engine"]["filter"].as_array_mut().expect("linted");
                let before = rules.len();
                rules.retain(|r| r["syscall"].as_str() != Some(name));
                assert!(rules.len() < before, "seccompiler refuses {name:?}, which no rule names: {msg}");
                text = doc.to_string();
            }
        }
    };
    let ours = match crate::policy::seccomp::compile_text(&text, file, "engine", arch) {
        Ok(p) => p,
        // Without the newer calls' rules a filter may be empty and refused: nothing to compare.
        Err(_) => return,
    };
    let text = text.as_str();
    let a = crate::policy::arch::audit_arch(arch);
    let filter = crate::policy::bpf::parse(text, file, "engine", arch).expect("parsed once already");
    let named = filter.rules.keys().copied();
    // Every number a named call's neighbours, low numbers densely, and the X32 bit.
    let near = filter.rules.keys().flat_map(|n| [n.wrapping_sub(1), n + 1]).collect::<Vec<_>>();
    let numbers = std::iter::once(nr).chain(named).chain(near).chain(0..1024).chain([0x4000_0000 | nr, u32::MAX]);
    for n in numbers {
        for args in [args, [0; 6], [u64::MAX; 6], args.map(|x| x ^ 0xffff_ffff_0000_0000)] {
            let (o, t) =
                (crate::policy::bpf::interpret(&ours, a, n, args), crate::policy::bpf::interpret(&theirs, a, n, args));
            assert_eq!(o, t, "nr {n} args {args:x?}: sealnode {o:#x}, seccompiler {t:#x}");
        }
    }
}

/// The control socket's request parser, whole and fed in pieces as a slow client would.
pub fn control(data: &[u8]) {
    let whole = crate::control::parse(data);
    if let Err(e) = &whole {
        assert!(!e.is_empty(), "empty control error");
    }
    // Fed in pieces, the parser must reach the same answer as for the whole input: the same
    // request or the same error, once the line (or too much) has arrived.
    let mut buf = Vec::new();
    let mut chunked = None;
    for chunk in data.chunks(3) {
        if let Some(r) = crate::control::feed(&mut buf, chunk) {
            chunked = Some(r);
            break;
        }
    }
    let mut once = Vec::new();
    let fed_whole = crate::control::feed(&mut once, data);
    assert_eq!(chunked, fed_whole, "chunked and whole feeds differ");
    if let Some(r) = chunked {
        if let Err(e) = &r {
            assert!(!e.is_empty(), "empty control error");
        }
        // A complete line parses the same as `parse` on that line.
        if let Some(end) = data.iter().position(|b| *b == b'\n').filter(|e| *e <= crate::control::MAX_REQUEST) {
            assert_eq!(r, crate::control::parse(&data[..=end]), "feed and parse differ");
        }
    }
}

/// A receipt file (what `verify-receipt` reads).
pub fn receipt(data: &[u8]) {
    if let Err(e) = crate::proof::receipt::parse(data, Path::new(FILE)) {
        clear(&e);
    }
}

/// The fuzz targets' ed25519 key. Its seed is public: it signs nothing but fuzz inputs.
pub fn fuzz_key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[7u8; 32])
}

/// The nonce an `attestation` input may ask the verifier to expect.
pub const FUZZ_NONCE: &str = "a1b2c3d4e5f60718293a4b5c6d7e8f90";

/// What an `attestation` input stands for: the envelope to verify and what the verifier
/// expects (the arguments a gateway would give `verify-attestation`).
#[derive(Debug, Clone)]
pub struct AttestationCase {
    pub envelope: Vec<u8>,
    pub nonce: Option<String>,
    pub subjects: Vec<(String, String)>,
    pub min_generation: Option<u64>,
}

/// Byte 0 chooses: bit 0, the rest is a whole envelope (0) or a payload this target signs
/// with [`fuzz_key`] into a DSSE envelope (1: the fuzzer then reaches the statement's parser
/// and checks, behind the signature); bit 1, the verifier expects [`FUZZ_NONCE`] (else none);
/// bit 2, it expects `engine.program` and `model:model.gguf` to be sha256("x"); bit 3, it
/// expects generation 2 or later.
pub fn attestation_case(data: &[u8]) -> Option<AttestationCase> {
    use base64::Engine as _;
    use ed25519_dalek::Signer as _;
    let (&flags, rest) = data.split_first()?;
    let envelope = if flags & 1 == 0 {
        rest.to_vec()
    } else {
        let key = fuzz_key();
        let sig = key.sign(&crate::proof::attest::pae(crate::proof::attest::PAYLOAD_TYPE, rest));
        let b64 = base64::engine::general_purpose::STANDARD;
        serde_json::to_vec(&crate::proof::attest::Envelope {
            payload_type: crate::proof::attest::PAYLOAD_TYPE.into(),
            payload: b64.encode(rest),
            signatures: vec![crate::proof::attest::Signature {
                keyid: crate::proof::attest::keyid(&key.verifying_key()),
                sig: b64.encode(sig.to_bytes()),
            }],
            tpm_quote: None,
        })
        .ok()?
    };
    let x = crate::os::atomic::sha256_hex(b"x");
    Some(AttestationCase {
        envelope,
        nonce: (flags & 2 != 0).then(|| FUZZ_NONCE.to_string()),
        subjects: if flags & 4 != 0 {
            vec![("engine.program".into(), x.clone()), ("model:model.gguf".into(), x)]
        } else {
            Vec::new()
        },
        min_generation: (flags & 8 != 0).then_some(2),
    })
}

/// What a gateway receives from the network: a DSSE envelope verified with a key and
/// expectations ([`attestation_case`]). A verdict either way, never a panic; a failure says
/// why; an acceptance holds what it claims (the expected nonce, subjects and generation; the
/// v2 predicate; no subject twice).
pub fn attestation(data: &[u8]) {
    let Some(c) = attestation_case(data) else { return };
    let expect = crate::proof::attest::Expect {
        nonce: c.nonce.clone(),
        subjects: c.subjects.clone(),
        min_generation: c.min_generation,
        tpm_ak: None,
    };
    match crate::proof::attest::verify(&c.envelope, &fuzz_key().verifying_key(), &expect) {
        Err(f) => assert!(!format!("{f:?}").is_empty()),
        Ok((st, said)) => {
            assert!(!said.is_empty(), "accepted without saying what was verified");
            assert_eq!(st.predicate_type, crate::proof::attest::PREDICATE_TYPE);
            assert!(st.predicate.nonce.as_deref().map(str::to_ascii_lowercase) == c.nonce, "nonce");
            if let Some(min) = c.min_generation {
                assert!(st.predicate.generation >= min, "generation");
            }
            let mut names = std::collections::BTreeSet::new();
            assert!(st.subject.iter().all(|s| names.insert(s.name.clone())), "a subject twice");
            for (name, want) in &c.subjects {
                let got = st.subject.iter().find(|s| &s.name == name).and_then(|s| s.digest.get("sha256"));
                assert!(got.is_some_and(|g| g.eq_ignore_ascii_case(want)), "{name} accepted with {got:?}");
            }
        }
    }
}

/// The fuzz targets' TPM attestation key (P-256). Its scalar is public: it signs nothing but
/// fuzz inputs.
pub fn fuzz_ak() -> p256::ecdsa::SigningKey {
    let mut d = [0u8; 32];
    d[31] = 7;
    p256::ecdsa::SigningKey::from_bytes(&d.into()).expect("a valid scalar")
}

/// The payload and nonce a `tpm_quote` input's quote is checked against.
pub const FUZZ_PAYLOAD: &[u8] = b"{\"_type\":\"fuzz\"}";

/// A TPMT_SIGNATURE (ECDSA, sha256) of `attest` by [`fuzz_ak`], as a TPM writes it.
pub fn fuzz_tpm_signature(attest: &[u8]) -> Vec<u8> {
    use p256::ecdsa::signature::Signer as _;
    let sig: p256::ecdsa::Signature = fuzz_ak().sign(attest);
    let (r, s) = sig.split_bytes();
    let mut v = vec![0x00, 0x18, 0x00, 0x0b];
    for part in [r, s] {
        v.extend_from_slice(&(part.len() as u16).to_be_bytes());
        v.extend_from_slice(&part);
    }
    v
}

/// What a `tpm_quote` input stands for: a quote over [`FUZZ_PAYLOAD`] by [`fuzz_ak`].
#[derive(Debug, Clone)]
pub struct QuoteCase {
    pub attest: Vec<u8>,
    pub signature: Vec<u8>,
    pub nonce: Option<Vec<u8>>,
    pub quote: crate::proof::tpm::Quote,
}

/// Byte 0 chooses: bit 0, the signature is made here by [`fuzz_ak`] over the TPMS_ATTEST
/// (1: the fuzzer reaches the parser and the checks behind the signature) or taken from the
/// input; bit 1, the statement answers the nonce "fuzz-nonce" (else none). Then a u16 (big
/// endian) length and the TPMS_ATTEST; then, with bit 0 clear, the TPMT_SIGNATURE. The PCR
/// values given are those a real quote over [`FUZZ_PAYLOAD`] carries: 0-7 zero, 23 the
/// statement's.
pub fn quote_case(data: &[u8]) -> Option<QuoteCase> {
    use base64::Engine as _;
    let (&flags, rest) = data.split_first()?;
    if rest.len() < 2 {
        return None;
    }
    let n = u16::from_be_bytes([rest[0], rest[1]]) as usize;
    let attest = rest.get(2..2 + n)?.to_vec();
    let signature = if flags & 1 != 0 { fuzz_tpm_signature(&attest) } else { rest[2 + n..].to_vec() };
    let mut pcrs = std::collections::BTreeMap::new();
    for i in 0..8 {
        pcrs.insert(i.to_string(), hex::encode([0u8; 32]));
    }
    pcrs.insert(crate::proof::tpm::PCR.to_string(), hex::encode(crate::proof::tpm::expected_pcr(FUZZ_PAYLOAD)));
    let b64 = base64::engine::general_purpose::STANDARD;
    let quote = crate::proof::tpm::Quote {
        ak: crate::proof::tpm::ak_id(fuzz_ak().verifying_key()),
        pcrs,
        attest: b64.encode(&attest),
        signature: b64.encode(&signature),
    };
    Some(QuoteCase { attest, signature, nonce: (flags & 2 != 0).then(|| b"fuzz-nonce".to_vec()), quote })
}

/// The TPM's quote as a verifier checks it (TPMS_ATTEST, TPMT_SIGNATURE, PCRs, nonce), and an
/// attestation key's public area (TPM2B_PUBLIC) as `attest tpm-init` reads it, both from
/// bytes a TPM (or whoever stands between) wrote. A verdict, never a panic; an acceptance
/// holds: the quote is over this payload's PCR 23, with this nonce's qualifying data.
pub fn tpm_quote(data: &[u8]) {
    if let Some(c) = quote_case(data) {
        match crate::proof::tpm::verify(&c.quote, fuzz_ak().verifying_key(), FUZZ_PAYLOAD, c.nonce.as_deref()) {
            Err(e) => assert!(!e.is_empty(), "an empty TPM error"),
            Ok(said) => {
                let a = crate::proof::tpm::parse_attest(&c.attest).expect("accepted, so it parses");
                assert_eq!(a.extra_data, crate::proof::tpm::qualifying_data(c.nonce.as_deref()), "nonce");
                assert!(a.pcrs.contains(&crate::proof::tpm::PCR) && !said.is_empty());
            }
        }
    }
    if let Err(e) = crate::proof::tpm::parse_ak_public(data) {
        assert!(!e.is_empty(), "an empty AK error");
    }
}

/// The devices a `cdi` input's spec is asked for.
pub const FUZZ_CDI_DEVICES: &[&str] = &["nvidia.com/gpu=0", "nvidia.com/gpu=all"];

/// A CDI spec (YAML or JSON, as `nvidia-ctk cdi generate` writes it), read into a role's
/// edits. A rejection names its entry and says why; an acceptance keeps every promise of
/// docs/gpu.md: device nodes only under /dev/, every path absolute with no '.' or '..', only
/// valid variable names, only the devices asked for.
pub fn cdi(data: &[u8]) {
    let wanted: Vec<String> = FUZZ_CDI_DEVICES.iter().map(|s| s.to_string()).collect();
    match crate::config::cdi::edits(data, &wanted) {
        Err(e) => assert!(e.len() > 4, "an unclear CDI error: {e:?}"),
        Ok(ed) => {
            let clean = |p: &Path| {
                p.is_absolute()
                    && !p
                        .components()
                        .any(|c| matches!(c, std::path::Component::ParentDir | std::path::Component::CurDir))
            };
            for n in &ed.nodes {
                assert!(n.path.starts_with("/dev/") && clean(&n.path), "node {}", n.path.display());
            }
            for m in &ed.mounts {
                assert!(clean(&m.host) && clean(&m.inside), "mount {} -> {}", m.host.display(), m.inside.display());
            }
            for (k, _) in &ed.env {
                assert!(
                    k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
                        && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'),
                    "variable {k:?}"
                );
            }
            assert!(ed.devices.iter().all(|d| wanted.contains(d)), "{:?}", ed.devices);
        }
    }
}

/// A control-socket reply as `ctl status` and `ctl metrics` read it (a JSON line, read into
/// the protocol's status answer: `control::Reply<Status>`), shown as the status table and as
/// Prometheus text. Never a panic; the table carries no control character but newlines (a
/// string in the reply cannot drive the operator's terminal); each exposition line is a
/// comment or one well-formed sample. The other answers (recycle, attest) are read too.
pub fn control_reply(data: &[u8]) {
    let Ok(v) = serde_json::from_slice::<serde_json::Value>(data) else { return };
    let clean = |what: &str, t: &str| {
        assert!(
            !t.chars().any(|c| c != '\n' && (c.is_control() || crate::logging::log::invisible_or_reordering(c))),
            "a control character in {what}: {t:?}"
        );
    };
    // "What is sealed" takes any JSON of the status's shape (`check`'s too, which is not a
    // reply): the same escaping, and the line count its shape gives, whatever the values (none
    // forges one).
    let sealed = crate::proof::sealed_text::render(&v);
    clean("what is sealed", &sealed);
    let roles =
        v["roles"].as_array().map(|r| r.iter().map(|r| if r["sealed"].is_object() { 10 } else { 2 }).sum::<usize>());
    assert_eq!(sealed.lines().count(), 2 + roles.unwrap_or(0), "{sealed}");
    use crate::control::protocol::{Attested, Recycled, Reply, Status};
    let _ = Reply::<Recycled>::from_value(v.clone());
    let _ = Reply::<Attested>::from_value(v.clone());
    // An answer that is not a status (a refusal, or none `ctl` can read) shows no table.
    let Ok(Reply::Ok(status)) = Reply::<Status>::from_value(v) else { return };
    clean("the status table", &crate::control::status_text::render(&status));
    let text = crate::control::metrics::render(&status);
    for line in text.lines() {
        if line.starts_with("# HELP ") || line.starts_with("# TYPE ") {
            continue;
        }
        assert!(sample_ok(line), "not a Prometheus sample: {line:?}");
    }
}

/// `name{label="value",...} number`, the label values escaped as the exposition format says
/// (backslash, double quote and newline escaped; nothing else special).
fn sample_ok(line: &str) -> bool {
    let name_end = line.find(['{', ' ']).unwrap_or(line.len());
    let name = &line[..name_end];
    let name_ok = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if !name_ok {
        return false;
    }
    let mut rest = &line[name_end..];
    if let Some(r) = rest.strip_prefix('{') {
        let mut chars = r.char_indices().peekable();
        let mut in_value = false;
        let mut end = None;
        while let Some((i, c)) = chars.next() {
            match (in_value, c) {
                (true, '\\') => {
                    if !matches!(chars.next(), Some((_, '\\' | '"' | 'n'))) {
                        return false;
                    }
                }
                (true, '"') => in_value = false,
                (true, '\n') => return false,
                (false, '"') => in_value = true,
                (false, '}') => {
                    end = Some(i);
                    break;
                }
                (false, c) if c.is_ascii_alphanumeric() || c == '_' || c == '=' || c == ',' => {}
                (true, _) => {}
                (false, _) => return false,
            }
        }
        let Some(end) = end else { return false };
        rest = &r[end + 1..];
    }
    let Some(value) = rest.strip_prefix(' ') else { return false };
    value.parse::<f64>().is_ok() || matches!(value, "+Inf" | "-Inf" | "NaN")
}

/// One fuzz entry point.
pub type Target = fn(&[u8]);

/// The targets by name, for the corpus replay.
pub const TARGETS: &[(&str, Target)] = &[
    ("config", config),
    ("landlock_rules", landlock_rules),
    ("seccomp", seccomp),
    ("control", control),
    ("receipt", receipt),
    ("attestation", attestation),
    ("tpm_quote", tpm_quote),
    ("cdi", cdi),
    ("control_reply", control_reply),
];
