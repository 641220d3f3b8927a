//! One role's sandbox: plan in the parent, clone, id maps, the child's setup, wait; the cell
//! the roles share ([`cell`]: the user namespace and network namespaces made once), their
//! cgroup leaves ([`cgroup`]), the locks a cell holds on its dirs ([`locks`]), what a role
//! opens as itself ([`access`]) and the sealed memfd copies of what it runs ([`sealed`]).

pub mod access;
pub mod caps;
pub mod cell;
pub mod cgroup;
pub mod child;
pub mod idmap;
pub mod init;
pub mod limit_write;
pub mod locks;
pub mod mounts;
pub mod namespaces;
pub mod plan;
pub mod protocol;
pub mod sealed;
pub mod shown;
pub mod spawn;
pub mod stage;
pub mod table;
pub mod view;

pub use plan::{Layers, Plan, Program};
pub use spawn::{run_to_exit, spawn, spawn_in, Sandbox};
pub use stage::Stage;
