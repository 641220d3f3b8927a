//! The gate every start passes (first start, crash restart, reload, recycle), as a component
//! of the event loop: it owns its processes and pipes, offers `handle(token)`, a next deadline
//! and `poll`, and answers with an [`Outcome`] the supervisor acts on.
//!
//! One pass, for the roles about to start:
//! 1. each role's plan (its sandbox; its program resolved in its view, a memfd for the copy);
//! 2. the measurement, forked (crate::proof::measure): programs copied into their memfds, sealed and
//!    hashed, every bind walked for what must not be in a role's view, the engine's models
//!    hashed; it runs beside
//! 3. the preflight: sealnode's canary probe in each role's exact sandbox, in the cell.
//!
//! The loop meanwhile keeps serving signals, control requests, forwarding and the watchdog:
//! nothing here reads a file of untrusted size or type or waits on a process. The plans that
//! pass are [`Admitted`]: measured and preflighted, the only plans a role starts from.

use std::os::fd::{AsFd, OwnedFd};
use std::time::{Duration, Instant};

use nix::sys::epoll::{Epoll, EpollEvent, EpollFlags};
use nix::unistd::Pid;

use crate::config::{Config, Invoker, Role};
use crate::error::Error;
use crate::proof::canary;
use crate::proof::measure;
use crate::sandbox::cell::Cell;
use crate::sandbox::{self, Plan};

mod finish;
mod pass;

use finish::finish;
pub(super) use pass::{Admitted, Cause, Outcome, Passed, Purpose};
use pass::{Job, ProbeRun};

/// The gate's pipes: the measurement's (low bits 0) and each probe's (1 + its index).
pub(super) const TOKEN_GATE: u64 = 10 << 56;

/// What a pass needs from the supervisor.
pub(super) struct Ctx<'a> {
    pub cfg: &'a Config,
    pub inv: &'a Invoker,
    /// The running cell (a dry run makes its own).
    pub cell: &'a Cell,
    pub state: &'a OwnedFd,
    pub epoll: &'a Epoll,
    /// Statements are signed: the engine's model files are hashed for them.
    pub hash_models: bool,
    /// Each role's scratch dir as `run` opened and locked it at its start.
    pub scratch: [&'a OwnedFd; 2],
}

#[derive(Debug, Default)]
pub(super) struct Gate {
    job: Option<Job>,
    /// Processes of abandoned passes, reaped later like any child: ours to ignore.
    abandoned: Vec<Pid>,
}

impl Gate {
    pub fn busy(&self) -> bool {
        self.job.is_some()
    }

    pub fn purpose(&self) -> Option<Purpose> {
        self.job.as_ref().map(|j| j.purpose)
    }

    /// Start a pass for `roles`. What fails before anything runs is refused at once, and so is
    /// a second pass while one runs (none does: a SIGHUP and a restart check `busy()` first,
    /// and the start after the wipes follows a stop, which abandons the pass in flight); a bug
    /// that began one would otherwise lose the running pass's worker and probes.
    pub fn begin(&mut self, ctx: &Ctx, roles: &[Role], purpose: Purpose) -> Result<(), Cause> {
        let could_not = Cause::CouldNotRun;
        if self.busy() {
            return Err(could_not(
                "preflight could not run: another pass through the gate is running (internal error)".into(),
            ));
        }
        let targets = canary::targets(ctx.cfg).map_err(|e| could_not(format!("preflight could not run: {e}")))?;
        scratch_still_held(ctx, roles).map_err(Cause::Config)?;
        let (plans, probe_plans) = plans_and_probes(ctx, roles, &targets)?;
        // Model files are hashed for the statements (only with a key), and only from a
        // read-only dir: a writable one binds nothing and would be rehashed at every start.
        let hash_models = roles.contains(&Role::Engine) && ctx.hash_models && ctx.cfg.engine.models.is_some();
        let models = match (&ctx.cfg.engine.models, hash_models && !ctx.cfg.engine.models_writable) {
            (Some(dir), true) => Some(measure::ModelsJob { dir: dir.clone(), keep_cache: true }),
            _ => None,
        };
        let planned: Vec<(Role, &Plan)> = plans.iter().map(|(r, p)| (*r, p)).collect();
        let mut job = measure::job_for(ctx.cfg, ctx.inv, &planned);
        job.models = models;
        let worker =
            measure::Worker::spawn(&job, ctx.state, &ctx.cfg.cell.state_dir).map_err(|e| could_not(e.to_string()))?;
        let watch = |fd: &OwnedFd, token: u64| {
            ctx.epoll
                .add(fd.as_fd(), EpollEvent::new(EpollFlags::EPOLLIN, TOKEN_GATE | token))
                .map_err(|e| Error::errno("epoll_ctl (gate)", e))
        };
        if let Err(e) = watch(&worker.out, 0) {
            worker.abandon();
            self.abandoned.push(worker.pid);
            return Err(could_not(e.to_string()));
        }
        let mut job = Job {
            purpose,
            roles: roles.to_vec(),
            plans,
            worker,
            hash_models,
            probes: Vec::new(),
            _targets: targets,
            _throwaway: None,
            began: Instant::now(),
            deadline: Instant::now() + canary::battery_deadline(ctx.cfg),
            said_slow: false,
            probe_failed: None,
        };
        let started = (|| -> crate::error::Result<()> {
            if purpose == Purpose::DryRun {
                job._throwaway = Some(Cell::for_config(ctx.cfg, ctx.inv)?);
            }
            let cell = job._throwaway.as_ref().unwrap_or(ctx.cell);
            for (i, plan) in probe_plans.into_iter().enumerate() {
                let probe = canary::start_plan(plan, Some(cell))?;
                nix::fcntl::fcntl(&probe.out, nix::fcntl::FcntlArg::F_SETFL(nix::fcntl::OFlag::O_NONBLOCK))
                    .map_err(|e| Error::errno("fcntl (probe)", e))?;
                let token = 1 + i as u64;
                let run = ProbeRun { probe, buf: Vec::new(), eof: false, status: None };
                job.probes.push(run);
                watch(&job.probes[i].probe.out, token)?;
            }
            Ok(())
        })();
        if let Err(e) = started {
            // The probes started are given up; the measurement goes on (see probe_failed).
            for p in job.probes.drain(..) {
                let _ = ctx.epoll.delete(p.probe.out.as_fd());
                if p.status.is_none() {
                    let _ = nix::sys::signal::kill(p.probe.sandbox.pid, nix::sys::signal::Signal::SIGKILL);
                    self.abandoned.push(p.probe.sandbox.pid);
                }
            }
            job.probe_failed = Some(format!("preflight could not run: {e}"));
        }
        self.job = Some(job);
        Ok(())
    }

