//! deploy/kubernetes: the manifests an operator applies to roll sealed nodes to a fleet.
//! Every one passes the Kubernetes API schemas offline (kubernetes-validate, strict: an unknown
//! field fails), and the pod and the config it carries cannot drift apart: the ConfigMap's
//! `sealnode.toml` parses with sealnode's own parser, every path it names is a volume of the
//! DaemonSet's at that path, the probes ask the socket in its runtime dir, and the grace
//! period covers its drain and stops.

mod common;

use std::path::{Path, PathBuf};

use common::*;
use sealnode::config::{Config, Role};
use serde_json::Value;

/// The Kubernetes versions the manifests are validated against: the oldest this directory
/// supports (user namespaces for pods, `procMount` and `appArmorProfile` in the API) and the
/// newest the pinned kubernetes-validate (scripts/prepare-python) carries.
const KUBERNETES: [&str; 2] = ["1.33.0", "1.37.0"];

/// Seconds the pod's grace period keeps beyond the drain and three stop timeouts: the drain's
/// last second after the last connection closed, and the exit (the shipped units keep 5).
const GRACE_MARGIN_S: u64 = 5;

fn dir() -> PathBuf {
    repo().join("deploy/kubernetes")
}

/// Every manifest, sorted: each `*.yaml` but the kustomization, which is kustomize's file, not
/// an API object (the validator knows no schema for it; `kustomization_lists_every_manifest`
/// checks it).
fn manifests() -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir())
        .expect("deploy/kubernetes")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .filter(|p| p.file_name().is_some_and(|n| n != "kustomization.yaml"))
        .collect();
    v.sort();
    v
}

/// One manifest, one object.
fn load(name: &str) -> Value {
    let path = dir().join(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_norway::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn string(v: &Value, what: &str) -> String {
    v.as_str().unwrap_or_else(|| panic!("{what} is not a string: {v}")).to_string()
}

fn array<'a>(v: &'a Value, what: &str) -> &'a Vec<Value> {
    v.as_array().unwrap_or_else(|| panic!("{what} is not a list: {v}"))
}

/// The config the ConfigMap carries, and the path the DaemonSet gives it to sealnode at.
fn config() -> (Config, String) {
    let cm = load("configmap.yaml");
    let text = string(&cm["data"]["sealnode.toml"], "the ConfigMap's sealnode.toml");
    let ds = load("daemonset.yaml");
    let args: Vec<String> =
        array(&sealnode_container(&ds)["args"], "the container's args").iter().map(|a| string(a, "an arg")).collect();
    let at = args.iter().position(|a| a == "--config").expect("the container's args name --config");
    let file = args.get(at + 1).expect("a path after --config").clone();
    let cfg = Config::parse(&text, Path::new(&file)).unwrap_or_else(|e| panic!("the ConfigMap's config: {e}"));
    (cfg, file)
}

fn pod(ds: &Value) -> &Value {
    &ds["spec"]["template"]["spec"]
}

fn named<'a>(list: &'a Value, name: &str, what: &str) -> &'a Value {
    array(list, what).iter().find(|c| c["name"] == name).unwrap_or_else(|| panic!("no {what} named {name}"))
}

fn sealnode_container(ds: &Value) -> &Value {
    named(&pod(ds)["containers"], "sealnode", "container")
}

fn init_container(ds: &Value) -> &Value {
    named(&pod(ds)["initContainers"], "prepare", "init container")
}

fn volume<'a>(ds: &'a Value, name: &str) -> &'a Value {
    named(&pod(ds)["volumes"], name, "volume")
}

/// A container's mount and its volume.
struct Mounted<'a> {
    path: String,
    read_only: bool,
    volume: &'a Value,
}

/// The mount `path` lies in inside `container` (the deepest one holding it), if any.
fn mount_of<'a>(ds: &'a Value, container: &'a Value, path: &Path) -> Option<Mounted<'a>> {
    array(&container["volumeMounts"], "volumeMounts")
        .iter()
        .filter(|m| path.starts_with(string(&m["mountPath"], "mountPath")))
        .max_by_key(|m| string(&m["mountPath"], "mountPath").len())
        .map(|m| Mounted {
            path: string(&m["mountPath"], "mountPath"),
            read_only: m["readOnly"].as_bool().unwrap_or(false),
            volume: volume(ds, &string(&m["name"], "a mount's volume")),
        })
}

