//! The content model on each wire: what the OpenAI and Anthropic encoders put
//! in the body for images, documents, cache markers, signed reasoning,
//! reasoning asks, structured output and passthrough, and what each reports
//! as dropped; usage normalisation, cost and reservations on every wire
//! (the worked examples of docs/prices.md).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::sync::Arc;

use bytes::Bytes;
use serde_json::{json, Map, Value};

use crate::chat::{
    CacheTtl, ChatMessage, ChatRequest, Chunk, Dialect, Document, Image, JsonSchema, MediaSource,
    Part, PartKind, Passthrough, ReasoningAsk, ReasoningBlock, ToolSpec, Usage,
};
use crate::config::Price;
use crate::upstream::anthropic::{self, AnthropicDecoder, Host};
use crate::upstream::sse::transcript::run_all;
use crate::upstream::{openai, Dropped};

fn part(kind: PartKind, cache: Option<CacheTtl>) -> Part {
    Part { kind, cache }
}

fn png() -> PartKind {
    PartKind::Image(Image {
        source: MediaSource::Data(Bytes::from_static(b"\x89PNG")),
        media_type: "image/png".into(),
        detail: Some("high".into()),
    })
}

fn pdf() -> PartKind {
    PartKind::Document(Document {
        source: MediaSource::Data(Bytes::from_static(b"%PDF-1.4")),
        media_type: "application/pdf".into(),
        title: Some("Invoice".into()),
        filename: None,
    })
}

fn thinking(dialect: Dialect) -> PartKind {
    PartKind::Reasoning(ReasoningBlock {
        text: "Let me think.".into(),
        signature: Some("sig-1".into()),
        redacted: None,
        dialect: Some(dialect),
    })
}

/// A conversation with every kind of part, a cache marker on the system
/// prompt, a tool and a tool result, and signed reasoning from `dialect`.
fn rich(dialect: Dialect) -> ChatRequest {
    ChatRequest {
        model: "m".into(),
        messages: vec![
            ChatMessage {
                role: "system".into(),
                parts: vec![part(
                    PartKind::Text("long system prompt".into()),
                    Some(CacheTtl::OneHour),
                )],
                ..Default::default()
            },
            ChatMessage {
                role: "user".into(),
                parts: vec![
                    part(PartKind::Text("What is in these?".into()), None),
                    part(png(), None),
                    part(pdf(), Some(CacheTtl::FiveMinutes)),
                ],
                ..Default::default()
            },
            ChatMessage {
                role: "assistant".into(),
                parts: vec![part(thinking(dialect), None)],
                tool_calls: vec![crate::chat::ToolCall {
                    id: "call_1".into(),
                    name: "lookup".into(),
                    arguments: r#"{"q":"x"}"#.into(),
                }],
                ..Default::default()
            },
            ChatMessage {
                role: "tool".into(),
                content: "not found".into(),
                tool_call_id: Some("call_1".into()),
                is_error: true,
                cache: Some(CacheTtl::FiveMinutes),
                ..Default::default()
            },
        ]
        .into(),
        tools: vec![ToolSpec {
            name: "lookup".into(),
            description: "Look it up".into(),
            parameters: json!({"type": "object"}),
            cache: Some(CacheTtl::OneHour),
            extra: None,
        }]
        .into(),
        max_tokens: Some(4096),
        ..Default::default()
    }
}

#[test]
fn anthropic_carries_media_markers_reasoning_and_tool_errors_as_its_own_blocks() {
    let mut dropped = Dropped::default();
    let body = anthropic::build_body(&rich(Dialect::Anthropic), Host::FirstParty, &mut dropped);
    assert!(dropped.is_empty(), "{dropped:?}");
    assert_eq!(
        body["system"],
        json!([{"type": "text", "text": "long system prompt",
                "cache_control": {"type": "ephemeral", "ttl": "1h"}}])
    );
    assert_eq!(
        body["tools"][0]["cache_control"],
        json!({"type": "ephemeral", "ttl": "1h"})
    );
    let user = &body["messages"][0]["content"];
    assert_eq!(
        user[0],
        json!({"type": "text", "text": "What is in these?"})
    );
    assert_eq!(
        user[1],
        json!({"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORw=="}})
    );
    assert_eq!(user[2]["type"], "document");
    assert_eq!(user[2]["title"], "Invoice");
    assert_eq!(
        user[2]["source"],
        json!({"type": "base64", "media_type": "application/pdf", "data": "JVBERi0xLjQ="})
    );
    assert_eq!(user[2]["cache_control"], json!({"type": "ephemeral"}));
    let assistant = &body["messages"][1]["content"];
    assert_eq!(
        assistant[0],
        json!({"type": "thinking", "thinking": "Let me think.", "signature": "sig-1"}),
        "signed thinking first, unmodified"
    );
    assert_eq!(assistant[1]["type"], "tool_use");
    let result = &body["messages"][2]["content"][0];
    assert_eq!(result["type"], "tool_result");
    assert_eq!(result["is_error"], true);
    assert_eq!(result["cache_control"], json!({"type": "ephemeral"}));
}

