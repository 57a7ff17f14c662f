//! The cluster snapshot the fit runs on.

use k8s_openapi::api::core::v1::{LimitRange, Node};
use k8s_openapi::api::node::v1::RuntimeClass;
use serde_json::Value;

use super::record::{PartialPod, PodRecord, Strings};

mod json;

/// Nodes, pods, LimitRanges and RuntimeClasses, as listed by
/// `kubectl get nodes,pods,limitranges,runtimeclasses -A -o yaml` (as JSON).
#[derive(Clone, Debug, Default)]
pub struct ClusterState {
    pub nodes: Vec<Node>,
    /// Pods as the capacity model reads them.
    pub pods: Vec<PodRecord>,
    pub limit_ranges: Vec<LimitRange>,
    /// For the overhead RuntimeClass admission gives pods not created yet.
    pub runtime_classes: Vec<RuntimeClass>,
    /// ResourceSlices, DeviceClasses, ResourceClaims and ResourceClaimTemplates.
    pub dra: super::dra::DraState,
    /// Kueue's ClusterQueues, LocalQueues and raygate's reservation
    /// Workloads (`kueue.x-k8s.io/v1beta2`), for the quota of a
    /// Kueue-managed RayService.
    pub kueue: crate::kueue::KueueObjects,
    /// What was ignored while reading, for the user to see.
    pub warnings: Vec<String>,
    /// Shares namespace and node names between pod records.
    pub strings: Strings,
}

fn describe(item: &Value) -> String {
    let meta = item.get("metadata");
    let get = |k| meta.and_then(|m| m.get(k)).and_then(Value::as_str);
    match (get("namespace"), get("name")) {
        (Some(ns), Some(n)) => format!("{ns}/{n}"),
        (None, Some(n)) => n.to_string(),
        _ => "<unnamed>".to_string(),
    }
}

/// The Kueue API raygate reads.
const KUEUE_API_VERSION: &str = "kueue.x-k8s.io/v1beta2";

/// Whether an object is Kueue's (its `apiVersion`), or has none (an item of
/// a typed list such as `ClusterQueueList`).
fn kueue_group(v: &Value) -> bool {
    v.get("apiVersion")
        .and_then(Value::as_str)
        .is_none_or(|a| a.starts_with("kueue.x-k8s.io/"))
}

/// The kind of a List's items: `PodList` → `Pod`; none for a plain `List`.
fn item_kind(list_kind: &str) -> Option<&str> {
    list_kind.strip_suffix("List").filter(|k| !k.is_empty())
}

fn decode<T: serde::de::DeserializeOwned>(path: &str, item: Value) -> crate::Result<T> {
    let what = format!("{path} ({})", describe(&item));
    serde_json::from_value(item).map_err(|e| crate::Error::invalid(what, e.to_string()))
}

impl ClusterState {
    /// Reads a `v1 List` with mixed `items` (each with its `kind`), a typed
    /// list such as `PodList` (items may lack `kind`), or a single object.
    /// Other kinds are skipped with a warning; malformed items are errors,
    /// because silently losing a node or pod would misstate capacity.
    pub fn from_list(value: Value) -> crate::Result<ClusterState> {
        let mut state = ClusterState::default();
        state.add(value, "input", None)?;
        Ok(state)
    }

