//! The checks that need no filesystem: every field's form, the fields that must agree, the
//! overlaps of bound paths ([`Config::parse`] runs them).

use std::path::Path;

use super::types::{Config, Ids, Role, RolePath};
use crate::error::Result;
use crate::layout::{RESERVED_INSIDE, RUNTIME_ATTEST_DIR};

/// Names that must never reach a role: proxies would route loopback engine calls away.
pub fn is_proxy_var(name: &str) -> bool {
    name.to_ascii_lowercase().ends_with("_proxy")
}

fn valid_env_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(|c: char| c.is_ascii_digit())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
}

/// Whether a path inside a role lies in the layout sealnode builds itself.
pub fn reserved_inside(inside: &Path) -> bool {
    RESERVED_INSIDE.iter().any(|r| inside == Path::new(r) || (*r != "/" && inside.starts_with(r)))
}

/// Does `a` contain `b` (or equal it), path-component-wise?
pub(super) fn contains(a: &Path, b: &Path) -> bool {
    b.starts_with(a)
}

impl Config {
    pub(super) fn check_pure(&self) -> Result<()> {
        let h = &self.cell.hostname;
        if h.is_empty() || h.len() > 64 || !h.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.') {
            return Err(self.err("cell.hostname", "must be 1-64 characters of [A-Za-z0-9.-]"));
        }
        self.abs("cell.state_dir", &self.cell.state_dir)?;
        if let Some(c) = &self.cell.cgroup {
            let ok = c.is_relative()
                && c.components().all(|p| matches!(p, std::path::Component::Normal(_)))
                && c.components().next().is_some();
            if !ok {
                return Err(self.err(
                    "cell.cgroup",
                    "must be a path relative to /sys/fs/cgroup without `..`, e.g. \"sealnode/node1\"",
                ));
            }
        }
        if self.cell.stop_timeout_s == 0 || self.cell.stop_timeout_s > 3600 {
            return Err(self.err("cell.stop_timeout_s", "must be between 1 and 3600"));
        }
        if self.cell.engine_hold_s > 3600 {
            return Err(self.err("cell.engine_hold_s", "must be between 0 and 3600 (seconds)"));
        }
        if self.cell.engine_replay_kb > 16384 {
            return Err(self.err("cell.engine_replay_kb", "must be between 0 and 16384 (KiB)"));
        }
        if self.cell.drain_timeout_s > 3600 {
            return Err(self.err("cell.drain_timeout_s", "must be between 0 and 3600 (seconds)"));
        }
        if !(5..=600).contains(&self.cell.preflight_timeout_s) {
            return Err(self.err("cell.preflight_timeout_s", "must be between 5 and 600"));
        }
        if self.cell.egress_max_connections == 0 || self.cell.egress_max_connections > 65536 {
            return Err(self.err("cell.egress_max_connections", "must be between 1 and 65536"));
        }
        if self.cell.egress_idle_timeout_s == 0 || self.cell.egress_idle_timeout_s > 7 * 86400 {
            return Err(self.err("cell.egress_idle_timeout_s", "must be between 1 and 604800 (seconds)"));
        }
        if self.cell.egress_connect_timeout_s == 0 || self.cell.egress_connect_timeout_s > 3600 {
            return Err(self.err("cell.egress_connect_timeout_s", "must be between 1 and 3600 (seconds)"));
        }
        self.abs("cell.runtime_dir", &self.cell.runtime_dir)?;
        if let Some(t) = &self.cell.tpm {
            t.check().map_err(|(field, why)| self.err(field, why))?;
            // A software TPM's ports are the TPM: a role that can connect to them can reset
            // PCR 23, quote with the attestation key, or evict it. So no egress may connect to
            // them at any address: 0.0.0.0, v4-mapped and the host's own addresses reach
            // loopback too (unit test:
            // config::tests::a_tpm_is_a_local_device_or_a_loopback_software_tpm).
            if let Some(ports) = t.loopback_ports() {
                for (i, e) in self.node.egress.iter().enumerate() {
                    let to = e.connect.as_deref().and_then(|c| c.parse::<std::net::SocketAddr>().ok());
                    if let Some(a) = to.filter(|a| ports.contains(&a.port())) {
                        return Err(self.err(
                            format!("node.egress[{i}].connect"),
                            format!("{a} is the TPM of cell.tpm ({}): a role that reaches it can reset PCR 23 and quote with the attestation key", t.tcti),
                        ));
                    }
                }
            }
        }
        if let Some(u) = &self.cell.rootful {
            parse_user_spec(&u.engine).map_err(|r| self.err("cell.rootful.engine", r))?;
            parse_user_spec(&u.node).map_err(|r| self.err("cell.rootful.node", r))?;
            if u.engine == u.node {
                return Err(self.err("cell.rootful.node", "engine and node must run as different users"));
            }
        }
        for role in Role::ALL {
            self.check_role_pure(role)?;
        }
        self.check_overlaps()?;
        self.check_writable_outside_statements()?;
        self.cross_checks()
    }

    /// Where the config says the same thing twice, the two must agree (each of these otherwise
    /// runs, and fails as "engine exited with status 1" or a node looping on its gateway's
    /// name): the engine's `--port` (or `OLLAMA_HOST`) and `engine.port`; the node's
    /// engine address (`OLLAMA_HOST`, `FRUTEBOX_`/`STEVAI_` `OLLAMA_HOST`/`LLAMACPP_HOST`) and
    /// `engine.port`; the node's `--gateway-url` and a declared `egress` host and port.
    fn cross_checks(&self) -> Result<()> {
        let e = &self.engine;
        // Required of the engine (check_role_pure); nothing to compare without it.
        let Some(port) = e.port else { return Ok(()) };
        for (i, a) in e.command.iter().enumerate().skip(1) {
            let value = match a.strip_prefix("--port=") {
                Some(v) => Some((i, v)),
                None if a == "--port" => e.command.get(i + 1).map(|v| (i + 1, v.as_str())),
                None => None,
            };
            if let Some((at, v)) = value {
                if v.parse::<u32>().ok() != Some(port) {
                    return Err(self.err(
                        format!("engine.command[{at}]"),
                        format!("the engine listens on --port {v}, but engine.port is {port}: make them the same"),
                    ));
                }
            }
        }
        if let Some(h) = e.env.set.get("OLLAMA_HOST") {
            if let Some(p) = url_port(h).filter(|p| *p != port) {
                return Err(self.err(
                    "engine.env.set.OLLAMA_HOST",
                    format!("the engine listens on port {p} ({h}), but engine.port is {port}: make them the same"),
                ));
            }
        }
        let n = &self.node;
        for k in [
            "OLLAMA_HOST",
            "FRUTEBOX_OLLAMA_HOST",
            "STEVAI_OLLAMA_HOST",
            "FRUTEBOX_LLAMACPP_HOST",
            "STEVAI_LLAMACPP_HOST",
        ] {
            let Some(h) = n.env.set.get(k) else { continue };
            if let Some(p) = url_port(h).filter(|p| *p != port) {
                return Err(self.err(
                    format!("node.env.set.{k}"),
                    format!(
                        "the node calls the engine at port {p} ({h}), but the engine's port, the one the cell forwards, \
                         is engine.port = {port}"
                    ),
                ));
            }
        }
        for (i, a) in n.command.iter().enumerate().skip(1) {
            let value = match a.strip_prefix("--gateway-url=") {
                Some(v) => Some((i, v)),
                None if a == "--gateway-url" => n.command.get(i + 1).map(|v| (i + 1, v.as_str())),
                None => None,
            };
            let Some((at, url)) = value else { continue };
            let Some((host, port)) = url_host_port(url) else { continue };
            if !n.egress.iter().any(|g| g.host.eq_ignore_ascii_case(&host) && g.port == port) {
                let declared: Vec<String> = n.egress.iter().map(|g| format!("{}:{}", g.host, g.port)).collect();
                return Err(self.err(
                    format!("node.command[{at}]"),
                    format!(
                        "the node's gateway is {host}:{port} ({url}), which node.egress does not declare ({}): the \
                         node could not reach it; add {{ host = \"{host}\", port = {port} }} to node.egress",
                        if declared.is_empty() { "no egress at all".to_string() } else { declared.join(", ") }
                    ),
                ));
            }
        }
        Ok(())
    }

    fn abs(&self, field: &str, p: &Path) -> Result<()> {
        if !p.is_absolute() {
            return Err(self.err(field, format!("{} is a relative path; use an absolute path", p.display())));
        }
        if p.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
            return Err(self.err(field, format!("{} contains '..'", p.display())));
        }
        Ok(())
    }

    fn check_role_pure(&self, role: Role) -> Result<()> {
        self.check_role_program(role)?;
        self.check_role_paths(role)?;
        self.check_role_limits(role)?;
        self.check_role_env(role)?;
        self.check_role_egress(role)?;
        self.check_role_ready(role)?;
        Ok(())
    }

    /// A role's program: command, pin, port.
    fn check_role_program(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        match r.command.first() {
            None => return Err(self.err(f("command"), "must name a program")),
            Some(p) => self.abs(&f("command[0]"), Path::new(p))?,
        }
        if let Some(d) = &r.sha256 {
            if d.len() != 64 || !d.chars().all(|c| c.is_ascii_hexdigit()) {
                return Err(self.err(f("sha256"), "must be 64 hexadecimal digits"));
            }
        }
        match (role, r.port) {
            (Role::Engine, None) => {
                return Err(self.err(f("port"), "the engine must declare the TCP port it listens on"))
            }
            (Role::Engine, Some(p)) if !(1..=65535).contains(&p) => {
                return Err(self.err(f("port"), format!("{p} is out of range 1-65535")))
            }
            (Role::Node, Some(_)) => return Err(self.err(f("port"), "only the engine listens; the node has no port")),
            _ => {}
        }
        Ok(())
    }

    /// A role's paths: policies, scratch, models, credential, extra binds, devices.
    fn check_role_paths(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        self.abs(&f("seccomp"), &r.seccomp)?;
        self.abs(&f("landlock"), &r.landlock)?;
        self.abs(&f("scratch"), &r.scratch)?;
        match (role, &r.models) {
            (Role::Engine, Some(m)) => self.abs(&f("models"), m)?,
            (Role::Node, Some(_)) => return Err(self.err(f("models"), "only the engine sees models")),
            _ => {}
        }
        if role == Role::Node && r.models_writable {
            return Err(self.err(f("models_writable"), "only the engine has a model dir"));
        }
        match (role, &r.credential) {
            (Role::Node, Some(c)) => self.abs(&f("credential"), c)?,
            (Role::Engine, Some(_)) => {
                return Err(self.err(f("credential"), "the engine never sees the node's credential"))
            }
            _ => {}
        }
        for (i, b) in r.ro_binds.iter().enumerate() {
            self.abs(&f(&format!("ro_binds[{i}].src")), &b.src)?;
            self.abs(&f(&format!("ro_binds[{i}].dst")), b.inside())?;
            let inside = b.inside();
            if reserved_inside(inside) {
                return Err(self.err(
                    f(&format!("ro_binds[{i}].dst")),
                    format!("{} is reserved for the sandbox's own layout", inside.display()),
                ));
            }
            for other in Role::ALL {
                if let Some(c) = &self.role(other).credential {
                    if contains(&b.src, c) || contains(c, &b.src) {
                        return Err(self.err(
                            f(&format!("ro_binds[{i}].src")),
                            format!(
                                "{} overlaps {other}.credential {}; the credential reaches the node only through `credential`",
                                b.src.display(),
                                c.display()
                            ),
                        ));
                    }
                }
            }
        }
        for (i, d) in r.devices.iter().enumerate() {
            self.abs(&f(&format!("devices[{i}]")), d)?;
            if !d.starts_with("/dev/") {
                return Err(self.err(f(&format!("devices[{i}]")), "devices must live under /dev/"));
            }
        }
        if let Some(d) = &r.devices_from {
            self.abs(&f("devices_from.cdi"), &d.cdi)?;
            if d.devices.is_empty() {
                return Err(
                    self.err(f("devices_from.devices"), "name at least one device, e.g. [\"nvidia.com/gpu=0\"]")
                );
            }
            for (i, q) in d.devices.iter().enumerate() {
                crate::config::cdi::parse_qualified(q)
                    .map_err(|e| self.err(f(&format!("devices_from.devices[{i}]")), e))?;
            }
        }
        Ok(())
    }

    /// A role's sizes, restart limits.
    fn check_role_limits(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        if r.tmp_size_mb == 0 || r.tmp_size_mb > 65536 {
            return Err(self.err(f("tmp_size_mb"), "must be between 1 and 65536"));
        }
        if r.scratch_max_mb.is_some_and(|m| m == 0 || m > 1024 * 1024) {
            return Err(self.err(f("scratch_max_mb"), "must be between 1 and 1048576 (MiB)"));
        }
        if r.restart_limit.burst == 0 || r.restart_limit.burst > 1000 {
            return Err(self.err(f("restart_limit.burst"), "must be between 1 and 1000"));
        }
        if r.restart_limit.interval_s == 0 || r.restart_limit.interval_s > 86400 {
            return Err(self.err(f("restart_limit.interval_s"), "must be between 1 and 86400 (seconds)"));
        }
        // Each field is reported where it is written: the role's own or the cell's default.
        let l = self.limits(role);
        let at = |k: &str| self.limit_field(role, k);
        if let Some(m) = l.memory_max_mb {
            if !(16..=16 * 1024 * 1024).contains(&m) {
                return Err(self.err(at("memory_max_mb"), "must be between 16 and 16777216 (MiB)"));
            }
        }
        if let Some(h) = l.memory_high_mb {
            if !(16..=16 * 1024 * 1024).contains(&h) || l.memory_max_mb.is_some_and(|m| h > m) {
                return Err(
                    self.err(at("memory_high_mb"), "must be between 16 and 16777216 (MiB) and not above memory_max_mb")
                );
            }
        }
        if l.memory_swap_max_mb.is_some_and(|s| s > 16 * 1024 * 1024) {
            return Err(self.err(at("memory_swap_max_mb"), "must be at most 16777216 (MiB)"));
        }
        if let Some(p) = l.pids_max {
            if !(8..=4_194_304).contains(&p) {
                return Err(self.err(at("pids_max"), "must be between 8 and 4194304 (a role needs a few processes)"));
            }
        }
        if let Some(c) = l.cpu_max {
            if !(c.is_finite() && (0.01..=4096.0).contains(&c)) {
                return Err(self.err(at("cpu_max"), "must be a number of CPUs between 0.01 and 4096"));
            }
        }
        for (k, w) in [("cpu_weight", l.cpu_weight), ("io_weight", l.io_weight)] {
            if w.is_some_and(|w| !(1..=10000).contains(&w)) {
                return Err(self.err(at(k), "must be between 1 and 10000"));
            }
        }
        for (i, io) in l.io_max.iter().enumerate() {
            let k = format!("{}[{i}]", at("io_max"));
            self.abs(&format!("{k}.device"), &io.device)?;
            if [io.rbps, io.wbps, io.riops, io.wiops].iter().all(Option::is_none) {
                return Err(self.err(k, "set at least one of rbps, wbps, riops, wiops"));
            }
            if [io.rbps, io.wbps, io.riops, io.wiops].contains(&Some(0)) {
                return Err(self.err(k, "a cap of 0 would stop the role's I/O; leave the field out for no cap"));
            }
        }
        Ok(())
    }

    /// A role's environment: names only, never a proxy variable.
    fn check_role_env(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        for k in r.env.set.keys() {
            if !valid_env_name(k) {
                return Err(self.err(f(&format!("env.set.{k}")), "not a valid variable name"));
            }
            if is_proxy_var(k) {
                return Err(self.err(
                    f(&format!("env.set.{k}")),
                    "proxy variables never reach a role (they would route loopback engine calls through a proxy)",
                ));
            }
        }
        for (i, k) in r.env.pass.iter().enumerate() {
            if !valid_env_name(k) {
                return Err(self.err(f(&format!("env.pass[{i}]")), format!("{k:?} is not a valid variable name")));
            }
            if is_proxy_var(k) {
                return Err(self.err(
                    f(&format!("env.pass[{i}]")),
                    format!("{k} is a proxy variable; proxies never reach a role"),
                ));
            }
        }
        Ok(())
    }

    /// A role's egress upstreams.
    fn check_role_egress(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        if role == Role::Engine && !r.egress.is_empty() {
            return Err(self.err(f("egress"), "the engine has no egress at all (models are staged by the operator)"));
        }
        let mut seen = std::collections::BTreeSet::new();
        for (i, e) in r.egress.iter().enumerate() {
            let fe = f(&format!("egress[{i}]"));
            let h = &e.host;
            if h.is_empty()
                || h.len() > 253
                || h.parse::<std::net::IpAddr>().is_ok()
                || inet_aton_accepts(h)
                || !h
                    .split('.')
                    .all(|l| !l.is_empty() && l.len() <= 63 && l.chars().all(|c| c.is_ascii_alphanumeric() || c == '-'))
            {
                return Err(self.err(format!("{fe}.host"), format!("{h:?} must be a DNS name (the node dials it; sealnode maps it to a cell-local address in /etc/hosts)")));
            }
            if h == "localhost" {
                return Err(self.err(format!("{fe}.host"), "localhost is the cell's own loopback"));
            }
            if !(1..=65535).contains(&e.port) {
                return Err(self.err(format!("{fe}.port"), format!("{} is out of range 1-65535", e.port)));
            }
            if let Some(c) = &e.connect {
                if c.parse::<std::net::SocketAddr>().is_err() {
                    return Err(self.err(format!("{fe}.connect"), format!("{c:?} must be an ip:port address")));
                }
            }
            if !seen.insert((h.clone(), e.port)) {
                return Err(self.err(fe, format!("{h}:{} is declared twice", e.port)));
            }
        }
        if r.egress.len() > 250 {
            return Err(self.err(f("egress"), "at most 250 upstreams"));
        }
        Ok(())
    }

    /// A role's the engine's readiness check and the rlimits.
    fn check_role_ready(&self, role: Role) -> Result<()> {
        let r = self.role(role);
        let f = |k: &str| format!("{role}.{k}");
        if role == Role::Node && r.ready_set.is_some() {
            return Err(
                self.err(f("ready"), "only the engine has a readiness check; the node starts once the engine is ready")
            );
        }
        if role == Role::Engine {
            let ready = r.ready();
            if !ready.path.starts_with('/') || ready.path.chars().any(|c| c.is_whitespace() || c.is_control()) {
                return Err(self.err(f("ready.path"), "must be an absolute URL path without spaces"));
            }
            if ready.timeout_s == 0 || ready.timeout_s > 3600 {
                return Err(self.err(f("ready.timeout_s"), "must be between 1 and 3600"));
            }
        }
        let l = &r.rlimits;
        for (k, v) in [("nofile", l.nofile), ("nproc", l.nproc), ("fsize_mb", l.fsize_mb)] {
            if v == 0 || v > (1 << 40) {
                return Err(self.err(f(&format!("rlimits.{k}")), "must be a positive, finite number"));
            }
        }
        Ok(())
    }

    /// A dir a role can write (its scratch, a writable model dir) must not be or lie in the
    /// statements' dir sealnode makes in the runtime dir (RUNTIME_ATTEST_DIR), which the node
    /// sees as INSIDE_ATTESTATION_DIR: rootless, the owner checks pass (one uid), and a role
    /// writing there could hand the node a statement sealnode never signed. (A role's dir
    /// holding sealnode's own: check_trusted_outside_roles; one dir named by two fields under
    /// two paths: the run's locks.)
    fn check_writable_outside_statements(&self) -> Result<()> {
        let dir = self.cell.runtime_dir.join(RUNTIME_ATTEST_DIR);
        for w in Role::ALL.iter().flat_map(|r| self.host_paths(*r)).filter(|p| p.writable) {
            if contains(&dir, w.path) {
                return Err(self.err(
                    w.field.clone(),
                    format!(
                        "{} is in {}, sealnode's own dir for the node's statements (in cell.runtime_dir); give the role a dir of its own outside it",
                        w.path.display(),
                        dir.display()
                    ),
                ));
            }
        }
        Ok(())
    }

    /// A writable dir must not overlap any other bound path, in either role.
    fn check_overlaps(&self) -> Result<()> {
        let all: Vec<_> = Role::ALL.iter().flat_map(|r| self.host_paths(*r)).collect();
        for (i, RolePath { field: fa, path: a, writable: wa, .. }) in all.iter().enumerate() {
            for RolePath { field: fb, path: b, writable: wb, .. } in all.iter().skip(i + 1) {
                if (*wa || *wb) && (contains(a, b) || contains(b, a)) {
                    let (wf, wp, of, op) = if *wa { (fa, a, fb, b) } else { (fb, b, fa, a) };
                    return Err(self.err(
                        wf.clone(),
                        format!(
                            "writable {} overlaps {} ({of}); writable dirs must be disjoint from every other bound path",
                            wp.display(),
                            op.display()
                        ),
                    ));
                }
            }
        }
        Ok(())
    }
}

