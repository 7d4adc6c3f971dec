//! The crate's layers, checked on its parsed sources: no module imports
//! from a layer above its own, every module has a layer, and no two files
//! of one module import each other (a file circle).
//!
//! Paths are read from the syntax tree (`use` trees and every path in the
//! code, `crate::`, `super::` and `self::` resolved against the file's
//! module), not matched as text: a comment or string naming a module is
//! not an import, and a path spelled `super::super::x` is. Paths inside
//! macro invocations are read from their tokens. What no path names is
//! not seen: a method call (`self.cgroup_reports()`) between files that
//! extend one type's `impl` (as `profile`'s do) is no import here.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use syn::visit::Visit;

/// The layers of the crate map in `lib.rs`, lowest first. Modules in one
/// entry are one layer; a module may import from its own layer's other
/// modules only if they are leaves (the first entry).
const LAYERS: &[&[&str]] = &[
    &[
        "carbon",
        "hash",
        "privilege",
        "topology",
        "testutil",
        "units",
    ],
    &["tracker"],
    &["sources"],
    &["staircase"],
    &["process"],
    &["attribution"],
    &["model"],
    &["sums"],
    &["render"],
    &["sink"],
    &["report"],
    &["profile"],
    &["exporter", "serve"],
    &["cli"],
];

fn rank(module: &str) -> Option<usize> {
    LAYERS.iter().position(|l| l.contains(&module))
}

/// The module path a file defines: `src/a/b.rs` and `src/a/b/mod.rs` are
/// `a::b`, `src/lib.rs` is the root.
fn module_of(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).expect("under src");
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

/// Every absolute crate path a file refers to.
struct Refs {
    /// The module of the code being visited (inline `mod`s pushed).
    here: Vec<String>,
    found: BTreeSet<Vec<String>>,
}

impl Refs {
    /// `segments` resolved against the current module, when they start
    /// at `crate`, `super` or `self`.
    fn resolve(&mut self, segments: &[String]) {
        let mut at = self.here.clone();
        let mut rest = segments;
        match segments.first().map(String::as_str) {
            Some("crate") => {
                at.clear();
                rest = &segments[1..];
            }
            Some("super" | "self") => {
                while let Some(s) = rest.first().map(String::as_str) {
                    match s {
                        "super" => {
                            at.pop();
                        }
                        "self" => {}
                        _ => break,
                    }
                    rest = &rest[1..];
                }
            }
            _ => return,
        }
        // A bare `crate`, `super` or `self` (a visibility, a receiver)
        // names no item; a glob of one (`use crate::*`) is resolved by
        // `glob`.
        if rest.is_empty() {
            return;
        }
        at.extend(rest.iter().cloned());
        self.found.insert(at);
    }

    /// `use PREFIX::*`: the module it opens, or, for the crate root, an
    /// empty path (refused: it reaches every layer).
    fn glob(&mut self, prefix: &[String]) {
        let before = self.found.len();
        self.resolve(prefix);
        let keyword = |s: &String| matches!(s.as_str(), "crate" | "super" | "self");
        if self.found.len() == before && !prefix.is_empty() && prefix.iter().all(keyword) {
            let mut at = self.here.clone();
            for s in prefix {
                match s.as_str() {
                    "crate" => at.clear(),
                    "super" => {
                        at.pop();
                    }
                    _ => {}
                }
            }
            self.found.insert(at);
        }
    }

