//! `google.protobuf.Struct` / `Value`: only what metadata needs (nested string maps and string lists).

use std::collections::BTreeMap;

#[derive(Clone, PartialEq, prost::Message)]
pub struct Struct {
    #[prost(btree_map = "string, message", tag = "1")]
    pub fields: BTreeMap<String, Value>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct Value {
    #[prost(oneof = "value::Kind", tags = "3, 5, 6")]
    pub kind: Option<value::Kind>,
}

pub mod value {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Kind {
        #[prost(string, tag = "3")]
        StringValue(String),
        #[prost(message, tag = "5")]
        StructValue(super::Struct),
        #[prost(message, tag = "6")]
        ListValue(super::ListValue),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ListValue {
    #[prost(message, repeated, tag = "1")]
    pub values: Vec<Value>,
}

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
