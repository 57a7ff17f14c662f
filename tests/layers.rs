//! The layering ARCHITECTURE.md states, checked on the source: no module imports a layer
//! its "knows nothing of" column excludes, and no two files of one module import each
//! other through a circle; and no file has more than 800 lines before its tests. Test code may import anything: each file is read whole, and
//! what `#[cfg(test)]` attributes (a `mod tests { … }`, a `mod x;` and its file, a single
//! fn, `use` or impl, wherever in the file) is skipped by a small scanner that knows
//! strings, chars and comments; files named `tests.rs` are test code too. A path is resolved to the longest module prefix it names, so
//! `crate::capacity::node::is_terminal` is an import of `capacity::node`; an import of a
//! name a parent module re-exports counts as an import of that parent.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `(module, module it must not import)`, from ARCHITECTURE.md's table; each names a
/// module and everything under it.
const FORBIDDEN: &[(&str, &str)] = &[
    // quantity: everything else.
    ("quantity", "kuberay"),
    ("quantity", "capacity"),
    ("quantity", "upgradeplan"),
    ("quantity", "admission"),
    ("quantity", "controller"),
    ("quantity", "kubectl"),
    ("quantity", "cli"),
    ("quantity", "podgroup"),
    // podgroup: everything but quantities (it sits below kuberay and capacity).
    ("podgroup", "kuberay"),
    ("podgroup", "capacity"),
    ("podgroup", "upgradeplan"),
    ("podgroup", "admission"),
    ("podgroup", "autoscale"),
    ("podgroup", "controller"),
    ("podgroup", "kubectl"),
    ("podgroup", "cli"),
    // kuberay: capacity, plans, decisions, clients.
    ("kuberay", "capacity"),
    ("kuberay", "upgradeplan"),
    ("kuberay", "admission"),
    ("kuberay", "controller"),
    ("kuberay", "kubectl"),
    ("kuberay", "cli"),
    ("kuberay", "leader"),
    ("kuberay", "server"),
    // kueue: plans, decisions, clients (it may know quantities and capacity's lists).
    ("kueue", "upgradeplan"),
    ("kueue", "admission"),
    ("kueue", "controller"),
    ("kueue", "kubectl"),
    ("kueue", "cli"),
    ("kueue", "kuberay"),
    // capacity: KubeRay, plans, decisions.
    ("capacity", "kuberay"),
    ("capacity", "upgradeplan"),
    ("capacity", "admission"),
    ("capacity", "controller"),
    ("capacity", "kubectl"),
    ("capacity", "cli"),
    // upgradeplan: decisions.
    ("upgradeplan", "admission"),
    ("upgradeplan", "controller"),
    ("upgradeplan", "kubectl"),
    ("upgradeplan", "cli"),
    // admission: I/O.
    ("admission", "controller"),
    ("admission", "kubectl"),
    ("admission", "cli"),
    ("admission", "leader"),
    ("admission", "server"),
    ("admission", "telemetry"),
    // the operator's I/O pieces: decisions (an Outcome or a Phase is only a label).
    ("leader", "admission"),
    ("leader", "controller"),
    ("server", "admission"),
    ("server", "controller"),
    ("telemetry", "admission"),
    ("telemetry", "controller"),
    // the CLI: the controller.
    ("cli", "controller"),
    ("kubectl", "controller"),
    // the controller: the rules (it reads a Decision, never how one is made).
    ("controller", "admission::rules"),
    // autoscale: pure, it completes a Decision's status; the I/O is controller::buffers.
    ("autoscale", "controller"),
    ("autoscale", "admission::rules"),
    ("autoscale", "kubectl"),
    ("autoscale", "cli"),
];

/// Imports that break the rules today, each to be removed (issue 23). The test fails
/// when one of these is gone too, so the list only ever shrinks.
const KNOWN: &[&str] = &[];

