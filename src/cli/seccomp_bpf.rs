//! `sealnode seccomp-bpf`: a role's compiled filter as raw BPF on stdout.

use std::io::Write;
use std::path::Path;

use sealnode::config::Role;
use sealnode::policy::{arch, seccomp};

use super::{Failure, Outcome};

pub fn seccomp_bpf(policy: &Path, role: Role, seccompiler: bool) -> Outcome {
    let arch = arch::native_arch();
    let text = std::fs::read_to_string(policy)
        .map_err(|e| Failure::general(sealnode::Error::policy(policy, format!("cannot read: {e}"))))?;
    let prog = if seccompiler {
        seccomp::compile_with_seccompiler(&text, policy, role.name(), arch)
    } else {
        seccomp::compile_text(&text, policy, role.name(), arch)
    }
    .map_err(Failure::general)?;
    let mut out = Vec::with_capacity(prog.len() * 8);
    for i in &prog {
        out.extend_from_slice(&i.code.to_ne_bytes());
        out.extend_from_slice(&[i.jt, i.jf]);
        out.extend_from_slice(&i.k.to_ne_bytes());
    }
    std::io::stdout().write_all(&out).map_err(|e| Failure::general(format!("seccomp-bpf: stdout: {e}")))?;
    Ok(0)
}
