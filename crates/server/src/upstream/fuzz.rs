//! Property-based fuzzing of the parsers that meet provider bytes: the SSE
//! parser, both stream decoders and the non-streamed OpenAI body. Properties:
//! no panic, memory bounded by the limits or the input, and one result under
//! every chunking of the same bytes. Cases follow `PROPTEST_CASES`; the long
//! mode is `PROPTEST_CASES=100000 cargo test --release fuzz_`.

use proptest::collection::{btree_map, vec};
use proptest::prelude::*;
use serde_json::{json, Map, Value};

use super::anthropic::AnthropicDecoder;
use super::openai::{decode_non_streaming, OpenAiDecoder};
use super::sse::transcript::{chunkings, run, Run};
use super::sse::{SseEvent, SseParser, TooLarge, MAX_EVENT_BYTES, MAX_LINE_BYTES};
use super::{Chunk, StreamDecoder};

// ---- shared strategies ----------------------------------------------------

/// Splits `bytes` at `cuts` (taken modulo the length, in order).
pub(crate) fn cut<'a>(bytes: &'a [u8], cuts: &[usize]) -> Vec<&'a [u8]> {
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (bytes.len() + 1)).collect();
    points.sort_unstable();
    let mut pieces = Vec::with_capacity(points.len() + 1);
    let mut start = 0;
    for p in points {
        pieces.push(&bytes[start..p]);
        start = p;
    }
    pieces.push(&bytes[start..]);
    pieces
}

/// Up to 16 cut points.
pub(crate) fn cuts() -> impl Strategy<Value = Vec<usize>> {
    vec(any::<usize>(), 0..16)
}

/// Short strings: mostly plain, sometimes any Unicode (controls, quotes, NUL).
pub(crate) fn text() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => "[a-z ]{0,8}",
        1 => any::<String>(),
        1 => Just(String::new()),
    ]
}

/// A JSON number of any shape: small, huge, negative, fractional, exponent form.
fn number() -> impl Strategy<Value = Value> {
    prop_oneof![
        (0u64..8).prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| json!(f)),
        Just(json!(u64::from(u32::MAX) + 1)),
        Just(json!(1e300)),
        Just(json!(-0.5)),
    ]
}

