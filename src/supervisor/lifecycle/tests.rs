//! The lifecycle's rules as tables.

use super::*;

/// The state × event table: every pair it has, and a sample of those it has not.
#[test]
fn the_phase_table() {
    use Event as E;
    use Phase as P;
    let t0 = Instant::now();
    let (pid, at) = (Pid::from_raw(42), t0 + Duration::from_secs(9));
    let delay = Duration::from_secs(2);
    for (from, event, to) in [
        (P::Down, E::EnterGate, Some(P::Starting)),
        (P::Starting, E::Refused, Some(P::Down)),
        (P::Starting, E::Admitted, Some(P::Admitted)),
        (P::Starting, E::RetryAt(at), Some(P::Waiting(at))),
        (P::Waiting(t0), E::RetryAt(at), Some(P::Waiting(at))),
        (P::Waiting(t0), E::Due, Some(P::Down)),
        (P::Admitted, E::Started(pid), Some(P::Running(pid))),
        (P::Running(pid), E::Exited(Decision::Restart(delay), t0), Some(P::Waiting(t0 + delay))),
        (P::Running(pid), E::Exited(Decision::GiveUp, t0), Some(P::Down)),
        (P::Running(pid), E::Exited(Decision::Stop, t0), Some(P::Down)),
        (P::Running(pid), E::Exited(Decision::StayDown, t0), Some(P::Down)),
        (P::Waiting(t0), E::StopAsked, Some(P::Down)),
        (P::Starting, E::StopAsked, Some(P::Down)),
        (P::Admitted, E::StopAsked, Some(P::Down)),
        (P::Running(pid), E::StopAsked, Some(P::Running(pid))),
        (P::Wiping(pid), E::StopAsked, Some(P::Wiping(pid))),
        (P::Down, E::StopAsked, Some(P::Down)),
        (P::Stopping(pid, t0), E::StopAsked, Some(P::Stopping(pid, t0))),
        (P::Running(pid), E::TermSent(at), Some(P::Stopping(pid, at))),
        (P::Stopping(pid, t0), E::KillSent(at), Some(P::Stopping(pid, at))),
        (P::Stopping(pid, t0), E::Reaped, Some(P::Down)),
        (P::Down, E::WipeStarted(pid), Some(P::Wiping(pid))),
        (P::Wiping(pid), E::WipeDone, Some(P::Down)),
        // Not in the table: a start while running, a wipe under a live role, a second
        // pass through the gate, a reap of what is not stopping.
        (P::Running(pid), E::Started(pid), None),
        (P::Down, E::Started(pid), None),
        (P::Admitted, E::EnterGate, None),
        (P::Running(pid), E::WipeStarted(pid), None),
        (P::Starting, E::EnterGate, None),
        (P::Running(pid), E::Reaped, None),
        (P::Down, E::Exited(Decision::Stop, t0), None),
    ] {
        assert_eq!(from.on(event), to, "{from:?} on {event:?}");
    }
}

/// What follows the wipes, for every stop (none, each kind) and both wipe outcomes.
#[test]
fn after_the_wipes_an_exit_ends_a_failure_refuses_and_the_rest_enters_the_gate() {
    let stop = |after| Some(Stop { code: 7, after });
    for (stop, failed, want) in [
        (None, false, AfterWipes::Gate { reprovision: false }),
        (None, true, AfterWipes::Refuse { reprovision: false, code: exit::CONFIG }),
        (stop(After::Exit), false, AfterWipes::Exit(7)),
        (stop(After::Exit), true, AfterWipes::Exit(7)),
        (stop(After::Restart), false, AfterWipes::Gate { reprovision: true }),
        (stop(After::Restart), true, AfterWipes::Refuse { reprovision: true, code: exit::CONFIG }),
        (stop(After::RestartNode), false, AfterWipes::Gate { reprovision: true }),
        (stop(After::RestartNode), true, AfterWipes::Refuse { reprovision: true, code: exit::CONFIG }),
    ] {
        let cycle = Cycle { stop, drain: None, wipes: Wipes::default() };
        assert_eq!(cycle.after_wipes(failed), want, "{stop:?} failed={failed}");
        // A re-provision follows every stop but one to exit.
        let reprovision = stop.is_some_and(|s| s.after != After::Exit);
        assert_eq!(want.reprovision(), reprovision, "{stop:?} failed={failed}");
    }
}

