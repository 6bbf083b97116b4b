//! The drill scenario file (TOML): mocks, the router config they imply,
//! phases of traffic with faults, and assertions. Parsing is strict (unknown
//! fields are errors) and every error names the dotted path of the bad value,
//! like `phases[1].faults.primary`. Pure data and validation; no I/O.

use std::collections::{BTreeMap, HashSet};

use serde::Deserialize;

use switchyard::config::Config;
use switchyard_mock::{FaultSpec, MockKind};

/// A scenario error, naming the dotted path of the offending value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}{message}", if path.is_empty() { String::new() } else { format!("{path}: ") })]
pub struct ScenarioError {
    /// Dotted path such as `assert[2].mock` (empty for the whole file).
    pub path: String,
    pub message: String,
}

fn err(path: impl Into<String>, message: impl Into<String>) -> ScenarioError {
    ScenarioError {
        path: path.into(),
        message: message.into(),
    }
}

/// The whole scenario file.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    pub name: String,
    #[serde(default)]
    pub description: String,
    /// The route the drill calls (in process it is generated under this name).
    #[serde(default = "default_route")]
    pub route: String,
    /// `[mocks.NAME]`: one mock upstream, and the provider of the same name.
    pub mocks: BTreeMap<String, MockSpec>,
    #[serde(default)]
    pub router: RouterSpec,
    pub phases: Vec<Phase>,
    #[serde(rename = "assert", default)]
    pub asserts: Vec<Assertion>,
}

fn default_route() -> String {
    "drill".into()
}

/// `[mocks.NAME]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct MockSpec {
    pub kind: MockKind,
    #[serde(default = "default_tokens")]
    pub tokens: u32,
    #[serde(default)]
    pub token_delay_ms: u64,
    /// The mock's own capacity (over it answers 503/529); 0 = unlimited.
    #[serde(default)]
    pub max_concurrency: u32,
}

fn default_tokens() -> u32 {
    16
}

/// `[router]`: how the in-process router is configured from the mocks.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RouterSpec {
    /// Route order: mock names, first is the primary. Default: all mocks by name.
    #[serde(default)]
    pub targets: Vec<String>,
    /// Merged into the generated `[[routes]]` entry (e.g. `mid_stream`, `max_attempts`).
    #[serde(default)]
    pub route: toml::Table,
    /// `[router.providers.NAME]`: merged into the generated provider (e.g. `breaker`).
    #[serde(default)]
    pub providers: BTreeMap<String, toml::Table>,
    /// Copied to the config's `[retry_budget]`.
    #[serde(default)]
    pub retry_budget: Option<toml::Table>,
    /// Copied to the config's `[backoff]`.
    #[serde(default)]
    pub backoff: Option<toml::Table>,
}

/// `[[phases]]`: one stretch of traffic under one set of faults.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Phase {
    pub name: String,
    /// Set at the start of the phase (mock name -> fault JSON as TOML); mocks
    /// not named keep their current fault. `{ type = "none" }` clears one.
    #[serde(default)]
    pub faults: BTreeMap<String, toml::Table>,
    pub requests: u32,
    #[serde(default = "one")]
    pub concurrency: u32,
    /// `StreamCompletion` when true, `Complete` when false.
    #[serde(default = "yes")]
    pub stream: bool,
    #[serde(default = "default_max_tokens")]
    pub max_tokens: u32,
    /// Wait before the phase starts (after its faults are set).
    #[serde(default)]
    pub pause_ms: u64,
    /// Per-request deadline (`grpc-timeout`).
    #[serde(default = "default_deadline_ms")]
    pub deadline_ms: u64,
    /// Faults parsed from `faults`, filled in by validation.
    #[serde(skip)]
    pub fault_specs: BTreeMap<String, FaultSpec>,
}

fn one() -> u32 {
    1
}
fn yes() -> bool {
    true
}
fn default_max_tokens() -> u32 {
    64
}
fn default_deadline_ms() -> u64 {
    10_000
}

