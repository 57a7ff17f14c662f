//! Quantities as a person reads them: one unit for the values that are
//! compared (a table row, a sentence), and that unit the largest that keeps
//! them readable, as kubectl prints allocatable: `186.63Gi 696Gi`, not
//! `195692000Ki 729808896Ki`; `18 21.9`, not `18 21900m`. Exact values stay in
//! the machine outputs (`-o json`, the status maps), which print
//! [`Quantity::canonical`].

use super::{NANO, Quantity};

/// Resources counted in bytes: printed in binary units (`Ki`..`Ei`) whatever
/// they were written in, as kubectl prints memory.
fn is_bytes(resource: &str) -> bool {
    resource == "memory"
        || resource == "ephemeral-storage"
        || resource == "storage"
        || resource.starts_with("hugepages-")
}

/// At most this many digits before the point when a smaller unit is chosen to
/// keep small values whole (`4524Gi`, not `4.42Ti`, next to `416.5Gi`).
const MAX_WHOLE: i128 = 10_000;

/// Decimal places printed (trailing zeros dropped); more only for a value that
/// would otherwise read `0`.
const PLACES: u32 = 2;

/// `qs` of `resource` in one unit, readable: the largest unit in which the
/// largest value is at least 1, or one unit smaller when the smallest value
/// would read below 1 there and the largest stays under 10,000; at most two
/// decimals, rounded half up (a non-zero value never reads `0`). Exact when
/// every value is a whole number in that unit.
pub fn readable(resource: &str, qs: &[&Quantity]) -> Vec<String> {
    let nonzero: Vec<i128> = qs
        .iter()
        .map(|q| q.nanos.abs())
        .filter(|n| *n != 0)
        .collect();
    let (Some(&max), Some(&min)) = (nonzero.iter().max(), nonzero.iter().min()) else {
        return qs.iter().map(|_| "0".to_string()).collect();
    };
    // Units, smallest first, as (nanos per unit, suffix).
    let units: Vec<(i128, &str)> = if is_bytes(resource) {
        ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"]
            .iter()
            .enumerate()
            .map(|(i, s)| (NANO * 1024i128.pow(i as u32), *s))
            .collect()
    } else {
        // Counts (GPUs, pods) and cores: whole units or milli-units, never
        // `1.22k` pods.
        vec![(1, "n"), (1_000, "u"), (1_000_000, "m"), (NANO, "")]
    };
    let mut i = units
        .iter()
        .rposition(|(by, _)| max >= *by)
        .unwrap_or_default();
    if i > 0 && min < units[i].0 && max / units[i - 1].0 < MAX_WHOLE {
        i -= 1;
    }
    // A value that is whole in a unit no larger prints there exactly when all
    // do (`500m` and `64000m` stay exact only below MAX_WHOLE).
    let (by, suffix) = units[i];
    qs.iter().map(|q| in_unit(q.nanos, by, suffix)).collect()
}

/// `nanos` in the unit of `by` nanos: whole, or with up to [`PLACES`] decimals.
fn in_unit(nanos: i128, by: i128, suffix: &str) -> String {
    if nanos == 0 {
        return "0".to_string();
    }
    let sign = if nanos < 0 { "-" } else { "" };
    let abs = nanos.abs();
    let mut places = PLACES;
    loop {
        let scale = 10i128.pow(places);
        // Rounded half up, in 1/scale units.
        let scaled = abs.saturating_mul(scale * 2).saturating_add(by) / (by * 2);
        if scaled != 0 || places >= 9 {
            let whole = scaled / scale;
            let frac = scaled % scale;
            if frac == 0 {
                return format!("{sign}{whole}{suffix}");
            }
            let digits = format!("{frac:0width$}", width = places as usize);
            return format!("{sign}{whole}.{}{suffix}", digits.trim_end_matches('0'));
        }
        places += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> Quantity {
        Quantity::parse(s).unwrap()
    }

    fn show(resource: &str, values: &[&str]) -> Vec<String> {
        let qs: Vec<Quantity> = values.iter().map(|v| q(v)).collect();
        readable(resource, &qs.iter().collect::<Vec<_>>())
    }

    /// Issue 32, item 3: the numbers a person reads.
    #[test]
    fn one_readable_unit_per_row() {
        assert_eq!(
            show("memory", &["195692000Ki", "729808896Ki"]),
            ["186.63Gi", "696Gi"]
        );
        assert_eq!(show("cpu", &["18", "21900m"]), ["18", "21.9"]);
        assert_eq!(
            show("memory", &["136Gi", "188406Mi"]),
            ["136Gi", "183.99Gi"]
        );
        assert_eq!(
            show(
                "memory",
                &["426496Mi", "852992Mi", "4632576Mi", "4070536Mi"]
            ),
            ["416.5Gi", "833Gi", "4524Gi", "3975.13Gi"]
        );
        assert_eq!(
            show("cpu", &["64500m", "129", "414540m", "1", "331730m"]),
            ["64.5", "129", "414.54", "1", "331.73"]
        );
        // Small next to large: the smaller unit while it stays readable.
        assert_eq!(show("cpu", &["500m", "4"]), ["500m", "4000m"]);
        assert_eq!(show("cpu", &["500m", "64"]), ["0.5", "64"]);
        // Counts stay counts.
        assert_eq!(show("pods", &["3", "1220"]), ["3", "1220"]);
        assert_eq!(
            show("nvidia.com/gpu", &["24", "16", "0"]),
            ["24", "16", "0"]
        );
        // Memory written in bytes still reads in binary units.
        assert_eq!(
            show("memory", &["1073741824", "512Mi"]),
            ["1024Mi", "512Mi"]
        );
        assert_eq!(show("memory", &["0"]), ["0"]);
    }

    /// A small non-zero value never reads `0` (a shortfall of `0` would say
    /// nothing is missing).
    #[test]
    fn a_non_zero_value_never_reads_zero() {
        assert_eq!(show("memory", &["1Ti", "1Ki"]), ["1024Gi", "0.000001Gi"]);
        assert_eq!(show("cpu", &["100", "1m"]), ["100", "0.001"]);
    }
}
