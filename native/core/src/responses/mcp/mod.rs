//! The MCP client the Responses API's tool loop calls: streamable HTTP transport, the `initialize`
//! handshake, `tools/list` and `tools/call`.
//!
//! Each JSON-RPC message is one POST to the server's URL; the answer is either one JSON body or an SSE
//! stream that carries the response (possibly after notifications, which are skipped). The session id the
//! server hands out at `initialize` (`Mcp-Session-Id`) and the negotiated protocol version go along with every
//! later request, as do the tool definition's custom `headers`. Every request is bounded by the client's
//! timeout. Failures are typed (`McpError`), so the caller can turn each into an error output item rather
//! than failing the whole response.

mod http;
mod sse;
#[cfg(test)]
mod tests;

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use ::http::header::{HeaderName, HeaderValue, CONTENT_TYPE};
use http_body_util::BodyExt;
use serde_json::{json, Value};

use self::http::Endpoint;
use self::sse::SseParser;

/// The protocol revision offered at `initialize` (the server may answer an older one it speaks).
pub const PROTOCOL_VERSION: &str = "2025-06-18";
/// How much of an error response's body an `McpError::Http` keeps.
const ERROR_BODY_LIMIT: usize = 2048;
/// The most `tools/list` pages read (a server whose cursor never ends is broken, not large).
const MAX_TOOL_PAGES: usize = 100;

#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum McpError {
    #[error("invalid MCP server URL {0}")]
    InvalidUrl(String),
    /// Could not connect (refused, unresolvable, reset before an answer).
    #[error("cannot reach the MCP server: {0}")]
    Connect(String),
    /// No complete answer within the timeout.
    #[error("the MCP server did not answer within {0:?}")]
    Timeout(Duration),
    /// The server answered with an HTTP error status.
    #[error("the MCP server answered HTTP {status}: {body}")]
    Http { status: u16, body: String },
    /// The server answered the request with a JSON-RPC error.
    #[error("the MCP server answered error {code}: {message}")]
    JsonRpc { code: i64, message: String },
    /// The answer was not what the protocol says (bad JSON, no response for the request, bad header).
    #[error("MCP protocol error: {0}")]
    Protocol(String),
}

/// One tool the server offers, as `tools/list` describes it.
#[derive(Debug, Clone, PartialEq)]
pub struct McpTool {
    pub name: String,
    pub description: Option<String>,
    /// JSON Schema of the arguments (`inputSchema`).
    pub input_schema: Value,
    pub annotations: Option<Value>,
}

/// What a `tools/call` answered.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolResult {
    /// The text parts of `content` joined by newlines (any other part as its JSON).
    pub output: String,
    /// The tool itself failed (`isError`): `output` says why.
    pub is_error: bool,
}

/// A session with one MCP server, opened by `connect`. Methods take `&self`: one session may serve several
/// calls at once.
#[derive(Debug)]
pub struct McpClient {
    endpoint: Endpoint,
    timeout: Duration,
    /// Custom headers, then `Mcp-Session-Id` and `MCP-Protocol-Version` once known.
    headers: Vec<(HeaderName, HeaderValue)>,
    server_info: Value,
    next_id: AtomicU64,
}

impl McpClient {
    /// Opens a session: `initialize`, then `notifications/initialized`. `headers` (the tool definition's
    /// `headers`, e.g. an Authorization) go with every request; `timeout` bounds each request.
    pub async fn connect(url: &str, headers: &[(String, String)], timeout: Duration) -> Result<Self, McpError> {
        let endpoint = Endpoint::parse(url)?;
        let headers = headers
            .iter()
            .map(|(name, value)| {
                let bad = |what: &str| McpError::Protocol(format!("custom header {name:?}: invalid {what}"));
                Ok((
                    HeaderName::from_bytes(name.as_bytes()).map_err(|_| bad("name"))?,
                    HeaderValue::from_str(value).map_err(|_| bad("value"))?,
                ))
            })
            .collect::<Result<Vec<_>, McpError>>()?;
        let mut client = Self {
            endpoint,
            timeout,
            headers,
            server_info: Value::Null,
            next_id: AtomicU64::new(1),
        };
        let params = json!({
            "protocolVersion": PROTOCOL_VERSION,
            "capabilities": {},
            "clientInfo": {"name": "extproc", "version": env!("CARGO_PKG_VERSION")},
        });
        let (result, session_id) = client.request_with_session("initialize", params).await?;
        if let Some(session_id) = session_id {
            client
                .headers
                .push((HeaderName::from_static("mcp-session-id"), session_id));
        }
        let version = result
            .get("protocolVersion")
            .and_then(Value::as_str)
            .ok_or_else(|| McpError::Protocol("initialize answered no protocolVersion".into()))?;
        let version =
            HeaderValue::from_str(version).map_err(|_| McpError::Protocol(format!("protocolVersion {version:?}")))?;
        client
            .headers
            .push((HeaderName::from_static("mcp-protocol-version"), version));
        client.server_info = result.get("serverInfo").cloned().unwrap_or(Value::Null);
        client.notify("notifications/initialized").await?;
        Ok(client)
    }

