//! sealnode's own seccomp-BPF compiler for seccompiler JSON policies.
//!
//! seccompiler emits a linear chain (one comparison per allowed syscall), so a syscall near
//! the end of the list, a denied one, and every argument-filtered one walk hundreds of
//! instructions, and attaching the filter (the kernel evaluates it for every syscall number
//! to build its cache) costs time proportional to that length. This compiler reads the same
//! JSON (the policy format stays seccompiler's) and emits:
//!
//! - the architecture check (any other audit arch, e.g. i386 via int 0x80, kills the process);
//! - first the argument-filtered syscalls, most frequent first (`openat`, `ioctl`, ...), each
//!   with its checks inline: the kernel caches "always allowed" per number, so after attach
//!   these (and denied ones) are the only calls that run the filter at all;
//! - then a binary search over the unconditionally allowed numbers (x32 numbers, above every
//!   entry, fall through to the default), with `ja` trampolines so no 8-bit jump offset can
//!   overflow, and local return instructions at each leaf;
//! - argument checks with seccompiler's exact semantics: `dword` compares the low 32 bits,
//!   `qword` all 64.
//!
//! The unit tests interpret both programs with a small BPF interpreter and require the same
//! decision for every syscall number and for edge-case arguments of every conditional rule.

use std::collections::BTreeMap;
use std::path::Path;

use seccompiler::{sock_filter, BpfProgram, TargetArch};
use serde_json::Value;

use super::arch::{audit_arch, syscall_nr};
use crate::error::{Error, Result};

const BPF_LD_W_ABS: u16 = 0x20;
const BPF_JEQ_K: u16 = 0x15;
const BPF_JGT_K: u16 = 0x25;
const BPF_JGE_K: u16 = 0x35;
const BPF_JA: u16 = 0x05;
const BPF_RET_K: u16 = 0x06;
const BPF_AND_K: u16 = 0x54;

pub const RET_ALLOW: u32 = 0x7fff_0000;
pub const RET_KILL_PROCESS: u32 = 0x8000_0000;
const RET_KILL_THREAD: u32 = 0;
const RET_TRAP: u32 = 0x0003_0000;
const RET_ERRNO: u32 = 0x0005_0000;

const OFF_NR: u32 = 0;
const OFF_ARCH: u32 = 4;
const OFF_ARGS: u32 = 16;

/// Entries per binary-search leaf (a short linear run beats another level of the tree).
const LEAF: usize = 4;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Eq,
    Ne,
    Lt,
    Le,
    Gt,
    Ge,
    MaskedEq(u64),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cond {
    pub index: u8,
    pub qword: bool,
    pub op: Op,
    pub val: u64,
}

/// A parsed policy: per syscall number, the rules (OR) of conditions (AND); an empty rule
/// list means "always allowed".
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Filter {
    pub arch: TargetArch,
    pub rules: BTreeMap<u32, Vec<Vec<Cond>>>,
    pub default: u32,
}

fn action(v: &Value) -> Option<u32> {
    match v {
        Value::String(s) => match s.as_str() {
            "kill_process" => Some(RET_KILL_PROCESS),
            "kill_thread" => Some(RET_KILL_THREAD),
            "trap" => Some(RET_TRAP),
            "allow" => Some(RET_ALLOW),
            _ => None,
        },
        // Exactly {"errno": N} with 1 <= N <= 4095: a larger value would be masked (65536 -> 0,
        // a denied call "succeeding" without running) and errno 0 means success.
        Value::Object(o) if o.len() == 1 => {
            o.get("errno").and_then(Value::as_u64).filter(|e| (1..=4095).contains(e)).map(|e| RET_ERRNO | e as u32)
        }
        _ => None,
    }
}

/// Parse the filter named `role` from a (linted) seccompiler JSON document for `arch`.
pub fn parse(text: &str, file: &Path, role: &str, arch: TargetArch) -> Result<Filter> {
    let doc: Value = serde_json::from_str(text).map_err(|e| Error::policy(file, format!("not valid JSON: {e}")))?;
    parse_doc(&doc, file, role, arch)
}

