//! The one error type of the data plane and its OpenAI-style JSON form.

use serde_json::json;

/// An error answered to the client: HTTP status plus the OpenAI error object
/// `{"error": {"message", "type", "param", "code"}}`.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    pub status: u16,
    pub message: String,
    pub kind: &'static str,
    pub param: Option<String>,
    /// OpenAI's string `code` (e.g. `invalid_api_key`) where one applies; else `code` is the status.
    pub code: Option<&'static str>,
    /// Seconds the client should wait before retrying: a `retry-after` header on the answer.
    pub retry_after_s: Option<u64>,
}

impl ApiError {
    pub fn new(status: u16, kind: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            kind,
            param: None,
            code: None,
            retry_after_s: None,
        }
    }
    /// 400 invalid_request_error.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(400, "invalid_request_error", message)
    }
    /// 400 invalid_request_error naming the offending parameter.
    pub fn invalid_param(param: &str, message: impl Into<String>) -> Self {
        ApiError {
            param: Some(param.to_string()),
            ..Self::invalid(message)
        }
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(404, "not_found_error", message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "service_unavailable", message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "internal_error", message)
    }

    /// The same error with OpenAI's string `code`.
    pub fn with_code(self, code: &'static str) -> Self {
        ApiError {
            code: Some(code),
            ..self
        }
    }

    pub fn to_value(&self) -> serde_json::Value {
        let code = match self.code {
            Some(code) => json!(code),
            None => json!(self.status),
        };
        json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": code,
            }
        })
    }

    pub fn to_json(&self) -> Vec<u8> {
        serde_json::to_vec(&self.to_value()).expect("error JSON serializes")
    }

    /// The error for a failed engine call, from its gRPC status code and message.
    pub fn from_grpc(code: u32, message: &str) -> Self {
        let (status, kind) = match code {
            3 | 9 | 11 => (400, "invalid_request_error"), // INVALID_ARGUMENT, FAILED_PRECONDITION, OUT_OF_RANGE
            5 => (404, "not_found_error"),
            7 => (403, "permission_error"),
            8 => (429, "rate_limit_error"), // RESOURCE_EXHAUSTED
            12 => (501, "not_implemented"),
            14 => (503, "service_unavailable"), // UNAVAILABLE
            4 => (504, "timeout"),              // DEADLINE_EXCEEDED
            16 => (401, "authentication_error"),
            _ => (500, "internal_error"),
        };
        let message = if message.is_empty() {
            format!("engine error (gRPC status {code})")
        } else {
            format!("engine error: {message}")
        };
        ApiError::new(status, kind, message)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn json_shape_is_openai_style() {
        let v = ApiError::invalid_param("messages", "missing").to_value();
        assert_eq!(v["error"]["param"], "messages");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["code"], 400);
        assert!(ApiError::invalid("x").to_value()["error"]["param"].is_null());
        let named = ApiError::new(401, "invalid_request_error", "no key").with_code("invalid_api_key");
        assert_eq!(named.to_value()["error"]["code"], "invalid_api_key");
    }

    #[test]
    fn grpc_codes_map_to_fitting_statuses() {
        assert_eq!(ApiError::from_grpc(3, "bad").status, 400);
        assert_eq!(ApiError::from_grpc(8, "").status, 429);
        assert_eq!(ApiError::from_grpc(14, "").status, 503);
        assert_eq!(ApiError::from_grpc(13, "boom").status, 500);
        assert_eq!(ApiError::from_grpc(13, "boom").message, "engine error: boom");
    }
}
