//! Endpoint picking: which engine serves a request, from the engines' loads and what their KV caches
//! hold. Pure Rust, no Python: the PyO3 layer wraps `Router`. See `docs/routing.md`.
//!
//! - `block_hash`: the gateway's own content hash chain over full blocks of token ids.
//! - `prefix_index` (+ `shard`, `membership`, `holders`, `endpoint_set`): block → endpoints holding it,
//!   bounded, precise (from events) or approximate (from routing decisions, with a TTL).
//! - `events` (+ `cursor`, `engine_map`): KV-event batches applied to the precise index.
//! - `zmq_events`: vLLM's ZMQ KV-event payloads (msgpack) as the batches `events` applies.
//! - `policy/`: filters → weighted scorers → picker, policies registered by name.
//! - `penalty`: failures streams report, which eject an endpoint for a growing backoff.
//! - `load_order`: the healthy endpoints by expected wait and by load, kept current, for large pools.
//! - `demand`: each endpoint's requests over a recent window (the underused-endpoint test).
//! - `residents`: the sessions whose last request went to each endpoint, within a window.
//! - `router`: endpoints, health, loads, in-flight accounting, the pick.

pub mod block_hash;
pub mod config;
pub mod cursor;
pub mod demand;
pub mod endpoint;
pub mod endpoint_set;
pub mod engine_map;
pub mod error;
pub mod events;
pub mod holders;
pub mod load;
pub mod load_order;
pub mod membership;
pub mod mix_hash;
pub mod penalty;
pub mod policy;
pub mod prefill_progress;
pub mod prefix_index;
pub mod residents;
pub mod rng;
pub mod router;
pub mod session_bookings;
mod shard;
pub mod zmq_events;

pub use config::RouterConfig;
pub use endpoint::InFlight;
pub use error::RoutingError;
pub use events::{ApplyStats, BatchResult, EventOutcome, OnGap};
pub use load::{EngineLoad, Load};
pub use penalty::{Backoff, Failure, Standing};
pub use router::{EndpointInfo, IndexStats, NoRoute, Pick, PickRequest, Router};
