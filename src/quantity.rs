//! Kubernetes resource quantities (`k8s.io/apimachinery/pkg/api/resource`),
//! held exactly as a signed count of nano-units so that sums over a whole
//! cluster never round and comparisons never depend on the written form.
//!
//! Parsing follows apimachinery's `ParseQuantity` scanner and canonical output
//! follows `Quantity.CanonicalizeBytes`, with these deliberate differences:
//!
//! - A number without any digit (`Gi`, `.`, `-`, `k`) is rejected. Go's fast
//!   scanner reads these as zero, but its own documented grammar and error
//!   regexp require digits, and the API server never emits them (it stores
//!   the canonical `0`), so in our input they can only be mistakes.
//! - Exponents outside `i32` are rejected (Go truncates them to `int32`, so
//!   `1e4294967296` silently means `1`).
//! - Decimal values whose nano count exceeds `i128` (about 1.7e29 units) are
//!   rejected instead of being carried in arbitrary precision.
//! - [`Quantity::canonical`] always canonicalizes. Go's `String()` returns
//!   the input text verbatim when the fast path judged it canonical, which
//!   keeps cosmetic oddities such as `+1`, `01` or `10.500`.
//! - A BinarySI value of 1024Ei or more is printed with the `Ei` suffix and
//!   a larger number; Go finds no suffix past `Ei` and prints the bare
//!   mantissa, which corrupts the value. Only arithmetic can produce these:
//!   parsing caps BinarySI at 2^63-1 like Go.
//! - [`Quantity::value`]/[`Quantity::milli_value`] round negative values
//!   away from zero (Go's int64 path does; its inf.Dec path differs) and
//!   return `i128`, so they do not overflow where Go's `int64` would.

mod display;
pub use display::readable;

use std::cmp::Ordering;
use std::fmt;
use std::hash::{Hash, Hasher};
use std::str::FromStr;

use serde::de::{self, Visitor};
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Nano-units per unit.
const NANO: i128 = 1_000_000_000;
/// Go caps parsed BinarySI quantities at MaxInt64 units.
const MAX_BINARY_NANOS: u128 = (i64::MAX as u128) * 1_000_000_000;

/// How a quantity prints; remembered from the suffix it was written with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Format {
    /// `12M`, `500m`: powers of 1000.
    DecimalSI,
    /// `12Mi`: powers of 1024.
    BinarySI,
    /// `12e6`.
    DecimalExponent,
}

/// An exact quantity. Equality, ordering and hashing look at the value only,
/// so `1Gi == 1073741824` and both hash alike.
#[derive(Clone, Debug)]
pub struct Quantity {
    nanos: i128,
    format: Format,
}

/// Why a string is not a quantity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QuantityError {
    input: String,
    kind: ErrorKind,
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum ErrorKind {
    Empty,
    NoDigits,
    Unexpected { ch: char, at: usize },
    Suffix(String),
    Exponent(String),
    TooLarge,
    Negative,
}

impl QuantityError {
    /// The reason alone, without the input (for `Error::Quantity`).
    pub fn reason(&self) -> String {
        match &self.kind {
            ErrorKind::Empty => "empty string".to_string(),
            ErrorKind::NoDigits => "no digits in the number".to_string(),
            ErrorKind::Unexpected { ch, at } => format!(
                "unexpected {ch:?} at byte {at}; expected <number><suffix> like 1, 1.5, 500m, 2Gi or 1e3"
            ),
            ErrorKind::Suffix(s) => format!(
                "unknown suffix {s:?}; expected one of n u m k M G T P E Ki Mi Gi Ti Pi Ei or e<exponent>"
            ),
            ErrorKind::Exponent(s) => format!("exponent {s:?} is out of range"),
            ErrorKind::TooLarge => "value is too large to represent exactly".to_string(),
            ErrorKind::Negative => "negative amounts of a resource are not valid".to_string(),
        }
    }

    /// The text that failed to parse.
    pub fn input(&self) -> &str {
        &self.input
    }
}

impl fmt::Display for QuantityError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "invalid quantity {:?}: {}", self.input, self.reason())
    }
}

impl std::error::Error for QuantityError {}

/// The pieces of `[+-]<int>[.<frac>]<suffix>` as Go's scanner splits them.
struct Scanned<'a> {
    negative: bool,
    int: &'a [u8],
    frac: &'a [u8],
    suffix: &'a str,
}

fn is_suffix_letter(b: u8) -> bool {
    b"eEinumkKMGTP".contains(&b)
}