/// Any JSON value, a few levels deep; object keys are drawn from `keys` or random.
pub(crate) fn json_value(keys: &'static [&'static str]) -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        number(),
        text().prop_map(Value::from),
    ];
    leaf.prop_recursive(3, 24, 5, move |inner| {
        let key =
            prop_oneof![3 => proptest::sample::select(keys).prop_map(str::to_owned), 1 => text()];
        prop_oneof![
            vec(inner.clone(), 0..5).prop_map(Value::Array),
            btree_map(key, inner, 0..5).prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

/// Mostly the realistic value, sometimes any JSON, sometimes absent (`None`).
pub(crate) fn field<S>(realistic: S, keys: &'static [&'static str]) -> BoxedStrategy<Option<Value>>
where
    S: Strategy<Value = Value> + 'static,
{
    prop_oneof![
        6 => realistic.prop_map(Some),
        1 => json_value(keys).prop_map(Some),
        1 => Just(None),
    ]
    .boxed()
}

/// An object from optional fields; absent ones are left out.
pub(crate) fn object(fields: Vec<(&'static str, Option<Value>)>) -> Value {
    let map: Map<String, Value> = fields
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| (k.to_owned(), v)))
        .collect();
    Value::Object(map)
}

/// `bytes` with a few mutations: a cut tail, flipped bytes, inserted junk.
pub(crate) fn mutated(bytes: Vec<u8>) -> impl Strategy<Value = Vec<u8>> {
    let len = bytes.len();
    let edit = (any::<usize>(), any::<u8>(), 0u8..3);
    (vec(edit, 0..4), proptest::option::of(0..=len)).prop_map(move |(edits, truncate)| {
        let mut b = bytes.clone();
        for (at, byte, kind) in edits {
            let at = at % (b.len() + 1);
            match kind {
                0 if at < b.len() => b[at] = byte,
                1 => b.insert(at, byte),
                _ if at < b.len() => {
                    b.remove(at);
                }
                _ => {}
            }
        }
        if let Some(n) = truncate {
            b.truncate(n);
        }
        b
    })
}

// ---- SSE ------------------------------------------------------------------

/// Byte strings biased towards SSE syntax: fields, every line ending, BOMs
/// (whole and split), invalid UTF-8, runs long enough to pass small limits.
fn sse_bytes() -> impl Strategy<Value = Vec<u8>> {
    let token = prop_oneof![
        proptest::sample::select(vec![
            &b"data:"[..],
            b"data: ",
            b"data",
            b"event: e",
            b"event:",
            b"id: 1",
            b"id: \0",
            b"retry: 12",
            b"retry: 99999999999999999999999",
            b"error: {}",
            b":",
            b": keep-alive",
            b" ",
            b"\r",
            b"\n",
            b"\r\n",
            b"\n\n",
            b"\xef\xbb\xbf",
            b"\xef\xbb",
            b"\xff",
            b"\xc3",
            "é".as_bytes(),
        ])
        .prop_map(<[u8]>::to_vec),
        vec(any::<u8>(), 0..6),
        (1usize..300).prop_map(|n| vec![b'x'; n]),
    ];
    prop_oneof![
        4 => vec(token, 0..48).prop_map(|v| v.concat()),
        1 => vec(any::<u8>(), 0..512),
    ]
}

/// Small bounds, so the size errors are reached; sometimes the defaults.
fn limits() -> impl Strategy<Value = (usize, usize)> {
    prop_oneof![
        4 => (0usize..96, 0usize..384),
        1 => Just((MAX_LINE_BYTES, MAX_EVENT_BYTES)),
    ]
}

/// Everything one chunking produced: events, then the first error if any.
/// Checks the memory bounds after every feed.
fn parse(
    pieces: &[&[u8]],
    (max_line, max_event): (usize, usize),
) -> (Vec<SseEvent>, Option<TooLarge>) {
    let mut p = SseParser::with_limits(max_line, max_event);
    let mut out = Vec::new();
    let mut end = None;
    for piece in pieces {
        let fed = p.feed(piece, &mut out);
        assert!(
            p.held() <= max_line,
            "held {} > max_line {max_line}",
            p.held()
        );
        if let Err(e) = fed {
            end = Some(e);
            break;
        }
    }
    if end.is_none() {
        end = p.finish(&mut out).err();
    }
    for ev in &out {
        // Lossy UTF-8 turns one invalid byte into three: the one slack allowed.
        let size = ev.data.len()
            + ev.event.as_ref().map_or(0, String::len)
            + ev.id.as_ref().map_or(0, String::len)
            + ev.error.as_ref().map_or(0, String::len);
        assert!(
            size <= 3 * max_event,
            "event of {size} bytes, max_event {max_event}"
        );
    }
    (out, end)
}

proptest! {
    #![proptest_config(ProptestConfig { ..ProptestConfig::default() })]

    /// Any bytes under any limits: the same events and the same error (or
    /// none) whole, byte by byte and cut anywhere.
    #[test]
    fn fuzz_sse_any_chunking_same_events_and_error(
        bytes in sse_bytes(),
        limits in limits(),
        cuts in cuts(),
    ) {
        let whole = parse(&[&bytes], limits);
        prop_assert_eq!(&parse(&cut(&bytes, &cuts), limits), &whole);
        let singles: Vec<&[u8]> = bytes.chunks(1).collect();
        prop_assert_eq!(&parse(&singles, limits), &whole);
    }

    /// A line or an event far past its bound, delivered in a few pieces, is
    /// refused at the same place however it is cut, holding at most the bound.
    #[test]
    fn fuzz_sse_huge_lines_stop_at_their_bound(
        lines in vec((0usize..12_000, prop_oneof![Just("\n"), Just("\r\n"), Just("\r"), Just("")]), 1..6),
        cuts in cuts(),
    ) {
        let bytes: Vec<u8> = lines
            .iter()
            .flat_map(|(n, end)| {
                let mut line = b"data:".to_vec();
                line.resize(5 + n, b'y');
                line.extend_from_slice(end.as_bytes());
                line
            })
            .collect();
        let limits = (4096, 16_384);
        let whole = parse(&[&bytes], limits);
        prop_assert_eq!(parse(&cut(&bytes, &cuts), limits), whole);
    }
}

// ---- stream decoders --------------------------------------------------------

/// One SSE frame of a mutated stream.
#[derive(Debug, Clone)]
enum Frame {
    /// `event:` (optional) and a JSON `data:` line, cut short after `truncate` bytes.
    Json {
        event: Option<String>,
        value: Value,
        truncate: Option<usize>,
    },
    /// `data: [DONE]`.
    Done,
    /// A non-standard `error:` field.
    ErrorField(String),
    /// Raw text: comments, junk, missing blank lines.
    Raw(String),
}

impl Frame {
    fn render(&self, out: &mut String) {
        match self {
            Frame::Json {
                event,
                value,
                truncate,
            } => {
                if let Some(e) = event {
                    out.push_str(&format!("event: {e}\n"));
                }
                let mut data = value.to_string();
                if let Some(n) = truncate {
                    let mut n = n % (data.len() + 1);
                    while !data.is_char_boundary(n) {
                        n -= 1;
                    }
                    data.truncate(n);
                }
                out.push_str(&format!("data: {data}\n\n"));
            }
            Frame::Done => out.push_str("data: [DONE]\n\n"),
            Frame::ErrorField(e) => out.push_str(&format!("error: {e}\n\n")),
            Frame::Raw(r) => out.push_str(r),
        }
    }
}

fn raw_frame() -> impl Strategy<Value = Frame> {
    prop_oneof![
        Just(": keep-alive\n\n".to_owned()),
        Just("\n".to_owned()),
        Just("data: \n\n".to_owned()),
        Just("data: {\"a\":\n".to_owned()),
        text(),
    ]
    .prop_map(Frame::Raw)
}

/// A JSON frame, truncated one time in ten.
fn json_frame(
    event: impl Strategy<Value = Option<String>>,
    value: impl Strategy<Value = Value>,
) -> impl Strategy<Value = Frame> {
    let truncate = prop_oneof![9 => Just(None), 1 => any::<usize>().prop_map(Some)];
    (event, value, truncate).prop_map(|(event, value, truncate)| Frame::Json {
        event,
        value,
        truncate,
    })
}

const OPENAI_KEYS: &[&str] = &[
    "choices",
    "delta",
    "index",
    "content",
    "refusal",
    "tool_calls",
    "function",
    "function_call",
    "name",
    "arguments",
    "id",
    "finish_reason",
    "usage",
    "prompt_tokens",
    "completion_tokens",
    "error",
    "object",
    "message",
    "type",
    "code",
];

fn index() -> impl Strategy<Value = Value> {
    prop_oneof![8 => (0u64..3).prop_map(Value::from), 1 => number()]
}

fn finish_reason() -> impl Strategy<Value = Value> {
    let known = proptest::sample::select(vec![
        "stop",
        "length",
        "tool_calls",
        "function_call",
        "content_filter",
        "error",
        "abort",
        "",
    ]);
    prop_oneof![
        2 => Just(Value::Null),
        2 => known.prop_map(Value::from),
        1 => text().prop_map(Value::from),
    ]
}

/// JSON fragments that concatenate into valid, truncated or broken arguments.
fn json_fragment() -> impl Strategy<Value = Value> {
    prop_oneof![
        proptest::sample::select(vec![
            "{",
            "}",
            "{}",
            "{\"city\":",
            "\"Paris\"",
            "1e15",
            "[",
            "",
            "\\u00"
        ])
        .prop_map(Value::from),
        text().prop_map(Value::from),
    ]
}

fn openai_tool_call() -> impl Strategy<Value = Value> {
    let function = (
        field(text().prop_map(Value::from), OPENAI_KEYS),
        field(json_fragment(), OPENAI_KEYS),
    )
        .prop_map(|(name, arguments)| object(vec![("name", name), ("arguments", arguments)]));
    (
        field(index(), OPENAI_KEYS),
        field(text().prop_map(Value::from), OPENAI_KEYS),
        field(function, OPENAI_KEYS),
    )
        .prop_map(|(index, id, function)| {
            object(vec![("index", index), ("id", id), ("function", function)])
        })
}

fn openai_chunk() -> impl Strategy<Value = Value> {
    let delta = (
        field(text().prop_map(Value::from), OPENAI_KEYS),
        prop_oneof![6 => Just(None), 1 => field(text().prop_map(Value::from), OPENAI_KEYS)],
        field(
            vec(openai_tool_call(), 0..3).prop_map(Value::Array),
            OPENAI_KEYS,
        ),
    )
        .prop_map(|(content, refusal, tool_calls)| {
            object(vec![
                ("content", content),
                ("refusal", refusal),
                ("tool_calls", tool_calls),
            ])
        });
    let choice = (
        field(index(), OPENAI_KEYS),
        field(delta, OPENAI_KEYS),
        field(finish_reason(), OPENAI_KEYS),
    )
        .prop_map(|(index, delta, finish)| {
            object(vec![
                ("index", index),
                ("delta", delta),
                ("finish_reason", finish),
            ])
        });
    let usage = usage();
    let error = json!({"error": {"message": "x", "type": "server_error"}});
    (
        field(vec(choice, 0..3).prop_map(Value::Array), OPENAI_KEYS),
        prop_oneof![4 => Just(None), 1 => field(usage, OPENAI_KEYS)],
        prop_oneof![12 => Just(None), 1 => Just(Some(error))],
    )
        .prop_map(|(choices, usage, error)| match error {
            Some(e) => e,
            None => object(vec![("choices", choices), ("usage", usage)]),
        })
}

/// Keys of an OpenAI (or Responses-style) `usage` object.
const USAGE_KEYS: &[&str] = &[
    "prompt_tokens",
    "input_tokens",
    "completion_tokens",
    "output_tokens",
    "prompt_tokens_details",
    "input_tokens_details",
    "completion_tokens_details",
    "output_tokens_details",
    "cached_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
];

/// A `usage` object: counts of any number shape under either spelling,
/// details that may be any value, and stray keys.
fn usage() -> impl Strategy<Value = Value> {
    let details = (
        field(number(), USAGE_KEYS),
        field(number(), USAGE_KEYS),
        field(number(), USAGE_KEYS),
    )
        .prop_map(|(c, w, r)| {
            object(vec![
                ("cached_tokens", c),
                ("cache_write_tokens", w),
                ("reasoning_tokens", r),
            ])
        });
    let count = || prop_oneof![Just(None), field(number(), USAGE_KEYS)];
    let detail = move || prop_oneof![Just(None), field(details.clone(), USAGE_KEYS)];
    (
        (count(), count(), count(), count()),
        (detail(), detail(), detail(), detail()),
        field(number(), USAGE_KEYS),
    )
        .prop_map(|((p, i, c, o), (pd, id, cd, od), total)| {
            object(vec![
                ("prompt_tokens", p),
                ("input_tokens", i),
                ("completion_tokens", c),
                ("output_tokens", o),
                ("prompt_tokens_details", pd),
                ("input_tokens_details", id),
                ("completion_tokens_details", cd),
                ("output_tokens_details", od),
                ("total_tokens", total),
            ])
        })
}

/// What a realistic stream says, before framing: text, or one whole tool
/// call whose arguments arrive split at `cuts`.
#[derive(Debug, Clone)]
enum Say {
    Text(String),
    Tool {
        id: String,
        name: String,
        args: Value,
        cuts: Vec<usize>,
    },
}

fn say() -> impl Strategy<Value = Say> {
    prop_oneof![
        3 => text().prop_map(Say::Text),
        1 => (text(), "[a-z_]{1,8}", json_value(OPENAI_KEYS), vec(any::<usize>(), 0..4))
            .prop_map(|(id, name, args, cuts)| Say::Tool { id, name, args, cuts }),
    ]
}

/// The argument text of a tool call, split where `cuts` says.
fn fragments(args: &Value, cuts: &[usize]) -> Vec<String> {
    let text = args.to_string();
    let mut points: Vec<usize> = cuts.iter().map(|c| c % (text.len() + 1)).collect();
    points.retain(|&p| text.is_char_boundary(p));
    points.sort_unstable();
    points.push(text.len());
    let mut start = 0;
    points
        .into_iter()
        .map(|p| {
            let piece = text[start..p].to_owned();
            start = p;
            piece
        })
        .collect()
}

fn data(value: Value) -> Frame {
    Frame::Json {
        event: None,
        value,
        truncate: None,
    }
}

/// Streams in the common shape the decoder reads without a `Value` tree:
/// text and refusal deltas, finish reasons, usage and the service tier.
fn common_shape_stream() -> impl Strategy<Value = Vec<u8>> {
    let tier = proptest::sample::select(vec!["default", "flex", "", "a b"]);
    let chunk = (
        proptest::option::of(text()),
        proptest::option::weighted(0.2, text()),
        finish_reason(),
        proptest::option::weighted(0.3, usage()),
        proptest::option::of(tier),
    )
        .prop_map(|(content, refusal, finish, usage, tier)| {
            let mut delta = Map::new();
            if let Some(c) = content {
                delta.insert("content".into(), c.into());
            }
            if let Some(r) = refusal {
                delta.insert("refusal".into(), r.into());
            }
            let mut v = json!({
                "object": "chat.completion.chunk",
                "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
            });
            if let Some(u) = usage {
                v["usage"] = u;
            }
            if let Some(t) = tier {
                v["service_tier"] = t.into();
            }
            data(v)
        });
    (vec(chunk, 0..6), any::<bool>()).prop_map(|(frames, done)| {
        let mut out = String::new();
        for f in &frames {
            f.render(&mut out);
        }
        if done {
            Frame::Done.render(&mut out);
        }
        out.into_bytes()
    })
}

/// Non-streamed `chat.completion` bodies around the common shape the
/// decoder reads in place: text, refusal and reasoning in the message (any
/// of them sometimes `null`, empty, or another type), sometimes tool calls,
/// a `null` or missing message, an `error`, duplicate keys; then mutated.
fn common_shape_whole() -> impl Strategy<Value = Vec<u8>> {
    let say = || {
        prop_oneof![
            6 => text().prop_map(Value::from),
            1 => Just(Value::Null),
            1 => json_value(OPENAI_KEYS),
        ]
    };
    let sometimes = move || prop_oneof![2 => Just(None), 1 => field(say(), OPENAI_KEYS)];
    let message = (
        field(say(), OPENAI_KEYS),
        sometimes(),
        sometimes(),
        sometimes(),
        prop_oneof![
            8 => Just(None),
            1 => field(vec(openai_tool_call(), 0..2).prop_map(Value::Array), OPENAI_KEYS),
        ],
    )
        .prop_map(
            |(content, refusal, reasoning_content, reasoning, tool_calls)| {
                let mut m = object(vec![
                    ("content", content),
                    ("refusal", refusal),
                    ("reasoning_content", reasoning_content),
                    ("reasoning", reasoning),
                    ("tool_calls", tool_calls),
                ]);
                m["role"] = "assistant".into();
                m
            },
        );
    let finish = prop_oneof![
        4 => Just(Value::from("stop")),
        1 => Just(Value::from("length")),
        2 => finish_reason(),
    ];
    let choice = (
        prop_oneof![8 => message.prop_map(Some), 1 => Just(Some(Value::Null)), 1 => Just(None)],
        field(finish, OPENAI_KEYS),
    )
        .prop_map(|(message, finish)| {
            let mut c = object(vec![("message", message), ("finish_reason", finish)]);
            c["index"] = 0.into();
            c["logprobs"] = Value::Null;
            c
        });
    let tier = proptest::sample::select(vec!["default", "flex", "", "a b"]).prop_map(Value::from);
    let error = prop_oneof![
        12 => Just(None),
        1 => Just(Some(json!({"message": "x", "type": "server_error"}))),
        1 => Just(Some(Value::Null)),
        1 => Just(Some(Value::Bool(false))),
    ];
    let choices = prop_oneof![6 => vec(choice.clone(), 1..2), 1 => vec(choice, 0..3)];
    let body = (
        field(choices.prop_map(Value::Array), OPENAI_KEYS),
        prop_oneof![2 => Just(None), 3 => field(usage(), OPENAI_KEYS)],
        prop_oneof![2 => Just(None), 1 => field(tier, OPENAI_KEYS)],
        error,
        prop_oneof![8 => Just("chat.completion"), 1 => Just("error"), 1 => Just("")],
    )
        .prop_map(|(choices, usage, tier, error, kind)| {
            let mut v = object(vec![
                ("choices", choices),
                ("usage", usage),
                ("service_tier", tier),
                ("error", error),
            ]);
            v["object"] = kind.into();
            v["id"] = "chatcmpl-1".into();
            serde_json::to_vec(&v).unwrap_or_default()
        });
    // Sometimes a key twice: a tree keeps the last, the in-place reading
    // leaves such a body to the tree.
    let twice = |mut b: Vec<u8>| {
        if let Some(at) = b.iter().position(|&c| c == b'{') {
            b.splice(at + 1..at + 1, br#""choices":null,"#.iter().copied());
        }
        b
    };
    prop_oneof![
        6 => body.clone(),
        1 => body.clone().prop_map(twice),
        1 => body.prop_flat_map(mutated),
    ]
}

/// A plausible OpenAI stream: deltas, a finish frame, maybe usage, `[DONE]`.
fn openai_skeleton() -> impl Strategy<Value = Vec<Frame>> {
    let reason = prop_oneof![
        4 => Just("stop"),
        2 => Just("tool_calls"),
        1 => Just("length"),
        1 => Just("content_filter"),
    ];
    (vec(say(), 0..8), reason, any::<bool>(), any::<bool>()).prop_map(|(says, reason, usage, done)| {
        let mut frames = Vec::new();
        let mut calls = 0u32;
        for s in says {
            match s {
                Say::Text(t) => frames.push(data(json!({"choices": [{"index": 0, "delta": {"content": t}, "finish_reason": null}]}))),
                Say::Tool { id, name, args, cuts } => {
                    for (i, part) in fragments(&args, &cuts).into_iter().enumerate() {
                        let call = if i == 0 {
                            json!({"index": calls, "id": id, "type": "function", "function": {"name": name, "arguments": part}})
                        } else {
                            json!({"index": calls, "function": {"arguments": part}})
                        };
                        frames.push(data(json!({"choices": [{"index": 0, "delta": {"tool_calls": [call]}, "finish_reason": null}]})));
                    }
                    calls += 1;
                }
            }
        }
        frames.push(data(json!({"choices": [{"index": 0, "delta": {}, "finish_reason": reason}]})));
        if usage {
            frames.push(data(json!({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 5}})));
        }
        if done {
            frames.push(Frame::Done);
        }
        frames
    })
}

/// A realistic stream with up to three edits (a wild frame inserted or put in
/// place of one, a frame dropped), rendered, sometimes cut short.
fn mutated_stream(
    skeleton: impl Strategy<Value = Vec<Frame>>,
    wild: impl Strategy<Value = Frame>,
) -> impl Strategy<Value = Vec<u8>> {
    let edits = prop_oneof![2 => Just(Vec::new()), 3 => vec((any::<usize>(), 0u8..3, wild), 1..4)];
    let truncate = prop_oneof![3 => Just(None), 1 => any::<usize>().prop_map(Some)];
    (skeleton, edits, truncate).prop_map(|(mut frames, edits, truncate)| {
        for (at, op, frame) in edits {
            let at = at % (frames.len() + 1);
            match op {
                0 => frames.insert(at, frame),
                1 if at < frames.len() => frames[at] = frame,
                _ if at < frames.len() => {
                    frames.remove(at);
                }
                _ => {}
            }
        }
        let mut out = String::new();
        for f in &frames {
            f.render(&mut out);
        }
        let mut bytes = out.into_bytes();
        if let Some(n) = truncate {
            bytes.truncate(n % (bytes.len() + 1));
        }
        bytes
    })
}

fn openai_stream() -> impl Strategy<Value = Vec<u8>> {
    let event = prop_oneof![12 => Just(None), 1 => Just(Some("error".to_owned())), 1 => text().prop_map(Some)];
    let wild = prop_oneof![
        10 => json_frame(event, openai_chunk()),
        2 => Just(Frame::Done),
        1 => text().prop_map(Frame::ErrorField),
        2 => raw_frame(),
    ];
    mutated_stream(openai_skeleton(), wild)
}

const ANTHROPIC_KEYS: &[&str] = &[
    "type",
    "index",
    "message",
    "usage",
    "input_tokens",
    "output_tokens",
    "content_block",
    "text",
    "id",
    "name",
    "input",
    "delta",
    "partial_json",
    "stop_reason",
    "error",
];

const ANTHROPIC_EVENTS: &[&str] = &[
    "message_start",
    "content_block_start",
    "content_block_delta",
    "content_block_stop",
    "message_delta",
    "message_stop",
    "ping",
    "error",
];

fn kind(known: &'static [&'static str]) -> impl Strategy<Value = Value> {
    prop_oneof![
        6 => proptest::sample::select(known).prop_map(Value::from),
        1 => text().prop_map(Value::from),
    ]
}

