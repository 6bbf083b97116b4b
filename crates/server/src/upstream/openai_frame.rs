//! The common shape of a streamed OpenAI chunk, and of a non-streamed
//! `chat.completion` body ([`parse_whole`]), read without building a JSON
//! tree: text, refusal and (whole bodies) reasoning text, finish reasons,
//! usage and the service tier, borrowed from the frame. Anything else (tool
//! calls, an `error` key, an unexpected type, a duplicate key, a frame that
//! is not an object) reads as `None`, and the decoder takes its general
//! `serde_json::Value` path, so the two paths decide every frame and body
//! alike; `fuzz` checks that they do.

use std::borrow::Cow;

use serde::de::{IgnoredAny, MapAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;
use smallvec::SmallVec;

use super::openai::UsageCounts;

/// A frame's `choices`: one, inline (Switchyard asks for one choice).
pub(crate) type Choices<'a> = SmallVec<[Choice<'a>; 1]>;

/// One frame in the common shape.
#[derive(Debug)]
pub(crate) struct Frame<'a> {
    /// The `usage` value's counts, when it is an object.
    pub usage: Option<UsageCounts>,
    pub service_tier: Option<Cow<'a, str>>,
    pub choices: Choices<'a>,
}

/// One entry of `choices`.
#[derive(Debug)]
pub(crate) struct Choice<'a> {
    /// `index` (absent or null: 0; past `u32`: `u32::MAX`).
    pub index: u32,
    pub content: Option<Cow<'a, str>>,
    pub refusal: Option<Cow<'a, str>>,
    pub finish_reason: Option<Cow<'a, str>>,
}

/// A JSON string, borrowed from the frame unless it holds escapes (serde's
/// `borrow` does not reach through `Option<Cow>`).
#[derive(Debug)]
struct Text<'a>(Cow<'a, str>);

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl<'de> serde::de::Visitor<'de> for Visitor {
            type Value = Text<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E>(self, s: &'de str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E>(self, s: &str) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E>(self, s: String) -> Result<Self::Value, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        d.deserialize_str(Visitor)
    }
}

fn text_of(t: Option<Text<'_>>) -> Option<Cow<'_, str>> {
    t.map(|t| t.0)
}

/// A frame's or a whole body's top level; `C` is what a choice holds.
#[derive(Deserialize)]
#[serde(bound(deserialize = "C: Deserialize<'de>"))]
struct RawTop<'a, C> {
    #[serde(default)]
    choices: Option<SmallVec<[Obj<C>; 1]>>,
    #[serde(default, borrow)]
    usage: Option<&'a RawValue>,
    #[serde(default, borrow)]
    service_tier: Option<Text<'a>>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
    #[serde(default, borrow)]
    object: Option<Text<'a>>,
}

impl<C> RawTop<'_, C> {
    /// An error body or frame: the general path classifies it.
    fn is_error(&self) -> bool {
        self.error.is_some() || self.object.as_ref().map(|o| &*o.0) == Some("error")
    }
}

type RawFrame<'a> = RawTop<'a, RawChoice<'a>>;

#[derive(Deserialize)]
struct RawChoice<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    delta: Option<Obj<RawDelta<'a>>>,
    #[serde(default, borrow)]
    finish_reason: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct RawDelta<'a> {
    #[serde(default, borrow)]
    content: Option<Text<'a>>,
    #[serde(default, borrow)]
    refusal: Option<Text<'a>>,
    #[serde(default, borrow)]
    tool_calls: Option<&'a RawValue>,
    #[serde(default, borrow)]
    function_call: Option<&'a RawValue>,
    /// Compatible servers' reasoning text (vLLM, DeepSeek: `reasoning_content`;
    /// OpenRouter and others: `reasoning`).
    #[serde(default, borrow)]
    reasoning_content: Option<&'a RawValue>,
    #[serde(default, borrow)]
    reasoning: Option<&'a RawValue>,
}

