//! What serde cannot check: a validator per section (`[server]`, `[state]`,
//! `[queue]`, `[responses]`, `[resume]`, policies, each route, each provider and its
//! models), each error naming the dotted path of the bad value.
use super::*;
use crate::upstream::Auth;

impl Config {
    /// `[state]`: a Redis backend names its URL variable; the prefix leaves
    /// the hash tags to Switchyard.
    fn validate_state(&self) -> Result<(), ConfigError> {
        let st = &self.state;
        if st.key_prefix.contains(['{', '}']) {
            return Err(ConfigError::new(
                "state.key_prefix",
                format!(
                    "`{}` must not contain `{{` or `}}` (Switchyard adds the hash tags)",
                    st.key_prefix
                ),
            ));
        }
        if st.timeout.is_zero() {
            return Err(ConfigError::new("state.timeout", "must be positive"));
        }
        if st.lease < 3 * st.timeout || st.lease > Duration::from_secs(3600) {
            return Err(ConfigError::new(
                "state.lease",
                format!(
                    "{:?} must be at least 3 x state.timeout (it is renewed every third of it) and at most 1h",
                    st.lease
                ),
            ));
        }
        if st.backend == StateBackend::Redis && st.redis_url_env.trim().is_empty() {
            return Err(ConfigError::new(
                "state.redis_url_env",
                "names the environment variable with the redis:// URL",
            ));
        }
        Ok(())
    }

    /// `[queue]`: every file quota can hold at least one file.
    fn validate_queue(&self) -> Result<(), ConfigError> {
        let Some(q) = &self.queue else {
            return Ok(());
        };
        if q.max_files_per_tenant == 0 {
            return Err(ConfigError::new(
                "queue.max_files_per_tenant",
                "must be at least 1",
            ));
        }
        for (field, n) in [
            (
                "queue.max_file_bytes_per_tenant",
                q.max_file_bytes_per_tenant,
            ),
            ("queue.max_stored_bytes", q.max_stored_bytes),
        ] {
            if n < q.max_file_bytes {
                return Err(ConfigError::new(
                    field,
                    format!("{n} is below queue.max_file_bytes ({}): the largest upload could never be kept", q.max_file_bytes),
                ));
            }
        }
        if q.blob_timeout < Duration::from_millis(10) {
            return Err(ConfigError::new(
                "queue.blob_timeout",
                "must be at least 10ms",
            ));
        }
        Ok(())
    }

    fn validate_responses(&self) -> Result<(), ConfigError> {
        let r = &self.responses;
        if r.ttl.is_zero() {
            return Err(ConfigError::new("responses.ttl", "must be positive"));
        }
        if r.max_per_tenant == 0 {
            return Err(ConfigError::new(
                "responses.max_per_tenant",
                "must be at least 1",
            ));
        }
        if r.max_bytes_per_tenant == 0 {
            return Err(ConfigError::new(
                "responses.max_bytes_per_tenant",
                "must be at least 1",
            ));
        }
        Ok(())
    }

    /// `[resume]`: a lifetime and byte bounds that can hold a real stream
    /// and are not typos.
    fn validate_resume(&self) -> Result<(), ConfigError> {
        use super::resume::{
            MAX_BYTES_PER_STREAM, MAX_STREAMS, MAX_TOTAL_BYTES, MAX_TTL, MIN_BYTES,
        };
        let r = &self.resume;
        if r.ttl < Duration::from_secs(1) || r.ttl > MAX_TTL {
            return Err(ConfigError::new(
                "resume.ttl",
                format!("{:?} must be between 1s and 24h", r.ttl),
            ));
        }
        for (field, n, max) in [
            (
                "resume.max_bytes_per_stream",
                r.max_bytes_per_stream,
                MAX_BYTES_PER_STREAM,
            ),
            ("resume.max_total_bytes", r.max_total_bytes, MAX_TOTAL_BYTES),
        ] {
            if !(MIN_BYTES..=max).contains(&n) {
                return Err(ConfigError::new(
                    field,
                    format!("{n} must be between {MIN_BYTES} and {max}"),
                ));
            }
        }
        if !(1..=MAX_STREAMS).contains(&r.max_streams) {
            return Err(ConfigError::new(
                "resume.max_streams",
                format!("{} must be between 1 and {MAX_STREAMS}", r.max_streams),
            ));
        }
        if r.max_total_bytes < r.max_bytes_per_stream {
            return Err(ConfigError::new(
                "resume.max_total_bytes",
                format!(
                    "{} is below resume.max_bytes_per_stream ({}): the largest journal could never be kept",
                    r.max_total_bytes, r.max_bytes_per_stream
                ),
            ));
        }
        Ok(())
    }

