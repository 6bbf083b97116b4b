//! Fault specifications (the JSON of `PUT /_mock/faults` and `--fault`) and
//! the per-request selection state (`times` countdown, seeded `fraction`).
//! Knows nothing of HTTP or wire formats; `wire` and `script` turn a chosen
//! [`Fault`] into bytes.

use std::collections::BTreeMap;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// A canned error body, rendered in the dialect of the endpoint that was hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Preset {
    /// 429 `rate_limit_exceeded` (OpenAI) / `rate_limit_error` (Anthropic).
    RateLimit,
    /// 429 `insufficient_quota` (OpenAI; Anthropic renders `spend_limit`).
    InsufficientQuota,
    /// 429 `rate_limit_error` + `details.error_code: enforced_spend_limit_reached`
    /// (Anthropic; OpenAI renders `insufficient_quota`).
    SpendLimit,
    /// 429 "Request too large ... Limit 30000, Requested 34307." (OpenAI);
    /// 413 `request_too_large` (Anthropic).
    RequestTooLarge,
    /// 503 "The engine is currently overloaded" (OpenAI) / 529 `overloaded_error`.
    Overloaded,
    /// 503 "Slow Down" (OpenAI) / 529 `overloaded_error` (Anthropic).
    SlowDown,
    /// 500 `server_error` / `api_error`.
    ServerError,
    /// 401 with the marker `sk-secret-upstream-401-body` in the message.
    Auth,
    /// 400 `invalid_request_error`.
    Invalid,
    /// 400 `context_length_exceeded` / "prompt is too long".
    ContextLength,
    /// 404 `model_not_found` / `not_found_error`.
    NotFound,
    /// 400 `content_filter` with Azure's `innererror` (OpenAI dialect);
    /// 400 `invalid_request_error` (Anthropic).
    ContentFilter,
}

impl Preset {
    /// The preset a bare status code stands for.
    pub fn for_status(status: u16) -> Preset {
        match status {
            400 | 422 => Preset::Invalid,
            401 | 403 => Preset::Auth,
            404 => Preset::NotFound,
            413 => Preset::RequestTooLarge,
            429 => Preset::RateLimit,
            503 | 529 => Preset::Overloaded,
            _ => Preset::ServerError,
        }
    }
}

/// What to do to a request. Serialised with a `type` tag, snake_case.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum Fault {
    /// Healthy.
    #[default]
    None,
    /// An HTTP error before any body. `status` alone picks a matching preset
    /// body; `preset` alone picks its real status; `body` replaces the body.
    Status {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        status: Option<u16>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        preset: Option<Preset>,
        #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
        headers: BTreeMap<String, String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
    },
    /// Close the listener for `duration_ms`, then listen again on the same port.
    Refuse { duration_ms: u64 },
    /// Read the request, never answer.
    Hang,
    /// Headers at once; the body (first token) after `delay_ms`.
    SlowFirstToken { delay_ms: u64 },
    /// After `after_tokens` tokens, cut the connection: FIN, or RST if `reset`.
    Abort {
        #[serde(default)]
        after_tokens: u32,
        #[serde(default)]
        reset: bool,
    },
    /// After `after_tokens` tokens, send nothing more but keep the connection.
    Stall {
        #[serde(default)]
        after_tokens: u32,
    },
    /// After `after_tokens` tokens, an in-stream error frame, then end.
    ErrorEvent {
        #[serde(default)]
        after_tokens: u32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_type: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
        /// OpenAI only: `data: [DONE]` after the error frame (vLLM shape).
        #[serde(default)]
        then_done: bool,
    },
    /// After `after_tokens` tokens, stop with `refusal` / `content_filter`.
    Refusal {
        #[serde(default)]
        after_tokens: u32,
    },
    /// A complete-looking stream without `[DONE]` / `message_stop`.
    NoTerminator,
    /// After `after_tokens` tokens a broken JSON frame; then continue, or end if `close`.
    Malformed {
        #[serde(default)]
        after_tokens: u32,
        #[serde(default)]
        close: bool,
    },
    /// 200 then only `data: [DONE]` (Anthropic: an empty stream).
    EmptyDone,
    /// Streams `tokens` tokens whatever the request's `max_tokens` says,
    /// each padded to `token_bytes` bytes.
    Flood {
        tokens: u32,
        #[serde(default)]
        token_bytes: usize,
    },
    /// After the prelude, one SSE line of `bytes` bytes that never ends.
    HugeLine { bytes: u64 },
    /// After `after_tokens` tokens, the next frame one byte every `byte_delay_ms`.
    Trickle {
        #[serde(default)]
        after_tokens: u32,
        byte_delay_ms: u64,
    },
    /// OpenAI: every token also as a second choice (`index: 1`).
    SecondChoice,
    /// A JSON-mode answer under the key `reply` instead of `answer` (a
    /// target that breaks the caller's schema).
    OffSchema,
    /// Anthropic: an `input_json_delta` for a block no `content_block_start` opened.
    OrphanDelta,
    /// llama.cpp legacy `error: {...}` line, then `data: [DONE]`.
    LegacyError {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<u16>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        message: Option<String>,
    },
}

