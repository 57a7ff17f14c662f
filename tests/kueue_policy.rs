//! The ValidatingAdmissionPolicy against RayService edits that cause an
//! outage (docs/kueue.md): the chart renders it from
//! `charts/raygate/files/kueue-admission-policy.yaml`, kustomize ships a copy
//! in `config/kueue`; both must carry the same rules. That the apiserver
//! compiles and enforces them is checked on the real apiserver by the e2e
//! `kueue` suite.

use std::path::Path;

use serde_json::Value;

fn read(rel: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn rules() -> Value {
    serde_saphyr::from_str(&read("charts/raygate/files/kueue-admission-policy.yaml"))
        .expect("the rules are YAML")
}

fn kustomize_docs() -> Vec<Value> {
    serde_saphyr::from_multiple(&read("config/kueue/admission-policy.yaml"))
        .expect("config/kueue is YAML")
}

#[test]
fn kustomize_carries_the_charts_rules() {
    let rules = rules();
    let docs = kustomize_docs();
    let kinds: Vec<&str> = docs.iter().map(|d| d["kind"].as_str().unwrap()).collect();
    assert_eq!(
        kinds,
        [
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding"
        ]
    );
    let (policy, binding) = (&docs[0], &docs[1]);
    for field in ["variables", "validations"] {
        assert_eq!(policy["spec"][field], rules[field], "spec.{field}");
    }
    assert_eq!(
        binding["spec"]["policyName"], policy["metadata"]["name"],
        "the binding binds the policy"
    );
    assert_eq!(
        binding["spec"]["validationActions"],
        serde_json::json!(["Deny"])
    );
    let m = &policy["spec"]["matchConstraints"]["resourceRules"][0];
    assert_eq!(m["resources"], serde_json::json!(["rayservices"]));
    assert_eq!(m["operations"], serde_json::json!(["UPDATE"]));
    let changed = policy["spec"]["matchConditions"][0]["expression"]
        .as_str()
        .unwrap();
    assert!(
        changed.contains("object.spec.rayClusterConfig != oldObject.spec.rayClusterConfig"),
        "only cluster spec edits are evaluated: {changed}"
    );
    let words = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    let template = words(&read(
        "charts/raygate/templates/kueue-admission-policy.yaml",
    ));
    assert!(
        template.contains(&words(changed)),
        "the chart has the same match condition"
    );
    let exempt = policy["spec"]["matchConditions"][1]["expression"]
        .as_str()
        .unwrap();
    assert!(
        exempt.contains("system:serviceaccount:kueue-system:kueue-controller-manager"),
        "{exempt}"
    );
}

#[test]
fn every_refusal_names_the_field_path_and_the_remedy() {
    let rules = rules();
    let validations = rules["validations"].as_array().unwrap();
    assert_eq!(validations.len(), 2);
    for v in validations {
        let msg = v["messageExpression"].as_str().unwrap();
        assert!(
            msg.contains("variables.paths")
                && msg.contains("docs/kueue.md")
                && msg.contains("Remedy"),
            "{msg}"
        );
        assert_eq!(v["reason"], "Forbidden");
    }
    // The paths are spelled from spec.rayClusterConfig.
    let paths = rules["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "paths")
        .unwrap();
    assert!(
        paths["expression"]
            .as_str()
            .unwrap()
            .contains("'spec.rayClusterConfig.'")
    );
    // Worker scaling is Kueue's and the autoscaler's: never refused.
    let scaling = rules["variables"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["name"] == "scaling")
        .unwrap();
    for f in ["replicas", "minReplicas", "maxReplicas"] {
        assert!(scaling["expression"].as_str().unwrap().contains(f), "{f}");
    }
}

#[test]
fn the_chart_renders_the_rules_from_its_file_on_by_default() {
    let template = read("charts/raygate/templates/kueue-admission-policy.yaml");
    assert!(template.contains(r#".Files.Get "files/kueue-admission-policy.yaml""#));
    // On by default, where admissionregistration.k8s.io/v1 policies exist (Kubernetes >= 1.30).
    assert!(template.contains(
        r#"if and .Values.kueue.admissionPolicy.enabled (semverCompare ">=1.30-0" .Capabilities.KubeVersion.Version)"#
    ));
    let values: Value = serde_saphyr::from_str(&read("charts/raygate/values.yaml")).unwrap();
    let p = &values["kueue"]["admissionPolicy"];
    assert_eq!(p["enabled"], true);
    assert_eq!(
        p["exemptUsers"],
        serde_json::json!(["system:serviceaccount:kueue-system:kueue-controller-manager"])
    );
}

#[test]
fn the_kueue_rbac_of_the_chart_is_the_kustomize_one_and_least_privilege() {
    let helpers = read("charts/raygate/templates/_helpers.tpl");
    let start = helpers
        .find(r#"{{- define "raygate.kueueRules" -}}"#)
        .expect("raygate.kueueRules");
    let body = &helpers[start..];
    let body = &body[body.find('\n').unwrap() + 1..body.find("{{- end }}").unwrap()];
    let chart: Value = serde_saphyr::from_str(body).expect("the chart's rules are YAML");
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&read("config/kueue-reservations/rbac.yaml")).unwrap();
    assert_eq!(docs[0]["kind"], "ClusterRole");
    assert_eq!(docs[0]["rules"], chart);
    for rule in chart.as_array().unwrap() {
        let resources: Vec<&str> = rule["resources"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        let verbs: Vec<&str> = rule["verbs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r.as_str().unwrap())
            .collect();
        // Writes only to Workloads (raygate's own); the queues are read only.
        if resources.contains(&"clusterqueues") || resources.contains(&"localqueues") {
            assert_eq!(verbs, ["get", "list", "watch"]);
        }
        if resources == ["workloads/status"] {
            assert_eq!(verbs, ["patch"]);
        }
    }
}
