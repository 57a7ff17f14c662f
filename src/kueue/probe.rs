//! `--kueue=auto|true|false`: whether raygate's Kueue support runs, decided
//! once at start-up from what the API server says. Pure: the decision over
//! the facts a probe gathered ([`Probe`]); the probe's calls are in
//! `controller::kueue_probe` (one discovery call, a bounded number of
//! SelfSubjectAccessReviews).
//!
//! Why a probe: the support watches ClusterQueues, LocalQueues and Workloads
//! of `kueue.x-k8s.io/v1beta2` and writes reservation Workloads. On a cluster
//! without Kueue, or where raygate's identity lacks the RBAC, turning it on
//! only makes Kueue-managed RayServices wait with "quota unknown"; turning it
//! off where Kueue runs lets their upgrades through on the nodes alone (an
//! elastic one is then held `KueueSupportOff`). `auto` picks what the cluster
//! supports; `true` insists (see [`decide`]).

use std::fmt;
use std::str::FromStr;

use super::types::{GROUP, VERSION};

/// The value of `--kueue`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Mode {
    /// On iff the probe finds the API served and the access granted.
    #[default]
    Auto,
    /// Required: on whatever the probe finds; what is missing is logged as
    /// an error and keeps `/readyz` failing until the Kueue caches sync.
    On,
    /// Off: nothing of Kueue is watched, read or written.
    Off,
}

impl FromStr for Mode {
    type Err = String;

    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "auto" => Ok(Mode::Auto),
            "true" => Ok(Mode::On),
            "false" => Ok(Mode::Off),
            other => Err(format!("{other:?} is not one of auto, true, false")),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Mode::Auto => "auto",
            Mode::On => "true",
            Mode::Off => "false",
        })
    }
}

/// The resources of `kueue.x-k8s.io/v1beta2` the support uses.
pub const RESOURCES: [&str; 3] = ["workloads", "clusterqueues", "localqueues"];

/// One access the support needs, asked with a SelfSubjectAccessReview.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Check {
    pub verb: &'static str,
    pub resource: &'static str,
    pub subresource: Option<&'static str>,
    /// `None`: cluster-wide (a cluster-scoped resource, or every namespace).
    pub namespace: Option<String>,
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if let Some(s) = self.subresource {
            write!(f, "/{s}")?;
        }
        match &self.namespace {
            Some(ns) => write!(f, " in namespace {ns}"),
            None => Ok(()),
        }
    }
}

/// At most this many watched namespaces are checked (the checks per
/// namespace are six): the probe stays a bounded number of calls.
pub const MAX_NAMESPACES_CHECKED: usize = 8;

/// The accesses to check for `namespaces` (`--namespace`; empty: all):
/// what the caches list and watch, and what the reservations write (the
/// chart's `kueue.reservations.enabled` ClusterRole). ClusterQueues are
/// cluster-scoped; LocalQueues and Workloads are asked per watched
/// namespace (a RoleBinding may grant them there only), for at most
/// [`MAX_NAMESPACES_CHECKED`] of them.
pub fn checks(namespaces: &[String]) -> Vec<Check> {
    let check = |verb, resource, subresource, namespace: Option<&String>| Check {
        verb,
        resource,
        subresource,
        namespace: namespace.cloned(),
    };
    let mut out = vec![
        check("list", "clusterqueues", None, None),
        check("watch", "clusterqueues", None, None),
    ];
    let scopes: Vec<Option<&String>> = if namespaces.is_empty() {
        vec![None]
    } else {
        namespaces
            .iter()
            .take(MAX_NAMESPACES_CHECKED)
            .map(Some)
            .collect()
    };
    for ns in scopes {
        out.extend([
            check("list", "localqueues", None, ns),
            check("watch", "localqueues", None, ns),
            check("list", "workloads", None, ns),
            check("watch", "workloads", None, ns),
            check("create", "workloads", None, ns),
            check("delete", "workloads", None, ns),
            check("patch", "workloads", Some("status"), ns),
        ]);
    }
    out
}

/// What the probe found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Probe {
    /// The resource names `kueue.x-k8s.io/v1beta2` serves (discovery), or
    /// why they are unknown: `Ok(None)` when the group version is not served
    /// at all (404).
    pub served: Result<Option<Vec<String>>, String>,
    /// Each check and its answer: allowed, or why not (denied, or the
    /// review failed).
    pub access: Vec<(Check, Result<bool, String>)>,
}

/// How loud the start-up line is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Level {
    Info,
    Warn,
    Error,
}

/// The decision: on or off, the one log line that says why, and what keeps
/// `/readyz` failing meanwhile (only with `--kueue=true`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub enabled: bool,
    pub level: Level,
    pub message: String,
    /// `Some(reason)`: `/readyz` fails with it until the Kueue caches sync.
    pub not_ready: Option<String>,
}

