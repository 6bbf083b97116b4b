//! Anthropic Messages adapter: its `Wire`, request body (system prompt, tool_use and
//! tool_result blocks), auth headers, and a strict stream decoder that requires
//! `message_stop` and classifies in-stream `error` events by `error.type` (A.3).
//! Pure functions over values and bytes: no I/O, and the API key is never logged
//! or kept anywhere but the sensitive header value handed back.

use std::collections::BTreeMap;

use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Map, Value};

use crate::chat::{CacheTtl, MediaSource, Part, PartKind, ReasoningBlock, ToolChoice};
use crate::policy::outcome::{Failure, OutcomeClass};
use crate::upstream::classify::{classify_error_object, in_body};
use crate::upstream::openai::{f32_json, merge_absent, u32_field};
use crate::upstream::sse::SseEvent;
use crate::upstream::wire::{Auth, Call, Quirks, Wire, WireRequest};
use crate::upstream::{
    ChatMessage, ChatRequest, Chunk, Completion, Dialect, Dropped, FinishReason, StreamDecoder,
    Usage,
};

/// The API version this adapter speaks.
pub const API_VERSION: &str = "2023-06-01";

/// `max_tokens` is required by Anthropic; used when the request sets none.
pub const DEFAULT_MAX_TOKENS: u32 = 1024;

/// Anthropic Messages at api.anthropic.com (`kind = "anthropic"`).
pub struct AnthropicWire;

/// The `anthropic` kind's wire.
pub static WIRE: AnthropicWire = AnthropicWire;

impl Wire for AnthropicWire {
    fn name(&self) -> &'static str {
        "anthropic"
    }

    fn dialect(&self) -> Dialect {
        Dialect::Anthropic
    }

    fn quirks(&self) -> Quirks {
        Quirks {
            auth: Auth::ApiKey { required: false },
            api_version: false,
            always_streamed: true,
            embeddings: false,
            service_tiers: &["auto", "standard_only"],
        }
    }

    fn request(&self, call: &Call<'_>, dropped: &mut Dropped) -> Result<WireRequest, Failure> {
        let mut headers = auth_headers(call.key);
        headers.extend(passthrough_headers(call.chat, Host::FirstParty, dropped));
        Ok(WireRequest::json(
            call.endpoint.fixed_url(endpoint),
            headers,
            build_body(call.chat, Host::FirstParty, dropped),
        ))
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(AnthropicDecoder::new())
    }
}

/// The messages URL under `base_url` (e.g. `https://api.anthropic.com/v1`).
pub fn endpoint(base_url: &str) -> String {
    format!("{}/messages", base_url.trim_end_matches('/'))
}

/// Where the Messages body goes: the fields a host takes differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// api.anthropic.com: takes every field a door passes through.
    FirstParty,
    /// Bedrock and Vertex: the modelled fields only (an unknown one is a 400
    /// there, e.g. `context_management`).
    Cloud,
}

/// The JSON request body. The leading system messages become the
/// top-level `system` (one string when they are plain text, else text
/// blocks with their cache markers); a later (mid-conversation) system turn
/// stays where it stands on api.anthropic.com when the caller spoke
/// Anthropic's wire (its own request, verbatim), and is folded into
/// `system` otherwise (Bedrock and Vertex, and callers of other dialects).
/// Images and documents go as base64 or URL sources, signed reasoning of
/// Anthropic's back in its assistant turn; what Anthropic's wire cannot
/// carry is noted in `dropped`. `json_mode` without a schema has no
/// Anthropic equivalent and is not sent (routes needing it should not list
/// Anthropic targets as JSON-capable).
///
/// Thinking follows Anthropic's rules: a budget fits under `max_tokens`
/// (without a `max_tokens`, the answer gets [`DEFAULT_MAX_TOKENS`] beside
/// the budget), a forced tool choice leaves budgeted thinking out, and
/// with thinking on, a temperature other than 1 and a `top_p` under 0.95
/// are left out (each noted).
pub fn build_body(req: &ChatRequest, host: Host, dropped: &mut Dropped) -> Value {
    let mut body = Map::new();
    body.insert("model".into(), json!(req.model));
    let passthrough = req
        .passthrough_for(Dialect::Anthropic)
        .filter(|_| host == Host::FirstParty);
    let turns_in_place = passthrough.is_some();
    if let Some(system) = system_json(&req.messages, turns_in_place) {
        body.insert("system".into(), system);
    }
    body.insert(
        "messages".into(),
        Value::Array(messages_json(&req.messages, turns_in_place, dropped)),
    );
    let thinking = req
        .reasoning
        .as_ref()
        .and_then(|r| thinking_json(r, req.max_tokens, &req.tool_choice, dropped));
    let max_tokens = match (req.max_tokens, &thinking) {
        (Some(n), _) => n,
        (None, Some(t)) => t["budget_tokens"]
            .as_u64()
            .and_then(|b| u32::try_from(b).ok())
            .map_or(DEFAULT_MAX_TOKENS, |b| b.saturating_add(DEFAULT_MAX_TOKENS)),
        (None, None) => DEFAULT_MAX_TOKENS,
    };
    body.insert("max_tokens".into(), json!(max_tokens));
    let thinking_on = thinking.is_some();
    match req.temperature {
        Some(t) if thinking_on && t != 1.0 => dropped.note("temperature"),
        Some(t) => {
            if let Some(t) = f32_json(t) {
                body.insert("temperature".into(), t);
            }
        }
        None => {}
    }
    match req.top_p {
        Some(p) if thinking_on && p < 0.95 => dropped.note("top_p"),
        Some(p) => {
            if let Some(p) = f32_json(p) {
                body.insert("top_p".into(), p);
            }
        }
        None => {}
    }
    if !req.stop.is_empty() {
        body.insert("stop_sequences".into(), json!(req.stop));
    }
    if !req.tools.is_empty() {
        let tools = req.tools.iter().map(|t| {
            let mut tool = Map::new();
            tool.insert("name".into(), json!(t.name));
            tool.insert("description".into(), json!(t.description));
            tool.insert("input_schema".into(), t.parameters.clone());
            if let Some(ttl) = t.cache {
                tool.insert("cache_control".into(), cache_control(ttl));
            }
            match (&t.extra, passthrough.is_some()) {
                (Some(extra), true) => merge_absent(&mut tool, extra),
                (Some(_), false) => dropped.note("tools.extra"),
                (None, _) => {}
            }
            Value::Object(tool)
        });
        body.insert("tools".into(), Value::Array(tools.collect()));
        match &req.tool_choice {
            ToolChoice::Auto => {}
            ToolChoice::Any => {
                body.insert("tool_choice".into(), json!({"type": "any"}));
            }
            ToolChoice::Tool(name) => {
                body.insert("tool_choice".into(), json!({"type": "tool", "name": name}));
            }
        }
    }
    if let Some(thinking) = thinking {
        body.insert("thinking".into(), thinking);
    }
    let mut output_config = Map::new();
    if let Some(effort) = req.reasoning.as_ref().and_then(|r| r.effort.as_deref()) {
        if r_effort_ok(effort) {
            output_config.insert("effort".into(), json!(effort));
        }
    }
    if let Some(schema) = &req.json_schema {
        output_config.insert(
            "format".into(),
            json!({"type": "json_schema", "schema": schema.schema}),
        );
    }
    if !output_config.is_empty() {
        body.insert("output_config".into(), Value::Object(output_config));
    }
    if let Some(tier) = &req.service_tier {
        body.insert("service_tier".into(), json!(tier));
    }
    if req.stream {
        body.insert("stream".into(), json!(true));
    }
    match (passthrough, req.passthrough.as_deref()) {
        // Same wire: what the caller sent verbatim wins over the mapping
        // (e.g. `thinking.display`, `output_config` as written).
        (Some(p), _) => {
            for (k, v) in &p.fields {
                body.insert(k.clone(), v.clone());
            }
        }
        (None, Some(p)) if p.dialect == Some(Dialect::Anthropic) => {
            // A cloud host: fields and headers it may refuse are left out.
            for field in p.fields.keys() {
                dropped.note(format!("passthrough.{field}"));
            }
        }
        (None, Some(other)) => dropped.passthrough(other),
        (None, None) => {}
    }
    Value::Object(body)
}

