//! Upstream wire adapters: building provider requests and decoding their
//! responses into one normalised event stream, with strict end-of-stream checks.
//! Knows nothing of actors or gRPC; every failure comes back as a classified
//! [`Failure`](crate::policy::outcome::Failure).

pub mod anthropic;
pub mod classify;
pub mod openai;
pub mod sse;

use crate::policy::outcome::Failure;

/// The wire format a provider speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProviderKind {
    /// OpenAI Chat Completions (also vLLM, llama.cpp, Ollama).
    Openai,
    /// Anthropic Messages.
    Anthropic,
}

impl ProviderKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ProviderKind::Openai => "openai",
            ProviderKind::Anthropic => "anthropic",
        }
    }
}

/// One message of the conversation, provider-neutral.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatMessage {
    /// "system", "user", "assistant" or "tool".
    pub role: String,
    pub content: String,
    /// For role "tool": the call this message answers.
    pub tool_call_id: Option<String>,
    /// For role "assistant": calls the model made earlier.
    pub tool_calls: Vec<ToolCall>,
}

/// A complete tool call (id, name, JSON arguments).
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub arguments: String,
}

/// A tool the model may call.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments.
    pub parameters: serde_json::Value,
}

/// A normalised chat request, ready for an adapter to put on the wire.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatRequest {
    /// The provider's model name.
    pub model: String,
    pub messages: Vec<ChatMessage>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub stop: Vec<String>,
    pub tools: Vec<ToolSpec>,
    /// Ask for a JSON object response.
    pub json_mode: bool,
    /// Stream the response (SSE). When false the adapter uses the non-streaming endpoint.
    pub stream: bool,
}

/// A piece of output to forward to the caller as soon as it arrives.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Chunk {
    Text(String),
    /// A fragment of a tool call; fragments with one `index` belong together.
    ToolCall {
        index: u32,
        id: Option<String>,
        name: Option<String>,
        arguments: String,
    },
}

/// Why the model stopped, normalised across providers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum FinishReason {
    Stop,
    Length,
    ToolCalls,
    ContentFilter,
    Refusal,
}

/// Token usage reported by the upstream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    pub input_tokens: u32,
    pub output_tokens: u32,
}

/// What a stream that passed its completion predicate ended with.
#[derive(Debug, Clone, PartialEq)]
pub struct Completion {
    pub finish_reason: FinishReason,
    /// `None` when the upstream sent no usage (the caller estimates it).
    pub usage: Option<Usage>,
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
