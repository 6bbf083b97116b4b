//! The Chat Completions request body, written straight to bytes: each
//! field is serialised from the request where it lies, with no JSON tree in
//! between (a tree cost a short request fifteen allocations: a map node, a
//! key and a value for each field, and the same again for each message).
//! What the wire cannot carry is noted in `Dropped` as the body is planned:
//! cache markers (OpenAI caches on its own), signed reasoning, `is_error`,
//! document URLs, media in tool results, and another dialect's passthrough.
//! [`build_body`] gives the same body as a `Value`, for the wires that edit
//! it (Azure) and for tests.

use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{json, Map, Value};
use smallvec::SmallVec;

use super::openai::{data_url, effort_of, f32_json, merge_absent};
use crate::chat::{MediaSource, Part, PartKind, ToolCall, ToolChoice};
use crate::upstream::{ChatMessage, ChatRequest, Dialect, Dropped};

/// Room for a short request's body; a longer one grows it.
const BODY_BYTES: usize = 256;

/// The body as bytes, for the wire (cut from [`crate::arena`]). Streaming
/// asks for the usage chunk (`include_usage`).
pub fn body_bytes(req: &ChatRequest, dropped: &mut Dropped) -> bytes::Bytes {
    let content: usize = req.messages.iter().map(|m| m.content.len()).sum();
    // Writing fails only for a map key that is not a string, which this
    // body never has.
    crate::arena::json(BODY_BYTES + content, &ChatBody::new(req, dropped)).unwrap_or_default()
}

/// The body as a JSON value (the same fields as [`body_bytes`]).
pub fn build_body(req: &ChatRequest, dropped: &mut Dropped) -> Value {
    serde_json::to_value(ChatBody::new(req, dropped)).unwrap_or_default()
}

/// A request's body, planned: the notes are taken, what is rare is built
/// as values, and the rest is borrowed from the request.
struct ChatBody<'a> {
    req: &'a ChatRequest,
    messages: Vec<MessageBody<'a>>,
    /// `max_tokens`, or `max_completion_tokens` for reasoning models and
    /// callers who wrote it.
    max_tokens_key: &'static str,
    temperature: Option<Value>,
    top_p: Option<Value>,
    tools: Option<Value>,
    tool_choice: Option<Value>,
    response_format: Option<Value>,
    reasoning_effort: Option<String>,
    /// This dialect's unmodelled fields, written where the body has none of
    /// that name: they never override what the adapter set.
    passthrough: Option<&'a Map<String, Value>>,
}

impl<'a> ChatBody<'a> {
    fn new(req: &'a ChatRequest, dropped: &mut Dropped) -> Self {
        let messages = req
            .messages
            .iter()
            .map(|m| MessageBody::new(m, dropped))
            .collect();
        let passthrough = req.passthrough_for(Dialect::Openai);
        // Reasoning models take only `max_completion_tokens`; a caller of
        // this dialect who wrote it gets it (compatible servers that predate
        // it keep `max_tokens`).
        let spelled = passthrough.is_some_and(|p| p.fields.contains_key("max_completion_tokens"));
        let max_tokens_key = if req.reasoning.is_some() || spelled {
            "max_completion_tokens"
        } else {
            "max_tokens"
        };
        let (tools, tool_choice) = if req.tools.is_empty() {
            (None, None)
        } else {
            (
                Some(tools(req, passthrough.is_some(), dropped)),
                tool_choice(&req.tool_choice),
            )
        };
        if let (None, Some(other)) = (passthrough, req.passthrough.as_deref()) {
            dropped.passthrough(other);
        }
        ChatBody {
            req,
            messages,
            max_tokens_key,
            temperature: req.temperature.and_then(f32_json),
            top_p: req.top_p.and_then(f32_json),
            tools,
            tool_choice,
            response_format: response_format(req),
            reasoning_effort: req.reasoning.as_ref().and_then(effort_of),
            passthrough: passthrough.map(|p| &p.fields),
        }
    }
}

