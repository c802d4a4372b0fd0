//! The output items of an MCP tool loop, in OpenAI's shapes: `mcp_list_tools` (`mcpl_…`: a server's
//! tools, or the error that kept them from being listed), `mcp_call` (`mcp_…`: one call with its output or
//! error) and `mcp_approval_request` (`mcpr_…`: a call waiting for the client's approval).

use serde_json::{json, Value};

use super::items::new_id;

/// A server's tool listing; `error` set when it failed (no tools then).
pub fn list_tools(id: &str, server_label: &str, tools: Vec<Value>, error: Option<String>) -> Value {
    json!({"id": id, "type": "mcp_list_tools", "server_label": server_label, "tools": tools, "error": error})
}

/// A call about to be made (status `in_progress`, no output yet); `approval_request_id` when the client
/// approved it.
pub fn call(server_label: &str, name: &str, arguments: &str, approval_request_id: Option<&str>) -> Value {
    let mut item = json!({
        "id": new_id("mcp"),
        "type": "mcp_call",
        "status": "in_progress",
        "server_label": server_label,
        "name": name,
        "arguments": arguments,
        "output": null,
        "error": null,
    });
    if let Some(request) = approval_request_id {
        item["approval_request_id"] = request.into();
    }
    item
}

/// `call` once made: its output, or the error (the server's or the tool's own).
pub fn call_ended(mut item: Value, result: Result<String, String>) -> Value {
    match result {
        Ok(output) => {
            item["output"] = output.into();
            item["status"] = "completed".into();
        }
        Err(error) => {
            item["error"] = error.into();
            item["status"] = "failed".into();
        }
    }
    item
}

/// A call the client must approve first.
pub fn approval_request(server_label: &str, name: &str, arguments: &str) -> Value {
    json!({
        "id": new_id("mcpr"),
        "type": "mcp_approval_request",
        "server_label": server_label,
        "name": name,
        "arguments": arguments,
    })
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{call, call_ended};

    #[test]
    fn a_call_ends_with_its_output_or_its_error() {
        let made = call("calc", "add", "{\"a\":1}", Some("mcpr_1"));
        assert!(made["id"].as_str().unwrap().starts_with("mcp_"));
        assert_eq!(made["approval_request_id"], "mcpr_1");
        let ok = call_ended(made.clone(), Ok("2".into()));
        assert_eq!(
            (&ok["output"], &ok["error"], &ok["status"]),
            (&json!("2"), &json!(null), &json!("completed"))
        );
        let failed = call_ended(made, Err("down".into()));
        assert_eq!((&failed["output"], &failed["error"]), (&json!(null), &json!("down")));
        assert_eq!(failed["status"], "failed");
    }
}
