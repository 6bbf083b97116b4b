//! The mock's `POST /v1/embeddings` (OpenAI's shape, one vector per input)
//! with a deterministic embedder the tests can reason about: the text is
//! lowercased and split into words (letters and digits), words on a short
//! English stop list are dropped, and each remaining word adds ±1 to one of
//! [`DIMENSIONS`] components picked by its hash. So two questions
//! with the same content words embed identically (similarity 1), and the
//! similarity of others is the cosine of their word counts (barring hash
//! collisions). Token ids embed as the words `t<id>`; `dimensions` cuts
//! the vectors, `encoding_format: "base64"` sends them as OpenAI does.
//! Logged like every request; the `hang`, `status`, `refuse` and
//! `slow_first_token` faults (as a delay) apply.

use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::response::Response;

use super::faults::{Fault, Preset};
use super::script::Step;
use super::server::{error_response, new_record, respond, status_response, unix_now, Shared};
use super::wire::{self, Gen, Parsed};
use super::MockKind;

/// Width of the mock's vectors.
pub const DIMENSIONS: usize = 512;

const STOP_WORDS: &[&str] = &[
    "a", "an", "the", "is", "are", "was", "be", "do", "does", "i", "me", "my", "you", "your", "we",
    "our", "it", "its", "of", "to", "in", "on", "for", "and", "or", "what", "whats", "how", "can",
    "could", "please", "tell", "s",
];

/// FNV-1a, then MurmurHash3's finalizer (FNV's low bits alone collide
/// too often for a power-of-two width).
fn word_hash(word: &str) -> u64 {
    let mut h = word.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// The mock's embedding of `text` (not normalised; all zeros for a text of
/// stop words only).
pub fn embed(text: &str) -> Vec<f32> {
    let mut v = vec![0.0f32; DIMENSIONS];
    let lower = text.to_lowercase();
    for word in lower
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty() && !STOP_WORDS.contains(w))
    {
        let h = word_hash(word);
        let sign = if h >> 63 == 0 { 1.0 } else { -1.0 };
        v[(h % DIMENSIONS as u64) as usize] += sign;
    }
    v
}

/// One input: a text, or token ids (embedded as the words `t<id>`).
struct Text {
    text: String,
    tokens: usize,
}

/// `input` as the texts to embed: a string, an array of strings, an array
/// of token ids, or an array of token-id arrays (as OpenAI takes them).
fn inputs(body: &serde_json::Value) -> Option<Vec<Text>> {
    use serde_json::Value;
    let text = |s: &str| Text {
        text: s.to_owned(),
        tokens: s.split_whitespace().count(),
    };
    let ids = |items: &[Value]| {
        items
            .iter()
            .map(|i| i.as_u64().map(|n| format!("t{n}")))
            .collect::<Option<Vec<_>>>()
            .filter(|v| !v.is_empty())
            .map(|words| Text {
                tokens: words.len(),
                text: words.join(" "),
            })
    };
    match body.get("input")? {
        Value::String(s) => Some(vec![text(s)]),
        Value::Array(items) if items.first().is_some_and(Value::is_number) => {
            Some(vec![ids(items)?])
        }
        Value::Array(items) => items
            .iter()
            .map(|i| match i {
                Value::String(s) => Some(text(s)),
                Value::Array(a) => ids(a),
                _ => None,
            })
            .collect::<Option<Vec<_>>>()
            .filter(|v| !v.is_empty()),
        _ => None,
    }
}

/// One vector as the body carries it: numbers, or base64 of little-endian
/// f32 when the request asked for `encoding_format: "base64"`; cut to the
/// asked `dimensions`.
fn encoded(mut v: Vec<f32>, dimensions: Option<usize>, base64: bool) -> serde_json::Value {
    use base64::Engine;
    if let Some(d) = dimensions {
        v.truncate(d);
    }
    if base64 {
        let bytes: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        base64::engine::general_purpose::STANDARD
            .encode(bytes)
            .into()
    } else {
        v.into()
    }
}

pub(super) async fn embeddings(State(s): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let bytes = axum::body::to_bytes(body, 1 << 20)
        .await
        .unwrap_or_default();
    let json: serde_json::Value = serde_json::from_slice(&bytes).unwrap_or_default();
    let parsed = Parsed::from_body(MockKind::Openai, &json);
    let cfg = s.config();
    let record = new_record(MockKind::Openai, &parts, &json, &parsed);
    let attempt = s.log.begin(record, cfg.max_concurrency);
    let gen = Gen::new(MockKind::Openai, parsed, attempt.seq(), 0, unix_now());
    if attempt.over_capacity() {
        let (status, body) = wire::over_capacity(MockKind::Openai, &gen.request_id());
        return error_response(&gen, attempt, status, body, &Default::default(), None);
    }
    let fault = s.pick_fault();
    if fault != Fault::None {
        attempt.set_fault(Some(fault.name()));
    }
    match fault {
        Fault::Hang => {
            let _attempt = attempt;
            std::future::pending::<()>().await;
            unreachable!("a pending future never resolves")
        }
        Fault::Status { .. } => return status_response(&gen, attempt, &fault),
        Fault::Refuse { .. } => {
            let steps = vec![Step::Abort { reset: true }];
            return respond(&gen, attempt, 200, steps, None, false);
        }
        Fault::SlowFirstToken { delay_ms } => {
            tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        }
        _ => {}
    }
    let Some(texts) = inputs(&json) else {
        let (status, mut body) = wire::preset_error(
            MockKind::Openai,
            Preset::Invalid,
            gen.model_name(),
            &gen.request_id(),
        );
        body["error"]["message"] =
            "'input' must be a string, a non-empty array of strings, or token ids".into();
        return error_response(&gen, attempt, status, body, &Default::default(), None);
    };
    let dimensions = json
        .get("dimensions")
        .and_then(serde_json::Value::as_u64)
        .map(|d| d.clamp(1, DIMENSIONS as u64) as usize);
    let base64 = json.get("encoding_format").and_then(|f| f.as_str()) == Some("base64");
    let tokens: usize = texts.iter().map(|t| t.tokens).sum();
    let data: Vec<serde_json::Value> = texts
        .iter()
        .enumerate()
        .map(|(i, t)| {
            let embedding = encoded(embed(&t.text), dimensions, base64);
            serde_json::json!({"object": "embedding", "index": i, "embedding": embedding})
        })
        .collect();
    let body = serde_json::json!({
        "object": "list",
        "data": data,
        "model": gen.model_name(),
        "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
    });
    let steps = vec![Step::Data(Bytes::from(body.to_string()), 0)];
    respond(&gen, attempt, 200, steps, None, false)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn cos(a: &[f32], b: &[f32]) -> f32 {
        let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
        dot / (n(a) * n(b))
    }

    #[test]
    fn content_words_decide_the_similarity() {
        let a = embed("What is your refund policy?");
        assert!((cos(&a, &embed("what's the refund policy")) - 1.0).abs() < 1e-6);
        // Two of three content words shared: 2 / sqrt(2 * 3).
        let b = embed("refund policy for shoes");
        assert!(
            (cos(&a, &b) - 2.0 / 6f32.sqrt()).abs() < 1e-6,
            "{}",
            cos(&a, &b)
        );
        assert!(cos(&a, &embed("How do I reset my password?")).abs() < 0.5);
        assert!(embed("what is it").iter().all(|x| *x == 0.0));
    }
}
