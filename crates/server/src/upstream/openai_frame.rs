//! The common shape of a streamed OpenAI chunk, read without building a JSON
//! tree: text and refusal deltas, finish reasons, usage and the service tier,
//! borrowed from the frame. Anything else (tool calls, an `error` key, an
//! unexpected type, a duplicate key, a frame that is not an object) reads as
//! `None`, and the decoder takes its general `serde_json::Value` path, so the
//! two paths decide every frame alike; `fuzz` checks that they do.

use std::borrow::Cow;

use serde::Deserialize;
use serde_json::value::RawValue;
use smallvec::SmallVec;

/// A frame's `choices`: one, inline (Switchyard asks for one choice).
pub(crate) type Choices<'a> = SmallVec<[Choice<'a>; 1]>;

/// One frame in the common shape.
#[derive(Debug)]
pub(crate) struct Frame<'a> {
    /// The `usage` value, when it is an object.
    pub usage: Option<&'a RawValue>,
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

fn text(t: Option<Text<'_>>) -> Option<Cow<'_, str>> {
    t.map(|t| t.0)
}

#[derive(Deserialize)]
struct RawFrame<'a> {
    #[serde(default, borrow)]
    choices: Option<SmallVec<[&'a RawValue; 1]>>,
    #[serde(default, borrow)]
    usage: Option<&'a RawValue>,
    #[serde(default, borrow)]
    service_tier: Option<Text<'a>>,
    #[serde(default, borrow)]
    error: Option<&'a RawValue>,
    #[serde(default, borrow)]
    object: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct RawChoice<'a> {
    #[serde(default)]
    index: Option<u64>,
    #[serde(default, borrow)]
    delta: Option<&'a RawValue>,
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

/// A JSON object's text (serde would also read an array into a struct).
fn object(raw: &str) -> Option<&str> {
    raw.trim_start().starts_with('{').then_some(raw)
}

/// `data` (trimmed) read in the common shape, or `None` for the general path.
pub(crate) fn parse(data: &str) -> Option<Frame<'_>> {
    let raw: RawFrame = serde_json::from_str(object(data)?).ok()?;
    if raw.error.is_some() || raw.object.as_ref().map(|o| &*o.0) == Some("error") {
        return None;
    }
    let mut choices = Choices::new();
    for c in raw.choices.iter().flatten() {
        let c: RawChoice = serde_json::from_str(object(c.get())?).ok()?;
        let (content, refusal) = match c.delta {
            None => (None, None),
            Some(d) => {
                let d: RawDelta = serde_json::from_str(object(d.get())?).ok()?;
                if d.tool_calls.is_some()
                    || d.function_call.is_some()
                    || d.reasoning_content.is_some()
                    || d.reasoning.is_some()
                {
                    return None;
                }
                (text(d.content), text(d.refusal))
            }
        };
        choices.push(Choice {
            index: c.index.map_or(0, |i| u32::try_from(i).unwrap_or(u32::MAX)),
            content,
            refusal,
            finish_reason: text(c.finish_reason),
        });
    }
    Some(Frame {
        usage: raw.usage.filter(|u| object(u.get()).is_some()),
        service_tier: text(raw.service_tier),
        choices,
    })
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