    fn add(
        &mut self,
        mut value: Value,
        path: &str,
        default_kind: Option<&str>,
    ) -> crate::Result<()> {
        if !value.is_object() {
            return Err(crate::Error::invalid(
                path,
                "expected a Kubernetes object or List",
            ));
        }
        let kind = value
            .get("kind")
            .and_then(Value::as_str)
            .map(str::to_string)
            .or_else(|| default_kind.map(str::to_string));
        let Some(kind) = kind else {
            return Err(crate::Error::invalid(
                format!("{path} ({})", describe(&value)),
                "object has no kind",
            ));
        };
        if let Some(items) = value.get_mut("items").filter(|_| kind.ends_with("List")) {
            let items = match items.take() {
                Value::Array(a) => a,
                Value::Null => Vec::new(),
                _ => return Err(crate::Error::invalid(path, "items is not an array")),
            };
            for (i, item) in items.into_iter().enumerate() {
                self.add(item, &format!("{path}.items[{i}]"), item_kind(&kind))?;
            }
            return Ok(());
        }
        match kind.as_str() {
            "Node" => self.nodes.push(decode(path, value)?),
            "Pod" => {
                let pod: PartialPod = decode(path, value)?;
                self.pods.push(pod.to_record(&mut self.strings));
            }
            "LimitRange" => self.limit_ranges.push(decode(path, value)?),
            "RuntimeClass" => self.runtime_classes.push(decode(path, value)?),
            "ResourceSlice" => {
                self.dra.apply_slice(&decode(path, value)?);
            }
            "DeviceClass" => {
                self.dra.apply_class(&decode(path, value)?);
            }
            "ResourceClaim" => {
                self.dra.apply_claim(&decode(path, value)?);
            }
            "ResourceClaimTemplate" => {
                self.dra.apply_template(&decode(path, value)?);
            }
            "ClusterQueue" | "LocalQueue" | "Workload" if kueue_group(&value) => {
                let version = value.get("apiVersion").and_then(Value::as_str);
                if matches!(version, None | Some(KUEUE_API_VERSION)) {
                    let what = format!("{path} ({})", describe(&value));
                    self.kueue
                        .add(&kind, value)
                        .map_err(|e| crate::Error::invalid(what, e.to_string()))?;
                } else {
                    self.warnings.push(format!(
                        "ignored {path}: kind {kind} ({}) of {}: raygate reads {KUEUE_API_VERSION} \
                         (kubectl get {}s.v1beta2.kueue.x-k8s.io)",
                        describe(&value),
                        version.unwrap_or_default(),
                        kind.to_lowercase()
                    ));
                }
            }
            other => self.warnings.push(format!(
                "ignored {path}: kind {other} ({})",
                describe(&value)
            )),
        }
        Ok(())
    }

    /// The end of a streamed document at `path`, whose `items` (if it had
    /// any) were added as they came: the items that had no kind of their own
    /// are added now with the one the List's `kind` gives; any other object,
    /// kept whole in `rest`, is added as it is.
    fn finish_document(
        &mut self,
        path: &str,
        kind: Option<&str>,
        had_items: bool,
        kindless: Vec<(String, Value)>,
        rest: serde_json::Map<String, Value>,
    ) -> crate::Result<()> {
        match kind {
            Some(kind) if had_items && kind.ends_with("List") => {
                for (path, v) in kindless {
                    self.add(v, &path, item_kind(kind))?;
                }
                Ok(())
            }
            _ if had_items => Err(crate::Error::invalid(
                format!("{path} ({})", describe(&Value::Object(rest))),
                "object has no kind",
            )),
            _ => self.add(Value::Object(rest), path, None),
        }
    }
}

/// The most bytes a state file may have. A `kubectl get -o json` dump of a
/// cluster at Kubernetes' scalability limit (150,000 pods) is a few GiB; the
/// file is read as it streams, so the bound is on time, not memory.
pub const MAX_STATE_BYTES: u64 = 16 << 30;

/// Refuses to read past `left` bytes, naming the bound.
struct Bounded<R> {
    inner: R,
    left: u64,
    max: u64,
    /// Set once the bound is hit: parsers may report I/O errors vaguely.
    hit: std::rc::Rc<std::cell::Cell<bool>>,
}

fn too_large(max: u64) -> String {
    format!(
        "larger than {max} bytes ({} GiB), the bound on state files",
        max >> 30
    )
}

impl<R: std::io::Read> std::io::Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.inner.read(buf)?;
        if n as u64 > self.left {
            self.hit.set(true);
            return Err(std::io::Error::other(too_large(self.max)));
        }
        self.left -= n as u64;
        Ok(n)
    }
}

/// One item of a list, as the parser hands it over.
trait StateItem: serde::de::DeserializeOwned {
    /// Adds the item; gives it back (as a value) when it has no kind and
    /// the list's kind is not known yet.
    fn add_to(
        self,
        state: &mut ClusterState,
        path: &str,
        default_kind: Option<&str>,
    ) -> crate::Result<Option<Value>>;
}

impl StateItem for Value {
    fn add_to(
        self,
        state: &mut ClusterState,
        path: &str,
        default_kind: Option<&str>,
    ) -> crate::Result<Option<Value>> {
        if self.get("kind").is_none() && default_kind.is_none() && self.is_object() {
            return Ok(Some(self));
        }
        state.add(self, path, default_kind)?;
        Ok(None)
    }
}

