//! The scratch wipes: before the first start and after every stop, both roles' scratch dirs
//! are emptied, each by a child of its own (cell::Cell::spawn_wipe) that the loop reaps, so a
//! huge or hostile tree never holds the loop. What follows the wipes: the gate (a start, a
//! reload's or recycle's re-provision), or the exit. A role never starts on what an earlier
//! run left: a wipe that fails before a start stops the cell (fail closed); before an exit it
//! is only reported (the next start wipes again).

use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use nix::errno::Errno;
use nix::sys::signal::{kill, Signal};
use nix::sys::wait::WaitStatus;
use nix::unistd::Pid;

use super::lifecycle::{AfterWipes, CellEvent, Event, Phase};
use super::{notify, Supervisor};
use crate::config::Role;
use crate::sandbox::cell::WipeFailed;
use sd_notify::NotifyState;

impl Supervisor {
    /// Start emptying the scratch dirs of the roles the stop stopped (both before the first
    /// start: lifecycle::Cycle::stopped) and not emptied yet (lifecycle::Cycle::to_wipe), each
    /// in a child of its own; [`Supervisor::wipes_done`] goes on once they are done.
    pub(super) fn begin_wipes(&mut self) {
        let roles = self.cycle.to_wipe();
        self.course(CellEvent::WipesBegun);
        for role in roles {
            let cell = &self.base.cell;
            // A capped scratch is the cell's tmpfs, held by its root; an uncapped one, the dir.
            let dir = cell.capped_scratch(role).unwrap_or(self.roles[role as usize].scratch.as_fd());
            let spawned = cell.spawn_wipe(dir, self.base.ids[role as usize]);
            match spawned {
                Ok(pid) => self.slot(role).apply(Event::WipeStarted(pid)),
                Err(e) => self.course(CellEvent::WipeFailed(role, WipeFailed::Errno(e))),
            }
        }
        self.arm_wipe_deadline();
    }

    /// `pid` was a wipe child: its role is down, its result kept for [`Supervisor::wipes_done`].
    pub(super) fn wipe_exited(&mut self, pid: Pid, ws: WaitStatus) -> bool {
        let Some(i) = self.roles.iter().position(|s| s.phase == Phase::Wiping(pid)) else { return false };
        self.roles[i].apply(Event::WipeDone);
        if let Err(e) = crate::sandbox::cell::wipe_result(ws) {
            self.course(CellEvent::WipeFailed(self.roles[i].role, e));
        }
        true
    }

    /// Both wipes done: `next` follows, as the cell's table decided it
    /// (lifecycle::Cycle::after_wipes). Some(code): the loop ends with it.
    pub(super) fn wipes_done(&mut self, next: AfterWipes) -> Option<i32> {
        let failed = self.cycle.wipes.failed.clone();
        let roles = self.cycle.stopped();
        self.course(CellEvent::WipesOver);
        // A restart, recycle or reload: its stop is over, the new config (if any) in force.
        if next.reprovision() {
            let recycle = self.server.recycle_waiting();
            // Every forwarded connection is the node's, and the node is down.
            self.fwd.close_all(&self.base.epoll);
            self.course(CellEvent::StopOver);
            if let Some(new) = self.reload.take_next() {
                // The node is down: its egress listeners are made anew where they changed.
                if let Err(e) = self.switch_egress(&new) {
                    tracing::error!(error = %e, "the new config's egress could not be set up; not starting");
                    crate::logging::log::say(&format!("{e}"));
                    return Some(self.end_before_start("re-provision", crate::exit::FAILED));
                }
                self.base.cfg = new;
                self.forwarding_from_config();
                self.watch.follow(&self.base.cfg, &self.base.epoll);
            }
            let names: Vec<&str> = roles.iter().map(|r| r.name()).collect();
            tracing::info!(recycle, roles = %names.join(","), "re-provisioning");
        }
        let what = if next.reprovision() { "re-provision" } else { "start" };
        match next {
            // A stop to exit (also one that came during a start's wipes) ends the loop; a wipe
            // that failed is only said (the next start wipes again).
            AfterWipes::Exit(code) => {
                for (role, e) in &failed {
                    let dir = self.base.cfg.role(*role).scratch.display().to_string();
                    tracing::warn!(role = %role, dir, error = %e, "could not wipe scratch (the next start wipes it)");
                }
                Some(self.finish_stop(code))
            }
            // No role starts on what an earlier run left.
            AfterWipes::Refuse { code, .. } => {
                for (role, e) in &failed {
                    self.say_wipe_failed(*role, e);
                }
                Some(self.end_before_start(what, code))
            }
            AfterWipes::Gate { .. } => match self.enter_gate(&roles) {
                Ok(()) => None,
                Err(code) => Some(self.end_before_start(what, code)),
            },
        }
    }

    /// A role's scratch could not be wiped before a start: why, and what to do about it.
    fn say_wipe_failed(&self, role: Role, e: &WipeFailed) {
        let dir = self.base.cfg.role(role).scratch.display().to_string();
        let hint = wipe_hint(e, self.base.cfg.role(role).scratch_max_mb.is_some());
        tracing::error!(role = %role, dir, error = %e, "cannot wipe the role's scratch; not starting{hint}");
        crate::logging::log::say(&format!("cannot wipe {role}.scratch {dir}: {e}{hint}"));
    }

