//! What a new user meets first, checked where they meet it (issue 32): the README's
//! first screen, the values table against the chart's defaults, and what the demo
//! builds on an empty machine.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(rel: &str) -> String {
    std::fs::read_to_string(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"))
}

/// Item 11: before any CI timing, the README says what raygate is and gives the two
/// commands.
#[test]
fn readme_first_screen_says_what_raygate_is_then_the_two_commands() {
    let readme = read("README.md");
    let at = |what: &str| {
        readme
            .find(what)
            .unwrap_or_else(|| panic!("README.md lacks {what:?}"))
    };
    let is = at("raygate is a Kubernetes operator");
    let demo = at("./e2e/demo ");
    let tests = at("./e2e/run-tests ");
    let first_timing = [" min ", "CI run", " s and "]
        .iter()
        .filter_map(|t| readme.find(t))
        .min()
        .unwrap_or(readme.len());
    assert!(
        is < demo && demo < tests && tests < first_timing,
        "what raygate is ({is}), ./e2e/demo ({demo}), ./e2e/run-tests ({tests}) must come before \
         the first timing ({first_timing})"
    );
    // The first screen: about 25 lines.
    let first_screen: String = readme.lines().take(25).collect::<Vec<_>>().join("\n");
    for what in [
        "raygate is a Kubernetes operator",
        "./e2e/demo",
        "./e2e/run-tests",
    ] {
        assert!(
            first_screen.contains(what),
            "{what} not in:\n{first_screen}"
        );
    }
}

/// Item 1: the chart's default `maxPriority` caps every namespace; the README's values
/// table says so with the default as `values.yaml` has it, and the UpgradePlan example
/// that sets `priority: 10` says it is capped.
#[test]
fn readme_values_table_states_the_default_priority_ceiling() {
    let values = read("charts/raygate/values.yaml");
    let default = values
        .lines()
        .find_map(|l| l.strip_prefix("maxPriority: "))
        .expect("values.yaml sets maxPriority")
        .trim()
        .to_string();
    let readme = read("README.md");
    let row = readme
        .lines()
        .find(|l| l.starts_with("| `maxPriority` |"))
        .expect("README.md's values table has maxPriority");
    assert!(
        row.contains(&format!("`{default}`")),
        "the README's maxPriority row must state the chart's default {default}: {row}"
    );
    let example = readme
        .lines()
        .skip_while(|l| !l.contains("priority: 10"))
        .take(2)
        .collect::<Vec<_>>()
        .join("\n");
    assert!(example.contains("maxPriority"), "{example}");
    let chart_readme = read("charts/raygate/README.md");
    assert!(
        chart_readme.contains(&format!("| `maxPriority` | `{default}` |")),
        "charts/raygate/README.md's maxPriority row must state {default}"
    );
}

/// Item 11: `e2e/demo` builds only what it runs: Kubernetes, etcd, kwok and one KubeRay
/// release; Karpenter only with `--autoscale`. Run on a copy whose `e2e/setup` records
/// its arguments and stops the demo there.
#[test]
fn the_demo_builds_only_what_it_runs() {
    let dir = tempfile::tempdir().unwrap();
    let e2e = dir.path().join("e2e");
    std::fs::create_dir(&e2e).unwrap();
    std::fs::copy(root().join("e2e/demo"), e2e.join("demo")).unwrap();
    let record = dir.path().join("setup-args");
    let setup = e2e.join("setup");
    std::fs::write(
        &setup,
        format!(
            "#!/usr/bin/env bash\necho \"$*\" > '{}'\nexit 7\n",
            record.display()
        ),
    )
    .unwrap();
    chmod_x(&setup);
    chmod_x(&e2e.join("demo"));
    let built = |args: &[&str]| -> String {
        let out = Command::new(e2e.join("demo"))
            .args(args)
            .env("RAYGATE_DEMO_DIR", dir.path().join("demo"))
            .env_remove("RAYGATE_KUBERAY_VERSION")
            .output()
            .expect("run the demo copy");
        assert_eq!(
            out.status.code(),
            Some(7),
            "the demo stops where its setup fails: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::fs::read_to_string(&record).unwrap().trim().to_string()
    };
    assert_eq!(built(&[]), "kubernetes etcd kwok kuberay-v1.6.2");
    assert_eq!(
        built(&["--autoscale"]),
        "kubernetes etcd kwok kuberay-v1.6.2 karpenter"
    );
}

fn chmod_x(p: &Path) {
    use std::os::unix::fs::PermissionsExt;
    let mut perm = std::fs::metadata(p).unwrap().permissions();
    perm.set_mode(0o755);
    std::fs::set_permissions(p, perm).unwrap();
}

/// Item 12: `explain` exits 0 when it prints an `ERROR:` line; the README says so and
/// how a PR check fails on it (the script's own exit 4).
#[test]
fn readme_says_how_explain_errors_fail_a_check() {
    let readme = read("README.md");
    assert!(
        readme
            .contains("`ERROR:` line and in `errors` of `-o json` (`fit` too), and still exits 0"),
        "README.md must say explain exits 0 with an ERROR: line"
    );
    let script = read("docs/examples/raygate-pr-check.sh");
    assert!(
        script.contains("(.errors // [])[]"),
        "the PR check reads errors"
    );
    assert!(script.contains("exit 4"), "and fails on them");
}