/// [`parse`] of a document already parsed (the lint's, `policy::seccomp`).
pub fn parse_doc(doc: &Value, file: &Path, role: &str, arch: TargetArch) -> Result<Filter> {
    let err = |r: String| Error::policy(file, format!("filter {role:?}: {r}"));
    let f = doc.get(role).ok_or_else(|| Error::policy(file, format!("has no filter named {role:?}")))?;
    let default = f
        .get("mismatch_action")
        .or_else(|| f.get("default_action"))
        .and_then(action)
        .filter(|a| *a != RET_ALLOW)
        .ok_or_else(|| err("mismatch_action must be errno, kill_process, kill_thread or trap".into()))?;
    let mut rules: BTreeMap<u32, Vec<Vec<Cond>>> = BTreeMap::new();
    for (i, r) in f.get("filter").and_then(Value::as_array).into_iter().flatten().enumerate() {
        let name = r.get("syscall").and_then(Value::as_str).ok_or_else(|| err(format!("rule {i}: missing syscall")))?;
        if !matches!(arch, TargetArch::x86_64) && super::arch::X86_64_ONLY.contains(&name) {
            continue;
        }
        let nr =
            syscall_nr(arch, name).ok_or_else(|| err(format!("rule {i}: unknown system call {name:?} on {arch:?}")))?;
        let entry = rules.entry(nr).or_default();
        let args = match r.get("args") {
            None => continue,
            // Anything but a non-empty array would otherwise become an unconditional allow.
            Some(Value::Array(a)) if !a.is_empty() => a,
            Some(_) => return Err(err(format!("rule {i} ({name}): \"args\" must be a non-empty array of conditions"))),
        };
        let mut conds = Vec::new();
        for a in args {
            let index = a
                .get("index")
                .and_then(Value::as_u64)
                .filter(|x| *x < 6)
                .ok_or_else(|| err(format!("rule {i} ({name}): bad index")))? as u8;
            let qword = match a.get("type").and_then(Value::as_str) {
                Some("dword") => false,
                Some("qword") => true,
                _ => return Err(err(format!("rule {i} ({name}): type must be dword or qword"))),
            };
            let val = a.get("val").and_then(Value::as_u64).ok_or_else(|| err(format!("rule {i} ({name}): bad val")))?;
            let op = match a.get("op") {
                Some(Value::String(s)) => match s.as_str() {
                    "eq" => Op::Eq,
                    "ne" => Op::Ne,
                    "lt" => Op::Lt,
                    "le" => Op::Le,
                    "gt" => Op::Gt,
                    "ge" => Op::Ge,
                    o => return Err(err(format!("rule {i} ({name}): unknown op {o:?}"))),
                },
                Some(Value::Object(o)) => Op::MaskedEq(
                    o.get("masked_eq")
                        .and_then(Value::as_u64)
                        .ok_or_else(|| err(format!("rule {i} ({name}): bad masked_eq")))?,
                ),
                _ => return Err(err(format!("rule {i} ({name}): missing op"))),
            };
            if !qword && (val > u64::from(u32::MAX) || matches!(op, Op::MaskedEq(m) if m > u64::from(u32::MAX))) {
                return Err(err(format!("rule {i} ({name}): a dword comparison takes a 32-bit value")));
            }
            conds.push(Cond { index, qword, op, val });
        }
        entry.push(conds);
    }
    Ok(Filter { arch, rules, default })
}

/// A jump target in the program being assembled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Label(usize);

#[derive(Debug, Clone, Copy)]
enum Ins {
    Ld(u32),
    And(u32),
    Ret(u32),
    Ja(Label),
    /// Conditional jump: code, constant, true target, false target (None = next instruction).
    J(u16, u32, Option<Label>, Option<Label>),
    Mark(Label),
}

#[derive(Default)]
struct Asm {
    ins: Vec<Ins>,
    labels: usize,
}

impl Asm {
    fn label(&mut self) -> Label {
        self.labels += 1;
        Label(self.labels)
    }
    fn push(&mut self, i: Ins) {
        self.ins.push(i);
    }
    fn mark(&mut self, l: Label) {
        self.ins.push(Ins::Mark(l));
    }

