//! The documentation holds together: every relative link and `#anchor` in
//! README.md and docs/**/*.md resolves (the file exists; the anchor is a
//! heading's slug as GitHub and mdBook make them), every chapter under docs/
//! is listed in docs/SUMMARY.md, and README's test command is the one
//! `.ci/run` runs. Plain file reads: no network, no build of the server.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::{BTreeSet, HashMap};
use std::path::{Component, Path, PathBuf};

/// The repository root (where Cargo.toml is).
fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// README.md and every Markdown file under docs/, relative to the root.
fn documents() -> Vec<PathBuf> {
    let mut files = vec![PathBuf::from("README.md")];
    let mut dirs = vec![PathBuf::from("docs")];
    while let Some(dir) = dirs.pop() {
        let entries = std::fs::read_dir(root().join(&dir)).unwrap();
        for entry in entries {
            let path = dir.join(entry.unwrap().file_name());
            if root().join(&path).is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "md") {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// The lines of a Markdown text outside fenced code blocks, with their
/// 1-based numbers.
fn prose(text: &str) -> Vec<(usize, &str)> {
    let mut fence: Option<&str> = None;
    let mut lines = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let marker = ["```", "~~~"].into_iter().find(|m| trimmed.starts_with(m));
        match (fence, marker) {
            (None, Some(m)) => fence = Some(m),
            (Some(open), Some(m)) if open == m => fence = None,
            (None, None) => lines.push((i + 1, line)),
            _ => {}
        }
    }
    lines
}

/// A line with its inline code spans (`...`) blanked, so a link written as
/// code is not a link.
fn without_code_spans(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut in_code = false;
    for c in line.chars() {
        if c == '`' {
            in_code = !in_code;
            out.push(' ');
        } else {
            out.push(if in_code { ' ' } else { c });
        }
    }
    out
}

/// The heading text of an ATX heading line (`## Text`), if it is one.
fn heading(line: &str) -> Option<&str> {
    let hashes = line.len() - line.trim_start_matches('#').len();
    if !(1..=6).contains(&hashes) {
        return None;
    }
    let rest = &line[hashes..];
    rest.starts_with(' ')
        .then(|| rest.trim().trim_end_matches('#').trim())
}

/// The anchor GitHub and mdBook give a heading: lower case, markup and
/// punctuation dropped (letters, digits, `_` and `-` kept), each space a `-`.
fn slug(heading: &str) -> String {
    let text = strip_inline_links(heading);
    text.chars()
        .filter_map(|c| {
            if c.is_alphanumeric() || c == '_' || c == '-' {
                Some(c.to_lowercase().collect::<String>())
            } else if c == ' ' {
                Some("-".to_string())
            } else {
                None
            }
        })
        .collect()
}

/// `[text](target)` -> `text`, as a heading's anchor is made from its text.
fn strip_inline_links(text: &str) -> String {
    let mut out = String::new();
    let mut rest = text;
    while let Some((before, after)) = rest.split_once("](") {
        out.push_str(&before.replacen('[', "", 1));
        rest = after.split_once(')').map_or("", |(_, r)| r);
    }
    out.push_str(rest);
    out
}

/// Every anchor a document's headings define; a repeated heading gets `-1`,
/// `-2`, ... as on GitHub and in mdBook.
fn anchors(text: &str) -> BTreeSet<String> {
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut out = BTreeSet::new();
    for h in prose(text).into_iter().filter_map(|(_, l)| heading(l)) {
        let base = slug(h);
        let n = seen.entry(base.clone()).or_insert(0);
        out.insert(if *n == 0 {
            base.clone()
        } else {
            format!("{base}-{n}")
        });
        *n += 1;
    }
    out
}

/// Every inline link target `[text](target)` on the prose lines, with its
/// 1-based line number.
fn links(text: &str) -> Vec<(usize, String)> {
    let mut found = Vec::new();
    for (number, line) in prose(text) {
        let line = without_code_spans(line);
        let mut rest = line.as_str();
        while let Some(at) = rest.find("](") {
            let after = &rest[at + 2..];
            let end = after.find(')').unwrap_or(after.len());
            let target = after[..end].split_whitespace().next().unwrap_or("");
            found.push((number, target.to_string()));
            rest = &after[end..];
        }
    }
    found
}

/// `a/b/../c` -> `a/c`, without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for part in path.components() {
        match part {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Why a link from `doc` does not resolve, or None when it does.
fn broken(doc: &Path, target: &str, cache: &mut HashMap<PathBuf, String>) -> Option<String> {
    if target.contains("://") || target.starts_with("mailto:") {
        return None; // absolute: not checked (no network)
    }
    let (file, anchor) = match target.split_once('#') {
        Some((f, a)) => (f, Some(a)),
        None => (target, None),
    };
    let path = if file.is_empty() {
        doc.to_path_buf()
    } else {
        normalize(&doc.parent().unwrap_or(Path::new("")).join(file))
    };
    let full = root().join(&path);
    if path.starts_with("..") || !full.exists() {
        return Some(format!("{} does not exist", path.display()));
    }
    let anchor = anchor?;
    if full.extension().is_none_or(|e| e != "md") {
        return Some(format!("anchor #{anchor} into a file that is not Markdown"));
    }
    let text = cache
        .entry(path.clone())
        .or_insert_with(|| std::fs::read_to_string(&full).unwrap());
    (!anchors(text).contains(anchor))
        .then(|| format!("{} has no heading with anchor #{anchor}", path.display()))
}

#[test]
fn every_relative_link_and_anchor_resolves() {
    let mut cache = HashMap::new();
    let mut failures = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = std::fs::read_to_string(root().join(&doc)).unwrap();
        for (line, target) in links(&text) {
            checked += 1;
            if let Some(why) = broken(&doc, &target, &mut cache) {
                failures.push(format!("{}:{line}: ({target}) {why}", doc.display()));
            }
        }
    }
    assert!(
        checked > 50,
        "only {checked} links found: is the parser blind?"
    );
    assert!(
        failures.is_empty(),
        "broken links:\n{}",
        failures.join("\n")
    );
}

#[test]
fn every_chapter_is_in_the_summary() {
    let summary = std::fs::read_to_string(root().join("docs/SUMMARY.md")).unwrap();
    let listed: BTreeSet<PathBuf> = links(&summary)
        .into_iter()
        .map(|(_, t)| normalize(&Path::new("docs").join(t)))
        .collect();
    let unlisted: Vec<String> = documents()
        .into_iter()
        .filter(|d| d.starts_with("docs") && d != Path::new("docs/SUMMARY.md"))
        .filter(|d| !listed.contains(d))
        .map(|d| d.display().to_string())
        .collect();
    assert!(
        unlisted.is_empty(),
        "chapters missing from docs/SUMMARY.md: {unlisted:?}"
    );
}

/// The command lines of README's "Test it" section (its first code block).
fn readme_test_commands() -> Vec<String> {
    let readme = std::fs::read_to_string(root().join("README.md")).unwrap();
    let section = readme
        .split("\n## Test it\n")
        .nth(1)
        .expect("README.md has a `## Test it` section");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("README's Test it section opens with a ```sh block");
    block
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(String::from)
        .collect()
}

#[test]
fn readme_test_command_is_what_ci_runs() {
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    let ci_lines: BTreeSet<&str> = ci.lines().map(str::trim).collect();
    let commands = readme_test_commands();
    assert!(!commands.is_empty(), "README's Test it block is empty");
    for command in commands {
        assert!(
            ci_lines.contains(command.as_str()),
            "README's test command `{command}` is not a line of .ci/run"
        );
    }
}

#[test]
fn slugs_follow_github_and_mdbook() {
    assert_eq!(slug("Run it"), "run-it");
    assert_eq!(slug("OpenAI-compatible HTTP"), "openai-compatible-http");
    assert_eq!(
        slug("Images, files, structured output and reasoning (OpenAI door)"),
        "images-files-structured-output-and-reasoning-openai-door"
    );
    assert_eq!(slug("`mock-upstream`"), "mock-upstream");
    assert_eq!(slug("What's next?"), "whats-next");
    let twice = anchors("# A\n\n## A\n\n```\n# not a heading\n```\n");
    assert_eq!(twice, BTreeSet::from(["a".to_string(), "a-1".to_string()]));
}
