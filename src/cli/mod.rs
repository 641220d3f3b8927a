//! The subcommands, one module each. Each returns `Result<i32, Failure>`: the exit status, or
//! what went wrong and the status it means; `main` prints a failure once, the same way for all.

pub mod attest;
pub mod canary;
pub mod check;
pub mod ctl;
pub mod docs;
pub mod doctor;
pub mod exec;
pub mod init;
pub mod receipt;
pub mod run;
pub mod seccomp_bpf;

use std::process::ExitCode;

/// A subcommand that could not do its job: the message (printed as `sealnode: …`) and the exit
/// status it means.
#[derive(Debug)]
pub struct Failure {
    pub message: String,
    pub code: i32,
}

impl Failure {
    /// A config, policy or setup error: nothing was started (125).
    pub fn setup(e: impl std::fmt::Display) -> Failure {
        Failure { message: e.to_string(), code: sealnode::exit::CONFIG }
    }
    /// Any other failure of the subcommand (1).
    pub fn general(e: impl std::fmt::Display) -> Failure {
        Failure { message: e.to_string(), code: 1 }
    }
    /// Wrong use of the command line (2, as clap's own usage errors).
    pub fn usage(e: impl std::fmt::Display) -> Failure {
        Failure { message: e.to_string(), code: 2 }
    }
}

pub type Outcome = Result<i32, Failure>;

/// The one place a subcommand's outcome becomes sealnode's exit status.
pub fn exit(outcome: Outcome) -> ExitCode {
    let code = match outcome {
        Ok(code) => code,
        Err(f) => {
            eprintln!("sealnode: {}", f.message);
            f.code
        }
    };
    ExitCode::from(u8::try_from(code).unwrap_or(1))
}

/// Logging: JSON lines with `SEALNODE_LOG_FORMAT=json`, else to the journal when stderr is the
/// journal, plain lines on stderr otherwise (sealnode::logging::log), filtered by
/// `SEALNODE_LOG` (else `default`). An unknown format refuses the command (125).
pub fn init_logging(default: &str) -> Result<(), Failure> {
    sealnode::logging::log::init(default).map_err(Failure::setup)
}
