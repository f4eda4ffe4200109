//! No import cycles between a crate's top-level modules (the core's `api`, `health`,
//! `incident`, `planner`, …; the operator's `runtime`, `metrics`, `leader`, …): a cycle means neither side can be understood, tested or replaced
//! without the other, and the lower one's types belong below both.
//!
//! The test walks each module tree from its `lib.rs` (following `mod` declarations, so
//! `src/main.rs` and files outside the tree do not count), strips comments, strings and
//! test-only code (items under `#[cfg(test)]`, whole `#[cfg(test)] mod` files included: a
//! test may drive one module through another, e.g. the prober against a real agent endpoint),
//! and takes every `crate::<module>` path (in `use` and in expressions; `super::` paths that
//! climb to the crate root count too) as an edge from the file's top-level module. It fails
//! naming each cycle and the lines that make it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// Code with comments, string and char literals blanked out, line breaks kept.
fn code_only(src: &str) -> String {
    let b = src.as_bytes();
    let mut out = String::with_capacity(src.len());
    let mut i = 0;
    let blank = |out: &mut String, s: &[u8]| {
        for &c in s {
            out.push(if c == b'\n' { '\n' } else { ' ' });
        }
    };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            let end = rest.iter().position(|&c| c == b'\n').unwrap_or(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            let mut j = 0;
            while j < rest.len() {
                if rest[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if rest[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, &rest[..j]);
            i += j;
        } else if rest[0] == b'r'
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
            && rest.len() > 1
            && (rest[1] == b'"' || rest[1] == b'#')
        {
            let hashes = rest[1..].iter().take_while(|&&c| c == b'#').count();
            if rest.get(1 + hashes) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            let mut close = vec![b'"'];
            close.extend(std::iter::repeat_n(b'#', hashes));
            let body = 2 + hashes;
            let end = rest[body..]
                .windows(close.len())
                .position(|w| w == close.as_slice())
                .map_or(rest.len(), |p| body + p + close.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'"' {
            let mut j = 1;
            while j < rest.len() && rest[j] != b'"' {
                j += if rest[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(rest.len());
            blank(&mut out, &rest[..end]);
            i += end;
        } else if rest[0] == b'\'' {
            // A char literal ('x', '\n', '\u{..}'), or a lifetime ('a), which stays.
            let end = if rest.get(1) == Some(&b'\\') {
                rest[2..].iter().position(|&c| c == b'\'').map(|p| p + 3)
            } else {
                let ch = src[i + 1..].chars().next().map_or(1, char::len_utf8);
                (rest.get(1 + ch) == Some(&b'\'')).then_some(2 + ch)
            };
            match end {
                Some(end) => {
                    blank(&mut out, &rest[..end]);
                    i += end;
                }
                None => {
                    out.push('\'');
                    i += 1;
                }
            }
        } else {
            let ch = src[i..].chars().next().map_or(1, char::len_utf8);
            out.push_str(&src[i..i + ch]);
            i += ch;
        }
    }
    out
}

/// Where the item starting at `from` ends: its `;` or its closing `}` at depth 0.
fn item_end(code: &[u8], from: usize) -> usize {
    let mut depth = 0i32;
    let mut j = from;
    while j < code.len() {
        match code[j] {
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' => depth -= 1,
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return j + 1;
                }
            }
            b';' if depth == 0 => return j + 1,
            _ => {}
        }
        j += 1;
    }
    code.len()
}

/// The code with every `#[cfg(test)]` item blanked out, and the names of `#[cfg(test)] mod x;`
/// files (skipped with their subtree).
fn without_test_items(code: &str) -> (String, BTreeSet<String>) {
    let mut out = code.as_bytes().to_vec();
    let mut test_mods = BTreeSet::new();
    let mut search = 0;
    while let Some(p) = code[search..].find("#[cfg(test)]") {
        let at = search + p;
        let end = item_end(code.as_bytes(), at + "#[cfg(test)]".len());
        let item = &code[at + "#[cfg(test)]".len()..end];
        let words: Vec<&str> = item
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ';'))
            .filter(|w| !w.is_empty())
            .collect();
        if let Some(m) = words.iter().position(|w| *w == "mod")
            && item.trim_end().ends_with(';')
            && let Some(name) = words.get(m + 1)
        {
            test_mods.insert(name.trim_end_matches(';').to_string());
        }
        for c in &mut out[at..end] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
        search = end;
    }
    (String::from_utf8_lossy(&out).into_owned(), test_mods)
}

/// `mod x;` declarations: the child files of this module.
fn declared_mods(code: &str) -> Vec<String> {
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ';' || c == '{'))
        .filter(|w| !w.is_empty())
        .collect();
    words
        .windows(2)
        .filter(|w| w[0] == "mod" && w[1].ends_with(';'))
        .map(|w| w[1].trim_end_matches(';').to_string())
        .collect()
}

