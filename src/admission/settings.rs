//! A plan's spec as the decision uses it: parsed and checked once, when the
//! plan is read, so no rule handles strings and a bad value is one error with
//! its field path (`spec.headroom[nvidia.com/gpu]`) instead of a surprise
//! deep in a decision.

use std::time::Duration;

use crate::capacity::ResourceList;
use crate::quantity::Quantity;
use crate::schedule::{self, Window};
use crate::upgradeplan::UpgradePlan;

/// The shortest `spec.stallAfter` (also the CRD's rule).
pub const MIN_STALL_AFTER: Duration = Duration::from_secs(60);

/// What the operator's flags set for every plan, read once at start-up and
/// carried (in the controller's context, or `kubectl raygate fit`'s flags)
/// into every [`Settings`]: no process-wide state, so a decision is a
/// function of its inputs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Operator {
    /// `--max-priority`: the namespaces' priority ceilings.
    pub ceilings: super::priority::Ceilings,
    /// `--default-batching-quiet-period`, `--default-batching-max-delay`.
    pub batching: super::batch::Defaults,
}

impl Operator {
    /// From the flags' values; an error names the flag.
    pub fn parse(
        max_priority: &[String],
        batching_quiet_period: &str,
        batching_max_delay: &str,
    ) -> crate::Result<Operator> {
        Ok(Operator {
            ceilings: super::priority::Ceilings::parse(max_priority)?,
            batching: super::batch::Defaults::parse(batching_quiet_period, batching_max_delay)?,
        })
    }
}

/// The typed spec of one plan.
#[derive(Debug, Clone)]
pub struct Settings {
    /// `spec.priority` after the namespace's ceiling (see [`super::priority`]).
    pub priority: i32,
    /// Resources always left free, as quantities.
    pub headroom: ResourceList,
    pub stall_after: Duration,
    /// The windows (allow and deny) in the plan's time zone; none: upgrades
    /// may start at any time.
    pub calendar: schedule::Calendar,
    /// The strategy the gate opens with.
    pub upgrade_type: crate::upgradeplan::PlanUpgradeType,
    /// `spec.batching` or the operator's default; `None`: not batched.
    pub batching: Option<super::batch::Batching>,
}

