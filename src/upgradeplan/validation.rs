//! What the apiserver refuses of a plan at `kubectl apply` (issue 32, item 9),
//! as CEL rules in the CRD, so a bad schedule or duration is refused with a
//! readable message instead of being accepted and reported later in status.
//! raygate still checks every field itself (`schedule`, `admission::Settings`):
//! a CRD installed before these rules, or an apiserver without CEL, is not
//! trusted. What needs other objects (one plan per RayService) cannot be a
//! rule of one object, nor of a ValidatingAdmissionPolicy (it sees the object
//! and its params, never a list of others): it stays phase `Error`, reason
//! `Conflict` (docs/upgradeplan.md).

/// The regular expression of a 5-field cron schedule as `schedule::Cron`
/// reads it: each field `*`, `N`, `N-M`, any of them with `/STEP`, in lists;
/// minute 0-59, hour 0-23, day of month 1-31, month 1-12, day of week 0-7.
/// Generated from those ranges (RE2 syntax, as CEL's `matches` and the regex
/// crate read it).
macro_rules! cron_pattern {
    () => {
        "^\\s*([*]|(0?[0-9]|[1-5][0-9])(-(0?[0-9]|[1-5][0-9]))?)(/0*[1-9][0-9]*)?(,([*]|(0?[0-9]|[1-5][0-9])(-(0?[0-9]|[1-5][0-9]))?)(/0*[1-9][0-9]*)?)*\\s+([*]|(0?[0-9]|1[0-9]|2[0-3])(-(0?[0-9]|1[0-9]|2[0-3]))?)(/0*[1-9][0-9]*)?(,([*]|(0?[0-9]|1[0-9]|2[0-3])(-(0?[0-9]|1[0-9]|2[0-3]))?)(/0*[1-9][0-9]*)?)*\\s+([*]|(0?[1-9]|[12][0-9]|3[01])(-(0?[1-9]|[12][0-9]|3[01]))?)(/0*[1-9][0-9]*)?(,([*]|(0?[1-9]|[12][0-9]|3[01])(-(0?[1-9]|[12][0-9]|3[01]))?)(/0*[1-9][0-9]*)?)*\\s+([*]|(0?[1-9]|1[0-2])(-(0?[1-9]|1[0-2]))?)(/0*[1-9][0-9]*)?(,([*]|(0?[1-9]|1[0-2])(-(0?[1-9]|1[0-2]))?)(/0*[1-9][0-9]*)?)*\\s+([*]|(0?[0-7])(-(0?[0-7]))?)(/0*[1-9][0-9]*)?(,([*]|(0?[0-7])(-(0?[0-7]))?)(/0*[1-9][0-9]*)?)*\\s*$"
    };
}

pub const CRON_PATTERN: &str = cron_pattern!();

/// `spec.maintenanceWindows[].schedule`: the fields and their ranges.
pub const CRON_RULE: &str = concat!("self.matches(r'", cron_pattern!(), "')");

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::Cron;

    /// The CRD's rule and raygate's own parser agree on what users write.
    #[test]
    fn the_schedule_rule_accepts_what_raygate_reads_and_refuses_out_of_range_fields() {
        let re = regex::Regex::new(CRON_PATTERN).unwrap();
        for good in [
            "0 2 * * 1-5",
            "*/15 * * * *",
            "0 0 * * 6",
            "30 1 1,15 * *",
            "5/10 0-23/2 1-31 1-12 0-7",
            "0  2 * * 7",
            "59 23 31 12 0",
        ] {
            assert!(re.is_match(good), "{good}");
            assert!(Cron::parse("s", good).is_ok(), "{good}");
        }
        for bad in [
            "0 25 * * *",
            "60 * * * *",
            "* * 0 * *",
            "* * 32 * *",
            "* * * 13 *",
            "* * * * 8",
            "0 2 * *",
            "0 2 * * * *",
            "*/0 * * * *",
            "a b c d e",
            "",
        ] {
            assert!(!re.is_match(bad), "{bad}");
            assert!(Cron::parse("s", bad).is_err(), "{bad}");
        }
    }
}
