//! OpenAI Chat Completions adapter, also used for vLLM, llama.cpp and Ollama:
//! its `Wire`, request body, auth headers, and a strict decoder that enforces
//! the completion predicate (reference A.1) and the compat-server
//! normalisation rules (A.4 a-g).
//! Pure functions over values and bytes: no I/O, and the API key is never logged
//! or kept anywhere but the sensitive header value handed back.

use std::collections::BTreeMap;

use http::header::AUTHORIZATION;
use http::{HeaderMap, HeaderValue};
use serde_json::{Map, Value};

use crate::policy::outcome::{Failure, OutcomeClass};
use crate::upstream::classify::{classify_error_object, in_body};
pub use crate::upstream::openai_body::{body_bytes, build_body};
use crate::upstream::sse::SseEvent;
use crate::upstream::wire::{Auth, Call, Quirks, Wire, WireRequest};
use crate::upstream::{Chunk, Completion, Dialect, Dropped, FinishReason, StreamDecoder, Usage};

/// OpenAI Chat Completions (`kind = "openai"`; vLLM, llama.cpp, Ollama).
pub struct OpenAiWire;

/// The `openai` kind's wire.
pub static WIRE: OpenAiWire = OpenAiWire;

impl Wire for OpenAiWire {
    fn name(&self) -> &'static str {
        "openai"
    }

    fn dialect(&self) -> Dialect {
        Dialect::Openai
    }

    fn quirks(&self) -> Quirks {
        Quirks {
            auth: Auth::ApiKey { required: false },
            api_version: false,
            always_streamed: false,
            embeddings: true,
            service_tiers: &["auto", "default", "flex", "priority"],
        }
    }

    fn request(&self, call: &Call<'_>, dropped: &mut Dropped) -> Result<WireRequest, Failure> {
        Ok(WireRequest::json_bytes(
            call.endpoint.fixed_url(endpoint),
            auth_headers(call.key),
            body_bytes(call.chat, dropped),
        ))
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(OpenAiDecoder::new())
    }

    fn decode_whole(&self, body: &[u8]) -> Result<(Vec<Chunk>, Completion), Failure> {
        decode_non_streaming(body)
    }
}

/// The chat completions URL under `base_url` (e.g. `https://api.openai.com/v1`).
pub fn endpoint(base_url: &str) -> String {
    [base_url.trim_end_matches('/'), "/chat/completions"].concat()
}

/// OpenAI's `reasoning_effort` for a reasoning ask: the effort as asked, or
/// one from a token budget; adaptive thinking leaves the model's default.
pub(crate) fn effort_of(r: &crate::chat::ReasoningAsk) -> Option<String> {
    if let Some(e) = &r.effort {
        return Some(e.clone());
    }
    let budget = r.budget_tokens?;
    Some(
        match budget {
            0..=2048 => "low",
            2049..=8192 => "medium",
            _ => "high",
        }
        .to_string(),
    )
}

/// Copies `extra`'s fields into `into` where `into` has none of that name:
/// a door's unmodelled fields never override what the adapter set.
pub(crate) fn merge_absent(into: &mut Map<String, Value>, extra: &Map<String, Value>) {
    for (k, v) in extra {
        if !into.contains_key(k) {
            into.insert(k.clone(), v.clone());
        }
    }
}

/// `data:<media type>;base64,<data>`.
pub(crate) fn data_url(media_type: &str, data: &[u8]) -> String {
    use base64::Engine;
    format!(
        "data:{media_type};base64,{}",
        base64::engine::general_purpose::STANDARD.encode(data)
    )
}

/// An `f32` as the JSON number a human wrote (`0.7`, not `0.699999988`); `None` if not finite.
pub(crate) fn f32_json(x: f32) -> Option<Value> {
    let shortest: f64 = x.to_string().parse().ok()?;
    serde_json::Number::from_f64(shortest).map(Value::Number)
}

/// `Authorization: Bearer <key>`, marked sensitive. No key (or one that is not a
/// valid header value) gives no header: the upstream answers 401 and the attempt
/// is classified `Auth`.
pub fn auth_headers(api_key: Option<&str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(key) = api_key.filter(|k| !k.is_empty()) {
        if let Ok(mut value) = HeaderValue::from_str(&format!("Bearer {key}")) {
            value.set_sensitive(true);
            headers.insert(AUTHORIZATION, value);
        }
    }
    headers
}

/// Streaming decoder for `chat.completion.chunk` frames.
///
/// Choices made where the reference leaves room:
/// - a missing usage chunk (even when requested) is accepted with `usage: None`;
///   the router estimates usage and flags it;
/// - `delta.refusal` text is forwarded as text and a `stop` finish becomes `Refusal`;
/// - finish reason `error` is `ServerError` (retryable); `abort`, `repetition` and
///   any other unknown reason are `Protocol` with `should_retry = Some(false)`;
/// - `[DONE]` with no output and no finish reason (vLLM PR #40986) is `ServerError`;
/// - frames after `[DONE]` are ignored, except a non-standard `error:` field.
#[derive(Debug, Default)]
pub struct OpenAiDecoder {
    /// `data: [DONE]` arrived.
    done: bool,
    /// The one choice (index 0; any other is refused), once seen, with its
    /// finish reason once one arrived.
    choice: Option<Option<FinishReason>>,
    /// Accumulated `function.arguments` per tool-call index.
    tool_args: BTreeMap<u32, String>,
    /// Some text or tool-call fragment was emitted.
    produced: bool,
    /// A `delta.refusal` fragment was seen.
    refusal: bool,
    /// The last usage object seen (the usage chunk, or continuous usage stats).
    usage: Option<Usage>,
    /// The `service_tier` the chunks reported.
    service_tier: Option<String>,
    /// Compatible servers' reasoning text so far (`reasoning_content`):
    /// the answer's one unsigned reasoning block.
    reasoning: String,
    /// The failure that ended the stream; repeated by later calls.
    failed: Option<Failure>,
    /// Tests: every frame through the general `Value` path.
    #[cfg(test)]
    general_only: bool,
}

