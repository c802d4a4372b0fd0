//! The event hooks Envoy calls (`envoy_dynamic_module_on_*`), exported with C linkage. Envoy resolves the
//! HTTP filter's hooks by name when a filter config names this module, so every one of them is exported,
//! those the filter has no use for as no-ops. The module pointers Envoy keeps are boxed Rust values.

use std::ffi::{c_char, c_void};

use crate::abi::{status, ConfigEnvoyPtr, EnvoyBuffer, FilterEnvoyPtr};
use crate::filter::{FilterConfig, HttpFilter};
use crate::host::Stream;

/// The ABI version this module was written against: Envoy 1.40's `ENVOY_DYNAMIC_MODULES_ABI_VERSION`.
/// Envoy only logs a warning when it differs; the function signatures are what must match.
static ABI_VERSION: &[u8] = b"v0.2.0\0";

/// A filter as Envoy holds it: a thin pointer to the boxed trait object.
type FilterBox = Box<dyn HttpFilter>;

/// # Safety
/// `ptr` must come from `envoy_dynamic_module_on_http_filter_new` and not be destroyed yet.
unsafe fn filter<'a>(ptr: *const c_void) -> &'a mut FilterBox {
    &mut *(ptr as *mut FilterBox)
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_program_init() -> *const c_char {
    ABI_VERSION.as_ptr() as *const c_char
}

/// # Safety
/// Called by Envoy with buffers valid for the call.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_new(
    _config_envoy: ConfigEnvoyPtr,
    name: EnvoyBuffer,
    config: EnvoyBuffer,
) -> *const c_void {
    match FilterConfig::new(name.as_slice(), config.as_slice()) {
        Ok(c) => Box::into_raw(Box::new(c)) as *const c_void,
        Err(why) => {
            // Envoy only says the config was refused: say why on its stderr.
            eprintln!("extproc_envoy: {why}");
            std::ptr::null()
        }
    }
}

/// # Safety
/// `config` came from `envoy_dynamic_module_on_http_filter_config_new`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_config_destroy(config: *const c_void) {
    drop(Box::from_raw(config as *mut FilterConfig));
}

/// Per-route configs are not used: refused.
#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_new(
    _name: EnvoyBuffer,
    _config: EnvoyBuffer,
) -> *const c_void {
    std::ptr::null()
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_per_route_config_destroy(_config: *const c_void) {}

/// # Safety
/// `config` came from `envoy_dynamic_module_on_http_filter_config_new`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_new(
    config: *const c_void,
    _filter_envoy: FilterEnvoyPtr,
) -> *const c_void {
    let config = &*(config as *const FilterConfig);
    Box::into_raw(Box::new(config.filter())) as *const c_void
}

/// # Safety
/// `module` came from `envoy_dynamic_module_on_http_filter_new`.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_destroy(module: *const c_void) {
    drop(Box::from_raw(module as *mut FilterBox));
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_headers(
    _envoy: FilterEnvoyPtr,
    _module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    status::CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_body(
    _envoy: FilterEnvoyPtr,
    _module: *const c_void,
    _end_of_stream: bool,
) -> u32 {
    status::CONTINUE
}

#[no_mangle]
pub extern "C" fn envoy_dynamic_module_on_http_filter_request_trailers(
    _envoy: FilterEnvoyPtr,
    _module: *const c_void,
) -> u32 {
    status::CONTINUE
}

/// # Safety
/// Envoy's live stream and this module's filter.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_headers(
    envoy: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    filter(module).response_headers(&Stream::new(envoy), end_of_stream)
}

/// # Safety
/// Envoy's live stream and this module's filter.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_body(
    envoy: FilterEnvoyPtr,
    module: *const c_void,
    end_of_stream: bool,
) -> u32 {
    filter(module).response_body(&Stream::new(envoy), end_of_stream)
}

/// # Safety
/// Envoy's live stream and this module's filter.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_response_trailers(
    envoy: FilterEnvoyPtr,
    module: *const c_void,
) -> u32 {
    filter(module).response_trailers(&Stream::new(envoy))
}

/// # Safety
/// Envoy's live stream and this module's filter.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_stream_complete(
    envoy: FilterEnvoyPtr,
    module: *const c_void,
) {
    filter(module).complete(&Stream::new(envoy));
}

/// Local replies go out as Envoy makes them (`Continue`); the filter hears of them.
///
/// # Safety
/// This module's filter.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_local_reply(
    _envoy: FilterEnvoyPtr,
    module: *const c_void,
    _response_code: u32,
    _details: EnvoyBuffer,
    _reset_imminent: bool,
) -> u32 {
    filter(module).local_reply();
    0
}

/// An event the filter scheduled (its inter-token deadline, `watchdog.rs`).
///
/// # Safety
/// Envoy's live stream and this module's filter.
#[no_mangle]
pub unsafe extern "C" fn envoy_dynamic_module_on_http_filter_scheduled(
    envoy: FilterEnvoyPtr,
    module: *const c_void,
    event_id: u64,
) {
    filter(module).scheduled(&Stream::new(envoy), event_id);
}

// Hooks for features the filter does not use (callouts, scheduling, watermarks): no-ops. Their
// arguments are not read, so only their names matter.
macro_rules! unused_hooks {
    ($($name:ident),* $(,)?) => {
        $(
            #[no_mangle]
            pub extern "C" fn $name() {}
        )*
    };
}

unused_hooks!(
    envoy_dynamic_module_on_http_filter_http_callout_done,
    envoy_dynamic_module_on_http_filter_http_stream_headers,
    envoy_dynamic_module_on_http_filter_http_stream_data,
    envoy_dynamic_module_on_http_filter_http_stream_trailers,
    envoy_dynamic_module_on_http_filter_http_stream_complete,
    envoy_dynamic_module_on_http_filter_http_stream_reset,
    envoy_dynamic_module_on_http_filter_downstream_above_write_buffer_high_watermark,
    envoy_dynamic_module_on_http_filter_downstream_below_write_buffer_low_watermark,
    envoy_dynamic_module_on_http_filter_config_scheduled,
    envoy_dynamic_module_on_http_filter_config_http_callout_done,
    envoy_dynamic_module_on_http_filter_config_http_stream_headers,
    envoy_dynamic_module_on_http_filter_config_http_stream_data,
    envoy_dynamic_module_on_http_filter_config_http_stream_trailers,
    envoy_dynamic_module_on_http_filter_config_http_stream_complete,
    envoy_dynamic_module_on_http_filter_config_http_stream_reset,
);