    /// Semantic checks serde cannot express.
    pub fn validate(&self) -> Result<(), ConfigError> {
        // An empty or comment-only file parses into defaults: serving it
        // would be a total outage, so it is not a config.
        if self.providers.is_empty() {
            return Err(ConfigError::new(
                "providers",
                "at least one [[providers]] entry is required",
            ));
        }
        if self.routes.is_empty() {
            return Err(ConfigError::new(
                "routes",
                "at least one [[routes]] entry is required",
            ));
        }
        self.validate_server()?;
        self.validate_state()?;
        self.validate_queue()?;
        self.validate_responses()?;
        self.validate_resume()?;
        for (i, p) in self.providers.iter().enumerate() {
            validate_provider(i, p)?;
            validate_embedding_models(i, p)?;
        }
        let mut ids = HashSet::new();
        for (i, p) in self.providers.iter().enumerate() {
            if !ids.insert(p.id.as_str()) {
                return Err(ConfigError::new(
                    format!("providers[{i}].id"),
                    format!("duplicate provider id `{}`", p.id),
                ));
            }
        }
        self.validate_policies()?;
        let mut routes = HashSet::new();
        for (i, r) in self.routes.iter().enumerate() {
            if !routes.insert(r.name.as_str()) {
                return Err(ConfigError::new(
                    format!("routes[{i}].name"),
                    format!("duplicate route `{}`", r.name),
                ));
            }
            self.validate_route(i, r)?;
        }
        Ok(())
    }

    /// `[server]`.
    fn validate_server(&self) -> Result<(), ConfigError> {
        if self.server.stream_buffer == 0 {
            return Err(ConfigError::new(
                "server.stream_buffer",
                "must be at least 1",
            ));
        }
        if let Some(n) = self.server.worker_threads {
            if !(1..=super::MAX_WORKER_THREADS).contains(&n) {
                return Err(ConfigError::new(
                    "server.worker_threads",
                    format!(
                        "{n} is out of range: 1 to {} runtime threads (leave it out for one per core)",
                        super::MAX_WORKER_THREADS
                    ),
                ));
            }
        }
        if self.server.default_deadline.is_zero() {
            return Err(ConfigError::new(
                "server.default_deadline",
                "must be positive",
            ));
        }
        for (field, n) in [
            ("server.max_connections", self.server.max_connections),
            (
                "server.http_max_connections",
                self.server.http_max_connections,
            ),
            (
                "server.admin_max_connections",
                self.server.admin_max_connections,
            ),
        ] {
            if n == 0 {
                return Err(ConfigError::new(field, "must be at least 1"));
            }
        }
        for (field, d) in [
            (
                "server.header_read_timeout",
                self.server.header_read_timeout,
            ),
            (
                "server.connection_idle_timeout",
                self.server.connection_idle_timeout,
            ),
            ("server.body_read_timeout", self.server.body_read_timeout),
        ] {
            if d < Duration::from_millis(100) {
                return Err(ConfigError::new(field, "must be at least 100ms"));
            }
        }
        if self.server.send_timeout < Duration::from_millis(10) {
            return Err(ConfigError::new(
                "server.send_timeout",
                "must be at least 10ms",
            ));
        }
        Ok(())
    }

