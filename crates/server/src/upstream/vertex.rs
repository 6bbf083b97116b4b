//! Anthropic models on Google Vertex AI: `POST {base_url}/v1/projects/
//! {project}/locations/{region}/publishers/anthropic/models/{model}:streamRawPredict`
//! with Anthropic's body (`anthropic_version = "vertex-2023-10-16"`, no
//! `model`), answered in Anthropic's SSE. Auth is an OAuth2 access token
//! from the service account (an RS256 JWT bearer grant to its `token_uri`,
//! scope cloud-platform), cached until a minute before it expires (a token
//! living two minutes or less: until half its life) and refreshed once for
//! all requests, never per request. Whatever the token endpoint says about
//! the lifetime, no arithmetic on it can overflow, and the tokens handed out
//! are known to [`VertexAuth::recent_tokens`] so an upstream error that
//! echoes one is redacted before it goes anywhere.

use std::collections::VecDeque;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::policy::outcome::{Failure, OutcomeClass};
use crate::upstream::endpoint::Secret;
use crate::upstream::wire::{Auth, Call, Quirks, Wire, WireRequest};
use crate::upstream::{anthropic, openai, ChatRequest, Dialect, Dropped, StreamDecoder};

const SCOPE: &str = "https://www.googleapis.com/auth/cloud-platform";
/// A token is renewed this long before Google says it expires.
const EARLY: Duration = Duration::from_secs(60);
/// Longest a token is trusted, whatever `expires_in` says (Google's live an hour).
const LONGEST_LIFETIME: Duration = Duration::from_secs(24 * 3600);
/// Tokens remembered for redaction: the one in use and the one before it
/// (an attempt may still hold it).
const REMEMBERED: usize = 2;
const GRANT: &str = "urn:ietf:params:oauth:grant-type:jwt-bearer";
/// Most of a token endpoint's answer read.
const MAX_TOKEN_ANSWER: usize = 64 * 1024;

/// The service-account JSON's fields this adapter uses.
#[derive(Deserialize)]
struct ServiceAccountFile {
    client_email: String,
    private_key: String,
    token_uri: String,
    #[serde(default)]
    private_key_id: Option<String>,
}

/// A service account and its cached access token.
pub struct VertexAuth {
    client_email: String,
    key_id: Option<String>,
    key: jsonwebtoken::EncodingKey,
    pub token_uri: String,
    token: Mutex<Option<(Secret, Instant)>>,
    /// The latest tokens handed out, for redaction (at most [`REMEMBERED`]).
    recent: std::sync::Mutex<VecDeque<Secret>>,
}

/// When a token that lives `lifetime` from `now` is renewed: a minute before
/// it expires, or at half its life if that is later (a token of 60 s is
/// reused for 30 s, not fetched per request); never past a day, never an
/// overflow.
pub fn renew_at(now: Instant, lifetime: Duration) -> Instant {
    let lifetime = lifetime.min(LONGEST_LIFETIME);
    let reuse = lifetime.saturating_sub(EARLY).max(lifetime / 2);
    crate::policy::clock::after(now, reuse)
}

impl std::fmt::Debug for VertexAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VertexAuth")
            .field("client_email", &self.client_email)
            .field("token_uri", &self.token_uri)
            .finish_non_exhaustive()
    }
}

impl VertexAuth {
    /// Reads the service-account JSON at `path`.
    pub fn from_file(path: &std::path::Path) -> Result<Self, String> {
        let text = std::fs::read_to_string(path).map_err(|e| {
            format!(
                "cannot read the service account file {}: {e}",
                path.display()
            )
        })?;
        let sa: ServiceAccountFile = serde_json::from_str(&text)
            .map_err(|e| format!("{} is not a service account JSON: {e}", path.display()))?;
        let key = jsonwebtoken::EncodingKey::from_rsa_pem(sa.private_key.as_bytes())
            .map_err(|e| format!("the service account's private_key is not an RSA PEM key: {e}"))?;
        Ok(VertexAuth {
            client_email: sa.client_email,
            key_id: sa.private_key_id,
            key,
            token_uri: sa.token_uri,
            token: Mutex::new(None),
            recent: std::sync::Mutex::new(VecDeque::with_capacity(REMEMBERED)),
        })
    }

