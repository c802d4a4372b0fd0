//! PyO3 glue: the only place that knows about Python. Every call copies its inputs into owned Rust
//! values and releases the GIL while the work runs.

mod contracts;
mod kv_subscription;
mod load;
mod server;
mod tokenizer;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prost::Message;
use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict, PyList};

use extproc_core::auth::{ApiKeys, KeyEntry};
use extproc_core::engine::Protocol;
use extproc_core::error::ApiError;
use extproc_core::gateway::{
    Gateway, Limits, ServedModel, DEFAULT_MAX_BUFFERED_OUTPUT_TOKENS, DEFAULT_RESPONSES_MCP_MAX_ROUNDS,
};
use extproc_core::metrics;
use extproc_core::pb::ext_proc::ProcessingRequest;
use extproc_core::routing::policy::registry::DEFAULT_POLICY;
use extproc_core::routing::RouterConfig;
use extproc_core::stream::{Deadlines, RequestStream, Summary};
use load::PyEngineLoad;

/// One API key as Python passes it: `(sha256 hex, name, models, requests_per_minute)`.
type KeyTuple = (String, String, Vec<String>, u32);

/// Served models and their endpoints, shared by every request stream.
#[pyclass(name = "Gateway", module = "extproc._native", frozen)]
pub struct PyGateway {
    inner: Arc<Gateway>,
}

impl PyGateway {
    fn model(&self, name: &str) -> PyResult<Arc<ServedModel>> {
        self.inner
            .model(name)
            .ok_or_else(|| PyValueError::new_err(format!("unknown model {name}")))
    }
}

