//! Which requests may use a route's semantic cache, and what they are
//! looked up by: the scope (a digest of everything that shapes the answer
//! except the last question, plus the embedder) and the question's text.
//! Pure.

use sha2::{Digest, Sha256};

use crate::config::SemanticCacheConfig;
use crate::request::{CacheOwner, RequestSpec};
use crate::state::idempotency::Fingerprint;

/// Longest question embedded (longer ones are not near-repeats worth it).
pub const MAX_QUESTION_BYTES: usize = 16 * 1024;

/// A request's key into the semantic cache.
#[derive(Debug, Clone, PartialEq)]
pub struct Query {
    pub scope: Fingerprint,
    pub question: String,
}

/// Why a request does not use the semantic cache (a metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// It offers tools: the answer may be an action, not text.
    Tools,
    /// Its temperature is above the route's `max_temperature`.
    Temperature,
    /// An idempotency key on a `side_effects` route.
    SideEffects,
    /// The last message is not a user's question with text.
    NoQuestion,
    TooLong,
}

impl Skip {
    pub fn as_str(self) -> &'static str {
        match self {
            Skip::Tools => "tools",
            Skip::Temperature => "temperature",
            Skip::SideEffects => "side_effects",
            Skip::NoQuestion => "no_question",
            Skip::TooLong => "too_long",
        }
    }
}

