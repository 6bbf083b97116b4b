//! The Responses API request body and its mapping onto the gRPC
//! `CompletionRequest` and the content model: input items (messages with
//! text, image and file parts, function and custom tool calls and their
//! outputs, reasoning items, Codex's `additional_tools`), `instructions`,
//! function, custom and namespaced tools, `tool_choice`, `text.format`,
//! `reasoning`. Fields with a Chat Completions equivalent are passed through
//! under their Chat name (same dialect only); what neither is modelled nor
//! passes is dropped and reported by name; what would change the answer's
//! meaning (built-in tools a request relies on, stored prompts, file ids,
//! conversations) is refused with the parameter named.

use std::collections::BTreeMap;

use super::*;

/// A tool the upstream sees as a plain function under a flattened name,
/// and the name (and kind) the caller gave it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(super) struct ToolName {
    pub(super) name: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(super) namespace: Option<String>,
    /// A `custom` tool: its call carries one string, `input`.
    #[serde(default)]
    pub(super) custom: bool,
}

/// Flattened name -> the caller's tool, for custom and namespaced tools
/// (plain functions keep their names and need no entry).
pub(super) type ToolNames = BTreeMap<String, ToolName>;

/// A namespaced tool's flattened name (`{namespace}__{name}`: tool names
/// take letters, digits, `_` and `-`).
pub(super) fn flat_name(namespace: Option<&str>, name: &str) -> String {
    match namespace {
        Some(ns) => format!("{ns}__{name}"),
        None => name.to_string(),
    }
}

/// The arguments schema of a `custom` tool: one free-form string.
fn custom_parameters() -> Value {
    json!({
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The tool's whole input, as free-form text."}},
        "required": ["input"],
        "additionalProperties": false,
    })
}

/// A custom tool call's arguments as the upstream sees them.
pub(super) fn custom_arguments(input: &str) -> String {
    json!({ "input": input }).to_string()
}

/// The `input` of a custom tool call from the upstream's arguments (the
/// raw arguments when they are not `{"input": "..."}`).
pub(super) fn custom_input(arguments: &str) -> String {
    match serde_json::from_str::<Value>(arguments) {
        Ok(Value::Object(o)) => match o.get("input") {
            Some(Value::String(s)) => s.clone(),
            _ => arguments.to_string(),
        },
        _ => arguments.to_string(),
    }
}

/// Built-in OpenAI tools: Switchyard cannot run them.
const BUILT_IN: [&str; 13] = [
    "web_search",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "code_interpreter",
    "computer_use_preview",
    "computer_use",
    "image_generation",
    "mcp",
    "local_shell",
    "shell",
    "apply_patch",
    "tool_search",
];

/// A request as parsed, before `previous_response_id` is resolved.
pub(super) struct Ask {
    pub(super) instructions: Option<String>,
    /// This request's input items as messages.
    pub(super) input: Vec<proto::Message>,
    pub(super) previous_response_id: Option<String>,
    /// Everything but the messages.
    pub(super) request: proto::CompletionRequest,
    pub(super) names: ToolNames,
    pub(super) stream: bool,
    pub(super) background: bool,
    pub(super) store: bool,
    /// Request parameters the response object echoes.
    pub(super) echo: Map<String, Value>,
}

impl Ask {
    /// The whole conversation: the instructions as a system message first
    /// (never carried to a later response), then `previous` (a stored
    /// response's conversation), then this input.
    pub(super) fn messages(&self, previous: &[proto::Message]) -> Vec<proto::Message> {
        let mut out = Vec::with_capacity(previous.len() + self.input.len() + 1);
        if let Some(i) = self.instructions.as_ref().filter(|i| !i.is_empty()) {
            out.push(proto::Message {
                role: "system".into(),
                content: i.clone(),
                ..Default::default()
            });
        }
        out.extend_from_slice(previous);
        out.extend(self.input.iter().cloned());
        out
    }
}

/// A 400 naming the parameter.
pub(super) fn bad(param: &str, msg: impl std::fmt::Display) -> OpenAiError {
    OpenAiError::invalid(format!("{param}: {msg}"), Some(param.to_string()))
}

/// At most 64 characters of caller text in an error.
fn shown(v: &str) -> String {
    let mut s = v.to_string();
    crate::api::errors::truncate(&mut s, 64);
    s
}

/// What the door could not carry, by name, each once.
#[derive(Default)]
pub(super) struct Dropped(Vec<String>);

impl Dropped {
    pub(super) fn note(&mut self, name: impl Into<String>) {
        let name = name.into();
        if !self.0.contains(&name) && self.0.len() < 64 {
            let mut name = name;
            crate::api::errors::truncate(&mut name, 128);
            self.0.push(name);
        }
    }
}

