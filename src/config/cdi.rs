//! Container Device Interface specs: the driver's own description of a device (the YAML or
//! JSON `nvidia-ctk cdi generate` writes under /etc/cdi or /run/cdi), read into the edits a
//! role gets: the device nodes to bind, the files to bind read-only, the environment.
//!
//! Pure: bytes in, edits or a reason out (the reason names the spec's entry, e.g.
//! `devices[1].containerEdits.deviceNodes[0].path`); the host checks (does the node exist, is
//! it that device) are the caller's. Every field of the CDI schema is known here, and a field
//! this build does not know refuses the spec: a newer spec could carry an edit sealnode would
//! otherwise silently leave out. What sealnode never does with a spec, it says:
//! [`Edits::ignored`] lists the hooks (programs a container runtime runs as root on the host),
//! the extra groups and the Intel RDT class, each with why.

use std::collections::BTreeMap;
use std::path::{Component, Path, PathBuf};

use serde::Deserialize;

/// The CDI spec versions whose schema this module knows (cncf-tags/container-device-interface,
/// `specs-go`): 0.3.0 to 1.0.0. Later minor versions add fields; a spec using one is refused
/// by name, never half-read.
pub const KNOWN_VERSIONS: &[&str] = &["0.3.0", "0.4.0", "0.5.0", "0.6.0", "0.7.0", "0.8.0", "0.9.0", "1.0.0"];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Spec {
    cdi_version: String,
    kind: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    devices: Vec<Device>,
    #[serde(default)]
    container_edits: ContainerEdits,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Device {
    name: String,
    #[serde(default)]
    annotations: BTreeMap<String, String>,
    #[serde(default)]
    container_edits: ContainerEdits,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct ContainerEdits {
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    device_nodes: Vec<DeviceNodeSpec>,
    #[serde(default)]
    hooks: Vec<Hook>,
    #[serde(default)]
    mounts: Vec<MountSpec>,
    #[serde(default, rename = "intelRdt")]
    intel_rdt: Option<serde_norway::Value>,
    #[serde(default, rename = "additionalGids")]
    additional_gids: Vec<u32>,
    #[serde(default)]
    net_devices: Vec<serde_norway::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct DeviceNodeSpec {
    path: PathBuf,
    host_path: Option<PathBuf>,
    #[serde(rename = "type")]
    kind: Option<String>,
    major: Option<i64>,
    minor: Option<i64>,
    file_mode: Option<u32>,
    permissions: Option<String>,
    uid: Option<u32>,
    gid: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct MountSpec {
    host_path: PathBuf,
    container_path: PathBuf,
    #[serde(default)]
    options: Vec<String>,
    #[serde(rename = "type")]
    kind: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Hook {
    hook_name: String,
    path: PathBuf,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: Vec<String>,
    timeout: Option<i64>,
}

/// A device node the spec names: bound at `path`, from `path` on the host (sealnode binds
/// nodes at their host path; a spec that moves one is refused).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeviceNode {
    /// The spec's entry, for errors: `containerEdits.deviceNodes[2]`.
    pub entry: String,
    pub path: PathBuf,
    /// `c` (char), `b` (block) or `u` (char, unbuffered) when the spec says.
    pub kind: Option<char>,
    pub major: Option<u64>,
    pub minor: Option<u64>,
}

/// A file or directory the spec binds: read-only always; executable unless its options say
/// `noexec`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FileMount {
    pub entry: String,
    pub host: PathBuf,
    pub inside: PathBuf,
    pub exec: bool,
}

/// What a role takes from a spec.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Edits {
    /// The spec's kind, e.g. `nvidia.com/gpu`.
    pub kind: String,
    /// The devices taken, fully qualified (`nvidia.com/gpu=0`).
    pub devices: Vec<String>,
    /// Device nodes: the spec-wide ones first, then each device's, each path once.
    pub nodes: Vec<DeviceNode>,
    /// Files and directories, each container path once.
    pub mounts: Vec<FileMount>,
    /// Environment, in the spec's order; a later value for a name replaces an earlier one.
    pub env: Vec<(String, String)>,
    /// Edits sealnode does not apply, each with its entry and why.
    pub ignored: Vec<(String, String)>,
}

/// Split `vendor.com/class=name` into (kind, name), checking CDI's syntax (its parser's):
/// the vendor is a domain name, the class and the device name start and end with a letter or
/// digit and hold letters, digits, `_`, `.`, `-` (the name also `:`) in between.
pub fn parse_qualified(s: &str) -> Result<(&str, &str), String> {
    let Some((kind, name)) = s.split_once('=') else {
        return Err(format!("{s:?} is not a qualified CDI device name (vendor.com/class=name, e.g. nvidia.com/gpu=0)"));
    };
    check_kind(kind).map_err(|e| format!("{s:?}: {e}"))?;
    let ok = name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || "_.-:".contains(c));
    if !ok {
        return Err(format!("{s:?}: the device name {name:?} must be letters, digits, '_', '.', '-' or ':', starting and ending with a letter or digit"));
    }
    Ok((kind, name))
}

fn check_kind(kind: &str) -> Result<(), String> {
    let Some((vendor, class)) = kind.split_once('/') else {
        return Err(format!("the kind {kind:?} must be vendor.com/class"));
    };
    let label = |l: &str| {
        l.len() <= 253
            && l.chars().next().is_some_and(|c| c.is_ascii_alphanumeric())
            && l.chars().last().is_some_and(|c| c.is_ascii_alphanumeric())
            && l.chars().all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c))
    };
    if !vendor.split('.').all(|l| !l.is_empty()) || !label(vendor) || !vendor.contains('.') {
        return Err(format!("the vendor {vendor:?} must be a domain name such as nvidia.com"));
    }
    if !label(class) {
        return Err(format!("the class {class:?} must be letters, digits, '_', '.' or '-'"));
    }
    Ok(())
}

