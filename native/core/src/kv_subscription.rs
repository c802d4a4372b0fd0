//! One engine's `SubscribeKvEvents` stream read natively: each `KvEventBatch` goes, as the bytes on the
//! wire, straight to the router (`Router::apply_kv_events`) on a small tokio runtime of its own, so no
//! batch ever reaches Python. The subscription ends, and says why once, when the stream ends or fails or
//! when the router's outcome needs a resync (`EventOutcome::needs_resync`); the caller (Python's
//! subscriber loop) then resets the endpoint and starts a new one after its backoff.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use http::uri::PathAndQuery;
use prost::Message;
use tokio::runtime::Runtime;
use tokio::task::JoinHandle;
use tonic::transport::{ClientTlsConfig, Endpoint};
use tonic::{Code, Status};

use crate::pb::kv_events::SubscribeKvEventsRequest;
use crate::routing::EventOutcome;
use crate::server::engine_codec::EngineCodec;

/// Applies one batch (protobuf bytes) and says what that did.
pub type ApplyBatch = Box<dyn FnMut(&[u8]) -> EventOutcome + Send>;
/// Called once with why the subscription ended: an outcome kind ("gap", "malformed",
/// "unknown_endpoint"), "stream ended", or the gRPC status code's name ("UNAVAILABLE", "UNIMPLEMENTED").
/// Not called when the subscription is cancelled.
pub type OnEnd = Box<dyn FnOnce(String) + Send>;

/// Every subscription of the process shares one runtime thread: batches are small and few per second.
fn runtime() -> &'static Runtime {
    static RUNTIME: OnceLock<Runtime> = OnceLock::new();
    RUNTIME.get_or_init(|| {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("kv-events")
            .enable_all()
            .build()
            .expect("the KV-event runtime starts")
    })
}

/// A running subscription; cancelled when dropped.
pub struct KvSubscription {
    task: JoinHandle<()>,
    batches: Arc<AtomicU64>,
}

impl KvSubscription {
    /// Subscribes from sequence 0 (with load records before the first batch) to `method` (the
    /// protocol's `SubscribeKvEvents` path) of the engine at `address` ("host:port"), over TLS when
    /// `tls` is given. Fails only on a bad address or method.
    pub fn start(
        address: &str,
        method: &str,
        tls: Option<ClientTlsConfig>,
        apply: ApplyBatch,
        on_end: OnEnd,
    ) -> Result<Self, String> {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut endpoint = Endpoint::from_shared(format!("{scheme}://{address}"))
            .map_err(|e| format!("bad engine address {address}: {e}"))?
            .tcp_nodelay(true);
        if let Some(tls) = tls {
            endpoint = endpoint
                .tls_config(tls)
                .map_err(|e| format!("engine TLS for {address}: {e}"))?;
        }
        let path = PathAndQuery::try_from(method).map_err(|e| format!("bad method path {method}: {e}"))?;
        let batches = Arc::new(AtomicU64::new(0));
        let counted = batches.clone();
        let task = runtime().spawn(async move {
            let reason = read(endpoint, path, apply, &counted).await;
            on_end(reason);
        });
        Ok(KvSubscription { task, batches })
    }

    /// Batches received so far.
    pub fn batches(&self) -> u64 {
        self.batches.load(Ordering::Relaxed)
    }

    /// Whether the subscription still reads its stream (not ended, not cancelled).
    pub fn running(&self) -> bool {
        !self.task.is_finished()
    }

    /// Stops reading and drops the stream (the engine sees it cancelled); `on_end` is not called. Idempotent.
    pub fn cancel(&self) {
        self.task.abort();
    }
}

impl Drop for KvSubscription {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads the stream until it needs ending; returns why.
async fn read(endpoint: Endpoint, path: PathAndQuery, mut apply: ApplyBatch, batches: &AtomicU64) -> String {
    let mut client = tonic::client::Grpc::new(endpoint.connect_lazy());
    if let Err(e) = client.ready().await {
        return code_name(Status::unavailable(e.to_string()).code());
    }
    let request = SubscribeKvEventsRequest {
        start_sequence_number: 0,
        load_records_before_first_batch: true,
    };
    let response = client
        .server_streaming(tonic::Request::new(request.encode_to_vec()), path, EngineCodec)
        .await;
    let mut stream = match response {
        Ok(response) => response.into_inner(),
        Err(status) => return code_name(status.code()),
    };
    loop {
        match stream.message().await {
            Ok(Some(batch)) => {
                batches.fetch_add(1, Ordering::Relaxed);
                let outcome = apply(&batch);
                if outcome.needs_resync() {
                    return outcome.kind().to_string();
                }
            }
            Ok(None) => return "stream ended".to_string(),
            Err(status) => return code_name(status.code()),
        }
    }
}

/// The status code's name as gRPC spells it (and Python's `grpc.StatusCode.X.name`).
fn code_name(code: Code) -> String {
    let name = match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    // An engine that streams a fixed list of batches then ends the stream, and subscriptions against it.

    use std::sync::mpsc;
    use std::sync::Mutex;
    use std::time::Duration;

    use bytes::Bytes;
    use tonic::body::Body;
    use tonic::transport::server::TcpIncoming;
    use tonic::transport::Server;
    use tower_service::Service;

    use super::*;
    use crate::pb::kv_events::{KvEventBatch, SUBSCRIBE_KV_EVENTS_PATH};
    use crate::routing::ApplyStats;

    #[derive(Clone)]
    struct Engine {
        batches: Vec<Vec<u8>>,
        requests: Arc<Mutex<Vec<SubscribeKvEventsRequest>>>,
    }

    impl Service<http::Request<Body>> for Engine {
        type Response = http::Response<Body>;
        type Error = std::convert::Infallible;
        type Future = std::pin::Pin<Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<Result<(), Self::Error>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, request: http::Request<Body>) -> Self::Future {
            let engine = self.clone();
            Box::pin(async move {
                if request.uri().path() != SUBSCRIBE_KV_EVENTS_PATH {
                    return Ok(Status::unimplemented("").into_http());
                }
                Ok(tonic::server::Grpc::new(EngineCodec)
                    .server_streaming(engine, request)
                    .await)
            })
        }
    }

