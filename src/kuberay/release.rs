//! Which KubeRay release runs, read from the cluster rather than assumed.
//!
//! KubeRay stamps every RayCluster it creates or rewrites with its own release,
//! `ray.io/kuberay-version` (`utils.KUBERAY_VERSION`, v1.2.0+), and rewrites the active
//! cluster in place when that stamp differs from the running operator's
//! ([`super::Rules::version_annotation_updates_in_place`]). The newest stamp among the
//! RayClusters of a namespace is therefore the release of the operator that manages that
//! namespace (a namespace-scoped operator per team included): an operator upgrade shows
//! there as soon as KubeRay has rewritten one cluster, and the clusters not rewritten yet
//! are then judged by the new operator's rules, which predict that rewrite.
//!
//! Order, per namespace: the newest stamp on its RayClusters; else the newest stamp on
//! any RayCluster raygate watches; else `--kuberay-version`; else the newest release raygate
//! knows. A flag that disagrees with the stamps is reported, never applied over them: the
//! stamps are written by the operator itself. A release raygate does not know gets the
//! rules of the nearest older one it knows, with a warning.

use std::collections::HashMap;
use std::fmt;

use super::version::{KubeRayVersion, SUPPORTED};

/// Where a namespace's release was read. Written to status and the metric
/// as [`ReleaseSource::as_str`]'s word, the one place it is spelled.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ReleaseSource {
    /// Stamped on a RayCluster of the namespace.
    Namespace,
    /// Stamped on a RayCluster of another namespace (this one has none yet).
    Cluster,
    /// `--kuberay-version`: no RayCluster is stamped.
    Flag,
    /// Nothing says: the newest release raygate knows.
    #[default]
    Default,
}

impl ReleaseSource {
    pub const ALL: [ReleaseSource; 4] = [
        ReleaseSource::Namespace,
        ReleaseSource::Cluster,
        ReleaseSource::Flag,
        ReleaseSource::Default,
    ];

    /// The word in status and in the metric's `source` label.
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseSource::Namespace => "RayCluster",
            ReleaseSource::Cluster => "OtherNamespace",
            ReleaseSource::Flag => "Flag",
            ReleaseSource::Default => "Default",
        }
    }
}

impl serde::Serialize for ReleaseSource {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.as_str())
    }
}

impl<'de> serde::Deserialize<'de> for ReleaseSource {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<ReleaseSource, D::Error> {
        let word = String::deserialize(d)?;
        ReleaseSource::ALL
            .into_iter()
            .find(|s| s.as_str() == word)
            .ok_or_else(|| serde::de::Error::custom(format!("unknown release source {word:?}")))
    }
}

/// A string of one of [`ReleaseSource::as_str`]'s words, so the apiserver
/// refuses what raygate could not read back.
impl schemars::JsonSchema for ReleaseSource {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        "ReleaseSource".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        let words = ReleaseSource::ALL.map(ReleaseSource::as_str);
        schemars::json_schema!({"type": "string", "enum": words})
    }
}

/// A `ray.io/kuberay-version` value, as numbers, with the rules that apply to it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Stamp {
    /// The annotation as written (`v1.6.2`).
    pub raw: String,
    /// `(major, minor, patch)` for ordering stamps, known releases or not.
    order: (u16, u16, u16),
    /// The release whose rules apply: the stamp itself, or the nearest older known one.
    pub rules: KubeRayVersion,
    /// The stamp is a release raygate knows exactly.
    pub known: bool,
}

impl Stamp {
    /// Reads an annotation value: `v1.6.2`, `1.6.2`, or with a pre-release or build
    /// suffix (`v1.7.0-rc.1`, `v1.6.2+acme`), which gets the rules of its numbers. `None`
    /// for a value that is not a version at all, or older than every known release.
    pub fn parse(raw: &str) -> Option<Stamp> {
        let t = raw.trim();
        let t = t.strip_prefix('v').unwrap_or(t);
        let core = t.split(['-', '+']).next().unwrap_or(t);
        let mut parts = core.split('.').map(|p| p.parse::<u16>().ok());
        let order = match (parts.next(), parts.next(), parts.next(), parts.next()) {
            (Some(Some(a)), Some(Some(b)), Some(Some(c)), None) => (a, b, c),
            _ => return None,
        };
        let as_version = |k: &KubeRayVersion| (k.major, k.minor, k.patch);
        let rules = SUPPORTED
            .iter()
            .copied()
            .filter(|k| as_version(k) <= order)
            .max()?;
        Some(Stamp {
            raw: raw.to_string(),
            order,
            known: as_version(&rules) == order && core.len() == t.len(),
            rules,
        })
    }
}

