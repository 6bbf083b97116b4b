//! Streaming: holds the response until the first event (so a failure before
//! the first token is a plain HTTP error with Anthropic's status), then
//! frames Anthropic's events: `message_start`, `ping`, one content block
//! per thinking block (`thinking_delta`, then `signature_delta` right before
//! its `content_block_stop`; `redacted_thinking` whole in its start), text
//! run or tool call (`text_delta` / `input_json_delta`), `message_delta`
//! with `stop_reason` and the usage (cache reads and writes included),
//! `message_stop`. A stream that fails after output ends with an `error`
//! event, never `message_stop`.

use axum::response::Response;
use bytes::BytesMut;
use serde_json::{json, Value};

use super::error::AnthropicError;
use super::response::{stop_reason, Ids, UsageFrame};
use crate::api::content::usage_proto;
use crate::api::door::{self, insert};
use crate::chat::{Chunk, ReasoningDelta};
use crate::sink::{Event, Events, Finished};

pub(super) async fn stream(
    mut rx: Events,
    ids: Ids,
    request_id: &str,
) -> Result<Response, AnthropicError> {
    let (served, pending) = match door::open(&mut rx).await {
        Err(None) => return Err(AnthropicError::internal("request ended without an answer")),
        Err(Some(e)) => return Err(AnthropicError::from_request(&e)),
        Ok(door::Opening::Queued(q)) => return Ok(door::queued(&q, request_id)),
        Ok(door::Opening::Stream { served, pending }) => (served, pending),
    };
    let frames = Frames {
        rx,
        pending,
        ids,
        request_id: request_id.to_string(),
        opened: false,
        block: None,
        blocks: 0,
        done: false,
    };
    let mut r = Response::new(door::sse_body(frames));
    door::sse_headers(r.headers_mut(), served, request_id);
    insert(r.headers_mut(), "request-id", request_id);
    Ok(r)
}

/// The content block being streamed.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Open {
    Thinking,
    Text,
    /// A tool call, by the upstream's tool index.
    Tool(u32),
}

/// The SSE side of one streaming answer.
struct Frames {
    rx: Events,
    /// An event read before the headers went out, not yet framed.
    pending: Option<Event>,
    ids: Ids,
    request_id: String,
    opened: bool,
    /// The open block, if any, and how many were opened.
    block: Option<Open>,
    blocks: u32,
    done: bool,
}

/// `event: <name>` with `data: <json>` at the end of `out`.
fn event(name: &str, data: &impl serde::Serialize, out: &mut BytesMut) {
    door::put_frame(out, Some(name), data);
}

/// `message_start`: the message as it opens (no content yet; its usage
/// totals come in `message_delta`).
#[derive(serde::Serialize)]
struct MessageStart<'a> {
    r#type: &'static str,
    message: OpenMessage<'a>,
}

#[derive(serde::Serialize)]
struct OpenMessage<'a> {
    id: &'a str,
    r#type: &'static str,
    role: &'static str,
    model: &'a str,
    content: [(); 0],
    stop_reason: Option<()>,
    stop_sequence: Option<()>,
    usage: UsageFrame,
}

/// `message_delta`: how the answer ended, and its usage.
#[derive(serde::Serialize)]
struct MessageDelta {
    r#type: &'static str,
    delta: StopDelta,
    usage: UsageFrame,
}

#[derive(serde::Serialize)]
struct StopDelta {
    stop_reason: &'static str,
    stop_sequence: Option<()>,
}

/// `content_block_start` (its block as built) or `content_block_stop`.
#[derive(serde::Serialize)]
struct BlockEdge {
    r#type: &'static str,
    index: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    content_block: Option<Value>,
}

/// A `content_block_delta`, serialised straight from borrowed fields: it is
/// on the per-token path.
#[derive(serde::Serialize)]
struct BlockDelta<D: serde::Serialize> {
    r#type: &'static str,
    index: u32,
    delta: D,
}

/// A `text_delta` or `thinking_delta`: its type and its one field.
struct TextDelta<'a> {
    r#type: &'static str,
    field: &'static str,
    text: &'a str,
}

impl serde::Serialize for TextDelta<'_> {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut m = s.serialize_map(Some(2))?;
        m.serialize_entry("type", self.r#type)?;
        m.serialize_entry(self.field, self.text)?;
        m.end()
    }
}

