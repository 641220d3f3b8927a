//! Fuzz entry points: one function per parser that faces operator-written or untrusted input.
//! The cargo-fuzz targets under `fuzz/` call these, and `tests/fuzz_corpus.rs` replays the
//! committed corpus through the same functions, so CI catches a regression without a fuzzer.
//!
//! Each function panics only when it finds a bug: a panic inside a parser, a rejection without a
//! clear message naming the file, or (for seccomp) a compiled program that decides a syscall
//! differently from what the JSON policy says.

use std::path::Path;

use seccompiler::TargetArch;

const FILE: &str = "fuzz-input";

/// A rejection must be a clear error: it names the file and says why.
fn clear(e: &crate::Error) {
    let msg = e.to_string();
    assert!(msg.contains(FILE), "error does not name the file: {msg:?}");
    assert!(msg.len() > FILE.len() + 4, "error without a reason: {msg:?}");
}

/// The config loader's pure half (TOML, schema, field validation).
pub fn config(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = crate::config::Config::parse(text, Path::new(FILE)) {
        clear(&e);
    }
}

/// A Landlock rules file.
pub fn landlock_rules(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else { return };
    if let Err(e) = crate::policy::landlock::Rules::parse(text, Path::new(FILE)) {
        clear(&e);
    }
}

/// Differential: the first 53 bytes choose an architecture, a syscall number and six arguments;
/// the rest is a seccompiler JSON policy whose filter `engine` sealnode compiles. When sealnode
/// accepts the policy, seccompiler (the reference implementation of the JSON's meaning) must
/// accept it too, and both programs must decide the chosen call, every syscall the policy names
/// and their neighbours, and every number below 1024, with the chosen, zero, all-ones and
/// high-word-flipped arguments, exactly alike. Rules for calls only sealnode's newer table
/// knows are dropped from the comparison.
pub fn seccomp(data: &[u8]) {
    const HEAD: usize = 1 + 4 + 6 * 8;
    if data.len() < HEAD {
        return;
    }
    let (head, json) = data.split_at(HEAD);
    let Ok(text) = std::str::from_utf8(json) else { return };
    let arch = if head[0] & 1 == 0 { TargetArch::x86_64 } else { TargetArch::aarch64 };
    let nr = u32::from_le_bytes([head[1], head[2], head[3], head[4]]);
    let mut args = [0u64; 6];
    for (i, a) in args.iter_mut().enumerate() {
        let mut b = [0u8; 8];
        b.copy_from_slice(&head[5 + i * 8..13 + i * 8]);
        *a = u64::from_le_bytes(b);
    }
    let file = Path::new(FILE);
    let _accepted = match crate::policy::seccomp::compile_text(text, file, "engine", arch) {
        Ok(p) => p,
        Err(e) => return clear(&e),
    };
    // sealnode's syscall table (the `syscalls` crate) knows newer calls than seccompiler's, e.g.
    // setxattrat: drop the rules seccompiler cannot name and compare both compilers on the rest.
    let mut text = text.to_string();
    let theirs = loop {
        match crate::policy::seccomp::compile_with_seccompiler(&text, file, "engine", arch) {
            Ok(p) => break p,
            Err(e) => {
                let msg = e.to_string();
                let Some(name) = msg.split("Invalid syscall name: ").nth(1).and_then(|r| r.split(' ').next()) else {
                    panic!("sealnode accepted a policy seccompiler rejects: {msg}");
                };
                let mut doc: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
                let rules = doc["engine"]["filter"].as_array_mut().expect("linted");
                let before = rules.len();
                rules.retain(|r| r["syscall"].as_str() != Some(name));
                assert!(rules.len() < before, "seccompiler refuses {name:?}, which no rule names: {msg}");
                text = doc.to_string();
            }
        }
    };
    let ours = match crate::policy::seccomp::compile_text(&text, file, "engine", arch) {
        Ok(p) => p,
        // Without the newer calls' rules a filter may be empty and refused: nothing to compare.
        Err(_) => return,
    };
    let text = text.as_str();
    let a = crate::policy::arch::audit_arch(arch);
    let filter = crate::policy::bpf::parse(text, file, "engine", arch).expect("parsed once already");
    let named = filter.rules.keys().copied();
    // Every number a named call's neighbours, low numbers densely, and the X32 bit.
    let near = filter.rules.keys().flat_map(|n| [n.wrapping_sub(1), n + 1]).collect::<Vec<_>>();
    let numbers = std::iter::once(nr).chain(named).chain(near).chain(0..1024).chain([0x4000_0000 | nr, u32::MAX]);
    for n in numbers {
        for args in [args, [0; 6], [u64::MAX; 6], args.map(|x| x ^ 0xffff_ffff_0000_0000)] {
            let (o, t) =
                (crate::policy::bpf::interpret(&ours, a, n, args), crate::policy::bpf::interpret(&theirs, a, n, args));
            assert_eq!(o, t, "nr {n} args {args:x?}: sealnode {o:#x}, seccompiler {t:#x}");
        }
    }
}

/// The control socket's request parser, whole and fed in pieces as a slow client would.
pub fn control(data: &[u8]) {
    let whole = crate::control::parse(data);
    if let Err(e) = &whole {
        assert!(!e.is_empty(), "empty control error");
    }
    // Fed in pieces, the parser must reach the same answer as for the whole input: the same
    // request or the same error, once the line (or too much) has arrived.
    let mut buf = Vec::new();
    let mut chunked = None;
    for chunk in data.chunks(3) {
        if let Some(r) = crate::control::feed(&mut buf, chunk) {
            chunked = Some(r);
            break;
        }
    }
    let mut once = Vec::new();
    let fed_whole = crate::control::feed(&mut once, data);
    assert_eq!(chunked, fed_whole, "chunked and whole feeds differ");
    if let Some(r) = chunked {
        if let Err(e) = &r {
            assert!(!e.is_empty(), "empty control error");
        }
        // A complete line parses the same as `parse` on that line.
        if let Some(end) = data.iter().position(|b| *b == b'\n').filter(|e| *e <= crate::control::MAX_REQUEST) {
            assert_eq!(r, crate::control::parse(&data[..=end]), "feed and parse differ");
        }
    }
}

/// A receipt file (what `verify-receipt` reads).
pub fn receipt(data: &[u8]) {
    if let Err(e) = crate::receipt::parse(data, Path::new(FILE)) {
        clear(&e);
    }
}

/// One fuzz entry point.
pub type Target = fn(&[u8]);

/// The targets by name, for the corpus replay.
pub const TARGETS: &[(&str, Target)] = &[
    ("config", config),
    ("landlock_rules", landlock_rules),
    ("seccomp", seccomp),
    ("control", control),
    ("receipt", receipt),
];