    fn assemble(self) -> Result<BpfProgram> {
        let mut at = vec![usize::MAX; self.labels + 1];
        let mut pc = 0;
        for i in &self.ins {
            match i {
                Ins::Mark(l) => at[l.0] = pc,
                _ => pc += 1,
            }
        }
        let mut out = Vec::with_capacity(pc);
        let rel = |from: usize, l: Option<Label>| -> Result<u8> {
            let Some(l) = l else { return Ok(0) };
            let to = at[l.0];
            u8::try_from(to - from - 1).map_err(|_| Error::policy(Path::new("(bpf)"), "jump offset overflow"))
        };
        for i in &self.ins {
            let pc = out.len();
            let f = |code: u16, jt: u8, jf: u8, k: u32| sock_filter { code, jt, jf, k };
            match *i {
                Ins::Mark(_) => continue,
                Ins::Ld(off) => out.push(f(BPF_LD_W_ABS, 0, 0, off)),
                Ins::And(k) => out.push(f(BPF_AND_K, 0, 0, k)),
                Ins::Ret(k) => out.push(f(BPF_RET_K, 0, 0, k)),
                Ins::Ja(l) => out.push(f(BPF_JA, 0, 0, (at[l.0] - pc - 1) as u32)),
                Ins::J(code, k, t, e) => out.push(f(code, rel(pc, t)?, rel(pc, e)?, k)),
            }
        }
        Ok(out)
    }
}

fn lo(v: u64) -> u32 {
    v as u32
}
fn hi(v: u64) -> u32 {
    (v >> 32) as u32
}

/// Emit one condition: fall through when it holds, jump to `fail` when it does not.
fn cond(a: &mut Asm, c: &Cond, fail: Label) {
    let lo_off = OFF_ARGS + 8 * u32::from(c.index);
    let hi_off = lo_off + 4;
    let pass = a.label();
    if !c.qword {
        a.push(Ins::Ld(lo_off));
        match c.op {
            Op::Eq => a.push(Ins::J(BPF_JEQ_K, lo(c.val), None, Some(fail))),
            Op::Ne => a.push(Ins::J(BPF_JEQ_K, lo(c.val), Some(fail), None)),
            Op::Gt => a.push(Ins::J(BPF_JGT_K, lo(c.val), None, Some(fail))),
            Op::Ge => a.push(Ins::J(BPF_JGE_K, lo(c.val), None, Some(fail))),
            Op::Lt => a.push(Ins::J(BPF_JGE_K, lo(c.val), Some(fail), None)),
            Op::Le => a.push(Ins::J(BPF_JGT_K, lo(c.val), Some(fail), None)),
            Op::MaskedEq(m) => {
                a.push(Ins::And(lo(m)));
                a.push(Ins::J(BPF_JEQ_K, lo(c.val & m), None, Some(fail)));
            }
        }
        a.mark(pass);
        return;
    }
    let (vh, vl) = (hi(c.val), lo(c.val));
    match c.op {
        Op::Eq => {
            a.push(Ins::Ld(hi_off));
            a.push(Ins::J(BPF_JEQ_K, vh, None, Some(fail)));
            a.push(Ins::Ld(lo_off));
            a.push(Ins::J(BPF_JEQ_K, vl, None, Some(fail)));
        }
        Op::Ne => {
            a.push(Ins::Ld(hi_off));
            a.push(Ins::J(BPF_JEQ_K, vh, None, Some(pass)));
            a.push(Ins::Ld(lo_off));
            a.push(Ins::J(BPF_JEQ_K, vl, Some(fail), None));
        }
        Op::MaskedEq(m) => {
            a.push(Ins::Ld(hi_off));
            a.push(Ins::And(hi(m)));
            a.push(Ins::J(BPF_JEQ_K, hi(c.val & m), None, Some(fail)));
            a.push(Ins::Ld(lo_off));
            a.push(Ins::And(lo(m)));
            a.push(Ins::J(BPF_JEQ_K, lo(c.val & m), None, Some(fail)));
        }
        // Unsigned 64-bit orderings: decided by the high words unless they are equal.
        Op::Gt | Op::Ge => {
            a.push(Ins::Ld(hi_off));
            a.push(Ins::J(BPF_JGT_K, vh, Some(pass), None));
            a.push(Ins::J(BPF_JEQ_K, vh, None, Some(fail)));
            a.push(Ins::Ld(lo_off));
            let code = if c.op == Op::Gt { BPF_JGT_K } else { BPF_JGE_K };
            a.push(Ins::J(code, vl, None, Some(fail)));
        }
        Op::Lt | Op::Le => {
            a.push(Ins::Ld(hi_off));
            a.push(Ins::J(BPF_JGT_K, vh, Some(fail), None));
            a.push(Ins::J(BPF_JEQ_K, vh, None, Some(pass)));
            a.push(Ins::Ld(lo_off));
            let code = if c.op == Op::Lt { BPF_JGE_K } else { BPF_JGT_K };
            a.push(Ins::J(code, vl, Some(fail), None));
        }
    }
    a.mark(pass);
}

