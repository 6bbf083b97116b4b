//! OpenAI and Anthropic wire shapes: request fields the mock reads, SSE frames,
//! non-streaming bodies and real error bodies (reference Part A.1-A.4);
//! Gemini's are rendered by `super::gemini`.
//! Pure functions from a [`Gen`] context to bytes; no I/O, no fault logic.

use bytes::Bytes;
use serde_json::{json, Value};

use super::anthropic_cache::Extras;
use super::faults::Preset;
use super::schema::{self, Shape};
use super::MockKind;

/// Marker placed in 401 bodies so tests can prove they are never forwarded.
pub const AUTH_MARKER: &str = "sk-secret-upstream-401-body";

/// The request fields that shape an answer.
#[derive(Debug, Clone, Default)]
pub(crate) struct Parsed {
    pub model: Option<String>,
    pub stream: bool,
    pub max_tokens: Option<u32>,
    /// Name of the first tool, if tools were given.
    pub tool: Option<String>,
    pub include_usage: bool,
    /// Deterministic prompt size estimate.
    pub input_tokens: u32,
    /// The `service_tier` asked for.
    pub service_tier: Option<String>,
    /// OpenAI `response_format: {"type": "json_object"}` (Gemini
    /// `responseMimeType: application/json`): the answer is JSON.
    pub json_object: bool,
    /// Gemini `includeThoughts`: the answer opens with a thought.
    pub thoughts: bool,
    /// OpenAI `response_format: {"type": "json_schema"}` or Anthropic
    /// `output_config.format`: the answer is JSON valid against this schema.
    pub schema: Option<Value>,
    /// The called tool's parameter schema (the forced tool's, else the
    /// first's): arguments valid against it when it names properties.
    pub tool_schema: Option<Value>,
    /// OpenAI `reasoning_effort`: the answer reasons first (a compatible
    /// server's `reasoning_content`, and `reasoning_tokens` in usage).
    pub reasoning_effort: Option<String>,
    /// Prompt tokens read from the provider's cache: OpenAI's automatic
    /// cache (filled in by the server once it knows the request is
    /// answered) or Gemini's implicit one.
    pub cached_tokens: u32,
    /// Scripted tool-call arguments (`PUT /_mock/tools`): sent whole, no tokens.
    pub args: Option<String>,
    /// A continuation: the request ends with an assistant prefill (Anthropic
    /// a trailing assistant turn; OpenAI-compatible with
    /// `continue_final_message`) holding this many of the answer's tokens;
    /// the answer goes on from the next one, opening with the space the
    /// prefill left out.
    pub continue_from: u32,
}

impl Parsed {
    pub(crate) fn from_body(dialect: MockKind, body: &Value) -> Parsed {
        if dialect == MockKind::Gemini {
            let (max_tokens, tool, prompt, json_object, thoughts) = super::gemini::read(body);
            return Parsed {
                model: body.get("model").and_then(Value::as_str).map(str::to_owned),
                stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
                max_tokens,
                tool,
                input_tokens: clamp_u32(prompt as u64 / 4 + 1),
                json_object,
                thoughts,
                ..Parsed::default()
            };
        }
        let max = |k: &str| body.get(k).and_then(Value::as_u64).map(clamp_u32);
        let (name_at, forced_at) = match dialect {
            MockKind::Openai => ("/function/name", "/tool_choice/function/name"),
            // (Gemini's body was read above.)
            MockKind::Anthropic | MockKind::Gemini => ("/name", "/tool_choice/name"),
        };
        let tools = body.get("tools").and_then(Value::as_array);
        let forced = body.pointer(forced_at).and_then(Value::as_str);
        let called = tools.and_then(|t| {
            t.iter()
                .find(|t| forced.is_some() && t.pointer(name_at).and_then(Value::as_str) == forced)
                .or_else(|| t.first())
        });
        let tool = called.map(|t| {
            t.pointer(name_at)
                .and_then(Value::as_str)
                .unwrap_or("tool")
                .to_owned()
        });
        let tool_schema = tool
            .as_deref()
            .and_then(|name| tool_schema(dialect, body, name));
        let format = body
            .pointer("/response_format/type")
            .and_then(Value::as_str);
        // OpenAI `response_format`, Anthropic `output_config.format`.
        let (schema_type, schema_at) = match dialect {
            MockKind::Openai => (
                "/response_format/type",
                "/response_format/json_schema/schema",
            ),
            MockKind::Anthropic | MockKind::Gemini => {
                ("/output_config/format/type", "/output_config/format/schema")
            }
        };
        let schema = (body.pointer(schema_type).and_then(Value::as_str) == Some("json_schema"))
            .then(|| {
                body.pointer(schema_at)
                    .cloned()
                    .unwrap_or_else(|| json!({"type": "object"}))
            });
        // Anthropic bills its top-level system and tools as input too.
        let prompt: String = ["messages", "system", "tools"]
            .iter()
            .filter(|k| **k == "messages" || dialect == MockKind::Anthropic)
            .filter_map(|k| body.get(*k))
            .map(Value::to_string)
            .collect();
        Parsed {
            model: body.get("model").and_then(Value::as_str).map(str::to_owned),
            stream: body.get("stream").and_then(Value::as_bool).unwrap_or(false),
            max_tokens: max("max_tokens").or_else(|| max("max_completion_tokens")),
            tool,
            include_usage: body
                .pointer("/stream_options/include_usage")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            input_tokens: clamp_u32(prompt.len() as u64 / 4 + 1),
            service_tier: body
                .get("service_tier")
                .and_then(Value::as_str)
                .map(str::to_owned),
            json_object: format == Some("json_object"),
            schema,
            tool_schema,
            reasoning_effort: (dialect == MockKind::Openai)
                .then(|| body.get("reasoning_effort").and_then(Value::as_str))
                .flatten()
                .map(str::to_owned),
            continue_from: prefilled_tokens(dialect, body),
            ..Parsed::default()
        }
    }
}

