//! The Messages request body and its mapping onto the gRPC
//! `CompletionRequest`: the system prompt (a string, or text blocks with
//! their cache markers), the turns and their blocks (see [`blocks`]), tools
//! with their markers and unmodelled fields, `tool_choice`, stop sequences
//! and sampling; `thinking` and `output_config` modelled as the reasoning
//! ask and the JSON schema AND kept verbatim for Anthropic upstreams, which
//! get every other top-level field (`metadata`, `context_management`,
//! `top_k`, ...) and the `anthropic-beta` header as they were sent. What
//! can be neither modelled nor forwarded (a field on one turn or block) is
//! reported as dropped with the answer; what cannot be routed at all
//! (server tools, Files API sources) is refused with its field named.

use axum::http::HeaderMap;
use serde::Deserialize;
use serde_json::{Map, Value};

use super::blocks::{self, Content, InMessage, Notes};
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
    /// Every other top-level field (`thinking`, `output_config`,
    /// `metadata`, `context_management`, ...), verbatim.
    #[serde(flatten)]
    pub(super) rest: Map<String, Value>,
}

#[derive(Deserialize)]
pub(super) struct InTool {
    #[serde(rename = "type")]
    pub(super) kind: Option<String>,
    pub(super) name: Option<String>,
    pub(super) description: Option<String>,
    pub(super) input_schema: Option<Value>,
    pub(super) cache_control: Option<Value>,
    /// `defer_loading`, `strict`, `eager_input_streaming`, `input_examples`, ...
    #[serde(flatten)]
    pub(super) rest: Map<String, Value>,
}

#[derive(Deserialize)]
pub(super) struct InToolChoice {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) name: Option<String>,
    /// `disable_parallel_tool_use`, ...
    #[serde(flatten)]
    pub(super) rest: Map<String, Value>,
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
    crate::api::door::read_json(body).map_err(|e| {
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
pub(super) fn to_proto(mut b: MessagesBody, to: Use) -> Result<Parsed, AnthropicError> {
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
    let mut notes = Notes::default();
    let mut messages = Vec::new();
    match b.system {
        None => {}
        Some(Content::Text(text)) if text.is_empty() => {}
        Some(Content::Text(text)) => messages.push(proto::Message {
            role: "system".into(),
            content: text,
            ..Default::default()
        }),
        Some(Content::Blocks(blocks)) => {
            let parts = blocks::system_blocks(blocks, "system", &mut notes)?;
            if !parts.is_empty() {
                messages.push(proto::Message {
                    role: "system".into(),
                    parts,
                    ..Default::default()
                });
            }
        }
    }
    for (i, m) in b.messages.unwrap_or_default().into_iter().enumerate() {
        blocks::turn(i, m, &mut messages, &mut notes)?;
    }
    let tools = tools(b.tools.unwrap_or_default(), &mut notes)?;
    let tool_choice = match b.tool_choice {
        None => None,
        Some(c) => Some(tool_choice(c, &mut b.rest)?),
    };
    let reasoning = reasoning(b.rest.get("thinking"), b.rest.get("output_config"))?;
    let json_schema = json_schema(&b.rest)?;
    let response_format = if json_schema.is_some() {
        proto::ResponseFormat::JsonSchema as i32
    } else {
        0
    };
    let passthrough = (!b.rest.is_empty() || !notes.is_empty()).then(|| proto::Passthrough {
        dialect: "anthropic".into(),
        fields_json: if b.rest.is_empty() {
            String::new()
        } else {
            Value::Object(std::mem::take(&mut b.rest)).to_string()
        },
        headers: Default::default(),
        dropped: notes.into_names(),
    });
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
            reasoning,
            json_schema,
            response_format,
            passthrough,
            ..Default::default()
        },
        stream: b.stream.unwrap_or(false),
    })
}

