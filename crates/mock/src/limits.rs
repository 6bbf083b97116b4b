//! Per-key rate-limit windows (`PUT` / `GET /_mock/limits`): the config,
//! each key's fixed window and its counters (used, peak, limited), the
//! charge a request takes at arrival, and how a window shows on the wire:
//! OpenAI's `x-ratelimit-*` and Anthropic's `anthropic-ratelimit-*` headers,
//! `retry-after`, and each kind's 429 body.
//! Knows no HTTP server: `server` asks for a [`Charge`] per request. Keys are
//! held in memory only to count them; the view never shows one.

use std::collections::{BTreeMap, HashMap};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};
use tokio::time::Instant;

use super::faults::Preset;
use super::MockKind;

/// `window_ms` when the config names none.
pub const DEFAULT_WINDOW_MS: u64 = 60_000;

/// What a window may hold: requests and tokens (`None` = not limited).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Limit {
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
}

impl Limit {
    fn is_limited(&self) -> bool {
        self.rpm.is_some() || self.tpm.is_some()
    }
}

/// One key's entry in `keys`: its limits (each unset one falls back to
/// `default`'s) and the usage its first window starts with (at the PUT).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct KeyLimit {
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
    #[serde(skip_serializing_if = "is_zero")]
    pub used_requests: u64,
    #[serde(skip_serializing_if = "is_zero")]
    pub used_tokens: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// The body of `PUT /_mock/limits`; `{}` clears every limit.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSpec {
    /// Length of each key's fixed window (default 60 000).
    pub window_ms: Option<u64>,
    /// Limits of a key without its own entry (or the fields its entry leaves unset).
    pub default: Option<Limit>,
    /// Key value, as sent -> its entry.
    pub keys: BTreeMap<String, KeyLimit>,
}

/// One key in `GET /_mock/limits`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeyUsage {
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
    /// Held by the current window (0 once it has ended).
    pub used_requests: u64,
    pub used_tokens: u64,
    /// The most one window of this key ever held.
    pub peak_tokens: u64,
    pub peak_requests: u64,
    /// Requests answered 429 by a window.
    pub limited: u64,
    /// Until the current window ends (0 when none is open).
    pub window_remaining_ms: u64,
}

/// The body of `GET /_mock/limits`: keys by label, never by value.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LimitsView {
    pub window_ms: u64,
    pub keys: BTreeMap<String, KeyUsage>,
}

/// Which budget refused a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Budget {
    Requests,
    Tokens,
}

/// Why a request was refused: the budget, its limit, what the window
/// held and what the request asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Refusal {
    pub budget: Budget,
    pub limit: u64,
    pub used: u64,
    pub requested: u64,
}

/// The outcome of charging one request to a limited key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charge {
    /// The key's limits.
    pub limit: Limit,
    /// `Some` when the request would have gone past a limit (not charged).
    pub refused: Option<Refusal>,
    /// Tokens charged (0 when refused).
    pub tokens: u64,
    /// What the window holds after this request.
    pub used_requests: u64,
    pub used_tokens: u64,
    /// Until the window ends.
    pub reset_in: Duration,
}

/// One key's counters.
#[derive(Debug, Clone, Copy, Default)]
struct Usage {
    /// Start of the open window (`None`: the next request opens one).
    start: Option<Instant>,
    requests: u64,
    tokens: u64,
    peak_requests: u64,
    peak_tokens: u64,
    limited: u64,
}

impl Usage {
    /// Closes the window if it has ended by `now`.
    fn roll(&mut self, window: Duration, now: Instant) {
        if self.start.is_some_and(|s| now >= s + window) {
            self.start = None;
            self.requests = 0;
            self.tokens = 0;
        }
    }

    fn remaining(&self, window: Duration, now: Instant) -> Duration {
        self.start.map_or(Duration::ZERO, |s| {
            (s + window).saturating_duration_since(now)
        })
    }

