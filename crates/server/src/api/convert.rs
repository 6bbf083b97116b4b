//! Conversions between the gRPC messages and the internal request and event
//! types, with request validation (every rejection names the field).

use std::time::Duration;

use tokio::time::Instant;

use super::content;
use crate::chat::{ChatMessage, ChatRequest, Chunk, FinishReason, PartKind, ToolChoice, ToolSpec};
use crate::config::LimitsConfig;
use crate::error::RequestError;
use crate::proto;
use crate::request::Needs;
use crate::request::RequestSpec;
use crate::sink::{Event, Finished, Started, Tier};
use crate::state::jobs::{JobRecord, JobState};

fn invalid(msg: impl Into<String>) -> RequestError {
    RequestError::InvalidRequest(msg.into())
}

/// How a stream's journaled request (the encoded `CompletionRequest`)
/// becomes a spec again when another replica takes the stream over.
pub fn stored_request(limits: LimitsConfig) -> crate::task::Decode {
    std::sync::Arc::new(move |bytes: &[u8]| {
        let req: proto::CompletionRequest = prost::Message::decode(bytes).map_err(|e| {
            RequestError::Unavailable(format!("the stream's stored request is unreadable: {e}"))
        })?;
        let id: u64 = rand::random();
        request_spec(req, format!("sy-takeover-{id:016x}").into(), None, &limits)
    })
}

/// Validates a request and turns it into a routable spec.
pub fn request_spec(
    req: proto::CompletionRequest,
    request_id: std::sync::Arc<str>,
    deadline: Option<Instant>,
    limits: &LimitsConfig,
) -> Result<RequestSpec, RequestError> {
    check_sizes(&req, limits)?;
    check_sampling(&req)?;
    if !(0..=proto::ResponseFormat::JsonSchema as i32).contains(&req.response_format) {
        return Err(invalid(format!(
            "response_format: {} is not a ResponseFormat value",
            req.response_format
        )));
    }
    let messages = messages(req.messages)?;
    let mut tools = tools(req.tools)?;
    let tool_choice = tool_choice(req.tool_choice, &mut tools)?;
    let json_schema = content::json_schema(req.json_schema)?;
    if req.response_format == proto::ResponseFormat::JsonSchema as i32 && json_schema.is_none() {
        return Err(invalid(
            "json_schema: required with response_format RESPONSE_FORMAT_JSON_SCHEMA",
        ));
    }
    let json_mode =
        req.response_format == proto::ResponseFormat::JsonObject as i32 && json_schema.is_none();
    let reasoning = content::reasoning(req.reasoning)?;
    let passthrough = content::passthrough(req.passthrough)?;
    let has = |pred: fn(&PartKind) -> bool| messages.iter().any(|m| m.has(pred));
    let reqs = req.requirements.unwrap_or_default();
    let needs = Needs {
        tools: reqs.tools || !tools.is_empty(),
        json: reqs.json || json_mode,
        vision: reqs.vision || has(|k| matches!(k, PartKind::Image(_))),
        pdf: reqs.pdf || has(|k| matches!(k, PartKind::Document(_))),
        reasoning: reqs.reasoning || reasoning.is_some(),
        json_schema: reqs.json_schema || json_schema.is_some(),
        min_context_tokens: reqs.min_context_tokens,
    };
    let pin = match req.target.as_str() {
        "" => None,
        t if t.len() <= 256
            && t.split_once('/')
                .is_some_and(|(p, m)| !p.is_empty() && !m.is_empty()) =>
        {
            Some(req.target.clone())
        }
        t => return Err(invalid(format!("target: `{t}` is not `provider/model`"))),
    };
    let tenant = if req.tenant.is_empty() {
        "default".to_string()
    } else {
        req.tenant
    };
    Ok(RequestSpec {
        // The intake keeps the bytes as sent where they may be stored.
        source: None,
        from_queue: false,
        pin,
        resume_after: req.resume_after_seq,
        request_id,
        tenant,
        idempotency_key: (!req.idempotency_key.is_empty()).then_some(req.idempotency_key),
        route: req.route,
        chat: ChatRequest {
            model: Default::default(),
            messages: messages.into(),
            max_tokens: (req.max_tokens > 0).then_some(req.max_tokens),
            temperature: req.temperature,
            top_p: req.top_p,
            stop: req.stop,
            // No tools: the empty slice every request shares (no allocation).
            tools: if tools.is_empty() {
                Default::default()
            } else {
                tools.into()
            },
            tool_choice,
            service_tier: None,
            json_mode,
            json_schema,
            reasoning,
            passthrough,
            stream: true,
        },
        needs,
        deadline,
    })
}

