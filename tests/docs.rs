//! docs/architecture.md lists the setup steps in the order `child_main` performs them.

mod common;

use common::{OutputWithin, COMMAND_LIMIT};
use sealnode::sandbox::Stage;

fn snake(camel: &str) -> String {
    let mut s = String::new();
    for (i, c) in camel.chars().enumerate() {
        if c.is_ascii_uppercase() && i > 0 {
            s.push('_');
        }
        s.push(c.to_ascii_lowercase());
    }
    s
}

/// Stage names in the order of their first `Stage::X` use in a source file.
fn stages_in(src: &str) -> Vec<String> {
    let mut seen = Vec::new();
    for part in src.split("Stage::").skip(1) {
        let ident: String = part.chars().take_while(|c| c.is_ascii_alphanumeric()).collect();
        let name = snake(&ident);
        if !ident.is_empty() && ident != "ALL" && !seen.contains(&name) {
            seen.push(name);
        }
    }
    seen
}

#[test]
fn architecture_doc_lists_the_setup_steps_in_code_order() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("doc");
    let section =
        doc.split("## The child's setup sequence").nth(1).expect("section").split("\n## ").next().expect("end");
    let documented: Vec<String> = section
        .lines()
        .filter_map(|l| {
            let (num, rest) = l.split_once(". `")?;
            num.trim().parse::<u32>().ok()?;
            Some(rest.split('`').next()?.to_string())
        })
        .collect();
    let declared: Vec<String> = Stage::ALL.iter().map(|s| s.name().to_string()).collect();
    assert_eq!(documented, declared, "docs/architecture.md and Stage::ALL differ");

    // The code performs them in that order: child_main, with init's own step spliced in.
    let child = std::fs::read_to_string(root.join("src/sandbox/child.rs")).expect("child.rs");
    let body = child.split("pub fn child_main").nth(1).expect("child_main");
    let mut order = stages_in(body.split("\nfn ").next().expect("body"));
    let init = std::fs::read_to_string(root.join("src/sandbox/init.rs")).expect("init.rs");
    let pos = order.iter().position(|s| s == "fork_workload").expect("fork") + 1;
    for (i, s) in stages_in(&init).into_iter().enumerate() {
        order.insert(pos + i, s);
    }
    assert_eq!(order, declared, "child_main's step order differs from Stage::ALL");
}

/// The rows of the first Markdown table in `section` (header and separator dropped), cells
/// trimmed, backticks around a cell removed.
fn table_rows(section: &str) -> Vec<Vec<String>> {
    section
        .lines()
        .skip_while(|l| !l.starts_with('|'))
        .take_while(|l| l.starts_with('|'))
        .skip(2)
        .map(|l| {
            let inner = l.trim().trim_start_matches('|').trim_end_matches('|');
            inner.split(" | ").map(|c| c.trim().trim_matches('`').to_string()).collect()
        })
        .collect()
}

