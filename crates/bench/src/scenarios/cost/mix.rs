//! The cost scenario's traffic: a seeded, reproducible sequence of support
//! questions, some new, some exact repeats of earlier ones, some near-repeats
//! (the same content words in other stop words, case and punctuation) and a
//! few close but different ones (one content word more). Every task is then
//! classified by what a cache could do with it, measured with the mock's own
//! embedder, not by how it was generated. Pure: no I/O, no clock.

use std::collections::HashSet;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;

use switchyard_mock::embeddings::embed;

/// What a cache could do with a task, given the tasks before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// Nothing before it is as similar as the threshold.
    Unique,
    /// The same text came before: an exact cache can answer it.
    Repeat,
    /// Other text, but an earlier question at least threshold-similar: only
    /// a semantic cache can answer it.
    NearRepeat,
    /// Built one content word away from an earlier question and below the
    /// threshold: a semantic cache must not answer it.
    Close,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Unique, Kind::Repeat, Kind::NearRepeat, Kind::Close];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Unique => "unique",
            Kind::Repeat => "exact repeat",
            Kind::NearRepeat => "near-repeat",
            Kind::Close => "close, below threshold",
        }
    }
}

/// One question of the sequence.
#[derive(Debug, Clone)]
pub struct Task {
    pub text: Arc<str>,
    pub kind: Kind,
    /// Highest cosine similarity (mock embedder) to any earlier task.
    pub similarity: f32,
}

/// Verbs, objects and details whose words all fall into different
/// components of the mock's embedding (a unit test holds them to it), so
/// two questions are exactly as similar as their shared words say.
const ACTIONS: [&str; 20] = [
    "reset", "change", "cancel", "update", "export", "delete", "transfer", "renew", "upgrade",
    "verify", "share", "download", "refund", "pause", "merge", "rename", "restore", "sync", "lock",
    "unlock",
];
const OBJECTS: [&str; 20] = [
    "password",
    "subscription",
    "invoice",
    "account",
    "order",
    "address",
    "plan",
    "profile",
    "card",
    "email",
    "workspace",
    "license",
    "backup",
    "report",
    "team",
    "wallet",
    "ticket",
    "shipment",
    "domain",
    "receipt",
];
const DETAILS: [&str; 10] = [
    "today",
    "abroad",
    "online",
    "twice",
    "offline",
    "early",
    "overnight",
    "remotely",
    "manually",
    "automatically",
];
/// The one word a close question adds.
const EXTRAS: [&str; 6] = [
    "business", "family", "student", "mobile", "android", "iphone",
];

/// Ways to ask the same question that differ only in stop words, case and
/// punctuation (`{a}` action, `{o}` object, `{d}` detail); the first is
/// how a new question is asked.
const PHRASINGS: [&str; 8] = [
    "How do I {a} my {o} {d}?",
    "how can i {a} my {o} {d}",
    "Please tell me how to {a} the {o} {d}.",
    "HOW DO I {A} MY {O} {D}??",
    "Could you tell me how I can {a} your {o} {d}, please?",
    "Can I {a} my {o} {d}?",
    "{A} the {o} {d}: how?",
    "how do we {a} our {o} {d}",
];

/// Shares of the generator's draws, in percent; a draw that needs an earlier
/// question when none is old enough becomes a new question.
const NEW: u32 = 40;
const REPEAT: u32 = 20;
const NEAR: u32 = 30;

fn phrase(template: &str, a: &str, o: &str, d: &str) -> String {
    template
        .replace("{a}", a)
        .replace("{o}", o)
        .replace("{d}", d)
        .replace("{A}", &a.to_uppercase())
        .replace("{O}", &o.to_uppercase())
        .replace("{D}", &d.to_uppercase())
}

/// `n` tasks from `seed`. A repeat, near-repeat or close task refers to a
/// new question at least `min_gap` tasks earlier (so its answer is stored
/// by the time it comes); `threshold` is the semantic cache's.
pub fn tasks(n: usize, min_gap: usize, threshold: f32, seed: u64) -> Vec<Task> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut combos: Vec<(usize, usize, usize)> = (0..ACTIONS.len())
        .flat_map(|a| {
            (0..OBJECTS.len()).flat_map(move |o| (0..DETAILS.len()).map(move |d| (a, o, d)))
        })
        .collect();
    combos.shuffle(&mut rng);
    // (task index, combo) of every new question so far.
    let mut originals: Vec<(usize, (usize, usize, usize))> = Vec::new();
    let mut drafts: Vec<(String, bool)> = Vec::with_capacity(n);
    for i in 0..n {
        let roll = rng.random_range(0..100u32);
        let old_enough = originals.partition_point(|(at, _)| at + min_gap <= i);
        if roll < NEW || old_enough == 0 {
            let c = combos[originals.len() % combos.len()];
            originals.push((i, c));
            drafts.push((
                phrase(PHRASINGS[0], ACTIONS[c.0], OBJECTS[c.1], DETAILS[c.2]),
                false,
            ));
            continue;
        }
        let (a, o, d) = originals[rng.random_range(0..old_enough)].1;
        let (a, o, d) = (ACTIONS[a], OBJECTS[o], DETAILS[d]);
        drafts.push(if roll < NEW + REPEAT {
            (phrase(PHRASINGS[0], a, o, d), false)
        } else if roll < NEW + REPEAT + NEAR {
            let t = PHRASINGS[rng.random_range(1..PHRASINGS.len())];
            (phrase(t, a, o, d), false)
        } else {
            let extra = EXTRAS[rng.random_range(0..EXTRAS.len())];
            (phrase(PHRASINGS[0], a, &format!("{extra} {o}"), d), true)
        });
    }
    classify(drafts, threshold)
}

