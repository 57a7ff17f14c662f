//! GPUs published through Dynamic Resource Allocation (`resource.k8s.io/v1`), counted the way
//! kube-scheduler's `DynamicResources` plugin allocates them (Kubernetes v1.36).
//!
//! - [`DraState`]: slim records of ResourceSlices (devices per driver/pool/generation),
//!   DeviceClasses (CEL selectors, `extendedResourceName`), ResourceClaims (the devices their
//!   `status.allocation` holds) and ResourceClaimTemplates (what a new pod's claims ask).
//! - [`view`]: per node, the devices the scheduler would consider: of each pool only the newest
//!   generation, and only when that generation's slices are all there (`resourceSliceCount`);
//!   which of them are in use; which match each DeviceClass ([`select`], CEL).
//! - [`demand`]: what a pod asks: its `resourceClaims` (from templates) and the extended
//!   resources a DeviceClass maps (`nvidia.com/gpu` via `extendedResourceName`, or the implicit
//!   `deviceclass.resource.kubernetes.io/<class>`). The mapping applies per node, as
//!   `noderesources.Fit` does: only where the node's allocatable has none of the resource (a
//!   device-plugin node keeps counting it in allocatable).
//! - [`alloc`]: the scheduler's allocator on one node: requests in order, devices first fit in
//!   slice order, backtracking, `count`, `allocationMode: All`, `firstAvailable`.
//!
//! What raygate cannot decide exactly it refuses to guess ([`Undecided`]): a selector the CEL
//! crate cannot evaluate (`quantity()`, `semver()`, a runtime error), partitionable devices
//! (`consumesCounters`, `sharedCounters`), consumable capacity (`allowMultipleAllocations`,
//! capacity requests), device taints, binding conditions, `constraints`, admin access and
//! claims a pod names (`resourceClaimName`, shared between pods). Such a pod is not placed, so
//! the upgrade holds and says why. `--dra-plain-count-class CLASS` ([`DraState::plain_count`])
//! treats a class as plain counts instead: every device it matches is one unit, selectors that
//! cannot be evaluated match, and taints, counters and capacity are ignored.
//!
//! Not counted: slices published for several nodes (`allNodes`, `nodeSelector`,
//! `perDeviceNodeSelection`, network-attached devices). raygate then sees fewer devices than
//! the scheduler and holds where the scheduler might place: the safe direction.

pub mod alloc;
pub(crate) mod assume;
pub mod demand;
pub(crate) mod run;
pub mod select;
pub(crate) mod unseen;
pub mod view;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use k8s_openapi::api::resource::v1::{
    DeviceClass, DeviceRequest, DeviceSubRequest, ExactDeviceRequest, ResourceClaim,
    ResourceClaimSpec, ResourceClaimTemplate, ResourceSlice,
};

pub use alloc::allocate;
pub use demand::{PodDemand, class_for_resource, pod_demand};
pub use view::{DraView, NodeDevices, Views};

/// The implicit extended resource name of a DeviceClass: `deviceclass.resource.kubernetes.io/<class>`.
pub const IMPLICIT_PREFIX: &str = "deviceclass.resource.kubernetes.io/";

/// Why raygate cannot decide a device request exactly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Undecided(pub String);

