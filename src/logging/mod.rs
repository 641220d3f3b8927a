//! What sealnode and its roles say: sealnode's own log ([`log`]: text or JSON lines, or the
//! journal's native protocol through [`journal`] and [`logsink`]), the roles' output, tagged
//! and rate-limited ([`output`], [`ratelimit`]), and the denial log of refused system calls
//! ([`denylog`]).

pub mod denylog;
pub mod journal;
pub mod log;
pub mod logsink;
pub mod output;
pub mod ratelimit;
