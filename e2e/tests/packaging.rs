//! Packaging: the Helm chart, the kustomize config, the alert rules, the
//! Dockerfile and the docs that describe them, checked with the real tools and
//! a real kube-apiserver.
//!
//! Tools come from `e2e/setup-tools` (promtool, hadolint, helm 3 and 4) and
//! `e2e/setup` (the control plane's kubectl v1.36, whose built-in kustomize
//! renders config/); each test fails with a message naming the script when
//! its tool is missing. Override a tool's path with
//! `RAYGATE_PROMTOOL`, `RAYGATE_HADOLINT`, `RAYGATE_HELM`, `RAYGATE_HELM4` or
//! `RAYGATE_KUSTOMIZE_KUBECTL`. The apiserver test needs `e2e/setup` (see
//! e2e/README.md), like the harness tests.
//!
//! Run: `e2e/setup-tools && cargo test -p raygate-e2e --test packaging`.

use anyhow::{Context, Result, bail};
use raygate_e2e::ControlPlane;
use raygate_e2e::control_plane::repo_root;
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

const SETUP_TOOLS_HINT: &str = "run `e2e/setup-tools` (as root) to install it";
const RELEASE: &str = "rg";
const RELEASE_NS: &str = "raygate-helm";
const KUSTOMIZE_NS: &str = "raygate-system";
/// The chart installed a second time, with watchNamespaces.
const NAMESPACED_RELEASE: &str = "rgns";
const NAMESPACED_NS: &str = "raygate-ns";
const RUNBOOK_BASE: &str = "https://github.com/raygate/raygate/blob/main/docs/runbooks.md";

// ---------------------------------------------------------------------------
// tools

fn cache_dir() -> PathBuf {
    if let Some(c) = std::env::var_os("RAYGATE_CACHE") {
        return PathBuf::from(c);
    }
    let home = std::env::var_os("HOME").unwrap_or_else(|| "/root".into());
    PathBuf::from(home).join(".cache").join("raygate")
}

fn on_path(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// A tool: `$env` if set, else the first existing cache path, else `PATH` (if allowed).
fn tool(what: &str, env: &str, cached: &[PathBuf], path_name: Option<&str>) -> PathBuf {
    if let Some(p) = std::env::var_os(env) {
        let p = PathBuf::from(p);
        assert!(p.is_file(), "{env}={} is not a file", p.display());
        return p;
    }
    if let Some(p) = cached.iter().find(|p| p.is_file()) {
        return p.clone();
    }
    if let Some(p) = path_name.and_then(on_path) {
        return p;
    }
    let looked: Vec<String> = cached.iter().map(|p| p.display().to_string()).collect();
    panic!(
        "{what} not found (looked at ${env}, {}{}): {SETUP_TOOLS_HINT}",
        looked.join(", "),
        path_name
            .map(|n| format!(", `{n}` on PATH"))
            .unwrap_or_default()
    );
}

fn promtool() -> PathBuf {
    tool("promtool", "RAYGATE_PROMTOOL", &[], Some("promtool"))
}

fn hadolint() -> PathBuf {
    let c = cache_dir();
    tool(
        "hadolint",
        "RAYGATE_HADOLINT",
        &[c.join("venv/bin/hadolint")],
        Some("hadolint"),
    )
}

/// Helm 3 and Helm 4: the chart must work with both.
fn helms() -> Vec<PathBuf> {
    let c = cache_dir();
    vec![
        tool(
            "helm (v3)",
            "RAYGATE_HELM",
            &[c.join("bin/helm")],
            Some("helm"),
        ),
        tool("helm (v4)", "RAYGATE_HELM4", &[c.join("bin/helm4")], None),
    ]
}

/// The control plane's kubectl (v1.36, with kustomize v5 built in), from
/// `e2e/setup`; also for the tests that start no control plane.
fn kustomize_kubectl() -> PathBuf {
    let bin_dir = Command::new(root("e2e/control-plane"))
        .arg("bin-dir")
        .stdin(Stdio::null())
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| PathBuf::from(String::from_utf8_lossy(&o.stdout).trim()).join("kubectl"));
    let cached: Vec<PathBuf> = bin_dir.into_iter().collect();
    if cached.is_empty() && std::env::var_os("RAYGATE_KUSTOMIZE_KUBECTL").is_none() {
        panic!("the control plane's kubectl is not built: run `e2e/setup`");
    }
    tool("kubectl", "RAYGATE_KUSTOMIZE_KUBECTL", &cached, None)
}

fn run<I, S>(bin: &Path, args: I) -> Output
where
    I: IntoIterator<Item = S>,
    S: AsRef<OsStr>,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().into()).collect();
    Command::new(bin)
        .args(&args)
        .current_dir(repo_root())
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("cannot run {}: {e}", bin.display()))
}

fn shown(bin: &Path, args: &[&str]) -> String {
    format!(
        "{} {}",
        bin.file_name().unwrap_or_default().to_string_lossy(),
        args.join(" ")
    )
}

/// Runs and requires exit 0; returns stdout.
fn ok(bin: &Path, args: &[&str]) -> String {
    let out = run(bin, args);
    assert!(
        out.status.success(),
        "`{}` failed ({}):\n{}\n{}",
        shown(bin, args),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

// ---------------------------------------------------------------------------
// files and YAML

fn root(rel: &str) -> PathBuf {
    repo_root().join(rel)
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root(rel)).unwrap_or_else(|e| panic!("read {rel}: {e}"))
}

/// Every non-empty document of a (multi-document) YAML text.
fn docs(text: &str) -> Vec<Value> {
    let all: Vec<Value> =
        serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("not valid YAML: {e}\n{text}"));
    all.into_iter().filter(|d| !d.is_null()).collect()
}

fn yaml(rel: &str) -> Value {
    let mut d = docs(&read(rel));
    assert_eq!(d.len(), 1, "{rel}: expected one YAML document");
    d.remove(0)
}

fn kind(v: &Value) -> &str {
    v["kind"].as_str().unwrap_or("")
}

fn name(v: &Value) -> &str {
    v["metadata"]["name"].as_str().unwrap_or("")
}

fn find<'a>(objs: &'a [Value], k: &str) -> &'a Value {
    let found: Vec<&Value> = objs.iter().filter(|o| kind(o) == k).collect();
    assert_eq!(
        found.len(),
        1,
        "expected exactly one {k}, found {}",
        found.len()
    );
    found[0]
}

/// The one object of kind `k` named `n`.
fn find_named<'a>(objs: &'a [Value], k: &str, n: &str) -> &'a Value {
    let found: Vec<&Value> = objs
        .iter()
        .filter(|o| kind(o) == k && name(o) == n)
        .collect();
    assert_eq!(found.len(), 1, "expected exactly one {k} {n}");
    found[0]
}

fn is_hook(v: &Value) -> bool {
    v["metadata"]["annotations"]["helm.sh/hook"].is_string()
}

fn kinds(objs: &[Value]) -> BTreeSet<String> {
    objs.iter().map(|o| kind(o).to_string()).collect()
}

fn helm_template(helm: &Path, extra: &[&str]) -> Vec<Value> {
    helm_template_as(helm, RELEASE, RELEASE_NS, extra)
}

fn helm_template_as(helm: &Path, release: &str, ns: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["template", release, "charts/raygate", "--namespace", ns];
    args.extend_from_slice(extra);
    // What `helm install` creates: hooks run later (uninstall_hook_* tests them).
    docs(&ok(helm, &args))
        .into_iter()
        .filter(|o| !is_hook(o))
        .collect()
}

fn kustomize(dir: &str) -> Vec<Value> {
    docs(&ok(&kustomize_kubectl(), &["kustomize", dir]))
}

fn container(deploy: &Value) -> &Value {
    &deploy["spec"]["template"]["spec"]["containers"][0]
}

fn strs(v: &Value) -> Vec<&str> {
    v.as_array()
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

// ---------------------------------------------------------------------------
// (a) alert rules

#[test]
fn alert_rules_pass_promtool_check_and_unit_tests() {
    let promtool = promtool();
    let out = ok(
        &promtool,
        &["check", "rules", "config/prometheus/alerts.yaml"],
    );
    assert!(out.contains("SUCCESS"), "promtool check rules: {out}");
    let mut tests: Vec<String> = std::fs::read_dir(root("config/prometheus/tests"))
        .expect("config/prometheus/tests")
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .map(|p| p.strip_prefix(repo_root()).unwrap().display().to_string())
        .collect();
    tests.sort();
    assert!(
        !tests.is_empty(),
        "no promtool unit tests in config/prometheus/tests"
    );
    let mut args = vec!["test", "rules"];
    args.extend(tests.iter().map(String::as_str));
    let out = ok(&promtool, &args);
    assert!(out.contains("SUCCESS"), "promtool test rules: {out}");
}

/// Every alert the unit tests exercise, both firing and not firing.
#[test]
fn every_alert_has_a_firing_and_a_quiet_unit_test() {
    let rules = yaml("config/prometheus/alerts.yaml");
    let tests = yaml("config/prometheus/tests/alerts_test.yaml");
    let cases: Vec<&Value> = tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap().iter())
        .collect();
    for alert in alert_rules(&rules) {
        let name = alert["alert"].as_str().unwrap();
        let of: Vec<&&Value> = cases.iter().filter(|c| c["alertname"] == name).collect();
        let empty = |c: &Value| c["exp_alerts"].as_array().is_none_or(|a| a.is_empty());
        assert!(
            of.iter().any(|c| empty(c)),
            "{name}: no unit test expects it not to fire"
        );
        assert!(
            of.iter().any(|c| !empty(c)),
            "{name}: no unit test expects it to fire"
        );
    }
}

fn alert_rules(rules: &Value) -> Vec<&Value> {
    rules["groups"]
        .as_array()
        .expect("groups")
        .iter()
        .flat_map(|g| g["rules"].as_array().expect("rules").iter())
        .filter(|r| r.get("alert").is_some())
        .collect()
}

// ---------------------------------------------------------------------------
// (e) every alert is complete and its runbook exists

/// GitHub's heading anchors: lower case, punctuation dropped, spaces to dashes.
fn github_anchors(markdown: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in markdown.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced || !line.starts_with('#') {
            continue;
        }
        let text = line.trim_start_matches('#').trim();
        let slug: String = text
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        out.insert(slug);
    }
    out
}

