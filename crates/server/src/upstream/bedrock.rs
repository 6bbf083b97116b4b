//! Anthropic models on Amazon Bedrock: `POST
//! {base_url}/model/{model}/invoke-with-response-stream`, signed with SigV4
//! (service `bedrock`, AWS's own `aws-sigv4`), the Anthropic Messages body
//! with `anthropic_version = "bedrock-2023-05-31"` and no `model`/`stream`.
//! The answer is the binary AWS event stream (`aws-smithy-eventstream`:
//! prelude and message CRCs checked); each `chunk` event carries a base64
//! Anthropic event, which [`Frames`] hands to the Anthropic decoder as the
//! SSE event it would have been. Exception frames and `x-amzn-ErrorType`
//! errors are classified like their Anthropic counterparts.

use std::time::SystemTime;

use aws_smithy_eventstream::frame::{DecodedFrame, MessageFrameDecoder};
use aws_smithy_types::event_stream::{HeaderValue as FrameValue, Message};
use base64::Engine;
use bytes::{Buf, BytesMut};
use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use crate::policy::outcome::{Failure, OutcomeClass};
use crate::upstream::sse::SseEvent;
use crate::upstream::wire::{Auth, Body, Call, Framer, Quirks, Refused, Wire, WireRequest};
use crate::upstream::{anthropic, classify, ChatRequest, Dialect, Dropped, StreamDecoder};

/// AWS credentials, from the standard environment variables.
#[derive(Clone)]
pub struct AwsCredentials {
    pub access_key_id: String,
    pub secret_access_key: crate::upstream::endpoint::Secret,
    pub session_token: Option<crate::upstream::endpoint::Secret>,
}

impl std::fmt::Debug for AwsCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AwsCredentials(***)")
    }
}

/// Anthropic Messages on Bedrock (`kind = "bedrock_anthropic"`).
pub struct BedrockWire;

/// The `bedrock_anthropic` kind's wire.
pub static WIRE: BedrockWire = BedrockWire;

impl Wire for BedrockWire {
    fn name(&self) -> &'static str {
        "bedrock_anthropic"
    }

    fn dialect(&self) -> Dialect {
        Dialect::Anthropic
    }

    fn quirks(&self) -> Quirks {
        Quirks {
            auth: Auth::AwsSigV4,
            service_tiers: &[],
            ..anthropic::WIRE.quirks()
        }
    }

    /// The exact body bytes are signed (SigV4), so they are serialised
    /// here, not by the HTTP client.
    fn request(&self, call: &Call<'_>, dropped: &mut Dropped) -> Result<WireRequest, Failure> {
        let ep = call.endpoint;
        let url = endpoint(&ep.base_url, &call.chat.model);
        let body = serde_json::to_vec(&build_body(call.chat, dropped)).unwrap_or_default();
        let mut headers = HeaderMap::new();
        headers.insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        headers.insert(
            http::header::ACCEPT,
            HeaderValue::from_static("application/vnd.amazon.eventstream"),
        );
        let (Some(creds), Some(region)) = (ep.aws.as_ref(), ep.region.as_deref()) else {
            return Err(Failure::new(
                OutcomeClass::Auth,
                "no AWS credentials or region",
            ));
        };
        let signed = sign(&url, &headers, &body, region, creds, call.now)
            .map_err(|e| Failure::new(OutcomeClass::Auth, e))?;
        headers.extend(signed);
        Ok(WireRequest {
            url: url.into(),
            headers,
            body: Body::Bytes(body.into()),
        })
    }

    fn framer(&self) -> Box<dyn Framer> {
        Box::new(Frames::default())
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        anthropic::WIRE.decoder()
    }

    /// Bedrock names its error in a header; the name is the class.
    fn refused(&self, status: u16, headers: &HeaderMap, body: &[u8]) -> Refused {
        let mut failure = classify::classify_http(status, headers, body);
        let named = headers
            .get("x-amzn-errortype")
            .and_then(|v| v.to_str().ok())
            .and_then(class_of);
        if let Some(class) = named {
            failure.class = class;
        }
        Refused::Failed(failure)
    }
}

/// The largest event-stream message taken (the SSE event bound).
pub const MAX_FRAME: usize = 4 * 1024 * 1024;

/// The streaming invoke URL; the model id (`anthropic.claude-…-v1:0`) is
/// percent-encoded.
pub fn endpoint(base_url: &str, model: &str) -> String {
    format!(
        "{}/model/{}/invoke-with-response-stream",
        base_url.trim_end_matches('/'),
        crate::upstream::encode_path_segment(model)
    )
}