impl Serialize for ChatBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let req = self.req;
        let mut map = serializer.serialize_map(None)?;
        // The names written, so the passthrough adds only others.
        let mut w = Written {
            map: &mut map,
            names: SmallVec::new(),
        };
        w.put("model", &req.model)?;
        w.put("messages", &self.messages)?;
        if let Some(n) = req.max_tokens {
            w.put(self.max_tokens_key, &n)?;
        }
        if let Some(t) = &self.temperature {
            w.put("temperature", t)?;
        }
        if let Some(p) = &self.top_p {
            w.put("top_p", p)?;
        }
        if !req.stop.is_empty() {
            w.put("stop", &req.stop)?;
        }
        if let Some(tools) = &self.tools {
            w.put("tools", tools)?;
        }
        if let Some(choice) = &self.tool_choice {
            w.put("tool_choice", choice)?;
        }
        if let Some(format) = &self.response_format {
            w.put("response_format", format)?;
        }
        if let Some(effort) = &self.reasoning_effort {
            w.put("reasoning_effort", effort)?;
        }
        if let Some(tier) = &req.service_tier {
            w.put("service_tier", tier)?;
        }
        if req.stream {
            w.put("stream", &true)?;
            w.put(
                "stream_options",
                &IncludeUsage {
                    include_usage: true,
                },
            )?;
        }
        for (k, v) in self.passthrough.into_iter().flatten() {
            if !w.names.contains(&k.as_str()) {
                w.map.serialize_entry(k, v)?;
            }
        }
        map.end()
    }
}

/// A map being written, and the names written to it.
struct Written<'m, M> {
    map: &'m mut M,
    names: SmallVec<[&'static str; 16]>,
}

impl<M: SerializeMap> Written<'_, M> {
    fn put<T: Serialize + ?Sized>(
        &mut self,
        name: &'static str,
        value: &T,
    ) -> Result<(), M::Error> {
        self.names.push(name);
        self.map.serialize_entry(name, value)
    }
}

#[derive(serde::Serialize)]
struct IncludeUsage {
    include_usage: bool,
}

/// The `tools` array; a tool's own extra fields when this dialect's
/// passthrough is on, else noted.
fn tools(req: &ChatRequest, passthrough: bool, dropped: &mut Dropped) -> Value {
    let tools = req.tools.iter().map(|t| {
        let mut function = Map::new();
        function.insert("name".into(), json!(t.name));
        function.insert("description".into(), json!(t.description));
        function.insert("parameters".into(), t.parameters.clone());
        match (&t.extra, passthrough) {
            (Some(extra), true) => merge_absent(&mut function, extra),
            (Some(_), false) => dropped.note("tools.extra"),
            (None, _) => {}
        }
        if t.cache.is_some() {
            dropped.note("cache_control");
        }
        json!({"type": "function", "function": function})
    });
    Value::Array(tools.collect())
}

/// `tool_choice`, unless it is the default (`auto`).
fn tool_choice(choice: &ToolChoice) -> Option<Value> {
    match choice {
        ToolChoice::Auto => None,
        ToolChoice::Any => Some(json!("required")),
        ToolChoice::Tool(name) => Some(json!({"type": "function", "function": {"name": name}})),
    }
}

/// `response_format`: a JSON schema, JSON mode, or none.
fn response_format(req: &ChatRequest) -> Option<Value> {
    if let Some(schema) = &req.json_schema {
        let mut js = Map::new();
        js.insert("name".into(), json!(schema.name));
        js.insert("schema".into(), schema.schema.clone());
        js.insert("strict".into(), json!(schema.strict));
        if let Some(d) = &schema.description {
            js.insert("description".into(), json!(d));
        }
        Some(json!({"type": "json_schema", "json_schema": js}))
    } else if req.json_mode {
        Some(json!({"type": "json_object"}))
    } else {
        None
    }
}

/// One message, planned: its text borrowed, or its parts in Chat
/// Completions' shape.
struct MessageBody<'a> {
    m: &'a ChatMessage,
    content: Content<'a>,
}

/// A message's `content`.
enum Content<'a> {
    /// The text shorthand, as it is.
    Text(&'a str),
    /// System and tool messages take text only: their text parts joined,
    /// one string every compatible server accepts.
    Joined(String),
    Parts(Vec<Value>),
    /// An assistant message that only calls tools.
    Null,
}

