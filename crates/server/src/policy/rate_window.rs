//! A key's rate windows, as one pure state machine: the configured
//! `rpm`/`tpm` (a fixed minute from the window's first request) and the
//! limits the upstream itself reported in its rate-limit headers (what is
//! left and when it resets; they lapse at their reset). A request fits when
//! every window has room for one request and its estimated tokens; the
//! stricter window wins. Batch work yields: while an interactive request was
//! refused on the key recently, a batch request may fill a window only to
//! `batch_share` of it.
//!
//! A report is a snapshot of the upstream's count when it answered; the
//! requests this window let through that have not been answered yet may
//! not be in it (sent but not yet arrived, or counted after the answer).
//! So the window keeps what is outstanding (held, not yet answered) and a
//! report leaves it counted against what the upstream said is left: a
//! report never lets more through than the upstream has room for, on one
//! replica or on many. Outstanding holds are forgotten when the configured
//! minute rolls, so a holder that died never holds a key for longer.
//!
//! Times are milliseconds on one clock passed in (the process's, or Redis's
//! for the fleet: `state::limits` runs the same rules in one Lua script).

use std::time::Duration;

/// The configured window's length.
pub const WINDOW_MS: u64 = 60_000;
/// How long a refused interactive request makes batch work yield.
pub const PRESSURE_MS: u64 = 5_000;
/// Two reported resets this close name the same window.
pub const SAME_WINDOW_MS: u64 = 1_000;

/// What the provider said is left, and when that resets (absolute ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reported {
    pub requests: Option<Left>,
    pub tokens: Option<Left>,
}

/// One reported window: `remaining` until `reset_at_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Left {
    pub remaining: u64,
    pub reset_at_ms: u64,
    /// The window's whole size, when the upstream says it: a window that
    /// lapsed starts again from it (not from nothing) until the next report.
    pub limit: Option<u64>,
}

impl Reported {
    pub fn is_empty(&self) -> bool {
        self.requests.is_none() && self.tokens.is_none()
    }

    /// A report with reset times relative to its answer, `elapsed` after
    /// it: each reset that much sooner (a reset reached is 0, lapsed).
    #[must_use]
    pub fn aged(mut self, elapsed: Duration) -> Reported {
        let ms = u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX);
        for left in [&mut self.requests, &mut self.tokens].into_iter().flatten() {
            left.reset_at_ms = left.reset_at_ms.saturating_sub(ms);
        }
        self
    }
}

/// The configured limits of one key (`rpm`, `tpm`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Limits {
    pub rpm: Option<u64>,
    pub tpm: Option<u64>,
}

impl Limits {
    pub fn is_empty(&self) -> bool {
        self.rpm.is_none() && self.tpm.is_none()
    }
}

/// Whose request is asking.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Priority {
    Interactive,
    /// Jobs, Batch API lines, routes marked `priority = "batch"`: they use
    /// at most `share` of a window while interactive requests wait.
    Batch {
        share: f64,
    },
}

/// A learned window and what was reserved against it that its report may
/// not include: what was outstanding when it was learned, and every hold
/// since.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Learned {
    left: Left,
    used: u64,
}

impl Learned {
    /// What the window has room for.
    fn room(&self) -> u64 {
        self.left.remaining.saturating_sub(self.used)
    }
}

/// One key's windows.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct KeyWindow {
    /// Start of the configured window (ms); 0 before the first request.
    start_ms: u64,
    used_requests: u64,
    used_tokens: u64,
    /// Held in this configured window and not yet answered.
    outstanding_requests: u64,
    outstanding_tokens: u64,
    learned_requests: Option<Learned>,
    learned_tokens: Option<Learned>,
    /// Batch work yields until then.
    pressure_until_ms: u64,
}

/// A request that fit: hand it back to `settle`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hold {
    pub tokens: u64,
    /// The configured window it was taken from.
    pub window_start_ms: u64,
}

/// What one window looks like now (status, metrics).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize)]
pub struct Room {
    /// Requests left in the stricter window, if any window counts them.
    pub requests: Option<u64>,
    pub tokens: Option<u64>,
    /// When the earliest window that bounds them resets, from now.
    pub reset_in_ms: Option<u64>,
}

