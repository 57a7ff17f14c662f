//! The name of a change: a short hash of the new cluster spec
//! ([`super::classify::change_fingerprint`]). Status records it, `spec.approve`
//! names it, capacity requests and reservations are labelled with it; one
//! type keeps it from being confused with any other string.

use std::fmt;
use std::ops::Deref;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// A change fingerprint (12 hex characters when raygate computed it; read
/// back from status or `spec.approve` as written). Serialised as the bare
/// string, so the API does not change.
#[derive(Serialize, Deserialize, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[serde(transparent)]
pub struct Fingerprint(String);

impl Fingerprint {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The schema of a string, inlined: the CRD shows `type: string` where a
/// fingerprint is, as before the type existed.
impl JsonSchema for Fingerprint {
    fn inline_schema() -> bool {
        true
    }

    fn schema_name() -> std::borrow::Cow<'static, str> {
        String::schema_name()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        String::json_schema(generator)
    }
}

impl Deref for Fingerprint {
    type Target = str;

    fn deref(&self) -> &str {
        &self.0
    }
}

impl AsRef<str> for Fingerprint {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Shown as the string is (`"7e3ff6fc6b18"`): messages that quote
/// `spec.approve` with `{:?}` read as before the type existed.
impl fmt::Debug for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&self.0, f)
    }
}

impl fmt::Display for Fingerprint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Any string is a fingerprint as given (`spec.approve`, `--fingerprint`):
/// one that names no change matches none, which raygate reports.
impl std::str::FromStr for Fingerprint {
    type Err = std::convert::Infallible;

    fn from_str(s: &str) -> Result<Fingerprint, Self::Err> {
        Ok(Fingerprint::from(s))
    }
}

impl From<String> for Fingerprint {
    fn from(s: String) -> Fingerprint {
        Fingerprint(s)
    }
}

impl From<&str> for Fingerprint {
    fn from(s: &str) -> Fingerprint {
        Fingerprint(s.to_string())
    }
}

impl From<Fingerprint> for String {
    fn from(f: Fingerprint) -> String {
        f.0
    }
}

impl PartialEq<str> for Fingerprint {
    fn eq(&self, other: &str) -> bool {
        self.0 == other
    }
}

impl PartialEq<&str> for Fingerprint {
    fn eq(&self, other: &&str) -> bool {
        self.0 == *other
    }
}

impl PartialEq<String> for Fingerprint {
    fn eq(&self, other: &String) -> bool {
        &self.0 == other
    }
}

impl PartialEq<Fingerprint> for str {
    fn eq(&self, other: &Fingerprint) -> bool {
        self == other.0
    }
}

impl PartialEq<Fingerprint> for &str {
    fn eq(&self, other: &Fingerprint) -> bool {
        *self == other.0
    }
}

impl PartialEq<Fingerprint> for String {
    fn eq(&self, other: &Fingerprint) -> bool {
        *self == other.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fingerprint_is_written_and_read_as_its_bare_string() {
        let f = Fingerprint::from("7e3ff6fc6b18");
        assert_eq!(
            serde_json::to_value(&f).unwrap(),
            serde_json::json!("7e3ff6fc6b18")
        );
        let back: Fingerprint = serde_json::from_value(serde_json::json!("7e3ff6fc6b18")).unwrap();
        assert_eq!(back, f);
        assert_eq!(f.to_string(), "7e3ff6fc6b18");
        assert_eq!(format!("{f:?}"), r#""7e3ff6fc6b18""#);
        assert_eq!(f, "7e3ff6fc6b18");
        assert_eq!("7e3ff6fc6b18".parse::<Fingerprint>(), Ok(f));
    }

    #[test]
    fn a_fingerprint_has_the_schema_of_a_string() {
        let mut g = schemars::SchemaGenerator::default();
        assert_eq!(
            Fingerprint::json_schema(&mut g),
            String::json_schema(&mut g)
        );
        assert!(Fingerprint::inline_schema());
    }
}
