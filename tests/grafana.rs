//! The Grafana dashboard (`config/grafana/raygate.json`, shipped in the chart
//! as `charts/raygate/files/grafana/raygate.json`): every query uses only
//! series raygate exports, taken from its metrics registry, and the panels
//! cover what an operator watches. That every query is valid PromQL is
//! checked with the real promtool in `e2e/tests/dashboard.rs`.

use std::collections::BTreeSet;
use std::path::Path;

use raygate::metrics::Metrics;
use serde_json::Value;

/// Series Prometheus itself writes for every scrape target; a dashboard may
/// use them for raygate's health although raygate does not export them.
const SCRAPE_SERIES: [&str; 2] = ["up", "scrape_duration_seconds"];

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn dashboard() -> Value {
    serde_json::from_str(&read("config/grafana/raygate.json")).expect("raygate.json is JSON")
}

/// Every panel, rows' nested panels included.
fn panels(d: &Value) -> Vec<&Value> {
    let mut out = vec![];
    let mut todo: Vec<&Value> = d["panels"].as_array().expect("panels").iter().collect();
    while let Some(p) = todo.pop() {
        if let Some(inner) = p.get("panels").and_then(Value::as_array) {
            todo.extend(inner);
        }
        out.push(p);
    }
    out
}

/// (where, PromQL) of every panel target.
fn queries(d: &Value) -> Vec<(String, String)> {
    let mut out = vec![];
    for p in panels(d) {
        for t in p
            .get("targets")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let expr = t["expr"]
                .as_str()
                .unwrap_or_else(|| panic!("panel {:?} has a target without expr", p["title"]));
            out.push((format!("panel {:?}", p["title"]), expr.to_string()));
        }
    }
    out
}

/// The metric of each `label_values(METRIC, label)` template variable.
fn variable_metrics(d: &Value) -> Vec<(String, String)> {
    let mut out = vec![];
    for v in d["templating"]["list"].as_array().expect("templating.list") {
        if v["type"] != "query" {
            continue;
        }
        let q = v["query"]["query"].as_str().expect("variable query");
        let inner = q
            .strip_prefix("label_values(")
            .and_then(|r| r.strip_suffix(')'))
            .unwrap_or_else(|| panic!("variable {:?}: expected label_values(...)", v["name"]));
        let (metric, _label) = inner.split_once(',').expect("label_values(metric, label)");
        out.push((
            format!("variable {:?}", v["name"]),
            metric.trim().to_string(),
        ));
    }
    out
}

/// Words that are PromQL syntax, not series names.
const KEYWORDS: [&str; 14] = [
    "and",
    "or",
    "unless",
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
    "offset",
    "bool",
    "inf",
    "nan",
    "atan2",
];

/// Series names a PromQL expression selects: identifiers outside strings,
/// label matchers `{..}`, ranges `[..]` and grouping label lists, that are
/// not keywords and not called as functions.
fn selected_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let mut skip_group = false;
    while i < chars.len() {
        let c = chars[i];
        match c {
            '"' | '\'' | '`' => {
                i += 1;
                while i < chars.len() && chars[i] != c {
                    if chars[i] == '\\' {
                        i += 1;
                    }
                    i += 1;
                }
                i += 1;
            }
            '{' | '[' => {
                let close = if c == '{' { '}' } else { ']' };
                while i < chars.len() && chars[i] != close {
                    if chars[i] == '"' {
                        i += 1;
                        while i < chars.len() && chars[i] != '"' {
                            i += 1;
                        }
                    }
                    i += 1;
                }
                i += 1;
            }
            '(' if skip_group => {
                while i < chars.len() && chars[i] != ')' {
                    i += 1;
                }
                skip_group = false;
                i += 1;
            }
            c if c.is_ascii_alphabetic() || c == '_' || c == ':' => {
                let start = i;
                while i < chars.len()
                    && (chars[i].is_ascii_alphanumeric() || chars[i] == '_' || chars[i] == ':')
                {
                    i += 1;
                }
                let word: String = chars[start..i].iter().collect();
                let mut j = i;
                while j < chars.len() && chars[j].is_whitespace() {
                    j += 1;
                }
                let next: String = chars[j..]
                    .iter()
                    .take_while(|c| c.is_ascii_alphabetic())
                    .collect();
                // `sum by (le) (...)`: an aggregation, its grouping first.
                let called = chars.get(j) == Some(&'(')
                    || matches!(next.to_ascii_lowercase().as_str(), "by" | "without");
                let lower = word.to_ascii_lowercase();
                if matches!(
                    lower.as_str(),
                    "by" | "without" | "on" | "ignoring" | "group_left" | "group_right"
                ) {
                    skip_group = true;
                } else if !called && !KEYWORDS.contains(&lower.as_str()) {
                    names.insert(word);
                }
            }
            c if c.is_ascii_digit() || c == '.' => {
                // A number, with an exponent or a duration unit.
                while i < chars.len() && (chars[i].is_ascii_alphanumeric() || chars[i] == '.') {
                    i += 1;
                }
            }
            _ => i += 1,
        }
    }
    names
}