    /// `[retry_budget]` and `[backoff]`.
    fn validate_policies(&self) -> Result<(), ConfigError> {
        let b = &self.retry_budget;
        if !(b.ratio >= 0.0 && b.ratio.is_finite()) {
            return Err(ConfigError::new(
                "retry_budget.ratio",
                format!("{} must be a finite non-negative share", b.ratio),
            ));
        }
        if !(b.min_per_sec >= 0.0 && b.min_per_sec.is_finite()) {
            return Err(ConfigError::new(
                "retry_budget.min_per_sec",
                "must be finite and non-negative",
            ));
        }
        if b.ttl < Duration::from_secs(1) || b.ttl > Duration::from_secs(60) {
            return Err(ConfigError::new(
                "retry_budget.ttl",
                format!("{:?} is outside 1s..=60s", b.ttl),
            ));
        }
        if self.backoff.base.is_zero() || self.backoff.cap < self.backoff.base {
            return Err(ConfigError::new(
                "backoff.cap",
                "base must be positive and cap at least base",
            ));
        }
        Ok(())
    }

    /// One route: names, targets, ladder and limits.
    fn validate_route(&self, i: usize, r: &RouteConfig) -> Result<(), ConfigError> {
        if !valid_name(&r.name) {
            return Err(ConfigError::new(
                format!("routes[{i}].name"),
                format!(
                    "`{}` must be non-empty letters, digits, `-`, `_` or `.`",
                    r.name
                ),
            ));
        }
        if r.targets.is_empty() {
            return Err(ConfigError::new(
                format!("routes[{i}].targets"),
                "at least one target is required",
            ));
        }
        let mut seen = HashSet::new();
        for (j, t) in r.targets.iter().enumerate() {
            let path = format!("routes[{i}].targets[{j}]");
            self.resolve_target(&t.target)
                .map_err(|m| ConfigError::new(path.clone(), m))?;
            if !seen.insert(t.target.as_str()) {
                return Err(ConfigError::new(
                    path,
                    format!("duplicate target `{}`", t.target),
                ));
            }
            if t.weight == 0 {
                return Err(ConfigError::new(
                    format!("{path}.weight"),
                    "must be at least 1",
                ));
            }
        }
        for (j, t) in r.downshift.iter().enumerate() {
            self.resolve_target(&t.target)
                .map_err(|m| ConfigError::new(format!("routes[{i}].downshift[{j}]"), m))?;
        }
        if !r.downshift.is_empty() && !r.has_rung(Rung::Downshift) {
            return Err(ConfigError::new(
                format!("routes[{i}].ladder"),
                "downshift targets are set but the ladder has no `downshift` rung",
            ));
        }
        self.validate_semantic(i, r)?;
        if r.require_validated && (r.downshift.is_empty() || !r.has_rung(Rung::Downshift)) {
            return Err(ConfigError::new(
                format!("routes[{i}].require_validated"),
                "is set but the route has no `downshift` targets and rung to restrict",
            ));
        }
        if r.has_rung(Rung::Queue) && self.queue.is_none() {
            return Err(ConfigError::new(
                format!("routes[{i}].ladder"),
                "the `queue` rung needs a [queue] section",
            ));
        }
        if r.ladder.first() != Some(&Rung::Fallback) {
            return Err(ConfigError::new(
                format!("routes[{i}].ladder"),
                "must start with `fallback`",
            ));
        }
        if r.max_attempts == 0 || r.max_attempts > 10 {
            return Err(ConfigError::new(
                format!("routes[{i}].max_attempts"),
                format!("{} is outside 1..=10", r.max_attempts),
            ));
        }
        if let Some(t) = &r.service_tier {
            const TIERS: [&str; 5] = ["auto", "default", "flex", "priority", "standard_only"];
            if !TIERS.contains(&t.as_str()) {
                return Err(ConfigError::new(
                    format!("routes[{i}].service_tier"),
                    format!("`{t}` is not one of {}", TIERS.join(", ")),
                ));
            }
        }
        if r.default_max_tokens == Some(0) {
            return Err(ConfigError::new(
                format!("routes[{i}].default_max_tokens"),
                "must be at least 1",
            ));
        }
        if let Some(a) = &r.cache_affinity {
            if a.ttl < Duration::from_secs(1) || a.ttl > Duration::from_secs(24 * 3600) {
                return Err(ConfigError::new(
                    format!("routes[{i}].cache_affinity.ttl"),
                    format!("{:?} is outside 1s..=24h", a.ttl),
                ));
            }
        }
        if r.deadline.is_some_and(|d| d.is_zero()) {
            return Err(ConfigError::new(
                format!("routes[{i}].deadline"),
                "must be positive",
            ));
        }
        validate_traffic(i, r)
    }

