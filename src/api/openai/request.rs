//! The OpenAI Chat Completions request body and its mapping onto the gRPC
//! `CompletionRequest`; what the gRPC contract cannot say (`n`, non-text
//! parts, tool types) is refused here with the parameter named.

use super::*;

// ---- request body ---------------------------------------------------------

#[derive(Deserialize, Default)]
pub(super) struct ChatBody {
    pub(super) model: Option<String>,
    pub(super) messages: Option<Vec<InMessage>>,
    pub(super) max_tokens: Option<u32>,
    pub(super) max_completion_tokens: Option<u32>,
    pub(super) temperature: Option<f32>,
    pub(super) top_p: Option<f32>,
    pub(super) stop: Option<Stop>,
    pub(super) tools: Option<Vec<InTool>>,
    pub(super) tool_choice: Option<Value>,
    pub(super) response_format: Option<InResponseFormat>,
    pub(super) stream: Option<bool>,
    pub(super) stream_options: Option<StreamOptions>,
    pub(super) n: Option<u32>,
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
    Parts(Vec<Part>),
}

#[derive(Deserialize)]
pub(super) struct Part {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) text: Option<String>,
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

#[derive(Deserialize)]
pub(super) struct InTool {
    #[serde(rename = "type")]
    pub(super) kind: String,
    pub(super) function: InFunction,
}

#[derive(Deserialize)]
pub(super) struct InFunction {
    pub(super) name: String,
    pub(super) description: Option<String>,
    pub(super) parameters: Option<Value>,
}

#[derive(Deserialize)]
pub(super) struct InResponseFormat {
    #[serde(rename = "type")]
    pub(super) kind: String,
}

#[derive(Deserialize)]
pub(super) struct StreamOptions {
    pub(super) include_usage: Option<bool>,
}

/// What the handler needs beyond the gRPC request.
pub(super) struct Parsed {
    pub(super) request: proto::CompletionRequest,
    pub(super) stream: bool,
    pub(super) include_usage: bool,
}

pub(super) fn parse(body: &[u8]) -> Result<ChatBody, HttpError> {
    let de = &mut serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(de).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        HttpError::invalid(format!("invalid JSON body: {}", e.inner()), param)
    })
}

/// Maps an OpenAI request onto the gRPC request; `convert::request_spec`
/// validates the rest, exactly as for gRPC.
pub(super) fn to_proto(b: ChatBody) -> Result<Parsed, HttpError> {
    let model = b.model.unwrap_or_default();
    if model.is_empty() {
        return Err(bad("model", "model: required (a route name)".into()));
    }
    if let Some(n) = b.n {
        if n != 1 {
            return Err(bad("n", format!("n: {n} is not supported (only 1)")));
        }
    }
    let messages = messages(b.messages.unwrap_or_default())?;
    let tools = tools(b.tools.unwrap_or_default())?;
    let tool_choice = openai_tool_choice(b.tool_choice)?;
    let response_format = match b.response_format.map(|f| f.kind) {
        None => proto::ResponseFormat::Unspecified,
        Some(k) if k == "text" => proto::ResponseFormat::Text,
        Some(k) if k == "json_object" => proto::ResponseFormat::JsonObject,
        Some(k) => {
            return Err(bad(
                "response_format.type",
                format!("response_format.type: `{k}` is not supported (text or json_object)"),
            ))
        }
    };
    let stop = match b.stop {
        None => Vec::new(),
        Some(Stop::One(s)) => vec![s],
        Some(Stop::Many(v)) => v,
    };
    let stream = b.stream.unwrap_or(false);
    Ok(Parsed {
        request: proto::CompletionRequest {
            route: model,
            messages,
            max_tokens: b.max_completion_tokens.or(b.max_tokens).unwrap_or(0),
            temperature: b.temperature,
            idempotency_key: String::new(),
            tenant: String::new(),
            requirements: None,
            tools,
            top_p: b.top_p,
            stop,
            response_format: response_format as i32,
            tool_choice,
            target: String::new(),
            ..Default::default()
        },
        stream,
        include_usage: stream
            && b.stream_options
                .and_then(|o| o.include_usage)
                .unwrap_or(false),
    })
}

/// `auto`, `none`, `required` or `{"type": "function", "function": {"name"}}`.
fn openai_tool_choice(choice: Option<Value>) -> Result<Option<proto::ToolChoice>, HttpError> {
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
            crate::api::status::truncate(&mut shown, 64);
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
fn bad(param: &str, msg: String) -> HttpError {
    HttpError::invalid(msg, Some(param.to_string()))
}

/// The conversation: `developer` is `system`, content parts must be text.
fn messages(input: Vec<InMessage>) -> Result<Vec<proto::Message>, HttpError> {
    let mut messages = Vec::new();
    for (i, m) in input.into_iter().enumerate() {
        let role = match m.role.as_str() {
            "developer" => "system".to_string(),
            _ => m.role,
        };
        let content = match m.content {
            None => String::new(),
            Some(Content::Text(t)) => t,
            Some(Content::Parts(parts)) => {
                let mut text = String::new();
                for (j, p) in parts.into_iter().enumerate() {
                    if p.kind != "text" {
                        return Err(bad(
                            &format!("messages[{i}].content[{j}].type"),
                            format!(
                                "messages[{i}].content[{j}].type: `{}` is not supported (only `text`)",
                                p.kind
                            ),
                        ));
                    }
                    text.push_str(&p.text.unwrap_or_default());
                }
                text
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
            tool_call_id: m.tool_call_id.unwrap_or_default(),
            tool_calls,
            ..Default::default()
        });
    }
    Ok(messages)
}

/// The function tools, each with a JSON Schema object.
fn tools(input: Vec<InTool>) -> Result<Vec<proto::Tool>, HttpError> {
    let mut tools = Vec::new();
    for (i, t) in input.into_iter().enumerate() {
        if t.kind != "function" {
            return Err(bad(
                &format!("tools[{i}].type"),
                format!(
                    "tools[{i}].type: `{}` is not supported (only `function`)",
                    t.kind
                ),
            ));
        }
        let parameters_json = match t.function.parameters {
            None => String::new(),
            Some(p) if p.is_object() => p.to_string(),
            Some(_) => {
                return Err(bad(
                    &format!("tools[{i}].function.parameters"),
                    format!(
                        "tools[{i}].function.parameters: must be a JSON object (a JSON Schema)"
                    ),
                ))
            }
        };
        tools.push(proto::Tool {
            name: t.function.name,
            description: t.function.description.unwrap_or_default(),
            parameters_json,
            ..Default::default()
        });
    }
    Ok(tools)
}