fn anthropic_event() -> impl Strategy<Value = (String, Value)> {
    let usage = (
        field(number(), ANTHROPIC_KEYS),
        field(number(), ANTHROPIC_KEYS),
    )
        .prop_map(|(i, o)| object(vec![("input_tokens", i), ("output_tokens", o)]));
    let block = (
        field(
            kind(&["text", "tool_use", "thinking", "server_tool_use"]),
            ANTHROPIC_KEYS,
        ),
        field(text().prop_map(Value::from), ANTHROPIC_KEYS),
        field(text().prop_map(Value::from), ANTHROPIC_KEYS),
        field(
            prop_oneof![Just(json!({})), json_value(ANTHROPIC_KEYS)],
            ANTHROPIC_KEYS,
        ),
    )
        .prop_map(|(t, text, id, input)| {
            object(vec![
                ("type", t),
                ("text", text.clone()),
                ("id", id),
                ("name", text),
                ("input", input),
            ])
        });
    let delta = (
        field(
            kind(&[
                "text_delta",
                "input_json_delta",
                "thinking_delta",
                "signature_delta",
            ]),
            ANTHROPIC_KEYS,
        ),
        field(text().prop_map(Value::from), ANTHROPIC_KEYS),
        field(json_fragment(), ANTHROPIC_KEYS),
        field(
            kind(&[
                "end_turn",
                "stop_sequence",
                "pause_turn",
                "max_tokens",
                "tool_use",
                "refusal",
            ]),
            ANTHROPIC_KEYS,
        ),
    )
        .prop_map(|(t, text, partial, stop)| {
            object(vec![
                ("type", t),
                ("text", text),
                ("partial_json", partial),
                ("stop_reason", stop),
            ])
        });
    (
        proptest::sample::select(ANTHROPIC_EVENTS),
        field(index(), ANTHROPIC_KEYS),
        field(block, ANTHROPIC_KEYS),
        field(delta, ANTHROPIC_KEYS),
        field(usage.clone(), ANTHROPIC_KEYS),
        field(usage.prop_map(|u| json!({ "usage": u })), ANTHROPIC_KEYS),
    )
        .prop_map(|(t, index, block, delta, usage, message)| {
            let value = match t {
                "message_start" => object(vec![("message", message)]),
                "content_block_start" => object(vec![("index", index), ("content_block", block)]),
                "content_block_delta" => object(vec![("index", index), ("delta", delta)]),
                "content_block_stop" => object(vec![("index", index)]),
                "message_delta" => object(vec![("delta", delta), ("usage", usage)]),
                "error" => json!({"error": {"type": "overloaded_error", "message": "x"}}),
                _ => json!({}),
            };
            let mut value = value;
            if let Value::Object(o) = &mut value {
                o.insert("type".into(), Value::from(t));
            }
            (t.to_owned(), value)
        })
}

