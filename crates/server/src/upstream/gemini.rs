//! Google Gemini's wire, for AI Studio (`kind = "gemini"`: `POST {base_url}/
//! v1beta/models/{model}:streamGenerateContent?alt=sse`, the key in
//! `x-goog-api-key`) and Vertex AI (`kind = "vertex_gemini"`: the same body
//! at `{base_url}/v1/projects/{project}/locations/{region}/publishers/google/
//! models/{model}:streamGenerateContent?alt=sse` with the service account's
//! token). Owns the request body (user/model `contents`, `systemInstruction`,
//! function declarations, `generationConfig` with thinking and JSON output,
//! thought signatures sent back on their parts) and a strict decoder: each
//! `data:` is a whole GenerateContentResponse holding the delta, and a stream
//! is complete only once a `finishReason` arrived (reference D.7). Pure
//! functions over values and bytes: no I/O, and the key is never logged or
//! kept anywhere but the sensitive header value handed back.

use std::collections::{HashMap, VecDeque};

use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::{json, Map, Value};

use crate::chat::{MediaSource, Part, PartKind, ReasoningAsk, ReasoningBlock, ToolChoice};
use crate::policy::outcome::{Failure, OutcomeClass};
use crate::upstream::classify::{classify_error_object, in_body};
use crate::upstream::openai::{f32_json, merge_absent, u32_field};
use crate::upstream::sse::SseEvent;
use crate::upstream::wire::{Auth, Call, Quirks, Wire, WireRequest};
use crate::upstream::{
    ChatMessage, ChatRequest, Chunk, Completion, Dialect, Dropped, FinishReason, StreamDecoder,
    Usage,
};

/// Where the body goes: the URL, the auth and which file URIs Google fetches differ.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Host {
    /// generativelanguage.googleapis.com (`kind = "gemini"`).
    AiStudio,
    /// Vertex AI (`kind = "vertex_gemini"`).
    Vertex,
}

/// Gemini on one host (`kind = "gemini"` or `"vertex_gemini"`).
pub struct GeminiWire {
    pub host: Host,
}

/// The `gemini` kind's wire: AI Studio.
pub static AI_STUDIO: GeminiWire = GeminiWire {
    host: Host::AiStudio,
};

/// The `vertex_gemini` kind's wire.
pub static VERTEX: GeminiWire = GeminiWire { host: Host::Vertex };

impl Wire for GeminiWire {
    fn name(&self) -> &'static str {
        match self.host {
            Host::AiStudio => "gemini",
            Host::Vertex => "vertex_gemini",
        }
    }

    fn dialect(&self) -> Dialect {
        Dialect::Gemini
    }

    fn quirks(&self) -> Quirks {
        Quirks {
            auth: match self.host {
                Host::AiStudio => Auth::ApiKey { required: true },
                Host::Vertex => Auth::GoogleServiceAccount,
            },
            api_version: false,
            always_streamed: true,
            embeddings: false,
            service_tiers: &[],
        }
    }

    fn request(&self, call: &Call<'_>, dropped: &mut Dropped) -> Result<WireRequest, Failure> {
        let ep = call.endpoint;
        let headers = match self.host {
            Host::AiStudio => auth_headers(call.key),
            // The token rides as a bearer, like OpenAI's key.
            Host::Vertex => crate::upstream::openai::auth_headers(call.bearer),
        };
        Ok(WireRequest::json(
            endpoint(
                self.host,
                &ep.base_url,
                ep.project.as_deref().unwrap_or_default(),
                ep.region.as_deref().unwrap_or_default(),
                &call.chat.model,
            ),
            headers,
            build_body(call.chat, self.host, dropped),
        ))
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        Box::new(GeminiDecoder::new())
    }
}

/// The streaming URL. A model written as `models/gemini-…` is taken as its name.
pub fn endpoint(host: Host, base_url: &str, project: &str, region: &str, model: &str) -> String {
    let enc = crate::upstream::encode_path_segment;
    let base = base_url.trim_end_matches('/');
    let model = enc(model.strip_prefix("models/").unwrap_or(model));
    match host {
        Host::AiStudio => {
            format!("{base}/v1beta/models/{model}:streamGenerateContent?alt=sse")
        }
        Host::Vertex => format!(
            "{base}/v1/projects/{}/locations/{}/publishers/google/models/{model}:streamGenerateContent?alt=sse",
            enc(project),
            enc(region),
        ),
    }
}

/// `x-goog-api-key`, marked sensitive. No key (or one that is not a valid
/// header value) gives no header: Google answers 403 and the attempt is `Auth`.
pub fn auth_headers(api_key: Option<&str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(key) = api_key.filter(|k| !k.is_empty()) {
        if let Ok(mut value) = HeaderValue::from_str(key) {
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static("x-goog-api-key"), value);
        }
    }
    headers
}

/// The JSON request body. Every system message, in order, becomes
/// `systemInstruction`; assistant turns are `model` turns and tool results
/// `functionResponse` parts of a `user` turn (consecutive turns of one role
/// are merged, as Gemini wants them alternating). Tools are declared with
/// `parametersJsonSchema` (the caller's JSON Schema verbatim, no conversion
/// to Google's OpenAPI subset). Gemini caches prompts on its own, so cache
/// markers are dropped; what else the wire cannot carry is noted in `dropped`.
pub fn build_body(req: &ChatRequest, host: Host, dropped: &mut Dropped) -> Value {
    let mut body = Map::new();
    if let Some(system) = system_json(&req.messages, dropped) {
        body.insert("systemInstruction".into(), system);
    }
    body.insert(
        "contents".into(),
        Value::Array(contents_json(&req.messages, host, dropped)),
    );
    let passthrough = req.passthrough_for(Dialect::Gemini);
    if !req.tools.is_empty() {
        let declarations = req.tools.iter().map(|t| {
            let mut f = Map::new();
            f.insert("name".into(), json!(t.name));
            if !t.description.is_empty() {
                f.insert("description".into(), json!(t.description));
            }
            if !t.parameters.is_null() {
                f.insert("parametersJsonSchema".into(), t.parameters.clone());
            }
            if t.cache.is_some() {
                dropped.note("cache_control");
            }
            match (&t.extra, passthrough.is_some()) {
                (Some(extra), true) => merge_absent(&mut f, extra),
                (Some(_), false) => dropped.note("tools.extra"),
                (None, _) => {}
            }
            Value::Object(f)
        });
        body.insert(
            "tools".into(),
            json!([{"functionDeclarations": declarations.collect::<Vec<_>>()}]),
        );
        let mode = match &req.tool_choice {
            ToolChoice::Auto => None,
            ToolChoice::Any => Some(json!({"mode": "ANY"})),
            ToolChoice::Tool(name) => Some(json!({"mode": "ANY", "allowedFunctionNames": [name]})),
        };
        if let Some(config) = mode {
            body.insert(
                "toolConfig".into(),
                json!({"functionCallingConfig": config}),
            );
        }
    }
    let config = generation_config(req, dropped);
    if !config.is_empty() {
        body.insert("generationConfig".into(), Value::Object(config));
    }
    match (passthrough, req.passthrough.as_deref()) {
        // Same wire: what the caller sent verbatim wins over the mapping.
        (Some(p), _) => {
            for (k, v) in &p.fields {
                body.insert(k.clone(), v.clone());
            }
            for (name, _) in &p.headers {
                dropped.note(format!("header.{name}"));
            }
        }
        (None, Some(other)) => dropped.passthrough(other),
        (None, None) => {}
    }
    Value::Object(body)
}

