//! Durations written the way cluster operators write them: `5s`, `1m30s`, `500ms`.

use std::{borrow::Cow, fmt, str::FromStr, time::Duration};

use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer, de};

/// The accepted syntax: whole numbers with a unit, concatenated. Both humantime (which parses it
/// here) and CEL's `duration()` (which the CRD's validation rules use) understand this subset.
pub const DURATION_PATTERN: &str = "^([0-9]+(ms|s|m|h))+$";

/// A non-negative duration, serialized as a compact humantime string such as `1m30s`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct HumanDuration(pub Duration);

impl HumanDuration {
    pub const fn from_secs(secs: u64) -> Self {
        Self(Duration::from_secs(secs))
    }

    pub const fn from_millis(millis: u64) -> Self {
        Self(Duration::from_millis(millis))
    }

    pub const fn get(self) -> Duration {
        self.0
    }
}

impl From<HumanDuration> for Duration {
    fn from(d: HumanDuration) -> Self {
        d.0
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error(
    "invalid duration {input:?}: expected whole numbers with units h, m, s or ms, such as 5s or 1m30s"
)]
pub struct ParseDurationError {
    input: String,
}

impl FromStr for HumanDuration {
    type Err = ParseDurationError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || ParseDurationError {
            input: s.to_string(),
        };
        if !matches_pattern(s) {
            return Err(err());
        }
        humantime::parse_duration(s)
            .map(HumanDuration)
            .map_err(|_| err())
    }
}

/// Checks `DURATION_PATTERN` without a regex engine: one or more `<digits><unit>` groups.
fn matches_pattern(s: &str) -> bool {
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "h", "m", "s"]
            .into_iter()
            .find(|u| rest.starts_with(u));
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

impl fmt::Display for HumanDuration {
    /// Compact form without spaces (`1m30s`, `500ms`, `0s`), parseable by `FromStr` and by CEL.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let total_ms = self.0.as_millis();
        if total_ms == 0 {
            return f.write_str("0s");
        }
        let (h, rem) = (total_ms / 3_600_000, total_ms % 3_600_000);
        let (m, rem) = (rem / 60_000, rem % 60_000);
        let (s, ms) = (rem / 1000, rem % 1000);
        for (value, unit) in [(h, "h"), (m, "m"), (s, "s"), (ms, "ms")] {
            if value > 0 {
                write!(f, "{value}{unit}")?;
            }
        }
        Ok(())
    }
}

impl Serialize for HumanDuration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for HumanDuration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = Cow::<str>::deserialize(deserializer)?;
        s.parse().map_err(de::Error::custom)
    }
}

impl JsonSchema for HumanDuration {
    fn schema_name() -> Cow<'static, str> {
        "HumanDuration".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_compact_forms() {
        for (input, expected) in [
            ("5s", Duration::from_secs(5)),
            ("1m30s", Duration::from_secs(90)),
            ("500ms", Duration::from_millis(500)),
            ("2h", Duration::from_secs(7200)),
            ("6m30s", Duration::from_secs(390)),
            ("1s500ms", Duration::from_millis(1500)),
        ] {
            assert_eq!(
                input.parse::<HumanDuration>(),
                Ok(HumanDuration(expected)),
                "{input}"
            );
        }
    }

    #[test]
    fn rejects_what_cel_or_humans_would_misread() {
        for input in [
            "", "5", "s", "1.5s", "-1s", "5 s", "1m 30s", "5sec", "1d", "5S", "ms",
        ] {
            assert!(
                input.parse::<HumanDuration>().is_err(),
                "{input:?} should be rejected"
            );
        }
    }

    #[test]
    fn display_round_trips() {
        for ms in [
            0u64, 1, 999, 1000, 1500, 59_000, 60_000, 90_000, 3_600_000, 3_723_004,
        ] {
            let d = HumanDuration::from_millis(ms);
            let text = d.to_string();
            assert!(!text.contains(' '), "{text}");
            assert_eq!(text.parse::<HumanDuration>(), Ok(d), "{text}");
        }
        assert_eq!(HumanDuration::from_secs(390).to_string(), "6m30s");
    }

    #[test]
    fn serde_uses_the_string_form() {
        let json = serde_json::to_string(&HumanDuration::from_secs(90)).unwrap();
        assert_eq!(json, "\"1m30s\"");
        let back: HumanDuration = serde_json::from_str("\"40s\"").unwrap();
        assert_eq!(back, HumanDuration::from_secs(40));
        assert!(serde_json::from_str::<HumanDuration>("\"forty\"").is_err());
    }
}