#[test]
fn every_alert_has_severity_annotations_and_a_runbook_section() {
    let rules = yaml("config/prometheus/alerts.yaml");
    let anchors = github_anchors(&read("docs/runbooks.md"));
    let required = [
        "RayServiceUpgradeStalled",
        "RayServiceUpgradeWaitingForCapacity",
        "RayServiceUpgradeWaitingForQuota",
        "RayServiceTwoClustersTooLong",
        "RaygateGateOverridden",
        "RaygateKubeRayReleaseMismatch",
        "RaygateDown",
        "RaygateReconcileErrors",
    ];
    let alerts = alert_rules(&rules);
    let names: BTreeSet<&str> = alerts.iter().filter_map(|a| a["alert"].as_str()).collect();
    for r in required {
        assert!(names.contains(r), "alerts.yaml has no alert {r}");
    }
    for a in alerts {
        let name = a["alert"].as_str().unwrap();
        assert!(
            a["for"].as_str().is_some_and(|f| !f.is_empty()),
            "{name}: no `for:`"
        );
        let sev = a["labels"]["severity"].as_str().unwrap_or("");
        assert!(
            ["critical", "warning", "info"].contains(&sev),
            "{name}: severity label {sev:?} is not critical, warning or info"
        );
        for ann in ["summary", "description", "runbook_url"] {
            assert!(
                a["annotations"][ann]
                    .as_str()
                    .is_some_and(|s| !s.is_empty()),
                "{name}: no {ann} annotation"
            );
        }
        let desc = a["annotations"]["description"].as_str().unwrap();
        assert!(
            desc.contains("$value") || desc.contains("$labels") || desc.contains("query"),
            "{name}: the description shows no numbers or labels"
        );
        let url = a["annotations"]["runbook_url"].as_str().unwrap();
        let anchor = url
            .strip_prefix(&format!("{RUNBOOK_BASE}#"))
            .unwrap_or_else(|| {
                panic!("{name}: runbook_url {url} does not start with {RUNBOOK_BASE}#")
            });
        assert_eq!(
            anchor,
            name.to_lowercase(),
            "{name}: the runbook anchor should be the alert name in lower case"
        );
        assert!(
            anchors.contains(anchor),
            "{name}: docs/runbooks.md has no section with anchor #{anchor} (a heading `## {name}`)"
        );
    }
}

// ---------------------------------------------------------------------------
// (b) Dockerfile

