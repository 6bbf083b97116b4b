//! A finished answer in Anthropic's shape: the `message` object, its
//! content blocks (`thinking` / `redacted_thinking` first, then text, then
//! `tool_use` with the input as parsed JSON), `stop_reason` and usage with
//! the prompt-cache reads and writes.

use serde_json::{json, Value};

use crate::chat::FinishReason;
use crate::proto;

/// The identity of one answer.
pub(super) struct Ids {
    /// `msg_<request id>`.
    pub(super) id: String,
    /// What the caller named (a failover stays invisible except in the
    /// `x-switchyard-*` headers).
    pub(super) model: String,
}

/// Anthropic's `stop_reason` for how the answer ended. An upstream content
/// filter is nearest to a refusal: the provider's safety layer shaped it.
pub(super) fn stop_reason(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Stop => "end_turn",
        FinishReason::Length => "max_tokens",
        FinishReason::ToolCalls => "tool_use",
        FinishReason::ContentFilter | FinishReason::Refusal => "refusal",
    }
}

fn proto_stop_reason(f: i32) -> &'static str {
    stop_reason(match proto::FinishReason::try_from(f) {
        Ok(proto::FinishReason::Length) => FinishReason::Length,
        Ok(proto::FinishReason::ToolCalls) => FinishReason::ToolCalls,
        Ok(proto::FinishReason::ContentFilter) => FinishReason::ContentFilter,
        Ok(proto::FinishReason::Refusal) => FinishReason::Refusal,
        _ => FinishReason::Stop,
    })
}

/// A tool call's arguments as the `input` object. Arguments that are not a
/// JSON object (an upstream that streamed broken JSON) are kept as a string
/// rather than lost.
pub(super) fn tool_input(arguments: &str) -> Value {
    if arguments.trim().is_empty() {
        return json!({});
    }
    match serde_json::from_str::<Value>(arguments) {
        Ok(v @ Value::Object(_)) => v,
        _ => Value::String(arguments.to_string()),
    }
}

/// Usage in Anthropic's shape: uncached input, cache writes (with their
/// split by TTL) and reads beside it, output.
pub(super) fn usage_json(u: &proto::Usage) -> Value {
    serde_json::to_value(UsageFrame::of(u)).unwrap_or_default()
}

/// Anthropic's `usage` object, serialised straight from its numbers (a
/// stream writes it without a JSON tree).
#[derive(serde::Serialize)]
pub(super) struct UsageFrame {
    input_tokens: u32,
    cache_creation_input_tokens: u32,
    cache_read_input_tokens: u32,
    cache_creation: CacheCreation,
    output_tokens: u32,
}

#[derive(serde::Serialize)]
struct CacheCreation {
    ephemeral_5m_input_tokens: u32,
    ephemeral_1h_input_tokens: u32,
}

impl UsageFrame {
    pub(super) fn of(u: &proto::Usage) -> Self {
        let write_1h = u
            .cache_write_1h_input_tokens
            .min(u.cache_write_input_tokens);
        UsageFrame {
            input_tokens: u.input_tokens,
            cache_creation_input_tokens: u.cache_write_input_tokens,
            cache_read_input_tokens: u.cache_read_input_tokens,
            cache_creation: CacheCreation {
                ephemeral_5m_input_tokens: u.cache_write_input_tokens - write_1h,
                ephemeral_1h_input_tokens: write_1h,
            },
            output_tokens: u.output_tokens,
        }
    }
}

/// A reasoning block as Anthropic's `thinking` or `redacted_thinking`
/// (a block from another dialect has no signature; it is shown, and left
/// out if it comes back).
pub(super) fn thinking_block(r: &proto::ReasoningBlock) -> Value {
    if r.redacted_data.is_empty() {
        json!({"type": "thinking", "thinking": r.text, "signature": r.signature})
    } else {
        json!({"type": "redacted_thinking", "data": r.redacted_data})
    }
}

/// A unary answer as a `message` object.
pub(super) fn message(ids: &Ids, r: proto::CompletionResponse) -> Value {
    let mut content: Vec<Value> = r.reasoning.iter().map(thinking_block).collect();
    if !r.text.is_empty() || r.tool_calls.is_empty() {
        content.push(json!({"type": "text", "text": r.text}));
    }
    for c in &r.tool_calls {
        content.push(json!({
            "type": "tool_use",
            "id": c.id,
            "name": c.name,
            "input": tool_input(&c.arguments),
        }));
    }
    let mut usage = usage_json(&r.usage.unwrap_or_default());
    if !r.service_tier.is_empty() {
        usage["service_tier"] = Value::from(r.service_tier.as_str());
    }
    json!({
        "id": ids.id,
        "type": "message",
        "role": "assistant",
        "model": ids.model,
        "content": content,
        "stop_reason": proto_stop_reason(r.finish_reason),
        "stop_sequence": null,
        "usage": usage,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn a_tool_answer_is_a_message_with_parsed_input() {
        let ids = Ids {
            id: "msg_1".into(),
            model: "chat".into(),
        };
        let m = message(
            &ids,
            proto::CompletionResponse {
                text: String::new(),
                tool_calls: vec![proto::ToolCall {
                    id: "toolu_1".into(),
                    name: "weather".into(),
                    arguments: r#"{"city":"Paris"}"#.into(),
                }],
                finish_reason: proto::FinishReason::ToolCalls as i32,
                usage: Some(proto::Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    estimated: false,
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        assert_eq!(m["type"], "message");
        assert_eq!(m["stop_reason"], "tool_use");
        assert_eq!(m["content"].as_array().unwrap().len(), 1);
        assert_eq!(m["content"][0]["input"]["city"], "Paris");
        assert_eq!(m["usage"]["output_tokens"], 5);
        assert_eq!(tool_input("not json"), Value::String("not json".into()));
    }

    #[test]
    fn thinking_leads_the_message_and_usage_carries_cache_reads_and_writes() {
        let ids = Ids {
            id: "msg_1".into(),
            model: "chat".into(),
        };
        let m = message(
            &ids,
            proto::CompletionResponse {
                text: "42".into(),
                reasoning: vec![
                    proto::ReasoningBlock {
                        text: "Let me think.".into(),
                        signature: "sig".into(),
                        redacted_data: String::new(),
                        dialect: "anthropic".into(),
                    },
                    proto::ReasoningBlock {
                        redacted_data: "opaque".into(),
                        dialect: "anthropic".into(),
                        ..Default::default()
                    },
                ],
                usage: Some(proto::Usage {
                    input_tokens: 21,
                    output_tokens: 393,
                    cache_read_input_tokens: 1000,
                    cache_write_input_tokens: 188_086,
                    cache_write_1h_input_tokens: 8086,
                    ..Default::default()
                }),
                ..Default::default()
            },
        );
        assert_eq!(
            m["content"],
            json!([
                {"type": "thinking", "thinking": "Let me think.", "signature": "sig"},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "42"}
            ])
        );
        assert_eq!(
            m["usage"],
            json!({"input_tokens": 21, "cache_creation_input_tokens": 188_086,
                   "cache_read_input_tokens": 1000,
                   "cache_creation": {"ephemeral_5m_input_tokens": 180_000,
                                      "ephemeral_1h_input_tokens": 8086},
                   "output_tokens": 393})
        );
    }
}
