//! `sealnode ctl metrics`: the supervisor's status (control socket, `status`) as Prometheus
//! text exposition (format 0.0.4), for a scrape through node_exporter's textfile collector or
//! any agent that runs a command. Rendered client-side from the status JSON, so the control
//! protocol has no second way to read the same facts (docs/operator-guide.md, "Metrics").

use serde_json::Value;

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
    fn per_role(&mut self, status: &Value, name: &str, kind: &str, help: &str, get: impl Fn(&Value) -> Option<f64>) {
        let roles = status["roles"].as_array().cloned().unwrap_or_default();
        let samples: Vec<(String, f64)> =
            roles.iter().filter_map(|r| Some((r["role"].as_str()?.to_string(), get(r)?))).collect();
        if samples.is_empty() {
            return;
        }
        self.family(name, kind, help);
        for (role, v) in samples {
            self.sample(name, &[("role", &role)], v);
        }
    }
}

fn num(v: &Value) -> Option<f64> {
    v.as_f64()
}

/// The states a role reports (`ctl status`), each a sample of `sealnode_role_state`.
const STATES: [&str; 6] = ["running", "starting", "stopping", "restarting", "wiping", "down"];

/// The exposition when the supervisor does not answer: `sealnode_up 0`.
pub fn down() -> String {
    let mut o = Out { text: String::new() };
    o.family("sealnode_up", "gauge", "1: the supervisor answered on its control socket.");
    o.sample("sealnode_up", &[], 0.0);
    o.text
}

