//! SIGHUP. The config is read again through the checked path; a change only a new cell could
//! apply is refused by name ([`refused`]: every field of the config is named there, by
//! exhaustive destructuring, so a field added to the config does not compile until it is
//! sorted into "applies at the next start" or "needs a new cell", and no field can be
//! half-applied). A valid new config passes the gate first, in a throwaway cell of its own,
//! while the old roles keep running ([`Reload`] holds it meanwhile); then both roles stop and
//! start again through the gate with it. The outcome is kept for `ctl status`.

use std::fmt::Debug;

use crate::config::{CellConfig, Config, Role, RoleConfig};
use crate::control::protocol::ReloadOutcome;

/// A reload in its steps: the candidate in its dry run, then the config applied once both
/// roles are down, then READY=1 again once the node runs.
#[derive(Debug, Default)]
pub(super) struct Reload {
    /// A config a SIGHUP loaded, while its dry run passes the gate.
    candidate: Option<Config>,
    /// A config that passed its dry run, applied once both roles are down.
    next: Option<Config>,
    /// Applied and restarting: READY=1 again once the node runs.
    in_progress: bool,
    /// The outcome of the last SIGHUP, for `ctl status`.
    last: Option<ReloadOutcome>,
}

impl Reload {
    /// A SIGHUP refused (or a dry run that failed): why, for `ctl status`.
    pub(super) fn refused(&mut self, why: impl Into<String>) {
        self.last = Some(ReloadOutcome::refused(crate::os::sys::unix_now(), why));
    }

    /// `new` loaded and checked: its dry run passes the gate.
    pub(super) fn dry_run(&mut self, new: Config) {
        self.candidate = Some(new);
    }

    /// The dry run answered: its config.
    pub(super) fn take_candidate(&mut self) -> Option<Config> {
        self.candidate.take()
    }

    /// `new` passed its dry run: it is applied once both roles are down, and READY=1 said
    /// again once the node runs.
    pub(super) fn applied(&mut self, new: Config) {
        self.last = Some(ReloadOutcome::applied(crate::os::sys::unix_now(), new.config_sha256().to_string()));
        self.next = Some(new);
        self.in_progress = true;
    }

    pub(super) fn in_progress(&self) -> bool {
        self.in_progress
    }

    /// The node runs again: the reload in progress (if any) is complete.
    pub(super) fn finish(&mut self) -> bool {
        std::mem::take(&mut self.in_progress)
    }

    /// The config a passed reload brings in, once both roles are down.
    pub(super) fn take_next(&mut self) -> Option<Config> {
        self.next.take()
    }

    /// The cell stops: a dry run under way is abandoned (and said so).
    pub(super) fn abandon(&mut self) {
        if self.candidate.take().is_some() {
            self.last = Some(ReloadOutcome::refused(crate::os::sys::unix_now(), "abandoned: the cell stopped"));
        }
    }

    pub(super) fn candidate(&self) -> Option<&Config> {
        self.candidate.as_ref()
    }

    pub(super) fn last(&self) -> Option<&ReloadOutcome> {
        self.last.as_ref()
    }
}

/// The fields that differ between `old` and `new` and that only a new cell can apply (its
/// network namespaces and egress listeners, the users it maps, its dirs, its scratch tmpfs and
/// cgroup limits, the TPM tools it checked at start), by config name.
pub(super) fn refused(old: &Config, new: &Config) -> Vec<String> {
    let mut changed = Vec::new();
    let mut cmp = |name: String, a: &dyn Debug, b: &dyn Debug| {
        if format!("{a:?}") != format!("{b:?}") {
            changed.push(name);
        }
    };
    let Config { schema: _, cell, engine, node, file: _, loaded: _ } = new;
    let CellConfig {
        hostname,
        state_dir,
        runtime_dir,
        rootful,
        // Read at every stop.
        stop_timeout_s: _,
        // Read at every pass through the gate.
        preflight_timeout_s: _,
        egress_max_connections,
        egress_idle_timeout_s,
        egress_connect_timeout_s,
        // Read for every control connection.
        control_uids: _,
        // Handed to the forwarder when a reload's config comes into force.
        engine_hold_s: _,
        // Read at every stop.
        drain_timeout_s: _,
        // The watch follows the config in force: armed or dropped when a reload's config
        // comes into force (watch::ConfigWatch::follow).
        reload_on_change: _,
        cgroup,
        limits,
        tpm,
    } = cell;
    let o = &old.cell;
    // Set in the cell's namespaces when it was made (and refused by the first reloads too).
    cmp("cell.hostname".into(), &o.hostname, hostname);
    // Locked and opened once; the control socket and the statements live there.
    cmp("cell.state_dir".into(), &o.state_dir, state_dir);
    cmp("cell.runtime_dir".into(), &o.runtime_dir, runtime_dir);
    // The user namespace maps these users, and the wipes run as them (Config::reload keeps
    // the ids looked up at start and refuses other users before this).
    cmp("cell.rootful".into(), &o.rootful, rootful);
    // The forwarder was built with them.
    cmp("cell.egress_max_connections".into(), &o.egress_max_connections, egress_max_connections);
    cmp("cell.egress_idle_timeout_s".into(), &o.egress_idle_timeout_s, egress_idle_timeout_s);
    cmp("cell.egress_connect_timeout_s".into(), &o.egress_connect_timeout_s, egress_connect_timeout_s);
    // The limits are written into the leaves when the cell is made.
    cmp("cell.cgroup".into(), &o.cgroup, cgroup);
    cmp("cell.limits".into(), &o.limits, limits);
    // The tools and the attestation key were checked at start; every statement is quoted with
    // them, and the config in force must say so (and keep the TPM out of the roles).
    cmp("cell.tpm".into(), &o.tpm, tpm);
    for (role, r, o) in [(Role::Engine, engine, &old.engine), (Role::Node, node, &old.node)] {
        let RoleConfig {
            // The program, its pin and policies, binds, devices, environment, limits and
            // restart policy: all read by the gate and the next start.
            command: _,
            sha256: _,
            port,
            seccomp: _,
            landlock: _,
            models: _,
            models_writable: _,
            scratch,
            scratch_max_mb,
            credential: _,
            ro_binds: _,
            devices: _,
            devices_from: _,
            tmp_size_mb: _,
            env: _,
            rlimits: _,
            egress,
            ready_set: _,
            limits,
            log_refused_syscalls: _,
            restart: _,
            restart_limit: _,
        } = r;
        // The node's listener for the engine is the cell's.
        cmp(format!("{role}.port"), &o.port, port);
        // Opened and checked once (every wipe works on that descriptor); a capped one is the
        // cell's tmpfs.
        cmp(format!("{role}.scratch"), &o.scratch, scratch);
        cmp(format!("{role}.scratch_max_mb"), &o.scratch_max_mb, scratch_max_mb);
        // The egress listeners are the cell's.
        cmp(format!("{role}.egress"), &o.egress, egress);
        cmp(format!("{role}.limits"), &o.limits, limits);
    }
    changed
}