impl KeyWindow {
    fn roll(&mut self, now_ms: u64) {
        if self.start_ms == 0 || now_ms >= self.start_ms + WINDOW_MS {
            self.start_ms = now_ms.max(1);
            self.used_requests = 0;
            self.used_tokens = 0;
            self.outstanding_requests = 0;
            self.outstanding_tokens = 0;
        }
        for learned in [&mut self.learned_requests, &mut self.learned_tokens] {
            if let Some(l) = learned.filter(|l| now_ms >= l.left.reset_at_ms) {
                // A new window of the size last reported, for a minute or
                // until the upstream reports it.
                *learned = l.left.limit.map(|limit| Learned {
                    left: Left {
                        remaining: limit,
                        reset_at_ms: now_ms + WINDOW_MS,
                        limit: Some(limit),
                    },
                    used: 0,
                });
            }
        }
    }

    /// Reserves one request of `tokens` if every window has room; else
    /// how long until the soonest window that refused resets.
    pub fn reserve(
        &mut self,
        limits: Limits,
        tokens: u64,
        priority: Priority,
        now_ms: u64,
    ) -> Result<Hold, Duration> {
        self.roll(now_ms);
        let share = match priority {
            Priority::Batch { share } if now_ms < self.pressure_until_ms => share.clamp(0.0, 1.0),
            _ => 1.0,
        };
        let cap = |limit: u64| (limit as f64 * share).floor() as u64;
        let window_end = self.start_ms + WINDOW_MS;
        let mut wait: Option<u64> = None;
        let mut refuse = |until: u64| {
            let w = until.saturating_sub(now_ms).max(1);
            wait = Some(wait.map_or(w, |x| x.min(w)));
        };
        if limits
            .rpm
            .is_some_and(|rpm| self.used_requests + 1 > cap(rpm))
        {
            refuse(window_end);
        }
        if limits
            .tpm
            .is_some_and(|tpm| self.used_tokens + tokens > cap(tpm))
        {
            refuse(window_end);
        }
        if let Some(l) = self
            .learned_requests
            .filter(|l| l.used + 1 > cap(l.left.remaining))
        {
            refuse(l.left.reset_at_ms);
        }
        if let Some(l) = self
            .learned_tokens
            .filter(|l| l.used + tokens > cap(l.left.remaining))
        {
            refuse(l.left.reset_at_ms);
        }
        if let Some(ms) = wait {
            if priority == Priority::Interactive {
                self.pressure_until_ms = now_ms + PRESSURE_MS;
            }
            return Err(Duration::from_millis(ms));
        }
        self.used_requests += 1;
        self.used_tokens += tokens;
        self.outstanding_requests += 1;
        self.outstanding_tokens += tokens;
        if let Some(l) = self.learned_requests.as_mut() {
            l.used += 1;
        }
        if let Some(l) = self.learned_tokens.as_mut() {
            l.used += tokens;
        }
        Ok(Hold {
            tokens,
            window_start_ms: self.start_ms,
        })
    }

    /// A held request was answered, having used `tokens` (0 when the
    /// upstream refused it or it was never sent; `None` when what the
    /// upstream counted is unknown: failed or cut, the hold stays): it is
    /// no longer outstanding, and the configured window it came from counts
    /// the real usage. (A learned window is not corrected: the upstream's
    /// next headers say what it counted.)
    pub fn settle(&mut self, hold: Hold, tokens: Option<u64>) {
        if hold.window_start_ms != self.start_ms {
            return;
        }
        self.outstanding_requests = self.outstanding_requests.saturating_sub(1);
        self.outstanding_tokens = self.outstanding_tokens.saturating_sub(hold.tokens);
        if let Some(tokens) = tokens {
            self.used_tokens = (self.used_tokens + tokens).saturating_sub(hold.tokens);
        }
    }

    /// The upstream reported what is left, in an answer to no request of
    /// this window's: see `learn_answer`.
    pub fn learn(&mut self, reported: Reported, now_ms: u64) {
        self.learn_answer(reported, None, now_ms);
    }