/// The release whose rules raygate applies to one RayService, and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Release {
    /// The rules applied.
    pub version: KubeRayVersion,
    pub source: ReleaseSource,
    /// The stamp read, when the source is a RayCluster.
    pub stamp: Option<Stamp>,
    /// `--kuberay-version`, when given.
    pub flag: Option<KubeRayVersion>,
    /// `--kuberay-incremental-upgrades`: the operator's `RayServiceIncrementalUpgrade`
    /// feature gate, when given (it is not in any object raygate can read).
    pub incremental_gate: Option<bool>,
}

impl Release {
    /// Release `version` with nothing read from the cluster (offline commands, tests).
    pub fn assumed(version: KubeRayVersion) -> Release {
        Release {
            version,
            source: ReleaseSource::Flag,
            stamp: None,
            flag: Some(version),
            incremental_gate: None,
        }
    }

    /// Whether the operator runs incremental upgrades: the flag, else the release's
    /// default (off in v1.5–v1.6, on in v1.7).
    pub fn incremental_gate(&self) -> bool {
        self.incremental_gate
            .unwrap_or(self.version.rules().incremental_upgrade_gate_default)
    }

    /// `--kuberay-version` names another release than the RayClusters' stamps.
    pub fn flag_mismatch(&self) -> Option<KubeRayVersion> {
        let stamp = self.stamp.as_ref()?;
        self.flag
            .filter(|f| (f.major, f.minor, f.patch) != stamp.order)
    }

    /// The stamp names a release raygate does not know: its nearest older rules apply.
    pub fn unknown(&self) -> bool {
        self.stamp.as_ref().is_some_and(|s| !s.known)
    }

    /// What to do about it, when something is off: `(reason, message)`.
    pub fn problem(&self) -> Option<(ReleaseProblem, String)> {
        let stamp = self.stamp.as_ref();
        if let (Some(flag), Some(s)) = (self.flag_mismatch(), stamp) {
            return Some((
                ReleaseProblem::FlagMismatch,
                format!(
                    "--kuberay-version is {flag} but the KubeRay operator stamped {} on the \
                     RayClusters ({}): raygate applies {}'s rules; correct or remove \
                     --kuberay-version (chart value kuberayVersion)",
                    s.raw,
                    self.where_(),
                    self.version
                ),
            ));
        }
        if let (true, Some(s)) = (self.unknown(), stamp) {
            return Some((
                ReleaseProblem::UnknownRelease,
                format!(
                    "the KubeRay operator stamped {} on the RayClusters ({}), a release raygate \
                     does not know: it applies the rules of {}, the nearest older release it \
                     knows; check the compatibility table before relying on them",
                    s.raw,
                    self.where_(),
                    self.version
                ),
            ));
        }
        if !self.version.rules().upgrade_strategy_field {
            return Some((
                ReleaseProblem::NotGateable,
                format!(
                    "KubeRay {} ({}) has no RayService spec.upgradeStrategy: raygate can gate \
                     KubeRay v1.3 and newer",
                    self.version,
                    self.describe()
                ),
            ));
        }
        None
    }

    fn where_(&self) -> &'static str {
        match self.source {
            ReleaseSource::Cluster => "in another namespace",
            _ => "ray.io/kuberay-version",
        }
    }

    /// One line for status and the CLI: `v1.6.2, stamped on the namespace's RayClusters`.
    pub fn describe(&self) -> String {
        match (self.source, &self.stamp) {
            (ReleaseSource::Namespace, Some(s)) => {
                format!("{} stamped on the namespace's RayClusters", s.raw)
            }
            (ReleaseSource::Cluster, Some(s)) => {
                format!("{} stamped on RayClusters of another namespace", s.raw)
            }
            (ReleaseSource::Flag, _) => "--kuberay-version; no RayCluster is stamped".to_string(),
            _ => "the newest release raygate knows; no RayCluster is stamped".to_string(),
        }
    }
}

