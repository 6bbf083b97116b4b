//! The OpenAI Chat Completions request body and its mapping onto the gRPC
//! `CompletionRequest`: text, image (URL or data URL) and file (PDF) parts,
//! function tools (their unmodelled fields kept for OpenAI-dialect
//! upstreams), `response_format` (json_object, json_schema),
//! `reasoning_effort`, and every other top-level field as an OpenAI-dialect
//! passthrough (verbatim to OpenAI-dialect upstreams, reported as dropped by
//! the others). What the contract cannot say (`n` > 1, audio, `file_id`,
//! legacy `functions`) is refused with the parameter named; a field on one
//! message or part that nothing carries is reported in `x-switchyard-dropped`.

use base64::Engine;
use serde::de::DeserializeOwned;
use serde_json::Map;

use super::*;
use crate::api::content::{data_url, DOCUMENT_TYPES, EFFORTS, IMAGE_TYPES};

// ---- request body ---------------------------------------------------------

/// The body: the fields the door models, and the rest verbatim.
#[derive(Default)]
pub(super) struct ChatBody {
    pub(super) model: Option<String>,
    pub(super) messages: Option<Vec<Value>>,
    pub(super) max_tokens: Option<u32>,
    pub(super) max_completion_tokens: Option<u32>,
    pub(super) temperature: Option<f32>,
    pub(super) top_p: Option<f32>,
    pub(super) stop: Option<Stop>,
    pub(super) tools: Option<Vec<Value>>,
    pub(super) tool_choice: Option<Value>,
    pub(super) response_format: Option<InResponseFormat>,
    pub(super) reasoning_effort: Option<String>,
    pub(super) stream: Option<bool>,
    pub(super) stream_options: Option<StreamOptions>,
    pub(super) n: Option<u32>,
    /// Every other top-level field, as sent.
    pub(super) rest: Map<String, Value>,
}

#[derive(Deserialize)]
pub(super) struct InMessage {
    pub(super) role: String,
    pub(super) content: Option<Content>,
    pub(super) tool_calls: Option<Vec<InToolCall>>,
    pub(super) tool_call_id: Option<String>,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Parts(Vec<Value>),
}

#[derive(Deserialize)]
pub(super) struct InToolCall {
    pub(super) id: String,
    pub(super) function: InFunctionCall,
}

#[derive(Deserialize)]
pub(super) struct InFunctionCall {
    pub(super) name: String,
    #[serde(default)]
    pub(super) arguments: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Stop {
    One(String),
    Many(Vec<String>),
}

/// `response_format`: `text`, `json_object`, or `json_schema` with its schema.
#[derive(Deserialize)]
pub(super) struct InResponseFormat {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) json_schema: Option<InJsonSchema>,
}

#[derive(Deserialize)]
pub(super) struct InJsonSchema {
    pub(super) name: Option<String>,
    pub(super) schema: Option<Value>,
    pub(super) strict: Option<bool>,
    pub(super) description: Option<String>,
}

#[derive(Deserialize)]
pub(super) struct StreamOptions {
    pub(super) include_usage: Option<bool>,
}

/// `image_url` as an object (`url`, `detail`) or a bare URL string.
#[derive(Deserialize)]
#[serde(untagged)]
enum InImageUrl {
    Url(String),
    Object { url: String, detail: Option<String> },
}

#[derive(Deserialize)]
struct InFile {
    file_data: Option<String>,
    file_id: Option<String>,
    filename: Option<String>,
}

/// What the handler needs beyond the gRPC request.
pub(super) struct Parsed {
    pub(super) request: proto::CompletionRequest,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
}

/// Top-level fields refused by name: the answer could not honour them.
const REFUSED: [(&str, &str); 3] = [
    (
        "functions",
        "legacy `functions` are not supported; send them as `tools`",
    ),
    (
        "function_call",
        "legacy `function_call` is not supported; use `tool_choice`",
    ),
    (
        "audio",
        "audio output is not supported (Switchyard streams text and tool calls)",
    ),
];

