//! `sealnode man` and `sealnode completions`: documentation generated from the command line's
//! own definition.

use std::path::Path;

use super::{Failure, Outcome};

/// One roff page for the top-level command and one per visible subcommand (`sealnode-run.1`, ...).
pub fn man(top: clap::Command, dir: &Path) -> Outcome {
    let fail = |e: String| Failure::general(format!("man: {e}"));
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("cannot create {}: {e}", dir.display())))?;
    let mut pages = vec![top.clone()];
    for sub in top.get_subcommands().filter(|c| !c.is_hide_set()) {
        // Page `sealnode-canary(1)`, synopsis `sealnode canary ...`, as git names its pages.
        let bin = format!("sealnode {}", sub.get_name());
        pages.push(sub.clone().name(format!("sealnode-{}", sub.get_name())).bin_name(bin));
    }
    for page in pages {
        let path = dir.join(format!("{}.1", page.get_name()));
        let mut out = Vec::new();
        let man = clap_mangen::Man::new(page).source(concat!("sealnode ", env!("CARGO_PKG_VERSION")));
        man.render(&mut out).map_err(|e| fail(format!("cannot render {}: {e}", path.display())))?;
        sealnode::receipt::write_atomic(&path, &out, 0o644).map_err(|e| fail(e.to_string()))?;
    }
    Ok(0)
}

pub fn completions(mut top: clap::Command, shell: clap_complete::Shell) -> Outcome {
    clap_complete::generate(shell, &mut top, "sealnode", &mut std::io::stdout());
    Ok(0)
}
