//! Validation of `PUT /api/serve/applications/` bodies, following Ray Serve's
//! `ServeDeploySchema` (pydantic): what Ray refuses with 400, we refuse with 400, so a bad
//! `serveConfigV2` shows up in KubeRay exactly as it would against Ray.

use serde_json::{Map, Value};
use std::collections::BTreeSet;

/// Top-level fields `ServeDeploySchema` knows (it forbids any other).
const TOP_LEVEL: [&str; 6] = [
    "proxy_location",
    "http_options",
    "grpc_options",
    "logging_config",
    "applications",
    "target_capacity",
];

/// Ray's default application name and route prefix (`SERVE_DEFAULT_APP_NAME`, `"/"`).
pub const DEFAULT_APP_NAME: &str = "default";
pub const DEFAULT_ROUTE_PREFIX: &str = "/";

/// One application of a validated config.
#[derive(Clone, Debug, PartialEq)]
pub struct AppSpec {
    pub name: String,
    pub route_prefix: Option<String>,
    pub import_path: String,
    pub deployments: Vec<String>,
    /// The application object exactly as submitted (Ray reports it as `deployed_app_config`).
    pub config: Value,
}

#[derive(Clone, Debug, PartialEq)]
pub struct DeploySpec {
    pub apps: Vec<AppSpec>,
    pub target_capacity: Option<f64>,
    pub proxy_location: Option<String>,
}

fn err(loc: &str, msg: &str) -> String {
    format!("1 validation error for ServeDeploySchema\n{loc}\n  {msg}")
}

/// Checks a parsed body like `ServeDeploySchema.parse_obj` does; `Err` is the 400 text.
pub fn validate(body: &Value) -> Result<DeploySpec, String> {
    let top = body.as_object().ok_or_else(|| {
        err(
            "__root__",
            "value is not a valid dict (type=type_error.dict)",
        )
    })?;
    if let Some(extra) = top.keys().find(|k| !TOP_LEVEL.contains(&k.as_str())) {
        return Err(err(
            extra,
            "extra fields not permitted (type=value_error.extra)",
        ));
    }
    let target_capacity = match top.get("target_capacity") {
        None | Some(Value::Null) => None,
        Some(v) => match v.as_f64() {
            Some(t) if (0.0..=100.0).contains(&t) => Some(t),
            _ => {
                return Err(err(
                    "target_capacity",
                    "target_capacity must be a number between 0 and 100",
                ));
            }
        },
    };
    let proxy_location = match top.get("proxy_location") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) if ["Disabled", "HeadOnly", "EveryNode"].contains(&s.as_str()) => {
            Some(s.clone())
        }
        Some(_) => {
            return Err(err(
                "proxy_location",
                "value is not a valid enumeration member; permitted: 'Disabled', 'HeadOnly', 'EveryNode'",
            ));
        }
    };
    let list = match top.get("applications") {
        None => {
            return Err(err(
                "applications",
                "field required (type=value_error.missing)",
            ));
        }
        Some(Value::Array(a)) => a,
        Some(_) => {
            return Err(err(
                "applications",
                "value is not a valid list (type=type_error.list)",
            ));
        }
    };
    let mut apps = Vec::with_capacity(list.len());
    let mut names = BTreeSet::new();
    let mut prefixes = BTreeSet::new();
    for (i, app) in list.iter().enumerate() {
        let spec = validate_app(i, app)?;
        if !names.insert(spec.name.clone()) {
            return Err(err(
                "__root__",
                &format!(
                    "App names must be unique, found duplicate name: {:?}",
                    spec.name
                ),
            ));
        }
        if let Some(p) = &spec.route_prefix
            && !prefixes.insert(p.clone())
        {
            return Err(err(
                "__root__",
                &format!("Found duplicate applications for route prefix {p:?}"),
            ));
        }
        apps.push(spec);
    }
    Ok(DeploySpec {
        apps,
        target_capacity,
        proxy_location,
    })
}

fn validate_app(i: usize, app: &Value) -> Result<AppSpec, String> {
    let loc = |field: &str| format!("applications -> {i} -> {field}");
    let obj: &Map<String, Value> = app
        .as_object()
        .ok_or_else(|| err(&format!("applications -> {i}"), "value is not a valid dict"))?;
    let name = match obj.get("name") {
        None => DEFAULT_APP_NAME.to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err(err(&loc("name"), "str type expected (type=type_error.str)")),
    };
    let route_prefix = match obj.get("route_prefix") {
        None => Some(DEFAULT_ROUTE_PREFIX.to_string()),
        Some(Value::Null) => None,
        Some(Value::String(s)) => {
            check_route_prefix(s).map_err(|m| err(&loc("route_prefix"), &m))?;
            Some(s.clone())
        }
        Some(_) => return Err(err(&loc("route_prefix"), "str type expected")),
    };
    let import_path = match obj.get("import_path") {
        None => {
            return Err(err(
                &loc("import_path"),
                "field required (type=value_error.missing)",
            ));
        }
        Some(Value::String(s)) => {
            check_import_path(s).map_err(|m| err(&loc("import_path"), &m))?;
            s.clone()
        }
        Some(_) => return Err(err(&loc("import_path"), "str type expected")),
    };
    let deployments = match obj.get("deployments") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(ds)) => {
            let mut names = Vec::with_capacity(ds.len());
            for (j, d) in ds.iter().enumerate() {
                match d.get("name") {
                    Some(Value::String(n)) => names.push(n.clone()),
                    _ => {
                        return Err(err(
                            &loc(&format!("deployments -> {j} -> name")),
                            "field required (type=value_error.missing)",
                        ));
                    }
                }
            }
            names
        }
        Some(_) => return Err(err(&loc("deployments"), "value is not a valid list")),
    };
    Ok(AppSpec {
        name,
        route_prefix,
        import_path,
        deployments,
        config: app.clone(),
    })
}

