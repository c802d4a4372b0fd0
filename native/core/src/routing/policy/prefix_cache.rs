//! `prefix_cache`: cache affinity (`affinity.rs`) on the approximate index — the router assumes each
//! prompt's blocks stay on the endpoint it sent them to for `routed_ttl_s`. For engines that publish
//! no KV events.

use super::affinity::Affinity;
use super::{PickContext, Policy, PrefixSource, WaitOrder};
use crate::routing::config::RouterConfig;

pub struct PrefixCache(Affinity);

impl PrefixCache {
    pub fn new(cfg: &RouterConfig) -> Self {
        PrefixCache(Affinity::from_config(PrefixSource::Routed, cfg))
    }
}

impl Policy for PrefixCache {
    fn prefix_source(&self) -> PrefixSource {
        self.0.source
    }
    fn rank(&self, ctx: &PickContext<'_>) -> Vec<usize> {
        self.0.rank(ctx)
    }
    fn rank_top(&self, ctx: &PickContext<'_>, k: usize) -> Vec<usize> {
        self.0.rank_top(ctx, k)
    }
    fn wait_order(&self) -> Option<WaitOrder> {
        Some(self.0.wait_order())
    }
}
