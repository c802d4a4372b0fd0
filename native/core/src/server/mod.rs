//! The native ext_proc gRPC server: Envoy's `ExternalProcessor/Process` streams served by tonic on a
//! tokio runtime of its own (its own thread(s), never holding the GIL), each stream driving one
//! `RequestStream`. Python starts and stops it and keeps the control plane; it never sees a request.

mod abort;
pub(crate) mod engine_codec;
mod fanout;
mod health;
mod listen;
mod service;
mod stats;
mod tls;
mod workers;

use std::future::Future;
use std::io;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::TcpIncoming;
use tonic::transport::{Server, ServerTlsConfig};

pub use abort::ABORT_TIMEOUT;
pub use listen::ListenAddr;
pub use service::MAX_MESSAGE_BYTES;
pub use stats::{Counters, Finished, Telemetry};
pub use tls::{EngineTls, ServerTls};
pub use workers::pool_size;

use abort::Aborter;
use listen::Listener;
use service::Shared;
use workers::Workers;

use crate::gateway::Gateway;

// HTTP/2 towards Envoy: one long-lived connection per Envoy worker carries every request's stream.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(30);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(10);
const TCP_KEEPALIVE: Duration = Duration::from_secs(60);
/// Many concurrent streams with large request bodies share one connection; hyper's default is 1 MiB.
const CONNECTION_WINDOW: u32 = 16 * 1024 * 1024;
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
/// After the grace period, how long cancelled streams get to send their final status.
const CANCEL_WAIT: Duration = Duration::from_secs(1);
/// After the grace period, how long the response module gets to end its answers (it looks for the stop
/// file every 50 ms), whose streams then finish here with their trailers.
const MODULE_STOP_WAIT: Duration = Duration::from_secs(2);

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// "host:port" (port 0: any free port) or "unix:/path".
    pub listen: String,
    /// Runtime threads serving streams; 1 runs everything on the server's one thread.
    pub worker_threads: usize,
    /// Threads that process large request bodies (parse, template, tokenize) off the runtime's
    /// threads; 0: one per CPU.
    pub request_workers: usize,
    /// The ext_proc port over TLS (mutual with a client CA); None: plaintext.
    pub tls: Option<ServerTls>,
    /// The server's own engine calls (Abort, batched completions) over TLS; None: plaintext.
    pub engine_tls: Option<EngineTls>,
    /// Where the Responses API keeps responses and conversations: `memory`, `none`, or a backend
    /// `responses::store::open` knows (`sqlite:PATH`, `postgres://…`).
    pub responses_store: String,
    /// The response module's stop file (`module_stop_file`): created when the grace ran out, so that
    /// Envoy's module ends the answers it is translating as this server ends its own; None: none.
    pub module_stop_file: Option<PathBuf>,
}

/// A running server; `stop` (or dropping it) shuts it down.
pub struct ExtProcServer {
    address: String,
    stop: Option<oneshot::Sender<Duration>>,
    thread: Option<JoinHandle<()>>,
}

impl ExtProcServer {
    /// Bind and start serving; returns once the socket listens.
    pub fn start(gateway: Arc<Gateway>, telemetry: Arc<Telemetry>, config: &ServerConfig) -> io::Result<Self> {
        let addr = ListenAddr::parse(&config.listen)?;
        // Bad TLS files fail here, before anything listens.
        let tls = config.tls.as_ref().map(ServerTls::config).transpose()?;
        let engine_tls = config.engine_tls.as_ref().map(EngineTls::config).transpose()?;
        let responses_store = match config.responses_store.as_str() {
            "none" => None,
            spec => Some(
                crate::responses::store::open(spec)
                    .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?,
            ),
        };
        let server = http2_server(tls)?;
        let runtime = build_runtime(config.worker_threads)?;
        let (listener, address) = {
            let _context = runtime.enter();
            Listener::bind(&addr)?
        };
        let (cancel_tx, cancel_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            gateway,
            aborter: Aborter::new(runtime.handle().clone(), telemetry.clone(), engine_tls),
            telemetry,
            cancel: cancel_rx,
            workers: Workers::new(pool_size(config.request_workers)),
            responses_store,
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        // A stop file left by an earlier run would end every answer the module translates.
        let stop_file = config.module_stop_file.clone();
        if let Some(path) = &stop_file {
            remove_stale(path)?;
        }
        let thread = std::thread::Builder::new().name("extproc-grpc".into()).spawn(move || {
            runtime.block_on(serve(server, listener, shared, stop_rx, cancel_tx, stop_file));
            runtime.shutdown_timeout(Duration::from_millis(100));
        })?;
        Ok(ExtProcServer {
            address,
            stop: Some(stop_tx),
            thread: Some(thread),
        })
    }

    /// Where clients connect: "host:port" with the bound port, or "unix:/path".
    pub fn address(&self) -> &str {
        &self.address
    }

    /// Stop accepting, let open streams finish for up to `grace`, then end the rest; returns once
    /// the server is down and the aborts it sent are answered (or timed out).
    pub fn stop(&mut self, grace: Duration) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(grace);
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    pub fn is_running(&self) -> bool {
        self.thread.as_ref().is_some_and(|t| !t.is_finished())
    }
}

impl Drop for ExtProcServer {
    fn drop(&mut self) {
        self.stop(Duration::ZERO);
    }
}

fn build_runtime(worker_threads: usize) -> io::Result<tokio::runtime::Runtime> {
    let mut builder = match worker_threads {
        0 => {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "worker_threads must be at least 1",
            ))
        }
        // The cheapest: no work stealing, no cross-thread wake-ups.
        1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
    };
    builder.enable_io().enable_time().thread_name("extproc-grpc").build()
}

