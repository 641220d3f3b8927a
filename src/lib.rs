//! sealnode: a hardened launcher that seals an LLM engine and the frutebox node.
//!
//! Layout: [`config`] (the operator's TOML), [`policy`] (seccomp and Landlock files),
//! [`sandbox`] (one role's sandbox: plan, clone, the child's setup sequence), [`doctor`]
//! (kernel facts), [`probe`] (facts from inside a sandbox), [`sys`] (raw syscalls).

pub mod canary;
pub mod cell;
pub mod config;
pub mod control;
pub mod doctor;
pub mod egress;
pub mod error;
#[doc(hidden)]
pub mod fuzzing;
pub mod policy;
pub mod probe;
pub mod receipt;
pub mod sandbox;
pub mod supervisor;
pub mod sys;
pub mod trusted;

pub use error::{Error, Result};