/// One message object as [`InMessage`]: in the common shape (`role` a
/// string, `content` absent, `null`, a string or an array, `tool_call_id`
/// absent, `null` or a string) its fields are moved out, the text not
/// copied; any other shape is read by serde, which names what is wrong,
/// exactly as before (a fuzz test holds both readings alike).
/// `i` is the message's place, named only in a refusal.
pub(super) fn in_message(mut o: Map<String, Value>, i: usize) -> Result<InMessage, OpenAiError> {
    let at = || format!("messages[{i}]");
    let common = matches!(o.get("role"), Some(Value::String(_)))
        && matches!(
            o.get("content"),
            None | Some(Value::Null | Value::String(_) | Value::Array(_))
        )
        && matches!(
            o.get("tool_call_id"),
            None | Some(Value::Null | Value::String(_))
        );
    if !common {
        return read(Value::Object(o), &at());
    }
    let tool_calls = match o.remove("tool_calls") {
        None | Some(Value::Null) => None,
        Some(v) => Some(read(v, &format!("{}.tool_calls", at()))?),
    };
    let string = |v: Option<Value>| match v {
        Some(Value::String(s)) => Some(s),
        _ => None,
    };
    let content = match o.remove("content") {
        Some(Value::String(text)) => Some(Content::Text(text)),
        Some(Value::Array(parts)) => Some(Content::Parts(parts)),
        _ => None,
    };
    Ok(InMessage {
        role: string(o.remove("role")).unwrap_or_default(),
        content,
        tool_calls,
        tool_call_id: string(o.remove("tool_call_id")),
    })
}

/// At most this many distinct dropped names from one body's messages, parts
/// and tools (the passthrough's bound is 64); the rest become one `...`.
const MAX_DROPPED: usize = 48;

pub(super) fn parse(body: &[u8]) -> Result<ChatBody, OpenAiError> {
    let TopLevel { modelled, rest } = crate::api::door::read_json(body).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        OpenAiError::invalid(format!("invalid JSON body: {}", e.inner()), param)
    })?;
    let [model, messages, max_tokens, max_completion_tokens, temperature, top_p, stop, tools, tool_choice, response_format, reasoning_effort, stream, stream_options, n] =
        modelled;
    Ok(ChatBody {
        model: field(model, "model")?,
        messages: values(messages, "messages")?,
        max_tokens: field(max_tokens, "max_tokens")?,
        max_completion_tokens: field(max_completion_tokens, "max_completion_tokens")?,
        temperature: field(temperature, "temperature")?,
        top_p: field(top_p, "top_p")?,
        stop: field(stop, "stop")?,
        tools: values(tools, "tools")?,
        tool_choice: tool_choice.filter(|v| !v.is_null()),
        response_format: field(response_format, "response_format")?,
        reasoning_effort: field(reasoning_effort, "reasoning_effort")?,
        stream: field(stream, "stream")?,
        stream_options: field(stream_options, "stream_options")?,
        n: field(n, "n")?,
        rest,
    })
}

/// The top-level fields [`ChatBody`] models, in the order [`parse`] reads
/// (and refuses) them.
pub(super) const MODELLED: [&str; 14] = [
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "stop",
    "tools",
    "tool_choice",
    "response_format",
    "reasoning_effort",
    "stream",
    "stream_options",
    "n",
];

/// The body's top level as sent, read without a map of the modelled fields
/// (their names are matched, not copied): their values by place in
/// [`MODELLED`], every other field in `rest`. A repeated name keeps its
/// last value, as a JSON map does; anything but an object is refused as a
/// map refuses it.
#[derive(Default)]
struct TopLevel {
    modelled: [Option<Value>; MODELLED.len()],
    rest: Map<String, Value>,
}

/// A top-level field's name: its place in [`MODELLED`], or itself.
enum Name {
    Modelled(usize),
    Other(String),
}

impl<'de> Deserialize<'de> for Name {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl serde::de::Visitor<'_> for Visit {
            type Value = Name;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            // An escaped name (decoded into a `String`) comes here too.
            fn visit_str<E: serde::de::Error>(self, k: &str) -> Result<Name, E> {
                Ok(match MODELLED.iter().position(|m| *m == k) {
                    Some(i) => Name::Modelled(i),
                    None => Name::Other(k.to_owned()),
                })
            }
        }
        d.deserialize_str(Visit)
    }
}

