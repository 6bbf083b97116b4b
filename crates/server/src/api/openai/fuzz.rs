//! Property-based fuzzing of the OpenAI door's request body: `parse`,
//! `to_proto` and `convert::request_spec`, on JSON trees with the real
//! top-level keys and random types, and on mutated or arbitrary bytes.
//! Properties: no panic; a refusal names the parameter and stays short.
//! Cases follow `PROPTEST_CASES` (long mode: `--release` with 100000).

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{json, Value};

use super::error::OpenAiError;
use super::request::{in_message, parse, read, to_proto, ChatBody, Content, InMessage};
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
    "tool_calls",
    "id",
    "function",
    "name",
    "arguments",
    "tool_call_id",
    "description",
    "parameters",
    "include_usage",
    "image_url",
    "url",
    "detail",
    "file",
    "file_data",
    "file_id",
    "filename",
    "cache_control",
    "ttl",
    "json_schema",
    "schema",
    "strict",
    "reasoning_effort",
];

/// Mostly short text, sometimes far longer than any error should echo.
fn name() -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => text(),
        1 => (MAX_MESSAGE..4 * MAX_MESSAGE).prop_map(|n| "é".repeat(n / 2)),
    ]
    .prop_map(Value::from)
}

fn role() -> impl Strategy<Value = Value> {
    prop_oneof![
        4 => proptest::sample::select(vec!["system", "developer", "user", "assistant", "tool"]),
        1 => Just("robot"),
    ]
    .prop_map(Value::from)
    .boxed()
    .prop_union(name().boxed())
}

fn content() -> impl Strategy<Value = Value> {
    let part = (
        field(
            prop_oneof![
                Just(json!("text")),
                Just(json!("image_url")),
                Just(json!("file")),
                Just(json!("input_audio")),
                Just(json!("refusal")),
                name()
            ],
            KEYS,
        ),
        field(text().prop_map(Value::from), KEYS),
        prop_oneof![
            3 => Just(None),
            1 => field(
                prop_oneof![
                    Just(json!({"url": "data:image/png;base64,iVBORw0KGgo="})),
                    Just(json!({"url": "https://example.com/a.png", "detail": "low"})),
                    Just(json!("https://example.com/a.png")),
                    json_value(KEYS)
                ],
                KEYS
            ),
        ],
        prop_oneof![
            3 => Just(None),
            1 => field(
                prop_oneof![
                    Just(json!({"file_data": "data:application/pdf;base64,JVBERi0xLjQ=", "filename": "a.pdf"})),
                    Just(json!({"file_id": "file-1"})),
                    json_value(KEYS)
                ],
                KEYS
            ),
        ],
    )
        .prop_map(|(kind, text, image_url, file)| {
            object(vec![
                ("type", kind),
                ("text", text),
                ("image_url", image_url),
                ("file", file),
            ])
        });
    prop_oneof![
        3 => text().prop_map(Value::from),
        1 => vec(part, 0..3).prop_map(Value::Array),
        1 => Just(Value::Null),
    ]
}

fn tool_call() -> impl Strategy<Value = Value> {
    let function = (
        field(text().prop_map(Value::from), KEYS),
        field(text().prop_map(Value::from), KEYS),
    )
        .prop_map(|(name, arguments)| object(vec![("name", name), ("arguments", arguments)]));
    (
        field(text().prop_map(Value::from), KEYS),
        field(function, KEYS),
    )
        .prop_map(|(id, function)| object(vec![("id", id), ("function", function)]))
}

fn message() -> impl Strategy<Value = Value> {
    (
        field(role(), KEYS),
        field(content(), KEYS),
        prop_oneof![3 => Just(None), 1 => field(vec(tool_call(), 0..3).prop_map(Value::Array), KEYS)],
        prop_oneof![3 => Just(None), 1 => field(text().prop_map(Value::from), KEYS)],
    )
        .prop_map(|(role, content, calls, id)| {
            object(vec![
                ("role", role),
                ("content", content),
                ("tool_calls", calls),
                ("tool_call_id", id),
            ])
        })
}

