//! The mock's Google Gemini side: `POST /v1beta/models/{model}:streamGenerateContent`
//! (`?alt=sse`) and `:generateContent` for AI Studio (an `x-goog-api-key`
//! is required), the same at Vertex's `/v1/projects/{p}/locations/{l}/
//! publishers/google/models/{model}:…` (a token the mock's `/token` issued).
//! Answers go through the shared request path (log, faults, scripts) and are
//! rendered here in Gemini's shapes (reference D.5, D.7): each SSE `data:` a
//! whole GenerateContentResponse, function calls whole and signed with a
//! `thoughtSignature`, thoughts when `includeThoughts` asks, the finish
//! reason and `usageMetadata` on the last chunk (no finish reason under
//! `no_terminator`, `SAFETY` under `refusal`), Google's error bodies with
//! `RetryInfo` and `QuotaFailure`. A request whose current turn sends a
//! function call back without the signature the mock gave it is refused
//! with Gemini 3's 400. Repeated prompt prefixes are reported as implicit
//! cache reads (`cachedContentTokenCount`), from a bounded memory.

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use bytes::Bytes;
use serde_json::{json, Value};

use super::faults::Preset;
use super::server::{completion_as, Shared};
use super::wire::{Finish, Gen};
use super::{MockKind, AUTH_MARKER};

/// Prompt prefixes remembered for implicit caching.
const REMEMBERED_PREFIXES: usize = 1024;
/// Shortest prefix (in the mock's tokens) Gemini would cache.
const MIN_CACHED_TOKENS: u32 = 16;
/// Thought tokens an answer with thoughts reports.
const THOUGHT_TOKENS: u32 = 8;
/// A signature starts with this once decoded.
const SIGNATURE_PREFIX: &str = "switchyard-mock-thought:";
/// The value Gemini documents for calls whose signature was lost elsewhere.
const SKIP_VALIDATOR: &str = "skip_thought_signature_validator";

// ---- Request ----------------------------------------------------------------

/// The request fields that shape an answer: `(max_tokens, tool, prompt
/// bytes, json, thoughts)`. A conversation whose last turn returns a
/// function's result is answered in text, not with another call.
pub(super) fn read(body: &Value) -> (Option<u32>, Option<String>, usize, bool, bool) {
    let max = body
        .pointer("/generationConfig/maxOutputTokens")
        .and_then(Value::as_u64)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    let answering = body
        .get("contents")
        .and_then(Value::as_array)
        .and_then(|c| c.last())
        .and_then(|t| t.get("parts"))
        .and_then(Value::as_array)
        .is_some_and(|p| p.iter().any(|p| p.get("functionResponse").is_some()));
    let tool = body
        .pointer("/tools/0/functionDeclarations/0/name")
        .and_then(Value::as_str)
        .filter(|_| !answering)
        .map(str::to_owned);
    let prompt = body.get("contents").map_or(0, |c| c.to_string().len())
        + body
            .get("systemInstruction")
            .map_or(0, |s| s.to_string().len());
    let json = body
        .pointer("/generationConfig/responseMimeType")
        .and_then(Value::as_str)
        == Some("application/json");
    let thoughts = body
        .pointer("/generationConfig/thinkingConfig/includeThoughts")
        .and_then(Value::as_bool)
        == Some(true);
    (max, tool, prompt, json, thoughts)
}

/// Prompt prefixes seen (system instruction and every turn but the last),
/// by hash, oldest first.
#[derive(Debug, Default)]
pub(crate) struct ImplicitCache {
    seen: HashSet<u64>,
    order: VecDeque<u64>,
}