impl std::fmt::Display for Undecided {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A device attribute's value, as CEL sees it.
#[derive(Clone, Debug, PartialEq, Hash)]
pub enum AttrValue {
    Bool(bool),
    Int(i64),
    Str(String),
    /// A semantic version: CEL compares it with `semver()`, which raygate does not evaluate.
    Version(String),
}

/// A device of a ResourceSlice, slim.
#[derive(Clone, Debug, PartialEq)]
pub struct Device {
    pub name: String,
    /// Qualified name as published (`productName` or `gpu.nvidia.com/productName`).
    pub attributes: BTreeMap<String, AttrValue>,
    /// Capacity names as published; values are only looked at by `quantity()` selectors.
    pub capacity: BTreeSet<String>,
    /// Why the allocator treats this device in ways raygate does not model, if it does.
    pub unmodeled: Option<&'static str>,
    /// A hash of its name, attributes and capacity names: what a CEL selector reads, so
    /// the key of its verdicts across decisions ([`Verdicts`]).
    pub fingerprint: u64,
}

impl Device {
    /// [`Device::fingerprint`] of these fields.
    pub fn fingerprint_of(
        name: &str,
        attributes: &BTreeMap<String, AttrValue>,
        capacity: &BTreeSet<String>,
    ) -> u64 {
        use std::hash::{Hash, Hasher};
        let mut h = std::collections::hash_map::DefaultHasher::new();
        (name, attributes, capacity).hash(&mut h);
        h.finish()
    }
}

/// CEL verdicts kept from one decision to the next, by a hash of (selector, driver, device
/// fingerprint): a selector's verdict on a device depends on nothing else, so a decision
/// evaluates only the devices and selectors no earlier one has seen (a new ResourceSlice,
/// a changed DeviceClass), as kube-scheduler's snapshot updates only changed nodes. Shared
/// by clones of the state; at most [`Verdicts::bound`] entries (cleared past it).
#[derive(Clone, Default)]
pub struct Verdicts(std::sync::Arc<std::sync::Mutex<HashMap<u64, Result<bool, Undecided>>>>);

impl Verdicts {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Result<bool, Undecided>>> {
        // A panic elsewhere while holding it cannot leave a wrong verdict behind: each
        // entry is written whole.
        crate::sync::lock(&self.0)
    }

    pub fn get(&self, key: u64) -> Option<Result<bool, Undecided>> {
        self.map().get(&key).cloned()
    }

    pub fn put(&self, key: u64, verdict: Result<bool, Undecided>) {
        self.map().insert(key, verdict);
    }

    pub fn len(&self) -> usize {
        self.map().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forget everything when over `limit` entries (verdicts on devices and selectors
    /// long gone): the next decision evaluates what it needs again.
    pub fn bound(&self, limit: usize) {
        let mut m = self.map();
        if m.len() > limit {
            m.clear();
        }
    }
}

impl std::fmt::Debug for Verdicts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Verdicts({})", self.len())
    }
}

/// A cache, not state: two states with the same objects are equal whatever it holds.
impl PartialEq for Verdicts {
    fn eq(&self, _: &Verdicts) -> bool {
        true
    }
}

/// A ResourceSlice, slim.
#[derive(Clone, Debug, PartialEq)]
pub struct Slice {
    pub driver: String,
    pub pool: String,
    pub generation: i64,
    pub slice_count: i64,
    /// `spec.nodeName`; `None` for slices published for several nodes (not counted).
    pub node: Option<String>,
    /// `sharedCounters`: partitionable devices.
    pub shared_counters: bool,
    /// Shared with the node views ([`view::Views`]), which keep them across decisions.
    pub devices: Vec<Arc<Device>>,
}

/// A DeviceClass, slim.
#[derive(Clone, Debug, PartialEq)]
pub struct Class {
    pub selectors: Vec<String>,
    pub extended_resource_name: Option<String>,
    /// `metadata.creationTimestamp` in seconds: the newest class mapping a resource wins.
    pub created: i64,
}

/// How many devices a request takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Count(u32),
    All,
}

/// An `exactly` request or one `firstAvailable` subrequest.
#[derive(Clone, Debug, PartialEq)]
pub struct Exact {
    pub class: String,
    pub selectors: Vec<String>,
    pub mode: Mode,
    /// Set when the request uses something raygate does not model.
    pub unmodeled: Option<&'static str>,
}

/// One request of a claim: its alternatives in order (one for `exactly`).
#[derive(Clone, Debug, PartialEq)]
pub struct Request {
    pub name: String,
    pub alternatives: Vec<Exact>,
}

/// What a claim asks.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ClaimSpec {
    pub requests: Vec<Request>,
    /// Set when the claim uses something raygate does not model (`constraints`, `config`
    /// is fine).
    pub unmodeled: Option<&'static str>,
}

/// A device's identity: driver, pool, name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceId {
    pub driver: String,
    pub pool: String,
    pub device: String,
}

