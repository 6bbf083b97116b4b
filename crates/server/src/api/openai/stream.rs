//! Streaming: holds the response until the first event (so a failure before
//! the first token is a plain HTTP error), then frames SSE chunks ending
//! `data: [DONE]`, or an error frame when the stream fails after output.

use bytes::BytesMut;

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

/// `data: <json>\n\n`, one frame at the end of `out`.
fn frame(v: &impl serde::Serialize, out: &mut BytesMut) {
    door::put_frame(out, None, v);
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

/// `{"reasoning_content": ...}`.
#[derive(serde::Serialize)]
struct ReasoningDelta<'a> {
    reasoning_content: &'a str,
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
    fn next_frames(
        &mut self,
        out: &mut BytesMut,
    ) -> impl std::future::Future<Output = bool> + Send {
        self.next(out)
    }

    fn events(&self) -> Option<&Events> {
        Some(&self.rx)
    }
}

impl Sse {
    /// One chunk frame, written at the end of `out`.
    pub(super) fn chunk(
        &self,
        delta: impl serde::Serialize,
        finish: Option<&str>,
        out: &mut BytesMut,
    ) {
        let chunk = ChunkFrame {
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
        frame(&chunk, out);
    }

    fn text(&self, content: &str, role: Option<&'static str>, out: &mut BytesMut) {
        self.chunk(
            TextDelta {
                content: Some(content),
                role,
            },
            None,
            out,
        );
    }

    /// The finish chunk, the usage chunk when asked for, and `[DONE]`.
    fn last_frames(&self, f: &crate::sink::Finished, out: &mut BytesMut) {
        let empty = TextDelta {
            content: None,
            role: None,
        };
        self.chunk(empty, Some(finish_reason(f.finish_reason)), out);
        if self.include_usage {
            frame(
                &json!({
                    "id": self.ids.id,
                    "object": "chat.completion.chunk",
                    "created": self.ids.created,
                    "model": self.ids.model,
                    "system_fingerprint": null,
                    "choices": [],
                    "usage": usage_json(&crate::api::content::usage_proto(&f.usage, f.usage_estimated)),
                }),
                out,
            );
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
    }

    /// Writes the next frames to send at the end of `out`; false once the
    /// stream is over. Frames are written only after the last await.
    pub(super) async fn next(&mut self, out: &mut BytesMut) -> bool {
        if self.done {
            return false;
        }
        if !self.opened {
            self.opened = true;
            self.text("", Some("assistant"), out);
            return true;
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
                    self.chunk(
                        ReasoningDelta {
                            reasoning_content: &r.text,
                        },
                        None,
                        out,
                    );
                }
                Some(Ok(Event::Chunk(Chunk::Text(text)))) => self.text(&text, None, out),
                Some(Ok(Event::Chunk(Chunk::ToolCall(call)))) => {
                    let delta = json!({ "tool_calls": [tool_call_delta(*call)] });
                    self.chunk(delta, None, out);
                }
                Some(Ok(Event::Finished(f))) => {
                    self.done = true;
                    self.last_frames(&f, out);
                }
                // The replica is leaving: the stream ends as drained (resume it
                // elsewhere with `Last-Event-ID` and the same idempotency key).
                Some(Ok(Event::Moved { .. })) => {
                    self.done = true;
                    let e = OpenAiError::from_request(&crate::error::RequestError::Draining);
                    frame(&e.body(), out);
                }
                // A stream never gets a `Reset` (the task ends it instead:
                // its client cannot discard output) nor a queued job.
                Some(Ok(Event::Reset { .. } | Event::Queued(_))) | None => {
                    self.done = true;
                    let e = OpenAiError::internal("the stream ended without a finish");
                    frame(&e.body(), out);
                }
                Some(Err(e)) => {
                    self.done = true;
                    frame(&OpenAiError::from_request(&e).body(), out);
                }
            }
            return true;
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
