//! Reading a config: parse ([`Config::parse`]), load with the host checks ([`Config::load`],
//! [`Config::reload`]), and what a load read.

use std::path::{Path, PathBuf};

use super::diagnostics::{cannot_read, every_problem, rootless_hint, toml_error};
use super::types::{CdiLoaded, Config, Ids, Invoker, Loaded, Role, SCHEMA_VERSION};
use crate::error::{Error, Result};
use crate::os::trusted::TrustedFile;

impl Invoker {
    /// sealnode trusts its own uid as the owner of every file it reads and on the control
    /// socket: as the overflow uid (or gid) of a user namespace that leaves host ids unmapped,
    /// that would trust every unmapped host user (os::overflow). [`Config::load`] refuses it
    /// before any file is read, so `check` and every command that loads a config refuse as
    /// `run` does (tests/check_run.rs: the_overflow_uid_in_a_partial_user_namespace_is_refused);
    /// `init` asks first.
    pub fn check_ids(&self) -> Result<()> {
        match crate::os::overflow::Overflow::read().launcher_problem(self.uid, self.gid) {
            Some((what, fix)) => Err(Error::Unsupported { what, fix }),
            None => Ok(()),
        }
    }
}

impl Config {
    /// Parse and check everything that needs no filesystem access: every problem found (see
    /// [`every_problem`]).
    pub fn parse(text: &str, file: &Path) -> Result<Config> {
        every_problem(text, file, &|t| Config::parse_once(t, file))
    }