/// A ResourceClaim, slim: what it asks and the devices its allocation holds.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct Claim {
    pub spec: ClaimSpec,
    /// Devices of `status.allocation` (admin-access results excluded: they hold nothing).
    pub allocated: Vec<DeviceId>,
    /// The pod whose DRA-backed extended resources the scheduler made this claim for
    /// (annotation [`EXTENDED_RESOURCE_CLAIM`], owner reference of kind Pod): how a bound
    /// pod's devices are told apart from those of a pod that is gone (`dra::assume`).
    pub extended_for: Option<String>,
    /// The node of the allocation (`status.allocation.nodeSelector`'s `metadata.name`
    /// field), as the scheduler writes it for node-local devices.
    pub node: Option<String>,
}

/// The annotation kube-scheduler puts on the claim it makes for a pod's DRA-backed
/// extended resources (`resourceapi.ExtendedResourceClaimAnnotation`), value `"true"`.
pub const EXTENDED_RESOURCE_CLAIM: &str = "resource.kubernetes.io/extended-resource-claim";

/// Bounds that keep a tenant's objects from growing memory without end: the API's own
/// limits (128 devices a slice, 32 requests a claim, 32 attributes a device) are far below.
pub const MAX_DEVICES_PER_SLICE: usize = 1024;
pub const MAX_REQUESTS_PER_CLAIM: usize = 64;
pub const MAX_ATTRIBUTES_PER_DEVICE: usize = 64;

/// The resource.k8s.io/v1 objects the fit reads, keyed by name (`namespace/name` for
/// namespaced kinds). The objects change only through `apply_*`, `delete_*` and
/// [`DraState::retain`], which tell the kept node views ([`Views`]) what to patch.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraState {
    slices: BTreeMap<String, Slice>,
    classes: BTreeMap<String, Class>,
    claims: BTreeMap<String, Claim>,
    templates: BTreeMap<String, ClaimSpec>,
    /// Derived from `slices`: (driver, pool) → the keys of its slices.
    pools: BTreeMap<PoolId, BTreeSet<String>>,
    /// Derived from `claims`: how many allocated claims hold each device.
    held: HashMap<DeviceId, u32>,
    /// Derived from `claims`: the keys of the allocated claims made for a pod's
    /// extended resources ([`Claim::extended_for`]).
    extended: BTreeSet<String>,
    /// Bumped by every change of a claim or a class (what `assume::unseen` reads of the
    /// DRA objects, with the slices only when a claim names no node).
    claims_version: Version,
    /// Bumped by every change of a slice.
    slices_version: Version,
    /// Classes counted as plain units (see the module docs), set by
    /// `--dra-plain-count-class`.
    pub plain_count: BTreeSet<String>,
    /// CEL verdicts from earlier decisions.
    pub verdicts: Verdicts,
    /// Per node, the devices the allocator considers, kept from one decision to the next.
    pub views: Views,
}

/// A count of changes, history rather than state: two states with the same objects are
/// equal whatever their versions.
#[derive(Clone, Copy, Debug, Default)]
struct Version(u64);

impl Version {
    fn bump(&mut self) {
        self.0 = self.0.wrapping_add(1);
    }
}

impl PartialEq for Version {
    fn eq(&self, _: &Version) -> bool {
        true
    }
}

/// A pool: (driver, pool name).
pub type PoolId = (String, String);

/// The four kinds, for relists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DraKind {
    Slice,
    Class,
    Claim,
    Template,
}

fn put<V: PartialEq>(m: &mut BTreeMap<String, V>, k: String, v: V) -> bool {
    match m.get(&k) {
        Some(old) if *old == v => false,
        _ => {
            m.insert(k, v);
            true
        }
    }
}

/// The key of an object: `namespace/name`, or `name` for cluster-scoped kinds.
pub fn key(ns: Option<&str>, name: Option<&str>) -> String {
    match ns.filter(|n| !n.is_empty()) {
        Some(ns) => format!("{ns}/{}", name.unwrap_or("")),
        None => name.unwrap_or("").to_string(),
    }
}

impl DraState {
    /// Whether there is nothing DRA in the cluster: the fit then runs exactly as without it.
    pub fn is_empty(&self) -> bool {
        self.slices.is_empty() && self.classes.is_empty()
    }