/// Why a release is reported as a problem; the condition's reason.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReleaseProblem {
    FlagMismatch,
    UnknownRelease,
    NotGateable,
}

impl ReleaseProblem {
    pub fn as_str(self) -> &'static str {
        match self {
            ReleaseProblem::FlagMismatch => "FlagMismatch",
            ReleaseProblem::UnknownRelease => "UnknownRelease",
            ReleaseProblem::NotGateable => "NotGateable",
        }
    }
}

impl fmt::Display for ReleaseProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The stamps seen on the RayClusters raygate watches: newest per namespace and overall.
#[derive(Clone, Debug, Default)]
pub struct Releases {
    by_namespace: HashMap<String, Stamp>,
    newest: Option<Stamp>,
    flag: Option<KubeRayVersion>,
    incremental_gate: Option<bool>,
}

impl Releases {
    /// With the operator's `RayServiceIncrementalUpgrade` feature gate as configured.
    pub fn with_incremental_gate(mut self, gate: Option<bool>) -> Releases {
        self.incremental_gate = gate;
        self
    }

    /// From `(namespace, ray.io/kuberay-version)` of every watched RayCluster; values that
    /// are not versions are skipped.
    pub fn from_stamps<'a>(
        stamps: impl IntoIterator<Item = (&'a str, &'a str)>,
        flag: Option<KubeRayVersion>,
    ) -> Releases {
        let mut r = Releases {
            flag,
            ..Default::default()
        };
        for (ns, raw) in stamps {
            let Some(stamp) = Stamp::parse(raw) else {
                continue;
            };
            let newer = |old: Option<&Stamp>| old.is_none_or(|o| stamp.order > o.order);
            if newer(r.newest.as_ref()) {
                r.newest = Some(stamp.clone());
            }
            if newer(r.by_namespace.get(ns)) {
                r.by_namespace.insert(ns.to_string(), stamp);
            }
        }
        r
    }

    /// The release for RayServices of namespace `ns`.
    pub fn for_namespace(&self, ns: &str) -> Release {
        let (source, stamp) = match (self.by_namespace.get(ns), &self.newest) {
            (Some(s), _) => (ReleaseSource::Namespace, Some(s.clone())),
            (None, Some(s)) => (ReleaseSource::Cluster, Some(s.clone())),
            (None, None) if self.flag.is_some() => (ReleaseSource::Flag, None),
            (None, None) => (ReleaseSource::Default, None),
        };
        let version = stamp
            .as_ref()
            .map(|s| s.rules)
            .or(self.flag)
            .unwrap_or_else(KubeRayVersion::latest);
        Release {
            version,
            source,
            stamp,
            flag: self.flag,
            incremental_gate: self.incremental_gate,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Status carries the word `as_str` spells, and reads it back; the schema
    /// lists exactly those words.
    #[test]
    fn a_release_source_is_written_and_read_as_its_word() {
        for s in ReleaseSource::ALL {
            let v = serde_json::to_value(s).unwrap();
            assert_eq!(v, serde_json::json!(s.as_str()));
            assert_eq!(serde_json::from_value::<ReleaseSource>(v).unwrap(), s);
        }
        assert_eq!(
            serde_json::to_value(ReleaseSource::Namespace).unwrap(),
            "RayCluster"
        );
        assert!(serde_json::from_value::<ReleaseSource>(serde_json::json!("Namespace")).is_err());
        let schema = schemars::schema_for!(ReleaseSource);
        assert_eq!(
            schema.get("enum"),
            Some(&serde_json::json!([
                "RayCluster",
                "OtherNamespace",
                "Flag",
                "Default"
            ]))
        );
    }

    fn ver(s: &str) -> KubeRayVersion {
        KubeRayVersion::parse(s).expect("known")
    }

    #[test]
    fn stamps_parse_to_the_rules_of_their_release_or_the_nearest_older_one() {
        let s = Stamp::parse("v1.6.2").expect("stamp");
        assert_eq!((s.rules, s.known), (ver("1.6.2"), true));
        let s = Stamp::parse("1.5.2").expect("stamp");
        assert_eq!((s.rules, s.known), (ver("1.5.2"), true));
        // Not released as far as raygate knows: the nearest older rules, flagged unknown.
        let s = Stamp::parse("v1.6.3").expect("stamp");
        assert_eq!((s.rules, s.known), (ver("1.6.2"), false));
        let s = Stamp::parse("v1.9.0").expect("stamp");
        assert_eq!((s.rules, s.known), (ver("1.7.0"), false));
        let s = Stamp::parse("v2.0.0").expect("stamp");
        assert_eq!((s.rules, s.known), (ver("1.7.0"), false));
        // A suffix is a build of those numbers, not the release itself.
        let s = Stamp::parse("v1.6.2+acme").expect("stamp");
        assert_eq!((s.rules, s.known), (ver("1.6.2"), false));
        let s = Stamp::parse("v1.7.0-rc.1").expect("stamp");
        assert_eq!(s.rules, ver("1.7.0"));
        for bad in [
            "", "latest", "v1.6", "v1.6.2.1", "vx.y.z", "v0.9.0", "v1.-1.0",
        ] {
            assert_eq!(Stamp::parse(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn a_namespace_gets_its_own_newest_stamp_then_the_clusters_then_the_flag() {
        let r = Releases::from_stamps(
            [
                ("team-a", "v1.5.2"),
                ("team-a", "v1.6.2"), // the operator was upgraded; one cluster rewritten
                ("team-b", "v1.5.2"),
                ("team-b", "garbage"),
            ],
            None,
        );
        let a = r.for_namespace("team-a");
        assert_eq!(
            (a.version, a.source),
            (ver("1.6.2"), ReleaseSource::Namespace)
        );
        // A namespace-scoped operator of another release manages team-b.
        let b = r.for_namespace("team-b");
        assert_eq!(
            (b.version, b.source),
            (ver("1.5.2"), ReleaseSource::Namespace)
        );
        let c = r.for_namespace("fresh");
        assert_eq!(
            (c.version, c.source),
            (ver("1.6.2"), ReleaseSource::Cluster)
        );
        assert_eq!(c.problem(), None);

        let none = Releases::from_stamps([], Some(ver("1.5")));
        let f = none.for_namespace("x");
        assert_eq!((f.version, f.source), (ver("1.5.2"), ReleaseSource::Flag));
        assert_eq!(f.problem(), None);
        let d = Releases::from_stamps([], None).for_namespace("x");
        assert_eq!(
            (d.version, d.source),
            (KubeRayVersion::latest(), ReleaseSource::Default)
        );
    }

    #[test]
    fn a_flag_that_disagrees_with_the_stamps_is_reported_and_the_stamps_apply() {
        // The chart's old default (1.7) on a v1.6.2 operator: the defect of issue 24.
        let r = Releases::from_stamps([("llm", "v1.6.2")], Some(ver("1.7")));
        let rel = r.for_namespace("llm");
        assert_eq!(rel.version, ver("1.6.2"));
        assert_eq!(rel.flag_mismatch(), Some(ver("1.7.0")));
        let (reason, msg) = rel.problem().expect("mismatch");
        assert_eq!(reason, ReleaseProblem::FlagMismatch);
        assert!(msg.contains("--kuberay-version is v1.7.0"), "{msg}");
        assert!(msg.contains("stamped v1.6.2"), "{msg}");
        assert!(msg.contains("applies v1.6.2's rules"), "{msg}");
        // Agreeing: nothing to say.
        let ok = Releases::from_stamps([("llm", "v1.6.2")], Some(ver("1.6")));
        assert_eq!(ok.for_namespace("llm").problem(), None);
    }

    #[test]
    fn an_unknown_release_gets_the_nearest_older_rules_with_a_warning() {
        let rel = Releases::from_stamps([("llm", "v1.8.1")], None).for_namespace("llm");
        assert_eq!(rel.version, ver("1.7.0"));
        let (reason, msg) = rel.problem().expect("unknown");
        assert_eq!(reason, ReleaseProblem::UnknownRelease);
        assert!(
            msg.contains("v1.8.1") && msg.contains("rules of v1.7.0"),
            "{msg}"
        );
    }

    #[test]
    fn a_release_without_the_gate_field_cannot_be_gated() {
        let rel = Releases::from_stamps([("old", "v1.2.2")], None).for_namespace("old");
        assert_eq!(rel.version, ver("1.2.2"));
        let (reason, msg) = rel.problem().expect("not gateable");
        assert_eq!(reason, ReleaseProblem::NotGateable);
        assert!(msg.contains("v1.3 and newer"), "{msg}");
    }
}
