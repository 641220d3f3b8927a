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
