//! The native ext_proc gRPC server: Envoy's `ExternalProcessor/Process` streams served by tonic on a
//! tokio runtime of its own (its own thread(s), never holding the GIL), each stream driving one
//! `RequestStream`. Python starts and stops it and keeps the control plane; it never sees a request.

mod abort;
mod engine_codec;
mod fanout;
mod listen;
mod service;
mod stats;

#[cfg(test)]
mod tests;

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use tokio::sync::{oneshot, watch};
use tokio_stream::wrappers::UnixListenerStream;
use tonic::transport::server::TcpIncoming;
use tonic::transport::Server;

pub use abort::ABORT_TIMEOUT;
pub use listen::ListenAddr;
pub use service::MAX_MESSAGE_BYTES;
pub use stats::{Counters, Finished, Telemetry};

use abort::Aborter;
use listen::Listener;
use service::Shared;

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

#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// "host:port" (port 0: any free port) or "unix:/path".
    pub listen: String,
    /// Runtime threads serving streams; 1 runs everything on the server's one thread.
    pub worker_threads: usize,
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
        let runtime = build_runtime(config.worker_threads)?;
        let (listener, address) = {
            let _context = runtime.enter();
            Listener::bind(&addr)?
        };
        let (cancel_tx, cancel_rx) = watch::channel(false);
        let shared = Arc::new(Shared {
            gateway,
            aborter: Aborter::new(runtime.handle().clone(), telemetry.clone()),
            telemetry,
            cancel: cancel_rx,
        });
        let (stop_tx, stop_rx) = oneshot::channel();
        let thread = std::thread::Builder::new().name("extproc-grpc".into()).spawn(move || {
            runtime.block_on(serve(listener, shared, stop_rx, cancel_tx));
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

fn http2_server() -> Server {
    Server::builder()
        .http2_keepalive_interval(Some(KEEPALIVE_INTERVAL))
        .http2_keepalive_timeout(Some(KEEPALIVE_TIMEOUT))
        .initial_connection_window_size(CONNECTION_WINDOW)
        .initial_stream_window_size(STREAM_WINDOW)
}

type Serving = Pin<Box<dyn Future<Output = Result<(), tonic::transport::Error>> + Send>>;

async fn serve(
    listener: Listener,
    shared: Arc<Shared>,
    stop: oneshot::Receiver<Duration>,
    cancel: watch::Sender<bool>,
) {
    let aborter = shared.aborter.clone();
    let service = service::server(shared);
    let (grace_tx, grace_rx) = oneshot::channel();
    // Fires on stop (or when the handle is dropped): tonic stops accepting and sends GOAWAY.
    let signal = async move {
        let grace = stop.await.unwrap_or(Duration::ZERO);
        let _ = grace_tx.send(grace);
    };
    let mut socket_file = None;
    let mut serving: Serving = match listener {
        Listener::Tcp(l) => {
            let incoming = TcpIncoming::from(l)
                .with_nodelay(Some(true))
                .with_keepalive(Some(TCP_KEEPALIVE));
            Box::pin(http2_server().serve_with_incoming_shutdown(service, incoming, signal))
        }
        Listener::Unix(l, path) => {
            socket_file = Some(path);
            let incoming = UnixListenerStream::new(l);
            Box::pin(http2_server().serve_with_incoming_shutdown(service, incoming, signal))
        }
    };
    tokio::select! {
        _ = &mut serving => {}
        Ok(grace) = grace_rx => {
            if tokio::time::timeout(grace, &mut serving).await.is_err() {
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
