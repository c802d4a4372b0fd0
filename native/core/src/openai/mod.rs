//! The OpenAI HTTP surface: request parsing and validation, response and SSE building.

pub mod fields;
pub mod logprobs;
pub mod request;
pub mod response;
pub mod structured;
pub mod tokenize;
