//! `sealnode man` and `sealnode completions`: documentation generated from the command line's
//! own definition, the exit-status table (`sealnode::exit`) and the config reference.

use std::path::Path;

use clap_mangen::roff::{bold, italic, roman, Roff};

use super::{Failure, Outcome};

/// The config reference, rendered as sealnode.toml(5): the same text as docs/config.md.
const CONFIG_REFERENCE: &str = include_str!("../../docs/config.md");

/// The commands each page's SEE ALSO names (the top page names every subcommand's).
const SEE_ALSO: &[(&str, &str)] =
    &[("sealnode.toml", "5"), ("systemd.exec", "5"), ("landlock", "7"), ("seccomp", "2"), ("namespaces", "7")];

/// One roff page for the top-level command and one per visible subcommand (`sealnode-run.1`,
/// ...), each with EXIT STATUS, ENVIRONMENT, FILES and SEE ALSO (and SUBCOMMANDS where it has
/// some); and sealnode.toml(5).
pub fn man(top: clap::Command, dir: &Path) -> Outcome {
    let fail = |e: String| Failure::general(format!("man: {e}"));
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
    let subs: Vec<String> =
        top.get_subcommands().filter(|c| !c.is_hide_set()).map(|c| c.get_name().to_string()).collect();
    let mut pages = vec![("sealnode".to_string(), top.clone())];
    for sub in top.get_subcommands().filter(|c| !c.is_hide_set()) {
        // Page `sealnode-canary(1)`, synopsis `sealnode canary ...`, as git names its pages.
        let bin = format!("sealnode {}", sub.get_name());
        pages
            .push((sub.get_name().to_string(), sub.clone().name(format!("sealnode-{}", sub.get_name())).bin_name(bin)));
    }
    let write =
        |path: &Path, out: &[u8]| sealnode::os::atomic::write_atomic(path, out, 0o644).map_err(|e| fail(e.to_string()));
    for (command, page) in pages {
        let path = dir.join(format!("{}.1", page.get_name()));
        let mut out = Vec::new();
        let versioned = page.get_version().is_some();
        let subcommands = subcommands_section(&command, &page);
        let man = clap_mangen::Man::new(page).source(concat!("sealnode ", env!("CARGO_PKG_VERSION")));
        let render = |out: &mut Vec<u8>| -> std::io::Result<()> {
            man.render_title(out)?;
            man.render_name_section(out)?;
            man.render_synopsis_section(out)?;
            man.render_description_section(out)?;
            man.render_options_section(out)?;
            if let Some(r) = &subcommands {
                out.extend_from_slice(r.render().as_bytes());
            }
            out.extend_from_slice(extra_sections(&command, &subs).render().as_bytes());
            if versioned {
                man.render_version_section(out)?;
            }
            Ok(())
        };
        render(&mut out).map_err(|e| fail(format!("cannot render {}: {e}", path.display())))?;
        write(&path, &out)?;
    }
    write(&dir.join("sealnode.toml.5"), config_page().render().as_bytes())?;
    Ok(0)
}

/// SUBCOMMANDS, only on a page whose command has visible subcommands (clap_mangen writes the
/// heading on every page, empty on most). The top page names each subcommand's own page; a
/// subcommand's subcommands (`sealnode attest init`) have no page of their own, so they are
/// named as typed, not as a page reference that `man` could not find.
fn subcommands_section(command: &str, page: &clap::Command) -> Option<Roff> {
    let subs: Vec<&clap::Command> = page.get_subcommands().filter(|c| !c.is_hide_set()).collect();
    if subs.is_empty() {
        return None;
    }
    let mut r = Roff::new();
    r.control("SH", ["SUBCOMMANDS"]);
    for sub in subs {
        r.control("TP", []);
        if command == "sealnode" {
            r.text([bold(format!("sealnode-{}", sub.get_name())), roman("(1)")]);
        } else {
            r.text([bold(format!("sealnode {command} {}", sub.get_name()))]);
        }
        if let Some(about) = sub.get_about().or_else(|| sub.get_long_about()) {
            r.text([roman(about.to_string())]);
        }
    }
    Some(r)
}