/// The route is named and the request fits `[limits]`.
fn check_sizes(req: &proto::CompletionRequest, limits: &LimitsConfig) -> Result<(), RequestError> {
    if req.route.is_empty() {
        return Err(invalid("route: must not be empty"));
    }
    // Caller-chosen names become map keys, labels and log fields: bounded
    // here, and never echoed back at length.
    for (field, value) in [
        ("route", &req.route),
        ("tenant", &req.tenant),
        ("idempotency_key", &req.idempotency_key),
    ] {
        if value.len() > limits.max_id_bytes {
            return Err(invalid(format!(
                "{field}: {} bytes exceed limits.max_id_bytes ({})",
                value.len(),
                limits.max_id_bytes
            )));
        }
        if value.chars().any(char::is_control) {
            return Err(invalid(format!(
                "{field}: must not contain control characters"
            )));
        }
    }
    if req.messages.is_empty() {
        return Err(invalid("messages: at least one message is required"));
    }
    if req.messages.len() > limits.max_messages {
        return Err(invalid(format!(
            "messages: {} messages exceed the limit of {}",
            req.messages.len(),
            limits.max_messages
        )));
    }
    // Text only: media bytes are bounded by the request's size.
    let prompt_bytes: usize = req
        .messages
        .iter()
        .map(|m| {
            m.content.len()
                + m.parts
                    .iter()
                    .map(|p| match &p.part {
                        Some(proto::content_part::Part::Text(t)) => t.len(),
                        _ => 0,
                    })
                    .sum::<usize>()
        })
        .sum();
    if prompt_bytes > limits.max_prompt_bytes {
        return Err(invalid(format!(
            "messages: {prompt_bytes} bytes of content exceed the limit of {}",
            limits.max_prompt_bytes
        )));
    }
    if req.tools.len() > limits.max_tools {
        return Err(invalid(format!(
            "tools: {} tools exceed the limit of {}",
            req.tools.len(),
            limits.max_tools
        )));
    }
    if req.max_tokens > limits.max_tokens {
        return Err(invalid(format!(
            "max_tokens: {} exceeds the limit of {}",
            req.max_tokens, limits.max_tokens
        )));
    }
    Ok(())
}

/// Temperature and top_p within their ranges.
fn check_sampling(req: &proto::CompletionRequest) -> Result<(), RequestError> {
    if let Some(t) = req.temperature {
        if !(0.0..=2.0).contains(&t) {
            return Err(invalid(format!("temperature: {t} is outside 0..=2")));
        }
    }
    if let Some(p) = req.top_p {
        if !(p > 0.0 && p <= 1.0) {
            return Err(invalid(format!("top_p: {p} is outside (0, 1]")));
        }
    }
    Ok(())
}

/// The conversation, each message checked (role, content, tool call id).
fn messages(input: Vec<proto::Message>) -> Result<Vec<ChatMessage>, RequestError> {
    input
        .into_iter()
        .enumerate()
        .map(|(i, m)| content::message(i, m))
        .collect()
}

/// The tools, each with a valid name and a JSON Schema object.
fn tools(input: Vec<proto::Tool>) -> Result<Vec<ToolSpec>, RequestError> {
    let mut tools = Vec::with_capacity(input.len());
    for (i, t) in input.into_iter().enumerate() {
        if t.name.is_empty()
            || t.name.len() > 64
            || !t
                .name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(invalid(format!(
                "tools[{i}].name: `{}` must be 1-64 letters, digits, `_` or `-`",
                t.name
            )));
        }
        let parameters = if t.parameters_json.trim().is_empty() {
            serde_json::json!({"type": "object", "properties": {}})
        } else {
            match serde_json::from_str::<serde_json::Value>(&t.parameters_json) {
                Ok(v) if v.is_object() => v,
                _ => {
                    return Err(invalid(format!(
                        "tools[{i}].parameters_json: must be a JSON object (a JSON Schema)"
                    )))
                }
            }
        };
        let at = format!("tools[{i}]");
        tools.push(ToolSpec {
            cache: content::cache(t.cache_control, &at)?,
            extra: content::tool_extra(&t.extra_json, &at)?,
            name: t.name,
            description: t.description,
            parameters,
        });
    }
    Ok(tools)
}

