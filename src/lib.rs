//! sealnode: a hardened launcher that seals an LLM engine and the frutebox node.
//!
//! Modules by subsystem (docs/architecture.md's "Module graph" lists every file, each after
//! what it uses, and `tests/modules.rs` keeps that list true and the file graph free of
//! cycles):
//! - the OS and the files sealnode trusts: [`error`], [`exit`], [`escape`], [`sys`],
//!   [`trusted`], [`atomic`], [`wipe`], [`locks`];
//! - the operator's input: [`config`] (with [`cdi`] and the TPM's target from [`tpm`]),
//!   [`policy`] (seccomp and Landlock files), [`init`];
//! - one role's sandbox: [`sandbox`] (plan, protocol, clone, the child's setup sequence),
//!   [`cgroup`] (the roles' cgroup v2 leaves and limits), [`cell`] (the roles' shared user
//!   namespace and their network namespaces), [`access`], [`sealed`];
//! - proof: [`probe`] and [`canary`] (the escape battery), [`digests`] and [`measure`] (what
//!   runs), [`receipt`], [`attest`] and [`tpm`] (signed statements, TPM quotes);
//! - the running cell: [`supervisor`] (`sealnode run`), [`egress`] (the forwarder),
//!   [`control`] (the control socket's protocol), [`output`], [`denylog`], [`ratelimit`];
//! - what operators read: [`log`], [`logsink`], [`journal`], [`metrics`], [`sealed_text`],
//!   [`status_text`], [`check`], [`doctor`] (kernel facts); [`fuzzing`] (fuzz entry points).

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
pub mod locks;
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
