//! The registry's building blocks: a histogram of atomics, and a family of series keyed by label
//! values. Recording never takes a write lock once a series exists: the family's map is read-locked to
//! find the series, whose value is then updated with relaxed atomics.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// A histogram over fixed bucket bounds. Values are recorded in integer units (nanoseconds, tokens)
/// and rendered scaled (`scale` units per rendered unit), so the sum is one `fetch_add`.
#[derive(Debug)]
pub struct Histogram {
    /// Upper bounds in recorded units, ascending.
    bounds: &'static [u64],
    /// One count per bound, plus the `+Inf` bucket; not cumulative (made so when rendered).
    buckets: Box<[AtomicU64]>,
    sum: AtomicU64,
}

impl Histogram {
    pub fn new(bounds: &'static [u64]) -> Self {
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum: AtomicU64::new(0),
        }
    }

    pub fn observe(&self, value: u64) {
        let i = self.bounds.partition_point(|&b| b < value);
        self.buckets[i].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    pub fn bounds(&self) -> &'static [u64] {
        self.bounds
    }

    /// Cumulative counts per bound, then the total (the `+Inf` bucket), and the sum.
    pub fn snapshot(&self) -> (Vec<u64>, u64) {
        let mut acc = 0;
        let cumulative = self
            .buckets
            .iter()
            .map(|b| {
                acc += b.load(Ordering::Relaxed);
                acc
            })
            .collect();
        (cumulative, self.sum.load(Ordering::Relaxed))
    }
}

/// One series of a family: its label values and its value.
pub struct Series<V> {
    pub labels: Box<[Box<str>]>,
    pub value: V,
}

/// The series of one metric, created on first use of their label values.
pub struct Family<V> {
    pub label_names: &'static [&'static str],
    make: Box<dyn Fn() -> V + Send + Sync>,
    hasher: std::hash::RandomState,
    /// By the hash of the label values; a hash's series are told apart by comparing labels.
    map: RwLock<HashMap<u64, Vec<Arc<Series<V>>>>>,
}

impl<V> Family<V> {
    pub fn new(label_names: &'static [&'static str], make: impl Fn() -> V + Send + Sync + 'static) -> Self {
        Family {
            label_names,
            make: Box::new(make),
            hasher: std::hash::RandomState::new(),
            map: RwLock::new(HashMap::new()),
        }
    }

    /// The series of these label values (in `label_names` order), created if new.
    pub fn get(&self, labels: &[&str]) -> Arc<Series<V>> {
        debug_assert_eq!(labels.len(), self.label_names.len());
        let key = self.hasher.hash_one(labels);
        let same = |s: &&Arc<Series<V>>| s.labels.iter().map(|l| &**l).eq(labels.iter().copied());
        {
            let map = self.map.read().unwrap_or_else(|e| e.into_inner());
            if let Some(found) = map.get(&key).and_then(|v| v.iter().find(same)) {
                return found.clone();
            }
        }
        let mut map = self.map.write().unwrap_or_else(|e| e.into_inner());
        let slot = map.entry(key).or_default();
        if let Some(found) = slot.iter().find(same) {
            return found.clone();
        }
        let series = Arc::new(Series {
            labels: labels.iter().map(|l| Box::from(*l)).collect(),
            value: (self.make)(),
        });
        slot.push(series.clone());
        series
    }

    /// Every series, sorted by label values (a stable exposition order).
    pub fn series(&self) -> Vec<Arc<Series<V>>> {
        let map = self.map.read().unwrap_or_else(|e| e.into_inner());
        let mut all: Vec<_> = map.values().flatten().cloned().collect();
        all.sort_by(|a, b| a.labels.cmp(&b.labels));
        all
    }
}

impl Family<AtomicU64> {
    pub fn counter(label_names: &'static [&'static str]) -> Self {
        Family::new(label_names, || AtomicU64::new(0))
    }

    pub fn add(&self, labels: &[&str], n: u64) {
        self.get(labels).value.fetch_add(n, Ordering::Relaxed);
    }
}

impl Family<Histogram> {
    pub fn histogram(label_names: &'static [&'static str], bounds: &'static [u64]) -> Self {
        Family::new(label_names, move || Histogram::new(bounds))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_value_on_a_bound_counts_in_that_bucket_and_buckets_accumulate() {
        let h = Histogram::new(&[10, 20]);
        for v in [0, 10, 11, 20, 21, 500] {
            h.observe(v);
        }
        let (cumulative, sum) = h.snapshot();
        assert_eq!(cumulative, [2, 4, 6]);
        assert_eq!(sum, 562);
    }

    #[test]
    fn the_same_labels_find_the_same_series_and_others_a_new_one() {
        let f = Family::counter(&["a", "b"]);
        f.add(&["x", "y"], 1);
        f.add(&["x", "y"], 2);
        f.add(&["x", "z"], 5);
        let series = f.series();
        let seen: Vec<(Vec<&str>, u64)> = series
            .iter()
            .map(|s| (s.labels.iter().map(|l| &**l).collect(), s.value.load(Ordering::Relaxed)))
            .collect();
        assert_eq!(seen, [(vec!["x", "y"], 3), (vec!["x", "z"], 5)]);
    }
}