/// Mirrors apimachinery's `parseQuantityString`.
fn scan(s: &str) -> Result<Scanned<'_>, ErrorKind> {
    let b = s.as_bytes();
    let end = b.len();
    let mut pos = 0;
    let mut negative = false;
    match b.first() {
        Some(b'-') => {
            negative = true;
            pos = 1;
        }
        Some(b'+') => pos = 1,
        _ => {}
    }
    let int_start = pos;
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    let int = &b[int_start..pos];
    let mut frac: &[u8] = &[];
    if pos < end && b[pos] == b'.' {
        pos += 1;
        let frac_start = pos;
        while pos < end && b[pos].is_ascii_digit() {
            pos += 1;
        }
        frac = &b[frac_start..pos];
    }
    let suffix_start = pos;
    while pos < end && is_suffix_letter(b[pos]) {
        pos += 1;
    }
    if pos < end && (b[pos] == b'+' || b[pos] == b'-') {
        pos += 1;
    }
    while pos < end && b[pos].is_ascii_digit() {
        pos += 1;
    }
    if pos != end {
        let ch = s[pos..].chars().next().unwrap_or('?');
        return Err(ErrorKind::Unexpected { ch, at: pos });
    }
    if int.is_empty() && frac.is_empty() {
        return Err(ErrorKind::NoDigits);
    }
    Ok(Scanned {
        negative,
        int,
        frac,
        suffix: &s[suffix_start..],
    })
}

/// Mirrors apimachinery's suffixer: returns (power of ten, power of two, format).
fn interpret_suffix(suffix: &str) -> Result<(i64, u32, Format), ErrorKind> {
    let dec = |e| Ok((e, 0, Format::DecimalSI));
    let bin = |e| Ok((0, e, Format::BinarySI));
    match suffix {
        "n" => dec(-9),
        "u" => dec(-6),
        "m" => dec(-3),
        "" => dec(0),
        "k" => dec(3),
        "M" => dec(6),
        "G" => dec(9),
        "T" => dec(12),
        "P" => dec(15),
        "E" => dec(18),
        "Ki" => bin(10),
        "Mi" => bin(20),
        "Gi" => bin(30),
        "Ti" => bin(40),
        "Pi" => bin(50),
        "Ei" => bin(60),
        _ => {
            let rest = suffix
                .strip_prefix('e')
                .or_else(|| suffix.strip_prefix('E'))
                .filter(|r| !r.is_empty())
                .ok_or_else(|| ErrorKind::Suffix(suffix.to_string()))?;
            // strconv.ParseInt(rest, 10, 64): optional sign, then digits only.
            let digits = rest.strip_prefix(['+', '-']).unwrap_or(rest);
            if digits.is_empty() || !digits.bytes().all(|c| c.is_ascii_digit()) {
                return Err(ErrorKind::Suffix(suffix.to_string()));
            }
            let e: i64 = rest
                .parse()
                .map_err(|_| ErrorKind::Exponent(rest.to_string()))?;
            if i32::try_from(e).is_err() {
                return Err(ErrorKind::Exponent(rest.to_string()));
            }
            Ok((e, 0, Format::DecimalExponent))
        }
    }
}

/// Parses ASCII digits into `u128`; `None` on overflow.
fn digits_to_u128(d: impl Iterator<Item = u8>) -> Option<u128> {
    let mut acc = 0u128;
    for c in d {
        acc = acc.checked_mul(10)?.checked_add(u128::from(c - b'0'))?;
    }
    Some(acc)
}

/// |value| in nanos, rounded away from zero to a whole nano as Go does;
/// `None` when it does not fit `u128`. Reads `int` and `frac` as one digit
/// string without copying (this runs for every quantity of every pod).
fn magnitude_nanos(int: &[u8], frac: &[u8], exp10: i64, exp2: u32) -> Option<u128> {
    let total = int.len() + frac.len();
    let at = |i: usize| {
        if i < int.len() {
            int[i]
        } else {
            frac[i - int.len()]
        }
    };
    let lead = (0..total).take_while(|&i| at(i) == b'0').count();
    if lead == total {
        return Some(0);
    }
    let trail = (lead..total).rev().take_while(|&i| at(i) == b'0').count();
    let (start, end) = (lead, total - trail);
    let frac_len = i64::try_from(frac.len()).ok()?;
    let len = i64::try_from(end - start).ok()?;
    // value = digits[start..end] * 10^scale * 2^exp2 nanos
    let scale = exp10 + 9 - frac_len + i64::try_from(trail).ok()?;
    let mult: u128 = 1u128 << exp2;
    if scale >= 0 {
        let pow = 10u128.checked_pow(u32::try_from(scale).ok()?)?;
        return digits_to_u128((start..end).map(at))?
            .checked_mul(pow)?
            .checked_mul(mult);
    }
    // Split at the nano point: whole nanos above, the k digits below.
    let k = -scale;
    let high_len = usize::try_from((len - k).max(0)).ok()?;
    let split = start + high_len;
    let high = digits_to_u128((start..split).map(at))?.checked_mul(mult)?;
    // floor(0.<zeros><low> * mult) by long multiplication from the right.
    let mut carry: u128 = 0;
    let mut inexact = false;
    for i in (split..end).rev() {
        let t = u128::from(at(i) - b'0') * mult + carry;
        inexact |= !t.is_multiple_of(10);
        carry = t / 10;
    }
    let mut zeros = k - (len - i64::try_from(high_len).ok()?);
    while zeros > 0 && carry > 0 {
        inexact |= !carry.is_multiple_of(10);
        carry /= 10;
        zeros -= 1;
    }
    high.checked_add(carry)?.checked_add(u128::from(inexact))
}

