//! The host checks [`Config::load`] adds to the pure ones: existence, symlinks, owners and
//! modes, the role users, the rlimits against the launcher's, a role's CDI edits.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

use super::pure::{contains, is_proxy_var, parse_user_spec, reserved_inside, UserSpec};
use super::types::{Bind, CdiLoaded, Config, DevicesFrom, Ids, Invoker, PathKind, Role, RolePath};
use crate::error::Result;
use crate::layout::SYSTEM_RO;
use crate::os::trusted::TrustedFile;

/// A TPM device node: named tpm* under /dev, or a character device the kernel's tpm or tpmrm
/// class owns (/sys/dev/char/MAJ:MIN/subsystem), whatever its name.
fn is_tpm_device(p: &Path) -> bool {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    if p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("tpm")) {
        return true;
    }
    let Ok(md) = std::fs::metadata(p) else { return false };
    if !md.file_type().is_char_device() {
        return false;
    }
    let (maj, min) = (nix::sys::stat::major(md.rdev()), nix::sys::stat::minor(md.rdev()));
    std::fs::read_link(format!("/sys/dev/char/{maj}:{min}/subsystem"))
        .ok()
        .and_then(|l| l.file_name().map(|n| n == "tpm" || n == "tpmrm"))
        .unwrap_or(false)
}

/// Whether the host's `path` is what a role sees at the same path through the read-only
/// system binds: it resolves (symlinks too, as the role's recreated ones do) to a path under
/// a [`SYSTEM_RO`] entry that is bound as is.
pub(super) fn in_system_view(path: &Path) -> bool {
    let Ok(real) = std::fs::canonicalize(path) else {
        return false;
    };
    // The path itself must be under a system path (bound, or a recreated symlink such as /lib
    // -> usr/lib): a path elsewhere is not in the role's view whatever it points to (unit test:
    // config::tests::only_a_path_under_a_system_path_is_in_the_system_view). Then what it
    // resolves to must be under a system path bound as is.
    let bound = |s: &&&str| std::fs::symlink_metadata(s).is_ok_and(|m| !m.file_type().is_symlink());
    SYSTEM_RO.iter().any(|s| path.starts_with(s)) && SYSTEM_RO.iter().filter(bound).any(|s| real.starts_with(s))
}

/// Where a driver's files live on a host: a CDI spec's mounts must come from here. Anything
/// else (a home, /proc, /sys, sealnode's own dirs, the node's credential) is refused, not
/// bound (tests/devices.rs: bad_cdi_specs_are_config_errors_naming_the_spec_and_entry).
const CDI_HOST_ROOTS: &[&str] = &["/usr", "/lib", "/lib32", "/lib64", "/opt", "/var/lib"];

/// Variables a CDI spec may not set: sealnode's own base (PATH, HOME, TMPDIR, LANG), the
/// dynamic loader's (LD_*) and sealnode's (SEALNODE_*). The config's `env.set` can set them.
fn cdi_env_refused(name: &str) -> bool {
    ["PATH", "HOME", "TMPDIR", "LANG"].contains(&name) || name.starts_with("LD_") || name.starts_with("SEALNODE_")
}

/// The first symlink among the components of an absolute path, if any (the child opens
/// device nodes with no symlink in any component; one on the way fails the start otherwise).
fn symlink_on_the_way(path: &Path) -> Option<PathBuf> {
    let mut here = PathBuf::from("/");
    for c in path.components().skip(1) {
        here.push(c);
        if std::fs::symlink_metadata(&here).is_ok_and(|m| m.file_type().is_symlink()) {
            return Some(here);
        }
    }
    None
}

