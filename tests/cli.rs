//! Black-box tests of the offline CLI contract (`raygate explain`, `raygate fit`,
//! and the same through `kubectl-raygate`): the binaries are run on the fixtures
//! in `tests/fixtures/cli/` and their exit code, JSON and text are checked. The
//! live commands are tested against a real control plane in
//! `e2e/tests/kubectl_plugin.rs`.
//!
//! Exit codes: 0 success (whatever the verdict or fit), 1 invalid input (stderr names
//! the file and field), 2 usage error, 3 no fit with `--fail-if-no-fit`, 4 the
//! cluster refused or could not be reached. Never 101.

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_raygate");

fn fx(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/cli")
        .join(name)
}

fn svc(variant: &str) -> PathBuf {
    if variant.is_empty() {
        fx("rayservice-llm.yaml")
    } else {
        fx(&format!("rayservice-llm-{variant}.yaml"))
    }
}

struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

fn raygate<S: AsRef<std::ffi::OsStr>>(args: &[S]) -> Run {
    let out = Command::new(BIN)
        .args(args)
        .output()
        .expect("run the raygate binary");
    let shown: Vec<String> = args
        .iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let Some(code) = out.status.code() else {
        panic!("raygate {shown:?} killed by a signal; stderr:\n{stderr}");
    };
    assert_ne!(code, 101, "raygate {shown:?} panicked:\n{stderr}");
    assert!(
        !stderr.contains("panicked at"),
        "raygate {shown:?} panicked:\n{stderr}"
    );
    Run {
        code,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    }
}

fn p(path: &Path) -> String {
    path.display().to_string()
}

