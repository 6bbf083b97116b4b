//! A stored response as the door keeps it: the response object as last
//! answered, its conversation (every message after it, instructions left
//! out, as the content model's messages), the tool names it maps, and for a
//! background response its job. A background record is settled from its
//! job when it is read (on any replica): the first reader after the job
//! ends writes the final response, and a cancel racing it loses or wins as
//! a whole (`ResponseStore::finish`).

use base64::Engine;

use super::request::ToolNames;
use super::response::{chunks_of, object, usage_json, Meta, Output, Status};
use super::*;
use crate::state::jobs::JobState;
use crate::state::responses::Finish;

/// The format of a stored record.
const VERSION: u32 = 1;

/// One stored response.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct Record {
    v: u32,
    pub(super) meta: Meta,
    /// The response object as last answered.
    pub(super) response: Value,
    /// The conversation after this response, prost-encoded messages in base64.
    conversation: String,
    /// How many of its messages were the response's input (the rest is its answer).
    inputs: usize,
    pub(super) names: ToolNames,
    /// A background response's job.
    pub(super) job: Option<String>,
    /// The response is final (completed, incomplete, failed or cancelled).
    pub(super) done: bool,
}

fn encode_messages(messages: Vec<proto::Message>) -> String {
    let holder = proto::CompletionRequest {
        messages,
        ..Default::default()
    };
    base64::engine::general_purpose::STANDARD.encode(prost::Message::encode_to_vec(&holder))
}

fn corrupt(why: impl std::fmt::Display) -> RequestError {
    RequestError::StateUnavailable(format!("a stored response cannot be read: {why}"))
}

impl Record {
    pub(super) fn new(
        meta: Meta,
        response: Value,
        conversation: Vec<proto::Message>,
        names: ToolNames,
        job: Option<String>,
        done: bool,
    ) -> Record {
        Record {
            v: VERSION,
            meta,
            response,
            inputs: conversation.len(),
            conversation: encode_messages(conversation),
            names,
            job,
            done,
        }
    }

    pub(super) fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    pub(super) fn decode(bytes: &[u8]) -> Result<Record, RequestError> {
        let r: Record = serde_json::from_slice(bytes).map_err(corrupt)?;
        if r.v != VERSION {
            return Err(corrupt(format_args!("record version {}", r.v)));
        }
        Ok(r)
    }

    /// The messages a later response continues from.
    pub(super) fn conversation(&self) -> Result<Vec<proto::Message>, RequestError> {
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(&self.conversation)
            .map_err(corrupt)?;
        <proto::CompletionRequest as prost::Message>::decode(bytes.as_slice())
            .map(|r| r.messages)
            .map_err(corrupt)
    }

    pub(super) fn status(&self) -> &str {
        self.response
            .get("status")
            .and_then(Value::as_str)
            .unwrap_or_default()
    }

    /// The final record of a response that ended as `status`, with this
    /// output and usage; the answer joins the conversation.
    pub(super) fn finished(
        &self,
        status: &Status,
        output: &Output,
        usage: Value,
    ) -> Result<Record, RequestError> {
        let mut conversation = self.conversation()?;
        let inputs = conversation.len();
        conversation.extend(output.assistant_turn());
        let mut done = Record::new(
            self.meta.clone(),
            object(&self.meta, status, output.items_json(), usage),
            conversation,
            self.names.clone(),
            self.job.clone(),
            true,
        );
        done.inputs = inputs;
        Ok(done)
    }

    /// The record of a live response that ended: `input` then its answer.
    pub(super) fn answered(
        meta: Meta,
        response: Value,
        input: Vec<proto::Message>,
        output: &Output,
        names: ToolNames,
    ) -> Record {
        let inputs = input.len();
        let mut conversation = input;
        conversation.extend(output.assistant_turn());
        let mut r = Record::new(meta, response, conversation, names, None, true);
        r.inputs = inputs;
        r
    }

    /// The response's input messages (its context, instructions left out).
    pub(super) fn input(&self) -> Result<Vec<proto::Message>, RequestError> {
        let mut all = self.conversation()?;
        all.truncate(self.inputs);
        Ok(all)
    }
}

/// What a finished job's stored answer says.
fn finish_reason(f: i32) -> FinishReason {
    match proto::FinishReason::try_from(f) {
        Ok(proto::FinishReason::Length) => FinishReason::Length,
        Ok(proto::FinishReason::ToolCalls) => FinishReason::ToolCalls,
        Ok(proto::FinishReason::ContentFilter) => FinishReason::ContentFilter,
        Ok(proto::FinishReason::Refusal) => FinishReason::Refusal,
        _ => FinishReason::Stop,
    }
}

