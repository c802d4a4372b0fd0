//! extproc's native core: everything per byte or per token on the gateway's data path.

pub mod detokenize;
pub mod engine;
pub mod error;
pub mod gateway;
pub mod grpc_frame;
pub mod model;
pub mod openai;
pub mod pb;
mod py;
pub mod routing;
pub mod server;
pub mod stop;
pub mod stream;
pub mod template;
pub mod tokenize;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    py::register(m)
}
