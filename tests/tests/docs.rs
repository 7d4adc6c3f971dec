//! The documentation cannot drift from itself: the README stays page one
//! (at most 250 lines), every Markdown file in `docs/` is a chapter of the
//! book, and every relative link in them (a file, or a heading in one)
//! leads somewhere. Needs nothing: no root, no network.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("repo root")
}

/// The Markdown files the docs are made of: the README and `docs/*.md`.
fn pages() -> Vec<PathBuf> {
    let mut v = vec![repo().join("README.md")];
    let mut docs: Vec<PathBuf> = std::fs::read_dir(repo().join("docs"))
        .expect("docs/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .collect();
    docs.sort();
    v.extend(docs);
    v
}

/// Text outside fenced code blocks.
fn prose(text: &str) -> String {
    let mut fenced = false;
    let mut out = String::new();
    for l in text.lines() {
        if l.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if !fenced {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// GitHub's anchor of a heading: lower case, punctuation dropped but for
/// `-` and `_`, spaces made `-`.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == '-' || *c == '_' || *c == ' ')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn anchors(text: &str) -> BTreeSet<String> {
    prose(text)
        .lines()
        .filter(|l| l.starts_with('#'))
        .map(|l| slug(l.trim_start_matches('#')))
        .collect()
}

/// A line without its inline code spans (`` `[x](y)` `` is not a link).
fn without_code(line: &str) -> String {
    line.split('`').step_by(2).collect::<Vec<_>>().join(" ")
}

/// Every `[text](target)` (and `![alt](target)`) of a page's prose.
fn links(text: &str) -> Vec<String> {
    let p: String = prose(text)
        .lines()
        .map(|l| without_code(l) + "\n")
        .collect();
    let mut out = Vec::new();
    let mut rest = p.as_str();
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        if let Some(end) = rest.find(')') {
            // `[t](x.md "title")`: the target is up to the title.
            let target = rest[..end].split_whitespace().next().unwrap_or_default();
            if !target.is_empty() {
                out.push(target.to_string());
            }
        }
    }
    out
}

#[test]
fn the_readme_is_page_one() {
    let text = std::fs::read_to_string(repo().join("README.md")).expect("README");
    let lines = text.lines().count();
    assert!(
        lines <= 250,
        "the README has {lines} lines: page one is at most 250, the rest goes to docs/"
    );
    // It still names the test command CI runs.
    let ci = std::fs::read_to_string(repo().join(".ci/run")).expect(".ci/run");
    assert!(
        ci.lines()
            .any(|l| !l.trim_start().starts_with('#') && l.contains("cargo xtask test"))
            && text.contains("cargo xtask test"),
        ".ci/run must run the README's test command"
    );
}

#[test]
fn every_chapter_is_in_the_book() {
    let summary = std::fs::read_to_string(repo().join("docs/SUMMARY.md")).expect("SUMMARY");
    for page in pages().iter().skip(1) {
        let name = page
            .file_name()
            .and_then(|n| n.to_str())
            .unwrap_or_default();
        if name == "SUMMARY.md" {
            continue;
        }
        assert!(
            summary.contains(&format!("]({name})")),
            "docs/{name} is not in docs/SUMMARY.md"
        );
    }
}

#[test]
fn every_relative_link_leads_somewhere() {
    let mut checked = 0;
    let mut broken = Vec::new();
    for page in pages() {
        let text = std::fs::read_to_string(&page).expect("page");
        let dir = page.parent().expect("folder");
        for target in links(&text) {
            if target.starts_with("http://")
                || target.starts_with("https://")
                || target.starts_with("mailto:")
            {
                continue;
            }
            let (file, anchor) = match target.split_once('#') {
                Some((f, a)) => (f, Some(a)),
                None => (target.as_str(), None),
            };
            let path = if file.is_empty() {
                page.clone()
            } else {
                dir.join(file)
            };
            checked += 1;
            // The book is built from docs/ alone: a chapter's link out of
            // it is a page that does not exist there.
            if dir.ends_with("docs") && file.starts_with("../") {
                broken.push(format!("{}: {target} (outside docs/)", page.display()));
                continue;
            }
            if !path.exists() {
                broken.push(format!("{}: {target} (no such file)", page.display()));
                continue;
            }
            if let Some(a) = anchor
                && path.extension().is_some_and(|e| e == "md")
            {
                let there = std::fs::read_to_string(&path).expect("target page");
                if !anchors(&there).contains(a) {
                    broken.push(format!("{}: {target} (no such heading)", page.display()));
                }
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser right?"
    );
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_link_check_can_fail() {
    let page = "# Title\n\nSee [there](#title), [gone](#nowhere) and `[x](y)`.\n\
                ```\n[fenced](#ignored)\n```\n";
    assert_eq!(links(page), vec!["#title", "#nowhere"]);
    let a = anchors(page);
    assert!(a.contains("title") && !a.contains("nowhere"));
    assert_eq!(
        slug(" `wattprof run [OPTIONS] -- CMD`"),
        "wattprof-run-options----cmd"
    );
}

/// The CLI reference, generated from clap (every subcommand's options
/// and their doc comments): `docs/cli.md` as committed.
fn cli_reference() -> String {
    let options = clap_markdown::MarkdownOptions::new()
        .title("Command-line reference".to_string())
        .show_footer(false)
        .show_table_of_contents(true);
    let text = fence_examples(&clap_markdown::help_markdown_custom::<wattprof::cli::Cli>(
        &options,
    ));
    format!(
        "<!-- Generated from wattprof's clap definitions by \
         `WATTPROF_BLESS=1 cargo test -p wattprof-tests --test docs`: \
         do not edit by hand. -->\n\n{}",
        text.trim_end()
    ) + "\n"
}

/// An `Examples:` paragraph of clap's after-help (indented commands) as
/// a code block, so they render as lines and can be copied.
fn fence_examples(text: &str) -> String {
    let mut out = String::new();
    let mut in_examples = false;
    for line in text.lines() {
        if in_examples && !line.starts_with("  ") {
            out.push_str("```\n");
            in_examples = false;
        }
        if in_examples {
            out.push_str(line.trim_start());
        } else {
            out.push_str(line);
        }
        out.push('\n');
        if line == "Examples:" {
            out.push_str("\n```sh\n");
            in_examples = true;
        }
    }
    if in_examples {
        out.push_str("```\n");
    }
    out
}

#[test]
fn the_cli_reference_is_generated_from_the_code_and_fresh() {
    let path = repo().join("docs/cli.md");
    let now = cli_reference();
    if std::env::var_os("WATTPROF_BLESS").is_some() {
        std::fs::write(&path, &now).expect("write docs/cli.md");
        return;
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == now,
        "docs/cli.md is stale: an option or its doc changed. Regenerate it with \
         `WATTPROF_BLESS=1 cargo test -p wattprof-tests --test docs` and commit it"
    );
    for sub in [
        "wattprof run",
        "wattprof monitor",
        "wattprof sources",
        "wattprof report",
        "wattprof calibrate",
    ] {
        assert!(now.contains(sub), "{sub} is missing from the reference");
    }
}
