//! The attestation publisher, as a component of the event loop: it signs a statement over each
//! generation (docs/attestation.md) into the runtime dir's `attest/` (which the node sees
//! read-only), answers `attest` control requests, and with `cell.tpm` has each statement
//! quoted by the TPM through tool children the loop reaps (quoting never holds the loop). It
//! offers `exited(pid)`, a next deadline and `sweep`.

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::OwnedFd;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::unistd::Pid;

use crate::config::{Config, Invoker};
use crate::control::protocol::{Attested, Refusal, Reply, StatementState, StatementStatus};
use crate::error::{Error, Result};
use crate::exit;
use crate::proof::attest::Envelope;

/// At most this many control requests wait for the TPM; more are answered "busy".
const MAX_QUOTING: usize = 4;

/// A signed statement waiting for the TPM's quote, and who gets it.
#[derive(Debug)]
struct Quoting {
    env: Envelope,
    payload: Vec<u8>,
    nonce: Option<Vec<u8>>,
    purpose: Purpose,
}

#[derive(Debug)]
enum Purpose {
    /// An `attest` request: the client waits for the envelope.
    Control(UnixStream),
    /// The start statement of this generation, for the node.
    Publish(u64),
}

/// What a statement is made of, from the supervisor's current generation.
pub(super) struct Facts<'a> {
    pub cfg: &'a Config,
    /// Each role's config as of its last pass through the gate (by [`crate::config::Role`]
    /// index).
    pub role_cfgs: [&'a Config; 2],
    pub inv: &'a Invoker,
    pub receipt: Option<&'a crate::proof::receipt::Receipt>,
    pub report: Option<&'a crate::proof::canary::Report>,
    /// Each role's restarts so far, by name.
    pub restarts: BTreeMap<String, u32>,
}

#[derive(Debug)]
pub(super) struct Publisher {
    /// The attestation key's public half, checked at start (`sealnode attest init`); None: no
    /// statements. The private key is read for each signature and wiped right after: it is
    /// never in the memory the role children are forked from.
    key: Option<ed25519_dalek::VerifyingKey>,
    /// The runtime dir's `attest/`, which the node sees read-only: the statement of each gate.
    dir: OwnedFd,
    /// With `cell.tpm`: the tools and the attestation key every statement is quoted by.
    tpm: Option<(crate::proof::tpm::Tools, p256::ecdsa::VerifyingKey)>,
    /// Signed statements waiting for their quote, in order.
    queue: VecDeque<Quoting>,
    /// The statement being quoted, with its job: out of the queue, so that nothing done to
    /// the queue meanwhile can give its quote to another statement (tests/attest.rs:
    /// statements_are_quoted_by_the_tpm_and_a_replayed_quote_fails).
    job: Option<(crate::proof::tpm::QuoteJob, Quoting)>,
    /// The current generation's start statement could not be made: why, and when to try again.
    missing: Option<String>,
    republish_at: Option<Instant>,
}

impl Publisher {
    /// The key and the TPM checked as at every start (a key others could read, or a TPM that
    /// cannot quote, refuses the start), and the node's view of the statements emptied of an
    /// earlier run's: a node never reads a stale one.
    pub(super) fn open(cfg: &Config, inv: &Invoker) -> Result<Publisher> {
        let key = crate::proof::attest::load_signing(&cfg.cell.state_dir, inv.uid)
            .map_err(|e| Error::config(&cfg.file, "cell.state_dir", format!("attestation key: {e}")))?
            .map(|k| k.verifying_key());
        match &key {
            Some(k) => tracing::info!(key = %crate::proof::attest::keyid(k), "attestation key checked"),
            None => tracing::info!("no attestation key (sealnode attest init makes one): no signed statements"),
        }
        let tpm = crate::proof::attest::tpm_checked(cfg, inv, key.is_some())?;
        let dir =
            crate::os::trusted::own_dir(&cfg.cell.runtime_dir.join(crate::layout::RUNTIME_ATTEST_DIR), inv.uid, 0o755)
                .map_err(|e| Error::config(&cfg.file, "cell.runtime_dir", e))?;
        match nix::unistd::unlinkat(&dir, crate::layout::STATEMENT_FILE, nix::unistd::UnlinkatFlags::NoRemoveDir) {
            Ok(()) | Err(Errno::ENOENT) => {}
            Err(e) => return Err(Error::errno("remove the previous run's statement", e)),
        }
        Ok(Publisher { key, dir, tpm, queue: VecDeque::new(), job: None, missing: None, republish_at: None })
    }