#[test]
fn openai_maps_media_and_reports_what_its_wire_cannot_carry() {
    let mut dropped = Dropped::default();
    let body = openai::build_body(&rich(Dialect::Anthropic), &mut dropped);
    assert_eq!(body["messages"][0]["content"], "long system prompt");
    let user = &body["messages"][1]["content"];
    assert_eq!(
        user[1],
        json!({"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw==", "detail": "high"}})
    );
    assert_eq!(
        user[2],
        json!({"type": "file", "file": {"file_data": "data:application/pdf;base64,JVBERi0xLjQ=", "filename": "Invoice.pdf"}})
    );
    assert_eq!(body["messages"][2]["content"], Value::Null);
    assert_eq!(body["messages"][3]["content"], "not found");
    let mut names = dropped.into_names();
    names.sort();
    assert_eq!(names, ["cache_control", "is_error", "reasoning"]);
}

#[test]
fn another_familys_signed_reasoning_never_reaches_anthropic() {
    let mut dropped = Dropped::default();
    let body = anthropic::build_body(&rich(Dialect::Gemini), Host::Cloud, &mut dropped);
    assert_eq!(body["messages"][1]["content"][0]["type"], "tool_use");
    assert_eq!(dropped.names(), ["reasoning"]);
}

#[test]
fn reasoning_asks_map_across_dialects() {
    let ask = |r: ReasoningAsk, max: u32| ChatRequest {
        model: "m".into(),
        reasoning: Some(r),
        max_tokens: Some(max),
        ..Default::default()
    };
    let effort = |e: &str| ReasoningAsk {
        effort: Some(e.into()),
        ..Default::default()
    };
    let budget = |b| ReasoningAsk {
        budget_tokens: Some(b),
        ..Default::default()
    };
    let mut d = Dropped::default();
    let a = anthropic::build_body(&ask(effort("high"), 32000), Host::FirstParty, &mut d);
    assert_eq!(
        a["thinking"],
        json!({"type": "enabled", "budget_tokens": 16384})
    );
    assert_eq!(a["output_config"], json!({"effort": "high"}));
    let a = anthropic::build_body(&ask(budget(50_000), 8000), Host::FirstParty, &mut d);
    assert_eq!(
        a["thinking"],
        json!({"type": "enabled", "budget_tokens": 7999}),
        "a budget fits under max_tokens"
    );
    let adaptive = ReasoningAsk {
        adaptive: true,
        ..Default::default()
    };
    let a = anthropic::build_body(&ask(adaptive, 1000), Host::FirstParty, &mut d);
    assert_eq!(a["thinking"], json!({"type": "adaptive"}));
    assert!(d.is_empty());
    let a = anthropic::build_body(&ask(budget(4000), 900), Host::FirstParty, &mut d);
    assert!(a.get("thinking").is_none());
    assert_eq!(d.names(), ["thinking"], "no budget fits under 900 tokens");

    let mut d = Dropped::default();
    let o = openai::build_body(&ask(budget(6000), 8000), &mut d);
    assert_eq!(o["reasoning_effort"], "medium");
    assert_eq!(o["max_completion_tokens"], 8000);
    assert!(o.get("max_tokens").is_none());
    let o = openai::build_body(&ask(effort("low"), 8000), &mut d);
    assert_eq!(o["reasoning_effort"], "low");
}

#[test]
fn a_json_schema_goes_as_each_wires_structured_output() {
    let req = ChatRequest {
        model: "m".into(),
        json_schema: Some(JsonSchema {
            name: "person".into(),
            schema: json!({"type": "object", "properties": {"name": {"type": "string"}}}),
            strict: true,
            description: None,
        }),
        ..Default::default()
    };
    let mut d = Dropped::default();
    let o = openai::build_body(&req, &mut d);
    assert_eq!(
        o["response_format"],
        json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true,
               "schema": {"type": "object", "properties": {"name": {"type": "string"}}}}})
    );
    let a = anthropic::build_body(&req, Host::FirstParty, &mut d);
    assert_eq!(
        a["output_config"],
        json!({"format": {"type": "json_schema",
               "schema": {"type": "object", "properties": {"name": {"type": "string"}}}}})
    );
    assert!(d.is_empty());
}