impl OpenAiDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that never takes the common-shape path (for comparing both).
    #[cfg(test)]
    pub(crate) fn general_only() -> Self {
        Self {
            general_only: true,
            ..Self::default()
        }
    }

    /// The common-shape reading of `data`, unless a test turned it off.
    fn fast<'a>(&self, data: &'a str) -> Option<super::openai_frame::Frame<'a>> {
        #[cfg(test)]
        if self.general_only {
            return None;
        }
        super::openai_frame::parse(data)
    }

    fn handle(&mut self, ev: &SseEvent, out: &mut Vec<Chunk>) -> Result<(), Failure> {
        if let Some(raw) = &ev.error {
            return Err(error_field_failure(raw));
        }
        if self.done {
            return Ok(());
        }
        let data = ev.data.trim();
        if ev.event.as_deref() == Some("error") {
            return Err(error_field_failure(data));
        }
        if data.starts_with("[DONE]") {
            self.done = true;
            return Ok(());
        }
        if data.is_empty() {
            return Ok(());
        }
        if let Some(frame) = self.fast(data) {
            return self.on_frame(frame, out);
        }
        let v: Value = serde_json::from_str(data)
            .map_err(|_| in_body(OutcomeClass::Protocol, "malformed JSON in stream frame"))?;
        if !v.is_object() {
            return Err(in_body(
                OutcomeClass::Protocol,
                "stream frame is not a JSON object",
            ));
        }
        if is_error_object(&v) {
            return Err(classify_error_object(&v, Some(200)));
        }
        if let Some(u) = parse_usage(v.get("usage")) {
            self.usage = Some(u);
        }
        if let Some(t) = v.get("service_tier").and_then(Value::as_str) {
            self.set_tier(t);
        }
        match v.get("choices") {
            Some(Value::Array(choices)) => choices.iter().try_for_each(|c| self.on_choice(c, out)),
            None | Some(Value::Null) => Ok(()),
            Some(_) => Err(in_body(OutcomeClass::Protocol, "`choices` is not an array")),
        }
    }

    /// A frame in the common shape: the same steps as the general path.
    fn on_frame(
        &mut self,
        frame: super::openai_frame::Frame<'_>,
        out: &mut Vec<Chunk>,
    ) -> Result<(), Failure> {
        if let Some(u) = frame.usage {
            self.usage = Some(u.normalised());
        }
        if let Some(t) = &frame.service_tier {
            self.set_tier(t);
        }
        for c in &frame.choices {
            self.begin_choice(c.index)?;
            self.on_text(c.content.as_deref(), c.refusal.as_deref(), out);
            self.end_choice(c.index, c.finish_reason.as_deref())?;
        }
        Ok(())
    }

    /// Keeps a bounded `service_tier`, allocating only when it changes.
    fn set_tier(&mut self, t: &str) {
        if tier_ok(t) && self.service_tier.as_deref() != Some(t) {
            self.service_tier = Some(t.to_string());
        }
    }

    fn begin_choice(&mut self, index: u32) -> Result<(), Failure> {
        if index != 0 {
            // Switchyard asks for one choice; a second one would be merged
            // into the first answer, so it is a protocol error, not output.
            return Err(in_body(
                OutcomeClass::Protocol,
                format!(
                    "stream carries choice index {index}; only one choice (n = 1) was asked for"
                ),
            ));
        }
        self.choice.get_or_insert(None);
        Ok(())
    }

    fn end_choice(&mut self, index: u32, reason: Option<&str>) -> Result<(), Failure> {
        if let Some(reason) = reason.filter(|r| !r.is_empty()) {
            debug_assert_eq!(index, 0, "begin_choice refuses any other");
            self.choice = Some(Some(map_finish_reason(reason)?));
        }
        Ok(())
    }

    fn on_choice(&mut self, c: &Value, out: &mut Vec<Chunk>) -> Result<(), Failure> {
        let index = u32_field(c, "index").unwrap_or(0);
        self.begin_choice(index)?;
        if let Some(delta) = c.get("delta") {
            self.on_delta(delta, out);
        }
        self.end_choice(index, c.get("finish_reason").and_then(Value::as_str))
    }

    /// Content, then refusal text (which marks the answer a refusal).
    fn on_text(&mut self, content: Option<&str>, refusal: Option<&str>, out: &mut Vec<Chunk>) {
        if let Some(text) = content.filter(|t| !t.is_empty()) {
            self.push_text(text, out);
        }
        if let Some(text) = refusal.filter(|t| !t.is_empty()) {
            self.refusal = true;
            self.push_text(text, out);
        }
    }

    fn on_delta(&mut self, delta: &Value, out: &mut Vec<Chunk>) {
        let reasoning =
            non_empty_str(delta, "reasoning_content").or_else(|| non_empty_str(delta, "reasoning"));
        if let Some(text) = reasoning {
            self.reasoning.push_str(text);
            out.push(Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
                text: text.to_owned(),
                signature: None,
                redacted: None,
            })));
        }
        self.on_text(
            non_empty_str(delta, "content"),
            non_empty_str(delta, "refusal"),
            out,
        );
        if let Some(calls) = delta.get("tool_calls").and_then(Value::as_array) {
            for (pos, call) in calls.iter().enumerate() {
                let index = u32_field(call, "index").unwrap_or(pos_u32(pos));
                self.on_tool_fragment(index, call.get("id"), call.get("function"), out);
            }
        }
        if let Some(call) = delta.get("function_call").filter(|f| f.is_object()) {
            self.on_tool_fragment(0, None, Some(call), out);
        }
    }

    fn push_text(&mut self, text: &str, out: &mut Vec<Chunk>) {
        self.produced = true;
        out.push(Chunk::Text(text.into()));
    }

    fn on_tool_fragment(
        &mut self,
        index: u32,
        id: Option<&Value>,
        function: Option<&Value>,
        out: &mut Vec<Chunk>,
    ) {
        let id = id.and_then(Value::as_str).map(str::to_owned);
        let name = function
            .and_then(|f| f.get("name"))
            .and_then(Value::as_str)
            .map(str::to_owned);
        let arguments = function
            .and_then(|f| f.get("arguments"))
            .map(arguments_text)
            .unwrap_or_default();
        if id.is_none() && name.is_none() && arguments.is_empty() {
            return;
        }
        self.tool_args
            .entry(index)
            .or_default()
            .push_str(&arguments);
        self.produced = true;
        out.push(Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
            index,
            id,
            name,
            arguments,
        })));
    }
}