/// A module path (`["capacity", "fit"]`) per source file.
fn modules(src: &Path) -> BTreeMap<Vec<String>, PathBuf> {
    let mut out = BTreeMap::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read src") {
            let path = entry.expect("dir entry").path();
            if path.is_dir() {
                if path
                    .file_name()
                    .is_some_and(|n| n != "bin" && n != "snapshots")
                {
                    stack.push(path);
                }
                continue;
            }
            if path.extension().is_none_or(|e| e != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).expect("under src");
            let mut segs: Vec<String> = rel
                .with_extension("")
                .components()
                .map(|c| c.as_os_str().to_string_lossy().into_owned())
                .collect();
            match segs.last().map(String::as_str) {
                Some("main" | "lib") if segs.len() == 1 => continue,
                Some("tests") => continue,
                Some("mod") => {
                    segs.pop();
                }
                _ => {}
            }
            out.insert(segs, path);
        }
    }
    out
}

/// The source as the compiler sees it outside tests, read whole: comments dropped (a doc
/// link is not an import), string and char literals emptied (a path in a message is not
/// one either), and every `#[cfg(test)]` item skipped (see [`without_test_items`]); with
/// the names of the `mod x;` declarations skipped, whose files are test code.
fn production(text: &str) -> (String, Vec<String>) {
    without_test_items(&code_only(text))
}