    /// Statements are signed (the gate then hashes the engine's model files for them).
    pub(super) fn signing(&self) -> bool {
        self.key.is_some()
    }

    /// A signed statement over the current generation, and its payload's bytes; with
    /// `cell.tpm` it still needs its quote.
    fn statement(&self, f: &Facts, nonce: Option<String>) -> std::result::Result<(Envelope, Vec<u8>), String> {
        let Some(public) = &self.key else {
            return Err(format!(
                "no attestation key: run `sealnode attest init --config {}` and restart",
                f.cfg.file.display()
            ));
        };
        let key = match crate::proof::attest::load_signing(&f.cfg.cell.state_dir, f.inv.uid) {
            Ok(Some(k)) if k.verifying_key() == *public => k,
            Ok(Some(_)) => {
                return Err("the attestation key changed since the start: restart sealnode run to sign with it".into())
            }
            Ok(None) => return Err("the attestation key is gone since the start".into()),
            Err(e) => return Err(format!("attestation key: {e}")),
        };
        let Some(receipt) = f.receipt else { return Err("no generation yet: the cell has not started".into()) };
        let st = crate::proof::attest::build(&crate::proof::attest::Inputs {
            cfg: f.cfg,
            role_cfgs: f.role_cfgs,
            receipt,
            report: f.report,
            nonce,
            restarts: f.restarts.clone(),
            tpm_ak: self.tpm.as_ref().map(|(_, ak)| crate::proof::tpm::ak_id(ak)),
        });
        Ok((crate::proof::attest::sign(&key, &st), crate::proof::attest::statement_bytes(&st)))
    }

    /// An `attest` control request: answered now, or (with `cell.tpm`) once quoted. Err: a
    /// stop's exit status (a quote that came meanwhile could not be written).
    pub(super) fn request(&mut self, mut stream: UnixStream, nonce: String, f: &Facts) -> std::result::Result<(), i32> {
        let v = match self.statement(f, Some(nonce.clone())) {
            Ok((env, _)) if self.tpm.is_none() => Reply::Ok(Attested::new(env)),
            Ok((env, payload)) => {
                let waiting = self.waiting_requests();
                if waiting >= MAX_QUOTING {
                    Reply::Refused(Refusal::new(format!(
                        "busy: {waiting} statements wait for the TPM's quote; try again"
                    )))
                } else {
                    let nonce = hex::decode(&nonce).ok();
                    self.queue.push_back(Quoting { env, payload, nonce, purpose: Purpose::Control(stream) });
                    return self.pump(f.cfg, generation(f));
                }
            }
            Err(e) => Reply::Refused(Refusal::new(e)),
        };
        crate::control::respond(&mut stream, &v);
        Ok(())
    }

    /// After a gate (a start of either role): the generation's statement (no nonce) replaces
    /// the one in the runtime dir's `attest/`, which the running node sees at once
    /// (config::INSIDE_ATTESTATION_DIR). Without a key there is none. With `cell.tpm` the older
    /// generation's goes now and this one once quoted; one that cannot be made is tried again
    /// later ([`Publisher::sweep`]), and the node finds none meanwhile. Err: the exit status
    /// of the stop a statement that cannot be written begins.
    pub(super) fn publish(&mut self, f: &Facts) -> std::result::Result<(), i32> {
        if self.key.is_none() {
            return Ok(());
        }
        self.republish_at = None;
        let (env, payload) = match self.statement(f, None) {
            Ok(x) => x,
            Err(e) => {
                self.failed(e);
                return Ok(());
            }
        };
        if self.tpm.is_none() {
            return self.write(f.cfg, &env);
        }
        self.remove();
        self.queue.retain(|q| !matches!(q.purpose, Purpose::Publish(_)));
        self.queue.push_back(Quoting { env, payload, nonce: None, purpose: Purpose::Publish(generation(f)) });
        self.pump(f.cfg, generation(f))
    }

