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
//!
//! Verdicts are kept across decisions ([`Verdicts`]). A selector whose syntax tree reads
//! nothing of a device but its driver and named attributes
//! (`device.attributes["d"].name`, `device.attributes["d"]["name"]`, `has(...)` of them)
//! has one verdict per (driver, values of those attributes): `device.driver == "x"` is
//! evaluated once for all of a driver's devices, not once per device. Any other use of
//! `device` (a whole attribute map, capacity, a variable named `device`) is keyed by the
//! whole device, as are errors (their text names the device).

use std::collections::HashMap;

use cel::common::ast::{EntryExpr, Expr, LiteralValue};
use cel::{Context, IdedExpr, Program, Value};

use super::{AttrValue, Device, Undecided, Verdicts};

/// What a selector reads of a device, from its syntax tree.
#[derive(Clone, Debug, PartialEq)]
enum Reads {
    /// The driver and these attributes (domain, name) only.
    Attributes(Vec<(String, String)>),
    /// Anything of it.
    Device,
}

/// Compiled selectors, by expression text: compiled once per fit; their verdicts kept
/// across fits in the state's [`Verdicts`].
#[derive(Default)]
pub struct Selectors {
    verdicts: Verdicts,
    compiled: HashMap<String, Result<(Program, Reads), String>>,
    /// (expression, domain literals it names), for the empty-map default.
    domains: HashMap<String, Vec<String>>,
    /// The standard functions, registered once per fit: each evaluation adds `device` in
    /// a scope of its own.
    root: Option<Context<'static, 'static>>,
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

fn is_device(e: &IdedExpr) -> bool {
    matches!(&e.expr, Expr::Ident(n) if n == "device")
}

fn string_literal(e: &IdedExpr) -> Option<String> {
    match &e.expr {
        Expr::Literal(LiteralValue::String(s)) => Some(s.inner().to_string()),
        _ => None,
    }
}

/// `a[b]`: (a, b).
fn index(e: &IdedExpr) -> Option<(&IdedExpr, &IdedExpr)> {
    match &e.expr {
        Expr::Call(c) if c.func_name == "_[_]" && c.target.is_none() && c.args.len() == 2 => {
            Some((&c.args[0], &c.args[1]))
        }
        _ => None,
    }
}

/// `device.attributes["domain"].name`, `device.attributes["domain"]["name"]` (and
/// `has()` of the first): (domain, name).
fn attribute_read(e: &IdedExpr) -> Option<(String, String)> {
    let (map, name) = match &e.expr {
        Expr::Select(s) => (&*s.operand, s.field.clone()),
        _ => {
            let (map, name) = index(e)?;
            (map, string_literal(name)?)
        }
    };
    let (attributes, domain) = index(map)?;
    match &attributes.expr {
        Expr::Select(s) if !s.test && s.field == "attributes" && is_device(&s.operand) => {
            Some((string_literal(domain)?, name))
        }
        _ => None,
    }
}

/// Collects the attributes `e` reads into `out`; false when it uses `device` otherwise.
fn walk(e: &IdedExpr, out: &mut Vec<(String, String)>) -> bool {
    if let Some(read) = attribute_read(e) {
        out.push(read);
        return true;
    }
    fn all<'e>(
        es: impl IntoIterator<Item = &'e IdedExpr>,
        out: &mut Vec<(String, String)>,
    ) -> bool {
        es.into_iter().all(|x| walk(x, out))
    }
    match &e.expr {
        Expr::Unspecified | Expr::Literal(_) => true,
        Expr::Ident(n) => n != "device",
        Expr::Select(s) if is_device(&s.operand) => {
            // Both are the same for every device of a driver.
            !s.test && matches!(s.field.as_str(), "driver" | "allowMultipleAllocations")
        }
        Expr::Select(s) => walk(&s.operand, out),
        Expr::Call(c) => all(c.target.iter().map(|t| &**t).chain(&c.args), out),
        Expr::Comprehension(c) => {
            let binds_device = c.iter_var == "device"
                || c.iter_var2.as_deref() == Some("device")
                || c.accu_var == "device";
            !binds_device
                && all(
                    [
                        &c.iter_range,
                        &c.accu_init,
                        &c.loop_cond,
                        &c.loop_step,
                        &c.result,
                    ],
                    out,
                )
        }
        Expr::List(l) => all(&l.elements, out),
        Expr::Map(m) => m.entries.iter().all(|x| entry(&x.expr, out)),
        Expr::Struct(st) => st.entries.iter().all(|x| entry(&x.expr, out)),
    }
}

