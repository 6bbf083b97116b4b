//! One scope's nearest-neighbour index: an HNSW graph (`hnsw_rs`, cosine
//! distance) over unit vectors. The graph cannot delete, so a removed entry
//! becomes a tombstone the search filters out, and the graph is rebuilt
//! from the live entries once the dead outnumber them. Not thread-safe by
//! itself: the store holds it under its lock.

use std::collections::HashMap;

use hnsw_rs::prelude::{DistCosine, Hnsw};

/// Links per node and layer (HNSW's M).
const LINKS: usize = 16;
/// Candidate list while inserting (efConstruction).
const EF_CONSTRUCTION: usize = 64;
/// Candidate list while searching (ef).
const EF_SEARCH: usize = 32;
/// Neighbours asked for; the best by exact cosine wins.
const K: usize = 4;
/// Tombstones tolerated before a rebuild is considered.
const MIN_DEAD_FOR_REBUILD: usize = 32;

/// A unit vector of the embedder's dimension, or `None` for a vector that
/// cannot be compared (empty, zero, not finite).
pub fn normalized(mut v: Vec<f32>) -> Option<Vec<f32>> {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if v.is_empty() || !norm.is_finite() || norm == 0.0 {
        return None;
    }
    v.iter_mut().for_each(|x| *x /= norm);
    Some(v)
}

/// Cosine similarity of two unit vectors.
pub fn cosine(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| x * y)
        .sum::<f32>()
        .clamp(-1.0, 1.0)
}

struct Live<V> {
    vector: Vec<f32>,
    value: V,
}

pub struct ScopeIndex<V> {
    graph: Hnsw<'static, f32, DistCosine>,
    live: HashMap<usize, Live<V>>,
    dim: usize,
    dead: usize,
}

fn graph(hint: usize) -> Hnsw<'static, f32, DistCosine> {
    Hnsw::new(LINKS, hint.max(64), 16, EF_CONSTRUCTION, DistCosine)
}

impl<V> ScopeIndex<V> {
    pub fn new(dim: usize) -> Self {
        ScopeIndex {
            graph: graph(64),
            live: HashMap::new(),
            dim,
            dead: 0,
        }
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn len(&self) -> usize {
        self.live.len()
    }

    pub fn is_empty(&self) -> bool {
        self.live.is_empty()
    }

    /// Adds a unit vector of this index's dimension under `id` (unique
    /// for the index's lifetime: the caller's counter); false if refused.
    pub fn insert(&mut self, id: usize, vector: Vec<f32>, value: V) -> bool {
        if vector.len() != self.dim || self.live.contains_key(&id) {
            return false;
        }
        self.graph.insert((&vector, id));
        self.live.insert(id, Live { vector, value });
        true
    }

    /// Removes an entry (a tombstone until the next rebuild).
    pub fn remove(&mut self, id: usize) -> Option<V> {
        let gone = self.live.remove(&id)?;
        self.dead += 1;
        if self.dead >= MIN_DEAD_FOR_REBUILD && self.dead > self.live.len() {
            self.rebuild();
        }
        Some(gone.value)
    }

    pub fn get(&self, id: usize) -> Option<&V> {
        self.live.get(&id).map(|l| &l.value)
    }

    /// The closest live entry to a unit vector: its id and exact similarity.
    pub fn nearest(&self, query: &[f32]) -> Option<(usize, f32)> {
        if query.len() != self.dim || self.live.is_empty() {
            return None;
        }
        let alive = |id: &usize| self.live.contains_key(id);
        self.graph
            .search_filter(query, K, EF_SEARCH, Some(&alive))
            .into_iter()
            .filter_map(|n| {
                let live = self.live.get(&n.d_id)?;
                Some((n.d_id, cosine(query, &live.vector)))
            })
            .max_by(|a, b| a.1.total_cmp(&b.1))
    }

    /// A fresh graph of the live entries (ids kept).
    fn rebuild(&mut self) {
        let graph = graph(self.live.len());
        for (id, live) in &self.live {
            graph.insert((&live.vector, *id));
        }
        self.graph = graph;
        self.dead = 0;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn random_unit(rng: &mut rand::rngs::StdRng, dim: usize) -> Vec<f32> {
        normalized((0..dim).map(|_| rng.random_range(-1.0..1.0)).collect()).unwrap()
    }

    #[test]
    fn finds_the_nearest_among_many_and_forgets_removed_ones() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(7);
        let mut index = ScopeIndex::new(64);
        let points: Vec<Vec<f32>> = (0..500).map(|_| random_unit(&mut rng, 64)).collect();
        for (i, p) in points.iter().enumerate() {
            assert!(index.insert(i, p.clone(), i));
        }
        assert!(!index.insert(3, points[0].clone(), 0), "ids are unique");
        // A slightly moved copy of each point finds that point.
        let mut found = 0;
        for (i, p) in points.iter().enumerate().take(100) {
            let near: Vec<f32> = p
                .iter()
                .map(|x| x + rng.random_range(-0.01..0.01))
                .collect();
            let near = normalized(near).unwrap();
            let (id, sim) = index.nearest(&near).unwrap();
            if id == i {
                found += 1;
                assert!(sim > 0.99, "{sim}");
            }
        }
        assert!(found >= 98, "approximate search found {found} of 100");
        // Removed entries never come back, through tombstones and rebuilds.
        for i in 0..400 {
            assert_eq!(index.remove(i), Some(i));
        }
        assert_eq!(index.len(), 100);
        for p in points.iter().take(400) {
            let (id, _) = index.nearest(p).unwrap();
            assert!(id >= 400, "a removed entry ({id}) was found");
        }
        let (id, sim) = index.nearest(&points[450]).unwrap();
        assert_eq!(id, 450);
        assert!((sim - 1.0).abs() < 1e-5);
    }

    #[test]
    fn vectors_of_another_dimension_or_without_direction_are_refused() {
        let mut index = ScopeIndex::new(3);
        assert!(!index.insert(0, vec![1.0, 0.0], ()));
        assert!(index.nearest(&[1.0, 0.0]).is_none());
        assert!(normalized(vec![0.0, 0.0, 0.0]).is_none());
        assert!(normalized(vec![f32::NAN, 1.0, 0.0]).is_none());
        assert!(normalized(Vec::new()).is_none());
        let v = normalized(vec![3.0, 4.0, 0.0]).unwrap();
        assert!((v[0] - 0.6).abs() < 1e-6 && (v[1] - 0.8).abs() < 1e-6);
        assert!(index.insert(7, v.clone(), ()));
        assert_eq!(index.nearest(&v).map(|(id, _)| id), Some(7));
        assert!(index
            .nearest(&[0.0, 0.0, 1.0])
            .is_some_and(|(_, s)| s.abs() < 1e-6));
    }
}
