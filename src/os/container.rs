//! Whether sealnode runs inside a container, and which runtime made it: what the runtimes leave
//! in a container's file system and environment. `doctor` names each missing option in that
//! runtime's own words; the receipt and the statements record it (the outer runtime is part of
//! the trusted base, docs/containers.md). These are the runtime's own marks, as trustworthy as
//! the image and the runtime that wrote them: a record, not a proof.

use serde::{Deserialize, Serialize};

/// The container sealnode runs in.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Container {
    /// "podman", "cri-o", "containerd", "docker", or what the `container` variable names.
    pub runtime: String,
    /// The runtime's own version, where it says it (podman's /run/.containerenv).
    pub version: Option<String>,
    /// Rootless podman (its /run/.containerenv says so); unknown elsewhere.
    pub rootless: Option<bool>,
    /// "kubernetes" where the kubelet's service variables are set.
    pub orchestrator: Option<String>,
    /// The marks that said so, e.g. "/run/.containerenv", "root overlay of containerd".
    pub evidence: Vec<String>,
}

/// The marks [`classify`] reads, gathered once.
#[derive(Debug, Default, Clone)]
pub struct Marks {
    /// /run/.containerenv's content (podman writes its engine and mode; CRI-O an empty file).
    pub containerenv: Option<String>,
    /// /.dockerenv exists.
    pub dockerenv: bool,
    /// The root mount's file system type and super options (overlay's lowerdir names the store).
    pub root_mount: Option<(String, String)>,
    /// The `container` environment variable (podman, systemd-nspawn, LXC set it).
    pub container_var: Option<String>,
    /// KUBERNETES_SERVICE_HOST is set (the kubelet sets it in every pod's containers).
    pub kubernetes: bool,
}

impl Marks {
    /// This process's own marks.
    pub fn read() -> Marks {
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        Marks {
            containerenv: std::fs::read_to_string("/run/.containerenv").ok(),
            dockerenv: std::path::Path::new("/.dockerenv").exists(),
            root_mount: root_mount(&mountinfo),
            // Not UTF-8 is still a mark (found by review: it read as no container at all).
            container_var: std::env::var_os("container")
                .map(|v| v.to_string_lossy().into_owned())
                .filter(|v| !v.is_empty()),
            kubernetes: std::env::var_os("KUBERNETES_SERVICE_HOST").is_some(),
        }
    }
}

/// The file system type and super options of the mount at "/" (the last one: the one in force).
fn root_mount(mountinfo: &str) -> Option<(String, String)> {
    mountinfo.lines().rev().find_map(|l| {
        let (pre, post) = l.split_once(" - ")?;
        (pre.split_whitespace().nth(4)? == "/").then_some(())?;
        let mut p = post.split_whitespace();
        let fstype = p.next()?.to_string();
        let _source = p.next()?;
        Some((fstype, p.next().unwrap_or("").to_string()))
    })
}

/// Where sealnode runs: in a container (and which), or not.
pub fn detect() -> Option<Container> {
    classify(&Marks::read())
}

/// The container the marks describe, or none.
pub fn classify(m: &Marks) -> Option<Container> {
    // CRI-O and podman share containers/storage and an empty /run/.containerenv (podman rootful
    // writes it empty too): the kubelet's variable tells them apart, unless podman's own
    // `container=podman` says otherwise (found by review: `-e KUBERNETES_SERVICE_HOST` made
    // a podman container read as CRI-O's).
    let crio = m.kubernetes && m.container_var.as_deref() != Some("podman");
    let mut evidence = Vec::new();
    let mut runtime: Option<String> = None;
    let (mut version, mut rootless) = (None, None);
    if let Some(env) = &m.containerenv {
        evidence.push("/run/.containerenv".to_string());
        let field = |k: &str| {
            env.lines().find_map(|l| l.strip_prefix(k)?.strip_prefix('=').map(|v| v.trim_matches('"').to_string()))
        };
        match field("engine") {
            Some(e) => {
                let (name, ver) =
                    e.split_once('-').map_or((e.clone(), None), |(n, v)| (n.to_string(), Some(v.to_string())));
                runtime = Some(name);
                version = ver;
                rootless = field("rootless").map(|r| r == "1");
            }
            // CRI-O writes the file empty.
            None => runtime = Some(if crio { "cri-o" } else { "podman" }.to_string()),
        }
    }
    // Docker leaves /.dockerenv in every container, but an image turned into a VM's root file
    // system keeps it too: it counts only on an overlay root, as a container's is.
    if m.dockerenv && m.root_mount.as_ref().is_some_and(|(t, _)| t == "overlay") {
        evidence.push("/.dockerenv".to_string());
        runtime.get_or_insert_with(|| "docker".to_string());
    }
    if let Some((fstype, opts)) = &m.root_mount {
        let store = if opts.contains("/containerd/") {
            Some("containerd")
        } else if opts.contains("/containers/storage/") {
            Some(if crio { "cri-o" } else { "podman" })
        } else if opts.contains("/docker/") {
            Some("docker")
        } else {
            None
        };
        if let Some(s) = store {
            evidence.push(format!("root {fstype} of {s}'s store"));
            runtime.get_or_insert_with(|| s.to_string());
        }
    }
    if let Some(c) = &m.container_var {
        evidence.push(format!("container={c}"));
        runtime.get_or_insert_with(|| c.clone());
    }
    let runtime = runtime?;
    let orchestrator = m.kubernetes.then(|| {
        evidence.push("KUBERNETES_SERVICE_HOST".to_string());
        "kubernetes".to_string()
    });
    // The marks are the image's and the environment's words: shown by doctor, written into the
    // receipt and the statements, made unambiguous and short first (found by review: a
    // `container` value with a terminal escape and a line break forged a doctor line).
    let (runtime, version) = (word(&runtime), version.as_deref().map(word));
    let evidence = evidence.iter().map(|e| word(e)).collect();
    Some(Container { runtime, version, rootless, orchestrator, evidence })
}