fn entry(e: &EntryExpr, out: &mut Vec<(String, String)>) -> bool {
    match e {
        EntryExpr::MapEntry(m) => walk(&m.key, out) && walk(&m.value, out),
        EntryExpr::StructField(f) => walk(&f.value, out),
    }
}

/// What `program` (of `expr`) reads of a device.
fn reads(expr: &str, program: &Program) -> Reads {
    // A version attribute anywhere on the device refuses a `semver` selector.
    if expr.contains("semver") {
        return Reads::Device;
    }
    let mut out = Vec::new();
    if walk(program.expression(), &mut out) {
        out.sort();
        out.dedup();
        Reads::Attributes(out)
    } else {
        Reads::Device
    }
}

/// The value of attribute (domain, name) of `device` as the evaluation sees it (the last
/// published name that resolves to it).
fn attribute<'d>(
    device: &'d Device,
    driver: &str,
    domain: &str,
    name: &str,
) -> Option<&'d AttrValue> {
    device
        .attributes
        .iter()
        .rev()
        .find(|(k, _)| split_name(k, driver) == (domain, name))
        .map(|(_, v)| v)
}

fn hash_of(x: impl std::hash::Hash) -> u64 {
    use std::hash::Hasher;
    let mut h = std::collections::hash_map::DefaultHasher::new();
    x.hash(&mut h);
    h.finish()
}

impl Selectors {
    /// Selectors whose verdicts go to (and come from) `verdicts`.
    pub fn with(verdicts: Verdicts) -> Selectors {
        Selectors {
            verdicts,
            ..Default::default()
        }
    }

    fn compiled(&mut self, expr: &str) -> Option<&Result<(Program, Reads), String>> {
        // Looked up without building a key: this runs once per device and selector.
        if !self.compiled.contains_key(expr) {
            let c = Program::compile(expr).map_err(|e| e.to_string()).map(|p| {
                let r = reads(expr, &p);
                (p, r)
            });
            self.compiled.insert(expr.to_string(), c);
        }
        self.compiled.get(expr)
    }

    /// Whether `device` of `driver` passes the selector `expr`: a verdict an earlier fit
    /// reached (on this device, or on one with the same values of what the selector
    /// reads), else evaluated.
    pub fn matches(
        &mut self,
        expr: &str,
        driver: &str,
        device: &Device,
    ) -> Result<bool, Undecided> {
        let shared = match self.compiled(expr) {
            Some(Ok((_, Reads::Attributes(read)))) => {
                let values: Vec<Option<&AttrValue>> = read
                    .iter()
                    .map(|(d, n)| attribute(device, driver, d, n))
                    .collect();
                Some(hash_of(("reads", expr, driver, values)))
            }
            _ => None,
        };
        if let Some(Ok(v)) = shared.and_then(|k| self.verdicts.get(k)) {
            return Ok(v);
        }
        let key = hash_of((expr, driver, device.fingerprint));
        if let Some(v) = self.verdicts.get(key) {
            return v;
        }
        let v = self.evaluate(expr, driver, device);
        match (&v, shared) {
            // Errors name the device: kept for it alone.
            (Ok(_), Some(k)) => self.verdicts.put(k, v.clone()),
            _ => self.verdicts.put(key, v.clone()),
        }
        v
    }