/// A plausible Anthropic stream: `message_start`, content blocks (text,
/// tool_use with its input split into fragments, thinking), `message_delta`
/// with a stop reason, `message_stop`.
fn anthropic_skeleton() -> impl Strategy<Value = Vec<Frame>> {
    let reason = prop_oneof![4 => Just("end_turn"), 2 => Just("tool_use"), 1 => Just("max_tokens"), 1 => Just("refusal")];
    let block = prop_oneof![4 => say().prop_map(Some), 1 => Just(None)];
    (vec(block, 0..6), reason, any::<bool>()).prop_map(|(blocks, reason, stop)| {
        let ev = |t: &str, mut value: Value| {
            value["type"] = json!(t);
            Frame::Json {
                event: Some(t.to_owned()),
                value,
                truncate: None,
            }
        };
        let mut frames = vec![ev(
            "message_start",
            json!({"message": {"usage": {"input_tokens": 7, "output_tokens": 1}}}),
        )];
        for (index, block) in blocks.into_iter().enumerate() {
            let (start, deltas) = match block {
                Some(Say::Text(t)) => (
                    json!({"type": "text", "text": ""}),
                    vec![json!({"type": "text_delta", "text": t})],
                ),
                Some(Say::Tool {
                    id,
                    name,
                    args,
                    cuts,
                }) => (
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    fragments(&args, &cuts)
                        .into_iter()
                        .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                        .collect(),
                ),
                None => (
                    json!({"type": "thinking", "thinking": ""}),
                    vec![json!({"type": "thinking_delta", "thinking": "hm"})],
                ),
            };
            frames.push(ev(
                "content_block_start",
                json!({"index": index, "content_block": start}),
            ));
            frames.push(Frame::Raw(
                "event: ping\ndata: {\"type\": \"ping\"}\n\n".to_owned(),
            ));
            for d in deltas {
                frames.push(ev(
                    "content_block_delta",
                    json!({"index": index, "delta": d}),
                ));
            }
            frames.push(ev("content_block_stop", json!({"index": index})));
        }
        frames.push(ev(
            "message_delta",
            json!({"delta": {"stop_reason": reason}, "usage": {"output_tokens": 9}}),
        ));
        if stop {
            frames.push(ev("message_stop", json!({})));
        }
        frames
    })
}