    /// A route's `semantic_cache` and its `semantic_cache` rung.
    fn validate_semantic(&self, i: usize, r: &RouteConfig) -> Result<(), ConfigError> {
        let path = format!("routes[{i}].semantic_cache");
        let Some(s) = &r.semantic_cache else {
            if r.has_rung(Rung::SemanticCache) {
                return Err(ConfigError::new(
                    format!("routes[{i}].ladder"),
                    "the `semantic_cache` rung needs the route's `semantic_cache` settings",
                ));
            }
            return Ok(());
        };
        let at = self
            .resolve_target(&s.embedder)
            .map_err(|m| ConfigError::new(format!("{path}.embedder"), m))?;
        let p = &self.providers[at.provider];
        if !p.models[at.model].has(Capability::Embeddings) {
            return Err(ConfigError::new(
                format!("{path}.embedder"),
                format!(
                    "`{}` does not declare the `embeddings` capability",
                    s.embedder
                ),
            ));
        }
        if !p.kind.quirks().embeddings {
            return Err(ConfigError::new(
                format!("{path}.embedder"),
                format!(
                    "provider `{}` is `{}`; embeddings are read from an `openai`-kind provider's /embeddings (vLLM, llama.cpp, Ollama, OpenAI)",
                    p.id,
                    p.kind.as_str()
                ),
            ));
        }
        if !(s.threshold > 0.0 && s.threshold <= 1.0) {
            return Err(ConfigError::new(
                format!("{path}.threshold"),
                format!("{} is outside (0, 1]", s.threshold),
            ));
        }
        if s.max_entries == 0 || s.max_entries > 10_000_000 {
            return Err(ConfigError::new(
                format!("{path}.max_entries"),
                format!("{} is outside 1..=10000000", s.max_entries),
            ));
        }
        if s.max_bytes < 64 * 1024 {
            return Err(ConfigError::new(
                format!("{path}.max_bytes"),
                "must be at least 65536",
            ));
        }
        if s.ttl.is_zero() {
            return Err(ConfigError::new(format!("{path}.ttl"), "must be positive"));
        }
        if !(0.0..=2.0).contains(&s.max_temperature) {
            return Err(ConfigError::new(
                format!("{path}.max_temperature"),
                format!("{} is outside 0..=2", s.max_temperature),
            ));
        }
        if s.lookup_timeout.is_zero() || s.lookup_timeout > Duration::from_secs(10) {
            return Err(ConfigError::new(
                format!("{path}.lookup_timeout"),
                "must be positive and at most 10s",
            ));
        }
        if s.fresh_within.is_some_and(|f| f.is_zero() || f > s.ttl) {
            return Err(ConfigError::new(
                format!("{path}.fresh_within"),
                "must be positive and at most `ttl`",
            ));
        }
        if s.fresh_within.is_none() && !r.has_rung(Rung::SemanticCache) {
            return Err(ConfigError::new(
                path,
                "set `fresh_within` or add the `semantic_cache` rung to the ladder, or the cache is never read",
            ));
        }
        Ok(())
    }
}

pub(super) fn check_breaker(b: &BreakerConfig, at: &str) -> Result<(), ConfigError> {
    if !(0.0..=1.0).contains(&b.jitter) {
        return Err(ConfigError::new(
            format!("{at}.jitter"),
            format!("{} is outside 0..=1", b.jitter),
        ));
    }
    if b.failure_rate.is_nan() || b.failure_rate <= 0.0 {
        return Err(ConfigError::new(
            format!("{at}.failure_rate"),
            "must be positive (above 1 disables it)",
        ));
    }
    if b.half_open_probes == 0 {
        return Err(ConfigError::new(
            format!("{at}.half_open_probes"),
            "must be at least 1",
        ));
    }
    if b.open_for.is_zero() || b.max_open_for < b.open_for {
        return Err(ConfigError::new(
            format!("{at}.max_open_for"),
            "open_for must be positive and max_open_for at least open_for",
        ));
    }
    if b.window.is_zero() || b.probe_timeout.is_zero() {
        return Err(ConfigError::new(
            format!("{at}.window"),
            "window and probe_timeout must be positive",
        ));
    }
    Ok(())
}

