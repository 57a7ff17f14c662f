//! Checks of the generated CRD against what the apiserver accepts without a
//! warning: a format it does not know is dropped with `Warning: unrecognized
//! format` on every `kubectl apply` of the CRD (issue 32, item 10).

use kube::CustomResourceExt;
use serde_json::Value;

use super::UpgradePlan;

/// The formats kube-apiserver v1.36 recognises, per type
/// (`k8s.io/apiextensions-apiserver/pkg/apiserver/validation/formats.go`:
/// `supportedVersionedFormats` for strings, dashes removed before the lookup;
/// `int32`/`int64` for integers; `float`/`double` for numbers). Anything else
/// is stripped and reported as unrecognized.
fn recognised(type_: Option<&str>, format: &str) -> bool {
    const STRING: [&str; 26] = [
        "bsonobjectid",
        "uri",
        "email",
        "hostname",
        "ipv4",
        "ipv6",
        "cidr",
        "mac",
        "uuid",
        "uuid3",
        "uuid4",
        "uuid5",
        "isbn",
        "isbn10",
        "isbn13",
        "creditcard",
        "ssn",
        "hexcolor",
        "rgbcolor",
        "byte",
        "password",
        "date",
        "duration",
        "datetime",
        "k8s-short-name",
        "k8s-long-name",
    ];
    match type_ {
        None | Some("string") => {
            STRING.contains(&format) || STRING.contains(&format.replace('-', "").as_str())
        }
        Some("integer") => matches!(format, "int32" | "int64"),
        Some("number") => matches!(format, "float" | "double"),
        _ => false,
    }
}

/// Every `format` under `v`, with its JSON pointer and the schema's type.
fn formats<'a>(v: &'a Value, at: String, out: &mut Vec<(String, Option<&'a str>, &'a str)>) {
    match v {
        Value::Object(m) => {
            if let Some(Value::String(f)) = m.get("format") {
                out.push((at.clone(), m.get("type").and_then(Value::as_str), f));
            }
            for (k, child) in m {
                formats(child, format!("{at}/{k}"), out);
            }
        }
        Value::Array(a) => {
            for (i, child) in a.iter().enumerate() {
                formats(child, format!("{at}/{i}"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn every_format_in_the_crd_is_one_the_apiserver_recognises() {
    let crd = serde_json::to_value(UpgradePlan::crd()).unwrap();
    let schema = &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"];
    let mut found = vec![];
    formats(schema, String::new(), &mut found);
    assert!(
        found
            .iter()
            .any(|(p, _, f)| p.ends_with("queuePosition") && *f == "int64"),
        "{found:?}"
    );
    let unknown: Vec<_> = found
        .iter()
        .filter(|(_, t, f)| !recognised(*t, f))
        .collect();
    assert!(
        unknown.is_empty(),
        "the apiserver warns `unrecognized format` on: {unknown:?}"
    );
}

/// The committed copies (crds/, the chart, config/) are checked the same way,
/// as text: a hand edit or a stale copy would also warn.
#[test]
fn committed_crd_copies_use_only_recognised_formats() {
    for (path, text) in [
        (
            "crds/raygate.io_upgradeplans.yaml",
            include_str!("../../crds/raygate.io_upgradeplans.yaml"),
        ),
        (
            "charts/raygate/crds/raygate.io_upgradeplans.yaml",
            include_str!("../../charts/raygate/crds/raygate.io_upgradeplans.yaml"),
        ),
        (
            "config/crd/bases/raygate.io_upgradeplans.yaml",
            include_str!("../../config/crd/bases/raygate.io_upgradeplans.yaml"),
        ),
    ] {
        for line in text.lines() {
            if let Some(f) = line.trim().strip_prefix("format: ") {
                assert!(
                    ["int32", "int64", "date-time", "double", "float", "byte"].contains(&f),
                    "{path}: format {f} (kube-apiserver warns on formats it does not know)"
                );
            }
        }
    }
}
