//! The one seam between an attempt and a provider's dialect. [`Wire`] says
//! how a provider kind builds its HTTP request from the neutral
//! [`ChatRequest`], cuts the response body into events, decodes them, reads
//! a non-2xx answer, and what it declares ([`Quirks`]: auth, host fields,
//! streaming, embeddings, service tiers). Each adapter file implements it
//! for its kinds and `ProviderKind::wire` is the one place a kind maps to
//! its wire. Pure: no I/O (the attempt sends and fetches tokens).

use std::time::SystemTime;

use http::HeaderMap;
use serde_json::Value;

use crate::policy::outcome::{Failure, OutcomeClass};
pub use crate::upstream::client::Url;
use crate::upstream::endpoint::Endpoint;
use crate::upstream::sse::{SseEvent, SseParser};
use crate::upstream::{classify, ChatRequest, Chunk, Completion, Dialect, Dropped, StreamDecoder};

/// One provider dialect on one host. Chosen once per attempt
/// (`&'static dyn Wire`); builds no state of its own.
pub trait Wire: Sync {
    /// The kind's config name (`kind = "…"`).
    fn name(&self) -> &'static str;

    /// The content family: prices, reasoning signatures, passthrough.
    fn dialect(&self) -> Dialect;

    /// What the kind declares to config and to the request task.
    fn quirks(&self) -> Quirks;

    /// The HTTP request of one attempt; what the wire cannot carry is noted
    /// in `dropped`. `Err` ends the attempt before anything is sent.
    fn request(&self, call: &Call<'_>, dropped: &mut Dropped) -> Result<WireRequest, Failure>;

    /// Cuts a streamed body into events: SSE unless the wire says otherwise.
    fn framer(&self) -> Box<dyn Framer> {
        Box::new(SseParser::new())
    }

    /// A fresh decoder for one streamed body.
    fn decoder(&self) -> Box<dyn StreamDecoder>;

    /// A whole (non-streamed) body: only called when the caller did not ask
    /// for a stream and the wire is not [`Quirks::always_streamed`].
    fn decode_whole(&self, _body: &[u8]) -> Result<(Vec<Chunk>, Completion), Failure> {
        Err(Failure::new(
            OutcomeClass::Protocol,
            format!("{} answers in streams only", self.name()),
        ))
    }

    /// A non-2xx answer: its classified failure, or an answer after all
    /// (Azure's content filter).
    fn refused(&self, status: u16, headers: &HeaderMap, body: &[u8]) -> Refused {
        Refused::Failed(classify::classify_http(status, headers, body))
    }
}

/// What one attempt hands its wire to build the request from.
pub struct Call<'a> {
    /// With `model` set to the target's model.
    pub chat: &'a ChatRequest,
    /// Base URL, host fields (`api_version`, `project`, `region`) and AWS credentials.
    pub endpoint: &'a Endpoint,
    /// The API key this send uses (the provider's, or one of its several).
    pub key: Option<&'a str>,
    /// A Google service account's access token.
    pub bearer: Option<&'a str>,
    /// The wall clock, for request signing.
    pub now: SystemTime,
}

/// The request a wire built, before the attempt adds its own headers.
#[derive(Debug)]
pub struct WireRequest {
    pub url: Url,
    pub headers: HeaderMap,
    pub body: Body,
}

/// How the body goes out.
#[derive(Debug)]
pub enum Body {
    /// Serialised as it goes out (with `content-type: application/json`
    /// unless the wire set another).
    Json(Value),
    /// Exact bytes, already serialised (a signature covers them, or the
    /// wire wrote them without a JSON tree).
    Bytes(bytes::Bytes),
}

impl WireRequest {
    /// A JSON POST.
    pub fn json(url: impl Into<Url>, headers: HeaderMap, body: Value) -> Self {
        WireRequest {
            url: url.into(),
            headers,
            body: Body::Json(body),
        }
    }

    /// A JSON POST whose body the wire wrote itself.
    pub fn json_bytes(url: impl Into<Url>, mut headers: HeaderMap, body: bytes::Bytes) -> Self {
        headers
            .entry(http::header::CONTENT_TYPE)
            .or_insert(http::HeaderValue::from_static("application/json"));
        WireRequest {
            url: url.into(),
            headers,
            body: Body::Bytes(body),
        }
    }
}