fn http2_server(tls: Option<ServerTlsConfig>) -> io::Result<Server> {
    let server = Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .initial_connection_window_size(CONNECTION_WINDOW)
        .initial_stream_window_size(STREAM_WINDOW);
    match tls {
        None => Ok(server),
        // A failed handshake (no or a foreign client certificate) closes that connection only.
        Some(tls) => server
            .tls_config(tls)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("TLS: {e}"))),
    }
}

type Serving = Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

async fn serve(
    server: Server,
    listener: Listener,
    shared: Arc<Shared>,
    stop: oneshot::Receiver<Duration>,
    cancel: watch::Sender<bool>,
    module_stop_file: Option<PathBuf>,
) {
    let aborter = shared.aborter.clone();
    // Health watches end when the stop begins: they must not hold the server up for the grace.
    let (stopping_tx, stopping_rx) = watch::channel(false);
    let service = health::with_health(service::server(shared.clone()), shared.gateway.clone(), stopping_rx);
    let (grace_tx, grace_rx) = oneshot::channel();
    // Fires on stop (or when the handle is dropped): tonic stops accepting and sends GOAWAY.
    let signal = async move {
        let grace = stop.await.unwrap_or(Duration::ZERO);
        let _ = stopping_tx.send(true);
        let _ = grace_tx.send(grace);
    };
    let mut socket_file = None;
    let mut serving: Serving = match listener {
        Listener::Tcp(l) => {
            let incoming = TcpIncoming::from(l)
                .with_nodelay(Some(true))
                .with_keepalive(Some(TCP_KEEPALIVE));
            Box::pin(server.serve_with_incoming_shutdown(service, incoming, signal))
        }
        Listener::Unix(l, path) => {
            socket_file = Some(path);
            let incoming = UnixListenerStream::new(l);
            Box::pin(server.serve_with_incoming_shutdown(service, incoming, signal))
        }
    };
    tokio::select! {
        _ = &mut serving => {}
        Ok(grace) = grace_rx => {
            let mut open = tokio::time::timeout(grace, &mut serving).await.is_err();
            if let (true, Some(path)) = (open, &module_stop_file) {
                // The module's answers end first, the way this server's do (their streams then finish
                // with their trailers); what is still open after that is cancelled.
                if let Err(e) = std::fs::write(path, b"stopping\n") {
                    eprintln!("extproc: cannot create the module's stop file {}: {e}", path.display());
                }
                open = tokio::time::timeout(MODULE_STOP_WAIT, &mut serving).await.is_err();
            }
            if open {
                let _ = cancel.send(true);
                let _ = tokio::time::timeout(CANCEL_WAIT, &mut serving).await;
            }
        }
    }
    drop(serving);
    if let Some(path) = socket_file {
        let _ = std::fs::remove_file(path);
    }
    aborter.wait_idle(ABORT_TIMEOUT + Duration::from_millis(500)).await;
}

