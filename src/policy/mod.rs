//! Policy is data: seccompiler JSON and Landlock rules files. These modules load, check and
//! compile them; they never apply anything except through the functions the child calls.

pub mod arch;
pub mod bpf;
pub mod landlock;
pub mod seccomp;
