//! Module attributes of `extproc._native` that Python must agree on with the core: the header and
//! metadata names of `extproc_core::contracts` (the Envoy bootstrap configures Envoy with them) and the
//! routing registry's policy names and default (the settings offer exactly these).

use pyo3::prelude::*;
use pyo3::types::PyTuple;

use extproc_core::contracts;
use extproc_core::routing::policy::registry;

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let names = [
        ("DESTINATION_HEADER", contracts::DESTINATION_HEADER),
        ("LB_METADATA_NAMESPACE", contracts::LB_METADATA_NAMESPACE),
        ("SERVED_ENDPOINT_KEY", contracts::SERVED_ENDPOINT_KEY),
        ("SUBSET_HINT_NAMESPACE", contracts::SUBSET_HINT_NAMESPACE),
        ("SUBSET_HINT_KEY", contracts::SUBSET_HINT_KEY),
        ("UPSTREAM_ADDRESS_ATTRIBUTE", contracts::UPSTREAM_ADDRESS_ATTRIBUTE),
        ("MAX_RETRIES_HEADER", contracts::MAX_RETRIES_HEADER),
        ("OBJECTIVE_HEADER", contracts::OBJECTIVE_HEADER),
        ("SESSION_HEADER", contracts::SESSION_HEADER),
        ("REQUEST_ID_HEADER", contracts::REQUEST_ID_HEADER),
        ("AUTHORIZATION_HEADER", contracts::AUTHORIZATION_HEADER),
        ("RESPONSE_PLAN_NAMESPACE", contracts::RESPONSE_PLAN_NAMESPACE),
        ("RESPONSE_PLAN_KEY", contracts::RESPONSE_PLAN_KEY),
        ("OUTCOME_TRAILER", contracts::OUTCOME_TRAILER),
        ("RESPONSE_PATH_METADATA", contracts::RESPONSE_PATH_METADATA),
        ("RESPONSE_PATH_MODULE", contracts::RESPONSE_PATH_MODULE),
        ("DEFAULT_ROUTING_POLICY", registry::DEFAULT_POLICY),
    ];
    for (name, value) in names {
        m.add(name, value)?;
    }
    let py = m.py();
    m.add(
        "CLIENT_HEADERS_REMOVED",
        PyTuple::new(py, contracts::CLIENT_HEADERS_REMOVED)?,
    )?;
    m.add(
        "ENGINE_REQUEST_HEADERS",
        PyTuple::new(py, contracts::ENGINE_REQUEST_HEADERS)?,
    )?;
    m.add("ROUTING_POLICIES", PyTuple::new(py, registry::policy_names())?)?;
    Ok(())
}
