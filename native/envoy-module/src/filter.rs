//! What a filter of this module does on each event of one HTTP stream, and the configs that make them.

use crate::abi::status;
use crate::host::Stream;

/// One HTTP stream's filter. Every hook returns Envoy's filter status (`abi::status`).
pub trait HttpFilter {
    fn response_headers(&mut self, _stream: &Stream, _end_of_stream: bool) -> u32 {
        status::CONTINUE
    }
    fn response_body(&mut self, _stream: &Stream, _end_of_stream: bool) -> u32 {
        status::CONTINUE
    }
    fn response_trailers(&mut self, _stream: &Stream) -> u32 {
        status::CONTINUE
    }
    /// The stream ended, however it ended (before the filter is destroyed).
    fn complete(&mut self, _stream: &Stream) {}
}

/// A filter config of the `extproc_envoy` module, chosen by the filter name of Envoy's config.
pub enum FilterConfig {
    /// `probe`: append the config's bytes to every response body.
    Probe(Vec<u8>),
}

impl FilterConfig {
    pub fn new(name: &[u8], config: &[u8]) -> Option<FilterConfig> {
        match name {
            b"probe" => Some(FilterConfig::Probe(config.to_vec())),
            _ => None,
        }
    }

    pub fn filter(&self) -> Box<dyn HttpFilter> {
        match self {
            FilterConfig::Probe(suffix) => Box::new(crate::probe::Probe { suffix: suffix.clone() }),
        }
    }
}