/// Tokens of the answer already in the request's trailing assistant
/// prefill (0 when it has none, or the dialect would not continue it).
fn prefilled_tokens(dialect: MockKind, body: &Value) -> u32 {
    let continues = match dialect {
        MockKind::Anthropic => true,
        MockKind::Openai => body.get("continue_final_message") == Some(&Value::Bool(true)),
        MockKind::Gemini => false,
    };
    let Some(last) = body
        .get("messages")
        .and_then(Value::as_array)
        .and_then(|m| m.last())
        .filter(|m| continues && m.get("role").and_then(Value::as_str) == Some("assistant"))
    else {
        return 0;
    };
    let text = match last.get("content") {
        Some(Value::String(t)) => t.clone(),
        Some(Value::Array(blocks)) => blocks
            .iter()
            .filter_map(|b| b.get("text").and_then(Value::as_str))
            .collect(),
        _ => String::new(),
    };
    clamp_u32(text.matches("tok").count() as u64)
}

/// The request's last message is a tool result (OpenAI role `tool`,
/// Anthropic a user turn of `tool_result` blocks).
pub(crate) fn ends_with_tool_result(dialect: MockKind, body: &Value) -> bool {
    let turns = if dialect == MockKind::Gemini {
        "contents"
    } else {
        "messages"
    };
    let Some(last) = body
        .get(turns)
        .and_then(Value::as_array)
        .and_then(|m| m.last())
    else {
        return false;
    };
    let has_block = |list: &str, is: &dyn Fn(&Value) -> bool| {
        last.get(list)
            .and_then(Value::as_array)
            .is_some_and(|blocks| blocks.iter().any(is))
    };
    match dialect {
        MockKind::Openai => last.get("role").and_then(Value::as_str) == Some("tool"),
        MockKind::Anthropic => has_block("content", &|b| {
            b.get("type").and_then(Value::as_str) == Some("tool_result")
        }),
        MockKind::Gemini => has_block("parts", &|p| p.get("functionResponse").is_some()),
    }
}

/// The parameter schema of the offered tool `name` (OpenAI and Anthropic),
/// when it names properties: the mock shapes that tool's arguments by it.
pub(crate) fn tool_schema(dialect: MockKind, body: &Value, name: &str) -> Option<Value> {
    let (name_at, schema_at) = match dialect {
        MockKind::Openai => ("/function/name", "/function/parameters"),
        MockKind::Anthropic => ("/name", "/input_schema"),
        MockKind::Gemini => return None,
    };
    body.get("tools")?
        .as_array()?
        .iter()
        .find(|t| t.pointer(name_at).and_then(Value::as_str) == Some(name))?
        .pointer(schema_at)
        .filter(|s| schema::has_properties(s))
        .cloned()
}

/// The request offers a tool of this name.
pub(crate) fn offers_tool(dialect: MockKind, body: &Value, name: &str) -> bool {
    let named = |t: &Value, pointer: &str| t.pointer(pointer).and_then(Value::as_str) == Some(name);
    body.get("tools")
        .and_then(Value::as_array)
        .is_some_and(|tools| {
            tools.iter().any(|t| match dialect {
                MockKind::Openai => named(t, "/function/name"),
                MockKind::Anthropic => named(t, "/name"),
                MockKind::Gemini => t
                    .get("functionDeclarations")
                    .and_then(Value::as_array)
                    .is_some_and(|d| d.iter().any(|d| named(d, "/name"))),
            })
        })
}

fn clamp_u32(v: u64) -> u32 {
    u32::try_from(v).unwrap_or(u32::MAX)
}