fn anthropic_stream() -> impl Strategy<Value = Vec<u8>> {
    // The `event:` line usually matches the JSON `type`, sometimes not.
    let frame = (
        anthropic_event(),
        prop_oneof![8 => Just(None), 1 => Just(Some(None)), 1 => text().prop_map(|t| Some(Some(t)))],
        prop_oneof![9 => Just(None), 1 => any::<usize>().prop_map(Some)],
    )
        .prop_map(|((t, value), event, truncate)| Frame::Json {
            event: event.unwrap_or(Some(t)),
            value,
            truncate,
        });
    let wild = prop_oneof![
        12 => frame,
        1 => text().prop_map(Frame::ErrorField),
        2 => raw_frame(),
    ];
    mutated_stream(anthropic_skeleton(), wild)
}

/// Bytes of everything forwarded.
fn output_bytes(chunks: &[Chunk]) -> usize {
    chunks
        .iter()
        .map(|c| match c {
            Chunk::Text(t) => t.len(),
            Chunk::Reasoning(_) => c.output_bytes(),
            Chunk::ToolCall(call) => {
                call.id.as_ref().map_or(0, String::len)
                    + call.name.as_ref().map_or(0, String::len)
                    + call.arguments.len()
            }
        })
        .sum()
}

/// The same (chunks, end) under every chunking, and no more output than input.
fn check_decoder<D: StreamDecoder>(
    bytes: &[u8],
    cuts: &[usize],
    new: fn() -> D,
) -> Result<(), TestCaseError> {
    let whole: Run = run(&[bytes], &mut new());
    let mut all = chunkings(bytes);
    all.push(cut(bytes, cuts));
    for pieces in all {
        prop_assert_eq!(&run(&pieces, &mut new()), &whole);
    }
    let out = output_bytes(&whole.0);
    prop_assert!(
        out <= bytes.len(),
        "{} bytes out of {} in",
        out,
        bytes.len()
    );
    Ok(())
}

