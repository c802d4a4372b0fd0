//! The OpenAI HTTP surface: request parsing and validation, response and SSE building.

pub mod chat_request;
pub mod chat_response;
pub mod fields;
