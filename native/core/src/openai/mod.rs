//! The OpenAI HTTP surface: request parsing and validation, response and SSE building.

pub mod codes;
pub mod fields;
pub mod logprobs;
pub mod request;
pub mod response;
pub mod schema;
pub mod structured;
pub mod tokenize;
pub mod tools;
pub mod unsupported;
