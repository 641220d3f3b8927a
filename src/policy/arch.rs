//! Architecture tables the seccomp compiler and linter share: audit arch values, syscall
//! numbers by name, the x86_64-only legacy syscalls, and the architecture sealnode runs on.
//! Data only; it uses nothing else of the crate.

use std::str::FromStr;

use seccompiler::TargetArch;

/// The `AUDIT_ARCH_*` value the kernel puts in `seccomp_data.arch` for `arch`.
pub fn audit_arch(arch: TargetArch) -> u32 {
    match arch {
        TargetArch::x86_64 => 0xC000_003E,
        TargetArch::aarch64 => 0xC000_00B7,
        TargetArch::riscv64 => 0xC000_00F3,
    }
}

/// Names the kernel's (and seccompiler's) tables use where the `syscalls` crate's differ.
const ALIASES: &[(TargetArch, &str, &str)] = &[(TargetArch::aarch64, "newfstatat", "fstatat")];

pub fn syscall_nr(arch: TargetArch, name: &str) -> Option<u32> {
    let name = ALIASES.iter().find(|(a, from, _)| *a == arch && *from == name).map(|(_, _, to)| *to).unwrap_or(name);
    match arch {
        TargetArch::x86_64 => syscalls::x86_64::Sysno::from_str(name).ok().map(|s| s.id() as u32),
        TargetArch::aarch64 => syscalls::aarch64::Sysno::from_str(name).ok().map(|s| s.id() as u32),
        TargetArch::riscv64 => None,
    }
}

/// Legacy syscalls that exist on x86_64 only (aarch64 and riscv64 have just the *at/modern
/// forms). Rules naming them are dropped when compiling for those architectures; any other
/// unknown name is still an error, so typos are caught.
pub const X86_64_ONLY: &[&str] = &[
    "open",
    "stat",
    "lstat",
    "access",
    "readlink",
    "dup2",
    "unlink",
    "rename",
    "mkdir",
    "rmdir",
    "pipe",
    "getpgrp",
    "alarm",
    "time",
    "poll",
    "select",
    "epoll_create",
    "epoll_wait",
    "eventfd",
    "arch_prctl",
    "vfork",
    "fork",
    "creat",
    "link",
    "symlink",
    "chmod",
    "chown",
    "lchown",
    "utime",
    "utimes",
    "getdents",
    "inotify_init",
    "signalfd",
    "pause",
    "futimesat",
    "mknod",
];

/// The architecture sealnode runs on.
pub fn native_arch() -> TargetArch {
    #[cfg(target_arch = "x86_64")]
    return TargetArch::x86_64;
    #[cfg(target_arch = "aarch64")]
    return TargetArch::aarch64;
    #[cfg(target_arch = "riscv64")]
    return TargetArch::riscv64;
}
