//! The layering ARCHITECTURE.md states, checked on the source: no module imports a layer
//! its "knows nothing of" column excludes, and no two files of one module import each
//! other through a circle. Test code (`#[cfg(test)]` modules, `tests.rs`) may import
//! anything. A path is resolved to the longest module prefix it names, so
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

/// The source without its test modules (everything from the first `#[cfg(test)]` on)
/// and without comments: a doc link is not an import.
fn production(text: &str) -> String {
    let code = match text.find("#[cfg(test)]") {
        Some(i) => &text[..i],
        None => text,
    };
    code.lines()
        .map(|l| l.split("//").next().unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
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

/// `from -> to` module imports of production code.
fn imports(src: &Path) -> BTreeSet<(Vec<String>, Vec<String>)> {
    let mods = modules(src);
    let known: BTreeSet<Vec<String>> = mods.keys().cloned().collect();
    let mut out = BTreeSet::new();
    for (m, file) in &mods {
        let text = std::fs::read_to_string(file).expect("read source");
        for p in paths(&production(&text)) {
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