/// Efforts Anthropic's `output_config.effort` takes.
fn r_effort_ok(effort: &str) -> bool {
    matches!(effort, "low" | "medium" | "high" | "xhigh" | "max")
}

/// The `thinking` config for a reasoning ask: adaptive, or a budget (from
/// the ask, or mapped from an effort) that fits under `max_tokens` when
/// the caller set one. `None` (noted as dropped `thinking`) when no budget
/// fits (Anthropic's minimum is 1,024 tokens) or a forced tool choice
/// rules budgeted thinking out; an effort alone goes as `output_config`.
fn thinking_json(
    r: &crate::chat::ReasoningAsk,
    max_tokens: Option<u32>,
    choice: &ToolChoice,
    dropped: &mut Dropped,
) -> Option<Value> {
    if r.adaptive {
        return Some(json!({"type": "adaptive"}));
    }
    let budget = r.budget_tokens.or_else(|| {
        r.effort.as_deref().map(|e| match e {
            "none" | "minimal" | "low" => 1024,
            "medium" => 4096,
            "high" => 16384,
            _ => 32768,
        })
    })?;
    let budget = max_tokens.map_or(budget, |m| budget.min(m.saturating_sub(1)));
    let forced = matches!(choice, ToolChoice::Any | ToolChoice::Tool(_));
    if budget < 1024 || forced {
        dropped.note("thinking");
        return None;
    }
    Some(json!({"type": "enabled", "budget_tokens": budget}))
}

fn cache_control(ttl: CacheTtl) -> Value {
    match ttl {
        CacheTtl::FiveMinutes => json!({"type": "ephemeral"}),
        CacheTtl::OneHour => json!({"type": "ephemeral", "ttl": "1h"}),
    }
}

/// Adds a part's cache marker to its block.
fn marked(mut block: Value, cache: Option<CacheTtl>) -> Value {
    if let (Some(ttl), Some(o)) = (cache, block.as_object_mut()) {
        o.insert("cache_control".into(), cache_control(ttl));
    }
    block
}

/// The system messages that open the conversation (before any other turn).
fn leading_system(messages: &[ChatMessage]) -> usize {
    messages.iter().take_while(|m| m.role == "system").count()
}

/// The top-level `system`: the leading system messages, and every later
/// one too unless those stay in place (`turns_in_place`), in order.
fn system_json(messages: &[ChatMessage], turns_in_place: bool) -> Option<Value> {
    let lead = leading_system(messages);
    let system: Vec<&ChatMessage> = messages
        .iter()
        .enumerate()
        .filter(|(i, m)| m.role == "system" && (*i < lead || !turns_in_place))
        .map(|(_, m)| m)
        .collect();
    if system.is_empty() {
        return None;
    }
    if system.iter().all(|m| m.parts.is_empty()) {
        let texts: Vec<&str> = system.iter().map(|m| m.content.as_str()).collect();
        return Some(json!(texts.join("\n\n")));
    }
    Some(Value::Array(
        system.into_iter().flat_map(system_blocks).collect(),
    ))
}

/// A system message's text blocks with their cache markers (only text
/// belongs in a system prompt or turn; the door refuses the rest).
fn system_blocks(m: &ChatMessage) -> Vec<Value> {
    m.content_parts()
        .iter()
        .filter_map(|p| match &p.kind {
            PartKind::Text(t) => Some(marked(json!({"type": "text", "text": t}), p.cache)),
            _ => None,
        })
        .collect()
}

