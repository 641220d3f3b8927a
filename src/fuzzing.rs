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
/// (with the chosen arguments) and a spread of numbers exactly alike.
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
    let ours = match crate::policy::seccomp::compile_text(text, file, "engine", arch) {
        Ok(p) => p,
        Err(e) => return clear(&e),
    };
    let theirs = match crate::policy::seccomp::compile_with_seccompiler(text, file, "engine", arch) {
        Ok(p) => p,
        // sealnode's syscall table (the `syscalls` crate) knows newer calls, e.g. setxattrat,
        // than seccompiler's: no reference to compare against then, and not a bug.
        Err(e) if e.to_string().contains("Invalid syscall name") => return,
        Err(e) => panic!("sealnode accepted a policy seccompiler rejects: {e}"),
    };
    let a = crate::policy::bpf::audit_arch(arch);
    let filter = crate::policy::bpf::parse(text, file, "engine", arch).expect("parsed once already");
    let named = filter.rules.keys().copied();
    for n in std::iter::once(nr).chain(named).chain((0..600).step_by(7)).chain([0x4000_0000 | nr, u32::MAX]) {
        for args in [args, [0; 6]] {
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
    let mut buf = Vec::new();
    for chunk in data.chunks(3) {
        if let Some(r) = crate::control::feed(&mut buf, chunk) {
            if let Err(e) = r {
                assert!(!e.is_empty(), "empty control error");
            }
            break;
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
