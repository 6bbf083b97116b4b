//! Durations in the config file: humantime text (`"250ms"`, `"30s"`, `"1h"`)
//! of at most [`LONGEST`], so no setting can name a span that overflows a
//! clock when it is added to one (`cache_ttl = "500000000000y"` is refused
//! with its dotted path, not a panic per request). Every `Duration` field of
//! the config uses `#[serde(with = "crate::config::duration")]` (or
//! `duration::option`); a unit test keeps it that way.

use std::time::Duration;

use serde::{de, Deserialize, Deserializer};

/// The longest duration any setting may have: ten years.
pub const LONGEST: Duration = Duration::from_secs(10 * 365 * 24 * 3600);

/// Parses a duration setting, refusing one longer than [`LONGEST`].
pub fn parse(text: &str) -> Result<Duration, String> {
    let d = humantime_serde::re::humantime::parse_duration(text)
        .map_err(|_| format!("invalid value: string {text:?}, expected a duration"))?;
    if d > LONGEST {
        return Err(format!(
            "`{text}` is longer than 10 years, the longest a duration setting may be"
        ));
    }
    Ok(d)
}

pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
    let text = String::deserialize(d)?;
    parse(&text).map_err(de::Error::custom)
}

/// The same for an optional setting.
pub mod option {
    use super::*;

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        match Option::<String>::deserialize(d)? {
            None => Ok(None),
            Some(text) => parse(&text).map(Some).map_err(de::Error::custom),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn durations_up_to_ten_years_parse_and_longer_ones_are_refused() {
        assert_eq!(parse("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse("3650d").unwrap(), LONGEST);
        assert!(parse("3651d").unwrap_err().contains("longer than 10 years"));
        assert!(parse("500000000000y")
            .unwrap_err()
            .contains("`500000000000y`"));
        assert!(parse("soon").unwrap_err().contains("expected a duration"));
    }

    /// Every duration setting goes through this module: a field declared
    /// with `humantime_serde` directly would accept any length again.
    #[test]
    fn no_config_field_bypasses_the_bound() {
        fn walk(dir: &std::path::Path, found: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).unwrap() {
                let path = entry.unwrap().path();
                if path.is_dir() {
                    walk(&path, found);
                } else if path.extension().is_some_and(|e| e == "rs") {
                    let text = std::fs::read_to_string(&path).unwrap();
                    for (n, line) in text.lines().enumerate() {
                        if line.contains("with = \"humantime_serde\"") {
                            found.push(format!("{}:{}", path.display(), n + 1));
                        }
                    }
                }
            }
        }
        let mut found = Vec::new();
        walk(
            &std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src"),
            &mut found,
        );
        assert!(
            found.is_empty(),
            "use `crate::config::duration` for these: {found:?}"
        );
    }
}
