//! The embeddings wire: OpenAI's `POST {base_url}/embeddings` (also served
//! by vLLM, llama.cpp, Ollama and TEI). Builds the request (one question for
//! the semantic cache, or a caller's batch for `/v1/embeddings` and
//! `Router.Embed`), bounds and checks the answer (one finite vector of a
//! sane dimension per input, as numbers or as base64 of little-endian f32)
//! and classifies failures like any upstream's. A server that answers one
//! vector per token (llama-cpp-python for a model without a pooling layer)
//! is mean-pooled. Knows nothing of actors: admission and the outcome
//! report are the caller's.

use serde_json::Value;

use crate::policy::outcome::{Failure, OutcomeClass};
use crate::upstream::endpoint::Endpoint;
use crate::upstream::{classify, openai};

/// Largest embeddings response read for one question (a 4096-dimension
/// float vector as JSON text is well under 100 KB).
pub const MAX_BODY: usize = 4 * 1024 * 1024;
/// Largest error body read.
const MAX_ERROR_BODY: usize = 64 * 1024;
/// Widest vector accepted.
pub const MAX_DIMENSION: usize = 16_384;
/// Most per-token vectors pooled.
const MAX_TOKENS: usize = 8192;

/// The request body for one input.
pub fn body(model: &str, input: &str) -> Value {
    serde_json::json!({
        "model": model,
        "input": input,
        "encoding_format": "float",
    })
}

fn malformed(why: impl std::fmt::Display) -> Failure {
    classify::in_body(
        OutcomeClass::Protocol,
        format!("malformed embeddings response: {why}"),
    )
}

/// The first (only) vector of an embeddings response.
pub fn parse(body: &[u8]) -> Result<Vec<f32>, Failure> {
    let v = answer(body)?;
    let first = data(&v)?
        .iter()
        .find(|d| d.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        .ok_or_else(|| malformed("`data` is empty"))?;
    decode(
        first
            .get("embedding")
            .ok_or_else(|| malformed("`data[0]` has no `embedding`"))?,
    )
}

/// An answer's JSON, or the error object it carries (in a 200) classified.
fn answer(body: &[u8]) -> Result<Value, Failure> {
    let v: Value = serde_json::from_slice(body).map_err(malformed)?;
    if v.get("error").is_some_and(|e| !e.is_null()) {
        return Err(classify::classify_error_object(&v, Some(200)));
    }
    Ok(v)
}

/// An answer's `data` array.
fn data(v: &Value) -> Result<&Vec<Value>, Failure> {
    v.get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("no `data` array"))
}

/// One vector of finite numbers.
fn vector(numbers: &[Value]) -> Result<Vec<f32>, Failure> {
    if numbers.is_empty() || numbers.len() > MAX_DIMENSION {
        return Err(malformed(format!(
            "{} dimensions (1..={MAX_DIMENSION} accepted)",
            numbers.len()
        )));
    }
    numbers
        .iter()
        .map(|n| {
            n.as_f64()
                .map(|x| x as f32)
                .filter(|x| x.is_finite())
                .ok_or_else(|| malformed("a component is not a finite number"))
        })
        .collect()
}

/// The mean of per-token vectors (all of one dimension).
fn mean_pool(tokens: &[Value]) -> Result<Vec<f32>, Failure> {
    if tokens.len() > MAX_TOKENS {
        return Err(malformed(format!(
            "{} token vectors (at most {MAX_TOKENS})",
            tokens.len()
        )));
    }
    let mut sum: Vec<f32> = Vec::new();
    for t in tokens {
        let v = vector(
            t.as_array()
                .ok_or_else(|| malformed("a token vector is not an array"))?,
        )?;
        if sum.is_empty() {
            sum = v;
        } else if v.len() != sum.len() {
            return Err(malformed("token vectors of different dimensions"));
        } else {
            sum.iter_mut().zip(&v).for_each(|(s, x)| *s += x);
        }
    }
    let n = tokens.len() as f32;
    Ok(sum.into_iter().map(|s| s / n).collect())
}

/// Embeds `input` with `model` at the endpoint. Transport errors, non-2xx
/// answers and bodies that are not one vector come back classified.
pub async fn fetch(endpoint: &Endpoint, model: &str, input: &str) -> Result<Vec<f32>, Failure> {
    let body = send(endpoint, &body(model, input), MAX_BODY).await?;
    parse(&body)
}