/// docs/canary.md's table of attempts is SPECS, row for row and column for column, both ways;
/// its table of exceptions is SINGLE_LAYER, both ways.
#[test]
fn canary_doc_tables_are_the_battery() {
    use sealnode::proof::canary::{Roles, SINGLE_LAYER, SPECS};
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/canary.md")).expect("doc");
    let attempts = doc.split("\n## The attempts\n").nth(1).expect("attempts section");
    let attempts = attempts.split("\n## ").next().expect("section end");
    let documented = table_rows(attempts);
    let header = attempts.lines().find(|l| l.starts_with('|')).expect("header");
    assert_eq!(header, "| attempt | category | what it tries | expected to refuse it | roles |");
    let code: Vec<Vec<String>> = SPECS
        .iter()
        .map(|s| {
            let layers: Vec<&str> = s.expected.iter().map(|l| l.name()).collect();
            let roles = match s.roles {
                Roles::Both => "both",
                Roles::Engine => "engine",
                Roles::Node => "node",
            };
            vec![s.id.into(), s.category.into(), s.what.into(), layers.join(", "), roles.into()]
        })
        .collect();
    // Attempts that only exist on x86_64 are documented on every architecture.
    let x86_only = ["iopl", "ioperm", "int80_getpid", "x32_getpid"];
    for row in &code {
        assert!(documented.contains(row), "docs/canary.md: attempt row missing or different: {row:?}");
    }
    for row in &documented {
        assert!(
            code.contains(row) || (!cfg!(target_arch = "x86_64") && x86_only.contains(&row[0].as_str())),
            "docs/canary.md documents an attempt the battery does not have (or differently): {row:?}"
        );
    }
    assert_eq!(documented.len(), code.len() + if cfg!(target_arch = "x86_64") { 0 } else { x86_only.len() });

    let exceptions = doc.split("### Attempts that cannot have two layers").nth(1).expect("exceptions section");
    let exceptions = exceptions.split("\n## ").next().expect("section end");
    let documented = table_rows(exceptions);
    let code: Vec<Vec<String>> = SINGLE_LAYER.iter().map(|(id, why)| vec![id.to_string(), why.to_string()]).collect();
    assert_eq!(documented, code, "docs/canary.md's exceptions differ from SINGLE_LAYER (order included)");
}

/// Every `sealnode <subcommand> --option` the CI examples in docs/ci/ run exists in that
/// subcommand's --help, so the examples cannot drift from the command line.
#[test]
fn ci_examples_use_real_options() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut checked = 0;
    for entry in std::fs::read_dir(root.join("docs/ci")).expect("docs/ci") {
        let path = entry.expect("entry").path();
        let text = std::fs::read_to_string(&path).expect("read");
        for line in text.lines().filter(|l| !l.trim_start().starts_with('#') && !l.trim_start().starts_with("//")) {
            // The invocation follows `sealnode"` (the sudo form) or `sealnode `.
            let Some(at) = line.find("sealnode\" ").map(|i| i + 10).or_else(|| {
                line.match_indices("sealnode ").find(|(i, _)| *i == 0 || !line[..*i].ends_with('/')).map(|(i, _)| i + 9)
            }) else {
                continue;
            };
            let words: Vec<&str> = line[at..].split_whitespace().collect();
            let Some(sub) = words.first() else { continue };
            if !["doctor", "canary", "run", "ctl", "verify-receipt", "exec"].contains(sub) {
                continue;
            }
            let help = std::process::Command::new(env!("CARGO_BIN_EXE_sealnode"))
                .args([sub, &"--help"])
                .output_within(COMMAND_LIMIT);
            let help = String::from_utf8_lossy(&help.stdout);
            for w in words.iter().filter(|w| w.starts_with("--")) {
                assert!(help.contains(&format!("{w} ")), "{}: `sealnode {sub}` has no {w}", path.display());
                checked += 1;
            }
        }
    }
    assert!(checked >= 8, "only {checked} options checked: the extractor no longer finds the examples");
}

/// README's exit-status table is `sealnode::exit::TABLE`, as the man pages render it.
#[test]
fn readme_exit_codes_are_the_table() {
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).expect("README");
    let start = "<!-- exit-codes: generated from src/exit.rs; tests/docs.rs keeps it equal -->\n";
    let body = readme.split_once(start).and_then(|(_, rest)| rest.split_once("<!-- /exit-codes -->")).map(|(b, _)| b);
    let want = sealnode::exit::markdown();
    assert_eq!(body, Some(want.as_str()), "README.md's exit table differs from src/exit.rs; it should read:\n{want}");
}