/// The request's key, or why it may not use the cache. The scope belongs
/// to `owner`: a tenant never finds another tenant's answers.
pub fn query(
    spec: &RequestSpec,
    side_effects: bool,
    owner: CacheOwner<'_>,
    cfg: &SemanticCacheConfig,
) -> Result<Query, Skip> {
    let chat = &spec.chat;
    if !chat.tools.is_empty() || spec.needs.tools {
        return Err(Skip::Tools);
    }
    if chat.temperature.is_some_and(|t| t > cfg.max_temperature) {
        return Err(Skip::Temperature);
    }
    if side_effects && spec.idempotency_key.is_some() {
        return Err(Skip::SideEffects);
    }
    let last = chat
        .messages
        .last()
        .filter(|m| m.role == "user" && !m.content.trim().is_empty())
        .ok_or(Skip::NoQuestion)?;
    if last.content.len() > MAX_QUESTION_BYTES {
        return Err(Skip::TooLong);
    }
    // The request without its question: route, system prompt, earlier
    // turns, sampling and needs, digested as the exact cache digests them.
    let mut rest = spec.clone();
    // (A copy of the messages, as the whole request was copied before.)
    std::sync::Arc::make_mut(&mut rest.chat.messages).pop();
    rest.source = None;
    let mut h = Sha256::new();
    h.update(b"semantic\0");
    h.update(cfg.embedder.as_bytes());
    h.update(b"\0");
    owner.digest_into(&mut h);
    h.update(rest.fingerprint());
    Ok(Query {
        scope: h.finalize().into(),
        question: last.content.clone(),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::chat::{ChatMessage, ChatRequest, ToolSpec};
    use crate::request::Needs;

    /// The query as the tenant's own (a route that does not share).
    fn ask(s: &RequestSpec, side_effects: bool, cfg: &SemanticCacheConfig) -> Result<Query, Skip> {
        query(s, side_effects, s.cache_owner(false), cfg)
    }

    fn cfg() -> SemanticCacheConfig {
        SemanticCacheConfig {
            embedder: "emb/e".into(),
            threshold: 0.9,
            max_entries: 10,
            max_bytes: 1 << 20,
            ttl: std::time::Duration::from_secs(60),
            max_temperature: 0.3,
            lookup_timeout: std::time::Duration::from_millis(100),
            fresh_within: None,
        }
    }

    fn msg(role: &str, text: &str) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: text.into(),
            ..Default::default()
        }
    }

    fn spec(system: &str, question: &str) -> RequestSpec {
        RequestSpec {
            request_id: "id".into(),
            route: "support".into(),
            chat: ChatRequest {
                messages: vec![msg("system", system), msg("user", question)].into(),
                ..Default::default()
            },
            needs: Needs::default(),
            deadline: None,
            tenant: "t".into(),
            idempotency_key: None,
            source: None,
            from_queue: false,
            pin: None,
            resume_after: None,
        }
    }

    #[test]
    fn the_scope_is_everything_but_the_question() {
        let a = ask(&spec("be brief", "refund policy?"), false, &cfg()).unwrap();
        let b = ask(
            &spec("be brief", "what is the refund policy"),
            false,
            &cfg(),
        )
        .unwrap();
        assert_eq!(a.scope, b.scope);
        assert_eq!(b.question, "what is the refund policy");
        let other = ask(&spec("be verbose", "refund policy?"), false, &cfg()).unwrap();
        assert_ne!(
            a.scope, other.scope,
            "another system prompt is another scope"
        );
        let mut s = spec("be brief", "refund policy?");
        s.chat.max_tokens = Some(10);
        assert_ne!(ask(&s, false, &cfg()).unwrap().scope, a.scope);
        let mut s = spec("be brief", "refund policy?");
        s.route = "sales".into();
        assert_ne!(ask(&s, false, &cfg()).unwrap().scope, a.scope);
        let mut other_embedder = cfg();
        other_embedder.embedder = "emb/f".into();
        assert_ne!(
            ask(&spec("be brief", "refund policy?"), false, &other_embedder)
                .unwrap()
                .scope,
            a.scope
        );
        // Ids and deadlines are not part of it.
        let mut s = spec("be brief", "refund policy?");
        s.request_id = "other".into();
        s.deadline = Some(tokio::time::Instant::now());
        assert_eq!(ask(&s, false, &cfg()).unwrap().scope, a.scope);
    }

    #[test]
    fn the_scope_is_the_tenants_own_unless_the_route_shares_it() {
        let alpha = spec("be brief", "refund policy?");
        let mut beta = alpha.clone();
        beta.tenant = "beta".into();
        assert_ne!(
            ask(&alpha, false, &cfg()).unwrap().scope,
            ask(&beta, false, &cfg()).unwrap().scope,
            "another tenant never finds this tenant's answers"
        );
        let shared = |s: &RequestSpec| query(s, false, s.cache_owner(true), &cfg()).unwrap().scope;
        assert_eq!(shared(&alpha), shared(&beta), "a shared route: one scope");
        assert_ne!(shared(&alpha), ask(&alpha, false, &cfg()).unwrap().scope);
    }

    #[test]
    fn tools_hot_sampling_keyed_side_effects_and_non_questions_skip() {
        let mut s = spec("", "q");
        s.chat.tools = [ToolSpec {
            name: "t".into(),
            description: String::new(),
            parameters: serde_json::json!({}),
            cache: None,
            extra: None,
        }]
        .into();
        assert_eq!(ask(&s, false, &cfg()), Err(Skip::Tools));
        let mut s = spec("", "q");
        s.chat.temperature = Some(0.7);
        assert_eq!(ask(&s, false, &cfg()), Err(Skip::Temperature));
        s.chat.temperature = Some(0.3);
        assert!(ask(&s, false, &cfg()).is_ok(), "at the route's setting");
        let mut s = spec("", "q");
        s.idempotency_key = Some("k".into());
        assert_eq!(ask(&s, true, &cfg()), Err(Skip::SideEffects));
        assert!(ask(&s, false, &cfg()).is_ok());
        let mut s = spec("", "q");
        std::sync::Arc::make_mut(&mut s.chat.messages).push(msg("assistant", "a"));
        assert_eq!(ask(&s, false, &cfg()), Err(Skip::NoQuestion));
        assert_eq!(ask(&spec("", "  "), false, &cfg()), Err(Skip::NoQuestion));
        let long = "x".repeat(MAX_QUESTION_BYTES + 1);
        assert_eq!(ask(&spec("", &long), false, &cfg()), Err(Skip::TooLong));
    }
}