/// What an assertion measures.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum What {
    /// Share of requests that ended with a complete answer.
    Availability,
    /// Requests that ended with an error (of `code` / `reason` if given): a count.
    Errors,
    /// Share of requests served by `provider`.
    ServedBy,
    /// Requests that reached mock `mock`: a count.
    UpstreamAttempts,
    /// Highest concurrent requests mock `mock` saw.
    MaxInFlight,
    /// Most upstream attempts one request made.
    AttemptsPerRequest,
    /// `Reset` events clients received: a count.
    Resets,
    /// Share of answers that are exactly the mock's token sequence (nothing stitched).
    CleanAnswers,
    /// Breaker state of `provider` at the end of the phase (`state`, `==` or `!=`).
    Breaker,
}

impl What {
    pub fn as_str(self) -> &'static str {
        match self {
            What::Availability => "availability",
            What::Errors => "errors",
            What::ServedBy => "served_by",
            What::UpstreamAttempts => "upstream_attempts",
            What::MaxInFlight => "max_in_flight",
            What::AttemptsPerRequest => "attempts_per_request",
            What::Resets => "resets",
            What::CleanAnswers => "clean_answers",
            What::Breaker => "breaker",
        }
    }
}

/// A comparison.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Eq)]
pub enum Op {
    #[serde(rename = "==")]
    Eq,
    #[serde(rename = "!=")]
    Ne,
    #[serde(rename = "<")]
    Lt,
    #[serde(rename = "<=")]
    Le,
    #[serde(rename = ">")]
    Gt,
    #[serde(rename = ">=")]
    Ge,
}

impl Op {
    pub fn as_str(self) -> &'static str {
        match self {
            Op::Eq => "==",
            Op::Ne => "!=",
            Op::Lt => "<",
            Op::Le => "<=",
            Op::Gt => ">",
            Op::Ge => ">=",
        }
    }

    /// `actual OP expected`, with `==` tolerant of float rounding.
    pub fn holds(self, actual: f64, expected: f64) -> bool {
        let eq = (actual - expected).abs() < 1e-9;
        match self {
            Op::Eq => eq,
            Op::Ne => !eq,
            Op::Lt => actual < expected && !eq,
            Op::Le => actual <= expected || eq,
            Op::Gt => actual > expected && !eq,
            Op::Ge => actual >= expected || eq,
        }
    }
}

/// `[[assert]]`.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Assertion {
    pub what: What,
    /// Scope: one phase; default the whole drill (for `breaker`: the last phase).
    #[serde(default)]
    pub phase: Option<String>,
    #[serde(default)]
    pub mock: Option<String>,
    #[serde(default)]
    pub provider: Option<String>,
    /// For `errors`: a gRPC code name such as `UNAVAILABLE`.
    #[serde(default)]
    pub code: Option<String>,
    /// For `errors`: an `ErrorInfo.reason` such as `UPSTREAM_STREAM_TRUNCATED`.
    #[serde(default)]
    pub reason: Option<String>,
    pub op: Op,
    #[serde(default)]
    pub value: Option<f64>,
    /// For `breaker`: closed, open, half_open, forced_open or forced_closed.
    #[serde(default)]
    pub state: Option<String>,
}

const BREAKER_STATES: &[&str] = &[
    "closed",
    "open",
    "half_open",
    "forced_open",
    "forced_closed",
];

