//! One role's sandbox: plan in the parent, clone, id maps, the child's setup, wait.

pub mod caps;
pub mod child;
pub mod idmap;
pub mod init;
pub mod mounts;
pub mod namespaces;
pub mod plan;
pub mod protocol;
pub mod spawn;
pub mod stage;
pub mod table;
pub mod view;

pub use plan::{Layers, Plan, Program};
pub use spawn::{run_to_exit, spawn, spawn_in, Sandbox};
pub use stage::Stage;
