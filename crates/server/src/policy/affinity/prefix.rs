//! The cacheable prefixes of a request, as prompt-cache affinity keys them:
//! a sha256 over the tenant, the route and the request's blocks in the
//! upstream cache's order (tools, then the system turns, then the other
//! messages), taken at each cache marker (the longest, up to the last
//! marker, first); or, when nothing is marked (an upstream that caches on
//! its own), over the first ~1,024 tokens (4,096 bytes) of those blocks.
//! Pure: no I/O, no clock.

use sha2::{Digest, Sha256};

use crate::chat::{
    CacheTtl, ChatMessage, ChatRequest, Document, Image, MediaSource, PartKind, ToolSpec,
};

/// One prefix's digest.
pub type PrefixHash = [u8; 32];

/// Marked prefixes kept per request: Anthropic takes four breakpoints.
pub const MAX_MARKED: usize = 4;

/// Bytes of an unmarked request hashed as its prefix: ~1,024 tokens at four
/// bytes a token, OpenAI's smallest cacheable prompt.
pub const AUTO_PREFIX_BYTES: usize = 4096;

/// The request's cacheable prefixes, longest first: one per marker (the last
/// [`MAX_MARKED`]), or the first [`AUTO_PREFIX_BYTES`] when nothing is
/// marked; empty when an unmarked request is shorter than that (no upstream
/// caches it).
pub fn prefixes(chat: &ChatRequest, tenant: &str, route: &str) -> Vec<PrefixHash> {
    let marked = chat.longest_cache_ttl().is_some();
    let mut walk = Walk::new(tenant, route, (!marked).then_some(AUTO_PREFIX_BYTES));
    walk.request(chat);
    if marked {
        let mut hashes = walk.marks;
        hashes.reverse();
        hashes
    } else {
        walk.full.into_iter().collect()
    }
}

/// Feeds a request's blocks into one running digest.
struct Walk {
    h: Sha256,
    /// Content bytes still to hash (unmarked requests); `None`: no limit.
    budget: Option<usize>,
    /// The digest at each marker so far, oldest first, at most [`MAX_MARKED`].
    marks: Vec<PrefixHash>,
    /// The digest once the budget was used up.
    full: Option<PrefixHash>,
}

impl Walk {
    fn new(tenant: &str, route: &str, budget: Option<usize>) -> Walk {
        let mut h = Sha256::new();
        h.update(if budget.is_some() {
            b"auto\0".as_slice()
        } else {
            b"marked\0".as_slice()
        });
        for scope in [tenant, route] {
            frame(&mut h, scope.as_bytes());
        }
        Walk {
            h,
            budget,
            marks: Vec::new(),
            full: None,
        }
    }

    /// The blocks in cache order: tools, system turns, the rest.
    fn request(&mut self, chat: &ChatRequest) {
        for tool in chat.tools.iter() {
            self.tool(tool);
        }
        let (system, rest): (Vec<&ChatMessage>, Vec<&ChatMessage>) =
            chat.messages.iter().partition(|m| m.role == "system");
        for m in system.into_iter().chain(rest) {
            self.message(m);
        }
    }

    fn done(&self) -> bool {
        self.full.is_some()
    }

    fn tool(&mut self, t: &ToolSpec) {
        self.tag(b"tool");
        self.piece(t.name.as_bytes());
        self.piece(t.description.as_bytes());
        // serde_json maps are sorted by key: the text is canonical.
        self.piece(t.parameters.to_string().as_bytes());
        self.mark(t.cache);
    }

    fn message(&mut self, m: &ChatMessage) {
        self.tag(m.role.as_bytes());
        if let Some(id) = &m.tool_call_id {
            self.piece(id.as_bytes());
        }
        for part in m.content_parts().iter() {
            match &part.kind {
                PartKind::Text(t) => {
                    self.tag(b"text");
                    self.piece(t.as_bytes());
                }
                PartKind::Image(Image {
                    source, media_type, ..
                }) => {
                    self.tag(b"image");
                    self.piece(media_type.as_bytes());
                    self.source(source);
                }
                PartKind::Document(Document {
                    source,
                    media_type,
                    title,
                    ..
                }) => {
                    self.tag(b"document");
                    self.piece(media_type.as_bytes());
                    self.piece(title.as_deref().unwrap_or_default().as_bytes());
                    self.source(source);
                }
                PartKind::Reasoning(r) => {
                    self.tag(b"reasoning");
                    self.piece(r.text.as_bytes());
                    self.piece(r.signature.as_deref().unwrap_or_default().as_bytes());
                    self.piece(r.redacted.as_deref().unwrap_or_default().as_bytes());
                }
            }
            self.mark(part.cache);
        }
        for call in &m.tool_calls {
            self.tag(b"tool_call");
            self.piece(call.id.as_bytes());
            self.piece(call.name.as_bytes());
            self.piece(call.arguments.as_bytes());
        }
        if m.is_error {
            self.tag(b"is_error");
        }
        self.mark(m.cache);
    }

