//! The filter's view of one Envoy HTTP stream: safe wrappers over the ABI callbacks, valid only inside the
//! event hook that received the stream pointer.

use std::borrow::Cow;
use std::ffi::c_void;

use crate::abi::{self, body_type, header_type, EnvoyBuffer, ModuleBuffer, ModuleHeader};

pub struct Stream(abi::FilterEnvoyPtr);

impl Stream {
    pub fn new(ptr: *mut c_void) -> Stream {
        Stream(ptr)
    }

    fn header(&self, kind: u32, name: &str) -> Option<Vec<u8>> {
        let mut value = EnvoyBuffer::EMPTY;
        let mut count = 0usize;
        // SAFETY: the pointer is the live filter of this hook; the out-pointers are valid locals.
        let found = unsafe {
            abi::envoy_dynamic_module_callback_http_get_header(
                self.0,
                kind,
                ModuleBuffer::of(name.as_bytes()),
                &mut value,
                0,
                &mut count,
            )
        };
        // SAFETY: Envoy's buffer is valid until the end of the hook; it is copied at once.
        (found && count > 0).then(|| unsafe { value.as_slice() }.to_vec())
    }

    pub fn response_header(&self, name: &str) -> Option<Vec<u8>> {
        self.header(header_type::RESPONSE_HEADERS, name)
    }

    pub fn response_trailer(&self, name: &str) -> Option<Vec<u8>> {
        self.header(header_type::RESPONSE_TRAILERS, name)
    }

    pub fn request_header(&self, name: &str) -> Option<Vec<u8>> {
        self.header(header_type::REQUEST_HEADERS, name)
    }

