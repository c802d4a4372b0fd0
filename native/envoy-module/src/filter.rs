//! What a filter of this module does on each event of one HTTP stream, and the configs that make them.

use std::sync::Arc;

use crate::abi::status;
use crate::host::Stream;
use crate::models::ResponseConfig;

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
    /// Envoy is about to send a local reply (its own, or one the filter asked for) through the filters.
    fn local_reply(&mut self) {}
    /// An event the filter scheduled (`watchdog.rs`) arrived on its worker thread.
    fn scheduled(&mut self, _stream: &Stream, _event_id: u64) {}
    /// The stream ended, however it ended (before the filter is destroyed).
    fn complete(&mut self, _stream: &Stream) {}
}

/// A filter config of the `extproc_envoy` module, chosen by the filter name of Envoy's config.
pub enum FilterConfig {
    /// `probe`: append the config's bytes to every response body.
    Probe(Vec<u8>),
    /// `response`: the engine response to the client's OpenAI answer (`response_filter.rs`); the config
    /// names the served models' directories and the stream flush window (`models.rs`).
    Response(Arc<ResponseConfig>),
}

impl FilterConfig {
    /// The config of filter `name`; an error Envoy reports (the filter config is refused) when it is
    /// unknown or its config is bad.
    pub fn new(name: &[u8], config: &[u8]) -> Result<FilterConfig, String> {
        match name {
            b"probe" => Ok(FilterConfig::Probe(config.to_vec())),
            b"response" => Ok(FilterConfig::Response(Arc::new(ResponseConfig::from_json(config)?))),
            other => Err(format!("unknown filter '{}'", String::from_utf8_lossy(other))),
        }
    }

    pub fn filter(&self) -> Box<dyn HttpFilter> {
        match self {
            FilterConfig::Probe(suffix) => Box::new(crate::probe::Probe { suffix: suffix.clone() }),
            FilterConfig::Response(config) => Box::new(crate::response_filter::ResponseFilter::new(config.clone())),
        }
    }
}
