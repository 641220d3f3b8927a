//! `sealnode ctl status`: the supervisor's status answer as an operator reads it, a table,
//! then what is sealed (crate::proof::sealed_text).
//! Pure: a status answer in, text out (fuzzed: `fuzzing::control_reply`).

use crate::control::protocol::{ProcessState, RoleState, Status};
use crate::os::escape::cell;

/// A string of the answer, as shown: escaped like every line sealnode logs (crate::logging::log::clean),
/// and a tab too (a log line may keep one; a table cell may not: it would shift the columns),
/// so no value can move the cursor, clear the screen or forge a line or column of the table.
fn text(v: &str) -> String {
    cell(v)
}

/// A unix time as RFC 3339 (UTC), or `?`.
fn when(t: u64) -> String {
    i64::try_from(t)
        .ok()
        .and_then(|t| chrono::DateTime::from_timestamp(t, 0))
        .map(|d| d.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
        .unwrap_or_else(|| "?".into())
}

fn duration(secs: u64) -> String {
    match secs {
        s if s < 60 => format!("{s}s"),
        s if s < 3600 => format!("{}m{:02}s", s / 60, s % 60),
        s if s < 86400 => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
        s => format!("{}d{:02}h", s / 86400, (s % 86400) / 3600),
    }
}

fn bytes(b: f64) -> String {
    match b {
        b if b < 1024.0 => format!("{b} B"),
        b if b < 1024.0 * 1024.0 => format!("{:.1} KiB", b / 1024.0),
        b if b < 1024.0 * 1024.0 * 1024.0 => format!("{:.1} MiB", b / 1048576.0),
        b => format!("{:.2} GiB", b / 1073741824.0),
    }
}

/// Said under a process the supervisor waits on that something holds.
const TOO_MANY: &str = "        (more processes and threads under it than a status reads: one of them could be held, so the cell is not shown serving)\n";
const HELD: &str =
    "        (stopped or traced: it holds what waits on it until it is let go, SIGCONT or the debugger's detach; or stop sealnode)\n";

/// An optional number, or `-`.
fn opt(v: Option<impl ToString>) -> String {
    v.map(|v| v.to_string()).unwrap_or_else(|| "-".into())
}

/// The status as an operator reads it: one line for the cell, one per role, one per upstream.
pub fn render(v: &Status) -> String {
    let mut s = String::new();
    let ready = if v.ready { "ready" } else { "not ready (a role is starting, restarting or stopping)" };
    s.push_str(&format!("sealnode: {ready}, up {}, cell pid {}\n", duration(v.uptime_s), v.cell_pid));
    if let Some(r) = &v.receipt {
        let canary = if r.canary_passed { "preflight passed" } else { "PREFLIGHT NOT PASSED" };
        s.push_str(&format!(
            "receipt:  generation {}, {canary}, {} (started {})\n",
            r.generation,
            text(&r.path),
            when(r.started_at),
        ));
    }
    if let Some(g) = &v.gate {
        let roles: Vec<&str> = g.roles.iter().map(|r| r.name()).collect();
        let waits: Vec<String> = g
            .waiting_for
            .iter()
            .flatten()
            .map(|w| format!("{} (pid {}, {})", text(&w.what), w.pid, w.state.as_ref().map_or("gone", |s| s.as_str())))
            .collect();
        s.push_str(&format!(
            "gate:     {} of {} for {:.1} s, waiting for {}\n",
            text(g.purpose.as_str()),
            roles.join(" and "),
            g.ms as f64 / 1000.0,
            if waits.is_empty() { "nothing".to_string() } else { text(&waits.join(", ")) }
        ));
        if g.waiting_for.iter().flatten().any(|w| w.state.as_ref().is_some_and(ProcessState::held)) {
            s.push_str(HELD);
        }
    }
    if let Some(ms) = v.engine_ready_ms {
        s.push_str(&format!("engine:   ready {:.1} s after its start", ms / 1000.0));
        if let Some(ago) = v.engine_answered_ago_s {
            s.push_str(&format!("; last answered its readiness check {ago:.1} s ago"));
        }
        s.push('\n');
    }
    if let Some(held) = v.engine_rechecks_waiting_s {
        s.push_str(&format!(
            "engine:   rechecks wait while it serves the node: {held:.1} s so far, 60 s at most (the last verdict stands)\n"
        ));
    }
    if let Some(last) = &v.engine_not_answering {
        s.push_str(&format!("engine:   NOT ANSWERING its readiness check (last try: {}): not ready\n", text(last)));
    }
    s.push_str(&format!(
        "\n{:<7} {:<11} {:>8} {:>8} {:>6} {:>8} {:>6}  {:<22} {}\n",
        "ROLE", "STATE", "PID", "UPTIME", "STARTS", "RESTARTS", "GEN", "PREFLIGHT", "MEMORY / PIDS"
    ));
    for r in &v.roles {
        let pre = match &r.preflight {
            Some(p) => format!("{} refused, {:.2} s", p.attempts, p.ms as f64 / 1000.0),
            None => "-".into(),
        };
        let res = r.resources.as_ref();
        let max = res.and_then(|u| u.limits.get("memory.max"));
        let mem = match (res.and_then(|u| u.memory_current), max) {
            (Some(m), Some(max)) if max != "max" => {
                format!("{} of {}", bytes(m as f64), max.parse::<f64>().map(bytes).unwrap_or_else(|_| text(max)))
            }
            (Some(m), _) => bytes(m as f64),
            _ => "-".into(),
        };
        let pids = res.and_then(|u| u.pids_current).map(|p| format!(" / {p} pids")).unwrap_or_default();
        s.push_str(&format!(
            "{:<7} {:<11} {:>8} {:>8} {:>6} {:>8} {:>6}  {:<22} {mem}{pids}\n",
            r.role.name(),
            text(r.state.as_str()),
            opt(r.pid),
            opt(r.uptime_s.map(duration)),
            r.starts,
            r.restarts,
            opt(r.generation),
            pre,
        ));
        if let (Some(pid), Some(st)) = (r.pid, &r.pid_state) {
            if st.held() || *st == ProcessState::DiskWait {
                // A running role's state is its init's, or that of a held process under it.
                let whose = if r.state == RoleState::Running { ", or a process under it," } else { "" };
                s.push_str(&format!("        (pid {pid}{whose} is {})\n", text(st.as_str())));
            }
            if *st == ProcessState::TooMany {
                s.push_str(TOO_MANY);
            } else if st.held() {
                s.push_str(HELD);
            }
        }
        if r.output_dropped_lines > 0 {
            s.push_str(&format!("        ({} output lines dropped over the rate limit)\n", r.output_dropped_lines));
        }
    }
    let ups = v.egress.iter().map(|u| (u.upstream.as_str(), u));
    let ups: Vec<_> = ups.chain(v.engine_forwarding.iter().map(|e| ("node -> engine", e))).collect();
    if !ups.is_empty() {
        s.push_str(&format!(
            "\n{:<28} {:>7} {:>6} {:>11} {:>11} {:>8} {:>7}\n",
            "FORWARDING", "CONNS", "ACTIVE", "UP", "DOWN", "REFUSED", "FAILED"
        ));
        for (name, u) in ups {
            s.push_str(&format!(
                "{:<28} {:>7} {:>6} {:>11} {:>11} {:>8} {:>7}\n",
                text(name),
                u.accepted,
                u.active,
                bytes(u.bytes_up as f64),
                bytes(u.bytes_down as f64),
                u.refused_over_limit,
                u.connect_failed,
            ));
        }
        if let Some(e) = v.engine_forwarding.as_ref().filter(|e| e.held > 0) {
            s.push_str(&format!(
                "{:<28} {} waited for the engine to be ready, {} closed after cell.engine_hold_s\n",
                "", e.held, e.hold_expired
            ));
        }
        if let Some(e) = v.engine_forwarding.as_ref().filter(|e| e.replayed > 0) {
            s.push_str(&format!(
                "{:<28} {} dropped unanswered by the engine, sent again (cell.engine_replay_kb)\n",
                "", e.replayed
            ));
        }
    }
    if let Some(r) = &v.reload {
        // As its JSON (escaped: the error quotes the config).
        let json = serde_json::to_value(r).map(|j| j.to_string()).unwrap_or_default();
        s.push_str(&format!("\nlast reload: {}\n", text(&json)));
    }
    // Each role's layers, its preflight per layer, the statement (the same text as `check`'s,
    // whose renderer takes the JSON both share).
    s.push('\n');
    s.push_str(&crate::proof::sealed_text::render(&serde_json::to_value(v).unwrap_or_default()));
    s
}

#[cfg(test)]
mod tests {
    use crate::control::protocol::{tests::sample, RoleState};

    /// A tab in a value (a role's state here) is escaped in the table: the log escaping keeps
    /// tabs, and a raw one would shift the table's columns.
    #[test]
    fn a_tab_in_a_value_is_escaped_in_the_table() {
        let mut v = sample();
        v.roles[0].state = RoleState::Other("running\t1".into());
        v.egress[0].upstream = "a\tb".into();
        let t = super::render(&v);
        assert!(!t.contains('\t'), "{t}");
        assert!(t.contains("running\\u{9}1") && t.contains("a\\u{9}b"), "{t}");
    }

    /// The fixture (a real answer) as an operator reads it.
    #[test]
    fn a_status_answer_renders_as_a_table() {
        let mut v = sample();
        v.reload = Some(crate::control::protocol::ReloadOutcome::refused(1_700_000_000, "cell.x: changed"));
        let t = super::render(&v);
        let head: Vec<&str> = t.lines().take(9).collect();
        assert_eq!(
            head,
            [
                "sealnode: ready, up 1s, cell pid 6090",
                "receipt:  generation 1, preflight passed, /var/lib/sealnode/receipt.json (started 2026-12-02T11:31:35Z)",
                "engine:   ready 0.1 s after its start; last answered its readiness check 0.9 s ago",
                "",
                "ROLE    STATE            PID   UPTIME STARTS RESTARTS    GEN  PREFLIGHT              MEMORY / PIDS",
                "engine  running         6471       0s      1        0      1  91 refused, 0.68 s     -",
                "node    running         6477       0s      1        0      1  88 refused, 0.68 s     -",
                "",
                "FORWARDING                     CONNS ACTIVE          UP        DOWN  REFUSED  FAILED",
            ],
            "{t}"
        );
        assert!(t.contains("\nlast reload: {\"at\":1700000000,\"error\":\"cell.x: changed\",\"ok\":false}\n"), "{t}");
        assert!(t.contains("\nWHAT IS SEALED\nengine: rootful, uid 61001 gid 61001\n"), "{t}");
        assert!(t.ends_with("statement   none, not signed: no attestation key\n"), "{t}");
    }

    /// The verdict's age and a recheck's wait, as an operator reads them under the engine's
    /// readiness.
    #[test]
    fn the_readiness_verdicts_age_and_a_held_recheck_are_shown() {
        let mut v = sample();
        v.engine_answered_ago_s = Some(42.25);
        v.engine_rechecks_waiting_s = Some(38.0);
        let t = super::render(&v);
        let lines: Vec<&str> = t.lines().skip(2).take(2).collect();
        assert_eq!(
            lines,
            [
                "engine:   ready 0.1 s after its start; last answered its readiness check 42.2 s ago",
                "engine:   rechecks wait while it serves the node: 38.0 s so far, 60 s at most (the last verdict stands)",
            ],
            "{t}"
        );
    }
}
