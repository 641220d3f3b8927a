//! sealnode: a hardened launcher that seals an LLM engine and the frutebox node.
//!
//! Modules, bottom up (each uses only those before it; docs/architecture.md "Module graph"
//! lists every file and `tests/modules.rs` keeps that list true): [`error`], [`sys`] (raw
//! syscalls), [`trusted`] (files sealnode trusts), [`config`] (the operator's TOML), [`policy`]
//! (seccomp and Landlock files), [`cgroup`] (the roles' cgroup v2 leaves and limits), [`sandbox`] (one role's sandbox: plan, protocol, clone, the
//! child's setup sequence), [`cell`] (the roles' shared user namespace and their network
//! namespaces), [`probe`] (facts from inside a sandbox), [`canary`] (the escape battery),
//! [`receipt`], [`control`] (the control socket's protocol), [`ratelimit`], [`egress`] (the
//! forwarder), [`supervisor`] (`sealnode run`), [`doctor`] (kernel facts).

pub mod access;
pub mod atomic;
pub mod attest;
pub mod canary;
pub mod cdi;
pub mod cell;
pub mod cgroup;
pub mod check;
pub mod config;
pub mod control;
pub mod denylog;
pub mod digests;
pub mod doctor;
pub mod egress;
pub mod error;
pub mod escape;
pub mod exit;
#[doc(hidden)]
pub mod fuzzing;
pub mod init;
pub mod journal;
pub mod log;
pub mod logsink;
pub mod measure;
pub mod metrics;
pub mod output;
pub mod policy;
pub mod probe;
pub mod ratelimit;
pub mod receipt;
pub mod sandbox;
pub mod sealed;
pub mod sealed_text;
pub mod status_text;
pub mod supervisor;
pub mod sys;
pub mod tpm;
pub mod trusted;
pub mod wipe;

pub use error::{Error, Result};