/// Reads one optional field of a type.
fn opt<'a, T>(
    body: &'a Map<String, Value>,
    key: &str,
    what: &str,
    get: impl Fn(&'a Value) -> Option<T>,
) -> Result<Option<T>, OpenAiError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => get(v)
            .map(Some)
            .ok_or_else(|| bad(key, format_args!("must be {what}"))),
    }
}

fn opt_str(body: &Map<String, Value>, key: &str) -> Result<Option<String>, OpenAiError> {
    opt(body, key, "a string", Value::as_str).map(|s| s.map(str::to_string))
}

fn opt_bool(body: &Map<String, Value>, key: &str) -> Result<Option<bool>, OpenAiError> {
    opt(body, key, "a boolean", Value::as_bool)
}

fn opt_f32(body: &Map<String, Value>, key: &str) -> Result<Option<f32>, OpenAiError> {
    opt(body, key, "a number", Value::as_f64).map(|n| n.map(|n| n as f32))
}

/// Parses a Responses API body. Fields are checked in a fixed order, so a
/// body with several faults is always refused for the same one.
pub(super) fn parse(bytes: &[u8]) -> Result<Ask, OpenAiError> {
    let body = object(bytes)?;
    let model = opt_str(&body, "model")?.unwrap_or_default();
    if model.is_empty() {
        return Err(bad("model", "required (a route name)"));
    }
    refuse_stored_at_openai(&body)?;
    let mut dropped = Dropped::default();
    let mut passthrough = Map::new();
    let mut names = ToolNames::new();
    let mut additional = Vec::new();
    let input = input_of(&body, &mut additional, &mut dropped)?;
    let previous_response_id = opt_str(&body, "previous_response_id")?;
    if input.is_empty() && previous_response_id.is_none() {
        return Err(bad("input", "required (a string or input items)"));
    }
    let instructions = match body.get("instructions") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s.clone()),
        Some(_) => return Err(bad("instructions", "must be a string")),
    };
    let (tools, tool_choice) = tools_of(&body, &additional, &mut names, &mut dropped)?;
    let (response_format, json_schema) = text_format(&body, &mut passthrough)?;
    let reasoning = reasoning(&body, &mut dropped)?;
    include_of(&body, &mut dropped)?;
    other_fields(&body, &tools, &mut passthrough, &mut dropped)?;
    let max_output_tokens = opt(&body, "max_output_tokens", "a positive integer", |v| {
        v.as_u64().filter(|n| *n > 0)
    })?;
    let (background, store) = kept(&body)?;
    let stream = opt_bool(&body, "stream")?.unwrap_or(false);
    // Always named: it also binds the tools' `strict` to OpenAI's wire.
    let passthrough = Some(proto::Passthrough {
        dialect: "openai".into(),
        fields_json: Value::Object(passthrough).to_string(),
        headers: Default::default(),
        dropped: dropped.0,
    });
    let request = proto::CompletionRequest {
        route: model.clone(),
        max_tokens: max_output_tokens.map_or(0, |n| n.min(u64::from(u32::MAX)) as u32),
        temperature: opt_f32(&body, "temperature")?,
        top_p: opt_f32(&body, "top_p")?,
        tools,
        tool_choice,
        response_format: response_format as i32,
        json_schema,
        reasoning,
        passthrough,
        ..Default::default()
    };
    Ok(Ask {
        echo: echo(&body, &model, instructions.as_deref()),
        instructions,
        input,
        previous_response_id,
        request,
        names,
        stream,
        background,
        store,
    })
}

/// The body as a JSON object.
fn object(bytes: &[u8]) -> Result<Map<String, Value>, OpenAiError> {
    match serde_json::from_slice(bytes) {
        Ok(Value::Object(o)) => Ok(o),
        Ok(_) => Err(OpenAiError::invalid(
            "the body must be a JSON object".into(),
            None,
        )),
        Err(e) => Err(OpenAiError::invalid(
            format!("invalid JSON body: {e}"),
            None,
        )),
    }
}

/// Stored prompts and conversations live at OpenAI: refused by name.
fn refuse_stored_at_openai(body: &Map<String, Value>) -> Result<(), OpenAiError> {
    for refused in ["prompt", "conversation"] {
        if body.get(refused).is_some_and(|v| !v.is_null()) {
            return Err(bad(
                refused,
                format_args!("`{refused}` is not supported by Switchyard (stored OpenAI prompts and conversations live at OpenAI); send the input itself, or chain with previous_response_id"),
            ));
        }
    }
    Ok(())
}