/// The caller's `anthropic-beta` header(s), forwarded to Anthropic upstreams
/// (Bedrock takes them in its body) as one comma list.
pub(super) fn with_betas(r: &mut proto::CompletionRequest, headers: &HeaderMap) {
    let betas: Vec<&str> = headers
        .get_all("anthropic-beta")
        .iter()
        .filter_map(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .collect();
    if betas.is_empty() {
        return;
    }
    let p = r.passthrough.get_or_insert_with(|| proto::Passthrough {
        dialect: "anthropic".into(),
        ..Default::default()
    });
    p.headers.insert("anthropic-beta".into(), betas.join(","));
}

/// Client tools with a JSON Schema and their cache markers; fields beyond
/// those travel as the tool's `extra_json` (to Anthropic upstreams only).
/// Anthropic's server tools cannot be routed.
fn tools(input: Vec<InTool>, notes: &mut Notes) -> Result<Vec<proto::Tool>, AnthropicError> {
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
        let at = format!("tools[{i}]");
        tools.push(proto::Tool {
            name: t.name.unwrap_or_default(),
            description: t.description.unwrap_or_default(),
            parameters_json,
            cache_control: blocks::cache_control(t.cache_control, &at, notes)?,
            extra_json: if t.rest.is_empty() {
                String::new()
            } else {
                Value::Object(t.rest).to_string()
            },
        });
    }
    Ok(tools)
}

/// The tool choice; one with more than `type` and `name` (e.g.
/// `disable_parallel_tool_use`) also travels verbatim in `rest`.
fn tool_choice(
    c: InToolChoice,
    rest: &mut Map<String, Value>,
) -> Result<proto::ToolChoice, AnthropicError> {
    use proto::tool_choice::Mode;
    let mode = match c.kind.as_str() {
        "auto" => Mode::Auto,
        "any" => Mode::Any,
        "none" => Mode::None,
        "tool" => Mode::Tool,
        other => {
            return Err(bad(format!(
                "tool_choice.type: `{}` is not one of auto, any, tool, none",
                other.chars().take(64).collect::<String>()
            )))
        }
    };
    let name = match (mode, c.name) {
        (Mode::Tool, Some(n)) if !n.is_empty() => n,
        (Mode::Tool, _) => return Err(bad("tool_choice.name: Field required".into())),
        _ => String::new(),
    };
    // `none` withdraws the tools: a verbatim choice would name tools that
    // are not sent.
    if !c.rest.is_empty() && mode != Mode::None {
        let mut verbatim = c.rest;
        verbatim.insert("type".into(), Value::from(c.kind));
        if mode == Mode::Tool {
            verbatim.insert("name".into(), Value::from(name.clone()));
        }
        rest.insert("tool_choice".into(), Value::Object(verbatim));
    }
    Ok(proto::ToolChoice {
        mode: mode as i32,
        name,
    })
}

/// `thinking` (`enabled` with `budget_tokens`, `adaptive`, `disabled`) and
/// `output_config.effort` as the reasoning ask.
fn reasoning(
    thinking: Option<&Value>,
    output_config: Option<&Value>,
) -> Result<Option<proto::Reasoning>, AnthropicError> {
    let mut ask = proto::Reasoning::default();
    if let Some(t) = thinking.filter(|t| !t.is_null()) {
        match t.get("type").and_then(Value::as_str) {
            Some("enabled") => {
                let budget = t.get("budget_tokens").and_then(Value::as_u64);
                ask.budget_tokens =
                    match budget {
                        Some(b) if b >= 1 => u32::try_from(b).unwrap_or(u32::MAX),
                        _ => return Err(bad(
                            "thinking.enabled.budget_tokens: Field required (a positive integer)"
                                .into(),
                        )),
                    };
            }
            Some("adaptive") => ask.adaptive = true,
            Some("disabled") => {}
            _ => {
                return Err(bad(
                    "thinking.type: Input should be 'enabled', 'adaptive' or 'disabled'".into(),
                ))
            }
        }
    }
    if let Some(effort) = output_config
        .and_then(|o| o.get("effort"))
        .filter(|e| !e.is_null())
    {
        match effort.as_str() {
            Some(e @ ("low" | "medium" | "high" | "xhigh" | "max")) => ask.effort = e.into(),
            _ => return Err(bad(
                "output_config.effort: Input should be 'low', 'medium', 'high', 'xhigh' or 'max'"
                    .into(),
            )),
        }
    }
    Ok((ask != proto::Reasoning::default()).then_some(ask))
}

