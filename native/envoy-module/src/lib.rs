//! extproc's response path as an Envoy dynamic module (issue 17): an HTTP filter Envoy 1.40 loads in
//! process (`envoy.filters.http.dynamic_modules`, module name `extproc_envoy`). Filters, by the
//! filter name of Envoy's config:
//! - `response`: the response path of routed engine calls (`response_filter.rs`), following the plan
//!   extproc leaves in dynamic metadata, with the models of its config (`models.rs`);
//! - `probe`: appends its config's bytes to every response body (proves the module loads and rewrites).
//!
//! `abi.rs` declares the part of Envoy's C ABI the module calls, `hooks.rs` exports the hooks Envoy
//! calls, `host.rs` wraps one stream's callbacks, `filter.rs` maps configs to filters, `watchdog.rs`
//! times streams out.

pub mod abi;
pub mod filter;
pub mod hooks;
pub mod host;
pub mod models;
pub mod probe;
pub mod response_filter;
pub mod watchdog;
