//! The one place policies and scorers are known by type name.

use super::consistent_hash::ConsistentHash;
use super::filter::SpillGate;
use super::kv_events::KvEvents;
use super::least_load::LeastLoad;
use super::power_of_two::PowerOfTwo;
use super::prefix_cache::PrefixCache;
use super::random::Random;
use super::round_robin::RoundRobin;
use super::scorer::{kv_usage::KvUsageScorer, load::LoadScorer, prefix::PrefixScorer, queue::QueueScorer};
use super::scorer::{Scorer, Weighted as WeightedScorer};
use super::weighted::Weighted;
use super::{Policy, PrefixSource};
use crate::routing::config::RouterConfig;
use crate::routing::error::RoutingError;

type PolicyCtor = fn(&RouterConfig) -> Result<Box<dyn Policy>, RoutingError>;
type ScorerCtor = fn() -> Box<dyn Scorer>;

/// The policy a model gets unless its settings name another (Python's settings default to it too).
pub const DEFAULT_POLICY: &str = "kv_events";

/// Every policy by the name settings use, the default first, then the cache-affine ones, then the rest;
/// Python's settings offer exactly these (exported through the binding), in this order.
const POLICIES: &[(&str, PolicyCtor)] = &[
    (DEFAULT_POLICY, |cfg| Ok(Box::new(KvEvents::new(cfg)))),
    ("prefix_cache", |cfg| Ok(Box::new(PrefixCache::new(cfg)))),
    ("weighted", weighted),
    ("round_robin", |_| Ok(Box::new(RoundRobin::default()))),
    ("random", |_| Ok(Box::new(Random))),
    ("least_load", |_| Ok(Box::new(LeastLoad))),
    ("power_of_two", |_| Ok(Box::new(PowerOfTwo))),
    ("consistent_hash", |_| Ok(Box::new(ConsistentHash))),
];

const SCORERS: &[(&str, ScorerCtor)] = &[
    ("prefix", || Box::new(PrefixScorer)),
    ("queue", || Box::new(QueueScorer)),
    ("load", || Box::new(LoadScorer)),
    ("kv_usage", || Box::new(KvUsageScorer)),
];

pub fn policy_names() -> Vec<&'static str> {
    POLICIES.iter().map(|(n, _)| *n).collect()
}

pub fn scorer_names() -> Vec<&'static str> {
    SCORERS.iter().map(|(n, _)| *n).collect()
}

pub fn policy(name: &str, cfg: &RouterConfig) -> Result<Box<dyn Policy>, RoutingError> {
    cfg.validate()?;
    let (_, ctor) = POLICIES
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| RoutingError::UnknownPolicy {
            name: name.to_string(),
            known: policy_names().join(", "),
        })?;
    ctor(cfg)
}

pub fn scorer(name: &str) -> Result<Box<dyn Scorer>, RoutingError> {
    let (_, ctor) = SCORERS
        .iter()
        .find(|(n, _)| *n == name)
        .ok_or_else(|| RoutingError::UnknownScorer {
            name: name.to_string(),
            known: scorer_names().join(", "),
        })?;
    Ok(ctor())
}

fn weighted(cfg: &RouterConfig) -> Result<Box<dyn Policy>, RoutingError> {
    let scorers = cfg
        .scorers
        .iter()
        .map(|(name, &weight)| {
            Ok(WeightedScorer {
                scorer: scorer(name)?,
                weight,
            })
        })
        .collect::<Result<Vec<_>, RoutingError>>()?;
    let reads_prefix = cfg.scorers.get("prefix").is_some_and(|&w| w > 0.0);
    let source = match (reads_prefix, cfg.prefix_source.as_str()) {
        (false, _) => PrefixSource::None,
        (true, "routed") => PrefixSource::Routed,
        (true, _) => PrefixSource::Events,
    };
    Ok(Box::new(Weighted {
        scorers,
        gate: SpillGate::from_config(cfg),
        source,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_policy_builds_and_names_are_checked() {
        for name in policy_names() {
            assert!(policy(name, &RouterConfig::default()).is_ok(), "{name}");
        }
        let mut unique = policy_names();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), POLICIES.len(), "a policy name is registered twice");
        assert!(matches!(
            policy("cache_aware", &RouterConfig::default()),
            Err(RoutingError::UnknownPolicy { .. })
        ));
        let cfg = RouterConfig {
            scorers: [("latency".to_string(), 1.0)].into(),
            ..Default::default()
        };
        assert!(matches!(
            policy("weighted", &cfg),
            Err(RoutingError::UnknownScorer { .. })
        ));
    }

    #[test]
    fn prefix_sources() {
        let cfg = RouterConfig::default();
        assert_eq!(policy("kv_events", &cfg).unwrap().prefix_source(), PrefixSource::Events);
        assert_eq!(
            policy("prefix_cache", &cfg).unwrap().prefix_source(),
            PrefixSource::Routed
        );
        assert_eq!(policy("least_load", &cfg).unwrap().prefix_source(), PrefixSource::None);
        assert_eq!(policy("weighted", &cfg).unwrap().prefix_source(), PrefixSource::Events);
        let routed = RouterConfig {
            prefix_source: "routed".into(),
            ..Default::default()
        };
        assert_eq!(
            policy("weighted", &routed).unwrap().prefix_source(),
            PrefixSource::Routed
        );
        let no_prefix = RouterConfig {
            scorers: [("queue".to_string(), 1.0)].into(),
            ..Default::default()
        };
        assert_eq!(
            policy("weighted", &no_prefix).unwrap().prefix_source(),
            PrefixSource::None
        );
    }
}