struct File {
    path: PathBuf,
    /// The top-level module it belongs to.
    top: String,
    /// How many `super::` lead from it to the crate root.
    depth: usize,
    code: String,
}

fn walk(path: &Path, dir: &Path, top: Option<&str>, depth: usize, files: &mut Vec<File>) {
    let src = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let (code, test_mods) = without_test_items(&code_only(&src));
    for child in declared_mods(&code) {
        if test_mods.contains(&child) {
            continue;
        }
        let flat = dir.join(format!("{child}.rs"));
        let (child_path, child_dir) = if flat.exists() {
            (flat, dir.join(&child))
        } else {
            (dir.join(&child).join("mod.rs"), dir.join(&child))
        };
        let child_top = top.unwrap_or(&child);
        walk(&child_path, &child_dir, Some(child_top), depth + 1, files);
    }
    if let Some(top) = top {
        files.push(File {
            path: path.to_path_buf(),
            top: top.to_string(),
            depth,
            code,
        });
    }
}

/// The top-level modules `code` names, with the line of each: `crate::x`, or `super::` climbing
/// `depth` levels to the root and then `x`; `crate::{a, b::c}` groups over several lines too.
fn references(code: &str, depth: usize, modules: &BTreeSet<String>) -> Vec<(String, usize)> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    let mut at = 0;
    while at < code.len() {
        let rest = &code[at..];
        let starts_word = code[..at]
            .chars()
            .next_back()
            .is_none_or(|c| !ident(c) && c != ':');
        let root = if !starts_word {
            None
        } else if rest.starts_with("crate::") {
            Some("crate::".len())
        } else if depth > 0 && rest.starts_with(&"super::".repeat(depth)) {
            let len = "super::".len() * depth;
            (!rest[len..].starts_with("super::")).then_some(len)
        } else {
            None
        };
        let Some(len) = root else {
            at += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        };
        let line = code[..at].matches('\n').count() + 1;
        let after = rest[len..].trim_start();
        let names: Vec<String> = if let Some(group) = after.strip_prefix('{') {
            let mut depth = 0;
            let mut parts = vec![String::new()];
            for c in group.chars() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => parts.push(String::new()),
                    _ => {}
                }
                if let Some(last) = parts.last_mut() {
                    last.push(c);
                }
            }
            parts
                .iter()
                .map(|p| {
                    p.trim_start_matches(',')
                        .trim()
                        .chars()
                        .take_while(|c| ident(*c))
                        .collect()
                })
                .collect()
        } else {
            vec![after.chars().take_while(|c| ident(*c)).collect()]
        };
        for name in names {
            if modules.contains(&name) {
                found.push((name, line));
            }
        }
        at += len;
    }
    found
}

/// The graph's cycles: its strongly connected components of more than one module.
fn cycles(graph: &BTreeMap<String, BTreeSet<String>>) -> Vec<Vec<String>> {
    let reach = |from: &String| {
        let mut seen = BTreeSet::new();
        let mut stack = vec![from.clone()];
        while let Some(m) = stack.pop() {
            for next in graph.get(&m).into_iter().flatten() {
                if seen.insert(next.clone()) {
                    stack.push(next.clone());
                }
            }
        }
        seen
    };
    let reachable: BTreeMap<&String, BTreeSet<String>> =
        graph.keys().map(|m| (m, reach(m))).collect();
    let mut done = BTreeSet::new();
    let mut found = Vec::new();
    for m in graph.keys() {
        if done.contains(m) || !reachable[m].contains(m) {
            continue;
        }
        let component: Vec<String> = graph
            .keys()
            .filter(|o| reachable[m].contains(*o) && reachable[*o].contains(m))
            .cloned()
            .collect();
        done.extend(component.iter().cloned());
        found.push(component);
    }
    found
}

