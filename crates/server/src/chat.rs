//! The provider-neutral chat types every layer speaks: the request an
//! adapter puts on the wire (messages of text, images, documents and signed
//! reasoning, prompt-cache markers, reasoning and structured-output asks,
//! and what a door did not model), the chunks of output, why the model
//! stopped and what it used. Plain data, below `upstream` (which re-exports
//! them) and everything above it.

use std::borrow::Cow;
use std::sync::Arc;

use bytes::Bytes;
use serde_json::{Map, Value};

/// A wire family: the upstream kinds that take one request shape, and the
/// doors that speak it. Signed reasoning and passthrough fields are bound to one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Dialect {
    /// OpenAI Chat Completions and compatible servers (and Azure OpenAI).
    Openai,
    /// Anthropic Messages (first party, Bedrock, Vertex).
    Anthropic,
    /// Google Gemini (AI Studio, Vertex).
    Gemini,
}

impl Dialect {
    pub fn as_str(self) -> &'static str {
        match self {
            Dialect::Openai => "openai",
            Dialect::Anthropic => "anthropic",
            Dialect::Gemini => "gemini",
        }
    }

    pub fn parse(s: &str) -> Option<Dialect> {
        match s {
            "openai" => Some(Dialect::Openai),
            "anthropic" => Some(Dialect::Anthropic),
            "gemini" => Some(Dialect::Gemini),
            _ => None,
        }
    }
}

/// A prompt-cache breakpoint's lifetime.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CacheTtl {
    /// Five minutes (Anthropic's default `ephemeral`).
    #[default]
    FiveMinutes,
    OneHour,
}

impl CacheTtl {
    pub fn as_str(self) -> &'static str {
        match self {
            CacheTtl::FiveMinutes => "5m",
            CacheTtl::OneHour => "1h",
        }
    }
}

/// Where a media part's bytes are.
#[derive(Debug, Clone, PartialEq)]
pub enum MediaSource {
    /// Passed on as a URL (Switchyard does not fetch it).
    Url(String),
    /// Inline bytes (base64 on every wire).
    Data(Bytes),
}

/// An image part.
#[derive(Debug, Clone, PartialEq)]
pub struct Image {
    pub source: MediaSource,
    /// image/jpeg, image/png, image/gif or image/webp; may be empty for a URL.
    pub media_type: String,
    /// OpenAI's `detail`.
    pub detail: Option<String>,
}

/// A document part (PDF, plain text).
#[derive(Debug, Clone, PartialEq)]
pub struct Document {
    pub source: MediaSource,
    pub media_type: String,
    pub title: Option<String>,
    pub filename: Option<String>,
}

/// Reasoning an upstream returned: opaque, bound to its dialect by the
/// signature; sent back unmodified in the assistant turn that made it.
#[derive(Debug, Clone, PartialEq, Default, serde::Serialize, serde::Deserialize)]
pub struct ReasoningBlock {
    pub text: String,
    pub signature: Option<String>,
    /// Anthropic `redacted_thinking.data`.
    pub redacted: Option<String>,
    pub dialect: Option<Dialect>,
}

/// What a part holds.
#[derive(Debug, Clone, PartialEq)]
pub enum PartKind {
    Text(String),
    Image(Image),
    Document(Document),
    Reasoning(ReasoningBlock),
}

/// One part of a message's content, with an optional cache breakpoint.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub kind: PartKind,
    pub cache: Option<CacheTtl>,
}

impl Part {
    pub fn text(text: impl Into<String>) -> Part {
        Part {
            kind: PartKind::Text(text.into()),
            cache: None,
        }
    }
}

/// One message of the conversation, provider-neutral.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatMessage {
    /// "system", "user", "assistant" or "tool".
    pub role: String,
    /// The text shorthand: the whole content when `parts` is empty.
    pub content: String,
    /// The content as parts (then `content` is empty): anything beyond one
    /// plain text, in order.
    pub parts: Vec<Part>,
    /// For role "tool": the call this message answers.
    pub tool_call_id: Option<String>,
    /// For role "assistant": calls the model made earlier.
    pub tool_calls: Vec<ToolCall>,
    /// For role "tool": the tool failed.
    pub is_error: bool,
    /// For role "tool": a cache breakpoint on the result as a whole.
    pub cache: Option<CacheTtl>,
}

impl ChatMessage {
    /// A message of plain text.
    pub fn text(role: &str, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }

    /// The message's text: `content`, or its text parts joined by newlines.
    pub fn text_content(&self) -> Cow<'_, str> {
        if self.parts.is_empty() {
            return Cow::Borrowed(&self.content);
        }
        let texts: Vec<&str> = self
            .parts
            .iter()
            .filter_map(|p| match &p.kind {
                PartKind::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        match texts.as_slice() {
            [one] => Cow::Borrowed(one),
            _ => Cow::Owned(texts.join("\n")),
        }
    }

    /// The content as parts: `parts`, or one text part for the shorthand
    /// (none for an empty one).
    pub fn content_parts(&self) -> Cow<'_, [Part]> {
        if !self.parts.is_empty() {
            Cow::Borrowed(&self.parts)
        } else if self.content.is_empty() {
            Cow::Owned(Vec::new())
        } else {
            Cow::Owned(vec![Part::text(self.content.clone())])
        }
    }