/// A bind's mount point inside a read-only system bind (e.g. `/usr/...`) cannot be created in
/// the role's view: it must already be there, of the same kind as the bind's source. None when
/// the destination is not under a system bind, or is fine.
fn system_mount_point_problem(inside: &Path, src_is_dir: bool) -> Option<String> {
    // Through sealnode's own links first (`/lib -> usr/lib`), as the plan binds it
    // (sandbox::plan's through_own_links; found by review: `/lib/newdir` passed `check` and
    // failed every start).
    let linked = SYSTEM_RO.iter().map(Path::new).find_map(|s| {
        let rest = inside.strip_prefix(s).ok()?;
        let target = std::fs::read_link(s).ok()?;
        let climbs = target.components().any(|c| c == std::path::Component::ParentDir);
        (!climbs).then(|| s.parent().unwrap_or(Path::new("/")).join(target).join(rest))
    });
    let inside = linked.as_deref().unwrap_or(inside);
    let sys = SYSTEM_RO
        .iter()
        .map(Path::new)
        .find(|s| inside.starts_with(s) && std::fs::symlink_metadata(s).is_ok_and(|m| !m.file_type().is_symlink()))?;
    match std::fs::metadata(inside) {
        Ok(m) if m.is_dir() == src_is_dir => None,
        Ok(_) => Some(format!(
            "{} is a {} in the read-only system bind of {}, the bind's source a {}",
            inside.display(),
            if src_is_dir { "file" } else { "directory" },
            sys.display(),
            if src_is_dir { "directory" } else { "file" }
        )),
        Err(_) => Some(format!(
            "{} does not exist in the read-only system bind of {}, and no mount point can be made there; bind it elsewhere",
            inside.display(),
            sys.display()
        )),
    }
}

/// A hard limit of `hard` bytes (or a count, `unit` 1) in the field's unit (MB, KB): as is
/// where it is a whole number of them, else in bytes, never rounded down to a limit the
/// operator could not set either (found by review: 1.5 MB was shown as 1).
pub(super) fn in_units(hard: u64, unit: u64) -> String {
    if hard % unit == 0 {
        (hard / unit).to_string()
    } else {
        format!("{hard} bytes")
    }
}

impl Config {
    /// `cell.control_uids` may not name the overflow uid where the user namespace leaves host
    /// uids unmapped: every unmapped host user connects as it (SO_PEERCRED), and would get the
    /// status, recycle and signed statements (unit test:
    /// config::tests::control_uids_may_not_name_the_overflow_uid_of_a_partial_namespace).
    pub(super) fn check_control_uids(&self, ov: &crate::os::overflow::Overflow) -> Result<()> {
        match self.cell.control_uids.iter().flatten().position(|u| ov.ambiguous_uid(*u)) {
            Some(i) => Err(self.err(
                format!("cell.control_uids[{i}]"),
                format!(
                    "uid {} is the overflow uid (/proc/sys/kernel/overflowuid) of a user namespace that does not map every host uid: every host user the namespace does not map connects as it; name the uids of the users who may use the socket, as this namespace maps them",
                    ov.uid
                ),
            )),
            None => Ok(()),
        }
    }

    /// With `cell.tpm`, no role gets a TPM device (by `devices` or a CDI spec): with it a role
    /// could reset PCR 23 and quote with the attestation key. `check` and `run` refuse such a
    /// config (tests/attest.rs: with_a_tpm_no_role_gets_a_tpm_device).
    pub(super) fn check_no_role_tpm(&self) -> Result<()> {
        if self.cell.tpm.is_none() {
            return Ok(());
        }
        for role in Role::ALL {
            if let Some(d) = self.devices(role).into_iter().find(|d| is_tpm_device(d)) {
                let field = if self.role(role).devices.iter().any(|x| x == d) { "devices" } else { "devices_from" };
                return Err(self.err(
                    format!("{role}.{field}"),
                    format!("{} is a TPM: with cell.tpm set, a role with it could reset PCR 23 and quote with the attestation key", d.display()),
                ));
            }
        }
        Ok(())
    }

