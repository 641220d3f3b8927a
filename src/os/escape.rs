//! Text from outside (a role's output, a config's keys, a peer's answer) made unambiguous for
//! a reader: no terminal escapes, no forged line breaks, no reordering. A leaf: every module
//! that shows such text may use it.

/// Characters that reorder or break what a reader sees without being control characters:
/// the line and paragraph separators and the bidirectional overrides, embeddings, isolates and
/// marks (a right-to-left override can make a line read as something else).
pub fn invisible_or_reordering(c: char) -> bool {
    matches!(c, '\u{00ad}' | '\u{061c}' | '\u{180e}' | '\u{feff}')
        // zero-width spaces and joiners, direction marks, line and paragraph separators,
        // embeddings and overrides, word joiner and invisible operators, isolates, deprecated
        // format controls
        || ('\u{200b}'..='\u{200f}').contains(&c)
        || ('\u{2028}'..='\u{202e}').contains(&c)
        || ('\u{2060}'..='\u{206f}').contains(&c)
        // interlinear annotation marks, and the tag characters (text a reader does not see)
        || ('\u{fff9}'..='\u{fffb}').contains(&c)
        || ('\u{e0000}'..='\u{e007f}').contains(&c)
}

/// A line a role wrote, made unambiguous: control characters (but tab), separators and
/// bidirectional controls escaped as `\u{…}`, and the backslash itself doubled, so an escape
/// sealnode wrote and the same text written by the role differ (no terminal escapes, no
/// forged line breaks; valid UTF-8 passes, other bytes are replaced).
pub fn clean(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        if c == '\\' {
            s.push_str("\\\\");
        } else if (c.is_control() && c != '\t') || invisible_or_reordering(c) {
            s.extend(c.escape_unicode());
        } else {
            s.push(c);
        }
    }
    s
}

/// A value in a table cell: [`clean`], and a tab too (a log line may keep one; a cell may not:
/// it would shift the columns). `ctl status`'s table and its "what is sealed" summary.
pub fn cell(s: &str) -> String {
    clean(s.as_bytes()).replace('\t', "\\u{9}")
}

/// JSON text (as serde_json writes it) made as unambiguous as [`clean`] makes a line: the
/// characters serde_json leaves raw in strings (DEL, the C1 controls, separators and
/// bidirectional controls) written as `\uXXXX` escapes, so the JSON still reads the same.
/// `ctl --json` prints a peer's answer through it.
pub fn json(text: &str) -> String {
    let mut s = String::with_capacity(text.len());
    for c in text.chars() {
        if (c.is_control() && !matches!(c, '\n' | '\t' | '\r')) || invisible_or_reordering(c) {
            let mut units = [0u16; 2];
            for u in c.encode_utf16(&mut units) {
                s.push_str(&format!("\\u{u:04x}"));
            }
        } else {
            s.push(c);
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What serde_json leaves raw comes out escaped, and the JSON still reads the same.
    #[test]
    fn json_text_escapes_what_serde_leaves_raw() {
        let v = serde_json::json!({ "e": "a\u{9b}2J\u{202e}evil\u{7f}\u{e0041}b" });
        let raw = serde_json::to_string_pretty(&v).expect("json");
        assert!(raw.contains('\u{9b}'), "serde_json escapes C1 itself now: {raw}");
        let safe = json(&raw);
        assert!(
            safe.chars().all(|c| !c.is_control() || c == '\n') && !safe.chars().any(invisible_or_reordering),
            "{safe}"
        );
        assert!(safe.contains("\\u009b") && safe.contains("\\u202e") && safe.contains("\\udb40\\udc41"), "{safe}");
        assert_eq!(serde_json::from_str::<serde_json::Value>(&safe).expect("still JSON"), v);
    }
}