impl Fault {
    /// The `type` tag, as logged in `RequestRecord.fault`.
    pub fn name(&self) -> &'static str {
        match self {
            Fault::None => "none",
            Fault::Status { .. } => "status",
            Fault::Refuse { .. } => "refuse",
            Fault::Hang => "hang",
            Fault::SlowFirstToken { .. } => "slow_first_token",
            Fault::Abort { .. } => "abort",
            Fault::Stall { .. } => "stall",
            Fault::ErrorEvent { .. } => "error_event",
            Fault::Refusal { .. } => "refusal",
            Fault::NoTerminator => "no_terminator",
            Fault::Malformed { .. } => "malformed",
            Fault::EmptyDone => "empty_done",
            Fault::LegacyError { .. } => "legacy_error",
            Fault::Flood { .. } => "flood",
            Fault::HugeLine { .. } => "huge_line",
            Fault::Trickle { .. } => "trickle",
            Fault::SecondChoice => "second_choice",
            Fault::OffSchema => "off_schema",
            Fault::OrphanDelta => "orphan_delta",
        }
    }

    /// Token position at which a mid-stream fault strikes, if it is one.
    pub fn after_tokens(&self) -> Option<u32> {
        match self {
            Fault::Abort { after_tokens, .. }
            | Fault::Stall { after_tokens }
            | Fault::ErrorEvent { after_tokens, .. }
            | Fault::Refusal { after_tokens }
            | Fault::Trickle { after_tokens, .. }
            | Fault::Malformed { after_tokens, .. } => Some(*after_tokens),
            _ => None,
        }
    }
}

/// Every key a fault spec may carry (flattened enums cannot deny unknown fields).
const KNOWN_KEYS: &[&str] = &[
    "type",
    "times",
    "fraction",
    "seed",
    "status",
    "preset",
    "headers",
    "body",
    "duration_ms",
    "delay_ms",
    "after_tokens",
    "reset",
    "error_type",
    "message",
    "then_done",
    "close",
    "code",
    "tokens",
    "bytes",
    "byte_delay_ms",
    "token_bytes",
];

/// A fault plus when to apply it. `{}` means healthy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, Default)]
#[serde(try_from = "serde_json::Value")]
pub struct FaultSpec {
    #[serde(flatten)]
    pub fault: Fault,
    /// Apply to the next N selected requests only, then healthy again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u32>,
    /// Apply to this random fraction (0..=1) of requests.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fraction: Option<f64>,
    /// Seed for `fraction` (defaults to the mock's `--seed`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

/// Derivable mirror of [`FaultSpec`], used after defaulting and key checks.
#[derive(Deserialize)]
struct RawSpec {
    #[serde(flatten)]
    fault: Fault,
    #[serde(default)]
    times: Option<u32>,
    #[serde(default)]
    fraction: Option<f64>,
    #[serde(default)]
    seed: Option<u64>,
}

impl TryFrom<serde_json::Value> for FaultSpec {
    type Error = String;