fn passthrough(dialect: Dialect) -> Arc<Passthrough> {
    let mut fields = Map::new();
    fields.insert(
        "context_management".into(),
        json!({"edits": [{"type": "clear_thinking_20251015", "keep": "all"}]}),
    );
    fields.insert(
        "thinking".into(),
        json!({"type": "adaptive", "display": "omitted"}),
    );
    Arc::new(Passthrough {
        dialect: Some(dialect),
        fields,
        headers: vec![(
            "anthropic-beta".into(),
            "context-management-2025-06-27".into(),
        )],
        dropped: vec!["messages[1].output_config".into()],
    })
}

#[test]
fn a_doors_unmodelled_fields_reach_its_own_wire_verbatim_and_are_reported_elsewhere() {
    let req = ChatRequest {
        model: "m".into(),
        reasoning: Some(ReasoningAsk {
            adaptive: true,
            ..Default::default()
        }),
        passthrough: Some(passthrough(Dialect::Anthropic)),
        ..Default::default()
    };
    // Anthropic itself: verbatim, the caller's `thinking` over the mapping.
    let mut d = Dropped::default();
    d.door(&req);
    let a = anthropic::build_body(&req, Host::FirstParty, &mut d);
    let h = anthropic::passthrough_headers(&req, Host::FirstParty, &mut d);
    assert_eq!(
        a["thinking"],
        json!({"type": "adaptive", "display": "omitted"})
    );
    assert_eq!(a["context_management"]["edits"][0]["keep"], "all");
    assert_eq!(h["anthropic-beta"], "context-management-2025-06-27");
    assert_eq!(d.names(), ["messages[1].output_config"]);
    // A cloud host: the mapping only, the rest reported.
    let mut d = Dropped::default();
    let a = anthropic::build_body(&req, Host::Cloud, &mut d);
    anthropic::passthrough_headers(&req, Host::Cloud, &mut d);
    assert_eq!(a["thinking"], json!({"type": "adaptive"}));
    assert!(a.get("context_management").is_none());
    assert_eq!(
        d.names(),
        [
            "passthrough.context_management",
            "passthrough.thinking",
            "header.anthropic-beta"
        ]
    );
    // Another dialect: never sent, every field reported.
    let mut d = Dropped::default();
    let o = openai::build_body(&req, &mut d);
    assert!(o.get("context_management").is_none() && o.get("thinking").is_none());
    assert_eq!(d.names().len(), 3);
}

#[test]
fn openai_usage_counts_cached_tokens_beside_uncached_input() {
    let u = openai::parse_usage(Some(&json!({
        "prompt_tokens": 2006, "completion_tokens": 300, "total_tokens": 2306,
        "prompt_tokens_details": {"cached_tokens": 1920},
        "completion_tokens_details": {"reasoning_tokens": 256}
    })))
    .unwrap();
    assert_eq!(
        u,
        Usage {
            input_tokens: 86,
            output_tokens: 300,
            cache_read_input_tokens: 1920,
            cache_write_input_tokens: 0,
            cache_write_1h_input_tokens: 0,
            reasoning_tokens: 256,
        }
    );
    assert_eq!(u.total_input(), 2006);
}