/// `raygate explain --old OLD --new NEW -o json EXTRA...`, which must succeed.
fn explain(old: &Path, new: &Path, extra: &[&str]) -> Value {
    let mut args = vec![
        "explain".to_string(),
        "--old".into(),
        p(old),
        "--new".into(),
        p(new),
        "-o".into(),
        "json".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let r = raygate(&args);
    assert_eq!(r.code, 0, "explain {args:?}: {}", r.stderr);
    serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", r.stdout))
}

fn explain_text(old: &Path, new: &Path, extra: &[&str]) -> String {
    let mut args = vec![
        "explain".to_string(),
        "--old".into(),
        p(old),
        "--new".into(),
        p(new),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let r = raygate(&args);
    assert_eq!(r.code, 0, "explain {args:?}: {}", r.stderr);
    r.stdout
}

/// `raygate fit --state STATE --new NEW -o json EXTRA...` → (JSON, exit code).
fn fit(state: &str, new: &Path, extra: &[&str]) -> (Value, i32) {
    let mut args = vec![
        "fit".to_string(),
        "--state".into(),
        p(&fx(state)),
        "--new".into(),
        p(new),
        "-o".into(),
        "json".into(),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    let r = raygate(&args);
    assert!(matches!(r.code, 0 | 3), "fit {args:?}: {}", r.stderr);
    let v =
        serde_json::from_str(&r.stdout).unwrap_or_else(|e| panic!("not JSON ({e}):\n{}", r.stdout));
    (v, r.code)
}

fn strs(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("not an array: {v}"))
        .iter()
        .map(|x| x.as_str().expect("string").to_string())
        .collect()
}

const IMAGE: &str = "workerGroupSpecs[gpu-a100].template.spec.containers[ray-worker].image";
const REPLICAS: &str = "workerGroupSpecs[gpu-a100].replicas";
const MIN: &str = "workerGroupSpecs[gpu-a100].minReplicas";
const MAX: &str = "workerGroupSpecs[gpu-a100].maxReplicas";
const HEAD_RES: &str = "headGroupSpec.template.spec.containers[ray-head].resources";

// ---------------------------------------------------------------- explain

#[test]
fn explain_json_has_the_contract_fields() {
    let v = explain(&svc(""), &svc(""), &[]);
    for key in [
        "verdict",
        "triggeringPaths",
        "exemptPaths",
        "serveConfigPaths",
        "kuberayVersion",
        "fingerprint",
        "newCluster",
    ] {
        assert!(v.get(key).is_some(), "missing {key}: {v}");
    }
    assert!(v["newCluster"]["pods"].is_u64(), "{v}");
    assert!(v["newCluster"]["requests"].is_object(), "{v}");
    assert_eq!(v["verdict"], "NoChange");
    assert_eq!(v["kuberayVersion"], "v1.7.0");
    let fp = v["fingerprint"].as_str().unwrap_or_default();
    assert!(
        fp.len() == 12 && fp.chars().all(|c| c.is_ascii_hexdigit()),
        "{fp}"
    );
    assert!(v.get("heldReason").is_none(), "heldReason only when Held");
}

/// Every verdict, with the exact paths, comparing two RayService manifests.
#[test]
fn explain_every_verdict_with_exact_paths() {
    let none: &[&str] = &[];
    let head_paths: Vec<String> = [
        "limits[cpu]",
        "limits[memory]",
        "requests[cpu]",
        "requests[memory]",
    ]
    .iter()
    .map(|s| format!("{HEAD_RES}.{s}"))
    .collect();
    let head_paths: Vec<&str> = head_paths.iter().map(String::as_str).collect();
    #[allow(clippy::type_complexity)]
    let cases: &[(&str, &str, &[&str], &[&str], &[&str])] = &[
        // variant, verdict, triggering, exempt, serve config
        ("", "NoChange", none, none, none),
        ("quantity-reformat", "NoChange", none, none, none),
        ("replicas", "NoChange", none, &[REPLICAS], none),
        ("min-max", "NoChange", none, &[MAX, MIN], none),
        (
            "serve-replicas",
            "ServeConfigUpdate",
            none,
            none,
            &["serveConfigV2.applications[chat].deployments[VLLMDeployment].num_replicas"],
        ),
        (
            "serve-new-app",
            "ServeConfigUpdate",
            none,
            none,
            &["serveConfigV2.applications[rerank]"],
        ),
        (
            "append-group",
            "InPlaceClusterUpdate",
            &["workerGroupSpecs[cpu-tokenize]"],
            none,
            none,
        ),
        ("image-bump", "NewCluster", &[IMAGE], none, none),
        ("ray-version", "NewCluster", &["rayVersion"], none, none),
        ("head-resources", "NewCluster", &head_paths, none, none),
        ("upgrade-none", "Held", &[IMAGE], none, none),
    ];
    for (variant, verdict, trig, exempt, serve) in cases {
        let v = explain(&svc(""), &svc(variant), &[]);
        assert_eq!(v["verdict"], *verdict, "{variant}: {v}");
        assert_eq!(strs(&v["triggeringPaths"]), *trig, "{variant}");
        assert_eq!(strs(&v["exemptPaths"]), *exempt, "{variant}");
        assert_eq!(strs(&v["serveConfigPaths"]), *serve, "{variant}");
        assert_eq!(v["kuberayVersion"], "v1.7.0", "{variant}");
    }
}

#[test]
fn explain_held_reports_why_and_other_spec_changes() {
    let v = explain(&svc(""), &svc("upgrade-none"), &[]);
    assert_eq!(v["verdict"], "Held");
    assert_eq!(v["upgradeStrategy"], "None");
    assert_eq!(v["zeroDowntime"], false);
    let held = v["heldReason"].as_str().unwrap_or_default();
    assert!(held.contains("upgradeStrategy.type is None"), "{held}");
    // Setting raygate's gate in the manifest is an error, not a change without effect.
    assert_eq!(strs(&v["otherPaths"]), Vec::<String>::new());
    assert_eq!(v["errors"][0]["path"], "spec.upgradeStrategy.type", "{v}");
}

/// docs/gitops.md: nothing but raygate may set `spec.upgradeStrategy` of a gated
/// RayService. A manifest that does is flagged as an error whatever the verdict.
#[test]
fn explain_flags_a_manifest_that_sets_the_gate() {
    for (old, new) in [
        (svc(""), svc("upgrade-none")),
        // Both sides set it (Git always had it): still an error.
        (svc("upgrade-none"), svc("upgrade-none")),
    ] {
        let v = explain(&old, &new, &[]);
        let errors = v["errors"].as_array().cloned().unwrap_or_default();
        assert_eq!(errors.len(), 1, "{v}");
        assert_eq!(errors[0]["path"], "spec.upgradeStrategy.type");
        let msg = errors[0]["message"].as_str().unwrap_or_default();
        assert!(
            msg.starts_with("set to None: raygate owns this field")
                && msg.contains("GateOverridden")
                && msg.contains("docs/gitops.md"),
            "{msg}"
        );
        let text = explain_text(&old, &new, &[]);
        assert!(
            text.starts_with("ERROR:        spec.upgradeStrategy.type: set to None: "),
            "{text}"
        );
        assert!(!text.contains("Other spec changes"), "{text}");
    }
    // A manifest without it: no errors, and the field is always there for scripts.
    let v = explain(&svc(""), &svc("image-bump"), &[]);
    assert_eq!(v["errors"], json!([]));
}

#[test]
fn explain_fingerprint_ignores_muted_fields_and_go_equivalent_quantities() {
    let base = explain(&svc(""), &svc(""), &[])["fingerprint"].clone();
    for same in ["replicas", "min-max", "quantity-reformat", "serve-new-app"] {
        assert_eq!(
            explain(&svc(""), &svc(same), &[])["fingerprint"],
            base,
            "{same}"
        );
    }
    for differs in [
        "image-bump",
        "ray-version",
        "head-resources",
        "append-group",
    ] {
        assert_ne!(
            explain(&svc(""), &svc(differs), &[])["fingerprint"],
            base,
            "{differs}"
        );
    }
}

/// `newCluster.requests`, worked out by hand from the manifests:
/// - head: ray-head 4 cpu / 16Gi + the autoscaler sidecar KubeRay injects (500m / 512Mi)
///   = 4500m / 16896Mi;
/// - gpu-a100 worker: requests 30 cpu / 200Gi, and 4 GPUs from the limit (API defaulting);
///   its wait-gcs-ready init container (200m / 256Mi) is smaller, so it adds nothing;
/// - cpu-tokenize worker (append-group): 100m / 128Mi is below wait-gcs-ready's
///   200m / 256Mi, so each pod requests 200m / 256Mi.
#[test]
fn explain_new_cluster_requests_are_exact() {
    let cases: &[(&str, u64, &str, &str, &str)] = &[
        // 4500m + 2×30 = 64500m; 16896Mi + 2×204800Mi = 426496Mi; 2×4 GPUs
        ("", 3, "64500m", "426496Mi", "8"),
        ("quantity-reformat", 3, "64500m", "426496Mi", "8"),
        // min/max do not move replicas (2, within [2, 8])
        ("min-max", 3, "64500m", "426496Mi", "8"),
        // 3 workers: 4500m + 90 = 94500m; 16896Mi + 614400Mi = 631296Mi; 12 GPUs
        ("replicas", 4, "94500m", "631296Mi", "12"),
        // + 2 × (200m, 256Mi) from wait-gcs-ready: 64900m; 427008Mi = 417Gi
        ("append-group", 5, "64900m", "417Gi", "8"),
        // head 8 cpu / 32Gi: 8500m + 60 = 68500m; 33280Mi + 409600Mi = 442880Mi
        ("head-resources", 3, "68500m", "442880Mi", "8"),
        // one 16-GPU worker: 4500m + 30 = 34500m; 16896Mi + 204800Mi = 221696Mi
        ("tp16", 2, "34500m", "221696Mi", "16"),
    ];
    for (variant, pods, cpu, memory, gpu) in cases {
        let v = explain(&svc(""), &svc(variant), &[]);
        assert_eq!(v["newCluster"]["pods"], *pods, "{variant}");
        assert_eq!(
            v["newCluster"]["requests"],
            json!({"cpu": cpu, "memory": memory, "nvidia.com/gpu": gpu}),
            "{variant}"
        );
    }
}

#[test]
fn explain_against_the_live_raycluster() {
    let live = fx("raycluster-llm-live.yaml");
    // The autoscaler has 3 workers, the manifest says 2: muted.
    let v = explain(&live, &svc(""), &[]);
    assert_eq!(v["verdict"], "NoChange", "{v}");
    assert_eq!(strs(&v["triggeringPaths"]), Vec::<String>::new());
    assert_eq!(strs(&v["exemptPaths"]), [REPLICAS]);
    assert_eq!(strs(&v["ignoredPaths"]), Vec::<String>::new());

    let v = explain(&live, &svc("image-bump"), &[]);
    assert_eq!(v["verdict"], "NewCluster");
    assert_eq!(strs(&v["triggeringPaths"]), [IMAGE]);
    assert_eq!(strs(&v["exemptPaths"]), [REPLICAS]);

    let v = explain(&live, &svc("replicas"), &[]);
    assert_eq!(v["verdict"], "NoChange");
    assert_eq!(strs(&v["exemptPaths"]), Vec::<String>::new(), "3 = 3");

    let v = explain(&live, &svc("append-group"), &[]);
    assert_eq!(v["verdict"], "InPlaceClusterUpdate");
    assert_eq!(
        strs(&v["triggeringPaths"]),
        ["workerGroupSpecs[cpu-tokenize]"]
    );

    let v = explain(&live, &svc("upgrade-none"), &[]);
    assert_eq!(v["verdict"], "Held");

    // The Serve config is not on a RayCluster: not compared.
    let v = explain(&live, &svc("serve-new-app"), &[]);
    assert_eq!(v["verdict"], "NoChange");
    assert_eq!(strs(&v["serveConfigPaths"]), Vec::<String>::new());
    let text = explain_text(&live, &svc("serve-new-app"), &[]);
    assert!(text.contains("Serve config: not compared"), "{text}");
}

#[test]
fn explain_kuberay_versions_differ_where_kuberay_did() {
    // minReplicas/maxReplicas are muted from v1.2.0 on.
    let v = explain(&svc(""), &svc("min-max"), &["--kuberay-version", "1.1"]);
    assert_eq!(
        v["kuberayVersion"], "v1.1.1",
        "1.1 means the newest 1.1 patch"
    );
    assert_eq!(v["verdict"], "NewCluster");
    assert_eq!(strs(&v["triggeringPaths"]), [MAX, MIN]);
    assert_eq!(strs(&v["exemptPaths"]), Vec::<String>::new());
    let v = explain(&svc(""), &svc("min-max"), &["--kuberay-version", "1.7"]);
    assert_eq!(v["verdict"], "NoChange");
    assert_eq!(strs(&v["exemptPaths"]), [MAX, MIN]);
    assert_ne!(
        explain(&svc(""), &svc("min-max"), &["--kuberay-version", "1.1"])["fingerprint"],
        explain(&svc(""), &svc(""), &["--kuberay-version", "1.1"])["fingerprint"]
    );

    // spec.upgradeStrategy exists from v1.3.0 on; before, ENABLE_ZERO_DOWNTIME decides.
    let v = explain(
        &svc(""),
        &svc("upgrade-none"),
        &["--kuberay-version", "1.1"],
    );
    assert_eq!(v["verdict"], "NewCluster");
    assert_eq!(strs(&v["triggeringPaths"]), [IMAGE]);
    let v = explain(
        &svc(""),
        &svc("upgrade-none"),
        &["--kuberay-version", "1.2"],
    );
    assert_eq!(v["verdict"], "NewCluster");
    let v = explain(
        &svc(""),
        &svc("upgrade-none"),
        &["--kuberay-version", "v1.3.0"],
    );
    assert_eq!(v["kuberayVersion"], "v1.3.0");
    assert_eq!(v["verdict"], "Held");

    // Against the live cluster made by v1.7.0: an older operator (v1.2.0+) sees a
    // different ray.io/kuberay-version and rewrites the cluster in place; `priority`
    // is a v1.7 field, unknown (pruned) before.
    let live = fx("raycluster-llm-live.yaml");
    let v = explain(&live, &svc("image-bump"), &["--kuberay-version", "1.6"]);
    assert_eq!(v["kuberayVersion"], "v1.6.2");
    assert_eq!(v["verdict"], "InPlaceClusterUpdate");
    assert_eq!(strs(&v["triggeringPaths"]), [REPLICAS, IMAGE]);
    assert_eq!(
        strs(&v["ignoredPaths"]),
        ["workerGroupSpecs[gpu-a100].priority"]
    );
    // v1.1 has no such rule: a new cluster, as with v1.7.
    let v = explain(&live, &svc("image-bump"), &["--kuberay-version", "1.1"]);
    assert_eq!(v["verdict"], "NewCluster");
    let v = explain(&live, &svc("image-bump"), &["--kuberay-version", "1.7"]);
    assert_eq!(v["verdict"], "NewCluster");
    assert_eq!(strs(&v["ignoredPaths"]), Vec::<String>::new());
}

#[test]
fn explain_zero_downtime_disabled() {
    // upgradeStrategy.type NewCluster (v1.3.0+) wins over ENABLE_ZERO_DOWNTIME=false
    // (a RayService raygate does not gate; raygate's own is flagged).
    let v = explain(
        &svc(""),
        &svc("image-bump-new-cluster"),
        &["--zero-downtime-disabled"],
    );
    assert_eq!(v["verdict"], "NewCluster");
    assert_eq!(v["errors"][0]["path"], "spec.upgradeStrategy.type");
    // Unset (as raygate's users leave it), the operator setting decides.
    let v = explain(&svc(""), &svc("image-bump"), &["--zero-downtime-disabled"]);
    assert_eq!(v["verdict"], "Held", "{v}");
    // Before v1.3.0 only the operator setting counts.
    let v = explain(
        &svc(""),
        &svc("image-bump"),
        &["--zero-downtime-disabled", "--kuberay-version", "1.2"],
    );
    assert_eq!(v["verdict"], "Held");
    assert_eq!(strs(&v["triggeringPaths"]), [IMAGE]);
    assert!(
        v["heldReason"]
            .as_str()
            .unwrap_or_default()
            .contains("ENABLE_ZERO_DOWNTIME=false"),
        "{v}"
    );
}

#[test]
fn explain_incremental_step_above_surge_per_release_and_gate() {
    let new = svc("incremental-step-over-surge");
    // v1.7.0 (gate on by default) rejects stepSizePercent > maxSurgePercent.
    let v = explain(&svc(""), &new, &["--kuberay-version", "1.7"]);
    assert_eq!(
        (v["verdict"].as_str(), v["rejected"].as_bool()),
        (Some("Held"), Some(true)),
        "{v}"
    );
    assert!(
        v["heldReason"]
            .as_str()
            .unwrap_or_default()
            .contains("stepSizePercent 25"),
        "{v}"
    );
    // v1.6.2 with the gate on accepts it and upgrades incrementally.
    let v = explain(
        &svc(""),
        &new,
        &[
            "--kuberay-version",
            "1.6.2",
            "--kuberay-incremental-upgrades=true",
        ],
    );
    assert_eq!(v["verdict"], "NewCluster", "{v}");
    assert_eq!(v["incremental"], true, "{v}");
    // v1.6.2 with the gate off (its default): zero-downtime disabled, held.
    let v = explain(&svc(""), &new, &["--kuberay-version", "1.6.2"]);
    assert_eq!(v["verdict"], "Held", "{v}");
    assert!(
        v["heldReason"]
            .as_str()
            .unwrap_or_default()
            .contains("RayServiceIncrementalUpgrade"),
        "{v}"
    );
}

#[test]
fn explain_unknown_kuberay_version_is_invalid_input() {
    for bad in ["1.0", "1.8", "2.0", "1.7.9", "banana", ""] {
        let r = raygate(&[
            "explain",
            "--old",
            &p(&svc("")),
            "--new",
            &p(&svc("")),
            "--kuberay-version",
            bad,
        ]);
        assert_eq!(r.code, 1, "{bad}: {}", r.stderr);
        assert!(
            r.stderr.contains("--kuberay-version"),
            "{bad}: {}",
            r.stderr
        );
        assert!(r.stderr.contains("KubeRay version"), "{bad}: {}", r.stderr);
        assert!(r.stdout.is_empty());
    }
    let r = raygate(&[
        "explain",
        "--old",
        &p(&svc("")),
        "--new",
        &p(&svc("")),
        "--kuberay-version",
        "1.8",
    ]);
    assert!(r.stderr.contains("supported: v1.1.0"), "{}", r.stderr);
    assert!(r.stderr.contains("v1.7.0"), "{}", r.stderr);
}

/// Lines `Label:  value` of the header have their values in one column.
fn assert_aligned(text: &str) {
    let mut col = None;
    for line in text.lines().take_while(|l| !l.is_empty()) {
        let value_at = if line.starts_with(' ') {
            line.len() - line.trim_start().len()
        } else {
            let (label, _) = line.split_once(':').unwrap_or_else(|| panic!("{line:?}"));
            let rest = &line[label.len() + 1..];
            label.len() + 1 + (rest.len() - rest.trim_start().len())
        };
        match col {
            None => col = Some(value_at),
            Some(c) => assert_eq!(value_at, c, "misaligned {line:?} in\n{text}"),
        }
    }
}

#[test]
fn explain_text_puts_the_verdict_first() {
    let live = fx("raycluster-llm-live.yaml");
    let cases: &[(&Path, &str, &str)] = &[
        (&svc(""), "", "NoChange"),
        (&svc(""), "serve-replicas", "ServeConfigUpdate"),
        (&svc(""), "append-group", "InPlaceClusterUpdate"),
        (&svc(""), "image-bump", "NewCluster"),
        (&svc(""), "upgrade-none", "Held"),
        (&live, "image-bump", "NewCluster"),
    ];
    for (old, variant, verdict) in cases {
        let full = explain_text(old, &svc(variant), &[]);
        // A manifest error comes first (upgrade-none sets raygate's gate), then the verdict.
        let text = match full.find("\nVerdict:") {
            Some(i) if full.starts_with("ERROR:") => full[i + 1..].to_string(),
            _ => full.clone(),
        };
        assert_eq!(
            full.starts_with("ERROR:"),
            *variant == "upgrade-none",
            "{full}"
        );
        let first = text.lines().next().unwrap_or_default();
        assert_eq!(
            first.split_whitespace().collect::<Vec<_>>(),
            ["Verdict:", *verdict],
            "{text}"
        );
        assert!(
            text.lines().nth(1).unwrap_or_default().starts_with("Why:"),
            "{text}"
        );
        assert_aligned(&text);
        assert!(text.contains("New spec:"), "{text}");
    }
    let text = explain_text(&svc(""), &svc("upgrade-none"), &[]);
    assert!(
        text.contains("Held because: spec.upgradeStrategy.type is None"),
        "{text}"
    );
    assert!(text.contains(&format!("  {IMAGE}\n")), "{text}");
    let text = explain_text(&svc(""), &svc("image-bump"), &[]);
    assert!(
        text.contains("Changes that need a new cluster (1):"),
        "{text}"
    );
    // Requests right-aligned under each other.
    assert!(
        text.contains(
            "  cpu               64500m\n  memory          426496Mi\n  nvidia.com/gpu         8\n"
        ),
        "{text}"
    );
}

// ---------------------------------------------------------------- fit

#[test]
fn fit_fits_with_exact_numbers() {
    let (v, code) = fit("state-fits.yaml", &svc("image-bump"), &[]);
    assert_eq!(code, 0);
    assert_eq!(v["fits"], true, "{v}");
    // Old (running llm-chat-q8d2w: head + 2 workers) + new (the same shape): both
    // 64500m / 426496Mi / 8 GPUs / 3 pods.
    assert_eq!(
        v["required"],
        json!({"cpu": "129", "memory": "833Gi", "nvidia.com/gpu": "16", "pods": "6"})
    );
    assert_eq!(
        v["newRequests"],
        json!({"cpu": "64500m", "memory": "426496Mi", "nvidia.com/gpu": "8", "pods": "3"})
    );
    // Usable: 2 CPU nodes + ip-10-0-2-21/22/23/26 (24/25 cordoned/NotReady).
    // GPUs: 32 − 8 (old workers) − 2 (fine-tuning job) = 22; the Succeeded and the
    // Pending (unbound) jobs hold nothing. cpu: 414540m − 81810m bound requests.
    assert_eq!(v["allocatable"]["nvidia.com/gpu"], "32");
    assert_eq!(v["allocatable"]["cpu"], "414540m");
    assert_eq!(v["free"]["nvidia.com/gpu"], "22");
    assert_eq!(v["free"]["cpu"], "332730m");
    assert_eq!(v["free"]["memory"], "4070536Mi");
    assert_eq!(v["free"]["pods"], "1210");
    assert_eq!(v["shortfall"], json!({}));
    assert_eq!(v["unplaced"], json!([]));
    // Best fit: each 4-GPU worker goes where it leaves the fewest GPUs (next to an old
    // worker), ties by node name; the head to the fuller m6i.4xlarge.
    assert_eq!(
        v["placements"],
        json!({
            "inference/llm-chat-next-gpu-a100-worker-0": "ip-10-0-2-21.ec2.internal",
            "inference/llm-chat-next-gpu-a100-worker-1": "ip-10-0-2-22.ec2.internal",
            "inference/llm-chat-next-head": "ip-10-0-1-11.ec2.internal",
        })
    );
    let skipped: Vec<&str> = v["skippedNodes"]
        .as_array()
        .map(|a| a.iter().filter_map(|n| n["node"].as_str()).collect())
        .unwrap_or_default();
    assert_eq!(
        skipped,
        ["ip-10-0-2-24.ec2.internal", "ip-10-0-2-25.ec2.internal"]
    );
    let (_, code) = fit("state-fits.yaml", &svc("image-bump"), &["--fail-if-no-fit"]);
    assert_eq!(code, 0);
}

#[test]
fn fit_gpu_shortfall() {
    let (v, code) = fit("state-no-fit.yaml", &svc("image-bump"), &[]);
    assert_eq!(code, 0, "no --fail-if-no-fit: exit 0");
    assert_eq!(v["fits"], false);
    // Free GPUs on usable nodes: 2 + 2 + 2 = 6; the new cluster needs 8.
    assert_eq!(v["free"]["nvidia.com/gpu"], "6");
    assert_eq!(v["shortfall"], json!({"nvidia.com/gpu": "2"}));
    assert_eq!(v["required"]["nvidia.com/gpu"], "16");
    let unplaced = v["unplaced"].as_array().cloned().unwrap_or_default();
    let pods: Vec<&str> = unplaced.iter().filter_map(|u| u["pod"].as_str()).collect();
    assert_eq!(
        pods,
        [
            "inference/llm-chat-next-gpu-a100-worker-0",
            "inference/llm-chat-next-gpu-a100-worker-1"
        ]
    );
    for u in &unplaced {
        assert_eq!(
            u["reason"],
            "0/7 nodes are available: 1 node(s) had untolerated taint {dedicated: training}, \
             1 node(s) were not ready, 1 node(s) were unschedulable, \
             2 Insufficient nvidia.com/gpu, 2 node(s) didn't match Pod's node affinity/selector."
        );
    }
    assert_eq!(
        v["placements"],
        json!({"inference/llm-chat-next-head": "ip-10-0-1-11.ec2.internal"})
    );
    let (_, code) = fit(
        "state-no-fit.yaml",
        &svc("image-bump"),
        &["--fail-if-no-fit"],
    );
    assert_eq!(code, 3);
}

#[test]
fn fit_fragmentation() {
    let (v, code) = fit("state-fragmented.yaml", &svc("tp16"), &["--fail-if-no-fit"]);
    assert_eq!(code, 3);
    assert_eq!(v["fits"], false);
    // 16 free GPUs in total (8 + 8), exactly the 16 needed: no shortfall, no fit.
    assert_eq!(v["free"]["nvidia.com/gpu"], "16");
    assert_eq!(v["newRequests"]["nvidia.com/gpu"], "16");
    assert_eq!(v["shortfall"], json!({}));
    assert_eq!(
        v["unplaced"],
        json!([{
            "pod": "inference/llm-chat-next-gpu-a100-worker-0",
            "reason": "0/6 nodes are available: 2 node(s) didn't match Pod's node affinity/selector, 4 Insufficient nvidia.com/gpu.",
            "reserved": false,
        }])
    );
    let r = raygate(&[
        "fit",
        "--state",
        &p(&fx("state-fragmented.yaml")),
        "--new",
        &p(&svc("tp16")),
    ]);
    assert_eq!(r.code, 0);
    assert!(r.stdout.contains("fragmentation"), "{}", r.stdout);
    assert!(
        r.stdout.contains("Insufficient nvidia.com/gpu"),
        "{}",
        r.stdout
    );
}

#[test]
fn fit_headroom() {
    // 22 free − 8 new = 14 ≥ 8: fits.
    let (v, _) = fit(
        "state-fits.yaml",
        &svc(""),
        &["--headroom", "nvidia.com/gpu=8"],
    );
    assert_eq!(v["fits"], true, "{v}");
    assert_eq!(v["headroom"], json!({"nvidia.com/gpu": "8"}));
    assert_eq!(v["shortfall"], json!({}));
    // 16 must stay free: 8 + 16 − 22 = 2 short; the second worker would break it.
    let (v, code) = fit(
        "state-fits.yaml",
        &svc(""),
        &[
            "--headroom",
            "nvidia.com/gpu=16",
            "--headroom",
            "cpu=1",
            "--fail-if-no-fit",
        ],
    );
    assert_eq!(code, 3);
    assert_eq!(v["fits"], false);
    assert_eq!(v["headroom"], json!({"cpu": "1", "nvidia.com/gpu": "16"}));
    assert_eq!(v["shortfall"], json!({"nvidia.com/gpu": "2"}));
    assert_eq!(
        v["unplaced"][0]["pod"],
        "inference/llm-chat-next-gpu-a100-worker-1"
    );
    let reason = v["unplaced"][0]["reason"].as_str().unwrap_or_default();
    assert!(reason.contains("below the headroom of 16"), "{reason}");
    assert_eq!(
        v["placements"]["inference/llm-chat-next-gpu-a100-worker-0"],
        "ip-10-0-2-21.ec2.internal"
    );
}

#[test]
fn fit_is_deterministic() {
    for output in ["json", "text"] {
        let args = [
            "fit",
            "--state",
            &p(&fx("state-fits.yaml")),
            "--new",
            &p(&svc("replicas")),
            "-o",
            output,
        ];
        let first = raygate(&args).stdout;
        for _ in 0..3 {
            assert_eq!(raygate(&args).stdout, first, "{output}");
        }
    }
}

#[test]
fn fit_text_is_short_and_aligned() {
    let r = raygate(&[
        "fit",
        "--state",
        &p(&fx("state-no-fit.yaml")),
        "--new",
        &p(&svc("")),
    ]);
    assert_eq!(r.code, 0);
    let text = r.stdout;
    // Without --old the whole new cluster is fitted, and the output says so first.
    let mut lines = text
        .lines()
        .skip_while(|l| !l.starts_with("Fits:"))
        .collect::<Vec<_>>()
        .into_iter();
    assert!(
        text.starts_with("Compared to:  nothing (no --old): the whole new cluster is fitted"),
        "{text}"
    );
    assert_eq!(lines.next(), Some("Fits:         NO"), "{text}");
    assert_eq!(
        lines.next(),
        Some("Why:          2 of 3 new pods have no node; short of nvidia.com/gpu=2"),
        "{text}"
    );
    // What FREE means, in the header, as `kubectl get upgradeplans` means it.
    assert_eq!(
        lines.next(),
        Some(
            "FREE:         allocatable minus the pods running now: what the new cluster may use, \
             as GPUS FREE in"
        ),
        "{text}"
    );
    assert_aligned(&text);
    // The table: every row as wide as the header, columns right-aligned.
    let table: Vec<&str> = text
        .lines()
        .skip_while(|l| !l.starts_with("RESOURCE"))
        .take_while(|l| !l.is_empty())
        .collect();
    // One readable unit per row, as kubectl prints allocatable: never `64500m 129`,
    // `426496Mi 833Gi` nor `3506176Mi` (issue 32, item 3).
    assert_eq!(
        table,
        [
            "RESOURCE            NEW  OLD+NEW  ALLOCATABLE      FREE  SHORTFALL",
            "cpu                64.5      129       318.85    205.09          -",
            "memory          416.5Gi    833Gi       3424Gi  2619.2Gi          -",
            "nvidia.com/gpu        8       16           24         6          2",
            "pods                  3        6          970       959          -",
        ],
        "{text}"
    );
    assert!(text.contains("\nUnplaced pods (2):\n"), "{text}");
    assert!(
        text.contains("\n  inference/llm-chat-next-head  ip-10-0-1-11.ec2.internal\n"),
        "{text}"
    );
    assert!(
        text.contains("\n  ip-10-0-2-24.ec2.internal  unschedulable (cordoned)\n"),
        "{text}"
    );
    let r = raygate(&[
        "fit",
        "--state",
        &p(&fx("state-fits.yaml")),
        "--old",
        &p(&svc("")),
        "--new",
        &p(&svc("image-bump")),
    ]);
    assert!(r.stdout.starts_with("Fits:         yes\n"), "{}", r.stdout);
    // The change fitted, with the paths that make KubeRay build a new cluster
    // (what it would bring to a batch, issue 33), after the answer.
    let change = r
        .stdout
        .lines()
        .find(|l| l.starts_with("Change:"))
        .unwrap_or_else(|| panic!("{}", r.stdout));
    assert!(change.contains("(under rayClusterConfig):"), "{}", r.stdout);
    assert!(r.stdout.contains(".image"), "{}", r.stdout);
}

/// Issue 32: what a new user trips on in `fit`. The exact values stay in `-o json`
/// while the text reads in readable units; a resource no node offers (`gpu` for
/// `nvidia.com/gpu`) is named, not counted short; a manifest that sets the gate is
/// flagged as `explain` flags it.
#[test]
fn fit_first_hour_exact_json_unoffered_resources_and_the_gate() {
    let (v, _) = fit("state-no-fit.yaml", &svc(""), &[]);
    assert_eq!(v["newRequests"]["memory"], "426496Mi", "{v}");
    assert_eq!(v["newRequests"]["cpu"], "64500m", "{v}");
    let r = raygate(&[
        "fit",
        "--state",
        &p(&fx("state-fits.yaml")),
        "--new",
        &p(&svc("")),
        "--headroom",
        "gpu=2",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.contains("Why:          no node offers `gpu`\n"),
        "{}",
        r.stdout
    );
    assert!(!r.stdout.contains("short of gpu"), "{}", r.stdout);
    let r = raygate(&[
        "fit",
        "--state",
        &p(&fx("state-fits.yaml")),
        "--new",
        &p(&svc("upgrade-none")),
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.starts_with(
            "ERROR:        spec.upgradeStrategy.type: set to None: raygate owns this field"
        ),
        "{}",
        r.stdout
    );
    let (v, _) = fit("state-fits.yaml", &svc("upgrade-none"), &[]);
    assert_eq!(v["errors"][0]["path"], "spec.upgradeStrategy.type", "{v}");
}

/// FREE is what the new cluster may use (after the headroom), in the text and as
/// `available` in JSON: the meaning of GPUS FREE in `kubectl get upgradeplans`.
#[test]
fn fit_free_is_after_the_headroom() {
    let (v, _) = fit(
        "state-fits.yaml",
        &svc(""),
        &["--headroom", "nvidia.com/gpu=16", "--headroom", "cpu=1"],
    );
    // 22 free GPUs − 16 kept free = 6 for the new cluster; 8 needed: short 2.
    assert_eq!(v["free"]["nvidia.com/gpu"], "22", "before the headroom");
    assert_eq!(v["available"]["nvidia.com/gpu"], "6", "{v}");
    assert_eq!(v["available"]["cpu"], "331730m", "{v}");
    assert_eq!(v["shortfall"]["nvidia.com/gpu"], "2");
    let r = raygate(&[
        "fit",
        "--state",
        &p(&fx("state-fits.yaml")),
        "--new",
        &p(&svc("")),
        "--headroom",
        "nvidia.com/gpu=16",
        "--headroom",
        "cpu=1",
    ]);
    assert!(
        r.stdout.contains(
            "FREE:         allocatable minus the pods running now and the headroom: what the new"
        ),
        "{}",
        r.stdout
    );
    let gpu_row = r
        .stdout
        .lines()
        .find(|l| l.starts_with("nvidia.com/gpu"))
        .unwrap_or_default();
    assert_eq!(
        gpu_row.split_whitespace().collect::<Vec<_>>(),
        ["nvidia.com/gpu", "8", "16", "32", "16", "6", "2"],
        "NEW OLD+NEW ALLOCATABLE HEADROOM FREE SHORTFALL:\n{}",
        r.stdout
    );
}

/// A replicas-only, Serve-only or no change makes no new cluster: `fit --old` says
/// so and exits 0 even with --fail-if-no-fit (it planned a 9-pod cluster before).
#[test]
fn fit_with_old_says_when_no_new_cluster_is_needed() {
    for (variant, verdict) in [
        ("", "NoChange"),
        ("replicas", "NoChange"),
        ("serve-replicas", "ServeConfigUpdate"),
        ("append-group", "InPlaceClusterUpdate"),
    ] {
        let (v, code) = fit(
            "state-no-fit.yaml",
            &svc(variant),
            &["--old", &p(&svc("")), "--fail-if-no-fit"],
        );
        assert_eq!(code, 0, "{variant}: {v}");
        assert_eq!(v["newClusterNeeded"], false, "{variant}: {v}");
        assert_eq!(v["fits"], true, "{variant}: {v}");
        assert_eq!(v["verdict"], verdict, "{variant}: {v}");
        assert!(
            v.get("placements").is_none(),
            "{variant}: nothing placed: {v}"
        );
        let r = raygate(&[
            "fit",
            "--state",
            &p(&fx("state-no-fit.yaml")),
            "--old",
            &p(&svc("")),
            "--new",
            &p(&svc(variant)),
        ]);
        assert!(
            r.stdout.starts_with(&format!(
                "Fits:         yes: no new cluster is needed\nWhy:          verdict {verdict}: "
            )),
            "{variant}: {}",
            r.stdout
        );
    }
    // A change that needs one is fitted as before (and does not fit here).
    let (v, code) = fit(
        "state-no-fit.yaml",
        &svc("image-bump"),
        &["--old", &p(&svc("")), "--fail-if-no-fit"],
    );
    assert_eq!(code, 3, "{v}");
    assert_eq!(v["newClusterNeeded"], true);
    assert_eq!(v["fits"], false);
    // The old side may be the live RayCluster, as for explain.
    let (v, _) = fit(
        "state-no-fit.yaml",
        &svc("replicas"),
        &["--old", &p(&fx("raycluster-llm-live.yaml"))],
    );
    assert_eq!(v["newClusterNeeded"], false, "{v}");
}

// ---------------------------------------------------------------- snapshots

/// The whole text output, checked in under `tests/snapshots/`: a changed word or
/// column fails here (CI runs with `CI=true`, so insta never writes a new snapshot
/// there). `cargo insta review`, or `INSTA_UPDATE=always cargo test`, accepts a
/// deliberate change.
#[test]
fn explain_text_snapshots() {
    let live = fx("raycluster-llm-live.yaml");
    let cases: &[(&str, &Path, &str, &[&str])] = &[
        ("no_change", &svc(""), "", &[]),
        ("serve_config_update", &svc(""), "serve-replicas", &[]),
        ("in_place", &svc(""), "append-group", &[]),
        ("new_cluster", &svc(""), "image-bump", &[]),
        ("held", &svc(""), "upgrade-none", &[]),
        ("exempt_replicas", &svc(""), "replicas", &[]),
        ("against_live_cluster", &live, "image-bump", &[]),
        (
            "zero_downtime_disabled",
            &svc(""),
            "image-bump",
            &["--zero-downtime-disabled"],
        ),
        (
            "kuberay_v1_1",
            &svc(""),
            "min-max",
            &["--kuberay-version", "1.1"],
        ),
    ];
    for (name, old, variant, extra) in cases {
        let text = explain_text(old, &svc(variant), extra);
        insta::assert_snapshot!(format!("explain_{name}"), text);
    }
}

#[test]
fn fit_text_snapshots() {
    let old = p(&svc(""));
    let cases: &[(&str, &str, &str, &[&str])] = &[
        ("fits", "state-fits.yaml", "image-bump", &[]),
        ("gpu_shortfall", "state-no-fit.yaml", "", &[]),
        ("fragmentation", "state-fragmented.yaml", "tp16", &[]),
        (
            "headroom_fits",
            "state-fits.yaml",
            "",
            &["--headroom", "nvidia.com/gpu=8"],
        ),
        (
            "headroom_short",
            "state-fits.yaml",
            "",
            &["--headroom", "nvidia.com/gpu=16", "--headroom", "cpu=1"],
        ),
        (
            "no_new_cluster",
            "state-no-fit.yaml",
            "replicas",
            &["--old", &old],
        ),
    ];
    for (name, state, variant, extra) in cases {
        let mut args = vec![
            "fit".to_string(),
            "--state".into(),
            p(&fx(state)),
            "--new".into(),
            p(&svc(variant)),
        ];
        args.extend(extra.iter().map(|s| s.to_string()));
        let r = raygate(&args);
        assert_eq!(r.code, 0, "fit {args:?}: {}", r.stderr);
        insta::assert_snapshot!(format!("fit_{name}"), r.stdout);
    }
}

// ---------------------------------------------------------------- errors

fn tmp_file(dir: &tempfile::TempDir, name: &str, content: &[u8]) -> PathBuf {
    let path = dir.path().join(name);
    std::fs::write(&path, content).expect("write temp file");
    path
}

/// Runs explain with `bad` as --new and as --old, and fit with it as --new: exit 1,
/// stderr names the file and contains every `expect`.
fn assert_invalid(bad: &Path, expect: &[&str]) {
    let (good, bad, state) = (p(&svc("")), p(bad), p(&fx("state-fits.yaml")));
    let runs: [[&str; 5]; 3] = [
        ["explain", "--old", &good, "--new", &bad],
        ["explain", "--old", &bad, "--new", &good],
        ["fit", "--state", &state, "--new", &bad],
    ];
    for args in runs {
        let r = raygate(&args);
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        assert!(r.stdout.is_empty(), "{args:?}: {}", r.stdout);
        let first = r.stderr.lines().next().unwrap_or_default();
        assert!(first.starts_with("raygate: "), "{}", r.stderr);
        assert!(
            r.stderr.contains(&bad),
            "{args:?} names the file: {}",
            r.stderr
        );
        for e in expect {
            assert!(r.stderr.contains(e), "{args:?}: want {e:?} in {}", r.stderr);
        }
    }
}

/// Issue 26: the apiserver refuses a fraction of an extended resource (and a
/// GPU request below its limit), so KubeRay could never create the pod:
/// `explain` and `fit` refuse the file with the field path instead of
/// rounding the GPUs up.
#[test]
fn fractional_or_overcommitted_gpus_exit_1_with_the_field_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = std::fs::read_to_string(svc("")).expect("read fixture");
    let limit = "                    nvidia.com/gpu: 4\n";
    assert!(base.contains(limit));
    let path = "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].resources";
    let cases = [
        (
            base.replacen(limit, "                    nvidia.com/gpu: \"1.5\"\n", 1),
            format!("{path}.limits[nvidia.com/gpu]: 1.5 must be an integer"),
        ),
        (
            base.replacen(
                "                    memory: 200Gi\n",
                "                    memory: 200Gi\n                    nvidia.com/gpu: 2\n",
                1,
            ),
            format!(
                "{path}.requests[nvidia.com/gpu]: 2 must be equal to the nvidia.com/gpu limit of 4"
            ),
        ),
    ];
    let (good, state) = (p(&svc("")), p(&fx("state-fits.yaml")));
    for (i, (text, want)) in cases.iter().enumerate() {
        let bad = p(&tmp_file(&dir, &format!("gpu-{i}.yaml"), text.as_bytes()));
        for args in [
            ["explain", "--old", &good, "--new", &bad],
            ["fit", "--state", &state, "--new", &bad],
        ] {
            let r = raygate(&args);
            assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
            assert!(r.stdout.is_empty(), "{args:?}: {}", r.stdout);
            assert!(r.stderr.starts_with("raygate: "), "{}", r.stderr);
            assert!(r.stderr.contains(&bad), "{args:?}: {}", r.stderr);
            assert!(
                r.stderr.contains(want),
                "{args:?}: want {want:?} in {}",
                r.stderr
            );
        }
    }
}

/// Issue 26: a RayService over raygate's bounds (here 300 worker groups, over
/// 256) is refused offline with the field path, as the controller refuses it.
#[test]
fn a_rayservice_over_the_bounds_exits_1_with_the_field_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let groups: Vec<serde_json::Value> = (0..300)
        .map(|i| {
            serde_json::json!({"groupName": format!("g{i}"), "replicas": 1, "rayStartParams": {},
                "template": {"spec": {"containers": [{"name": "w", "image": "rayproject/ray:2.9.0"}]}}})
        })
        .collect();
    let svc = serde_json::json!({"apiVersion": "ray.io/v1", "kind": "RayService",
        "metadata": {"name": "big", "namespace": "t"},
        "spec": {"rayClusterConfig": {"headGroupSpec": {"rayStartParams": {},
            "template": {"spec": {"containers": [{"name": "h", "image": "rayproject/ray:2.9.0"}]}}},
            "workerGroupSpecs": groups}}});
    let bad = p(&tmp_file(&dir, "big.json", svc.to_string().as_bytes()));
    let state = p(&fx("state-fits.yaml"));
    for args in [
        vec!["explain", "--new", &bad],
        vec!["fit", "--state", &state, "--new", &bad],
    ] {
        let r = raygate(&args);
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.contains(
                "spec.rayClusterConfig.workerGroupSpecs: 300 worker groups, more than the 256"
            ),
            "{args:?}: {}",
            r.stderr
        );
    }
}

#[test]
fn invalid_input_exits_1_naming_file_and_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    assert_invalid(&dir.path().join("missing.yaml"), &["No such file"]);
    assert_invalid(
        &tmp_file(&dir, "notyaml.yaml", b"spec: [unclosed\n"),
        &["not valid YAML"],
    );
    assert_invalid(
        &tmp_file(&dir, "scalar.yaml", b"just a string\n"),
        &["expected a Kubernetes object, found a string"],
    );
    assert_invalid(
        &tmp_file(
            &dir,
            "list.yaml",
            b"- kind: RayService\n- kind: RayService\n",
        ),
        &["expected a Kubernetes object, found a list"],
    );
    assert_invalid(&tmp_file(&dir, "empty.yaml", b""), &["no objects found"]);
    assert_invalid(
        &tmp_file(
            &dir,
            "deploy.yaml",
            b"apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: x}\n",
        ),
        &["no RayService", "found Deployment"],
    );
    assert_invalid(
        &svc("bad-quantity"),
        &[
            "spec.rayClusterConfig.workerGroupSpecs[0].template.spec.containers[0].resources.limits[nvidia.com/gpu]",
            "invalid quantity \"two\"",
        ],
    );
    assert_invalid(
        &svc("no-cluster-config"),
        &[
            "RayService inference/llm-chat",
            "spec.rayClusterConfig is missing",
        ],
    );
    let base = std::fs::read_to_string(svc("")).expect("read fixture");
    let replicas = base.replacen("\n        replicas: 2\n", "\n        replicas: two\n", 1);
    assert_invalid(
        &tmp_file(&dir, "replicas.yaml", replicas.as_bytes()),
        &["spec.rayClusterConfig.workerGroupSpecs[0].replicas: invalid type: string \"two\""],
    );
    let two = format!("{base}\n---\n{base}");
    assert_invalid(
        &tmp_file(&dir, "two.yaml", two.as_bytes()),
        &["2 RayService", "objects found, expected one"],
    );
    assert_invalid(
        &tmp_file(&dir, "binary.yaml", &[0, 159, 146, 150, 255]),
        &["UTF-8"],
    );
}