impl<'de> Deserialize<'de> for TopLevel {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visit;
        impl<'de> serde::de::Visitor<'de> for Visit {
            type Value = TopLevel;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a map")
            }
            fn visit_unit<E: serde::de::Error>(self) -> Result<TopLevel, E> {
                Ok(TopLevel::default())
            }
            fn visit_map<A: serde::de::MapAccess<'de>>(
                self,
                mut map: A,
            ) -> Result<TopLevel, A::Error> {
                let mut top = TopLevel::default();
                while let Some(name) = map.next_key::<Name>()? {
                    let value: Value = map.next_value()?;
                    match name {
                        Name::Modelled(i) => top.modelled[i] = Some(value),
                        Name::Other(k) => {
                            top.rest.insert(k, value);
                        }
                    }
                }
                Ok(top)
            }
        }
        d.deserialize_map(Visit)
    }
}

/// A modelled field read as `T` (`null` is absent); a type error names the
/// path below `key`.
fn field<T: DeserializeOwned>(v: Option<Value>, key: &str) -> Result<Option<T>, OpenAiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(v) => read(v, key).map(Some),
    }
}

/// A modelled array whose items are moved out (`field` would rebuild each
/// item's tree); anything else is read as `field` reads it.
fn values(v: Option<Value>, key: &str) -> Result<Option<Vec<Value>>, OpenAiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(items)) => Ok(Some(items)),
        Some(v) => read(v, key).map(Some),
    }
}

/// Reads `v` as `T`; a refusal names `at` and the path below it.
pub(super) fn read<T: DeserializeOwned>(v: Value, at: &str) -> Result<T, OpenAiError> {
    serde_path_to_error::deserialize(v).map_err(|e| {
        let below = e.path().to_string();
        let path = match below.as_str() {
            "." => at.to_string(),
            b if b.starts_with('[') => format!("{at}{b}"),
            b => format!("{at}.{b}"),
        };
        let mut inner = e.into_inner().to_string();
        crate::api::errors::truncate(&mut inner, 256);
        OpenAiError::invalid(format!("{path}: {inner}"), Some(path))
    })
}

/// Maps an OpenAI request onto the gRPC request; `convert::request_spec`
/// validates the rest, exactly as for gRPC.
pub(super) fn to_proto(b: ChatBody) -> Result<Parsed, OpenAiError> {
    let model = b.model.unwrap_or_default();
    if model.is_empty() {
        return Err(bad("model", "model: required (a route name)".into()));
    }
    if let Some(n) = b.n {
        if n != 1 {
            return Err(bad("n", format!("n: {n} is not supported (only 1)")));
        }
    }
    let mut dropped = Vec::new();
    let messages = messages(b.messages.unwrap_or_default(), &mut dropped)?;
    let tools = tools(b.tools.unwrap_or_default(), &mut dropped)?;
    let tool_choice = openai_tool_choice(b.tool_choice)?;
    let (response_format, json_schema) = response_format(b.response_format)?;
    let reasoning = reasoning(b.reasoning_effort)?;
    let stop = match b.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    let mut fields = passthrough_fields(b.rest)?;
    if let Some(n) = b.max_completion_tokens.filter(|n| *n > 0) {
        // The caller's spelling: an OpenAI-dialect upstream gets the limit
        // under this name (reasoning models refuse `max_tokens`).
        fields.insert("max_completion_tokens".into(), json!(n));
    }
    let has_extra = tools.iter().any(|t| !t.extra_json.is_empty());
    let passthrough =
        (!fields.is_empty() || !dropped.is_empty() || has_extra).then(|| proto::Passthrough {
            dialect: "openai".into(),
            fields_json: if fields.is_empty() {
                String::new()
            } else {
                Value::Object(fields).to_string()
            },
            headers: Default::default(),
            dropped,
        });
    let stream = b.stream.unwrap_or(false);
    Ok(Parsed {
        request: proto::CompletionRequest {
            route: model,
            messages,
            max_tokens: b.max_completion_tokens.or(b.max_tokens).unwrap_or(0),
            temperature: b.temperature,
            tools,
            top_p: b.top_p,
            stop,
            response_format: response_format as i32,
            tool_choice,
            reasoning,
            json_schema,
            passthrough,
            ..Default::default()
        },
        stream,
        include_usage: stream
            && b.stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
    })
}