/// The one image definition (built and run by the `image` suite): an empty base and the
/// static binary, nothing run at build time, a numeric non-root user, the chart's entrypoint.
#[test]
fn dockerfile_passes_hadolint_and_holds_only_the_static_binary_as_non_root() {
    let hadolint = hadolint();
    ok(&hadolint, &["--config", ".hadolint.yaml", "Dockerfile"]);

    let df = read("Dockerfile");
    let instr: Vec<&str> = df
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .collect();
    let froms: Vec<&&str> = instr.iter().filter(|l| l.starts_with("FROM ")).collect();
    assert_eq!(
        froms,
        [&"FROM scratch"],
        "one stage on an empty base: nothing to pull"
    );
    assert!(
        !instr.iter().any(|l| l.starts_with("RUN ")),
        "nothing may RUN (no shell in the image, none at build time)"
    );
    assert!(
        instr.contains(&"COPY raygate /raygate"),
        "the image holds the binary scripts/build-image stages"
    );
    assert!(
        df.contains("--target x86_64-unknown-linux-musl"),
        "the Dockerfile should name the static build it packages"
    );
    let user = instr
        .iter()
        .rev()
        .find_map(|l| l.strip_prefix("USER "))
        .expect("no USER");
    let uid = user.split(':').next().unwrap();
    assert!(
        uid.parse::<u32>().is_ok_and(|u| u != 0),
        "USER {user} is not a numeric non-root user"
    );
    assert_eq!(
        instr.iter().rev().find(|l| l.starts_with("ENTRYPOINT")),
        Some(&r#"ENTRYPOINT ["/raygate", "run"]"#)
    );
}

// ---------------------------------------------------------------------------
// (c) Helm chart, rendered

#[test]
fn helm_chart_lints_and_renders_with_helm_3_and_4() {
    for helm in helms() {
        let h = helm.display().to_string();
        ok(&helm, &["lint", "--strict", "charts/raygate"]);
        ok(
            &helm,
            &[
                "lint",
                "--strict",
                "charts/raygate",
                "--set",
                "serviceMonitor.enabled=true,prometheusRule.enabled=true",
            ],
        );

        let objs = helm_template(&helm, &[]);
        let want: BTreeSet<String> = [
            "ServiceAccount",
            "ClusterRole",
            "ClusterRoleBinding",
            "Role",
            "RoleBinding",
            "Service",
            "Deployment",
            "PodDisruptionBudget",
            "NetworkPolicy",
            // Warns at apply of a priority above maxPriority (issue 32).
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        assert_eq!(kinds(&objs), want, "{h}: default render");
        let policies = |objs: &[Value]| -> BTreeSet<String> {
            objs.iter()
                .filter(|o| kind(o) == "ValidatingAdmissionPolicy")
                .map(|o| name(o).to_string())
                .collect()
        };
        let priority = format!("{RELEASE}-raygate-priority-ceiling");
        let outage = format!("{RELEASE}-raygate-rayservice-outage");
        let binding = find_named(&objs, "ValidatingAdmissionPolicyBinding", &priority);
        assert_eq!(binding["spec"]["validationActions"], json!(["Warn"]), "{h}");
        // Issue 38: the Kueue outage policy denies, on by default.
        let binding = find_named(&objs, "ValidatingAdmissionPolicyBinding", &outage);
        assert_eq!(binding["spec"]["validationActions"], json!(["Deny"]), "{h}");
        for (extra, want) in [
            (&["--kube-version", "1.29.0"][..], vec![]),
            (
                &["--set", "priorityPolicy.enabled=false"][..],
                vec![&outage],
            ),
            (&["--set", "maxPriority=null"][..], vec![&outage]),
            (
                &["--set", "kueue.admissionPolicy.enabled=false"][..],
                vec![&priority],
            ),
        ] {
            let objs = helm_template(&helm, extra);
            let want: BTreeSet<String> = want.into_iter().cloned().collect();
            assert_eq!(policies(&objs), want, "{h}: {extra:?}");
        }

        let d = find(&objs, "Deployment");
        assert_eq!(d["spec"]["replicas"], 2, "{h}: default replicas");
        let c = container(d);
        let args = strs(&c["args"]);
        for a in [
            "--leader-elect=true",
            "--metrics-addr=0.0.0.0:8080",
            "--log-format=json",
            &format!("--lease-namespace={RELEASE_NS}"),
            "--lease-name=raygate-leader",
            "--lease-duration-seconds=15",
            // Tenants' priorities are capped by default (issue 26).
            "--max-priority=0",
        ] {
            assert!(args.contains(&a), "{h}: Deployment args {args:?} lack {a}");
        }
        // By default the release is read from the RayClusters, never assumed.
        assert!(
            !args.iter().any(|a| a.starts_with("--kuberay-version")),
            "{h}: Deployment args {args:?} assume a KubeRay release"
        );
        for (var, field) in [
            ("POD_NAME", "metadata.name"),
            ("POD_NAMESPACE", "metadata.namespace"),
        ] {
            let e = c["env"]
                .as_array()
                .unwrap()
                .iter()
                .find(|e| e["name"] == var)
                .unwrap_or_else(|| panic!("{h}: no {var} env"));
            assert_eq!(e["valueFrom"]["fieldRef"]["fieldPath"], field, "{h}: {var}");
        }
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert!(
            c["resources"]["requests"]["memory"].is_string(),
            "{h}: requests"
        );
        assert!(
            c["resources"]["limits"]["memory"].is_string(),
            "{h}: limits"
        );
        let sc = &c["securityContext"];
        assert_eq!(sc["runAsNonRoot"], true);
        assert_eq!(sc["readOnlyRootFilesystem"], true);
        assert_eq!(sc["allowPrivilegeEscalation"], false);
        assert_eq!(sc["capabilities"]["drop"], json!(["ALL"]));
        let psc = &d["spec"]["template"]["spec"]["securityContext"];
        assert_eq!(psc["seccompProfile"]["type"], "RuntimeDefault");
        assert_eq!(psc["runAsNonRoot"], true);

        let role = find_named(&objs, "ClusterRole", "rg-raygate");
        assert_least_privilege(&role["rules"], &h);
        let lease_role = find(&objs, "Role");
        assert_eq!(lease_role["metadata"]["namespace"], RELEASE_NS);
        assert_eq!(
            lease_role["rules"],
            json!([{"apiGroups": ["coordination.k8s.io"], "resources": ["leases"],
                    "verbs": ["get", "create", "update", "patch"]}])
        );

        // Toggles: monitors on, options passed through.
        let objs = helm_template(
            &helm,
            &[
                "--set",
                "serviceMonitor.enabled=true,prometheusRule.enabled=true",
                "--set",
                "watchNamespaces={ml-serving,research},logFormat=text,kuberayVersion=1.6",
                "--set",
                "leaderElection.enabled=false,replicaCount=1",
            ],
        );
        let k = kinds(&objs);
        assert!(
            k.contains("ServiceMonitor") && k.contains("PrometheusRule"),
            "{h}: {k:?}"
        );
        assert!(
            !k.contains("PodDisruptionBudget"),
            "{h}: a PDB for 1 replica"
        );
        assert!(
            !objs
                .iter()
                .any(|o| kind(o) == "Role" && name(o).ends_with("-leader-election")),
            "{h}: a lease Role without leader election"
        );
        let args = strs(&container(find(&objs, "Deployment"))["args"]);
        for a in [
            "--namespace=ml-serving,research",
            "--log-format=text",
            "--kuberay-version=1.6",
            "--leader-elect=false",
        ] {
            assert!(args.contains(&a), "{h}: args {args:?} lack {a}");
        }
        // The scope-change hook needs lookup: `helm template` never renders it.
        let all = docs(&ok(
            &helm,
            &[
                "template",
                RELEASE,
                "charts/raygate",
                "--set",
                "watchNamespaces={ml-serving}",
            ],
        ));
        assert!(
            all.iter()
                .all(|o| o["metadata"]["annotations"]["helm.sh/hook"] != "post-upgrade"),
            "{h}: a post-upgrade hook without lookup"
        );
        let d = find(&objs, "Deployment");
        assert_eq!(
            d["metadata"]["annotations"]["raygate.io/watch-namespaces"], "ml-serving,research",
            "{h}: the Deployment does not record its scope"
        );
        let sm = find(&objs, "ServiceMonitor");
        assert_eq!(sm["spec"]["endpoints"][0]["honorLabels"], true);
        assert_eq!(sm["spec"]["endpoints"][0]["port"], "metrics");

        // The PrometheusRule embeds config/prometheus/alerts.yaml unchanged.
        let pr = find(&objs, "PrometheusRule");
        assert_eq!(
            pr["spec"],
            yaml("config/prometheus/alerts.yaml"),
            "{h}: the PrometheusRule's rules differ from config/prometheus/alerts.yaml"
        );

        // ... except for the runbook base and RaygateDown's job regex, from values.
        let objs = helm_template(
            &helm,
            &[
                "--set",
                "prometheusRule.enabled=true",
                "--set",
                "prometheusRule.runbookBaseUrl=https://wiki.example.com/raygate/runbooks/",
                "--set",
                "prometheusRule.upJobRegex=monitoring/raygate-.*",
            ],
        );
        let spec = &find(&objs, "PrometheusRule")["spec"];
        for a in alert_rules(spec) {
            let url = a["annotations"]["runbook_url"].as_str().unwrap();
            assert!(
                url.starts_with("https://wiki.example.com/raygate/runbooks#"),
                "{h}: runbook_url {url}"
            );
            if a["alert"] == "RaygateDown" {
                assert_eq!(
                    a["expr"],
                    r#"absent(up{job=~"monitoring/raygate-.*"} == 1)"#
                );
                let desc = a["annotations"]["description"].as_str().unwrap();
                assert!(
                    desc.contains("monitoring/raygate-.*") && !desc.contains(".*raygate.*"),
                    "{h}: RaygateDown's description still uses the default job regex: {desc}"
                );
            }
        }

        // Values that cannot work fail the render.
        let out = run(
            &helm,
            [
                "template",
                "x",
                "charts/raygate",
                "--set",
                "replicaCount=2,leaderElection.enabled=false",
            ],
        );
        assert!(
            !out.status.success(),
            "{h}: 2 replicas without leader election rendered"
        );
        assert!(String::from_utf8_lossy(&out.stderr).contains("leaderElection.enabled"));

        // The CRD's CEL rules need 1.29+: older clusters are refused up front.
        let out = run(
            &helm,
            [
                "template",
                "x",
                "charts/raygate",
                "--kube-version",
                "1.28.0",
            ],
        );
        assert!(!out.status.success(), "{h}: rendered for Kubernetes 1.28");
        assert!(String::from_utf8_lossy(&out.stderr).contains("kubeVersion"));
        let objs = helm_template(&helm, &["--kube-version", "1.29.0"]);
        assert_eq!(
            find(&objs, "PodDisruptionBudget")["apiVersion"],
            "policy/v1"
        );
    }
}

/// No Secrets, no wildcards, writes only where raygate writes.
fn assert_least_privilege(rules: &Value, who: &str) {
    for r in rules.as_array().expect("rules") {
        for field in ["apiGroups", "resources", "verbs"] {
            assert!(
                !strs(&r[field]).contains(&"*"),
                "{who}: wildcard in {field}: {r}"
            );
        }
        assert!(
            !strs(&r["resources"])
                .iter()
                .any(|s| s.starts_with("secrets")),
            "{who}: a rule on secrets: {r}"
        );
        assert!(
            r.get("nonResourceURLs").is_none(),
            "{who}: nonResourceURLs: {r}"
        );
        let verbs = strs(&r["verbs"]);
        for v in [
            "delete",
            "deletecollection",
            "escalate",
            "bind",
            "impersonate",
        ] {
            assert!(!verbs.contains(&v), "{who}: verb {v}: {r}");
        }
    }
}

// ---------------------------------------------------------------------------
// (d) copies that must not drift

/// `values.schema.json`: a value raygate would refuse at start (a KubeRay release it
/// cannot gate, a log format it does not know) or a misspelt key fails `helm install`
/// at render, with the value's name, instead of leaving a crash-looping pod.
#[test]
fn values_schema_refuses_what_raygate_would_refuse_at_render() {
    for helm in helms() {
        let h = helm.display().to_string();
        for bad in [
            ("kuberayVersion=1.2", "kuberayVersion"),
            ("kuberayVersion=1.0", "kuberayVersion"),
            ("kuberayVersion=1.8", "kuberayVersion"),
            ("kuberayVersion=1.6.3", "kuberayVersion"),
            ("kuberayVersion=banana", "kuberayVersion"),
            ("logFormat=xml", "logFormat"),
            ("capacityRequests.default=Always", "default"),
            ("replicaCount=0", "replicaCount"),
            ("kuberayversion=1.6", "kuberayversion"),
        ] {
            let args = [
                "template",
                RELEASE,
                "charts/raygate",
                "--namespace",
                RELEASE_NS,
                "--set",
                bad.0,
            ];
            let out = run(&helm, args);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(!out.status.success(), "{h}: --set {} rendered", bad.0);
            assert!(
                stderr.contains("values don't meet the specifications of the schema")
                    && stderr.contains(bad.1),
                "{h}: --set {}: {stderr}",
                bad.0
            );
        }
        for good in [
            "kuberayVersion=1.6",
            "kuberayVersion=v1.7.0",
            "kuberayVersion=1.3",
            "kuberayVersion=1.5.2",
            "logFormat=text",
            "capacityRequests.default=CapacityBuffer",
        ] {
            let objs = helm_template(&helm, &["--set", good]);
            assert!(
                objs.iter().any(|o| kind(o) == "Deployment"),
                "{h}: --set {good}"
            );
        }
    }
}

#[test]
fn chart_and_config_copies_match_their_sources() {
    let crd = read("crds/raygate.io_upgradeplans.yaml");
    for copy in [
        "charts/raygate/crds/raygate.io_upgradeplans.yaml",
        "config/crd/bases/raygate.io_upgradeplans.yaml",
    ] {
        assert!(
            read(copy) == crd,
            "{copy} differs from the generated crds/raygate.io_upgradeplans.yaml: \
             cp crds/raygate.io_upgradeplans.yaml {copy}"
        );
    }
    assert!(
        read("charts/raygate/files/alerts.yaml") == read("config/prometheus/alerts.yaml"),
        "charts/raygate/files/alerts.yaml differs from config/prometheus/alerts.yaml: \
         cp config/prometheus/alerts.yaml charts/raygate/files/alerts.yaml"
    );

    // RBAC: the chart's rules are config/rbac's, and kustomize renders them unchanged.
    let cluster_role = yaml("config/rbac/role.yaml");
    let lease_role = yaml("config/rbac/leader_election_role.yaml");
    assert_least_privilege(&cluster_role["rules"], "config/rbac/role.yaml");
    let kust = kustomize("config/default");
    assert_eq!(
        find_named(&kust, "ClusterRole", "raygate")["rules"],
        cluster_role["rules"]
    );
    let overlay = kustomize("config/overlays/namespaced");
    // raygate's own roles (the metrics-reader ClusterRole is for the scraper).
    for o in overlay.iter().filter(|o| {
        matches!(kind(o), "ClusterRole" | "Role") && !name(o).ends_with("metrics-reader")
    }) {
        assert_least_privilege(
            &o["rules"],
            &format!("config/overlays/namespaced {}", name(o)),
        );
    }
    assert!(
        strs(&container(find(&overlay, "Deployment"))["args"])
            .contains(&"--namespace=ml-serving,research")
    );
    // Capacity requests: the chart's rules are the kustomize component's, in a role of
    // their own (the component adds the flag), and only podtemplates and capacitybuffers.
    let capacity = kustomize("config/overlays/capacity-requests");
    let capacity_role = find_named(&capacity, "ClusterRole", "raygate-capacity-requests");
    let granted: BTreeSet<&str> = capacity_role["rules"]
        .as_array()
        .expect("rules")
        .iter()
        .flat_map(|r| strs(&r["resources"]))
        .collect();
    assert_eq!(granted, BTreeSet::from(["podtemplates", "capacitybuffers"]));
    assert!(
        strs(&container(find(&capacity, "Deployment"))["args"])
            .contains(&"--capacity-requests=true")
    );
    for helm in helms() {
        let objs = helm_template(&helm, &["--set", "capacityRequests.enabled=true"]);
        assert_eq!(
            find_named(&objs, "ClusterRole", "rg-raygate-capacity-requests")["rules"],
            capacity_role["rules"],
            "the chart's capacity-requests rules differ from config/components/capacity-requests"
        );
        assert!(
            strs(&container(find(&objs, "Deployment"))["args"])
                .contains(&"--capacity-requests=true")
        );
        let objs = helm_template(
            &helm,
            &[
                "--set",
                "capacityRequests.enabled=true,watchNamespaces={ml-serving}",
            ],
        );
        assert!(
            objs.iter().any(|o| kind(o) == "Role"
                && name(o) == "rg-raygate-capacity-requests"
                && o["metadata"]["namespace"] == "ml-serving"
                && o["rules"] == capacity_role["rules"]),
            "with watchNamespaces, a Role per namespace"
        );
        assert!(
            !objs
                .iter()
                .any(|o| kind(o) == "ClusterRole" && name(o) == "rg-raygate-capacity-requests"),
            "no cluster-wide grant with watchNamespaces"
        );
    }
    for helm in helms() {
        let objs = helm_template(&helm, &[]);
        assert!(
            !objs.iter().any(|o| name(o).ends_with("capacity-requests")),
            "capacity requests are off by default"
        );
        assert_eq!(
            find_named(&objs, "ClusterRole", "rg-raygate")["rules"],
            cluster_role["rules"],
            "the chart's ClusterRole rules differ from config/rbac/role.yaml"
        );
        assert_eq!(
            find(&objs, "Role")["rules"],
            lease_role["rules"],
            "the chart's lease Role rules differ from config/rbac/leader_election_role.yaml"
        );
        // The same pod either way.
        let (hd, kd) = (find(&objs, "Deployment"), find(&kust, "Deployment"));
        let (hc, kc) = (container(hd), container(kd));
        for f in [
            "securityContext",
            "livenessProbe",
            "readinessProbe",
            "resources",
            "env",
            "ports",
        ] {
            assert_eq!(
                hc[f], kc[f],
                "chart and config/manager differ in container {f}"
            );
        }
        assert_eq!(
            hd["spec"]["template"]["spec"]["securityContext"],
            kd["spec"]["template"]["spec"]["securityContext"]
        );
        assert_eq!(hd["spec"]["replicas"], kd["spec"]["replicas"]);

        // Namespaced: the chart with watchNamespaces and config/overlays/namespaced
        // grant the same, and watch the same namespaces.
        let objs = helm_template(&helm, &["--set", "watchNamespaces={ml-serving,research}"]);
        assert_eq!(
            find_named(&objs, "ClusterRole", "rg-raygate")["rules"],
            find_named(&overlay, "ClusterRole", "raygate")["rules"],
            "the chart's namespaced ClusterRole differs from config/overlays/namespaced"
        );
        for ns in ["ml-serving", "research"] {
            let role = |objs: &[Value], n: &str| {
                objs.iter()
                    .find(|o| kind(o) == "Role" && name(o) == n && o["metadata"]["namespace"] == ns)
                    .unwrap_or_else(|| panic!("no Role {n} in {ns}"))["rules"]
                    .clone()
            };
            assert_eq!(
                role(&objs, "rg-raygate"),
                role(&overlay, "raygate"),
                "the chart's Role in {ns} differs from config/overlays/namespaced"
            );
        }
        assert!(
            strs(&container(find(&objs, "Deployment"))["args"])
                .contains(&"--namespace=ml-serving,research")
        );
    }
}

#[test]
fn kustomize_config_renders() {
    let objs = kustomize("config/default");
    let want: BTreeSet<String> = [
        "Namespace",
        "CustomResourceDefinition",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "NetworkPolicy",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    assert_eq!(kinds(&objs), want);
    // The chart's NetworkPolicy (networkPolicy.enabled by default): the same ports, on
    // the pods the Deployment makes.
    let np = find(&objs, "NetworkPolicy");
    let chart = helm_template(&helms().remove(0), &[]);
    let chart_np = find(&chart, "NetworkPolicy");
    for field in ["policyTypes", "ingress"] {
        assert_eq!(np["spec"][field], chart_np["spec"][field], "spec.{field}");
    }
    let pod_labels = &find(&objs, "Deployment")["spec"]["template"]["metadata"]["labels"];
    let selector = np["spec"]["podSelector"]["matchLabels"]
        .as_object()
        .expect("podSelector.matchLabels");
    assert!(!selector.is_empty());
    for (k, v) in selector {
        assert_eq!(
            &pod_labels[k], v,
            "the NetworkPolicy selects the raygate pods ({k})"
        );
    }
    for o in &objs {
        let namespaced = !matches!(
            kind(o),
            "Namespace" | "CustomResourceDefinition" | "ClusterRole" | "ClusterRoleBinding"
        );
        if namespaced {
            assert_eq!(
                o["metadata"]["namespace"],
                KUSTOMIZE_NS,
                "{} {}",
                kind(o),
                name(o)
            );
        }
    }
    let d = find(&objs, "Deployment");
    assert_eq!(container(d)["image"], "ghcr.io/raygate/raygate:0.1.0");
    assert!(strs(&container(d)["args"]).contains(&"--leader-elect=true"));

    let mon = kustomize("config/prometheus");
    assert_eq!(kinds(&mon), BTreeSet::from(["ServiceMonitor".to_string()]));
    assert_eq!(
        find(&mon, "ServiceMonitor")["spec"]["endpoints"][0]["honorLabels"],
        true
    );

    let samples = kustomize("config/samples");
    let plans: Vec<&Value> = samples
        .iter()
        .filter(|o| kind(o) == "UpgradePlan")
        .collect();
    assert!(
        plans.len() >= 4,
        "config/samples: {} UpgradePlans",
        plans.len()
    );
    let policies: BTreeSet<&str> = plans
        .iter()
        .filter_map(|p| p["spec"]["policy"].as_str())
        .collect();
    assert!(policies.contains("Auto") && policies.contains("Manual"));
    assert!(
        plans
            .iter()
            .any(|p| p["spec"]["maintenanceWindows"].is_array())
    );
    assert!(plans.iter().any(|p| p["spec"]["headroom"].is_object()));
    let svc = find(&samples, "RayService");
    assert!(
        svc["spec"].get("upgradeStrategy").is_none(),
        "the sample RayService must leave spec.upgradeStrategy to raygate"
    );
    assert!(svc["spec"]["serveConfigV2"].is_string());
}

// ---------------------------------------------------------------------------
// (c) on a real kube-apiserver: install, then check the RBAC as the ServiceAccounts

/// Stand-ins for the Prometheus Operator CRDs (same group, kinds and plurals; no schema),
/// so the monitors apply like they would next to a real operator.
const MONITORING_CRDS: &str = r#"
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: servicemonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: ServiceMonitor, listKind: ServiceMonitorList, plural: servicemonitors, singular: servicemonitor}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
---
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: prometheusrules.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: PrometheusRule, listKind: PrometheusRuleList, plural: prometheusrules, singular: prometheusrule}
  versions:
    - name: v1
      served: true
      storage: true
      schema:
        openAPIV3Schema: {type: object, x-kubernetes-preserve-unknown-fields: true}
"#;

/// `kubectl auth can-i` as a ServiceAccount: true for "yes".
/// `who` may do each of `allowed` and none of `denied` (`kubectl auth can-i` arguments); all
/// the wrong answers in one error. Each check is about a second of round trips: asked in parallel.
fn check_access(
    cp: &ControlPlane,
    who: &str,
    allowed: &[&[&str]],
    denied: &[&[&str]],
) -> Result<()> {
    let checks: Vec<(&[&str], bool)> = allowed
        .iter()
        .map(|a| (*a, true))
        .chain(denied.iter().map(|a| (*a, false)))
        .collect();
    let answers: Vec<Result<bool>> = std::thread::scope(|s| {
        let handles: Vec<_> = checks
            .chunks(checks.len().div_ceil(8))
            .map(|chunk| {
                s.spawn(move || {
                    chunk
                        .iter()
                        .map(|(a, _)| can_i(cp, who, a))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().expect("can-i thread"))
            .collect()
    });
    let mut wrong = vec![];
    for ((a, want), got) in checks.iter().zip(answers) {
        match (want, got?) {
            (true, false) => wrong.push(format!("cannot {} (should)", a.join(" "))),
            (false, true) => wrong.push(format!("can {} (should not)", a.join(" "))),
            _ => {}
        }
    }
    if !wrong.is_empty() {
        bail!("RBAC of {who}:\n  {}", wrong.join("\n  "));
    }
    Ok(())
}

fn can_i(cp: &ControlPlane, sa: &str, args: &[&str]) -> Result<bool> {
    let who = format!("--as={sa}");
    let mut a = vec!["auth", "can-i"];
    a.extend_from_slice(args);
    a.push(&who);
    let out = cp.kubectl(&a)?;
    let said = String::from_utf8_lossy(&out.stdout).trim().to_string();
    match said.as_str() {
        "yes" => Ok(true),
        s if s.starts_with("no") => Ok(false),
        _ => bail!(
            "kubectl {} said {said:?}: {}",
            a.join(" "),
            String::from_utf8_lossy(&out.stderr)
        ),
    }
}

fn write_manifest(dir: &Path, file: &str, objs: &[Value]) -> Result<PathBuf> {
    let mut text = String::new();
    for o in objs {
        text.push_str("---\n");
        text.push_str(&serde_json::to_string(o)?);
        text.push('\n');
    }
    let p = dir.join(file);
    std::fs::write(&p, text)?;
    Ok(p)
}

fn check_rbac(cp: &ControlPlane, ns: &str, sa: &str) -> Result<()> {
    let who = format!("system:serviceaccount:{ns}:{sa}");
    let allowed: &[&[&str]] = &[
        &["list", "rayservices.ray.io", "--all-namespaces"],
        &["watch", "rayservices.ray.io", "--all-namespaces"],
        &["get", "rayservices.ray.io", "-n", "ml-serving"],
        &["patch", "rayservices.ray.io", "-n", "ml-serving"],
        &["list", "rayclusters.ray.io", "--all-namespaces"],
        &["watch", "rayclusters.ray.io", "--all-namespaces"],
        &["list", "pods", "--all-namespaces"],
        &["watch", "pods", "--all-namespaces"],
        &["list", "nodes"],
        &["watch", "nodes"],
        &["list", "limitranges", "--all-namespaces"],
        &["list", "runtimeclasses.node.k8s.io"],
        &["watch", "runtimeclasses.node.k8s.io"],
        &["list", "resourceslices.resource.k8s.io"],
        &["watch", "resourceslices.resource.k8s.io"],
        &["watch", "deviceclasses.resource.k8s.io"],
        &[
            "watch",
            "resourceclaims.resource.k8s.io",
            "--all-namespaces",
        ],
        &[
            "watch",
            "resourceclaimtemplates.resource.k8s.io",
            "--all-namespaces",
        ],
        &["watch", "upgradeplans.raygate.io", "--all-namespaces"],
        &["patch", "upgradeplans.raygate.io", "-n", "ml-serving"],
        &[
            "patch",
            "upgradeplans.raygate.io",
            "--subresource=status",
            "-n",
            "ml-serving",
        ],
        &["create", "tokenreviews.authentication.k8s.io"],
        &["create", "subjectaccessreviews.authorization.k8s.io"],
        &["create", "events.events.k8s.io", "-n", "ml-serving"],
        &["patch", "events.events.k8s.io", "-n", "ml-serving"],
        &["create", "leases.coordination.k8s.io", "-n", ns],
        &["get", "leases.coordination.k8s.io", "-n", ns],
        &["update", "leases.coordination.k8s.io", "-n", ns],
        &["patch", "leases.coordination.k8s.io", "-n", ns],
    ];
    let denied: &[&[&str]] = &[
        &["get", "secrets", "-n", ns],
        &["list", "secrets", "--all-namespaces"],
        &["get", "secrets", "-n", "ml-serving"],
        &["delete", "rayservices.ray.io", "-n", "ml-serving"],
        &["create", "rayservices.ray.io", "-n", "ml-serving"],
        &["update", "rayservices.ray.io", "-n", "ml-serving"],
        &["patch", "rayclusters.ray.io", "-n", "ml-serving"],
        &["delete", "rayclusters.ray.io", "-n", "ml-serving"],
        &["create", "pods", "-n", "ml-serving"],
        &["delete", "pods", "-n", "ml-serving"],
        &["patch", "nodes"],
        &["create", "runtimeclasses.node.k8s.io"],
        &["delete", "upgradeplans.raygate.io", "-n", "ml-serving"],
        &["update", "upgradeplans.raygate.io", "-n", "ml-serving"],
        &[
            "update",
            "upgradeplans.raygate.io",
            "--subresource=status",
            "-n",
            "ml-serving",
        ],
        &["create", "upgradeplans.raygate.io", "-n", "ml-serving"],
        &["create", "leases.coordination.k8s.io", "-n", "default"],
        &["patch", "leases.coordination.k8s.io", "-n", "kube-system"],
        &["delete", "leases.coordination.k8s.io", "-n", ns],
        &["create", "events", "-n", "ml-serving"],
        &["*", "*", "--all-namespaces"],
    ];
    check_access(cp, &who, allowed, denied)
}

fn install_and_check(cp: &ControlPlane, scratch: &Path) -> Result<()> {
    for ns in [RELEASE_NS, KUSTOMIZE_NS, "ml-serving", "research"] {
        cp.kubectl_ok(&["create", "namespace", ns])?;
    }
    let crds = scratch.join("monitoring-crds.yaml");
    std::fs::write(&crds, MONITORING_CRDS)?;
    cp.install_crd_file(&crds)?;
    // The CRD as a user applies it: no `Warning:` (issue 32: `unrecognized format "uint32"`
    // on every apply), then Established.
    apply_without_warnings(
        cp,
        &root("charts/raygate/crds/raygate.io_upgradeplans.yaml"),
        &[],
    )
    .context("apply the UpgradePlan CRD")?;
    cp.install_crd_file(&root("charts/raygate/crds/raygate.io_upgradeplans.yaml"))?;

    // The samples are valid objects for the CRDs (the RayService against KubeRay's), and
    // apply without a warning before the chart's priority policy is installed.
    let samples = write_manifest(scratch, "samples.yaml", &kustomize("config/samples"))?;
    apply_without_warnings(cp, &samples, &["--dry-run=server"])
        .context("the samples do not validate")?;
    refuses_bad_plans_at_apply(cp, scratch).context("the CRD's CEL rules")?;

    // The chart, as `helm install` would send it to this v1.36 cluster, monitors on.
    let helm = &helms()[0];
    let objs = helm_template(
        helm,
        &[
            "--kube-version",
            "1.36.3",
            "--set",
            "serviceMonitor.enabled=true,prometheusRule.enabled=true",
        ],
    );
    let chart = write_manifest(scratch, "chart.yaml", &objs)?;
    cp.kubectl_ok(&["apply", "-f", &chart.to_string_lossy()])
        .context("apply the rendered chart")?;
    cp.kubectl_ok(&[
        "-n",
        RELEASE_NS,
        "get",
        "deployment/rg-raygate",
        "servicemonitor/rg-raygate",
        "prometheusrule/rg-raygate",
    ])?;

    // config/default (kustomize v5) and its ServiceMonitor.
    let mut objs = kustomize("config/default");
    objs.extend(kustomize("config/prometheus"));
    let kust = write_manifest(scratch, "kustomize.yaml", &objs)?;
    cp.kubectl_ok(&["apply", "-f", &kust.to_string_lossy()])
        .context("apply kubectl kustomize config/default")?;

    // The chart's policy (maxPriority ["0"]) warns at apply of a priority above 0, and
    // only then: the samples' priority 100 in ml-serving ranks as 0 (issue 32).
    priority_policy_warns(cp, &samples).context("the chart's priority policy")?;

    check_rbac(cp, RELEASE_NS, "rg-raygate").context("the chart's RBAC")?;
    check_rbac(cp, KUSTOMIZE_NS, "raygate").context("config/rbac")?;
    run_operator_as_chart_service_account(cp, scratch, RELEASE_NS, "rg-raygate")
        .context("raygate running with the chart's ServiceAccount")?;

    // Namespaced: the chart with watchNamespaces (another release) and
    // config/overlays/namespaced (over config/default): reads and writes of plans only
    // in the watched namespaces, and raygate runs on exactly that.
    cp.kubectl_ok(&["create", "namespace", NAMESPACED_NS])?;
    let objs = helm_template_as(
        helm,
        NAMESPACED_RELEASE,
        NAMESPACED_NS,
        &[
            "--kube-version",
            "1.36.3",
            "--set",
            "watchNamespaces={ml-serving,research}",
        ],
    );
    let chart = write_manifest(scratch, "chart-namespaced.yaml", &objs)?;
    cp.kubectl_ok(&["apply", "-f", &chart.to_string_lossy()])
        .context("apply the chart with watchNamespaces")?;
    let overlay = write_manifest(
        scratch,
        "overlay-namespaced.yaml",
        &kustomize("config/overlays/namespaced"),
    )?;
    cp.kubectl_ok(&["apply", "-f", &overlay.to_string_lossy()])
        .context("apply kubectl kustomize config/overlays/namespaced")?;
    let sa = format!("{NAMESPACED_RELEASE}-raygate");
    check_namespaced_rbac(cp, NAMESPACED_NS, &sa)
        .context("the chart's RBAC with watchNamespaces")?;
    check_namespaced_rbac(cp, KUSTOMIZE_NS, "raygate").context("config/overlays/namespaced")?;
    run_operator_as_chart_service_account(cp, scratch, NAMESPACED_NS, &sa)
        .context("raygate watching ml-serving and research with the chart's namespaced RBAC")?;
    Ok(())
}

/// Issue 32, item 9: the apiserver refuses a bad cron schedule or window duration at
/// `kubectl apply` with the CRD rule's message, instead of accepting the plan for
/// raygate to report later.
fn refuses_bad_plans_at_apply(cp: &ControlPlane, scratch: &Path) -> Result<()> {
    let plan = |schedule: &str, duration: &str| {
        json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
               "metadata": {"name": "cel", "namespace": "default"},
               "spec": {"rayServiceRef": {"name": "chat"},
                        "maintenanceWindows": [{"schedule": schedule, "duration": duration}]}})
    };
    for (schedule, duration, want) in [
        ("0 25 * * *", "3h", "minute 0-59, hour 0-23"),
        ("0 2 * * 8", "3h", "day of week 0-7"),
        ("0 2 * *", "3h", "schedule must be 5 cron fields"),
        ("0 2 * * 1-5", "0s", "duration must be between 1m and 744h"),
        (
            "0 2 * * 1-5",
            "745h",
            "duration must be between 1m and 744h",
        ),
    ] {
        let file = write_manifest(scratch, "bad-plan.yaml", &[plan(schedule, duration)])?;
        let out = cp.kubectl(&["apply", "--dry-run=server", "-f", &file.to_string_lossy()])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(
            !out.status.success() && stderr.contains(want),
            "{schedule:?} / {duration:?}: want a refusal naming {want:?}, got: {stderr}"
        );
    }
    let good = write_manifest(
        scratch,
        "good-plan.yaml",
        &[plan("*/15 0-6 * * 1-5", "90m")],
    )?;
    apply_without_warnings(cp, &good, &["--dry-run=server"])
}

/// The chart's ValidatingAdmissionPolicy on the real apiserver: a warning naming the
/// ceiling for a priority above it, none at or below it; nothing refused.
fn priority_policy_warns(cp: &ControlPlane, samples: &Path) -> Result<()> {
    // The policy is read by the apiserver shortly after it is created.
    wait_until("the priority policy warns", || {
        let out = cp.kubectl(&[
            "apply",
            "--dry-run=server",
            "-f",
            &samples.to_string_lossy(),
        ])?;
        let stderr = String::from_utf8_lossy(&out.stderr);
        anyhow::ensure!(out.status.success(), "refused: {stderr}");
        Ok(stderr.contains("spec.priority 100 is above the ceiling of namespace ml-serving"))
    })?;
    let at = write_manifest(
        samples.parent().unwrap_or(Path::new("/tmp")),
        "priority-zero.yaml",
        &[
            json!({"apiVersion": "raygate.io/v1alpha1", "kind": "UpgradePlan",
                 "metadata": {"name": "zero", "namespace": "research"},
                 "spec": {"rayServiceRef": {"name": "chat"}, "priority": 0}}),
        ],
    )?;
    apply_without_warnings(cp, &at, &["--dry-run=server"])
}

/// `kubectl apply -f path` that succeeds and prints no `Warning:` on stderr (the
/// apiserver's warnings: unknown formats in a CRD, unknown fields of an object).
fn apply_without_warnings(cp: &ControlPlane, path: &Path, extra: &[&str]) -> Result<()> {
    let p = path.to_string_lossy();
    let mut args = vec!["apply"];
    args.extend_from_slice(extra);
    args.extend(["-f", &*p]);
    let out = cp.kubectl(&args)?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    anyhow::ensure!(
        out.status.success(),
        "kubectl {} failed: {stderr}",
        args.join(" ")
    );
    anyhow::ensure!(
        !stderr.contains("Warning"),
        "kubectl {} printed warnings:\n{stderr}",
        args.join(" ")
    );
    Ok(())
}

/// What a namespaced install (watchNamespaces ml-serving and research) may and may not
/// do: plans, RayServices, RayClusters and LimitRanges only there; Pods and Nodes
/// cluster-wide for capacity.
fn check_namespaced_rbac(cp: &ControlPlane, ns: &str, sa: &str) -> Result<()> {
    let mut allowed: Vec<Vec<&str>> = vec![
        vec!["list", "pods", "--all-namespaces"],
        vec!["watch", "pods", "--all-namespaces"],
        vec!["list", "nodes"],
        vec!["watch", "nodes"],
        vec!["watch", "runtimeclasses.node.k8s.io"],
        vec!["watch", "resourceslices.resource.k8s.io"],
        vec![
            "watch",
            "resourceclaims.resource.k8s.io",
            "--all-namespaces",
        ],
        vec!["create", "tokenreviews.authentication.k8s.io"],
        vec!["create", "subjectaccessreviews.authorization.k8s.io"],
        vec!["patch", "leases.coordination.k8s.io", "-n", ns],
    ];
    for w in ["ml-serving", "research"] {
        for a in [
            &["watch", "upgradeplans.raygate.io"][..],
            &["patch", "upgradeplans.raygate.io"],
            &["patch", "upgradeplans.raygate.io", "--subresource=status"],
            &["watch", "rayservices.ray.io"],
            &["get", "rayservices.ray.io"],
            &["patch", "rayservices.ray.io"],
            &["watch", "rayclusters.ray.io"],
            &["watch", "limitranges"],
            &["create", "events.events.k8s.io"],
        ] {
            allowed.push([a, &["-n", w]].concat());
        }
    }
    let denied: Vec<Vec<&str>> = vec![
        vec!["list", "upgradeplans.raygate.io", "--all-namespaces"],
        vec!["list", "rayservices.ray.io", "--all-namespaces"],
        vec!["list", "rayclusters.ray.io", "--all-namespaces"],
        vec!["list", "limitranges", "--all-namespaces"],
        vec!["watch", "upgradeplans.raygate.io", "-n", "default"],
        vec!["get", "rayservices.ray.io", "-n", "default"],
        vec!["patch", "rayservices.ray.io", "-n", "default"],
        vec!["patch", "upgradeplans.raygate.io", "-n", "default"],
        vec!["create", "events.events.k8s.io", "-n", "default"],
        vec!["patch", "rayclusters.ray.io", "-n", "ml-serving"],
        vec!["update", "rayservices.ray.io", "-n", "ml-serving"],
        vec!["get", "secrets", "-n", "ml-serving"],
        vec!["create", "pods", "-n", "ml-serving"],
    ];
    let who = format!("system:serviceaccount:{ns}:{sa}");
    let allowed: Vec<&[&str]> = allowed.iter().map(Vec::as_slice).collect();
    let denied: Vec<&[&str]> = denied.iter().map(Vec::as_slice).collect();
    check_access(cp, &who, &allowed, &denied)
}

/// Kills the raygate process this test started.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http_get(port: u16, path: &str) -> Option<String> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(2)))
        .ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: localhost\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some(out)
}

fn wait_until(what: &str, mut f: impl FnMut() -> Result<bool>) -> Result<()> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    let mut last = String::new();
    while std::time::Instant::now() < deadline {
        match f() {
            Ok(true) => return Ok(()),
            Ok(false) => {}
            Err(e) => last = format!("{e:#}"),
        }
        std::thread::sleep(std::time::Duration::from_millis(500));
    }
    bail!("timed out waiting for {what} {last}")
}