    /// The latest access tokens handed out (to redact from upstream text).
    pub fn recent_tokens(&self) -> Vec<Secret> {
        self.recent
            .lock()
            .map(|r| r.iter().cloned().collect())
            .unwrap_or_default()
    }

    fn remember(&self, token: &Secret) {
        if let Ok(mut r) = self.recent.lock() {
            if r.len() == REMEMBERED {
                r.pop_front();
            }
            r.push_back(token.clone());
        }
    }

    /// The signed assertion for the token request.
    fn assertion(&self, now_secs: u64) -> Result<String, Failure> {
        let mut header = jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256);
        header.kid = self.key_id.clone();
        let claims = serde_json::json!({
            "iss": self.client_email,
            "scope": SCOPE,
            "aud": self.token_uri,
            "iat": now_secs,
            "exp": now_secs + 3600,
        });
        jsonwebtoken::encode(&header, &claims, &self.key).map_err(|e| {
            Failure::new(
                OutcomeClass::Auth,
                format!("cannot sign the token request: {e}"),
            )
        })
    }

    /// A valid access token: the cached one, or one fetched now (one fetch
    /// at a time; the others wait for it and share it).
    pub async fn token(
        &self,
        http: &super::client::Client,
        limit: Instant,
    ) -> Result<Secret, Failure> {
        let mut cached = self.token.lock().await;
        if let Some((token, until)) = cached.as_ref() {
            if Instant::now() < *until {
                return Ok(token.clone());
            }
        }
        let now_secs = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let assertion = self.assertion(now_secs)?;
        let form = form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", GRANT)
            .append_pair("assertion", &assertion)
            .finish();
        let mut headers = http::HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/x-www-form-urlencoded"),
        );
        let fetch = async {
            let response = http.post(&self.token_uri, headers, form.into()).await?;
            let status = response.status();
            let body = super::client::read_capped(response, MAX_TOKEN_ANSWER).await;
            Ok::<_, super::client::Error>((status, body))
        };
        let (status, body) = tokio::time::timeout_at(limit, fetch)
            .await
            .map_err(|_| {
                Failure::new(
                    OutcomeClass::Timeout,
                    "no OAuth token before the first-token timeout",
                )
            })?
            .map_err(|e| {
                Failure::new(OutcomeClass::Connect, format!("OAuth token endpoint: {e}"))
            })?;
        let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
        if !status.is_success() {
            let why = body["error_description"]
                .as_str()
                .or(body["error"].as_str())
                .unwrap_or("refused");
            let class = if status.is_server_error() {
                OutcomeClass::ServerError
            } else {
                OutcomeClass::Auth
            };
            // The signed assertion buys tokens for an hour: never echoed on.
            let why = why.replace(&assertion, "[redacted]");
            return Err(Failure::new(
                class,
                format!("OAuth token endpoint answered {status}: {why}"),
            ));
        }
        let token = body["access_token"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| {
                Failure::new(OutcomeClass::Auth, "the OAuth answer has no access_token")
            })?;
        let lifetime = Duration::from_secs(body["expires_in"].as_u64().unwrap_or(3600));
        let token = Secret::new(token.to_string());
        self.remember(&token);
        *cached = Some((token.clone(), renew_at(Instant::now(), lifetime)));
        Ok(token)
    }
}

/// Anthropic Messages on Vertex AI (`kind = "vertex_anthropic"`).
pub struct VertexAnthropicWire;

/// The `vertex_anthropic` kind's wire.
pub static WIRE: VertexAnthropicWire = VertexAnthropicWire;