fn tool() -> impl Strategy<Value = Value> {
    let function = (
        field(
            prop_oneof!["[a-z_]{1,8}".prop_map(Value::from), name()],
            KEYS,
        ),
        field(text().prop_map(Value::from), KEYS),
        field(
            prop_oneof![Just(json!({"type": "object"})), json_value(KEYS)],
            KEYS,
        ),
    )
        .prop_map(|(name, description, parameters)| {
            object(vec![
                ("name", name),
                ("description", description),
                ("parameters", parameters),
            ])
        });
    (
        field(
            prop_oneof![Just(json!("function")), Just(json!("retrieval")), name()],
            KEYS,
        ),
        field(function, KEYS),
    )
        .prop_map(|(kind, function)| object(vec![("type", kind), ("function", function)]))
}

/// A number where the body wants one: mostly `typical`, else at the edges or absurd.
fn number<S: Strategy<Value = Value> + 'static>(typical: S) -> BoxedStrategy<Option<Value>> {
    let wild = prop_oneof![
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(Value::from),
        Just(json!(1e39)),
    ];
    prop_oneof![
        4 => Just(None),
        4 => typical.prop_map(Some),
        1 => field(wild, KEYS),
    ]
    .boxed()
}

fn tokens() -> BoxedStrategy<Option<Value>> {
    number((1u32..300).prop_map(Value::from))
}

fn fraction() -> BoxedStrategy<Option<Value>> {
    number((0.05f64..1.0).prop_map(Value::from))
}

/// A body with ChatBody's keys, each realistic, random or absent, plus a stray key.
fn body() -> impl Strategy<Value = Value> {
    let head = (
        field(
            prop_oneof![Just(json!("chat")), Just(json!("primary/m")), name()],
            KEYS,
        ),
        field(vec(message(), 0..4).prop_map(Value::Array), KEYS),
        tokens(),
        tokens(),
        fraction(),
        fraction(),
        field(
            prop_oneof![
                text().prop_map(Value::from),
                vec(text(), 0..3).prop_map(|v| json!(v))
            ],
            KEYS,
        ),
    );
    let tail = (
        field(vec(tool(), 0..3).prop_map(Value::Array), KEYS),
        field(
            prop_oneof![Just(json!("auto")), Just(json!("none")), name()],
            KEYS,
        ),
        field(
            prop_oneof![
                Just(json!({"type": "text"})),
                Just(json!({"type": "json_object"})),
                Just(json!({"type": "json_schema"})),
                Just(
                    json!({"type": "json_schema", "json_schema": {"name": "p", "schema": {"type": "object"}, "strict": true}})
                ),
                json_value(KEYS)
                    .prop_map(|s| json!({"type": "json_schema", "json_schema": {"schema": s}})),
                name().prop_map(|k| json!({ "type": k }))
            ],
            KEYS,
        ),
        field(any::<bool>().prop_map(Value::from), KEYS),
        field(
            any::<bool>().prop_map(|b| json!({ "include_usage": b })),
            KEYS,
        ),
        number(Just(json!(1))),
        prop_oneof![3 => Just(None), 1 => field(json_value(KEYS), KEYS)],
    );
    (head, tail).prop_map(
        |(
            (model, messages, max_tokens, max_completion, temperature, top_p, stop),
            (tools, tool_choice, response_format, stream, stream_options, n, stray),
        )| {
            object(vec![
                ("model", model),
                ("messages", messages),
                ("max_tokens", max_tokens),
                ("max_completion_tokens", max_completion),
                ("temperature", temperature),
                ("top_p", top_p),
                ("stop", stop),
                ("tools", tools),
                ("tool_choice", tool_choice),
                ("response_format", response_format),
                ("stream", stream),
                ("stream_options", stream_options),
                ("n", n),
                ("user", stray),
            ])
        },
    )
}

/// Every top-level field the door models, each a candidate for a random value.
const TOP_KEYS: &[&str] = &super::request::MODELLED;

