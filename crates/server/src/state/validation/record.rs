//! The validation record: per route, the last golden-set run's verdict for
//! each target (what was checked, against which set, when). `switchyard
//! golden` produces one route's record; the server keeps them all, shows
//! them in `/v1/status` and `ListProviders`, and the router lets a route's
//! `require_validated` downshift use only validated targets. On disk it is
//! one JSON file (`[golden] record`), replaced atomically.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

/// Largest record file read.
const MAX_FILE: u64 = 16 * 1024 * 1024;

/// How one target did on the golden set.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TargetValidation {
    /// `provider/model`.
    pub target: String,
    pub validated: bool,
    pub cases: u32,
    /// Cases with a JSON schema, and how many answers matched it.
    pub schema_cases: u32,
    pub schema_valid: u32,
    /// Cases that said whether the model should refuse, and agreements.
    pub refusal_cases: u32,
    pub refusal_agreed: u32,
    /// Cases expecting a tool call, and calls of that name with valid arguments.
    pub tool_cases: u32,
    pub tool_agreed: u32,
    /// Mean similarity of its answers to the route's first target's (1 for
    /// the first target), and how it was measured: `embedding` or `lexical`.
    pub answer_similarity: f64,
    pub similarity_kind: String,
    /// What failed, one line per case and check.
    #[serde(default)]
    pub failures: Vec<String>,
}

/// One route's validation.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RouteValidation {
    pub route: String,
    pub validated_unix_ms: u64,
    /// The golden set's file name and SHA-256 (hex).
    pub set: String,
    pub set_sha256: String,
    pub targets: Vec<TargetValidation>,
}

impl TargetValidation {
    /// A one-case verdict, for tests.
    #[cfg(test)]
    pub(crate) fn sample(target: &str, validated: bool) -> Self {
        TargetValidation {
            target: target.into(),
            validated,
            cases: 1,
            schema_cases: 0,
            schema_valid: 0,
            refusal_cases: 0,
            refusal_agreed: 0,
            tool_cases: 0,
            tool_agreed: 0,
            answer_similarity: 1.0,
            similarity_kind: "lexical".into(),
            failures: Vec::new(),
        }
    }
}

impl RouteValidation {
    /// Whether `target` passed this route's last validation.
    pub fn validated(&self, target: &str) -> bool {
        self.targets
            .iter()
            .any(|t| t.target == target && t.validated)
    }

    /// Checks a record that arrived from outside (the admin API).
    pub fn parse(json: &str) -> Result<RouteValidation, String> {
        let r: RouteValidation =
            serde_json::from_str(json).map_err(|e| format!("record_json: {e}"))?;
        if r.route.is_empty() || r.targets.is_empty() {
            return Err("record_json: `route` and at least one of `targets` are required".into());
        }
        if r.targets.iter().any(|t| !t.target.contains('/')) {
            return Err("record_json: every target is `provider/model`".into());
        }
        Ok(r)
    }
}

/// Every route's last validation.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Records {
    pub routes: BTreeMap<String, RouteValidation>,
}

impl Records {
    /// Reads the record file (a missing file is an empty record).
    pub fn load(path: &Path) -> Result<Records, String> {
        let meta = match std::fs::metadata(path) {
            Ok(m) => m,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Records::default()),
            Err(e) => return Err(format!("{}: {e}", path.display())),
        };
        if meta.len() > MAX_FILE {
            return Err(format!("{}: larger than {MAX_FILE} bytes", path.display()));
        }
        let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
        serde_json::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Writes the record file atomically (a temporary file renamed over it).
    pub fn save(&self, path: &Path) -> Result<(), String> {
        let text = serde_json::to_string_pretty(self).map_err(|e| e.to_string())?;
        let tmp = path.with_extension("json.tmp");
        std::fs::write(&tmp, text).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, path).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// Replaces `route`'s validation in the file at `path`.
    pub fn store(path: &Path, record: RouteValidation) -> Result<Records, String> {
        let mut all = Records::load(path)?;
        all.routes.insert(record.route.clone(), record);
        all.save(path)?;
        Ok(all)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn target(name: &str, validated: bool) -> TargetValidation {
        TargetValidation::sample(name, validated)
    }

    fn route(name: &str, targets: Vec<TargetValidation>) -> RouteValidation {
        RouteValidation {
            route: name.into(),
            validated_unix_ms: 1,
            set: "set.toml".into(),
            set_sha256: "00".into(),
            targets,
        }
    }

    #[test]
    fn stored_per_route_atomically_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("golden.json");
        assert_eq!(Records::load(&path).unwrap(), Records::default());
        Records::store(&path, route("a", vec![target("p/m", true)])).unwrap();
        let all = Records::store(&path, route("b", vec![target("q/n", false)])).unwrap();
        assert_eq!(all.routes.len(), 2);
        let read = Records::load(&path).unwrap();
        assert_eq!(read, all);
        assert!(read.routes["a"].validated("p/m"));
        assert!(!read.routes["b"].validated("q/n"));
        assert!(!read.routes["a"].validated("q/n"));
        // The route's next run replaces its record.
        Records::store(&path, route("a", vec![target("p/m", false)])).unwrap();
        assert!(!Records::load(&path).unwrap().routes["a"].validated("p/m"));
        std::fs::write(&path, "{not json").unwrap();
        assert!(Records::load(&path).unwrap_err().contains("golden.json"));
    }

    #[test]
    fn a_record_from_outside_is_checked() {
        let good = serde_json::to_string(&route("a", vec![target("p/m", true)])).unwrap();
        assert!(RouteValidation::parse(&good).is_ok());
        assert!(RouteValidation::parse("{}")
            .unwrap_err()
            .contains("record_json"));
        let empty = serde_json::to_string(&route("a", vec![])).unwrap();
        assert!(RouteValidation::parse(&empty).is_err());
        let bad = serde_json::to_string(&route("a", vec![target("pm", true)])).unwrap();
        assert!(RouteValidation::parse(&bad).is_err());
    }
}