impl door::SseFrames for Frames {
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

impl Frames {
    /// Writes the next frames to send at the end of `out`; false once the
    /// stream is over. Frames are written only after the last await.
    async fn next(&mut self, out: &mut BytesMut) -> bool {
        if self.done {
            return false;
        }
        if !self.opened {
            self.opened = true;
            let start = MessageStart {
                r#type: "message_start",
                message: OpenMessage {
                    id: &self.ids.id,
                    r#type: "message",
                    role: "assistant",
                    model: &self.ids.model,
                    content: [],
                    stop_reason: None,
                    stop_sequence: None,
                    // Known once the answer is: the totals come in `message_delta`.
                    usage: UsageFrame::of(&Default::default()),
                },
            };
            event("message_start", &start, out);
            out.extend_from_slice(b"event: ping\ndata: {\"type\":\"ping\"}\n\n");
            return true;
        }
        loop {
            let item = match self.pending.take() {
                Some(e) => Some(Ok(e)),
                None => self.rx.recv().await,
            };
            match item {
                Some(Ok(Event::Started(_) | Event::Continued(_))) => continue,
                Some(Ok(Event::Chunk(Chunk::Reasoning(r)))) => {
                    let ReasoningDelta {
                        text,
                        signature,
                        redacted,
                    } = *r;
                    self.thinking(text, signature, redacted, out)
                }
                Some(Ok(Event::Chunk(Chunk::Text(text)))) => {
                    self.enter(Open::Text, out, || json!({"type": "text", "text": ""}));
                    let delta = TextDelta {
                        r#type: "text_delta",
                        field: "text",
                        text: &text,
                    };
                    self.delta(delta, out);
                }
                Some(Ok(Event::Chunk(Chunk::ToolCall(call)))) => {
                    let n = self.blocks;
                    let call = *call;
                    self.enter(Open::Tool(call.index), out, || {
                        json!({
                            "type": "tool_use",
                            "id": call.id.unwrap_or_else(|| format!("toolu_{n}")),
                            "name": call.name.unwrap_or_default(),
                            "input": {},
                        })
                    });
                    if !call.arguments.is_empty() {
                        let delta = TextDelta {
                            r#type: "input_json_delta",
                            field: "partial_json",
                            text: &call.arguments,
                        };
                        self.delta(delta, out);
                    }
                }
                Some(Ok(Event::Finished(f))) => {
                    self.done = true;
                    self.close(out);
                    self.last_frames(&f, out);
                }
                // The replica is leaving: the stream ends as drained.
                Some(Ok(Event::Moved { .. })) => {
                    let e = AnthropicError::from_request(&crate::error::RequestError::Draining);
                    self.fail(e, out);
                }
                // A stream never gets a `Reset` (the task ends it instead:
                // its client cannot discard output) nor a queued job.
                Some(Ok(Event::Reset { .. } | Event::Queued(_))) | None => {
                    self.fail(
                        AnthropicError::internal("the stream ended without a finish"),
                        out,
                    );
                }
                Some(Err(e)) => self.fail(AnthropicError::from_request(&e), out),
            }
            return true;
        }
    }

    /// Thinking text opens (or continues) a thinking block; its signature
    /// ends it; redacted thinking is a whole block of its own.
    fn thinking(
        &mut self,
        text: String,
        signature: Option<String>,
        redacted: Option<String>,
        out: &mut BytesMut,
    ) {
        if let Some(data) = redacted {
            self.close(out);
            self.enter(
                Open::Thinking,
                out,
                || json!({"type": "redacted_thinking", "data": data}),
            );
            self.close(out);
            return;
        }
        self.enter(
            Open::Thinking,
            out,
            || json!({"type": "thinking", "thinking": "", "signature": ""}),
        );
        if !text.is_empty() {
            let delta = TextDelta {
                r#type: "thinking_delta",
                field: "thinking",
                text: &text,
            };
            self.delta(delta, out);
        }
        if let Some(signature) = signature {
            let delta = TextDelta {
                r#type: "signature_delta",
                field: "signature",
                text: &signature,
            };
            self.delta(delta, out);
            self.close(out);
        }
    }

    /// Makes `want` the open block, closing another and opening it if needed.
    fn enter(&mut self, want: Open, out: &mut BytesMut, block: impl FnOnce() -> Value) {
        if self.block == Some(want) {
            return;
        }
        self.close(out);
        let start = BlockEdge {
            r#type: "content_block_start",
            index: self.blocks,
            content_block: Some(block()),
        };
        event("content_block_start", &start, out);
        self.block = Some(want);
        self.blocks += 1;
    }