/// Remove `path` if it exists (a stop file of an earlier run).
fn remove_stale(path: &Path) -> io::Result<()> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => Err(e),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    // The server over real sockets, with a tonic client standing in for Envoy.

    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use http::uri::PathAndQuery;
    use hyper_util::rt::TokioIo;
    use tokio::runtime::Runtime;
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::ReceiverStream;
    use tonic::transport::{Channel, Endpoint};
    use tonic::{Code, Status, Streaming};
    use tonic_prost::ProstCodec;
    use tower_service::Service;

    use super::*;
    use crate::gateway::Limits;
    use crate::pb::ext_proc::{
        processing_request::Request, processing_response::Response, HeaderMap, HeaderValue, HttpBody, HttpHeaders,
        ProcessingRequest, ProcessingResponse,
    };

    fn gateway() -> Arc<Gateway> {
        Arc::new(Gateway::new(Limits {
            max_body_bytes: 1 << 20,
            max_engine_message: 1 << 20,
            destination_fallbacks: 0,
            max_buffered_output_tokens: crate::gateway::DEFAULT_MAX_BUFFERED_OUTPUT_TOKENS,
            ..Limits::default()
        }))
    }

    fn client_runtime() -> Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap()
    }

    fn start(listen: &str) -> (ExtProcServer, Arc<Telemetry>) {
        start_with_stop_file(listen, None)
    }

    fn start_with_stop_file(
        listen: &str,
        module_stop_file: Option<std::path::PathBuf>,
    ) -> (ExtProcServer, Arc<Telemetry>) {
        let telemetry = Arc::new(Telemetry::new(16));
        let config = ServerConfig {
            listen: listen.into(),
            worker_threads: 1,
            request_workers: 1,
            tls: None,
            engine_tls: None,
            responses_store: "memory".into(),
            module_stop_file,
        };
        (
            ExtProcServer::start(gateway(), telemetry.clone(), &config).unwrap(),
            telemetry,
        )
    }

    async fn connect(address: &str) -> Channel {
        if let Some(path) = address.strip_prefix("unix:") {
            let path = path.to_string();
            Endpoint::from_static("http://localhost")
                .connect_with_connector(UnixConnector(path))
                .await
                .unwrap()
        } else {
            Endpoint::from_shared(format!("http://{address}"))
                .unwrap()
                .connect()
                .await
                .unwrap()
        }
    }

    /// A connector that dials a unix socket.
    #[derive(Clone)]
    struct UnixConnector(String);

    impl Service<http::Uri> for UnixConnector {
        type Response = TokioIo<tokio::net::UnixStream>;
        type Error = std::io::Error;
        type Future = std::pin::Pin<Box<dyn std::future::Future<Output = std::io::Result<Self::Response>> + Send>>;

        fn poll_ready(&mut self, _cx: &mut std::task::Context<'_>) -> std::task::Poll<std::io::Result<()>> {
            std::task::Poll::Ready(Ok(()))
        }

        fn call(&mut self, _uri: http::Uri) -> Self::Future {
            let path = self.0.clone();
            Box::pin(async move { Ok(TokioIo::new(tokio::net::UnixStream::connect(path).await?)) })
        }
    }

    fn request_headers(method: &str, path: &str, end_of_stream: bool) -> ProcessingRequest {
        let header = |key: &str, value: &str| HeaderValue {
            key: key.into(),
            value: String::new(),
            raw_value: value.as_bytes().to_vec(),
        };
        let headers = HeaderMap {
            headers: vec![
                header(":method", method),
                header(":path", path),
                header("x-request-id", "req-1"),
            ],
        };
        ProcessingRequest {
            request: Some(Request::RequestHeaders(HttpHeaders {
                headers: Some(headers),
                end_of_stream,
            })),
            ..Default::default()
        }
    }

    /// Envoy's side of `ExternalProcessor/Process`.
    const PROCESS_PATH: &str = "/envoy.service.ext_proc.v3.ExternalProcessor/Process";

    fn ext_proc_codec() -> ProstCodec<ProcessingRequest, ProcessingResponse> {
        ProstCodec::default()
    }

    /// Opens a Process stream; messages go in through the sender, replies come out of the stream.
    async fn open(
        channel: Channel,
    ) -> (
        mpsc::Sender<ProcessingRequest>,
        Result<Streaming<ProcessingResponse>, Status>,
    ) {
        let (tx, rx) = mpsc::channel(8);
        let mut client = tonic::client::Grpc::new(channel).max_decoding_message_size(MAX_MESSAGE_BYTES);
        client.ready().await.unwrap();
        let replies = client
            .streaming(
                tonic::Request::new(ReceiverStream::new(rx)),
                PathAndQuery::from_static(PROCESS_PATH),
                ext_proc_codec(),
            )
            .await
            .map(tonic::Response::into_inner);
        (tx, replies)
    }

    fn wait_until(what: &str, done: impl Fn() -> bool) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while !done() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn counter(telemetry: &Telemetry, name: &str) -> u64 {
        telemetry
            .counters
            .snapshot()
            .into_iter()
            .find(|(n, _)| *n == name)
            .unwrap()
            .1
    }

    /// GET /v1/models is answered at once, whatever the transport.
    fn models_request_is_answered(listen: &str) {
        let (mut server, telemetry) = start(listen);
        let address = server.address().to_string();
        let rt = client_runtime();
        let (replies, status) = rt.block_on(async {
            let (tx, replies) = open(connect(&address).await).await;
            tx.send(request_headers("GET", "/v1/models", true)).await.unwrap();
            drop(tx);
            let mut replies = replies.unwrap();
            let mut out = Vec::new();
            let status = loop {
                match replies.message().await {
                    Ok(Some(m)) => out.push(m),
                    Ok(None) => break Code::Ok,
                    Err(s) => break s.code(),
                }
            };
            (out, status)
        });
        assert_eq!(status, Code::Ok);
        assert_eq!(replies.len(), 1);
        let Some(Response::ImmediateResponse(answer)) = &replies[0].response else {
            panic!("expected an immediate response, got {:?}", replies[0]);
        };
        assert_eq!(answer.status.as_ref().unwrap().code, 200);
        let body: serde_json::Value = serde_json::from_slice(&answer.body).unwrap();
        assert_eq!(body["object"], "list");
        wait_until("the stream's summary", || counter(&telemetry, "streams_finished") == 1);
        let finished = telemetry.take();
        assert_eq!(finished.len(), 1);
        assert_eq!(finished[0].summary.request_id, "req-1");
        assert_eq!(finished[0].summary.status, 200);
        assert!(!finished[0].aborted);
        assert_eq!(counter(&telemetry, "streams_started"), 1);
        server.stop(Duration::from_secs(1));
    }

    #[test]
    fn serves_over_tcp_with_the_real_port() {
        let (server, _) = start("127.0.0.1:0");
        let port: u16 = server.address().rsplit_once(':').unwrap().1.parse().unwrap();
        assert_ne!(port, 0);
        assert!(server.address().starts_with("127.0.0.1:"));
        drop(server);
        models_request_is_answered("127.0.0.1:0");
    }

    #[test]
    fn serves_over_a_unix_socket_and_removes_it_on_stop() {
        let path = std::env::temp_dir().join(format!("extproc-server-test-{}.sock", std::process::id()));
        let listen = format!("unix:{}", path.display());
        models_request_is_answered(&listen);
        assert!(!path.exists(), "the socket file is removed on stop");
    }

    #[test]
    fn other_methods_are_unimplemented() {
        let (_server, _) = start("127.0.0.1:0");
        let address = _server.address().to_string();
        let rt = client_runtime();
        let code = rt.block_on(async {
            let mut client = tonic::client::Grpc::new(connect(&address).await);
            client.ready().await.unwrap();
            let path = PathAndQuery::from_static("/envoy.service.ext_proc.v3.ExternalProcessor/Nope");
            client
                .unary(
                    tonic::Request::new(ProcessingRequest::default()),
                    path,
                    ext_proc_codec(),
                )
                .await
                .unwrap_err()
                .code()
        });
        assert_eq!(code, Code::Unimplemented);
    }

    #[test]
    fn a_bad_address_fails_to_start() {
        let telemetry = Arc::new(Telemetry::new(0));
        for listen in ["nonsense", "unix:relative.sock", "127.0.0.1:1"] {
            let config = ServerConfig {
                listen: listen.into(),
                worker_threads: 1,
                request_workers: 1,
                tls: None,
                engine_tls: None,
                responses_store: "memory".into(),
                module_stop_file: None,
            };
            // Port 1 needs privileges the tests do not run with; if they do, it binds, and that is fine.
            if listen == "127.0.0.1:1" && std::net::TcpListener::bind(listen).is_ok() {
                continue;
            }
            assert!(
                ExtProcServer::start(gateway(), telemetry.clone(), &config).is_err(),
                "{listen}"
            );
        }
    }

    /// A POST whose body never comes, once the server has started its stream: the stream stays open.
    fn open_waiting_post(
        rt: &Runtime,
        address: &str,
        telemetry: &Telemetry,
    ) -> (mpsc::Sender<ProcessingRequest>, Streaming<ProcessingResponse>) {
        let opened = rt.block_on(async {
            let (tx, replies) = open(connect(address).await).await;
            tx.send(request_headers("POST", "/v1/chat/completions", false))
                .await
                .unwrap();
            (tx, replies.unwrap())
        });
        wait_until("the stream to start", || counter(telemetry, "streams_started") == 1);
        opened
    }

    #[test]
    fn stop_waits_for_open_streams_up_to_the_grace_then_cancels_them() {
        let (mut server, telemetry) = start("127.0.0.1:0");
        let address = server.address().to_string();
        let rt = client_runtime();
        let (tx, mut replies) = open_waiting_post(&rt, &address, &telemetry);
        let outcome = rt.spawn(async move { replies.message().await.map(|m| m.is_some()) });
        let began = Instant::now();
        server.stop(Duration::from_millis(300));
        let took = began.elapsed();
        assert!(
            took >= Duration::from_millis(300),
            "stopped after {took:?}, before the grace ran out"
        );
        assert!(took < Duration::from_secs(3), "stop took {took:?}");
        let status = rt.block_on(outcome).unwrap().unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        assert_eq!(counter(&telemetry, "streams_finished"), 1);
        drop(tx);
        // Nothing listens any more.
        assert!(std::net::TcpStream::connect(&address).is_err());
    }

    #[test]
    fn the_module_stop_file_appears_when_the_grace_ran_out_and_a_stale_one_goes_at_start() {
        let dir = std::env::temp_dir().join(format!("extproc-stop-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("module-stop");
        std::fs::write(&file, b"an earlier run's").unwrap();
        let (mut server, telemetry) = start_with_stop_file("127.0.0.1:0", Some(file.clone()));
        // A stale file would make Envoy's module end every answer at once.
        assert!(!file.exists());
        let address = server.address().to_string();
        let rt = client_runtime();
        let (tx, mut replies) = open_waiting_post(&rt, &address, &telemetry);
        let outcome = rt.spawn(async move { replies.message().await.map(|m| m.is_some()) });
        let began = Instant::now();
        server.stop(Duration::from_millis(200));
        let took = began.elapsed();
        // The file appeared at the end of the grace; the module did not end this stream (no module
        // here), so it was cancelled after the module's wait.
        assert!(file.exists());
        assert!(
            took >= Duration::from_millis(200) + MODULE_STOP_WAIT,
            "stopped after {took:?}"
        );
        let status = rt.block_on(outcome).unwrap().unwrap_err();
        assert_eq!(status.code(), Code::Unavailable);
        drop(tx);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn stop_lets_open_streams_finish_within_the_grace() {
        let (mut server, telemetry) = start("127.0.0.1:0");
        let address = server.address().to_string();
        let rt = client_runtime();
        let (tx, mut replies) = open_waiting_post(&rt, &address, &telemetry);
        let stopping = std::thread::spawn(move || {
            let began = Instant::now();
            server.stop(Duration::from_secs(10));
            began.elapsed()
        });
        std::thread::sleep(Duration::from_millis(200));
        assert!(!stopping.is_finished(), "stop waits for the open stream");
        // The request goes on: its body arrives (for a model nobody serves) and gets its answer.
        let body = ProcessingRequest {
            request: Some(Request::RequestBody(HttpBody {
                body: br#"{"model": "nope", "messages": [{"role": "user", "content": "hi"}]}"#.to_vec(),
                end_of_stream: true,
            })),
            ..Default::default()
        };
        let answer = rt.block_on(async {
            tx.send(body).await.unwrap();
            drop(tx);
            let answer = replies.message().await.unwrap().unwrap();
            assert!(
                replies.message().await.unwrap().is_none(),
                "then the stream ends with OK"
            );
            answer
        });
        let Some(Response::ImmediateResponse(answer)) = answer.response else {
            panic!("expected an immediate response");
        };
        assert_eq!(answer.status.unwrap().code, 404);
        let took = stopping.join().unwrap();
        assert!(
            took < Duration::from_secs(5),
            "stop took {took:?} after the last stream ended"
        );
    }

    /// Past tonic's default 4 MiB: the message still arrives, and the gateway's own body limit answers.
    #[test]
    fn messages_larger_than_tonics_default_limit_are_taken() {
        let (_server, _) = start("127.0.0.1:0");
        let address = _server.address().to_string();
        let rt = client_runtime();
        let body = ProcessingRequest {
            request: Some(Request::RequestBody(HttpBody {
                body: vec![b' '; 5 << 20],
                end_of_stream: true,
            })),
            ..Default::default()
        };
        let answer = rt.block_on(async {
            let (tx, replies) = open(connect(&address).await).await;
            tx.send(request_headers("POST", "/v1/completions", false))
                .await
                .unwrap();
            tx.send(body).await.unwrap();
            replies.unwrap().message().await.unwrap().unwrap()
        });
        let Some(Response::ImmediateResponse(answer)) = answer.response else {
            panic!("expected an immediate response");
        };
        assert_eq!(answer.status.unwrap().code, 413);
    }

    /// A body being tokenized for long (7 MB for /v1/tokenize) holds up neither the runtime's one
    /// thread nor the other streams on the connection: a stream opened after it is answered first.
    #[test]
    fn a_large_body_is_processed_off_the_thread_serving_the_streams() {
        let dir = crate::test_assets::llama3_model_dir("server-busy");
        let limits = Limits {
            max_body_bytes: 16 << 20,
            ..gateway().limits
        };
        let gateway = Arc::new(Gateway::new(limits));
        gateway
            .add_model("m", &dir, None, "round_robin", crate::routing::RouterConfig::default())
            .unwrap();
        let telemetry = Arc::new(Telemetry::new(16));
        let config = ServerConfig {
            listen: "127.0.0.1:0".into(),
            worker_threads: 1,
            request_workers: 1,
            tls: None,
            engine_tls: None,
            responses_store: "memory".into(),
            module_stop_file: None,
        };
        let _server = ExtProcServer::start(gateway, telemetry, &config).unwrap();
        let address = _server.address().to_string();
        let words: String = (0..1_000_000u64)
            .map(|i| format!("w{} ", i * 7919 % 1_000_003))
            .collect();
        let body = serde_json::json!({"model": "m", "prompt": words})
            .to_string()
            .into_bytes();
        let rt = client_runtime();
        let (tokenized_after, models_after) = rt.block_on(async move {
            let channel = connect(&address).await;
            let began = Instant::now();
            let (heavy_tx, heavy) = open(channel.clone()).await;
            heavy_tx
                .send(request_headers("POST", "/v1/tokenize", false))
                .await
                .unwrap();
            heavy_tx
                .send(ProcessingRequest {
                    request: Some(Request::RequestBody(HttpBody {
                        body,
                        end_of_stream: true,
                    })),
                    ..Default::default()
                })
                .await
                .unwrap();
            let heavy = tokio::spawn(async move {
                let answer = heavy.unwrap().message().await.unwrap().unwrap();
                (answer, began.elapsed())
            });
            tokio::time::sleep(Duration::from_millis(50)).await;
            let (light_tx, light) = open(channel).await;
            light_tx.send(request_headers("GET", "/v1/models", true)).await.unwrap();
            let light = light.unwrap().message().await.unwrap().unwrap();
            let models_after = began.elapsed();
            assert!(matches!(light.response, Some(Response::ImmediateResponse(_))));
            let (answer, tokenized_after) = heavy.await.unwrap();
            let Some(Response::ImmediateResponse(answer)) = answer.response else {
                panic!("expected the tokenize answer");
            };
            assert_eq!(answer.status.unwrap().code, 200);
            drop((heavy_tx, light_tx));
            (tokenized_after, models_after)
        });
        assert!(
            models_after < tokenized_after,
            "/v1/models took {models_after:?}, the 7 MB tokenize {tokenized_after:?}"
        );
    }

    #[test]
    fn stop_returns_at_once_without_streams() {
        let (mut server, _) = start("127.0.0.1:0");
        let began = Instant::now();
        server.stop(Duration::from_secs(10));
        assert!(began.elapsed() < Duration::from_secs(1));
        assert!(!server.is_running());
    }
}
