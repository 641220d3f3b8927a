//! The kernel and the files sealnode trusts: the system calls the std library does not wrap
//! ([`sys`]), files opened and checked on their descriptor ([`trusted`]), atomic replacement
//! ([`atomic`]), emptying a role's scratch without following its links ([`wipe`]), and text
//! made safe to print ([`escape`]), whether this is a container and whose ([`container`]), and
//! the overflow ids a user namespace shows for every id it does not map ([`overflow`]).
//! Nothing here knows a config, a role or a sandbox.

pub mod atomic;
pub mod container;
pub mod escape;
pub mod overflow;
pub mod sys;
pub mod trusted;
pub mod wipe;
