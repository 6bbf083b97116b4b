//! A validated, routable request, and its fingerprint: a stable digest of
//! everything that determines the answer (route, messages, tools, sampling),
//! used for idempotency checks and cache keys.

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::chat::ChatRequest;
use crate::idempotency::Fingerprint;

/// What a request needs from a target.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    pub tools: bool,
    pub json: bool,
    pub vision: bool,
    pub min_context_tokens: u32,
}

/// A validated request, ready to route.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    pub request_id: String,
    pub route: String,
    /// `model` is filled in per candidate.
    pub chat: ChatRequest,
    pub needs: Needs,
    /// From `grpc-timeout`, when the caller set one.
    pub deadline: Option<Instant>,
    /// The caller's tenant ("default" when none is known).
    pub tenant: String,
    /// The caller's idempotency key, if any (unscoped).
    pub idempotency_key: Option<String>,
    /// The encoded `CompletionRequest`, kept so the `queue` rung can store it.
    pub source: Option<std::sync::Arc<Vec<u8>>>,
    /// This request is a queued job's run: it never goes to the queue again.
    pub from_queue: bool,
    /// Only this `provider/model` target of the route may serve.
    pub pin: Option<String>,
}

impl RequestSpec {
    /// Digest of route, messages, tools and sampling parameters; independent
    /// of request id, deadline and tenant.
    pub fn fingerprint(&self) -> Fingerprint {
        let c = &self.chat;
        let messages: Vec<serde_json::Value> = c
            .messages
            .iter()
            .map(|m| {
                serde_json::json!({
                    "role": m.role,
                    "content": m.content,
                    "tool_call_id": m.tool_call_id,
                    "tool_calls": m.tool_calls.iter().map(|t| [&t.id, &t.name, &t.arguments]).collect::<Vec<_>>(),
                })
            })
            .collect();
        let tools: Vec<serde_json::Value> = c
            .tools
            .iter()
            .map(|t| serde_json::json!({"name": t.name, "description": t.description, "parameters": t.parameters}))
            .collect();
        // serde_json maps are sorted by key, so this text is canonical.
        let canonical = serde_json::json!({
            "route": self.route,
            "pin": self.pin,
            "messages": messages,
            "tools": tools,
            "max_tokens": c.max_tokens,
            "temperature": c.temperature.map(f32::to_bits),
            "top_p": c.top_p.map(f32::to_bits),
            "stop": c.stop,
            "json": c.json_mode,
            "needs": [self.needs.tools, self.needs.json, self.needs.vision],
            "min_context": self.needs.min_context_tokens,
        });
        // Only a forced choice is part of it: a request without one keeps the
        // digest it had before tool_choice existed (stored jobs, idempotency
        // records and a fleet mid-upgrade all agree on it).
        let mut canonical = canonical;
        let forced = match &c.tool_choice {
            crate::chat::ToolChoice::Auto => None,
            crate::chat::ToolChoice::Any => Some(serde_json::json!("any")),
            crate::chat::ToolChoice::Tool(name) => Some(serde_json::json!({ "tool": name })),
        };
        if let (Some(forced), Some(o)) = (forced, canonical.as_object_mut()) {
            o.insert("tool_choice".into(), forced);
        }
        Sha256::digest(canonical.to_string().as_bytes()).into()
    }

    /// The idempotency record key, scoped by tenant.
    pub fn scoped_key(&self) -> Option<String> {
        self.idempotency_key
            .as_ref()
            .map(|k| format!("{}:{k}", self.tenant))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::chat::ChatMessage;

    fn spec(text: &str) -> RequestSpec {
        RequestSpec {
            request_id: "a".into(),
            route: "chat".into(),
            chat: ChatRequest {
                messages: vec![ChatMessage {
                    role: "user".into(),
                    content: text.into(),
                    ..Default::default()
                }],
                ..Default::default()
            },
            needs: Needs::default(),
            deadline: None,
            tenant: "t".into(),
            idempotency_key: Some("k".into()),
            source: None,
            from_queue: false,
            pin: None,
        }
    }

    #[test]
    fn fingerprint_ignores_ids_and_sees_content() {
        let a = spec("hi");
        let mut b = spec("hi");
        b.request_id = "other".into();
        b.tenant = "other".into();
        assert_eq!(a.fingerprint(), b.fingerprint());
        assert_ne!(a.fingerprint(), spec("hello").fingerprint());
        let mut c = spec("hi");
        c.chat.temperature = Some(0.5);
        assert_ne!(a.fingerprint(), c.fingerprint());
        assert_eq!(a.scoped_key().as_deref(), Some("t:k"));
    }
}
