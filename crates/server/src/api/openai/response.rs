//! A finished answer in OpenAI's shape: `chat.completion`, finish reasons
//! and usage.

use super::*;

pub(super) fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

/// The identity every chunk of one answer repeats.
pub(super) struct Ids {
    pub(super) id: String,
    pub(super) created: u64,
    /// The route the caller named (not the serving target: failover stays
    /// invisible except in `x-switchyard-served-by`).
    pub(super) model: String,
}

pub(super) fn finish_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "stop",
        FinishReason::Length => "length",
        FinishReason::ToolCalls => "tool_calls",
        // OpenAI has no refusal finish reason; an upstream refusal is an answer
        // the provider's safety layer shaped, the nearest is `content_filter`.
        FinishReason::ContentFilter | FinishReason::Refusal => "content_filter",
    }
}

pub(super) fn proto_finish_reason(f: i32) -> &'static str {
    match proto::FinishReason::try_from(f) {
        Ok(proto::FinishReason::Length) => "length",
        Ok(proto::FinishReason::ToolCalls) => "tool_calls",
        Ok(proto::FinishReason::ContentFilter | proto::FinishReason::Refusal) => "content_filter",
        _ => "stop",
    }
}

/// A unary answer as a `chat.completion` object; reasoning text (from any
/// upstream) is the compatible servers' `message.reasoning_content`.
pub(super) fn completion(ids: &Ids, r: proto::CompletionResponse) -> Value {
    let tool_calls: Vec<Value> = r
        .tool_calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect();
    let mut message = json!({
        "role": "assistant",
        "content": if r.text.is_empty() && !tool_calls.is_empty() { Value::Null } else { Value::String(r.text) },
        "refusal": null,
    });
    if let Some(m) = message.as_object_mut() {
        if !tool_calls.is_empty() {
            m.insert("tool_calls".into(), Value::Array(tool_calls));
        }
        let reasoning: String = r.reasoning.iter().map(|b| b.text.as_str()).collect();
        if !reasoning.is_empty() {
            m.insert("reasoning_content".into(), Value::String(reasoning));
        }
    }
    let usage = r.usage.unwrap_or_default();
    json!({
        "id": ids.id,
        "object": "chat.completion",
        "created": ids.created,
        "model": ids.model,
        "system_fingerprint": null,
        "service_tier": (!r.service_tier.is_empty()).then_some(r.service_tier.as_str()),
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": proto_finish_reason(r.finish_reason),
        }],
        "usage": usage_json(&usage),
    })
}

/// Usage in OpenAI's convention: `prompt_tokens` counts every input token
/// (uncached, cache reads and cache writes), `cached_tokens` the reads
/// within it, `completion_tokens` includes `reasoning_tokens`; a cache
/// write (Anthropic) is `prompt_tokens_details.cache_write_tokens`.
pub(super) fn usage_json(u: &proto::Usage) -> Value {
    let prompt = u64::from(u.input_tokens)
        + u64::from(u.cache_read_input_tokens)
        + u64::from(u.cache_write_input_tokens);
    let mut prompt_details = json!({ "cached_tokens": u.cache_read_input_tokens });
    if u.cache_write_input_tokens > 0 {
        prompt_details["cache_write_tokens"] = json!(u.cache_write_input_tokens);
    }
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": u.output_tokens,
        "total_tokens": prompt + u64::from(u.output_tokens),
        "prompt_tokens_details": prompt_details,
        "completion_tokens_details": { "reasoning_tokens": u.reasoning_tokens },
    })
}
