//! The rate-limit headers providers send on every answer, read into what
//! is left of a key's windows and when each resets: OpenAI's and Azure's
//! `x-ratelimit-remaining-{requests,tokens}` with `x-ratelimit-reset-*`
//! durations (`6m0s`, `59.874s`, `120ms`), Anthropic's
//! `anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-remaining`
//! with RFC 3339 `-reset` times; each with its `-limit`, the window's size.
//! A header that does not parse is ignored.

use std::time::{Duration, SystemTime};

use http::header::HeaderMap;

use crate::policy::rate_window::{Left, Reported};

/// The windows `headers` report; `now_ms` is the clock the windows run on
/// and `now` the wall clock Anthropic's reset times are read against.
pub fn reported(headers: &HeaderMap, now_ms: u64, now: SystemTime) -> Reported {
    let get = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let at = |d: Duration| now_ms + d.as_millis() as u64;
    let number = |name: &str| get(name)?.trim().parse::<u64>().ok();
    let openai = |h: Names| {
        let reset = openai_duration(get(h.reset)?)?;
        Some(Left {
            remaining: number(h.remaining)?,
            reset_at_ms: at(reset),
            limit: number(h.limit),
        })
    };
    let anthropic = |h: Names| {
        let reset = humantime::parse_rfc3339_weak(get(h.reset)?.trim()).ok()?;
        // A reset already past (clock skew) still holds for a moment.
        let wait = reset
            .duration_since(now)
            .unwrap_or(Duration::ZERO)
            .max(Duration::from_secs(1));
        Some(Left {
            remaining: number(h.remaining)?,
            reset_at_ms: at(wait),
            limit: number(h.limit),
        })
    };
    let tokens = ANTHROPIC_TOKENS
        .into_iter()
        .filter_map(anthropic)
        .min_by_key(|l| l.remaining);
    Reported {
        requests: openai(OPENAI_REQUESTS).or_else(|| anthropic(ANTHROPIC_REQUESTS)),
        tokens: openai(OPENAI_TOKENS).or(tokens),
    }
}

/// One window's header names, read on every answer: no formatting.
#[derive(Clone, Copy)]
struct Names {
    remaining: &'static str,
    reset: &'static str,
    limit: &'static str,
}

const OPENAI_REQUESTS: Names = Names {
    remaining: "x-ratelimit-remaining-requests",
    reset: "x-ratelimit-reset-requests",
    limit: "x-ratelimit-limit-requests",
};
const OPENAI_TOKENS: Names = Names {
    remaining: "x-ratelimit-remaining-tokens",
    reset: "x-ratelimit-reset-tokens",
    limit: "x-ratelimit-limit-tokens",
};
const ANTHROPIC_REQUESTS: Names = Names {
    remaining: "anthropic-ratelimit-requests-remaining",
    reset: "anthropic-ratelimit-requests-reset",
    limit: "anthropic-ratelimit-requests-limit",
};
const ANTHROPIC_TOKENS: [Names; 3] = [
    Names {
        remaining: "anthropic-ratelimit-tokens-remaining",
        reset: "anthropic-ratelimit-tokens-reset",
        limit: "anthropic-ratelimit-tokens-limit",
    },
    Names {
        remaining: "anthropic-ratelimit-input-tokens-remaining",
        reset: "anthropic-ratelimit-input-tokens-reset",
        limit: "anthropic-ratelimit-input-tokens-limit",
    },
    Names {
        remaining: "anthropic-ratelimit-output-tokens-remaining",
        reset: "anthropic-ratelimit-output-tokens-reset",
        limit: "anthropic-ratelimit-output-tokens-limit",
    },
];