/// How a completion ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Finish {
    Natural,
    Length,
    Tool,
    Refusal,
}

/// Everything needed to render one answer.
pub(crate) struct Gen {
    pub dialect: MockKind,
    pub req: Parsed,
    /// Request sequence number (makes ids unique).
    pub seq: u64,
    /// Unix seconds, identical on every chunk.
    pub created: u64,
    /// Tokens this answer carries.
    pub n: u32,
    /// `n` was cut by the request's `max_tokens`.
    pub capped: bool,
    /// Streamed tokens are padded to this many bytes.
    pub pad: usize,
    /// A JSON-mode answer: `{"answer":"<the tokens>"}` (`reply` under the
    /// `off_schema` fault), or an instance of the request's schema.
    pub json: Shape,
    /// Tool arguments: `{"query":"<the tokens>"}`, or an instance of the
    /// tool's schema.
    pub args: Shape,
    /// Reasoning tokens before the answer (OpenAI `reasoning_effort`).
    pub reasoning: u32,
    /// Anthropic: prompt-cache usage and the signed thinking block.
    pub anthropic: Extras,
}

impl Gen {
    pub(crate) fn new(dialect: MockKind, req: Parsed, seq: u64, tokens: u32, created: u64) -> Gen {
        let (n, capped) = match req.max_tokens {
            // Scripted arguments go out whole, with no tokens.
            _ if req.args.is_some() && req.tool.is_some() => (0, false),
            Some(m) if m < tokens => (m, true),
            _ => (tokens, false),
        };
        Gen::build(dialect, req, seq, (n, capped), created)
    }

    fn build(
        dialect: MockKind,
        req: Parsed,
        seq: u64,
        (n, capped): (u32, bool),
        created: u64,
    ) -> Gen {
        let json = req
            .schema
            .as_ref()
            .map_or_else(|| Shape::keyed(JSON_KEY), schema::shape);
        let args = match (&req.args, &req.tool_schema) {
            // Scripted arguments go out whole, with no slot for tokens.
            (Some(scripted), _) => Shape {
                open: scripted.clone(),
                close: String::new(),
                slot: false,
            },
            (None, Some(s)) => schema::shape(s),
            (None, None) => Shape::keyed(ARGS_KEY),
        };
        let reasoning = req.reasoning_effort.as_deref().map_or(0, reasoning_tokens);
        Gen {
            dialect,
            req,
            seq,
            created,
            n,
            capped,
            pad: 0,
            json,
            args,
            reasoning,
            anthropic: Extras::default(),
        }
    }

    /// An answer of `tokens` tokens whatever `max_tokens` asked (a runaway upstream).
    pub(crate) fn ignoring_max_tokens(
        dialect: MockKind,
        req: Parsed,
        seq: u64,
        tokens: u32,
        created: u64,
    ) -> Gen {
        Gen::build(dialect, req, seq, (tokens, false), created)
    }

    /// A JSON-mode answer under another key than a golden set or the
    /// caller's schema expects.
    pub(crate) fn off_schema(mut self) -> Gen {
        self.json = Shape::keyed("reply");
        self
    }

    /// The answer is a JSON object (OpenAI or Gemini JSON mode, an OpenAI
    /// or Anthropic schema; no tool call).
    fn json(&self) -> bool {
        let asked = match self.dialect {
            MockKind::Anthropic => self.req.schema.is_some(),
            _ => self.req.json_object || self.req.schema.is_some(),
        };
        asked && self.req.tool.is_none()
    }

    /// Whether the tokens go into the answer: not when its JSON has no slot.
    fn slot(&self) -> bool {
        match (&self.req.tool, self.json()) {
            (Some(_), _) => self.args.slot,
            (None, true) => self.json.slot,
            (None, false) => true,
        }
    }

    /// Anthropic: the answer's cache usage and thinking.
    pub(crate) fn with_anthropic(mut self, extras: Extras) -> Gen {
        self.anthropic = extras;
        self
    }

    /// Anthropic: the index of the text or tool block (after the thinking).
    fn block_index(&self) -> u32 {
        u32::from(self.anthropic.thinking.is_some())
    }

    /// Anthropic usage: input, cache reads and writes, output (with thinking).
    fn an_usage(&self, output: u32) -> Value {
        let mut u = self.anthropic.usage(self.req.input_tokens);
        u["output_tokens"] = json!(output + self.anthropic.thinking_tokens());
        u["service_tier"] = json!(served_tier(self));
        u
    }

    /// Each token padded to `bytes` bytes.
    pub(crate) fn padded(mut self, bytes: usize) -> Gen {
        self.pad = bytes;
        self
    }

    fn model(&self) -> &str {
        self.req.model.as_deref().unwrap_or("mock-model")
    }