/// `text` without comments, and with the contents of string, byte string, raw string and
/// char literals removed (the quotes stay), so that a brace or a `#[cfg(test)]` in them
/// means nothing to the scanner. Newlines stay where they were. Lifetimes (`'a`) are code.
fn code_only(text: &str) -> String {
    let c: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let ident = |x: char| x.is_alphanumeric() || x == '_';
    while i < c.len() {
        let at = |k: usize| c.get(k).copied().unwrap_or('\0');
        match c[i] {
            '/' if at(i + 1) == '/' => {
                while i < c.len() && c[i] != '\n' {
                    i += 1;
                }
            }
            '/' if at(i + 1) == '*' => {
                // Block comments nest.
                let mut depth = 0;
                while i < c.len() {
                    if c[i] == '/' && at(i + 1) == '*' {
                        depth += 1;
                        i += 2;
                    } else if c[i] == '*' && at(i + 1) == '/' {
                        depth -= 1;
                        i += 2;
                        if depth == 0 {
                            break;
                        }
                    } else {
                        if c[i] == '\n' {
                            out.push('\n');
                        }
                        i += 1;
                    }
                }
                out.push(' ');
            }
            // A raw string: `r"…"`, `r#"…"#`, `br#"…"#` (not an identifier ending in r).
            'r' if (at(i + 1) == '"' || at(i + 1) == '#')
                && (i == 0
                    || !ident(c[i - 1])
                    || (c[i - 1] == 'b' && (i < 2 || !ident(c[i - 2])))) =>
            {
                let mut k = i + 1;
                let mut hashes = 0;
                while at(k) == '#' {
                    hashes += 1;
                    k += 1;
                }
                if at(k) != '"' {
                    // `r#ident`, a raw identifier.
                    out.push(c[i]);
                    i += 1;
                    continue;
                }
                k += 1;
                loop {
                    if k >= c.len() {
                        break;
                    }
                    if c[k] == '"' && (1..=hashes).all(|h| at(k + h) == '#') {
                        k += 1 + hashes;
                        break;
                    }
                    if c[k] == '\n' {
                        out.push('\n');
                    }
                    k += 1;
                }
                out.push_str("\"\"");
                i = k;
            }
            '"' => {
                i += 1;
                while i < c.len() && c[i] != '"' {
                    if c[i] == '\\' {
                        i += 1;
                    }
                    if at(i) == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
                out.push_str("\"\"");
                i += 1;
            }
            // A char literal (`'x'`, `'\n'`, `'\u{7d}'`); else a lifetime or label.
            '\'' if at(i + 1) == '\\' || (at(i + 2) == '\'' && at(i + 1) != '\'') => {
                i += 1;
                while i < c.len() && c[i] != '\'' {
                    if c[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                out.push_str("''");
                i += 1;
            }
            x => {
                out.push(x);
                i += 1;
            }
        }
    }
    out
}

/// `code` (from [`code_only`]) without the items attributed `#[cfg(test)]`: the
/// attribute, any attributes after it, and the item up to its end: the `}` that closes
/// its first brace block (`mod tests { … }`, a fn, an impl), or a `;` or `,` outside any
/// brackets (`mod tests;`, a `use`, a field), or the closer of the block it sits in.
/// Code after the item is read on. The names of skipped `mod x;` declarations come back.
fn without_test_items(code: &str) -> (String, Vec<String>) {
    let c: Vec<char> = code.chars().collect();
    let mut out = String::with_capacity(code.len());
    let mut test_mods = vec![];
    let mut i = 0;
    // The end (exclusive) of the attribute opening at `at` (`#[`, `#![`), if it is one.
    let attribute = |at: usize| -> Option<usize> {
        let mut k = at + 1;
        if c.get(k) == Some(&'!') {
            k += 1;
        }
        if c.get(k) != Some(&'[') {
            return None;
        }
        let mut depth = 0;
        while k < c.len() {
            match c[k] {
                '[' => depth += 1,
                ']' => {
                    depth -= 1;
                    if depth == 0 {
                        return Some(k + 1);
                    }
                }
                _ => {}
            }
            k += 1;
        }
        None
    };
    while i < c.len() {
        let Some(end) = (c[i] == '#').then(|| attribute(i)).flatten() else {
            out.push(c[i]);
            i += 1;
            continue;
        };
        let attr: String = c[i..end].iter().filter(|x| !x.is_whitespace()).collect();
        if attr != "#[cfg(test)]" {
            out.extend(&c[i..end]);
            i = end;
            continue;
        }
        // Skip further attributes, then the item.
        let mut k = end;
        loop {
            while k < c.len() && c[k].is_whitespace() {
                k += 1;
            }
            match (c.get(k) == Some(&'#')).then(|| attribute(k)).flatten() {
                Some(e) => k = e,
                None => break,
            }
        }
        let item = k;
        let mut depth = 0i32;
        while k < c.len() {
            match c[k] {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' => depth -= 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        k += 1;
                        break;
                    }
                }
                ';' | ',' if depth == 0 => {
                    k += 1;
                    break;
                }
                _ => {}
            }
            if depth < 0 {
                // The block the item sits in closes: keep its closer.
                break;
            }
            k += 1;
        }
        let skipped: String = c[item..k].iter().collect();
        if skipped.trim_end().ends_with(';') && !skipped.contains('{') {
            let words: Vec<&str> = skipped
                .split(|x: char| !(x.is_alphanumeric() || x == '_'))
                .filter(|w| !w.is_empty())
                .collect();
            if let Some(p) = words.iter().position(|w| *w == "mod")
                && let Some(name) = words.get(p + 1)
            {
                test_mods.push(name.to_string());
            }
        }
        // Newlines stay, so that what follows keeps its line.
        out.extend(c[i..k].iter().filter(|x| **x == '\n'));
        i = k;
    }
    (out, test_mods)
}

/// Every path starting with `crate::` or `super::` in `text`, brace groups expanded one
/// level (`use super::{fit::X, node}` gives `super::fit::X` and `super::node`).
fn paths(text: &str) -> Vec<String> {
    let mut out = vec![];
    let bytes = text.as_bytes();
    let ident = |b: u8| b.is_ascii_alphanumeric() || b == b'_';
    let mut i = 0;
    while i < bytes.len() {
        let rest = &bytes[i..];
        let starts = (rest.starts_with(b"crate::") || rest.starts_with(b"super::"))
            && (i == 0 || !ident(bytes[i - 1]));
        if !starts {
            i += 1;
            continue;
        }
        let mut j = i;
        while j < bytes.len() && (ident(bytes[j]) || bytes[j] == b':') {
            j += 1;
        }
        let head = text[i..j].trim_end_matches(':').to_string();
        if j < bytes.len() && bytes[j] == b'{' {
            let mut depth = 0;
            let mut k = j;
            while k < bytes.len() {
                match bytes[k] {
                    b'{' => depth += 1,
                    b'}' => {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    _ => {}
                }
                k += 1;
            }
            let inner = &text[j + 1..k.min(text.len())];
            let mut depth = 0;
            let mut item = String::new();
            for c in inner.chars().chain([',']) {
                match c {
                    '{' => depth += 1,
                    '}' => depth -= 1,
                    ',' if depth == 0 => {
                        let first: String = item
                            .trim()
                            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
                            .next()
                            .unwrap_or_default()
                            .trim_end_matches(':')
                            .to_string();
                        if !first.is_empty() && first != "self" {
                            out.push(format!("{head}::{first}"));
                        } else {
                            out.push(head.clone());
                        }
                        item.clear();
                        continue;
                    }
                    _ => {}
                }
                item.push(c);
            }
            i = k;
        } else {
            out.push(head);
            i = j;
        }
    }
    out
}

/// The module a `crate::` or `super::` path names, from the file of module `from`:
/// the longest prefix that is a module (`super` is the parent of the module path, for a
/// `mod.rs` as for a file).
fn resolve(path: &str, from: &[String], known: &BTreeSet<Vec<String>>) -> Vec<String> {
    let mut segs: Vec<&str> = path.split("::").collect();
    let mut base: Vec<String> = if segs[0] == "crate" {
        segs.remove(0);
        vec![]
    } else {
        let mut b = from.to_vec();
        while segs.first() == Some(&"super") {
            segs.remove(0);
            b.pop();
        }
        b
    };
    let mut best = base.clone();
    for s in segs {
        base.push(s.to_string());
        if known.contains(&base) {
            best = base.clone();
        } else {
            break;
        }
    }
    best
}

/// The production code of every module (see [`production`]), with its file. The files of
/// modules declared `#[cfg(test)] mod x;` (and everything under them) are test code.
fn production_modules(src: &Path) -> BTreeMap<Vec<String>, (PathBuf, String)> {
    let mut code = BTreeMap::new();
    let mut test_only: Vec<Vec<String>> = vec![];
    for (m, file) in modules(src) {
        let text = std::fs::read_to_string(&file).expect("read source");
        let (production, test_mods) = production(&text);
        for name in test_mods {
            test_only.push(m.iter().cloned().chain([name]).collect());
        }
        code.insert(m, (file, production));
    }
    code.retain(|m, _| !test_only.iter().any(|t| m.starts_with(t)));
    code
}

/// `from -> to` module imports of production code.
fn imports(src: &Path) -> BTreeSet<(Vec<String>, Vec<String>)> {
    let code = production_modules(src);
    let known: BTreeSet<Vec<String>> = modules(src).into_keys().collect();
    let mut out = BTreeSet::new();
    for (m, (_, production)) in &code {
        for p in paths(production) {
            let target = resolve(&p, m, &known);
            // The crate root, the module itself or an ancestor (re-exports): no edge.
            if target.is_empty() || m.starts_with(&target) {
                continue;
            }
            out.insert((m.clone(), target));
        }
    }
    out
}

/// Lines a file may have before its tests (issue 37): one concern a file.
const MAX_LINES: usize = 800;

/// Files longer than [`MAX_LINES`] today, each to be split; the test fails when one of
/// them is short enough too, so the list only ever shrinks.
const KNOWN_LONG: &[&str] = &[];

/// The line of a file's last production code (its length before its tests, wherever they
/// sit), for every production file longer than [`MAX_LINES`], by path under `src/`.
fn long_files(src: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (file, production) in production_modules(src).into_values() {
        let last = production
            .lines()
            .enumerate()
            .filter(|(_, l)| !l.trim().is_empty())
            .map(|(i, _)| i + 1)
            .last()
            .unwrap_or(0);
        if last > MAX_LINES {
            let rel = file.strip_prefix(src).expect("under src");
            out.insert(rel.to_string_lossy().into_owned());
        }
    }
    out
}

fn name(m: &[String]) -> String {
    m.join("::")
}

/// Circles among the files of one top-level module (ancestors excluded).
fn circles(edges: &BTreeSet<(Vec<String>, Vec<String>)>) -> Vec<Vec<String>> {
    let mut graph: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (a, b) in edges {
        if a[0] == b[0] && a.len() > 1 && b.len() > 1 {
            graph.entry(name(a)).or_default().insert(name(b));
        }
    }
    // Tarjan's strongly connected components.
    struct T<'g> {
        g: &'g BTreeMap<String, BTreeSet<String>>,
        index: BTreeMap<String, usize>,
        low: BTreeMap<String, usize>,
        on: BTreeSet<String>,
        stack: Vec<String>,
        next: usize,
        out: Vec<Vec<String>>,
    }
    fn visit(t: &mut T<'_>, v: &str) {
        t.index.insert(v.to_string(), t.next);
        t.low.insert(v.to_string(), t.next);
        t.next += 1;
        t.stack.push(v.to_string());
        t.on.insert(v.to_string());
        let succ: Vec<String> = t.g.get(v).into_iter().flatten().cloned().collect();
        for w in succ {
            if !t.index.contains_key(&w) {
                visit(t, &w);
                let lw = t.low[&w];
                let lv = t.low[v];
                t.low.insert(v.to_string(), lv.min(lw));
            } else if t.on.contains(&w) {
                let iw = t.index[&w];
                let lv = t.low[v];
                t.low.insert(v.to_string(), lv.min(iw));
            }
        }
        if t.low[v] == t.index[v] {
            let mut comp = vec![];
            while let Some(w) = t.stack.pop() {
                t.on.remove(&w);
                let done = w == v;
                comp.push(w);
                if done {
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
        g: &graph,
        index: BTreeMap::new(),
        low: BTreeMap::new(),
        on: BTreeSet::new(),
        stack: vec![],
        next: 0,
        out: vec![],
    };
    let nodes: Vec<String> = graph.keys().cloned().collect();
    for v in nodes {
        if !t.index.contains_key(&v) {
            visit(&mut t, &v);
        }
    }
    t.out
}

fn violations() -> BTreeSet<String> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let edges = imports(&src);
    let mut out = BTreeSet::new();
    let under = |m: &[String], prefix: &str| {
        let p: Vec<&str> = prefix.split("::").collect();
        m.len() >= p.len() && m.iter().zip(&p).all(|(a, b)| a == b)
    };
    for (from, to) in &edges {
        if FORBIDDEN
            .iter()
            .any(|(a, b)| under(from, a) && under(to, b))
        {
            out.insert(format!("{} -> {}", name(from), name(to)));
        }
    }
    for c in circles(&edges) {
        out.insert(format!("circle: {}", c.join(", ")));
    }
    out
}

#[test]
fn no_layer_imports_what_it_must_not_know_and_no_files_import_in_a_circle() {
    let found = violations();
    let known: BTreeSet<String> = KNOWN.iter().map(|s| s.to_string()).collect();
    let new: Vec<&String> = found.difference(&known).collect();
    let fixed: Vec<&String> = known.difference(&found).collect();
    assert!(
        new.is_empty() && fixed.is_empty(),
        "layering (ARCHITECTURE.md):\n  new violations: {new:#?}\n  fixed, remove from KNOWN: {fixed:#?}"
    );
}

#[test]
fn no_file_has_more_than_800_lines_before_its_tests() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let found = long_files(&src);
    let known: BTreeSet<String> = KNOWN_LONG.iter().map(|s| s.to_string()).collect();
    let new: Vec<&String> = found.difference(&known).collect();
    let fixed: Vec<&String> = known.difference(&found).collect();
    assert!(
        new.is_empty() && fixed.is_empty(),
        "files over {MAX_LINES} lines before their tests:\n  new: {new:#?}\n  \
         short enough now, remove from KNOWN_LONG: {fixed:#?}"
    );
}

#[test]
fn the_path_reader_expands_brace_groups() {
    let p = paths(
        "use super::{fit::StaticsCache, node};\nuse crate::kuberay::{self, X};\nlet a = crate::capacity::node::is_terminal(x);",
    );
    assert_eq!(
        p,
        [
            "super::fit::StaticsCache",
            "super::node",
            "crate::kuberay",
            "crate::kuberay::X",
            "crate::capacity::node::is_terminal"
        ]
    );
}

#[test]
fn code_after_a_test_item_in_the_middle_of_a_file_is_still_read() {
    let (code, test_mods) = production(
        "use crate::a::X;\n#[cfg(test)]\nmod tests {\n    use crate::b::Y;\n}\nuse crate::c::Z;\n",
    );
    assert_eq!(paths(&code), ["crate::a::X", "crate::c::Z"]);
    assert!(test_mods.is_empty());
    // The lines stay where they were.
    assert_eq!(code.lines().count(), 6);
}

#[test]
fn a_test_module_declaration_is_skipped_and_named() {
    let (code, test_mods) = production(
        "#[cfg(test)]\nmod reconcile_tests;\n#[cfg(test)]\npub(crate) mod fit_tests;\nmod real;\nuse crate::c::Z;",
    );
    assert_eq!(paths(&code), ["crate::c::Z"]);
    assert_eq!(test_mods, ["reconcile_tests", "fit_tests"]);
    assert!(code.contains("mod real;"));
}

#[test]
fn a_single_test_fn_use_impl_or_field_is_skipped_and_what_follows_is_read() {
    let (code, _) = production(
        "#[cfg(test)]\nuse crate::b::Y;\n\
         #[cfg(test)]\n#[allow(dead_code)]\nfn helper() -> crate::b::Z { crate::b::z() }\n\
         #[cfg(test)]\nimpl crate::b::T for S { fn f(&self) {} }\n\
         fn kept() { crate::a::x(); }\n\
         #[cfg( test )] const N: [u8; 2] = [0, 1];\n\
         struct S {\n    a: u8,\n    #[cfg(test)]\n    b: crate::b::W,\n    c: crate::a::V,\n}\n",
    );
    assert_eq!(paths(&code), ["crate::a::x", "crate::a::V"]);
    assert!(code.contains("a: u8,") && code.contains("c: crate::a::V,\n}"));
}

#[test]
fn braces_in_strings_chars_and_comments_do_not_end_a_test_module() {
    let (code, _) = production(concat!(
        "#[cfg(test)]\nmod tests {\n",
        "    const S: &str = \"}\\\"}\";\n",
        "    const R: &str = r#\"}\"}\"#;\n",
        "    const C: char = '}';\n",
        "    const E: char = '\\'';\n",
        "    fn f<'a>(x: &'a str) -> &'a str { x } // }\n",
        "    /* } /* nested } */ } */\n",
        "    use crate::b::Y;\n",
        "}\n",
        "use crate::a::X;\n",
    ));
    assert_eq!(paths(&code), ["crate::a::X"]);
}

#[test]
fn comments_and_literals_are_not_imports_and_other_cfgs_are_code() {
    let (code, _) = production(concat!(
        "/// See [`crate::b::doc`].\n",
        "const URL: &str = \"http://x/crate::b::s\"; // crate::b::c\n",
        "#[cfg(not(test))]\nuse crate::a::X;\n",
        "fn f<'a>(l: &'a str) { crate::a::g(l, r#\"crate::b::raw\"#) }\n",
    ));
    assert_eq!(paths(&code), ["crate::a::X", "crate::a::g"]);
}
