//! The part of Envoy's dynamic-module C ABI (Envoy 1.40, `source/extensions/dynamic_modules/abi/abi.h`)
//! this module uses, declared by hand: the types, and the callbacks Envoy's binary exports that the
//! filter calls. The event hooks Envoy calls are in `hooks.rs`.
//!
//! x86-64 SysV passes a `{pointer, length}` struct by value in two integer registers, exactly like two
//! separate arguments, so the buffer structs below match both spellings the header has used.

use std::ffi::c_void;

/// `envoy_dynamic_module_type_http_filter_envoy_ptr`: Envoy's `DynamicModuleHttpFilter`.
pub type FilterEnvoyPtr = *mut c_void;
/// `envoy_dynamic_module_type_http_filter_scheduler_module_ptr`: a filter's scheduler, which may be
/// committed from any thread and delivers `envoy_dynamic_module_on_http_filter_scheduled` on the
/// filter's worker thread (dropped if the filter is gone by then).
pub type SchedulerPtr = *mut c_void;
/// `envoy_dynamic_module_type_http_filter_config_envoy_ptr`.
pub type ConfigEnvoyPtr = *mut c_void;

/// Bytes owned by Envoy, valid until the end of the current event hook.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct EnvoyBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl EnvoyBuffer {
    pub const EMPTY: EnvoyBuffer = EnvoyBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };

    /// # Safety
    /// `ptr` must point at `length` readable bytes for the lifetime the caller picks.
    pub unsafe fn as_slice<'a>(&self) -> &'a [u8] {
        if self.ptr.is_null() || self.length == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(self.ptr, self.length)
        }
    }
}

/// Bytes owned by the module, read by Envoy during the call.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ModuleBuffer {
    pub ptr: *const u8,
    pub length: usize,
}

impl ModuleBuffer {
    pub fn of(bytes: &[u8]) -> ModuleBuffer {
        ModuleBuffer {
            ptr: bytes.as_ptr(),
            length: bytes.len(),
        }
    }

    /// A null buffer: for `set_header`, removes the header.
    pub const NULL: ModuleBuffer = ModuleBuffer {
        ptr: std::ptr::null(),
        length: 0,
    };
}

/// A header the module owns (`envoy_dynamic_module_type_module_http_header`).
#[repr(C)]
pub struct ModuleHeader {
    pub key_ptr: *const u8,
    pub key_length: usize,
    pub value_ptr: *const u8,
    pub value_length: usize,
}

impl ModuleHeader {
    pub fn of(key: &str, value: &str) -> ModuleHeader {
        ModuleHeader {
            key_ptr: key.as_ptr(),
            key_length: key.len(),
            value_ptr: value.as_ptr(),
            value_length: value.len(),
        }
    }
}

/// `envoy_dynamic_module_type_http_header_type`.
pub mod header_type {
    pub const REQUEST_HEADERS: u32 = 0;
    pub const RESPONSE_HEADERS: u32 = 2;
    pub const RESPONSE_TRAILERS: u32 = 3;
}

/// `envoy_dynamic_module_type_http_body_type`.
pub mod body_type {
    /// The chunk of the current `response_body` event.
    pub const RECEIVED_RESPONSE: u32 = 2;
    /// Envoy's buffered response body; appending to it outside a body event adds encoded data.
    pub const BUFFERED_RESPONSE: u32 = 3;
}

/// `envoy_dynamic_module_type_metadata_source_Dynamic`: the stream's dynamic metadata.
pub const METADATA_DYNAMIC: u32 = 0;

/// Filter statuses (`FilterHeadersStatus`, `FilterDataStatus`, `FilterTrailersStatus`).
pub mod status {
    pub const CONTINUE: u32 = 0;
    pub const HEADERS_STOP_ITERATION: u32 = 1;
    /// Envoy keeps the (replaced) received bytes in the filter's buffer, sent with the next `CONTINUE`
    /// or on `continue_encoding`.
    pub const BODY_STOP_ITERATION_AND_BUFFER: u32 = 1;
    pub const BODY_STOP_ITERATION_NO_BUFFER: u32 = 3;
}

extern "C" {
    pub fn envoy_dynamic_module_callback_http_get_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
        index: usize,
        optional_size: *mut usize,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_set_header(
        filter: FilterEnvoyPtr,
        header_type: u32,
        key: ModuleBuffer,
        value: ModuleBuffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_send_response(
        filter: FilterEnvoyPtr,
        status_code: u32,
        headers: *const ModuleHeader,
        headers_size: usize,
        body: ModuleBuffer,
        details: ModuleBuffer,
    );

    pub fn envoy_dynamic_module_callback_http_get_body_chunks_size(filter: FilterEnvoyPtr, body_type: u32) -> usize;

    pub fn envoy_dynamic_module_callback_http_get_body_chunks(
        filter: FilterEnvoyPtr,
        body_type: u32,
        result: *mut EnvoyBuffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_get_body_size(filter: FilterEnvoyPtr, body_type: u32) -> usize;

    pub fn envoy_dynamic_module_callback_http_append_body(
        filter: FilterEnvoyPtr,
        body_type: u32,
        data: ModuleBuffer,
    ) -> bool;

    pub fn envoy_dynamic_module_callback_http_drain_body(filter: FilterEnvoyPtr, body_type: u32, bytes: usize) -> bool;

    pub fn envoy_dynamic_module_callback_http_filter_scheduler_new(filter: FilterEnvoyPtr) -> SchedulerPtr;

    pub fn envoy_dynamic_module_callback_http_filter_scheduler_commit(scheduler: SchedulerPtr, event_id: u64);

    pub fn envoy_dynamic_module_callback_http_filter_scheduler_delete(scheduler: SchedulerPtr);

    /// Resume the response where this filter stopped it: its buffered bytes go on down the chain.
    pub fn envoy_dynamic_module_callback_http_filter_continue_encoding(filter: FilterEnvoyPtr);

    /// Response bytes from outside an encoder event (`decoder_callbacks->encodeData`): they go through
    /// the whole encoder chain, this filter first.
    pub fn envoy_dynamic_module_callback_http_send_response_data(
        filter: FilterEnvoyPtr,
        data: ModuleBuffer,
        end_stream: bool,
    );

    /// Response trailers from outside an encoder event, ending the stream (through the encoder chain).
    pub fn envoy_dynamic_module_callback_http_send_response_trailers(
        filter: FilterEnvoyPtr,
        trailers: *const ModuleHeader,
        trailers_size: usize,
    );

    pub fn envoy_dynamic_module_callback_http_get_metadata_string(
        filter: FilterEnvoyPtr,
        source: u32,
        namespace: ModuleBuffer,
        key: ModuleBuffer,
        result: *mut EnvoyBuffer,
    ) -> bool;
}
