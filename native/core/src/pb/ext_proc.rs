//! Envoy `envoy.service.ext_proc.v3` messages (and the `config.core.v3` header types they carry).

use super::structs::Struct;

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValue {
    #[prost(string, tag = "1")]
    pub key: String,
    #[prost(string, tag = "2")]
    pub value: String,
    #[prost(bytes = "vec", tag = "3")]
    pub raw_value: Vec<u8>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderMap {
    #[prost(message, repeated, tag = "1")]
    pub headers: Vec<HeaderValue>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpHeaders {
    #[prost(message, optional, tag = "1")]
    pub headers: Option<HeaderMap>,
    #[prost(bool, tag = "3")]
    pub end_of_stream: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpBody {
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
    #[prost(bool, tag = "2")]
    pub end_of_stream: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpTrailers {
    #[prost(message, optional, tag = "1")]
    pub trailers: Option<HeaderMap>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingRequest {
    #[prost(oneof = "processing_request::Request", tags = "2, 3, 4, 5, 6, 7")]
    pub request: Option<processing_request::Request>,
    /// The namespaces the filter forwards (`metadata_options.forwarding_namespaces`).
    #[prost(message, optional, tag = "8")]
    pub metadata_context: Option<Metadata>,
    /// The attributes the filter was asked for (`request_attributes`, `response_attributes`), under
    /// the filter's name.
    #[prost(btree_map = "string, message", tag = "9")]
    pub attributes: std::collections::BTreeMap<String, Struct>,
}

/// `envoy.config.core.v3.Metadata`: untyped metadata by namespace.
#[derive(Clone, PartialEq, prost::Message)]
pub struct Metadata {
    #[prost(btree_map = "string, message", tag = "1")]
    pub filter_metadata: std::collections::BTreeMap<String, Struct>,
}

pub mod processing_request {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Request {
        #[prost(message, tag = "2")]
        RequestHeaders(super::HttpHeaders),
        #[prost(message, tag = "3")]
        ResponseHeaders(super::HttpHeaders),
        #[prost(message, tag = "4")]
        RequestBody(super::HttpBody),
        #[prost(message, tag = "5")]
        ResponseBody(super::HttpBody),
        #[prost(message, tag = "6")]
        RequestTrailers(super::HttpTrailers),
        #[prost(message, tag = "7")]
        ResponseTrailers(super::HttpTrailers),
    }
}

/// `HeaderValueOption.HeaderAppendAction.OVERWRITE_IF_EXISTS_OR_ADD`.
pub const OVERWRITE_IF_EXISTS_OR_ADD: i32 = 2;

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderValueOption {
    #[prost(message, optional, tag = "1")]
    pub header: Option<HeaderValue>,
    #[prost(int32, tag = "3")]
    pub append_action: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeaderMutation {
    #[prost(message, repeated, tag = "1")]
    pub set_headers: Vec<HeaderValueOption>,
    #[prost(string, repeated, tag = "2")]
    pub remove_headers: Vec<String>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct StreamedBodyResponse {
    #[prost(bytes = "vec", tag = "1")]
    pub body: Vec<u8>,
    #[prost(bool, tag = "2")]
    pub end_of_stream: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BodyMutation {
    #[prost(oneof = "body_mutation::Mutation", tags = "1, 3")]
    pub mutation: Option<body_mutation::Mutation>,
}

pub mod body_mutation {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Mutation {
        #[prost(bytes, tag = "1")]
        Body(Vec<u8>),
        #[prost(message, tag = "3")]
        StreamedResponse(super::StreamedBodyResponse),
    }
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct CommonResponse {
    /// CONTINUE (0) or CONTINUE_AND_REPLACE (1).
    #[prost(int32, tag = "1")]
    pub status: i32,
    #[prost(message, optional, tag = "2")]
    pub header_mutation: Option<HeaderMutation>,
    #[prost(message, optional, tag = "3")]
    pub body_mutation: Option<BodyMutation>,
    #[prost(bool, tag = "5")]
    pub clear_route_cache: bool,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HeadersResponse {
    #[prost(message, optional, tag = "1")]
    pub response: Option<CommonResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct BodyResponse {
    #[prost(message, optional, tag = "1")]
    pub response: Option<CommonResponse>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct TrailersResponse {
    #[prost(message, optional, tag = "1")]
    pub header_mutation: Option<HeaderMutation>,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct HttpStatus {
    /// `envoy.type.v3.StatusCode`: the enum values are the HTTP status codes.
    #[prost(int32, tag = "1")]
    pub code: i32,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ImmediateResponse {
    #[prost(message, optional, tag = "1")]
    pub status: Option<HttpStatus>,
    #[prost(message, optional, tag = "2")]
    pub headers: Option<HeaderMutation>,
    #[prost(bytes = "vec", tag = "3")]
    pub body: Vec<u8>,
    #[prost(string, tag = "5")]
    pub details: String,
}

#[derive(Clone, PartialEq, prost::Message)]
pub struct ProcessingResponse {
    #[prost(oneof = "processing_response::Response", tags = "1, 2, 3, 4, 5, 6, 7")]
    pub response: Option<processing_response::Response>,
    #[prost(message, optional, tag = "8")]
    pub dynamic_metadata: Option<Struct>,
}

pub mod processing_response {
    #[derive(Clone, PartialEq, prost::Oneof)]
    pub enum Response {
        #[prost(message, tag = "1")]
        RequestHeaders(super::HeadersResponse),
        #[prost(message, tag = "2")]
        ResponseHeaders(super::HeadersResponse),
        #[prost(message, tag = "3")]
        RequestBody(super::BodyResponse),
        #[prost(message, tag = "4")]
        ResponseBody(super::BodyResponse),
        #[prost(message, tag = "5")]
        RequestTrailers(super::TrailersResponse),
        #[prost(message, tag = "6")]
        ResponseTrailers(super::TrailersResponse),
        #[prost(message, tag = "7")]
        ImmediateResponse(super::ImmediateResponse),
    }
}

impl HeaderMap {
    /// The value of `name` (lower-case), from `raw_value` (what Envoy sends) or `value`.
    pub fn get(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|h| h.key == name).map(|h| {
            if h.raw_value.is_empty() {
                h.value.as_str()
            } else {
                std::str::from_utf8(&h.raw_value).unwrap_or("")
            }
        })
    }
}

impl HeaderMutation {
    pub fn set(&mut self, key: &str, value: &str) -> &mut Self {
        self.set_headers.push(HeaderValueOption {
            header: Some(HeaderValue {
                key: key.to_string(),
                value: String::new(),
                raw_value: value.as_bytes().to_vec(),
            }),
            append_action: OVERWRITE_IF_EXISTS_OR_ADD,
        });
        self
    }
    pub fn remove(&mut self, key: &str) -> &mut Self {
        self.remove_headers.push(key.to_string());
        self
    }
}
