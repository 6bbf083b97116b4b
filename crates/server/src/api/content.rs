//! The content model between the gRPC contract and the chat types: message
//! parts (text, images, documents, signed reasoning) with prompt-cache
//! markers, the reasoning and structured-output asks, the passthrough of
//! what a door did not model, and back: usage and reasoning blocks. Every
//! rejection names the field. Data URLs become inline bytes here, so every
//! adapter sees one shape whichever door the image came through.

use std::sync::Arc;

use base64::Engine;
use bytes::Bytes;
use serde_json::{Map, Value};

use crate::chat::{
    CacheTtl, ChatMessage, Dialect, Document, Image, JsonSchema, MediaSource, Part, PartKind,
    Passthrough, ReasoningAsk, ReasoningBlock, ToolCall, Usage,
};
use crate::error::RequestError;
use crate::proto;

fn invalid(msg: impl Into<String>) -> RequestError {
    RequestError::InvalidRequest(msg.into())
}

/// Image types every upstream that takes images accepts.
pub const IMAGE_TYPES: [&str; 4] = ["image/jpeg", "image/png", "image/gif", "image/webp"];

/// Document types the doors route (PDF everywhere that takes documents;
/// plain text on Anthropic).
pub const DOCUMENT_TYPES: [&str; 2] = ["application/pdf", "text/plain"];

/// Reasoning efforts across dialects (each adapter maps or refuses).
pub const EFFORTS: [&str; 7] = ["none", "minimal", "low", "medium", "high", "xhigh", "max"];

/// A prompt-cache marker: "" and "5m" are five minutes, "1h" one hour.
pub fn cache(c: Option<proto::CacheControl>, at: &str) -> Result<Option<CacheTtl>, RequestError> {
    match c {
        None => Ok(None),
        Some(c) => match c.ttl.as_str() {
            "" | "5m" => Ok(Some(CacheTtl::FiveMinutes)),
            "1h" => Ok(Some(CacheTtl::OneHour)),
            other => Err(invalid(format!(
                "{at}.cache_control.ttl: `{}` is not \"5m\" or \"1h\"",
                shown(other)
            ))),
        },
    }
}

/// At most 64 characters of caller text in an error.
fn shown(s: &str) -> String {
    let mut s = s.to_string();
    crate::api::errors::truncate(&mut s, 64);
    s
}

/// `data:<media type>;base64,<data>` as the media type and bytes.
pub fn data_url(url: &str) -> Option<Result<(String, Bytes), String>> {
    let rest = url.strip_prefix("data:")?;
    let Some((meta, data)) = rest.split_once(',') else {
        return Some(Err("a data URL needs a `,` before its data".into()));
    };
    let Some(media_type) = meta.strip_suffix(";base64") else {
        return Some(Err("only base64 data URLs are supported".into()));
    };
    Some(
        base64::engine::general_purpose::STANDARD
            .decode(data.trim())
            .map(|b| (media_type.to_ascii_lowercase(), Bytes::from(b)))
            .map_err(|e| format!("the data URL's base64 does not decode: {e}")),
    )
}

fn image(img: proto::ImagePart, at: &str) -> Result<Image, RequestError> {
    let detail = (!img.detail.is_empty()).then_some(img.detail);
    if let Some(d) = &detail {
        if !matches!(d.as_str(), "auto" | "low" | "high") {
            return Err(invalid(format!(
                "{at}.image.detail: `{}` is not one of auto, low, high",
                shown(d)
            )));
        }
    }
    let (source, media_type) = match (img.url.is_empty(), img.data.is_empty()) {
        (false, false) => {
            return Err(invalid(format!(
                "{at}.image: set `url` or `data`, not both"
            )))
        }
        (true, true) => return Err(invalid(format!("{at}.image: `url` or `data` is required"))),
        (false, true) => match data_url(&img.url) {
            Some(Ok((mt, bytes))) => (MediaSource::Data(bytes), mt),
            Some(Err(why)) => return Err(invalid(format!("{at}.image.url: {why}"))),
            None if img.url.starts_with("https://") || img.url.starts_with("http://") => {
                (MediaSource::Url(img.url), img.media_type)
            }
            None => {
                return Err(invalid(format!(
                    "{at}.image.url: must be an http(s) or base64 data URL"
                )))
            }
        },
        (true, false) => (MediaSource::Data(img.data), img.media_type),
    };
    let typed = matches!(source, MediaSource::Data(_)) || !media_type.is_empty();
    if typed && !IMAGE_TYPES.contains(&media_type.as_str()) {
        return Err(invalid(format!(
            "{at}.image.media_type: `{}` is not one of {}",
            shown(&media_type),
            IMAGE_TYPES.join(", ")
        )));
    }
    Ok(Image {
        source,
        media_type,
        detail,
    })
}