    /// Check a role's CDI edits against the host: every node exists and is the device the
    /// spec says; every file exists, is no socket, lies outside every role-writable dir and
    /// outside the sandbox's own layout. Errors name the config field, the spec and its entry.
    pub(super) fn load_cdi(&self, role: Role, d: &DevicesFrom, spec: TrustedFile) -> Result<CdiLoaded> {
        use std::os::unix::fs::FileTypeExt;
        let field = format!("{role}.devices_from");
        let fail = |reason: String| self.err(field.clone(), format!("{}: {reason}", d.cdi.display()));
        // 4 MiB is far above any real spec (nvidia-ctk's are tens of KiB) and bounds what the
        // YAML parser is given, and so its memory: a larger spec is refused unparsed
        // (tests/devices.rs: bad_cdi_specs_are_config_errors_naming_the_spec_and_entry).
        if spec.bytes.len() > 4 << 20 {
            return Err(fail(format!("{} bytes: a CDI spec is at most 4 MiB", spec.bytes.len())));
        }
        let edits = crate::config::cdi::edits(&spec.bytes, &d.devices).map_err(fail)?;
        for n in &edits.nodes {
            if let Some(link) = symlink_on_the_way(&n.path) {
                return Err(fail(format!(
                    "{}.path: {} is a symlink on the way to {}",
                    n.entry,
                    link.display(),
                    n.path.display()
                )));
            }
            let md = std::fs::symlink_metadata(&n.path)
                .map_err(|e| fail(format!("{}.path: {}: {e}", n.entry, n.path.display())))?;
            let ft = md.file_type();
            let is_kind = match n.kind {
                Some('b') => ft.is_block_device(),
                Some(_) => ft.is_char_device(),
                None => ft.is_char_device() || ft.is_block_device(),
            };
            if !is_kind {
                return Err(fail(format!(
                    "{}.path: {} is not a {} device node",
                    n.entry,
                    n.path.display(),
                    match n.kind {
                        Some('b') => "block",
                        Some(_) => "character",
                        None => "character or block",
                    }
                )));
            }
            let (major, minor) = (libc::major(md.rdev()), libc::minor(md.rdev()));
            if n.major.is_some_and(|m| m != u64::from(major)) || n.minor.is_some_and(|m| m != u64::from(minor)) {
                return Err(fail(format!(
                    "{}: {} is device {major}:{minor}, the spec says {}:{} (a stale spec: regenerate it)",
                    n.entry,
                    n.path.display(),
                    n.major.map_or("*".into(), |m| m.to_string()),
                    n.minor.map_or("*".into(), |m| m.to_string())
                )));
            }
        }
        for (k, _) in &edits.env {
            if is_proxy_var(k) {
                return Err(fail(format!("env sets {k}: proxy variables never reach a role")));
            }
        }
        let writable: Vec<RolePath> =
            Role::ALL.iter().flat_map(|r| self.host_paths(*r)).filter(|p| p.writable).collect();
        let mut out = CdiLoaded { spec: d.cdi.clone(), sha256: spec.sha256.clone(), ..CdiLoaded::default() };
        out.left_out.extend(edits.ignored.iter().cloned());
        let mut edits = edits;
        let r = self.role(role);
        edits.env.retain(|(k, _)| {
            let keep = !cdi_env_refused(k) && !r.env.pass.contains(k);
            if !keep && !r.env.set.contains_key(k) {
                out.left_out.push((
                    format!("containerEdits.env {k}"),
                    format!("{k} is sealnode's own, the loader's or passed through by env.pass; set it in env.set to have it"),
                ));
            }
            keep
        });
        // Everything a role must never be handed from a spec: sealnode's own files and dirs,
        // each role's credential, models and scratch, the policies, either way round.
        let mut guarded: Vec<(String, PathBuf)> = vec![
            ("cell.state_dir".into(), self.cell.state_dir.clone()),
            ("cell.runtime_dir".into(), self.cell.runtime_dir.clone()),
            ("(config file)".into(), self.file.clone()),
        ];
        for other in Role::ALL {
            for p in self.host_paths(other) {
                guarded.push((p.field.clone(), p.path.to_path_buf()));
            }
            guarded.push((format!("{other}.seccomp"), self.role(other).seccomp.clone()));
            guarded.push((format!("{other}.landlock"), self.role(other).landlock.clone()));
        }
        guarded.retain(|(f, _)| !f.contains("ro_binds"));
        let ro_dsts: Vec<&Path> = r.ro_binds.iter().map(Bind::inside).collect();
        for m in &edits.mounts {
            let md = std::fs::symlink_metadata(&m.host)
                .map_err(|e| fail(format!("{}.hostPath: {}: {e}", m.entry, m.host.display())))?;
            if md.file_type().is_socket() {
                out.left_out.push((
                    m.entry.clone(),
                    format!(
                        "{} is a unix socket, a way to a host daemon: a role reaches no host service",
                        m.host.display()
                    ),
                ));
                continue;
            }
            if let Some(w) = writable.iter().find(|w| contains(w.path, &m.host) || contains(&m.host, w.path)) {
                return Err(fail(format!(
                    "{}.hostPath: {} overlaps {} ({}), which a role can write",
                    m.entry,
                    m.host.display(),
                    w.path.display(),
                    w.field
                )));
            }
            if !CDI_HOST_ROOTS.iter().any(|root| m.host.starts_with(root)) {
                return Err(fail(format!(
                    "{}.hostPath: {} is outside where a driver's files live ({}); bind it with ro_binds if you mean it",
                    m.entry,
                    m.host.display(),
                    CDI_HOST_ROOTS.join(", ")
                )));
            }
            if let Some((f, g)) = guarded.iter().find(|(_, g)| contains(g, &m.host) || contains(&m.host, g)) {
                return Err(fail(format!(
                    "{}.hostPath: {} overlaps {} ({f}), which no spec may hand a role",
                    m.entry,
                    m.host.display(),
                    g.display()
                )));
            }
            if let Some(dst) = ro_dsts.iter().find(|dst| contains(dst, &m.inside) || contains(&m.inside, dst)) {
                return Err(fail(format!(
                    "{}.containerPath: {} overlaps the ro_binds destination {}: a spec may not shadow the config's binds",
                    m.entry,
                    m.inside.display(),
                    dst.display()
                )));
            }
            if m.host == m.inside && in_system_view(&m.host) {
                out.in_view.push(m.inside.clone());
                continue;
            }
            if reserved_inside(&m.inside) {
                out.left_out.push((
                    m.entry.clone(),
                    format!(
                        "{} is in the sandbox's own layout (/etc, /run, /dev, /tmp are sealnode's)",
                        m.inside.display()
                    ),
                ));
                continue;
            }
            // Into the system view only the same file at the same path (in view, above): a spec
            // adds files, it never replaces or covers /usr's, libc included (tests/devices.rs:
            // bad_cdi_specs_are_config_errors_naming_the_spec_and_entry).
            if let Some(sys) = SYSTEM_RO.iter().find(|s| m.inside.starts_with(s) || Path::new(s).starts_with(&m.inside))
            {
                return Err(fail(format!(
                    "{}.containerPath: {} would replace or cover {} of the read-only system view; a spec may add files, not replace the host's (install the driver on the host, or bind it elsewhere)",
                    m.entry,
                    m.inside.display(),
                    sys
                )));
            }
            out.binds.push((m.entry.clone(), Bind { src: m.host.clone(), dst: Some(m.inside.clone()), exec: m.exec }));
        }
        out.edits = edits;
        Ok(out)
    }

