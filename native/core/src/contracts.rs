//! Every header, metadata namespace and key that crosses between Envoy, extproc and its engines, declared
//! once. Rust reads and writes them from here; Python (the Envoy bootstrap, tests) gets the same values
//! through the `extproc._native` binding. A value here is a wire contract with Envoy's configuration and
//! the Gateway API Inference Extension's endpoint-picker protocol: changing one changes that contract.

/// Request header naming the engine(s) to send the request to: the primary `ip:port`, then fallbacks,
/// comma-separated (the endpoint-picker protocol). Written by extproc on the request-headers reply; read
/// by the bootstrap's route (requests without it get a 503), its ORIGINAL_DST cluster and its
/// override_host policy. Clients may not send it: the bootstrap strips it first.
pub const DESTINATION_HEADER: &str = "x-gateway-destination-endpoint";

/// Dynamic-metadata namespace of the endpoint-picker protocol. extproc writes the destination there too
/// (under `DESTINATION_HEADER`); the bootstrap's ext_proc filter accepts this namespace and its
/// override_host policy reads the destination from it before the header.
pub const LB_METADATA_NAMESPACE: &str = "envoy.lb";

/// Key under `LB_METADATA_NAMESPACE` where the data plane records the engine that served (the
/// endpoint-picker protocol's name): Envoy's override_host policy writes it per the bootstrap, whose
/// ext_proc filter forwards the namespace back to extproc with the response headers. extproc follows
/// it (abort and accounting on that engine), else `UPSTREAM_ADDRESS_ATTRIBUTE`.
pub const SERVED_ENDPOINT_KEY: &str = "x-gateway-destination-endpoint-served";

/// Metadata namespace in which a filter before extproc may restrict the engines it picks from; the
/// bootstrap's ext_proc filter forwards it to extproc, which reads it with the request headers.
pub const SUBSET_HINT_NAMESPACE: &str = "envoy.lb.subset_hint";

/// Key under `SUBSET_HINT_NAMESPACE`: the allowed `ip:port`s, a list of strings (a comma-separated
/// string is accepted too). Present but empty: nothing may be picked (503).
pub const SUBSET_HINT_KEY: &str = "x-gateway-destination-endpoint-subset";

/// The response attribute Envoy fills with the upstream that answered (after any fallback): the
/// bootstrap asks for it (`response_attributes`), extproc reads it to abort and account on that engine.
pub const UPSTREAM_ADDRESS_ATTRIBUTE: &str = "upstream.address";

/// Envoy's per-request retry limit, over the route's retry policy: extproc sets it to the number of
/// fallbacks it listed (the bootstrap's `allow_envoy` mutation rule lets it), so Envoy's retries stop at
/// the end of the list.
pub const MAX_RETRIES_HEADER: &str = "x-envoy-max-retries";

/// Request headers the bootstrap removes before routing (early header mutation): a client must never
/// choose the engine, or how often Envoy retries, itself.
pub const CLIENT_HEADERS_REMOVED: &[&str] = &[
    DESTINATION_HEADER,
    MAX_RETRIES_HEADER,
    "x-envoy-retry-on",
    "x-envoy-retry-grpc-on",
];

/// Client request header naming the request's InferenceObjective (Gateway API Inference Extension);
/// extproc reads it, and the model's `objectives` setting maps it to a priority that decides shedding.
pub const OBJECTIVE_HEADER: &str = "x-gateway-inference-objective";

/// Client request header with the consistent-hashing key (else the request's `user` field); extproc
/// reads it for the `consistent_hash` policy.
pub const SESSION_HEADER: &str = "x-session-id";

/// The request id Envoy generates (the bootstrap's `generate_request_id`); extproc reads it for its
/// summaries and logs and echoes it on the replies it writes itself. It is never the engine's request
/// id: clients may reuse it, and engines abort by id (extproc gives every engine request its own).
pub const REQUEST_ID_HEADER: &str = "x-request-id";

/// Client request header carrying an API key (`Bearer <key>`), checked by extproc when keys are
/// configured; never forwarded to an engine.
pub const AUTHORIZATION_HEADER: &str = "authorization";

/// The only non-pseudo request headers that reach an engine as gRPC metadata: the ones extproc sets on
/// the engine call (content type, `te`, the destination and retry limit Envoy routes by), the one Envoy
/// needs to match any route (it matches none without `x-forwarded-proto`, which it sets itself) and the
/// ids a trace is followed by. extproc's request-headers reply removes every other client header
/// (credentials, cookies, `grpc-timeout`, oversized custom headers); pseudo-headers and `host` stay
/// (Envoy routes by them and never lets a filter remove them).
pub const ENGINE_REQUEST_HEADERS: &[&str] = &[
    "content-type",
    "te",
    DESTINATION_HEADER,
    MAX_RETRIES_HEADER,
    "x-forwarded-proto",
    REQUEST_ID_HEADER,
    "traceparent",
    "tracestate",
];

/// Dynamic-metadata namespace in which extproc leaves a routed request's response plan (JSON, under
/// `RESPONSE_PLAN_KEY`) for the Envoy module that answers the client (`native/envoy-module`,
/// `stream/response_plan.rs`): the bootstrap's ext_proc filter accepts this namespace when the module runs.
pub const RESPONSE_PLAN_NAMESPACE: &str = "extproc.response";

/// Key under `RESPONSE_PLAN_NAMESPACE` holding the plan.
pub const RESPONSE_PLAN_KEY: &str = "plan";

/// Response trailer in which the Envoy module tells extproc what the answer came to (status, tokens,
/// finish reason, error: `ResponseOutcome` as JSON). On the way back the module runs before ext_proc,
/// which reads it into the request's summary and removes it before the client could see it.
pub const OUTCOME_TRAILER: &str = "x-extproc-outcome";

/// gRPC metadata Envoy's ext_proc filter sends on every stream to extproc (the bootstrap's
/// `initial_metadata`) when the Envoy module answers the client: value `RESPONSE_PATH_MODULE`. extproc
/// follows it per stream, so `extproc serve` works behind either kind of Envoy config.
pub const RESPONSE_PATH_METADATA: &str = "x-extproc-response-path";

/// The value of `RESPONSE_PATH_METADATA` saying the module answers.
pub const RESPONSE_PATH_MODULE: &str = "module";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_names_are_lowercase_as_http2_requires() {
        // Envoy's header maps hold HTTP/2 (lowercase) names: a capital letter would never match.
        let headers = [
            DESTINATION_HEADER,
            MAX_RETRIES_HEADER,
            OBJECTIVE_HEADER,
            SESSION_HEADER,
            REQUEST_ID_HEADER,
            AUTHORIZATION_HEADER,
            OUTCOME_TRAILER,
            RESPONSE_PATH_METADATA,
        ];
        for name in headers
            .iter()
            .chain(CLIENT_HEADERS_REMOVED)
            .chain(ENGINE_REQUEST_HEADERS)
        {
            assert_eq!(*name, name.to_ascii_lowercase());
        }
    }
}