    fn use_tree(&mut self, prefix: &mut Vec<String>, tree: &syn::UseTree) {
        match tree {
            syn::UseTree::Path(p) => {
                prefix.push(p.ident.to_string());
                self.use_tree(prefix, &p.tree);
                prefix.pop();
            }
            syn::UseTree::Name(n) => {
                prefix.push(n.ident.to_string());
                self.resolve(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Rename(r) => {
                prefix.push(r.ident.to_string());
                self.resolve(&prefix.clone());
                prefix.pop();
            }
            syn::UseTree::Glob(_) => self.glob(prefix),
            syn::UseTree::Group(g) => {
                for t in &g.items {
                    self.use_tree(prefix, t);
                }
            }
        }
    }
}

impl<'ast> Visit<'ast> for Refs {
    fn visit_item_use(&mut self, u: &'ast syn::ItemUse) {
        self.use_tree(&mut Vec::new(), &u.tree);
    }

    fn visit_path(&mut self, p: &'ast syn::Path) {
        let segments: Vec<String> = p.segments.iter().map(|s| s.ident.to_string()).collect();
        self.resolve(&segments);
        syn::visit::visit_path(self, p);
    }

    fn visit_item_mod(&mut self, m: &'ast syn::ItemMod) {
        self.here.push(m.ident.to_string());
        syn::visit::visit_item_mod(self, m);
        self.here.pop();
    }

    /// syn leaves a macro's tokens unparsed (`assert!`, `format!`,
    /// `matches!`): the paths in them are found in the tokens.
    fn visit_macro(&mut self, m: &'ast syn::Macro) {
        syn::visit::visit_macro(self, m);
        let mut tokens = Vec::new();
        flatten(m.tokens.clone(), &mut tokens);
        for path in paths_in(&tokens) {
            self.resolve(&path);
        }
    }
}

/// Identifiers and punctuation of a token stream, groups opened.
fn flatten(stream: proc_macro2::TokenStream, out: &mut Vec<String>) {
    for t in stream {
        match t {
            proc_macro2::TokenTree::Group(g) => {
                out.push(String::new());
                flatten(g.stream(), out);
                out.push(String::new());
            }
            proc_macro2::TokenTree::Ident(i) => out.push(i.to_string()),
            proc_macro2::TokenTree::Punct(p) => out.push(p.as_char().to_string()),
            proc_macro2::TokenTree::Literal(_) => out.push(String::new()),
        }
    }
}

/// The paths in flattened tokens that start at `crate`, `super` or
/// `self` (`a :: b` is the tokens `a`, `:`, `:`, `b`).
fn paths_in(tokens: &[String]) -> Vec<Vec<String>> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let starts = matches!(tokens[i].as_str(), "crate" | "super" | "self")
            && tokens.get(i + 1).is_some_and(|t| t == ":")
            && tokens.get(i + 2).is_some_and(|t| t == ":")
            && (i == 0 || tokens[i - 1] != ":");
        if !starts {
            i += 1;
            continue;
        }
        let mut path = vec![tokens[i].clone()];
        let mut j = i + 1;
        while tokens.get(j).is_some_and(|t| t == ":")
            && tokens.get(j + 1).is_some_and(|t| t == ":")
            && tokens.get(j + 2).is_some_and(|t| {
                t.chars()
                    .next()
                    .is_some_and(|c| c.is_alphabetic() || c == '_')
            })
        {
            path.push(tokens[j + 2].clone());
            j += 3;
        }
        out.push(path);
        i = j;
    }
    out
}

fn files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

