//! The Grafana dashboard's queries are PromQL the real Prometheus parser
//! accepts: each panel query becomes a recording rule, checked with
//! `promtool check rules` (from `e2e/setup-tools`; `RAYGATE_PROMTOOL`
//! overrides its path). Which series they use is checked against raygate's
//! metrics registry in the root crate's `tests/grafana.rs`.

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

/// Grafana's variables, as Grafana would substitute them.
fn substituted(expr: &str) -> String {
    expr.replace("$__rate_interval", "1m")
        .replace("$__range", "6h")
        .replace("$__interval", "30s")
        .replace("$namespace", ".*")
        .replace("$job", ".*")
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
