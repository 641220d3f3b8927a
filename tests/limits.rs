//! Per-role cgroup limits where they cannot be enforced: the development and CI machines have
//! no cgroup sealnode may manage (a v1/v2 hybrid, or a unified hierarchy outside a unit with
//! Delegate=yes). A configured limit must refuse the start there, naming the field, the reason
//! and the fix, with nothing started; with no limit everything runs as before (the rest of the
//! suite). The limits themselves are enforced and tested in the guest (tests/vm/limits.sh).

mod common;

use common::*;

/// (where the limit is written, its config line) -> the field the refusal must name.
const CASES: [(&str, &str, &str); 4] = [
    ("engine", "limits = { memory_max_mb = 256 }", "engine.limits.memory_max_mb"),
    ("node", "limits = { pids_max = 64 }", "node.limits.pids_max"),
    ("cell", "limits = { cpu_max = 0.5 }", "cell.limits.cpu_max"),
    ("cell", "cgroup = \"sealnode-test\"", "cell.cgroup"),
];

/// A fixture (roles that sleep) with `line` added to the `[engine]`, `[node]` or `[cell]` table.
fn with_line(mode: Mode, name: &str, at: &str, line: &str) -> Fixture {
    let mut f = Fixture::new(mode, name);
    f.engine_cmd = "[\"/usr/bin/busybox\", \"sleep\", \"1000\"]".into();
    f.node_cmd = f.engine_cmd.clone();
    match at {
        "engine" => f.engine_extra = line.into(),
        "node" => f.node_extra = line.into(),
        _ => f.cell_extra = line.into(),
    }
    f.write_config();
    f
}

#[test]
fn a_limit_the_host_cannot_enforce_refuses_the_start() {
    let hybrid = !std::path::Path::new("/sys/fs/cgroup/cgroup.controllers").exists();
    for mode in modes() {
        for (at, line, field) in CASES {
            // cell.cgroup as root on a unified host is usable: only the refusals are tested here,
            // and that one only where the host refuses it (a skip, recorded).
            if field == "cell.cgroup" && !hybrid {
                unavailable("cgroup-v1", "a unified cgroup host: cell.cgroup as root is usable here, not refused");
                continue;
            }
            let f = with_line(mode, "limits", at, line);
            let cfg = f.config.display().to_string();
            let o = f.command(&["run", "--config", &cfg]).output_within(COMMAND_LIMIT);
            let err = String::from_utf8_lossy(&o.stderr);
            assert_eq!(o.status.code(), Some(125), "{mode:?} {field}: {err}");
            assert!(
                err.contains(&cfg) && err.contains(field) && err.contains("cannot be enforced here"),
                "{mode:?}: {err}"
            );
            if hybrid {
                assert!(
                    err.contains("v1/v2 hybrid") && err.contains("cgroup v2 only"),
                    "{mode:?}: the reason and fix: {err}"
                );
            } else {
                assert!(
                    err.contains("not delegated") && err.contains("Delegate=yes"),
                    "{mode:?}: the reason and fix: {err}"
                );
            }
            // Refused before anything was made: no cell, no role, no receipt.
            assert!(!err.contains("cell created") && !err.contains("role started"), "{mode:?}: {err}");
            assert!(!f.p("state/receipt.json").exists(), "{mode:?}: a receipt was written");
            // doctor --config gives the same refusal.
            let o = f.command(&["doctor", "--config", &cfg]).output_within(COMMAND_LIMIT);
            let out = String::from_utf8_lossy(&o.stdout).into_owned() + &String::from_utf8_lossy(&o.stderr);
            // README's exit table: 125, a config that cannot run here.
            assert_eq!(o.status.code(), Some(125), "{mode:?}: doctor: {out}");
            assert!(out.contains(field), "{mode:?}: doctor: {out}");
        }
    }
}

/// A reload applies limits live (issue #29 item 6), but only where they can be enforced: a
/// limit a reload adds on a host with no cgroup for the cell is refused by its field, and the
/// roles run on untouched (the guest writes them live: tests/vm/limits.sh).
#[test]
fn a_reload_that_adds_a_limit_the_host_cannot_enforce_is_refused_by_name() {
    use nix::sys::signal::{kill, Signal};
    for mode in modes() {
        for (at, line, field) in &CASES[..3] {
            let mut f = Fixture::new(mode, "reload-limit");
            f.engine_cmd =
                "[\"/usr/bin/busybox\", \"httpd\", \"-f\", \"-p\", \"127.0.0.1:18080\", \"-h\", \"/models\"]".into();
            f.node_cmd = "[\"/usr/bin/busybox\", \"sh\", \"-c\", \"echo node-up; exec sleep 1000\"]".into();
            f.cell_extra = "stop_timeout_s = 2".into();
            f.write_config();
            let run = start_logged(&f, &[]);
            run.out_line(60, |l| l == "node-up");
            let text = std::fs::read_to_string(&f.config).expect("cfg");
            let table = format!("[{at}]\n");
            assert!(text.contains(&table), "{text}");
            std::fs::write(&f.config, text.replacen(&table, &format!("{table}{line}\n"), 1)).expect("edit");
            kill(run.pid(), Signal::SIGHUP).expect("hup");
            run.err_line(60, |l| l.contains("reload refused") && l.contains(field) && l.contains("cannot be enforced"));
            let (code, _, err) = run.stop();
            assert_eq!(code, Some(0), "{mode:?} {field}: {err}");
            assert_eq!(err.matches("role started role=engine").count(), 1, "{mode:?} {field}: {err}");
            assert_eq!(err.matches("role started role=node").count(), 1, "{mode:?} {field}: {err}");
        }
    }
}

#[test]
fn bad_limits_are_config_errors_naming_the_field() {
    for (at, line, field, why) in [
        ("engine", "limits = { memory_max_mb = 4 }", "engine.limits.memory_max_mb", "between 16"),
        ("node", "limits = { memory_max_mb = 64, memory_high_mb = 128 }", "node.limits.memory_high_mb", "not above"),
        (
            "node",
            "limits = { memory_high_mb = 17592186044416 }",
            "node.limits.memory_high_mb",
            "between 16 and 16777216",
        ),
        ("cell", "limits = { pids_max = 2 }", "cell.limits.pids_max", "between 8"),
        ("engine", "limits = { cpu_max = 0 }", "engine.limits.cpu_max", "number of CPUs"),
        ("node", "limits = { cpu_weight = 0 }", "node.limits.cpu_weight", "between 1 and 10000"),
        ("engine", "limits = { io_max = [{ device = \"/dev/sda\" }] }", "engine.limits.io_max[0]", "at least one"),
        ("engine", "limits = { memory_maxx_mb = 64 }", "memory_maxx_mb", "unknown field"),
        ("cell", "cgroup = \"../escape\"", "cell.cgroup", "relative to /sys/fs/cgroup"),
        ("node", "scratch_max_mb = 0", "node.scratch_max_mb", "between 1 and 1048576"),
    ] {
        let f = with_line(Mode::Rootless, "badlimits", at, line);
        let cfg = f.config.display().to_string();
        let o = f.command(&["doctor", "--config", &cfg]).output_within(COMMAND_LIMIT);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(125), "{line}: a config error: {err}");
        assert!(err.contains(field) && err.contains(why), "{line}: {err}");
    }
}
