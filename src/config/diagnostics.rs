//! How config problems are reported: each with its field and line, every problem at once, a
//! TOML error in words.

use std::path::Path;

use super::types::{Config, Invoker};
use crate::error::{Error, Result};

impl Config {
    pub(super) fn err(&self, field: impl Into<String>, reason: impl Into<String>) -> Error {
        Error::config(&self.file, field, reason)
    }
}

/// A TOML error as a config error: the field's path from the deserializer (`engine.port`,
/// `engine.rlimits.nofile`, `node.egress[0].port`), the line the error points at, and the
/// reason. Unknown and missing fields are named with their own path ("`.` is the top level").
pub(super) fn toml_error(file: &Path, text: &str, e: toml::de::Error, path: Option<String>) -> Error {
    let msg = e.message().trim().to_string();
    let line = e.span().map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
    // serde_path_to_error names the table an unknown or missing field is in; the field itself
    // is in the message ("unknown field `engnie`, expected one of ...").
    let named = |prefix: &str| msg.strip_prefix(prefix).and_then(|rest| rest.split('`').next()).map(str::to_string);
    let table = path.filter(|p| p != ".");
    // The path of an unknown field already ends in it; a missing field's ends at its table.
    let join = |k: &str| match &table {
        Some(t) if t == k || t.ends_with(&format!(".{k}")) => t.clone(),
        Some(t) => format!("{t}.{k}"),
        None => k.to_string(),
    };
    let (mut field, reason) = if let Some(k) = named("unknown field `") {
        let expected = msg
            .split_once(", expected ")
            .map(|(_, x)| x.trim_start_matches("one of ").replace('`', ""))
            .unwrap_or_default();
        // The closest known name, when one is close: "did you mean", not the whole list.
        let closest = expected
            .split(", ")
            .map(|c| (strsim::jaro_winkler(&k, c), c))
            .filter(|(score, _)| *score >= 0.8)
            .max_by(|a, b| a.0.total_cmp(&b.0))
            .map(|(_, c)| c.to_string());
        let reason = match closest {
            Some(c) => format!("unknown field; did you mean `{c}`? (docs/config.md)"),
            None if expected.is_empty() => {
                "unknown field; check the spelling and the table it is in (docs/config.md)".into()
            }
            None => format!(
                "unknown field (expected {expected}); check the spelling and the table it is in (docs/config.md)"
            ),
        };
        (join(&k), reason)
    } else if let Some(k) = named("missing field `") {
        (join(&k), "missing; this field is required (docs/config.md)".to_string())
    } else {
        match &table {
            Some(t) => (t.clone(), msg),
            None if e.span().is_some() => ("(syntax)".to_string(), msg),
            None => ("(file)".to_string(), msg),
        }
    };
    if let Some(l) = line {
        let at = if reason.starts_with("missing") { "in the table at line" } else { "line" };
        field.push_str(&format!(" ({at} {l})"));
    }
    // A key is the file's text: shown escaped, as every value is, so a key holding an escape
    // sequence cannot drive the operator's terminal (unit test:
    // config::tests::keys_are_shown_escaped).
    Error::config(file, crate::os::escape::clean(field.as_bytes()), crate::os::escape::clean(reason.as_bytes()))
}

/// Problems reported at once, at most.
const MAX_REPORTED: usize = 20;

/// Every problem `attempt` finds in `text`, not only the first: after a problem, the field it
/// names is taken out of the document (the whole list, for a list's element) and the rest is
/// checked again, until it passes or a problem repeats or follows from what was taken out (a
/// required field now missing). Each problem gets the line of its field in `text` (the
/// re-checked documents are rewritten, their lines are not the file's). A syntax error or a
/// wrong schema is reported alone: nothing else can be read.
pub(super) fn every_problem(text: &str, file: &Path, attempt: &dyn Fn(&str) -> Result<Config>) -> Result<Config> {
    let first = match attempt(text) {
        Ok(cfg) => return Ok(cfg),
        Err(e) => e,
    };
    let Error::Config { field, .. } = &first else { return Err(first) };
    let base = base_field(field).to_string();
    if base.starts_with('(') || base == "schema" {
        return Err(first);
    }
    let Ok(mut doc) = text.parse::<toml::Table>() else { return Err(first) };
    let mut errors = vec![with_line(first, text)];
    let mut removed: Vec<Vec<String>> = Vec::new();
    let mut next = base;
    while errors.len() < MAX_REPORTED {
        let key = removable_key(&next);
        if key.is_empty() || removed.contains(&key) || !remove_key(&mut doc, &key) {
            break;
        }
        removed.push(key);
        let Ok(rewritten) = toml::to_string(&doc) else { break };
        let e = match attempt(&rewritten) {
            Ok(_) => break,
            Err(e) => e,
        };
        let Error::Config { field, .. } = &e else { break };
        next = base_field(field).to_string();
        // A consequence of what was taken out, not a problem of the file.
        let follows = removed.iter().any(|k| {
            let k = k.join(".");
            next == k || next.starts_with(&format!("{k}.")) || next.starts_with(&format!("{k}["))
        });
        if follows || errors.iter().any(|x| matches!(x, Error::Config { field, .. } if base_field(field) == next)) {
            break;
        }
        errors.push(with_line(e, text));
    }
    if errors.len() == 1 {
        return Err(errors.remove(0));
    }
    let _ = file;
    Err(Error::Problems(errors))
}

