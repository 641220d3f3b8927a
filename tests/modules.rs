//! The module graph: which file of `src/` uses which. Two promises are kept here:
//! no import cycle between files (a cycle means neither side can be changed or tested alone),
//! and docs/architecture.md's "Module graph" section is the graph the code has.
//!
//! The graph is read from the parsed source (syn: no comment, literal or `#[cfg(test)]` item,
//! nor a module file declared `#[cfg(test)] mod x;`, counts): every `crate::…` path (in `use`
//! trees too) and every `super::…` path, resolved to the file that defines the item (through a
//! `mod.rs`'s `pub use` re-exports). `sealnode::…` paths in the binary (`src/main.rs`,
//! `src/cli/`) count the same way.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

type Graph = BTreeMap<String, BTreeSet<String>>;

/// `src/a/b.rs` -> `a::b`, `src/a/mod.rs` -> `a`, `src/main.rs` -> `main`.
fn module_of(rel: &Path) -> String {
    let mut parts: Vec<String> = rel.iter().map(|p| p.to_string_lossy().into_owned()).collect();
    let last = parts.pop().expect("file name");
    let stem = last.trim_end_matches(".rs").to_string();
    if stem != "mod" {
        parts.push(stem);
    }
    parts.join("::")
}

/// `#[cfg(test)]`, or `#[cfg(all(test, …))]`: code built only for the tests.
fn is_cfg_test(attrs: &[syn::Attribute]) -> bool {
    fn test_only(m: &syn::Meta) -> bool {
        match m {
            syn::Meta::Path(p) => p.is_ident("test"),
            syn::Meta::List(l) if l.path.is_ident("all") => l
                .parse_args_with(syn::punctuated::Punctuated::<syn::Meta, syn::Token![,]>::parse_terminated)
                .is_ok_and(|all| all.iter().any(test_only)),
            _ => false,
        }
    }
    attrs.iter().any(|a| a.path().is_ident("cfg") && a.parse_args::<syn::Meta>().is_ok_and(|m| test_only(&m)))
}

/// `items` without their `#[cfg(test)]` items, in modules and impl blocks too; the names of
/// the test-only module files (`#[cfg(test)] mod tests;`) are kept in `test_files`.
fn strip_tests(items: &mut Vec<syn::Item>, test_files: &mut Vec<String>) {
    items.retain(|item| {
        let attrs = match item {
            syn::Item::Mod(m) => {
                if is_cfg_test(&m.attrs) && m.content.is_none() {
                    test_files.push(m.ident.to_string());
                }
                &m.attrs
            }
            syn::Item::Fn(f) => &f.attrs,
            syn::Item::Use(u) => &u.attrs,
            syn::Item::Impl(i) => &i.attrs,
            syn::Item::Struct(s) => &s.attrs,
            syn::Item::Enum(e) => &e.attrs,
            syn::Item::Const(c) => &c.attrs,
            syn::Item::Static(s) => &s.attrs,
            syn::Item::Trait(t) => &t.attrs,
            syn::Item::Type(t) => &t.attrs,
            syn::Item::Macro(m) => &m.attrs,
            _ => return true,
        };
        !is_cfg_test(attrs)
    });
    for item in items.iter_mut() {
        match item {
            syn::Item::Mod(m) => {
                if let Some((_, inner)) = m.content.as_mut() {
                    strip_tests(inner, &mut Vec::new());
                }
            }
            syn::Item::Impl(i) => i.items.retain(|it| match it {
                syn::ImplItem::Fn(f) => !is_cfg_test(&f.attrs),
                syn::ImplItem::Const(c) => !is_cfg_test(&c.attrs),
                syn::ImplItem::Type(t) => !is_cfg_test(&t.attrs),
                _ => true,
            }),
            _ => {}
        }
    }
}