/// The cell's table: every stop (none, to exit, to restart), wipes (none, in flight,
/// done, failed) and the phases that matter.
#[test]
fn the_cells_next_step() {
    use Phase as P;
    let (pid, t0) = (Pid::from_raw(9), Instant::now());
    let stop = |after| Some(Stop { code: 0, after });
    let wipes = |running, failed: bool| Wipes {
        running,
        of: [running; 2],
        failed: if failed { vec![(Role::Node, crate::sandbox::cell::WipeFailed::Killed(9))] } else { Vec::new() },
        deadline: None,
    };
    let none = || wipes(false, false);
    // stop, wipes, engine, node: the step.
    let table = [
        // No stop, no wipes: the roles' own events drive them.
        (None, none(), P::Running(pid), P::Running(pid), Step::Wait),
        (None, none(), P::Down, P::Down, Step::Wait),
        // A stop: the node first, the engine once the node is down, then the wipes.
        (stop(After::Exit), none(), P::Running(pid), P::Running(pid), Step::Term(Role::Node)),
        (stop(After::Exit), none(), P::Running(pid), P::Stopping(pid, t0), Step::Wait),
        (stop(After::Exit), none(), P::Running(pid), P::Down, Step::Term(Role::Engine)),
        (stop(After::Restart), none(), P::Stopping(pid, t0), P::Down, Step::Wait),
        (stop(After::Exit), none(), P::Down, P::Running(pid), Step::Term(Role::Node)),
        (stop(After::Restart), none(), P::Down, P::Down, Step::Wipe),
        // The node's own restart: the node stopped and wiped, the engine never stopped.
        (stop(After::RestartNode), none(), P::Running(pid), P::Running(pid), Step::Term(Role::Node)),
        (stop(After::RestartNode), none(), P::Running(pid), P::Stopping(pid, t0), Step::Wait),
        (stop(After::RestartNode), none(), P::Running(pid), P::Down, Step::Wipe),
        (stop(After::RestartNode), wipes(true, false), P::Running(pid), P::Wiping(pid), Step::Wait),
        (
            stop(After::RestartNode),
            wipes(true, false),
            P::Running(pid),
            P::Down,
            Step::WipesDone(AfterWipes::Gate { reprovision: true }),
        ),
        // The engine exited during the node's own restart, after the node's wipe began: the
        // stop now restarts both, and the engine's scratch is wiped too before anything starts.
        (
            stop(After::Restart),
            Wipes { running: true, of: [false, true], ..Wipes::default() },
            P::Down,
            P::Wiping(pid),
            Step::Wait,
        ),
        (
            stop(After::Restart),
            Wipes { running: true, of: [false, true], ..Wipes::default() },
            P::Down,
            P::Down,
            Step::Wipe,
        ),
        // A SIGTERM during the node's own restart, its wipe running: the engine is stopped
        // first (as any stop stops it), then wiped; never wiped while it runs.
        (
            stop(After::Exit),
            Wipes { running: true, of: [false, true], ..Wipes::default() },
            P::Running(pid),
            P::Wiping(pid),
            Step::Term(Role::Engine),
        ),
        (
            stop(After::Exit),
            Wipes { running: true, of: [false, true], ..Wipes::default() },
            P::Stopping(pid, t0),
            P::Down,
            Step::Wait,
        ),
        (
            stop(After::Exit),
            Wipes { running: true, of: [false, true], ..Wipes::default() },
            P::Down,
            P::Down,
            Step::Wipe,
        ),
        // Wipes in flight: wait for both; done, what follows.
        (stop(After::Exit), wipes(true, false), P::Wiping(pid), P::Down, Step::Wait),
        (None, wipes(true, false), P::Down, P::Wiping(pid), Step::Wait),
        (stop(After::Exit), wipes(true, true), P::Down, P::Down, Step::WipesDone(AfterWipes::Exit(0))),
        (None, wipes(true, false), P::Down, P::Down, Step::WipesDone(AfterWipes::Gate { reprovision: false })),
        (
            None,
            wipes(true, true),
            P::Down,
            P::Down,
            Step::WipesDone(AfterWipes::Refuse { reprovision: false, code: exit::CONFIG }),
        ),
        (
            stop(After::Restart),
            wipes(true, false),
            P::Down,
            P::Down,
            Step::WipesDone(AfterWipes::Gate { reprovision: true }),
        ),
    ];
    for (stop, wipes, engine, node, want) in table {
        let cycle = Cycle { stop, drain: None, wipes };
        assert_eq!(cycle.next(engine, node, false, t0), want, "{cycle:?} engine {engine:?} node {node:?}");
    }
    // A clean stop's drain: the node waits while it has requests to the engine in flight and
    // the drain's time is not over; then it is stopped as any other.
    let later = t0 + Duration::from_secs(10);
    let draining = Cycle { stop: stop(After::Restart), drain: Some(later), wipes: none() };
    let (run, down) = (P::Running(pid), P::Down);
    // engine, node, requests in flight, now: the step.
    for (engine, node, busy, now, want) in [
        (run, run, true, t0, Step::Wait),
        (run, run, false, t0, Step::Term(Role::Node)),
        (run, run, true, later, Step::Term(Role::Node)),
        (run, P::Stopping(pid, t0), true, t0, Step::Wait),
        (run, down, true, t0, Step::Term(Role::Engine)),
    ] {
        assert_eq!(draining.next(engine, node, busy, now), want, "busy {busy} at +{:?}", now - t0);
    }
}