fn document(doc: proto::DocumentPart, at: &str) -> Result<Document, RequestError> {
    let source = match (doc.url.is_empty(), doc.data.is_empty()) {
        (false, false) => {
            return Err(invalid(format!(
                "{at}.document: set `url` or `data`, not both"
            )))
        }
        (true, true) => {
            return Err(invalid(format!(
                "{at}.document: `data` or `url` is required"
            )))
        }
        (false, true) => match data_url(&doc.url) {
            Some(Ok((_, bytes))) => MediaSource::Data(bytes),
            Some(Err(why)) => return Err(invalid(format!("{at}.document.url: {why}"))),
            None if doc.url.starts_with("https://") => MediaSource::Url(doc.url),
            None => {
                return Err(invalid(format!(
                    "{at}.document.url: must be an https or base64 data URL"
                )))
            }
        },
        (true, false) => MediaSource::Data(doc.data),
    };
    let media_type = if doc.media_type.is_empty() {
        "application/pdf".to_string()
    } else {
        doc.media_type
    };
    if !DOCUMENT_TYPES.contains(&media_type.as_str()) {
        return Err(invalid(format!(
            "{at}.document.media_type: `{}` is not one of {}",
            shown(&media_type),
            DOCUMENT_TYPES.join(", ")
        )));
    }
    Ok(Document {
        source,
        media_type,
        title: (!doc.title.is_empty()).then_some(doc.title),
        filename: (!doc.filename.is_empty()).then_some(doc.filename),
    })
}

/// A reasoning block as the caller sent it back.
pub fn reasoning_block(r: proto::ReasoningBlock) -> ReasoningBlock {
    ReasoningBlock {
        text: r.text,
        signature: (!r.signature.is_empty()).then_some(r.signature),
        redacted: (!r.redacted_data.is_empty()).then_some(r.redacted_data),
        dialect: Dialect::parse(&r.dialect),
    }
}

/// A reasoning block for the caller.
pub fn reasoning_block_proto(r: &ReasoningBlock) -> proto::ReasoningBlock {
    proto::ReasoningBlock {
        text: r.text.clone(),
        signature: r.signature.clone().unwrap_or_default(),
        redacted_data: r.redacted.clone().unwrap_or_default(),
        dialect: r.dialect.map(Dialect::as_str).unwrap_or_default().into(),
    }
}

fn part(p: proto::ContentPart, role: &str, at: &str) -> Result<Part, RequestError> {
    use proto::content_part::Part as P;
    let cache = cache(p.cache_control, at)?;
    let kind = match p.part {
        None => {
            return Err(invalid(format!(
                "{at}: a part needs text, image, document or reasoning"
            )))
        }
        Some(P::Text(t)) => PartKind::Text(t),
        Some(P::Image(i)) => PartKind::Image(image(i, at)?),
        Some(P::Document(d)) => PartKind::Document(document(d, at)?),
        Some(P::Reasoning(r)) => {
            if role != "assistant" {
                return Err(invalid(format!(
                    "{at}.reasoning: only an assistant turn carries reasoning"
                )));
            }
            if cache.is_some() {
                return Err(invalid(format!(
                    "{at}.cache_control: a reasoning part cannot carry a cache marker"
                )));
            }
            PartKind::Reasoning(reasoning_block(r))
        }
    };
    if matches!(kind, PartKind::Image(_) | PartKind::Document(_)) && role == "assistant" {
        return Err(invalid(format!(
            "{at}: images and documents belong in user, system or tool turns"
        )));
    }
    Ok(Part { kind, cache })
}