/// Anthropic's body with Bedrock's version and without `model` or `stream`.
pub fn build_body(req: &ChatRequest, dropped: &mut Dropped) -> Value {
    let mut body = anthropic::build_body(req, anthropic::Host::Cloud, dropped);
    if let Some(o) = body.as_object_mut() {
        o.remove("model");
        o.remove("stream");
        o.insert(
            "anthropic_version".into(),
            Value::from("bedrock-2023-05-31"),
        );
        // Bedrock takes Anthropic's beta header in the body.
        let betas = req
            .passthrough_for(crate::chat::Dialect::Anthropic)
            .into_iter()
            .flat_map(|p| &p.headers)
            .filter(|(name, _)| name == "anthropic-beta")
            .flat_map(|(_, v)| v.split(',').map(str::trim).filter(|b| !b.is_empty()))
            .map(Value::from)
            .collect::<Vec<_>>();
        if !betas.is_empty() {
            o.insert("anthropic_beta".into(), Value::Array(betas));
        }
    }
    body
}

/// The SigV4 headers (`authorization`, `x-amz-date`, and the session token
/// when there is one) for a POST of `body` to `url`, marked sensitive.
pub fn sign(
    url: &str,
    headers: &HeaderMap,
    body: &[u8],
    region: &str,
    creds: &AwsCredentials,
    now: SystemTime,
) -> Result<HeaderMap, String> {
    use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
    let identity = aws_credential_types::Credentials::new(
        creds.access_key_id.clone(),
        creds.secret_access_key.expose().to_string(),
        creds.session_token.as_ref().map(|t| t.expose().to_string()),
        None,
        "switchyard-env",
    )
    .into();
    let params = aws_sigv4::sign::v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name("bedrock")
        .time(now)
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| format!("SigV4 parameters: {e}"))?
        .into();
    let pairs: Vec<(&str, &str)> = headers
        .iter()
        .filter_map(|(k, v)| Some((k.as_str(), v.to_str().ok()?)))
        .collect();
    let signable = SignableRequest::new("POST", url, pairs.into_iter(), SignableBody::Bytes(body))
        .map_err(|e| format!("SigV4 request: {e}"))?;
    let (instructions, _) = sign(signable, &params)
        .map_err(|e| format!("SigV4 signing: {e}"))?
        .into_parts();
    let mut out = HeaderMap::new();
    for (name, value) in instructions.headers() {
        let (Ok(name), Ok(mut value)) = (
            HeaderName::from_bytes(name.as_bytes()),
            HeaderValue::from_str(value),
        ) else {
            continue;
        };
        value.set_sensitive(true);
        out.insert(name, value);
    }
    Ok(out)
}

/// A Bedrock error name (`x-amzn-ErrorType`, or an exception frame's
/// `:exception-type`) as an outcome class; `None` for names it does not know.
pub fn class_of(error_type: &str) -> Option<OutcomeClass> {
    // `ThrottlingException:http://internal.amazon.com/...` carries a suffix.
    let name = error_type.split(':').next().unwrap_or("").trim();
    let name = name.trim_end_matches("Exception").to_ascii_lowercase();
    Some(match name.as_str() {
        "throttling" | "toomanyrequests" | "modelnotready" => OutcomeClass::RateLimited,
        "servicequotaexceeded" => OutcomeClass::Quota,
        "serviceunavailable" => OutcomeClass::Overloaded,
        "internalserver" | "modelstreamerror" | "modelerror" => OutcomeClass::ServerError,
        "modeltimeout" => OutcomeClass::Timeout,
        "validation" => OutcomeClass::Invalid,
        "accessdenied" | "unrecognizedclient" | "expiredtoken" => OutcomeClass::Auth,
        "resourcenotfound" => OutcomeClass::NotFound,
        _ => return None,
    })
}

/// Event-stream framing: bytes in, the Anthropic events the `chunk`
/// frames carry out, as SSE events. A bad CRC, an oversized frame or an
/// exception frame ends the attempt.
pub struct Frames {
    buf: BytesMut,
    decoder: MessageFrameDecoder,
    /// `buf` begins a frame (the decoder has not taken its prelude yet).
    at_start: bool,
}

impl Default for Frames {
    fn default() -> Self {
        Frames {
            buf: BytesMut::new(),
            decoder: MessageFrameDecoder::new(),
            at_start: true,
        }
    }
}

fn header<'a>(m: &'a Message, name: &str) -> Option<&'a str> {
    m.headers()
        .iter()
        .find(|h| h.name().as_str() == name)
        .and_then(|h| match h.value() {
            FrameValue::String(s) => Some(s.as_str()),
            _ => None,
        })
}

impl Framer for Frames {
    fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), Failure> {
        Frames::feed(self, bytes, out)
    }

    fn finish(&mut self, _out: &mut Vec<SseEvent>) -> Result<(), Failure> {
        Frames::finish(self)
    }
}

