//! The mock's Anthropic prompt cache and signed thinking.
//!
//! Caching as Anthropic documents it: the prompt is tools, then system,
//! then messages, block by block; a `cache_control` marker ends a cacheable
//! prefix (at least [`MIN_CACHEABLE_TOKENS`]). A request reads the longest
//! warm prefix ending at a block boundary at or before its last marker
//! (looking back at most [`LOOKBACK_BLOCKS`] boundaries from each marker)
//! and writes the rest up to its last marker; each marker's prefix is then
//! warm for its TTL (`5m`, or `1h`), a read refreshes it. Tokens are
//! counted as the mock counts them everywhere: bytes / 4.
//!
//! Thinking: a request with `thinking` enabled (or adaptive) gets a
//! thinking block whose signature is a keyed SHA-256 of its text; a
//! thinking block sent back in an assistant turn must carry that signature,
//! and with thinking on an assistant turn holding `tool_use` must open with
//! its thinking block, else the answer is Anthropic's 400
//! `invalid_request_error`.

use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};

use base64::Engine as _;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

/// Smallest prefix Anthropic caches (Sonnet and Opus).
pub(crate) const MIN_CACHEABLE_TOKENS: u32 = 1024;
/// Block boundaries checked for a hit before each marker.
pub(crate) const LOOKBACK_BLOCKS: usize = 20;
/// Warm prefixes kept at most (expired ones go first, then all).
const MAX_ENTRIES: usize = 10_000;
/// The mock's signing key (a test value).
const SIGNING_KEY: &[u8] = b"mock-upstream-thinking-key";

const FIVE_MINUTES_MS: u64 = 5 * 60 * 1000;
const ONE_HOUR_MS: u64 = 60 * 60 * 1000;

/// What caching and thinking add to one answer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Extras {
    /// Uncached input, when the request had a marker (else the mock's
    /// usual estimate stands).
    pub input_tokens: Option<u32>,
    pub cache_read: u32,
    pub cache_write: u32,
    /// The part of `cache_write` under 1h markers.
    pub cache_write_1h: u32,
    /// The thinking block to answer with: its text and signature.
    pub thinking: Option<(String, String)>,
}

impl Extras {
    /// Anthropic's usage fields for the input side.
    pub(crate) fn usage(&self, estimate: u32) -> Value {
        json!({
            "input_tokens": self.input_tokens.unwrap_or(estimate),
            "cache_creation_input_tokens": self.cache_write,
            "cache_read_input_tokens": self.cache_read,
            "cache_creation": {
                "ephemeral_5m_input_tokens": self.cache_write - self.cache_write_1h,
                "ephemeral_1h_input_tokens": self.cache_write_1h,
            },
        })
    }

    /// Output tokens the thinking block adds.
    pub(crate) fn thinking_tokens(&self) -> u32 {
        self.thinking.as_ref().map_or(0, |(text, _)| {
            u32::try_from(text.split_whitespace().count()).unwrap_or(u32::MAX)
        })
    }
}

