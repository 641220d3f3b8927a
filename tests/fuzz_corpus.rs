//! Replays the committed fuzz corpus (`fuzz/corpus/<target>/`) through the same entry points the
//! cargo-fuzz targets call, so CI catches a parser regression without running a fuzzer.

use std::path::Path;

#[test]
fn the_fuzz_corpus_replays_cleanly() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    for (name, target) in sealnode::fuzzing::TARGETS {
        let dir = root.join(name);
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.expect("entry").path();
            let data = std::fs::read(&path).expect("read");
            let r = std::panic::catch_unwind(|| target(&data));
            assert!(r.is_ok(), "fuzz target {name} panics on {}", path.display());
            n += 1;
        }
        assert!(n >= 3, "fuzz/corpus/{name} has only {n} inputs");
    }
}

/// The seeds that are valid inputs must stay valid: a corpus of rejections tests nothing.
#[test]
fn the_seed_inputs_are_accepted() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let read = |p: &str| std::fs::read_to_string(root.join(p)).expect(p);
    let file = Path::new("seed");
    for p in ["config/seed-llamacpp.toml", "config/seed-ollama.toml"] {
        sealnode::config::Config::parse(&read(p), file).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    for p in ["landlock_rules/seed-engine.toml", "landlock_rules/seed-node.toml"] {
        sealnode::policy::landlock::Rules::parse(&read(p), file).unwrap_or_else(|e| panic!("{p}: {e}"));
    }
    sealnode::receipt::parse(read("receipt/seed-valid.json").as_bytes(), file).expect("receipt seed");
    assert!(sealnode::control::parse(read("control/seed-status").as_bytes()).is_ok());
    let s = std::fs::read(root.join("seccomp/seed-engine-x86_64")).expect("seccomp seed");
    let text = std::str::from_utf8(&s[53..]).expect("utf8");
    sealnode::policy::seccomp::compile_text(text, file, "engine", seccompiler::TargetArch::x86_64).expect("compiles");
}