#[pymethods]
impl PyGateway {
    #[new]
    /// `first_token_timeout` / `inter_token_timeout`: seconds, 0 for no limit (`stream/deadline.rs`).
    #[pyo3(signature = (
        *,
        max_body_bytes,
        max_engine_message = 64 * 1024 * 1024,
        destination_fallbacks = 0,
        max_buffered_output_tokens = DEFAULT_MAX_BUFFERED_OUTPUT_TOKENS,
        first_token_timeout = 60.0,
        inter_token_timeout = 30.0,
        response_in_envoy = false,
        responses_mcp_max_rounds = DEFAULT_RESPONSES_MCP_MAX_ROUNDS,
    ))]
    #[allow(clippy::too_many_arguments)] // keyword-only in Python: each is named at the call
    fn new(
        max_body_bytes: usize,
        max_engine_message: usize,
        destination_fallbacks: usize,
        max_buffered_output_tokens: u64,
        first_token_timeout: f64,
        inter_token_timeout: f64,
        response_in_envoy: bool,
        responses_mcp_max_rounds: u32,
    ) -> PyResult<Self> {
        let seconds = |name: &str, s: f64| {
            Duration::try_from_secs_f64(s).map_err(|_| PyValueError::new_err(format!("{name} must be seconds >= 0")))
        };
        Ok(PyGateway {
            inner: Arc::new(Gateway::new(Limits {
                max_body_bytes,
                max_engine_message,
                destination_fallbacks,
                max_buffered_output_tokens,
                deadlines: Deadlines {
                    first_token: seconds("first_token_timeout", first_token_timeout)?,
                    inter_token: seconds("inter_token_timeout", inter_token_timeout)?,
                },
                response_in_envoy,
                responses_mcp_max_rounds,
            })),
        })
    }

    /// Load `model_dir` (tokenizer, chat template) and serve it as `name`, its engines picked by
    /// `policy` with `routing_config` (JSON object of `RouterConfig` fields; docs/routing.md). `tool_parser`,
    /// `reasoning_parser`: the formats of its chat answers (a name, "none", or "auto"/None to infer them).
    #[pyo3(signature = (
        name, model_dir, *, max_context = None, policy = DEFAULT_POLICY, routing_config = None,
        tool_parser = None, reasoning_parser = None
    ))]
    #[allow(clippy::too_many_arguments)]
    fn add_model(
        &self,
        py: Python<'_>,
        name: String,
        model_dir: PathBuf,
        max_context: Option<u32>,
        policy: &str,
        routing_config: Option<&str>,
        tool_parser: Option<String>,
        reasoning_parser: Option<String>,
    ) -> PyResult<()> {
        let config = match routing_config {
            Some(json) => RouterConfig::from_json(json).map_err(|e| PyValueError::new_err(e.to_string()))?,
            None => RouterConfig::default(),
        };
        let gateway = self.inner.clone();
        let policy = policy.to_string();
        py.detach(move || {
            let model = gateway.add_model(&name, &model_dir, max_context, &policy, config)?;
            model.set_parsers(tool_parser.as_deref(), reasoning_parser.as_deref())
        })
        .map_err(PyValueError::new_err)
    }

    /// Replace the engines of `name`: `(address "ip:port", KV block size or 0 when unknown)`,
    /// `(address, block size, protocol)` with protocol "vllm" (the default) or "sglang", or
    /// `(address, block size, protocol, data-parallel size)` (1 when absent): an engine of DP size N > 1
    /// is routed as N endpoints `"{address}#{rank}"`. Endpoints that stay keep their state; new ones
    /// start healthy.
    fn set_endpoints(&self, name: &str, endpoints: Vec<Bound<'_, PyAny>>) -> PyResult<()> {
        let model = self.model(name)?;
        let endpoints = endpoints.iter().map(endpoint_item).collect::<PyResult<Vec<_>>>()?;
        model
            .set_endpoints(endpoints)
            .map_err(|e| PyValueError::new_err(e.to_string()))
    }

    /// Give every request from now on a trace context (its spans are exported from the summaries,
    /// `extproc.request_traces`); off, none is made.
    fn set_tracing(&self, enabled: bool) {
        self.inner.set_tracing(enabled);
    }

    /// Mark an engine (un)healthy, all its data-parallel ranks; unhealthy engines are never picked. False
    /// for an unknown address.
    fn set_health(&self, name: &str, address: &str, healthy: bool) -> PyResult<bool> {
        Ok(self.model(name)?.router.set_health(address, healthy))
    }

    /// The engine's own load report (a `GetLoads` poll). `dp_rank`: the data-parallel rank the report
    /// is for, on an engine of several (`None`: the engine of one rank, or rank 0). False for an unknown
    /// address or rank.
    #[pyo3(signature = (name, address, load, *, dp_rank = None))]
    fn report_load(
        &self,
        name: &str,
        address: &str,
        load: PyRef<'_, PyEngineLoad>,
        dp_rank: Option<u32>,
    ) -> PyResult<bool> {
        Ok(self.model(name)?.router.set_engine_load(address, dp_rank, &load.inner))
    }

    /// Every engine address of `name` and the protocol it speaks ("vllm" or "sglang").
    fn endpoint_protocols(&self, name: &str) -> PyResult<Vec<(String, &'static str)>> {
        Ok(self
            .model(name)?
            .protocols()
            .into_iter()
            .map(|(a, p)| (a, p.as_str()))
            .collect())
    }

    /// Names of the healthy endpoints of `name`: engine addresses, `"{address}#{rank}"` for each rank of
    /// an engine with several data-parallel ranks.
    fn endpoints(&self, name: &str) -> PyResult<Vec<String>> {
        Ok(self.model(name)?.ready_endpoints())
    }

    /// Apply one serialized `KvEventBatch` from the engine at `address` to the endpoint of the batch's
    /// `dp_rank` (rank 0 when absent); returns the outcome kind ("applied", "load_only", "duplicate",
    /// "gap", "malformed", "unknown_endpoint").
    fn apply_kv_events(&self, py: Python<'_>, name: &str, address: &str, batch: &[u8]) -> PyResult<&'static str> {
        let model = self.model(name)?;
        let batch = batch.to_vec();
        let address = address.to_string();
        Ok(py.detach(move || model.router.apply_kv_events(&address, &batch).outcome.kind()))
    }

    /// Apply one message of vLLM's ZMQ KV-event channel from `address`: its sequence number and msgpack
    /// payload. Same outcome kinds as `apply_kv_events`; after "gap" the endpoint is unchanged (replay the
    /// missing sequences, then offer this message again, or call `reset_kv_events`).
    fn apply_zmq_kv_events(
        &self,
        py: Python<'_>,
        name: &str,
        address: &str,
        sequence: u64,
        payload: &[u8],
    ) -> PyResult<&'static str> {
        let model = self.model(name)?;
        let payload = payload.to_vec();
        let address = address.to_string();
        Ok(py.detach(move || {
            model
                .router
                .apply_zmq_kv_events(&address, sequence, &payload)
                .outcome
                .kind()
        }))
    }

    /// Forget what the routing index knows of `address`, every rank of it (before a fresh KV-event
    /// subscription).
    fn reset_kv_events(&self, name: &str, address: &str) -> PyResult<bool> {
        Ok(self.model(name)?.router.reset_kv_events(address))
    }

    /// The routing policy of `name` and its index size, for logs and debugging.
    fn routing_stats(&self, name: &str) -> PyResult<(String, String)> {
        let model = self.model(name)?;
        Ok((
            model.router.policy_name().to_string(),
            format!("{:?}", model.router.index_stats()),
        ))
    }

    /// Require an API key of every request: `(sha256 hex, name, models, requests_per_minute)` per key
    /// (models `["*"]`: all; 0: no rate limit), or None for none. Raises ValueError on a bad entry.
    fn set_api_keys(&self, keys: Option<Vec<KeyTuple>>) -> PyResult<()> {
        let keys = match keys {
            None => None,
            Some(entries) => {
                let entries = entries
                    .into_iter()
                    .map(|(sha256, name, models, requests_per_minute)| KeyEntry {
                        sha256,
                        name,
                        models,
                        requests_per_minute,
                    })
                    .collect();
                Some(ApiKeys::new(entries).map_err(PyValueError::new_err)?)
            }
        };
        self.inner.set_api_keys(keys);
        Ok(())
    }

    /// The data plane's Prometheus metrics, the whole text of one scrape (`extproc_core::metrics`).
    fn metrics_text(&self, py: Python<'_>) -> String {
        let gateway = self.inner.clone();
        py.detach(move || metrics::render(&gateway))
    }

    /// Every model's engine endpoints as an operator sees them: one dict each (`metrics::EngineView`).
    fn engines<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let list = PyList::empty(py);
        for e in metrics::engines(&self.inner) {
            let d = PyDict::new(py);
            d.set_item("model", e.model)?;
            d.set_item("engine", e.engine)?;
            d.set_item("protocol", e.protocol)?;
            d.set_item("healthy", e.healthy)?;
            d.set_item("in_flight_requests", e.in_flight_requests)?;
            d.set_item("in_flight_tokens", e.in_flight_tokens)?;
            d.set_item("running", e.running)?;
            d.set_item("waiting", e.waiting)?;
            d.set_item("kv_usage", e.kv_usage)?;
            d.set_item("cached_blocks", e.cached_blocks)?;
            d.set_item("nothing_cached", e.nothing_cached)?;
            d.set_item("penalty", e.penalty)?;
            d.set_item("penalty_failures", e.penalty_failures)?;
            list.append(d)?;
        }
        Ok(list)
    }

    fn model_names(&self) -> Vec<String> {
        self.inner.model_names()
    }

    fn max_context(&self, name: &str) -> PyResult<u32> {
        let model = self
            .inner
            .model(name)
            .ok_or_else(|| PyValueError::new_err(format!("unknown model {name}")))?;
        Ok(model.max_context())
    }

    fn set_max_context(&self, name: &str, tokens: u32) -> PyResult<()> {
        let model = self
            .inner
            .model(name)
            .ok_or_else(|| PyValueError::new_err(format!("unknown model {name}")))?;
        model.set_max_context(tokens);
        Ok(())
    }

    /// Tokenize `text` with `name`'s tokenizer (no special tokens added).
    fn encode(&self, py: Python<'_>, name: &str, text: String) -> PyResult<Vec<u32>> {
        let model = self
            .inner
            .model(name)
            .ok_or_else(|| PyValueError::new_err(format!("unknown model {name}")))?;
        py.detach(move || model.files.tokenizer.encode(&text))
            .map_err(PyRuntimeError::new_err)
    }

    fn new_stream(&self) -> PyStream {
        PyStream {
            inner: Mutex::new(RequestStream::new(self.inner.clone())),
        }
    }
}