/// A valid body, with at most one top-level value replaced by any JSON.
fn valid_body() -> impl Strategy<Value = Value> {
    let message = (
        proptest::sample::select(vec!["system", "developer", "user", "assistant"]),
        "[a-z ]{1,20}",
    )
        .prop_map(|(role, content)| json!({"role": role, "content": content}));
    let tool = "[a-z_]{1,8}".prop_map(|name| {
        json!({"type": "function", "function": {"name": name, "parameters": {"type": "object"}}})
    });
    (
        "[a-z]{1,8}",
        vec(message, 1..4),
        1u32..300,
        0.0f64..2.0,
        vec(tool, 0..3),
        any::<bool>(),
        proptest::option::of((proptest::sample::select(TOP_KEYS), json_value(KEYS))),
    )
        .prop_map(
            |(model, messages, max_tokens, temperature, tools, stream, edit)| {
                let mut body = json!({
                    "model": model, "messages": messages, "max_tokens": max_tokens,
                    "temperature": temperature, "tools": tools, "stream": stream,
                });
                if let Some((key, value)) = edit {
                    body[key] = value;
                }
                body
            },
        )
}

/// The door's whole path from bytes to a routable spec; the refusal if any.
fn intake(bytes: &[u8]) -> Result<(), OpenAiError> {
    let parsed = to_proto(parse(bytes)?)?;
    request_spec(
        parsed.request,
        "fuzz".into(),
        None,
        &LimitsConfig::default(),
    )
    .map(drop)
    .map_err(|e| OpenAiError::from_request(&e))
}

/// A refusal names a parameter (unless the bytes are not JSON at all) and
/// does not echo the caller's input at length.
fn check(bytes: &[u8], json_object: bool) -> Result<(), TestCaseError> {
    let Err(e) = intake(bytes) else {
        return Ok(());
    };
    prop_assert_eq!(e.status, http::StatusCode::BAD_REQUEST, "{}", e.message);
    let named = e.param.as_deref().is_some_and(|p| !p.is_empty());
    if json_object {
        prop_assert!(named, "no parameter named: {}", e.message);
    } else {
        prop_assert!(
            named || e.message.starts_with("invalid JSON body"),
            "{}",
            e.message
        );
    }
    prop_assert!(
        e.message.len() <= MAX_MESSAGE,
        "{} bytes of message",
        e.message.len()
    );
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { ..ProptestConfig::default() })]

    #[test]
    fn fuzz_openai_request_json_trees(body in prop_oneof![valid_body(), body()]) {
        let bytes = serde_json::to_vec(&body).unwrap_or_default();
        check(&bytes, true)?;
    }

    /// The top level read by name (`parse`) decides every body as reading
    /// it into a JSON map and taking each modelled field out did.
    #[test]
    fn fuzz_openai_top_level_by_name_agrees_with_a_map(
        bytes in prop_oneof![
            3 => prop_oneof![valid_body(), body()]
                .prop_map(|b| serde_json::to_vec(&b).unwrap_or_default()),
            2 => prop_oneof![valid_body(), body()]
                .prop_map(|b| serde_json::to_vec(&b).unwrap_or_default())
                .prop_flat_map(mutated),
            1 => vec(any::<u8>(), 0..64),
        ],
    ) {
        prop_assert_eq!(decided(parse(&bytes)), decided(parse_by_map(&bytes)));
    }

    #[test]
    fn fuzz_openai_request_mutated_bytes(
        bytes in prop_oneof![
            3 => prop_oneof![valid_body(), body()]
                .prop_map(|b| serde_json::to_vec(&b).unwrap_or_default())
                .prop_flat_map(mutated),
            1 => vec(any::<u8>(), 0..256),
        ],
    ) {
        check(&bytes, false)?;
    }
}

/// What the door makes of a body, comparable: the request, its stream
/// flags, or the refusal's message and parameter.
fn decided(
    body: Result<ChatBody, OpenAiError>,
) -> Result<(String, bool, bool), (String, Option<String>)> {
    body.and_then(to_proto)
        .map(|p| (format!("{:?}", p.request), p.stream, p.include_usage))
        .map_err(|e| (e.message, e.param))
}