/// The cell's course, event by event: every change the supervisor makes to it.
#[test]
fn the_cells_course_table() {
    use crate::sandbox::cell::WipeFailed as Failed;
    let t0 = Instant::now();
    let t1 = t0 + Duration::from_secs(5);
    let stop = |code, after| Some(Stop { code, after });
    let wipes = |running, failed: Vec<(Role, Failed)>, deadline| Wipes { running, of: [running; 2], failed, deadline };
    let idle = || wipes(false, Vec::new(), None);
    let failure = (Role::Engine, Failed::Killed(9));
    // (stop, wipes) before, the event, (stop, wipes) after.
    let table = [
        // A stop; a second keeps the stricter outcome (Stop::merge); its end.
        (
            (None, idle()),
            CellEvent::StopAsked(Stop { code: 0, after: After::Restart }),
            (stop(0, After::Restart), idle()),
        ),
        (
            (stop(0, After::Restart), idle()),
            CellEvent::StopAsked(Stop { code: exit::FAILED, after: After::Exit }),
            (stop(exit::FAILED, After::Exit), idle()),
        ),
        (
            (stop(3, After::Exit), idle()),
            CellEvent::StopAsked(Stop { code: 1, after: After::Exit }),
            (stop(3, After::Exit), idle()),
        ),
        ((stop(0, After::Restart), idle()), CellEvent::StopOver, (None, idle())),
        // The wipes: begun (an earlier failure forgotten), a failure kept, over.
        ((None, wipes(false, vec![failure], None)), CellEvent::WipesBegun, (None, wipes(true, Vec::new(), None))),
        (
            (None, wipes(true, Vec::new(), None)),
            CellEvent::WipeFailed(failure.0, failure.1),
            (None, wipes(true, vec![failure], None)),
        ),
        (
            (stop(0, After::Exit), wipes(true, vec![failure], Some(t0))),
            CellEvent::WipesOver,
            (stop(0, After::Exit), idle()),
        ),
        // A role the stop came to stop after the wipes began: its wipe begins, the others' kept.
        (
            (
                stop(0, After::Restart),
                Wipes { running: true, of: [false, true], failed: vec![failure], deadline: None },
            ),
            CellEvent::WipesBegun,
            (stop(0, After::Restart), wipes(true, vec![failure], None)),
        ),
        // The grace period: only a stop to exit bounds wipes in flight, and only once.
        (
            (stop(0, After::Exit), wipes(true, Vec::new(), None)),
            CellEvent::Grace(t0),
            (stop(0, After::Exit), wipes(true, Vec::new(), Some(t0))),
        ),
        (
            (stop(0, After::Exit), wipes(true, Vec::new(), Some(t0))),
            CellEvent::Grace(t1),
            (stop(0, After::Exit), wipes(true, Vec::new(), Some(t0))),
        ),
        (
            (stop(0, After::Restart), wipes(true, Vec::new(), None)),
            CellEvent::Grace(t0),
            (stop(0, After::Restart), wipes(true, Vec::new(), None)),
        ),
        ((None, wipes(true, Vec::new(), None)), CellEvent::Grace(t0), (None, wipes(true, Vec::new(), None))),
        ((stop(0, After::Exit), idle()), CellEvent::Grace(t0), (stop(0, After::Exit), idle())),
        (
            (stop(0, After::Exit), wipes(true, Vec::new(), Some(t0))),
            CellEvent::GraceOver,
            (stop(0, After::Exit), wipes(true, Vec::new(), None)),
        ),
    ];
    for ((stop, wipes), event, (want_stop, want_wipes)) in table {
        let mut cycle = Cycle { stop, drain: None, wipes };
        let before = cycle.clone();
        assert!(cycle.apply(event), "{before:?} on {event:?}: not in the table");
        assert_eq!(cycle, Cycle { stop: want_stop, drain: None, wipes: want_wipes }, "{before:?} on {event:?}");
    }
    // The drain: set once, only for a clean stop; a failure's stop ends it; so does the stop's end.
    let clean = Cycle { stop: stop(0, After::Exit), drain: None, wipes: idle() };
    let mut c = clean.clone();
    assert!(c.apply(CellEvent::Drain(t1)) && c.drain == Some(t1));
    assert!(c.apply(CellEvent::Drain(t0)) && c.drain == Some(t1), "set once");
    assert!(c.apply(CellEvent::StopAsked(Stop { code: 0, after: After::Exit })) && c.drain == Some(t1));
    assert!(c.apply(CellEvent::StopAsked(Stop { code: exit::FAILED, after: After::Exit })) && c.drain.is_none());
    let mut c = Cycle { drain: Some(t1), ..clean.clone() };
    assert!(c.apply(CellEvent::StopOver) && c.drain.is_none() && c.stop.is_none());
    let mut failing = Cycle { stop: stop(exit::FAILED, After::Exit), drain: None, wipes: idle() };
    assert!(!failing.apply(CellEvent::Drain(t1)) && failing.drain.is_none(), "a failure does not drain");
    assert!(!Cycle::default().apply(CellEvent::Drain(t1)), "no stop, no drain");
    // Not in the table: the course stays as it was.
    for ((stop, wipes), event) in [
        ((None, wipes(true, Vec::new(), None)), CellEvent::WipesBegun),
        ((None, idle()), CellEvent::WipeFailed(failure.0, failure.1)),
        ((None, idle()), CellEvent::WipesOver),
        ((None, idle()), CellEvent::StopOver),
        ((stop(0, After::Exit), wipes(true, Vec::new(), None)), CellEvent::GraceOver),
    ] {
        let mut cycle = Cycle { stop, drain: None, wipes };
        let before = cycle.clone();
        assert!(!cycle.apply(event), "{before:?} on {event:?}: in the table");
        assert_eq!(cycle, before, "{event:?}");
    }
}

