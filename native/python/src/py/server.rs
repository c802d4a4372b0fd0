//! `ExtProcServer`: the native ext_proc gRPC server, as Python starts, stops and watches it.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use pyo3::exceptions::{PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};

use super::PyGateway;
use extproc_core::gateway::Gateway;
use extproc_core::server::{EngineTls, ExtProcServer, ServerConfig, ServerTls, Telemetry};

/// Serves Envoy's ext_proc streams with the gateway's state machine, on its own thread(s).
#[pyclass(name = "ExtProcServer", module = "extproc._native", frozen)]
pub struct PyExtProcServer {
    gateway: Arc<Gateway>,
    config: ServerConfig,
    telemetry: Arc<Telemetry>,
    running: Mutex<Option<ExtProcServer>>,
}

#[pymethods]
impl PyExtProcServer {
    #[new]
    /// `request_workers`: threads processing large request bodies (0: one per CPU). `tls_cert`/`tls_key`
    /// (PEM files): serve the port over TLS, with `tls_client_ca` requiring client certificates it
    /// signed. `engine_tls_ca`: the server's own engine calls over TLS, engines verified against it,
    /// presenting `engine_tls_cert`/`engine_tls_key` if given, `engine_tls_server_name` as SNI.
    /// `responses_store`: where the Responses API stores responses and conversations (`memory`,
    /// `none`, or a backend spec such as `sqlite:PATH`). `module_stop_file`: the file created when the
    /// stop's grace ran out, which tells Envoy's response module to end its answers too.
    #[pyo3(signature = (
        gateway, listen, *, worker_threads = 1, request_workers = 0, summary_capacity = 4096,
        tls_cert = None, tls_key = None, tls_client_ca = None,
        engine_tls_ca = None, engine_tls_cert = None, engine_tls_key = None, engine_tls_server_name = None,
        responses_store = String::from("memory"), module_stop_file = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        gateway: &Bound<'_, PyGateway>,
        listen: String,
        worker_threads: usize,
        request_workers: usize,
        summary_capacity: usize,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
        tls_client_ca: Option<PathBuf>,
        engine_tls_ca: Option<PathBuf>,
        engine_tls_cert: Option<PathBuf>,
        engine_tls_key: Option<PathBuf>,
        engine_tls_server_name: Option<String>,
        responses_store: String,
        module_stop_file: Option<PathBuf>,
    ) -> PyResult<Self> {
        if worker_threads == 0 {
            return Err(PyValueError::new_err("worker_threads must be at least 1"));
        }
        let tls = match (tls_cert, tls_key) {
            (Some(cert), Some(key)) => Some(ServerTls {
                cert,
                key,
                client_ca: tls_client_ca,
            }),
            (None, None) if tls_client_ca.is_none() => None,
            _ => {
                return Err(PyValueError::new_err(
                    "TLS needs both tls_cert and tls_key (tls_client_ca needs them too)",
                ))
            }
        };
        let engine_tls = match engine_tls_ca {
            Some(ca) => {
                if engine_tls_cert.is_some() != engine_tls_key.is_some() {
                    return Err(PyValueError::new_err("engine_tls_cert and engine_tls_key go together"));
                }
                Some(EngineTls {
                    ca,
                    cert: engine_tls_cert,
                    key: engine_tls_key,
                    server_name: engine_tls_server_name,
                })
            }
            None if engine_tls_cert.is_none() && engine_tls_key.is_none() && engine_tls_server_name.is_none() => None,
            None => return Err(PyValueError::new_err("engine TLS settings need engine_tls_ca")),
        };
        Ok(PyExtProcServer {
            gateway: gateway.get().inner.clone(),
            config: ServerConfig {
                listen,
                worker_threads,
                request_workers,
                tls,
                engine_tls,
                responses_store,
                module_stop_file,
            },
            telemetry: Arc::new(Telemetry::new(summary_capacity)),
            running: Mutex::new(None),
        })
    }

    /// Bind and serve; returns the address Envoy should use ("host:port" with the real port, or
    /// "unix:/path"). Raises OSError when the address cannot be bound.
    fn start(&self, py: Python<'_>) -> PyResult<String> {
        let mut running = self.running.lock().expect("server lock");
        if running.as_ref().is_some_and(ExtProcServer::is_running) {
            return Err(PyRuntimeError::new_err("the server is already running"));
        }
        let (gateway, telemetry, config) = (self.gateway.clone(), self.telemetry.clone(), self.config.clone());
        let server = py.detach(move || ExtProcServer::start(gateway, telemetry, &config))?;
        let address = server.address().to_string();
        *running = Some(server);
        Ok(address)
    }

    /// Stop accepting, let open streams finish for up to `grace_s` seconds, then end the rest.
    /// Blocks until the server is down (run it in a thread from async code). Idempotent.
    fn stop(&self, py: Python<'_>, grace_s: f64) -> PyResult<()> {
        let grace = Duration::try_from_secs_f64(grace_s.max(0.0))
            .map_err(|e| PyValueError::new_err(format!("grace_s: {e}")))?;
        let server = self.running.lock().expect("server lock").take();
        if let Some(mut server) = server {
            py.detach(move || server.stop(grace));
        }
        Ok(())
    }

    /// The bound address while running, else None.
    #[getter]
    fn address(&self) -> Option<String> {
        let running = self.running.lock().expect("server lock");
        running.as_ref().map(|s| s.address().to_string())
    }

    /// Counters since the server was created: streams started/finished, aborts sent/failed,
    /// summaries dropped because nobody took them in time.
    fn stats<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let d = PyDict::new(py);
        for (name, value) in self.telemetry.counters.snapshot() {
            d.set_item(name, value)?;
        }
        Ok(d)
    }

    /// The requests finished since the last call (oldest first, at most `summary_capacity`), as dicts:
    /// the stream summary plus `aborted` and `duration_s`.
    fn take_summaries<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyList>> {
        let finished = self.telemetry.take();
        let list = PyList::empty(py);
        for f in finished {
            let d = super::summary_dict(py, f.summary)?;
            d.set_item("aborted", f.aborted)?;
            d.set_item("duration_s", f.duration.as_secs_f64())?;
            list.append(d)?;
        }
        Ok(list)
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyExtProcServer>()
}