/// Tokens back to text: identifiers and punctuation only (no literal: a string or char that
/// spells a path is not a use of it; comments are not tokens, doc comments are literals).
/// `::` stays joined to what follows it (`crate::a`), other punctuation is followed by a space,
/// two words get a space between them, and a line ends after each `;` and `{…}` (one item or
/// statement per line, as `mod x;` is looked for).
fn write_tokens(tokens: proc_macro2::TokenStream, out: &mut String) {
    use proc_macro2::{Delimiter, Spacing, TokenTree};
    let mut path_sep = false;
    for t in tokens {
        match t {
            TokenTree::Ident(i) => {
                if out.ends_with(|c: char| c.is_alphanumeric() || c == '_') {
                    out.push(' ');
                }
                out.push_str(&i.to_string());
            }
            TokenTree::Punct(p) => {
                let c = p.as_char();
                out.push(c);
                // The second ':' of a `::` (the first is joint to it).
                let second_colon = c == ':' && path_sep;
                path_sep = c == ':' && p.spacing() == Spacing::Joint;
                if c == ';' {
                    out.push('\n');
                } else if p.spacing() == Spacing::Alone && !second_colon {
                    out.push(' ');
                }
            }
            TokenTree::Literal(_) => out.push(' '),
            TokenTree::Group(g) => {
                let (open, close) = match g.delimiter() {
                    Delimiter::Brace => ("{", "}"),
                    Delimiter::Bracket => ("[", "]"),
                    Delimiter::Parenthesis => ("(", ")"),
                    Delimiter::None => ("", ""),
                };
                out.push_str(open);
                write_tokens(g.stream(), out);
                out.push_str(close);
                out.push(if g.delimiter() == Delimiter::Brace { '\n' } else { ' ' });
            }
        }
    }
}

/// The code of a file without comments, literals and `#[cfg(test)]` items, parsed (syn), and
/// the names of the module files it declares test-only. A file that is test-only itself
/// (`#![cfg(test)]`) has no code.
fn code_and_test_files(text: &str) -> (String, Vec<String>) {
    use quote::ToTokens;
    let mut file = syn::parse_file(text).expect("a Rust file syn parses");
    if is_cfg_test(&file.attrs) {
        return (String::new(), Vec::new());
    }
    let mut test_files = Vec::new();
    strip_tests(&mut file.items, &mut test_files);
    let mut out = String::new();
    write_tokens(file.into_token_stream(), &mut out);
    (out, test_files)
}

/// Every path that follows `prefix` in `code`, with `use` trees expanded:
/// `crate::a::{b, c::{D, E}}` -> `a::b`, `a::c::D`, `a::c::E`.
fn paths_after(code: &str, prefix: &str) -> Vec<Vec<String>> {
    fn ident(s: &[char], i: &mut usize) -> Option<String> {
        let start = *i;
        while *i < s.len() && (s[*i].is_alphanumeric() || s[*i] == '_') {
            *i += 1;
        }
        (start < *i).then(|| s[start..*i].iter().collect())
    }
    fn skip_ws(s: &[char], i: &mut usize) {
        while *i < s.len() && s[*i].is_whitespace() {
            *i += 1;
        }
    }
    fn tree(s: &[char], i: &mut usize, base: Vec<String>, out: &mut Vec<Vec<String>>) {
        let mut path = base;
        loop {
            skip_ws(s, i);
            if *i < s.len() && s[*i] == '{' {
                *i += 1;
                loop {
                    skip_ws(s, i);
                    if *i >= s.len() {
                        return;
                    }
                    if s[*i] == '}' {
                        *i += 1;
                        return;
                    }
                    if s[*i] == ',' {
                        *i += 1;
                        continue;
                    }
                    let before = *i;
                    tree(s, i, path.clone(), out);
                    if *i == before {
                        *i += 1;
                    }
                }
            }
            match ident(s, i) {
                Some(id) => path.push(id),
                None => break,
            }
            if s.get(*i) == Some(&':') && s.get(*i + 1) == Some(&':') {
                *i += 2;
                continue;
            }
            break;
        }
        if !path.is_empty() {
            out.push(path);
        }
    }
    let chars: Vec<char> = code.chars().collect();
    let pat: Vec<char> = prefix.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    while i + pat.len() <= chars.len() {
        let boundary = i == 0 || !(chars[i - 1].is_alphanumeric() || chars[i - 1] == '_' || chars[i - 1] == ':');
        if boundary && chars[i..i + pat.len()] == pat[..] {
            let mut j = i + pat.len();
            tree(&chars, &mut j, Vec::new(), &mut out);
            i = j.max(i + 1);
        } else {
            i += 1;
        }
    }
    out
}

struct Crate {
    /// Module path -> its code.
    code: BTreeMap<String, String>,
    /// For a module with children: item name -> the child module it re-exports it from.
    reexports: BTreeMap<String, BTreeMap<String, String>>,
}