fn parse(path: &Path) -> syn::File {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Files a `#[path = "..."]` module declaration names, and the module
/// each defines (the declaring file's module and the declared name).
fn path_attributes(src: &Path, paths: &[PathBuf]) -> BTreeMap<PathBuf, Vec<String>> {
    let mut out = BTreeMap::new();
    for path in paths {
        for item in parse(path).items {
            let syn::Item::Mod(m) = item else { continue };
            for a in &m.attrs {
                let syn::Meta::NameValue(nv) = &a.meta else {
                    continue;
                };
                if !nv.path.is_ident("path") {
                    continue;
                }
                if let syn::Expr::Lit(syn::ExprLit {
                    lit: syn::Lit::Str(file),
                    ..
                }) = &nv.value
                {
                    let dir = path.parent().unwrap_or(src);
                    let mut module = module_of(src, path);
                    module.push(m.ident.to_string());
                    out.insert(dir.join(file.value()), module);
                }
            }
        }
    }
    out
}

/// Each file's module and the crate paths it refers to.
fn references(src: &Path) -> Vec<(PathBuf, Vec<String>, BTreeSet<Vec<String>>)> {
    let mut paths = Vec::new();
    files(src, &mut paths);
    paths.sort();
    let declared_at = path_attributes(src, &paths);
    paths
        .into_iter()
        .map(|path| {
            let here = declared_at
                .get(&path)
                .cloned()
                .unwrap_or_else(|| module_of(src, &path));
            let mut refs = Refs {
                here: here.clone(),
                found: BTreeSet::new(),
            };
            refs.visit_file(&parse(&path));
            (path, here, refs.found)
        })
        .collect()
}

/// The top-level modules `lib.rs` declares.
fn declared(src: &Path) -> Vec<String> {
    parse(&src.join("lib.rs"))
        .items
        .iter()
        .filter_map(|i| match i {
            syn::Item::Mod(m) if m.content.is_none() => Some(m.ident.to_string()),
            _ => None,
        })
        .collect()
}

/// Layer violations: `file uses module` for each import from above.
fn upward(src: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    for (path, here, refs) in references(src) {
        let Some(mine) = here.first().and_then(|m| rank(m)) else {
            continue;
        };
        for r in &refs {
            let Some(target) = r.first() else {
                bad.push(format!(
                    "{} uses the crate root as a whole (a glob reaches every layer)",
                    path.strip_prefix(src).unwrap_or(&path).display()
                ));
                continue;
            };
            if here.first() == Some(target) {
                continue;
            }
            let Some(theirs) = rank(target) else {
                bad.push(format!(
                    "{} uses crate::{}, which has no layer (a root item: give it a module and \
                     a layer)",
                    path.strip_prefix(src).unwrap_or(&path).display(),
                    r.join("::")
                ));
                continue;
            };
            if theirs > mine {
                bad.push(format!(
                    "{} uses {} ({target} is above {})",
                    path.strip_prefix(src).unwrap_or(&path).display(),
                    r.join("::"),
                    here[0]
                ));
            }
        }
    }
    bad.sort();
    bad.dedup();
    bad
}

/// File circles within a module: files of one module (siblings, not a
/// parent and its child) that import each other, directly or round a
/// longer loop.
fn circles(src: &Path) -> Vec<String> {
    let refs = references(src);
    // The file defining each module path.
    let file_of: BTreeMap<Vec<String>, PathBuf> = refs
        .iter()
        .map(|(p, m, _)| (m.clone(), p.clone()))
        .collect();
    let mut edges: BTreeMap<PathBuf, BTreeSet<PathBuf>> = BTreeMap::new();
    for (path, here, found) in &refs {
        for r in found {
            // The longest prefix of the path that is a file's module.
            let Some(target) = (1..=r.len())
                .rev()
                .find_map(|n| file_of.get(&r[..n]).map(|f| (n, f)))
            else {
                continue;
            };
            let (n, file) = target;
            let there = &r[..n];
            // Siblings only: same parent, neither inside the other.
            let siblings = here.len() == there.len()
                && here.len() >= 2
                && here[..here.len() - 1] == there[..there.len() - 1]
                && here != there;
            if siblings {
                edges.entry(path.clone()).or_default().insert(file.clone());
            }
        }
    }
    let mut bad = Vec::new();
    for start in edges.keys() {
        // Depth-first from each file: a path back to it is a circle.
        let mut stack = vec![(start.clone(), vec![start.clone()])];
        let mut seen = BTreeSet::new();
        while let Some((at, trail)) = stack.pop() {
            for next in edges.get(&at).into_iter().flatten() {
                if next == start {
                    let names: Vec<String> = trail
                        .iter()
                        .chain(std::iter::once(next))
                        .map(|p| p.strip_prefix(src).unwrap_or(p).display().to_string())
                        .collect();
                    bad.push(names.join(" -> "));
                } else if seen.insert(next.clone()) {
                    let mut t = trail.clone();
                    t.push(next.clone());
                    stack.push((next.clone(), t));
                }
            }
        }
    }
    bad
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

#[test]
fn every_module_has_a_layer() {
    let missing: Vec<String> = declared(&src())
        .into_iter()
        .filter(|m| m != "layering" && rank(m).is_none())
        .collect();
    assert!(
        missing.is_empty(),
        "modules with no layer (add each to LAYERS in src/layering.rs): {missing:?}"
    );
}

#[test]
fn no_module_imports_from_a_layer_above_it() {
    let bad = upward(&src());
    assert!(bad.is_empty(), "{bad:#?}");
}

#[test]
fn no_two_files_of_a_module_import_each_other() {
    let bad = circles(&src());
    assert!(bad.is_empty(), "{bad:#?}");
}

/// The checks themselves, on a small crate written for them: each finds
/// what it must, and only that.
#[test]
fn the_checks_find_an_upward_import_and_a_circle_and_nothing_else() {
    let dir = std::env::temp_dir().join(format!("wattprof-layering-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let write = |rel: &str, text: &str| {
        let p = dir.join(rel);
        std::fs::create_dir_all(p.parent().expect("parent")).expect("mkdir");
        std::fs::write(p, text).expect("write");
    };
    write(
        "lib.rs",
        "pub mod tracker;\npub mod sink;\npub mod report;\nmod stray;\n",
    );
    // sink (below report) reaches up two ways: a `use` and a path in
    // code through `super`. A comment and a string naming report are not
    // imports.
    write(
        "sink/mod.rs",
        "pub mod table;\n#[cfg(test)]\n#[path = \"tests_of_table.rs\"]\nmod tests;\n\
         // crate::report::x is only a comment\nfn f() { let _ = \"crate::report::y\"; }\n",
    );
    write(
        "sink/table.rs",
        "use crate::report::Summary;\nfn g() { super::super::report::render(); }\n",
    );
    write("report/mod.rs", "use crate::render;\n");
    // Inside a macro, and through a glob of the root.
    write("tracker/c.rs", "fn h() { assert!(crate::report::ok()); }\n");
    write("tracker/d.rs", "use crate::*;\n");
    // A #[path] file is the module that declares it: `super` there is
    // sink, not the crate root.
    write(
        "sink/tests_of_table.rs",
        "use super::table::x;\nuse super::super::report::y;\n",
    );
    // Two tracker files that import each other.
    write("tracker/mod.rs", "mod a;\nmod b;\nmod c;\nmod d;\n");
    write("tracker/a.rs", "use super::b::f;\n");
    write("tracker/b.rs", "pub fn f() {}\nfn g() { super::a::h(); }\n");
    write("stray.rs", "");
    let up = upward(&dir);
    assert_eq!(
        up,
        vec![
            "sink/table.rs uses report::Summary (report is above sink)".to_string(),
            "sink/table.rs uses report::render (report is above sink)".to_string(),
            "sink/tests_of_table.rs uses report::y (report is above sink)".to_string(),
            "tracker/c.rs uses report::ok (report is above tracker)".to_string(),
            "tracker/d.rs uses the crate root as a whole (a glob reaches every layer)".to_string(),
        ]
    );
    let circles = circles(&dir);
    assert!(
        circles
            .iter()
            .any(|c| c == "tracker/a.rs -> tracker/b.rs -> tracker/a.rs"),
        "{circles:?}"
    );
    assert_eq!(circles.len(), 2, "{circles:?}");
    assert!(declared(&dir).contains(&"stray".to_string()));
    assert!(rank("stray").is_none());
    let _ = std::fs::remove_dir_all(&dir);
}