    /// Parse and check, stopping at the first problem (its line from `text` where the
    /// deserializer gave one).
    fn parse_once(text: &str, file: &Path) -> Result<Config> {
        // Check the schema first so a newer file gets the clearest message.
        let probe: toml::Table = toml::from_str(text).map_err(|e| toml_error(file, text, e, None))?;
        match probe.get("schema") {
            None => return Err(Error::config(file, "schema", "missing; this build reads schema = 1")),
            Some(toml::Value::Integer(v)) if *v == i64::from(SCHEMA_VERSION) => {}
            Some(toml::Value::Integer(v)) if *v > i64::from(SCHEMA_VERSION) => {
                return Err(Error::config(
                    file,
                    "schema",
                    format!("schema {v} is newer than this sealnode understands (1); upgrade sealnode"),
                ))
            }
            Some(v) => return Err(Error::config(file, "schema", format!("unsupported schema {v}; expected 1"))),
        }
        let de = toml::Deserializer::parse(text).map_err(|e| toml_error(file, text, e, None))?;
        let mut cfg: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            toml_error(file, text, e.into_inner(), Some(path))
        })?;
        cfg.file = file.to_path_buf();
        cfg.check_pure()?;
        Ok(cfg)
    }

    /// Read, parse and check a config file, including host checks; the role users are looked
    /// up in the user database.
    pub fn load(file: &Path, inv: &Invoker) -> Result<Config> {
        Config::load_with(file, inv, None)
    }

    /// [`Config::load`] for a SIGHUP: the roles keep the ids `running` looked up at its load,
    /// and nothing is looked up (a user database that hangs, such as a FIFO bound over
    /// /etc/passwd, would hang the supervisor's loop; tests/gate.rs:
    /// a_reload_looks_no_user_up). Other users than `running`'s are refused: the running
    /// cell's user namespace maps those.
    pub fn reload(file: &Path, inv: &Invoker, running: &Config) -> Result<Config> {
        Config::load_with(file, inv, Some(running))
    }

    fn load_with(file: &Path, inv: &Invoker, running: Option<&Config>) -> Result<Config> {
        if !file.is_absolute() {
            let abs = std::env::current_dir().map_err(|e| Error::io("current directory", e))?.join(file);
            return Config::load_with(&abs, inv, running);
        }
        inv.check_ids()?;
        let config = crate::os::trusted::read(file, inv.uid).map_err(|e| Error::config(file, "(config file)", e))?;
        let text = std::str::from_utf8(&config.bytes)
            .map_err(|e| Error::config(file, "(config file)", format!("not UTF-8: {e}")))?;
        let ids = std::cell::Cell::new(None);
        let mut cfg = every_problem(text, file, &|t| {
            let cfg = Config::parse_once(t, file)?;
            ids.set(Some(cfg.check_host(inv, running).map_err(|e| rootless_hint(e, &cfg, inv))?));
            Ok(cfg)
        })?;
        let ids =
            ids.get().ok_or_else(|| Error::config(file, "(config file)", "no host check ran (internal error)"))?;
        let read = |path: &Path, field: String| {
            crate::os::trusted::read(path, inv.uid).map_err(|e| Error::config(file, field, e))
        };
        // Each role's policies and CDI spec, read through the checked path.
        let role_files = |role: Role| -> Result<(TrustedFile, TrustedFile, Option<CdiLoaded>)> {
            let r = cfg.role(role);
            let seccomp = read(&r.seccomp, format!("{role}.seccomp"))?;
            let landlock = read(&r.landlock, format!("{role}.landlock"))?;
            let cdi = match &r.devices_from {
                Some(d) => Some(cfg.load_cdi(role, d, read(&d.cdi, format!("{role}.devices_from.cdi"))?)?),
                None => None,
            };
            Ok((seccomp, landlock, cdi))
        };
        let (engine_seccomp, engine_landlock, engine_cdi) = role_files(Role::Engine)?;
        let (node_seccomp, node_landlock, node_cdi) = role_files(Role::Node)?;
        let launcher_user = match running {
            Some(r) => r.loaded.as_ref().and_then(|l| l.launcher_user.clone()),
            None if inv.rootful() => None,
            None => nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(inv.uid)).ok().flatten().map(|u| u.name),
        };
        cfg.loaded = Some(Loaded {
            config,
            seccomp: [engine_seccomp, node_seccomp],
            landlock: [engine_landlock, node_landlock],
            cdi: [engine_cdi, node_cdi],
            ids,
            launcher_user,
        });
        cfg.check_no_role_tpm()?;
        Ok(cfg)
    }

    /// The role's policy files as loaded: (seccomp, landlock). An error for a config that was
    /// only parsed: nothing may start from policies that were not read through the checks.
    pub fn policy_files(&self, role: Role) -> Result<(&TrustedFile, &TrustedFile)> {
        let l = self.loaded(format!("{role}.seccomp"))?;
        Ok((&l.seccomp[role as usize], &l.landlock[role as usize]))
    }

    /// What [`Config::load`] read, or an error naming `field` for a config that was only
    /// parsed: nothing may start from policies or ids that were not read through the checks.
    pub fn loaded(&self, field: impl Into<String>) -> Result<&Loaded> {
        self.loaded.as_ref().ok_or_else(|| {
            Error::config(&self.file, field, "the config was not loaded (internal error: Config::load was not used)")
        })
    }

    /// The sha256 of the config file's bytes as loaded (empty for a config only parsed).
    pub fn config_sha256(&self) -> &str {
        self.loaded.as_ref().map_or("", |l| l.config.sha256.as_str())
    }

    /// The config's `cell.runtime_dir` alone (where the control socket is), read from its TOML
    /// without the rest of the checks: `ctl` reaches a running cell whose config was since
    /// edited into one that does not load.
    pub fn runtime_dir_of(file: &Path) -> Result<PathBuf> {
        let text = std::fs::read_to_string(file).map_err(|e| Error::config(file, "(config file)", cannot_read(e)))?;
        let v: toml::Table =
            toml::from_str(&text).map_err(|e| Error::config(file, "(config file)", format!("not TOML: {e}")))?;
        v.get("cell")
            .and_then(|c| c.get("runtime_dir"))
            .and_then(|d| d.as_str())
            .map(PathBuf::from)
            .ok_or_else(|| Error::config(file, "cell.runtime_dir", "missing"))
    }

    /// Read and parse without the host checks (ownership is judged against the launcher's
    /// uid): for clients such as `sealnode attest pubkey`, which only need the state dir.
    pub fn read_for_client(file: &Path) -> Result<Config> {
        let text = std::fs::read_to_string(file).map_err(|e| Error::config(file, "(config file)", cannot_read(e)))?;
        Config::parse(&text, file)
    }

    /// Which host ids `role` runs as, as [`Config::load`] resolved them (the user database is
    /// not asked again while the cell runs).
    pub fn role_ids(&self, role: Role) -> Result<Ids> {
        let field = if self.cell.rootful.is_some() { format!("cell.rootful.{role}") } else { "cell.rootful".into() };
        Ok(self.loaded(field)?.ids[role as usize])
    }
}
