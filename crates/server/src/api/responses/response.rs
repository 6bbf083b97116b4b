//! A response in OpenAI's shape: the output items an answer's chunks make
//! (reasoning, a message, function and custom tool calls), each with the
//! stream events that open, fill and close it; the `response` object with
//! its status, usage (input counts every input token, as OpenAI's does) and
//! the echo of the request; and the wrapper that lets a reasoning block of
//! any dialect travel as `encrypted_content` and come back whole.

use std::collections::HashMap;

use base64::Engine;

use super::request::{custom_input, ToolNames};
use super::*;
use crate::api::errors::CallerError;
use crate::chat::{Chunk, ReasoningDelta, ToolCallDelta};

/// One response's identity and the request parameters it echoes.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub(super) struct Meta {
    pub(super) id: String,
    pub(super) created_at: u64,
    pub(super) background: bool,
    pub(super) store: bool,
    pub(super) previous_response_id: Option<String>,
    pub(super) echo: Map<String, Value>,
}

/// How a response ended (or where it is).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Status {
    Queued,
    InProgress,
    Completed,
    /// `max_output_tokens` or `content_filter`.
    Incomplete(&'static str),
    /// `error.code` and `error.message`.
    Failed(String, String),
    Cancelled,
}

impl Status {
    fn as_str(&self) -> &'static str {
        match self {
            Status::Queued => "queued",
            Status::InProgress => "in_progress",
            Status::Completed => "completed",
            Status::Incomplete(_) => "incomplete",
            Status::Failed(..) => "failed",
            Status::Cancelled => "cancelled",
        }
    }

    /// How an answer that finished ended.
    pub(super) fn of_finish(f: FinishReason) -> Status {
        match f {
            FinishReason::Stop | FinishReason::ToolCalls => Status::Completed,
            FinishReason::Length => Status::Incomplete("max_output_tokens"),
            FinishReason::ContentFilter | FinishReason::Refusal => {
                Status::Incomplete("content_filter")
            }
        }
    }

    /// A request that failed: OpenAI's error code for its class, our message.
    pub(super) fn of_error(e: &RequestError) -> Status {
        Status::of_caller(CallerError::from(e))
    }

    /// A failure as the table's row says it: OpenAI's code, our message.
    pub(super) fn of_caller(e: CallerError) -> Status {
        Status::Failed(e.entry().responses_code().into(), e.message)
    }

    /// Whether the stream's last event is this one.
    pub(super) fn terminal_event(&self) -> &'static str {
        match self {
            Status::Completed => "response.completed",
            Status::Incomplete(_) => "response.incomplete",
            Status::Cancelled | Status::Failed(..) => "response.failed",
            Status::Queued => "response.queued",
            Status::InProgress => "response.in_progress",
        }
    }
}

/// The `response` object.
pub(super) fn object(meta: &Meta, status: &Status, output: Vec<Value>, usage: Value) -> Value {
    let mut o = meta.echo.clone();
    o.insert("id".into(), json!(meta.id));
    o.insert("object".into(), json!("response"));
    o.insert("created_at".into(), json!(meta.created_at));
    o.insert("status".into(), json!(status.as_str()));
    o.insert("background".into(), json!(meta.background));
    o.insert("store".into(), json!(meta.store));
    o.insert(
        "previous_response_id".into(),
        json!(meta.previous_response_id),
    );
    o.insert(
        "error".into(),
        match status {
            Status::Failed(code, message) => json!({"code": code, "message": message}),
            _ => Value::Null,
        },
    );
    o.insert(
        "incomplete_details".into(),
        match status {
            Status::Incomplete(reason) => json!({ "reason": reason }),
            _ => Value::Null,
        },
    );
    o.insert("output".into(), Value::Array(output));
    o.insert("usage".into(), usage);
    Value::Object(o)
}

/// OpenAI's usage: input counts every input token (cached ones too).
pub(super) fn usage_json(u: &proto::Usage) -> Value {
    let input = u64::from(u.input_tokens)
        + u64::from(u.cache_read_input_tokens)
        + u64::from(u.cache_write_input_tokens);
    json!({
        "input_tokens": input,
        "input_tokens_details": {"cached_tokens": u.cache_read_input_tokens},
        "output_tokens": u.output_tokens,
        "output_tokens_details": {"reasoning_tokens": u.reasoning_tokens},
        "total_tokens": input + u64::from(u.output_tokens),
    })
}