impl Settings {
    /// Parses `plan.spec` under the operator's flags; the error names every
    /// offending field.
    pub fn parse(plan: &UpgradePlan, operator: &Operator) -> crate::Result<Settings> {
        let spec = &plan.spec;
        let mut errors = vec![];
        let mut headroom = ResourceList::new();
        for (name, value) in &spec.headroom {
            match Quantity::parse_amount_field(&format!("spec.headroom[{name}]"), value) {
                Ok(q) => {
                    headroom.insert(name.clone(), q);
                }
                Err(e) => errors.push(e),
            }
        }
        let stall_after = schedule::parse_duration("spec.stallAfter", &spec.stall_after)
            .map_err(|e| errors.push(e))
            .ok();
        if stall_after.is_some_and(|d| d < MIN_STALL_AFTER) {
            errors.push(crate::Error::invalid(
                "spec.stallAfter",
                format!(
                    "{} is less than 1m: every transition would be reported Stalled at once",
                    spec.stall_after
                ),
            ));
        }
        let windows = |field: &str,
                       list: &[crate::upgradeplan::MaintenanceWindow],
                       errors: &mut Vec<crate::Error>| {
            let mut out = vec![];
            if list.len() > schedule::MAX_WINDOWS {
                errors.push(crate::Error::invalid(
                    field,
                    format!(
                        "{} windows, more than the {} raygate evaluates per plan",
                        list.len(),
                        schedule::MAX_WINDOWS
                    ),
                ));
                return out;
            }
            for (i, w) in list.iter().enumerate() {
                match Window::parse(&format!("{field}[{i}]"), &w.schedule, &w.duration) {
                    Ok(w) => out.push(w),
                    Err(e) => errors.push(e),
                }
            }
            out
        };
        let allow = windows(
            "spec.maintenanceWindows",
            &spec.maintenance_windows,
            &mut errors,
        );
        let deny = windows("spec.denyWindows", &spec.deny_windows, &mut errors);
        let zone = schedule::Calendar::zone("spec.timeZone", spec.time_zone.as_deref())
            .map_err(|e| errors.push(e))
            .ok();
        let batching = super::batch::Batching::of(spec.batching.as_ref(), operator.batching)
            .map_err(|e| errors.push(e))
            .ok()
            .flatten();
        if let Some(e) = crate::Error::all(errors) {
            return Err(e);
        }
        Ok(Settings {
            priority: operator.ceilings.of(plan),
            headroom,
            stall_after: stall_after.unwrap_or_default(),
            calendar: {
                let (time_zone, tz) =
                    zone.unwrap_or_else(|| ("UTC".into(), jiff::tz::TimeZone::UTC));
                schedule::Calendar {
                    time_zone,
                    tz,
                    allow,
                    deny,
                }
            },
            upgrade_type: spec.upgrade_type,
            batching,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::upgradeplan::UpgradePlanSpec;
    use serde_json::json;

    impl Settings {
        /// Tests: `plan.spec` under no operator flags (no ceiling, no
        /// default batching).
        pub(crate) fn of(plan: &UpgradePlan) -> crate::Result<Settings> {
            Settings::parse(plan, &Operator::default())
        }
    }

    fn plan(spec: serde_json::Value) -> UpgradePlan {
        let spec: UpgradePlanSpec = serde_json::from_value(spec).unwrap();
        UpgradePlan::new("p", spec)
    }

    #[test]
    fn a_valid_spec_becomes_typed_values() {
        let s = Settings::of(&plan(json!({
            "rayServiceRef": {"name": "llm"}, "priority": 7, "stallAfter": "1h30m",
            "headroom": {"nvidia.com/gpu": "2", "memory": "1Gi"},
            "maintenanceWindows": [{"schedule": "0 2 * * *", "duration": "2h"}]
        })))
        .unwrap();
        assert_eq!(s.priority, 7);
        assert_eq!(s.stall_after, Duration::from_secs(5400));
        assert_eq!(s.headroom["nvidia.com/gpu"], Quantity::from_units(2));
        assert_eq!(s.headroom["memory"].canonical(), "1Gi");
        assert_eq!(s.calendar.allow.len(), 1);
    }

    #[test]
    fn each_bad_field_is_named() {
        for (spec, field) in [
            (
                json!({"headroom": {"nvidia.com/gpu": "two"}}),
                "spec.headroom[nvidia.com/gpu]",
            ),
            (json!({"stallAfter": "soon"}), "spec.stallAfter"),
            (
                json!({"stallAfter": "0s"}),
                "spec.stallAfter: 0s is less than 1m",
            ),
            (
                json!({"stallAfter": "59s"}),
                "spec.stallAfter: 59s is less than 1m",
            ),
            (
                json!({"stallAfter": "99999999999999999999h"}),
                "spec.stallAfter: invalid duration",
            ),
            (
                json!({"maintenanceWindows": vec![json!({"schedule": "0 0 31 2 *", "duration": "744h"}); 51]}),
                "spec.maintenanceWindows: 51 windows, more than the 50",
            ),
            (
                json!({"maintenanceWindows": [{"schedule": "0 2 * * *", "duration": "2h"},
                                              {"schedule": "nope", "duration": "1h"}]}),
                "spec.maintenanceWindows[1]",
            ),
            (
                json!({"denyWindows": [{"schedule": "0 0 26 11", "duration": "120h"}]}),
                "spec.denyWindows[0].schedule",
            ),
            (
                json!({"timeZone": "Europe/Atlantis"}),
                "spec.timeZone: unknown time zone \"Europe/Atlantis\"",
            ),
            (
                json!({"batching": {"quietPeriod": "1h", "maxDelay": "10m"}}),
                "spec.batching.maxDelay",
            ),
        ] {
            let mut full = json!({"rayServiceRef": {"name": "llm"}});
            for (k, v) in spec.as_object().unwrap() {
                full[k] = v.clone();
            }
            let e = Settings::of(&plan(full)).unwrap_err().to_string();
            assert!(e.starts_with(field), "{field}: {e}");
        }
    }

    /// The operator's flags reach a plan's settings through `Operator`, not a
    /// process-wide setting: two operators read the same plan differently.
    #[test]
    fn the_operators_ceilings_and_default_batching_apply() {
        let mut p = plan(json!({"rayServiceRef": {"name": "llm"}, "priority": 10}));
        p.metadata.namespace = Some("tenant".into());
        let none = Settings::parse(&p, &Operator::default()).unwrap();
        assert_eq!((none.priority, none.batching), (10, None));
        let capped = Operator::parse(&["0".into(), "platform=100".into()], "10m", "1h").unwrap();
        let s = Settings::parse(&p, &capped).unwrap();
        assert_eq!(s.priority, 0);
        let b = s.batching.unwrap();
        assert_eq!(
            (b.quiet_period, b.max_delay),
            (Duration::from_secs(600), Duration::from_secs(3600))
        );
        let e = Operator::parse(&["high".into()], "", "6h").unwrap_err();
        assert!(e.to_string().starts_with("--max-priority"), "{e}");
    }

    #[test]
    fn every_bad_field_is_named_at_once() {
        let e = Settings::of(&plan(json!({
            "rayServiceRef": {"name": "llm"}, "stallAfter": "soon",
            "maintenanceWindows": [{"schedule": "61 * * * *", "duration": "1h"}]
        })))
        .unwrap_err()
        .to_string();
        assert!(
            e.starts_with("spec.stallAfter") && e.contains("; spec.maintenanceWindows[0]"),
            "{e}"
        );
    }
}
