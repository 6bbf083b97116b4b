//! A model's `price`: USD per million tokens, with the providers' prompt-cache
//! multipliers, and the cost of one answer's usage.
use super::*;

/// USD per million tokens. Prompt-cache prices default from the input
/// price with the provider's published multipliers (Anthropic: reads 0.1x,
/// 5-minute writes 1.25x, 1-hour writes 2x; OpenAI: reads 0.5x, writes 1x;
/// Gemini: reads 0.25x, writes 1x); reasoning tokens bill as output.
#[derive(Debug, Clone, Copy, Deserialize, PartialEq, Default)]
#[serde(deny_unknown_fields, default)]
pub struct Price {
    pub input_per_mtok: f64,
    pub output_per_mtok: f64,
    #[serde(alias = "cache_read")]
    pub cache_read_per_mtok: Option<f64>,
    #[serde(alias = "cache_write_5m")]
    pub cache_write_5m_per_mtok: Option<f64>,
    #[serde(alias = "cache_write_1h")]
    pub cache_write_1h_per_mtok: Option<f64>,
}

/// Prompt-cache prices per million tokens: read, 5-minute write, 1-hour write.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CachePrices {
    pub read: f64,
    pub write_5m: f64,
    pub write_1h: f64,
}

impl Price {
    /// Plain input and output (estimates and reservations).
    pub fn cost(&self, input_tokens: u32, output_tokens: u32) -> f64 {
        (f64::from(input_tokens) * self.input_per_mtok
            + f64::from(output_tokens) * self.output_per_mtok)
            / 1e6
    }

    /// The prompt-cache prices on `dialect`'s wire: configured, or from the
    /// input price with the provider's multipliers.
    pub fn cache_prices(&self, dialect: crate::chat::Dialect) -> CachePrices {
        use crate::chat::Dialect;
        let input = self.input_per_mtok;
        let (read, write_5m, write_1h) = match dialect {
            Dialect::Anthropic => (0.1, 1.25, 2.0),
            Dialect::Openai => (0.5, 1.0, 1.0),
            Dialect::Gemini => (0.25, 1.0, 1.0),
        };
        CachePrices {
            read: self.cache_read_per_mtok.unwrap_or(input * read),
            write_5m: self.cache_write_5m_per_mtok.unwrap_or(input * write_5m),
            write_1h: self.cache_write_1h_per_mtok.unwrap_or(input * write_1h),
        }
    }

    /// The dearest rate per million a prompt token may be billed at on
    /// `dialect`'s wire (reservations): an upstream that caches on its own
    /// (OpenAI, Gemini) may read or write any prompt; an Anthropic one only
    /// what a marker covers, at the write price of the longest `marked` TTL.
    pub fn dearest_input_rate(
        &self,
        dialect: crate::chat::Dialect,
        marked: Option<crate::chat::CacheTtl>,
    ) -> f64 {
        use crate::chat::{CacheTtl, Dialect};
        let c = self.cache_prices(dialect);
        let ttl = match dialect {
            Dialect::Anthropic => marked,
            Dialect::Openai | Dialect::Gemini => Some(CacheTtl::FiveMinutes),
        };
        match ttl {
            None => self.input_per_mtok,
            Some(CacheTtl::FiveMinutes) => self.input_per_mtok.max(c.read).max(c.write_5m),
            Some(CacheTtl::OneHour) => self
                .input_per_mtok
                .max(c.read)
                .max(c.write_5m)
                .max(c.write_1h),
        }
    }

    /// The most a request may cost on `dialect`'s wire: every prompt token at
    /// the dearest rate it may be billed at, and `output_tokens` (reasoning
    /// included) at the output price.
    pub fn max_cost(
        &self,
        dialect: crate::chat::Dialect,
        marked: Option<crate::chat::CacheTtl>,
        prompt_tokens: u32,
        output_tokens: u32,
    ) -> f64 {
        (f64::from(prompt_tokens) * self.dearest_input_rate(dialect, marked)
            + f64::from(output_tokens) * self.output_per_mtok)
            / 1e6
    }

    /// Each price with its field name (validation).
    pub(super) fn fields(&self) -> [(&'static str, Option<f64>); 5] {
        [
            ("input_per_mtok", Some(self.input_per_mtok)),
            ("output_per_mtok", Some(self.output_per_mtok)),
            ("cache_read_per_mtok", self.cache_read_per_mtok),
            ("cache_write_5m_per_mtok", self.cache_write_5m_per_mtok),
            ("cache_write_1h_per_mtok", self.cache_write_1h_per_mtok),
        ]
    }

    /// What `usage` cost on `dialect`'s wire: uncached input, cache reads,
    /// cache writes by TTL, and output (reasoning included) each at its price.
    pub fn usage_cost(&self, u: &crate::chat::Usage, dialect: crate::chat::Dialect) -> f64 {
        let c = self.cache_prices(dialect);
        let write_1h = u
            .cache_write_1h_input_tokens
            .min(u.cache_write_input_tokens);
        let write_5m = u.cache_write_input_tokens - write_1h;
        (f64::from(u.input_tokens) * self.input_per_mtok
            + f64::from(u.cache_read_input_tokens) * c.read
            + f64::from(write_5m) * c.write_5m
            + f64::from(write_1h) * c.write_1h
            + f64::from(u.output_tokens) * self.output_per_mtok)
            / 1e6
    }
}