    fn source(&mut self, source: &MediaSource) {
        match source {
            MediaSource::Url(u) => {
                self.tag(b"url");
                self.piece(u.as_bytes());
            }
            MediaSource::Data(d) => {
                self.tag(b"data");
                self.piece(d);
            }
        }
    }

    /// Structure (not counted against the budget).
    fn tag(&mut self, tag: &[u8]) {
        if !self.done() {
            self.h.update(b"\x01");
            frame(&mut self.h, tag);
        }
    }

    /// Content: counted against the budget, cut where it runs out.
    fn piece(&mut self, bytes: &[u8]) {
        if self.done() {
            return;
        }
        let take = self.budget.map_or(bytes.len(), |b| b.min(bytes.len()));
        frame(&mut self.h, &bytes[..take]);
        if let Some(b) = self.budget.as_mut() {
            *b -= take;
            if *b == 0 {
                self.full = Some(self.h.clone().finalize().into());
            }
        }
    }

    /// A cache marker: the prefix so far is one the upstream may hold.
    fn mark(&mut self, cache: Option<CacheTtl>) {
        if cache.is_none() || self.budget.is_some() {
            return;
        }
        if self.marks.len() == MAX_MARKED {
            self.marks.remove(0);
        }
        self.marks.push(self.h.clone().finalize().into());
    }
}