/// Kind and name, read past everything else.
#[derive(serde::Deserialize)]
struct Sniff {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    metadata: Option<SniffMeta>,
}

#[derive(serde::Deserialize)]
struct SniffMeta {
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    namespace: Option<String>,
}

/// Adds one JSON item (valid JSON text) the fast path left: its kind and
/// name first, then the typed parse its kind needs. Gives it back (as a
/// value) when it has no kind and the list's kind is not known yet.
fn add_item(
    state: &mut ClusterState,
    text: &str,
    path: &str,
    default_kind: Option<&str>,
) -> crate::Result<Option<Value>> {
    let sniff: Sniff =
        serde_json::from_str(text).map_err(|e| crate::Error::invalid(path, e.to_string()))?;
    let what = || {
        let m = sniff.metadata.as_ref();
        match (
            m.and_then(|m| m.namespace.as_deref()),
            m.and_then(|m| m.name.as_deref()),
        ) {
            (Some(ns), Some(n)) => format!("{path} ({ns}/{n})"),
            (None, Some(n)) => format!("{path} ({n})"),
            _ => format!("{path} (<unnamed>)"),
        }
    };
    let kind = sniff.kind.as_deref().or(default_kind);
    let bad = |e: serde_json::Error| crate::Error::invalid(what(), e.to_string());
    match kind {
        Some("Pod") => {
            let pod: PartialPod = serde_json::from_str(text).map_err(bad)?;
            state.pods.push(pod.to_record(&mut state.strings));
        }
        Some("Node") => state.nodes.push(serde_json::from_str(text).map_err(bad)?),
        Some("LimitRange") => state
            .limit_ranges
            .push(serde_json::from_str(text).map_err(bad)?),
        Some("RuntimeClass") => state
            .runtime_classes
            .push(serde_json::from_str(text).map_err(bad)?),
        _ => {
            let v: Value = serde_json::from_str(text).map_err(bad)?;
            return v.add_to(state, path, default_kind);
        }
    }
    Ok(None)
}

/// One document, read as it streams: a `List`'s items are added one by one;
/// any other object is kept whole (it is one object).
struct Doc<'s, I> {
    state: &'s mut ClusterState,
    path: String,
    item: std::marker::PhantomData<I>,
}

impl<'de, I: StateItem> serde::de::DeserializeSeed<'de> for Doc<'_, I> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

fn custom<E: serde::de::Error>(e: crate::Error) -> E {
    E::custom(e.to_string())
}

impl<'de, I: StateItem> serde::de::Visitor<'de> for Doc<'_, I> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a Kubernetes object or List")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut rest = serde_json::Map::new();
        let mut kind: Option<String> = None;
        let mut had_items = false;
        let mut kindless: Vec<(String, Value)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "items" => {
                    had_items = true;
                    map.next_value_seed(Items::<I> {
                        state: &mut *self.state,
                        path: &self.path,
                        kind: kind.as_deref().and_then(item_kind).map(str::to_string),
                        kindless: &mut kindless,
                        item: std::marker::PhantomData,
                    })?;
                }
                _ => {
                    let v: Value = map.next_value()?;
                    if key == "kind" {
                        kind = v.as_str().map(str::to_string);
                    }
                    rest.insert(key, v);
                }
            }
        }
        self.state
            .finish_document(&self.path, kind.as_deref(), had_items, kindless, rest)
            .map_err(custom)
    }
}

struct Items<'s, I> {
    state: &'s mut ClusterState,
    path: &'s str,
    kind: Option<String>,
    kindless: &'s mut Vec<(String, Value)>,
    item: std::marker::PhantomData<I>,
}

impl<'de, I: StateItem> serde::de::DeserializeSeed<'de> for Items<'_, I> {
    type Value = ();
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de, I: StateItem> serde::de::Visitor<'de> for Items<'_, I> {
    type Value = ();

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a list of items")
    }

    fn visit_unit<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_none<E: serde::de::Error>(self) -> Result<(), E> {
        Ok(())
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut i = 0usize;
        while let Some(item) = seq.next_element::<I>()? {
            let path = format!("{}.items[{i}]", self.path);
            if let Some(v) = item
                .add_to(self.state, &path, self.kind.as_deref())
                .map_err(custom)?
            {
                self.kindless.push((path, v));
            }
            i += 1;
        }
        Ok(())
    }
}

