//! Telling an engine to stop a request whose client went away: the engine protocol's `Abort` RPC, sent
//! from the runtime without waiting for it, over one lazily connected channel per engine endpoint.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tonic::transport::{Channel, Endpoint};
use tonic::Status;

use super::engine_codec::EngineCodec;
use super::stats::{Counters, Telemetry};
use crate::engine::Protocol;

pub const ABORT_TIMEOUT: Duration = Duration::from_secs(2);
/// Endpoints come and go with the pool; past this many cached channels, start over.
const MAX_CHANNELS: usize = 1024;

pub struct Aborter {
    runtime: Handle,
    telemetry: Arc<Telemetry>,
    channels: Mutex<HashMap<String, Channel>>,
    in_flight: AtomicUsize,
    idle: Notify,
}

impl Aborter {
    pub fn new(runtime: Handle, telemetry: Arc<Telemetry>) -> Arc<Self> {
        Arc::new(Aborter {
            runtime,
            telemetry,
            channels: Mutex::new(HashMap::new()),
            in_flight: AtomicUsize::new(0),
            idle: Notify::new(),
        })
    }

    /// Send `Abort` for `request_id` to the `protocol` engine at `endpoint` ("host:port"); returns at once.
    pub fn abort(self: &Arc<Self>, endpoint: &str, protocol: Protocol, request_id: &str) {
        let this = self.clone();
        let endpoint = endpoint.to_string();
        let (path, body) = protocol.abort(request_id);
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        // Spawning on a runtime that is shutting down drops the task, and with it the guard.
        let guard = InFlight(self.clone());
        self.runtime.spawn(async move {
            let _guard = guard;
            let sent = match this.channel(&endpoint) {
                Ok(channel) => tokio::time::timeout(ABORT_TIMEOUT, call(channel, path, body))
                    .await
                    .unwrap_or_else(|_| Err(Status::deadline_exceeded("abort timed out"))),
                Err(e) => Err(e),
            };
            let counters = &this.telemetry.counters;
            match sent {
                Ok(()) => Counters::bump(&counters.aborts_sent),
                Err(_) => Counters::bump(&counters.aborts_failed),
            }
        });
    }

    /// Wait until every abort sent so far is answered or timed out, at most `limit`.
    pub async fn wait_idle(&self, limit: Duration) {
        let _ = tokio::time::timeout(limit, async {
            loop {
                let idle = self.idle.notified();
                if self.in_flight.load(Ordering::Acquire) == 0 {
                    return;
                }
                idle.await;
            }
        })
        .await;
    }

    /// The cached channel to `endpoint` (batched requests call engines over it too).
    pub fn channel(&self, endpoint: &str) -> Result<Channel, Status> {
        let mut channels = self.channels.lock().expect("abort channel lock");
        if let Some(channel) = channels.get(endpoint) {
            return Ok(channel.clone());
        }
        if channels.len() >= MAX_CHANNELS {
            channels.clear();
        }
        let channel = Endpoint::from_shared(format!("http://{endpoint}"))
            .map_err(|e| Status::invalid_argument(format!("bad engine endpoint {endpoint}: {e}")))?
            .connect_timeout(ABORT_TIMEOUT)
            .tcp_nodelay(true)
            .connect_lazy();
        channels.insert(endpoint.to_string(), channel.clone());
        Ok(channel)
    }
}

/// Counts an abort in flight until dropped, whether the task ran to the end or was dropped unrun.
struct InFlight(Arc<Aborter>);

impl Drop for InFlight {
    fn drop(&mut self) {
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.0.idle.notify_waiters();
        }
    }
}

async fn call(channel: Channel, path: &'static str, body: Vec<u8>) -> Result<(), Status> {
    let mut client = tonic::client::Grpc::new(channel);
    client
        .ready()
        .await
        .map_err(|e| Status::unavailable(format!("engine not reachable: {e}")))?;
    let mut request = tonic::Request::new(body);
    request.set_timeout(ABORT_TIMEOUT);
    client
        .unary(request, PathAndQuery::from_static(path), EngineCodec)
        .await
        .map(|_| ())
}
