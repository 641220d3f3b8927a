//! One role's sandbox: plan in the parent, clone, id maps, the child's setup, wait.

pub mod caps;
pub mod child;
pub mod init;
pub mod mounts;
pub mod plan;
pub mod spawn;
pub mod stage;

pub use plan::{Layers, Plan, Program};
pub use spawn::{run_to_exit, spawn, spawn_in, Sandbox};
pub use stage::{Stage, SETUP_FAILED};