#[test]
fn invalid_state_exits_1() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad_node = std::fs::read_to_string(fx("state-fits.yaml"))
        .expect("read fixture")
        .replacen("nvidia.com/gpu: '8'", "nvidia.com/gpu: 'eight'", 1);
    let cases: Vec<(PathBuf, &str)> = vec![
        (svc(""), "no Node objects found"),
        // Issue 32, item 12: the hint names what the docs dump.
        (
            svc(""),
            "`kubectl get nodes,pods,limitranges,runtimeclasses -A -o yaml`",
        ),
        // A gzipped dump said only "IO error".
        (
            tmp_file(&dir, "state.yaml.gz", &[0x1f, 0x8b, 0x08, 0x00, 0xff, 0xfe]),
            "not a YAML or JSON text file: binary content at byte",
        ),
        // A kind-less item: its path once, not `input.items[0].items[0]`.
        (
            tmp_file(
                &dir,
                "kindless.yaml",
                b"apiVersion: v1\nkind: List\nitems:\n- metadata: {name: x}\n",
            ),
            ": input.items[0] (x): object has no kind",
        ),
        (dir.path().join("none.yaml"), "No such file"),
        (
            tmp_file(&dir, "s.yaml", b"42\n"),
            "expected a Kubernetes object",
        ),
        (
            tmp_file(
                &dir,
                "items.yaml",
                b"apiVersion: v1\nkind: List\nitems: 7\n",
            ),
            "items",
        ),
        (
            tmp_file(&dir, "node.yaml", bad_node.as_bytes()),
            "invalid quantity \"eight\"",
        ),
    ];
    for (state, want) in cases {
        let r = raygate(&["fit", "--state", &p(&state), "--new", &p(&svc(""))]);
        assert_eq!(r.code, 1, "{state:?}: {}", r.stderr);
        assert!(r.stderr.contains(&p(&state)), "{}", r.stderr);
        assert!(r.stderr.contains(want), "want {want:?}: {}", r.stderr);
    }
    // A RayCluster is not a RayService.
    let r = raygate(&[
        "fit",
        "--state",
        &p(&fx("state-fits.yaml")),
        "--new",
        &p(&fx("raycluster-llm-live.yaml")),
    ]);
    assert_eq!(r.code, 1);
    assert!(
        r.stderr
            .contains("no RayService object found (found RayCluster)"),
        "{}",
        r.stderr
    );
}

