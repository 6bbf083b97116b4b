//! Responses streams: typed events (`event:` and `data:` lines, each with a
//! `sequence_number` from 0) in OpenAI's order. A live stream holds the
//! response until the first event (a failure before output is a plain HTTP
//! error), then `response.created`, `response.in_progress`, the items as
//! they grow, and one terminal event: `response.completed`, `.incomplete`,
//! or `.failed` for a stream that fails after output (a mid-stream reset
//! cannot be shown to a Responses client, so it fails too), never a silent
//! completion. A stored response streams as a replay built from it: the
//! same events, in the same order, with the same numbers each time, so a
//! background response can be resumed after event N on any replica; while
//! its job runs, the replay waits for it.

use bytes::BytesMut;
use std::time::Duration;

use super::request::ToolNames;
use super::response::{
    answer_of_items, chunks_of, object, usage_json, Frame, Meta, Output, Status,
};
use super::store::Record;
use super::*;
use crate::api::door::SseFrames;
use crate::api::errors::{CallerError, Kind};
use crate::chat::Chunk;

/// Numbers and frames events: `event: <type>` and `data:` with `type` and
/// `sequence_number`.
#[derive(Default)]
pub(super) struct Seq {
    next: u64,
    /// Events numbered at or below this are not sent (a resumed stream).
    after: Option<u64>,
}

impl Seq {
    pub(super) fn resuming(after: Option<u64>) -> Seq {
        Seq { next: 0, after }
    }

    fn frame(&mut self, f: Frame, out: &mut String) {
        let n = self.next;
        self.next += 1;
        if self.after.is_some_and(|a| n <= a) {
            return;
        }
        let mut data = f.data;
        if let Some(o) = data.as_object_mut() {
            o.insert("type".into(), json!(f.kind));
            o.insert("sequence_number".into(), json!(n));
        }
        out.push_str("event: ");
        out.push_str(f.kind);
        out.push_str("\ndata: ");
        out.push_str(&data.to_string());
        out.push_str("\n\n");
    }

    fn frames(&mut self, frames: Vec<Frame>) -> String {
        let mut out = String::new();
        for f in frames {
            self.frame(f, &mut out);
        }
        out
    }
}

/// A lifecycle event carrying the response as it stands.
fn lifecycle(kind: &'static str, response: Value) -> Frame {
    Frame {
        kind,
        data: json!({ "response": response }),
    }
}

/// The response as `response.created` and `response.in_progress` show it.
fn snapshot(meta: &Meta, status: &Status) -> Value {
    object(meta, status, Vec::new(), Value::Null)
}

/// Where a live response is kept when it ends.
pub(super) struct Keep {
    pub(super) api: Arc<ResponsesApi>,
    pub(super) tenant: String,
    pub(super) conversation: Vec<proto::Message>,
    pub(super) names: ToolNames,
}

/// A live answer's stream.
pub(super) struct Live {
    rx: Events,
    pending: Option<Event>,
    seq: Seq,
    output: Output,
    meta: Meta,
    keep: Option<Keep>,
    /// The end, once the last event arrived (kept across a cancelled poll).
    closing: Option<Closing>,
    opened: bool,
    done: bool,
}

/// Holds the response until the first event, then streams it.
pub(super) async fn live(
    mut rx: Events,
    meta: Meta,
    names: ToolNames,
    keep: Option<Keep>,
    request_id: &str,
) -> Result<Response, OpenAiError> {
    let (served, pending) = match door::open(&mut rx).await {
        Err(None) => return Err(OpenAiError::internal("request ended without an answer")),
        Err(Some(e)) => return Err(OpenAiError::from_request(&e)),
        Ok(door::Opening::Queued(q)) => return Ok(door::queued(&q, request_id)),
        Ok(door::Opening::Stream { served, pending }) => (served, pending),
    };
    let sse = Live {
        rx,
        pending,
        seq: Seq::default(),
        output: Output::new(&meta.id, names),
        meta,
        keep,
        closing: None,
        opened: false,
        done: false,
    };
    let mut r = Response::new(door::sse_body(sse));
    door::sse_headers(r.headers_mut(), served, request_id);
    Ok(r)
}

impl SseFrames for Live {
    async fn next_frames(&mut self, out: &mut BytesMut) -> bool {
        crate::api::door::put_frames(out, self.next().await)
    }
}