/// `generationConfig`: limits, sampling, stop sequences, JSON output and thinking.
fn generation_config(req: &ChatRequest, dropped: &mut Dropped) -> Map<String, Value> {
    let mut config = Map::new();
    if let Some(n) = req.max_tokens {
        config.insert("maxOutputTokens".into(), json!(n));
    }
    if let Some(t) = req.temperature.and_then(f32_json) {
        config.insert("temperature".into(), t);
    }
    if let Some(p) = req.top_p.and_then(f32_json) {
        config.insert("topP".into(), p);
    }
    if !req.stop.is_empty() {
        config.insert("stopSequences".into(), json!(req.stop));
    }
    if let Some(schema) = &req.json_schema {
        config.insert("responseMimeType".into(), json!("application/json"));
        config.insert("responseJsonSchema".into(), schema.schema.clone());
    } else if req.json_mode {
        config.insert("responseMimeType".into(), json!("application/json"));
    }
    if let Some(r) = &req.reasoning {
        match thinking_config(r, &req.model) {
            Some(thinking) => {
                config.insert("thinkingConfig".into(), thinking);
            }
            None => dropped.note("thinking"),
        }
    }
    config
}

/// Whether a model takes `thinkingLevel` (Gemini 3 and later); Gemini 1.x
/// and 2.x take only `thinkingBudget`.
fn takes_thinking_level(model: &str) -> bool {
    let name = model.rsplit('/').next().unwrap_or(model);
    !(name.starts_with("gemini-1") || name.starts_with("gemini-2"))
}

/// `thinkingConfig` for a reasoning ask: adaptive is Gemini's automatic
/// budget (-1), a budget is `thinkingBudget`, an effort is `thinkingLevel`
/// on models that take one and a budget on the others. Thoughts are always
/// asked for (`includeThoughts`). `None` for an effort Gemini has no
/// equivalent of.
fn thinking_config(r: &ReasoningAsk, model: &str) -> Option<Value> {
    let mut config = Map::new();
    if r.adaptive {
        config.insert("thinkingBudget".into(), json!(-1));
    } else if let Some(budget) = r.budget_tokens {
        config.insert("thinkingBudget".into(), json!(budget));
    } else if let Some(effort) = r.effort.as_deref() {
        if takes_thinking_level(model) {
            let level = match effort {
                "none" | "minimal" => "MINIMAL",
                "low" => "LOW",
                "medium" => "MEDIUM",
                "high" | "xhigh" | "max" => "HIGH",
                _ => return None,
            };
            config.insert("thinkingLevel".into(), json!(level));
        } else {
            let budget = match effort {
                "none" => 0,
                "minimal" => 512,
                "low" => 1024,
                "medium" => 8192,
                "high" => 16384,
                "xhigh" | "max" => 24576,
                _ => return None,
            };
            config.insert("thinkingBudget".into(), json!(budget));
        }
    }
    config.insert("includeThoughts".into(), json!(true));
    Some(Value::Object(config))
}

/// `systemInstruction`: the text of every system message, in order.
fn system_json(messages: &[ChatMessage], dropped: &mut Dropped) -> Option<Value> {
    let mut parts = Vec::new();
    for m in messages.iter().filter(|m| m.role == "system") {
        for p in m.content_parts().iter() {
            if p.cache.is_some() {
                dropped.note("cache_control");
            }
            // Only text belongs in a system turn (the doors refuse the rest).
            if let PartKind::Text(t) = &p.kind {
                parts.push(json!({"text": t}));
            }
        }
    }
    (!parts.is_empty()).then(|| json!({"parts": parts}))
}