/// An absolute path without `.`/`..` components.
fn clean_abs(p: &Path, what: &str) -> Result<(), String> {
    if !p.is_absolute() {
        return Err(format!("{what} {} is not an absolute path", p.display()));
    }
    if p.components().any(|c| matches!(c, Component::ParentDir | Component::CurDir)) {
        return Err(format!("{what} {} contains '.' or '..'", p.display()));
    }
    Ok(())
}

/// Parse a spec and take `wanted` (qualified names) from it. The error is `entry: reason`
/// (the caller adds the config file and the spec's path).
pub fn edits(bytes: &[u8], wanted: &[String]) -> Result<Edits, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("not UTF-8: {e}"))?;
    let de = serde_norway::Deserializer::from_str(text);
    let spec: Spec = serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." {
            inner
        } else {
            format!("{path}: {inner}")
        }
    })?;
    if !KNOWN_VERSIONS.contains(&spec.cdi_version.as_str()) {
        return Err(format!(
            "cdiVersion: {:?} is not a CDI version this sealnode knows ({}); regenerate the spec or upgrade sealnode",
            spec.cdi_version,
            KNOWN_VERSIONS.join(", ")
        ));
    }
    check_kind(&spec.kind).map_err(|e| format!("kind: {e}"))?;
    let _ = &spec.annotations;
    let mut names = std::collections::BTreeSet::new();
    for (i, d) in spec.devices.iter().enumerate() {
        parse_qualified(&format!("{}={}", spec.kind, d.name)).map_err(|e| format!("devices[{i}].name: {e}"))?;
        if !names.insert(d.name.as_str()) {
            return Err(format!("devices[{i}].name: {:?} is declared twice", d.name));
        }
        let _ = &d.annotations;
    }
    let mut out = Edits { kind: spec.kind.clone(), ..Edits::default() };
    apply(&mut out, &spec.container_edits, "containerEdits")?;
    for w in wanted {
        let (kind, name) = parse_qualified(w)?;
        if kind != spec.kind {
            return Err(format!("the spec describes {:?} devices, not {kind:?} ({w})", spec.kind));
        }
        let Some((i, d)) = spec.devices.iter().enumerate().find(|(_, d)| d.name == name) else {
            let have: Vec<&str> = spec.devices.iter().map(|d| d.name.as_str()).collect();
            return Err(format!("no device {name:?} in the spec ({w}); it has: {}", have.join(", ")));
        };
        if out.devices.iter().any(|x| x == w) {
            return Err(format!("{w} is named twice"));
        }
        out.devices.push(w.clone());
        apply(&mut out, &d.container_edits, &format!("devices[{i}].containerEdits"))?;
    }
    Ok(out)
}