    /// Whether any part is of this kind.
    pub fn has(&self, pred: impl Fn(&PartKind) -> bool) -> bool {
        self.parts.iter().any(|p| pred(&p.kind))
    }

    /// Rough size of the content for estimates: text bytes, plus the bytes of
    /// inline media.
    pub fn content_bytes(&self) -> usize {
        if self.parts.is_empty() {
            return self.content.len();
        }
        self.parts
            .iter()
            .map(|p| match &p.kind {
                PartKind::Text(t) => t.len(),
                PartKind::Image(Image { source, .. })
                | PartKind::Document(Document { source, .. }) => match source {
                    MediaSource::Url(u) => u.len(),
                    MediaSource::Data(d) => d.len(),
                },
                PartKind::Reasoning(r) => {
                    r.text.len()
                        + r.signature.as_ref().map_or(0, String::len)
                        + r.redacted.as_ref().map_or(0, String::len)
                }
            })
            .sum()
    }
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
    /// A cache breakpoint on this definition.
    pub cache: Option<CacheTtl>,
    /// Fields a door did not model (bound to `ChatRequest::passthrough`'s dialect).
    pub extra: Option<Map<String, Value>>,
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

/// How much the model should reason before answering.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ReasoningAsk {
    /// "minimal", "low", "medium", "high", "xhigh" or "max".
    pub effort: Option<String>,
    pub budget_tokens: Option<u32>,
    /// The model decides (Anthropic adaptive thinking).
    pub adaptive: bool,
}

/// Structured output against a JSON Schema.
#[derive(Debug, Clone, PartialEq)]
pub struct JsonSchema {
    pub name: String,
    pub schema: Value,
    pub strict: bool,
    pub description: Option<String>,
}

/// What a door did not model: for upstreams of its dialect only.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Passthrough {
    pub dialect: Option<Dialect>,
    /// Top-level body fields, merged into the upstream body (never over a
    /// field the adapter set).
    pub fields: Map<String, Value>,
    /// Headers to forward, lower-case names.
    pub headers: Vec<(String, String)>,
    /// What the door took but neither models nor forwards: reported by
    /// every adapter.
    pub dropped: Vec<String>,
}

/// A normalised chat request, ready for an adapter to put on the wire.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct ChatRequest {
    /// The provider's model name, shared with the plan's candidate (an
    /// attempt names its model without a copy).
    pub model: Arc<str>,
    /// Shared: every attempt's copy of the request points at the caller's
    /// messages (a prompt is not copied per request or per attempt); a
    /// continuation gives its attempts a new list.
    pub messages: Arc<Vec<ChatMessage>>,
    pub max_tokens: Option<u32>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub stop: Vec<String>,
    /// Shared like the messages: an agent's dozens of tool schemas are not
    /// copied per request or per attempt. No tools is the empty slice,
    /// which allocates nothing.
    pub tools: Arc<[ToolSpec]>,
    pub tool_choice: ToolChoice,
    /// The route's upstream service tier, for providers that take it.
    pub service_tier: Option<String>,
    /// Ask for a JSON object response.
    pub json_mode: bool,
    /// Ask for JSON valid against a schema.
    pub json_schema: Option<JsonSchema>,
    /// Ask for reasoning before the answer.
    pub reasoning: Option<ReasoningAsk>,
    /// What the door did not model (shared: it is the same for every attempt).
    pub passthrough: Option<Arc<Passthrough>>,
    /// Stream the response (SSE). When false the adapter uses the non-streaming endpoint.
    pub stream: bool,
}

impl ChatRequest {
    /// The passthrough, if it belongs to `dialect`.
    pub fn passthrough_for(&self, dialect: Dialect) -> Option<&Passthrough> {
        self.passthrough
            .as_deref()
            .filter(|p| p.dialect == Some(dialect))
    }

    /// The longest TTL of any cache breakpoint in the request, including
    /// an Anthropic top-level `cache_control` passed through (automatic
    /// caching); `None` when nothing is marked.
    pub fn longest_cache_ttl(&self) -> Option<CacheTtl> {
        let marked = self
            .tools
            .iter()
            .map(|t| t.cache)
            .chain(
                self.messages
                    .iter()
                    .flat_map(|m| std::iter::once(m.cache).chain(m.parts.iter().map(|p| p.cache))),
            )
            .flatten();
        let automatic = self
            .passthrough_for(Dialect::Anthropic)
            .and_then(|p| p.fields.get("cache_control"))
            .map(|c| match c.get("ttl").and_then(Value::as_str) {
                Some("1h") => CacheTtl::OneHour,
                _ => CacheTtl::FiveMinutes,
            });
        marked.chain(automatic).max_by_key(|t| match t {
            CacheTtl::FiveMinutes => 0,
            CacheTtl::OneHour => 1,
        })
    }