/// Binary search over `entries` (sorted by number); the accumulator holds the syscall number.
fn tree(a: &mut Asm, f: &Filter, entries: &[(u32, &Vec<Vec<Cond>>)]) {
    if entries.len() > LEAF {
        let mid = entries.len() / 2;
        let right = a.label();
        let left = a.label();
        // jge pivot -> the `ja right` trampoline (32-bit offset); else into the left half.
        a.push(Ins::J(BPF_JGE_K, entries[mid].0, None, Some(left)));
        a.push(Ins::Ja(right));
        a.mark(left);
        tree(a, f, &entries[..mid]);
        a.mark(right);
        tree(a, f, &entries[mid..]);
        return;
    }
    let allow = a.label();
    let blocks: Vec<Label> = entries.iter().map(|_| a.label()).collect();
    for ((nr, rules), b) in entries.iter().zip(&blocks) {
        let target = if rules.is_empty() { allow } else { *b };
        a.push(Ins::J(BPF_JEQ_K, *nr, Some(target), None));
    }
    a.push(Ins::Ret(f.default));
    a.mark(allow);
    a.push(Ins::Ret(RET_ALLOW));
    for ((_, rules), b) in entries.iter().zip(&blocks) {
        if rules.is_empty() {
            continue;
        }
        a.mark(*b);
        block(a, f, rules);
    }
}

/// Compile a parsed filter to a BPF program.
pub fn compile(f: &Filter) -> Result<BpfProgram> {
    let mut a = Asm::default();
    a.push(Ins::Ld(OFF_ARCH));
    let ok = a.label();
    a.push(Ins::J(BPF_JEQ_K, audit_arch(f.arch), Some(ok), None));
    a.push(Ins::Ret(RET_KILL_PROCESS));
    a.mark(ok);
    a.push(Ins::Ld(OFF_NR));
    // The kernel caches "always allowed" per syscall number, so after attach the filter only
    // runs for argument-filtered and denied syscalls. The argument-filtered ones come first,
    // most frequent first, each with its checks inline; the tree covers the rest.
    let mut conditional: Vec<(u32, &Vec<Vec<Cond>>)> =
        f.rules.iter().filter(|(_, r)| !r.is_empty()).map(|(n, r)| (*n, r)).collect();
    let hot = |n: u32| HOT.iter().position(|h| syscall_nr(f.arch, h) == Some(n)).unwrap_or(HOT.len());
    conditional.sort_by_key(|(n, _)| (hot(*n), *n));
    for (nr, rules) in &conditional {
        let next = a.label();
        a.push(Ins::J(BPF_JEQ_K, *nr, None, Some(next)));
        block(&mut a, f, rules);
        a.mark(next);
        // The argument checks clobbered the accumulator: reload the number.
        a.push(Ins::Ld(OFF_NR));
    }
    let entries: Vec<(u32, &Vec<Vec<Cond>>)> =
        f.rules.iter().filter(|(_, r)| r.is_empty()).map(|(n, r)| (*n, r)).collect();
    tree(&mut a, f, &entries);
    a.assemble()
}

/// Argument-filtered syscalls in the order they are checked: the most frequent first.
const HOT: &[&str] = &["openat", "ioctl", "open", "socket", "clone", "prctl", "fchmod", "fchmodat", "socketpair"];

/// The argument checks of one syscall: rules ORed, conditions ANDed; ends in a return.
fn block(a: &mut Asm, f: &Filter, rules: &[Vec<Cond>]) {
    for rule in rules {
        let next = a.label();
        for c in rule {
            cond(a, c, next);
        }
        a.push(Ins::Ret(RET_ALLOW));
        a.mark(next);
    }
    a.push(Ins::Ret(f.default));
}