fn get_json(cp: &ControlPlane, args: &[&str]) -> Result<Value> {
    let mut a = vec!["get"];
    a.extend_from_slice(args);
    a.extend(["-o", "json"]);
    Ok(serde_json::from_str(&cp.kubectl_ok(&a)?)?)
}

/// The real operator, authenticated as the chart's ServiceAccount `ns/sa` (its token),
/// with the Deployment's `--namespace` when it has one, does everything it needs:
/// caches sync, Lease, finalizer, status, gate, Events, release.
fn run_operator_as_chart_service_account(
    cp: &ControlPlane,
    scratch: &Path,
    ns: &str,
    sa: &str,
) -> Result<()> {
    // The watched namespaces as the installed Deployment passes them.
    let deploy = get_json(cp, &["-n", ns, "deployment", sa])?;
    let scope: Vec<String> = strs(&container(&deploy)["args"])
        .into_iter()
        .filter(|a| a.starts_with("--namespace="))
        .map(str::to_owned)
        .collect();
    // A bound token from the TokenRequest API, as a projected token volume gets.
    let token = cp.kubectl_ok(&["-n", ns, "create", "token", sa, "--duration=1h"])?;
    let mut kc: Value = docs(&std::fs::read_to_string(cp.kubeconfig_path())?).remove(0);
    for u in kc["users"].as_array_mut().context("kubeconfig users")? {
        u["user"] = json!({ "token": token.trim() });
    }
    let kubeconfig = scratch.join(format!("{ns}-sa.kubeconfig"));
    std::fs::write(&kubeconfig, serde_json::to_string(&kc)?)?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let health_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let log_path = cp.log_dir().join(format!("raygate-packaging-{ns}.log"));
    let log = std::fs::File::create(&log_path)?;
    let _raygate = Child(
        Command::new(raygate_bin())
            .args(["run", "--kubeconfig"])
            .arg(&kubeconfig)
            .args([
                &format!("--metrics-addr=127.0.0.1:{port}"),
                "--metrics-secure=false",
                &format!("--health-addr=127.0.0.1:{health_port}"),
                "--log-format=json",
                "--leader-elect=true",
                &format!("--lease-namespace={ns}"),
                "--lease-name=raygate-leader",
                // Long enough that no renewal falls inside this short test: the
                // watchdog gives up after a single Lease read slower than ~0.5 s near
                // expiry, which a loaded machine hits. Acquisition (get/create) is
                // exercised here; the renewal verbs are covered by `check_rbac`.
                "--lease-duration-seconds=120",
            ])
            .args(&scope)
            .env("POD_NAME", format!("{sa}-test-0"))
            .env("POD_NAMESPACE", ns)
            .env("RUST_LOG", "info")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .context("start raygate")?,
    );
    let logs = || std::fs::read_to_string(&log_path).unwrap_or_default();

    for f in [
        "config/samples/ray_v1_rayservice_llm_gpu.yaml",
        "config/samples/raygate_v1alpha1_upgradeplan_auto.yaml",
    ] {
        cp.kubectl_ok(&["apply", "-f", &root(f).to_string_lossy()])?;
    }
    let r = (|| -> Result<()> {
        wait_until("/readyz", || {
            Ok(http_get(health_port, "/readyz")
                .is_some_and(|r| r.lines().next().is_some_and(|l| l.contains(" 200 "))))
        })?;
        wait_until("the leader Lease", || {
            let l = get_json(cp, &["-n", ns, "lease", "raygate-leader"])?;
            Ok(l["spec"]["holderIdentity"] == format!("{sa}-test-0"))
        })?;
        wait_until("the plan's finalizer and status", || {
            let p = get_json(cp, &["-n", "ml-serving", "upgradeplan", "llm"])?;
            Ok(
                strs(&p["metadata"]["finalizers"]).contains(&"raygate.io/release-gate")
                    && p["status"]["phase"].is_string()
                    && p["status"]["conditions"].is_array(),
            )
        })?;
        wait_until(
            "the gate (spec.upgradeStrategy.type by field manager raygate)",
            || {
                // kubectl >= 1.21 hides managedFields unless asked.
                let svc = cp.kubectl_ok(&[
                    "-n",
                    "ml-serving",
                    "get",
                    "rayservice",
                    "llm",
                    "-o",
                    "json",
                    "--show-managed-fields",
                ])?;
                let v: Value = serde_json::from_str(&svc)?;
                let managers: Vec<&str> = v["metadata"]["managedFields"]
                    .as_array()
                    .map(|m| m.iter().filter_map(|e| e["manager"].as_str()).collect())
                    .unwrap_or_default();
                if v["spec"]["upgradeStrategy"]["type"] == "None" && managers.contains(&"raygate") {
                    return Ok(true);
                }
                bail!(
                    "spec.upgradeStrategy {}, field managers {managers:?}",
                    v["spec"]["upgradeStrategy"]
                )
            },
        )?;
        let metrics = http_get(port, "/metrics").unwrap_or_default();
        if !metrics.contains("raygate_upgradeplan_phase{") {
            bail!("/metrics has no raygate_upgradeplan_phase:\n{metrics}");
        }
        // Deleting the plan releases the gate, then the finalizer.
        cp.kubectl_ok(&[
            "-n",
            "ml-serving",
            "delete",
            "upgradeplan",
            "llm",
            "--wait=false",
        ])?;
        wait_until("the plan to be released and deleted", || {
            let out = cp.kubectl(&["-n", "ml-serving", "get", "upgradeplan", "llm"])?;
            Ok(!out.status.success())
        })?;
        let svc = get_json(cp, &["-n", "ml-serving", "rayservice", "llm"])?;
        if svc["spec"]
            .get("upgradeStrategy")
            .is_some_and(|u| u.get("type").is_some())
        {
            bail!(
                "the gate was not released: {}",
                svc["spec"]["upgradeStrategy"]
            );
        }
        wait_until("the GateReleased Event from raygate", || {
            let ev = get_json(cp, &["-n", "ml-serving", "events.v1.events.k8s.io"])?;
            Ok(ev["items"].as_array().is_some_and(|items| {
                items.iter().any(|e| {
                    e["reportingController"] == "raygate"
                        && e["reason"] == "GateReleased"
                        && e["regarding"]["name"] == "llm"
                })
            }))
        })?;
        Ok(())
    })();
    let text = logs();
    if let Err(e) = r {
        bail!("{e:#}\nraygate log ({}):\n{text}", log_path.display());
    }
    // "403" alone would match port numbers and timestamps: look for the status forms.
    for bad in [
        "forbidden",
        "Forbidden",
        "code: 403",
        "\"code\":403",
        " 403 ",
    ] {
        if text.contains(bad) {
            bail!("raygate logged {bad:?} with the chart's RBAC:\n{text}");
        }
    }
    Ok(())
}