/// Length-prefixed, so no two different sequences feed the same bytes.
fn frame(h: &mut Sha256, bytes: &[u8]) {
    h.update((bytes.len() as u64).to_be_bytes());
    h.update(bytes);
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use crate::chat::{Part, ToolCall};
    use std::sync::Arc;

    fn tool(cache: Option<CacheTtl>) -> ToolSpec {
        ToolSpec {
            name: "read_file".into(),
            description: "Reads a file".into(),
            parameters: serde_json::json!({"type": "object", "properties": {"path": {"type": "string"}}}),
            cache,
            extra: None,
        }
    }

    fn marked(text: &str) -> ChatMessage {
        ChatMessage {
            parts: vec![Part {
                cache: Some(CacheTtl::FiveMinutes),
                ..Part::text(text)
            }],
            ..ChatMessage::text("user", "")
        }
    }

    /// An agent's turn: tools, a marked system prompt, the conversation so
    /// far, and the newest user message marked.
    fn turn(system: &str, history: &[&str], newest: &str) -> ChatRequest {
        let mut messages = vec![ChatMessage {
            parts: vec![Part {
                cache: Some(CacheTtl::OneHour),
                ..Part::text(system)
            }],
            ..ChatMessage::text("system", "")
        }];
        for (i, h) in history.iter().enumerate() {
            let role = if i % 2 == 0 { "user" } else { "assistant" };
            messages.push(ChatMessage::text(role, *h));
        }
        messages.push(marked(newest));
        ChatRequest {
            tools: vec![tool(None)].into(),
            messages: messages.into(),
            ..ChatRequest::default()
        }
    }

    #[test]
    fn a_marked_request_is_keyed_up_to_each_marker_longest_first() {
        let one = turn("You are a coding agent.", &[], "fix the bug");
        let p = prefixes(&one, "team-a", "code");
        assert_eq!(p.len(), 2, "the system marker and the newest message's");
        // What follows the last marker does not move it.
        let mut tail = one.clone();
        Arc::make_mut(&mut tail.messages).push(ChatMessage::text("user", "and the tests"));
        assert_eq!(prefixes(&tail, "team-a", "code"), p);
        // A byte before a marker does.
        let other = turn("You are a coding agent!", &[], "fix the bug");
        let q = prefixes(&other, "team-a", "code");
        assert_ne!(q[0], p[0]);
        assert_ne!(q[1], p[1]);
    }

    #[test]
    fn the_next_turn_shares_the_earlier_turns_marked_prefixes() {
        let first = turn("You are a coding agent.", &[], "fix the bug");
        let second = turn(
            "You are a coding agent.",
            &["fix the bug", "done: patched main.rs"],
            "now run the tests",
        );
        let (a, b) = (prefixes(&first, "t", "r"), prefixes(&second, "t", "r"));
        assert_ne!(a[0], b[0], "the newest marker moved on");
        assert_eq!(a[1], b[1], "the system prompt's marker is the same prefix");
        // Tools come first in the cache's order: a marker on a tool keys
        // the tools alone, whatever the system prompt.
        let mut t1 = first.clone();
        std::sync::Arc::make_mut(&mut t1.tools)[0].cache = Some(CacheTtl::FiveMinutes);
        let mut t2 = turn("Another prompt.", &[], "x");
        std::sync::Arc::make_mut(&mut t2.tools)[0].cache = Some(CacheTtl::FiveMinutes);
        assert_eq!(
            prefixes(&t1, "t", "r").last(),
            prefixes(&t2, "t", "r").last()
        );
    }

    #[test]
    fn at_most_the_last_four_markers_are_kept() {
        let mut chat = turn("sys", &[], "q");
        for i in 0..6 {
            Arc::make_mut(&mut chat.messages).push(marked(&format!("m{i}")));
        }
        let p = prefixes(&chat, "t", "r");
        assert_eq!(p.len(), MAX_MARKED);
        let mut shorter = chat.clone();
        Arc::make_mut(&mut shorter.messages).pop();
        assert_eq!(prefixes(&shorter, "t", "r")[0], p[1]);
    }

    #[test]
    fn an_unmarked_request_is_keyed_by_its_first_4096_bytes() {
        let long = "x".repeat(AUTO_PREFIX_BYTES);
        let chat = |system: &str, user: &str| ChatRequest {
            messages: vec![
                ChatMessage::text("system", system),
                ChatMessage::text("user", user),
            ]
            .into(),
            ..ChatRequest::default()
        };
        // Below ~1,024 tokens nothing is cached upstream: no prefix.
        assert!(prefixes(&chat("short", "question"), "t", "r").is_empty());
        let a = prefixes(&chat(&long, "first question"), "t", "r");
        let b = prefixes(&chat(&long, "another question"), "t", "r");
        assert_eq!(a.len(), 1);
        assert_eq!(a, b, "only the first 4,096 bytes count");
        let mut changed = long.clone();
        changed.replace_range(4000..4001, "y");
        assert_ne!(prefixes(&chat(&changed, "first question"), "t", "r"), a);
        // The system turns come first wherever they stand.
        let moved = ChatRequest {
            messages: vec![
                ChatMessage::text("user", "first question"),
                ChatMessage::text("system", &long),
            ]
            .into(),
            ..ChatRequest::default()
        };
        assert_eq!(prefixes(&moved, "t", "r"), a);
        // Tools count towards the prefix.
        let mut with_tools = chat(&long, "first question");
        with_tools.tools = [tool(None)].into();
        assert_ne!(prefixes(&with_tools, "t", "r"), a);
    }

    #[test]
    fn prefixes_are_scoped_to_the_tenant_and_the_route() {
        let chat = turn("You are a coding agent.", &[], "fix the bug");
        let a = prefixes(&chat, "team-a", "code");
        let b = prefixes(&chat, "team-b", "code");
        let r = prefixes(&chat, "team-a", "other");
        for i in 0..a.len() {
            assert_ne!(a[i], b[i]);
            assert_ne!(a[i], r[i]);
        }
        // Length-prefixed: a tenant name cannot pass for another's with the route.
        assert_ne!(
            prefixes(&chat, "team-a", "bc"),
            prefixes(&chat, "team-ab", "c")
        );
    }

    #[test]
    fn tool_calls_and_results_are_part_of_the_prefix() {
        let mut a = turn("sys", &["q"], "next");
        Arc::make_mut(&mut a.messages).insert(
            2,
            ChatMessage {
                tool_calls: vec![ToolCall {
                    id: "call_1".into(),
                    name: "read_file".into(),
                    arguments: r#"{"path":"a.rs"}"#.into(),
                }],
                ..ChatMessage::text("assistant", "")
            },
        );
        let mut b = a.clone();
        Arc::make_mut(&mut b.messages)[2].tool_calls[0].arguments = r#"{"path":"b.rs"}"#.into();
        assert_ne!(prefixes(&a, "t", "r")[0], prefixes(&b, "t", "r")[0]);
        assert_eq!(prefixes(&a, "t", "r")[1], prefixes(&b, "t", "r")[1]);
    }
}