    impl tonic::server::ServerStreamingService<Bytes> for Engine {
        type Response = Vec<u8>;
        type ResponseStream = tokio_stream::Iter<std::vec::IntoIter<Result<Vec<u8>, Status>>>;
        type Future = std::future::Ready<Result<tonic::Response<Self::ResponseStream>, Status>>;

        fn call(&mut self, request: tonic::Request<Bytes>) -> Self::Future {
            let decoded = SubscribeKvEventsRequest::decode(request.into_inner()).unwrap();
            self.requests.lock().unwrap().push(decoded);
            let items: Vec<_> = self.batches.iter().cloned().map(Ok).collect();
            std::future::ready(Ok(tonic::Response::new(tokio_stream::iter(items))))
        }
    }

    fn serve(sequences: &[u64]) -> (String, Arc<Mutex<Vec<SubscribeKvEventsRequest>>>) {
        let engine = Engine {
            batches: sequences
                .iter()
                .map(|&sequence_number| {
                    KvEventBatch {
                        sequence_number,
                        ..Default::default()
                    }
                    .encode_to_vec()
                })
                .collect(),
            requests: Arc::default(),
        };
        let requests = engine.requests.clone();
        let listener = runtime()
            .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
            .unwrap();
        let address = listener.local_addr().unwrap().to_string();
        runtime().spawn(Server::builder().serve_with_incoming(engine, TcpIncoming::from(listener)));
        (address, requests)
    }

    /// Subscribes to `method` at `address` with a router stand-in that breaks at sequence 3; returns why
    /// the subscription ended and the sequences it applied.
    fn subscribe(address: &str, method: &str) -> (String, Vec<u64>) {
        let applied = Arc::new(Mutex::new(Vec::new()));
        let seen = applied.clone();
        let apply: ApplyBatch = Box::new(move |bytes| {
            let seq = KvEventBatch::decode(bytes).unwrap().sequence_number;
            seen.lock().unwrap().push(seq);
            if seq == 3 {
                EventOutcome::Gap { expected: 2, got: 3 }
            } else {
                EventOutcome::Applied(ApplyStats::default())
            }
        });
        let (tx, rx) = mpsc::channel();
        let sub = KvSubscription::start(address, method, None, apply, Box::new(move |r| tx.send(r).unwrap())).unwrap();
        let reason = rx.recv_timeout(Duration::from_secs(5)).unwrap();
        let applied = applied.lock().unwrap().clone();
        assert_eq!(sub.batches(), applied.len() as u64);
        (reason, applied)
    }

    #[test]
    fn every_batch_is_applied_until_the_stream_ends() {
        let (address, requests) = serve(&[1, 2]);
        assert_eq!(
            subscribe(&address, SUBSCRIBE_KV_EVENTS_PATH),
            ("stream ended".to_string(), vec![1, 2])
        );
        let requests = requests.lock().unwrap();
        assert_eq!(requests.len(), 1);
        assert_eq!(requests[0].start_sequence_number, 0);
        assert!(requests[0].load_records_before_first_batch);
    }

    #[test]
    fn an_outcome_that_needs_a_resync_stops_reading() {
        let (address, _) = serve(&[1, 3, 4]);
        assert_eq!(
            subscribe(&address, SUBSCRIBE_KV_EVENTS_PATH),
            ("gap".to_string(), vec![1, 3])
        );
    }

    #[test]
    fn failures_are_named_by_their_grpc_code() {
        let (address, _) = serve(&[1]);
        let other = "/sglang.grpc.scheduler.SglangScheduler/SubscribeKvEvents";
        assert_eq!(subscribe(&address, other), ("UNIMPLEMENTED".to_string(), vec![]));
        let closed = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        assert_eq!(subscribe(&closed, other), ("UNAVAILABLE".to_string(), vec![]));
    }

    #[test]
    fn a_bad_address_or_method_is_refused() {
        let start = |address: &str, method: &str| {
            KvSubscription::start(
                address,
                method,
                None,
                Box::new(|_| EventOutcome::LoadOnly),
                Box::new(|_| {}),
            )
            .err()
        };
        assert!(start("bad address", SUBSCRIBE_KV_EVENTS_PATH).is_some());
        assert!(start("127.0.0.1:1", "no path").is_some());
    }
}