impl StreamDecoder for OpenAiDecoder {
    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<Chunk>) -> Result<(), Failure> {
        if let Some(f) = &self.failed {
            return Err(f.clone());
        }
        let result = self.handle(event, out);
        if let Err(f) = &result {
            self.failed = Some(f.clone());
        }
        result
    }

    fn finish(&mut self) -> Result<Completion, Failure> {
        if let Some(f) = &self.failed {
            return Err(f.clone());
        }
        if !self.done {
            return Err(in_body(
                OutcomeClass::Truncated,
                "stream ended without [DONE]",
            ));
        }
        if !self.produced && self.choice.flatten().is_none() {
            return Err(in_body(
                OutcomeClass::ServerError,
                "upstream sent [DONE] without any output or finish_reason",
            ));
        }
        let reason = match self.choice {
            Some(Some(reason)) => reason,
            Some(None) => {
                return Err(in_body(
                    OutcomeClass::Truncated,
                    "choice 0 ended without finish_reason",
                ))
            }
            None => FinishReason::Stop,
        };
        let args = self.tool_args.values().map(String::as_str);
        let finish_reason = settle(reason, self.refusal, args)?;
        Ok(Completion {
            finish_reason,
            usage: self.usage,
            service_tier: self.service_tier.take(),
            reasoning: reasoning_blocks(std::mem::take(&mut self.reasoning)),
        })
    }
}

/// Compatible servers' reasoning text as the answer's one reasoning block:
/// unsigned (nothing to send back; the OpenAI wire takes none).
fn reasoning_blocks(text: String) -> Vec<crate::chat::ReasoningBlock> {
    if text.is_empty() {
        return Vec::new();
    }
    vec![crate::chat::ReasoningBlock {
        text,
        signature: None,
        redacted: None,
        dialect: Some(Dialect::Openai),
    }]
}

/// A `service_tier` string field, bounded (it is passed on).
pub(crate) fn tier_field(v: &Value) -> Option<String> {
    v.get("service_tier")
        .and_then(Value::as_str)
        .filter(|t| tier_ok(t))
        .map(str::to_string)
}

/// A tier worth passing on: short, printable ASCII.
fn tier_ok(t: &str) -> bool {
    !t.is_empty() && t.len() <= 32 && t.chars().all(|c| c.is_ascii_graphic())
}

/// Final checks shared by the streaming and non-streaming paths: tool-call
/// arguments must parse as JSON, and refusal text turns a `stop` into `Refusal`.
fn settle<'a>(
    reason: FinishReason,
    refusal: bool,
    mut tool_args: impl ExactSizeIterator<Item = &'a str>,
) -> Result<FinishReason, Failure> {
    if reason == FinishReason::ToolCalls {
        if tool_args.len() == 0 {
            return Err(in_body(
                OutcomeClass::Protocol,
                "finish_reason tool_calls without a tool call",
            ));
        }
        if tool_args.any(|a| serde_json::from_str::<Value>(a).is_err()) {
            return Err(in_body(
                OutcomeClass::Truncated,
                "tool call arguments are not complete JSON",
            ));
        }
    }
    Ok(if refusal && reason == FinishReason::Stop {
        FinishReason::Refusal
    } else {
        reason
    })
}

/// Maps a finish reason; anything outside the documented set is a failure.
fn map_finish_reason(reason: &str) -> Result<FinishReason, Failure> {
    match reason {
        "stop" => Ok(FinishReason::Stop),
        "length" => Ok(FinishReason::Length),
        "tool_calls" | "function_call" => Ok(FinishReason::ToolCalls),
        "content_filter" => Ok(FinishReason::ContentFilter),
        "error" => Err(in_body(
            OutcomeClass::ServerError,
            "upstream finished with finish_reason error",
        )),
        other => {
            let label: String = other
                .chars()
                .filter(char::is_ascii_alphanumeric)
                .take(32)
                .collect();
            Err(Failure {
                should_retry: Some(false),
                ..in_body(
                    OutcomeClass::Protocol,
                    format!("abnormal finish_reason {label}"),
                )
            })
        }
    }
}

/// A truthy `error` key (not null, false, "" or {}), or a flat `{"object":"error"}`.
fn is_error_object(v: &Value) -> bool {
    let truthy = match v.get("error") {
        None | Some(Value::Null) | Some(Value::Bool(false)) => false,
        Some(Value::String(s)) => !s.is_empty(),
        Some(Value::Object(o)) => !o.is_empty(),
        Some(_) => true,
    };
    truthy || v.get("object").and_then(Value::as_str) == Some("error")
}

