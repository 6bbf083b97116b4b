//! The Messages request body and its mapping onto the gRPC
//! `CompletionRequest`: the system prompt, text / `tool_use` / `tool_result`
//! blocks, tools and `tool_choice`, stop sequences and sampling. Content the
//! gRPC contract cannot carry (images, documents, server tools) is refused
//! here with the field named, never dropped; hints that only shape how the
//! model answers (`thinking`, `top_k`, `metadata`, `cache_control`, newer
//! top-level options) are accepted and not forwarded, as the OpenAI door
//! treats `seed` and `user`.

use serde::Deserialize;
use serde_json::Value;

use super::error::AnthropicError;
use crate::proto;

#[derive(Deserialize, Default)]
pub(super) struct MessagesBody {
    pub(super) model: Option<String>,
    pub(super) max_tokens: Option<u32>,
    pub(super) messages: Option<Vec<InMessage>>,
    pub(super) system: Option<Content>,
    pub(super) stop_sequences: Option<Vec<String>>,
    pub(super) stream: Option<bool>,
    pub(super) temperature: Option<f32>,
    pub(super) top_p: Option<f32>,
    pub(super) tools: Option<Vec<InTool>>,
    pub(super) tool_choice: Option<InToolChoice>,
}

#[derive(Deserialize)]
pub(super) struct InMessage {
    pub(super) role: String,
    pub(super) content: Content,
}

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
}

#[derive(Deserialize)]
pub(super) struct InTool {
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    pub(super) name: Option<String>,
    pub(super) description: Option<String>,
    pub(super) input_schema: Option<Value>,
}

#[derive(Deserialize)]
pub(super) struct InToolChoice {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) name: Option<String>,
}

/// What the handler needs beyond the gRPC request.
pub(super) struct Parsed {
    pub(super) request: proto::CompletionRequest,
    pub(super) stream: bool,
}

/// Which endpoint the body is for: `count_tokens` takes no `max_tokens`.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Use {
    Messages,
    CountTokens,
}

pub(super) fn parse(body: &[u8]) -> Result<MessagesBody, AnthropicError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let at = if path == "." {
            String::new()
        } else {
            format!("{path}: ")
        };
        AnthropicError::invalid(format!("{at}invalid JSON body: {}", e.inner()))
    })
}

fn bad(msg: String) -> AnthropicError {
    AnthropicError::invalid(msg)
}

/// Maps a Messages request onto the gRPC request; `convert::request_spec`
/// validates the rest, exactly as for gRPC.
pub(super) fn to_proto(b: MessagesBody, to: Use) -> Result<Parsed, AnthropicError> {
    let model = b.model.unwrap_or_default();
    if model.is_empty() {
        return Err(bad(
            "model: Field required (a route name or provider/model)".into(),
        ));
    }
    let max_tokens = match (b.max_tokens, to) {
        (Some(0), Use::Messages) => {
            return Err(bad("max_tokens: must be at least 1".into()));
        }
        (Some(n), _) => n,
        (None, Use::Messages) => return Err(bad("max_tokens: Field required".into())),
        (None, Use::CountTokens) => 0,
    };
    let mut messages = Vec::new();
    if let Some(system) = b.system {
        let text = text_of(system, "system")?;
        if !text.is_empty() {
            messages.push(message("system", text));
        }
    }
    for (i, m) in b.messages.unwrap_or_default().into_iter().enumerate() {
        turn(i, m, &mut messages)?;
    }
    let tools = tools(b.tools.unwrap_or_default())?;
    let tool_choice = b.tool_choice.map(tool_choice).transpose()?;
    Ok(Parsed {
        request: proto::CompletionRequest {
            route: model,
            messages,
            max_tokens,
            temperature: b.temperature,
            top_p: b.top_p,
            stop: b.stop_sequences.unwrap_or_default(),
            tools,
            tool_choice,
            ..Default::default()
        },
        stream: b.stream.unwrap_or(false),
    })
}

fn message(role: &str, content: String) -> proto::Message {
    proto::Message {
        role: role.into(),
        content,
        ..Default::default()
    }
}

/// The text of a string or of text blocks (joined by newlines).
fn text_of(content: Content, field: &str) -> Result<String, AnthropicError> {
    match content {
        Content::Text(t) => Ok(t),
        Content::Blocks(blocks) => {
            let mut parts = Vec::with_capacity(blocks.len());
            for (j, block) in blocks.into_iter().enumerate() {
                if block.kind != "text" {
                    return Err(unsupported(&format!("{field}[{j}]"), &block.kind));
                }
                parts.push(block.text.unwrap_or_default());
            }
            Ok(parts.join("\n"))
        }
    }
}

