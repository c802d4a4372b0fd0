//! One HTTP/1.1 POST to an MCP server: a fresh connection per request (hyper's client connection, no pool),
//! which keeps a slow or broken server from holding anything beyond the call that met it. Plain `http://`
//! only; an `https://` server is refused with a clear error.

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue, ACCEPT, CONTENT_TYPE, HOST};
use http::{Request, Response, Uri};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use super::McpError;

/// Where the server listens, from its `server_url`.
#[derive(Debug, Clone)]
pub struct Endpoint {
    host: String,
    port: u16,
    /// `host[:port]` as the Host header says it.
    authority: String,
    /// Path and query (`/mcp`).
    path: String,
}

impl Endpoint {
    pub fn parse(url: &str) -> Result<Self, McpError> {
        let invalid = |why: &str| McpError::InvalidUrl(format!("{url:?}: {why}"));
        let uri: Uri = url
            .parse()
            .map_err(|e: http::uri::InvalidUri| invalid(&e.to_string()))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => return Err(invalid("https MCP servers are not supported (plain http only)")),
            _ => return Err(invalid("not an http:// URL")),
        }
        let authority = uri.authority().ok_or_else(|| invalid("no host"))?;
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']')
            .to_owned();
        Ok(Self {
            port: authority.port_u16().unwrap_or(80),
            authority: authority.as_str().rsplit('@').next().unwrap_or_default().to_owned(),
            host,
            path: uri.path_and_query().map_or("/", |p| p.as_str()).to_owned(),
        })
    }

    pub fn address(&self) -> String {
        format!("{}:{}", self.host, self.port)
    }

    /// Sends one POST with a JSON body and returns the response with its body still to read.
    pub async fn post(
        &self,
        headers: &[(HeaderName, HeaderValue)],
        body: Vec<u8>,
    ) -> Result<Response<Incoming>, McpError> {
        let stream = TcpStream::connect((self.host.as_str(), self.port))
            .await
            .map_err(|e| McpError::Connect(format!("{}: {e}", self.address())))?;
        let _ = stream.set_nodelay(true);
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| McpError::Connect(format!("{}: {e}", self.address())))?;
        // The connection runs until the response body is read or dropped.
        tokio::spawn(async move {
            let _ = connection.await;
        });
        let mut request = Request::post(self.path.as_str())
            .header(HOST, self.authority.as_str())
            .header(CONTENT_TYPE, "application/json")
            .header(ACCEPT, "application/json, text/event-stream");
        for (name, value) in headers {
            request = request.header(name, value);
        }
        let request = request
            .body(Full::new(Bytes::from(body)))
            .map_err(|e| McpError::Protocol(format!("building the request: {e}")))?;
        sender
            .send_request(request)
            .await
            .map_err(|e| McpError::Connect(format!("{}: {e}", self.address())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_give_host_port_and_path() {
        let endpoint = Endpoint::parse("http://user@tools.local:8931/mcp?x=1").unwrap();
        assert_eq!(endpoint.address(), "tools.local:8931");
        assert_eq!(endpoint.authority, "tools.local:8931");
        assert_eq!(endpoint.path, "/mcp?x=1");
        let endpoint = Endpoint::parse("http://[::1]/").unwrap();
        assert_eq!(endpoint.address(), "::1:80");
        assert!(
            matches!(Endpoint::parse("https://tools.local/mcp"), Err(McpError::InvalidUrl(m)) if m.contains("https"))
        );
        assert!(matches!(
            Endpoint::parse("tools.local/mcp"),
            Err(McpError::InvalidUrl(_))
        ));
    }
}