/// The signature of a thinking text.
pub(crate) fn sign(text: &str) -> String {
    let mut h = Sha256::new();
    h.update(SIGNING_KEY);
    h.update(text.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(h.finalize())
}

/// Warm prefixes: hash -> expiry (unix ms).
#[derive(Debug, Default)]
pub(crate) struct PromptCache {
    warm: HashMap<u64, u64>,
}

/// One block boundary of the prompt.
struct Boundary {
    hash: u64,
    tokens: u32,
    /// The block ending here carries a marker of this TTL (ms).
    marker_ttl: Option<u64>,
}

impl PromptCache {
    /// Checks the request's thinking blocks, then reads and writes its
    /// cacheable prefix at `now_ms`. `Err` is the 400 to answer.
    pub(crate) fn serve(
        &mut self,
        body: &Value,
        seq: u64,
        now_ms: u64,
    ) -> Result<Extras, (u16, Value)> {
        let thinking_on = thinking_enabled(body);
        check_thinking(body, thinking_on).map_err(|m| (400, invalid_request(&m)))?;
        let mut extras = self.cache(body, now_ms);
        if thinking_on {
            let text = format!("thought{seq}: the user asked; I will answer with the tokens.");
            let signature = sign(&text);
            extras.thinking = Some((text, signature));
        }
        Ok(extras)
    }

    fn cache(&mut self, body: &Value, now_ms: u64) -> Extras {
        let bounds = boundaries(body);
        let Some(last) = bounds.iter().rposition(|b| b.marker_ttl.is_some()) else {
            return Extras::default();
        };
        let total = bounds.last().map_or(0, |b| b.tokens);
        let read = self.longest_warm(&bounds[..=last], now_ms);
        let written_to = if bounds[last].tokens >= MIN_CACHEABLE_TOKENS {
            bounds[last].tokens
        } else {
            0
        };
        let write = written_to.saturating_sub(read);
        let last_1h = bounds[..=last]
            .iter()
            .filter(|b| b.marker_ttl == Some(ONE_HOUR_MS) && b.tokens >= MIN_CACHEABLE_TOKENS)
            .map(|b| b.tokens)
            .max()
            .unwrap_or(0);
        let write_1h = last_1h.saturating_sub(read).min(write);
        self.store(&bounds[..=last], read, now_ms);
        Extras {
            input_tokens: Some(total.saturating_sub(read + write).max(1)),
            cache_read: read,
            cache_write: write,
            cache_write_1h: write_1h,
            thinking: None,
        }
    }

    /// Tokens of the longest warm prefix among the boundaries within
    /// [`LOOKBACK_BLOCKS`] before a marker.
    fn longest_warm(&self, bounds: &[Boundary], now_ms: u64) -> u32 {
        let mut best = 0;
        for (i, b) in bounds.iter().enumerate() {
            let near_marker = bounds[i..]
                .iter()
                .take(LOOKBACK_BLOCKS + 1)
                .any(|m| m.marker_ttl.is_some());
            let warm = self.warm.get(&b.hash).is_some_and(|&exp| exp > now_ms);
            if near_marker && warm && b.tokens >= MIN_CACHEABLE_TOKENS {
                best = best.max(b.tokens);
            }
        }
        best
    }

    /// Each marker's prefix is warm for its TTL; the prefix read is refreshed.
    fn store(&mut self, bounds: &[Boundary], read: u32, now_ms: u64) {
        if self.warm.len() >= MAX_ENTRIES {
            self.warm.retain(|_, exp| *exp > now_ms);
            if self.warm.len() >= MAX_ENTRIES {
                self.warm.clear();
            }
        }
        for b in bounds.iter().filter(|b| b.tokens >= MIN_CACHEABLE_TOKENS) {
            let ttl = match b.marker_ttl {
                Some(ttl) => Some(ttl),
                None if b.tokens == read => Some(FIVE_MINUTES_MS),
                None => None,
            };
            if let Some(ttl) = ttl {
                let exp = self.warm.entry(b.hash).or_insert(0);
                *exp = (*exp).max(now_ms + ttl);
            }
        }
    }
}

/// The prompt's blocks in Anthropic's cache order (tools, system,
/// messages), each with the running hash and token count of the prefix
/// ending with it.
fn boundaries(body: &Value) -> Vec<Boundary> {
    let mut blocks: Vec<&Value> = Vec::new();
    if let Some(tools) = body.get("tools").and_then(Value::as_array) {
        blocks.extend(tools);
    }
    let messages = body.get("messages").and_then(Value::as_array);
    let contents = messages
        .into_iter()
        .flatten()
        .filter_map(|m| m.get("content"));
    for c in body.get("system").into_iter().chain(contents) {
        match c {
            Value::Array(list) => blocks.extend(list),
            other => blocks.push(other),
        }
    }
    let mut hasher = DefaultHasher::new();
    body.get("model").and_then(Value::as_str).hash(&mut hasher);
    let mut bytes = 0usize;
    blocks
        .into_iter()
        .map(|block| {
            let mut content = block.clone();
            let marker = content
                .as_object_mut()
                .and_then(|o| o.remove("cache_control"));
            let text = content.to_string();
            // String content is one text block, as Anthropic reads it: a
            // turn sent marked (as a block) and later unmarked (as a
            // string) is the same prefix. Counted as sent.
            match &content {
                Value::String(s) => json!({"type": "text", "text": s}).to_string(),
                _ => text.clone(),
            }
            .hash(&mut hasher);
            bytes += text.len();
            Boundary {
                hash: hasher.finish(),
                tokens: u32::try_from(bytes / 4).unwrap_or(u32::MAX),
                marker_ttl: marker.map(|m| match m.get("ttl").and_then(Value::as_str) {
                    Some("1h") => ONE_HOUR_MS,
                    _ => FIVE_MINUTES_MS,
                }),
            }
        })
        .collect()
}

fn thinking_enabled(body: &Value) -> bool {
    matches!(
        body.pointer("/thinking/type").and_then(Value::as_str),
        Some("enabled" | "adaptive")
    )
}

/// Anthropic's checks on thinking sent back: every thinking block's
/// signature, and (thinking on) a tool-use turn opening with its thinking.
fn check_thinking(body: &Value, thinking_on: bool) -> Result<(), String> {
    let messages = body.get("messages").and_then(Value::as_array);
    for (i, m) in messages.into_iter().flatten().enumerate() {
        if m.get("role").and_then(Value::as_str) != Some("assistant") {
            continue;
        }
        let Some(blocks) = m.get("content").and_then(Value::as_array) else {
            continue;
        };
        for (j, b) in blocks.iter().enumerate() {
            if b.get("type").and_then(Value::as_str) != Some("thinking") {
                continue;
            }
            let text = b.get("thinking").and_then(Value::as_str).unwrap_or("");
            let signature = b.get("signature").and_then(Value::as_str).unwrap_or("");
            if signature != sign(text) {
                return Err(format!(
                    "messages.{i}.content.{j}: Invalid `signature` in `thinking` block"
                ));
            }
        }
        let kind = |b: &Value| b.get("type").and_then(Value::as_str).map(str::to_owned);
        let uses_tool = blocks
            .iter()
            .any(|b| kind(b).as_deref() == Some("tool_use"));
        let opens = blocks.first().and_then(kind);
        let opens_with_thinking =
            matches!(opens.as_deref(), Some("thinking" | "redacted_thinking"));
        if thinking_on && uses_tool && !opens_with_thinking {
            return Err(format!(
                "messages.{i}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{}`. When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding the lastmost set of `tool_use` and `tool_result` blocks).",
                opens.unwrap_or_default()
            ));
        }
    }
    Ok(())
}

fn invalid_request(message: &str) -> Value {
    json!({"type": "error", "error": {"type": "invalid_request_error", "message": message}})
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn prompt(system: &str, marker: Value, user: &str) -> Value {
        json!({
            "model": "claude",
            "system": [{"type": "text", "text": system, "cache_control": marker}],
            "messages": [{"role": "user", "content": user}],
        })
    }

    const LONG: usize = 8000; // 2,000 tokens

    #[test]
    fn a_repeated_marked_prefix_is_written_then_read_until_its_ttl_passes() {
        let mut c = PromptCache::default();
        let system = "s".repeat(LONG);
        let body = prompt(&system, json!({"type": "ephemeral"}), "hi");
        let first = c.serve(&body, 1, 0).unwrap();
        assert_eq!(
            (first.cache_read, first.cache_write),
            (0, first.cache_write)
        );
        assert!(first.cache_write >= 2000, "{first:?}");
        let prefix = first.cache_write;
        // Another user turn after the same prefix: read.
        let again = prompt(&system, json!({"type": "ephemeral"}), "another question");
        let second = c.serve(&again, 2, 60_000).unwrap();
        assert_eq!((second.cache_read, second.cache_write), (prefix, 0));
        // The read refreshed it: warm 5 minutes after the read, not after the write.
        let third = c.serve(&again, 3, 60_000 + FIVE_MINUTES_MS - 1).unwrap();
        assert_eq!(third.cache_read, prefix);
        let cold = c.serve(&again, 4, 60_000 + 2 * FIVE_MINUTES_MS).unwrap();
        assert_eq!((cold.cache_read, cold.cache_write), (0, prefix));
        // A 1h marker outlives five minutes, and its write is the 1h part.
        let hour = prompt(&system, json!({"type": "ephemeral", "ttl": "1h"}), "x");
        let mut c = PromptCache::default();
        let w = c.serve(&hour, 5, 0).unwrap();
        assert_eq!(w.cache_write_1h, w.cache_write);
        assert_eq!(c.serve(&hour, 6, 30 * 60_000).unwrap().cache_read, prefix);
        // Usage in Anthropic's shape.
        assert_eq!(
            w.usage(0)["cache_creation"],
            json!({"ephemeral_5m_input_tokens": 0, "ephemeral_1h_input_tokens": prefix})
        );
    }

    #[test]
    fn short_prefixes_and_unmarked_prompts_are_not_cached() {
        let mut c = PromptCache::default();
        let short = prompt("short", json!({"type": "ephemeral"}), "hi");
        assert_eq!(c.serve(&short, 1, 0).unwrap().cache_write, 0);
        assert_eq!(c.serve(&short, 2, 1).unwrap().cache_read, 0);
        let plain = json!({"model": "claude", "messages": [{"role": "user", "content": "hi"}]});
        assert_eq!(c.serve(&plain, 3, 2).unwrap(), Extras::default());
    }

    #[test]
    fn a_turn_sent_marked_as_a_block_then_as_a_string_is_the_same_prefix() {
        let mut c = PromptCache::default();
        let long = "u".repeat(LONG);
        let marked =
            json!([{"type": "text", "text": &long, "cache_control": {"type": "ephemeral"}}]);
        let first = json!({"model": "claude", "messages": [{"role": "user", "content": marked}]});
        let written = c.serve(&first, 1, 0).unwrap().cache_write;
        // Switchyard sends an unmarked one-text turn as a string.
        let next = json!({"model": "claude", "messages": [
            {"role": "user", "content": &long},
            {"role": "assistant", "content": "ok"},
            {"role": "user", "content": [{"type": "text", "text": "more",
                                          "cache_control": {"type": "ephemeral"}}]},
        ]});
        let second = c.serve(&next, 2, 1000).unwrap();
        assert!(second.cache_read > 0, "{second:?}");
        assert!(second.cache_read <= written, "{second:?} {written}");
    }

    #[test]
    fn a_marker_moved_to_a_later_turn_reads_the_earlier_prefix() {
        let mut c = PromptCache::default();
        let long = "u".repeat(LONG);
        // Claude Code's shape: the marker rides on the last user turn.
        let turn = |n: usize| {
            let mut messages = Vec::new();
            for k in 0..n {
                let mut text = json!({"type": "text", "text": format!("{long}{k}")});
                if k + 1 == n {
                    text["cache_control"] = json!({"type": "ephemeral"});
                } else {
                    messages.push(json!({"role": "user", "content": [text]}));
                    messages.push(json!({"role": "assistant", "content": format!("answer {k}")}));
                    continue;
                }
                messages.push(json!({"role": "user", "content": [text]}));
            }
            json!({"model": "claude", "messages": messages})
        };
        let first = c.serve(&turn(1), 1, 0).unwrap();
        assert_eq!(first.cache_read, 0);
        let second = c.serve(&turn(2), 2, 1000).unwrap();
        assert_eq!(second.cache_read, first.cache_write);
        assert!(second.cache_write >= 2000, "{second:?}");
        let third = c.serve(&turn(3), 3, 2000).unwrap();
        assert_eq!(third.cache_read, second.cache_read + second.cache_write);
    }

    #[test]
    fn thinking_is_signed_and_an_altered_block_sent_back_is_refused() {
        let mut c = PromptCache::default();
        let ask = json!({"model": "claude", "thinking": {"type": "enabled", "budget_tokens": 2048},
                         "messages": [{"role": "user", "content": "hi"}]});
        let (text, signature) = c.serve(&ask, 7, 0).unwrap().thinking.unwrap();
        assert_eq!(signature, sign(&text));
        let back = |thinking: &str, signature: &str| {
            json!({"model": "claude", "thinking": {"type": "enabled", "budget_tokens": 2048},
                   "messages": [
                       {"role": "user", "content": "hi"},
                       {"role": "assistant", "content": [
                           {"type": "thinking", "thinking": thinking, "signature": signature},
                           {"type": "tool_use", "id": "t1", "name": "f", "input": {}}]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "ok"}]}]})
        };
        assert!(c.serve(&back(&text, &signature), 8, 0).is_ok());
        let (status, err) = c.serve(&back("edited", &signature), 9, 0).unwrap_err();
        assert_eq!(status, 400);
        assert_eq!(err["error"]["type"], "invalid_request_error");
        assert_eq!(
            err["error"]["message"],
            "messages.1.content.0: Invalid `signature` in `thinking` block"
        );
        // Thinking on, a tool-use turn without its thinking block: refused.
        let mut stripped = back(&text, &signature);
        stripped["messages"][1]["content"]
            .as_array_mut()
            .unwrap()
            .remove(0);
        let (_, err) = c.serve(&stripped, 10, 0).unwrap_err();
        assert!(err["error"]["message"]
            .as_str()
            .unwrap()
            .contains("but found `tool_use`"));
        // Without thinking asked for, no block and no such rule.
        stripped.as_object_mut().unwrap().remove("thinking");
        assert_eq!(c.serve(&stripped, 11, 0).unwrap().thinking, None);
    }
}