impl Quantity {
    /// Parses like apimachinery's `ParseQuantity` (see the module notes).
    pub fn parse(s: &str) -> Result<Quantity, QuantityError> {
        let err = |kind| QuantityError {
            input: s.to_string(),
            kind,
        };
        if s.is_empty() {
            return Err(err(ErrorKind::Empty));
        }
        let sc = scan(s).map_err(err)?;
        let (exp10, exp2, mut format) = interpret_suffix(sc.suffix).map_err(err)?;
        let mag = match magnitude_nanos(sc.int, sc.frac, exp10, exp2) {
            Some(m) if format == Format::BinarySI => m.min(MAX_BINARY_NANOS),
            Some(m) if m <= i128::MAX as u128 => m,
            // Any BinarySI overflow is above Go's cap anyway.
            None if format == Format::BinarySI => MAX_BINARY_NANOS,
            _ => return Err(err(ErrorKind::TooLarge)),
        };
        if format == Format::BinarySI && mag > 0 && mag < NANO as u128 {
            // Go: a fraction of one can't be written in binary units.
            format = Format::DecimalSI;
        }
        let mag = i128::try_from(mag).map_err(|_| err(ErrorKind::TooLarge))?;
        let nanos = if sc.negative { -mag } else { mag };
        Ok(Quantity { nanos, format })
    }

    /// Parses, naming the field in the error (`pod x: containers[y]...`).
    pub fn parse_field(field: &str, s: &str) -> crate::Result<Quantity> {
        Quantity::parse(s).map_err(|e| crate::Error::Quantity {
            field: field.to_string(),
            value: s.to_string(),
            reason: e.reason(),
        })
    }

    /// Parses an amount of a resource (a request, a limit, allocatable,
    /// headroom): like [`Quantity::parse`], but a negative value, which the
    /// apiserver refuses in those fields and which would make capacity
    /// appear from nowhere, is an error too.
    pub fn parse_amount(s: &str) -> Result<Quantity, QuantityError> {
        let q = Quantity::parse(s)?;
        if q.is_negative() {
            return Err(QuantityError {
                input: s.to_string(),
                kind: ErrorKind::Negative,
            });
        }
        Ok(q)
    }

    /// [`Quantity::parse_amount`], naming the field in the error.
    pub fn parse_amount_field(field: &str, s: &str) -> crate::Result<Quantity> {
        Quantity::parse_amount(s).map_err(|e| crate::Error::Quantity {
            field: field.to_string(),
            value: s.to_string(),
            reason: e.reason(),
        })
    }

    pub fn zero() -> Quantity {
        Quantity::from_nanos(0, Format::DecimalSI)
    }

    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }

    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// `n` whole units, DecimalSI.
    pub fn from_units(n: i64) -> Quantity {
        Quantity::from_nanos(i128::from(n) * NANO, Format::DecimalSI)
    }

    /// Exact constructor for callers that do arithmetic on raw nanos.
    pub fn from_nanos(nanos: i128, format: Format) -> Quantity {
        Quantity { nanos, format }
    }

    /// The exact value in nano-units.
    pub fn as_nanos(&self) -> i128 {
        self.nanos
    }

    pub fn format(&self) -> Format {
        self.format
    }

    /// Go `Add` keeps the receiver's format unless the receiver is zero.
    fn result_format(&self, o: &Quantity) -> Format {
        if self.is_zero() {
            o.format
        } else {
            self.format
        }
    }

    pub fn checked_add(&self, o: &Quantity) -> Option<Quantity> {
        Some(Quantity::from_nanos(
            self.nanos.checked_add(o.nanos)?,
            self.result_format(o),
        ))
    }

    pub fn checked_sub(&self, o: &Quantity) -> Option<Quantity> {
        Some(Quantity::from_nanos(
            self.nanos.checked_sub(o.nanos)?,
            self.result_format(o),
        ))
    }

    /// Sum that clamps at the i128 limits instead of failing: totals over a
    /// cluster cannot get near them, and callers must never panic.
    pub fn saturating_add(&self, o: &Quantity) -> Quantity {
        Quantity::from_nanos(self.nanos.saturating_add(o.nanos), self.result_format(o))
    }

    /// `max(0, self - o)`: free capacity never goes negative.
    pub fn saturating_sub_floor0(&self, o: &Quantity) -> Quantity {
        Quantity::from_nanos(
            self.nanos.saturating_sub(o.nanos).max(0),
            self.result_format(o),
        )
    }

    /// `self / div` (in nanos) rounded away from zero, as Go rounds "up".
    fn scaled_up(&self, div: i128) -> i128 {
        let q = self.nanos / div;
        if self.nanos % div == 0 {
            q
        } else if self.nanos > 0 {
            q + 1
        } else {
            q - 1
        }
    }

    /// Thousandths, rounded up (Go `MilliValue`).
    pub fn milli_value(&self) -> i128 {
        self.scaled_up(1_000_000)
    }

    /// Whole units, rounded up (Go `Value`).
    pub fn value(&self) -> i128 {
        self.scaled_up(NANO)
    }

    /// The canonical string, as apimachinery's `CanonicalizeBytes` builds it.
    pub fn canonical(&self) -> String {
        if self.nanos == 0 {
            return "0".to_string();
        }
        let sign = if self.nanos < 0 { "-" } else { "" };
        let abs = self.nanos.unsigned_abs();
        let nano = NANO as u128;
        let mut format = self.format;
        if format == Format::BinarySI && (abs < 1024 * nano || !abs.is_multiple_of(nano)) {
            // Go: small or fractional binary values print as DecimalSI.
            format = Format::DecimalSI;
        }
        if format == Format::BinarySI {
            let mut units = abs / nano;
            let mut exp = 0;
            while exp < 6 && units >= 1024 && units.is_multiple_of(1024) {
                units /= 1024;
                exp += 1;
            }
            let suffix = ["", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"][exp];
            return format!("{sign}{units}{suffix}");
        }
        let mut mantissa = abs;
        let mut exp: i64 = -9;
        while mantissa >= 10 && mantissa.is_multiple_of(10) {
            mantissa /= 10;
            exp += 1;
        }
        // Lower the exponent to a multiple of three (never overflows: the
        // factor was just divided out).
        let r = exp.rem_euclid(3);
        mantissa *= 10u128.pow(r as u32);
        exp -= r;
        let si = match exp {
            -9 => Some("n"),
            -6 => Some("u"),
            -3 => Some("m"),
            0 => Some(""),
            3 => Some("k"),
            6 => Some("M"),
            9 => Some("G"),
            12 => Some("T"),
            15 => Some("P"),
            18 => Some("E"),
            _ => None,
        };
        match (format, si) {
            (Format::DecimalSI, Some(s)) => format!("{sign}{mantissa}{s}"),
            (_, _) if exp == 0 => format!("{sign}{mantissa}"),
            _ => format!("{sign}{mantissa}e{exp}"),
        }
    }
}