/// `encrypted_content` of a block from another dialect (or redacted):
/// this prefix, then the block as base64url JSON.
const WRAPPED: &str = "swy1.";

/// A reasoning block as `encrypted_content`: OpenAI's own blob as it came,
/// anything else wrapped so it comes back whole.
pub(super) fn wrap_reasoning(b: &proto::ReasoningBlock) -> Option<String> {
    if b.dialect == "openai" && b.redacted_data.is_empty() && !b.signature.is_empty() {
        return Some(b.signature.clone());
    }
    if b.signature.is_empty() && b.redacted_data.is_empty() {
        return None;
    }
    let json = json!({
        "text": b.text, "signature": b.signature,
        "redacted": b.redacted_data, "dialect": b.dialect,
    });
    Some(format!(
        "{WRAPPED}{}",
        base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(json.to_string())
    ))
}

/// The block a wrapped `encrypted_content` holds.
pub(super) fn unwrap_reasoning(encrypted: &str) -> Option<proto::ReasoningBlock> {
    let data = encrypted.strip_prefix(WRAPPED)?;
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(data)
        .ok()?;
    let v: Value = serde_json::from_slice(&bytes).ok()?;
    let s = |k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    Some(proto::ReasoningBlock {
        text: s("text"),
        signature: s("signature"),
        redacted_data: s("redacted"),
        dialect: s("dialect"),
    })
}

/// An SSE event before its sequence number.
pub(super) struct Frame {
    pub(super) kind: &'static str,
    pub(super) data: Value,
}

fn frame(kind: &'static str, data: Value) -> Frame {
    Frame { kind, data }
}

/// One output item as it is built.
#[derive(Debug, Clone)]
enum Item {
    Reasoning {
        block: proto::ReasoningBlock,
        /// Its signature arrived: the block is whole.
        sealed: bool,
    },
    Message {
        text: String,
    },
    Call {
        call_id: String,
        /// The upstream's (flattened) name.
        name: String,
        arguments: String,
    },
}

/// The output items of one answer, built from its chunks, with the stream
/// events each step makes.
pub(super) struct Output {
    /// Item ids are `<kind>_<base>_<index>`: the same on every replay.
    base: String,
    names: ToolNames,
    items: Vec<Item>,
    /// The item receiving deltas, if one is open.
    open: Option<usize>,
    /// Upstream tool-call index -> item.
    calls: HashMap<u32, usize>,
    /// The answer stopped early (its message is `incomplete`).
    cut: bool,
}

impl Output {
    pub(super) fn new(response_id: &str, names: ToolNames) -> Output {
        Output {
            base: response_id
                .strip_prefix("resp_")
                .unwrap_or(response_id)
                .to_string(),
            names,
            items: Vec::new(),
            open: None,
            calls: HashMap::new(),
            cut: false,
        }
    }

    fn item_id(&self, i: usize) -> String {
        let kind = match &self.items[i] {
            Item::Reasoning { .. } => "rs",
            Item::Message { .. } => "msg",
            Item::Call { name, .. } if self.is_custom(name) => "ctc",
            Item::Call { .. } => "fc",
        };
        format!("{kind}_{}_{i}", self.base)
    }

    fn is_custom(&self, name: &str) -> bool {
        self.names.get(name).is_some_and(|n| n.custom)
    }

    /// Folds one chunk in, adding the events it makes to `out`.
    pub(super) fn push(&mut self, chunk: Chunk, out: &mut Vec<Frame>) {
        match chunk {
            Chunk::Text(text) => {
                if text.is_empty() {
                    return;
                }
                let i = match self.open {
                    Some(i) if matches!(self.items[i], Item::Message { .. }) => i,
                    _ => self.open_item(
                        Item::Message {
                            text: String::new(),
                        },
                        out,
                    ),
                };
                if let Item::Message { text: all } = &mut self.items[i] {
                    all.push_str(&text);
                }
                out.push(frame(
                    "response.output_text.delta",
                    json!({"item_id": self.item_id(i), "output_index": i, "content_index": 0,
                           "delta": text, "logprobs": []}),
                ));
            }
            Chunk::ToolCall(call) => self.push_call(*call, out),
            Chunk::Reasoning(r) => self.push_reasoning(*r, out),
        }
    }