/// The mount at exactly `path`, or a failure naming the field that wants it.
fn mount_at<'a>(ds: &'a Value, container: &'a Value, path: &Path, field: &str) -> Mounted<'a> {
    let m = mount_of(ds, container, path)
        .unwrap_or_else(|| panic!("{field} = {}: no volume of {} holds it", path.display(), container["name"]));
    assert_eq!(m.path, path.display().to_string(), "{field}: the volume must be mounted at the path itself");
    m
}

/// The kubernetes-validate the test venv holds, or a loud skip.
fn validator() -> Option<PathBuf> {
    let Ok(venv) = std::env::var("SEALNODE_TEST_VENV") else {
        unavailable("python", "SEALNODE_TEST_VENV is unset (scripts/prepare-python)");
        return None;
    };
    let bin = Path::new(&venv).join("bin/kubernetes-validate");
    if !bin.is_file() {
        unavailable("python", &format!("{} is missing (scripts/prepare-python installs it)", bin.display()));
        return None;
    }
    Some(bin)
}

/// Validate `files` against Kubernetes `version`, strictly: the verdict and what the
/// validator said. A file passes only with its own `passed` line and nothing else said about
/// it: the validator only warns (exit 0) about an object whose kind or apiVersion it has no
/// schema for, which is what a mistyped or removed apiVersion looks like.
fn validate(bin: &Path, version: &str, files: &[PathBuf]) -> (bool, String) {
    let o = std::process::Command::new(bin)
        .args(["--kubernetes-version", version, "--strict"])
        .args(files)
        .output_within(COMMAND_LIMIT);
    let said = format!("{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
    let short = version.rsplit_once('.').map_or(version, |(v, _)| v);
    let each_passed = files.iter().all(|f| {
        let about: Vec<&str> = said.lines().filter(|l| l.contains(&*f.to_string_lossy())).collect();
        about.len() == 1
            && about[0].starts_with("INFO ")
            && about[0].contains(" passed for resource ")
            && about[0].ends_with(&format!("against version {short}"))
    });
    (o.status.success() && each_passed, said)
}

/// (1) Every manifest is a valid API object of the versions this directory supports.
#[test]
fn every_manifest_passes_the_api_schemas() {
    let Some(bin) = validator() else { return };
    let files = manifests();
    assert!(files.len() >= 5, "deploy/kubernetes holds {files:?}");
    for version in KUBERNETES {
        let (ok, said) = validate(&bin, version, &files);
        assert!(ok, "deploy/kubernetes against Kubernetes {version} (kubernetes-validate --strict):\n{said}");
    }
}

/// (2) The validator can fail, on what matters here: an unknown field in a securityContext (a
/// misspelt setting the API server would drop, leaving the pod without it), a field the
/// versions before 1.30 lack (the pinned version knows what the pod relies on), and an
/// apiVersion it has no schema for.
#[test]
fn the_validator_refuses_what_the_api_server_would_not_take() {
    let Some(bin) = validator() else { return };
    let tmp = tempfile::tempdir().expect("tempdir");
    let ds = std::fs::read_to_string(dir().join("daemonset.yaml")).expect("daemonset.yaml");
    let line = "            procMount: Unmasked\n";
    assert_eq!(ds.matches(line).count(), 1, "the DaemonSet sets procMount once");
    let typo = tmp.path().join("daemonset.yaml");
    std::fs::write(&typo, ds.replace(line, &format!("{line}            procMountType: Unmasked\n"))).expect("write");
    let (ok, said) = validate(&bin, KUBERNETES[0], &[typo]);
    assert!(!ok, "an unknown securityContext field passed:\n{said}");
    assert!(said.contains("'procMountType' was unexpected"), "{said}");

    let (ok, said) = validate(&bin, "1.29.0", &[dir().join("daemonset.yaml")]);
    assert!(!ok, "Kubernetes 1.29 has no appArmorProfile field, yet the DaemonSet passed:\n{said}");
    assert!(said.contains("'appArmorProfile' was unexpected"), "{said}");

    let pdb = std::fs::read_to_string(dir().join("poddisruptionbudget.yaml")).expect("pdb");
    let old = tmp.path().join("poddisruptionbudget.yaml");
    std::fs::write(&old, pdb.replace("apiVersion: policy/v1\n", "apiVersion: policy/v1beta1\n")).expect("write");
    let (ok, said) = validate(&bin, KUBERNETES[0], &[old]);
    assert!(!ok, "an apiVersion removed in 1.25 passed:\n{said}");
    assert!(said.contains("Couldn't find schema"), "{said}");
}

/// (3) The ConfigMap's config is one sealnode loads: parsed and checked by the same pure
/// parser `check` and `run` use (everything but the host checks, whose paths are the pod's).
#[test]
fn the_configmaps_config_parses() {
    let (cfg, file) = config();
    assert_eq!(file, "/etc/sealnode/sealnode.toml", "the image's CMD and ctl's default name this path");
    let users = cfg.cell.rootful.as_ref().expect("sealnode runs as root of the pod's user namespace: cell.rootful");
    assert_eq!((users.engine.as_str(), users.node.as_str()), ("sealnode-engine", "sealnode-node"), "the image's users");
    let d = cfg.engine.devices_from.as_ref().expect("the engine takes the pod's GPUs from a CDI spec");
    assert_eq!(d.devices, ["nvidia.com/gpu=all"], "every GPU the pod was given (daemonset.yaml's nvidia.com/gpu)");
    assert!(
        cfg.cell.limits == Default::default() && Role::ALL.iter().all(|r| cfg.role(*r).limits == Default::default()),
        "a pod's cgroup is not delegated: a cgroup limit would refuse the start"
    );
}

/// (4) Every path the config names is where the pod puts it: the config file in the
/// ConfigMap's volume, the state dir on the host, the runtime dir and the credential in memory,
/// each scratch in its own size-bounded emptyDir prepared for its role by the init container,
/// the models and the CDI spec read-only from the host; and nothing the config takes from the
/// image (programs, binds, policies) is shadowed by a volume.
#[test]
fn the_daemonset_mounts_what_the_config_names() {
    let (cfg, file) = config();
    let ds = load("daemonset.yaml");
    let c = sealnode_container(&ds);
    let init = init_container(&ds);
    assert_eq!(init["image"], c["image"], "the init container uses the image's shell and its role users");
    let script = array(&init["command"], "the init container's command")
        .last()
        .and_then(Value::as_str)
        .expect("the init container's script")
        .to_string();
    let has =
        |line: String| assert!(script.lines().any(|l| l.trim() == line), "the init script lacks `{line}`:\n{script}");
    let also_in_init = |m: &Mounted, field: &str| {
        let i = mount_at(&ds, init, Path::new(&m.path), &format!("{field} (init container)"));
        assert_eq!(i.volume["name"], m.volume["name"], "{field}: the init container prepares the same volume");
    };

    let cm = load("configmap.yaml");
    let file = Path::new(&file);
    let m = mount_at(&ds, c, file.parent().expect("dir"), "--config");
    assert!(m.read_only, "the config's volume is read-only");
    assert_eq!(m.volume["configMap"]["name"], cm["metadata"]["name"], "the config's volume is the ConfigMap");
    let key = file.file_name().expect("name").to_string_lossy();
    assert!(cm["data"][&*key].is_string(), "the ConfigMap has no key {key}");

    let m = mount_at(&ds, c, &cfg.cell.state_dir, "cell.state_dir");
    assert!(!m.read_only, "cell.state_dir is written");
    assert_eq!(m.volume["hostPath"]["path"], Value::from(cfg.cell.state_dir.display().to_string()), "the host's own");
    assert_eq!(m.volume["hostPath"]["type"], "DirectoryOrCreate");

    let m = mount_at(&ds, c, &cfg.cell.runtime_dir, "cell.runtime_dir");
    assert!(!m.read_only, "cell.runtime_dir holds the control socket");
    assert_eq!(m.volume["emptyDir"]["medium"], "Memory");
    also_in_init(&m, "cell.runtime_dir");
    let credential = cfg.node.credential.as_ref().expect("node.credential");
    let credential_dir = credential.parent().expect("dir");
    has(format!("chmod 0755 {} {}", cfg.cell.runtime_dir.display(), credential_dir.display()));

    let users = cfg.cell.rootful.as_ref().expect("cell.rootful");
    let scratch: Vec<String> = Role::ALL.iter().map(|r| cfg.role(*r).scratch.display().to_string()).collect();
    has(format!("chmod 0700 {}", scratch.join(" ")));
    for (role, user) in [(Role::Engine, &users.engine), (Role::Node, &users.node)] {
        let field = format!("{role}.scratch");
        let path = &cfg.role(role).scratch;
        let m = mount_at(&ds, c, path, &field);
        assert!(!m.read_only, "{field} is the role's writable dir");
        assert!(m.volume["emptyDir"]["sizeLimit"].is_string(), "{field}: an emptyDir with a sizeLimit");
        also_in_init(&m, &field);
        has(format!("chown {user}:{user} {}", path.display()));
    }

    let m = mount_at(&ds, c, credential_dir, "node.credential");
    assert_eq!(m.volume["emptyDir"]["medium"], "Memory", "node.credential: the copy stays in memory");
    also_in_init(&m, "node.credential");
    let secret = mount_of(&ds, init, Path::new("/etc/sealnode-credential/credential")).expect("the Secret in init");
    assert_eq!(secret.volume["secret"]["secretName"], "sealnode-credential");
    assert!(secret.read_only);
    has(format!("cp /etc/sealnode-credential/credential {}", credential.display()));
    has(format!("chmod 0400 {}", credential.display()));
    has(format!("chown {0}:{0} {1}", users.node, credential.display()));
    assert!(
        !array(&c["volumeMounts"], "volumeMounts").iter().any(|v| v["name"] == secret.volume["name"]),
        "sealnode's container never sees the Secret itself, only the node's copy"
    );

    let models = cfg.engine.models.as_ref().expect("engine.models");
    let m = mount_at(&ds, c, models, "engine.models");
    assert!(m.read_only, "engine.models is read-only");
    assert!(m.volume["hostPath"]["path"].is_string());

    let spec = &cfg.engine.devices_from.as_ref().expect("devices_from").cdi;
    let m = mount_of(&ds, c, spec).expect("engine.devices_from.cdi: no volume holds the CDI spec");
    assert!(m.read_only && m.volume["hostPath"].is_object(), "the host's CDI spec, read-only");

    for role in Role::ALL {
        let r = cfg.role(role);
        let mut image: Vec<(String, &Path)> = vec![
            (format!("{role}.command[0]"), Path::new(&r.command[0])),
            (format!("{role}.seccomp"), &r.seccomp),
            (format!("{role}.landlock"), &r.landlock),
        ];
        image.extend(r.ro_binds.iter().enumerate().map(|(i, b)| (format!("{role}.ro_binds[{i}]"), b.src.as_path())));
        for (field, path) in image {
            assert!(
                mount_of(&ds, c, path).is_none(),
                "{field} = {} comes from the image; a volume over it would replace it",
                path.display()
            );
        }
    }
}

/// (5) The least privilege that still seals, as daemonset.yaml documents it: a user namespace,
/// an unmasked /proc, the outer seccomp profile the operator installs, no AppArmor profile
/// (sealnode's own layers confine the roles), nothing privileged or from the host's namespaces,
/// every capability dropped but the listed few.
#[test]
fn the_pod_holds_the_least_privilege_that_seals() {
    let ds = load("daemonset.yaml");
    let p = pod(&ds);
    assert_eq!(p["hostUsers"], false, "a user namespace stands in for CAP_SYS_ADMIN");
    for host in ["hostNetwork", "hostPID", "hostIPC"] {
        assert!(p[host].is_null() || p[host] == false, "{host}");
    }
    assert_eq!(p["automountServiceAccountToken"], false);
    let sa = load("serviceaccount.yaml");
    assert_eq!(p["serviceAccountName"], sa["metadata"]["name"]);
    assert_eq!(sa["automountServiceAccountToken"], false);
    let sc = &sealnode_container(&ds)["securityContext"];
    assert_eq!(sc["procMount"], "Unmasked");
    assert_eq!(sc["seccompProfile"]["type"], "Localhost");
    assert_eq!(
        sc["seccompProfile"]["localhostProfile"], "profiles/sealnode.json",
        "the profile the operator installs as /var/lib/kubelet/seccomp/profiles/sealnode.json"
    );
    assert_eq!(sc["appArmorProfile"]["type"], "Unconfined");
    assert_eq!(sc["allowPrivilegeEscalation"], false);
    assert_eq!(sc["readOnlyRootFilesystem"], true);
    assert_eq!(sc["privileged"], false);
    assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]));
    let add: Vec<String> =
        array(&sc["capabilities"]["add"], "capabilities.add").iter().map(|c| string(c, "a capability")).collect();
    assert!(!add.iter().any(|c| c == "SYS_ADMIN" || c == "ALL"), "{add:?}");
    for c in array(&pod(&ds)["initContainers"], "initContainers").iter().chain(array(&p["containers"], "containers")) {
        let sc = &c["securityContext"];
        assert!(sc["privileged"] == false && sc["allowPrivilegeEscalation"] == false, "{}", c["name"]);
        assert_eq!(sc["capabilities"]["drop"], serde_json::json!(["ALL"]), "{}", c["name"]);
    }
    let env = named(&sealnode_container(&ds)["env"], "SEALNODE_LOG_FORMAT", "env variable");
    assert_eq!(env["value"], "json");
    assert_eq!(p["nodeSelector"]["sealnode.dev/sealed-node"], "true");
    assert!(
        array(&p["tolerations"], "tolerations").iter().any(|t| t["key"] == "nvidia.com/gpu"),
        "GPU hosts' taint tolerated"
    );
    assert!(sealnode_container(&ds)["resources"]["limits"]["nvidia.com/gpu"].is_number(), "the GPUs asked for");
}