    pub(crate) fn request_id(&self) -> String {
        format!("req_mock{:06}", self.seq)
    }

    fn id(&self) -> String {
        match self.dialect {
            MockKind::Openai => format!("chatcmpl-mock{:06}", self.seq),
            MockKind::Anthropic => format!("msg_mock{:06}", self.seq),
            MockKind::Gemini => format!("resp-mock{:06}", self.seq),
        }
    }

    fn call_id(&self) -> String {
        match self.dialect {
            MockKind::Openai => format!("call_mock{:06}", self.seq),
            MockKind::Anthropic => format!("toolu_mock{:06}", self.seq),
            MockKind::Gemini => format!("call_mock{:06}", self.seq),
        }
    }

    /// The natural finish, before any fault.
    pub(crate) fn finish(&self) -> Finish {
        if self.capped {
            Finish::Length
        } else if self.req.tool.is_some() {
            Finish::Tool
        } else {
            Finish::Natural
        }
    }

    fn finish_str(&self, f: Finish) -> &'static str {
        match (self.dialect, f) {
            (MockKind::Openai, Finish::Natural) => "stop",
            (MockKind::Openai, Finish::Length) => "length",
            (MockKind::Openai, Finish::Tool) => "tool_calls",
            (MockKind::Openai, Finish::Refusal) => "content_filter",
            (MockKind::Anthropic, Finish::Natural) => "end_turn",
            (MockKind::Anthropic, Finish::Length) => "max_tokens",
            (MockKind::Anthropic, Finish::Tool) => "tool_use",
            (MockKind::Anthropic, Finish::Refusal) => "refusal",
            (MockKind::Gemini, f) => super::gemini::finish_str(f),
        }
    }
}

/// Token `i` of every answer.
pub fn token_text(i: u32) -> String {
    format!("tok{i} ")
}

/// The key of a JSON-mode answer.
const JSON_KEY: &str = "answer";
/// The key of tool arguments without a schema of named fields.
const ARGS_KEY: &str = "query";

fn text_of(k: u32) -> String {
    (0..k).map(token_text).collect()
}

/// Reasoning tokens for an effort (the mock's own scale).
fn reasoning_tokens(effort: &str) -> u32 {
    match effort {
        "none" => 0,
        "minimal" => 2,
        "low" => 4,
        "high" => 16,
        "xhigh" | "max" => 32,
        _ => 8,
    }
}

/// Reasoning token `i`.
fn thought_text(i: u32) -> String {
    format!("think{i} ")
}

fn sse_data(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\n\n"))
}

fn sse_event(event: &str, v: &Value) -> Bytes {
    Bytes::from(format!("event: {event}\ndata: {v}\n\n"))
}

/// `data: [DONE]`.
pub(crate) fn done() -> Bytes {
    Bytes::from_static(b"data: [DONE]\n\n")
}

// ---- OpenAI streaming -------------------------------------------------------

/// The tier that "served": OpenAI names it on every chunk, Anthropic in usage.
fn served_tier(g: &Gen) -> &'static str {
    match (g.dialect, g.req.service_tier.as_deref()) {
        (MockKind::Openai, Some("flex")) => "flex",
        (MockKind::Openai, Some("priority")) => "priority",
        (MockKind::Openai, _) => "default",
        (MockKind::Anthropic, Some("auto")) => "priority",
        (MockKind::Anthropic, _) => "standard",
        (MockKind::Gemini, _) => "none",
    }
}

fn oa_chunk(g: &Gen, delta: Value, finish: Option<&str>) -> Bytes {
    let mut v = json!({
        "id": g.id(), "object": "chat.completion.chunk", "created": g.created,
        "model": g.model(), "system_fingerprint": null, "service_tier": served_tier(g),
        "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
    });
    if g.req.include_usage {
        v["usage"] = Value::Null;
    }
    sse_data(&v)
}

fn oa_args(g: &Gen, fragment: &str) -> Bytes {
    oa_chunk(
        g,
        json!({"tool_calls": [{"index": 0, "function": {"arguments": fragment}}]}),
        None,
    )
}

fn an_args(g: &Gen, fragment: &str) -> Bytes {
    sse_event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": g.block_index(),
                "delta": {"type": "input_json_delta", "partial_json": fragment}}),
    )
}

/// Token `i` again, as choice 1 (a stream with `n > 1`).
pub(crate) fn second_choice(g: &Gen, i: u32) -> Bytes {
    sse_data(&json!({
        "id": g.id(), "object": "chat.completion.chunk", "created": g.created,
        "model": g.model(),
        "choices": [{"index": 1, "delta": {"content": token_text(i)}, "finish_reason": null}],
    }))
}