#[test]
fn the_node_is_busy_with_the_engine_until_a_moment_after_its_last_connection() {
    let t0 = Instant::now();
    let settle = DRAIN_SETTLE;
    // open connections, the last one's close, now: busy?
    for (open, closed, now, want) in [
        (1, None, t0, true),
        (2, Some(t0), t0 + settle * 5, true),
        (0, None, t0, false),
        (0, Some(t0), t0, true),
        (0, Some(t0), t0 + settle / 2, true),
        (0, Some(t0), t0 + settle, false),
    ] {
        assert_eq!(engine_busy(open, closed, now), want, "{open} open, closed {closed:?}");
    }
}

#[test]
fn a_drain_wakes_the_loop_at_its_end_and_when_the_node_has_settled() {
    let t0 = Instant::now();
    let end = t0 + Duration::from_secs(10);
    let stop = Some(Stop { code: 0, after: After::Exit });
    let draining = Cycle { stop, drain: Some(end), wipes: Wipes::default() };
    // The last connection's close, now: when the loop wakes.
    assert_eq!(draining.drain_deadline(None, t0), Some(end));
    assert_eq!(draining.drain_deadline(Some(t0), t0), Some(t0 + DRAIN_SETTLE));
    assert_eq!(draining.drain_deadline(Some(t0), t0 + DRAIN_SETTLE), Some(end), "a past settle no longer wakes it");
    assert_eq!(draining.drain_deadline(Some(t0), end), None, "nothing ahead");
    // No drain, or no stop: nothing.
    assert_eq!(Cycle { drain: None, ..draining.clone() }.drain_deadline(Some(t0), t0), None);
    assert_eq!(Cycle { stop: None, ..draining }.drain_deadline(Some(t0), t0), None);
}