/// `text`, `json_object` or `json_schema` (the schema, its name, `strict`
/// and description, for every wire's structured output).
fn response_format(
    f: Option<InResponseFormat>,
) -> Result<(proto::ResponseFormat, Option<proto::JsonSchema>), OpenAiError> {
    let Some(f) = f else {
        return Ok((proto::ResponseFormat::Unspecified, None));
    };
    match f.kind.as_str() {
        "text" => Ok((proto::ResponseFormat::Text, None)),
        "json_object" => Ok((proto::ResponseFormat::JsonObject, None)),
        "json_schema" => {
            let Some(js) = f.json_schema else {
                return Err(bad(
                    "response_format.json_schema",
                    "response_format.json_schema: required with type json_schema".into(),
                ));
            };
            let schema =
                match js.schema {
                    Some(s) if s.is_object() => s,
                    Some(_) => return Err(bad(
                        "response_format.json_schema.schema",
                        "response_format.json_schema.schema: must be a JSON object (a JSON Schema)"
                            .into(),
                    )),
                    // OpenAI allows it absent (any JSON object).
                    None => json!({"type": "object"}),
                };
            let name = js.name.unwrap_or_else(|| "response".into());
            if name.is_empty()
                || name.len() > 64
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                let mut shown = name;
                crate::api::errors::truncate(&mut shown, 64);
                return Err(bad(
                    "response_format.json_schema.name",
                    format!("response_format.json_schema.name: `{shown}` must be 1-64 letters, digits, `_` or `-`"),
                ));
            }
            Ok((
                proto::ResponseFormat::JsonSchema,
                Some(proto::JsonSchema {
                    name,
                    schema_json: schema.to_string(),
                    strict: js.strict.unwrap_or(false),
                    description: js.description.unwrap_or_default(),
                }),
            ))
        }
        k => {
            let mut shown = k.to_string();
            crate::api::errors::truncate(&mut shown, 64);
            Err(bad(
                "response_format.type",
                format!("response_format.type: `{shown}` is not supported (text, json_object or json_schema)"),
            ))
        }
    }
}

/// `reasoning_effort` as the contract's reasoning ask.
fn reasoning(effort: Option<String>) -> Result<Option<proto::Reasoning>, OpenAiError> {
    let Some(effort) = effort else {
        return Ok(None);
    };
    if !EFFORTS.contains(&effort.as_str()) {
        let mut shown = effort;
        crate::api::errors::truncate(&mut shown, 64);
        return Err(bad(
            "reasoning_effort",
            format!(
                "reasoning_effort: `{shown}` is not one of {}",
                EFFORTS.join(", ")
            ),
        ));
    }
    Ok(Some(proto::Reasoning {
        effort,
        ..Default::default()
    }))
}

/// The top-level fields the door does not model, for OpenAI-dialect
/// upstreams: `null`s are left out (they ask for the default), a few are
/// refused by name.
fn passthrough_fields(rest: Map<String, Value>) -> Result<Map<String, Value>, OpenAiError> {
    let mut fields = Map::new();
    for (k, v) in rest {
        if v.is_null() {
            continue;
        }
        if let Some((_, why)) = REFUSED.iter().find(|(name, _)| *name == k) {
            return Err(bad(&k, format!("{k}: {why}")));
        }
        if k == "modalities" && v.as_array().is_some_and(|m| m.iter().any(|x| x != "text")) {
            return Err(bad(
                "modalities",
                "modalities: only [\"text\"] is supported (Switchyard streams text and tool calls)"
                    .into(),
            ));
        }
        fields.insert(k, v);
    }
    Ok(fields)
}

/// `auto`, `none`, `required` or `{"type": "function", "function": {"name"}}`.
fn openai_tool_choice(choice: Option<Value>) -> Result<Option<proto::ToolChoice>, OpenAiError> {
    use proto::tool_choice::Mode;
    let (mode, name) = match &choice {
        None => return Ok(None),
        Some(Value::String(s)) if s == "auto" => (Mode::Auto, String::new()),
        Some(Value::String(s)) if s == "none" => (Mode::None, String::new()),
        Some(Value::String(s)) if s == "required" => (Mode::Any, String::new()),
        Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
            let name = o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| {
                    bad(
                        "tool_choice.function.name",
                        "tool_choice.function.name: required".into(),
                    )
                })?;
            (Mode::Tool, name.to_string())
        }
        Some(other) => {
            let mut shown = other.to_string();
            crate::api::errors::truncate(&mut shown, 64);
            return Err(bad(
                "tool_choice",
                format!("tool_choice: {shown} is not supported (\"auto\", \"none\", \"required\" or a function)"),
            ));
        }
    };
    Ok(Some(proto::ToolChoice {
        mode: mode as i32,
        name,
    }))
}