/// README's two commands are the ones that exist, without `sudo` (a Debian root shell has
/// none), and .ci/run runs exactly the second.
#[test]
fn readme_two_commands_are_real_and_ci_runs_the_second() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).expect("README");
    let section = readme.split("## Two commands").nth(1).and_then(|s| s.split("```sh\n").nth(1)).expect("section");
    let block = section.split("```").next().expect("block");
    let commands: Vec<&str> =
        block.lines().filter(|l| !l.starts_with(' ')).filter_map(|l| l.split_whitespace().next()).collect();
    assert_eq!(commands, ["./scripts/demo", "./scripts/test"], "{block}");
    for c in &commands {
        let meta = std::fs::metadata(format!("{root}/{c}")).expect("script exists");
        assert!(std::os::unix::fs::PermissionsExt::mode(&meta.permissions()) & 0o111 != 0, "{c} is executable");
    }
    let ci = std::fs::read_to_string(format!("{root}/.ci/run")).expect(".ci/run");
    assert!(ci.lines().any(|l| l.trim() == "exec ./scripts/test"), ".ci/run runs ./scripts/test");
}

/// Every Markdown file a doc names exists in the repository (no citing a file a reader cannot
/// open).
#[test]
fn docs_name_only_files_that_exist() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs: Vec<std::path::PathBuf> = vec![root.join("README.md")];
    for dir in ["docs", "docs/ci"] {
        for e in std::fs::read_dir(root.join(dir)).expect("docs").flatten() {
            if e.path().extension().is_some_and(|x| x == "md") {
                docs.push(e.path());
            }
        }
    }
    let mut missing = Vec::new();
    for d in &docs {
        let text = std::fs::read_to_string(d).expect("doc");
        for word in text.split(|c: char| !(c.is_ascii_alphanumeric() || "._/-".contains(c))) {
            let Some(name) = word.strip_suffix(".md") else { continue };
            if name.is_empty() || name.starts_with("http") || name.starts_with("//") {
                continue;
            }
            let file = format!("{name}.md");
            let base = std::path::Path::new(&file);
            let found = [d.parent().expect("dir").join(base), root.join(base), root.join("docs").join(base)]
                .iter()
                .any(|p| p.exists());
            if !found {
                missing.push(format!("{}: {file}", d.strip_prefix(root).expect("rel").display()));
            }
        }
    }
    assert!(missing.is_empty(), "docs name Markdown files that are not in the repository: {missing:?}");
}

/// Every skip a test can take names a feature `scripts/test` documents (so
/// `SEALNODE_TEST_REQUIRE` can turn it into a failure), and the list names no feature nothing
/// skips: one list. Found by review: "python verifier" was not "python"; "mptcp" and
/// "x86_64" were missing.
#[test]
fn every_skip_names_a_documented_feature() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let script = std::fs::read_to_string(root.join("scripts/test")).expect("scripts/test");
    let listed: std::collections::BTreeSet<String> = script
        .split("(features:")
        .nth(1)
        .and_then(|t| t.split("; or all)").next())
        .expect("the feature list in scripts/test")
        .split_whitespace()
        .filter(|w| *w != "#")
        .map(str::to_string)
        .collect();
    let mut used = std::collections::BTreeSet::new();
    let mut files = vec![root.join("tests/common/mod.rs")];
    files.extend(
        std::fs::read_dir(root.join("tests"))
            .expect("tests")
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|x| x == "rs")),
    );
    for f in files {
        let text = std::fs::read_to_string(&f).expect("read");
        for call in ["unavailable(\"", "unavailable_then(\""] {
            for part in text.split(call).skip(1) {
                used.insert(part.split('"').next().expect("name").to_string());
            }
        }
    }
    // scripts/test's own skips (the package test) and the ones `unavailable` itself takes.
    used.insert("deb".into());
    used.remove("{feature}");
    let undocumented: Vec<_> = used.difference(&listed).collect();
    assert!(
        undocumented.is_empty(),
        "skipped features scripts/test does not list: {undocumented:?} (listed: {listed:?})"
    );
    let unused: Vec<_> = listed.difference(&used).collect();
    assert!(unused.is_empty(), "scripts/test lists features no test skips: {unused:?}");
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)).expect(rel)
}

