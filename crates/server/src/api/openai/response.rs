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
    serde_json::to_value(Completion::new(ids, &r)).unwrap_or(Value::Null)
}

/// A `chat.completion`, serialised straight from the answer's fields (keys
/// in the order a `Value` prints them, as the streamed chunks'): the door's
/// unary answer builds no JSON tree.
#[derive(serde::Serialize)]
pub(super) struct Completion<'a> {
    choices: [CompletionChoice<'a>; 1],
    created: u64,
    id: &'a str,
    model: &'a str,
    object: &'static str,
    service_tier: Option<&'a str>,
    system_fingerprint: Option<()>,
    usage: Usage,
}

#[derive(serde::Serialize)]
struct CompletionChoice<'a> {
    finish_reason: &'static str,
    index: u32,
    logprobs: Option<()>,
    message: CompletionMessage<'a>,
}

#[derive(serde::Serialize)]
struct CompletionMessage<'a> {
    /// `null` for an answer that is only tool calls.
    content: Option<&'a str>,
    #[serde(skip_serializing_if = "String::is_empty")]
    reasoning_content: String,
    refusal: Option<()>,
    role: &'static str,
    #[serde(skip_serializing_if = "<[_]>::is_empty")]
    tool_calls: Vec<ToolCall<'a>>,
}

#[derive(serde::Serialize)]
struct ToolCall<'a> {
    function: ToolFunction<'a>,
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'static str,
}

#[derive(serde::Serialize)]
struct ToolFunction<'a> {
    arguments: &'a str,
    name: &'a str,
}

impl<'a> Completion<'a> {
    pub(super) fn new(ids: &'a Ids, r: &'a proto::CompletionResponse) -> Self {
        let tool_calls: Vec<ToolCall<'a>> = r
            .tool_calls
            .iter()
            .map(|c| ToolCall {
                function: ToolFunction {
                    arguments: &c.arguments,
                    name: &c.name,
                },
                id: &c.id,
                kind: "function",
            })
            .collect();
        let content = (!r.text.is_empty() || tool_calls.is_empty()).then_some(r.text.as_str());
        Completion {
            choices: [CompletionChoice {
                finish_reason: proto_finish_reason(r.finish_reason),
                index: 0,
                logprobs: None,
                message: CompletionMessage {
                    content,
                    reasoning_content: r.reasoning.iter().map(|b| b.text.as_str()).collect(),
                    refusal: None,
                    role: "assistant",
                    tool_calls,
                },
            }],
            created: ids.created,
            id: &ids.id,
            model: &ids.model,
            object: "chat.completion",
            service_tier: (!r.service_tier.is_empty()).then_some(r.service_tier.as_str()),
            system_fingerprint: None,
            usage: Usage::new(&r.usage.unwrap_or_default()),
        }
    }
}

/// Usage in OpenAI's convention (see [`usage_json`]), serialised from its
/// fields.
#[derive(serde::Serialize)]
pub(super) struct Usage {
    completion_tokens: u32,
    completion_tokens_details: CompletionDetails,
    prompt_tokens: u64,
    prompt_tokens_details: PromptDetails,
    total_tokens: u64,
}

#[derive(serde::Serialize)]
struct CompletionDetails {
    reasoning_tokens: u32,
}

#[derive(serde::Serialize)]
struct PromptDetails {
    #[serde(skip_serializing_if = "Option::is_none")]
    cache_write_tokens: Option<u32>,
    cached_tokens: u32,
}

impl Usage {
    pub(super) fn new(u: &proto::Usage) -> Self {
        let prompt = u64::from(u.input_tokens)
            + u64::from(u.cache_read_input_tokens)
            + u64::from(u.cache_write_input_tokens);
        Usage {
            completion_tokens: u.output_tokens,
            completion_tokens_details: CompletionDetails {
                reasoning_tokens: u.reasoning_tokens,
            },
            prompt_tokens: prompt,
            prompt_tokens_details: PromptDetails {
                cache_write_tokens: (u.cache_write_input_tokens > 0)
                    .then_some(u.cache_write_input_tokens),
                cached_tokens: u.cache_read_input_tokens,
            },
            total_tokens: prompt + u64::from(u.output_tokens),
        }
    }
}

/// Usage in OpenAI's convention: `prompt_tokens` counts every input token
/// (uncached, cache reads and cache writes), `cached_tokens` the reads
/// within it, `completion_tokens` includes `reasoning_tokens`; a cache
/// write (Anthropic) is `prompt_tokens_details.cache_write_tokens`.
pub(super) fn usage_json(u: &proto::Usage) -> Value {
    serde_json::to_value(Usage::new(u)).unwrap_or(Value::Null)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ids() -> Ids {
        Ids {
            id: "chatcmpl-1".into(),
            created: 7,
            model: "chat".into(),
        }
    }

    #[test]
    fn a_text_answer_is_the_whole_chat_completion() {
        let r = proto::CompletionResponse {
            text: "Hi".into(),
            finish_reason: proto::FinishReason::Stop as i32,
            service_tier: "default".into(),
            reasoning: vec![proto::ReasoningBlock {
                text: "think".into(),
                ..Default::default()
            }],
            usage: Some(proto::Usage {
                input_tokens: 3,
                cache_read_input_tokens: 4,
                cache_write_input_tokens: 5,
                output_tokens: 6,
                reasoning_tokens: 2,
                ..Default::default()
            }),
            ..Default::default()
        };
        let want = json!({
            "id": "chatcmpl-1", "object": "chat.completion", "created": 7, "model": "chat",
            "system_fingerprint": null, "service_tier": "default",
            "choices": [{"index": 0, "logprobs": null, "finish_reason": "stop",
                "message": {"role": "assistant", "content": "Hi", "refusal": null,
                            "reasoning_content": "think"}}],
            "usage": {"prompt_tokens": 12, "completion_tokens": 6, "total_tokens": 18,
                "prompt_tokens_details": {"cached_tokens": 4, "cache_write_tokens": 5},
                "completion_tokens_details": {"reasoning_tokens": 2}},
        });
        assert_eq!(completion(&ids(), r.clone()), want);
        // The door's bytes are the same object, keys in the same order.
        let bytes = serde_json::to_string(&Completion::new(&ids(), &r)).unwrap();
        assert_eq!(bytes, want.to_string());
    }

    #[test]
    fn a_tool_call_answer_has_null_content_and_no_empty_keys() {
        let r = proto::CompletionResponse {
            tool_calls: vec![proto::ToolCall {
                id: "call_1".into(),
                name: "f".into(),
                arguments: "{}".into(),
            }],
            finish_reason: proto::FinishReason::ToolCalls as i32,
            ..Default::default()
        };
        let v = completion(&ids(), r);
        let message = &v["choices"][0]["message"];
        assert_eq!(message["content"], Value::Null);
        assert_eq!(
            message["tool_calls"],
            json!([{"id": "call_1", "type": "function",
                    "function": {"name": "f", "arguments": "{}"}}])
        );
        assert!(message.get("reasoning_content").is_none(), "{v}");
        assert_eq!(v["service_tier"], Value::Null);
        assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");
        let details = &v["usage"]["prompt_tokens_details"];
        assert!(details.get("cache_write_tokens").is_none(), "{v}");
    }
}
