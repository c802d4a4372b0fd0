//! Telling an engine to stop a request whose client went away: the engine protocol's `Abort` RPC, sent
//! from the runtime without waiting for it, over one lazily connected channel per engine endpoint.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::uri::PathAndQuery;
use tokio::runtime::Handle;
use tokio::sync::Notify;
use tonic::transport::{Channel, ClientTlsConfig, Endpoint};
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
    // Engines over TLS (https, verified against its CA); None: plaintext h2c.
    tls: Option<ClientTlsConfig>,
    in_flight: AtomicUsize,
    idle: Notify,
}

impl Aborter {
    pub fn new(runtime: Handle, telemetry: Arc<Telemetry>, tls: Option<ClientTlsConfig>) -> Arc<Self> {
        Arc::new(Aborter {
            runtime,
            telemetry,
            channels: Mutex::new(HashMap::new()),
            tls,
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
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        let mut builder = Endpoint::from_shared(format!("{scheme}://{endpoint}"))
            .map_err(|e| Status::invalid_argument(format!("bad engine endpoint {endpoint}: {e}")))?
            .connect_timeout(ABORT_TIMEOUT)
            .tcp_nodelay(true);
        if let Some(tls) = &self.tls {
            builder = builder
                .tls_config(tls.clone())
                .map_err(|e| Status::invalid_argument(format!("engine TLS for {endpoint}: {e}")))?;
        }
        let channel = builder.connect_lazy();
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

#[cfg(test)]
mod tests {
    // An engine that answers `Abort` only, and the aborter against it and against a closed port.

    use std::sync::{Arc, Mutex};
    use std::time::Duration;

    use bytes::Bytes;
    use prost::Message;
    use tonic::body::Body;
    use tonic::transport::server::TcpIncoming;
    use tonic::transport::Server;
    use tonic::Status;
    use tower_service::Service;

    use super::super::engine_codec::EngineCodec;
    use super::super::stats::Telemetry;
    use super::*;
    use crate::engine::Protocol;
    use crate::pb::{sglang, vllm};

    fn counter(telemetry: &Telemetry, name: &str) -> u64 {
        let counters = telemetry.counters.snapshot();
        counters.into_iter().find(|(n, _)| *n == name).unwrap().1
    }

    /// An engine that only answers `Abort` (of either protocol), remembering "protocol:request id".
    #[derive(Clone, Default)]
    struct AbortEngine {
        aborted: Arc<Mutex<Vec<String>>>,
    }

    impl Service<http::Request<Body>> for AbortEngine {
        type Response = http::Response<Body>;
        type Error = std::convert::Infallible;
        type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<Body>) -> Self::Future {
            let aborted = self.aborted.clone();
            Box::pin(async move {
                let protocol = match request.uri().path() {
                    vllm::ABORT_PATH => Protocol::Vllm,
                    sglang::ABORT_PATH => Protocol::Sglang,
                    _ => return Ok(Status::unimplemented("").into_http()),
                };
                let handler = AbortHandler(aborted, protocol);
                Ok(tonic::server::Grpc::new(EngineCodec).unary(handler, request).await)
            })
        }
    }

    struct AbortHandler(Arc<Mutex<Vec<String>>>, Protocol);

    impl Service<tonic::Request<Bytes>> for AbortHandler {
        type Response = tonic::Response<Vec<u8>>;
        type Error = Status;
        type Future = std::future::Ready<Result<Self::Response, Status>>;

        fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Status>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
            let body = request.into_inner();
            let ids = match self.1 {
                Protocol::Vllm => vllm::AbortRequest::decode(body).unwrap().request_ids,
                Protocol::Sglang => vec![sglang::AbortRequest::decode(body).unwrap().request_id],
            };
            let protocol = self.1;
            self.0
                .lock()
                .unwrap()
                .extend(ids.into_iter().map(|id| format!("{protocol}:{id}")));
            std::future::ready(Ok(tonic::Response::new(Vec::new())))
        }
    }

    #[test]
    fn aborts_reach_the_engine_and_failures_are_counted() {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let engine = AbortEngine::default();
        let listener = rt.block_on(tokio::net::TcpListener::bind("127.0.0.1:0")).unwrap();
        let endpoint = listener.local_addr().unwrap().to_string();
        let incoming = TcpIncoming::from(listener);
        rt.spawn(Server::builder().serve_with_incoming(engine.clone(), incoming));
        // A port nothing listens on.
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();

        let telemetry = Arc::new(Telemetry::new(0));
        let aborter = Aborter::new(rt.handle().clone(), telemetry.clone(), None);
        aborter.abort(&endpoint, Protocol::Vllm, "req-7");
        aborter.abort(&endpoint, Protocol::Sglang, "req-8");
        aborter.abort(&closed, Protocol::Vllm, "req-9");
        rt.block_on(aborter.wait_idle(Duration::from_secs(5)));
        let mut seen = engine.aborted.lock().unwrap().clone();
        seen.sort();
        assert_eq!(seen, ["sglang:req-8", "vllm:req-7"]);
        assert_eq!(counter(&telemetry, "aborts_sent"), 2);
        assert_eq!(counter(&telemetry, "aborts_failed"), 1);
    }
}