/// What a caller's batch embeds: texts, or token ids (forwarded as they are:
/// every `embeddings` target is an OpenAI-compatible server).
#[derive(Debug, Clone, PartialEq)]
pub enum Input {
    Texts(Vec<String>),
    Tokens(Vec<Vec<u32>>),
}

impl Input {
    /// How many vectors the answer must hold.
    pub fn len(&self) -> usize {
        match self {
            Input::Texts(t) => t.len(),
            Input::Tokens(t) => t.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One upstream call for a caller's batch.
#[derive(Debug, Clone, Copy)]
pub struct Batch<'a> {
    /// The target's model.
    pub model: &'a str,
    pub input: &'a Input,
    /// Asked of models that can shorten their vectors (`dimensions`).
    pub dimensions: Option<u32>,
    /// The caller's end-user id, passed on.
    pub user: Option<&'a str>,
    /// Ask for base64 (a third of the bytes of JSON numbers); an upstream
    /// that ignores it and sends numbers is read all the same.
    pub base64: bool,
}

impl Batch<'_> {
    /// The request body.
    pub fn body(&self) -> Value {
        let input = match self.input {
            Input::Texts(t) => serde_json::json!(t),
            Input::Tokens(t) => serde_json::json!(t),
        };
        let mut body = serde_json::json!({
            "model": self.model,
            "input": input,
            "encoding_format": if self.base64 { "base64" } else { "float" },
        });
        if let Some(d) = self.dimensions {
            body["dimensions"] = d.into();
        }
        if let Some(u) = self.user {
            body["user"] = u.into();
        }
        body
    }
}

/// A batch's answer: one vector per input, in input order.
#[derive(Debug, Clone, PartialEq)]
pub struct Vectors {
    pub vectors: Vec<Vec<f32>>,
    /// `usage.prompt_tokens`, when the upstream sent it.
    pub prompt_tokens: Option<u32>,
}

/// Embeds a caller's batch at the endpoint, reading at most `max_body`
/// bytes of answer. Transport errors, non-2xx answers and bodies that are
/// not one vector per input (all of one dimension, the asked one if any)
/// come back classified.
pub async fn fetch_batch(
    endpoint: &Endpoint,
    batch: &Batch<'_>,
    max_body: usize,
) -> Result<Vectors, Failure> {
    let body = send(endpoint, &batch.body(), max_body).await?;
    parse_batch(&body, batch.input.len(), batch.dimensions)
}

/// Sends one embeddings request; the answer's bytes (at most `max_body`),
/// or the failure classified. The answer's headers must come within the
/// provider's `first_token_timeout`.
async fn send(endpoint: &Endpoint, body: &Value, max_body: usize) -> Result<Vec<u8>, Failure> {
    let now = tokio::time::Instant::now();
    let lease = match &endpoint.keys {
        Some(pool) => Some(pool.pick(now, &[])?),
        None => None,
    };
    let key = match (&lease, &endpoint.keys) {
        (Some(l), Some(pool)) => Some(pool.keys[l.index].secret.expose()),
        _ => endpoint.api_key.as_ref().map(|k| k.expose()),
    };
    let url = format!("{}/embeddings", endpoint.base_url.trim_end_matches('/'));
    // Counted on its connection until the answer is read.
    let slot = endpoint.http.take();
    let request = slot
        .client()
        .post_json(&url, openai::auth_headers(key), body);
    let response = tokio::time::timeout(endpoint.first_token_timeout, request)
        .await
        .map_err(|_| {
            Failure::new(
                OutcomeClass::Timeout,
                format!(
                    "no embeddings answer within {:?} (first_token_timeout)",
                    endpoint.first_token_timeout
                ),
            )
        })?
        .map_err(|e| classify::classify_transport(&e))?;
    let status = response.status();
    if !status.is_success() {
        let headers = response.headers().clone();
        let body = crate::upstream::client::read_capped(response, MAX_ERROR_BODY).await;
        let mut failure = classify::classify_http(status.as_u16(), &headers, &body);
        failure.message = endpoint.redact(&failure.message);
        return Err(failure);
    }
    let body = crate::upstream::client::read_capped(response, max_body + 1).await;
    if body.len() > max_body {
        return Err(malformed(format!("larger than {max_body} bytes")));
    }
    Ok(body)
}

/// Every vector of a batch's answer, in input order: `expected` of them, of
/// one dimension (`dimensions` when asked), each as numbers, per-token
/// numbers (pooled) or base64 of little-endian f32.
pub fn parse_batch(
    body: &[u8],
    expected: usize,
    dimensions: Option<u32>,
) -> Result<Vectors, Failure> {
    let v = answer(body)?;
    let data = data(&v)?;
    if data.len() != expected {
        return Err(malformed(format!(
            "{} vectors for {expected} inputs",
            data.len()
        )));
    }
    let mut slots: Vec<Option<Vec<f32>>> = vec![None; expected];
    for (i, item) in data.iter().enumerate() {
        let index = match item.get("index") {
            None => i,
            Some(x) => x
                .as_u64()
                .and_then(|x| usize::try_from(x).ok())
                .filter(|x| *x < expected)
                .ok_or_else(|| malformed(format!("`data[{i}].index` is out of range")))?,
        };
        let embedding = item
            .get("embedding")
            .ok_or_else(|| malformed(format!("`data[{i}]` has no `embedding`")))?;
        let vector = decode(embedding)?;
        if slots[index].replace(vector).is_some() {
            return Err(malformed(format!("two vectors for index {index}")));
        }
    }
    let vectors: Vec<Vec<f32>> = slots.into_iter().flatten().collect();
    let width = vectors.first().map_or(0, Vec::len);
    if vectors.iter().any(|v| v.len() != width) {
        return Err(malformed("vectors of different dimensions"));
    }
    if let Some(d) = dimensions.filter(|d| *d as usize != width) {
        return Err(malformed(format!(
            "{width} dimensions where {d} were asked"
        )));
    }
    let prompt_tokens = v
        .pointer("/usage/prompt_tokens")
        .and_then(Value::as_u64)
        .map(|n| u32::try_from(n).unwrap_or(u32::MAX));
    Ok(Vectors {
        vectors,
        prompt_tokens,
    })
}

/// One `embedding` value: numbers, per-token numbers (pooled), or base64.
fn decode(embedding: &Value) -> Result<Vec<f32>, Failure> {
    match embedding {
        Value::String(b64) => from_base64(b64),
        Value::Array(numbers) if numbers.first().is_some_and(Value::is_array) => mean_pool(numbers),
        Value::Array(numbers) => vector(numbers),
        _ => Err(malformed("an `embedding` is neither numbers nor base64")),
    }
}

/// Base64 of little-endian f32 (OpenAI's `encoding_format: "base64"`).
fn from_base64(text: &str) -> Result<Vec<f32>, Failure> {
    use base64::Engine;
    if text.len() > (MAX_DIMENSION * 4).div_ceil(3) * 4 {
        return Err(malformed(format!(
            "a base64 vector wider than {MAX_DIMENSION} dimensions"
        )));
    }
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|e| malformed(format!("a base64 vector: {e}")))?;
    if bytes.is_empty() || bytes.len() % 4 != 0 {
        return Err(malformed(format!(
            "a base64 vector of {} bytes (not a whole number of f32)",
            bytes.len()
        )));
    }
    bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .map(|x| {
            x.is_finite()
                .then_some(x)
                .ok_or_else(|| malformed("a component is not a finite number"))
        })
        .collect()
}