#[test]
fn chart_and_config_install_on_a_real_apiserver_with_least_privilege_rbac() {
    // Tools first, so a missing one is reported before a control plane starts.
    let _ = (helms(), kustomize_kubectl());
    let cp = ControlPlane::start()
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    let scratch = tempfile::tempdir().expect("scratch dir");
    if let Err(e) = install_and_check(&cp, scratch.path()) {
        panic!("{e:#}");
    }
}

// ---------------------------------------------------------------------------
// docs stay in sync with the CRD

/// Every property path under spec and status (`spec.maintenanceWindows[].schedule`);
/// maps (`additionalProperties`) and the standard Condition fields are not descended.
fn schema_paths(schema: &Value, prefix: &str, out: &mut Vec<String>) {
    let Some(props) = schema["properties"].as_object() else {
        if let Some(items) = schema.get("items") {
            schema_paths(items, &format!("{prefix}[]"), out);
        }
        return;
    };
    for (k, v) in props {
        let path = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        out.push(path.clone());
        if path == "status.conditions" {
            continue;
        }
        if v["type"] == "array" {
            if let Some(items) = v.get("items") {
                schema_paths(items, &format!("{path}[]"), out);
            }
        } else {
            schema_paths(v, &path, out);
        }
    }
}

#[test]
fn upgradeplan_reference_mentions_every_crd_field() {
    let crd = yaml("crds/raygate.io_upgradeplans.yaml");
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut paths = vec![];
    for top in ["spec", "status"] {
        schema_paths(&schema["properties"][top], top, &mut paths);
    }
    assert!(
        paths.len() > 30,
        "only {} paths in the CRD schema?",
        paths.len()
    );
    let doc = read("docs/upgradeplan.md");
    let missing: Vec<&String> = paths
        .iter()
        .filter(|p| !doc.contains(&format!("`{p}`")))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/upgradeplan.md does not mention (as `path`): {missing:?}"
    );
    // Enum values are documented too.
    for (field, values) in [
        (
            "policy",
            &schema["properties"]["spec"]["properties"]["policy"],
        ),
        (
            "phase",
            &schema["properties"]["status"]["properties"]["phase"],
        ),
    ] {
        for v in strs(&values["enum"]) {
            assert!(
                doc.contains(&format!("`{v}`")),
                "docs/upgradeplan.md: {field} value `{v}`"
            );
        }
    }
}

