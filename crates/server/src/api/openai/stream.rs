//! Streaming: holds the response until the first event (so a failure before
//! the first token is a plain HTTP error), then frames SSE chunks ending
//! `data: [DONE]`, or an error frame when the stream fails after output.

use super::*;
use crate::chat::ToolCallDelta;

// ---- streaming ------------------------------------------------------------

/// Holds the response until the first event (so a failure before the first
/// token is a plain HTTP error), then streams SSE frames.
pub(super) async fn stream(
    mut rx: Events,
    ids: Ids,
    include_usage: bool,
    request_id: &str,
) -> Result<Response, OpenAiError> {
    let (served, pending) = match door::open(&mut rx).await {
        Err(None) => return Err(OpenAiError::internal("request ended without an answer")),
        Err(Some(e)) => return Err(OpenAiError::from_request(&e)),
        Ok(door::Opening::Queued(q)) => return Ok(door::queued(&q, request_id)),
        Ok(door::Opening::Stream { served, pending }) => (served, pending),
    };
    let sse = Sse {
        rx,
        pending,
        ids,
        include_usage,
        opened: false,
        done: false,
    };
    let mut r = Response::new(door::sse_body(sse));
    door::sse_headers(r.headers_mut(), served, request_id);
    Ok(r)
}

/// The SSE side of one streaming answer.
pub(super) struct Sse {
    pub(super) rx: Events,
    /// An event read before the headers went out, not yet framed.
    pub(super) pending: Option<Event>,
    pub(super) ids: Ids,
    pub(super) include_usage: bool,
    pub(super) opened: bool,
    pub(super) done: bool,
}

pub(super) fn frame(v: &Value) -> String {
    format!("data: {v}\n\n")
}

/// One `chat.completion.chunk`, serialised straight from borrowed fields
/// (keys in the order a `Value` would print them: it is on the per-token path).
#[derive(serde::Serialize)]
struct ChunkFrame<'a, D: serde::Serialize> {
    choices: [ChoiceFrame<'a, D>; 1],
    created: u64,
    id: &'a str,
    model: &'a str,
    object: &'static str,
    system_fingerprint: Option<()>,
    /// `null` on every chunk but the usage chunk, when usage was asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    usage: Option<Option<()>>,
}

#[derive(serde::Serialize)]
struct ChoiceFrame<'a, D: serde::Serialize> {
    delta: D,
    finish_reason: Option<&'a str>,
    index: u32,
    logprobs: Option<()>,
}

/// `{"content": ...}`, with `"role"` on the first chunk only.
#[derive(serde::Serialize)]
struct TextDelta<'a> {
    #[serde(skip_serializing_if = "Option::is_none")]
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    role: Option<&'static str>,
}

impl door::SseFrames for Sse {
    fn next_frames(&mut self) -> impl std::future::Future<Output = Option<String>> + Send {
        self.next()
    }

    fn events(&self) -> Option<&Events> {
        Some(&self.rx)
    }
}

impl Sse {
    pub(super) fn chunk(&self, delta: impl serde::Serialize, finish: Option<&str>) -> String {
        let frame = ChunkFrame {
            choices: [ChoiceFrame {
                delta,
                finish_reason: finish,
                index: 0,
                logprobs: None,
            }],
            created: self.ids.created,
            id: &self.ids.id,
            model: &self.ids.model,
            object: "chat.completion.chunk",
            system_fingerprint: None,
            usage: self.include_usage.then_some(None),
        };
        let mut out = Vec::with_capacity(256);
        out.extend_from_slice(b"data: ");
        // Serialising borrowed strings and numbers into a Vec cannot fail.
        let _ = serde_json::to_writer(&mut out, &frame);
        out.extend_from_slice(b"\n\n");
        String::from_utf8(out).unwrap_or_default()
    }

    fn text(&self, content: &str, role: Option<&'static str>) -> String {
        self.chunk(
            TextDelta {
                content: Some(content),
                role,
            },
            None,
        )
    }

    /// The finish chunk, the usage chunk when asked for, and `[DONE]`.
    fn last_frames(&self, f: &crate::sink::Finished) -> String {
        let empty = TextDelta {
            content: None,
            role: None,
        };
        let mut out = self.chunk(empty, Some(finish_reason(f.finish_reason)));
        if self.include_usage {
            out.push_str(&frame(&json!({
                "id": self.ids.id,
                "object": "chat.completion.chunk",
                "created": self.ids.created,
                "model": self.ids.model,
                "system_fingerprint": null,
                "choices": [],
                "usage": usage_json(&crate::api::content::usage_proto(&f.usage, f.usage_estimated)),
            })));
        }
        out.push_str("data: [DONE]\n\n");
        out
    }

    /// The next frames to send; `None` once the stream is over.
    pub(super) async fn next(&mut self) -> Option<String> {
        if self.done {
            return None;
        }
        if !self.opened {
            self.opened = true;
            return Some(self.text("", Some("assistant")));
        }
        loop {
            let item = match self.pending.take() {
                Some(e) => Some(Ok(e)),
                None => self.rx.recv().await,
            };
            match item {
                // Only the first attempt's `Started` precedes output; a later
                // one comes only after a failure before any output. A
                // continuation's text simply follows.
                Some(Ok(Event::Started(_) | Event::Continued(_))) => continue,
                Some(Ok(Event::Chunk(Chunk::Reasoning(r)))) => {
                    if r.text.is_empty() {
                        continue;
                    }
                    return Some(self.chunk(json!({ "reasoning_content": r.text }), None));
                }
                Some(Ok(Event::Chunk(Chunk::Text(text)))) => return Some(self.text(&text, None)),
                Some(Ok(Event::Chunk(Chunk::ToolCall(call)))) => {
                    return Some(
                        self.chunk(json!({ "tool_calls": [tool_call_delta(*call)] }), None),
                    );
                }
                Some(Ok(Event::Finished(f))) => {
                    self.done = true;
                    return Some(self.last_frames(&f));
                }
                // The replica is leaving: the stream ends as drained (resume it
                // elsewhere with `Last-Event-ID` and the same idempotency key).
                Some(Ok(Event::Moved { .. })) => {
                    self.done = true;
                    return Some(frame(
                        &OpenAiError::from_request(&crate::error::RequestError::Draining).body(),
                    ));
                }
                // A stream never gets a `Reset` (the task ends it instead:
                // its client cannot discard output) nor a queued job.
                Some(Ok(Event::Reset { .. } | Event::Queued(_))) | None => {
                    self.done = true;
                    return Some(frame(
                        &OpenAiError::internal("the stream ended without a finish").body(),
                    ));
                }
                Some(Err(e)) => {
                    self.done = true;
                    return Some(frame(&OpenAiError::from_request(&e).body()));
                }
            }
        }
    }
}

/// One tool-call fragment as an OpenAI `tool_calls[]` delta: `id`, `type` and
/// the function `name` only on the fragment that carries them.
fn tool_call_delta(delta: ToolCallDelta) -> Value {
    let mut call = json!({"index": delta.index});
    let mut function = json!({ "arguments": delta.arguments });
    if let (Some(c), Some(id)) = (call.as_object_mut(), delta.id) {
        c.insert("id".into(), Value::String(id));
        c.insert("type".into(), Value::String("function".into()));
    }
    if let (Some(f), Some(name)) = (function.as_object_mut(), delta.name) {
        f.insert("name".into(), Value::String(name));
    }
    if let Some(c) = call.as_object_mut() {
        c.insert("function".into(), function);
    }
    call
}