/// An object read leniently, as a lookup in a `serde_json::Value` would read
/// it: what does not have the expected type reads as absent, a repeated key
/// keeps its last value, and unknown keys are skipped. Nothing is allocated.
struct InPlace<T>(T);

/// What [`InPlace`] reads an object into, one key at a time.
trait Keys: Default {
    /// Reads `key`'s value into its slot, or skips it.
    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error>;
}

impl<'de, T: Keys> Deserialize<'de> for InPlace<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Keys> Visitor<'de> for V<T> {
            type Value = InPlace<T>;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut fields = T::default();
                while let Some(key) = map.next_key::<Text>()? {
                    fields.read(&key.0, &mut map)?;
                }
                Ok(InPlace(fields))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData))
    }
}

/// A count: what `Value::as_u64` reads (a non-negative integer that fits
/// `u64`; not `5.0`, `1e3` or `-0`), else absent.
struct Count(Option<u64>);

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&RawValue>::deserialize(d)?;
        Ok(Count(raw.get().trim().parse().ok()))
    }
}

/// A `*_tokens_details` value. Present whatever its type (a lookup that
/// finds it does not fall back to the other spelling); its counts are read
/// only from an object.
#[derive(Default, Clone, Copy)]
struct Details {
    cached_tokens: Option<u64>,
    cache_write_tokens: Option<u64>,
    reasoning_tokens: Option<u64>,
}

impl<'de> Deserialize<'de> for Details {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let raw = <&RawValue>::deserialize(d)?;
        match object(raw.get()) {
            Some(o) => serde_json::from_str::<InPlace<Details>>(o)
                .map(|d| d.0)
                .map_err(serde::de::Error::custom),
            None => Ok(Details::default()),
        }
    }
}

impl Keys for Details {
    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        let slot = match key {
            "cached_tokens" => &mut self.cached_tokens,
            "cache_write_tokens" => &mut self.cache_write_tokens,
            "reasoning_tokens" => &mut self.reasoning_tokens,
            _ => return map.next_value::<IgnoredAny>().map(drop),
        };
        *slot = map.next_value::<Count>()?.0;
        Ok(())
    }
}

/// A `usage` object's fields, each spelling apart: `counts` are
/// prompt, input, completion and output tokens, `details` the
/// `*_tokens_details` in the same order.
#[derive(Default)]
struct UsageFields {
    counts: [Option<u64>; 4],
    details: [Option<Details>; 4],
}

impl Keys for UsageFields {
    fn read<'de, A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        let (counts, details) = (&mut self.counts, &mut self.details);
        match key {
            "prompt_tokens" => counts[0] = map.next_value::<Count>()?.0,
            "input_tokens" => counts[1] = map.next_value::<Count>()?.0,
            "completion_tokens" => counts[2] = map.next_value::<Count>()?.0,
            "output_tokens" => counts[3] = map.next_value::<Count>()?.0,
            "prompt_tokens_details" => details[0] = Some(map.next_value()?),
            "input_tokens_details" => details[1] = Some(map.next_value()?),
            "completion_tokens_details" => details[2] = Some(map.next_value()?),
            "output_tokens_details" => details[3] = Some(map.next_value()?),
            _ => {
                map.next_value::<IgnoredAny>()?;
            }
        }
        Ok(())
    }
}

impl UsageFields {
    /// The counts, chosen as `openai::parse_usage` chooses them: of two
    /// spellings, the first present wins, as in a lookup.
    fn counts(self) -> UsageCounts {
        let [prompt, input, completion, output] = self.counts;
        let [pd, id, cd, od] = self.details;
        let prompt_details = pd.or(id).unwrap_or_default();
        let completion_details = cd.or(od).unwrap_or_default();
        UsageCounts {
            prompt_tokens: prompt.or(input),
            completion_tokens: completion.or(output),
            cached_tokens: prompt_details.cached_tokens,
            cache_write_tokens: prompt_details.cache_write_tokens,
            reasoning_tokens: completion_details.reasoning_tokens,
        }
    }
}