/// A mark's value as shown and recorded: escaped ([`crate::os::escape::clean`]), at most 64
/// characters.
fn word(s: &str) -> String {
    crate::os::escape::clean(s.as_bytes()).chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const PODMAN_ENV: &str =
        "engine=\"podman-5.4.2\"\nname=\"cell\"\nid=\"abc\"\nimage=\"localhost/sealnode:0.1.0\"\nrootless=1\n";

    /// runtime, version, rootless, orchestrator
    type Want = Option<(&'static str, Option<&'static str>, Option<bool>, Option<&'static str>)>;

    #[test]
    fn each_runtimes_marks() {
        let overlay =
            |store: &str| Some(("overlay".to_string(), format!("rw,lowerdir={store}/l/AB:{store}/l/CD,upperdir=x")));
        let rows: Vec<(&str, Marks, Want)> = vec![
            ("a host", Marks { root_mount: Some(("ext4".into(), "rw".into())), ..Marks::default() }, None),
            (
                "rootless podman",
                Marks {
                    containerenv: Some(PODMAN_ENV.into()),
                    root_mount: overlay("/home/u/.local/share/containers/storage/overlay"),
                    container_var: Some("podman".into()),
                    ..Marks::default()
                },
                Some(("podman", Some("5.4.2"), Some(true), None)),
            ),
            (
                "containerd under the kubelet",
                Marks {
                    root_mount: overlay("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots"),
                    kubernetes: true,
                    ..Marks::default()
                },
                Some(("containerd", None, None, Some("kubernetes"))),
            ),
            (
                "ctr",
                Marks { root_mount: overlay("/var/lib/containerd/x"), ..Marks::default() },
                Some(("containerd", None, None, None)),
            ),
            (
                "CRI-O: an empty /run/.containerenv",
                Marks { containerenv: Some(String::new()), kubernetes: true, ..Marks::default() },
                Some(("cri-o", None, None, Some("kubernetes"))),
            ),
            (
                "docker",
                Marks { dockerenv: true, root_mount: Some(("overlay".into(), "rw".into())), ..Marks::default() },
                Some(("docker", None, None, None)),
            ),
            (
                "a VM whose root was a docker image: /.dockerenv on an ext4 root",
                Marks { dockerenv: true, root_mount: Some(("ext4".into(), "rw".into())), ..Marks::default() },
                None,
            ),
            (
                "nspawn",
                Marks { container_var: Some("systemd-nspawn".into()), ..Marks::default() },
                Some(("systemd-nspawn", None, None, None)),
            ),
            (
                "kubernetes variables alone say nothing of a container",
                Marks { kubernetes: true, ..Marks::default() },
                None,
            ),
            (
                "rootful podman given the kubelet's variable: podman's own container=podman wins",
                Marks {
                    containerenv: Some(String::new()),
                    root_mount: overlay("/var/lib/containers/storage/overlay"),
                    container_var: Some("podman".into()),
                    kubernetes: true,
                    ..Marks::default()
                },
                Some(("podman", None, None, Some("kubernetes"))),
            ),
            (
                "a value with a terminal escape and a line break: escaped, and cut at 64",
                Marks {
                    container_var: Some(format!("podman\u{1b}[2J\n[ok  ] all good{}", "x".repeat(80))),
                    ..Marks::default()
                },
                Some((r"podman\u{1b}[2J\u{a}[ok  ] all goodxxxxxxxxxxxxxxxxxxxxxxxxxxxxx", None, None, None)),
            ),
        ];
        for (what, marks, want) in rows {
            let got = classify(&marks);
            let got =
                got.as_ref().map(|c| (c.runtime.as_str(), c.version.as_deref(), c.rootless, c.orchestrator.as_deref()));
            assert_eq!(got, want, "{what}");
        }
    }

    #[test]
    fn the_root_mount_is_the_last_at_slash() {
        let mi = "22 1 8:1 / / rw,relatime - ext4 /dev/sda1 rw\n\
                  30 22 0:40 / /proc rw - proc proc rw\n\
                  41 1 0:50 / / rw - overlay overlay rw,lowerdir=/var/lib/containerd/s/1/fs\n";
        assert_eq!(root_mount(mi), Some(("overlay".into(), "rw,lowerdir=/var/lib/containerd/s/1/fs".into())));
        assert_eq!(root_mount(""), None);
    }
}