impl ImplicitCache {
    /// Tokens of `body`'s prefix read from the cache (0 the first time).
    pub(crate) fn read(&mut self, body: &Value) -> u32 {
        let contents = body.get("contents").and_then(Value::as_array);
        let turns = contents.map_or(&[][..], |c| &c[..c.len().saturating_sub(1)]);
        let prefix = json!([body.get("systemInstruction"), turns]).to_string();
        let tokens = u32::try_from(prefix.len() / 4).unwrap_or(u32::MAX);
        if tokens < MIN_CACHED_TOKENS {
            return 0;
        }
        let mut h = std::collections::hash_map::DefaultHasher::new();
        prefix.hash(&mut h);
        let key = h.finish();
        if self.seen.contains(&key) {
            return tokens;
        }
        if self.order.len() == REMEMBERED_PREFIXES {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
        self.seen.insert(key);
        self.order.push_back(key);
        0
    }
}

/// Gemini 3's check of thought signatures: in the current turn (the model
/// turns after the last user turn that is not only function results) the
/// first function call of each model turn must carry the signature it was
/// given. `None` when the request passes.
pub(super) fn check_signatures(body: &Value) -> Option<(u16, Value)> {
    let contents = body.get("contents").and_then(Value::as_array)?;
    let parts_of = |t: &Value| t.get("parts").and_then(Value::as_array).cloned();
    let start = contents
        .iter()
        .rposition(|t| {
            t.get("role").and_then(Value::as_str) == Some("user")
                && parts_of(t)
                    .unwrap_or_default()
                    .iter()
                    .any(|p| p.get("functionResponse").is_none())
        })
        .map_or(0, |i| i + 1);
    for (i, turn) in contents.iter().enumerate().skip(start) {
        if turn.get("role").and_then(Value::as_str) != Some("model") {
            continue;
        }
        let parts = parts_of(turn).unwrap_or_default();
        let Some(call) = parts.iter().find(|p| p.get("functionCall").is_some()) else {
            continue;
        };
        let name = call
            .pointer("/functionCall/name")
            .and_then(Value::as_str)
            .unwrap_or("");
        match call.get("thoughtSignature").and_then(Value::as_str) {
            None => {
                return Some(google_error(400, "INVALID_ARGUMENT", &format!(
                    "Function call is missing a thought_signature in functionCall parts. This is required for tools to work correctly, and missing thought_signature may lead to degraded model performance. Additional data, function call `default_api:{name}` , position {}. Please refer to https://ai.google.dev/gemini-api/docs/thought-signatures for more details.",
                    i + 1
                )))
            }
            Some(sig) if !signature_ok(sig) => {
                return Some(google_error(400, "INVALID_ARGUMENT", "Corrupted thought signature."))
            }
            Some(_) => {}
        }
    }
    None
}

fn signature_ok(sig: &str) -> bool {
    sig == SKIP_VALIDATOR
        || base64::engine::general_purpose::STANDARD
            .decode(sig)
            .is_ok_and(|d| d.starts_with(SIGNATURE_PREFIX.as_bytes()))
}

/// The signature the mock gives answer `seq`.
pub(crate) fn signature(seq: u64) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{SIGNATURE_PREFIX}{seq:06}"))
}

// ---- Streamed answer --------------------------------------------------------

fn sse(v: &Value) -> Bytes {
    Bytes::from(format!("data: {v}\r\n\r\n"))
}

fn response_id(g: &Gen) -> String {
    format!("resp-mock{:06}", g.seq)
}

/// `usageMetadata`: the prompt only until the last chunk, everything then.
fn usage(g: &Gen, k: u32, last: bool) -> Value {
    let prompt = g.req.input_tokens;
    if !last {
        return json!({"promptTokenCount": prompt, "totalTokenCount": prompt});
    }
    let thoughts = if g.req.thoughts { THOUGHT_TOKENS } else { 0 };
    let mut u = json!({"promptTokenCount": prompt, "candidatesTokenCount": k,
                       "totalTokenCount": prompt + k + thoughts});
    if thoughts > 0 {
        u["thoughtsTokenCount"] = json!(thoughts);
    }
    if g.req.cached_tokens > 0 {
        u["cachedContentTokenCount"] = json!(g.req.cached_tokens.min(prompt));
    }
    u
}

fn chunk(g: &Gen, parts: Value, finish: Option<&str>, usage: Value) -> Value {
    let mut candidate = json!({"content": {"role": "model", "parts": parts}, "index": 0});
    if let Some(reason) = finish {
        candidate["finishReason"] = json!(reason);
    }
    json!({"candidates": [candidate], "usageMetadata": usage,
           "modelVersion": g.model_name(), "responseId": response_id(g)})
}

