//! gRPC's health service (`grpc.health.v1.Health`, Check and Watch) beside `ExternalProcessor` on the
//! same listener. The services it knows:
//!
//! - `""` (the server overall) and GIE's `liveness`: SERVING whenever the server answers (its loop
//!   runs; that it answers at all is the check);
//! - GIE's `readiness` and `envoy.service.ext_proc.v3.ExternalProcessor` (the endpoint-picker protocol
//!   gives it readiness's criteria): SERVING when every served model has a ready engine
//!   (`crate::health`).
//!
//! Check of another name is NOT_FOUND; Watch of one answers SERVICE_UNKNOWN (as the protocol says) and
//! keeps watching. Nothing here calls an engine.

use std::convert::Infallible;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::sync::{mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::body::Body;
use tonic::{Request, Response, Status};
use tower_service::Service;

use crate::gateway::Gateway;
use crate::health;
use crate::pb::health::health_check_response::ServingStatus;
use crate::pb::health::health_server::{Health, HealthServer};
use crate::pb::health::{HealthCheckRequest, HealthCheckResponse};

pub const EXT_PROC_SERVICE: &str = "envoy.service.ext_proc.v3.ExternalProcessor";
pub const LIVENESS: &str = "liveness";
pub const READINESS: &str = "readiness";

/// How often a Watch looks for a change (readiness follows the control plane's health checks,
/// which run every few seconds).
const WATCH_INTERVAL: Duration = Duration::from_millis(500);

/// The status of `service`, None for a service this server does not know.
pub fn status(gateway: &Gateway, service: &str) -> Option<ServingStatus> {
    match service {
        "" | LIVENESS => Some(ServingStatus::Serving),
        READINESS | EXT_PROC_SERVICE => Some(match health::readiness(&health::models(gateway)) {
            Ok(()) => ServingStatus::Serving,
            Err(_) => ServingStatus::NotServing,
        }),
        _ => None,
    }
}

pub struct HealthService {
    gateway: Arc<Gateway>,
    /// Turns true when the server begins to stop: open Watch streams end.
    stopping: watch::Receiver<bool>,
}

fn reply(status: ServingStatus) -> HealthCheckResponse {
    HealthCheckResponse { status: status as i32 }
}

#[tonic::async_trait]
impl Health for HealthService {
    async fn check(&self, request: Request<HealthCheckRequest>) -> Result<Response<HealthCheckResponse>, Status> {
        let service = request.into_inner().service;
        match status(&self.gateway, &service) {
            Some(s) => Ok(Response::new(reply(s))),
            None => Err(Status::not_found(format!("unknown service {service:?}"))),
        }
    }

    type WatchStream = ReceiverStream<Result<HealthCheckResponse, Status>>;

    async fn watch(&self, request: Request<HealthCheckRequest>) -> Result<Response<Self::WatchStream>, Status> {
        let service = request.into_inner().service;
        let (tx, rx) = mpsc::channel(1);
        let gateway = self.gateway.clone();
        let mut stopping = self.stopping.clone();
        tokio::spawn(async move {
            let mut last = None;
            loop {
                let now = status(&gateway, &service).unwrap_or(ServingStatus::ServiceUnknown);
                if last != Some(now) {
                    last = Some(now);
                    if tx.send(Ok(reply(now))).await.is_err() {
                        return; // the watcher went away
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(WATCH_INTERVAL) => {}
                    _ = tx.closed() => return,
                    _ = stopping.wait_for(|&s| s) => return,
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }
}

/// The ext_proc service with the health service beside it: requests for `grpc.health.v1.Health`
/// go to the one, everything else to the other.
#[derive(Clone)]
pub struct WithHealth<S> {
    inner: S,
    health: HealthServer<HealthService>,
}

/// `stopping` turns true when the server begins to stop.
pub fn with_health<S>(inner: S, gateway: Arc<Gateway>, stopping: watch::Receiver<bool>) -> WithHealth<S> {
    WithHealth {
        inner,
        health: HealthServer::new(HealthService { gateway, stopping }),
    }
}

const HEALTH_PATH_PREFIX: &str = "/grpc.health.v1.Health/";

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

impl<S> Service<http::Request<Body>> for WithHealth<S>
where
    S: Service<http::Request<Body>, Response = http::Response<Body>, Error = Infallible>,
    S::Future: Send + 'static,
{
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = BoxFuture<Result<http::Response<Body>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        // tonic's generated services are always ready; ask the ext_proc one all the same.
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<Body>) -> Self::Future {
        if request.uri().path().starts_with(HEALTH_PATH_PREFIX) {
            Box::pin(self.health.call(request))
        } else {
            Box::pin(self.inner.call(request))
        }
    }
}

#[cfg(test)]
mod tests {
    // The health service on a running server, with a tonic client.

    use std::time::{Duration, Instant};

    use http::uri::PathAndQuery;
    use tonic::transport::Endpoint;
    use tonic_prost::ProstCodec;

    use super::*;
    use crate::gateway::Limits;
    use crate::server::{ExtProcServer, ServerConfig, Telemetry};

    const CHECK: &str = "/grpc.health.v1.Health/Check";
    const WATCH: &str = "/grpc.health.v1.Health/Watch";

    fn start(gateway: Arc<Gateway>) -> ExtProcServer {
        let config = ServerConfig {
            listen: "127.0.0.1:0".into(),
            worker_threads: 1,
            request_workers: 1,
            tls: None,
            engine_tls: None,
            responses_store: "memory".into(),
            module_stop_file: None,
        };
        ExtProcServer::start(gateway, Arc::new(Telemetry::new(0)), &config).unwrap()
    }

    async fn client(address: &str) -> tonic::client::Grpc<tonic::transport::Channel> {
        let channel = Endpoint::from_shared(format!("http://{address}"))
            .unwrap()
            .connect()
            .await
            .unwrap();
        let mut client = tonic::client::Grpc::new(channel);
        client.ready().await.unwrap();
        client
    }

    fn request(service: &str) -> tonic::Request<HealthCheckRequest> {
        tonic::Request::new(HealthCheckRequest {
            service: service.into(),
        })
    }

    fn codec() -> ProstCodec<HealthCheckRequest, HealthCheckResponse> {
        ProstCodec::default()
    }

    #[test]
    fn check_answers_each_service_and_refuses_unknown_ones() {
        // No model served: alive, not ready.
        let server = start(Arc::new(Gateway::new(Limits::default())));
        let address = server.address().to_string();
        let rt = tokio::runtime::Runtime::new().unwrap();
        rt.block_on(async {
            let mut client = client(&address).await;
            for (service, expected) in [
                ("", ServingStatus::Serving),
                (EXT_PROC_SERVICE, ServingStatus::NotServing),
                (LIVENESS, ServingStatus::Serving),
                (READINESS, ServingStatus::NotServing),
            ] {
                client.ready().await.unwrap();
                let answer = client
                    .unary(request(service), PathAndQuery::from_static(CHECK), codec())
                    .await
                    .unwrap()
                    .into_inner();
                assert_eq!(answer.status, expected as i32, "{service:?}");
            }
            client.ready().await.unwrap();
            let refused = client
                .unary(request("nope"), PathAndQuery::from_static(CHECK), codec())
                .await
                .unwrap_err();
            assert_eq!(refused.code(), tonic::Code::NotFound);
        });
    }

    #[test]
    fn an_open_watch_ends_when_the_server_stops_without_holding_it_for_the_grace() {
        let mut server = start(Arc::new(Gateway::new(Limits::default())));
        let address = server.address().to_string();
        let rt = tokio::runtime::Runtime::new().unwrap();
        let mut answers = rt.block_on(async {
            let mut client = client(&address).await;
            let mut answers = client
                .server_streaming(request("nope"), PathAndQuery::from_static(WATCH), codec())
                .await
                .unwrap()
                .into_inner();
            let first = answers.message().await.unwrap().unwrap();
            assert_eq!(first.status, ServingStatus::ServiceUnknown as i32);
            answers
        });
        let began = Instant::now();
        server.stop(Duration::from_secs(10));
        assert!(
            began.elapsed() < Duration::from_secs(3),
            "stop took {:?}",
            began.elapsed()
        );
        let end = rt.block_on(answers.message());
        assert!(!matches!(end, Ok(Some(_))), "the watch ended: {end:?}");
    }
}
