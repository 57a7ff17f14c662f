//! CEL device selectors, evaluated with the `cel` crate over the variables kube-scheduler
//! gives them (`k8s.io/dynamic-resource-allocation/cel`): `device.driver`,
//! `device.attributes[domain][name]`, `device.capacity[domain][name]`,
//! `device.allowMultipleAllocations`. As there, an attribute without a domain takes the
//! driver's, and an unknown domain is an empty map (so `device.attributes["x"].y` is a
//! "no such key" error, not false).
//!
//! Not evaluated (the request is [`Undecided`]): what the crate does not know, above all
//! Kubernetes' `quantity()` and `semver()` libraries, so capacity comparisons and version
//! attributes; and any runtime error, which kube-scheduler reports as an error of the whole
//! scheduling attempt.

use std::collections::HashMap;

use cel::{Context, Program, Value};

use super::{AttrValue, Device, Undecided, Verdicts};

/// Compiled selectors, by expression text: compiled once per fit; their verdicts kept
/// across fits in the state's [`Verdicts`].
#[derive(Default)]
pub struct Selectors {
    verdicts: Verdicts,
    compiled: HashMap<String, Result<Program, String>>,
    /// (expression, domain literals it names), for the empty-map default.
    domains: HashMap<String, Vec<String>>,
}

impl std::fmt::Debug for Selectors {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Selectors")
            .field("compiled", &self.compiled.len())
            .finish()
    }
}

/// The string literals of an expression that could be attribute domains.
fn literals(expr: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = expr;
    while let Some(start) = rest.find('"') {
        let after = &rest[start + 1..];
        let Some(end) = after.find('"') else { break };
        out.push(after[..end].to_string());
        rest = &after[end + 1..];
    }
    out
}

fn split_name<'a>(name: &'a str, driver: &'a str) -> (&'a str, &'a str) {
    match name.split_once('/') {
        Some((domain, id)) => (domain, id),
        None => (driver, name),
    }
}

fn value_of(a: &AttrValue) -> Value {
    match a {
        AttrValue::Bool(b) => Value::Bool(*b),
        AttrValue::Int(i) => Value::Int(*i),
        AttrValue::Str(s) | AttrValue::Version(s) => Value::String(s.clone().into()),
    }
}

impl Selectors {
    /// Selectors whose verdicts go to (and come from) `verdicts`.
    pub fn with(verdicts: Verdicts) -> Selectors {
        Selectors {
            verdicts,
            ..Default::default()
        }
    }

    /// Whether `device` of `driver` passes the selector `expr`: a verdict an earlier fit
    /// reached, else evaluated.
    pub fn matches(
        &mut self,
        expr: &str,
        driver: &str,
        device: &Device,
    ) -> Result<bool, Undecided> {
        let key = {
            use std::hash::{Hash, Hasher};
            let mut h = std::collections::hash_map::DefaultHasher::new();
            (expr, driver, device.fingerprint).hash(&mut h);
            h.finish()
        };
        if let Some(v) = self.verdicts.get(key) {
            return v;
        }
        let v = self.evaluate(expr, driver, device);
        self.verdicts.put(key, v.clone());
        v
    }

    fn evaluate(&mut self, expr: &str, driver: &str, device: &Device) -> Result<bool, Undecided> {
        let program = self
            .compiled
            .entry(expr.to_string())
            .or_insert_with(|| Program::compile(expr).map_err(|e| e.to_string()));
        let program = match program {
            Ok(p) => p,
            Err(e) => {
                return Err(Undecided(format!(
                    "selector {expr:?} is not supported by raygate's CEL: {e}"
                )));
            }
        };
        if let Some(AttrValue::Version(_)) = device
            .attributes
            .values()
            .find(|v| matches!(v, AttrValue::Version(_)))
            && expr.contains("semver")
        {
            return Err(Undecided(format!(
                "selector {expr:?} compares versions (semver), which raygate does not evaluate"
            )));
        }
        let domains = self
            .domains
            .entry(expr.to_string())
            .or_insert_with(|| literals(expr));
        let mut attributes: HashMap<String, HashMap<String, Value>> = HashMap::new();
        for (name, v) in &device.attributes {
            let (domain, id) = split_name(name, driver);
            attributes
                .entry(domain.to_string())
                .or_default()
                .insert(id.to_string(), value_of(v));
        }
        let mut capacity: HashMap<String, HashMap<String, Value>> = HashMap::new();
        for name in &device.capacity {
            let (domain, id) = split_name(name, driver);
            // A quantity: raygate has no `quantity()`; comparing it fails below as unsupported.
            capacity
                .entry(domain.to_string())
                .or_default()
                .insert(id.to_string(), Value::Null);
        }
        for d in domains.iter() {
            attributes.entry(d.clone()).or_default();
            capacity.entry(d.clone()).or_default();
        }
        let to_map = |m: HashMap<String, HashMap<String, Value>>| -> Value {
            let outer: HashMap<String, Value> =
                m.into_iter().map(|(k, v)| (k, Value::from(v))).collect();
            Value::from(outer)
        };
        let mut dev: HashMap<String, Value> = HashMap::new();
        dev.insert("driver".into(), Value::String(driver.to_string().into()));
        dev.insert("attributes".into(), to_map(attributes));
        dev.insert("capacity".into(), to_map(capacity));
        dev.insert("allowMultipleAllocations".into(), Value::Bool(false));
        let mut ctx = Context::default();
        ctx.add_variable_from_value("device", dev);
        match program.execute(&ctx) {
            Ok(Value::Bool(b)) => Ok(b),
            Ok(other) => Err(Undecided(format!(
                "selector {expr:?} gave {other:?}, not a bool"
            ))),
            Err(e) => Err(Undecided(format!(
                "selector {expr:?} on device {}: {e}",
                device.name
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn dev(attrs: &[(&str, AttrValue)]) -> Device {
        Device {
            name: "gpu-0".into(),
            attributes: attrs
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect::<BTreeMap<_, _>>(),
            capacity: BTreeSet::from(["memory".to_string()]),
            unmodeled: None,
            fingerprint: 0,
        }
    }

    #[test]
    fn the_common_forms_evaluate_as_kubernetes_does() {
        let mut s = Selectors::default();
        let d = dev(&[
            ("productName", AttrValue::Str("H100".into())),
            ("other.example.com/numa", AttrValue::Int(1)),
            ("index", AttrValue::Int(3)),
        ]);
        let drv = "gpu.example.com";
        let yes = [
            r#"device.driver == "gpu.example.com""#,
            r#"device.attributes["gpu.example.com"].productName == "H100""#,
            r#"device.attributes["gpu.example.com"].index >= 2"#,
            r#"device.attributes["other.example.com"].numa == 1"#,
            r#""productName" in device.attributes["gpu.example.com"]"#,
            r#"!("x" in device.attributes["unknown.example.com"])"#,
        ];
        for e in yes {
            assert_eq!(s.matches(e, drv, &d), Ok(true), "{e}");
        }
        let no = [
            r#"device.driver == "other""#,
            r#"device.attributes["gpu.example.com"].productName == "A100""#,
        ];
        for e in no {
            assert_eq!(s.matches(e, drv, &d), Ok(false), "{e}");
        }
        // Kubernetes: an unknown domain is an empty map, a missing key an error.
        for e in [
            r#"device.attributes["unknown.example.com"].x == "y""#,
            r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("10Gi")) >= 0"#,
            r#"device.driver =="#,
            r#"device.driver"#,
        ] {
            assert!(s.matches(e, drv, &d).is_err(), "{e}");
        }
    }
}