fn load() -> Crate {
    fn walk(dir: &Path, root: &Path, out: &mut Vec<std::path::PathBuf>) {
        for e in std::fs::read_dir(dir).expect("read src") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                walk(&p, root, out);
            } else if p.extension().is_some_and(|x| x == "rs") {
                out.push(p.strip_prefix(root).expect("rel").to_path_buf());
            }
        }
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    walk(&src, &src, &mut files);
    let mut code = BTreeMap::new();
    let mut reexports: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    // Each file's code, and the module files its parent declares `#[cfg(test)] mod x;`.
    let mut read = Vec::new();
    let mut test_only = BTreeSet::new();
    for rel in files {
        let module = module_of(&rel);
        let (text, tests) = code_and_test_files(&std::fs::read_to_string(src.join(&rel)).expect("read"));
        let base = if module == "lib" || module == "main" { String::new() } else { format!("{module}::") };
        test_only.extend(tests.into_iter().map(|t| format!("{base}{t}")));
        read.push((module, text));
    }
    for (module, text) in read {
        // lib.rs only declares the modules.
        if module == "lib" || test_only.contains(&module) {
            continue;
        }
        for p in paths_after(&text, "pub use ") {
            // `pub use child::{A, B}` in a module file.
            if p.len() >= 2 && !matches!(p[0].as_str(), "crate" | "super" | "self" | "std" | "sealnode") {
                let child = format!("{module}::{}", p[0]);
                reexports.entry(module.clone()).or_default().insert(p[p.len() - 1].clone(), child);
            }
        }
        code.insert(module, text);
    }
    Crate { code, reexports }
}

impl Crate {
    /// The file (module) that defines what `path` (from the crate root) names.
    fn resolve(&self, path: &[String]) -> Option<String> {
        let mut best = None;
        for n in (1..=path.len()).rev() {
            let m = path[..n].join("::");
            if self.code.contains_key(&m) {
                best = Some((m, n));
                break;
            }
        }
        let (m, n) = best?;
        // Through a re-export: `crate::sandbox::Plan` is defined in `sandbox::plan`.
        if let (Some(item), Some(map)) = (path.get(n), self.reexports.get(&m)) {
            if let Some(child) = map.get(item) {
                return Some(child.clone());
            }
        }
        Some(m)
    }

    fn graph(&self) -> Graph {
        let mut g = Graph::new();
        for (module, text) in &self.code {
            let deps = g.entry(module.clone()).or_default();
            let parent: Vec<String> = {
                // `super` of `a::b` is `a`, whether `a::b` is `a/b.rs` or `a/b/mod.rs`.
                let mut v: Vec<String> = module.split("::").map(String::from).collect();
                v.pop();
                v
            };
            // The binary (main.rs and cli/) reaches the library as `sealnode::`.
            let binary = module == "main" || module.starts_with("cli::") || module == "cli";
            let prefixes: &[&str] = if binary { &["sealnode::", "crate::"] } else { &["crate::"] };
            let mut paths: Vec<Vec<String>> = prefixes
                .iter()
                .flat_map(|p| paths_after(text, p))
                .map(|mut p| {
                    if p.last().is_some_and(|x| x == "self") {
                        p.pop();
                    }
                    p
                })
                .collect();
            for p in paths_after(text, "super::") {
                let mut full = parent.clone();
                full.extend(p);
                paths.push(full);
            }
            // `use crate::sandbox;` (or `use super::gate;`) then `sandbox::spawn(…)`: follow
            // the alias.
            let aliases: Vec<Vec<String>> =
                paths.iter().filter(|p| self.code.contains_key(&p.join("::"))).cloned().collect();
            for a in aliases {
                for tail in paths_after(text, &format!("{}::", a[a.len() - 1])) {
                    let mut full = a.clone();
                    full.extend(tail);
                    paths.push(full);
                }
            }
            // `mod x;` then `x::…`: a child module by its own name (main.rs's `cli`).
            for line in text.lines() {
                let Some(name) = line.trim().strip_prefix("mod ").and_then(|r| r.strip_suffix(';')) else { continue };
                let base: Vec<String> =
                    if module == "main" { Vec::new() } else { module.split("::").map(String::from).collect() };
                for tail in paths_after(text, &format!("{name}::")) {
                    let mut full = base.clone();
                    full.push(name.to_string());
                    full.extend(tail);
                    paths.push(full);
                }
            }
            let children: BTreeSet<&String> =
                self.reexports.get(module).map(|m| m.values().collect()).unwrap_or_default();
            // A module file that re-exports (`pub use child::X`) depends on that child.
            for child in &children {
                deps.insert((*child).clone());
            }
            for p in paths {
                // `use crate::sandbox::{self, …}` names a directory of modules, not one file:
                // what it is used for is followed through the alias above.
                let named = p.join("::");
                if self.code.keys().any(|k| k.starts_with(&format!("{named}::"))) {
                    continue;
                }
                if let Some(target) = self.resolve(&p) {
                    if &target != module {
                        deps.insert(target);
                    }
                }
            }
        }
        g
    }
}