/// A media source block: base64 data, or a URL Anthropic fetches.
fn source_json(source: &MediaSource, media_type: &str) -> Value {
    use base64::Engine;
    match source {
        MediaSource::Url(u) => json!({"type": "url", "url": u}),
        MediaSource::Data(d) if media_type == "text/plain" => json!({
            "type": "text", "media_type": "text/plain",
            "data": String::from_utf8_lossy(d)}),
        MediaSource::Data(d) => json!({
            "type": "base64", "media_type": media_type,
            "data": base64::engine::general_purpose::STANDARD.encode(d)}),
    }
}

/// One content part as an Anthropic block; `None` for what it cannot carry.
fn block_json(p: &Part, dropped: &mut Dropped) -> Option<Value> {
    let block = match &p.kind {
        PartKind::Text(t) => json!({"type": "text", "text": t}),
        PartKind::Image(img) => {
            json!({"type": "image", "source": source_json(&img.source, &img.media_type)})
        }
        PartKind::Document(doc) => {
            let mut d =
                json!({"type": "document", "source": source_json(&doc.source, &doc.media_type)});
            if let (Some(t), Some(o)) = (&doc.title, d.as_object_mut()) {
                o.insert("title".into(), json!(t));
            }
            d
        }
        PartKind::Reasoning(r) => {
            if r.dialect.is_some_and(|d| d != Dialect::Anthropic) {
                dropped.note("reasoning");
                return None;
            }
            // Reasoning blocks carry no cache marker.
            return Some(match &r.redacted {
                Some(data) => json!({"type": "redacted_thinking", "data": data}),
                None => json!({"type": "thinking", "thinking": r.text,
                               "signature": r.signature.clone().unwrap_or_default()}),
            });
        }
    };
    Some(marked(block, p.cache))
}

/// The turns after the system prompt; consecutive tool results share one
/// user message. A later system message is a `system` turn in place when
/// `turns_in_place`, else it went to the top-level `system`.
fn messages_json(
    messages: &[ChatMessage],
    turns_in_place: bool,
    dropped: &mut Dropped,
) -> Vec<Value> {
    let mut out: Vec<Value> = Vec::new();
    for m in &messages[leading_system(messages)..] {
        match m.role.as_str() {
            "system" if turns_in_place => out.push(if m.parts.is_empty() {
                json!({"role": "system", "content": m.content})
            } else {
                json!({"role": "system", "content": system_blocks(m)})
            }),
            "system" => {}
            "tool" => push_tool_result(&mut out, m, dropped),
            "assistant" => out.push(assistant_json(m, dropped)),
            _ if m.parts.is_empty() => out.push(json!({"role": "user", "content": m.content})),
            _ => {
                let blocks: Vec<Value> = m
                    .parts
                    .iter()
                    .filter_map(|p| block_json(p, dropped))
                    .collect();
                out.push(json!({"role": "user", "content": blocks}));
            }
        }
    }
    out
}

fn push_tool_result(out: &mut Vec<Value>, m: &ChatMessage, dropped: &mut Dropped) {
    let content = if m.parts.is_empty() {
        json!(m.content)
    } else {
        Value::Array(
            m.parts
                .iter()
                .filter_map(|p| block_json(p, dropped))
                .collect(),
        )
    };
    let mut block = json!({
        "type": "tool_result",
        "tool_use_id": m.tool_call_id.clone().unwrap_or_default(),
        "content": content,
    });
    if let Some(o) = block.as_object_mut() {
        if m.is_error {
            o.insert("is_error".into(), json!(true));
        }
    }
    let block = marked(block, m.cache);
    if let Some(blocks) = out.last_mut().and_then(tool_result_blocks) {
        blocks.push(block);
    } else {
        out.push(json!({"role": "user", "content": [block]}));
    }
}

