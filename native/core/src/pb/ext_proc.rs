//! Envoy `envoy.service.ext_proc.v3` messages and tonic's `ExternalProcessor` server trait
//! (`external_processor_server`), with the `config.core.v3` and `type.v3` types they carry.

pub use super::wire::envoy::config::core::v3::{
    header_value_option, HeaderMap, HeaderValue, HeaderValueOption, Metadata,
};
pub use super::wire::envoy::r#type::v3::{HttpStatus, StatusCode};
pub use super::wire::envoy::service::ext_proc::v3::*;

/// `HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD`.
pub const OVERWRITE_IF_EXISTS_OR_ADD: i32 = header_value_option::HeaderAppendAction::OverwriteIfExistsOrAdd as i32;

impl HeaderMap {
    /// The value of `name` (lower-case), from `raw_value` (what Envoy sends) or `value`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|h| h.key == name).map(|h| {
            if h.raw_value.is_empty() {
                h.value.as_str()
            } else {
                std::str::from_utf8(&h.raw_value).unwrap_or("")
            }
        })
    }
}

impl HeaderMutation {
    pub fn set(&mut self, key: &str, value: &str) -> &mut Self {
        self.set_headers.push(HeaderValueOption {
            header: Some(HeaderValue {
                key: key.to_string(),
                value: String::new(),
                raw_value: value.as_bytes().to_vec(),
            }),
            append_action: OVERWRITE_IF_EXISTS_OR_ADD,
        });
        self
    }
    pub fn remove(&mut self, key: &str) -> &mut Self {
        self.remove_headers.push(key.to_string());
        self
    }
}
