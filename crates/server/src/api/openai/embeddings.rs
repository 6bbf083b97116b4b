//! The OpenAI door's `POST /v1/embeddings`: OpenAI's body (`input` a string,
//! an array of strings, or token ids, which are passed on as they are;
//! `model` a route or a pinned `provider/model`; `dimensions`;
//! `encoding_format` `float` or `base64`, little-endian f32, which the
//! official SDKs ask for by default; `user`) as the request task's call,
//! started through the one intake. Answers OpenAI's `list` of `embedding`s
//! naming the model that served, with the served-by headers.

use serde::Serialize;

use super::*;
use crate::embeddings::{EmbedSpec, Embedded};
use crate::semantic::embed::{to_base64, Input};

/// A parsed `/v1/embeddings` body.
#[derive(Debug, PartialEq)]
struct Call {
    model: String,
    input: Input,
    dimensions: Option<u32>,
    user: Option<String>,
    base64: bool,
}

pub(super) async fn embeddings(State(s): State<Arc<HttpState>>, request: Request) -> Response {
    let request_id = s.request_id(request.headers());
    match embed(&s, request, &request_id).await {
        Ok(r) => r,
        Err(e) => e.response(&request_id),
    }
}

async fn embed(s: &HttpState, request: Request, request_id: &str) -> Result<Response, OpenAiError> {
    let (parts, body) = request.into_parts();
    let refused = |e: RequestError| OpenAiError::from_request(&e);
    s.check_metadata(&parts.headers).map_err(refused)?;
    let tenant = s.authenticate(&parts.headers).map_err(refused)?;
    let bytes = s.read_body(body, &parts.headers).await.map_err(refused)?;
    let call = parse_call(&bytes)?;
    let (route, pin) = s.route_and_pin(&call.model).map_err(refused)?;
    let spec = EmbedSpec {
        request_id: request_id.to_string(),
        route,
        pin,
        tenant: "default".into(),
        input: call.input,
        dimensions: call.dimensions,
        user: call.user,
        deadline: None,
        base64: call.base64,
    };
    let trace = tonic::metadata::MetadataMap::from_headers(parts.headers);
    let served = s
        .intake
        .embed(Door::OpenAi, spec, tenant, Some(&trace))
        .await
        .map_err(refused)?;
    let by = door::Served {
        by: door::served_by(&served.provider, &served.model),
        tier: served.tier.as_str(),
        attempts: served.attempts,
        dropped: Vec::new(),
        resume_token: None,
    };
    let mut r = axum::Json(answer(&served, call.base64)).into_response();
    served_headers(r.headers_mut(), Some(by), request_id);
    Ok(r)
}

fn invalid(param: &str, message: impl std::fmt::Display) -> OpenAiError {
    OpenAiError::invalid(format!("{param}: {message}"), Some(param.to_string()))
}

/// The body as a call; refusals name the parameter.
fn parse_call(bytes: &[u8]) -> Result<Call, OpenAiError> {
    let v: Value = serde_json::from_slice(bytes)
        .map_err(|e| OpenAiError::invalid(format!("the body is not JSON: {e}"), None))?;
    let model = match v.get("model") {
        Some(Value::String(m)) if !m.is_empty() => m.clone(),
        _ => {
            return Err(invalid(
                "model",
                "a route name (or `provider/model`) is required",
            ))
        }
    };
    let input = input(v.get("input").unwrap_or(&Value::Null))?;
    let base64 = match v.get("encoding_format") {
        None | Some(Value::Null) => false,
        Some(Value::String(f)) if f == "float" => false,
        Some(Value::String(f)) if f == "base64" => true,
        Some(other) => {
            return Err(invalid(
                "encoding_format",
                format!("{other} is not `float` or `base64`"),
            ))
        }
    };
    let dimensions = match v.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(d) => Some(
            d.as_u64()
                .and_then(|d| u32::try_from(d).ok())
                .filter(|d| *d > 0)
                .ok_or_else(|| invalid("dimensions", format!("{d} is not a positive integer")))?,
        ),
    };
    let user = match v.get("user") {
        None | Some(Value::Null) => None,
        Some(Value::String(u)) => Some(u.clone()),
        Some(_) => return Err(invalid("user", "must be a string")),
    };
    Ok(Call {
        model,
        input,
        dimensions,
        user,
        base64,
    })
}

/// `input`: a string, an array of strings, an array of token ids (one
/// input), or an array of token-id arrays.
fn input(v: &Value) -> Result<Input, OpenAiError> {
    const SHAPE: &str =
        "must be a string, an array of strings, or token ids (an array of integers, or of integer arrays)";
    let items = match v {
        Value::String(s) => return Ok(Input::Texts(vec![s.clone()])),
        Value::Array(items) if !items.is_empty() => items,
        Value::Array(_) => return Err(invalid("input", "must not be empty")),
        _ => return Err(invalid("input", SHAPE)),
    };
    match &items[0] {
        Value::String(_) => items
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::String(s) => Ok(s.clone()),
                _ => Err(invalid(
                    &format!("input[{i}]"),
                    "must be a string, like the first",
                )),
            })
            .collect::<Result<_, _>>()
            .map(Input::Texts),
        Value::Number(_) => token_ids(items, "input").map(|ids| Input::Tokens(vec![ids])),
        Value::Array(_) => items
            .iter()
            .enumerate()
            .map(|(i, x)| match x {
                Value::Array(ids) => token_ids(ids, &format!("input[{i}]")),
                _ => Err(invalid(
                    &format!("input[{i}]"),
                    "must be an array of token ids, like the first",
                )),
            })
            .collect::<Result<_, _>>()
            .map(Input::Tokens),
        _ => Err(invalid("input", SHAPE)),
    }
}