// ---------------------------------------------------------------------------
// the CI example in docs/gitops.md

fn raygate_bin() -> PathBuf {
    raygate_e2e::workspace_bin("raygate").unwrap_or_else(|| {
        panic!("the raygate binary is not built: run `cargo build --workspace --bins` first")
    })
}

const ONE_FREE_GPU_STATE: &str = r#"apiVersion: v1
kind: List
items:
  - apiVersion: v1
    kind: Node
    metadata: {name: gpu-1, labels: {nvidia.com/gpu.product: NVIDIA-A100-SXM4-80GB}}
    spec: {taints: [{key: nvidia.com/gpu, effect: NoSchedule}]}
    status:
      allocatable: {cpu: "32", memory: 256Gi, nvidia.com/gpu: "1", pods: "110"}
      conditions: [{type: Ready, status: "True"}]
  - apiVersion: v1
    kind: Node
    metadata: {name: cpu-1}
    status:
      allocatable: {cpu: "16", memory: 64Gi, pods: "110"}
      conditions: [{type: Ready, status: "True"}]
"#;

#[test]
fn pr_check_example_flags_new_gpu_clusters_only() {
    let script = root("docs/examples/raygate-pr-check.sh");
    let sample = "config/samples/ray_v1_rayservice_llm_gpu.yaml";
    let base = read(sample);
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: String| {
        let p = dir.path().join(name);
        std::fs::write(&p, text).unwrap();
        p
    };
    // A new image: a second cluster with GPUs.
    let image = write(
        "image.yaml",
        base.replace("ray-llm:2.46.0-py311-cu124", "ray-llm:2.47.1-py311-cu124"),
    );
    // Serve autoscaling only: applied in place.
    let serve = write(
        "serve.yaml",
        base.replace("max_replicas: 4", "max_replicas: 6"),
    );
    // Autoscaler-owned worker replicas: muted by KubeRay.
    let replicas = write(
        "replicas.yaml",
        base.replace("        replicas: 2\n", "        replicas: 3\n"),
    );
    assert!(read(sample).contains("        replicas: 2\n"));
    let state = write("state.yaml", ONE_FREE_GPU_STATE.to_string());
    let check = |head: &Path, mode: &str, state: Option<&Path>| {
        let mut cmd = Command::new("bash");
        cmd.arg(&script)
            .arg(sample)
            .arg(head)
            .current_dir(repo_root())
            .env("RAYGATE", raygate_bin())
            .env("RAYGATE_CHECK", mode)
            .env_remove("RAYGATE_STATE")
            .stdin(Stdio::null());
        if let Some(s) = state {
            cmd.env("RAYGATE_STATE", s);
        }
        let out = cmd.output().expect("run raygate-pr-check.sh");
        let text = String::from_utf8_lossy(&out.stdout).into_owned()
            + &String::from_utf8_lossy(&out.stderr);
        (out.status.code().unwrap_or(-1), text)
    };
    let (rc, out) = check(&image, "warn", None);
    assert_eq!(rc, 0, "{out}");
    assert!(
        out.starts_with("::warning::") && out.contains("nvidia.com/gpu=2"),
        "{out}"
    );
    let (rc, out) = check(&image, "fail", None);
    assert_eq!(rc, 1, "{out}");
    assert!(out.starts_with("::error::"), "{out}");
    for quiet in [&serve, &replicas] {
        let (rc, out) = check(quiet, "fail", None);
        assert_eq!(rc, 0, "{out}");
        assert!(out.contains("no new GPU cluster"), "{out}");
    }
    // One free GPU in the cluster state: `raygate fit` says the new cluster does not fit.
    let (rc, out) = check(&image, "warn", Some(&state));
    assert_eq!(rc, 3, "{out}");
    assert!(
        out.contains("does NOT fit") && out.contains("nvidia.com/gpu"),
        "{out}"
    );
    // The GitOps mistake docs/gitops.md warns about: an error (exit 4) even in
    // warn mode, never "other spec changes".
    let gated = write(
        "gated.yaml",
        base.replacen(
            "spec:\n",
            "spec:\n  upgradeStrategy:\n    type: NewCluster\n",
            1,
        ),
    );
    assert!(
        std::fs::read_to_string(&gated)
            .unwrap()
            .contains("  upgradeStrategy:\n")
    );
    for mode in ["warn", "fail"] {
        let (rc, out) = check(&gated, mode, None);
        assert_eq!(rc, 4, "{mode}: {out}");
        assert!(
            out.starts_with("::error::gated.yaml: spec.upgradeStrategy.type: set to NewCluster"),
            "{mode}: {out}"
        );
    }
    // Invalid input is not "needs GPUs": exit 2, naming the file and field.
    let bad = write(
        "bad.yaml",
        base.replace("nvidia.com/gpu: \"1\"", "nvidia.com/gpu: \"-1\""),
    );
    assert_ne!(
        std::fs::read_to_string(&bad).unwrap(),
        base,
        "the sample requests nvidia.com/gpu: \"1\""
    );
    let (rc, out) = check(&bad, "fail", None);
    assert_eq!(rc, 2, "{out}");
    assert!(
        out.starts_with("::error::bad.yaml: raygate explain could not check it"),
        "{out}"
    );
    assert!(out.contains("nvidia.com/gpu"), "{out}");
    let missing = dir.path().join("missing.yaml");
    let (rc, out) = check(&missing, "fail", None);
    assert_eq!(rc, 2, "{out}");
    let usage = Command::new("bash")
        .arg(&script)
        .arg(sample)
        .current_dir(repo_root())
        .env("RAYGATE", raygate_bin())
        .output()
        .expect("run raygate-pr-check.sh");
    assert_eq!(usage.status.code(), Some(2), "{usage:?}");
}