/// Run a classic BPF seccomp program on (arch, nr, args): the decision the kernel would take.
/// Used by the tests (and fuzzing) to compare programs; supports the instructions both
/// compilers emit.
pub fn interpret(prog: &[sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
    let mut data = [0u32; 16];
    data[0] = nr;
    data[1] = arch;
    for (i, a) in args.iter().enumerate() {
        data[4 + 2 * i] = *a as u32;
        data[5 + 2 * i] = (*a >> 32) as u32;
    }
    let (mut acc, mut pc) = (0u32, 0usize);
    for _ in 0..100_000 {
        let Some(i) = prog.get(pc) else { return RET_KILL_THREAD };
        pc += 1;
        match i.code {
            BPF_LD_W_ABS => acc = data.get(i.k as usize / 4).copied().unwrap_or(0),
            BPF_AND_K => acc &= i.k,
            BPF_RET_K => return i.k,
            BPF_JA => pc += i.k as usize,
            BPF_JEQ_K | BPF_JGT_K | BPF_JGE_K | 0x45 => {
                let t = match i.code {
                    BPF_JEQ_K => acc == i.k,
                    BPF_JGT_K => acc > i.k,
                    BPF_JGE_K => acc >= i.k,
                    _ => acc & i.k != 0,
                };
                pc += usize::from(if t { i.jt } else { i.jf });
            }
            _ => return RET_KILL_THREAD,
        }
    }
    RET_KILL_THREAD
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped() -> Vec<(String, &'static str)> {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seccomp");
        [
            ("engine.json", "engine"),
            ("node.json", "node"),
            ("engine-gpu.json", "engine"),
            ("engine-rocm.json", "engine"),
            ("engine-ollama.json", "engine"),
        ]
        .iter()
        .map(|(f, r)| (std::fs::read_to_string(root.join(f)).expect("read"), *r))
        .collect()
    }

    /// Argument values around every constant a policy compares with.
    fn probes(f: &Filter) -> Vec<u64> {
        let mut v = vec![0, 1, u64::MAX, 0xffff_ffff, 0x1_0000_0000, 0xdead_0000_0000_5412];
        for rules in f.rules.values() {
            for c in rules.iter().flatten() {
                for x in [
                    c.val,
                    c.val.wrapping_add(1),
                    c.val.wrapping_sub(1),
                    c.val | 0xffff_ffff_0000_0000,
                    c.val ^ 0x8000_0000,
                ] {
                    v.push(x);
                }
                if let Op::MaskedEq(m) = c.op {
                    v.extend([m, !m, c.val | m, c.val & !m]);
                }
            }
        }
        v.sort_unstable();
        v.dedup();
        v
    }

    /// Our program and seccompiler's decide every case the same way.
    fn differential(text: &str, role: &str, arch: TargetArch) {
        let file = Path::new("policy.json");
        let theirs = super::super::seccomp::compile_with_seccompiler(text, file, role, arch).expect("seccompiler");
        let f = parse(text, file, role, arch).expect("parse");
        let ours = compile(&f).expect("compile");
        let a = audit_arch(arch);
        let vals = probes(&f);
        for nr in (0..1024u32).chain([0x4000_0000, 0x4000_0027, 0x4000_0200, u32::MAX]) {
            let zero = [0u64; 6];
            assert_eq!(interpret(&ours, a, nr, zero), interpret(&theirs, a, nr, zero), "{role} {arch:?} nr {nr}");
            if f.rules.get(&nr).is_some_and(|r| !r.is_empty()) {
                for (i, x) in vals.iter().enumerate() {
                    for idx in 0..4 {
                        let mut args = [vals[(i * 7 + idx) % vals.len()]; 6];
                        args[idx] = *x;
                        assert_eq!(
                            interpret(&ours, a, nr, args),
                            interpret(&theirs, a, nr, args),
                            "{role} {arch:?} nr {nr} args {args:x?}"
                        );
                    }
                }
            }
        }
        // Any other architecture (i386 through int 0x80) is killed by both.
        assert_eq!(interpret(&ours, 0x4000_0003, 20, [0; 6]), RET_KILL_PROCESS);
        assert_eq!(interpret(&theirs, 0x4000_0003, 20, [0; 6]), RET_KILL_PROCESS);
    }

    #[test]
    fn shipped_policies_decide_exactly_like_seccompiler() {
        for (text, role) in shipped() {
            for arch in [TargetArch::x86_64, TargetArch::aarch64] {
                differential(&text, role, arch);
            }
        }
    }

    /// The decisions the strace-fitted CPU filters promise (docs/policies.md, "Fitting"): the
    /// ioctls, prctls and socket families the traced programs never used are refused.
    #[test]
    fn fitted_filters_refuse_what_the_traced_programs_never_used() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seccomp");
        let a = audit_arch(TargetArch::x86_64);
        let enosys = RET_ERRNO | 38;
        for (file, role) in [("engine.json", "engine"), ("node.json", "node")] {
            let text = std::fs::read_to_string(root.join(file)).expect("read");
            let prog = compile(&parse(&text, Path::new(file), role, TargetArch::x86_64).expect("parse")).expect("bpf");
            let call = |nr: i64, args: [u64; 6]| interpret(&prog, a, nr as u32, args);
            // ioctl: only the traced requests (TCGETS, TIOCGWINSZ, FIONBIO, FIOCLEX/FIONCLEX,
            // SIOCGIFFLAGS), compared on the low 32 bits.
            for (req, want) in [
                (0x5401, RET_ALLOW),
                (0x5413, RET_ALLOW),
                (0x5421, RET_ALLOW),
                (0x8913, RET_ALLOW), // SIOCGIFFLAGS
                (0xdead_0000_0000_5401, RET_ALLOW),
                (0x5412, enosys), // TIOCSTI
                (0x541c, enosys), // TIOCLINUX
                (0x8914, enosys), // SIOCSIFFLAGS
                (0x541b, enosys), // FIONREAD: never traced
                (0x4020_5a01, enosys),
            ] {
                assert_eq!(call(libc::SYS_ioctl, [1, req, 0, 0, 0, 0]), want, "{file} ioctl {req:#x}");
            }
            // No prctl at all; no IPv6, UDP or raw sockets; the engine has no AF_UNIX socket().
            for option in [libc::PR_SET_NAME, libc::PR_SET_PDEATHSIG, libc::PR_GET_DUMPABLE] {
                assert_eq!(call(libc::SYS_prctl, [option as u64, 0, 0, 0, 0, 0]), enosys, "{file} prctl {option}");
            }
            let stream = libc::SOCK_STREAM as u64 | libc::SOCK_CLOEXEC as u64;
            assert_eq!(call(libc::SYS_socket, [libc::AF_INET as u64, stream, 0, 0, 0, 0]), RET_ALLOW, "{file}");
            assert_eq!(call(libc::SYS_socket, [libc::AF_INET6 as u64, stream, 0, 0, 0, 0]), enosys, "{file}");
            assert_eq!(call(libc::SYS_socket, [libc::AF_INET as u64, libc::SOCK_DGRAM as u64, 0, 0, 0, 0]), enosys);
            // TCP only: not MPTCP (IPPROTO_MPTCP = 262) nor any other protocol number.
            let tcp = libc::IPPROTO_TCP as u64;
            assert_eq!(call(libc::SYS_socket, [libc::AF_INET as u64, stream, tcp, 0, 0, 0]), RET_ALLOW, "{file}");
            assert_eq!(call(libc::SYS_socket, [libc::AF_INET as u64, stream, 262, 0, 0, 0]), enosys, "{file} MPTCP");
            assert_eq!(call(libc::SYS_socket, [libc::AF_INET as u64, stream, 132, 0, 0, 0]), enosys, "{file} SCTP");
            // sendto without MSG_FASTOPEN (TCP Fast Open connects without connect(2)).
            let fastopen = libc::MSG_FASTOPEN as u64;
            assert_eq!(call(libc::SYS_sendto, [3, 0, 1, libc::MSG_NOSIGNAL as u64, 0, 0]), RET_ALLOW, "{file}");
            assert_eq!(call(libc::SYS_sendto, [3, 0, 1, fastopen, 0, 16]), enosys, "{file} MSG_FASTOPEN");
            assert_eq!(call(libc::SYS_sendto, [3, 0, 1, fastopen | 0x4000, 0, 16]), enosys, "{file} MSG_FASTOPEN");
            // Limits of the calling process only.
            assert_eq!(call(libc::SYS_prlimit64, [0, 7, 0, 0, 0, 0]), RET_ALLOW, "{file}");
            assert_eq!(call(libc::SYS_prlimit64, [1, 7, 0, 0, 0, 0]), enosys, "{file} prlimit64 on pid 1");
            // No AF_UNIX socket at all (Landlock does not cover connecting to a pathname one);
            // only connected stream pairs, whatever the flags: a datagram pair can sendto any.
            for ty in [libc::SOCK_STREAM, libc::SOCK_DGRAM, libc::SOCK_SEQPACKET] {
                let t = ty as u64 | libc::SOCK_CLOEXEC as u64;
                assert_eq!(
                    call(libc::SYS_socket, [libc::AF_UNIX as u64, t, 0, 0, 0, 0]),
                    enosys,
                    "{file} AF_UNIX {ty}"
                );
                let pair =
                    call(libc::SYS_socketpair, [libc::AF_UNIX as u64, t | libc::SOCK_NONBLOCK as u64, 0, 0, 0, 0]);
                let want = if ty == libc::SOCK_STREAM { RET_ALLOW } else { enosys };
                assert_eq!(pair, want, "{file} socketpair AF_UNIX {ty}");
            }
            let pair = call(libc::SYS_socketpair, [libc::AF_INET as u64, stream, 0, 0, 0, 0]);
            assert_eq!(pair, enosys, "{file} socketpair AF_INET");
            // File-tree changes nobody traced made: rename, mkdir, links, mode changes.
            for nr in [libc::SYS_renameat2, libc::SYS_mkdirat, libc::SYS_linkat, libc::SYS_fchmod, libc::SYS_umask] {
                assert_eq!(call(nr, [0; 6]), enosys, "{file} nr {nr}");
            }
            // Only the node connects; only the engine binds, listens and accepts.
            let (engine, node) = (role == "engine", role == "node");
            for (nr, allowed) in [
                (libc::SYS_connect, node),
                (libc::SYS_bind, engine),
                (libc::SYS_listen, engine),
                (libc::SYS_accept4, engine),
                (libc::SYS_vfork, node),
                (libc::SYS_wait4, true),
            ] {
                assert_eq!(call(nr, [0; 6]) == RET_ALLOW, allowed, "{file} nr {nr}");
            }
        }
    }

    /// engine-gpu.json and engine-rocm.json are the CPU engine filter plus what GPU runtimes
    /// need, never less: for
    /// every syscall number, and for the argument-filtered ones every combination of the
    /// values their rules compare with (and neighbours) over the compared arguments.
    #[test]
    fn gpu_engine_filter_allows_everything_the_cpu_engine_filter_does() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("seccomp");
        for arch in [TargetArch::x86_64, TargetArch::aarch64] {
            let a = audit_arch(arch);
            let load = |f: &str| {
                let text = std::fs::read_to_string(root.join(f)).expect("read");
                parse(&text, Path::new(f), "engine", arch).expect("parse")
            };
            let cpu = load("engine.json");
            let cpu_prog = compile(&cpu).expect("bpf");
            let gpu_progs: Vec<_> =
                ["engine-gpu.json", "engine-rocm.json"].iter().map(|f| (*f, compile(&load(f)).expect("bpf"))).collect();
            for nr in 0..1024u32 {
                let conds: Vec<&Cond> = cpu.rules.get(&nr).into_iter().flatten().flatten().collect();
                let mut idx: Vec<usize> = conds.iter().map(|c| usize::from(c.index)).collect();
                idx.sort_unstable();
                idx.dedup();
                let mut vals: Vec<u64> = vec![0, u64::MAX];
                for c in &conds {
                    vals.extend([c.val, c.val.wrapping_add(1), c.val.wrapping_sub(1)]);
                    if let Op::MaskedEq(m) = c.op {
                        vals.extend([m, c.val | m]);
                    }
                }
                vals.sort_unstable();
                vals.dedup();
                // Every combination of those values over the compared arguments.
                let mut combos = vec![[0u64; 6]];
                for &i in &idx {
                    combos = combos
                        .iter()
                        .flat_map(|c| {
                            vals.iter().map(move |v| {
                                let mut n = *c;
                                n[i] = *v;
                                n
                            })
                        })
                        .collect();
                }
                for args in combos {
                    if interpret(&cpu_prog, a, nr, args) == RET_ALLOW {
                        for (f, gpu_prog) in &gpu_progs {
                            assert_eq!(
                                interpret(gpu_prog, a, nr, args),
                                RET_ALLOW,
                                "{f} {arch:?} nr {nr} args {args:x?}"
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn every_comparison_kind_matches_seccompiler() {
        let mut rules = Vec::new();
        for (i, (ty, op)) in ["dword", "qword"]
            .iter()
            .flat_map(|t| {
                ["\"eq\"", "\"ne\"", "\"lt\"", "\"le\"", "\"gt\"", "\"ge\"", "{\"masked_eq\": 4294967295}"]
                    .iter()
                    .map(move |o| (*t, *o))
            })
            .enumerate()
        {
            let name = [
                "read", "write", "close", "fstat", "lseek", "mmap", "mprotect", "munmap", "brk", "ioctl", "pread64",
                "pwrite64", "readv", "writev",
            ][i];
            let val = if ty == "qword" { "4294967298" } else { "70000" };
            rules.push(format!("{{\"syscall\": \"{name}\", \"comment\": \"c\", \"args\": [{{\"index\": {}, \"type\": \"{ty}\", \"op\": {op}, \"val\": {val}}}]}}", i % 6));
        }
        rules.push("{\"syscall\": \"getpid\", \"comment\": \"two rules, ORed\", \"args\": [{\"index\": 0, \"type\": \"dword\", \"op\": \"eq\", \"val\": 1}]}".into());
        rules.push("{\"syscall\": \"getpid\", \"comment\": \"two rules, ORed\", \"args\": [{\"index\": 0, \"type\": \"dword\", \"op\": \"eq\", \"val\": 2}, {\"index\": 1, \"type\": \"qword\", \"op\": \"gt\", \"val\": 5}]}".into());
        let text = format!(
            "{{\"t\": {{\"mismatch_action\": {{\"errno\": 38}}, \"match_action\": \"allow\", \"filter\": [{}]}}}}",
            rules.join(",")
        );
        differential(&text, "t", TargetArch::x86_64);
    }

    #[test]
    fn programs_are_short() {
        for (text, role) in shipped() {
            let f = parse(&text, Path::new("p"), role, TargetArch::x86_64).expect("parse");
            let ours = compile(&f).expect("compile");
            let theirs =
                super::super::seccomp::compile_with_seccompiler(&text, Path::new("p"), role, TargetArch::x86_64)
                    .expect("s");
            assert!(ours.len() < theirs.len(), "{role}: {} vs seccompiler {}", ours.len(), theirs.len());
            // The longest path any syscall walks: the argument-filtered syscalls (checked first,
            // 12 in the GPU and Ollama filters), the search depth and a leaf.
            let longest = (0..600u32).map(|nr| steps(&ours, nr)).max().unwrap_or(0);
            assert!(longest < 48, "{role}: {longest} instructions on the longest path");
        }
    }

    fn steps(prog: &[sock_filter], nr: u32) -> usize {
        let (mut pc, mut n, mut acc) = (0usize, 0usize, 0u32);
        while let Some(i) = prog.get(pc) {
            n += 1;
            pc += 1;
            match i.code {
                BPF_LD_W_ABS => {
                    acc = if i.k == OFF_ARCH {
                        audit_arch(TargetArch::x86_64)
                    } else if i.k == OFF_NR {
                        nr
                    } else {
                        0
                    }
                }
                BPF_RET_K => return n,
                BPF_JA => pc += i.k as usize,
                BPF_AND_K => acc &= i.k,
                _ => {
                    let t = match i.code {
                        BPF_JEQ_K => acc == i.k,
                        BPF_JGT_K => acc > i.k,
                        _ => acc >= i.k,
                    };
                    pc += usize::from(if t { i.jt } else { i.jf });
                }
            }
        }
        n
    }
}