/// The probes ask the supervisor's socket in the config's runtime dir, with a command line
/// the installed `ctl` takes (run here against a socket that does not exist: "cannot reach",
/// exit 1, never a usage error, 2).
#[test]
fn the_probes_ask_the_config_runtime_dirs_socket() {
    let (cfg, _) = config();
    let ds = load("daemonset.yaml");
    let c = sealnode_container(&ds);
    let socket = cfg.cell.runtime_dir.join("control.sock").display().to_string();
    let tmp = tempfile::tempdir().expect("tempdir");
    let absent = tmp.path().join("control.sock").display().to_string();
    for (probe, verb) in [("startupProbe", "status"), ("readinessProbe", "ready"), ("livenessProbe", "status")] {
        let argv: Vec<String> =
            array(&c[probe]["exec"]["command"], probe).iter().map(|a| string(a, "an argument")).collect();
        assert_eq!(argv, ["/usr/bin/sealnode", "ctl", "--socket", &socket, verb], "{probe}");
        let o = std::process::Command::new(env!("CARGO_BIN_EXE_sealnode"))
            .args(argv[1..].iter().map(|a| if *a == socket { &absent } else { a }))
            .output_within(COMMAND_LIMIT);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{probe}: {argv:?}: {err}");
        assert!(err.contains(&absent), "{probe}: names the socket it could not reach: {err}");
    }
}

