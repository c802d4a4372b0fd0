//! The OpenAI HTTP surface: request parsing and validation, response and SSE building.

pub mod response;
pub mod tokenize;
pub mod request;
pub mod fields;
