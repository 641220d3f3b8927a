//! The command line: doctor, help, argument errors.

mod common;

use common::*;

#[test]
fn doctor_reports_this_kernel() {
    let out =
        std::process::Command::new(env!("CARGO_BIN_EXE_sealnode")).args(["doctor", "--json"]).output().expect("doctor");
    let checks: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let names: Vec<&str> = checks.as_array().expect("array").iter().filter_map(|c| c["name"].as_str()).collect();
    for n in ["user namespaces", "landlock", "seccomp", "cgroup v2"] {
        assert!(names.contains(&n), "doctor lacks {n}: {names:?}");
    }
    let failed: Vec<_> = checks.as_array().expect("array").iter().filter(|c| c["level"] == "fail").collect();
    assert_eq!(out.status.code() == Some(0), failed.is_empty(), "exit code must reflect FAIL checks: {failed:?}");
    if !failed.is_empty() {
        unavailable("userns", &format!("doctor reports failures on this machine: {failed:?}"));
    }
}

#[test]
fn doctor_fails_and_explains_where_namespaces_are_missing() {
    // Inside a node sandbox, namespaces and Landlock are refused: doctor must say so and exit 1.
    for mode in modes() {
        let mut f = Fixture::new(mode, "doctor");
        f.node_extra = format!("ro_binds = [{{ src = \"{}\", dst = \"/opt/sealnode\" }}]", f.p("bin").display());
        f.write_config();
        let o = f.exec("node", &["/opt/sealnode/sealnode", "doctor"]);
        let out = String::from_utf8_lossy(&o.stdout);
        assert_eq!(o.status.code(), Some(1), "{mode:?}: {out}\n{}", String::from_utf8_lossy(&o.stderr));
        assert!(out.contains("[FAIL] user namespaces") && out.contains("fix:"), "{mode:?}: {out}");
        assert!(out.contains("[FAIL] landlock"), "{mode:?}: {out}");
    }
}

#[test]
fn help_lists_the_commands() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sealnode")).arg("--help").output().expect("help");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("exec") && text.contains("doctor"), "{text}");
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_sealnode"))
        .args(["exec", "--config", "/nonexistent.toml", "--role", "engine", "--", "/bin/true"])
        .output()
        .expect("exec");
    assert_eq!(out.status.code(), Some(125));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent.toml"), "{err}");
}