    /// The ResourceSlices by name.
    pub fn slices(&self) -> &BTreeMap<String, Slice> {
        &self.slices
    }

    /// The DeviceClasses by name.
    pub fn classes(&self) -> &BTreeMap<String, Class> {
        &self.classes
    }

    /// The ResourceClaims by `namespace/name`.
    pub fn claims(&self) -> &BTreeMap<String, Claim> {
        &self.claims
    }

    /// The ResourceClaimTemplates' specs by `namespace/name`.
    pub fn templates(&self) -> &BTreeMap<String, ClaimSpec> {
        &self.templates
    }

    /// The keys of the slices of each pool.
    pub fn pools(&self) -> &BTreeMap<PoolId, BTreeSet<String>> {
        &self.pools
    }

    /// Whether an allocated claim holds `id`.
    pub fn is_held(&self, id: &DeviceId) -> bool {
        self.held.contains_key(id)
    }

    fn index_slice(&mut self, key: &str, s: &Slice, add: bool) {
        let pool = (s.driver.clone(), s.pool.clone());
        self.views.pool_changed(&pool);
        if add {
            self.pools.entry(pool).or_default().insert(key.to_string());
        } else if let Some(keys) = self.pools.get_mut(&pool) {
            keys.remove(key);
            if keys.is_empty() {
                self.pools.remove(&pool);
            }
        }
    }

    fn index_claim(&mut self, c: &Claim, add: bool) {
        for id in &c.allocated {
            self.views
                .pool_changed(&(id.driver.clone(), id.pool.clone()));
            if add {
                *self.held.entry(id.clone()).or_insert(0) += 1;
            } else if let Some(n) = self.held.get_mut(id) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.held.remove(id);
                }
            }
        }
    }

    fn put_slice(&mut self, key: String, s: Slice) -> bool {
        if self.slices.get(&key) == Some(&s) {
            return false;
        }
        self.remove_slice(&key);
        self.slices_version.bump();
        self.index_slice(&key, &s, true);
        self.slices.insert(key, s);
        true
    }

    fn remove_slice(&mut self, key: &str) -> bool {
        match self.slices.remove(key) {
            Some(old) => {
                self.slices_version.bump();
                self.index_slice(key, &old, false);
                true
            }
            None => false,
        }
    }

    fn put_claim(&mut self, key: String, c: Claim) -> bool {
        if self.claims.get(&key) == Some(&c) {
            return false;
        }
        self.remove_claim(&key);
        self.claims_version.bump();
        self.index_claim(&c, true);
        if c.extended_for.is_some() && !c.allocated.is_empty() {
            self.extended.insert(key.clone());
        }
        self.claims.insert(key, c);
        true
    }

    fn remove_claim(&mut self, key: &str) -> bool {
        match self.claims.remove(key) {
            Some(old) => {
                self.claims_version.bump();
                self.index_claim(&old, false);
                self.extended.remove(key);
                true
            }
            None => false,
        }
    }

    /// (claims and classes, slices) versions: see `assume::UnseenCache`.
    pub(crate) fn versions(&self) -> (u64, u64) {
        (self.claims_version.0, self.slices_version.0)
    }

    /// The allocated claims made for pods' extended resources, by key.
    pub fn extended_claims(&self) -> impl Iterator<Item = (&str, &Claim)> {
        self.extended
            .iter()
            .filter_map(|k| Some((k.as_str(), self.claims.get(k)?)))
    }

    /// The node of a pool's slices (the first slice's `spec.nodeName`).
    pub fn pool_node(&self, driver: &str, pool: &str) -> Option<&str> {
        let keys = self.pools.get(&(driver.to_string(), pool.to_string()))?;
        keys.iter()
            .find_map(|k| self.slices.get(k).and_then(|s| s.node.as_deref()))
    }

    /// Each `apply_*` / `delete_*` says whether anything the fit reads changed.
    pub fn apply_slice(&mut self, s: &ResourceSlice) -> bool {
        self.put_slice(key(None, s.metadata.name.as_deref()), Slice::from_api(s))
    }

    pub fn delete_slice(&mut self, name: &str) -> bool {
        self.remove_slice(name)
    }

    pub fn apply_class(&mut self, c: &DeviceClass) -> bool {
        let changed = put(
            &mut self.classes,
            key(None, c.metadata.name.as_deref()),
            Class::from_api(c),
        );
        if changed {
            self.views.classes_changed();
            self.claims_version.bump();
        }
        changed
    }

    pub fn delete_class(&mut self, name: &str) -> bool {
        let changed = self.classes.remove(name).is_some();
        if changed {
            self.views.classes_changed();
            self.claims_version.bump();
        }
        changed
    }

    pub fn apply_claim(&mut self, c: &ResourceClaim) -> bool {
        self.put_claim(
            key(c.metadata.namespace.as_deref(), c.metadata.name.as_deref()),
            Claim::from_api(c),
        )
    }

    pub fn delete_claim(&mut self, ns: &str, name: &str) -> bool {
        self.remove_claim(&key(Some(ns), Some(name)))
    }

    pub fn apply_template(&mut self, t: &ResourceClaimTemplate) -> bool {
        put(
            &mut self.templates,
            key(t.metadata.namespace.as_deref(), t.metadata.name.as_deref()),
            ClaimSpec::from_api(&t.spec.spec),
        )
    }

    pub fn delete_template(&mut self, ns: &str, name: &str) -> bool {
        self.templates.remove(&key(Some(ns), Some(name))).is_some()
    }

    /// Drops the objects of `kind` whose keys are not in `seen` (a relist ended); whether
    /// any was dropped.
    pub fn retain(&mut self, kind: DraKind, seen: &BTreeSet<String>) -> bool {
        fn gone<V>(m: &BTreeMap<String, V>, seen: &BTreeSet<String>) -> Vec<String> {
            m.keys().filter(|k| !seen.contains(*k)).cloned().collect()
        }
        /// Removes one object by key, with what it held.
        type Remove = fn(&mut DraState, &str) -> bool;
        let (gone, remove): (Vec<String>, Remove) = match kind {
            DraKind::Slice => (gone(&self.slices, seen), Self::remove_slice),
            DraKind::Class => (gone(&self.classes, seen), Self::delete_class),
            DraKind::Claim => (gone(&self.claims, seen), Self::remove_claim),
            DraKind::Template => {
                let before = self.templates.len();
                self.templates.retain(|k, _| seen.contains(k));
                return self.templates.len() != before;
            }
        };
        for k in &gone {
            remove(self, k);
        }
        !gone.is_empty()
    }

    /// Every device some allocated claim holds.
    pub fn in_use(&self) -> BTreeSet<&DeviceId> {
        self.claims.values().flat_map(|c| &c.allocated).collect()
    }
}