    /// The upstream reported what is left, answering the request `answering`
    /// held (learn before settling it: its hold stays counted in the
    /// configured window until the report is known). What else is
    /// outstanding stays counted against the report: it may not include it.
    /// Within the same window (a reset within a second of the known one) a
    /// report can only lower what is left: an answer may be older than
    /// requests admitted since (answers come back out of order, and on
    /// several replicas); a new window replaces the old.
    pub fn learn_answer(&mut self, reported: Reported, answering: Option<Hold>, now_ms: u64) {
        self.roll(now_ms);
        let (mut requests, mut tokens) = (self.outstanding_requests, self.outstanding_tokens);
        if let Some(hold) = answering.filter(|h| h.window_start_ms == self.start_ms) {
            requests = requests.saturating_sub(1);
            tokens = tokens.saturating_sub(hold.tokens);
        }
        let merge = |known: Option<Learned>, left: Left, outstanding: u64| match known {
            Some(k) if k.left.reset_at_ms.abs_diff(left.reset_at_ms) < SAME_WINDOW_MS => Learned {
                left: Left {
                    remaining: left.remaining.min(k.room().saturating_add(outstanding)),
                    reset_at_ms: left.reset_at_ms.max(k.left.reset_at_ms),
                    limit: left.limit.or(k.left.limit),
                },
                used: outstanding,
            },
            _ => Learned {
                left,
                used: outstanding,
            },
        };
        if let Some(left) = reported.requests.filter(|l| l.reset_at_ms > now_ms) {
            self.learned_requests = Some(merge(self.learned_requests, left, requests));
        }
        if let Some(left) = reported.tokens.filter(|l| l.reset_at_ms > now_ms) {
            self.learned_tokens = Some(merge(self.learned_tokens, left, tokens));
        }
    }