pub(super) fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
}

/// One `[[providers]]` entry on its own (ids across entries are checked by the caller).
/// `embeddings` models: on an `openai`-kind provider (its `/embeddings`),
/// with a sane `family`.
pub(super) fn validate_embedding_models(i: usize, p: &ProviderConfig) -> Result<(), ConfigError> {
    for (j, m) in p.models.iter().enumerate() {
        let at = |field: &str| format!("providers[{i}].models[{j}].{field}");
        if m.has(Capability::Embeddings) && !p.kind.quirks().embeddings {
            return Err(ConfigError::new(
                at("capabilities"),
                format!(
                    "`embeddings` is served from an `openai`-kind provider's /embeddings (OpenAI, vLLM, llama.cpp, Ollama, TEI), not `{}`",
                    p.kind.as_str()
                ),
            ));
        }
        if let Some(f) = &m.family {
            if f.is_empty() || f.len() > 128 || f.chars().any(char::is_control) {
                return Err(ConfigError::new(
                    at("family"),
                    "must be 1 to 128 printable characters",
                ));
            }
        }
    }
    Ok(())
}

pub(super) fn validate_provider(i: usize, p: &ProviderConfig) -> Result<(), ConfigError> {
    let at = |field: &str| format!("providers[{i}].{field}");

    if !valid_name(&p.id) {
        return Err(ConfigError::new(
            at("id"),
            format!("`{}` must be non-empty letters, digits, `-` or `_`", p.id),
        ));
    }
    match p.base_url.parse::<http::Uri>() {
        Ok(url) if url.scheme_str() == Some("https") && p.http2_prior_knowledge => {
            return Err(ConfigError::new(
                at("http2_prior_knowledge"),
                format!(
                    "is for an `http://` upstream that speaks h2c; `{}` is https, \
                     which negotiates HTTP/2 by ALPN on its own",
                    p.base_url
                ),
            ))
        }
        Ok(url)
            if matches!(url.scheme_str(), Some("http" | "https"))
                && url.host().is_some_and(|h| !h.is_empty()) => {}
        _ => {
            return Err(ConfigError::new(
                at("base_url"),
                format!("`{}` is not an http(s) URL", p.base_url),
            ))
        }
    }
    if !p.stream_unary && p.kind.always_streamed() {
        return Err(ConfigError::new(
            at("stream_unary"),
            format!(
                "kind = \"{}\" is always called streaming; only OpenAI-shaped kinds \
                 have a non-streaming call",
                p.kind.as_str()
            ),
        ));
    }
    validate_host(i, p)?;
    validate_keys(i, p)?;
    validate_limits(i, p)?;
    validate_models(i, p)
}