/// `input`: a string (one user message) or input items; Codex's
/// `additional_tools` items are collected into `additional`.
fn input_of(
    body: &Map<String, Value>,
    additional: &mut Vec<(String, Vec<Value>)>,
    dropped: &mut Dropped,
) -> Result<Vec<proto::Message>, OpenAiError> {
    match body.get("input") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![proto::Message {
            role: "user".into(),
            content: s.clone(),
            ..Default::default()
        }]),
        Some(Value::Array(items)) => input_items(items, additional, dropped),
        Some(_) => Err(bad("input", "must be a string or an array of items")),
    }
}

/// `tools` (with the input's `additional_tools`) and `tool_choice`: built-in
/// OpenAI tools are refused when they are the only tools, and otherwise
/// left out and named as dropped; a name offered twice is refused.
fn tools_of(
    body: &Map<String, Value>,
    additional: &[(String, Vec<Value>)],
    names: &mut ToolNames,
    dropped: &mut Dropped,
) -> Result<(Vec<proto::Tool>, Option<proto::ToolChoice>), OpenAiError> {
    let given_tools = match body.get("tools") {
        None | Some(Value::Null) => &[][..],
        Some(Value::Array(t)) => t.as_slice(),
        Some(_) => return Err(bad("tools", "must be an array")),
    };
    let mut built_in = Vec::new();
    let mut tools = tool_list(given_tools, "tools", names, &mut built_in, dropped)?;
    for (at, list) in additional {
        tools.extend(tool_list(list, at, names, &mut built_in, dropped)?);
    }
    let tool_choice = tool_choice(body.get("tool_choice"), &mut tools, names, &built_in)?;
    if let Some((at, kind)) = built_in.first() {
        if tools.is_empty() {
            return Err(bad(
                at,
                format_args!("`{kind}` is a built-in OpenAI tool Switchyard cannot run (only `function`, `custom` and `namespace` tools)"),
            ));
        }
        for (_, kind) in &built_in {
            dropped.note(format!("tools.{kind}"));
        }
    }
    let mut seen = std::collections::HashSet::new();
    for (i, t) in tools.iter().enumerate() {
        if !seen.insert(t.name.as_str()) {
            return Err(bad(
                &format!("tools[{i}].name"),
                format_args!("`{}` is offered twice", shown(&t.name)),
            ));
        }
    }
    Ok((tools, tool_choice))
}

/// `include`: encrypted reasoning is kept; anything else is named dropped.
fn include_of(body: &Map<String, Value>, dropped: &mut Dropped) -> Result<(), OpenAiError> {
    let include = match body.get("include") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => a
            .iter()
            .map(|v| v.as_str().map(str::to_string))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| bad("include", "must be an array of strings"))?,
        Some(_) => return Err(bad("include", "must be an array of strings")),
    };
    for i in &include {
        if i != "reasoning.encrypted_content" {
            dropped.note(format!("include.{i}"));
        }
    }
    Ok(())
}

/// `background` and `store`: a background response needs to be stored.
fn kept(body: &Map<String, Value>) -> Result<(bool, bool), OpenAiError> {
    let background = opt_bool(body, "background")?.unwrap_or(false);
    let store = opt_bool(body, "store")?.unwrap_or(true);
    if background && !store {
        return Err(bad(
            "background",
            "a background response is kept to be polled: it needs `store: true`",
        ));
    }
    Ok((background, store))
}

/// The request parameters a response object repeats, with OpenAI's defaults.
fn echo(body: &Map<String, Value>, model: &str, instructions: Option<&str>) -> Map<String, Value> {
    let get = |k: &str, default: Value| body.get(k).cloned().unwrap_or(default);
    let mut e = Map::new();
    e.insert("model".into(), json!(model));
    e.insert("instructions".into(), json!(instructions));
    e.insert(
        "max_output_tokens".into(),
        get("max_output_tokens", Value::Null),
    );
    e.insert("metadata".into(), get("metadata", json!({})));
    e.insert(
        "parallel_tool_calls".into(),
        get("parallel_tool_calls", json!(true)),
    );
    e.insert(
        "reasoning".into(),
        get("reasoning", json!({"effort": null, "summary": null})),
    );
    e.insert("service_tier".into(), get("service_tier", json!("auto")));
    e.insert("temperature".into(), get("temperature", json!(1.0)));
    e.insert(
        "text".into(),
        get("text", json!({"format": {"type": "text"}})),
    );
    e.insert("tool_choice".into(), get("tool_choice", json!("auto")));
    e.insert("tools".into(), get("tools", json!([])));
    e.insert("top_p".into(), get("top_p", json!(1.0)));
    e.insert("truncation".into(), get("truncation", json!("disabled")));
    e.insert("user".into(), get("user", Value::Null));
    e.insert(
        "prompt_cache_key".into(),
        get("prompt_cache_key", Value::Null),
    );
    e.insert(
        "safety_identifier".into(),
        get("safety_identifier", Value::Null),
    );
    e
}