/// README and every doc under docs/ (their paths, relative to the repository).
fn all_docs() -> Vec<String> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut docs = vec!["README.md".to_string()];
    for dir in ["docs", "docs/ci"] {
        for e in std::fs::read_dir(root.join(dir)).expect("docs").flatten() {
            if e.path().extension().is_some_and(|x| x == "md") {
                docs.push(format!("{dir}/{}", e.file_name().to_string_lossy()));
            }
        }
    }
    docs
}

/// Every exit-status table in the docs says of a `run` status what src/exit.rs says: a row
/// calls it "could not run" exactly where exit.rs does (that is 6; 3 is an escape, once
/// described as "found an escape, or could not run" in the operator guide).
#[test]
fn exit_status_tables_in_the_docs_agree_with_exit_rs() {
    let run: Vec<(&str, &str)> = sealnode::exit::rows_for("run").map(|r| (r.code, r.meaning)).collect();
    let mut rows = 0;
    for doc in all_docs() {
        for line in read(&doc).lines().filter(|l| l.starts_with("| ")) {
            let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
            let Some((_, meaning)) = run.iter().find(|(code, _)| cells.first() == Some(code)) else { continue };
            // Another command's table (verify-attestation's 10-14 are not run's) has no run rows.
            let said = line.contains("could not run");
            assert_eq!(said, meaning.contains("could not run"), "{doc}: {line}\nsrc/exit.rs: {meaning}");
            rows += 1;
        }
    }
    assert!(rows >= 14, "only {rows} exit-status rows found: README's and the operator guide's tables");
}

/// The Ollama profile's seccomp text is its socket rules: AF_INET/AF_INET6 SOCK_STREAM with
/// protocol 0 or TCP, and AF_UNIX stream pairs (once described as "stream/datagram").
#[test]
fn the_ollama_profiles_socket_rules_are_as_documented() {
    let policy: serde_json::Value = serde_json::from_str(&read("seccomp/engine-ollama.json")).expect("json");
    let filter = policy["engine"]["filter"].as_array().expect("filter");
    let args = |r: &serde_json::Value| -> Vec<(u64, u64)> {
        r["args"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|a| (a["index"].as_u64().expect("index"), a["val"].as_u64().expect("val")))
            .collect()
    };
    let mut sockets: Vec<Vec<(u64, u64)>> = filter.iter().filter(|r| r["syscall"] == "socket").map(args).collect();
    sockets.sort();
    assert_eq!(
        sockets,
        [[(0, 2), (1, 1), (2, 0)], [(0, 2), (1, 1), (2, 6)], [(0, 10), (1, 1), (2, 0)], [(0, 10), (1, 1), (2, 6)]],
        "engine-ollama.json's socket rules changed: docs/policies.md (Ollama profile) describes them"
    );
    for r in filter.iter().filter(|r| r["syscall"] == "socket" || r["syscall"] == "socketpair") {
        // The type is compared under mask 15 (SOCK_NONBLOCK/SOCK_CLOEXEC ignored) to SOCK_STREAM.
        let t = r["args"].as_array().expect("args").iter().find(|a| a["index"] == 1).expect("the type");
        assert_eq!((t["op"]["masked_eq"].as_u64(), t["val"].as_u64()), (Some(15), Some(1)), "{r}");
    }
    let pairs: Vec<Vec<(u64, u64)>> = filter.iter().filter(|r| r["syscall"] == "socketpair").map(args).collect();
    assert_eq!(pairs, [[(0, 1), (1, 1)]], "AF_UNIX stream pairs only");
    let doc = read("docs/policies.md");
    let section = doc.split("## Ollama profile").nth(1).expect("section").split("\n## ").next().expect("end");
    assert!(section.contains("SOCK_STREAM with protocol 0 or TCP only"), "{section}");
    assert!(!section.contains("stream/datagram"), "{section}");
}