/// The exposition of one `status` answer.
pub fn render(status: &Value) -> String {
    let mut o = Out { text: String::new() };
    o.family("sealnode_up", "gauge", "1: the supervisor answered on its control socket.");
    o.sample("sealnode_up", &[], 1.0);
    o.family("sealnode_ready", "gauge", "1 once the engine was ready and the node started (READY=1).");
    o.sample("sealnode_ready", &[], if status["ready"] == true { 1.0 } else { 0.0 });
    if let Some(v) = num(&status["uptime_s"]) {
        o.family("sealnode_uptime_seconds", "gauge", "Seconds since sealnode run started.");
        o.sample("sealnode_uptime_seconds", &[], v);
    }
    if let Some(v) = num(&status["receipt"]["generation"]) {
        o.family("sealnode_generation", "gauge", "The generation of the last start's receipt.");
        o.sample("sealnode_generation", &[], v);
    }
    if let Some(ms) = num(&status["engine_ready_ms"]) {
        o.family(
            "sealnode_engine_ready_seconds",
            "gauge",
            "How long the engine's last start took to pass its readiness check.",
        );
        o.sample("sealnode_engine_ready_seconds", &[], ms / 1000.0);
    }
    let roles = status["roles"].as_array().cloned().unwrap_or_default();
    if !roles.is_empty() {
        o.family("sealnode_role_state", "gauge", "1 for the state each role is in.");
        for r in &roles {
            let role = r["role"].as_str().unwrap_or("?");
            for s in STATES {
                o.sample(
                    "sealnode_role_state",
                    &[("role", role), ("state", s)],
                    if r["state"] == s { 1.0 } else { 0.0 },
                );
            }
        }
    }
    o.per_role(
        status,
        "sealnode_role_starts_total",
        "counter",
        "Starts of the role (first, restarts, reloads, recycles).",
        |r| num(&r["starts"]),
    );
    o.per_role(status, "sealnode_role_restarts_total", "counter", "Restarts of the role after it exited.", |r| {
        num(&r["restarts"])
    });
    o.per_role(status, "sealnode_role_uptime_seconds", "gauge", "Seconds since the role's current run started.", |r| {
        num(&r["uptime_s"])
    });
    o.per_role(
        status,
        "sealnode_role_generation",
        "gauge",
        "The generation the role's current run passed the gate with.",
        |r| num(&r["generation"]),
    );
    o.per_role(
        status,
        "sealnode_preflight_duration_seconds",
        "gauge",
        "How long the role's last preflight canary took.",
        |r| num(&r["preflight"]["ms"]).map(|ms| ms / 1000.0),
    );
    o.per_role(
        status,
        "sealnode_preflight_attempts",
        "gauge",
        "Escape attempts the role's last preflight made (each refused).",
        |r| num(&r["preflight"]["attempts"]),
    );
    o.per_role(
        status,
        "sealnode_role_output_dropped_lines_total",
        "counter",
        "Lines of the role's output dropped over its rate limit.",
        |r| num(&r["output_dropped_lines"]),
    );
    // The denial log's counts, where a role has it (log_refused_syscalls).
    let refused: Vec<(String, String, f64)> = roles
        .iter()
        .flat_map(|r| {
            let role = r["role"].as_str().unwrap_or("?").to_string();
            r["refused_syscalls"]
                .as_object()
                .into_iter()
                .flatten()
                .filter_map(move |(k, v)| Some((role.clone(), k.clone(), v.as_f64()?)))
                .collect::<Vec<_>>()
        })
        .collect();
    if roles.iter().any(|r| r["refused_syscalls"].is_object()) {
        o.family(
            "sealnode_role_refused_syscalls_total",
            "counter",
            "Syscalls the role's policy refused, by name (log_refused_syscalls).",
        );
        for (role, name, v) in refused {
            o.sample("sealnode_role_refused_syscalls_total", &[("role", &role), ("syscall", &name)], v);
        }
    }
    // cgroup usage, where sealnode has the role's leaf.
    let res = |k: &'static str| move |r: &Value| num(&r["resources"][k]);
    o.per_role(
        status,
        "sealnode_role_memory_bytes",
        "gauge",
        "memory.current of the role's cgroup.",
        res("memory_current"),
    );
    o.per_role(
        status,
        "sealnode_role_memory_peak_bytes",
        "gauge",
        "memory.peak of the role's cgroup.",
        res("memory_peak"),
    );
    o.per_role(status, "sealnode_role_pids", "gauge", "pids.current of the role's cgroup.", res("pids_current"));
    o.per_role(
        status,
        "sealnode_role_cpu_seconds_total",
        "counter",
        "CPU time of the role's cgroup (cpu.stat usage_usec).",
        |r| num(&r["resources"]["cpu_usage_usec"]).map(|u| u / 1e6),
    );
    o.per_role(
        status,
        "sealnode_role_cpu_throttled_seconds_total",
        "counter",
        "Time the role was throttled by its cpu_max.",
        |r| num(&r["resources"]["cpu_throttled_usec"]).map(|u| u / 1e6),
    );
    o.per_role(
        status,
        "sealnode_role_oom_kills_total",
        "counter",
        "OOM kills in the role's cgroup (memory.events oom_kill).",
        |r| num(&r["resources"]["memory_events"]["oom_kill"]),
    );
    o.per_role(
        status,
        "sealnode_role_memory_max_events_total",
        "counter",
        "Times the role hit its memory_max_mb (memory.events max).",
        |r| num(&r["resources"]["memory_events"]["max"]),
    );
    o.per_role(
        status,
        "sealnode_role_pids_max_events_total",
        "counter",
        "Forks refused at the role's pids_max (pids.events max).",
        |r| num(&r["resources"]["pids_events"]["max"]),
    );
    // Forwarding: each egress upstream, and the node's hop to the engine.
    let mut ups: Vec<(String, Value)> = status["egress"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(|u| (u["upstream"].as_str().unwrap_or("?").to_string(), u))
        .collect();
    if status["engine_forwarding"].is_object() {
        ups.push(("engine".to_string(), status["engine_forwarding"].clone()));
    }
    let counters: [(&str, &str, &str, &str); 5] = [
        (
            "sealnode_egress_connections_total",
            "counter",
            "accepted",
            "Connections the node opened to the upstream (through sealnode).",
        ),
        (
            "sealnode_egress_refused_total",
            "counter",
            "refused_over_limit",
            "Connections refused over cell.egress_max_connections.",
        ),
        (
            "sealnode_egress_connect_failures_total",
            "counter",
            "connect_failed",
            "Outbound connects that failed or timed out.",
        ),
        ("sealnode_egress_active_connections", "gauge", "active", "Connections open now."),
        ("sealnode_egress_bytes_total", "counter", "", "Bytes forwarded, by direction (up: node to upstream)."),
    ];
    if !ups.is_empty() {
        for (name, kind, key, help) in counters {
            o.family(name, kind, help);
            for (up, s) in &ups {
                if key.is_empty() {
                    o.sample(name, &[("upstream", up), ("direction", "up")], num(&s["bytes_up"]).unwrap_or(0.0));
                    o.sample(name, &[("upstream", up), ("direction", "down")], num(&s["bytes_down"]).unwrap_or(0.0));
                } else {
                    o.sample(name, &[("upstream", up)], num(&s[key]).unwrap_or(0.0));
                }
            }
        }
    }
    o.text
}

#[cfg(test)]
mod tests {
    #[test]
    fn label_values_are_escaped() {
        let v = serde_json::json!({
            "ready": true, "uptime_s": 3, "roles": [],
            "egress": [{ "upstream": "gw\"x\\\ny:443", "accepted": 2, "refused_over_limit": 0,
                         "connect_failed": 0, "active": 1, "bytes_up": 10, "bytes_down": 20 }],
        });
        let t = super::render(&v);
        assert!(t.contains("sealnode_egress_connections_total{upstream=\"gw\\\"x\\\\\\ny:443\"} 2\n"), "{t}");
        assert!(t.contains("sealnode_ready 1\n") && t.contains("sealnode_up 1\n"));
    }
}