/// The code a failed job's reason is reported with.
fn failed_code(reason: &str) -> &'static str {
    if reason.contains("RATE_LIMITED") || reason == "COST_CAP" || reason == "TENANT_LIMIT" {
        "rate_limit_exceeded"
    } else if reason.contains("INVALID") {
        "invalid_prompt"
    } else {
        "server_error"
    }
}

impl ResponsesApi {
    /// [`Self::load`] for a handler that answers a missing response with a
    /// 404 in OpenAI's shape.
    pub(super) async fn found(&self, tenant: &str, id: &str) -> Result<Record, OpenAiError> {
        self.load(tenant, id)
            .await
            .map_err(refused)?
            .ok_or_else(|| refused(RequestError::ResponseNotFound(id.to_string())))
    }

    /// The tenant's stored response `id`, a background one settled from its
    /// job when that has ended.
    pub(super) async fn load(
        &self,
        tenant: &str,
        id: &str,
    ) -> Result<Option<Record>, RequestError> {
        let Some(bytes) = self.store()?.get(tenant, id).await? else {
            return Ok(None);
        };
        let record = Record::decode(&bytes)?;
        if record.done {
            return Ok(Some(record));
        }
        self.settle(tenant, record).await
    }

    /// A background record as its job stands: queued, in progress, or
    /// final (written once, by whoever reads it first after the job ended).
    async fn settle(
        &self,
        tenant: &str,
        mut record: Record,
    ) -> Result<Option<Record>, RequestError> {
        let (Some(job_id), Some(jobs)) = (record.job.clone(), self.jobs()) else {
            return Ok(Some(record));
        };
        let job = jobs.get(&job_id).await?;
        let (status, answer) = match job {
            None => (
                Status::Failed(
                    "server_error".into(),
                    "the background job's result is gone (kept for queue.job_ttl)".into(),
                ),
                None,
            ),
            Some(j) => match j.state {
                JobState::Queued => return Ok(Some(record)),
                JobState::Running => {
                    if let Some(o) = record.response.as_object_mut() {
                        o.insert("status".into(), json!("in_progress"));
                    }
                    return Ok(Some(record));
                }
                JobState::Succeeded => {
                    let answer = j
                        .result
                        .as_deref()
                        .and_then(|b| <proto::CompletionResponse as prost::Message>::decode(b).ok())
                        .ok_or_else(|| corrupt("the job's answer is unreadable"))?;
                    (
                        Status::of_finish(finish_reason(answer.finish_reason)),
                        Some(answer),
                    )
                }
                JobState::Failed if j.error_reason.as_deref() == Some("CANCELLED") => {
                    (Status::Cancelled, None)
                }
                JobState::Failed | JobState::Expired => (
                    Status::Failed(
                        failed_code(j.error_reason.as_deref().unwrap_or_default()).into(),
                        j.error.unwrap_or_default(),
                    ),
                    None,
                ),
            },
        };
        let mut output = Output::new(&record.meta.id, record.names.clone());
        let mut frames = Vec::new();
        let usage = match &answer {
            Some(a) => {
                for chunk in chunks_of(a) {
                    output.push(chunk, &mut frames);
                }
                usage_json(&a.usage.unwrap_or_default())
            }
            None => Value::Null,
        };
        output.finish(matches!(status, Status::Incomplete(_)), &mut frames);
        let done = record.finished(&status, &output, usage)?;
        self.finish(tenant, done).await
    }

    /// Writes a final record unless another already is; the one stored wins.
    pub(super) async fn finish(
        &self,
        tenant: &str,
        record: Record,
    ) -> Result<Option<Record>, RequestError> {
        let store = self.store()?;
        match store
            .finish(tenant, &record.meta.id, record.encode())
            .await?
        {
            Finish::Finished => Ok(Some(record)),
            Finish::AlreadyDone => match store.get(tenant, &record.meta.id).await? {
                Some(bytes) => Record::decode(&bytes).map(Some),
                None => Ok(None),
            },
            Finish::Gone => Ok(None),
        }
    }
}