/// The turns, merged where one role follows itself.
#[derive(Default)]
struct Turns(Vec<(&'static str, Vec<Value>)>);

impl Turns {
    fn push(&mut self, role: &'static str, parts: Vec<Value>) {
        if parts.is_empty() {
            return;
        }
        match self.0.last_mut() {
            Some((last, held)) if *last == role => held.extend(parts),
            _ => self.0.push((role, parts)),
        }
    }

    fn into_json(self) -> Vec<Value> {
        self.0
            .into_iter()
            .map(|(role, parts)| json!({"role": role, "parts": parts}))
            .collect()
    }
}

/// `contents`: every non-system message as a `user` or `model` turn.
fn contents_json(messages: &[ChatMessage], host: Host, dropped: &mut Dropped) -> Vec<Value> {
    // A function response names its function; the caller's tool message
    // names only the call, so the name comes from the call.
    let names: HashMap<&str, &str> = messages
        .iter()
        .flat_map(|m| &m.tool_calls)
        .map(|c| (c.id.as_str(), c.name.as_str()))
        .collect();
    let mut turns = Turns::default();
    for m in messages {
        match m.role.as_str() {
            "system" => {}
            "assistant" => turns.push("model", model_parts(m, host, dropped)),
            "tool" => turns.push("user", vec![function_response(m, &names, dropped)]),
            _ => {
                let parts = m
                    .content_parts()
                    .iter()
                    .filter_map(|p| part_json(p, host, dropped))
                    .collect();
                turns.push("user", parts);
            }
        }
    }
    turns.into_json()
}

/// One content part in Gemini's shape; `None` for what it cannot carry.
fn part_json(p: &Part, host: Host, dropped: &mut Dropped) -> Option<Value> {
    if p.cache.is_some() {
        dropped.note("cache_control");
    }
    match &p.kind {
        PartKind::Text(t) => Some(json!({"text": t})),
        PartKind::Image(img) => match &img.source {
            MediaSource::Data(d) => Some(inline_data(&img.media_type, d)),
            MediaSource::Url(u) => file_data(host, u, &img.media_type).or_else(|| {
                dropped.note("image_url");
                None
            }),
        },
        PartKind::Document(doc) => match &doc.source {
            // A text document is its text.
            MediaSource::Data(d) if doc.media_type.starts_with("text/") => {
                let text = String::from_utf8_lossy(d);
                Some(json!({"text": match &doc.title {
                    Some(t) => format!("{t}\n\n{text}"),
                    None => text.into_owned(),
                }}))
            }
            MediaSource::Data(d) => Some(inline_data(&doc.media_type, d)),
            MediaSource::Url(u) => file_data(host, u, &doc.media_type).or_else(|| {
                dropped.note("document_url");
                None
            }),
        },
        PartKind::Reasoning(_) => {
            dropped.note("reasoning");
            None
        }
    }
}

fn inline_data(media_type: &str, data: &[u8]) -> Value {
    use base64::Engine;
    json!({"inlineData": {"mimeType": media_type,
        "data": base64::engine::general_purpose::STANDARD.encode(data)}})
}

/// A file Google fetches itself: on AI Studio only its own Files API URIs,
/// on Vertex Cloud Storage (`gs://`) and https URLs. A media type is
/// required; without one it is read from the file's extension.
fn file_data(host: Host, url: &str, media_type: &str) -> Option<Value> {
    let fetched = match host {
        Host::AiStudio => url.starts_with("https://generativelanguage.googleapis.com/"),
        Host::Vertex => url.starts_with("gs://") || url.starts_with("https://"),
    };
    if !fetched {
        return None;
    }
    let mime = if media_type.is_empty() {
        let path = url.split(['?', '#']).next().unwrap_or(url);
        let ext = path.rsplit('.').next()?.to_ascii_lowercase();
        match ext.as_str() {
            "png" => "image/png",
            "jpg" | "jpeg" => "image/jpeg",
            "gif" => "image/gif",
            "webp" => "image/webp",
            "pdf" => "application/pdf",
            _ => return None,
        }
    } else {
        media_type
    };
    Some(json!({"fileData": {"mimeType": mime, "fileUri": url}}))
}

/// A model turn: thoughts Gemini returned (sent back as python-genai's chat
/// does), text, then earlier calls as `functionCall` parts with object
/// `args` (arguments that are not a JSON object are sent as `{}`). Gemini's
/// thought signatures go back on the calls, the first on the first call
/// (Gemini requires it there); any left over on the last part, as Gemini
/// puts it on the last part of an answer without calls. Reasoning of another
/// family is dropped.
fn model_parts(m: &ChatMessage, host: Host, dropped: &mut Dropped) -> Vec<Value> {
    let mut thoughts = Vec::new();
    let mut signatures = VecDeque::new();
    let mut rest = Vec::new();
    for p in m.content_parts().iter() {
        match &p.kind {
            PartKind::Reasoning(r) if r.dialect == Some(Dialect::Gemini) => {
                if !r.text.is_empty() {
                    thoughts.push(json!({"text": r.text, "thought": true}));
                }
                signatures.extend(r.signature.clone());
            }
            _ => rest.extend(part_json(p, host, dropped)),
        }
    }
    for call in &m.tool_calls {
        let args = serde_json::from_str::<Value>(&call.arguments)
            .ok()
            .filter(Value::is_object)
            .unwrap_or_else(|| json!({}));
        let mut part = json!({"functionCall": {"name": call.name, "args": args}});
        if let Some(sig) = signatures.pop_front() {
            part["thoughtSignature"] = json!(sig);
        }
        rest.push(part);
    }
    for sig in signatures {
        match rest.last_mut() {
            Some(last) if last.get("thoughtSignature").is_none() => {
                last["thoughtSignature"] = json!(sig);
            }
            _ => rest.push(json!({"text": "", "thoughtSignature": sig})),
        }
    }
    thoughts.extend(rest);
    thoughts
}

/// A tool result as a `functionResponse` part: its text as JSON when it
/// parses to an object, else wrapped as `{"result": …}`; a failed tool's
/// as `{"error": …}`. Media in a tool result has no place here.
fn function_response(m: &ChatMessage, names: &HashMap<&str, &str>, dropped: &mut Dropped) -> Value {
    if m.cache.is_some() || m.parts.iter().any(|p| p.cache.is_some()) {
        dropped.note("cache_control");
    }
    if m.has(|k| matches!(k, PartKind::Image(_) | PartKind::Document(_))) {
        dropped.note("tool_result_media");
    }
    let text = m.text_content();
    let output = serde_json::from_str::<Value>(&text).unwrap_or_else(|_| json!(text));
    let response = match output {
        error if m.is_error => json!({"error": error}),
        Value::Object(o) => Value::Object(o),
        other => json!({"result": other}),
    };
    let id = m.tool_call_id.as_deref().unwrap_or_default();
    let name = names.get(id).copied().unwrap_or(id);
    json!({"functionResponse": {"name": name, "response": response}})
}

/// Streaming decoder for `streamGenerateContent?alt=sse`.
///
/// Choices made where the reference leaves room: `STOP` after function calls
/// finishes as `ToolCalls`; the content filters (`SAFETY`, `RECITATION`,
/// `BLOCKLIST`, `PROHIBITED_CONTENT`, `SPII`, `LANGUAGE` and the image ones)
/// and a blocked prompt are `ContentFilter`; `MALFORMED_FUNCTION_CALL` is
/// `Protocol` (retryable), `OTHER` and any other reason `Protocol` that is not
/// retried on the same target; a second candidate is `Protocol` (one was
/// asked for); a function call without an id gets one made from the
/// response id. Usage is the last `usageMetadata`.
#[derive(Debug, Default)]
pub struct GeminiDecoder {
    /// The mapped `finishReason` of the candidate.
    finish: Option<FinishReason>,
    /// `promptFeedback.blockReason`: the prompt was refused.
    blocked: bool,
    /// Function calls seen so far.
    calls: u32,
    /// `responseId`, for the ids of calls that came without one.
    response_id: Option<String>,
    /// Thought text since the last signature.
    thought: String,
    /// Signed reasoning so far, in order.
    reasoning: Vec<ReasoningBlock>,
    usage: Option<Usage>,
    /// The failure that ended the stream; repeated by later calls.
    failed: Option<Failure>,
}

impl GeminiDecoder {
    pub fn new() -> Self {
        Self::default()
    }

    fn handle(&mut self, ev: &SseEvent, out: &mut Vec<Chunk>) -> Result<(), Failure> {
        if let Some(raw) = &ev.error {
            return Err(error_payload_failure(raw));
        }
        if ev.data.trim().is_empty() {
            return Ok(());
        }
        let v: Value = serde_json::from_str(&ev.data)
            .map_err(|_| in_body(OutcomeClass::Protocol, "malformed JSON in stream event"))?;
        if v.get("error").is_some_and(Value::is_object) {
            return Err(classify_error_object(&v, Some(200)));
        }
        if let Some(id) = v.get("responseId").and_then(Value::as_str) {
            self.response_id = Some(id.to_owned());
        }
        if let Some(u) = v.get("usageMetadata") {
            self.usage = Some(usage_of(u));
        }
        if v.pointer("/promptFeedback/blockReason").is_some() {
            self.blocked = true;
        }
        for c in v
            .get("candidates")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let index = u32_field(c, "index").unwrap_or(0);
            if index != 0 {
                return Err(in_body(
                    OutcomeClass::Protocol,
                    format!("stream carries candidate {index}; one candidate was asked for"),
                ));
            }
            for part in c
                .pointer("/content/parts")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                self.on_part(part, out);
            }
            if let Some(reason) = c.get("finishReason").and_then(Value::as_str) {
                self.finish = Some(map_finish_reason(reason)?);
            }
        }
        Ok(())
    }

    /// One part: thought text, answer text or a whole function call; a
    /// thought signature on it closes the reasoning so far (its chunk comes
    /// before the part's answer, after its thought).
    fn on_part(&mut self, part: &Value, out: &mut Vec<Chunk>) {
        let text = part.get("text").and_then(Value::as_str).unwrap_or("");
        let thought = part.get("thought").and_then(Value::as_bool) == Some(true);
        if thought && !text.is_empty() {
            self.thought.push_str(text);
            out.push(Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
                text: text.to_owned(),
                signature: None,
                redacted: None,
            })));
        }
        if let Some(sig) = part.get("thoughtSignature").and_then(Value::as_str) {
            out.push(Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
                text: String::new(),
                signature: Some(sig.to_owned()),
                redacted: None,
            })));
            self.reasoning.push(ReasoningBlock {
                text: std::mem::take(&mut self.thought),
                signature: Some(sig.to_owned()),
                redacted: None,
                dialect: Some(Dialect::Gemini),
            });
        }
        if !thought && !text.is_empty() {
            out.push(Chunk::Text(text.into()));
        }
        if let Some(call) = part.get("functionCall") {
            let index = self.calls;
            self.calls += 1;
            let id = call
                .get("id")
                .and_then(Value::as_str)
                .filter(|id| !id.is_empty())
                .map_or_else(|| self.made_id(index), str::to_owned);
            let arguments = match call.get("args") {
                None | Some(Value::Null) => "{}".to_owned(),
                Some(args) => args.to_string(),
            };
            out.push(Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
                index,
                id: Some(id),
                name: call.get("name").and_then(Value::as_str).map(str::to_owned),
                arguments,
            })));
        }
    }

    /// An id for a call Gemini gave none: unique per response.
    fn made_id(&self, index: u32) -> String {
        let response: String = self
            .response_id
            .as_deref()
            .unwrap_or("gemini")
            .chars()
            .filter(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == '-')
            .take(64)
            .collect();
        format!("call_{response}_{index}")
    }
}