/// Tool-input JSON for a content block that was never started.
pub(crate) fn orphan_delta() -> Bytes {
    sse_event(
        "content_block_delta",
        &json!({"type": "content_block_delta", "index": 7,
                "delta": {"type": "input_json_delta", "partial_json": "{\"x\": 1}"}}),
    )
}

/// Frames before the first token.
pub(crate) fn prelude(g: &Gen) -> Vec<Bytes> {
    let thoughts =
        (0..g.reasoning).map(|i| oa_chunk(g, json!({"reasoning_content": thought_text(i)}), None));
    match (g.dialect, &g.req.tool) {
        (MockKind::Openai, None) => {
            let mut out = vec![oa_chunk(
                g,
                json!({"role": "assistant", "content": ""}),
                None,
            )];
            out.extend(thoughts);
            out
        }
        (MockKind::Openai, Some(name)) => {
            let mut out = vec![oa_chunk(
                g,
                json!({"role": "assistant", "content": null}),
                None,
            )];
            out.extend(thoughts);
            out.push(oa_chunk(
                g,
                json!({"tool_calls": [{"index": 0, "id": g.call_id(), "type": "function",
                                       "function": {"name": name, "arguments": ""}}]}),
                None,
            ));
            out.push(oa_args(g, &g.args.open));
            out
        }
        (MockKind::Anthropic, tool) => {
            let start = sse_event(
                "message_start",
                &json!({"type": "message_start", "message": {
                    "id": g.id(), "type": "message", "role": "assistant", "content": [],
                    "model": g.model(), "stop_reason": null, "stop_sequence": null,
                    "usage": g.an_usage(1)}}),
            );
            let block = match tool {
                None => json!({"type": "text", "text": ""}),
                Some(name) => {
                    json!({"type": "tool_use", "id": g.call_id(), "name": name, "input": {}})
                }
            };
            let ping = Bytes::from_static(b"event: ping\ndata: {\"type\": \"ping\"}\n\n");
            let open = sse_event(
                "content_block_start",
                &json!({"type": "content_block_start", "index": g.block_index(),
                        "content_block": block}),
            );
            let mut out = vec![start];
            match &g.anthropic.thinking {
                Some((text, signature)) => {
                    out.extend(thinking_frames(text, signature, ping));
                    out.push(open);
                }
                None => out.extend([open, ping]),
            }
            if tool.is_some() {
                out.push(an_args(g, &g.args.open));
            }
            out
        }
        (MockKind::Gemini, _) => super::gemini::prelude(g),
    }
}

/// A whole thinking block at index 0 as Anthropic streams it: start, the
/// ping, the text in two deltas, the signature, stop.
fn thinking_frames(text: &str, signature: &str, ping: Bytes) -> Vec<Bytes> {
    let delta = |d: Value| {
        sse_event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": 0, "delta": d}),
        )
    };
    let cut = text.find(' ').unwrap_or(text.len());
    vec![
        sse_event(
            "content_block_start",
            &json!({"type": "content_block_start", "index": 0,
                    "content_block": {"type": "thinking", "thinking": "", "signature": ""}}),
        ),
        ping,
        delta(json!({"type": "thinking_delta", "thinking": &text[..cut]})),
        delta(json!({"type": "thinking_delta", "thinking": &text[cut..]})),
        delta(json!({"type": "signature_delta", "signature": signature})),
        sse_event(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": 0}),
        ),
    ]
}

/// The frame carrying token `i`.
pub(crate) fn token(g: &Gen, i: u32) -> Bytes {
    let mut t = if g.slot() {
        token_text(i)
    } else {
        String::new()
    };
    if i > 0 && i == g.req.continue_from {
        // The prefill ends without the space after its last token.
        t.insert(0, ' ');
    }
    if i == 0 && g.json() {
        t.insert_str(0, &g.json.open);
    }
    if t.len() < g.pad {
        t.extend(std::iter::repeat_n('x', g.pad - t.len()));
    }
    match (g.dialect, g.req.tool.is_some()) {
        (MockKind::Openai, false) => oa_chunk(g, json!({"content": t}), None),
        (MockKind::Openai, true) => oa_args(g, &t),
        (MockKind::Anthropic, false) => sse_event(
            "content_block_delta",
            &json!({"type": "content_block_delta", "index": g.block_index(),
                    "delta": {"type": "text_delta", "text": t}}),
        ),
        (MockKind::Anthropic, true) => an_args(g, &t),
        (MockKind::Gemini, _) => super::gemini::token(g, t),
    }
}