/// One message of a stored conversation as Responses input items.
fn items_of(m: &proto::Message, names: &ToolNames, at: usize, base: &str) -> Vec<Value> {
    use proto::content_part::Part as P;
    let id = |kind: &str, j: usize| format!("{kind}_{base}_in{at}_{j}");
    let parts: Vec<proto::ContentPart> = if m.parts.is_empty() && !m.content.is_empty() {
        vec![proto::ContentPart {
            part: Some(P::Text(m.content.clone())),
            cache_control: None,
        }]
    } else {
        m.parts.clone()
    };
    match m.role.as_str() {
        "assistant" => {
            let mut out = Vec::new();
            for (j, p) in parts.iter().enumerate() {
                match &p.part {
                    Some(P::Reasoning(b)) => {
                        let mut item = json!({"type": "reasoning", "id": id("rs", j), "summary": []});
                        if let (Some(enc), Some(o)) =
                            (super::response::wrap_reasoning(b), item.as_object_mut())
                        {
                            o.insert("encrypted_content".into(), json!(enc));
                        }
                        out.push(item);
                    }
                    Some(P::Text(t)) => out.push(json!({
                        "type": "message", "id": id("msg", j), "role": "assistant", "status": "completed",
                        "content": [{"type": "output_text", "text": t, "annotations": []}],
                    })),
                    _ => {}
                }
            }
            for (j, c) in m.tool_calls.iter().enumerate() {
                let named = names.get(&c.name);
                let mut item = match named {
                    Some(n) if n.custom => json!({
                        "type": "custom_tool_call", "id": id("ctc", j), "call_id": c.id,
                        "name": n.name, "input": super::request::custom_input(&c.arguments),
                    }),
                    _ => json!({
                        "type": "function_call", "id": id("fc", j), "call_id": c.id, "status": "completed",
                        "name": named.map_or(c.name.as_str(), |n| &n.name), "arguments": c.arguments,
                    }),
                };
                if let (Some(ns), Some(o)) = (
                    named.and_then(|n| n.namespace.as_ref()),
                    item.as_object_mut(),
                ) {
                    o.insert("namespace".into(), json!(ns));
                }
                out.push(item);
            }
            out
        }
        "tool" => vec![json!({
            "type": "function_call_output", "id": id("fco", 0), "call_id": m.tool_call_id,
            "output": m.content, "status": "completed",
        })],
        role => {
            let content: Vec<Value> = parts
                .iter()
                .filter_map(|p| match &p.part {
                    Some(P::Text(t)) => Some(json!({"type": "input_text", "text": t})),
                    Some(P::Image(i)) => Some(json!({"type": "input_image", "image_url": i.url, "detail": if i.detail.is_empty() { "auto" } else { i.detail.as_str() }})),
                    Some(P::Document(d)) => Some(json!({"type": "input_file", "filename": d.filename, "file_data": d.url})),
                    _ => None,
                })
                .collect();
            vec![
                json!({"type": "message", "id": id("msg", 0), "role": role, "status": "completed", "content": content}),
            ]
        }
    }
}

/// `GET /v1/responses/{id}/input_items`: the response's input as items,
/// `order` (desc by default, as OpenAI's), `limit` (1-100, 20) and `after`.
pub(super) fn input_item_list(record: &Record, query: Option<&str>) -> Result<Value, OpenAiError> {
    let mut limit = 20usize;
    let mut desc = true;
    let mut after = None;
    for (k, v) in form_urlencoded::parse(query.unwrap_or_default().as_bytes()) {
        match k.as_ref() {
            "limit" => {
                limit = v
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=100).contains(n))
                    .ok_or_else(|| {
                        super::request::bad("limit", "must be an integer from 1 to 100")
                    })?
            }
            "order" if v == "asc" => desc = false,
            "order" if v == "desc" => desc = true,
            "order" => return Err(super::request::bad("order", "must be asc or desc")),
            "after" => after = Some(v.into_owned()),
            _ => {}
        }
    }
    let base = record
        .meta
        .id
        .strip_prefix("resp_")
        .unwrap_or(&record.meta.id);
    let mut items: Vec<Value> = record
        .input()
        .map_err(|e| OpenAiError::from_request(&e))?
        .iter()
        .enumerate()
        .flat_map(|(i, m)| items_of(m, &record.names, i, base))
        .collect();
    if desc {
        items.reverse();
    }
    if let Some(after) = after {
        let at = items
            .iter()
            .position(|i| i.get("id").and_then(Value::as_str) == Some(after.as_str()))
            .ok_or_else(|| super::request::bad("after", "is not an item of this response"))?;
        items.drain(..=at);
    }
    let has_more = items.len() > limit;
    items.truncate(limit);
    let first = items.first().and_then(|i| i.get("id")).cloned();
    let last = items.last().and_then(|i| i.get("id")).cloned();
    Ok(
        json!({"object": "list", "data": items, "first_id": first, "last_id": last, "has_more": has_more}),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_with_its_conversation() {
        let meta = Meta {
            id: "resp_1".into(),
            created_at: 1,
            background: false,
            store: true,
            previous_response_id: None,
            echo: Map::new(),
        };
        let messages = vec![proto::Message {
            role: "user".into(),
            content: "hi".into(),
            ..Default::default()
        }];
        let r = Record::new(
            meta,
            json!({"status": "completed"}),
            messages.clone(),
            ToolNames::new(),
            None,
            true,
        );
        let back = Record::decode(&r.encode()).unwrap();
        assert_eq!(back.conversation().unwrap(), messages);
        assert_eq!(back.status(), "completed");
        assert!(Record::decode(b"{\"v\":2}").is_err());
    }
}