/// Frames before the first token: a thought, when thoughts were asked for.
pub(super) fn prelude(g: &Gen) -> Vec<Bytes> {
    if !g.req.thoughts {
        return Vec::new();
    }
    let parts = json!([{"text": "Thinking it over. ", "thought": true}]);
    vec![sse(&chunk(g, parts, None, usage(g, 0, false)))]
}

/// The frame carrying `text`: a text part, or nothing for a function call
/// (Gemini sends calls whole, in the last chunk).
pub(super) fn token(g: &Gen, text: String) -> Bytes {
    if g.req.tool.is_some() {
        return Bytes::new();
    }
    sse(&chunk(g, json!([{"text": text}]), None, usage(g, 0, false)))
}

pub(super) fn finish_str(finish: Finish) -> &'static str {
    match finish {
        Finish::Natural | Finish::Tool => "STOP",
        Finish::Length => "MAX_TOKENS",
        Finish::Refusal => "SAFETY",
    }
}

/// The parts of the last chunk: the call (signed), or the signature alone
/// after a text answer with thoughts; `close` ends a JSON answer.
fn last_parts(g: &Gen, finish: Finish, args: &str, close: Option<String>) -> Value {
    let mut parts = Vec::new();
    if let Some(close) = close {
        parts.push(json!({"text": close}));
    }
    match (&g.req.tool, finish) {
        (_, Finish::Refusal) => return json!([]),
        (Some(name), Finish::Tool) => {
            let args: Value = serde_json::from_str(args).unwrap_or_else(|_| json!({}));
            parts.push(json!({"functionCall": {"name": name, "args": args},
                              "thoughtSignature": signature(g.seq)}));
        }
        _ if g.req.thoughts => {
            parts.push(json!({"text": "", "thoughtSignature": signature(g.seq)}));
        }
        _ => {}
    }
    Value::Array(parts)
}

/// Frames after `k` tokens: the last chunk, with its finish reason and whole
/// usage when `finished` (a stream without it is cut short).
pub(super) fn epilogue(
    g: &Gen,
    finish: Finish,
    k: u32,
    args: &str,
    close: Option<String>,
    finished: bool,
) -> Vec<Bytes> {
    let parts = last_parts(g, finish, args, close);
    let mut last = chunk(
        g,
        parts,
        finished.then(|| finish_str(finish)),
        usage(g, k, finished),
    );
    if finish == Finish::Refusal {
        last["candidates"][0]["safetyRatings"] = json!([
            {"category": "HARM_CATEGORY_DANGEROUS_CONTENT", "probability": "HIGH", "blocked": true}
        ]);
    }
    vec![sse(&last)]
}

/// An error in the stream after a 200, in Google's error shape.
pub(super) fn error_frame(error_type: Option<&str>, message: Option<&str>) -> Bytes {
    let (code, status, default) = match error_type {
        None | Some("overloaded_error") => (
            503,
            "UNAVAILABLE",
            "The model is overloaded. Please try again later.",
        ),
        Some("rate_limit_error") => (429, "RESOURCE_EXHAUSTED", "Resource has been exhausted."),
        _ => (
            500,
            "INTERNAL",
            "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
        ),
    };
    sse(&google_error(code, status, message.unwrap_or(default)).1)
}

/// A frame whose JSON is cut off.
pub(super) fn malformed_frame() -> Bytes {
    Bytes::from_static(b"data: {\"candidates\":[{\"content\":\r\n\r\n")
}

/// A whole `generateContent` answer of `text` (or the call with `args`).
pub(super) fn full_body(g: &Gen, finish: Finish, k: u32, text: &str, args: &str) -> Value {
    let mut parts = last_parts(g, finish, args, None);
    if g.req.tool.is_none() && finish != Finish::Refusal {
        if let Some(p) = parts.as_array_mut() {
            p.insert(0, json!({"text": text}));
        }
    }
    let mut v = chunk(g, parts, Some(finish_str(finish)), usage(g, k, true));
    if g.req.thoughts {
        if let Some(p) = v["candidates"][0]["content"]["parts"].as_array_mut() {
            p.insert(0, json!({"text": "Thinking it over. ", "thought": true}));
        }
    }
    v
}

// ---- Errors -----------------------------------------------------------------

fn google_error(code: u16, status: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"error": {"code": code, "message": message, "status": status}}),
    )
}

