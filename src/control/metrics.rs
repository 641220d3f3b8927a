//! `sealnode ctl metrics`: the supervisor's status (control socket, `status`) as Prometheus
//! text exposition (format 0.0.4), for a scrape through node_exporter's textfile collector or
//! any agent that runs a command. Rendered client-side from the status answer
//! (`control::protocol::Status`), so the control protocol has no second way to read the same
//! facts (docs/operator-guide.md, "Metrics").

use crate::control::protocol::{RoleState, RoleStatus, Status};

/// One metric family being written: HELP and TYPE once, then its samples.
struct Out {
    text: String,
}

/// A label value, escaped as the text format requires (backslash, double quote, newline).
fn escape(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

impl Out {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        self.text.push_str(&format!("# HELP {name} {help}\n# TYPE {name} {kind}\n"));
    }
    fn sample(&mut self, name: &str, labels: &[(&str, &str)], value: f64) {
        let labels: Vec<String> = labels.iter().map(|(k, v)| format!("{k}=\"{}\"", escape(v))).collect();
        let labels = if labels.is_empty() { String::new() } else { format!("{{{}}}", labels.join(",")) };
        self.text.push_str(&format!("{name}{labels} {value}\n"));
    }
    /// A family with one sample per role that has the value (`get` on the role's status).
    fn per_role(
        &mut self,
        status: &Status,
        name: &str,
        kind: &str,
        help: &str,
        get: impl Fn(&RoleStatus) -> Option<f64>,
    ) {
        let samples: Vec<(&str, f64)> = status.roles.iter().filter_map(|r| Some((r.role.name(), get(r)?))).collect();
        if samples.is_empty() {
            return;
        }
        self.family(name, kind, help);
        for (role, v) in samples {
            self.sample(name, &[("role", role)], v);
        }
    }
}

/// The exposition when the supervisor does not answer: `sealnode_up 0`.
/// Only `sealnode_up`: 0 when the supervisor did not answer, 1 when it answered in a shape
/// this `ctl` cannot read (an older or newer supervisor's).
pub fn up_only(answered: bool) -> String {
    let mut o = Out { text: String::new() };
    o.family("sealnode_up", "gauge", "1: the supervisor answered on its control socket.");
    o.sample("sealnode_up", &[], if answered { 1.0 } else { 0.0 });
    o.text
}