// ---------------------------------------------------------------------------
// uninstall: the chart's pre-delete hook

/// What `helm uninstall` runs first: `raygate release` with the hook's own ServiceAccount
/// and RBAC. Run here as the real binary with the rendered Job's arguments and that
/// ServiceAccount's token against a real apiserver (there is no kubelet to run the Job):
/// the operator is scaled to zero, raygate's gate is given back, its finalizer removed,
/// and nothing else is touched.
#[test]
fn uninstall_hook_gives_every_gate_back_with_its_own_rbac() {
    let helm = helms().remove(0);
    let all = docs(&ok(
        &helm,
        &[
            "template",
            RELEASE,
            "charts/raygate",
            "--namespace",
            RELEASE_NS,
        ],
    ));
    let hooks: Vec<Value> = all.iter().filter(|o| is_hook(o)).cloned().collect();
    let job = find(&hooks, "Job");
    for o in &hooks {
        let a = &o["metadata"]["annotations"];
        assert_eq!(a["helm.sh/hook"], "pre-delete", "{} {}", kind(o), name(o));
        assert_eq!(
            a["helm.sh/hook-delete-policy"],
            "before-hook-creation,hook-succeeded",
            "{} {}",
            kind(o),
            name(o)
        );
    }
    let spec = &job["spec"]["template"]["spec"];
    let args: Vec<String> = strs(&spec["containers"][0]["args"])
        .into_iter()
        .map(str::to_owned)
        .collect();
    assert_eq!(args[0], "release", "{args:?}");
    assert!(args.contains(&format!("--scale-down={RELEASE_NS}/rg-raygate")));
    let sa = spec["serviceAccountName"]
        .as_str()
        .expect("hook SA")
        .to_owned();
    assert_ne!(sa, "rg-raygate", "the hook has its own ServiceAccount");
    for r in hooks.iter().filter(|o| kind(o).ends_with("Role")) {
        assert_least_privilege(&r["rules"], name(r));
    }
    // Its pod must not match the Deployment's selector (scale-down waits for those).
    let selector = &find(&all, "Deployment")["spec"]["selector"]["matchLabels"];
    let labels = &job["spec"]["template"]["metadata"]["labels"];
    assert_ne!(
        labels["app.kubernetes.io/name"], selector["app.kubernetes.io/name"],
        "hook pod labels {labels} match the operator's selector {selector}"
    );

    let cp = ControlPlane::start_with(raygate_e2e::Options::without_kuberay())
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    let scratch = tempfile::tempdir().expect("scratch dir");
    if let Err(e) = release_as_the_hook(&cp, scratch.path(), &helm, &hooks, &sa, &args) {
        panic!("{e:#}");
    }
}

fn release_as_the_hook(
    cp: &ControlPlane,
    scratch: &Path,
    helm: &Path,
    hooks: &[Value],
    sa: &str,
    args: &[String],
) -> Result<()> {
    for ns in [RELEASE_NS, "ml-serving"] {
        cp.kubectl_ok(&["create", "namespace", ns])?;
    }
    cp.install_crd_file(&root("charts/raygate/crds/raygate.io_upgradeplans.yaml"))?;
    let chart = write_manifest(scratch, "chart.yaml", &helm_template(helm, &[]))?;
    cp.kubectl_ok(&["apply", "-f", &chart.to_string_lossy()])?;
    apply_hook_rbac(cp, scratch, hooks)?;
    hold_gate(cp, scratch, "ml-serving")?;

    let said = raygate_as(cp, scratch, RELEASE_NS, sa, args)?;
    if !said.contains("gate given back: RayService ml-serving/llm")
        || !said.contains("finalizer removed: UpgradePlan ml-serving/llm")
    {
        bail!("raygate release said:\n{said}");
    }
    let d = get_json(cp, &["-n", RELEASE_NS, "deployment", "rg-raygate"])?;
    if d["spec"]["replicas"] != 0 {
        bail!("the operator was not scaled down: {}", d["spec"]);
    }
    check_given_back(cp, "ml-serving")
}

/// Creates a hook's ServiceAccount and RBAC (every hook object but the Job), as Helm does
/// before the Job.
fn apply_hook_rbac(cp: &ControlPlane, scratch: &Path, hooks: &[Value]) -> Result<()> {
    let rbac: Vec<Value> = hooks.iter().filter(|o| kind(o) != "Job").cloned().collect();
    let rbac = write_manifest(scratch, "hook-rbac.yaml", &rbac)?;
    cp.kubectl_ok(&["apply", "-f", &rbac.to_string_lossy()])?;
    Ok(())
}

/// What a stopped raygate leaves in `ns`: the sample RayService `llm` and its plan, its gate
/// on the RayService, its finalizer on the plan, and another manager's finalizer that must stay.
fn hold_gate(cp: &ControlPlane, scratch: &Path, ns: &str) -> Result<()> {
    for f in [
        "config/samples/ray_v1_rayservice_llm_gpu.yaml",
        "config/samples/raygate_v1alpha1_upgradeplan_auto.yaml",
    ] {
        let mut objs = docs(&read(f));
        for o in &mut objs {
            o["metadata"]["namespace"] = json!(ns);
        }
        let m = write_manifest(scratch, &format!("sample-{ns}.yaml"), &objs)?;
        cp.kubectl_ok(&["apply", "-f", &m.to_string_lossy()])?;
    }
    let gate = scratch.join(format!("gate-{ns}.yaml"));
    std::fs::write(
        &gate,
        format!(
            "apiVersion: ray.io/v1\nkind: RayService\nmetadata: {{name: llm, namespace: {ns}}}\n\
             spec: {{upgradeStrategy: {{type: None}}}}\n"
        ),
    )?;
    cp.kubectl_ok(&[
        "apply",
        "--server-side",
        "--field-manager=raygate",
        "-f",
        &gate.to_string_lossy(),
    ])?;
    cp.kubectl_ok(&[
        "-n",
        ns,
        "patch",
        "upgradeplan",
        "llm",
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["raygate.io/release-gate","example.com/keep"]}}"#,
    ])?;
    Ok(())
}

/// Runs `raygate ARGS` with a token of the ServiceAccount `ns/sa`, as its Job would (there
/// is no kubelet); what it said.
fn raygate_as(
    cp: &ControlPlane,
    scratch: &Path,
    ns: &str,
    sa: &str,
    args: &[String],
) -> Result<String> {
    let token = cp.kubectl_ok(&["-n", ns, "create", "token", sa, "--duration=1h"])?;
    let mut kc: Value = docs(&std::fs::read_to_string(cp.kubeconfig_path())?).remove(0);
    for u in kc["users"].as_array_mut().context("kubeconfig users")? {
        u["user"] = json!({ "token": token.trim() });
    }
    let kubeconfig = scratch.join(format!("{sa}.kubeconfig"));
    std::fs::write(&kubeconfig, serde_json::to_string(&kc)?)?;
    let out = Command::new(raygate_bin())
        .args(args)
        .arg("--kubeconfig")
        .arg(&kubeconfig)
        .stdin(Stdio::null())
        .output()?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() {
        bail!(
            "raygate {} failed as the hook's ServiceAccount:\n{said}",
            args.join(" ")
        );
    }
    Ok(said)
}