/// A non-standard `error:` field or `event: error` payload (llama.cpp legacy).
fn error_field_failure(raw: &str) -> Failure {
    match serde_json::from_str::<Value>(raw) {
        Ok(v) => classify_error_object(&v, Some(200)),
        Err(_) => in_body(
            OutcomeClass::ServerError,
            "upstream sent a non-JSON error field",
        ),
    }
}

/// Usage, normalised: OpenAI counts cached (and cache-written) tokens inside
/// `prompt_tokens` and reasoning inside `completion_tokens`; Switchyard's
/// `input_tokens` is the uncached rest.
pub(crate) fn parse_usage(v: Option<&Value>) -> Option<Usage> {
    let u = v.filter(|u| u.is_object())?;
    let count = |v: &Value, key: &str| v.get(key).and_then(Value::as_u64);
    let details = |a: &str, b: &str| u.get(a).or_else(|| u.get(b));
    let prompt = details("prompt_tokens_details", "input_tokens_details");
    let completion = details("completion_tokens_details", "output_tokens_details");
    Some(
        UsageCounts {
            prompt_tokens: count(u, "prompt_tokens").or_else(|| count(u, "input_tokens")),
            completion_tokens: count(u, "completion_tokens").or_else(|| count(u, "output_tokens")),
            cached_tokens: prompt.and_then(|d| count(d, "cached_tokens")),
            cache_write_tokens: prompt.and_then(|d| count(d, "cache_write_tokens")),
            reasoning_tokens: completion.and_then(|d| count(d, "reasoning_tokens")),
        }
        .normalised(),
    )
}

/// The counts an OpenAI `usage` object carries, as read (either spelling of
/// each; a count that is not a non-negative integer is absent).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UsageCounts {
    pub prompt_tokens: Option<u64>,
    pub completion_tokens: Option<u64>,
    pub cached_tokens: Option<u64>,
    pub cache_write_tokens: Option<u64>,
    pub reasoning_tokens: Option<u64>,
}

impl UsageCounts {
    /// Switchyard's [`Usage`]: cached, cache-written and reasoning tokens
    /// taken out of the totals that include them, each bounded by its total.
    pub(crate) fn normalised(self) -> Usage {
        let u32_of = |n: Option<u64>| n.map_or(0, |n| u32::try_from(n).unwrap_or(u32::MAX));
        let prompt = u32_of(self.prompt_tokens);
        let output = u32_of(self.completion_tokens);
        let read = u32_of(self.cached_tokens).min(prompt);
        let write = u32_of(self.cache_write_tokens).min(prompt - read);
        Usage {
            input_tokens: prompt - read - write,
            output_tokens: output,
            cache_read_input_tokens: read,
            cache_write_input_tokens: write,
            cache_write_1h_input_tokens: 0,
            reasoning_tokens: u32_of(self.reasoning_tokens).min(output),
        }
    }
}

/// `function.arguments` as text; some compat servers send an object instead of a string.
fn arguments_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

pub(crate) fn u32_field(v: &Value, key: &str) -> Option<u32> {
    let n = v.get(key)?.as_u64()?;
    Some(u32::try_from(n).unwrap_or(u32::MAX))
}

pub(crate) fn pos_u32(pos: usize) -> u32 {
    u32::try_from(pos).unwrap_or(u32::MAX)
}

fn non_empty_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key)?.as_str().filter(|s| !s.is_empty())
}

/// Decodes a non-streamed `chat.completion` body (status 200): in place
/// when it has the common shape (`openai_frame::parse_whole`), else through a
/// JSON tree; both readings decide alike (`fuzz`).
/// An empty, HTML or otherwise non-JSON body is `Protocol`; `{"error":..}` is
/// classified like a stream error frame.
pub fn decode_non_streaming(body: &[u8]) -> Result<(Vec<Chunk>, Completion), Failure> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(in_body(OutcomeClass::Protocol, "empty response body"));
    }
    match super::openai_frame::parse_whole(body) {
        Some(whole) => decode_common(whole),
        None => decode_general(body),
    }
}

/// A whole body in the common shape: text, refusal and reasoning, no tool calls.
fn decode_common(
    whole: super::openai_frame::Whole<'_>,
) -> Result<(Vec<Chunk>, Completion), Failure> {
    let choice = whole
        .choice
        .ok_or_else(|| in_body(OutcomeClass::Protocol, "response has no choices"))?;
    let message = choice
        .message
        .ok_or_else(|| in_body(OutcomeClass::Protocol, "choice has no message"))?;
    // An escaped string was already decoded into its own `String`: kept, not copied.
    let present = |t: Option<std::borrow::Cow<'_, str>>| -> Option<String> {
        t.filter(|t| !t.is_empty())
            .map(std::borrow::Cow::into_owned)
    };
    let reasoning = present(message.reasoning_content).or_else(|| present(message.reasoning));
    let refusal = present(message.refusal);
    let refused = refusal.is_some();
    let chunks = text_chunks(reasoning, present(message.content), refusal);
    conclude_whole(
        chunks,
        refused,
        &[],
        choice.finish_reason.as_deref(),
        whole.usage.map(UsageCounts::normalised),
        whole
            .service_tier
            .as_deref()
            .filter(|t| tier_ok(t))
            .map(str::to_string),
    )
}

