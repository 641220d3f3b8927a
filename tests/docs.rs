//! docs/architecture.md lists the setup steps in the order `child_main` performs them.

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

#[test]
fn canary_doc_lists_every_attempt_and_exception() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/canary.md")).expect("doc");
    for s in sealnode::canary::SPECS {
        assert!(doc.contains(&format!("| `{}` |", s.id)), "docs/canary.md lacks attempt {}", s.id);
    }
    let exceptions = doc.split("### Attempts that cannot have two layers").nth(1).expect("section");
    for (id, _) in sealnode::canary::SINGLE_LAYER {
        assert!(exceptions.contains(&format!("| `{id}` |")), "docs/canary.md lacks exception {id}");
    }
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
                .output()
                .expect("help");
            let help = String::from_utf8_lossy(&help.stdout);
            for w in words.iter().filter(|w| w.starts_with("--")) {
                assert!(help.contains(&format!("{w} ")), "{}: `sealnode {sub}` has no {w}", path.display());
                checked += 1;
            }
        }
    }
    assert!(checked >= 8, "only {checked} options checked: the extractor no longer finds the examples");
}