impl StreamDecoder for GeminiDecoder {
    fn on_event(&mut self, event: &SseEvent, out: &mut Vec<Chunk>) -> Result<(), Failure> {
        if let Some(f) = &self.failed {
            return Err(f.clone());
        }
        let result = self.handle(event, out);
        if let Err(f) = &result {
            self.failed = Some(f.clone());
        }
        result
    }

    fn finish(&mut self) -> Result<Completion, Failure> {
        if let Some(f) = &self.failed {
            return Err(f.clone());
        }
        let finish_reason = match self.finish {
            Some(FinishReason::Stop) if self.calls > 0 => FinishReason::ToolCalls,
            Some(reason) => reason,
            // A refused prompt comes back without candidates.
            None if self.blocked => FinishReason::ContentFilter,
            None => {
                return Err(in_body(
                    OutcomeClass::Truncated,
                    "stream ended without a finishReason",
                ))
            }
        };
        let mut reasoning = std::mem::take(&mut self.reasoning);
        if !self.thought.is_empty() {
            reasoning.push(ReasoningBlock {
                text: std::mem::take(&mut self.thought),
                dialect: Some(Dialect::Gemini),
                ..ReasoningBlock::default()
            });
        }
        Ok(Completion {
            finish_reason,
            usage: self.usage,
            service_tier: None,
            reasoning,
        })
    }
}

/// Usage from `usageMetadata`: `promptTokenCount` includes the cached part
/// (a cache read here) and tool-use prompts are input too; thoughts are not
/// in `candidatesTokenCount` and are added to the output.
fn usage_of(u: &Value) -> Usage {
    let count = |k: &str| u32_field(u, k).unwrap_or(0);
    let prompt = count("promptTokenCount");
    let cached = count("cachedContentTokenCount").min(prompt);
    let thoughts = count("thoughtsTokenCount");
    Usage {
        input_tokens: (prompt - cached).saturating_add(count("toolUsePromptTokenCount")),
        output_tokens: count("candidatesTokenCount").saturating_add(thoughts),
        cache_read_input_tokens: cached,
        reasoning_tokens: thoughts,
        ..Usage::default()
    }
}