    fn note_peak(&mut self) {
        self.peak_requests = self.peak_requests.max(self.requests);
        self.peak_tokens = self.peak_tokens.max(self.tokens);
    }
}

/// The config and every key's counters.
#[derive(Debug, Default)]
pub(crate) struct Limits {
    spec: LimitsSpec,
    usage: HashMap<String, Usage>,
}

impl Limits {
    fn window(&self) -> Duration {
        Duration::from_millis(self.spec.window_ms.unwrap_or(DEFAULT_WINDOW_MS))
    }

    /// Replaces the config and resets every counter; pre-loaded usage opens
    /// its key's first window at `now`.
    pub(crate) fn set(&mut self, spec: LimitsSpec, now: Instant) -> Result<(), String> {
        if spec.window_ms == Some(0) {
            return Err("window_ms must be > 0".into());
        }
        self.usage.clear();
        for (key, entry) in &spec.keys {
            if entry.used_requests > 0 || entry.used_tokens > 0 {
                let mut u = Usage {
                    start: Some(now),
                    requests: entry.used_requests,
                    tokens: entry.used_tokens,
                    ..Usage::default()
                };
                u.note_peak();
                self.usage.insert(key.clone(), u);
            }
        }
        self.spec = spec;
        Ok(())
    }

    /// The limits of `key`: its entry's, each unset field from `default`.
    fn limit_for(&self, key: &str) -> Limit {
        let default = self.spec.default.unwrap_or_default();
        match self.spec.keys.get(key) {
            Some(e) => Limit {
                rpm: e.rpm.or(default.rpm),
                tpm: e.tpm.or(default.tpm),
            },
            None => default,
        }
    }

    /// Charges one request of `tokens` to `key` at `now`, unless that would
    /// take its window past a limit. `None`: the key is unlimited.
    pub(crate) fn charge(&mut self, key: &str, tokens: u64, now: Instant) -> Option<Charge> {
        let limit = self.limit_for(key);
        if !limit.is_limited() {
            return None;
        }
        let window = self.window();
        let u = self.usage.entry(key.to_owned()).or_default();
        u.roll(window, now);
        if u.start.is_none() {
            u.start = Some(now);
        }
        let refused = match (limit.rpm, limit.tpm) {
            (Some(rpm), _) if u.requests.saturating_add(1) > rpm => Some(Refusal {
                budget: Budget::Requests,
                limit: rpm,
                used: u.requests,
                requested: 1,
            }),
            (_, Some(tpm)) if u.tokens.saturating_add(tokens) > tpm => Some(Refusal {
                budget: Budget::Tokens,
                limit: tpm,
                used: u.tokens,
                requested: tokens,
            }),
            _ => None,
        };
        if refused.is_some() {
            u.limited += 1;
        } else {
            u.requests = u.requests.saturating_add(1);
            u.tokens = u.tokens.saturating_add(tokens);
            u.note_peak();
        }
        Some(Charge {
            limit,
            refused,
            tokens: if refused.is_some() { 0 } else { tokens },
            used_requests: u.requests,
            used_tokens: u.tokens,
            reset_in: u.remaining(window, now),
        })
    }

    /// `GET /_mock/limits`: every configured or counted key, under its
    /// label (`labels`, else its first 6 characters and `…`).
    pub(crate) fn view(&self, labels: &BTreeMap<String, String>, now: Instant) -> LimitsView {
        let window = self.window();
        let mut keys: Vec<&String> = self.spec.keys.keys().collect();
        keys.extend(
            self.usage
                .keys()
                .filter(|k| !self.spec.keys.contains_key(*k)),
        );
        keys.sort();
        let mut out = BTreeMap::new();
        for key in keys {
            let limit = self.limit_for(key);
            let mut u = self.usage.get(key).copied().unwrap_or_default();
            u.roll(window, now);
            let usage = KeyUsage {
                rpm: limit.rpm,
                tpm: limit.tpm,
                used_requests: u.requests,
                used_tokens: u.tokens,
                peak_tokens: u.peak_tokens,
                peak_requests: u.peak_requests,
                limited: u.limited,
                window_remaining_ms: ceil_ms(u.remaining(window, now)),
            };
            let base = labels.get(key).cloned().unwrap_or_else(|| short_label(key));
            let mut label = base.clone();
            let mut n = 2;
            while out.contains_key(&label) {
                label = format!("{base}#{n}");
                n += 1;
            }
            out.insert(label, usage);
        }
        LimitsView {
            window_ms: u64::try_from(window.as_millis()).unwrap_or(u64::MAX),
            keys: out,
        }
    }
}