impl ClusterState {
    /// Reads a state file (`kubectl get nodes,pods,limitranges,runtimeclasses
    /// -A -o json` or `-o yaml`, several YAML documents allowed) as it
    /// streams: pods go straight into records, so memory follows the
    /// cluster's size, not the file's. At most `max_bytes` are read.
    pub fn read(reader: impl std::io::Read, max_bytes: u64) -> crate::Result<ClusterState> {
        Self::read_as(reader, max_bytes, None)
    }

    /// [`ClusterState::read`], as YAML when `yaml` says so, else as JSON
    /// when the input starts with `{`. JSON documents joined by `---` are
    /// YAML, not JSON: read them with `Some(true)`.
    pub fn read_as(
        reader: impl std::io::Read,
        max_bytes: u64,
        yaml: Option<bool>,
    ) -> crate::Result<ClusterState> {
        Self::read_windowed(reader, max_bytes, yaml, json::WINDOW)
    }

    /// [`ClusterState::read_as`] with the JSON reader's window size (tests
    /// use tiny ones to split items across reads).
    fn read_windowed(
        reader: impl std::io::Read,
        max_bytes: u64,
        yaml: Option<bool>,
        window: usize,
    ) -> crate::Result<ClusterState> {
        let hit = std::rc::Rc::new(std::cell::Cell::new(false));
        let mut reader = std::io::BufReader::with_capacity(
            1 << 16,
            Bounded {
                inner: reader,
                left: max_bytes,
                max: max_bytes,
                hit: hit.clone(),
            },
        );
        let bounded = |e: crate::Error| {
            if hit.get() {
                crate::Error::invalid("input", too_large(max_bytes))
            } else {
                e
            }
        };
        let json = {
            use std::io::BufRead;
            let head = reader
                .fill_buf()
                .map_err(|e| crate::Error::invalid("input", e.to_string()))?;
            let json = yaml != Some(true)
                && head
                    .iter()
                    .find(|b| !b.is_ascii_whitespace())
                    .is_some_and(|&b| b == b'{');
            // The YAML reader would say only "IO error" (issue 32); the JSON
            // reader names the line and column itself.
            if !json && let Some(at) = binary_at(head) {
                return Err(crate::Error::invalid(
                    "input",
                    format!(
                        "not a YAML or JSON text file: binary content at byte {at} (a compressed \
                         dump? decompress it first)"
                    ),
                ));
            }
            json
        };
        let mut state = ClusterState::default();
        if json {
            json::read(reader, window, &mut state).map_err(|e| match e {
                json::Fail::Json(text) => bounded(crate::Error::invalid("not valid JSON", text)),
                json::Fail::Io(e) => {
                    bounded(crate::Error::invalid("not valid JSON", e.to_string()))
                }
            })?;
        } else {
            let budget = usize::try_from(max_bytes).unwrap_or(usize::MAX);
            let options = serde_saphyr::options! {
                budget: serde_saphyr::budget! {
                    max_reader_input_bytes: None,
                    max_events: budget,
                    max_nodes: budget,
                    max_total_scalar_bytes: budget,
                    max_documents: 1 << 20,
                },
            };
            YAML_STATE.with(|cell| *cell.borrow_mut() = Some((state, 0)));
            let mut failed = None;
            for doc in serde_saphyr::read_with_options::<_, DocOf>(&mut reader, options) {
                if let Err(e) = doc {
                    failed = Some(crate::Error::invalid("not valid YAML", e.to_string()));
                    break;
                }
            }
            state = YAML_STATE
                .with(|cell| cell.borrow_mut().take())
                .map(|(s, _)| s)
                .unwrap_or_default();
            if let Some(e) = failed {
                return Err(bounded(e));
            }
        }
        Ok(state)
    }
}

thread_local! {
    /// The state a YAML read adds to, and how many documents it has seen:
    /// the YAML document iterator only builds owned values, so each
    /// document's [`Doc`] finds its state here.
    static YAML_STATE: std::cell::RefCell<Option<(ClusterState, usize)>> =
        const { std::cell::RefCell::new(None) };
}

