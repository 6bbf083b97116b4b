//! The neutral handle one attempt needs to reach a provider: its wire kind,
//! base URL, key, timeouts and pooled HTTP clients ([`super::pool`]). Built once per provider
//! from config; the provider actor's admission handles live elsewhere
//! (`actors::provider::ProviderRuntime` holds one of these).

use std::time::Duration;

use super::{Auth, ProviderKind};
use crate::config::ProviderConfig;

/// An API key: never printed, never logged.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: String) -> Self {
        Secret(value)
    }
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Where and how to send one attempt.
#[derive(Debug)]
pub struct Endpoint {
    /// The provider id (logs, metrics).
    pub id: String,
    pub kind: ProviderKind,
    pub base_url: String,
    pub api_key: Option<Secret>,
    /// `keys`: several keys, one picked per send (instead of `api_key`).
    pub keys: Option<super::keys::KeyPool>,
    /// `azure_openai`: the `api-version` query parameter.
    pub api_version: Option<String>,
    /// `bedrock_anthropic`: the SigV4 region and the credentials.
    pub region: Option<String>,
    pub aws: Option<super::bedrock::AwsCredentials>,
    /// `vertex_anthropic`, `vertex_gemini`: the project and the service
    /// account's token source.
    pub project: Option<String>,
    pub vertex: Option<std::sync::Arc<super::vertex::VertexAuth>>,
    /// Request sent -> first token.
    pub first_token_timeout: Duration,
    /// Longest silence inside a stream.
    pub idle_timeout: Duration,
    /// The rate windows of `api_key` (the provider's `rpm`, `tpm`).
    pub limits: crate::policy::rate_window::Limits,
    /// Cap on an upstream's `Retry-After` (`cooldown.max_retry_after`).
    pub max_retry_after: Duration,
    /// The clients requests go out on (several over HTTP/2).
    pub http: super::pool::HttpPool,
    /// The chat URL of a wire whose URL depends on nothing but the base URL
    /// (OpenAI's, Anthropic's), parsed at its first request.
    pub fixed_url: std::sync::OnceLock<Option<http::Uri>>,
}

/// Building an endpoint failed.
#[derive(Debug, thiserror::Error)]
pub enum EndpointError {
    #[error("environment variable {0} (api_key_env or a key's env) is not set")]
    MissingKey(String),
    #[error("vertex: {0}")]
    Vertex(String),
    #[error("environment variable {0} is not set (bedrock_anthropic signs with AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and, if set, AWS_SESSION_TOKEN)")]
    MissingAws(&'static str),
    #[error("cannot reach the upstream: {0}")]
    Proxy(String),
}

/// Longest upstream request id passed on.
const MAX_UPSTREAM_ID: usize = 128;

impl Endpoint {
    /// What an upstream said, made safe to pass on: this endpoint's key
    /// or Vertex access token (whole, or its first 12 characters when an
    /// upstream echoes a shortened form) is replaced by `[redacted]`.
    pub fn redact(&self, text: &str) -> String {
        self.redacted(text).into_owned()
    }

