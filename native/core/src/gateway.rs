//! The gateway's shared, read-mostly state: served models and their engine endpoints.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{SystemTime, UNIX_EPOCH};

use crate::auth::ApiKeys;
use crate::engine::Protocol;
use crate::model::ModelFiles;
use crate::routing::endpoint::{engine_endpoint_names, split_name};
use crate::routing::{Router, RouterConfig, RoutingError};
use crate::stream::output_plan::{non_marker_special_ids, ModelParsers};
use crate::stream::Deadlines;

pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

pub struct ServedModel {
    pub name: String,
    pub files: ModelFiles,
    max_context: AtomicU32,
    /// The longest token of the vocabulary, in bytes: a text of more than `max_context` times this
    /// many bytes has more tokens than the context holds, whatever it says.
    pub max_token_bytes: usize,
    pub created: u64,
    /// The model's engines (set by the control plane) and the policy that picks among them: one
    /// endpoint per engine, or per data-parallel rank (`"{address}#{rank}"`) of an engine with several.
    pub router: Router,
    /// The protocol each engine address speaks; the router itself only knows addresses.
    protocols: RwLock<HashMap<String, Protocol>>,
    /// The tool-call and reasoning parsers of its chat answers.
    parsers: RwLock<ModelParsers>,
    /// The special tokens parsed answers drop (computed at the first parsed answer: a vocabulary scan).
    dropped_special_ids: OnceLock<Arc<HashSet<u32>>>,
}

impl ServedModel {
    /// The longest prompt plus completion the engines accept, in tokens.
    pub fn max_context(&self) -> u32 {
        self.max_context.load(Ordering::Relaxed)
    }

    /// Engines report their context length at registration; it overrides the directory's.
    pub fn set_max_context(&self, tokens: u32) {
        self.max_context.store(tokens, Ordering::Relaxed);
    }

    /// Replace the model's engines: `(address, KV block size or 0, protocol, data-parallel size)`. An
    /// engine of DP size N > 1 is routed as N endpoints `"{address}#{rank}"`, one per rank (each has its
    /// own KV cache); one of size 1 (or 0) as its address alone.
    pub fn set_endpoints(&self, endpoints: Vec<(String, u32, Protocol, u32)>) -> Result<(), RoutingError> {
        let protocols: HashMap<String, Protocol> = endpoints.iter().map(|(a, _, p, _)| (a.clone(), *p)).collect();
        // Protocols first: a request routed to a new address right after the router learns it must find it.
        let previous = std::mem::replace(&mut *self.protocols.write().expect("protocol lock"), protocols.clone());
        let routed = endpoints
            .iter()
            .flat_map(|&(ref a, b, _, dp)| engine_endpoint_names(a, dp).into_iter().map(move |name| (name, b)))
            .collect();
        if let Err(e) = self.router.set_endpoints(routed) {
            *self.protocols.write().expect("protocol lock") = previous;
            return Err(e);
        }
        Ok(())
    }

    /// The protocol of the engine at `address`, or of the engine an endpoint name `"{address}#{rank}"`
    /// stands for (vLLM for an address the control plane never named).
    pub fn protocol(&self, address: &str) -> Protocol {
        let address = split_name(address).0;
        self.protocols
            .read()
            .expect("protocol lock")
            .get(address)
            .copied()
            .unwrap_or_default()
    }

    /// Every endpoint address and its protocol, sorted by address.
    pub fn protocols(&self) -> Vec<(String, Protocol)> {
        let mut all: Vec<_> = self
            .protocols
            .read()
            .expect("protocol lock")
            .iter()
            .map(|(a, p)| (a.clone(), *p))
            .collect();
        all.sort();
        all
    }

    /// The tool-call and reasoning parsers of its chat answers.
    pub fn parsers(&self) -> ModelParsers {
        *self.parsers.read().expect("parsers lock")
    }

    /// Every special token but the parsers' markers (`output_plan::PARSER_MARKERS`).
    pub fn non_marker_special_ids(&self) -> Arc<HashSet<u32>> {
        self.dropped_special_ids
            .get_or_init(|| Arc::new(non_marker_special_ids(&self.files)))
            .clone()
    }

    /// Set the parsers by name (`tool_parser`, `reasoning_parser`: a format, `none`, or `auto`/None to
    /// infer it from the model's name and chat template).
    pub fn set_parsers(&self, tool_parser: Option<&str>, reasoning_parser: Option<&str>) -> Result<(), String> {
        let parsers = ModelParsers::resolve(&self.name, &self.files, tool_parser, reasoning_parser)?;
        *self.parsers.write().expect("parsers lock") = parsers;
        Ok(())
    }

    /// Names of the healthy endpoints (addresses; `"{address}#{rank}"` for the ranks of a DP engine).
    pub fn ready_endpoints(&self) -> Vec<String> {
        self.router
            .endpoints()
            .into_iter()
            .filter(|e| e.healthy)
            .map(|e| e.address.to_string())
            .collect()
    }
}