/// Maps a `finishReason`; the abnormal ones are failures.
fn map_finish_reason(reason: &str) -> Result<FinishReason, Failure> {
    match reason {
        "STOP" => Ok(FinishReason::Stop),
        "MAX_TOKENS" => Ok(FinishReason::Length),
        "SAFETY"
        | "RECITATION"
        | "BLOCKLIST"
        | "PROHIBITED_CONTENT"
        | "SPII"
        | "LANGUAGE"
        | "IMAGE_SAFETY"
        | "IMAGE_PROHIBITED_CONTENT"
        | "IMAGE_RECITATION" => Ok(FinishReason::ContentFilter),
        "MALFORMED_FUNCTION_CALL" => Err(in_body(
            OutcomeClass::Protocol,
            "abnormal finishReason MALFORMED_FUNCTION_CALL",
        )),
        other => {
            let label: String = other
                .chars()
                .filter(|c| c.is_ascii_alphanumeric() || *c == '_')
                .take(32)
                .collect();
            Err(Failure {
                should_retry: Some(false),
                ..in_body(
                    OutcomeClass::Protocol,
                    format!("abnormal finishReason {label}"),
                )
            })
        }
    }
}

/// A non-standard `error:` field, which may not be JSON.
fn error_payload_failure(raw: &str) -> Failure {
    match serde_json::from_str::<Value>(raw) {
        Ok(v) => classify_error_object(&v, Some(200)),
        Err(_) => in_body(
            OutcomeClass::ServerError,
            "upstream sent a non-JSON error event",
        ),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;

    use super::*;
    use crate::chat::{CacheTtl, Document, Image, JsonSchema, Passthrough, ToolCall, ToolSpec};
    use crate::upstream::sse::transcript::{run_all, text_of};

    macro_rules! fixture {
        ($name:literal) => {
            include_str!(concat!("../../../../tests/fixtures/transcripts/", $name))
        };
    }

    fn decode(text: &str) -> (Vec<Chunk>, Result<Completion, Failure>) {
        run_all(text, GeminiDecoder::new)
    }

    fn msg(role: &str, content: &str) -> ChatMessage {
        ChatMessage::text(role, content)
    }

    fn tool_result(id: &str, content: &str) -> ChatMessage {
        ChatMessage {
            tool_call_id: Some(id.into()),
            ..msg("tool", content)
        }
    }

    fn call(id: &str, name: &str, arguments: &str) -> ToolCall {
        ToolCall {
            id: id.into(),
            name: name.into(),
            arguments: arguments.into(),
        }
    }

    fn part(kind: PartKind) -> Part {
        Part { kind, cache: None }
    }

    fn body(req: &ChatRequest, host: Host) -> (Value, Vec<String>) {
        let mut dropped = Dropped::default();
        let body = build_body(req, host, &mut dropped);
        (body, dropped.into_names())
    }

    #[test]
    fn each_host_has_its_url_and_its_auth() {
        assert_eq!(
            endpoint(Host::AiStudio, "https://generativelanguage.googleapis.com/", "", "", "gemini-2.5-flash"),
            "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            endpoint(Host::AiStudio, "http://h", "", "", "models/gemini-2.5-pro"),
            "http://h/v1beta/models/gemini-2.5-pro:streamGenerateContent?alt=sse"
        );
        assert_eq!(
            endpoint(Host::Vertex, "https://aiplatform.googleapis.com", "my-project", "global", "gemini-2.5-flash@001"),
            "https://aiplatform.googleapis.com/v1/projects/my-project/locations/global/publishers/google/models/gemini-2.5-flash%40001:streamGenerateContent?alt=sse"
        );
        assert_eq!(AI_STUDIO.host, Host::AiStudio);
        assert_eq!(VERTEX.host, Host::Vertex);
        let h = auth_headers(Some("AIza-test"));
        let key = h.get("x-goog-api-key").unwrap();
        assert_eq!(key.to_str().unwrap(), "AIza-test");
        assert!(key.is_sensitive());
        assert!(h.get("authorization").is_none());
        assert!(auth_headers(None).is_empty());
        assert!(auth_headers(Some("")).is_empty());
    }

    #[test]
    fn a_conversation_becomes_user_and_model_turns_with_function_calls_and_responses() {
        let req = ChatRequest {
            model: "gemini-2.5-flash".into(),
            messages: vec![
                msg("system", "be brief"),
                msg("user", "weather and time?"),
                ChatMessage {
                    tool_calls: vec![
                        call("c1", "weather", r#"{"city":"Paris"}"#),
                        call("c2", "time", "not json"),
                        call("c3", "weather", r#"{"city":"Oslo"}"#),
                    ],
                    ..msg("assistant", "Checking.")
                },
                tool_result("c1", r#"{"temp":21}"#),
                tool_result("c2", "noon"),
                ChatMessage {
                    is_error: true,
                    ..tool_result("c3", "no station")
                },
                msg("user", "thanks"),
                msg("system", "answer in French"),
                msg("assistant", "De rien."),
                msg("assistant", "Autre chose ?"),
            ]
            .into(),
            max_tokens: Some(256),
            temperature: Some(0.2),
            top_p: Some(0.9),
            stop: vec!["END".into()],
            tools: vec![ToolSpec {
                name: "weather".into(),
                description: "get weather".into(),
                parameters: json!({"type": "object", "properties": {"city": {"type": "string"}}}),
                cache: None,
                extra: None,
            }]
            .into(),
            tool_choice: ToolChoice::Tool("weather".into()),
            json_mode: true,
            stream: true,
            ..Default::default()
        };
        let (body, dropped) = body(&req, Host::AiStudio);
        assert!(dropped.is_empty(), "{dropped:?}");
        let want = json!({
            "systemInstruction": {"parts": [{"text": "be brief"}, {"text": "answer in French"}]},
            "contents": [
                {"role": "user", "parts": [{"text": "weather and time?"}]},
                {"role": "model", "parts": [
                    {"text": "Checking."},
                    {"functionCall": {"name": "weather", "args": {"city": "Paris"}}},
                    {"functionCall": {"name": "time", "args": {}}},
                    {"functionCall": {"name": "weather", "args": {"city": "Oslo"}}}
                ]},
                {"role": "user", "parts": [
                    {"functionResponse": {"name": "weather", "response": {"temp": 21}}},
                    {"functionResponse": {"name": "time", "response": {"result": "noon"}}},
                    {"functionResponse": {"name": "weather", "response": {"error": "no station"}}},
                    {"text": "thanks"}
                ]},
                {"role": "model", "parts": [{"text": "De rien."}, {"text": "Autre chose ?"}]}
            ],
            "tools": [{"functionDeclarations": [{"name": "weather", "description": "get weather",
                "parametersJsonSchema": {"type": "object", "properties": {"city": {"type": "string"}}}}]}],
            "toolConfig": {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["weather"]}},
            "generationConfig": {"maxOutputTokens": 256, "temperature": 0.2, "topP": 0.9,
                "stopSequences": ["END"], "responseMimeType": "application/json"}
        });
        assert_eq!(body, want);
        // Any tool: ANY without names; the default (auto) sends no toolConfig.
        let any = ChatRequest {
            tool_choice: ToolChoice::Any,
            ..req.clone()
        };
        assert_eq!(
            body_of(&any)["toolConfig"],
            json!({"functionCallingConfig": {"mode": "ANY"}})
        );
        let auto = ChatRequest {
            tool_choice: ToolChoice::Auto,
            ..req
        };
        assert!(body_of(&auto).get("toolConfig").is_none());
    }

    fn body_of(req: &ChatRequest) -> Value {
        body(req, Host::AiStudio).0
    }

    fn image(source: MediaSource, media_type: &str) -> Part {
        part(PartKind::Image(Image {
            source,
            media_type: media_type.into(),
            detail: None,
        }))
    }

    fn document(source: MediaSource, media_type: &str) -> Part {
        part(PartKind::Document(Document {
            source,
            media_type: media_type.into(),
            title: Some("Notes".into()),
            filename: None,
        }))
    }

    #[test]
    fn media_go_inline_and_urls_only_where_google_fetches_them() {
        let user = ChatMessage {
            role: "user".into(),
            parts: vec![
                part(PartKind::Text("what is in these?".into())),
                image(
                    MediaSource::Data(Bytes::from_static(b"\x89PNG")),
                    "image/png",
                ),
                document(
                    MediaSource::Data(Bytes::from_static(b"%PDF-1.4")),
                    "application/pdf",
                ),
                document(
                    MediaSource::Data(Bytes::from_static(b"plain words")),
                    "text/plain",
                ),
                image(MediaSource::Url("https://example.com/cat.png".into()), ""),
                image(
                    MediaSource::Url(
                        "https://generativelanguage.googleapis.com/v1beta/files/abc".into(),
                    ),
                    "image/jpeg",
                ),
                document(MediaSource::Url("gs://bucket/report.pdf".into()), ""),
            ],
            ..Default::default()
        };
        let req = ChatRequest {
            model: "gemini-2.5-flash".into(),
            messages: vec![user].into(),
            ..Default::default()
        };
        let (studio, dropped) = body(&req, Host::AiStudio);
        assert_eq!(
            studio["contents"][0]["parts"],
            json!([
                {"text": "what is in these?"},
                {"inlineData": {"mimeType": "image/png", "data": "iVBORw=="}},
                {"inlineData": {"mimeType": "application/pdf", "data": "JVBERi0xLjQ="}},
                {"text": "Notes\n\nplain words"},
                {"fileData": {"mimeType": "image/jpeg",
                              "fileUri": "https://generativelanguage.googleapis.com/v1beta/files/abc"}}
            ])
        );
        assert_eq!(dropped, ["image_url", "document_url"]);
        let (vertex, dropped) = body(&req, Host::Vertex);
        let parts = vertex["contents"][0]["parts"].as_array().unwrap();
        assert_eq!(
            parts[4],
            json!({"fileData": {"mimeType": "image/png", "fileUri": "https://example.com/cat.png"}})
        );
        assert_eq!(
            parts[6],
            json!({"fileData": {"mimeType": "application/pdf", "fileUri": "gs://bucket/report.pdf"}})
        );
        assert!(dropped.is_empty(), "{dropped:?}");
    }

    fn reasoning(dialect: Dialect, text: &str, sig: &str) -> Part {
        part(PartKind::Reasoning(ReasoningBlock {
            text: text.into(),
            signature: Some(sig.into()),
            redacted: None,
            dialect: Some(dialect),
        }))
    }

    #[test]
    fn thought_signatures_go_back_on_their_calls_and_another_familys_reasoning_is_dropped() {
        let with_calls = ChatMessage {
            role: "assistant".into(),
            parts: vec![
                reasoning(Dialect::Anthropic, "claude thinking", "EqQB"),
                reasoning(Dialect::Gemini, "I need the weather.", "CiQB0e2Kb1"),
            ],
            tool_calls: vec![call("c1", "weather", "{}"), call("c2", "time", "{}")],
            ..Default::default()
        };
        let req = ChatRequest {
            model: "gemini-3-pro-preview".into(),
            messages: vec![msg("user", "go"), with_calls].into(),
            ..Default::default()
        };
        let (b, dropped) = body(&req, Host::AiStudio);
        assert_eq!(
            b["contents"][1]["parts"],
            json!([
                {"text": "I need the weather.", "thought": true},
                {"functionCall": {"name": "weather", "args": {}}, "thoughtSignature": "CiQB0e2Kb1"},
                {"functionCall": {"name": "time", "args": {}}}
            ])
        );
        assert_eq!(dropped, ["reasoning"]);
        // An answer without calls: the signature on its last part.
        let text_answer = ChatMessage {
            role: "assistant".into(),
            parts: vec![
                reasoning(Dialect::Gemini, "", "Eu0BCu"),
                part(PartKind::Text("42".into())),
            ],
            ..Default::default()
        };
        let req = ChatRequest {
            messages: vec![msg("user", "?"), text_answer].into(),
            ..req
        };
        assert_eq!(
            body_of(&req)["contents"][1]["parts"],
            json!([{"text": "42", "thoughtSignature": "Eu0BCu"}])
        );
    }

    #[test]
    fn reasoning_asks_become_thinking_config() {
        let ask = |effort: Option<&str>, budget: Option<u32>, adaptive: bool| ReasoningAsk {
            effort: effort.map(Into::into),
            budget_tokens: budget,
            adaptive,
        };
        let rows = [
            (
                "gemini-2.5-flash",
                ask(None, None, true),
                Some(json!({"thinkingBudget": -1, "includeThoughts": true})),
            ),
            (
                "gemini-2.5-flash",
                ask(None, Some(2048), false),
                Some(json!({"thinkingBudget": 2048, "includeThoughts": true})),
            ),
            (
                "gemini-2.5-flash",
                ask(Some("high"), None, false),
                Some(json!({"thinkingBudget": 16384, "includeThoughts": true})),
            ),
            (
                "gemini-2.5-pro",
                ask(Some("none"), None, false),
                Some(json!({"thinkingBudget": 0, "includeThoughts": true})),
            ),
            (
                "gemini-3-pro-preview",
                ask(Some("high"), None, false),
                Some(json!({"thinkingLevel": "HIGH", "includeThoughts": true})),
            ),
            (
                "gemini-3-flash",
                ask(Some("minimal"), None, false),
                Some(json!({"thinkingLevel": "MINIMAL", "includeThoughts": true})),
            ),
            (
                "gemini-3-flash",
                ask(None, None, false),
                Some(json!({"includeThoughts": true})),
            ),
            ("gemini-3-flash", ask(Some("extreme"), None, false), None),
        ];
        for (model, ask, want) in rows {
            let req = ChatRequest {
                model: model.into(),
                reasoning: Some(ask.clone()),
                ..Default::default()
            };
            let (b, dropped) = body(&req, Host::AiStudio);
            assert_eq!(
                b.pointer("/generationConfig/thinkingConfig").cloned(),
                want,
                "{model} {ask:?}"
            );
            assert_eq!(
                dropped.is_empty(),
                want.is_some(),
                "{model} {ask:?}: {dropped:?}"
            );
        }
    }

    #[test]
    fn a_schema_is_response_json_schema_cache_markers_are_dropped_and_passthrough_is_gemini_only() {
        let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
        let req = ChatRequest {
            model: "gemini-2.5-flash".into(),
            messages: vec![
                ChatMessage {
                    role: "system".into(),
                    parts: vec![Part {
                        kind: PartKind::Text("long prompt".into()),
                        cache: Some(CacheTtl::OneHour),
                    }],
                    ..Default::default()
                },
                msg("user", "json please"),
            ]
            .into(),
            json_schema: Some(JsonSchema {
                name: "answer".into(),
                schema: schema.clone(),
                strict: true,
                description: None,
            }),
            json_mode: true,
            passthrough: Some(Arc::new(Passthrough {
                dialect: Some(Dialect::Anthropic),
                fields: [("context_management".to_string(), json!({}))]
                    .into_iter()
                    .collect(),
                headers: vec![("anthropic-beta".into(), "x".into())],
                dropped: vec!["metadata".into()],
            })),
            ..Default::default()
        };
        let (b, dropped) = body(&req, Host::AiStudio);
        assert_eq!(
            b["generationConfig"],
            json!({"responseMimeType": "application/json", "responseJsonSchema": schema})
        );
        assert_eq!(
            b["systemInstruction"],
            json!({"parts": [{"text": "long prompt"}]})
        );
        assert!(b.get("context_management").is_none());
        assert_eq!(
            dropped,
            [
                "cache_control",
                "passthrough.context_management",
                "header.anthropic-beta"
            ]
        );
        // Gemini's own passthrough wins over the mapping; tool extras join the declaration.
        let req = ChatRequest {
            tools: vec![ToolSpec {
                name: "f".into(),
                description: String::new(),
                parameters: Value::Null,
                cache: None,
                extra: Some([("behavior".to_string(), json!("NON_BLOCKING"))].into_iter().collect()),
            }].into(),
            passthrough: Some(Arc::new(Passthrough {
                dialect: Some(Dialect::Gemini),
                fields: [
                    ("safetySettings".to_string(), json!([{"category": "HARM_CATEGORY_HARASSMENT", "threshold": "BLOCK_ONLY_HIGH"}])),
                    ("generationConfig".to_string(), json!({"candidateCount": 1})),
                ]
                .into_iter()
                .collect(),
                ..Passthrough::default()
            })),
            ..req
        };
        let (b, dropped) = body(&req, Host::Vertex);
        assert_eq!(b["generationConfig"], json!({"candidateCount": 1}));
        assert_eq!(b["safetySettings"][0]["threshold"], "BLOCK_ONLY_HIGH");
        assert_eq!(
            b["tools"],
            json!([{"functionDeclarations": [{"name": "f", "behavior": "NON_BLOCKING"}]}])
        );
        assert_eq!(dropped, ["cache_control"]);
    }

    #[test]
    fn a_text_stream_completes_with_usage_normalised() {
        let (chunks, done) = decode(fixture!("gemini_text.sse"));
        assert_eq!(
            chunks,
            vec![Chunk::Text("Hel".into()), Chunk::Text("lo.".into())]
        );
        let done = done.unwrap();
        assert_eq!(done.finish_reason, FinishReason::Stop);
        assert_eq!(
            done.usage,
            Some(Usage {
                input_tokens: 200,
                output_tokens: 43,
                cache_read_input_tokens: 1000,
                reasoning_tokens: 40,
                ..Usage::default()
            })
        );
        assert!(done.reasoning.is_empty());
    }

    #[test]
    fn thoughts_and_whole_calls_stream_and_the_signature_is_kept_for_the_next_turn() {
        let (chunks, done) = decode(fixture!("gemini_thoughts_tool_calls.sse"));
        assert_eq!(
            chunks,
            vec![
                Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
                    text: "**Planning** I need the weather.".into(),
                    signature: None,
                    redacted: None
                })),
                Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
                    text: String::new(),
                    signature: Some("CiQB0e2Kb1".into()),
                    redacted: None
                })),
                Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
                    index: 0,
                    id: Some("call_resp-7_0".into()),
                    name: Some("get_weather".into()),
                    arguments: r#"{"city":"Paris"}"#.into()
                })),
                Chunk::ToolCall(Box::new(crate::chat::ToolCallDelta {
                    index: 1,
                    id: Some("call_resp-7_1".into()),
                    name: Some("get_time".into()),
                    arguments: "{}".into()
                })),
            ]
        );
        let done = done.unwrap();
        assert_eq!(done.finish_reason, FinishReason::ToolCalls);
        assert_eq!(
            done.reasoning,
            vec![ReasoningBlock {
                text: "**Planning** I need the weather.".into(),
                signature: Some("CiQB0e2Kb1".into()),
                redacted: None,
                dialect: Some(Dialect::Gemini),
            }]
        );
        assert_eq!(done.usage.unwrap().output_tokens, 95);
    }

    #[test]
    fn a_signature_on_the_last_text_part_closes_the_thoughts_before_it() {
        let (chunks, done) = decode(fixture!("gemini_thought_signature_on_text.sse"));
        assert_eq!(text_of(&chunks), "42");
        assert!(
            matches!(&chunks[2], Chunk::Reasoning(r) if r.signature.as_deref() == Some("Eu0BCuoBAdHtim9"))
        );
        let done = done.unwrap();
        assert_eq!(done.finish_reason, FinishReason::Length);
        assert_eq!(done.reasoning.len(), 1);
        assert_eq!(done.reasoning[0].text, "Weighing it.");
        // Sent back, it rides on the answer's last part.
        let turn = ChatMessage {
            role: "assistant".into(),
            parts: done
                .reasoning
                .into_iter()
                .map(|r| part(PartKind::Reasoning(r)))
                .chain([part(PartKind::Text("42".into()))])
                .collect(),
            ..Default::default()
        };
        assert_eq!(
            model_parts(&turn, Host::AiStudio, &mut Dropped::default()),
            vec![
                json!({"text": "Weighing it.", "thought": true}),
                json!({"text": "42", "thoughtSignature": "Eu0BCuoBAdHtim9"}),
            ]
        );
    }

    #[test]
    fn a_safety_stop_and_a_blocked_prompt_are_content_refusals() {
        let (chunks, done) = decode(fixture!("gemini_safety.sse"));
        assert_eq!(text_of(&chunks), "Sure, the first");
        assert_eq!(done.unwrap().finish_reason, FinishReason::ContentFilter);
        let (chunks, done) = decode(fixture!("gemini_blocked_prompt.sse"));
        assert!(chunks.is_empty());
        let done = done.unwrap();
        assert_eq!(done.finish_reason, FinishReason::ContentFilter);
        assert_eq!(done.usage.unwrap().input_tokens, 14);
    }

    #[test]
    fn a_stream_without_a_finish_reason_is_truncated_and_an_error_in_it_classified() {
        let (chunks, end) = decode(fixture!("gemini_no_finish_reason.sse"));
        assert_eq!(text_of(&chunks), "Hello there");
        assert_eq!(end.unwrap_err().class, OutcomeClass::Truncated);
        let (chunks, end) = decode(fixture!("gemini_error_midstream.sse"));
        assert_eq!(text_of(&chunks), "Hel");
        let f = end.unwrap_err();
        assert_eq!(f.class, OutcomeClass::Overloaded);
        assert_eq!(f.http_status, Some(200));
        assert_eq!(decode("").1.unwrap_err().class, OutcomeClass::Truncated);
    }

    #[test]
    fn finish_reasons_are_completions_refusals_or_abnormal() {
        let frame = |reason: &str| {
            format!("data: {{\"candidates\":[{{\"content\":{{\"parts\":[{{\"text\":\"x\"}}]}},\"finishReason\":\"{reason}\"}}]}}\n\n")
        };
        for reason in [
            "SAFETY",
            "RECITATION",
            "BLOCKLIST",
            "PROHIBITED_CONTENT",
            "SPII",
            "LANGUAGE",
            "IMAGE_SAFETY",
        ] {
            assert_eq!(
                decode(&frame(reason)).1.unwrap().finish_reason,
                FinishReason::ContentFilter,
                "{reason}"
            );
        }
        assert_eq!(
            decode(&frame("STOP")).1.unwrap().finish_reason,
            FinishReason::Stop
        );
        assert_eq!(
            decode(&frame("MAX_TOKENS")).1.unwrap().finish_reason,
            FinishReason::Length
        );
        let f = decode(&frame("MALFORMED_FUNCTION_CALL")).1.unwrap_err();
        assert_eq!(f.class, OutcomeClass::Protocol);
        assert!(f.retry_same_target(), "retried once on the same model");
        for reason in [
            "OTHER",
            "FINISH_REASON_UNSPECIFIED",
            "TOO_MANY_TOOL_CALLS",
            "SOMETHING_NEW",
        ] {
            let f = decode(&frame(reason)).1.unwrap_err();
            assert_eq!(f.class, OutcomeClass::Protocol, "{reason}");
            assert!(!f.retry_same_target(), "{reason}");
        }
        let second =
            "data: {\"candidates\":[{\"content\":{\"parts\":[{\"text\":\"x\"}]},\"index\":1}]}\n\n";
        assert_eq!(decode(second).1.unwrap_err().class, OutcomeClass::Protocol);
        assert_eq!(
            decode("data: {\"candidates\":[\n\n").1.unwrap_err().class,
            OutcomeClass::Protocol
        );
        let with_id = "data: {\"candidates\":[{\"content\":{\"parts\":[{\"functionCall\":{\"id\":\"fc-1\",\"name\":\"f\"}}]},\"finishReason\":\"STOP\"}]}\n\n";
        let (chunks, done) = decode(with_id);
        assert!(
            matches!(&chunks[0], Chunk::ToolCall(c) if c.id.as_deref() == Some("fc-1") && c.arguments == "{}")
        );
        assert_eq!(done.unwrap().finish_reason, FinishReason::ToolCalls);
    }
}