/// A struct read only from a JSON object (serde would also read one from an
/// array), in place: a choice and its delta are not first captured as raw
/// text, whose skipping of nested objects allocates in serde_json.
struct Obj<T>(T);

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Obj<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V<T>(std::marker::PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for V<T> {
            type Value = T;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<T, A::Error> {
                T::deserialize(serde::de::value::MapAccessDeserializer::new(map))
            }
        }
        d.deserialize_map(V(std::marker::PhantomData)).map(Obj)
    }
}

/// A JSON object's text (serde would also read an array into a struct).
fn object(raw: &str) -> Option<&str> {
    raw.trim_start().starts_with('{').then_some(raw)
}

/// Whether `json` may hold what a `serde_json::Value` refuses and the
/// in-place reading would skip unchecked (serde skips an unknown key's
/// value, and a `RawValue`, without reading it as a number or a string):
/// a number past `f64` (`4E94967296`, or 400 digits), or a `\u` escape of
/// a lone surrogate. Such a frame or body takes the general path, so both
/// paths decide it alike. Looked for without walking the frame byte by
/// byte (it runs on every frame): backslashes and `e`s are found with
/// `memchr`, digit runs by sampling, and a number found is read by
/// serde_json itself. A false alarm (an escaped backslash before `ud800`,
/// a string that reads like a huge number after a `:`) only costs the
/// general path.
fn may_be_refused_by_the_tree(json: &str) -> bool {
    let bytes = json.as_bytes();
    // A backslash is in a string, always.
    let lone = memchr::memchr_iter(b'\\', bytes).any(|at| match surrogate(bytes, at) {
        Some(High) => surrogate(bytes, at + 6) != Some(Low),
        Some(Low) => at < 6 || surrogate(bytes, at - 6) != Some(High),
        None => false,
    });
    lone || memchr::memchr2_iter(b'e', b'E', bytes).any(|at| exponent_past_f64(json, at))
        || long_digit_run(json)
}

/// The half of a UTF-16 surrogate pair a `\u` escape is.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Half {
    High,
    Low,
}
use Half::{High, Low};

/// The surrogate half escaped at `at` (`\ud800` to `\udfff`), if any.
fn surrogate(bytes: &[u8], at: usize) -> Option<Half> {
    match bytes.get(at..at + 4)? {
        [b'\\', b'u', b'd' | b'D', b'8'..=b'9' | b'a' | b'b' | b'A' | b'B'] => Some(High),
        [b'\\', b'u', b'd' | b'D', b'c'..=b'f' | b'C'..=b'F'] => Some(Low),
        _ => None,
    }
}

/// Whether the `e` at `at` is the exponent of a number the tree refuses.
fn exponent_past_f64(json: &str, at: usize) -> bool {
    let bytes = json.as_bytes();
    let exponent = at > 0
        && bytes[at - 1].is_ascii_digit()
        && matches!(bytes.get(at + 1), Some(b'0'..=b'9' | b'+' | b'-'));
    exponent && refused_number(json, at)
}

/// Whether the number token around `at` is one a `serde_json::Value`
/// refuses (past `f64`), read by serde_json itself so the two agree on
/// every number. Letters and digits in a string ("fp_3e2b") are not a
/// token: a value starts after `:`, `,` or `[` (or the frame's start).
fn refused_number(json: &str, at: usize) -> bool {
    let bytes = json.as_bytes();
    let in_number = |c: &u8| matches!(c, b'0'..=b'9' | b'.' | b'+' | b'-' | b'e' | b'E');
    let start = bytes[..at]
        .iter()
        .rposition(|c| !in_number(c))
        .map_or(0, |p| p + 1);
    let end = bytes[at..]
        .iter()
        .position(|c| !in_number(c))
        .map_or(bytes.len(), |p| at + p);
    let before = bytes[..start]
        .iter()
        .rev()
        .find(|c| !c.is_ascii_whitespace());
    matches!(before, None | Some(b':' | b',' | b'['))
        && serde_json::from_str::<serde_json::Value>(&json[start..end]).is_err()
}