    /// `serverInfo` from `initialize` (name, version).
    pub fn server_info(&self) -> &Value {
        &self.server_info
    }

    /// Every tool the server offers, all pages.
    pub async fn list_tools(&self) -> Result<Vec<McpTool>, McpError> {
        let mut tools = Vec::new();
        let mut cursor: Option<String> = None;
        for _ in 0..MAX_TOOL_PAGES {
            let params = match &cursor {
                Some(cursor) => json!({"cursor": cursor}),
                None => json!({}),
            };
            let result = self.request("tools/list", params).await?;
            let page = result
                .get("tools")
                .and_then(Value::as_array)
                .ok_or_else(|| McpError::Protocol("tools/list answered no tools list".into()))?;
            for tool in page {
                tools.push(parse_tool(tool)?);
            }
            match result.get("nextCursor").and_then(Value::as_str) {
                Some(next) if !next.is_empty() => cursor = Some(next.to_owned()),
                _ => return Ok(tools),
            }
        }
        Err(McpError::Protocol(format!(
            "tools/list gave more than {MAX_TOOL_PAGES} pages"
        )))
    }

    /// Calls one tool. A tool that failed is `Ok` with `is_error`; the server refusing the call (unknown
    /// tool, bad arguments, as some servers answer those) is `Err(JsonRpc)`.
    pub async fn call_tool(&self, name: &str, arguments: &Value) -> Result<ToolResult, McpError> {
        let result = self
            .request("tools/call", json!({"name": name, "arguments": arguments}))
            .await?;
        let content = result.get("content").and_then(Value::as_array);
        let output = content
            .into_iter()
            .flatten()
            .map(
                |part| match (part.get("type").and_then(Value::as_str), part.get("text")) {
                    (Some("text"), Some(Value::String(text))) => text.clone(),
                    _ => part.to_string(),
                },
            )
            .collect::<Vec<_>>()
            .join("\n");
        Ok(ToolResult {
            output,
            is_error: result.get("isError").and_then(Value::as_bool).unwrap_or(false),
        })
    }

    async fn request(&self, method: &str, params: Value) -> Result<Value, McpError> {
        self.request_with_session(method, params)
            .await
            .map(|(result, _)| result)
    }

    /// Sends a request and returns its result, and the session id header when the answer had one.
    async fn request_with_session(
        &self,
        method: &str,
        params: Value,
    ) -> Result<(Value, Option<HeaderValue>), McpError> {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let message = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let exchange = async {
            let response = self
                .endpoint
                .post(&self.headers, message.to_string().into_bytes())
                .await?;
            let session_id = response.headers().get("mcp-session-id").cloned();
            let status = response.status();
            let is_sse = response
                .headers()
                .get(CONTENT_TYPE)
                .and_then(|v| v.to_str().ok())
                .is_some_and(|v| v.trim_start().starts_with("text/event-stream"));
            let mut body = response.into_body();
            if !status.is_success() {
                return Err(http_error(status.as_u16(), &mut body).await);
            }
            let answer = if is_sse {
                read_sse_answer(&mut body, id).await?
            } else {
                let bytes = body
                    .collect()
                    .await
                    .map_err(|e| McpError::Connect(format!("reading the answer: {e}")))?
                    .to_bytes();
                let value: Value = serde_json::from_slice(&bytes)
                    .map_err(|e| McpError::Protocol(format!("the answer is not JSON: {e}")))?;
                find_answer(value, id)
                    .ok_or_else(|| McpError::Protocol(format!("the answer holds no response to request {id}")))?
            };
            Ok((result_of(answer)?, session_id))
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| McpError::Timeout(self.timeout))?
    }