    fn close(&mut self, out: &mut BytesMut) {
        if self.block.take().is_some() {
            let stop = BlockEdge {
                r#type: "content_block_stop",
                index: self.blocks - 1,
                content_block: None,
            };
            event("content_block_stop", &stop, out);
        }
    }

    /// A delta of the open block.
    fn delta(&self, delta: impl serde::Serialize, out: &mut BytesMut) {
        let d = BlockDelta {
            r#type: "content_block_delta",
            index: self.blocks.saturating_sub(1),
            delta,
        };
        event("content_block_delta", &d, out);
    }

    fn last_frames(&self, f: &Finished, out: &mut BytesMut) {
        let delta = MessageDelta {
            r#type: "message_delta",
            delta: StopDelta {
                stop_reason: stop_reason(f.finish_reason),
                stop_sequence: None,
            },
            usage: UsageFrame::of(&usage_proto(&f.usage, f.usage_estimated)),
        };
        event("message_delta", &delta, out);
        out.extend_from_slice(b"event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n");
    }

    /// The `error` event that ends a failed stream.
    fn fail(&mut self, e: AnthropicError, out: &mut BytesMut) {
        self.done = true;
        event("error", &e.body(&self.request_id), out);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::chat::{FinishReason, Usage};
    use crate::sink::Tier;

    fn finished() -> Finished {
        Finished {
            finish_reason: FinishReason::ToolCalls,
            usage: Usage {
                input_tokens: 7,
                output_tokens: 3,
                ..Default::default()
            },
            usage_estimated: false,
            provider: "p".into(),
            model: "m".into(),
            tier: Tier::Primary,
            attempts: 1,
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
        }
    }

    /// The frames for `events`, as (event name, data) pairs.
    async fn frames(
        events: Vec<Result<Event, crate::error::RequestError>>,
    ) -> Vec<(String, Value)> {
        let (mut sink, rx) = crate::sink::channel(
            crate::sink::SendLimits::default(),
            crate::sink::Delivery::Resettable,
        );
        for e in events {
            match e {
                Ok(e) => sink.replay(e).await.unwrap(),
                Err(e) => sink.fail(e).await,
            }
        }
        drop(sink);
        let mut f = Frames {
            rx,
            pending: None,
            ids: Ids {
                id: "msg_r".into(),
                model: "chat".into(),
            },
            request_id: "r".into(),
            opened: false,
            block: None,
            blocks: 0,
            done: false,
        };
        let mut out = BytesMut::new();
        while f.next(&mut out).await {}
        let text = String::from_utf8(out.to_vec()).unwrap();
        text.split("\n\n")
            .filter(|s| !s.is_empty())
            .map(|frame| {
                let (name, data) = frame.split_once('\n').unwrap();
                let data: Value =
                    serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap();
                (name.strip_prefix("event: ").unwrap().to_string(), data)
            })
            .collect()
    }

    #[tokio::test]
    async fn text_then_a_tool_call_are_two_blocks_with_their_deltas() {
        let call = |id: Option<&str>, args: &str| {
            Ok(Event::Chunk(Chunk::ToolCall(Box::new(
                crate::chat::ToolCallDelta {
                    index: 0,
                    id: id.map(str::to_string),
                    name: id.map(|_| "weather".to_string()),
                    arguments: args.into(),
                },
            ))))
        };
        let got = frames(vec![
            Ok(Event::Chunk(Chunk::Text("Let me ".into()))),
            Ok(Event::Chunk(Chunk::Text("check.".into()))),
            call(Some("toolu_9"), ""),
            call(None, "{\"city\":"),
            call(None, "\"Paris\"}"),
            Ok(Event::Finished(Box::new(finished()))),
        ])
        .await;
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(got[2].1["content_block"]["type"], "text");
        assert_eq!(got[3].1["delta"]["text"], "Let me ");
        assert_eq!(got[6].1["index"], 1);
        assert_eq!(got[6].1["content_block"]["id"], "toolu_9");
        assert_eq!(got[6].1["content_block"]["name"], "weather");
        assert_eq!(got[7].1["delta"]["type"], "input_json_delta");
        assert_eq!(got[8].1["delta"]["partial_json"], "\"Paris\"}");
        assert_eq!(got[8].1["index"], 1);
        assert_eq!(got[10].1["delta"]["stop_reason"], "tool_use");
        assert_eq!(got[10].1["usage"]["output_tokens"], 3);
        // The once-a-stream events, whole, in Anthropic's shape.
        let zero = json!({"input_tokens": 0, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0,
            "cache_creation": {"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": 0},
            "output_tokens": 0});
        assert_eq!(
            got[0].1,
            json!({"type": "message_start", "message": {"id": "msg_r", "type": "message",
                "role": "assistant", "model": "chat", "content": [], "stop_reason": null,
                "stop_sequence": null, "usage": zero}})
        );
        assert_eq!(got[1].1, json!({"type": "ping"}));
        assert_eq!(got[5].1, json!({"type": "content_block_stop", "index": 0}));
        assert_eq!(
            got[10].1["delta"],
            json!({"stop_reason": "tool_use", "stop_sequence": null})
        );
        assert_eq!(got[11].1, json!({"type": "message_stop"}));
    }

    fn reasoning(text: &str, signature: Option<&str>, redacted: Option<&str>) -> Event {
        Event::Chunk(Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
            text: text.into(),
            signature: signature.map(Into::into),
            redacted: redacted.map(Into::into),
        })))
    }

    #[tokio::test]
    async fn thinking_streams_as_its_own_blocks_with_the_signature_last() {
        let mut done = finished();
        done.finish_reason = FinishReason::Stop;
        done.usage = Usage {
            input_tokens: 5,
            output_tokens: 9,
            cache_read_input_tokens: 100,
            cache_write_input_tokens: 40,
            cache_write_1h_input_tokens: 10,
            ..Default::default()
        };
        let got = frames(vec![
            Ok(reasoning("Let me ", None, None)),
            Ok(reasoning("think.", None, None)),
            Ok(reasoning("", Some("sig-1"), None)),
            // Omitted display: a signature alone is a whole block.
            Ok(reasoning("", Some("sig-2"), None)),
            Ok(reasoning("", None, Some("opaque"))),
            Ok(Event::Chunk(Chunk::Text("42".into()))),
            Ok(Event::Finished(Box::new(done))),
        ])
        .await;
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "message_start",
                "ping",
                "content_block_start",
                "content_block_delta",
                "content_block_delta",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "content_block_start",
                "content_block_stop",
                "content_block_start",
                "content_block_delta",
                "content_block_stop",
                "message_delta",
                "message_stop"
            ]
        );
        assert_eq!(
            got[2].1["content_block"],
            json!({"type": "thinking", "thinking": "", "signature": ""})
        );
        assert_eq!(
            got[3].1["delta"],
            json!({"type": "thinking_delta", "thinking": "Let me "})
        );
        assert_eq!(
            got[5].1["delta"],
            json!({"type": "signature_delta", "signature": "sig-1"})
        );
        assert_eq!(got[6].1["index"], 0);
        assert_eq!(got[7].1["index"], 1);
        assert_eq!(got[8].1["delta"]["signature"], "sig-2");
        assert_eq!(
            got[10].1["content_block"],
            json!({"type": "redacted_thinking", "data": "opaque"})
        );
        assert_eq!(got[12].1["index"], 3);
        assert_eq!(got[12].1["content_block"]["type"], "text");
        assert_eq!(got[0].1["message"]["usage"]["cache_read_input_tokens"], 0);
        assert_eq!(
            got[15].1["usage"],
            json!({"input_tokens": 5, "cache_creation_input_tokens": 40,
                   "cache_read_input_tokens": 100,
                   "cache_creation": {"ephemeral_5m_input_tokens": 30, "ephemeral_1h_input_tokens": 10},
                   "output_tokens": 9})
        );
    }

    #[tokio::test]
    async fn a_failure_after_output_ends_with_an_error_event_not_message_stop() {
        let got = frames(vec![
            Ok(Event::Chunk(Chunk::Text("par".into()))),
            Err(crate::error::RequestError::MidStream {
                failure: Box::new(crate::policy::outcome::Failure::new(
                    crate::policy::outcome::OutcomeClass::Truncated,
                    "stream cut",
                )),
                provider: "primary".into(),
                tokens_emitted: 1,
                attempts: 1,
            }),
        ])
        .await;
        let (name, data) = got.last().unwrap();
        assert_eq!(name, "error");
        assert_eq!(data["error"]["type"], "overloaded_error");
        assert!(got.iter().all(|(n, _)| n != "message_stop"));

        let got = frames(vec![
            Ok(Event::Chunk(Chunk::Text("par".into()))),
            Err(crate::error::RequestError::DeadlineExceeded { attempts: 1 }),
        ])
        .await;
        let (name, data) = got.last().unwrap();
        assert_eq!(name, "error");
        assert_eq!(data["error"]["type"], "timeout_error");
    }
}