    /// A gate pipe is readable (or hung up). A pipe at its end leaves the epoll set at once: a
    /// hung-up pipe stays ready, and the loop would spin on it until the rest of the pass is
    /// done (tests/gate.rs: a_held_measurement_costs_the_loop_no_cpu).
    pub fn handle(&mut self, token: u64, epoll: &Epoll) {
        let Some(job) = self.job.as_mut() else { return };
        match (token & !crate::egress::TOKEN_KIND) as usize {
            0 => {
                job.worker.pump();
                if job.worker.eof() {
                    let _ = epoll.delete(job.worker.out.as_fd());
                }
            }
            i => {
                if let Some(p) = job.probes.get_mut(i - 1) {
                    pump(p);
                    if p.eof {
                        let _ = epoll.delete(p.probe.out.as_fd());
                    }
                }
            }
        }
    }

    /// A child exited: one of ours? (true: taken.)
    pub fn exited(&mut self, pid: Pid, code: i32) -> bool {
        if let Some(i) = self.abandoned.iter().position(|p| *p == pid) {
            self.abandoned.swap_remove(i);
            return true;
        }
        let Some(job) = self.job.as_mut() else { return false };
        if job.worker.pid == pid {
            job.worker.exited(code);
            return true;
        }
        if let Some(p) = job.probes.iter_mut().find(|p| p.probe.sandbox.pid == pid) {
            p.status = Some(code);
            pump(p);
            p.eof = true;
            return true;
        }
        false
    }

    pub fn next_deadline(&self) -> Option<Instant> {
        let due = |j: &&Job| j.probes.iter().any(|p| p.status.is_none()) || (!j.worker.done() && !j.said_slow);
        self.job.as_ref().filter(due).map(|j| j.deadline)
    }

    /// The pass's outcome once everything answered, or once its probes ran out of time.
    pub fn poll(&mut self, cfg: &Config, epoll: &Epoll) -> Option<Outcome> {
        let job = self.job.as_ref()?;
        let probes_done = job.probes.iter().all(|p| p.status.is_some() && p.eof);
        if !probes_done && Instant::now() >= job.deadline {
            let late: Vec<String> =
                job.probes.iter().filter(|p| p.status.is_none()).map(|p| p.probe.role.to_string()).collect();
            self.abandon(epoll);
            return Some(Outcome::Refused(Cause::CouldNotRun(format!(
                "preflight could not run: the canary probe in the {} role did not answer within {} s",
                late.join(" and "),
                cfg.cell.preflight_timeout_s
            ))));
        }
        if !probes_done || !job.worker.done() {
            if probes_done && !job.said_slow && Instant::now() >= job.deadline {
                let (pid, secs) = (job.worker.pid, job.began.elapsed().as_secs());
                let state = crate::os::sys::process_state(pid).unwrap_or('?');
                tracing::warn!(pid = pid.as_raw(), state = %state, secs, "the gate still waits for the measurement (hashing what the roles run; `ctl status` shows its state)");
                if let Some(j) = self.job.as_mut() {
                    j.said_slow = true;
                }
            }
            return None;
        }
        let job = self.job.take()?;
        unwatch(&job, epoll);
        Some(finish(cfg, job))
    }

