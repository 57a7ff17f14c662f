//! Minimal Kubernetes quantity arithmetic for RayCluster status sums
//! (`desiredCPU`, `desiredMemory`, `desiredGPU`).
//!
//! Our own small implementation: exact to the milli-unit, which covers what
//! pod templates use. Formatting follows the canonical forms the apiserver
//! prints for common values (`500m`, `4`, `16Gi`), not every corner of Go's
//! `resource.Quantity`.

/// A quantity in milli-units, remembering whether it was written with binary suffixes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Quantity {
    /// Value × 1000.
    pub milli: i128,
    /// True when the source used Ki/Mi/Gi…, so sums print in binary units.
    pub binary: bool,
}

const BINARY: [(&str, u32); 6] = [
    ("Ki", 10),
    ("Mi", 20),
    ("Gi", 30),
    ("Ti", 40),
    ("Pi", 50),
    ("Ei", 60),
];
const DECIMAL: [(&str, i32); 8] = [
    ("n", -9),
    ("u", -6),
    ("m", -3),
    ("k", 3),
    ("M", 6),
    ("G", 9),
    ("T", 12),
    ("P", 15),
];

impl Quantity {
    /// Parses `"500m"`, `"2"`, `"1.5"`, `"16Gi"`, `"1e3"`. Returns None on anything else.
    pub fn parse(s: &str) -> Option<Quantity> {
        let s = s.trim();
        if s.is_empty() {
            return None;
        }
        for (suf, pow) in BINARY {
            if let Some(num) = s.strip_suffix(suf) {
                let milli = parse_decimal_milli(num)?;
                return Some(Quantity {
                    milli: milli.checked_mul(1i128 << pow)?,
                    binary: true,
                });
            }
        }
        if let Some((mantissa, exp)) = s.split_once(['e', 'E']) {
            let exp: i32 = exp.parse().ok()?;
            return Some(Quantity {
                milli: scale(parse_decimal_milli(mantissa)?, exp)?,
                binary: false,
            });
        }
        for (suf, exp) in DECIMAL {
            if let Some(num) = s.strip_suffix(suf) {
                return Some(Quantity {
                    milli: scale(parse_decimal_milli(num)?, exp)?,
                    binary: false,
                });
            }
        }
        Some(Quantity {
            milli: parse_decimal_milli(s)?,
            binary: false,
        })
    }

    /// Parses a JSON quantity, which the apiserver may hand back as a string or a number.
    pub fn from_json(v: &serde_json::Value) -> Option<Quantity> {
        match v {
            serde_json::Value::String(s) => Quantity::parse(s),
            serde_json::Value::Number(n) => Quantity::parse(&n.to_string()),
            _ => None,
        }
    }

    /// Sum, binary if either side is.
    pub fn plus(self, other: Quantity) -> Quantity {
        Quantity {
            milli: self.milli + other.milli,
            binary: self.binary || other.binary,
        }
    }

    /// Product with a replica count.
    pub fn times(self, n: i64) -> Quantity {
        Quantity {
            milli: self.milli * i128::from(n),
            binary: self.binary,
        }
    }

    /// Canonical-ish string form.
    pub fn format(&self) -> String {
        let m = self.milli;
        if m == 0 {
            return "0".into();
        }
        if m % 1000 != 0 {
            return format!("{m}m");
        }
        let units = m / 1000;
        if self.binary {
            for (suf, pow) in BINARY.iter().rev() {
                let d = 1i128 << pow;
                if units % d == 0 {
                    return format!("{}{suf}", units / d);
                }
            }
            return units.to_string();
        }
        for (suf, exp) in [("P", 15), ("T", 12), ("G", 9), ("M", 6), ("k", 3)] {
            let d = 10i128.pow(exp);
            if units % d == 0 {
                return format!("{}{suf}", units / d);
            }
        }
        units.to_string()
    }
}

fn scale(milli: i128, exp: i32) -> Option<i128> {
    if exp >= 0 {
        milli.checked_mul(10i128.checked_pow(exp as u32)?)
    } else {
        let d = 10i128.checked_pow((-exp) as u32)?;
        // Round up like the apiserver does for sub-milli values.
        Some((milli + d - 1) / d)
    }
}

/// "1.5" → 1500.
fn parse_decimal_milli(s: &str) -> Option<i128> {
    let (neg, s) = match s.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, s.strip_prefix('+').unwrap_or(s)),
    };
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    if int.is_empty() && frac.is_empty() {
        return None;
    }
    if !int.chars().all(|c| c.is_ascii_digit()) || !frac.chars().all(|c| c.is_ascii_digit()) {
        return None;
    }
    let int_v: i128 = if int.is_empty() { 0 } else { int.parse().ok()? };
    let mut frac3: String = frac.chars().take(3).collect();
    let round_up = frac.chars().skip(3).any(|c| c != '0');
    while frac3.len() < 3 {
        frac3.push('0');
    }
    let frac_v: i128 = frac3.parse().ok()?;
    let v = int_v.checked_mul(1000)? + frac_v + i128::from(round_up);
    Some(if neg { -v } else { v })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_and_format() {
        let q = |s| Quantity::parse(s).unwrap();
        assert_eq!(q("500m").milli, 500);
        assert_eq!(q("2").format(), "2");
        assert_eq!(q("1.5").format(), "1500m");
        assert_eq!(q("16Gi").format(), "16Gi");
        assert_eq!(q("16Gi").plus(q("512Mi")).format(), "16896Mi");
        assert_eq!(q("4").times(3).format(), "12");
        assert_eq!(q("1000").format(), "1k");
        assert_eq!(q("1e3").milli, 1_000_000);
        assert!(Quantity::parse("abc").is_none());
    }
}