fn attr_value(a: &k8s_openapi::api::resource::v1::DeviceAttribute) -> Option<AttrValue> {
    if let Some(b) = a.bool {
        return Some(AttrValue::Bool(b));
    }
    if let Some(i) = a.int {
        return Some(AttrValue::Int(i));
    }
    if let Some(s) = &a.string {
        return Some(AttrValue::Str(s.clone()));
    }
    a.version.as_ref().map(|v| AttrValue::Version(v.clone()))
}

impl Device {
    pub fn from_api(d: &k8s_openapi::api::resource::v1::Device) -> Device {
        let attributes = d
            .attributes
            .iter()
            .flatten()
            .take(MAX_ATTRIBUTES_PER_DEVICE)
            .filter_map(|(k, v)| Some((k.clone(), attr_value(v)?)))
            .collect();
        let capacity = d
            .capacity
            .iter()
            .flatten()
            .take(MAX_ATTRIBUTES_PER_DEVICE)
            .map(|(k, _)| k.clone())
            .collect();
        let unmodeled = if d.consumes_counters.as_ref().is_some_and(|c| !c.is_empty()) {
            Some("partitionable device (consumesCounters)")
        } else if d.allow_multiple_allocations == Some(true) {
            Some("consumable capacity (allowMultipleAllocations)")
        } else if d.taints.as_ref().is_some_and(|t| !t.is_empty()) {
            Some("device taints")
        } else if d.binding_conditions.as_ref().is_some_and(|c| !c.is_empty()) {
            Some("binding conditions")
        } else if d.node_name.is_some() || d.all_nodes.is_some() || d.node_selector.is_some() {
            Some("per-device node selection")
        } else {
            None
        };
        Device {
            fingerprint: Device::fingerprint_of(&d.name, &attributes, &capacity),
            name: d.name.clone(),
            attributes,
            capacity,
            unmodeled,
        }
    }
}

