//! The response plan: what the response side needs to turn one engine call's output into the client's
//! answer, as JSON that crosses from the request side (ext_proc) to another host of the response side
//! (the Envoy dynamic module, `native/envoy-module`) in Envoy's dynamic metadata. Both hosts build the
//! same `ResponseShape` from it and run the same `ResponseTranslator`, so they answer the same bytes.

use std::collections::HashSet;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use super::output_plan::ParsingSpec;
use super::response::ResponseShape;
use crate::engine::Protocol;
use crate::openai::request::Api;
use crate::openai::response::ResponseMeta;

/// The dynamic metadata namespace and key the plan travels under (ext_proc writes, the module reads), and
/// the trailer the outcome comes back in: cross-process names, declared in `contracts.rs`.
pub use crate::contracts::{OUTCOME_TRAILER, RESPONSE_PLAN_KEY as PLAN_KEY, RESPONSE_PLAN_NAMESPACE as PLAN_NAMESPACE};

/// What one answer came to: the request summary's response fields.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ResponseOutcome {
    pub status: u16,
    pub prompt_tokens: u32,
    pub completion_tokens: u32,
    pub cached_tokens: u32,
    pub finish_reason: String,
    pub error: String,
    /// The module ended the answer because the engine missed its inter-token deadline: extproc
    /// penalises the endpoint and aborts the engine call, as when it times a call out itself.
    #[serde(default)]
    pub timed_out: bool,
    /// The module ended the answer before the engine finished (the inter-token deadline, the gateway's
    /// shutdown): extproc aborts the engine call, as when it cuts a stream itself.
    #[serde(default)]
    pub cut: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ResponsePlan {
    /// The served model's name (the module finds its tokenizer under it).
    pub model: String,
    /// "chat" or "completion".
    pub api: String,
    pub id: String,
    pub created: u64,
    /// The engine's protocol: "vllm" or "sglang".
    pub protocol: String,
    pub stream: bool,
    pub include_usage: bool,
    pub skip_special_tokens: bool,
    pub stop: Vec<String>,
    pub include_stop_str_in_output: bool,
    pub stop_token_ids: Vec<u32>,
    pub echo: Option<String>,
    pub n: u32,
    pub logprobs: Option<u32>,
    /// The largest engine message the translator accepts, in bytes.
    pub max_message: usize,
    /// The client's `x-request-id` (the module's summary names the request by it).
    pub request_id: String,
    /// Chat answers whose text goes through tool-call and reasoning parsers.
    pub parsing: Option<ParsingSpec>,
    /// A stream's inter-token deadline in milliseconds (0: none): once the engine has sent something,
    /// the module ends the answer when the next message does not come within it (`deadline.rs`).
    #[serde(default)]
    pub inter_token_ms: u64,
}

impl ResponsePlan {
    /// The plan of `shape`.
    pub fn of(shape: &ResponseShape, max_message: usize, request_id: &str) -> ResponsePlan {
        ResponsePlan {
            model: shape.meta.model.clone(),
            api: match shape.meta.api {
                Api::Chat => "chat",
                Api::Completion => "completion",
            }
            .to_string(),
            id: shape.meta.id.clone(),
            created: shape.meta.created,
            protocol: shape.protocol.as_str().to_string(),
            stream: shape.stream,
            include_usage: shape.include_usage,
            skip_special_tokens: shape.skip_special_tokens,
            stop: shape.stop.clone(),
            include_stop_str_in_output: shape.include_stop_str_in_output,
            stop_token_ids: shape.stop_token_ids.clone(),
            echo: shape.echo.clone(),
            n: shape.n,
            logprobs: shape.logprobs,
            max_message,
            request_id: request_id.to_string(),
            parsing: shape.parsing.as_ref().map(|p| p.spec()),
            inter_token_ms: 0,
        }
    }

    /// The plan with a stream's inter-token deadline (`Duration::ZERO`: none; non-streamed calls have
    /// none, extproc times their whole call).
    pub fn with_inter_token(mut self, deadline: std::time::Duration) -> ResponsePlan {
        if self.stream {
            self.inter_token_ms = deadline.as_millis().min(u64::MAX as u128) as u64;
        }
        self
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a plan always serializes")
    }

    pub fn from_json(json: &[u8]) -> Result<ResponsePlan, String> {
        serde_json::from_slice(json).map_err(|e| format!("bad response plan: {e}"))
    }

    /// The shape the translator follows; `dropped` gives the model's `non_marker_special_ids` (only
    /// asked for when the answer is parsed).
    pub fn shape(&self, dropped: impl FnOnce() -> Arc<HashSet<u32>>) -> Result<ResponseShape, String> {
        let parsing = self.parsing.as_ref().map(|spec| spec.plan(dropped())).transpose()?;
        let api = match self.api.as_str() {
            "chat" => Api::Chat,
            "completion" => Api::Completion,
            other => return Err(format!("unknown API '{other}' in the response plan")),
        };
        let protocol = match self.protocol.as_str() {
            "vllm" => Protocol::Vllm,
            "sglang" => Protocol::Sglang,
            other => return Err(format!("unknown protocol '{other}' in the response plan")),
        };
        Ok(ResponseShape {
            meta: ResponseMeta {
                api,
                id: self.id.clone(),
                created: self.created,
                model: self.model.clone(),
            },
            protocol,
            stream: self.stream,
            include_usage: self.include_usage,
            skip_special_tokens: self.skip_special_tokens,
            stop: self.stop.clone(),
            include_stop_str_in_output: self.include_stop_str_in_output,
            stop_token_ids: self.stop_token_ids.clone(),
            echo: self.echo.clone(),
            n: self.n,
            logprobs: self.logprobs,
            parsing,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> ResponseShape {
        ResponseShape {
            meta: ResponseMeta {
                api: Api::Chat,
                id: "chatcmpl-7".into(),
                created: 42,
                model: "m".into(),
            },
            protocol: Protocol::Sglang,
            stream: true,
            include_usage: true,
            skip_special_tokens: false,
            stop: vec!["\n\n".into()],
            include_stop_str_in_output: true,
            stop_token_ids: vec![2, 7],
            echo: None,
            n: 3,
            logprobs: Some(2),
            parsing: None,
        }
    }

    #[test]
    fn a_plan_rebuilds_the_shape_it_was_made_from_through_json() {
        let plan = ResponsePlan::of(&shape(), 1024, "req-1");
        let back = ResponsePlan::from_json(plan.to_json().as_bytes()).unwrap();
        assert_eq!(back, plan);
        let rebuilt = back.shape(|| unreachable!("no parsing")).unwrap();
        let original = shape();
        assert_eq!(rebuilt.meta.id, original.meta.id);
        assert_eq!(rebuilt.meta.api, original.meta.api);
        assert_eq!(rebuilt.protocol, original.protocol);
        assert_eq!(rebuilt.stop, original.stop);
        assert_eq!(rebuilt.stop_token_ids, original.stop_token_ids);
        assert_eq!((rebuilt.n, rebuilt.logprobs, rebuilt.include_usage), (3, Some(2), true));
        assert!(!rebuilt.skip_special_tokens && rebuilt.include_stop_str_in_output);
    }

    #[test]
    fn unknown_names_in_a_plan_are_refused() {
        let mut plan = ResponsePlan::of(&shape(), 1024, "r");
        plan.protocol = "trt".into();
        let refused = plan
            .shape(Default::default)
            .err()
            .expect("an unknown protocol is refused");
        assert!(refused.contains("unknown protocol 'trt'"));
        assert!(ResponsePlan::from_json(b"{}").is_err());
    }
}