/// What is missing for the support to work.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Missing {
    /// Kueue's API is not there: the common case of a cluster without Kueue.
    NotInstalled(String),
    /// Something else: discovery failed, a resource or an access is missing.
    Other(String),
}

impl Missing {
    fn why(&self) -> &str {
        match self {
            Missing::NotInstalled(s) | Missing::Other(s) => s,
        }
    }
}

fn missing(probe: &Probe) -> Option<Missing> {
    let gv = format!("{GROUP}/{VERSION}");
    match &probe.served {
        Err(e) => return Some(Missing::Other(format!("discovery of {gv} failed: {e}"))),
        Ok(None) => {
            return Some(Missing::NotInstalled(format!(
                "the API server does not serve {gv} (Kueue v0.19 or later is not installed)"
            )));
        }
        Ok(Some(served)) => {
            let absent: Vec<&str> = RESOURCES
                .iter()
                .copied()
                .filter(|r| !served.iter().any(|s| s == r))
                .collect();
            if !absent.is_empty() {
                return Some(Missing::NotInstalled(format!(
                    "{gv} does not serve {}",
                    absent.join(", ")
                )));
            }
        }
    }
    // No answer is no evidence of access.
    if probe.access.is_empty() {
        return Some(Missing::Other("no access review was answered".into()));
    }
    let denied: Vec<String> = probe
        .access
        .iter()
        .filter_map(|(c, r)| match r {
            Ok(true) => None,
            Ok(false) => Some(c.to_string()),
            Err(e) => Some(format!("{c} (review failed: {e})")),
        })
        .collect();
    (!denied.is_empty()).then(|| {
        Missing::Other(format!(
            "raygate's identity may not {} ({GROUP}; grant the chart's kueue.reservations \
             ClusterRole, or kubectl apply -k config/kueue-reservations)",
            denied.join(", ")
        ))
    })
}