/// A key's first 6 characters and `…` (`(no key)` for a request without one).
fn short_label(key: &str) -> String {
    if key.is_empty() {
        return "(no key)".into();
    }
    let head: String = key.chars().take(6).collect();
    format!("{head}…")
}

fn ceil_ms(d: Duration) -> u64 {
    u64::try_from(d.as_micros().div_ceil(1000)).unwrap_or(u64::MAX)
}

/// A duration as OpenAI writes it (Go's format, to the millisecond):
/// `120ms`, `1s`, `59.874s`, `6m0s`, `1h2m3s`.
pub(crate) fn openai_duration(d: Duration) -> String {
    let ms = ceil_ms(d);
    if ms == 0 {
        return "0s".into();
    }
    if ms < 1000 {
        return format!("{ms}ms");
    }
    let (h, m) = (ms / 3_600_000, (ms / 60_000) % 60);
    let (s, frac) = ((ms / 1000) % 60, ms % 1000);
    let secs = if frac == 0 {
        format!("{s}s")
    } else {
        let f = format!("{frac:03}");
        format!("{s}.{}s", f.trim_end_matches('0'))
    };
    match (h, m) {
        (0, 0) => secs,
        (0, m) => format!("{m}m{secs}"),
        (h, m) => format!("{h}h{m}m{secs}"),
    }
}

/// `now + d` as Anthropic writes a reset: RFC 3339 UTC, whole seconds,
/// rounded up (e.g. `2026-12-02T16:30:00Z`).
pub(crate) fn rfc3339_after(now: SystemTime, d: Duration) -> String {
    let end = now + d;
    let ms = end
        .duration_since(UNIX_EPOCH)
        .map_or(0, |e| u64::try_from(e.as_millis()).unwrap_or(u64::MAX));
    let at = UNIX_EPOCH + Duration::from_secs(ms.div_ceil(1000));
    humantime_serde::re::humantime::format_rfc3339_seconds(at).to_string()
}

/// `retry-after`: whole seconds, rounded up, at least 1.
fn retry_after(d: Duration) -> u64 {
    ceil_ms(d).div_ceil(1000).max(1)
}

/// Response extension marking a window's 429, so the Bedrock and Vertex
/// wrappers keep its `retry-after` when they re-render the error.
#[derive(Debug, Clone, Copy)]
pub(crate) struct WindowRefused;

/// Which rate-limit headers a path sends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderStyle {
    /// OpenAI and Azure: `x-ratelimit-*`.
    OpenAi,
    /// Anthropic's own API (`/v1/messages`): `anthropic-ratelimit-*`.
    Anthropic,
    /// Bedrock, Vertex, Gemini: none (a 429 still gets `retry-after`).
    None,
}