/// EXIT STATUS (the rows of `sealnode::exit::TABLE` for this command), ENVIRONMENT, FILES and
/// SEE ALSO.
fn extra_sections(command: &str, subs: &[String]) -> Roff {
    let mut r = Roff::new();
    r.control("SH", ["EXIT STATUS"]);
    for row in sealnode::exit::rows_for(command) {
        r.control("TP", []).text([bold(row.code)]);
        let who = if row.commands == sealnode::exit::ALL || command != "sealnode" {
            String::new()
        } else {
            format!("({}) ", row.commands.join(", "))
        };
        r.text([roman(format!("{who}{}", row.meaning.replace('`', "")))]);
    }
    r.control("SH", ["ENVIRONMENT"]);
    r.control("TP", []).text([bold("SEALNODE_LOG")]);
    r.text([roman(
        "What sealnode logs, as a tracing filter (error, warn, info, debug, trace; default info for run, \
         warn otherwise). The roles never see it: each role's environment is only what its config sets and passes.",
    )]);
    r.control("TP", []).text([bold("SEALNODE_LOG_FORMAT")]);
    r.text([roman(
        "json: every line sealnode writes is one JSON object (its own events on stderr; each role's lines on \
         the stream the role wrote them to, with role, pid, generation and stream), for a container's log \
         driver. text (the default): the journal when stderr is the journal, else plain lines. Anything else \
         refuses the command (125).",
    )]);
    r.control("TP", []).text([bold("JOURNAL_STREAM")]);
    r.text([roman(
        "Set by systemd when stderr is the journal: sealnode then logs to the journal natively, with \
         priorities and fields (ROLE, PID, GENERATION, ...), and each role's output under its own \
         SYSLOG_IDENTIFIER (sealnode-engine, sealnode-node).",
    )]);
    r.control("TP", []).text([
        bold("NOTIFY_SOCKET"),
        roman(", "),
        bold("WATCHDOG_USEC"),
        roman(", "),
        bold("WATCHDOG_PID"),
    ]);
    r.text([roman(
        "Set by systemd for Type=notify units: run reports READY, RELOADING, STOPPING, STATUS and watchdog pings.",
    )]);
    r.control("SH", ["FILES"]);
    for (path, what) in [
        (sealnode::config::DEFAULT_CONFIG, "the default config (--config), described in sealnode.toml(5)"),
        ("/usr/share/sealnode/seccomp/", "the shipped seccomp policies, one JSON file per role profile"),
        ("/usr/share/sealnode/landlock-rules/", "the shipped Landlock rules, one TOML file per role profile"),
        ("cell.state_dir/receipt.json", "the receipt of the last start (see verify-receipt)"),
        (
            "cell.state_dir/lock, cell.runtime_dir/lock",
            "held by a running sealnode run: one cell per state and runtime dir",
        ),
        ("cell.runtime_dir/control.sock", "the control socket of a running sealnode run (see ctl)"),
        ("/usr/lib/systemd/system/sealnode.service, sealnode@.service, sealnode-rootless.service", "the units"),
    ] {
        r.control("TP", []).text([italic(path)]);
        r.text([roman(what)]);
    }
    r.control("SH", ["SEE ALSO"]);
    let mut refs: Vec<(String, String)> = Vec::new();
    if command == "sealnode" {
        refs.extend(subs.iter().map(|s| (format!("sealnode-{s}"), "1".to_string())));
    } else {
        refs.push(("sealnode".into(), "1".into()));
    }
    refs.extend(SEE_ALSO.iter().map(|(n, s)| (n.to_string(), s.to_string())));
    let mut parts = Vec::new();
    for (i, (n, s)) in refs.iter().enumerate() {
        parts.push(bold(n.clone()));
        parts.push(roman(format!("({s}){}", if i + 1 < refs.len() { ", " } else { "" })));
    }
    r.text(parts);
    r
}