    /// `expr` on `device`, evaluated (no verdict kept).
    fn evaluate(&mut self, expr: &str, driver: &str, device: &Device) -> Result<bool, Undecided> {
        if let Some(Err(e)) = self.compiled(expr) {
            return Err(Undecided(format!(
                "selector {expr:?} is not supported by raygate's CEL: {e}"
            )));
        }
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
        let root = self.root.get_or_insert_with(Context::default);
        let mut ctx = root.new_inner_scope();
        ctx.add_variable_from_value("device", dev);
        let Some(Ok((program, _))) = self.compiled.get(expr) else {
            return Err(Undecided(format!("selector {expr:?} was not compiled")));
        };
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
    use proptest::prelude::any;
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
    fn what_a_selector_reads_is_found_in_its_syntax_tree() {
        let r = |e: &str| reads(e, &Program::compile(e).unwrap());
        let attrs = |v: &[(&str, &str)]| {
            Reads::Attributes(
                v.iter()
                    .map(|(d, n)| (d.to_string(), n.to_string()))
                    .collect(),
            )
        };
        assert_eq!(r(r#"device.driver == "gpu.example.com""#), attrs(&[]));
        assert_eq!(
            r(
                r#"device.attributes["gpu.example.com"].productName == "H100" && device.attributes["x.io"]["numa"] == 1"#
            ),
            attrs(&[("gpu.example.com", "productName"), ("x.io", "numa")])
        );
        assert_eq!(
            r(r#"has(device.attributes["d.io"].a)"#),
            attrs(&[("d.io", "a")])
        );
        for whole in [
            r#""productName" in device.attributes["gpu.example.com"]"#,
            r#"device.capacity["gpu.example.com"].memory.compareTo(quantity("1Gi")) > 0"#,
            r#"device.attributes["gpu.example.com"].v.isGreaterThan(semver("1.0.0"))"#,
            r#"[1].all(device, device > 0)"#,
            r#"device == {}"#,
            r#"device.attributes[device.driver].x == 1"#,
        ] {
            assert_eq!(r(whole), Reads::Device, "{whole}");
        }
    }

    proptest::proptest! {
        /// A verdict shared between devices that agree on what the selector reads is the
        /// verdict evaluated on each device alone.
        #[test]
        fn a_shared_verdict_is_the_devices_own(
            devices in proptest::collection::vec(
                (0usize..3, proptest::option::of(0i64..3), proptest::option::of(0usize..2), any::<bool>()),
                1..12,
            ),
        ) {
            const EXPRS: [&str; 7] = [
                r#"device.driver == "gpu.example.com""#,
                r#"device.attributes["gpu.example.com"].productName == "H100""#,
                r#"device.attributes["gpu.example.com"].index % 2 == 0"#,
                r#"has(device.attributes["gpu.example.com"].index) && device.attributes["other.io"].numa == 1"#,
                r#"device.attributes["gpu.example.com"]["productName"].startsWith("H")"#,
                r#""index" in device.attributes["gpu.example.com"]"#,
                r#"device.attributes["other.io"].numa > 0 || device.driver != "gpu.example.com""#,
            ];
            let mut shared = Selectors::default();
            for (i, (product, index, numa, qualified)) in devices.into_iter().enumerate() {
                let mut attrs: Vec<(&str, AttrValue)> =
                    vec![("productName", AttrValue::Str(["H100", "A100", "H200"][product].into()))];
                if let Some(x) = index {
                    attrs.push((if qualified { "gpu.example.com/index" } else { "index" }, AttrValue::Int(x)));
                }
                if let Some(n) = numa {
                    attrs.push(("other.io/numa", AttrValue::Int(n as i64)));
                }
                let mut d = dev(&attrs);
                d.name = format!("gpu-{i}");
                d.fingerprint = Device::fingerprint_of(&d.name, &d.attributes, &d.capacity);
                for e in EXPRS {
                    for drv in ["gpu.example.com", "other.example.com"] {
                        let alone = Selectors::default().evaluate(e, drv, &d);
                        proptest::prop_assert_eq!(shared.matches(e, drv, &d), alone, "{} on {:?}", e, d);
                    }
                }
            }
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
