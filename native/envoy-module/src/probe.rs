//! The probe filter: appends the bytes of its config to every response body. It proves that Envoy loads
//! the module and that the module can rewrite a body (tests/integration/test_envoy_module.py).

use crate::abi::status;
use crate::filter::HttpFilter;
use crate::host::Stream;

pub struct Probe {
    pub suffix: Vec<u8>,
}

impl HttpFilter for Probe {
    fn response_headers(&mut self, stream: &Stream, _end_of_stream: bool) -> u32 {
        // The body changes size.
        stream.remove_response_header("content-length");
        status::CONTINUE
    }

    fn response_body(&mut self, stream: &Stream, end_of_stream: bool) -> u32 {
        if end_of_stream {
            let mut body = stream.received_body().into_owned();
            body.extend_from_slice(&self.suffix);
            stream.replace_received_body(&body);
        }
        status::CONTINUE
    }

    fn response_trailers(&mut self, stream: &Stream) -> u32 {
        stream.add_body(&self.suffix);
        status::CONTINUE
    }
}
