//! The operator's configuration: TOML types, parsing and validation.
//!
//! Parsing and the checks that need no filesystem ([`Config::parse`]) are pure and can be
//! unit-tested and fuzzed without privileges. [`Config::load`] adds the host checks
//! (existence, symlinks, ownership, permissions) that must pass before any process exists.
//!
//! The files (every item is re-exported here: `config::Config`, `config::line_of`, ...):
//! - `types`: the TOML types and their serde defaults, with the accessors that only read them
//!   (a role's config, its limits in force, binds, devices, host paths);
//! - `tpm`: `cell.tpm`, the TPM statements are quoted by, and its TCTI's form;
//! - `load`: reading a config: [`Config::parse`], [`Config::load`], [`Config::reload`], the
//!   clients' reads, and what a load read (policy files, the role ids, the config's digest);
//! - `pure`: the checks that need no filesystem: each field's form, the fields that must agree
//!   (cross checks), the overlaps of bound paths, user specs, URLs, variable names;
//! - `host`: the host checks: existence, symlinks, owners and modes, the role users, the
//!   rlimits against the launcher's, what sealnode trusts outside the roles' dirs, a role's
//!   CDI edits;
//! - `diagnostics`: how problems are reported: every problem at once, each with its field and
//!   line, a TOML error in words;
//! - [`cdi`]: Container Device Interface specs; [`init`]: `sealnode init`'s config.

pub mod cdi;
mod diagnostics;
mod host;
pub mod init;
mod load;
mod pure;
mod tpm;
mod types;

pub use diagnostics::{cannot_read, line_of};
pub use pure::{is_proxy_var, reserved_inside};
pub use tpm::{TpmConfig, TpmTarget, DEFAULT_AK_HANDLE};
pub use types::{
    Bind, CdiLoaded, CellConfig, Config, DevicesFrom, Egress, EnvConfig, Ids, Invoker, IoMax, Limits, Loaded, PathKind,
    Ready, ReadyKind, Restart, RestartLimit, Rlimits, Role, RoleConfig, RolePath, RootfulUsers, DEFAULT_CONFIG,
    SCHEMA_VERSION,
};

#[cfg(test)]
mod tests;
