//! The provider-neutral chat types every layer speaks: the request an
//! adapter puts on the wire, the chunks of output, why the model stopped and
//! what it used. Plain data, below `upstream` (which re-exports them) and
//! everything above it.

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

/// Whether the model must call one of the offered tools ("must not" is
/// said by offering none).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ToolChoice {
    #[default]
    Auto,
    /// One of the tools, the model's pick.
    Any,
    /// This tool.
    Tool(String),
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
    pub tool_choice: ToolChoice,
    /// The route's upstream service tier, for providers that take it.
    pub service_tier: Option<String>,
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
    /// The upstream service tier that served (`usage.service_tier` /
    /// `service_tier`), when it said.
    pub service_tier: Option<String>,
}
