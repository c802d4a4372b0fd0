//! The client against a real MCP server: tests/mcp_server.py on the PyPI `mcp` SDK, run by the project's
//! venv (`make test` builds `.venv` with the `test` extras before `cargo test`; `EXTPROC_TEST_PYTHON` names
//! another interpreter). A missing interpreter or SDK fails the test rather than skipping it.

use std::net::TcpStream;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use super::{McpClient, McpError};

const TIMEOUT: Duration = Duration::from_secs(10);

/// The test server, killed on drop.
struct McpServer {
    child: Child,
    url: String,
}

impl McpServer {
    fn start(args: &[&str]) -> Self {
        let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
        let python = std::env::var_os("EXTPROC_TEST_PYTHON")
            .map(PathBuf::from)
            .unwrap_or_else(|| repo.join(".venv/bin/python"));
        assert!(
            python.exists(),
            "no Python at {} for the MCP test server: run `make .venv` or set EXTPROC_TEST_PYTHON",
            python.display()
        );
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(&python)
            .arg(repo.join("tests/mcp_server.py"))
            .args(["--port", &port.to_string()])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", python.display()));
        let mut server = Self {
            child,
            url: format!("http://127.0.0.1:{port}/mcp"),
        };
        // Importing the SDK takes a few seconds on a busy machine.
        let deadline = Instant::now() + Duration::from_secs(60);
        while TcpStream::connect(("127.0.0.1", port)).is_err() {
            if let Some(status) = server.child.try_wait().unwrap() {
                let mut stderr = String::new();
                std::io::Read::read_to_string(server.child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
                panic!("the MCP test server exited ({status}); is `mcp` installed in the venv?\n{stderr}");
            }
            assert!(
                Instant::now() < deadline,
                "the MCP test server did not listen within 60 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        server
    }
}

impl Drop for McpServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
}

/// Everything one session does, against a server answering SSE streams or plain JSON.
async fn a_session_lists_and_calls_tools(url: &str) {
    let headers = [("X-Tenant".to_owned(), "acme".to_owned())];
    let client = McpClient::connect(url, &headers, TIMEOUT).await.unwrap();
    assert_eq!(client.server_info()["name"], "extproc-test-tools");

    let tools = client.list_tools().await.unwrap();
    let names: Vec<&str> = tools.iter().map(|tool| tool.name.as_str()).collect();
    assert_eq!(names, ["add", "fail", "sleep", "echo_header"]);
    assert_eq!(tools[0].description.as_deref(), Some("Adds two integers."));
    assert_eq!(tools[0].input_schema["required"], json!(["a", "b"]));

    let sum = client.call_tool("add", &json!({"a": 2, "b": 40})).await.unwrap();
    assert_eq!((sum.output.as_str(), sum.is_error), ("42", false));

    // The tool definition's headers reach the server (and the session id, or the server answers 400).
    let header = client
        .call_tool("echo_header", &json!({"name": "x-tenant"}))
        .await
        .unwrap();
    assert_eq!(header.output, "acme");

    let failed = client.call_tool("fail", &json!({"reason": "boom"})).await.unwrap();
    assert!(failed.is_error, "{failed:?}");
    assert!(failed.output.contains("fail"), "{failed:?}");

    // Calls of one session can run at once.
    let (one, two) = (json!({"a": 1, "b": 1}), json!({"a": 2, "b": 2}));
    let (a, b) = tokio::join!(client.call_tool("add", &one), client.call_tool("add", &two));
    assert_eq!((a.unwrap().output, b.unwrap().output), ("2".to_owned(), "4".to_owned()));
}

async fn quick_error(url: &str) -> McpError {
    let client = McpClient::connect(url, &[], TIMEOUT).await.unwrap();
    client.request("no/such_method", json!({})).await.unwrap_err()
}

#[test]
fn a_real_mcp_server_is_listed_and_called() {
    let streaming = McpServer::start(&[]);
    let json_answers = McpServer::start(&["--json-response"]);
    let paged = McpServer::start(&["--page-size", "1"]);
    runtime().block_on(async {
        a_session_lists_and_calls_tools(&streaming.url).await;
        a_session_lists_and_calls_tools(&json_answers.url).await;
        // Four tools, one per page: the cursor loop reads them all, in order.
        a_session_lists_and_calls_tools(&paged.url).await;

        // A slow tool: the call ends at the timeout, typed.
        let quick = McpClient::connect(&streaming.url, &[], TIMEOUT).await.unwrap();
        let quick = McpClient {
            timeout: Duration::from_millis(500),
            ..quick
        };
        let started = Instant::now();
        let error = quick.call_tool("sleep", &json!({"seconds": 30})).await.unwrap_err();
        assert_eq!(error, McpError::Timeout(Duration::from_millis(500)));
        assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());

        // A method the server does not have: a JSON-RPC error, typed.
        match quick_error(&streaming.url).await {
            McpError::JsonRpc { code, .. } => assert_eq!(code, -32601),
            other => panic!("expected a JSON-RPC error, got {other:?}"),
        }

        // A session id the server does not know: its HTTP status and JSON-RPC error text.
        let mut stale = McpClient::connect(&streaming.url, &[], TIMEOUT).await.unwrap();
        for (name, value) in stale.headers.iter_mut() {
            if name == "mcp-session-id" {
                *value = http::HeaderValue::from_static("not-a-session");
            }
        }
        match stale.list_tools().await {
            Err(McpError::Http { status, body }) => assert!(status == 404 || status == 400, "{status} {body}"),
            other => panic!("expected an HTTP error, got {other:?}"),
        }
    });
}

#[test]
fn a_server_that_is_down_fails_fast_and_typed() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let started = Instant::now();
    let error = runtime()
        .block_on(McpClient::connect(
            &format!("http://127.0.0.1:{port}/mcp"),
            &[],
            TIMEOUT,
        ))
        .unwrap_err();
    assert!(
        matches!(&error, McpError::Connect(message) if message.contains(&port.to_string())),
        "{error:?}"
    );
    assert!(started.elapsed() < Duration::from_secs(2));
    let error = runtime()
        .block_on(McpClient::connect("https://127.0.0.1/mcp", &[], TIMEOUT))
        .unwrap_err();
    assert!(matches!(error, McpError::InvalidUrl(_)));
}

#[test]
fn a_server_that_never_answers_times_out() {
    // Accepts the connection, reads nothing, answers nothing.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}/mcp", listener.local_addr().unwrap());
    let started = Instant::now();
    let error = runtime()
        .block_on(McpClient::connect(&url, &[], Duration::from_millis(300)))
        .unwrap_err();
    assert_eq!(error, McpError::Timeout(Duration::from_millis(300)));
    assert!(started.elapsed() < Duration::from_secs(2));
    drop(listener);
}