/// Limits applied to every request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub max_body_bytes: usize,
    /// Largest single gRPC message accepted from an engine.
    pub max_engine_message: usize,
    /// Fallback engines listed after the primary in the destination (0: the primary only, which an
    /// ORIGINAL_DST cluster requires; Envoy's override_host policy follows a longer list).
    pub destination_fallbacks: usize,
    /// A non-streamed answer is held whole until it is sent: refuse requests that could make it
    /// larger than this many output tokens, counting each of a token's top logprobs as one more
    /// (prompts × n × max_tokens × (top_logprobs + 1)).
    pub max_buffered_output_tokens: u64,
    /// First-token and inter-token deadlines of every engine call (`stream/deadline.rs`).
    pub deadlines: Deadlines,
    /// The response side runs in Envoy (the `extproc_envoy` dynamic module, issue 17): routed requests
    /// carry their response plan in dynamic metadata, and extproc sees only the response's headers and
    /// trailers (Envoy's ext_proc processing mode sends it no response body).
    pub response_in_envoy: bool,
    /// Rounds of MCP tool calls one Response may run before it ends `incomplete` (`responses/tool_loop.rs`).
    pub responses_mcp_max_rounds: u32,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_body_bytes: 8 << 20,
            max_engine_message: 64 << 20,
            destination_fallbacks: 0,
            max_buffered_output_tokens: DEFAULT_MAX_BUFFERED_OUTPUT_TOKENS,
            deadlines: Deadlines::default(),
            response_in_envoy: false,
            responses_mcp_max_rounds: DEFAULT_RESPONSES_MCP_MAX_ROUNDS,
        }
    }
}

/// Enough for an agent's few lookups; a model calling tools in a loop ends well before a client times out.
pub const DEFAULT_RESPONSES_MCP_MAX_ROUNDS: u32 = 8;

/// About 3 KB of extproc memory per buffered token with its logprobs (issue 15 measured 3.9 GB for
/// 64 × 1,000 × 21; 8 × 1,000 × 21 takes about 490 MB): 256 Ki tokens keep one answer under 1 GB.
pub const DEFAULT_MAX_BUFFERED_OUTPUT_TOKENS: u64 = 1 << 18;

pub struct Gateway {
    models: RwLock<HashMap<String, Arc<ServedModel>>>,
    pub limits: Limits,
    /// None: no keys configured, every request is let in.
    api_keys: RwLock<Option<Arc<ApiKeys>>>,
    /// Requests get a trace context (`stream::trace`); off, no trace ids are drawn.
    tracing: AtomicBool,
}

impl Gateway {
    pub fn new(limits: Limits) -> Self {
        Gateway {
            models: RwLock::new(HashMap::new()),
            limits,
            api_keys: RwLock::new(None),
            tracing: AtomicBool::new(false),
        }
    }

    /// Require an API key on every request from now on (None: none required).
    pub fn set_api_keys(&self, keys: Option<ApiKeys>) {
        *self.api_keys.write().expect("api keys lock") = keys.map(Arc::new);
    }

    /// Give every request from now on a trace context (the control plane exports its spans).
    pub fn set_tracing(&self, on: bool) {
        self.tracing.store(on, Ordering::Relaxed);
    }

    pub fn tracing(&self) -> bool {
        self.tracing.load(Ordering::Relaxed)
    }

    pub fn api_keys(&self) -> Option<Arc<ApiKeys>> {
        self.api_keys.read().expect("api keys lock").clone()
    }

    /// Load a model directory and serve it as `name` (replacing any model of that name), its engines
    /// picked by `policy` (see `routing::policy::registry`).
    pub fn add_model(
        &self,
        name: &str,
        dir: &Path,
        max_context: Option<u32>,
        policy: &str,
        routing: RouterConfig,
    ) -> Result<Arc<ServedModel>, String> {
        let router = Router::new(policy, routing).map_err(|e| format!("routing: {e}"))?;
        let files = ModelFiles::load(dir)?;
        let max_context = max_context.or(files.max_context).unwrap_or(8192);
        let max_token_bytes = files.tokenizer.longest_token_bytes();
        let parsers = ModelParsers::resolve(name, &files, None, None)?;
        let model = Arc::new(ServedModel {
            name: name.to_string(),
            files,
            max_context: AtomicU32::new(max_context),
            max_token_bytes,
            created: unix_now(),
            router,
            protocols: RwLock::new(HashMap::new()),
            parsers: RwLock::new(parsers),
            dropped_special_ids: OnceLock::new(),
        });
        self.models
            .write()
            .expect("model lock")
            .insert(name.to_string(), model.clone());
        Ok(model)
    }

    /// The served models' names, sorted.
    pub fn model_names(&self) -> Vec<String> {
        self.models().iter().map(|m| m.name.clone()).collect()
    }

    pub fn model(&self, name: &str) -> Option<Arc<ServedModel>> {
        self.models.read().expect("model lock").get(name).cloned()
    }

    /// Every served model, sorted by name.
    pub fn models(&self) -> Vec<Arc<ServedModel>> {
        let mut models: Vec<_> = self.models.read().expect("model lock").values().cloned().collect();
        models.sort_by(|a, b| a.name.cmp(&b.name));
        models
    }
}