    fn set(&self, kind: u32, name: &str, value: Option<&str>) {
        let value = value.map_or(ModuleBuffer::NULL, |v| ModuleBuffer::of(v.as_bytes()));
        // SAFETY: live filter pointer; both buffers outlive the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_set_header(self.0, kind, ModuleBuffer::of(name.as_bytes()), value);
        }
    }

    pub fn set_response_header(&self, name: &str, value: &str) {
        self.set(header_type::RESPONSE_HEADERS, name, Some(value));
    }

    pub fn remove_response_header(&self, name: &str) {
        self.set(header_type::RESPONSE_HEADERS, name, None);
    }

    pub fn set_response_trailer(&self, name: &str, value: &str) {
        self.set(header_type::RESPONSE_TRAILERS, name, Some(value));
    }

    pub fn remove_response_trailer(&self, name: &str) {
        self.set(header_type::RESPONSE_TRAILERS, name, None);
    }

    /// The bytes of the current `response_body` event: Envoy's own when they are one slice (a streamed
    /// token's frame nearly always is: no copy per token), else copied together. Borrowed bytes are
    /// Envoy's until the body changes: drop them before `replace_received_body`.
    pub fn received_body(&self) -> Cow<'_, [u8]> {
        // SAFETY: live filter pointer; the vector has room for every chunk Envoy reports; Envoy's slices
        // stay valid while the hook runs and the body is not changed.
        unsafe {
            let n = abi::envoy_dynamic_module_callback_http_get_body_chunks_size(self.0, body_type::RECEIVED_RESPONSE);
            if n == 0 {
                return Cow::Borrowed(&[]);
            }
            // On the stack for the usual few slices: no allocation per token.
            let mut few = [EnvoyBuffer::EMPTY; 4];
            let mut many = Vec::new();
            let chunks: &mut [EnvoyBuffer] = if n <= few.len() {
                &mut few[..n]
            } else {
                many.resize(n, EnvoyBuffer::EMPTY);
                &mut many
            };
            if !abi::envoy_dynamic_module_callback_http_get_body_chunks(
                self.0,
                body_type::RECEIVED_RESPONSE,
                chunks.as_mut_ptr(),
            ) {
                return Cow::Borrowed(&[]);
            }
            if let [only] = &*chunks {
                return Cow::Borrowed(only.as_slice());
            }
            let mut out = Vec::with_capacity(chunks.iter().map(|c| c.length).sum());
            for chunk in chunks.iter() {
                out.extend_from_slice(chunk.as_slice());
            }
            Cow::Owned(out)
        }
    }

    /// Replace the current `response_body` event's bytes with `bytes`.
    pub fn replace_received_body(&self, bytes: &[u8]) {
        // SAFETY: live filter pointer; `bytes` outlives the call (Envoy copies it).
        unsafe {
            let size = abi::envoy_dynamic_module_callback_http_get_body_size(self.0, body_type::RECEIVED_RESPONSE);
            abi::envoy_dynamic_module_callback_http_drain_body(self.0, body_type::RECEIVED_RESPONSE, size);
            if !bytes.is_empty() {
                abi::envoy_dynamic_module_callback_http_append_body(
                    self.0,
                    body_type::RECEIVED_RESPONSE,
                    ModuleBuffer::of(bytes),
                );
            }
        }
    }

    /// Take the bytes this filter left in Envoy's buffer (`BODY_STOP_ITERATION_AND_BUFFER`).
    pub fn take_buffered_body(&self) -> Vec<u8> {
        // SAFETY: live filter pointer; the vector has room for every chunk Envoy reports, and the slices
        // are copied before the buffer is drained.
        unsafe {
            let n = abi::envoy_dynamic_module_callback_http_get_body_chunks_size(self.0, body_type::BUFFERED_RESPONSE);
            if n == 0 {
                return Vec::new();
            }
            let mut chunks = vec![EnvoyBuffer::EMPTY; n];
            if !abi::envoy_dynamic_module_callback_http_get_body_chunks(
                self.0,
                body_type::BUFFERED_RESPONSE,
                chunks.as_mut_ptr(),
            ) {
                return Vec::new();
            }
            let mut out = Vec::with_capacity(chunks.iter().map(|c| c.length).sum());
            for chunk in &chunks {
                out.extend_from_slice(chunk.as_slice());
            }
            abi::envoy_dynamic_module_callback_http_drain_body(self.0, body_type::BUFFERED_RESPONSE, out.len());
            out
        }
    }

    /// Resume the response this filter stopped (from a scheduled wake-up): its buffered bytes go on.
    pub fn continue_response(&self) {
        // SAFETY: a live filter pointer inside its hook.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_continue_encoding(self.0) }
    }

    /// Add body bytes outside a body event (the trailers hook): Envoy sends them before the trailers.
    pub fn add_body(&self, bytes: &[u8]) {
        if bytes.is_empty() {
            return;
        }
        // SAFETY: live filter pointer; Envoy copies the bytes.
        unsafe {
            abi::envoy_dynamic_module_callback_http_append_body(
                self.0,
                body_type::BUFFERED_RESPONSE,
                ModuleBuffer::of(bytes),
            );
        }
    }

    /// A string of the stream's dynamic metadata.
    pub fn metadata_string(&self, namespace: &str, key: &str) -> Option<Vec<u8>> {
        let mut value = EnvoyBuffer::EMPTY;
        // SAFETY: live filter pointer; the value is copied before the hook returns.
        unsafe {
            abi::envoy_dynamic_module_callback_http_get_metadata_string(
                self.0,
                abi::METADATA_DYNAMIC,
                ModuleBuffer::of(namespace.as_bytes()),
                ModuleBuffer::of(key.as_bytes()),
                &mut value,
            )
            .then(|| value.as_slice().to_vec())
        }
    }

    /// Answer the client locally (Envoy's local reply) with `status`, `headers` and `body`.
    pub fn send_response(&self, status: u32, headers: &[(&str, &str)], body: &[u8], details: &str) {
        let headers: Vec<ModuleHeader> = headers.iter().map(|(k, v)| ModuleHeader::of(k, v)).collect();
        // SAFETY: live filter pointer; every buffer outlives the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_send_response(
                self.0,
                status,
                headers.as_ptr(),
                headers.len(),
                ModuleBuffer::of(body),
                ModuleBuffer::of(details.as_bytes()),
            );
        }
    }

    /// A new scheduler of this stream's filter, for `watchdog::Watch` (which deletes it).
    pub fn new_scheduler(&self) -> abi::SchedulerPtr {
        // SAFETY: a live filter pointer inside its hook.
        unsafe { abi::envoy_dynamic_module_callback_http_filter_scheduler_new(self.0) }
    }

    /// Response bytes sent from outside a response event (a scheduled wake-up); `end_stream` ends it.
    pub fn send_data(&self, bytes: &[u8], end_stream: bool) {
        // SAFETY: live filter pointer; Envoy copies the bytes.
        unsafe {
            abi::envoy_dynamic_module_callback_http_send_response_data(self.0, ModuleBuffer::of(bytes), end_stream)
        }
    }

    /// Response trailers sent from outside a response event, ending the stream.
    pub fn send_trailers(&self, trailers: &[(&str, &str)]) {
        let trailers: Vec<ModuleHeader> = trailers.iter().map(|(k, v)| ModuleHeader::of(k, v)).collect();
        // SAFETY: live filter pointer; every buffer outlives the call.
        unsafe {
            abi::envoy_dynamic_module_callback_http_send_response_trailers(self.0, trailers.as_ptr(), trailers.len())
        }
    }
}