/// The tool choice against the tools offered; `MODE_NONE` withdraws them.
fn tool_choice(
    choice: Option<proto::ToolChoice>,
    tools: &mut Vec<ToolSpec>,
) -> Result<ToolChoice, RequestError> {
    use proto::tool_choice::Mode;
    let Some(choice) = choice else {
        return Ok(ToolChoice::Auto);
    };
    let mode = Mode::try_from(choice.mode).map_err(|_| {
        invalid(format!(
            "tool_choice.mode: {} is not a ToolChoice.Mode value",
            choice.mode
        ))
    })?;
    if mode != Mode::Tool && !choice.name.is_empty() {
        return Err(invalid(
            "tool_choice.name: only MODE_TOOL names a tool".to_string(),
        ));
    }
    Ok(match mode {
        Mode::Unspecified | Mode::Auto => ToolChoice::Auto,
        Mode::None => {
            tools.clear();
            ToolChoice::Auto
        }
        Mode::Any if tools.is_empty() => {
            return Err(invalid(
                "tool_choice.mode: MODE_ANY needs at least one tool in `tools`".to_string(),
            ))
        }
        Mode::Any => ToolChoice::Any,
        Mode::Tool => {
            if !tools.iter().any(|t| t.name == choice.name) {
                let mut name = choice.name;
                crate::api::errors::truncate(&mut name, 64);
                return Err(invalid(format!(
                    "tool_choice.name: `{name}` is not one of `tools`"
                )));
            }
            ToolChoice::Tool(choice.name)
        }
    })
}

/// Parses a `grpc-timeout` header value ("100m", "5S", ...).
pub fn parse_grpc_timeout(value: &str) -> Option<Duration> {
    if value.len() < 2 || value.len() > 9 {
        return None;
    }
    let (digits, unit) = value.split_at(value.len() - 1);
    let n: u64 = digits.parse().ok()?;
    Some(match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    })
}

pub fn tier(t: Tier) -> proto::Tier {
    match t {
        Tier::Primary => proto::Tier::Primary,
        Tier::Fallback => proto::Tier::Fallback,
        Tier::Downshift => proto::Tier::Downshift,
        Tier::Cache => proto::Tier::Cache,
        Tier::SemanticCache => proto::Tier::SemanticCache,
        Tier::Queued => proto::Tier::Queued,
        Tier::Refused => proto::Tier::Refused,
    }
}

pub fn finish_reason(f: FinishReason) -> proto::FinishReason {
    match f {
        FinishReason::Stop => proto::FinishReason::Stop,
        FinishReason::Length => proto::FinishReason::Length,
        FinishReason::ToolCalls => proto::FinishReason::ToolCalls,
        FinishReason::ContentFilter => proto::FinishReason::ContentFilter,
        FinishReason::Refusal => proto::FinishReason::Refusal,
    }
}

/// Its names shared with the request, not copied.
fn started(s: Started) -> proto::Started {
    proto::Started {
        provider: s.provider.into(),
        model: s.model.into(),
        attempt: s.attempt,
        tier: tier(s.tier) as i32,
        request_id: s.request_id.into(),
        dropped: s.dropped,
        resume_token: s.resume_token.map(Into::into).unwrap_or_default(),
    }
}