/// The content array of a user message made only of tool results.
fn tool_result_blocks(msg: &mut Value) -> Option<&mut Vec<Value>> {
    if msg.get("role").and_then(Value::as_str) != Some("user") {
        return None;
    }
    let blocks = msg.get_mut("content")?.as_array_mut()?;
    let all_results = blocks
        .iter()
        .all(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"));
    all_results.then_some(blocks)
}

/// An assistant turn: its reasoning blocks first (unmodified, as Anthropic
/// requires), then text, then earlier tool calls as `tool_use` blocks.
/// Arguments that are not a JSON object are sent as `{}` (Anthropic
/// requires an object).
fn assistant_json(m: &ChatMessage, dropped: &mut Dropped) -> Value {
    if m.tool_calls.is_empty() && m.parts.is_empty() {
        return json!({"role": "assistant", "content": m.content});
    }
    let mut blocks = Vec::new();
    let parts = m.content_parts();
    // Reasoning leads the turn whatever order the caller sent it in.
    let (reasoning, rest): (Vec<&Part>, Vec<&Part>) = parts
        .iter()
        .partition(|p| matches!(p.kind, PartKind::Reasoning(_)));
    for p in reasoning.into_iter().chain(rest) {
        if let Some(b) = block_json(p, dropped) {
            blocks.push(b);
        }
    }
    for call in &m.tool_calls {
        let input = serde_json::from_str::<Value>(&call.arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        blocks.push(json!({"type": "tool_use", "id": call.id, "name": call.name, "input": input}));
    }
    json!({"role": "assistant", "content": blocks})
}

/// Headers a passthrough sends to this host: `anthropic-beta` to Anthropic
/// itself (Bedrock takes it in the body as `anthropic_beta`).
pub fn passthrough_headers(req: &ChatRequest, host: Host, dropped: &mut Dropped) -> HeaderMap {
    let mut headers = HeaderMap::new();
    let Some(p) = req.passthrough.as_deref() else {
        return headers;
    };
    for (name, value) in &p.headers {
        let ours = p.dialect == Some(Dialect::Anthropic) && name == "anthropic-beta";
        match (ours, host) {
            (true, Host::FirstParty) => {
                if let (Ok(n), Ok(v)) = (
                    HeaderName::from_bytes(name.as_bytes()),
                    HeaderValue::from_str(value),
                ) {
                    headers.insert(n, v);
                }
            }
            _ => dropped.note(format!("header.{name}")),
        }
    }
    headers
}

/// `x-api-key` (sensitive) and `anthropic-version`. A missing or invalid key
/// gives no `x-api-key`: the upstream answers 401 and the attempt is `Auth`.
pub fn auth_headers(api_key: Option<&str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(
        HeaderName::from_static("anthropic-version"),
        HeaderValue::from_static(API_VERSION),
    );
    if let Some(key) = api_key.filter(|k| !k.is_empty()) {
        if let Ok(mut value) = HeaderValue::from_str(key) {
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-api-key"), value);
        }
    }
    headers
}

/// A content block being streamed, by its index.
#[derive(Debug)]
enum Block {
    Text,
    /// A client tool call; `args` accumulates `input_json_delta` fragments.
    ToolUse {
        /// 0-based position among the message's tool calls (the block index
        /// counts text blocks too; callers expect calls numbered from 0).
        call: u32,
        args: String,
    },
    /// Thinking: its text and signature, kept whole for `Completion.reasoning`.
    Thinking {
        text: String,
        signature: Option<String>,
    },
    /// Server tools and future block types: not forwarded.
    Other,
}

/// Streaming decoder for Messages API events.
///
/// Choices made where the reference leaves room: `pause_turn` finishes as
/// `Stop` (the server paused a long tool turn; the caller may continue it);
/// an unknown `stop_reason` is `Protocol` with `should_retry = Some(false)`;
/// a tool_use block with no input fragments is completed with a `{}` fragment
/// at its `content_block_stop`; events after `message_stop` are ignored.
#[derive(Debug, Default)]
pub struct AnthropicDecoder {
    /// `message_stop` arrived.
    stopped: bool,
    /// The mapped `stop_reason` from the last `message_delta` that carried one.
    finish_reason: Option<FinishReason>,
    /// Content blocks seen, by index.
    blocks: BTreeMap<u32, Block>,
    /// Tool-use blocks seen so far.
    tool_calls: u32,
    /// Input tokens from `message_start`, output tokens from the last `message_delta`.
    usage: Option<Usage>,
    /// `usage.service_tier`, from whichever event said last.
    service_tier: Option<String>,
    /// Finished reasoning blocks, in order.
    reasoning: Vec<ReasoningBlock>,
    /// The failure that ended the stream; repeated by later calls.
    failed: Option<Failure>,
}

/// Event types this decoder understands; others are ignored.
const KNOWN_EVENTS: [&str; 8] = [
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
];

impl AnthropicDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    fn handle(&mut self, ev: &SseEvent, out: &mut Vec<Chunk>) -> Result<(), Failure> {
        if let Some(raw) = &ev.error {
            return Err(error_payload_failure(raw));
        }
        if self.stopped || ev.event.as_deref() == Some("ping") || ev.data.trim().is_empty() {
            return Ok(());
        }
        let v: Value = match serde_json::from_str(&ev.data) {
            Ok(v) => v,
            Err(_) if ev.event.as_deref() == Some("error") => {
                return Err(error_payload_failure(&ev.data))
            }
            Err(_) if is_unknown_event(ev) => return Ok(()),
            Err(_) => {
                return Err(in_body(
                    OutcomeClass::Protocol,
                    "malformed JSON in stream event",
                ))
            }
        };
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(ev.event.as_deref())
            .unwrap_or("");
        match kind {
            "message_start" => self.on_message_start(&v),
            "content_block_start" => self.on_block_start(&v, out),
            "content_block_delta" => return self.on_block_delta(&v, out),
            "content_block_stop" => self.on_block_stop(&v, out),
            "message_delta" => return self.on_message_delta(&v),
            "message_stop" => self.stopped = true,
            "error" => return Err(classify_error_object(&v, Some(200))),
            _ => {}
        }
        Ok(())
    }

    fn on_message_start(&mut self, v: &Value) {
        if let Some(u) = v.get("message").and_then(|m| m.get("usage")) {
            self.update_usage(u);
        }
    }

    fn on_block_start(&mut self, v: &Value, out: &mut Vec<Chunk>) {
        let index = u32_field(v, "index").unwrap_or(0);
        let block = v.get("content_block").unwrap_or(&Value::Null);
        let kind = block.get("type").and_then(Value::as_str).unwrap_or("");
        let state = match kind {
            "text" => {
                if let Some(text) = block
                    .get("text")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                {
                    out.push(Chunk::Text(text.into()));
                }
                Block::Text
            }
            "thinking" => Block::Thinking {
                text: block
                    .get("thinking")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned(),
                signature: block
                    .get("signature")
                    .and_then(Value::as_str)
                    .filter(|s| !s.is_empty())
                    .map(str::to_owned),
            },
            "redacted_thinking" => {
                let data = block
                    .get("data")
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_owned();
                out.push(Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
                    text: String::new(),
                    signature: None,
                    redacted: Some(data.clone()),
                })));
                self.reasoning.push(ReasoningBlock {
                    redacted: Some(data),
                    dialect: Some(Dialect::Anthropic),
                    ..ReasoningBlock::default()
                });
                Block::Other
            }
            "tool_use" => {
                let args = initial_input(block);
                let call = self.tool_calls;
                self.tool_calls += 1;
                out.push(Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
                    index: call,
                    id: block.get("id").and_then(Value::as_str).map(str::to_owned),
                    name: block.get("name").and_then(Value::as_str).map(str::to_owned),
                    arguments: args.clone(),
                })));
                Block::ToolUse { call, args }
            }
            _ => Block::Other,
        };
        self.blocks.insert(index, state);
    }

    fn on_block_delta(&mut self, v: &Value, out: &mut Vec<Chunk>) -> Result<(), Failure> {
        let index = u32_field(v, "index").unwrap_or(0);
        let delta = v.get("delta").unwrap_or(&Value::Null);
        let kind = delta.get("type").and_then(Value::as_str);
        let started = self.blocks.get(&index);
        let fits = match (kind, started) {
            (_, None) => false,
            (Some("input_json_delta"), Some(b)) => matches!(b, Block::ToolUse { .. }),
            _ => true,
        };
        if !fits {
            // Dropping it would turn a broken stream into a "successful"
            // answer with the wrong tool arguments.
            return Err(in_body(
                OutcomeClass::Protocol,
                format!(
                    "{} for content block {index} that no content_block_start opened{}",
                    kind.unwrap_or("a delta"),
                    if started.is_some() {
                        " as tool_use"
                    } else {
                        ""
                    }
                ),
            ));
        }
        match kind {
            Some("text_delta") => {
                if let Some(text) = delta
                    .get("text")
                    .and_then(Value::as_str)
                    .filter(|t| !t.is_empty())
                {
                    out.push(Chunk::Text(text.into()));
                }
            }
            Some("thinking_delta") => {
                let part = delta.get("thinking").and_then(Value::as_str).unwrap_or("");
                if let Some(Block::Thinking { text, .. }) = self.blocks.get_mut(&index) {
                    if !part.is_empty() {
                        text.push_str(part);
                        out.push(Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
                            text: part.to_owned(),
                            signature: None,
                            redacted: None,
                        })));
                    }
                }
            }
            Some("signature_delta") => {
                let sig = delta.get("signature").and_then(Value::as_str).unwrap_or("");
                if let Some(Block::Thinking { signature, .. }) = self.blocks.get_mut(&index) {
                    *signature = Some(sig.to_owned());
                    out.push(Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
                        text: String::new(),
                        signature: Some(sig.to_owned()),
                        redacted: None,
                    })));
                }
            }
            Some("input_json_delta") => {
                let part = delta
                    .get("partial_json")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                if let Some(Block::ToolUse { call, args }) = self.blocks.get_mut(&index) {
                    if !part.is_empty() {
                        args.push_str(part);
                        out.push(tool_fragment(*call, part));
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    fn on_block_stop(&mut self, v: &Value, out: &mut Vec<Chunk>) {
        let index = u32_field(v, "index").unwrap_or(0);
        match self.blocks.get_mut(&index) {
            Some(Block::ToolUse { call, args }) if args.is_empty() => {
                args.push_str("{}");
                out.push(tool_fragment(*call, "{}"));
            }
            Some(Block::Thinking { text, signature }) => {
                self.reasoning.push(ReasoningBlock {
                    text: std::mem::take(text),
                    signature: signature.take(),
                    redacted: None,
                    dialect: Some(Dialect::Anthropic),
                });
            }
            _ => {}
        }
    }

    fn on_message_delta(&mut self, v: &Value) -> Result<(), Failure> {
        if let Some(u) = v.get("usage") {
            self.update_usage(u);
        }
        let reason = v
            .get("delta")
            .and_then(|d| d.get("stop_reason"))
            .and_then(Value::as_str);
        if let Some(reason) = reason {
            self.finish_reason = Some(map_stop_reason(reason)?);
        }
        Ok(())
    }

    /// Usage is cumulative: each value replaces the previous one.
    fn update_usage(&mut self, u: &Value) {
        if let Some(t) = crate::upstream::openai::tier_field(u) {
            self.service_tier = Some(t);
        }
        let usage = self.usage.get_or_insert_with(Usage::default);
        if let Some(n) = u32_field(u, "input_tokens") {
            usage.input_tokens = n;
        }
        if let Some(n) = u32_field(u, "output_tokens") {
            usage.output_tokens = n;
        }
        // Cache reads and writes are beside `input_tokens`, never in it.
        if let Some(n) = u32_field(u, "cache_read_input_tokens") {
            usage.cache_read_input_tokens = n;
        }
        if let Some(n) = u32_field(u, "cache_creation_input_tokens") {
            usage.cache_write_input_tokens = n;
        }
        if let Some(n) = u
            .get("cache_creation")
            .and_then(|c| u32_field(c, "ephemeral_1h_input_tokens"))
        {
            usage.cache_write_1h_input_tokens = n.min(usage.cache_write_input_tokens);
        }
        let details = u.get("output_tokens_details");
        if let Some(n) = details.and_then(|d| {
            u32_field(d, "thinking_tokens").or_else(|| u32_field(d, "reasoning_tokens"))
        }) {
            usage.reasoning_tokens = n.min(usage.output_tokens);
        }
    }

    fn check_tool_input(&self) -> Result<(), Failure> {
        let tools: Vec<&String> = self
            .blocks
            .values()
            .filter_map(|b| match b {
                Block::ToolUse { args, .. } => Some(args),
                _ => None,
            })
            .collect();
        if tools.is_empty() {
            return Err(in_body(
                OutcomeClass::Protocol,
                "stop_reason tool_use without a tool_use block",
            ));
        }
        if tools
            .iter()
            .any(|args| serde_json::from_str::<Value>(args).is_err())
        {
            return Err(in_body(
                OutcomeClass::Truncated,
                "tool_use input is not complete JSON",
            ));
        }
        Ok(())
    }
}

impl StreamDecoder for AnthropicDecoder {
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
        if !self.stopped {
            return Err(in_body(
                OutcomeClass::Truncated,
                "stream ended without message_stop",
            ));
        }
        let Some(finish_reason) = self.finish_reason else {
            return Err(in_body(
                OutcomeClass::Truncated,
                "message_stop without a stop_reason",
            ));
        };
        if finish_reason == FinishReason::ToolCalls {
            self.check_tool_input()?;
        }
        Ok(Completion {
            finish_reason,
            usage: self.usage,
            service_tier: self.service_tier.clone(),
            reasoning: std::mem::take(&mut self.reasoning),
        })
    }
}

fn is_unknown_event(ev: &SseEvent) -> bool {
    ev.event
        .as_deref()
        .is_some_and(|e| !KNOWN_EVENTS.contains(&e))
}

/// The tool input already present in `content_block_start` (normally `{}`,
/// in which case the input streams as `input_json_delta`).
fn initial_input(block: &Value) -> String {
    match block.get("input") {
        Some(Value::Object(o)) if !o.is_empty() => Value::Object(o.clone()).to_string(),
        _ => String::new(),
    }
}

fn tool_fragment(index: u32, arguments: &str) -> Chunk {
    Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
        index,
        id: None,
        name: None,
        arguments: arguments.to_owned(),
    }))
}

