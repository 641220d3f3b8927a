//! SIGHUP. The config is read again through the checked path; a change only a new cell could
//! apply is refused by name ([`refused`]: every field of the config is named there, by
//! exhaustive destructuring, so a field added to the config does not compile until it is
//! sorted into "applies in place", "applies at the next start" or "needs a new cell", and no
//! field can be half-applied). What the change restarts is [`scope`]'s: nothing, when only
//! what applies in place changed (cgroup limits written live, the forwarder's bounds, the
//! timers); the node alone, when the engine's own inputs are unchanged (the engine keeps its
//! loaded model); else both. A config that restarts a role passes the gate first, in a
//! throwaway cell of its own, while the old roles keep running ([`Reload`] holds it
//! meanwhile); then the roles stop and start again through the gate with it. The outcome is
//! kept for `ctl status`.

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

    /// `new` applied in place (no role restarts): READY=1 again once the node runs, which it
    /// does unless it is restarting.
    pub(super) fn applied_in_place(&mut self, new: &Config) {
        self.last = Some(ReloadOutcome::applied(crate::os::sys::unix_now(), new.config_sha256().to_string()));
        self.in_progress = true;
    }

    pub(super) fn in_progress(&self) -> bool {
        self.in_progress
    }

    /// A reload is under way: its dry run, its switch, or its restart until the node runs.
    pub(super) fn under_way(&self) -> bool {
        self.candidate.is_some() || self.next.is_some() || self.in_progress
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
/// hostname, the users it maps, its dirs, its scratch tmpfs, the node's way to the engine, its
/// cgroup's place, the TPM tools it checked at start), by config name.
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
        // The forwarder's bounds, set in place (Forwarder::set_bounds).
        egress_max_connections: _,
        egress_idle_timeout_s: _,
        egress_connect_timeout_s: _,
        // Read for every control connection.
        control_uids: _,
        // Handed to the forwarder when a reload's config comes into force.
        engine_hold_s: _,
        engine_replay_kb: _,
        // Read at every stop.
        drain_timeout_s: _,
        // The watch follows the config in force: armed or dropped when a reload's config
        // comes into force (watch::ConfigWatch::follow).
        reload_on_change: _,
        cgroup,
        // Written live into the leaves (cgroup::Tree::update).
        limits: _,
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
    // The leaves were made there, and sealnode moved itself into its supervisor leaf.
    cmp("cell.cgroup".into(), &o.cgroup, cgroup);
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
            // The node's listeners are made anew, in its namespace, while it is down for its
            // restart (Cell::node_listeners).
            egress: _,
            ready_set: _,
            // Written live into the role's leaf.
            limits: _,
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
    }
    changed
}

/// What a reload restarts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Scope {
    /// No role: only what applies in place changed (the limits, the forwarder's bounds, the
    /// timers, a comment).
    InPlace,
    /// The node alone, the engine running on: nothing the engine's sandbox is made from
    /// changed.
    Node,
    /// Both roles (and a SIGHUP whose config reads the same: a re-provision on request).
    Both,
}

