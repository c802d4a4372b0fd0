//! Engine request ids: one per engine request, unique for the life of the process and across restarts.
//!
//! Engines know a request by its id and abort by it, so an id must never be shared: not the client's
//! `x-request-id` (a second client could reuse a victim's id, then hang up and abort the victim's
//! generation), not a clock reading (two requests in one second). An id is a random prefix drawn once per
//! process (a restarted extproc never reuses an id an engine may still hold) and a counter.

use std::collections::hash_map::RandomState;
use std::hash::BuildHasher;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The next engine request id: `extproc-<16 hex digits of process prefix>-<counter>`.
pub fn next() -> String {
    static PREFIX: OnceLock<u64> = OnceLock::new();
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    // std seeds each RandomState from the OS's random source: a 64-bit value no other process shares.
    let prefix = *PREFIX.get_or_init(|| RandomState::new().hash_one(std::process::id()));
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("extproc-{prefix:016x}-{n}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_unique_and_share_the_process_prefix() {
        let ids: Vec<String> = (0..1000).map(|_| next()).collect();
        let mut unique = ids.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), ids.len());
        let prefix = |id: &str| id.rsplit_once('-').unwrap().0.to_string();
        assert!(ids.iter().all(|id| prefix(id) == prefix(&ids[0])));
        assert_eq!(prefix(&ids[0]).len(), "extproc-".len() + 16);
    }
}