#[test]
fn typed_lists_and_multi_document_states_are_read() {
    // `kubectl get nodes -o yaml` and `kubectl get pods -A -o yaml` concatenated.
    let dir = tempfile::tempdir().expect("tempdir");
    let text = std::fs::read_to_string(fx("state-fits.yaml")).expect("read fixture");
    let v: Value = serde_saphyr::from_str(&text).expect("fixture is YAML");
    let items = v["items"].as_array().cloned().unwrap_or_default();
    let without_kind = |kind: &str| -> Vec<Value> {
        items
            .iter()
            .filter(|i| i["kind"] == kind)
            .map(|i| {
                let mut i = i.clone();
                if let Some(m) = i.as_object_mut() {
                    m.remove("kind");
                }
                i
            })
            .collect()
    };
    let nodes = json!({"apiVersion": "v1", "kind": "NodeList", "items": without_kind("Node")});
    let pods = json!({"apiVersion": "v1", "kind": "PodList", "items": without_kind("Pod")});
    let both = format!("{nodes}\n---\n{pods}\n");
    let state = tmp_file(&dir, "typed.yaml", both.as_bytes());
    let r = raygate(&[
        "fit",
        "--state",
        &p(&state),
        "--new",
        &p(&svc("image-bump")),
        "-o",
        "json",
    ]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let got: Value = serde_json::from_str(&r.stdout).expect("json");
    let (want, _) = fit("state-fits.yaml", &svc("image-bump"), &[]);
    assert_eq!(got, want);
}

#[test]
fn usage_errors_exit_2() {
    let s = p(&svc(""));
    let st = p(&fx("state-fits.yaml"));
    let cases: Vec<Vec<&str>> = vec![
        vec![],
        vec!["frobnicate"],
        vec!["explain"],
        vec!["explain", "--old", &s],
        vec!["explain", "--old", &s, "--new", &s, "--bogus"],
        vec!["explain", "--old", &s, "--new", &s, "-o", "xml"],
        vec!["explain", "--old", &s, "--new", &s, "--kuberay-version"],
        vec!["fit", "--state", &st],
        vec!["queue", "-o", "table"],
        vec!["approve"],
        vec!["completion", "tcsh"],
        vec!["fit", "--state", &st, "--new", &s, "--headroom", "gpu"],
        vec![
            "fit",
            "--state",
            &st,
            "--new",
            &s,
            "--headroom",
            "nvidia.com/gpu=two",
        ],
        vec!["fit", "--state", &st, "--new", &s, "--headroom", "=2"],
        vec!["fit", "--state", &st, "--new", &s, "--headroom", "cpu=-1"],
        vec!["fit", "--state", &st, "--new", &s, "--fail-if-no-fit=yes"],
    ];
    for args in cases {
        let r = raygate(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
        assert!(!r.stderr.is_empty(), "{args:?}");
    }
    assert_eq!(raygate(&["--help"]).code, 0);
    assert_eq!(raygate(&["explain", "--help"]).code, 0);
}

// ---------------------------------------------------------------- no panic

fn all_fixtures() -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = std::fs::read_dir(fx(""))
        .expect("fixtures dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    for old in [
        "rayservice-llm.yaml",
        "raycluster-llm-active.yaml",
        "raycluster-multihost.yaml",
    ] {
        out.push(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures")
                .join(old),
        );
    }
    out.sort();
    out
}

#[test]
fn no_panic_on_truncated_or_garbage_input() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut inputs: Vec<PathBuf> = Vec::new();
    for (i, f) in all_fixtures().iter().enumerate() {
        let bytes = std::fs::read(f).expect("read fixture");
        for frac in [0.05, 0.3, 0.5, 0.77, 0.95] {
            let cut = (bytes.len() as f64 * frac) as usize;
            inputs.push(tmp_file(
                &dir,
                &format!("cut-{i}-{cut}.yaml"),
                &bytes[..cut],
            ));
        }
    }
    let garbage: &[&[u8]] = &[
        b"{",
        b"}}}",
        b"---\n---\n",
        b"~\n",
        b"kind: RayService\n",
        b"kind: RayService\nspec: []\n",
        b"kind: RayService\nspec: {rayClusterConfig: 3}\n",
        b"kind: RayService\nspec: {rayClusterConfig: {}}\n",
        b"kind: RayService\nspec: {rayClusterConfig: {headGroupSpec: {}}}\n",
        b"kind: RayService\nspec: {rayClusterConfig: {headGroupSpec: {template: {spec: {containers: []}}}}}\n",
        b"kind: RayService\nmetadata: {name: x}\nspec: {rayClusterConfig: {headGroupSpec: {template: {spec: {containers: [{name: h}]}}},\n  workerGroupSpecs: [{groupName: g, replicas: 2147483647, maxReplicas: 2147483647, numOfHosts: 2147483647,\n  template: {spec: {containers: [{name: w, resources: {limits: {nvidia.com/gpu: 1e18}}}]}}}]}}\n",
        b"kind: RayService\nmetadata: {name: x}\nspec: {rayClusterConfig: {headGroupSpec: {template: {spec: {containers: [{name: h, resources: {requests: {cpu: 99999999999999999999999Ei}}}]}}},\n  workerGroupSpecs: [{groupName: g, replicas: -5, minReplicas: -7, numOfHosts: -1}, {groupName: g}]}}\n",
        b"kind: RayService\nspec: {serveConfigV2: 7, rayClusterConfig: {workerGroupSpecs: [{}]}}\n",
        b"kind: RayCluster\nmetadata: {annotations: {ray.io/num-worker-groups: \"-1\"}}\nspec: {}\n",
        b"kind: List\nitems: [1, 2]\n",
        b"kind: List\nitems: [{kind: Node}, {kind: Pod, spec: {nodeName: 5}}]\n",
        b"kind: List\nitems: [{kind: Node, metadata: {name: n}, status: {allocatable: {cpu: '1e400'}, conditions: [{type: Ready, status: 'True'}]}}]\n",
        b"a: &a [*a]\n",
        b"\xef\xbb\xbfkind: RayService\n",
        b"\x00\x00\x00",
    ];
    for (i, g) in garbage.iter().enumerate() {
        inputs.push(tmp_file(&dir, &format!("garbage-{i}.yaml"), g));
    }
    let deep = format!("{}1{}", "[".repeat(5000), "]".repeat(5000));
    inputs.push(tmp_file(&dir, "deep.yaml", deep.as_bytes()));
    let base = p(&svc(""));
    let state = p(&fx("state-fits.yaml"));
    for input in &inputs {
        let f = p(input);
        for args in [
            vec!["explain", "--old", &base, "--new", &f],
            vec!["explain", "--old", &f, "--new", &base, "-o", "json"],
            vec!["fit", "--state", &f, "--new", &base],
            vec!["fit", "--state", &state, "--new", &f, "-o", "json"],
        ] {
            let r = raygate(&args);
            assert!(
                matches!(r.code, 0 | 1),
                "{args:?} exited {}: {}",
                r.code,
                r.stderr
            );
            if r.code == 1 {
                assert!(r.stderr.starts_with("raygate: "), "{args:?}: {}", r.stderr);
            }
        }
    }
}