impl Slice {
    pub fn from_api(s: &ResourceSlice) -> Slice {
        let spec = &s.spec;
        let per_device = spec.per_device_node_selection == Some(true);
        Slice {
            driver: spec.driver.clone(),
            pool: spec.pool.name.clone(),
            generation: spec.pool.generation,
            slice_count: spec.pool.resource_slice_count,
            node: spec.node_name.clone().filter(|_| !per_device),
            shared_counters: spec.shared_counters.as_ref().is_some_and(|c| !c.is_empty()),
            devices: spec
                .devices
                .iter()
                .flatten()
                .take(MAX_DEVICES_PER_SLICE)
                .map(|d| Arc::new(Device::from_api(d)))
                .collect(),
        }
    }
}

impl Class {
    pub fn from_api(c: &DeviceClass) -> Class {
        Class {
            selectors: c
                .spec
                .selectors
                .iter()
                .flatten()
                .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
                .collect(),
            extended_resource_name: c.spec.extended_resource_name.clone(),
            created: c
                .metadata
                .creation_timestamp
                .as_ref()
                .map_or(0, |t| t.0.as_second()),
        }
    }
}

fn mode_of(allocation_mode: Option<&str>, count: Option<i64>) -> (Mode, Option<&'static str>) {
    match allocation_mode {
        Some("All") => (Mode::All, None),
        Some("ExactCount") | None => {
            let n = count.unwrap_or(1);
            match u32::try_from(n) {
                Ok(n) if n >= 1 => (Mode::Count(n), None),
                _ => (Mode::Count(1), Some("a count out of range")),
            }
        }
        Some(_) => (Mode::Count(1), Some("an unknown allocationMode")),
    }
}

fn selectors_of(s: Option<&Vec<k8s_openapi::api::resource::v1::DeviceSelector>>) -> Vec<String> {
    s.into_iter()
        .flatten()
        .filter_map(|s| s.cel.as_ref().map(|c| c.expression.clone()))
        .collect()
}

impl Exact {
    fn from_exact(e: &ExactDeviceRequest) -> Exact {
        let admin = (e.admin_access == Some(true)).then_some("admin access");
        Exact::of(
            &e.device_class_name,
            e.selectors.as_ref(),
            (e.allocation_mode.as_deref(), e.count),
            admin,
            e.capacity.is_some(),
        )
    }

    fn from_sub(e: &DeviceSubRequest) -> Exact {
        Exact::of(
            &e.device_class_name,
            e.selectors.as_ref(),
            (e.allocation_mode.as_deref(), e.count),
            None,
            e.capacity.is_some(),
        )
    }

    /// The fields an exact request and a `firstAvailable` subrequest share; the first of
    /// the mode's, `admin`'s and a capacity request's reasons is what cannot be modeled.
    fn of(
        class: &str,
        selectors: Option<&Vec<k8s_openapi::api::resource::v1::DeviceSelector>>,
        (allocation_mode, count): (Option<&str>, Option<i64>),
        admin: Option<&'static str>,
        capacity: bool,
    ) -> Exact {
        let (mode, unmodeled) = mode_of(allocation_mode, count);
        let unmodeled = unmodeled
            .or(admin)
            .or(capacity.then_some("a capacity request"));
        Exact {
            class: class.to_string(),
            selectors: selectors_of(selectors),
            mode,
            unmodeled,
        }
    }
}

impl Request {
    fn from_api(r: &DeviceRequest) -> Request {
        let alternatives = match (&r.exactly, &r.first_available) {
            (Some(e), _) => vec![Exact::from_exact(e)],
            (None, Some(subs)) => subs.iter().map(Exact::from_sub).collect(),
            (None, None) => vec![],
        };
        Request {
            name: r.name.clone(),
            alternatives,
        }
    }
}

