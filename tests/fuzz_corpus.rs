//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the same entry points the
//! cargo-fuzz targets call, so CI catches a parser regression without running a fuzzer; and
//! replays two targets' corpora through a second implementation (the differential checks of
//! docs/fuzzing.md).

mod common;

use std::path::Path;

use common::OutputWithin as _;

#[test]
fn the_fuzz_corpus_replays_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (name, target) in sealnode::fuzzing::TARGETS {
        let dir = root.join(name);
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            let data = std::fs::read(&path).expect("read");
            let r = std::panic::catch_unwind(|| target(&data));
            assert!(r.is_ok(), "fuzz target {name} panics on {}", path.display());
            n += 1;
        }
        assert!(n >= 3, "fuzz/corpus/{name} has only {n} inputs");
    }
}

/// The seeds that are valid inputs must stay valid: a corpus of rejections tests nothing.
#[test]
fn the_seed_inputs_are_accepted() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    let file = Path::new("seed");
    for p in ["config/seed-llamacpp.toml", "config/seed-ollama.toml"] {
        sealnode::config::Config::parse(&read(p), file).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    for p in ["landlock_rules/seed-engine.toml", "landlock_rules/seed-node.toml"] {
        sealnode::policy::landlock::Rules::parse(&read(p), file).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    sealnode::proof::receipt::parse(read("receipt/seed-valid.json").as_bytes(), file).expect("receipt seed");
    assert!(sealnode::control::parse(read("control/seed-status").as_bytes()).is_ok());
    // Status answers of today's shape, so the replay reaches the table and the metrics (the
    // older seeds lack fields a status answer now has: only "what is sealed" reads them).
    for p in ["control_reply/seed-status", "control_reply/seed-status-denylog", "control_reply/seed-hostile-status"] {
        serde_json::from_str::<sealnode::control::protocol::Status>(&read(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    let s = std::fs::read(root.join("seccomp/seed-engine-x86_64")).expect("seccomp seed");
    let text = std::str::from_utf8(&s[53..]).expect("utf8");
    sealnode::policy::seccomp::compile_text(text, file, "engine", seccompiler::TargetArch::x86_64).expect("compiles");
}

/// A scratch directory for one test's files, removed when dropped.
fn scratch(name: &str) -> tempfile::TempDir {
    tempfile::Builder::new().prefix(&format!("sealnode-fuzz-{name}-")).tempdir().expect("tempdir")
}

/// Differential (docs/fuzzing.md): every `attestation` input, as the envelope and verifier
/// arguments it stands for, gets the same exit status from `sealnode verify-attestation` and
/// from examples/verify-attestation.py (the gateway's two verifiers; README's exit table).
#[test]
fn the_attestation_corpus_gets_one_verdict_from_both_verifiers() {
    let py = std::env::var("SEALNODE_TEST_VENV").map(|v| format!("{v}/bin/python")).unwrap_or_default();
    if py.is_empty() || !Path::new(&py).exists() {
        return common::unavailable(
            "python",
            "no SEALNODE_TEST_VENV (scripts/prepare-python): the Python verifier cannot run",
        );
    }
    let dir = scratch("attestation");
    let key = dir.path().join("key.pem");
    std::fs::write(&key, sealnode::proof::attest::public_pem(&sealnode::fuzzing::fuzz_key().verifying_key()))
        .expect("key");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/attestation");
    let (mut n, mut verified) = (0, 0);
    for entry in std::fs::read_dir(&root).expect("corpus") {
        let path = entry.expect("entry").path();
        let Some(c) = sealnode::fuzzing::attestation_case(&std::fs::read(&path).expect("read")) else { continue };
        let env = dir.path().join("envelope.json");
        std::fs::write(&env, &c.envelope).expect("write");
        let mut args = vec!["--pubkey".to_string(), key.display().to_string()];
        match &c.nonce {
            Some(nonce) => args.extend(["--nonce".into(), nonce.clone()]),
            None => args.push("--no-nonce".into()),
        }
        for (name, sha) in &c.subjects {
            args.extend(["--expect".into(), format!("{name}={sha}")]);
        }
        if let Some(g) = c.min_generation {
            args.extend(["--min-generation".into(), g.to_string()]);
        }
        args.push(env.display().to_string());
        let ours = std::process::Command::new(env!("CARGO_BIN_EXE_sealnode"))
            .arg("verify-attestation")
            .args(&args)
            .output_within(common::COMMAND_LIMIT);
        let theirs = std::process::Command::new(&py)
            .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/verify-attestation.py"))
            .args(&args)
            .output_within(common::COMMAND_LIMIT);
        assert_eq!(
            ours.status.code(),
            theirs.status.code(),
            "{}: sealnode said {}{}, the Python verifier {}{}",
            path.display(),
            String::from_utf8_lossy(&ours.stdout),
            String::from_utf8_lossy(&ours.stderr),
            String::from_utf8_lossy(&theirs.stdout),
            String::from_utf8_lossy(&theirs.stderr)
        );
        n += 1;
        verified += usize::from(ours.status.code() == Some(0));
    }
    // The seeds include statements both must accept: a corpus of rejections compares little.
    assert!(n >= 5 && verified >= 2, "{n} inputs compared, {verified} verified");
}

/// Differential (docs/fuzzing.md): every `tpm_quote` input's quote, checked by sealnode and by
/// tpm2-tools' `tpm2_checkquote` (signature and qualifying data; tpm2_checkquote is told no
/// PCR values): what sealnode accepts, tpm2_checkquote accepts, and where tpm2_checkquote finds
/// the signature good, so does sealnode. sealnode is stricter on purpose (one sha256 bank, PCRs
/// 0-7 and 23 exactly, nothing after a structure), never more lenient.
#[test]
fn the_tpm_quote_corpus_is_never_more_lenient_than_tpm2_checkquote() {
    use p256::pkcs8::EncodePublicKey as _;
    let Some(checkquote) = common::which("tpm2_checkquote") else {
        return common::unavailable("tpm", "no tpm2_checkquote (Debian's tpm2-tools)");
    };
    let dir = scratch("tpm");
    let ak = sealnode::fuzzing::fuzz_ak();
    let pem = ak.verifying_key().to_public_key_pem(p256::pkcs8::LineEnding::LF).expect("pem");
    let ak_file = dir.path().join("ak.pem");
    std::fs::write(&ak_file, pem).expect("write");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus/tpm_quote");
    let (mut n, mut accepted) = (0, 0);
    for entry in std::fs::read_dir(&root).expect("corpus") {
        let path = entry.expect("entry").path();
        let Some(c) = sealnode::fuzzing::quote_case(&std::fs::read(&path).expect("read")) else { continue };
        let ours = sealnode::proof::tpm::verify(
            &c.quote,
            ak.verifying_key(),
            sealnode::fuzzing::FUZZ_PAYLOAD,
            c.nonce.as_deref(),
        );
        let sig_ok = sealnode::proof::tpm::parse_signature(&c.signature)
            .is_ok_and(|s| p256::ecdsa::signature::Verifier::verify(ak.verifying_key(), &c.attest, &s).is_ok());
        let (m, s) = (dir.path().join("attest.bin"), dir.path().join("sig.bin"));
        std::fs::write(&m, &c.attest).expect("write");
        std::fs::write(&s, &c.signature).expect("write");
        let mut cmd = std::process::Command::new(&checkquote);
        cmd.args(["-g", "sha256", "-u"]).arg(&ak_file).arg("-m").arg(&m).arg("-s").arg(&s);
        let q = sealnode::proof::tpm::qualifying_data(c.nonce.as_deref());
        if !q.is_empty() {
            cmd.args(["-q", &hex::encode(&q)]);
        }
        let theirs = cmd.output_within(common::COMMAND_LIMIT);
        let theirs_ok = theirs.status.success();
        let said = format!("{}{}", String::from_utf8_lossy(&theirs.stdout), String::from_utf8_lossy(&theirs.stderr));
        assert!(ours.is_err() || theirs_ok, "{}: sealnode accepted, tpm2_checkquote refused: {said}", path.display());
        assert!(
            !theirs_ok || sig_ok,
            "{}: tpm2_checkquote found the signature good, sealnode not: {ours:?}",
            path.display()
        );
        n += 1;
        accepted += usize::from(ours.is_ok());
    }
    assert!(n >= 4 && accepted >= 2, "{n} quotes compared, {accepted} accepted by sealnode");
}