    /// What sealnode trusts (this config, every policy file, its state and runtime dirs) may
    /// not lie in or below a directory a role can write: the role could rewrite it. Rootless,
    /// the roles are the launcher's own uid, so the owner checks cannot catch this; this check
    /// does, in both modes (tests/gate.rs: nothing_sealnode_trusts_may_live_in_a_role_writable_dir).
    fn check_trusted_outside_roles(&self) -> Result<()> {
        let mounts = crate::os::trusted::MountTable::read();
        let mut trusted: Vec<(String, &Path)> = vec![
            ("(config file)".into(), self.file.as_path()),
            ("cell.state_dir".into(), self.cell.state_dir.as_path()),
            ("cell.runtime_dir".into(), self.cell.runtime_dir.as_path()),
        ];
        for role in Role::ALL {
            trusted.push((format!("{role}.seccomp"), self.role(role).seccomp.as_path()));
            trusted.push((format!("{role}.landlock"), self.role(role).landlock.as_path()));
            if let Some(d) = &self.role(role).devices_from {
                trusted.push((format!("{role}.devices_from.cdi"), d.cdi.as_path()));
            }
        }
        let writable: Vec<RolePath> =
            Role::ALL.iter().flat_map(|r| self.host_paths(*r)).filter(|p| p.writable).collect();
        // Each as named, and where its links lead (a ConfigMap's file is in a timestamped dir
        // beside the link: a role-writable dir there would hold the real file).
        let real: Vec<(String, PathBuf)> =
            trusted.iter().filter_map(|(f, p)| Some((f.clone(), std::fs::canonicalize(p).ok()?))).collect();
        let named = trusted.iter().map(|(f, p)| (f.as_str(), *p));
        for (field, path) in named.chain(real.iter().map(|(f, p)| (f.as_str(), p.as_path()))) {
            for RolePath { field: wf, path: w, .. } in &writable {
                if contains(w, path) {
                    return Err(self.err(
                        field,
                        format!(
                            "{} is inside {} ({wf}), which a role can write; keep what sealnode trusts outside every role's writable dirs",
                            path.display(),
                            w.display()
                        ),
                    ));
                }
            }
        }
        // A role's credential where its links lead (a Secret's file is beside its link): not
        // in anything another role has bound, nor in a dir any role can write (review: a
        // link to a credential in the engine's writable model dir passed the check by name).
        for role in Role::ALL {
            let Some(c) = &self.role(role).credential else { continue };
            let field = format!("{role}.credential");
            // Not in the system view every role reads (tests/check_run.rs:
            // a_credential_another_role_can_reach_is_refused_by_check_and_run).
            let real = std::fs::canonicalize(c).unwrap_or_else(|_| c.clone());
            // Nor shown elsewhere by a mount (a bind of it or of a dir above it, an overlay):
            // one name and one link say nothing of mounts (tests/check_run.rs:
            // a_credential_or_key_bound_into_the_model_dir_is_refused).
            if let Some((at, seen)) = self.shown_to_a_role(&mounts, &real, &field) {
                return Err(self.err(
                    &field,
                    format!(
                        "{} is also shown at {} by a mount (a bind of it or of a directory above it, or an overlay), inside {seen}: a role could read it there; remove that mount",
                        real.display(),
                        at.display()
                    ),
                ));
            }
            if let Some(s) = SYSTEM_RO.iter().find(|s| c.starts_with(s) || real.starts_with(s)) {
                return Err(self.err(
                    &field,
                    format!(
                        "{} is under {s}, which every role sees read-only; keep the credential outside it (e.g. /etc/sealnode/credential)",
                        c.display()
                    ),
                ));
            }
            for other in Role::ALL {
                for RolePath { field: of, path: p, writable, .. } in self.host_paths(other) {
                    let own = other == role && of == field;
                    if own || !(writable || other != role) {
                        continue;
                    }
                    let bound = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
                    if contains(&bound, &real) || contains(p, &real) {
                        return Err(self.err(
                            &field,
                            format!(
                                "{} (where {} leads) is inside {} ({of}), which {}; the credential reaches the node only through `credential`",
                                real.display(),
                                c.display(),
                                p.display(),
                                if writable { "a role can write" } else { "another role can read" }
                            ),
                        ));
                    }
                }
            }
        }
        // The state dir holds the attestation key: no role may see it, through the system view
        // (tests/attest.rs: a_state_dir_in_the_system_view_is_refused) ...
        let real = std::fs::canonicalize(&self.cell.state_dir).unwrap_or_else(|_| self.cell.state_dir.clone());
        if let Some(s) = SYSTEM_RO.iter().find(|s| self.cell.state_dir.starts_with(s) || real.starts_with(s)) {
            return Err(self.err(
                "cell.state_dir",
                format!(
                    "{} is under {s}, which every role sees read-only; the state dir holds the attestation key (use /var/lib/sealnode)",
                    self.cell.state_dir.display()
                ),
            ));
        }
        // Shown to no role by a mount, at load too (`exec`, `check`), not only at the start that
        // signs (tests/check_run.rs: a_credential_or_key_bound_into_the_model_dir_is_refused):
        // the state dir first, since a key made later (`attest init` while the cell runs)
        // would be there at once; then the key itself, with one name.
        let state = std::fs::canonicalize(&self.cell.state_dir).unwrap_or_else(|_| self.cell.state_dir.clone());
        if let Some((at, seen)) = self.shown_to_a_role(&mounts, &state, "") {
            return Err(self.err(
                "cell.state_dir",
                format!(
                    "{} is also shown at {} by a mount (a bind of it or of a directory above it, or an overlay), inside {seen}: a role could read the attestation key there; remove that mount",
                    self.cell.state_dir.display(),
                    at.display()
                ),
            ));
        }
        let key = crate::layout::attest_key_path(&self.cell.state_dir);
        if let Ok(md) = std::fs::symlink_metadata(&key) {
            let real = std::fs::canonicalize(&key).unwrap_or(key.clone());
            let why = if md.nlink() != 1 {
                Some(format!("has {} hard links", md.nlink()))
            } else {
                self.shown_to_a_role(&mounts, &real, "")
                    .map(|(at, seen)| format!("is also shown at {} by a mount, inside {seen}", at.display()))
            };
            if let Some(why) = why {
                return Err(self.err(
                    "cell.state_dir",
                    format!(
                        "the attestation key {} {why}: a role could read it there; remove that, and rotate the key",
                        key.display()
                    ),
                ));
            }
        }
        // ... or through any of its binds (after the writable dirs, whose message is the more
        // specific one).
        for RolePath { field, path, .. } in Role::ALL.iter().flat_map(|r| self.host_paths(*r)) {
            if contains(path, &self.cell.state_dir) {
                return Err(self.err(
                    "cell.state_dir",
                    format!(
                        "{} is inside {} ({field}), which a role sees; the state dir holds the attestation key and must be outside every role's view",
                        self.cell.state_dir.display(),
                        path.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The places a role sees, as the host names them, with what holds each: every role's
    /// binds, model dir, scratch and credential (but the field `except`, a file's own) and the
    /// system view (os::trusted::MountTable::shown_within; the gate's measurement takes the same list).
    pub fn seen_by_roles(&self, except: &str) -> Vec<(PathBuf, String)> {
        let bound = Role::ALL.iter().flat_map(|r| self.host_paths(*r)).filter(|p| p.field != except);
        bound
            .map(|p| (p.path.to_path_buf(), p.field))
            .chain(SYSTEM_RO.iter().map(|s| (PathBuf::from(s), format!("{s}, which every role sees"))))
            .collect()
    }

    /// Where the mount table shows `real` (no symlink in its path) at a place a role sees.
    fn shown_to_a_role(
        &self,
        mounts: &crate::os::trusted::MountTable,
        real: &Path,
        except: &str,
    ) -> Option<(PathBuf, String)> {
        mounts.shown_within(real, &self.seen_by_roles(except))
    }

    /// Which host ids each role runs as: a user name is looked up in the user database (at
    /// load only: [`Config::role_ids`] after).
    fn resolve_role_ids(&self, role: Role, inv: &Invoker) -> Result<Ids> {
        if !inv.rootful() {
            return Ok(Ids { uid: inv.uid, gid: inv.gid });
        }
        let Some(u) = &self.cell.rootful else {
            return Err(self.err(
                "cell.rootful",
                "required when sealnode runs as root: name an unprivileged user per role (engine = \"sealnode-engine\", node = \"sealnode-node\")",
            ));
        };
        let (field, spec) = match role {
            Role::Engine => ("cell.rootful.engine", &u.engine),
            Role::Node => ("cell.rootful.node", &u.node),
        };
        let ids = match parse_user_spec(spec).map_err(|r| self.err(field, r))? {
            UserSpec::Ids(ids) => ids,
            UserSpec::Name(n) => match nix::unistd::User::from_name(&n) {
                Ok(Some(u)) => Ids { uid: u.uid.as_raw(), gid: u.gid.as_raw() },
                Ok(None) => return Err(self.err(field, format!("no such user {n:?} (create it: useradd --system --no-create-home --shell /usr/sbin/nologin {n})"))),
                Err(e) => return Err(self.err(field, format!("cannot look up user {n:?}: {e}"))),
            },
        };
        if ids.uid == 0 || ids.gid == 0 {
            return Err(self.err(field, "must be an unprivileged user (uid and gid not 0)"));
        }
        Ok(ids)
    }

    /// A role's rlimits are set inside its user namespace, where no hard limit can be raised:
    /// each must be within this process's own hard limit, or the sandbox would fail with EPERM
    /// at every start; `check` and `run` both refuse it (tests/check_run.rs:
    /// an_rlimit_above_the_launchers_hard_limit_is_refused_by_both).
    fn check_rlimits_within_the_launchers(&self) -> Result<()> {
        use nix::sys::resource::{getrlimit, Resource};
        for role in Role::ALL {
            let l = &self.role(role).rlimits;
            for (name, res, value, unit) in [
                ("nofile", Resource::RLIMIT_NOFILE, l.nofile, 1),
                ("nproc", Resource::RLIMIT_NPROC, l.nproc, 1),
                ("fsize_mb", Resource::RLIMIT_FSIZE, l.fsize_mb, 1 << 20),
                ("memlock_kb", Resource::RLIMIT_MEMLOCK, l.memlock_kb, 1 << 10),
            ] {
                let Ok((_, hard)) = getrlimit(res) else { continue };
                if hard != libc::RLIM_INFINITY && value.saturating_mul(unit) > hard {
                    return Err(self.err(
                        format!("{role}.rlimits.{name}"),
                        format!(
                            "{value} is above sealnode's own hard limit ({}), which no role can raise: lower it, or \
                             raise sealnode's (the unit's Limit{}=, or ulimit -H)",
                            in_units(hard, unit),
                            match name {
                                "nofile" => "NOFILE",
                                "nproc" => "NPROC",
                                "fsize_mb" => "FSIZE",
                                _ => "MEMLOCK",
                            }
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Host checks: files exist, no symlinks on role paths, ownership and modes. Returns the
    /// host ids each role runs as: looked up here, once, or the `running` config's.
    pub(super) fn check_host(&self, inv: &Invoker, running: Option<&Config>) -> Result<[Ids; 2]> {
        self.check_control_uids(&crate::os::overflow::Overflow::read())?;
        self.check_trusted_outside_roles()?;
        self.check_rlimits_within_the_launchers()?;
        let ids = match running {
            None => [self.resolve_role_ids(Role::Engine, inv)?, self.resolve_role_ids(Role::Node, inv)?],
            // Rootless, the roles run as sealnode's own user whatever cell.rootful says.
            Some(r) if !inv.rootful() || r.cell.rootful == self.cell.rootful => r.loaded("cell.rootful")?.ids,
            Some(_) => {
                return Err(self.err(
                    "cell.rootful",
                    "changed, but the running cell's user namespace maps the old users (a reload looks no user up); restart sealnode to apply it",
                ))
            }
        };
        if inv.rootful() && ids[0] == ids[1] {
            return Err(self.err("cell.rootful.node", "engine and node must run as different users"));
        }
        for (field, dir) in [("cell.state_dir", &self.cell.state_dir), ("cell.runtime_dir", &self.cell.runtime_dir)] {
            self.check_own_dir(field, dir, inv)?;
        }
        if let Some(t) = &self.cell.tpm {
            if let Some(tool) =
                crate::layout::TPM_QUOTE_TOOLS.iter().find(|t| !Path::new(crate::layout::TPM_TOOLS).join(t).is_file())
            {
                return Err(self.err(
                    "cell.tpm",
                    format!("{}/{tool} is missing: install Debian's tpm2-tools", crate::layout::TPM_TOOLS),
                ));
            }
            if let Some(dev) = t.tcti.strip_prefix("device:") {
                use std::os::unix::fs::FileTypeExt;
                match std::fs::metadata(dev) {
                    Ok(m) if m.file_type().is_char_device() => {}
                    Ok(_) => return Err(self.err("cell.tpm.tcti", format!("{dev} is not a character device"))),
                    Err(e) => {
                        return Err(self.err(
                            "cell.tpm.tcti",
                            format!(
                                "{dev}: {e} (no TPM here? under the unit, see docs/attestation.md for the drop-in)"
                            ),
                        ))
                    }
                }
            }
        }
        for role in Role::ALL {
            let r = self.role(role);
            for p in self.host_paths(role) {
                self.check_role_path(role, &p, ids[role as usize], inv)?;
            }
            for (i, b) in r.ro_binds.iter().enumerate() {
                if b.src.starts_with("/proc") {
                    return Err(self.err(
                        format!("{role}.ro_binds[{i}].src"),
                        "the host's /proc shows the host's processes; each role has its own /proc",
                    ));
                }
                if let Some(why) = system_mount_point_problem(b.inside(), b.src.is_dir()) {
                    return Err(self.err(format!("{role}.ro_binds[{i}].dst"), why));
                }
            }
            for (i, d) in r.devices.iter().enumerate() {
                if let Some(link) = symlink_on_the_way(d) {
                    return Err(self.err(
                        format!("{role}.devices[{i}]"),
                        format!("{} is a symlink on the way to {}", link.display(), d.display()),
                    ));
                }
                let md = std::fs::symlink_metadata(d)
                    .map_err(|e| self.err(format!("{role}.devices[{i}]"), format!("{}: {e}", d.display())))?;
                use std::os::unix::fs::FileTypeExt;
                if !(md.file_type().is_char_device() || md.file_type().is_block_device()) {
                    return Err(
                        self.err(format!("{role}.devices[{i}]"), format!("{} is not a device node", d.display()))
                    );
                }
            }
        }
        Ok(ids)
    }

    /// Open a role path without following symlinks and check it (type, mode, owner) on that
    /// very descriptor. Returns its metadata and the path it was reached by, so the caller
    /// binds that path and records (dev, inode) of exactly what was checked: a path swapped
    /// later is caught in the child (ESTALE). At every start (the path may have changed since
    /// load: a Secret volume's update); the role's ids are the loaded ones.
    pub fn checked_role_path(&self, role: Role, p: &RolePath, inv: &Invoker) -> Result<(std::fs::Metadata, PathBuf)> {
        self.check_role_path(role, p, self.role_ids(role)?, inv)
    }

    fn check_role_path(
        &self,
        role: Role,
        p: &RolePath,
        owner: Ids,
        inv: &Invoker,
    ) -> Result<(std::fs::Metadata, PathBuf)> {
        let (field, path, writable) = (p.field.as_str(), p.path, p.writable);
        let (md, real) = self.role_path_stat(field, path, p.kind, inv)?;
        let path = real.as_path();
        match p.kind {
            PathKind::Dir if !md.is_dir() => {
                return Err(self.err(field.to_string(), format!("{} is not a directory", path.display())))
            }
            PathKind::Secret if !md.is_file() => {
                return Err(self.err(field.to_string(), format!("{} is not a regular file", path.display())))
            }
            _ => {}
        }
        let mode = md.mode() & 0o7777;
        if mode & 0o022 != 0 {
            return Err(self.err(
                field.to_string(),
                format!(
                    "{} is writable by group or others (mode {:o}); make it 0755/0700 or stricter",
                    path.display(),
                    mode
                ),
            ));
        }
        if writable {
            if md.uid() != owner.uid {
                return Err(self.err(
                    field.to_string(),
                    format!(
                        "{} is owned by uid {} but the {role} runs as uid {}; chown it to the role's user",
                        path.display(),
                        md.uid(),
                        owner.uid
                    ),
                ));
            }
        } else if md.uid() != 0 && md.uid() != inv.uid && md.uid() != owner.uid {
            return Err(self.err(
                field.to_string(),
                format!(
                    "{} is owned by uid {}, another user; it must be owned by root, the launcher or the role",
                    path.display(),
                    md.uid()
                ),
            ));
        }
        if p.kind == PathKind::Secret && mode & 0o077 != 0 {
            return Err(self.err(
                field.to_string(),
                format!("{} is readable by group or others (mode {:o}); chmod 0400", path.display(), mode),
            ));
        }
        // A second name is a way in no path check sees: a hard link in the engine's model dir
        // is the engine's to read (rootless, the roles share the launcher's uid) (tests/check_run.rs:
        // a_credential_another_role_can_reach_is_refused_by_check_and_run; unit test:
        // config::tests::a_credential_with_a_second_name_is_refused_at_every_start).
        if p.kind == PathKind::Secret && md.nlink() != 1 {
            return Err(self.err(
                field.to_string(),
                format!(
                    "{} has {} hard links; another name for it (in a role's dir) would hand it to that role: keep it one file with one name",
                    path.display(),
                    md.nlink()
                ),
            ));
        }
        Ok((md, real))
    }

    /// sealnode's own dirs (receipts, control socket): if present, a real directory owned by
    /// the launcher (or root) and writable by nobody else. Otherwise another local user could
    /// swap files (or a symlink for the control socket) under sealnode's feet.
    fn check_own_dir(&self, field: &str, dir: &Path, inv: &Invoker) -> Result<()> {
        // The same walk and checks `run` does when it opens the dir (trusted::own_dir).
        crate::os::trusted::check_own_dir(dir, inv.uid).map_err(|e| self.err(field, e))
    }

    /// Stat a role path, refusing symlinks in any component; and the path it was reached by.
    /// The credential alone may be reached as a Kubernetes Secret volume's file is (`credential
    /// -> ..data/credential`): through the links and the checked directories the config itself
    /// may be read through (os::trusted::resolve), to the path with no symlink in it that is
    /// then bound (unit test: config::tests::a_credential_in_a_secret_volume_is_bound_from_its_real_path).
    fn role_path_stat(
        &self,
        field: &str,
        path: &Path,
        kind: PathKind,
        inv: &Invoker,
    ) -> Result<(std::fs::Metadata, PathBuf)> {
        let stat = |fd: std::os::fd::OwnedFd, at: &Path| {
            std::fs::File::from(fd).metadata().map_err(|e| self.err(field, format!("{}: {e}", at.display())))
        };
        match crate::os::sys::open_path_no_symlinks(path) {
            Ok(fd) => Ok((stat(fd, path)?, path.to_path_buf())),
            Err(nix::errno::Errno::ELOOP) if kind == PathKind::Secret => {
                let (fd, real) = crate::os::trusted::resolve(path, inv.uid).map_err(|e| self.err(field, e))?;
                Ok((stat(fd, &real)?, real))
            }
            Err(nix::errno::Errno::ELOOP) => {
                Err(self.err(field, format!("{} is reached through a symlink; name the real path", path.display())))
            }
            Err(nix::errno::Errno::ENOENT) => Err(self.err(field, format!("{} does not exist", path.display()))),
            Err(e) => Err(self.err(field, format!("{}: {}", path.display(), e.desc()))),
        }
    }
}
