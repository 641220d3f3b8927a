//! Every exit status of every command, in one table: the code uses the constants, the man
//! pages' EXIT STATUS sections and the README's table are rendered from [`TABLE`] (tests/docs.rs
//! keeps the README equal to it).

/// Success: run stopped by a signal; canary every attempt refused; check, doctor and
/// verify-receipt found nothing wrong.
pub const OK: i32 = 0;
/// The command's "no": a role exited without restart (run), an attempt succeeded (canary),
/// a mismatch (verify-receipt), a required kernel feature is missing (doctor), the supervisor
/// answered an error or cannot be reached (ctl).
pub const FAILED: i32 = 1;
/// Wrong use of the command line (clap's own usage errors).
pub const USAGE: i32 = 2;
/// run: a preflight found an escape: the sandbox does not hold.
pub const PREFLIGHT_FAILED: i32 = 3;
/// run: the engine did not become ready within `engine.ready.timeout_s`.
pub const NOT_READY: i32 = 4;
/// run: a role exited more often than its `restart_limit` allows.
pub const RESTART_LIMIT: i32 = 5;
/// run: the preflight could not run at all (a host-side failure, not an escape): restartable.
pub const PREFLIGHT_ERROR: i32 = 6;
/// verify-attestation: no signature by the given key verifies (a changed byte, another key).
pub const ATTEST_SIGNATURE: i32 = 10;
/// verify-attestation: the statement answers another nonce, or none.
pub const ATTEST_NONCE: i32 = 11;
/// verify-attestation: a subject's digest or the generation is not what was expected.
pub const ATTEST_MISMATCH: i32 = 12;
/// verify-attestation: not a DSSE envelope holding a sealnode statement.
pub const ATTEST_MALFORMED: i32 = 13;
/// verify-attestation: the TPM quote is missing or does not bind the statement (`--tpm-ak`).
pub const ATTEST_TPM: i32 = 14;
/// A config, policy or setup error: nothing was started. Also the status a sandbox's own
/// child exits with when a setup step fails (`sandbox::protocol::fail`), as hakoniwa's do.
pub const CONFIG: i32 = 125;

/// One row: the status, the commands it applies to (`*`: every command), what it means.
pub struct Status {
    pub code: &'static str,
    pub commands: &'static [&'static str],
    pub meaning: &'static str,
}

pub const ALL: &[&str] = &["*"];

/// The table, in order. `exec`'s own status is its command's.
pub const TABLE: &[Status] = &[
    Status {
        code: "0",
        commands: ALL,
        meaning: "success: `run` was stopped by a signal; `canary` saw every attempt refused; `check`, `doctor` and `verify-receipt` found nothing wrong; `verify-attestation` verified the statement",
    },
    Status {
        code: "1",
        commands: &["run", "canary", "verify-receipt", "doctor", "ctl", "attest"],
        meaning: "the command's \"no\": a role exited and its `restart` does not restart it (`run`); an attempt succeeded (`canary`); a mismatch (`verify-receipt`); a required kernel feature is missing (`doctor`); the supervisor answered an error or cannot be reached (`ctl`, `attest`)",
    },
    Status { code: "2", commands: ALL, meaning: "wrong use of the command line (an unknown option, a missing argument)" },
    Status { code: "3", commands: &["run"], meaning: "a preflight found an escape: the sandbox does not hold (systemd does not restart)" },
    Status { code: "4", commands: &["run"], meaning: "the engine did not become ready within `engine.ready.timeout_s`" },
    Status { code: "5", commands: &["run"], meaning: "a role exited more often than its `restart_limit` allows" },
    Status { code: "6", commands: &["run"], meaning: "the preflight could not run at all (a host-side failure, not an escape)" },
    Status {
        code: "10",
        commands: &["verify-attestation"],
        meaning: "no signature by the given key verifies: the envelope was changed, or another key signed it",
    },
    Status { code: "11", commands: &["verify-attestation"], meaning: "the statement answers another nonce, or none (a replay, or the start-time statement)" },
    Status {
        code: "12",
        commands: &["verify-attestation"],
        meaning: "a subject's digest (`--expect`) or the generation (`--min-generation`) is not what was expected",
    },
    Status { code: "13", commands: &["verify-attestation"], meaning: "not a DSSE envelope holding a sealnode statement" },
    Status {
        code: "14",
        commands: &["verify-attestation"],
        meaning: "`--tpm-ak`: the statement says no TPM, or its TPM quote is missing, by another key, for another nonce, or not over this statement",
    },
    Status {
        code: "125",
        commands: ALL,
        meaning: "a config, policy or setup error: nothing was started; the message names the file, field and reason, or the setup step and errno (systemd does not restart)",
    },
    Status {
        code: "other",
        commands: &["exec"],
        meaning: "the command's own exit status (128+N after signal N)",
    },
];

/// The rows that apply to `command` ("sealnode" itself: all of them).
pub fn rows_for(command: &str) -> impl Iterator<Item = &'static Status> + '_ {
    TABLE.iter().filter(move |s| command == "sealnode" || s.commands == ALL || s.commands.contains(&command))
}

/// The table as Markdown, as README.md carries it.
pub fn markdown() -> String {
    let mut s = String::from("| status | commands | meaning |\n|---|---|---|\n");
    for r in TABLE {
        let cmds = if r.commands == ALL { "all".to_string() } else { r.commands.join(", ") };
        s.push_str(&format!("| {} | {cmds} | {} |\n", r.code, r.meaning));
    }
    s
}
