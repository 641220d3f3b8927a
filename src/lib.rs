//! sealnode: a hardened launcher that seals an LLM engine and the frutebox node.
//!
//! Modules by subsystem, one folder each (docs/architecture.md's "Module graph" lists every
//! file, each after what it uses; `tests/modules.rs` keeps that list true, the file graph free
//! of cycles and each folder within the layers it may use):
//! - [`os`]: the kernel and the files sealnode trusts (syscalls, checked opens, atomic writes,
//!   wipes, escaping); [`error`] and [`exit`] beside it, used by every layer;
//! - [`layout`]: where things are: the paths inside a role and the names of sealnode's own files;
//! - [`config`]: the operator's input (types, pure and host checks, CDI, `sealnode init`), and
//!   [`policy`]: the seccomp and Landlock files, compiled;
//! - [`sandbox`]: one role's sandbox (plan, clone, the child's setup sequence), the cell the
//!   roles share, their cgroups, what a role may open;
//! - [`proof`]: what proves the seal: the canary battery, measuring what runs, receipts,
//!   signed statements and TPM quotes, "what is sealed" in words;
//! - [`egress`]: the forwarder between the roles and to the gateway;
//! - [`logging`]: sealnode's log, the roles' output and the denial log;
//! - [`control`]: the control socket's protocol, and what reads it (status text, metrics);
//! - [`supervisor`]: `sealnode run`, the event loop and its parts;
//! - [`check`] and [`doctor`]: what `run` would check, starting nothing; [`fuzzing`] (fuzz
//!   entry points).

pub mod check;
pub mod config;
pub mod control;
pub mod doctor;
pub mod egress;
pub mod error;
pub mod exit;
#[doc(hidden)]
pub mod fuzzing;
pub mod layout;
pub mod logging;
pub mod os;
pub mod policy;
pub mod proof;
pub mod sandbox;
pub mod supervisor;

pub use error::{Error, Result};
