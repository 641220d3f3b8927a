//! SIGHUP, step by step: the config read again and checked (reload.rs says what may change),
//! its dry run through the gate in a throwaway cell while the old roles run on, then the
//! switch (both roles stopped and started again through the gate with it), or the refusal,
//! said and kept for `ctl status`. A change of the config on disk, with
//! `cell.reload_on_change` (watch.rs), takes the same path.

use std::time::Instant;

use sd_notify::NotifyState;

use super::lifecycle::After;
use super::reload::{refused, same_files};
use super::setup::log_devices_from;
use super::{gate, notify, Supervisor};
use crate::config::{Config, Role};
use crate::error::Error;
use crate::exit;

impl Supervisor {
    /// SIGHUP: read the config and its policies again through the checked path. Invalid, or a
    /// change only a new cell could apply: keep running as is, log why, show it in `ctl
    /// status`. Valid: the new config passes the gate first, in a throwaway cell of its own
    /// (its programs measured, its preflight; in this cell the running engine listens, and
    /// an engine allowed to connect would reach it and look like an escape), while the old
    /// roles keep running; then both roles are stopped and started again through the gate.
    pub(super) fn on_sighup(&mut self) {
        // Busy as for a recycle (lifecycle::UnderWay), the wipes before the first start
        // included: that start's pass is next, and a dry run begun meanwhile would meet it
        // (tests/gate.rs: a_sighup_during_the_first_wipes_is_refused_and_the_start_goes_on).
        if let Some(what) = self.under_way().busy() {
            tracing::warn!(busy = what, "SIGHUP ignored: {what} is in progress");
            self.reload.refused(format!("{what} was in progress"));
            return;
        }
        let loaded = self.read_new_config();
        self.try_reload(loaded);
    }

    /// `cell.reload_on_change`: the config's directory changed and has been quiet since
    /// (watch.rs). The same path as SIGHUP's, with two differences: while the cell is busy the
    /// change waits and is asked again (watch::SETTLE) until it is not, where a SIGHUP is
    /// refused, since nobody would send this one again; and a config whose files all read the
    /// same as the ones in force (the config, its policies, its CDI specs) reloads nothing, where a
    /// SIGHUP restarts the roles anyway, since a change on disk is not a request to restart
    /// (tests/gate.rs: a_config_change_reloads_the_cell_when_asked_to).
    pub(super) fn on_config_change(&mut self, now: Instant) {
        if let Some(what) = self.under_way().busy() {
            if self.watch.wait(now) {
                tracing::info!(
                    busy = what,
                    "the config changed while {what} is in progress: it is reloaded once that is done"
                );
            }
            return;
        }
        self.watch.taken();
        let file = self.base.cfg.file.display().to_string();
        let loaded = self.read_new_config();
        if matches!(&loaded, Ok(new) if same_files(&self.base.cfg, new)) {
            tracing::info!(config = file, "the config changed on disk but reads the same as the one in force, its policies too: nothing to reload");
            return;
        }
        tracing::info!(config = file, "the config changed: reloading as on SIGHUP (cell.reload_on_change)");
        self.try_reload(loaded);
    }

    /// The config read again through the checked path, with the running cell's ids, and held
    /// to what a reload may change ([`refused`]).
    fn read_new_config(&self) -> crate::error::Result<Config> {
        let cfg = &self.base.cfg;
        Config::reload(&cfg.file, &self.base.inv, cfg).and_then(|new| match refused(cfg, &new) {
            changed if changed.is_empty() => Ok(new),
            changed => Err(Error::config(
                &cfg.file,
                changed.join(", "),
                "changed, but the running cell (its network, listeners, users, dirs and TPM) was built with the old value; restart sealnode to apply it",
            )),
        })
    }

    /// A config read for a reload: refused (said, kept for `ctl status`), or into its dry run
    /// through the gate while the running roles are untouched.
    fn try_reload(&mut self, loaded: crate::error::Result<Config>) {
        let new = match loaded {
            Ok(new) => new,
            Err(e) => return self.reload_failed(e.to_string()),
        };
        log_devices_from(&new);
        // The dry run hashes what the start will (its cache makes the start cheap): a model dir
        // the start could not hash is refused now, with the roles untouched.
        let ctx = super::gate_ctx(&new, &self.base, self.attest.signing(), &self.roles);
        match self.gate.begin(&ctx, &Role::ALL, gate::Purpose::DryRun) {
            Ok(()) => {
                tracing::info!(config_sha256 = %new.config_sha256(), "SIGHUP: the new config passes the gate first (a throwaway cell); the running roles are untouched meanwhile");
                self.reload.dry_run(new);
            }
            Err(r) => self.reload_refused(r),
        }
    }

    /// The new config's dry run failed: nothing changes.
    pub(super) fn reload_refused(&mut self, refusal: gate::Cause) {
        let file = self.reload.take_candidate().map(|c| c.file).unwrap_or_else(|| self.base.cfg.file.clone());
        let why = match &refusal {
            gate::Cause::Escapes(escapes) => Error::config(
                &file,
                "(policies)",
                format!("the new config's preflight found escapes: {}", escapes.join("; ")),
            )
            .to_string(),
            _ => refusal.message(),
        };
        self.reload_failed(why);
    }

    fn reload_failed(&mut self, e: String) {
        tracing::error!(error = %e, "SIGHUP: reload refused; the cell keeps running unchanged");
        crate::logging::log::say(&format!("reload refused: {e}"));
        notify(&[NotifyState::Status(&format!("reload refused: {e}"))]);
        self.reload.refused(e);
    }

    /// The new config passed its dry run: both roles stop and start again through the gate
    /// with it (the cell's network stays).
    pub(super) fn reload_passed(&mut self) {
        let Some(new) = self.reload.take_candidate() else { return };
        tracing::info!(config_sha256 = %new.config_sha256(), "SIGHUP: config reloaded; restarting both roles through the gate (the cell's network stays)");
        let mut states = vec![NotifyState::Reloading, NotifyState::Status("reloading")];
        if let Ok(usec) = NotifyState::monotonic_usec_now() {
            states.push(usec);
        }
        notify(&states);
        self.reload.applied(new);
        self.begin_stop(exit::OK, After::Restart);
    }
}