/// One HTTP request's ext_proc stream.
#[pyclass(name = "Stream", module = "extproc._native", frozen)]
pub struct PyStream {
    inner: Mutex<RequestStream>,
}

#[pymethods]
impl PyStream {
    /// One serialized `ProcessingRequest` in; the serialized `ProcessingResponse`s to send, in order.
    /// Python holds these messages as protobuf objects of its own (xds-protos), so bytes are the
    /// natural handover; ValueError when `message` is not a `ProcessingRequest`.
    fn process<'py>(&self, py: Python<'py>, message: &[u8]) -> PyResult<Bound<'py, PyList>> {
        let message = message.to_vec();
        let replies = py
            .detach(|| {
                let request = ProcessingRequest::decode(message.as_slice())?;
                let mut machine = self.inner.lock().expect("stream lock");
                let mut replies = machine.process(request);
                // Only the native server makes a batch's engine calls.
                if let Some(calls) = machine.take_fanout() {
                    let refused = ApiError::new(
                        501,
                        "not_implemented",
                        "batched prompts need the native ext_proc server",
                    );
                    replies.extend(machine.fanout_done(calls.iter().map(|_| Err(refused.clone())).collect()));
                }
                // Nor the Responses API's.
                if machine.take_job().is_some() {
                    let refused = ApiError::new(
                        501,
                        "not_implemented",
                        "the Responses API needs the native ext_proc server",
                    );
                    replies.extend(machine.job_done(extproc_core::responses::api::Answer {
                        streamed: false,
                        status: refused.status,
                        content_type: "application/json",
                        body: refused.to_json(),
                        model: String::new(),
                        endpoint: String::new(),
                        usage: Default::default(),
                        error: refused.message,
                    }));
                }
                Ok::<_, prost::DecodeError>(replies.iter().map(Message::encode_to_vec).collect::<Vec<_>>())
            })
            .map_err(|e| PyValueError::new_err(format!("not a ProcessingRequest: {e}")))?;
        PyList::new(py, replies.iter().map(|r| PyBytes::new(py, r)))
    }

    /// `(endpoint, engine_request_id, protocol)` of an engine call still running, to abort when the
    /// stream ends.
    fn pending_abort(&self) -> Option<(String, String, &'static str)> {
        let machine = self.inner.lock().expect("stream lock");
        let pending = machine.pending_abort()?;
        Some((
            pending.endpoint.to_string(),
            pending.request_id.to_string(),
            pending.protocol.as_str(),
        ))
    }

    #[getter]
    fn done(&self) -> bool {
        self.inner.lock().expect("stream lock").is_done()
    }

    /// What the request became: a dict for logs and metrics.
    fn summary<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        summary_dict(py, self.inner.lock().expect("stream lock").summary())
    }
}

