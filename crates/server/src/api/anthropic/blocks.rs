//! Messages content blocks onto the content model: `text`, `image` and
//! `document` (base64, URL and text sources), `thinking` and
//! `redacted_thinking` (signed reasoning of the Anthropic dialect, kept as
//! sent), `tool_use`, `tool_result` (string or blocks, `is_error`), and
//! `cache_control` (with `ttl`) wherever Anthropic takes it. A turn with
//! `role: "system"` is a system turn where it stands. What a block or turn
//! carries that the model has no place for is noted in [`Notes`] (reported
//! as dropped with every answer); a block type the router cannot route is
//! refused with its path.

use base64::Engine;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::error::AnthropicError;
use crate::proto;
use crate::proto::content_part::Part as P;

/// A string, or a list of content blocks.
#[derive(Deserialize)]
#[serde(untagged)]
pub(super) enum Content {
    Text(String),
    Blocks(Vec<Block>),
}

/// One content block; which fields apply depends on `type`.
#[derive(Deserialize)]
pub(super) struct Block {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) text: Option<String>,
    /// `tool_use`
    pub(super) id: Option<String>,
    pub(super) name: Option<String>,
    pub(super) input: Option<Value>,
    /// `tool_result`
    pub(super) tool_use_id: Option<String>,
    pub(super) content: Option<Content>,
    pub(super) is_error: Option<bool>,
    /// `image`, `document`
    pub(super) source: Option<Value>,
    pub(super) title: Option<String>,
    /// `thinking`
    pub(super) thinking: Option<String>,
    pub(super) signature: Option<String>,
    /// `redacted_thinking`
    pub(super) data: Option<String>,
    pub(super) cache_control: Option<Value>,
    /// Everything else (`citations`, `context`, ...): noted as dropped.
    #[serde(flatten)]
    pub(super) rest: Map<String, Value>,
}

/// One turn of `messages`.
#[derive(Deserialize)]
pub(super) struct InMessage {
    pub(super) role: String,
    pub(super) content: Content,
    /// Per-turn fields (Claude Code's `output_config` on a system turn):
    /// noted as dropped.
    #[serde(flatten)]
    pub(super) rest: Map<String, Value>,
}

/// The most names one request reports as dropped (the contract's bound);
/// past it the last name is `...`.
const MAX_NOTES: usize = 64;

/// What the door took but can neither model nor forward.
#[derive(Default)]
pub(super) struct Notes(Vec<String>);

impl Notes {
    pub(super) fn drop(&mut self, what: String) {
        if self.0.contains(&what) || self.0.len() >= MAX_NOTES {
            return;
        }
        if self.0.len() == MAX_NOTES - 1 {
            self.0.push("...".into());
        } else {
            self.0.push(what);
        }
    }

