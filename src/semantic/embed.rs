//! The embeddings wire: OpenAI's `POST {base_url}/embeddings` (also served
//! by vLLM, llama.cpp, Ollama and TEI), one input per call. Builds the
//! request, bounds and checks the answer (one finite vector of a sane
//! dimension) and classifies failures like any upstream's. A server that
//! answers one vector per token (llama-cpp-python for a model without a
//! pooling layer) is mean-pooled. Knows nothing of actors: admission and
//! the outcome report are the caller's.

use serde_json::Value;

use crate::policy::outcome::{Failure, OutcomeClass};
use crate::upstream::endpoint::Endpoint;
use crate::upstream::{classify, openai};

/// Largest embeddings response read (a 4096-dimension float vector as JSON
/// text is well under 100 KB).
const MAX_BODY: usize = 4 * 1024 * 1024;
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
    let v: Value = serde_json::from_slice(body).map_err(malformed)?;
    if v.get("error").is_some_and(|e| !e.is_null()) {
        return Err(classify::classify_error_object(
            crate::upstream::ProviderKind::Openai,
            &v,
            Some(200),
        ));
    }
    let data = v
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("no `data` array"))?;
    let first = data
        .iter()
        .find(|d| d.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
        .ok_or_else(|| malformed("`data` is empty"))?;
    let numbers = first
        .get("embedding")
        .and_then(Value::as_array)
        .ok_or_else(|| malformed("`data[0].embedding` is not an array of numbers"))?;
    if numbers.first().is_some_and(Value::is_array) {
        return mean_pool(numbers);
    }
    vector(numbers)
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
    let response = endpoint
        .http
        .post(url)
        .headers(openai::auth_headers(key))
        .json(&body(model, input))
        .send()
        .await
        .map_err(|e| classify::classify_transport(&e))?;
    let status = response.status();
    if !status.is_success() {
        let headers = response.headers().clone();
        let body = crate::attempt::read_capped(response, MAX_ERROR_BODY).await;
        let mut failure = classify::classify_http(endpoint.kind, status.as_u16(), &headers, &body);
        failure.message = endpoint.redact(&failure.message);
        return Err(failure);
    }
    let body = crate::attempt::read_capped(response, MAX_BODY + 1).await;
    if body.len() > MAX_BODY {
        return Err(malformed(format!("larger than {MAX_BODY} bytes")));
    }
    parse(&body)
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
}