fn unsupported(at: &str, kind: &str) -> AnthropicError {
    bad(format!(
        "{at}.type: `{kind}` is not supported here (text, tool_use and tool_result blocks are)"
    ))
}

/// One conversation turn. A user turn's `tool_result` blocks become `tool`
/// messages (before its text, as the API orders them); an assistant turn's
/// `tool_use` blocks become its tool calls.
fn turn(i: usize, m: InMessage, out: &mut Vec<proto::Message>) -> Result<(), AnthropicError> {
    let role = match m.role.as_str() {
        "user" | "assistant" => m.role,
        other => {
            return Err(bad(format!(
                "messages[{i}].role: `{other}` is not one of user, assistant (the system prompt is the top-level `system`)"
            )))
        }
    };
    let blocks = match m.content {
        Content::Text(t) => {
            out.push(message(&role, t));
            return Ok(());
        }
        Content::Blocks(blocks) => blocks,
    };
    let mut text = Vec::new();
    let mut calls = Vec::new();
    for (j, block) in blocks.into_iter().enumerate() {
        let at = format!("messages[{i}].content[{j}]");
        match (block.kind.as_str(), role.as_str()) {
            ("text", _) => text.push(block.text.unwrap_or_default()),
            // Reasoning from an earlier turn: not forwarded (thinking is not routed).
            ("thinking" | "redacted_thinking", "assistant") => {}
            ("tool_use", "assistant") => {
                let id = block.id.unwrap_or_default();
                let name = block.name.unwrap_or_default();
                if id.is_empty() || name.is_empty() {
                    return Err(bad(format!("{at}: a tool_use block needs `id` and `name`")));
                }
                let input = block
                    .input
                    .unwrap_or_else(|| Value::Object(Default::default()));
                calls.push(proto::ToolCall {
                    id,
                    name,
                    arguments: input.to_string(),
                });
            }
            ("tool_result", "user") => {
                let id = block.tool_use_id.unwrap_or_default();
                if id.is_empty() {
                    return Err(bad(format!("{at}.tool_use_id: Field required")));
                }
                let content = match block.content {
                    None => String::new(),
                    Some(c) => text_of(c, &format!("{at}.content"))?,
                };
                out.push(proto::Message {
                    role: "tool".into(),
                    content,
                    tool_call_id: id,
                    ..Default::default()
                });
            }
            (kind @ ("tool_use" | "tool_result"), _) => {
                return Err(bad(format!(
                    "{at}.type: a `{kind}` block does not belong in a `{role}` message"
                )))
            }
            (kind, _) => return Err(unsupported(&at, kind)),
        }
    }
    if !text.is_empty() || !calls.is_empty() {
        out.push(proto::Message {
            role,
            content: text.join("\n"),
            tool_calls: calls,
            ..Default::default()
        });
    }
    Ok(())
}

/// Client tools with a JSON Schema; Anthropic's server tools cannot be routed.
fn tools(input: Vec<InTool>) -> Result<Vec<proto::Tool>, AnthropicError> {
    let mut tools = Vec::with_capacity(input.len());
    for (i, t) in input.into_iter().enumerate() {
        if let Some(kind) = t.kind.as_deref().filter(|k| *k != "custom") {
            return Err(bad(format!(
                "tools[{i}].type: `{kind}` is not supported (server tools are not routed; only client tools with an input_schema)"
            )));
        }
        let parameters_json = match t.input_schema {
            Some(s) if s.is_object() => s.to_string(),
            Some(_) => {
                return Err(bad(format!(
                    "tools[{i}].input_schema: must be a JSON object"
                )))
            }
            None => return Err(bad(format!("tools[{i}].input_schema: Field required"))),
        };
        tools.push(proto::Tool {
            name: t.name.unwrap_or_default(),
            description: t.description.unwrap_or_default(),
            parameters_json,
            ..Default::default()
        });
    }
    Ok(tools)
}

fn tool_choice(c: InToolChoice) -> Result<proto::ToolChoice, AnthropicError> {
    use proto::tool_choice::Mode;
    let mode = match c.kind.as_str() {
        "auto" => Mode::Auto,
        "any" => Mode::Any,
        "none" => Mode::None,
        "tool" => Mode::Tool,
        other => {
            return Err(bad(format!(
                "tool_choice.type: `{other}` is not one of auto, any, tool, none"
            )))
        }
    };
    let name = match (mode, c.name) {
        (Mode::Tool, Some(n)) if !n.is_empty() => n,
        (Mode::Tool, _) => return Err(bad("tool_choice.name: Field required".into())),
        _ => String::new(),
    };
    Ok(proto::ToolChoice {
        mode: mode as i32,
        name,
    })
}