#[test]
fn closed_stdout_is_not_a_crash() {
    // `raygate explain ... | head -0`: print! would panic on EPIPE.
    let mut child = Command::new(BIN)
        .args([
            "explain",
            "--old",
            &p(&svc("")),
            "--new",
            &p(&svc("image-bump")),
        ])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn raygate");
    drop(child.stdout.take());
    let out = child.wait_with_output().expect("wait");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn negative_and_non_finite_amounts_are_invalid_input_with_the_field() {
    let dir = tempfile::tempdir().expect("tempdir");
    let base = std::fs::read_to_string(svc("")).expect("read fixture");
    let gpu = "nvidia.com/gpu: 4\n";
    assert!(base.contains(gpu), "fixture has {gpu}");
    // The YAML reader refuses non-finite numbers itself, showing the line.
    for (name, value, field, want) in [
        (
            "neg.yaml",
            "nvidia.com/gpu: \"-4\"\n",
            "resources.limits[nvidia.com/gpu]",
            "negative amounts",
        ),
        (
            "negnum.yaml",
            "nvidia.com/gpu: -4\n",
            "resources.limits[nvidia.com/gpu]",
            "negative amounts",
        ),
        (
            "inf.yaml",
            "nvidia.com/gpu: .inf\n",
            "nvidia.com/gpu: .inf",
            "non-finite",
        ),
        (
            "nan.yaml",
            "nvidia.com/gpu: .nan\n",
            "nvidia.com/gpu: .nan",
            "non-finite",
        ),
    ] {
        let bad = base.replacen(gpu, value, 1);
        let path = tmp_file(&dir, name, bad.as_bytes());
        let r = raygate(&[
            "fit",
            "--state",
            &p(&fx("state-fits.yaml")),
            "--new",
            &p(&path),
        ]);
        assert_eq!(r.code, 1, "{name}: {}", r.stderr);
        assert!(
            r.stderr.contains(field) && r.stderr.contains(want),
            "{name}: want {field:?} and {want:?}: {}",
            r.stderr
        );
    }
    let state = std::fs::read_to_string(fx("state-fits.yaml"))
        .expect("read fixture")
        .replacen("nvidia.com/gpu: '8'", "nvidia.com/gpu: '-8'", 1);
    let path = tmp_file(&dir, "neg-state.yaml", state.as_bytes());
    let r = raygate(&["fit", "--state", &p(&path), "--new", &p(&svc(""))]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("negative amounts"), "{}", r.stderr);
    let r = raygate(&[
        "fit",
        "--state",
        &p(&fx("state-fits.yaml")),
        "--new",
        &p(&svc("")),
        "--headroom",
        "nvidia.com/gpu=-4",
    ]);
    assert_eq!(r.code, 2, "{}", r.stderr);
    assert!(r.stderr.contains("negative amounts"), "{}", r.stderr);
}

#[test]
fn endless_input_stops_with_an_error_not_out_of_memory() {
    // A state file streams (its bound is in GiB, see `capacity::state`):
    // endless zeros are refused as soon as they are read (as binary content).
    let r = raygate(&["fit", "--state", "/dev/zero", "--new", &p(&svc(""))]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.contains("/dev/zero") && r.stderr.contains("binary content at byte 0"),
        "{}",
        r.stderr
    );
    let r = raygate(&["explain", "--old", "/dev/zero", "--new", &p(&svc(""))]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(r.stderr.contains("larger than 256 MiB"), "{}", r.stderr);
}

// ---------------------------------------------------------- kubectl plugin

const PLUGIN: &str = env!("CARGO_BIN_EXE_kubectl-raygate");

fn plugin(args: &[&str]) -> Run {
    let out = Command::new(PLUGIN)
        .args(args)
        // No cluster: a live command must fail cleanly, never hang or dial out.
        .env("KUBECONFIG", "/nonexistent/kubeconfig")
        .env_remove("KUBERNETES_SERVICE_HOST")
        .output()
        .expect("run the kubectl-raygate binary");
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    let code = out.status.code().unwrap_or(-1);
    assert_ne!(code, 101, "kubectl-raygate {args:?} panicked:\n{stderr}");
    Run {
        code,
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr,
    }
}

#[test]
fn plugin_offline_commands_match_raygate() {
    let old = p(&fx("raycluster-llm-live.yaml"));
    let new = p(&svc("image-bump"));
    let args = ["explain", "--old", &old, "-f", &new, "-o", "json"];
    let via_plugin = plugin(&args);
    assert_eq!(via_plugin.code, 0, "{}", via_plugin.stderr);
    let via_raygate = raygate(&args);
    assert_eq!(via_plugin.stdout, via_raygate.stdout);
    // -o yaml is the same object.
    let yaml = plugin(&["explain", "--old", &old, "--filename", &new, "-o", "yaml"]);
    assert_eq!(yaml.code, 0, "{}", yaml.stderr);
    let from_yaml: Value = serde_saphyr::from_str(&yaml.stdout).expect("yaml");
    let from_json: Value = serde_json::from_str(&via_plugin.stdout).expect("json");
    assert_eq!(from_yaml, from_json);
}

#[test]
fn plugin_completion_scripts() {
    for (shell, marker) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef kubectl-raygate"),
        ("fish", "complete -c kubectl-raygate"),
    ] {
        let r = plugin(&["completion", shell]);
        assert_eq!(r.code, 0, "{shell}: {}", r.stderr);
        assert!(r.stdout.contains(marker), "{shell}:\n{}", r.stdout);
        for cmd in ["approve", "pause", "resume", "queue", "explain", "fit"] {
            assert!(r.stdout.contains(cmd), "{shell} completion lacks {cmd}");
        }
    }
    let r = raygate(&["completion", "bash"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("raygate"), "{}", r.stdout);
}

#[test]
fn plugin_without_a_cluster_exits_1_with_the_reason() {
    let new = p(&svc("image-bump"));
    for args in [
        vec!["approve", "chat"],
        vec!["queue", "-A"],
        vec!["explain", "-f", &new],
        vec!["fit", "-f", &new],
    ] {
        let r = plugin(&args);
        assert_eq!(r.code, 1, "{args:?}: {}", r.stderr);
        assert!(
            r.stderr.starts_with("kubectl-raygate: "),
            "{args:?}: {}",
            r.stderr
        );
        assert!(r.stderr.contains("config"), "{args:?}: {}", r.stderr);
    }
    let help = plugin(&["--help"]);
    assert_eq!(help.code, 0);
    assert!(
        help.stdout.contains("Usage: kubectl raygate"),
        "{}",
        help.stdout
    );
    assert!(help.stdout.contains("Exit codes"), "{}", help.stdout);
}

/// `raygate release` takes exactly one scope and refuses an empty namespace name before it
/// reaches a cluster: `--except-namespace=` from a broken template would release everything.
#[test]
fn release_takes_one_scope_and_refuses_empty_namespace_names() {
    for args in [
        vec!["release"],
        vec!["release", "--all", "--except-namespace=a"],
        vec!["release", "-n", "a", "--except-namespace=b"],
    ] {
        let r = raygate(&args);
        assert_eq!(r.code, 2, "{args:?}: {}", r.stderr);
    }
    for (flag, arg) in [
        ("--except-namespace", "--except-namespace="),
        ("--namespace", "--namespace=a,"),
    ] {
        let r = raygate(&["release", arg]);
        assert_eq!(r.code, 1, "{arg}: {}", r.stderr);
        assert!(
            r.stderr.contains(flag) && r.stderr.contains("empty namespace name"),
            "{arg}: {}",
            r.stderr
        );
    }
}

/// A cluster that does not answer: exit 4, and the message names the server
/// (not just `ServiceError: client error (Connect)`).
#[test]
fn an_unreachable_cluster_is_named_by_its_server() {
    let dir = tempfile::tempdir().expect("tempdir");
    // Port 9 (discard) on loopback: nothing listens, the connection is refused at once.
    let kubeconfig = tmp_file(
        &dir,
        "kubeconfig",
        b"apiVersion: v1
kind: Config
clusters:
- name: gone
  cluster: {server: \"https://127.0.0.1:9\", insecure-skip-tls-verify: true}
users:
- name: u
  user: {token: t}
contexts:
- name: gone
  context: {cluster: gone, user: u, namespace: llm}
current-context: gone
",
    );
    for args in [vec!["queue"], vec!["approve", "chat"]] {
        let out = Command::new(PLUGIN)
            .args(&args)
            .arg("--kubeconfig")
            .arg(&kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .output()
            .expect("run kubectl-raygate");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(4), "{args:?}: {stderr}");
        assert!(
            stderr.starts_with(
                "kubectl-raygate: cannot reach the Kubernetes API server at https://127.0.0.1:9/: "
            ),
            "{args:?}: {stderr}"
        );
        assert!(stderr.contains("onnect"), "{args:?}: the cause: {stderr}");
    }
    // `raygate release` (run by hand or by the chart's hooks) too.
    let r = raygate(&["release", "-n", "llm", "--kubeconfig", &p(&kubeconfig)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stderr.starts_with(
            "raygate: cannot reach the Kubernetes API server at https://127.0.0.1:9/: "
        ),
        "{}",
        r.stderr
    );
}

/// `./e2e/demo --keep` says `source DIR/env`: afterwards `kubectl raygate` must be
/// found (the plugin is in a `target-<hash>` directory nobody has on PATH).
#[test]
fn the_demo_env_file_puts_the_plugin_on_path() {
    let dir = tempfile::tempdir().expect("tempdir");
    let env = tmp_file(&dir, "env", b"export KUBECONFIG='/tmp/x/kubeconfig'\n");
    let bin_dir = Path::new(PLUGIN).parent().expect("the plugin's directory");
    let lib = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/lib/demo-env.sh");
    for _ in 0..2 {
        let out = Command::new("bash")
            .arg("-c")
            .arg(r#"source "$0"; demo_env_add_bins "$1" "$2""#)
            .arg(&lib)
            .arg(&env)
            .arg(bin_dir)
            .output()
            .expect("bash");
        assert!(out.status.success(), "{out:?}");
    }
    let text = std::fs::read_to_string(&env).expect("env");
    assert_eq!(
        text.matches("export PATH=").count(),
        1,
        "added once:\n{text}"
    );
    let out = Command::new("bash")
        .arg("-c")
        .arg(r#"PATH=/usr/bin:/bin; source "$0"; command -v kubectl-raygate; command -v raygate"#)
        .arg(&env)
        .output()
        .expect("bash");
    let found = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        found.lines().collect::<Vec<_>>(),
        [PLUGIN, BIN],
        "{text}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And the demo uses it, telling the user.
    let demo = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/demo"))
        .expect("e2e/demo");
    assert!(demo.contains(r#"demo_env_add_bins "$dir/env" "$bin""#));
    assert!(demo.contains("kubectl raygate + raygate on PATH"));
}
