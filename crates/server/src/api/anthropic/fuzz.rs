//! Property-based fuzzing of the Anthropic door's request body: `parse`,
//! `to_proto` and `convert::request_spec`, on Messages-shaped JSON trees
//! (content blocks of every kind, tools, tool_choice) with random types, and
//! on mutated or arbitrary bytes. Properties: no panic; a refusal is a 400
//! that names its field and stays short. Cases follow `PROPTEST_CASES`.

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{json, Value};

use super::error::AnthropicError;
use super::request::{parse, to_proto, Use};
use crate::api::convert::request_spec;
use crate::api::errors::MAX_MESSAGE;
use crate::config::LimitsConfig;
use crate::upstream::fuzz::{field, json_value, mutated, object, text};

const KEYS: &[&str] = &[
    "model",
    "messages",
    "role",
    "content",
    "type",
    "text",
    "id",
    "name",
    "input",
    "tool_use_id",
    "input_schema",
    "system",
    "tools",
    "tool_choice",
    "max_tokens",
];

fn string() -> BoxedStrategy<Value> {
    text().prop_map(Value::from).boxed()
}

fn block() -> impl Strategy<Value = Value> {
    let kind = prop_oneof![
        3 => proptest::sample::select(vec!["text", "tool_use", "tool_result", "thinking", "image"])
            .prop_map(Value::from),
        1 => string(),
    ];
    (
        field(kind, KEYS),
        field(string(), KEYS),
        field(string(), KEYS),
        field(prop_oneof![Just(json!({"a": 1})), json_value(KEYS)], KEYS),
        field(string(), KEYS),
        field(
            prop_oneof![string(), Just(json!([{"type": "text", "text": "r"}]))],
            KEYS,
        ),
    )
        .prop_map(|(kind, text, id, input, tool_use_id, content)| {
            object(vec![
                ("type", kind),
                ("text", text.clone()),
                ("id", id.clone()),
                ("name", id),
                ("input", input),
                ("tool_use_id", tool_use_id),
                ("content", content),
            ])
        })
}

fn message() -> impl Strategy<Value = Value> {
    let role = prop_oneof![
        4 => proptest::sample::select(vec!["user", "assistant"]).prop_map(Value::from),
        1 => string(),
    ];
    (
        field(role, KEYS),
        field(
            prop_oneof![string(), vec(block(), 0..4).prop_map(Value::Array)],
            KEYS,
        ),
    )
        .prop_map(|(role, content)| object(vec![("role", role), ("content", content)]))
}

fn body() -> impl Strategy<Value = Value> {
    let tool = (
        field(
            prop_oneof!["[a-z_]{1,8}".prop_map(Value::from), string()],
            KEYS,
        ),
        field(
            prop_oneof![Just(json!({"type": "object"})), json_value(KEYS)],
            KEYS,
        ),
        field(
            prop_oneof![Just(json!("custom")), Just(json!("bash_20250124"))],
            KEYS,
        ),
    )
        .prop_map(|(name, schema, kind)| {
            object(vec![
                ("name", name),
                ("input_schema", schema),
                ("type", kind),
            ])
        });
    let choice = prop_oneof![
        Just(json!({"type": "auto"})),
        Just(json!({"type": "any"})),
        Just(json!({"type": "none"})),
        "[a-z_]{1,8}".prop_map(|n| json!({"type": "tool", "name": n})),
        json_value(KEYS),
    ];
    (
        field(prop_oneof![Just(json!("chat")), string()], KEYS),
        field((0u32..300).prop_map(Value::from), KEYS),
        field(vec(message(), 0..4).prop_map(Value::Array), KEYS),
        field(
            prop_oneof![string(), vec(block(), 0..2).prop_map(Value::Array)],
            KEYS,
        ),
        field(vec(tool, 0..3).prop_map(Value::Array), KEYS),
        field(choice, KEYS),
        field(any::<bool>().prop_map(Value::from), KEYS),
        field((0.0f64..1.5).prop_map(Value::from), KEYS),
    )
        .prop_map(
            |(model, max_tokens, messages, system, tools, choice, stream, temperature)| {
                object(vec![
                    ("model", model),
                    ("max_tokens", max_tokens),
                    ("messages", messages),
                    ("system", system),
                    ("tools", tools),
                    ("tool_choice", choice),
                    ("stream", stream),
                    ("temperature", temperature),
                ])
            },
        )
}

/// The door's whole path from bytes to a routable spec; the refusal if any.
fn intake(bytes: &[u8]) -> Result<(), AnthropicError> {
    let parsed = to_proto(parse(bytes)?, Use::Messages)?;
    request_spec(
        parsed.request,
        "fuzz".into(),
        None,
        &LimitsConfig::default(),
    )
    .map(drop)
    .map_err(|e| AnthropicError::from_request(&e))
}

fn check(bytes: &[u8]) -> Result<(), TestCaseError> {
    let Err(e) = intake(bytes) else {
        return Ok(());
    };
    prop_assert_eq!(e.status, http::StatusCode::BAD_REQUEST, "{}", e.message);
    prop_assert_eq!(e.kind, "invalid_request_error");
    // `field: why`, or a body that is not JSON at all.
    prop_assert!(
        e.message.contains(": ") || e.message.starts_with("invalid JSON body"),
        "{}",
        e.message
    );
    prop_assert!(
        e.message.len() <= MAX_MESSAGE,
        "{} bytes of message",
        e.message.len()
    );
    Ok(())
}

proptest! {
    #[test]
    fn fuzz_anthropic_request_json_trees(body in body()) {
        check(&serde_json::to_vec(&body).unwrap_or_default())?;
    }

    #[test]
    fn fuzz_anthropic_request_mutated_bytes(
        bytes in prop_oneof![
            3 => body().prop_map(|b| serde_json::to_vec(&b).unwrap_or_default()).prop_flat_map(mutated),
            1 => vec(any::<u8>(), 0..256),
        ],
    ) {
        check(&bytes)?;
    }
}