/// A field without its " (line N)" note.
fn base_field(field: &str) -> &str {
    field.split(" (").next().unwrap_or(field)
}

/// `e` with the line of its field in `text` (replacing a line the deserializer gave for a
/// rewritten document).
fn with_line(e: Error, text: &str) -> Error {
    let Error::Config { file, field, reason } = e else { return e };
    let base = base_field(&field).to_string();
    match line_of(text, &base) {
        Some(l) if field.contains("(in the table at line") => {
            Error::Config { file, field: format!("{base} (in the table at line {l})"), reason }
        }
        Some(l) => Error::Config { file, field: format!("{base} (line {l})"), reason },
        None => Error::Config { file, field: base, reason },
    }
}

/// The dotted path of a field (`node.ro_binds[0].src` -> ["node", "ro_binds", "0", "src"]).
fn field_path(field: &str) -> Vec<String> {
    let mut v = Vec::new();
    for part in field.split('.') {
        let mut rest = part;
        if let Some(i) = rest.find('[') {
            v.push(rest[..i].to_string());
            rest = &rest[i..];
            // `[N]` after `[N]`; anything else (a quoted key may hold brackets) ends the part.
            while let (Some(inner), Some(end)) = (rest.strip_prefix('['), rest.find(']')) {
                v.push(inner[..end - 1].to_string());
                rest = &rest[end + 1..];
            }
        } else {
            v.push(rest.to_string());
        }
    }
    v.retain(|s| !s.is_empty());
    v
}

/// What to take out of the document for a problem at `field`: the field, or the whole list
/// one of whose elements it names (taking an element out would renumber the rest).
fn removable_key(field: &str) -> Vec<String> {
    let mut key = Vec::new();
    for p in field_path(field) {
        if p.parse::<usize>().is_ok() {
            break;
        }
        key.push(p);
    }
    key
}

fn remove_key(doc: &mut toml::Table, key: &[String]) -> bool {
    let Some((last, parents)) = key.split_last() else { return false };
    let mut t = doc;
    for p in parents {
        match t.get_mut(p) {
            Some(toml::Value::Table(x)) => t = x,
            _ => return false,
        }
    }
    t.remove(last).is_some()
}

/// The line (1-based) where `field` is written in `text`: its key, or a list's element; the
/// deepest part of the path found.
pub fn line_of(text: &str, field: &str) -> Option<usize> {
    let doc = toml::de::DeTable::parse(text).ok()?;
    let path = field_path(field);
    let line = |at: usize| text[..at.min(text.len())].matches('\n').count() + 1;
    let mut found = None;
    let mut table = Some(doc.get_ref());
    let mut value: Option<&toml::Spanned<toml::de::DeValue>> = None;
    for p in &path {
        if let Some(t) = table.take() {
            let Some((k, v)) = t.iter().find(|(k, _)| k.get_ref().as_ref() == p.as_str()) else { break };
            found = Some(line(k.span().start));
            value = Some(v);
        } else if let (Some(v), Ok(i)) = (value, p.parse::<usize>()) {
            let toml::de::DeValue::Array(a) = v.get_ref() else { break };
            let Some(el) = a.get(i) else { break };
            found = Some(line(el.span().start));
            value = Some(el);
        } else {
            break;
        }
        table = match value.map(|v| v.get_ref()) {
            Some(toml::de::DeValue::Table(t)) => Some(t),
            _ => None,
        };
    }
    found
}

/// Rootless (the launcher is not root) with a `cell.rootful` in the file: say so next to a
/// host check's problem, which would otherwise read as advice for the rootful users.
pub(super) fn rootless_hint(e: Error, cfg: &Config, inv: &Invoker) -> Error {
    match e {
        Error::Config { file, field, reason } if !inv.rootful() && cfg.cell.rootful.is_some() => Error::Config {
            file,
            field,
            reason: format!(
                "{reason} (note: you are uid {}, not root, so this is rootless mode: cell.rootful is ignored and \
                 both roles run as uid {}; run as root for the rootful users)",
                inv.uid, inv.uid
            ),
        },
        e => e,
    }
}

/// Why a config file could not be read, with where else sealnode looks when it is missing.
pub fn cannot_read(e: std::io::Error) -> String {
    if e.kind() == std::io::ErrorKind::NotFound {
        format!("cannot read: {e} (give the config with --config FILE, or set SEALNODE_CONFIG)")
    } else {
        format!("cannot read: {e}")
    }
}
