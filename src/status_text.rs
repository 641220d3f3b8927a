//! `sealnode ctl status`: the supervisor's status answer as an operator reads it, a table,
//! then what is sealed (crate::sealed_text).
//! Pure: a JSON value in, text out (fuzzed: `fuzzing::control_reply`).

use serde_json::Value;

/// A string of the answer, as shown: escaped like every line sealnode logs (crate::log::clean),
/// and a tab too (a log line may keep one; a table cell may not: it would shift the columns),
/// so no value can move the cursor, clear the screen or forge a line or column of the table.
fn text(v: Option<&str>) -> String {
    cell(v.unwrap_or("?"))
}

/// Any value of the answer, as shown: its JSON, escaped.
fn shown(v: &Value) -> String {
    cell(&v.to_string())
}

use crate::escape::cell;

/// A unix time as RFC 3339 (UTC), or `?`.
fn when(v: Option<&Value>) -> String {
    v.and_then(Value::as_i64)
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

/// The status as an operator reads it: one line for the cell, one per role, one per upstream.
pub fn render(v: &Value) -> String {
    let mut s = String::new();
    let up = v["uptime_s"].as_u64().map(duration).unwrap_or_default();
    let ready = if v["ready"] == true { "ready" } else { "starting (the engine is not ready yet)" };
    s.push_str(&format!("sealnode: {ready}, up {up}, cell pid {}\n", shown(&v["cell_pid"])));
    if let Some(r) = v["receipt"].as_object() {
        let canary = if r.get("canary_passed") == Some(&Value::Bool(true)) {
            "preflight passed"
        } else {
            "PREFLIGHT NOT PASSED"
        };
        s.push_str(&format!(
            "receipt:  generation {}, {canary}, {} (started {})\n",
            shown(r.get("generation").unwrap_or(&Value::Null)),
            text(r.get("path").and_then(Value::as_str)),
            when(r.get("started_at")),
        ));
    }
    if let Some(ms) = v["engine_ready_ms"].as_f64() {
        s.push_str(&format!("engine:   ready {:.1} s after its start\n", ms / 1000.0));
    }
    s.push_str(&format!(
        "\n{:<7} {:<11} {:>8} {:>8} {:>6} {:>8} {:>6}  {:<22} {}\n",
        "ROLE", "STATE", "PID", "UPTIME", "STARTS", "RESTARTS", "GEN", "PREFLIGHT", "MEMORY / PIDS"
    ));
    for r in v["roles"].as_array().cloned().unwrap_or_default() {
        let opt = |x: &Value| if x.is_null() { "-".to_string() } else { shown(x) };
        let pre = match r["preflight"].as_object() {
            Some(p) => format!(
                "{} refused, {:.2} s",
                shown(p.get("attempts").unwrap_or(&Value::Null)),
                p.get("ms").and_then(Value::as_f64).unwrap_or(0.0) / 1000.0
            ),
            None => "-".into(),
        };
        let res = &r["resources"];
        let mem = match (res["memory_current"].as_f64(), res["limits"]["memory.max"].as_str()) {
            (Some(m), Some(max)) if max != "max" => {
                format!("{} of {}", bytes(m), max.parse::<f64>().map(bytes).unwrap_or_else(|_| text(Some(max))))
            }
            (Some(m), _) => bytes(m),
            _ => "-".into(),
        };
        let pids = res["pids_current"].as_u64().map(|p| format!(" / {p} pids")).unwrap_or_default();
        s.push_str(&format!(
            "{:<7} {:<11} {:>8} {:>8} {:>6} {:>8} {:>6}  {:<22} {mem}{pids}\n",
            text(r["role"].as_str()),
            text(r["state"].as_str()),
            opt(&r["pid"]),
            r["uptime_s"].as_u64().map(duration).unwrap_or_else(|| "-".into()),
            opt(&r["starts"]),
            opt(&r["restarts"]),
            opt(&r["generation"]),
            pre,
        ));
        if let Some(n) = r["output_dropped_lines"].as_u64().filter(|n| *n > 0) {
            s.push_str(&format!("        ({n} output lines dropped over the rate limit)\n"));
        }
    }
    let mut ups: Vec<Value> = v["egress"].as_array().cloned().unwrap_or_default();
    if let Some(e) = v["engine_forwarding"].as_object() {
        let mut e = Value::Object(e.clone());
        e["upstream"] = Value::from("node -> engine");
        ups.push(e);
    }
    if !ups.is_empty() {
        s.push_str(&format!(
            "\n{:<28} {:>7} {:>6} {:>11} {:>11} {:>8} {:>7}\n",
            "FORWARDING", "CONNS", "ACTIVE", "UP", "DOWN", "REFUSED", "FAILED"
        ));
        for u in ups {
            let n = |k: &str| u[k].as_u64().unwrap_or(0);
            s.push_str(&format!(
                "{:<28} {:>7} {:>6} {:>11} {:>11} {:>8} {:>7}\n",
                text(u["upstream"].as_str()),
                n("accepted"),
                n("active"),
                bytes(n("bytes_up") as f64),
                bytes(n("bytes_down") as f64),
                n("refused_over_limit"),
                n("connect_failed"),
            ));
        }
    }
    if let Some(r) = v["reload"].as_object() {
        s.push_str(&format!("\nlast reload: {}\n", shown(&Value::Object(r.clone()))));
    }
    // Each role's layers, its preflight per layer, the statement (the same text as `check`'s).
    s.push('\n');
    s.push_str(&crate::sealed_text::render(v));
    s
}

#[cfg(test)]
mod tests {
    /// A tab in a value (a role's name here) is escaped in the table: the log escaping keeps
    /// tabs, and a raw one would shift the table's columns.
    #[test]
    fn a_tab_in_a_value_is_escaped_in_the_table() {
        let v = serde_json::json!({"ok": true, "roles": [{"role": "no\tde", "state": "running\t1"}],
            "egress": [{"upstream": "a\tb"}]});
        let t = super::render(&v);
        assert!(!t.contains('\t'), "{t}");
        assert!(t.contains("no\\u{9}de") && t.contains("a\\u{9}b"), "{t}");
    }
}