/// The headers a response of a limited key carries after its charge.
pub(crate) fn headers(style: HeaderStyle, c: &Charge, now: SystemTime) -> Vec<(String, String)> {
    let mut out: Vec<(String, String)> = Vec::new();
    if c.refused.is_some() {
        out.push(("retry-after".into(), retry_after(c.reset_in).to_string()));
    }
    let budgets = [
        (c.limit.rpm, c.used_requests, "requests"),
        (c.limit.tpm, c.used_tokens, "tokens"),
    ];
    match style {
        HeaderStyle::OpenAi => {
            let reset = openai_duration(c.reset_in);
            for (limit, used, name) in budgets {
                let Some(limit) = limit else { continue };
                let remaining = limit.saturating_sub(used);
                out.push((format!("x-ratelimit-limit-{name}"), limit.to_string()));
                out.push((
                    format!("x-ratelimit-remaining-{name}"),
                    remaining.to_string(),
                ));
                out.push((format!("x-ratelimit-reset-{name}"), reset.clone()));
            }
        }
        HeaderStyle::Anthropic => {
            let reset = rfc3339_after(now, c.reset_in);
            let mut put = |name: &str, limit: u64, used: u64| {
                let remaining = limit.saturating_sub(used);
                let h = |part: &str| format!("anthropic-ratelimit-{name}-{part}");
                out.push((h("limit"), limit.to_string()));
                out.push((h("remaining"), remaining.to_string()));
                out.push((h("reset"), reset.clone()));
            };
            if let Some(rpm) = c.limit.rpm {
                put("requests", rpm, c.used_requests);
            }
            if let Some(tpm) = c.limit.tpm {
                for name in ["tokens", "input-tokens", "output-tokens"] {
                    put(name, tpm, c.used_tokens);
                }
            }
        }
        HeaderStyle::None => {}
    }
    out
}

/// The 429 a window answers with, in `dialect`'s published shape.
pub(crate) fn refusal_body(
    dialect: MockKind,
    r: &Refusal,
    reset_in: Duration,
    model: &str,
    request_id: &str,
) -> (u16, Value) {
    let (limit, used, requested) = (r.limit, r.used, r.requested);
    match dialect {
        MockKind::Openai => {
            let (ty, what) = match r.budget {
                Budget::Requests => ("requests", "requests per min (RPM)"),
                Budget::Tokens => ("tokens", "tokens per min (TPM)"),
            };
            let message = format!(
                "Rate limit reached for {model} in organization org-mock on {what}: Limit {limit}, Used {used}, Requested {requested}. Please try again in {}.",
                openai_duration(reset_in)
            );
            (
                429,
                json!({"error": {"message": message, "type": ty, "param": null,
                                 "code": "rate_limit_exceeded"}}),
            )
        }
        MockKind::Anthropic => {
            let what = match r.budget {
                Budget::Requests => "requests",
                Budget::Tokens => "tokens",
            };
            let message = format!(
                "This request would exceed the rate limit for your organization (org-mock) of {limit} {what} per minute. For details, refer to: https://docs.claude.com/en/api/rate-limits. You can see the response headers for current usage. Please reduce the prompt length or the maximum tokens requested, or try again later."
            );
            (
                429,
                json!({"type": "error", "error": {"type": "rate_limit_error", "message": message},
                       "request_id": request_id}),
            )
        }
        MockKind::Gemini => {
            let (status, mut v) = super::gemini::preset_error(Preset::RateLimit, model);
            let secs = retry_after(reset_in);
            let quota = match r.budget {
                Budget::Requests => "GenerateRequestsPerMinutePerProjectPerModel",
                Budget::Tokens => "GenerateContentInputTokensPerModelPerMinute",
            };
            v["error"]["message"] = format!(
                "You exceeded your current quota, please check your plan and billing details. Please retry in {secs}s."
            )
            .into();
            if let Some(details) = v["error"]["details"].as_array_mut() {
                for d in details {
                    if let Some(violation) = d.pointer_mut("/violations/0") {
                        violation["quotaId"] = quota.into();
                        violation["quotaValue"] = limit.to_string().into();
                        violation["quotaDimensions"]["model"] = model.into();
                    }
                    if d.get("retryDelay").is_some() {
                        d["retryDelay"] = format!("{secs}s").into();
                    }
                }
            }
            (status, v)
        }
    }
}