impl ClaimSpec {
    pub fn from_api(s: &ResourceClaimSpec) -> ClaimSpec {
        let devices = s.devices.as_ref();
        let reqs: Vec<&DeviceRequest> = devices
            .and_then(|d| d.requests.as_ref())
            .into_iter()
            .flatten()
            .collect();
        let mut unmodeled = None;
        if devices
            .and_then(|d| d.constraints.as_ref())
            .is_some_and(|c| !c.is_empty())
        {
            unmodeled = Some("claim constraints (matchAttribute, distinctAttribute)");
        }
        if reqs.len() > MAX_REQUESTS_PER_CLAIM {
            unmodeled = Some("more requests than raygate reads");
        }
        ClaimSpec {
            requests: reqs
                .into_iter()
                .take(MAX_REQUESTS_PER_CLAIM)
                .map(Request::from_api)
                .collect(),
            unmodeled,
        }
    }
}

impl Claim {
    pub fn from_api(c: &ResourceClaim) -> Claim {
        let allocated = c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.devices.as_ref())
            .and_then(|d| d.results.as_ref())
            .into_iter()
            .flatten()
            .filter(|r| r.admin_access != Some(true))
            .take(MAX_DEVICES_PER_SLICE)
            .map(|r| DeviceId {
                driver: r.driver.clone(),
                pool: r.pool.clone(),
                device: r.device.clone(),
            })
            .collect();
        let extended = c
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(EXTENDED_RESOURCE_CLAIM))
            .is_some_and(|v| v == "true");
        let extended_for = extended
            .then(|| {
                c.metadata
                    .owner_references
                    .iter()
                    .flatten()
                    .find(|o| o.kind == "Pod" && o.api_version == "v1")
                    .map(|o| o.name.clone())
            })
            .flatten();
        let node = c
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.node_selector.as_ref())
            .and_then(|ns| match &ns.node_selector_terms[..] {
                [term] => match term.match_fields.as_deref() {
                    Some([f]) if f.key == "metadata.name" && f.operator == "In" => {
                        match f.values.as_deref() {
                            Some([name]) => Some(name.clone()),
                            _ => None,
                        }
                    }
                    _ => None,
                },
                _ => None,
            });
        Claim {
            spec: ClaimSpec::from_api(&c.spec),
            allocated,
            extended_for,
            node,
        }
    }
}