/// Where the provider is and how it signs in: `api_version` (Azure),
/// `region` (Bedrock, Vertex), `project` and `credentials_file_env` (Vertex).
fn validate_host(i: usize, p: &ProviderConfig) -> Result<(), ConfigError> {
    let at = |field: &str| format!("providers[{i}].{field}");
    match (p.kind.quirks().api_version, p.api_version.as_deref()) {
        (true, None) => {
            return Err(ConfigError::new(
                at("api_version"),
                format!(
                    "required for kind = \"{}\" (e.g. \"2024-10-21\")",
                    p.kind.as_str()
                ),
            ))
        }
        (true, Some(v))
            if v.is_empty() || !v.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') =>
        {
            return Err(ConfigError::new(
                at("api_version"),
                format!("`{v}` is not an API version (letters, digits and `-`)"),
            ))
        }
        (true, Some(_)) | (false, None) => {}
        (false, Some(_)) => {
            return Err(ConfigError::new(
                at("api_version"),
                format!(
                    "only kind = \"azure_openai\" takes an api_version, not `{}`",
                    p.kind.as_str()
                ),
            ))
        }
    }
    let hosted = p.kind.hosted();
    match (hosted, p.region.as_deref()) {
        (true, None) => {
            return Err(ConfigError::new(
                at("region"),
                format!(
                    "required for kind = \"{}\" (e.g. \"us-east-1\" or \"us-east5\")",
                    p.kind.as_str()
                ),
            ))
        }
        (true, Some(r))
            if r.is_empty()
                || !r
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') =>
        {
            return Err(ConfigError::new(
                at("region"),
                format!("`{r}` is not a region"),
            ))
        }
        (true, Some(_)) | (false, None) => {}
        (false, Some(_)) => {
            return Err(ConfigError::new(
                at("region"),
                format!(
                    "only bedrock_anthropic, vertex_anthropic and vertex_gemini take a region, not `{}`",
                    p.kind.as_str()
                ),
            ))
        }
    }
    let vertex = p.kind.google_service_account();
    match (vertex, p.project.as_deref()) {
        (true, None) => {
            return Err(ConfigError::new(
                at("project"),
                format!(
                    "required for kind = \"{}\" (the Google Cloud project id)",
                    p.kind.as_str()
                ),
            ))
        }
        (true, Some(pr))
            if pr.is_empty()
                || !pr
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-') =>
        {
            return Err(ConfigError::new(
                at("project"),
                format!("`{pr}` is not a project id"),
            ))
        }
        (false, Some(_)) => {
            return Err(ConfigError::new(
                at("project"),
                "only kinds vertex_anthropic and vertex_gemini take a project",
            ))
        }
        _ => {}
    }
    if !vertex && p.credentials_file_env.is_some() {
        return Err(ConfigError::new(
            at("credentials_file_env"),
            "only kinds vertex_anthropic and vertex_gemini take a credentials_file_env",
        ));
    }
    Ok(())
}

/// `api_key_env` or `keys` (names, variables, weights, ceilings).
fn validate_keys(i: usize, p: &ProviderConfig) -> Result<(), ConfigError> {
    let at = |field: &str| format!("providers[{i}].{field}");
    let hosted = p.kind.hosted();
    if let Some(keys) = &p.keys {
        if p.api_key_env.is_some() {
            return Err(ConfigError::new(
                at("keys"),
                "set either api_key_env or keys, not both",
            ));
        }
        if hosted {
            return Err(ConfigError::new(
                at("keys"),
                format!("`{}` authenticates without API keys", p.kind.as_str()),
            ));
        }
        if keys.is_empty() {
            return Err(ConfigError::new(at("keys"), "must list at least one key"));
        }
        let mut names = std::collections::HashSet::new();
        for (k, key) in keys.iter().enumerate() {
            let at_key = |f: &str| at(&format!("keys[{k}].{f}"));
            if !valid_name(&key.name) || !names.insert(key.name.as_str()) {
                return Err(ConfigError::new(
                    at_key("name"),
                    format!(
                        "`{}` must be a unique name of letters, digits, `-` or `_`",
                        key.name
                    ),
                ));
            }
            if key.env.is_empty() || key.env.contains('=') {
                return Err(ConfigError::new(
                    at_key("env"),
                    format!("`{}` is not an environment variable name", key.env),
                ));
            }
            if key.weight == 0 {
                return Err(ConfigError::new(at_key("weight"), "must be at least 1"));
            }
            if key.max_concurrency == Some(0) {
                return Err(ConfigError::new(
                    at_key("max_concurrency"),
                    "must be at least 1",
                ));
            }
            for (name, v) in [("rpm", key.rpm), ("tpm", key.tpm)] {
                if v == Some(0) {
                    return Err(ConfigError::new(at_key(name), "must be at least 1"));
                }
            }
        }
    }
    let required = p.kind.quirks().auth == Auth::ApiKey { required: true };
    if required && p.api_key_env.is_none() && p.keys.is_none() {
        return Err(ConfigError::new(
            at("api_key_env"),
            "required for kind = \"gemini\" (or keys): AI Studio takes an API key",
        ));
    }
    if let Some(env) = &p.api_key_env {
        if env.is_empty() || env.contains('=') {
            return Err(ConfigError::new(
                at("api_key_env"),
                format!("`{env}` is not an environment variable name"),
            ));
        }
    }
    Ok(())
}