pub(super) enum UserSpec {
    Name(String),
    Ids(Ids),
}

pub(super) fn parse_user_spec(s: &str) -> std::result::Result<UserSpec, String> {
    if let Some((u, g)) = s.split_once(':') {
        let uid = u.parse().map_err(|_| format!("{s:?}: uid must be a number"))?;
        let gid = g.parse().map_err(|_| format!("{s:?}: gid must be a number"))?;
        if uid == 0 || gid == 0 {
            return Err("must be an unprivileged user (uid and gid not 0)".into());
        }
        return Ok(UserSpec::Ids(Ids { uid, gid }));
    }
    if s.is_empty() || !s.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)) {
        return Err(format!("{s:?} is neither a user name nor \"uid:gid\""));
    }
    if s == "root" {
        return Err("must be an unprivileged user, not root".into());
    }
    Ok(UserSpec::Name(s.to_string()))
}

/// The port of `http://host:port`, `host:port` or `:port` (an address as OLLAMA_HOST takes it),
/// if one is given.
fn url_port(s: &str) -> Option<u32> {
    let rest = s.split_once("://").map_or(s, |(_, r)| r);
    let hostport = rest.split('/').next()?;
    let (_, port) = hostport.rsplit_once(':')?;
    port.parse().ok()
}

/// Host and port of a ws://, wss://, http:// or https:// URL (the scheme's port when none is
/// given).
fn url_host_port(url: &str) -> Option<(String, u32)> {
    let (scheme, rest) = url.split_once("://")?;
    let default = match scheme.to_ascii_lowercase().as_str() {
        "ws" | "http" => 80,
        "wss" | "https" => 443,
        _ => return None,
    };
    let authority = rest.split(['/', '?', '#']).next()?;
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(v6) = authority.strip_prefix('[') {
        let (h, after) = v6.split_once(']')?;
        let port = after.strip_prefix(':').map_or(Some(default), |p| p.parse().ok())?;
        return Some((h.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None => Some((authority.to_string(), default)),
    }
}

/// Whether the C library reads `h` as an IPv4 address in one of inet_aton's old forms
/// (`127.1`, `0x7f000001`, `2130706433`): the resolver then never asks /etc/hosts, and the
/// name would bypass the cell's mapping, so such a host is not a DNS name (unit test:
/// config::tests::ipv4_shorthands_are_not_dns_names).
fn inet_aton_accepts(h: &str) -> bool {
    extern "C" {
        // POSIX-less but in every libc sealnode links against (glibc, musl); the libc crate
        // does not declare it.
        fn inet_aton(cp: *const libc::c_char, inp: *mut libc::in_addr) -> libc::c_int;
    }
    let Ok(c) = std::ffi::CString::new(h) else { return false };
    let mut addr = libc::in_addr { s_addr: 0 };
    // SAFETY: a NUL-terminated string and a valid in_addr to write to; inet_aton reads only
    // the string and writes only the address.
    unsafe { inet_aton(c.as_ptr(), &mut addr) != 0 }
}