/// One message, checked: its role, its content (the shorthand or parts),
/// its tool fields. A one-text part without a marker becomes the shorthand.
pub fn message(i: usize, m: proto::Message) -> Result<ChatMessage, RequestError> {
    const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];
    let at = format!("messages[{i}]");
    if !ROLES.contains(&m.role.as_str()) {
        return Err(invalid(format!(
            "{at}.role: `{}` is not one of system, user, assistant, tool",
            shown(&m.role)
        )));
    }
    if !m.content.is_empty() && !m.parts.is_empty() {
        return Err(invalid(format!(
            "{at}.content: set `content` or `parts`, not both"
        )));
    }
    // A tool may answer nothing (an empty result is still its answer).
    if m.content.is_empty() && m.parts.is_empty() && m.tool_calls.is_empty() && m.role != "tool" {
        return Err(invalid(format!("{at}.content: must not be empty")));
    }
    if m.role == "tool" && m.tool_call_id.is_empty() {
        return Err(invalid(format!(
            "{at}.tool_call_id: required for role tool"
        )));
    }
    if m.role != "tool" && (m.is_error || m.cache_control.is_some()) {
        return Err(invalid(format!(
            "{at}: `is_error` and a message-level `cache_control` belong to role tool (mark a part instead)"
        )));
    }
    let mut parts = Vec::with_capacity(m.parts.len());
    for (j, p) in m.parts.into_iter().enumerate() {
        parts.push(part(p, &m.role, &format!("{at}.parts[{j}]"))?);
    }
    let mut content = m.content;
    if let [Part {
        kind: PartKind::Text(_),
        cache: None,
    }] = parts.as_slice()
    {
        if let Some(Part {
            kind: PartKind::Text(t),
            ..
        }) = parts.pop()
        {
            content = t;
        }
    }
    Ok(ChatMessage {
        cache: cache(m.cache_control, &at)?,
        role: m.role,
        content,
        parts,
        tool_call_id: (!m.tool_call_id.is_empty()).then_some(m.tool_call_id),
        tool_calls: m
            .tool_calls
            .into_iter()
            .map(|c| ToolCall {
                id: c.id,
                name: c.name,
                arguments: c.arguments,
            })
            .collect(),
        is_error: m.is_error,
    })
}

/// The reasoning ask, if any.
pub fn reasoning(r: Option<proto::Reasoning>) -> Result<Option<ReasoningAsk>, RequestError> {
    let Some(r) = r else { return Ok(None) };
    let effort = (!r.effort.is_empty()).then_some(r.effort);
    if let Some(e) = &effort {
        if !EFFORTS.contains(&e.as_str()) {
            return Err(invalid(format!(
                "reasoning.effort: `{}` is not one of {}",
                shown(e),
                EFFORTS.join(", ")
            )));
        }
    }
    let ask = ReasoningAsk {
        effort,
        budget_tokens: (r.budget_tokens > 0).then_some(r.budget_tokens),
        adaptive: r.adaptive,
    };
    Ok((ask != ReasoningAsk::default()).then_some(ask))
}