    /// Every key of `rest`, under `at`.
    pub(super) fn drop_keys(&mut self, rest: &Map<String, Value>, at: &str) {
        for key in rest.keys() {
            let mut key = key.clone();
            crate::api::errors::truncate(&mut key, 64);
            self.drop(format!("{at}.{key}"));
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub(super) fn into_names(self) -> Vec<String> {
        self.0
    }
}

fn bad(msg: String) -> AnthropicError {
    AnthropicError::invalid(msg)
}

fn unsupported(at: &str, kind: &str) -> AnthropicError {
    let mut kind = kind.to_string();
    crate::api::errors::truncate(&mut kind, 64);
    bad(format!(
        "{at}.type: `{kind}` is not supported here (text, image, document, thinking, redacted_thinking, tool_use and tool_result blocks are)"
    ))
}

/// `cache_control: {"type": "ephemeral", "ttl"?: "5m" | "1h"}`.
pub(super) fn cache_control(
    v: Option<Value>,
    at: &str,
    notes: &mut Notes,
) -> Result<Option<proto::CacheControl>, AnthropicError> {
    let Some(v) = v.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let Value::Object(mut o) = v else {
        return Err(bad(format!(
            "{at}.cache_control: Input should be an object"
        )));
    };
    match o.remove("type") {
        Some(Value::String(t)) if t == "ephemeral" => {}
        _ => {
            return Err(bad(format!(
                "{at}.cache_control.type: Input should be 'ephemeral'"
            )))
        }
    }
    let ttl = match o.remove("ttl") {
        None | Some(Value::Null) => String::new(),
        Some(Value::String(t)) if t == "5m" || t == "1h" => t,
        Some(_) => {
            return Err(bad(format!(
                "{at}.cache_control.ttl: Input should be '5m' or '1h'"
            )))
        }
    };
    notes.drop_keys(&o, &format!("{at}.cache_control"));
    Ok(Some(proto::CacheControl { ttl }))
}

fn str_field<'a>(
    o: &'a Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<&'a str, AnthropicError> {
    o.get(key)
        .and_then(Value::as_str)
        .ok_or_else(|| bad(format!("{at}.{key}: Field required")))
}

fn base64_data(data: &str, at: &str) -> Result<Vec<u8>, AnthropicError> {
    base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .map_err(|e| bad(format!("{at}.data: invalid base64 data ({e})")))
}

/// An `image` block's source: base64 bytes or a URL (never fetched here).
fn image(source: Option<Value>, at: &str) -> Result<proto::ImagePart, AnthropicError> {
    let at = format!("{at}.source");
    let Some(Value::Object(s)) = source else {
        return Err(bad(format!("{at}: Field required")));
    };
    match s.get("type").and_then(Value::as_str) {
        Some("base64") => Ok(proto::ImagePart {
            data: base64_data(str_field(&s, "data", &at)?, &at)?.into(),
            media_type: str_field(&s, "media_type", &at)?.to_string(),
            ..Default::default()
        }),
        Some("url") => Ok(proto::ImagePart {
            url: str_field(&s, "url", &at)?.to_string(),
            ..Default::default()
        }),
        _ => Err(bad(format!(
            "{at}.type: Input should be 'base64' or 'url' (Files API sources are not routed)"
        ))),
    }
}

/// A `document` block: a base64 PDF, a URL, or plain text.
fn document(b: &mut Block, at: &str) -> Result<proto::DocumentPart, AnthropicError> {
    let src_at = format!("{at}.source");
    let Some(Value::Object(s)) = b.source.take() else {
        return Err(bad(format!("{src_at}: Field required")));
    };
    let mut doc = proto::DocumentPart {
        title: b.title.take().unwrap_or_default(),
        ..Default::default()
    };
    match s.get("type").and_then(Value::as_str) {
        Some("base64") => {
            doc.data = base64_data(str_field(&s, "data", &src_at)?, &src_at)?.into();
            doc.media_type = str_field(&s, "media_type", &src_at)?.to_string();
        }
        Some("url") => doc.url = str_field(&s, "url", &src_at)?.to_string(),
        Some("text") => {
            doc.data = str_field(&s, "data", &src_at)?.as_bytes().to_vec().into();
            doc.media_type = "text/plain".into();
        }
        Some("content") if s.get("content").is_some_and(Value::is_string) => {
            doc.data = str_field(&s, "content", &src_at)?.as_bytes().to_vec().into();
            doc.media_type = "text/plain".into();
        }
        _ => {
            return Err(bad(format!(
                "{src_at}.type: Input should be 'base64', 'url' or 'text' (Files API and block sources are not routed)"
            )))
        }
    }
    Ok(doc)
}

fn part(p: P, cache: Option<proto::CacheControl>) -> proto::ContentPart {
    proto::ContentPart {
        part: Some(p),
        cache_control: cache,
    }
}

/// A text, image or document block as a part (the kinds every role but
/// assistant may carry); `None` for another kind.
fn media_or_text(
    b: &mut Block,
    at: &str,
    notes: &mut Notes,
) -> Result<Option<proto::ContentPart>, AnthropicError> {
    let p = match b.kind.as_str() {
        "text" => P::Text(
            b.text
                .take()
                .ok_or_else(|| bad(format!("{at}.text: Field required")))?,
        ),
        "image" => P::Image(image(b.source.take(), at)?),
        "document" => P::Document(document(b, at)?),
        _ => return Ok(None),
    };
    let cache = cache_control(b.cache_control.take(), at, notes)?;
    notes.drop_keys(&b.rest, at);
    Ok(Some(part(p, cache)))
}

/// One turn as gRPC messages, appended to `out`. A user turn's
/// `tool_result` blocks become `tool` messages (first, as the API orders
/// them), the rest one user message; an assistant turn keeps its reasoning,
/// text and tool calls; a system turn is a system message where it stands.
pub(super) fn turn(
    i: usize,
    m: InMessage,
    out: &mut Vec<proto::Message>,
    notes: &mut Notes,
) -> Result<(), AnthropicError> {
    let role = match m.role.as_str() {
        "user" | "assistant" | "system" => m.role,
        _ => {
            return Err(bad(format!(
                "messages.{i}.role: Input should be 'user', 'assistant' or 'system'"
            )))
        }
    };
    notes.drop_keys(&m.rest, &format!("messages[{i}]"));
    let blocks = match m.content {
        Content::Text(text) => {
            out.push(proto::Message {
                role,
                content: text,
                ..Default::default()
            });
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    match role.as_str() {
        "assistant" => assistant(i, blocks, out, notes),
        "system" => {
            let parts = system_blocks(blocks, &format!("messages[{i}].content"), notes)?;
            out.push(proto::Message {
                role,
                parts,
                ..Default::default()
            });
            Ok(())
        }
        _ => user(i, blocks, out, notes),
    }
}

/// Text blocks (the only kind a system prompt or system turn takes) with
/// their cache markers.
pub(super) fn system_blocks(
    blocks: Vec<Block>,
    at: &str,
    notes: &mut Notes,
) -> Result<Vec<proto::ContentPart>, AnthropicError> {
    let mut parts = Vec::with_capacity(blocks.len());
    for (j, mut b) in blocks.into_iter().enumerate() {
        let at = format!("{at}[{j}]");
        if b.kind != "text" {
            return Err(bad(format!(
                "{at}.type: text-only role 'system' messages require `text` blocks, not `{}`",
                b.kind.chars().take(64).collect::<String>()
            )));
        }
        if let Some(p) = media_or_text(&mut b, &at, notes)? {
            parts.push(p);
        }
    }
    Ok(parts)
}

fn user(
    i: usize,
    blocks: Vec<Block>,
    out: &mut Vec<proto::Message>,
    notes: &mut Notes,
) -> Result<(), AnthropicError> {
    let mut parts = Vec::new();
    for (j, mut b) in blocks.into_iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        if let Some(p) = media_or_text(&mut b, &at, notes)? {
            parts.push(p);
            continue;
        }
        match b.kind.as_str() {
            "tool_result" => out.push(tool_result(b, &at, notes)?),
            kind @ ("tool_use" | "thinking" | "redacted_thinking") => {
                return Err(bad(format!(
                    "{at}.type: a `{kind}` block does not belong in a `user` message"
                )))
            }
            kind => return Err(unsupported(&at, kind)),
        }
    }
    if !parts.is_empty() {
        out.push(proto::Message {
            role: "user".into(),
            parts,
            ..Default::default()
        });
    }
    Ok(())
}

/// A `tool_result` block as a `tool` message: its content (a string, or
/// text, image and document blocks), `is_error` and its cache marker.
fn tool_result(
    mut b: Block,
    at: &str,
    notes: &mut Notes,
) -> Result<proto::Message, AnthropicError> {
    let id = b.tool_use_id.take().unwrap_or_default();
    if id.is_empty() {
        return Err(bad(format!("{at}.tool_use_id: Field required")));
    }
    let mut message = proto::Message {
        role: "tool".into(),
        tool_call_id: id,
        is_error: b.is_error.unwrap_or(false),
        cache_control: cache_control(b.cache_control.take(), at, notes)?,
        ..Default::default()
    };
    notes.drop_keys(&b.rest, at);
    match b.content.take() {
        None => {}
        Some(Content::Text(t)) => message.content = t,
        Some(Content::Blocks(blocks)) => {
            for (k, mut inner) in blocks.into_iter().enumerate() {
                let at = format!("{at}.content[{k}]");
                match media_or_text(&mut inner, &at, notes)? {
                    Some(p) => message.parts.push(p),
                    // `search_result`, `tool_reference`, ...: not routed.
                    None => notes.drop(at),
                }
            }
        }
    }
    Ok(message)
}

fn assistant(
    i: usize,
    blocks: Vec<Block>,
    out: &mut Vec<proto::Message>,
    notes: &mut Notes,
) -> Result<(), AnthropicError> {
    let mut parts = Vec::new();
    let mut calls = Vec::new();
    for (j, mut b) in blocks.into_iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match b.kind.as_str() {
            "text" => {
                if let Some(p) = media_or_text(&mut b, &at, notes)? {
                    parts.push(p);
                }
            }
            "thinking" | "redacted_thinking" => {
                if let Some(p) = reasoning(b, &at, notes) {
                    parts.push(p);
                }
            }
            "tool_use" => calls.push(tool_use(b, &at, notes)?),
            kind @ ("tool_result" | "image" | "document") => {
                return Err(bad(format!(
                    "{at}.type: a `{kind}` block does not belong in an `assistant` message"
                )))
            }
            kind => return Err(unsupported(&at, kind)),
        }
    }
    if !parts.is_empty() || !calls.is_empty() {
        out.push(proto::Message {
            role: "assistant".into(),
            parts,
            tool_calls: calls,
            ..Default::default()
        });
    }
    Ok(())
}

/// A thinking block as signed reasoning of the Anthropic dialect, unmodified.
/// One without a signature (another dialect's reasoning shown as thinking)
/// cannot be sent back to Anthropic: noted and left out.
fn reasoning(mut b: Block, at: &str, notes: &mut Notes) -> Option<proto::ContentPart> {
    if b.cache_control.take().is_some() {
        notes.drop(format!("{at}.cache_control"));
    }
    notes.drop_keys(&b.rest, at);
    let block = if b.kind == "redacted_thinking" {
        proto::ReasoningBlock {
            redacted_data: b.data.take().unwrap_or_default(),
            ..Default::default()
        }
    } else {
        proto::ReasoningBlock {
            text: b.thinking.take().unwrap_or_default(),
            signature: b.signature.take().unwrap_or_default(),
            ..Default::default()
        }
    };
    if block.signature.is_empty() && block.redacted_data.is_empty() {
        notes.drop(at.to_string());
        return None;
    }
    Some(part(
        P::Reasoning(proto::ReasoningBlock {
            dialect: "anthropic".into(),
            ..block
        }),
        None,
    ))
}

fn tool_use(mut b: Block, at: &str, notes: &mut Notes) -> Result<proto::ToolCall, AnthropicError> {
    let id = b.id.take().unwrap_or_default();
    let name = b.name.take().unwrap_or_default();
    if id.is_empty() || name.is_empty() {
        return Err(bad(format!("{at}: a tool_use block needs `id` and `name`")));
    }
    // A marker on a tool call has no place in the model.
    if b.cache_control.take().is_some() {
        notes.drop(format!("{at}.cache_control"));
    }
    notes.drop_keys(&b.rest, at);
    let input = b.input.take().unwrap_or_else(|| Value::Object(Map::new()));
    Ok(proto::ToolCall {
        id,
        name,
        arguments: input.to_string(),
    })
}
