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
    use sealnode::canary::{Roles, SINGLE_LAYER, SPECS};
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