/// Decide from the mode and, unless `--kueue=false`, the probe's facts
/// (`None`: the probe did not finish).
///
/// `auto` follows the probe. `true` is on whatever the probe finds:
/// Kueue-managed RayServices then wait with "quota unknown" rather than be
/// admitted on the nodes alone, the missing part is logged as an error and
/// `/readyz` fails with it, so a platform that asked for quota enforcement
/// finds out at rollout (`helm --wait`, `kubectl rollout status`), and the
/// watches' own retries make raygate ready once Kueue or the RBAC arrives,
/// without a restart. Failing the process instead would crash-loop it and
/// stop the gating of every other RayService too.
pub fn decide(mode: Mode, probe: Option<&Probe>) -> Outcome {
    if mode == Mode::Off {
        return Outcome {
            enabled: false,
            level: Level::Info,
            message: "Kueue support off (--kueue=false): Kueue-managed RayServices are detected, \
                      their quota is neither checked nor reserved"
                .into(),
            not_ready: None,
        };
    }
    let missing = match probe {
        Some(p) => missing(p),
        None => Some(Missing::Other("the probe did not finish".into())),
    };
    match (mode, missing) {
        (_, None) => Outcome {
            enabled: true,
            level: Level::Info,
            message: format!(
                "Kueue support on (--kueue={mode}): {GROUP}/{VERSION} serves workloads, \
                 clusterqueues and localqueues, and raygate may read and write what it needs"
            ),
            not_ready: None,
        },
        (Mode::On, Some(m)) => Outcome {
            enabled: true,
            level: Level::Error,
            message: format!(
                "Kueue support required (--kueue=true) but {}: Kueue-managed RayServices wait \
                 with \"quota unknown\" and /readyz fails until the Kueue caches sync",
                m.why()
            ),
            not_ready: Some(format!("--kueue=true but {}", m.why())),
        },
        (_, Some(m)) => Outcome {
            enabled: false,
            // Kueue absent is the common case; present without the access
            // is a set-up to look at.
            level: match m {
                Missing::NotInstalled(_) => Level::Info,
                Missing::Other(_) => Level::Warn,
            },
            message: format!(
                "Kueue support off (--kueue=auto): {}; restart raygate after installing Kueue \
                 or granting the access",
                m.why()
            ),
            not_ready: None,
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn all_served() -> Result<Option<Vec<String>>, String> {
        Ok(Some(
            [
                "workloads",
                "workloads/status",
                "clusterqueues",
                "localqueues",
                "cohorts",
            ]
            .map(String::from)
            .to_vec(),
        ))
    }

    fn granted(namespaces: &[String]) -> Vec<(Check, Result<bool, String>)> {
        checks(namespaces)
            .into_iter()
            .map(|c| (c, Ok(true)))
            .collect()
    }

    #[test]
    fn the_flag_takes_auto_true_false_only() {
        assert_eq!("auto".parse(), Ok(Mode::Auto));
        assert_eq!("true".parse(), Ok(Mode::On));
        assert_eq!("false".parse(), Ok(Mode::Off));
        for bad in ["", "True", "on", "yes"] {
            let e = bad.parse::<Mode>().unwrap_err();
            assert!(e.contains("auto, true, false"), "{e}");
        }
        for m in [Mode::Auto, Mode::On, Mode::Off] {
            assert_eq!(m.to_string().parse(), Ok(m));
        }
        assert_eq!(Mode::default(), Mode::Auto);
    }

    #[test]
    fn checks_are_bounded_and_per_watched_namespace() {
        let all = checks(&[]);
        assert_eq!(all.len(), 9);
        assert!(all.iter().all(|c| c.namespace.is_none()));
        assert!(
            all.iter()
                .any(|c| c.to_string() == "patch workloads/status")
        );
        let two = checks(&["a".into(), "b".into()]);
        assert_eq!(two.len(), 2 + 2 * 7);
        assert!(
            two.iter()
                .any(|c| c.to_string() == "create workloads in namespace b")
        );
        // ClusterQueues are cluster-scoped: asked cluster-wide.
        assert!(
            two.iter()
                .filter(|c| c.resource == "clusterqueues")
                .all(|c| c.namespace.is_none())
        );
        let many: Vec<String> = (0..100).map(|i| format!("ns{i}")).collect();
        assert_eq!(checks(&many).len(), 2 + MAX_NAMESPACES_CHECKED * 7);
    }

    #[test]
    fn auto_is_on_only_with_the_api_served_and_every_access_granted() {
        let ok = Probe {
            served: all_served(),
            access: granted(&[]),
        };
        let o = decide(Mode::Auto, Some(&ok));
        assert!(o.enabled && o.not_ready.is_none());
        assert_eq!(o.level, Level::Info);
        assert!(
            o.message.starts_with("Kueue support on (--kueue=auto)"),
            "{}",
            o.message
        );

        // Kueue not installed: off, said once at info.
        let absent = Probe {
            served: Ok(None),
            access: vec![],
        };
        let o = decide(Mode::Auto, Some(&absent));
        assert!(!o.enabled);
        assert_eq!(o.level, Level::Info);
        assert!(
            o.message.contains("does not serve kueue.x-k8s.io/v1beta2"),
            "{}",
            o.message
        );

        // An older Kueue (no v1beta2 clusterqueues): off.
        let partial = Probe {
            served: Ok(Some(vec!["workloads".into()])),
            access: granted(&[]),
        };
        let o = decide(Mode::Auto, Some(&partial));
        assert!(!o.enabled);
        assert!(
            o.message
                .contains("does not serve clusterqueues, localqueues"),
            "{}",
            o.message
        );

        // Served, one access denied and one review failed: off, a warning
        // naming both.
        let mut access = granted(&["ml".into()]);
        access[3].1 = Ok(false);
        access[6].1 = Err("timed out".into());
        let denied = Probe {
            served: all_served(),
            access,
        };
        let o = decide(Mode::Auto, Some(&denied));
        assert!(!o.enabled);
        assert_eq!(o.level, Level::Warn);
        assert!(
            o.message.contains("may not watch localqueues in namespace ml, create workloads in namespace ml (review failed: timed out)"),
            "{}",
            o.message
        );
        // Discovery failed, no answers, or no probe at all: off, a warning.
        for p in [
            Some(Probe {
                served: Err("503".into()),
                access: granted(&[]),
            }),
            Some(Probe {
                served: all_served(),
                access: vec![],
            }),
            None,
        ] {
            let o = decide(Mode::Auto, p.as_ref());
            assert!(!o.enabled && o.level == Level::Warn, "{o:?}");
        }
    }

    #[test]
    fn true_insists_loudly_and_false_never_probes() {
        let absent = Probe {
            served: Ok(None),
            access: vec![],
        };
        let o = decide(Mode::On, Some(&absent));
        assert!(o.enabled);
        assert_eq!(o.level, Level::Error);
        let why = o.not_ready.unwrap();
        assert!(
            why.starts_with(
                "--kueue=true but the API server does not serve kueue.x-k8s.io/v1beta2"
            ),
            "{why}"
        );
        let o = decide(Mode::On, None);
        assert!(o.enabled && o.not_ready.is_some());
        let ok = Probe {
            served: all_served(),
            access: granted(&[]),
        };
        let o = decide(Mode::On, Some(&ok));
        assert!(o.enabled && o.not_ready.is_none() && o.level == Level::Info);

        let o = decide(Mode::Off, Some(&ok));
        assert!(!o.enabled && o.not_ready.is_none());
        assert!(o.message.contains("--kueue=false"));
    }
}