/// `google.rpc.QuotaFailure` for one quota and `RetryInfo` with `delay`.
fn exhausted(message: &str, quota_id: &str, value: &str, delay: &str) -> (u16, Value) {
    let (code, mut v) = google_error(429, "RESOURCE_EXHAUSTED", message);
    v["error"]["details"] = json!([
        {"@type": "type.googleapis.com/google.rpc.QuotaFailure", "violations": [{
            "quotaMetric": "generativelanguage.googleapis.com/generate_content_free_tier_requests",
            "quotaId": quota_id,
            "quotaDimensions": {"location": "global", "model": "gemini-2.5-flash"},
            "quotaValue": value}]},
        {"@type": "type.googleapis.com/google.rpc.Help", "links": [{
            "description": "Learn more about Gemini API quotas",
            "url": "https://ai.google.dev/gemini-api/docs/rate-limits"}]},
        {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": delay}
    ]);
    (code, v)
}

/// The real status and body of `preset` on Gemini's wire.
pub(super) fn preset_error(preset: Preset, model: &str) -> (u16, Value) {
    match preset {
        Preset::RateLimit => exhausted(
            "You exceeded your current quota, please check your plan and billing details. Please retry in 1.5s.",
            "GenerateRequestsPerMinutePerProjectPerModel-FreeTier",
            "10",
            "1.500s",
        ),
        Preset::InsufficientQuota | Preset::SpendLimit => exhausted(
            "You exceeded your current quota, please check your plan and billing details. Please retry in 19.424395716s.",
            "GenerateRequestsPerDayPerProjectPerModel-FreeTier",
            "20",
            "19s",
        ),
        Preset::RequestTooLarge | Preset::ContextLength => google_error(
            400,
            "INVALID_ARGUMENT",
            "The input token count (1200000) exceeds the maximum number of tokens allowed (1048576).",
        ),
        Preset::Overloaded | Preset::SlowDown => google_error(
            503,
            "UNAVAILABLE",
            "The model is overloaded. Please try again later.",
        ),
        Preset::ServerError => google_error(
            500,
            "INTERNAL",
            "An internal error has occurred. Please retry or report in https://developers.generativeai.google/guide/troubleshooting",
        ),
        Preset::Auth => {
            let (code, mut v) = google_error(
                400,
                "INVALID_ARGUMENT",
                &format!("API key not valid ({AUTH_MARKER}). Please pass a valid API key."),
            );
            v["error"]["details"] = json!([{"@type": "type.googleapis.com/google.rpc.ErrorInfo",
                "reason": "API_KEY_INVALID", "domain": "googleapis.com",
                "metadata": {"service": "generativelanguage.googleapis.com"}}]);
            (code, v)
        }
        Preset::Invalid | Preset::ContentFilter => google_error(
            400,
            "INVALID_ARGUMENT",
            "Request contains an invalid argument.",
        ),
        Preset::NotFound => google_error(
            404,
            "NOT_FOUND",
            &format!("models/{model} is not found for API version v1beta, or is not supported for generateContent."),
        ),
    }
}

/// A 400 for a body that is not JSON.
pub(super) fn bad_json() -> (u16, Value) {
    google_error(
        400,
        "INVALID_ARGUMENT",
        "Invalid JSON payload received. Unexpected token.",
    )
}

fn refuse(code: u16, status: &str, message: &str) -> Response {
    let (code, body) = google_error(code, status, message);
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::BAD_REQUEST);
    (status, axum::Json(body)).into_response()
}

// ---- Endpoints --------------------------------------------------------------

/// Why a call is not served: status, Google's status name, message.
type Refused = (u16, &'static str, &'static str);

/// The model of `{model}:streamGenerateContent?alt=sse` or
/// `{model}:generateContent`, or why the call is not served. Without
/// `alt=sse` Google streams a JSON array, which the mock does not speak.
fn model_of(model_action: &str, query: Option<&str>) -> Result<String, Refused> {
    const UNKNOWN: Refused = (404, "NOT_FOUND", "unknown method");
    let (model, action) = model_action.rsplit_once(':').ok_or(UNKNOWN)?;
    let sse = query.is_some_and(|q| q.split('&').any(|kv| kv == "alt=sse"));
    match action {
        "generateContent" => Ok(model.to_string()),
        "streamGenerateContent" if sse => Ok(model.to_string()),
        "streamGenerateContent" => Err((
            400,
            "INVALID_ARGUMENT",
            "mock-upstream: streamGenerateContent without alt=sse (a JSON array) is not served",
        )),
        _ => Err(UNKNOWN),
    }
}