/// Where the start of a file shows it is not text: a NUL byte or a byte
/// sequence that is not UTF-8 (one cut at the end of `head` is not counted).
fn binary_at(head: &[u8]) -> Option<usize> {
    if let Some(at) = head.iter().position(|&b| b == 0) {
        return Some(at);
    }
    match std::str::from_utf8(head) {
        Err(e) if e.error_len().is_some() => Some(e.valid_up_to()),
        _ => None,
    }
}

/// A YAML document, added to [`YAML_STATE`] as it streams.
struct DocOf;

impl<'de> serde::Deserialize<'de> for DocOf {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        use serde::de::DeserializeSeed;
        YAML_STATE.with(|cell| {
            let mut cell = cell.borrow_mut();
            let Some((state, docs)) = cell.as_mut() else {
                return Err(serde::de::Error::custom("no state to read into"));
            };
            // The first document is the input (`input.items[0]` is then its
            // first item, not a doubled `input.items[0].items[0]`, issue 32);
            // more documents are numbered.
            let path = match *docs {
                0 => "input".to_string(),
                n => format!("input.documents[{n}]"),
            };
            *docs += 1;
            Doc::<Value> {
                state,
                path,
                item: std::marker::PhantomData,
            }
            .deserialize(d)
        })?;
        Ok(DocOf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn kueue_v1beta2_objects_are_kept_and_other_versions_said_ignored() {
        let s = ClusterState::from_list(json!({"apiVersion": "v1", "kind": "List", "items": [
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "ClusterQueue",
             "metadata": {"name": "team"}, "spec": {"cohortName": "gpus"}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "LocalQueue",
             "metadata": {"name": "q", "namespace": "ml"}, "spec": {"clusterQueue": "team"}},
            // Kueue's own Workload: counted in its ClusterQueue's status already.
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
             "metadata": {"name": "job-1", "namespace": "ml"}, "spec": {"queueName": "q"}},
            {"apiVersion": "kueue.x-k8s.io/v1beta2", "kind": "Workload",
             "metadata": {"name": "llm-0a1b-quota", "namespace": "ml", "labels": {
                 "app.kubernetes.io/managed-by": "raygate", "raygate.io/reservation": "quota"}},
             "spec": {"queueName": "q"}},
            {"apiVersion": "kueue.x-k8s.io/v1beta1", "kind": "ClusterQueue",
             "metadata": {"name": "old"}},
            // Another group's Workload kind is not Kueue's.
            {"apiVersion": "example.com/v1", "kind": "Workload", "metadata": {"name": "w"}}
        ]}))
        .unwrap();
        let k = &s.kueue;
        assert_eq!(
            (
                k.cluster_queues.len(),
                k.local_queues.len(),
                k.reservations.len()
            ),
            (1, 1, 1)
        );
        assert_eq!(k.cluster_queue_of("ml", "q").as_deref(), Some("team"));
        assert_eq!(k.cluster_queue_of("other", "q"), None);
        assert_eq!(
            s.warnings,
            [
                "ignored input.items[4]: kind ClusterQueue (old) of kueue.x-k8s.io/v1beta1: raygate \
                 reads kueue.x-k8s.io/v1beta2 (kubectl get clusterqueues.v1beta2.kueue.x-k8s.io)",
                "ignored input.items[5]: kind Workload (w)"
            ]
        );
        // A malformed Kueue object is an error naming it, as a malformed node is.
        let e = ClusterState::from_list(json!({"apiVersion": "kueue.x-k8s.io/v1beta2",
            "kind": "LocalQueue", "metadata": {"name": "q"}, "spec": {"clusterQueue": 7}}))
        .unwrap_err();
        assert!(e.to_string().contains("input (q)"), "{e}");
    }

    #[test]
    fn reads_mixed_list_and_warns_on_other_kinds() {
        let v = json!({
            "apiVersion": "v1", "kind": "List",
            "items": [
                {"apiVersion": "v1", "kind": "Node", "metadata": {"name": "n1"}},
                {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p1", "namespace": "ray"},
                 "spec": {"containers": [{"name": "c", "resources": {"requests": {"cpu": 2}}}]}},
                {"apiVersion": "v1", "kind": "LimitRange",
                 "metadata": {"name": "lr", "namespace": "ray"}, "spec": {"limits": []}},
                {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s", "namespace": "ray"}},
                {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": "kata"},
                 "handler": "kata", "overhead": {"podFixed": {"cpu": "250m"}}}
            ]
        });
        let s = ClusterState::from_list(v).unwrap();
        assert_eq!(s.nodes.len(), 1);
        assert_eq!(s.pods.len(), 1);
        assert_eq!(s.limit_ranges.len(), 1);
        assert_eq!(s.runtime_classes.len(), 1);
        assert_eq!(s.warnings, ["ignored input.items[3]: kind Service (ray/s)"]);
    }

    #[test]
    fn reads_typed_lists_and_single_objects() {
        let v = json!({"kind": "PodList", "items": [{"metadata": {"name": "a"}}, {"metadata": {"name": "b"}}]});
        assert_eq!(ClusterState::from_list(v).unwrap().pods.len(), 2);
        let v = json!({"kind": "Node", "metadata": {"name": "n"}});
        assert_eq!(ClusterState::from_list(v).unwrap().nodes.len(), 1);
        let v = json!({"kind": "List", "items": null});
        assert!(ClusterState::from_list(v).unwrap().nodes.is_empty());
    }

    #[test]
    fn streams_json_and_yaml_to_the_same_state() {
        let list = json!({"apiVersion": "v1", "items": [
            {"kind": "Node", "metadata": {"name": "n1"}},
            {"kind": "Pod", "metadata": {"name": "p1", "namespace": "ray", "managedFields": [{"manager": "x"}]},
             "spec": {"nodeName": "n1", "containers": [{"name": "c", "env": [{"name": "A"}],
                 "resources": {"requests": {"cpu": "2"}}}]}},
            {"kind": "Service", "metadata": {"name": "s", "namespace": "ray"}}
        ], "kind": "List"});
        let json_text = list.to_string();
        let a = ClusterState::read(json_text.as_bytes(), 1 << 20).unwrap();
        let yaml_text = serde_saphyr::to_string(&list).unwrap();
        let b = ClusterState::read(yaml_text.as_bytes(), 1 << 20).unwrap();
        for s in [&a, &b] {
            assert_eq!(s.nodes.len(), 1);
            assert_eq!(s.pods.len(), 1);
            assert_eq!(s.warnings, ["ignored input.items[2]: kind Service (ray/s)"]);
        }
        assert_eq!(a.pods, b.pods);
        // Typed lists give kindless items their kind, even when `kind` comes last.
        let typed = r#"{"items": [{"metadata": {"name": "a"}}], "kind": "PodList"}"#;
        assert_eq!(
            ClusterState::read(typed.as_bytes(), 1 << 20)
                .unwrap()
                .pods
                .len(),
            1
        );
    }

    #[test]
    fn the_size_bound_is_named() {
        use std::io::Read;
        let spaces = std::io::repeat(b' ').take(4 << 20);
        let err = ClusterState::read(spaces, 1 << 20).unwrap_err().to_string();
        assert!(
            err.contains("1048576 bytes") && err.contains("bound on state files"),
            "{err}"
        );
    }

    /// Issue 32, item 12: a binary (e.g. gzipped) state said only "IO error".
    #[test]
    fn a_binary_file_is_named_as_such() {
        for bytes in [&b"\x1f\x8b\x08\x00\xff\xfe"[..], &b"kind: List\x00"[..]] {
            let err = ClusterState::read(bytes, 1 << 20).unwrap_err().to_string();
            assert!(
                err.contains("not a YAML or JSON text file: binary content at byte"),
                "{err}"
            );
        }
        // UTF-8 cut at the end of the first read is still text.
        assert_eq!(binary_at("é".as_bytes().get(..1).unwrap_or_default()), None);
    }

    #[test]
    fn rejects_malformed_input() {
        let err = ClusterState::from_list(json!([1, 2]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("expected a Kubernetes object"), "{err}");
        let v = json!({"kind": "List", "items": [{"metadata": {"name": "x"}}]});
        let err = ClusterState::from_list(v).unwrap_err().to_string();
        assert_eq!(err, "input.items[0] (x): object has no kind");
        let v = json!({"kind": "List", "items": [{"kind": "Node", "metadata": {"name": "n"},
            "spec": {"unschedulable": "yes"}}]});
        let err = ClusterState::from_list(v).unwrap_err().to_string();
        assert!(err.starts_with("input.items[0] (n): "), "{err}");
    }
}