/// Ray's `_route_prefix_format`.
fn check_route_prefix(p: &str) -> Result<(), String> {
    if !p.starts_with('/') {
        return Err(format!(
            "Got \"{p}\" for route_prefix. Route prefix must start with \"/\"."
        ));
    }
    if p.len() > 1 && p.ends_with('/') {
        return Err(format!(
            "Got \"{p}\" for route_prefix. Route prefix cannot end with \"/\" unless it's the root."
        ));
    }
    if p.contains('{') || p.contains('}') {
        return Err(format!(
            "Got \"{p}\" for route_prefix. Route prefix cannot contain wildcards."
        ));
    }
    Ok(())
}

/// Ray's `import_path_format_valid`: `module.attr` or `module:attr`, no leading/trailing separator.
fn check_import_path(p: &str) -> Result<(), String> {
    let sep = if p.contains(':') { ':' } else { '.' };
    if p.matches(sep).count() < 1 {
        return Err(format!(
            "Got invalid import path \"{p}\". An import path must contain at least on dot or colon separating the module (and potentially submodules) from the deployment graph. E.g.: \"module.deployment_graph\"."
        ));
    }
    if sep == ':' && p.matches(':').count() > 1 {
        return Err(format!(
            "Got invalid import path \"{p}\". An import path may have at most one colon."
        ));
    }
    if p.starts_with(sep) || p.ends_with(sep) {
        return Err(format!(
            "Got invalid import path \"{p}\". An import path may not start or end with a {}.",
            if sep == ':' { "colon" } else { "dot" }
        ));
    }
    Ok(())
}

/// The deployment names Ray would report when the config lists none: the ingress is named after
/// the bound object of the import path (`module:app` -> `app`).
pub fn implicit_deployment(import_path: &str) -> String {
    import_path
        .rsplit([':', '.'])
        .next()
        .unwrap_or(import_path)
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn accepts_what_kuberay_sends() {
        let body = json!({
            "applications": [
                {"name": "fruit_app", "import_path": "fruit.deployment_graph", "route_prefix": "/fruit",
                 "runtime_env": {"working_dir": "https://example.invalid/x.zip"},
                 "deployments": [{"name": "MangoStand", "num_replicas": 1}, {"name": "FruitMarket"}]},
                {"import_path": "math:app"}
            ],
            "target_capacity": 50
        });
        let spec = validate(&body).expect("valid");
        assert_eq!(spec.apps.len(), 2);
        assert_eq!(spec.apps[0].deployments, ["MangoStand", "FruitMarket"]);
        assert_eq!(spec.apps[1].name, "default");
        assert_eq!(spec.apps[1].route_prefix.as_deref(), Some("/"));
        assert_eq!(spec.target_capacity, Some(50.0));
    }

    #[test]
    fn refuses_like_pydantic() {
        let cases = [
            (json!([]), "valid dict"),
            (json!({}), "applications\n  field required"),
            (
                json!({"applications": [], "bogus": 1}),
                "bogus\n  extra fields",
            ),
            (
                json!({"applications": [{"name": "a"}]}),
                "import_path\n  field required",
            ),
            (
                json!({"applications": [{"import_path": "nodot"}]}),
                "invalid import path",
            ),
            (
                json!({"applications": [{"import_path": "a.b", "route_prefix": "x"}]}),
                "must start",
            ),
            (
                json!({"applications": [{"import_path": "a.b", "route_prefix": "/x/"}]}),
                "cannot end",
            ),
            (
                json!({"applications": [{"import_path": "a.b"}, {"import_path": "c.d"}]}),
                "unique",
            ),
            (
                json!({"applications": [{"name": "a", "import_path": "a.b"}, {"name": "b", "import_path": "c.d"}]}),
                "duplicate applications for route prefix",
            ),
            (
                json!({"applications": [], "target_capacity": 101}),
                "between 0 and 100",
            ),
            (
                json!({"applications": [{"import_path": "a.b", "deployments": [{}]}]}),
                "deployments -> 0 -> name",
            ),
        ];
        for (body, want) in cases {
            let e = validate(&body).expect_err(&body.to_string());
            assert!(e.contains(want), "{body}: {e}");
        }
    }

    #[test]
    fn null_route_prefixes_do_not_collide() {
        let body = json!({"applications": [
            {"name": "a", "import_path": "a.b", "route_prefix": null},
            {"name": "b", "import_path": "a.b", "route_prefix": null}]});
        assert!(validate(&body).is_ok());
    }

    #[test]
    fn implicit_deployment_names() {
        assert_eq!(
            implicit_deployment("fruit.deployment_graph"),
            "deployment_graph"
        );
        assert_eq!(implicit_deployment("pkg.mod:app"), "app");
    }
}
