//! `EngineLoad`: an engine's load report as Python hands it to the router, one typed value built with
//! keyword arguments (the core's `routing::EngineLoad`, which KV-event load records become too).

use pyo3::prelude::*;

use extproc_core::routing::EngineLoad;

/// An engine's own load report: one data-parallel rank's, or summed over its ranks.
#[pyclass(name = "EngineLoad", module = "extproc._native", frozen, eq)]
#[derive(Clone, Copy, PartialEq)]
pub struct PyEngineLoad {
    pub(crate) inner: EngineLoad,
}

#[pymethods]
impl PyEngineLoad {
    /// `kv_usage` is clamped to [0, 1] (NaN reads 0), as for loads on the KV-event stream.
    #[new]
    #[pyo3(signature = (*, running, waiting, kv_usage, max_running, waiting_uncached_tokens = 0))]
    fn new(running: u32, waiting: u32, kv_usage: f64, max_running: u32, waiting_uncached_tokens: u32) -> Self {
        PyEngineLoad {
            inner: EngineLoad {
                running,
                waiting,
                kv_usage: EngineLoad::usage_fraction(kv_usage),
                max_running,
                waiting_uncached_tokens,
            },
        }
    }

    /// Requests running.
    #[getter]
    fn running(&self) -> u32 {
        self.inner.running
    }

    /// Requests waiting to be admitted.
    #[getter]
    fn waiting(&self) -> u32 {
        self.inner.waiting
    }

    /// KV-cache usage in [0, 1].
    #[getter]
    fn kv_usage(&self) -> f64 {
        self.inner.kv_usage
    }

    /// How many requests the engine runs at once (its admission window); 0 when unknown.
    #[getter]
    fn max_running(&self) -> u32 {
        self.inner.max_running
    }

    /// Prompt tokens of waiting requests not served from the prefix cache: the prefill work queued.
    #[getter]
    fn waiting_uncached_tokens(&self) -> u32 {
        self.inner.waiting_uncached_tokens
    }

    fn __repr__(&self) -> String {
        let l = &self.inner;
        format!(
            "EngineLoad(running={}, waiting={}, kv_usage={:?}, max_running={}, waiting_uncached_tokens={})",
            l.running, l.waiting, l.kv_usage, l.max_running, l.waiting_uncached_tokens
        )
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<PyEngineLoad>()
}