/// What `new` restarts, coming after `old` (already held to [`refused`]): a role restarts
/// when anything its sandbox is made from changed (its section but its limits, its policies,
/// its CDI spec); the node also when the engine does (it starts only beside a ready engine).
pub(super) fn scope(old: &Config, new: &Config) -> Scope {
    if same_files(old, new) {
        return Scope::Both;
    }
    let inputs = |c: &Config, role: Role| {
        let r = c.role(role);
        let section = format!("{:?}", RoleConfig { limits: Default::default(), ..r.clone() });
        let files = c.loaded.as_ref().map(|l| {
            let i = role as usize;
            let cdi = l.cdi[i].as_ref().map(|c| c.sha256.clone()).unwrap_or_default();
            [l.seccomp[i].sha256.clone(), l.landlock[i].sha256.clone(), cdi]
        });
        (section, files)
    };
    if inputs(old, Role::Engine) != inputs(new, Role::Engine) {
        Scope::Both
    } else if inputs(old, Role::Node) != inputs(new, Role::Node) {
        Scope::Node
    } else {
        Scope::InPlace
    }
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
            ("cgroup = \"sealnode/other\"", "", "cell.cgroup"),
            ("", "scratch_max_mb = 64", "engine.scratch_max_mb"),
        ] {
            assert_eq!(refused(&base, &cfg(cell, engine)), vec![want.to_string()], "{cell} {engine}");
        }
        let mut moved = cfg("", "");
        moved.engine.scratch = "/srv/e2".into();
        assert_eq!(refused(&base, &moved), vec!["engine.scratch".to_string()]);
        let mut port = cfg("", "");
        port.engine.port = Some(8081);
        assert_eq!(refused(&base, &port), vec!["engine.port".to_string()]);
        // What the next start reads applies.
        for (cell, engine) in [
            ("stop_timeout_s = 3", ""),
            ("control_uids = [0, 1000]", ""),
            ("", "sha256 = \"0000000000000000000000000000000000000000000000000000000000000000\""),
            ("", "restart = \"always\""),
            ("", "tmp_size_mb = 16"),
            ("", "log_refused_syscalls = true"),
            ("reload_on_change = true", ""),
            ("egress_idle_timeout_s = 5", ""),
            ("engine_replay_kb = 0", ""),
            ("limits = { pids_max = 64 }", ""),
            ("", "limits = { memory_max_mb = 512 }"),
        ] {
            assert!(refused(&base, &cfg(cell, engine)).is_empty(), "{cell} {engine}");
        }
    }

    /// What a reload restarts: nothing for what applies in place, the node alone for the
    /// node's own inputs, both for the engine's (and for a config that reads the same).
    #[test]
    fn a_reload_restarts_only_the_roles_whose_inputs_changed() {
        use crate::config::{Ids, Loaded};
        use crate::os::trusted::TrustedFile;
        let file = |s: &str| TrustedFile { bytes: Vec::new(), sha256: s.to_string() };
        let loaded = |text_sha: &str, mut c: Config, engine_seccomp: &str, node_landlock: &str| {
            c.loaded = Some(Loaded {
                config: file(text_sha),
                seccomp: [file(engine_seccomp), file("n.json")],
                landlock: [file("e.toml"), file(node_landlock)],
                cdi: [None, None],
                ids: [Ids { uid: 1, gid: 1 }, Ids { uid: 2, gid: 2 }],
                launcher_user: None,
            });
            c
        };
        let base = loaded("c0", cfg("", ""), "e.json", "n.toml");
        let mut with_egress = cfg("", "");
        with_egress.node.egress =
            vec![crate::config::Egress { host: "gw.test".into(), port: 443, connect: None, allow_private: false }];
        for (what, new, want) in [
            ("the same files", loaded("c0", cfg("", ""), "e.json", "n.toml"), Scope::Both),
            ("a limit", loaded("c1", cfg("limits = { pids_max = 64 }", ""), "e.json", "n.toml"), Scope::InPlace),
            (
                "the engine's limit",
                loaded("c1", cfg("", "limits = { memory_max_mb = 512 }"), "e.json", "n.toml"),
                Scope::InPlace,
            ),
            ("a bound", loaded("c1", cfg("egress_idle_timeout_s = 5", ""), "e.json", "n.toml"), Scope::InPlace),
            ("the replay bound", loaded("c1", cfg("engine_replay_kb = 0", ""), "e.json", "n.toml"), Scope::InPlace),
            ("the node's egress", loaded("c1", with_egress, "e.json", "n.toml"), Scope::Node),
            ("the node's policy", loaded("c1", cfg("", ""), "e.json", "n2.toml"), Scope::Node),
            ("the engine's policy", loaded("c1", cfg("", ""), "e2.json", "n.toml"), Scope::Both),
            ("the engine's section", loaded("c1", cfg("", "tmp_size_mb = 16"), "e.json", "n.toml"), Scope::Both),
        ] {
            assert_eq!(scope(&base, &new), want, "{what}");
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