/// A non-zero component of an embedding.
type Sparse = Vec<(usize, f32)>;

fn sparse(text: &str) -> (Sparse, f32) {
    let v: Sparse = embed(text)
        .into_iter()
        .enumerate()
        .filter(|(_, x)| *x != 0.0)
        .collect();
    let norm = v.iter().map(|(_, x)| x * x).sum::<f32>().sqrt();
    (v, norm)
}

/// Cosine similarity of two sparse vectors (sorted by component).
fn cosine(a: &(Sparse, f32), b: &(Sparse, f32)) -> f32 {
    if a.1 == 0.0 || b.1 == 0.0 {
        return 0.0;
    }
    let (mut i, mut j, mut dot) = (0, 0, 0.0f32);
    while i < a.0.len() && j < b.0.len() {
        match a.0[i].0.cmp(&b.0[j].0) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                dot += a.0[i].1 * b.0[j].1;
                i += 1;
                j += 1;
            }
        }
    }
    dot / (a.1 * b.1)
}

/// Each draft `(text, built close)` as a task of the kind its text is.
fn classify(drafts: Vec<(String, bool)>, threshold: f32) -> Vec<Task> {
    let mut seen: HashSet<String> = HashSet::new();
    let mut vectors: Vec<(Sparse, f32)> = Vec::with_capacity(drafts.len());
    let mut out = Vec::with_capacity(drafts.len());
    for (text, close) in drafts {
        let v = sparse(&text);
        let similarity = vectors.iter().map(|w| cosine(&v, w)).fold(0.0f32, f32::max);
        let kind = if seen.contains(&text) {
            Kind::Repeat
        } else if similarity >= threshold {
            Kind::NearRepeat
        } else if close {
            Kind::Close
        } else {
            Kind::Unique
        };
        vectors.push(v);
        seen.insert(text.clone());
        out.push(Task {
            text: text.into(),
            kind,
            similarity,
        });
    }
    out
}

/// Each kind's share of `tasks`, in [`Kind::ALL`] order.
pub fn shares(tasks: &[Task]) -> Vec<(Kind, f64)> {
    let n = tasks.len().max(1) as f64;
    Kind::ALL
        .iter()
        .map(|k| (*k, tasks.iter().filter(|t| t.kind == *k).count() as f64 / n))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;

    #[test]
    fn every_word_has_its_own_embedding_component() {
        let mut components = HashSet::new();
        for w in ACTIONS
            .iter()
            .chain(&OBJECTS)
            .chain(&DETAILS)
            .chain(&EXTRAS)
        {
            let (v, _) = sparse(w);
            assert_eq!(v.len(), 1, "{w} is a stop word");
            assert!(components.insert(v[0].0), "{w} shares a component");
        }
    }

    #[test]
    fn phrasings_change_only_stop_words() {
        let canonical = sparse(&phrase(PHRASINGS[0], "reset", "password", "today"));
        for t in PHRASINGS {
            let v = sparse(&phrase(t, "reset", "password", "today"));
            assert!((cosine(&canonical, &v) - 1.0).abs() < 1e-6, "{t}");
        }
        let close = sparse(&phrase(PHRASINGS[0], "reset", "mobile password", "today"));
        assert!((cosine(&canonical, &close) - 3.0 / 12f32.sqrt()).abs() < 1e-6);
    }

    #[test]
    fn the_mix_is_reproducible_and_has_every_kind() {
        let a = tasks(600, 10, 0.9, 7);
        let b = tasks(600, 10, 0.9, 7);
        assert!(a.iter().zip(&b).all(|(x, y)| x.text == y.text));
        assert_ne!(
            a.iter().map(|t| t.text.clone()).collect::<Vec<_>>(),
            tasks(600, 10, 0.9, 8)
                .iter()
                .map(|t| t.text.clone())
                .collect::<Vec<_>>()
        );
        // Nothing but new questions until the first is old enough.
        assert!(a[..10].iter().all(|t| t.kind == Kind::Unique));
        for (kind, share) in shares(&a) {
            assert!(share > 0.05, "{kind:?} {share}");
        }
        for t in a.iter().filter(|t| t.kind == Kind::Repeat) {
            assert!((t.similarity - 1.0).abs() < 1e-6, "{t:?}");
        }
    }

    #[test]
    fn a_text_seen_before_is_a_repeat_whatever_it_was_built_as() {
        let drafts = vec![
            ("How do I reset my password today?".to_string(), false),
            ("how can i reset my password today".to_string(), false),
            ("how can i reset my password today".to_string(), false),
            ("How do I reset my mobile password today?".to_string(), true),
            ("How do I reset my mobile password today?".to_string(), true),
        ];
        let kinds: Vec<Kind> = classify(drafts, 0.9).iter().map(|t| t.kind).collect();
        assert_eq!(
            kinds,
            [
                Kind::Unique,
                Kind::NearRepeat,
                Kind::Repeat,
                Kind::Close,
                Kind::Repeat
            ]
        );
    }
}
