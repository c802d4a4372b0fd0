//! `KvSubscription`: one engine's `SubscribeKvEvents` stream read natively into a served model's router
//! (`extproc_core::kv_subscription`). Python starts one per subscription and hears back once, through
//! `on_end`, when it needs replacing.

use std::path::PathBuf;

use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::PyGateway;
use extproc_core::kv_subscription::KvSubscription;
use extproc_core::pb::kv_events::SUBSCRIBE_KV_EVENTS_PATH;
use extproc_core::server::EngineTls;

/// A running KV-event subscription of one engine; cancelled by `cancel()` or when collected.
#[pyclass(name = "KvSubscription", module = "extproc._native", frozen)]
pub struct PyKvSubscription {
    inner: KvSubscription,
}

#[pymethods]
impl PyKvSubscription {
    #[new]
    /// Subscribe from sequence 0 to `method` of the engine at `address`, applying each batch to the
    /// router of `model` as `Gateway.apply_kv_events` does. `on_end(reason)` is called once, from a
    /// native thread, when the subscription ends by itself: a resync outcome ("gap", "malformed",
    /// "unknown_endpoint"), "stream ended", or a gRPC status code name. `tls_ca` and the rest: the engine
    /// over TLS (as `ExtProcServer`'s `engine_tls_*`).
    #[pyo3(signature = (
        gateway, model, address, on_end, *, method = SUBSCRIBE_KV_EVENTS_PATH,
        tls_ca = None, tls_cert = None, tls_key = None, tls_server_name = None,
    ))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        gateway: &Bound<'_, PyGateway>,
        model: &str,
        address: String,
        on_end: Py<PyAny>,
        method: &str,
        tls_ca: Option<PathBuf>,
        tls_cert: Option<PathBuf>,
        tls_key: Option<PathBuf>,
        tls_server_name: Option<String>,
    ) -> PyResult<Self> {
        let served = gateway.get().model(model)?;
        let tls = match tls_ca {
            Some(ca) => Some(
                EngineTls {
                    ca,
                    cert: tls_cert,
                    key: tls_key,
                    server_name: tls_server_name,
                }
                .config()?,
            ),
            None if tls_cert.is_none() && tls_key.is_none() && tls_server_name.is_none() => None,
            None => return Err(PyValueError::new_err("engine TLS settings need tls_ca")),
        };
        let engine = address.clone();
        let apply = Box::new(move |batch: &[u8]| served.router.apply_kv_events(&engine, batch).outcome);
        let on_end = Box::new(move |reason: String| {
            Python::attach(|py| {
                if let Err(e) = on_end.call1(py, (reason,)) {
                    e.write_unraisable(py, None);
                }
            })
        });
        let inner = KvSubscription::start(&address, method, tls, apply, on_end).map_err(PyValueError::new_err)?;
        Ok(PyKvSubscription { inner })
    }

    /// Batches received so far.
    #[getter]
    fn batches(&self) -> u64 {
        self.inner.batches()
    }

    /// Still reading its stream: neither ended nor cancelled.
    #[getter]
    fn running(&self) -> bool {
        self.inner.running()
    }

    /// Stop reading and drop the stream; `on_end` is not called. Idempotent.
    fn cancel(&self) {
        self.inner.cancel();
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyKvSubscription>()
}
