//! OpenAI's string error `code`s for refused requests, one place so every module names a failure alike.

use crate::error::ApiError;

/// The value has the right type but is not allowed (an unknown tool name, a bad enum value).
pub const INVALID_VALUE: &str = "invalid_value";
/// The value has the wrong JSON type.
pub const INVALID_TYPE: &str = "invalid_type";
/// A field that must be present is not.
pub const MISSING: &str = "missing_required_parameter";
/// A field the gateway does not implement, given a value that would change the answer.
pub const UNSUPPORTED_PARAMETER: &str = "unsupported_parameter";
/// A value the gateway does not implement (a modality other than text).
pub const UNSUPPORTED_VALUE: &str = "unsupported_value";
/// Two fields that cannot be given together (two output constraints).
pub const CONFLICT: &str = "conflicting_parameters";

/// A 400 naming `param`, with `code`.
pub fn refuse(param: &str, code: &'static str, message: impl Into<String>) -> ApiError {
    ApiError::invalid_param(param, message).with_code(code)
}