/// The README's and the operator guide's advice on `exec` holds for the shipped filters: the
/// engine's has no vfork (dash's "Cannot fork") but clone without namespace flags (bash,
/// busybox sh); the node's has vfork.
#[test]
fn the_exec_debugging_advice_is_true_to_the_policies() {
    let has = |file: &str, name: &str| {
        let p: serde_json::Value = serde_json::from_str(&read(file)).expect("json");
        let role = p.as_object().expect("object").values().next().expect("the role's filter").clone();
        role["filter"].as_array().expect("filter").iter().any(|r| r["syscall"] == name)
    };
    assert!(!has("seccomp/engine.json", "vfork") && has("seccomp/engine.json", "clone"));
    assert!(has("seccomp/node.json", "vfork"));
    for doc in ["README.md", "docs/operator-guide.md"] {
        let text = read(doc);
        assert!(text.contains("Cannot fork") && text.contains("vfork") && text.contains("busybox sh -c"), "{doc}");
    }
    assert!(read("docs/operator-guide.md").contains("### Debugging inside a role"));
}

/// The GPU drop-ins the docs give carry `SystemCallFilter=pidfd_getfd` while an example GPU
/// config turns the denial log on: without it, that config refuses to start under the unit.
#[test]
fn gpu_drop_ins_allow_what_the_gpu_examples_need() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let logging: Vec<String> = std::fs::read_dir(root.join("examples"))
        .expect("examples")
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "toml"))
        .filter(|e| {
            std::fs::read_to_string(e.path())
                .expect("example")
                .lines()
                .any(|l| l.trim() == "log_refused_syscalls = true")
        })
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(logging.iter().any(|e| e == "llamacpp-cuda.toml"), "{logging:?}");
    // The most a GPU example's engine locks (rlimits.memlock_kb), in KiB.
    let gpu_memlock_kb = ["llamacpp-cuda.toml", "llamacpp-amd.toml", "ollama-nvidia.toml"]
        .iter()
        .filter_map(|e| {
            let text = read(&format!("examples/{e}"));
            let at = text.split("memlock_kb = ").nth(1)?;
            at.split(|c: char| !c.is_ascii_digit()).next()?.parse::<u64>().ok()
        })
        .max()
        .expect("the GPU examples' memlock_kb");
    assert!(gpu_memlock_kb >= 1 << 20, "{gpu_memlock_kb}");
    let mut drop_ins = 0;
    for doc in ["docs/operator-guide.md", "docs/gpu.md"] {
        for block in read(doc).split("```ini\n").skip(1).map(|b| b.split("```").next().expect("block")) {
            if block.contains("DeviceAllow=") {
                assert!(block.lines().any(|l| l == "SystemCallFilter=pidfd_getfd"), "{doc}: {block}");
                // sealnode's own memlock limit bounds the roles' (found by a docs audit: the
                // GPU examples ask for 16 GiB, systemd's default is 8 MiB).
                let gib: Option<u64> = block
                    .lines()
                    .find_map(|l| l.strip_prefix("LimitMEMLOCK="))
                    .and_then(|v| v.strip_suffix('G'))
                    .and_then(|v| v.parse().ok());
                assert!(gib.is_some_and(|g| g << 20 >= gpu_memlock_kb), "{doc}: {block}");
                drop_ins += 1;
            }
        }
    }
    assert_eq!(drop_ins, 2, "one GPU drop-in in each of docs/operator-guide.md and docs/gpu.md");
    // The unit's own pointer to the GPU drop-in names it too.
    let unit = read("systemd/sealnode.service");
    let gpu =
        unit.lines().skip_while(|l| !l.contains("GPU engines: see the operator guide")).take(3).collect::<String>();
    assert!(gpu.contains("SystemCallFilter=pidfd_getfd"), "systemd/sealnode.service: {gpu}");
}