/// Prints `qs` in one unit, as `kubectl top` prints a column (cpu in `m`,
/// memory in `Mi`): the largest unit in which every value is a whole number,
/// binary (`Ki`..`Ei`) when one of them was written in a binary unit, else
/// decimal (`n`..`E`). A table row reads `64500m 129000m`, never `64500m 129`.
pub fn in_one_unit(qs: &[&Quantity]) -> Vec<String> {
    let nonzero: Vec<&&Quantity> = qs.iter().filter(|q| !q.is_zero()).collect();
    if nonzero.is_empty() {
        return qs.iter().map(|q| q.canonical()).collect();
    }
    let all_divide = |by: i128| nonzero.iter().all(|q| q.nanos % by == 0);
    let print = |by: i128, suffix: &str| -> Vec<String> {
        qs.iter()
            .map(|q| match q.nanos {
                0 => "0".to_string(),
                n => format!("{}{suffix}", n / by),
            })
            .collect()
    };
    if nonzero.iter().any(|q| q.format == Format::BinarySI) {
        const BINARY: [&str; 6] = ["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
        for (i, suffix) in BINARY.iter().enumerate().rev() {
            let by = NANO * 1024i128.pow(i as u32 + 1);
            if all_divide(by) {
                return print(by, suffix);
            }
        }
    }
    const DECIMAL: [(i32, &str); 10] = [
        (18, "E"),
        (15, "P"),
        (12, "T"),
        (9, "G"),
        (6, "M"),
        (3, "k"),
        (0, ""),
        (-3, "m"),
        (-6, "u"),
        (-9, "n"),
    ];
    for (exp, suffix) in DECIMAL {
        let by = 10i128.pow((exp + 9) as u32);
        if all_divide(by) {
            return print(by, suffix);
        }
    }
    // Unreachable: every value is a whole number of nanos.
    qs.iter().map(|q| q.canonical()).collect()
}

impl Default for Quantity {
    fn default() -> Self {
        Quantity::zero()
    }
}

impl PartialEq for Quantity {
    fn eq(&self, o: &Self) -> bool {
        self.nanos == o.nanos
    }
}

impl Eq for Quantity {}

impl PartialOrd for Quantity {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}

impl Ord for Quantity {
    fn cmp(&self, o: &Self) -> Ordering {
        self.nanos.cmp(&o.nanos)
    }
}

impl Hash for Quantity {
    fn hash<H: Hasher>(&self, h: &mut H) {
        self.nanos.hash(h);
    }
}

impl FromStr for Quantity {
    type Err = QuantityError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Quantity::parse(s)
    }
}

impl fmt::Display for Quantity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.canonical())
    }
}

impl Serialize for Quantity {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.canonical())
    }
}

struct QuantityVisitor;