    /// [`Endpoint::redact`], copying `text` only when a secret is in it.
    fn redacted<'a>(&self, text: &'a str) -> std::borrow::Cow<'a, str> {
        let mut out = std::borrow::Cow::Borrowed(text);
        let mut scrub = |key: &str| {
            if key.is_empty() {
                return;
            }
            if out.contains(key) {
                out = out.replace(key, "[redacted]").into();
            }
            if let Some(prefix) = key.get(..12).filter(|_| key.len() > 16) {
                if out.contains(prefix) {
                    out = out.replace(prefix, "[redacted]").into();
                }
            }
        };
        let aws = self
            .aws
            .iter()
            .flat_map(|a| std::iter::once(&a.secret_access_key).chain(a.session_token.as_ref()));
        let pool = self.keys.iter().flat_map(|p| p.secrets());
        for key in self.api_key.iter().chain(aws).chain(pool) {
            scrub(key.expose());
        }
        if let Some(vertex) = &self.vertex {
            for token in vertex.recent_tokens() {
                scrub(token.expose());
            }
        }
        out
    }

    /// An upstream request id as passed on: redacted, printable ASCII,
    /// at most 128 bytes.
    pub fn upstream_id(&self, id: &str) -> String {
        let redacted = self.redacted(id);
        let mut kept = String::with_capacity(redacted.len().min(MAX_UPSTREAM_ID));
        kept.extend(
            redacted
                .chars()
                .filter(|c| c.is_ascii_graphic())
                .take(MAX_UPSTREAM_ID),
        );
        kept
    }

    /// Builds the endpoint from config, reading the API key from its environment variable.
    pub fn new(cfg: &ProviderConfig) -> Result<Self, EndpointError> {
        let api_key = match &cfg.api_key_env {
            Some(env) => Some(Secret::new(
                std::env::var(env).map_err(|_| EndpointError::MissingKey(env.clone()))?,
            )),
            None => None,
        };
        let keys = match &cfg.keys {
            None => None,
            Some(list) => {
                let mut keys = Vec::with_capacity(list.len());
                for k in list {
                    let value = std::env::var(&k.env)
                        .map_err(|_| EndpointError::MissingKey(k.env.clone()))?;
                    keys.push(
                        super::keys::Key::new(
                            k.name.clone(),
                            Secret::new(value),
                            k.weight,
                            k.max_concurrency,
                        )
                        .with_limits(crate::policy::rate_window::Limits {
                            rpm: k.rpm.or(cfg.rpm),
                            tpm: k.tpm.or(cfg.tpm),
                        }),
                    );
                }
                Some(super::keys::KeyPool::new(keys, cfg.cooldown.clone()))
            }
        };
        let (aws, vertex) = match cfg.kind.quirks().auth {
            Auth::ApiKey { .. } => (None, None),
            Auth::AwsSigV4 => (Some(aws_credentials()?), None),
            Auth::GoogleServiceAccount => (None, Some(google_auth(cfg)?)),
        };
        let http = super::pool::HttpPool::for_provider(cfg).map_err(EndpointError::Proxy)?;
        Ok(Endpoint {
            id: cfg.id.clone(),
            kind: cfg.kind,
            base_url: cfg.base_url.clone(),
            api_key,
            keys,
            api_version: cfg.api_version.clone(),
            region: cfg.region.clone(),
            aws,
            project: cfg.project.clone(),
            vertex,
            first_token_timeout: cfg.first_token_timeout,
            idle_timeout: cfg.idle_timeout,
            limits: crate::policy::rate_window::Limits {
                rpm: cfg.rpm,
                tpm: cfg.tpm,
            },
            max_retry_after: cfg.cooldown.max_retry_after,
            http,
            fixed_url: Default::default(),
        })
    }
}

impl Endpoint {
    /// The chat URL `make` writes from the base URL, for a wire whose URL
    /// depends on nothing else (an endpoint has one chat wire): written and
    /// parsed at the first request, shared by every request after (no
    /// allocation). A base URL that does not parse is written each time and
    /// refused as it is sent, as before.
    pub fn fixed_url(&self, make: fn(&str) -> String) -> super::client::Url {
        let parsed = self
            .fixed_url
            .get_or_init(|| http::Uri::try_from(make(&self.base_url)).ok());
        match parsed {
            Some(uri) => super::client::Url::Parsed(uri.clone()),
            None => super::client::Url::Text(make(&self.base_url)),
        }
    }
}

/// The name rate windows know a provider's single `api_key` by.
pub const SINGLE_KEY: &str = "default";

impl Endpoint {
    /// The keys admission may choose from, in the order it tries them, with
    /// their windows: the pool's usable keys (`prefer` first, the rest by
    /// weight) or the provider's one key.
    pub fn rate_keys(
        &self,
        now: tokio::time::Instant,
        prefer: Option<&str>,
    ) -> Vec<(&str, crate::policy::rate_window::Limits)> {
        match &self.keys {
            Some(pool) => pool
                .order(now, prefer)
                .into_iter()
                .map(|i| (pool.keys[i].name.as_str(), pool.keys[i].limits))
                .collect(),
            None => vec![(SINGLE_KEY, self.limits)],
        }
    }

    /// Whether any of its keys has configured windows.
    pub fn has_rate_limits(&self) -> bool {
        !self.limits.is_empty()
            || self
                .keys
                .as_ref()
                .is_some_and(|p| p.keys.iter().any(|k| !k.limits.is_empty()))
    }

    /// Key `name`'s configured windows.
    pub fn key_limits(&self, name: &str) -> crate::policy::rate_window::Limits {
        self.keys
            .as_ref()
            .and_then(|p| p.keys.iter().find(|k| k.name == name))
            .map_or(self.limits, |k| k.limits)
    }
}