/// `/etc/sealnode` is made before anything is written into it: in the operator guide's manual
/// install and the README's quick start (a package install makes it).
#[test]
fn etc_sealnode_is_made_before_it_is_used() {
    let guide = read("docs/operator-guide.md");
    let by_hand = guide.split("### By hand").nth(1).expect("section").split("```sh\n").nth(1).expect("block");
    let lines: Vec<&str> = by_hand.split("```").next().expect("block").lines().collect();
    let made = lines.iter().position(|l| l.starts_with("install -d") && l.contains(" /etc/sealnode"));
    let used = lines.iter().position(|l| l.contains("/etc/sealnode/"));
    assert!(made.is_some() && made < used, "{lines:#?}");
    let readme = read("README.md");
    let step = readme.split("\n4. ").nth(1).expect("step 4").split("\n5. ").next().expect("end");
    assert!(step.contains("install -d -m 0755 /etc/sealnode"), "{step}");
}

/// README's user creation is one command that works on a fresh host and again (useradd exits 9
/// for a user that exists), with no home directory: parsed by bash and, where both users exist
/// and we are root, run.
#[test]
fn readme_useradd_is_idempotent() {
    let readme = read("README.md");
    let step = readme.split("\n3. Create the role users").nth(1).expect("step 3").split("\n4. ").next().expect("end");
    let cmd: String = step.split('`').nth(1).expect("the command").split_whitespace().collect::<Vec<_>>().join(" ");
    assert!(cmd.contains("id -u \"$u\" >/dev/null 2>&1 || useradd --system"), "{cmd}");
    assert!(cmd.contains("--home-dir /nonexistent") && cmd.contains("--shell /usr/sbin/nologin"), "{cmd}");
    assert!(cmd.contains("sealnode-engine sealnode-node"), "{cmd}");
    let parsed = std::process::Command::new("bash").args(["-n", "-c", &cmd]).output_within(COMMAND_LIMIT);
    assert!(parsed.status.success(), "{cmd}: {}", String::from_utf8_lossy(&parsed.stderr));
    let exists =
        |u: &str| std::process::Command::new("id").args(["-u", u]).output_within(COMMAND_LIMIT).status.success();
    if nix::unistd::Uid::effective().is_root() && exists("sealnode-engine") && exists("sealnode-node") {
        let o = std::process::Command::new("bash").args(["-c", &cmd]).output_within(COMMAND_LIMIT);
        assert!(o.status.success(), "{cmd} with both users there: {}", String::from_utf8_lossy(&o.stderr));
    }
}

/// What the docs say `check` reports for a config with several mistakes is what it reports:
/// each problem at once (README step 5, docs/operator-guide.md), with its line.
#[test]
fn check_reports_config_errors_as_the_docs_say() {
    let dir = tempfile::tempdir().expect("tmp");
    let cfg = dir.path().join("sealnode.toml");
    std::fs::write(
        &cfg,
        "schema = 1\n[cell]\nstate_dir = \"/var/lib/x\"\nruntime_dir = \"/run/x\"\nstop_timeout_s = \"x\"\nhostname = 7\n\
         egress_idle_timeout_s = 0\n",
    )
    .expect("write");
    let o = std::process::Command::new(env!("CARGO_BIN_EXE_sealnode"))
        .args(["check", "--config"])
        .arg(&cfg)
        .output_within(COMMAND_LIMIT);
    assert_eq!(o.status.code(), Some(125));
    let out = String::from_utf8_lossy(&o.stdout);
    for f in ["cell.stop_timeout_s (line 5)", "cell.hostname (line 6)"] {
        assert!(out.contains(f), "{f} not named:\n{out}");
    }
    assert!(read("README.md").contains("not load lists each problem it finds at once"), "README step 5");
    assert!(read("docs/operator-guide.md").contains("lists each problem it finds"), "operator guide");
    for doc in all_docs() {
        assert!(!read(&doc).contains("shows its first error"), "{doc} says check shows one error");
    }
}