    fn write(&mut self, cfg: &Config, env: &Envelope) -> std::result::Result<(), i32> {
        let mut bytes = serde_json::to_vec(env).unwrap_or_default();
        bytes.push(b'\n');
        let file = crate::layout::STATEMENT_FILE;
        let shown = cfg.cell.runtime_dir.join(crate::layout::RUNTIME_ATTEST_DIR).join(file);
        if let Err(e) = crate::os::atomic::write_atomic_at(&self.dir, file, &bytes, 0o644, &shown) {
            tracing::error!(error = %e, "cannot write the statement");
            crate::logging::log::say(&format!("{e}"));
            return Err(exit::FAILED);
        }
        self.missing = None;
        Ok(())
    }

    fn remove(&self) {
        let _ =
            nix::unistd::unlinkat(&self.dir, crate::layout::STATEMENT_FILE, nix::unistd::UnlinkatFlags::NoRemoveDir);
    }

    /// The start statement could not be made: the node finds none (not an older
    /// generation's), `ctl status` says why, and it is tried again after the TPM's backoff.
    fn failed(&mut self, e: String) {
        tracing::error!(error = %e, "no statement for this generation");
        crate::logging::log::say(&format!("no statement for this generation: {e}"));
        self.remove();
        self.missing = Some(e);
        self.republish_at = Some(Instant::now() + crate::proof::tpm::UNRESPONSIVE_BACKOFF + Duration::from_secs(1));
    }

    /// Start quoting the first waiting statement unless one is being quoted; those the TPM
    /// refuses at once are answered at once.
    fn pump(&mut self, cfg: &Config, current: u64) -> std::result::Result<(), i32> {
        while self.job.is_none() {
            let Some((tools, ak)) = &self.tpm else { return Ok(()) };
            let Some(q) = self.queue.pop_front() else { return Ok(()) };
            match tools.begin_quote(*ak, q.payload.clone(), q.nonce.clone()) {
                Ok(job) => self.job = Some((job, q)),
                Err(e) => self.quoted(q, Err(e), cfg, current)?,
            }
        }
        Ok(())
    }

    /// `pid` was the quote's tool: its exit moves the quote on. Err: a stop's exit status.
    pub(super) fn exited(
        &mut self,
        pid: Pid,
        code: i32,
        cfg: &Config,
        current: u64,
    ) -> Option<std::result::Result<(), i32>> {
        if self.job.as_ref().and_then(|(j, _)| j.pid()) != Some(pid.as_raw()) {
            return None;
        }
        Some(self.progress(Some(code), cfg, current))
    }

    /// The quote's tool exited, or (None) its deadline passed.
    fn progress(&mut self, exit: Option<i32>, cfg: &Config, current: u64) -> std::result::Result<(), i32> {
        let Some((mut job, q)) = self.job.take() else { return Ok(()) };
        let Some((tools, _)) = &self.tpm else { return Ok(()) };
        let progress = match exit {
            Some(code) => tools.on_exit(&mut job, code == 0, &format!("exit status {code}")),
            None => crate::proof::tpm::Progress::Done(Err(tools.expire(&mut job))),
        };
        match progress {
            crate::proof::tpm::Progress::Running => {
                self.job = Some((job, q));
                Ok(())
            }
            crate::proof::tpm::Progress::Done(r) => {
                let written = self.quoted(q, r, cfg, current);
                let pumped = self.pump(cfg, current);
                written.and(pumped)
            }
        }
    }