/// A vector as base64 of little-endian f32, as OpenAI sends it.
pub fn to_base64(vector: &[f32]) -> String {
    use base64::Engine;
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn reads_openai_and_llama_cpp_shapes() {
        // OpenAI's documented shape.
        let openai = br#"{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.1,-0.2,0.3]}],"model":"text-embedding-3-small","usage":{"prompt_tokens":5,"total_tokens":5}}"#;
        assert_eq!(parse(openai).unwrap(), vec![0.1, -0.2, 0.3]);
        // llama.cpp's server leaves out `index` on older builds.
        let llama = br#"{"data":[{"embedding":[1,2]}]}"#;
        assert_eq!(parse(llama).unwrap(), vec![1.0, 2.0]);
        // llama-cpp-python, a model without pooling: one vector per token, averaged.
        let tokens = br#"{"data":[{"embedding":[[1,2],[3,6]],"index":0}]}"#;
        assert_eq!(parse(tokens).unwrap(), vec![2.0, 4.0]);
        let ragged = br#"{"data":[{"embedding":[[1,2],[3]]}]}"#;
        assert_eq!(parse(ragged).unwrap_err().class, OutcomeClass::Protocol);
        assert_eq!(
            body("m", "q"),
            serde_json::json!({"model": "m", "input": "q", "encoding_format": "float"})
        );
    }

    #[test]
    fn anything_but_one_finite_vector_is_a_protocol_failure() {
        for bad in [
            &b"not json"[..],
            br#"{"data":[]}"#,
            br#"{"data":[{"embedding":[]}]}"#,
            br#"{"data":[{"embedding":"AAAA"}]}"#,
            br#"{"data":[{"embedding":[1,"x"]}]}"#,
            br#"{"data":[{"embedding":[1e400]}]}"#,
            br#"{"object":"list"}"#,
        ] {
            let f = parse(bad).unwrap_err();
            assert_eq!(
                f.class,
                OutcomeClass::Protocol,
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
        let wide = format!(
            r#"{{"data":[{{"embedding":[{}]}}]}}"#,
            vec!["0.1"; MAX_DIMENSION + 1].join(",")
        );
        assert_eq!(
            parse(wide.as_bytes()).unwrap_err().class,
            OutcomeClass::Protocol
        );
        // An error object in a 200 is classified by its type.
        let overloaded = br#"{"error":{"type":"overloaded_error","message":"busy"}}"#;
        assert_eq!(
            parse(overloaded).unwrap_err().class,
            OutcomeClass::Overloaded
        );
    }

    #[test]
    fn a_batch_is_read_in_input_order_from_numbers_or_base64() {
        let a = to_base64(&[0.5, -1.25]);
        // Out of order, one as base64: read back by `index`.
        let body = format!(
            r#"{{"data":[{{"index":1,"embedding":"{a}"}},{{"index":0,"embedding":[1,2]}}],"usage":{{"prompt_tokens":7}}}}"#
        );
        let v = parse_batch(body.as_bytes(), 2, Some(2)).unwrap();
        assert_eq!(v.vectors, vec![vec![1.0, 2.0], vec![0.5, -1.25]]);
        assert_eq!(v.prompt_tokens, Some(7));
        // Base64 is little-endian f32, byte for byte.
        assert_eq!(to_base64(&[1.0]), "AACAPw==");
    }

    #[test]
    fn a_batch_answer_that_does_not_fit_the_question_is_a_protocol_failure() {
        let nan = to_base64(&[f32::NAN]);
        for (bad, expected, dims) in [
            (r#"{"data":[{"embedding":[1,2]}]}"#.to_string(), 2, None),
            (
                r#"{"data":[{"embedding":[1,2]},{"embedding":[1]}]}"#.into(),
                2,
                None,
            ),
            (r#"{"data":[{"embedding":[1,2]}]}"#.into(), 1, Some(3)),
            (
                r#"{"data":[{"index":0,"embedding":[1]},{"index":0,"embedding":[2]}]}"#.into(),
                2,
                None,
            ),
            (r#"{"data":[{"index":5,"embedding":[1]}]}"#.into(), 1, None),
            (format!(r#"{{"data":[{{"embedding":"{nan}"}}]}}"#), 1, None),
            (r#"{"data":[{"embedding":"AAAA"}]}"#.into(), 1, None),
            (r#"{"data":[{"embedding":{"x":1}}]}"#.into(), 1, None),
        ] {
            let f = parse_batch(bad.as_bytes(), expected, dims).unwrap_err();
            assert_eq!(f.class, OutcomeClass::Protocol, "{bad}");
        }
    }

    #[test]
    fn a_batch_body_forwards_token_ids_and_the_options() {
        let input = Input::Tokens(vec![vec![1, 2], vec![3]]);
        let b = Batch {
            model: "m",
            input: &input,
            dimensions: Some(8),
            user: Some("u1"),
            base64: true,
        };
        assert_eq!(
            b.body(),
            serde_json::json!({"model": "m", "input": [[1, 2], [3]],
                "encoding_format": "base64", "dimensions": 8, "user": "u1"})
        );
    }
}