/// Moved, not copied; the names in `served_by` shared with the request,
/// `request_id` copied (the generated message's strings are owned).
fn finished(f: Finished) -> proto::Finished {
    proto::Finished {
        finish_reason: finish_reason(f.finish_reason) as i32,
        usage: Some(content::usage_proto(&f.usage, f.usage_estimated)),
        served_by: Some(proto::ServedBy {
            provider: f.provider.into(),
            model: f.model.into(),
        }),
        tier: tier(f.tier) as i32,
        attempts: f.attempts,
        request_id: f.request_id.to_string(),
        upstream_request_id: f.upstream_request_id.unwrap_or_default(),
        cache_age_ms: f.cache_age.map_or(0, |a| a.as_millis() as u64),
        cache_similarity: f.cache_similarity.unwrap_or(0.0),
        replayed: f.replayed,
        cost_usd: f.cost_usd,
        service_tier: f.service_tier.unwrap_or_default(),
        reasoning: f
            .reasoning
            .iter()
            .map(content::reasoning_block_proto)
            .collect(),
        dropped: f.dropped,
        resumable: f.resumable,
        hedged: f.hedged,
        won_attempt: f.won_attempt,
    }
}

/// One internal event as a gRPC stream message.
/// Event `seq` of a stream (`CompletionEvent.seq`).
pub fn event(seq: u64, e: Event) -> proto::CompletionEvent {
    use proto::completion_event::Event as E;
    let inner = match e {
        Event::Started(s) => E::Started(started(*s)),
        Event::Chunk(Chunk::Text(text)) => E::Delta(proto::Delta {
            text,
            ..Default::default()
        }),
        Event::Chunk(Chunk::Reasoning(r)) => E::Delta(proto::Delta {
            reasoning: r.text,
            ..Default::default()
        }),
        Event::Chunk(Chunk::ToolCall(call)) => E::Delta(proto::Delta {
            tool_calls: vec![proto::ToolCallDelta {
                index: call.index,
                id: call.id.unwrap_or_default(),
                name: call.name.unwrap_or_default(),
                arguments: call.arguments,
            }],
            ..Default::default()
        }),
        Event::Reset {
            reason,
            failed_attempt,
        } => E::Reset(proto::Reset {
            reason,
            failed_attempt,
        }),
        Event::Finished(f) => E::Finished(finished(*f)),
        Event::Queued(q) => E::Job(job(&q.record, q.position, q.eta)),
        Event::Moved {
            resume_token,
            after_seq,
        } => E::Moved(proto::Moved {
            resume_token: resume_token.to_string(),
            after_seq,
        }),
        Event::Continued(c) => E::Continued(proto::Continued {
            failed_attempt: c.failed_attempt,
            provider: c.provider,
            model: c.model,
            at_seq: c.at_seq,
            attempt: c.attempt,
        }),
    };
    proto::CompletionEvent {
        seq,
        event: Some(inner),
    }
}

/// Folds the event stream of one request into a unary response.
#[derive(Default)]
pub struct Assembler {
    text: String,
    calls: Vec<proto::ToolCall>,
}

impl Assembler {
    /// Feeds one event; returns the response once `Finished` arrives.
    pub fn push(&mut self, e: Event) -> Option<proto::CompletionResponse> {
        match e {
            // A continuation's text simply follows; a buffered call never moves.
            Event::Started(_) | Event::Continued(_) | Event::Moved { .. } => None,
            Event::Reset { .. } => {
                self.text.clear();
                self.calls.clear();
                None
            }
            Event::Chunk(Chunk::Text(t)) => {
                // A whole answer is one chunk: kept, not copied.
                if self.text.is_empty() {
                    self.text = t.into_string();
                } else {
                    self.text.push_str(&t);
                }
                None
            }
            // Whole, with signatures, in `Finished`.
            Event::Chunk(Chunk::Reasoning(_)) => None,
            Event::Chunk(Chunk::ToolCall(call)) => {
                let crate::chat::ToolCallDelta {
                    index,
                    id,
                    name,
                    arguments,
                } = *call;
                let i = index as usize;
                if self.calls.len() <= i {
                    self.calls.resize_with(i + 1, Default::default);
                }
                let call = &mut self.calls[i];
                if let Some(id) = id {
                    call.id = id;
                }
                if let Some(name) = name {
                    call.name = name;
                }
                call.arguments.push_str(&arguments);
                None
            }
            Event::Finished(f) => {
                let fin = finished(*f);
                Some(proto::CompletionResponse {
                    text: std::mem::take(&mut self.text),
                    tool_calls: std::mem::take(&mut self.calls),
                    finish_reason: fin.finish_reason,
                    usage: fin.usage,
                    served_by: fin.served_by,
                    tier: fin.tier,
                    attempts: fin.attempts,
                    request_id: fin.request_id,
                    upstream_request_id: fin.upstream_request_id,
                    cache_age_ms: fin.cache_age_ms,
                    cache_similarity: fin.cache_similarity,
                    replayed: fin.replayed,
                    cost_usd: fin.cost_usd,
                    job: None,
                    service_tier: fin.service_tier,
                    reasoning: fin.reasoning,
                    dropped: fin.dropped,
                })
            }
            Event::Queued(q) => Some(proto::CompletionResponse {
                tier: proto::Tier::Queued as i32,
                job: Some(Box::new(job(&q.record, q.position, q.eta))),
                ..Default::default()
            }),
        }
    }
}

