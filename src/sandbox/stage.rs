//! Setup steps and the fixed-size failure record the child sends over the CLOEXEC pipe.

/// Every step of the child's setup, in execution order. `docs/architecture.md` lists the same
/// names in the same order (a test keeps them in sync).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u32)]
pub enum Stage {
    DieWithParent = 1,
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
    Landlock,
    Seccomp,
    Exec,
}

impl Stage {
    pub const ALL: [Stage; 22] = [
        Stage::DieWithParent,
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
        Stage::Landlock,
        Stage::Seccomp,
        Stage::Exec,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Stage::DieWithParent => "die_with_parent",
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
            Stage::Rlimits => "rlimits",
            Stage::Credentials => "credentials",
            Stage::RearmParentDeath => "rearm_parent_death",
            Stage::DropCapabilities => "drop_capabilities",
            Stage::CloseFds => "close_fds",
            Stage::Landlock => "landlock",
            Stage::Seccomp => "seccomp",
            Stage::Exec => "exec",
        }
    }

    pub fn from_u32(v: u32) -> Option<Stage> {
        Stage::ALL.into_iter().find(|s| *s as u32 == v)
    }
}

/// What the child writes on failure: 12 bytes, native endian. EOF instead means exec happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Record {
    pub stage: u32,
    /// Index of the failing item (mount step, rlimit, Landlock rule), 0 otherwise.
    pub item: u32,
    pub errno: i32,
}

impl Record {
    pub const SIZE: usize = 12;

    pub fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[0..4].copy_from_slice(&self.stage.to_ne_bytes());
        b[4..8].copy_from_slice(&self.item.to_ne_bytes());
        b[8..12].copy_from_slice(&self.errno.to_ne_bytes());
        b
    }

    pub fn decode(b: &[u8; Self::SIZE]) -> Record {
        let w = |i: usize| [b[i], b[i + 1], b[i + 2], b[i + 3]];
        Record { stage: u32::from_ne_bytes(w(0)), item: u32::from_ne_bytes(w(4)), errno: i32::from_ne_bytes(w(8)) }
    }
}

/// Exit status of a child whose setup failed (hakoniwa's convention; documented).
pub const SETUP_FAILED: i32 = 125;