/// Frames after `k` tokens: closing fragment, finish, usage, terminator.
pub(crate) fn epilogue(g: &Gen, finish: Finish, k: u32, terminator: bool) -> Vec<Bytes> {
    let mut out = Vec::new();
    let reason = g.finish_str(finish);
    match g.dialect {
        MockKind::Openai => {
            if finish == Finish::Tool && !g.args.close.is_empty() {
                out.push(oa_args(g, &g.args.close));
            }
            if g.json() && finish != Finish::Refusal {
                let close = if k == 0 {
                    format!("{}{}", g.json.open, g.json.close)
                } else {
                    g.json.close.clone()
                };
                if !close.is_empty() {
                    out.push(oa_chunk(g, json!({"content": close}), None));
                }
            }
            out.push(oa_chunk(g, json!({}), Some(reason)));
            if g.req.include_usage {
                out.push(sse_data(&json!({
                    "id": g.id(), "object": "chat.completion.chunk", "created": g.created,
                    "model": g.model(), "system_fingerprint": null, "choices": [],
                    "usage": oa_usage(g, k)})));
            }
            if terminator {
                out.push(done());
            }
        }
        MockKind::Anthropic => {
            if finish == Finish::Tool && !g.args.close.is_empty() {
                out.push(an_args(g, &g.args.close));
            }
            if g.json() && finish != Finish::Refusal {
                let close = if k == 0 {
                    format!("{}{}", g.json.open, g.json.close)
                } else {
                    g.json.close.clone()
                };
                if !close.is_empty() {
                    out.push(sse_event(
                        "content_block_delta",
                        &json!({"type": "content_block_delta", "index": g.block_index(),
                                "delta": {"type": "text_delta", "text": close}}),
                    ));
                }
            }
            out.push(sse_event(
                "content_block_stop",
                &json!({"type": "content_block_stop", "index": g.block_index()}),
            ));
            let mut delta = json!({"stop_reason": reason, "stop_sequence": null});
            if finish == Finish::Refusal {
                delta["stop_details"] =
                    json!({"type": "refusal", "category": null, "explanation": null});
            }
            out.push(sse_event(
                "message_delta",
                &json!({"type": "message_delta", "delta": delta,
                        "usage": {"output_tokens": k + g.anthropic.thinking_tokens(),
                                  "service_tier": served_tier(g)}}),
            ));
            if terminator {
                out.push(sse_event("message_stop", &json!({"type": "message_stop"})));
            }
        }
        MockKind::Gemini => {
            // Calls come whole; a stream's only terminator is its finish reason.
            let args = format!("{}{}{}", g.args.open, text_of(k), g.args.close);
            let close = (g.json() && finish != Finish::Refusal).then(|| {
                if k == 0 {
                    format!("{}{}", g.json.open, g.json.close)
                } else {
                    g.json.close.clone()
                }
            });
            out.extend(super::gemini::epilogue(
                g, finish, k, &args, close, terminator,
            ));
        }
    }
    out
}

/// An in-stream error frame (OpenAI `data: {"error":..}`, Anthropic `event: error`).
pub(crate) fn error_frame(g: &Gen, error_type: Option<&str>, message: Option<&str>) -> Bytes {
    match g.dialect {
        MockKind::Openai => sse_data(&json!({"error": {
            "message": message.unwrap_or("The server had an error while processing your request. Sorry about that!"),
            "type": error_type.unwrap_or("server_error"), "param": null, "code": null}})),
        MockKind::Anthropic => sse_event(
            "error",
            &json!({"type": "error", "error": {
                "type": error_type.unwrap_or("overloaded_error"),
                "message": message.unwrap_or("Overloaded")}}),
        ),
        MockKind::Gemini => super::gemini::error_frame(error_type, message),
    }
}

/// A frame whose JSON is cut off.
pub(crate) fn malformed_frame(g: &Gen) -> Bytes {
    match g.dialect {
        MockKind::Openai => Bytes::from_static(b"data: {\"choices\":[{\"delta\":\n\n"),
        MockKind::Anthropic => Bytes::from_static(
            b"event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":\n\n",
        ),
        MockKind::Gemini => super::gemini::malformed_frame(),
    }
}

/// llama.cpp's legacy non-standard `error:` field line, then `data: [DONE]`.
pub(crate) fn legacy_error(code: u16, message: Option<&str>) -> Bytes {
    let (ty, msg) = if code == 400 {
        (
            "exceed_context_size_error",
            "the request exceeds the available context size, try increasing it",
        )
    } else {
        ("server_error", "internal server error")
    };
    let v = json!({"code": code, "message": message.unwrap_or(msg), "type": ty});
    Bytes::from(format!("error: {v}\n\ndata: [DONE]\n\n"))
}

// ---- Non-streaming ----------------------------------------------------------

