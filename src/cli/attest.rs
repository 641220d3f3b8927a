//! `sealnode attest` (init, pubkey, a fresh statement from the running supervisor) and
//! `sealnode verify-attestation` (offline).

use std::path::Path;

use sealnode::config::{Config, Invoker};
use sealnode::control::protocol::Attested;
use sealnode::control::{Reply, Request};
use sealnode::exit;
use sealnode::proof::attest::{self, Failure as Why};

use super::{Failure, Outcome};

/// `attest init`: the key pair in the config's state dir.
pub fn init(config: &Path, force: bool) -> Outcome {
    let inv = Invoker::current();
    let cfg = Config::load(config, &inv).map_err(Failure::setup)?;
    let vk = attest::init(&cfg.cell.state_dir, inv.uid, force).map_err(Failure::general)?;
    println!("{}", attest::public_pem(&vk).trim_end());
    println!("fingerprint: sha256:{}", attest::keyid(&vk));
    println!("key: {} (restart `sealnode run` to sign with it)", attest::key_path(&cfg.cell.state_dir).display());
    Ok(exit::OK)
}

/// `attest pubkey`: the public key (SPKI PEM) and its fingerprint.
pub fn pubkey(config: &Path) -> Outcome {
    let inv = Invoker::current();
    // The key dir's owner is trusted as the launcher's: not as an ambiguous uid.
    inv.check_ids().map_err(Failure::setup)?;
    let cfg = Config::read_for_client(config).map_err(Failure::setup)?;
    let vk = attest::load_public(&cfg.cell.state_dir, inv.uid).map_err(Failure::general)?;
    // stdout is the PEM alone (`attest pubkey > node.pem` is the file a verifier takes); the
    // fingerprint, to check out of band, goes to stderr.
    println!("{}", attest::public_pem(&vk).trim_end());
    eprintln!("fingerprint: sha256:{}", attest::keyid(&vk));
    Ok(exit::OK)
}

/// `attest tpm-init`: the TPM's attestation key, for the config's `cell.tpm`.
pub fn tpm_init(config: &Path, force: bool) -> Outcome {
    let inv = Invoker::current();
    let cfg = Config::load(config, &inv).map_err(Failure::setup)?;
    let Some(t) = &cfg.cell.tpm else {
        return Err(Failure::setup(format!(
            "{}: cell.tpm: not set (the TPM to use, e.g. tcti = \"device:/dev/tpmrm0\")",
            config.display()
        )));
    };
    if let Some(tool) =
        sealnode::layout::TPM_INIT_TOOLS.iter().find(|x| !Path::new(sealnode::layout::TPM_TOOLS).join(x).is_file())
    {
        return Err(Failure::setup(format!(
            "{}/{tool} is missing: install Debian's tpm2-tools",
            sealnode::layout::TPM_TOOLS
        )));
    }
    let ak = attest::tpm_init(&cfg.cell.state_dir, inv.uid, t.target(), force).map_err(Failure::general)?;
    print_ak(&ak.key, Some(&hex::encode(&ak.name)));
    let dir = cfg.cell.state_dir.join(attest::KEY_DIR);
    println!(
        "persisted at handle {:#010x}; endorsement key: {}",
        t.ak_handle,
        dir.join(sealnode::proof::tpm::EK_FILE).display()
    );
    println!("restart `sealnode run` to quote its statements (docs/attestation.md: enrolling the key)");
    Ok(exit::OK)
}

/// `attest tpm-pubkey`: the TPM attestation key `tpm-init` stored.
pub fn tpm_pubkey(config: &Path) -> Outcome {
    let inv = Invoker::current();
    let cfg = Config::read_for_client(config).map_err(Failure::setup)?;
    let ak = attest::load_tpm_ak(&cfg.cell.state_dir, inv.uid)
        .map_err(Failure::general)?
        .ok_or_else(|| Failure::general("no TPM attestation key: run `sealnode attest tpm-init` first".to_string()))?;
    // As `attest pubkey`: the PEM alone on stdout, what identifies it on stderr.
    use p256::pkcs8::EncodePublicKey as _;
    println!("{}", ak.to_public_key_pem(Default::default()).unwrap_or_default().trim_end());
    eprintln!("id: sha256:{}", sealnode::proof::tpm::ak_id(&ak));
    if let Some(n) = attest::load_tpm_ak_name(&cfg.cell.state_dir, inv.uid) {
        eprintln!(
            "name: {n} (the TPM's name of the key: its public area is attest/{})",
            sealnode::proof::tpm::AK_PUBLIC_FILE
        );
    }
    Ok(exit::OK)
}

fn print_ak(ak: &p256::ecdsa::VerifyingKey, name: Option<&str>) {
    use p256::pkcs8::EncodePublicKey as _;
    println!("{}", ak.to_public_key_pem(Default::default()).unwrap_or_default().trim_end());
    println!("id: sha256:{}", sealnode::proof::tpm::ak_id(ak));
    if let Some(n) = name {
        println!(
            "name: {n} (the TPM's name of the key: its public area is attest/{})",
            sealnode::proof::tpm::AK_PUBLIC_FILE
        );
    }
}