/// The structured-output schema, if any.
pub fn json_schema(s: Option<proto::JsonSchema>) -> Result<Option<JsonSchema>, RequestError> {
    let Some(s) = s else { return Ok(None) };
    let schema = match serde_json::from_str::<Value>(&s.schema_json) {
        Ok(v) if v.is_object() => v,
        _ => {
            return Err(invalid(
                "json_schema.schema_json: must be a JSON object (a JSON Schema)",
            ))
        }
    };
    let name = if s.name.is_empty() {
        "response".to_string()
    } else {
        s.name
    };
    if name.len() > 64
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        return Err(invalid(format!(
            "json_schema.name: `{}` must be 1-64 letters, digits, `_` or `-`",
            shown(&name)
        )));
    }
    Ok(Some(JsonSchema {
        name,
        schema,
        strict: s.strict,
        description: (!s.description.is_empty()).then_some(s.description),
    }))
}

/// Headers a passthrough may carry (anything else is the door's business).
const PASSED_HEADERS: [&str; 2] = ["anthropic-beta", "openai-beta"];

/// What a door did not model, if anything. One that only names its dialect
/// is kept: it binds the tools' `extra` fields to that dialect.
pub fn passthrough(
    p: Option<proto::Passthrough>,
) -> Result<Option<Arc<Passthrough>>, RequestError> {
    let Some(p) = p else { return Ok(None) };
    if p.dialect.is_empty()
        && p.fields_json.trim().is_empty()
        && p.headers.is_empty()
        && p.dropped.is_empty()
    {
        return Ok(None);
    }
    let dialect = Dialect::parse(&p.dialect).ok_or_else(|| {
        invalid(format!(
            "passthrough.dialect: `{}` is not one of openai, anthropic, gemini",
            shown(&p.dialect)
        ))
    })?;
    let fields: Map<String, Value> = if p.fields_json.trim().is_empty() {
        Map::new()
    } else {
        match serde_json::from_str::<Value>(&p.fields_json) {
            Ok(Value::Object(o)) => o,
            _ => return Err(invalid("passthrough.fields_json: must be a JSON object")),
        }
    };
    let mut headers = Vec::new();
    for (name, value) in p.headers {
        let lower = name.to_ascii_lowercase();
        if !PASSED_HEADERS.contains(&lower.as_str()) {
            return Err(invalid(format!(
                "passthrough.headers: `{}` is not one of {}",
                shown(&name),
                PASSED_HEADERS.join(", ")
            )));
        }
        if http::HeaderValue::from_str(&value).is_err() {
            return Err(invalid(format!(
                "passthrough.headers.{lower}: not a valid header value"
            )));
        }
        headers.push((lower, value));
    }
    headers.sort();
    // Kept even when empty: it still binds the tools' `extra_json` to its dialect.
    if p.dropped.len() > 64 || p.dropped.iter().any(|d| d.len() > 128) {
        return Err(invalid(
            "passthrough.dropped: at most 64 names of 128 bytes",
        ));
    }
    Ok(Some(Arc::new(Passthrough {
        dialect: Some(dialect),
        fields,
        headers,
        dropped: p.dropped,
    })))
}

/// A tool definition's unmodelled fields, bound to the passthrough dialect.
pub fn tool_extra(json: &str, at: &str) -> Result<Option<Map<String, Value>>, RequestError> {
    if json.trim().is_empty() {
        return Ok(None);
    }
    match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(o)) if o.is_empty() => Ok(None),
        Ok(Value::Object(o)) => Ok(Some(o)),
        _ => Err(invalid(format!("{at}.extra_json: must be a JSON object"))),
    }
}

