//! OpenAI's automatic prompt caching as mock-upstream models it: a prompt of
//! at least 1,024 tokens (counted as the mock counts them: four bytes a
//! token) whose prefix, in 128-token steps from 1,024, was served within the
//! TTL reports the longest such prefix as `prompt_tokens_details.cached_tokens`.
//! Prefixes are keyed by model and tools, refreshed when used, and bounded
//! in number. Pure: time is passed in.

use std::collections::HashMap;
use std::hash::Hasher;
use std::time::Duration;

use tokio::time::Instant;

/// Shorter prompts are never cached.
pub(crate) const MIN_TOKENS: u32 = 1024;
/// Cache hits grow in steps of this many tokens.
pub(crate) const STEP: u32 = 128;
/// A prefix stays warm this long after it was last used (OpenAI: 5 to 10
/// minutes of inactivity).
pub(crate) const TTL: Duration = Duration::from_secs(600);
/// Warm prefixes kept at most (expired ones go first, then all).
const MAX_PREFIXES: usize = 100_000;
/// Bytes a token, as the mock counts them.
const BYTES_PER_TOKEN: usize = 4;

/// Warm prefixes: their hash and when they were last used.
#[derive(Debug, Default)]
pub(crate) struct AutoCache {
    warm: HashMap<u64, Instant>,
}

impl AutoCache {
    /// The cached tokens of a prompt of `tokens` tokens whose text is
    /// `prompt` under `namespace` (model and tools), served at `now`; every
    /// prefix step of it is warm afterwards.
    pub(crate) fn serve(
        &mut self,
        namespace: &str,
        prompt: &[u8],
        tokens: u32,
        now: Instant,
    ) -> u32 {
        if tokens < MIN_TOKENS {
            return 0;
        }
        let mut hasher = std::collections::hash_map::DefaultHasher::new();
        hasher.write(namespace.as_bytes());
        hasher.write_u8(0xff);
        let mut fed = 0;
        let mut cached = 0;
        let mut steps = Vec::new();
        let mut step = MIN_TOKENS;
        while step <= tokens {
            let end = (step as usize * BYTES_PER_TOKEN).min(prompt.len());
            hasher.write(&prompt[fed..end]);
            fed = end;
            let key = hasher.clone().finish();
            if self
                .warm
                .get(&key)
                .is_some_and(|at| now.saturating_duration_since(*at) < TTL)
            {
                cached = step;
            }
            steps.push(key);
            step += STEP;
        }
        self.make_room(steps.len(), now);
        for key in steps {
            self.warm.insert(key, now);
        }
        cached
    }

    /// Room for `n` more prefixes: expired ones go, and all of them if that
    /// is not enough.
    fn make_room(&mut self, n: usize, now: Instant) {
        if self.warm.len() + n <= MAX_PREFIXES {
            return;
        }
        self.warm
            .retain(|_, at| now.saturating_duration_since(*at) < TTL);
        if self.warm.len() + n > MAX_PREFIXES {
            self.warm.clear();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn prompt(tokens: u32, fill: u8) -> Vec<u8> {
        vec![fill; tokens as usize * BYTES_PER_TOKEN]
    }

    #[tokio::test(start_paused = true)]
    async fn a_repeated_long_prefix_is_cached_in_steps_within_the_ttl() {
        let mut c = AutoCache::default();
        let now = Instant::now();
        let long = prompt(2006, b'a');
        assert_eq!(c.serve("m", &long, 2006, now), 0, "first sight: a miss");
        assert_eq!(c.serve("m", &long, 2006, now), 1920, "1024 + 7 x 128");
        // A longer prompt sharing the prefix: the old steps hit.
        let mut longer = long.clone();
        longer.extend(prompt(500, b'b'));
        assert_eq!(c.serve("m", &longer, 2506, now), 1920);
        assert_eq!(c.serve("m", &longer, 2506, now), 2432);
        // Another model or tool set is another cache.
        assert_eq!(c.serve("other", &long, 2006, now), 0);
        // Short prompts never are.
        let short = prompt(1023, b'a');
        assert_eq!(c.serve("m", &short, 1023, now), 0);
        assert_eq!(c.serve("m", &short, 1023, now), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_prefix_goes_cold_after_the_ttl_and_use_keeps_it_warm() {
        let mut c = AutoCache::default();
        let t0 = Instant::now();
        let p = prompt(1100, b'x');
        c.serve("m", &p, 1100, t0);
        let t1 = t0 + TTL - Duration::from_secs(1);
        assert_eq!(c.serve("m", &p, 1100, t1), 1024, "still warm");
        let t2 = t1 + TTL - Duration::from_secs(1);
        assert_eq!(
            c.serve("m", &p, 1100, t2),
            1024,
            "the last use refreshed it"
        );
        let t3 = t2 + TTL;
        assert_eq!(c.serve("m", &p, 1100, t3), 0, "cold after a TTL unused");
    }

    #[tokio::test(start_paused = true)]
    async fn the_map_is_bounded() {
        let mut c = AutoCache::default();
        let now = Instant::now();
        for i in 0..(MAX_PREFIXES / 8 + 10) {
            c.serve(&i.to_string(), &prompt(2000, b'a'), 2000, now);
        }
        assert!(c.warm.len() <= MAX_PREFIXES, "{}", c.warm.len());
    }
}