#[test]
fn anthropic_streams_signed_thinking_and_reports_cache_usage() {
    let stream = concat!(
        "event: message_start\ndata: {\"type\":\"message_start\",\"message\":{\"id\":\"m\",\"usage\":{\"input_tokens\":21,\"cache_creation_input_tokens\":188086,\"cache_read_input_tokens\":0,\"cache_creation\":{\"ephemeral_5m_input_tokens\":180000,\"ephemeral_1h_input_tokens\":8086},\"output_tokens\":1}}}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":0,\"content_block\":{\"type\":\"thinking\",\"thinking\":\"\",\"signature\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"Let me \"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"thinking_delta\",\"thinking\":\"think.\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":0,\"delta\":{\"type\":\"signature_delta\",\"signature\":\"EqQB\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":0}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":1,\"content_block\":{\"type\":\"redacted_thinking\",\"data\":\"opaque\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":1}\n\n",
        "event: content_block_start\ndata: {\"type\":\"content_block_start\",\"index\":2,\"content_block\":{\"type\":\"text\",\"text\":\"\"}}\n\n",
        "event: content_block_delta\ndata: {\"type\":\"content_block_delta\",\"index\":2,\"delta\":{\"type\":\"text_delta\",\"text\":\"42\"}}\n\n",
        "event: content_block_stop\ndata: {\"type\":\"content_block_stop\",\"index\":2}\n\n",
        "event: message_delta\ndata: {\"type\":\"message_delta\",\"delta\":{\"stop_reason\":\"end_turn\"},\"usage\":{\"output_tokens\":393}}\n\n",
        "event: message_stop\ndata: {\"type\":\"message_stop\"}\n\n",
    );
    let (chunks, done) = run_all(stream, AnthropicDecoder::new);
    let done = done.unwrap();
    let reasoning: String = chunks
        .iter()
        .filter_map(|c| match c {
            Chunk::Reasoning(r) => Some(r.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(reasoning, "Let me think.");
    assert!(
        chunks.contains(&Chunk::Reasoning(Box::new(crate::chat::ReasoningDelta {
            text: String::new(),
            signature: Some("EqQB".into()),
            redacted: None
        })))
    );
    assert_eq!(chunks.last(), Some(&Chunk::Text("42".into())));
    assert_eq!(
        done.reasoning,
        vec![
            ReasoningBlock {
                text: "Let me think.".into(),
                signature: Some("EqQB".into()),
                redacted: None,
                dialect: Some(Dialect::Anthropic),
            },
            ReasoningBlock {
                redacted: Some("opaque".into()),
                dialect: Some(Dialect::Anthropic),
                ..Default::default()
            },
        ]
    );
    let u = done.usage.unwrap();
    assert_eq!(
        (
            u.input_tokens,
            u.cache_write_input_tokens,
            u.cache_write_1h_input_tokens,
            u.output_tokens
        ),
        (21, 188_086, 8_086, 393)
    );
}

/// Hand-computed worked examples (docs/prices.md): Sonnet-class prices on Anthropic
/// ($3 in, $15 out) and a gpt-4o-class price on OpenAI ($2.50 in, $10 out).
#[test]
fn cost_prices_cache_reads_writes_and_reasoning_by_their_own_rates() {
    let sonnet = Price {
        input_per_mtok: 3.0,
        output_per_mtok: 15.0,
        ..Price::default()
    };
    let anthropic_turn = Usage {
        input_tokens: 21,
        output_tokens: 393,
        cache_read_input_tokens: 0,
        cache_write_input_tokens: 188_086,
        cache_write_1h_input_tokens: 8_086,
        reasoning_tokens: 0,
    };
    // 21 x 3 + 180,000 x 3.75 + 8,086 x 6 + 393 x 15 = 729,474 micro-USD.
    let got = sonnet.usage_cost(&anthropic_turn, Dialect::Anthropic);
    assert!((got - 0.729_474).abs() < 1e-9, "{got}");
    let reread = Usage {
        input_tokens: 50,
        output_tokens: 100,
        cache_read_input_tokens: 188_086,
        ..Usage::default()
    };
    // 50 x 3 + 188,086 x 0.30 + 100 x 15 = 58,075.8 micro-USD.
    let got = sonnet.usage_cost(&reread, Dialect::Anthropic);
    assert!((got - 0.058_075_8).abs() < 1e-9, "{got}");

    let gpt = Price {
        input_per_mtok: 2.5,
        output_per_mtok: 10.0,
        ..Price::default()
    };
    let openai_turn = Usage {
        input_tokens: 86,
        output_tokens: 300,
        cache_read_input_tokens: 1920,
        reasoning_tokens: 256,
        ..Usage::default()
    };
    // 86 x 2.5 + 1,920 x 1.25 + 300 x 10 = 5,615 micro-USD.
    let got = gpt.usage_cost(&openai_turn, Dialect::Openai);
    assert!((got - 0.005_615).abs() < 1e-9, "{got}");
    let configured = Price {
        cache_read_per_mtok: Some(0.25),
        ..gpt
    };
    // 86 x 2.5 + 1,920 x 0.25 + 300 x 10 = 3,695 micro-USD.
    let got = configured.usage_cost(&openai_turn, Dialect::Openai);
    assert!((got - 0.003_695).abs() < 1e-9, "{got}");

    // Gemini ($1.25 in, $10 out): promptTokenCount 10,000 of which
    // cachedContentTokenCount 8,000; 500 candidates and 1,200 thoughts.
    let gemini = Price {
        input_per_mtok: 1.25,
        output_per_mtok: 10.0,
        ..Price::default()
    };
    let gemini_turn = Usage {
        input_tokens: 2_000,
        output_tokens: 1_700,
        cache_read_input_tokens: 8_000,
        reasoning_tokens: 1_200,
        ..Usage::default()
    };
    // 2,000 x 1.25 + 8,000 x 0.3125 + 1,700 x 10 = 22,000 micro-USD.
    let got = gemini.usage_cost(&gemini_turn, Dialect::Gemini);
    assert!((got - 0.022).abs() < 1e-9, "{got}");
}

/// A reservation holds the most a request may cost: every prompt token at
/// the dearest rate it may be billed at on that wire, plus `max_tokens` of
/// output. Sonnet-class prices on Anthropic ($3 in, $15 out: writes $3.75 /
/// $6), a gpt-4o-class one on OpenAI ($2.50 in, $10 out).
#[test]
fn a_reservation_prices_the_prompt_at_its_dearest_possible_rate() {
    let sonnet = Price {
        input_per_mtok: 3.0,
        output_per_mtok: 15.0,
        ..Price::default()
    };
    let a = Dialect::Anthropic;
    // 10,000 prompt tokens, 1,000 out: unmarked, all at the input price...
    assert!((sonnet.max_cost(a, None, 10_000, 1_000) - 0.045).abs() < 1e-12);
    // ...marked 5m: all may be a 5-minute write; marked 1h: a 1-hour write.
    let five = sonnet.max_cost(a, Some(CacheTtl::FiveMinutes), 10_000, 1_000);
    assert!((five - 0.0525).abs() < 1e-12, "{five}");
    let hour = sonnet.max_cost(a, Some(CacheTtl::OneHour), 10_000, 1_000);
    assert!((hour - 0.075).abs() < 1e-12, "{hour}");
    // A configured read price dearer than input (odd, but configured) counts.
    let odd = Price {
        cache_read_per_mtok: Some(9.0),
        ..sonnet
    };
    assert_eq!(odd.dearest_input_rate(a, Some(CacheTtl::FiveMinutes)), 9.0);
    assert_eq!(odd.dearest_input_rate(a, None), 3.0);
    // OpenAI caches on its own, markers or not: its dearest of input, read and write.
    let gpt = Price {
        input_per_mtok: 2.5,
        output_per_mtok: 10.0,
        cache_write_5m_per_mtok: Some(3.125),
        ..Price::default()
    };
    assert_eq!(gpt.dearest_input_rate(Dialect::Openai, None), 3.125);
    assert_eq!(
        Price {
            cache_write_5m_per_mtok: None,
            ..gpt
        }
        .dearest_input_rate(Dialect::Openai, Some(CacheTtl::OneHour)),
        2.5
    );
}

/// What counts as marked: a breakpoint on a tool, a part or a tool result,
/// or Anthropic's top-level automatic `cache_control` passed through.
#[test]
fn the_longest_marked_ttl_is_found_wherever_it_is() {
    let mut chat = ChatRequest {
        messages: vec![ChatMessage::text("user", "hi")].into(),
        ..ChatRequest::default()
    };
    assert_eq!(chat.longest_cache_ttl(), None);
    std::sync::Arc::make_mut(&mut chat.messages)[0].parts = vec![part(
        PartKind::Text("hi".into()),
        Some(CacheTtl::FiveMinutes),
    )];
    assert_eq!(chat.longest_cache_ttl(), Some(CacheTtl::FiveMinutes));
    std::sync::Arc::make_mut(&mut chat.messages).push(ChatMessage {
        cache: Some(CacheTtl::OneHour),
        tool_call_id: Some("c".into()),
        ..ChatMessage::text("tool", "result")
    });
    assert_eq!(chat.longest_cache_ttl(), Some(CacheTtl::OneHour));
    let automatic = |ttl: Value, dialect| ChatRequest {
        messages: vec![ChatMessage::text("user", "hi")].into(),
        passthrough: Some(Arc::new(Passthrough {
            dialect: Some(dialect),
            fields: Map::from_iter([("cache_control".to_string(), ttl)]),
            ..Passthrough::default()
        })),
        ..ChatRequest::default()
    };
    assert_eq!(
        automatic(json!({"type": "ephemeral"}), Dialect::Anthropic).longest_cache_ttl(),
        Some(CacheTtl::FiveMinutes)
    );
    assert_eq!(
        automatic(
            json!({"type": "ephemeral", "ttl": "1h"}),
            Dialect::Anthropic
        )
        .longest_cache_ttl(),
        Some(CacheTtl::OneHour)
    );
    assert_eq!(
        automatic(json!({"type": "ephemeral"}), Dialect::Openai).longest_cache_ttl(),
        None
    );
}