/// Digits in a row past which a number may be past `f64` (one of 310 digits
/// is).
const LONG_DIGIT_RUN: usize = 300;

/// Whether `json` holds a number of more than [`LONG_DIGIT_RUN`] digits in
/// a row that the tree refuses. Such a run covers two bytes half of it
/// apart at every multiple of half of it, so only those are looked at
/// first.
fn long_digit_run(json: &str) -> bool {
    let bytes = json.as_bytes();
    let half = LONG_DIGIT_RUN / 2;
    (half..bytes.len()).step_by(half).any(|at| {
        if !(bytes[at].is_ascii_digit() && bytes[at - half].is_ascii_digit()) {
            return false;
        }
        let left = bytes[..at]
            .iter()
            .rev()
            .take_while(|c| c.is_ascii_digit())
            .count();
        let right = bytes[at..]
            .iter()
            .take_while(|c| c.is_ascii_digit())
            .count();
        left + right > LONG_DIGIT_RUN && refused_number(json, at)
    })
}

/// `data` (trimmed) read in the common shape, or `None` for the general path.
pub(crate) fn parse(data: &str) -> Option<Frame<'_>> {
    if may_be_refused_by_the_tree(data) {
        return None;
    }
    let raw: RawFrame = serde_json::from_str(object(data)?).ok()?;
    if raw.is_error() {
        return None;
    }
    let mut choices = Choices::new();
    for Obj(c) in raw.choices.into_iter().flatten() {
        let (content, refusal) = match c.delta {
            None => (None, None),
            Some(Obj(d)) => {
                if d.tool_calls.is_some()
                    || d.function_call.is_some()
                    || d.reasoning_content.is_some()
                    || d.reasoning.is_some()
                {
                    return None;
                }
                (text_of(d.content), text_of(d.refusal))
            }
        };
        choices.push(Choice {
            index: c.index.map_or(0, |i| u32::try_from(i).unwrap_or(u32::MAX)),
            content,
            refusal,
            finish_reason: text_of(c.finish_reason),
        });
    }
    Some(Frame {
        usage: usage_counts(raw.usage)?,
        service_tier: text_of(raw.service_tier),
        choices,
    })
}

/// A non-streamed body in the common shape.
#[derive(Debug)]
pub(crate) struct Whole<'a> {
    /// The `usage` value's counts, when it is an object.
    pub usage: Option<UsageCounts>,
    pub service_tier: Option<Cow<'a, str>>,
    /// The first entry of `choices`, if there is one.
    pub choice: Option<WholeChoice<'a>>,
}

/// The first choice of a whole body.
#[derive(Debug)]
pub(crate) struct WholeChoice<'a> {
    /// `message`, when the choice has one.
    pub message: Option<Message<'a>>,
    pub finish_reason: Option<Cow<'a, str>>,
}

/// A whole body's assistant message without tool calls.
#[derive(Debug)]
pub(crate) struct Message<'a> {
    pub content: Option<Cow<'a, str>>,
    pub refusal: Option<Cow<'a, str>>,
    pub reasoning_content: Option<Cow<'a, str>>,
    pub reasoning: Option<Cow<'a, str>>,
}

type RawWhole<'a> = RawTop<'a, RawWholeChoice<'a>>;

#[derive(Deserialize)]
struct RawWholeChoice<'a> {
    /// Absent, or an object; `null` (which a lookup finds) is not read here.
    #[serde(default, borrow)]
    message: Present<RawMessage<'a>>,
    #[serde(default, borrow)]
    finish_reason: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct RawMessage<'a> {
    #[serde(default, borrow)]
    content: Option<Text<'a>>,
    #[serde(default, borrow)]
    refusal: Option<Text<'a>>,
    #[serde(default, borrow)]
    reasoning_content: Option<Text<'a>>,
    #[serde(default, borrow)]
    reasoning: Option<Text<'a>>,
    #[serde(default, borrow)]
    tool_calls: Option<&'a RawValue>,
}

