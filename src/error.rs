//! One error type for the launcher. Variants are named after what failed and carry
//! the inputs an operator needs to fix it (file, field, path, errno).

use std::path::PathBuf;

use nix::errno::Errno;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum Error {
    /// The configuration file is invalid: which file, which field, why.
    #[error("{file}: {field}: {reason}")]
    Config { file: PathBuf, field: String, reason: String },
    /// Several problems of one configuration, each an [`Error::Config`] (`sealnode check` and
    /// `run` report every one they find at once).
    #[error("{} problems:\n  {}", .0.len(), .0.iter().map(|e| e.to_string()).collect::<Vec<_>>().join("\n  "))]
    Problems(Vec<Error>),
    /// A policy file (seccomp JSON or Landlock rules) is invalid.
    #[error("{file}: {reason}")]
    Policy { file: PathBuf, reason: String },
    /// The kernel lacks something the configuration requires.
    #[error("{what}\n  fix: {fix}")]
    Unsupported { what: String, fix: String },
    /// A step of the sandbox setup failed inside the child (reported over the error pipe).
    #[error("sandbox setup failed: {step}: {detail}: {errno} ({desc})", desc = errno.desc())]
    Setup { step: &'static str, detail: String, errno: Errno },
    /// A process of the sandbox setup was killed (no step failed): which, by what, at which
    /// step, and what to look at.
    #[error("sandbox setup killed: {what}\n  fix: {fix}")]
    Killed { what: String, fix: String },
    /// A stop (SIGTERM, SIGINT, SIGQUIT) was requested while sealnode waited for a step to
    /// finish; the step was abandoned so the stop is handled at once.
    #[error("{what}: abandoned, a stop was requested")]
    Stopped { what: String },
    /// A host-side system call or file operation failed.
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    pub fn config(file: impl Into<PathBuf>, field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::Config { file: file.into(), field: field.into(), reason: reason.into() }
    }

    pub fn policy(file: impl Into<PathBuf>, reason: impl Into<String>) -> Self {
        Error::Policy { file: file.into(), reason: reason.into() }
    }

    pub fn io(what: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { what: what.into(), source }
    }

    pub fn errno(what: impl Into<String>, errno: Errno) -> Self {
        Error::Io { what: what.into(), source: std::io::Error::from_raw_os_error(errno as i32) }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