/// One `containerEdits` block into `out`.
fn apply(out: &mut Edits, e: &ContainerEdits, at: &str) -> Result<(), String> {
    if !e.net_devices.is_empty() {
        return Err(format!(
            "{at}.netDevices[0]: the spec moves a network device into the container; sealnode gives a role no network device (the engine reaches nothing, the node only its egress)"
        ));
    }
    for (i, kv) in e.env.iter().enumerate() {
        let Some((k, v)) = kv.split_once('=') else {
            return Err(format!("{at}.env[{i}]: {kv:?} is not NAME=VALUE"));
        };
        let valid = k.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            return Err(format!("{at}.env[{i}]: {k:?} is not a valid variable name"));
        }
        out.env.retain(|(n, _)| n != k);
        out.env.push((k.to_string(), v.to_string()));
    }
    for (i, n) in e.device_nodes.iter().enumerate() {
        let entry = format!("{at}.deviceNodes[{i}]");
        clean_abs(&n.path, "the path").map_err(|r| format!("{entry}.path: {r}"))?;
        if !n.path.starts_with("/dev/") {
            return Err(format!("{entry}.path: {} is not under /dev/", n.path.display()));
        }
        if let Some(h) = &n.host_path {
            if h != &n.path {
                return Err(format!(
                    "{entry}.hostPath: {} differs from the path {}; sealnode binds a device node at its host path",
                    h.display(),
                    n.path.display()
                ));
            }
        }
        let kind = match n.kind.as_deref() {
            None => None,
            Some(t @ ("c" | "b" | "u")) => t.chars().next(),
            Some(t) => {
                return Err(format!(
                    "{entry}.type: {t:?} is not a device node type (\"c\", \"b\" or \"u\"); sealnode binds device nodes only"
                ))
            }
        };
        let num = |v: Option<i64>, f: &str| -> Result<Option<u64>, String> {
            v.map(|x| u64::try_from(x).map_err(|_| format!("{entry}.{f}: {x} is negative"))).transpose()
        };
        let (major, minor) = (num(n.major, "major")?, num(n.minor, "minor")?);
        // fileMode, permissions, uid and gid tell a runtime how to create the node; sealnode
        // binds the host's own, whose mode and owner are what the host set.
        let _ = (&n.file_mode, &n.permissions, &n.uid, &n.gid);
        if let Some(prev) = out.nodes.iter().find(|x| x.path == n.path) {
            if (prev.kind, prev.major, prev.minor) != (kind, major, minor) {
                return Err(format!("{entry}: {} is described twice, differently ({})", n.path.display(), prev.entry));
            }
            continue;
        }
        out.nodes.push(DeviceNode { entry, path: n.path.clone(), kind, major, minor });
    }
    for (i, m) in e.mounts.iter().enumerate() {
        let entry = format!("{at}.mounts[{i}]");
        clean_abs(&m.host_path, "the host path").map_err(|r| format!("{entry}.hostPath: {r}"))?;
        clean_abs(&m.container_path, "the container path").map_err(|r| format!("{entry}.containerPath: {r}"))?;
        if let Some(t) = m.kind.as_deref().filter(|t| *t != "bind" && *t != "none") {
            return Err(format!("{entry}.type: {t:?}: sealnode binds host files only (type \"bind\")"));
        }
        let exec = !m.options.iter().any(|o| o == "noexec");
        if let Some(prev) = out.mounts.iter().find(|x| x.inside == m.container_path) {
            if prev.host != m.host_path || prev.exec != exec {
                return Err(format!(
                    "{entry}.containerPath: {} is mounted twice, differently ({} from {}, and {} here)",
                    m.container_path.display(),
                    prev.entry,
                    prev.host.display(),
                    m.host_path.display()
                ));
            }
            continue;
        }
        out.mounts.push(FileMount { entry, host: m.host_path.clone(), inside: m.container_path.clone(), exec });
    }
    for (i, h) in e.hooks.iter().enumerate() {
        let _ = (&h.args, &h.env, &h.timeout);
        out.ignored.push((
            format!("{at}.hooks[{i}]"),
            format!(
                "{} hook {}: sealnode never runs a program a spec names (a runtime would run it as root on the host); the host's own library links and ld.so.cache are in view",
                h.hook_name,
                h.path.display()
            ),
        ));
    }
    if !e.additional_gids.is_empty() {
        out.ignored.push((
            format!("{at}.additionalGids"),
            "a role runs with its user's own group only; give that user access to the device nodes (a udev group or ACL)"
                .into(),
        ));
    }
    if e.intel_rdt.is_some() {
        out.ignored.push((format!("{at}.intelRdt"), "cache allocation classes are not applied".into()));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SPEC: &str = r#"
cdiVersion: "0.5.0"
kind: example.com/dev
containerEdits:
  env: ["A=1", "B=x=y"]
  deviceNodes:
  - path: /dev/null
  hooks:
  - hookName: createContainer
    path: /usr/bin/nvidia-ctk
    args: [nvidia-ctk, hook, update-ldcache]
  mounts:
  - hostPath: /usr/lib/libfoo.so.1
    containerPath: /usr/lib/libfoo.so.1
    options: [ro, nosuid, nodev, bind]
  - hostPath: /run/foo/socket
    containerPath: /run/foo/socket
    options: [ro, nosuid, nodev, bind, noexec]
devices:
- name: "0"
  containerEdits:
    deviceNodes:
    - path: /dev/zero
      type: c
      major: 1
      minor: 5
    env: ["A=2"]
- name: gpu-1
  containerEdits:
    deviceNodes:
    - path: /dev/full
"#;

    #[test]
    fn a_spec_gives_the_common_and_the_chosen_devices_edits() {
        let e = edits(SPEC.as_bytes(), &["example.com/dev=0".into()]).expect("edits");
        assert_eq!(e.kind, "example.com/dev");
        let nodes: Vec<_> = e.nodes.iter().map(|n| n.path.display().to_string()).collect();
        assert_eq!(nodes, ["/dev/null", "/dev/zero"]);
        assert_eq!(e.nodes[1].entry, "devices[0].containerEdits.deviceNodes[0]");
        assert_eq!((e.nodes[1].kind, e.nodes[1].major, e.nodes[1].minor), (Some('c'), Some(1), Some(5)));
        assert_eq!(e.env, [("B".to_string(), "x=y".to_string()), ("A".to_string(), "2".to_string())]);
        assert_eq!(e.mounts.len(), 2);
        assert!(e.mounts[0].exec && !e.mounts[1].exec);
        assert_eq!(e.ignored.len(), 1);
        assert!(e.ignored[0].0 == "containerEdits.hooks[0]" && e.ignored[0].1.contains("never runs"));
        let both = edits(SPEC.as_bytes(), &["example.com/dev=0".into(), "example.com/dev=gpu-1".into()]).expect("two");
        assert_eq!(both.nodes.len(), 3);
        // JSON is YAML too: the form `nvidia-ctk cdi generate --format json` writes.
        let json = r#"{"cdiVersion":"0.6.0","kind":"a.b/c","devices":[{"name":"x","containerEdits":{"deviceNodes":[{"path":"/dev/fuse"}]}}]}"#;
        assert_eq!(edits(json.as_bytes(), &["a.b/c=x".into()]).expect("json").nodes.len(), 1);
    }

    #[test]
    fn bad_specs_and_names_say_which_entry_and_why() {
        let e = |spec: &str, want: &str| edits(spec.as_bytes(), &[want.to_string()]).unwrap_err();
        assert!(
            e(SPEC, "example.com/dev=7").contains("no device \"7\" in the spec"),
            "{}",
            e(SPEC, "example.com/dev=7")
        );
        assert!(e(SPEC, "other.com/gpu=0").contains("describes \"example.com/dev\" devices"));
        assert!(e(SPEC, "gpu0").contains("not a qualified CDI device name"));
        assert!(e(SPEC, "nvidia/gpu=0").contains("domain name"));
        assert!(e(SPEC, "example.com/dev=0-").contains("ending with a letter or digit"));
        assert!(e(SPEC, "example.com/dev-=0").contains("the class"));
        let bad = SPEC.replace("path: /dev/zero", "path: /tmp/zero");
        assert!(e(&bad, "example.com/dev=0")
            .contains("devices[0].containerEdits.deviceNodes[0].path: /tmp/zero is not under /dev/"));
        let moved = SPEC.replace("path: /dev/zero", "path: /dev/zero\n      hostPath: /dev/null");
        assert!(e(&moved, "example.com/dev=0").contains("hostPath"));
        let unknown = SPEC.replace("      minor: 5", "      minor: 5\n      colour: red");
        let err = e(&unknown, "example.com/dev=0");
        assert!(
            err.contains("devices[0].containerEdits.deviceNodes[0]") && err.contains("unknown field `colour`"),
            "{err}"
        );
        let newer = SPEC.replace("0.5.0", "9.0.0");
        assert!(e(&newer, "example.com/dev=0").contains("cdiVersion: \"9.0.0\""));
        let net = SPEC.replace("  env: [\"A=1\", \"B=x=y\"]", "  netDevices: [{hostInterfaceName: eth0, name: eth0}]");
        assert!(e(&net, "example.com/dev=0").contains("containerEdits.netDevices[0]"));
        let env = SPEC.replace("\"A=2\"", "\"2A=2\"");
        assert!(e(&env, "example.com/dev=0").contains("devices[0].containerEdits.env[0]"));
        let twice = SPEC.replace("name: gpu-1", "name: \"0\"");
        assert!(e(&twice, "example.com/dev=0").contains("devices[1].name: \"0\" is declared twice"));
        let twice_mounted = SPEC.replace("containerPath: /run/foo/socket", "containerPath: /usr/lib/libfoo.so.1");
        assert!(e(&twice_mounted, "example.com/dev=0").contains("mounted twice, differently"));
        let rel = SPEC.replace("containerPath: /run/foo/socket", "containerPath: run/foo");
        assert!(e(&rel, "example.com/dev=0").contains("containerEdits.mounts[1].containerPath"));
        let dots = SPEC.replace("hostPath: /run/foo/socket", "hostPath: /run/../etc/shadow");
        assert!(e(&dots, "example.com/dev=0").contains("'..'"));
        assert!(edits(&[0xff], &[]).unwrap_err().contains("UTF-8"));
    }
}