/// How a non-2xx answer ends the attempt.
#[derive(Debug, Clone, PartialEq)]
pub enum Refused {
    /// A classified failure.
    Failed(Failure),
    /// An answer shaped by the provider's safety layer: no retry, no
    /// failover, the breaker counts a success.
    Answered(Completion),
}

/// Cuts a response body into events, whatever its framing (SSE, the AWS
/// event stream). One per attempt; bounded like [`SseParser`].
pub trait Framer: Send {
    /// Parses `bytes`, pushing every event they complete onto `out`.
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), Failure>;

    /// The body ended: flush the last event, or fail on a cut frame.
    fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), Failure>;

    /// Takes back an event once it is decoded, to reuse its buffers.
    fn recycle(&mut self, _event: SseEvent) {}
}

impl Framer for SseParser {
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), Failure> {
        SseParser::feed(self, bytes, out)
            .map_err(|e| Failure::new(OutcomeClass::Protocol, e.to_string()))
    }

    fn finish(&mut self, out: &mut Vec<SseEvent>) -> Result<(), Failure> {
        SseParser::finish(self, out)
            .map_err(|e| Failure::new(OutcomeClass::Protocol, e.to_string()))
    }

    fn recycle(&mut self, event: SseEvent) {
        SseParser::recycle(self, event);
    }
}

/// What a provider kind declares: read by the config validator, the
/// endpoint builder and the request task instead of matching on the kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quirks {
    /// How it signs in (and so which host fields it takes).
    pub auth: Auth,
    /// Takes an `api_version` query parameter (Azure).
    pub api_version: bool,
    /// Called streaming whatever the caller asked (Anthropic's SDKs refuse
    /// long non-streamed calls); otherwise [`Wire::decode_whole`] reads a
    /// non-streamed answer.
    pub always_streamed: bool,
    /// Serves `/embeddings` (the Embeddings door, a semantic cache's embedder).
    pub embeddings: bool,
    /// The `service_tier` values its API takes (others are not sent).
    pub service_tiers: &'static [&'static str],
}

/// How a provider authenticates.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Auth {
    /// An API key (`api_key_env` or `keys`); `required`: config refuses a
    /// provider without one.
    ApiKey { required: bool },
    /// SigV4 with the AWS credentials of the environment; takes a `region`.
    AwsSigV4,
    /// A Google service account's OAuth2 token; takes a `region`, a
    /// `project` and a `credentials_file_env`.
    GoogleServiceAccount,
}

impl Quirks {
    /// A cloud host of another company's models: takes a `region` and
    /// authenticates without API keys.
    pub fn hosted(&self) -> bool {
        !matches!(self.auth, Auth::ApiKey { .. })
    }

    /// Authenticates with a Google service account (and takes a `project`).
    pub fn google_service_account(&self) -> bool {
        self.auth == Auth::GoogleServiceAccount
    }