/// One `set_endpoints` item: a 2-, 3- or 4-tuple.
fn endpoint_item(item: &Bound<'_, PyAny>) -> PyResult<(String, u32, Protocol, u32)> {
    let parse = |protocol: String| protocol.parse::<Protocol>().map_err(PyValueError::new_err);
    if let Ok((address, block_size, protocol, dp_size)) = item.extract::<(String, u32, String, u32)>() {
        return Ok((address, block_size, parse(protocol)?, dp_size));
    }
    if let Ok((address, block_size, protocol)) = item.extract::<(String, u32, String)>() {
        return Ok((address, block_size, parse(protocol)?, 1));
    }
    let (address, block_size) = item.extract::<(String, u32)>().map_err(|_| {
        PyValueError::new_err(
            "endpoints are (address, block_size), (address, block_size, protocol) or \
             (address, block_size, protocol, dp_size) tuples",
        )
    })?;
    Ok((address, block_size, Protocol::default(), 1))
}

/// A request's summary as the dict Python logs and metrics read.
pub(crate) fn summary_dict(py: Python<'_>, s: Summary) -> PyResult<Bound<'_, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("request_id", s.request_id)?;
    d.set_item("engine_request_id", s.engine_request_id)?;
    d.set_item("path", s.path)?;
    d.set_item("model", s.model)?;
    d.set_item("endpoint", s.endpoint)?;
    // Only for a request pinned to a data-parallel rank: other logs stay as they were.
    if let Some(rank) = s.dp_rank {
        d.set_item("dp_rank", rank)?;
    }
    d.set_item("status", s.status)?;
    d.set_item("prompt_tokens", s.prompt_tokens)?;
    d.set_item("completion_tokens", s.completion_tokens)?;
    d.set_item("cached_tokens", s.cached_tokens)?;
    d.set_item("finish_reason", s.finish_reason)?;
    d.set_item("error", s.error)?;
    d.set_item("objective", s.objective)?;
    d.set_item("priority", s.priority)?;
    d.set_item("api_key", s.api_key)?;
    // Phase times (ns since the Unix epoch) for the request log and spans: only the phases reached.
    let timings = PyDict::new(py);
    for (phase, ns) in s.timings.reached() {
        timings.set_item(phase, ns)?;
    }
    d.set_item("timings_ns", timings)?;
    // Only when tracing is on: ids as the hex strings of W3C trace context.
    if let Some(t) = s.trace {
        let trace = PyDict::new(py);
        trace.set_item("trace_id", format!("{:032x}", t.trace_id))?;
        trace.set_item("parent_span_id", t.parent_span_id.map(|id| format!("{id:016x}")))?;
        trace.set_item("engine_span_id", format!("{:016x}", t.engine_span_id))?;
        trace.set_item("sampled", t.sampled())?;
        d.set_item("trace", trace)?;
    }
    Ok(d)
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyGateway>()?;
    m.add_class::<PyStream>()?;
    load::register(m)?;
    contracts::register(m)?;
    tokenizer::register(m)?;
    server::register(m)?;
    kv_subscription::register(m)?;
    Ok(())
}