/// A stored job as the API shows it.
pub fn job(r: &JobRecord, position: u64, eta: std::time::Duration) -> proto::Job {
    let state = match r.state {
        JobState::Queued => proto::JobState::Queued,
        JobState::Running => proto::JobState::Running,
        JobState::Succeeded => proto::JobState::Succeeded,
        JobState::Failed => proto::JobState::Failed,
        JobState::Expired => proto::JobState::Expired,
    };
    let queued = r.state == JobState::Queued;
    proto::Job {
        id: r.id.clone(),
        state: state as i32,
        attempts: r.attempts,
        result: r
            .result
            .as_deref()
            .and_then(|b| <proto::CompletionResponse as prost::Message>::decode(b).ok())
            .map(Box::new),
        error: r.error.clone().unwrap_or_default(),
        error_reason: r.error_reason.clone().unwrap_or_default(),
        estimated_start_ms: if queued { eta.as_millis() as u64 } else { 0 },
        route: r.route.clone(),
        created_unix_ms: r.created_ms,
        updated_unix_ms: r.updated_ms,
        position: if queued { position } else { 0 },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn req() -> proto::CompletionRequest {
        proto::CompletionRequest {
            route: "chat".into(),
            messages: vec![proto::Message {
                role: "user".into(),
                content: "hi".into(),
                ..Default::default()
            }],
            ..Default::default()
        }
    }

    #[test]
    fn a_requests_tools_are_shared_by_its_copies_and_no_tools_allocate_nothing() {
        use std::sync::Arc;
        let none = request_spec(req(), "id".into(), None, &LimitsConfig::default()).unwrap();
        let empty: Arc<[crate::chat::ToolSpec]> = Default::default();
        assert!(
            Arc::ptr_eq(&none.chat.tools, &empty),
            "the shared empty slice"
        );
        let mut r = req();
        r.tools = vec![proto::Tool {
            name: "f".into(),
            parameters_json: r#"{"type":"object"}"#.into(),
            ..Default::default()
        }];
        let spec = request_spec(r, "id".into(), None, &LimitsConfig::default()).unwrap();
        let attempt = spec.chat.clone();
        assert!(
            Arc::ptr_eq(&spec.chat.tools, &attempt.tools),
            "not copied per attempt"
        );
        assert_eq!(attempt.tools[0].name, "f");
    }

    fn rejects(r: proto::CompletionRequest, field: &str) {
        match request_spec(r, "id".into(), None, &LimitsConfig::default()) {
            Err(RequestError::InvalidRequest(m)) => assert!(m.starts_with(field), "{m}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn validation_names_the_field() {
        rejects(
            proto::CompletionRequest {
                route: String::new(),
                ..req()
            },
            "route",
        );
        rejects(
            proto::CompletionRequest {
                messages: vec![],
                ..req()
            },
            "messages",
        );
        let mut r = req();
        r.messages[0].role = "robot".into();
        rejects(r, "messages[0].role");
        let mut r = req();
        r.tools.push(proto::Tool {
            name: "f".into(),
            description: String::new(),
            parameters_json: "[1".into(),
            ..Default::default()
        });
        rejects(r, "tools[0].parameters_json");
        rejects(
            proto::CompletionRequest {
                temperature: Some(3.0),
                ..req()
            },
            "temperature",
        );
    }

    #[test]
    fn tools_imply_the_tools_capability() {
        let mut r = req();
        r.tools.push(proto::Tool {
            name: "f".into(),
            description: String::new(),
            parameters_json: String::new(),
            ..Default::default()
        });
        let spec = request_spec(r, "id".into(), None, &LimitsConfig::default()).unwrap();
        assert!(spec.needs.tools);
    }

    #[test]
    fn tool_choice_must_fit_the_tools_and_none_withdraws_them() {
        use proto::tool_choice::Mode;
        let with = |mode: Mode, name: &str| {
            let mut r = req();
            r.tools.push(proto::Tool {
                name: "f".into(),
                ..Default::default()
            });
            r.tool_choice = Some(proto::ToolChoice {
                mode: mode as i32,
                name: name.into(),
            });
            request_spec(r, "id".into(), None, &LimitsConfig::default())
        };
        let spec = with(Mode::Tool, "f").unwrap();
        assert_eq!(spec.chat.tool_choice, ToolChoice::Tool("f".into()));
        assert_eq!(
            with(Mode::Any, "").unwrap().chat.tool_choice,
            ToolChoice::Any
        );
        let none = with(Mode::None, "").unwrap();
        assert!(none.chat.tools.is_empty() && !none.needs.tools);
        let msg = |r: Result<RequestSpec, RequestError>| r.err().unwrap().to_string();
        assert!(msg(with(Mode::Tool, "g")).contains("tool_choice.name: `g` is not one of `tools`"));
        assert!(msg(with(Mode::Auto, "f")).contains("tool_choice.name: only MODE_TOOL"));
        let mut r = req();
        r.tool_choice = Some(proto::ToolChoice {
            mode: Mode::Any as i32,
            name: String::new(),
        });
        let e = request_spec(r, "id".into(), None, &LimitsConfig::default());
        assert!(msg(e).contains("MODE_ANY needs at least one tool"));
        // A different choice is a different request for the caches.
        assert_ne!(
            with(Mode::Tool, "f").unwrap().fingerprint(),
            with(Mode::Auto, "").unwrap().fingerprint()
        );
    }

    #[test]
    fn grpc_timeout_units() {
        assert_eq!(parse_grpc_timeout("100m"), Some(Duration::from_millis(100)));
        assert_eq!(parse_grpc_timeout("5S"), Some(Duration::from_secs(5)));
        assert_eq!(parse_grpc_timeout("2M"), Some(Duration::from_secs(120)));
        assert_eq!(parse_grpc_timeout("1x"), None);
        assert_eq!(parse_grpc_timeout("123456789m"), None);
    }

    #[test]
    fn assembler_discards_output_on_reset_and_joins_tool_fragments() {
        let mut a = Assembler::default();
        assert!(a
            .push(Event::Chunk(Chunk::Text("partial".into())))
            .is_none());
        a.push(Event::Reset {
            reason: "x".into(),
            failed_attempt: 1,
        });
        a.push(Event::Chunk(Chunk::ToolCall(Box::new(
            crate::chat::ToolCallDelta {
                index: 0,
                id: Some("c1".into()),
                name: Some("f".into()),
                arguments: "{\"a\":".into(),
            },
        ))));
        a.push(Event::Chunk(Chunk::ToolCall(Box::new(
            crate::chat::ToolCallDelta {
                index: 0,
                id: None,
                name: None,
                arguments: "1}".into(),
            },
        ))));
        let done = a
            .push(Event::Finished(Box::new(Finished {
                finish_reason: FinishReason::ToolCalls,
                usage: Default::default(),
                usage_estimated: false,
                provider: "p".into(),
                model: "m".into(),
                tier: Tier::Fallback,
                attempts: 2,
                request_id: "r".into(),
                upstream_request_id: None,
                replayed: false,
                cache_age: None,
                cache_similarity: None,
                cost_usd: 0.0,
                service_tier: None,
                reasoning: Vec::new(),
                dropped: Vec::new(),
                resumable: false,
                hedged: false,
                won_attempt: 0,
            })))
            .unwrap();
        assert_eq!(done.text, "");
        assert_eq!(done.tool_calls[0].arguments, "{\"a\":1}");
        assert_eq!(done.tool_calls[0].name, "f");
        assert_eq!(done.attempts, 2);
    }
}