impl Frames {
    pub fn feed(&mut self, bytes: &[u8], out: &mut Vec<SseEvent>) -> Result<(), Failure> {
        self.buf.extend_from_slice(bytes);
        loop {
            // The prelude's total length bounds a frame before it is buffered.
            if self.at_start && self.buf.len() >= 4 {
                let total = (&self.buf[..4]).get_u32() as usize;
                if total > MAX_FRAME {
                    return Err(Failure::new(
                        OutcomeClass::Protocol,
                        format!("an event-stream frame of {total} bytes exceeds {MAX_FRAME}"),
                    ));
                }
            }
            let before = self.buf.len();
            match self.decoder.decode_frame(&mut self.buf) {
                Ok(DecodedFrame::Incomplete) => {
                    // The decoder keeps a prelude it took; the rest follows.
                    if self.buf.len() < before {
                        self.at_start = false;
                    }
                    return Ok(());
                }
                Ok(DecodedFrame::Complete(message)) => {
                    self.at_start = true;
                    out.push(event_of(&message)?)
                }
                Err(e) => {
                    return Err(Failure::new(
                        OutcomeClass::Protocol,
                        format!("malformed event-stream frame: {e}"),
                    ))
                }
            }
        }
    }

    /// The body ended: bytes of a partial frame are a truncation.
    pub fn finish(&mut self) -> Result<(), Failure> {
        if self.buf.is_empty() && self.at_start {
            Ok(())
        } else {
            Err(Failure::new(
                OutcomeClass::Truncated,
                format!(
                    "the stream ended inside an event-stream frame ({} bytes)",
                    self.buf.len()
                ),
            ))
        }
    }
}

/// One frame as the SSE event the Anthropic decoder reads.
fn event_of(m: &Message) -> Result<SseEvent, Failure> {
    match header(m, ":message-type") {
        Some("event") => {}
        Some("exception") | Some("error") => {
            let kind = header(m, ":exception-type")
                .or_else(|| header(m, ":error-code"))
                .unwrap_or("unknownException");
            let text = String::from_utf8_lossy(m.payload());
            let message = serde_json::from_str::<Value>(&text)
                .ok()
                .and_then(|v| v["message"].as_str().map(str::to_string))
                .unwrap_or_else(|| text.chars().take(256).collect());
            let class = class_of(kind).unwrap_or(OutcomeClass::ServerError);
            return Err(Failure::new(class, format!("bedrock {kind}: {message}")));
        }
        other => {
            return Err(Failure::new(
                OutcomeClass::Protocol,
                format!("event-stream frame with :message-type {other:?}"),
            ))
        }
    }
    if header(m, ":event-type") != Some("chunk") {
        // Unknown event types are skipped, as the Anthropic stream skips them.
        return Ok(SseEvent {
            event: Some("ping".into()),
            data: "{\"type\":\"ping\"}".into(),
            ..SseEvent::default()
        });
    }
    let bad = |why: &str| Failure::new(OutcomeClass::Protocol, format!("bedrock chunk: {why}"));
    let v: Value = serde_json::from_slice(m.payload()).map_err(|_| bad("payload is not JSON"))?;
    let b64 = v["bytes"].as_str().ok_or_else(|| bad("no `bytes`"))?;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .map_err(|_| bad("`bytes` is not base64"))?;
    let data = String::from_utf8(raw).map_err(|_| bad("event is not UTF-8"))?;
    let kind = serde_json::from_str::<Value>(&data)
        .ok()
        .and_then(|e| e["type"].as_str().map(str::to_string));
    Ok(SseEvent {
        event: kind,
        data,
        ..SseEvent::default()
    })
}

/// Encodes one frame (the mock's side, and tests).
pub fn frame(headers: &[(&str, &str)], payload: &[u8]) -> Vec<u8> {
    let mut m = Message::new(bytes::Bytes::copy_from_slice(payload));
    for (k, v) in headers {
        m = m.add_header(aws_smithy_types::event_stream::Header::new(
            k.to_string(),
            FrameValue::String(v.to_string().into()),
        ));
    }
    let mut out = Vec::new();
    let _ = aws_smithy_eventstream::frame::write_message_to(&m, &mut out);
    out
}

/// A `chunk` frame carrying one Anthropic event (JSON text).
pub fn chunk_frame(event_json: &str) -> Vec<u8> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(event_json.as_bytes());
    frame(
        &[
            (":message-type", "event"),
            (":event-type", "chunk"),
            (":content-type", "application/json"),
        ],
        serde_json::json!({ "bytes": b64 }).to_string().as_bytes(),
    )
}