#[test]
fn a_reload_and_a_recycle_are_refused_for_the_same_reasons() {
    let all = UnderWay { stop: true, wipes: true, gate: true, recycle: true };
    assert_eq!(UnderWay::default().busy(), None);
    assert_eq!(all.busy(), Some("a stop"));
    for (u, want) in [
        (UnderWay { wipes: true, ..Default::default() }, "a scratch wipe"),
        (UnderWay { gate: true, ..Default::default() }, "a pass through the gate"),
        (UnderWay { recycle: true, ..Default::default() }, "a recycle"),
    ] {
        assert_eq!(u.busy(), Some(want));
    }
}

fn limit(burst: u32, interval_s: u64) -> RestartLimit {
    RestartLimit { burst, interval_s }
}

fn exited(code: i32, stopping: bool, now: Instant) -> Exited {
    Exited { code, ran: Some(Duration::from_secs(1)), stopping, now }
}

#[test]
fn the_policy_decides_which_exits_restart() {
    let now = Instant::now();
    use Decision::{GiveUp, Restart as Again, StayDown, Stop};
    use Restart as Policy;
    // policy, exit status, a stop under way: the decision.
    let table = [
        (Policy::No, 0, false, Stop),
        (Policy::No, 1, false, Stop),
        (Policy::OnFailure, 0, false, Stop),
        (Policy::OnFailure, 1, false, Again(BACKOFF_MIN)),
        (Policy::OnFailure, 137, false, Again(BACKOFF_MIN)),
        (Policy::Always, 0, false, Again(BACKOFF_MIN)),
        (Policy::Always, 1, false, Again(BACKOFF_MIN)),
        (Policy::No, 1, true, StayDown),
        (Policy::OnFailure, 1, true, StayDown),
        (Policy::Always, 0, true, StayDown),
    ];
    for (policy, code, stopping, want) in table {
        let mut r = Restarts::default();
        let got = r.on_exit(exited(code, stopping, now), policy, limit(5, 60));
        assert_eq!(got, want, "{policy:?} exit {code} stopping {stopping}");
        assert_eq!(r.count, u32::from(matches!(want, Again(_))));
    }
    assert_eq!(Stop.stop_code(), Some(exit::FAILED));
    assert_eq!(GiveUp.stop_code(), Some(exit::RESTART_LIMIT));
    assert_eq!(StayDown.stop_code(), None);
    assert_eq!(Again(BACKOFF_MIN).stop_code(), None);
}