    /// A statement's quote came, or failed: to the client that asked, or into the node's view
    /// when it is still this generation's (`current`).
    fn quoted(
        &mut self,
        q: Quoting,
        r: std::result::Result<crate::proof::tpm::Quote, String>,
        cfg: &Config,
        current: u64,
    ) -> std::result::Result<(), i32> {
        let Quoting { mut env, purpose, payload, nonce } = q;
        // The quote is this statement's, or it is not used: checked again here, where it is
        // attached (cheap; the job checked it against the payload it was given).
        let r = r.and_then(|quote| match &self.tpm {
            Some((_, ak)) => crate::proof::tpm::verify(&quote, ak, &payload, nonce.as_deref()).map(|_| quote),
            None => Err("no TPM".into()),
        });
        match (purpose, r) {
            (Purpose::Control(mut stream), Ok(quote)) => {
                env.tpm_quote = Some(quote);
                crate::control::respond(&mut stream, &Attested::new(env));
            }
            (Purpose::Control(mut stream), Err(e)) => {
                crate::control::respond(&mut stream, &crate::control::protocol::Refusal::new(format!("TPM: {e}")));
            }
            (Purpose::Publish(g), r) if g == current => match r {
                Ok(quote) => {
                    env.tpm_quote = Some(quote);
                    return self.write(cfg, &env);
                }
                Err(e) => self.failed(format!("TPM: {e}")),
            },
            (Purpose::Publish(_), _) => {}
        }
        Ok(())
    }

    /// Stopping for good: the quote in progress is abandoned, and the clients still waiting
    /// are told so.
    pub(super) fn abandon(&mut self) {
        let mut waiting: Vec<Quoting> = std::mem::take(&mut self.queue).into();
        if let Some((mut job, q)) = self.job.take() {
            if let Some((tools, _)) = &self.tpm {
                tools.abandon(&mut job);
            }
            waiting.push(q);
        }
        for q in waiting {
            if let Purpose::Control(mut stream) = q.purpose {
                crate::control::respond(&mut stream, &crate::control::protocol::Refusal::new("sealnode is stopping"));
            }
        }
    }

    pub(super) fn next_deadline(&self) -> Option<Instant> {
        [self.job.as_ref().map(|(j, _)| j.deadline()), self.republish_at].into_iter().flatten().min()
    }

    /// A quote past its deadline fails; a missing statement is made again when due (not
    /// while stopping). Err: a stop's exit status.
    pub(super) fn sweep(&mut self, now: Instant, f: &Facts, stopping: bool) -> std::result::Result<(), i32> {
        if self.job.as_ref().is_some_and(|(j, _)| j.deadline() <= now) {
            self.progress(None, f.cfg, generation(f))?;
        }
        if self.republish_at.is_some_and(|t| t <= now) && !stopping {
            self.republish_at = None;
            if self.missing.is_some() {
                return self.publish(f);
            }
        }
        Ok(())
    }

    /// `attest` requests waiting for the TPM's quote.
    pub(super) fn waiting_requests(&self) -> usize {
        self.in_line().filter(|q| matches!(q.purpose, Purpose::Control(_))).count()
    }

    fn in_line(&self) -> impl Iterator<Item = &Quoting> {
        self.queue.iter().chain(self.job.as_ref().map(|(_, q)| q))
    }

    /// The statement's state for `ctl status` (docs/control.md).
    pub(super) fn status(&self) -> StatementStatus {
        let (state, why) = match (&self.key, &self.missing) {
            (None, _) => (StatementState::None, Some("no attestation key".to_string())),
            (Some(_), Some(why)) => (StatementState::Missing, Some(why.clone())),
            (Some(_), None) if self.in_line().any(|q| matches!(q.purpose, Purpose::Publish(_))) => {
                (StatementState::Quoting, None)
            }
            (Some(_), None) => (StatementState::Published, None),
        };
        StatementStatus { state, why, signed: self.key.is_some(), tpm_quoted: self.tpm.is_some() }
    }
}

fn generation(f: &Facts) -> u64 {
    f.receipt.map(|r| r.generation).unwrap_or(0)
}