proptest! {
    // About a third of these bodies take the in-place reading, and a rare
    // few of those a refusal that must turn `stop` into `refusal`: more
    // cases than the default (they take about half a second).
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// A whole body read in place decides as its JSON tree decides: the
    /// same chunks, finish reason, usage and tier, or the same failure.
    #[test]
    fn fuzz_openai_whole_body_read_in_place_agrees_with_the_tree(body in prop_oneof![
        4 => common_shape_whole(),
        1 => vec(any::<u8>(), 0..64),
    ]) {
        prop_assume!(!body.iter().all(u8::is_ascii_whitespace));
        prop_assert_eq!(decode_non_streaming(&body), super::openai::decode_general(&body));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { ..ProptestConfig::default() })]

    #[test]
    fn fuzz_openai_stream_decoder(bytes in openai_stream(), cuts in cuts()) {
        check_decoder(&bytes, &cuts, OpenAiDecoder::new)?;
    }

    /// The common-shape reading decides every frame as the general one does.
    #[test]
    fn fuzz_openai_fast_path_agrees_with_the_general_one(bytes in prop_oneof![
        3 => openai_stream(),
        3 => common_shape_stream(),
        1 => sse_bytes(),
    ]) {
        prop_assert_eq!(
            run(&[&bytes], &mut OpenAiDecoder::new()),
            run(&[&bytes], &mut OpenAiDecoder::general_only())
        );
    }

    /// `usage` read in place counts what the `Value` lookup counts.
    #[test]
    fn fuzz_usage_read_in_place_agrees_with_the_tree(u in usage()) {
        let data = json!({"choices": [], "usage": u}).to_string();
        let frame = super::openai_frame::parse(&data).map(|f| f.usage.map(|c| c.normalised()));
        prop_assert_eq!(frame, Some(super::openai::parse_usage(Some(&u))));
    }

    #[test]
    fn fuzz_anthropic_stream_decoder(bytes in anthropic_stream(), cuts in cuts()) {
        check_decoder(&bytes, &cuts, AnthropicDecoder::new)?;
    }

    /// Raw bytes through either decoder: nothing but the parser's view of them.
    #[test]
    fn fuzz_decoders_on_any_bytes(bytes in sse_bytes(), cuts in cuts()) {
        check_decoder(&bytes, &cuts, OpenAiDecoder::new)?;
        check_decoder(&bytes, &cuts, AnthropicDecoder::new)?;
    }

    /// Mutated `chat.completion` bodies and raw bytes never panic and never
    /// produce more than they were given.
    #[test]
    fn fuzz_openai_non_streaming_body(
        body in prop_oneof![
            3 => openai_chunk()
                .prop_map(|mut v| {
                    // The non-streamed shape: `message` where the stream has `delta`.
                    if let Some(Value::Array(choices)) = v.get_mut("choices") {
                        for c in choices.iter_mut().filter_map(Value::as_object_mut) {
                            if let Some(d) = c.remove("delta") {
                                c.insert("message".into(), d);
                            }
                        }
                    }
                    serde_json::to_vec(&v).unwrap_or_default()
                })
                .prop_flat_map(mutated),
            1 => vec(any::<u8>(), 0..256),
        ],
    ) {
        if let Ok((chunks, _)) = decode_non_streaming(&body) {
            let out = output_bytes(&chunks);
            prop_assert!(out <= body.len(), "{} bytes out of {} in", out, body.len());
        }
    }
}
