//! Prompt-cache affinity as pure decisions: a request's cacheable prefixes
//! ([`prefix`]), where a remembered prefix puts the request (its warm target
//! first in the plan, with the key it used), and what the answer says about
//! the memory (hit, miss, move). The memory itself lives in `state::affinity`;
//! the request task carries these decisions out. No I/O, no clock.

pub mod prefix;

pub use prefix::{prefixes, PrefixHash};

/// Where a prefix was last answered: the target, and the key of a
/// multi-key provider it was sent with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Warm {
    pub provider: String,
    pub model: String,
    pub key: Option<String>,
}

impl Warm {
    pub fn is(&self, provider: &str, model: &str) -> bool {
        self.provider == provider && self.model == model
    }
}

/// What an answer says about the memory of its prefix.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Served where the prefix was warm.
    Hit,
    /// Nothing was remembered for it.
    Miss,
    /// Served elsewhere (the warm target failed, was tripped or at its
    /// ceiling): the memory moves to the target that served.
    Move,
}

impl Verdict {
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Hit => "hit",
            Verdict::Miss => "miss",
            Verdict::Move => "move",
        }
    }
}

/// Puts the warm target first in a plan, the others keeping their order;
/// false when the plan does not hold it (tripped, cooling, not capable, or
/// only as a downshift, which never jumps the route's own targets). Health
/// ranking does not enter: only the warm target's absence or its failure
/// in the walk breaks the affinity.
pub fn place<T>(plan: &mut [T], is_warm: impl Fn(&T) -> bool) -> bool {
    match plan.iter().position(is_warm) {
        Some(i) => {
            plan[..=i].rotate_right(1);
            true
        }
        None => false,
    }
}

/// The key to send with on `provider`/`model`: the warm one there.
pub fn key_for<'a>(warm: Option<&'a Warm>, provider: &str, model: &str) -> Option<&'a str> {
    warm.filter(|w| w.is(provider, model))
        .and_then(|w| w.key.as_deref())
}

/// What serving from `provider`/`model` says about the remembered `warm`.
pub fn verdict(warm: Option<&Warm>, provider: &str, model: &str) -> Verdict {
    match warm {
        None => Verdict::Miss,
        Some(w) if w.is(provider, model) => Verdict::Hit,
        Some(_) => Verdict::Move,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    fn warm(target: &str, key: Option<&str>) -> Warm {
        let (p, m) = target.split_once('/').unwrap();
        Warm {
            provider: p.into(),
            model: m.into(),
            key: key.map(str::to_string),
        }
    }

    fn plan(targets: &[&str]) -> Vec<(String, bool)> {
        targets.iter().map(|t| (t.to_string(), false)).collect()
    }

    #[test]
    fn the_warm_target_goes_first_and_the_rest_keep_their_order() {
        let w = warm("b/m", None);
        let at = |c: &(String, bool)| !c.1 && c.0 == "b/m";
        let mut p = plan(&["a/m", "c/m", "b/m", "d/m"]);
        assert!(place(&mut p, at));
        let names: Vec<&str> = p.iter().map(|c| c.0.as_str()).collect();
        assert_eq!(names, ["b/m", "a/m", "c/m", "d/m"]);
        // Already first: unchanged.
        assert!(place(&mut p, at));
        assert_eq!(p[0].0, "b/m");
        // Not in the plan (its breaker is open): the route's order holds.
        let mut without = plan(&["a/m", "c/m"]);
        assert!(!place(&mut without, at));
        assert_eq!(without, plan(&["a/m", "c/m"]));
        // Only as a downshift: it does not jump the route's targets.
        let mut down = vec![("a/m".to_string(), false), ("b/m".to_string(), true)];
        assert!(!place(&mut down, at));
        assert_eq!(down[0].0, "a/m");
        assert_eq!(verdict(Some(&w), "b", "m"), Verdict::Hit);
    }

    #[test]
    fn the_warm_key_is_used_only_on_the_warm_target() {
        let w = warm("b/m", Some("k2"));
        assert_eq!(key_for(Some(&w), "b", "m"), Some("k2"));
        assert_eq!(key_for(Some(&w), "a", "m"), None);
        assert_eq!(key_for(Some(&w), "b", "other"), None);
        assert_eq!(key_for(None, "b", "m"), None);
        assert_eq!(key_for(Some(&warm("b/m", None)), "b", "m"), None);
    }

    #[test]
    fn an_answer_elsewhere_is_a_move_and_none_remembered_a_miss() {
        let w = warm("a/m", Some("k1"));
        assert_eq!(verdict(Some(&w), "a", "m"), Verdict::Hit);
        assert_eq!(verdict(Some(&w), "b", "m"), Verdict::Move);
        assert_eq!(verdict(None, "a", "m"), Verdict::Miss);
        assert_eq!(
            [Verdict::Hit, Verdict::Miss, Verdict::Move].map(Verdict::as_str),
            ["hit", "miss", "move"]
        );
    }
}