impl Live {
    /// The next frames. Cancel-safe (the body polls it once more to batch
    /// frames): an event is turned into frames, or into the closing,
    /// before anything is awaited, and the closing's store is idempotent.
    async fn next(&mut self) -> Option<String> {
        if self.done {
            return None;
        }
        if !self.opened {
            self.opened = true;
            let frames = vec![
                lifecycle(
                    "response.created",
                    snapshot(&self.meta, &Status::InProgress),
                ),
                lifecycle(
                    "response.in_progress",
                    snapshot(&self.meta, &Status::InProgress),
                ),
            ];
            return Some(self.seq.frames(frames));
        }
        loop {
            if self.closing.is_some() {
                return Some(self.close().await);
            }
            let item = match self.pending.take() {
                Some(e) => Some(Ok(e)),
                None => self.rx.recv().await,
            };
            let (status, usage) = match item {
                Some(Ok(Event::Started(_) | Event::Continued(_))) => continue,
                Some(Ok(Event::Chunk(chunk))) => {
                    let mut frames = Vec::new();
                    self.output.push(chunk, &mut frames);
                    if frames.is_empty() {
                        continue;
                    }
                    return Some(self.seq.frames(frames));
                }
                Some(Ok(Event::Finished(f))) => {
                    let usage = crate::api::content::usage_proto(&f.usage, f.usage_estimated);
                    (Status::of_finish(f.finish_reason), usage_json(&usage))
                }
                Some(Err(e)) => (Status::of_error(&e), Value::Null),
                // The replica is leaving: the stream ends as drained.
                Some(Ok(Event::Moved { .. })) => (
                    Status::of_error(&crate::error::RequestError::Draining),
                    Value::Null,
                ),
                // A stream never gets a `Reset` (the task ends it instead:
                // its client cannot discard output) nor a queued job.
                Some(Ok(Event::Reset { .. } | Event::Queued(_))) | None => (
                    Status::of_caller(CallerError::internal("the stream ended without a finish")),
                    Value::Null,
                ),
            };
            self.closing = Some(self.closing(status, usage));
        }
    }

    /// How the stream ends: the open items closed, the final response and
    /// (when it is kept) its record.
    fn closing(&mut self, status: Status, usage: Value) -> Closing {
        let mut frames = Vec::new();
        self.output
            .finish(!matches!(status, Status::Completed), &mut frames);
        let response = object(&self.meta, &status, self.output.items_json(), usage);
        let record = self
            .keep
            .as_ref()
            .map(|k| k.record(&self.meta, &response, &self.output));
        Closing {
            frames,
            response,
            terminal: status.terminal_event(),
            record,
        }
    }

    /// Keeps the response (when asked), then its last frames.
    async fn close(&mut self) -> String {
        let stored = match (
            &self.keep,
            self.closing.as_ref().and_then(|c| c.record.clone()),
        ) {
            (Some(keep), Some(record)) => keep.put(&self.meta.id, record).await,
            _ => true,
        };
        self.done = true;
        let Some(Closing {
            mut frames,
            mut response,
            terminal,
            ..
        }) = self.closing.take()
        else {
            return String::new();
        };
        if !stored {
            if let Some(o) = response.as_object_mut() {
                o.insert("store".into(), json!(false));
            }
        }
        frames.push(lifecycle(terminal, response));
        self.seq.frames(frames)
    }
}

/// A live stream's end, computed when its last event arrives.
struct Closing {
    frames: Vec<Frame>,
    response: Value,
    terminal: &'static str,
    /// The record to keep, encoded.
    record: Option<Vec<u8>>,
}

impl Keep {
    /// The record of a finished response.
    pub(super) fn record(&self, meta: &Meta, response: &Value, output: &Output) -> Vec<u8> {
        Record::answered(
            meta.clone(),
            response.clone(),
            self.conversation.clone(),
            output,
            self.names.clone(),
        )
        .encode()
    }

    /// Stores a finished response's record (again, if a first try was cut
    /// short: the same id is replaced); false (with a WARN) when it could not be.
    pub(super) async fn put(&self, id: &str, record: Vec<u8>) -> bool {
        let stored = match self.api.store() {
            Ok(s) => s.put(&self.tenant, id, record, true).await,
            Err(e) => Err(e),
        };
        match stored {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(response = %id, error = %e, "the response was served but not stored (it says `store: false`)");
                false
            }
        }
    }
}

/// Every event of a stored response, in order: `response.created` (queued
/// for a background response), `response.in_progress`, then, once it is
/// final, its items and the terminal event.
fn replay_frames(record: &Record) -> Vec<Frame> {
    let meta = &record.meta;
    let first = if meta.background {
        Status::Queued
    } else {
        Status::InProgress
    };
    let mut frames = vec![lifecycle("response.created", snapshot(meta, &first))];
    if record.status() == "queued" {
        return frames;
    }
    frames.push(lifecycle(
        "response.in_progress",
        snapshot(meta, &Status::InProgress),
    ));
    if !record.done {
        return frames;
    }
    let items = record
        .response
        .get("output")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    let answer = answer_of_items(&items, &record.names);
    let mut output = Output::new(&meta.id, record.names.clone());
    let chunks: Vec<Chunk> = chunks_of(&answer);
    for chunk in chunks {
        output.push(chunk, &mut frames);
    }
    let cut = record.status() != "completed";
    output.finish(cut, &mut frames);
    let kind = match record.status() {
        "completed" => "response.completed",
        "incomplete" => "response.incomplete",
        _ => "response.failed",
    };
    frames.push(lifecycle(kind, record.response.clone()));
    frames
}

/// How long a replay waits between looks at a running background response.
const REPLAY_POLL: Duration = Duration::from_millis(500);

/// A comment goes out after this long without an event, so proxies keep
/// the connection of a long background response open.
const KEEP_ALIVE: Duration = Duration::from_secs(15);