/// Whether `new` was read from the same bytes as `old`, file by file (the config, each role's
/// policies and CDI spec): a change seen on disk that changes none of them has nothing to
/// reload (watch.rs: kubelet's swap of a ConfigMap whose other keys changed, a rewrite with
/// the same content, a change seen again while its reload was under way). A config only
/// parsed is never the same.
pub(super) fn same_files(old: &Config, new: &Config) -> bool {
    let digests = |c: &Config| {
        c.loaded.as_ref().map(|l| {
            let policies = l.seccomp.iter().chain(&l.landlock).map(|f| f.sha256.clone());
            let cdi = l.cdi.iter().map(|c| c.as_ref().map(|c| c.sha256.clone()).unwrap_or_default());
            std::iter::once(l.config.sha256.clone()).chain(policies).chain(cdi).collect::<Vec<_>>()
        })
    };
    matches!((digests(old), digests(new)), (Some(a), Some(b)) if a == b)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(extra_cell: &str, extra_engine: &str) -> Config {
        let text = format!(
            "schema = 1\n[cell]\nstate_dir = \"/var/lib/s\"\nruntime_dir = \"/run/s\"\n{extra_cell}\n\
             [engine]\ncommand = [\"/usr/bin/true\"]\nport = 8080\nseccomp = \"/p/e.json\"\nlandlock = \"/p/e.toml\"\n\
             scratch = \"/srv/e\"\n{extra_engine}\n\
             [node]\ncommand = [\"/usr/bin/true\"]\nseccomp = \"/p/n.json\"\nlandlock = \"/p/n.toml\"\nscratch = \"/srv/n\"\n"
        );
        Config::parse(&text, std::path::Path::new("/etc/sealnode/sealnode.toml")).expect("config")
    }

    #[test]
    fn what_needs_a_new_cell_is_refused_by_name_and_the_rest_applies() {
        let base = cfg("", "");
        assert!(refused(&base, &base).is_empty());
        for (cell, engine, want) in [
            ("tpm = { tcti = \"device:/dev/tpmrm0\" }", "", "cell.tpm"),
            ("hostname = \"other\"", "", "cell.hostname"),
            ("egress_idle_timeout_s = 5", "", "cell.egress_idle_timeout_s"),
            ("", "scratch_max_mb = 64", "engine.scratch_max_mb"),
            ("", "limits = { memory_max_mb = 512 }", "engine.limits"),
        ] {
            assert_eq!(refused(&base, &cfg(cell, engine)), vec![want.to_string()], "{cell} {engine}");
        }
        let mut moved = cfg("", "");
        moved.engine.scratch = "/srv/e2".into();
        assert_eq!(refused(&base, &moved), vec!["engine.scratch".to_string()]);
        // What the next start reads applies.
        for (cell, engine) in [
            ("stop_timeout_s = 3", ""),
            ("control_uids = [0, 1000]", ""),
            ("", "sha256 = \"0000000000000000000000000000000000000000000000000000000000000000\""),
            ("", "restart = \"always\""),
            ("", "tmp_size_mb = 16"),
            ("", "log_refused_syscalls = true"),
            ("reload_on_change = true", ""),
        ] {
            assert!(refused(&base, &cfg(cell, engine)).is_empty(), "{cell} {engine}");
        }
    }

    /// A change seen on disk reloads only when a file a load reads differs: (which file
    /// differs, the same?).
    #[test]
    fn a_change_reloads_only_when_a_file_read_differs() {
        use crate::config::{Ids, Loaded};
        use crate::os::trusted::TrustedFile;
        let file = |s: &str| TrustedFile { bytes: Vec::new(), sha256: s.to_string() };
        let loaded = |config: &str, node_seccomp: &str| {
            let mut c = cfg("", "");
            c.loaded = Some(Loaded {
                config: file(config),
                seccomp: [file("e.json"), file(node_seccomp)],
                landlock: [file("e.toml"), file("n.toml")],
                cdi: [None, None],
                ids: [Ids { uid: 1, gid: 1 }, Ids { uid: 2, gid: 2 }],
                launcher_user: None,
            });
            c
        };
        let base = loaded("c1", "n.json");
        for (what, new, same) in [
            ("nothing", loaded("c1", "n.json"), true),
            ("the config", loaded("c2", "n.json"), false),
            ("a policy", loaded("c1", "n2.json"), false),
            ("a config only parsed", cfg("", ""), false),
        ] {
            assert_eq!(same_files(&base, &new), same, "{what}");
        }
    }
}