/// A 400 naming the parameter.
fn bad(param: &str, msg: String) -> OpenAiError {
    OpenAiError::invalid(msg, Some(param.to_string()))
}

/// Notes `<at>.<key>` for each field of `o` outside `known` that carries a
/// value (not null, `[]`, `{}` or ""), once per name, bounded.
fn note_unknown(o: &Map<String, Value>, known: &[&str], at: &str, dropped: &mut Vec<String>) {
    for (k, v) in o {
        let empty = match v {
            Value::Null => true,
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Object(m) => m.is_empty(),
            _ => false,
        };
        if known.contains(&k.as_str()) || empty {
            continue;
        }
        let mut key = k.clone();
        crate::api::errors::truncate(&mut key, 64);
        let name = format!("{at}.{key}");
        if dropped.contains(&name) {
            continue;
        }
        if dropped.len() >= MAX_DROPPED {
            if !dropped.iter().any(|d| d == "...") {
                dropped.push("...".into());
            }
            return;
        }
        dropped.push(name);
    }
}

/// The JSON object at `at`, or a 400 naming it.
fn object_at(v: Value, at: &str, what: &str) -> Result<Map<String, Value>, OpenAiError> {
    match v {
        Value::Object(o) => Ok(o),
        _ => Err(bad(at, format!("{at}: must be {what}"))),
    }
}

/// The conversation: `developer` is `system`; content is text or parts.
fn messages(
    input: Vec<Value>,
    dropped: &mut Vec<String>,
) -> Result<Vec<proto::Message>, OpenAiError> {
    const KNOWN: [&str; 4] = ["role", "content", "tool_calls", "tool_call_id"];
    let mut messages = Vec::with_capacity(input.len());
    for (i, v) in input.into_iter().enumerate() {
        // The message's place is written out only for a refusal.
        let Value::Object(o) = v else {
            let at = format!("messages[{i}]");
            return Err(bad(&at, format!("{at}: must be a message object")));
        };
        note_unknown(&o, &KNOWN, "messages[]", dropped);
        let m = in_message(o, i)?;
        let role = match m.role.as_str() {
            "developer" => "system".to_string(),
            _ => m.role,
        };
        let (content, parts) = match m.content {
            None => (String::new(), Vec::new()),
            Some(Content::Text(t)) => (t, Vec::new()),
            Some(Content::Parts(parts)) => {
                (String::new(), content_parts(parts, i, &role, dropped)?)
            }
        };
        let tool_calls = m
            .tool_calls
            .unwrap_or_default()
            .into_iter()
            .map(|c| proto::ToolCall {
                id: c.id,
                name: c.function.name,
                arguments: c.function.arguments,
            })
            .collect();
        messages.push(proto::Message {
            role,
            content,
            parts,
            tool_call_id: m.tool_call_id.unwrap_or_default(),
            tool_calls,
            ..Default::default()
        });
    }
    Ok(messages)
}