impl Wire for VertexAnthropicWire {
    fn name(&self) -> &'static str {
        "vertex_anthropic"
    }

    fn dialect(&self) -> Dialect {
        Dialect::Anthropic
    }

    fn quirks(&self) -> Quirks {
        Quirks {
            auth: Auth::GoogleServiceAccount,
            service_tiers: &[],
            ..anthropic::WIRE.quirks()
        }
    }

    fn request(&self, call: &Call<'_>, dropped: &mut Dropped) -> Result<WireRequest, Failure> {
        let ep = call.endpoint;
        // The token rides as a bearer, like OpenAI's key.
        let mut headers = openai::auth_headers(call.bearer);
        headers.extend(anthropic::passthrough_headers(
            call.chat,
            anthropic::Host::Cloud,
            dropped,
        ));
        Ok(WireRequest::json(
            endpoint(
                &ep.base_url,
                ep.project.as_deref().unwrap_or_default(),
                ep.region.as_deref().unwrap_or_default(),
                &call.chat.model,
            ),
            headers,
            build_body(call.chat, dropped),
        ))
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        anthropic::WIRE.decoder()
    }
}

/// The streaming predict URL.
pub fn endpoint(base_url: &str, project: &str, region: &str, model: &str) -> String {
    let enc = crate::upstream::encode_path_segment;
    format!(
        "{}/v1/projects/{}/locations/{}/publishers/anthropic/models/{}:streamRawPredict",
        base_url.trim_end_matches('/'),
        enc(project),
        enc(region),
        enc(model)
    )
}