/// The exposition of one `status` answer.
pub fn render(status: &Status) -> String {
    let mut o = Out { text: String::new() };
    o.family("sealnode_up", "gauge", "1: the supervisor answered on its control socket.");
    o.sample("sealnode_up", &[], 1.0);
    o.family(
        "sealnode_ready",
        "gauge",
        "1 while the cell serves: both roles run (none stopped) and the engine answered its readiness check.",
    );
    o.sample("sealnode_ready", &[], if status.ready { 1.0 } else { 0.0 });
    o.family("sealnode_uptime_seconds", "gauge", "Seconds since sealnode run started.");
    o.sample("sealnode_uptime_seconds", &[], status.uptime_s as f64);
    if let Some(r) = &status.receipt {
        o.family("sealnode_generation", "gauge", "The generation of the last start's receipt.");
        o.sample("sealnode_generation", &[], r.generation as f64);
    }
    if let Some(ms) = status.engine_ready_ms {
        o.family(
            "sealnode_engine_ready_seconds",
            "gauge",
            "How long the engine's last start took to pass its readiness check.",
        );
        o.sample("sealnode_engine_ready_seconds", &[], ms / 1000.0);
    }
    if let Some(ago) = status.engine_answered_ago_s {
        o.family(
            "sealnode_engine_answered_age_seconds",
            "gauge",
            "Seconds since the engine last answered its readiness check (the age of the verdict sealnode_ready stands on).",
        );
        o.sample("sealnode_engine_answered_age_seconds", &[], ago);
    }
    if !status.roles.is_empty() {
        // One sample per state this client knows (a state it does not know: all of them 0).
        o.family("sealnode_role_state", "gauge", "1 for the state each role is in.");
        for r in &status.roles {
            for s in RoleState::KNOWN {
                o.sample(
                    "sealnode_role_state",
                    &[("role", r.role.name()), ("state", s.as_str())],
                    if r.state == *s { 1.0 } else { 0.0 },
                );
            }
        }
    }
    o.per_role(
        status,
        "sealnode_role_starts_total",
        "counter",
        "Starts of the role (first, restarts, reloads, recycles).",
        |r| Some(r.starts as f64),
    );
    o.per_role(status, "sealnode_role_restarts_total", "counter", "Restarts of the role after it exited.", |r| {
        Some(r.restarts.into())
    });
    o.per_role(status, "sealnode_role_uptime_seconds", "gauge", "Seconds since the role's current run started.", |r| {
        r.uptime_s.map(|s| s as f64)
    });
    o.per_role(
        status,
        "sealnode_role_generation",
        "gauge",
        "The generation the role's current run passed the gate with.",
        |r| r.generation.map(|g| g as f64),
    );
    o.per_role(
        status,
        "sealnode_preflight_duration_seconds",
        "gauge",
        "How long the role's last preflight canary took.",
        |r| r.preflight.as_ref().map(|p| p.ms as f64 / 1000.0),
    );
    o.per_role(
        status,
        "sealnode_preflight_attempts",
        "gauge",
        "Escape attempts the role's last preflight made (each refused).",
        |r| r.preflight.as_ref().map(|p| p.attempts as f64),
    );
    o.per_role(
        status,
        "sealnode_role_output_dropped_lines_total",
        "counter",
        "Lines of the role's output dropped over its rate limit.",
        |r| Some(r.output_dropped_lines as f64),
    );
    // The denial log's counts, where a role has it (log_refused_syscalls).
    if status.roles.iter().any(|r| r.refused_syscalls.is_some()) {
        o.family(
            "sealnode_role_refused_syscalls_total",
            "counter",
            "Syscalls the role's policy refused, by name (log_refused_syscalls).",
        );
        for r in &status.roles {
            for (name, n) in r.refused_syscalls.iter().flatten() {
                o.sample(
                    "sealnode_role_refused_syscalls_total",
                    &[("role", r.role.name()), ("syscall", name)],
                    *n as f64,
                );
            }
        }
    }
    // cgroup usage, where sealnode has the role's leaf.
    let res = |get: fn(&crate::sandbox::cgroup::Usage) -> Option<u64>| {
        move |r: &RoleStatus| r.resources.as_ref().and_then(get).map(|v| v as f64)
    };
    o.per_role(
        status,
        "sealnode_role_memory_bytes",
        "gauge",
        "memory.current of the role's cgroup.",
        res(|u| u.memory_current),
    );
    o.per_role(
        status,
        "sealnode_role_memory_peak_bytes",
        "gauge",
        "memory.peak of the role's cgroup.",
        res(|u| u.memory_peak),
    );
    o.per_role(status, "sealnode_role_pids", "gauge", "pids.current of the role's cgroup.", res(|u| u.pids_current));
    o.per_role(
        status,
        "sealnode_role_cpu_seconds_total",
        "counter",
        "CPU time of the role's cgroup (cpu.stat usage_usec).",
        |r| res(|u| u.cpu_usage_usec)(r).map(|u| u / 1e6),
    );
    o.per_role(
        status,
        "sealnode_role_cpu_throttled_seconds_total",
        "counter",
        "Time the role was throttled by its cpu_max.",
        |r| res(|u| u.cpu_throttled_usec)(r).map(|u| u / 1e6),
    );
    o.per_role(
        status,
        "sealnode_role_oom_kills_total",
        "counter",
        "OOM kills in the role's cgroup (memory.events oom_kill).",
        res(|u| u.memory_events.get("oom_kill").copied()),
    );
    o.per_role(
        status,
        "sealnode_role_memory_max_events_total",
        "counter",
        "Times the role hit its memory_max_mb (memory.events max).",
        res(|u| u.memory_events.get("max").copied()),
    );
    o.per_role(
        status,
        "sealnode_role_pids_max_events_total",
        "counter",
        "Forks refused at the role's pids_max (pids.events max).",
        res(|u| u.pids_events.get("max").copied()),
    );
    // Forwarding: each egress upstream, and the node's hop to the engine.
    let ups = status.egress.iter().map(|u| (u.upstream.as_str(), u));
    let ups: Vec<_> = ups.chain(status.engine_forwarding.iter().map(|e| ("engine", e))).collect();
    type Get = fn(&crate::egress::Stats) -> u64;
    let counters: [(&str, &str, Option<Get>, &str); 5] = [
        (
            "sealnode_egress_connections_total",
            "counter",
            Some(|s| s.accepted),
            "Connections the node opened to the upstream (through sealnode).",
        ),
        (
            "sealnode_egress_refused_total",
            "counter",
            Some(|s| s.refused_over_limit),
            "Connections refused over cell.egress_max_connections.",
        ),
        (
            "sealnode_egress_connect_failures_total",
            "counter",
            Some(|s| s.connect_failed),
            "Outbound connects that failed or timed out.",
        ),
        ("sealnode_egress_active_connections", "gauge", Some(|s| s.active as u64), "Connections open now."),
        ("sealnode_egress_bytes_total", "counter", None, "Bytes forwarded, by direction (up: node to upstream)."),
    ];
    if !ups.is_empty() {
        for (name, kind, get, help) in counters {
            o.family(name, kind, help);
            for (up, s) in &ups {
                match get {
                    Some(get) => o.sample(name, &[("upstream", up)], get(s) as f64),
                    None => {
                        o.sample(name, &[("upstream", up), ("direction", "up")], s.bytes_up as f64);
                        o.sample(name, &[("upstream", up), ("direction", "down")], s.bytes_down as f64);
                    }
                }
            }
        }
    }
    // The node's connections that waited for an engine not ready (cell.engine_hold_s).
    if let Some(e) = &status.engine_forwarding {
        let waited = [
            (
                "sealnode_engine_waited_connections_total",
                e.held,
                "The node's connections to the engine that waited for it to be ready (cell.engine_hold_s).",
            ),
            (
                "sealnode_engine_wait_expired_total",
                e.hold_expired,
                "Of those, the connections closed because the engine was not ready within cell.engine_hold_s.",
            ),
            (
                "sealnode_engine_replayed_requests_total",
                e.replayed,
                "The node's requests the engine dropped unanswered (it crashed, was killed), sent again to it once it was ready (cell.engine_replay_kb).",
            ),
        ];
        for (name, value, help) in waited {
            o.family(name, "counter", help);
            o.sample(name, &[], value as f64);
        }
    }
    o.text
}