/// The managers of `ns/llm`'s fields and its upgradeStrategy.
fn gate_of(cp: &ControlPlane, ns: &str) -> Result<(Vec<String>, Value)> {
    // kubectl leaves managedFields out unless asked.
    let svc = get_json(
        cp,
        &["-n", ns, "rayservice", "llm", "--show-managed-fields"],
    )?;
    let managers = svc["metadata"]["managedFields"]
        .as_array()
        .map(|m| {
            m.iter()
                .filter_map(|e| e["manager"].as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default();
    Ok((managers, svc["spec"]["upgradeStrategy"].clone()))
}

fn plan_finalizers(cp: &ControlPlane, ns: &str) -> Result<Vec<String>> {
    let plan = get_json(cp, &["-n", ns, "upgradeplan", "llm"])?;
    Ok(strs(&plan["metadata"]["finalizers"])
        .into_iter()
        .map(str::to_owned)
        .collect())
}

/// raygate's gate on `ns/llm` is gone and only the other manager's finalizer is left.
fn check_given_back(cp: &ControlPlane, ns: &str) -> Result<()> {
    let (managers, strategy) = gate_of(cp, ns)?;
    if strategy["type"].is_string() || managers.iter().any(|m| m == "raygate") {
        bail!("the gate in {ns} is still there: {strategy} (managers {managers:?})");
    }
    let finalizers = plan_finalizers(cp, ns)?;
    if finalizers != ["example.com/keep"] {
        bail!("finalizers in {ns} after release: {finalizers:?}");
    }
    Ok(())
}

/// raygate's gate on `ns/llm` and its finalizer are still there.
fn check_held(cp: &ControlPlane, ns: &str) -> Result<()> {
    let (managers, strategy) = gate_of(cp, ns)?;
    if strategy["type"] != "None" || !managers.iter().any(|m| m == "raygate") {
        bail!("the gate in {ns} was given back: {strategy} (managers {managers:?})");
    }
    let finalizers = plan_finalizers(cp, ns)?;
    if finalizers != ["raygate.io/release-gate", "example.com/keep"] {
        bail!("finalizers in {ns} changed: {finalizers:?}");
    }
    Ok(())
}

// ---------------------------------------------------------------------------
// (f) the scope-change hook

/// Where the scope-change test installs the chart: a list of namespaces, then all.
const SCOPE_NS: &str = "raygate-scope";
const SCOPE_ALL_NS: &str = "raygate-scope-all";
const TEAM_A: &str = "team-a";
const TEAM_B: &str = "team-b";
/// A namespace being deleted when the scope drops it.
const TEAM_C: &str = "team-c";

/// Helm against the control plane; stdout, or an error with what it said.
fn helm_on(cp: &ControlPlane, helm: &Path, args: &[&str]) -> Result<String> {
    let kubeconfig = cp.kubeconfig_path().to_string_lossy().into_owned();
    let mut all = args.to_vec();
    all.extend_from_slice(&["--kubeconfig", &kubeconfig]);
    let out = run(helm, &all);
    if !out.status.success() {
        bail!(
            "`{}` failed ({}):\n{}{}",
            shown(helm, args),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// The post-upgrade hooks `helm upgrade --dry-run=server` renders (lookup reads the live
/// cluster then, as in a real upgrade; `helm template` and client dry-runs cannot).
fn post_upgrade_hooks(
    cp: &ControlPlane,
    helm: &Path,
    release: &str,
    ns: &str,
    set: &str,
) -> Result<Vec<Value>> {
    let out = helm_on(
        cp,
        helm,
        &[
            "upgrade",
            release,
            "charts/raygate",
            "--namespace",
            ns,
            "--dry-run=server",
            "--output",
            "json",
            "--set",
            set,
        ],
    )?;
    let rel: Value = serde_json::from_str(&out)
        .with_context(|| format!("{}: not a release as JSON:\n{out}", helm.display()))?;
    let mut hooks = vec![];
    for h in rel["hooks"].as_array().cloned().unwrap_or_default() {
        let manifest = h["manifest"].as_str().context("hook manifest")?;
        hooks.extend(
            docs(manifest)
                .into_iter()
                .filter(|o| o["metadata"]["annotations"]["helm.sh/hook"] == "post-upgrade"),
        );
    }
    Ok(hooks)
}

/// The hook's Job arguments and ServiceAccount, after checking what every scope hook must
/// be: post-upgrade, deleted when it succeeds, its own least-privilege RBAC and account.
fn scope_hook_job(hooks: &[Value], release: &str, who: &str) -> Result<(Vec<String>, String)> {
    for o in hooks {
        let a = &o["metadata"]["annotations"];
        if a["helm.sh/hook-delete-policy"] != "before-hook-creation,hook-succeeded" {
            bail!("{who}: {} {} delete policy {}", kind(o), name(o), a);
        }
        if kind(o).ends_with("Role") {
            assert_least_privilege(&o["rules"], &format!("{who}: {}", name(o)));
        }
    }
    let job = find(hooks, "Job");
    let spec = &job["spec"]["template"]["spec"];
    let args: Vec<String> = strs(&spec["containers"][0]["args"])
        .into_iter()
        .map(str::to_owned)
        .collect();
    let sa = spec["serviceAccountName"]
        .as_str()
        .context("hook SA")?
        .to_owned();
    if sa == format!("{release}-raygate") {
        bail!("{who}: the hook runs as the operator's ServiceAccount");
    }
    Ok((args, sa))
}

/// `kind namespace/name` of the hook's RBAC objects, sorted.
fn hook_rbac(hooks: &[Value]) -> Vec<String> {
    let mut v: Vec<String> = hooks
        .iter()
        .filter(|o| kind(o) != "Job")
        .map(|o| {
            format!(
                "{} {}/{}",
                kind(o),
                o["metadata"]["namespace"].as_str().unwrap_or(""),
                name(o)
            )
        })
        .collect();
    v.sort();
    v
}

/// Narrowing watchNamespaces with `helm upgrade` gives raygate's gates in the dropped
/// namespaces back (post-upgrade hook, rendered only when lookup shows the live Deployment's
/// scope losing namespaces), on a real apiserver with both Helms: [a, b] -> [a] releases b
/// only, as a Role in b; all -> [a] releases every namespace but a, through a ClusterRole;
/// [a] -> [a, b] renders nothing; a Deployment without the scope annotation falls back to its
/// --namespace arg. After the upgrade the operator can no longer write in the dropped
/// namespace, so the old pods still rolling out cannot take the gate again.
#[test]
fn scope_change_hook_gives_back_the_dropped_namespaces_gates() {
    let cp = ControlPlane::start_with(raygate_e2e::Options::without_kuberay())
        .unwrap_or_else(|e| panic!("cannot start the e2e control plane: {e:#}"));
    let scratch = tempfile::tempdir().expect("scratch dir");
    if let Err(e) = scope_change(&cp, scratch.path()) {
        panic!("{e:#}");
    }
}

fn scope_change(cp: &ControlPlane, scratch: &Path) -> Result<()> {
    let helms = helms();
    for ns in [SCOPE_NS, SCOPE_ALL_NS, TEAM_A, TEAM_B] {
        cp.kubectl_ok(&["create", "namespace", ns])?;
    }
    let both = format!("watchNamespaces={{{TEAM_A},{TEAM_B}}}");
    let only_a = format!("watchNamespaces={{{TEAM_A}}}");

    // [a, b] -> [a], with Helm 3.
    helm_on(
        cp,
        &helms[0],
        &[
            "install",
            "rg",
            "charts/raygate",
            "--namespace",
            SCOPE_NS,
            "--no-hooks",
            "--set",
            &both,
        ],
    )?;
    for ns in [TEAM_A, TEAM_B] {
        hold_gate(cp, scratch, ns)?;
    }
    let hooks = hooks_with_every_helm(
        cp,
        &helms,
        ("rg", SCOPE_NS),
        &only_a,
        "[a, b] -> [a]",
        &["release", "--namespace=team-b"],
        &[
            "Role team-b/rg-raygate-release-scope",
            "RoleBinding team-b/rg-raygate-release-scope",
            "ServiceAccount raygate-scope/rg-raygate-release-scope",
        ],
    )?;
    upgrade_and_run_the_hook(
        cp,
        scratch,
        &helms[0],
        ("rg", SCOPE_NS),
        &only_a,
        &hooks,
        "[a, b] -> [a]",
    )?;

    // [a] -> [a, b] drops nothing.
    for helm in &helms {
        let hooks = post_upgrade_hooks(cp, helm, "rg", SCOPE_NS, &both)?;
        if !hooks.is_empty() {
            bail!(
                "{}: [a] -> [a, b] rendered {:?}",
                helm.display(),
                hook_rbac(&hooks)
            );
        }
    }
    // A Deployment made before the annotation: its --namespace arg is the old scope.
    cp.kubectl_ok(&[
        "-n",
        SCOPE_NS,
        "annotate",
        "deployment",
        "rg-raygate",
        "raygate.io/watch-namespaces-",
    ])?;
    let fallback = post_upgrade_hooks(
        cp,
        &helms[0],
        "rg",
        SCOPE_NS,
        &format!("watchNamespaces={{{TEAM_B}}}"),
    )?;
    let (args, _) = scope_hook_job(&fallback, "rg", "[a] (args only) -> [b]")?;
    if args != ["release", "--namespace=team-a"] {
        bail!("[a] (args only) -> [b]: hook args {args:?}");
    }

    // A dropped namespace that is gone is left out; one being deleted accepts no new Role,
    // so the hook's RBAC is cluster-wide then.
    cp.kubectl_ok(&["create", "namespace", TEAM_C])?;
    cp.kubectl_ok(&[
        "patch",
        "namespace",
        TEAM_C,
        "--type=merge",
        "-p",
        r#"{"metadata":{"finalizers":["example.com/hold"]}}"#,
    ])?;
    cp.kubectl_ok(&["delete", "namespace", TEAM_C, "--wait=false"])?;
    cp.kubectl_ok(&[
        "-n",
        SCOPE_NS,
        "annotate",
        "--overwrite",
        "deployment",
        "rg-raygate",
        &format!("raygate.io/watch-namespaces={TEAM_A},gone,{TEAM_C}"),
    ])?;
    let deleting = post_upgrade_hooks(cp, &helms[0], "rg", SCOPE_NS, &only_a)?;
    let (args, _) = scope_hook_job(&deleting, "rg", "[a, gone, c (Terminating)] -> [a]")?;
    if args != ["release", "--namespace=team-c"] {
        bail!("[a, gone, c (Terminating)] -> [a]: hook args {args:?}");
    }
    let rbac = hook_rbac(&deleting);
    if rbac
        != [
            "ClusterRole /rg-raygate-release-scope",
            "ClusterRoleBinding /rg-raygate-release-scope",
            "ServiceAccount raygate-scope/rg-raygate-release-scope",
        ]
    {
        bail!("[a, gone, c (Terminating)] -> [a]: hook RBAC {rbac:?}");
    }

    // all -> [a], with Helm 4.
    hold_gate(cp, scratch, TEAM_B)?;
    helm_on(
        cp,
        &helms[1],
        &[
            "install",
            "rgall",
            "charts/raygate",
            "--namespace",
            SCOPE_ALL_NS,
            "--no-hooks",
        ],
    )?;
    let hooks = hooks_with_every_helm(
        cp,
        &helms,
        ("rgall", SCOPE_ALL_NS),
        &only_a,
        "all -> [a]",
        &["release", "--except-namespace=team-a"],
        &[
            "ClusterRole /rgall-raygate-release-scope",
            "ClusterRoleBinding /rgall-raygate-release-scope",
            "ServiceAccount raygate-scope-all/rgall-raygate-release-scope",
        ],
    )?;
    upgrade_and_run_the_hook(
        cp,
        scratch,
        &helms[1],
        ("rgall", SCOPE_ALL_NS),
        &only_a,
        &hooks,
        "all -> [a]",
    )
}

/// The post-upgrade hooks each Helm renders for upgrading `release` to `values`: the
/// Job's arguments are `args` and its RBAC `rbac` with every one of them.
fn hooks_with_every_helm(
    cp: &ControlPlane,
    helms: &[PathBuf],
    (release, ns): (&str, &str),
    values: &str,
    scenario: &str,
    args: &[&str],
    rbac: &[&str],
) -> Result<Vec<Value>> {
    let mut hooks = vec![];
    for helm in helms {
        hooks = post_upgrade_hooks(cp, helm, release, ns, values)?;
        let who = format!("{}: {scenario}", helm.display());
        let (got, _) = scope_hook_job(&hooks, release, &who)?;
        if got != args {
            bail!("{who}: hook args {got:?}");
        }
        if hook_rbac(&hooks) != rbac {
            bail!("{who}: hook RBAC {:?}", hook_rbac(&hooks));
        }
    }
    Ok(hooks)
}

/// `helm upgrade --no-hooks` of `release` to `values` (team-a only), then the scope hook
/// as Helm would run it after: the operator may no longer write in team-b, and the hook,
/// run as its own ServiceAccount, gives back team-b's gate and leaves team-a's held.
fn upgrade_and_run_the_hook(
    cp: &ControlPlane,
    scratch: &Path,
    helm: &Path,
    (release, ns): (&str, &str),
    values: &str,
    hooks: &[Value],
    scenario: &str,
) -> Result<()> {
    helm_on(
        cp,
        helm,
        &[
            "upgrade",
            release,
            "charts/raygate",
            "--namespace",
            ns,
            "--no-hooks",
            "--set",
            values,
        ],
    )?;
    let operator = format!("system:serviceaccount:{ns}:{release}-raygate");
    check_access(
        cp,
        &operator,
        &[&["patch", "rayservices.ray.io", "-n", TEAM_A]],
        &[
            &["patch", "rayservices.ray.io", "-n", TEAM_B],
            &["patch", "upgradeplans.raygate.io", "-n", TEAM_B],
        ],
    )?;
    apply_hook_rbac(cp, scratch, hooks)?;
    let (args, sa) = scope_hook_job(hooks, release, scenario)?;
    let said = raygate_as(cp, scratch, ns, &sa, &args)?;
    if !said.contains("gate given back: RayService team-b/llm") || said.contains("team-a") {
        bail!("raygate {} said:\n{said}", args.join(" "));
    }
    check_given_back(cp, TEAM_B)?;
    check_held(cp, TEAM_A)
}