/// The pod's grace period covers a clean stop: the drain, the node's and the engine's stop
/// (SIGTERM, then SIGKILL after stop_timeout_s each) and the scratch wipe's (the same), with a
/// margin; less and the kubelet's SIGKILL would cut the drain.
#[test]
fn the_grace_period_covers_the_drain_and_the_stops() {
    let (cfg, _) = config();
    let ds = load("daemonset.yaml");
    let grace = pod(&ds)["terminationGracePeriodSeconds"].as_u64().expect("terminationGracePeriodSeconds");
    let stop = cfg.cell.drain_timeout_s + 3 * cfg.cell.stop_timeout_s;
    assert!(
        grace >= stop + GRACE_MARGIN_S,
        "terminationGracePeriodSeconds {grace} < drain_timeout_s {} + 3 x stop_timeout_s {} + {GRACE_MARGIN_S}",
        cfg.cell.drain_timeout_s,
        cfg.cell.stop_timeout_s
    );
}

/// One host at a time, never two pods on a host (the state dir's lock, the GPUs), and the
/// disruption budget selects the DaemonSet's own pods.
#[test]
fn rollouts_take_one_host_at_a_time() {
    let ds = load("daemonset.yaml");
    let r = &ds["spec"]["updateStrategy"];
    assert_eq!(r["type"], "RollingUpdate");
    assert_eq!(r["rollingUpdate"]["maxUnavailable"], 1);
    assert_eq!(r["rollingUpdate"]["maxSurge"], 0);
    let selector = &ds["spec"]["selector"]["matchLabels"];
    for (k, v) in selector.as_object().expect("matchLabels") {
        assert_eq!(&ds["spec"]["template"]["metadata"]["labels"][k], v, "the template carries the selector's {k}");
    }
    let pdb = load("poddisruptionbudget.yaml");
    assert_eq!(&pdb["spec"]["selector"]["matchLabels"], selector);
    assert_eq!(pdb["spec"]["maxUnavailable"], 1);
    let ns = load("namespace.yaml")["metadata"]["name"].clone();
    for f in manifests() {
        let name = f.file_name().expect("name").to_string_lossy().into_owned();
        let v = load(&name);
        if v["kind"] != "Namespace" {
            assert_eq!(v["metadata"]["namespace"], ns, "{name}: in the namespace namespace.yaml makes");
        }
    }
}

/// `kubectl apply -k` applies every manifest here, and names nothing else.
#[test]
fn kustomization_lists_every_manifest() {
    let k = load("kustomization.yaml");
    let mut listed: Vec<String> = array(&k["resources"], "resources").iter().map(|r| string(r, "a resource")).collect();
    listed.sort();
    let present: Vec<String> =
        manifests().iter().map(|p| p.file_name().expect("name").to_string_lossy().into_owned()).collect();
    assert_eq!(listed, present, "kustomization.yaml's resources and deploy/kubernetes/*.yaml");
}