/// Any other body, read as a JSON tree.
pub(super) fn decode_general(body: &[u8]) -> Result<(Vec<Chunk>, Completion), Failure> {
    let v: Value = serde_json::from_slice(body)
        .map_err(|_| in_body(OutcomeClass::Protocol, "response body is not JSON"))?;
    if !v.is_object() {
        return Err(in_body(
            OutcomeClass::Protocol,
            "response body is not a JSON object",
        ));
    }
    if is_error_object(&v) {
        return Err(classify_error_object(&v, Some(200)));
    }
    let choice = v
        .get("choices")
        .and_then(Value::as_array)
        .and_then(|c| c.first())
        .ok_or_else(|| in_body(OutcomeClass::Protocol, "response has no choices"))?;
    let message = choice
        .get("message")
        .ok_or_else(|| in_body(OutcomeClass::Protocol, "choice has no message"))?;
    let (chunks, refusal, args) = message_chunks(message);
    conclude_whole(
        chunks,
        refusal,
        &args,
        choice.get("finish_reason").and_then(Value::as_str),
        parse_usage(v.get("usage")),
        tier_field(&v),
    )
}

/// The end of a whole body, either reading: its finish reason checked and
/// settled, and what the completion reports.
fn conclude_whole(
    chunks: Vec<Chunk>,
    refusal: bool,
    tool_args: &[String],
    finish_reason: Option<&str>,
    usage: Option<Usage>,
    service_tier: Option<String>,
) -> Result<(Vec<Chunk>, Completion), Failure> {
    let reason = match finish_reason {
        Some(r) if !r.is_empty() => map_finish_reason(r)?,
        _ => {
            return Err(in_body(
                OutcomeClass::Truncated,
                "response has no finish_reason",
            ))
        }
    };
    let finish_reason = settle(reason, refusal, tool_args.iter().map(String::as_str))?;
    let reasoning = chunks
        .iter()
        .filter_map(|c| match c {
            Chunk::Reasoning(r) => Some(r.text.as_str()),
            _ => None,
        })
        .collect::<String>();
    Ok((
        chunks,
        Completion {
            finish_reason,
            usage,
            service_tier,
            reasoning: reasoning_blocks(reasoning),
        },
    ))
}

/// A whole message's text chunks: reasoning, then content, then refusal.
fn text_chunks(
    reasoning: Option<String>,
    content: Option<String>,
    refusal: Option<String>,
) -> Vec<Chunk> {
    let mut chunks = Vec::new();
    if let Some(text) = reasoning {
        chunks.push(Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
            text,
            signature: None,
            redacted: None,
        })));
    }
    chunks.extend(content.map(|t| Chunk::Text(t.into())));
    chunks.extend(refusal.map(|t| Chunk::Text(t.into())));
    chunks
}

