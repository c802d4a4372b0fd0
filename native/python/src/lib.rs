//! `extproc._native`: the Python binding of the core crate (`extproc-core`). Everything here converts
//! between Python objects and the core's types; the work itself lives in the core, run with the GIL released.

mod py;

use pyo3::prelude::*;

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    py::register(m)
}
