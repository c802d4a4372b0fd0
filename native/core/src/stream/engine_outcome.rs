//! How an engine call's HTTP/2 response ends up before the client, decided once for every host of the
//! response side (the ext_proc state machine, `mod.rs`, and the Envoy dynamic module,
//! `native/envoy-module`): the error its response headers or trailers mean, and the last bytes the
//! client gets (the final JSON, the closing SSE events, or the error).

use bytes::Bytes;

use super::response::ResponseTranslator;
use crate::error::ApiError;
use crate::routing::Failure;
use crate::stream::target;

/// What the engine's response headers say when they end the call before any output: the client's error
/// and what it says about the endpoint (`None`: the call goes on to the body).
pub fn headers_error(
    status: &str,
    grpc_status: Option<&str>,
    grpc_message: Option<&str>,
    end_of_stream: bool,
) -> Option<(ApiError, Option<Result<(), Failure>>)> {
    // A gRPC error before any message comes "trailers-only": grpc-status in the headers.
    if let Some(code) = grpc_status.filter(|c| *c != "0") {
        let outcome = target::grpc_outcome(code.parse().unwrap_or(2));
        return Some((grpc_error(code, grpc_message), outcome));
    }
    if status != "200" {
        // Envoy's own reply (a 503 after the connection failed or was reset): the engine is down.
        let error = ApiError::new(502, "bad_gateway", format!("engine answered HTTP {status}"));
        return Some((error, Some(Err(Failure::Down))));
    }
    if end_of_stream {
        let error = ApiError::new(502, "bad_gateway", "engine ended the call without a response");
        return Some((error, None));
    }
    None
}

/// What the engine's trailers say: the client's error if the call failed (or ended with a choice
/// unfinished), and what they say about the endpoint.
pub fn trailers_error(
    grpc_status: Option<&str>,
    grpc_message: Option<&str>,
    translator: &ResponseTranslator,
) -> (Option<ApiError>, Option<Result<(), Failure>>) {
    match grpc_status.unwrap_or("") {
        "0" => (unfinished_error(translator), target::grpc_outcome(0)),
        "" => (
            Some(ApiError::new(
                502,
                "bad_gateway",
                "engine call ended without a gRPC status",
            )),
            None,
        ),
        code => (
            Some(grpc_error(code, grpc_message)),
            target::grpc_outcome(code.parse().unwrap_or(2)),
        ),
    }
}

/// An OK status with an unfinished choice is still a failure the client must hear about.
pub fn unfinished_error(translator: &ResponseTranslator) -> Option<ApiError> {
    if translator.all_finished() {
        None
    } else {
        Some(ApiError::new(
            502,
            "bad_gateway",
            "engine stream ended before the generation finished",
        ))
    }
}

/// A whole (non-streamed) call the gateway made itself (batched prompts, the Responses API): every engine
/// message through the translator, then the choices closed; the unfinished-generation error when the
/// engine's stream ended early.
pub fn translate_whole(translator: &mut ResponseTranslator, messages: Vec<Bytes>) -> Result<(), ApiError> {
    let mut ignored = Vec::new();
    for message in messages {
        translator.push_message(&message, &mut ignored)?;
    }
    if let Some(error) = unfinished_error(translator) {
        return Err(error);
    }
    translator.close_choices();
    Ok(())
}

/// The client's last bytes, and the headers still owed (status, content type) when none went out yet.
pub struct Ending {
    pub headers: Option<(u16, &'static str)>,
    /// The status the request ends with (200 once a stream's headers went out, whatever followed).
    pub status: u16,
    pub body: Vec<u8>,
}

/// The end of the exchange: `error` is how it failed, if it did; `headers_sent` whether the client
/// already has its headers (a stream's 200).
pub fn ending(translator: &mut ResponseTranslator, error: Option<&ApiError>, headers_sent: bool) -> Ending {
    match (error, headers_sent) {
        (None, sent) => {
            let content_type = if translator.stream() {
                "text/event-stream"
            } else {
                "application/json"
            };
            Ending {
                headers: (!sent).then_some((200, content_type)),
                status: 200,
                body: translator.finish(),
            }
        }
        (Some(e), false) => Ending {
            headers: Some((e.status, "application/json")),
            status: e.status,
            body: e.to_json(),
        },
        (Some(e), true) => Ending {
            headers: None,
            status: 200,
            body: translator.fail_stream(e),
        },
    }
}

fn grpc_error(code: &str, message: Option<&str>) -> ApiError {
    let message = message.map(percent_decode).unwrap_or_default();
    ApiError::from_grpc(code.parse().unwrap_or(2), &message)
}

/// `grpc-message` is percent-encoded.
pub fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).unwrap_or("");
            if let Ok(b) = u8::from_str_radix(hex, 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grpc_messages_are_percent_decoded() {
        assert_eq!(percent_decode("prompt%20too%20long"), "prompt too long");
        assert_eq!(percent_decode("100%"), "100%");
        assert_eq!(percent_decode("%e2%9c%93"), "✓");
    }

    #[test]
    fn trailers_only_errors_and_non_200_statuses_end_the_call_at_the_headers() {
        let (e, outcome) = headers_error("200", Some("3"), Some("bad%20prompt"), true).unwrap();
        assert_eq!((e.status, e.message.as_str()), (400, "engine error: bad prompt"));
        assert_eq!(outcome, Some(Ok(())));
        let (e, outcome) = headers_error("503", None, None, false).unwrap();
        assert_eq!(e.status, 502);
        assert_eq!(outcome, Some(Err(Failure::Down)));
        assert!(headers_error("200", Some("0"), None, false).is_none());
        assert!(headers_error("200", None, None, false).is_none());
    }
}