/// Usage as the caller sees it.
pub fn usage_proto(u: &Usage, estimated: bool) -> proto::Usage {
    proto::Usage {
        input_tokens: u.input_tokens,
        output_tokens: u.output_tokens,
        estimated,
        cache_read_input_tokens: u.cache_read_input_tokens,
        cache_write_input_tokens: u.cache_write_input_tokens,
        reasoning_tokens: u.reasoning_tokens,
        cache_write_1h_input_tokens: u.cache_write_1h_input_tokens,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn img(url: &str) -> proto::ContentPart {
        proto::ContentPart {
            part: Some(proto::content_part::Part::Image(proto::ImagePart {
                url: url.into(),
                ..Default::default()
            })),
            cache_control: None,
        }
    }

    fn user(parts: Vec<proto::ContentPart>) -> proto::Message {
        proto::Message {
            role: "user".into(),
            parts,
            ..Default::default()
        }
    }

    #[test]
    fn a_data_url_image_becomes_inline_bytes_with_its_media_type() {
        let m = message(0, user(vec![img("data:image/png;base64,iVBORw0KGgo=")])).unwrap();
        match &m.parts[0].kind {
            PartKind::Image(Image {
                source: MediaSource::Data(d),
                media_type,
                ..
            }) => {
                assert_eq!(media_type, "image/png");
                assert_eq!(&d[..], b"\x89PNG\r\n\x1a\n");
            }
            other => panic!("{other:?}"),
        }
        let url = message(0, user(vec![img("https://example.com/a.png")])).unwrap();
        assert!(matches!(
            &url.parts[0].kind,
            PartKind::Image(Image { source: MediaSource::Url(u), .. }) if u == "https://example.com/a.png"
        ));
    }

    #[test]
    fn bad_parts_are_refused_by_name() {
        let why = |m: proto::Message| match message(2, m) {
            Err(RequestError::InvalidRequest(s)) => s,
            other => panic!("{other:?}"),
        };
        assert!(why(user(vec![img("data:image/tiff;base64,AAAA")]))
            .starts_with("messages[2].parts[0].image.media_type: `image/tiff`"));
        assert!(why(user(vec![img("ftp://x/y.png")])).starts_with("messages[2].parts[0].image.url"));
        assert!(why(user(vec![img("data:image/png;base64,@@@")])).contains("does not decode"));
        let mut both = user(vec![img("https://a/b.png")]);
        both.content = "hi".into();
        assert!(why(both).starts_with("messages[2].content: set `content` or `parts`"));
        let mut ttl = user(vec![img("https://a/b.png")]);
        ttl.parts[0].cache_control = Some(proto::CacheControl { ttl: "2h".into() });
        assert!(why(ttl).starts_with("messages[2].parts[0].cache_control.ttl"));
        let reasoning = proto::ContentPart {
            part: Some(proto::content_part::Part::Reasoning(Default::default())),
            cache_control: None,
        };
        assert!(why(user(vec![reasoning])).contains("only an assistant turn carries reasoning"));
    }

    #[test]
    fn one_unmarked_text_part_is_the_shorthand_and_a_marked_one_is_not() {
        let text = |cache| proto::ContentPart {
            part: Some(proto::content_part::Part::Text("hello".into())),
            cache_control: cache,
        };
        let plain = message(0, user(vec![text(None)])).unwrap();
        assert_eq!(plain.content, "hello");
        assert!(plain.parts.is_empty());
        let marked = message(0, user(vec![text(Some(proto::CacheControl::default()))])).unwrap();
        assert!(marked.content.is_empty());
        assert_eq!(marked.parts[0].cache, Some(CacheTtl::FiveMinutes));
        assert_eq!(marked.text_content(), "hello");
    }

    #[test]
    fn passthrough_takes_an_object_and_known_headers_only() {
        let p = passthrough(Some(proto::Passthrough {
            dialect: "anthropic".into(),
            fields_json: r#"{"context_management":{"edits":[]}}"#.into(),
            headers: [("Anthropic-Beta".to_string(), "a,b".to_string())].into(),
            dropped: Vec::new(),
        }))
        .unwrap()
        .unwrap();
        assert_eq!(p.dialect, Some(Dialect::Anthropic));
        assert_eq!(
            p.headers,
            vec![("anthropic-beta".to_string(), "a,b".to_string())]
        );
        assert!(passthrough(Some(proto::Passthrough {
            dialect: "anthropic".into(),
            headers: [("authorization".to_string(), "x".to_string())].into(),
            ..Default::default()
        }))
        .is_err());
        assert!(passthrough(Some(proto::Passthrough {
            dialect: "klingon".into(),
            ..Default::default()
        }))
        .is_err());
    }
}