    /// The start (or a re-provision's) is refused right after the wipes: nothing runs and
    /// both scratch dirs were just wiped (or could not be), so the loop ends here, not through
    /// a stop's second wipes (tests/run.rs:
    /// scratch_is_wiped_as_the_cell_and_a_foreign_leftover_refuses_the_start).
    fn end_before_start(&mut self, what: &str, code: i32) -> i32 {
        self.server.recycle_done(&crate::control::protocol::Refusal::new(format!("{what} failed; sealnode stops")));
        notify(&[NotifyState::Stopping, NotifyState::Status("stopping")]);
        self.finish_stop(code)
    }

    /// The cell's last words, the loop's one way out: forwarding drained, statements given
    /// up, totals logged.
    fn finish_stop(&mut self, code: i32) -> i32 {
        // Drain: no forwarded connection outlives the roles.
        self.fwd.close_all(&self.base.epoll);
        self.attest.abandon();
        // Those a reload took out too: every connection the node made is counted.
        let retired = self.fwd.retired().iter().map(|s| (s, true));
        for (s, taken_out) in self.fwd.stats().iter().map(|s| (s, false)).chain(retired) {
            tracing::info!(upstream = %s.upstream, accepted = s.accepted, bytes_up = s.bytes_up, bytes_down = s.bytes_down, refused = s.refused_over_limit, failed = s.connect_failed, taken_out, "egress totals");
        }
        if let Some(s) = self.fwd.engine_stats() {
            tracing::info!(
                accepted = s.accepted,
                bytes_up = s.bytes_up,
                bytes_down = s.bytes_down,
                refused = s.refused_over_limit,
                failed = s.connect_failed,
                waited = s.held,
                wait_expired = s.hold_expired,
                replayed = s.replayed,
                "node-to-engine totals"
            );
        }
        tracing::info!(code, "cell stopped");
        code
    }

    /// A stop to exit gives wipes in flight the grace period the roles get (the rule:
    /// lifecycle::Cycle::apply, CellEvent::Grace).
    pub(super) fn arm_wipe_deadline(&mut self) {
        let grace = Duration::from_secs(self.base.cfg.cell.stop_timeout_s);
        self.course(CellEvent::Grace(Instant::now() + grace));
    }

    /// Wipes that outlived the stop's grace period are killed.
    pub(super) fn wipes_timer(&mut self, now: Instant) {
        if self.cycle.wipes.deadline.is_some_and(|t| t <= now) {
            self.course(CellEvent::GraceOver);
            for s in &self.roles {
                if let Phase::Wiping(pid) = s.phase {
                    tracing::warn!(role = %s.role, pid = pid.as_raw(), "the scratch wipe did not finish within the stop's grace period; killed (the next start wipes again)");
                    let _ = kill(pid, Signal::SIGKILL);
                }
            }
        }
    }
}

/// What to do about a wipe that failed with `e`; `capped`: the role's scratch is the cell's tmpfs.
fn wipe_hint(e: &WipeFailed, capped: bool) -> &'static str {
    match e {
        // The cell's tmpfs, which nothing but the role writes, and which goes with the cell
        // (found by review: it was told as another host user's files, to remove by hand from a
        // host dir that is empty).
        WipeFailed::Errno(_) if capped => {
            " (the cell's tmpfs over that dir, which only the role writes: nothing to remove by hand; it goes with the cell)"
        }
        WipeFailed::Errno(Errno::EACCES | Errno::EPERM) => {
            " (it holds files the role cannot have left there: another host user's; remove them by hand)"
        }
        WipeFailed::Errno(Errno::EBUSY) => " (a mount point inside it: unmount it)",
        WipeFailed::Killed(libc::SIGSYS) => {
            " (killed by a seccomp filter above sealnode: `sealnode doctor` names the call it kills)"
        }
        WipeFailed::Entering(_) => {
            " (a seccomp filter or LSM above sealnode refuses setns, setgroups or the change of ids: `sealnode doctor` names it)"
        }
        _ => "",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A capped scratch's wipe is never told as another host user's files to remove by hand:
    /// only the role writes the cell's tmpfs, and it goes with the cell.
    #[test]
    fn a_capped_scratch_is_never_told_as_a_host_users_files() {
        for e in [Errno::EACCES, Errno::EPERM, Errno::EBUSY] {
            let hint = wipe_hint(&WipeFailed::Errno(e), true);
            assert!(hint.contains("only the role writes") && !hint.contains("another host user"), "{e}: {hint}");
        }
        assert!(wipe_hint(&WipeFailed::Errno(Errno::EACCES), false).contains("another host user's"));
        assert!(wipe_hint(&WipeFailed::Errno(Errno::EBUSY), false).contains("unmount it"));
        assert!(wipe_hint(&WipeFailed::Entering(Errno::EPERM), true).contains("doctor"));
    }
}
