//! `sealnode ctl` against answers a running supervisor could give but a real cell rarely does
//! on cue (a refusal while busy, a recycle that did not happen): a stand-in socket in a
//! temporary directory answers each connection with one given line. The exit status and the
//! metrics textfile must say what the answer said (docs/control.md).

mod common;

use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::*;

/// A control socket that answers every request with `answer` (one JSON line), and the request
/// lines it read.
fn stand_in(dir: &Path, answer: &'static str) -> (PathBuf, std::sync::mpsc::Receiver<String>) {
    let path = dir.join("control.sock");
    let listener = UnixListener::bind(&path).expect("bind the stand-in socket");
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { return };
            let mut line = String::new();
            let _ = BufReader::new(&conn).read_line(&mut line);
            let _ = tx.send(line.trim().to_string());
            let _ = conn.write_all(format!("{answer}\n").as_bytes());
        }
    });
    (path, rx)
}

fn ctl(sock: &Path, args: &[&str]) -> (Option<i32>, String, String) {
    let o = Command::new(env!("CARGO_BIN_EXE_sealnode"))
        .arg("ctl")
        .arg("--socket")
        .arg(sock)
        .args(args)
        .output_within(Duration::from_secs(30));
    (o.status.code(), String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

/// A busy supervisor refuses the status request: a metrics scrape exits 1 saying so, and the
/// textfile is replaced by `sealnode_up 1` alone (the last scrape's numbers must not stay, as
/// if they were current).
#[test]
fn a_refused_scrape_replaces_the_textfile_with_up_alone() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (sock, asked) = stand_in(dir.path(), r#"{"ok":false,"error":"busy: a recycle is under way"}"#);
    let prom = dir.path().join("sealnode.prom");
    std::fs::write(&prom, "sealnode_up 1\nsealnode_role_running{role=\"node\"} 1\n").expect("a last scrape");
    let (code, out, err) = ctl(&sock, &["metrics", "--textfile", &prom.display().to_string()]);
    assert_eq!(code, Some(1), "{out}{err}");
    assert!(err.contains("ctl status: busy: a recycle is under way"), "{err}");
    let text = std::fs::read_to_string(&prom).expect("the textfile");
    let samples: Vec<&str> = text.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
    assert_eq!(samples, ["sealnode_up 1"], "the textfile after a refused scrape:\n{text}");
    assert_eq!(asked.recv_timeout(Duration::from_secs(5)).expect("a request"), r#"{"cmd":"status"}"#);
    // Printed instead of written: the same.
    let (code, out, _) = ctl(&sock, &["metrics"]);
    assert_eq!(code, Some(1));
    let samples: Vec<&str> = out.lines().filter(|l| !l.starts_with('#') && !l.is_empty()).collect();
    assert_eq!(samples, ["sealnode_up 1"], "{out}");
}

/// `recycle --json` prints the answer as it came, and exits 0 only when it says the recycle
/// happened: an answer with `"recycled": false` (or a refusal) exits 1, as without --json.
#[test]
fn recycle_json_exits_zero_only_for_a_recycle() {
    let cases: [(&'static str, i32); 4] = [
        (r#"{"ok":true,"recycled":true,"generation":7}"#, 0),
        (r#"{"ok":true,"recycled":false,"generation":7}"#, 1),
        (r#"{"ok":true}"#, 1),
        (r#"{"ok":false,"error":"busy"}"#, 1),
    ];
    for (answer, want) in cases {
        let dir = tempfile::tempdir().expect("tempdir");
        let (sock, _) = stand_in(dir.path(), answer);
        let (code, out, err) = ctl(&sock, &["recycle", "--json"]);
        assert_eq!(code, Some(want), "recycle --json for {answer}: {out}{err}");
        let printed: serde_json::Value = serde_json::from_str(&out).expect("--json prints JSON");
        let came: serde_json::Value = serde_json::from_str(answer).expect("answer");
        assert_eq!(printed, came, "--json prints the answer as it came");
        // Without --json: the same exit status.
        let (code, out, err) = ctl(&sock, &["recycle"]);
        assert_eq!(code, Some(want), "recycle for {answer}: {out}{err}");
    }
}

/// With `--config`, only a recycle reads the whole config (its bounds size the wait for the
/// answer); status, ready and metrics read `cell.runtime_dir` alone. A config a half-done edit
/// left unparseable still reaches the cell, and the recycle says that it waits the plain 60 s
/// (found by a docs audit: README said only `runtime_dir` is read).
#[test]
fn only_a_recycle_reads_the_whole_config_and_says_when_it_cannot() {
    let dir = tempfile::tempdir().expect("tempdir");
    let (_, asked) = stand_in(dir.path(), r#"{"ok":true,"recycled":true,"generation":7}"#);
    let cfg = dir.path().join("sealnode.toml");
    // Valid TOML with the socket's place, but no config: no roles, a misspelt field.
    std::fs::write(
        &cfg,
        format!("schema = 1\n[cell]\nruntime_dir = \"{}\"\nstop_timout_s = 5\n", dir.path().display()),
    )
    .expect("config");
    let run = |args: &[&str]| {
        let o = Command::new(env!("CARGO_BIN_EXE_sealnode"))
            .args(["ctl", "--config", &cfg.display().to_string()])
            .args(args)
            .output_within(Duration::from_secs(30));
        (o.status.code(), String::from_utf8_lossy(&o.stderr).into_owned())
    };
    let (code, err) = run(&["recycle"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("note: the recycle's wait is 60 s: its bounds in the config cannot be read"), "{err}");
    assert!(err.contains("stop_timout_s"), "the note names what is wrong: {err}");
    assert_eq!(asked.recv_timeout(Duration::from_secs(5)).expect("a request"), r#"{"cmd":"recycle"}"#);
    // The other requests do not read it: no note (the stand-in's answer is no status, so 1).
    for args in [&["status"][..], &["ready"], &["metrics"]] {
        let (_, err) = run(args);
        assert!(!err.contains("note:") && !err.contains("stop_timout_s"), "ctl {args:?}: {err}");
        assert_eq!(asked.recv_timeout(Duration::from_secs(5)).expect("a request"), r#"{"cmd":"status"}"#);
    }
}
