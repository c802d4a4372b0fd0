//! `kv_events`: cache affinity (`affinity.rs`) on the precise index fed by the engines' KV events —
//! an endpoint counts as holding a block from its engine's Stored event until its Removed event.

use super::affinity::Affinity;
use super::{PickContext, Policy, PrefixSource, WaitOrder};
use crate::routing::config::RouterConfig;

pub struct KvEvents(Affinity);

impl KvEvents {
    pub fn new(cfg: &RouterConfig) -> Self {
        KvEvents(Affinity::from_config(PrefixSource::Events, cfg))
    }
}

impl Policy for KvEvents {
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