#[test]
fn the_top_level_modules_import_one_another_without_cycles() {
    // The decisions (crates/core) and the operator process (src/) are crates: Cargo keeps the
    // core from importing the process, and the agent and the contract from importing either.
    // This test guards the rooms inside each of the two.
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut report = Vec::new();
    for (crate_src, expected) in [
        (
            "crates/core/src",
            ["api", "planner", "incident", "protection"],
        ),
        ("src", ["runtime", "metrics", "explain", "leader"]),
    ] {
        report.extend(crate_cycles(&root.join(crate_src), crate_src, &expected));
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

/// The cycles among the top-level modules of the crate whose sources are in `src`, each with
/// the lines that make it.
fn crate_cycles(src: &Path, shown_as: &str, expected: &[&str]) -> Vec<String> {
    let mut files = Vec::new();
    walk(&src.join("lib.rs"), src, None, 0, &mut files);
    let modules: BTreeSet<String> = files.iter().map(|f| f.top.clone()).collect();
    for expected in expected {
        assert!(
            modules.contains(*expected),
            "{expected} not found in {shown_as}: {modules:?}"
        );
    }
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut witnesses: BTreeMap<(String, String), Vec<String>> = BTreeMap::new();
    for file in &files {
        graph.entry(file.top.clone()).or_default();
        for (to, line) in references(&file.code, file.depth, &modules) {
            if to == file.top {
                continue;
            }
            graph
                .entry(file.top.clone())
                .or_default()
                .insert(to.clone());
            let at = file.path.strip_prefix(src).unwrap_or(&file.path);
            witnesses
                .entry((file.top.clone(), to))
                .or_default()
                .push(format!("{shown_as}/{}:{line}", at.display()));
        }
    }
    cycles(&graph)
        .iter()
        .map(|component| {
            let edges: Vec<String> = component
                .iter()
                .flat_map(|from| {
                    graph[from]
                        .iter()
                        .filter(|to| component.contains(to))
                        .map(|to| {
                            format!(
                                "  {from} -> {to} ({})",
                                witnesses[&(from.clone(), to.clone())].join(", ")
                            )
                        })
                        .collect::<Vec<_>>()
                })
                .collect();
            format!(
                "cycle among {}:\n{}",
                component.join(", "),
                edges.join("\n")
            )
        })
        .collect()
}

/// The test would see a cycle: the parser finds the edges it must.
#[test]
fn the_parser_sees_crate_and_super_paths_and_skips_comments_strings_and_tests() {
    let modules: BTreeSet<String> = ["agent", "runtime", "api"].map(String::from).into();
    let code = code_only(
        "use crate::agent::x;\n// crate::api\nlet s = \"crate::api\";\nuse super::runtime::y;\nuse crate::{api::Z, agent};\n#[cfg(test)]\nmod tests { use crate::api::T; }\n",
    );
    let (code, _) = without_test_items(&code);
    let refs = references(&code, 1, &modules);
    assert_eq!(
        refs,
        vec![
            ("agent".to_string(), 1),
            ("runtime".to_string(), 4),
            ("api".to_string(), 5),
            ("agent".to_string(), 5),
        ]
    );
    let graph: BTreeMap<String, BTreeSet<String>> = [
        ("agent".to_string(), ["runtime".to_string()].into()),
        ("runtime".to_string(), ["agent".to_string()].into()),
        ("api".to_string(), BTreeSet::new()),
    ]
    .into();
    assert_eq!(
        cycles(&graph),
        vec![vec!["agent".to_string(), "runtime".to_string()]]
    );
}