/// Token ids: integers in u32's range.
fn token_ids(items: &[Value], param: &str) -> Result<Vec<u32>, OpenAiError> {
    items
        .iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| invalid(&format!("{param}[{i}]"), format!("{x} is not a token id")))
        })
        .collect()
}

/// OpenAI's answer shape.
#[derive(Serialize)]
struct List<'a> {
    object: &'static str,
    data: Vec<Item<'a>>,
    model: &'a str,
    usage: ListUsage,
}

#[derive(Serialize)]
struct Item<'a> {
    object: &'static str,
    index: usize,
    embedding: Vector<'a>,
}

#[derive(Serialize)]
#[serde(untagged)]
enum Vector<'a> {
    Float(&'a [f32]),
    Base64(String),
}

#[derive(Serialize)]
struct ListUsage {
    prompt_tokens: u32,
    total_tokens: u32,
}

fn answer(e: &Embedded, base64: bool) -> List<'_> {
    List {
        object: "list",
        data: e
            .vectors
            .iter()
            .enumerate()
            .map(|(index, v)| Item {
                object: "embedding",
                index,
                embedding: if base64 {
                    Vector::Base64(to_base64(v))
                } else {
                    Vector::Float(v)
                },
            })
            .collect(),
        model: &e.model,
        usage: ListUsage {
            prompt_tokens: e.input_tokens,
            total_tokens: e.input_tokens,
        },
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use axum::http::StatusCode;

    fn call(v: Value) -> Result<Call, OpenAiError> {
        parse_call(v.to_string().as_bytes())
    }

    #[test]
    fn every_input_shape_openai_takes() {
        let texts = |t: &[&str]| Input::Texts(t.iter().map(|s| s.to_string()).collect());
        let c = call(json!({"model": "embed", "input": "hi"})).unwrap();
        assert_eq!(c.input, texts(&["hi"]));
        assert!(!c.base64, "float is the API's default");
        let c = call(
            json!({"model": "embed", "input": ["a", "b"], "encoding_format": "base64",
            "dimensions": 8, "user": "u"}),
        )
        .unwrap();
        assert_eq!(c.input, texts(&["a", "b"]));
        assert!(c.base64);
        assert_eq!((c.dimensions, c.user.as_deref()), (Some(8), Some("u")));
        // LangChain's default: token ids, one array per input.
        let c = call(json!({"model": "embed", "input": [[104, 105], [1]]})).unwrap();
        assert_eq!(c.input, Input::Tokens(vec![vec![104, 105], vec![1]]));
        let c = call(json!({"model": "embed", "input": [104, 105]})).unwrap();
        assert_eq!(c.input, Input::Tokens(vec![vec![104, 105]]));
    }

    #[test]
    fn refusals_name_the_parameter() {
        let param = |v: Value| call(v).unwrap_err().param.unwrap();
        assert_eq!(param(json!({"input": "x"})), "model");
        assert_eq!(param(json!({"model": "e"})), "input");
        assert_eq!(param(json!({"model": "e", "input": []})), "input");
        assert_eq!(param(json!({"model": "e", "input": {"a": 1}})), "input");
        assert_eq!(param(json!({"model": "e", "input": ["a", 1]})), "input[1]");
        assert_eq!(param(json!({"model": "e", "input": [1, -2]})), "input[1]");
        assert_eq!(
            param(json!({"model": "e", "input": [[1], "a"]})),
            "input[1]"
        );
        assert_eq!(
            param(json!({"model": "e", "input": [[1], [1.5]]})),
            "input[1][0]"
        );
        assert_eq!(
            param(json!({"model": "e", "input": "a", "encoding_format": "hex"})),
            "encoding_format"
        );
        assert_eq!(
            param(json!({"model": "e", "input": "a", "dimensions": 0})),
            "dimensions"
        );
        assert_eq!(
            param(json!({"model": "e", "input": "a", "user": 7})),
            "user"
        );
        let e = call(json!({"model": "e", "input": [true]})).unwrap_err();
        assert_eq!(e.status, StatusCode::BAD_REQUEST);
        assert!(e.message.contains("token ids"), "{}", e.message);
    }

    #[test]
    fn the_answer_is_openais_list_in_float_or_base64() {
        let e = Embedded {
            vectors: vec![vec![1.0, -0.5]],
            provider: "p".into(),
            model: "m".into(),
            tier: crate::sink::Tier::Fallback,
            attempts: 2,
            input_tokens: 3,
            usage_estimated: false,
            cost_usd: 0.0,
        };
        let v = serde_json::to_value(answer(&e, false)).unwrap();
        assert_eq!(
            v,
            json!({"object": "list", "model": "m",
                "data": [{"object": "embedding", "index": 0, "embedding": [1.0, -0.5]}],
                "usage": {"prompt_tokens": 3, "total_tokens": 3}})
        );
        let v = serde_json::to_value(answer(&e, true)).unwrap();
        assert_eq!(v["data"][0]["embedding"], to_base64(&[1.0, -0.5]));
    }
}
