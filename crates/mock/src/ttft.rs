//! The time-to-first-token distribution (`ttft` and `ttft_seed` of
//! `PUT /_mock/config`): weighted delays, validated and normalised, and the
//! seeded sampler each answered request draws its wait from. The wait itself
//! is a step of the response script (after the head, before the body).

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// One point of the distribution: a delay of `ms`, drawn with weight `p`
/// (weights need not sum to 1).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TtftBucket {
    pub p: f64,
    pub ms: u64,
}

/// The distribution and its random source.
#[derive(Debug)]
pub(crate) struct Ttft {
    buckets: Vec<TtftBucket>,
    /// Sum of the weights.
    total: f64,
    seed: u64,
    rng: StdRng,
}

impl Ttft {
    pub(crate) fn new(seed: u64) -> Self {
        Ttft {
            buckets: Vec::new(),
            total: 0.0,
            seed,
            rng: StdRng::seed_from_u64(seed),
        }
    }

    /// Checks a distribution: finite weights >= 0 summing to more than 0
    /// (`[]` is none).
    pub(crate) fn validate(buckets: &[TtftBucket]) -> Result<(), String> {
        if let Some(b) = buckets.iter().find(|b| !b.p.is_finite() || b.p < 0.0) {
            return Err(format!(
                "ttft weight p must be finite and >= 0, got {}",
                b.p
            ));
        }
        if !buckets.is_empty() && buckets.iter().map(|b| b.p).sum::<f64>() <= 0.0 {
            return Err("ttft weights must not all be 0".into());
        }
        Ok(())
    }

    /// Replaces the distribution and/or the seed (`None` keeps it), and
    /// reseeds the sampler.
    pub(crate) fn set(
        &mut self,
        buckets: Option<Vec<TtftBucket>>,
        seed: Option<u64>,
    ) -> Result<(), String> {
        if let Some(b) = buckets {
            Self::validate(&b)?;
            self.total = b.iter().map(|b| b.p).sum();
            self.buckets = b;
        }
        self.seed = seed.unwrap_or(self.seed);
        self.rng = StdRng::seed_from_u64(self.seed);
        Ok(())
    }

    pub(crate) fn buckets(&self) -> &[TtftBucket] {
        &self.buckets
    }

    pub(crate) fn seed(&self) -> u64 {
        self.seed
    }

    /// One request's delay in ms; `None` when no distribution is set.
    pub(crate) fn sample(&mut self) -> Option<u64> {
        if self.buckets.is_empty() {
            return None;
        }
        let r = self.rng.random::<f64>() * self.total;
        let mut acc = 0.0;
        for b in &self.buckets {
            acc += b.p;
            if r < acc {
                return Some(b.ms);
            }
        }
        // Rounding: the last bucket with any weight.
        self.buckets.iter().rev().find(|b| b.p > 0.0).map(|b| b.ms)
    }
}