/// OpenAI's usage: cached tokens inside `prompt_tokens`, reasoning inside
/// `completion_tokens`, each also in its details object.
fn oa_usage(g: &Gen, k: u32) -> Value {
    let output = k + g.reasoning;
    json!({"prompt_tokens": g.req.input_tokens, "completion_tokens": output,
           "total_tokens": g.req.input_tokens + output,
           "prompt_tokens_details": {"cached_tokens": g.req.cached_tokens.min(g.req.input_tokens), "audio_tokens": 0},
           "completion_tokens_details": {"reasoning_tokens": g.reasoning, "audio_tokens": 0,
               "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0}})
}

/// A whole non-streaming answer with `k` tokens.
pub(crate) fn full_body(g: &Gen, finish: Finish, k: u32) -> Bytes {
    let tokens = if g.slot() { text_of(k) } else { String::new() };
    let text = if g.json() && finish != Finish::Refusal {
        format!("{}{tokens}{}", g.json.open, g.json.close)
    } else {
        tokens.clone()
    };
    let args = if finish == Finish::Tool {
        format!("{}{tokens}{}", g.args.open, g.args.close)
    } else {
        format!("{}{tokens}", g.args.open)
    };
    let v = match g.dialect {
        MockKind::Openai => {
            let mut message = match &g.req.tool {
                None => json!({"role": "assistant", "content": text, "refusal": null}),
                Some(name) => json!({"role": "assistant", "content": null, "refusal": null,
                    "tool_calls": [{"id": g.call_id(), "type": "function",
                                    "function": {"name": name, "arguments": args}}]}),
            };
            if g.reasoning > 0 {
                message["reasoning_content"] = (0..g.reasoning)
                    .map(thought_text)
                    .collect::<String>()
                    .into();
            }
            json!({"id": g.id(), "object": "chat.completion", "created": g.created,
                   "model": g.model(), "system_fingerprint": null, "service_tier": served_tier(g),
                   "choices": [{"index": 0, "message": message, "logprobs": null,
                                "finish_reason": g.finish_str(finish)}],
                   "usage": oa_usage(g, k)})
        }
        MockKind::Anthropic => {
            let mut content: Vec<Value> = g
                .anthropic
                .thinking
                .iter()
                .map(|(t, s)| json!({"type": "thinking", "thinking": t, "signature": s}))
                .collect();
            content.push(match &g.req.tool {
                None => json!({"type": "text", "text": text}),
                Some(name) => {
                    let input: Value = serde_json::from_str(&args).unwrap_or_else(|_| json!({}));
                    json!({"type": "tool_use", "id": g.call_id(), "name": name, "input": input})
                }
            });
            json!({"id": g.id(), "type": "message", "role": "assistant", "model": g.model(),
                   "content": content, "stop_reason": g.finish_str(finish), "stop_sequence": null,
                   "usage": g.an_usage(k)})
        }
        MockKind::Gemini => {
            let args = format!("{}{tokens}{}", g.args.open, g.args.close);
            super::gemini::full_body(g, finish, k, &text, &args)
        }
    };
    Bytes::from(v.to_string())
}

/// A non-streaming body cut inside its JSON.
pub(crate) fn malformed_body(g: &Gen) -> Bytes {
    Bytes::from(format!(
        "{{\"id\":\"{}\",\"choices\":[{{\"message\":",
        g.id()
    ))
}

// ---- Errors -----------------------------------------------------------------

fn oa_error(message: &str, ty: &str, param: Option<&str>, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": ty, "param": param, "code": code}})
}

fn an_error(ty: &str, message: &str, request_id: &str) -> Value {
    json!({"type": "error", "error": {"type": ty, "message": message}, "request_id": request_id})
}

/// The real status and body of `preset` in `dialect`.
pub(crate) fn preset_error(
    dialect: MockKind,
    preset: Preset,
    model: &str,
    request_id: &str,
) -> (u16, Value) {
    match dialect {
        MockKind::Openai => match preset {
            Preset::RateLimit => (429, oa_error(
                &format!("Rate limit reached for {model} in organization org-mock on tokens per min (TPM): Limit 200000, Used 195869, Requested 4412. Please try again in 84ms. Visit https://platform.openai.com/account/rate-limits to learn more."),
                "tokens", None, Some("rate_limit_exceeded"))),
            Preset::InsufficientQuota | Preset::SpendLimit => (429, oa_error(
                "You exceeded your current quota, please check your plan and billing details. For more information on this error, read the docs: https://platform.openai.com/docs/guides/error-codes/api-errors.",
                "insufficient_quota", None, Some("insufficient_quota"))),
            Preset::RequestTooLarge => (429, oa_error(
                "Request too large for gpt-4o in organization org-mock on tokens per min (TPM): Limit 30000, Requested 34307. The input or output tokens must be reduced in order to run successfully. Visit https://platform.openai.com/account/rate-limits to learn more.",
                "tokens", None, Some("rate_limit_exceeded"))),
            Preset::Overloaded => (503, oa_error(
                "The engine is currently overloaded, please try again later.",
                "server_error", None, None)),
            Preset::SlowDown => (503, oa_error("Slow Down", "server_error", None, None)),
            Preset::ServerError => (500, oa_error(
                "The server had an error while processing your request. Sorry about that!",
                "server_error", None, None)),
            Preset::Auth => (401, oa_error(
                &format!("Incorrect API key provided: {AUTH_MARKER}. You can find your API key at https://platform.openai.com/account/api-keys."),
                "invalid_request_error", None, Some("invalid_api_key"))),
            Preset::Invalid => (400, oa_error(
                "Invalid value for 'messages': the request is invalid.",
                "invalid_request_error", Some("messages"), None)),
            Preset::ContextLength => (400, oa_error(
                "This model's maximum context length is 128000 tokens. However, your messages resulted in 130000 tokens. Please reduce the length of the messages.",
                "invalid_request_error", Some("messages"), Some("context_length_exceeded"))),
            Preset::NotFound => (404, oa_error(
                &format!("The model `{model}` does not exist or you do not have access to it."),
                "invalid_request_error", None, Some("model_not_found"))),
            Preset::ContentFilter => (400, json!({"error": {
                "message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy. Please modify your prompt and retry.",
                "type": null, "param": "prompt", "code": "content_filter", "status": 400,
                "innererror": {"code": "ResponsibleAIPolicyViolation", "content_filter_result": {
                    "hate": {"filtered": true, "severity": "high"},
                    "self_harm": {"filtered": false, "severity": "safe"},
                    "sexual": {"filtered": false, "severity": "safe"},
                    "violence": {"filtered": false, "severity": "safe"}}}}})),
        },
        MockKind::Anthropic => match preset {
            Preset::RateLimit => (429, an_error("rate_limit_error",
                "This request would exceed the rate limit for your organization of 50 requests per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits.",
                request_id)),
            Preset::InsufficientQuota | Preset::SpendLimit => {
                let mut v = an_error("rate_limit_error",
                    "You have reached your API usage limits. You will regain access on 2099-01-01 at 00:00 UTC.",
                    request_id);
                v["error"]["details"] = json!({"error_code": "enforced_spend_limit_reached"});
                (429, v)
            }
            Preset::RequestTooLarge => (413, an_error("request_too_large",
                "Request exceeds the maximum allowed number of bytes.", request_id)),
            Preset::Overloaded | Preset::SlowDown => {
                (529, an_error("overloaded_error", "Overloaded", request_id))
            }
            Preset::ServerError => (500, an_error("api_error", "Internal server error", request_id)),
            Preset::Auth => (401, an_error("authentication_error",
                &format!("invalid x-api-key ({AUTH_MARKER})"), request_id)),
            Preset::Invalid => (400, an_error("invalid_request_error",
                "messages: field required", request_id)),
            Preset::ContextLength => (400, an_error("invalid_request_error",
                "prompt is too long: 210000 tokens > 200000 maximum", request_id)),
            Preset::NotFound => (404, an_error("not_found_error",
                &format!("model: {model}"), request_id)),
            Preset::ContentFilter => (400, an_error("invalid_request_error",
                "Output blocked by content filtering policy", request_id)),
        },
        MockKind::Gemini => super::gemini::preset_error(preset, model),
    }
}

/// The body of an over-capacity rejection (503 OpenAI / 529 Anthropic).
pub(crate) fn over_capacity(dialect: MockKind, request_id: &str) -> (u16, Value) {
    preset_error(dialect, Preset::Overloaded, "mock-model", request_id)
}

/// A 400 for a body that is not JSON.
pub(crate) fn bad_json(dialect: MockKind, request_id: &str) -> (u16, Value) {
    match dialect {
        MockKind::Openai => (
            400,
            oa_error(
                "We could not parse the JSON body of your request.",
                "invalid_request_error",
                None,
                None,
            ),
        ),
        MockKind::Anthropic => (
            400,
            an_error(
                "invalid_request_error",
                "There was an error parsing the body of your request.",
                request_id,
            ),
        ),
        MockKind::Gemini => super::gemini::bad_json(),
    }
}

impl Gen {
    pub(crate) fn model_name(&self) -> &str {
        self.model()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn anthropic_input_counts_the_system_prompt_and_tools() {
        let messages = json!([{"role": "user", "content": "hi"}]);
        let plain = json!({"messages": messages});
        let with = json!({"messages": messages, "system": "s".repeat(4000),
                          "tools": [{"name": "t", "input_schema": {}}]});
        let tokens = |kind, body: &Value| Parsed::from_body(kind, body).input_tokens;
        let base = tokens(MockKind::Anthropic, &plain);
        assert!(tokens(MockKind::Anthropic, &with) > base + 1000);
        // OpenAI's system turn is a message; other top-level fields are not input.
        assert_eq!(tokens(MockKind::Openai, &with), base);
    }
}
