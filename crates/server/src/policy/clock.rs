//! Adding time without overflow. `Instant + Duration` panics when the sum
//! does not fit (a config or an upstream can name a duration of centuries);
//! every place that adds a duration it did not choose itself uses [`after`].

use std::time::Duration;

use tokio::time::Instant;

/// The farthest [`after`] looks ahead: past it, "never" in practice.
pub const FAR: Duration = Duration::from_secs(100 * 365 * 24 * 3600);

/// `now + d`, with `d` cut to [`FAR`] (and `now` itself should even that not
/// fit).
pub fn after(now: Instant, d: Duration) -> Instant {
    now.checked_add(d.min(FAR)).unwrap_or(now)
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn a_duration_of_centuries_is_cut_not_a_panic() {
        let now = Instant::now();
        assert_eq!(
            after(now, Duration::from_secs(5)),
            now + Duration::from_secs(5)
        );
        assert_eq!(after(now, Duration::MAX), now + FAR);
        assert_eq!(after(now, Duration::from_secs(u64::MAX)), now + FAR);
    }
}
