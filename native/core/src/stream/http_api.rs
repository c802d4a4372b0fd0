//! The HTTP route table: which of the gateway's APIs a request path names, and the method it takes.

/// The HTTP APIs the gateway answers (engines' gRPC methods are elsewhere: `engine::Protocol`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HttpApi {
    Models,
    ChatCompletions,
    Completions,
    Tokenize,
    Detokenize,
    /// `GET /health`: whether every model has a ready engine (`health_answer`).
    Health,
    /// `/v1/responses…` and `/v1/conversations…`: several methods, served by the server itself
    /// (`responses::api` routes them).
    Responses,
}

impl HttpApi {
    /// The API at `path` (its query already cut off); a trailing slash names the same API. The
    /// tokenizer APIs answer at vLLM's paths too (`/tokenize`, `/detokenize`).
    pub fn from_path(path: &str) -> Option<HttpApi> {
        match path.trim_end_matches('/') {
            "/v1/models" => Some(HttpApi::Models),
            "/v1/chat/completions" => Some(HttpApi::ChatCompletions),
            "/v1/completions" => Some(HttpApi::Completions),
            "/v1/tokenize" | "/tokenize" => Some(HttpApi::Tokenize),
            "/v1/detokenize" | "/detokenize" => Some(HttpApi::Detokenize),
            "/health" => Some(HttpApi::Health),
            p if is_under(p, "/v1/responses") || is_under(p, "/v1/conversations") => Some(HttpApi::Responses),
            _ => None,
        }
    }

    /// The one method the API takes (the Responses API's routes take several: `responses::api`): `GET` for the model list, `POST` with a JSON body for the rest.
    pub fn method(self) -> &'static str {
        match self {
            HttpApi::Models | HttpApi::Health => "GET",
            _ => "POST",
        }
    }
}

/// `path` is `root` or a path below it.
fn is_under(path: &str, root: &str) -> bool {
    path.strip_prefix(root)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::HttpApi;

    #[test]
    fn paths_name_their_api_with_or_without_a_trailing_slash() {
        assert_eq!(HttpApi::from_path("/v1/models"), Some(HttpApi::Models));
        assert_eq!(HttpApi::from_path("/v1/models/"), Some(HttpApi::Models));
        assert_eq!(
            HttpApi::from_path("/v1/chat/completions"),
            Some(HttpApi::ChatCompletions)
        );
        assert_eq!(HttpApi::from_path("/v1/completions"), Some(HttpApi::Completions));
        assert_eq!(HttpApi::from_path("/tokenize"), Some(HttpApi::Tokenize));
        assert_eq!(HttpApi::from_path("/v1/detokenize"), Some(HttpApi::Detokenize));
        for unknown in ["/", "", "/v1", "/v1/embeddings", "/v1/models/m"] {
            assert_eq!(HttpApi::from_path(unknown), None, "{unknown}");
        }
        assert_eq!(HttpApi::Models.method(), "GET");
        assert_eq!(HttpApi::from_path("/health"), Some(HttpApi::Health));
        assert_eq!(HttpApi::Health.method(), "GET");
        assert_eq!(HttpApi::Completions.method(), "POST");
        for responses in [
            "/v1/responses",
            "/v1/responses/resp_1/input_items",
            "/v1/conversations/c/items",
        ] {
            assert_eq!(HttpApi::from_path(responses), Some(HttpApi::Responses), "{responses}");
        }
        assert_eq!(HttpApi::from_path("/v1/responsesx"), None);
    }
}
