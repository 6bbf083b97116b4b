//! Azure OpenAI adapter: the OpenAI Chat Completions body and stream (the
//! OpenAI decoder reads both) at a deployment's URL,
//! `{base_url}/openai/deployments/{deployment}/chat/completions?api-version=`,
//! with the key in the `api-key` header, never `Authorization`. The model
//! name is the deployment name, so the body carries no `model`. A prompt
//! Azure's content filter blocks (HTTP 400, `error.code = content_filter`)
//! is an answer shaped by the provider's safety layer, not a failure.

use http::{HeaderMap, HeaderName, HeaderValue};
use serde_json::Value;

use crate::policy::outcome::Failure;
use crate::upstream::wire::{Call, Quirks, Refused, Wire, WireRequest};
use crate::upstream::{classify, StreamDecoder};
use crate::upstream::{openai, ChatRequest, Chunk, Completion, Dialect, Dropped, FinishReason};

/// Azure OpenAI (`kind = "azure_openai"`): OpenAI's wire at a deployment.
pub struct AzureWire;

/// The `azure_openai` kind's wire.
pub static WIRE: AzureWire = AzureWire;

impl Wire for AzureWire {
    fn name(&self) -> &'static str {
        "azure_openai"
    }

    fn dialect(&self) -> Dialect {
        Dialect::Openai
    }

    fn quirks(&self) -> Quirks {
        Quirks {
            api_version: true,
            embeddings: false,
            service_tiers: &[],
            ..openai::WIRE.quirks()
        }
    }

    fn request(&self, call: &Call<'_>, dropped: &mut Dropped) -> Result<WireRequest, Failure> {
        let ep = call.endpoint;
        Ok(WireRequest::json(
            endpoint(
                &ep.base_url,
                &call.chat.model,
                ep.api_version.as_deref().unwrap_or_default(),
            ),
            auth_headers(call.key),
            build_body(call.chat, dropped),
        ))
    }

    fn decoder(&self) -> Box<dyn StreamDecoder> {
        openai::WIRE.decoder()
    }

    fn decode_whole(&self, body: &[u8]) -> Result<(Vec<Chunk>, Completion), Failure> {
        openai::WIRE.decode_whole(body)
    }

    /// The content filter's block is an answer, not a failure.
    fn refused(&self, status: u16, headers: &HeaderMap, body: &[u8]) -> Refused {
        if is_content_filter(status, body) {
            return Refused::Answered(Completion {
                finish_reason: FinishReason::ContentFilter,
                usage: None,
                service_tier: None,
                reasoning: Vec::new(),
            });
        }
        Refused::Failed(classify::classify_http(status, headers, body))
    }
}

/// The deployment's chat completions URL; the deployment is percent-encoded.
pub fn endpoint(base_url: &str, deployment: &str, api_version: &str) -> String {
    let enc = crate::upstream::encode_path_segment;
    format!(
        "{}/openai/deployments/{}/chat/completions?api-version={}",
        base_url.trim_end_matches('/'),
        enc(deployment),
        enc(api_version)
    )
}

/// OpenAI's body without `model` (the deployment names it).
pub fn build_body(req: &ChatRequest, dropped: &mut Dropped) -> Value {
    let mut body = openai::build_body(req, dropped);
    if let Some(o) = body.as_object_mut() {
        o.remove("model");
    }
    body
}

/// `api-key: <key>`, marked sensitive.
pub fn auth_headers(api_key: Option<&str>) -> HeaderMap {
    let mut headers = HeaderMap::new();
    if let Some(key) = api_key.filter(|k| !k.is_empty()) {
        if let Ok(mut value) = HeaderValue::from_str(key) {
            value.set_sensitive(true);
            headers.insert(HeaderName::from_static("api-key"), value);
        }
    }
    headers
}

/// A 400 body saying the content filter blocked the prompt.
pub fn is_content_filter(status: u16, body: &[u8]) -> bool {
    if status != 400 {
        return false;
    }
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return false;
    };
    let error = &v["error"];
    error["code"] == "content_filter"
        || error["innererror"]["code"] == "ResponsibleAIPolicyViolation"
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_deployment_url_carries_the_api_version() {
        assert_eq!(
            endpoint("https://r.openai.azure.com/", "gpt-4o mini", "2024-10-21"),
            "https://r.openai.azure.com/openai/deployments/gpt-4o%20mini/chat/completions?api-version=2024-10-21"
        );
    }

    #[test]
    fn the_key_goes_in_api_key_and_the_body_has_no_model() {
        let h = auth_headers(Some("k1"));
        assert_eq!(h["api-key"], "k1");
        assert!(h["api-key"].is_sensitive());
        assert!(!h.contains_key("authorization"));
        let body = build_body(
            &ChatRequest {
                model: "dep".into(),
                ..Default::default()
            },
            &mut crate::upstream::Dropped::default(),
        );
        assert!(body.get("model").is_none(), "{body}");
    }

    #[test]
    fn a_content_filter_block_is_recognised() {
        // As Azure documents it (prompt filtered, HTTP 400).
        let body = json!({"error": {"message": "The response was filtered due to the prompt triggering Azure OpenAI's content management policy.",
            "type": null, "param": "prompt", "code": "content_filter", "status": 400,
            "innererror": {"code": "ResponsibleAIPolicyViolation",
                "content_filter_result": {"hate": {"filtered": true, "severity": "high"}}}}});
        assert!(is_content_filter(400, body.to_string().as_bytes()));
        assert!(!is_content_filter(429, body.to_string().as_bytes()));
        let other = json!({"error": {"code": "context_length_exceeded", "message": "too long"}});
        assert!(!is_content_filter(400, other.to_string().as_bytes()));
    }
}