/// `POST /v1beta/models/{model_action}` (AI Studio).
pub(super) async fn ai_studio(
    s: State<Arc<Shared>>,
    Path(model_action): Path<String>,
    req: Request,
) -> Response {
    let model = match model_of(&model_action, req.uri().query()) {
        Ok(model) => model,
        Err((code, status, message)) => return refuse(code, status, message),
    };
    if !req.headers().contains_key("x-goog-api-key") {
        return refuse(
            403,
            "PERMISSION_DENIED",
            "Method doesn't allow unregistered callers (callers without established identity). Please use API Key or other form of API consumer identity to call this API.",
        );
    }
    completion_as(s, MockKind::Gemini, req, Some(model)).await
}

/// `POST /v1/projects/{p}/locations/{l}/publishers/google/models/{model_action}` (Vertex).
pub(super) async fn vertex(
    s: State<Arc<Shared>>,
    Path((_project, _location, model_action)): Path<(String, String, String)>,
    req: Request,
) -> Response {
    let model = match model_of(&model_action, req.uri().query()) {
        Ok(model) => model,
        Err((code, status, message)) => return refuse(code, status, message),
    };
    if !super::vertex::issued_bearer(req.headers()) {
        return refuse(
            401,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. Expected OAuth 2 access token.",
        );
    }
    completion_as(s, MockKind::Gemini, req, Some(model)).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn call_turn(sig: Option<&str>) -> Value {
        let mut part = json!({"functionCall": {"name": "lookup", "args": {}}});
        if let Some(s) = sig {
            part["thoughtSignature"] = json!(s);
        }
        json!({"role": "model", "parts": [part]})
    }

    fn body(turn: Value) -> Value {
        json!({"contents": [
            {"role": "user", "parts": [{"text": "look it up"}]},
            turn,
            {"role": "user", "parts": [{"functionResponse": {"name": "lookup", "response": {}}}]}]})
    }

    #[test]
    fn the_current_turns_calls_must_come_back_with_their_signature() {
        assert_eq!(
            check_signatures(&body(call_turn(Some(&signature(7))))),
            None
        );
        assert_eq!(
            check_signatures(&body(call_turn(Some(SKIP_VALIDATOR)))),
            None
        );
        let (code, v) = check_signatures(&body(call_turn(None))).unwrap();
        assert_eq!(code, 400);
        assert!(v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("missing a thought_signature"));
        let (_, v) = check_signatures(&body(call_turn(Some("bm90IG91cnM=")))).unwrap();
        assert_eq!(v["error"]["message"], "Corrupted thought signature.");
        // An earlier turn is not checked.
        let mut b = body(call_turn(None));
        b["contents"]
            .as_array_mut()
            .unwrap()
            .push(json!({"role": "user", "parts": [{"text": "thanks"}]}));
        assert_eq!(check_signatures(&b), None);
    }

    #[test]
    fn a_repeated_prefix_is_read_from_the_implicit_cache_and_memory_is_bounded() {
        let mut cache = ImplicitCache::default();
        let b = |last: &str| {
            json!({"systemInstruction": {"parts": [{"text": "x".repeat(400)}]},
                   "contents": [{"role": "user", "parts": [{"text": last}]}]})
        };
        assert_eq!(cache.read(&b("one")), 0);
        assert!(cache.read(&b("two")) >= MIN_CACHED_TOKENS);
        for i in 0..REMEMBERED_PREFIXES * 2 {
            let other = json!({"systemInstruction": {"parts": [{"text": format!("{i}{}", "y".repeat(100))}]}});
            cache.read(&other);
        }
        assert_eq!(cache.seen.len(), REMEMBERED_PREFIXES);
        assert_eq!(cache.order.len(), REMEMBERED_PREFIXES);
        assert_eq!(cache.read(&b("three")), 0, "evicted");
    }
}
