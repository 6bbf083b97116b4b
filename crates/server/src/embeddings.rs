//! An embeddings call (`POST /v1/embeddings`, `Router.Embed`) as the doors
//! and the request task share it: the validated call, its validation
//! against the limits, and the served answer, which names the model that
//! served (vectors of different models are not comparable). The call runs
//! in the request task (`task::Tasks::embed`).

use tokio::time::Instant;

use crate::config::LimitsConfig;
use crate::error::RequestError;
use crate::semantic::embed::{Input, MAX_DIMENSION};
use crate::sink::Tier;

/// Most inputs in one call (OpenAI's own limit).
pub const MAX_INPUTS: usize = 2048;
/// Largest upstream answer read for one call (2048 vectors of 1536
/// dimensions as base64 take about 17 MB).
pub const MAX_ANSWER_BYTES: usize = 32 * 1024 * 1024;

/// A validated embeddings call, ready to route.
#[derive(Debug, Clone)]
pub struct EmbedSpec {
    pub request_id: String,
    /// The route; `pin` narrows it to one `provider/model` target.
    pub route: String,
    pub pin: Option<String>,
    /// The caller's tenant ("default" when none is known).
    pub tenant: String,
    pub input: Input,
    /// Shorter vectors, from models that can make them.
    pub dimensions: Option<u32>,
    /// The caller's end-user id, passed on to the upstream.
    pub user: Option<String>,
    /// The caller's deadline, when it set one.
    pub deadline: Option<Instant>,
    /// The caller reads base64 (the upstream is asked for it too: a third
    /// of the bytes).
    pub base64: bool,
}

/// A served call.
#[derive(Debug, Clone, PartialEq)]
pub struct Embedded {
    /// One per input, in input order.
    pub vectors: Vec<Vec<f32>>,
    pub provider: String,
    /// The model that served: vectors of another model are not comparable.
    pub model: String,
    pub tier: Tier,
    /// Upstream attempts made, across targets.
    pub attempts: u32,
    pub input_tokens: u32,
    /// The upstream sent no usage: `input_tokens` is estimated.
    pub usage_estimated: bool,
    pub cost_usd: f64,
}

impl EmbedSpec {
    /// Checks the call against the limits; errors name the field.
    pub fn validate(&self, limits: &LimitsConfig) -> Result<(), RequestError> {
        let invalid = |m: String| Err(RequestError::InvalidRequest(m));
        if self.route.is_empty() || self.route.len() > limits.max_id_bytes {
            return invalid(format!("route: must be 1 to {} bytes", limits.max_id_bytes));
        }
        for (field, value) in [("tenant", Some(&self.tenant)), ("user", self.user.as_ref())] {
            if value.is_some_and(|v| v.len() > limits.max_id_bytes) {
                return invalid(format!(
                    "{field}: longer than {} bytes",
                    limits.max_id_bytes
                ));
            }
        }
        if let Some(d) = self.dimensions {
            if d == 0 || d as usize > MAX_DIMENSION {
                return invalid(format!("dimensions: {d} is outside 1..={MAX_DIMENSION}"));
            }
        }
        check_input(&self.input, limits)
    }

    /// Input tokens at most (token ids), or about (four characters a token).
    pub(crate) fn estimated_tokens(&self) -> u32 {
        let n: usize = match &self.input {
            Input::Texts(t) => t.iter().map(|s| s.chars().count().div_ceil(4).max(1)).sum(),
            Input::Tokens(t) => t.iter().map(Vec::len).sum(),
        };
        u32::try_from(n).unwrap_or(u32::MAX)
    }
}

/// 1 to [`MAX_INPUTS`] non-empty inputs, within `limits.max_prompt_bytes`
/// all together (token ids count four bytes each).
fn check_input(input: &Input, limits: &LimitsConfig) -> Result<(), RequestError> {
    let invalid = |m: String| Err(RequestError::InvalidRequest(m));
    if input.is_empty() || input.len() > MAX_INPUTS {
        return invalid(format!(
            "input: {} inputs (1 to {MAX_INPUTS} accepted)",
            input.len()
        ));
    }
    let (empty, bytes) = match input {
        Input::Texts(t) => (
            t.iter().position(String::is_empty),
            t.iter().map(String::len).sum::<usize>(),
        ),
        Input::Tokens(t) => (
            t.iter().position(Vec::is_empty),
            t.iter().map(|ids| ids.len() * 4).sum(),
        ),
    };
    if let Some(i) = empty {
        return invalid(format!("input[{i}]: must not be empty"));
    }
    if bytes > limits.max_prompt_bytes {
        return invalid(format!(
            "input: {bytes} bytes exceed limits.max_prompt_bytes ({})",
            limits.max_prompt_bytes
        ));
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn spec(input: Input) -> EmbedSpec {
        EmbedSpec {
            request_id: "r".into(),
            route: "embed".into(),
            pin: None,
            tenant: "default".into(),
            input,
            dimensions: None,
            user: None,
            deadline: None,
            base64: false,
        }
    }

    fn field(e: RequestError) -> String {
        match e {
            RequestError::InvalidRequest(m) => m.split_once(": ").unwrap().0.to_string(),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refusals_name_the_field() {
        let limits = LimitsConfig::default();
        let texts = |t: &[&str]| Input::Texts(t.iter().map(|s| s.to_string()).collect());
        assert!(spec(texts(&["a", "b"])).validate(&limits).is_ok());
        assert!(spec(Input::Tokens(vec![vec![1, 2]]))
            .validate(&limits)
            .is_ok());
        let check = |s: EmbedSpec| field(s.validate(&limits).unwrap_err());
        assert_eq!(check(spec(texts(&[]))), "input");
        assert_eq!(check(spec(texts(&["a", ""]))), "input[1]");
        assert_eq!(check(spec(Input::Tokens(vec![vec![]]))), "input[0]");
        let many = vec!["x".to_string(); MAX_INPUTS + 1];
        assert_eq!(check(spec(Input::Texts(many))), "input");
        let big = "x".repeat(limits.max_prompt_bytes + 1);
        assert_eq!(check(spec(Input::Texts(vec![big]))), "input");
        let mut s = spec(texts(&["a"]));
        s.dimensions = Some(0);
        assert_eq!(check(s), "dimensions");
        let mut s = spec(texts(&["a"]));
        s.user = Some("u".repeat(limits.max_id_bytes + 1));
        assert_eq!(check(s), "user");
        let mut s = spec(texts(&["a"]));
        s.route = String::new();
        assert_eq!(check(s), "route");
    }

    #[test]
    fn the_estimate_counts_token_ids_exactly_and_text_by_characters() {
        assert_eq!(
            spec(Input::Tokens(vec![vec![1, 2, 3], vec![4]])).estimated_tokens(),
            4
        );
        // Four characters a token, at least one per input.
        let texts = Input::Texts(vec!["abcdefgh".into(), "é".into()]);
        assert_eq!(spec(texts).estimated_tokens(), 3);
    }
}