/// docs/operator-guide.md's exposure table is what this host's `systemd-analyze security`
/// says, for the systemd version it runs (the table names the versions it was measured with).
#[test]
fn the_exposure_table_is_what_systemd_analyze_says() {
    let sa = "/usr/bin/systemd-analyze";
    if !std::path::Path::new(sa).exists() {
        return common::unavailable("systemd", "systemd-analyze missing (apt-get install systemd)");
    }
    let version = std::process::Command::new(sa).arg("--version").output_within(COMMAND_LIMIT);
    let major = String::from_utf8_lossy(&version.stdout).split_whitespace().nth(1).unwrap_or("?").to_string();
    let guide = read("docs/operator-guide.md");
    let section = guide.split("**Exposure.**").nth(1).expect("the exposure paragraph");
    let header: Vec<String> = section
        .lines()
        .find(|l| l.starts_with("| unit |"))
        .expect("the table")
        .trim_matches('|')
        .split(" | ")
        .map(|c| c.trim().to_string())
        .collect();
    let Some(col) = header.iter().position(|h| h.starts_with(&format!("systemd {major} "))) else {
        return common::unavailable("systemd", &format!("systemd {major}: not in the exposure table ({header:?})"));
    };
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let rows = table_rows(section);
    assert!(rows.len() >= 4, "{rows:?}");
    for row in rows {
        let unit = &row[0];
        let o = std::process::Command::new(sa)
            .args(["security", "--offline=yes"])
            .arg(root.join("systemd").join(unit))
            .output_within(COMMAND_LIMIT);
        let text = String::from_utf8_lossy(&o.stdout);
        let score = text
            .lines()
            .find_map(|l| l.split("Overall exposure level for ").nth(1))
            .and_then(|r| r.split(": ").nth(1))
            .and_then(|r| r.split_whitespace().next())
            .unwrap_or_else(|| panic!("{unit}: no score in {text}"));
        assert_eq!(row[col].split("**").nth(1), Some(score), "{unit} under systemd {major}: the doc says {}", row[col]);
    }
}

/// Every function the supervisor's module doc names in its sequences, hop by hop, is a
/// function of the code (`fn name`), and every type path it names (`Type::name`) is that
/// type's: the hop list is the parent side's counterpart of `child_main`'s steps, and a
/// renamed or removed hop fails here.
#[test]
fn the_supervisors_hop_lists_name_functions_that_exist() {
    let doc: String =
        read("src/supervisor/mod.rs").lines().filter_map(|l| l.strip_prefix("//!")).collect::<Vec<_>>().join("\n");
    let hops = doc.split("The sequences, hop by hop:").nth(1).expect("mod.rs's doc lists the sequences");
    let mut src = String::new();
    let mut dirs = vec![std::path::PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("src")];
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).expect("src").flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == "rs") {
                src.push_str(&std::fs::read_to_string(&p).expect("read"));
            }
        }
    }
    let mut named = 0;
    for quoted in hops.split('`').skip(1).step_by(2) {
        // `begin_stop(code, Exit)`, `gate.begin`, `Restarts::on_exit`, `Cycle::next`.
        let path = quoted.split('(').next().unwrap_or_default();
        // A named argument (`Exit`, `DryRun`) is a variant of an enum the function takes.
        let fn_name = path.rsplit(['.', ':']).next().unwrap_or_default();
        let args = quoted.split_once('(').map(|(_, a)| a.trim_end_matches(')')).unwrap_or_default();
        for arg in args.split(',').map(str::trim) {
            let camel = arg.chars().next().is_some_and(|c| c.is_ascii_uppercase())
                && arg.chars().any(|c| c.is_ascii_lowercase())
                && arg.chars().all(|c| c.is_ascii_alphanumeric());
            if !camel {
                continue;
            }
            let takes = src.split(&format!("fn {fn_name}(")).skip(1).any(|rest| {
                let params = rest.split(')').next().unwrap_or_default();
                params
                    .split([':', ',', ' ', '&'])
                    .filter(|t| t.chars().next().is_some_and(|c| c.is_ascii_uppercase()))
                    .any(|ty| {
                        src.split(&format!("enum {ty} {{")).skip(1).any(|body| {
                            let body = body.split("\n}").next().unwrap_or_default();
                            body.lines().any(|l| {
                                let l = l.trim();
                                l == format!("{arg},")
                                    || l.starts_with(&format!("{arg}("))
                                    || l.starts_with(&format!("{arg} {{"))
                            })
                        })
                    })
            });
            assert!(takes, "src/supervisor/mod.rs's hop list names `{quoted}`, but `{arg}` is no variant of what `{fn_name}` takes");
        }
        let (owner, name) = match path.rsplit_once("::").or_else(|| path.rsplit_once('.')) {
            Some((owner, name)) => (Some(owner), name),
            None => (None, path),
        };
        let is_fn = !name.is_empty() && name.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
        if !is_fn {
            continue;
        }
        named += 1;
        assert!(
            src.contains(&format!("fn {name}(")) || src.contains(&format!("fn {name}<")),
            "src/supervisor/mod.rs's hop list names `{quoted}`, but no `fn {name}` exists"
        );
        // A type's function: that type has it (an `impl Type` block before it).
        if let Some(owner) = owner.filter(|o| o.chars().next().is_some_and(|c| c.is_ascii_uppercase())) {
            let has = src.split(&format!("impl {owner} {{")).skip(1).any(|block| {
                let block = block.split("\nimpl ").next().unwrap_or_default();
                block.contains(&format!("fn {name}("))
            });
            assert!(has, "src/supervisor/mod.rs's hop list names `{quoted}`, but `{owner}` has no `fn {name}`");
        }
    }
    assert!(named > 30, "the hop list names only {named} functions: did its heading change?");
}