/// `output_config.format` (or the older top-level `output_format`) of type
/// `json_schema`, as the structured-output schema.
fn json_schema(rest: &Map<String, Value>) -> Result<Option<proto::JsonSchema>, AnthropicError> {
    let (at, format) = match (
        rest.get("output_config").and_then(|o| o.get("format")),
        rest.get("output_format"),
    ) {
        (Some(f), _) if !f.is_null() => ("output_config.format", f),
        (_, Some(f)) if !f.is_null() => ("output_format", f),
        _ => return Ok(None),
    };
    if format.get("type").and_then(Value::as_str) != Some("json_schema") {
        return Err(bad(format!("{at}.type: Input should be 'json_schema'")));
    }
    match format.get("schema") {
        Some(schema @ Value::Object(_)) => Ok(Some(proto::JsonSchema {
            name: "response".into(),
            schema_json: schema.to_string(),
            strict: true,
            description: String::new(),
        })),
        _ => Err(bad(format!(
            "{at}.schema: Field required (a JSON Schema object)"
        ))),
    }
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
                + m.parts.iter().map(part_bytes).sum::<usize>()
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

/// A part's size for the estimate: its text, or its media bytes.
fn part_bytes(p: &proto::ContentPart) -> usize {
    use proto::content_part::Part as P;
    match &p.part {
        Some(P::Text(t)) => t.len(),
        Some(P::Image(i)) => i.data.len() + i.url.len(),
        Some(P::Document(d)) => d.data.len() + d.url.len(),
        Some(P::Reasoning(r)) => r.text.len() + r.redacted_data.len(),
        None => 0,
    }
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
        // One marked system block stays a part (its marker with it).
        assert_eq!(
            r.messages[0].parts[0].part,
            Some(proto::content_part::Part::Text("be brief".into()))
        );
        assert!(r.messages[0].parts[0].cache_control.is_some());
        assert_eq!(
            r.messages[2].parts[0].part,
            Some(proto::content_part::Part::Text("Checking.".into()))
        );
        assert_eq!(r.messages[2].tool_calls[0].name, "weather");
        assert_eq!(r.messages[2].tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        assert_eq!(r.messages[3].tool_call_id, "toolu_1");
        assert_eq!(
            r.messages[3].parts[0].part,
            Some(proto::content_part::Part::Text("18C".into()))
        );
        assert_eq!(
            r.messages[4].parts[0].part,
            Some(proto::content_part::Part::Text("and tomorrow?".into()))
        );
        // `metadata` travels verbatim to Anthropic upstreams.
        let fields: Value =
            serde_json::from_str(&r.passthrough.as_ref().unwrap().fields_json).unwrap();
        assert_eq!(fields, json!({"metadata": {"user_id": "u"}}));
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
        assert!(message(v).starts_with("messages[0].content[0].source.type: Input should be"));
        let mut v = base();
        v["messages"][0]["content"] =
            json!([{"type": "image", "source": {"type": "file", "file_id": "f"}}]);
        assert!(message(v).contains("Files API sources are not routed"));
        let mut v = base();
        v["messages"][0]["content"] = json!([{"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "@@"}}]);
        assert!(message(v).contains("invalid base64"));
        let mut v = base();
        v["messages"][0]["content"] = json!([{"type": "server_tool_use", "id": "s"}]);
        assert!(message(v).starts_with("messages[0].content[0].type: `server_tool_use`"));
        let mut v = base();
        v["top_k"] = json!(5);
        v["thinking"] = json!({"type": "adaptive"});
        v["output_config"] = json!({"effort": "low"});
        assert!(body(v).is_ok(), "answer-shaping hints are accepted");
        let mut v = base();
        v["thinking"] = json!({"type": "sometimes"});
        assert!(message(v).starts_with("thinking.type: Input should be"));
        let mut v = base();
        v["thinking"] = json!({"type": "enabled"});
        assert!(message(v).starts_with("thinking.enabled.budget_tokens"));
        let mut v = base();
        v["output_config"] = json!({"format": {"type": "json_schema"}});
        assert!(message(v).starts_with("output_config.format.schema"));
        let mut v = base();
        v["messages"][0]["content"] = json!([{"type": "text", "text": "x", "cache_control": {"type": "ephemeral", "ttl": "2h"}}]);
        assert!(message(v).starts_with("messages[0].content[0].cache_control.ttl"));
        let mut v = base();
        v["system"] = json!([{"type": "image", "source": {}}]);
        assert!(message(v).contains("text-only role 'system' messages require"));
        let mut v = base();
        v["tools"] = json!([{"type": "web_search_20250305", "name": "web_search"}]);
        assert!(message(v).starts_with("tools[0].type:"));
        let mut v = base();
        v["messages"][0]["role"] = json!("robot");
        assert_eq!(
            message(v),
            "messages.0.role: Input should be 'user', 'assistant' or 'system'"
        );
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

    fn part(r: &proto::Message, j: usize) -> &proto::content_part::Part {
        r.parts[j].part.as_ref().unwrap()
    }

    /// Claude Code 2.1.332's first request (REPORT.md section 3), its long
    /// strings cut: three system blocks (two marked), a `defer_loading`
    /// tool, a trailing system turn with its own `output_config`, adaptive
    /// thinking, effort, context management and metadata.
    fn claude_code_body() -> Value {
        json!({
            "model": "claude-opus-5-5",
            "messages": [
                {"role": "user", "content": [
                    {"type": "text", "text": "<system-reminder>\nAttribution</system-reminder>\n"},
                    {"type": "text", "text": "Run: <<call Bash {\"command\":\"echo hi\"}>>"}]},
                {"role": "system",
                 "content": [{"type": "text", "text": "# Environment", "cache_control": {"type": "ephemeral"}}],
                 "output_config": {"effort": "medium"}}
            ],
            "system": [
                {"type": "text", "text": "x-anthropic-billing-header: cc_version=2.1.332.785;"},
                {"type": "text", "text": "You are a Claude agent.", "cache_control": {"type": "ephemeral"}},
                {"type": "text", "text": "You are an agent working with the user.", "cache_control": {"type": "ephemeral", "ttl": "1h"}}
            ],
            "tools": [
                {"name": "Bash", "description": "Run a command",
                 "input_schema": {"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object"}},
                {"name": "DeferredToolPlaceholder", "description": "Reserved",
                 "input_schema": {"type": "object"}, "defer_loading": true}
            ],
            "metadata": {"user_id": "{\"device_id\":\"d\",\"account_uuid\":\"\",\"session_id\":\"s\"}"},
            "max_tokens": 128000,
            "thinking": {"type": "adaptive", "display": "omitted"},
            "context_management": {"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]},
            "output_config": {"effort": "medium"},
            "stream": true
        })
    }

    #[test]
    fn claude_codes_first_request_maps_whole() {
        let p = body(claude_code_body()).unwrap();
        let r = &p.request;
        let roles: Vec<&str> = r.messages.iter().map(|m| m.role.as_str()).collect();
        // The system prompt first, the system turn where it stood (last).
        assert_eq!(roles, ["system", "user", "system"]);
        let system = &r.messages[0];
        assert_eq!(system.parts.len(), 3, "blocks kept apart");
        assert!(system.parts[0].cache_control.is_none());
        assert_eq!(system.parts[1].cache_control.as_ref().unwrap().ttl, "");
        assert_eq!(system.parts[2].cache_control.as_ref().unwrap().ttl, "1h");
        assert_eq!(r.messages[1].parts.len(), 2);
        assert!(r.messages[2].parts[0].cache_control.is_some());
        // Thinking and effort are modelled...
        let reasoning = r.reasoning.as_ref().unwrap();
        assert!(reasoning.adaptive);
        assert_eq!(reasoning.effort, "medium");
        assert_eq!(r.max_tokens, 128000);
        // ...and kept verbatim, with every other top-level field.
        let pt = r.passthrough.as_ref().unwrap();
        assert_eq!(pt.dialect, "anthropic");
        let fields: Value = serde_json::from_str(&pt.fields_json).unwrap();
        assert_eq!(
            fields["thinking"],
            json!({"type": "adaptive", "display": "omitted"})
        );
        assert_eq!(fields["output_config"], json!({"effort": "medium"}));
        assert_eq!(fields["context_management"]["edits"][0]["keep"], "all");
        assert!(fields["metadata"]["user_id"].is_string());
        assert_eq!(fields.as_object().unwrap().len(), 4, "{fields}");
        // The turn's own output_config has no place: reported as dropped.
        assert_eq!(pt.dropped, ["messages[1].output_config"]);
        // Tool fields beyond the model travel as extra_json.
        assert_eq!(r.tools[1].extra_json, r#"{"defer_loading":true}"#);
        assert!(r.tools[0].extra_json.is_empty());
        assert!(r.tools[0].parameters_json.contains("2020-12"));
        // And the whole of it is a valid gRPC request.
        let spec = crate::api::convert::request_spec(
            p.request,
            "r".into(),
            None,
            &crate::config::LimitsConfig::default(),
        )
        .unwrap();
        assert!(spec.needs.reasoning && spec.needs.tools);
        assert_eq!(spec.chat.messages[2].role, "system");
    }

    #[test]
    fn images_and_documents_map_with_their_sources_and_markers() {
        let png = "iVBORw0KGgo=";
        let pdf = "JVBERi0xLjQK";
        let p = body(json!({
            "model": "chat", "max_tokens": 64,
            "messages": [{"role": "user", "content": [
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": png}},
                {"type": "image", "source": {"type": "url", "url": "https://example.com/a.jpg"},
                 "cache_control": {"type": "ephemeral"}},
                {"type": "document", "title": "Spec", "context": "ctx", "citations": {"enabled": true},
                 "source": {"type": "base64", "media_type": "application/pdf", "data": pdf}},
                {"type": "document", "source": {"type": "url", "url": "https://example.com/a.pdf"}},
                {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "plain words"}},
                {"type": "text", "text": "Describe them."}
            ]}]
        }))
        .unwrap();
        use proto::content_part::Part as P;
        let m = &p.request.messages[0];
        match part(m, 0) {
            P::Image(i) => {
                assert_eq!(i.media_type, "image/png");
                assert_eq!(&i.data[..], b"\x89PNG\r\n\x1a\n");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(part(m, 1), P::Image(i) if i.url == "https://example.com/a.jpg"));
        assert!(m.parts[1].cache_control.is_some());
        match part(m, 2) {
            P::Document(d) => {
                assert_eq!(
                    (d.media_type.as_str(), d.title.as_str()),
                    ("application/pdf", "Spec")
                );
                assert_eq!(&d.data[..], b"%PDF-1.4\n");
            }
            other => panic!("{other:?}"),
        }
        assert!(matches!(part(m, 3), P::Document(d) if d.url == "https://example.com/a.pdf"));
        assert!(
            matches!(part(m, 4), P::Document(d) if d.media_type == "text/plain" && &d.data[..] == b"plain words")
        );
        let dropped = &p.request.passthrough.as_ref().unwrap().dropped;
        assert_eq!(
            dropped,
            &[
                "messages[0].content[2].citations",
                "messages[0].content[2].context"
            ]
        );
    }

    #[test]
    fn thinking_comes_back_unmodified_and_tool_results_keep_errors_media_and_markers() {
        let p = body(json!({
            "model": "chat", "max_tokens": 2048,
            "thinking": {"type": "enabled", "budget_tokens": 1024},
            "messages": [
                {"role": "user", "content": "weather?"},
                {"role": "assistant", "content": [
                    {"type": "thinking", "thinking": "Let me check.", "signature": "sig1"},
                    {"type": "redacted_thinking", "data": "opaque"},
                    {"type": "thinking", "thinking": "unsigned"},
                    {"type": "tool_use", "id": "toolu_1", "name": "weather", "input": {"city": "Paris"}}
                ]},
                {"role": "user", "content": [
                    {"type": "tool_result", "tool_use_id": "toolu_1", "is_error": true,
                     "cache_control": {"type": "ephemeral", "ttl": "1h"},
                     "content": [
                        {"type": "text", "text": "failed"},
                        {"type": "image", "source": {"type": "base64", "media_type": "image/gif", "data": "R0lGODlh"}},
                        {"type": "search_result", "source": "s", "title": "t", "content": []}
                     ]},
                    {"type": "tool_result", "tool_use_id": "toolu_2"}
                ]}
            ]
        }))
        .unwrap();
        use proto::content_part::Part as P;
        let r = &p.request;
        assert_eq!(r.reasoning.as_ref().unwrap().budget_tokens, 1024);
        let a = &r.messages[1];
        assert_eq!(a.parts.len(), 2, "the unsigned block is left out");
        assert_eq!(
            part(a, 0),
            &P::Reasoning(proto::ReasoningBlock {
                text: "Let me check.".into(),
                signature: "sig1".into(),
                redacted_data: String::new(),
                dialect: "anthropic".into(),
            })
        );
        assert!(matches!(part(a, 1), P::Reasoning(b) if b.redacted_data == "opaque"));
        assert_eq!(a.tool_calls[0].arguments, r#"{"city":"Paris"}"#);
        let t = &r.messages[2];
        assert_eq!((t.role.as_str(), t.is_error), ("tool", true));
        assert_eq!(t.cache_control.as_ref().unwrap().ttl, "1h");
        assert!(matches!(part(t, 1), P::Image(i) if i.media_type == "image/gif"));
        assert_eq!(t.parts.len(), 2);
        // An empty result is still the tool's answer.
        assert_eq!(r.messages[3].tool_call_id, "toolu_2");
        assert!(r.messages[3].content.is_empty());
        assert_eq!(
            r.passthrough.as_ref().unwrap().dropped,
            [
                "messages[1].content[2]",
                "messages[2].content[0].content[2]"
            ]
        );
        let spec = crate::api::convert::request_spec(
            p.request,
            "r".into(),
            None,
            &crate::config::LimitsConfig::default(),
        )
        .unwrap();
        assert!(spec.needs.vision && spec.needs.reasoning);
    }

    #[test]
    fn structured_output_and_extended_tool_choice_travel_both_ways() {
        let p = body(json!({
            "model": "chat", "max_tokens": 64,
            "messages": [{"role": "user", "content": "hi"}],
            "tools": [{"name": "f", "input_schema": {"type": "object"}, "strict": true,
                       "cache_control": {"type": "ephemeral"}}],
            "tool_choice": {"type": "any", "disable_parallel_tool_use": true},
            "output_config": {"format": {"type": "json_schema",
                "schema": {"type": "object", "properties": {"a": {"type": "string"}}}}}
        }))
        .unwrap();
        let r = &p.request;
        let schema = r.json_schema.as_ref().unwrap();
        assert!(schema.schema_json.contains("properties"));
        assert_eq!(r.response_format, proto::ResponseFormat::JsonSchema as i32);
        assert!(r.reasoning.is_none());
        assert!(r.tools[0].cache_control.is_some());
        assert_eq!(r.tools[0].extra_json, r#"{"strict":true}"#);
        let fields: Value =
            serde_json::from_str(&r.passthrough.as_ref().unwrap().fields_json).unwrap();
        assert_eq!(
            fields["tool_choice"],
            json!({"type": "any", "disable_parallel_tool_use": true})
        );
        assert!(fields["output_config"]["format"].is_object());
    }

    #[test]
    fn the_beta_header_is_passed_through_as_one_list() {
        let mut p = body(json!({"model": "m", "max_tokens": 8,
            "messages": [{"role": "user", "content": "hi"}]}))
        .unwrap();
        assert!(p.request.passthrough.is_none());
        let mut h = HeaderMap::new();
        h.append("anthropic-beta", "a-1, b-2".parse().unwrap());
        h.append("anthropic-beta", "c-3".parse().unwrap());
        with_betas(&mut p.request, &h);
        let pt = p.request.passthrough.unwrap();
        assert_eq!(pt.dialect, "anthropic");
        assert_eq!(pt.headers["anthropic-beta"], "a-1, b-2,c-3");
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