/// Fields with a Chat Completions equivalent go through under that name;
/// the rest are dropped and reported (a transport option is ignored).
fn other_fields(
    body: &Map<String, Value>,
    tools: &[proto::Tool],
    passthrough: &mut Map<String, Value>,
    dropped: &mut Dropped,
) -> Result<(), OpenAiError> {
    const MODELLED: [&str; 19] = [
        "model",
        "input",
        "instructions",
        "tools",
        "tool_choice",
        "previous_response_id",
        "include",
        "text",
        "reasoning",
        "max_output_tokens",
        "temperature",
        "top_p",
        "stream",
        "store",
        "background",
        "metadata",
        // Obfuscation pads deltas against side channels; Switchyard sends none.
        "stream_options",
        "prompt",
        "conversation",
    ];
    for (key, value) in body {
        if MODELLED.contains(&key.as_str()) || value.is_null() {
            continue;
        }
        match key.as_str() {
            "user" | "safety_identifier" | "prompt_cache_key" | "service_tier" => {
                if !value.is_string() {
                    return Err(bad(key, "must be a string"));
                }
                passthrough.insert(key.clone(), value.clone());
            }
            "parallel_tool_calls" => {
                if !value.is_boolean() {
                    return Err(bad(key, "must be a boolean"));
                }
                // Chat Completions takes it only beside tools.
                if !tools.is_empty() {
                    passthrough.insert(key.clone(), value.clone());
                }
            }
            "truncation" if value == "disabled" => {}
            other => dropped.note(other.to_string()),
        }
    }
    Ok(())
}

/// `text.format` (text, json_object, or a flat json_schema) and `text.verbosity`.
fn text_format(
    body: &Map<String, Value>,
    passthrough: &mut Map<String, Value>,
) -> Result<(proto::ResponseFormat, Option<proto::JsonSchema>), OpenAiError> {
    let Some(text) = body.get("text").filter(|t| !t.is_null()) else {
        return Ok((proto::ResponseFormat::Unspecified, None));
    };
    let text = text
        .as_object()
        .ok_or_else(|| bad("text", "must be an object"))?;
    if let Some(v) = text.get("verbosity").filter(|v| !v.is_null()) {
        if !v.is_string() {
            return Err(bad("text.verbosity", "must be a string"));
        }
        passthrough.insert("verbosity".into(), v.clone());
    }
    let Some(format) = text.get("format").filter(|f| !f.is_null()) else {
        return Ok((proto::ResponseFormat::Unspecified, None));
    };
    let kind = format
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or_default();
    match kind {
        "text" => Ok((proto::ResponseFormat::Text, None)),
        "json_object" => Ok((proto::ResponseFormat::JsonObject, None)),
        "json_schema" => {
            let schema = format
                .get("schema")
                .filter(|s| s.is_object())
                .ok_or_else(|| bad("text.format.schema", "required: a JSON Schema object"))?;
            let name = format
                .get("name")
                .and_then(Value::as_str)
                .unwrap_or_default();
            Ok((
                proto::ResponseFormat::JsonSchema,
                Some(proto::JsonSchema {
                    name: name.to_string(),
                    schema_json: schema.to_string(),
                    strict: format
                        .get("strict")
                        .and_then(Value::as_bool)
                        .unwrap_or(false),
                    description: format
                        .get("description")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_string(),
                }),
            ))
        }
        other => Err(bad(
            "text.format.type",
            format_args!(
                "`{}` is not one of text, json_object, json_schema",
                shown(other)
            ),
        )),
    }
}

/// `reasoning.effort` (`none` asks for no reasoning); a summary cannot be
/// made by Switchyard, so `summary` and its kin are dropped and reported.
fn reasoning(
    body: &Map<String, Value>,
    dropped: &mut Dropped,
) -> Result<Option<proto::Reasoning>, OpenAiError> {
    let Some(r) = body.get("reasoning").filter(|r| !r.is_null()) else {
        return Ok(None);
    };
    let r = r
        .as_object()
        .ok_or_else(|| bad("reasoning", "must be an object"))?;
    for (key, value) in r {
        if key != "effort" && !value.is_null() {
            dropped.note(format!("reasoning.{key}"));
        }
    }
    match r.get("effort") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(e)) if e == "none" => Ok(None),
        Some(Value::String(e)) => Ok(Some(proto::Reasoning {
            effort: e.clone(),
            ..Default::default()
        })),
        Some(_) => Err(bad("reasoning.effort", "must be a string")),
    }
}