/// Chunks of a complete assistant message, whether it held refusal text, and
/// each tool call's arguments.
fn message_chunks(message: &Value) -> (Vec<Chunk>, bool, Vec<String>) {
    let reasoning =
        non_empty_str(message, "reasoning_content").or_else(|| non_empty_str(message, "reasoning"));
    let refusal = non_empty_str(message, "refusal");
    let mut chunks = text_chunks(
        reasoning.map(str::to_owned),
        non_empty_str(message, "content").map(str::to_owned),
        refusal.map(str::to_owned),
    );
    let mut args = Vec::new();
    let calls = message.get("tool_calls").and_then(Value::as_array);
    for (pos, call) in calls.into_iter().flatten().enumerate() {
        let function = call.get("function");
        let arguments = function
            .and_then(|f| f.get("arguments"))
            .map(arguments_text)
            .unwrap_or_default();
        args.push(arguments.clone());
        chunks.push(Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
            index: pos_u32(pos),
            id: call.get("id").and_then(Value::as_str).map(str::to_owned),
            name: function
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .map(str::to_owned),
            arguments,
        })));
    }
    (chunks, refusal.is_some(), args)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::chat::ToolChoice;
    use crate::upstream::sse::transcript::{run_all, text_of};
    use crate::upstream::{ChatMessage, ChatRequest, ToolCall, ToolSpec};
    use serde_json::json;

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../../../tests/fixtures/transcripts/", $name))
        };
    }

    fn decode(text: &str) -> (Vec<Chunk>, Result<Completion, Failure>) {
        run_all(text, OpenAiDecoder::new)
    }

    fn class_of(text: &str) -> OutcomeClass {
        decode(text).1.unwrap_err().class
    }

    #[test]
    fn a_callers_spelling_and_unmodelled_fields_reach_its_own_wire_and_only_fields_are_dropped_elsewhere(
    ) {
        let mut fields = serde_json::Map::new();
        fields.insert("max_completion_tokens".into(), json!(4000));
        fields.insert("seed".into(), json!(7));
        fields.insert("prompt_cache_key".into(), json!("session-1"));
        let req = ChatRequest {
            model: "gpt-5".into(),
            messages: vec![ChatMessage::text("user", "hi")].into(),
            // The route's limit already cut the caller's 4000.
            max_tokens: Some(512),
            passthrough: Some(std::sync::Arc::new(crate::chat::Passthrough {
                dialect: Some(Dialect::Openai),
                fields,
                ..Default::default()
            })),
            ..Default::default()
        };
        let mut d = Dropped::default();
        let body = build_body(&req, &mut d);
        assert_eq!(
            body["max_completion_tokens"], 512,
            "the modelled value, the caller's name"
        );
        assert!(body.get("max_tokens").is_none(), "{body}");
        assert_eq!(body["seed"], 7);
        assert_eq!(body["prompt_cache_key"], "session-1");
        assert!(d.is_empty(), "{d:?}");
        // The bytes on the wire are that body, each name once: a
        // passthrough field the adapter wrote is not written again.
        let bytes = body_bytes(&req, &mut Dropped::default());
        let text = std::str::from_utf8(&bytes).unwrap();
        assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), body);
        assert_eq!(text.matches("max_completion_tokens").count(), 1, "{text}");
        assert_eq!(text.matches("\"seed\"").count(), 1, "{text}");
        let mut d = Dropped::default();
        let a = crate::upstream::anthropic::build_body(
            &req,
            crate::upstream::anthropic::Host::FirstParty,
            &mut d,
        );
        assert_eq!(a["max_tokens"], 512);
        assert!(a.get("seed").is_none() && a.get("max_completion_tokens").is_none());
        assert_eq!(
            d.names(),
            ["passthrough.prompt_cache_key", "passthrough.seed"]
        );
        let plain = ChatRequest {
            passthrough: None,
            ..req
        };
        let body = build_body(&plain, &mut Dropped::default());
        assert_eq!(
            body["max_tokens"], 512,
            "compatible servers keep max_tokens"
        );
    }

    #[test]
    fn compat_reasoning_text_is_the_answers_unsigned_reasoning_block() {
        let text = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"Let me \"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"think.\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"42\"},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        let (chunks, done) = decode(text);
        assert_eq!(chunks.len(), 3);
        let want = vec![crate::chat::ReasoningBlock {
            text: "Let me think.".into(),
            signature: None,
            redacted: None,
            dialect: Some(Dialect::Openai),
        }];
        assert_eq!(done.unwrap().reasoning, want);
        let body = br#"{"choices":[{"index":0,"message":{"content":"42","reasoning_content":"Let me think."},"finish_reason":"stop"}]}"#;
        assert_eq!(decode_non_streaming(body).unwrap().1.reasoning, want);
        let (_, plain) = decode_non_streaming(
            br#"{"choices":[{"index":0,"message":{"content":"42"},"finish_reason":"stop"}]}"#,
        )
        .unwrap();
        assert!(plain.reasoning.is_empty());
    }

    #[test]
    fn endpoint_trims_trailing_slash() {
        assert_eq!(
            endpoint("https://api.openai.com/v1/"),
            "https://api.openai.com/v1/chat/completions"
        );
        assert_eq!(
            endpoint("http://h:8000/v1"),
            "http://h:8000/v1/chat/completions"
        );
    }

    #[test]
    fn body_has_every_field() {
        let req = ChatRequest {
            model: "gpt-4o-mini".into(),
            messages: vec![
                ChatMessage {
                    role: "system".into(),
                    content: "be brief".into(),
                    ..Default::default()
                },
                ChatMessage {
                    role: "user".into(),
                    content: "weather?".into(),
                    ..Default::default()
                },
                ChatMessage {
                    role: "assistant".into(),
                    tool_calls: vec![ToolCall {
                        id: "call_1".into(),
                        name: "f".into(),
                        arguments: "{\"a\":1}".into(),
                    }],
                    ..Default::default()
                },
                ChatMessage {
                    role: "tool".into(),
                    content: "sunny".into(),
                    tool_call_id: Some("call_1".into()),
                    ..Default::default()
                },
            ]
            .into(),
            max_tokens: Some(64),
            temperature: Some(0.7),
            top_p: Some(0.9),
            stop: vec!["END".into()],
            tools: vec![ToolSpec {
                name: "f".into(),
                description: "get weather".into(),
                parameters: json!({"type": "object"}),
                cache: None,
                extra: None,
            }]
            .into(),
            tool_choice: ToolChoice::Tool("f".into()),
            service_tier: Some("flex".into()),
            json_mode: true,
            stream: true,
            ..Default::default()
        };
        let want = json!({
            "model": "gpt-4o-mini",
            "messages": [
                {"role": "system", "content": "be brief"},
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": null, "tool_calls": [
                    {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\":1}"}}]},
                {"role": "tool", "content": "sunny", "tool_call_id": "call_1"}
            ],
            "max_tokens": 64,
            "temperature": 0.7,
            "top_p": 0.9,
            "stop": ["END"],
            "tools": [{"type": "function", "function": {
                "name": "f", "description": "get weather", "parameters": {"type": "object"}}}],
            "tool_choice": {"type": "function", "function": {"name": "f"}},
            "response_format": {"type": "json_object"},
            "service_tier": "flex",
            "stream": true,
            "stream_options": {"include_usage": true}
        });
        assert_eq!(build_body(&req, &mut Dropped::default()), want);
        let bytes = body_bytes(&req, &mut Dropped::default());
        assert_eq!(serde_json::from_slice::<Value>(&bytes).unwrap(), want);
    }

    #[test]
    fn minimal_body_omits_optional_fields() {
        let req = ChatRequest {
            model: "m".into(),
            ..Default::default()
        };
        assert_eq!(
            build_body(&req, &mut Dropped::default()),
            json!({"model": "m", "messages": []})
        );
    }

    #[test]
    fn auth_header_is_bearer_and_sensitive() {
        let h = auth_headers(Some("sk-test"));
        let v = h.get(AUTHORIZATION).unwrap();
        assert_eq!(v.to_str().unwrap(), "Bearer sk-test");
        assert!(v.is_sensitive());
        assert!(auth_headers(None).is_empty());
        assert!(auth_headers(Some("bad\nkey")).is_empty());
    }

    #[test]
    fn text_stream_completes_with_usage() {
        let (chunks, done) = decode(fixture!("openai_text.sse"));
        assert_eq!(
            chunks,
            vec![Chunk::Text("Hello".into()), Chunk::Text(" world".into())]
        );
        let done = done.unwrap();
        assert_eq!(done.finish_reason, FinishReason::Stop);
        assert_eq!(
            done.usage,
            Some(Usage {
                input_tokens: 24,
                output_tokens: 2,
                ..Default::default()
            })
        );
    }

    #[test]
    fn crlf_fixture_decodes_like_lf() {
        assert_eq!(
            decode(fixture!("openai_text_crlf.sse")),
            decode(fixture!("openai_text.sse"))
        );
    }

    #[test]
    fn tool_call_fragments_by_index() {
        let (chunks, done) = decode(fixture!("openai_tool_calls.sse"));
        let done = done.unwrap();
        assert_eq!(done.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            done.usage,
            Some(Usage {
                input_tokens: 24,
                output_tokens: 58,
                ..Default::default()
            })
        );
        let frag = |index, id: Option<&str>, name: Option<&str>, args: &str| {
            Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
                index,
                id: id.map(Into::into),
                name: name.map(Into::into),
                arguments: args.into(),
            }))
        };
        assert_eq!(
            chunks,
            vec![
                frag(0, Some("call_1"), Some("get_weather"), ""),
                frag(0, None, None, "{\"city\":"),
                frag(0, None, None, "\"Paris\"}"),
                frag(1, Some("call_2"), Some("get_time"), "{\"tz\":"),
                frag(1, None, None, "\"CET\"}"),
            ]
        );
    }

    #[test]
    fn missing_usage_chunk_is_accepted_without_usage() {
        let (chunks, done) = decode(fixture!("openai_usage_missing.sse"));
        assert_eq!(text_of(&chunks), "Hi there");
        let done = done.unwrap();
        assert_eq!(done.finish_reason, FinishReason::Stop);
        assert_eq!(done.usage, None);
    }

    #[test]
    fn vllm_error_frame_fails_even_though_done_follows() {
        let (chunks, end) = decode(fixture!("openai_error_then_done_vllm.sse"));
        assert_eq!(text_of(&chunks), "The answer");
        let f = end.unwrap_err();
        assert_eq!(f.class, OutcomeClass::ServerError);
        assert_eq!(f.http_status, Some(200));
    }

    #[test]
    fn vllm_done_only_is_a_server_error() {
        let (chunks, end) = decode(fixture!("openai_done_only_vllm.sse"));
        assert!(chunks.is_empty());
        assert_eq!(end.unwrap_err().class, OutcomeClass::ServerError);
    }

    #[test]
    fn role_only_delta_then_done_is_a_server_error() {
        let text = "data: {\"id\":\"x\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}]}\n\ndata: [DONE]\n\n";
        assert_eq!(class_of(text), OutcomeClass::ServerError);
    }

    #[test]
    fn llamacpp_legacy_error_field_is_invalid() {
        let (chunks, end) = decode(fixture!("llamacpp_legacy_error.sse"));
        assert!(chunks.is_empty());
        let f = end.unwrap_err();
        assert_eq!(f.class, OutcomeClass::Invalid);
        assert!(f.message.contains("context size"), "{}", f.message);
    }

    #[test]
    fn llamacpp_new_error_frame_is_invalid() {
        assert_eq!(
            class_of(fixture!("llamacpp_error_frame.sse")),
            OutcomeClass::Invalid
        );
    }

    #[test]
    fn llamacpp_done_without_blank_line_completes() {
        let (chunks, done) = decode(fixture!("llamacpp_done_no_blank_line.sse"));
        assert_eq!(text_of(&chunks), "ok");
        assert_eq!(done.unwrap().finish_reason, FinishReason::Stop);
    }

    #[test]
    fn ollama_empty_delta_then_eof_is_truncated() {
        let (chunks, end) = decode(fixture!("ollama_truncated.sse"));
        assert_eq!(text_of(&chunks), "Once upon");
        assert_eq!(end.unwrap_err().class, OutcomeClass::Truncated);
    }

    #[test]
    fn eof_without_done_is_truncated() {
        assert_eq!(
            class_of(fixture!("openai_no_done.sse")),
            OutcomeClass::Truncated
        );
    }

    #[test]
    fn done_without_finish_reason_is_truncated() {
        let text = "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\ndata: [DONE]\n\n";
        assert_eq!(class_of(text), OutcomeClass::Truncated);
    }

    #[test]
    fn a_second_choice_is_a_protocol_error_not_merged_output() {
        let text = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":1,\"delta\":{\"content\":\"b\"},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        let (chunks, end) = decode(text);
        assert_eq!(text_of(&chunks), "a", "choice 1's text is never forwarded");
        assert_eq!(end.unwrap_err().class, OutcomeClass::Protocol);
    }

    #[test]
    fn truncated_tool_arguments_are_truncated() {
        let (chunks, end) = decode(fixture!("openai_truncated_tool_args.sse"));
        assert_eq!(chunks.len(), 2);
        assert_eq!(end.unwrap_err().class, OutcomeClass::Truncated);
    }

    #[test]
    fn malformed_json_frame_is_protocol() {
        let (chunks, end) = decode(fixture!("openai_malformed.sse"));
        assert_eq!(text_of(&chunks), "Hel");
        assert_eq!(end.unwrap_err().class, OutcomeClass::Protocol);
    }

    #[test]
    fn content_filter_finishes_as_content_filter() {
        let (chunks, done) = decode(fixture!("openai_content_filter.sse"));
        assert_eq!(text_of(&chunks), "Here is");
        assert_eq!(done.unwrap().finish_reason, FinishReason::ContentFilter);
    }

    #[test]
    fn refusal_text_is_forwarded_and_finishes_as_refusal() {
        let (chunks, done) = decode(fixture!("openai_refusal.sse"));
        assert_eq!(text_of(&chunks), "I'm sorry, I can't help with that.");
        assert_eq!(done.unwrap().finish_reason, FinishReason::Refusal);
    }

    #[test]
    fn vllm_finish_reason_error_is_retryable_server_error() {
        let f = decode(fixture!("openai_finish_error_vllm.sse"))
            .1
            .unwrap_err();
        assert_eq!(f.class, OutcomeClass::ServerError);
        assert!(f.retry_same_target());
    }

    #[test]
    fn other_unknown_finish_reasons_are_abnormal_and_not_retried_here() {
        for reason in ["abort", "repetition", "eos_token"] {
            let text = format!(
                "data: {{\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"a\"}},\"finish_reason\":\"{reason}\"}}]}}\n\ndata: [DONE]\n\n"
            );
            let f = decode(&text).1.unwrap_err();
            assert_eq!(f.class, OutcomeClass::Protocol, "{reason}");
            assert!(!f.retry_same_target());
            assert!(f.class.fail_over());
        }
    }

    #[test]
    fn function_call_finish_maps_to_tool_calls() {
        let text = concat!(
            "data: {\"choices\":[{\"index\":0,\"delta\":{\"function_call\":{\"name\":\"f\",\"arguments\":\"{}\"}},\"finish_reason\":null}]}\n\n",
            "data: {\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"function_call\"}]}\n\n",
            "data: [DONE]\n\n"
        );
        assert_eq!(
            decode(text).1.unwrap().finish_reason,
            FinishReason::ToolCalls
        );
    }

    #[test]
    fn error_frame_shapes_are_all_failures() {
        let frames = [
            (
                r#"{"error":{"message":"x","type":"server_error","param":null,"code":null}}"#,
                OutcomeClass::ServerError,
            ),
            (
                r#"{"object":"error","message":"bad","type":"BadRequestError","code":400}"#,
                OutcomeClass::Invalid,
            ),
            (r#"{"error":"boom"}"#, OutcomeClass::ServerError),
            (
                r#"{"error":{"message":"x","code":"rate_limit_exceeded"}}"#,
                OutcomeClass::RateLimited,
            ),
        ];
        for (frame, want) in frames {
            let text = format!("data: {frame}\n\ndata: [DONE]\n\n");
            assert_eq!(class_of(&text), want, "{frame}");
        }
    }

    #[test]
    fn null_error_key_is_not_an_error() {
        let text = "data: {\"error\":null,\"choices\":[{\"index\":0,\"delta\":{\"content\":\"a\"},\"finish_reason\":\"stop\"}]}\n\ndata: [DONE]\n\n";
        assert!(decode(text).1.is_ok());
    }

    #[test]
    fn decoder_repeats_its_failure() {
        let mut d = OpenAiDecoder::new();
        let mut out = Vec::new();
        let bad = SseEvent {
            data: "{".into(),
            ..Default::default()
        };
        assert!(d.on_event(&bad, &mut out).is_err());
        let done = SseEvent {
            data: "[DONE]".into(),
            ..Default::default()
        };
        assert_eq!(
            d.on_event(&done, &mut out).unwrap_err().class,
            OutcomeClass::Protocol
        );
        assert_eq!(d.finish().unwrap_err().class, OutcomeClass::Protocol);
    }

    #[test]
    fn non_streaming_text_and_tools() {
        let body = br#"{"id":"chatcmpl-1","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"Hi","tool_calls":[{"id":"call_1","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]},"finish_reason":"tool_calls"}],"usage":{"prompt_tokens":5,"completion_tokens":7,"total_tokens":12}}"#;
        let (chunks, done) = decode_non_streaming(body).unwrap();
        assert_eq!(
            chunks,
            vec![
                Chunk::Text("Hi".into()),
                Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
                    index: 0,
                    id: Some("call_1".into()),
                    name: Some("f".into()),
                    arguments: "{\"a\":1}".into()
                }))
            ]
        );
        assert_eq!(done.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            done.usage,
            Some(Usage {
                input_tokens: 5,
                output_tokens: 7,
                ..Default::default()
            })
        );
    }

    #[test]
    fn non_streaming_failures() {
        let cases: &[(&[u8], OutcomeClass)] = &[
            (b"", OutcomeClass::Protocol),
            (b"  \n", OutcomeClass::Protocol),
            (b"<html><body>502 Bad Gateway</body></html>", OutcomeClass::Protocol),
            (b"[]", OutcomeClass::Protocol),
            (br#"{"choices":[]}"#, OutcomeClass::Protocol),
            (br#"{"error":{"message":"x","type":"server_error"}}"#, OutcomeClass::ServerError),
            (br#"{"object":"error","message":"x","type":"NotFoundError","code":404}"#, OutcomeClass::NotFound),
            (br#"{"choices":[{"index":0,"message":{"content":"a"},"finish_reason":null}]}"#, OutcomeClass::Truncated),
            (br#"{"choices":[{"index":0,"message":{"content":"a"},"finish_reason":"error"}]}"#, OutcomeClass::ServerError),
            (br#"{"choices":[{"index":0,"message":{"tool_calls":[{"id":"c","function":{"name":"f","arguments":"{"}}]},"finish_reason":"tool_calls"}]}"#, OutcomeClass::Truncated),
        ];
        for (body, want) in cases {
            let got = decode_non_streaming(body).unwrap_err();
            assert_eq!(got.class, *want, "{}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn non_streaming_refusal() {
        let body = br#"{"choices":[{"index":0,"message":{"content":null,"refusal":"I can't."},"finish_reason":"stop"}]}"#;
        let (chunks, done) = decode_non_streaming(body).unwrap();
        assert_eq!(chunks, vec![Chunk::Text("I can't.".into())]);
        assert_eq!(done.finish_reason, FinishReason::Refusal);
        assert_eq!(done.usage, None);
    }

    #[test]
    fn temperature_is_written_as_typed() {
        assert_eq!(f32_json(0.7), Some(json!(0.7)));
        assert_eq!(f32_json(f32::NAN), None);
    }
}