/// `attest subjects`: the subjects a statement of this config carries, as `NAME=SHA256`
/// lines (what a gateway passes to `verify-attestation --expect`), the model files hashed
/// through the same cache `run` uses.
pub fn subjects(config: &Path) -> Outcome {
    let inv = Invoker::current();
    let cfg = Config::load(config, &inv).map_err(Failure::setup)?;
    let (sealnode, conf, mut roles) =
        sealnode::proof::receipt::current_digests(&cfg, &inv).map_err(Failure::general)?;
    let state = sealnode::os::trusted::own_dir(&cfg.cell.state_dir, inv.uid, 0o750)
        .map_err(|e| Failure::setup(format!("cell.state_dir: {e}")))?;
    if let (Some(d), Some(engine)) = (&cfg.engine.models, roles.get_mut("engine")) {
        let (files, _) =
            sealnode::proof::digests::models(d, &state, &cfg.cell.state_dir, &|| false).map_err(Failure::general)?;
        engine.models = files.into_iter().collect();
    }
    for s in attest::subjects([&cfg, &cfg], &sealnode.sha256, &conf.sha256, &roles) {
        println!("{}={}", s.name, s.digest.get("sha256").map(String::as_str).unwrap_or(""));
    }
    Ok(exit::OK)
}

/// `attest --nonce HEX`: a statement over the current generation and that nonce, from the
/// running supervisor (its control socket: root and cell.control_uids only).
pub fn request(config: &Path, nonce: &str) -> Outcome {
    let nonce = attest::parse_nonce(nonce).map_err(Failure::usage)?;
    let cfg = Config::read_for_client(config).map_err(Failure::setup)?;
    let request = Request::Attest { nonce: nonce.clone() };
    let a = sealnode::control::client::<Attested>(&sealnode::control::socket_path(&cfg), &request)
        .map_err(Failure::general)?;
    let envelope = match a.reply {
        Reply::Ok(a) => a.envelope,
        Reply::Refused(r) => return Err(Failure::general(sealnode::os::escape::clean(r.error.as_bytes()))),
    };
    // What came back answers this request's nonce, or nothing is printed (a check, not a
    // verification: that is verify-attestation's, with the key).
    let answered = base64::Engine::decode(&base64::engine::general_purpose::STANDARD, &envelope.payload)
        .ok()
        .and_then(|b| serde_json::from_slice::<attest::Statement>(&b).ok())
        .and_then(|st| st.predicate.nonce);
    if answered.as_deref() != Some(nonce.as_str()) {
        return Err(Failure::general(format!(
            "the supervisor answered a statement for nonce {}, not {nonce}",
            sealnode::os::escape::clean(answered.as_deref().unwrap_or("none").as_bytes())
        )));
    }
    println!("{}", sealnode::os::escape::json(&serde_json::to_string_pretty(&envelope).unwrap_or_default()));
    Ok(exit::OK)
}

/// `verify-attestation`: the signature, the nonce, then what the verifier expects.
pub fn verify(
    file: &Path,
    pubkey: &Path,
    nonce: Option<&str>,
    expect: &[String],
    min_generation: Option<u64>,
    tpm_ak: Option<&Path>,
) -> Outcome {
    let nonce = nonce.map(attest::parse_nonce).transpose().map_err(Failure::usage)?;
    let mut subjects = Vec::new();
    for e in expect {
        let Some((k, v)) = e.split_once('=') else {
            return Err(Failure::usage(format!(
                "--expect {e:?}: expected NAME=SHA256 (a subject name and its digest)"
            )));
        };
        subjects.push((k.to_string(), v.to_string()));
    }
    let key = std::fs::read(pubkey).map_err(|e| Failure::setup(format!("read {}: {e}", pubkey.display())))?;
    let key = attest::parse_public(&key).map_err(|e| Failure::setup(format!("{}: {e}", pubkey.display())))?;
    let bytes = std::fs::read(file).map_err(|e| Failure::setup(format!("read {}: {e}", file.display())))?;
    let tpm_ak = match tpm_ak {
        Some(p) => {
            let b = std::fs::read(p).map_err(|e| Failure::setup(format!("read {}: {e}", p.display())))?;
            Some(sealnode::proof::tpm::parse_ak(&b).map_err(|e| Failure::setup(format!("{}: {e}", p.display())))?)
        }
        None => None,
    };
    let want = attest::Expect { nonce, subjects, min_generation, tpm_ak };
    match attest::verify(&bytes, &key, &want) {
        Ok((_, said)) => {
            println!("{}: verified", file.display());
            for l in said {
                println!("  {l}");
            }
            Ok(exit::OK)
        }
        Err(w) => {
            let (code, lines) = match w {
                Why::Malformed(m) => (exit::ATTEST_MALFORMED, vec![m]),
                Why::Signature(m) => (exit::ATTEST_SIGNATURE, vec![m]),
                Why::Nonce(m) => (exit::ATTEST_NONCE, vec![m]),
                Why::Mismatch(v) => (exit::ATTEST_MISMATCH, v),
                Why::Tpm(m) => (exit::ATTEST_TPM, vec![m]),
            };
            println!("{}: NOT verified", file.display());
            for l in lines {
                println!("  {l}");
            }
            Ok(code)
        }
    }
}