/// An exception frame.
pub fn exception_frame(kind: &str, message: &str) -> Vec<u8> {
    frame(
        &[
            (":message-type", "exception"),
            (":exception-type", kind),
            (":content-type", "application/json"),
        ],
        serde_json::json!({ "message": message })
            .to_string()
            .as_bytes(),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn chunk_frames_become_the_anthropic_events_they_carry_under_any_split() {
        let ev =
            r#"{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"hi"}}"#;
        let mut bytes = chunk_frame(ev);
        bytes.extend(chunk_frame(r#"{"type":"message_stop"}"#));
        for cut in 1..bytes.len() {
            let (mut f, mut out) = (Frames::default(), Vec::new());
            f.feed(&bytes[..cut], &mut out).unwrap();
            f.feed(&bytes[cut..], &mut out).unwrap();
            f.finish().unwrap();
            assert_eq!(out.len(), 2, "cut at {cut}");
            assert_eq!(out[0].event.as_deref(), Some("content_block_delta"));
            assert_eq!(out[0].data, ev);
            assert_eq!(out[1].event.as_deref(), Some("message_stop"));
        }
    }

    #[test]
    fn a_bad_crc_or_a_cut_frame_is_never_taken() {
        let mut bytes = chunk_frame(r#"{"type":"message_stop"}"#);
        let last = bytes.len() - 1;
        bytes[last] ^= 0xff;
        let mut out = Vec::new();
        let e = Frames::default().feed(&bytes, &mut out).unwrap_err();
        assert_eq!(e.class, OutcomeClass::Protocol);
        let whole = chunk_frame(r#"{"type":"message_stop"}"#);
        let mut f = Frames::default();
        f.feed(&whole[..whole.len() - 3], &mut out).unwrap();
        assert_eq!(f.finish().unwrap_err().class, OutcomeClass::Truncated);
    }

    #[test]
    fn exception_frames_and_error_types_are_classified() {
        let mut out = Vec::new();
        let e = Frames::default()
            .feed(
                &exception_frame("throttlingException", "slow down"),
                &mut out,
            )
            .unwrap_err();
        assert_eq!(e.class, OutcomeClass::RateLimited);
        let e = Frames::default()
            .feed(
                &exception_frame("modelStreamErrorException", "boom"),
                &mut out,
            )
            .unwrap_err();
        assert_eq!(e.class, OutcomeClass::ServerError);
        assert_eq!(
            class_of("ThrottlingException:http://internal.amazon.com/coral/com.amazon.bedrock/"),
            Some(OutcomeClass::RateLimited)
        );
        assert_eq!(
            class_of("ServiceUnavailableException"),
            Some(OutcomeClass::Overloaded)
        );
        assert_eq!(class_of("ValidationException"), Some(OutcomeClass::Invalid));
        assert_eq!(class_of("AccessDeniedException"), Some(OutcomeClass::Auth));
        assert_eq!(
            class_of("ServiceQuotaExceededException"),
            Some(OutcomeClass::Quota)
        );
    }

    #[test]
    fn the_body_is_anthropics_with_bedrocks_version_and_the_request_is_signed() {
        let body = build_body(
            &ChatRequest {
                model: "anthropic.claude-sonnet-4-5-20250929-v1:0".into(),
                stream: true,
                ..Default::default()
            },
            &mut crate::upstream::Dropped::default(),
        );
        assert_eq!(body["anthropic_version"], "bedrock-2023-05-31");
        assert!(body.get("model").is_none() && body.get("stream").is_none());
        let url = endpoint(
            "https://bedrock-runtime.us-east-1.amazonaws.com",
            "anthropic.claude-sonnet-4-5-20250929-v1:0",
        );
        assert!(url.ends_with(
            "/model/anthropic.claude-sonnet-4-5-20250929-v1%3A0/invoke-with-response-stream"
        ));
        let creds = AwsCredentials {
            access_key_id: "AKIDEXAMPLE".into(),
            secret_access_key: crate::upstream::endpoint::Secret::new(
                "wJalrXUtnFEMI/K7MDENG+bPxRfiCYEXAMPLEKEY".into(),
            ),
            session_token: None,
        };
        let mut h = HeaderMap::new();
        h.insert("content-type", HeaderValue::from_static("application/json"));
        let signed = sign(&url, &h, b"{}", "us-east-1", &creds, SystemTime::UNIX_EPOCH).unwrap();
        let auth = signed["authorization"].to_str().unwrap();
        assert!(
            auth.starts_with(
                "AWS4-HMAC-SHA256 Credential=AKIDEXAMPLE/19700101/us-east-1/bedrock/aws4_request"
            ),
            "{auth}"
        );
        assert!(signed["authorization"].is_sensitive());
        assert!(signed.contains_key("x-amz-date"));
    }
}