#[cfg(test)]
mod tests {
    use crate::control::protocol::tests::sample;

    #[test]
    fn label_values_are_escaped() {
        let mut v = sample();
        v.egress[0].upstream = "gw\"x\\\ny:443".into();
        v.egress[0].accepted = 2;
        let t = super::render(&v);
        assert!(t.contains("sealnode_egress_connections_total{upstream=\"gw\\\"x\\\\\\ny:443\"} 2\n"), "{t}");
        assert!(t.contains("sealnode_ready 1\n") && t.contains("sealnode_up 1\n"));
    }

    /// The fixture (a real answer): each role's state, its own preflight, the forwarding.
    #[test]
    fn a_status_answer_renders_its_numbers() {
        let t = super::render(&sample());
        for line in [
            "sealnode_uptime_seconds 1\n",
            "sealnode_generation 1\n",
            "sealnode_role_state{role=\"engine\",state=\"running\"} 1\n",
            "sealnode_role_state{role=\"node\",state=\"down\"} 0\n",
            "sealnode_preflight_attempts{role=\"engine\"} 91\n",
            "sealnode_preflight_attempts{role=\"node\"} 88\n",
            "sealnode_preflight_duration_seconds{role=\"node\"} 0.684\n",
            "sealnode_egress_bytes_total{upstream=\"gw.test:36877\",direction=\"down\"} 20\n",
            "sealnode_egress_connections_total{upstream=\"engine\"} 0\n",
        ] {
            assert!(t.contains(line), "{line:?} is missing:\n{t}");
        }
        assert!(!t.contains("refused_syscalls") && !t.contains("sealnode_role_memory_bytes"), "{t}");
    }
}