/// A stored response's stream from after event `after`.
pub(super) struct Replay {
    api: Arc<ResponsesApi>,
    tenant: String,
    id: String,
    seq: Seq,
    /// Events numbered below this were already sent by this stream.
    sent: u64,
    done: bool,
    /// The record as first read (it is read again while not final).
    first: Option<Record>,
}

impl Replay {
    pub(super) fn new(
        api: Arc<ResponsesApi>,
        tenant: String,
        record: Record,
        after: Option<u64>,
    ) -> Replay {
        Replay {
            api,
            tenant,
            id: record.meta.id.clone(),
            seq: Seq::resuming(after),
            sent: 0,
            done: false,
            first: Some(record),
        }
    }

    async fn next(&mut self) -> Option<String> {
        if self.done {
            return None;
        }
        let mut quiet = Duration::ZERO;
        loop {
            let record = match self.first.take() {
                Some(r) => r,
                None => match self.api.load(&self.tenant, &self.id).await {
                    Ok(Some(r)) => r,
                    Ok(None) => return Some(self.fail("the response was deleted")),
                    Err(e) => return Some(self.fail(&e.to_string())),
                },
            };
            let frames = replay_frames(&record);
            let total = frames.len() as u64;
            let fresh: Vec<Frame> = frames.into_iter().skip(self.sent as usize).collect();
            self.seq.next = self.sent;
            self.sent = total;
            self.done = record.done;
            let out = self.seq.frames(fresh);
            if !out.is_empty() || self.done {
                return Some(out);
            }
            self.wait().await;
            quiet += REPLAY_POLL;
            if quiet >= KEEP_ALIVE {
                return Some(": keep-alive\n\n".into());
            }
        }
    }

    /// Waits for a change to any job (or the poll interval).
    async fn wait(&self) {
        match self.api.jobs() {
            Some(jobs) => {
                let mut changes = jobs.subscribe();
                let _ = tokio::time::timeout(REPLAY_POLL, changes.recv()).await;
            }
            None => tokio::time::sleep(REPLAY_POLL).await,
        }
    }

    /// An `error` event: the response's state cannot be known any more.
    fn fail(&mut self, message: &str) -> String {
        self.done = true;
        let mut out = String::new();
        self.seq.next = self.sent;
        self.seq.frame(
            Frame {
                kind: "error",
                data: json!({
                    "code": Kind::Internal.entry().responses_code(),
                    "message": message,
                    "param": null,
                }),
            },
            &mut out,
        );
        out
    }
}

impl SseFrames for Replay {
    async fn next_frames(&mut self, out: &mut BytesMut) -> bool {
        crate::api::door::put_frames(out, self.next().await)
    }
}

/// A stored response as a stream, after event `after`.
pub(super) fn replay(
    api: Arc<ResponsesApi>,
    tenant: String,
    record: Record,
    after: Option<u64>,
    request_id: &str,
) -> Response {
    let mut r = Response::new(door::sse_body(Replay::new(api, tenant, record, after)));
    door::sse_headers(r.headers_mut(), None, request_id);
    r
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_numbered_from_zero_and_a_resume_skips_what_was_seen() {
        let f = |k| Frame {
            kind: k,
            data: json!({}),
        };
        let mut seq = Seq::default();
        let out = seq.frames(vec![f("response.created"), f("response.in_progress")]);
        assert_eq!(
            out,
            "event: response.created\ndata: {\"sequence_number\":0,\"type\":\"response.created\"}\n\n\
             event: response.in_progress\ndata: {\"sequence_number\":1,\"type\":\"response.in_progress\"}\n\n"
        );
        let mut resumed = Seq::resuming(Some(0));
        let out = resumed.frames(vec![f("response.created"), f("response.in_progress")]);
        assert!(
            out.starts_with("event: response.in_progress") && out.contains(":1,"),
            "{out}"
        );
    }

    #[test]
    fn a_background_replay_is_the_same_events_each_time() {
        let meta = Meta {
            id: "resp_z".into(),
            created_at: 7,
            background: true,
            store: true,
            previous_response_id: None,
            echo: Map::new(),
        };
        let mut output = Output::new("resp_z", ToolNames::new());
        let mut ignored = Vec::new();
        output.push(Chunk::Text("hi".into()), &mut ignored);
        output.finish(false, &mut ignored);
        let pending = Record::new(
            meta.clone(),
            snapshot(&meta, &Status::Queued),
            Vec::new(),
            ToolNames::new(),
            Some("job".into()),
            false,
        );
        let done = pending
            .finished(&Status::Completed, &output, json!({"input_tokens": 1}))
            .unwrap();
        let kinds = |r: &Record| replay_frames(r).iter().map(|f| f.kind).collect::<Vec<_>>();
        assert_eq!(kinds(&pending), vec!["response.created"]);
        let all = kinds(&done);
        assert_eq!(all[0], "response.created");
        assert_eq!(all[1], "response.in_progress");
        assert_eq!(all.last(), Some(&"response.completed"));
        let text = |r: &Record| Seq::default().frames(replay_frames(r));
        assert_eq!(text(&done), text(&done));
        assert!(
            text(&done).contains("\"status\":\"queued\""),
            "created says queued"
        );
    }
}