    /// Any cache breakpoint anywhere in the request.
    pub fn has_cache_markers(&self) -> bool {
        self.tools.iter().any(|t| t.cache.is_some())
            || self
                .messages
                .iter()
                .any(|m| m.cache.is_some() || m.parts.iter().any(|p| p.cache.is_some()))
    }
}

/// A piece of output to forward to the caller as soon as it arrives.
///
/// Its rarer kinds are boxed: a chunk is in every slot of every open
/// stream's channel (40 bytes instead of 80). Serialized the same as the
/// struct variants they replace, so stored answers read back.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub enum Chunk {
    /// Text, held inline up to 24 bytes (a token almost always is): no
    /// allocation from the upstream's decoder to the caller's frame.
    Text(compact_str::CompactString),
    /// A fragment of a tool call; fragments with one `index` belong together.
    ToolCall(Box<ToolCallDelta>),
    /// Reasoning text as it streams; the block's signature comes in a chunk
    /// of its own (empty text) right before the block ends, and `redacted`
    /// data arrives whole.
    Reasoning(Box<ReasoningDelta>),
}

/// A fragment of a tool call ([`Chunk::ToolCall`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ToolCallDelta {
    pub index: u32,
    pub id: Option<String>,
    pub name: Option<String>,
    pub arguments: String,
}

/// A piece of a reasoning block ([`Chunk::Reasoning`]).
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ReasoningDelta {
    pub text: String,
    pub signature: Option<String>,
    pub redacted: Option<String>,
}

impl Chunk {
    /// Bytes of output it carries (bounds and estimates).
    pub fn output_bytes(&self) -> usize {
        match self {
            Chunk::Text(t) => t.len(),
            Chunk::ToolCall(t) => t.arguments.len(),
            Chunk::Reasoning(r) => {
                r.text.len()
                    + r.signature.as_ref().map_or(0, String::len)
                    + r.redacted.as_ref().map_or(0, String::len)
            }
        }
    }
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

/// Token usage reported by the upstream, normalised: `input_tokens` is the
/// input neither read from nor written to a prompt cache (Anthropic's
/// `input_tokens`; OpenAI's `prompt_tokens` less its cached part), and
/// `output_tokens` includes `reasoning_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub struct Usage {
    pub input_tokens: u32,
    pub output_tokens: u32,
    #[serde(default)]
    pub cache_read_input_tokens: u32,
    /// Written to a prompt cache, both TTLs.
    #[serde(default)]
    pub cache_write_input_tokens: u32,
    /// The part of `cache_write_input_tokens` written with the 1 h TTL.
    #[serde(default)]
    pub cache_write_1h_input_tokens: u32,
    #[serde(default)]
    pub reasoning_tokens: u32,
}

impl Usage {
    /// Plain input and output, nothing cached and no reasoning.
    pub fn plain(input_tokens: u32, output_tokens: u32) -> Usage {
        Usage {
            input_tokens,
            output_tokens,
            ..Usage::default()
        }
    }

    /// Every input token, cached or not.
    pub fn total_input(&self) -> u32 {
        self.input_tokens
            .saturating_add(self.cache_read_input_tokens)
            .saturating_add(self.cache_write_input_tokens)
    }
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
    /// The answer's reasoning blocks, whole, with their signatures.
    pub reasoning: Vec<ReasoningBlock>,
}

/// What a request needs from a target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    pub tools: bool,
    pub json: bool,
    pub vision: bool,
    /// Documents (PDF).
    pub pdf: bool,
    pub reasoning: bool,
    pub json_schema: bool,
    pub min_context_tokens: u32,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod chunk_tests {
    use super::{Chunk, ReasoningDelta, ToolCallDelta};

    /// Journals and idempotency records written before tool calls and
    /// reasoning were boxed read back, and the other way round: the JSON
    /// is that of the struct variants they replaced.
    #[test]
    fn boxed_chunks_keep_the_stored_json_of_struct_variants() {
        let call = Chunk::ToolCall(Box::new(ToolCallDelta {
            index: 2,
            id: Some("c1".into()),
            name: None,
            arguments: "{}".into(),
        }));
        let stored = r#"{"ToolCall":{"index":2,"id":"c1","name":null,"arguments":"{}"}}"#;
        assert_eq!(serde_json::to_string(&call).unwrap(), stored);
        assert_eq!(serde_json::from_str::<Chunk>(stored).unwrap(), call);
        let thought = Chunk::Reasoning(Box::new(ReasoningDelta {
            text: "hm".into(),
            signature: Some("sig".into()),
            redacted: None,
        }));
        let stored = r#"{"Reasoning":{"text":"hm","signature":"sig","redacted":null}}"#;
        assert_eq!(serde_json::to_string(&thought).unwrap(), stored);
        assert_eq!(serde_json::from_str::<Chunk>(stored).unwrap(), thought);
        assert!(std::mem::size_of::<Chunk>() <= 32);
    }
}