/// SigV4 credentials from the standard AWS environment variables.
fn aws_credentials() -> Result<super::bedrock::AwsCredentials, EndpointError> {
    let var = |name: &'static str| {
        std::env::var(name)
            .ok()
            .filter(|v| !v.is_empty())
            .ok_or(EndpointError::MissingAws(name))
    };
    Ok(super::bedrock::AwsCredentials {
        access_key_id: var("AWS_ACCESS_KEY_ID")?,
        secret_access_key: Secret::new(var("AWS_SECRET_ACCESS_KEY")?),
        session_token: var("AWS_SESSION_TOKEN").ok().map(Secret::new),
    })
}

/// The service account named by the provider's `credentials_file_env`.
fn google_auth(
    cfg: &ProviderConfig,
) -> Result<std::sync::Arc<super::vertex::VertexAuth>, EndpointError> {
    let env = cfg.vertex_credentials_env();
    let path = std::env::var_os(env).ok_or_else(|| {
        EndpointError::Vertex(format!(
            "environment variable {env} (credentials_file_env) is not set"
        ))
    })?;
    let auth = super::vertex::VertexAuth::from_file(std::path::Path::new(&path))
        .map_err(EndpointError::Vertex)?;
    Ok(std::sync::Arc::new(auth))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn endpoint(api_key: &str, aws_secret: &str) -> Endpoint {
        Endpoint {
            id: "p".into(),
            kind: ProviderKind::Openai,
            base_url: "http://h/v1/".into(),
            api_key: Some(Secret::new(api_key.into())),
            keys: None,
            api_version: None,
            region: None,
            aws: Some(super::super::bedrock::AwsCredentials {
                access_key_id: "AKID".into(),
                secret_access_key: Secret::new(aws_secret.into()),
                session_token: None,
            }),
            project: None,
            vertex: None,
            first_token_timeout: Duration::from_secs(1),
            idle_timeout: Duration::from_secs(1),
            limits: Default::default(),
            max_retry_after: Duration::from_secs(1),
            http: super::super::pool::HttpPool::single(super::super::client::Client::with_proxies(
                Default::default(),
                None,
            )),
            fixed_url: Default::default(),
        }
    }

    #[test]
    fn a_fixed_url_is_written_once_and_shared() {
        use crate::upstream::client::Url;
        let e = endpoint("sk-live-0123456789abcdef", "aws-secret-value");
        let first = e.fixed_url(crate::upstream::openai::endpoint);
        assert_eq!(first.to_string(), "http://h/v1/chat/completions");
        let again = e.fixed_url(|_: &str| -> String { panic!("written once") });
        assert_eq!(again, first);
        let mut bad = endpoint("sk-live-0123456789abcdef", "aws-secret-value");
        bad.base_url = "http://exa mple/v1".into();
        let text = bad.fixed_url(crate::upstream::openai::endpoint);
        assert_eq!(
            text,
            Url::Text("http://exa mple/v1/chat/completions".into())
        );
    }

    #[test]
    fn every_secret_whole_or_by_its_first_12_characters_is_redacted_and_clean_text_is_kept() {
        let e = endpoint("sk-live-0123456789abcdef", "aws-secret-value");
        assert_eq!(
            e.redact("bad key sk-live-0123456789abcdef, signed with aws-secret-value"),
            "bad key [redacted], signed with [redacted]"
        );
        // An upstream that echoes a shortened key (the key is over 16 characters).
        assert_eq!(
            e.redact("key sk-live-0123... is invalid"),
            "key [redacted]... is invalid"
        );
        assert_eq!(e.redact("rate limited"), "rate limited");
        // A short key is redacted whole only.
        let short = endpoint("short-key", "unused-aws-secret");
        assert_eq!(
            short.redact("short-key and short-k"),
            "[redacted] and short-k"
        );
    }

    #[test]
    fn an_upstream_request_id_is_redacted_printable_and_at_most_128_bytes() {
        let e = endpoint("sk-live-0123456789abcdef", "aws-secret-value");
        assert_eq!(e.upstream_id("req_123"), "req_123");
        assert_eq!(
            e.upstream_id("req sk-live-0123456789abcdef\n"),
            "req[redacted]"
        );
        assert_eq!(e.upstream_id("é-req\u{7f}"), "-req");
        assert_eq!(e.upstream_id(&"x".repeat(300)).len(), MAX_UPSTREAM_ID);
    }
}