#[test]
fn name_extraction_reads_selectors_only() {
    let got = selected_names(
        r#"histogram_quantile(0.99, sum by (le, job) (rate(raygate_reconcile_duration_seconds_bucket{job=~"a|b", x='y'}[5m]))) > on (job) group_left (version) raygate_build_info or vector(1e3) unless up offset 5m"#,
    );
    let want: BTreeSet<String> = [
        "raygate_reconcile_duration_seconds_bucket",
        "raygate_build_info",
        "up",
    ]
    .map(String::from)
    .into();
    assert_eq!(got, want);
}

#[test]
fn every_query_uses_only_series_raygate_exports() {
    let exported = Metrics::new().expect("metrics").exported_names();
    let allowed: BTreeSet<&str> = exported
        .iter()
        .map(String::as_str)
        .chain(SCRAPE_SERIES)
        .collect();
    let d = dashboard();
    let mut unknown = vec![];
    let mut used = BTreeSet::new();
    let mut all = queries(&d);
    assert!(!all.is_empty(), "no queries in the dashboard");
    all.extend(variable_metrics(&d));
    for (at, expr) in &all {
        let names = selected_names(expr);
        assert!(!names.is_empty(), "{at}: no series in {expr:?}");
        for n in names {
            if !allowed.contains(n.as_str()) {
                unknown.push(format!("{at}: {n} (in {expr:?})"));
            }
            used.insert(n);
        }
    }
    assert!(
        unknown.is_empty(),
        "the dashboard queries series raygate does not export (exported: {exported:?}):\n{}",
        unknown.join("\n")
    );
    // What an operator watches: the queue, waiting time, transitions and their
    // duration, shortfall, stalled plans, raygate's own health.
    for needed in [
        "raygate_upgradeplan_phase",
        "raygate_upgrade_waiting_seconds",
        "raygate_admissions_total",
        "raygate_upgrade_transition_seconds",
        "raygate_capacity_shortfall",
        "raygate_upgrade_stalled",
        "raygate_reconcile_errors_total",
        "raygate_reconcile_duration_seconds_bucket",
        "raygate_admission_latency_seconds_bucket",
        "up",
    ] {
        assert!(used.contains(needed), "no panel shows {needed}");
    }
}

#[test]
fn panels_are_well_formed() {
    let d = dashboard();
    assert_eq!(d["uid"], "raygate-overview");
    assert!(d["schemaVersion"].as_u64().is_some_and(|v| v >= 36));
    let mut ids = BTreeSet::new();
    for p in panels(&d) {
        let title = p["title"].as_str().unwrap_or_default();
        assert!(!title.is_empty(), "a panel without title: {p}");
        assert!(
            ids.insert(p["id"].as_u64().expect("numeric id")),
            "{title}: duplicate id"
        );
        for k in ["h", "w", "x", "y"] {
            assert!(p["gridPos"][k].is_u64(), "{title}: gridPos.{k}");
        }
        assert!(p["gridPos"]["x"].as_u64().unwrap() + p["gridPos"]["w"].as_u64().unwrap() <= 24);
        if p["type"] == "row" {
            continue;
        }
        // Every query goes to the data source the user picks.
        assert_eq!(p["datasource"]["uid"], "${datasource}", "{title}");
        assert!(
            !p["description"].as_str().unwrap_or_default().is_empty(),
            "{title}: description"
        );
        let targets = p["targets"].as_array().expect("targets");
        let refs: BTreeSet<_> = targets.iter().map(|t| t["refId"].as_str()).collect();
        assert_eq!(refs.len(), targets.len(), "{title}: refIds repeat");
    }
}

#[test]
fn chart_and_kustomize_ship_the_same_dashboard() {
    assert!(
        read("charts/raygate/files/grafana/raygate.json") == read("config/grafana/raygate.json"),
        "charts/raygate/files/grafana/raygate.json differs: \
         cp config/grafana/raygate.json charts/raygate/files/grafana/raygate.json"
    );
    assert!(read("config/grafana/kustomization.yaml").contains("- raygate.json"));
    assert!(
        read("charts/raygate/templates/grafana-dashboard.yaml")
            .contains(r#".Files.Get "files/grafana/raygate.json""#)
    );
}