/// OpenAI's reset duration: `1s`, `6m0s`, `1h2m3.5s`, `120ms`.
fn openai_duration(text: &str) -> Option<Duration> {
    let mut rest = text.trim();
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0_f64;
    while !rest.is_empty() {
        let digits = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..digits].parse().ok()?;
        rest = &rest[digits..];
        let (unit, len) = if rest.starts_with("ms") {
            (0.001, 2)
        } else if rest.starts_with('h') {
            (3600.0, 1)
        } else if rest.starts_with('m') {
            (60.0, 1)
        } else if rest.starts_with('s') {
            (1.0, 1)
        } else {
            return None;
        };
        total += value * unit;
        rest = &rest[len..];
    }
    (total.is_finite() && total < 86_400.0 * 7.0).then(|| Duration::from_secs_f64(total))
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use http::header::{HeaderName, HeaderValue};

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| {
                (
                    HeaderName::from_bytes(k.as_bytes()).unwrap(),
                    HeaderValue::from_str(v).unwrap(),
                )
            })
            .collect()
    }

    #[test]
    fn openai_durations_as_the_api_writes_them() {
        for (text, ms) in [
            ("1s", 1_000),
            ("6m0s", 360_000),
            ("59.874s", 59_874),
            ("120ms", 120),
            ("1h2m3s", 3_723_000),
            ("0s", 0),
        ] {
            assert_eq!(
                openai_duration(text),
                Some(Duration::from_millis(ms)),
                "{text}"
            );
        }
        for bad in ["", "5", "1d", "s", "-1s", "1x"] {
            assert_eq!(openai_duration(bad), None, "{bad}");
        }
    }

    #[test]
    fn openai_headers_give_both_windows() {
        let h = headers(&[
            ("x-ratelimit-limit-requests", "60"),
            ("x-ratelimit-remaining-requests", "59"),
            ("x-ratelimit-reset-requests", "1s"),
            ("x-ratelimit-limit-tokens", "10000"),
            ("x-ratelimit-remaining-tokens", "0"),
            ("x-ratelimit-reset-tokens", "2.5s"),
        ]);
        let r = reported(&h, 10_000, SystemTime::now());
        assert_eq!(
            r.requests,
            Some(Left {
                remaining: 59,
                reset_at_ms: 11_000,
                limit: Some(60)
            })
        );
        assert_eq!(
            r.tokens,
            Some(Left {
                remaining: 0,
                reset_at_ms: 12_500,
                limit: Some(10_000)
            })
        );
    }

    #[test]
    fn anthropic_headers_take_the_tightest_token_window() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(1_796_227_200);
        let reset = humantime::format_rfc3339_seconds(now + Duration::from_secs(30)).to_string();
        let h = headers(&[
            ("anthropic-ratelimit-requests-limit", "50"),
            ("anthropic-ratelimit-requests-remaining", "49"),
            ("anthropic-ratelimit-requests-reset", &reset),
            ("anthropic-ratelimit-tokens-remaining", "9000"),
            ("anthropic-ratelimit-tokens-reset", &reset),
            ("anthropic-ratelimit-input-tokens-remaining", "8000"),
            ("anthropic-ratelimit-input-tokens-reset", &reset),
            ("anthropic-ratelimit-output-tokens-remaining", "1200"),
            ("anthropic-ratelimit-output-tokens-reset", &reset),
        ]);
        let r = reported(&h, 0, now);
        assert_eq!(
            r.requests,
            Some(Left {
                remaining: 49,
                reset_at_ms: 30_000,
                limit: Some(50)
            })
        );
        assert_eq!(r.tokens.unwrap().remaining, 1_200);
    }

    #[test]
    fn junk_is_ignored() {
        let h = headers(&[
            ("x-ratelimit-remaining-tokens", "lots"),
            ("x-ratelimit-reset-tokens", "1s"),
            ("anthropic-ratelimit-requests-remaining", "3"),
            ("anthropic-ratelimit-requests-reset", "tomorrow"),
        ]);
        assert!(reported(&h, 0, SystemTime::now()).is_empty());
        assert!(reported(&HeaderMap::new(), 0, SystemTime::now()).is_empty());
    }
}
