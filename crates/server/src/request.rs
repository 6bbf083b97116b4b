//! A validated, routable request, and its fingerprint: a stable digest of
//! everything that determines the answer (route, messages, tools, sampling),
//! used for idempotency checks and cache keys.

use sha2::{Digest, Sha256};
use tokio::time::Instant;

use crate::chat::ChatRequest;
use crate::state::idempotency::Fingerprint;

pub use crate::chat::Needs;

/// A validated request, ready to route.
#[derive(Debug, Clone)]
pub struct RequestSpec {
    pub request_id: std::sync::Arc<str>,
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
    /// The encoded `CompletionRequest` as it was sent, kept where it may be
    /// stored (by the `queue` rung, or a stream's journal).
    pub source: Option<std::sync::Arc<Vec<u8>>>,
    /// This request is a queued job's run: it never goes to the queue again.
    pub from_queue: bool,
    /// Only this `provider/model` target of the route may serve.
    pub pin: Option<String>,
    /// A reconnect of the idempotency key's stream: the caller holds its
    /// items up to this one (`resume_after_seq`, the HTTP `Last-Event-ID`).
    pub resume_after: Option<u64>,
}

/// Who a stored answer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheOwner<'a> {
    /// One tenant: no other tenant reads it (the default).
    Tenant(&'a str),
    /// Every tenant: a route with `shared_across_tenants = true`.
    Everyone,
}

impl CacheOwner<'_> {
    /// Feeds the owner into a cache key's digest (length-prefixed, so no
    /// tenant name can pass for another key).
    pub fn digest_into(self, h: &mut Sha256) {
        match self {
            CacheOwner::Tenant(t) => {
                h.update(b"tenant\0");
                h.update((t.len() as u64).to_be_bytes());
                h.update(t.as_bytes());
            }
            CacheOwner::Everyone => h.update(b"shared\0"),
        }
    }
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
                let mut v = serde_json::json!({
                    "role": m.role,
                    "content": m.content,
                    "tool_call_id": m.tool_call_id,
                    "tool_calls": m.tool_calls.iter().map(|t| [&t.id, &t.name, &t.arguments]).collect::<Vec<_>>(),
                });
                // Only what a message has beyond text: a text-only message
                // keeps the digest it had before parts existed.
                if let Some(o) = v.as_object_mut() {
                    if !m.parts.is_empty() {
                        o.insert("parts".into(), m.parts.iter().map(part_digest).collect());
                    }
                    if m.is_error {
                        o.insert("is_error".into(), true.into());
                    }
                    if let Some(ttl) = m.cache {
                        o.insert("cache".into(), ttl.as_str().into());
                    }
                }
                v
            })
            .collect();
        let tools: Vec<serde_json::Value> = c
            .tools
            .iter()
            .map(|t| {
                let mut v = serde_json::json!({"name": t.name, "description": t.description, "parameters": t.parameters});
                if let Some(o) = v.as_object_mut() {
                    if let Some(ttl) = t.cache {
                        o.insert("cache".into(), ttl.as_str().into());
                    }
                    if let Some(extra) = &t.extra {
                        o.insert("extra".into(), serde_json::Value::Object(extra.clone()));
                    }
                }
                v
            })
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
        if let Some(o) = canonical.as_object_mut() {
            if let Some(forced) = forced {
                o.insert("tool_choice".into(), forced);
            }
            // Likewise the newer asks, only when made.
            if let Some(s) = &c.json_schema {
                o.insert(
                    "json_schema".into(),
                    serde_json::json!([s.name, s.schema, s.strict, s.description]),
                );
            }
            if let Some(r) = &c.reasoning {
                o.insert(
                    "reasoning".into(),
                    serde_json::json!([r.effort, r.budget_tokens, r.adaptive]),
                );
            }
            if let Some(p) = &c.passthrough {
                o.insert(
                    "passthrough".into(),
                    serde_json::json!([
                        p.dialect.map(crate::chat::Dialect::as_str),
                        p.fields,
                        p.headers
                    ]),
                );
            }
            let n = &self.needs;
            if n.pdf || n.reasoning || n.json_schema {
                o.insert(
                    "needs_more".into(),
                    serde_json::json!([n.pdf, n.reasoning, n.json_schema]),
                );
            }
        }
        Sha256::digest(canonical.to_string().as_bytes()).into()
    }

    /// Whose stored answers this request may read and fill: its tenant's
    /// own, or every tenant's on a route that shares its caches.
    pub fn cache_owner(&self, shared_across_tenants: bool) -> CacheOwner<'_> {
        if shared_across_tenants {
            CacheOwner::Everyone
        } else {
            CacheOwner::Tenant(&self.tenant)
        }
    }

    /// The response cache's key: the fingerprint within the cache owner's
    /// scope, so one tenant never reads another's answer.
    pub fn cache_key(&self, fingerprint: &Fingerprint, owner: CacheOwner<'_>) -> Fingerprint {
        let mut h = Sha256::new();
        owner.digest_into(&mut h);
        h.update(fingerprint);
        h.finalize().into()
    }

    /// The idempotency record key, scoped by tenant.
    pub fn scoped_key(&self) -> Option<String> {
        self.idempotency_key
            .as_ref()
            .map(|k| format!("{}:{k}", self.tenant))
    }
}

/// A part in the fingerprint: media by the digest of its bytes, not the bytes.
fn part_digest(p: &crate::chat::Part) -> serde_json::Value {
    use crate::chat::{MediaSource, PartKind};
    let media = |source: &MediaSource| match source {
        MediaSource::Url(u) => serde_json::json!({ "url": u }),
        MediaSource::Data(d) => {
            let digest: [u8; 32] = Sha256::digest(d).into();
            serde_json::json!({ "sha256": digest.iter().map(|b| format!("{b:02x}")).collect::<String>() })
        }
    };
    let kind = match &p.kind {
        PartKind::Text(t) => serde_json::json!({ "text": t }),
        PartKind::Image(i) => {
            serde_json::json!({ "image": [media(&i.source), i.media_type, i.detail] })
        }
        PartKind::Document(d) => {
            serde_json::json!({ "document": [media(&d.source), d.media_type, d.title, d.filename] })
        }
        PartKind::Reasoning(r) => serde_json::json!({
            "reasoning": [r.text, r.signature, r.redacted, r.dialect.map(crate::chat::Dialect::as_str)]
        }),
    };
    serde_json::json!([kind, p.cache.map(crate::chat::CacheTtl::as_str)])
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
                }]
                .into(),
                ..Default::default()
            },
            needs: Needs::default(),
            deadline: None,
            tenant: "t".into(),
            idempotency_key: Some("k".into()),
            source: None,
            from_queue: false,
            pin: None,
            resume_after: None,
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

    #[test]
    fn cache_keys_are_the_tenants_own_unless_the_route_shares_them() {
        let a = spec("hi");
        let mut b = spec("hi");
        b.tenant = "beta".into();
        let f = a.fingerprint();
        assert_eq!(f, b.fingerprint(), "the same request");
        let own = |s: &RequestSpec| s.cache_key(&f, s.cache_owner(false));
        assert_ne!(own(&a), own(&b), "another tenant, another key");
        assert_eq!(own(&a), own(&spec("hi")), "the same tenant, the same key");
        let shared = |s: &RequestSpec| s.cache_key(&f, s.cache_owner(true));
        assert_eq!(shared(&a), shared(&b), "a shared route: one key");
        assert_ne!(shared(&a), own(&a));
    }
}