#[test]
fn backoff_doubles_to_its_cap_and_a_stable_run_resets_it() {
    let mut r = Restarts::default();
    let t0 = Instant::now();
    let mut delays = Vec::new();
    for i in 0..10u64 {
        // Far apart: the burst limit never applies.
        let now = t0 + Duration::from_secs(1000 * i);
        match r.on_exit(exited(1, false, now), Restart::Always, limit(3, 10)) {
            Decision::Restart(d) => delays.push(d.as_millis()),
            d => panic!("restart {i}: {d:?}"),
        }
    }
    assert_eq!(delays, [500, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000, 60000]);
    // A run of STABLE_AFTER resets it; a shorter one does not.
    let now = t0 + Duration::from_secs(20_000);
    let short = Exited { code: 1, ran: Some(STABLE_AFTER - Duration::from_secs(1)), stopping: false, now };
    assert_eq!(r.on_exit(short, Restart::Always, limit(3, 10)), Decision::Restart(BACKOFF_MAX));
    let later = now + Duration::from_secs(1000);
    let stable = Exited { code: 1, ran: Some(STABLE_AFTER), stopping: false, now: later };
    assert_eq!(r.on_exit(stable, Restart::Always, limit(3, 10)), Decision::Restart(BACKOFF_MIN));
    assert_eq!(r.count, 12);
}

#[test]
fn the_burst_within_the_interval_gives_up_and_older_restarts_are_forgotten() {
    let t0 = Instant::now();
    let mut r = Restarts::default();
    let at = |s: u64| exited(1, false, t0 + Duration::from_secs(s));
    // burst 3 within 10 s: three restarts, the fourth exit gives up.
    for s in [0, 1, 2] {
        assert!(matches!(r.on_exit(at(s), Restart::OnFailure, limit(3, 10)), Decision::Restart(_)), "{s}");
    }
    assert_eq!(r.on_exit(at(3), Restart::OnFailure, limit(3, 10)), Decision::GiveUp);
    assert_eq!(r.count, 3, "giving up is not a restart");
    // Once the first restart is older than the interval it no longer counts.
    assert!(matches!(r.on_exit(at(11), Restart::OnFailure, limit(3, 10)), Decision::Restart(_)));
    // A clean exit under on-failure stops, whatever the burst.
    let clean = exited(0, false, t0 + Duration::from_secs(12));
    assert_eq!(r.on_exit(clean, Restart::OnFailure, limit(3, 10)), Decision::Stop);
    // burst 0: the first failure gives up.
    let mut r = Restarts::default();
    assert_eq!(r.on_exit(at(0), Restart::Always, limit(0, 10)), Decision::GiveUp);
}

#[test]
fn a_second_stop_keeps_the_stricter_outcome() {
    use After::*;
    let s = |code, after| Stop { code, after };
    // The stop under way, the one asked for now: the stop that follows.
    let table = [
        (s(0, Restart), 0, Restart, s(0, Restart)),
        (s(0, Restart), 0, Exit, s(0, Exit)),
        (s(0, Exit), 0, Restart, s(0, Exit)),
        (s(0, Restart), exit::FAILED, Exit, s(exit::FAILED, Exit)),
        (s(exit::FAILED, Exit), 0, Exit, s(exit::FAILED, Exit)),
        (s(exit::PREFLIGHT_FAILED, Exit), exit::FAILED, Exit, s(exit::PREFLIGHT_FAILED, Exit)),
        (s(exit::NOT_READY, Exit), exit::CONFIG, Exit, s(exit::CONFIG, Exit)),
        (s(exit::RESTART_LIMIT, Exit), exit::PREFLIGHT_ERROR, Exit, s(exit::PREFLIGHT_ERROR, Exit)),
        // The node's own restart gives way to a restart of both (the engine exited meanwhile)
        // and to an exit.
        (s(0, RestartNode), 0, RestartNode, s(0, RestartNode)),
        (s(0, RestartNode), 0, Restart, s(0, Restart)),
        (s(0, Restart), 0, RestartNode, s(0, Restart)),
        (s(0, RestartNode), 0, Exit, s(0, Exit)),
    ];
    for (now, code, after, want) in table {
        assert_eq!(now.merge(code, after), want, "{now:?} then {code} {after:?}");
    }
}