    /// What is left now, the stricter window of each kind.
    pub fn room(&mut self, limits: Limits, now_ms: u64) -> Room {
        self.roll(now_ms);
        let window_end = self.start_ms + WINDOW_MS;
        let mut reset: Option<u64> = None;
        let mut note = |at: u64| reset = Some(reset.map_or(at, |r: u64| r.min(at)));
        let mut stricter = |configured: Option<u64>, used: u64, learned: Option<Learned>| {
            let a = configured.map(|c| c.saturating_sub(used));
            let b = learned.map(|l| l.room());
            if a.is_some() {
                note(window_end);
            }
            if let Some(l) = learned {
                note(l.left.reset_at_ms);
            }
            match (a, b) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            }
        };
        let requests = stricter(limits.rpm, self.used_requests, self.learned_requests);
        let tokens = stricter(limits.tpm, self.used_tokens, self.learned_tokens);
        Room {
            requests,
            tokens,
            reset_in_ms: reset.map(|r| r.saturating_sub(now_ms)),
        }
    }

    /// Each window's size, the stricter of configured and reported:
    /// (requests, tokens) per window.
    pub fn sizes(&self, limits: Limits) -> (Option<u64>, Option<u64>) {
        let stricter = |a: Option<u64>, b: Option<u64>| match (a, b) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        let size = |l: Option<Learned>| l.and_then(|l| l.left.limit);
        (
            stricter(limits.rpm, size(self.learned_requests)),
            stricter(limits.tpm, size(self.learned_tokens)),
        )
    }

    /// Whether anything bounds this key now.
    pub fn is_bounded(&self, limits: Limits) -> bool {
        !limits.is_empty() || self.learned_requests.is_some() || self.learned_tokens.is_some()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    const TPM: Limits = Limits {
        rpm: None,
        tpm: Some(10_000),
    };

    #[test]
    fn a_token_window_admits_until_full_then_names_its_reset() {
        let mut w = KeyWindow::default();
        let t0 = 1_000;
        for i in 0..10 {
            assert!(
                w.reserve(TPM, 1_000, Priority::Interactive, t0 + i).is_ok(),
                "request {i}"
            );
        }
        let wait = w
            .reserve(TPM, 1_000, Priority::Interactive, t0 + 20_000)
            .unwrap_err();
        assert_eq!(wait, Duration::from_millis(40_000));
        // A new minute, an empty window.
        assert!(w
            .reserve(TPM, 1_000, Priority::Interactive, t0 + WINDOW_MS)
            .is_ok());
    }

    #[test]
    fn settling_to_real_usage_gives_back_the_unused_reservation() {
        let mut w = KeyWindow::default();
        let holds: Vec<Hold> = (0..10)
            .map(|_| w.reserve(TPM, 1_000, Priority::Interactive, 5).unwrap())
            .collect();
        assert!(w.reserve(TPM, 1_000, Priority::Interactive, 5).is_err());
        // Each used 400 of its 1,000: 6,000 come back.
        for h in holds {
            w.settle(h, Some(400));
        }
        for _ in 0..6 {
            w.reserve(TPM, 1_000, Priority::Interactive, 6).unwrap();
        }
        assert!(w.reserve(TPM, 1_000, Priority::Interactive, 6).is_err());
        // A hold from an old window changes nothing in the new one.
        let old = Hold {
            tokens: 1_000,
            window_start_ms: 5,
        };
        w.reserve(TPM, 1, Priority::Interactive, 5 + WINDOW_MS)
            .unwrap();
        w.settle(old, Some(0));
        assert_eq!(w.room(TPM, 5 + WINDOW_MS).tokens, Some(9_999));
    }

    #[test]
    fn a_reported_empty_window_stops_the_key_until_its_reset() {
        let mut w = KeyWindow::default();
        let none = Limits::default();
        assert!(!w.is_bounded(none));
        w.learn(
            Reported {
                requests: None,
                tokens: Some(Left {
                    remaining: 0,
                    reset_at_ms: 3_000,
                    limit: None,
                }),
            },
            1_000,
        );
        assert!(w.is_bounded(none));
        assert_eq!(
            w.reserve(none, 10, Priority::Interactive, 1_000),
            Err(Duration::from_millis(2_000))
        );
        assert_eq!(
            w.reserve(none, 10, Priority::Interactive, 2_999),
            Err(Duration::from_millis(1))
        );
        assert!(w.reserve(none, 10, Priority::Interactive, 3_000).is_ok());
        assert!(!w.is_bounded(none), "the learned window lapsed");
    }

    #[test]
    fn the_stricter_of_configured_and_reported_wins() {
        let mut w = KeyWindow::default();
        let both = Limits {
            rpm: Some(100),
            tpm: Some(10_000),
        };
        w.learn(
            Reported {
                requests: Some(Left {
                    remaining: 2,
                    reset_at_ms: 10_000,
                    limit: None,
                }),
                tokens: Some(Left {
                    remaining: 50_000,
                    reset_at_ms: 10_000,
                    limit: None,
                }),
            },
            1,
        );
        let room = w.room(both, 1);
        assert_eq!(room.requests, Some(2));
        assert_eq!(room.tokens, Some(10_000));
        w.reserve(both, 10, Priority::Interactive, 2).unwrap();
        w.reserve(both, 10, Priority::Interactive, 2).unwrap();
        assert_eq!(
            w.reserve(both, 10, Priority::Interactive, 2),
            Err(Duration::from_millis(9_998)),
            "the reported request window is the one full"
        );
    }

    #[test]
    fn an_older_answer_never_raises_what_is_left_in_the_same_window() {
        let mut w = KeyWindow::default();
        let none = Limits::default();
        let tokens = |remaining, reset_at_ms| Reported {
            requests: None,
            tokens: Some(Left {
                remaining,
                reset_at_ms,
                limit: None,
            }),
        };
        w.learn(tokens(5_000, 10_000), 1);
        let hold = w.reserve(none, 2_000, Priority::Interactive, 2).unwrap();
        w.settle(hold, Some(2_000));
        // An answer older than that reservation says 4,000 are left.
        w.learn(tokens(4_000, 10_200), 3);
        assert_eq!(w.room(none, 3).tokens, Some(3_000));
        // A new window (reset a minute on) replaces it.
        w.learn(tokens(9_000, 70_000), 11_000);
        assert_eq!(w.room(none, 11_000).tokens, Some(9_000));
    }

    fn tokens_left(remaining: u64, reset_at_ms: u64) -> Reported {
        Reported {
            requests: None,
            tokens: Some(Left {
                remaining,
                reset_at_ms,
                limit: None,
            }),
        }
    }

    #[test]
    fn a_report_leaves_what_is_still_outstanding_counted() {
        let mut w = KeyWindow::default();
        let none = Limits::default();
        // Five requests go out before the upstream has said anything.
        let holds: Vec<Hold> = (0..5)
            .map(|_| w.reserve(none, 1_000, Priority::Interactive, 1).unwrap())
            .collect();
        // The first answer: the upstream had counted only it.
        w.learn_answer(tokens_left(9_000, 60_000), Some(holds[0]), 2);
        w.settle(holds[0], Some(30));
        assert_eq!(
            w.room(none, 2).tokens,
            Some(5_000),
            "the four still out are not in the report"
        );
        for i in 0..5 {
            assert!(
                w.reserve(none, 1_000, Priority::Interactive, 3).is_ok(),
                "request {i}"
            );
        }
        assert!(w.reserve(none, 1_000, Priority::Interactive, 3).is_err());
        // A new window (reset a minute on) still counts what is out.
        w.learn(tokens_left(50_000, 130_000), 70_000);
        assert_eq!(w.room(none, 70_000).tokens, Some(50_000), "a new minute");
        let hold = w
            .reserve(none, 1_000, Priority::Interactive, 70_001)
            .unwrap();
        w.learn(tokens_left(50_000, 190_000), 70_002);
        assert_eq!(w.room(none, 70_002).tokens, Some(49_000));
        // Answered, it leaves the count at the next report.
        w.settle(hold, None);
        w.learn(tokens_left(49_000, 190_100), 70_003);
        assert_eq!(w.room(none, 70_003).tokens, Some(49_000));
    }

    #[test]
    fn outstanding_holds_are_forgotten_when_the_minute_rolls() {
        let mut w = KeyWindow::default();
        let none = Limits::default();
        // Three holds whose holder never answers (it died).
        for _ in 0..3 {
            w.reserve(none, 1_000, Priority::Interactive, 1).unwrap();
        }
        w.learn(tokens_left(10_000, 30_000), 2);
        assert_eq!(w.room(none, 2).tokens, Some(7_000));
        w.learn(tokens_left(10_000, 100_000), 1 + WINDOW_MS);
        assert_eq!(w.room(none, 1 + WINDOW_MS).tokens, Some(10_000));
    }

    #[test]
    fn an_aged_report_resets_sooner_and_a_reached_reset_lapses() {
        let r = Reported {
            requests: Some(Left {
                remaining: 1,
                reset_at_ms: 500,
                limit: None,
            }),
            tokens: Some(Left {
                remaining: 2,
                reset_at_ms: 60_000,
                limit: Some(9),
            }),
        }
        .aged(Duration::from_millis(2_000));
        assert_eq!(r.requests.unwrap().reset_at_ms, 0);
        assert_eq!(r.tokens.unwrap().reset_at_ms, 58_000);
        let mut w = KeyWindow::default();
        w.learn(r, 0);
        assert!(w.learned_requests.is_none(), "its reset was reached");
        assert_eq!(w.learned_tokens.unwrap().left.reset_at_ms, 58_000);
    }

    #[test]
    fn a_lapsed_window_of_known_size_starts_again_from_its_size() {
        let mut w = KeyWindow::default();
        let none = Limits::default();
        w.learn(
            Reported {
                requests: None,
                tokens: Some(Left {
                    remaining: 0,
                    reset_at_ms: 2_000,
                    limit: Some(3_000),
                }),
            },
            1,
        );
        assert!(w
            .reserve(none, 1_000, Priority::Interactive, 1_999)
            .is_err());
        // The window resets: 3,000 tokens, not an unbounded key.
        for _ in 0..3 {
            w.reserve(none, 1_000, Priority::Interactive, 2_000)
                .unwrap();
        }
        assert!(w
            .reserve(none, 1_000, Priority::Interactive, 2_001)
            .is_err());
    }

    #[test]
    fn batch_yields_to_waiting_interactive_work() {
        let mut w = KeyWindow::default();
        let batch = Priority::Batch { share: 0.5 };
        // No interactive request waits: batch may fill the window.
        for _ in 0..8 {
            w.reserve(TPM, 1_000, batch, 10).unwrap();
        }
        // An interactive request that does not fit makes batch yield...
        assert!(w.reserve(TPM, 3_000, Priority::Interactive, 11).is_err());
        assert!(w.reserve(TPM, 1_000, batch, 12).is_err());
        // ...while interactive requests still take what is left.
        w.reserve(TPM, 1_000, Priority::Interactive, 12).unwrap();
        // In a new window, batch stops at half while the pressure lasts.
        let t = 10 + WINDOW_MS;
        assert!(w.reserve(TPM, 3_000, Priority::Interactive, t).is_ok());
        w.reserve(TPM, 8_000, Priority::Interactive, t).unwrap_err();
        w.reserve(TPM, 2_000, batch, t + 1).unwrap();
        assert!(
            w.reserve(TPM, 1_000, batch, t + 1).is_err(),
            "5,000 of 10,000 used"
        );
        // The pressure passes: batch may use the rest.
        w.reserve(TPM, 1_000, batch, t + PRESSURE_MS + 1).unwrap();
    }
}