    fn push_call(&mut self, call: ToolCallDelta, out: &mut Vec<Frame>) {
        let ToolCallDelta {
            index,
            id,
            name,
            arguments,
        } = call;
        let i = match self.calls.get(&index) {
            Some(&i) => i,
            None => {
                let i = self.open_item(
                    Item::Call {
                        call_id: id.unwrap_or_default(),
                        name: name.unwrap_or_default(),
                        arguments: String::new(),
                    },
                    out,
                );
                self.calls.insert(index, i);
                i
            }
        };
        if arguments.is_empty() {
            return;
        }
        let custom = match &mut self.items[i] {
            Item::Call {
                name, arguments: a, ..
            } => {
                a.push_str(&arguments);
                self.names.get(name.as_str()).is_some_and(|n| n.custom)
            }
            _ => return,
        };
        // A custom tool's input is known only whole (the upstream streams
        // the JSON around it): it goes out when the call closes.
        if !custom {
            out.push(frame(
                "response.function_call_arguments.delta",
                json!({"item_id": self.item_id(i), "output_index": i, "delta": arguments}),
            ));
        }
    }

    fn push_reasoning(&mut self, delta: ReasoningDelta, out: &mut Vec<Frame>) {
        let ReasoningDelta {
            text,
            signature,
            redacted,
        } = delta;
        if let Some(data) = redacted {
            let i = self.open_item(
                Item::Reasoning {
                    block: proto::ReasoningBlock {
                        redacted_data: data,
                        dialect: "anthropic".into(),
                        ..Default::default()
                    },
                    sealed: true,
                },
                out,
            );
            self.close_item(i, out);
            return;
        }
        let i = match self.open {
            Some(i) if matches!(self.items[i], Item::Reasoning { sealed: false, .. }) => i,
            _ => self.open_item(
                Item::Reasoning {
                    block: proto::ReasoningBlock::default(),
                    sealed: false,
                },
                out,
            ),
        };
        if let Item::Reasoning { block, sealed } = &mut self.items[i] {
            block.text.push_str(&text);
            if let Some(sig) = signature {
                block.signature = sig;
                // Only Anthropic's wire signs blocks as it streams them.
                block.dialect = "anthropic".into();
                *sealed = true;
            }
        }
        if !text.is_empty() {
            out.push(frame(
                "response.reasoning_text.delta",
                json!({"item_id": self.item_id(i), "output_index": i, "content_index": 0, "delta": text}),
            ));
        }
    }

    /// Closes the open item and opens `item`; returns its index.
    fn open_item(&mut self, item: Item, out: &mut Vec<Frame>) -> usize {
        if let Some(open) = self.open.take() {
            self.close_item(open, out);
        }
        let i = self.items.len();
        self.items.push(item);
        let mut added = self.item_json(i, false);
        if let Some(o) = added.as_object_mut() {
            o.insert("status".into(), json!("in_progress"));
            match &self.items[i] {
                Item::Message { .. } => {
                    o.insert("content".into(), json!([]));
                }
                Item::Call { .. } if o.contains_key("input") => {
                    o.insert("input".into(), json!(""));
                }
                Item::Call { .. } => {
                    o.insert("arguments".into(), json!(""));
                }
                Item::Reasoning { .. } => {
                    o.remove("content");
                    o.remove("encrypted_content");
                }
            }
        }
        out.push(frame(
            "response.output_item.added",
            json!({"output_index": i, "item": added}),
        ));
        if let Item::Message { .. } = &self.items[i] {
            out.push(frame(
                "response.content_part.added",
                json!({"item_id": self.item_id(i), "output_index": i, "content_index": 0,
                       "part": {"type": "output_text", "text": "", "annotations": [], "logprobs": []}}),
            ));
        }
        let sealed = matches!(self.items[i], Item::Reasoning { sealed: true, .. });
        if !sealed {
            self.open = Some(i);
        }
        i
    }

