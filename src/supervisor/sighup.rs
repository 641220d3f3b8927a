//! SIGHUP, step by step: the config read again and checked (reload.rs says what may change
//! and what it restarts); a change that restarts no role applied in place (the limits written
//! live, a new receipt and statement); else its dry run through the gate in a throwaway cell
//! while the old roles run on, then the switch (the node, or both roles, stopped and started
//! again through the gate with it); or the refusal, said and kept for `ctl status`. A change
//! of the config on disk, with `cell.reload_on_change` (watch.rs), takes the same path.

use std::time::Instant;

use sd_notify::NotifyState;

use super::lifecycle::After;
use super::reload::{refused, same_files, scope, Scope};
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
            // During a reload, `ctl status` goes on showing that reload's outcome: one ignored
            // SIGHUP must not stand in for it (found by review: a refusal left there named a
            // reload that then completed as refused).
            if self.reload.under_way() {
                tracing::warn!(
                    busy = what,
                    "SIGHUP ignored: a reload is in progress ({what}); ctl status shows its outcome"
                );
            } else {
                tracing::warn!(busy = what, "SIGHUP ignored: {what} is in progress");
                self.reload.refused(format!("{what} was in progress"));
            }
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
        let new = Config::reload(&cfg.file, &self.base.inv, cfg).and_then(|new| match refused(cfg, &new) {
            changed if changed.is_empty() => Ok(new),
            changed => Err(Error::config(
                &cfg.file,
                changed.join(", "),
                "changed, but the running cell (its hostname, users, dirs, the node's way to the engine, its cgroup and TPM) was built with the old value; restart sealnode to apply it",
            )),
        })?;
        // The limits must be writable into this cell's leaves before anything is switched.
        crate::sandbox::cgroup::check_update(self.base.cell.cgroups.as_ref(), &new)?;
        // A role that now logs its refusals needs pidfd_getfd: refused before any role stops.
        crate::doctor::denial_log_ready(&new)?;
        Ok(new)
    }

    /// A config read for a reload: refused (said, kept for `ctl status`), or into its dry run
    /// through the gate while the running roles are untouched.
    fn try_reload(&mut self, loaded: crate::error::Result<Config>) {
        let new = match loaded {
            Ok(new) => new,
            Err(e) => return self.reload_failed(e.to_string()),
        };
        log_devices_from(&new);
        if scope(&self.base.cfg, &new) == Scope::InPlace {
            return self.apply_in_place(new);
        }
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

    /// The new config passed its dry run: its limits are written live, then the node (when
    /// the engine's inputs are unchanged and it is ready) or both roles stop and start again
    /// through the gate with it (the cell's network stays).
    pub(super) fn reload_passed(&mut self) {
        let Some(new) = self.reload.take_candidate() else { return };
        let after = match scope(&self.base.cfg, &new) {
            Scope::Node if self.engine_is_ready() => After::RestartNode,
            _ => After::Restart,
        };
        if let Err(e) = self.write_limits(&new) {
            return self.reload_failed(e.to_string());
        }
        let restarts = if after == After::RestartNode { "the node (the engine runs on)" } else { "both roles" };
        tracing::info!(config_sha256 = %new.config_sha256(), "SIGHUP: config reloaded; restarting {restarts} through the gate (the cell's network stays)");
        reloading();
        self.reload.applied(new);
        self.begin_stop(exit::OK, after);
    }

    /// A change that restarts no role (reload::Scope::InPlace): the limits written live, the
    /// forwarder's bounds and timers set, the config in force switched, and a new receipt and
    /// statement saying so; the roles run on.
    fn apply_in_place(&mut self, new: Config) {
        if let Err(e) = self.write_limits(&new) {
            return self.reload_failed(e.to_string());
        }
        tracing::info!(config_sha256 = %new.config_sha256(), "SIGHUP: config reloaded in place; no role restarts");
        reloading();
        self.reload.applied_in_place(&new);
        self.base.cfg = new;
        self.forwarding_from_config();
        self.watch.follow(&self.base.cfg, &self.base.epoll);
        self.receipt_in_place();
        self.roles_up();
    }

    /// `new`'s cgroup limits, written live into the leaves whose limits changed; each role's
    /// seal (for its status and statements) says the limits now in force.
    fn write_limits(&mut self, new: &Config) -> crate::error::Result<()> {
        let Some(tree) = self.base.cell.cgroups.as_mut() else { return Ok(()) };
        let changed = tree.update(new)?;
        for role in changed {
            let files = tree.record(role).map(|(_, f)| f).unwrap_or_default();
            tracing::info!(role = %role, limits = ?files, "cgroup limits written live");
            if let Some(seal) = self.roles[role as usize].sealed.as_mut() {
                seal.cgroup = files;
            }
        }
        Ok(())
    }

    /// The forwarder's bounds and the engine hold of the config in force.
    pub(super) fn forwarding_from_config(&mut self) {
        let c = &self.base.cfg.cell;
        self.fwd.set_bounds(
            c.egress_max_connections,
            std::time::Duration::from_secs(c.egress_idle_timeout_s),
            std::time::Duration::from_secs(c.egress_connect_timeout_s),
        );
        self.fwd.set_engine_hold(std::time::Duration::from_secs(c.engine_hold_s));
        self.fwd.set_engine_replay(usize::try_from(c.engine_replay_kb).unwrap_or(usize::MAX).saturating_mul(1024));
    }

    /// The node's declared egress as `new` declares it, while the node is down for its
    /// restart: each upstream's listener kept where its address and port stay, made anew in
    /// the node's network namespace where they change, the forwarder pointed at the new
    /// upstreams (their names resolved afresh).
    pub(super) fn switch_egress(&mut self, new: &Config) -> crate::error::Result<()> {
        use std::net::Ipv4Addr;
        let addrs = |c: &Config| -> Vec<(Ipv4Addr, u16)> {
            c.node.egress.iter().enumerate().map(|(i, e)| (Config::egress_addr(i), e.port as u16)).collect()
        };
        let old = &self.base.cfg;
        if format!("{:?}", old.node.egress) == format!("{:?}", new.node.egress) {
            return Ok(());
        }
        let (have, want) = (addrs(old), addrs(new));
        let make: Vec<(Ipv4Addr, u16)> = want.iter().filter(|a| !have.contains(a)).copied().collect();
        // Made first: a failure leaves the forwarder as it was.
        let made = self.base.cell.node_listeners(&make)?;
        let kept = self.fwd.take_egress(&self.base.epoll);
        let mut listeners: std::collections::HashMap<(Ipv4Addr, u16), std::os::fd::OwnedFd> =
            have.into_iter().zip(kept).chain(make.into_iter().zip(made)).collect();
        let mut upstreams = Vec::new();
        for (a, e) in want.iter().zip(&new.node.egress) {
            let listener = listeners.remove(a).ok_or_else(|| {
                Error::errno(format!("the node's listener for {}:{}", e.host, e.port), nix::errno::Errno::EPROTO)
            })?;
            let connect = e.connect.as_ref().and_then(|c| c.parse().ok());
            upstreams.push(crate::egress::Upstream::new(
                e.host.clone(),
                e.port as u16,
                connect,
                e.allow_private,
                listener,
            ));
        }
        // Those no longer declared close here: nothing of the node listens there any more.
        drop(listeners);
        self.fwd.set_egress(&self.base.epoll, upstreams).map_err(|e| Error::errno("epoll_ctl (egress)", e))?;
        let names: Vec<String> = new.node.egress.iter().map(|e| format!("{}:{}", e.host, e.port)).collect();
        tracing::info!(egress = %names.join(","), "the node's egress switched");
        Ok(())
    }
}

/// RELOADING=1 with the time, for systemd's Type=notify-reload.
fn reloading() {
    let mut states = vec![NotifyState::Reloading, NotifyState::Status("reloading")];
    if let Ok(usec) = NotifyState::monotonic_usec_now() {
        states.push(usec);
    }
    notify(&states);
}