    /// Its API takes this `service_tier` value.
    pub fn takes_service_tier(&self, tier: &str) -> bool {
        self.service_tiers.contains(&tier)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::config::{Config, ConfigError};
    use crate::upstream::endpoint::Secret;
    use crate::upstream::ProviderKind;

    #[test]
    fn every_kind_maps_to_the_wire_of_its_config_name() {
        for kind in ProviderKind::ALL {
            let name = kind.wire().name();
            assert_eq!(serde_json::to_value(kind).unwrap(), name);
            let back: ProviderKind = serde_json::from_value(name.into()).unwrap();
            assert_eq!(back, kind, "{name}");
        }
    }

    /// Every host field a kind can be given, with a valid value (TOML).
    const HOST_FIELDS: [(&str, &str); 6] = [
        ("api_version", "\"2024-10-21\""),
        ("region", "\"us-east5\""),
        ("project", "\"my-project\""),
        ("credentials_file_env", "\"SA_FILE\""),
        ("api_key_env", "\"KEY\""),
        ("keys", "[{ name = \"a\", env = \"KEY_A\" }]"),
    ];

    /// Whether a kind with these quirks takes `field`.
    fn takes(q: &Quirks, field: &str) -> bool {
        match field {
            "api_version" => q.api_version,
            "region" => q.hosted(),
            "project" | "credentials_file_env" => q.google_service_account(),
            // Today's validator takes `api_key_env` on every kind.
            "api_key_env" => true,
            "keys" => !q.hosted(),
            _ => false,
        }
    }

    /// Whether a kind with these quirks cannot do without `field`.
    fn needs(q: &Quirks, field: &str) -> bool {
        match field {
            "api_version" => q.api_version,
            "region" => q.hosted(),
            "project" => q.google_service_account(),
            "api_key_env" => q.auth == Auth::ApiKey { required: true },
            _ => false,
        }
    }

    /// One provider of `kind` with `fields`, a chat model and maybe an
    /// embeddings model, and a route (and `service_tier`) to it.
    fn config(
        kind: ProviderKind,
        fields: &[(&str, &str)],
        embeddings: bool,
        tier: Option<&str>,
    ) -> Result<Config, ConfigError> {
        let mut toml = format!(
            "[[providers]]\nid = \"p\"\nkind = \"{}\"\nbase_url = \"http://127.0.0.1:1\"\n",
            kind.as_str()
        );
        for (field, value) in fields {
            toml += &format!("{field} = {value}\n");
        }
        toml += "  [[providers.models]]\n  name = \"m\"\n";
        if embeddings {
            toml += "  [[providers.models]]\n  name = \"e\"\n  capabilities = [\"embeddings\"]\n";
        }
        toml += "[[routes]]\nname = \"chat\"\ntargets = [\"p/m\"]\n";
        if let Some(t) = tier {
            toml += &format!("service_tier = \"{t}\"\n");
        }
        Config::from_toml_str(&toml)
    }

    #[test]
    fn each_kind_declares_the_host_fields_and_embeddings_the_validator_enforces() {
        for kind in ProviderKind::ALL {
            let q = kind.quirks();
            // Every field it takes but `keys` (`api_key_env` stands for it).
            let given: Vec<_> = HOST_FIELDS
                .into_iter()
                .filter(|(f, _)| takes(&q, f) && *f != "keys")
                .collect();
            config(kind, &given, false, None)
                .unwrap_or_else(|e| panic!("{}: its own fields refused: {e}", kind.as_str()));
            for (field, value) in HOST_FIELDS {
                let path = format!("providers[0].{field}");
                if field == "keys" {
                    let keyed = given.iter().copied().filter(|g| g.0 != "api_key_env");
                    let keyed: Vec<_> = keyed.chain([(field, value)]).collect();
                    let taken = config(kind, &keyed, false, None);
                    assert_eq!(taken.is_ok(), takes(&q, field), "{kind:?}: {taken:?}");
                } else if takes(&q, field) {
                    let without: Vec<_> = given.iter().copied().filter(|g| g.0 != field).collect();
                    match config(kind, &without, false, None) {
                        Err(e) => assert!(needs(&q, field) && e.path == path, "{kind:?}: {e}"),
                        Ok(_) => assert!(!needs(&q, field), "{kind:?} runs without {field}"),
                    }
                } else {
                    let mut with = given.clone();
                    with.push((field, value));
                    let e = config(kind, &with, false, None).unwrap_err();
                    assert_eq!(e.path, path, "{kind:?} took {field}: {e}");
                }
            }
            let embeddings = config(kind, &given, true, None);
            assert_eq!(embeddings.is_ok(), q.embeddings, "{kind:?}: {embeddings:?}");
        }
    }

    #[test]
    fn the_validators_service_tiers_are_the_ones_some_wire_takes() {
        let kind = ProviderKind::Openai;
        let e = config(kind, &[], false, Some("none-such")).unwrap_err();
        assert_eq!(e.path, "routes[0].service_tier");
        let listed = e.message.rsplit("one of ").next().unwrap();
        let mut validator: Vec<&str> = listed.split(", ").collect();
        let mut wires: Vec<&str> = ProviderKind::ALL
            .iter()
            .flat_map(|k| k.quirks().service_tiers.iter().copied())
            .collect();
        for v in [&mut validator, &mut wires] {
            v.sort_unstable();
            v.dedup();
        }
        assert_eq!(validator, wires);
    }

    fn endpoint(kind: ProviderKind) -> Endpoint {
        Endpoint {
            id: "p".into(),
            kind,
            base_url: "http://h/v1/".into(),
            api_key: None,
            keys: None,
            api_version: Some("2024-10-21".into()),
            region: Some("us-east-1".into()),
            aws: Some(crate::upstream::bedrock::AwsCredentials {
                access_key_id: "AKID".into(),
                secret_access_key: Secret::new("secret".into()),
                session_token: None,
            }),
            project: Some("proj".into()),
            vertex: None,
            first_token_timeout: std::time::Duration::from_secs(1),
            idle_timeout: std::time::Duration::from_secs(1),
            limits: Default::default(),
            max_retry_after: std::time::Duration::from_secs(1),
            http: crate::upstream::pool::HttpPool::single(
                crate::upstream::client::Client::with_proxies(Default::default(), None),
            ),
            fixed_url: Default::default(),
        }
    }

    #[test]
    fn each_kind_sends_to_its_url_with_its_credential() {
        let rows = [
            (ProviderKind::Openai, "http://h/v1/chat/completions", "authorization", "Bearer key"),
            (ProviderKind::Anthropic, "http://h/v1/messages", "x-api-key", "key"),
            (
                ProviderKind::AzureOpenai,
                "http://h/v1/openai/deployments/m/chat/completions?api-version=2024-10-21",
                "api-key",
                "key",
            ),
            (
                ProviderKind::BedrockAnthropic,
                "http://h/v1/model/m/invoke-with-response-stream",
                "authorization",
                "AWS4-HMAC-SHA256 Credential=AKID/",
            ),
            (
                ProviderKind::VertexAnthropic,
                "http://h/v1/v1/projects/proj/locations/us-east-1/publishers/anthropic/models/m:streamRawPredict",
                "authorization",
                "Bearer token",
            ),
            (
                ProviderKind::Gemini,
                "http://h/v1/v1beta/models/m:streamGenerateContent?alt=sse",
                "x-goog-api-key",
                "key",
            ),
            (
                ProviderKind::VertexGemini,
                "http://h/v1/v1/projects/proj/locations/us-east-1/publishers/google/models/m:streamGenerateContent?alt=sse",
                "authorization",
                "Bearer token",
            ),
        ];
        assert_eq!(rows.len(), ProviderKind::ALL.len());
        let chat = ChatRequest {
            model: "m".into(),
            ..Default::default()
        };
        for (kind, url, header, credential) in rows {
            let ep = endpoint(kind);
            let call = Call {
                chat: &chat,
                endpoint: &ep,
                key: Some("key"),
                bearer: Some("token"),
                now: SystemTime::UNIX_EPOCH,
            };
            let req = kind.wire().request(&call, &mut Dropped::default()).unwrap();
            assert_eq!(req.url.to_string(), url, "{kind:?}");
            let value = req.headers[header].to_str().unwrap();
            assert!(value.starts_with(credential), "{kind:?}: {value}");
            assert!(req.headers[header].is_sensitive(), "{kind:?}");
            // A signature covers exact bytes (the OpenAI wire writes its
            // own bytes too, unsigned).
            if kind.quirks().auth == Auth::AwsSigV4 {
                assert!(matches!(req.body, Body::Bytes(_)), "{kind:?}");
            }
        }
    }

    #[test]
    fn azure_reads_its_content_filter_as_an_answer_and_bedrock_its_error_header() {
        let filtered = br#"{"error":{"code":"content_filter","message":"filtered"}}"#;
        let none = HeaderMap::new();
        for kind in ProviderKind::ALL {
            let refused = kind.wire().refused(400, &none, filtered);
            match refused {
                Refused::Answered(c) => {
                    assert_eq!(kind, ProviderKind::AzureOpenai);
                    assert_eq!(c.finish_reason, crate::chat::FinishReason::ContentFilter);
                }
                Refused::Failed(f) => {
                    assert_ne!(kind, ProviderKind::AzureOpenai);
                    assert_eq!(f.class, OutcomeClass::Invalid, "{kind:?}");
                }
            }
        }
        let mut named = HeaderMap::new();
        named.insert(
            "x-amzn-errortype",
            "ThrottlingException:http://x".parse().unwrap(),
        );
        for kind in ProviderKind::ALL {
            let Refused::Failed(f) = kind.wire().refused(400, &named, b"{}") else {
                panic!("{kind:?}");
            };
            let throttled = f.class == OutcomeClass::RateLimited;
            assert_eq!(
                throttled,
                kind == ProviderKind::BedrockAnthropic,
                "{kind:?}"
            );
        }
    }
}