impl Visitor<'_> for QuantityVisitor {
    type Value = Quantity;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Kubernetes quantity as a string or number")
    }

    /// Go's `UnmarshalJSON` trims surrounding whitespace before parsing.
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Quantity, E> {
        Quantity::parse(v.trim()).map_err(E::custom)
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Quantity, E> {
        Ok(Quantity::from_units(v))
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Quantity, E> {
        Ok(Quantity::from_nanos(
            i128::from(v) * NANO,
            Format::DecimalSI,
        ))
    }

    /// JSON numbers with a fraction arrive as f64; Rust prints the shortest
    /// text that reads back as the same f64, which is the JSON text for any
    /// sensibly written quantity (`0.5`, `1.25`). No float arithmetic.
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Quantity, E> {
        Quantity::parse(&format!("{v}")).map_err(E::custom)
    }

    /// Go reads JSON `null` as the zero quantity.
    fn visit_unit<E: de::Error>(self) -> Result<Quantity, E> {
        Ok(Quantity::zero())
    }

    fn visit_none<E: de::Error>(self) -> Result<Quantity, E> {
        Ok(Quantity::zero())
    }
}

impl<'de> Deserialize<'de> for Quantity {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Quantity, D::Error> {
        d.deserialize_any(QuantityVisitor)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::hash_map::DefaultHasher;

    fn q(s: &str) -> Quantity {
        match Quantity::parse(s) {
            Ok(v) => v,
            Err(e) => panic!("{s}: {e}"),
        }
    }

    #[test]
    fn a_row_prints_in_one_unit() {
        let row = |vals: &[&str]| {
            let qs: Vec<Quantity> = vals.iter().map(|v| q(v)).collect();
            in_one_unit(&qs.iter().collect::<Vec<_>>())
        };
        assert_eq!(
            row(&["426496Mi", "833Gi", "3424Gi", "2682056Mi"]),
            ["426496Mi", "852992Mi", "3506176Mi", "2682056Mi"]
        );
        assert_eq!(
            row(&["64500m", "129", "0", "414540m"]),
            ["64500m", "129000m", "0", "414540m"]
        );
        assert_eq!(row(&["8", "16", "1k"]), ["8", "16", "1000"]);
        assert_eq!(row(&["2Gi", "4Gi"]), ["2Gi", "4Gi"]);
        assert_eq!(row(&["1G", "500M"]), ["1000M", "500M"]);
        assert_eq!(row(&["1Gi", "1G"]), ["1073741824", "1000000000"]);
        assert_eq!(row(&["0", "0"]), ["0", "0"]);
        assert_eq!(row(&["3"]), ["3"]);
    }

    /// (input, exact nanos, format after parse). Expected values follow
    /// apimachinery's `TestQuantityParse` table and `ParseQuantity`.
    #[test]
    fn parse_table() {
        use Format::*;
        const G: i128 = NANO;
        let cases: &[(&str, i128, Format)] = &[
            ("0", 0, DecimalSI),
            ("0n", 0, DecimalSI),
            ("0Ki", 0, BinarySI),
            ("0e3", 0, DecimalExponent),
            ("000", 0, DecimalSI),
            ("-0", 0, DecimalSI),
            ("1", G, DecimalSI),
            ("+1", G, DecimalSI),
            ("-1", -G, DecimalSI),
            ("01", G, DecimalSI),
            ("5n", 5, DecimalSI),
            ("4u", 4_000, DecimalSI),
            ("3m", 3_000_000, DecimalSI),
            ("8k", 8_000 * G, DecimalSI),
            ("7M", 7_000_000 * G, DecimalSI),
            ("6G", 6 * G * G, DecimalSI),
            ("5T", 5_000 * G * G, DecimalSI),
            ("2P", 2_000_000 * G * G, DecimalSI),
            ("1E", G * G * G, DecimalSI),
            ("12E", 12 * G * G * G, DecimalSI),
            ("1Ki", 1024 * G, BinarySI),
            ("7Mi", 7 * (1 << 20) * G, BinarySI),
            ("6Gi", 6 * (1 << 30) * G, BinarySI),
            ("5Ti", 5 * (1 << 40) * G, BinarySI),
            ("4Pi", 4 * (1 << 50) * G, BinarySI),
            ("3Ei", 3 * (1 << 60) * G, BinarySI),
            ("1E-3", 1_000_000, DecimalExponent),
            ("1e3", 1000 * G, DecimalExponent),
            ("1E3", 1000 * G, DecimalExponent),
            ("1e+3", 1000 * G, DecimalExponent),
            ("12e-3", 12_000_000, DecimalExponent),
            ("1.3E+6", 1_300_000 * G, DecimalExponent),
            ("100.035k", 100_035 * G, DecimalSI),
            ("0.001", 1_000_000, DecimalSI),
            ("0.0005k", 500_000_000, DecimalSI),
            ("0.50000", 500_000_000, DecimalSI),
            ("0.5e-2", 5_000_000, DecimalExponent),
            ("1.5Gi", 1536 * (1 << 20) * G, BinarySI),
            ("100.035Ki", 102_435_840_000_000, BinarySI),
            ("0.5Mi", 524_288 * G, BinarySI),
            ("0.025Ti", 27_487_790_694_400_000_000, BinarySI),
            // Rounds up to a whole nano, away from zero.
            ("3.001n", 4, DecimalSI),
            ("1.1E-9", 2, DecimalExponent),
            ("0.0000000001", 1, DecimalSI),
            ("0.9n", 1, DecimalSI),
            ("-0.9n", -1, DecimalSI),
            ("0.00000012345", 124, DecimalSI),
            ("1e-1000000", 1, DecimalExponent),
            ("0.000000000001Ki", 2, DecimalSI), // binary below 1 -> DecimalSI
            ("0.5Ki", 512 * G, BinarySI),
            (".001Ki", 1_024_000_000, BinarySI),
            // Go caps BinarySI at 2^63-1 units.
            ("9Ei", i64::MAX as i128 * G, BinarySI),
            ("8Ei", i64::MAX as i128 * G, BinarySI),
            ("-9Ei", -(i64::MAX as i128) * G, BinarySI),
            ("9223372036854775807Ki", i64::MAX as i128 * G, BinarySI),
            (
                "99999999999999999999999999999999999999999Ei",
                i64::MAX as i128 * G,
                BinarySI,
            ),
            // Decimal values are not capped.
            ("10E", 10 * G * G * G, DecimalSI),
            ("9223372036854775808", (i64::MAX as i128 + 1) * G, DecimalSI),
            // Written by trolls, accepted by Go.
            (".001", 1_000_000, DecimalSI),
            ("1.", G, DecimalSI),
            ("1.G", G * G, DecimalSI),
            ("-.5", -500_000_000, DecimalSI),
            ("1000000000000000000000000000000e-30", G, DecimalExponent),
        ];
        for &(input, nanos, format) in cases {
            let got = q(input);
            assert_eq!(got.as_nanos(), nanos, "{input} nanos");
            assert_eq!(got.format(), format, "{input} format");
        }
    }

    /// (input, canonical). Derived from apimachinery's `CanonicalizeBytes`:
    /// strip factors of ten, lower the exponent to a multiple of three, pick
    /// the SI suffix (or `e<n>` past `E`); BinarySI only when the value is a
    /// whole number of at least 1024, else printed as DecimalSI. Cases also
    /// taken from Go's `TestQuantityString`/`TestQuantityParseEmit`.
    #[test]
    fn canonical_table() {
        let cases: &[(&str, &str)] = &[
            ("0", "0"),
            ("0Ki", "0"),
            ("-0", "0"),
            ("0.0e5", "0"),
            ("1000m", "1"),
            ("1", "1"),
            ("-1", "-1"),
            ("+1", "1"),
            ("01", "1"),
            ("1000", "1k"),
            ("1000M", "1G"),
            ("1024Mi", "1Gi"),
            ("1536Mi", "1536Mi"),
            ("1.5Gi", "1536Mi"),
            ("0.5", "500m"),
            ("0.1", "100m"),
            ("1.5", "1500m"),
            ("10.500", "10500m"),
            ("1e3", "1e3"),
            ("1E3", "1e3"),
            ("1000e0", "1e3"),
            ("1e0", "1"),
            ("100e-3", "100e-3"),
            ("12e-3", "12e-3"),
            ("0.001e0", "1e-3"),
            ("1000e-12", "1e-9"),
            (".001e12", "1e9"),
            ("1e9", "1e9"),
            ("1Ki", "1Ki"),
            ("1024", "1024"),
            ("1025Ki", "1025Ki"),
            ("1024Ki", "1Mi"),
            ("307200Ki", "300Mi"),
            ("1025024Mi", "1001Gi"),
            ("0.5Ki", "512"),
            ("-0.5Ki", "-512"),
            ("0.5Mi", "512Ki"),
            (".001Ki", "1024m"),
            (".000001Ki", "1024u"),
            (".000000001Ki", "1024n"),
            (".000000000001Ki", "2n"),
            ("100.035Ki", "102435840m"),
            ("1.08", "1080m"),
            ("1080000000n", "1080m"),
            ("1000u", "1m"),
            ("0.001T", "1G"),
            ("-1.5Gi", "-1536Mi"),
            ("1E", "1E"),
            ("1000E", "1e21"),
            ("12E", "12E"),
            ("9Ei", "9223372036854775807"),
            ("999999999999999999.1", "999999999999999999100m"),
            ("9223372036854775808", "9223372036854775808"),
            ("10000000000000000000000m", "10E"),
            ("1.000000000000000001E", "1000000000000000001"),
            ("3.001n", "4n"),
            ("0.9n", "1n"),
            ("1.1E-9", "2e-9"),
            ("1.2e3", "1200"),
            ("1.3E+6", "1300e3"),
            ("1.53E12", "1530e9"),
            ("5.444T", "5444G"),
            ("2.5P", "2500T"),
            ("1.01E", "1010P"),
            ("0.5e0", "500e-3"),
        ];
        for &(input, want) in cases {
            assert_eq!(q(input).canonical(), want, "canonical of {input}");
            assert_eq!(q(input).to_string(), want, "Display of {input}");
            // Canonical output reparses to the same value.
            assert_eq!(q(want), q(input), "reparse of {want}");
        }
    }

    #[test]
    fn rejects_malformed() {
        for bad in [
            "",
            "1.5.5",
            "Gi",
            "1 Gi",
            " 1",
            "1 ",
            "1KiB",
            "--1",
            "+-1",
            "1e",
            "0x10",
            "1.1.M",
            "1+1.0M",
            "0.1mi",
            "0.1am",
            "aoeu",
            ".5i",
            "1i",
            "-3.01i",
            "-3.01e-",
            "1e3m",
            ".",
            "-",
            "k",
            "1K",
            "1e+",
            "1ee3",
            "1Ki3",
            "1e--3",
            "1,5",
            "١",
            "1e9223372036854775808",
            "1e4294967296",
            "1e99999",
            "1e40",
            "1000000000000000000000000000000000000000",
        ] {
            assert!(Quantity::parse(bad).is_err(), "{bad:?} should not parse");
        }
    }

    #[test]
    fn error_messages_say_why() {
        let e = Quantity::parse("1KiB").err();
        assert_eq!(
            e.map(|e| e.to_string()),
            Some(
                "invalid quantity \"1KiB\": unexpected 'B' at byte 3; expected <number><suffix> \
                 like 1, 1.5, 500m, 2Gi or 1e3"
                    .to_string()
            )
        );
        let e = Quantity::parse("1mk").err().map(|e| e.reason());
        assert!(e.is_some_and(|r| r.contains("unknown suffix \"mk\"")));
        let e = Quantity::parse("Gi").err().map(|e| e.reason());
        assert_eq!(e.as_deref(), Some("no digits in the number"));
        let e = Quantity::parse("1e4294967296").err().map(|e| e.reason());
        assert!(e.is_some_and(|r| r.contains("out of range")));
        let e = Quantity::parse("1e40").err().map(|e| e.reason());
        assert_eq!(
            e.as_deref(),
            Some("value is too large to represent exactly")
        );
        assert_eq!(
            Quantity::parse("").err().map(|e| e.reason()).as_deref(),
            Some("empty string")
        );
    }

    #[test]
    fn parse_field_names_the_field() {
        let err = Quantity::parse_field("pod a: containers[b].resources.limits[cpu]", "1.5.5");
        match err {
            Err(crate::Error::Quantity {
                field,
                value,
                reason,
            }) => {
                assert_eq!(field, "pod a: containers[b].resources.limits[cpu]");
                assert_eq!(value, "1.5.5");
                assert!(reason.contains("unexpected '.'"), "{reason}");
            }
            other => panic!("unexpected {other:?}"),
        }
        assert_eq!(
            Quantity::parse_field("f", "2").ok(),
            Some(Quantity::from_units(2))
        );
    }

    fn hash_of(v: &Quantity) -> u64 {
        let mut h = DefaultHasher::new();
        v.hash(&mut h);
        h.finish()
    }

    #[test]
    fn equality_and_order_by_value() {
        assert_eq!(q("1Gi"), q("1073741824"));
        assert_eq!(hash_of(&q("1Gi")), hash_of(&q("1073741824")));
        assert_eq!(q("1"), q("1000m"));
        assert_eq!(q("1e3"), q("1k"));
        assert_eq!(hash_of(&q("1e3")), hash_of(&q("1k")));
        assert!(q("1Ki") > q("1k"));
        assert!(q("999m") < q("1"));
        assert!(q("-1") < q("0"));
        assert!(q("10000T") > q("100Gi"));
        assert!(q("1n") > q("0"));
        let mut v = [q("1Gi"), q("1G"), q("100m"), q("-2")];
        v.sort();
        let s: Vec<String> = v.iter().map(Quantity::canonical).collect();
        assert_eq!(s, ["-2", "100m", "1G", "1Gi"]);
    }

    #[test]
    fn arithmetic_keeps_left_format() {
        let sum = q("1Gi").checked_add(&q("512Mi"));
        assert_eq!(
            sum.as_ref().map(Quantity::canonical).as_deref(),
            Some("1536Mi")
        );
        // Left is DecimalSI: the sum prints in decimal.
        let sum = q("1G").checked_add(&q("1Gi"));
        assert_eq!(
            sum.as_ref().map(Quantity::canonical).as_deref(),
            Some("2073741824")
        );
        // A zero left operand takes the right's format, as Go's Add does.
        let sum = Quantity::zero().checked_add(&q("1Gi"));
        assert_eq!(
            sum.as_ref().map(Quantity::canonical).as_deref(),
            Some("1Gi")
        );
        let d = q("2").checked_sub(&q("500m"));
        assert_eq!(
            d.as_ref().map(Quantity::canonical).as_deref(),
            Some("1500m")
        );
        let d = q("1").checked_sub(&q("3"));
        assert_eq!(d.as_ref().map(Quantity::canonical).as_deref(), Some("-2"));
        assert_eq!(q("1").saturating_sub_floor0(&q("3")), Quantity::zero());
        assert_eq!(q("1Gi").saturating_add(&q("1Gi")).canonical(), "2Gi");
        assert_eq!(
            Quantity::from_nanos(i128::MAX, Format::DecimalSI).saturating_add(&q("1")),
            Quantity::from_nanos(i128::MAX, Format::DecimalSI)
        );
        assert_eq!(q("3Gi").saturating_sub_floor0(&q("1Gi")).canonical(), "2Gi");
        let max = Quantity::from_nanos(i128::MAX, Format::DecimalSI);
        assert!(max.checked_add(&q("1n")).is_none());
        let min = Quantity::from_nanos(i128::MIN, Format::DecimalSI);
        assert!(min.checked_sub(&q("1n")).is_none());
        assert_eq!(min.saturating_sub_floor0(&max), Quantity::zero());
        assert_eq!(max.saturating_sub_floor0(&min), max);
        // Extreme values still print without overflow.
        assert!(!min.canonical().is_empty());
        let huge_bin = Quantity::from_nanos(i128::MAX / 2, Format::BinarySI);
        assert!(!huge_bin.canonical().is_empty());
        let big = Quantity::from_nanos((1i128 << 70) * NANO, Format::BinarySI);
        assert_eq!(big.canonical(), "1024Ei");
    }

    #[test]
    fn helpers_and_rounded_values() {
        assert_eq!(Quantity::from_units(3).canonical(), "3");
        assert!(Quantity::zero().is_zero());
        assert!(q("0Gi").is_zero());
        assert!(!q("1n").is_zero());
        assert_eq!(q("1.5").milli_value(), 1500);
        assert_eq!(q("1n").milli_value(), 1);
        assert_eq!(q("1n").value(), 1);
        assert_eq!(q("1.5").value(), 2);
        assert_eq!(q("2").value(), 2);
        assert_eq!(q("-1.5").value(), -2);
        assert_eq!(q("1Gi").value(), 1 << 30);
        assert_eq!(q("100m").milli_value(), 100);
        assert_eq!(q("0").value(), 0);
    }

    #[test]
    fn canonical_round_trips_and_is_idempotent() {
        let suffixes = [
            "", "n", "u", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
            "e-7", "e0", "e2", "e21",
        ];
        for m in [
            "1",
            "7",
            "999",
            "1000",
            "1023",
            "1024",
            "1536",
            "0.5",
            "1.25",
            "123456789",
        ] {
            for suf in suffixes {
                for sign in ["", "-"] {
                    let input = format!("{sign}{m}{suf}");
                    let v = q(&input);
                    let c = v.canonical();
                    let back = q(&c);
                    assert_eq!(back, v, "{input} -> {c}");
                    assert_eq!(back.canonical(), c, "{input}: not idempotent");
                }
            }
        }
    }

    #[test]
    fn never_panics_on_short_garbage() {
        let alphabet: Vec<char> = "09.eEkKiMmn+- x".chars().collect();
        let mut buf = String::new();
        let n = alphabet.len();
        for len in 1..=4u32 {
            for mut code in 0..n.pow(len) {
                buf.clear();
                for _ in 0..len {
                    buf.push(alphabet[code % n]);
                    code /= n;
                }
                if let Ok(v) = Quantity::parse(&buf) {
                    assert_eq!(q(&v.canonical()), v, "{buf}");
                }
            }
        }
    }

    #[test]
    fn serde_round_trip() {
        let v: Quantity = serde_json::from_str("\"1.5Gi\"").unwrap_or_default();
        assert_eq!(v.canonical(), "1536Mi");
        assert_eq!(
            serde_json::to_string(&v).ok().as_deref(),
            Some("\"1536Mi\"")
        );
        let n: Vec<Quantity> =
            serde_json::from_str("[2, 0.5, -3, 1.25, \" 1Ki \", null]").unwrap_or_default();
        let s: Vec<String> = n.iter().map(Quantity::canonical).collect();
        assert_eq!(s, ["2", "500m", "-3", "1250m", "1Ki", "0"]);
        assert!(serde_json::from_str::<Quantity>("\"1.5.5\"").is_err());
        assert!(serde_json::from_str::<Quantity>("true").is_err());
        let big: Quantity = serde_json::from_str("18446744073709551615").unwrap_or_default();
        assert_eq!(big.canonical(), "18446744073709551615");
    }

    #[test]
    fn amounts_refuse_negative_values_but_not_negative_zero() {
        let err = Quantity::parse_amount("-4").unwrap_err();
        assert_eq!(err.reason(), "negative amounts of a resource are not valid");
        assert!(Quantity::parse_amount("-0").unwrap().is_zero());
        assert_eq!(
            Quantity::parse_amount("4").unwrap(),
            Quantity::from_units(4)
        );
        let e = Quantity::parse_amount_field("spec.headroom[nvidia.com/gpu]", "-1").unwrap_err();
        assert!(
            e.to_string()
                .starts_with("spec.headroom[nvidia.com/gpu]: invalid quantity \"-1\""),
            "{e}"
        );
    }
}
