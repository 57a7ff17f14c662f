//! The Grafana dashboard passes Grafana's own dashboard linter
//! (`github.com/grafana/dashboard-linter`, built by `e2e/setup-tools`;
//! `RAYGATE_DASHBOARD_LINTER` overrides its path) with `--strict`, and its
//! queries are PromQL the real Prometheus parser accepts: each panel query
//! becomes a recording rule, checked with `promtool check rules`
//! (`RAYGATE_PROMTOOL` overrides its path). Which series they use is checked
//! against raygate's metrics registry in the root crate's `tests/grafana.rs`.

use raygate_e2e::control_plane::repo_root;
use serde_json::{Value, json};
use std::path::PathBuf;
use std::process::Command;

fn promtool() -> PathBuf {
    if let Some(p) = std::env::var_os("RAYGATE_PROMTOOL") {
        return PathBuf::from(p);
    }
    std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default())
        .map(|d| d.join("promtool"))
        .find(|p| p.is_file())
        .expect("promtool not found: run `e2e/setup-tools` (as root) to install it")
}

/// The linter `e2e/setup-tools` builds from its Go module.
fn dashboard_linter() -> PathBuf {
    if let Some(p) = std::env::var_os("RAYGATE_DASHBOARD_LINTER") {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("RAYGATE_CACHE").map_or_else(
        || {
            PathBuf::from(std::env::var_os("HOME").unwrap_or_else(|| "/root".into()))
                .join(".cache/raygate")
        },
        PathBuf::from,
    );
    let p = cache.join("bin/dashboard-linter");
    assert!(
        p.is_file(),
        "{} not found: run `e2e/setup-tools` to build it",
        p.display()
    );
    p
}

/// `dashboard-linter lint --strict FILE`: (success, its output).
fn lint(file: &std::path::Path) -> (bool, String) {
    let out = Command::new(dashboard_linter())
        .args(["lint", "--strict"])
        .arg(file)
        .output()
        .expect("run dashboard-linter");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[test]
fn the_dashboard_passes_grafanas_dashboard_linter_strictly() {
    let path = repo_root().join("config/grafana/raygate.json");
    let (ok, shown) = lint(&path);
    assert!(
        ok,
        "dashboard-linter lint --strict {}:\n{shown}",
        path.display()
    );
    // The linter does fail a dashboard: one query without the instance matcher.
    let mut broken: Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("dashboard")).expect("JSON");
    broken["panels"][1]["targets"][0]["expr"] =
        json!("sum(raygate_upgrade_stalled{job=~\"$job\"})");
    let dir = tempfile::tempdir().expect("tempdir");
    let copy = dir.path().join("broken.json");
    std::fs::write(&copy, broken.to_string()).expect("write");
    let (ok, shown) = lint(&copy);
    assert!(
        !ok,
        "the linter accepted a query without an instance matcher:\n{shown}"
    );
    assert!(shown.contains("instance selector not found"), "{shown}");
}

/// Grafana's variables, as Grafana would substitute them.
fn substituted(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__range", "6h")
        .replace("$__interval", "30s")
        .replace("$namespace", ".*")
        .replace("$job", ".+")
        .replace("$instance", ".+")
}

fn exprs(v: &Value, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(e)) = m.get("expr") {
                out.push(e.clone());
            }
            m.values().for_each(|c| exprs(c, out));
        }
        Value::Array(a) => a.iter().for_each(|c| exprs(c, out)),
        _ => {}
    }
}

#[test]
fn every_dashboard_query_parses_with_promtool() {
    let text = std::fs::read_to_string(repo_root().join("config/grafana/raygate.json"))
        .expect("config/grafana/raygate.json");
    let dashboard: Value = serde_json::from_str(&text).expect("JSON");
    let mut all = vec![];
    exprs(&dashboard["panels"], &mut all);
    assert!(all.len() > 10, "only {} queries", all.len());
    let rules: Vec<Value> = all
        .iter()
        .enumerate()
        .map(|(i, e)| json!({"record": format!("raygate:dashboard_query_{i}"), "expr": substituted(e)}))
        .collect();
    let file = json!({"groups": [{"name": "dashboard", "rules": rules}]});
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("dashboard-rules.yaml");
    // JSON is YAML: promtool reads it as a rule file.
    std::fs::write(&path, serde_json::to_string_pretty(&file).unwrap()).expect("write rules");
    let out = Command::new(promtool())
        .args(["check", "rules"])
        .arg(&path)
        .output()
        .expect("run promtool");
    let shown = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && shown.contains("SUCCESS"),
        "promtool check rules:\n{shown}"
    );
    assert!(
        shown.contains(&format!("{} rules found", all.len())),
        "{shown}"
    );
}