/// A message's content parts: text (and an assistant's `refusal`),
/// `image_url`, `file`; `input_audio` and anything else refused by name. A
/// LiteLLM-style `cache_control` on a part is kept as its cache marker.
fn content_parts(
    input: Vec<Value>,
    i: usize,
    role: &str,
    dropped: &mut Vec<String>,
) -> Result<Vec<proto::ContentPart>, OpenAiError> {
    use proto::content_part::Part as P;
    let mut parts = Vec::with_capacity(input.len());
    for (j, v) in input.into_iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        let mut o = object_at(v, &at, "a content part object")?;
        let kind: String = match o.remove("type") {
            Some(t) => read(t, &format!("{at}.type"))?,
            None => return Err(bad(&format!("{at}.type"), format!("{at}.type: required"))),
        };
        let cache_control = cache_control(o.remove("cache_control"), &at)?;
        let (part, known): (P, &[&str]) = match kind.as_str() {
            "text" => (P::Text(text_field(&mut o, "text", &at)?), &["text"]),
            "refusal" if role == "assistant" => {
                (P::Text(text_field(&mut o, "refusal", &at)?), &["refusal"])
            }
            "image_url" if role != "assistant" => {
                let v = o.remove("image_url").unwrap_or(Value::Null);
                (P::Image(image(v, &format!("{at}.image_url"))?), &[])
            }
            "file" if role != "assistant" => {
                let v = o.remove("file").unwrap_or(Value::Null);
                (P::Document(file(v, &format!("{at}.file"))?), &[])
            }
            other => {
                let mut shown = other.to_string();
                crate::api::errors::truncate(&mut shown, 64);
                let why = if role == "assistant" {
                    "an assistant turn carries `text` and `refusal` parts"
                } else {
                    "Switchyard carries `text`, `image_url` and `file` (PDF) parts"
                };
                return Err(bad(
                    &format!("{at}.type"),
                    format!("{at}.type: `{shown}` is not supported ({why})"),
                ));
            }
        };
        note_unknown(&o, known, "messages[].content[]", dropped);
        parts.push(proto::ContentPart {
            part: Some(part),
            cache_control,
        });
    }
    Ok(parts)
}

/// A required string field of a part.
fn text_field(o: &mut Map<String, Value>, key: &str, at: &str) -> Result<String, OpenAiError> {
    match o.remove(key) {
        Some(Value::String(s)) => Ok(s),
        _ => Err(bad(
            &format!("{at}.{key}"),
            format!("{at}.{key}: required (a string)"),
        )),
    }
}

/// `{"type": "ephemeral", "ttl"?: "5m" | "1h"}` (LiteLLM's convention for
/// Anthropic prompt caching through OpenAI-shaped clients).
fn cache_control(v: Option<Value>, at: &str) -> Result<Option<proto::CacheControl>, OpenAiError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let at = format!("{at}.cache_control");
    let o = object_at(v, &at, "an object like {\"type\": \"ephemeral\"}")?;
    if o.get("type").and_then(Value::as_str) != Some("ephemeral") {
        return Err(bad(
            &format!("{at}.type"),
            format!("{at}.type: must be \"ephemeral\""),
        ));
    }
    let ttl = match o.get("ttl") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(t)) if t == "5m" || t == "1h" => t.clone(),
        Some(_) => {
            return Err(bad(
                &format!("{at}.ttl"),
                format!("{at}.ttl: must be \"5m\" or \"1h\""),
            ))
        }
    };
    Ok(Some(proto::CacheControl { ttl }))
}

/// An image: an http(s) URL (passed on as a URL) or a base64 data URL of
/// one of the four image types (inline bytes), with OpenAI's `detail`.
fn image(v: Value, at: &str) -> Result<proto::ImagePart, OpenAiError> {
    let (url, detail) = match read::<InImageUrl>(v, at)? {
        InImageUrl::Url(url) => (url, None),
        InImageUrl::Object { url, detail } => (url, detail),
    };
    if let Some(d) = &detail {
        if !matches!(d.as_str(), "auto" | "low" | "high") {
            let mut shown = d.clone();
            crate::api::errors::truncate(&mut shown, 64);
            return Err(bad(
                &format!("{at}.detail"),
                format!("{at}.detail: `{shown}` is not one of auto, low, high"),
            ));
        }
    }
    let url_at = format!("{at}.url");
    let mut part = proto::ImagePart {
        detail: detail.unwrap_or_default(),
        ..Default::default()
    };
    match data_url(&url) {
        Some(Ok((media_type, data))) => {
            if !IMAGE_TYPES.contains(&media_type.as_str()) {
                let mut shown = media_type;
                crate::api::errors::truncate(&mut shown, 64);
                return Err(bad(
                    &url_at,
                    format!(
                        "{url_at}: `{shown}` is not one of {}",
                        IMAGE_TYPES.join(", ")
                    ),
                ));
            }
            part.data = data;
            part.media_type = media_type;
        }
        Some(Err(why)) => return Err(bad(&url_at, format!("{url_at}: {why}"))),
        None if url.starts_with("https://") || url.starts_with("http://") => part.url = url,
        None => {
            return Err(bad(
                &url_at,
                format!("{url_at}: must be an http(s) URL or a base64 data URL"),
            ))
        }
    }
    Ok(part)
}