/// Ceilings, timeouts, the breaker and the health window.
fn validate_limits(i: usize, p: &ProviderConfig) -> Result<(), ConfigError> {
    let at = |field: &str| format!("providers[{i}].{field}");
    for (name, v) in [("rpm", p.rpm), ("tpm", p.tpm)] {
        if v == Some(0) {
            return Err(ConfigError::new(at(name), "must be at least 1"));
        }
    }
    if p.max_concurrency == 0 {
        return Err(ConfigError::new(
            at("max_concurrency"),
            "must be at least 1",
        ));
    }
    if p.failover_max_concurrency > p.max_concurrency {
        return Err(ConfigError::new(
            at("failover_max_concurrency"),
            format!(
                "{} exceeds max_concurrency {}",
                p.failover_max_concurrency, p.max_concurrency
            ),
        ));
    }
    for (field, d) in [
        ("connect_timeout", p.connect_timeout),
        ("first_token_timeout", p.first_token_timeout),
        ("idle_timeout", p.idle_timeout),
        ("cooldown.max_retry_after", p.cooldown.max_retry_after),
    ] {
        if d.is_zero() {
            return Err(ConfigError::new(at(field), "must be positive"));
        }
    }
    check_breaker(&p.breaker, &at("breaker"))?;
    if p.health.window.is_zero() || p.health.buckets == 0 {
        return Err(ConfigError::new(
            at("health.window"),
            "window and buckets must be positive",
        ));
    }
    Ok(())
}

/// `[[providers.models]]`: names unique and non-empty, prices finite.
fn validate_models(i: usize, p: &ProviderConfig) -> Result<(), ConfigError> {
    let at = |field: &str| format!("providers[{i}].{field}");
    if p.models.is_empty() {
        return Err(ConfigError::new(
            at("models"),
            "at least one model is required",
        ));
    }
    let mut names = HashSet::new();
    for (j, m) in p.models.iter().enumerate() {
        if m.name.is_empty() {
            return Err(ConfigError::new(
                format!("providers[{i}].models[{j}].name"),
                "must not be empty",
            ));
        }
        if !names.insert(m.name.as_str()) {
            return Err(ConfigError::new(
                format!("providers[{i}].models[{j}].name"),
                format!("duplicate model `{}`", m.name),
            ));
        }
        for (field, usd) in m.price.fields() {
            if let Some(usd) = usd.filter(|u| !(u.is_finite() && *u >= 0.0)) {
                return Err(ConfigError::new(
                    format!("providers[{i}].models[{j}].price.{field}"),
                    format!("{usd} must be a finite, non-negative USD per million tokens"),
                ));
            }
        }
    }
    Ok(())
}

/// A route's admission and hedging options.
fn validate_traffic(i: usize, r: &RouteConfig) -> Result<(), ConfigError> {
    if !(r.batch_share > 0.0 && r.batch_share <= 1.0) {
        return Err(ConfigError::new(
            format!("routes[{i}].batch_share"),
            format!("{} is outside (0, 1]", r.batch_share),
        ));
    }
    if r.admission_wait > Duration::from_secs(600) {
        return Err(ConfigError::new(
            format!("routes[{i}].admission_wait"),
            format!("{:?} is longer than 10m", r.admission_wait),
        ));
    }
    let Some(h) = &r.hedge else { return Ok(()) };
    if r.side_effects {
        return Err(ConfigError::new(
            format!("routes[{i}].hedge"),
            "a route with side_effects = true is never hedged (a hedge sends the request twice)",
        ));
    }
    if h.max_extra == 0 || h.max_extra > 3 {
        return Err(ConfigError::new(
            format!("routes[{i}].hedge.max_extra"),
            format!("{} is outside 1..=3", h.max_extra),
        ));
    }
    if h.after == HedgeAfter::After(Duration::ZERO) {
        return Err(ConfigError::new(
            format!("routes[{i}].hedge.after"),
            "must be positive (0 would send every request twice)",
        ));
    }
    if r.max_attempts < 2 {
        return Err(ConfigError::new(
            format!("routes[{i}].hedge"),
            "needs max_attempts >= 2 (a hedge is an attempt)",
        ));
    }
    Ok(())
}