    fn try_from(value: serde_json::Value) -> Result<Self, String> {
        let serde_json::Value::Object(mut map) = value else {
            return Err("a fault spec must be a JSON object".into());
        };
        if let Some(bad) = map.keys().find(|k| !KNOWN_KEYS.contains(&k.as_str())) {
            return Err(format!("unknown fault field `{bad}`"));
        }
        map.entry("type").or_insert_with(|| "none".into());
        let raw: RawSpec =
            serde_json::from_value(serde_json::Value::Object(map)).map_err(|e| e.to_string())?;
        if let Some(f) = raw.fraction {
            if !(0.0..=1.0).contains(&f) {
                return Err(format!("fraction must be within 0..=1, got {f}"));
            }
        }
        Ok(FaultSpec {
            fault: raw.fault,
            times: raw.times,
            fraction: raw.fraction,
            seed: raw.seed,
        })
    }
}

impl FaultSpec {
    /// Parses the JSON of `PUT /_mock/faults` / `--fault`.
    pub fn parse(json: &str) -> Result<Self, String> {
        let v: serde_json::Value = serde_json::from_str(json).map_err(|e| e.to_string())?;
        FaultSpec::try_from(v)
    }

    /// A spec that applies `fault` to every request.
    pub fn always(fault: Fault) -> Self {
        FaultSpec {
            fault,
            ..FaultSpec::default()
        }
    }

    /// Limits the spec to the next `n` requests.
    pub fn times(mut self, n: u32) -> Self {
        self.times = Some(n);
        self
    }

    /// Applies the spec to a seeded random fraction of requests.
    pub fn fraction(mut self, fraction: f64, seed: u64) -> Self {
        self.fraction = Some(fraction);
        self.seed = Some(seed);
        self
    }
}

impl From<Fault> for FaultSpec {
    fn from(fault: Fault) -> Self {
        FaultSpec::always(fault)
    }
}

/// The active spec and its selection state.
pub(crate) struct FaultState {
    /// The spec as set; `times` counts down as it is applied.
    spec: FaultSpec,
    /// Random source for `fraction`, reseeded on every set.
    rng: StdRng,
    /// Bumped on every set, so a finished `refuse` only clears its own spec.
    generation: u64,
    /// Seed used when a spec has none.
    default_seed: u64,
}

impl FaultState {
    pub(crate) fn new(default_seed: u64) -> Self {
        FaultState {
            spec: FaultSpec::default(),
            rng: StdRng::seed_from_u64(default_seed),
            generation: 0,
            default_seed,
        }
    }

    /// Replaces the spec; returns its generation.
    pub(crate) fn set(&mut self, spec: FaultSpec) -> u64 {
        self.rng = StdRng::seed_from_u64(spec.seed.unwrap_or(self.default_seed));
        self.spec = spec;
        self.generation += 1;
        self.generation
    }

    /// The current spec (with `times` showing what is left).
    pub(crate) fn current(&self) -> FaultSpec {
        self.spec.clone()
    }

    /// Clears the spec if it is still the one set at `generation`.
    pub(crate) fn clear_if(&mut self, generation: u64) {
        if self.generation == generation {
            self.set(FaultSpec::default());
        }
    }

    /// Decides the fault for one request; `None` means serve it healthy.
    pub(crate) fn pick(&mut self) -> Option<Fault> {
        if self.spec.fault == Fault::None || self.spec.times == Some(0) {
            return None;
        }
        if let Some(fraction) = self.spec.fraction {
            if self.rng.random::<f64>() >= fraction {
                return None;
            }
        }
        if let Some(left) = self.spec.times.as_mut() {
            *left -= 1;
        }
        Some(self.spec.fault.clone())
    }
}