    /// Give up the pass in progress (a stop came): its processes are killed, reaped later.
    pub fn abandon(&mut self, epoll: &Epoll) {
        let Some(job) = self.job.take() else { return };
        unwatch(&job, epoll);
        if !job.worker.done() {
            job.worker.abandon();
            self.abandoned.push(job.worker.pid);
        }
        for p in &job.probes {
            if p.status.is_none() {
                let _ = nix::sys::signal::kill(p.probe.sandbox.pid, nix::sys::signal::Signal::SIGKILL);
                self.abandoned.push(p.probe.sandbox.pid);
            }
        }
    }

    /// How long the pass in progress has run, for which roles, and what it still waits for
    /// (for `ctl status`).
    pub fn progress(&self) -> Option<Progress> {
        self.job.as_ref().map(|j| Progress {
            purpose: j.purpose,
            roles: j.roles.clone(),
            elapsed: j.began.elapsed(),
            waiting_for: waiting_for(j),
        })
    }
}

/// A pass in progress, for `ctl status`.
pub struct Progress {
    pub purpose: Purpose,
    pub roles: Vec<Role>,
    pub elapsed: Duration,
    /// What it still waits for (`measurement`, `preflight <role>`) and its pid.
    pub waiting_for: Vec<(String, Pid)>,
}

/// The processes a pass still waits for: its measurement, its probes.
fn waiting_for(j: &Job) -> Vec<(String, Pid)> {
    let measuring = (!j.worker.done()).then(|| ("measurement".to_string(), j.worker.pid));
    let probes = j
        .probes
        .iter()
        .filter(|p| p.status.is_none())
        .map(|p| (format!("preflight {}", p.probe.role), p.probe.sandbox.pid));
    measuring.into_iter().chain(probes).collect()
}

/// The scratch path is still the dir this run locked and wipes: a dir renamed away while the
/// cell ran, with a new one at its path, refuses the start (a restart would bind the new dir,
/// which another cell could lock, while the wipes empty the renamed one)
/// (tests/check_run.rs: a_scratch_dir_replaced_while_running_refuses_the_restart).
fn scratch_still_held(ctx: &Ctx, roles: &[Role]) -> crate::error::Result<()> {
    for role in roles {
        let r = ctx.cfg.role(*role);
        let held = nix::sys::stat::fstat(ctx.scratch[*role as usize]).map(|s| (s.st_dev, s.st_ino));
        let now = crate::os::sys::open_path_no_symlinks(&r.scratch)
            .and_then(|fd| nix::sys::stat::fstat(&fd))
            .map(|s| (s.st_dev, s.st_ino));
        if held.is_err() || held != now {
            return Err(Error::config(
                &ctx.cfg.file,
                format!("{role}.scratch"),
                format!(
                    "{} is no longer the dir this `sealnode run` locked and wipes (renamed or replaced while the \
                     cell ran): put it back, or restart sealnode",
                    r.scratch.display()
                ),
            ));
        }
    }
    Ok(())
}

/// The plans of a pass, by role.
type RolePlans = Vec<(Role, Plan)>;

/// Each role's plan, built and checked once, and the preflight's probe plan made from it
/// ([`Plan::probe`]: only its program replaced): what passes is what the role starts from.
fn plans_and_probes(ctx: &Ctx, roles: &[Role], targets: &canary::Targets) -> Result<(RolePlans, Vec<Plan>), Cause> {
    let mut plans = Vec::new();
    let mut probe_plans = Vec::new();
    for role in roles {
        let probe = canary::probe_argv(ctx.cfg, *role, targets, sandbox::Layers::ALL)
            .and_then(|argv| Ok((argv, sandbox::plan::sealed_self()?)))
            .map_err(|e| Cause::CouldNotRun(e.to_string()))?;
        let (plan, probe) = Plan::for_run_and_probe(ctx.cfg, *role, ctx.inv, Some(probe)).map_err(Cause::Config)?;
        plans.push((*role, plan));
        probe_plans.extend(probe);
    }
    Ok((plans, probe_plans))
}

fn pump(p: &mut ProbeRun) {
    let mut chunk = [0u8; 16384];
    while !p.eof {
        match nix::unistd::read(&p.probe.out, &mut chunk) {
            Ok(0) => p.eof = true,
            // A probe writes a few KiB; more is not one (it is cut, and fails to parse).
            Ok(n) if p.buf.len() < 1 << 20 => p.buf.extend_from_slice(&chunk[..n]),
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return,
        }
    }
}

fn unwatch(job: &Job, epoll: &Epoll) {
    let _ = epoll.delete(job.worker.out.as_fd());
    for p in &job.probes {
        let _ = epoll.delete(p.probe.out.as_fd());
    }
}