    /// Sends a notification (no answer expected beyond a 2xx, normally 202 Accepted).
    async fn notify(&self, method: &str) -> Result<(), McpError> {
        let message = json!({"jsonrpc": "2.0", "method": method});
        let exchange = async {
            let response = self
                .endpoint
                .post(&self.headers, message.to_string().into_bytes())
                .await?;
            let status = response.status();
            let mut body = response.into_body();
            if !status.is_success() {
                return Err(http_error(status.as_u16(), &mut body).await);
            }
            Ok(())
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| McpError::Timeout(self.timeout))?
    }
}

/// Checks a server URL as `connect` would read it (scheme, host), without connecting.
pub fn check_url(url: &str) -> Result<(), McpError> {
    Endpoint::parse(url).map(|_| ())
}

fn parse_tool(tool: &Value) -> Result<McpTool, McpError> {
    let name = tool
        .get("name")
        .and_then(Value::as_str)
        .ok_or_else(|| McpError::Protocol(format!("a tool without a name: {tool}")))?;
    Ok(McpTool {
        name: name.to_owned(),
        description: tool.get("description").and_then(Value::as_str).map(str::to_owned),
        input_schema: tool
            .get("inputSchema")
            .cloned()
            .unwrap_or_else(|| json!({"type": "object", "properties": {}})),
        annotations: tool.get("annotations").filter(|a| !a.is_null()).cloned(),
    })
}

/// The response to request `id` in a JSON body: the object itself, or its element of a batch.
fn find_answer(value: Value, id: u64) -> Option<Value> {
    let matches = |message: &Value| {
        message.get("id").and_then(Value::as_u64) == Some(id)
            && (message.get("result").is_some() || message.get("error").is_some())
    };
    match value {
        Value::Array(messages) => messages.into_iter().find(matches),
        message if matches(&message) => Some(message),
        _ => None,
    }
}

/// Reads SSE events until the one carrying the response to request `id`; other messages (progress,
/// logging, server requests this client does not serve) are skipped.
async fn read_sse_answer(body: &mut hyper::body::Incoming, id: u64) -> Result<Value, McpError> {
    let mut parser = SseParser::default();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(|e| McpError::Connect(format!("reading the event stream: {e}")))?;
        let Ok(data) = frame.into_data() else { continue };
        for event in parser.push(&data) {
            let Ok(message) = serde_json::from_str::<Value>(&event) else {
                continue;
            };
            if let Some(answer) = find_answer(message, id) {
                return Ok(answer);
            }
        }
    }
    Err(McpError::Protocol(format!(
        "the event stream ended without a response to request {id}"
    )))
}

/// The `result` of a JSON-RPC response, or its `error` as `McpError::JsonRpc`.
fn result_of(mut answer: Value) -> Result<Value, McpError> {
    if let Some(error) = answer.get("error") {
        return Err(McpError::JsonRpc {
            code: error.get("code").and_then(Value::as_i64).unwrap_or(0),
            message: error.get("message").and_then(Value::as_str).unwrap_or("").to_owned(),
        });
    }
    Ok(answer.get_mut("result").map(Value::take).unwrap_or(Value::Null))
}

/// An HTTP error status with the start of its body (JSON-RPC error bodies say why).
async fn http_error(status: u16, body: &mut hyper::body::Incoming) -> McpError {
    let mut text = Vec::new();
    while let Some(Ok(frame)) = body.frame().await {
        if let Ok(data) = frame.into_data() {
            text.extend_from_slice(&data);
        }
        if text.len() >= ERROR_BODY_LIMIT {
            text.truncate(ERROR_BODY_LIMIT);
            break;
        }
    }
    McpError::Http {
        status,
        body: String::from_utf8_lossy(&text).trim().to_owned(),
    }
}