/// Anthropic's body with Vertex's version and without `model`.
pub fn build_body(req: &ChatRequest, dropped: &mut Dropped) -> Value {
    let mut body = anthropic::build_body(req, anthropic::Host::Cloud, dropped);
    if let Some(o) = body.as_object_mut() {
        o.remove("model");
        o.insert("stream".into(), Value::Bool(true));
        o.insert("anthropic_version".into(), Value::from("vertex-2023-10-16"));
    }
    body
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn the_url_and_body_are_vertexs() {
        assert_eq!(
            endpoint("https://us-east5-aiplatform.googleapis.com", "my-project", "us-east5", "claude-sonnet-4-5@20250929"),
            "https://us-east5-aiplatform.googleapis.com/v1/projects/my-project/locations/us-east5/publishers/anthropic/models/claude-sonnet-4-5%4020250929:streamRawPredict"
        );
        let body = build_body(
            &ChatRequest {
                model: "claude-sonnet-4-5@20250929".into(),
                ..Default::default()
            },
            &mut crate::upstream::Dropped::default(),
        );
        assert_eq!(body["anthropic_version"], "vertex-2023-10-16");
        assert_eq!(body["stream"], true);
        assert!(body.get("model").is_none());
    }

    /// A service account whose token_uri is `token_uri`.
    fn auth_for(dir: &std::path::Path, token_uri: &str) -> VertexAuth {
        let path = dir.join("sa.json");
        let key = include_str!("../../../../tests/fixtures/vertex-test-key.pem");
        std::fs::write(
            &path,
            serde_json::json!({"type": "service_account", "client_email": "sy@p.iam.gserviceaccount.com",
                "private_key": key, "private_key_id": "k1", "token_uri": token_uri})
            .to_string(),
        )
        .unwrap();
        VertexAuth::from_file(&path).unwrap()
    }

    /// A token endpoint on loopback answering every grant with `expires_in`
    /// (token `tok-N`, N counting from 1); the grants so far.
    async fn token_endpoint(
        expires_in: u64,
    ) -> (String, std::sync::Arc<std::sync::atomic::AtomicU64>) {
        use std::sync::atomic::{AtomicU64, Ordering};
        let grants = std::sync::Arc::new(AtomicU64::new(0));
        let counted = grants.clone();
        let app = axum::Router::new().route(
            "/token",
            axum::routing::post(move || {
                let n = counted.fetch_add(1, Ordering::SeqCst) + 1;
                async move {
                    axum::Json(serde_json::json!({
                        "access_token": format!("tok-{n}"), "expires_in": expires_in,
                    }))
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(listener, app).await });
        (format!("http://{addr}/token"), grants)
    }

    fn far() -> Instant {
        Instant::now() + Duration::from_secs(30)
    }

    #[tokio::test(start_paused = true)]
    async fn a_token_is_renewed_a_minute_early_or_at_half_its_life_and_never_overflows() {
        let now = Instant::now();
        let s = Duration::from_secs;
        assert_eq!(renew_at(now, s(3600)), now + s(3540));
        assert_eq!(renew_at(now, s(120)), now + s(60));
        assert_eq!(renew_at(now, s(60)), now + s(30));
        assert_eq!(renew_at(now, s(0)), now);
        assert_eq!(renew_at(now, s(u64::MAX)), now + s(24 * 3600 - 60));
    }

    #[tokio::test]
    async fn an_expires_in_of_two_to_the_64_is_a_token_not_a_panic() {
        let (uri, grants) = token_endpoint(u64::MAX).await;
        let dir = tempfile::tempdir().unwrap();
        let auth = auth_for(dir.path(), &uri);
        let http = crate::upstream::client::Client::with_proxies(Default::default(), None);
        let token = auth.token(&http, far()).await.unwrap();
        assert_eq!(token.expose(), "tok-1");
        assert_eq!(auth.token(&http, far()).await.unwrap().expose(), "tok-1");
        assert_eq!(grants.load(std::sync::atomic::Ordering::SeqCst), 1);
    }

    #[tokio::test]
    async fn a_token_living_sixty_seconds_is_reused_not_fetched_per_request() {
        let (uri, grants) = token_endpoint(60).await;
        let dir = tempfile::tempdir().unwrap();
        let auth = auth_for(dir.path(), &uri);
        let http = crate::upstream::client::Client::with_proxies(Default::default(), None);
        for _ in 0..5 {
            assert_eq!(auth.token(&http, far()).await.unwrap().expose(), "tok-1");
        }
        assert_eq!(grants.load(std::sync::atomic::Ordering::SeqCst), 1);
        // The tokens handed out are known, for redaction.
        let recent: Vec<String> = auth
            .recent_tokens()
            .iter()
            .map(|t| t.expose().to_string())
            .collect();
        assert_eq!(recent, ["tok-1"]);
    }

    #[test]
    fn the_assertion_is_an_rs256_jwt_for_the_token_uri() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sa.json");
        let key = include_str!("../../../../tests/fixtures/vertex-test-key.pem");
        std::fs::write(
            &path,
            serde_json::json!({"type": "service_account", "client_email": "sy@p.iam.gserviceaccount.com",
                "private_key": key, "private_key_id": "k1", "token_uri": "http://127.0.0.1:9/token"})
            .to_string(),
        )
        .unwrap();
        let auth = VertexAuth::from_file(&path).unwrap();
        let jwt = auth.assertion(1_700_000_000).unwrap();
        let public = include_str!("../../../../tests/fixtures/vertex-test-key.pub.pem");
        let mut v = jsonwebtoken::Validation::new(jsonwebtoken::Algorithm::RS256);
        v.set_audience(&["http://127.0.0.1:9/token"]);
        v.validate_exp = false;
        let data = jsonwebtoken::decode::<Value>(
            &jwt,
            &jsonwebtoken::DecodingKey::from_rsa_pem(public.as_bytes()).unwrap(),
            &v,
        )
        .unwrap();
        assert_eq!(data.claims["iss"], "sy@p.iam.gserviceaccount.com");
        assert_eq!(data.claims["scope"], SCOPE);
        assert_eq!(data.claims["exp"], 1_700_003_600u64);
        assert_eq!(data.header.kid.as_deref(), Some("k1"));
        assert!(
            format!("{auth:?}").contains("token_uri") && !format!("{auth:?}").contains("PRIVATE")
        );
    }
}
