//! The role child's setup steps, and the fds it keeps from the parent. A failed step travels
//! to the parent as a [`Frame`](super::protocol::Frame) naming one of these.

use std::os::fd::RawFd;

use super::protocol::Step;

/// The fds the role child keeps from the parent.
#[derive(Debug, Clone, Copy)]
pub struct ChildFds {
    /// Write end of the CLOEXEC error pipe: a failure frame, or EOF at exec.
    pub err: RawFd,
    /// Read end of the sync pipe: one byte when the id maps are written; the parent holds the
    /// write end for as long as it lives, so EOF/POLLHUP here means the launcher is gone.
    pub sync: RawFd,
}

/// Every step of the child's setup, in execution order. `docs/architecture.md` lists the same
/// names in the same order (a test keeps them in sync).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Stage {
    DieWithParent = 1,
    Stdio,
    CloseInheritedFds,
    NewSession,
    WaitForIdMaps,
    RootfulFsIds,
    PrivatePropagation,
    OpenSources,
    BuildRoot,
    PivotRoot,
    LoopbackUp,
    Hostname,
    ForkWorkload,
    ConfineInit,
    ResetSignals,
    Rlimits,
    Credentials,
    RearmParentDeath,
    DropCapabilities,
    CloseFds,
    AuditLoginuid,
    Landlock,
    Seccomp,
    HandOverListener,
    Exec,
}

impl Stage {
    pub const ALL: [Stage; 25] = [
        Stage::DieWithParent,
        Stage::Stdio,
        Stage::CloseInheritedFds,
        Stage::NewSession,
        Stage::WaitForIdMaps,
        Stage::RootfulFsIds,
        Stage::PrivatePropagation,
        Stage::OpenSources,
        Stage::BuildRoot,
        Stage::PivotRoot,
        Stage::LoopbackUp,
        Stage::Hostname,
        Stage::ForkWorkload,
        Stage::ConfineInit,
        Stage::ResetSignals,
        Stage::Rlimits,
        Stage::Credentials,
        Stage::RearmParentDeath,
        Stage::DropCapabilities,
        Stage::CloseFds,
        Stage::AuditLoginuid,
        Stage::Landlock,
        Stage::Seccomp,
        Stage::HandOverListener,
        Stage::Exec,
    ];

    pub fn name(self) -> &'static str {
        <Self as Step>::name(self)
    }
}

impl Step for Stage {
    const ALL: &'static [Stage] = &Stage::ALL;

    fn name(self) -> &'static str {
        match self {
            Stage::DieWithParent => "die_with_parent",
            Stage::Stdio => "stdio",
            Stage::CloseInheritedFds => "close_inherited_fds",
            Stage::NewSession => "new_session",
            Stage::WaitForIdMaps => "wait_for_id_maps",
            Stage::RootfulFsIds => "rootful_fs_ids",
            Stage::PrivatePropagation => "private_propagation",
            Stage::OpenSources => "open_sources",
            Stage::BuildRoot => "build_root",
            Stage::PivotRoot => "pivot_root",
            Stage::LoopbackUp => "loopback_up",
            Stage::Hostname => "hostname",
            Stage::ForkWorkload => "fork_workload",
            Stage::ConfineInit => "confine_init",
            Stage::ResetSignals => "reset_signals",
            Stage::AuditLoginuid => "audit_loginuid",
            Stage::Rlimits => "rlimits",
            Stage::Credentials => "credentials",
            Stage::RearmParentDeath => "rearm_parent_death",
            Stage::DropCapabilities => "drop_capabilities",
            Stage::CloseFds => "close_fds",
            Stage::Landlock => "landlock",
            Stage::Seccomp => "seccomp",
            Stage::HandOverListener => "hand_over_listener",
            Stage::Exec => "exec",
        }
    }
}
