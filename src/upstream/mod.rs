//! Upstream wire adapters: building provider requests and decoding their
//! responses into one normalised event stream, with strict end-of-stream checks.
//! Knows nothing of actors or gRPC; every failure comes back as a classified
//! [`Failure`](crate::policy::outcome::Failure).

pub mod anthropic;
pub mod azure;
pub mod bedrock;
pub mod classify;
pub mod endpoint;
#[cfg(test)]
pub(crate) mod fuzz;
pub mod keys;
pub mod openai;
mod openai_frame;
pub mod sse;
pub mod vertex;

use crate::policy::outcome::Failure;

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

/// The wire format a provider speaks.
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
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
            ProviderKind::AzureOpenai => "azure_openai",
            ProviderKind::BedrockAnthropic => "bedrock_anthropic",
            ProviderKind::VertexAnthropic => "vertex_anthropic",
        }
    }
}

pub use crate::chat::{
    ChatMessage, ChatRequest, Chunk, Completion, FinishReason, ToolCall, ToolSpec, Usage,
};

/// Decodes one provider's response body, event by event, and checks at the end
/// that the stream really completed. One decoder per attempt.
pub trait StreamDecoder: Send {
    /// Feed one SSE event; push the output it carries onto `out`.
    /// An `Err` ends the attempt (error frame, malformed JSON, refusal is *not* an error).
    fn on_event(&mut self, event: &sse::SseEvent, out: &mut Vec<Chunk>) -> Result<(), Failure>;

    /// The body ended. `Ok` only if the provider's completion predicate held.
    fn finish(&mut self) -> Result<Completion, Failure>;
}