impl<'a> MessageBody<'a> {
    fn new(m: &'a ChatMessage, dropped: &mut Dropped) -> Self {
        let content = if m.parts.is_empty() {
            Content::Text(&m.content)
        } else {
            let parts: Vec<Value> = m
                .parts
                .iter()
                .filter_map(|p| part_json(p, &m.role, dropped))
                .collect();
            let text_only = parts.iter().all(|p| p["type"] == "text");
            if text_only && m.role != "user" {
                Content::Joined(
                    parts
                        .iter()
                        .filter_map(|p| p["text"].as_str())
                        .collect::<Vec<_>>()
                        .join("\n"),
                )
            } else {
                Content::Parts(parts)
            }
        };
        if m.is_error {
            dropped.note("is_error");
        }
        if m.cache.is_some() {
            dropped.note("cache_control");
        }
        let empty = match &content {
            Content::Text(t) => t.is_empty(),
            Content::Joined(t) => t.is_empty(),
            Content::Parts(p) => p.is_empty(),
            Content::Null => true,
        };
        let content = if !m.tool_calls.is_empty() && empty {
            Content::Null
        } else {
            content
        };
        MessageBody { m, content }
    }
}

impl Serialize for MessageBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let m = self.m;
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("role", &m.role)?;
        match &self.content {
            Content::Text(t) => map.serialize_entry("content", t)?,
            Content::Joined(t) => map.serialize_entry("content", t)?,
            Content::Parts(p) => map.serialize_entry("content", p)?,
            Content::Null => map.serialize_entry("content", &())?,
        }
        if !m.tool_calls.is_empty() {
            let calls: SmallVec<[CallBody<'_>; 4]> = m.tool_calls.iter().map(CallBody).collect();
            map.serialize_entry("tool_calls", calls.as_slice())?;
        }
        if let Some(id) = &m.tool_call_id {
            map.serialize_entry("tool_call_id", id)?;
        }
        map.end()
    }
}

/// `{"id", "type": "function", "function": {"name", "arguments"}}`.
struct CallBody<'a>(&'a ToolCall);

impl Serialize for CallBody<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        #[derive(serde::Serialize)]
        struct Function<'a> {
            name: &'a str,
            arguments: &'a str,
        }
        let c = self.0;
        let mut map = serializer.serialize_map(Some(3))?;
        map.serialize_entry("id", &c.id)?;
        map.serialize_entry("type", "function")?;
        map.serialize_entry(
            "function",
            &Function {
                name: &c.name,
                arguments: &c.arguments,
            },
        )?;
        map.end()
    }
}

/// One content part in Chat Completions' shape; `None` for what it cannot carry.
fn part_json(p: &Part, role: &str, dropped: &mut Dropped) -> Option<Value> {
    if p.cache.is_some() {
        dropped.note("cache_control");
    }
    match &p.kind {
        PartKind::Text(t) => Some(json!({"type": "text", "text": t})),
        PartKind::Image(_) | PartKind::Document(_) if role == "tool" => {
            dropped.note("tool_result_media");
            None
        }
        PartKind::Image(img) => {
            let url = match &img.source {
                MediaSource::Url(u) => u.clone(),
                MediaSource::Data(d) => data_url(&img.media_type, d),
            };
            let mut image_url = Map::new();
            image_url.insert("url".into(), json!(url));
            if let Some(d) = &img.detail {
                image_url.insert("detail".into(), json!(d));
            }
            Some(json!({"type": "image_url", "image_url": image_url}))
        }
        PartKind::Document(doc) => match (&doc.source, doc.media_type.as_str()) {
            (MediaSource::Data(d), "application/pdf") => {
                let filename = doc
                    .filename
                    .clone()
                    .or_else(|| doc.title.clone().map(|t| format!("{t}.pdf")))
                    .unwrap_or_else(|| "document.pdf".into());
                Some(json!({"type": "file", "file": {
                    "file_data": data_url("application/pdf", d), "filename": filename}}))
            }
            // A text document is its text (Chat files are PDF only).
            (MediaSource::Data(d), _) => {
                let text = String::from_utf8_lossy(d);
                let text = match &doc.title {
                    Some(t) => format!("{t}\n\n{text}"),
                    None => text.into_owned(),
                };
                Some(json!({"type": "text", "text": text}))
            }
            (MediaSource::Url(_), _) => {
                dropped.note("document_url");
                None
            }
        },
        PartKind::Reasoning(_) => {
            dropped.note("reasoning");
            None
        }
    }
}