    /// The events that close item `i`.
    fn close_item(&mut self, i: usize, out: &mut Vec<Frame>) {
        let id = self.item_id(i);
        match &self.items[i] {
            Item::Message { text } => {
                out.push(frame(
                    "response.output_text.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0, "text": text, "logprobs": []}),
                ));
                out.push(frame(
                    "response.content_part.done",
                    json!({"item_id": id, "output_index": i, "content_index": 0,
                           "part": {"type": "output_text", "text": text, "annotations": [], "logprobs": []}}),
                ));
            }
            Item::Call {
                name, arguments, ..
            } if self.is_custom(name) => {
                let input = custom_input(arguments);
                out.push(frame(
                    "response.custom_tool_call_input.delta",
                    json!({"item_id": id, "output_index": i, "delta": input}),
                ));
                out.push(frame(
                    "response.custom_tool_call_input.done",
                    json!({"item_id": id, "output_index": i, "input": input}),
                ));
            }
            Item::Call {
                name, arguments, ..
            } => {
                let shown = self.names.get(name).map_or(name.as_str(), |n| &n.name);
                out.push(frame(
                    "response.function_call_arguments.done",
                    json!({"item_id": id, "output_index": i, "name": shown, "arguments": arguments}),
                ));
            }
            Item::Reasoning { block, .. } => {
                if !block.text.is_empty() {
                    out.push(frame(
                        "response.reasoning_text.done",
                        json!({"item_id": id, "output_index": i, "content_index": 0, "text": block.text}),
                    ));
                }
            }
        }
        out.push(frame(
            "response.output_item.done",
            json!({"output_index": i, "item": self.item_json(i, self.cut)}),
        ));
    }

    /// Closes the open item: the answer is over (`cut` when it stopped early).
    pub(super) fn finish(&mut self, cut: bool, out: &mut Vec<Frame>) {
        self.cut = cut;
        if let Some(open) = self.open.take() {
            self.close_item(open, out);
        }
    }

    /// Item `i` as the response's `output` shows it.
    fn item_json(&self, i: usize, cut: bool) -> Value {
        let id = self.item_id(i);
        match &self.items[i] {
            Item::Message { text } => json!({
                "type": "message", "id": id, "role": "assistant",
                "status": if cut { "incomplete" } else { "completed" },
                "content": [{"type": "output_text", "text": text, "annotations": [], "logprobs": []}],
            }),
            Item::Call {
                call_id,
                name,
                arguments,
            } => {
                let named = self.names.get(name);
                let mut item = match named {
                    Some(n) if n.custom => json!({
                        "type": "custom_tool_call", "id": id, "call_id": call_id,
                        "name": n.name, "input": custom_input(arguments), "status": "completed",
                    }),
                    _ => json!({
                        "type": "function_call", "id": id, "call_id": call_id,
                        "name": named.map_or(name.as_str(), |n| &n.name),
                        "arguments": arguments, "status": "completed",
                    }),
                };
                if let (Some(ns), Some(o)) = (
                    named.and_then(|n| n.namespace.as_ref()),
                    item.as_object_mut(),
                ) {
                    o.insert("namespace".into(), json!(ns));
                }
                item
            }
            Item::Reasoning { block, .. } => {
                let mut item = json!({"type": "reasoning", "id": id, "summary": []});
                if let Some(o) = item.as_object_mut() {
                    if !block.text.is_empty() {
                        o.insert(
                            "content".into(),
                            json!([{"type": "reasoning_text", "text": block.text}]),
                        );
                    }
                    if let Some(enc) = wrap_reasoning(block) {
                        o.insert("encrypted_content".into(), json!(enc));
                    }
                }
                item
            }
        }
    }

    /// The output items.
    pub(super) fn items_json(&self) -> Vec<Value> {
        (0..self.items.len())
            .map(|i| self.item_json(i, self.cut))
            .collect()
    }