/// A key's object, read in place; absent is `Absent`, and `null` (or any
/// other type) fails the read, so the general path takes it.
#[derive(Default)]
enum Present<T> {
    #[default]
    Absent,
    Here(T),
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Present<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Obj::<T>::deserialize(d).map(|Obj(t)| Present::Here(t))
    }
}

/// `body` (a whole `chat.completion`) read in the common shape, or `None`
/// for the general path.
pub(crate) fn parse_whole(body: &[u8]) -> Option<Whole<'_>> {
    let text = std::str::from_utf8(body).ok()?;
    if may_be_refused_by_the_tree(text) {
        return None;
    }
    let raw: RawWhole = serde_json::from_str(object(text)?).ok()?;
    if raw.is_error() {
        return None;
    }
    let choice = match raw.choices.and_then(|c| c.into_iter().next()) {
        None => None,
        Some(Obj(c)) => {
            let message = match c.message {
                Present::Absent => None,
                Present::Here(m) if m.tool_calls.is_some() => return None,
                Present::Here(m) => Some(Message {
                    content: text_of(m.content),
                    refusal: text_of(m.refusal),
                    reasoning_content: text_of(m.reasoning_content),
                    reasoning: text_of(m.reasoning),
                }),
            };
            Some(WholeChoice {
                message,
                finish_reason: text_of(c.finish_reason),
            })
        }
    };
    Some(Whole {
        usage: usage_counts(raw.usage)?,
        service_tier: text_of(raw.service_tier),
        choice,
    })
}

