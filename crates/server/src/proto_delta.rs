//! `switchyard.v1.Delta`, the message that carries every streamed token, as
//! a hand-written prost message instead of a generated one: its `text` is a
//! [`CompactString`], so a token (almost always under 24 bytes) moves from
//! the upstream's decoder to the caller's gRPC frame without a heap
//! allocation. It encodes and decodes exactly as the generated type did
//! (`build.rs` maps the proto type here with `extern_path`); a test checks
//! both ways against the same fields written by prost's own encoders.

use compact_str::CompactString;
use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

use crate::proto::ToolCallDelta;
use crate::proto_names::{encode_name, name_len};

/// `Delta { text = 1; repeated ToolCallDelta tool_calls = 2; reasoning = 3 }`.
#[derive(Clone, PartialEq, Default, Debug)]
pub struct Delta {
    pub text: CompactString,
    pub tool_calls: Vec<ToolCallDelta>,
    /// Reasoning (thinking) text, as it streams.
    pub reasoning: String,
}

const TEXT: u32 = 1;
const TOOL_CALLS: u32 = 2;
const REASONING: u32 = 3;

impl prost::Message for Delta {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_name(TEXT, &self.text, buf);
        for call in &self.tool_calls {
            encoding::message::encode(TOOL_CALLS, call, buf);
        }
        if !self.reasoning.is_empty() {
            encoding::string::encode(REASONING, &self.reasoning, buf);
        }
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            TEXT => {
                let mut text = String::new();
                encoding::string::merge(wire_type, &mut text, buf, ctx)?;
                self.text = CompactString::from(text);
                Ok(())
            }
            TOOL_CALLS => {
                encoding::message::merge_repeated(wire_type, &mut self.tool_calls, buf, ctx)
            }
            REASONING => encoding::string::merge(wire_type, &mut self.reasoning, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        let text = name_len(TEXT, &self.text);
        let reasoning = if self.reasoning.is_empty() {
            0
        } else {
            encoding::string::encoded_len(REASONING, &self.reasoning)
        };
        text + encoding::message::encoded_len_repeated(TOOL_CALLS, &self.tool_calls) + reasoning
    }

    fn clear(&mut self) {
        self.text.clear();
        self.tool_calls.clear();
        self.reasoning.clear();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use prost::Message;

    use super::*;

    /// The fields written by prost's own encoders, as the generated type
    /// wrote them.
    fn by_prost(text: &str, calls: &[ToolCallDelta], reasoning: &str) -> Vec<u8> {
        let mut out = Vec::new();
        if !text.is_empty() {
            encoding::string::encode(TEXT, &text.to_string(), &mut out);
        }
        for c in calls {
            encoding::message::encode(TOOL_CALLS, c, &mut out);
        }
        if !reasoning.is_empty() {
            encoding::string::encode(REASONING, &reasoning.to_string(), &mut out);
        }
        out
    }

    #[test]
    fn a_delta_is_the_same_bytes_both_ways_as_the_generated_message() {
        let call = ToolCallDelta {
            index: 2,
            id: "call_1".into(),
            name: "get_weather".into(),
            arguments: "{\"city\":".into(),
        };
        let long = "a token longer than the twenty-four inline bytes, é and all";
        for (text, calls, reasoning) in [
            ("", vec![], ""),
            ("Hi", vec![], ""),
            (long, vec![], ""),
            ("", vec![call.clone()], ""),
            ("", vec![], "Let me think."),
            ("é", vec![call.clone(), call.clone()], "hm"),
        ] {
            let delta = Delta {
                text: text.into(),
                tool_calls: calls.clone(),
                reasoning: reasoning.into(),
            };
            let want = by_prost(text, &calls, reasoning);
            assert_eq!(delta.encode_to_vec(), want, "{text:?}");
            assert_eq!(delta.encoded_len(), want.len());
            assert_eq!(Delta::decode(&want[..]).unwrap(), delta);
        }
        // An unknown field is skipped; bad UTF-8 is an error.
        let mut unknown = by_prost("x", &[], "");
        encoding::uint32::encode(9, &7, &mut unknown);
        assert_eq!(Delta::decode(&unknown[..]).unwrap().text, "x");
        let bad = [0x0a, 0x01, 0xff];
        assert!(Delta::decode(&bad[..]).is_err());
    }

    #[test]
    fn a_short_token_is_held_inline() {
        let delta = Delta {
            text: CompactString::from(" world"),
            ..Default::default()
        };
        assert!(!delta.text.is_heap_allocated());
    }
}