    /// The answer as the assistant turn of the conversation it continues.
    pub(super) fn assistant_turn(&self) -> Option<proto::Message> {
        let mut m = proto::Message {
            role: "assistant".into(),
            ..Default::default()
        };
        for item in &self.items {
            match item {
                Item::Reasoning { block, .. } => {
                    if !block.signature.is_empty() || !block.redacted_data.is_empty() {
                        m.parts.push(proto::ContentPart {
                            part: Some(proto::content_part::Part::Reasoning(block.clone())),
                            cache_control: None,
                        });
                    }
                }
                Item::Message { text } if !text.is_empty() => m.parts.push(proto::ContentPart {
                    part: Some(proto::content_part::Part::Text(text.clone())),
                    cache_control: None,
                }),
                Item::Message { .. } => {}
                Item::Call {
                    call_id,
                    name,
                    arguments,
                } => m.tool_calls.push(proto::ToolCall {
                    id: call_id.clone(),
                    name: name.clone(),
                    arguments: arguments.clone(),
                }),
            }
        }
        (!m.parts.is_empty() || !m.tool_calls.is_empty()).then_some(m)
    }
}

/// The chunks that rebuild a finished answer (a job's result, a stored
/// response replayed): reasoning, the text, then each tool call whole.
pub(super) fn chunks_of(r: &proto::CompletionResponse) -> Vec<Chunk> {
    let mut out = Vec::new();
    for b in &r.reasoning {
        if !b.redacted_data.is_empty() {
            out.push(Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
                text: String::new(),
                signature: None,
                redacted: Some(b.redacted_data.clone()),
            })));
            continue;
        }
        out.push(Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
            text: b.text.clone(),
            signature: (!b.signature.is_empty()).then(|| b.signature.clone()),
            redacted: None,
        })));
    }
    if !r.text.is_empty() {
        out.push(Chunk::Text(r.text.as_str().into()));
    }
    for (i, c) in r.tool_calls.iter().enumerate() {
        out.push(Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
            index: i as u32,
            id: Some(c.id.clone()),
            name: Some(c.name.clone()),
            arguments: c.arguments.clone(),
        })));
    }
    out
}

