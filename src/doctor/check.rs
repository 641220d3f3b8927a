//! A check's result: its level, what was found and what it means.

use serde::Serialize;

/// How a check came out: `Fail` is something a start needs and lacks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Level {
    Ok,
    Warn,
    Fail,
}

/// One check: its name, level, what was found, and what that means (with the fix, for a
/// `Fail`, after "; fix: ").
#[derive(Debug, Clone, Serialize)]
pub struct Check {
    pub name: &'static str,
    pub level: Level,
    pub value: String,
    pub meaning: String,
}

/// A kernel setting (a file under /proc/sys), trimmed; none where it cannot be read.
pub(super) fn sysctl(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok().map(|s| s.trim().to_string())
}