/// Which roles a stop stops, wipes and starts again: both, but for the node's own restart.
#[test]
fn the_nodes_own_restart_leaves_the_engine_alone() {
    let cycle = |after| Cycle { stop: Some(Stop { code: 0, after }), drain: None, wipes: Wipes::default() };
    assert_eq!(cycle(After::RestartNode).stopped(), vec![Role::Node]);
    assert_eq!(cycle(After::Restart).stopped(), Role::ALL.to_vec());
    assert_eq!(cycle(After::Exit).stopped(), Role::ALL.to_vec());
    assert_eq!(Cycle::default().stopped(), Role::ALL.to_vec());
}

#[test]
fn a_waiting_role_enters_the_gate_only_when_it_may() {
    // engine?, engine ready?, gate busy?: may it enter now.
    for (engine, ready, busy, want) in [
        (true, false, false, true),
        (true, true, false, true),
        (true, false, true, false),
        (false, true, false, true),
        (false, false, false, false),
        (false, true, true, false),
    ] {
        assert_eq!(may_restart(engine, ready, busy), want, "engine {engine} ready {ready} busy {busy}");
    }
}

#[test]
fn a_pass_starts_the_engine_first_and_the_node_only_beside_a_ready_engine() {
    // the engine passed?, the engine ready?: what starts.
    for (engine_passed, ready, want) in [
        (true, false, Admission::Start(Role::Engine)),
        (true, true, Admission::Start(Role::Engine)),
        (false, true, Admission::Start(Role::Node)),
        (false, false, Admission::Retry),
    ] {
        assert_eq!(admission(engine_passed, ready), want, "engine passed {engine_passed} ready {ready}");
    }
}

#[test]
fn a_start_that_fails_before_anything_ran_is_a_config_error() {
    assert_eq!(start_failed(false), exit::CONFIG);
    assert_eq!(start_failed(true), exit::FAILED);
}

#[test]
fn each_phase_shows_its_name_and_process() {
    let p = Pid::from_raw(7);
    let now = Instant::now();
    let table = [
        (Phase::Down, "down", None),
        (Phase::Starting, "starting", None),
        (Phase::Admitted, "starting", None),
        (Phase::Running(p), "running", Some(p)),
        (Phase::Stopping(p, now), "stopping", Some(p)),
        (Phase::Waiting(now), "restarting", None),
        (Phase::Wiping(p), "wiping", Some(p)),
    ];
    for (phase, name, pid) in table {
        assert_eq!(phase.shown(), (RoleState::from(name.to_string()), pid));
        assert_eq!(phase.shown().0.as_str(), name);
    }
}

/// Whether the node's new connections to the engine go through: while the engine is ready and
/// no stop is under way, and through a clean stop's drain while the node still runs (a job the
/// node sends meanwhile reaches the engine that is still up, and the drain waits for it);
/// never past the drain, in a stop without one, or to an engine that is not ready.
#[test]
fn the_nodes_connections_reach_the_engine_through_a_drain() {
    use Phase as P;
    let (pid, t0) = (Pid::from_raw(9), Instant::now());
    let stop = Some(Stop { code: 0, after: After::Restart });
    let drain = Some(t0 + Duration::from_secs(10));
    // stop, drain, engine ready, node: forwards.
    for (stop, drain, ready, node, want) in [
        (None, None, true, P::Running(pid), true),
        (None, None, false, P::Running(pid), false),
        (stop, drain, true, P::Running(pid), true),
        (stop, drain, false, P::Running(pid), false),
        (stop, drain, true, P::Stopping(pid, t0), false),
        (stop, drain, true, P::Down, false),
        (stop, None, true, P::Running(pid), false),
    ] {
        let cycle = Cycle { stop, drain, wipes: Wipes::default() };
        assert_eq!(cycle.forwards(ready, node), want, "{cycle:?} ready={ready} node {node:?}");
    }
}
