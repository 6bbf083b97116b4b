//! Upstream wire adapters: building provider requests and decoding their
//! responses into one normalised event stream, with strict end-of-stream checks.
//! Each provider kind is one [`Wire`] (its adapter file implements it) and
//! [`ProviderKind::wire`] is the one place a kind maps to it: a new kind is
//! its file plus its arm there. Knows nothing of actors or gRPC; every
//! failure comes back as a classified [`Failure`](crate::policy::outcome::Failure).

pub mod anthropic;
pub mod azure;
pub mod bedrock;
pub mod classify;
pub mod client;
#[cfg(test)]
mod content_tests;
pub mod endpoint;
#[cfg(test)]
pub(crate) mod fuzz;
pub mod gemini;
mod h1_conn;
mod h2_conn;
pub mod keys;
pub mod openai;
mod openai_body;
mod openai_frame;
pub mod pool;
pub mod ratelimit;
pub mod sse;
pub mod vertex;
pub mod wire;

use crate::policy::outcome::Failure;
pub use wire::{Auth, Quirks, Wire};

/// Everything but RFC 3986's unreserved characters.
const PATH_SEGMENT: &percent_encoding::AsciiSet = &percent_encoding::NON_ALPHANUMERIC
    .remove(b'-')
    .remove(b'_')
    .remove(b'.')
    .remove(b'~');

/// Percent-encodes one URL path segment (or query value).
pub(crate) fn encode_path_segment(s: &str) -> String {
    percent_encoding::utf8_percent_encode(s, PATH_SEGMENT).to_string()
}

/// A provider's `kind` in config; [`ProviderKind::wire`] says how it speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI Chat Completions (also vLLM, llama.cpp, Ollama).
    Openai,
    /// Anthropic Messages.
    Anthropic,
    /// Azure OpenAI: OpenAI's wire at a deployment's URL, `api-key` auth.
    #[serde(rename = "azure_openai")]
    AzureOpenai,
    /// Anthropic Messages on Amazon Bedrock: SigV4, the AWS event stream.
    #[serde(rename = "bedrock_anthropic")]
    BedrockAnthropic,
    /// Anthropic Messages on Google Vertex AI: OAuth2 from a service account.
    #[serde(rename = "vertex_anthropic")]
    VertexAnthropic,
    /// Google Gemini on AI Studio: `x-goog-api-key`, Gemini's SSE.
    Gemini,
    /// Google Gemini on Vertex AI: the same wire, OAuth2 from a service account.
    #[serde(rename = "vertex_gemini")]
    VertexGemini,
}

impl ProviderKind {
    /// Every kind, in declaration order.
    pub const ALL: [ProviderKind; 7] = [
        ProviderKind::Openai,
        ProviderKind::Anthropic,
        ProviderKind::AzureOpenai,
        ProviderKind::BedrockAnthropic,
        ProviderKind::VertexAnthropic,
        ProviderKind::Gemini,
        ProviderKind::VertexGemini,
    ];

    /// The wire this kind speaks: the one place a kind maps to its dialect,
    /// host and quirks. A new kind is its adapter file and one arm here.
    pub fn wire(self) -> &'static dyn Wire {
        match self {
            ProviderKind::Openai => &openai::WIRE,
            ProviderKind::Anthropic => &anthropic::WIRE,
            ProviderKind::AzureOpenai => &azure::WIRE,
            ProviderKind::BedrockAnthropic => &bedrock::WIRE,
            ProviderKind::VertexAnthropic => &vertex::WIRE,
            ProviderKind::Gemini => &gemini::AI_STUDIO,
            ProviderKind::VertexGemini => &gemini::VERTEX,
        }
    }

    /// The config name (`kind = "…"`).
    pub fn as_str(self) -> &'static str {
        self.wire().name()
    }

    /// What the kind declares (auth, host fields, streaming, tiers).
    pub fn quirks(self) -> Quirks {
        self.wire().quirks()
    }

    /// Authenticates with a Google service account's OAuth2 token (and
    /// takes a `project` and a `region`).
    pub fn google_service_account(self) -> bool {
        self.quirks().google_service_account()
    }

    /// A cloud host of another company's models: takes a `region`, and
    /// authenticates without API keys (SigV4 or a service account).
    pub fn hosted(self) -> bool {
        self.quirks().hosted()
    }

    /// Always called streaming, whatever the caller asked (the
    /// non-streaming path is OpenAI's).
    pub fn always_streamed(self) -> bool {
        self.quirks().always_streamed
    }

    /// The wire family this kind speaks.
    pub fn dialect(self) -> Dialect {
        self.wire().dialect()
    }
}

pub use crate::chat::{
    ChatMessage, ChatRequest, Chunk, Completion, Dialect, FinishReason, ToolCall, ToolSpec, Usage,
};

/// What an adapter could not put on its wire, by name, for the caller's
/// `x-switchyard-dropped` (never silent). Names are stable: `cache_control`,
/// `reasoning` (signed reasoning of another family), `thinking`, `is_error`,
/// `document_url`, `image_url`, `tool_result_media`, `passthrough.<field>`,
/// `header.<name>`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Dropped(Vec<String>);

/// Passthrough fields that only say how a door's caller spelled something
/// the request models (OpenAI's `max_completion_tokens` for `max_tokens`):
/// their own wire writes the modelled value under that name, another wire
/// carries it in its own shape, so they are never reported as dropped.
pub const SPELLINGS: [&str; 1] = ["max_completion_tokens"];

impl Dropped {
    /// Notes one thing left out (once).
    pub fn note(&mut self, what: impl Into<String>) {
        let what = what.into();
        if !self.0.contains(&what) {
            self.0.push(what);
        }
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn names(&self) -> &[String] {
        &self.0
    }

    pub fn into_names(self) -> Vec<String> {
        self.0
    }

    /// What the door itself could not carry (every adapter reports it).
    pub fn door(&mut self, req: &crate::chat::ChatRequest) {
        for what in req.passthrough.iter().flat_map(|p| &p.dropped) {
            self.note(what.clone());
        }
    }

    /// Every field and header of a passthrough meant for another dialect
    /// (not a [`SPELLINGS`] field: what it spells was carried).
    pub fn passthrough(&mut self, p: &crate::chat::Passthrough) {
        for field in p.fields.keys() {
            if !SPELLINGS.contains(&field.as_str()) {
                self.note(format!("passthrough.{field}"));
            }
        }
        for (name, _) in &p.headers {
            self.note(format!("header.{name}"));
        }
    }
}

/// Decodes one provider's response body, event by event, and checks at the end
/// that the stream really completed. One decoder per attempt.
pub trait StreamDecoder: Send {
    /// Feed one SSE event; push the output it carries onto `out`.
    /// An `Err` ends the attempt (error frame, malformed JSON, refusal is *not* an error).
    fn on_event(&mut self, event: &sse::SseEvent, out: &mut Vec<Chunk>) -> Result<(), Failure>;

    /// The body ended. `Ok` only if the provider's completion predicate held.
    fn finish(&mut self) -> Result<Completion, Failure>;
}
