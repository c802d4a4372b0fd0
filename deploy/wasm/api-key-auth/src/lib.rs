//! API-key auth in front of extproc, as a proxy-wasm HTTP filter: a request without a configured key in
//! the key header (`x-api-key` by default) gets a 401 with an OpenAI-style JSON error from Envoy itself,
//! before any later filter (extproc) sees it; a request with one goes on without the key header and
//! tagged with the key's name (`x-api-key-name`, any client value replaced).
//!
//! Configuration (the filter's `configuration`, a JSON string): see `keys::Config`. A configuration that
//! does not parse fails the plugin's start, so Envoy refuses the listener instead of running open.

mod keys;

use std::rc::Rc;

use proxy_wasm::traits::{Context, HttpContext, RootContext};
use proxy_wasm::types::{Action, ContextType, LogLevel};

use keys::Config;

/// The request header naming the key a request was let in with.
const TAG_HEADER: &str = "x-api-key-name";

const REFUSED: &str = r#"{"error": {"message": "a valid API key is required", "type": "authentication_error", "param": null, "code": 401}}"#;

proxy_wasm::main! {{
    proxy_wasm::set_log_level(LogLevel::Info);
    proxy_wasm::set_root_context(|_| -> Box<dyn RootContext> { Box::new(Plugin { config: None }) });
}}

struct Plugin {
    config: Option<Rc<Config>>,
}

impl Context for Plugin {}

impl RootContext for Plugin {
    fn on_configure(&mut self, _size: usize) -> bool {
        let raw = self.get_plugin_configuration().unwrap_or_default();
        match Config::parse(&raw) {
            Ok(config) => {
                log::info!(
                    "api-key-auth: {} keys, header {}",
                    config.keys.len(),
                    config.header
                );
                self.config = Some(Rc::new(config));
                true
            }
            Err(e) => {
                log::error!("api-key-auth: bad configuration: {e}");
                false
            }
        }
    }

    fn create_http_context(&self, _context_id: u32) -> Option<Box<dyn HttpContext>> {
        let config = self.config.clone()?;
        Some(Box::new(Check { config }))
    }

    fn get_type(&self) -> Option<ContextType> {
        Some(ContextType::HttpContext)
    }
}

/// One request's check.
struct Check {
    config: Rc<Config>,
}

impl Context for Check {}

impl HttpContext for Check {
    fn on_http_request_headers(&mut self, _headers: usize, _end_of_stream: bool) -> Action {
        let presented = self.get_http_request_header(&self.config.header);
        let name = presented
            .as_deref()
            .and_then(|key| self.config.name_of(key));
        match name {
            Some(name) => {
                let name = name.to_string();
                // The key goes no further (not to extproc's logs, not to an engine).
                self.set_http_request_header(&self.config.header, None);
                self.set_http_request_header(TAG_HEADER, Some(&name));
                Action::Continue
            }
            None => {
                let headers = vec![
                    ("content-type", "application/json"),
                    ("www-authenticate", "ApiKey"),
                ];
                self.send_http_response(401, headers, Some(REFUSED.as_bytes()));
                Action::Pause
            }
        }
    }
}