/// One list of tools (`tools`, or an `additional_tools` item's): function
/// tools flat, custom tools as functions of one string, namespaces
/// flattened; built-in tools are collected for the caller to decide.
fn tool_list(
    list: &[Value],
    at: &str,
    names: &mut ToolNames,
    built_in: &mut Vec<(String, String)>,
    dropped: &mut Dropped,
) -> Result<Vec<proto::Tool>, OpenAiError> {
    let mut out = Vec::new();
    for (i, t) in list.iter().enumerate() {
        let here = format!("{at}[{i}]");
        let kind = t.get("type").and_then(Value::as_str).unwrap_or_default();
        match kind {
            "function" | "custom" => out.push(tool(t, &here, None, names, dropped)?),
            "namespace" => {
                let ns = t
                    .get("name")
                    .and_then(Value::as_str)
                    .filter(|n| !n.is_empty())
                    .ok_or_else(|| bad(&format!("{here}.name"), "required"))?;
                let inner = t
                    .get("tools")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad(&format!("{here}.tools"), "must be an array"))?;
                for (j, inner) in inner.iter().enumerate() {
                    let there = format!("{here}.tools[{j}]");
                    match inner.get("type").and_then(Value::as_str) {
                        Some("function" | "custom") => {
                            out.push(tool(inner, &there, Some(ns), names, dropped)?)
                        }
                        other => {
                            return Err(bad(
                                &format!("{there}.type"),
                                format_args!(
                                    "`{}` is not supported in a namespace (function or custom)",
                                    shown(other.unwrap_or("(none)"))
                                ),
                            ))
                        }
                    }
                }
            }
            k if BUILT_IN.contains(&k) => built_in.push((format!("{here}.type"), k.to_string())),
            other => {
                return Err(bad(
                    &format!("{here}.type"),
                    format_args!(
                        "`{}` is not supported (function, custom or namespace)",
                        shown(other)
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// One function or custom tool.
fn tool(
    t: &Value,
    at: &str,
    namespace: Option<&str>,
    names: &mut ToolNames,
    dropped: &mut Dropped,
) -> Result<proto::Tool, OpenAiError> {
    let name = t
        .get("name")
        .and_then(Value::as_str)
        .filter(|n| !n.is_empty())
        .ok_or_else(|| bad(&format!("{at}.name"), "required"))?;
    let custom = t.get("type").and_then(Value::as_str) == Some("custom");
    let flat = flat_name(namespace, name);
    if custom || namespace.is_some() {
        names.insert(
            flat.clone(),
            ToolName {
                name: name.to_string(),
                namespace: namespace.map(str::to_string),
                custom,
            },
        );
    }
    let description = t
        .get("description")
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    let (parameters_json, extra_json) = if custom {
        match t.pointer("/format/type").and_then(Value::as_str) {
            None | Some("text") => {}
            Some(_) => dropped.note("tools.custom.format"),
        }
        (custom_parameters().to_string(), String::new())
    } else {
        let parameters = match t.get("parameters") {
            None | Some(Value::Null) => String::new(),
            Some(p) if p.is_object() => p.to_string(),
            Some(_) => {
                return Err(bad(
                    &format!("{at}.parameters"),
                    "must be a JSON object (a JSON Schema)",
                ))
            }
        };
        let extra = match t.get("strict") {
            Some(Value::Bool(s)) => json!({ "strict": s }).to_string(),
            _ => String::new(),
        };
        (parameters, extra)
    };
    Ok(proto::Tool {
        name: flat,
        description,
        parameters_json,
        extra_json,
        ..Default::default()
    })
}

/// `tool_choice`: `auto`, `none`, `required`, a function or custom tool by
/// name, or `allowed_tools` (the tools are narrowed to those listed).
fn tool_choice(
    choice: Option<&Value>,
    tools: &mut Vec<proto::Tool>,
    names: &ToolNames,
    built_in: &[(String, String)],
) -> Result<Option<proto::ToolChoice>, OpenAiError> {
    use proto::tool_choice::Mode;
    let pick = |mode: Mode, name: String| {
        Ok(Some(proto::ToolChoice {
            mode: mode as i32,
            name,
        }))
    };
    let find = |kind: &str, name: &str, at: &str| -> Result<String, OpenAiError> {
        let custom = kind == "custom";
        let flat = names
            .iter()
            .find(|(_, n)| n.name == name && n.custom == custom && n.namespace.is_none())
            .or_else(|| {
                names
                    .iter()
                    .find(|(_, n)| n.name == name && n.custom == custom)
            })
            .map(|(flat, _)| flat.clone())
            .unwrap_or_else(|| name.to_string());
        if tools.iter().any(|t| t.name == flat) {
            Ok(flat)
        } else {
            Err(bad(
                at,
                format_args!("`{}` is not one of `tools`", shown(name)),
            ))
        }
    };
    match choice_value(choice) {
        None => Ok(None),
        Some(Value::String(s)) => match s.as_str() {
            "auto" => pick(Mode::Auto, String::new()),
            "none" => pick(Mode::None, String::new()),
            "required" if tools.is_empty() => Err(bad(
                "tool_choice",
                "`required` needs a function or custom tool in `tools`",
            )),
            "required" => pick(Mode::Any, String::new()),
            other => Err(bad(
                "tool_choice",
                format_args!("`{}` is not one of auto, none, required", shown(other)),
            )),
        },
        Some(Value::Object(o)) => {
            let kind = o.get("type").and_then(Value::as_str).unwrap_or_default();
            match kind {
                "function" | "custom" => {
                    let name = o
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or_else(|| bad("tool_choice.name", "required"))?;
                    pick(Mode::Tool, find(kind, name, "tool_choice.name")?)
                }
                "allowed_tools" => {
                    let listed = o
                        .get("tools")
                        .and_then(Value::as_array)
                        .ok_or_else(|| bad("tool_choice.tools", "must be an array"))?;
                    let mut keep = Vec::new();
                    for (i, t) in listed.iter().enumerate() {
                        let at = format!("tool_choice.tools[{i}]");
                        let kind = t.get("type").and_then(Value::as_str).unwrap_or_default();
                        let name = t.get("name").and_then(Value::as_str).unwrap_or_default();
                        if !matches!(kind, "function" | "custom") {
                            return Err(bad(
                                &format!("{at}.type"),
                                format_args!("`{}` is not a function or custom tool", shown(kind)),
                            ));
                        }
                        keep.push(find(kind, name, &format!("{at}.name"))?);
                    }
                    tools.retain(|t| keep.contains(&t.name));
                    match o.get("mode").and_then(Value::as_str) {
                        None | Some("auto") => pick(Mode::Auto, String::new()),
                        Some("required") => pick(Mode::Any, String::new()),
                        Some(other) => Err(bad(
                            "tool_choice.mode",
                            format_args!("`{}` is not one of auto, required", shown(other)),
                        )),
                    }
                }
                k if BUILT_IN.contains(&k) || built_in.iter().any(|(_, b)| b == k) => Err(bad(
                    "tool_choice.type",
                    format_args!("`{k}` is a built-in OpenAI tool Switchyard cannot run"),
                )),
                other => Err(bad(
                    "tool_choice.type",
                    format_args!(
                        "`{}` is not one of function, custom, allowed_tools",
                        shown(other)
                    ),
                )),
            }
        }
        Some(_) => Err(bad("tool_choice", "must be a string or an object")),
    }
}

fn choice_value(v: Option<&Value>) -> Option<&Value> {
    v.filter(|v| !v.is_null())
}

/// The input items as messages. Assistant-side items in a row (reasoning,
/// an assistant message, function and custom tool calls) become one
/// assistant turn; tool outputs become `tool` messages; `developer` is
/// `system`. `additional_tools` items are collected for the tool list.
fn input_items(
    items: &[Value],
    additional: &mut Vec<(String, Vec<Value>)>,
    dropped: &mut Dropped,
) -> Result<Vec<proto::Message>, OpenAiError> {
    let mut out: Vec<proto::Message> = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let at = format!("input[{i}]");
        let kind =
            item.get("type")
                .and_then(Value::as_str)
                .unwrap_or(if item.get("role").is_some() {
                    "message"
                } else {
                    ""
                });
        match kind {
            "message" => {
                let role = item.get("role").and_then(Value::as_str).unwrap_or_default();
                if role == "assistant" {
                    let parts = assistant_content(item.get("content"), &at)?;
                    if !parts.is_empty() {
                        assistant_turn(&mut out).parts.extend(parts);
                    }
                    continue;
                }
                let role = match role {
                    "user" => "user",
                    "system" | "developer" => "system",
                    other => {
                        return Err(bad(
                            &format!("{at}.role"),
                            format_args!(
                                "`{}` is not one of user, assistant, system, developer",
                                shown(other)
                            ),
                        ))
                    }
                };
                let (content, parts) = content(item.get("content"), &format!("{at}.content"))?;
                out.push(proto::Message {
                    role: role.into(),
                    content,
                    parts,
                    ..Default::default()
                });
            }
            "function_call" | "custom_tool_call" => {
                let call = tool_call(item, kind, &at)?;
                assistant_turn(&mut out).tool_calls.push(call);
            }
            "function_call_output" | "custom_tool_call_output" => {
                let call_id = item
                    .get("call_id")
                    .and_then(Value::as_str)
                    .filter(|c| !c.is_empty())
                    .ok_or_else(|| bad(&format!("{at}.call_id"), "required"))?;
                let (content, parts) = match item.get("output") {
                    Some(Value::String(s)) => (s.clone(), Vec::new()),
                    Some(v @ Value::Array(_)) => {
                        content(Some(v), &format!("{at}.output"))?
                    }
                    _ => return Err(bad(&format!("{at}.output"), "must be a string or parts")),
                };
                let empty = content.is_empty() && parts.is_empty();
                out.push(proto::Message {
                    role: "tool".into(),
                    // A tool that printed nothing still answered its call.
                    content: if empty { "(no output)".into() } else { content },
                    parts,
                    tool_call_id: call_id.to_string(),
                    ..Default::default()
                });
            }
            "reasoning" => match reasoning_item(item) {
                Some(block) => assistant_turn(&mut out).parts.push(proto::ContentPart {
                    part: Some(proto::content_part::Part::Reasoning(block)),
                    cache_control: None,
                }),
                // Reasoning without its encrypted content cannot be sent back.
                None => dropped.note("input.reasoning"),
            },
            "additional_tools" => {
                let tools = item
                    .get("tools")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad(&format!("{at}.tools"), "must be an array"))?;
                additional.push((format!("{at}.tools"), tools.clone()));
            }
            "" => return Err(bad(&format!("{at}.type"), "required")),
            other => {
                return Err(bad(
                    &format!("{at}.type"),
                    format_args!(
                        "`{}` is not supported (message, function_call, function_call_output, custom_tool_call, custom_tool_call_output, reasoning, additional_tools)",
                        shown(other)
                    ),
                ))
            }
        }
    }
    Ok(out)
}

/// The assistant turn items are being added to: the last message when it
/// is one, else a new one.
fn assistant_turn(out: &mut Vec<proto::Message>) -> &mut proto::Message {
    let new = out.last().is_none_or(|m| m.role != "assistant");
    if new {
        out.push(proto::Message {
            role: "assistant".into(),
            ..Default::default()
        });
    }
    let last = out.len() - 1;
    &mut out[last]
}

/// A function or custom tool call made earlier in the conversation.
fn tool_call(item: &Value, kind: &str, at: &str) -> Result<proto::ToolCall, OpenAiError> {
    let field = |k: &str| {
        item.get(k)
            .and_then(Value::as_str)
            .ok_or_else(|| bad(&format!("{at}.{k}"), "required (a string)"))
    };
    let call_id = field("call_id")?;
    let name = field("name")?;
    let namespace = item.get("namespace").and_then(Value::as_str);
    let arguments = if kind == "custom_tool_call" {
        custom_arguments(field("input")?)
    } else {
        field("arguments")?.to_string()
    };
    Ok(proto::ToolCall {
        id: call_id.to_string(),
        name: flat_name(namespace, name),
        arguments,
    })
}

/// A reasoning item sent back: Switchyard's own wrapper restores the block
/// it came from (any dialect); anything else is OpenAI's encrypted reasoning.
fn reasoning_item(item: &Value) -> Option<proto::ReasoningBlock> {
    let encrypted = item
        .get("encrypted_content")
        .and_then(Value::as_str)
        .filter(|e| !e.is_empty())?;
    if let Some(block) = super::response::unwrap_reasoning(encrypted) {
        return Some(block);
    }
    let texts = |key: &str| -> Vec<String> {
        item.get(key)
            .and_then(Value::as_array)
            .map(|parts| {
                parts
                    .iter()
                    .filter_map(|p| p.get("text").and_then(Value::as_str).map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut text = texts("content");
    if text.is_empty() {
        text = texts("summary");
    }
    Some(proto::ReasoningBlock {
        text: text.join("\n"),
        signature: encrypted.to_string(),
        redacted_data: String::new(),
        dialect: "openai".into(),
    })
}

fn text_part(text: &str) -> proto::ContentPart {
    proto::ContentPart {
        part: Some(proto::content_part::Part::Text(text.to_string())),
        cache_control: None,
    }
}

/// An assistant message's content: text, or `output_text` / `refusal` parts.
fn assistant_content(
    content: Option<&Value>,
    at: &str,
) -> Result<Vec<proto::ContentPart>, OpenAiError> {
    match content {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::String(s)) if s.is_empty() => Ok(Vec::new()),
        Some(Value::String(s)) => Ok(vec![text_part(s)]),
        Some(Value::Array(parts)) => {
            let mut out = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                let here = format!("{at}.content[{j}]");
                let kind = p.get("type").and_then(Value::as_str).unwrap_or_default();
                let text = match kind {
                    "output_text" | "input_text" | "text" => p.get("text"),
                    "refusal" => p.get("refusal"),
                    other => {
                        return Err(bad(
                            &format!("{here}.type"),
                            format_args!(
                            "`{}` is not supported in an assistant message (output_text, refusal)",
                            shown(other)
                        ),
                        ))
                    }
                };
                match text.and_then(Value::as_str) {
                    Some("") => {}
                    Some(t) => out.push(text_part(t)),
                    None => return Err(bad(&format!("{here}.text"), "required (a string)")),
                }
            }
            Ok(out)
        }
        Some(_) => Err(bad(&format!("{at}.content"), "must be a string or parts")),
    }
}

/// User, system or tool content: text or `input_text`, `input_image` and
/// `input_file` parts (as the content shorthand when it is one text).
fn content(
    content: Option<&Value>,
    at: &str,
) -> Result<(String, Vec<proto::ContentPart>), OpenAiError> {
    use proto::content_part::Part as P;
    let parts = match content {
        Some(Value::String(s)) => return Ok((s.clone(), Vec::new())),
        Some(Value::Array(parts)) => parts,
        _ => return Err(bad(at, "must be a string or parts")),
    };
    let mut out = Vec::with_capacity(parts.len());
    for (j, p) in parts.iter().enumerate() {
        let here = format!("{at}[{j}]");
        let field = |k: &str| p.get(k).and_then(Value::as_str).filter(|s| !s.is_empty());
        let refuse_id = |k: &str| -> Result<(), OpenAiError> {
            match field(k) {
                Some(_) => Err(bad(
                    &format!("{here}.{k}"),
                    format_args!(
                        "`{k}` (an OpenAI Files id) is not supported: send the data inline"
                    ),
                )),
                None => Ok(()),
            }
        };
        let kind = p.get("type").and_then(Value::as_str).unwrap_or_default();
        let part = match kind {
            "input_text" | "text" | "output_text" => P::Text(
                field("text")
                    .map(str::to_string)
                    .or_else(|| p.get("text").and_then(Value::as_str).map(str::to_string))
                    .ok_or_else(|| bad(&format!("{here}.text"), "required (a string)"))?,
            ),
            "input_image" => {
                refuse_id("file_id")?;
                let url = field("image_url").ok_or_else(|| {
                    bad(
                        &format!("{here}.image_url"),
                        "required (a URL or a data URL)",
                    )
                })?;
                P::Image(proto::ImagePart {
                    url: url.to_string(),
                    detail: field("detail").unwrap_or_default().to_string(),
                    ..Default::default()
                })
            }
            "input_file" => {
                refuse_id("file_id")?;
                let filename = field("filename").unwrap_or_default().to_string();
                match (field("file_data"), field("file_url")) {
                    (Some(data), _) => P::Document(proto::DocumentPart {
                        url: if data.starts_with("data:") {
                            data.to_string()
                        } else {
                            format!("data:application/pdf;base64,{data}")
                        },
                        filename,
                        ..Default::default()
                    }),
                    (None, Some(url)) => P::Document(proto::DocumentPart {
                        url: url.to_string(),
                        filename,
                        ..Default::default()
                    }),
                    (None, None) => {
                        return Err(bad(
                            &format!("{here}.file_data"),
                            "required (base64 or a data URL; or `file_url`)",
                        ))
                    }
                }
            }
            other => {
                return Err(bad(
                    &format!("{here}.type"),
                    format_args!(
                        "`{}` is not supported (input_text, input_image, input_file)",
                        shown(other)
                    ),
                ))
            }
        };
        out.push(proto::ContentPart {
            part: Some(part),
            cache_control: None,
        });
    }
    if let [proto::ContentPart {
        part: Some(P::Text(t)),
        ..
    }] = out.as_slice()
    {
        return Ok((t.clone(), Vec::new()));
    }
    Ok((String::new(), out))
}