/// The operator guide counts what the package ships as the files have it: the lintian tags
/// overridden, and the system users the sysusers snippet makes (a docs audit found "three"
/// tags where there were six, and two users where there are three).
#[test]
fn the_operator_guide_counts_the_overrides_and_users_the_package_has() {
    const WORDS: [&str; 10] = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine"];
    let lines = |rel: &str, keep: &dyn Fn(&str) -> bool| read(rel).lines().filter(|l| keep(l)).count();
    let tags = lines("debian/lintian-overrides", &|l| !l.trim().is_empty() && !l.starts_with('#'));
    let users = lines("systemd/sealnode.sysusers", &|l| l.starts_with("u "));
    let guide = read("docs/operator-guide.md").split_whitespace().collect::<Vec<_>>().join(" ");
    let said = format!("but the {} `debian/lintian-overrides` names", WORDS[tags]);
    assert!(guide.contains(&said), "docs/operator-guide.md should say {said:?}");
    let said = format!("so do the {} system users", WORDS[users]);
    assert!(guide.contains(&said), "docs/operator-guide.md should say {said:?}");
}

/// Every metric family sealnode exports is in the operator guide's metrics table, whole or as
/// a `_suffix` of the family before it in the same row (a docs audit found
/// `sealnode_role_refused_syscalls_total` missing).
#[test]
fn every_metric_family_is_in_the_operator_guide() {
    let src = read("src/control/metrics.rs");
    let guide = read("docs/operator-guide.md");
    let mut families: Vec<&str> = src
        .split('"')
        .filter(|s| s.starts_with("sealnode_") && s.bytes().all(|b| b == b'_' || b.is_ascii_lowercase()))
        .collect();
    families.sort_unstable();
    families.dedup();
    assert!(families.len() > 20, "{families:?}");
    for f in families {
        let row = guide.lines().find(|l| {
            l.starts_with("| `sealnode_")
                && (l.contains(&format!("`{f}`")) || l.contains(&format!("`{f}{{")) || {
                    // `sealnode_role_memory_bytes`, `_memory_peak_bytes`: the row's first family's
                    // prefix (up to its second underscore) stands before each suffix.
                    let first = l.split('`').nth(1).unwrap_or_default();
                    let prefix: String = first.splitn(3, '_').take(2).collect::<Vec<_>>().join("_");
                    f.strip_prefix(&prefix).is_some_and(|rest| l.contains(&format!("`{rest}`")))
                })
        });
        assert!(row.is_some(), "docs/operator-guide.md's metrics table lacks {f}");
    }
}