/// A file part: `file_data` (a base64 data URL or bare base64, PDF unless
/// the data URL says `text/plain`) with its `filename`. `file_id` is
/// refused: Switchyard keeps no OpenAI Files store for chat.
fn file(v: Value, at: &str) -> Result<proto::DocumentPart, OpenAiError> {
    let f: InFile = read(v, at)?;
    if f.file_id.is_some() {
        return Err(bad(
            &format!("{at}.file_id"),
            format!("{at}.file_id: not supported (Switchyard has no OpenAI Files store for chat); send the file inline as `file_data`"),
        ));
    }
    let data_at = format!("{at}.file_data");
    let Some(raw) = f.file_data.filter(|d| !d.is_empty()) else {
        return Err(bad(&data_at, format!("{data_at}: required")));
    };
    let (media_type, data) = match data_url(&raw) {
        Some(Ok(decoded)) => decoded,
        Some(Err(why)) => return Err(bad(&data_at, format!("{data_at}: {why}"))),
        None => match base64::engine::general_purpose::STANDARD.decode(raw.trim()) {
            Ok(b) => ("application/pdf".to_string(), bytes::Bytes::from(b)),
            Err(e) => {
                return Err(bad(
                    &data_at,
                    format!("{data_at}: neither a data URL nor base64 ({e})"),
                ))
            }
        },
    };
    if !DOCUMENT_TYPES.contains(&media_type.as_str()) {
        let mut shown = media_type;
        crate::api::errors::truncate(&mut shown, 64);
        return Err(bad(
            &data_at,
            format!(
                "{data_at}: `{shown}` is not one of {}",
                DOCUMENT_TYPES.join(", ")
            ),
        ));
    }
    Ok(proto::DocumentPart {
        data,
        media_type,
        filename: f.filename.unwrap_or_default(),
        ..Default::default()
    })
}

/// The function tools, each with a JSON Schema object; the function's other
/// fields (e.g. `strict`) go along for OpenAI-dialect upstreams.
fn tools(input: Vec<Value>, dropped: &mut Vec<String>) -> Result<Vec<proto::Tool>, OpenAiError> {
    const FUNCTION: [&str; 3] = ["name", "description", "parameters"];
    let mut tools = Vec::with_capacity(input.len());
    for (i, v) in input.into_iter().enumerate() {
        let at = format!("tools[{i}]");
        let mut o = object_at(v, &at, "a tool object")?;
        let kind = o.remove("type").unwrap_or(Value::Null);
        if kind != "function" {
            let mut shown = kind
                .as_str()
                .map_or_else(|| kind.to_string(), str::to_string);
            crate::api::errors::truncate(&mut shown, 64);
            return Err(bad(
                &format!("{at}.type"),
                format!("{at}.type: `{shown}` is not supported (only `function`)"),
            ));
        }
        let cache_control = cache_control(o.remove("cache_control"), &at)?;
        let f_at = format!("{at}.function");
        let mut f = object_at(
            o.remove("function").unwrap_or(Value::Null),
            &f_at,
            "an object",
        )?;
        note_unknown(&o, &[], "tools[]", dropped);
        let name = match f.remove("name") {
            Some(Value::String(s)) => s,
            _ => {
                return Err(bad(
                    &format!("{f_at}.name"),
                    format!("{f_at}.name: required (a string)"),
                ))
            }
        };
        let description = match f.remove("description") {
            None | Some(Value::Null) => String::new(),
            Some(Value::String(s)) => s,
            Some(_) => {
                return Err(bad(
                    &format!("{f_at}.description"),
                    format!("{f_at}.description: must be a string"),
                ))
            }
        };
        let parameters_json = match f.remove("parameters") {
            None | Some(Value::Null) => String::new(),
            Some(p) if p.is_object() => p.to_string(),
            Some(_) => {
                return Err(bad(
                    &format!("{f_at}.parameters"),
                    format!("{f_at}.parameters: must be a JSON object (a JSON Schema)"),
                ))
            }
        };
        f.retain(|k, v| !v.is_null() && !FUNCTION.contains(&k.as_str()));
        tools.push(proto::Tool {
            name,
            description,
            parameters_json,
            cache_control,
            extra_json: if f.is_empty() {
                String::new()
            } else {
                Value::Object(f).to_string()
            },
        });
    }
    Ok(tools)
}