impl Scenario {
    /// Parses and validates a scenario document.
    pub fn from_toml_str(text: &str) -> Result<Scenario, ScenarioError> {
        let de = toml::Deserializer::parse(text).map_err(|e| err("", e.to_string()))?;
        let mut s: Scenario = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner();
            err(
                if path == "." { String::new() } else { path },
                inner.message().to_string(),
            )
        })?;
        s.validate()?;
        Ok(s)
    }

    /// The route order, as mock names.
    pub fn targets(&self) -> Vec<String> {
        if self.router.targets.is_empty() {
            self.mocks.keys().cloned().collect()
        } else {
            self.router.targets.clone()
        }
    }

    fn validate(&mut self) -> Result<(), ScenarioError> {
        if self.name.trim().is_empty() {
            return Err(err("name", "must not be empty"));
        }
        if self.mocks.is_empty() {
            return Err(err("mocks", "at least one mock is required"));
        }
        for name in self.mocks.keys() {
            if !valid_name(name) {
                return Err(err(
                    format!("mocks.{name}"),
                    "mock names are letters, digits, `-` and `_`",
                ));
            }
        }
        self.validate_router()?;
        if self.phases.is_empty() {
            return Err(err("phases", "at least one phase is required"));
        }
        let mut names = HashSet::new();
        for i in 0..self.phases.len() {
            self.validate_phase(i)?;
            if !names.insert(self.phases[i].name.clone()) {
                return Err(err(format!("phases[{i}].name"), "duplicate phase name"));
            }
        }
        for (i, a) in self.asserts.iter().enumerate() {
            self.validate_assert(i, a)?;
        }
        Ok(())
    }

    fn validate_router(&self) -> Result<(), ScenarioError> {
        let mut seen = HashSet::new();
        for (i, t) in self.router.targets.iter().enumerate() {
            self.known_mock(t, &format!("router.targets[{i}]"))?;
            if !seen.insert(t) {
                return Err(err(format!("router.targets[{i}]"), "duplicate target"));
            }
        }
        for name in self.router.providers.keys() {
            self.known_mock(name, &format!("router.providers.{name}"))?;
        }
        Ok(())
    }

    fn validate_phase(&mut self, i: usize) -> Result<(), ScenarioError> {
        let at = |f: &str| format!("phases[{i}].{f}");
        let mocks: Vec<String> = self.mocks.keys().cloned().collect();
        let p = &mut self.phases[i];
        if p.name.trim().is_empty() {
            return Err(err(at("name"), "must not be empty"));
        }
        if p.requests == 0 {
            return Err(err(at("requests"), "must be at least 1"));
        }
        if p.concurrency == 0 || p.concurrency > 256 {
            return Err(err(at("concurrency"), "must be within 1..=256"));
        }
        if p.deadline_ms == 0 {
            return Err(err(at("deadline_ms"), "must be positive"));
        }
        for (mock, table) in &p.faults {
            let path = at(&format!("faults.{mock}"));
            if !mocks.contains(mock) {
                return Err(err(path, format!("no mock named `{mock}`")));
            }
            let json = serde_json::to_value(table).map_err(|e| err(&path, e.to_string()))?;
            let spec = FaultSpec::try_from(json).map_err(|e| err(&path, e))?;
            p.fault_specs.insert(mock.clone(), spec);
        }
        Ok(())
    }

    fn validate_assert(&self, i: usize, a: &Assertion) -> Result<(), ScenarioError> {
        let at = |f: &str| format!("assert[{i}].{f}");
        if let Some(phase) = &a.phase {
            if !self.phases.iter().any(|p| &p.name == phase) {
                return Err(err(at("phase"), format!("no phase named `{phase}`")));
            }
        }
        let needs_mock = matches!(a.what, What::UpstreamAttempts | What::MaxInFlight);
        let needs_provider = matches!(a.what, What::ServedBy | What::Breaker);
        match (&a.mock, needs_mock) {
            (Some(m), true) => self.known_mock(m, &at("mock"))?,
            (None, true) => return Err(err(at("mock"), "required for this `what`")),
            (Some(_), false) => return Err(err(at("mock"), "not used by this `what`")),
            (None, false) => {}
        }
        match (&a.provider, needs_provider) {
            (Some(p), true) => self.known_mock(p, &at("provider"))?,
            (None, true) => return Err(err(at("provider"), "required for this `what`")),
            (Some(_), false) => return Err(err(at("provider"), "not used by this `what`")),
            (None, false) => {}
        }
        if a.what != What::Errors && (a.code.is_some() || a.reason.is_some()) {
            return Err(err(at("code"), "`code` and `reason` belong to `errors`"));
        }
        if let Some(code) = &a.code {
            if super::report::code_from_name(code).is_none() {
                return Err(err(at("code"), format!("`{code}` is not a gRPC code name")));
            }
        }
        if a.what == What::Breaker {
            return check_breaker_assert(a, &at);
        }
        if a.state.is_some() {
            return Err(err(at("state"), "only `breaker` takes a state"));
        }
        match a.value {
            Some(v) if v.is_finite() => Ok(()),
            _ => Err(err(at("value"), "a finite number is required")),
        }
    }

    fn known_mock(&self, name: &str, path: &str) -> Result<(), ScenarioError> {
        if self.mocks.contains_key(name) {
            Ok(())
        } else {
            Err(err(path, format!("no mock named `{name}`")))
        }
    }

    /// The Switchyard config this scenario runs in process, given each
    /// mock's base URL (`http://ADDR/v1`). Errors name `router.*` paths.
    pub fn router_config(&self, urls: &BTreeMap<String, String>) -> Result<String, ScenarioError> {
        let mut doc = toml::Table::new();
        let mut server = toml::Table::new();
        server.insert("grpc_listen".into(), "127.0.0.1:0".into());
        server.insert("admin_listen".into(), "127.0.0.1:0".into());
        server.insert("watch_config".into(), false.into());
        server.insert("drain_timeout".into(), "1s".into());
        doc.insert("server".into(), server.into());
        let mut providers = Vec::new();
        for (name, mock) in &self.mocks {
            let url = urls
                .get(name)
                .ok_or_else(|| err(format!("mocks.{name}"), "no URL for this mock"))?;
            providers.push(toml::Value::Table(self.provider_table(name, mock, url)));
        }
        doc.insert("providers".into(), providers.into());
        let mut route = toml::Table::new();
        route.insert("name".into(), self.route.clone().into());
        let targets: Vec<toml::Value> = self
            .targets()
            .iter()
            .map(|t| toml::Value::from(format!("{t}/m")))
            .collect();
        route.insert("targets".into(), targets.into());
        merge(&mut route, &self.router.route);
        doc.insert("routes".into(), vec![toml::Value::Table(route)].into());
        if let Some(b) = &self.router.retry_budget {
            doc.insert("retry_budget".into(), b.clone().into());
        }
        if let Some(b) = &self.router.backoff {
            doc.insert("backoff".into(), b.clone().into());
        }
        let text = toml::to_string(&doc).map_err(|e| err("router", e.to_string()))?;
        Config::from_toml_str(&text).map_err(|e| err(self.router_path(&e.path), e.message))?;
        Ok(text)
    }

    fn provider_table(&self, name: &str, mock: &MockSpec, url: &str) -> toml::Table {
        let mut p = toml::Table::new();
        p.insert("id".into(), name.into());
        p.insert("kind".into(), mock.kind.as_str().into());
        p.insert("base_url".into(), url.into());
        p.insert("connect_timeout".into(), "1s".into());
        p.insert("first_token_timeout".into(), "5s".into());
        p.insert("idle_timeout".into(), "5s".into());
        let mut model = toml::Table::new();
        model.insert("name".into(), "m".into());
        p.insert("models".into(), vec![toml::Value::Table(model)].into());
        if let Some(extra) = self.router.providers.get(name) {
            merge(&mut p, extra);
        }
        p
    }

    /// Maps a config path of the generated file back to the scenario.
    fn router_path(&self, path: &str) -> String {
        let names: Vec<&String> = self.mocks.keys().collect();
        if let Some(rest) = path.strip_prefix("providers[") {
            if let Some((idx, field)) = rest.split_once(']') {
                if let Some(name) = idx.parse::<usize>().ok().and_then(|i| names.get(i)) {
                    return format!("router.providers.{name}{field}");
                }
            }
        }
        if let Some(rest) = path.strip_prefix("routes[0]") {
            return format!("router.route{rest}");
        }
        if path.is_empty() {
            "router".into()
        } else {
            format!("router.{path}")
        }
    }
}