/// docs/config.md as sealnode.toml(5): NAME, the reference's own sections (its tables as one
/// tagged paragraph per key), SEE ALSO. Links become their text.
fn config_page() -> Roff {
    use pulldown_cmark::{Event, HeadingLevel, Options, Parser, Tag, TagEnd};
    let mut r = Roff::new();
    r.control("TH", ["SEALNODE.TOML", "5", "", concat!("sealnode ", env!("CARGO_PKG_VERSION")), "File Formats"]);
    r.control("SH", ["NAME"]).text([roman("sealnode.toml - the configuration file of sealnode(1)")]);
    r.control("SH", ["DESCRIPTION"]);
    let mut inl: Vec<clap_mangen::roff::Inline> = Vec::new();
    let (mut bold_on, mut italic_on) = (false, false);
    // A table: its header cells, the current row's cells (each a list of inlines).
    let (mut header, mut row, mut in_head) =
        (Vec::<String>::new(), Vec::<Vec<clap_mangen::roff::Inline>>::new(), false);
    let mut heading: Option<HeadingLevel> = None;
    let mut in_code_block = false;
    let plain = |v: &[clap_mangen::roff::Inline]| -> String {
        v.iter()
            .map(|i| match i {
                clap_mangen::roff::Inline::Roman(t)
                | clap_mangen::roff::Inline::Bold(t)
                | clap_mangen::roff::Inline::Italic(t) => t.as_str(),
                _ => "",
            })
            .collect()
    };
    for ev in Parser::new_ext(CONFIG_REFERENCE, Options::ENABLE_TABLES) {
        match ev {
            Event::Start(Tag::Heading { level, .. }) => heading = Some(level),
            Event::End(TagEnd::Heading(_)) => {
                let title = plain(&inl);
                inl.clear();
                match heading.take() {
                    Some(HeadingLevel::H1) => {}
                    Some(HeadingLevel::H2) => {
                        r.control("SH", [title.to_uppercase().as_str()]);
                    }
                    _ => {
                        r.control("SS", [title.as_str()]);
                    }
                }
            }
            Event::Start(Tag::Paragraph) => inl.clear(),
            Event::End(TagEnd::Paragraph) if row.is_empty() => {
                r.control("PP", []).text(std::mem::take(&mut inl));
            }
            Event::Start(Tag::CodeBlock(_)) => {
                in_code_block = true;
                r.control("PP", []).control("RS", ["4"]).control("nf", []);
            }
            Event::End(TagEnd::CodeBlock) => {
                in_code_block = false;
                r.control("fi", []).control("RE", []);
            }
            Event::Start(Tag::Item) => inl.clear(),
            Event::End(TagEnd::Item) => {
                r.control("IP", ["-", "2"]).text(std::mem::take(&mut inl));
            }
            Event::Start(Tag::TableHead) => in_head = true,
            Event::End(TagEnd::TableHead) => {
                in_head = false;
                header = row.drain(..).map(|c| plain(&c).to_lowercase()).collect();
            }
            Event::Start(Tag::TableCell) => inl.clear(),
            Event::End(TagEnd::TableCell) => row.push(std::mem::take(&mut inl)),
            Event::End(TagEnd::TableRow) if !in_head => {
                let mut cells = row.drain(..);
                r.control("TP", []).text(cells.next().unwrap_or_default());
                let mut body = Vec::new();
                for (i, c) in cells.enumerate() {
                    let name = header.get(i + 1).map(String::as_str).unwrap_or("");
                    if !body.is_empty() {
                        body.push(roman(". "));
                    }
                    if name != "meaning" && !name.is_empty() {
                        body.push(italic(format!("{name}: ")));
                    }
                    body.extend(c);
                }
                r.text(body);
            }
            Event::Text(t) if in_code_block => {
                for line in t.lines() {
                    r.text([roman(line)]);
                }
            }
            Event::Text(t) => inl.push(if bold_on {
                bold(t.to_string())
            } else if italic_on {
                italic(t.to_string())
            } else {
                roman(t.to_string())
            }),
            Event::Code(t) => inl.push(bold(t.to_string())),
            Event::Start(Tag::Strong) => bold_on = true,
            Event::End(TagEnd::Strong) => bold_on = false,
            Event::Start(Tag::Emphasis) => italic_on = true,
            Event::End(TagEnd::Emphasis) => italic_on = false,
            Event::SoftBreak => inl.push(roman(" ")),
            Event::HardBreak => inl.push(clap_mangen::roff::line_break()),
            _ => {}
        }
    }
    r.control("SH", ["SEE ALSO"]);
    r.text([
        bold("sealnode"),
        roman("(1), "),
        bold("sealnode-check"),
        roman("(1), "),
        bold("sealnode-run"),
        roman("(1), "),
        bold("systemd.exec"),
        roman("(5)"),
    ]);
    r
}

/// A completion script for `shell`, offering what `--help` and the man pages show: never a
/// hidden subcommand (`probe`, and the internal `__canary-inside` and `__probe-inside` the
/// sandbox re-executes), which clap_complete would otherwise offer.
pub fn completions(top: clap::Command, shell: clap_complete::Shell) -> Outcome {
    clap_complete::generate(shell, &mut visible(&top), "sealnode", &mut std::io::stdout());
    Ok(0)
}

/// `c` without its hidden subcommands, at every level. clap cannot remove a subcommand, so a
/// command that has hidden ones is built again from its name, version, about, arguments,
/// groups, subcommand settings and its visible subcommands; one without is kept as it is.
fn visible(c: &clap::Command) -> clap::Command {
    fn has_hidden(c: &clap::Command) -> bool {
        c.get_subcommands().any(|s| s.is_hide_set() || has_hidden(s))
    }
    if !has_hidden(c) {
        return c.clone();
    }
    let mut out = clap::Command::new(c.get_name().to_string())
        .args(c.get_arguments().cloned())
        .groups(c.get_groups().cloned())
        .subcommand_required(c.is_subcommand_required_set())
        .arg_required_else_help(c.is_arg_required_else_help_set());
    if let Some(v) = c.get_version() {
        out = out.version(v.to_string());
    }
    if let Some(a) = c.get_about() {
        out = out.about(a.clone());
    }
    if let Some(a) = c.get_long_about() {
        out = out.long_about(a.clone());
    }
    out.subcommands(c.get_subcommands().filter(|s| !s.is_hide_set()).map(visible))
}
