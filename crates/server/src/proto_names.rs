//! `switchyard.v1.Started` and `switchyard.v1.ServedBy`, the messages that
//! name who serves a stream, as hand-written prost messages instead of
//! generated ones: their names (provider, model, request id, resume token)
//! are [`Name`]s, which share the request's strings instead of copying each
//! into a `String` of its own (four allocations a stream for `Started`, two
//! for `Finished.served_by`). They encode and decode exactly as the
//! generated types did (`build.rs` maps the proto types here with
//! `extern_path`); a test checks both ways against the same fields written by
//! prost's own encoders.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use prost::bytes::{Buf, BufMut};
use prost::encoding::{self, DecodeContext, WireType};
use prost::DecodeError;

/// A shared name: compares, prints and reads as the `str` it holds.
/// Empty (the proto's default) without an allocation.
#[derive(Clone, Default)]
pub struct Name(Option<Arc<str>>);

impl Name {
    pub fn as_str(&self) -> &str {
        self.0.as_deref().unwrap_or("")
    }
}

impl Deref for Name {
    type Target = str;
    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl AsRef<str> for Name {
    fn as_ref(&self) -> &str {
        self.as_str()
    }
}

impl fmt::Debug for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self.as_str(), f)
    }
}

impl fmt::Display for Name {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl PartialEq for Name {
    fn eq(&self, other: &Name) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Name {}

impl std::hash::Hash for Name {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        self.as_str().hash(state);
    }
}

impl PartialEq<str> for Name {
    fn eq(&self, other: &str) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<&str> for Name {
    fn eq(&self, other: &&str) -> bool {
        self.as_str() == *other
    }
}

impl PartialEq<String> for Name {
    fn eq(&self, other: &String) -> bool {
        self.as_str() == other
    }
}

impl PartialEq<Name> for String {
    fn eq(&self, other: &Name) -> bool {
        self.as_str() == other.as_str()
    }
}

impl PartialEq<Name> for &str {
    fn eq(&self, other: &Name) -> bool {
        *self == other.as_str()
    }
}

impl From<Arc<str>> for Name {
    fn from(name: Arc<str>) -> Name {
        Name(Some(name))
    }
}

impl From<&str> for Name {
    fn from(name: &str) -> Name {
        Name((!name.is_empty()).then(|| Arc::from(name)))
    }
}

impl From<String> for Name {
    fn from(name: String) -> Name {
        Name((!name.is_empty()).then(|| Arc::from(name)))
    }
}

impl From<Name> for String {
    fn from(name: Name) -> String {
        name.as_str().to_owned()
    }
}

/// A `string` field, as prost writes one (nothing when empty).
pub(crate) fn encode_name(tag: u32, name: &str, buf: &mut impl BufMut) {
    if !name.is_empty() {
        encoding::encode_key(tag, WireType::LengthDelimited, buf);
        encoding::encode_varint(name.len() as u64, buf);
        buf.put_slice(name.as_bytes());
    }
}

/// What [`encode_name`] writes, in bytes.
pub(crate) fn name_len(tag: u32, name: &str) -> usize {
    if name.is_empty() {
        0
    } else {
        encoding::key_len(tag) + encoding::encoded_len_varint(name.len() as u64) + name.len()
    }
}

fn merge_name(
    wire_type: WireType,
    name: &mut Name,
    buf: &mut impl Buf,
    ctx: DecodeContext,
) -> Result<(), DecodeError> {
    let mut text = String::new();
    encoding::string::merge(wire_type, &mut text, buf, ctx)?;
    *name = Name::from(text);
    Ok(())
}

/// `Started { provider = 1; model = 2; attempt = 3; Tier tier = 4;
/// request_id = 5; repeated dropped = 6; resume_token = 7 }`.
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
pub struct Started {
    pub provider: Name,
    pub model: Name,
    /// 1-based attempt number across all targets.
    pub attempt: u32,
    /// A `Tier`.
    pub tier: i32,
    /// Switchyard's id for this request (also in the x-request-id header).
    pub request_id: Name,
    /// What this target's wire could not carry and was left out.
    pub dropped: Vec<String>,
    /// Names this stream's journal for `ResumeCompletion`; empty when the
    /// stream is not journaled.
    pub resume_token: Name,
}

mod started {
    pub const PROVIDER: u32 = 1;
    pub const MODEL: u32 = 2;
    pub const ATTEMPT: u32 = 3;
    pub const TIER: u32 = 4;
    pub const REQUEST_ID: u32 = 5;
    pub const DROPPED: u32 = 6;
    pub const RESUME_TOKEN: u32 = 7;
}

impl prost::Message for Started {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        use started::*;
        encode_name(PROVIDER, &self.provider, buf);
        encode_name(MODEL, &self.model, buf);
        if self.attempt != 0 {
            encoding::uint32::encode(ATTEMPT, &self.attempt, buf);
        }
        if self.tier != 0 {
            encoding::int32::encode(TIER, &self.tier, buf);
        }
        encode_name(REQUEST_ID, &self.request_id, buf);
        encoding::string::encode_repeated(DROPPED, &self.dropped, buf);
        encode_name(RESUME_TOKEN, &self.resume_token, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        use started::*;
        match tag {
            PROVIDER => merge_name(wire_type, &mut self.provider, buf, ctx),
            MODEL => merge_name(wire_type, &mut self.model, buf, ctx),
            ATTEMPT => encoding::uint32::merge(wire_type, &mut self.attempt, buf, ctx),
            TIER => encoding::int32::merge(wire_type, &mut self.tier, buf, ctx),
            REQUEST_ID => merge_name(wire_type, &mut self.request_id, buf, ctx),
            DROPPED => encoding::string::merge_repeated(wire_type, &mut self.dropped, buf, ctx),
            RESUME_TOKEN => merge_name(wire_type, &mut self.resume_token, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        use started::*;
        let attempt = if self.attempt != 0 {
            encoding::uint32::encoded_len(ATTEMPT, &self.attempt)
        } else {
            0
        };
        let tier = if self.tier != 0 {
            encoding::int32::encoded_len(TIER, &self.tier)
        } else {
            0
        };
        name_len(PROVIDER, &self.provider)
            + name_len(MODEL, &self.model)
            + attempt
            + tier
            + name_len(REQUEST_ID, &self.request_id)
            + encoding::string::encoded_len_repeated(DROPPED, &self.dropped)
            + name_len(RESUME_TOKEN, &self.resume_token)
    }

    fn clear(&mut self) {
        *self = Started::default();
    }
}

/// `ServedBy { provider = 1; model = 2 }`.
#[derive(Clone, PartialEq, Eq, Hash, Default, Debug)]
pub struct ServedBy {
    pub provider: Name,
    pub model: Name,
}

const SERVED_PROVIDER: u32 = 1;
const SERVED_MODEL: u32 = 2;

impl prost::Message for ServedBy {
    fn encode_raw(&self, buf: &mut impl BufMut) {
        encode_name(SERVED_PROVIDER, &self.provider, buf);
        encode_name(SERVED_MODEL, &self.model, buf);
    }

    fn merge_field(
        &mut self,
        tag: u32,
        wire_type: WireType,
        buf: &mut impl Buf,
        ctx: DecodeContext,
    ) -> Result<(), DecodeError> {
        match tag {
            SERVED_PROVIDER => merge_name(wire_type, &mut self.provider, buf, ctx),
            SERVED_MODEL => merge_name(wire_type, &mut self.model, buf, ctx),
            _ => encoding::skip_field(wire_type, tag, buf, ctx),
        }
    }

    fn encoded_len(&self) -> usize {
        name_len(SERVED_PROVIDER, &self.provider) + name_len(SERVED_MODEL, &self.model)
    }

    fn clear(&mut self) {
        *self = ServedBy::default();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use prost::Message;

    use super::*;

    fn string(tag: u32, s: &str, out: &mut Vec<u8>) {
        if !s.is_empty() {
            encoding::string::encode(tag, &s.to_string(), out);
        }
    }

    /// `Started`'s fields written by prost's own encoders, as the generated
    /// type wrote them.
    #[allow(clippy::too_many_arguments)]
    fn started_by_prost(
        provider: &str,
        model: &str,
        attempt: u32,
        tier: i32,
        request_id: &str,
        dropped: &[String],
        resume_token: &str,
    ) -> Vec<u8> {
        let mut out = Vec::new();
        string(1, provider, &mut out);
        string(2, model, &mut out);
        if attempt != 0 {
            encoding::uint32::encode(3, &attempt, &mut out);
        }
        if tier != 0 {
            encoding::int32::encode(4, &tier, &mut out);
        }
        string(5, request_id, &mut out);
        encoding::string::encode_repeated(6, dropped, &mut out);
        string(7, resume_token, &mut out);
        out
    }

    #[test]
    fn started_is_the_same_bytes_both_ways_as_the_generated_message() {
        let dropped = vec!["cache_control".to_string(), "reasoning".to_string()];
        for (provider, model, attempt, tier, request_id, dropped, token) in [
            ("", "", 0, 0, "", vec![], ""),
            ("primary", "gpt-4o-mini", 1, 1, "req-1", vec![], ""),
            ("é", "m", 300, 6, "r", dropped.clone(), "0123456789abcdef"),
            ("p", "", 2, 0, "", dropped, ""),
        ] {
            let started = Started {
                provider: provider.into(),
                model: model.into(),
                attempt,
                tier,
                request_id: request_id.into(),
                dropped: dropped.clone(),
                resume_token: token.into(),
            };
            let want =
                started_by_prost(provider, model, attempt, tier, request_id, &dropped, token);
            assert_eq!(started.encode_to_vec(), want, "{started:?}");
            assert_eq!(started.encoded_len(), want.len());
            assert_eq!(Started::decode(&want[..]).unwrap(), started);
        }
        // An unknown field is skipped; bad UTF-8 is an error.
        let mut unknown = started_by_prost("p", "m", 1, 1, "r", &[], "");
        encoding::uint32::encode(19, &7, &mut unknown);
        assert_eq!(Started::decode(&unknown[..]).unwrap().provider, "p");
        assert!(Started::decode(&[0x0a, 0x01, 0xff][..]).is_err());
    }

    #[test]
    fn served_by_is_the_same_bytes_both_ways_as_the_generated_message() {
        for (provider, model) in [("", ""), ("secondary", "claude-sonnet-4-5"), ("", "m")] {
            let served = ServedBy {
                provider: provider.into(),
                model: model.into(),
            };
            let mut want = Vec::new();
            string(1, provider, &mut want);
            string(2, model, &mut want);
            assert_eq!(served.encode_to_vec(), want);
            assert_eq!(served.encoded_len(), want.len());
            assert_eq!(ServedBy::decode(&want[..]).unwrap(), served);
        }
    }

    #[test]
    fn a_name_shares_its_string_and_reads_as_it() {
        let shared: Arc<str> = Arc::from("primary");
        let name = Name::from(shared.clone());
        assert_eq!(Arc::strong_count(&shared), 2, "shared, not copied");
        assert_eq!(name, "primary");
        assert_eq!(name.to_string(), "primary");
        assert_eq!(format!("{name:?}"), "\"primary\"");
        assert_eq!(Name::default(), Name::from(""));
        assert!(Name::default().is_empty());
    }
}