fn check_breaker_assert(a: &Assertion, at: &dyn Fn(&str) -> String) -> Result<(), ScenarioError> {
    if !matches!(a.op, Op::Eq | Op::Ne) {
        return Err(err(at("op"), "`breaker` compares with == or !="));
    }
    if a.value.is_some() {
        return Err(err(at("value"), "`breaker` takes a `state`, not a value"));
    }
    match a.state.as_deref() {
        Some(s) if BREAKER_STATES.contains(&s) => Ok(()),
        Some(s) => Err(err(
            at("state"),
            format!("`{s}` is not one of {}", BREAKER_STATES.join(", ")),
        )),
        None => Err(err(at("state"), "required for `breaker`")),
    }
}

/// Deep merge: tables merge key by key, anything else replaces.
fn merge(base: &mut toml::Table, extra: &toml::Table) {
    for (k, v) in extra {
        match (base.get_mut(k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(e)) => merge(b, e),
            _ => {
                base.insert(k.clone(), v.clone());
            }
        }
    }
}

fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const MIN: &str = r#"
name = "t"
[mocks.primary]
kind = "openai"
[mocks.secondary]
kind = "anthropic"
[router]
targets = ["primary", "secondary"]
[router.providers.primary]
breaker = { consecutive_failures = 3 }
[[phases]]
name = "outage"
faults = { primary = { type = "status", status = 500 } }
requests = 2
[[assert]]
what = "availability"
op = ">="
value = 1.0
"#;

    fn bad(text: &str) -> ScenarioError {
        Scenario::from_toml_str(text).unwrap_err()
    }

    #[test]
    fn drill_minimal_scenario_parses_and_renders_a_valid_config() {
        let s = Scenario::from_toml_str(MIN).unwrap();
        assert_eq!(s.phases[0].fault_specs.len(), 1);
        let urls = BTreeMap::from([
            ("primary".to_string(), "http://127.0.0.1:1/v1".to_string()),
            ("secondary".to_string(), "http://127.0.0.1:2/v1".to_string()),
        ]);
        let c = Config::from_toml_str(&s.router_config(&urls).unwrap()).unwrap();
        assert_eq!(c.providers[0].breaker.consecutive_failures, 3);
        assert_eq!(c.routes[0].name, "drill");
        assert_eq!(c.routes[0].targets[0].target, "primary/m");
    }

    #[test]
    fn drill_errors_name_dotted_paths() {
        let e = bad(&MIN.replace("status = 500", "statis = 500"));
        assert_eq!(e.path, "phases[0].faults.primary");
        let e = bad(&MIN.replace("requests = 2", "requests = 2\nrequets = 3"));
        assert_eq!(e.path, "phases[0].requets");
        let e = bad(&MIN.replace("op = \">=\"", "op = \"=>\""));
        assert_eq!(e.path, "assert[0].op");
        let e = bad(&MIN.replace("what = \"availability\"", "what = \"served_by\""));
        assert_eq!(e.path, "assert[0].provider");
        let e = bad(&MIN.replace("kind = \"anthropic\"", "kind = \"antropic\""));
        assert_eq!(e.path, "mocks.secondary.kind");
    }

    #[test]
    fn drill_router_overrides_are_checked_by_the_config_validator() {
        let s = Scenario::from_toml_str(
            &MIN.replace("consecutive_failures = 3", "half_open_probes = 0"),
        )
        .unwrap();
        let urls = BTreeMap::from([
            ("primary".to_string(), "http://127.0.0.1:1/v1".to_string()),
            ("secondary".to_string(), "http://127.0.0.1:2/v1".to_string()),
        ]);
        let e = s.router_config(&urls).unwrap_err();
        assert_eq!(e.path, "router.providers.primary.breaker.half_open_probes");
    }

    #[test]
    fn drill_ops_compare_with_tolerance() {
        assert!(Op::Eq.holds(0.1 + 0.2, 0.3));
        assert!(Op::Le.holds(3.0, 3.0));
        assert!(!Op::Lt.holds(3.0, 3.0));
        assert!(Op::Ne.holds(1.0, 0.0));
    }
}
