//! What an ended stream adds to the metrics registry (`crate::metrics`): read from the machine's own
//! fields, nothing cloned, once per request.

use std::time::Instant;

use super::http_api::HttpApi;
use super::RequestStream;
use crate::metrics::{self, RequestEnd};

impl RequestStream {
    /// Counts the request in the metrics; `started`: when its first ext_proc message came.
    pub fn record_metrics(&self, started: Instant) {
        let m = metrics::global();
        if !m.enabled() {
            return;
        }
        let s = &self.summary;
        let operation = match self.api {
            Some(HttpApi::ChatCompletions) => Some("chat"),
            Some(HttpApi::Completions) => Some("text_completion"),
            _ => None,
        };
        let mut end = RequestEnd {
            model: &s.model,
            api: if self.api.is_some() { &s.path } else { "" },
            operation,
            status: s.status,
            // A batch's engines are listed in its summary; its counts go without one.
            engine: "",
            failed: !s.error.is_empty(),
            prompt_tokens: s.prompt_tokens,
            cached_tokens: s.cached_tokens,
            completion_tokens: s.completion_tokens,
            duration: started.elapsed(),
            first_token: None,
        };
        if let Some(x) = &self.exchange {
            end.engine = &x.target.address;
            end.prompt_tokens = x.translator.usage.prompt_tokens;
            end.cached_tokens = x.translator.usage.cached_tokens;
            end.completion_tokens = x.translator.usage.completion_tokens;
            if x.translator.stream() {
                end.first_token = self.first_output.map(|t| t.saturating_duration_since(started));
            }
        }
        // The Envoy module translated the answer: its counts came back with the trailers.
        if let Some(o) = &self.module_outcome {
            end.prompt_tokens = o.prompt_tokens;
            end.cached_tokens = o.cached_tokens;
            end.completion_tokens = o.completion_tokens;
        }
        m.request_ended(&end);
    }
}