#[cfg(test)]
mod fit_tests;

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use serde_json::{Value, json};

    /// A node-local ResourceSlice of `n` GPUs named `gpu-0..`, with `productName` and `index`.
    pub(crate) fn slice(name: &str, node: &str, pool: &str, generation: i64, n: usize) -> Value {
        slice_with(name, node, pool, generation, 1, n, "H100")
    }

    pub(crate) fn slice_with(
        name: &str,
        node: &str,
        pool: &str,
        generation: i64,
        count: i64,
        n: usize,
        product: &str,
    ) -> Value {
        let devices: Vec<Value> = (0..n)
            .map(|i| {
                json!({"name": format!("gpu-{i}"), "attributes": {
                    "productName": {"string": product}, "index": {"int": i}}})
            })
            .collect();
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
            "metadata": {"name": name},
            "spec": {"driver": "gpu.example.com", "nodeName": node,
                "pool": {"name": pool, "generation": generation, "resourceSliceCount": count},
                "devices": devices}})
    }

    pub(crate) fn class(name: &str, selector: Option<&str>, ext: Option<&str>) -> Value {
        let mut selectors =
            vec![json!({"cel": {"expression": "device.driver == \"gpu.example.com\""}})];
        if let Some(s) = selector {
            selectors.push(json!({"cel": {"expression": s}}));
        }
        let mut spec = json!({"selectors": selectors});
        if let Some(e) = ext {
            spec["extendedResourceName"] = json!(e);
        }
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
            "metadata": {"name": name, "creationTimestamp": "2026-01-01T00:00:00Z"}, "spec": spec})
    }

    pub(crate) fn template(ns: &str, name: &str, requests: Value) -> Value {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"spec": {"devices": {"requests": requests}}}})
    }

    pub(crate) fn allocated_claim(ns: &str, name: &str, pool: &str, devices: &[&str]) -> Value {
        let results: Vec<Value> = devices
            .iter()
            .map(
                |d| json!({"request": "r", "driver": "gpu.example.com", "pool": pool, "device": d}),
            )
            .collect();
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu"}}]}},
            "status": {"allocation": {"devices": {"results": results}}}})
    }

    pub(crate) fn state_of(objects: &[Value]) -> DraState {
        let mut s = DraState::default();
        for o in objects {
            let _changed = match o["kind"].as_str() {
                Some("ResourceSlice") => s.apply_slice(&serde_json::from_value(o.clone()).unwrap()),
                Some("DeviceClass") => s.apply_class(&serde_json::from_value(o.clone()).unwrap()),
                Some("ResourceClaim") => s.apply_claim(&serde_json::from_value(o.clone()).unwrap()),
                Some("ResourceClaimTemplate") => {
                    s.apply_template(&serde_json::from_value(o.clone()).unwrap())
                }
                k => panic!("kind {k:?}"),
            };
        }
        s
    }

    #[test]
    fn records_keep_what_the_allocator_reads() {
        let s = state_of(&[
            slice("a-gpus", "a", "a", 1, 2),
            class("gpu", None, Some("nvidia.com/gpu")),
            template(
                "ml",
                "two",
                json!([{"name": "g", "exactly": {"deviceClassName": "gpu", "count": 2}},
                       {"name": "all", "exactly": {"deviceClassName": "gpu", "allocationMode": "All"}},
                       {"name": "fa", "firstAvailable": [
                           {"name": "big", "deviceClassName": "gpu", "count": 4},
                           {"name": "small", "deviceClassName": "gpu"}]}]),
            ),
            allocated_claim("ml", "used", "a", &["gpu-1"]),
        ]);
        let sl = &s.slices["a-gpus"];
        assert_eq!(sl.node.as_deref(), Some("a"));
        assert_eq!(sl.devices.len(), 2);
        assert_eq!(
            sl.devices[1].attributes["index"],
            AttrValue::Int(1),
            "{:?}",
            sl.devices[1]
        );
        assert_eq!(
            s.classes["gpu"].extended_resource_name.as_deref(),
            Some("nvidia.com/gpu")
        );
        assert_eq!(s.classes["gpu"].created, 1_767_225_600);
        let t = &s.templates["ml/two"];
        assert_eq!(t.requests[0].alternatives[0].mode, Mode::Count(2));
        assert_eq!(t.requests[1].alternatives[0].mode, Mode::All);
        assert_eq!(t.requests[2].alternatives.len(), 2);
        assert_eq!(t.requests[2].alternatives[1].mode, Mode::Count(1));
        assert_eq!(s.claims["ml/used"].allocated[0].device, "gpu-1");
        assert_eq!(s.in_use().len(), 1);
        let mut s2 = s.clone();
        s2.delete_claim("ml", "used");
        s2.delete_slice("a-gpus");
        s2.delete_template("ml", "two");
        s2.delete_class("gpu");
        assert!(s2.is_empty() && s2.claims.is_empty() && s2.templates.is_empty());
    }

    #[test]
    fn unmodeled_features_are_named() {
        let mut sl = slice("s", "a", "a", 1, 1);
        sl["spec"]["devices"][0]["taints"] = json!([{"key": "k", "effect": "NoSchedule"}]);
        let s = state_of(&[sl]);
        assert_eq!(s.slices["s"].devices[0].unmodeled, Some("device taints"));
        let t = state_of(&[
            json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimTemplate",
            "metadata": {"name": "t", "namespace": "ns"},
            "spec": {"spec": {"devices": {
                "requests": [{"name": "a", "exactly": {"deviceClassName": "gpu", "adminAccess": true}}],
                "constraints": [{"matchAttribute": "gpu.example.com/numa"}]}}}}),
        ]);
        let spec = &t.templates["ns/t"];
        assert!(spec.unmodeled.unwrap().contains("constraints"));
        assert_eq!(
            spec.requests[0].alternatives[0].unmodeled,
            Some("admin access")
        );
    }
}