/// The top level as the door read it before `parse` matched names: into
/// a JSON map, each modelled field then taken out in order.
fn parse_by_map(body: &[u8]) -> Result<ChatBody, OpenAiError> {
    use serde_json::Map;
    let mut map: Map<String, Value> = crate::api::door::read_json(body).map_err(|e| {
        let path = e.path().to_string();
        let param = (path != ".").then_some(path);
        OpenAiError::invalid(format!("invalid JSON body: {}", e.inner()), param)
    })?;
    fn take<T: serde::de::DeserializeOwned>(
        map: &mut Map<String, Value>,
        key: &str,
    ) -> Result<Option<T>, OpenAiError> {
        match map.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => read(v, key).map(Some),
        }
    }
    fn take_values(
        map: &mut Map<String, Value>,
        key: &str,
    ) -> Result<Option<Vec<Value>>, OpenAiError> {
        match map.remove(key) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Array(items)) => Ok(Some(items)),
            Some(v) => read(v, key).map(Some),
        }
    }
    Ok(ChatBody {
        model: take(&mut map, "model")?,
        messages: take_values(&mut map, "messages")?,
        max_tokens: take(&mut map, "max_tokens")?,
        max_completion_tokens: take(&mut map, "max_completion_tokens")?,
        temperature: take(&mut map, "temperature")?,
        top_p: take(&mut map, "top_p")?,
        stop: take(&mut map, "stop")?,
        tools: take_values(&mut map, "tools")?,
        tool_choice: map.remove("tool_choice").filter(|v| !v.is_null()),
        response_format: take(&mut map, "response_format")?,
        reasoning_effort: take(&mut map, "reasoning_effort")?,
        stream: take(&mut map, "stream")?,
        stream_options: take(&mut map, "stream_options")?,
        n: take(&mut map, "n")?,
        rest: map,
    })
}

#[test]
fn the_top_level_by_name_keeps_a_repeated_fields_last_value_and_refuses_what_a_map_refuses() {
    for body in [
        &br#"{"model":"a","model":"chat","messages":[{"role":"user","content":"hi"}],"seed":1,"seed":2}"#[..],
        br#"[1,2]"#,
        br#"null"#,
        br#""text""#,
        br#"{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":"x"}"#,
        br#"{"model":"chat","messages":[{"role":"user","content":"hi"}],"max_tokens":-1}"#,
        br#"{"model":"chat","mess\u0061ges":[{"role":"user","content":"hi"}],"x\u0079":1}"#,
        br#"{"model":"chat","messages":[{"role":"user","content":"hi"}],"a":"#,
    ] {
        assert_eq!(decided(parse(body)), decided(parse_by_map(body)), "{}", String::from_utf8_lossy(body));
    }
    let request = decided(parse(
        br#"{"model":"a","model":"chat","messages":[{"role":"user","content":"hi"}],"seed":1,"seed":2}"#,
    ))
    .map(|(request, _, _)| request)
    .unwrap_or_default();
    assert!(request.contains(r#"route: "chat""#), "{request}");
    assert!(request.contains(r#"{\"seed\":2}"#), "{request}");
}

/// A message as both readings of it can be compared: its fields, or the
/// refusal's message and parameter.
type Reading = Result<
    (
        String,
        Option<Value>,
        Option<Vec<[String; 3]>>,
        Option<String>,
    ),
    (String, Option<String>),
>;

fn reading(m: Result<InMessage, OpenAiError>) -> Reading {
    m.map(|m| {
        let content = m.content.map(|c| match c {
            Content::Text(t) => Value::from(t),
            Content::Parts(p) => Value::Array(p),
        });
        let calls = m.tool_calls.map(|calls| {
            calls
                .into_iter()
                .map(|c| [c.id, c.function.name, c.function.arguments])
                .collect()
        });
        (m.role, content, calls, m.tool_call_id)
    })
    .map_err(|e| (e.message, e.param))
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 1024, ..ProptestConfig::default() })]

    /// A message's fields moved out in the common shape are what serde
    /// reads, and any other shape is refused with serde's words.
    #[test]
    fn fuzz_openai_message_moved_out_agrees_with_serde(
        m in prop_oneof![3 => message(), 1 => json_value(KEYS)],
    ) {
        let Value::Object(o) = m else { return Ok(()) };
        let moved = reading(in_message(o.clone(), 2));
        let read_by_serde = reading(read(Value::Object(o), "messages[2]"));
        prop_assert_eq!(moved, read_by_serde);
    }
}