/// `usage` read in place: `Some(None)` when it is absent or not an object,
/// `None` (the general path) when it does not read.
fn usage_counts(usage: Option<&RawValue>) -> Option<Option<UsageCounts>> {
    match usage.and_then(|u| object(u.get())) {
        Some(u) => Some(Some(
            serde_json::from_str::<InPlace<UsageFields>>(u)
                .ok()?
                .0
                .counts(),
        )),
        None => Some(None),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_text_chunk_is_read_borrowed() {
        let f = parse(r#"{"id":"x","object":"chat.completion.chunk","service_tier":"default","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"logprobs":null,"finish_reason":null}]}"#).unwrap();
        assert_eq!(f.service_tier.as_deref(), Some("default"));
        assert!(matches!(f.choices[0].content, Some(Cow::Borrowed("Hel"))));
        assert_eq!(f.choices[0].index, 0);
        assert!(f.choices[0].finish_reason.is_none());
    }

    #[test]
    fn escapes_are_decoded() {
        let f = parse(r#"{"choices":[{"delta":{"content":"a\nb\u00e9"}}]}"#).unwrap();
        assert_eq!(f.choices[0].content.as_deref(), Some("a\nbé"));
    }

    #[test]
    fn usage_is_kept_only_as_an_object() {
        let f = parse(r#"{"choices":[],"usage":{"prompt_tokens":3}}"#).unwrap();
        assert!(f.usage.is_some());
        assert!(parse(r#"{"usage":5}"#).unwrap().usage.is_none());
        assert!(parse(r#"{"usage":null,"choices":null}"#)
            .unwrap()
            .usage
            .is_none());
    }

    /// The counts read in place are the ones a `Value` lookup reads, on
    /// the shapes a fuzzer builds rarely: repeated keys, escaped keys,
    /// number forms, details that are not objects.
    #[test]
    fn usage_is_read_in_place_as_a_lookup_reads_it() {
        for usage in [
            r#"{"prompt_tokens":10,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":6},"completion_tokens_details":{"reasoning_tokens":3}}"#,
            r#"{"prompt_tokens":1,"prompt_tokens":9,"completion_tokens":2}"#,
            r#"{"input_tokens":7,"prompt_tokens":9,"output_tokens":1,"completion_tokens":2}"#,
            r#"{"prompt_tokens":9,"input_tokens_details":{"cached_tokens":1},"prompt_tokens_details":{"cached_tokens":4}}"#,
            r#"{"prompt_tokens":"9","input_tokens":7,"output_tokens":5.0,"completion_tokens":-0}"#,
            r#"{"prompt\u005ftokens":8,"input_tokens":1e3,"completion_tokens":18446744073709551616}"#,
            r#"{"prompt_tokens":8,"prompt_tokens_details":null,"input_tokens_details":{"cached_tokens":5}}"#,
            r#"{"prompt_tokens":8,"input_tokens_details":{"cached_tokens":5,"cached_tokens":2}}"#,
            r#"{"prompt_tokens":8,"prompt_tokens_details":{"cached_tokens":9},"prompt_tokens_details":[1]}"#,
            r#"{"prompt_tokens":4294967296,"completion_tokens":3,"output_tokens_details":{"reasoning_tokens":7}}"#,
            r#"{"prompt_tokens": 12 ,"x":{"prompt_tokens":1},"completion_tokens_details":{"reasoning_tokens":{}}}"#,
        ] {
            let data = format!(r#"{{"choices":[],"usage":{usage}}}"#);
            let in_place = parse(&data).unwrap().usage.map(|c| c.normalised());
            let v: serde_json::Value = serde_json::from_str(usage).unwrap();
            assert_eq!(
                in_place,
                super::super::openai::parse_usage(Some(&v)),
                "{usage}"
            );
        }
        let f = parse(r#"{"usage":{"prompt_tokens":10,"completion_tokens":4,"prompt_tokens_details":{"cached_tokens":6}}}"#).unwrap();
        let u = f.usage.unwrap().normalised();
        assert_eq!(
            (u.input_tokens, u.cache_read_input_tokens, u.output_tokens),
            (4, 6, 4)
        );
    }

    #[test]
    fn a_whole_body_is_read_borrowed() {
        let body = br#"{"id":"c","object":"chat.completion","choices":[{"index":0,
            "message":{"role":"assistant","content":"Hi","reasoning_content":"hm"},
            "logprobs":null,"finish_reason":"stop"}],"service_tier":"default",
            "usage":{"prompt_tokens":3,"completion_tokens":2}}"#;
        let w = parse_whole(body).unwrap();
        let c = w.choice.unwrap();
        let m = c.message.unwrap();
        assert!(matches!(m.content, Some(Cow::Borrowed("Hi"))));
        assert_eq!(m.reasoning_content.as_deref(), Some("hm"));
        assert_eq!(c.finish_reason.as_deref(), Some("stop"));
        assert_eq!(w.service_tier.as_deref(), Some("default"));
        assert_eq!(w.usage.unwrap().completion_tokens, Some(2));
        // No choices, no message: read here, refused by the decoder.
        assert!(parse_whole(br#"{"choices":[]}"#).unwrap().choice.is_none());
        let bare = parse_whole(br#"{"choices":[{"finish_reason":"stop"}]}"#).unwrap();
        assert!(bare.choice.unwrap().message.is_none());
    }

    #[test]
    fn other_whole_bodies_take_the_general_path() {
        for body in [
            r#"{"choices":[{"message":null,"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"message":{"tool_calls":[]},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"message":{"content":["x"]},"finish_reason":"stop"}]}"#,
            r#"{"choices":[{"message":{"reasoning":{"text":"x"}}}]}"#,
            r#"{"choices":[{"message":{"content":"a","content":"b"}}]}"#,
            r#"{"error":{"message":"x"}}"#,
            r#"{"object":"error"}"#,
            r#"{"choices":[]} x"#,
            "[1]",
        ] {
            assert!(parse_whole(body.as_bytes()).is_none(), "{body}");
        }
        // What a `Value` refuses and a skipped value would not check: a
        // number past `f64`, a lone surrogate.
        let past = format!(r#"{{"choices":[],"x":{}}}"#, "9".repeat(320));
        for body in [
            r#"{"choices":[],"usage":{"output_tokens":4E94967296}}"#,
            r#"{"choices":[],"x":1e999}"#,
            r#"{"choices":[],"x":"\ud800"}"#,
            r#"{"choices":[],"x":"\udc00\ud800"}"#,
            r#"{"choices":[],"x":"a\ud83d"}"#,
            &past,
        ] {
            assert!(serde_json::from_str::<serde_json::Value>(body).is_err());
            assert!(parse_whole(body.as_bytes()).is_none(), "{body}");
            assert!(parse(body).is_none(), "{body}");
        }
        // A number in range (`f64::MAX` too), an exponent or `\u00e9` in a
        // string, an escaped quote before one, a surrogate pair: read in
        // place.
        for body in [
            r#"{"choices":[],"x":1e3,"y":-2.5E-7,"z":1.5}"#,
            r#"{"choices":[],"x":"1e999 \u00e9 \"1e999\" \\"}"#,
            r#"{"choices":[],"x":"\ud83d\ude00","y":1.7976931348623157e308}"#,
        ] {
            assert!(parse_whole(body.as_bytes()).is_some(), "{body}");
        }
        // Letters and digits in a string, a run of digits under the bound:
        // read in place.
        let under = format!(r#"{{"choices":[],"x":{}}}"#, "9".repeat(LONG_DIGIT_RUN));
        let long = format!(r#"{{"choices":[],"x":{}}}"#, "9".repeat(305));
        for body in [
            r#"{"choices":[],"system_fingerprint":"fp_3e2b9e-1"}"#,
            r#"{"choices":[],"x":"a 1e999"}"#,
            &under,
            &long,
        ] {
            assert!(parse_whole(body.as_bytes()).is_some(), "{body}");
        }
        // A string cut off after an escape ends the search, no panic.
        for cut in [r#"{"x":"\"#, r#"{"x":"\u"#, r#"{"x":""#, "-", "1e"] {
            assert!(parse(cut).is_none(), "{cut}");
        }
        assert!(
            parse_whole(b"{\"choices\":\"\xff\"}").is_none(),
            "not UTF-8"
        );
    }

    #[test]
    fn everything_else_takes_the_general_path() {
        for data in [
            r#"[1,2]"#,
            r#""text""#,
            r#"{"error":{"message":"x"}}"#,
            r#"{"error":false}"#,
            r#"{"object":"error","message":"x"}"#,
            r#"{"object":5}"#,
            r#"{"choices":"x"}"#,
            r#"{"choices":[[0]]}"#,
            r#"{"choices":[{"index":1.5}]}"#,
            r#"{"choices":[{"index":-1}]}"#,
            r#"{"choices":[{"delta":"x"}]}"#,
            r#"{"choices":[{"delta":["content","x"]}]}"#,
            r#"{"choices":[[0,{"content":"x"}]]}"#,
            r#"{"choices":[{"delta":{"content":5}}]}"#,
            r#"{"choices":[{"delta":{"tool_calls":[]}}]}"#,
            r#"{"choices":[{"delta":{"function_call":{}}}]}"#,
            r#"{"choices":[{"delta":{"reasoning_content":"hm"}}]}"#,
            r#"{"choices":[{"delta":{"reasoning":"hm"}}]}"#,
            r#"{"choices":[{"finish_reason":5}]}"#,
            r#"{"service_tier":5}"#,
            r#"{"choices":[],"choices":[]}"#,
            r#"{"choices":[{"delta":{"content":"a","content":"b"}}]}"#,
            r#"{"#,
        ] {
            assert!(parse(data).is_none(), "{data}");
        }
    }
}