/// Strongly connected components with more than one file (Tarjan).
fn cycles(g: &Graph) -> Vec<Vec<String>> {
    struct T<'a> {
        g: &'a Graph,
        index: BTreeMap<&'a str, usize>,
        low: BTreeMap<&'a str, usize>,
        stack: Vec<&'a str>,
        on: BTreeSet<&'a str>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit<'a>(t: &mut T<'a>, v: &'a str) {
        t.index.insert(v, t.next);
        t.low.insert(v, t.next);
        t.next += 1;
        t.stack.push(v);
        t.on.insert(v);
        for w in t.g.get(v).into_iter().flatten() {
            let w = w.as_str();
            if !t.index.contains_key(w) {
                visit(t, w);
                let lw = t.low[w];
                let lv = t.low.get_mut(v).expect("low");
                *lv = (*lv).min(lw);
            } else if t.on.contains(w) {
                let iw = t.index[w];
                let lv = t.low.get_mut(v).expect("low");
                *lv = (*lv).min(iw);
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = Vec::new();
            while let Some(w) = t.stack.pop() {
                t.on.remove(w);
                comp.push(w.to_string());
                if w == v {
                    break;
                }
            }
            if comp.len() > 1 {
                comp.sort();
                t.out.push(comp);
            }
        }
    }
    let mut t = T {
        g,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        stack: Vec::new(),
        on: BTreeSet::new(),
        next: 0,
        out: Vec::new(),
    };
    for v in g.keys() {
        if !t.index.contains_key(v.as_str()) {
            visit(&mut t, v);
        }
    }
    t.out
}

#[test]
fn no_import_cycle_between_files() {
    let g = load().graph();
    let c = cycles(&g);
    assert!(
        c.is_empty(),
        "import cycles between files of src/ (each line: files that reach each other):\n{}",
        c.iter().map(|x| x.join(" <-> ")).collect::<Vec<_>>().join("\n")
    );
}

/// The section lists each module with what it uses, in an order where every module comes
/// after everything it uses.
#[test]
fn architecture_doc_shows_the_module_graph() {
    let g = load().graph();
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("doc");
    let section =
        doc.split("## Module graph").nth(1).expect("a \"## Module graph\" section").split("\n## ").next().expect("end");
    let mut documented = Graph::new();
    let mut order = Vec::new();
    for line in section.lines() {
        let Some(rest) = line.strip_prefix("- `") else { continue };
        let (name, tail) = rest.split_once('`').expect("module name in backticks");
        // `- `module` → `a`, `b` — what it is for`
        let tail = tail.split(" — ").next().unwrap_or_default();
        let deps: BTreeSet<String> = tail
            .split_once('→')
            .map(|(_, d)| {
                d.split(',').map(|x| x.trim().trim_matches('`').to_string()).filter(|x| !x.is_empty()).collect()
            })
            .unwrap_or_default();
        order.push(name.to_string());
        documented.insert(name.to_string(), deps);
    }
    let expected: String = g
        .iter()
        .map(|(m, d)| {
            if d.is_empty() {
                format!("- `{m}`\n")
            } else {
                format!("- `{m}` → {}\n", d.iter().map(|x| format!("`{x}`")).collect::<Vec<_>>().join(", "))
            }
        })
        .collect();
    assert_eq!(
        documented, g,
        "docs/architecture.md's module graph differs from the code's; the code's is:\n{expected}"
    );
    for (i, m) in order.iter().enumerate() {
        for d in &g[m] {
            let j = order.iter().position(|x| x == d).expect("listed");
            assert!(j < i, "docs/architecture.md lists `{m}` before `{d}`, which it uses");
        }
    }
}

/// The reader parses the code (review of #28, F6: a line-based reader was fooled by a
/// one-line `#[cfg(test)]` item, which hid the item after it, by strings over several lines and
/// by a `'"'` char literal, and it skipped every file named tests.rs).
#[test]
fn the_reader_finds_paths_in_use_trees_and_skips_comments_and_tests() {
    let text = r##"use crate::a::{b, c::{D, E}};
// crate::x
/* crate::y */
fn f() { crate::g::h(); let s = "crate::s"; let q = '"'; let t: crate::k::T = crate::m::n(q); }
#[cfg(test)] use crate::t;
#[cfg(all(test, target_os = "linux"))] use crate::t4;
#[cfg(any(test, target_os = "linux"))] use crate::kept::Any;
use crate::after::One;
const LONG: &str = "first line
crate::in_string::Z";
const RAW: &str = r#"crate::raw::Z "quoted""#;
#[cfg(test)]
mod tests {
    use crate::t2;
}
#[cfg(test)]
mod in_file;
impl S {
    #[cfg(test)]
    fn only_in_tests() { crate::t3::x(); }
    fn f() { crate::i::j(); }
}
mod child;
use super::p::Q;
"##;
    let (code, test_files) = code_and_test_files(text);
    let got = paths_after(&code, "crate::");
    let want: Vec<Vec<String>> = [
        vec!["a", "b"],
        vec!["a", "c", "D"],
        vec!["a", "c", "E"],
        vec!["g", "h"],
        vec!["k", "T"],
        vec!["m", "n"],
        vec!["kept", "Any"],
        vec!["after", "One"],
        vec!["i", "j"],
    ]
    .iter()
    .map(|v| v.iter().map(|s| s.to_string()).collect())
    .collect();
    assert_eq!(got, want, "{code}");
    assert_eq!(paths_after(&code, "super::"), vec![vec!["p".to_string(), "Q".to_string()]]);
    assert_eq!(test_files, vec!["in_file".to_string()]);
    assert!(code.lines().any(|l| l.trim() == "mod child;"), "{code}");
    assert_eq!(code_and_test_files("#![cfg(test)]\nuse crate::a::B;\n").0, "");
    let mut g = Graph::new();
    g.entry("a".into()).or_default().insert("b".into());
    g.entry("b".into()).or_default().insert("a".into());
    g.entry("c".into()).or_default().insert("a".into());
    assert_eq!(cycles(&g), vec![vec!["a".to_string(), "b".to_string()]]);
}

/// docs/architecture.md's "Folders and their layers": each numbered item names the top-level
/// modules of one layer, bottom up.
fn documented_layers() -> Vec<Vec<String>> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let doc = std::fs::read_to_string(root.join("docs/architecture.md")).expect("doc");
    let section = doc
        .split("## Folders and their layers")
        .nth(1)
        .expect("a \"## Folders and their layers\" section")
        .split("\n## ")
        .next()
        .expect("end");
    let mut layers = Vec::new();
    for line in section.lines() {
        // `3. `config` — ...`, `4. `policy`, `logging` — ...`
        let Some((n, rest)) = line.split_once(". ") else { continue };
        if n.is_empty() || !n.chars().all(|c| c.is_ascii_digit()) {
            continue;
        }
        let names = rest.split(" — ").next().unwrap_or_default();
        layers.push(names.split(',').map(|x| x.trim().trim_matches('`').to_string()).collect());
    }
    layers
}

