//! `google.protobuf.Struct` / `Value` (generated from protox's copy of `struct.proto`), as metadata
//! and attributes carry them, with constructors for the shapes the gateway sends.

pub use super::wire::google::protobuf::{value, ListValue, Struct, Value};

impl Value {
    pub fn string(s: impl Into<String>) -> Self {
        Value {
            kind: Some(value::Kind::StringValue(s.into())),
        }
    }
    pub fn structure(s: Struct) -> Self {
        Value {
            kind: Some(value::Kind::StructValue(s)),
        }
    }
    pub fn list(values: Vec<Value>) -> Self {
        Value {
            kind: Some(value::Kind::ListValue(ListValue { values })),
        }
    }
    pub fn as_str(&self) -> Option<&str> {
        match &self.kind {
            Some(value::Kind::StringValue(s)) => Some(s),
            _ => None,
        }
    }
}