/// A finished answer's parts, for [`chunks_of`], from its stored output items.
pub(super) fn answer_of_items(items: &[Value], names: &ToolNames) -> proto::CompletionResponse {
    let mut r = proto::CompletionResponse::default();
    let flat = |item: &Value| {
        let name = item.get("name").and_then(Value::as_str).unwrap_or_default();
        let ns = item.get("namespace").and_then(Value::as_str);
        let custom = item.get("type").and_then(Value::as_str) == Some("custom_tool_call");
        names
            .iter()
            .find(|(_, n)| n.name == name && n.custom == custom && n.namespace.as_deref() == ns)
            .map_or_else(|| name.to_string(), |(f, _)| f.clone())
    };
    for item in items {
        let s = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or_default();
        match s("type") {
            "reasoning" => {
                let text = item
                    .pointer("/content/0/text")
                    .and_then(Value::as_str)
                    .unwrap_or_default();
                let block = match unwrap_reasoning(s("encrypted_content")) {
                    Some(b) => b,
                    None => proto::ReasoningBlock {
                        text: text.to_string(),
                        signature: s("encrypted_content").to_string(),
                        dialect: if s("encrypted_content").is_empty() {
                            String::new()
                        } else {
                            "openai".into()
                        },
                        ..Default::default()
                    },
                };
                r.reasoning.push(block);
            }
            "message" => {
                if let Some(parts) = item.get("content").and_then(Value::as_array) {
                    for p in parts {
                        r.text
                            .push_str(p.get("text").and_then(Value::as_str).unwrap_or_default());
                    }
                }
            }
            "function_call" => r.tool_calls.push(proto::ToolCall {
                id: s("call_id").to_string(),
                name: flat(item),
                arguments: s("arguments").to_string(),
            }),
            "custom_tool_call" => r.tool_calls.push(proto::ToolCall {
                id: s("call_id").to_string(),
                name: flat(item),
                arguments: super::request::custom_arguments(s("input")),
            }),
            _ => {}
        }
    }
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::super::request::ToolName;
    use super::*;

    fn kinds(frames: &[Frame]) -> Vec<&'static str> {
        frames.iter().map(|f| f.kind).collect()
    }

    #[test]
    fn reasoning_then_text_then_a_call_open_and_close_in_openai_order() {
        let mut o = Output::new("resp_x", ToolNames::new());
        let mut f = Vec::new();
        o.push(
            Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
                text: "think".into(),
                signature: None,
                redacted: None,
            })),
            &mut f,
        );
        o.push(
            Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
                text: String::new(),
                signature: Some("sig".into()),
                redacted: None,
            })),
            &mut f,
        );
        o.push(Chunk::Text("hel".into()), &mut f);
        o.push(Chunk::Text("lo".into()), &mut f);
        o.push(
            Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
                index: 0,
                id: Some("call_1".into()),
                name: Some("f".into()),
                arguments: "{\"a\":".into(),
            })),
            &mut f,
        );
        o.push(
            Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
                index: 0,
                id: None,
                name: None,
                arguments: "1}".into(),
            })),
            &mut f,
        );
        o.finish(false, &mut f);
        assert_eq!(
            kinds(&f),
            vec![
                "response.output_item.added",
                "response.reasoning_text.delta",
                "response.reasoning_text.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.content_part.added",
                "response.output_text.delta",
                "response.output_text.delta",
                "response.output_text.done",
                "response.content_part.done",
                "response.output_item.done",
                "response.output_item.added",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.delta",
                "response.function_call_arguments.done",
                "response.output_item.done",
            ]
        );
        let items = o.items_json();
        assert_eq!(items[0]["id"], "rs_x_0");
        assert_eq!(items[1]["content"][0]["text"], "hello");
        assert_eq!(items[2]["id"], "fc_x_2");
        assert_eq!(items[2]["arguments"], "{\"a\":1}");
        // The Anthropic block travels wrapped and comes back whole.
        let back = unwrap_reasoning(items[0]["encrypted_content"].as_str().unwrap()).unwrap();
        assert_eq!(
            (
                back.text.as_str(),
                back.signature.as_str(),
                back.dialect.as_str()
            ),
            ("think", "sig", "anthropic")
        );
        let turn = o.assistant_turn().unwrap();
        assert_eq!(turn.parts.len(), 2);
        assert_eq!(turn.tool_calls[0].id, "call_1");
    }

    #[test]
    fn a_custom_namespaced_call_goes_out_with_its_input_whole() {
        let mut names = ToolNames::new();
        names.insert(
            "functions__exec".into(),
            ToolName {
                name: "exec".into(),
                namespace: Some("functions".into()),
                custom: true,
            },
        );
        let mut o = Output::new("resp_y", names.clone());
        let mut f = Vec::new();
        o.push(
            Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
                index: 0,
                id: Some("call_9".into()),
                name: Some("functions__exec".into()),
                arguments: "{\"input\":\"echo".into(),
            })),
            &mut f,
        );
        o.push(
            Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
                index: 0,
                id: None,
                name: None,
                arguments: " hi\"}".into(),
            })),
            &mut f,
        );
        o.finish(false, &mut f);
        assert_eq!(
            kinds(&f),
            vec![
                "response.output_item.added",
                "response.custom_tool_call_input.delta",
                "response.custom_tool_call_input.done",
                "response.output_item.done",
            ]
        );
        let item = &o.items_json()[0];
        assert_eq!(item["type"], "custom_tool_call");
        assert_eq!(item["id"], "ctc_y_0");
        assert_eq!(item["name"], "exec");
        assert_eq!(item["namespace"], "functions");
        assert_eq!(item["input"], "echo hi");
        // Rebuilt from the stored item, it is the same call upstream.
        let answer = answer_of_items(&o.items_json(), &names);
        assert_eq!(answer.tool_calls[0].name, "functions__exec");
        assert_eq!(custom_input(&answer.tool_calls[0].arguments), "echo hi");
    }

    #[test]
    fn usage_counts_every_input_token_as_openai_does() {
        let u = usage_json(&proto::Usage {
            input_tokens: 10,
            output_tokens: 5,
            cache_read_input_tokens: 90,
            reasoning_tokens: 2,
            ..Default::default()
        });
        assert_eq!(u["input_tokens"], 100);
        assert_eq!(u["input_tokens_details"]["cached_tokens"], 90);
        assert_eq!(u["output_tokens_details"]["reasoning_tokens"], 2);
        assert_eq!(u["total_tokens"], 105);
    }
}