/// The layer of each top-level module, and the modules that break the rule: a file that uses
/// a module of its own layer (another folder) or of a higher one.
fn layer_violations(g: &Graph, layers: &[Vec<String>]) -> Vec<String> {
    let top = |m: &str| m.split("::").next().unwrap_or(m).to_string();
    let layer_of = |m: &str| layers.iter().position(|l| l.contains(&top(m)));
    let mut bad = Vec::new();
    for (m, deps) in g {
        let Some(own) = layer_of(m) else {
            bad.push(format!("`{}` (of {m}) is in no layer", top(m)));
            continue;
        };
        for d in deps {
            if top(d) == top(m) {
                continue;
            }
            match layer_of(d) {
                Some(l) if l < own => {}
                Some(l) => bad.push(format!("{m} (layer {}) uses {d} (layer {})", own + 1, l + 1)),
                None => bad.push(format!("`{}` (used by {m}) is in no layer", top(d))),
            }
        }
    }
    bad
}

/// Each folder uses only the layers below it (docs/architecture.md, "Folders and their
/// layers"): config no proof or supervisor, `check` not the supervisor, the OS layer nothing
/// of sealnode's own but the error type.
#[test]
fn each_folder_uses_only_the_layers_below_it() {
    let g = load().graph();
    let layers = documented_layers();
    assert!(layers.len() >= 10, "the layer list in docs/architecture.md: {layers:?}");
    let bad = layer_violations(&g, &layers);
    assert!(bad.is_empty(), "the module graph breaks docs/architecture.md's layers:\n{}", bad.join("\n"));
    // The rule can fail: a config that used the proof, or check that used the supervisor.
    let mut broken = g.clone();
    broken.entry("config".into()).or_default().insert("proof::tpm".into());
    broken.entry("check".into()).or_default().insert("supervisor".into());
    let found = layer_violations(&broken, &layers);
    assert!(found.iter().any(|v| v.starts_with("config (layer 3) uses proof::tpm")), "{found:?}");
    assert!(found.iter().any(|v| v.starts_with("check (layer 10) uses supervisor")), "{found:?}");
}