/// About four characters a token over everything the model reads: the
/// same rule the router bills by when an upstream reports no usage.
pub(super) fn estimate_tokens(r: &proto::CompletionRequest) -> u64 {
    let messages: usize = r
        .messages
        .iter()
        .map(|m| {
            m.role.len()
                + m.content.len()
                + m.tool_calls
                    .iter()
                    .map(|c| c.name.len() + c.arguments.len())
                    .sum::<usize>()
        })
        .sum();
    let tools: usize = r
        .tools
        .iter()
        .map(|t| t.name.len() + t.description.len() + t.parameters_json.len())
        .sum();
    ((messages + tools) as u64).div_ceil(4).max(1)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    fn body(v: Value) -> Result<Parsed, AnthropicError> {
        to_proto(parse(v.to_string().as_bytes())?, Use::Messages)
    }

    #[test]
    fn maps_a_tool_conversation_onto_the_grpc_request() {
        let p = body(json!({
            "model": "chat",
            "max_tokens": 64,
            "system": [{"type": "text", "text": "be brief", "cache_control": {"type": "ephemeral"}}],
            "messages": [
                {"role": "user", "content": "weather in Paris?"},
                {"role": "assistant", "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "content": [{"type": "text", "text": "18C"}]},
                    {"type": "text", "text": "and tomorrow?"}
                ]}
            ],
            "tools": [{"name": "weather", "description": "get weather",
                       "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
            "tool_choice": {"type": "tool", "name": "weather"},
            "stop_sequences": ["END"], "temperature": 0.2, "top_p": 0.9,
            "stream": true, "metadata": {"user_id": "u"}
        }))
        .unwrap();
        let r = &p.request;
        assert!(p.stream);
        assert_eq!(r.route, "chat");
        assert_eq!(r.max_tokens, 64);
        let roles: Vec<&str> = r.messages.iter().map(|m| m.role.as_str()).collect();
        assert_eq!(roles, ["system", "user", "assistant", "tool", "user"]);
        assert_eq!(r.messages[0].content, "be brief");
        assert_eq!(r.messages[2].content, "Checking.");
        assert_eq!(r.messages[2].tool_calls[0].name, "weather");
        assert_eq!(r.messages[2].tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(r.messages[3].tool_call_id, "toolu_1");
        assert_eq!(r.messages[3].content, "18C");
        assert_eq!(r.messages[4].content, "and tomorrow?");
        assert_eq!(r.stop, ["END"]);
        let choice = r.tool_choice.as_ref().unwrap();
        assert_eq!(choice.mode, proto::tool_choice::Mode::Tool as i32);
        assert_eq!(choice.name, "weather");
    }

    #[test]
    fn refusals_name_the_field() {
        let message = |v: Value| body(v).err().unwrap().message;
        let base = || json!({"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]});
        let mut v = base();
        v.as_object_mut().unwrap().remove("max_tokens");
        assert!(message(v).starts_with("max_tokens: Field required"));
        let mut v = base();
        v["messages"][0]["content"] = json!([{"type": "image", "source": {}}]);
        assert!(message(v).starts_with("messages[0].content[0].type: `image`"));
        let mut v = base();
        v["top_k"] = json!(5);
        v["thinking"] = json!({"type": "adaptive"});
        v["output_config"] = json!({"effort": "low"});
        assert!(body(v).is_ok(), "answer-shaping hints are accepted");
        let mut v = base();
        v["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}]);
        assert!(message(v).starts_with("tools[0].type:"));
        let mut v = base();
        v["messages"][0]["role"] = json!("system");
        assert!(message(v).starts_with("messages[0].role:"));
        let mut v = base();
        v["messages"][0]["content"] =
            json!([{"type": "tool_use", "id": "t", "name": "f", "input": {}}]);
        assert!(message(v).contains("does not belong in a `user` message"));
        let mut v = base();
        v["tool_choice"] = json!({"type": "tool"});
        assert!(message(v).starts_with("tool_choice.name:"));
        let e = body(json!({"model": 5})).err().unwrap();
        assert!(
            e.message.starts_with("model: invalid JSON body"),
            "{}",
            e.message
        );
    }

    #[test]
    fn count_tokens_needs_no_max_tokens_and_estimates_four_chars_a_token() {
        let p = to_proto(
            parse(
                json!({"model": "m", "messages": [{"role": "user", "content": "abcdefgh"}]})
                    .to_string()
                    .as_bytes(),
            )
            .unwrap(),
            Use::CountTokens,
        )
        .unwrap();
        // "user" + "abcdefgh" = 12 characters.
        assert_eq!(estimate_tokens(&p.request), 3);
    }
}