/// An `error` payload that may not be JSON.
fn error_payload_failure(raw: &str) -> Failure {
    match serde_json::from_str::<Value>(raw) {
        Ok(v) => classify_error_object(&v, Some(200)),
        Err(_) => in_body(
            OutcomeClass::ServerError,
            "upstream sent a non-JSON error event",
        ),
    }
}

/// Maps a `stop_reason`; unknown values are abnormal.
fn map_stop_reason(reason: &str) -> Result<FinishReason, Failure> {
    match reason {
        "end_turn" | "stop_sequence" | "pause_turn" => Ok(FinishReason::Stop),
        "max_tokens" | "model_context_window_exceeded" => Ok(FinishReason::Length),
        "tool_use" => Ok(FinishReason::ToolCalls),
        "refusal" => Ok(FinishReason::Refusal),
        other => {
            let label: String = other
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                .take(32)
                .collect();
            Err(Failure {
                should_retry: Some(false),
                ..in_body(
                    OutcomeClass::Protocol,
                    format!("abnormal stop_reason {label}"),
                )
            })
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::upstream::sse::transcript::{run_all, text_of};
    use crate::upstream::{ToolCall, ToolSpec};

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../../../tests/fixtures/transcripts/", $name))
        };
    }

    fn decode(text: &str) -> (Vec<Chunk>, Result<Completion, Failure>) {
        run_all(text, AnthropicDecoder::new)
    }

    fn frag(index: u32, id: Option<&str>, name: Option<&str>, args: &str) -> Chunk {
        Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
            index,
            id: id.map(Into::into),
            name: name.map(Into::into),
            arguments: args.into(),
        }))
    }

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
            ..Default::default()
        }
    }

    #[test]
    fn endpoint_trims_trailing_slash() {
        assert_eq!(
            endpoint("https://api.anthropic.com/v1/"),
            "https://api.anthropic.com/v1/messages"
        );
    }

    #[test]
    fn body_maps_system_tools_and_tool_turns() {
        let req = ChatRequest {
            model: "claude-sonnet-4-5".into(),
            messages: vec![
                msg("system", "be brief"),
                msg("system", "be kind"),
                msg("user", "weather and time?"),
                ChatMessage {
                    role: "assistant".into(),
                    content: "Checking.".into(),
                    tool_calls: vec![
                        ToolCall {
                            id: "toolu_1".into(),
                            name: "weather".into(),
                            arguments: "{\"city\":\"Paris\"}".into(),
                        },
                        ToolCall {
                            id: "toolu_2".into(),
                            name: "time".into(),
                            arguments: "not json".into(),
                        },
                    ],
                    ..Default::default()
                },
                ChatMessage {
                    tool_call_id: Some("toolu_1".into()),
                    ..msg("tool", "sunny")
                },
                ChatMessage {
                    tool_call_id: Some("toolu_2".into()),
                    ..msg("tool", "noon")
                },
                msg("user", "thanks"),
            ]
            .into(),
            temperature: Some(0.5),
            stop: vec!["END".into()],
            tools: vec![ToolSpec {
                name: "weather".into(),
                description: "get weather".into(),
                parameters: json!({"type": "object"}),
                cache: None,
                extra: None,
            }]
            .into(),
            tool_choice: ToolChoice::Any,
            json_mode: true,
            stream: true,
            ..Default::default()
        };
        let want = json!({
            "model": "claude-sonnet-4-5",
            "system": "be brief\n\nbe kind",
            "messages": [
                {"role": "user", "content": "weather and time?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}},
                    {"type": "tool_use", "id": "toolu_2", "name": "time", "input": {}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": "sunny"},
                    {"type": "tool_result", "tool_use_id": "toolu_2", "content": "noon"}
                ]},
                {"role": "user", "content": "thanks"}
            ],
            "max_tokens": 1024,
            "temperature": 0.5,
            "stop_sequences": ["END"],
            "tools": [{"name": "weather", "description": "get weather", "input_schema": {"type": "object"}}],
            "tool_choice": {"type": "any"},
            "stream": true
        });
        assert_eq!(
            build_body(&req, Host::FirstParty, &mut Dropped::default()),
            want
        );
    }

    fn marked_text(text: &str) -> ChatMessage {
        ChatMessage {
            role: "system".into(),
            parts: vec![Part {
                kind: PartKind::Text(text.into()),
                cache: Some(CacheTtl::FiveMinutes),
            }],
            ..Default::default()
        }
    }

    /// Claude Code's shape: a system prompt, a user turn, a marked system
    /// turn at the end; from the Anthropic door (a passthrough of its own).
    fn with_system_turn() -> ChatRequest {
        ChatRequest {
            model: "m".into(),
            messages: vec![
                msg("system", "prompt"),
                msg("user", "hi"),
                marked_text("# Environment"),
            ]
            .into(),
            passthrough: Some(std::sync::Arc::new(crate::chat::Passthrough {
                dialect: Some(Dialect::Anthropic),
                dropped: vec!["messages[1].output_config".into()],
                ..Default::default()
            })),
            ..Default::default()
        }
    }

    #[test]
    fn a_system_turn_stays_in_place_for_anthropics_own_callers_and_folds_elsewhere() {
        let mut d = Dropped::default();
        let body = build_body(&with_system_turn(), Host::FirstParty, &mut d);
        assert_eq!(body["system"], "prompt");
        assert_eq!(
            body["messages"],
            json!([
                {"role": "user", "content": "hi"},
                {"role": "system", "content": [{"type": "text", "text": "# Environment",
                                                "cache_control": {"type": "ephemeral"}}]}
            ])
        );
        // Bedrock and Vertex: folded into the system prompt, marker kept.
        let body = build_body(&with_system_turn(), Host::Cloud, &mut d);
        assert_eq!(
            body["system"],
            json!([{"type": "text", "text": "prompt"},
                   {"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}])
        );
        assert_eq!(body["messages"], json!([{"role": "user", "content": "hi"}]));
        // A caller of another dialect: folded too.
        let mut req = with_system_turn();
        req.passthrough = None;
        std::sync::Arc::make_mut(&mut req.messages)[2] = msg("system", "later");
        let body = build_body(&req, Host::FirstParty, &mut d);
        assert_eq!(body["system"], "prompt\n\nlater");
        assert_eq!(body["messages"].as_array().unwrap().len(), 1);
        assert!(d.is_empty(), "{d:?}");
    }

    #[test]
    fn thinking_follows_anthropics_rules_on_budgets_tool_choice_and_sampling() {
        let budgeted = |max_tokens, choice| ChatRequest {
            model: "m".into(),
            messages: vec![msg("user", "hi")].into(),
            max_tokens,
            temperature: Some(0.2),
            top_p: Some(0.99),
            tools: vec![ToolSpec {
                name: "f".into(),
                description: String::new(),
                parameters: json!({"type": "object"}),
                cache: None,
                extra: None,
            }]
            .into(),
            tool_choice: choice,
            reasoning: Some(crate::chat::ReasoningAsk {
                effort: Some("high".into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        // No max_tokens: the budget plus room for the answer.
        let mut d = Dropped::default();
        let body = build_body(&budgeted(None, ToolChoice::Auto), Host::FirstParty, &mut d);
        assert_eq!(
            body["thinking"],
            json!({"type": "enabled", "budget_tokens": 16384})
        );
        assert_eq!(body["max_tokens"], 16384 + DEFAULT_MAX_TOKENS);
        // Thinking takes no temperature but 1, and a top_p of 0.95 or more.
        assert!(body.get("temperature").is_none());
        assert_eq!(body["top_p"], json!(0.99));
        assert_eq!(d.names(), ["temperature"]);
        // A forced tool: the caller's contract wins over budgeted thinking.
        let mut d = Dropped::default();
        let body = build_body(
            &budgeted(Some(32000), ToolChoice::Tool("f".into())),
            Host::FirstParty,
            &mut d,
        );
        assert!(body.get("thinking").is_none());
        assert_eq!(body["tool_choice"], json!({"type": "tool", "name": "f"}));
        assert_eq!(body["temperature"], json!(0.2));
        assert_eq!(body["max_tokens"], 32000);
        assert_eq!(d.names(), ["thinking"]);
        // Adaptive thinking takes a forced tool.
        let mut req = budgeted(Some(32000), ToolChoice::Any);
        req.reasoning = Some(crate::chat::ReasoningAsk {
            adaptive: true,
            ..Default::default()
        });
        req.temperature = Some(1.0);
        let mut d = Dropped::default();
        let body = build_body(&req, Host::Cloud, &mut d);
        assert_eq!(body["thinking"], json!({"type": "adaptive"}));
        assert_eq!(body["temperature"], json!(1.0));
        assert!(d.is_empty(), "{d:?}");
    }

    #[test]
    fn body_keeps_explicit_max_tokens() {
        let req = ChatRequest {
            model: "m".into(),
            max_tokens: Some(7),
            ..Default::default()
        };
        assert_eq!(
            build_body(&req, Host::FirstParty, &mut Dropped::default()),
            json!({"model": "m", "messages": [], "max_tokens": 7})
        );
    }

    #[test]
    fn auth_headers_are_versioned_and_sensitive() {
        let h = auth_headers(Some("sk-ant-test"));
        assert_eq!(h.get("anthropic-version").unwrap(), API_VERSION);
        let key = h.get("x-api-key").unwrap();
        assert_eq!(key.to_str().unwrap(), "sk-ant-test");
        assert!(key.is_sensitive());
        assert!(auth_headers(None).get("x-api-key").is_none());
    }

    #[test]
    fn text_stream_completes_with_cumulative_usage() {
        let (chunks, done) = decode(fixture!("anthropic_text.sse"));
        assert_eq!(
            chunks,
            vec![Chunk::Text("Hello".into()), Chunk::Text("!".into())]
        );
        let done = done.unwrap();
        assert_eq!(done.finish_reason, FinishReason::Stop);
        assert_eq!(
            done.usage,
            Some(Usage {
                input_tokens: 25,
                output_tokens: 15,
                ..Default::default()
            })
        );
    }

    #[test]
    fn crlf_fixture_decodes_like_lf() {
        assert_eq!(
            decode(fixture!("anthropic_text_crlf.sse")),
            decode(fixture!("anthropic_text.sse"))
        );
    }

    #[test]
    fn tool_calls_are_numbered_from_zero_whatever_their_block_index() {
        let (chunks, done) = decode(fixture!("anthropic_tool_use.sse"));
        assert_eq!(
            chunks,
            vec![
                Chunk::Text("Let me check.".into()),
                frag(0, Some("toolu_01A"), Some("get_weather"), ""),
                frag(0, None, None, "{\"city\": "),
                frag(0, None, None, "\"Paris\"}"),
                frag(1, Some("toolu_01B"), Some("get_time"), ""),
                frag(1, None, None, "{}"),
            ]
        );
        let done = done.unwrap();
        assert_eq!(done.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            done.usage,
            Some(Usage {
                input_tokens: 400,
                output_tokens: 89,
                ..Default::default()
            })
        );
    }

    #[test]
    fn overloaded_error_midstream_is_overloaded() {
        let (chunks, end) = decode(fixture!("anthropic_overloaded_midstream.sse"));
        assert_eq!(text_of(&chunks), "Hel");
        let f = end.unwrap_err();
        assert_eq!(f.class, OutcomeClass::Overloaded);
        assert_eq!(f.http_status, Some(200));
    }

    #[test]
    fn overloaded_before_any_delta_emits_nothing() {
        let (chunks, end) = decode(fixture!("anthropic_overloaded_before_content.sse"));
        assert!(chunks.is_empty());
        assert_eq!(end.unwrap_err().class, OutcomeClass::Overloaded);
    }

    #[test]
    fn midstream_error_types() {
        let cases = [
            (
                r#"{"type":"error","error":{"type":"api_error","message":"Internal server error"}}"#,
                OutcomeClass::ServerError,
            ),
            (
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"x"}}"#,
                OutcomeClass::RateLimited,
            ),
            (
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"x","details":{"error_code":"enforced_spend_limit_reached"}}}"#,
                OutcomeClass::Quota,
            ),
            (
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"x"}}"#,
                OutcomeClass::Invalid,
            ),
            (
                r#"{"type":"error","error":{"details":null,"type":"overloaded_error","message":"Overloaded"}}"#,
                OutcomeClass::Overloaded,
            ),
            ("not json", OutcomeClass::ServerError),
        ];
        for (data, want) in cases {
            let text = format!("event: message_start\ndata: {{\"type\":\"message_start\",\"message\":{{}}}}\n\nevent: error\ndata: {data}\n\n");
            assert_eq!(decode(&text).1.unwrap_err().class, want, "{data}");
        }
    }

    #[test]
    fn no_message_stop_is_truncated() {
        let (chunks, end) = decode(fixture!("anthropic_no_message_stop.sse"));
        assert_eq!(text_of(&chunks), "Hello there");
        assert_eq!(end.unwrap_err().class, OutcomeClass::Truncated);
    }

    #[test]
    fn eof_after_content_block_delta_is_truncated() {
        let text = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\nevent: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"text_delta\",\"text\":\"Hi\"}}\n\n";
        assert_eq!(decode(text).1.unwrap_err().class, OutcomeClass::Truncated);
    }

    #[test]
    fn refusal_forwards_partial_text_and_finishes_as_refusal() {
        let (chunks, done) = decode(fixture!("anthropic_refusal.sse"));
        assert_eq!(text_of(&chunks), "Sure, the first step");
        assert_eq!(done.unwrap().finish_reason, FinishReason::Refusal);
    }

    #[test]
    fn pings_and_unknown_events_are_ignored_and_thinking_is_carried_as_reasoning() {
        let (chunks, done) = decode(fixture!("anthropic_pings_unknown_events.sse"));
        assert_eq!(text_of(&chunks), "42");
        assert_eq!(chunks.last(), Some(&Chunk::Text("42".into())));
        assert!(matches!(&chunks[0], Chunk::Reasoning(r) if r.text == "Let me think..."));
        let done = done.unwrap();
        assert_eq!(done.finish_reason, FinishReason::Length);
        assert_eq!(
            done.usage,
            Some(Usage {
                input_tokens: 12,
                output_tokens: 64,
                ..Default::default()
            })
        );
    }

    #[test]
    fn truncated_tool_input_is_truncated() {
        let (chunks, end) = decode(fixture!("anthropic_truncated_tool_input.sse"));
        assert_eq!(chunks.len(), 2);
        assert_eq!(end.unwrap_err().class, OutcomeClass::Truncated);
    }

    #[test]
    fn stop_reason_mapping() {
        let cases = [
            ("end_turn", FinishReason::Stop),
            ("stop_sequence", FinishReason::Stop),
            ("pause_turn", FinishReason::Stop),
            ("max_tokens", FinishReason::Length),
            ("model_context_window_exceeded", FinishReason::Length),
            ("refusal", FinishReason::Refusal),
            ("tool_use", FinishReason::ToolCalls),
        ];
        for (reason, want) in cases {
            assert_eq!(map_stop_reason(reason).unwrap(), want);
        }
        let f = map_stop_reason("something_new").unwrap_err();
        assert_eq!(f.class, OutcomeClass::Protocol);
        assert!(!f.retry_same_target());
    }

    #[test]
    fn a_delta_before_its_content_block_start_is_protocol_not_empty_arguments() {
        let start = "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n";
        let orphan = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":1,\"delta\":{\"type\":\"input_json_delta\",\"partial_json\":\"{\\\"a\\\":1}\"}}\n\n";
        let rest = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"tool_use\",\"id\":\"t\",\"name\":\"f\",\"input\":{}}}\n\nevent: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\nevent: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        let (_, end) = decode(&format!("{start}{orphan}{rest}"));
        let f = end.unwrap_err();
        assert_eq!(f.class, OutcomeClass::Protocol, "{f:?}");
        assert!(f.message.contains("input_json_delta"), "{}", f.message);
        // Arguments for a text block are as wrong.
        let text_block = "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n";
        let (_, end) = decode(&format!("{start}{text_block}{orphan}{rest}"));
        assert_eq!(end.unwrap_err().class, OutcomeClass::Protocol);
    }

    #[test]
    fn message_stop_without_stop_reason_is_truncated() {
        let text = "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(decode(text).1.unwrap_err().class, OutcomeClass::Truncated);
    }

    #[test]
    fn tool_use_stop_without_tool_block_is_protocol() {
        let text = "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"tool_use\"}}\n\nevent: message_stop\ndata: {\"type\":\"message_stop\"}\n\n";
        assert_eq!(decode(text).1.unwrap_err().class, OutcomeClass::Protocol);
    }

    #[test]
    fn malformed_known_event_is_protocol() {
        let text = "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\n\n";
        assert_eq!(decode(text).1.unwrap_err().class, OutcomeClass::Protocol);
    }
}
